#include "tokenizer/chat.h"

#include <stdlib.h>
#include <string.h>

#include "base/log.h"

/* ---- a growable string ------------------------------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void put(sbuf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void puts_(sbuf *b, const char *s) { put(b, s, strlen(s)); }

/* A slice of a string, for the Python string methods the Qwen3 template uses. */
typedef struct slice {
    const char *p;
    size_t n;
} slice;

static slice sl(const char *s) { return (slice){s, strlen(s)}; }

/* Offset of the first / last occurrence of needle in s, or -1. */
static long find_first(slice s, const char *needle)
{
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= s.n; i++)
        if (memcmp(s.p + i, needle, k) == 0) return (long)i;
    return -1;
}

static long find_last(slice s, const char *needle)
{
    size_t k = strlen(needle);
    for (size_t i = s.n + 1; i-- > 0;)
        if (i + k <= s.n && memcmp(s.p + i, needle, k) == 0) return (long)i;
    return -1;
}

static slice lstrip_nl(slice s)
{
    while (s.n && s.p[0] == '\n') s.p++, s.n--;
    return s;
}

static slice rstrip_nl(slice s)
{
    while (s.n && s.p[s.n - 1] == '\n') s.n--;
    return s;
}

/* ---- recognition ------------------------------------------------------------------------------- */

const char *nf_chat_kind_name(nf_chat_kind k)
{
    switch (k) {
    case NF_CHAT_CHATML: return "chatml";
    case NF_CHAT_CHATML_SYSTEM: return "chatml+default-system";
    case NF_CHAT_QWEN3: return "qwen3";
    }
    return "?";
}

/* Finds a constant default system message: the literal between "<|im_start|>system" + newline
 * (written as a real newline or as Jinja's \n escape) and "<|im_end|>", with no quote or
 * concatenation inside (that would be messages[0]['content']). Returns it unescaped, or NULL. */
static char *default_system(const char *tpl)
{
    static const char head[] = "<|im_start|>system";
    for (const char *p = strstr(tpl, head); p; p = strstr(p + 1, head)) {
        const char *q = p + strlen(head);
        if (q[0] == '\n') q += 1;
        else if (q[0] == '\\' && q[1] == 'n') q += 2;
        else continue;
        const char *end = strstr(q, "<|im_end|>");
        if (!end || end == q) continue;
        size_t n = (size_t)(end - q);
        if (memchr(q, '\'', n) || memchr(q, '"', n) || memchr(q, '+', n) || memchr(q, '{', n)) continue;
        char *out = malloc(n + 1), *o = out;
        if (!out) return NULL;
        for (size_t i = 0; i < n; i++) {
            if (q[i] == '\\' && i + 1 < n) { // Jinja string escapes that can appear in a plain sentence
                char e = q[++i];
                *o++ = e == 'n' ? '\n' : e == 't' ? '\t' : e;
            } else {
                *o++ = q[i];
            }
        }
        *o = 0;
        return out;
    }
    return NULL;
}

nf_status nf_chat_detect(const char *tpl, nf_chat_template *out, nf_error *err)
{
    memset(out, 0, sizeof *out);
    out->kind = NF_CHAT_CHATML;
    if (!tpl || !*tpl) {
        NF_WARN("chat template: the checkpoint has none; using ChatML");
        return NF_OK;
    }
    if (!strstr(tpl, "<|im_start|>")) {
        NF_WARN("chat template: not a ChatML family template this build knows; falling back to ChatML");
        return NF_OK;
    }
    if (strstr(tpl, "</think>") && strstr(tpl, "reasoning_content")) {
        out->kind = NF_CHAT_QWEN3;
        return NF_OK;
    }
    if (strstr(tpl, "<|im_start|>system")) {
        char *sys = default_system(tpl);
        if (sys) {
            out->kind = NF_CHAT_CHATML_SYSTEM;
            out->default_system = sys;
            return NF_OK;
        }
        // A "system" header with no constant text is the plain form: the system message is the caller's.
    }
    (void)err;
    return NF_OK;
}

void nf_chat_template_free(nf_chat_template *ct)
{
    free(ct->default_system);
    ct->default_system = NULL;
}

/* ---- rendering --------------------------------------------------------------------------------- */

static void chatml_turn(sbuf *b, const char *role, slice content)
{
    puts_(b, "<|im_start|>");
    puts_(b, role);
    puts_(b, "\n");
    put(b, content.p, content.n);
    puts_(b, "<|im_end|>\n");
}

static int is(const char *a, const char *b) { return strcmp(a, b) == 0; }

static void render_chatml(const nf_chat_template *ct, const nf_chat_msg *m, size_t n, sbuf *b)
{
    for (size_t i = 0; i < n; i++) {
        if (i == 0 && ct->kind == NF_CHAT_CHATML_SYSTEM && !is(m[0].role, "system"))
            chatml_turn(b, "system", sl(ct->default_system));
        chatml_turn(b, m[i].role, sl(m[i].content));
    }
}

/* Index of the last user message that is a real query (not a wrapped tool response), as the
 * template's reverse scan computes it; n-1 when there is none. */
static size_t qwen3_last_query(const nf_chat_msg *m, size_t n)
{
    for (size_t i = n; i-- > 0;) {
        slice c = sl(m[i].content);
        int wrapped = c.n >= strlen("<tool_response>") && memcmp(c.p, "<tool_response>", 15) == 0 &&
                      c.n >= 16 && memcmp(c.p + c.n - 16, "</tool_response>", 16) == 0;
        if (is(m[i].role, "user") && !wrapped) return i;
    }
    return n - 1;
}

static void qwen3_assistant(const nf_chat_msg *m, size_t i, size_t n, size_t last_query, sbuf *b)
{
    slice content = sl(m[i].content), reasoning = {"", 0};
    long close = find_first(content, "</think>");
    if (close >= 0) {
        slice before = {content.p, (size_t)close};
        long after = find_last(content, "</think>") + 8;
        reasoning = rstrip_nl(before);
        long open = find_last(reasoning, "<think>");
        if (open >= 0) reasoning = (slice){reasoning.p + open + 7, reasoning.n - (size_t)open - 7};
        reasoning = lstrip_nl(reasoning);
        content = lstrip_nl((slice){content.p + after, content.n - (size_t)after});
    }
    puts_(b, "<|im_start|>assistant\n");
    if (i > last_query && (i == n - 1 || reasoning.n > 0)) {
        slice r = lstrip_nl(rstrip_nl(reasoning));
        puts_(b, "<think>\n");
        put(b, r.p, r.n);
        puts_(b, "\n</think>\n\n");
        content = lstrip_nl(content);
    }
    put(b, content.p, content.n);
    puts_(b, "<|im_end|>\n");
}

static void render_qwen3(const nf_chat_msg *m, size_t n, sbuf *b)
{
    if (n && is(m[0].role, "system")) chatml_turn(b, "system", sl(m[0].content));
    size_t last_query = qwen3_last_query(m, n);
    for (size_t i = 0; i < n; i++) {
        const char *role = m[i].role;
        if (is(role, "user") || (is(role, "system") && i != 0)) {
            chatml_turn(b, role, sl(m[i].content));
        } else if (is(role, "assistant")) {
            qwen3_assistant(m, i, n, last_query, b);
        } else if (is(role, "tool")) {
            if (i == 0 || !is(m[i - 1].role, "tool")) puts_(b, "<|im_start|>user");
            puts_(b, "\n<tool_response>\n");
            puts_(b, m[i].content);
            puts_(b, "\n</tool_response>");
            if (i == n - 1 || !is(m[i + 1].role, "tool")) puts_(b, "<|im_end|>\n");
        } // other roles: the template emits nothing for them
    }
}

nf_status nf_chat_render(const nf_chat_template *ct, const nf_chat_msg *msgs, size_t n, int add_generation_prompt,
                         int enable_thinking, char **out, size_t *len, nf_error *err)
{
    for (size_t i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content)
            return nf_error_set(err, NF_ERR_INVALID_ARG, "chat: message %zu has no %s", i, msgs[i].role ? "content" : "role");
    sbuf b = {0};
    puts_(&b, "");
    if (ct->kind == NF_CHAT_QWEN3) render_qwen3(msgs, n, &b);
    else render_chatml(ct, msgs, n, &b);
    if (add_generation_prompt) {
        puts_(&b, "<|im_start|>assistant\n");
        if (ct->kind == NF_CHAT_QWEN3 && enable_thinking == 0) puts_(&b, "<think>\n\n</think>\n\n");
    }
    if (b.oom) {
        free(b.p);
        return nf_error_set(err, NF_ERR_NOMEM, "chat: out of memory rendering %zu messages", n);
    }
    *out = b.p;
    *len = b.n;
    return NF_OK;
}

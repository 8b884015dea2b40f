/* Response bodies and SSE chunks in OpenAI's format (api.h): chat.completion /
 * chat.completion.chunk and text_completion objects, the usage object, logprobs in the chat form
 * ({"content": [{token, logprob, bytes, top_logprobs}]}) and the completions form ({tokens,
 * token_logprobs, top_logprobs, text_offset}). */
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve/api.h"

/* ---- <think> split ------------------------------------------------------------------------ */

static int grow_append(char **b, size_t *n, const char *s, size_t len)
{
    char *p = realloc(*b, *n + len + 1);
    if (!p) return -1;
    memcpy(p + *n, s, len);
    *n += len;
    p[*n] = 0;
    *b = p;
    return 0;
}

/* The length of the longest suffix of s[0, n) that is a proper prefix of tag. */
static size_t tag_tail(const char *s, size_t n, const char *tag)
{
    size_t tl = strlen(tag);
    for (size_t k = tl - 1; k > 0; k--)
        if (k <= n && memcmp(s + n - k, tag, k) == 0) return k;
    return 0;
}

static const char open_tag[] = "<think>", close_tag[] = "</think>";

/* State 0: the reply has not shown whether it opens with <think>. */
static int think_start(nf_think_split *t, const char **text, size_t *len)
{
    size_t take = *len < sizeof t->hold - 1 - t->n_hold ? *len : sizeof t->hold - 1 - t->n_hold;
    memcpy(t->hold + t->n_hold, *text, take);
    t->n_hold += take;
    *text += take;
    *len -= take;
    size_t ol = strlen(open_tag), cmp = t->n_hold < ol ? t->n_hold : ol;
    if (memcmp(t->hold, open_tag, cmp) != 0) return 2; /* not a think block: all of it is content */
    if (t->n_hold < ol) return 0;                       /* still could be */
    /* the tag is complete: what follows it goes back in front of the rest */
    *text -= t->n_hold - ol;
    *len += t->n_hold - ol;
    t->n_hold = 0;
    return 1;
}

static int think_inside(nf_think_split *t, const char *text, size_t len, int final, char **r, size_t *rn, char **c,
                        size_t *cn)
{
    /* held bytes and new text together, searched for the closing tag */
    size_t n = t->n_hold + len;
    char *buf = malloc(n + 1);
    if (!buf) return -1;
    memcpy(buf, t->hold, t->n_hold);
    memcpy(buf + t->n_hold, text, len);
    t->n_hold = 0;
    char *end = NULL;
    for (size_t at = 0; at + strlen(close_tag) <= n && !end; at++)
        if (memcmp(buf + at, close_tag, strlen(close_tag)) == 0) end = buf + at;
    int rc = 0;
    if (end) {
        const char *after = end + strlen(close_tag);
        rc = grow_append(r, rn, buf, (size_t)(end - buf));
        t->state = 3;
        if (!rc) rc = nf_think_feed(t, after, n - (size_t)(after - buf), final, r, rn, c, cn);
    } else {
        size_t keep = final ? 0 : tag_tail(buf, n, close_tag);
        rc = grow_append(r, rn, buf, n - keep);
        memcpy(t->hold, buf + n - keep, keep);
        t->n_hold = keep;
    }
    free(buf);
    return rc;
}

int nf_think_feed(nf_think_split *t, const char *text, size_t len, int final, char **r, size_t *rn, char **c,
                  size_t *cn)
{
    if (!*r && grow_append(r, rn, "", 0)) return -1;
    if (!*c && grow_append(c, cn, "", 0)) return -1;
    while (t->state == 0 && (len || final)) {
        t->state = think_start(t, &text, &len);
        if (t->state == 0 && !final) return 0;
        if (t->state != 1) { /* content after all: the held bytes come first */
            t->state = 2;
            if (grow_append(c, cn, t->hold, t->n_hold)) return -1;
            t->n_hold = 0;
        }
    }
    if (t->state == 1) return think_inside(t, text, len, final, r, rn, c, cn);
    if (t->state == 3) { /* the blank lines between the block and the answer are not content */
        while (len && (*text == '\n' || *text == '\r' || *text == ' ')) text++, len--;
        if (len) t->state = 2;
    }
    return t->state == 2 ? grow_append(c, cn, text, len) : 0;
}

/* ---- pieces ------------------------------------------------------------------------------- */

char *nf_api_lossy_utf8(const char *s, size_t n)
{
    char *out = malloc(3 * n + 1), *o = out;
    if (!out) return NULL;
    while (n) {
        size_t ok = nf_utf8_valid_prefix(s, n);
        const char *nul = memchr(s, 0, ok);
        if (nul) ok = (size_t)(nul - s);
        memcpy(o, s, ok);
        o += ok, s += ok, n -= ok;
        if (n) { /* one invalid byte or NUL: U+FFFD */
            memcpy(o, "\xEF\xBF\xBD", 3);
            o += 3, s++, n--;
        }
    }
    *o = 0;
    return out;
}

static const char *finish_name(nf_serve_finish f)
{
    return f == NF_FINISH_LENGTH ? "length" : "stop";
}

static cJSON *base_object(const nf_api_resp *r, const char *object)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "id", r->id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)r->created);
    cJSON_AddStringToObject(o, "model", r->m->id);
    cJSON_AddNullToObject(o, "system_fingerprint");
    return o;
}

static cJSON *usage(const nf_serve_job *j)
{
    cJSON *u = cJSON_CreateObject();
    if (!u) return NULL;
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)j->prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)j->completion_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(j->prompt_tokens + j->completion_tokens));
    return u;
}

/* One token's entry in chat logprobs: token text (lossy), logprob, its bytes. */
static cJSON *lp_entry(const nf_api_model *m, int32_t id, float lp)
{
    size_t n = 0;
    const uint8_t *b = nf_tok_token_bytes(m->tok, id, &n);
    char *text = nf_api_lossy_utf8((const char *)b, b ? n : 0);
    cJSON *o = cJSON_CreateObject(), *bytes = cJSON_CreateArray();
    if (!o || !bytes || !text) {
        free(text);
        cJSON_Delete(o);
        cJSON_Delete(bytes);
        return NULL;
    }
    cJSON_AddStringToObject(o, "token", text);
    cJSON_AddNumberToObject(o, "logprob", lp);
    for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(bytes, cJSON_CreateNumber(b[i]));
    cJSON_AddItemToObject(o, "bytes", bytes);
    free(text);
    return o;
}

static cJSON *chat_lp(const nf_api_model *m, const nf_serve_event *ev)
{
    cJSON *o = lp_entry(m, ev->id, ev->logprob), *top = cJSON_CreateArray();
    for (int i = 0; o && top && i < ev->n_top; i++) cJSON_AddItemToArray(top, lp_entry(m, ev->top_ids[i], ev->top_lp[i]));
    if (o && top) cJSON_AddItemToObject(o, "top_logprobs", top);
    else cJSON_Delete(top);
    return o;
}

/* Completions logprobs: parallel arrays in *acc (created on first use). */
static void completion_lp(const nf_api_model *m, const nf_serve_event *ev, size_t offset, cJSON **acc)
{
    if (!*acc) {
        *acc = cJSON_CreateObject();
        if (!*acc) return;
        cJSON_AddItemToObject(*acc, "tokens", cJSON_CreateArray());
        cJSON_AddItemToObject(*acc, "token_logprobs", cJSON_CreateArray());
        cJSON_AddItemToObject(*acc, "top_logprobs", cJSON_CreateArray());
        cJSON_AddItemToObject(*acc, "text_offset", cJSON_CreateArray());
    }
    cJSON *e = lp_entry(m, ev->id, ev->logprob), *top = cJSON_CreateObject();
    if (!e || !top) {
        cJSON_Delete(e);
        cJSON_Delete(top);
        return;
    }
    for (int i = 0; i < ev->n_top; i++) {
        cJSON *t = lp_entry(m, ev->top_ids[i], ev->top_lp[i]);
        if (t) cJSON_AddNumberToObject(top, cJSON_GetObjectItem(t, "token")->valuestring, ev->top_lp[i]);
        cJSON_Delete(t);
    }
    cJSON_AddItemToArray(cJSON_GetObjectItem(*acc, "tokens"), cJSON_CreateString(cJSON_GetObjectItem(e, "token")->valuestring));
    cJSON_AddItemToArray(cJSON_GetObjectItem(*acc, "token_logprobs"), cJSON_CreateNumber(ev->logprob));
    cJSON_AddItemToArray(cJSON_GetObjectItem(*acc, "top_logprobs"), top);
    cJSON_AddItemToArray(cJSON_GetObjectItem(*acc, "text_offset"), cJSON_CreateNumber((double)offset));
    cJSON_Delete(e);
}

/* ---- the response ------------------------------------------------------------------------- */

int nf_api_resp_init(nf_api_resp *r, const nf_api_call *call, const nf_api_model *m, uint64_t serial)
{
    memset(r, 0, sizeof *r);
    r->call = call;
    r->m = m;
    r->created = (long long)time(NULL);
    snprintf(r->id, sizeof r->id, "%s-%016llx", call->kind == NF_API_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)serial);
    if (!call->think_split) r->think.state = 2;
    return 0;
}

void nf_api_resp_free(nf_api_resp *r)
{
    free(r->content);
    free(r->reasoning);
    cJSON_Delete(r->logprobs);
    memset(r, 0, sizeof *r);
}

/* Appends "data: <json>\n\n" to the SSE buffer; consumes o. */
static int sse(cJSON *o, char **out, size_t *n)
{
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!s) return -1;
    int rc = grow_append(out, n, "data: ", 6) || grow_append(out, n, s, strlen(s)) || grow_append(out, n, "\n\n", 2);
    free(s);
    return rc ? -1 : 0;
}

/* One streamed choice: chat's delta or completions' text, with finish_reason and logprobs. */
static cJSON *chunk(nf_api_resp *r, const char *role, const char *content, const char *reasoning, cJSON *lp,
                    const char *finish)
{
    int chat = r->call->kind == NF_API_CHAT;
    cJSON *o = base_object(r, chat ? "chat.completion.chunk" : "text_completion"), *choices = cJSON_CreateArray(),
          *c = cJSON_CreateObject();
    if (!o || !choices || !c) {
        cJSON_Delete(o), cJSON_Delete(choices), cJSON_Delete(c), cJSON_Delete(lp);
        return NULL;
    }
    cJSON_AddNumberToObject(c, "index", 0);
    if (chat) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (role) cJSON_AddStringToObject(d, "role", role);
        if (content) cJSON_AddStringToObject(d, "content", content);
        if (reasoning) cJSON_AddStringToObject(d, "reasoning_content", reasoning);
    } else
        cJSON_AddStringToObject(c, "text", content ? content : "");
    if (lp) cJSON_AddItemToObject(c, "logprobs", lp);
    else cJSON_AddNullToObject(c, "logprobs");
    if (finish) cJSON_AddStringToObject(c, "finish_reason", finish);
    else cJSON_AddNullToObject(c, "finish_reason");
    cJSON_AddItemToArray(choices, c);
    cJSON_AddItemToObject(o, "choices", choices);
    if (r->call->include_usage) cJSON_AddNullToObject(o, "usage");
    return o;
}

/* The logprobs object of one streamed token. */
static cJSON *stream_lp(nf_api_resp *r, const nf_serve_event *ev, const nf_serve_job *j, size_t text_len)
{
    if (!j->req.logprobs || ev->kind != NF_EV_TOKEN) return NULL;
    if (r->call->kind == NF_API_COMPLETION) {
        cJSON *acc = NULL;
        completion_lp(r->m, ev, r->text_offset, &acc);
        r->text_offset += text_len;
        return acc;
    }
    cJSON *o = cJSON_CreateObject(), *a = cJSON_CreateArray();
    if (o && a) cJSON_AddItemToArray(a, chat_lp(r->m, ev)), cJSON_AddItemToObject(o, "content", a);
    else cJSON_Delete(o), cJSON_Delete(a), o = NULL;
    return o;
}

static int stream_event(nf_api_resp *r, const nf_serve_event *ev, const nf_serve_job *j, int first, char **out,
                        size_t *n)
{
    int chat = r->call->kind == NF_API_CHAT;
    if (first && chat && sse(chunk(r, "assistant", "", NULL, NULL, NULL), out, n)) return -1;
    char *rs = NULL, *cs = NULL;
    size_t rn = 0, cn = 0;
    int end = ev->kind == NF_EV_END, ok_text = !(end && ev->finish == NF_FINISH_ERROR);
    if (nf_think_feed(&r->think, ok_text ? ev->text : "", ok_text ? ev->len : 0, end, &rs, &rn, &cs, &cn)) {
        free(rs), free(cs);
        return -1;
    }
    cJSON *lp = stream_lp(r, ev, j, cn);
    int rc = 0;
    if (rn || cn || lp) rc = sse(chunk(r, NULL, cn || !rn ? cs : NULL, rn ? rs : NULL, lp, NULL), out, n);
    free(rs), free(cs);
    if (rc || !end) return rc;
    if (sse(chunk(r, NULL, NULL, NULL, NULL, finish_name(ev->finish)), out, n)) return -1;
    if (r->call->include_usage) {
        cJSON *o = base_object(r, chat ? "chat.completion.chunk" : "text_completion");
        if (o) cJSON_AddItemToObject(o, "choices", cJSON_CreateArray()), cJSON_AddItemToObject(o, "usage", usage(j));
        if (sse(o, out, n)) return -1;
    }
    return grow_append(out, n, "data: [DONE]\n\n", 14) ? -1 : 0;
}

/* Non-streaming: collects the event; at END builds the whole body. */
static int whole_event(nf_api_resp *r, const nf_serve_event *ev, const nf_serve_job *j, char **out, size_t *n)
{
    int end = ev->kind == NF_EV_END, ok_text = !(end && ev->finish == NF_FINISH_ERROR);
    size_t before = r->n_content;
    if (nf_think_feed(&r->think, ok_text ? ev->text : "", ok_text ? ev->len : 0, end, &r->reasoning, &r->n_reasoning,
                      &r->content, &r->n_content))
        return -1;
    if (j->req.logprobs && ev->kind == NF_EV_TOKEN) {
        if (r->call->kind == NF_API_CHAT) {
            if (!r->logprobs) r->logprobs = cJSON_CreateArray();
            if (r->logprobs) cJSON_AddItemToArray(r->logprobs, chat_lp(r->m, ev));
        } else {
            completion_lp(r->m, ev, r->text_offset, (cJSON **)&r->logprobs);
            r->text_offset += r->n_content - before;
        }
    }
    if (!end) return 0;
    int chat = r->call->kind == NF_API_CHAT;
    cJSON *o = base_object(r, chat ? "chat.completion" : "text_completion"), *choices = cJSON_CreateArray(),
          *c = cJSON_CreateObject();
    if (!o || !choices || !c) {
        cJSON_Delete(o), cJSON_Delete(choices), cJSON_Delete(c);
        return -1;
    }
    cJSON_AddNumberToObject(c, "index", 0);
    if (chat) {
        cJSON *msg = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(msg, "role", "assistant");
        cJSON_AddStringToObject(msg, "content", r->content);
        if (r->n_reasoning) cJSON_AddStringToObject(msg, "reasoning_content", r->reasoning);
    } else
        cJSON_AddStringToObject(c, "text", r->content);
    cJSON *lp = r->logprobs;
    r->logprobs = NULL;
    if (lp && chat) {
        cJSON *w = cJSON_CreateObject();
        cJSON_AddItemToObject(w, "content", lp);
        lp = w;
    }
    if (lp) cJSON_AddItemToObject(c, "logprobs", lp);
    else cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddStringToObject(c, "finish_reason", finish_name(ev->finish));
    cJSON_AddItemToArray(choices, c);
    cJSON_AddItemToObject(o, "choices", choices);
    cJSON_AddItemToObject(o, "usage", usage(j));
    *out = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!*out) return -1;
    *n = strlen(*out);
    return 0;
}

int nf_api_resp_event(nf_api_resp *r, const nf_serve_event *ev, const nf_serve_job *j, int first, char **out,
                      size_t *out_len)
{
    *out = NULL;
    *out_len = 0;
    nf_serve_event clean = *ev;
    if (ev->len && memchr(ev->text, 0, ev->len)) { /* a generated U+0000 would end the JSON string */
        if (!(clean.text = nf_api_lossy_utf8(ev->text, ev->len))) return -1;
        clean.len = strlen(clean.text);
    }
    int rc = r->call->stream ? stream_event(r, &clean, j, first, out, out_len) : whole_event(r, &clean, j, out, out_len);
    if (clean.text != ev->text) free(clean.text);
    return rc;
}

/* ---- the small endpoints ------------------------------------------------------------------ */

char *nf_api_models_json(const nf_api_model *m, long long created)
{
    cJSON *o = cJSON_CreateObject(), *data = cJSON_CreateArray(), *e = cJSON_CreateObject();
    if (!o || !data || !e) {
        cJSON_Delete(o), cJSON_Delete(data), cJSON_Delete(e);
        return NULL;
    }
    cJSON_AddStringToObject(o, "object", "list");
    cJSON_AddStringToObject(e, "id", m->id);
    cJSON_AddStringToObject(e, "object", "model");
    cJSON_AddNumberToObject(e, "created", (double)created);
    cJSON_AddStringToObject(e, "owned_by", "ninfer");
    cJSON_AddNumberToObject(e, "max_model_len", m->ctx);
    cJSON_AddItemToArray(data, e);
    cJSON_AddItemToObject(o, "data", data);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

/* A JSON object holding one item (consumed), printed; NULL with a 500 in *e when out of memory. */
static char *print_one(const char *name, cJSON *item, nf_api_error *e)
{
    cJSON *o = cJSON_CreateObject();
    char *s = NULL;
    if (o && item && cJSON_AddItemToObject(o, name, item)) item = NULL, s = cJSON_PrintUnformatted(o);
    cJSON_Delete(item);
    cJSON_Delete(o);
    if (!s) nf_api_fail(e, 500, NULL, "out of memory");
    return s;
}

static char *tokenize(const nf_api_model *m, const cJSON *b, nf_api_error *e)
{
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(b, "content"), *add = cJSON_GetObjectItemCaseSensitive(b, "add_special");
    if (!cJSON_IsString(c)) return nf_api_fail(e, 400, "content", "'content' must be a string"), NULL;
    if (add && !cJSON_IsBool(add)) return nf_api_fail(e, 400, "add_special", "'add_special' must be a boolean"), NULL;
    nf_tok_ids ids = {0};
    nf_error err;
    unsigned flags = NF_TOK_PARSE_SPECIAL | (cJSON_IsTrue(add) ? NF_TOK_ADD_SPECIAL : 0);
    char *s = NULL;
    if (nf_tok_encode(m->tok, c->valuestring, strlen(c->valuestring), flags, &ids, &err))
        nf_api_fail(e, 400, "content", "cannot tokenize: %s", err.msg);
    else
        s = print_one("tokens", cJSON_CreateIntArray(ids.ids, (int)ids.n), e);
    nf_tok_ids_free(&ids);
    return s;
}

/* {"content": "text", "add_special": bool} -> {"tokens": [...]}, as llama-server's /tokenize. */
char *nf_api_tokenize(const nf_api_model *m, const char *body, size_t len, nf_api_error *e)
{
    cJSON *b = nf_api_json(body, len, e);
    char *s = b ? tokenize(m, b, e) : NULL;
    cJSON_Delete(b);
    return s;
}

/* The ids of a "tokens" array (malloc'd into *out, *n of them), or -1 with *e. */
static int token_ids(const nf_api_model *m, const cJSON *t, int32_t **out, size_t *n, nf_api_error *e)
{
    if (!cJSON_IsArray(t)) return nf_api_fail(e, 400, "tokens", "'tokens' must be an array of token ids");
    size_t i = 0;
    uint32_t vocab = nf_tok_vocab_size(m->tok);
    int32_t *ids = malloc(((size_t)cJSON_GetArraySize(t) + 1) * sizeof *ids);
    if (!ids) return nf_api_fail(e, 500, NULL, "out of memory");
    const cJSON *it;
    cJSON_ArrayForEach(it, t)
    {
        /* range before integrality: converting an out-of-range double to an integer is undefined */
        if (!cJSON_IsNumber(it) || !(it->valuedouble >= 0 && it->valuedouble < (double)vocab) ||
            it->valuedouble != floor(it->valuedouble)) {
            free(ids);
            return nf_api_fail(e, 400, "tokens", "token %zu: ids are integers in [0, %u)", i, vocab);
        }
        ids[i++] = (int32_t)it->valuedouble;
    }
    *out = ids;
    *n = i;
    return 0;
}

/* {"tokens": [ids]} -> {"content": "text"} (invalid UTF-8 as U+FFFD). */
char *nf_api_detokenize(const nf_api_model *m, const char *body, size_t len, nf_api_error *e)
{
    cJSON *b = nf_api_json(body, len, e);
    int32_t *ids = NULL;
    size_t n = 0, tl = 0;
    char *text = NULL, *s = NULL;
    nf_error err;
    if (b && !token_ids(m, cJSON_GetObjectItemCaseSensitive(b, "tokens"), &ids, &n, e)) {
        if (nf_tok_decode(m->tok, ids, n, 0, &text, &tl, &err)) nf_api_fail(e, 400, "tokens", "%s", err.msg);
        else {
            char *clean = nf_api_lossy_utf8(text, tl);
            s = clean ? print_one("content", cJSON_CreateString(clean), e) : NULL;
            if (!clean) nf_api_fail(e, 500, NULL, "out of memory");
            free(clean);
        }
    }
    free(text);
    free(ids);
    cJSON_Delete(b);
    return s;
}

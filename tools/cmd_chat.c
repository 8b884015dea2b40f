/* `ninfer chat -m model.nf`: an interactive loop with history. Each turn renders the whole
 * conversation with the checkpoint's chat template (tokenizer/chat.h), keeps the KV cache of the
 * longest common prefix with what the model already saw, and runs only the new tokens. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "commands.h"
#include "gen_common.h"
#include "tokenizer/chat.h"

typedef struct chat_state {
    nf_chat_msg *msgs;
    char **owned; /* the contents, malloc'd */
    size_t n, cap;
} chat_state;

static int chat_push(chat_state *c, const char *role, const char *content, size_t len)
{
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 16;
        nf_chat_msg *m = realloc(c->msgs, cap * sizeof *m);
        if (!m) return 0;
        c->msgs = m;
        char **o = realloc(c->owned, cap * sizeof *o);
        if (!o) return 0;
        c->owned = o;
        c->cap = cap;
    }
    char *s = malloc(len + 1);
    if (!s) return 0;
    memcpy(s, content, len);
    s[len] = 0;
    c->owned[c->n] = s;
    c->msgs[c->n++] = (nf_chat_msg){role, s};
    return 1;
}

static void chat_clear(chat_state *c)
{
    for (size_t i = 0; i < c->n; i++) free(c->owned[i]);
    c->n = 0;
}

typedef struct reply {
    char *s;
    size_t len, cap;
} reply;

static void emit_reply(void *ctx, const char *text, size_t len)
{
    reply *r = ctx;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    if (r->len + len + 1 > r->cap) {
        size_t cap = (r->len + len + 1) * 2;
        char *p = realloc(r->s, cap);
        if (!p) return; /* the reply is still printed; the history keeps what fitted */
        r->s = p;
        r->cap = cap;
    }
    memcpy(r->s + r->len, text, len);
    r->len += len;
}

/* One turn: render, reuse the common prefix of the cache, generate. */
static int turn(nf_gen_session *gs, const nf_chat_template *ct, chat_state *c, nf_tok_ids *seq, nf_error *e)
{
    char *text = NULL;
    size_t len;
    nf_tok_ids ids = {0};
    if (nf_chat_render(ct, c->msgs, c->n, 1, -1, &text, &len, e) ||
        nf_tok_encode(gs->tok, text, len, NF_TOK_PARSE_SPECIAL, &ids, e)) {
        free(text);
        nf_tok_ids_free(&ids);
        return nf_cli_fail("%s", e->msg);
    }
    free(text);
    size_t common = 0;
    while (common < seq->n && common < ids.n && common < gs->eng->n_past && seq->ids[common] == ids.ids[common]) common++;
    if (common == ids.n) common--; /* at least one token must run to get logits */
    nf_engine_truncate(gs->eng, (uint32_t)common);
    common = gs->eng->n_past; /* a hybrid model keeps nothing: its state cannot rewind */
    seq->n = common;
    reply r = {0};
    nf_gen_stats st;
    int rc = 0;
    if (nf_generate(gs->eng, gs->tok, gs->sampler, ids.ids + common, ids.n - common, &gs->params, emit_reply, &r, seq,
                    &st, e))
        rc = nf_cli_fail("%s", e->msg);
    else {
        fputc('\n', stdout);
        fflush(stdout);
        nf_gen_print_stats(&st, gs->eng, gs->params.spec_k, gs->params.spec_mtp);
        if (!chat_push(c, "assistant", r.s ? r.s : "", r.len)) rc = nf_cli_fail("out of memory");
    }
    free(r.s);
    nf_tok_ids_free(&ids);
    return rc;
}

int nf_cmd_chat(int argc, char **argv)
{
    nf_gen_cli g;
    nf_gen_cli_defaults(&g);
    g.n_predict = 512;
    const char *system = NULL;
    nf_opt opts[NF_GEN_CLI_MAX_OPTS + 1];
    int n = nf_gen_cli_opts(&g, opts);
    opts[n++] = (nf_opt){"--system", 0, NF_OPT_STRING, &system, "TEXT", "a system message to start the conversation", 0, 0};
    const nf_cmd_usage u = {
        .name = "chat",
        .synopsis = "-m MODEL [--system TEXT] [sampling flags as for run]",
        .description = "Interactive chat (on the GPU when one is visible, else the CPU; --device): one line of input is\n"
                       "one user message; the reply streams to stdout. /reset forgets the conversation, /exit or end of input quits.",
        .opts = opts,
        .n_opts = n,
    };
    int npos, r = nf_cli_parse(&u, argc, argv, NULL, &npos);
    if (r) return r == NF_CLI_HELP ? 0 : 2;
    if (!g.model_path) {
        fprintf(stderr, "ninfer: error: chat needs -m MODEL\n");
        nf_cli_print_help(&u, stderr);
        return 2;
    }
    nf_gen_session gs;
    nf_chat_template ct = {0};
    nf_error e;
    if (nf_gen_session_open(&g, &gs, &e)) return nf_cli_fail("%s", e.msg);
    if (nf_chat_detect(nf_tok_chat_template(gs.tok), &ct, &e)) {
        nf_gen_session_close(&gs);
        return nf_cli_fail("%s", e.msg);
    }
    chat_state c = {0};
    nf_tok_ids seq = {0};
    int rc = 0, tty = isatty(0);
    char line[8192];
    if (system && !chat_push(&c, "system", system, strlen(system))) rc = nf_cli_fail("out of memory");
    while (!rc) {
        if (tty) fputs("> ", stdout), fflush(stdout);
        if (!fgets(line, sizeof line, stdin)) break;
        size_t len = strcspn(line, "\r\n");
        line[len] = 0;
        if (strcmp(line, "/exit") == 0) break;
        if (strcmp(line, "/reset") == 0) {
            chat_clear(&c);
            if (system && !chat_push(&c, "system", system, strlen(system))) rc = nf_cli_fail("out of memory");
            continue;
        }
        if (!len) continue;
        if (!chat_push(&c, "user", line, len)) rc = nf_cli_fail("out of memory");
        else rc = turn(&gs, &ct, &c, &seq, &e);
    }
    chat_clear(&c);
    free(c.msgs);
    free(c.owned);
    nf_tok_ids_free(&seq);
    nf_chat_template_free(&ct);
    nf_gen_session_close(&gs);
    return rc;
}

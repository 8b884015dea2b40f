/* `ninfer run -m model.nf -p "..."`: generate a continuation of a prompt (or, with --chat, the answer
 * to it as a user message in the model's chat template), streaming text to stdout and printing
 * prompt and generation tokens/s on stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "commands.h"
#include "engine/generate.h"
#include "engine/text.h"
#include "gen_common.h"
#include "tokenizer/chat.h"

static void emit_stdout(void *ctx, const char *text, size_t len)
{
    (void)ctx;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
}

/* The prompt ids: the text as given, or rendered as one user turn with the chat template. */
static nf_status prompt_ids(const nf_tokenizer *tok, const char *prompt, int chat, nf_tok_ids *ids, nf_error *err)
{
    if (!chat) return nf_tok_encode(tok, prompt, strlen(prompt), NF_TOK_ADD_SPECIAL | NF_TOK_PARSE_SPECIAL, ids, err);
    nf_chat_template ct;
    nf_status st = nf_chat_detect(nf_tok_chat_template(tok), &ct, err);
    if (st) return st;
    nf_chat_msg msg = {"user", prompt};
    char *text = NULL;
    size_t len;
    st = nf_chat_render(&ct, &msg, 1, 1, -1, &text, &len, err);
    if (!st) st = nf_tok_encode(tok, text, len, NF_TOK_PARSE_SPECIAL, ids, err);
    free(text);
    nf_chat_template_free(&ct);
    return st;
}

int nf_cmd_run(int argc, char **argv)
{
    nf_gen_cli g;
    nf_gen_cli_defaults(&g);
    const char *prompt = NULL;
    int chat = 0;
    nf_opt opts[NF_GEN_CLI_MAX_OPTS + 2];
    int n = nf_gen_cli_opts(&g, opts);
    opts[n++] = (nf_opt){"--prompt", 'p', NF_OPT_STRING, &prompt, "TEXT", "the prompt (required)", 0, 0};
    opts[n++] = (nf_opt){"--chat", 0, NF_OPT_FLAG, &chat, NULL, "send the prompt as a user message in the chat template", 0, 0};
    const nf_cmd_usage u = {
        .name = "run",
        .synopsis = "-m MODEL -p TEXT [-n N] [--temp T] [--top-k K] [--top-p P] [--min-p P] [--seed S] [--spec ngram:K|mtp:K] ...",
        .description = "Generate text from a prompt (on the GPU when one is visible, else the CPU; --device). The\n"
                       "continuation streams to stdout; prompt and generation speed (tokens/s, bytes moved per token,\n"
                       "GB/s and, on the GPU, the share of its DRAM read peak measured after the run) go to stderr.\n"
                       "Generation stops after -n tokens, at an end-of-generation token or at a --stop string. --spec ngram:K\n"
                       "drafts up to K tokens a step from earlier text and verifies them in one forward (docs/engine.md);\n"
                       "--spec mtp:K drafts them with a hybrid's MTP block (docs/hybrid.md).",
        .opts = opts,
        .n_opts = n,
    };
    int npos, r = nf_cli_parse(&u, argc, argv, NULL, &npos);
    if (r) return r == NF_CLI_HELP ? 0 : 2;
    if (!g.model_path || !prompt) {
        fprintf(stderr, "ninfer: error: run needs -m MODEL and -p TEXT\n");
        nf_cli_print_help(&u, stderr);
        return 2;
    }
    nf_gen_session gs;
    nf_error e;
    if (nf_gen_session_open(&g, &gs, &e)) return nf_cli_fail("%s", e.msg);
    nf_tok_ids ids = {0}, seq = {0};
    nf_gen_stats st;
    int rc = 0;
    if (prompt_ids(gs.tok, prompt, chat, &ids, &e)) rc = nf_cli_fail("%s", e.msg);
    else if (nf_generate(gs.eng, gs.tok, gs.sampler, ids.ids, ids.n, &gs.params, emit_stdout, NULL, &seq, &st, &e))
        rc = nf_cli_fail("%s", e.msg);
    if (!rc) {
        fputc('\n', stdout);
        fflush(stdout);
        nf_gen_print_stats(&st, gs.eng, gs.params.spec_k, gs.params.spec_mtp);
    }
    nf_tok_ids_free(&ids);
    nf_tok_ids_free(&seq);
    nf_gen_session_close(&gs);
    return rc;
}

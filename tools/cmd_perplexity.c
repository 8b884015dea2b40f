/* `ninfer perplexity -m model.nf -f text.txt [-c 512]`: llama.cpp's method. The text is tokenized
 * once (with BOS when the tokenizer adds one); it is cut into non-overlapping windows of c tokens
 * (the first token of each window replaced by BOS when the model uses one); each window runs as a
 * fresh sequence and only its second half is scored: for j in [c/2, c - 1), the negative log
 * probability of token j + 1 under the logits of position j. PPL = exp(mean NLL). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/timer.h"
#include "cli.h"
#include "commands.h"
#include "engine/engine.h"
#include "engine/text.h"

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *s = malloc(cap);
    size_t got;
    while (s && (got = fread(s + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            char *p = realloc(s, cap *= 2);
            if (!p) {
                free(s);
                s = NULL;
            }
            s = p;
        }
    }
    fclose(f);
    *len = n;
    return s;
}

/* log softmax(logits)[target] in double */
static double log_prob(const float *l, size_t V, int32_t target)
{
    float mx = l[0];
    for (size_t i = 1; i < V; i++) mx = l[i] > mx ? l[i] : mx;
    double sum = 0;
    for (size_t i = 0; i < V; i++) sum += exp((double)l[i] - mx);
    return (double)l[target] - mx - log(sum);
}

static int score(nf_engine *eng, const nf_tokenizer *tok, const int32_t *ids, size_t n, size_t c)
{
    const size_t V = eng->model->cfg.vocab, chunks = n / c;
    float *logits = malloc(c * V * sizeof(float));
    int32_t *win = malloc(c * sizeof(int32_t));
    if (!logits || !win) {
        free(logits);
        free(win);
        return nf_cli_fail("out of memory for %zu x %zu logits", c, V);
    }
    const int32_t bos = nf_tok_bos(tok);
    double nll = 0;
    size_t count = 0;
    nf_error e;
    uint64_t t0 = nf_time_ns();
    for (size_t k = 0; k < chunks; k++) {
        memcpy(win, ids + k * c, c * sizeof(int32_t));
        if (bos >= 0 && k > 0) win[0] = bos; /* the first window already starts with it */
        nf_engine_reset(eng);
        if (nf_engine_prefill(eng, win, c, logits, &e)) {
            free(logits);
            free(win);
            return nf_cli_fail("%s", e.msg);
        }
        for (size_t j = c / 2; j + 1 < c; j++) {
            nll -= log_prob(logits + j * V, V, ids[k * c + j + 1]);
            count++;
        }
        printf("[%zu]%.4f%s", k + 1, exp(nll / (double)count), k + 1 < chunks ? ", " : "\n");
        fflush(stdout);
    }
    double dt = (double)(nf_time_ns() - t0) * 1e-9;
    printf("perplexity: %.4f over %zu scored tokens in %zu windows of %zu\n", exp(nll / (double)count), count, chunks, c);
    fprintf(stderr, "perplexity: %zu tokens in %.2f s (%.1f tokens/s)\n", chunks * c, dt, (double)(chunks * c) / dt);
    free(logits);
    free(win);
    return 0;
}

int nf_cmd_perplexity(int argc, char **argv)
{
    const char *model_path = NULL, *file = NULL, *device = "auto";
    long ctx = 512, threads = 0;
    const nf_opt opts[] = {
        {"--model", 'm', NF_OPT_STRING, &model_path, "FILE", "the .nf model (required)", 0, 0},
        {"--file", 'f', NF_OPT_STRING, &file, "TEXT", "the text file to score (required)", 0, 0},
        {"--ctx", 'c', NF_OPT_INT, &ctx, "N", "window length in tokens (default 512)", 4, 1 << 20},
        {"--threads", 't', NF_OPT_INT, &threads, "N", "worker threads (default: all CPUs)", 0, 1024},
        {"--device", 0, NF_OPT_STRING, &device, "DEV", "cpu, cuda or auto (default: cuda when a GPU is visible)", 0, 0},
    };
    const nf_cmd_usage u = {
        .name = "perplexity",
        .synopsis = "-m MODEL -f TEXT [-c N]",
        .description = "Perplexity of a text, llama.cpp's way: non-overlapping windows of N tokens, each scored on\n"
                       "its second half. For comparing recipes of one model on the same text.",
        .opts = opts,
        .n_opts = NF_CLI_COUNT(opts),
    };
    int npos, r = nf_cli_parse(&u, argc, argv, NULL, &npos);
    if (r) return r == NF_CLI_HELP ? 0 : 2;
    if (!model_path || !file) {
        fprintf(stderr, "ninfer: error: perplexity needs -m MODEL and -f TEXT\n");
        nf_cli_print_help(&u, stderr);
        return 2;
    }
    size_t len;
    char *text = read_file(file, &len);
    if (!text) return nf_cli_fail("%s: cannot read", file);
    nf_model *m = NULL;
    nf_tokenizer *tok = NULL;
    nf_engine *eng = NULL;
    nf_tok_ids ids = {0};
    nf_error e;
    int rc = 0;
    nf_engine_opts eo = {.device = device, .threads = (int)threads, .ctx = (uint32_t)ctx, .chunk = (uint32_t)ctx};
    if (nf_model_load(model_path, &m, &e) || nf_text_tokenizer(m->art, &tok, &e) ||
        nf_tok_encode(tok, text, len, NF_TOK_ADD_SPECIAL, &ids, &e) || nf_engine_create(m, &eo, &eng, &e))
        rc = nf_cli_fail("%s", e.msg);
    else if (ids.n < (size_t)ctx)
        rc = nf_cli_fail("%s: %zu tokens, fewer than one window of %ld (lower -c)", file, ids.n, ctx);
    else
        rc = score(eng, tok, ids.ids, ids.n, (size_t)ctx);
    nf_engine_free(eng);
    nf_tok_ids_free(&ids);
    nf_tok_free(tok);
    nf_model_free(m);
    free(text);
    return rc;
}

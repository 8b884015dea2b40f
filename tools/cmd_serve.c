/* `ninfer serve -m model.nf`: the OpenAI-compatible HTTP server (src/serve/, docs/serve.md). The
 * server listens first (so /health answers 503 while the model loads), then the model is loaded and
 * attached; SIGINT or SIGTERM stops it gracefully and the command exits 0. */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "cli.h"
#include "commands.h"
#include "engine/spec.h"
#include "engine/text.h"
#include "model/model.h"
#include "serve/server.h"
#include "serve/worker.h"
#include "tokenizer/chat.h"

typedef struct serve_cli {
    const char *model, *host, *key, *key_file, *device, *name, *spec;
    long port, ctx, parallel, kv_pages, threads, max_body, max_conns, timeout, queue;
    int kv_bf16;
    nf_spec_mode spec_mode; /* --spec, parsed */
    uint32_t spec_k;
} serve_cli;

/* The key file's first line, without its line end (malloc'd), or NULL after a message. */
static char *read_key_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return nf_cli_fail("cannot open --api-key-file %s", path), NULL;
    char line[1024];
    char *k = fgets(line, sizeof line, f) ? strdup(line) : NULL;
    fclose(f);
    if (k) k[strcspn(k, "\r\n")] = 0;
    if (!k || !*k) return free(k), nf_cli_fail("--api-key-file %s holds no key", path), NULL;
    return k;
}

/* "dir/name.nf" -> "name": the id /v1/models lists. */
static void model_id(const char *path, char *out, size_t cap)
{
    const char *b = strrchr(path, '/');
    snprintf(out, cap, "%s", b ? b + 1 : path);
    size_t n = strlen(out);
    if (n > 3 && strcmp(out + n - 3, ".nf") == 0) out[n - 3] = 0;
}

/* Everything the server serves from: model, engine, tokenizer, template, backend. */
typedef struct loaded {
    nf_model *model;
    nf_engine *eng;
    nf_tokenizer *tok;
    nf_chat_template ct;
    nf_serve_backend *backend;
    const int32_t *eos;
    size_t n_eos;
    int32_t eos_one;
    nf_api_model api;
    char id[128];
} loaded;

/* --parallel's default. On a GPU a decode step streams the expert weights once for every token in the
 * batch, so more sequences cost little each: 64 (the concurrency; its pool at a 4096 context
 * for qwen3-30b-a3b, bf16 K and V of 48 layers x 4 heads x 128 = 96 KiB a token, is 24 GiB beside
 * 17 GiB of q4q6 weights). On the CPU the products cost per token and the batch buys less: 8 keeps
 * each request's pace while the weights are still read once for eight tokens. A model whose rope
 * follows the sequence's length (dynamic NTK) runs one sequence per forward on every backend. */
static uint32_t parallel_for(const serve_cli *c, const nf_model *m)
{
    if (m->cfg.rope_scaling == NF_ROPE_SCALING_DYNAMIC) return 1;
    if (c->parallel) return (uint32_t)c->parallel;
    int cuda = strcmp(c->device, "cuda") == 0 || (strcmp(c->device, "auto") == 0 && nf_cuda_device_count(NULL, 0) > 0);
    return cuda ? 64 : 8;
}

static nf_status load(const serve_cli *c, loaded *L, nf_error *err)
{
    nf_status st = nf_model_load(c->model, &L->model, err);
    if (st) return st;
    const uint32_t parallel = parallel_for(c, L->model);
    if (c->parallel > 1 && parallel == 1)
        fprintf(stderr, "ninfer: serve: --parallel %ld: this model's dynamic rope runs one sequence at a time\n", c->parallel);
    nf_engine_opts eo = {.device = c->device, .threads = (int)c->threads, .ctx = (uint32_t)c->ctx, .kv_bf16 = c->kv_bf16,
                         .max_seqs = parallel, .kv_pages = (uint32_t)c->kv_pages,
                         .mtp = c->spec_k && c->spec_mode == NF_SPEC_MODE_MTP};
    if ((st = nf_text_tokenizer(L->model->art, &L->tok, err)) || (st = nf_engine_create(L->model, &eo, &L->eng, err)) ||
        (st = nf_chat_detect(nf_tok_chat_template(L->tok), &L->ct, err)))
        return st;
    nf_text_eos_ids(L->model->art, &L->eos, &L->n_eos, &L->eos_one);
    nf_serve_worker_opts wo = {.engine = L->eng, .tok = L->tok, .eos = L->eos, .n_eos = L->n_eos,
                               .max_waiting = (size_t)c->queue, .spec_k = c->spec_k,
                               .spec_mtp = c->spec_mode == NF_SPEC_MODE_MTP};
    if ((st = nf_serve_worker_create(&wo, &L->backend, err))) return st;
    if (c->name) snprintf(L->id, sizeof L->id, "%s", c->name);
    else model_id(c->model, L->id, sizeof L->id);
    L->api = (nf_api_model){.id = L->id, .tok = L->tok, .ct = &L->ct, .ctx = L->eng->opts.ctx, .vocab = L->model->cfg.vocab};
    return NF_OK;
}

static void unload(loaded *L)
{
    if (L->backend) L->backend->ops->destroy(L->backend);
    nf_chat_template_free(&L->ct);
    nf_engine_free(L->eng);
    nf_tok_free(L->tok);
    nf_model_free(L->model);
}

static int parse(serve_cli *c, int argc, char **argv)
{
    *c = (serve_cli){.host = "127.0.0.1", .port = 8080, .device = "auto", .max_body = 1 << 20,
                     .max_conns = 256, .timeout = 30, .queue = 64};
    nf_opt opts[] = {
        {"--model", 'm', NF_OPT_STRING, &c->model, "FILE", "the .nf model (required)", 0, 0},
        {"--host", 0, NF_OPT_STRING, &c->host, "ADDR", "address to listen on (default 127.0.0.1: this machine only)", 0, 0},
        {"--port", 'p', NF_OPT_INT, &c->port, "N", "TCP port; 0 = any free one (default 8080)", 0, 65535},
        {"--api-key", 0, NF_OPT_STRING, &c->key, "KEY", "require 'Authorization: Bearer KEY' (default: no key)", 0, 0},
        {"--api-key-file", 0, NF_OPT_STRING, &c->key_file, "FILE", "the key from a file's first line (keeps it out of ps)", 0, 0},
        {"--name", 0, NF_OPT_STRING, &c->name, "ID", "the model id clients name (default: the file name without .nf)", 0, 0},
        {"--ctx", 'c', NF_OPT_INT, &c->ctx, "N", "context length (default: the model's, at most 4096)", 0, 1 << 24},
        {"--parallel", 0, NF_OPT_INT, &c->parallel, "N", "sequences batched at once (default 64 on a GPU, 8 on the CPU)", 1, 4096},
        {"--kv-pages", 0, NF_OPT_INT, &c->kv_pages, "N", "KV pages of 64 tokens in the pool (default: --parallel full contexts)", 1, 1L << 31},
        {"--queue", 0, NF_OPT_INT, &c->queue, "N", "requests waiting beyond those running; more get 503 (default 64)", 0, 1 << 20},
        {"--device", 0, NF_OPT_STRING, &c->device, "DEV", "cpu, cuda or auto (default: cuda when a GPU is visible)", 0, 0},
        {"--spec", 0, NF_OPT_STRING, &c->spec, "ngram:K|mtp:K", "speculative decoding for every request: up to K drafts "
         "a step from the request's own tokens (prompt lookup) or a hybrid's MTP block; the same greedy text, sampled "
         "text equally distributed (docs/serve.md)", 0, 0},
        {"--threads", 't', NF_OPT_INT, &c->threads, "N", "CPU worker threads (default: all CPUs)", 0, 1024},
        {"--kv-bf16", 0, NF_OPT_FLAG, &c->kv_bf16, NULL, "CPU: keep the KV cache in bf16 (default f32)", 0, 0},
        {"--max-body", 0, NF_OPT_INT, &c->max_body, "BYTES", "largest request body; more gets 413 (default 1 MiB)", 64, 1 << 30},
        {"--max-conns", 0, NF_OPT_INT, &c->max_conns, "N", "open connections at once (default 256)", 1, 100000},
        {"--timeout", 0, NF_OPT_INT, &c->timeout, "S", "close a connection idle this long, e.g. a request that stops arriving (default 30)", 1, 86400},
    };
    const nf_cmd_usage u = {
        .name = "serve",
        .synopsis = "-m MODEL [--host ADDR] [--port N] [--api-key KEY | --api-key-file FILE] [--ctx N] [--parallel N] [--device DEV]",
        .description = "Serve the model over HTTP with OpenAI's API: POST /v1/chat/completions, /v1/completions,\n"
                       "/tokenize, /detokenize; GET /v1/models, /health, /metrics, and a chat page at /\n"
                       "(docs/serve.md). SIGINT or SIGTERM stops it: in-flight streams get their final chunk.",
        .opts = opts,
        .n_opts = NF_CLI_COUNT(opts),
    };
    int npos, r = nf_cli_parse(&u, argc, argv, NULL, &npos);
    if (r) return r == NF_CLI_HELP ? 0 : 2;
    if (!c->model) {
        fprintf(stderr, "ninfer: error: serve needs -m MODEL\n");
        nf_cli_print_help(&u, stderr);
        return 2;
    }
    nf_error e;
    if (c->spec && nf_spec_parse(c->spec, &c->spec_mode, &c->spec_k, &e)) return nf_cli_fail("%s", e.msg), 2;
    return -1;
}

int nf_cmd_serve(int argc, char **argv)
{
    serve_cli c;
    int r = parse(&c, argc, argv);
    if (r >= 0) return r;
    char *key = c.key_file ? read_key_file(c.key_file) : NULL;
    if (c.key_file && !key) return 1;
    /* the signals are taken by sigwait below; every thread started from here on inherits the mask */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    nf_server_opts so = {.host = c.host, .port = (int)c.port, .api_key = key ? key : c.key, .max_body = (size_t)c.max_body,
                         .max_conns = (unsigned)c.max_conns, .timeout_s = (unsigned)c.timeout};
    nf_server *srv;
    nf_error e;
    if (nf_server_start(&so, &srv, &e)) {
        free(key);
        return nf_cli_fail("%s", e.msg);
    }
    fprintf(stderr, "ninfer: serve: listening on http://%s:%d (loading %s)\n", c.host, nf_server_port(srv), c.model);
    loaded L = {0};
    int rc = 0;
    if (load(&c, &L, &e)) rc = nf_cli_fail("%s", e.msg);
    else {
        nf_server_attach(srv, &L.api, L.backend);
        fprintf(stderr, "ninfer: serve: ready: model '%s', context %u, %s, %u sequences at once, %u KV pages of %u tokens\n",
                L.id, L.api.ctx, L.eng->ops->name, L.eng->opts.max_seqs, L.eng->opts.kv_pages, L.eng->opts.page_tokens);
        int sig = 0;
        sigwait(&sigs, &sig);
        fprintf(stderr, "ninfer: serve: %s: stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    }
    nf_server_stop(srv, 10);
    unload(&L);
    free(key);
    return rc;
}

/* Today's backend (backend.h): one thread that owns one engine and runs queued jobs one at a time,
 * first come first served. The continuous-batching scheduler replaces this file. */
#ifndef NF_SERVE_WORKER_H
#define NF_SERVE_WORKER_H

#include "engine/engine.h"
#include "serve/backend.h"
#include "tokenizer/tokenizer.h"

typedef struct nf_serve_worker_opts {
    nf_engine *engine;          /* owned by the caller; only the worker thread touches it */
    const nf_tokenizer *tok;    /* read-only, shared with the HTTP threads */
    const int32_t *eos;         /* [n_eos] ids that end generation */
    size_t n_eos;
    size_t max_waiting;         /* queued jobs beyond the running one; submit refuses past it */
} nf_serve_worker_opts;

nf_status nf_serve_worker_create(const nf_serve_worker_opts *o, nf_serve_backend **out, nf_error *err);

#endif

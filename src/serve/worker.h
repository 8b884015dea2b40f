/* The backend (backend.h): one thread that owns the engine and a continuous-batching scheduler over
 * its KV page pool (engine/sched.h). Submitted jobs become sequences of the scheduler; the thread
 * steps it (one batched forward per step) while anything runs, and between steps takes new jobs and
 * cancellations from the HTTP threads. */
#ifndef NF_SERVE_WORKER_H
#define NF_SERVE_WORKER_H

#include "engine/engine.h"
#include "serve/backend.h"
#include "tokenizer/tokenizer.h"

typedef struct nf_serve_worker_opts {
    nf_engine *engine;          /* owned by the caller; only the worker thread touches it; its max_seqs
                                 * and kv_pages bound the sequences that run at once */
    const nf_tokenizer *tok;    /* read-only, shared with the HTTP threads */
    const int32_t *eos;         /* [n_eos] ids that end generation */
    size_t n_eos;
    size_t max_waiting;         /* jobs beyond the engine's max_seqs; submit refuses past it */
    uint32_t spec_k;            /* speculation for every request (`serve --spec`; 0: off): up to spec_k drafts */
    int spec_mtp;               /* a step, from the MTP block, else from the request's own tokens (engine/sched.h) */
} nf_serve_worker_opts;

nf_status nf_serve_worker_create(const nf_serve_worker_opts *o, nf_serve_backend **out, nf_error *err);

#endif

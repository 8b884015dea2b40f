/* Session bookkeeping over a backend: defaults, context checks, chunking. */
#include "engine/engine.h"

#include <stdlib.h>
#include <string.h>

#include "base/parallel.h"

nf_status nf_engine_create(const nf_model *m, const nf_engine_opts *o, nf_engine **out, nf_error *err)
{
    *out = NULL;
    nf_engine_opts opt = o ? *o : (nf_engine_opts){0};
    const nf_backend_ops *ops = NULL;
    if (!opt.device || strcmp(opt.device, "cpu") == 0) ops = &nf_cpu_backend;
    else
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "device '%s' is not available in this build (known: cpu)",
                            opt.device);
    if (!opt.ctx) opt.ctx = m->cfg.max_ctx && m->cfg.max_ctx < 4096 ? m->cfg.max_ctx : 4096;
    if (opt.threads <= 0) opt.threads = nf_cpu_count();
    if (!opt.chunk) opt.chunk = 128;
    if (opt.chunk > opt.ctx) opt.chunk = opt.ctx;
    nf_engine *e = calloc(1, sizeof *e);
    if (!e || !(e->logits = malloc((size_t)m->cfg.vocab * sizeof(float)))) {
        free(e);
        return nf_error_set(err, NF_ERR_NOMEM, "engine: out of memory");
    }
    e->model = m;
    e->ops = ops;
    e->opts = opt;
    nf_status st = ops->create(m, &e->opts, &e->state, err);
    if (st) {
        free(e->logits);
        free(e);
        return st;
    }
    *out = e;
    return NF_OK;
}

void nf_engine_free(nf_engine *e)
{
    if (!e) return;
    if (e->state) e->ops->destroy(e->state);
    free(e->logits);
    free(e);
}

void nf_engine_reset(nf_engine *e) { e->n_past = 0; }

nf_status nf_engine_prefill(nf_engine *e, const int32_t *tokens, size_t n, float *all_logits, nf_error *err)
{
    if (n == 0) return nf_error_set(err, NF_ERR_INVALID_ARG, "no tokens to run");
    if (n > e->opts.ctx || e->n_past + n > e->opts.ctx)
        return nf_error_set(err, NF_ERR_INVALID_ARG,
                            "%zu tokens after %u already in the sequence do not fit the context of %u tokens "
                            "(raise --ctx, up to the model's %u)",
                            n, e->n_past, e->opts.ctx, e->model->cfg.max_ctx);
    const size_t V = e->model->cfg.vocab;
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= V)
            return nf_error_set(err, NF_ERR_INVALID_ARG, "token %zu is id %d, outside the vocabulary of %zu", i,
                                tokens[i], V);
    for (size_t i = 0; i < n; i += e->opts.chunk) {
        size_t T = n - i < e->opts.chunk ? n - i : e->opts.chunk;
        float *lg = all_logits ? all_logits + i * V : e->logits;
        nf_status st = e->ops->forward(e->state, tokens + i, T, e->n_past, lg, all_logits != NULL, err);
        if (st) return st;
        e->n_past += (uint32_t)T;
    }
    if (all_logits) memcpy(e->logits, all_logits + (n - 1) * V, V * sizeof(float));
    return NF_OK;
}

nf_status nf_engine_decode(nf_engine *e, int32_t token, nf_error *err)
{
    return nf_engine_prefill(e, &token, 1, NULL, err);
}

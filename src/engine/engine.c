/* Session bookkeeping over a backend: defaults, context checks, chunking. */
#include "engine/engine.h"

#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "base/parallel.h"
#include "engine/sampler.h"

nf_status nf_engine_create(const nf_model *m, const nf_engine_opts *o, nf_engine **out, nf_error *err)
{
    *out = NULL;
    nf_engine_opts opt = o ? *o : (nf_engine_opts){0};
    const nf_backend_ops *ops = NULL;
    if (opt.device && strcmp(opt.device, "auto") == 0) opt.device = nf_cuda_device_count(NULL, 0) > 0 ? "cuda" : "cpu";
    if (!opt.device || strcmp(opt.device, "cpu") == 0) ops = &nf_cpu_backend;
    else if (strcmp(opt.device, "cuda") == 0) ops = &nf_cuda_backend;
    else
        return nf_error_set(err, NF_ERR_INVALID_ARG, "unknown device '%s' (known: cpu, cuda, auto)", opt.device);
    if (!opt.ctx) opt.ctx = m->cfg.max_ctx && m->cfg.max_ctx < 4096 ? m->cfg.max_ctx : 4096;
    if (opt.threads <= 0) opt.threads = nf_cpu_count();
    if (!opt.chunk) opt.chunk = ops == &nf_cuda_backend ? 2048 : 128; /* a GPU GEMM wants long chunks */
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
        const int defer = e->defer_logits && e->ops->logits && !all_logits;
        float *lg = all_logits ? all_logits + i * V : defer ? NULL : e->logits;
        nf_status st = e->ops->forward(e->state, tokens + i, T, e->n_past, lg, all_logits != NULL, err);
        if (st) return st;
        e->n_past += (uint32_t)T;
        e->logits_stale = lg == NULL;
    }
    if (all_logits) memcpy(e->logits, all_logits + (n - 1) * V, V * sizeof(float));
    return NF_OK;
}

nf_status nf_engine_decode(nf_engine *e, int32_t token, nf_error *err)
{
    return nf_engine_prefill(e, &token, 1, NULL, err);
}

const float *nf_engine_logits(nf_engine *e, nf_error *err)
{
    if (e->logits_stale) {
        if (e->ops->logits(e->state, e->logits, err)) return NULL;
        e->logits_stale = 0;
    }
    return e->logits;
}

nf_status nf_engine_next(nf_engine *e, nf_sampler *s, const int32_t *history, size_t n_hist, int32_t *id, nf_error *err)
{
    const uint32_t k = nf_sampler_device_k(s, history, n_hist);
    if (e->logits_stale && e->ops->topk && k) {
        int32_t ids[NF_SAMPLER_DEVICE_MAX_K];
        float vals[NF_SAMPLER_DEVICE_MAX_K];
        nf_status st = e->ops->topk(e->state, k, ids, vals, err);
        if (st) return st;
        *id = nf_sampler_sample_top(s, ids, vals, k);
        return NF_OK;
    }
    const float *l = nf_engine_logits(e, err);
    if (!l) return err ? err->code : NF_ERR_CUDA;
    *id = nf_sampler_sample(s, l, history, n_hist);
    return NF_OK;
}

nf_status nf_engine_routing(nf_engine *e, int32_t *ids, nf_error *err)
{
    if (!e->opts.trace_routing || !e->ops->routing)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "routing: the engine was created without trace_routing");
    return e->ops->routing(e->state, ids, err);
}

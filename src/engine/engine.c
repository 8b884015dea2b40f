/* Session bookkeeping over a backend: defaults, context checks, chunking; the session as a batch
 * of one sequence over the identity page table. */
#include "engine/engine.h"

#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "base/parallel.h"
#include "engine/sampler.h"

uint32_t nf_engine_pages_per_seq(const nf_engine_opts *o) { return (o->ctx + o->page_tokens - 1) / o->page_tokens; }

/* Defaults for the pool and the forward size; refuses a pool that cannot hold one full sequence. */
static nf_status fill_pool_opts(nf_engine_opts *o, int cuda, nf_error *err)
{
    if (!o->max_seqs) o->max_seqs = 1;
    if (!o->state_snaps) o->state_snaps = o->max_seqs;
    if (!o->page_tokens) o->page_tokens = NF_KV_PAGE_TOKENS;
    const uint64_t per_seq = nf_engine_pages_per_seq(o), all = per_seq * o->max_seqs;
    if (!o->kv_pages) {
        if (all > UINT32_MAX) return nf_error_set(err, NF_ERR_INVALID_ARG, "%u sequences of %u tokens: too many "
                                                  "KV pages", o->max_seqs, o->ctx);
        o->kv_pages = (uint32_t)all;
    }
    if (o->kv_pages < per_seq)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "a pool of %u KV pages of %u tokens cannot hold one sequence "
                            "of the %u-token context (%llu pages)", o->kv_pages, o->page_tokens, o->ctx,
                            (unsigned long long)per_seq);
    /* a GPU GEMM wants long chunks; on the CPU a MoE prompt of 256 tokens in one forward reads each expert's
     * weights once and gives its tile about 16 tokens (llama.cpp takes 512 a pass) */
    if (!o->chunk) o->chunk = cuda ? 2048 : 256;
    const uint64_t most = (uint64_t)o->ctx * o->max_seqs;
    if (o->chunk > most) o->chunk = (uint32_t)most;
    return NF_OK;
}

nf_status nf_engine_create(const nf_model *m, const nf_engine_opts *o, nf_engine **out, nf_error *err)
{
    *out = NULL;
    nf_engine_opts opt = o ? *o : (nf_engine_opts){0};
    const nf_backend_ops *ops = NULL;
    /* auto: the GPU when one is visible */
    if (opt.device && strcmp(opt.device, "auto") == 0) opt.device = nf_cuda_device_count(NULL, 0) > 0 ? "cuda" : "cpu";
    if (!opt.device || strcmp(opt.device, "cpu") == 0) ops = &nf_cpu_backend;
    else if (strcmp(opt.device, "cuda") == 0) ops = &nf_cuda_backend;
    else
        return nf_error_set(err, NF_ERR_INVALID_ARG, "unknown device '%s' (known: cpu, cuda, auto)", opt.device);
    if (!opt.ctx) opt.ctx = m->cfg.max_ctx && m->cfg.max_ctx < 4096 ? m->cfg.max_ctx : 4096;
    if (opt.threads <= 0) opt.threads = nf_cpu_count();
    nf_status st = fill_pool_opts(&opt, ops == &nf_cuda_backend, err);
    if (st) return st;
    const uint32_t np = nf_engine_pages_per_seq(&opt);
    nf_engine *e = calloc(1, sizeof *e);
    if (!e || !(e->logits = malloc((size_t)m->cfg.vocab * sizeof(float))) ||
        !(e->pages = malloc((size_t)np * sizeof(uint32_t)))) {
        if (e) free(e->logits);
        free(e);
        return nf_error_set(err, NF_ERR_NOMEM, "engine: out of memory");
    }
    for (uint32_t i = 0; i < np; i++) e->pages[i] = i;
    e->model = m;
    e->ops = ops;
    e->spec_snap_pos = UINT32_MAX;
    e->opts = opt;
    st = ops->create(m, &e->opts, &e->state, err);
    if (st) {
        free(e->pages);
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
    free(e->pages);
    free(e->logits);
    free(e->mtp_hidden);
    free(e);
}

void nf_engine_reset(nf_engine *e)
{
    e->n_past = 0;
    e->mtp_hidden_pos = 0;
    e->spec_snap_pos = UINT32_MAX;
}

nf_status nf_engine_prefill(nf_engine *e, const int32_t *tokens, size_t n, float *all_logits, nf_error *err)
{
    return nf_engine_prefill_hidden(e, tokens, n, all_logits, NULL, err);
}

nf_status nf_engine_prefill_hidden(nf_engine *e, const int32_t *tokens, size_t n, float *all_logits, float *hidden,
                                   nf_error *err)
{
    if (hidden && !e->ops->hidden)
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "the %s backend does not return hidden states", e->ops->name);
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
        const uint32_t seq_start[2] = {0, (uint32_t)T}, pos0 = e->n_past, slot0 = 0; /* the session: state slot 0 */
        const nf_batch b = {.n_tokens = (uint32_t)T, .n_seqs = 1, .tokens = tokens + i, .seq_start = seq_start,
                            .pos0 = &pos0, .pages = e->pages, .page_stride = nf_engine_pages_per_seq(&e->opts),
                            .state_slot = &slot0, .all_logits = all_logits != NULL};
        nf_status st = e->ops->forward(e->state, &b, lg, err);
        if (!st && hidden) st = e->ops->hidden(e->state, hidden + i * e->model->cfg.hidden, err);
        if (st) return st;
        e->n_past += (uint32_t)T;
        e->logits_stale = lg == NULL;
        e->logits_penalized = 0;
    }
    if (all_logits) memcpy(e->logits, all_logits + (n - 1) * V, V * sizeof(float));
    return NF_OK;
}

nf_status nf_engine_mtp(nf_engine *e, const int32_t *tokens, const float *hidden, size_t n, uint32_t pos0, int all,
                        float *logits, float *hidden_out, nf_error *err)
{
    if (!nf_engine_has_mtp(e))
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "MTP: %s", !e->model->mtp ? "this model has no MTP block (mtp.* weights)"
                            : !e->ops->mtp ? "the backend does not run the MTP block"
                                           : "the engine was created without its MTP block (nf_engine_opts.mtp)");
    if (pos0 > e->opts.ctx || n > e->opts.ctx - pos0)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "MTP: positions %u .. %zu pass the context of %u tokens", pos0,
                            pos0 + n, e->opts.ctx);
    const size_t V = e->model->cfg.vocab, H = e->model->cfg.hidden;
    for (size_t i = 0; i < n; i += e->opts.chunk) {
        const size_t T = n - i < e->opts.chunk ? n - i : e->opts.chunk;
        const uint32_t seq_start[2] = {0, (uint32_t)T}, p0 = pos0 + (uint32_t)i;
        const nf_batch b = {.n_tokens = (uint32_t)T, .n_seqs = 1, .tokens = tokens + i, .seq_start = seq_start,
                            .pos0 = &p0, .pages = e->pages, .page_stride = nf_engine_pages_per_seq(&e->opts),
                            .all_logits = all != 0};
        const size_t row = all ? i : 0; /* without all, each piece's last row overwrites the previous one's */
        nf_status st = e->ops->mtp(e->state, &b, hidden + i * H, logits + row * V,
                                   hidden_out ? hidden_out + row * H : NULL, err);
        if (st) return st;
    }
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

/* The sampler's penalties applied to the device's logits (a batch of one sequence). */
static nf_status penalize_on_device(nf_engine *e, nf_sampler *s, const int32_t *history, size_t n_hist, nf_error *err)
{
    nf_penalty_lists l = {0};
    nf_status st = nf_penalty_lists_add(&l, s, history, n_hist, err);
    if (!st && l.start[1]) st = e->ops->penalize(e->state, l.pen, l.start, l.ids, l.counts, err);
    if (!st && l.start[1]) e->logits_penalized = 1;
    nf_penalty_lists_free(&l);
    return st;
}

nf_status nf_engine_next(nf_engine *e, nf_sampler *s, const int32_t *history, size_t n_hist, int32_t *id, nf_error *err)
{
    if (e->logits_penalized && nf_sampler_penalty_max(s, n_hist))
        return nf_error_set(err, NF_ERR_INVALID_ARG, "engine: the last forward's logits are penalised already");
    const int device = e->logits_stale && e->ops->topk;
    const int penalize = device && e->ops->penalize;
    const uint32_t k = penalize ? nf_sampler_device_k_penalized(s) : nf_sampler_device_k(s, history, n_hist);
    if (device && k) {
        int32_t ids[NF_SAMPLER_DEVICE_MAX_K];
        float vals[NF_SAMPLER_DEVICE_MAX_K];
        nf_status st = penalize ? penalize_on_device(e, s, history, n_hist, err) : NF_OK;
        if (!st) st = e->ops->topk(e->state, k, ids, vals, err);
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

/* The page ids sequence i's forward touches: those of positions 0 .. pos0 + its tokens - 1. */
static nf_status check_pages(const nf_batch *b, uint32_t i, uint32_t end, const nf_engine_opts *o, nf_error *err)
{
    const uint32_t used = (end + o->page_tokens - 1) / o->page_tokens;
    if (used > b->page_stride)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "batch: sequence %u needs %u pages, the table stride is %u", i,
                            used, b->page_stride);
    for (uint32_t p = 0; p < used; p++)
        if (b->pages[(size_t)i * b->page_stride + p] >= o->kv_pages)
            return nf_error_set(err, NF_ERR_INVALID_ARG, "batch: sequence %u's page %u is %u, the pool has %u", i, p,
                                b->pages[(size_t)i * b->page_stride + p], o->kv_pages);
    return NF_OK;
}

nf_status nf_batch_check(const nf_batch *b, const nf_engine_opts *o, uint32_t vocab, nf_error *err)
{
    if (!b->n_seqs || b->n_seqs > o->max_seqs || !b->n_tokens || b->n_tokens > o->chunk)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "batch of %u tokens in %u sequences: the forward takes 1 .. %u "
                            "tokens in 1 .. %u sequences", b->n_tokens, b->n_seqs, o->chunk, o->max_seqs);
    if (b->seq_start[0] != 0 || b->seq_start[b->n_seqs] != b->n_tokens)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "batch: seq_start must run from 0 to %u", b->n_tokens);
    for (uint32_t i = 0; i < b->n_seqs; i++) {
        if (b->seq_start[i + 1] <= b->seq_start[i] || b->seq_start[i + 1] > b->n_tokens)
            return nf_error_set(err, NF_ERR_INVALID_ARG, "batch: sequence %u has no tokens or seq_start decreases", i);
        const uint64_t end = (uint64_t)b->pos0[i] + nf_batch_tokens_of(b, i);
        if (end > o->ctx)
            return nf_error_set(err, NF_ERR_INVALID_ARG, "batch: sequence %u ends at %llu, past the context of %u", i,
                                (unsigned long long)end, o->ctx);
        nf_status st = check_pages(b, i, (uint32_t)end, o, err);
        if (st) return st;
        if (b->logit_rows && (!b->logit_rows[i] || b->logit_rows[i] > nf_batch_tokens_of(b, i)))
            return nf_error_set(err, NF_ERR_INVALID_ARG, "batch: sequence %u asks for %u logits rows of its %u tokens",
                                i, b->logit_rows[i], nf_batch_tokens_of(b, i));
    }
    for (uint32_t t = 0; t < b->n_tokens; t++)
        if (b->tokens[t] < 0 || (uint32_t)b->tokens[t] >= vocab)
            return nf_error_set(err, NF_ERR_INVALID_ARG, "batch: token %u is id %d, outside the vocabulary of %u", t,
                                b->tokens[t], vocab);
    return NF_OK;
}

/* A Gated DeltaNet hybrid's state slots through the backend's forward, on either device (tests/engine/
 * test_hybrid.c: CPU; tests/cuda/test_hybrid_cuda.c: CUDA):
 *   - hyb_batched_vs_alone: three sequences fed in ragged pieces (prefill chunks and decode tokens
 *     mixed, one absent from a step, the last two steps decode-only) through slots 2, 0, 1 and
 *     interleaved page tables, and the same pieces run alone through slot 0 of an engine each: every
 *     piece's last-token logits of both, for the caller to compare;
 *   - hyb_slot_contract: a batch without slots, a slot out of range, two sequences in one slot, a
 *     sequence continuing at a position its slot does not hold: refused with the reason, and a refused
 *     batch leaves every slot as it was (continuing correctly afterwards gives the logits of an engine
 *     that never saw the refusal, to the bit: both ran the same forwards). */
#ifndef NF_TESTS_HYBRID_SLOTS_H
#define NF_TESTS_HYBRID_SLOTS_H

#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/sched.h"
#include "engine/generate.h"
#include "nf_test.h"

enum { HYB_S = 3, HYB_STEPS = 7, HYB_PT = 8, HYB_CTX = 64, HYB_NPS = HYB_CTX / HYB_PT, HYB_PIECES = HYB_S * HYB_STEPS };

static const uint32_t hyb_plan[HYB_S][HYB_STEPS] = {{7, 1, 1, 5, 1, 1, 1}, {1, 9, 0, 1, 2, 1, 1}, {13, 1, 3, 1, 1, 1, 1}};

static inline int32_t hyb_token_of(uint32_t seq, uint32_t pos, uint32_t V) { return (int32_t)((seq * 31 + pos * 17 + 5) % V); }

/* An engine on `device` with HYB_NPS pages per sequence (no_a8: f32 / bf16 activations into every
 * product; no_graphs: CUDA decode steps as stream launches). */
static inline nf_engine *hyb_engine(const nf_model *m, const char *device, uint32_t max_seqs, int no_a8, int no_graphs)
{
    nf_engine_opts o = {.device = device, .threads = 2, .ctx = HYB_CTX, .chunk = 32, .page_tokens = HYB_PT,
                        .max_seqs = max_seqs, .kv_pages = max_seqs * HYB_NPS, .no_a8 = no_a8, .no_graphs = no_graphs};
    nf_engine *e = NULL;
    nf_error err;
    if (nf_engine_create(m, &o, &e, &err)) CHECK_MSG(0, "%s engine: %s", device, err.msg);
    return e;
}

/* One sequence's piece alone: slot 0, pages 0 .. HYB_NPS-1 of its own engine. */
static inline nf_status hyb_alone(nf_engine *e, const int32_t *toks, uint32_t pos0, uint32_t n, float *logits,
                                  nf_error *err)
{
    const uint32_t ss[2] = {0, n}, slot = 0;
    const nf_batch b = {.n_tokens = n, .n_seqs = 1, .tokens = toks, .seq_start = ss, .pos0 = &pos0,
                        .pages = e->pages, .page_stride = HYB_NPS, .state_slot = &slot};
    return e->ops->forward(e->state, &b, logits, err);
}

/* hyb_plan through one engine of three slots (batched) and alone: batched and alone [HYB_PIECES][V]
 * in step order, piece k of step s being the k-th present sequence; who[p] its sequence, step[p] its
 * step. Returns the pieces, 0 on a failure (a failed CHECK). */
static inline size_t hyb_batched_vs_alone(const nf_model *m, const char *device, int no_a8, int no_graphs,
                                          float *batched, float *alone, uint32_t *who, uint32_t *step_of)
{
    const uint32_t V = m->cfg.vocab, slots_of[HYB_S] = {2, 0, 1};
    nf_engine *eb = hyb_engine(m, device, HYB_S, no_a8, no_graphs), *ea[HYB_S];
    for (uint32_t i = 0; i < HYB_S; i++) ea[i] = hyb_engine(m, device, 1, no_a8, no_graphs);
    uint32_t pages[HYB_S * HYB_NPS], pos[HYB_S] = {0};
    size_t np = 0;
    int ok = eb && ea[0] && ea[1] && ea[2];
    for (uint32_t i = 0; i < HYB_S; i++)
        for (uint32_t p = 0; p < HYB_NPS; p++) pages[i * HYB_NPS + p] = p * HYB_S + i; /* interleaved */
    for (uint32_t step = 0; ok && step < HYB_STEPS; step++) {
        int32_t toks[64];
        uint32_t ss[HYB_S + 1] = {0}, p0[HYB_S], sl[HYB_S], pg[HYB_S * HYB_NPS], n = 0, k = 0, w[HYB_S];
        for (uint32_t i = 0; i < HYB_S; i++) {
            if (!hyb_plan[i][step]) continue;
            for (uint32_t j = 0; j < hyb_plan[i][step]; j++) toks[n + j] = hyb_token_of(i, pos[i] + j, V);
            memcpy(pg + k * HYB_NPS, pages + i * HYB_NPS, sizeof(uint32_t) * HYB_NPS);
            p0[k] = pos[i], sl[k] = slots_of[i], w[k] = i;
            n += hyb_plan[i][step];
            ss[++k] = n;
        }
        const nf_batch b = {.n_tokens = n, .n_seqs = k, .tokens = toks, .seq_start = ss, .pos0 = p0, .pages = pg,
                            .page_stride = HYB_NPS, .state_slot = sl};
        nf_error err;
        ok = eb->ops->forward(eb->state, &b, batched + np * V, &err) == NF_OK;
        CHECK_MSG(ok, "%s batch step %u: %s", device, step, err.msg);
        for (uint32_t q = 0; ok && q < k; q++) {
            const uint32_t i = w[q];
            ok = hyb_alone(ea[i], toks + ss[q], pos[i], hyb_plan[i][step], alone + (np + q) * V, &err) == NF_OK;
            CHECK_MSG(ok, "%s sequence %u alone at step %u: %s", device, i, step, err.msg);
            who[np + q] = i, step_of[np + q] = step;
        }
        np += k;
        for (uint32_t i = 0; i < HYB_S; i++) pos[i] += hyb_plan[i][step];
    }
    nf_engine_free(eb);
    for (uint32_t i = 0; i < HYB_S; i++) nf_engine_free(ea[i]);
    return ok ? np : 0;
}

static inline void hyb_slot_contract(const nf_model *m, const char *device)
{
    const uint32_t V = m->cfg.vocab;
    nf_engine *e = hyb_engine(m, device, 2, 0, 0), *ref = hyb_engine(m, device, 2, 0, 0);
    float *l = malloc((size_t)2 * V * sizeof(float)), *lr = malloc((size_t)2 * V * sizeof(float));
    if (!e || !ref || !l || !lr) goto out;
    int32_t toks[8];
    for (int j = 0; j < 8; j++) toks[j] = hyb_token_of(1, (uint32_t)j, V);
    uint32_t ss[3] = {0, 4, 8}, p0[2] = {0, 0}, sl[2] = {0, 1}, pages[2 * HYB_NPS];
    for (uint32_t p = 0; p < 2 * HYB_NPS; p++) pages[p] = p;
    nf_batch b = {.n_tokens = 8, .n_seqs = 2, .tokens = toks, .seq_start = ss, .pos0 = p0, .pages = pages,
                  .page_stride = HYB_NPS, .state_slot = sl};
    nf_error err;
    CHECK(e->ops->forward(e->state, &b, l, &err) == NF_OK);
    CHECK(ref->ops->forward(ref->state, &b, lr, &err) == NF_OK);
    /* refusals: no slots, out of range, shared, a position the slot does not hold */
    b.state_slot = NULL;
    CHECK(e->ops->forward(e->state, &b, l, &err) == NF_ERR_INVALID_ARG);
    CHECK_CONTAINS(err.msg, "needs state slots");
    b.state_slot = sl;
    p0[0] = p0[1] = 4;
    sl[1] = 2;
    CHECK(e->ops->forward(e->state, &b, l, &err) == NF_ERR_INVALID_ARG);
    CHECK_CONTAINS(err.msg, "state slot 2 is not below max_seqs 2");
    sl[1] = 0;
    CHECK(e->ops->forward(e->state, &b, l, &err) == NF_ERR_INVALID_ARG);
    CHECK_CONTAINS(err.msg, "share state slot 0");
    sl[1] = 1;
    p0[1] = 5;
    CHECK(e->ops->forward(e->state, &b, l, &err) == NF_ERR_INVALID_ARG);
    CHECK_CONTAINS(err.msg, "its state slot 1 holds 4 positions");
    /* the refused batches changed nothing: continuing matches the engine that never saw them */
    p0[1] = 4;
    CHECK(e->ops->forward(e->state, &b, l, &err) == NF_OK);
    CHECK(ref->ops->forward(ref->state, &b, lr, &err) == NF_OK);
    CHECK_MSG(memcmp(l, lr, (size_t)2 * V * sizeof(float)) == 0, "%s: a refused batch changed a state slot", device);
    /* slot_copy (speculation's rollback, the prefix cache's snapshots): slots below 2 max_seqs + state_snaps
     * (2 by default); slot 0 to its spare and slot 1 to a snapshot, a step, both back: the same step again
     * gives the same bits; the copy carries the position */
    CHECK(e->ops->slot_copy(e->state, 6, 0, &err) == NF_ERR_INVALID_ARG);
    CHECK_CONTAINS(err.msg, "not below 2 max_seqs + state_snaps");
    CHECK(e->ops->slot_copy(e->state, 0, 6, &err) == NF_ERR_INVALID_ARG);
    CHECK(e->ops->slot_copy(e->state, 2, 0, &err) == NF_OK && e->ops->slot_copy(e->state, 5, 1, &err) == NF_OK);
    p0[0] = p0[1] = 8;
    CHECK(e->ops->forward(e->state, &b, l, &err) == NF_OK);
    CHECK(e->ops->slot_copy(e->state, 0, 2, &err) == NF_OK && e->ops->slot_copy(e->state, 1, 5, &err) == NF_OK);
    CHECK(e->ops->forward(e->state, &b, lr, &err) == NF_OK);
    CHECK_MSG(memcmp(l, lr, (size_t)2 * V * sizeof(float)) == 0, "%s: a step after restored slots differs", device);
    CHECK(e->ops->slot_copy(e->state, 1, 5, &err) == NF_OK);
    p0[0] = p0[1] = 12;
    CHECK(e->ops->forward(e->state, &b, l, &err) == NF_ERR_INVALID_ARG);
    CHECK_CONTAINS(err.msg, "its state slot 1 holds 8 positions");
    /* the session: truncation keeps nothing of a hybrid */
    CHECK(nf_engine_prefill(e, toks, 6, NULL, &err) == NF_OK);
    nf_engine_truncate(e, 3);
    CHECK_EQ_INT(e->n_past, 0);
out:
    free(l);
    free(lr);
    nf_engine_free(e);
    nf_engine_free(ref);
}

typedef struct hyb_pc_out {
    int32_t tok[6];
    float lp[6][2];
    int32_t top[6][2];
    int n;
} hyb_pc_out;

static inline void hyb_pc_event(void *ctx, const nf_seq_event *ev)
{
    hyb_pc_out *o = ctx;
    if (ev->token < 0 || o->n >= 6) return;
    o->tok[o->n] = ev->token;
    for (uint32_t j = 0; j < 2; j++) {
        o->lp[o->n][j] = j < ev->n_top ? ev->top_lp[j] : 0;
        o->top[o->n][j] = j < ev->n_top ? ev->top_ids[j] : -1;
    }
    o->n++;
}

/* The prefix cache through the scheduler: a 28-token prompt (pages of 8: its piece cut at the deepest
 * page that leaves the backend's shortest piece, 24 on CUDA and 16 on the CPU, where the state is
 * snapshot), 6 tokens generated, then the same prompt again: it restores the snapshot, feeds the rest in
 * a forward of the same shape and must give the first run's tokens and log-probabilities to the bit. */
static inline void hyb_prefix_cache(const nf_model *m, const char *name, const char *device)
{
    nf_engine *e = hyb_engine(m, device, 2, 0, 0);
    nf_sched *s = NULL;
    nf_error err;
    memset(&err, 0, sizeof err);
    if (!e || nf_sched_create_engine(e, NULL, &s, &err)) {
        CHECK_MSG(0, "%s: prefix cache scheduler: %s", name, err.msg);
        nf_engine_free(e);
        return;
    }
    int32_t toks[28];
    for (int j = 0; j < 28; j++) toks[j] = hyb_token_of(3, (uint32_t)j, m->cfg.vocab);
    hyb_pc_out out[2];
    memset(out, 0, sizeof out);
    int ok = 1;
    for (int r = 0; ok && r < 2; r++) {
        nf_seq_params p = {.sampling = nf_sampler_defaults(), .max_new = 6, .emit = hyb_pc_event, .ctx = &out[r],
                           .logprobs = 1, .top_logprobs = 2};
        uint64_t id;
        ok = nf_sched_add(s, toks, 28, &p, &id, &err) == NF_OK;
        for (int step = 0; ok && step < 100 && !nf_sched_idle(s); step++) {
            nf_sched_step_info info;
            ok = nf_sched_step(s, &info, &err) == NF_OK;
        }
    }
    CHECK_MSG(ok, "%s: prefix cache run: %s", name, err.msg);
    const nf_kvpool_stats ks = nf_kvpool_get_stats(nf_sched_pool(s));
    const int same = out[0].n == 6 && out[1].n == 6 && !memcmp(&out[0], &out[1], sizeof out[0]);
    printf("%s %s: the same prompt again through the prefix cache: %llu pages and %llu state snapshots restored (%llu "
           "taken), tokens and log-probabilities the first run's to the bit: %s\n", name, device,
           (unsigned long long)ks.hits_pages, (unsigned long long)ks.hits_snaps, (unsigned long long)ks.snaps_taken,
           same ? "yes" : "NO");
    /* the deepest page that leaves the backend's shortest piece to feed: 3 on CUDA, 2 on the CPU (10) */
    const uint32_t pmin = e->ops->prefill_min > 1 ? e->ops->prefill_min : 1, want = (28 - pmin) / HYB_PT;
    CHECK_MSG(ks.hits_snaps == 1 && ks.hits_pages == want, "%s: %llu snapshots, %llu pages restored (want 1, %u)",
              name, (unsigned long long)ks.hits_snaps, (unsigned long long)ks.hits_pages, want);
    CHECK_MSG(same, "%s: the prompt restored from the prefix cache differs from its first run", name);
    nf_sched_free(s);
    nf_engine_free(e);
}

#endif

/* Speculation in the scheduler on the GPU engine (label cuda; exits 77 = skipped without a GPU, 1 when
 * the fixtures are not readable: set NF_TEST_DATA to the tree's tests/): the CUDA decoder's
 * nf_batch.logit_rows (the final norm's rows of each sequence's last logit_rows[i] tokens gathered,
 * one LM head product over them) and the scheduler's verifications on top of it.
 *
 *   - rows: four sequences (state slots 0 .. 3 on the hybrids) prefilled in one forward, then five
 *     steps whose logit_rows mix verification-like rows (1 + drafts), prefill chunks and decode tokens
 *     asking for one row, and sequences asking for every token: gathered rows of 9 of 27 tokens (the
 *     head over fewer rows than the layers: GEMV against GEMM), of 9 of 10, a step where the rows are
 *     every token (the all_logits layout), a decode-only step whose rows are one a sequence (the
 *     captured graph), and a step of 1 + 3 rows beside decode tokens. Each step runs on an engine with
 *     logit_rows and on a twin engine (the same forwards before) with all_logits: the rows against
 *     the twin's rows of the same tokens, and against each sequence run alone through the session
 *     (its pieces with all_logits); after each forward the device's last-token logits (ops->logits)
 *     equal each sequence's last returned row to the bit and its top-1 (ops->topk) that row's argmax;
 *   - greedy: five greedy sequences (max_seqs 4, prompts of 20 .. 57 tokens prefilled in chunks of
 *     32 beside verifications; ngram:3, ngram:5, ngram:2 on repetitive prompts, one with an oracle
 *     drafter whose drafts are right and wrong by design so that every acceptance count 0 .. 4 occurs,
 *     one without speculation) through one scheduler with speculation and through one without: the
 *     same tokens, drafts accepted and rejected, the pool full at the end. On hybrids the rejected
 *     drafts roll the state slot back (slot_copy to its spare and back, on the device).
 *   - mtp:K (K 3, 1, 2, 3) where the model has an MTP block: run like ngram (the CUDA backend runs the
 *     block: batched over the sequences' newly final positions, then chained; random weights reject
 *     almost every draft, so the rollback runs at almost every verification); a backend that does not
 *     run the block would be refused with the reason by nf_sched_check_spec (reported).
 *
 * Fixtures: synth's tiny qwen3_moe (bf16; q4q6 with int8 activations), the tiny transformers
 * checkpoints qwen3_moe (bf16) and the hybrids qwen3_next and qwen3_5_moe_text (bf16; both carry an
 * MTP block), synth's tiny-hybrid (q4q6).
 *
 * Bounds. Rows against the twin's and against alone: the GPU's routes change with T (the head at R
 * rows and at T, the sparse-MoE routes, the attention's split count), so the rows are the same
 * computation re-rounded: tests/cuda/test_batch_cuda.c's argument and bounds (bf16 median 1.5e-2,
 * every row 1e-1; int8 activations 6.6e-2, 0.5), test_hybrid_cuda.c's for the hybrids (2.5e-2, 1e-1;
 * tiny-hybrid q4q6 0.10, 0.5); from the first piece whose experts differ from alone (a near-tie of
 * two experts' router logits tipped, both right; trace_routing) a sequence is compared with its twin
 * only. The all_logits-layout step computes what the twin computes: the same bits. Greedy: a
 * verification computes its rows in another batch than the plain decode steps do, so at the first
 * difference of a sequence one of two things must hold. (a) A near-tie, as in test_hybrid_cuda.c's
 * greedy comparison: both runs' two best tokens there (token events with top_logprobs 2) are the same
 * pair in swapped order, and the two gaps together -- exactly how far the pair's logit difference
 * moved between the runs -- are at most twice the largest such move seen where the runs chose alike
 * with the same best pair, or twice the rows check's largest logit difference against alone (a pair
 * moves by at most twice one logit's move), whichever is larger. (b) A position before it routed to
 * other experts in one run than in the other (every forward's trace, keyed by the position's token
 * prefix). Either is reported, not failed; and at least half of all tokens must agree before the first
 * differences: a row of another position or sequence, or a state not rolled back, differs by order one
 * within a few tokens.
 *
 * `--cpu` runs the same checks on the CPU engine (ctest test_sched_spec_cuda_logic, with or without
 * CUDA): the test's own logic, where the rows hardly depend on the batch (within 1e-6), and where
 * greedy with speculation must give every token and every top-2 logit of greedy without it, to the
 * bit (the scheduler's prompt pieces, sched.h piece_min), and again for two hybrids with the chunked
 * Gated DeltaNet form (gdn_chunk 16: prompt cuts on its grid, sched.h piece_align; cuts anywhere fail
 * 3 checks). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cuda/cuda_backend.h"
#include "convert/synth.h"
#include "engine/engine.h"
#include "engine/sched.h"
#include "nf_test.h"
#include "common/engine_fixture.h"
#include "common/cuda_fixture.h"
#include "common/routing.h"

enum { PT = 16, CTX = 128, NPS = CTX / PT, MAXS = 4, CHUNK = 32, RCHUNK = 80 };

typedef struct bounds {
    double median, each;
} bounds;

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* ---- rows: logit_rows against all_logits and against alone ------------------------------------ */

enum { RSTEPS = 5, RMAX = 64 };

/* Tokens and rows of each sequence at each step after the prefill (tokens, rows). */
static const uint32_t rplan[RSTEPS][MAXS][2] = {
    {{4, 4}, {17, 1}, {1, 1}, {5, 3}}, /* R 9 of T 27: the head by GEMV, the layers by GEMM */
    {{3, 2}, {1, 1}, {4, 4}, {2, 2}},  /* R 9 of T 10 */
    {{2, 2}, {3, 3}, {1, 1}, {2, 2}},  /* every token: the all_logits layout */
    {{1, 1}, {1, 1}, {1, 1}, {1, 1}},  /* decode-only, one row a sequence: the graph */
    {{4, 4}, {1, 1}, {1, 1}, {1, 1}},  /* a verification of 1 + 3 beside decode tokens */
};
static const uint32_t rprompt[MAXS] = {20, 30, 10, 12};

static int32_t token_of(uint32_t seq, uint32_t pos, uint32_t V) { return (int32_t)((seq * 31 + pos * 17 + 5) % V); }

/* "cuda"; `--cpu` runs the same checks on the CPU engine (the test's own logic, where every
 * comparison is exact: the CPU's rows do not depend on the batch) */
static const char *device = "cuda";
/* nf_engine_opts.gdn_chunk of every engine (the CPU's chunked Gated DeltaNet form; 0: recurrent) */
static uint32_t gdn_chunk;

static nf_engine *engine(const nf_model *m, uint32_t max_seqs, uint32_t chunk)
{
    nf_engine_opts o = {.mtp = 1, .device = device, .threads = 2, .ctx = CTX, .chunk = chunk, .page_tokens = PT, .max_seqs = max_seqs,
                        .kv_pages = max_seqs * NPS, .kv_bf16 = 1, .trace_routing = 1, .gdn_chunk = gdn_chunk};
    nf_engine *e = NULL;
    nf_error err;
    CHECK_MSG(nf_engine_create(m, &o, &e, &err) == NF_OK, "%s engine: %s", device, err.msg);
    return e;
}

typedef struct rbatch {
    int32_t tokens[RCHUNK];
    uint32_t start[MAXS + 1], pos0[MAXS], pages[MAXS * NPS], slots[MAXS], rows[MAXS];
} rbatch;

/* Step `step` (-1: the prompts) of rplan into rb; len[] the sequences' positions before it. */
static nf_batch rbatch_of(rbatch *rb, int step, const uint32_t *len, uint32_t V, int hybrid, int with_rows, int all)
{
    uint32_t t = 0;
    for (uint32_t i = 0; i < MAXS; i++) {
        const uint32_t n = step < 0 ? rprompt[i] : rplan[step][i][0];
        rb->start[i] = t;
        rb->pos0[i] = len[i];
        for (uint32_t j = 0; j < n; j++) rb->tokens[t + j] = token_of(i, len[i] + j, V);
        for (uint32_t p = 0; p < NPS; p++) rb->pages[i * NPS + p] = i * NPS + p;
        rb->slots[i] = i;
        rb->rows[i] = step < 0 ? 1 : rplan[step][i][1];
        t += n;
    }
    rb->start[MAXS] = t;
    return (nf_batch){.n_tokens = t, .n_seqs = MAXS, .tokens = rb->tokens, .seq_start = rb->start, .pos0 = rb->pos0,
                      .pages = rb->pages, .page_stride = NPS, .state_slot = hybrid ? rb->slots : NULL,
                      .all_logits = all, .logit_rows = with_rows ? rb->rows : NULL};
}

/* Returns the largest |logit difference| between two batchings of the same positions (rows against
 * alone, routing alike), the greedy check's tie scale. As in test_batch_cuda.c, where roundings tip a
 * near-tie of two experts' router logits the two runs pick different experts, both right: from the
 * first piece whose expert sets differ from alone a sequence's rows are compared with its twin's only. */
static double check_rows(const nf_model *m, const char *name, bounds bd)
{
    const uint32_t V = m->cfg.vocab, L = m->cfg.layers, k = m->cfg.top_k;
    const int hybrid = m->cfg.n_linear > 0;
    nf_engine *x = engine(m, MAXS, RCHUNK), *y = engine(m, MAXS, RCHUNK), *alone[MAXS] = {NULL};
    for (int i = 0; i < MAXS; i++) alone[i] = engine(m, 1, RCHUNK);
    float *lx = malloc((size_t)RCHUNK * V * 4), *ly = malloc((size_t)RCHUNK * V * 4), *la = malloc((size_t)RCHUNK * V * 4);
    float *dev = malloc((size_t)MAXS * V * 4), *vals = malloc(MAXS * 2 * 4);
    int32_t *tx = malloc((size_t)L * RCHUNK * k * 4 + 4), *ta = malloc((size_t)L * RCHUNK * k * 4 + 4);
    int32_t ids[MAXS * 2];
    double ev_twin[RMAX], ev_alone[RMAX], maxabs = 0;
    int n_twin = 0, n_alone = 0, flips = 0, diverged[MAXS] = {0};
    int ok = x && y && lx && ly && la && dev && vals && tx && ta && k;
    for (int i = 0; i < MAXS; i++) ok = ok && alone[i];
    uint32_t len[MAXS] = {0};
    nf_error err;
    memset(&err, 0, sizeof err);
    rbatch rb;
    for (int step = -1; ok && step < RSTEPS; step++) { /* -1: the prompts, no logit_rows */
        const nf_batch bx = rbatch_of(&rb, step, len, V, hybrid, step >= 0, 0);
        ok = x->ops->forward(x->state, &bx, lx, &err) == NF_OK && nf_engine_routing(x, tx, &err) == NF_OK;
        /* the device's last-token rows after the forward: the sequences' last returned rows */
        const int on_dev = x->ops->logits && x->ops->topk;
        ok = ok && (!on_dev || (x->ops->logits(x->state, dev, &err) == NF_OK &&
                                x->ops->topk(x->state, 2, ids, vals, &err) == NF_OK));
        for (uint32_t i = 0, r = 0; ok && on_dev && i < MAXS; i++) {
            r += rb.rows[i];
            const float *last = lx + (size_t)(r - 1) * V;
            CHECK_MSG(!memcmp(dev + (size_t)i * V, last, (size_t)V * 4), "%s: step %d: the device's last-token logits "
                      "of sequence %u are not its last returned row", name, step, i);
            CHECK_MSG(ids[i * 2] == (int32_t)fx_argmax(last, V), "%s: step %d: sequence %u's top-1 on the device is %d, "
                      "its last row's argmax %zu", name, step, i, ids[i * 2], fx_argmax(last, V));
        }
        const nf_batch by = rbatch_of(&rb, step, len, V, hybrid, 0, 1);
        ok = ok && y->ops->forward(y->state, &by, ly, &err) == NF_OK;
        int same = 1;
        for (uint32_t i = 0, r = 0; ok && i < MAXS; i++) {
            const uint32_t n = by.seq_start[i + 1] - by.seq_start[i], rows = rb.rows[i], t0 = by.seq_start[i];
            ok = nf_engine_prefill(alone[i], rb.tokens + t0, n, la, &err) == NF_OK &&
                 nf_engine_routing(alone[i], ta, &err) == NF_OK;
            if (ok && !diverged[i] && !fx_same_routing(tx, by.n_tokens, t0, ta, n, L, k)) diverged[i] = 1, flips++;
            for (uint32_t j = 0; ok && j < rows; j++, r++) {
                const float *g = lx + (size_t)r * V, *t = ly + (size_t)(t0 + n - rows + j) * V;
                const float *a = la + (size_t)(n - rows + j) * V;
                same = same && !memcmp(g, t, (size_t)V * 4);
                if (n_twin < RMAX) ev_twin[n_twin++] = fx_rel_l2(g, t, V);
                if (diverged[i]) continue;
                if (n_alone < RMAX) ev_alone[n_alone++] = fx_rel_l2(g, a, V);
                for (uint32_t v = 0; v < V; v++) maxabs = fmax(maxabs, fabs((double)g[v] - a[v]));
            }
            len[i] += n;
        }
        if (ok && step == 2) /* every token: the twin's computation */
            CHECK_MSG(same, "%s: logit_rows of every token differ from all_logits", name);
    }
    CHECK_MSG(ok, "%s: rows: %s", name, err.msg);
    const char *what[2] = {"logit_rows vs all_logits of the same batch", "logit_rows vs each sequence alone"};
    double *e[2] = {ev_twin, ev_alone};
    const int n[2] = {n_twin, n_alone}, least[2] = {40, 8};
    for (int c = 0; ok && c < 2; c++) {
        double s[RMAX], worst = 0;
        memcpy(s, e[c], n[c] * sizeof *s);
        qsort(s, n[c], sizeof *s, cmp_double);
        for (int i = 0; i < n[c]; i++) worst = fmax(worst, s[i]);
        const double med = n[c] ? s[n[c] / 2] : 0;
        printf("  %s: %s, %d rows: median rel-L2 %.3g (bound %.3g), worst %.3g (bound %.3g)\n", name, what[c], n[c],
               med, bd.median, worst, bd.each);
        CHECK_MSG(n[c] >= least[c], "%s: %s: only %d rows compared", name, what[c], n[c]);
        CHECK_MSG(med <= bd.median && worst <= bd.each, "%s: %s: median %.3g, worst %.3g", name, what[c], med, worst);
    }
    printf("  %s: %d of %d sequences' routing diverged from alone; the largest logit difference against alone before "
           "that: %.3g\n", name, flips, MAXS, maxabs);
    for (int i = 0; i < MAXS; i++) nf_engine_free(alone[i]);
    nf_engine_free(x), nf_engine_free(y);
    free(lx), free(ly), free(la), free(dev), free(vals), free(tx), free(ta);
    return maxabs;
}

/* ---- greedy: the scheduler with speculation against without ---------------------------------- */

enum { N = 5, MAXP = 60, GEN = 32 };

typedef struct scase {
    int32_t prompt[MAXP];
    size_t n;
    uint32_t spec_k, vocab;
    unsigned calls;     /* the oracle drafter's */
    const int32_t *ref; /* the run without speculation's tokens (the oracle's drafts) */
} scase;

enum { MAPN = 1 << 13 };

typedef struct run_out {
    uint64_t key[MAPN], sig[MAPN]; /* prefix hash -> expert sets of its last position (0: empty slot) */
    int32_t toks[N][GEN];
    int32_t top[N][GEN][2]; /* each token event's two best ids and their log-probabilities */
    float lp[N][GEN][2];
    size_t n[N];
    uint64_t id[N];
    long drafted, accepted, verified, mixed;
} run_out;

static uint64_t lcg(uint64_t *r)
{
    *r = *r * 6364136223846793005ULL + 1442695040888963407ULL;
    return *r >> 33;
}

/* Repetitive prompts (a 5-token pattern: prompt lookup drafts at once) and random ones; case 2 is long
 * (prefilled in pieces of the 32-token chunk beside the others' verifications); case 4 waits for a
 * place (max_seqs 4) and does not speculate. */
static void make_cases(scase *c, uint32_t vocab, int mtp)
{
    uint64_t r = 11;
    static const uint32_t k_ngram[N] = {3, 4, 5, 2, 0}, k_mtp[N] = {3, 1, 2, 3, 0};
    for (int i = 0; i < N; i++) {
        c[i].n = i == 2 ? 57 : i % 2 ? 20 : 27;
        int32_t pat[5];
        for (int j = 0; j < 5; j++) pat[j] = (int32_t)(lcg(&r) % vocab);
        for (size_t j = 0; j < c[i].n; j++) c[i].prompt[j] = i == 1 ? (int32_t)(lcg(&r) % vocab) : pat[j % 5];
        c[i].spec_k = mtp ? k_mtp[i] : k_ngram[i];
        c[i].vocab = vocab;
        c[i].calls = 0;
        c[i].ref = NULL;
    }
}

/* Case 1's drafts without MTP: the tokens of the run without speculation, the first a of them right and
 * the rest wrong, a = 0, 1, .. k in turn. */
static uint32_t oracle_draft(void *ctx, const int32_t *toks, size_t n, uint32_t k, int32_t *draft)
{
    scase *c = ctx;
    (void)toks;
    const size_t g = n - c->n;
    const uint32_t a = c->calls++ % (k + 1);
    uint32_t d = 0;
    for (; d < k && g + d < GEN; d++) draft[d] = d < a ? c->ref[g + d] : (int32_t)(((uint32_t)c->ref[g + d] + 1) % c->vocab);
    return d;
}

/* ---- the experts each position chose, by its token prefix ----
 * Each forward's routing trace (trace_routing), recorded under the FNV-1a hash of the position's whole
 * token prefix, so that two runs batching the same positions differently can be compared position by
 * position: the scheduler's forward goes through traced_forward (a copy of the backend's table in
 * place of the engine's), which keeps each sequence's tokens by the first page of its table (a page a
 * sequence holds alone from position 0 in these runs: distinct prompts, no preemption). */
static int32_t tracer_hist[MAXS * NPS][CTX];
static struct tracer {
    const nf_backend_ops *real;
    nf_backend_ops ops;
    uint32_t L, k, kv_pages;
    int32_t *route;         /* [L][CHUNK][k] */
    int32_t (*hist)[CTX];   /* [kv_pages][CTX]: the tokens of the sequence whose table starts at that page */
    run_out *o;
    int overflow;
} tracer;

static uint64_t fnv(const int32_t *t, size_t n, uint64_t h)
{
    for (size_t i = 0; i < n; i++)
        for (int b = 0; b < 4; b++) h = (h ^ (uint8_t)((uint32_t)t[i] >> (8 * b))) * 1099511628211ULL;
    return h;
}
#define FNV0 1469598103934665603ULL

static uint64_t *map_slot(run_out *o, uint64_t key)
{
    for (uint32_t i = (uint32_t)(key % MAPN), n = 0; n < MAPN; i = (i + 1) % MAPN, n++)
        if (o->key[i] == key || !o->key[i]) return &o->key[i];
    return NULL;
}

static nf_status traced_forward(void *state, const nf_batch *b, float *logits, nf_error *err)
{
    struct tracer *tr = &tracer;
    nf_status rc = tr->real->forward(state, b, logits, err);
    if (!rc && tr->k) rc = tr->real->routing(state, tr->route, err);
    for (uint32_t i = 0; !rc && i < b->n_seqs; i++) {
        const uint32_t page = b->pages[(size_t)i * b->page_stride];
        int32_t *h = tr->hist[page < tr->kv_pages ? page : 0];
        for (uint32_t t = b->seq_start[i]; t < b->seq_start[i + 1]; t++) {
            const uint32_t p = b->pos0[i] + t - b->seq_start[i];
            h[p] = b->tokens[t];
            uint64_t sig = FNV0;
            for (uint32_t l = 0; l < tr->L; l++) { /* the layer's set, sorted */
                int32_t e[16];
                const uint32_t k = tr->k < 16 ? tr->k : 16;
                memcpy(e, tr->route + ((size_t)l * b->n_tokens + t) * tr->k, k * sizeof *e);
                for (uint32_t x = 1; x < k; x++)
                    for (uint32_t y = x; y > 0 && e[y - 1] > e[y]; y--) {
                        const int32_t v = e[y];
                        e[y] = e[y - 1], e[y - 1] = v;
                    }
                sig = fnv(e, k, sig);
            }
            const uint64_t key = fnv(h, p + 1, FNV0) | 1; /* never 0 (the empty slot) */
            uint64_t *slot = map_slot(tr->o, key);
            if (!slot) tr->overflow = 1;
            else if (!*slot) *slot = key, tr->o->sig[slot - tr->o->key] = sig; /* the first computation kept */
        }
    }
    return rc;
}

/* Whether the expert sets of some position of tokens[0 .. n) differ between the two runs. */
static int routing_differs(run_out *a, run_out *b, const int32_t *tokens, size_t n)
{
    for (size_t p = 0; p < n; p++) {
        const uint64_t key = fnv(tokens, p + 1, FNV0) | 1;
        const uint64_t *x = map_slot(a, key), *y = map_slot(b, key);
        if (x && y && *x == key && *y == key && a->sig[x - a->key] != b->sig[y - b->key]) return 1;
    }
    return 0;
}

typedef struct emit_ctx {
    run_out *o;
} emit_ctx;

static void on_event(void *ctx, const nf_seq_event *ev)
{
    run_out *o = ((emit_ctx *)ctx)->o;
    if (ev->token < 0) return;
    for (int i = 0; i < N; i++) {
        if (o->id[i] != ev->id) continue;
        const size_t g = o->n[i]++;
        if (g >= GEN) return;
        o->toks[i][g] = ev->token;
        for (uint32_t j = 0; j < 2; j++) {
            o->top[i][g][j] = j < ev->n_top ? ev->top_ids[j] : -1;
            o->lp[i][g][j] = j < ev->n_top ? ev->top_lp[j] : -INFINITY;
        }
    }
}

/* The cases through one scheduler on a fresh CUDA engine, with their speculation (spec) or without. */
static void run_sched(const nf_model *m, scase *c, int spec, int mtp, const char *what, run_out *o)
{
    memset(o, 0, sizeof *o);
    nf_engine *e = engine(m, MAXS, CHUNK);
    nf_sched *s = NULL;
    nf_error err;
    if (e) { /* the forward through traced_forward */
        tracer.real = e->ops, tracer.ops = *e->ops, tracer.ops.forward = traced_forward, e->ops = &tracer.ops;
        tracer.L = m->cfg.layers, tracer.k = m->cfg.top_k, tracer.kv_pages = e->opts.kv_pages, tracer.o = o;
        tracer.overflow = 0;
    }
    if (!e || !tracer.route || !tracer.hist || nf_sched_create_engine(e, NULL, &s, &err)) {
        CHECK_MSG(0, "%s: %s", what, e ? err.msg : "no engine");
        nf_engine_free(e);
        return;
    }
    emit_ctx ec = {o};
    for (int i = 0; i < N; i++) {
        nf_sampler_params sp = nf_sampler_defaults();
        sp.temp = 0;
        nf_seq_params p = {.sampling = sp, .max_new = GEN, .spec_k = spec ? c[i].spec_k : 0, .spec_mtp = mtp,
                           .emit = on_event, .ctx = &ec, .logprobs = 1, .top_logprobs = 2};
        if (spec && i == 1 && !mtp) p.draft = oracle_draft, p.draft_ctx = &c[i];
        if (nf_sched_add(s, c[i].prompt, c[i].n, &p, &o->id[i], &err)) CHECK_MSG(0, "%s: %s", what, err.msg);
    }
    const uint32_t pages = nf_kvpool_pages(nf_sched_pool(s));
    for (int step = 0; step < 10000 && !nf_sched_idle(s); step++) {
        nf_sched_step_info info;
        if (nf_sched_step(s, &info, &err)) {
            CHECK_MSG(0, "%s: %s", what, err.msg);
            break;
        }
        o->drafted += info.n_drafted, o->accepted += info.n_accepted, o->verified += info.n_verified;
        o->mixed += info.n_verified && info.n_decode < info.n_seqs;
    }
    for (int i = 0; i < N; i++)
        CHECK_MSG(o->n[i] == GEN && nf_sched_end(s, o->id[i]) == NF_SEQ_LENGTH, "%s: sequence %d: %zu tokens, %s", what,
                  i, o->n[i], nf_seq_end_name(nf_sched_end(s, o->id[i])));
    CHECK_MSG(nf_kvpool_available(nf_sched_pool(s)) == pages, "%s: %u of %u pages back", what,
              nf_kvpool_available(nf_sched_pool(s)), pages);
    CHECK_MSG(!tracer.overflow, "%s: the routing table is full", what);
    nf_sched_free(s);
    nf_engine_free(e);
}

/* Sequence i's tokens with speculation (got) against without (ref): the same, or at the first
 * difference a near-tie of the two best tokens or a position before it whose experts differ between the
 * runs (file header); returns the tokens compared. */
static size_t greedy_vs(const char *what, const scase *c, int i, run_out *got, run_out *ref, double tie)
{
    size_t same = 0;
    while (same < GEN && got->toks[i][same] == ref->toks[i][same]) same++;
    if (same == GEN) return GEN;
    const int32_t *a = ref->top[i][same], *b = got->top[i][same];
    const double moved = ((double)ref->lp[i][same][0] - ref->lp[i][same][1]) +
                         ((double)got->lp[i][same][0] - got->lp[i][same][1]);
    const int swapped = a[0] == b[1] && a[1] == b[0];
    int32_t toks[MAXP + GEN];
    memcpy(toks, c[i].prompt, c[i].n * sizeof *toks);
    memcpy(toks + c[i].n, ref->toks[i], same * sizeof *toks);
    const int flip = routing_differs(ref, got, toks, c[i].n + same);
    printf("    %s: sequence %d: first difference at token %zu (%d, want %d): best two %d, %d without speculation, "
           "%d, %d with; the pair moved by %.3g (tie bound %.3g); experts %s before it\n", what, i, same,
           got->toks[i][same], ref->toks[i][same], a[0], a[1], b[0], b[1], moved, tie,
           flip ? "differ at a position" : "alike");
    CHECK_MSG((swapped && moved <= tie) || flip, "%s: sequence %d differs from the run without speculation at token %zu "
              "without a near-tie", what, i, same);
    return same;
}

static void check_greedy(const nf_model *m, const char *name, int mtp, double tie)
{
    static scase c[N];
    static run_out ref, got;
    char what[160];
    make_cases(c, m->cfg.vocab, mtp);
    snprintf(what, sizeof what, "%s %s", name, mtp ? "mtp" : "ngram");
    if (mtp) { /* the backend may not run the block: then the scheduler refuses, naming why */
        nf_engine *e = engine(m, MAXS, CHUNK);
        nf_sched *s = NULL;
        nf_error err;
        memset(&err, 0, sizeof err);
        nf_seq_params p = {.sampling = nf_sampler_defaults(), .spec_k = 1, .spec_mtp = 1};
        nf_status st = e && !nf_sched_create_engine(e, NULL, &s, &err) ? nf_sched_check_spec(s, &p, &err) : NF_ERR_INTERNAL;
        nf_sched_free(s);
        nf_engine_free(e);
        if (st) {
            printf("  %s: refused on this backend: %s\n", what, err.msg);
            CHECK_MSG(st == NF_ERR_UNSUPPORTED, "%s: refused otherwise than as unsupported: %s", what, err.msg);
            return;
        }
    }
    tracer.route = malloc((size_t)m->cfg.layers * CHUNK * (m->cfg.top_k + 1) * sizeof *tracer.route);
    tracer.hist = tracer_hist;
    run_sched(m, c, 0, 0, what, &ref);
    for (int i = 0; i < N; i++) c[i].ref = ref.toks[i];
    run_sched(m, c, 1, mtp, what, &got);
    free(tracer.route);
    tracer.route = NULL;
    /* how far the best pair's gap moved between the runs at the tokens both chose alike (the same pair) */
    double moves = 0;
    for (int i = 0; i < N; i++)
        for (size_t g = 0; g < GEN && got.toks[i][g] == ref.toks[i][g]; g++)
            if (got.top[i][g][0] == ref.top[i][g][0] && got.top[i][g][1] == ref.top[i][g][1])
                moves = fmax(moves, fabs(((double)got.lp[i][g][0] - got.lp[i][g][1]) -
                                         ((double)ref.lp[i][g][0] - ref.lp[i][g][1])));
    if (2 * moves > tie) tie = 2 * moves;
    printf("  %s: the best pair's gap moved by up to %.3g between the runs where both chose alike; tie bound %.3g\n",
           what, moves, tie);
    size_t compared = 0;
    for (int i = 0; i < N; i++) compared += greedy_vs(what, c, i, &got, &ref, tie);
    printf("  %s: %zu of %d tokens equal before any near-tie; %ld verifications, %ld of %ld drafts accepted, %ld "
           "verifications beside other sequences' prefill or plain decode\n", what, compared, N * GEN, got.verified,
           got.accepted, got.drafted, got.mixed);
    /* a wrong row or a state not rolled back shows within a few tokens (and moves the experts after it):
     * most tokens must agree before any excused difference */
    CHECK_MSG(compared >= N * GEN / 2, "%s: only %zu of %d tokens before the first differences", what, compared, N * GEN);
    /* the CPU engine: speculation leaves every sequence's bits as they were (sched.h piece_min: a
     * prompt piece takes the tile whatever else the step holds; a verification decoding's kernels) */
    if (!strcmp(device, "cpu"))
        CHECK_MSG(compared == (size_t)N * GEN && moves == 0, "%s: on the cpu, %zu of %d tokens equal and the best pair's gap "
                  "moved by %.3g: speculation must not change a bit", what, compared, N * GEN, moves);
    CHECK_MSG(got.drafted > got.accepted, "%s: no draft was rejected", what);
    if (!mtp) CHECK_MSG(got.accepted > 0, "%s: no draft was accepted", what);
    CHECK_MSG(got.mixed > 0, "%s: no verification beside other sequences' tokens", what);
    CHECK_MSG(!ref.drafted, "%s: the run without speculation drafted", what);
}

/* ---- the fixtures ------------------------------------------------------------------------------ */

static void run_model(const char *path, const char *name, bounds bd)
{
    nf_model *m;
    nf_error e;
    if (nf_model_load(path, &m, &e)) {
        CHECK_MSG(0, "%s: %s", name, e.msg);
        return;
    }
    printf("%s (%s):\n", name, m->cfg.n_linear ? "hybrid" : "attention only");
    const double maxabs = check_rows(m, name, bd);
    const double tie = 2 * maxabs; /* file header: check_greedy raises it to what the runs show */
    check_greedy(m, name, 0, tie);
    if (m->mtp) check_greedy(m, name, 1, tie);
    nf_model_free(m);
}

static void synth_model(const char *tmp, const char *geometry, const char *recipe, bounds bd)
{
    char path[1200], name[96];
    snprintf(path, sizeof path, "%s/%s-%s.nf", tmp, geometry, recipe);
    snprintf(name, sizeof name, "synth %s %s", geometry, recipe);
    const nf_synth_opts o = {.geometry = geometry, .recipe = recipe, .seed = 3, .quiet = 1};
    nf_synth_stats st;
    nf_error e;
    if (nf_synth_write(path, &o, &st, &e) != NF_OK) {
        CHECK_MSG(0, "%s: %s", name, e.msg);
        return;
    }
    run_model(path, name, bd);
    unlink(path);
}

static void fixture_model(const char *tmp, const char *model, bounds bd)
{
    char dir[1024], out[1200], name[96];
    snprintf(dir, sizeof dir, "%s/fixtures/models/%s", fx_data_dir(), model);
    snprintf(out, sizeof out, "%s/%s-bf16.nf", tmp, model);
    snprintf(name, sizeof name, "%s bf16", model);
    if (!fx_convert(dir, "bf16", out)) return;
    run_model(out, name, bd);
    remove(out);
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--cpu")) device = "cpu";
    const int ready = strcmp(device, "cpu") ? fx_cuda_ready("qwen3_next") : -1;
    if (ready >= 0) return ready;
    char tmp[] = "/tmp/nf_sched_spec_cuda_XXXXXX";
    if (!mkdtemp(tmp)) return 1;
    const bounds plain = {1.5e-2, 1e-1}, a8 = {6.6e-2, 0.5}, hybrid = {2.5e-2, 1e-1}, hybrid_a8 = {0.10, 0.5};
    synth_model(tmp, "tiny", "bf16", plain);
    synth_model(tmp, "tiny", "q4q6", a8);
    fixture_model(tmp, "qwen3_moe", plain);
    fixture_model(tmp, "qwen3_next", hybrid);
    fixture_model(tmp, "qwen3_5_moe_text", hybrid);
    synth_model(tmp, "tiny-hybrid", "q4q6", hybrid_a8);
    if (!strcmp(device, "cpu")) { /* the chunked GDN form: prompts cut on its grid (sched.h piece_align) */
        gdn_chunk = 16;
        fixture_model(tmp, "qwen3_next", hybrid);
        synth_model(tmp, "tiny-hybrid", "q4q6", hybrid_a8);
    }
    rmdir(tmp);
    return nf_test_report();
}

/* The CUDA batched forward (nf_backend_ops.forward over an nf_batch, backend/cuda/decoder) against
 * each sequence run alone through the single-sequence session on the GPU (label cuda; exits 77 =
 * skipped without a GPU), on synth's tiny qwen3_moe geometry (2 layers, 4 q heads on 2 kv heads of
 * 64, 8 experts, top 2), bf16 and q4q6 weights:
 *   - mix: four sequences whose pieces (prefill chunks of 17 .. 100 tokens that take the tile
 *     attention, short chunks of 2 .. 3 and decode tokens that take the split one) come in ragged,
 *     changing combinations, one sequence absent from the first step, over page tables that are a
 *     shuffled permutation of the pool (pages of 16 positions, interleaved between sequences); the
 *     last two steps are decode-only (S = 4: the first captures the graph, the second replays it);
 *   - shared prefix: a 40-token prefix (pages 0, 1 full, page 2 holding positions 32 .. 39); two
 *     sequences share its full pages and take copy_page'd copies of its partial page, then append
 *     different tokens; a third continues in the original partial page afterwards;
 *   - graph replay = stream: the whole mix once more on an engine with no_graphs: every step's
 *     logits bit-identical (the decode-only steps run their graph on one side, stream launches on the
 *     other; everything else is the same code);
 *   - eight sequences prefilled one per forward, then three decode-only steps of all eight: the
 *     grouped split attention (forward.cu kGqaMinTokens = 8) and its captured graph;
 *   - a malformed batch (a page id past the pool) and copy_page out of range are refused.
 *
 * Tolerances (rel-L2 of a sequence's last-token logits, batch against alone). Unlike the CPU, the
 * GPU's routes change with the batch's T: the dense products take the CUDA-core GEMV at T <= 16 and
 * the tensor-core GEMM above, the sparse-MoE operator its decode, small-token or prefill route, the
 * split attention a split count set by how many tokens it takes. Prefill chunks attend with the same
 * tile kernel over tiles that start where they start alone (bit-identical attention). So what a
 * sequence computes in a batch differs from alone by (a) f32 summation order (~1e-6), which (b) can
 * tip a bf16 rounding of a product's input or output at the about R = 19 rounding sites of a 2-layer
 * model (tests/cuda/test_engine_cuda.c's count): each tipped rounding moves its vector by at most
 * u = 2^-9 in relative L2; all of them re-rounded independently give sqrt(R) u = 8.5e-3 -> the
 * median row must be within 1.5e-2 and every row within 1e-1 (test_engine_cuda's bounds for a whole
 * re-rounding, the cancellation gain included). (c) q4q6 with int8 activations (the default): the
 * GEMV quantises its input at T <= 16 and the GEMM does not, so a decode token alone and the same
 * token in a batch of T > 16 differ by the int8 quantisation of each quantised input, sqrt(32) / 254
 * = 2.2e-2 per input, A = 9 such inputs (four a layer and the LM head's): median sqrt(A) 2.2e-2 =
 * 6.6e-2, every row 0.5 (test_engine_cuda's int8 bounds). A wrong page slot, a wrong position or a
 * token attending to another sequence gives errors of order one.
 *
 * Routing: where the roundings tip a near-tie of two experts' router logits the two runs pick
 * different experts, both right; from the first piece whose expert sets differ (both engines trace
 * routing) a sequence is only reported. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cuda/cuda_backend.h"
#include "convert/synth.h"
#include "engine/engine.h"
#include "nf_test.h"
#include "common/engine_fixture.h"

enum { PT = 16, CTX = 256, NPS = CTX / PT, MAXS = 4, POOL = 72, CHUNK = 256, STEPS = 7, NONE = 0x7fffffff };
#define FXB_TOKENS CHUNK
#define FXB_SEQS MAXS
#define FXB_STRIDE NPS
#include "common/batch_builder.h"
#include "common/routing.h"

/* Tokens of each sequence at each step (0: absent); steps 5 and 6 are decode-only. */
static const uint32_t plan[MAXS][STEPS] = {
    {40, 1, 1, 1, 20, 1, 1},
    {1, 1, 70, 1, 1, 1, 1},
    {100, 3, 1, 1, 1, 1, 1},
    {0, 2, 1, 17, 1, 1, 1},
};

typedef struct bounds {
    double median, each;
} bounds;

static int32_t token_of(uint32_t seq, uint32_t pos, uint32_t V) { return (int32_t)((seq * 31 + pos * 17 + 5) % V); }

static nf_engine *engine(const nf_model *m, uint32_t max_seqs, int no_graphs)
{
    nf_engine_opts o = {.device = "cuda", .ctx = CTX, .chunk = CHUNK, .page_tokens = PT, .max_seqs = max_seqs,
                        .kv_pages = max_seqs > 1 ? POOL : 0, .no_graphs = no_graphs, .kv_bf16 = 1,
                        .trace_routing = 1};
    nf_engine *e = NULL;
    nf_error err;
    CHECK_MSG(nf_engine_create(m, &o, &e, &err) == NF_OK, "%s", err.msg);
    return e;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The comparisons of one run: rel-L2 of every compared row (sequences not yet diverged in routing). */
typedef struct tally {
    double err[64];
    int n, flips;
} tally;

static void tally_check(const tally *t, const char *what, bounds b)
{
    double s[64], worst = 0;
    memcpy(s, t->err, t->n * sizeof(double));
    qsort(s, t->n, sizeof(double), cmp_double);
    for (int i = 0; i < t->n; i++) worst = fmax(worst, s[i]);
    const double med = t->n ? s[t->n / 2] : 0;
    printf("  %s: %d rows against alone: median rel-L2 %.3g (bound %.3g), worst %.3g (bound %.3g); %d routing "
           "divergences\n", what, t->n, med, b.median, worst, b.each, t->flips);
    CHECK_MSG(t->n >= 8, "%s: only %d rows compared", what, t->n);
    CHECK_MSG(med <= b.median, "%s: median rel-L2 %.3g over %.3g", what, med, b.median);
    CHECK_MSG(worst <= b.each, "%s: worst rel-L2 %.3g over %.3g", what, worst, b.each);
}

/* The mix on be (against fresh alone engines); all_steps[STEPS][MAXS][V] keeps every step's logits
 * (for the graph = stream comparison) when given. */
static void mix(const nf_model *m, nf_engine *be, const char *what, bounds bd, float *all_steps)
{
    const uint32_t V = m->cfg.vocab, L = m->cfg.layers, k = m->cfg.top_k;
    nf_engine *alone[MAXS];
    for (int i = 0; i < MAXS; i++) alone[i] = engine(m, 1, 0);
    float *logits = malloc((size_t)MAXS * V * sizeof(float));
    int32_t *tr = malloc((size_t)L * CHUNK * k * sizeof(int32_t)), *rb = malloc((size_t)L * CHUNK * k * sizeof(int32_t));
    uint32_t perm[POOL], len[MAXS] = {0};
    int diverged[MAXS] = {0};
    tally t = {.n = 0};
    shuffled_pages(perm, POOL, 777);
    nf_error err;
    for (int step = 0; step < STEPS && be && logits && tr && rb; step++) {
        batch_buf bb = {.n_seqs = 0};
        uint32_t who[MAXS];
        int32_t ids[MAXS][CHUNK];
        for (uint32_t s = 0; s < MAXS; s++) {
            if (!plan[s][step]) continue;
            for (uint32_t j = 0; j < plan[s][step]; j++) ids[s][j] = token_of(s, len[s] + j, V);
            who[bb.n_seqs] = s;
            batch_add(&bb, perm + s * NPS, len[s], ids[s], plan[s][step]);
            len[s] += plan[s][step];
        }
        const nf_batch b = batch_of(&bb, 0);
        if (be->ops->forward(be->state, &b, logits, &err) || nf_engine_routing(be, tr, &err)) {
            CHECK_MSG(0, "%s: step %d: %s", what, step, err.msg);
            break;
        }
        if (all_steps) memcpy(all_steps + (size_t)step * MAXS * V, logits, (size_t)bb.n_seqs * V * sizeof(float));
        for (uint32_t i = 0; i < bb.n_seqs; i++) {
            const uint32_t s = who[i], n = plan[s][step];
            if (!alone[s] || nf_engine_prefill(alone[s], ids[s], n, NULL, &err) || nf_engine_routing(alone[s], rb, &err)) {
                CHECK_MSG(0, "%s: alone: %s", what, err.msg);
                continue;
            }
            if (!diverged[s] && !fx_same_routing(tr, b.n_tokens, bb.seq_start[i], rb, n, L, k)) diverged[s] = 1, t.flips++;
            if (diverged[s] || t.n >= 64) continue;
            t.err[t.n++] = fx_rel_l2(logits + (size_t)i * V, alone[s]->logits, V);
        }
    }
    tally_check(&t, what, bd);
    for (int i = 0; i < MAXS; i++) nf_engine_free(alone[i]);
    free(logits), free(tr), free(rb);
}

static void shared_prefix(const nf_model *m, const char *what, bounds bd)
{
    enum { P = 40 }; /* pages: 2 full, the third holds positions 32 .. 39 */
    const uint32_t V = m->cfg.vocab;
    nf_engine *be = engine(m, MAXS, 0), *alone[3] = {NULL, NULL, NULL};
    uint32_t pz[NPS], px[NPS], py[NPS];
    for (uint32_t p = 0; p < NPS; p++) pz[p] = px[p] = py[p] = NONE;
    /* X and Y share pages 5 and 17 and take copies (30, 31) of Z's partial page 9 */
    const uint32_t z[] = {5, 17, 9, 42, 43}, x[] = {5, 17, 30, 40, 44}, y[] = {5, 17, 31, 41, 45};
    memcpy(pz, z, sizeof z), memcpy(px, x, sizeof x), memcpy(py, y, sizeof y);
    const uint32_t *tables[3] = {px, py, pz};
    int32_t pre[P], ids[3][40];
    for (int t = 0; t < P; t++) pre[t] = token_of(7, (uint32_t)t, V);
    for (int s = 0; s < 3; s++)
        for (int t = 0; t < 40; t++) ids[s][t] = token_of((uint32_t)s, (uint32_t)t, V);
    float *logits = malloc((size_t)MAXS * V * sizeof(float));
    nf_error err;
    batch_buf bb = {.n_seqs = 0};
    batch_add(&bb, pz, 0, pre, P);
    nf_batch b = batch_of(&bb, 0);
    int ok = be && logits && be->ops->forward(be->state, &b, logits, &err) == NF_OK;
    CHECK_MSG(ok, "%s: prefix: %s", what, be ? err.msg : "no engine");
    for (int s = 0; ok && s < 3; s++) {
        alone[s] = engine(m, 1, 0);
        CHECK(alone[s] && nf_engine_prefill(alone[s], pre, P, NULL, &err) == NF_OK);
        /* the same tile attention and the same T: the same bits */
        CHECK_MSG(alone[s] && memcmp(logits, alone[s]->logits, V * sizeof(float)) == 0, "%s: the prefix differs", what);
    }
    ok = ok && be->ops->copy_page(be->state, 30, 9, &err) == NF_OK && be->ops->copy_page(be->state, 31, 9, &err) == NF_OK;
    /* X and Y append (Z waits, so their appends come before Z writes page 9), then all three; a
     * chunk of 20 takes the tile attention over the copied page */
    static const uint32_t steps[4][3] = {{20, 1, 0}, {1, 3, 2}, {1, 1, 1}, {1, 1, 20}};
    uint32_t len[3] = {0};
    tally t = {.n = 0};
    for (int st = 0; ok && st < 4; st++) {
        bb = (batch_buf){.n_seqs = 0};
        uint32_t who[3], nw = 0;
        for (uint32_t s = 0; s < 3; s++)
            if (steps[st][s]) {
                batch_add(&bb, tables[s], P + len[s], ids[s] + len[s], steps[st][s]);
                len[s] += steps[st][s];
                who[nw++] = s;
            }
        b = batch_of(&bb, 0);
        if (be->ops->forward(be->state, &b, logits, &err)) {
            CHECK_MSG(0, "%s: shared: %s", what, err.msg);
            break;
        }
        for (uint32_t i = 0; i < nw; i++) {
            const uint32_t s = who[i], n = steps[st][s];
            CHECK(alone[s] && nf_engine_prefill(alone[s], ids[s] + len[s] - n, n, NULL, &err) == NF_OK);
            if (alone[s] && t.n < 64) t.err[t.n++] = fx_rel_l2(logits + (size_t)i * V, alone[s]->logits, V);
        }
    }
    CHECK_MSG(ok, "%s: shared prefix: %s", what, err.msg);
    char name[160];
    snprintf(name, sizeof name, "%s, shared prefix + copy_page", what);
    tally_check(&t, name, bd);
    /* refusals */
    if (be) {
        uint32_t bad[NPS];
        memcpy(bad, px, sizeof bad);
        bad[1] = POOL;
        bb = (batch_buf){.n_seqs = 0};
        batch_add(&bb, bad, 20, ids[0], 1);
        b = batch_of(&bb, 0);
        CHECK(be->ops->forward(be->state, &b, logits, &err) == NF_ERR_INVALID_ARG);
        CHECK(be->ops->copy_page(be->state, POOL, 0, &err) == NF_ERR_INVALID_ARG);
    }
    for (int s = 0; s < 3; s++) nf_engine_free(alone[s]);
    nf_engine_free(be);
    free(logits);
}

/* Eight sequences prefilled one per forward (20 .. 27 tokens, the tile attention), then three
 * decode-only steps of all eight (the grouped split attention, kGqaMinTokens = 8, and its graph),
 * each against the sequence alone. */
static void decode8(const nf_model *m, const char *what, bounds bd)
{
    enum { N = 8, STEPS8 = 3 };
    const uint32_t V = m->cfg.vocab, L = m->cfg.layers, k = m->cfg.top_k;
    nf_engine_opts o = {.device = "cuda", .ctx = CTX, .chunk = CHUNK, .page_tokens = PT, .max_seqs = N,
                        .kv_pages = N * NPS, .kv_bf16 = 1, .trace_routing = 1};
    nf_engine *be = NULL, *alone[N] = {NULL};
    nf_error err;
    CHECK_MSG(nf_engine_create(m, &o, &be, &err) == NF_OK, "%s", err.msg);
    float *logits = malloc((size_t)N * V * sizeof(float));
    int32_t *tr = malloc((size_t)L * CHUNK * k * sizeof(int32_t)), *rb = malloc((size_t)L * CHUNK * k * sizeof(int32_t));
    uint32_t pages[N * NPS], start[N + 1], pos0[N], len[N];
    int32_t ids[CHUNK];
    for (uint32_t i = 0; i < N * NPS; i++) pages[i] = (i * 37 + 11) % (N * NPS); /* 37 is coprime to 128 */
    tally t = {.n = 0};
    int diverged[N] = {0}, ok = be && logits && tr && rb;
    for (uint32_t i = 0; ok && i < N; i++) { /* prefill, one sequence a forward */
        len[i] = 20 + i;
        for (uint32_t j = 0; j < len[i]; j++) ids[j] = token_of(10 + i, j, V);
        const uint32_t st[2] = {0, len[i]}, p0 = 0;
        const nf_batch b = {.n_tokens = len[i], .n_seqs = 1, .tokens = ids, .seq_start = st, .pos0 = &p0,
                            .pages = pages + i * NPS, .page_stride = NPS};
        alone[i] = engine(m, 1, 0);
        ok = alone[i] && be->ops->forward(be->state, &b, logits, &err) == NF_OK &&
             nf_engine_prefill(alone[i], ids, len[i], NULL, &err) == NF_OK;
    }
    for (int step = 0; ok && step < STEPS8; step++) {
        for (uint32_t i = 0; i < N; i++) start[i] = i, pos0[i] = len[i], ids[i] = token_of(10 + i, len[i], V);
        start[N] = N;
        const nf_batch b = {.n_tokens = N, .n_seqs = N, .tokens = ids, .seq_start = start, .pos0 = pos0, .pages = pages,
                            .page_stride = NPS};
        ok = be->ops->forward(be->state, &b, logits, &err) == NF_OK && nf_engine_routing(be, tr, &err) == NF_OK;
        for (uint32_t i = 0; ok && i < N; i++) {
            ok = nf_engine_prefill(alone[i], ids + i, 1, NULL, &err) == NF_OK && nf_engine_routing(alone[i], rb, &err) == NF_OK;
            if (ok && !diverged[i] && !fx_same_routing(tr, N, i, rb, 1, L, k)) diverged[i] = 1, t.flips++;
            if (ok && !diverged[i] && t.n < 64) t.err[t.n++] = fx_rel_l2(logits + (size_t)i * V, alone[i]->logits, V);
            len[i]++;
        }
    }
    CHECK_MSG(ok, "%s: decode8: %s", what, err.msg);
    char name[160];
    snprintf(name, sizeof name, "%s, 8 sequences decoding together", what);
    tally_check(&t, name, bd);
    for (uint32_t i = 0; i < N; i++) nf_engine_free(alone[i]);
    nf_engine_free(be);
    free(logits), free(tr), free(rb);
}

static void run_model(const char *tmp, const char *recipe)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/batch-tiny-%s.nf", tmp, recipe);
    const nf_synth_opts o = {.geometry = "tiny", .recipe = recipe, .seed = 3, .quiet = 1};
    nf_synth_stats st;
    nf_error e;
    nf_model *m;
    if (nf_synth_write(path, &o, &st, &e) != NF_OK || nf_model_load(path, &m, &e) != NF_OK) {
        CHECK_MSG(0, "%s: %s", recipe, e.msg);
        return;
    }
    /* bf16 weights: no int8 inputs anywhere, bounds (b); q4q6: int8 inputs at T <= 16, bounds (c) */
    const int a8 = strcmp(recipe, "bf16") != 0;
    const bounds bd = a8 ? (bounds){6.6e-2, 0.5} : (bounds){1.5e-2, 1e-1};
    const uint32_t V = m->cfg.vocab;
    float *g = calloc((size_t)STEPS * MAXS * V, sizeof(float)), *n = calloc((size_t)STEPS * MAXS * V, sizeof(float));
    char what[96];
    nf_engine *be = engine(m, MAXS, 0);
    snprintf(what, sizeof what, "%s, mix (graphs)", recipe);
    if (be && g) mix(m, be, what, bd, g);
    nf_engine_free(be);
    be = engine(m, MAXS, 1);
    snprintf(what, sizeof what, "%s, mix (no graphs)", recipe);
    if (be && n) mix(m, be, what, bd, n);
    nf_engine_free(be);
    const int same = g && n && memcmp(g, n, (size_t)STEPS * MAXS * V * sizeof(float)) == 0;
    printf("  %s: graph replay = stream launches over the mix's 7 steps: %s\n", recipe, same ? "same bits" : "DIFFERENT");
    CHECK_MSG(same, "%s: graph replay differs from stream launches", recipe);
    free(g), free(n);
    snprintf(what, sizeof what, "%s", recipe);
    shared_prefix(m, what, bd);
    decode8(m, what, bd);
    nf_model_free(m);
    unlink(path);
}

int main(void)
{
    char why[160];
    if (nf_cuda_device_count(why, sizeof why) < 1) {
        printf("test_batch_cuda: skipped (%s)\n", why);
        return NF_TEST_SKIP;
    }
    char tmp[] = "/tmp/nf_test_batch_cuda_XXXXXX";
    if (!mkdtemp(tmp)) return 1;
    run_model(tmp, "bf16");
    run_model(tmp, "q4q6");
    rmdir(tmp);
    return nf_test_report();
}

/* The CPU batched forward (nf_backend_ops.forward over an nf_batch) against each sequence run
 * alone through the single-sequence session, on small random artifacts (tests/model/synth.h) of
 * every architecture, bf16 and q8_0 weights, f32 and bf16 KV pages:
 *   - mix: four sequences whose pieces (prefill chunks of 2 .. 13 tokens and decode tokens) come
 *     in ragged, changing combinations, one sequence absent from the first step, over page tables
 *     that are a shuffled permutation of the pool (non-contiguous, interleaved between sequences);
 *     each piece's last-token logits (and with all_logits, every token's logits), and the MoE
 *     routing trace rows, equal those of the same piece run alone;
 *   - shared prefix: a prefix run once; two sequences share its full pages read-only and take
 *     copy_page'd copies of its partial page, then append different tokens; a third continues in
 *     the original partial page afterwards (so the others' appends must not have touched it). Each
 *     equals the prefix + its continuation run alone. Page table entries past a sequence's end
 *     are garbage, which the forward must not read;
 *   - errors: malformed batches, a pool too small for one sequence, copy_page out of range, and
 *     dynamic NTK rope with two sequences are refused with the reason.
 *
 *   - expert parallelism: the mix again with the batched engine's MoE blocks over 2 and 3 simulated
 *     ranks (nf_engine_opts.ep_sim_ranks), each sequence still equal to itself alone;
 *
 * Why bit-identical (memcmp), not a tolerance: the session is itself a batch of one, so the same
 * code runs both sides, and nothing a sequence computes reads another sequence's rows. Per-token
 * ops (embedding, norms, rope at the token's own position, SwiGLU, routing, the combine) are
 * row-wise. Attention items are (block of <= 8 tokens of one sequence, head), each output summed
 * over positions in order, identical for any block split (attn_avx2.c). The products are the one
 * place where batching could leak: the fast gemm picks the codec's matvec kernel for a single
 * token and the dequantized-tile kernel for more, and the two sum in different orders; so every
 * product is cut into one segment per sequence and the kernel follows the segment's length
 * (backend/cpu/cpu.h), the tile's per-output order being independent of how many tokens share
 * it. A decode token batched with others thus gets matvec exactly as alone, and an MoE expert's
 * group gets the kernel each sequence's own share of the group would get alone. The threads split
 * row blocks, never one output's sum (1 vs 3 threads: bit-identical, test_engine). */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <unistd.h>

#include "engine/engine.h"
#include "model/synth.h"
#include "nf_test.h"

enum { PT = 4, CTX = 40, NPS = CTX / PT, MAXS = 4, POOL = 48, CHUNK = 64, STEPS = 6, NONE = 0x7fffffff };
#define FXB_TOKENS CHUNK
#define FXB_SEQS MAXS
#define FXB_STRIDE NPS
#include "common/batch_builder.h"

/* Tokens of each sequence at each step (0: absent). */
static const uint32_t plan[MAXS][STEPS] = {
    {7, 1, 1, 1, 5, 1},
    {1, 1, 9, 1, 1, 1},
    {13, 3, 1, 1, 1, 2},
    {0, 2, 1, 8, 1, 1},
};

static int32_t token_of(uint32_t seq, uint32_t pos) { return (int32_t)((seq * 31 + pos * 17 + 5) % SY_V); }

/* The batched engines' MoE blocks run over this many simulated expert-parallel ranks (0: none); the
 * single-sequence engines they are compared with never do. */
static uint32_t ep_ranks;

static nf_engine *engine(const nf_model *m, uint32_t max_seqs, int kv_bf16, int trace)
{
    nf_engine_opts o = {.threads = 2, .ctx = CTX, .chunk = CHUNK, .page_tokens = PT, .kv_bf16 = kv_bf16,
                        .max_seqs = max_seqs, .kv_pages = max_seqs > 1 ? POOL : 0, .trace_routing = trace,
                        .ep_sim_ranks = max_seqs > 1 ? ep_ranks : 0};
    nf_engine *e = NULL;
    nf_error err;
    CHECK_MSG(nf_engine_create(m, &o, &e, &err) == NF_OK, "%s", err.msg);
    return e;
}

/* Sequence i of the last batch against its piece run alone on `alone` (advancing it): logits
 * (batch: [T][V] or [S][V]) and routing rows. Returns the mismatches. */
static int compare_alone(nf_engine *alone, const batch_buf *bb, uint32_t i, const float *logits, int all_logits,
                         const int32_t *trace, const nf_model *m, float *buf, int32_t *rbuf)
{
    const size_t V = SY_V, L = m->cfg.layers, k = m->cfg.top_k, T = bb->seq_start[bb->n_seqs];
    const uint32_t t0 = bb->seq_start[i], n = bb->seq_start[i + 1] - t0;
    nf_error err;
    if (nf_engine_prefill(alone, bb->tokens + t0, n, all_logits ? buf : NULL, &err)) {
        CHECK_MSG(0, "alone: %s", err.msg);
        return 1;
    }
    int bad = all_logits ? memcmp(logits + t0 * V, buf, n * V * sizeof(float)) != 0
                         : memcmp(logits + i * V, alone->logits, V * sizeof(float)) != 0;
    if (trace && nf_engine_routing(alone, rbuf, &err) == NF_OK)
        for (size_t l = 0; l < L; l++)
            bad += memcmp(trace + (l * T + t0) * k, rbuf + l * n * k, n * k * sizeof(int32_t)) != 0;
    return bad;
}

static void mix(const nf_model *m, const char *name, int kv_bf16, int all_logits)
{
    const int trace = m->cfg.experts > 0;
    const size_t V = SY_V, L = m->cfg.layers, k = m->cfg.top_k;
    nf_engine *be = engine(m, MAXS, kv_bf16, trace), *alone[MAXS];
    for (int i = 0; i < MAXS; i++) alone[i] = engine(m, 1, kv_bf16, trace);
    float *logits = malloc(CHUNK * V * sizeof(float)), *buf = malloc(CHUNK * V * sizeof(float));
    int32_t *tr = malloc(L * CHUNK * (k ? k : 1) * sizeof(int32_t)), *rb = malloc(L * CHUNK * (k ? k : 1) * sizeof(int32_t));
    uint32_t perm[POOL], len[MAXS] = {0};
    shuffled_pages(perm, POOL, 12345);
    nf_error err;
    for (int step = 0; step < STEPS && be; step++) {
        batch_buf bb = {.n_seqs = 0};
        uint32_t who[MAXS];
        for (uint32_t s = 0; s < MAXS; s++) {
            if (!plan[s][step]) continue;
            int32_t ids[CHUNK];
            for (uint32_t t = 0; t < plan[s][step]; t++) ids[t] = token_of(s, len[s] + t);
            who[bb.n_seqs] = s;
            batch_add(&bb, perm + s * NPS, len[s], ids, plan[s][step]);
            len[s] += plan[s][step];
        }
        const nf_batch b = batch_of(&bb, all_logits);
        if (be->ops->forward(be->state, &b, logits, &err) || (trace && nf_engine_routing(be, tr, &err))) {
            CHECK_MSG(0, "%s: step %d: %s", name, step, err.msg);
            break;
        }
        for (uint32_t i = 0; i < bb.n_seqs; i++) {
            int bad = compare_alone(alone[who[i]], &bb, i, logits, all_logits, trace ? tr : NULL, m, buf, rb);
            CHECK_MSG(bad == 0, "%s (kv bf16 %d, all_logits %d): step %d, sequence %u differs from alone", name,
                      kv_bf16, all_logits, step, who[i]);
        }
    }
    for (int i = 0; i < MAXS; i++) nf_engine_free(alone[i]);
    nf_engine_free(be);
    free(logits), free(buf), free(tr), free(rb);
}

/* One forward of the batch on be; 0 on failure (a failed CHECK). */
static int forward(nf_engine *be, const batch_buf *bb, float *logits, const char *what)
{
    nf_error err;
    const nf_batch b = batch_of(bb, 0);
    nf_status st = be->ops->forward(be->state, &b, logits, &err);
    CHECK_MSG(st == NF_OK, "%s: %s", what, err.msg);
    return st == NF_OK;
}

static void shared_prefix(const nf_model *m, const char *name, int kv_bf16)
{
    enum { P = 10 }; /* 2 full pages and a partial one holding positions 8, 9 */
    const size_t V = SY_V;
    nf_engine *be = engine(m, MAXS, kv_bf16, 0), *alone[3];
    /* X and Y share pages 5 and 17 and take copies (30, 31) of the partial page 9; Z owns 5, 17, 9 */
    uint32_t pz[NPS] = {5, 17, 9, 42, 43, NONE, NONE, NONE, NONE, NONE};
    uint32_t px[NPS] = {5, 17, 30, 40, 44, NONE, NONE, NONE, NONE, NONE};
    uint32_t py[NPS] = {5, 17, 31, 41, 45, NONE, NONE, NONE, NONE, NONE};
    const uint32_t *tables[3] = {px, py, pz};
    int32_t pre[P], ids[3][8];
    for (int t = 0; t < P; t++) pre[t] = token_of(7, (uint32_t)t);
    for (int s = 0; s < 3; s++)
        for (int t = 0; t < 8; t++) ids[s][t] = token_of((uint32_t)s, (uint32_t)t);
    float logits[MAXS * SY_V];
    nf_error err;
    batch_buf bb = {.n_seqs = 0};
    batch_add(&bb, pz, 0, pre, P);
    int ok = be && forward(be, &bb, logits, "prefix");
    for (int s = 0; s < 3; s++) {
        alone[s] = engine(m, 1, kv_bf16, 0);
        CHECK(alone[s] && nf_engine_prefill(alone[s], pre, P, NULL, &err) == NF_OK);
        CHECK_MSG(!ok || memcmp(logits, alone[s]->logits, V * sizeof(float)) == 0, "%s: prefix differs", name);
    }
    ok = ok && be->ops->copy_page(be->state, 30, 9, &err) == NF_OK && be->ops->copy_page(be->state, 31, 9, &err) == NF_OK;
    /* steps: X and Y (Z waits, so X's and Y's appends happen before Z writes page 9), then all three */
    static const uint32_t steps[3][3] = {{3, 1, 0}, {1, 4, 2}, {1, 1, 1}};
    uint32_t len[3] = {0};
    for (int st = 0; ok && st < 3; st++) {
        bb = (batch_buf){.n_seqs = 0};
        uint32_t who[3], nw = 0;
        for (uint32_t s = 0; s < 3; s++)
            if (steps[st][s]) {
                batch_add(&bb, tables[s], P + len[s], ids[s] + len[s], steps[st][s]);
                len[s] += steps[st][s];
                who[nw++] = s;
            }
        if (!forward(be, &bb, logits, "shared")) break;
        for (uint32_t i = 0; i < nw; i++) {
            const uint32_t s = who[i], n = steps[st][s];
            CHECK(nf_engine_prefill(alone[s], ids[s] + len[s] - n, n, NULL, &err) == NF_OK);
            CHECK_MSG(memcmp(logits + i * V, alone[s]->logits, V * sizeof(float)) == 0,
                      "%s (kv bf16 %d): shared prefix, step %d, sequence %c differs from alone", name, kv_bf16, st,
                      "XYZ"[s]);
        }
    }
    CHECK_MSG(ok, "%s: shared prefix: %s", name, err.msg);
    for (int s = 0; s < 3; s++) nf_engine_free(alone[s]);
    nf_engine_free(be);
}

static void errors(nf_model *m)
{
    nf_engine *be = engine(m, 2, 0, 0);
    if (!be) return;
    float logits[2 * SY_V];
    uint32_t pages[NPS] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, other[NPS] = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19};
    int32_t ids[3] = {1, 2, 3};
    nf_error err;
    batch_buf bb = {.n_seqs = 0};
    for (int i = 0; i < 3; i++) batch_add(&bb, pages, 0, ids, 1);
    nf_batch b = batch_of(&bb, 0);
    CHECK(be->ops->forward(be->state, &b, logits, &err) == NF_ERR_INVALID_ARG); /* 3 sequences, max 2 */
    CHECK_CONTAINS(err.msg, "1 .. 2 sequences");
    bb = (batch_buf){.n_seqs = 0};
    pages[1] = POOL;
    batch_add(&bb, pages, 3, ids, 2); /* positions 3, 4: page 1 is out of the pool */
    b = batch_of(&bb, 0);
    CHECK(be->ops->forward(be->state, &b, logits, &err) == NF_ERR_INVALID_ARG);
    CHECK_CONTAINS(err.msg, "page 1 is 48, the pool has 48");
    bb.pos0[0] = CTX - 1;
    CHECK(be->ops->forward(be->state, &b, logits, &err) == NF_ERR_INVALID_ARG);
    CHECK_CONTAINS(err.msg, "past the context of 40");
    CHECK(be->ops->copy_page(be->state, POOL, 0, &err) == NF_ERR_INVALID_ARG);
    CHECK_CONTAINS(err.msg, "the pool has 48 pages");
    nf_engine_free(be);
    nf_engine_opts o = {.threads = 2, .ctx = CTX, .page_tokens = PT, .kv_pages = NPS - 1};
    CHECK(nf_engine_create(m, &o, &be, &err) == NF_ERR_INVALID_ARG);
    CHECK_CONTAINS(err.msg, "cannot hold one sequence");
    /* dynamic NTK rope: frequencies follow the sequence's length, one sequence per forward */
    const nf_rope_scaling keep = m->cfg.rope_scaling;
    m->cfg.rope_scaling = NF_ROPE_SCALING_DYNAMIC;
    be = engine(m, 2, 0, 0);
    pages[1] = 1;
    bb = (batch_buf){.n_seqs = 0};
    batch_add(&bb, pages, 0, ids, 2);
    batch_add(&bb, other, 0, ids, 1);
    b = batch_of(&bb, 0);
    CHECK(be && be->ops->forward(be->state, &b, logits, &err) == NF_ERR_UNSUPPORTED);
    CHECK_CONTAINS(err.msg, "dynamic NTK rope");
    b.n_seqs = 1, b.n_tokens = 2;
    CHECK(be && be->ops->forward(be->state, &b, logits, &err) == NF_OK);
    nf_engine_free(be);
    m->cfg.rope_scaling = keep;
}

int main(void)
{
    char path[] = "/tmp/nf_test_batch_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    const char *arch[] = {"llama", "qwen2_moe", "qwen3_moe"};
    const nf_codec_id codecs[] = {NF_CODEC_BF16, NF_CODEC_Q8_0};
    for (int i = 0; i < 3; i++)
        for (int c = 0; c < 2; c++) {
            synth_opts so = {.arch = arch[i], .codec = codecs[c], .seed = (uint32_t)(i * 2 + c + 100)};
            CHECK(synth_write(path, &so));
            nf_model *m;
            nf_error err;
            if (nf_model_load(path, &m, &err)) {
                CHECK_MSG(0, "%s", err.msg);
                continue;
            }
            char name[64];
            snprintf(name, sizeof name, "%s %s", arch[i], nf_codec_get(codecs[c])->name);
            for (int kv = 0; kv < 2; kv++) {
                mix(m, name, kv, 0);
                mix(m, name, kv, 1);
                shared_prefix(m, name, kv);
            }
            /* expert parallelism (docs/dist.md): 2 and 3 simulated ranks, the sequences spread over
             * them, give every sequence the same bits as alone */
            for (ep_ranks = 2; m->cfg.experts && ep_ranks <= 3; ep_ranks++) mix(m, name, 0, 1);
            ep_ranks = 0;
            if (c == 0) errors(m);
            nf_model_free(m);
        }
    unlink(path);
    return nf_test_report();
}

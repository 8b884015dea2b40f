/* The k-quant and nvfp4 recipes from an unquantized HF source, on tests/fixtures/models/qwen3_moe_256
 * (tests/oracle/tiny_models.py: 1 layer, 4 experts, hidden = moe_intermediate = 256, tied
 * embeddings, head_dim 64), whose rows k-quants and 128-row nvfp4 tiles take, so the recipes' own
 * codecs are used rather than their q8_0 fallback.
 *
 * For q4q6 and q4q5:
 *  - every tensor's codec is the one docs/convert.md's recipe table gives (restated below);
 *  - every encoded element is within a bound computed per (sub-)block from the scales the block
 *    itself stores. A k-quant block decodes element i of sub-block j to a grid point
 *    g(q) = dd*q - dm (q4_k/q5_k: dd = d*sc_j, dm = dmin*m_j, q in [0, nmax]; q6_k: dm = 0,
 *    dd = d*sc_j, q in [-32, 31]; q8_0: dd = d, q in [-127, 127]). Two terms:
 *      step:  inside the grid's range the nearest point is at most dd/2 away, so an encoder that
 *             picks levels against the scales as decoded errs by <= |dd|/2;
 *      range: outside it the error is the distance to the range plus nothing more (the end point
 *             is the nearest level), and that distance is what rounding the scales to their
 *             stored precision may cut off: 6-bit sc and m (q4_k/q5_k) lose <= d/2 per level
 *             step over nmax steps and <= dmin/2 of the offset; q6_k's 8-bit sc loses <= |d|/2 per
 *             step over 32 steps; q8_0's f16 d loses 2^-11 relative over 127 steps.
 *    The check is |y - x| <= |dd|/2 + dist(x, range) + fp, with dist(x, range) <= the range term,
 *    fp = 2^-20 (|x| + |dd| nmax + dm) for the f32 arithmetic of decoding. Both limits come from the
 *    block's own bytes, not from a tolerance chosen to pass.
 * For nvfp4 (weight-only): each expert bank carries 2E (gate/up) or E (down) divisors, each bitwise
 * compressed-tensors' global scale of its source matrix, fp32(448*6 / amax); the bank decodes
 * bit-identically to nf_nvfp4_quantize of each source matrix alone (itself byte-identical to
 * compressed-tensors, tests/codec/test_nvfp4_oracle.c); no allow_a4, no input divisors; the rest is
 * bf16 and exact. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/nvfp4.h"
#include "convert/convert.h"
#include "convert/plan.h"
#include "format/artifact.h"
#include "nf_test.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation" /* fixture names are short */
#endif

#define SRC NF_TEST_DATA "/fixtures/models/qwen3_moe_256"
enum { H = 256, I = 256, E = 4, VOCAB = 256, NH = 2, KV = 1, HD = 64 };

static char tmpdir[256];

static nf_status convert(const char *src, const char *recipe, const char *out, nf_error *err)
{
    nf_convert_opts o = {recipe, 0, 2, 1};
    nf_plan p;
    nf_status s = nf_plan_build(src, &o, &p, err);
    if (s == NF_OK) s = nf_convert_run(&p, out, &o, NULL, err);
    nf_plan_free(&p);
    return s;
}

/* Row r of a bf16 safetensors tensor. */
static void st_row(const nf_st_tensor *s, uint64_t r, float *y)
{
    uint64_t cols = s->shape[s->n_dims - 1];
    for (uint64_t k = 0; k < cols; k++) {
        uint16_t h;
        memcpy(&h, (const uint8_t *)s->data + 2 * (r * cols + k), 2);
        y[k] = nf_bf16_to_f32(h);
    }
}

/* ---- the recipe table of docs/convert.md, for this model (E = 4, one layer, tied) -------------- */

/* more_bits(i, n) of llama.cpp: i < n/8 or i >= 7n/8 or (i - n/8) % 3 == 2. */
static int more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

static nf_codec_id expected_codec(const char *recipe, const char *name, int layer, int n_layers, int experts, int tied,
                                  uint64_t cols)
{
    int q5 = strcmp(recipe, "q4q5") == 0;
    nf_codec_id k = q5 ? NF_CODEC_Q5_K : NF_CODEC_Q4_K, c;
    if (strstr(name, "norm") || strstr(name, "gate_inp")) return NF_CODEC_F32;
    if (strcmp(name, "token_embd") == 0) c = tied ? NF_CODEC_Q6_K : k;
    else if (strcmp(name, "output") == 0) c = NF_CODEC_Q6_K;
    else if (strstr(name, "attn_q")) c = k;
    else if (strstr(name, "attn_k")) c = experts == 8 ? NF_CODEC_Q8_0 : k;
    else if (strstr(name, "attn_v")) c = experts == 8 ? NF_CODEC_Q8_0 : more_bits(layer, n_layers) ? NF_CODEC_Q6_K : k;
    else if (strstr(name, "attn_output")) c = experts == 8 || q5 ? NF_CODEC_Q5_K : NF_CODEC_Q4_K;
    else if (strstr(name, "ffn_gate_up_exps")) c = NF_CODEC_Q4_K;
    else if (strstr(name, "ffn_down_exps")) c = q5 ? NF_CODEC_Q5_K : NF_CODEC_Q6_K;
    else if (strstr(name, "ffn_down")) c = q5 ? (more_bits(layer, n_layers) ? NF_CODEC_Q6_K : NF_CODEC_Q5_K)
                                              : (more_bits(layer, n_layers) ? NF_CODEC_Q6_K : NF_CODEC_Q4_K);
    else c = k; /* dense ffn_gate/up, gate_up_shexp */
    if (c != NF_CODEC_F32 && c != NF_CODEC_Q8_0 && cols % 256) c = cols % 32 ? NF_CODEC_BF16 : NF_CODEC_Q8_0; /* fallback */
    return c;
}

/* ---- per-block error bounds from the stored scales ------------------------------------------ */

/* get_scale_min_k4 (llama.cpp), restated: sub-block j's 6-bit scale and min from the 12 bytes. */
static void k4_scale_min(int j, const uint8_t *q, int *sc, int *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

#define F16_REL 0x1p-11 /* f16 rounding, relative (normal range) */

typedef struct grid {
    double dd, dm;    /* y = dd * q - dm */
    int qlo, qhi;     /* level range */
    double slack;     /* q8_0: levels picked against the unrounded d, off by |q| |d - f16(d)| */
    double range_cut; /* how far data may lie outside the range (see sub_grid) */
} grid;

static float f16_at(const uint8_t *b) { return nf_f16_to_f32((uint16_t)(b[0] | b[1] << 8)); }

/* The grid of the sub-block holding element i of block b (codec c), and how far outside its range
 * the sub-block's data x[n] (the sub-block's source values) may lie:
 *  - the least-squares fit: the encoder's candidates include the plain grid over the data
 *    (q4_k/q5_k: step s0 = (max - min(min, 0)) / nmax; q6_k: s0 = amax / 32), whose levels miss
 *    each element by <= s0/2 (q6_k: <= s0, the +32 end clamps to 31); the chosen fit has no larger
 *    squared error, so no element's residual, and so no element's distance to the fit's range,
 *    exceeds sqrt(n) * that;
 *  - rounding the fitted scale and min to their stored form: q4_k/q5_k sc = round(63 s / max_s)
 *    against d = f16(max_s / 63) moves each level step by <= d/2 + 63 d 2^-11, the range end by
 *    nmax times that; the min likewise by dmin/2 + 63 dmin 2^-11; q6_k: the int8 sc against
 *    d = f16(max_s / -128) by <= |d|/2 + 128 |d| 2^-11 per step over 32 steps. */
static grid sub_grid(nf_codec_id c, const uint8_t *b, int i, const float *x, int n)
{
    grid g = {0};
    double mx = x[0], mn = x[0], amax = 0;
    for (int k = 0; k < n; k++) mx = fmax(mx, x[k]), mn = fmin(mn, x[k]), amax = fmax(amax, fabs(x[k]));
    if (c == NF_CODEC_Q8_0) {
        double d = f16_at(b);
        g.dd = d, g.qlo = -127, g.qhi = 127;
        g.slack = g.range_cut = 127 * fabs(d) * F16_REL / (1 - F16_REL);
    } else if (c == NF_CODEC_Q4_K || c == NF_CODEC_Q5_K) {
        double d = f16_at(b), dmin = f16_at(b + 2);
        int sc, m, nmax = c == NF_CODEC_Q4_K ? 15 : 31;
        k4_scale_min(i / 32, b + 4, &sc, &m);
        g.dd = (double)(float)(d * sc), g.dm = (double)(float)(dmin * m);
        g.qlo = 0, g.qhi = nmax;
        double s0 = (mx - fmin(mn, 0)) / nmax;
        g.range_cut = sqrt(n) * s0 / 2 + nmax * (d / 2 + 63 * d * F16_REL) + dmin / 2 + 63 * dmin * F16_REL;
    } else { /* q6_k */
        double d = f16_at(b + 208);
        g.dd = (double)(float)(d * (int8_t)b[192 + i / 16]);
        g.qlo = -32, g.qhi = 31;
        g.range_cut = sqrt(n) * amax / 32 + 32 * (fabs(d) / 2 + 128 * fabs(d) * F16_REL);
    }
    return g;
}

typedef struct bound_stats {
    double worst;     /* max |y - x| / bound */
    double worst_cut; /* max dist(x, range) / range_cut */
    uint64_t n, outside;
} bound_stats;

/* Element x encoded as y under grid g: |y - x| <= |dd|/2 + slack + dist(x, range) + fp, and
 * dist(x, range) <= range_cut + fp; fp covers decoding's f32 arithmetic. 0 when either fails. */
static int within(const grid *g, double x, double y, bound_stats *st)
{
    double a = g->dd * g->qlo - g->dm, b = g->dd * g->qhi - g->dm, lo = fmin(a, b), hi = fmax(a, b);
    double dist = x < lo ? lo - x : x > hi ? x - hi : 0;
    double fp = 0x1p-20 * (fabs(x) + fabs(g->dd) * (g->qhi - g->qlo) + g->dm);
    double bound = fabs(g->dd) / 2 + g->slack + dist + fp, e = fabs(y - x);
    st->n++;
    if (dist > 0) st->outside++;
    if (bound > 0 && e / bound > st->worst) st->worst = e / bound;
    if (g->range_cut > 0 && dist / g->range_cut > st->worst_cut) st->worst_cut = dist / g->range_cut;
    return e <= bound && dist <= g->range_cut + fp;
}

/* Rows [row0, row0 + rows of s) of artifact tensor t against source s, element by element. */
static int rows_within(const nf_tensor *t, uint64_t row0, const nf_st_tensor *s, bound_stats *st, const char *what)
{
    uint64_t cols = t->layout.cols, rows = s->n_elems / cols;
    const nf_codec *c = t->codec;
    size_t rb = nf_codec_row_bytes(c, cols);
    int sub = c->id == NF_CODEC_Q6_K ? 16 : 32; /* sub-block of one scale */
    float *x = malloc(cols * sizeof *x), *y = malloc(cols * sizeof *y);
    int ok = 1;
    for (uint64_t r = 0; r < rows && ok; r++) {
        const uint8_t *row = t->data + (row0 + r) * rb;
        st_row(s, r, x);
        c->dequantize_row(row, y, cols);
        for (uint64_t k = 0; k < cols && ok; k++) {
            if (c->id == NF_CODEC_F32 || c->id == NF_CODEC_BF16) {
                ok = memcmp(&x[k], &y[k], 4) == 0; /* bf16 source: exact */
                continue;
            }
            grid g = sub_grid(c->id, row + (k / c->block_elems) * c->block_bytes, (int)(k % c->block_elems),
                              x + k / sub * sub, sub);
            ok = within(&g, x[k], y[k], st);
            if (!ok) CHECK_MSG(0, "%s row %llu col %llu: source %.9g decoded %.9g (dd %.4g dm %.4g)", what,
                               (unsigned long long)r, (unsigned long long)k, (double)x[k], (double)y[k], g.dd, g.dm);
        }
    }
    free(x);
    free(y);
    return ok;
}

/* The source keys of artifact tensor `name` in stacking order; returns how many. */
static int sources_of(const char *name, char keys[][128], uint64_t *row0)
{
    static const char *const map[][2] = {
        {"token_embd", "model.embed_tokens.weight"}, {"output_norm", "model.norm.weight"},
        {"blk.0.attn_norm", "model.layers.0.input_layernorm.weight"},
        {"blk.0.ffn_norm", "model.layers.0.post_attention_layernorm.weight"},
        {"blk.0.attn_q", "model.layers.0.self_attn.q_proj.weight"}, {"blk.0.attn_k", "model.layers.0.self_attn.k_proj.weight"},
        {"blk.0.attn_v", "model.layers.0.self_attn.v_proj.weight"},
        {"blk.0.attn_output", "model.layers.0.self_attn.o_proj.weight"},
        {"blk.0.attn_q_norm", "model.layers.0.self_attn.q_norm.weight"},
        {"blk.0.attn_k_norm", "model.layers.0.self_attn.k_norm.weight"},
        {"blk.0.ffn_gate_inp", "model.layers.0.mlp.gate.weight"}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strcmp(name, map[i][0]) == 0) {
            snprintf(keys[0], 128, "%s", map[i][1]);
            row0[0] = 0;
            return 1;
        }
    int n = 0;
    for (int j = 0; j < E; j++) {
        if (strcmp(name, "blk.0.ffn_gate_up_exps") == 0) {
            snprintf(keys[n], 128, "model.layers.0.mlp.experts.%d.gate_proj.weight", j);
            row0[n++] = (uint64_t)j * 2 * I;
            snprintf(keys[n], 128, "model.layers.0.mlp.experts.%d.up_proj.weight", j);
            row0[n++] = (uint64_t)j * 2 * I + I;
        } else if (strcmp(name, "blk.0.ffn_down_exps") == 0) {
            snprintf(keys[n], 128, "model.layers.0.mlp.experts.%d.down_proj.weight", j);
            row0[n++] = (uint64_t)j * H;
        }
    }
    return n;
}

static void check_kquant_recipe(const char *recipe)
{
    char out[512];
    snprintf(out, sizeof out, "%s/%s.nf", tmpdir, recipe);
    nf_error err = {0};
    CHECK_MSG(convert(SRC, recipe, out, &err) == NF_OK, "%s: %s", recipe, err.msg);
    nf_artifact *a = NULL;
    nf_st_set *st = NULL;
    CHECK(nf_artifact_open(out, &a, &err) == NF_OK);
    CHECK(nf_st_set_open(SRC, &st, &err) == NF_OK);
    if (!a || !st) return;
    CHECK_EQ_U64(nf_artifact_n_tensors(a), 13); /* tied: no output */
    bound_stats bs[NF_CODEC_COUNT] = {0};
    int seen[NF_CODEC_COUNT] = {0};
    for (size_t i = 0; i < nf_artifact_n_tensors(a); i++) {
        const nf_tensor *t = nf_artifact_tensor(a, i);
        nf_codec_id want = expected_codec(recipe, t->desc.name, 0, 1, E, 1, t->layout.cols);
        CHECK_MSG(t->desc.codec == want, "%s %s: codec %s, the table says %s", recipe, t->desc.name,
                  nf_codec_get(t->desc.codec)->name, nf_codec_get(want)->name);
        char keys[2 * E][128];
        uint64_t row0[2 * E];
        int n = sources_of(t->desc.name, keys, row0);
        CHECK_MSG(n > 0, "%s: no source known", t->desc.name);
        for (int k = 0; k < n; k++) {
            const nf_st_tensor *s = nf_st_set_find(st, keys[k]);
            CHECK_MSG(s && s->dtype == NF_ST_BF16, "%s", keys[k]);
            if (s) CHECK_MSG(rows_within(t, row0[k], s, &bs[t->desc.codec], keys[k]), "%s %s <- %s", recipe, t->desc.name, keys[k]);
        }
        seen[t->desc.codec] = 1;
    }
    /* the recipe's own codecs were exercised, not only the fallback */
    CHECK(seen[NF_CODEC_Q4_K] && seen[NF_CODEC_Q6_K] && seen[NF_CODEC_Q8_0]);
    if (strcmp(recipe, "q4q5") == 0) CHECK(seen[NF_CODEC_Q5_K]);
    for (int c = 0; c < NF_CODEC_COUNT; c++)
        if (bs[c].n)
            printf("%s %-5s %7llu elements: worst |err|/bound %.3f; %llu outside the grid's range, worst cut/allowed %.3f\n",
                   recipe, nf_codec_get((nf_codec_id)c)->name, (unsigned long long)bs[c].n, bs[c].worst,
                   (unsigned long long)bs[c].outside, bs[c].worst_cut);
    nf_st_set_close(st);
    nf_artifact_close(a);
}

/* ---- nvfp4 ------------------------------------------------------------------------------------- */

/* Source matrix s quantized alone by nf_nvfp4_quantize (D = 1), then decoded row by row against
 * artifact rows [row0, ...) of planes p; and the divisor word must be 448*6/amax in fp32. */
static void nvfp4_source_matches(const nf_nvfp4_planes *p, uint32_t word, uint64_t row0, const nf_st_tensor *s,
                                 const char *key)
{
    uint64_t cols = s->shape[1], rows = s->shape[0];
    float *w = malloc(rows * cols * sizeof *w), *y = malloc(cols * sizeof *y), *z = malloc(cols * sizeof *z);
    float amax = 0;
    for (uint64_t r = 0; r < rows; r++) st_row(s, r, w + r * cols);
    for (uint64_t i = 0; i < rows * cols; i++) amax = fmaxf(amax, fabsf(w[i]));
    float div, want = 448.0f * 6.0f / amax;
    memcpy(&div, (const uint8_t *)p->divisors + 4 * word, 4);
    CHECK_MSG(memcmp(&div, &want, 4) == 0 && div == nf_nvfp4_global_from_amax(amax), "%s: divisor %.9g, want %.9g",
              key, (double)div, (double)want);
    nf_nvfp4_layout l;
    CHECK(nf_nvfp4_layout_of(rows, cols, 1, &l, NULL) == NF_OK);
    uint8_t *pay = malloc(l.payload_bytes);
    nf_nvfp4_quantize(w, &l, pay);
    nf_nvfp4_planes q;
    CHECK(nf_nvfp4_view(pay, l.payload_bytes, rows, cols, 1, &q, NULL) == NF_OK);
    int ok = 1;
    for (uint64_t r = 0; r < rows && ok; r++) {
        nf_nvfp4_dequantize_row(p, row0 + r, y);
        nf_nvfp4_dequantize_row(&q, r, z);
        ok = memcmp(y, z, cols * sizeof *y) == 0;
    }
    CHECK_MSG(ok, "%s: bank rows differ from nf_nvfp4_quantize of the source", key);
    free(pay);
    free(w);
    free(y);
    free(z);
}

static void check_nvfp4_recipe(void)
{
    char out[512];
    snprintf(out, sizeof out, "%s/nvfp4.nf", tmpdir);
    nf_error err = {0};
    CHECK_MSG(convert(SRC, "nvfp4", out, &err) == NF_OK, "%s", err.msg);
    nf_artifact *a = NULL;
    nf_st_set *st = NULL;
    CHECK(nf_artifact_open(out, &a, &err) == NF_OK);
    CHECK(nf_st_set_open(SRC, &st, &err) == NF_OK);
    if (!a || !st) return;
    for (size_t i = 0; i < nf_artifact_n_tensors(a); i++) {
        const nf_tensor *t = nf_artifact_tensor(a, i);
        const char *nm = t->desc.name;
        char keys[2 * E][128];
        uint64_t row0[2 * E];
        int n = sources_of(nm, keys, row0);
        if (!strstr(nm, "_exps")) { /* everything else: bf16 (f32 vectors and router), exact */
            nf_codec_id want = strstr(nm, "norm") || strstr(nm, "gate_inp") ? NF_CODEC_F32 : NF_CODEC_BF16;
            CHECK_MSG(t->desc.codec == want, "%s: %s", nm, nf_codec_get(t->desc.codec)->name);
            bound_stats bs = {0};
            for (int k = 0; k < n; k++) CHECK_MSG(rows_within(t, row0[k], nf_st_set_find(st, keys[k]), &bs, keys[k]), "%s", nm);
            continue;
        }
        uint32_t want_div = strstr(nm, "gate_up") ? 2 * E : E;
        CHECK_MSG(t->desc.codec == NF_CODEC_NVFP4 && t->desc.divisors == want_div && (int)want_div == n,
                  "%s: codec %s, %u divisors (want nvfp4, %u)", nm, nf_codec_get(t->desc.codec)->name, t->desc.divisors,
                  want_div);
        CHECK_MSG(!(t->desc.flags & NF_TENSOR_ALLOW_A4) && t->desc.n_input_divisors == 0, "%s: weight-only", nm);
        nf_nvfp4_planes p;
        if (t->desc.codec != NF_CODEC_NVFP4 ||
            nf_nvfp4_view(t->data, t->layout.payload_bytes, t->layout.rows, t->layout.cols, t->desc.divisors, &p, &err))
            continue;
        for (int k = 0; k < n; k++) nvfp4_source_matches(&p, (uint32_t)k, row0[k], nf_st_set_find(st, keys[k]), keys[k]);
    }
    nf_st_set_close(st);
    nf_artifact_close(a);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/nf_convert_recipes.XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    check_kquant_recipe("q4q6");
    check_kquant_recipe("q4q5");
    check_nvfp4_recipe();
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) return 1;
    return nf_test_report();
}

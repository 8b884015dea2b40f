/* ninfer synth's generator (src/convert/synth.c):
 * - synth and the converter read one recipe table (recipe.h; tests/convert/test_recipe checks it
 *   against docs/convert.md), but reach it differently: synth maps a schema name to its role
 *   (nf_recipe_role_of), the plan passes the role where it builds each tensor. nf_synth_codec
 *   agrees with the converter's plan (codec and fallback flag) on every tensor of the fixture
 *   checkpoints in every recipe;
 * - tiny geometries in every recipe load with nf_model_load; the tensor list is exactly the schema's
 *   (names and shapes computed here from docs/model_schema.md); codecs are the table's, with spot
 *   checks from docs/convert.md; nvfp4 banks carry one divisor per source (2E, E), and each divisor
 *   is 448*6 / the amax of its own source's decoded values;
 * - values: bf16 matrices have mean ~0 and sd ~0.02, routers sd ~2/sqrt(H), norms 1;
 * - determinism: same seed, same bytes (1 vs 2 threads); another seed, other bytes;
 * - expert banks: expert 0 is the --fresh expert 0 byte for byte; every other expert holds expert 0's
 *   decoded blocks (same multiset of values, other order), and differs from every other expert;
 * - the CPU engine on each tiny model gives finite, non-constant logits;
 * - bad options fail with NF_ERR_INVALID_ARG naming them, and leave no file. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/fnv.h"
#include "base/log.h"
#include "codec/nvfp4.h"
#include "convert/plan.h"
#include "engine/engine.h"
#include "model/model.h"
#include "convert/synth.h"
#include "nf_test.h"

static const char *recipes[] = {"bf16", "q8q8", "q4q6", "q4q5", "nvfp4"};
#define NREC 5

static char tmpdir[256];

static const char *tmp(const char *name)
{
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmpdir, name);
    return buf[k];
}

static int write_synth(const char *path, const char *geom, const char *recipe, uint64_t seed, int threads, int fresh)
{
    nf_synth_opts o = {.geometry = geom, .recipe = recipe, .seed = seed, .threads = threads, .fresh = fresh, .quiet = 1};
    nf_error e;
    nf_synth_stats st;
    nf_status s = nf_synth_write(path, &o, &st, &e);
    CHECK_MSG(s == NF_OK, "%s %s: %s", geom, recipe, e.msg);
    return s == NF_OK;
}

/* ---- tensor roles against the converter's plan ------------------------------------------------ */

static void test_roles_vs_converter(void)
{
    static const char *fixtures[] = {"llama", "qwen2_moe", "qwen3_moe", "qwen3_moe_256", "qwen3_next", "qwen3_5_moe"};
    int compared = 0;
    for (int f = 0; f < 6; f++)
        for (int r = 0; r < NREC; r++) {
            char dir[512];
            snprintf(dir, sizeof dir, NF_TEST_DATA "/fixtures/models/%s", fixtures[f]);
            nf_convert_opts co = {.recipe = recipes[r], .quiet = 1};
            nf_plan p;
            nf_error e;
            if (nf_plan_build(dir, &co, &p, &e) != NF_OK) {
                /* nvfp4 banks need whole 128-row tiles per source: the 64-wide fixtures cannot have them */
                CHECK_MSG(strcmp(recipes[r], "nvfp4") == 0 && strcmp(fixtures[f], "qwen3_moe_256") != 0,
                          "%s %s: %s", fixtures[f], recipes[r], e.msg);
                nf_plan_free(&p);
                continue;
            }
            for (size_t i = 0; i < p.n; i++) {
                const nf_plan_tensor *t = &p.t[i];
                nf_codec_id c;
                int fb;
                nf_status s = nf_synth_codec(recipes[r], t->name, p.cfg.n_layers, p.cfg.n_experts,
                                             p.cfg.tie_word_embeddings, t->dims[t->n_dims - 1], &c, &fb, &e);
                CHECK_MSG(s == NF_OK, "%s: %s", t->name, e.msg);
                CHECK_MSG(s == NF_OK && c == t->codec && fb == t->fallback, "%s %s %s: synth %s (fallback %d), converter %s (%d)",
                          fixtures[f], recipes[r], t->name, nf_codec_get(c)->name, fb, nf_codec_get(t->codec)->name,
                          t->fallback);
                compared++;
            }
            nf_plan_free(&p);
        }
    printf("roles: %d tensors compared with the converter's plan\n", compared);
    CHECK_MSG(compared > 150, "only %d tensors compared", compared);
}

/* ---- schema: the expected tensor list of a geometry -------------------------------------------- */

typedef struct want {
    char name[48];
    uint32_t n;
    uint64_t d[3];
} want;

static size_t expected(const nf_synth_geometry *g, want *w)
{
    size_t n = 0;
    const uint64_t H = g->hidden, Q = (uint64_t)g->heads * g->head_dim, KV = (uint64_t)g->kv_heads * g->head_dim;
#define W(nm, nd, a, b, c) (w[n] = (want){"", nd, {a, b, c}}, snprintf(w[n].name, sizeof w[n].name, "%s", nm), n++)
    W("token_embd", 2, g->vocab, H, 0);
    W("output_norm", 1, H, 0, 0);
    if (!g->tie) W("output", 2, g->vocab, H, 0);
    char nm[48], pre[24];
#define B(sfx, nd, a, b, c) (snprintf(nm, sizeof nm, "%s%s", pre, sfx), W(nm, nd, a, b, c))
    const uint64_t Vd = (uint64_t)g->ssm_v_heads * g->ssm_v_dim, conv = 2ull * g->ssm_k_heads * g->ssm_k_dim + Vd;
    if (g->attn_every) { /* the hybrids' MTP block: mtp.fc, three norms, and (l == layers below) one layer */
        W("mtp.fc", 2, H, 2 * H, 0);
        W("mtp.norm_embd", 1, H, 0, 0);
        W("mtp.norm_hidden", 1, H, 0, 0);
        W("mtp.output_norm", 1, H, 0, 0);
    }
    for (uint32_t l = 0; l < g->layers + (g->attn_every != 0); l++) {
        const int mtp = l == g->layers; /* a gated-attention + MoE layer named mtp.blk.0.* */
        if (mtp) snprintf(pre, sizeof pre, "mtp.blk.0.");
        else snprintf(pre, sizeof pre, "blk.%u.", l);
        B("attn_norm", 1, H, 0, 0);
        B("ffn_norm", 1, H, 0, 0);
        B("ffn_gate_inp", 2, g->experts, H, 0);
        B("ffn_gate_up_exps", 3, g->experts, 2 * (uint64_t)g->moe_inter, H);
        B("ffn_down_exps", 3, g->experts, H, g->moe_inter);
        if (g->shared_inter) {
            B("ffn_gate_up_shexp", 2, 2 * (uint64_t)g->shared_inter, H, 0);
            B("ffn_down_shexp", 2, H, g->shared_inter, 0);
            B("ffn_gate_inp_shexp", 1, H, 0, 0);
        }
        if (!mtp && g->attn_every && (l + 1) % g->attn_every) { /* Gated DeltaNet (docs/hybrid.md) */
            B("ssm_qkv", 2, conv, H, 0);
            B("ssm_z", 2, Vd, H, 0);
            B("ssm_ba", 2, 2 * (uint64_t)g->ssm_v_heads, H, 0);
            B("ssm_conv", 2, conv, g->ssm_conv, 0);
            B("ssm_dt_bias", 1, g->ssm_v_heads, 0, 0);
            B("ssm_a_log", 1, g->ssm_v_heads, 0, 0);
            B("ssm_norm", 1, g->ssm_v_dim, 0, 0);
            B("ssm_out", 2, H, Vd, 0);
            continue;
        }
        if (g->attn_every) B("attn_gate", 2, Q, H, 0);
        B("attn_q", 2, Q, H, 0);
        B("attn_k", 2, KV, H, 0);
        B("attn_v", 2, KV, H, 0);
        B("attn_output", 2, H, Q, 0);
        if (g->qkv_bias) {
            B("attn_q_bias", 1, Q, 0, 0);
            B("attn_k_bias", 1, KV, 0, 0);
            B("attn_v_bias", 1, KV, 0, 0);
        }
        if (g->qk_norm) {
            B("attn_q_norm", 1, g->head_dim, 0, 0);
            B("attn_k_norm", 1, g->head_dim, 0, 0);
        }
    }
#undef B
#undef W
    return n;
}

/* A few entries of docs/convert.md's table, written out here (not through nf_synth_codec). */
static void spot_codecs(const nf_artifact *a, const char *recipe, int e8, int hybrid)
{
    if (hybrid) { /* tiny-hybrid: blk.0 is Gated DeltaNet, blk.3 gated attention (4 experts) */
        struct {
            const char *name, *codec[NREC];
        } rows[] = {
            {"blk.0.ssm_qkv", {"bf16", "q8_0", "q4_k", "q5_k", "bf16"}},
            {"blk.0.ssm_z", {"bf16", "q8_0", "q4_k", "q5_k", "bf16"}},
            {"blk.0.ssm_out", {"bf16", "q8_0", "q4_k", "q5_k", "bf16"}},
            {"blk.0.ssm_ba", {"bf16", "bf16", "bf16", "bf16", "bf16"}},
            {"blk.0.ssm_conv", {"f32", "f32", "f32", "f32", "f32"}},
            {"blk.3.attn_gate", {"bf16", "q8_0", "q4_k", "q5_k", "bf16"}},
            {"blk.0.ffn_gate_up_shexp", {"bf16", "q8_0", "q4_k", "q5_k", "nvfp4"}},
        };
        int r = 0;
        while (strcmp(recipes[r], recipe)) r++;
        for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
            const nf_tensor *t = nf_artifact_find_tensor(a, rows[i].name);
            CHECK_MSG(t && strcmp(t->codec->name, rows[i].codec[r]) == 0, "%s %s: %s, docs/convert.md says %s", recipe,
                      rows[i].name, t ? t->codec->name : "missing", rows[i].codec[r]);
        }
        return;
    }
    struct {
        const char *name, *codec[NREC]; /* bf16 q8q8 q4q6 q4q5 nvfp4 */
    } rows[] = {
        {"blk.0.ffn_gate_up_exps", {"bf16", "q8_0", "q4_k", "q4_k", "nvfp4"}},
        {"blk.1.ffn_down_exps", {"bf16", "q8_0", "q6_k", "q5_k", "nvfp4"}},
        {"blk.0.attn_q", {"bf16", "q8_0", "q4_k", "q5_k", "bf16"}},
        {"blk.0.attn_norm", {"f32", "f32", "f32", "f32", "f32"}},
        {"blk.1.ffn_gate_inp", {"f32", "f32", "f32", "f32", "f32"}},
        {"blk.0.attn_k", {"bf16", "q8_0", e8 ? "q8_0" : "q4_k", e8 ? "q8_0" : "q5_k", "bf16"}},
    };
    int r = 0;
    while (strcmp(recipes[r], recipe)) r++;
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const nf_tensor *t = nf_artifact_find_tensor(a, rows[i].name);
        CHECK_MSG(t && strcmp(t->codec->name, rows[i].codec[r]) == 0, "%s %s: %s, docs/convert.md says %s", recipe,
                  rows[i].name, t ? t->codec->name : "missing", rows[i].codec[r]);
    }
}

/* Each nvfp4 source's divisor is 448*6 / amax of that source: its largest element is stored as
 * e2m1 6 with block scale e4m3 448, so max |decoded| over the source = 6 * 448 / divisor. */
static void check_nvfp4_bank(const nf_tensor *t, uint32_t sources)
{
    /* a routed bank [E][R][C], or the shared expert's one matrix [R][C] */
    const int e3 = t->desc.n_dims == 3;
    const uint64_t E = e3 ? t->desc.dims[0] : 1, R = t->desc.dims[e3 ? 1 : 0], C = t->desc.dims[t->desc.n_dims - 1],
                   rs = R / sources;
    CHECK_EQ_U64(t->desc.divisors, E * sources);
    nf_nvfp4_planes p;
    nf_error e;
    CHECK(nf_nvfp4_view(t->data, t->layout.payload_bytes, E * R, C, t->desc.divisors, &p, &e) == NF_OK);
    float *y = malloc(C * sizeof *y);
    for (uint64_t d = 0; d < E * sources; d++) {
        float amax = 0, div;
        memcpy(&div, (const uint8_t *)p.divisors + 4 * d, 4);
        for (uint64_t r = d * rs; r < (d + 1) * rs; r++) {
            nf_nvfp4_dequantize_row(&p, r, y);
            for (uint64_t k = 0; k < C; k++) amax = fmaxf(amax, fabsf(y[k]));
        }
        CHECK_MSG(fabs(amax - 2688.0 / div) <= 1e-5 * amax, "%s source %llu: amax %g, 448*6/divisor %g",
                  t->desc.name, (unsigned long long)d, (double)amax, 2688.0 / div);
    }
    free(y);
}

static void mean_sd(const nf_tensor *t, double *mean, double *sd)
{
    const uint64_t C = t->layout.cols, R = t->layout.rows;
    float *y = malloc(C * sizeof *y);
    double s = 0, q = 0;
    const size_t rb = nf_codec_row_bytes(t->codec, C);
    for (uint64_t r = 0; r < R; r++) {
        t->codec->dequantize_row(t->data + r * rb, y, C);
        for (uint64_t k = 0; k < C; k++) {
            s += y[k];
            q += (double)y[k] * y[k];
        }
    }
    const double n = (double)(R * C);
    *mean = s / n;
    *sd = sqrt(q / n - *mean * *mean);
    free(y);
}

static void check_values(const nf_model *m)
{
    double mean, sd;
    const nf_tensor *t = nf_artifact_find_tensor(m->art, "blk.0.ffn_gate_up_exps");
    mean_sd(t, &mean, &sd);
    CHECK_MSG(fabs(mean) < 1e-3 && fabs(sd - 0.02) < 0.001, "gate_up: mean %g sd %g, want 0 and 0.02", mean, sd);
    mean_sd(m->layers[1].ffn_gate_inp, &mean, &sd);
    const double want = 2 / sqrt((double)m->cfg.hidden);
    CHECK_MSG(fabs(sd - want) < 0.05 * want, "router sd %g, want %g", sd, want);
    /* f32 tensors hold bf16 values, as a converted bf16 checkpoint's do (engines may bind them as bf16) */
    const nf_tensor *r = m->layers[1].ffn_gate_inp;
    uint64_t wide = 0;
    for (uint64_t i = 0; i < r->layout.rows * r->layout.cols; i++) {
        uint32_t b;
        memcpy(&b, (const float *)r->data + i, 4);
        wide += (b & 0xffffu) != 0;
    }
    CHECK_MSG(r->codec->id == NF_CODEC_F32 && wide == 0, "router: %llu of its f32 weights are not bf16 values",
              (unsigned long long)wide);
    const float *norm = (const float *)m->layers[1].attn_norm->data;
    int ones = 1;
    for (uint32_t i = 0; i < m->cfg.hidden; i++) ones &= norm[i] == 1.0f;
    CHECK(ones);
}

static void check_logits(const nf_model *m, const char *what)
{
    nf_engine *e;
    nf_error err;
    nf_engine_opts o = {.threads = 2, .ctx = 64};
    CHECK_MSG(nf_engine_create(m, &o, &e, &err) == NF_OK, "%s: %s", what, err.msg);
    int32_t ids[7] = {1, 65, 300, 7, 511, 100, 42};
    CHECK_MSG(nf_engine_prefill(e, ids, 7, NULL, &err) == NF_OK, "%s: %s", what, err.msg);
    int finite = 1;
    float lo = e->logits[0], hi = e->logits[0];
    for (uint32_t v = 0; v < m->cfg.vocab; v++) {
        finite &= isfinite(e->logits[v]) != 0;
        lo = fminf(lo, e->logits[v]);
        hi = fmaxf(hi, e->logits[v]);
    }
    CHECK_MSG(finite && hi > lo, "%s: logits finite %d, range [%g, %g]", what, finite, (double)lo, (double)hi);
    nf_engine_free(e);
}

static void test_geometry(const char *geom)
{
    const nf_synth_geometry *g = nf_synth_geometry_find(geom);
    CHECK(g != NULL);
    want *w = calloc(128, sizeof *w); /* tiny-hybrid has 66 + 19 (its MTP block) */
    const size_t nw = expected(g, w);
    for (int r = 0; r < NREC; r++) {
        const char *path = tmp("m.nf");
        if (!write_synth(path, geom, recipes[r], 3, 2, 0)) continue;
        nf_model *m;
        nf_error e;
        CHECK_MSG(nf_model_load(path, &m, &e) == NF_OK, "%s %s: %s", geom, recipes[r], e.msg);
        if (!m) continue;
        CHECK_EQ_U64(nf_artifact_n_tensors(m->art), nw);
        for (size_t i = 0; i < nw; i++) {
            const nf_tensor *t = nf_artifact_find_tensor(m->art, w[i].name);
            CHECK_MSG(t != NULL, "%s %s: %s missing", geom, recipes[r], w[i].name);
            if (!t) continue;
            int same = t->desc.n_dims == w[i].n;
            for (uint32_t k = 0; same && k < w[i].n; k++) same = t->desc.dims[k] == w[i].d[k];
            CHECK_MSG(same, "%s: shape", w[i].name);
            nf_codec_id c;
            CHECK(nf_synth_codec(recipes[r], w[i].name, g->layers, g->experts, g->tie, w[i].d[w[i].n - 1], &c, NULL,
                                 NULL) == NF_OK);
            CHECK_MSG(t->desc.codec == c, "%s %s: %s, table says %s", recipes[r], w[i].name, t->codec->name,
                      nf_codec_get(c)->name);
            if (t->desc.codec == NF_CODEC_NVFP4) check_nvfp4_bank(t, strstr(w[i].name, "gate_up") ? 2 : 1);
            else CHECK_EQ_U64(t->desc.divisors, 1);
        }
        spot_codecs(m->art, recipes[r], g->experts == 8, g->attn_every != 0);
        if (strcmp(recipes[r], "bf16") == 0) check_values(m);
        char what[64];
        snprintf(what, sizeof what, "%s %s", geom, recipes[r]);
        check_logits(m, what);
        nf_model_free(m);
        unlink(path);
    }
    free(w);
}

/* ---- determinism and the expert banks ---------------------------------------------------------- */

static uint8_t *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(*n ? *n : 1);
    if (fread(b, 1, *n, f) != *n) *n = 0;
    fclose(f);
    return b;
}

static void test_determinism(void)
{
    const char *a = tmp("a.nf"), *b = tmp("b.nf"), *c = tmp("c.nf");
    if (!write_synth(a, "tiny-qwen2", "q4q6", 7, 1, 0) || !write_synth(b, "tiny-qwen2", "q4q6", 7, 2, 0) ||
        !write_synth(c, "tiny-qwen2", "q4q6", 8, 2, 0))
        return;
    size_t na, nb, nc;
    uint8_t *A = slurp(a, &na), *B = slurp(b, &nb), *C = slurp(c, &nc);
    CHECK_MSG(na == nb && na > 0 && memcmp(A, B, na) == 0, "seed 7 with 1 and 2 threads: files differ");
    /* another seed: same index layout except provenance, different payloads in every matrix */
    nf_artifact *x, *y;
    CHECK(nf_artifact_open(a, &x, NULL) == NF_OK && nf_artifact_open(c, &y, NULL) == NF_OK);
    for (size_t i = 0; i < nf_artifact_n_tensors(x); i++) {
        const nf_tensor *t = nf_artifact_tensor(x, i), *u = nf_artifact_find_tensor(y, t->desc.name);
        CHECK(u && u->layout.payload_bytes == t->layout.payload_bytes);
        if (!strstr(t->desc.name, "norm") && u)
            CHECK_MSG(memcmp(t->data, u->data, t->layout.payload_bytes) != 0, "%s: seeds 7 and 8 give the same bytes",
                      t->desc.name);
    }
    nf_artifact_close(x);
    nf_artifact_close(y);
    free(A);
    free(B);
    free(C);
    unlink(a);
    unlink(b);
    unlink(c);
}

/* Order-independent digest of the decoded values of rows [r0, r0 + n), block by block (sum of the
 * FNV-1a of each block's floats): equal for two row ranges holding the same blocks in any order. */
static uint64_t block_multiset(const nf_tensor *t, uint64_t r0, uint64_t n)
{
    const uint64_t C = t->layout.cols;
    const size_t be = t->desc.codec == NF_CODEC_NVFP4 ? 16 : t->codec->block_elems;
    float *y = malloc(C * sizeof *y);
    nf_nvfp4_planes p;
    if (t->desc.codec == NF_CODEC_NVFP4)
        nf_nvfp4_view(t->data, t->layout.payload_bytes, t->layout.rows, C, t->desc.divisors, &p, NULL);
    uint64_t s = 0;
    for (uint64_t r = r0; r < r0 + n; r++) {
        if (t->desc.codec == NF_CODEC_NVFP4) nf_nvfp4_dequantize_row(&p, r, y);
        else t->codec->dequantize_row(t->data + r * nf_codec_row_bytes(t->codec, C), y, C);
        for (uint64_t k = 0; k < C; k += be) s += nf_fnv1a64(y + k, be * sizeof *y);
    }
    free(y);
    return s;
}

static void test_experts(const char *recipe)
{
    const char *a = tmp("perm.nf"), *b = tmp("fresh.nf");
    if (!write_synth(a, "tiny", recipe, 11, 2, 0) || !write_synth(b, "tiny", recipe, 11, 2, 1)) return;
    nf_artifact *x, *y;
    CHECK(nf_artifact_open(a, &x, NULL) == NF_OK && nf_artifact_open(b, &y, NULL) == NF_OK);
    const char *banks[] = {"blk.0.ffn_gate_up_exps", "blk.1.ffn_down_exps"};
    for (int k = 0; k < 2; k++) {
        const nf_tensor *t = nf_artifact_find_tensor(x, banks[k]), *u = nf_artifact_find_tensor(y, banks[k]);
        const uint64_t E = t->desc.dims[0], R = t->desc.dims[1], C = t->desc.dims[2];
        /* an expert's data bytes (nvfp4: its rows of the data plane, [E*R][C/2]) */
        const size_t eb = t->desc.codec == NF_CODEC_NVFP4 ? (size_t)(R * C / 2)
                                                          : (size_t)(R * nf_codec_row_bytes(t->codec, C));
        CHECK_MSG(memcmp(t->data, u->data, eb) == 0, "%s %s: expert 0 differs from --fresh's", recipe, banks[k]);
        const uint64_t ms0 = block_multiset(t, 0, R);
        for (uint64_t e = 1; e < E; e++) {
            CHECK_MSG(block_multiset(t, e * R, R) == ms0, "%s %s: expert %llu's decoded blocks are not expert 0's",
                      recipe, banks[k], (unsigned long long)e);
            CHECK_MSG(block_multiset(u, e * R, R) != ms0, "%s %s: --fresh expert %llu repeats expert 0", recipe, banks[k],
                      (unsigned long long)e);
            for (uint64_t f = 0; f < e; f++)
                CHECK_MSG(memcmp(t->data + e * eb, t->data + f * eb, eb) != 0, "%s %s: experts %llu and %llu are "
                          "byte-identical", recipe, banks[k], (unsigned long long)e, (unsigned long long)f);
        }
    }
    nf_artifact_close(x);
    nf_artifact_close(y);
    unlink(a);
    unlink(b);
}

static void test_errors(void)
{
    const char *p = tmp("bad.nf");
    nf_synth_opts o = {.geometry = "gpt5", .recipe = "bf16", .quiet = 1};
    nf_error e;
    CHECK(nf_synth_write(p, &o, NULL, &e) == NF_ERR_INVALID_ARG);
    CHECK_CONTAINS(e.msg, "unknown geometry 'gpt5'");
    o.geometry = "tiny";
    o.recipe = "q3q3";
    CHECK(nf_synth_write(p, &o, NULL, &e) == NF_ERR_INVALID_ARG);
    CHECK_CONTAINS(e.msg, "unknown recipe 'q3q3'");
    o.recipe = "bf16";
    o.vocab = 100;
    CHECK(nf_synth_write(p, &o, NULL, &e) == NF_ERR_INVALID_ARG);
    CHECK_CONTAINS(e.msg, "vocab 100");
    CHECK(access(p, F_OK) != 0);
    nf_codec_id c;
    CHECK(nf_synth_codec("bf16", "blk.0.attn_qq", 2, 8, 0, 256, &c, NULL, &e) == NF_ERR_INVALID_ARG);
    CHECK_CONTAINS(e.msg, "blk.0.attn_qq");
}

int main(void)
{
    nf_log_set_level(NF_LOG_ERROR); /* the converter warns about every fallback of the 64-wide fixtures */
    snprintf(tmpdir, sizeof tmpdir, "/tmp/nf_test_synth_%d", (int)getpid());
    char cmd[300];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", tmpdir);
    if (system(cmd) != 0) return 1;
    test_roles_vs_converter();
    test_geometry("tiny");
    test_geometry("tiny-qwen2");
    test_geometry("tiny-hybrid");
    test_determinism();
    for (int r = 0; r < NREC; r++) test_experts(recipes[r]);
    test_errors();
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) return 1;
    return nf_test_report();
}

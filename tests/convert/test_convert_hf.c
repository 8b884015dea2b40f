/* ninfer convert on Hugging Face fixtures: tiny transformers checkpoints (tests/oracle/tiny_models.py)
 * and compressed-tensors / ModelOpt NVFP4 checkpoints (tests/oracle/convert_fixtures.py). Every
 * artifact tensor is decoded and compared with the oracle: the source safetensors values (bf16,
 * bit-exact), compressed-tensors' float32 dequantization (nvfp4, bit-exact), the q8_0 error bound
 * for re-encoded tensors; the plan's stacking, divisors, allow_a4 and unified input divisors; and
 * every refusal. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codec/nvfp4.h"
#include "convert/convert.h"
#include "convert/plan.h"
#include "format/artifact.h"
#include "nf_test.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation" /* fixture names are short */
#endif

static char tmpdir[256];

/* Row r of an artifact tensor decoded to f32. */
static void art_row(const nf_tensor *t, uint64_t r, float *y)
{
    uint64_t cols = t->layout.cols;
    if (t->desc.codec == NF_CODEC_NVFP4) {
        nf_nvfp4_planes p;
        nf_nvfp4_view(t->data, t->layout.payload_bytes, t->layout.rows, cols, t->desc.divisors ? t->desc.divisors : 1, &p,
                      NULL);
        nf_nvfp4_dequantize_row(&p, r, y);
        return;
    }
    size_t rb = nf_codec_row_bytes(t->codec, cols);
    t->codec->dequantize_row(t->data + r * rb, y, cols);
}

/* Row r of a safetensors float tensor (any leading dims flattened). */
static void st_row(const nf_st_tensor *s, uint64_t r, float *y)
{
    uint64_t cols = s->shape[s->n_dims - 1];
    const uint8_t *b = s->data;
    for (uint64_t k = 0; k < cols; k++) {
        uint64_t i = r * cols + k;
        if (s->dtype == NF_ST_F32) memcpy(&y[k], b + 4 * i, 4);
        else {
            uint16_t h;
            memcpy(&h, b + 2 * i, 2);
            y[k] = s->dtype == NF_ST_BF16 ? nf_bf16_to_f32(h) : nf_f16_to_f32(h);
        }
    }
}

static nf_status convert(const char *src, const char *recipe, int requantize, const char *out, nf_error *err)
{
    nf_convert_opts o = {recipe, requantize, 2, 1};
    nf_plan p;
    nf_status s = nf_plan_build(src, &o, &p, err);
    if (s == NF_OK) s = nf_convert_run(&p, out, &o, NULL, err);
    nf_plan_free(&p);
    return s;
}

/* The artifact rows of `name` starting at row0 equal the source key's rows exactly (or within
 * `tol` x the row's amax / 127 for q8_0). */
static int rows_match(const nf_artifact *a, const char *name, uint64_t row0, const nf_st_tensor *s, double tol)
{
    const nf_tensor *t = nf_artifact_find_tensor(a, name);
    if (!t) return 0;
    uint64_t cols = s->shape[s->n_dims - 1], rows = s->n_elems / cols;
    if (cols != t->layout.cols) return 0;
    float *x = malloc(cols * sizeof *x), *y = malloc(cols * sizeof *y);
    int ok = 1;
    for (uint64_t r = 0; r < rows && ok; r++) {
        st_row(s, r, x);
        art_row(t, row0 + r, y);
        for (uint64_t k = 0; k < cols && ok; k += 32) {
            float amax = 0;
            for (uint64_t i = k; i < k + 32 && i < cols; i++) amax = fmaxf(amax, fabsf(x[i]));
            for (uint64_t i = k; i < k + 32 && i < cols; i++)
                ok = tol == 0 ? memcmp(&x[i], &y[i], 4) == 0 : fabs((double)x[i] - y[i]) <= tol * amax / 127 + 1e-7;
        }
    }
    free(x);
    free(y);
    return ok;
}

static void check_qwen3(const char *dir, const char *recipe, double tol)
{
    char out[512];
    snprintf(out, sizeof out, "%s/q3-%s.nf", tmpdir, recipe);
    nf_error err = {0};
    CHECK_MSG(convert(dir, recipe, 0, out, &err) == NF_OK, "%s", err.msg);
    nf_artifact *a = NULL;
    CHECK_MSG(nf_artifact_open(out, &a, &err) == NF_OK, "%s", err.msg);
    nf_st_set *st = NULL;
    char src[512];
    snprintf(src, sizeof src, NF_TEST_DATA "/fixtures/models/qwen3_moe");
    CHECK(nf_st_set_open(src, &st, &err) == NF_OK);
    if (!a || !st) return;
    CHECK(rows_match(a, "token_embd", 0, nf_st_set_find(st, "model.embed_tokens.weight"), tol));
    CHECK(rows_match(a, "output", 0, nf_st_set_find(st, "lm_head.weight"), tol));
    CHECK(rows_match(a, "output_norm", 0, nf_st_set_find(st, "model.norm.weight"), 0));
    char key[256], name[64];
    for (int l = 0; l < 2; l++) {
        static const char *const attn[][2] = {{"attn_q", "q_proj"}, {"attn_k", "k_proj"}, {"attn_v", "v_proj"},
                                              {"attn_output", "o_proj"}};
        for (int i = 0; i < 4; i++) {
            snprintf(key, sizeof key, "model.layers.%d.self_attn.%s.weight", l, attn[i][1]);
            snprintf(name, sizeof name, "blk.%d.%s", l, attn[i][0]);
            CHECK_MSG(rows_match(a, name, 0, nf_st_set_find(st, key), tol), "%s", name);
        }
        snprintf(key, sizeof key, "model.layers.%d.self_attn.q_norm.weight", l);
        snprintf(name, sizeof name, "blk.%d.attn_q_norm", l);
        CHECK(rows_match(a, name, 0, nf_st_set_find(st, key), 0));
        snprintf(key, sizeof key, "model.layers.%d.mlp.gate.weight", l);
        snprintf(name, sizeof name, "blk.%d.ffn_gate_inp", l);
        CHECK(rows_match(a, name, 0, nf_st_set_find(st, key), 0)); /* router stays exact (f32) */
        for (int j = 0; j < 8; j++) { /* stacking: expert j's gate rows, then its up rows */
            snprintf(name, sizeof name, "blk.%d.ffn_gate_up_exps", l);
            snprintf(key, sizeof key, "model.layers.%d.mlp.experts.%d.gate_proj.weight", l, j);
            CHECK_MSG(rows_match(a, name, (uint64_t)j * 64, nf_st_set_find(st, key), tol), "%s", key);
            snprintf(key, sizeof key, "model.layers.%d.mlp.experts.%d.up_proj.weight", l, j);
            CHECK_MSG(rows_match(a, name, (uint64_t)j * 64 + 32, nf_st_set_find(st, key), tol), "%s", key);
            snprintf(name, sizeof name, "blk.%d.ffn_down_exps", l);
            snprintf(key, sizeof key, "model.layers.%d.mlp.experts.%d.down_proj.weight", l, j);
            CHECK_MSG(rows_match(a, name, (uint64_t)j * 64, nf_st_set_find(st, key), tol), "%s", key);
        }
    }
    uint32_t v;
    CHECK(nf_artifact_get_u32(a, "model.experts", &v, NULL) == NF_OK && v == 8);
    CHECK(nf_artifact_get_u32(a, "model.head_dim", &v, NULL) == NF_OK && v == 32);
    const int32_t *moe;
    size_t n;
    CHECK(nf_artifact_get_i32_array(a, "model.moe_layers", &moe, &n, NULL) == NF_OK && n == 2 && moe[0] == 1);
    CHECK(nf_artifact_find_meta(a, "tokenizer.tokens") == NULL); /* no tokenizer.json: none */
    nf_st_set_close(st);
    nf_artifact_close(a);
}

/* Per-expert and fused expert keys give byte-identical artifacts tensor by tensor. */
static void check_fused(void)
{
    char a1[512], a2[512];
    snprintf(a1, sizeof a1, "%s/q3-bf16.nf", tmpdir);
    snprintf(a2, sizeof a2, "%s/q3f.nf", tmpdir);
    nf_error err = {0};
    CHECK_MSG(convert(NF_TEST_DATA "/fixtures/models/qwen3_moe_fused", "bf16", 0, a2, &err) == NF_OK, "%s", err.msg);
    nf_artifact *x = NULL, *y = NULL;
    CHECK(nf_artifact_open(a1, &x, NULL) == NF_OK && nf_artifact_open(a2, &y, NULL) == NF_OK);
    if (!x || !y) return;
    CHECK_EQ_U64(nf_artifact_n_tensors(x), nf_artifact_n_tensors(y));
    for (size_t i = 0; i < nf_artifact_n_tensors(x); i++) {
        const nf_tensor *t = nf_artifact_tensor(x, i), *u = nf_artifact_find_tensor(y, t->desc.name);
        CHECK_MSG(u && u->layout.payload_bytes == t->layout.payload_bytes &&
                      memcmp(u->data, t->data, t->layout.payload_bytes) == 0, "%s", t->desc.name);
    }
    nf_artifact_close(x);
    nf_artifact_close(y);
}

static void check_other_archs(void)
{
    nf_error err = {0};
    char out[512];
    snprintf(out, sizeof out, "%s/q2.nf", tmpdir);
    CHECK_MSG(convert(NF_TEST_DATA "/fixtures/models/qwen2_moe", "bf16", 0, out, &err) == NF_OK, "%s", err.msg);
    nf_artifact *a = NULL;
    nf_st_set *st = NULL;
    CHECK(nf_artifact_open(out, &a, NULL) == NF_OK);
    CHECK(nf_st_set_open(NF_TEST_DATA "/fixtures/models/qwen2_moe", &st, NULL) == NF_OK);
    if (a && st) {
        CHECK(nf_artifact_find_tensor(a, "output") == NULL); /* tied */
        CHECK(nf_artifact_find_tensor(a, "blk.1.ffn_gate") && nf_artifact_find_tensor(a, "blk.1.ffn_up"));
        CHECK(nf_artifact_find_tensor(a, "blk.1.ffn_gate_up_exps") == NULL); /* mlp_only_layers=[1] */
        CHECK(rows_match(a, "blk.0.ffn_gate_up_shexp", 0,
                         nf_st_set_find(st, "model.layers.0.mlp.shared_expert.gate_proj.weight"), 0));
        CHECK(rows_match(a, "blk.0.ffn_gate_up_shexp", 48,
                         nf_st_set_find(st, "model.layers.0.mlp.shared_expert.up_proj.weight"), 0));
        CHECK(rows_match(a, "blk.2.ffn_gate_inp_shexp", 0,
                         nf_st_set_find(st, "model.layers.2.mlp.shared_expert_gate.weight"), 0));
        CHECK(rows_match(a, "blk.0.attn_q_bias", 0, nf_st_set_find(st, "model.layers.0.self_attn.q_proj.bias"), 0));
        const int32_t *moe;
        size_t n;
        CHECK(nf_artifact_get_i32_array(a, "model.moe_layers", &moe, &n, NULL) == NF_OK && n == 3 && moe[0] == 1 &&
              moe[1] == 0 && moe[2] == 1);
    }
    nf_st_set_close(st);
    nf_artifact_close(a);
    snprintf(out, sizeof out, "%s/llama.nf", tmpdir);
    CHECK_MSG(convert(NF_TEST_DATA "/fixtures/models/llama", "q8q8", 0, out, &err) == NF_OK, "%s", err.msg);
}

/* ---- NVFP4 sources ---------------------------------------------------------------------------- */

static float exp_scalar(const nf_st_set *e, const char *m, const char *sfx)
{
    char key[256];
    snprintf(key, sizeof key, "%s.%s", m, sfx);
    const nf_st_tensor *t = nf_st_set_find(e, key);
    float v = NAN;
    if (t) memcpy(&v, t->data, 4);
    return v;
}

/* An NVFP4 source converted keeping its codecs to tmpdir/<name>, opened with the oracle's expected values
 * (fixtures/convert/<expected>); 0 when either is missing (failed CHECKs). */
static int convert_nvfp4(const char *dir, const char *name, const char *expected, nf_artifact **a, nf_st_set **e)
{
    char out[512], exp_path[512];
    snprintf(out, sizeof out, "%s/%s", tmpdir, name);
    snprintf(exp_path, sizeof exp_path, "%s/fixtures/convert/%s", NF_TEST_DATA, expected);
    nf_error err = {0};
    *a = NULL, *e = NULL;
    CHECK_MSG(convert(dir, NULL, 0, out, &err) == NF_OK, "%s", err.msg);
    CHECK(nf_artifact_open(out, a, NULL) == NF_OK);
    CHECK(nf_st_set_open(exp_path, e, NULL) == NF_OK);
    return *a && *e;
}

static void check_nvfp4_source(const char *dir, int modelopt)
{
    nf_artifact *a;
    nf_st_set *e;
    if (!convert_nvfp4(dir, modelopt ? "nv1.nf" : "nv0.nf", "expected.safetensors", &a, &e)) return;
    const nf_tensor *gu = nf_artifact_find_tensor(a, "blk.0.ffn_gate_up_exps");
    const nf_tensor *dn = nf_artifact_find_tensor(a, "blk.0.ffn_down_exps");
    CHECK(gu && dn && gu->desc.codec == NF_CODEC_NVFP4 && gu->desc.divisors == 8 && dn->desc.divisors == 4);
    if (!gu || !dn) return;
    CHECK(gu->desc.flags & NF_TENSOR_ALLOW_A4);
    nf_nvfp4_planes p;
    CHECK(nf_nvfp4_view(gu->data, gu->layout.payload_bytes, gu->layout.rows, gu->layout.cols, 8, &p, NULL) == NF_OK);
    float minin = INFINITY;
    char m[256];
    for (int j = 0; j < 4; j++) {
        for (int h = 0; h < 2; h++) {
            snprintf(m, sizeof m, "model.layers.0.mlp.experts.%d.%s", j, h ? "up_proj" : "gate_proj");
            float div;
            memcpy(&div, (const uint8_t *)p.divisors + 4 * (2 * j + h), 4);
            float want = modelopt ? exp_scalar(e, m, "mo_divisor") : exp_scalar(e, m, "global");
            CHECK_MSG(memcmp(&div, &want, 4) == 0, "%s divisor %g want %g", m, (double)div, (double)want);
            minin = fminf(minin, exp_scalar(e, m, "input_global"));
            if (!modelopt) { /* bit-exact against compressed-tensors' dequantization */
                char key[300];
                snprintf(key, sizeof key, "%s.dequant", m);
                CHECK_MSG(rows_match(a, "blk.0.ffn_gate_up_exps", (uint64_t)(2 * j + h) * 128, nf_st_set_find(e, key), 0),
                          "%s", key);
            }
        }
        float dg, du;
        memcpy(&dg, (const uint8_t *)p.divisors + 8 * j, 4);
        memcpy(&du, (const uint8_t *)p.divisors + 8 * j + 4, 4);
        if (j == 1 || j == 3) CHECK_MSG(dg != du, "expert %d: gate and up divisors kept apart", j);
        snprintf(m, sizeof m, "model.layers.0.mlp.experts.%d.down_proj", j);
        float want_in = modelopt ? 1.0f / (1.0f / exp_scalar(e, m, "input_global")) : exp_scalar(e, m, "input_global");
        CHECK(dn->desc.n_input_divisors == 4 && fabsf(dn->desc.input_divisors[j] - want_in) <= 1e-6f * want_in);
    }
    /* one input divisor for the whole gate/up bank: the smallest calibrated one */
    CHECK(gu->desc.n_input_divisors == 1);
    if (gu->desc.n_input_divisors == 1)
        CHECK_MSG(fabsf(gu->desc.input_divisors[0] - minin) <= (modelopt ? 1e-6f * minin : 0), "unified %g want %g",
                  (double)gu->desc.input_divisors[0], (double)minin);
    const nf_tensor *q = nf_artifact_find_tensor(a, "blk.0.attn_q"), *o = nf_artifact_find_tensor(a, "output");
    CHECK(q && q->desc.codec == NF_CODEC_NVFP4 && o && o->desc.codec == NF_CODEC_BF16); /* ignore list stays bf16 */
    if (!modelopt && q) CHECK(rows_match(a, "blk.0.attn_q", 0, nf_st_set_find(e, "model.layers.0.self_attn.q_proj.dequant"), 0));
    nf_st_set_close(e);
    nf_artifact_close(a);
}

/* NVFP4 checkpoints of a Qwen3.5-MoE hybrid (tests/oracle/hybrid_nvfp4_fixture.py; compressed-tensors
 * NVFP4A16 and ModelOpt W4A4 of the same bytes): routed and shared experts and the gated attention in
 * nvfp4 (AllowA4 only where the source has input scales), what the ignore list names (the GDN
 * projections, routers, the shared expert's gate, lm_head) in bf16, the planes bit-exact against
 * compressed-tensors' dequantization. test_oracle_tiny runs both against transformers. */
static void check_nvfp4_hybrid(const char *dir, int modelopt)
{
    nf_artifact *a;
    nf_st_set *e;
    if (!convert_nvfp4(dir, modelopt ? "nvh1.nf" : "nvh0.nf", "expected_hybrid.safetensors", &a, &e)) return;
    static const char *const fp4[] = {"blk.0.ffn_gate_up_exps", "blk.0.ffn_down_exps", "blk.0.ffn_gate_up_shexp",
                                      "blk.1.ffn_down_shexp", "blk.1.attn_q", "blk.1.attn_gate", "blk.1.attn_k",
                                      "blk.1.attn_v", "blk.1.attn_output"};
    static const char *const b16[] = {"blk.0.ssm_qkv", "blk.0.ssm_z", "blk.0.ssm_ba", "blk.0.ssm_out", "output"};
    for (size_t i = 0; i < sizeof fp4 / sizeof fp4[0]; i++) {
        const nf_tensor *t = nf_artifact_find_tensor(a, fp4[i]);
        CHECK_MSG(t && t->desc.codec == NF_CODEC_NVFP4 && !(t->desc.flags & NF_TENSOR_ALLOW_A4) == !modelopt,
                  "%s: nvfp4%s", fp4[i], modelopt ? " with AllowA4" : " without AllowA4");
    }
    for (size_t i = 0; i < sizeof b16 / sizeof b16[0]; i++) {
        const nf_tensor *t = nf_artifact_find_tensor(a, b16[i]);
        CHECK_MSG(t && t->desc.codec == NF_CODEC_BF16, "%s: bf16 (the ignore list)", b16[i]);
    }
    if (!modelopt) { /* ModelOpt's divisor is 1 / weight_scale_2, an ulp off the global scale (its values: test_oracle_tiny) */
        CHECK(rows_match(a, "blk.0.ffn_gate_up_exps", (2 * 2 + 1) * 128,
                         nf_st_set_find(e, "model.layers.0.mlp.experts.2.up_proj.dequant"), 0));
        CHECK(rows_match(a, "blk.1.ffn_down_shexp", 0, nf_st_set_find(e, "model.layers.1.mlp.shared_expert.down_proj.dequant"),
                         0));
    }
    nf_st_set_close(e);
    nf_artifact_close(a);
}

/* ModelOpt and compressed-tensors hold the same packed bytes: the data and scale planes agree. */
static void check_modelopt_planes(void)
{
    char a1[512], a2[512];
    snprintf(a1, sizeof a1, "%s/nv0.nf", tmpdir);
    snprintf(a2, sizeof a2, "%s/nv1.nf", tmpdir);
    nf_artifact *x = NULL, *y = NULL;
    CHECK(nf_artifact_open(a1, &x, NULL) == NF_OK && nf_artifact_open(a2, &y, NULL) == NF_OK);
    if (!x || !y) return;
    const nf_tensor *t = nf_artifact_find_tensor(x, "blk.0.ffn_down_exps"), *u = nf_artifact_find_tensor(y, "blk.0.ffn_down_exps");
    CHECK(t && u && memcmp(t->data, u->data, t->layout.planes[2].offset) == 0);
    nf_artifact_close(x);
    nf_artifact_close(y);
}

/* ---- refusals --------------------------------------------------------------------------------- */

static void expect_refusal(const char *src, const char *recipe, nf_status code, const char *needle1, const char *needle2)
{
    nf_convert_opts o = {recipe, 0, 1, 1};
    nf_plan p;
    nf_error err = {0};
    nf_status s = nf_plan_build(src, &o, &p, &err);
    nf_plan_free(&p);
    CHECK_MSG(s == code, "%s/%s: status %d want %d (%s)", src, recipe ? recipe : "-", (int)s, (int)code, err.msg);
    CHECK_CONTAINS(err.msg, needle1);
    if (needle2) CHECK_CONTAINS(err.msg, needle2);
}

/* A copy of fixture `model` with config.json edited by the sed expression `from` -> `to`. */
static void edited_model(const char *model, const char *dst, const char *from, const char *to)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "rm -rf %s && mkdir -p %s && cp " NF_TEST_DATA "/fixtures/models/%s/model.safetensors %s/ && "
             "sed 's/%s/%s/' " NF_TEST_DATA "/fixtures/models/%s/config.json > %s/config.json",
             dst, dst, model, dst, from, to, model, dst);
    CHECK(system(cmd) == 0);
}

/* A copy of the qwen3_moe fixture with config.json edited by `from` -> `to`. */
static void edited_copy(const char *dst, const char *from, const char *to) { edited_model("qwen3_moe", dst, from, to); }

/* qwen2_moe with "qkv_bias": false (tests/oracle/tiny_models.py's qwen2_moe_nobias, a checkpoint
 * transformers writes without q/k/v biases): converts without bias tensors and model.qkv_bias false;
 * the config and the checkpoint must agree both ways. */
static void check_qkv_bias(void)
{
    char out[512], d[512];
    nf_error err = {0};
    snprintf(out, sizeof out, "%s/q2nb.nf", tmpdir);
    CHECK_MSG(convert(NF_TEST_DATA "/fixtures/models/qwen2_moe_nobias", "bf16", 0, out, &err) == NF_OK, "%s", err.msg);
    nf_artifact *a = NULL;
    nf_st_set *st = NULL;
    CHECK(nf_artifact_open(out, &a, NULL) == NF_OK);
    CHECK(nf_st_set_open(NF_TEST_DATA "/fixtures/models/qwen2_moe_nobias", &st, NULL) == NF_OK);
    if (a && st) {
        CHECK(nf_st_set_find(st, "model.layers.0.self_attn.q_proj.bias") == NULL); /* the fixture is what it claims */
        int qkv_bias = -1;
        CHECK(nf_artifact_get_bool(a, "model.qkv_bias", &qkv_bias, NULL) == NF_OK && qkv_bias == 0);
        for (int i = 0; i < 3; i++) {
            char n[64];
            snprintf(n, sizeof n, "blk.%d.attn_q_bias", i);
            CHECK_MSG(nf_artifact_find_tensor(a, n) == NULL, "%s", n);
        }
        CHECK(rows_match(a, "blk.0.attn_q", 0, nf_st_set_find(st, "model.layers.0.self_attn.q_proj.weight"), 0));
        CHECK(rows_match(a, "blk.0.ffn_gate_up_shexp", 0,
                         nf_st_set_find(st, "model.layers.0.mlp.shared_expert.gate_proj.weight"), 0));
    }
    nf_st_set_close(st);
    nf_artifact_close(a);
    /* the biased fixture says so in its artifact */
    snprintf(out, sizeof out, "%s/q2b.nf", tmpdir);
    CHECK_MSG(convert(NF_TEST_DATA "/fixtures/models/qwen2_moe", "bf16", 0, out, &err) == NF_OK, "%s", err.msg);
    a = NULL;
    CHECK(nf_artifact_open(out, &a, NULL) == NF_OK);
    int qkv_bias = -1;
    if (a) CHECK(nf_artifact_get_bool(a, "model.qkv_bias", &qkv_bias, NULL) == NF_OK && qkv_bias == 1);
    nf_artifact_close(a);
    /* config promises biases (key absent: Qwen2MoeConfig's default true) the checkpoint lacks */
    snprintf(d, sizeof d, "%s/nb_default", tmpdir);
    edited_model("qwen2_moe_nobias", d, "\"qkv_bias\": false,", "");
    expect_refusal(d, NULL, NF_ERR_FORMAT, "tensor 'model.layers.0.self_attn.q_proj.bias' is missing from the checkpoint",
                   "blk.0.attn_q_bias");
    /* config says no biases, the checkpoint has them: refused rather than dropped */
    snprintf(d, sizeof d, "%s/b_false", tmpdir);
    edited_model("qwen2_moe", d, "\"qkv_bias\": true", "\"qkv_bias\": false");
    expect_refusal(d, NULL, NF_ERR_FORMAT, "tensor 'model.layers.0.self_attn.q_proj.bias' is in the checkpoint",
                   "\"qkv_bias\": false");
}

static void check_refusals(void)
{
    expect_refusal(NF_TEST_DATA "/fixtures/convert/ct_nvfp4", "q8q8", NF_ERR_REFUSED, "blk.0.attn_q", "--requantize");
    expect_refusal(NF_TEST_DATA "/fixtures/convert/modelopt_nvfp4", "bf16", NF_ERR_REFUSED, "NVFP4", "--requantize");
    expect_refusal(NF_TEST_DATA "/fixtures/models/qwen3_moe", "nvfp4", NF_ERR_REFUSED, "blk.0.ffn_gate_up_exps",
                   "128-row");
    expect_refusal(NF_TEST_DATA "/fixtures/models/qwen3_moe", "q9", NF_ERR_INVALID_ARG, "unknown recipe", "q9");
    char d[512];
    snprintf(d, sizeof d, "%s/arch", tmpdir);
    edited_copy(d, "\"qwen3_moe\"", "\"mistral\"");
    expect_refusal(d, NULL, NF_ERR_UNSUPPORTED, "mistral", "qwen3_moe");
    snprintf(d, sizeof d, "%s/layers", tmpdir);
    edited_copy(d, "\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3");
    expect_refusal(d, NULL, NF_ERR_FORMAT, "model.layers.2.input_layernorm.weight", "missing");
    snprintf(d, sizeof d, "%s/shape", tmpdir);
    edited_copy(d, "\"moe_intermediate_size\": 32", "\"moe_intermediate_size\": 16");
    expect_refusal(d, NULL, NF_ERR_FORMAT, "experts.0.gate_proj.weight", "config.json implies [16, 64]");
    /* --requantize lets an NVFP4 source through a non-NVFP4 recipe, re-encoded from its values */
    char out[512];
    snprintf(out, sizeof out, "%s/rq.nf", tmpdir);
    nf_error err = {0};
    CHECK_MSG(convert(NF_TEST_DATA "/fixtures/convert/ct_nvfp4", "bf16", 1, out, &err) == NF_OK, "%s", err.msg);
    nf_artifact *a = NULL;
    nf_st_set *e = NULL;
    CHECK(nf_artifact_open(out, &a, NULL) == NF_OK);
    CHECK(nf_st_set_open(NF_TEST_DATA "/fixtures/convert/expected.safetensors", &e, NULL) == NF_OK);
    /* e2m1 * e4m3 / divisor rounded to bf16: within bf16's half-ulp (2^-9 relative) */
    if (a && e)
        CHECK(rows_match(a, "blk.0.ffn_down_exps", 256,
                         nf_st_set_find(e, "model.layers.0.mlp.experts.1.down_proj.dequant"), 127.0 / 256));
    nf_st_set_close(e);
    nf_artifact_close(a);
}

/* The hybrids' MTP block (docs/hybrid.md "MTP"): qwen3_next's mtp.* keys land under their schema names
 * with their values (mtp.fc's rows as they are, the zero-centred norms as 1 + w, the layer's experts
 * and q_proj split like a main layer's); a second MTP layer is refused by name. */
static void check_mtp(void)
{
    char out[512], d[768], cmd[2048];
    nf_error err = {0};
    const char *src = NF_TEST_DATA "/fixtures/models/qwen3_next";
    snprintf(out, sizeof out, "%s/mtp.nf", tmpdir);
    CHECK_MSG(convert(src, "bf16", 0, out, &err) == NF_OK, "%s", err.msg);
    nf_artifact *a = NULL;
    nf_st_set *st = NULL;
    CHECK(nf_artifact_open(out, &a, NULL) == NF_OK);
    CHECK(nf_st_set_open(src, &st, NULL) == NF_OK);
    if (a && st) {
        CHECK(rows_match(a, "mtp.fc", 0, nf_st_set_find(st, "mtp.fc.weight"), 0));
        CHECK(rows_match(a, "mtp.blk.0.attn_k", 0, nf_st_set_find(st, "mtp.layers.0.self_attn.k_proj.weight"), 0));
        CHECK(rows_match(a, "mtp.blk.0.ffn_gate_up_exps", 0,
                         nf_st_set_find(st, "mtp.layers.0.mlp.experts.0.gate_proj.weight"), 0));
        CHECK(rows_match(a, "mtp.blk.0.ffn_gate_up_exps", 16, nf_st_set_find(st, "mtp.layers.0.mlp.experts.0.up_proj.weight"), 0));
        static const char *const norms[][2] = {{"mtp.norm_embd", "mtp.pre_fc_norm_embedding.weight"},
                                               {"mtp.norm_hidden", "mtp.pre_fc_norm_hidden.weight"},
                                               {"mtp.output_norm", "mtp.norm.weight"},
                                               {"mtp.blk.0.attn_norm", "mtp.layers.0.input_layernorm.weight"}};
        for (int i = 0; i < 4; i++) {
            const nf_tensor *t = nf_artifact_find_tensor(a, norms[i][0]);
            const nf_st_tensor *w = nf_st_set_find(st, norms[i][1]);
            float x[64], y[64];
            CHECK_MSG(t && w && t->layout.cols == 64 && w->n_elems == 64, "%s", norms[i][0]);
            if (!t || !w || t->layout.cols != 64 || w->n_elems != 64) continue;
            art_row(t, 0, x);
            st_row(w, 0, y);
            int same = 1;
            for (int k = 0; k < 64; k++) same &= x[k] == 1.0f + y[k];
            CHECK_MSG(same, "%s is not 1 + %s", norms[i][0], norms[i][1]);
        }
    }
    if (a) CHECK(nf_artifact_find_tensor(a, "mtp.blk.0.attn_gate") && nf_artifact_find_tensor(a, "mtp.blk.0.ffn_gate_inp"));
    nf_st_set_close(st);
    nf_artifact_close(a);
    /* a second MTP layer: the fixture's keys through an index, one more in a file of its own */
    snprintf(d, sizeof d, "%s/mtp2", tmpdir);
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s && cp %s/model.safetensors %s/part1.safetensors && cp %s/config.json %s/",
             d, d, src, d, src, d);
    CHECK(system(cmd) == 0);
    st = NULL;
    CHECK(nf_st_set_open(src, &st, NULL) == NF_OK);
    snprintf(cmd, sizeof cmd, "%s/model.safetensors.index.json", d);
    FILE *f = fopen(cmd, "w");
    if (f && st) {
        fprintf(f, "{\"metadata\": {}, \"weight_map\": {\"mtp.layers.1.input_layernorm.weight\": \"extra.safetensors\"");
        for (size_t i = 0; i < nf_st_set_count(st); i++)
            fprintf(f, ", \"%s\": \"part1.safetensors\"", nf_st_set_at(st, i)->name);
        fprintf(f, "}}\n");
    }
    if (f) fclose(f);
    nf_st_set_close(st);
    snprintf(cmd, sizeof cmd, "%s/extra.safetensors", d);
    if ((f = fopen(cmd, "wb"))) {
        char hdr[128];
        int n = snprintf(hdr, sizeof hdr, "{\"mtp.layers.1.input_layernorm.weight\":{\"dtype\":\"F32\",\"shape\":[64],"
                         "\"data_offsets\":[0,256]}}");
        while (n % 8) hdr[n++] = ' ';
        const uint64_t len = (uint64_t)n;
        const float zero[64] = {0};
        fwrite(&len, 8, 1, f), fwrite(hdr, 1, (size_t)n, f), fwrite(zero, 4, 64, f);
        fclose(f);
    }
    expect_refusal(d, NULL, NF_ERR_UNSUPPORTED, "mtp.layers.1.input_layernorm.weight", "more than one MTP layer");
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/nf_convert_test.XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    check_qwen3(NF_TEST_DATA "/fixtures/models/qwen3_moe", "bf16", 0);
    check_qwen3(NF_TEST_DATA "/fixtures/models/qwen3_moe", "q8q8", 1.0);
    check_fused();
    check_other_archs();
    check_nvfp4_source(NF_TEST_DATA "/fixtures/convert/ct_nvfp4", 0);
    check_nvfp4_source(NF_TEST_DATA "/fixtures/convert/modelopt_nvfp4", 1);
    check_nvfp4_hybrid(NF_TEST_DATA "/fixtures/convert/ct_nvfp4_hybrid", 0);
    check_nvfp4_hybrid(NF_TEST_DATA "/fixtures/convert/modelopt_nvfp4_hybrid", 1);
    check_modelopt_planes();
    check_refusals();
    check_qkv_bias();
    check_mtp();
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) return 1;
    return nf_test_report();
}

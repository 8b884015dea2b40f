/* Model config from artifact metadata and shape-checked tensor lookups (docs/model_schema.md). */
#include "model/model.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *nf_arch_name(nf_arch a)
{
    switch (a) {
    case NF_ARCH_QWEN3_MOE: return "qwen3_moe";
    case NF_ARCH_QWEN2_MOE: return "qwen2_moe";
    case NF_ARCH_LLAMA: return "llama";
    case NF_ARCH_QWEN3_NEXT: return "qwen3_next";
    case NF_ARCH_QWEN3_5_MOE: return "qwen3_5_moe";
    }
    return "?";
}

/* ---- metadata ---------------------------------------------------------------------------------- */

/* An integer key that must exist and fit in u32 (and be >= min). */
static nf_status get_u32(const nf_artifact *a, const char *key, uint32_t min, uint32_t *v, nf_error *err)
{
    int64_t x;
    nf_status st = nf_artifact_get_int(a, key, &x, err);
    if (st) return st;
    if (x < (int64_t)min || x > UINT32_MAX)
        return nf_error_set(err, NF_ERR_FORMAT, "%s: metadata '%s' is %" PRId64 ", expected %u .. %u",
                            nf_artifact_path(a), key, x, min, UINT32_MAX);
    *v = (uint32_t)x;
    return NF_OK;
}

/* An optional integer key: *v = def when absent. */
static nf_status opt_u32(const nf_artifact *a, const char *key, uint32_t def, uint32_t *v, nf_error *err)
{
    if (!nf_artifact_find_meta(a, key)) {
        *v = def;
        return NF_OK;
    }
    return get_u32(a, key, 0, v, err);
}

/* A real key stored as f32 or f64; def when absent and optional. */
static nf_status get_real(const nf_artifact *a, const char *key, int required, double def, double *v, nf_error *err)
{
    const nf_meta *m = nf_artifact_find_meta(a, key);
    if (!m) {
        if (required) return nf_error_set(err, NF_ERR_FORMAT, "%s: metadata '%s' is missing", nf_artifact_path(a), key);
        *v = def;
        return NF_OK;
    }
    if (m->type == NF_META_F32) *v = m->v.f32;
    else if (m->type == NF_META_F64) *v = m->v.f64;
    else
        return nf_error_set(err, NF_ERR_FORMAT, "%s: metadata '%s' is %s, expected f32 or f64", nf_artifact_path(a),
                            key, nf_meta_type_name(m->type));
    return NF_OK;
}

static nf_status opt_bool(const nf_artifact *a, const char *key, int *v, nf_error *err)
{
    *v = 0;
    if (!nf_artifact_find_meta(a, key)) return NF_OK;
    return nf_artifact_get_bool(a, key, v, err);
}

static nf_status read_arch(const nf_artifact *a, nf_model_config *c, nf_error *err)
{
    const char *s;
    nf_status st = nf_artifact_get_str(a, "model.arch", &s, NULL, err);
    if (st) return st;
    for (int i = 0; i <= NF_ARCH_LAST; i++)
        if (strcmp(s, nf_arch_name((nf_arch)i)) == 0) {
            c->arch = (nf_arch)i;
            return NF_OK;
        }
    return nf_error_set(err, NF_ERR_UNSUPPORTED, "%s: model.arch '%s' is not one of qwen3_moe, qwen2_moe, llama, "
                        "qwen3_next, qwen3_5_moe",
                        nf_artifact_path(a), s);
}

static nf_status read_rope(const nf_artifact *a, nf_model_config *c, nf_error *err)
{
    static const char *names[] = {"none", "linear", "dynamic", "yarn", "llama3"};
    double d;
    nf_status st = get_real(a, "model.rope_theta", 1, 0, &c->rope_theta, err);
    if (st) return st;
    c->rope_scaling = NF_ROPE_SCALING_NONE;
    if (nf_artifact_find_meta(a, "model.rope_scaling")) {
        const char *s;
        if ((st = nf_artifact_get_str(a, "model.rope_scaling", &s, NULL, err))) return st;
        size_t i = 0;
        while (i < 5 && strcmp(s, names[i]) != 0) i++;
        if (i == 5)
            return nf_error_set(err, NF_ERR_UNSUPPORTED,
                                "%s: model.rope_scaling '%s' is not one of none, linear, dynamic, yarn, llama3",
                                nf_artifact_path(a), s);
        c->rope_scaling = (nf_rope_scaling)i;
    }
    if ((st = get_real(a, "model.rope_factor", 0, 1, &d, err))) return st;
    c->rope_factor = (float)d;
    if ((st = opt_u32(a, "model.rope_orig_ctx", 0, &c->rope_orig_ctx, err))) return st;
    if ((st = get_real(a, "model.rope_low_freq_factor", 0, 1, &d, err))) return st;
    c->rope_low_freq_factor = (float)d;
    if ((st = get_real(a, "model.rope_high_freq_factor", 0, 4, &d, err))) return st;
    c->rope_high_freq_factor = (float)d;
    if (!(c->rope_theta > 0) || !(c->rope_factor > 0))
        return nf_error_set(err, NF_ERR_FORMAT, "%s: model.rope_theta %g and model.rope_factor %g must be > 0",
                            nf_artifact_path(a), c->rope_theta, (double)c->rope_factor);
    return NF_OK;
}

static nf_status read_moe_layers(const nf_artifact *a, nf_model_config *c, nf_error *err)
{
    c->moe_layers = calloc(c->layers, 1);
    if (!c->moe_layers) return nf_error_set(err, NF_ERR_NOMEM, "out of memory");
    if (!nf_artifact_find_meta(a, "model.moe_layers")) {
        for (uint32_t l = 0; l < c->layers; l++) c->moe_layers[l] = c->experts > 0;
        return NF_OK;
    }
    const int32_t *v;
    size_t n;
    nf_status st = nf_artifact_get_i32_array(a, "model.moe_layers", &v, &n, err);
    if (st) return st;
    if (n != c->layers)
        return nf_error_set(err, NF_ERR_FORMAT, "%s: model.moe_layers has %zu entries, expected model.layers = %u",
                            nf_artifact_path(a), n, c->layers);
    for (uint32_t l = 0; l < c->layers; l++) {
        if (v[l] != 0 && v[l] != 1)
            return nf_error_set(err, NF_ERR_FORMAT, "%s: model.moe_layers[%u] is %d, expected 0 or 1",
                                nf_artifact_path(a), l, v[l]);
        if (v[l] && !c->experts)
            return nf_error_set(err, NF_ERR_FORMAT, "%s: model.moe_layers[%u] is 1 but model.experts is 0",
                                nf_artifact_path(a), l);
        c->moe_layers[l] = (uint8_t)v[l];
    }
    return NF_OK;
}

static int arch_hybrid(nf_arch a) { return a == NF_ARCH_QWEN3_NEXT || a == NF_ARCH_QWEN3_5_MOE; }

/* The hybrids' keys: which layers are Gated DeltaNet, their sizes, partial rotary, the attention gate. */
static nf_status read_hybrid(const nf_artifact *a, nf_model_config *c, nf_error *err)
{
    c->rope_dim = c->head_dim;
    if (!arch_hybrid(c->arch)) return NF_OK;
    const int32_t *v;
    size_t n;
    nf_status st = nf_artifact_get_i32_array(a, "model.linear_layers", &v, &n, err);
    if (st) return st;
    if (n != c->layers)
        return nf_error_set(err, NF_ERR_FORMAT, "%s: model.linear_layers has %zu entries, expected model.layers = %u",
                            nf_artifact_path(a), n, c->layers);
    if (!(c->linear_layers = calloc(c->layers, 1))) return nf_error_set(err, NF_ERR_NOMEM, "out of memory");
    for (uint32_t l = 0; l < c->layers; l++) {
        if (v[l] != 0 && v[l] != 1)
            return nf_error_set(err, NF_ERR_FORMAT, "%s: model.linear_layers[%u] is %d, expected 0 or 1",
                                nf_artifact_path(a), l, v[l]);
        c->linear_layers[l] = (uint8_t)v[l];
        c->n_linear += (uint32_t)v[l];
    }
    if ((st = get_u32(a, "model.rope_dim", 2, &c->rope_dim, err)) || (st = opt_bool(a, "model.attn_gate", &c->attn_gate, err)) ||
        (st = get_u32(a, "model.ssm_k_heads", 1, &c->ssm_k_heads, err)) ||
        (st = get_u32(a, "model.ssm_v_heads", 1, &c->ssm_v_heads, err)) ||
        (st = get_u32(a, "model.ssm_k_dim", 1, &c->ssm_k_dim, err)) ||
        (st = get_u32(a, "model.ssm_v_dim", 1, &c->ssm_v_dim, err)) || (st = get_u32(a, "model.ssm_conv", 1, &c->ssm_conv, err)))
        return st;
    if (c->ssm_v_heads % c->ssm_k_heads || c->rope_dim % 2 || c->rope_dim > c->head_dim || c->ssm_conv > 64 ||
        (uint64_t)2 * c->ssm_k_heads * c->ssm_k_dim + (uint64_t)c->ssm_v_heads * c->ssm_v_dim > UINT32_MAX / 2)
        return nf_error_set(err, NF_ERR_FORMAT, "%s: hybrid sizes invalid: ssm_v_heads %u must be a multiple of "
                            "ssm_k_heads %u, rope_dim %u even and <= head_dim %u, ssm_conv %u <= 64",
                            nf_artifact_path(a), c->ssm_v_heads, c->ssm_k_heads, c->rope_dim, c->head_dim, c->ssm_conv);
    return NF_OK;
}

static nf_status check_config(const nf_artifact *a, const nf_model_config *c, nf_error *err)
{
    const char *p = nf_artifact_path(a);
    if (c->heads % c->kv_heads)
        return nf_error_set(err, NF_ERR_FORMAT, "%s: model.heads %u is not a multiple of model.kv_heads %u", p,
                            c->heads, c->kv_heads);
    if (c->head_dim % 2)
        return nf_error_set(err, NF_ERR_FORMAT, "%s: model.head_dim %u must be even (RoPE pairs)", p, c->head_dim);
    if (c->experts && (c->top_k < 1 || c->top_k > c->experts || c->moe_inter < 1))
        return nf_error_set(err, NF_ERR_FORMAT, "%s: model.top_k %u / model.moe_inter %u invalid for %u experts", p,
                            c->top_k, c->moe_inter, c->experts);
    if (!(c->rms_eps > 0))
        return nf_error_set(err, NF_ERR_FORMAT, "%s: model.rms_eps %g must be > 0", p, (double)c->rms_eps);
    return NF_OK;
}

nf_status nf_model_read_config(const nf_artifact *a, nf_model_config *c, nf_error *err)
{
    memset(c, 0, sizeof *c);
    double eps;
    nf_status st;
    if ((st = read_arch(a, c, err)) || (st = get_u32(a, "model.hidden", 1, &c->hidden, err)) ||
        (st = get_u32(a, "model.layers", 1, &c->layers, err)) || (st = get_u32(a, "model.heads", 1, &c->heads, err)) ||
        (st = get_u32(a, "model.kv_heads", 1, &c->kv_heads, err)) ||
        (st = get_u32(a, "model.head_dim", 2, &c->head_dim, err)) ||
        (st = get_u32(a, "model.vocab", 1, &c->vocab, err)) || (st = get_real(a, "model.rms_eps", 1, 0, &eps, err)) ||
        (st = read_rope(a, c, err)) || (st = opt_u32(a, "model.max_ctx", 0, &c->max_ctx, err)) ||
        (st = opt_bool(a, "model.tie_embeddings", &c->tie_embeddings, err)) ||
        (st = opt_bool(a, "model.qkv_bias", &c->qkv_bias, err)) ||
        (st = opt_bool(a, "model.qk_norm", &c->qk_norm, err)) ||
        (st = opt_u32(a, "model.dense_inter", 0, &c->dense_inter, err)) ||
        (st = opt_u32(a, "model.experts", 0, &c->experts, err)) ||
        (st = opt_u32(a, "model.top_k", 0, &c->top_k, err)) ||
        (st = opt_u32(a, "model.moe_inter", 0, &c->moe_inter, err)) ||
        (st = opt_u32(a, "model.shared_inter", 0, &c->shared_inter, err)) ||
        (st = opt_bool(a, "model.norm_topk", &c->norm_topk, err)))
        goto fail;
    c->rms_eps = (float)eps;
    if ((st = read_moe_layers(a, c, err)) || (st = read_hybrid(a, c, err)) || (st = check_config(a, c, err))) goto fail;
    return NF_OK;
fail:
    nf_model_config_free(c);
    return st;
}

void nf_model_config_free(nf_model_config *c)
{
    free(c->moe_layers);
    c->moe_layers = NULL;
    free(c->linear_layers);
    c->linear_layers = NULL;
}

/* ---- tensors ----------------------------------------------------------------------------------- */

/* Looks a tensor up and checks its shape (n dims given outermost first; 0 ends the list early).
 * f32_only: the schema stores it as f32 (norms, biases). */
static nf_status want(const nf_model *m, const char *name, int f32_only, const nf_tensor **out, nf_error *err,
                      uint32_t n, uint64_t d0, uint64_t d1, uint64_t d2)
{
    const nf_tensor *t;
    nf_status st = nf_artifact_get_tensor(m->art, name, &t, err);
    if (st) return st;
    const uint64_t want_d[3] = {d0, d1, d2};
    int ok = t->desc.n_dims == n;
    for (uint32_t i = 0; ok && i < n; i++) ok = t->desc.dims[i] == want_d[i];
    if (!ok) {
        char got[96], exp[96];
        nf_tensor_desc e = {.n_dims = n};
        for (uint32_t i = 0; i < n; i++) e.dims[i] = want_d[i];
        return nf_error_set(err, NF_ERR_FORMAT, "%s: tensor '%s' has shape %s, expected %s", nf_artifact_path(m->art),
                            name, nf_tensor_shape_str(&t->desc, got, sizeof got), nf_tensor_shape_str(&e, exp, sizeof exp));
    }
    if (f32_only && t->desc.codec != NF_CODEC_F32)
        return nf_error_set(err, NF_ERR_FORMAT, "%s: tensor '%s' is %s, expected f32", nf_artifact_path(m->art), name,
                            t->codec->name);
    *out = t;
    return NF_OK;
}

#define WANT1(name, f32, out, a) want(m, name, f32, out, err, 1, a, 0, 0)
#define WANT2(name, f32, out, a, b) want(m, name, f32, out, err, 2, a, b, 0)
#define WANT3(name, f32, out, a, b, c) want(m, name, f32, out, err, 3, a, b, c)

static nf_status bind_attention(nf_model *m, const char *pre, nf_model_layer *ly, char *nm, size_t cap, nf_error *err)
{
    const nf_model_config *c = &m->cfg;
    const uint64_t H = c->hidden, q = (uint64_t)c->heads * c->head_dim, kv = (uint64_t)c->kv_heads * c->head_dim;
    nf_status st;
#define N(s) (snprintf(nm, cap, "%s%s", pre, s), nm)
    if ((st = WANT1(N("attn_norm"), 1, &ly->attn_norm, H)) || (st = WANT2(N("attn_q"), 0, &ly->attn_q, q, H)) ||
        (st = WANT2(N("attn_k"), 0, &ly->attn_k, kv, H)) || (st = WANT2(N("attn_v"), 0, &ly->attn_v, kv, H)) ||
        (st = WANT2(N("attn_output"), 0, &ly->attn_output, H, q)) || (st = WANT1(N("ffn_norm"), 1, &ly->ffn_norm, H)))
        return st;
    if (c->qkv_bias && ((st = WANT1(N("attn_q_bias"), 1, &ly->attn_q_bias, q)) ||
                        (st = WANT1(N("attn_k_bias"), 1, &ly->attn_k_bias, kv)) ||
                        (st = WANT1(N("attn_v_bias"), 1, &ly->attn_v_bias, kv))))
        return st;
    if (c->qk_norm && ((st = WANT1(N("attn_q_norm"), 1, &ly->attn_q_norm, c->head_dim)) ||
                       (st = WANT1(N("attn_k_norm"), 1, &ly->attn_k_norm, c->head_dim))))
        return st;
    if (c->attn_gate && (st = WANT2(N("attn_gate"), 0, &ly->attn_gate, q, H))) return st;
    return NF_OK;
}

/* A Gated DeltaNet layer's token mixer and its two norms. */
static nf_status bind_gdn(nf_model *m, const char *pre, nf_model_layer *ly, char *nm, size_t cap, nf_error *err)
{
    const nf_model_config *c = &m->cfg;
    const uint64_t H = c->hidden, conv = nf_model_conv_dim(c), Hv = c->ssm_v_heads, Vd = Hv * c->ssm_v_dim;
    nf_status st;
    ly->is_linear = 1;
    if ((st = WANT1(N("attn_norm"), 1, &ly->attn_norm, H)) || (st = WANT1(N("ffn_norm"), 1, &ly->ffn_norm, H)) ||
        (st = WANT2(N("ssm_qkv"), 0, &ly->ssm_qkv, conv, H)) || (st = WANT2(N("ssm_z"), 0, &ly->ssm_z, Vd, H)) ||
        (st = WANT2(N("ssm_ba"), 0, &ly->ssm_ba, 2 * Hv, H)) ||
        (st = WANT2(N("ssm_conv"), 1, &ly->ssm_conv, conv, c->ssm_conv)) ||
        (st = WANT1(N("ssm_dt_bias"), 1, &ly->ssm_dt_bias, Hv)) || (st = WANT1(N("ssm_a_log"), 1, &ly->ssm_a_log, Hv)) ||
        (st = WANT1(N("ssm_norm"), 1, &ly->ssm_norm, c->ssm_v_dim)) || (st = WANT2(N("ssm_out"), 0, &ly->ssm_out, H, Vd)))
        return st;
    return NF_OK;
}

static nf_status bind_mlp(nf_model *m, const char *pre, int is_moe, nf_model_layer *ly, char *nm, size_t cap,
                          nf_error *err)
{
    const nf_model_config *c = &m->cfg;
    const uint64_t H = c->hidden, E = c->experts, I = c->moe_inter, S = c->shared_inter, D = c->dense_inter;
    nf_status st;
    ly->is_moe = is_moe;
    if (!ly->is_moe) {
        if (!D)
            return nf_error_set(err, NF_ERR_FORMAT, "%s: layer %s is dense but model.dense_inter is 0 or missing",
                                nf_artifact_path(m->art), pre);
        if ((st = WANT2(N("ffn_gate"), 0, &ly->ffn_gate, D, H)) || (st = WANT2(N("ffn_up"), 0, &ly->ffn_up, D, H)) ||
            (st = WANT2(N("ffn_down"), 0, &ly->ffn_down, H, D)))
            return st;
        return NF_OK;
    }
    if ((st = WANT2(N("ffn_gate_inp"), 0, &ly->ffn_gate_inp, E, H)) ||
        (st = WANT3(N("ffn_gate_up_exps"), 0, &ly->ffn_gate_up_exps, E, 2 * I, H)) ||
        (st = WANT3(N("ffn_down_exps"), 0, &ly->ffn_down_exps, E, H, I)))
        return st;
    if (S && ((st = WANT2(N("ffn_gate_up_shexp"), 0, &ly->ffn_gate_up_shexp, 2 * S, H)) ||
              (st = WANT2(N("ffn_down_shexp"), 0, &ly->ffn_down_shexp, H, S)) ||
              (st = WANT1(N("ffn_gate_inp_shexp"), 0, &ly->ffn_gate_inp_shexp, H))))
        return st;
#undef N
    return NF_OK;
}

/* The hybrids' MTP block, present exactly when the artifact has `mtp.fc` (docs/hybrid.md "MTP"). */
static nf_status bind_mtp(nf_model *m, char *nm, size_t cap, nf_error *err)
{
    const nf_model_config *c = &m->cfg;
    const uint64_t H = c->hidden;
    if (!nf_artifact_find_tensor(m->art, "mtp.fc")) return NF_OK;
    if (!c->n_linear)
        return nf_error_set(err, NF_ERR_FORMAT, "%s: tensor 'mtp.fc' in a %s artifact; MTP blocks are read for the "
                            "Gated DeltaNet hybrids only", nf_artifact_path(m->art), nf_arch_name(c->arch));
    nf_status st;
    if ((st = WANT2("mtp.fc", 0, &m->mtp_fc, H, 2 * H)) || (st = WANT1("mtp.norm_embd", 1, &m->mtp_norm_embd, H)) ||
        (st = WANT1("mtp.norm_hidden", 1, &m->mtp_norm_hidden, H)) ||
        (st = WANT1("mtp.output_norm", 1, &m->mtp_output_norm, H)))
        return st;
    if (!(m->mtp = calloc(1, sizeof *m->mtp))) return nf_error_set(err, NF_ERR_NOMEM, "out of memory");
    const int moe = c->experts && nf_artifact_find_tensor(m->art, "mtp.blk.0.ffn_gate_inp") != NULL;
    if ((st = bind_attention(m, "mtp.blk.0.", m->mtp, nm, cap, err)) ||
        (st = bind_mlp(m, "mtp.blk.0.", moe, m->mtp, nm, cap, err)))
        return st;
    return NF_OK;
}

static nf_status bind_all(nf_model *m, nf_error *err)
{
    const nf_model_config *c = &m->cfg;
    nf_status st;
    if ((st = WANT2("token_embd", 0, &m->token_embd, c->vocab, c->hidden)) ||
        (st = WANT1("output_norm", 1, &m->output_norm, c->hidden)))
        return st;
    if (c->tie_embeddings) m->output = m->token_embd;
    else if ((st = WANT2("output", 0, &m->output, c->vocab, c->hidden))) return st;
    m->layers = calloc(c->layers, sizeof *m->layers);
    if (!m->layers) return nf_error_set(err, NF_ERR_NOMEM, "out of memory");
    char nm[64], pre[24];
    for (uint32_t l = 0; l < c->layers; l++) {
        snprintf(pre, sizeof pre, "blk.%u.", l);
        if ((st = c->linear_layers && c->linear_layers[l] ? bind_gdn(m, pre, &m->layers[l], nm, sizeof nm, err)
                                                          : bind_attention(m, pre, &m->layers[l], nm, sizeof nm, err)) ||
            (st = bind_mlp(m, pre, c->moe_layers[l], &m->layers[l], nm, sizeof nm, err)))
            return st;
    }
    return bind_mtp(m, nm, sizeof nm, err);
}

nf_status nf_model_from_artifact(nf_artifact *art, nf_model **out, nf_error *err)
{
    *out = NULL;
    nf_model *m = calloc(1, sizeof *m);
    if (!m) {
        nf_artifact_close(art);
        return nf_error_set(err, NF_ERR_NOMEM, "out of memory");
    }
    m->art = art;
    nf_status st = nf_model_read_config(art, &m->cfg, err);
    if (!st) st = bind_all(m, err);
    if (st) {
        nf_model_free(m);
        return st;
    }
    *out = m;
    return NF_OK;
}

nf_status nf_model_load(const char *path, nf_model **out, nf_error *err)
{
    nf_artifact *a;
    *out = NULL;
    nf_status st = nf_artifact_open(path, &a, err);
    if (st) return st;
    return nf_model_from_artifact(a, out, err);
}

void nf_model_free(nf_model *m)
{
    if (!m) return;
    nf_model_config_free(&m->cfg);
    free(m->layers);
    free(m->mtp);
    nf_artifact_close(m->art);
    free(m);
}

static uint64_t tb(const nf_tensor *t) { return t ? t->layout.payload_bytes : 0; }

uint64_t nf_model_bytes_per_token(const nf_model *m)
{
    const nf_model_config *c = &m->cfg;
    uint64_t b = tb(m->output) + tb(m->output_norm) + tb(m->token_embd) / c->vocab;
    for (uint32_t l = 0; l < c->layers; l++) {
        const nf_model_layer *y = &m->layers[l];
        b += tb(y->attn_norm) + tb(y->ffn_norm) + tb(y->attn_q) + tb(y->attn_k) + tb(y->attn_v) + tb(y->attn_output);
        b += tb(y->attn_q_bias) + tb(y->attn_k_bias) + tb(y->attn_v_bias) + tb(y->attn_q_norm) + tb(y->attn_k_norm);
        b += tb(y->ffn_gate) + tb(y->ffn_up) + tb(y->ffn_down) + tb(y->ffn_gate_inp);
        if (y->is_moe)
            b += (tb(y->ffn_gate_up_exps) + tb(y->ffn_down_exps)) / c->experts * c->top_k;
        b += tb(y->ffn_gate_up_shexp) + tb(y->ffn_down_shexp) + tb(y->ffn_gate_inp_shexp) + tb(y->attn_gate);
        b += tb(y->ssm_qkv) + tb(y->ssm_z) + tb(y->ssm_ba) + tb(y->ssm_conv) + tb(y->ssm_dt_bias) + tb(y->ssm_a_log);
        b += tb(y->ssm_norm) + tb(y->ssm_out);
    }
    return b;
}

/* config.json reader: see hf_config.h for the dialects and defaults. */
#define _POSIX_C_SOURCE 200809L
#include "convert/hf_config.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mapfile.h"

static const char *const arch_names[NF_HF_ARCH_COUNT] = {"qwen3_moe", "qwen2_moe", "llama", "qwen3_next",
                                                          "qwen3_5_moe_text"};

const char *nf_hf_arch_name(nf_hf_arch a) { return (unsigned)a < NF_HF_ARCH_COUNT ? arch_names[a] : "?"; }

int nf_hf_arch_hybrid(nf_hf_arch a) { return a == NF_HF_QWEN3_NEXT || a == NF_HF_QWEN3_5_MOE_TEXT; }

/* A key is absent when missing or JSON null (transformers writes null for "not set"). */
static const cJSON *item(const cJSON *o, const char *key)
{
    const cJSON *j = o ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
    return cJSON_IsNull(j) ? NULL : j;
}

/* Reads an unsigned integer into *out when present; *found says whether it was. */
static nf_status opt_u32(const cJSON *o, const char *key, uint32_t *out, int *found, nf_error *err)
{
    const cJSON *j = item(o, key);
    if (found) *found = j != NULL;
    if (!j) return NF_OK;
    double v = cJSON_IsNumber(j) ? j->valuedouble : -1;
    if (!(v >= 0 && v <= UINT32_MAX && v == floor(v)))
        return nf_error_set(err, NF_ERR_FORMAT, "\"%s\" is not an integer in [0, 4294967295]", key);
    *out = (uint32_t)v;
    return NF_OK;
}

static nf_status req_u32(const cJSON *o, const char *key, uint32_t *out, nf_error *err)
{
    int found;
    nf_status s = opt_u32(o, key, out, &found, err);
    if (s == NF_OK && !found) return nf_error_set(err, NF_ERR_FORMAT, "\"%s\" is missing", key);
    if (s == NF_OK && *out == 0) return nf_error_set(err, NF_ERR_FORMAT, "\"%s\" is 0", key);
    return s;
}

static nf_status opt_double(const cJSON *o, const char *key, double *out, int *found, nf_error *err)
{
    const cJSON *j = item(o, key);
    if (found) *found = j != NULL;
    if (!j) return NF_OK;
    if (!cJSON_IsNumber(j)) return nf_error_set(err, NF_ERR_FORMAT, "\"%s\" is not a number", key);
    *out = j->valuedouble;
    return NF_OK;
}

static nf_status opt_bool(const cJSON *o, const char *key, int *out, nf_error *err)
{
    const cJSON *j = item(o, key);
    if (!j) return NF_OK;
    if (!cJSON_IsBool(j)) return nf_error_set(err, NF_ERR_FORMAT, "\"%s\" is not true or false", key);
    *out = cJSON_IsTrue(j);
    return NF_OK;
}

static nf_status opt_str(const cJSON *o, const char *key, char *out, size_t cap, int *found, nf_error *err)
{
    const cJSON *j = item(o, key);
    if (found) *found = j != NULL;
    if (!j) return NF_OK;
    if (!cJSON_IsString(j) || strlen(j->valuestring) >= cap)
        return nf_error_set(err, NF_ERR_FORMAT, "\"%s\" is not a string of at most %zu characters", key, cap - 1);
    memcpy(out, j->valuestring, strlen(j->valuestring) + 1);
    return NF_OK;
}

/* One value spelled two ways (num_experts / num_local_experts): either, or both if equal. */
static nf_status u32_either(const cJSON *o, const char *a, const char *b, uint32_t *out, int *found, nf_error *err)
{
    uint32_t va = 0, vb = 0;
    int fa = 0, fb = 0;
    nf_status s = opt_u32(o, a, &va, &fa, err);
    if (s == NF_OK) s = opt_u32(o, b, &vb, &fb, err);
    if (s != NF_OK) return s;
    if (fa && fb && va != vb)
        return nf_error_set(err, NF_ERR_FORMAT, "\"%s\" = %u and \"%s\" = %u disagree", a, va, b, vb);
    *found = fa || fb;
    if (*found) *out = fa ? va : vb;
    return NF_OK;
}

/* ---- rope: top-level rope_theta + rope_scaling (transformers 4) or rope_parameters (5) ---- */

static nf_status rope_object(const cJSON *r, const char *what, nf_hf_rope *rope, nf_error *err)
{
    if (!cJSON_IsObject(r)) return nf_error_set(err, NF_ERR_FORMAT, "\"%s\" is not an object", what);
    char type[32] = "";
    int found_type = 0, found_legacy = 0;
    nf_status s = opt_str(r, "rope_type", type, sizeof type, &found_type, err);
    if (s == NF_OK && !found_type) s = opt_str(r, "type", type, sizeof type, &found_legacy, err);
    if (s != NF_OK) return nf_error_prefix(err, "%s", what);
    if (type[0]) {
        if (strcmp(rope->type, "default") && strcmp(rope->type, type))
            return nf_error_set(err, NF_ERR_FORMAT, "rope type '%s' in \"%s\" disagrees with '%s'", type, what,
                                rope->type);
        memcpy(rope->type, type, sizeof type);
    }
    s = opt_double(r, "factor", &rope->factor, NULL, err);
    if (s == NF_OK) s = opt_double(r, "original_max_position_embeddings", &rope->original_max_position, NULL, err);
    if (s == NF_OK) s = opt_double(r, "low_freq_factor", &rope->low_freq_factor, NULL, err);
    if (s == NF_OK) s = opt_double(r, "high_freq_factor", &rope->high_freq_factor, NULL, err);
    if (s != NF_OK) return nf_error_prefix(err, "%s", what);
    return NF_OK;
}

static nf_status read_rope(const cJSON *root, nf_hf_rope *rope, nf_error *err)
{
    memset(rope, 0, sizeof *rope);
    strcpy(rope->type, "default");
    double top = 0, inner = 0;
    int has_top = 0, has_inner = 0;
    nf_status s = opt_double(root, "rope_theta", &top, &has_top, err);
    const cJSON *params = item(root, "rope_parameters"), *scaling = item(root, "rope_scaling");
    if (s == NF_OK && params) {
        s = rope_object(params, "rope_parameters", rope, err);
        if (s == NF_OK) s = opt_double(params, "rope_theta", &inner, &has_inner, err);
        if (s == NF_OK && !has_inner && params->child && cJSON_IsObject(params->child))
            return nf_error_set(err, NF_ERR_UNSUPPORTED, "per-layer-type \"rope_parameters\" ('%s': {...}) are not "
                                "supported", params->child->string);
    }
    if (s == NF_OK && scaling) s = rope_object(scaling, "rope_scaling", rope, err);
    if (s != NF_OK) return s;
    if (has_top && has_inner && top != inner)
        return nf_error_set(err, NF_ERR_FORMAT, "\"rope_theta\" = %g and \"rope_parameters\".rope_theta = %g disagree",
                            top, inner);
    rope->theta = has_inner ? inner : has_top ? top : 10000.0;
    if (!(rope->theta > 0)) return nf_error_set(err, NF_ERR_FORMAT, "rope_theta = %g is not positive", rope->theta);
    return NF_OK;
}

/* ---- the rest ---- */

static nf_status read_arch(const cJSON *root, nf_hf_arch *arch, nf_error *err)
{
    char type[64] = "";
    int found;
    nf_status s = opt_str(root, "model_type", type, sizeof type, &found, err);
    if (s != NF_OK) return s;
    if (!found) return nf_error_set(err, NF_ERR_FORMAT, "\"model_type\" is missing");
    for (int i = 0; i < NF_HF_ARCH_COUNT; i++)
        if (strcmp(type, arch_names[i]) == 0) {
            *arch = (nf_hf_arch)i;
            return NF_OK;
        }
    return nf_error_set(err, NF_ERR_UNSUPPORTED, "unsupported architecture '%s' (supported: qwen3_moe, qwen2_moe, llama, "
                        "qwen3_next, qwen3_5_moe, qwen3_5_moe_text)", type);
}

static nf_status read_attention(const cJSON *root, nf_hf_config *c, nf_error *err)
{
    nf_status s = req_u32(root, "hidden_size", &c->hidden_size, err);
    if (s == NF_OK) s = req_u32(root, "num_hidden_layers", &c->n_layers, err);
    if (s == NF_OK) s = req_u32(root, "num_attention_heads", &c->n_heads, err);
    if (s == NF_OK) s = req_u32(root, "vocab_size", &c->vocab_size, err);
    if (s != NF_OK) return s;
    int found;
    c->n_kv_heads = c->n_heads;
    s = opt_u32(root, "num_key_value_heads", &c->n_kv_heads, NULL, err);
    if (s == NF_OK) s = opt_u32(root, "head_dim", &c->head_dim, &found, err);
    if (s != NF_OK) return s;
    if (!found) {
        if (c->hidden_size % c->n_heads)
            return nf_error_set(err, NF_ERR_FORMAT, "no \"head_dim\", and hidden_size %u is not a multiple of "
                                "num_attention_heads %u", c->hidden_size, c->n_heads);
        c->head_dim = c->hidden_size / c->n_heads;
    }
    if (c->n_kv_heads == 0 || c->n_heads % c->n_kv_heads)
        return nf_error_set(err, NF_ERR_FORMAT, "num_attention_heads %u is not a multiple of num_key_value_heads %u",
                            c->n_heads, c->n_kv_heads);
    if (c->head_dim == 0) return nf_error_set(err, NF_ERR_FORMAT, "\"head_dim\" is 0");
    s = opt_double(root, "rms_norm_eps", &c->rms_eps, &found, err);
    if (s == NF_OK && !found) return nf_error_set(err, NF_ERR_FORMAT, "\"rms_norm_eps\" is missing");
    if (s == NF_OK && !(c->rms_eps > 0))
        return nf_error_set(err, NF_ERR_FORMAT, "rms_norm_eps = %g is not positive", c->rms_eps);
    if (s == NF_OK) s = opt_u32(root, "max_position_embeddings", &c->max_position, NULL, err);
    return s;
}

static nf_status read_mlp_only(const cJSON *root, nf_hf_config *c, nf_error *err)
{
    const cJSON *j = item(root, "mlp_only_layers");
    if (!j) return NF_OK;
    if (!cJSON_IsArray(j)) return nf_error_set(err, NF_ERR_FORMAT, "\"mlp_only_layers\" is not an array");
    size_t n = (size_t)cJSON_GetArraySize(j);
    c->mlp_only_layers = calloc(n ? n : 1, sizeof *c->mlp_only_layers);
    if (!c->mlp_only_layers) return nf_error_set(err, NF_ERR_NOMEM, "out of memory");
    for (const cJSON *x = j->child; x; x = x->next) {
        double v = cJSON_IsNumber(x) ? x->valuedouble : -1;
        if (!(v >= 0 && v < c->n_layers && v == floor(v)))
            return nf_error_set(err, NF_ERR_FORMAT, "\"mlp_only_layers\"[%zu] is not a layer index below %u",
                                c->n_mlp_only, c->n_layers);
        c->mlp_only_layers[c->n_mlp_only++] = (uint32_t)v;
    }
    return NF_OK;
}

static nf_status read_moe(const cJSON *root, nf_hf_config *c, nf_error *err)
{
    int found = 0;
    c->decoder_sparse_step = 1;
    nf_status s = u32_either(root, "num_experts", "num_local_experts", &c->n_experts, &found, err);
    if (s == NF_OK && (!found || c->n_experts == 0))
        return nf_error_set(err, NF_ERR_FORMAT, "\"num_experts\" (or \"num_local_experts\") is missing or 0");
    if (s == NF_OK) s = req_u32(root, "num_experts_per_tok", &c->n_experts_used, err);
    if (s == NF_OK && c->n_experts_used > c->n_experts)
        return nf_error_set(err, NF_ERR_FORMAT, "num_experts_per_tok %u exceeds num_experts %u", c->n_experts_used,
                            c->n_experts);
    if (s == NF_OK) s = req_u32(root, "moe_intermediate_size", &c->moe_intermediate_size, err);
    if (s == NF_OK && (c->arch == NF_HF_QWEN2_MOE || nf_hf_arch_hybrid(c->arch)))
        s = req_u32(root, "shared_expert_intermediate_size", &c->shared_intermediate_size, err);
    c->norm_topk_prob = c->arch == NF_HF_QWEN3_NEXT; /* Qwen3NextConfig's default */
    if (s == NF_OK) s = opt_bool(root, "norm_topk_prob", &c->norm_topk_prob, err);
    if (c->arch == NF_HF_QWEN3_5_MOE_TEXT) c->norm_topk_prob = 1; /* its router always renormalises */
    if (s == NF_OK) s = opt_u32(root, "decoder_sparse_step", &c->decoder_sparse_step, NULL, err);
    if (s == NF_OK && c->decoder_sparse_step == 0) return nf_error_set(err, NF_ERR_FORMAT, "\"decoder_sparse_step\" is 0");
    if (s == NF_OK) s = read_mlp_only(root, c, err);
    return s;
}

/* qwen2_moe: "qkv_bias" (default true); qwen3_moe, llama: "attention_bias" (default false), whose
 * o_proj bias the schema cannot hold, so true is refused. */
static nf_status read_bias(const cJSON *root, nf_hf_config *c, nf_error *err)
{
    if (c->arch == NF_HF_QWEN2_MOE) {
        c->qkv_bias = 1;
        return opt_bool(root, "qkv_bias", &c->qkv_bias, err);
    }
    int attention_bias = 0;
    nf_status s = opt_bool(root, "attention_bias", &attention_bias, err);
    if (s == NF_OK && attention_bias)
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "\"attention_bias\": true (biases on q/k/v/o_proj) is not supported "
                            "for %s", arch_names[c->arch]);
    int mlp_bias = 0; /* llama's gate/up/down biases: the schema has no place for them */
    if (s == NF_OK) s = opt_bool(root, "mlp_bias", &mlp_bias, err);
    if (s == NF_OK && mlp_bias)
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "\"mlp_bias\": true (biases on gate/up/down_proj) is not "
                            "supported for %s", arch_names[c->arch]);
    return s;
}

/* Which layers are Gated DeltaNet: "layer_types", else every layer but each full_attention_interval-th. */
static nf_status read_layer_types(const cJSON *root, nf_hf_config *c, nf_error *err)
{
    c->linear_layers = calloc(c->n_layers, 1);
    if (!c->linear_layers) return nf_error_set(err, NF_ERR_NOMEM, "out of memory");
    const cJSON *j = item(root, "layer_types");
    if (!j) {
        uint32_t every = 4;
        nf_status s = opt_u32(root, "full_attention_interval", &every, NULL, err);
        if (s == NF_OK && every == 0) return nf_error_set(err, NF_ERR_FORMAT, "\"full_attention_interval\" is 0");
        for (uint32_t i = 0; s == NF_OK && i < c->n_layers; i++) c->linear_layers[i] = (i + 1) % every != 0;
        return s;
    }
    if (!cJSON_IsArray(j) || (uint32_t)cJSON_GetArraySize(j) != c->n_layers)
        return nf_error_set(err, NF_ERR_FORMAT, "\"layer_types\" is not an array of num_hidden_layers (%u) strings",
                            c->n_layers);
    uint32_t i = 0;
    for (const cJSON *x = j->child; x; x = x->next, i++) {
        const char *v = cJSON_IsString(x) ? x->valuestring : "";
        if (strcmp(v, "linear_attention") == 0) c->linear_layers[i] = 1;
        else if (strcmp(v, "full_attention") != 0)
            return nf_error_set(err, NF_ERR_UNSUPPORTED, "\"layer_types\"[%u] is '%s', expected linear_attention or "
                                "full_attention", i, v);
    }
    return NF_OK;
}

/* The hybrids' linear-attention sizes and the attention's partial rotary share. */
static nf_status read_hybrid(const cJSON *root, nf_hf_config *c, nf_error *err)
{
    nf_status s = read_layer_types(root, c, err);
    if (s == NF_OK) s = req_u32(root, "linear_num_key_heads", &c->lin_k_heads, err);
    if (s == NF_OK) s = req_u32(root, "linear_num_value_heads", &c->lin_v_heads, err);
    if (s == NF_OK) s = req_u32(root, "linear_key_head_dim", &c->lin_k_dim, err);
    if (s == NF_OK) s = req_u32(root, "linear_value_head_dim", &c->lin_v_dim, err);
    c->conv_kernel = 4;
    if (s == NF_OK) s = opt_u32(root, "linear_conv_kernel_dim", &c->conv_kernel, NULL, err);
    if (s != NF_OK) return s;
    if (c->lin_v_heads % c->lin_k_heads || c->conv_kernel < 1)
        return nf_error_set(err, NF_ERR_FORMAT, "linear_num_value_heads %u is not a multiple of linear_num_key_heads %u, "
                            "or linear_conv_kernel_dim %u < 1", c->lin_v_heads, c->lin_k_heads, c->conv_kernel);
    double top = 0.25, inner = 0.25;
    int has_top = 0, has_inner = 0;
    s = opt_double(root, "partial_rotary_factor", &top, &has_top, err);
    if (s == NF_OK) s = opt_double(item(root, "rope_parameters"), "partial_rotary_factor", &inner, &has_inner, err);
    if (s != NF_OK) return s;
    if (has_top && has_inner && top != inner)
        return nf_error_set(err, NF_ERR_FORMAT, "\"partial_rotary_factor\" %g and rope_parameters' %g disagree", top, inner);
    c->partial_rotary = has_inner ? inner : top;
    double rot = c->partial_rotary * c->head_dim;
    if (!(rot >= 2 && rot <= c->head_dim) || (uint32_t)rot % 2)
        return nf_error_set(err, NF_ERR_FORMAT, "partial_rotary_factor %g of head_dim %u is not an even number of "
                            "dimensions", c->partial_rotary, c->head_dim);
    return NF_OK;
}

/* cJSON finds the first of two equal keys and Python's json keeps the last: refuse the ambiguity. */
static nf_status check_unique_keys(const cJSON *root, nf_error *err)
{
    for (const cJSON *a = root->child; a; a = a->next)
        for (const cJSON *b = a->next; b; b = b->next)
            if (strcmp(a->string, b->string) == 0)
                return nf_error_set(err, NF_ERR_FORMAT, "key \"%s\" appears twice", a->string);
    return NF_OK;
}

/* Whether some layer has a dense MLP (nf_hf_config_layer_is_moe false): no experts (llama), a sparse
 * step above 1 (then layer 0 is dense), or any mlp_only_layers entry (each checked to be a layer).
 * In closed form: asking every layer took num_hidden_layers steps, and 4294967295 layers made a 1 KB
 * config take half a minute to refuse. */
static int has_dense_layer(const nf_hf_config *c)
{
    return c->n_experts == 0 || c->decoder_sparse_step > 1 || c->n_mlp_only > 0;
}

/* The multimodal Qwen3.5 config: the language model's config is "text_config" (its own model_type
 * qwen3_5_moe_text), its weights under model.language_model.; the top level's tie_word_embeddings
 * and dtype govern the whole model. Any other config is itself the language model's. */
static nf_status text_root(const cJSON *top, const cJSON **root, nf_hf_config *c, nf_error *err)
{
    *root = top;
    snprintf(c->prefix, sizeof c->prefix, "model.");
    const cJSON *mt = item(top, "model_type");
    if (!cJSON_IsString(mt) || strcmp(mt->valuestring, "qwen3_5_moe") != 0) return NF_OK;
    const cJSON *tc = item(top, "text_config");
    if (!cJSON_IsObject(tc)) return nf_error_set(err, NF_ERR_FORMAT, "qwen3_5_moe without a \"text_config\" object");
    const cJSON *tt = item(tc, "model_type");
    if (tt && (!cJSON_IsString(tt) || strcmp(tt->valuestring, "qwen3_5_moe_text") != 0))
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "qwen3_5_moe's text_config has model_type '%s', expected "
                            "qwen3_5_moe_text", cJSON_IsString(tt) ? tt->valuestring : "?");
    *root = tc;
    snprintf(c->prefix, sizeof c->prefix, "model.language_model.");
    return NF_OK;
}

static nf_status read_all(const cJSON *top, nf_hf_config *c, nf_error *err)
{
    if (!cJSON_IsObject(top)) return nf_error_set(err, NF_ERR_FORMAT, "not a JSON object");
    if (check_unique_keys(top, err) != NF_OK) return err ? err->code : NF_ERR_FORMAT;
    const cJSON *root;
    nf_status s = text_root(top, &root, c, err);
    if (s == NF_OK && root != top && check_unique_keys(root, err) != NF_OK) return err ? err->code : NF_ERR_FORMAT;
    if (s == NF_OK) s = read_arch(root, &c->arch, err);
    if (s == NF_OK) s = read_attention(root, c, err);
    if (s == NF_OK) s = read_rope(root, &c->rope, err);
    if (s == NF_OK && c->arch != NF_HF_LLAMA) s = read_moe(root, c, err);
    if (s == NF_OK && nf_hf_arch_hybrid(c->arch)) s = read_hybrid(root, c, err);
    int found_i = 0, found_dt = 0;
    if (s == NF_OK) s = opt_u32(root, "intermediate_size", &c->intermediate_size, &found_i, err);
    if (s == NF_OK && has_dense_layer(c) && (!found_i || c->intermediate_size == 0))
        return nf_error_set(err, NF_ERR_FORMAT, "\"intermediate_size\" is missing or 0, and the model has dense MLP layers");
    if (s == NF_OK) s = opt_bool(root, "tie_word_embeddings", &c->tie_word_embeddings, err);
    if (s == NF_OK && root != top) s = opt_bool(top, "tie_word_embeddings", &c->tie_word_embeddings, err);
    if (s == NF_OK) s = read_bias(root, c, err);
    if (s == NF_OK) s = opt_str(top, "dtype", c->dtype, sizeof c->dtype, &found_dt, err);
    if (s == NF_OK && !found_dt) s = opt_str(top, "torch_dtype", c->dtype, sizeof c->dtype, NULL, err);
    return s;
}

nf_status nf_hf_config_parse(const char *json, size_t len, const char *name, nf_hf_config *cfg, nf_error *err)
{
    memset(cfg, 0, sizeof *cfg);
    cJSON *root = cJSON_ParseWithLength(json, len);
    nf_status s = root ? read_all(root, cfg, err) : nf_error_set(err, NF_ERR_FORMAT, "not valid JSON");
    cJSON_Delete(root);
    if (s != NF_OK) {
        nf_hf_config_free(cfg);
        return nf_error_prefix(err, "%s", name);
    }
    return NF_OK;
}

nf_status nf_hf_config_load(const char *path, nf_hf_config *cfg, nf_error *err)
{
    memset(cfg, 0, sizeof *cfg);
    nf_mapped_file f;
    nf_status s = nf_map_file(path, &f, err);
    if (s != NF_OK) return s;
    s = nf_hf_config_parse(f.data ? (const char *)f.data : "", f.size, path, cfg, err);
    nf_unmap_file(&f);
    return s;
}

void nf_hf_config_free(nf_hf_config *cfg)
{
    free(cfg->mlp_only_layers);
    cfg->mlp_only_layers = NULL;
    free(cfg->linear_layers);
    cfg->linear_layers = NULL;
    cfg->n_mlp_only = 0;
}

int nf_hf_config_layer_is_moe(const nf_hf_config *cfg, uint32_t layer)
{
    if (cfg->n_experts == 0 || cfg->decoder_sparse_step == 0 || (layer + 1) % cfg->decoder_sparse_step) return 0;
    for (size_t i = 0; i < cfg->n_mlp_only; i++)
        if (cfg->mlp_only_layers[i] == layer) return 0;
    return 1;
}

/* model.* and provenance.* keys: see modelmeta.h. */
#include "convert/modelmeta.h"

#include <string.h>

#include "ninfer.h"

nf_status nf_convert_model_meta(nf_artifact_writer *w, const nf_model_keys *k, nf_error *err)
{
    nf_status s = nf_artifact_writer_add_str(w, "model.arch", k->arch, err);
#define U32(key, v) \
    if (s == NF_OK) s = nf_artifact_writer_add_u32(w, key, v, err)
#define F32(key, v) \
    if (s == NF_OK) s = nf_artifact_writer_add_f32(w, key, v, err)
#define BOOL(key, v) \
    if (s == NF_OK) s = nf_artifact_writer_add_bool(w, key, v, err)
    U32("model.hidden", k->hidden);
    U32("model.layers", k->layers);
    U32("model.heads", k->heads);
    U32("model.kv_heads", k->kv_heads);
    U32("model.head_dim", k->head_dim);
    U32("model.vocab", k->vocab);
    F32("model.rms_eps", k->rms_eps);
    if (s == NF_OK) s = nf_artifact_writer_add_f64(w, "model.rope_theta", k->rope_theta, err);
    if (s == NF_OK) s = nf_artifact_writer_add_str(w, "model.rope_scaling", k->rope_scaling, err);
    F32("model.rope_factor", k->rope_factor);
    U32("model.rope_orig_ctx", k->rope_orig_ctx);
    if (strcmp(k->rope_scaling, "llama3") == 0) {
        F32("model.rope_low_freq_factor", k->rope_low_freq_factor);
        F32("model.rope_high_freq_factor", k->rope_high_freq_factor);
    }
    U32("model.max_ctx", k->max_ctx);
    BOOL("model.tie_embeddings", k->tie_embeddings);
    BOOL("model.qkv_bias", k->qkv_bias);
    BOOL("model.qk_norm", k->qk_norm);
    U32("model.dense_inter", k->dense_inter);
    U32("model.experts", k->experts);
    U32("model.top_k", k->top_k);
    U32("model.moe_inter", k->moe_inter);
    U32("model.shared_inter", k->shared_inter);
    BOOL("model.norm_topk", k->norm_topk);
    if (k->linear_layers) {
        U32("model.rope_dim", k->rope_dim);
        BOOL("model.attn_gate", k->attn_gate);
        U32("model.ssm_k_heads", k->ssm_k_heads);
        U32("model.ssm_v_heads", k->ssm_v_heads);
        U32("model.ssm_k_dim", k->ssm_k_dim);
        U32("model.ssm_v_dim", k->ssm_v_dim);
        U32("model.ssm_conv", k->ssm_conv);
    }
#undef U32
#undef F32
#undef BOOL
    if (s == NF_OK) s = nf_artifact_writer_add_array(w, "model.moe_layers", NF_META_I32, k->moe_layers, k->layers, err);
    if (s == NF_OK && k->linear_layers)
        s = nf_artifact_writer_add_array(w, "model.linear_layers", NF_META_I32, k->linear_layers, k->layers, err);
    return s;
}

nf_status nf_convert_provenance(nf_artifact_writer *w, const char *source, const char *source_hash,
                                const char *recipe, const char *date, nf_error *err)
{
    nf_status s = nf_artifact_writer_add_str(w, "provenance.source", source, err);
    if (s == NF_OK) s = nf_artifact_writer_add_str(w, "provenance.source_hash", source_hash, err);
    if (s == NF_OK) s = nf_artifact_writer_add_str(w, "provenance.recipe", recipe, err);
    if (s == NF_OK) s = nf_artifact_writer_add_str(w, "provenance.ninfer_version", nf_version(), err);
    if (s == NF_OK && date) s = nf_artifact_writer_add_str(w, "provenance.date", date, err);
    return s;
}

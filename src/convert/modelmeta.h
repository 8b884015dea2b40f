/* The model.* and provenance.* metadata of an artifact (docs/model_schema.md), written in one order
 * by both writers of artifacts: the converter (convert.c, from the source's config) and the
 * synthetic-model generator (synth.c, from a geometry). */
#ifndef NF_CONVERT_MODELMETA_H
#define NF_CONVERT_MODELMETA_H

#include <stdint.h>

#include "base/error.h"
#include "format/artifact.h"

typedef struct nf_model_keys {
    const char *arch;                      /* model.arch: qwen3_moe, qwen2_moe, llama */
    uint32_t hidden, layers, heads, kv_heads, head_dim, vocab;
    float rms_eps;
    double rope_theta;
    const char *rope_scaling;              /* none, linear, yarn, llama3 */
    float rope_factor;                     /* 1 when none */
    uint32_t rope_orig_ctx;                /* 0 when none */
    float rope_low_freq_factor, rope_high_freq_factor; /* stored for llama3 only */
    uint32_t max_ctx;
    int tie_embeddings, qkv_bias, qk_norm;
    uint32_t dense_inter, experts, top_k, moe_inter, shared_inter;
    int norm_topk;
    const int32_t *moe_layers;             /* [layers]: 1 where the layer's MLP is the MoE block */
    /* Gated DeltaNet hybrids (qwen3_next, qwen3_5_moe); linear_layers NULL: none of these keys */
    const int32_t *linear_layers;          /* [layers]: 1 where the layer is Gated DeltaNet */
    uint32_t rope_dim;                     /* rotated dims of each head (partial rotary) */
    int attn_gate;                         /* attention output * sigmoid(attn_gate x) */
    uint32_t ssm_k_heads, ssm_v_heads, ssm_k_dim, ssm_v_dim, ssm_conv;
} nf_model_keys;

nf_status nf_convert_model_meta(nf_artifact_writer *w, const nf_model_keys *k, nf_error *err);

/* provenance.source, .source_hash, .recipe, .ninfer_version, and .date when date is not NULL. */
nf_status nf_convert_provenance(nf_artifact_writer *w, const char *source, const char *source_hash,
                                const char *recipe, const char *date, nf_error *err);

#endif

/* A model: its configuration read from an artifact's `model.*` metadata and its weights as views
 * into the mapped artifact (no copies), looked up and shape-checked once at load, so a forward never
 * meets a missing tensor or a wrong shape. docs/model_schema.md is the contract. */
#ifndef NF_MODEL_MODEL_H
#define NF_MODEL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "format/artifact.h"

typedef enum nf_arch {
    NF_ARCH_QWEN3_MOE = 0,
    NF_ARCH_QWEN2_MOE,
    NF_ARCH_LLAMA,
    NF_ARCH_QWEN3_NEXT,  /* Gated DeltaNet hybrid (docs/hybrid.md) */
    NF_ARCH_QWEN3_5_MOE, /* the same computation, Qwen3.5-MoE's text model */
    NF_ARCH_LAST = NF_ARCH_QWEN3_5_MOE
} nf_arch;

const char *nf_arch_name(nf_arch a);

typedef enum nf_rope_scaling {
    NF_ROPE_SCALING_NONE = 0,
    NF_ROPE_SCALING_LINEAR,
    NF_ROPE_SCALING_DYNAMIC,
    NF_ROPE_SCALING_YARN,
    NF_ROPE_SCALING_LLAMA3,
} nf_rope_scaling;

typedef struct nf_model_config {
    nf_arch arch;
    uint32_t hidden;       /* H */
    uint32_t layers;       /* L */
    uint32_t heads, kv_heads, head_dim;
    uint32_t vocab;
    float rms_eps;
    double rope_theta;
    nf_rope_scaling rope_scaling;
    float rope_factor;
    uint32_t rope_orig_ctx;
    float rope_low_freq_factor, rope_high_freq_factor;
    uint32_t max_ctx;
    int tie_embeddings, qkv_bias, qk_norm;
    uint32_t dense_inter;  /* dense MLP layers' intermediate size (0 when no layer is dense) */
    uint32_t experts;      /* E (0: dense model) */
    uint32_t top_k;
    uint32_t moe_inter;    /* I */
    uint32_t shared_inter; /* S (0: no shared expert) */
    int norm_topk;
    uint8_t *moe_layers;   /* [L] 1: sparse-MoE block, 0: dense MLP (owned) */
    /* Gated DeltaNet hybrids (docs/hybrid.md); zero / NULL for the others */
    uint8_t *linear_layers; /* [L] 1: Gated DeltaNet token mixer, 0: attention (owned; NULL: none) */
    uint32_t n_linear;      /* layers with linear_layers[l] = 1 */
    uint32_t rope_dim;      /* rotated dims at the start of each head (head_dim unless partial rotary) */
    int attn_gate;          /* attention output * sigmoid(attn_gate h), per element, before attn_output */
    uint32_t ssm_k_heads, ssm_v_heads; /* Hk, Hv (Hv % Hk == 0: v head h reads q/k head h / (Hv/Hk)) */
    uint32_t ssm_k_dim, ssm_v_dim;     /* dk, dv */
    uint32_t ssm_conv;                 /* K: the causal depthwise conv's kernel length */
} nf_model_config;

/* Channels of the Gated DeltaNet conv: q, k (Hk*dk each) and v (Hv*dv). */
static inline uint32_t nf_model_conv_dim(const nf_model_config *c)
{
    return 2 * c->ssm_k_heads * c->ssm_k_dim + c->ssm_v_heads * c->ssm_v_dim;
}

/* One decoder layer's tensors (shapes as model_schema.md; NULL when the layer does not have it). */
typedef struct nf_model_layer {
    const nf_tensor *attn_norm, *ffn_norm;           /* [H] f32 */
    const nf_tensor *attn_q;                         /* [heads*hd][H] */
    const nf_tensor *attn_k, *attn_v;                /* [kv_heads*hd][H] */
    const nf_tensor *attn_output;                    /* [H][heads*hd] */
    const nf_tensor *attn_q_bias, *attn_k_bias, *attn_v_bias; /* f32, qkv_bias */
    const nf_tensor *attn_q_norm, *attn_k_norm;      /* [hd] f32, qk_norm */
    const nf_tensor *ffn_gate, *ffn_up;              /* [dense_inter][H], dense layers */
    const nf_tensor *ffn_down;                       /* [H][dense_inter] */
    const nf_tensor *ffn_gate_inp;                   /* [E][H] router */
    const nf_tensor *ffn_gate_up_exps;               /* [E][2I][H] */
    const nf_tensor *ffn_down_exps;                  /* [E][H][I] */
    const nf_tensor *ffn_gate_up_shexp;              /* [2S][H] */
    const nf_tensor *ffn_down_shexp;                 /* [H][S] */
    const nf_tensor *ffn_gate_inp_shexp;             /* [H] */
    const nf_tensor *attn_gate;                      /* [heads*hd][H], attn_gate */
    /* Gated DeltaNet layers (conv_dim = 2*Hk*dk + Hv*dv) */
    const nf_tensor *ssm_qkv;                        /* [conv_dim][H]: q | k | v channels */
    const nf_tensor *ssm_z;                          /* [Hv*dv][H]: the output gate */
    const nf_tensor *ssm_ba;                         /* [2*Hv][H]: b rows (beta), then a rows (decay) */
    const nf_tensor *ssm_conv;                       /* [conv_dim][K] f32 */
    const nf_tensor *ssm_dt_bias, *ssm_a_log;        /* [Hv] f32 */
    const nf_tensor *ssm_norm;                       /* [dv] f32, plain RMSNorm weight */
    const nf_tensor *ssm_out;                        /* [H][Hv*dv] */
    int is_moe, is_linear;
} nf_model_layer;

typedef struct nf_model {
    nf_artifact *art;          /* owned: the mapping every tensor points into */
    nf_model_config cfg;
    const nf_tensor *token_embd;  /* [vocab][H] */
    const nf_tensor *output_norm; /* [H] f32 */
    const nf_tensor *output;      /* [vocab][H]; token_embd when tie_embeddings */
    nf_model_layer *layers;       /* [L] */
    /* The hybrids' MTP block (docs/hybrid.md "MTP"); all NULL when the artifact has none */
    const nf_tensor *mtp_fc;                       /* [H][2H]: columns 0..H-1 the normed embedding, then the hidden */
    const nf_tensor *mtp_norm_embd, *mtp_norm_hidden, *mtp_output_norm; /* [H] f32 (1 + w) */
    nf_model_layer *mtp;                           /* one full-attention layer, `mtp.blk.0.*` */
} nf_model;

/* Opens and validates the artifact at path, reads the config and binds every tensor. Errors name
 * the file and the key or tensor at fault and what was expected. */
nf_status nf_model_load(const char *path, nf_model **out, nf_error *err);
/* The same over an artifact the model takes ownership of (closed on failure too). */
nf_status nf_model_from_artifact(nf_artifact *art, nf_model **out, nf_error *err);
void nf_model_free(nf_model *m);

/* Reads the config alone (cfg->moe_layers malloc'd; free with nf_model_config_free). */
nf_status nf_model_read_config(const nf_artifact *art, nf_model_config *cfg, nf_error *err);
void nf_model_config_free(nf_model_config *cfg);

/* Bytes of the weights one decoded token reads: every dense tensor plus top_k of E experts per MoE
 * layer (and the shared expert), the LM head and one embedding row. For the GB/s figure. */
uint64_t nf_model_bytes_per_token(const nf_model *m);

#endif

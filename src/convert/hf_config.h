/* Reading a Hugging Face config.json into the hyperparameters the converter needs.
 *
 * Two dialects exist and both are read:
 *   published checkpoints (transformers 4): "rope_theta" and "rope_scaling" (null or an object
 *     with "type"/"rope_type", "factor", ...) at top level, "torch_dtype", "num_experts";
 *   transformers 5: "rope_parameters": {"rope_theta", "rope_type", "factor", ...}, "dtype", and
 *     for qwen3_moe "num_local_experts".
 * When both spellings of one value are present they must agree. Keys a config may omit take the
 * transformers class default (num_key_value_heads = num_attention_heads, head_dim = hidden_size /
 * num_attention_heads, rope_theta 10000, decoder_sparse_step 1, norm_topk_prob false (qwen3_next: true;
 * qwen3_5_moe_text always renormalises, whatever the key says),
 * tie_word_embeddings false, qwen2_moe's qkv_bias true); the sizes that define the model are required.
 *
 * Attention biases: qwen2_moe's q/k/v projections carry biases exactly when "qkv_bias" says so
 * (transformers' Qwen2MoeConfig, default true; o_proj never has one). qwen3_moe and llama spell it
 * "attention_bias" (default false) and put a bias on o_proj too, which the artifact schema has no
 * tensor for: "attention_bias": true is refused for them.
 *
 * Architectures ("model_type"): qwen3_moe, qwen2_moe (shared expert with a sigmoid gate), llama
 * (dense), and the Gated DeltaNet hybrids qwen3_next and qwen3_5_moe_text (Qwen3.5-MoE as
 * transformers' Qwen3_5MoeForCausalLM saves it). The multimodal qwen3_5_moe is read through its
 * "text_config" (arch qwen3_5_moe_text, weights under "model.language_model."; the vision tower is
 * not converted). Anything else is refused with its name and this list.
 *
 * Hybrids: layer i is full attention or linear attention (Gated DeltaNet) as "layer_types" says, or
 * when absent (transformers 4.57 configs) full attention exactly when (i + 1) % full_attention_interval
 * == 0 (default 4). The attention rotates the first partial_rotary_factor (default 0.25) of each head,
 * read from "rope_parameters" or the top level. Qwen3.5's "mrope_section" is ignored: for text every
 * one of its three position components is the token's position, and mRoPE reduces to this rope. */
#ifndef NF_CONVERT_HF_CONFIG_H
#define NF_CONVERT_HF_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

typedef enum nf_hf_arch {
    NF_HF_QWEN3_MOE = 0,
    NF_HF_QWEN2_MOE,
    NF_HF_LLAMA,
    NF_HF_QWEN3_NEXT,
    NF_HF_QWEN3_5_MOE_TEXT,
    NF_HF_ARCH_COUNT
} nf_hf_arch;

/* Whether the arch is a Gated DeltaNet hybrid (linear-attention layers, gated attention, zero-centred
 * RMSNorm weights, a shared expert). */
int nf_hf_arch_hybrid(nf_hf_arch a);

const char *nf_hf_arch_name(nf_hf_arch a); /* the model_type string */

typedef struct nf_hf_rope {
    char type[32];                 /* "default" when there is no scaling; else "linear", "yarn", "llama3", ... */
    double theta;                  /* base frequency */
    double factor;                 /* 0 when absent */
    double original_max_position;  /* original_max_position_embeddings; 0 when absent */
    double low_freq_factor;        /* llama3; 0 when absent */
    double high_freq_factor;       /* llama3; 0 when absent */
} nf_hf_rope;

typedef struct nf_hf_config {
    nf_hf_arch arch;
    uint32_t hidden_size;          /* H: the residual width */
    uint32_t n_layers;             /* num_hidden_layers */
    uint32_t n_heads;              /* num_attention_heads */
    uint32_t n_kv_heads;           /* num_key_value_heads (GQA) */
    uint32_t head_dim;             /* per head; q_proj is [n_heads * head_dim, H] */
    uint32_t vocab_size;
    uint32_t intermediate_size;    /* dense MLP width (llama; qwen2_moe/qwen3_moe dense layers) */
    uint32_t max_position;         /* max_position_embeddings (0 when absent) */
    double rms_eps;                /* rms_norm_eps */
    nf_hf_rope rope;
    /* MoE (0 / false for llama) */
    uint32_t n_experts;            /* routed experts E: num_experts or num_local_experts */
    uint32_t n_experts_used;       /* num_experts_per_tok: top-k */
    uint32_t moe_intermediate_size;    /* I of one routed expert: gate/up [I, H], down [H, I] */
    uint32_t shared_intermediate_size; /* qwen2_moe shared expert; 0 when none */
    int norm_topk_prob;            /* renormalise the top-k routing weights */
    uint32_t decoder_sparse_step;  /* layer i is MoE when (i + 1) % step == 0 ... */
    uint32_t *mlp_only_layers;     /* [n_mlp_only] ... and i is not listed here */
    size_t n_mlp_only;
    int tie_word_embeddings;       /* lm_head shares embed_tokens */
    int qkv_bias;                  /* q/k/v projections have biases (qwen2_moe only) */
    char dtype[32];                /* "bfloat16", ... from dtype / torch_dtype; "" when absent */
    char prefix[32];               /* the decoder's key prefix: "model." or, multimodal, "model.language_model." */
    /* hybrids only (nf_hf_arch_hybrid) */
    uint8_t *linear_layers;        /* [n_layers] 1: Gated DeltaNet layer, 0: full attention */
    double partial_rotary;         /* rotated share of head_dim (0.25) */
    uint32_t lin_k_heads, lin_v_heads; /* linear_num_key_heads, linear_num_value_heads */
    uint32_t lin_k_dim, lin_v_dim;     /* linear_key_head_dim, linear_value_head_dim */
    uint32_t conv_kernel;              /* linear_conv_kernel_dim (4) */
} nf_hf_config;

/* Parses config.json text; `name` names it in messages. Fills *cfg (free with nf_hf_config_free). */
nf_status nf_hf_config_parse(const char *json, size_t len, const char *name, nf_hf_config *cfg, nf_error *err);
/* Reads and parses the file at `path`. */
nf_status nf_hf_config_load(const char *path, nf_hf_config *cfg, nf_error *err);
void nf_hf_config_free(nf_hf_config *cfg);

/* Whether decoder layer i has a routed-expert MLP (transformers' rule for qwen2_moe/qwen3_moe:
 * experts exist, i is not in mlp_only_layers, and (i + 1) % decoder_sparse_step == 0). */
int nf_hf_config_layer_is_moe(const nf_hf_config *cfg, uint32_t layer);

#endif

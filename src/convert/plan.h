/* The conversion plan: before a byte is written, every output tensor of the artifact is decided —
 * its codec, shape, the source matrices stacked into it (in stacking order), its nvfp4 divisors,
 * allow_a4 and input divisors. `ninfer convert --plan` prints it and writes nothing; the converter
 * (convert.h) executes it tensor by tensor. docs/convert.md describes the rules, docs/model_schema.md
 * the names and shapes.
 *
 * Sources: a Hugging Face folder (config.json + safetensors; unquantized, compressed-tensors
 * nvfp4-pack-quantized or ModelOpt NVFP4) or a GGUF file. */
#ifndef NF_CONVERT_PLAN_H
#define NF_CONVERT_PLAN_H

#include <stdint.h>
#include <stdio.h>

#include "base/error.h"
#include "codec/codec.h"
#include "convert/hf_config.h"
#include "format/gguf.h"
#include "format/safetensors.h"

typedef enum nf_src_kind { NF_SRC_HF = 0, NF_SRC_GGUF } nf_src_kind;

/* How a source matrix is stored. */
typedef enum nf_part_kind {
    NF_PART_DENSE = 0, /* safetensors F32/F16/BF16 */
    NF_PART_CT_NVFP4,  /* compressed-tensors: <m>.weight_packed, .weight_scale, .weight_global_scale */
    NF_PART_MO_NVFP4,  /* ModelOpt: <m>.weight (u8), .weight_scale, .weight_scale_2 */
    NF_PART_GGUF,      /* a GGUF tensor in its ggml type */
} nf_part_kind;

/* One source matrix (or a row range of one) stacked into an output tensor. */
typedef struct nf_plan_part {
    char src[320];        /* HF: the tensor key (dense) or module prefix (nvfp4); GGUF: tensor name */
    nf_part_kind kind;
    nf_codec_id src_codec; /* what the source rows are encoded as */
    uint64_t row0, rows;   /* rows [row0, row0 + rows) of the source viewed as [rows][cols] */
    uint32_t rope_heads;   /* GGUF llama attn_q/attn_k: llama.cpp's converter permuted the rows of each of
                            * these heads for its rotary layout; we undo it (0: rows as stored) */
    float divisor;         /* nvfp4 sources: this matrix's divisor (global scale); 0 otherwise */
    float input_divisor;   /* W4A4 sources: its calibrated input divisor; 0 when none */
    float add;             /* added to every decoded value (f32): 1 for the hybrids' zero-centred RMSNorm
                            * weights, which transformers applies as x * (1 + w); 0 otherwise */
    /* GGUF qwen35moe: llama.cpp's converter (conversion/qwen.py, _LinearAttentionVReorderBase) stored
     * the Gated DeltaNet v heads of this matrix's COLUMNS in tiled order (v head i * Hk + h is k head
     * h's i-th v head) where the artifact has them grouped (h * r + i, r = Hv / Hk). Column group
     * (h * r + i) of untile_w columns <- source group (i * untile_k + h); 0: columns as stored. */
    uint32_t untile_k, untile_w;
    int neg_exp_log;       /* GGUF ssm_a holds -exp(A_log) (llama.cpp's converter, Qwen3NextModel.
                            * modify_tensors): the decoded value x becomes the A_log whose -expf() is x */
} nf_plan_part;

typedef enum nf_plan_action {
    NF_ACT_ENCODE = 0,   /* decode source rows to f32, encode with the output codec */
    NF_ACT_COPY,         /* same block codec: copy the encoded rows (value-identical) */
    NF_ACT_NVFP4_COPY,   /* nvfp4 source: copy data, swizzle scales, keep each source's divisor */
    NF_ACT_NVFP4_QUANT,  /* quantize each source matrix to nvfp4 with its own divisor */
} nf_plan_action;

const char *nf_plan_action_name(nf_plan_action a);

typedef struct nf_plan_tensor {
    char name[64];            /* artifact name (docs/model_schema.md) */
    nf_codec_id codec;
    nf_plan_action action;
    uint32_t n_dims;
    uint64_t dims[4];         /* outermost first; dims[n_dims-1] is the row length */
    nf_plan_part *parts;      /* [n_parts] in stacking order */
    uint32_t n_parts;
    uint32_t divisors;        /* nvfp4: one per part (stacking order); else 1 */
    uint32_t flags;           /* NF_TENSOR_ALLOW_A4 */
    uint32_t n_input_divisors; /* 0, 1, or dims[0] (per expert) */
    float *input_divisors;    /* [n_input_divisors] */
    int unify_group;          /* tensors of one layer reading one encoded input share a group (> 0) */
    float in_spread_min, in_spread_max; /* the calibrated input divisors the unified value replaced */
    int fallback;             /* the recipe's codec could not take the row length: q8_0 instead */
    int reencoded;            /* a quantized source re-encoded (warned about): 1, a legacy ggml type
                               * (q4_0..q5_1, decode only), or stacked sources of different codecs; 2, a
                               * GGUF qwen35moe ssm_out whose tiled column groups split the codec's
                               * blocks (plan.h untile_w), so they cannot be moved as encoded bytes */
} nf_plan_tensor;

typedef struct nf_convert_opts {
    const char *recipe;   /* NULL: the source's default (bf16 for HF, nvfp4 for NVFP4 HF, source for GGUF) */
    int requantize;       /* allow an NVFP4 source into a non-NVFP4 recipe */
    int threads;          /* <= 0: all CPUs */
    int quiet;            /* no progress lines */
} nf_convert_opts;

typedef enum nf_src_quant { NF_SQ_NONE = 0, NF_SQ_CT_NVFP4, NF_SQ_MO_NVFP4, NF_SQ_GGUF } nf_src_quant;

typedef struct nf_plan {
    char source[1024];
    nf_src_kind src_kind;
    nf_src_quant src_quant;
    int w4a4;                 /* the NVFP4 source carries input scales */
    char recipe[16];
    nf_hf_config cfg;         /* hyperparameters (from config.json or GGUF metadata) */
    nf_plan_tensor *t;
    size_t n, cap;
    size_t n_warnings;
    nf_st_set *st;            /* HF source */
    nf_gguf *gguf;            /* GGUF source */
    int requantize;
    char blk[24];             /* the plan's current layer name prefix: "blk.N." or, for the MTP block, "mtp.blk.0." */
    uint32_t gguf_mtp_layers; /* GGUF hybrids: <arch>.nextn_predict_layers (0 or 1; counted in block_count) */
    int hash_bytes;           /* provenance.source_hash over the source files' bytes (a full extra read)
                               * instead of their names, sizes and mtimes; the caller sets it after
                               * nf_plan_build (ninfer convert --hash-bytes) */
} nf_plan;

/* Opens the source and computes the plan. Refusals (unknown architecture, missing tensors, shapes
 * inconsistent with config.json, an NVFP4 source into a non-NVFP4 recipe without requantize, an
 * nvfp4 share that is not whole 128-row tiles, a GGUF type it does not know) fail here, each naming
 * the tensor and the rule. On failure p holds nothing (nf_plan_free on it is harmless). */
nf_status nf_plan_build(const char *source, const nf_convert_opts *o, nf_plan *p, nf_error *err);
void nf_plan_free(nf_plan *p);
void nf_plan_print(const nf_plan *p, FILE *f);
const nf_plan_tensor *nf_plan_find(const nf_plan *p, const char *name);

#endif

/* Synthetic model artifacts: a full-size model of a named geometry with deterministic random
 * weights, written tensor by tensor through nf_artifact_writer in any recipe, so full-size speed
 * can be measured with no download (`ninfer synth`, docs/synth.md).
 *
 * What is stored follows docs/model_schema.md exactly: every model.* key, every tensor under its
 * schema name and shape, codecs from the converter's recipe table (recipe.h, docs/convert.md;
 * nf_synth_codec below looks a schema name up in it). Values:
 * matrices ~ N(0, 0.02^2) (an Irwin-Hall sum of four uniforms, which is normal to within a few
 * percent and bounded at +-3.46 sd), norm weights 1, biases and the shared-expert gate
 * N(0, 0.02^2), routers N(0, (2/sqrt(H))^2) so that a unit-RMS input gives router logits of sd ~2
 * (routing is peaked per token, yet random routers spread tokens near-uniformly over experts).
 *
 * Expert banks: expert 0 of every bank is generated and encoded fresh; expert e > 0 is, per source
 * matrix (gate, up, down), a random row permutation of expert 0's encoded rows with each row's
 * blocks rotated by a random number of blocks (nvfp4: data bytes and swizzled scale bytes moved
 * together; every source keeps the divisor of the source it was drawn from, which is the divisor of
 * its own amax). Encoding 30B parameters fresh with the k-quant encoders takes ~6 M elements/s per
 * core; this takes one expert per bank. The bytes at any offset differ between experts; `fresh`
 * encodes every expert from its own random values instead (slow, for checking).
 *
 * The output is a pure function of (geometry, recipe, seed, layers, vocab, fresh, tokenizer, ninfer
 * version): no date is stored and every row has its own random stream, so the thread count does
 * not change a byte. */
#ifndef NF_CONVERT_SYNTH_H
#define NF_CONVERT_SYNTH_H

#include <stdint.h>

#include "base/error.h"
#include "codec/codec.h"

typedef struct nf_synth_geometry {
    const char *name;  /* --geometry */
    const char *arch;  /* model.arch */
    uint32_t hidden, layers, heads, kv_heads, head_dim, vocab;
    uint32_t experts, top_k, moe_inter, shared_inter, dense_inter, max_ctx;
    double rope_theta;
    float rms_eps;
    int tie, qkv_bias, qk_norm, norm_topk;
    /* Gated DeltaNet hybrids (docs/hybrid.md); attn_every 0: none of these */
    uint32_t attn_every;  /* layer l is full (gated) attention when (l + 1) % attn_every == 0, else GDN */
    uint32_t rope_dim;    /* rotated dims per head */
    uint32_t ssm_k_heads, ssm_v_heads, ssm_k_dim, ssm_v_dim, ssm_conv;
} nf_synth_geometry;

/* The named geometry, or NULL. */
const nf_synth_geometry *nf_synth_geometry_find(const char *name);
/* "qwen3-30b-a3b, qwen3.5-35b-a3b, ..." for messages. */
const char *nf_synth_geometry_names(void);

typedef struct nf_synth_opts {
    const char *geometry; /* a name nf_synth_geometry_find knows */
    const char *recipe;   /* bf16, q8q8, q4q6, q4q5, nvfp4 */
    uint64_t seed;
    uint32_t layers;      /* 0: the geometry's */
    uint32_t vocab;       /* 0: the geometry's */
    int threads;          /* <= 0: all CPUs */
    int fresh;            /* encode every expert from its own random values (slow) */
    int no_tokenizer;     /* omit the byte-level toy tokenizer (it needs vocab >= 256) */
    int quiet;            /* no progress on stderr */
} nf_synth_opts;

typedef struct nf_synth_stats {
    uint64_t tensors, bytes, params;
    double seconds;
} nf_synth_stats;

/* Writes the artifact at path (a temporary file renamed at the end; nothing appears under path on
 * failure). Progress (tensor i/n, MB/s) on stderr unless quiet. Errors name the option or tensor. */
nf_status nf_synth_write(const char *path, const nf_synth_opts *o, nf_synth_stats *st, nf_error *err);

/* The recipe's codec for the schema tensor `name` ("token_embd", "blk.3.attn_v", ...) of a model with
 * `layers` layers and `experts` experts, tied embeddings or not, row length `cols`: recipe.h's table
 * (docs/convert.md), with its fallback (a row length the codec's block does not divide: q8_0, then
 * bf16; *fallback set). Unknown recipe (or "source", which is for GGUF
 * sources) or name: NF_ERR_INVALID_ARG naming it. */
nf_status nf_synth_codec(const char *recipe, const char *name, uint32_t layers, uint32_t experts, int tied,
                         uint64_t cols, nf_codec_id *out, int *fallback, nf_error *err);

#endif

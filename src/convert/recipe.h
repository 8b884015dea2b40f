/* The recipe table (docs/convert.md, "Recipes"): which codec each kind of tensor gets under each
 * recipe, and the fallback for a row length the codec cannot take. The one copy of it: the
 * converter's plan (plan.c) and the synthetic-model generator (synth.c) both ask it.
 *
 * A tensor's kind (its role) comes from its schema name (docs/model_schema.md); the q4q6 / q4q5
 * mixes follow llama.cpp's Q4_K_M / Q5_K_M (llama_tensor_get_type in src/llama-quant.cpp), whose
 * choices depend on the model's layer count (use_more_bits), its expert count (8) and whether the
 * embedding is tied. */
#ifndef NF_CONVERT_RECIPE_H
#define NF_CONVERT_RECIPE_H

#include <stddef.h>
#include <stdint.h>

#include "codec/codec.h"

typedef enum nf_role {
    NF_ROLE_VECTOR = 0,   /* norms, biases, the shared-expert gate: f32 */
    NF_ROLE_ROUTER,       /* ffn_gate_inp: f32 (llama.cpp never quantizes it) */
    NF_ROLE_EMBD,         /* token_embd */
    NF_ROLE_OUTPUT,       /* output (lm head) */
    NF_ROLE_ATTN_Q,
    NF_ROLE_ATTN_K,
    NF_ROLE_ATTN_V,
    NF_ROLE_ATTN_O,
    NF_ROLE_FFN_GATE_UP,  /* dense MLP gate/up */
    NF_ROLE_FFN_DOWN,     /* dense MLP down */
    NF_ROLE_EXP_GATE_UP,  /* routed expert banks */
    NF_ROLE_EXP_DOWN,
    NF_ROLE_SSM_IN,       /* Gated DeltaNet ssm_qkv, ssm_z: attn_q's codec (bf16 under nvfp4) */
    NF_ROLE_SSM_BA,       /* ssm_ba (b and a rows; a goes through softplus and exp into every state
                           * decay): bf16 in every recipe, 2 * Hv rows, a negligible share */
    NF_ROLE_SSM_OUT,      /* ssm_out: attn_output's codec (bf16 under nvfp4) */
    NF_ROLE_SHEXP_GATE_UP, /* shared expert gate_up: the dense MLP's codec, but nvfp4 under nvfp4 */
    NF_ROLE_SHEXP_DOWN,    /* shared expert down: likewise (the GPU's nvfp4 profile is all four matrices) */
    NF_ROLE_COUNT
} nf_role;

typedef struct nf_recipe nf_recipe;

/* The recipe of that name ("bf16", "q8q8", "q4q6", "q4q5", "nvfp4", "source"), or NULL. "source"
 * (GGUF: keep what the file stores) encodes what it must re-encode as q8q8 does. */
const nf_recipe *nf_recipe_find(const char *name);

/* Why `name`, given as a recipe, is not one, when it is a codec's name (people type --recipe q2_k):
 * an import-only codec (NF_CODEC_IMPORT_ONLY: q2_k, q3_k, iq4_xs, iq4_nl) has no quantizer and is
 * never a recipe's choice, GGUF tensors in it are carried over as they are; any other codec is a
 * per-tensor choice of the recipes. Writes a sentence starting with "; " to buf (empty when name is
 * not a codec) and returns buf. */
const char *nf_recipe_codec_note(const char *name, char *buf, size_t cap);

/* What the table's choices depend on. */
typedef struct nf_recipe_model {
    uint32_t layers;  /* decoder layers: llama.cpp's use_more_bits is relative to them */
    uint32_t experts; /* routed experts: the mixes treat exactly 8 specially */
    int tied;         /* token_embd also serves as the output head */
} nf_recipe_model;

/* The recipe's codec for a tensor of role `role` in layer `layer` (any value for tensors outside
 * the layers), before the row-length fallback. */
nf_codec_id nf_recipe_codec(const nf_recipe *r, nf_role role, int layer, const nf_recipe_model *m);
/* The layer number of the hybrids' MTP block (mtp.*): it takes the codecs of a layer numbered m->layers,
 * one after the last. */
#define NF_RECIPE_LAYER_MTP (-2)

/* c if its block divides a row of `cols`; else q8_0 when 32 divides it, else bf16, with *fell_back
 * set (may be NULL). */
nf_codec_id nf_recipe_fit(nf_codec_id c, uint64_t cols, int *fell_back);

/* The role of a schema tensor name ("token_embd", "blk.3.attn_v", ...); *layer = N for "blk.N.*",
 * NF_RECIPE_LAYER_MTP for "mtp.*",
 * -1 otherwise. -1 for a name the schema does not have. */
int nf_recipe_role_of(const char *name, int *layer);

#endif

/* The recipe table: see recipe.h and docs/convert.md. */
#include "convert/recipe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One cell of the table: the codec, and what replaces it when a condition holds (checked in this
 * order; NONE: no such rule). */
typedef struct rule {
    nf_codec_id codec;
    nf_codec_id e8;        /* the model has exactly 8 experts */
    nf_codec_id more_bits; /* the layer is one of use_more_bits' */
    nf_codec_id tied;      /* the embedding is tied */
} rule;

/* f32 is never an override, and a field left out of an initializer is 0 = f32 */
#define NONE NF_CODEC_F32
_Static_assert(NF_CODEC_F32 == 0, "rule fields left out must mean NONE");

#define BF NF_CODEC_BF16
#define Q8 NF_CODEC_Q8_0
#define Q4K NF_CODEC_Q4_K
#define Q5K NF_CODEC_Q5_K
#define Q6K NF_CODEC_Q6_K
#define FP4 NF_CODEC_NVFP4
/* A row of docs/convert.md's table, one cell per matrix role in the table's order; vectors and
 * routers are f32 in every recipe. C(codec, .e8 = ..., ...) is a cell. */
#define C(...) {.codec = __VA_ARGS__}
#define RECIPE(embd, output, q, k, v, o, gate_up, down, exp_gate_up, exp_down, shexp_gate_up, shexp_down)     \
    {[NF_ROLE_VECTOR] = C(NF_CODEC_F32), [NF_ROLE_ROUTER] = C(NF_CODEC_F32), [NF_ROLE_EMBD] = embd,                 \
     [NF_ROLE_OUTPUT] = output, [NF_ROLE_ATTN_Q] = q, [NF_ROLE_ATTN_K] = k, [NF_ROLE_ATTN_V] = v,               \
     [NF_ROLE_ATTN_O] = o, [NF_ROLE_FFN_GATE_UP] = gate_up, [NF_ROLE_FFN_DOWN] = down,                          \
     [NF_ROLE_EXP_GATE_UP] = exp_gate_up, [NF_ROLE_EXP_DOWN] = exp_down, [NF_ROLE_SSM_IN] = q,                  \
     [NF_ROLE_SSM_BA] = C(NF_CODEC_BF16), [NF_ROLE_SSM_OUT] = o, [NF_ROLE_SHEXP_GATE_UP] = shexp_gate_up,      \
     [NF_ROLE_SHEXP_DOWN] = shexp_down}

struct nf_recipe {
    const char *name;
    rule r[NF_ROLE_COUNT];
};

static const struct nf_recipe recipes[] = {
    /*                 token_embd output  attn_q  attn_k  attn_v  attn_out ffn_g/u ffn_down exps_g/u exps_down
     *                 shexp_g/u shexp_down (as ffn_g/u and ffn_down, but nvfp4 under nvfp4) */
    {"bf16", RECIPE(C(BF), C(BF), C(BF), C(BF), C(BF), C(BF), C(BF), C(BF), C(BF), C(BF), C(BF), C(BF))},
    {"q8q8", RECIPE(C(Q8), C(Q8), C(Q8), C(Q8), C(Q8), C(Q8), C(Q8), C(Q8), C(Q8), C(Q8), C(Q8), C(Q8))},
    {"source", RECIPE(C(Q8), C(Q8), C(Q8), C(Q8), C(Q8), C(Q8), C(Q8), C(Q8), C(Q8), C(Q8), C(Q8), C(Q8))},
    /* the rest bf16, as published NVFP4 checkpoints keep their ignore list; the shared expert nvfp4
     * with the routed ones, so the expert bank is one profile (the GPU operator's nvfp4 profile is
     * all four matrices: it refuses a bank of nvfp4 experts beside a bf16 shared expert) */
    {"nvfp4", RECIPE(C(BF), C(BF), C(BF), C(BF), C(BF), C(BF), C(BF), C(BF), C(FP4), C(FP4), C(FP4), C(FP4))},
    /* llama.cpp's Q4_K_M */
    {"q4q6", RECIPE(C(Q4K, .tied = Q6K), C(Q6K), C(Q4K), C(Q4K, .e8 = Q8), C(Q4K, .e8 = Q8, .more_bits = Q6K),
                    C(Q4K, .e8 = Q5K), C(Q4K), C(Q4K, .more_bits = Q6K), C(Q4K), C(Q6K), C(Q4K),
                    C(Q4K, .more_bits = Q6K))},
    /* llama.cpp's Q5_K_M */
    {"q4q5", RECIPE(C(Q5K, .tied = Q6K), C(Q6K), C(Q5K), C(Q5K, .e8 = Q8), C(Q5K, .e8 = Q8, .more_bits = Q6K),
                    C(Q5K), C(Q5K), C(Q5K, .more_bits = Q6K), C(Q4K), C(Q5K), C(Q5K), C(Q5K, .more_bits = Q6K))},
};

const nf_recipe *nf_recipe_find(const char *name)
{
    for (size_t i = 0; name && i < sizeof recipes / sizeof recipes[0]; i++)
        if (strcmp(name, recipes[i].name) == 0) return &recipes[i];
    return NULL;
}

const char *nf_recipe_codec_note(const char *name, char *buf, size_t cap)
{
    const nf_codec *c = nf_codec_by_name(name);
    if (cap) buf[0] = '\0';
    if (!c || !cap) return buf;
    if (c->flags & NF_CODEC_IMPORT_ONLY)
        snprintf(buf, cap, "; %s is a codec ninfer imports from GGUF but cannot encode (no quantizer), so no recipe "
                 "produces it: a GGUF's %s tensors are carried over as they are under any recipe (default 'source')",
                 c->name, c->name);
    else
        snprintf(buf, cap, "; %s is a codec, not a recipe: a recipe picks a codec per tensor (docs/convert.md)", c->name);
    return buf;
}

/* llama.cpp's use_more_bits: the first and last eighth of the layers and every third between. */
static int more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

nf_codec_id nf_recipe_codec(const nf_recipe *r, nf_role role, int layer, const nf_recipe_model *m)
{
    const rule *c = &r->r[role];
    if (c->e8 != NONE && m->experts == 8) return c->e8;
    if (layer == NF_RECIPE_LAYER_MTP) layer = (int)m->layers;
    if (c->more_bits != NONE && more_bits(layer, (int)m->layers)) return c->more_bits;
    if (c->tied != NONE && m->tied) return c->tied;
    return c->codec;
}

nf_codec_id nf_recipe_fit(nf_codec_id c, uint64_t cols, int *fell_back)
{
    int fb = cols % nf_codec_get(c)->block_elems != 0;
    if (fell_back) *fell_back = fb;
    return fb ? (cols % 32 == 0 ? NF_CODEC_Q8_0 : NF_CODEC_BF16) : c;
}

int nf_recipe_role_of(const char *name, int *layer)
{
    static const struct {
        const char *suffix;
        nf_role r;
    } blk[] = {
        {"attn_norm", NF_ROLE_VECTOR}, {"ffn_norm", NF_ROLE_VECTOR}, {"attn_q", NF_ROLE_ATTN_Q},
        {"attn_k", NF_ROLE_ATTN_K}, {"attn_v", NF_ROLE_ATTN_V}, {"attn_output", NF_ROLE_ATTN_O},
        {"attn_q_bias", NF_ROLE_VECTOR}, {"attn_k_bias", NF_ROLE_VECTOR}, {"attn_v_bias", NF_ROLE_VECTOR},
        {"attn_q_norm", NF_ROLE_VECTOR}, {"attn_k_norm", NF_ROLE_VECTOR}, {"ffn_gate", NF_ROLE_FFN_GATE_UP},
        {"ffn_up", NF_ROLE_FFN_GATE_UP}, {"ffn_down", NF_ROLE_FFN_DOWN}, {"ffn_gate_inp", NF_ROLE_ROUTER},
        {"ffn_gate_up_exps", NF_ROLE_EXP_GATE_UP}, {"ffn_down_exps", NF_ROLE_EXP_DOWN},
        {"ffn_gate_up_shexp", NF_ROLE_SHEXP_GATE_UP}, {"ffn_down_shexp", NF_ROLE_SHEXP_DOWN},
        {"ffn_gate_inp_shexp", NF_ROLE_VECTOR}, {"attn_gate", NF_ROLE_ATTN_Q}, {"ssm_qkv", NF_ROLE_SSM_IN},
        {"ssm_z", NF_ROLE_SSM_IN}, {"ssm_ba", NF_ROLE_SSM_BA}, {"ssm_out", NF_ROLE_SSM_OUT},
        {"ssm_conv", NF_ROLE_VECTOR}, {"ssm_dt_bias", NF_ROLE_VECTOR}, {"ssm_a_log", NF_ROLE_VECTOR},
        {"ssm_norm", NF_ROLE_VECTOR},
    };
    *layer = -1;
    if (strcmp(name, "token_embd") == 0) return NF_ROLE_EMBD;
    if (strcmp(name, "output") == 0) return NF_ROLE_OUTPUT;
    if (strcmp(name, "output_norm") == 0) return NF_ROLE_VECTOR;
    char *end;
    long l;
    if (strncmp(name, "mtp.", 4) == 0) { /* the hybrids' MTP block */
        *layer = NF_RECIPE_LAYER_MTP;
        if (strcmp(name, "mtp.fc") == 0) return NF_ROLE_SSM_IN;
        if (!strcmp(name, "mtp.norm_embd") || !strcmp(name, "mtp.norm_hidden") || !strcmp(name, "mtp.output_norm"))
            return NF_ROLE_VECTOR;
        if (strncmp(name, "mtp.blk.0.", 10) != 0) return -1;
        end = (char *)name + 9;
        l = NF_RECIPE_LAYER_MTP;
    } else {
        if (strncmp(name, "blk.", 4) != 0) return -1;
        l = strtol(name + 4, &end, 10);
        if (end == name + 4 || *end != '.' || l < 0 || l > 1000000) return -1;
    }
    for (size_t i = 0; i < sizeof blk / sizeof blk[0]; i++)
        if (strcmp(end + 1, blk[i].suffix) == 0) {
            *layer = (int)l;
            return (int)blk[i].r;
        }
    return -1;
}

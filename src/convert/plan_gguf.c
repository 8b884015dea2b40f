/* The GGUF plan (plan_gguf.c): GGUF metadata into the model config, llama.cpp's tensor names into the
 * schema's. See plan.h and docs/convert.md. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert/plan_internal.h"

/* Tensor names are built into fixed buffers far longer than any GGUF name; an over-long name would
 * truncate and then be reported as a missing tensor, which is the right outcome. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif

/* ---- the GGUF plan --------------------------------------------------------------------------- */

typedef struct gguf_arch {
    const char *gguf, *hf; /* general.architecture, our model.arch */
    nf_hf_arch arch;
} gguf_arch;

static const gguf_arch gguf_archs[] = {
    {"qwen3moe", "qwen3_moe", NF_HF_QWEN3_MOE},
    {"qwen2moe", "qwen2_moe", NF_HF_QWEN2_MOE},
    {"llama", "llama", NF_HF_LLAMA},
};

static nf_status gguf_u32(const nf_plan *p, const char *a, const char *k, uint32_t *v, int required, nf_error *err)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", a, k);
    if (!nf_gguf_find_kv(p->gguf, key)) {
        if (required) return nf_error_set(err, NF_ERR_FORMAT, "%s: metadata key '%s' is missing", p->source, key);
        return NF_OK;
    }
    nf_status s = nf_gguf_get_u32(p->gguf, key, v, err);
    return s ? nf_error_prefix(err, "%s", p->source) : NF_OK;
}

static nf_status gguf_f(const nf_plan *p, const char *a, const char *k, double *v, nf_error *err)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", a, k);
    if (!nf_gguf_find_kv(p->gguf, key)) return NF_OK;
    nf_status s = nf_gguf_get_float(p->gguf, key, v, err);
    return s ? nf_error_prefix(err, "%s", p->source) : NF_OK;
}

/* RoPE beyond the base: <arch>.rope.scaling.{type,factor,original_context_length} (linear, yarn; the
 * older rope.scale_linear), checked against what the engines implement: a rotary dimension other than
 * head_dim (partial RoPE) and llama3's scaling (which llama.cpp's converter bakes into a
 * rope_freqs.weight tensor of per-frequency divisors) are refused. */
static nf_status gguf_rope(const nf_plan *p, const char *a, nf_hf_config *c, nf_error *err)
{
    uint32_t rot = c->head_dim, orig = 0;
    nf_status s = gguf_u32(p, a, "rope.dimension_count", &rot, 0, err);
    if (s) return s;
    if (rot != c->head_dim)
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "%s: '%s.rope.dimension_count' is %u but head_dim is %u: partial RoPE "
                            "is not supported", p->source, a, rot, c->head_dim);
    if (nf_gguf_find_tensor(p->gguf, "rope_freqs.weight"))
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "%s: tensor 'rope_freqs.weight' (llama3 RoPE scaling as per-frequency "
                            "factors) is not supported from GGUF; convert the Hugging Face checkpoint", p->source);
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    double factor = 0;
    if ((s = gguf_f(p, a, "rope.scaling.factor", &factor, err)) != NF_OK) return s;
    if ((s = gguf_u32(p, a, "rope.scaling.original_context_length", &orig, 0, err)) != NF_OK) return s;
    if (nf_gguf_find_kv(p->gguf, key)) {
        nf_gguf_str t;
        if ((s = nf_gguf_get_str(p->gguf, key, &t, err)) != NF_OK) return nf_error_prefix(err, "%s", p->source);
        snprintf(c->rope.type, sizeof c->rope.type, "%.*s", (int)(t.len < 31 ? t.len : 31), t.ptr);
    } else {
        double lin = 0; /* before rope.scaling.*: a linear factor alone */
        if ((s = gguf_f(p, a, "rope.scale_linear", &lin, err)) != NF_OK) return s;
        if (lin > 0 && lin != 1) {
            snprintf(c->rope.type, sizeof c->rope.type, "linear");
            factor = lin;
        }
    }
    if (strcmp(c->rope.type, "none") == 0) snprintf(c->rope.type, sizeof c->rope.type, "default");
    if (strcmp(c->rope.type, "default") != 0 && strcmp(c->rope.type, "linear") != 0 && strcmp(c->rope.type, "yarn") != 0)
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "%s: '%s' is '%s' (supported: none, linear, yarn)", p->source, key,
                            c->rope.type);
    if (strcmp(c->rope.type, "default") != 0 && !(factor > 0))
        return nf_error_set(err, NF_ERR_FORMAT, "%s: '%s' is '%s' without a '%s.rope.scaling.factor'", p->source, key,
                            c->rope.type, a);
    c->rope.factor = factor;
    c->rope.original_max_position = orig;
    return NF_OK;
}

/* Hyperparameters from GGUF metadata into cfg. */
static nf_status gguf_config(nf_plan *p, nf_error *err)
{
    nf_gguf_str as;
    nf_status s = nf_gguf_get_str(p->gguf, "general.architecture", &as, err);
    if (s) return nf_error_prefix(err, "%s", p->source);
    char a[64];
    snprintf(a, sizeof a, "%.*s", (int)(as.len < 63 ? as.len : 63), as.ptr);
    const gguf_arch *ga = NULL;
    for (size_t i = 0; i < sizeof gguf_archs / sizeof gguf_archs[0]; i++)
        if (strcmp(a, gguf_archs[i].gguf) == 0) ga = &gguf_archs[i];
    if (!ga)
        return nf_error_set(err, NF_ERR_UNSUPPORTED,
                            "%s: architecture '%s' is not supported (supported: qwen3moe, qwen2moe, llama)", p->source, a);
    nf_hf_config *c = &p->cfg;
    c->arch = ga->arch;
    c->rms_eps = 1e-6;
    c->rope.theta = 10000;
    snprintf(c->rope.type, sizeof c->rope.type, "default");
    c->decoder_sparse_step = 1;
    s = gguf_u32(p, a, "embedding_length", &c->hidden_size, 1, err);
    if (!s) s = gguf_u32(p, a, "block_count", &c->n_layers, 1, err);
    if (!s) s = gguf_u32(p, a, "attention.head_count", &c->n_heads, 1, err);
    c->n_kv_heads = c->n_heads;
    if (!s) s = gguf_u32(p, a, "attention.head_count_kv", &c->n_kv_heads, 0, err);
    if (!s && c->n_heads) c->head_dim = c->hidden_size / c->n_heads;
    if (!s) s = gguf_u32(p, a, "attention.key_length", &c->head_dim, 0, err);
    if (!s) s = gguf_u32(p, a, "context_length", &c->max_position, 0, err);
    if (!s) s = gguf_u32(p, a, "feed_forward_length", &c->intermediate_size, 0, err);
    if (!s) s = gguf_u32(p, a, "expert_count", &c->n_experts, 0, err);
    if (!s) s = gguf_u32(p, a, "expert_used_count", &c->n_experts_used, 0, err);
    if (!s) s = gguf_u32(p, a, "expert_feed_forward_length", &c->moe_intermediate_size, 0, err);
    if (!s) s = gguf_u32(p, a, "expert_shared_feed_forward_length", &c->shared_intermediate_size, 0, err);
    if (!s) s = gguf_f(p, a, "attention.layer_norm_rms_epsilon", &c->rms_eps, err);
    if (!s) s = gguf_f(p, a, "rope.freq_base", &c->rope.theta, err);
    if (!s) s = gguf_rope(p, a, c, err);
    if (s) return s;
    /* llama.cpp: qwen3moe renormalises the top-k weights, qwen2moe does not */
    c->norm_topk_prob = c->arch == NF_HF_QWEN3_MOE;
    const nf_gguf_tensor *e = nf_gguf_find_tensor(p->gguf, "token_embd.weight");
    if (!e) return nf_error_set(err, NF_ERR_FORMAT, "%s: tensor 'token_embd.weight' is missing", p->source);
    c->vocab_size = (uint32_t)e->ne[1];
    c->tie_word_embeddings = nf_gguf_find_tensor(p->gguf, "output.weight") == NULL;
    /* qwen2moe: q/k/v biases when layer 0 has them (llama.cpp's are optional); then every layer must */
    c->qkv_bias = c->arch == NF_HF_QWEN2_MOE && nf_gguf_find_tensor(p->gguf, "blk.0.attn_q.bias") != NULL;
    /* No expert_shared_feed_forward_length: the row length of the first ffn_down_shexp (layer 0 may
     * be a dense one) */
    for (uint32_t i = 0; c->arch == NF_HF_QWEN2_MOE && !c->shared_intermediate_size && i < c->n_layers; i++) {
        char n[64];
        snprintf(n, sizeof n, "blk.%u.ffn_down_shexp.weight", i);
        const nf_gguf_tensor *sh = nf_gguf_find_tensor(p->gguf, n);
        if (sh) c->shared_intermediate_size = (uint32_t)sh->ne[0];
    }
    if (c->arch != NF_HF_LLAMA && (!c->n_experts || !c->moe_intermediate_size))
        return nf_error_set(err, NF_ERR_FORMAT, "%s: '%s.expert_count' / '%s.expert_feed_forward_length' missing", p->source,
                            a, a);
    /* MoE layers: those holding a router */
    if (c->arch != NF_HF_LLAMA) {
        c->mlp_only_layers = calloc(c->n_layers ? c->n_layers : 1, sizeof(uint32_t));
        if (!c->mlp_only_layers) return nf_error_set(err, NF_ERR_NOMEM, "plan: out of memory");
        for (uint32_t i = 0; i < c->n_layers; i++) {
            char n[64];
            snprintf(n, sizeof n, "blk.%u.ffn_gate_inp.weight", i);
            if (!nf_gguf_find_tensor(p->gguf, n)) c->mlp_only_layers[c->n_mlp_only++] = i;
        }
    }
    return NF_OK;
}

/* One GGUF tensor (or a row range) as a part; checks it against the expected [rows][cols] (of the
 * whole source when stacked: src_rows). */
static nf_status gguf_part(nf_plan *p, nf_plan_tensor *t, const char *gname, uint64_t row0, uint64_t rows,
                           uint64_t src_rows, uint64_t cols, nf_error *err)
{
    const nf_gguf_tensor *g = nf_gguf_find_tensor(p->gguf, gname);
    if (!g) return nf_error_set(err, NF_ERR_FORMAT, "%s: tensor '%s' is missing (needed for %s)", p->source, gname, t->name);
    uint64_t gr = g->ne[0] ? g->n_elems / g->ne[0] : 0;
    if (g->ne[0] != cols || gr != src_rows)
        return nf_error_set(err, NF_ERR_FORMAT,
                            "%s: tensor '%s' has %llu rows of %llu, but the metadata implies %llu rows of %llu", p->source,
                            gname, (unsigned long long)gr, (unsigned long long)g->ne[0], (unsigned long long)src_rows,
                            (unsigned long long)cols);
    nf_plan_part *q = nf_plan_add_part(t, err);
    if (!q) return NF_ERR_NOMEM;
    snprintf(q->src, sizeof q->src, "%s", gname);
    q->kind = NF_PART_GGUF;
    q->src_codec = g->codec->id;
    q->row0 = row0;
    q->rows = rows;
    return NF_OK;
}

static nf_status gguf_simple(nf_plan *p, const char *name, nf_role r, int layer, const char *gname, uint64_t rows,
                             uint64_t cols, nf_error *err)
{
    uint64_t dims[2] = {rows, cols};
    int vec = r == NF_ROLE_VECTOR;
    nf_plan_tensor *t = nf_plan_add_tensor(p, name, vec ? 1 : 2, vec ? dims + 1 : dims, err);
    if (!t) return NF_ERR_NOMEM;
    nf_status s = gguf_part(p, t, gname, 0, rows, rows, cols, err);
    if (s) return s;
    return nf_plan_decide(p, t, r, layer, err);
}

/* gate and up banks [E][I][H] stacked into [E][2I][H]: gate_j, up_j for each expert j. */
static nf_status gguf_exp_bank(nf_plan *p, int i, const char *gu_name, const char *gate, const char *up, uint64_t E,
                               uint64_t N, uint64_t H, nf_error *err)
{
    uint64_t d3[3] = {E, 2 * N, H}, d2[2] = {2 * N, H};
    nf_plan_tensor *t = nf_plan_add_tensor(p, gu_name, E ? 3 : 2, E ? d3 : d2, err);
    if (!t) return NF_ERR_NOMEM;
    uint64_t n = E ? E : 1;
    nf_status s = NF_OK;
    for (uint64_t j = 0; j < n && s == NF_OK; j++) {
        s = gguf_part(p, t, gate, j * N, N, n * N, H, err);
        if (s == NF_OK) s = gguf_part(p, t, up, j * N, N, n * N, H, err);
    }
    return s ? s : nf_plan_decide(p, t, E ? NF_ROLE_EXP_GATE_UP : NF_ROLE_SHEXP_GATE_UP, i, err);
}

static nf_status gguf_layer(nf_plan *p, int i, nf_error *err)
{
    const nf_hf_config *c = &p->cfg;
    uint64_t H = c->hidden_size, q = (uint64_t)c->n_heads * c->head_dim, kv = (uint64_t)c->n_kv_heads * c->head_dim;
    uint64_t E = c->n_experts, I = c->moe_intermediate_size, S = c->shared_intermediate_size;
    char n1[64], g1[96], g2[96];
#define N(fmt) (snprintf(n1, sizeof n1, "blk.%d." fmt, i), n1)
#define G(fmt) (snprintf(g1, sizeof g1, "blk.%d." fmt, i), g1)
#define G2(fmt) (snprintf(g2, sizeof g2, "blk.%d." fmt, i), g2)
    nf_status s = gguf_simple(p, N("attn_norm"), NF_ROLE_VECTOR, i, G("attn_norm.weight"), 1, H, err);
    if (!s) s = gguf_simple(p, N("attn_q"), NF_ROLE_ATTN_Q, i, G("attn_q.weight"), q, H, err);
    if (!s) s = gguf_simple(p, N("attn_k"), NF_ROLE_ATTN_K, i, G("attn_k.weight"), kv, H, err);
    if (!s && c->arch == NF_HF_LLAMA) { /* undo llama.cpp's q/k row permutation (rotary pairs) */
        p->t[p->n - 2].parts[0].rope_heads = c->n_heads;
        p->t[p->n - 1].parts[0].rope_heads = c->n_kv_heads;
    }
    if (!s) s = gguf_simple(p, N("attn_v"), NF_ROLE_ATTN_V, i, G("attn_v.weight"), kv, H, err);
    if (!s) s = gguf_simple(p, N("attn_output"), NF_ROLE_ATTN_O, i, G("attn_output.weight"), H, q, err);
    if (!s && c->qkv_bias) {
        s = gguf_simple(p, N("attn_q_bias"), NF_ROLE_VECTOR, i, G("attn_q.bias"), 1, q, err);
        if (!s) s = gguf_simple(p, N("attn_k_bias"), NF_ROLE_VECTOR, i, G("attn_k.bias"), 1, kv, err);
        if (!s) s = gguf_simple(p, N("attn_v_bias"), NF_ROLE_VECTOR, i, G("attn_v.bias"), 1, kv, err);
    }
    if (!s && c->arch == NF_HF_QWEN3_MOE) {
        s = gguf_simple(p, N("attn_q_norm"), NF_ROLE_VECTOR, i, G("attn_q_norm.weight"), 1, c->head_dim, err);
        if (!s) s = gguf_simple(p, N("attn_k_norm"), NF_ROLE_VECTOR, i, G("attn_k_norm.weight"), 1, c->head_dim, err);
    }
    if (!s) s = gguf_simple(p, N("ffn_norm"), NF_ROLE_VECTOR, i, G("ffn_norm.weight"), 1, H, err);
    if (s) return s;
    if (!nf_hf_config_layer_is_moe(c, (uint32_t)i)) {
        uint64_t D = c->intermediate_size;
        s = gguf_simple(p, N("ffn_gate"), NF_ROLE_FFN_GATE_UP, i, G("ffn_gate.weight"), D, H, err);
        if (!s) s = gguf_simple(p, N("ffn_up"), NF_ROLE_FFN_GATE_UP, i, G("ffn_up.weight"), D, H, err);
        if (!s) s = gguf_simple(p, N("ffn_down"), NF_ROLE_FFN_DOWN, i, G("ffn_down.weight"), H, D, err);
        return s;
    }
    s = gguf_simple(p, N("ffn_gate_inp"), NF_ROLE_ROUTER, i, G("ffn_gate_inp.weight"), E, H, err);
    if (!s) s = gguf_exp_bank(p, i, N("ffn_gate_up_exps"), G("ffn_gate_exps.weight"), G2("ffn_up_exps.weight"), E, I, H, err);
    if (!s) {
        uint64_t dd[3] = {E, H, I};
        nf_plan_tensor *t = nf_plan_add_tensor(p, N("ffn_down_exps"), 3, dd, err);
        if (!t) return NF_ERR_NOMEM;
        for (uint64_t j = 0; j < E && !s; j++) s = gguf_part(p, t, G("ffn_down_exps.weight"), j * H, H, E * H, I, err);
        if (!s) s = nf_plan_decide(p, t, NF_ROLE_EXP_DOWN, i, err);
    }
    if (!s && S && c->arch == NF_HF_QWEN2_MOE) {
        s = gguf_exp_bank(p, i, N("ffn_gate_up_shexp"), G("ffn_gate_shexp.weight"), G2("ffn_up_shexp.weight"), 0, S, H, err);
        if (!s) s = gguf_simple(p, N("ffn_down_shexp"), NF_ROLE_SHEXP_DOWN, i, G("ffn_down_shexp.weight"), H, S, err);
        if (!s) s = gguf_simple(p, N("ffn_gate_inp_shexp"), NF_ROLE_VECTOR, i, G("ffn_gate_inp_shexp.weight"), 1, H, err);
    }
#undef N
#undef G
#undef G2
    return s;
}

nf_status nf_plan_gguf(nf_plan *p, nf_error *err)
{
    nf_status s = nf_gguf_open(p->source, 0, &p->gguf, err);
    if (s) return s;
    if ((s = gguf_config(p, err)) != NF_OK) return s;
    p->src_quant = NF_SQ_GGUF;
    if (!p->recipe[0]) snprintf(p->recipe, sizeof p->recipe, "source");
    if (strcmp(p->recipe, "nvfp4") == 0)
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "recipe 'nvfp4' needs an unquantized source; a GGUF converts with "
                                                     "'source', bf16, q8q8, q4q6 or q4q5");
    const nf_hf_config *c = &p->cfg;
    uint64_t V = c->vocab_size, H = c->hidden_size;
    s = gguf_simple(p, "token_embd", NF_ROLE_EMBD, 0, "token_embd.weight", V, H, err);
    for (uint32_t i = 0; i < c->n_layers && !s; i++) s = gguf_layer(p, (int)i, err);
    if (!s) s = gguf_simple(p, "output_norm", NF_ROLE_VECTOR, 0, "output_norm.weight", 1, H, err);
    if (!s && !c->tie_word_embeddings) s = gguf_simple(p, "output", NF_ROLE_OUTPUT, 0, "output.weight", V, H, err);
    return s;
}

/* The GGUF plan (plan_gguf.c): GGUF metadata into the model config, llama.cpp's tensor names into the
 * schema's. See plan.h and docs/convert.md. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
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
    {"qwen3next", "qwen3_next", NF_HF_QWEN3_NEXT},
    {"qwen35moe", "qwen3_5_moe", NF_HF_QWEN3_5_MOE_TEXT},
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
    nf_status s = gguf_u32(p, a, "rope.dimension_count", &rot, nf_hf_arch_hybrid(c->arch), err);
    if (s) return s;
    if (nf_hf_arch_hybrid(c->arch)) { /* partial rotary: the first rot dims of each head (NEOX pairs) */
        if (rot == 0 || rot > c->head_dim || rot % 2)
            return nf_error_set(err, NF_ERR_FORMAT, "%s: '%s.rope.dimension_count' is %u; expected an even number of "
                                "rotated dims in 2..%u (head_dim)", p->source, a, rot, c->head_dim);
        c->partial_rotary = (double)rot / c->head_dim;
    } else if (rot != c->head_dim)
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

/* The hybrids' layer kinds and Gated DeltaNet sizes, read as llama.cpp's loader reads them
 * (src/models/qwen3next.cpp, qwen35moe.cpp load_arch_hparams): A.attention.recurrent_layers (bool per
 * layer, written by conversion/qwen.py from layer_types), else recurrent exactly when
 * (i + 1) % A.full_attention_interval (default 4) != 0; ssm.group_count = Hk, ssm.time_step_rank = Hv,
 * ssm.state_size = dk, ssm.inner_size = Hv * dv, ssm.conv_kernel = K. */
static nf_status gguf_hybrid(nf_plan *p, const char *a, nf_hf_config *c, nf_error *err)
{
    uint32_t inner = 0, every = 4;
    nf_status s = gguf_u32(p, a, "ssm.group_count", &c->lin_k_heads, 1, err);
    if (!s) s = gguf_u32(p, a, "ssm.time_step_rank", &c->lin_v_heads, 1, err);
    if (!s) s = gguf_u32(p, a, "ssm.state_size", &c->lin_k_dim, 1, err);
    if (!s) s = gguf_u32(p, a, "ssm.inner_size", &inner, 1, err);
    if (!s) s = gguf_u32(p, a, "ssm.conv_kernel", &c->conv_kernel, 1, err);
    if (!s) s = gguf_u32(p, a, "full_attention_interval", &every, 0, err);
    if (s) return s;
    if (!c->lin_k_heads || !c->lin_v_heads || c->lin_v_heads % c->lin_k_heads || inner % c->lin_v_heads ||
        !c->lin_k_dim || !inner || !c->conv_kernel || !every)
        return nf_error_set(err, NF_ERR_FORMAT, "%s: '%s.ssm.*' sizes are inconsistent: group_count (Hk) %u, "
                            "time_step_rank (Hv) %u (a multiple of Hk), state_size %u, inner_size %u (a multiple of Hv), "
                            "conv_kernel %u, full_attention_interval %u (none may be 0)", p->source, a, c->lin_k_heads,
                            c->lin_v_heads, c->lin_k_dim, inner, c->conv_kernel, every);
    c->lin_v_dim = inner / c->lin_v_heads;
    c->linear_layers = calloc(c->n_layers ? c->n_layers : 1, 1);
    if (!c->linear_layers) return nf_error_set(err, NF_ERR_NOMEM, "plan: out of memory");
    char key[128];
    snprintf(key, sizeof key, "%s.attention.recurrent_layers", a);
    if (nf_gguf_find_kv(p->gguf, key)) {
        const nf_gguf_kv *arr;
        if ((s = nf_gguf_get_array(p->gguf, key, NF_GGUF_INT64, &arr, err)) != NF_OK)
            return nf_error_prefix(err, "%s", p->source);
        if (arr->n < c->n_layers) /* n_layers + the MTP layer's entry (false: full attention, gguf_mtp) */
            return nf_error_set(err, NF_ERR_FORMAT, "%s: '%s' has %llu entries for %u layers", p->source, key,
                                    (unsigned long long)arr->n, c->n_layers);
        for (uint32_t i = 0; i < c->n_layers; i++) c->linear_layers[i] = nf_gguf_arr_int(arr, i) != 0;
    } else
        for (uint32_t i = 0; i < c->n_layers; i++) c->linear_layers[i] = (i + 1) % every != 0;
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
                            "%s: architecture '%s' is not supported (supported: qwen3moe, qwen2moe, llama, qwen3next, "
                            "qwen35moe)", p->source, a);
    nf_hf_config *c = &p->cfg;
    c->arch = ga->arch;
    c->rms_eps = 1e-6;
    c->rope.theta = 10000;
    snprintf(c->rope.type, sizeof c->rope.type, "default");
    c->decoder_sparse_step = 1;
    s = gguf_u32(p, a, "embedding_length", &c->hidden_size, 1, err);
    if (!s) s = gguf_u32(p, a, "block_count", &c->n_layers, 1, err);
    if (!s && nf_hf_arch_hybrid(c->arch)) {
        /* conversion/qwen.py (_QwenMtpMixin) counts the MTP layers in block_count and writes their
         * number as nextn_predict_layers; they follow the trunk's (gguf_mtp reads the first) */
        s = gguf_u32(p, a, "nextn_predict_layers", &p->gguf_mtp_layers, 0, err);
        if (!s && p->gguf_mtp_layers >= c->n_layers)
            return nf_error_set(err, NF_ERR_FORMAT, "%s: '%s.nextn_predict_layers' %u leaves no layers of block_count %u",
                                p->source, a, p->gguf_mtp_layers, c->n_layers);
        if (!s && p->gguf_mtp_layers > 1) /* as the HF plan refuses mtp.layers.1 */
            return nf_error_set(err, NF_ERR_UNSUPPORTED, "%s: '%s.nextn_predict_layers' is %u; ninfer reads one MTP layer "
                                "(the hybrids' checkpoints carry one)", p->source, a, p->gguf_mtp_layers);
        c->n_layers -= p->gguf_mtp_layers;
    }
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
    if (!s && nf_hf_arch_hybrid(c->arch)) s = gguf_hybrid(p, a, c, err);
    if (s) return s;
    /* llama.cpp: qwen3moe renormalises the top-k weights, qwen2moe does not; qwen3next and qwen35moe do
     * (src/models/qwen3next.cpp and qwen35moe.cpp pass norm_w = true to build_moe_ffn) */
    c->norm_topk_prob = c->arch == NF_HF_QWEN3_MOE || nf_hf_arch_hybrid(c->arch);
    const nf_gguf_tensor *e = nf_gguf_find_tensor(p->gguf, "token_embd.weight");
    if (!e) return nf_error_set(err, NF_ERR_FORMAT, "%s: tensor 'token_embd.weight' is missing", p->source);
    c->vocab_size = (uint32_t)e->ne[1];
    c->tie_word_embeddings = nf_gguf_find_tensor(p->gguf, "output.weight") == NULL;
    /* qwen2moe: q/k/v biases when layer 0 has them (llama.cpp's are optional); then every layer must */
    c->qkv_bias = c->arch == NF_HF_QWEN2_MOE && nf_gguf_find_tensor(p->gguf, "blk.0.attn_q.bias") != NULL;
    /* No expert_shared_feed_forward_length: the row length of the first ffn_down_shexp (layer 0 may
     * be a dense one) */
    for (uint32_t i = 0; (c->arch == NF_HF_QWEN2_MOE || nf_hf_arch_hybrid(c->arch)) && !c->shared_intermediate_size &&
                         i < c->n_layers; i++) {
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

/* One GGUF tensor as one artifact tensor; untile_k/untile_w and neg_exp_log as in plan.h's part. */
static nf_status gguf_one(nf_plan *p, const char *name, nf_role r, int layer, const char *gname, uint64_t rows,
                          uint64_t cols, uint32_t untile_k, uint32_t untile_w, int neg_exp_log, nf_error *err)
{
    uint64_t dims[2] = {rows, cols};
    int vec = r == NF_ROLE_VECTOR;
    nf_plan_tensor *t = nf_plan_add_tensor(p, name, vec ? 1 : 2, vec ? dims + 1 : dims, err);
    if (!t) return NF_ERR_NOMEM;
    nf_status s = gguf_part(p, t, gname, 0, rows, rows, cols, err);
    if (s) return s;
    t->parts[0].untile_k = untile_k;
    t->parts[0].untile_w = untile_w;
    t->parts[0].neg_exp_log = neg_exp_log;
    return nf_plan_decide(p, t, r, layer, err);
}

static nf_status gguf_simple(nf_plan *p, const char *name, nf_role r, int layer, const char *gname, uint64_t rows,
                             uint64_t cols, nf_error *err)
{
    return gguf_one(p, name, r, layer, gname, rows, cols, 0, 0, 0, err);
}

/* Rows [row0, row0 + rows) of GGUF tensor g, which has src_rows rows. */
typedef struct gguf_rows {
    const char *g;
    uint64_t row0, rows, src_rows;
} gguf_rows;

/* An output matrix stacked from row ranges of GGUF tensors, in order. */
static nf_status gguf_gather(nf_plan *p, const char *name, nf_role r, int layer, const gguf_rows *g, size_t n,
                             uint64_t cols, nf_error *err)
{
    uint64_t d[2] = {0, cols};
    for (size_t i = 0; i < n; i++) d[0] += g[i].rows;
    nf_plan_tensor *t = nf_plan_add_tensor(p, name, 2, d, err);
    if (!t) return NF_ERR_NOMEM;
    nf_status s = NF_OK;
    for (size_t i = 0; i < n && s == NF_OK; i++) s = gguf_part(p, t, g[i].g, g[i].row0, g[i].rows, g[i].src_rows, cols, err);
    return s ? s : nf_plan_decide(p, t, r, layer, err);
}

/* The Gated DeltaNet v-head rows of GGUF tensor gname (w rows per v head, from row `base`; the tensor
 * has src_rows rows) in the artifact's grouped order: v head h * r + i is k head h's i-th (r = Hv /
 * Hk), as transformers has them. tiled: llama.cpp's converter (conversion/qwen.py,
 * _LinearAttentionVReorderBase._reorder_v_heads, qwen35moe) moved v head h * r + i to i * Hk + h; this
 * reads it back from there. Fills g[Hv]. */
static void gguf_v_rows(gguf_rows *g, const char *gname, uint64_t base, uint64_t src_rows, uint64_t Hk, uint64_t r,
                        uint64_t w, int tiled)
{
    for (uint64_t h = 0; h < Hk; h++)
        for (uint64_t i = 0; i < r; i++)
            g[h * r + i] = (gguf_rows){gname, base + (tiled ? i * Hk + h : h * r + i) * w, w, src_rows};
}

/* llama.cpp's converter stores ssm_a = -exp(A_log) (conversion/qwen.py, Qwen3NextModel.modify_tensors);
 * the artifact holds A_log = log(-ssm_a), so a value >= 0 (or NaN) is refused here, naming it. */
static nf_status gguf_check_ssm_a(nf_plan *p, const char *gname, nf_error *err)
{
    const nf_gguf_tensor *g = nf_gguf_find_tensor(p->gguf, gname);
    float *v = malloc(g->n_elems * sizeof *v);
    if (!v) return nf_error_set(err, NF_ERR_NOMEM, "plan: out of memory");
    g->codec->dequantize_row(g->data, v, g->n_elems);
    nf_status s = NF_OK;
    for (uint64_t k = 0; k < g->n_elems && s == NF_OK; k++)
        if (!(v[k] < 0))
            s = nf_error_set(err, NF_ERR_FORMAT, "%s: tensor '%s' element %llu is %g; llama.cpp stores -exp(A_log) there, "
                             "which is negative", p->source, gname, (unsigned long long)k, (double)v[k]);
    free(v);
    return s;
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

/* The GGUF block that layer i is read from: i itself, or for the MTP block (i = NF_RECIPE_LAYER_MTP, the
 * recipe's layer number for its codecs) the first block after the trunk's, where llama.cpp's converter
 * put `mtp.layers.0` (conversion/qwen.py, _QwenMtpMixin.filter_tensors). */
static int gguf_block(const nf_plan *p, int i)
{
    return i == NF_RECIPE_LAYER_MTP ? (int)p->cfg.n_layers : i;
}

/* N: the artifact's name in the current block (p->blk: "blk.N." or "mtp.blk.0."); G, G2: the GGUF's */
#define N(fmt) (snprintf(n1, sizeof n1, "%s" fmt, p->blk), n1)
#define G(fmt) (snprintf(g1, sizeof g1, "blk.%d." fmt, gguf_block(p, i)), g1)
#define G2(fmt) (snprintf(g2, sizeof g2, "blk.%d." fmt, gguf_block(p, i)), g2)

/* A hybrid's gated attention. attn_q.weight is transformers' q_proj as it is (llama.cpp's graph,
 * src/models/qwen3next.cpp build_layer_attn, views each head's 2 * head_dim rows as [query | gate]):
 * split per head into attn_q and attn_gate. The q/k norms carry 1 + w already (below). */
static nf_status gguf_gated_attn(nf_plan *p, int i, nf_error *err)
{
    const nf_hf_config *c = &p->cfg;
    uint64_t H = c->hidden_size, hd = c->head_dim, q = (uint64_t)c->n_heads * hd, kv = (uint64_t)c->n_kv_heads * hd;
    char n1[64], g1[96];
    gguf_rows *g = malloc(c->n_heads * sizeof *g);
    if (!g) return nf_error_set(err, NF_ERR_NOMEM, "plan: out of memory");
    nf_status s = NF_OK;
    /* convert_hf_to_gguf.py --fuse-qkv (conversion/base.py modify_tensors) writes attn_qkv.weight =
     * attn_q rows, then attn_k's, then attn_v's, and no attn_q/k/v */
    int fused = !nf_gguf_find_tensor(p->gguf, G("attn_q.weight")) && nf_gguf_find_tensor(p->gguf, G("attn_qkv.weight"));
    uint64_t src_rows = fused ? 2 * q + 2 * kv : 2 * q;
    if (fused) G("attn_qkv.weight");
    else G("attn_q.weight");
    for (int half = 0; half < 2 && s == NF_OK; half++) {
        for (uint32_t h = 0; h < c->n_heads; h++) g[h] = (gguf_rows){g1, (2 * h + half) * hd, hd, src_rows};
        s = gguf_gather(p, half ? N("attn_gate") : N("attn_q"), NF_ROLE_ATTN_Q, i, g, c->n_heads, H, err);
    }
    free(g);
    if (!s && fused) {
        gguf_rows r = {g1, 2 * q, kv, src_rows};
        s = gguf_gather(p, N("attn_k"), NF_ROLE_ATTN_K, i, &r, 1, H, err);
        r.row0 += kv;
        if (!s) s = gguf_gather(p, N("attn_v"), NF_ROLE_ATTN_V, i, &r, 1, H, err);
    } else {
        if (!s) s = gguf_simple(p, N("attn_k"), NF_ROLE_ATTN_K, i, G("attn_k.weight"), kv, H, err);
        if (!s) s = gguf_simple(p, N("attn_v"), NF_ROLE_ATTN_V, i, G("attn_v.weight"), kv, H, err);
    }
    if (!s) s = gguf_simple(p, N("attn_output"), NF_ROLE_ATTN_O, i, G("attn_output.weight"), H, q, err);
    if (!s) s = gguf_simple(p, N("attn_q_norm"), NF_ROLE_VECTOR, i, G("attn_q_norm.weight"), 1, hd, err);
    if (!s) s = gguf_simple(p, N("attn_k_norm"), NF_ROLE_VECTOR, i, G("attn_k_norm.weight"), 1, hd, err);
    return s;
}

/* A Gated DeltaNet layer's tensors from llama.cpp's (conversion/qwen.py; the graph is
 * src/models/qwen3next.cpp and qwen35moe.cpp build_layer_attn_linear):
 *   ssm_qkv <- attn_qkv.weight: q of every k head, k of every k head, then the v heads (qwen3next:
 *              Qwen3NextModel.modify_tensors re-packed in_proj_qkvz into this order, v heads grouped
 *              as transformers has them; qwen35moe: in_proj_qkv with its v heads tiled, untiled here);
 *              or the legacy qwen3next ssm_in.weight (in_proj_qkvz as it is: per k head [q | k | v | z]);
 *   ssm_z   <- attn_gate.weight (qwen35moe: v heads tiled), or the z rows of ssm_in;
 *   ssm_ba  <- qwen3next ssm_ba.weight (in_proj_ba as it is: per k head [b of its r v heads | a of
 *              them]); qwen35moe ssm_beta.weight then ssm_alpha.weight (rows tiled);
 *   ssm_conv <- ssm_conv1d.weight [conv_dim][K] (the converter squeezed transformers' [conv_dim][1][K];
 *              qwen35moe: the v channels tiled);
 *   ssm_dt_bias <- ssm_dt.bias (renamed from dt_bias; qwen35moe tiled);
 *   ssm_a_log <- ssm_a, which holds -exp(A_log) (Qwen3NextModel.modify_tensors; qwen35moe tiled): the
 *              artifact gets log(-x) (convert.c a_log_of);
 *   ssm_norm <- ssm_norm.weight as it is (the plain RMSNormGated weight: the converter's "+ 1" skips
 *              linear_attn.norm.weight);
 *   ssm_out <- ssm_out.weight (qwen35moe: its columns tiled per v head, untiled by convert.c). */
static nf_status gguf_gdn(nf_plan *p, int i, nf_error *err)
{
    const nf_hf_config *c = &p->cfg;
    const uint64_t Hk = c->lin_k_heads, Hv = c->lin_v_heads, dk = c->lin_k_dim, dv = c->lin_v_dim, r = Hv / Hk;
    const uint64_t H = c->hidden_size, Kd = Hk * dk, Vd = Hv * dv, conv = 2 * Kd + Vd, K = c->conv_kernel;
    const int tiled = c->arch == NF_HF_QWEN3_5_MOE_TEXT;
    char n1[64], g1[96], g2[96];
    gguf_rows *g = calloc(3 * Hk + 2 * Hv + 1, sizeof *g);
    if (!g) return nf_error_set(err, NF_ERR_NOMEM, "plan: out of memory");
    nf_status s = NF_OK;
    if (c->arch == NF_HF_QWEN3_NEXT && !nf_gguf_find_tensor(p->gguf, G("attn_qkv.weight")) &&
        nf_gguf_find_tensor(p->gguf, G2("ssm_in.weight"))) { /* legacy: in_proj_qkvz per k head [q | k | v | z] */
        const uint64_t gs = 2 * dk + 2 * r * dv;
        for (uint64_t h = 0; h < Hk; h++) {
            g[h] = (gguf_rows){g2, h * gs, dk, Hk * gs};
            g[Hk + h] = (gguf_rows){g2, h * gs + dk, dk, Hk * gs};
            g[2 * Hk + h] = (gguf_rows){g2, h * gs + 2 * dk, r * dv, Hk * gs};
        }
        s = gguf_gather(p, N("ssm_qkv"), NF_ROLE_SSM_IN, i, g, 3 * Hk, H, err);
        for (uint64_t h = 0; h < Hk; h++) g[h] = (gguf_rows){g2, h * gs + 2 * dk + r * dv, r * dv, Hk * gs};
        if (!s) s = gguf_gather(p, N("ssm_z"), NF_ROLE_SSM_IN, i, g, Hk, H, err);
    } else {
        g[0] = (gguf_rows){G("attn_qkv.weight"), 0, 2 * Kd, conv};
        gguf_v_rows(g + 1, g1, 2 * Kd, conv, Hk, r, dv, tiled);
        s = gguf_gather(p, N("ssm_qkv"), NF_ROLE_SSM_IN, i, g, 1 + Hv, H, err);
        gguf_v_rows(g, G2("attn_gate.weight"), 0, Vd, Hk, r, dv, tiled);
        if (!s) s = gguf_gather(p, N("ssm_z"), NF_ROLE_SSM_IN, i, g, Hv, H, err);
    }
    if (!s && c->arch == NF_HF_QWEN3_NEXT) {
        G("ssm_ba.weight");
        for (uint64_t h = 0; h < Hk; h++) {
            g[h] = (gguf_rows){g1, h * 2 * r, r, 2 * Hv};
            g[Hk + h] = (gguf_rows){g1, h * 2 * r + r, r, 2 * Hv};
        }
        s = gguf_gather(p, N("ssm_ba"), NF_ROLE_SSM_BA, i, g, 2 * Hk, H, err);
    } else if (!s) {
        gguf_v_rows(g, G("ssm_beta.weight"), 0, Hv, Hk, r, 1, tiled);
        gguf_v_rows(g + Hv, G2("ssm_alpha.weight"), 0, Hv, Hk, r, 1, tiled);
        s = gguf_gather(p, N("ssm_ba"), NF_ROLE_SSM_BA, i, g, 2 * Hv, H, err);
    }
    if (!s) {
        g[0] = (gguf_rows){G("ssm_conv1d.weight"), 0, 2 * Kd, conv};
        gguf_v_rows(g + 1, g1, 2 * Kd, conv, Hk, r, dv, tiled);
        s = gguf_gather(p, N("ssm_conv"), NF_ROLE_VECTOR, i, g, 1 + Hv, K, err);
    }
    free(g);
    const uint32_t uk = tiled ? (uint32_t)Hk : 0;
    if (!s) s = gguf_one(p, N("ssm_dt_bias"), NF_ROLE_VECTOR, i, G("ssm_dt.bias"), 1, Hv, uk, tiled, 0, err);
    if (!s) s = gguf_one(p, N("ssm_a_log"), NF_ROLE_VECTOR, i, G("ssm_a"), 1, Hv, uk, tiled, 1, err);
    if (!s) s = gguf_check_ssm_a(p, g1, err); /* after gguf_one has checked its shape */
    if (!s) s = gguf_simple(p, N("ssm_norm"), NF_ROLE_VECTOR, i, G("ssm_norm.weight"), 1, dv, err);
    if (!s) s = gguf_one(p, N("ssm_out"), NF_ROLE_SSM_OUT, i, G("ssm_out.weight"), H, Vd, uk, tiled ? (uint32_t)dv : 0, 0, err);
    return s;
}

/* One layer. The hybrids' zero-centred norms (attn_norm, post_attention_norm -> ffn_norm, the q/k norms,
 * output_norm) are carried as they are: llama.cpp's converter already stored 1 + w, computed in f32
 * from the checkpoint's values (Qwen3NextModel.modify_tensors `data_torch + 1` after prepare_tensors'
 * cast of bf16 to f32), which is what the artifact holds (docs/model_schema.md). */
static nf_status gguf_ffn(nf_plan *p, int i, int moe, nf_error *err);

static nf_status gguf_layer(nf_plan *p, int i, nf_error *err)
{
    const nf_hf_config *c = &p->cfg;
    uint64_t H = c->hidden_size, q = (uint64_t)c->n_heads * c->head_dim, kv = (uint64_t)c->n_kv_heads * c->head_dim;
    char n1[64], g1[96];
    const int moe = nf_hf_config_layer_is_moe(c, (uint32_t)i);
    snprintf(p->blk, sizeof p->blk, "blk.%d.", i);
    nf_status s = gguf_simple(p, N("attn_norm"), NF_ROLE_VECTOR, i, G("attn_norm.weight"), 1, H, err);
    if (!s && nf_hf_arch_hybrid(c->arch)) {
        s = c->linear_layers[i] ? gguf_gdn(p, i, err) : gguf_gated_attn(p, i, err);
        if (!s) s = gguf_simple(p, N("ffn_norm"), NF_ROLE_VECTOR, i, G("post_attention_norm.weight"), 1, H, err);
        return s ? s : gguf_ffn(p, i, moe, err);
    }
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
    return s ? s : gguf_ffn(p, i, moe, err);
}

/* The layer's MLP: dense, or (moe) router + routed experts (+ the shared expert: qwen2moe, the hybrids). */
static nf_status gguf_ffn(nf_plan *p, int i, int moe, nf_error *err)
{
    const nf_hf_config *c = &p->cfg;
    uint64_t H = c->hidden_size, E = c->n_experts, I = c->moe_intermediate_size, S = c->shared_intermediate_size;
    char n1[64], g1[96], g2[96];
    nf_status s;
    if (!moe) {
        uint64_t D = c->intermediate_size;
        s = gguf_simple(p, N("ffn_gate"), NF_ROLE_FFN_GATE_UP, i, G("ffn_gate.weight"), D, H, err);
        if (!s) s = gguf_simple(p, N("ffn_up"), NF_ROLE_FFN_GATE_UP, i, G("ffn_up.weight"), D, H, err);
        if (!s) s = gguf_simple(p, N("ffn_down"), NF_ROLE_FFN_DOWN, i, G("ffn_down.weight"), H, D, err);
        return s;
    }
    s = gguf_simple(p, N("ffn_gate_inp"), NF_ROLE_ROUTER, i, G("ffn_gate_inp.weight"), E, H, err);
    if (!s && nf_gguf_find_tensor(p->gguf, G("ffn_gate_up_exps.weight"))) {
        /* convert_hf_to_gguf.py --fuse-gate-up-exps (the hybrids): per expert the gate rows then the up
         * rows (torch.cat([gate, up], dim=1), conversion/base.py), the artifact's layout already */
        uint64_t d3[3] = {E, 2 * I, H};
        nf_plan_tensor *t = nf_plan_add_tensor(p, N("ffn_gate_up_exps"), 3, d3, err);
        if (!t) return NF_ERR_NOMEM;
        s = gguf_part(p, t, g1, 0, E * 2 * I, E * 2 * I, H, err);
        if (!s) s = nf_plan_decide(p, t, NF_ROLE_EXP_GATE_UP, i, err);
    } else if (!s)
        s = gguf_exp_bank(p, i, N("ffn_gate_up_exps"), G("ffn_gate_exps.weight"), G2("ffn_up_exps.weight"), E, I, H, err);
    if (!s) {
        uint64_t dd[3] = {E, H, I};
        nf_plan_tensor *t = nf_plan_add_tensor(p, N("ffn_down_exps"), 3, dd, err);
        if (!t) return NF_ERR_NOMEM;
        for (uint64_t j = 0; j < E && !s; j++) s = gguf_part(p, t, G("ffn_down_exps.weight"), j * H, H, E * H, I, err);
        if (!s) s = nf_plan_decide(p, t, NF_ROLE_EXP_DOWN, i, err);
    }
    if (!s && S && (c->arch == NF_HF_QWEN2_MOE || nf_hf_arch_hybrid(c->arch))) {
        s = gguf_exp_bank(p, i, N("ffn_gate_up_shexp"), G("ffn_gate_shexp.weight"), G2("ffn_up_shexp.weight"), 0, S, H, err);
        if (!s) s = gguf_simple(p, N("ffn_down_shexp"), NF_ROLE_SHEXP_DOWN, i, G("ffn_down_shexp.weight"), H, S, err);
        if (!s) s = gguf_simple(p, N("ffn_gate_inp_shexp"), NF_ROLE_VECTOR, i, G("ffn_gate_inp_shexp.weight"), 1, H, err);
    }
    return s;
}

/* The hybrids' MTP block (docs/hybrid.md "MTP"; the HF plan's hf_mtp writes the same tensors from
 * `mtp.*`). llama.cpp's converter (conversion/qwen.py, _QwenMtpMixin.filter_tensors) renamed
 * `mtp.layers.0.*` to the layer after the trunk's, L = block_count - nextn_predict_layers, which the
 * tensor map then names as any layer (attn_norm, attn_q [query | gate per head], attn_k/v/output,
 * attn_q/k_norm, post_attention_norm, the MoE block and shared expert), and `mtp.fc`,
 * `mtp.pre_fc_norm_embedding`, `mtp.pre_fc_norm_hidden`, `mtp.norm` to `blk.L.nextn.eh_proj`, `.enorm`,
 * `.hnorm`, `.shared_head_norm`. Every norm name there ends in "norm.weight", so Qwen3NextModel.
 * modify_tensors stored 1 + w for all of them (what the artifact holds); eh_proj [H][2H] is fc as it is
 * ([normed embedding | normed hidden] columns, the order of llama.cpp's graph's concat and of vLLM's);
 * the layer is full attention, so qwen35moe's v-head tiling (linear_attn.* only) never touched it.
 * A GGUF written with --no-mtp has neither nextn_predict_layers nor these tensors and converts as
 * before; one that announces the layer without `blk.L.nextn.eh_proj` converts without the block, with a
 * warning. llama.cpp's graph takes output_norm where shared_head_norm is absent (src/models/qwen35moe.cpp
 * graph_mtp), and so does this; a block with its own embedding or head
 * (`nextn.embed_tokens`, `nextn.shared_head_head`, optional in llama.cpp's loader, never written for
 * these models) is refused: ninfer's block uses the main model's. */
static nf_status gguf_mtp(nf_plan *p, nf_error *err)
{
    const nf_hf_config *c = &p->cfg;
    const uint64_t H = c->hidden_size;
    const int i = NF_RECIPE_LAYER_MTP;
    char n1[64], g1[96];
    if (!nf_hf_arch_hybrid(c->arch) || !p->gguf_mtp_layers) return NF_OK;
    if (!nf_gguf_find_tensor(p->gguf, G("nextn.eh_proj.weight"))) { /* announced but stripped: the trunk still reads */
        NF_WARN("convert: %s: nextn_predict_layers is %u but tensor '%s' is missing: converted without the MTP block "
                "(--spec mtp will be refused)", p->source, p->gguf_mtp_layers, g1);
        p->n_warnings++;
        return NF_OK;
    }
    if (nf_gguf_find_tensor(p->gguf, G("nextn.embed_tokens.weight")) ||
        nf_gguf_find_tensor(p->gguf, G("nextn.shared_head_head.weight")))
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "%s: tensor '%s': an MTP layer with its own embedding or LM head is "
                            "not supported (ninfer's MTP block uses the main model's)", p->source, g1);
    snprintf(p->blk, sizeof p->blk, "mtp.blk.0.");
    nf_status s = gguf_simple(p, "mtp.fc", NF_ROLE_SSM_IN, i, G("nextn.eh_proj.weight"), H, 2 * H, err);
    if (!s) s = gguf_simple(p, "mtp.norm_embd", NF_ROLE_VECTOR, i, G("nextn.enorm.weight"), 1, H, err);
    if (!s) s = gguf_simple(p, "mtp.norm_hidden", NF_ROLE_VECTOR, i, G("nextn.hnorm.weight"), 1, H, err);
    if (!s) s = gguf_simple(p, "mtp.output_norm", NF_ROLE_VECTOR, i,
                            nf_gguf_find_tensor(p->gguf, G("nextn.shared_head_norm.weight")) ? g1 : "output_norm.weight",
                            1, H, err);
    if (!s) s = gguf_simple(p, N("attn_norm"), NF_ROLE_VECTOR, i, G("attn_norm.weight"), 1, H, err);
    if (!s) s = gguf_gated_attn(p, i, err);
    if (!s) s = gguf_simple(p, N("ffn_norm"), NF_ROLE_VECTOR, i, G("post_attention_norm.weight"), 1, H, err);
    if (!s) s = gguf_ffn(p, i, c->n_experts && nf_gguf_find_tensor(p->gguf, G("ffn_gate_inp.weight")), err);
    return s;
}
#undef N
#undef G
#undef G2

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
    if (!s) s = gguf_mtp(p, err);
    return s;
}

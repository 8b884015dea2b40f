/* The Hugging Face plan (safetensors checkpoints: bf16, compressed-tensors and ModelOpt NVFP4):
 * which source tensors make each output tensor, and the nvfp4 rules of its banks. See plan.h. */
#define _POSIX_C_SOURCE 200809L
#include "convert/plan.h"

/* Tensor names are built into fixed buffers far longer than any checkpoint key; an over-long name would
 * truncate and then be reported as a missing tensor, which is the right outcome. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/log.h"
#include "codec/nvfp4.h"
#include "convert/plan_internal.h"
#include "format/tensor.h"

/* A scalar (or [1]) safetensors tensor of F32/BF16/F16 as a float. */
static nf_status st_scalar(const nf_st_tensor *s, float *out, nf_error *err)
{
    if (s->n_elems != 1)
        return nf_error_set(err, NF_ERR_FORMAT, "tensor '%s': expected one value, has %llu", s->name,
                            (unsigned long long)s->n_elems);
    const uint8_t *b = s->data;
    if (s->dtype == NF_ST_F32) memcpy(out, b, 4);
    else if (s->dtype == NF_ST_BF16 || s->dtype == NF_ST_F16) {
        uint16_t h;
        memcpy(&h, b, 2);
        *out = s->dtype == NF_ST_BF16 ? nf_bf16_to_f32(h) : nf_f16_to_f32(h);
    } else
        return nf_error_set(err, NF_ERR_FORMAT, "tensor '%s': dtype %s, expected F32/BF16/F16", s->name,
                            nf_st_dtype_name(s->dtype));
    if (!(isfinite(*out) && *out > 0))
        return nf_error_set(err, NF_ERR_FORMAT, "tensor '%s': value %g is not finite and > 0", s->name, (double)*out);
    return NF_OK;
}

static const nf_st_tensor *stf(const nf_plan *p, const char *fmt, const char *m)
{
    char key[320];
    snprintf(key, sizeof key, fmt, m);
    return nf_st_set_find(p->st, key);
}

static nf_status shape_err(const char *what, const nf_st_tensor *s, uint64_t rows, uint64_t cols, nf_error *err)
{
    char got[96] = "";
    size_t o = 0;
    for (int i = 0; i < s->n_dims && o < sizeof got - 24; i++)
        o += (size_t)snprintf(got + o, sizeof got - o, "%s%llu", i ? ", " : "", (unsigned long long)s->shape[i]);
    return nf_error_set(err, NF_ERR_FORMAT, "tensor '%s' (%s): shape [%s], but config.json implies [%llu, %llu]",
                        s->name, what, got, (unsigned long long)rows, (unsigned long long)cols);
}

/* Rows x cols of a safetensors tensor viewed as a matrix (leading dims flattened). */
static void st_matrix(const nf_st_tensor *s, uint64_t *rows, uint64_t *cols)
{
    *cols = s->n_dims ? s->shape[s->n_dims - 1] : 1;
    *rows = *cols ? s->n_elems / *cols : 0;
}

/* ---- HF parts -------------------------------------------------------------------------------- */

/* Adds module `m`'s weight ([rows][cols], rows [row0, row0+rows) of the key when `fused`) as a part of
 * t: dense, compressed-tensors NVFP4 or ModelOpt NVFP4, whichever the checkpoint holds. */
static nf_status hf_part(nf_plan *p, nf_plan_tensor *t, const char *m, uint64_t row0, uint64_t rows, uint64_t cols,
                         uint64_t src_rows, nf_error *err)
{
    nf_plan_part *q = nf_plan_add_part(t, err);
    if (!q) return NF_ERR_NOMEM;
    q->row0 = row0;
    q->rows = rows;
    const nf_st_tensor *w;
    uint64_t r, c;
    if ((w = stf(p, "%s.weight_packed", m)) != NULL) {
        const nf_st_tensor *sc = stf(p, "%s.weight_scale", m), *gs = stf(p, "%s.weight_global_scale", m);
        if (!sc || !gs)
            return nf_error_set(err, NF_ERR_FORMAT, "module '%s': weight_packed without weight_scale/weight_global_scale",
                                m);
        q->kind = NF_PART_CT_NVFP4;
        nf_status s = st_scalar(gs, &q->divisor, err);
        const nf_st_tensor *ig = stf(p, "%s.input_global_scale", m);
        if (s == NF_OK && ig) s = st_scalar(ig, &q->input_divisor, err);
        if (s) return s;
        st_matrix(w, &r, &c);
        if (w->dtype != NF_ST_U8 || r != src_rows || c * 2 != cols) return shape_err("packed nvfp4", w, src_rows, cols / 2, err);
        st_matrix(sc, &r, &c);
        if (sc->dtype != NF_ST_F8_E4M3 || r != src_rows || c * 16 != cols)
            return shape_err("e4m3 block scales", sc, src_rows, cols / 16, err);
        snprintf(q->src, sizeof q->src, "%s", m);
        q->src_codec = NF_CODEC_NVFP4;
        return NF_OK;
    }
    if ((w = stf(p, "%s.weight", m)) == NULL)
        return nf_error_set(err, NF_ERR_FORMAT, "tensor '%s.weight' is missing from the checkpoint (needed for %s)", m,
                            t->name);
    if (w->dtype == NF_ST_U8) { /* ModelOpt NVFP4 */
        const nf_st_tensor *sc = stf(p, "%s.weight_scale", m), *s2 = stf(p, "%s.weight_scale_2", m);
        if (!sc || !s2)
            return nf_error_set(err, NF_ERR_FORMAT, "module '%s': u8 weight without weight_scale/weight_scale_2", m);
        q->kind = NF_PART_MO_NVFP4;
        float mul, in = 0;
        nf_status s = st_scalar(s2, &mul, err);
        const nf_st_tensor *is = stf(p, "%s.input_scale", m);
        if (s == NF_OK && is) s = st_scalar(is, &in, err);
        if (s) return s;
        q->divisor = 1.0f / mul; /* weight_scale_2 multiplies; our word divides */
        q->input_divisor = in > 0 ? 1.0f / in : 0;
        st_matrix(w, &r, &c);
        if (r != src_rows || c * 2 != cols) return shape_err("packed nvfp4", w, src_rows, cols / 2, err);
        st_matrix(sc, &r, &c);
        if (sc->dtype != NF_ST_F8_E4M3 || r != src_rows || c * 16 != cols)
            return shape_err("e4m3 block scales", sc, src_rows, cols / 16, err);
        snprintf(q->src, sizeof q->src, "%s", m);
        q->src_codec = NF_CODEC_NVFP4;
        return NF_OK;
    }
    if (w->dtype != NF_ST_BF16 && w->dtype != NF_ST_F16 && w->dtype != NF_ST_F32)
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "tensor '%s': dtype %s, expected BF16, F16 or F32", w->name,
                            nf_st_dtype_name(w->dtype));
    st_matrix(w, &r, &c);
    if (r != src_rows || c != cols) return shape_err(t->name, w, src_rows, cols, err);
    q->kind = NF_PART_DENSE;
    q->src_codec = w->dtype == NF_ST_BF16 ? NF_CODEC_BF16 : w->dtype == NF_ST_F16 ? NF_CODEC_F16 : NF_CODEC_F32;
    snprintf(q->src, sizeof q->src, "%s", w->name);
    return NF_OK;
}

/* A vector or matrix from one HF module (or one plain key when `key` ends in .weight/.bias). */
static nf_status hf_simple(nf_plan *p, const char *name, nf_role r, int layer, const char *m, uint64_t rows,
                           uint64_t cols, int group, nf_error *err)
{
    uint64_t dims[2] = {rows, cols};
    int vec = r == NF_ROLE_VECTOR;
    nf_plan_tensor *t = nf_plan_add_tensor(p, name, vec ? 1 : 2, vec ? dims + 1 : dims, err);
    if (!t) return NF_ERR_NOMEM;
    t->unify_group = group;
    if (vec) { /* m is the full key */
        nf_plan_part *q = nf_plan_add_part(t, err);
        if (!q) return NF_ERR_NOMEM;
        const nf_st_tensor *s = nf_st_set_find(p->st, m);
        if (!s) return nf_error_set(err, NF_ERR_FORMAT, "tensor '%s' is missing from the checkpoint (needed for %s)", m, name);
        if (s->n_elems != cols || (s->dtype != NF_ST_BF16 && s->dtype != NF_ST_F16 && s->dtype != NF_ST_F32))
            return shape_err(name, s, 1, cols, err);
        snprintf(q->src, sizeof q->src, "%s", m);
        q->kind = NF_PART_DENSE;
        q->src_codec = s->dtype == NF_ST_BF16 ? NF_CODEC_BF16 : s->dtype == NF_ST_F16 ? NF_CODEC_F16 : NF_CODEC_F32;
        q->rows = 1;
        t->codec = NF_CODEC_F32;
        return NF_OK;
    }
    nf_status s = hf_part(p, t, m, 0, rows, cols, rows, err);
    if (s) return s;
    (void)r;
    (void)layer;
    return NF_OK;
}

/* ---- codec decisions ------------------------------------------------------------------------- */

/* nvfp4 tile rule and the W4A4 policy of a bank or matrix. */
static nf_status nvfp4_rules(nf_plan *p, nf_plan_tensor *t, nf_role r, nf_error *err)
{
    if (t->codec != NF_CODEC_NVFP4) return NF_OK;
    uint64_t rows = 1;
    for (uint32_t i = 0; i + 1 < t->n_dims; i++) rows *= t->dims[i];
    if (t->divisors > 1)
        for (uint32_t i = 0; i < t->n_parts; i++)
            if (t->parts[i].rows % 128 != 0)
                return nf_error_set(err, NF_ERR_REFUSED,
                                    "%s: NVFP4 share '%s' has %llu rows, not a whole number of 128-row scale tiles; a "
                                    "bank of separately quantized matrices needs each share in whole tiles",
                                    t->name, t->parts[i].src, (unsigned long long)t->parts[i].rows);
    nf_nvfp4_layout l;
    nf_status s = nf_nvfp4_layout_of(rows, t->dims[t->n_dims - 1], t->divisors, &l, err);
    if (s) return nf_error_prefix(err, "%s", t->name);
    if (t->action != NF_ACT_NVFP4_COPY || !p->w4a4) return NF_OK;
    for (uint32_t i = 0; i < t->n_parts; i++)
        if (!(t->parts[i].input_divisor > 0)) return NF_OK; /* weight-only matrix: no A4 */
    t->flags |= NF_TENSOR_ALLOW_A4;
    if (r == NF_ROLE_EXP_DOWN) { /* each expert's intermediate is its own: one input divisor per expert */
        t->n_input_divisors = (uint32_t)t->dims[0];
        t->input_divisors = malloc(t->n_input_divisors * sizeof(float));
        if (!t->input_divisors) return nf_error_set(err, NF_ERR_NOMEM, "plan: out of memory");
        for (uint32_t e = 0; e < t->n_input_divisors; e++) t->input_divisors[e] = t->parts[e].input_divisor;
        return NF_OK;
    }
    t->n_input_divisors = 1;
    t->input_divisors = malloc(sizeof(float));
    if (!t->input_divisors) return nf_error_set(err, NF_ERR_NOMEM, "plan: out of memory");
    float lo = INFINITY, hi = 0;
    for (uint32_t i = 0; i < t->n_parts; i++) {
        lo = fminf(lo, t->parts[i].input_divisor);
        hi = fmaxf(hi, t->parts[i].input_divisor);
    }
    t->input_divisors[0] = lo;
    t->in_spread_min = lo;
    t->in_spread_max = hi;
    return NF_OK;
}

/* ---- the Hugging Face plan ------------------------------------------------------------------- */

static nf_status hf_matrix(nf_plan *p, const char *name, nf_role r, int layer, const char *m, uint64_t rows,
                           uint64_t cols, int group, nf_error *err)
{
    nf_status s = hf_simple(p, name, r, layer, m, rows, cols, group, err);
    if (s) return s;
    nf_plan_tensor *t = &p->t[p->n - 1];
    if ((s = nf_plan_decide(p, t, r, layer, err)) != NF_OK) return s;
    return nvfp4_rules(p, t, r, err);
}

/* The routed expert banks of layer i, per-expert or fused keys. */
static nf_status hf_experts(nf_plan *p, int i, const char *pre, int group, nf_error *err)
{
    const nf_hf_config *c = &p->cfg;
    uint64_t E = c->n_experts, I = c->moe_intermediate_size, H = c->hidden_size;
    char name[64], m[320];
    snprintf(m, sizeof m, "%s.mlp.experts.gate_up_proj", pre);
    const nf_st_tensor *fgu = nf_st_set_find(p->st, m);
    uint64_t d3[3] = {E, 2 * I, H};
    snprintf(name, sizeof name, "%sffn_gate_up_exps", p->blk);
    nf_plan_tensor *t = nf_plan_add_tensor(p, name, 3, d3, err);
    if (!t) return NF_ERR_NOMEM;
    t->unify_group = group;
    nf_status s = NF_OK;
    for (uint64_t j = 0; j < E && s == NF_OK; j++) {
        if (fgu) { /* fused [E, 2I, H]: gate rows first */
            snprintf(m, sizeof m, "%s.mlp.experts.gate_up_proj", pre);
            if (fgu->n_dims != 3 || fgu->shape[0] != E || fgu->shape[1] != 2 * I || fgu->shape[2] != H)
                return nf_error_set(err, NF_ERR_FORMAT, "tensor '%s': expected [%llu, %llu, %llu] from config.json", m,
                                    (unsigned long long)E, (unsigned long long)(2 * I), (unsigned long long)H);
            for (int h = 0; h < 2 && s == NF_OK; h++) {
                nf_plan_part *q = nf_plan_add_part(t, err);
                if (!q) return NF_ERR_NOMEM;
                snprintf(q->src, sizeof q->src, "%s", m);
                q->kind = NF_PART_DENSE;
                q->src_codec = fgu->dtype == NF_ST_BF16 ? NF_CODEC_BF16 : fgu->dtype == NF_ST_F16 ? NF_CODEC_F16 : NF_CODEC_F32;
                q->row0 = j * 2 * I + (uint64_t)h * I;
                q->rows = I;
            }
        } else {
            snprintf(m, sizeof m, "%s.mlp.experts.%llu.gate_proj", pre, (unsigned long long)j);
            s = hf_part(p, t, m, 0, I, H, I, err);
            snprintf(m, sizeof m, "%s.mlp.experts.%llu.up_proj", pre, (unsigned long long)j);
            if (s == NF_OK) s = hf_part(p, t, m, 0, I, H, I, err);
        }
    }
    if (s == NF_OK) s = nf_plan_decide(p, t, NF_ROLE_EXP_GATE_UP, i, err);
    if (s == NF_OK) s = nvfp4_rules(p, t, NF_ROLE_EXP_GATE_UP, err);
    if (s) return s;

    snprintf(m, sizeof m, "%s.mlp.experts.down_proj", pre);
    const nf_st_tensor *fd = nf_st_set_find(p->st, m);
    uint64_t dd[3] = {E, H, I};
    snprintf(name, sizeof name, "%sffn_down_exps", p->blk);
    if (!(t = nf_plan_add_tensor(p, name, 3, dd, err))) return NF_ERR_NOMEM;
    for (uint64_t j = 0; j < E && s == NF_OK; j++) {
        if (fd) {
            if (fd->n_dims != 3 || fd->shape[0] != E || fd->shape[1] != H || fd->shape[2] != I)
                return nf_error_set(err, NF_ERR_FORMAT, "tensor '%s': expected [%llu, %llu, %llu] from config.json", m,
                                    (unsigned long long)E, (unsigned long long)H, (unsigned long long)I);
            nf_plan_part *q = nf_plan_add_part(t, err);
            if (!q) return NF_ERR_NOMEM;
            snprintf(q->src, sizeof q->src, "%s", m);
            q->kind = NF_PART_DENSE;
            q->src_codec = fd->dtype == NF_ST_BF16 ? NF_CODEC_BF16 : fd->dtype == NF_ST_F16 ? NF_CODEC_F16 : NF_CODEC_F32;
            q->row0 = j * H;
            q->rows = H;
        } else {
            char mm[320];
            snprintf(mm, sizeof mm, "%s.mlp.experts.%llu.down_proj", pre, (unsigned long long)j);
            s = hf_part(p, t, mm, 0, H, I, H, err);
        }
    }
    if (s == NF_OK) s = nf_plan_decide(p, t, NF_ROLE_EXP_DOWN, i, err);
    if (s == NF_OK) s = nvfp4_rules(p, t, NF_ROLE_EXP_DOWN, err);
    return s;
}

/* The shared expert: gate/up stacked as [2N][H], and its down [H][N]. */
static nf_status hf_mlp(nf_plan *p, int i, const char *m, const char *gu_name, const char *down_name, uint64_t N,
                        int group, nf_error *err)
{
    uint64_t H = p->cfg.hidden_size;
    char key[320];
    uint64_t d[2] = {2 * N, H};
    nf_plan_tensor *t = nf_plan_add_tensor(p, gu_name, 2, d, err);
    if (!t) return NF_ERR_NOMEM;
    t->unify_group = group;
    snprintf(key, sizeof key, "%s.gate_proj", m);
    nf_status s = hf_part(p, t, key, 0, N, H, N, err);
    snprintf(key, sizeof key, "%s.up_proj", m);
    if (s == NF_OK) s = hf_part(p, t, key, 0, N, H, N, err);
    if (s == NF_OK) s = nf_plan_decide(p, t, NF_ROLE_SHEXP_GATE_UP, i, err);
    if (s == NF_OK) s = nvfp4_rules(p, t, NF_ROLE_SHEXP_GATE_UP, err);
    if (s) return s;
    snprintf(key, sizeof key, "%s.down_proj", m);
    return hf_matrix(p, down_name, NF_ROLE_SHEXP_DOWN, i, key, H, N, 0, err);
}

/* A q/k/v/o bias the config does not announce would be dropped, and the model would differ from the
 * checkpoint: refuse it, naming the tensor and the config key. */
static nf_status hf_no_bias(nf_plan *p, const char *pre, nf_error *err)
{
    static const char *const proj[] = {"q_proj", "k_proj", "v_proj", "o_proj"};
    char key[320];
    for (int j = 0; j < 4; j++) {
        snprintf(key, sizeof key, "%s.self_attn.%s.bias", pre, proj[j]);
        if (!nf_st_set_find(p->st, key)) continue;
        if (p->cfg.arch == NF_HF_QWEN2_MOE && j < 3)
            return nf_error_set(err, NF_ERR_FORMAT, "tensor '%s' is in the checkpoint but config.json says "
                                "\"qkv_bias\": false", key);
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "tensor '%s' is in the checkpoint but %s has no attention "
                            "bias there (config.json \"%s\")", key, nf_hf_arch_name(p->cfg.arch),
                            p->cfg.arch == NF_HF_QWEN2_MOE ? "qkv_bias" : "attention_bias");
    }
    return NF_OK;
}

/* A vector key as an f32 tensor; zc: a zero-centred RMSNorm weight, stored as 1 + w. */
static nf_status hf_vector(nf_plan *p, const char *name, int layer, const char *key, uint64_t n, int zc, nf_error *err)
{
    nf_status s = hf_matrix(p, name, NF_ROLE_VECTOR, layer, key, 1, n, 0, err);
    if (s == NF_OK && zc) p->t[p->n - 1].parts[0].add = 1.0f;
    return s;
}

/* Rows [row0, row0 + rows) of module m's weight, which has src_rows rows. */
typedef struct hf_rows {
    const char *m;
    uint64_t row0, rows, src_rows;
} hf_rows;

/* An output matrix stacked from row ranges of source matrices, in order (re-ordering a packed
 * projection into the artifact's layout). */
static nf_status hf_gather(nf_plan *p, const char *name, nf_role r, int layer, const hf_rows *g, size_t n,
                           uint64_t cols, int group, nf_error *err)
{
    uint64_t d[2] = {0, cols};
    for (size_t i = 0; i < n; i++) d[0] += g[i].rows;
    nf_plan_tensor *t = nf_plan_add_tensor(p, name, 2, d, err);
    if (!t) return NF_ERR_NOMEM;
    t->unify_group = group;
    nf_status s = NF_OK;
    for (size_t i = 0; i < n && s == NF_OK; i++) s = hf_part(p, t, g[i].m, g[i].row0, g[i].rows, cols, g[i].src_rows, err);
    if (s == NF_OK) s = nf_plan_decide(p, t, r, layer, err);
    if (s == NF_OK) s = nvfp4_rules(p, t, r, err);
    return s;
}

/* The layer functions below build layer i's schema names and checkpoint keys (under the layer's key
 * prefix `pre`) into their local `name` and `key` buffers. */
#define NAME(fmt) (snprintf(name, sizeof name, "%s" fmt, p->blk), name)
#define KEY(fmt) (snprintf(key, sizeof key, "%s." fmt, pre), key)

/* The layer's attention q/k/v/o, biases and q/k norms; hybrids' gated attention: q_proj holds per head
 * [query (head_dim) | gate (head_dim)], split here into attn_q (every head's query rows) and attn_gate. */
static nf_status hf_attention(nf_plan *p, int i, const char *pre, nf_error *err)
{
    const nf_hf_config *c = &p->cfg;
    const int hyb = nf_hf_arch_hybrid(c->arch);
    uint64_t H = c->hidden_size, hd = c->head_dim, q = (uint64_t)c->n_heads * hd, kv = (uint64_t)c->n_kv_heads * hd;
    char key[320], name[64];
    int g_attn = 1000 + 2 * i;
    nf_status s = NF_OK;
    if (hyb) {
        hf_rows *g = malloc(c->n_heads * sizeof *g);
        if (!g) return nf_error_set(err, NF_ERR_NOMEM, "plan: out of memory");
        KEY("self_attn.q_proj");
        for (int half = 0; half < 2 && s == NF_OK; half++) {
            for (uint32_t h = 0; h < c->n_heads; h++) g[h] = (hf_rows){key, (2 * h + half) * hd, hd, 2 * q};
            s = hf_gather(p, half ? NAME("attn_gate") : NAME("attn_q"), NF_ROLE_ATTN_Q, i, g, c->n_heads, H, g_attn, err);
        }
        free(g);
    } else
        s = hf_matrix(p, NAME("attn_q"), NF_ROLE_ATTN_Q, i, KEY("self_attn.q_proj"), q, H, g_attn, err);
    if (s == NF_OK) s = hf_matrix(p, NAME("attn_k"), NF_ROLE_ATTN_K, i, KEY("self_attn.k_proj"), kv, H, g_attn, err);
    if (s == NF_OK) s = hf_matrix(p, NAME("attn_v"), NF_ROLE_ATTN_V, i, KEY("self_attn.v_proj"), kv, H, g_attn, err);
    if (s == NF_OK) s = hf_matrix(p, NAME("attn_output"), NF_ROLE_ATTN_O, i, KEY("self_attn.o_proj"), H, q, 0, err);
    if (s == NF_OK && c->qkv_bias) {
        s = hf_matrix(p, NAME("attn_q_bias"), NF_ROLE_VECTOR, i, KEY("self_attn.q_proj.bias"), 1, q, 0, err);
        if (s == NF_OK) s = hf_matrix(p, NAME("attn_k_bias"), NF_ROLE_VECTOR, i, KEY("self_attn.k_proj.bias"), 1, kv, 0, err);
        if (s == NF_OK) s = hf_matrix(p, NAME("attn_v_bias"), NF_ROLE_VECTOR, i, KEY("self_attn.v_proj.bias"), 1, kv, 0, err);
    }
    if (s == NF_OK && !c->qkv_bias) s = hf_no_bias(p, pre, err);
    if (s == NF_OK && (c->arch == NF_HF_QWEN3_MOE || hyb)) {
        s = hf_vector(p, NAME("attn_q_norm"), i, KEY("self_attn.q_norm.weight"), hd, hyb, err);
        if (s == NF_OK) s = hf_vector(p, NAME("attn_k_norm"), i, KEY("self_attn.k_norm.weight"), hd, hyb, err);
    }
    return s;
}

/* The in_proj row ranges of a Gated DeltaNet layer in the artifact's order: ssm_qkv = every k head's q,
 * every k head's k, every v head's v (the conv's channel order); ssm_z; ssm_ba = every v head's b, then
 * every v head's a. Qwen3-Next packs in_proj_qkvz / in_proj_ba per k-head group ([q | k | v of its
 * r = Hv/Hk v heads | z of them] and [b of them | a of them]); Qwen3.5 splits them, already in order. */
static nf_status hf_gdn_in(nf_plan *p, int i, const char *pre, nf_error *err)
{
    const nf_hf_config *c = &p->cfg;
    const uint64_t Hk = c->lin_k_heads, Hv = c->lin_v_heads, dk = c->lin_k_dim, dv = c->lin_v_dim, r = Hv / Hk;
    const uint64_t H = c->hidden_size, Kd = Hk * dk, Vd = Hv * dv, gs = 2 * dk + 2 * r * dv;
    char qkvz[320], ba[320], qkv[320], z[320], b[320], a[320], name[64];
    snprintf(qkvz, sizeof qkvz, "%s.linear_attn.in_proj_qkvz", pre);
    snprintf(ba, sizeof ba, "%s.linear_attn.in_proj_ba", pre);
    hf_rows *g = malloc(3 * Hk * sizeof *g);
    if (!g) return nf_error_set(err, NF_ERR_NOMEM, "plan: out of memory");
    nf_status s;
    if (stf(p, "%s.weight", qkvz) || stf(p, "%s.weight_packed", qkvz)) {
        for (uint64_t h = 0; h < Hk; h++) {
            g[h] = (hf_rows){qkvz, h * gs, dk, Hk * gs};
            g[Hk + h] = (hf_rows){qkvz, h * gs + dk, dk, Hk * gs};
            g[2 * Hk + h] = (hf_rows){qkvz, h * gs + 2 * dk, r * dv, Hk * gs};
        }
        s = hf_gather(p, NAME("ssm_qkv"), NF_ROLE_SSM_IN, i, g, 3 * Hk, H, 0, err);
        for (uint64_t h = 0; h < Hk; h++) g[h] = (hf_rows){qkvz, h * gs + 2 * dk + r * dv, r * dv, Hk * gs};
        if (s == NF_OK) s = hf_gather(p, NAME("ssm_z"), NF_ROLE_SSM_IN, i, g, Hk, H, 0, err);
        for (uint64_t h = 0; h < Hk; h++) {
            g[h] = (hf_rows){ba, h * 2 * r, r, 2 * Hv};
            g[Hk + h] = (hf_rows){ba, h * 2 * r + r, r, 2 * Hv};
        }
        if (s == NF_OK) s = hf_gather(p, NAME("ssm_ba"), NF_ROLE_SSM_BA, i, g, 2 * Hk, H, 0, err);
    } else {
        snprintf(qkv, sizeof qkv, "%s.linear_attn.in_proj_qkv", pre);
        snprintf(z, sizeof z, "%s.linear_attn.in_proj_z", pre);
        snprintf(b, sizeof b, "%s.linear_attn.in_proj_b", pre);
        snprintf(a, sizeof a, "%s.linear_attn.in_proj_a", pre);
        g[0] = (hf_rows){qkv, 0, 2 * Kd + Vd, 2 * Kd + Vd};
        s = hf_gather(p, NAME("ssm_qkv"), NF_ROLE_SSM_IN, i, g, 1, H, 0, err);
        g[0] = (hf_rows){z, 0, Vd, Vd};
        if (s == NF_OK) s = hf_gather(p, NAME("ssm_z"), NF_ROLE_SSM_IN, i, g, 1, H, 0, err);
        g[0] = (hf_rows){b, 0, Hv, Hv};
        g[1] = (hf_rows){a, 0, Hv, Hv};
        if (s == NF_OK) s = hf_gather(p, NAME("ssm_ba"), NF_ROLE_SSM_BA, i, g, 2, H, 0, err);
    }
    free(g);
    return s;
}

/* A Gated DeltaNet layer's token mixer: in_proj (either dialect), the depthwise conv kernel
 * [conv_dim][K] (f32), dt_bias and A_log [Hv] (f32, used as transformers does: -exp(A_log)), the
 * output norm [dv] (a plain RMSNorm weight) and out_proj. */
static nf_status hf_gdn(nf_plan *p, int i, const char *pre, nf_error *err)
{
    const nf_hf_config *c = &p->cfg;
    const uint64_t Hv = c->lin_v_heads, Vd = Hv * c->lin_v_dim, conv = 2ull * c->lin_k_heads * c->lin_k_dim + Vd;
    char key[320], name[64];
    nf_status s = hf_gdn_in(p, i, pre, err);
    if (s == NF_OK && nf_st_set_find(p->st, KEY("linear_attn.conv1d.bias")))
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "tensor '%s': the Gated DeltaNet conv has no bias in transformers", key);
    hf_rows g = {KEY("linear_attn.conv1d"), 0, conv, conv};
    if (s == NF_OK) s = hf_gather(p, NAME("ssm_conv"), NF_ROLE_VECTOR, i, &g, 1, c->conv_kernel, 0, err);
    if (s == NF_OK) s = hf_vector(p, NAME("ssm_dt_bias"), i, KEY("linear_attn.dt_bias"), Hv, 0, err);
    if (s == NF_OK) s = hf_vector(p, NAME("ssm_a_log"), i, KEY("linear_attn.A_log"), Hv, 0, err);
    if (s == NF_OK) s = hf_vector(p, NAME("ssm_norm"), i, KEY("linear_attn.norm.weight"), c->lin_v_dim, 0, err);
    if (s == NF_OK) s = hf_matrix(p, NAME("ssm_out"), NF_ROLE_SSM_OUT, i, KEY("linear_attn.out_proj"), c->hidden_size, Vd, 0, err);
    return s;
}

/* The layer's MLP: a dense SwiGLU, or (moe) router + routed experts (+ a shared expert behind its gate). */
static nf_status hf_ffn(nf_plan *p, int i, const char *pre, int moe, nf_error *err)
{
    const nf_hf_config *c = &p->cfg;
    uint64_t H = c->hidden_size;
    char key[320], name[64];
    int g_ffn = 1001 + 2 * i;
    nf_status s;
    if (!moe) { /* dense: ffn_gate, ffn_up, ffn_down apart */
        uint64_t D = c->intermediate_size;
        s = hf_matrix(p, NAME("ffn_gate"), NF_ROLE_FFN_GATE_UP, i, KEY("mlp.gate_proj"), D, H, g_ffn, err);
        if (s == NF_OK) s = hf_matrix(p, NAME("ffn_up"), NF_ROLE_FFN_GATE_UP, i, KEY("mlp.up_proj"), D, H, g_ffn, err);
        if (s == NF_OK) s = hf_matrix(p, NAME("ffn_down"), NF_ROLE_FFN_DOWN, i, KEY("mlp.down_proj"), H, D, 0, err);
        return s;
    }
    s = hf_matrix(p, NAME("ffn_gate_inp"), NF_ROLE_ROUTER, i, KEY("mlp.gate"), c->n_experts, H, 0, err);
    if (s == NF_OK) s = hf_experts(p, i, pre, g_ffn, err);
    if (s == NF_OK && c->shared_intermediate_size) { /* qwen2_moe and the hybrids */
        char gu[64], dn[64];
        snprintf(gu, sizeof gu, "%sffn_gate_up_shexp", p->blk);
        snprintf(dn, sizeof dn, "%sffn_down_shexp", p->blk);
        s = hf_mlp(p, i, KEY("mlp.shared_expert"), gu, dn, c->shared_intermediate_size, g_ffn, err);
        if (s == NF_OK)
            s = hf_matrix(p, NAME("ffn_gate_inp_shexp"), NF_ROLE_VECTOR, i, KEY("mlp.shared_expert_gate.weight"), 1, H, 0, err);
    }
    return s;
}

static nf_status hf_layer(nf_plan *p, int i, nf_error *err)
{
    const nf_hf_config *c = &p->cfg;
    const int hyb = nf_hf_arch_hybrid(c->arch);
    char pre[64], key[320], name[64];
    snprintf(pre, sizeof pre, "%slayers.%d", c->prefix, i);
    snprintf(p->blk, sizeof p->blk, "blk.%d.", i);
    nf_status s = hf_vector(p, NAME("attn_norm"), i, KEY("input_layernorm.weight"), c->hidden_size, hyb, err);
    if (s == NF_OK) s = hyb && c->linear_layers[i] ? hf_gdn(p, i, pre, err) : hf_attention(p, i, pre, err);
    if (s == NF_OK) s = hf_vector(p, NAME("ffn_norm"), i, KEY("post_attention_layernorm.weight"), c->hidden_size, hyb, err);
    if (s == NF_OK) s = hf_ffn(p, i, pre, nf_hf_config_layer_is_moe(c, (uint32_t)i), err);
    return s;
}

/* The hybrids' MTP block (docs/hybrid.md "MTP"), when the checkpoint has `mtp.fc`: mtp.fc [H][2H] (the
 * concatenation's columns: normed embedding first, then normed hidden state), the three zero-centred
 * norms (stored as 1 + w) and one full-attention decoder layer `mtp.layers.0` as `mtp.blk.0.*` with the
 * main layers' names; its MLP is the MoE block when `mtp.layers.0.mlp.gate` exists (vLLM builds it as
 * layer 0), else dense. Its codecs are those of a layer numbered L, after the last (NF_RECIPE_LAYER_MTP;
 * mtp.fc: the GDN in_proj's, so bf16 under nvfp4, as vLLM finds it in published NVFP4 checkpoints). The keys sit at
 * the top level also in the multimodal layout. transformers ignores them; more than one MTP layer is
 * refused. */
static nf_status hf_mtp(nf_plan *p, nf_error *err)
{
    const nf_hf_config *c = &p->cfg;
    const uint64_t H = c->hidden_size;
    const int i = NF_RECIPE_LAYER_MTP; /* the codecs of a layer after the last; unify groups 996, 997 */
    char key[320], name[64];
    const char *pre = "mtp.layers.0";
    if (!nf_hf_arch_hybrid(c->arch) || !(stf(p, "%s.weight", "mtp.fc") || stf(p, "%s.weight_packed", "mtp.fc")))
        return NF_OK;
    if (nf_st_set_find(p->st, "mtp.layers.1.input_layernorm.weight"))
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "tensor 'mtp.layers.1.input_layernorm.weight': the checkpoint has "
                            "more than one MTP layer; ninfer reads one (mtp.layers.0)");
    snprintf(p->blk, sizeof p->blk, "mtp.blk.0.");
    nf_status s = hf_matrix(p, "mtp.fc", NF_ROLE_SSM_IN, i, "mtp.fc", H, 2 * H, 0, err);
    if (s == NF_OK) s = hf_vector(p, "mtp.norm_embd", i, "mtp.pre_fc_norm_embedding.weight", H, 1, err);
    if (s == NF_OK) s = hf_vector(p, "mtp.norm_hidden", i, "mtp.pre_fc_norm_hidden.weight", H, 1, err);
    if (s == NF_OK) s = hf_vector(p, "mtp.output_norm", i, "mtp.norm.weight", H, 1, err);
    if (s == NF_OK) s = hf_vector(p, NAME("attn_norm"), i, KEY("input_layernorm.weight"), H, 1, err);
    if (s == NF_OK) s = hf_attention(p, i, pre, err);
    if (s == NF_OK) s = hf_vector(p, NAME("ffn_norm"), i, KEY("post_attention_layernorm.weight"), H, 1, err);
    if (s == NF_OK)
        s = hf_ffn(p, i, pre, c->n_experts && (stf(p, "%s.weight", "mtp.layers.0.mlp.gate") != NULL), err);
#undef NAME
#undef KEY
    return s;
}

nf_status nf_plan_hf(nf_plan *p, const char *dir, nf_error *err)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    nf_status s = nf_hf_config_load(path, &p->cfg, err);
    if (s) return s;
    if ((s = nf_st_set_open(dir, &p->st, err)) != NF_OK) return s;
    const nf_hf_config *c = &p->cfg;
    /* the source's quantization */
    for (size_t i = 0; i < nf_st_set_count(p->st); i++) {
        const char *k = nf_st_set_at(p->st, i)->name;
        size_t L = strlen(k);
        if (L > 14 && strcmp(k + L - 14, ".weight_packed") == 0) p->src_quant = NF_SQ_CT_NVFP4;
        if (L > 15 && strcmp(k + L - 15, ".weight_scale_2") == 0) p->src_quant = NF_SQ_MO_NVFP4;
        if ((L > 19 && strcmp(k + L - 19, ".input_global_scale") == 0) || (L > 12 && strcmp(k + L - 12, ".input_scale") == 0))
            p->w4a4 = 1;
    }
    if (!p->recipe[0]) snprintf(p->recipe, sizeof p->recipe, "%s", p->src_quant ? "nvfp4" : "bf16");
    if (strcmp(p->recipe, "source") == 0)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "recipe 'source' is for GGUF sources; choose bf16, q8q8, q4q6, q4q5 or nvfp4");
    uint64_t V = c->vocab_size, H = c->hidden_size;
    char key[320];
    snprintf(key, sizeof key, "%sembed_tokens", c->prefix);
    s = hf_matrix(p, "token_embd", NF_ROLE_EMBD, 0, key, V, H, 0, err);
    for (uint32_t i = 0; i < c->n_layers && s == NF_OK; i++) s = hf_layer(p, (int)i, err);
    snprintf(key, sizeof key, "%snorm.weight", c->prefix);
    if (s == NF_OK) s = hf_vector(p, "output_norm", 0, key, H, nf_hf_arch_hybrid(c->arch), err);
    if (s == NF_OK && !c->tie_word_embeddings) s = hf_matrix(p, "output", NF_ROLE_OUTPUT, 0, "lm_head", V, H, 0, err);
    if (s == NF_OK) s = hf_mtp(p, err);
    return s;
}

/* Element-wise ops, RoPE and attention. Formulas follow transformers' modeling code in float32
 * (the oracle the tiny-model tests compare with); each function names the line it mirrors. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/vexp.h"

#define NF_PI 3.14159265358979323846

/* LlamaRMSNorm: variance = x.pow(2).mean(-1); x * rsqrt(variance + eps); weight * x. */
void nf_cpu_rmsnorm(float *y, const float *x, const float *w, size_t n, float eps)
{
    double ss = 0;
    for (size_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
    for (size_t i = 0; i < n; i++) y[i] = w[i] * (x[i] * inv);
}

/* ---- exp, SwiGLU and softmax: vexp.h's exp, the same bits in the scalar and AVX-512 forms -------- */

float nf_cpu_expf(float x) { return nf_cpu_expf_def(x); }

/* AVX-512 where the integer kernels' ISA has it (decided once per process; the bits do not depend on it). */
static int vec512(void) { return nf_isa_selected() >= NF_ISA_AVX512VNNI; }

/* act_fn(gate_proj(x)) * up_proj(x) with act_fn = SiLU. */
void nf_cpu_swiglu_scalar(float *out, const float *g, const float *u, size_t n)
{
    for (size_t i = 0; i < n; i++) out[i] = g[i] / (1.0f + nf_cpu_expf_def(-g[i])) * u[i];
}

void nf_cpu_swiglu(float *out, const float *g, const float *u, size_t n)
{
    if (vec512()) nf_cpu_swiglu_avx512(out, g, u, n);
    else nf_cpu_swiglu_scalar(out, g, u, n);
}

typedef struct swiglu_ctx {
    float *out;
    const float *g, *u;
} swiglu_ctx;

enum { SWIGLU_CHUNK = 4096 }; /* elements per work item */

static void swiglu_items(void *ctx, size_t begin, size_t end, int worker)
{
    (void)worker;
    const swiglu_ctx *s = ctx;
    const size_t i0 = begin * SWIGLU_CHUNK, n = end * SWIGLU_CHUNK - i0;
    nf_cpu_swiglu(s->out + i0, s->g + i0, s->u + i0, n);
}

void nf_cpu_swiglu_par(nf_cpu *c, float *out, const float *g, const float *u, size_t n)
{
    const size_t items = n / SWIGLU_CHUNK;
    swiglu_ctx s = {out, g, u};
    if (items >= 8) nf_parallel_for(nf_cpu_pool(c), items, 1, swiglu_items, &s);
    else nf_cpu_swiglu(out, g, u, items * SWIGLU_CHUNK);
    nf_cpu_swiglu(out + items * SWIGLU_CHUNK, g + items * SWIGLU_CHUNK, u + items * SWIGLU_CHUNK, n - items * SWIGLU_CHUNK);
}

/* The sum of the exponentials in double over 16 lanes (lane l: elements l, l + 16, ... in order), the
 * lanes added in a fixed tree: the AVX-512 form's order, so both give the same bits. */
void nf_cpu_softmax_scalar(float *x, size_t n)
{
    if (!n) return;
    float mx = x[0];
    for (size_t i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double acc[16] = {0};
    for (size_t i = 0; i < n; i++) {
        x[i] = nf_cpu_expf_def(x[i] - mx);
        acc[i % 16] += x[i];
    }
    double s[8];
    for (int j = 0; j < 8; j++) s[j] = acc[j] + acc[j + 8];
    const double sum = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
    float inv = (float)(1.0 / sum);
    for (size_t i = 0; i < n; i++) x[i] *= inv;
}

void nf_cpu_softmax(float *x, size_t n)
{
    if (vec512()) nf_cpu_softmax_avx512(x, n);
    else nf_cpu_softmax_scalar(x, n);
}

/* ---- RoPE (transformers' modeling_rope_utils) -------------------------------------------------- */

/* _compute_default_rope_parameters: 1 / base ** (arange(0, dim, 2).float() / dim), in f32. */
static void default_inv_freq(double base, uint32_t dim, float *inv)
{
    for (uint32_t i = 0; i < dim / 2; i++) {
        float e = (float)(2 * i) / (float)dim;
        inv[i] = 1.0f / powf((float)base, e);
    }
}

/* _compute_yarn_parameters' find_correction_dim. */
static double yarn_corr_dim(double n_rot, uint32_t dim, double base, double max_pos)
{
    return ((double)dim * log(max_pos / (n_rot * 2 * NF_PI))) / (2 * log(base));
}

static void yarn_inv_freq(const nf_rope_config *rc, float *inv, float *attn)
{
    const uint32_t dim = rc->head_dim, half = dim / 2;
    const double base = rc->theta, factor = rc->factor;
    *attn = factor > 1 ? (float)(0.1 * log(factor) + 1.0) : 1.0f;
    double max_pos = rc->orig_ctx ? rc->orig_ctx : 4096;
    double low = floor(yarn_corr_dim(32, dim, base, max_pos)), high = ceil(yarn_corr_dim(1, dim, base, max_pos));
    if (low < 0) low = 0;
    if (high > dim - 1) high = dim - 1;
    if (low == high) high += 0.001;
    for (uint32_t i = 0; i < half; i++) {
        float pos_freq = powf((float)base, (float)(2 * i) / (float)dim);
        float extra = 1.0f / pos_freq, inter = 1.0f / ((float)factor * pos_freq);
        float ramp = (float)(((double)i - low) / (high - low));
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        float ext_factor = 1.0f - ramp;
        inv[i] = inter * (1.0f - ext_factor) + extra * ext_factor;
    }
}

/* _compute_llama3_parameters: long wavelengths divided by factor, short kept, smooth in between. */
static void llama3_inv_freq(const nf_rope_config *rc, float *inv)
{
    const uint32_t half = rc->head_dim / 2;
    default_inv_freq(rc->theta, rc->head_dim, inv);
    const float factor = rc->factor, lo = rc->low_freq_factor, hi = rc->high_freq_factor;
    const float old = (float)rc->orig_ctx;
    const float low_wl = old / lo, high_wl = old / hi;
    for (uint32_t i = 0; i < half; i++) {
        float wl = 2.0f * (float)NF_PI / inv[i];
        float f = wl > low_wl ? inv[i] / factor : inv[i];
        if (!(wl < high_wl) && !(wl > low_wl)) {
            float smooth = (old / wl - lo) / (hi - lo);
            f = (1.0f - smooth) * f / factor + smooth * f;
        }
        inv[i] = f;
    }
}

void nf_rope_inv_freq(const nf_rope_config *rc, uint32_t seq_len, float *inv_freq, float *attn_factor)
{
    *attn_factor = 1.0f;
    switch (rc->kind) {
    case NF_ROPE_LINEAR:
        default_inv_freq(rc->theta, rc->head_dim, inv_freq);
        for (uint32_t i = 0; i < rc->head_dim / 2; i++) inv_freq[i] /= rc->factor;
        return;
    case NF_ROPE_DYNAMIC: {
        /* _compute_dynamic_ntk_parameters with seq_len = max(seq_len, original context) */
        double base = rc->theta, max_pos = rc->orig_ctx ? rc->orig_ctx : seq_len, d = rc->head_dim;
        double sl = seq_len > max_pos ? seq_len : max_pos;
        if (sl > max_pos) base = base * pow(rc->factor * sl / max_pos - (rc->factor - 1), d / (d - 2));
        default_inv_freq(base, rc->head_dim, inv_freq);
        return;
    }
    case NF_ROPE_YARN: yarn_inv_freq(rc, inv_freq, attn_factor); return;
    case NF_ROPE_LLAMA3: llama3_inv_freq(rc, inv_freq); return;
    case NF_ROPE_NONE:
    default: default_inv_freq(rc->theta, rc->head_dim, inv_freq); return;
    }
}

/* apply_rotary_pos_emb: q * cos + rotate_half(q) * sin, emb = cat(freqs, freqs), freqs = pos * inv_freq
 * in f32, cos/sin times the attention scaling. */
void nf_cpu_rope(float *v, uint32_t n_heads, uint32_t head_dim, uint32_t pos, const float *inv_freq,
                 float attn_factor)
{
    nf_cpu_rope_part(v, n_heads, head_dim, head_dim, pos, inv_freq, attn_factor);
}

/* cos and sin of frequency i at pos, times the attention scaling (one definition for both forms below). */
static inline void rope_angle(uint32_t pos, float inv_freq, float attn_factor, float *c, float *s)
{
    float ang = (float)pos * inv_freq;
    *c = (float)cos((double)ang) * attn_factor, *s = (float)sin((double)ang) * attn_factor;
}

static inline void rope_rotate(float *v, uint32_t n_heads, uint32_t head_dim, uint32_t half, uint32_t i, float c, float s)
{
    for (uint32_t h = 0; h < n_heads; h++) {
        float *x = v + (size_t)h * head_dim;
        float x0 = x[i], x1 = x[i + half];
        x[i] = x0 * c - x1 * s;
        x[i + half] = x1 * c + x0 * s;
    }
}

void nf_cpu_rope_part(float *v, uint32_t n_heads, uint32_t head_dim, uint32_t rot_dim, uint32_t pos,
                      const float *inv_freq, float attn_factor)
{
    const uint32_t half = rot_dim / 2;
    for (uint32_t i = 0; i < half; i++) {
        float c, s;
        rope_angle(pos, inv_freq[i], attn_factor, &c, &s);
        rope_rotate(v, n_heads, head_dim, half, i, c, s);
    }
}

void nf_cpu_rope_table(uint32_t rot_dim, uint32_t pos, const float *inv_freq, float attn_factor, float *cs)
{
    for (uint32_t i = 0; i < rot_dim / 2; i++) rope_angle(pos, inv_freq[i], attn_factor, cs + i, cs + rot_dim / 2 + i);
}

void nf_cpu_rope_apply(float *v, uint32_t n_heads, uint32_t head_dim, uint32_t rot_dim, const float *cs)
{
    for (uint32_t i = 0; i < rot_dim / 2; i++) rope_rotate(v, n_heads, head_dim, rot_dim / 2, i, cs[i], cs[rot_dim / 2 + i]);
}

/* ---- attention --------------------------------------------------------------------------------- */

static inline float kv_get(const nf_cpu_kv *kv, const void *base, size_t idx)
{
    if (kv->bf16) return nf_bf16_to_f32(((const uint16_t *)base)[idx]);
    return ((const float *)base)[idx];
}

void nf_cpu_kv_store(nf_cpu_kv *kv, const uint32_t *pages, uint32_t pos0, size_t T, const float *k, const float *v)
{
    const size_t row = (size_t)kv->kv_heads * kv->head_dim;
    for (size_t t = 0; t < T; t++) {
        const size_t off = nf_cpu_kv_row(kv, pages, pos0 + (uint32_t)t) * row;
        const float *kt = k + t * row, *vt = v + t * row;
        if (kv->bf16) {
            uint16_t *kd = (uint16_t *)kv->k + off, *vd = (uint16_t *)kv->v + off;
            for (size_t i = 0; i < row; i++) {
                kd[i] = nf_f32_to_bf16(kt[i]);
                vd[i] = nf_f32_to_bf16(vt[i]);
            }
        } else {
            memcpy((float *)kv->k + off, kt, row * sizeof(float));
            memcpy((float *)kv->v + off, vt, row * sizeof(float));
        }
    }
}

void nf_cpu_kv_copy_page(nf_cpu_kv *kv, uint32_t dst, uint32_t src)
{
    const size_t page = (size_t)kv->page_tokens * kv->kv_heads * kv->head_dim * (kv->bf16 ? 2 : 4);
    if (dst == src) return;
    memcpy((uint8_t *)kv->k + dst * page, (const uint8_t *)kv->k + src * page, page);
    memcpy((uint8_t *)kv->v + dst * page, (const uint8_t *)kv->v + src * page, page);
}

/* Work items, sequence by sequence: sequence i owns items first[i] .. first[i+1] - 1, each a block
 * of `blk` of its tokens (1 scalar, 8 AVX2, 16 AVX-512) times a head. */
typedef struct attn_ctx {
    nf_cpu *c;
    const nf_cpu_kv *kv;
    const nf_cpu_attn_seq *seqs;
    const size_t *first;
    size_t n_seqs;
    const float *q;
    float *out;
    uint32_t n_heads, blk;
    float scale;
} attn_ctx;

/* Token t (a batch row) of sequence sq, head h: softmax(q . K^T * scale) V over its positions
 * 0 .. pos0 + (t - t0). Each score and each output element is a chain of fused multiply-adds in
 * order (fmaf: one rounding per term), the sequence the SIMD forms run lane by lane with one FMA
 * instruction where a mul and an add would be two (attn_avx2.c, attn_avx512.c). */
static void attn_one(const attn_ctx *a, const nf_cpu_attn_seq *sq, size_t t, uint32_t h, float *sc)
{
    const nf_cpu_kv *kv = a->kv;
    const uint32_t hd = kv->head_dim, kh = h / (a->n_heads / kv->kv_heads);
    const size_t kv_row = (size_t)kv->kv_heads * hd, q_row = (size_t)a->n_heads * hd;
    const float *q = a->q + t * q_row + (size_t)h * hd;
    uint32_t n = sq->pos0 + (uint32_t)(t - sq->t0) + 1;
    for (uint32_t p = 0; p < n; p++) {
        size_t base = nf_cpu_kv_row(kv, sq->pages, p) * kv_row + (size_t)kh * hd;
        float s = 0;
        for (uint32_t i = 0; i < hd; i++) s = fmaf(q[i], kv_get(kv, kv->k, base + i), s);
        sc[p] = s * a->scale;
    }
    nf_cpu_softmax(sc, n);
    float *o = a->out + t * q_row + (size_t)h * hd;
    memset(o, 0, hd * sizeof(float));
    for (uint32_t p = 0; p < n; p++) {
        size_t base = nf_cpu_kv_row(kv, sq->pages, p) * kv_row + (size_t)kh * hd;
        const float w = sc[p];
        for (uint32_t i = 0; i < hd; i++) o[i] = fmaf(w, kv_get(kv, kv->v, base + i), o[i]);
    }
}

/* Item `it` as (sequence, first token row, tokens, head). */
static const nf_cpu_attn_seq *item_of(const attn_ctx *a, size_t it, size_t *t, uint32_t *nq, uint32_t *h)
{
    size_t lo = 0, hi = a->n_seqs; /* the sequence with first[i] <= it < first[i+1] */
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (a->first[mid] <= it) lo = mid;
        else hi = mid;
    }
    const nf_cpu_attn_seq *sq = &a->seqs[lo];
    const size_t local = it - a->first[lo], b0 = local / a->n_heads * a->blk;
    *h = (uint32_t)(local % a->n_heads);
    *t = sq->t0 + b0;
    *nq = sq->n - b0 < a->blk ? (uint32_t)(sq->n - b0) : a->blk;
    return sq;
}

/* Scalar: one item per (token, head). */
static void attn_fn(void *ctx, size_t begin, size_t end, int worker)
{
    attn_ctx *a = ctx;
    float *sc = a->c->scores + (size_t)worker * NF_CPU_ATTN_SC * a->c->max_ctx;
    for (size_t it = begin; it < end; it++) {
        size_t t;
        uint32_t nq, h;
        const nf_cpu_attn_seq *sq = item_of(a, it, &t, &nq, &h);
        attn_one(a, sq, t, h, sc);
    }
}

/* AVX2: one item per (block of 8 tokens of one sequence, head); same numbers as attn_one. */
static void attn8_fn(void *ctx, size_t begin, size_t end, int worker)
{
    attn_ctx *a = ctx;
    const nf_cpu_kv *kv = a->kv;
    const uint32_t hd = kv->head_dim, group = a->n_heads / kv->kv_heads;
    const size_t q_row = (size_t)a->n_heads * hd;
    float *sc = a->c->scores + (size_t)worker * NF_CPU_ATTN_SC * a->c->max_ctx;
    for (size_t it = begin; it < end; it++) {
        size_t t;
        uint32_t nq, h;
        const nf_cpu_attn_seq *sq = item_of(a, it, &t, &nq, &h);
        size_t off = t * q_row + (size_t)h * hd;
        nf_cpu_attn_block_avx2(kv, sq->pages, a->q + off, q_row, h / group, sq->pos0 + (uint32_t)(t - sq->t0) + 1,
                               nq, a->scale, sc, a->out + off, (int)a->blk);
    }
}

void nf_cpu_attention(nf_cpu *c, const nf_cpu_kv *kv, const nf_cpu_attn_seq *seqs, size_t n_seqs, const float *q,
                      uint32_t n_heads, float scale, float *out)
{
    size_t stack[65], *first = n_seqs < 64 ? stack : malloc((n_seqs + 1) * sizeof *first);
    if (!first) { /* no memory for the index: one sequence at a time */
        for (size_t i = 0; i < n_seqs; i++) nf_cpu_attention(c, kv, seqs + i, 1, q, n_heads, scale, out);
        return;
    }
    const int simd = c->matvec_simd && kv->head_dim % 8 == 0 && kv->head_dim <= NF_CPU_ATTN_MAX_HD;
    const uint32_t lanes = c->isa >= NF_ISA_AVX512VNNI ? 16 : 8; /* queries per block */
    attn_ctx a = {c, kv, seqs, first, n_seqs, q, out, n_heads, simd ? lanes : 1, scale};
    first[0] = 0;
    for (size_t i = 0; i < n_seqs; i++) first[i + 1] = first[i] + (seqs[i].n + a.blk - 1) / a.blk * n_heads;
    if (first[n_seqs]) nf_parallel_for(c->pool, first[n_seqs], 1, simd ? attn8_fn : attn_fn, &a);
    if (first != stack) free(first);
}

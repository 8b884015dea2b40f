/* Gated DeltaNet (cpu.h): transformers' Qwen3NextGatedDeltaNet / Qwen3_5MoeGatedDeltaNet after the
 * in_proj products, in f32. The recurrence is torch_recurrent_gated_delta_rule for prefill and decode
 * alike: it is the exact definition (transformers' chunked prefill form is an algebraic rewrite of it,
 * equal up to rounding), and on the CPU a token costs the same O(dk * dv) per head either way. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu.h"

size_t nf_cpu_gdn_state_floats(const nf_cpu_gdn *g)
{
    return (size_t)(g->conv_k - 1) * nf_cpu_gdn_conv_dim(g) + (size_t)g->v_heads * g->k_dim * g->v_dim;
}

static float silu(float x) { return x / (1.0f + expf(-x)); }

/* causal_conv1d_fn (prefill) / causal_conv1d_update (decode), then SiLU: channel c of token t is
 * sum_j w[c][j] * in[t - (K-1) + j][c], where inputs before the first token of this call come from
 * the state (the previous call's last K-1 inputs; zeros at a sequence's start). In place over x
 * [n][conv_dim]; the state then holds this call's last K-1 inputs. */
static void conv_seq(const nf_cpu_gdn *g, float *cs, float *x, size_t n)
{
    const size_t C = nf_cpu_gdn_conv_dim(g), K = g->conv_k, P = K - 1;
    float win[NF_CPU_GDN_MAX_K];
    for (size_t ch = 0; ch < C; ch++) {
        const float *w = g->conv_w + ch * K;
        for (size_t j = 0; j < P; j++) win[j] = cs[j * C + ch];
        for (size_t t = 0; t < n; t++) {
            win[P] = x[t * C + ch];
            float acc = 0;
            for (size_t j = 0; j < K; j++) acc += w[j] * win[j];
            x[t * C + ch] = silu(acc);
            memmove(win, win + 1, P * sizeof(float)); /* the window slides by one input */
        }
        for (size_t j = 0; j < P; j++) cs[j * C + ch] = win[j];
    }
}

/* transformers' l2norm: x * rsqrt(sum(x^2) + 1e-6) (the sum in double here); then x / div. */
static void l2norm(float *x, size_t d, float div)
{
    double ss = 0;
    for (size_t i = 0; i < d; i++) ss += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(ss + 1e-6));
    for (size_t i = 0; i < d; i++) x[i] = x[i] * inv / div;
}

/* F.softplus (beta 1, threshold 20). */
static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

typedef struct gdn_job {
    const nf_cpu_gdn *g;
    const nf_cpu_gdn_seq *seqs;
    const float *qkv, *z, *ba;
    float *out;
    float *ws;
} gdn_job;

size_t nf_cpu_gdn_ws_floats(const nf_cpu_gdn *g)
{
    const size_t C = g->chunk;
    return C ? C * C + C * (2 * (size_t)g->v_dim + g->k_dim) + 3 * C : 0; /* T, u|v', w, G|beta|decay */
}

/* One token's step of a v head on its S [dk][dv] (see cpu.h), o [dv] its output. */
static void delta_step(const nf_cpu_gdn *g, float *S, const float *q, const float *k, const float *v,
                       float decay, float beta, float *o)
{
    const size_t dk = g->k_dim, dv = g->v_dim;
    float kv[NF_CPU_GDN_MAX_DV], delta[NF_CPU_GDN_MAX_DV];
    for (size_t j = 0; j < dv; j++) kv[j] = 0;
    for (size_t i = 0; i < dk; i++) { /* S *= exp(g); kv = S^T k */
        float *row = S + i * dv;
        for (size_t j = 0; j < dv; j++) {
            row[j] *= decay;
            kv[j] += row[j] * k[i];
        }
    }
    for (size_t j = 0; j < dv; j++) {
        delta[j] = (v[j] - kv[j]) * beta;
        o[j] = 0;
    }
    for (size_t i = 0; i < dk; i++) { /* S += k delta^T; o = S^T q */
        float *row = S + i * dv;
        for (size_t j = 0; j < dv; j++) {
            row[j] += k[i] * delta[j];
            o[j] += row[j] * q[i];
        }
    }
}

/* The token's decay exp(g) and beta of v head h (see cpu.h). */
static void gate_of(const nf_cpu_gdn *g, const float *ba, uint32_t h, float *gg, float *beta)
{
    const size_t Hv = g->v_heads;
    *gg = -expf(g->a_log[h]) * softplus(ba[Hv + h] + g->dt_bias[h]);
    *beta = 1.0f / (1.0f + expf(-ba[h]));
}

static float dot(const float *a, const float *b, size_t n)
{
    float s = 0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* The chunked form (cpu.h) of v head h over tokens t0 .. t0 + L - 1 (L <= chunk) on S [dk][dv]:
 * raw outputs o [L] rows of `out` (stride Vd). ws: the thread's scratch. */
static void chunk_step(const gdn_job *j, uint32_t h, float *S, uint32_t t0, uint32_t L, float *ws)
{
    const nf_cpu_gdn *g = j->g;
    const size_t C = nf_cpu_gdn_conv_dim(g), Kd = (size_t)g->k_heads * g->k_dim, Hv = g->v_heads;
    const size_t dk = g->k_dim, dv = g->v_dim, Vd = Hv * dv, kh = h / (Hv / g->k_heads), N = g->chunk;
    float *T = ws, *u = T + N * N, *w = u + N * dv, *G = w + N * dk, *beta = G + N;
#define Q(i) (j->qkv + (size_t)(t0 + (i)) * C + kh * dk)
#define K(i) (j->qkv + (size_t)(t0 + (i)) * C + Kd + kh * dk)
#define V(i) (j->qkv + (size_t)(t0 + (i)) * C + 2 * Kd + h * dv)
    for (uint32_t i = 0; i < L; i++) { /* cumulative log decays, as g.cumsum(-1) */
        float gg;
        gate_of(g, j->ba + (size_t)(t0 + i) * 2 * Hv, h, &gg, &beta[i]);
        G[i] = i ? G[i - 1] + gg : gg;
    }
    for (uint32_t i = 0; i < L; i++) { /* A, strictly lower, then the forward substitution row by row */
        float *Ti = T + (size_t)i * N;
        for (uint32_t c = 0; c < i; c++) Ti[c] = -beta[i] * dot(K(i), K(c), dk) * expf(G[i] - G[c]);
        float row[NF_CPU_GDN_MAX_CHUNK];
        memcpy(row, Ti, i * sizeof(float));
        for (uint32_t c = 0; c < i; c++) {
            float acc = row[c];
            for (uint32_t m = c + 1; m < i; m++) acc += row[m] * T[(size_t)m * N + c];
            Ti[c] = acc;
        }
        Ti[i] = 1.0f;
    }
    for (uint32_t i = 0; i < L; i++) { /* u = T (beta v), w = T (beta exp(G) k) */
        float *ui = u + (size_t)i * dv, *wi = w + (size_t)i * dk;
        memset(ui, 0, dv * sizeof(float));
        memset(wi, 0, dk * sizeof(float));
        for (uint32_t c = 0; c <= i; c++) {
            const float tb = T[(size_t)i * N + c] * beta[c], tbe = tb * expf(G[c]);
            for (size_t x = 0; x < dv; x++) ui[x] += tb * V(c)[x];
            for (size_t a = 0; a < dk; a++) wi[a] += tbe * K(c)[a];
        }
        for (size_t a = 0; a < dk; a++) /* v' = u - S^T w, in place over u */
            for (size_t x = 0; x < dv; x++) ui[x] -= wi[a] * S[a * dv + x];
    }
    for (uint32_t i = 0; i < L; i++) { /* o = exp(G_i) S^T q + sum_{c <= i} (q . k_c) exp(G_i - G_c) v'_c */
        float *o = j->out + (size_t)(t0 + i) * Vd + h * dv;
        const float *q = Q(i), eg = expf(G[i]);
        for (size_t x = 0; x < dv; x++) o[x] = 0;
        for (size_t a = 0; a < dk; a++)
            for (size_t x = 0; x < dv; x++) o[x] += q[a] * S[a * dv + x];
        for (size_t x = 0; x < dv; x++) o[x] *= eg;
        for (uint32_t c = 0; c <= i; c++) {
            const float s = dot(q, K(c), dk) * expf(G[i] - G[c]);
            for (size_t x = 0; x < dv; x++) o[x] += s * u[(size_t)c * dv + x];
        }
    }
    const float last = G[L - 1], el = expf(last); /* S = exp(G_L) S + sum_c exp(G_L - G_c) k_c v'_c^T */
    for (size_t a = 0; a < dk * dv; a++) S[a] *= el;
    for (uint32_t c = 0; c < L; c++) {
        const float e = expf(last - G[c]);
        for (size_t a = 0; a < dk; a++) {
            const float ka = K(c)[a] * e;
            for (size_t x = 0; x < dv; x++) S[a * dv + x] += ka * u[(size_t)c * dv + x];
        }
    }
#undef Q
#undef K
#undef V
}

/* out = rmsnorm(o, norm_w) * silu(z), in place, for token t of v head h. */
static void gated_norm(const gdn_job *j, uint32_t t, uint32_t h)
{
    const nf_cpu_gdn *g = j->g;
    const size_t dv = g->v_dim, Vd = (size_t)g->v_heads * dv;
    float *o = j->out + (size_t)t * Vd + h * dv;
    const float *z = j->z + (size_t)t * Vd + h * dv;
    nf_cpu_rmsnorm(o, o, g->norm_w, dv, g->eps);
    for (size_t x = 0; x < dv; x++) o[x] *= silu(z[x]);
}

/* Items are (sequence, v head): the head's tokens in order, each step then its gated output norm. */

static void gdn_items(void *ctx, size_t b, size_t e, int worker)
{
    const gdn_job *j = ctx;
    const nf_cpu_gdn *g = j->g;
    const size_t C = nf_cpu_gdn_conv_dim(g), Kd = (size_t)g->k_heads * g->k_dim, Hv = g->v_heads;
    const size_t dv = g->v_dim, Vd = Hv * dv, rep = Hv / g->k_heads;
    float *ws = j->ws ? j->ws + (size_t)worker * nf_cpu_gdn_ws_floats(g) : NULL;
    for (size_t it = b; it < e; it++) {
        const nf_cpu_gdn_seq *sq = &j->seqs[it / Hv];
        const uint32_t h = (uint32_t)(it % Hv);
        const size_t kh = h / rep;
        float *S = sq->state + (g->conv_k - 1) * C + (size_t)h * g->k_dim * dv;
        /* a few tokens take the per-token steps (cpu.h NF_CPU_STEP_MAX): then a speculative verification
         * and the accepted tokens rerun after a rejection give the bits decoding them one at a time
         * gives here (the chunked form rounds differently, and saves little at that size) */
        if (g->chunk && sq->n > NF_CPU_STEP_MAX) {
            for (uint32_t c0 = 0; c0 < sq->n; c0 += g->chunk)
                chunk_step(j, h, S, sq->t0 + c0, sq->n - c0 < g->chunk ? sq->n - c0 : g->chunk, ws);
        } else {
            for (uint32_t t = sq->t0; t < sq->t0 + sq->n; t++) {
                const float *row = j->qkv + (size_t)t * C;
                float gg, beta;
                gate_of(g, j->ba + (size_t)t * 2 * Hv, h, &gg, &beta);
                delta_step(g, S, row + kh * g->k_dim, row + Kd + kh * g->k_dim, row + 2 * Kd + h * dv, expf(gg), beta,
                           j->out + (size_t)t * Vd + h * dv);
            }
        }
        for (uint32_t t = sq->t0; t < sq->t0 + sq->n; t++) gated_norm(j, t, h);
    }
}

void nf_cpu_gdn_forward(nf_cpu *c, const nf_cpu_gdn *g, const nf_cpu_gdn_seq *seqs, size_t n_seqs, float *qkv,
                        const float *z, const float *ba, float *out, float *ws)
{
    const size_t C = nf_cpu_gdn_conv_dim(g), Kd = (size_t)g->k_heads * g->k_dim;
    const float div = sqrtf((float)g->k_dim);
    for (size_t i = 0; i < n_seqs; i++) {
        conv_seq(g, seqs[i].state, qkv + (size_t)seqs[i].t0 * C, seqs[i].n);
        for (uint32_t t = seqs[i].t0; t < seqs[i].t0 + seqs[i].n; t++)
            for (uint32_t h = 0; h < g->k_heads; h++) {
                l2norm(qkv + (size_t)t * C + (size_t)h * g->k_dim, g->k_dim, div);     /* q, scaled */
                l2norm(qkv + (size_t)t * C + Kd + (size_t)h * g->k_dim, g->k_dim, 1); /* k */
            }
    }
    gdn_job j = {g, seqs, qkv, z, ba, out, ws};
    nf_parallel_for(nf_cpu_pool(c), n_seqs * g->v_heads, 1, gdn_items, &j);
}

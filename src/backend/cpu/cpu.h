/* The CPU backend: threaded ops over nf_pool for the forward of a transformer with sparse-MoE
 * blocks. Weights are views of encoded rows (any codec of codec/codec.h, nvfp4 through its plane
 * API); activations are f32. Every op here is the numerical reference the other backends are
 * checked against, and is itself checked against naive double references (tests/cpu).
 *
 * Products: y[t][r] = sum_i W[r][i] * x[t][i].
 *   - one token (decode): the codec's matvec kernel (SIMD when the CPU has it) per row block;
 *   - many tokens (prefill): each worker dequantizes a block of NF_CPU_RB rows to f32 once into its
 *     own buffer and multiplies it with every token (f32 accumulation), so each weight byte is
 *     decoded once per chunk, not once per token;
 *   - reference mode (nf_cpu_set_reference): every product is dequantize-row-to-f32 followed by a
 *     double-accumulated dot, whatever the token count: the "dequantize then compute" path that the
 *     quantized-recipe tests compare the fast kernels with.
 * Work on many matrices at once (q/k/v, gate/up, the experts of a chunk) goes through one
 * nf_cpu_gemm_batch call: row blocks of all jobs form one parallel-for, so small matrices do not
 * leave threads idle and there is one fork/join per batch. Each output element is computed by one
 * worker in a fixed order, so results do not depend on the thread count. */
#ifndef NF_CPU_CPU_H
#define NF_CPU_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "base/parallel.h"
#include "codec/codec.h"
#include "codec/nvfp4.h"

enum { NF_CPU_RB = 16 }; /* rows per work item (and per dequantized block) */

/* A matrix of encoded rows: rows x cols, row r at data + r * row_bytes, or for nvfp4 rows
 * row0 .. row0 + rows - 1 of the plane set *nv (each row divided by its own source divisor). */
typedef struct nf_cpu_weight {
    const nf_codec *codec;
    const uint8_t *data;       /* non-planar: [rows][row_bytes] */
    size_t row_bytes;
    const nf_nvfp4_planes *nv; /* nvfp4: the whole plane set; NULL otherwise */
    uint64_t row0;             /* nvfp4: first row of this matrix inside nv */
    uint32_t rows, cols;
} nf_cpu_weight;

/* Rows [r0, r0 + n) of w as a matrix of its own (an expert of a bank, gate or up of a stacked
 * gate_up). The caller keeps r0 + n <= w->rows. */
nf_cpu_weight nf_cpu_weight_rows(const nf_cpu_weight *w, uint32_t r0, uint32_t n);

/* Decodes row r of w to y[cols] f32. */
void nf_cpu_weight_row(const nf_cpu_weight *w, uint32_t r, float *y);

typedef struct nf_cpu nf_cpu;

/* A pool of n_threads (<= 0: all CPUs) and per-thread scratch for blocks of up to max_cols
 * columns and attention over up to max_ctx positions. Every product run on it must have
 * w.cols <= max_cols: the scratch is sized from it and not re-checked per call (the engine sizes it
 * from the model's widest row). */
nf_status nf_cpu_create(int n_threads, uint32_t max_cols, uint32_t max_ctx, nf_cpu **out, nf_error *err);
void nf_cpu_free(nf_cpu *c);
int nf_cpu_threads(const nf_cpu *c);
nf_pool *nf_cpu_pool(nf_cpu *c);
/* on: every product is dequantize + double dot (slow; for tests and `--reference`). */
void nf_cpu_set_reference(nf_cpu *c, int on);
int nf_cpu_reference(const nf_cpu *c);

/* One product y = W x over n tokens: x [n][ldx] (the first w.cols used), y [n][ldy] (the w.rows
 * columns from y[t*ldy] written). w.cols must be <= the max_cols given at create.
 *
 * The tokens form segments seg[0] = 0 < seg[1] < ... < seg[n_seg] = n (seg NULL: one segment of n).
 * A segment of one token runs the codec's matvec kernel, a longer one the dequantized-block tile;
 * the two sum in different orders, so the kernel must not depend on what else is in the product.
 * Within a kernel every output is summed in a fixed order whatever the tile, block or thread split,
 * so a token's outputs depend only on its own row and the length-1-or-not of its segment. The
 * batched forward makes each sequence's tokens one segment: a sequence's products are then
 * bit-identical whether it runs alone or beside others. */
typedef struct nf_cpu_gemm_job {
    nf_cpu_weight w;
    const float *x;
    size_t ldx;
    float *y;
    size_t ldy;
    size_t n;
    const uint32_t *seg; /* [n_seg + 1] or NULL */
    size_t n_seg;
} nf_cpu_gemm_job;

void nf_cpu_gemm_batch(nf_cpu *c, const nf_cpu_gemm_job *jobs, size_t n_jobs);
/* A single job (one segment). */
void nf_cpu_gemm(nf_cpu *c, const nf_cpu_weight *w, const float *x, size_t ldx, float *y, size_t ldy, size_t n);

/* ---- element-wise and small ops (single-threaded; they are a small share of the time) -------- */

/* HF RMSNorm: y = w * (x / sqrt(mean(x^2) + eps)); y may alias x. Sum of squares in double. */
void nf_cpu_rmsnorm(float *y, const float *x, const float *w, size_t n, float eps);
/* out[i] = silu(g[i]) * u[i], silu(g) = g / (1 + exp(-g)); out may alias g or u. */
void nf_cpu_swiglu(float *out, const float *g, const float *u, size_t n);
/* In-place softmax over x[n] (max subtracted; f32 exp, double sum). */
void nf_cpu_softmax(float *x, size_t n);

/* ---- RoPE ---------------------------------------------------------------------------------- */

typedef enum nf_rope_kind {
    NF_ROPE_NONE = 0, /* plain: inv_freq = theta^(-2i/d) */
    NF_ROPE_LINEAR,   /* positions divided by factor (frequencies / factor) */
    NF_ROPE_DYNAMIC,  /* NTK-aware: theta grows once the sequence passes orig_ctx */
    NF_ROPE_YARN,
    NF_ROPE_LLAMA3,
} nf_rope_kind;

typedef struct nf_rope_config {
    nf_rope_kind kind;
    double theta;
    float factor;          /* 1 for NONE */
    uint32_t orig_ctx;     /* yarn/llama3/dynamic: the original context (0: max_ctx) */
    float low_freq_factor, high_freq_factor; /* llama3 */
    uint32_t head_dim;     /* rotated dims (even) */
} nf_rope_config;

/* The rotation table as HF's rope init functions compute it: inv_freq[head_dim/2] and the factor
 * cos/sin are multiplied by (yarn's attention scaling, else 1). seq_len matters for DYNAMIC only
 * (the longest sequence seen so far, as HF's dynamic update uses). */
void nf_rope_inv_freq(const nf_rope_config *rc, uint32_t seq_len, float *inv_freq, float *attn_factor);

/* Rotates v[n_heads][head_dim] at position pos, neox style (HF rotate_half): the pair
 * (v[i], v[i + d/2]) turns by the angle pos * inv_freq[i] computed in f32. */
void nf_cpu_rope(float *v, uint32_t n_heads, uint32_t head_dim, uint32_t pos, const float *inv_freq,
                 float attn_factor);

/* ---- attention ----------------------------------------------------------------------------- */

/* A layer's KV page pool: k and v of [n_pages][page_tokens][kv_heads][head_dim], f32 or bf16
 * elements. A sequence sees it through its page table: its position p is row
 * pages[p / page_tokens] * page_tokens + p % page_tokens of the pool. */
typedef struct nf_cpu_kv {
    void *k, *v;
    int bf16;          /* elements are bf16 (else f32) */
    uint32_t page_tokens, n_pages, kv_heads, head_dim;
} nf_cpu_kv;

/* The pool row holding position p of the sequence whose page table is pages. */
static inline size_t nf_cpu_kv_row(const nf_cpu_kv *kv, const uint32_t *pages, uint32_t p)
{
    return (size_t)pages[p / kv->page_tokens] * kv->page_tokens + p % kv->page_tokens;
}

/* Writes k[T][kv_heads*head_dim], v[...] into positions pos0 .. pos0 + T - 1 of the sequence with
 * page table pages (every page id < n_pages: the caller checks). */
void nf_cpu_kv_store(nf_cpu_kv *kv, const uint32_t *pages, uint32_t pos0, size_t T, const float *k, const float *v);

/* Copies page src's k and v to page dst (both < n_pages). */
void nf_cpu_kv_copy_page(nf_cpu_kv *kv, uint32_t dst, uint32_t src);

/* One sequence of an attention call: its tokens are rows t0 .. t0 + n - 1 of q and out, at
 * positions pos0 .. pos0 + n - 1, their keys and values already stored through pages. */
typedef struct nf_cpu_attn_seq {
    const uint32_t *pages;
    uint32_t pos0, t0, n;
} nf_cpu_attn_seq;

/* Causal attention of every sequence's tokens over that sequence's cache (positions 0 .. pos0 + t
 * for its token t): q [T][n_heads*head_dim], out the same shape. Query head h reads kv head
 * h / (n_heads / kv_heads) (GQA). Scores scaled by `scale`, softmax in f32. Work items never span
 * two sequences and each output is computed in a fixed order, so a sequence's output does not
 * depend on the others (nor on the thread count). */
void nf_cpu_attention(nf_cpu *c, const nf_cpu_kv *kv, const nf_cpu_attn_seq *seqs, size_t n_seqs, const float *q,
                      uint32_t n_heads, float scale, float *out);

/* ---- sparse MoE ---------------------------------------------------------------------------- */

/* Router: the k largest of logits[E] (ties to the lower index), in descending order, and their
 * softmax probabilities over all E (f32), renormalised over the k when norm. The same semantics
 * as the CUDA operator (src/backend/cuda/sparse_moe/sparse_moe.h). */
void nf_cpu_route(const float *logits, uint32_t E, uint32_t k, int norm, int32_t *ids, float *w);

/* A layer's bank (shapes as docs/model_schema.md):
 *   router   [E][H];  gate_up [E*2I][H] (expert e: rows e*2I .. gate, then up);  down [E*H][I];
 *   shared_gate_up [2S][H], shared_down [H][S], shared_gate [1][H]  (rows == 0: no shared expert) */
typedef struct nf_cpu_moe {
    uint32_t hidden, experts, top_k, inter, shared_inter;
    int norm_topk;
    nf_cpu_weight router, gate_up, down;
    nf_cpu_weight shared_gate_up, shared_down, shared_gate;
} nf_cpu_moe;

/* Scratch for chunks of up to max_tokens tokens. */
typedef struct nf_cpu_moe_ws nf_cpu_moe_ws;
nf_status nf_cpu_moe_ws_create(const nf_cpu_moe *shape, size_t max_tokens, nf_cpu_moe_ws **out, nf_error *err);
void nf_cpu_moe_ws_free(nf_cpu_moe_ws *ws);

/* out[T][H] = the sparse-MoE block of x[T][H] (T <= the workspace's max_tokens): tokens are
 * grouped by the experts they are routed to, each expert's gate_up and down run once over its
 * group (matrix-matrix), then the weighted combine in the order of each token's k choices, plus
 * sigmoid(shared_gate . x) * shared expert when there is one. ids/weights (may be NULL) receive the
 * routing [T][k]. seq_start [n_seqs + 1] (NULL: one sequence) splits the tokens into sequences:
 * every product's segments (nf_cpu_gemm_job) are the sequences' tokens, so a sequence's output
 * is the same alone or beside others. */
void nf_cpu_moe_forward(nf_cpu *c, const nf_cpu_moe *m, nf_cpu_moe_ws *ws, const float *x, size_t T,
                        const uint32_t *seq_start, size_t n_seqs, float *out, int32_t *ids, float *weights);

#endif

/* The CPU backend: threaded ops over nf_pool for the forward of a transformer with sparse-MoE
 * blocks. Weights are views of encoded rows (any codec of codec/codec.h, nvfp4 through its plane
 * API); activations are f32. Every op here is the numerical reference the other backends are
 * checked against, and is itself checked against naive double references (tests/cpu).
 *
 * Products: y[t][r] = sum_i W[r][i] * x[t][i].
 *   - one token (decode): the codec's matvec kernel (SIMD when the CPU has it) per row block, and so
 *     token by token for segments of up to NF_CPU_STEP_MAX tokens (a speculative verification);
 *   - many tokens (prefill): each worker dequantizes a block of NF_CPU_RB rows to f32 once into its
 *     own buffer and multiplies it with every token (f32 accumulation), so each weight byte is
 *     decoded once per chunk, not once per token;
 *   - int8 activations (nf_cpu_set_a8, on by default) for q8_0 / q4_k / q5_k / q6_k weights: each
 *     distinct activation row of a batch is quantised once (per 32 elements, codec/a8.h); a
 *     segment of up to NF_CPU_STEP_MAX tokens runs the codec's integer kernel token by token, a
 *     longer one the repacked 16-row tile (nf_codec_a8_tile: AVX2, AVX-512 VNNI or AMX, the same
 *     bits; scalar: the kernel over all its tokens);
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
#include "codec/a8.h"
#include "codec/codec.h"
#include "codec/nvfp4.h"
#include "dist/ep.h"

enum { NF_CPU_RB = 16 }; /* rows per work item (and per dequantized block) */
/* Segments of at most this many tokens run token by token, each as a decode would (the matvec or
 * int8 kernel for products, the recurrent step for Gated DeltaNet): a speculative verification (at
 * most engine/spec.h's NF_SPEC_MAX_K + 1 = 9 tokens of one sequence) and the tokens rerun after a
 * rejection then give decoding's bits, so greedy speculation is token-identical to decoding. The tile
 * rounds differently (another summation order), and a rounding difference upstream of an int8
 * activation step can tip a near tie; on pieces this short the tile saves little. */
enum { NF_CPU_STEP_MAX = 9 };

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
/* on (the default): products with q8_0 / q4_k / q5_k / q6_k weights quantise their activation rows
 * to int8 (per 32 elements, codec/a8.h) and run the integer kernels of nf_isa_selected(); off: f32
 * activations (the codec's matvec, the dequantized tile). Reference mode overrides both. */
void nf_cpu_set_a8(nf_cpu *c, int on);
int nf_cpu_a8(const nf_cpu *c);
/* The ISA of the integer kernels (default nf_isa_selected(); capped to nf_isa_detect()). */
void nf_cpu_set_isa(nf_cpu *c, nf_isa isa);
/* on (the default): with int8 activations, segments of several tokens run the repacked 16-row tile
 * where the ISA has one (AVX-512 VNNI); off: the per-token kernel (tests compare the two). */
void nf_cpu_set_a8_tile(nf_cpu *c, int on);

/* One product y = W x over n tokens: x [n][ldx] (the first w.cols used), y [n][ldy] (the w.rows
 * columns from y[t*ldy] written). w.cols must be <= the max_cols given at create.
 *
 * The tokens form segments seg[0] = 0 < seg[1] < ... < seg[n_seg] = n (seg NULL: one segment of n).
 * A segment of up to NF_CPU_STEP_MAX tokens runs the codec's matvec kernel token by token, a longer
 * one the dequantized-block tile; the two sum in different orders, so the kernel must not depend on
 * what else is in the product. Within a kernel every output is summed in a fixed order whatever the
 * tile, block or thread split, so a token's outputs depend only on its own row and whether its
 * segment is longer than NF_CPU_STEP_MAX. The
 * batched forward makes each sequence's tokens one segment: a sequence's products are then
 * bit-identical whether it runs alone or beside others. seg_step, when given, says per segment
 * which of the two it takes instead of its length: an expert's share of a sequence's tokens follows
 * the sequence's segment (moe.c), not its own count, which depends on the batch's routing. */
typedef struct nf_cpu_gemm_job {
    nf_cpu_weight w;
    const float *x;
    size_t ldx;
    float *y;
    size_t ldy;
    size_t n;
    const uint32_t *seg; /* [n_seg + 1] or NULL */
    size_t n_seg;
    const uint8_t *seg_step; /* [n_seg] or NULL: 1 token by token, 0 the tile (NULL: by length) */
} nf_cpu_gemm_job;

void nf_cpu_gemm_batch(nf_cpu *c, const nf_cpu_gemm_job *jobs, size_t n_jobs);
/* A single job (one segment). */
void nf_cpu_gemm(nf_cpu *c, const nf_cpu_weight *w, const float *x, size_t ldx, float *y, size_t ldy, size_t n);

/* ---- element-wise and small ops (single-threaded; they are a small share of the time) -------- */

/* HF RMSNorm: y = w * (x / sqrt(mean(x^2) + eps)); y may alias x. Sum of squares in double. */
void nf_cpu_rmsnorm(float *y, const float *x, const float *w, size_t n, float eps);
/* The backend's exp (softmax, SwiGLU): within 2.0e-7 relative of e^x for normal results (vexp.h
 * argues the bound), +inf above 88.7228, 0 below -103.98, NaN kept; the same bits on every ISA. */
float nf_cpu_expf(float x);
/* out[i] = silu(g[i]) * u[i], silu(g) = g / (1 + exp(-g)) with nf_cpu_expf; out may alias g or u. */
void nf_cpu_swiglu(float *out, const float *g, const float *u, size_t n);
/* nf_cpu_swiglu over the pool in chunks when n is large (a prompt's dense MLP: 256 x 1536 expf on one
 * thread were 5 % of SmolLM2's prefill while the other waited); the same bits. */
void nf_cpu_swiglu_par(nf_cpu *c, float *out, const float *g, const float *u, size_t n);
/* In-place softmax over x[n] (max subtracted; nf_cpu_expf, the sum in double over 16 lanes added in a
 * fixed order: ops.c). */
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

/* The same rotation of the first rot_dim dims of each head (partial rotary: transformers'
 * apply_rotary_pos_emb on q[..., :rotary_dim]); the rest pass unchanged. head_dim is the stride. */
void nf_cpu_rope_part(float *v, uint32_t n_heads, uint32_t head_dim, uint32_t rot_dim, uint32_t pos,
                      const float *inv_freq, float attn_factor);
/* nf_cpu_rope_part in two steps, the same bits: the position's table cs[rot_dim] (cos of the rot_dim / 2
 * frequencies, then sin, times attn_factor) once, then the rotation of any number of rows with it (a
 * forward computes each token's table once for all its layers). */
void nf_cpu_rope_table(uint32_t rot_dim, uint32_t pos, const float *inv_freq, float attn_factor, float *cs);
void nf_cpu_rope_apply(float *v, uint32_t n_heads, uint32_t head_dim, uint32_t rot_dim, const float *cs);

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

/* The block's stages, which expert parallelism runs on different ranks (docs/dist.md); the forward
 * above is route, the experts over its own rows, and combine.
 *   route: router logits, top-k (ws's ids and weights [T][k], nf_cpu_moe_ids) and the shared
 *          expert's gate and SwiGLU'd gate_up, over the tokens x[T][H];
 *   experts: the routed experts alone over n rows x[n][H], row a for expert meta[a].expert of m (m's
 *          banks may be a rank's share: nf_cpu_weight_rows) with segment key meta[a].key (rows of one
 *          expert and key are one product segment, as one sequence's tokens are in the forward, so a
 *          row's result is the same bits here as there); y[n][H]. ws must hold n <= max_tokens * k rows;
 *   shared_down_job: the shared expert's down over route's tokens (into ws), as a job to batch;
 *   combine: out[t] = sum over j in choice order of w[t][j] * res[row[t k + j]], plus the gated shared
 *          expert (after its down job has run). */
void nf_cpu_moe_route(nf_cpu *c, const nf_cpu_moe *m, nf_cpu_moe_ws *ws, const float *x, size_t T,
                      const uint32_t *seq_start, size_t n_seqs);
/* The segment key of a row of sequence seq, which has n tokens in the forward: its low bit says
 * whether the sequence's segment runs token by token (n <= NF_CPU_STEP_MAX), so an expert's share of
 * the sequence's rows takes the sequence's path whatever its own count (nf_cpu_gemm_job.seg_step). */
static inline uint32_t nf_cpu_moe_key(uint32_t seq, uint32_t n) { return seq << 1 | (n <= NF_CPU_STEP_MAX); }
const int32_t *nf_cpu_moe_ids(const nf_cpu_moe_ws *ws);
void nf_cpu_moe_experts(nf_cpu *c, const nf_cpu_moe *m, nf_cpu_moe_ws *ws, const float *x, size_t n,
                        const nf_ep_meta *meta, float *y);
nf_cpu_gemm_job nf_cpu_moe_shared_down_job(const nf_cpu_moe *m, nf_cpu_moe_ws *ws, size_t T, const uint32_t *seq_start,
                                           size_t n_seqs);
void nf_cpu_moe_combine(const nf_cpu_moe *m, const nf_cpu_moe_ws *ws, size_t T, const float *res, const uint32_t *row,
                        float *out);

/* Expert parallelism over G ranks simulated on this CPU: the tables of src/dist/ep.h and copies in
 * place of NCCL's exchange, so the dispatch and combine the GPUs will run are tested here. Rank r
 * holds the routed experts l.first[r] .. l.first[r + 1] - 1 and the sequences [r n / G, (r + 1) n / G)
 * of a batch (data-parallel attention: whole sequences); router and shared expert are replicated.
 * out equals nf_cpu_moe_forward's bit for bit (tests/cpu/test_ep_sim.c). */
typedef struct nf_cpu_ep_sim nf_cpu_ep_sim;
nf_status nf_cpu_ep_sim_create(const nf_cpu_moe *m, uint32_t ranks, size_t max_tokens, nf_cpu_ep_sim **out,
                               nf_error *err);
void nf_cpu_ep_sim_free(nf_cpu_ep_sim *sim);
nf_status nf_cpu_moe_forward_ep(nf_cpu *c, const nf_cpu_moe *m, nf_cpu_ep_sim *sim, const float *x, size_t T,
                                const uint32_t *seq_start, size_t n_seqs, float *out, int32_t *ids, nf_error *err);

/* ---- Gated DeltaNet (linear attention; transformers' Qwen3NextGatedDeltaNet) --------------------
 *
 * Per token, after the in_proj products: qkv [conv_dim] = q (Hk*dk) | k (Hk*dk) | v (Hv*dv), z [Hv*dv],
 * ba [2*Hv] = b (Hv) | a (Hv). The layer then runs, per sequence:
 *   qkv = silu(causal depthwise conv over the sequence's last K inputs, per channel)
 *   q, k = l2norm per head (x * rsqrt(sum x^2 + 1e-6)); q /= sqrt(dk)
 *   g = -exp(A_log) * softplus(a + dt_bias); beta = sigmoid(b)        per v head
 *   per v head h (q/k head h / (Hv/Hk)), S [dk][dv]:
 *     S *= exp(g); delta = beta * (v - S^T k); S += k delta^T; o = S^T q
 *   out = rmsnorm(o, norm_w) * silu(z)                               per v head
 * A sequence's state for one layer is conv [K-1][conv_dim] (its last K-1 conv inputs, oldest first;
 * zeros before its first token) then S [Hv][dk][dv], all f32.
 *
 * Two forms of the recurrence, equal up to rounding: the recurrent one above, token by token (the
 * definition; the engine's reference), and with chunk > 0 the chunked one for runs of several tokens
 * (transformers' torch_chunk_gated_delta_rule, the WY / UT-transform formulation the GPU will use):
 * per chunk of C tokens with in-chunk cumulative decays G_i = g_1 + ... + g_i,
 *   A[i][j] = -beta_i (k_i . k_j) exp(G_i - G_j) for j < i, made (I - A)^-1-like by forward
 *   substitution (T = A' + I); u_i = sum_j T[i][j] beta_j v_j, w_i = sum_j T[i][j] beta_j exp(G_j) k_j;
 *   v'_i = u_i - S^T w_i; o_i = exp(G_i) S^T q_i + sum_{j<=i} (q_i . k_j) exp(G_i - G_j) v'_j;
 *   S <- exp(G_C) S + sum_j exp(G_C - G_j) k_j v'_j^T. */
enum { NF_CPU_GDN_MAX_K = 64, NF_CPU_GDN_MAX_DV = 1024 }; /* conv_k and v_dim limits (stack buffers) */

typedef struct nf_cpu_gdn {
    uint32_t k_heads, v_heads, k_dim, v_dim, conv_k; /* Hk, Hv, dk, dv, K */
    const float *conv_w;          /* [conv_dim][K] */
    const float *dt_bias, *a_log; /* [Hv] */
    const float *norm_w;          /* [dv] */
    float eps;                    /* the output norm's */
    uint32_t chunk;               /* 0: recurrent form; C (<= NF_CPU_GDN_MAX_CHUNK): chunked for runs > 1 */
} nf_cpu_gdn;

enum { NF_CPU_GDN_MAX_CHUNK = 64 };

/* Floats of scratch nf_cpu_gdn_forward needs per thread (the chunked form's; 0 when recurrent). */
size_t nf_cpu_gdn_ws_floats(const nf_cpu_gdn *g);

static inline size_t nf_cpu_gdn_conv_dim(const nf_cpu_gdn *g)
{
    return 2 * (size_t)g->k_heads * g->k_dim + (size_t)g->v_heads * g->v_dim;
}

/* Floats of one sequence's state of one layer: (K-1) * conv_dim + Hv * dk * dv. */
size_t nf_cpu_gdn_state_floats(const nf_cpu_gdn *g);

/* One sequence's tokens in a Gated DeltaNet call: rows t0 .. t0 + n - 1, its layer state. */
typedef struct nf_cpu_gdn_seq {
    float *state;
    uint32_t t0, n;
} nf_cpu_gdn_seq;

/* The layer's token mixer for the tokens of n_seqs sequences: qkv [T][conv_dim] (overwritten: conv
 * output, normalised q and k), z [T][Hv*dv], ba [T][2*Hv] -> out [T][Hv*dv] (before out_proj); every
 * sequence's state advances by its tokens. Work items are (sequence, v head) pairs and the tokens of
 * one run in order, so a sequence's output does not depend on the others or the thread count. */
void nf_cpu_gdn_forward(nf_cpu *c, const nf_cpu_gdn *g, const nf_cpu_gdn_seq *seqs, size_t n_seqs, float *qkv,
                        const float *z, const float *ba, float *out, float *ws);
/* ws: [threads][nf_cpu_gdn_ws_floats(g)] (NULL when that is 0). */

#endif

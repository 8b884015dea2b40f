// The decoder's element-wise and row kernels and the dense linear layer (C++; internal).
// Every kernel that depends on the positions or the page tables reads them from device memory
// (`Batch`), so a captured decode graph stays valid as the sequences grow.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include "../sparse_moe/internal.cuh"
#include "../sparse_moe/rowdot.cuh" // warp_sum, silu

namespace nf {
namespace dec {

// The decoder's kernels are launched with programmatic dependent launch (launch_pdl): each starts
// by waiting for its predecessor's results, then lets its successor's launch begin, so the gaps
// between the many small kernels of a decode step overlap with work.
__device__ __forceinline__ void pdl_wait()
{
    cudaGridDependencySynchronize();
    cudaTriggerProgrammaticLaunchCompletion();
}

// What a forward reads from device memory: the batch's tables, written by the host (one async copy
// of the pinned staging buffer, decoder.cu) before the forward's first kernel. The pointers point
// into that buffer at offsets that depend only on (T, S), so a captured graph of a decode-only step
// of S sequences stays valid for every later step of S sequences: only the contents change.
//
// The KV pool of a layer is [kv_pages][page_tokens][kv_heads * hd] bf16 (K and V alike), so the
// cache row of position p of sequence s is slot(s, p) = pages[s][p / page_tokens] * page_tokens +
// p % page_tokens; page_tokens is a power of two (pt_shift) so that is a shift and a mask.
struct Batch {
    const int32_t *tokens; // [T]
    const int32_t *pos;    // [T]: each token's position in its sequence
    const int32_t *seq;    // [T]: each token's sequence (0 .. S - 1)
    const int32_t *dtok;   // [n_dec]: the tokens the split (decode) attention takes, batch indices
    const int4 *tiles;     // [n_tiles]: the tile attention's tiles {first token, rows, sequence, first position}
    const int32_t *last;   // [S]: each sequence's last token (the LM head's rows)
    const uint32_t *pages; // [S][stride]: page ids
    uint32_t stride, pt_shift;
    const int32_t *slot = nullptr; // [S]: each sequence's recurrent state slot (hybrids)
};

__device__ __forceinline__ uint32_t kv_slot(const Batch &b, int s, int p)
{
    const uint32_t pg = __ldg(b.pages + (size_t)s * b.stride + ((uint32_t)p >> b.pt_shift));
    return (pg << b.pt_shift) | ((uint32_t)p & ((1u << b.pt_shift) - 1));
}

// The one-group tables the grouped GEMV/GEMM kernels take for a dense matrix: group 0 = expert 0,
// positions 0..T-1; prefill tiles of kPrefillTileM positions. Written by prep_tables each forward.
struct DenseTables {
    int32_t *n_groups, *expert, *start, *count; // [1] each
    int32_t *n_tiles, *tile_group, *tile_m0;    // [1], [max_tiles64] (all 0), [max_tiles]: tiles of kPrefillTileM
    uint32_t max_tiles;
    int32_t *n_tiles64, *tile_m0_64;            // [1], [max_tiles64]: the mmq path's tiles of 64 positions
    int32_t *count64;                           // [max_tiles64]: their counts, min(64, T - 64 i): with
                                                // tile_group (expert 0) and tile_m0_64 the GEMV's groups
                                                // of 64 positions above kGemvMaxT
    int8_t *xq;                                 // [kDenseMmqMax][max cols] the mmq path's int8 input
    float2 *xd;                                 // [kDenseMmqMax][max cols / 32] its (d, d sum q) pairs
};

// The tables for up to `rows` positions in one block of ints: 8 counters (n_groups, expert, start,
// count, n_tiles, n_tiles64, 2 unused), tile_group [tiles64], tile_m0 [tiles], tile_m0_64 [tiles64],
// count64 [tiles64]. dense_tables_ints sizes the block, dense_tables_at lays the tables over it.
inline size_t dense_tables_ints(size_t rows) { return 8 + (rows + kPrefillTileM - 1) / kPrefillTileM + 3 * ((rows + 63) / 64); }
inline DenseTables dense_tables_at(int32_t *p, size_t rows, int8_t *xq, float2 *xd)
{
    const uint32_t mt = (uint32_t)((rows + kPrefillTileM - 1) / kPrefillTileM), m64 = (uint32_t)((rows + 63) / 64);
    return DenseTables{p, p + 1, p + 2, p + 3, p + 4, p + 8, p + 8 + m64, mt, p + 5, p + 8 + m64 + mt, p + 8 + 2 * m64 + mt,
                       xq, xd};
}

// Tokens at or below which the dense layers use the CUDA-core GEMV (each weight row read once for
// all tokens); above, the tensor-core GEMM when the shape takes it.
constexpr uint32_t kGemvMaxT = 16;

// Tokens up to which dense k-quant / q8_0 products above the GEMV's range take the grouped int8
// tensor-core GEMM (mmq.cu, one group of T positions); above, the bf16 prefill GEMM.
constexpr uint32_t kDenseMmqMax = 1024;

// A dense matrix on the device and how to run it.
struct Linear {
    DevMat m;
    int codec;         // nf_codec_id; -1 absent
    bool gemm;         // the tensor-core path takes its shape
    bool a8;           // small T may quantise the input to int8 (k-quant / q8_0 weights)
    bool mmq;          // with a8: 16 < T <= kDenseMmqMax takes the int8 GEMM (its shape fits mmq.cu)
};

void prep_tables(const DenseTables &t, uint32_t T, cudaStream_t s);

// out[T][m.rows] (f32, rows out_stride apart) = W in[T][m.cols] (bf16 rows of stride m.cols): GEMV for
// small T, GEMM else. quantised: t.xq / t.xd already hold in as linear_quant left them (the matrices of
// one input at small T share one quantisation).
cudaError_t linear(const Linear &L, const DenseTables &t, const uint16_t *in, uint32_t T, float *out,
                   uint32_t out_stride, cudaStream_t s, bool quantised = false);
// Whether linear takes L's input quantised once for all CTAs (k-quant / q8_0 weights, 1 < T <= 16),
// and that quantisation into t.xq / t.xd.
bool linear_takes_quant(const Linear &L, uint32_t T);
cudaError_t linear_quant(const DenseTables &t, const uint16_t *in, uint32_t T, uint32_t cols, cudaStream_t s);

// x[t] = embedding row tokens[t] (f32), for t < T.
cudaError_t embed(const Linear &E, const Batch &b, uint32_t T, uint32_t H, float *x, cudaStream_t s);
// out[i] = in[rows[i]] for i < n (bf16 rows of H): each sequence's last token for the LM head.
void gather_rows(const uint16_t *in, const int32_t *rows, uint32_t n, uint32_t H, uint16_t *out, cudaStream_t s);

// x += delta (f32 or bf16, NULL: none); xn = bf16(x * rsqrt(mean(x^2) + eps) * w), per token, rows
// xn_stride apart (0: H; xn NULL: none); xf (optional) the same normed rows in f32, H apart;
// H <= kNormMaxH (create refuses larger).
constexpr int kNormThreads = 512, kNormPer = 16;
constexpr uint32_t kNormMaxH = kNormThreads * kNormPer;
void add_rmsnorm(float *x, const float *delta_f32, const uint16_t *delta_bf16, const float *w, uint32_t T,
                 uint32_t H, float eps, uint16_t *xn, cudaStream_t s, uint32_t xn_stride = 0, float *xf = nullptr);

// The attention input: qkv [T][stride] f32 as the projections wrote it (q: heads*hd, then k, then v:
// kv*hd each). Adds the biases, normalises q and k per head (qk norm), rotates them (neox rope),
// writes q back in place (f32) and k, v as bf16 into the cache slots of the tokens' positions. With
// partial rotary only the first rd dims of a head rotate (rope.cuh).
struct QkvArgs {
    float *qkv;
    uint32_t stride;
    const float *q_bias, *k_bias, *v_bias, *q_norm, *k_norm; // NULL when absent
    uint16_t *kc, *vc;                                      // the layer's pool [kv_pages * page_tokens][kv*hd]
    const float2 *rope;                                     // [ctx][rd / 2] (cos, sin) * attn_factor, by position
    uint32_t heads, kv_heads, hd;
    float eps;
    uint32_t rd; // rotated dims at the start of each head (hd; fewer with partial rotary: rope.cuh)
};
void qkv_rope_store(const QkvArgs &a, const Batch &b, uint32_t T, cudaStream_t s);
// The rotation table: tab[p][i] = (cos, sin)(p * inv_freq[i]) * factor for p < ctx, i < half, the
// angle in f32 and its cos/sin in double, as the CPU reference computes them. src: inv_freq[half],
// then the factor.
void rope_table(const float *src, uint32_t ctx, uint32_t half, float2 *tab, cudaStream_t s);

// att[t] (bf16 [T][heads*hd]) = softmax(q_t K^T / sqrt(hd)) V over positions 0 .. pos[t] of token t's
// sequence (through its page table), kv head = head / (heads / kv_heads). Two kernels share the work
// of a ragged batch: the split (decode) kernel takes the tokens b.dtok[0 .. n_dec) one CTA per
// (token, head, split): decode tokens and short chunks; the tile kernel takes the tiles b.tiles[0 ..
// n_tiles), consecutive tokens of one sequence (at most attention_tile_rows), one CTA per (tile, head):
// prefill chunks. splits > 1 divides the keys (split-K) and merges through `part`
// ([n_dec][heads][splits][hd + 2] f32); a token whose context is short uses fewer of them (at least
// 128 keys a split, attention.cu kSplitKeys), so the count, fixed in a captured graph, is a maximum.
struct AttnArgs {
    const float *q; // [T][q_stride], heads * hd used
    uint32_t q_stride;
    const uint16_t *kc, *vc;
    uint16_t *out;
    float *part;     // [n_dec][heads][splits][hd + 2]: each split's (max, sum, acc[hd]) (splits > 1)
    unsigned *ticket; // [n_dec][heads]: splits done, zero between launches (splits > 1; the last resets it)
    uint32_t heads, kv_heads, hd, splits;
    // Decode-only batches (every sequence one token, dtok the identity): q is not yet rotated and the
    // new positions' k, v are not yet in the cache; the kernel does qkv_rope_store's work for them
    // itself (rope.cuh: the same bits), reading the projections through qk (qk.qkv, qk.stride).
    bool rope = false;
    QkvArgs qk{};
    // The split tokens through the grouped kernel (one CTA per (token, kv head, split); not with
    // rope; attention_gqa_ok shapes): the same bits as the per-head kernel at the same split count.
    bool gqa = false;
};
cudaError_t attention(const AttnArgs &a, const Batch &b, uint32_t n_dec, uint32_t n_tiles, cudaStream_t s);
uint32_t attention_splits(uint32_t T, uint32_t ctx, uint32_t heads);
bool attention_gqa_ok(uint32_t hd, uint32_t heads, uint32_t kv_heads);
// The rows of a tile of the tile kernel the attention picks for this head dim and q stride (64 on the
// tensor cores, 16 on the CUDA cores); a sequence with at least kAttnTileMin tokens in the batch takes
// the tile kernel, shorter ones the split kernel.
uint32_t attention_tile_rows(uint32_t hd, uint32_t q_stride);
constexpr uint32_t kAttnTileMin = 16;

// out[i] = bf16(silu(g[i]) * u[i]), i < n.
void swiglu(const float *g, const float *u, size_t n, uint16_t *out, cudaStream_t s);

// Sampling (sample.cu): the `k` best logits of [vocab] (ties to the lower id), best first, into
// ids/vals; then the host-side rule in decoder.cu picks one. cand: scratch of candidates_scratch().
struct TopK {
    int32_t *ids;
    float *vals;
    float *cand_vals;
    int32_t *cand_ids;
};
constexpr uint32_t kSampleMaxK = 256;
// Scratch floats per row (cand_vals and cand_ids each hold rows times this).
size_t topk_scratch_floats();
// rows rows of logits (row i at logits + i * row_stride): the k best of each into ids/vals [rows][k].
cudaError_t topk(const float *logits, uint32_t vocab, size_t row_stride, uint32_t rows, uint32_t k, const TopK &t,
                 cudaStream_t s);

// Penalties on the device (sample.cu), in place, before topk reads the rows: for row r (logits +
// row[r] * row_stride) and each pair j in start[r] .. start[r + 1] - 1 (token ids[j] < vocab seen
// counts[j] > 0 times; an id at most once per row): l = l > 0 ? l / repetition : l * repetition,
// then l -= frequency * counts[j], then l -= presence. All pointers device.
struct Penalty {
    float repetition, presence, frequency;
};
cudaError_t penalize(float *logits, size_t row_stride, uint32_t rows, const int32_t *row, const uint32_t *start,
                     const Penalty *pen, const int32_t *ids, const uint32_t *counts, uint32_t vocab, cudaStream_t s);

} // namespace dec
} // namespace nf

// The index arithmetic and the per-lane softmax of the tensor-core prefill attention
// (attention.cu, attn_mma_kernel), host-callable so that tests/cuda/test_attn_mma.cu runs it on the
// CPU under an emulation of ldmatrix and mma.m16n8k16 (no GPU needed).
//
// The kernel, FlashAttention-2 style: a CTA takes kRows = 64 consecutive queries of one q head, a
// warp 16 of them (the M of one MMA); the CTA walks the keys in blocks of kKeys = 64, staged in
// shared memory with cp.async (two stages: block j + 1 loads while block j is used). Per block a
// warp computes S = Q K^T (16 x 64, f32 accumulators), updates the running max and sum of each of
// its rows, turns S into P = exp(S - max) in bf16 and adds P V into its O accumulators (16 x HD).
//
// Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"), lane = 4 g + c:
//   A  reg i (0..3): row g + 8 (i % 2), k 2c + 8 (i / 2) + {0, 1} (lower k in the lower half)
//   B  reg i (0..1): k 2c + 8 i + {0, 1}, column g
//   D  reg i (0..3): row g + 8 (i / 2), column 2c + i % 2
// D's two n-tiles 2kk, 2kk + 1 of S (keys 16kk .. 16kk + 15) are exactly the A operand of k-step kk
// of P V: A reg 0 = (row g, keys 2c, 2c+1) = D regs 0, 1 of n-tile 2kk; reg 1 (row g + 8) = its
// regs 2, 3; regs 2, 3 the same of n-tile 2kk + 1 (online_update packs them so; no data moves
// between lanes).
//
// Operands: Q's A fragments come straight from global memory (f32, rounded to bf16 once) and stay
// in registers for the whole key loop. K is the B ("col") operand of S = Q K^T as it is stored
// (row = key, contiguous head dims = the B column's k), read with ldmatrix (no transpose). V's B
// operand of O = P V needs k = key along a column, so V (row = key) is read with ldmatrix.trans.
// Staged rows are HD + 8 elements (16 bytes of pad, 2 HD + 16 = 16 mod 128 bytes for HD 64, 128):
// the 8 rows of one 8x8 matrix start on 8 distinct 16-byte bank groups, so ldmatrix is free of
// bank conflicts.
#pragma once
#include <math.h>
#include <stdint.h>

#include "../sparse_moe/mma_rows.cuh" // NF_HD, NF_UNROLL, bf16x2_bits, mma_bf16_16816

namespace nf {
namespace dec {
namespace fa {

constexpr int kWarps = 4;
constexpr int kRows = 16 * kWarps; // queries of a CTA
constexpr int kKeys = 64;          // keys of a staged block
constexpr int kNT = kKeys / 8;     // n-tiles of S per block
constexpr int kKK = kKeys / 16;    // k-steps of P V per block

// The shapes of one head dimension. Shared memory: K [2][kKeys][kStride], then V the same (bf16).
template <int HD>
struct Shape {
    static_assert(HD % 16 == 0, "a head is whole k-steps");
    static constexpr int kStride = HD + 8;                   // elements of a staged row
    static constexpr int kBlock = kKeys * kStride;           // elements of one staged block
    static constexpr int kQK = HD / 16;                      // k-steps of S = Q K^T
    static constexpr int kDT = HD / 8;                       // n-tiles of O
    static constexpr int kChunks = kKeys * HD / 8;           // 16-byte pieces of a block (K or V)
    static constexpr size_t kSmemBytes = 4ull * kBlock * 2;  // K and V, two stages each
};

// ---- fragment coordinates (lane = 4 g + c) -----------------------------------------------------------
NF_HD int a_row(int lane, int i) { return lane / 4 + 8 * (i % 2); }
NF_HD int a_col(int lane, int i) { return 2 * (lane % 4) + 8 * (i / 2); } // the lower half's k
NF_HD int acc_row(int lane, int i) { return lane / 4 + 8 * (i / 2); }
NF_HD int acc_col(int lane, int i) { return 2 * (lane % 4) + i % 2; }

// ---- ldmatrix.x4 addressing: lane l gives the row address of row l % 8 of matrix l / 8 -------------
// K for n-tiles 2np, 2np + 1 (keys 16np ..) at k-step kk (dims 16kk ..): matrices (keys +0..7, dims
// +0..7), (+0..7, +8..15), (+8..15, +0..7), (+8..15, +8..15) = b0, b1 of n-tile 2np, then of 2np + 1.
// Without transpose lane 4g + c gets row g, elements 2c, 2c + 1 of each: key g, dims 2c, 2c + 1.
template <int HD>
NF_HD int k_ldsm(int lane, int np, int kk)
{
    return (16 * np + 8 * (lane / 16) + lane % 8) * Shape<HD>::kStride + 16 * kk + 8 * (lane / 8 % 2);
}
// V for k-step kk (keys 16kk ..) and n-tiles 2dp, 2dp + 1 (dims 16dp ..): matrices (keys +0..7, dims
// +0..7), (+8..15, +0..7), (+0..7, +8..15), (+8..15, +8..15) = b0, b1 of n-tile 2dp, then of 2dp + 1.
// Transposed, lane 4g + c gets rows 2c, 2c + 1 of column g: keys 2c, 2c + 1 of dim g.
template <int HD>
NF_HD int v_ldsm(int lane, int kk, int dp)
{
    return (16 * kk + 8 * (lane / 8 % 2) + lane % 8) * Shape<HD>::kStride + 16 * dp + 8 * (lane / 16);
}

// ---- staging: piece i (0 .. kChunks - 1) of the block at key kb --------------------------------------
// Row r = i / (HD / 8) (consecutive threads take consecutive 16-byte pieces of a row); rows at or past
// n_keys (the keys the tile's last query sees) are zero-filled, never read: garbage there could be
// NaN, and 0 * NaN in P V would poison the rows that P masks with 0.
struct Piece {
    int smem;      // element offset in the staged block
    size_t global; // element offset from the kv head's first element of row 0 (valid only if ok)
    bool ok;
};
template <int HD>
NF_HD Piece piece(int i, int kb, int n_keys, uint32_t kv_row)
{
    const int r = i / (HD / 8), c8 = i % (HD / 8);
    const bool ok = kb + r < n_keys;
    return Piece{r * Shape<HD>::kStride + 8 * c8, ok ? (size_t)(kb + r) * kv_row + 8 * c8 : 0, ok};
}

// ---- causality -----------------------------------------------------------------------------------
// A warp's rows are queries q_first .. q_first + 15 (positions); the last key any live row sees is
// q_last = min(q_first + 15, n_keys - 1) (rows past the chunk's T see n_keys - 1 keys: never stored,
// just kept finite). A block is skipped when all its keys are past q_last, taken whole when all are
// at or before q_first, masked per element otherwise (at most two blocks a warp).
enum BlockKind { kSkip, kFull, kMasked };
NF_HD BlockKind block_kind(int kb, int q_first, int q_last)
{
    return kb > q_last ? kSkip : kb + kKeys - 1 <= q_first ? kFull : kMasked;
}
// The last key row (0: g, 1: g + 8) of the lane may see.
NF_HD int row_limit(int lane, int r, int q_first, int n_keys)
{
    const int q = q_first + lane / 4 + 8 * r;
    return q < n_keys - 1 ? q : n_keys - 1;
}

// The score scale in log2 units: softmax(x / sqrt(hd)) = 2^(x log2(e) / sqrt(hd) - max) / sum.
NF_HD float score_scale_log2(int hd) { return 1.4426950408889634f / sqrtf((float)hd); }

// S (raw dot products) to scaled scores, keys past the row's limit at -inf (MASK).
template <bool MASK>
NF_HD void scale_mask(float (&s)[kNT][4], int lane, int kb, const int (&lim)[2], float sl2)
{
    NF_UNROLL
    for (int j = 0; j < kNT; j++)
        NF_UNROLL
        for (int i = 0; i < 4; i++) {
            s[j][i] *= sl2;
            if (MASK && kb + 8 * j + acc_col(lane, i) > lim[i / 2]) s[j][i] = -INFINITY;
        }
}

// The lane's share of each of its rows' block max (the quad's 4 lanes then combine theirs).
NF_HD void row_max(const float (&s)[kNT][4], float (&mx)[2])
{
    mx[0] = mx[1] = -INFINITY;
    NF_UNROLL
    for (int j = 0; j < kNT; j++) {
        mx[0] = fmaxf(mx[0], fmaxf(s[j][0], s[j][1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[j][2], s[j][3]));
    }
}

// The online softmax of a lane's rows g (0) and g + 8 (1): m the running max of the scaled scores
// (the quad's lanes agree on it), l the sum of this lane's own P so far (the quad's four partial
// sums are added once, at the end).
struct RowState {
    float m[2], l[2];
};

// One block: the new max (mx: the quad's block max), the old O and l rescaled by 2^(m - new m), P =
// bf16(2^(s - new m)) packed as the A operand of P V (pa[kk]: keys 16kk ..; see the file header), l
// plus the ROUNDED P, so that the output is the exact weighted mean of V under weights bf16(p) /
// sum bf16(p) (the numerics in attention.cu). The first block a warp takes is block 0, where every
// row has key 0: m is finite from then on, and 2^(-inf - m) = 0 for masked keys and the first rescale.
template <int DT>
NF_HD void online_update(const float (&s)[kNT][4], const float (&mx)[2], RowState &st, float (&o)[DT][4],
                         uint32_t (&pa)[kKK][4])
{
    float mn[2], corr[2];
    NF_UNROLL
    for (int r = 0; r < 2; r++) {
        mn[r] = fmaxf(st.m[r], mx[r]);
        corr[r] = exp2f(st.m[r] - mn[r]);
        st.m[r] = mn[r];
        st.l[r] *= corr[r];
    }
    NF_UNROLL
    for (int d = 0; d < DT; d++)
        NF_UNROLL
        for (int i = 0; i < 4; i++) o[d][i] *= corr[i / 2];
    NF_UNROLL
    for (int kk = 0; kk < kKK; kk++)
        NF_UNROLL
        for (int jj = 0; jj < 2; jj++)
            NF_UNROLL
            for (int r = 0; r < 2; r++) {
                const float *sj = s[2 * kk + jj];
                const __nv_bfloat162 p = __floats2bfloat162_rn(exp2f(sj[2 * r] - mn[r]), exp2f(sj[2 * r + 1] - mn[r]));
                const float2 pf = __bfloat1622float2(p);
                st.l[r] += pf.x + pf.y;
                pa[kk][2 * jj + r] = bf16x2_bits(p);
            }
}

} // namespace fa
} // namespace dec
} // namespace nf

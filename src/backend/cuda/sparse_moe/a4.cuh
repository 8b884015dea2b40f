// NVFP4 activations (W4A4 prefill, docs/sparse_moe.md "W4A4"): the device encoder, the operands'
// exact bf16 decode, and the entry points of the W4A4 grouped GEMM (prefill.cu) and of the chunk
// encoder (a4.cu).
//
// Encoding (one block of 16 consecutive elements of a row, divisor g): the rules of the repo's
// codec quantizer (codec/nvfp4.c, byte-identical to compressed-tensors 0.20.1), which are also
// compressed-tensors' and ModelOpt's dynamic activation quantization with a static global scale:
//   scale byte = e4m3_rne(min(g * (amax / 6), 448)), 0 replaced by 0x20 (their eps, 0.125)
//   eff        = e4m3(scale byte) / g                (fp32)
//   nibble     = e2m1_rne(x / eff) with their thresholds, clamped to +-6, sign bit when x / eff < 0
// every step in IEEE fp32 round-to-nearest (explicit __fdiv_rn/__fmul_rn, so no contraction or
// approximate division can change a byte): the device bytes equal nf_nvfp4_block_scale and
// nf_f32_to_e2m1 applied to the same floats (tests/cuda/test_sparse_moe.cu checks the chunk encoder
// byte for byte against the CPU).
#pragma once
#include <cuda_fp8.h>

#include <type_traits>

#include "internal.cuh"

namespace nf {

// An nvfp4 activation plane in the workspace: data u8 [rows][cols/2] (element 2i in the low
// nibble of byte i), then scales e4m3 u8 [rows][cols/16], row-major. No divisor word: the divisor
// is the consumer's (the layer's gate/up input divisor, or the expert's down input divisor).
struct A4Plane {
    uint8_t *q;
    uint8_t *s;
    uint32_t cols;
};
inline A4Plane a4_plane(uint8_t *base, size_t rows, uint32_t cols) { return A4Plane{base, base + rows * cols / 2, cols}; }

__device__ __forceinline__ uint32_t a4_scale_byte(float amax, float g)
{
    const float s = fminf(__fmul_rn(g, __fdiv_rn(amax, 6.0f)), 448.0f);
    const uint32_t b = __nv_cvt_float_to_fp8(s, __NV_SATFINITE, __NV_E4M3);
    return (b & 0x7f) == 0 ? 0x20u : b;
}
// eff = e4m3 / g in fp32, then the e2m1 nibble of x / eff
__device__ __forceinline__ float a4_eff(uint32_t scale_byte, float g) { return __fdiv_rn(e4m3_f(scale_byte), g); }
__device__ __forceinline__ uint32_t a4_nibble(float x, float eff)
{
    const float q = __fdiv_rn(x, eff), a = fabsf(q);
    // index = number of thresholds passed; ties go to the even index (0.25->0, 0.75->1, ...)
    const uint32_t i = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f);
    return (q < 0.0f ? 8u : 0u) | i;
}

// One nvfp4 block (8 data bytes v, scale byte s) as 8 bf16x2 words of e2m1 * e4m3, element order,
// exact (e2m1 * e4m3 has at most 6 significant bits: CNVFP4Raw below).
__device__ __forceinline__ void a4_decode16(uint2 v, uint32_t s, uint32_t (&p)[8])
{
    const float sc = e4m3_f(s);
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const uint32_t byte = ((j < 4 ? v.x : v.y) >> (8 * (j & 3))) & 0xFF;
        p[j] = pack_bf16x2(e2m1_f(byte & 0xF) * sc, e2m1_f(byte >> 4) * sc);
    }
}

// 1 / (divisor of weight row wrow of `expert`)
__device__ __forceinline__ float inv_row_div(const DevMat &W, int expert, uint32_t wrow)
{
    return 1.0f / W.divisors[div_word(W, (uint64_t)expert * W.rows + wrow)];
}

// The scales of an nvfp4 tile's accumulator columns, 1 / (row divisor * ga): s0[j], s1[j] for the
// thread's columns col0 + 8 j + 2 (lane % 4) and + 1 of column block bx (the m16n8 / wgmma
// accumulator layout), each column's weight row by prefill_b_row.
template <bool GLU, int NJ>
__device__ __forceinline__ void col_scales(const DevMat &W, int expert, int bx, int col0, float ga, float (&s0)[NJ],
                                           float (&s1)[NJ])
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
        const int col = col0 + 8 * j + 2 * (lane & 3);
        s0[j] = inv_row_div(W, expert, prefill_b_row<GLU>(W, bx, col)) / ga;
        s1[j] = inv_row_div(W, expert, prefill_b_row<GLU>(W, bx, col + 1)) / ga;
    }
}

// The W4A4 gate/up epilogue for one position row: v[ni] are the quad's SwiGLU values (element
// ni * 4 + lane % 4 of the warp's block of 16); encodes the block with divisor gd and, when
// `live`, stores it (8 data bytes and the scale byte) at row `pos`, block `blk` of `out`. All 32
// lanes must call it (shuffles).
__device__ __forceinline__ void a4_store_block(const float v[4], float gd, bool live, size_t pos, int blk,
                                               const A4Plane &out)
{
    const int lane = threadIdx.x & 31;
    float am = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
    am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, 1));
    am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, 2));
    const uint32_t sb = a4_scale_byte(am, gd);
    const float eff = a4_eff(sb, gd);
    uint32_t P = 0; // lanes 0 and 2 of the quad: bytes 2 ni (lane 0) or 2 ni + 1 (lane 2)
#pragma unroll
    for (int ni = 0; ni < 4; ni++) {
        const uint32_t nib = a4_nibble(v[ni], eff), hi = __shfl_xor_sync(0xffffffffu, nib, 1);
        P |= (nib | (hi << 4)) << (8 * ni);
    }
    const uint32_t P2 = __shfl_xor_sync(0xffffffffu, P, 2);
    if (live && (lane & 3) == 0) {
        *reinterpret_cast<uint2 *>(out.q + pos * (out.cols / 2) + blk * 8) =
            make_uint2(__byte_perm(P, P2, 0x5140), __byte_perm(P, P2, 0x7362));
        out.s[pos * (out.cols / 16) + blk] = (uint8_t)sb;
    }
}

// The weights of the W4A4 GEMM decoded WITHOUT the divisor: e2m1 * e4m3, which bf16 holds exactly
// (e2m1 has at most 2 significant bits, e4m3 at most 4, so the product has at most 6 <= bf16's 8;
// its magnitude lies in [2^-10, 2688], far inside bf16's exponent range). The divisor is applied
// once per output in the epilogue.
struct CNVFP4Raw : CNVFP4 {
    __device__ static Row row(const DevMat &m, uint32_t e, uint32_t r)
    {
        const uint64_t g = (uint64_t)e * m.rows + r;
        return Row{m.data + g * m.row_stride, m.scales, g, m.kt, 1.0f};
    }
};

// The prefill GEMMs' codec for a bank codec: nvfp4 banks decode without the divisor (CNVFP4Raw)
// and the epilogue scales each column by its row's 1 / divisor, so every product is exact.
template <class C>
using raw_nvfp4_t = typename std::conditional<std::is_same<C, CNVFP4>::value, CNVFP4Raw, C>::type;

// The operands of one W4A4 GEMM launch.
//   in:       A, nvfp4 rows (x rows through pos_entry for gate/up, positions for down)
//   in_div:   A's divisor for the group's expert e is in_div[e * in_div_stride]
//   out:      gate/up only: the SwiGLU intermediate, encoded per 16 with out_div[e] (the expert's
//             down input divisor)
struct A4Args {
    A4Plane in;
    const float *in_div;
    uint32_t in_div_stride;
    A4Plane out;
    const float *out_div;
};

// a4.cu: encodes x [T][cols] bf16 into `out` with divisor *divisor (device).
cudaError_t launch_a4_encode(const uint16_t *x, uint32_t T, uint32_t cols, const float *divisor, A4Plane out,
                             cudaStream_t s);

// prefill.cu: the W4A4 grouped GEMM over an nvfp4 bank W. glu: out = a.out (y unused); else
// y[pos][W.rows] = (W_row . A_pos) / (row divisor * A divisor), f32 or (y16) bf16.
cudaError_t launch_prefill_gemm_a4(bool glu, const DevMat &W, const A4Args &a, const Groups &g, const TileList &tl,
                                   void *y, uint32_t y_stride, bool y16, cudaStream_t s);

} // namespace nf

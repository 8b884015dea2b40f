// The int8 activation quantiser of the W·A8 kernels (gemv_a8.cu's input rows, down_a8.cu's SwiGLU
// intermediate), per 32-element block:
//     d = amax / 127 (f32),  q = rint(x / d) (IEEE division, ties to even; 0 when amax = 0)
// stored as xq (int8) and xd = (d, d * sum q) per block, the pair the span policies take
// (spans_a8.cuh). tests/common/cuda_test_util.h's nf_test_quantize_a8 repeats it bit for bit.
#pragma once
#include <stdint.h>

namespace nf {

// The staged xq layout: element e of a row at byte a8_at(e) = e + 16 (e / 64), rows a8_stride(cols)
// bytes apart (a multiple of 16 when cols % 32 == 0). Why the 16-byte pad every 64: a lane reads a
// span of 64 (k-quants) or 32 (q8_0) elements, so unpadded the lanes of a quarter-warp's 16-byte
// loads sit 64 or 128 bytes apart and meet on two bank groups (ncu at 878dbee: 12-way conflicts,
// 71 % of the shared-load wavefronts excess in the decode gate/up and down); padded, eight
// consecutive spans start on eight distinct 16-byte bank groups. A span never crosses a pad.
__host__ __device__ inline uint32_t a8_at(uint32_t e) { return e + (e >> 6) * 16; }
__host__ __device__ inline uint32_t a8_stride(uint32_t cols) { return a8_at(cols); }

// The quantisation of a thread's 8 elements, four consecutive lanes a block (every lane of the
// warp calls it together: the shuffles): the int8 values packed 4 a word, the block's d and sum q.
__device__ __forceinline__ void quant8_words(const float (&f)[8], uint32_t (&packed)[2], float &d, int &sum)
{
    float am = 0.f;
#pragma unroll
    for (int i = 0; i < 4; i++) am = fmaxf(am, fmaxf(fabsf(f[2 * i]), fabsf(f[2 * i + 1])));
    am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, 1));
    am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, 2));
    d = am / 127.0f;
    sum = 0;
    packed[0] = packed[1] = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int q = am > 0.f ? __float2int_rn(f[i] / d) : 0;
        sum += q;
        packed[i / 4] |= (uint32_t)(q & 0xFF) << (8 * (i % 4));
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
}

// One element a lane, a warp = one 32-element block (every lane calls it together): quant8_words'
// quantiser on the same values (the block's max is order-free, the division the same), so the same
// q, d and sum q.
__device__ __forceinline__ void quant8_lane(float f, int &q, float &d, int &sum)
{
    float am = fabsf(f);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
    d = am / 127.0f;
    q = am > 0.f ? __float2int_rn(f / d) : 0;
    sum = q;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
}

// A thread's 8 consecutive elements f: vector v of the rows' cols / 8 vectors each (row t = v / (cols
// / 8), elements e = 8 (v % (cols / 8)) .. e + 7); four consecutive lanes hold one block, so every
// lane of the warp must call this together (the shuffles), including lanes with nothing to store
// (ok = false, f zeros). Writes row t's xq[a8_at(e) ..] and, from the block's first lane, xd[v / 4].
__device__ __forceinline__ void quant8_store(const float (&f)[8], bool ok, uint32_t v, uint32_t cols, int8_t *xq,
                                             float2 *xd)
{
    uint32_t packed[2];
    float d;
    int sum;
    quant8_words(f, packed, d, sum);
    if (ok) {
        const uint32_t vecs = cols / 8, t = v / vecs;
        *reinterpret_cast<uint2 *>(xq + (size_t)t * a8_stride(cols) + a8_at(8 * (v % vecs))) =
            make_uint2(packed[0], packed[1]);
        if (v % 4 == 0) xd[v / 4] = make_float2(d, d * (float)sum);
    }
}

} // namespace nf

// Causal GQA attention over the bf16 KV cache, flash-decoding style: one CTA per (token, q head,
// key split); its warps take blocks of 32 keys (a lane per key for the scores, a lane per pair of
// dimensions for the values) with an online softmax, so no T x T matrix exists anywhere. With more
// than one split the partial (max, sum, acc) triples are merged by a second kernel.
#include <math.h>

#include "ops.cuh"

namespace nf {
namespace dec {

namespace {

constexpr int kWarps = 4;
constexpr int kMaxHd = 256;

__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// The online-softmax state of one warp: running max m, sum l, and the lane's NP pairs of acc.
template <int NP>
struct Online {
    float m = -INFINITY, l = 0.0f;
    float acc[2 * NP] = {};
};

// Scores of keys k0 + lane (< k1) against q (smem f32), then the state update with their values.
template <int NP>
__device__ void key_block(const AttnArgs &a, const float *qs, uint32_t kvh, int k0, int k1, float scale, Online<NP> &st)
{
    const int lane = threadIdx.x % 32, key = k0 + lane;
    const uint32_t kvd = a.kv_heads * a.hd;
    float sc = -INFINITY;
    if (key < k1) {
        const uint4 *kr = reinterpret_cast<const uint4 *>(a.kc + (size_t)key * kvd + kvh * a.hd);
        float d = 0;
        for (uint32_t c = 0; c < a.hd / 8; c++) {
            const uint4 v = kr[c];
            const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                d = fmaf(__uint_as_float(w[i] << 16), qs[8 * c + 2 * i], d);
                d = fmaf(__uint_as_float(w[i] & 0xFFFF0000u), qs[8 * c + 2 * i + 1], d);
            }
        }
        sc = d * scale;
    }
    const float mb = warp_max(sc);
    const float mn = fmaxf(st.m, mb);
    const float corr = expf(st.m - mn); // 0 while st.m is -inf
    const float p = key < k1 ? expf(sc - mn) : 0.0f;
    st.l = st.l * corr + warp_sum(p);
    st.m = mn;
#pragma unroll
    for (int i = 0; i < 2 * NP; i++) st.acc[i] *= corr;
    const int nk = min(32, k1 - k0);
    for (int j = 0; j < nk; j++) {
        const float pj = __shfl_sync(0xffffffffu, p, j);
        const uint32_t *vr = reinterpret_cast<const uint32_t *>(a.vc + (size_t)(k0 + j) * kvd + kvh * a.hd);
#pragma unroll
        for (int i = 0; i < NP; i++) {
            const uint32_t pr = lane + 32 * i;
            if (2 * pr < a.hd) {
                const uint32_t w = vr[pr];
                st.acc[2 * i] = fmaf(pj, __uint_as_float(w << 16), st.acc[2 * i]);
                st.acc[2 * i + 1] = fmaf(pj, __uint_as_float(w & 0xFFFF0000u), st.acc[2 * i + 1]);
            }
        }
    }
}

__device__ __forceinline__ uint16_t f2bf(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }

template <int NP>
__global__ void __launch_bounds__(kWarps * 32) attn_kernel(AttnArgs a, const Step *step)
{
    __shared__ float qs[kMaxHd];
    __shared__ float wm[kWarps], wl[kWarps], wacc[kWarps][kMaxHd];
    const uint32_t t = blockIdx.x, h = blockIdx.y, split = blockIdx.z, hd = a.hd;
    const uint32_t kvh = h / (a.heads / a.kv_heads);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int n_keys = step->pos0 + (int)t + 1;
    const int per = (n_keys + (int)a.splits - 1) / (int)a.splits;
    const int kb = (int)split * per, ke = min(n_keys, kb + per);
    const float *q = a.q + (size_t)t * a.q_stride + h * hd;
    for (uint32_t i = threadIdx.x; i < hd; i += blockDim.x) qs[i] = q[i];
    __syncthreads();
    Online<NP> st;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int k0 = kb + 32 * warp; k0 < ke; k0 += 32 * kWarps) key_block<NP>(a, qs, kvh, k0, ke, scale, st);
    if (lane == 0) wm[warp] = st.m, wl[warp] = st.l;
#pragma unroll
    for (int i = 0; i < NP; i++) {
        const uint32_t pr = lane + 32 * i;
        if (2 * pr < hd) wacc[warp][2 * pr] = st.acc[2 * i], wacc[warp][2 * pr + 1] = st.acc[2 * i + 1];
    }
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < kWarps; w++) M = fmaxf(M, wm[w]);
    float L = 0, f[kWarps];
    for (int w = 0; w < kWarps; w++) f[w] = M == -INFINITY ? 0.0f : expf(wm[w] - M), L += wl[w] * f[w];
    if (a.splits == 1) {
        for (uint32_t d = threadIdx.x; d < hd; d += blockDim.x) {
            float v = 0;
            for (int w = 0; w < kWarps; w++) v += wacc[w][d] * f[w];
            a.out[((size_t)t * a.heads + h) * hd + d] = f2bf(v / L);
        }
        return;
    }
    float *pp = a.part + (((size_t)t * a.heads + h) * a.splits + split) * (hd + 2);
    if (threadIdx.x == 0) pp[0] = M, pp[1] = L;
    for (uint32_t d = threadIdx.x; d < hd; d += blockDim.x) {
        float v = 0;
        for (int w = 0; w < kWarps; w++) v += wacc[w][d] * f[w];
        pp[2 + d] = v;
    }
}

// One CTA per (token, head): out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M).
__global__ void merge_kernel(AttnArgs a)
{
    const uint32_t t = blockIdx.x, h = blockIdx.y, hd = a.hd;
    const float *pp = a.part + ((size_t)t * a.heads + h) * a.splits * (hd + 2);
    float M = -INFINITY;
    for (uint32_t s = 0; s < a.splits; s++) M = fmaxf(M, pp[s * (hd + 2)]);
    float L = 0;
    for (uint32_t s = 0; s < a.splits; s++) {
        const float m = pp[s * (hd + 2)];
        if (m != -INFINITY) L += pp[s * (hd + 2) + 1] * expf(m - M);
    }
    for (uint32_t d = threadIdx.x; d < hd; d += blockDim.x) {
        float v = 0;
        for (uint32_t s = 0; s < a.splits; s++) {
            const float m = pp[s * (hd + 2)];
            if (m != -INFINITY) v += pp[s * (hd + 2) + 2 + d] * expf(m - M);
        }
        a.out[((size_t)t * a.heads + h) * hd + d] = f2bf(v / L);
    }
}

} // namespace

uint32_t attention_splits(uint32_t T, uint32_t ctx, uint32_t heads)
{
    // Enough CTAs to cover the GPU twice at decode sizes; each split keeps >= 256 keys at full context.
    const uint32_t want = (264 + T * heads - 1) / (T * heads), most = (ctx + 255) / 256;
    uint32_t s = want < most ? want : most;
    if (s > 32) s = 32;
    return s ? s : 1;
}

cudaError_t attention(const AttnArgs &a, const Step *step, uint32_t T, cudaStream_t s)
{
    if (a.hd % 8 || a.hd > kMaxHd || a.heads % a.kv_heads) return cudaErrorInvalidValue;
    const dim3 grid(T, a.heads, a.splits);
    const int np = (int)((a.hd + 63) / 64);
    switch (np) {
    case 1: attn_kernel<1><<<grid, kWarps * 32, 0, s>>>(a, step); break;
    case 2: attn_kernel<2><<<grid, kWarps * 32, 0, s>>>(a, step); break;
    case 3: attn_kernel<3><<<grid, kWarps * 32, 0, s>>>(a, step); break;
    default: attn_kernel<4><<<grid, kWarps * 32, 0, s>>>(a, step); break;
    }
    if (a.splits > 1) merge_kernel<<<dim3(T, a.heads), 128, 0, s>>>(a);
    return cudaGetLastError();
}

} // namespace dec
} // namespace nf

// The lane-level building block every CUDA-core route uses: a warp walks the pieces of one or two
// weight rows, U pieces per lane at a time with all their loads issued before any decode, and dots
// them with up to MAXT activation rows.
#pragma once
#include "dev_codecs.cuh"

namespace nf {

constexpr int kLoadBatch = 4; // pieces per lane in flight per row

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// acc[t] += sum over the row's elements of w * x_t, for t < nt (nt <= MAXT). x_t = xs + t * xstride,
// f32. NROWS = 2 dots two rows (gate and up) against the same activations into acc and acc2.
template <class C, int MAXT, int NROWS>
__device__ __forceinline__ void dot_rows(const typename C::Row &Ra, const typename C::Row &Rb, int pieces,
                                         const float *xs, int xstride, int nt, float *acc, float *acc2)
{
    const int lane = threadIdx.x % 32;
    for (int q0 = lane; q0 < pieces; q0 += 32 * kLoadBatch) {
        typename C::Raw ra[kLoadBatch], rb[kLoadBatch];
#pragma unroll
        for (int u = 0; u < kLoadBatch; u++) {
            const int q = q0 + 32 * u;
            if (q < pieces) {
                ra[u] = C::load(Ra, q);
                if (NROWS == 2) rb[u] = C::load(Rb, q);
            }
        }
#pragma unroll
        for (int u = 0; u < kLoadBatch; u++) {
            const int q = q0 + 32 * u;
            if (q >= pieces) break;
#pragma unroll
            for (int row = 0; row < NROWS; row++) {
                float w[C::PE];
                C::decode(row ? Rb : Ra, row ? rb[u] : ra[u], q, w);
                float *a = row ? acc2 : acc;
#pragma unroll
                for (int run = 0; run < C::RUNS; run++) {
                    const int e0 = C::elem(q, run);
#pragma unroll
                    for (int t = 0; t < MAXT; t++) {
                        if (t >= nt) break;
                        const float *xv = xs + (size_t)t * xstride + e0;
                        float s = a[t];
#pragma unroll
                        for (int i = 0; i < C::RUN; i++) s = fmaf(w[run * C::RUN + i], xv[i], s);
                        a[t] = s;
                    }
                }
            }
        }
    }
}

__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }

} // namespace nf

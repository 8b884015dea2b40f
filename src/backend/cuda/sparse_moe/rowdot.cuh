// The lane-level building block every CUDA-core route uses: a warp walks the pieces of one or two
// weight rows, U pieces per lane at a time with all their loads issued before any decode, and dots
// them with up to MAXT activation rows.
#pragma once
#include "dev_codecs.cuh"
#include "internal.cuh"

namespace nf {

constexpr int kLoadBatch = 4; // pieces per lane in flight per row

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// One lane's batch of kLoadBatch pieces of one or two rows, loaded before any is decoded.
template <class C>
struct RowBatch {
    typename C::Raw a[kLoadBatch], b[kLoadBatch];
};

// Loads the pieces q0, q0 + 32, ... (q0 + 32 * (kLoadBatch - 1)) that exist.
template <class C, int NROWS>
__device__ __forceinline__ void load_batch(const typename C::Row &Ra, const typename C::Row &Rb, int q0, int pieces,
                                           RowBatch<C> &B)
{
#pragma unroll
    for (int u = 0; u < kLoadBatch; u++) {
        const int q = q0 + 32 * u;
        if (q < pieces) {
            B.a[u] = C::load(Ra, q);
            if (NROWS == 2) B.b[u] = C::load(Rb, q);
        }
    }
}

// acc[t] += the batch's pieces dotted with x_t, t < nt (nt <= MAXT); x_t = xs + t * xstride, f32.
// NROWS = 2 dots two rows (gate and up) against the same activations into acc and acc2.
template <class C, int MAXT, int NROWS>
__device__ __forceinline__ void use_batch(const typename C::Row &Ra, const typename C::Row &Rb, int q0, int pieces,
                                          const RowBatch<C> &B, const float *xs, int xstride, int nt, float *acc,
                                          float *acc2)
{
#pragma unroll
    for (int u = 0; u < kLoadBatch; u++) {
        const int q = q0 + 32 * u;
        if (q >= pieces) break;
#pragma unroll
        for (int row = 0; row < NROWS; row++) {
            float w[C::PE];
            C::decode(row ? Rb : Ra, row ? B.b[u] : B.a[u], q, w);
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

// acc[t] += sum over the row's elements of w * x_t, for t < nt, from the lane's batch starting at
// piece q_begin (lane + 32 * kLoadBatch * n: a caller that used its first batch already skips it).
template <class C, int MAXT, int NROWS>
__device__ __forceinline__ void dot_rows(const typename C::Row &Ra, const typename C::Row &Rb, int pieces,
                                         const float *xs, int xstride, int nt, float *acc, float *acc2,
                                         int q_begin = threadIdx.x % 32)
{
    for (int q0 = q_begin; q0 < pieces; q0 += 32 * kLoadBatch) {
        RowBatch<C> B;
        load_batch<C, NROWS>(Ra, Rb, q0, pieces, B);
        use_batch<C, MAXT, NROWS>(Ra, Rb, q0, pieces, B, xs, xstride, nt, acc, acc2);
    }
}

// L2 prefetch of one expert's slice of the matrix the next launch reads (the decode route's down
// projection, prefetched by gate/up): the CTAs of group gi's expert split its bytes, one 128-byte
// line per thread, fire and forget. At decode sizes gate/up is latency-bound and leaves DRAM
// bandwidth idle; down then reads from L2.
__device__ __forceinline__ void prefetch_expert(const NextMat &nx, uint32_t expert)
{
    if (!nx.data) return;
    const uint64_t lines = (nx.expert_bytes + 127) / 128, per = (lines + gridDim.x - 1) / gridDim.x;
    const uint8_t *base = nx.data + expert * nx.expert_bytes;
    for (uint64_t l = blockIdx.x * per + threadIdx.x; l < min(lines, (blockIdx.x + 1) * per); l += blockDim.x)
        prefetch_line(base + l * 128, false);
}

__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }

} // namespace nf

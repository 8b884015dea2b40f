// The decoder's row kernels (embedding, fused residual add + RMSNorm, qk-norm + rope + cache store,
// SwiGLU) and the dense linear layer over the sparse-MoE operator's grouped GEMV/GEMM.
#include "ops.cuh"
#include "rope.cuh"

extern "C" {
#include "codec/codec.h"
}

namespace nf {
namespace dec {

namespace {

__global__ void prep_kernel(DenseTables t, uint32_t T)
{
    const uint32_t tiles = (T + kPrefillTileM - 1) / kPrefillTileM, tiles64 = (T + 63) / 64;
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        *t.n_groups = 1, *t.expert = 0, *t.start = 0, *t.count = (int32_t)T;
        *t.n_tiles = (int32_t)tiles, *t.n_tiles64 = (int32_t)tiles64;
    }
    for (uint32_t i = threadIdx.x; i < tiles; i += blockDim.x) t.tile_m0[i] = (int32_t)(i * kPrefillTileM);
    for (uint32_t i = threadIdx.x; i < tiles64; i += blockDim.x) {
        t.tile_group[i] = 0, t.tile_m0_64[i] = (int32_t)(i * 64);
        t.count64[i] = (int32_t)(T - 64 * i < 64 ? T - 64 * i : 64);
    }
}

// One CTA per token: each thread decodes pieces of the embedding row.
template <class C>
__global__ void embed_kernel(DevMat E, Batch b, uint32_t H, float *x)
{
    const uint32_t t = blockIdx.x;
    const typename C::Row R = C::row(E, 0, (uint32_t)b.tokens[t]);
    const int pieces = (int)(H / C::BLK) * C::PIECES;
    float *dst = x + (size_t)t * H;
    for (int q = threadIdx.x; q < pieces; q += blockDim.x) {
        float w[C::PE];
        C::decode(R, C::load(R, q), q, w);
#pragma unroll
        for (int run = 0; run < C::RUNS; run++) {
            const int e0 = C::elem(q, run);
#pragma unroll
            for (int i = 0; i < C::RUN; i++) dst[e0 + i] = w[run * C::RUN + i];
        }
    }
}

__device__ __forceinline__ float block_sum(float v, float *red)
{
    v = warp_sum(v);
    const int lane = threadIdx.x % 32, wid = threadIdx.x / 32, nw = blockDim.x / 32;
    __syncthreads(); // red may still be read from a previous call
    if (lane == 0) red[wid] = v;
    __syncthreads();
    float s = 0;
    for (int i = 0; i < nw; i++) s += red[i];
    return s;
}

// One CTA per token, the row held in registers: every load is issued before any is used (a loop
// that stores x between loads would wait a memory round trip per element). The sum of squares in
// f32 over the row, as the CPU reference.
__global__ void __launch_bounds__(kNormThreads) add_rmsnorm_kernel(float *__restrict__ x, const float *__restrict__ df,
                                                                   const uint16_t *__restrict__ db,
                                                                   const float *__restrict__ w, uint32_t H, float eps,
                                                                   uint16_t *__restrict__ xn, uint32_t xn_stride,
                                                                   float *__restrict__ xf)
{
    float wr[kNormPer]; // the weights do not depend on the predecessor: loaded before the wait
#pragma unroll
    for (int j = 0; j < kNormPer; j++) {
        const uint32_t i = threadIdx.x + j * kNormThreads;
        wr[j] = i < H ? w[i] : 0.0f;
    }
    pdl_wait();
    __shared__ float red[32];
    float *xr = x + (size_t)blockIdx.x * H;
    const size_t base = (size_t)blockIdx.x * H;
    float v[kNormPer];
#pragma unroll
    for (int j = 0; j < kNormPer; j++) {
        const uint32_t i = threadIdx.x + j * kNormThreads;
        v[j] = i < H ? xr[i] + (df ? df[base + i] : 0.0f) + (db ? bf2f(db[base + i]) : 0.0f) : 0.0f;
    }
    float ss = 0;
#pragma unroll
    for (int j = 0; j < kNormPer; j++) {
        const uint32_t i = threadIdx.x + j * kNormThreads;
        if (i < H && (df || db)) xr[i] = v[j];
        ss += v[j] * v[j];
    }
    const float inv = 1.0f / sqrtf(block_sum(ss, red) / (float)H + eps);
    uint16_t *xr_n = xn ? xn + (size_t)blockIdx.x * xn_stride : nullptr;
#pragma unroll
    for (int j = 0; j < kNormPer; j++) {
        const uint32_t i = threadIdx.x + j * kNormThreads;
        const float y = v[j] * inv * wr[j];
        if (i < H && xr_n) xr_n[i] = f2bf(y);
        if (i < H && xf) xf[base + i] = y;
    }
}

__global__ void rope_table_kernel(const float *src, uint32_t ctx, uint32_t half, float2 *tab)
{
    const float fac = src[half];
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < (size_t)ctx * half; j += (size_t)gridDim.x * blockDim.x) {
        const float ang = (float)(j / half) * src[j % half];
        double sd, cd;
        sincos((double)ang, &sd, &cd);
        tab[j] = make_float2((float)cd * fac, (float)sd * fac);
    }
}

// One warp per (token, head) over q heads then kv heads (rope.cuh). What does not depend on the
// predecessor -- the position and cache slot (written before the forward's first kernel), the
// rotations, norm weights and biases -- is loaded before the grid-dependency wait.
__global__ void qkv_kernel(QkvArgs a, Batch b)
{
    const uint32_t t = blockIdx.x, h = blockIdx.y;
    const int pos = b.pos[t];
    const uint32_t slot = h >= a.heads ? kv_slot(b, b.seq[t], pos) : 0;
    HeadIn p;
    head_in(a, h, pos, p);
    pdl_wait();
    float *row = a.qkv + (size_t)t * a.stride;
    HeadOut o;
    head_rotate(a, row, h, p, o);
    if (h >= a.heads) return store_kv(a, row, h - a.heads, slot, o);
    head_write(a, o, row + h * a.hd);
}

__global__ void gather_kernel(const uint16_t *in, const int32_t *rows, uint32_t H, uint16_t *out)
{
    pdl_wait();
    const uint4 *src = reinterpret_cast<const uint4 *>(in + (size_t)rows[blockIdx.x] * H);
    uint4 *dst = reinterpret_cast<uint4 *>(out + (size_t)blockIdx.x * H);
    for (uint32_t i = threadIdx.x; i < H / 8; i += blockDim.x) dst[i] = src[i];
}

__global__ void swiglu_kernel(const float *g, const float *u, size_t n, uint16_t *out)
{
    pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = f2bf(silu(g[i]) * u[i]);
}

} // namespace

void prep_tables(const DenseTables &t, uint32_t T, cudaStream_t s) { prep_kernel<<<1, 256, 0, s>>>(t, T); }

bool linear_takes_quant(const Linear &L, uint32_t T)
{
    return L.a8 && T > 1 && T <= kGemvMaxT && L.m.cols % 64 == 0;
}

// The GEMV's CTAs would each quantise all T input rows (IEEE divisions, serial round trips) before
// their first product: at T = 8 that was most of a dense GEMV's time (a 512-row v projection took
// as long as a 4096-row one). One small kernel does it once; the CTAs copy the rows.
cudaError_t linear_quant(const DenseTables &t, const uint16_t *in, uint32_t T, uint32_t cols, cudaStream_t s)
{
    return launch_mmq_quant(in, true, T, cols, t.xq, t.xd, s, true, true);
}

cudaError_t linear(const Linear &L, const DenseTables &t, const uint16_t *in, uint32_t T, float *out,
                   uint32_t out_stride, cudaStream_t s, bool quantised)
{
    Groups g{t.n_groups, t.expert, t.start, t.count, nullptr, 1, 1};
    if (L.mmq && T > kGemvMaxT && T <= kDenseMmqMax) {
        // the input quantised per 32 elements (the GEMV's int8 numerics), then one group of T
        // positions in tiles of 64 through the int8 tensor-core GEMM: each weight byte read once per
        // 64 positions, decoded in registers (the bf16 prefill GEMM decodes every slice per 128-row
        // tile at a fraction of the read rate: docs/gpu_engine.md)
        const TileList tl{t.n_tiles64, t.tile_group, t.tile_m0_64, (T + 63) / 64, 64};
        cudaError_t e = launch_mmq_quant(in, true, T, L.m.cols, t.xq, t.xd, s);
        if (e == cudaSuccess) e = launch_mmq(L.codec, false, L.m, t.xq, t.xd, g, tl, out, out_stride, nullptr, nullptr, s);
        return e;
    }
    if (L.gemm && T > kGemvMaxT) {
        const TileList tl{t.n_tiles, t.tile_group, t.tile_m0, (T + kPrefillTileM - 1) / kPrefillTileM, kPrefillTileM};
        return launch_prefill_gemm(L.codec, false, L.m, in, L.m.cols, g, tl, out, out_stride, false, s);
    }
    if (T > kGemvMaxT && L.codec == NF_CODEC_BF16) {
        // bf16 rows the GEMM would take but for a tail of fewer than 128 (a GDN layer's stacked qkv | z |
        // ba, 12 352 rows, in the bf16 and nvfp4 recipes): the GEMM on the whole 128-row tiles, the
        // GEMV below on the tail. The whole stack on the GEMV read all 12 352 rows once per 4 positions
        // (1.15 ms a layer at T = 512 on an H100: the nvfp4 hybrid's pp512 at 0.56x the q4q6 one's).
        // bf16 products are exact in both, so the outputs are the same dots (f32 sums in another order).
        Linear head = L, tail = L;
        head.m.rows = L.m.rows / kPrefillTileN * kPrefillTileN, tail.m.rows = L.m.rows - head.m.rows;
        tail.m.data += (size_t)head.m.rows * L.m.row_stride;
        head.gemm = head.m.rows && prefill_supported(head.m, head.m);
        if (head.gemm) {
            const cudaError_t e = linear(head, t, in, T, out, out_stride, s, quantised);
            return e == cudaSuccess ? linear(tail, t, in, T, out + head.m.rows, out_stride, s, quantised) : e;
        }
    }
    // Above kGemvMaxT (shapes neither GEMM takes: rows not a multiple of 128, e.g. a GDN layer's
    // 64-row ssm_ba) a matrix of few rows takes the positions in groups of 64, one grid row each: a
    // CTA owns 16 weight rows and loops over its group's positions, so one group of T left a 64-row
    // matrix 4 CTAs at any T (ncu, H100, pp512 of a hybrid: ssm_ba 240 us a layer). A large matrix
    // keeps one group (each group reads the whole matrix; kSplitMaxRows of bf16 rows of 4096 stay in
    // L2). Each output is the same dot whichever CTA computes it.
    constexpr uint32_t kSplitMaxRows = 1024;
    if (T > kGemvMaxT && L.m.rows <= kSplitMaxRows)
        g = Groups{t.n_tiles64, t.tile_group, t.tile_m0_64, t.count64, nullptr, 1, (T + 63) / 64};
    const bool pre = linear_takes_quant(L, T);
    if (pre && !quantised) {
        const cudaError_t e = linear_quant(t, in, T, L.m.cols, s);
        if (e != cudaSuccess) return e;
    }
    // k-quant and q8_0 weights take int8 activations (gemv_a8.cu): the f32 GEMV spends ~6
    // instructions a weight and reads these shapes at ~12 % of the DRAM rate. Programmatic dependent
    // launch: the weights' first rows are fetched while the predecessor (the norm) still runs.
    const GemvLaunch opt{NextMat{nullptr, 0}, true, false, L.a8 && T <= kGemvMaxT, true,
                         pre ? t.xq : nullptr, pre ? t.xd : nullptr};
    return launch_gemv_ex(L.codec, false, L.m, in, true, L.m.cols, g, out, out_stride, g.max_groups > 1 ? 64 : T, opt, s);
}

cudaError_t embed(const Linear &E, const Batch &b, uint32_t T, uint32_t H, float *x, cudaStream_t s)
{
    return dispatch_codec(E.codec, [&](auto c) {
        embed_kernel<decltype(c)><<<T, 128, 0, s>>>(E.m, b, H, x);
        return cudaGetLastError();
    });
}

void add_rmsnorm(float *x, const float *delta_f32, const uint16_t *delta_bf16, const float *w, uint32_t T,
                 uint32_t H, float eps, uint16_t *xn, cudaStream_t s, uint32_t xn_stride, float *xf)
{
    launch_pdl(add_rmsnorm_kernel, dim3(T), dim3(kNormThreads), 0, true, s, x, delta_f32, delta_bf16, w, H, eps, xn,
               xn_stride ? xn_stride : H, xf);
}

void qkv_rope_store(const QkvArgs &a, const Batch &b, uint32_t T, cudaStream_t s)
{
    launch_pdl(qkv_kernel, dim3(T, a.heads + a.kv_heads), dim3(32), 0, true, s, a, b);
}

// H % 8 == 0 (create checks): rows move as 16-byte pieces.
void gather_rows(const uint16_t *in, const int32_t *rows, uint32_t n, uint32_t H, uint16_t *out, cudaStream_t s)
{
    launch_pdl(gather_kernel, dim3(n), dim3(128), 0, true, s, in, rows, H, out);
}

void rope_table(const float *src, uint32_t ctx, uint32_t half, float2 *tab, cudaStream_t s)
{
    rope_table_kernel<<<256, 256, 0, s>>>(src, ctx, half, tab);
}

void swiglu(const float *g, const float *u, size_t n, uint16_t *out, cudaStream_t s)
{
    const size_t blocks = (n + 255) / 256;
    launch_pdl(swiglu_kernel, dim3((unsigned)(blocks < 4096 ? blocks : 4096)), dim3(256), 0, true, s, g, u, n, out);
}

} // namespace dec
} // namespace nf

// The Gated DeltaNet chunked form (gdn.cuh, gdn_common.cuh): the prefill pieces of chunk_from tokens or
// more; gdn.cu launches it beside the per-token kernels.
//
// Within a chunk of N tokens the per-token steps are a linear recurrence whose solution is closed
// (the WY / UT form; src/backend/cpu/gdn.c chunk_step writes the same algebra): with G_i the
// cumulative log decay of the chunk's tokens 0 .. i, S the state before the chunk,
//   a_im = -beta_i (k_i . k_m) exp(G_i - G_m) (m < i),    T = (I - a)^-1 (unit lower triangular)
//   W = T diag(beta exp(G)) K,   U = T diag(beta) V                     ([N][dk], [N][dv]: no S in them)
//   d = U - W S                                          (the per-token steps' deltas beta (v - S_i^T k))
//   o_i  = exp(G_i) S^T q_i + sum_{m <= i} (q_i . k_m) exp(G_i - G_m) d_m
//   S'   = exp(G_N) S + sum_m exp(G_N - G_m) k_m d_m^T
// Every exponent is a G_i - G_m with m <= i or a G_i itself: <= 0, nothing overflows.
//
// Two launches. Only d, o and S' depend on S, so everything else runs for every chunk of every
// sequence at once: the prep pass, one CTA per (chunk, v head), forms k . k and q . k, solves the
// triangular system for W and U (a thread a column: T applied by forward substitution, the N rows in
// registers), and leaves W and the q . k weights (Aqk) in the workspace and U in v's place. The state
// pass, one CTA per (kChunkCols columns of S, v head, sequence), keeps its columns of S in registers
// (with a copy in shared memory for the products) through the sequence's chunks (read once and written
// once, as the per-token kernel does) and per chunk does only the S products (W S, Q S), d, the
// outputs and the state update: no serial substitution between one chunk's state and the next. The state pass's CTAs of a head recompute q's
// and k's norms (cheap), which buys dv / kChunkCols times the CTAs of one per head (Qwen3.5 at S = 1:
// 128 CTAs for 132 SMs instead of 32) with no exchange between them.
//
// The state pass's products on tf32 tensor cores at f32's accuracy (3xTF32, below): the state and the
// references are f32, and tf32 alone would round k, q, S to 11 bits. In the earlier single-pass kernel
// both f32-accurate tensor-core forms were measured no faster (bf16x3 1.18x slower, 3xTF32 1.015x at
// one 512-token sequence: docs/perf/hybrid_h200_2026-12-07d.md): a chunk's dependent chain (the
// substitution), not its products, set the time. With the chain split off, 3xTF32 took the state pass
// from f32 CUDA cores' 305 to 257 us a 512-token layer (H100, docs/perf/hybrid_h100_2026-12-07e.md).
// The prep pass's k . k and q . k take the same tiles (253 against 257 us there, session 14's
// hybrid_h100_2026-12-07f.md); its forward substitution stays f32 on CUDA cores.
//
// N = 32, not transformers' 64: the within-chunk products cost O(N) per token and the state products
// O(1), so the smaller chunk is less arithmetic, and the substitution keeps a column's N rows in
// registers.
#include "gdn_common.cuh"

namespace nf {
namespace dec {

namespace {

constexpr int kChunk = (int)kGdnChunk, kChunkCols = 32, kChunkThreads = 256;
// Row strides: Qt / Kt / Akk / Aqk rows float4-aligned (Aqk's 4 banks apart); St's and R's 8 banks
// apart (a B fragment's 4 k rows x 8 n columns meet 32 banks).
constexpr int kQkStride = kChunk + 4, kSStride = kChunkCols + 8;
static_assert(kChunk == 32 && kChunkCols == kChunk, "a lane a token in the gate scan; one 2x2 tiling for A and S");
static_assert(kChunkThreads == 256, "8 warps: the row loaders' and the 16 x 16 tilings' split");

// ---- tf32 tensor cores at f32's accuracy (3xTF32), for both passes' products ----
// mma.m16n8k8 (fragments, g = lane / 4, t = lane % 4: A a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8,
// t + 4); B b0 (k = t, n = g), b1 (t + 4, g); C c0 (g, 2t), c1 (g, 2t + 1), c2 (g + 8, 2t), c3 (g + 8,
// 2t + 1)). Each f32 operand is split into two tf32 values, big (x rounded to 11 significant bits by an
// integer add and mask: no cvt, a quarter-rate op on sm_90) and small (x - big, exact, cut to 11 bits),
// |x - big - small| <= 2^-21 |x|; a product is big big + big small + small big, small small (<= 2^-22
// |a b|) dropped, accumulated in f32: each term within ~3 2^-21 of |a b|, against f32 FMA's 2^-24 |a b|
// rounding, so test_gdn_cuda's bounds hold as argued there. Used here only.
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2])
{
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void tf32_split(float x, uint32_t &big, uint32_t &small)
{
    big = (__float_as_uint(x) + 0x1000u) & 0xFFFFE000u;
    small = __float_as_uint(x - __uint_as_float(big)) & 0xFFFFE000u;
}
// d += A B, A's four and B's two fragment values given as f32.
__device__ __forceinline__ void mma_3xtf32(float (&d)[4], const float (&a)[4], const float (&b)[2])
{
    uint32_t ab[4], as[4], bb[2], bs[2];
#pragma unroll
    for (int u = 0; u < 4; u++) tf32_split(a[u], ab[u], as[u]);
#pragma unroll
    for (int u = 0; u < 2; u++) tf32_split(b[u], bb[u], bs[u]);
    mma_tf32(d, as, bb);
    mma_tf32(d, ab, bs);
    mma_tf32(d, ab, bb);
}
// A's fragment values of the 16 x 8 tile at (m0, k0) of a row-major matrix (row stride ld).
__device__ __forceinline__ void frag_a(float (&a)[4], const float *X, int ld, int m0, int k0)
{
    const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    const float *p = X + (m0 + g) * ld + k0 + t;
    a[0] = p[0], a[1] = p[8 * ld], a[2] = p[4], a[3] = p[8 * ld + 4];
}
// B's fragment values of the 8 x 8 tile at (k0, n0) of X^T, X a row-major n x k matrix (row stride ld).
__device__ __forceinline__ void frag_a_t(float (&b)[2], const float *X, int ld, int k0, int n0)
{
    const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    b[0] = X[(n0 + g) * ld + k0 + t], b[1] = X[(n0 + g) * ld + k0 + t + 4];
}
// B's fragment values of the 8 x 8 tile at (k0, n0) of a row-major k x n matrix (row stride ld).
__device__ __forceinline__ void frag_b(float (&b)[2], const float *X, int ld, int k0, int n0)
{
    const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    b[0] = X[(k0 + t) * ld + n0 + g], b[1] = X[(k0 + t + 4) * ld + n0 + g];
}

// The workspace's floats a token and v head: W's row, then Aqk's.
template <int DK>
__device__ __forceinline__ size_t ws_at(const GdnArgs &g, int t, uint32_t h)
{
    return ((size_t)t * g.v_heads + h) * (DK + kChunk);
}

// The prep pass's shared memory, in floats: Qx, Kx [N][DK + 4] (q, k of the chunk, a token a row),
// Akk [N][kQkStride] (a_im), then G, beta, exp(G_i), exp(G_N - G_i) [N] each. The state pass's: Qx, Wx,
// Kx [N][DK + 4], St [DK][kSStride] (the CTA's columns of S), R [N][kSStride] (U, then d), Aqk
// [N][kQkStride], the gates. These are the tensor cores' operands: every fragment load below meets
// each bank once, but the state update's K^T twice.
template <int DK>
struct PrepSmem {
    static constexpr int xs = DK + 4; // Qx, Kx: a token a row
    static constexpr int qx = 0, kx = kChunk * xs, akk = 2 * kChunk * xs, gates = akk + kChunk * kQkStride;
    static constexpr int floats = gates + 4 * kChunk;
};
template <int DK>
struct ChunkSmem {
    static constexpr int xs = DK + 4;                                     // Qx, Wx, Kx: a token a row
    static constexpr int qx = 0, wx = kChunk * xs, kx = 2 * kChunk * xs, st = 3 * kChunk * xs;
    static constexpr int r = st + DK * kSStride, aqk = r + kChunk * kSStride, gates = aqk + kChunk * kQkStride;
    static constexpr int floats = gates + 4 * kChunk;
};

// Chunk `slot` of the batch (the sequences of chunk_from tokens or more, each cut into chunks of N
// from its first token, numbered in sequence order): its first token and token count, or false past
// the last. Every thread of the CTA takes part (a block-wide scan of the sequences' chunk counts).
__device__ bool chunk_of(const Batch &b, uint32_t S, uint32_t from, uint32_t slot, int &t0, int &L)
{
    __shared__ uint32_t tot[kChunkThreads / 32];
    __shared__ int at[2];
    const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (threadIdx.x == 0) at[0] = -1, at[1] = 0;
    uint32_t base = 0;
    for (uint32_t s0 = 0; s0 < S; s0 += kChunkThreads) {
        const uint32_t i = s0 + threadIdx.x;
        uint32_t n = 0;
        int f = 0, e = 0;
        if (i < S) {
            f = i ? b.last[i - 1] + 1 : 0, e = b.last[i] + 1;
            n = (uint32_t)(e - f) >= from ? (uint32_t)(e - f + kChunk - 1) / kChunk : 0;
        }
        uint32_t x = n; // inclusive scan over the warp, then over the warps' totals
        for (int o = 1; o < 32; o *= 2) {
            const uint32_t y = __shfl_up_sync(0xffffffffu, x, o);
            if (lane >= (uint32_t)o) x += y;
        }
        if (lane == 31) tot[warp] = x;
        __syncthreads();
        uint32_t pre = 0, all = 0;
        for (uint32_t w = 0; w < kChunkThreads / 32; w++) pre += w < warp ? tot[w] : 0, all += tot[w];
        const uint32_t end = base + pre + x;
        if (slot < end && slot + n >= end) at[0] = f + (int)(slot + n - end) * kChunk, at[1] = e;
        base += all;
        __syncthreads();
    }
    __syncthreads();
    t0 = at[0], L = min(kChunk, at[1] - at[0]);
    return at[0] >= 0;
}

// The chunk's tokens t0 .. t0 + L - 1 of q and k (head kh), fetched into registers (each warp 8 (token,
// q or k) rows; warp 0's lane i token i's raw gate inputs), then staged: q and k l2-normalised as the
// per-token kernel does them into Qt, Kt (rows L .. N - 1 zero), and the gates (g = 0 and beta = 0
// past L: those rows' d is zero and G stays G_{L-1}, so a ragged last chunk needs no other case). Two
// steps so that the state pass has the next chunk's loads in flight while it works on this one.
template <int DK>
struct QkIn {
    static constexpr int E = (DK + 31) / 32, P = 2 * kChunk / (kChunkThreads / 32);
    float x[P][E];
    float a, b;
};
template <int DK>
__device__ __forceinline__ void qk_fetch(const GdnArgs &g, QkIn<DK> &in, int t0, int L, uint32_t h, uint32_t kh, uint32_t C)
{
    using I = QkIn<DK>;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const uint32_t Kd = g.k_heads * DK;
#pragma unroll
    for (int u = 0; u < I::P; u++) {
        const int p = warp + u * (kChunkThreads / 32), i = p / 2;
        const float *src = g.row + (size_t)(t0 + i) * g.stride + (p % 2 ? Kd : 0) + kh * DK;
#pragma unroll
        for (int m = 0; m < I::E; m++) in.x[u][m] = i < L && lane + 32 * m < DK ? src[lane + 32 * m] : 0.0f;
    }
    in.a = in.b = 0;
    if (warp == 0 && lane < L) {
        const float *row = g.row + (size_t)(t0 + lane) * g.stride + C + g.v_heads * g.dv;
        in.a = row[g.v_heads + h], in.b = row[h];
    }
}
// A token a row (stride DK + 4), as both passes' tensor-core products read them.
template <int DK>
__device__ __forceinline__ void qk_stage(const QkIn<DK> &in, float *Qt, float *Kt, float *gt, int L, float A, float dtb)
{
    using I = QkIn<DK>;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
    for (int u = 0; u < I::P; u++) {
        const int p = warp + u * (kChunkThreads / 32), i = p / 2, isk = p % 2;
        float ss = 0;
#pragma unroll
        for (int m = 0; m < I::E; m++) ss += in.x[u][m] * in.x[u][m];
        const float inv = 1.0f / sqrtf(warp_sum(ss) + 1e-6f), sc = isk ? inv : inv / sqrtf((float)DK);
        float *dst = isk ? Kt : Qt;
#pragma unroll
        for (int m = 0; m < I::E; m++)
            if (lane + 32 * m < DK) dst[i * (DK + 4) + lane + 32 * m] = in.x[u][m] * sc;
    }
    if (warp == 0) { // lane i: token i's gate, then the inclusive scan of g (G_i)
        float gg = 0, beta = 0;
        if (lane < L) gg = A * softplus(in.a + dtb), beta = 1.0f / (1.0f + expf(-in.b));
        for (int o = 1; o < 32; o *= 2) {
            const float y = __shfl_up_sync(0xffffffffu, gg, o);
            if (lane >= o) gg += y;
        }
        const float GN = __shfl_sync(0xffffffffu, gg, 31);
        gt[lane] = gg, gt[kChunk + lane] = beta, gt[2 * kChunk + lane] = expf(gg), gt[3 * kChunk + lane] = expf(GN - gg);
    }
}

// Prep, products: warp w owns the 16 x 8 tile (tokens i = 16 (w / 4) + .., m = 8 (w % 4) + ..) of
// K K^T and of Q K^T (one pass over dk, 3xTF32): a into Akk, (q_i . k_m) exp(G_i - G_m) (zero above
// the diagonal) into the workspace's Aqk rows.
template <int DK>
__device__ __forceinline__ void prep_products(const GdnArgs &g, float *sm, int t0, int L, uint32_t h)
{
    using M = PrepSmem<DK>;
    const int warp = threadIdx.x / 32, gq = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    const int m0 = 16 * (warp / 4), n0 = 8 * (warp % 4);
    const float *gt = sm + M::gates;
    float kk[4] = {}, qk[4] = {};
#pragma unroll 4
    for (int k0 = 0; k0 < DK; k0 += 8) {
        float ak[4], aq[4], b[2];
        frag_a(ak, sm + M::kx, M::xs, m0, k0);
        frag_a(aq, sm + M::qx, M::xs, m0, k0);
        frag_a_t(b, sm + M::kx, M::xs, k0, n0); // B = K^T: B(a, m) = K[m][a]
        mma_3xtf32(kk, ak, b);
        mma_3xtf32(qk, aq, b);
    }
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const int i = m0 + gq + 8 * (u / 2), c = n0 + 2 * t + u % 2;
        const float d = c <= i ? expf(gt[i] - gt[c]) : 0.0f; // the decay from token c to token i
        sm[M::akk + i * kQkStride + c] = c < i ? -gt[kChunk + i] * kk[u] * d : 0.0f;
        qk[u] *= d;
    }
#pragma unroll
    for (int u = 0; u < 4; u += 2) {
        const int i = m0 + gq + 8 * (u / 2);
        if (i < L) *(float2 *)(g.ws + ws_at<DK>(g, t0 + i, h) + DK + n0 + 2 * t) = make_float2(qk[u], qk[u + 1]);
    }
}

// Prep, the triangular solve: a thread a column of X = [diag(beta exp(G)) K | diag(beta) V] (dk + dv
// columns), its N rows in registers, x_i += sum_{m < i} a_im x_m row after row (T X by forward
// substitution); W's columns into the workspace, U's over v in the row.
template <int DK>
__device__ __forceinline__ void prep_solve(const GdnArgs &g, const float *sm, int t0, int L, uint32_t h)
{
    using M = PrepSmem<DK>;
    const float *Kx = sm + M::kx, *Akk = sm + M::akk, *gt = sm + M::gates;
    const uint32_t Kd = g.k_heads * DK;
    for (uint32_t col = threadIdx.x; col < DK + g.dv; col += kChunkThreads) {
        const bool w = col < DK;
        float *dst = w ? g.ws + ws_at<DK>(g, t0, h) + col : g.row + (size_t)t0 * g.stride + 2 * Kd + h * g.dv + (col - DK);
        const size_t step = w ? (size_t)g.v_heads * (DK + kChunk) : g.stride;
        float x[kChunk];
#pragma unroll
        for (int i = 0; i < kChunk; i++)
            x[i] = w ? gt[kChunk + i] * gt[2 * kChunk + i] * Kx[i * M::xs + col]
                     : (i < L ? gt[kChunk + i] * dst[i * step] : 0.0f);
#pragma unroll
        for (int i = 1; i < kChunk; i++) {
            const float *a = Akk + i * kQkStride;
#pragma unroll
            for (int m4 = 0; m4 < i; m4 += 4) {
                const float4 q = *(const float4 *)(a + m4);
                const float av[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
                for (int u = 0; u < 4; u++)
                    if (m4 + u < i) x[i] += av[u] * x[m4 + u];
            }
        }
#pragma unroll
        for (int i = 0; i < kChunk; i++)
            if (i < L) dst[i * step] = x[i];
    }
}

template <int DK>
__global__ void __launch_bounds__(kChunkThreads, 2) gdn_prep_kernel(GdnArgs g, Batch b, uint32_t C, uint32_t S, uint32_t chunk_from)
{
    using M = PrepSmem<DK>;
    extern __shared__ float4 chunk_smem[];
    float *sm = (float *)chunk_smem;
    const uint32_t h = blockIdx.y, kh = h / (g.v_heads / g.k_heads);
    int t0, L;
    const bool mine = chunk_of(b, S, chunk_from, blockIdx.x, t0, L);
    const float A = -expf(g.a_log[h]), dtb = g.dt_bias[h];
    pdl_wait();
    if (!mine) return;
    QkIn<DK> in;
    qk_fetch<DK>(g, in, t0, L, h, kh, C);
    qk_stage<DK>(in, sm + M::qx, sm + M::kx, sm + M::gates, L, A, dtb);
    __syncthreads();
    prep_products<DK>(g, sm, t0, L, h);
    __syncthreads();
    prep_solve<DK>(g, sm, t0, L, h);
}

// State pass, what it reads besides q, k and the gates: U's columns j0 .. j0 + kChunkCols - 1 (for R),
// W's rows (each warp N / 8 of them) and Aqk's rows (zero past L); fetched, then staged, as q and k.
template <int DK>
struct WuIn {
    static constexpr int E = (DK + 31) / 32, P = kChunk / (kChunkThreads / 32), U = kChunk * kChunkCols / kChunkThreads;
    float w[P][E], u[U], aqk[U];
};
template <int DK>
__device__ __forceinline__ void wu_fetch(const GdnArgs &g, WuIn<DK> &in, int t0, int L, uint32_t h, uint32_t j0)
{
    using I = WuIn<DK>;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
#pragma unroll
    for (int u = 0; u < I::P; u++) {
        const int i = warp + u * (kChunkThreads / 32);
        const float *src = g.ws + ws_at<DK>(g, t0 + i, h);
#pragma unroll
        for (int m = 0; m < I::E; m++) in.w[u][m] = i < L && lane + 32 * m < DK ? src[lane + 32 * m] : 0.0f;
    }
    const uint32_t Kd = g.k_heads * DK;
#pragma unroll
    for (int u = 0; u < I::U; u++) {
        const int e = tid + u * kChunkThreads, i = e / kChunkCols, c = e % kChunkCols;
        const uint32_t j = j0 + c;
        in.u[u] = i < L && j < g.dv ? g.row[(size_t)(t0 + i) * g.stride + 2 * Kd + h * g.dv + j] : 0.0f;
        in.aqk[u] = i < L ? g.ws[ws_at<DK>(g, t0 + i, h) + DK + c] : 0.0f;
    }
}
template <int DK>
__device__ __forceinline__ void wu_stage(const WuIn<DK> &in, float *sm)
{
    using I = WuIn<DK>;
    using M = ChunkSmem<DK>;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
#pragma unroll
    for (int u = 0; u < I::U; u++) {
        const int e = tid + u * kChunkThreads, i = e / kChunkCols, c = e % kChunkCols;
        sm[M::r + i * kSStride + c] = in.u[u], sm[M::aqk + i * kQkStride + c] = in.aqk[u];
    }
#pragma unroll
    for (int u = 0; u < I::P; u++) {
        const int i = warp + u * (kChunkThreads / 32);
#pragma unroll
        for (int m = 0; m < I::E; m++)
            if (lane + 32 * m < DK) sm[M::wx + i * M::xs + lane + 32 * m] = in.w[u][m];
    }
}

// The CTA's columns of S as C fragments in registers: DK / 16 x 4 tiles of 16 x 8, warp w owning tiles
// w, w + 8, ... (tile q: rows 16 (q / 4) .., columns 8 (q % 4) ..).
template <int DK>
struct SFrag {
    static constexpr int tiles = DK / 16 * 4, per = (tiles + 7) / 8;
};

// Products: warp w owns the 16 x 8 tile (tokens 16 (w / 4) + .., columns 8 (w % 4) + ..) of W S and of
// Q S (one pass over dk): d = U - W S over R, and o's state part exp(G_i) (S^T q_i) returned (C
// fragment order).
template <int DK>
__device__ __forceinline__ void chunk_products(float *sm, float (&o)[4])
{
    using M = ChunkSmem<DK>;
    const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    const int m0 = 16 * (warp / 4), n0 = 8 * (warp % 4);
    float ws[4] = {};
#pragma unroll 4
    for (int k0 = 0; k0 < DK; k0 += 8) {
        float aw[4], aq[4], b[2];
        frag_b(b, sm + M::st, kSStride, k0, n0);
        frag_a(aw, sm + M::wx, M::xs, m0, k0);
        frag_a(aq, sm + M::qx, M::xs, m0, k0);
        mma_3xtf32(ws, aw, b);
        mma_3xtf32(o, aq, b);
    }
    float *R = sm + M::r;
    const float *gt = sm + M::gates;
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const int i = m0 + g + 8 * (u / 2), c = n0 + 2 * t + u % 2;
        R[i * kSStride + c] -= ws[u];
        o[u] *= gt[2 * kChunk + i];
    }
}

// The outputs (o += Aqk d over the tokens m <= i: the same tile a warp) into v's place in the row; then
// the CTA's columns of S carried over the chunk in registers (SFrag): S = exp(G_N) S + K^T (d exp(G_N -
// G_m)).
template <int DK>
__device__ __forceinline__ void chunk_finish(const GdnArgs &g, float *sm, float (&o)[4], float (&s)[SFrag<DK>::per][4],
                                             int t0, int L, uint32_t h, uint32_t j0)
{
    using M = ChunkSmem<DK>;
    const int warp = threadIdx.x / 32, gq = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    const int m0 = 16 * (warp / 4), n0 = 8 * (warp % 4);
    const float *R = sm + M::r, *gt = sm + M::gates;
    for (int k0 = 0; k0 < m0 + 16; k0 += 8) { // Aqk is zero above the diagonal
        float a[4], b[2];
        frag_a(a, sm + M::aqk, kQkStride, m0, k0);
        frag_b(b, R, kSStride, k0, n0);
        mma_3xtf32(o, a, b);
    }
    const uint32_t Kd = g.k_heads * DK;
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const int i = m0 + gq + 8 * (u / 2);
        const uint32_t j = j0 + n0 + 2 * t + u % 2;
        if (i < L && j < g.dv) g.row[(size_t)(t0 + i) * g.stride + 2 * Kd + h * g.dv + j] = o[u];
    }
    const float eN = gt[2 * kChunk + kChunk - 1]; // exp(G_N): padded rows add g = 0
    using F = SFrag<DK>;
#pragma unroll
    for (int p = 0; p < F::per; p++)
#pragma unroll
        for (int u = 0; u < 4; u++) s[p][u] *= eN;
    const float *K = sm + M::kx; // A = K^T: A(a, m) = K[m][a]
#pragma unroll
    for (int k0 = 0; k0 < kChunk; k0 += 8) {
        const float e0 = gt[3 * kChunk + k0 + t], e1 = gt[3 * kChunk + k0 + t + 4];
#pragma unroll
        for (int p = 0; p < F::per; p++) {
            const int q = warp + 8 * p, a0 = 16 * (q / 4), c0 = 8 * (q % 4);
            if (q >= F::tiles) break;
            float a[4], b[2];
            a[0] = K[(k0 + t) * M::xs + a0 + gq], a[1] = K[(k0 + t) * M::xs + a0 + gq + 8];
            a[2] = K[(k0 + t + 4) * M::xs + a0 + gq], a[3] = K[(k0 + t + 4) * M::xs + a0 + gq + 8];
            frag_b(b, R, kSStride, k0, c0);
            b[0] *= e0, b[1] *= e1;
            mma_3xtf32(s[p], a, b);
        }
    }
}

// S's fragments to St for the next chunk's products, and back.
template <int DK>
__device__ __forceinline__ void s_move(float *St, float (&s)[SFrag<DK>::per][4], bool store)
{
    const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    using F = SFrag<DK>;
#pragma unroll
    for (int p = 0; p < F::per; p++) {
        const int q = warp + 8 * p;
        if (q >= F::tiles) break;
#pragma unroll
        for (int u = 0; u < 4; u++) {
            float *e = St + (16 * (q / 4) + g + 8 * (u / 2)) * kSStride + 8 * (q % 4) + 2 * t + u % 2;
            if (store) *e = s[p][u];
            else s[p][u] = *e;
        }
    }
}

template <int DK>
__global__ void __launch_bounds__(kChunkThreads, 2) gdn_chunk_kernel(GdnArgs g, Batch b, uint32_t C, uint32_t chunk_from)
{
    using M = ChunkSmem<DK>;
    extern __shared__ float4 chunk_smem[];
    float *sm = (float *)chunk_smem;
    const uint32_t h = blockIdx.y, i = blockIdx.z, j0 = blockIdx.x * kChunkCols, dv = g.dv;
    const uint32_t kh = h / (g.v_heads / g.k_heads);
    const SeqSpan sp = seq_span(b, i);
    if ((uint32_t)(sp.t1 - sp.t0) < chunk_from) { // the per-token kernel's
        pdl_wait();
        return;
    }
    float *S = g.state + (size_t)b.slot[i] * g.slot_floats + (size_t)(g.K - 1) * C + (size_t)h * DK * dv;
    for (int e = threadIdx.x; e < DK * kChunkCols; e += kChunkThreads) {
        const uint32_t a = e / kChunkCols, j = j0 + e % kChunkCols;
        sm[M::st + a * kSStride + e % kChunkCols] = sp.fresh || j >= dv ? 0.0f : S[(size_t)a * dv + j];
    }
    const float A = -expf(g.a_log[h]), dtb = g.dt_bias[h];
    pdl_wait();
    QkIn<DK> qk;
    WuIn<DK> wu;
    qk_fetch<DK>(g, qk, sp.t0, min(kChunk, sp.t1 - sp.t0), h, kh, C);
    wu_fetch<DK>(g, wu, sp.t0, min(kChunk, sp.t1 - sp.t0), h, j0);
    __syncthreads();
    float s[SFrag<DK>::per][4];
    s_move<DK>(sm + M::st, s, false);
    for (int t0 = sp.t0; t0 < sp.t1; t0 += kChunk) {
        const int L = min(kChunk, sp.t1 - t0);
        qk_stage<DK>(qk, sm + M::qx, sm + M::kx, sm + M::gates, L, A, dtb);
        wu_stage<DK>(wu, sm);
        __syncthreads();
        if (t0 + kChunk < sp.t1) { // the next chunk's loads in flight through this one's products
            const int Ln = min(kChunk, sp.t1 - t0 - kChunk);
            qk_fetch<DK>(g, qk, t0 + kChunk, Ln, h, kh, C);
            wu_fetch<DK>(g, wu, t0 + kChunk, Ln, h, j0);
        }
        float o[4] = {};
        chunk_products<DK>(sm, o);
        __syncthreads();
        chunk_finish<DK>(g, sm, o, s, t0, L, h, j0);
        s_move<DK>(sm + M::st, s, true);
        __syncthreads();
    }
    for (int e = threadIdx.x; e < DK * kChunkCols; e += kChunkThreads) {
        const uint32_t a = e / kChunkCols, j = j0 + e % kChunkCols;
        if (j < dv) S[(size_t)a * dv + j] = sm[M::st + a * kSStride + e % kChunkCols];
    }
}

template <int DK>
cudaError_t launch_chunked(const GdnArgs &g, const Batch &b, uint32_t T, uint32_t S, uint32_t C, uint32_t chunk_from,
                           cudaStream_t s)
{
    const size_t prep = PrepSmem<DK>::floats * sizeof(float), smem = ChunkSmem<DK>::floats * sizeof(float);
    cudaError_t e = cudaFuncSetAttribute(gdn_prep_kernel<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)prep);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(gdn_chunk_kernel<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    // the chunks: at most T / N whole ones plus a partial one a long sequence, of which there are at
    // most T / chunk_from
    const uint32_t long_seqs = T / chunk_from < S ? T / chunk_from : S, slots = (T + kChunk - 1) / kChunk + long_seqs;
    if (e == cudaSuccess)
        e = launch_pdl(gdn_prep_kernel<DK>, dim3(slots, g.v_heads), dim3(kChunkThreads), prep, true, s, g, b, C, S, chunk_from);
    const dim3 grid((g.dv + kChunkCols - 1) / kChunkCols, g.v_heads, S);
    if (e == cudaSuccess) e = launch_pdl(gdn_chunk_kernel<DK>, grid, dim3(kChunkThreads), smem, true, s, g, b, C, chunk_from);
    return e;
}

} // namespace

cudaError_t gdn_chunked(const GdnArgs &g, const Batch &b, uint32_t T, uint32_t S, uint32_t C, uint32_t chunk_from,
                        cudaStream_t s)
{
    return g.dk == 16   ? launch_chunked<16>(g, b, T, S, C, chunk_from, s)
           : g.dk == 32 ? launch_chunked<32>(g, b, T, S, C, chunk_from, s)
           : g.dk == 64 ? launch_chunked<64>(g, b, T, S, C, chunk_from, s)
                        : launch_chunked<128>(g, b, T, S, C, chunk_from, s);
}

} // namespace dec
} // namespace nf

// Gated DeltaNet kernels (gdn.cuh): the conv, the per-token recurrence, the gated output norm, the
// launches of a layer; and the gated attention's sigmoid gate. The chunked form is gdn_chunk.cu.
#include "gdn_common.cuh"

namespace nf {
namespace dec {

namespace {

constexpr int kConvThreads = 128, kConvBatch = 8;
constexpr uint32_t kColsPerWarp = 8, kLanesPerCol = 4; // the recurrence's warp: 8 columns x 4 row lanes

// One thread per (channel, sequence) of the sequences below chunk_from tokens (decode steps,
// verifications, short pieces): the sequence's tokens in order through a window of the last K inputs in
// registers (causal_conv1d_update's arithmetic at every token), the conv output (after SiLU) in place;
// the window's last K - 1 inputs go back to the slot.
__global__ void __launch_bounds__(kConvThreads) gdn_conv_kernel(GdnArgs g, Batch b, uint32_t C, uint32_t chunk_from)
{
    constexpr uint32_t K = kGdnConvK;
    const uint32_t ch = blockIdx.x * kConvThreads + threadIdx.x, i = blockIdx.y;
    const SeqSpan sp = seq_span(b, i);
    float w[K], win[K];
    if (ch < C) {
#pragma unroll
        for (uint32_t j = 0; j < K; j++) w[j] = g.conv_w[(size_t)ch * K + j];
    }
    float *cs = g.state + (size_t)b.slot[i] * g.slot_floats; // [K-1][C]
    pdl_wait();
    if (ch >= C || (uint32_t)(sp.t1 - sp.t0) >= chunk_from) return;
#pragma unroll
    for (uint32_t j = 0; j + 1 < K; j++) win[j] = sp.fresh ? 0.0f : cs[(size_t)j * C + ch];
    // kConvBatch tokens' inputs loaded together, then stepped through: one memory round trip per batch
    // of tokens rather than per token
    for (int t0 = sp.t0; t0 < sp.t1; t0 += kConvBatch) {
        float in[kConvBatch];
#pragma unroll
        for (int u = 0; u < kConvBatch; u++)
            if (t0 + u < sp.t1) in[u] = g.row[(size_t)(t0 + u) * g.stride + ch];
#pragma unroll
        for (int u = 0; u < kConvBatch; u++) {
            if (t0 + u >= sp.t1) break;
            win[K - 1] = in[u];
            float acc = 0;
#pragma unroll
            for (uint32_t j = 0; j < K; j++) acc += w[j] * win[j];
            g.row[(size_t)(t0 + u) * g.stride + ch] = silu(acc);
#pragma unroll
            for (uint32_t j = 0; j + 1 < K; j++) win[j] = win[j + 1];
        }
    }
#pragma unroll
    for (uint32_t j = 0; j + 1 < K; j++) cs[(size_t)j * C + ch] = win[j];
}

// The same for the sequences of chunk_from tokens or more, a CTA per (32 channels, sequence): tiles of
// kConvTile tokens, each loaded by all 8 warps at once (a lane a channel, a warp every 8th token) into
// a shared window with the K - 1 inputs before the tile, the next tile's loads issued before this
// one's outputs: a round trip per 64 tokens instead of per 8 (the per-token form above walked a
// 512-token prompt in 64 dependent batches). The same arithmetic, so the same bits.
constexpr int kConvTile = 64, kConvTileThreads = 256, kConvTileCh = 32;
__global__ void __launch_bounds__(kConvTileThreads) gdn_conv_tiled_kernel(GdnArgs g, Batch b, uint32_t C, uint32_t chunk_from)
{
    constexpr int K = (int)kGdnConvK, W = kConvTileThreads / 32, R = kConvTile / W; // R tokens a thread
    __shared__ float win[kConvTile + K - 1][kConvTileCh]; // row r: the tile's token r - (K - 1)
    const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32, ch = blockIdx.x * kConvTileCh + lane;
    const SeqSpan sp = seq_span(b, blockIdx.y);
    const bool live = ch < C;
    float w[K];
#pragma unroll
    for (int j = 0; j < K; j++) w[j] = live ? g.conv_w[(size_t)ch * K + j] : 0.0f;
    float *cs = g.state + (size_t)b.slot[blockIdx.y] * g.slot_floats; // [K-1][C]
    pdl_wait();
    if ((uint32_t)(sp.t1 - sp.t0) < chunk_from) return;
    if (warp == 0)
#pragma unroll
        for (int j = 0; j + 1 < K; j++) win[j][lane] = sp.fresh || !live ? 0.0f : cs[(size_t)j * C + ch];
    float in[R];
#pragma unroll
    for (int u = 0; u < R; u++) {
        const int t = sp.t0 + (int)warp + W * u;
        in[u] = live && t < sp.t1 ? g.row[(size_t)t * g.stride + ch] : 0.0f;
    }
    for (int t0 = sp.t0; t0 < sp.t1; t0 += kConvTile) {
#pragma unroll
        for (int u = 0; u < R; u++) win[K - 1 + warp + W * u][lane] = in[u];
        __syncthreads();
        const bool more = t0 + kConvTile < sp.t1;
#pragma unroll
        for (int u = 0; u < R; u++) {
            const int t = t0 + kConvTile + (int)warp + W * u;
            if (more) in[u] = live && t < sp.t1 ? g.row[(size_t)t * g.stride + ch] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < R; u++) {
            const int r = (int)warp + W * u, t = t0 + r;
            float acc = 0;
#pragma unroll
            for (int j = 0; j < K; j++) acc += w[j] * win[r + j][lane];
            if (live && t < sp.t1) g.row[(size_t)t * g.stride + ch] = silu(acc);
        }
        __syncthreads();
        // the K - 1 inputs before the next tile, or the window left in the slot after the last one
        const int n = min(kConvTile, sp.t1 - t0);
        if (warp == 0)
#pragma unroll
            for (int j = 0; j + 1 < K; j++) {
                const float v = win[n + j][lane];
                if (more) win[j][lane] = v;
                else if (live) cs[(size_t)j * C + ch] = v;
            }
        __syncthreads();
    }
}

constexpr int kAcc = 4; // the recurrence's partial sums per lane (R = dk / 4 >= 4 rows: dk >= 16)
__device__ __forceinline__ float acc_sum(const float (&p)[kAcc]) { return (p[0] + p[1]) + (p[2] + p[3]); }

// Sum over the 4 row lanes of a column (lanes 4c .. 4c + 3).
__device__ __forceinline__ float col_sum(float v)
{
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// What a lane of the recurrence reads of one token: its rows of q and k (raw: the conv's output), its
// column's v, the head's b and a.
template <int R>
struct TokIn {
    float q[R], k[R], v, b, a;
};
template <int DK, int R>
__device__ __forceinline__ void tok_load(const GdnArgs &g, int t, uint32_t kh, uint32_t h, uint32_t j, uint32_t r,
                                         bool col, uint32_t C, TokIn<R> &in)
{
    const float *row = g.row + (size_t)t * g.stride;
    const uint32_t Kd = g.k_heads * DK, Vd = g.v_heads * g.dv;
#pragma unroll
    for (int m = 0; m < R; m++) in.q[m] = row[kh * DK + r + 4 * m], in.k[m] = row[Kd + kh * DK + r + 4 * m];
    in.v = col ? row[2 * Kd + h * g.dv + j] : 0.0f;
    in.b = row[C + Vd + h], in.a = row[C + Vd + g.v_heads + h];
}

// One warp per (8 columns, v head, sequence): lane = 4 c + r owns column j = 8 blockIdx.x + c and rows
// r, r + 4, ... of S (DK / 4 of them, in registers for the whole sequence). Per token: q and k
// l2-normalised (the sums over the 4 row lanes), the decay and beta, then the step; o_j replaces v_j
// in the row (read by this column's lanes only, before). The column's S is loaded before the
// grid-dependency wait: the previous forward wrote it, long done.
// A sequence of chunk_from tokens or more is the chunked kernel's: its warps here only wait (every CTA
// of a launch waits, so the next kernel's wait still covers this one's predecessor).
template <int DK>
__global__ void __launch_bounds__(32) gdn_rec_kernel(GdnArgs g, Batch b, uint32_t C, uint32_t chunk_from)
{
    constexpr int R = DK / (int)kLanesPerCol;
    const uint32_t lane = threadIdx.x, c = lane / kLanesPerCol, r = lane % kLanesPerCol;
    const uint32_t h = blockIdx.y, i = blockIdx.z, dv = g.dv, j = blockIdx.x * kColsPerWarp + c;
    const uint32_t Hv = g.v_heads, kh = h / (Hv / g.k_heads), Kd = g.k_heads * DK;
    const bool col = j < dv;
    const SeqSpan sp = seq_span(b, i);
    if ((uint32_t)(sp.t1 - sp.t0) >= chunk_from) {
        pdl_wait();
        return;
    }
    float *S = g.state + (size_t)b.slot[i] * g.slot_floats + (size_t)(g.K - 1) * C + (size_t)h * DK * dv;
    float s[R];
#pragma unroll
    for (int m = 0; m < R; m++) s[m] = sp.fresh || !col ? 0.0f : S[(size_t)(r + 4 * m) * dv + j];
    const float A = -expf(g.a_log[h]), dtb = g.dt_bias[h], qdiv = sqrtf((float)DK);
    pdl_wait();
    // token t's inputs are in registers while t + 1's load (the step's latency is the loads', not the
    // arithmetic's: a prefill chunk's tokens go through one after another)
    TokIn<R> cur, nxt;
    if (sp.t0 < sp.t1) tok_load<DK, R>(g, sp.t0, kh, h, j, r, col, C, cur);
    for (int t = sp.t0; t < sp.t1; t++) {
        if (t + 1 < sp.t1) tok_load<DK, R>(g, t + 1, kh, h, j, r, col, C, nxt);
        // each sum over the lane's rows in kAcc interleaved partial sums: chains of R / kAcc dependent
        // FMAs instead of R (a token's step is a chain of such sums; few warps share an SM)
        float sq[kAcc] = {}, sk[kAcc] = {}, kv[kAcc] = {}, o[kAcc] = {};
#pragma unroll
        for (int m = 0; m < R; m++) sq[m % kAcc] += cur.q[m] * cur.q[m], sk[m % kAcc] += cur.k[m] * cur.k[m];
        const float iq = 1.0f / sqrtf(col_sum(acc_sum(sq)) + 1e-6f), ik = 1.0f / sqrtf(col_sum(acc_sum(sk)) + 1e-6f);
        const float decay = expf(A * softplus(cur.a + dtb)), beta = 1.0f / (1.0f + expf(-cur.b));
#pragma unroll
        for (int m = 0; m < R; m++) {
            cur.k[m] *= ik;
            s[m] *= decay;
            kv[m % kAcc] += s[m] * cur.k[m];
        }
        const float delta = (cur.v - col_sum(acc_sum(kv))) * beta, qs = iq / qdiv;
#pragma unroll
        for (int m = 0; m < R; m++) {
            s[m] += cur.k[m] * delta;
            o[m % kAcc] += s[m] * (cur.q[m] * qs);
        }
        const float out = col_sum(acc_sum(o));
        if (col && r == 0) g.row[(size_t)t * g.stride + 2 * Kd + h * dv + j] = out;
        cur = nxt;
    }
    if (col)
#pragma unroll
        for (int m = 0; m < R; m++) S[(size_t)(r + 4 * m) * dv + j] = s[m];
}

// One warp per (token, v head): out = bf16(o * rsqrt(mean(o^2) + eps) * w * silu(z)) (RMSNormGated).
constexpr int kNormDvPer = 8; // dv <= 256
__global__ void __launch_bounds__(32) gdn_norm_kernel(GdnArgs g, uint32_t C)
{
    const uint32_t t = blockIdx.x, h = blockIdx.y, lane = threadIdx.x, dv = g.dv, Vd = g.v_heads * dv;
    float w[kNormDvPer];
#pragma unroll
    for (int m = 0; m < kNormDvPer; m++) w[m] = lane + 32 * m < dv ? g.norm[lane + 32 * m] : 0.0f;
    pdl_wait();
    const float *row = g.row + (size_t)t * g.stride;
    const float *o = row + 2 * g.k_heads * g.dk + h * dv, *z = row + C + h * dv;
    float x[kNormDvPer], ss = 0;
#pragma unroll
    for (int m = 0; m < kNormDvPer; m++) x[m] = lane + 32 * m < dv ? o[lane + 32 * m] : 0.0f;
#pragma unroll
    for (int m = 0; m < kNormDvPer; m++) ss += x[m] * x[m];
    const float inv = 1.0f / sqrtf(warp_sum(ss) / (float)dv + g.eps);
    uint16_t *out = g.out + (size_t)t * Vd + h * dv;
#pragma unroll
    for (int m = 0; m < kNormDvPer; m++)
        if (lane + 32 * m < dv) out[lane + 32 * m] = f2bf(x[m] * inv * w[m] * silu(z[lane + 32 * m]));
}

__global__ void attn_gate_kernel(uint16_t *att, const float *gate, uint32_t stride, uint32_t T, uint32_t width)
{
    pdl_wait();
    const size_t n = (size_t)T * width;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        const size_t t = e / width, i = e % width;
        att[e] = f2bf(bf2f(att[e]) / (1.0f + expf(-gate[t * stride + i])));
    }
}

template <int DK>
cudaError_t launch_rec(const GdnArgs &g, const Batch &b, uint32_t S, uint32_t C, uint32_t chunk_from, cudaStream_t s)
{
    const dim3 grid((g.dv + kColsPerWarp - 1) / kColsPerWarp, g.v_heads, S);
    return launch_pdl(gdn_rec_kernel<DK>, grid, dim3(32), 0, true, s, g, b, C, chunk_from);
}

template <int DK>
cudaError_t launch_mixers(const GdnArgs &g, const Batch &b, uint32_t T, uint32_t S, uint32_t C, uint32_t chunk_from,
                          cudaStream_t s)
{
    // the host knows T and S, not each sequence's length: a sequence can be short unless it is the only
    // one and T reaches chunk_from, and long only if the others' one token each leave it chunk_from
    // (decode steps, whatever their S, and their graphs launch the per-token kernel alone, as before)
    const bool any_long = (uint64_t)T + 1 >= (uint64_t)chunk_from + S, any_short = S > 1 || T < chunk_from;
    cudaError_t e = cudaSuccess;
    if (any_short)
        e = launch_pdl(gdn_conv_kernel, dim3((C + kConvThreads - 1) / kConvThreads, S), dim3(kConvThreads), 0, true, s, g,
                       b, C, chunk_from);
    if (e == cudaSuccess && any_long)
        e = launch_pdl(gdn_conv_tiled_kernel, dim3((C + kConvTileCh - 1) / kConvTileCh, S), dim3(kConvTileThreads), 0, true,
                       s, g, b, C, chunk_from);
    if (e == cudaSuccess && any_short) e = launch_rec<DK>(g, b, S, C, chunk_from, s);
    if (e == cudaSuccess && any_long) e = gdn_chunked(g, b, T, S, C, chunk_from, s);
    return e;
}

} // namespace

bool gdn_supported(uint32_t dk, uint32_t dv, uint32_t K)
{
    return (dk == 16 || dk == 32 || dk == 64 || dk == 128) && dv && dv <= 32 * kNormDvPer && K == kGdnConvK;
}

cudaError_t gdn_forward(const GdnArgs &g, const Batch &b, uint32_t T, uint32_t S, cudaStream_t s)
{
    return gdn_forward_split(g, b, T, S, kGdnChunkFrom, s);
}

cudaError_t gdn_forward_split(const GdnArgs &g, const Batch &b, uint32_t T, uint32_t S, uint32_t chunk_from,
                              cudaStream_t s)
{
    if (!gdn_supported(g.dk, g.dv, g.K) || !g.k_heads || g.v_heads % g.k_heads) return cudaErrorInvalidValue;
    const uint32_t C = 2 * g.k_heads * g.dk + g.v_heads * g.dv, from = chunk_from ? chunk_from : 1;
    cudaError_t e = g.dk == 16 ? launch_mixers<16>(g, b, T, S, C, from, s)
                            : g.dk == 32 ? launch_mixers<32>(g, b, T, S, C, from, s)
                            : g.dk == 64 ? launch_mixers<64>(g, b, T, S, C, from, s)
                                         : launch_mixers<128>(g, b, T, S, C, from, s);
    if (e == cudaSuccess) e = launch_pdl(gdn_norm_kernel, dim3(T, g.v_heads), dim3(32), 0, true, s, g, C);
    return e;
}

cudaError_t attn_gate(uint16_t *att, const float *gate, uint32_t stride, uint32_t T, uint32_t width, cudaStream_t s)
{
    const size_t blocks = ((size_t)T * width + 255) / 256;
    return launch_pdl(attn_gate_kernel, dim3((unsigned)(blocks < 4096 ? blocks : 4096)), dim3(256), 0, true, s, att, gate,
               stride, T, width);
}

} // namespace dec
} // namespace nf

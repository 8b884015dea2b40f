// Router (fp32 logits, softmax, top-k with ties to the lower index, optional renormalisation), the
// shared expert's sigmoid gate, and the expert-sorted work list. Nothing here leaves the device.
#include "internal.cuh"

namespace nf {

namespace {

constexpr int kRouterTokens = 8; // tokens per CTA: each router row is read once for all of them

template <typename W>
__device__ __forceinline__ float wval(const W *p, uint32_t i);
template <>
__device__ __forceinline__ float wval<float>(const float *p, uint32_t i) { return p[i]; }
template <>
__device__ __forceinline__ float wval<uint16_t>(const uint16_t *p, uint32_t i) { return bf2f(p[i]); }

// logits[t][e] = sum_h x[t][h] * W[e][h], and (row E, when present) the shared gate's pre-sigmoid.
// grid: x = blocks of 8 expert rows (one warp each), y = blocks of kRouterTokens tokens staged in
// shared memory as f32, so each router row is read once per token block and the CTAs together
// cover the whole matrix even at T = 1.
template <typename W, typename G>
__global__ void router_logits_kernel(const W *w, const G *gw, const uint16_t *x, uint32_t T, uint32_t H, uint32_t E,
                                     float *logits, float *shared_g)
{
    extern __shared__ float xs[]; // [kRouterTokens][H]
    const uint32_t t0 = blockIdx.y * kRouterTokens;
    const uint32_t nt = min((uint32_t)kRouterTokens, T - t0);
    for (uint32_t i = threadIdx.x; i < kRouterTokens * H; i += blockDim.x)
        xs[i] = i < nt * H ? bf2f(x[(uint64_t)t0 * H + i]) : 0.f; // rows past T feed discarded sums
    __syncthreads();
    const int lane = threadIdx.x % 32;
    const uint32_t e = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const uint32_t rows = E + (gw ? 1 : 0);
    if (e >= rows) return;
    float acc[kRouterTokens] = {};
#pragma unroll 4
    for (uint32_t h = lane; h < H; h += 32) {
        const float wv = e < E ? wval(w, e * H + h) : wval(gw, h);
#pragma unroll
        for (int t = 0; t < kRouterTokens; t++) acc[t] = fmaf(wv, xs[t * H + h], acc[t]);
    }
#pragma unroll
    for (int t = 0; t < kRouterTokens; t++) {
        float v = acc[t];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0 && t < (int)nt) {
            if (e < E)
                logits[(uint64_t)(t0 + t) * E + e] = v;
            else
                shared_g[t0 + t] = 1.0f / (1.0f + expf(-v));
        }
    }
}

// One warp per token: softmax over E in fp32 and the k largest logits, ties to the lower index.
__global__ void topk_kernel(const float *logits, uint32_t T, uint32_t E, uint32_t k, int norm, int32_t *ids,
                            float *wts)
{
    uint32_t t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (t >= T) return;
    const float *l = logits + (uint64_t)t * E;
    float mx = -INFINITY;
    for (uint32_t e = lane; e < E; e += 32) mx = fmaxf(mx, l[e]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.f;
    for (uint32_t e = lane; e < E; e += 32) sum += expf(l[e] - mx);
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);

    // k rounds of a warp argmax over the not-yet-taken experts (E <= 512: 16 per lane).
    uint32_t taken = 0; // bit s: expert lane + 32*s already selected
    float sel_p[16];
    int sel_e[16];
    float psum = 0.f;
    for (uint32_t j = 0; j < k; j++) {
        float best = -INFINITY;
        int bi = 0x7fffffff;
        for (uint32_t e = lane, s = 0; e < E; e += 32, s++) {
            if (taken >> s & 1) continue;
            float v = l[e];
            if (v > best || (v == best && (int)e < bi)) {
                best = v;
                bi = (int)e;
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, best, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > best || (ov == best && oi < bi)) {
                best = ov;
                bi = oi;
            }
        }
        if ((uint32_t)bi % 32 == (uint32_t)lane) {
            taken |= 1u << ((uint32_t)bi / 32);
        }
        sel_e[j] = bi;
        sel_p[j] = expf(best - mx) / sum;
        psum += sel_p[j];
    }
    if (lane == 0) {
        for (uint32_t j = 0; j < k; j++) {
            ids[(uint64_t)t * k + j] = sel_e[j];
            wts[(uint64_t)t * k + j] = norm ? sel_p[j] / psum : sel_p[j];
        }
    }
}

// One CTA: counts per expert, exclusive scan, active-expert groups, then each entry's position.
// Positions inside an expert's segment come from atomics, so their order may vary between runs;
// every kernel computes a position's row independently of its neighbours, so outputs do not.
__global__ void worklist_kernel(const int32_t *ids, uint32_t n, uint32_t E, int32_t *slot, int32_t *pos_token,
                                uint32_t k, int32_t *n_groups, int32_t *g_expert, int32_t *g_start,
                                int32_t *g_count, int32_t *shared_group, uint32_t T)
{
    __shared__ int cnt[512], cur[512];
    for (uint32_t e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) atomicAdd(&cnt[ids[i]], 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        int off = 0, g = 0;
        for (uint32_t e = 0; e < E; e++) {
            cur[e] = off;
            if (cnt[e]) {
                g_expert[g] = (int)e;
                g_start[g] = off;
                g_count[g] = cnt[e];
                g++;
            }
            off += cnt[e];
        }
        *n_groups = g;
        shared_group[0] = 1;
        shared_group[1] = 0;
        shared_group[2] = 0;
        shared_group[3] = (int)T;
    }
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
        int p = atomicAdd(&cur[ids[i]], 1);
        slot[i] = p;
        pos_token[p] = (int)(i / k);
    }
}

template <typename W>
void launch_logits_w(const W *w, const DevMat *sg, int sg_codec, const uint16_t *x, uint32_t T, uint32_t H,
                     uint32_t E, const Routing &r, cudaStream_t s)
{
    size_t smem = (size_t)kRouterTokens * H * sizeof(float);
    dim3 grid((E + 1 + 7) / 8, (T + kRouterTokens - 1) / kRouterTokens);
    if (sg && sg_codec == 0 /* NF_CODEC_F32 */) {
        auto k = router_logits_kernel<W, float>;
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        k<<<grid, 256, smem, s>>>(w, (const float *)sg->data, x, T, H, E, r.logits, r.shared_g);
    } else {
        auto k = router_logits_kernel<W, uint16_t>;
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        k<<<grid, 256, smem, s>>>(w, sg ? (const uint16_t *)sg->data : nullptr, x, T, H, E, r.logits, r.shared_g);
    }
}

} // namespace

void launch_router(const DevMat &router, int router_codec, const DevMat *shared_gate, int shared_gate_codec,
                   const uint16_t *x, uint32_t T, uint32_t H, uint32_t E, uint32_t k, int norm_topk,
                   const Routing &r, cudaStream_t s)
{
    if (router_codec == 0 /* NF_CODEC_F32 */)
        launch_logits_w((const float *)router.data, shared_gate, shared_gate_codec, x, T, H, E, r, s);
    else
        launch_logits_w((const uint16_t *)router.data, shared_gate, shared_gate_codec, x, T, H, E, r, s);
    topk_kernel<<<(T + 7) / 8, 256, 0, s>>>(r.logits, T, E, k, norm_topk, r.topk_id, r.topk_w);
}

void launch_worklist(const Routing &r, const int32_t *ids, uint32_t T, uint32_t E, uint32_t k, cudaStream_t s)
{
    worklist_kernel<<<1, 1024, 0, s>>>(ids, T * k, E, r.slot, r.pos_token, k, r.n_groups, r.g_expert,
                                       r.g_start, r.g_count, r.shared_group, T);
}

} // namespace nf

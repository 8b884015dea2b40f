// The decode attention (the split kernel, nf::dec::attention over S decode tokens) through page
// tables of 16 .. 256 positions a page: a test by default, a benchmark with --sweep.
//
// Test (label cuda): the same logical keys and values (a hash of sequence, position and element,
// written into each layout's slots on the device) laid into pools of pages of 16, 64 and 128
// positions, each sequence's pages a shuffled subset of the pool: the attention output must be the
// same bits for every page size (the kernel's summation order depends on positions only; a page
// size that moved a key to another slot or position shows at once).
//
// --sweep: qwen3-30b-a3b's attention geometry (32 q heads on 4 kv heads of 128), S decode tokens
// each at context L (keys 0 .. L - 1), S in {1, 8, 32, 64}, L in {512, 2048, 8192}, page sizes 16,
// 32, 64, 128, 256; median over 7 repetitions of the mean of 50 back-to-back launches (events),
// microseconds per launch (the 50 launches replayed as one graph), plus the bytes the keys and values take over that time (GB/s). The
// choice of NF_CUDA_PAGE_TOKENS rests on this table (docs/perf/kv_page_tokens.md).
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>

#include "backend/cuda/decoder/ops.cuh"

extern "C" {
#include "common/cuda_test_util.h"
}
#include "nf_test.h"
#include "common/need_gpu.h"

namespace {

__device__ __forceinline__ uint32_t mix32(uint32_t x)
{
    x ^= x >> 16, x *= 0x7feb352dU, x ^= x >> 15, x *= 0x846ca68bU, x ^= x >> 16;
    return x;
}

// bf16 of a value in about [-2, 2) from (seq, pos, element, which)
__device__ __forceinline__ uint16_t val(uint32_t s, uint32_t p, uint32_t i, uint32_t w)
{
    const uint32_t h = mix32(s * 0x9E3779B9U ^ mix32(p * 0x85EBCA6BU ^ mix32(i * 2 + w)));
    const float f = ((float)(h >> 8) / 16777216.0f) * 4.0f - 2.0f;
    return (uint16_t)(__float_as_uint(f) >> 16);
}

__global__ void fill_kernel(uint16_t *kc, uint16_t *vc, const uint32_t *pages, uint32_t stride, uint32_t shift,
                            uint32_t kvd)
{
    const uint32_t p = blockIdx.x, s = blockIdx.y;
    const uint32_t slot = (pages[s * stride + (p >> shift)] << shift) | (p & ((1u << shift) - 1));
    for (uint32_t i = threadIdx.x; i < kvd; i += blockDim.x) {
        kc[(size_t)slot * kvd + i] = val(s, p, i, 0);
        vc[(size_t)slot * kvd + i] = val(s, p, i, 1);
    }
}

struct Setup {
    uint32_t heads, kv_heads, hd, S, L, pt;
    bool gqa = false;    // the grouped kernel (AttnArgs::gqa)
    uint32_t splits = 0; // 0: what the decoder picks for the kernel
};

// Runs the attention of S decode tokens at context L with pages of pt; returns the output (bf16
// bits) and, with reps, the median microseconds per launch.
bool run_case(const Setup &c, int reps, std::vector<uint16_t> *out, double *us)
{
    const uint32_t kvd = c.kv_heads * c.hd, stride = (c.L + c.pt - 1) / c.pt, q_stride = (c.heads + 2 * c.kv_heads) * c.hd;
    uint32_t shift = 0;
    while ((1u << shift) < c.pt) shift++;
    const uint32_t pool = c.S * stride + 3; // a few pages no sequence owns
    std::vector<uint32_t> perm(pool);
    for (uint32_t i = 0; i < pool; i++) perm[i] = i;
    uint64_t r = 99;
    for (uint32_t i = pool - 1; i > 0; i--) {
        r = r * 6364136223846793005ULL + 1442695040888963407ULL;
        std::swap(perm[i], perm[(r >> 33) % (i + 1)]);
    }
    std::vector<int32_t> pos(c.S), seq(c.S), dtok(c.S);
    for (uint32_t s = 0; s < c.S; s++) pos[s] = (int32_t)c.L - 1, seq[s] = (int32_t)s, dtok[s] = (int32_t)s;
    std::vector<float> q((size_t)c.S * q_stride);
    uint64_t rng = 0x1234567ull + c.S * 7 + c.L;
    for (auto &v : q) v = nf_test_nrand(&rng);
    const uint32_t splits = c.splits ? c.splits : nf::dec::attention_splits(c.S, c.L, c.gqa ? c.kv_heads : c.heads);
    const size_t pool_elems = (size_t)pool * c.pt * kvd;
    uint16_t *kc = nullptr, *vc = nullptr, *o = nullptr;
    float *dq = nullptr, *part = nullptr;
    unsigned *ticket = nullptr;
    int32_t *tab = nullptr;
    bool ok = cudaMalloc(&kc, pool_elems * 2) == cudaSuccess && cudaMalloc(&vc, pool_elems * 2) == cudaSuccess &&
              cudaMalloc(&o, (size_t)c.S * c.heads * c.hd * 2) == cudaSuccess &&
              cudaMalloc(&dq, q.size() * 4) == cudaSuccess &&
              cudaMalloc(&part, (size_t)c.S * c.heads * splits * (c.hd + 2) * 4) == cudaSuccess &&
              cudaMalloc(&ticket, (size_t)c.S * c.heads * 4) == cudaSuccess &&
              cudaMalloc(&tab, (3 * (size_t)c.S + (size_t)c.S * stride) * 4) == cudaSuccess;
    int32_t *dpos = tab, *dseq = tab + c.S, *ddtok = tab + 2 * c.S;
    uint32_t *dpages = reinterpret_cast<uint32_t *>(tab + 3 * c.S);
    ok = ok && cudaMemcpy(dpos, pos.data(), c.S * 4, cudaMemcpyHostToDevice) == cudaSuccess &&
         cudaMemcpy(dseq, seq.data(), c.S * 4, cudaMemcpyHostToDevice) == cudaSuccess &&
         cudaMemcpy(ddtok, dtok.data(), c.S * 4, cudaMemcpyHostToDevice) == cudaSuccess &&
         cudaMemcpy(dpages, perm.data(), (size_t)c.S * stride * 4, cudaMemcpyHostToDevice) == cudaSuccess &&
         cudaMemcpy(dq, q.data(), q.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess &&
         cudaMemset(ticket, 0, (size_t)c.S * c.heads * 4) == cudaSuccess &&
         cudaMemset(kc, 0xFF, pool_elems * 2) == cudaSuccess && cudaMemset(vc, 0xFF, pool_elems * 2) == cudaSuccess;
    if (ok) {
        fill_kernel<<<dim3(c.L, c.S), 256>>>(kc, vc, dpages, stride, shift, kvd);
        ok = cudaDeviceSynchronize() == cudaSuccess;
    }
    const nf::dec::Batch b{nullptr, dpos, dseq, ddtok, nullptr, nullptr, dpages, stride, shift};
    nf::dec::AttnArgs a{dq, q_stride, kc, vc, o, part, ticket, c.heads, c.kv_heads, c.hd, splits};
    a.gqa = c.gqa;
    ok = ok && nf::dec::attention(a, b, c.S, 0, 0) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess;
    if (ok && out) {
        out->resize((size_t)c.S * c.heads * c.hd);
        ok = cudaMemcpy(out->data(), o, out->size() * 2, cudaMemcpyDeviceToHost) == cudaSuccess;
    }
    if (ok && reps) {
        // 50 launches captured as one graph and replayed: the host's launch rate (~20 us a launch
        // here) would otherwise bound the short cases
        cudaEvent_t e0, e1;
        cudaStream_t st;
        cudaGraph_t g = nullptr;
        cudaGraphExec_t ge = nullptr;
        cudaEventCreate(&e0), cudaEventCreate(&e1);
        cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
        std::vector<double> t;
        const int n = 50;
        ok = cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
        for (int j = 0; ok && j < n; j++) ok = nf::dec::attention(a, b, c.S, 0, st) == cudaSuccess;
        ok = cudaStreamEndCapture(st, &g) == cudaSuccess && ok && cudaGraphInstantiate(&ge, g, 0) == cudaSuccess &&
             cudaGraphLaunch(ge, st) == cudaSuccess && cudaStreamSynchronize(st) == cudaSuccess;
        for (int i = 0; i < reps && ok; i++) {
            cudaEventRecord(e0, st);
            cudaGraphLaunch(ge, st);
            cudaEventRecord(e1, st);
            ok = cudaEventSynchronize(e1) == cudaSuccess;
            float ms = 0;
            cudaEventElapsedTime(&ms, e0, e1);
            t.push_back(ms * 1000.0 / n);
        }
        std::sort(t.begin(), t.end());
        *us = t.empty() ? 0 : t[t.size() / 2];
        if (ge) cudaGraphExecDestroy(ge);
        if (g) cudaGraphDestroy(g);
        cudaStreamDestroy(st);
        cudaEventDestroy(e0), cudaEventDestroy(e1);
    }
    CHECK_MSG(ok, "S %u L %u pages of %u: %s", c.S, c.L, c.pt, cudaGetErrorString(cudaGetLastError()));
    cudaFree(kc), cudaFree(vc), cudaFree(o), cudaFree(dq), cudaFree(part), cudaFree(ticket), cudaFree(tab);
    return ok;
}

} // namespace

int main(int argc, char **argv)
{
    if (!nf_test_gpu_visible("bench_attn_pages")) return NF_TEST_SKIP;
    if (argc > 1 && !strcmp(argv[1], "--sweep")) {
        printf("%6s %6s %4s %10s %8s\n", "S", "L", "pt", "us", "GB/s");
        for (uint32_t L : {512u, 2048u, 8192u})
            for (uint32_t S : {1u, 8u, 32u, 64u})
                for (uint32_t pt : {16u, 32u, 64u, 128u, 256u}) {
                    double us = 0;
                    if (!run_case(Setup{32, 4, 128, S, L, pt}, 7, nullptr, &us)) continue;
                    const double bytes = 2.0 * S * L * 4 * 128 * 2; // K and V of the S sequences
                    printf("%6u %6u %4u %10.2f %8.0f\n", S, L, pt, us, bytes / (us * 1e3));
                }
        return nf_test_report();
    }
    if (argc > 1 && !strcmp(argv[1], "--gqa")) { // the per-head kernel against the grouped one, pages of 64
        printf("%6s %6s %10s %8s %10s %8s %7s\n", "S", "L", "head us", "GB/s", "group us", "GB/s", "ratio");
        for (uint32_t L : {512u, 2048u, 8192u})
            for (uint32_t S : {1u, 2u, 4u, 8u, 32u, 64u}) {
                double u0 = 0, u1 = 0;
                if (!run_case(Setup{32, 4, 128, S, L, 64}, 7, nullptr, &u0) ||
                    !run_case(Setup{32, 4, 128, S, L, 64, true}, 7, nullptr, &u1))
                    continue;
                const double bytes = 2.0 * S * L * 4 * 128 * 2;
                printf("%6u %6u %10.2f %8.0f %10.2f %8.0f %7.2f\n", S, L, u0, bytes / (u0 * 1e3), u1, bytes / (u1 * 1e3), u0 / u1);
            }
        return nf_test_report();
    }
    for (uint32_t L : {100u, 700u})
        for (uint32_t S : {1u, 3u}) {
            std::vector<uint16_t> ref, got;
            bool ok = run_case(Setup{8, 2, 128, S, L, 16}, 0, &ref, nullptr);
            for (uint32_t pt : {64u, 128u}) {
                ok = ok && run_case(Setup{8, 2, 128, S, L, pt}, 0, &got, nullptr);
                bool finite = true;
                for (uint16_t v : got) finite = finite && (v & 0x7F80) != 0x7F80;
                printf("  S %u, L %4u: pages of %3u against 16: %s\n", S, L, pt, ok && got == ref ? "same bits" : "DIFFERENT");
                CHECK_MSG(ok && finite, "S %u L %u pages of %u: a non-finite output (a slot outside the sequence)", S, L, pt);
                CHECK_MSG(ok && got == ref, "S %u L %u: pages of %u give other bits than pages of 16", S, L, pt);
            }
        }
    // the grouped kernel: the per-head kernel's bits at the same split count, every group size it
    // takes (q heads on kv heads: 4 on 4, 8 on 4, 8 on 2, 32 on 4), hd 64 and 128, 1 .. 3 splits in use
    const uint32_t geo[][3] = {{4, 4, 128}, {8, 4, 64}, {8, 2, 128}, {32, 4, 128}};
    for (const auto &g : geo)
        for (uint32_t L : {1u, 300u, 700u})
            for (uint32_t S : {1u, 5u}) {
                std::vector<uint16_t> ref, got;
                const uint32_t sp = L > 256 ? 3 : 1;
                bool ok = run_case(Setup{g[0], g[1], g[2], S, L, 32, false, sp}, 0, &ref, nullptr) &&
                          run_case(Setup{g[0], g[1], g[2], S, L, 32, true, sp}, 0, &got, nullptr);
                printf("  grouped: %2u q heads on %u, hd %3u, S %u, L %3u, %u splits: %s\n", g[0], g[1], g[2], S, L, sp,
                       ok && got == ref ? "same bits" : "DIFFERENT");
                CHECK_MSG(ok && got == ref, "grouped %u/%u hd %u S %u L %u: other bits than the per-head kernel", g[0],
                          g[1], g[2], S, L);
            }
    return nf_test_report();
}

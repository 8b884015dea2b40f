// The decoder's device-side sampling helpers (sample.cu) against a host reference: penalize (the
// repetition rule of the CPU sampler, engine/sampler.c, then frequency and presence) on rows picked
// through a row index, and the per-row top-k over several rows at once (the batched forward's
// [S][vocab] logits): ids and values must equal the host's to the bit, best first, ties to the lower
// id (frequency 0.3: frequency * count is inexact, so a fused multiply-subtract would show). Logits
// are multiples of 1/8 so that many values tie; the penalised ids include each row's best
// ones, so the penalties change the top-k; rows the penalties skip must stay untouched.
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
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

uint64_t rng = 0xC0FFEE1234ull;

uint32_t urand(uint32_t n) { return (uint32_t)((nf_test_nrand(&rng) + 10.0f) * 1000003.0f) % n; }

void check(uint32_t V, uint32_t R, uint32_t k)
{
    // R rows in a buffer of R + 2; penalised rows are row_of[r] (reversed, skipping the two spare rows)
    const uint32_t B = R + 2;
    std::vector<float> l((size_t)B * V);
    for (auto &x : l) x = roundf(nf_test_nrand(&rng) * 16.0f) / 8.0f;
    std::vector<int32_t> row_of(R), ids;
    std::vector<uint32_t> start(R + 1, 0), counts;
    std::vector<nf::dec::Penalty> pen(R);
    std::vector<float> ref = l;
    for (uint32_t r = 0; r < R; r++) {
        row_of[r] = (int32_t)(B - 1 - r);
        pen[r] = nf::dec::Penalty{r % 3 == 2 ? 1.0f : 1.1f + 0.2f * (float)r, r % 2 ? 0.5f : 0.0f, 0.3f * (float)(r % 3)};
        float *lr = ref.data() + (size_t)row_of[r] * V;
        // the row's 8 best ids, then random distinct ones
        std::vector<int32_t> order(V);
        for (uint32_t i = 0; i < V; i++) order[i] = (int32_t)i;
        std::partial_sort(order.begin(), order.begin() + 8, order.end(),
                          [&](int32_t a, int32_t b) { return lr[a] > lr[b] || (lr[a] == lr[b] && a < b); });
        std::vector<char> used(V, 0);
        std::vector<int32_t> mine(order.begin(), order.begin() + 8);
        for (uint32_t j = 0; j < 120; j++) mine.push_back((int32_t)urand(V));
        for (int32_t id : mine) {
            if (used[id]) continue;
            used[id] = 1;
            const uint32_t c = 1 + urand(5);
            ids.push_back(id), counts.push_back(c);
            float x = lr[id];
            const nf::dec::Penalty &p = pen[r];
            if (p.repetition != 1.0f) x = x > 0 ? x / p.repetition : x * p.repetition;
            if (p.frequency != 0.0f) x -= p.frequency * (float)c; // rounded, then subtracted (no fma on the host)
            if (p.presence != 0.0f) x -= p.presence;
            lr[id] = x;
        }
        start[r + 1] = (uint32_t)ids.size();
    }
    float *dl = nullptr;
    int32_t *drow = nullptr, *dids = nullptr;
    uint32_t *dstart = nullptr, *dcnt = nullptr;
    nf::dec::Penalty *dpen = nullptr;
    float *scratch = nullptr;
    const size_t sc = nf::dec::topk_scratch_floats() * B;
    bool ok = cudaMalloc(&dl, l.size() * 4) == cudaSuccess && cudaMalloc(&drow, R * 4) == cudaSuccess &&
              cudaMalloc(&dids, ids.size() * 4) == cudaSuccess && cudaMalloc(&dstart, (R + 1) * 4) == cudaSuccess &&
              cudaMalloc(&dcnt, counts.size() * 4) == cudaSuccess && cudaMalloc(&dpen, R * sizeof(nf::dec::Penalty)) == cudaSuccess &&
              cudaMalloc(&scratch, (2 * sc + 2 * (size_t)B * k) * 4) == cudaSuccess;
    ok = ok && cudaMemcpy(dl, l.data(), l.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess &&
         cudaMemcpy(drow, row_of.data(), R * 4, cudaMemcpyHostToDevice) == cudaSuccess &&
         cudaMemcpy(dids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess &&
         cudaMemcpy(dstart, start.data(), (R + 1) * 4, cudaMemcpyHostToDevice) == cudaSuccess &&
         cudaMemcpy(dcnt, counts.data(), counts.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess &&
         cudaMemcpy(dpen, pen.data(), R * sizeof(nf::dec::Penalty), cudaMemcpyHostToDevice) == cudaSuccess;
    const nf::dec::TopK t{reinterpret_cast<int32_t *>(scratch + 2 * sc + (size_t)B * k), scratch + 2 * sc, scratch,
                          reinterpret_cast<int32_t *>(scratch + sc)};
    ok = ok && nf::dec::penalize(dl, V, R, drow, dstart, dpen, dids, dcnt, V, 0) == cudaSuccess &&
         nf::dec::topk(dl, V, V, B, k, t, 0) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess;
    std::vector<float> got(l.size()), vals((size_t)B * k);
    std::vector<int32_t> gids((size_t)B * k);
    ok = ok && cudaMemcpy(got.data(), dl, got.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess &&
         cudaMemcpy(vals.data(), t.vals, vals.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess &&
         cudaMemcpy(gids.data(), t.ids, gids.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess;
    CHECK_MSG(ok, "V %u R %u k %u: device: %s", V, R, k, cudaGetErrorString(cudaGetLastError()));
    if (ok) {
        CHECK_MSG(memcmp(got.data(), ref.data(), got.size() * 4) == 0, "V %u R %u: penalised logits differ from the host's", V, R);
        int bad = 0;
        for (uint32_t b = 0; b < B; b++) {
            const float *lr = ref.data() + (size_t)b * V;
            std::vector<int32_t> order(V);
            for (uint32_t i = 0; i < V; i++) order[i] = (int32_t)i;
            std::partial_sort(order.begin(), order.begin() + k, order.end(),
                              [&](int32_t a, int32_t c) { return lr[a] > lr[c] || (lr[a] == lr[c] && a < c); });
            for (uint32_t j = 0; j < k; j++)
                bad += gids[(size_t)b * k + j] != order[j] || memcmp(&vals[(size_t)b * k + j], &lr[order[j]], 4) != 0;
        }
        printf("  vocab %6u, %u rows (%u penalised, %zu pairs), k %3u: %d top-k entries differ from the host\n", V, B, R,
               ids.size(), k, bad);
        CHECK_MSG(bad == 0, "V %u R %u k %u: %d top-k entries differ", V, R, k, bad);
    }
    cudaFree(dl), cudaFree(drow), cudaFree(dids), cudaFree(dstart), cudaFree(dcnt), cudaFree(dpen), cudaFree(scratch);
}

} // namespace

int main(void)
{
    if (!nf_test_gpu_visible("test_sample_cuda")) return NF_TEST_SKIP;
    check(151936, 4, 40);
    check(151936, 3, 256);
    check(1000, 6, 1);
    check(5000, 2, 256);
    return nf_test_report();
}

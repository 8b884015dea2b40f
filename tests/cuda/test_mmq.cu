// The mmq kernels (mmq.cu) alone on the device, against a host emulation that runs mmq.cuh's own
// policies in the kernel's order, so most outputs must match to the bit: what isolates the kernel
// (its staging, warp and lane mapping, tiles, epilogues) from the route's wiring that
// test_sparse_moe checks against the CPU reference.
//
//   - launch_mmq_quant: x (bf16) and an f32 plane quantised per 32 elements, every byte and pair
//     equal to the host's quant_a8 arithmetic (the same f32 operations);
//   - down form (plain): y [pos][row] f32 equal to the host's fold of every group in element order
//     (exact int sums, the same fmas): bit for bit;
//   - gate/up form (GLU): the int8 intermediate and its (d, d sum q) equal to the host's quantisation
//     of silu(g) u, except where the host's and the device's expf (2 ulps apart at most) move a value
//     across a rint tie or the block's amax by ulps: those elements may differ by one step (counted,
//     and only accepted within 1e-3 of a tie), d within 8 ulps.
// Over q4_k, q5_k, q6_k and q8_0, tiles of 32 and 64 positions, two groups of an out-of-order pair of
// experts with counts that leave 1 .. 7 positions in an n-tile, fill it, or spill to a second tile,
// input rows through a position map (gate/up), dead tile slots past the live count (they must exit),
// and guard rows past the positions that must stay untouched; and down rows of 20 480 (q6_k, q4_k),
// whose scale fields do not fit shared memory and are read from global memory.
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <vector>

#include "backend/cuda/sparse_moe/internal.cuh"
#include "backend/cuda/sparse_moe/mmq.cuh"

extern "C" {
#include "codec/codec.h"
#include "common/cuda_test_util.h"
}
#include "common/mmq_rowdot.h"
#include "nf_test.h"
#include "common/need_gpu.h"

namespace {

uint64_t rng = 0x9E3779B97F4A7C15ull;
float nrand() { return nf_test_nrand(&rng); }


// quant_a8.cuh's quantiser of n values (a multiple of 32): q, and (d, d sum q) per block
void quantize(const float *v, uint32_t n, int8_t *q, float2 *d2)
{
    for (uint32_t b = 0; b < n / 32; b++) {
        float am = 0.f;
        for (int i = 0; i < 32; i++) am = fmaxf(am, fabsf(v[32 * b + i]));
        const float d = am / 127.0f;
        int sum = 0;
        for (int i = 0; i < 32; i++) {
            const int qi = am > 0.f ? (int)rintf(v[32 * b + i] / d) : 0;
            q[32 * b + i] = (int8_t)qi;
            sum += qi;
        }
        d2[b] = make_float2(d, d * (float)sum);
    }
}

void check_quant()
{
    const uint32_t rows = 37, cols = 320;
    std::vector<uint16_t> xb((size_t)rows * cols);
    std::vector<float> xf(xb.size()), ff(xb.size());
    for (size_t i = 0; i < xb.size(); i++) {
        const float s = ldexpf(1.0f, (int)(i / 32 % 23) - 11) * ((i / 32) % 17 == 5 ? 0.0f : 1.0f); // a zero block
        xb[i] = nf_test_f2bf(nrand() * s);
        xf[i] = nf_test_bf2f(xb[i]);
        ff[i] = nrand() * s * 3.7f;
    }
    for (int bf = 1; bf >= 0; bf--) {
        void *din;
        int8_t *dq;
        float2 *dd;
        cudaMalloc(&din, xb.size() * 4);
        cudaMalloc(&dq, xb.size());
        cudaMalloc(&dd, xb.size() / 32 * sizeof(float2));
        cudaMemcpy(din, bf ? (const void *)xb.data() : (const void *)ff.data(), xb.size() * (bf ? 2 : 4),
                   cudaMemcpyHostToDevice);
        CHECK(nf::launch_mmq_quant(din, bf, rows, cols, dq, dd, 0) == cudaSuccess);
        std::vector<int8_t> gq(xb.size()), hq(xb.size());
        std::vector<float2> gd(xb.size() / 32), hd(xb.size() / 32);
        CHECK(cudaMemcpy(gq.data(), dq, gq.size(), cudaMemcpyDeviceToHost) == cudaSuccess);
        cudaMemcpy(gd.data(), dd, gd.size() * sizeof(float2), cudaMemcpyDeviceToHost);
        quantize(bf ? xf.data() : ff.data(), (uint32_t)xb.size(), hq.data(), hd.data());
        const bool same = memcmp(gq.data(), hq.data(), gq.size()) == 0 && memcmp(gd.data(), hd.data(), gd.size() * 8) == 0;
        printf("launch_mmq_quant (%s input, %u x %u): %s\n", bf ? "bf16" : "f32", rows, cols,
               same ? "every byte and pair as the host's" : "DIFFERS");
        CHECK_MSG(same, "launch_mmq_quant (%s) differs from the host quantiser", bf ? "bf16" : "f32");
        cudaFree(din), cudaFree(dq), cudaFree(dd);
    }
}

struct Case {
    uint32_t c0, c1; // positions of the two groups (experts 2 then 0)
};

template <class C>
void check(int codec, bool glu, int height, uint32_t cols, const Case &cs)
{
    const uint32_t E = 3, rows = 256, P = cs.c0 + cs.c1, k = 2;
    const nf_codec *cc = nf_codec_get((nf_codec_id)codec);
    const size_t rb = nf_codec_row_bytes(cc, cols);
    std::vector<uint8_t> payload((size_t)E * rows * rb);
    std::vector<float> w(cols);
    for (uint32_t r = 0; r < E * rows; r++) {
        for (uint32_t i = 0; i < cols; i++) w[i] = nrand() * 0.05f * (1.0f + (float)(r % 7));
        cc->quantize_row(w.data(), &payload[(size_t)r * rb], cols);
    }
    nf_moe_matrix mm;
    memset(&mm, 0, sizeof mm);
    mm.codec = codec, mm.data = payload.data(), mm.experts = E, mm.rows = rows, mm.cols = cols, mm.divisors = 1;
    nf_error err;
    size_t bytes = 0;
    uint8_t *dw = nullptr;
    nf::DevMat W, Wh;
    std::vector<uint8_t> host((size_t)E * rows * (rb + 16));
    const bool up = nf::devmat_bytes(&mm, "w", &bytes, &err) == NF_OK && cudaMalloc(&dw, bytes) == cudaSuccess &&
                    nf::devmat_upload(&mm, dw, &W, "w", &err) == NF_OK && nf::devmat_host(&mm, host.data(), &Wh, &err) == NF_OK;
    CHECK_MSG(up, "upload: %s", err.msg);
    if (!up) return;
    CHECK(nf::mmq_supported(codec, W, glu));
    // inputs: T = P rows (glu: position p reads row perm[p] through pos_entry = k perm[p] + (p & 1))
    std::vector<int8_t> xq((size_t)P * cols);
    std::vector<float2> xd((size_t)P * cols / 32);
    for (uint32_t t = 0; t < P; t++)
        for (uint32_t b = 0; b < cols / 32; b++) {
            const float d = (t + b) % 11 == 3 ? 0.0f : ldexpf(1.0f + 0.25f * (float)(b % 4), (int)((t * 3 + b) % 9) - 4);
            int sum = 0;
            for (int i = 0; i < 32; i++) {
                int q = d == 0.0f ? 0 : (int)lrintf(nrand() * 50.0f);
                q = q > 127 ? 127 : q < -127 ? -127 : q;
                xq[(size_t)t * cols + 32 * b + i] = (int8_t)q;
                sum += q;
            }
            xd[(size_t)t * cols / 32 + b] = make_float2(d, d * (float)sum);
        }
    std::vector<int32_t> perm(P), pos_entry(P);
    for (uint32_t p = 0; p < P; p++) perm[p] = (int32_t)((p * 7 + 3) % P);
    for (uint32_t p = 0; p < P; p++) pos_entry[p] = (int32_t)(k * perm[p] + (p & 1));
    // groups: [n, expert[2], start[2], count[2]]; tiles of `height` over each group, 2 dead slots
    std::vector<int32_t> gt = {2, 2, 0, 0, (int32_t)cs.c0, (int32_t)cs.c0, (int32_t)cs.c1};
    std::vector<int32_t> tg, tm;
    for (int gi = 0; gi < 2; gi++)
        for (uint32_t m0 = 0; m0 < (gi ? cs.c1 : cs.c0); m0 += (uint32_t)height) tg.push_back(gi), tm.push_back((int32_t)m0);
    const int32_t ntiles = (int32_t)tg.size();
    tg.push_back(0), tg.push_back(0), tm.push_back(0), tm.push_back(0); // dead slots (must exit)
    const uint32_t out_rows = glu ? rows / 2 : rows;
    int32_t *dg, *dt, *dpe;
    int8_t *dxq, *daq;
    float2 *dxd, *dad;
    float *dy;
    const uint32_t G = 8; // guard positions past P
    cudaMalloc(&dg, gt.size() * 4);
    cudaMalloc(&dt, (1 + 2 * tg.size()) * 4);
    cudaMalloc(&dpe, P * 4);
    cudaMalloc(&dxq, xq.size());
    cudaMalloc(&dxd, xd.size() * sizeof(float2));
    cudaMalloc(&daq, (size_t)(P + G) * out_rows);
    cudaMalloc(&dad, (size_t)(P + G) * out_rows / 32 * sizeof(float2));
    cudaMalloc(&dy, (size_t)(P + G) * out_rows * 4);
    cudaMemcpy(dg, gt.data(), gt.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dt, &ntiles, 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dt + 1, tg.data(), tg.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dt + 1 + tg.size(), tm.data(), tm.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dpe, pos_entry.data(), P * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dxq, xq.data(), xq.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(dxd, xd.data(), xd.size() * sizeof(float2), cudaMemcpyHostToDevice);
    cudaMemset(daq, 0x5A, (size_t)(P + G) * out_rows);
    cudaMemset(dad, 0xFF, (size_t)(P + G) * out_rows / 32 * sizeof(float2));
    cudaMemset(dy, 0xFF, (size_t)(P + G) * out_rows * 4);
    const nf::Groups g{dg, dg + 1, dg + 3, dg + 5, glu ? dpe : nullptr, k, 2};
    const nf::TileList tl{dt, dt + 1, dt + 1 + tg.size(), (uint32_t)tg.size(), height};
    const cudaError_t ce = nf::launch_mmq(codec, glu, W, dxq, dxd, g, tl, dy, out_rows, daq, dad, 0);
    CHECK_MSG(ce == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess, "launch: %s", cudaGetErrorString(ce));
    std::vector<float> y((size_t)(P + G) * out_rows);
    std::vector<int8_t> aq((size_t)(P + G) * out_rows);
    std::vector<float2> ad((size_t)(P + G) * out_rows / 32);
    cudaMemcpy(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(aq.data(), daq, aq.size(), cudaMemcpyDeviceToHost);
    cudaMemcpy(ad.data(), dad, ad.size() * sizeof(float2), cudaMemcpyDeviceToHost);
    size_t bad = 0, near = 0, guard = 0;
    std::vector<float> v(out_rows);
    std::vector<int8_t> hq(out_rows);
    std::vector<float2> hd(out_rows / 32);
    for (uint32_t p = 0; p < P; p++) {
        const uint32_t e = p < cs.c0 ? 2 : 0, in = glu ? (uint32_t)perm[p] : p;
        const int8_t *xr = &xq[(size_t)in * cols];
        const float2 *dr = &xd[(size_t)in * cols / 32];
        if (!glu) {
            for (uint32_t r = 0; r < rows; r++) {
                const float want = mmq_rowdot_c<C>(Wh, e, r, xr, dr), got = y[(size_t)p * rows + r];
                bad += memcmp(&want, &got, 4) != 0;
            }
            continue;
        }
        for (uint32_t r = 0; r < out_rows; r++) {
            const float gg = mmq_rowdot_c<C>(Wh, e, r, xr, dr), uu = mmq_rowdot_c<C>(Wh, e, r + out_rows, xr, dr);
            v[r] = gg / (1.0f + expf(-gg)) * uu;
        }
        quantize(v.data(), out_rows, hq.data(), hd.data());
        for (uint32_t b = 0; b < out_rows / 32; b++) {
            const float2 gd = ad[(size_t)p * (out_rows / 32) + b];
            const bool dsame = gd.x == hd[b].x;
            if (!(fabsf(gd.x - hd[b].x) <= 8 * 1.2e-7f * hd[b].x)) bad++;
            for (int i = 0; i < 32; i++) {
                const uint32_t r = 32 * b + i;
                const int dq = aq[(size_t)p * out_rows + r] - hq[r];
                if (dq == 0) continue;
                const float t = hd[b].x > 0 ? v[r] / hd[b].x : 0.0f, frac = fabsf(t - truncf(t));
                if ((dq == 1 || dq == -1) && (fabsf(frac - 0.5f) < 1e-3f || !dsame)) near++;
                else bad++;
            }
        }
    }
    for (size_t i = (size_t)P * out_rows; i < (size_t)(P + G) * out_rows; i++) {
        uint32_t u;
        memcpy(&u, &y[i], 4);
        guard += glu ? (uint8_t)aq[i] != 0x5A : u != 0xFFFFFFFFu;
    }
    printf("  %-5s %-7s height %2d cols %5u groups %3u + %3u (scale fields %s): %zu differ, %zu one step across a "
           "tie, %zu guards touched\n",
           cc->name, glu ? "gate/up" : "down", height, cols, cs.c0, cs.c1,
           nf::mmq_meta_staged(codec, W, height) ? "staged" : "from global memory", bad, near, guard);
    CHECK_MSG(bad == 0, "%s %s height %d: %zu outputs differ from the host emulation", cc->name, glu ? "gate/up" : "down",
              height, bad);
    CHECK_MSG(guard == 0, "%s: %zu guard outputs written", cc->name, guard);
    cudaFree(dw), cudaFree(dg), cudaFree(dt), cudaFree(dpe), cudaFree(dxq), cudaFree(dxd), cudaFree(daq), cudaFree(dad),
        cudaFree(dy);
}

template <class C>
void check_codec(int codec, uint32_t cols)
{
    const Case cases[] = {{1, 40}, {9, 64}, {70, 8}, {33, 31}, {64, 65}};
    for (bool glu : {false, true})
        for (int h : {32, 64})
            for (const Case &c : cases) check<C>(codec, glu, h, cols, c);
}

// A down row too long for its scale fields to be staged (qwen2-57b-a14b's shared down: K = 20 480):
// the form that reads them from global memory, held to the same host emulation bit for bit.
template <class C>
void check_long(int codec, uint32_t cols)
{
    nf::DevMat probe{};
    probe.cols = cols, probe.rows = 256, probe.nb = cols / 256;
    CHECK_MSG(!nf::mmq_meta_staged(codec, probe, 64), "%u-wide rows still stage their scale fields: not the long form",
              cols);
    for (int h : {32, 64})
        for (const Case &c : {Case{9, 64}, Case{70, 8}}) check<C>(codec, false, h, cols, c);
}

} // namespace

int main(void)
{
    if (!nf_test_gpu_visible("test_mmq")) return NF_TEST_SKIP;
    check_quant();
    check_codec<nf::MmqQ4K>(NF_CODEC_Q4_K, 512);
    check_codec<nf::MmqQ5K>(NF_CODEC_Q5_K, 512);
    check_codec<nf::MmqQ6K>(NF_CODEC_Q6_K, 768);
    check_codec<nf::MmqQ8>(NF_CODEC_Q8_0, 384);
    check_long<nf::MmqQ6K>(NF_CODEC_Q6_K, 20480);
    check_long<nf::MmqQ4K>(NF_CODEC_Q4_K, 20480);
    return nf_test_report();
}

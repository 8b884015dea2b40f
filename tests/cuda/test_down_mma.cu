// The fused down + weighted combine on tensor cores (down_mma.cu) for nvfp4 and bf16 down banks
// against a double reference over the weights' values (nvfp4: the CPU codec's dequantization,
// nf_nvfp4_dequantize_row; bf16: the weights), with a synthetic routing in device memory:
//     ref[t][h] = sum over t's positions p of w_p (down_e(p)[h] . act[p]) + g_t ys[t][h]
//     S[t][h]   = sum over t's positions p of |w_p| sum_i |down_e(p)[h][i] act[p][i]| + |g_t ys[t][h]|
//
// Bound. The MMA operands are exact (A = e2m1 * e4m3 * 2^-8, or the bf16 weight) and so are their
// products with the bf16 hi and lo columns of act. Error terms, relative to S:
//  - the split: x = hi + lo + r with |x - hi| <= 2^-8 |x| and |r| <= 2^-8 |x - hi|: 2^-16;
//  - a task's MMA chain: each of the two accumulators takes 4 MMAs an nvfp4 chunk of 128 (bf16: 2 a
//    chunk of 64), n <= 4 I / 128 of them (32 at I = 1024); assuming, as test_gemv_mma does, one MMA
//    within 2^-22 of its partial sums,
//    n 2^-22 <= 2^-17 (the lo column's chain is 2^-8 of that);
//  - f32 roundings after the chain: d0 + d1 and hi + lo (3), the row factor 2^8 / divisor and its
//    product (2), the router weight (1), the token's sum over its <= 16 positions (16), the 4 lanes
//    and 8 warps (10), the ys fma (1), and the reference's own f32 weights e2m1 * (e4m3 / divisor),
//    two roundings off the kernel's (bf16: no factor, exact reference weights): ~35 x 2^-24 < 2^-19.
// Together below 2^-15 for I <= 1024. The output is bf16, rounded once (unit roundoff 2^-8), so
//     |gpu - ref| <= 2^-8 |ref| + (1 + 2^-8) 2^-15 S.
// The first term dominates unless the output cancels; the "cancel" cases set ys = -(routed sum) / g
// in f32, so ref is ~2^-24 of the routed sum and the output is the kernel's f32 error itself, against
// 2^-15 S.
//
// Strength, estimated without a GPU: a host transcription of the kernel (each lane's loads, operand
// decode and staged B reads, each MMA an exact sum rounded once to f32 -- the tensor cores truncate,
// so the device's error may be a few times larger --, the flushes and reductions in the kernel's
// order; a scratch program, not kept in the tree), run on these very data, puts the kernel at worst
// 0.90 - 0.95 of the allowance (the bf16 rounding of an output just above a power of two) and
// 0.02 - 0.03 in the cancel cases, and the planted bugs, per case, at (worst element / allowance):
// the lo columns dropped 7 - 22x (the shifted rounding shows even where bf16 dominates); the divisor
// of stacked row h instead of e H + h 170x - 9e4x; a neighbouring position's router weight (k > 1),
// the scale block 2c read for words 2-3, the hi/lo columns of position c + 1: all > 2000x; the
// passes after a group's first 4 positions skipped: > 1000x where a group has more than 4 (the T = 8
// and 16 cases), a no-op elsewhere. (Those margins are nvfp4's; the bf16 operands' pairing with the
// staged columns is checked exactly on the host by test_mma_tile.)
//
// Cases: the routed down of Qwen3-30B-A3B's shape (H 2048, I 768, k 8; 16 experts, one divisor
// each) at T = 1, 3, 8, with and without ys; T = 16 with k = 8, I = 768 must be refused (the staged
// columns exceed 227 KB; decode.cu takes it) and T = 16 taken at k = 4, I = 256; H = 200 (not a
// multiple of 16: the last tile's rows clamp) with D = 25 divisors of 128 rows crossing the expert
// boundaries (amplitudes cycling 1, 3, 1/2, 2, 1/4: neighbouring shares differ by 1.5x - 8x);
// I = 384 (3 chunks: uneven warp shares); one expert taken by every token (skew: a group of T
// positions, several passes of 4); k = 1 (one position: most warps idle); the cancel cases. Each
// launch runs twice (once under PDL): bit-identical outputs; a guard region after the [T][H] output
// must stay untouched and every output must be written (NaN fill). bf16 banks: the same shapes with
// 64-element chunks (I = 320: 5 chunks; I = 64: one), the same row amplitudes, no divisors.
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <algorithm>
#include <map>
#include <tuple>
#include <vector>

#include "backend/cuda/sparse_moe/internal.cuh"

extern "C" {
#include "codec/codec.h"
#include "codec/nvfp4.h"
#include "common/cuda_test_util.h"
}
#include "nf_test.h"
#include "common/need_gpu.h"

namespace {

uint64_t rng = 0x2545F4914F6CDD1Dull;
float nrand() { return nf_test_nrand(&rng); }
uint32_t urand(uint32_t n) { return (uint32_t)(nf_test_urand(&rng) * n) % n; }

constexpr uint32_t kGuard = 512; // bf16 guard elements after the [T][H] output

struct Case {
    uint32_t E, H, I, D, T, k;
    bool ys;             // a shared expert term
    bool skew = false;   // expert E - 1 in every token: a group of T positions
    bool cancel = false; // ys = -(routed sum) / g: the output is the kernel's error
    int codec = NF_CODEC_NVFP4; // of the bank: NF_CODEC_NVFP4 or NF_CODEC_BF16 (D: amplitude shares)
};

Case bf16w(Case c) // the same case with a bf16 bank
{
    c.codec = NF_CODEC_BF16;
    return c;
}

// One down bank: E experts of H x I, D amplitude shares (nvfp4: divisor shares), quantized to nvfp4
// or rounded to bf16; deq: the values the kernel should see (nvfp4: the CPU dequantization).
struct Bank {
    std::vector<uint8_t> payload;
    std::vector<float> deq;
};

Bank make_bank(uint32_t E, uint32_t H, uint32_t I, uint32_t D, int codec)
{
    const uint64_t R = (uint64_t)E * H, share = R / D;
    const float share_amp[5] = {1.0f, 3.0f, 0.5f, 2.0f, 0.25f};
    std::vector<float> w(R * I);
    for (uint64_t r = 0; r < R; r++) {
        const float ra = share_amp[(r / share) % 5] * (r % 17 == 5 ? ldexpf(1.0f, -15) : 1.0f);
        for (uint32_t i = 0; i < I; i++) w[r * I + i] = nrand() * ra * ldexpf(1.0f, (int)((i / 16 + r) % 5) - 2);
    }
    Bank b;
    if (codec == NF_CODEC_BF16) {
        b.payload.resize(R * I * 2);
        b.deq.resize(R * I);
        for (uint64_t i = 0; i < R * I; i++) {
            const uint16_t h = nf_test_f2bf(w[i]);
            memcpy(&b.payload[2 * i], &h, 2);
            b.deq[i] = nf_test_bf2f(h);
        }
        return b;
    }
    nf_nvfp4_layout l;
    nf_error err;
    CHECK_MSG(nf_nvfp4_layout_of(R, I, D, &l, &err) == NF_OK, "layout: %s", err.msg);
    b.payload.assign(l.payload_bytes, 0);
    nf_nvfp4_quantize(w.data(), &l, b.payload.data());
    nf_nvfp4_planes p;
    CHECK(nf_nvfp4_view(b.payload.data(), l.payload_bytes, R, I, D, &p, &err) == NF_OK);
    b.deq.resize(R * I);
    for (uint64_t r = 0; r < R; r++) nf_nvfp4_dequantize_row(&p, r, &b.deq[r * I]);
    return b;
}

const Bank &bank_of(uint32_t E, uint32_t H, uint32_t I, uint32_t D, int codec)
{
    static std::map<std::tuple<uint32_t, uint32_t, uint32_t, uint32_t, int>, Bank> cache;
    const auto key = std::make_tuple(E, H, I, D, codec);
    auto it = cache.find(key);
    if (it == cache.end()) it = cache.emplace(key, make_bank(E, H, I, D, codec)).first;
    return it->second;
}

// Host routing: each token's k distinct experts and weights, then the expert-sorted work list.
struct HostRouting {
    std::vector<int32_t> expert; // [T*k]
    std::vector<float> w, g;     // [T*k], [T]
    std::vector<int32_t> pos_entry, g_expert, g_start, g_count;
};

HostRouting make_routing(const Case &c)
{
    HostRouting r;
    const uint32_t P = c.T * c.k;
    r.expert.resize(P);
    r.w.resize(P);
    for (uint32_t t = 0; t < c.T; t++) {
        std::vector<int32_t> pick;
        if (c.skew) pick.push_back((int32_t)c.E - 1);
        while (pick.size() < c.k) {
            const int32_t e = (int32_t)urand(c.E);
            if (std::find(pick.begin(), pick.end(), e) == pick.end()) pick.push_back(e);
        }
        for (uint32_t j = 0; j < c.k; j++) {
            r.expert[t * c.k + j] = pick[j];
            r.w[t * c.k + j] = (0.05f + (float)nf_test_urand(&rng)) * ldexpf(1.0f, -(int)(j % 3));
        }
        r.g.push_back(0.1f + 0.9f * (float)nf_test_urand(&rng));
    }
    for (uint32_t e = 0; e < c.E; e++) {
        const int32_t start = (int32_t)r.pos_entry.size();
        for (uint32_t q = 0; q < P; q++)
            if (r.expert[q] == (int32_t)e) r.pos_entry.push_back((int32_t)q);
        if ((int32_t)r.pos_entry.size() > start) {
            r.g_expert.push_back((int32_t)e);
            r.g_start.push_back(start);
            r.g_count.push_back((int32_t)r.pos_entry.size() - start);
        }
    }
    return r;
}

// act [P][I]: arbitrary f32 (the lo columns matter), position amplitudes 2^-4 .. 2^4, 32-element
// block amplitudes 2^-2 .. 2^2, one zero block per position.
std::vector<float> make_act(uint32_t P, uint32_t I)
{
    std::vector<float> a((size_t)P * I);
    for (uint32_t p = 0; p < P; p++)
        for (uint32_t i = 0; i < I; i++) {
            const uint32_t blk = i / 32;
            const int e = (int)((p * 5) % 9) - 4 + (int)((blk + p) % 5) - 2;
            const float amp = blk == (p * 5 + 1) % (I / 32) ? 0.0f : ldexpf(1.0f, e);
            a[(size_t)p * I + i] = nrand() * amp;
        }
    return a;
}

template <class T>
T *to_dev(const std::vector<T> &v)
{
    T *d = nullptr;
    if (cudaMalloc(&d, v.size() * sizeof(T) + 16) != cudaSuccess) return nullptr;
    cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
    return d;
}

// The bank of E experts x H rows x I columns with D divisors on the device, in the kernels' layout
// (*dw: the allocation, for cudaFree); false (reported) when the upload fails.
bool upload_bank(int codec, uint32_t E, uint32_t H, uint32_t I, uint32_t D, uint8_t **dw, nf::DevMat *W)
{
    const Bank &b = bank_of(E, H, I, D, codec);
    nf_moe_matrix mm;
    memset(&mm, 0, sizeof mm);
    mm.codec = codec;
    mm.data = b.payload.data();
    mm.experts = E;
    mm.rows = H;
    mm.cols = I;
    mm.divisors = codec == NF_CODEC_NVFP4 ? D : 1;
    nf_error err;
    size_t bytes = 0;
    *dw = nullptr;
    const bool up = nf::devmat_bytes(&mm, "down", &bytes, &err) == NF_OK && cudaMalloc(dw, bytes) == cudaSuccess &&
                    nf::devmat_upload(&mm, *dw, W, "down", &err) == NF_OK;
    CHECK_MSG(up, "upload: %s", err.msg);
    return up;
}

void run_case(const Case &c)
{
    const Bank &b = bank_of(c.E, c.H, c.I, c.D, c.codec);
    const uint32_t P = c.T * c.k;
    uint8_t *dw = nullptr;
    nf::DevMat W;
    if (!upload_bank(c.codec, c.E, c.H, c.I, c.D, &dw, &W)) return;
    CHECK_MSG(nf::down_mma_supported(c.codec, W, c.T, c.k), "T %u k %u I %u refused (%zu bytes of shared memory)", c.T,
              c.k, c.I, nf::down_mma_smem(c.T, c.k, c.I));

    const HostRouting hr = make_routing(c);
    const std::vector<float> act = make_act(P, c.I);
    // the routed sums and their absolute sums, in double
    std::vector<double> routed((size_t)c.T * c.H, 0.0), S((size_t)c.T * c.H, 0.0);
    for (uint32_t q = 0; q < P; q++) {
        const uint32_t t = q / c.k;
        const float *a = &act[0];
        // the position of entry q in the sorted order holds act row pos
        uint32_t pos = 0;
        while ((uint32_t)hr.pos_entry[pos] != q) pos++;
        a += (size_t)pos * c.I;
        for (uint32_t h = 0; h < c.H; h++) {
            const float *wr = &b.deq[((size_t)hr.expert[q] * c.H + h) * c.I];
            double s = 0, sa = 0;
            for (uint32_t i = 0; i < c.I; i++) {
                const double pr = (double)wr[i] * a[i];
                s += pr;
                sa += fabs(pr);
            }
            routed[(size_t)t * c.H + h] += (double)hr.w[q] * s;
            S[(size_t)t * c.H + h] += fabs((double)hr.w[q]) * sa;
        }
    }
    std::vector<float> ys;
    if (c.ys) {
        ys.resize((size_t)c.T * c.H);
        for (size_t i = 0; i < ys.size(); i++) {
            const uint32_t t = (uint32_t)(i / c.H);
            ys[i] = c.cancel ? (float)(-routed[i] / hr.g[t]) : nrand() * (float)(sqrt(S[i]) + 1e-3);
        }
    }

    // device routing (only what the kernel reads) and buffers
    nf::Routing r;
    memset(&r, 0, sizeof r);
    std::vector<int32_t> ng = {(int32_t)hr.g_expert.size()};
    r.topk_w = to_dev(hr.w);
    r.shared_g = to_dev(hr.g);
    r.pos_entry = to_dev(hr.pos_entry);
    r.n_groups = to_dev(ng);
    r.g_expert = to_dev(hr.g_expert);
    r.g_start = to_dev(hr.g_start);
    r.g_count = to_dev(hr.g_count);
    float *dact = to_dev(act), *dys = c.ys ? to_dev(ys) : nullptr;
    const size_t n_out = (size_t)c.T * c.H + kGuard;
    uint16_t *dout = nullptr;
    CHECK(cudaMalloc(&dout, n_out * 2) == cudaSuccess);

    std::vector<uint16_t> got[2];
    for (int run = 0; run < 2; run++) {
        cudaMemset(dout, 0xFF, n_out * 2); // bf16 NaN everywhere: unwritten outputs show
        cudaError_t e = nf::launch_down_mma(c.codec, W, dact, r, c.T, c.k, dys, dout, run == 1, 0);
        if (e == cudaSuccess) e = cudaDeviceSynchronize();
        CHECK_MSG(e == cudaSuccess, "launch: %s", cudaGetErrorString(e));
        got[run].resize(n_out);
        cudaMemcpy(got[run].data(), dout, n_out * 2, cudaMemcpyDeviceToHost);
    }

    const double eps = ldexp(1.0, -15);
    size_t bad = 0, guard_bad = 0;
    double worst = 0;
    for (uint32_t t = 0; t < c.T; t++)
        for (uint32_t h = 0; h < c.H; h++) {
            const size_t i = (size_t)t * c.H + h;
            const double ref = routed[i] + (c.ys ? (double)hr.g[t] * ys[i] : 0.0);
            const double s = S[i] + (c.ys ? fabs((double)hr.g[t] * ys[i]) : 0.0);
            const double lim = ldexp(fabs(ref), -8) + (1 + ldexp(1.0, -8)) * eps * s + 1e-30;
            const double dv = fabs((double)nf_test_bf2f(got[0][i]) - ref);
            if (!(dv <= lim)) {
                if (bad < 4)
                    printf("    t %u h %u: got %.9g ref %.9g (allowance %.3g)\n", t, h,
                           (double)nf_test_bf2f(got[0][i]), ref, lim);
                bad++;
            }
            if (!(dv == dv)) worst = INFINITY;
            else if (dv / lim > worst) worst = dv / lim;
        }
    for (size_t i = (size_t)c.T * c.H; i < n_out; i++) guard_bad += got[0][i] != 0xFFFF;
    const bool same = got[0] == got[1];
    int maxc = 0;
    for (int32_t n : hr.g_count) maxc = std::max(maxc, n);
    printf("  %-5s E %2u H %4u I %4u D %2u T %2u k %u%s%s%s: %zu groups (largest %d), smem %zu: worst %.4f of the "
           "allowance, %zu outside%s\n",
           c.codec == NF_CODEC_NVFP4 ? "nvfp4" : "bf16", c.E, c.H, c.I, c.D, c.T, c.k, c.ys ? " ys" : "", c.skew ? " skew" : "", c.cancel ? " cancel" : "",
           hr.g_expert.size(), maxc, nf::down_mma_smem(c.T, c.k, c.I), worst, bad, same ? "" : ", NOT deterministic");
    CHECK_MSG(bad == 0, "%s T %u k %u H %u I %u: %zu outputs outside the allowance (worst %.2f x)",
              c.codec == NF_CODEC_NVFP4 ? "nvfp4" : "bf16", c.T, c.k, c.H, c.I, bad, worst);
    CHECK_MSG(guard_bad == 0, "%zu guard values written", guard_bad);
    CHECK_MSG(same, "two runs differ (T %u k %u)", c.T, c.k);

    cudaFree(dw);
    cudaFree(r.topk_w);
    cudaFree(r.shared_g);
    cudaFree(r.pos_entry);
    cudaFree(r.n_groups);
    cudaFree(r.g_expert);
    cudaFree(r.g_start);
    cudaFree(r.g_count);
    cudaFree(dact);
    cudaFree(dys);
    cudaFree(dout);
}

// The refusals: shapes the kernel does not take, and T = 16 x k = 8 positions of I = 768 whose staged
// columns exceed the device's shared memory.
void check_refusals()
{
    uint8_t *dw = nullptr;
    nf::DevMat W;
    if (!upload_bank(NF_CODEC_NVFP4, 4, 256, 768, 4, &dw, &W)) return;
    int limit = 0;
    cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0);
    printf("  shared memory per block (opt-in): %d bytes; T 8 k 8 I 768 needs %zu, T 16 k 8 %zu\n", limit,
           nf::down_mma_smem(8, 8, 768), nf::down_mma_smem(16, 8, 768));
    const int F = NF_CODEC_NVFP4;
    CHECK(nf::down_mma_supported(F, W, 1, 8));
    CHECK(!nf::down_mma_supported(F, W, 16, 8));
    CHECK(nf::down_mma_supported(F, W, 16, 8) == (nf::down_mma_smem(16, 8, 768) <= (size_t)limit));
    CHECK(nf::down_mma_supported(F, W, 8, 8) == (nf::down_mma_smem(8, 8, 768) <= (size_t)limit));
    CHECK(!nf::down_mma_supported(F, W, 17, 1));
    CHECK(!nf::down_mma_supported(F, W, 0, 8));
    CHECK(!nf::down_mma_supported(NF_CODEC_Q8_0, W, 1, 8));
    CHECK(nf::launch_down_mma(F, W, nullptr, nf::Routing{}, 17, 1, nullptr, nullptr, false, 0) == cudaErrorInvalidValue);
    cudaFree(dw);
}

} // namespace

int main(void)
{
    if (!nf_test_gpu_visible("test_down_mma")) return NF_TEST_SKIP;
    check_refusals();
    // the routed down of Qwen3-30B-A3B (16 of its experts, a divisor each)
    for (uint32_t T : {1u, 3u, 8u}) {
        run_case({16, 2048, 768, 16, T, 8, false});
        run_case({16, 2048, 768, 16, T, 8, true});
    }
    run_case({16, 2048, 768, 16, 1, 1, true});              // one position: most warps idle
    run_case({16, 2048, 768, 16, 4, 8, true, true});        // skew: a group of 4 positions + the rest
    Case cancel{16, 2048, 768, 16, 3, 8, true};             // the output is the kernel's error
    cancel.cancel = true;
    run_case(cancel);
    run_case({16, 512, 1024, 16, 4, 8, true, false, true}); // cancel at the bound's largest I
    // H = 200: the last tile clamps; D = 25 shares of 128 rows cross the experts
    run_case({16, 200, 256, 25, 16, 4, true, true});        // T = 16: MAXT 16, a group of 16 positions
    run_case({16, 200, 384, 5, 3, 6, false});               // 3 chunks: uneven warp shares
    run_case({16, 200, 384, 25, 8, 2, true, true, true});   // skew (two passes) and cancel
    run_case({4, 256, 256, 8, 2, 2, false, true});           // 4 experts, 2 divisors each
    // bf16 banks (64-element chunks; D only sets the row amplitudes)
    for (uint32_t T : {1u, 3u, 8u}) {
        run_case(bf16w({16, 2048, 768, 16, T, 8, false}));
        run_case(bf16w({16, 2048, 768, 16, T, 8, true}));
    }
    run_case(bf16w({16, 2048, 768, 16, 1, 1, true}));              // one position: most warps idle
    run_case(bf16w({16, 2048, 768, 16, 4, 8, true, true}));        // skew
    run_case(bf16w(cancel));
    run_case(bf16w({16, 512, 1024, 16, 4, 8, true, false, true})); // cancel at the bound's largest I
    run_case(bf16w({16, 200, 256, 25, 16, 4, true, true}));        // T = 16, H not a multiple of 16
    run_case(bf16w({16, 200, 320, 5, 3, 6, false}));               // 5 chunks: uneven warp shares
    run_case(bf16w({16, 200, 64, 5, 8, 2, true, true, true}));     // one chunk; skew and cancel
    return nf_test_report();
}

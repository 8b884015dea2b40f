// The int8-activation GEMV (gemv_a8.cu) for every codec it takes (q4_k, q5_k, q6_k, q8_0, and the
// import-only iq4_xs, iq4_nl, q3_k from random valid blocks: tests/common/import_blocks.h), plain
// (the decoder's dense layers and LM head) and GLU (the sparse-MoE gate/up), against a double
// reference over the dequantized weights and the activations quantised as the kernel does.
//
// Reference: x~ = d q per 32-element block, d = max|x| / 127 in f32, q = rint(x / d) (the kernel's
// stage_q8, bit for bit; nf_test_quantize_a8). The kernel's integer sums are exact, so
// it differs from sum_i w_i x~_i only by fp32 rounding: a few roundings per span product (scale
// products, the fma), a per-lane chain of at most cols / 64 spans, a 5-level warp sum. With
// u = 2^-24 that is below 32 u sum_i |w_i x~_i| at these shapes; the test allows
//     |gpu - ref| <= 2^-16 sum_i |w_i x~_i|        (plain; 8x that estimate)
// and for GLU out = silu(g) u the first-order propagation of the same allowance on g and u plus the
// product's rounding. A wrong scale, sub-block, bit plane or row is off by a sizeable fraction of
// sum |w x~|, thousands of times the allowance.
//
// Shapes: an odd row count (the plain kernel's last warp has one row), a second expert selected (row
// addressing), T in {1, 3, 8, 13} (one pass of MAXT tokens, several), 4096-wide rows (two spans per
// lane in flight, plain and GLU), 16384-wide rows at T = 13 (shared memory holds 4 tokens: several
// staging passes), the decode route's early staging, and a matrix with more row blocks than one wave
// of CTAs (the plain kernel's grid-stride loop) at T = 1 and 13. Guard columns past the rows must
// stay untouched. Plain at T > 1 also runs with its input quantised beforehand (launch_mmq_quant,
// padded, as the decoder's dense layers do): the same bits required. The segments kernel (q / k / v
// of one input in one launch) at T = 1 .. 16 against one launch per matrix: the same bits.
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <vector>

#include "backend/cuda/sparse_moe/internal.cuh"
#include "backend/cuda/sparse_moe/quant_a8.cuh"

extern "C" {
#include "codec/codec.h"
#include "common/cuda_test_util.h"
#include "common/import_blocks.h"
}
#include "nf_test.h"
#include "common/need_gpu.h"

namespace {

uint64_t rng = 0x2545F4914F6CDD1Dull;
float nrand() { return nf_test_nrand(&rng); }
uint16_t f2bf(float f) { return nf_test_f2bf(f); }
float bf2f(uint16_t h) { return nf_test_bf2f(h); }

struct Case {
    int codec;
    bool glu;
    uint32_t rows, cols; // rows per expert (GLU: gate rows then up rows)
    uint32_t T;
    bool early = false; // T = 1: the input row is row 0, quantised before the grid-dependency wait
    bool pre = false;   // plain: again with the input quantised by launch_mmq_quant (padded), the same bits
    bool q8 = false;    // GLU, T > 1: again with the outputs quantised in the kernel (GemvLaunch::aq)
};

// The plain product again with the input rows quantised once by launch_mmq_quant into the staged
// layout (GemvLaunch::xq, the decoder's dense layers at 1 < T <= 16): the CTAs copy instead of
// quantising, so every output must carry the same bits as the in-kernel staging's.
bool same_bits_prequantised(const Case &c, const nf::DevMat &W, const uint16_t *dx, const nf::Groups &g, float *dout,
                            uint32_t stride, const std::vector<float> &got)
{
    int8_t *dq = nullptr;
    float2 *dd = nullptr;
    bool ok = cudaMalloc(&dq, (size_t)c.T * nf::a8_stride(c.cols)) == cudaSuccess &&
              cudaMalloc(&dd, (size_t)c.T * (c.cols / 32) * sizeof(float2)) == cudaSuccess;
    cudaMemset(dout, 0xFF, (size_t)c.T * stride * 4);
    const nf::GemvLaunch opt{nf::NextMat{nullptr, 0}, false, false, true, true, dq, dd};
    cudaError_t e = ok ? nf::launch_mmq_quant(dx, true, c.T, c.cols, dq, dd, 0, true, false) : cudaErrorMemoryAllocation;
    if (e == cudaSuccess) e = nf::launch_gemv_a8(c.codec, false, W, dx, c.cols, g, dout, stride, c.T, opt, 0);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    std::vector<float> pre(got.size());
    cudaMemcpy(pre.data(), dout, pre.size() * 4, cudaMemcpyDeviceToHost);
    cudaFree(dq);
    cudaFree(dd);
    return e == cudaSuccess && memcmp(pre.data(), got.data(), got.size() * 4) == 0;
}

// GLU with the outputs quantised by the kernel (GemvLaunch::aq, ad: what the small-token down copies):
// every int8 value and (d, d sum q) pair must be the quantisation of the f32 outputs got (the W·A8
// quantiser written out on the host: nf_test_quantize_a8's rule, bit for bit).
bool same_bits_q8out(const Case &c, const nf::DevMat &W, const uint16_t *dx, const nf::Groups &g, uint32_t stride,
                     const std::vector<float> &got)
{
    const uint32_t I = c.rows / 2, qs = nf::a8_stride(I);
    int8_t *dq = nullptr;
    float2 *dd = nullptr;
    bool ok = cudaMalloc(&dq, (size_t)c.T * qs) == cudaSuccess &&
              cudaMalloc(&dd, (size_t)c.T * (I / 32) * sizeof(float2)) == cudaSuccess;
    std::vector<int8_t> q((size_t)c.T * qs);
    std::vector<float2> d((size_t)c.T * (I / 32));
    if (ok) ok = cudaMemset(dq, 0, q.size()) == cudaSuccess;
    const nf::GemvLaunch opt{nf::NextMat{nullptr, 0}, false, false, true, true, nullptr, nullptr, dq, dd};
    cudaError_t e = ok ? nf::launch_gemv_a8(c.codec, true, W, dx, c.cols, g, nullptr, stride, c.T, opt, 0)
                       : cudaErrorMemoryAllocation;
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e == cudaSuccess) cudaMemcpy(q.data(), dq, q.size(), cudaMemcpyDeviceToHost);
    if (e == cudaSuccess) cudaMemcpy(d.data(), dd, d.size() * sizeof(float2), cudaMemcpyDeviceToHost);
    cudaFree(dq);
    cudaFree(dd);
    size_t bad = 0;
    for (uint32_t t = 0; e == cudaSuccess && t < c.T; t++)
        for (uint32_t b = 0; b < I / 32; b++) {
            const float *x = &got[(size_t)t * stride + 32 * b];
            float am = 0.f;
            for (int i = 0; i < 32; i++) am = fmaxf(am, fabsf(x[i]));
            const float dv = am / 127.0f;
            int sum = 0;
            for (uint32_t i = 0; i < 32; i++) {
                const int qi = am > 0.f ? (int)rintf(x[i] / dv) : 0;
                sum += qi;
                bad += q[(size_t)t * qs + nf::a8_at(32 * b + i)] != (int8_t)qi;
            }
            const float2 w = d[(size_t)t * (I / 32) + b];
            bad += memcmp(&w.x, &dv, 4) != 0;
            const float ds = dv * (float)sum;
            bad += memcmp(&w.y, &ds, 4) != 0;
        }
    if (e != cudaSuccess) printf("  q8 out: %s\n", cudaGetErrorString(e));
    return e == cudaSuccess && bad == 0;
}

double silu(double g) { return g / (1.0 + exp(-g)); }

void run_case(const Case &c)
{
    const uint32_t E = 2, R = E * c.rows, pick = 1; // expert 1 is the one multiplied
    const nf_codec *cod = nf_codec_get((nf_codec_id)c.codec);
    const size_t rb = nf_codec_row_bytes(cod, c.cols);
    std::vector<uint8_t> payload(R * rb);
    std::vector<float> w(c.cols), deq((size_t)c.rows * c.cols);
    for (uint32_t r = 0; r < R; r++) {
        const float amp = 0.02f * (1.0f + (float)(r % 5)); // rows of different scales
        if (cod->flags & NF_CODEC_IMPORT_ONLY) // no quantizer: random valid blocks of about that std
            nf_test_import_blocks(c.codec, &payload[r * rb], c.cols / cod->block_elems, amp, &rng);
        else {
            for (uint32_t i = 0; i < c.cols; i++) w[i] = nrand() * amp;
            cod->quantize_row(w.data(), &payload[r * rb], c.cols);
        }
        if (r / c.rows == pick) cod->dequantize_row(&payload[r * rb], &deq[(size_t)(r % c.rows) * c.cols], c.cols);
    }
    // activations: blocks of different amplitudes, one all-zero block per token
    std::vector<uint16_t> xb((size_t)c.T * c.cols);
    std::vector<float> xf(xb.size()), xq(xb.size());
    for (uint32_t t = 0; t < c.T; t++)
        for (uint32_t i = 0; i < c.cols; i++) {
            const uint32_t blk = i / 32;
            const float amp = blk == (t * 7 + 3) % (c.cols / 32) ? 0.0f : ldexpf(1.0f, (int)(blk % 9) - 4);
            xb[(size_t)t * c.cols + i] = f2bf(nrand() * amp);
            xf[(size_t)t * c.cols + i] = bf2f(xb[(size_t)t * c.cols + i]);
        }
    for (uint32_t t = 0; t < c.T; t++) nf_test_quantize_a8(&xf[(size_t)t * c.cols], c.cols, &xq[(size_t)t * c.cols]);

    nf_moe_matrix mm;
    memset(&mm, 0, sizeof mm);
    mm.codec = c.codec;
    mm.data = payload.data();
    mm.experts = E;
    mm.rows = c.rows;
    mm.cols = c.cols;
    mm.divisors = 1;
    nf_error err;
    size_t bytes = 0;
    uint8_t *dw = nullptr;
    nf::DevMat W;
    const bool up = nf::devmat_bytes(&mm, "w", &bytes, &err) == NF_OK && cudaMalloc(&dw, bytes) == cudaSuccess &&
                    nf::devmat_upload(&mm, dw, &W, "w", &err) == NF_OK;
    CHECK_MSG(up, "upload: %s", err.msg);
    if (!up) {
        cudaFree(dw);
        return;
    }

    const uint32_t out_rows = c.glu ? c.rows / 2 : c.rows, guard = 8, stride = out_rows + guard;
    uint16_t *dx;
    float *dout;
    int32_t *dg; // n, expert, start, count
    const int32_t gh[4] = {1, (int32_t)pick, 0, (int32_t)c.T};
    CHECK(cudaMalloc(&dx, xb.size() * 2) == cudaSuccess);
    CHECK(cudaMalloc(&dout, (size_t)c.T * stride * 4) == cudaSuccess);
    CHECK(cudaMalloc(&dg, sizeof gh) == cudaSuccess);
    cudaMemcpy(dx, xb.data(), xb.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dg, gh, sizeof gh, cudaMemcpyHostToDevice);
    cudaMemset(dout, 0xFF, (size_t)c.T * stride * 4); // NaN everywhere: unwritten outputs show
    const nf::Groups g{dg, dg + 1, dg + 2, dg + 3, nullptr, 1, 1};
    // groups_ready as the decoder launches its dense layers (the tables exist before the launch)
    const nf::GemvLaunch opt{nf::NextMat{nullptr, 0}, false, c.early, true, !c.glu, nullptr, nullptr};
    CHECK(nf::gemv_a8_supported(c.codec, W));
    cudaError_t e = nf::launch_gemv_a8(c.codec, c.glu, W, dx, c.cols, g, dout, stride, c.T, opt, 0);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    CHECK_MSG(e == cudaSuccess, "launch: %s", cudaGetErrorString(e));
    std::vector<float> got((size_t)c.T * stride);
    cudaMemcpy(got.data(), dout, got.size() * 4, cudaMemcpyDeviceToHost);

    size_t bad = 0, guard_bad = 0;
    double worst = 0;
    for (uint32_t t = 0; t < c.T; t++) {
        const float *x = &xq[(size_t)t * c.cols];
        auto dot = [&](uint32_t r, double &abs) {
            double s = 0;
            abs = 0;
            for (uint32_t i = 0; i < c.cols; i++) {
                const double p = (double)deq[(size_t)r * c.cols + i] * x[i];
                s += p;
                abs += fabs(p);
            }
            return s;
        };
        for (uint32_t r = 0; r < out_rows; r++) {
            double ref, lim, a1, a2;
            if (c.glu) {
                const double gv = dot(r, a1), uv = dot(r + out_rows, a2);
                const double eg = ldexp(a1, -16), eu = ldexp(a2, -16), sig = 1.0 / (1.0 + exp(-gv));
                const double dsilu = sig * (1.0 + gv * (1.0 - sig)); // |silu'| <= 1.1
                ref = silu(gv) * uv;
                lim = 1.1 * fabs(dsilu) * fabs(uv) * eg + 1.1 * (fabs(silu(gv)) + eg) * eu + ldexp(fabs(ref), -22) +
                      1e-30;
            } else {
                ref = dot(r, a1);
                lim = ldexp(a1, -16) + 1e-30;
            }
            const double d = fabs((double)got[(size_t)t * stride + r] - ref);
            if (!(d <= lim)) bad++;
            if (d / lim > worst || !(d == d)) worst = d == d ? d / lim : INFINITY;
        }
        for (uint32_t r = out_rows; r < stride; r++) {
            uint32_t bits;
            memcpy(&bits, &got[(size_t)t * stride + r], 4);
            if (bits != 0xFFFFFFFFu) guard_bad++;
        }
    }
    printf("  %-5s %-5s rows %5u cols %5u T %2u%s: worst %.3f of the allowance, %zu outside\n", cod->name,
           c.glu ? "glu" : "plain", c.rows, c.cols, c.T, c.early ? " (early)" : "", worst, bad);
    CHECK_MSG(bad == 0, "%s %s rows %u cols %u T %u: %zu outputs outside the allowance (worst %.2f x)", cod->name,
              c.glu ? "glu" : "plain", c.rows, c.cols, c.T, bad, worst);
    CHECK_MSG(guard_bad == 0, "%s: %zu guard columns written", cod->name, guard_bad);
    if (c.q8) {
        const bool same = same_bits_q8out(c, W, dx, g, stride, got);
        printf("  %-5s glu   rows %5u cols %5u T %2u, outputs quantised in the kernel: %s\n", cod->name, c.rows, c.cols,
               c.T, same ? "same bits" : "DIFFERENT");
        CHECK_MSG(same, "%s glu cols %u T %u: the kernel's int8 outputs are not the f32 outputs quantised", cod->name,
                  c.cols, c.T);
    }
    if (c.pre) {
        const bool same = same_bits_prequantised(c, W, dx, g, dout, stride, got);
        printf("  %-5s plain rows %5u cols %5u T %2u, input quantised beforehand: %s\n", cod->name, c.rows, c.cols,
               c.T, same ? "same bits" : "DIFFERENT");
        CHECK_MSG(same, "%s plain cols %u T %u: the pre-quantised input changes the output", cod->name, c.cols, c.T);
    }
    cudaFree(dw);
    cudaFree(dx);
    cudaFree(dout);
    cudaFree(dg);
}

// The segments kernel (q / k / v of one input in one launch) against one plain launch per matrix
// at the same T (T = 1: both quantise in the kernel; T > 1: both take the rows quantised by
// launch_mmq_quant): every output bit equal, in a shared output row of stride out_stride.
void segs_case(const int (&codecs)[3], const uint32_t (&rows)[3], uint32_t cols, uint32_t T)
{
    const uint32_t stride = rows[0] + rows[1] + rows[2] + 5;
    std::vector<uint8_t *> dws;
    nf::A8Seg seg[3];
    std::vector<uint16_t> xb((size_t)T * cols);
    for (auto &v : xb) v = f2bf(nrand() * 0.5f);
    float *dout = nullptr, *dref = nullptr;
    uint16_t *dx = nullptr;
    int8_t *dq = nullptr;
    float2 *dd = nullptr;
    int32_t *dg = nullptr;
    const int32_t gh[4] = {1, 0, 0, (int32_t)T};
    bool ok = cudaMalloc(&dout, (size_t)T * stride * 4) == cudaSuccess && cudaMalloc(&dref, (size_t)T * stride * 4) == cudaSuccess &&
              cudaMalloc(&dx, xb.size() * 2) == cudaSuccess && cudaMalloc(&dq, (size_t)T * nf::a8_stride(cols)) == cudaSuccess &&
              cudaMalloc(&dd, (size_t)T * (cols / 32) * sizeof(float2)) == cudaSuccess && cudaMalloc(&dg, sizeof gh) == cudaSuccess;
    CHECK(ok);
    if (!ok) return;
    cudaMemcpy(dx, xb.data(), xb.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dg, gh, sizeof gh, cudaMemcpyHostToDevice);
    cudaMemset(dout, 0xFF, (size_t)T * stride * 4);
    cudaMemset(dref, 0xFF, (size_t)T * stride * 4);
    uint32_t off = 0;
    for (int i = 0; i < 3; i++) {
        const nf_codec *cod = nf_codec_get((nf_codec_id)codecs[i]);
        const size_t rb = nf_codec_row_bytes(cod, cols);
        std::vector<uint8_t> payload(rows[i] * rb);
        std::vector<float> w(cols);
        for (uint32_t r = 0; r < rows[i]; r++) {
            for (auto &v : w) v = nrand() * 0.03f;
            cod->quantize_row(w.data(), &payload[r * rb], cols);
        }
        nf_moe_matrix mm;
        memset(&mm, 0, sizeof mm);
        mm.codec = codecs[i], mm.data = payload.data(), mm.experts = 1, mm.rows = rows[i], mm.cols = cols, mm.divisors = 1;
        nf_error err;
        size_t bytes = 0;
        uint8_t *dw = nullptr;
        const bool up = nf::devmat_bytes(&mm, "w", &bytes, &err) == NF_OK && cudaMalloc(&dw, bytes) == cudaSuccess &&
                        nf::devmat_upload(&mm, dw, &seg[i].W, "w", &err) == NF_OK;
        CHECK_MSG(up, "upload: %s", err.msg);
        dws.push_back(dw);
        seg[i].codec = codecs[i];
        seg[i].out = dout + off;
        off += rows[i];
    }
    cudaError_t e = T > 1 ? nf::launch_mmq_quant(dx, true, T, cols, dq, dd, 0, true, false) : cudaSuccess;
    const nf::Groups g{dg, dg + 1, dg + 2, dg + 3, nullptr, 1, 1};
    const nf::GemvLaunch opt{nf::NextMat{nullptr, 0}, false, false, true, true, T > 1 ? dq : nullptr, T > 1 ? dd : nullptr};
    for (int i = 0; i < 3 && e == cudaSuccess; i++)
        e = nf::launch_gemv_a8(codecs[i], false, seg[i].W, dx, cols, g, dref + (seg[i].out - dout), stride, T, opt, 0);
    const bool sup = nf::gemv_a8_segs_supported(seg, 3, T);
    CHECK_MSG(sup, "segments %d/%d/%d cols %u T %u not supported", codecs[0], codecs[1], codecs[2], cols, T);
    if (e == cudaSuccess) e = nf::launch_gemv_a8_segs(seg, 3, dx, T, dq, dd, stride, false, 0);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    CHECK_MSG(e == cudaSuccess, "segments: %s", cudaGetErrorString(e));
    std::vector<float> got((size_t)T * stride), ref(got.size());
    cudaMemcpy(got.data(), dout, got.size() * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(ref.data(), dref, ref.size() * 4, cudaMemcpyDeviceToHost);
    const bool same = memcmp(got.data(), ref.data(), got.size() * 4) == 0; // guard columns stay NaN in both
    printf("  segments %s/%s/%s rows %u/%u/%u cols %u T %2u against one launch each: %s\n",
           nf_codec_get((nf_codec_id)codecs[0])->name, nf_codec_get((nf_codec_id)codecs[1])->name,
           nf_codec_get((nf_codec_id)codecs[2])->name, rows[0], rows[1], rows[2], cols, T, same ? "same bits" : "DIFFERENT");
    CHECK_MSG(same, "segments cols %u T %u differ from one launch per matrix", cols, T);
    for (uint8_t *dw : dws) cudaFree(dw);
    cudaFree(dout), cudaFree(dref), cudaFree(dx), cudaFree(dq), cudaFree(dd), cudaFree(dg);
}

} // namespace

int main(void)
{
    if (!nf_test_gpu_visible("test_gemv_a8")) return NF_TEST_SKIP;
    const int codecs[] = {NF_CODEC_Q4_K,  NF_CODEC_Q5_K,   NF_CODEC_Q6_K, NF_CODEC_Q8_0,
                          NF_CODEC_IQ4_XS, NF_CODEC_IQ4_NL, NF_CODEC_Q3_K};
    for (int codec : codecs) {
        for (uint32_t T : {1u, 3u, 8u, 13u}) {
            run_case({codec, false, 1001, 512, T, false, T > 1});
            run_case({codec, true, 2 * 300, 512, T});
        }
        run_case({codec, false, 37, 4096, 1});      // long rows: two spans per lane in flight (NS = 2)
        run_case({codec, true, 2 * 300, 4096, 1});  // the same for GLU
        run_case({codec, true, 2 * 300, 4096, 13});
        for (uint32_t T : {2u, 8u, 13u}) // the small-token gate/up before an int8 down: outputs quantised
            run_case({codec, true, 2 * 320, 512, T, false, false, true});
        run_case({codec, true, 2 * 768, 2048, 16, false, false, true}); // qwen3-30b-a3b's expert shape
        run_case({codec, true, 2 * 300, 512, 1, true}); // the decode route's early staging
        run_case({codec, false, 37, 16384, 13, false, true}); // 4 tokens staged per pass: the chunk loop
        run_case({codec, false, 300, 4096, 16, false, true});  // the dense layers' largest small T
        run_case({codec, false, 40001, 256, 1});    // more row blocks than a wave: the grid-stride loop
        run_case({codec, false, 40001, 256, 13});
    }
    for (uint32_t T : {1u, 3u, 8u, 13u, 16u}) // the decoder's q / k / v (2048 columns: one span in flight)
        segs_case({NF_CODEC_Q4_K, NF_CODEC_Q4_K, NF_CODEC_Q6_K}, {300, 64, 64}, 2048, T);
    segs_case({NF_CODEC_Q4_K, NF_CODEC_Q5_K, NF_CODEC_Q6_K}, {129, 64, 33}, 4096, 1); // two spans in flight
    segs_case({NF_CODEC_Q8_0, NF_CODEC_Q4_K, NF_CODEC_Q6_K}, {40, 17, 64}, 512, 3);
    return nf_test_report();
}

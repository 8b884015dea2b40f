// The int8-activation span arithmetic of gemv_a8.cu (spans_a8.cuh), run on the CPU: every span
// policy's load and dot over the kernels' row-planar layout (devmat_host, the same repacking the
// upload does) against the codecs' own dequantization in double. Needs nvcc to build, no GPU to
// run (label cpu), so CI checks the bit manipulation that test_gemv_a8 checks on the device.
//
// Activations are int8 per 32-element block with scale d (xd = (d, d * sum q)), x~ = d q. The span
// code's integer sums are exact; it differs from sum_i w_i x~_i only by fp32 rounding: a few
// roundings per span (scale products, the fma) and here one chain over all of a row's spans (at most
// 32 for these shapes), below 2^-17 sum_i |w_i x~_i|. The test allows 2^-16 sum |w x~|: a wrong
// scale, sub-block, bit plane or offset is off by a sizeable fraction of sum |w x~|.
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <vector>

#include "backend/cuda/sparse_moe/internal.cuh"
#include "backend/cuda/sparse_moe/spans_a8.cuh"

extern "C" {
#include "codec/codec.h"
#include "common/cuda_test_util.h"
#include "common/import_blocks.h"
}
#include "nf_test.h"

namespace {

uint64_t rng = 0x51ED270B2B1C4A3Dull;
float nrand() { return nf_test_nrand(&rng); }

constexpr int MAXT = 3; // tokens per dot call (the kernels' MAXT > 1 form; nt = 1 uses the first)

template <class SP>
void check(int codec, uint32_t cols)
{
    const uint32_t R = 37;
    const nf_codec *c = nf_codec_get((nf_codec_id)codec);
    const size_t rb = nf_codec_row_bytes(c, cols);
    std::vector<uint8_t> payload(R * rb);
    std::vector<float> w(cols), deq((size_t)R * cols);
    for (uint32_t r = 0; r < R; r++) {
        const float amp = 0.02f * (1.0f + (float)(r % 5));
        if (c->flags & NF_CODEC_IMPORT_ONLY) // no quantizer: random valid blocks (every field's bits)
            nf_test_import_blocks(codec, &payload[r * rb], cols / c->block_elems, amp, &rng);
        else {
            for (uint32_t i = 0; i < cols; i++) w[i] = nrand() * amp;
            c->quantize_row(w.data(), &payload[r * rb], cols);
        }
        c->dequantize_row(&payload[r * rb], &deq[(size_t)r * cols], cols);
    }
    nf_moe_matrix mm;
    memset(&mm, 0, sizeof mm);
    mm.codec = codec;
    mm.data = payload.data();
    mm.experts = 1;
    mm.rows = R;
    mm.cols = cols;
    mm.divisors = 1;
    nf::DevMat W;
    std::vector<uint8_t> host(R * (rb + 16));
    nf_error err;
    const bool ok = nf::devmat_host(&mm, host.data(), &W, &err) == NF_OK;
    CHECK_MSG(ok, "%s", err.msg);
    if (!ok) return;
    // activations: int8 values over the full range, block scales over 2^-6 .. 2^2, one zero block
    std::vector<int8_t> xq((size_t)MAXT * nf::a8_stride(cols)); // the kernels' padded layout
    std::vector<float2> xd((size_t)MAXT * cols / 32);
    for (int t = 0; t < MAXT; t++)
        for (uint32_t b = 0; b < cols / 32; b++) {
            const float d = b == (uint32_t)(t * 5 + 1) % (cols / 32) ? 0.0f : ldexpf(1.0f, (int)((b + t) % 9) - 6);
            int sum = 0;
            for (uint32_t i = 0; i < 32; i++) {
                int q = (int)lrintf(nrand() * 50.0f);
                q = q > 127 ? 127 : q < -127 ? -127 : q;
                if (i == b % 32) q = b % 2 ? 127 : -127; // the extremes occur
                xq[(size_t)t * nf::a8_stride(cols) + nf::a8_at(b * 32 + i)] = (int8_t)q;
                sum += q;
            }
            xd[(size_t)t * cols / 32 + b] = make_float2(d, d * (float)sum);
        }
    const int spans = (int)(cols / SP::kSpanElems);
    size_t bad = 0;
    double worst = 0;
    for (uint32_t r = 0; r < R; r++)
        for (int nt = 1; nt <= MAXT; nt += MAXT - 1) {
            float acc[MAXT] = {};
            for (int s = 0; s < spans; s++) SP::template dot<MAXT>(SP::load(W, 0, r, s), s, xq.data(), xd.data(), cols, nt, acc);
            for (int t = 0; t < nt; t++) {
                double ref = 0, abs = 0;
                for (uint32_t i = 0; i < cols; i++) {
                    const double x = (double)xd[(size_t)t * cols / 32 + i / 32].x * xq[(size_t)t * nf::a8_stride(cols) + nf::a8_at(i)];
                    ref += (double)deq[(size_t)r * cols + i] * x;
                    abs += fabs((double)deq[(size_t)r * cols + i] * x);
                }
                const double lim = ldexp(abs, -16) + 1e-30, d = fabs((double)acc[t] - ref);
                if (!(d <= lim)) bad++;
                worst = fmax(worst, d / lim);
            }
            for (int t = nt; t < MAXT; t++) bad += acc[t] != 0.0f; // tokens past nt are not touched
        }
    printf("  %-5s cols %4u: %d spans a row, worst %.3f of the allowance, %zu outside\n", c->name, cols, spans, worst, bad);
    CHECK_MSG(bad == 0, "%s cols %u: %zu dots outside 2^-16 sum|w x| (worst %.2f x)", c->name, cols, bad, worst);
}

} // namespace

int main(void)
{
    check<nf::SpanIQ4NL>(NF_CODEC_IQ4_NL, 64); // iq4_nl rows need only cols % 64 == 0
    for (uint32_t cols : {256u, 2048u}) {
        check<nf::SpanQ4K>(NF_CODEC_Q4_K, cols);
        check<nf::SpanQ5K>(NF_CODEC_Q5_K, cols);
        check<nf::SpanQ6K>(NF_CODEC_Q6_K, cols);
        check<nf::SpanQ8>(NF_CODEC_Q8_0, cols);
        check<nf::SpanIQ4XS>(NF_CODEC_IQ4_XS, cols);
        check<nf::SpanIQ4NL>(NF_CODEC_IQ4_NL, cols);
        check<nf::SpanQ3K>(NF_CODEC_Q3_K, cols);
    }
    return nf_test_report();
}

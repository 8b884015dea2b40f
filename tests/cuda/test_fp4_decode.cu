// The nvfp4 -> bf16 tensor-core operand decode of gemv_mma.cu (fp4_mma.cuh), exhaustively on the
// host (built by nvcc, runs without a GPU): every nibble pair at each of the four pair positions
// of a word, against every non-NaN e4m3 scale byte, under 67 fillings of the other nibbles: none,
// all ones, a mixed word, and every single bit set alone and cleared alone (so a mask that lets a
// neighbour into the multiply, or a carry out of one, shows). fp4_pair is the kernel's own code on
// both sides (mask, integer multiply, mask; only the bf16x2 multiply is emulated here). Each half must
// equal e2m1 * e4m3 * 2^-8 from the CPU codec (nf_e2m1_to_f32, nf_e4m3_to_f32), exactly: the kernel's
// numerics rest on that product being exact. The scale operand itself is checked for every byte.
//
// What this cannot check: the device's mul.rn.bf16x2 on the subnormal bf16 that e2m1 0.5 decodes
// to (the host multiplies in f32); test_gemv_mma covers that on a GPU.
//
// Also here, because it needs no GPU: the fused tensor-core down's admission (down_mma.cu): its
// shared memory holds the hi and lo columns of every position (2 T k columns of 2 I + 64 bytes) plus
// the work list, and down_mma_supported_within refuses the shapes it does not take and what exceeds
// the limit (an H200's 227 KB: T = 8, k = 8, I = 768 fits, T = 16 does not), for nvfp4 (chunks of
// 128) and bf16 (chunks of 64) banks.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "backend/cuda/sparse_moe/fp4_mma.cuh"
#include "backend/cuda/sparse_moe/internal.cuh"

extern "C" {
#include "codec/codec.h"
#include "codec/nvfp4.h"
}
#include "nf_test.h"

namespace {

float half_value(uint32_t v, int h)
{
    const uint32_t u = ((v >> (16 * h)) & 0xFFFFu) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint32_t pair(int q, uint32_t w, uint32_t s2)
{
    switch (q) {
    case 0: return nf::fp4_pair<0>(w, s2);
    case 1: return nf::fp4_pair<1>(w, s2);
    case 2: return nf::fp4_pair<2>(w, s2);
    default: return nf::fp4_pair<3>(w, s2);
    }
}

void check_scales()
{
    size_t bad = 0;
    for (uint32_t b = 0; b < 256; b++) {
        if ((b & 0x7F) == 0x7F) continue; // NaN bytes never reach the kernel (bind validates)
        const uint32_t s2 = nf::fp4_scale2(b);
        const double want = ldexp((double)nf_e4m3_to_f32((uint8_t)b), 118);
        for (int h = 0; h < 2; h++)
            if ((double)half_value(s2, h) != want) bad++;
    }
    CHECK_MSG(bad == 0, "fp4_scale2: %zu halves differ from e4m3 * 2^118", bad);
}

void check_pairs()
{
    constexpr int kFills = 3 + 2 * 32;
    uint32_t fills[kFills] = {0x00000000u, 0xFFFFFFFFu, 0x5A3C96E1u};
    for (int i = 0; i < 32; i++) fills[3 + 2 * i] = 1u << i, fills[4 + 2 * i] = ~(1u << i);
    size_t bad = 0, checked = 0;
    for (int q = 0; q < 4; q++)
        for (uint32_t nib = 0; nib < 256; nib++) { // low nibble: element q, high nibble: element q + 4
            const uint32_t lo = nib & 0xF, hi = nib >> 4;
            for (int f = 0; f < kFills; f++) {
                uint32_t w = fills[f];
                w &= ~((0xFu << (4 * q)) | (0xFu << (4 * q + 16)));
                w |= (lo << (4 * q)) | (hi << (4 * q + 16));
                for (uint32_t b = 0; b < 256; b++) {
                    if ((b & 0x7F) == 0x7F) continue;
                    const uint32_t v = pair(q, w, nf::fp4_scale2(b));
                    const double s = nf_e4m3_to_f32((uint8_t)b);
                    const double want_lo = ldexp(nf_e2m1_to_f32((uint8_t)lo) * s, -8);
                    const double want_hi = ldexp(nf_e2m1_to_f32((uint8_t)hi) * s, -8);
                    if ((double)half_value(v, 0) != want_lo || (double)half_value(v, 1) != want_hi) {
                        if (bad < 5)
                            printf("  q %d nibbles %x/%x fill %08x scale %02x: got %g/%g want %g/%g\n", q, lo, hi,
                                   fills[f], b, (double)half_value(v, 0), (double)half_value(v, 1), want_lo,
                                   want_hi);
                        bad++;
                    }
                    checked++;
                }
            }
        }
    printf("fp4 decode: %zu pairs checked, %zu wrong\n", checked, bad);
    CHECK_MSG(bad == 0, "fp4_pair: %zu of %zu decodes differ from e2m1 * e4m3 * 2^-8", bad, checked);
}

void check_down_mma_admission()
{
    const size_t h200 = 232448; // cudaDevAttrMaxSharedMemoryPerBlockOptin of sm_90
    size_t bad = 0;
    for (uint32_t I : {128u, 768u, 1024u, 4096u})
        for (uint32_t k : {1u, 2u, 4u, 8u, 16u})
            for (uint32_t T = 1; T <= 16; T++) {
                const size_t P = (size_t)T * k, cols = 2 * P * (2 * I + 64), got = nf::down_mma_smem(T, k, I);
                // the staged columns, the work list (16 bytes a position), weights and tokens (8); the
                // warps' per-token sums that reuse the staged columns' space (16 warps x 16 tokens x 16
                // rows x 4 bytes at most) may exceed them
                if (got < cols + 24 * P || got > cols + 24 * P + 16384 + 64) {
                    if (bad < 5)
                        printf("  down_mma_smem(T %u, k %u, I %u) = %zu, staged columns %zu\n", T, k, I, got, cols);
                    bad++;
                }
            }
    CHECK_MSG(bad == 0, "down_mma_smem: %zu shapes outside [staged columns + work list, + 16 KB]", bad);
    CHECK(nf::down_mma_smem(0, 8, 768) == 0 && nf::down_mma_smem(17, 8, 768) == 0);

    nf::DevMat W;
    memset(&W, 0, sizeof W);
    static const uint8_t planes[16] = {};
    static const float divisors[1] = {1.0f};
    W.data = planes;
    W.scales = planes;
    W.divisors = divisors;
    W.rows = 2048;
    W.cols = 768;
    CHECK(nf::down_mma_supported_within(NF_CODEC_NVFP4, W, 1, 8, h200));
    CHECK(nf::down_mma_supported_within(NF_CODEC_NVFP4, W, 4, 8, h200));
    CHECK(nf::down_mma_supported_within(NF_CODEC_NVFP4, W, 8, 8, h200));
    CHECK(!nf::down_mma_supported_within(NF_CODEC_NVFP4, W, 16, 8, h200)); // 409 600 bytes of staged columns
    CHECK(nf::down_mma_supported_within(NF_CODEC_NVFP4, W, 16, 4, h200)); // 64 positions: 204 800 + the work list
    CHECK(!nf::down_mma_supported_within(NF_CODEC_NVFP4, W, 0, 8, h200));
    CHECK(!nf::down_mma_supported_within(NF_CODEC_NVFP4, W, 17, 1, h200));
    CHECK(!nf::down_mma_supported_within(NF_CODEC_NVFP4, W, 4, 8, 100 * 1024)); // a smaller part (100 KB a block)
    nf::DevMat V = W;
    V.cols = 256;
    CHECK(nf::down_mma_supported_within(NF_CODEC_NVFP4, V, 16, 8, h200)); // 128 positions of 256
    V.cols = 704; // not a multiple of the 128-element chunk
    CHECK(!nf::down_mma_supported_within(NF_CODEC_NVFP4, V, 1, 8, h200));
    V.cols = 64;
    CHECK(!nf::down_mma_supported_within(NF_CODEC_NVFP4, V, 1, 8, h200));
    V = W;
    V.scales = nullptr;
    CHECK(!nf::down_mma_supported_within(NF_CODEC_NVFP4, V, 1, 8, h200));
    V = W;
    V.rows = 0;
    CHECK(!nf::down_mma_supported_within(NF_CODEC_NVFP4, V, 1, 8, h200));

    // bf16 banks: chunks of 64, no scale planes; the same shared memory
    nf::DevMat B;
    memset(&B, 0, sizeof B);
    B.data = planes;
    B.rows = 2048;
    B.cols = 768;
    B.row_stride = 2 * 768;
    CHECK(nf::down_mma_supported_within(NF_CODEC_BF16, B, 8, 8, h200));
    CHECK(!nf::down_mma_supported_within(NF_CODEC_BF16, B, 16, 8, h200));
    CHECK(!nf::down_mma_supported_within(NF_CODEC_NVFP4, B, 1, 8, h200)); // no scales
    B.cols = 704, B.row_stride = 2 * 704; // 11 chunks of 64: bf16 only
    CHECK(nf::down_mma_supported_within(NF_CODEC_BF16, B, 1, 8, h200));
    B.cols = 64, B.row_stride = 128;
    CHECK(nf::down_mma_supported_within(NF_CODEC_BF16, B, 1, 8, h200));
    B.cols = 96, B.row_stride = 192;
    CHECK(!nf::down_mma_supported_within(NF_CODEC_BF16, B, 1, 8, h200));
    CHECK(!nf::down_mma_supported_within(NF_CODEC_Q8_0, W, 1, 8, h200)); // other codecs: decode.cu
}

} // namespace

int main(void)
{
    check_scales();
    check_pairs();
    check_down_mma_admission();
    return nf_test_report();
}

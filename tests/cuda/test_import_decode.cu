// The device decoders of the import-only GGUF codecs (dev_codecs_import.cuh: q2_k, q3_k, iq4_xs,
// iq4_nl), run on the CPU (built by nvcc, no GPU needed: label cpu): each codec's row() / load() /
// decode() / elem() over the kernels' row-planar layout (devmat_host, the repacking the upload does)
// against the CPU decoder (the codec table's dequantize_row) on random valid blocks
// (tests/common/import_blocks.h), BIT FOR BIT: the device codecs perform the CPU's float operations
// in the CPU's order (products through mul_rn, never contracted). Every element of every row must be
// written exactly once by the pieces' runs (the output starts as NaN; a second write is counted),
// over rows of one block, several blocks, and lengths whose rows need padding to 16 bytes.
// Crafted blocks add the extremes random bytes rarely hit together: every quant and scale field all
// ones, all zeros, and the f16 scales negative and subnormal.
//
// What this cannot check: the device's __byte_perm (emulated here from its documented selector
// semantics, bits 0-2 of each nibble; the callers mask bit 3) and that the kernels call the codecs
// as the interface says; test_sparse_moe covers both on a GPU.
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <vector>

#include "backend/cuda/sparse_moe/dev_codecs_import.cuh"
#include "backend/cuda/sparse_moe/internal.cuh"

extern "C" {
#include "codec/codec.h"
#include "common/import_blocks.h"
}
#include "nf_test.h"

extern "C" const int8_t nf_iq4_values[16]; // src/codec/iq4.c: the CPU decoders' table

namespace {

uint64_t rng = 0x243F6A8885A308D3ull;

// fill: 0 random blocks, 1 every byte 0xFF, 2 every byte 0x00; the f16 scales set after (d_bits)
void fill(int codec, uint8_t *p, size_t nblocks, int mode)
{
    nf_test_import_blocks(codec, p, nblocks, 0.05f, &rng);
    if (mode == 0) return;
    const nf_codec *c = nf_codec_get((nf_codec_id)codec);
    for (size_t b = 0; b < nblocks; b++) {
        uint8_t *blk = p + b * c->block_bytes;
        uint8_t keep[4];
        const int at = codec == NF_CODEC_Q2_K ? 80 : codec == NF_CODEC_Q3_K ? 108 : 0;
        const int n = codec == NF_CODEC_Q2_K ? 4 : 2;
        memcpy(keep, blk + at, n);
        memset(blk, mode == 1 ? 0xFF : 0x00, c->block_bytes);
        memcpy(blk + at, keep, n);
        // odd blocks: negative scales (sign bit), every third: a subnormal f16 (0x0123)
        if (b % 2) blk[at + 1] |= 0x80;
        if (b % 3 == 0) blk[at] = 0x23, blk[at + 1] = (uint8_t)((blk[at + 1] & 0x80) | 0x01);
    }
}

template <class C>
void check(int codec, uint32_t cols, int mode)
{
    const uint32_t R = 7;
    const nf_codec *c = nf_codec_get((nf_codec_id)codec);
    const size_t rb = nf_codec_row_bytes(c, cols), nb = cols / c->block_elems;
    std::vector<uint8_t> payload(R * rb);
    fill(codec, payload.data(), R * nb, mode);
    std::vector<float> want((size_t)R * cols);
    for (uint32_t r = 0; r < R; r++) c->dequantize_row(&payload[r * rb], &want[(size_t)r * cols], cols);
    nf_moe_matrix mm;
    memset(&mm, 0, sizeof mm);
    mm.codec = codec;
    mm.data = payload.data();
    mm.experts = 1;
    mm.rows = R;
    mm.cols = cols;
    mm.divisors = 1;
    size_t bytes = 0;
    nf_error err;
    CHECK(nf::devmat_bytes(&mm, "m", &bytes, &err) == NF_OK);
    std::vector<uint8_t> host(bytes + 16);
    nf::DevMat W;
    const bool ok = nf::devmat_host(&mm, host.data(), &W, &err) == NF_OK;
    CHECK_MSG(ok, "%s", err.msg);
    if (!ok) return;
    CHECK_MSG(W.row_stride % 16 == 0 && W.row_stride >= rb && W.row_stride < rb + 16, "%s: row stride %llu for %zu bytes",
              c->name, (unsigned long long)W.row_stride, rb);
    size_t diff = 0, twice = 0, missed = 0, first = SIZE_MAX;
    const int pieces = (int)(cols / C::BLK) * C::PIECES;
    std::vector<float> got(cols);
    for (uint32_t r = 0; r < R; r++) {
        for (float &v : got) v = NAN;
        const typename C::Row row = C::row(W, 0, r);
        for (int q = 0; q < pieces; q++) {
            float w[C::PE];
            C::decode(row, C::load(row, q), q, w);
            for (int run = 0; run < C::RUNS; run++)
                for (int i = 0; i < C::RUN; i++) {
                    float &dst = got[C::elem(q, run) + i];
                    if (!isnan(dst)) twice++;
                    dst = w[run * C::RUN + i];
                }
        }
        for (uint32_t i = 0; i < cols; i++) {
            const float g = got[i], x = want[(size_t)r * cols + i];
            if (isnan(g)) missed++;
            else if (memcmp(&g, &x, 4) != 0 && !diff++) first = (size_t)r * cols + i;
        }
    }
    printf("%-6s cols %4u %-7s: %zu weights, %zu differ from the CPU decoder, %zu written twice, %zu not written\n",
           c->name, cols, mode == 0 ? "random" : mode == 1 ? "ones" : "zeros", (size_t)R * cols, diff, twice, missed);
    CHECK_MSG(diff == 0, "%s cols %u: weight %zu (row %zu, element %zu) differs from the CPU's", c->name, cols, first,
              first / cols, first % cols);
    CHECK_MSG(twice == 0 && missed == 0, "%s cols %u: the pieces' runs do not cover each element once", c->name, cols);
}

// The byte-permute table lookup against the CPU's table, every nibble in every position.
void check_lookup()
{
    size_t bad = 0;
    for (uint32_t s = 0; s < 65536; s++) {
        const uint32_t t = nf::iq4_lookup(s);
        for (int n = 0; n < 4; n++)
            if ((int)((t >> (8 * n)) & 0xFF) - 128 != nf_iq4_values[(s >> (4 * n)) & 0xF]) bad++;
    }
    printf("iq4 table lookup: %zu of %u entries wrong\n", bad, 4u * 65536);
    CHECK(bad == 0);
}

} // namespace

int main(void)
{
    check_lookup();
    for (int mode = 0; mode < 3; mode++) {
        for (uint32_t cols : {256u, 768u, 2816u}) { // 2816: q3_k rows of 11 blocks, padded
            check<nf::CQ2K>(NF_CODEC_Q2_K, cols, mode);
            check<nf::CQ3K>(NF_CODEC_Q3_K, cols, mode);
            check<nf::CIQ4XS>(NF_CODEC_IQ4_XS, cols, mode);
        }
        for (uint32_t cols : {32u, 96u, 256u, 800u})
            check<nf::CIQ4NL>(NF_CODEC_IQ4_NL, cols, mode);
    }
    return nf_test_report();
}

// The decoder's attention on the GPU (nf::dec::attention) against attn_reference (double) under
// attn_worst's bound (tests/common/attn_ref.h). Prefill (splits = 1, T >= 16): the tensor-core kernel
// for head dims 64 and 128 (q and P rounded to bf16: the reference rounds q, the bound has the P
// term), the CUDA-core one for the rest. Decode and small chunks: the CUDA-core split kernel (q and p
// in f32: reference q unrounded, no P term), every split count the engine picks from 1 to 32, of
// which a token uses ceil(keys / 256) (the rest exit): the cases put the context below, at and past
// that edge and at 1 .. 32 splits in use, and each case is launched twice: the second must give the
// same bits (the last split CTA resets its ticket; a stale ticket would skip or repeat the merge).
// Cache rows past pos0 + T are NaN (a read of one shows), the output row past T is a guard that must
// stay untouched. test_attn_mma checks the tensor-core kernel's fragment arithmetic on the host; this
// one the kernels themselves (cp.async staging, ldmatrix, the MMAs, the shuffles, PDL launch, the grid).
//
// Prefill cases: qwen3-30b-a3b geometry (32 q heads on 4 kv heads, hd 128) for a 512-token prefill
// and a later chunk (T 200 at pos0 333); 4 on 2 heads, hd 128, T 70 at pos0 30 (a tile of 6 rows); hd
// 64 as the engine test's qwen3_moe_256 (2 on 1 head, chunks of 16 at pos0 48) and T 130 at pos0 100;
// hd 96 through the CUDA-core fallback. Decode cases: the qwen3 geometry at T = 1 around the 32-key
// block edges and at long contexts, T = 3, and hd 64, 96 (a partial pair set) and 256 (V in two groups).
// The decode step's fused form (the attention doing qk norm + rope + cache store itself) against
// qkv_rope_store + the plain form, to the bit (check_rope_case).
//
// Paged KV: every case reads its cache through a page table (ops.cuh Batch): the sequence's pages
// are laid into the pool in reverse order behind a spare page that stays NaN, with the page size
// cycling through 16, 32, 64 and 128 positions from case to case, so a slot computed wrongly (a page
// off by one, a slot off by one, the identity table) reads NaN or another position's key.
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <vector>

#include "backend/cuda/decoder/ops.cuh"

extern "C" {
#include "common/attn_ref.h"
#include "common/cuda_test_util.h"
}
#include "nf_test.h"
#include "common/need_gpu.h"

namespace {

uint64_t rng = 0x2545F4914F6CDD1Dull;
int page_case = 0; // cycles the page size

// One sequence of T tokens at pos0 over a page pool: page p of the sequence is pool page
// n_pages - p (pool page 0 is spare), pt positions a page. Builds the pool from a contiguous cache
// [ctx][kv_row] and the device tables; tiles (the tile kernel) when `tiles`, else every token to the
// split kernel.
struct Paged {
    uint32_t pt = 0, shift = 0, n_pages = 0, n_dec = 0, n_tiles = 0;
    int32_t *dtab = nullptr;
    nf::dec::Batch b{};

    uint32_t slot(uint32_t p) const { return (n_pages - p / pt) * pt + p % pt; }
    size_t pool_rows() const { return (size_t)(n_pages + 1) * pt; }

    bool init(uint32_t T, uint32_t pos0, uint32_t ctx, bool tiles, uint32_t rows)
    {
        static const uint32_t sizes[4] = {16, 32, 64, 128};
        pt = sizes[page_case++ % 4];
        while ((1u << shift) < pt) shift++;
        n_pages = (ctx + pt - 1) / pt;
        std::vector<int32_t> h;
        const size_t o_pos = T, o_seq = 2 * (size_t)T, o_dtok = 3 * (size_t)T, o_tiles = (4 * (size_t)T + 3) & ~(size_t)3;
        const size_t n_t = (T + rows - 1) / rows, o_last = o_tiles + 4 * n_t, o_pages = o_last + 1;
        h.assign(o_pages + n_pages, 0);
        for (uint32_t t = 0; t < T; t++) h[o_pos + t] = (int32_t)(pos0 + t), h[o_seq + t] = 0;
        if (tiles)
            for (uint32_t t = 0; t < T; t += rows) {
                const int32_t tl[4] = {(int32_t)t, (int32_t)(T - t < rows ? T - t : rows), 0, (int32_t)(pos0 + t)};
                for (int i = 0; i < 4; i++) h[o_tiles + 4 * n_tiles + i] = tl[i];
                n_tiles++;
            }
        else
            for (uint32_t t = 0; t < T; t++) h[o_dtok + n_dec++] = (int32_t)t;
        h[o_last] = (int32_t)T - 1;
        for (uint32_t p = 0; p < n_pages; p++) h[o_pages + p] = (int32_t)(n_pages - p);
        if (cudaMalloc(&dtab, h.size() * 4) != cudaSuccess ||
            cudaMemcpy(dtab, h.data(), h.size() * 4, cudaMemcpyHostToDevice) != cudaSuccess)
            return false;
        b = nf::dec::Batch{dtab, dtab + o_pos, dtab + o_seq, dtab + o_dtok, reinterpret_cast<const int4 *>(dtab + o_tiles),
                           dtab + o_last, reinterpret_cast<const uint32_t *>(dtab + o_pages), n_pages, shift};
        return true;
    }
    // the pool (NaN outside the sequence's rows) from a contiguous cache of `rows` rows
    std::vector<uint16_t> pool(const std::vector<uint16_t> &c, uint32_t rows, uint32_t kv_row) const
    {
        std::vector<uint16_t> p(pool_rows() * kv_row, 0x7FC0);
        for (uint32_t r = 0; r < rows; r++)
            for (uint32_t i = 0; i < kv_row; i++) p[(size_t)slot(r) * kv_row + i] = c[(size_t)r * kv_row + i];
        return p;
    }
    ~Paged() { cudaFree(dtab); }
};

void check_case(uint32_t hd, uint32_t heads, uint32_t kv_heads, uint32_t T, uint32_t pos0, uint32_t splits = 1)
{
    // the tensor-core path rounds q and P to bf16 (attention.cu); the others keep them in f32
    const int mma = splits == 1 && T >= 16 && (hd == 64 || hd == 128);
    const attn_case c = {hd, heads, kv_heads, T, pos0, (heads + 2 * kv_heads) * hd}; // q as in the qkv buffer
    const uint32_t kv_row = kv_heads * hd, ctx = pos0 + T + 64;
    std::vector<float> q((size_t)T * c.q_stride);
    for (auto &v : q) v = 2.0f * nf_test_nrand(&rng);
    std::vector<uint16_t> kc((size_t)ctx * kv_row, 0x7FC0), vc(kc.size(), 0x7FC0); // rows >= pos0 + T: NaN
    for (size_t i = 0; i < (size_t)(pos0 + T) * kv_row; i++) {
        kc[i] = nf_test_f2bf(nf_test_nrand(&rng));
        vc[i] = nf_test_f2bf(nf_test_nrand(&rng) * (1.0f + (float)(i % 3)));
    }
    Paged pg;
    const bool tiles = splits == 1 && T >= nf::dec::kAttnTileMin;
    bool ok = pg.init(T, pos0, ctx, tiles, nf::dec::attention_tile_rows(hd, c.q_stride));
    const std::vector<uint16_t> kp = pg.pool(kc, ctx, kv_row), vp = pg.pool(vc, ctx, kv_row);
    const size_t out_n = (size_t)(T + 1) * heads * hd;
    float *dq = nullptr;
    uint16_t *dk = nullptr, *dv = nullptr, *dout = nullptr;
    float *dpart = nullptr;
    unsigned *dticket = nullptr;
    ok = ok && cudaMalloc(&dq, q.size() * 4) == cudaSuccess && cudaMalloc(&dk, kp.size() * 2) == cudaSuccess &&
              cudaMalloc(&dv, vp.size() * 2) == cudaSuccess && cudaMalloc(&dout, out_n * 2) == cudaSuccess &&
              cudaMalloc(&dpart, (size_t)T * heads * splits * (hd + 2) * 4) == cudaSuccess &&
              cudaMalloc(&dticket, (size_t)T * heads * 4) == cudaSuccess;
    ok = ok && cudaMemcpy(dq, q.data(), q.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess &&
         cudaMemcpy(dk, kp.data(), kp.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess &&
         cudaMemcpy(dv, vp.data(), vp.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess &&
         cudaMemset(dout, 0xFF, out_n * 2) == cudaSuccess && cudaMemset(dticket, 0, (size_t)T * heads * 4) == cudaSuccess;
    std::vector<uint16_t> out(out_n), again(out_n);
    for (int run = 0; run < 2 && ok; run++) {
        ok = run == 0 || cudaMemset(dout, 0xFF, out_n * 2) == cudaSuccess; // a launch that skips the merge shows
        const nf::dec::AttnArgs a{dq, c.q_stride, dk, dv, dout, dpart, dticket, heads, kv_heads, hd, splits};
        const cudaError_t e = nf::dec::attention(a, pg.b, pg.n_dec, pg.n_tiles, 0);
        CHECK_MSG(e == cudaSuccess, "hd %u T %u: launch: %s", hd, T, cudaGetErrorString(e));
        const cudaError_t s = cudaDeviceSynchronize();
        CHECK_MSG(s == cudaSuccess, "hd %u T %u: run: %s", hd, T, cudaGetErrorString(s));
        ok = e == cudaSuccess && s == cudaSuccess &&
             cudaMemcpy((run ? again : out).data(), dout, out_n * 2, cudaMemcpyDeviceToHost) == cudaSuccess;
    }
    if (ok) CHECK_MSG(out == again, "hd %u T %u pos0 %u splits %u: a second launch gave other bits", hd, T, pos0, splits);
    CHECK_MSG(ok, "hd %u T %u pos0 %u: device setup or run failed", hd, T, pos0);
    if (ok) {
        std::vector<double> ref((size_t)T * heads * hd);
        attn_reference(&c, q.data(), kc.data(), vc.data(), mma, ref.data());
        const double worst = attn_worst(&c, out.data(), ref.data(), vc.data(), mma);
        bool guard = true;
        for (size_t i = (size_t)T * heads * hd; i < out_n; i++) guard = guard && out[i] == 0xFFFF;
        printf("  hd %3u, %2u q heads on %u, T %3u at pos0 %4u, %2u splits, pages of %3u: worst %.3f of the bound\n", hd,
               heads, kv_heads, T, pos0, splits, pg.pt, worst);
        CHECK_MSG(worst <= 1.0, "hd %u T %u pos0 %u: %.3f of the bound", hd, T, pos0, worst);
        CHECK_MSG(guard, "hd %u T %u pos0 %u: the row past T was written", hd, T, pos0);
    }
    cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dout), cudaFree(dpart), cudaFree(dticket);
}

// The decode step's fused form (AttnArgs::rope, T = 1): from the projections row as the q/k/v GEMV
// wrote it, the attention rotates q and stores the new position's k and v itself. It must give the
// same bits as qkv_rope_store followed by the plain attention (which check_case holds to the
// reference): the output and the cache row, for every q head of a kv group storing that row. Random
// rotations, norm weights and biases (the kernels take any table); each form launched twice.
void check_rope_case(uint32_t hd, uint32_t heads, uint32_t kv_heads, uint32_t pos0, uint32_t splits, bool norm,
                     bool bias, uint32_t rd = 0)
{
    if (!rd) rd = hd; // full rotary
    const uint32_t half = rd / 2, S = (heads + 2 * kv_heads) * hd, kv_row = kv_heads * hd, ctx = pos0 + 8;
    std::vector<float> row(S), rope((size_t)ctx * half * 2), qn(hd), kn(hd), qb(heads * hd), kb(kv_row), vb(kv_row);
    for (auto &v : row) v = 2.0f * nf_test_nrand(&rng);
    for (size_t i = 0; i < rope.size(); i += 2) {
        const float ang = 3.0f * nf_test_nrand(&rng);
        rope[i] = cosf(ang), rope[i + 1] = sinf(ang);
    }
    for (auto *v : {&qn, &kn, &qb, &kb, &vb})
        for (auto &x : *v) x = 1.0f + 0.5f * nf_test_nrand(&rng);
    std::vector<uint16_t> lin((size_t)ctx * kv_row, 0x7FC0); // rows >= pos0: NaN until stored
    for (size_t i = 0; i < (size_t)pos0 * kv_row; i++) lin[i] = nf_test_f2bf(nf_test_nrand(&rng));
    Paged pg;
    bool ok = pg.init(1, pos0, ctx, false, 1);
    const std::vector<uint16_t> cache = pg.pool(lin, ctx, kv_row);
    const size_t at = (size_t)pg.slot(pos0) * kv_row; // the new position's pool row
    const size_t out_n = (size_t)heads * hd;
    float *d[8] = {};
    const size_t fl[8] = {S, rope.size(), hd, hd, qb.size(), kb.size(), vb.size(), (size_t)heads * splits * (hd + 2)};
    uint16_t *kc = nullptr, *vc = nullptr, *out = nullptr;
    unsigned *ticket = nullptr;
    for (int i = 0; i < 8; i++) ok = ok && cudaMalloc(&d[i], fl[i] * 4) == cudaSuccess;
    ok = ok && cudaMalloc(&kc, cache.size() * 2) == cudaSuccess && cudaMalloc(&vc, cache.size() * 2) == cudaSuccess &&
         cudaMalloc(&out, out_n * 2) == cudaSuccess && cudaMalloc(&ticket, heads * 4) == cudaSuccess;
    const std::vector<float> *src[7] = {&row, &rope, &qn, &kn, &qb, &kb, &vb};
    for (int i = 0; ok && i < 7; i++) ok = cudaMemcpy(d[i], src[i]->data(), fl[i] * 4, cudaMemcpyHostToDevice) == cudaSuccess;
    ok = ok && cudaMemset(ticket, 0, heads * 4) == cudaSuccess;
    // [form][run]: the attention output, then the k and v cache rows at pos0
    std::vector<uint16_t> got[2][2];
    for (int fused = 0; fused < 2 && ok; fused++)
        for (int run = 0; run < 2 && ok; run++) {
            ok = cudaMemcpy(d[0], row.data(), S * 4, cudaMemcpyHostToDevice) == cudaSuccess && // q in place: restore
                 cudaMemcpy(kc, cache.data(), cache.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess &&
                 cudaMemcpy(vc, cache.data(), cache.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess &&
                 cudaMemset(out, 0xFF, out_n * 2) == cudaSuccess;
            const nf::dec::QkvArgs qa{d[0], S, bias ? d[4] : nullptr, bias ? d[5] : nullptr, bias ? d[6] : nullptr,
                                      norm ? d[2] : nullptr, norm ? d[3] : nullptr, kc, vc,
                                      reinterpret_cast<const float2 *>(d[1]), heads, kv_heads, hd, 1e-6f, rd};
            if (!fused) nf::dec::qkv_rope_store(qa, pg.b, 1, 0);
            const nf::dec::AttnArgs a{d[0], S, kc, vc, out, d[7], ticket, heads, kv_heads, hd, splits, fused != 0, qa};
            const cudaError_t e = nf::dec::attention(a, pg.b, 1, 0, 0);
            ok = e == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess;
            CHECK_MSG(ok, "rope hd %u splits %u fused %d: %s", hd, splits, fused, cudaGetErrorString(cudaGetLastError()));
            std::vector<uint16_t> &g = got[fused][run];
            g.resize(out_n + 2 * kv_row);
            ok = ok && cudaMemcpy(g.data(), out, out_n * 2, cudaMemcpyDeviceToHost) == cudaSuccess &&
                 cudaMemcpy(g.data() + out_n, kc + at, kv_row * 2, cudaMemcpyDeviceToHost) == cudaSuccess &&
                 cudaMemcpy(g.data() + out_n + kv_row, vc + at, kv_row * 2, cudaMemcpyDeviceToHost) ==
                     cudaSuccess;
        }
    CHECK_MSG(ok, "rope hd %u pos0 %u splits %u: device setup or run failed", hd, pos0, splits);
    if (ok) {
        bool finite = true;
        for (uint16_t v : got[0][0]) finite = finite && (v & 0x7F80) != 0x7F80;
        const bool same = got[1][0] == got[0][0], again = got[1][1] == got[1][0] && got[0][1] == got[0][0];
        printf("  rope fused: hd %3u (rotary %3u), %2u q heads on %u at pos0 %4u, %2u splits, norm %d bias %d: same bits %s\n", hd,
               rd, heads, kv_heads, pos0, splits, norm, bias, same ? "yes" : "NO");
        CHECK_MSG(finite, "rope hd %u pos0 %u: the unfused output or cache row is not finite", hd, pos0);
        CHECK_MSG(same, "rope hd %u pos0 %u splits %u: fused attention differs from qkv_rope_store + attention", hd,
                  pos0, splits);
        CHECK_MSG(again, "rope hd %u pos0 %u splits %u: a second launch gave other bits", hd, pos0, splits);
    }
    for (auto *p : d) cudaFree(p);
    cudaFree(kc), cudaFree(vc), cudaFree(out), cudaFree(ticket);
}

} // namespace

int main(void)
{
    if (!nf_test_gpu_visible("test_attention_cuda")) return NF_TEST_SKIP;
    check_case(128, 32, 4, 512, 0);
    check_case(128, 32, 4, 200, 333);
    check_case(128, 4, 2, 70, 30);
    for (uint32_t p = 0; p < 64; p += 16) check_case(64, 2, 1, 16, p);
    check_case(64, 8, 2, 130, 100);
    check_case(96, 4, 2, 40, 10);
    check_case(256, 16, 2, 70, 30); // the hybrids' gated attention: 16 q heads on 2 of 256, CUDA-core tiles
    const uint32_t split_counts[] = {1, 2, 9, 32};
    for (uint32_t sp : split_counts)
        for (uint32_t pos0 : {0u, 31u, 32u, 127u, 128u, 255u, 256u, 600u}) check_case(128, 32, 4, 1, pos0, sp);
    check_case(128, 32, 4, 1, 4000, 16);
    check_case(128, 32, 4, 1, 8000, 32); // 8001 keys: all 32 splits in use
    check_case(128, 32, 4, 3, 50, 3);
    check_case(64, 2, 1, 1, 48, 2);
    check_case(96, 4, 2, 2, 70, 3);
    check_case(256, 8, 2, 1, 100, 2);
    check_case(256, 8, 2, 2, 40, 1);
    // the fused decode form: the new key in the last split of several in use, in the only one (short
    // contexts: one split of the grid's in use), and in the first; every head dim the kernel takes a
    // form for; with and without qk norm and biases
    for (uint32_t sp : split_counts) check_rope_case(128, 32, 4, 600, sp, true, false);
    check_rope_case(128, 32, 4, 3, 9, true, false);
    check_rope_case(128, 32, 4, 0, 2, true, true);
    check_rope_case(64, 2, 1, 48, 2, false, true);
    check_rope_case(96, 4, 2, 70, 3, true, true);
    check_rope_case(256, 8, 2, 100, 2, true, false);
    // partial rotary (Qwen3-Next / Qwen3.5: 64 of 256 dims; the tiny fixtures' 4 of 16)
    check_rope_case(256, 16, 2, 100, 2, true, false, 64);
    check_rope_case(16, 4, 2, 9, 1, true, false, 4);
    return nf_test_report();
}

// The mmq route's fragment arithmetic (src/backend/cuda/sparse_moe/mmq.cuh) on the CPU, under an
// emulated mma.sync s8 (m16n8k32, and m16n8k16 for q6_k) laid out as the PTX ISA gives it. Needs
// nvcc to build, no GPU to run (label cpu): the kernel's decode was written without a GPU, so this is
// what says its fragments are right before it first runs.
//
// For q4_k, q5_k, q6_k and q8_0 and several row lengths, a tile of 16 weight rows (random quantised
// rows, all-zero rows, and rows of random bytes with crafted f16 scales: the largest finite, the
// smallest normal and subnormal, zero) against 8 positions (random int8 blocks, extremes +-127, an
// all-zero block), staged exactly as mmq.cu stages them (each row's chunks by the policy's chunk map,
// its scale fields once), then:
//   - every A and B element of every fragment comes from exactly one lane's register byte, and the
//     emulated MMA's int32 tile equals, for every group, the scalar dot of the codec's integer quants
//     (unpacked here from the GGUF block by ggml's formulas, independently of mmq.cuh) with the
//     activations' int8 values: exactly;
//   - each group's scales from the staged fields equal the scalar unpack's d * sc and dmin * m: exactly;
//   - the folded f32 result equals the double dot of the CPU decoder's weights (dequantize_row) with
//     the quantised activations d q, within the f32 bound of the fold's chain: each step's rounding
//     is at most u = 2^-24 of its result, so |f32 - exact| <= 1.001 u sum_steps (|term| + |partial|),
//     the model moe_ref.c's W·A8 reference uses for this route (test_sparse_moe's tolerances).
// Strength control: the same tile with group j's scales taken from group j ^ 1 must fail the float
// check (it does, by orders of magnitude), and a fragment with its rows g and g + 8 swapped must fail
// the integer check.
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
#include "nf_test.h"

namespace {

uint64_t rng = 0x2545F4914F6CDD1Dull;
float nrand() { return nf_test_nrand(&rng); }
uint32_t urand() { return (uint32_t)(nf_test_nrand(&rng) * 1e6f) ^ (uint32_t)(rng >> 17); }

constexpr int R = 16, N = 8; // one m16 x n8 tile

// ---- the codecs' integer quants and group scales from the GGUF blocks (ggml's formulas) --------
void scale_min_k4(const uint8_t *q, int j, int &d, int &m)
{
    if (j < 4) d = q[j] & 63, m = q[j + 4] & 63;
    else d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
}

// Row of cols: integer quant of each element (qi), its group's d_s and m_s (the group of GE elements).
void unpack(int codec, const uint8_t *row, uint32_t cols, std::vector<int> &qi, std::vector<float> &ds,
            std::vector<float> &ms)
{
    qi.assign(cols, 0);
    ds.clear();
    ms.clear();
    if (codec == NF_CODEC_Q8_0) {
        for (uint32_t b = 0; b < cols / 32; b++) {
            const uint8_t *blk = row + 34 * b;
            uint16_t h;
            memcpy(&h, blk, 2);
            ds.push_back(nf_f16_to_f32(h));
            ms.push_back(0.0f);
            for (int i = 0; i < 32; i++) qi[32 * b + i] = (int8_t)blk[2 + i];
        }
        return;
    }
    if (codec == NF_CODEC_Q6_K) {
        for (uint32_t b = 0; b < cols / 256; b++) {
            const uint8_t *blk = row + 210 * b, *ql = blk, *qh = blk + 128;
            const int8_t *sc = (const int8_t *)(blk + 192);
            uint16_t h;
            memcpy(&h, blk + 208, 2);
            const float d = nf_f16_to_f32(h);
            for (int n = 0; n < 2; n++)
                for (int l = 0; l < 32; l++) {
                    const uint32_t e = 256 * b + 128 * n;
                    qi[e + l] = ((ql[64 * n + l] & 0xF) | (((qh[32 * n + l] >> 0) & 3) << 4)) - 32;
                    qi[e + l + 32] = ((ql[64 * n + l + 32] & 0xF) | (((qh[32 * n + l] >> 2) & 3) << 4)) - 32;
                    qi[e + l + 64] = ((ql[64 * n + l] >> 4) | (((qh[32 * n + l] >> 4) & 3) << 4)) - 32;
                    qi[e + l + 96] = ((ql[64 * n + l + 32] >> 4) | (((qh[32 * n + l] >> 6) & 3) << 4)) - 32;
                }
            for (int gi = 0; gi < 16; gi++) ds.push_back(d * (float)sc[gi]), ms.push_back(0.0f);
        }
        return;
    }
    const bool q5 = codec == NF_CODEC_Q5_K;
    for (uint32_t b = 0; b < cols / 256; b++) {
        const uint8_t *blk = row + (q5 ? 176 : 144) * b, *sc = blk + 4, *qh = blk + 16, *qs = blk + (q5 ? 48 : 16);
        uint16_t h0, h1;
        memcpy(&h0, blk, 2);
        memcpy(&h1, blk + 2, 2);
        const float d = nf_f16_to_f32(h0), dmin = nf_f16_to_f32(h1);
        for (int s = 0; s < 8; s++) {
            int sv, mv;
            scale_min_k4(sc, s, sv, mv);
            ds.push_back(d * (float)sv);
            ms.push_back(dmin * (float)mv);
            for (int l = 0; l < 32; l++) {
                const uint8_t byte = qs[32 * (s / 2) + l];
                int v = (s & 1) ? byte >> 4 : byte & 0xF;
                if (q5 && (qh[l] >> s) & 1) v += 16;
                qi[256 * b + 32 * s + l] = v;
            }
        }
    }
}

// ---- the emulated MMA: fragments of 32 lanes -> the tile ----------------------------------------
// A [16][GE], B [GE][8] rebuilt from the lanes' registers (PTX ISA layouts, mmq.cuh's header); each
// element must be written once. D = A B in int32, handed back as each lane's 4 accumulators.
template <class C>
bool emulate(const uint32_t (&a)[32][nf::MmqShape<C>::AREGS], const uint32_t (&b)[32][nf::MmqShape<C>::BREGS],
             int (&c)[32][4])
{
    constexpr int K = C::GE;
    int A[16][K], B[K][8], seenA[16][K] = {}, seenB[K][8] = {};
    for (int lane = 0; lane < 32; lane++) {
        const int g = lane / 4, t = lane % 4;
        for (int i = 0; i < nf::MmqShape<C>::AREGS; i++)
            for (int by = 0; by < 4; by++) {
                const int r = g + 8 * (i & 1), k = 16 * (i >> 1) + 4 * t + by;
                A[r][k] = (int8_t)(a[lane][i] >> (8 * by));
                seenA[r][k]++;
            }
        for (int i = 0; i < nf::MmqShape<C>::BREGS; i++)
            for (int by = 0; by < 4; by++) {
                const int k = 16 * i + 4 * t + by;
                B[k][g] = (int8_t)(b[lane][i] >> (8 * by));
                seenB[k][g]++;
            }
    }
    bool once = true;
    for (int r = 0; r < 16; r++)
        for (int k = 0; k < K; k++) once &= seenA[r][k] == 1;
    for (int k = 0; k < K; k++)
        for (int n = 0; n < 8; n++) once &= seenB[k][n] == 1;
    for (int lane = 0; lane < 32; lane++)
        for (int i = 0; i < 4; i++) {
            const int r = lane / 4 + 8 * (i >> 1), n = 2 * (lane % 4) + (i & 1);
            int s = 0;
            for (int k = 0; k < K; k++) s += A[r][k] * B[k][n];
            c[lane][i] = s;
        }
    return once;
}

struct Result {
    size_t int_bad = 0, scale_bad = 0, float_bad = 0, layout_bad = 0;
    double worst = 0; // largest |f32 - exact| / bound
};

// The tile through mmq.cuh as mmq.cu runs it. plant: 0 none, 1 scales of group j ^ 1, 2 rows g and
// g + 8 of the A fragment swapped.
template <class C>
Result run_tile(int codec, uint32_t cols, const std::vector<uint8_t> &payload, const std::vector<float> &deq,
                const std::vector<int8_t> &xq, const std::vector<float2> &xd, int plant)
{
    using S = nf::MmqShape<C>;
    Result res;
    const nf_codec *cc = nf_codec_get((nf_codec_id)codec);
    const size_t rb = nf_codec_row_bytes(cc, cols);
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
    if (nf::devmat_host(&mm, host.data(), &W, &err) != NF_OK) {
        CHECK_MSG(false, "%s", err.msg);
        return res;
    }
    // the scale fields, staged once (rounded up to 16 bytes: must stay inside the padded row)
    const uint32_t mb = (C::meta_bytes(W) + 15) & ~15u;
    CHECK_MSG(C::meta_off(W) % 16 == 0 && C::meta_off(W) + mb <= W.row_stride, "%s: scale fields at %u + %u, row %llu",
              cc->name, C::meta_off(W), mb, (unsigned long long)W.row_stride);
    std::vector<uint8_t> meta(R * mb);
    for (int r = 0; r < R; r++) memcpy(&meta[r * mb], nf::row_ptr(W, 0, r) + C::meta_off(W), mb);
    // per row: integer quants and group scales from the GGUF bytes
    std::vector<std::vector<int>> qi(R);
    std::vector<std::vector<float>> gds(R), gms(R);
    for (int r = 0; r < R; r++) unpack(codec, &payload[r * rb], cols, qi[r], gds[r], gms[r]);

    float acc[32][4] = {};
    double ex[32][4] = {}, bound[32][4] = {};
    std::vector<uint8_t> st(R * S::QS);
    std::vector<int8_t> xs(N * S::XS);
    for (uint32_t kt = 0; kt < cols / C::SLICE; kt++) {
        // stage the slice: each row's QC chunks by the chunk map, each position's SLICE int8 values
        for (int r = 0; r < R; r++)
            for (int c = 0; c < S::QC; c++) {
                const uint32_t off = C::chunk(W, c, kt);
                CHECK(off % 16 == 0 && off + 16 <= W.row_stride);
                memcpy(&st[r * S::QS + 16 * c], nf::row_ptr(W, 0, r) + off, 16);
            }
        for (int n = 0; n < N; n++) memcpy(&xs[n * S::XS], &xq[(size_t)n * cols + kt * C::SLICE], C::SLICE);
        for (int j = 0; j < S::NG; j++) {
            const uint32_t gidx = kt * S::NG + j, e0 = gidx * C::GE; // group index in the row, first element
            uint32_t a[32][S::AREGS], b[32][S::BREGS];
            for (int lane = 0; lane < 32; lane++) {
                const int g = lane / 4, t = lane % 4;
                const uint8_t *q0 = &st[g * S::QS], *q1 = &st[(g + 8) * S::QS];
                if (plant == 2) std::swap(q0, q1);
                nf::mmq_afrag<C>(q0, q1, j, t, a[lane]);
                nf::mmq_bfrag<C>(&xs[g * S::XS], j, t, b[lane]);
            }
            int c[32][4];
            if (!emulate<C>(a, b, c)) res.layout_bad++;
            for (int lane = 0; lane < 32; lane++)
                for (int i = 0; i < 4; i++) {
                    const int r = lane / 4 + 8 * (i >> 1), n = 2 * (lane % 4) + (i & 1);
                    int want = 0;
                    for (int e = 0; e < C::GE; e++) want += qi[r][e0 + e] * xq[(size_t)n * cols + e0 + e];
                    if (c[lane][i] != want) res.int_bad++;
                    float ds, ms;
                    C::scale(&meta[r * mb], W.nb, kt, plant == 1 ? j ^ 1 : j, ds, ms);
                    if (plant == 0 && (memcmp(&ds, &gds[r][gidx], 4) || memcmp(&ms, &gms[r][gidx], 4))) res.scale_bad++;
                    const float2 x = xd[(size_t)n * (cols / 32) + e0 / 32];
                    // the chain bound: the fold's terms and partial sums, as the f32 steps take them
                    const double t1 = (double)ds * x.x * c[lane][i];
                    ex[lane][i] += t1;
                    bound[lane][i] += fabs(t1) + fabs(ex[lane][i]); // fl(d_s d_x): u |t1|; the fma: u |partial|
                    if (C::MINS) {
                        ex[lane][i] -= (double)ms * x.y;
                        bound[lane][i] += fabs((double)ms * x.y) + fabs(ex[lane][i]);
                    }
                    acc[lane][i] = nf::mmq_fold<C>(acc[lane][i], c[lane][i], ds, ms, x);
                }
        }
    }
    // against the CPU decoder's weights: sum_e w_e (d_x q_e) in double; the allowance is the chain
    // bound (each step's rounding, incl. fl(d_s d_x), is at most u of the step's result or term)
    for (int lane = 0; lane < 32; lane++)
        for (int i = 0; i < 4; i++) {
            const int r = lane / 4 + 8 * (i >> 1), n = 2 * (lane % 4) + (i & 1);
            double ref = 0, sx = 0;
            for (uint32_t e = 0; e < cols; e++) {
                const double xv = (double)xd[(size_t)n * (cols / 32) + e / 32].x * xq[(size_t)n * cols + e];
                ref += (double)deq[(size_t)r * cols + e] * xv;
                sx += fabs((double)deq[(size_t)r * cols + e] * xv);
            }
            // the CPU decoder's fl(d_s q - m_s) (k-quants) may differ from d_s q - m_s by u of it, and
            // s_x = fl(d_x sum q) by u of it: both inside u sum|w x~| and u |m_s s_x| per group
            const double lim = 1.001 * ldexp(bound[lane][i] + sx, -24) + 1e-300;
            const double d = fabs((double)acc[lane][i] - ref);
            if (!(d <= lim)) res.float_bad++;
            if (isfinite(d / lim)) res.worst = fmax(res.worst, d / lim);
        }
    return res;
}

// 16 rows: random quantised rows of several amplitudes, an all-zero row, and rows of random bytes
// whose f16 scale fields are set to extremes (the largest finite, smallest normal, smallest
// subnormal, zero) so every field's bits occur; 8 positions of int8 activations with extremes.
template <class C>
void check(int codec, uint32_t cols)
{
    const nf_codec *cc = nf_codec_get((nf_codec_id)codec);
    const size_t rb = nf_codec_row_bytes(cc, cols);
    const uint32_t nb = cols / cc->block_elems;
    std::vector<uint8_t> payload(R * rb);
    std::vector<float> w(cols), deq((size_t)R * cols);
    const uint16_t extremes[] = {0x7BFF, 0x0400, 0x0001, 0x0000, 0x3C00};
    int off[2];
    const int nf_fields = nf_codec_scale_fields(cc, off);
    for (int r = 0; r < R; r++) {
        uint8_t *row = &payload[r * rb];
        if (r < 8) {
            const float amp = r == 7 ? 0.0f : ldexpf(1.0f, 4 * r - 12); // 2^-12 .. 2^12, then zeros
            for (uint32_t i = 0; i < cols; i++) w[i] = nrand() * amp;
            cc->quantize_row(w.data(), row, cols);
        } else {
            for (size_t i = 0; i < rb; i++) row[i] = (uint8_t)urand();
            for (uint32_t b = 0; b < nb; b++)
                for (int f = 0; f < nf_fields; f++) {
                    // the scale: an extreme by row, or a random finite positive / negative f16
                    uint16_t h = extremes[(r + b + f) % 5];
                    if ((r + b) % 3 == 2) h = (uint16_t)(urand() % 0x7C00) | (uint16_t)(f ? 0 : (urand() & 0x8000));
                    memcpy(row + (size_t)b * cc->block_bytes + off[f], &h, 2);
                }
        }
        cc->dequantize_row(row, &deq[(size_t)r * cols], cols);
    }
    // activations: per 32-block a scale 2^-20 .. 2^20 (or 0: an all-zero block), values over the
    // full int8 range with +-127 present
    std::vector<int8_t> xq((size_t)N * cols);
    std::vector<float2> xd((size_t)N * cols / 32);
    for (int n = 0; n < N; n++)
        for (uint32_t b = 0; b < cols / 32; b++) {
            const bool zero = b == (uint32_t)(3 * n + 1) % (cols / 32);
            const float d = zero ? 0.0f : ldexpf(1.0f, (int)((7 * b + 3 * n) % 41) - 20);
            int sum = 0;
            for (int i = 0; i < 32; i++) {
                int q = zero ? 0 : (int)lrintf(nrand() * 60.0f);
                q = q > 127 ? 127 : q < -127 ? -127 : q;
                if (!zero && i == (int)(b + n) % 32) q = (b + n) % 2 ? 127 : -127;
                xq[(size_t)n * cols + 32 * b + i] = (int8_t)q;
                sum += q;
            }
            xd[(size_t)n * cols / 32 + b] = make_float2(d, d * (float)sum);
        }
    const Result r = run_tile<C>(codec, cols, payload, deq, xq, xd, 0);
    printf("  %-5s cols %4u: %zu int sums, %zu scales, %zu f32 folds off (worst %.3f of the chain bound), "
           "%zu fragment layouts broken\n",
           cc->name, cols, r.int_bad, r.scale_bad, r.float_bad, r.worst, r.layout_bad);
    CHECK_MSG(r.layout_bad == 0, "%s cols %u: a fragment element written %s", cc->name, cols, "not exactly once");
    CHECK_MSG(r.int_bad == 0, "%s cols %u: %zu int32 MMA sums differ from the scalar dot", cc->name, cols, r.int_bad);
    CHECK_MSG(r.scale_bad == 0, "%s cols %u: %zu group scales differ from d * sc / dmin * m", cc->name, cols,
              r.scale_bad);
    CHECK_MSG(r.float_bad == 0, "%s cols %u: %zu folds outside the chain bound (worst %.2f x)", cc->name, cols,
              r.float_bad, r.worst);
    // strength controls (the checks must see a planted error)
    const Result p1 = run_tile<C>(codec, cols, payload, deq, xq, xd, 1);
    const Result p2 = run_tile<C>(codec, cols, payload, deq, xq, xd, 2);
    printf("        planted: scales of the neighbouring group -> %zu of %d folds off (worst %.3g x); rows g, g + 8 "
           "swapped -> %zu int sums off\n",
           p1.float_bad, 32 * 4, p1.worst, p2.int_bad);
    CHECK_MSG(p1.float_bad > 0, "%s cols %u: wrong group scales pass the float check", cc->name, cols);
    CHECK_MSG(p2.int_bad > 0, "%s cols %u: swapped fragment rows pass the int check", cc->name, cols);
}

} // namespace

int main(void)
{
    for (uint32_t cols : {256u, 768u, 2048u}) {
        check<nf::MmqQ4K>(NF_CODEC_Q4_K, cols);
        check<nf::MmqQ5K>(NF_CODEC_Q5_K, cols);
        check<nf::MmqQ6K>(NF_CODEC_Q6_K, cols);
        check<nf::MmqQ8>(NF_CODEC_Q8_0, cols);
    }
    check<nf::MmqQ8>(NF_CODEC_Q8_0, 384); // q8_0's slice is 128: rows of 3 slices
    return nf_test_report();
}

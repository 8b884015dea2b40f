// The tensor-core prefill attention's fragment arithmetic on the host (built by nvcc, runs without a
// GPU): the grid of attn_mma_kernel (attention.cu) replayed warp by warp through attn_mma.cuh --
// piece (staging, zero fill), block_kind and row_limit (causality), k_ldsm and v_ldsm (ldmatrix row
// addresses), a_row / a_col and acc_row / acc_col (where the kernel reads Q and writes O),
// scale_mask, row_max, online_update (the S accumulator -> P A-operand packing) -- with ldmatrix
// (.x4, plain and .trans) and mma.m16n8k16 emulated as the PTX ISA lays out their fragments, written
// here independently of the header: ldmatrix gives lane 4g + c row g, elements 2c, 2c + 1 of each
// matrix (transposed: rows 2c, 2c + 1 of column g); the MMA's A reg i holds (row g + 8 (i % 2),
// k 2c + 8 (i / 2) + {0, 1}), B reg i (k 2c + 8 i + {0, 1}, column g), D reg i (row g + 8 (i / 2),
// column 2c + i % 2). What this file repeats of the kernel is only the order of those calls
// (mma_key_block and the key loop), and the quad shuffles.
//
// Against attn_reference (double, q rounded to bf16) under attn_worst's bound (tests/common/attn_ref.h:
// the rounding of P to bf16 and of the output), every output must be within the bound (worst <= 1);
// staged pad columns are NaN, cache rows past pos0 + T are NaN and output rows past T are guards that
// must stay untouched. Two planted mistakes must be caught by more than 10x the bound: the P A regs
// 1 and 2 swapped (P of rows g + 8 paired with keys 8.. of row g), and V read without .trans.
//
// Cases: hd 128, 4 q heads on 2 kv heads, T 70 at pos0 30 (100 keys: a full tile and one of 6
// rows, diagonal blocks straddling 64), T 64 at pos0 0, T 200 at pos0 1; hd 64 T 16 at pos0 5 (the
// engine test's chunk: three warps without rows), T 130 at pos0 100.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "backend/cuda/decoder/attn_mma.cuh"

extern "C" {
#include "common/attn_ref.h"
#include "common/cuda_test_util.h"
}
#include "nf_test.h"

namespace {

namespace fa = nf::dec::fa;

uint64_t rng = 0x9E3779B97F4A7C15ull;

double half_value(uint32_t v, int h) { return nf_test_bf2f((uint16_t)(v >> (16 * h))); }

enum Plant { kNone, kSwapP, kVNoTrans };

// ldmatrix.sync.aligned.m8n8.x4(.trans).b16: lane l gives the row address (element offset off[l])
// of row l % 8 of matrix l / 8; reg m of lane 4g + c is matrix m's (g, 2c), (g, 2c + 1), or
// transposed (2c, g), (2c + 1, g), the first in the lower half.
void ldsm_emulate(const uint16_t *smem, const int (&off)[32], bool trans, uint32_t (&reg)[32][4])
{
    for (int lane = 0; lane < 32; lane++) {
        const int g = lane / 4, c = lane % 4;
        for (int m = 0; m < 4; m++) {
            const uint16_t lo = trans ? smem[off[8 * m + 2 * c] + g] : smem[off[8 * m + g] + 2 * c];
            const uint16_t hi = trans ? smem[off[8 * m + 2 * c + 1] + g] : smem[off[8 * m + g] + 2 * c + 1];
            reg[lane][m] = lo | (uint32_t)hi << 16;
        }
    }
}

// D (f32 per lane) += A B for one mma.m16n8k16 of the warp; the products summed in double, each
// result rounded to f32 as the accumulator holds it.
void mma_emulate(float *const (&d)[32], const uint32_t *const (&a)[32], const uint32_t (&b0)[32],
                 const uint32_t (&b1)[32])
{
    double A[16][16], B[16][8];
    for (int lane = 0; lane < 32; lane++) {
        const int g = lane / 4, c = lane % 4;
        for (int i = 0; i < 4; i++)
            for (int h = 0; h < 2; h++) A[g + 8 * (i % 2)][2 * c + 8 * (i / 2) + h] = half_value(a[lane][i], h);
        for (int h = 0; h < 2; h++) {
            B[2 * c + h][g] = half_value(b0[lane], h);
            B[2 * c + 8 + h][g] = half_value(b1[lane], h);
        }
    }
    for (int lane = 0; lane < 32; lane++) {
        const int g = lane / 4, c = lane % 4;
        for (int i = 0; i < 4; i++) {
            const int r = g + 8 * (i / 2), n = 2 * c + i % 2;
            double s = d[lane][i];
            for (int k = 0; k < 16; k++) s += A[r][k] * B[k][n];
            d[lane][i] = (float)s;
        }
    }
}

// One warp's registers across its 32 lanes.
template <int HD>
struct WarpRegs {
    uint32_t qf[32][HD / 16][4];
    float o[32][HD / 8][4];
    fa::RowState st[32];
    int lim[32][2];
};

// mma_key_block (attention.cu) for the 32 lanes.
template <int HD, bool MASK>
void key_block(const uint16_t *Ks, const uint16_t *Vs, WarpRegs<HD> &w, int kb, float sl2, Plant plant)
{
    static float s[32][fa::kNT][4];
    memset(s, 0, sizeof s);
    int off[32];
    uint32_t b[32][4], b0[32], b1[32];
    float *d[32];
    const uint32_t *a[32];
    for (int kk = 0; kk < HD / 16; kk++)
        for (int np = 0; np < fa::kNT / 2; np++) {
            for (int l = 0; l < 32; l++) off[l] = fa::k_ldsm<HD>(l, np, kk);
            ldsm_emulate(Ks, off, false, b);
            for (int half = 0; half < 2; half++) {
                for (int l = 0; l < 32; l++)
                    d[l] = s[l][2 * np + half], a[l] = w.qf[l][kk], b0[l] = b[l][2 * half], b1[l] = b[l][2 * half + 1];
                mma_emulate(d, a, b0, b1);
            }
        }
    float mx[32][2];
    for (int l = 0; l < 32; l++) {
        fa::scale_mask<MASK>(s[l], l, kb, w.lim[l], sl2);
        fa::row_max(s[l], mx[l]);
    }
    float mq[32][2]; // the quad's max (the kernel's two xor shuffles)
    for (int l = 0; l < 32; l++)
        for (int r = 0; r < 2; r++)
            mq[l][r] = fmaxf(fmaxf(mx[l & ~3][r], mx[(l & ~3) + 1][r]), fmaxf(mx[(l & ~3) + 2][r], mx[(l & ~3) + 3][r]));
    static uint32_t pa[32][fa::kKK][4];
    for (int l = 0; l < 32; l++) {
        fa::online_update(s[l], mq[l], w.st[l], w.o[l], pa[l]);
        if (plant == kSwapP)
            for (int kk = 0; kk < fa::kKK; kk++) {
                const uint32_t t = pa[l][kk][1];
                pa[l][kk][1] = pa[l][kk][2], pa[l][kk][2] = t;
            }
    }
    for (int kk = 0; kk < fa::kKK; kk++)
        for (int dp = 0; dp < HD / 16; dp++) {
            for (int l = 0; l < 32; l++) off[l] = fa::v_ldsm<HD>(l, kk, dp);
            ldsm_emulate(Vs, off, plant != kVNoTrans, b);
            for (int half = 0; half < 2; half++) {
                for (int l = 0; l < 32; l++)
                    d[l] = w.o[l][2 * dp + half], a[l] = pa[l][kk], b0[l] = b[l][2 * half], b1[l] = b[l][2 * half + 1];
                mma_emulate(d, a, b0, b1);
            }
        }
}

// attn_mma_kernel's grid: out [T + 1][heads][hd] (row T a guard).
template <int HD>
void emulate(const attn_case &c, const std::vector<float> &q, const std::vector<uint16_t> &kc,
             const std::vector<uint16_t> &vc, std::vector<uint16_t> &out, Plant plant)
{
    using S = fa::Shape<HD>;
    const int T = (int)c.T, pos0 = (int)c.pos0, n_keys = pos0 + T;
    const uint32_t kv_row = c.kv_heads * HD;
    const float sl2 = fa::score_scale_log2(HD);
    std::vector<uint16_t> Ks(S::kBlock), Vs(S::kBlock);
    static WarpRegs<HD> w;
    for (uint32_t h = 0; h < c.heads; h++)
        for (int t0 = 0; t0 < T; t0 += fa::kRows) {
            const uint32_t kvh = h / (c.heads / c.kv_heads);
            const int n_tile_keys = pos0 + (T < t0 + fa::kRows ? T : t0 + fa::kRows);
            const int n_blocks = (n_tile_keys + fa::kKeys - 1) / fa::kKeys;
            for (int warp = 0; warp < fa::kWarps; warp++) {
                const int tw = t0 + 16 * warp;
                if (tw >= T) continue; // no live row: takes no block, writes nothing
                const int q_first = pos0 + tw, q_last = q_first + 15 < n_keys - 1 ? q_first + 15 : n_keys - 1;
                for (int l = 0; l < 32; l++) {
                    for (int kk = 0; kk < HD / 16; kk++)
                        for (int i = 0; i < 4; i++) {
                            const int t = tw + fa::a_row(l, i), col = 16 * kk + fa::a_col(l, i);
                            uint32_t x = 0, y = 0; // rows past T: zero, not read
                            if (t < T) {
                                const float *qv = q.data() + (size_t)t * c.q_stride + h * HD + col;
                                x = nf_test_f2bf(qv[0]), y = nf_test_f2bf(qv[1]);
                            }
                            w.qf[l][kk][i] = x | y << 16;
                        }
                    memset(w.o[l], 0, sizeof w.o[l]);
                    w.st[l] = fa::RowState{{-INFINITY, -INFINITY}, {0.0f, 0.0f}};
                    for (int r = 0; r < 2; r++) w.lim[l][r] = fa::row_limit(l, r, q_first, n_keys);
                }
                for (int j = 0; j < n_blocks; j++) {
                    const int kb = j * fa::kKeys;
                    std::fill(Ks.begin(), Ks.end(), (uint16_t)0x7FC0); // pads NaN: an ldmatrix there shows
                    std::fill(Vs.begin(), Vs.end(), (uint16_t)0x7FC0);
                    for (int i = 0; i < S::kChunks; i++) {
                        const fa::Piece p = fa::piece<HD>(i, kb, n_tile_keys, kv_row);
                        for (int e = 0; e < 8; e++) {
                            Ks[p.smem + e] = p.ok ? kc[kvh * HD + p.global + e] : 0;
                            Vs[p.smem + e] = p.ok ? vc[kvh * HD + p.global + e] : 0;
                        }
                    }
                    const fa::BlockKind kind = fa::block_kind(kb, q_first, q_last);
                    if (kind == fa::kFull) key_block<HD, false>(Ks.data(), Vs.data(), w, kb, sl2, plant);
                    if (kind == fa::kMasked) key_block<HD, true>(Ks.data(), Vs.data(), w, kb, sl2, plant);
                }
                for (int l = 0; l < 32; l++)
                    for (int r = 0; r < 2; r++) {
                        const int q4 = l & ~3, t = tw + fa::acc_row(l, 2 * r);
                        const float sum = (w.st[q4].l[r] + w.st[q4 + 1].l[r]) + (w.st[q4 + 2].l[r] + w.st[q4 + 3].l[r]);
                        if (t >= T) continue;
                        for (int dt = 0; dt < HD / 8; dt++)
                            for (int e = 0; e < 2; e++)
                                out[((size_t)t * c.heads + h) * HD + 8 * dt + fa::acc_col(l, 2 * r + e)] =
                                    nf_test_f2bf(w.o[l][dt][2 * r + e] * (1.0f / sum));
                    }
            }
        }
}

template <int HD>
void check_case(uint32_t T, uint32_t pos0)
{
    attn_case c = {HD, 4, 2, T, pos0, (4 + 2 * 2) * HD};
    const uint32_t kv_row = c.kv_heads * HD, n = pos0 + T;
    std::vector<float> q((size_t)T * c.q_stride);
    for (auto &v : q) v = 2.0f * nf_test_nrand(&rng); // scores of sd ~2: peaked, not uniform, softmax
    std::vector<uint16_t> kc((size_t)(n + 64) * kv_row, 0x7FC0), vc(kc.size(), 0x7FC0); // rows >= n NaN
    for (size_t i = 0; i < (size_t)n * kv_row; i++) {
        kc[i] = nf_test_f2bf(nf_test_nrand(&rng));
        vc[i] = nf_test_f2bf(nf_test_nrand(&rng) * (1.0f + (float)(i % 3)));
    }
    std::vector<double> ref((size_t)T * c.heads * HD), ref32(ref.size());
    attn_reference(&c, q.data(), kc.data(), vc.data(), 1, ref.data());
    attn_reference(&c, q.data(), kc.data(), vc.data(), 0, ref32.data());
    const size_t row = (size_t)c.heads * HD;
    std::vector<uint16_t> out((T + 1) * row, 0xFFFF);
    emulate<HD>(c, q, kc, vc, out, kNone);
    const double worst = attn_worst(&c, out.data(), ref.data(), vc.data(), 1);
    double dev32 = 0; // against f32 q: the cost of rounding Q (reported, not bounded)
    for (size_t i = 0; i < ref.size(); i++) dev32 = fmax(dev32, fabs(nf_test_bf2f(out[i]) - ref32[i]));
    bool guard = true;
    for (size_t i = T * row; i < out.size(); i++) guard = guard && out[i] == 0xFFFF;
    printf("  hd %3d T %3u pos0 %3u: worst %.3f of the bound; max |out - ref(f32 q)| %.2e\n", HD, T, pos0, worst, dev32);
    CHECK_MSG(worst <= 1.0, "hd %d T %u pos0 %u: %.3f of the bound", HD, T, pos0, worst);
    CHECK_MSG(guard, "hd %d T %u pos0 %u: a row past T was written", HD, T, pos0);
    if (T == 70) {
        std::vector<uint16_t> bad((T + 1) * row, 0xFFFF);
        emulate<HD>(c, q, kc, vc, bad, kSwapP);
        const double p1 = attn_worst(&c, bad.data(), ref.data(), vc.data(), 1);
        std::fill(bad.begin(), bad.end(), (uint16_t)0xFFFF);
        emulate<HD>(c, q, kc, vc, bad, kVNoTrans);
        const double p2 = attn_worst(&c, bad.data(), ref.data(), vc.data(), 1);
        printf("    planted: P regs 1, 2 swapped %.1f, V without .trans %.1f (x the bound)\n", p1, p2);
        CHECK_MSG(p1 > 10 && p2 > 10, "a planted fragment mistake went unseen (%.2f, %.2f)", p1, p2);
    }
}

} // namespace

int main(void)
{
    check_case<128>(70, 30);
    check_case<128>(64, 0);
    check_case<128>(200, 1);
    check_case<64>(16, 5);
    check_case<64>(130, 100);
    check_case<64>(70, 30);
    return nf_test_report();
}

// The fragment arithmetic of the tensor-core row tiles on the host (built by nvcc, runs without a
// GPU): the row formats of mma_rows.cuh (Bf16Rows) and fp4_mma.cuh (Fp4Rows) drive one 16-row tile
// through the code the kernels run -- R::lane, R::load, R::frag, R::a_regs, chunk_mmas' staged B
// addressing, stage_group with R::stage_offset (pair_order, split_hi_lo) --, and an emulation of
// mma.m16n8k16 takes their registers as the PTX ISA lays the fragments out ("Matrix Fragments for
// mma.m16n8k16 with floating point type": lane 4 g + c holds A (row g | g + 8, k 2c, 2c+1 | 2c+8,
// 2c+9) in a0..a3 and B (k 2c, 2c+1 | 2c+8, 2c+9; col g) in b0, b1, the lower k in the lower half;
// D d0..d3 = (row g, cols 2c, 2c+1), (row g+8, same)). The products are summed in double and
// read back through the D layout as gemv_mma.cu's store_tile reads them (bf16 inputs: token n is
// column n; f32: token n is columns 2n (hi) + 2n + 1 (lo)), times its row factor (R::factor_of).
//
// Against a direct dot product of the row with the token in double, every output must agree to
// 1e-12 of sum |w x| (bf16 weights: the products are exact, only the summation order differs; with
// f32 inputs against x = hi + lo computed here with the CPU's bf16 rounding), to 2^-16 of it against
// the f32 x itself (the split's bound), and for nvfp4 to 2^-20 of it against the CPU codec's
// dequantized weights (two f32 roundings in those, two in the factor). A wrong pairing of weight and
// activation groups is off by a sizeable fraction of sum |w x|; two such mistakes are planted
// (bf16 A words taken without pair_order; the staging's group order of a lane-major layout) and must
// be caught by more than 1e-3.
//
// Tiles: bf16 weights of two experts, cols 64 (one chunk), 320 (five) and 2048, the tile's 16 rows
// scattered over both experts (as tile_row does for GLU: rows g and g + 8 of a lane are far apart);
// nvfp4 weights of two experts with two divisor shares (cols 128, 384), the rows crossing shares and
// every 5th row 2^-15 as large (subnormal e4m3 scales); 8 and 5 bf16 tokens (columns past the
// tokens read the last one, as in the kernel), 4 and 3 f32 tokens.
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <vector>

#include "backend/cuda/sparse_moe/fp4_mma.cuh"
#include "backend/cuda/sparse_moe/mma_rows.cuh"

extern "C" {
#include "codec/nvfp4.h"
#include "common/cuda_test_util.h"
}
#include "nf_test.h"

namespace {

uint64_t rng = 0x2545F4914F6CDD1Dull;
float nrand() { return nf_test_nrand(&rng); }

double half_value(uint32_t v, int h) { return nf_test_bf2f((uint16_t)(v >> (16 * h))); }

// A 16-byte-aligned byte buffer.
struct Buf {
    std::vector<uint4> v;
    explicit Buf(size_t bytes) : v((bytes + 15) / 16, make_uint4(0, 0, 0, 0)) {}
    uint8_t *p() { return reinterpret_cast<uint8_t *>(v.data()); }
};

// One lane's operands of one chunk, as chunk_mmas hands them to the MMA.
struct LaneOps {
    uint32_t a[8][4], b[8][2];
    int n;
};
struct Recorder {
    LaneOps *o;
    NF_HD void operator()(int m, const uint32_t (&a)[4], uint32_t b0, uint32_t b1) const
    {
        for (int i = 0; i < 4; i++) o->a[m][i] = a[i];
        o->b[m][0] = b0, o->b[m][1] = b1;
        o->n = m + 1;
    }
};

// D += A B for MMA m of the 32 lanes (the fragment layout in the header).
void mma_emulate(const LaneOps (&lanes)[32], int m, double (&D)[16][8])
{
    double A[16][16], B[16][8];
    for (int lane = 0; lane < 32; lane++) {
        const int g = lane / 4, c = lane % 4;
        const uint32_t *a = lanes[lane].a[m], *b = lanes[lane].b[m];
        for (int h = 0; h < 2; h++) {
            A[g][2 * c + h] = half_value(a[0], h);
            A[g + 8][2 * c + h] = half_value(a[1], h);
            A[g][2 * c + 8 + h] = half_value(a[2], h);
            A[g + 8][2 * c + 8 + h] = half_value(a[3], h);
            B[2 * c + h][g] = half_value(b[0], h);
            B[2 * c + 8 + h][g] = half_value(b[1], h);
        }
    }
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 8; n++) {
            double s = 0;
            for (int k = 0; k < 16; k++) s += A[r][k] * B[k][n];
            D[r][n] += s;
        }
}

// The tile's outputs out[t][j] (tile row j, token t < ntok) for weight rows grow[0..15] of W against
// the staged columns xs (ncol of them), through R's loads and operands.
template <class R>
void emulate_tile(const nf::DevMat &W, const uint64_t (&grow)[16], const uint8_t *xs, uint32_t xstride, int ncol,
                  bool in_bf16, int ntok, std::vector<double> &out)
{
    double D[16][8] = {};
    const int nch = (int)(W.cols / R::kChunk), mmas = R::kChunk / 16;
    for (int k = 0; k < nch; k++) {
        LaneOps lanes[32];
        for (int lane = 0; lane < 32; lane++) {
            const int g = lane / 4, c = lane % 4;
            const typename R::Lane L = R::lane(W, grow[g], grow[g + 8], c);
            const typename R::Chunk ch = R::load(L, k);
            const uint8_t *xl = xs + (size_t)(g < ncol - 1 ? g : ncol - 1) * xstride + 16 * c;
            lanes[lane].n = 0;
            nf::chunk_mmas<R>(ch, xl + (size_t)k * (2 * R::kChunk), Recorder{&lanes[lane]});
            CHECK(lanes[lane].n == mmas);
        }
        for (int m = 0; m < mmas; m++) mma_emulate(lanes, m, D);
    }
    out.assign((size_t)ntok * 16, 0.0);
    for (int lane = 0; lane < 32; lane++) { // store_tile's reading of each lane's d0..d3
        const int g = lane / 4, c = lane % 4;
        const double d[4] = {D[g][2 * c], D[g][2 * c + 1], D[g + 8][2 * c], D[g + 8][2 * c + 1]};
        const double fa = R::factor_of(R::divisor(W, grow[g])), fb = R::factor_of(R::divisor(W, grow[g + 8]));
        auto put = [&](int t, double va, double vb) {
            if (t >= ntok) return;
            out[(size_t)t * 16 + g] = va * fa;
            out[(size_t)t * 16 + g + 8] = vb * fb;
        };
        if (in_bf16) {
            put(2 * c, d[0], d[2]);
            put(2 * c + 1, d[1], d[3]);
        } else {
            put(c, d[0] + d[1], d[2] + d[3]);
        }
    }
}

// The tokens x[t][cols] staged as S lays them out: bf16 (x bf16-representable) one column a token,
// f32 two (hi, lo).
template <class S>
Buf stage(const std::vector<float> &x, int ntok, uint32_t cols, bool in_bf16, uint32_t xstride)
{
    Buf xs((size_t)(in_bf16 ? ntok : 2 * ntok) * xstride);
    for (int t = 0; t < ntok; t++)
        for (uint32_t e8 = 0; e8 < cols / 8; e8++) {
            const float *v = &x[(size_t)t * cols + 8 * e8];
            uint4 in[2];
            if (in_bf16) {
                uint32_t w[4];
                for (int i = 0; i < 4; i++) w[i] = nf_test_f2bf(v[2 * i]) | ((uint32_t)nf_test_f2bf(v[2 * i + 1]) << 16);
                in[0] = make_uint4(w[0], w[1], w[2], w[3]);
                nf::stage_group<true>(in, xs.p() + (size_t)t * xstride, xstride, S::stage_offset(e8));
            } else {
                memcpy(in, v, 32);
                nf::stage_group<false>(in, xs.p() + (size_t)(2 * t) * xstride, xstride, S::stage_offset(e8));
            }
        }
    return xs;
}

// Planted mistakes: bf16 A words without the pair order; a lane-major group order in the staging.
struct Bf16NoPairs : nf::Bf16Rows {
    template <int M>
    NF_HD static void a_regs(const Frag &f, uint32_t (&a)[4])
    {
        const uint4 &wa = f.a[M / 2], &wb = f.b[M / 2];
        const int j = M % 2 ? 2 : 0;
        a[0] = nf::word_of(wa, j), a[1] = nf::word_of(wb, j), a[2] = nf::word_of(wa, j + 1), a[3] = nf::word_of(wb, j + 1);
    }
};
struct LaneMajor64 {
    NF_HD static uint32_t stage_offset(uint32_t e8) { return (e8 >> 3) * 128 + 16 * (4 * (e8 & 1) + ((e8 >> 1) & 3)); }
};

// The worst |out - ref| / sum |w x| of a tile against the weights wv times q = x (bf16 tokens) or
// hi + lo (f32 tokens), and against wv times x.
struct Result {
    double worst_q, worst_x;
};

// Checks one tile: weights wv[stacked row][cols] (the values the kernel should see: R's operand
// times its factor), tokens x; R the row format, S the staging layout (R's own, but for a planted
// mistake).
template <class R, class S>
Result check_tile(const nf::DevMat &W, const std::vector<double> &wv, const uint64_t (&grow)[16],
                  const std::vector<float> &x, int ntok, bool in_bf16)
{
    const uint32_t cols = W.cols, xstride = nf::mma_col_stride(cols);
    Buf xs = stage<S>(x, ntok, cols, in_bf16, xstride);
    std::vector<double> out;
    emulate_tile<R>(W, grow, xs.p(), xstride, in_bf16 ? ntok : 2 * ntok, in_bf16, ntok, out);
    Result res{0, 0};
    for (int t = 0; t < ntok; t++)
        for (int j = 0; j < 16; j++) {
            const double *w = &wv[grow[j] * cols];
            const float *xt = &x[(size_t)t * cols];
            double ref_q = 0, ref_x = 0, abs = 0;
            for (uint32_t i = 0; i < cols; i++) {
                const uint16_t hi = nf_test_f2bf(xt[i]);
                const uint16_t lo = nf_test_f2bf(xt[i] - nf_test_bf2f(hi));
                const double q = in_bf16 ? (double)xt[i] : (double)nf_test_bf2f(hi) + (double)nf_test_bf2f(lo);
                ref_q += w[i] * q;
                ref_x += w[i] * xt[i];
                abs += fabs(w[i] * xt[i]);
            }
            const double got = out[(size_t)t * 16 + j], s = abs > 0 ? abs : 1e-300;
            res.worst_q = fmax(res.worst_q, fabs(got - ref_q) / s);
            res.worst_x = fmax(res.worst_x, fabs(got - ref_x) / s);
        }
    return res;
}

// ntok tokens of cols activations, random, each 32-element group scaled by 2^-4 .. 2^4; bf16-valued
// when the kernel takes bf16 inputs.
std::vector<float> make_x(int ntok, uint32_t cols, bool in_bf16)
{
    std::vector<float> x((size_t)ntok * cols);
    for (auto &v : x) {
        v = nrand() * ldexpf(1.0f, (int)(&v - x.data()) / 32 % 9 - 4);
        if (in_bf16) v = nf_test_bf2f(nf_test_f2bf(v));
    }
    return x;
}

// bf16 weights: E = 2 experts of `rows` rows; the tile's rows spread over both.
void check_bf16(uint32_t cols)
{
    const uint32_t rows = 40, E = 2;
    Buf data((size_t)E * rows * cols * 2);
    std::vector<double> wv((size_t)E * rows * cols);
    for (uint32_t r = 0; r < E * rows; r++)
        for (uint32_t i = 0; i < cols; i++) {
            const float v = nrand() * ldexpf(1.0f, (int)((i / 8 + r) % 7) - 3);
            const uint16_t h = nf_test_f2bf(v);
            memcpy(data.p() + ((size_t)r * cols + i) * 2, &h, 2);
            wv[(size_t)r * cols + i] = nf_test_bf2f(h);
        }
    nf::DevMat W;
    memset(&W, 0, sizeof W);
    W.data = data.p();
    W.rows = rows;
    W.cols = cols;
    W.row_stride = 2ull * cols;
    CHECK(nf::Bf16Rows::admits(W));
    uint64_t grow[16];
    for (int j = 0; j < 16; j++) grow[j] = j < 8 ? (uint64_t)(3 * j + 1) : (uint64_t)rows + (uint64_t)(5 * j) % rows;

    for (int in_bf16 = 1; in_bf16 >= 0; in_bf16--)
        for (int ntok : {in_bf16 ? 8 : 4, in_bf16 ? 5 : 3}) {
            const std::vector<float> x = make_x(ntok, cols, in_bf16);
            const Result r = check_tile<nf::Bf16Rows, nf::Bf16Rows>(W, wv, grow, x, ntok, in_bf16);
            printf("  bf16 weights cols %4u, %d %s tokens: worst %.2e (q), %.2e (x) of sum |w x|\n", cols, ntok,
                   in_bf16 ? "bf16" : "f32", r.worst_q, r.worst_x);
            CHECK_MSG(r.worst_q <= 1e-12, "bf16 cols %u: %.3e of sum |w x| off the exact dot", cols, r.worst_q);
            CHECK_MSG(r.worst_x <= ldexp(1.0, -16) + 1e-12, "bf16 cols %u: %.3e off the f32 dot", cols, r.worst_x);
            if (in_bf16 && ntok == 8) { // the planted mistakes must show
                const Result p1 = check_tile<Bf16NoPairs, nf::Bf16Rows>(W, wv, grow, x, ntok, true);
                const Result p2 = check_tile<nf::Bf16Rows, LaneMajor64>(W, wv, grow, x, ntok, true);
                printf("    planted: A words unpaired %.2e, lane-major staging %.2e\n", p1.worst_q, p2.worst_q);
                CHECK_MSG(p1.worst_q > 1e-3 && p2.worst_q > 1e-3, "a planted pairing mistake went unseen (%.2e, %.2e)",
                          p1.worst_q, p2.worst_q);
            }
        }
}

// nvfp4 weights: E = 2 experts of 128 rows, D = 2 divisor shares (one an expert); the tile's rows in
// both, every 5th row 2^-15 as large.
void check_fp4(uint32_t cols)
{
    const uint32_t rows = 128, E = 2, D = 2;
    const uint64_t R = (uint64_t)E * rows;
    std::vector<float> w(R * cols);
    for (uint64_t r = 0; r < R; r++)
        for (uint32_t i = 0; i < cols; i++)
            w[r * cols + i] = nrand() * (r % 5 == 2 ? ldexpf(1.0f, -15) : 1.0f) * (r < rows ? 1.0f : 3.0f) *
                              ldexpf(1.0f, (int)((i / 16 + r) % 5) - 2);
    nf_nvfp4_layout l;
    nf_error err;
    CHECK_MSG(nf_nvfp4_layout_of(R, cols, D, &l, &err) == NF_OK, "layout: %s", err.msg);
    Buf payload(l.payload_bytes);
    nf_nvfp4_quantize(w.data(), &l, payload.p());
    nf_nvfp4_planes p;
    CHECK(nf_nvfp4_view(payload.p(), l.payload_bytes, R, cols, D, &p, &err) == NF_OK);
    std::vector<double> wv(R * cols);
    std::vector<float> row(cols);
    for (uint64_t r = 0; r < R; r++) {
        nf_nvfp4_dequantize_row(&p, r, row.data());
        for (uint32_t i = 0; i < cols; i++) wv[r * cols + i] = row[i];
    }
    nf::DevMat W;
    memset(&W, 0, sizeof W);
    W.data = payload.p();
    W.rows = rows;
    W.cols = cols;
    W.row_stride = cols / 2;
    W.scales = payload.p() + p.layout.scale_offset;
    W.divisors = (const float *)(payload.p() + p.layout.divisor_offset);
    W.rows_per_div = nf_fastdiv_make((uint32_t)(R / D));
    W.kt = (cols / 16 + 3) / 4;
    CHECK(nf::Fp4Rows::admits(W));
    uint64_t grow[16];
    for (int j = 0; j < 16; j++) grow[j] = j < 8 ? (uint64_t)(7 * j + 2) : (uint64_t)rows + (uint64_t)(11 * j) % rows;

    for (int in_bf16 = 1; in_bf16 >= 0; in_bf16--)
        for (int ntok : {in_bf16 ? 8 : 4, in_bf16 ? 5 : 3}) {
            const std::vector<float> x = make_x(ntok, cols, in_bf16);
            const Result r = check_tile<nf::Fp4Rows, nf::Fp4Rows>(W, wv, grow, x, ntok, in_bf16);
            printf("  nvfp4 weights cols %4u, %d %s tokens: worst %.2e (q), %.2e (x) of sum |w x|\n", cols, ntok,
                   in_bf16 ? "bf16" : "f32", r.worst_q, r.worst_x);
            CHECK_MSG(r.worst_q <= ldexp(1.0, -20), "nvfp4 cols %u: %.3e of sum |w x| off the dequantized dot", cols,
                      r.worst_q);
            CHECK_MSG(r.worst_x <= ldexp(1.0, -16) + ldexp(1.0, -20), "nvfp4 cols %u: %.3e off the f32 dot", cols,
                      r.worst_x);
        }
}

} // namespace

int main(void)
{
    for (uint32_t cols : {64u, 320u, 2048u}) check_bf16(cols);
    for (uint32_t cols : {128u, 384u}) check_fp4(cols);
    return nf_test_report();
}

/* NVFP4 dot products: the scalar nf_nvfp4_dot_row against a double-precision dot of the
 * dequantized row, and the AVX2 matvec against the scalar one, over row counts that leave every
 * remainder of the 4-row kernel, column counts that leave every remainder of the 4-block scale
 * group, and row ranges that cross a divisor boundary inside one 4-row group.
 *
 * Tolerances (u = 2^-24, S = sum |w_i x_i| in double):
 *  - scalar vs dequantized reference: the block sum of 16 products in float costs <= 16u of its
 *    terms' magnitude; the reference rounds each w = q * eff to fp32 (u); the final float 1u.
 *    Bound 20u * S.
 *  - AVX2 vs scalar: each of the 8 lanes adds nb = cols/16 block terms with FMA (<= (nb + 2)u),
 *    block sums of 2 products (2u), the 8-lane reduction (3u), the division by the divisor at the
 *    end (1u) where the scalar divides each block's scale (1u); plus the scalar's 17u. Bound
 *    (nb + 28)u * S. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codec/codec.h"
#include "codec/nvfp4.h"
#include "nf_test.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double uniform(void) /* xorshift64*, [0, 1) */
{
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return (double)((rng * 2685821657736338717ull) >> 11) * 0x1p-53;
}
static float gauss(void) { return (float)(sqrt(-2 * log(1 - uniform())) * cos(6.283185307179586 * uniform())); }

typedef struct mat {
    nf_nvfp4_layout l;
    uint8_t *pay;
    nf_nvfp4_planes p;
} mat;

/* rows x cols with D sources whose magnitudes differ fourfold; within a row, block magnitudes
 * spread over 1e-4..1 so some block scales are e4m3 subnormals. */
static void make(mat *m, uint64_t rows, uint64_t cols, uint32_t d)
{
    CHECK(nf_nvfp4_layout_of(rows, cols, d, &m->l, NULL) == NF_OK);
    float *w = malloc(rows * cols * sizeof(float));
    for (uint64_t r = 0; r < rows; r++) {
        float src = 1.0f + 3.0f * (float)(r / (rows / d)) / (float)(d > 1 ? d - 1 : 1);
        for (uint64_t k = 0; k < cols; k += 16) {
            float mag = src * (float)pow(10.0, -4.0 * uniform());
            for (int i = 0; i < 16; i++) w[r * cols + k + i] = gauss() * mag;
        }
    }
    m->pay = malloc(m->l.payload_bytes);
    nf_nvfp4_quantize(w, &m->l, m->pay);
    free(w);
    CHECK(nf_nvfp4_view(m->pay, m->l.payload_bytes, rows, cols, d, &m->p, NULL) == NF_OK);
    CHECK(nf_nvfp4_validate(&m->p, NULL) == NF_OK);
}

/* sum |w x| and sum w x in double over the dequantized row. */
static void reference(const mat *m, uint64_t r, const float *x, double *dot, double *mag)
{
    float *w = malloc(m->l.cols * sizeof(float));
    nf_nvfp4_dequantize_row(&m->p, r, w);
    *dot = *mag = 0;
    for (uint64_t c = 0; c < m->l.cols; c++) {
        *dot += (double)w[c] * x[c];
        *mag += fabs((double)w[c] * x[c]);
    }
    free(w);
}

static int check_range(const mat *m, uint64_t row0, uint64_t n, const float *x)
{
    float *ys = malloc(n * sizeof(float)), *yv = malloc(n * sizeof(float));
    nf_nvfp4_matvec_scalar(&m->p, row0, n, x, ys);
    nf_nvfp4_matvec_avx2(&m->p, row0, n, x, yv);
    double nb = (double)(m->l.cols / 16);
    int bad = 0;
    for (uint64_t i = 0; i < n && !bad; i++) {
        double ref, mag;
        reference(m, row0 + i, x, &ref, &mag);
        double tol_s = 20 * 0x1p-24 * mag, tol_v = (nb + 28) * 0x1p-24 * mag;
        if (!(fabs(ys[i] - ref) <= tol_s) || !(fabs(yv[i] - (double)ys[i]) <= tol_v)) {
            CHECK_MSG(0, "%llux%llu D=%u row %llu: ref %.9g, scalar %.9g (tol %.3g), avx2 %.9g (tol %.3g)",
                      (unsigned long long)m->l.rows, (unsigned long long)m->l.cols, m->l.divisors,
                      (unsigned long long)(row0 + i), ref, (double)ys[i], tol_s, (double)yv[i], tol_v);
            bad = 1;
        }
    }
    CHECK(!bad);
    free(ys);
    free(yv);
    return bad;
}

int main(void)
{
    if (!nf_cpu_has_avx2_fma_f16c()) {
        fprintf(stderr, "no AVX2+FMA+F16C on this CPU: the SIMD comparison cannot run\n");
        return NF_TEST_SKIP;
    }
    const uint64_t cols[] = {16, 48, 64, 80, 112, 1040, 4096};
    for (size_t c = 0; c < sizeof cols / sizeof cols[0]; c++) {
        mat m;
        make(&m, 512, cols[c], 4);
        float *x = malloc(cols[c] * sizeof(float));
        for (uint64_t i = 0; i < cols[c]; i++) x[i] = gauss();
        for (uint64_t n = 1; n <= 9; n++) check_range(&m, 3, n, x);     /* every remainder of 4 rows */
        check_range(&m, 126, 7, x);                                       /* crosses divisor 0 -> 1 */
        check_range(&m, 0, 512, x);                                       /* all four sources */
        free(x);
        free(m.pay);
    }
    /* D = 1 with rows not a multiple of 128 (padded scale tile). */
    mat m;
    make(&m, 161, 96, 1);
    float x[96];
    for (int i = 0; i < 96; i++) x[i] = gauss();
    check_range(&m, 0, 161, x);
    /* The dispatcher gives the same bits as one of the two kernels it chooses between. */
    float a[161], b[161];
    nf_nvfp4_matvec(&m.p, 0, 161, x, a);
    nf_nvfp4_matvec_avx2(&m.p, 0, 161, x, b);
    int same_simd = memcmp(a, b, sizeof a) == 0;
    nf_nvfp4_matvec_scalar(&m.p, 0, 161, x, b);
    CHECK(same_simd || memcmp(a, b, sizeof a) == 0);
    CHECK(same_simd == !getenv("NF_NO_SIMD"));
    free(m.pay);
    return nf_test_report();
}

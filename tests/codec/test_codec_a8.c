/* int8 activations (codec/a8.h): the quantiser and every integer kernel at every ISA this CPU has
 * (scalar, avx2, avx512vnni, amx, each forced in turn through nf_codec_a8_kernel), against double
 * references, on random and adversarial blocks.
 *
 * Quantiser. Every ISA writes the same bytes. Per 32-element block, q in [-127, 127], bsum the sums
 * of q per 16, dsum = d * (the block's sum of q) in f32, and |x_i - d q_i| <= d (1/2 + 2^-16) (codec/a8.h: the f32 product x * (1/d) carries
 * two roundings, 127 * 2^-23 < 2^-16 in units of d). A block whose d would be subnormal
 * (amax < 127 * 2^-126, so every |x| < 2^-119) and an all-zero block have d = 0 and q = 0; a NaN or
 * inf makes d NaN.
 *
 * Kernels. Reference: ref = sum_i w_i x~_i in double, w the decoded weights (dequantize_row, f32),
 * x~_i = d_b q_i (exact in double). A kernel's integer block sums are exact (|isum| < 2^24, so their
 * conversion to f32 is too); its error is the f32 rounding of the combine. Writing each decoded
 * weight as a_i - b_i (a = the scale term d1 q, b = the min term m1 of q4_k / q5_k, else 0) and
 * T = sum_i (|a_i| + |b_i|) |x~_i|, first-order error analysis bounds a sum of m terms, each a
 * product of k roundings, by (m + k) u T (u = 2^-24): a kernel forms each block's scale (d * sc,
 * then * d_b: 2 roundings) and multiplies it with its block sum (1), and adds at most n / 16 block
 * terms into one accumulator lane chain plus a 16-lane reduction (4); the reference's w_i carries
 * 2 roundings relative to a_i - b_i. Hence |kernel - ref| <= (n / 16 + 12) u T. T is measured per
 * row from decoded terms (the offset field zeroed gives a_i, the scale field zeroed -b_i). The
 * observed worst ratio is printed. The repacked multi-token tile (nf_codec_a8_tile: AVX2, AVX-512 VNNI, AMX)
 * is held to the same reference and bound on the same rows (1 to 35 rows: partial 16-row blocks;
 * up to 15 tokens: partial 4-token passes; 16, 28 and 40 tokens: whole and partial 16-token groups);
 * the AVX-512 VNNI and AMX tiles must also equal the AVX2 tile bit for bit. Strength: with q4_k's scales and mins swapped in the unpacker
 * (nf_k4_unpack_scales), or q6_k's sub-block scale index off by one, every kernel fails.
 *
 * The quantisation's own effect, |ref - sum_i w_i x_i| <= sum_b d_b (1/2 + 2^-16) sum_{i in b} |w_i|
 * (+ the f32 reference's own rounding), is checked on the same rows. */
#include <math.h>
#include <stdlib.h>

#include "codec/a8.h"
#include "codec/codec.h"
#include "nf_test.h"

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint64_t rnd(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}
static float urand(void) { return (float)((rnd() >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }
static float grand(void) { return (urand() + urand() + urand() + urand()) * 0.8660254f; }

/* ---- the quantiser -------------------------------------------------------------------------------- */

static void check_quantiser(size_t n, int kind)
{
    float *x = malloc(n * sizeof(float));
    const size_t rb = nf_a8_row_bytes(n);
    uint8_t *ref = malloc(rb), *got = malloc(rb);
    for (size_t i = 0; i < n; i++) {
        x[i] = grand();
        if (kind == 1 && i % 32 == 5) x[i] = 1000.0f * (i % 64 ? 1 : -1); /* one outlier per block */
        if (kind == 2 && (i / 32) % 3 == 0) x[i] = 0;                   /* all-zero blocks */
        if (kind == 3) x[i] = (i % 2 ? 3.0f : -3.0f);                   /* saturating: every |q| = 127 */
        if (kind == 4) x[i] = ldexpf(grand(), -140);                    /* subnormal-ish scales */
        if (kind == 5) x[i] = (float)((int)(rnd() % 255) - 127) * 0.5f; /* exact ties of x / d */
        if (kind == 6) x[i] = ldexpf(grand(), -117 - (int)(i / 32) % 4); /* around the subnormal-d cut */
        if (kind == 7 && i % 97 == 3) x[i] = i % 2 ? NAN : -INFINITY;     /* NaN scales: the same bytes too */
    }
    nf_a8_quantize_row(x, ref, n, NF_ISA_SCALAR);
    for (int isa = NF_ISA_AVX2; isa <= (int)nf_isa_detect(); isa++) {
        nf_a8_quantize_row(x, got, n, (nf_isa)isa);
        CHECK_MSG(memcmp(ref, got, rb) == 0, "quantiser %s differs from scalar (n=%zu kind %d)", nf_isa_name((nf_isa)isa),
                  n, kind);
    }
    if (kind == 7) { /* the bounds below are for finite rows */
        free(x), free(ref), free(got);
        return;
    }
    const int8_t *q = (const int8_t *)ref;
    const float *d = (const float *)(ref + n);
    const int16_t *bs = (const int16_t *)(ref + n + n / 8);
    for (size_t b = 0; b < n / 32; b++) {
        int s[2] = {0, 0};
        for (int i = 0; i < 32; i++) {
            const size_t k = 32 * b + i;
            CHECK(q[k] >= -127 && q[k] <= 127);
            s[i / 16] += q[k];
            CHECK_MSG(fabs(x[k] - (double)d[b] * q[k]) <= (d[b] ? d[b] * (0.5 + ldexp(1, -16)) : ldexp(1, -119)),
                      "x %.9g d %.9g q %d (kind %d)", x[k], d[b], q[k], kind);
        }
        CHECK(bs[2 * b] == s[0] && bs[2 * b + 1] == s[1]);
        const float *dsum = (const float *)(ref + n + n / 4);
        CHECK(dsum[b] == d[b] * (float)(s[0] + s[1]) || (isnan(dsum[b]) && isnan(d[b])));
        if (kind == 2 && b % 3 == 0) CHECK(d[b] == 0 && s[0] == 0 && s[1] == 0);
        if (kind == 3)
            for (int i = 0; i < 32; i++) CHECK(q[32 * b + i] == (i % 2 ? 127 : -127));
    }
    free(x), free(ref), free(got);
}

static void check_nan(void)
{
    float x[64];
    uint8_t a[128];
    for (int i = 0; i < 64; i++) x[i] = grand();
    x[40] = NAN;
    x[3] = INFINITY;
    for (int isa = 0; isa <= (int)nf_isa_detect(); isa++) {
        nf_a8_quantize_row(x, a, 64, (nf_isa)isa);
        const float *d = (const float *)(a + 64);
        CHECK_MSG(isnan(d[0]) && isnan(d[1]), "%s: a non-finite input must give a NaN scale", nf_isa_name((nf_isa)isa));
    }
}

/* ---- the kernels ------------------------------------------------------------------------------------ */

static int offset_fields(const nf_codec *c, int *d_off, int *m_off)
{
    if (c->id == NF_CODEC_Q4_K || c->id == NF_CODEC_Q5_K) return *d_off = 0, *m_off = 2, 1;
    return 0;
}

/* T = sum_i (|a_i| + |b_i|) |x~_i| and sum_i |w_i| e_i (the quantisation allowance) of one row. */
static void magnitudes(const nf_codec *c, const uint8_t *row, size_t rb, const double *xq, const double *e, size_t n,
                       double *T, double *Q)
{
    float *a = malloc(n * sizeof(float)), *v = malloc(n * sizeof(float)), *w = malloc(n * sizeof(float));
    uint8_t *tmp = malloc(rb);
    int d_off, m_off;
    c->dequantize_row(row, w, n);
    if (offset_fields(c, &d_off, &m_off)) {
        memcpy(tmp, row, rb);
        for (size_t b = 0; b < rb; b += c->block_bytes) memset(tmp + b + m_off, 0, 2);
        c->dequantize_row(tmp, a, n);
        memcpy(tmp, row, rb);
        for (size_t b = 0; b < rb; b += c->block_bytes) memset(tmp + b + d_off, 0, 2);
        c->dequantize_row(tmp, v, n);
    } else {
        memcpy(a, w, n * sizeof(float));
        memset(v, 0, n * sizeof(float));
    }
    *T = *Q = 0;
    for (size_t i = 0; i < n; i++) *T += (fabs(a[i]) + fabs(v[i])) * fabs(xq[i]), *Q += fabs(w[i]) * e[i];
    free(a), free(v), free(w), free(tmp);
}

/* Weight rows: 0 quantised Gaussian rows, 1 random valid blocks, 2 extreme f16 scales (65504,
 * subnormal 2^-24) on random blocks, 3 every byte 0xFF (maximal levels and scales), 4 all-zero
 * blocks mixed with random ones. Activations: 0 Gaussian, 1 one outlier per block, 2 saturating
 * (+-amax), 3 some all-zero blocks. */
static void make_weights(const nf_codec *c, uint8_t *w, size_t rows, size_t rb, size_t n, int kind, float *tmp)
{
    const size_t nb = rb / c->block_bytes;
    int off[2];
    const int nf = nf_codec_scale_fields(c, off);
    for (size_t r = 0; r < rows; r++) {
        uint8_t *row = w + r * rb;
        if (kind == 0) {
            const float s = 0.01f + (float)(rnd() % 1000) * 0.01f;
            for (size_t i = 0; i < n; i++) tmp[i] = grand() * s + (r % 3 == 1 ? 0.5f * s : 0);
            c->quantize_row(tmp, row, n);
        } else if (kind == 3) {
            memset(row, 0xFF, rb);
            for (size_t b = 0; b < nb; b++)
                for (int f = 0; f < nf; f++) { /* 0xFFFF is a NaN: the largest finite f16 instead */
                    const uint16_t h = (uint16_t)(f == 0 && (r % 2) ? 0xFBFF : 0x7BFF);
                    memcpy(row + b * c->block_bytes + off[f], &h, 2);
                }
        } else {
            nf_codec_fill_random(c, row, nb, &rng, 0.02f);
            for (size_t b = 0; b < nb; b++) {
                uint8_t *blk = row + b * c->block_bytes;
                if (kind == 2)
                    for (int f = 0; f < nf; f++) {
                        const uint16_t h = (uint16_t)((rnd() % 2) ? 0x7BFF : 0x0001);
                        memcpy(blk + off[f], &h, 2);
                    }
                if (kind == 4 && (b + r) % 2 == 0) memset(blk, 0, c->block_bytes);
            }
        }
    }
}

static void make_x(float *x, size_t n, int kind)
{
    for (size_t i = 0; i < n; i++) {
        x[i] = grand();
        if (kind == 1 && i % 32 == 17) x[i] = 200.0f;
        if (kind == 2) x[i] = (rnd() % 2) ? 2.5f : -2.5f;
        if (kind == 3 && (i / 32) % 2) x[i] = 0;
    }
}

static void check_kernel(const nf_codec *c, nf_isa isa, size_t n, size_t rows, size_t ntok, int wkind, int xkind,
                         double *worst, double *worst_q)
{
    const nf_a8_gemm_fn fn = nf_codec_a8_kernel(c, isa);
    CHECK_MSG(fn != NULL, "%s has no kernel at %s", c->name, nf_isa_name(isa));
    if (!fn) return;
    const size_t rb = nf_codec_row_bytes(c, n), xr = nf_a8_row_bytes(n) + 64; /* ldxa > row bytes */
    uint8_t *buf = malloc(rows * rb + 1), *w = buf + 1; /* odd address */
    uint8_t *xa = malloc(ntok * xr);
    float *x = malloc(ntok * n * sizeof(float)), *tmp = malloc(n * sizeof(float)), *wd = malloc(n * sizeof(float));
    float *y = malloc(ntok * (rows + 3) * sizeof(float));
    double *xq = malloc(n * sizeof(double)), *e = malloc(n * sizeof(double));
    make_weights(c, w, rows, rb, n, wkind, tmp);
    for (size_t t = 0; t < ntok; t++) {
        make_x(x + t * n, n, (int)((xkind + t) % 4));
        nf_a8_quantize_row(x + t * n, xa + t * xr, n, isa);
    }
    const size_t ldy = rows + 3;
    const nf_a8_tile_fn tile = n % 64 == 0 ? nf_codec_a8_tile(c, isa) : NULL;
    for (int pass = 0; pass < (tile ? 2 : 1); pass++) {
    if (pass == 0) {
        fn(w, rb, rows, xa, xr, ntok, y, ldy, n);
        if (ntok > 1) { /* several tokens in one call (the multi-token kernels) give each token's one-token bits */
            float *y1 = malloc(ldy * sizeof(float));
            for (size_t t = 0; t < ntok; t++) {
                fn(w, rb, rows, xa + t * xr, xr, 1, y1, ldy, n);
                CHECK_MSG(memcmp(y + t * ldy, y1, rows * sizeof(float)) == 0,
                          "%s %s kernel: token %zu of %zu differs from its one-token call (n=%zu rows=%zu)", c->name,
                          nf_isa_name(isa), t, ntok, n, rows);
            }
            free(y1);
        }
    } else {
        uint8_t *scratch = malloc(nf_a8_tile_scratch(n));
        /* the tokens regrouped for the AMX tile, as columns 1 .. ntok of ntok + 2 (a segment that
         * starts at t0 = 1; the outer columns hold other rows) */
        const size_t T = ntok + 2;
        uint8_t *xt = malloc(nf_a8_xt_bytes(n, T));
        for (size_t t = 0; t < T; t++) nf_a8_xt_put(xa + (t == 0 ? ntok - 1 : t > ntok ? 0 : t - 1) * xr, n, t, T, xt);
        nf_a8_xt_pad(xt, n, T);
        const nf_a8_xt xtd = {xt, T, 1};
        tile(w, rb, rows, xa, xr, ntok, y, ldy, n, scratch, &xtd);
        if (isa > NF_ISA_AVX2) { /* every tile repeats the AVX2 tile's per-lane combine: the same bits */
            float *y2 = malloc(ntok * ldy * sizeof(float));
            memcpy(y2, y, ntok * ldy * sizeof(float));
            nf_codec_a8_tile(c, NF_ISA_AVX2)(w, rb, rows, xa, xr, ntok, y2, ldy, n, scratch, NULL);
            for (size_t t = 0; t < ntok; t++)
                CHECK_MSG(memcmp(y + t * ldy, y2 + t * ldy, rows * sizeof(float)) == 0,
                          "%s %s tile differs from the avx2 tile (n=%zu rows=%zu tok %zu/%zu)", c->name,
                          nf_isa_name(isa), n, rows, t, ntok);
            if (nf_a8_tile_wants_xt(isa)) { /* without xt: the AVX-512 VNNI tile, the same bits again */
                tile(w, rb, rows, xa, xr, ntok, y2, ldy, n, scratch, NULL);
                for (size_t t = 0; t < ntok; t++)
                    CHECK_MSG(memcmp(y + t * ldy, y2 + t * ldy, rows * sizeof(float)) == 0,
                              "%s %s tile without xt differs (n=%zu rows=%zu tok %zu/%zu)", c->name, nf_isa_name(isa), n,
                              rows, t, ntok);
            }
            free(y2);
        }
        free(scratch), free(xt);
    }
    const double u = ldexp(1.0, -24);
    for (size_t t = 0; t < ntok; t++) {
        const int8_t *q = (const int8_t *)(xa + t * xr);
        const float *d = (const float *)(xa + t * xr + n);
        for (size_t i = 0; i < n; i++)
            xq[i] = (double)d[i / 32] * q[i], e[i] = d[i / 32] ? d[i / 32] * (0.5 + ldexp(1, -16)) : ldexp(1, -119);
        for (size_t r = 0; r < rows; r++) {
            c->dequantize_row(w + r * rb, wd, n);
            double ref = 0, exact = 0;
            for (size_t i = 0; i < n; i++) ref += (double)wd[i] * xq[i], exact += (double)wd[i] * x[t * n + i];
            double T, Q;
            magnitudes(c, w + r * rb, rb, xq, e, n, &T, &Q);
            const double bound = ((double)n / 16 + 12) * u * T, err = fabs((double)y[t * ldy + r] - ref);
            CHECK_MSG(err <= bound, "%s %s%s n=%zu rows=%zu tok %zu/%zu row %zu w%d x%d: %.9g vs ref %.9g, |diff| %.3g > %.3g",
                      c->name, nf_isa_name(isa), pass ? " tile" : "", n, rows, t, ntok, r, wkind, xkind, y[t * ldy + r],
                      ref, err, bound);
            if (bound > 0 && err / bound > *worst) *worst = err / bound;
            /* the quantisation's effect (exact in double up to the f32 weights, which both sums share) */
            const double qe = fabs(ref - exact), qb = Q * (1 + 1e-9) + 1e-300;
            CHECK_MSG(qe <= qb, "%s: quantisation moved the dot by %.3g > %.3g", c->name, qe, qb);
            if (qe / qb > *worst_q) *worst_q = qe / qb;
        }
    }
    }
    free(buf), free(xa), free(x), free(tmp), free(wd), free(y), free(xq), free(e);
}

/* nf_a8_xt_fill (16-token transposes where the ISA has AVX-512) writes nf_a8_xt_put's bytes. */
static void check_xt_fill(nf_isa isa)
{
    const size_t n = 320, T = 37, xr = nf_a8_row_bytes(n) + 64;
    uint8_t *xa = malloc(T * xr), *a = malloc(nf_a8_xt_bytes(n, T)), *b = malloc(nf_a8_xt_bytes(n, T));
    float *x = malloc(n * sizeof(float));
    for (size_t t = 0; t < T; t++) {
        make_x(x, n, (int)(t % 4));
        nf_a8_quantize_row(x, xa + t * xr, n, NF_ISA_SCALAR);
        nf_a8_xt_put(xa + t * xr, n, t, T, a);
    }
    nf_a8_xt_pad(a, n, T), nf_a8_xt_pad(b, n, T);
    nf_a8_xt_fill(xa, xr, n, T, 0, 16, b, isa), nf_a8_xt_fill(xa, xr, n, T, 16, 21, b, isa);
    CHECK_MSG(memcmp(a, b, nf_a8_xt_bytes(n, T)) == 0, "nf_a8_xt_fill at %s differs from nf_a8_xt_put", nf_isa_name(isa));
    free(xa), free(a), free(b), free(x);
}

int main(void)
{
    for (int isa = 0; isa <= (int)nf_isa_detect(); isa++) check_xt_fill((nf_isa)isa);
    const size_t qn[] = {32, 64, 96, 256, 512, 576, 1536, 2048 + 32}; /* 16-block groups, partial ones */
    for (size_t k = 0; k < sizeof qn / sizeof qn[0]; k++)
        for (int kind = 0; kind < 8; kind++) check_quantiser(qn[k], kind);
    check_nan();

    const nf_codec_id ids[] = {NF_CODEC_Q8_0, NF_CODEC_Q4_K, NF_CODEC_Q5_K, NF_CODEC_Q6_K};
    printf("ISAs on this CPU: scalar .. %s\n", nf_isa_name(nf_isa_detect()));
    for (size_t ci = 0; ci < 4; ci++) {
        const nf_codec *c = nf_codec_get(ids[ci]);
        for (int isa = 0; isa <= (int)nf_isa_detect(); isa++) {
            double worst = 0, worst_q = 0;
            const size_t ns[] = {256, 512, 2048 + 256, 4096};
            for (size_t k = 0; k < 4; k++)
                for (int wk = 0; wk < 5; wk++)
                    for (size_t ri = 0; ri < 6; ri++) {
                        const size_t rs[6] = {1, 5, 9, 16, 17, 35}, rows = rs[ri];
                        check_kernel(c, (nf_isa)isa, ns[k], rows, 1 + (rows + wk) % 3 + (ri > 2 ? 4 * ri - 8 : 0), wk,
                                     (int)(k + wk) % 4, &worst, &worst_q);
                    }
            /* whole and partial groups of 16 tokens (the AMX tile's) */
            for (size_t nt = 16; nt <= 40; nt += 12) check_kernel(c, (nf_isa)isa, 512, 17, nt, (int)nt % 5, 1, &worst, &worst_q);
            if (c->block_elems == 32) { /* q8_0: an odd number of blocks (the AVX-512 pair loop's tail), alone
                                         * and after whole 16-block steps */
                const size_t nbs[] = {1, 3, 5, 7, 17, 35, 51};
                for (size_t i = 0; i < sizeof nbs / sizeof nbs[0]; i++)
                    check_kernel(c, (nf_isa)isa, 32 * nbs[i], 5, 2, nbs[i] % 5, 0, &worst, &worst_q);
            }
            printf("%-5s %-10s worst |kernel - ref| / bound = %.4f; quantisation effect / its bound = %.4f\n", c->name,
                   nf_isa_name((nf_isa)isa), worst, worst_q);
        }
        CHECK(nf_codec_a8_kernel(c, (nf_isa)(nf_isa_detect() + 1)) == NULL);
    }
    CHECK(nf_codec_a8_kernel(nf_codec_get(NF_CODEC_F32), NF_ISA_SCALAR) == NULL);
    CHECK(nf_codec_a8_kernel(nf_codec_get(NF_CODEC_Q4_0), NF_ISA_SCALAR) == NULL);
    return nf_test_report();
}

/* NVFP4 element codecs, plane layout, swizzle, divisor lookup and validation (each rule refused with
 * a message naming it). The element codecs are checked against brute-force nearest-value searches
 * over the spec's value sets, the swizzle against the CUTLASS [M/128][K/4][32][4][4] enumeration. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codec/codec.h"
#include "codec/nvfp4.h"
#include "nf_test.h"

static const float E2M1[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6}; /* DESIGN.md §3 */

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* ---- element codecs ------------------------------------------------------------------------- */

/* Nearest e2m1 magnitude by distance, ties to the even index; clamp at 6; sign bit iff x < 0. */
static uint8_t ref_e2m1(float x)
{
    double a = fabs((double)x);
    if (a > 6) a = 6;
    int best = 0;
    for (int i = 1; i < 8; i++) {
        double d = fabs(a - E2M1[i]), db = fabs(a - E2M1[best]);
        if (d < db || (d == db && i % 2 == 0)) best = i;
    }
    return (uint8_t)((x < 0 ? 8 : 0) | best);
}

static void test_e2m1(void)
{
    for (int n = 0; n < 16; n++) {
        float v = nf_e2m1_to_f32((uint8_t)n);
        CHECK(fabsf(v) == E2M1[n & 7]);
        CHECK(!!signbit(v) == !!(n & 8));
    }
    /* A sweep through [-7, 7] in steps of 1/64 hits every tie (0.25, 0.75, ... 5) and both sides. */
    for (int i = -448; i <= 448; i++) {
        float x = (float)i / 64.0f;
        float xs[3] = {x, nextafterf(x, -INFINITY), nextafterf(x, INFINITY)};
        for (int j = 0; j < 3; j++) CHECK_MSG(nf_f32_to_e2m1(xs[j]) == ref_e2m1(xs[j]), "x = %a", (double)xs[j]);
    }
    CHECK(nf_f32_to_e2m1(-0.0f) == 0);    /* torch.sign(-0.0) is 0 */
    CHECK(nf_f32_to_e2m1(-1e-30f) == 8);  /* rounds to zero, keeps its sign: -0 */
    CHECK(nf_f32_to_e2m1(1e30f) == 7);
    CHECK(nf_f32_to_e2m1(-1e30f) == 15);
}

/* float8_e4m3fn by its definition: bias 7, 3 mantissa bits, subnormals at e = 0, 0x7f NaN. */
static double ref_e4m3(int b)
{
    int e = (b >> 3) & 15, m = b & 7;
    double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
    return (b & 0x80) ? -v : v;
}

/* Nearest finite code by distance, ties to the even code, saturating at 448. */
static uint8_t ref_to_e4m3(float x)
{
    double a = fabs((double)x);
    int best = 0;
    for (int c = 1; c <= 0x7e; c++) {
        double d = fabs(a - ref_e4m3(c)), db = fabs(a - ref_e4m3(best));
        if (d < db || (d == db && c % 2 == 0)) best = c;
    }
    return (uint8_t)((signbit(x) ? 0x80 : 0) | best);
}

static void test_e4m3(void)
{
    for (int b = 0; b < 256; b++) {
        float v = nf_e4m3_to_f32((uint8_t)b);
        if ((b & 0x7f) == 0x7f) {
            CHECK(isnan(v));
            continue;
        }
        CHECK_MSG((double)v == ref_e4m3(b) && !!signbit(v) == !!(b & 0x80), "byte 0x%02x", b);
        CHECK_MSG(nf_f32_to_e4m3(v) == b, "round trip of 0x%02x", b);
    }
    CHECK(nf_e4m3_to_f32(0x7e) == 448.0f && nf_e4m3_to_f32(0x01) == 0x1p-9f && nf_e4m3_to_f32(0x38) == 1.0f);
    /* Every midpoint between neighbouring codes and one ulp either side of it. */
    for (int c = 0; c < 0x7e; c++) {
        float mid = (float)((ref_e4m3(c) + ref_e4m3(c + 1)) / 2);
        float xs[3] = {mid, nextafterf(mid, 0), nextafterf(mid, INFINITY)};
        for (int j = 0; j < 3; j++) {
            CHECK_MSG(nf_f32_to_e4m3(xs[j]) == ref_to_e4m3(xs[j]), "x = %a", (double)xs[j]);
            CHECK_MSG(nf_f32_to_e4m3(-xs[j]) == ref_to_e4m3(-xs[j]), "x = -%a", (double)xs[j]);
        }
    }
    CHECK(nf_f32_to_e4m3(1.0625f) == 0x38); /* tie -> even mantissa */
    CHECK(nf_f32_to_e4m3(1.1875f) == 0x3a);
    CHECK(nf_f32_to_e4m3(0x1p-10f) == 0x00); /* tie between 0 and the smallest subnormal */
    CHECK(nf_f32_to_e4m3(460.0f) == 0x7e && nf_f32_to_e4m3(1e30f) == 0x7e && nf_f32_to_e4m3(-1e30f) == 0xfe);
    CHECK(nf_f32_to_e4m3(NAN) == 0x7f);
}

static void test_scales(void)
{
    CHECK(nf_nvfp4_global_from_amax(10.5f) == 256.0f);
    CHECK(nf_nvfp4_global_from_amax(2688.0f) == 1.0f);
    CHECK(bits(nf_nvfp4_global_from_amax(3.0f)) == bits(2688.0f / 3.0f));
    CHECK(nf_nvfp4_global_from_amax(0.0f) == 1.0f);   /* clamp to tiny, 2688/tiny = inf -> 1 */
    CHECK(nf_nvfp4_global_from_amax(1e-37f) == 1.0f); /* overflows to inf -> 1 */
    CHECK(nf_nvfp4_global_from_amax(NAN) == 1.0f);
    CHECK(nf_nvfp4_block_scale(10.5f, 256.0f) == 0x7e);           /* the tensor max: 448 */
    CHECK(nf_nvfp4_block_scale(0.0f, 256.0f) == 0x20);            /* zero block: eps 0.125 */
    CHECK(nf_nvfp4_block_scale(6 * 0x1p-11f / 256, 256.0f) == 0x20); /* rounds to 0: eps */
    CHECK(nf_nvfp4_block_scale(6 * 3 * 0x1p-9f / 256, 256.0f) == 0x03); /* subnormal */
}

/* ---- layout, swizzle, divisors ---------------------------------------------------------------- */

static void test_layout(void)
{
    nf_nvfp4_layout l;
    nf_error err = {0};
    CHECK(nf_nvfp4_layout_of(160, 96, 1, &l, &err) == NF_OK);
    CHECK_EQ_U64(l.data_bytes, 7680);
    CHECK_EQ_U64(l.scale_offset, 7680);
    CHECK_EQ_U64(l.scale_bytes, 2 * 2 * 512); /* 2 row tiles x 2 column tiles (6 scale columns -> 8) */
    CHECK_EQ_U64(l.divisor_offset, 9728);
    CHECK_EQ_U64(l.payload_bytes, 9732);
    CHECK(nf_nvfp4_layout_of(3, 16, 1, &l, &err) == NF_OK);
    CHECK_EQ_U64(l.scale_offset, 256); /* 24 data bytes, then the 256-byte alignment */
    CHECK_EQ_U64(l.payload_bytes, 256 + 512 + 4);
    CHECK(nf_nvfp4_layout_of(512, 32, 4, &l, &err) == NF_OK);
    CHECK_EQ_U64(l.payload_bytes, 8192 + 4 * 512 + 16);

    const nf_codec *c = nf_codec_by_name("nvfp4");
    CHECK(c && c == nf_codec_by_ggml_type(40) && c == nf_codec_get(NF_CODEC_NVFP4));
    if (c) {
        CHECK(c->block_elems == 16 && c->block_bytes == 8 && (c->flags & NF_CODEC_PLANAR));
        CHECK(!c->quantize_row && !c->dequantize_row && !c->dot_row);
        uint64_t bytes = 0;
        CHECK(nf_codec_payload_bytes(c, 512, 32, 4, &bytes, &err) == NF_OK && bytes == l.payload_bytes);
    }

    struct { uint64_t rows, cols; uint32_t d; const char *msg; } bad[] = {
        {128, 24, 1, "cols = 24 is not a multiple of the 16-element block"},
        {128, 32, 0, "divisors = 0, need at least 1"},
        {384, 32, 5, "divisors = 5 does not divide rows = 384"},
        {512, 32, 8, "each of 8 divisors covers 64 rows, not a whole number of 128-row scale tiles"},
        {1ull << 62, 1024, 1, "overflows"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err.msg[0] = 0;
        CHECK(nf_nvfp4_layout_of(bad[i].rows, bad[i].cols, bad[i].d, &l, &err) == NF_ERR_FORMAT);
        CHECK_CONTAINS(err.msg, bad[i].msg);
    }
    CHECK(nf_nvfp4_layout_of(160, 32, 1, &l, &err) == NF_OK); /* D = 1: any row count */
    CHECK(nf_nvfp4_layout_of(256, 32, 2, &l, &err) == NF_OK);
}

static void test_swizzle(void)
{
    const uint64_t shapes[][2] = {{128, 64}, {160, 96}, {300, 272}, {512, 16}};
    for (size_t s = 0; s < 4; s++) {
        uint64_t rows = shapes[s][0], cols = shapes[s][1];
        nf_nvfp4_layout l;
        CHECK(nf_nvfp4_layout_of(rows, cols, 1, &l, NULL) == NF_OK);
        uint64_t mt = (rows + 127) / 128, kt = (cols / 16 + 3) / 4;
        uint8_t *hit = calloc(l.scale_bytes, 1);
        /* CUTLASS/cuBLASLt: the plane is [M/128][K/4][32][4][4] over (row tile, column tile, m%32,
         * (m%128)/32, k%4), walked in order: offsets 0, 1, 2, ... */
        uint64_t off = 0, wrong = 0;
        for (uint64_t a = 0; a < mt; a++)
            for (uint64_t b = 0; b < kt; b++)
                for (uint64_t m32 = 0; m32 < 32; m32++)
                    for (uint64_t m4 = 0; m4 < 4; m4++)
                        for (uint64_t k4 = 0; k4 < 4; k4++, off++) {
                            uint64_t m = a * 128 + m4 * 32 + m32, k = b * 4 + k4;
                            uint64_t got = nf_nvfp4_scale_index(m, k, cols);
                            /* DESIGN.md §3, verbatim */
                            uint64_t design = (m / 128) * kt * 512 + (k / 4) * 512 + (m % 32) * 16 +
                                              ((m % 128) / 32) * 4 + (k % 4);
                            wrong += got != off || got != design;
                            if (got < l.scale_bytes) hit[got]++;
                        }
        CHECK_EQ_U64(off, l.scale_bytes);
        CHECK_EQ_U64(wrong, 0);
        uint64_t once = 0;
        for (uint64_t i = 0; i < l.scale_bytes; i++) once += hit[i] == 1;
        CHECK_EQ_U64(once, l.scale_bytes); /* a bijection onto the padded plane */
        free(hit);
        /* Rows r and r+1 (r even) sit 16 bytes apart in one 32-byte sector. */
        for (uint64_t r = 0; r + 1 < rows; r += 2)
            for (uint64_t k = 0; k < cols / 16; k++) {
                uint64_t a = nf_nvfp4_scale_index(r, k, cols), b = nf_nvfp4_scale_index(r + 1, k, cols);
                if (b != a + 16 || a / 32 != b / 32) {
                    CHECK_MSG(0, "rows %llu/%llu, column %llu: offsets %llu, %llu", (unsigned long long)r,
                              (unsigned long long)r + 1, (unsigned long long)k, (unsigned long long)a,
                              (unsigned long long)b);
                    r = rows;
                    break;
                }
            }
    }
}

/* A valid D-source payload: random rows, share d scaled by (d + 1) so the divisors differ. */
static uint8_t *make_payload(uint64_t rows, uint64_t cols, uint32_t d, nf_nvfp4_layout *l)
{
    CHECK(nf_nvfp4_layout_of(rows, cols, d, l, NULL) == NF_OK);
    float *w = malloc(rows * cols * sizeof(float));
    srand(7);
    for (uint64_t i = 0; i < rows * cols; i++)
        w[i] = (float)((double)rand() / RAND_MAX - 0.5) * (float)(1 + i / (rows / d * cols));
    uint8_t *pay = malloc(l->payload_bytes);
    nf_nvfp4_quantize(w, l, pay);
    free(w);
    return pay;
}

static void test_divisors(void)
{
    nf_nvfp4_layout l;
    uint8_t *pay = make_payload(1024, 32, 8, &l);
    nf_nvfp4_planes p;
    nf_error err = {0};
    CHECK(nf_nvfp4_view(pay, l.payload_bytes, 1024, 32, 8, &p, &err) == NF_OK);
    CHECK(nf_nvfp4_validate(&p, &err) == NF_OK);
    float words[8];
    memcpy(words, pay + l.divisor_offset, sizeof words);
    for (int i = 1; i < 8; i++) CHECK(words[i] < words[i - 1]); /* share i has amax ~ (i+1)/2 */
    for (uint64_t r = 0; r < 1024; r++) CHECK(bits(nf_nvfp4_row_divisor(&p, r)) == bits(words[r / 128]));
    /* Distinct words make a pinned lookup visible: the dequantized share 5 must use word 5. */
    float y[32], z[32];
    nf_nvfp4_dequantize_row(&p, 5 * 128 + 3, y);
    memcpy(pay + l.divisor_offset + 5 * 4, &words[0], 4);
    nf_nvfp4_dequantize_row(&p, 5 * 128 + 3, z);
    CHECK(memcmp(y, z, sizeof y) != 0);
    free(pay);
}

/* ---- validation: every rule refused with its message -------------------------------------------- */

static void expect_refused(const nf_nvfp4_planes *p, const char *needle)
{
    nf_error err = {0};
    CHECK(nf_nvfp4_validate(p, &err) != NF_OK);
    CHECK_CONTAINS(err.msg, needle);
}

static void test_validate(void)
{
    nf_nvfp4_layout l;
    uint8_t *pay = make_payload(512, 80, 4, &l);
    nf_nvfp4_planes p, q;
    nf_error err = {0};
    CHECK(nf_nvfp4_view(pay, l.payload_bytes - 1, 512, 80, 4, &p, &err) == NF_ERR_FORMAT);
    CHECK_CONTAINS(err.msg, "payload is 24591 bytes, a 512 x 80 plane set with 4 divisors needs 24592");
    CHECK(nf_nvfp4_view(pay, l.payload_bytes, 512, 80, 4, &p, &err) == NF_OK);
    CHECK(nf_nvfp4_validate(&p, &err) == NF_OK);

    float div[4];
    memcpy(div, p.divisors, sizeof div);
    const float badv[] = {0.0f, -1.0f, INFINITY, NAN, -0.0f};
    for (int i = 0; i < 5; i++) {
        memcpy(pay + l.divisor_offset + 2 * 4, &badv[i], 4);
        expect_refused(&p, "divisor word 2 of 4");
        expect_refused(&p, "must be finite and > 0");
    }
    memcpy(pay + l.divisor_offset, div, sizeof div);

    uint8_t *s = pay + l.scale_offset;
    uint64_t at = nf_nvfp4_scale_index(130, 4, 80);
    uint8_t keep = s[at];
    s[at] = 0x7f;
    expect_refused(&p, "row 130, scale column 4 is 0x7f, an e4m3 NaN");
    s[at] = 0xff;
    expect_refused(&p, "row 130, scale column 4 is 0xff");
    s[at] = keep;
    s[nf_nvfp4_scale_index(130, 5, 80)] = 0x7f; /* padding column 5 of 8: not a used scale */
    CHECK(nf_nvfp4_validate(&p, &err) == NF_OK);

    q = p, q.layout.rows = 386; /* the layout rules are checked too */
    expect_refused(&q, "divisors = 4 does not divide rows = 386");
    q = p, q.layout.divisors = 8;
    expect_refused(&q, "not a whole number of 128-row scale tiles");
    q = p, q.layout.divisors = 0;
    expect_refused(&q, "need at least 1");
    q = p, q.layout.cols = 72;
    expect_refused(&q, "not a multiple of the 16-element block");
    q = p, q.layout.scale_offset += 256;
    expect_refused(&q, "layout fields");
    q = p, q.divisors = NULL;
    expect_refused(&q, "plane pointer is NULL");
    free(pay);
}

int main(void)
{
    test_e2m1();
    test_e4m3();
    test_scales();
    test_layout();
    test_swizzle();
    test_divisors();
    test_validate();
    return nf_test_report();
}

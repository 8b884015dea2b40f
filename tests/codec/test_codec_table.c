/* The codec table (GGUF and float codecs): ids, names, ggml type ids and block geometry as
 * llama.cpp's ggml-common.h / gguf-py's GGML_QUANT_SIZES define them; lookups; payload sizes and
 * their errors; and, per codec, that dot_row equals a double-precision dot of the decoded row to
 * within the f32 summation bound and that quantize -> dequantize reproduces exactly representable
 * inputs. */
#include <math.h>
#include <stdlib.h>

#include "codec/codec.h"
#include "nf_test.h"

/* name, ggml type, elements and bytes per block: gguf-py 0.19 GGML_QUANT_SIZES. */
static const struct {
    nf_codec_id id;
    const char *name;
    int ggml;
    unsigned elems, bytes, flags;
} expect[] = {
    {NF_CODEC_F32, "f32", 0, 1, 4, 0},          {NF_CODEC_F16, "f16", 1, 1, 2, 0},
    {NF_CODEC_BF16, "bf16", 30, 1, 2, 0},       {NF_CODEC_Q8_0, "q8_0", 8, 32, 34, 0},
    {NF_CODEC_Q4_K, "q4_k", 12, 256, 144, 0},   {NF_CODEC_Q5_K, "q5_k", 13, 256, 176, 0},
    {NF_CODEC_Q6_K, "q6_k", 14, 256, 210, 0},   {NF_CODEC_Q4_0, "q4_0", 2, 32, 18, NF_CODEC_DEQUANT_ONLY},
    {NF_CODEC_Q4_1, "q4_1", 3, 32, 20, NF_CODEC_DEQUANT_ONLY}, {NF_CODEC_Q5_0, "q5_0", 6, 32, 22, NF_CODEC_DEQUANT_ONLY},
    {NF_CODEC_Q5_1, "q5_1", 7, 32, 24, NF_CODEC_DEQUANT_ONLY},
    {NF_CODEC_Q2_K, "q2_k", 10, 256, 84, NF_CODEC_IMPORT_ONLY}, {NF_CODEC_Q3_K, "q3_k", 11, 256, 110, NF_CODEC_IMPORT_ONLY},
    {NF_CODEC_IQ4_NL, "iq4_nl", 20, 32, 18, NF_CODEC_IMPORT_ONLY}, {NF_CODEC_IQ4_XS, "iq4_xs", 23, 256, 136, NF_CODEC_IMPORT_ONLY},
};

static void check_entries(void)
{
    for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++) {
        const nf_codec *c = nf_codec_get(expect[i].id);
        CHECK_MSG(c != NULL, "codec %s missing from the table", expect[i].name);
        if (!c) continue;
        CHECK(c->id == expect[i].id);
        CHECK_MSG(strcmp(c->name, expect[i].name) == 0, "%s", c->name);
        CHECK_EQ_INT(c->ggml_type, expect[i].ggml);
        CHECK_EQ_INT(c->block_elems, expect[i].elems);
        CHECK_EQ_INT(c->block_bytes, expect[i].bytes);
        CHECK_EQ_INT(c->flags, expect[i].flags);
        CHECK(nf_codec_by_name(expect[i].name) == c);
        CHECK(nf_codec_by_ggml_type(expect[i].ggml) == c);
        CHECK(c->dequantize_row && c->dot_row && c->matvec_scalar);
        CHECK((c->quantize_row == NULL) == ((c->flags & (NF_CODEC_DEQUANT_ONLY | NF_CODEC_IMPORT_ONLY)) != 0));
        CHECK(nf_codec_matvec(c) != NULL);
        CHECK_EQ_U64(nf_codec_row_bytes(c, 4096), 4096 / expect[i].elems * expect[i].bytes);
    }
    CHECK(nf_codec_by_name("q4_K") == NULL); /* names are lower case, exactly */
    CHECK(nf_codec_by_name(NULL) == NULL);
    CHECK(nf_codec_by_ggml_type(16) == NULL); /* IQ2_XXS: not a ninfer codec */
    CHECK(nf_codec_get(NF_CODEC_COUNT) == NULL);
}

static void check_payload(void)
{
    const nf_codec *c = nf_codec_get(NF_CODEC_Q4_K);
    nf_error err = {0};
    uint64_t bytes = 0;
    CHECK_EQ_INT(nf_codec_payload_bytes(c, 768, 2048, 1, &bytes, &err), NF_OK);
    CHECK_EQ_U64(bytes, 768ull * 8 * 144);
    CHECK_EQ_U64(nf_codec_row_bytes(c, 100), 0);
    CHECK_EQ_INT(nf_codec_payload_bytes(c, 4, 100, 1, &bytes, &err), NF_ERR_FORMAT);
    CHECK_CONTAINS(err.msg, "q4_k");
    CHECK_CONTAINS(err.msg, "100");
    CHECK_EQ_INT(nf_codec_payload_bytes(c, 4, 256, 2, &bytes, &err), NF_ERR_FORMAT);
    CHECK_CONTAINS(err.msg, "divisors");
    CHECK_EQ_INT(nf_codec_payload_bytes(c, UINT64_MAX / 100, 256 * 1000, 1, &bytes, &err), NF_ERR_FORMAT);
    CHECK_CONTAINS(err.msg, "overflow");
}

static uint64_t st = 88172645463325252ull;
static double urand(void)
{
    st ^= st << 13, st ^= st >> 7, st ^= st << 17;
    return (double)(st >> 11) * 0x1.0p-53 * 2 - 1;
}

/* dot_row vs a double dot of the decoded row: the reference sums each block in f32 (at most
 * block_elems additions) and blocks in double, so |dot - exact| <= (block_elems + 2) u sum|w x|. */
static void check_dot_and_roundtrip(void)
{
    const size_t n = 1024;
    float *x = malloc(n * sizeof(float)), *w = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    uint8_t *q = malloc(n * 4);
    for (int id = 0; id < NF_CODEC_COUNT; id++) {
        const nf_codec *c = nf_codec_get((nf_codec_id)id);
        if (!c || (c->flags & NF_CODEC_PLANAR)) continue;
        for (size_t i = 0; i < n; i++) x[i] = (float)urand(), w[i] = (float)urand();
        size_t rb = nf_codec_row_bytes(c, n);
        if (c->quantize_row) {
            c->quantize_row(w, q, n);
        } else {
            for (size_t i = 0; i < rb; i++) q[i] = (uint8_t)(st = st * 6364136223846793005ull + 1, st >> 56);
            for (size_t b = 0; b < rb; b += c->block_bytes) q[b] = 0x00, q[b + 1] = 0x2c; /* d = 0.0625 */
        }
        c->dequantize_row(q, y, n);
        double exact = 0, mag = 0;
        for (size_t i = 0; i < n; i++) exact += (double)y[i] * x[i], mag += fabs((double)y[i] * x[i]);
        double got = c->dot_row(q, x, n);
        double bound = (c->block_elems + 2) * ldexp(1, -24) * mag + ldexp(1, -24) * fabs(exact);
        CHECK_MSG(fabs(got - exact) <= bound, "%s: dot %.9g vs exact %.9g (bound %.3g)", c->name, got, exact, bound);
        if (c->quantize_row) { /* decoded values are fixed points: encoding them again is lossless */
            uint8_t *q2 = malloc(rb);
            float *y2 = malloc(n * sizeof(float));
            c->quantize_row(y, q2, n);
            c->dequantize_row(q2, y2, n);
            double se = 0, ref = 0;
            for (size_t i = 0; i < n; i++) se += (double)(y2[i] - y[i]) * (y2[i] - y[i]), ref += (double)y[i] * y[i];
            /* exact for the float codecs and q8_0; the k-quant searches may pick other scales that
             * round the same grid differently, so they only have to stay far below one level */
            if (c->id <= NF_CODEC_Q8_0)
                CHECK_MSG(memcmp(y, y2, n * sizeof(float)) == 0, "%s: re-encoding decoded values changed them", c->name);
            else
                CHECK_MSG(se <= 1e-4 * ref, "%s: re-encoding decoded values: relative error %.3g", c->name, se / ref);
            free(q2);
            free(y2);
        }
    }
    free(x), free(w), free(y), free(q);
}

int main(void)
{
    check_entries();
    check_payload();
    check_dot_and_roundtrip();
    return nf_test_report();
}

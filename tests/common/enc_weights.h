/* Random encoded matrices for the CPU backend's tests: rows of uniform values (scales differing by
 * row), encoded in any codec (nvfp4 through its planes, import-only codecs as random valid blocks),
 * with what they decode to beside them. Include after nf_test.h's CHECK is available. */
#ifndef NF_TEST_ENC_WEIGHTS_H
#define NF_TEST_ENC_WEIGHTS_H

#include <stdlib.h>

#include "backend/cpu/cpu.h"
#include "nf_test.h"

static uint64_t rng = 0x1234567ULL;
static inline float frand(void) /* uniform in [-1, 1) */
{
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((double)(rng >> 11) * 0x1.0p-53 * 2 - 1);
}

/* An encoded matrix with its own storage. */
typedef struct enc {
    nf_cpu_weight w;
    uint8_t *buf;
    nf_nvfp4_planes nv;
    float *deq; /* [rows][cols] what the weight decodes to */
} enc;

static inline void encode(enc *e, nf_codec_id id, uint32_t rows, uint32_t cols, uint32_t divisors)
{
    const nf_codec *c = nf_codec_get(id);
    float *w = malloc((size_t)rows * cols * sizeof(float));
    for (size_t i = 0; i < (size_t)rows * cols; i++) w[i] = frand() * (1 + (i / cols) % 3); /* rows differ in scale */
    uint64_t bytes;
    CHECK(nf_codec_payload_bytes(c, rows, cols, divisors, &bytes, NULL) == NF_OK);
    e->buf = calloc(1, bytes);
    e->deq = malloc((size_t)rows * cols * sizeof(float));
    e->w = (nf_cpu_weight){.codec = c, .rows = rows, .cols = cols};
    if (id == NF_CODEC_NVFP4) {
        nf_nvfp4_layout l;
        CHECK(nf_nvfp4_layout_of(rows, cols, divisors, &l, NULL) == NF_OK);
        nf_nvfp4_quantize(w, &l, e->buf);
        CHECK(nf_nvfp4_view(e->buf, bytes, rows, cols, divisors, &e->nv, NULL) == NF_OK);
        e->w.nv = &e->nv;
        for (uint32_t r = 0; r < rows; r++) nf_nvfp4_dequantize_row(&e->nv, r, e->deq + (size_t)r * cols);
    } else {
        e->w.data = e->buf;
        e->w.row_bytes = nf_codec_row_bytes(c, cols);
        static uint64_t rng = 0x8F1BBCDCCA62C1D6ull;
        for (uint32_t r = 0; r < rows; r++) {
            uint8_t *row = e->buf + r * e->w.row_bytes;
            if (c->quantize_row) c->quantize_row(w + (size_t)r * cols, row, cols);
            else nf_codec_fill_random(c, row, e->w.row_bytes / c->block_bytes, &rng, 0.01f); /* import-only */
            c->dequantize_row(row, e->deq + (size_t)r * cols, cols);
        }
    }
    free(w);
}

static inline void enc_free(enc *e)
{
    free(e->buf);
    free(e->deq);
}

#endif

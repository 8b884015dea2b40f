/* Readers for the fixtures tests/oracle/gguf_codecs.py writes under tests/fixtures/codec/
 * (formats documented in that script). Test-only: a malformed fixture fails the test loudly. */
#ifndef NF_TEST_CODEC_FIXTURE_H
#define NF_TEST_CODEC_FIXTURE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct codec_fixture {
    uint32_t ggml_type, block_elems, block_bytes, n_blocks;
    uint8_t *blocks; /* [n_blocks][block_bytes] */
    float *values;   /* [n_blocks][block_elems] */
} codec_fixture;

static inline void *fx_read_all(const char *name, size_t *len)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/fixtures/codec/%s", NF_TEST_DATA, name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open fixture %s\n", path);
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc((size_t)n + 1);
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return p;
}

/* Loads an "NFCX" file; returns 0 on success. */
static inline int fx_load(const char *name, codec_fixture *fx)
{
    size_t len;
    uint8_t *p = fx_read_all(name, &len);
    memset(fx, 0, sizeof *fx);
    if (!p) return -1;
    uint32_t h[6];
    if (len < 24 || memcmp(p, "NFCX", 4) != 0) goto bad;
    memcpy(h, p, 24);
    if (h[1] != 1) goto bad;
    fx->ggml_type = h[2], fx->block_elems = h[3], fx->block_bytes = h[4], fx->n_blocks = h[5];
    size_t nb = (size_t)fx->n_blocks * fx->block_bytes, nv = (size_t)fx->n_blocks * fx->block_elems;
    if (len != 24 + nb + 4 * nv) goto bad;
    fx->blocks = malloc(nb ? nb : 1);
    fx->values = malloc(nv ? 4 * nv : 4);
    memcpy(fx->blocks, p + 24, nb);
    memcpy(fx->values, p + 24 + nb, 4 * nv);
    free(p);
    return 0;
bad:
    fprintf(stderr, "fixture %s: malformed (header or size)\n", name);
    free(p);
    return -1;
}

static inline void fx_free(codec_fixture *fx)
{
    free(fx->blocks);
    free(fx->values);
}

static inline uint32_t fx_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

#endif

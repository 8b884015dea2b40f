/* NVFP4 against compressed-tensors (fixtures written by tests/oracle/nvfp4_compressed_tensors.py):
 * the quantizer byte-exact (data plane, every scale byte read back through nf_nvfp4_scale_index,
 * the whole swizzled plane against the oracle's reshape/permute swizzle, the divisor words), and
 * the dequantizer bit-exact, on a payload assembled from the oracle's own bytes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/nvfp4.h"
#include "nf_test.h"

#define DIR NF_TEST_DATA "/fixtures/nvfp4/"

/* Reads DIR/name.ext, which must be exactly `bytes` long. */
static void *load(const char *name, const char *ext, size_t bytes)
{
    char path[512];
    snprintf(path, sizeof path, DIR "%s.%s", name, ext);
    FILE *f = fopen(path, "rb");
    CHECK_MSG(f != NULL, "cannot open %s", path);
    if (!f) return NULL;
    void *buf = malloc(bytes ? bytes : 1);
    size_t got = fread(buf, 1, bytes, f);
    int extra = fgetc(f) != EOF;
    fclose(f);
    CHECK_MSG(got == bytes && !extra, "%s: expected exactly %zu bytes", path, bytes);
    return buf;
}

typedef struct fixture {
    char name[64];
    uint64_t rows, cols;
    uint32_t d;
    float *input, *global, *dequant;       /* [rows][cols], [d], [rows][cols] */
    uint8_t *packed, *scales, *swizzled;    /* [rows][cols/2], [rows][cols/16], the 128x4 plane */
    nf_nvfp4_layout l;
} fixture;

static int load_fixture(fixture *fx)
{
    nf_error err = {0};
    if (nf_nvfp4_layout_of(fx->rows, fx->cols, fx->d, &fx->l, &err) != NF_OK) {
        CHECK_MSG(0, "%s: layout refused: %s", fx->name, err.msg);
        return 0;
    }
    size_t n = (size_t)(fx->rows * fx->cols);
    fx->input = load(fx->name, "input.f32", n * 4);
    fx->global = load(fx->name, "global.f32", fx->d * 4u);
    fx->dequant = load(fx->name, "dequant.f32", n * 4);
    fx->packed = load(fx->name, "packed.u8", n / 2);
    fx->scales = load(fx->name, "scales.u8", n / 16);
    fx->swizzled = load(fx->name, "swizzled.u8", (size_t)fx->l.scale_bytes);
    return fx->input && fx->global && fx->dequant && fx->packed && fx->scales && fx->swizzled;
}

static void free_fixture(fixture *fx)
{
    free(fx->input), free(fx->global), free(fx->dequant);
    free(fx->packed), free(fx->scales), free(fx->swizzled);
}

/* Our quantizer, byte for byte. */
static void check_quantize(const fixture *fx)
{
    const nf_nvfp4_layout *l = &fx->l;
    uint8_t *pay = malloc(l->payload_bytes);
    memset(pay, 0xa5, l->payload_bytes); /* nf_nvfp4_quantize must write every byte it owns */
    nf_nvfp4_quantize(fx->input, l, pay);

    uint64_t bad = 0, first = 0;
    for (uint64_t i = 0; i < l->data_bytes; i++)
        if (pay[i] != fx->packed[i] && bad++ == 0) first = i;
    CHECK_MSG(bad == 0, "%s: %llu data bytes differ from compressed-tensors, first at byte %llu (row %llu): "
              "ours 0x%02x, theirs 0x%02x", fx->name, (unsigned long long)bad, (unsigned long long)first,
              (unsigned long long)(first / (fx->cols / 2)), pay[first], fx->packed[first]);

    const uint8_t *sc = pay + l->scale_offset;
    bad = 0;
    for (uint64_t r = 0; r < fx->rows; r++)
        for (uint64_t k = 0; k < fx->cols / 16; k++) {
            uint8_t ours = sc[nf_nvfp4_scale_index(r, k, fx->cols)], theirs = fx->scales[r * (fx->cols / 16) + k];
            if (ours != theirs && bad++ == 0)
                fprintf(stderr, "%s: scale (row %llu, col %llu): ours 0x%02x, theirs 0x%02x\n", fx->name,
                        (unsigned long long)r, (unsigned long long)k, ours, theirs);
        }
    CHECK_MSG(bad == 0, "%s: %llu scale bytes differ", fx->name, (unsigned long long)bad);
    CHECK_MSG(memcmp(sc, fx->swizzled, l->scale_bytes) == 0, "%s: scale plane differs from the oracle's swizzle",
              fx->name);
    CHECK_MSG(memcmp(pay + l->divisor_offset, fx->global, 4u * fx->d) == 0, "%s: divisor words differ", fx->name);
    for (uint64_t i = l->data_bytes; i < l->scale_offset; i++) CHECK(pay[i] == 0); /* alignment gap zeroed */
    free(pay);
}

/* A payload made only of the oracle's bytes (our quantizer plays no part). */
static uint8_t *oracle_payload(const fixture *fx)
{
    uint8_t *pay = calloc(1, fx->l.payload_bytes);
    memcpy(pay, fx->packed, fx->l.data_bytes);
    memcpy(pay + fx->l.scale_offset, fx->swizzled, fx->l.scale_bytes);
    memcpy(pay + fx->l.divisor_offset, fx->global, 4u * fx->d);
    return pay;
}

static void check_dequantize(const fixture *fx)
{
    uint8_t *pay = oracle_payload(fx);
    nf_nvfp4_planes p;
    nf_error err = {0};
    CHECK(nf_nvfp4_view(pay, fx->l.payload_bytes, fx->rows, fx->cols, fx->d, &p, &err) == NF_OK);
    CHECK_MSG(nf_nvfp4_validate(&p, &err) == NF_OK, "%s: %s", fx->name, err.msg);
    float *y = malloc(fx->cols * sizeof(float));
    uint64_t bad = 0;
    for (uint64_t r = 0; r < fx->rows; r++) {
        nf_nvfp4_dequantize_row(&p, r, y);
        const float *want = fx->dequant + r * fx->cols;
        if (memcmp(y, want, fx->cols * sizeof(float)) != 0 && bad++ < 3)
            for (uint64_t c = 0; c < fx->cols; c++)
                if (memcmp(&y[c], &want[c], 4)) {
                    fprintf(stderr, "%s: dequant row %llu col %llu: ours %a, theirs %a\n", fx->name,
                            (unsigned long long)r, (unsigned long long)c, (double)y[c], (double)want[c]);
                    break;
                }
    }
    CHECK_MSG(bad == 0, "%s: %llu rows not bit-identical to compressed-tensors' dequantize", fx->name,
              (unsigned long long)bad);
    /* Stacked sources: row r takes word r / (rows / D), the oracle's global of its source. */
    uint64_t share = fx->rows / fx->d;
    for (uint64_t r = 0; r < fx->rows; r++) {
        float g = nf_nvfp4_row_divisor(&p, r);
        if (memcmp(&g, &fx->global[r / share], 4)) {
            CHECK_MSG(0, "%s: row %llu divisor %g, its source's global scale is %g", fx->name,
                      (unsigned long long)r, (double)g, (double)fx->global[r / share]);
            break;
        }
    }
    free(y);
    free(pay);
}

/* The fixture cases must exercise what the issue names; a regenerated fixture that lost them
 * would otherwise pass silently. */
static void check_coverage(const fixture *fx, int *subnormal_scale, int *eps_scale, int *neg_zero, int *sat)
{
    for (uint64_t i = 0; i < fx->rows * fx->cols / 16; i++) {
        uint8_t s = fx->scales[i];
        *subnormal_scale += s > 0 && s < 8;
        *eps_scale += s == 0x20;
        *sat += s == 0x7e;
    }
    for (uint64_t i = 0; i < fx->rows * fx->cols / 2; i++)
        *neg_zero += (fx->packed[i] & 15) == 8 || (fx->packed[i] >> 4) == 8;
}

int main(void)
{
    FILE *m = fopen(DIR "cases.txt", "r");
    CHECK_MSG(m != NULL, "cannot open " DIR "cases.txt");
    if (!m) return nf_test_report();
    char line[256];
    int cases = 0, max_d = 0, sub = 0, eps = 0, nz = 0, sat = 0;
    while (fgets(line, sizeof line, m)) {
        if (line[0] == '#' || line[0] == '\n') continue;
        fixture fx = {0};
        unsigned long long rows, cols;
        unsigned d;
        if (sscanf(line, "%63s %llu %llu %u", fx.name, &rows, &cols, &d) != 4) {
            CHECK_MSG(0, "bad line in cases.txt: %s", line);
            continue;
        }
        fx.rows = rows, fx.cols = cols, fx.d = d;
        if (load_fixture(&fx)) {
            check_quantize(&fx);
            check_dequantize(&fx);
            check_coverage(&fx, &sub, &eps, &nz, &sat);
            cases++;
            if ((int)d > max_d) max_d = (int)d;
        }
        free_fixture(&fx);
    }
    fclose(m);
    CHECK(cases >= 4);
    CHECK(max_d >= 4);
    CHECK_MSG(sub > 0 && eps > 0 && nz > 0 && sat > 0, "coverage: subnormal %d, eps %d, -0 %d, 448 %d", sub, eps, nz,
              sat);
    return nf_test_report();
}

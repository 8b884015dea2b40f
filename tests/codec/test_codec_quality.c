/* Quantizer quality: on the committed Gaussian and Student-t (3 dof) rows, the RMSE of each
 * quantizer (quantize_row then dequantize_row) must be within 3% of the oracle's RMSE on the same
 * rows (tests/fixtures/codec/rmse.tsv): gguf.quants.quantize for q8_0, and for q4_k/q5_k/q6_k
 * (which gguf-py cannot encode) the finer reference search of tests/oracle/gguf_codecs.py. */
#include <math.h>

#include "codec/codec.h"
#include "codec_fixture.h"
#include "nf_test.h"

typedef struct rows_fx {
    uint32_t n_dists, rows, cols;
    float *data; /* [n_dists][rows][cols] */
} rows_fx;

static int load_rows(rows_fx *r)
{
    size_t len;
    uint8_t *p = fx_read_all("rows.bin", &len);
    if (!p) return -1;
    uint32_t h[5];
    memcpy(h, p, len >= 20 ? 20 : 0);
    if (len < 20 || memcmp(p, "NFCR", 4) || h[1] != 1 || len != 20 + 4 * (size_t)h[2] * h[3] * h[4]) {
        free(p);
        return -1;
    }
    r->n_dists = h[2], r->rows = h[3], r->cols = h[4];
    r->data = malloc(len - 20);
    memcpy(r->data, p + 20, len - 20);
    free(p);
    return 0;
}

static double our_rmse(const nf_codec *c, const float *x, uint32_t rows, uint32_t cols)
{
    size_t rb = nf_codec_row_bytes(c, cols);
    uint8_t *q = malloc(rb);
    float *y = malloc(cols * sizeof(float));
    double se = 0;
    for (uint32_t r = 0; r < rows; r++) {
        c->quantize_row(x + (size_t)r * cols, q, cols);
        c->dequantize_row(q, y, cols);
        for (uint32_t i = 0; i < cols; i++) {
            double e = (double)y[i] - x[(size_t)r * cols + i];
            se += e * e;
        }
    }
    free(q);
    free(y);
    return sqrt(se / ((double)rows * cols));
}

int main(void)
{
    rows_fx rf = {0};
    CHECK(load_rows(&rf) == 0);
    size_t len;
    char *tsv = fx_read_all("rmse.tsv", &len);
    CHECK(tsv != NULL);
    if (!tsv || !rf.data) return nf_test_report();
    tsv[len] = 0;
    int seen = 0;
    printf("%-5s %-11s %12s %12s %8s  oracle\n", "codec", "dist", "ours", "oracle", "ratio");
    for (char *line = strtok(tsv, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#') continue;
        char codec[32], dist[32], kind[64];
        double oracle;
        if (sscanf(line, "%31s %31s %lf %63s", codec, dist, &oracle, kind) != 4) {
            CHECK_MSG(0, "rmse.tsv: malformed line '%s'", line);
            continue;
        }
        const nf_codec *c = nf_codec_by_name(codec);
        int di = strcmp(dist, "gauss") == 0 ? 0 : strcmp(dist, "student_t3") == 0 ? 1 : -1;
        CHECK_MSG(c && c->quantize_row && di >= 0 && (uint32_t)di < rf.n_dists, "rmse.tsv: '%s'", line);
        if (!c || !c->quantize_row || di < 0) continue;
        double ours = our_rmse(c, rf.data + (size_t)di * rf.rows * rf.cols, rf.rows, rf.cols);
        printf("%-5s %-11s %12.6g %12.6g %8.4f  %s\n", codec, dist, ours, oracle, ours / oracle, kind);
        CHECK_MSG(ours <= 1.03 * oracle, "%s on %s: RMSE %.6g exceeds 1.03 x the oracle's %.6g", codec, dist, ours, oracle);
        CHECK_MSG(oracle > 0 && ours > 0, "%s on %s: a zero RMSE means the rows were not quantized", codec, dist);
        seen++;
    }
    CHECK_EQ_INT(seen, 8); /* q8_0, q4_k, q5_k, q6_k x two distributions */
    free(tsv);
    free(rf.data);
    return nf_test_report();
}

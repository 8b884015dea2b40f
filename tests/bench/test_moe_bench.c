/* The host side of `ninfer bench sparse-moe`: argument parsing, the routing distributions'
 * statistics and the unique-bytes / FLOP accounting. */
#include <math.h>
#include <stdlib.h>

#include "codec/codec.h"
#include "moe_bench.h"
#include "nf_test.h"

static int distinct_rows(const int32_t *ids, uint32_t T, uint32_t k, uint32_t E)
{
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t a = 0; a < k; a++) {
            if (ids[t * k + a] < 0 || (uint32_t)ids[t * k + a] >= E) return 0;
            for (uint32_t b = 0; b < a; b++)
                if (ids[t * k + a] == ids[t * k + b]) return 0;
        }
    return 1;
}

static void test_distributions(void)
{
    nf_error err;
    const uint32_t E = 128, k = 8, T = 4096;
    int32_t *ids = malloc(sizeof(int32_t) * T * k), *again = malloc(sizeof(int32_t) * T * k);
    nf_moe_dist d;

    /* same: every token picks the same k experts, so exactly k are unique */
    CHECK_EQ_INT(nf_bench_parse_dist("same", E, k, &d, &err), NF_OK);
    nf_bench_route(&d, T, E, k, 1, 0, ids);
    CHECK(distinct_rows(ids, T, k, E));
    CHECK_EQ_INT(nf_bench_unique_experts(ids, T, k, E), k);

    /* uniform: distinct experts per token, every expert hit at large T, counts near T*k/E */
    CHECK_EQ_INT(nf_bench_parse_dist("uniform", E, k, &d, &err), NF_OK);
    nf_bench_route(&d, T, E, k, 1, 0, ids);
    CHECK(distinct_rows(ids, T, k, E));
    CHECK_EQ_INT(nf_bench_unique_experts(ids, T, k, E), E);
    int cnt[128] = {0};
    for (uint32_t i = 0; i < T * k; i++) cnt[ids[i]]++;
    const double mean = (double)T * k / E; /* 256; binomial sd ~ 15.9 */
    int minc = cnt[0], maxc = cnt[0];
    for (uint32_t e = 0; e < E; e++) minc = cnt[e] < minc ? cnt[e] : minc, maxc = cnt[e] > maxc ? cnt[e] : maxc;
    CHECK_MSG(minc > mean - 6 * 16 && maxc < mean + 6 * 16, "uniform counts %d..%d around %.0f", minc, maxc, mean);
    /* deterministic in the seed, different for another seed or layer */
    nf_bench_route(&d, T, E, k, 1, 0, again);
    CHECK(memcmp(ids, again, sizeof(int32_t) * T * k) == 0);
    nf_bench_route(&d, T, E, k, 2, 0, again);
    CHECK(memcmp(ids, again, sizeof(int32_t) * T * k) != 0);
    nf_bench_route(&d, T, E, k, 1, 3, again);
    CHECK(memcmp(ids, again, sizeof(int32_t) * T * k) != 0);

    /* trace-like: skewed. The most popular expert is picked far more often than under uniform,
     * and a small T touches fewer experts than uniform does. */
    CHECK_EQ_INT(nf_bench_parse_dist("trace-like", E, k, &d, &err), NF_OK);
    nf_bench_route(&d, T, E, k, 1, 0, ids);
    CHECK(distinct_rows(ids, T, k, E));
    int tc[128] = {0}, top = 0;
    for (uint32_t i = 0; i < T * k; i++) tc[ids[i]]++;
    for (uint32_t e = 0; e < E; e++) top = tc[e] > top ? tc[e] : top;
    CHECK_MSG(top > 2 * maxc, "trace-like top expert %d vs uniform max %d", top, maxc);
    int32_t small[64 * 8];
    nf_bench_route(&d, 64, E, k, 1, 0, small);
    uint32_t u_trace = nf_bench_unique_experts(small, 64, k, E);
    nf_moe_dist un;
    nf_bench_parse_dist("uniform", E, k, &un, &err);
    nf_bench_route(&un, 64, E, k, 1, 0, small);
    CHECK_MSG(u_trace < nf_bench_unique_experts(small, 64, k, E), "trace-like %u unique vs uniform %u", u_trace,
              nf_bench_unique_experts(small, 64, k, E));

    /* file: a recorded trace, cycled; bad files are refused with the position */
    const char *path = "/tmp/nf_test_routing.txt";
    FILE *f = fopen(path, "w");
    fprintf(f, "0 1 2 3 4 5 6 7\n8,9,10,11,12,13,14,15\n");
    fclose(f);
    char spec[64];
    snprintf(spec, sizeof spec, "file:%s", path);
    CHECK_EQ_INT(nf_bench_parse_dist(spec, E, k, &d, &err), NF_OK);
    nf_bench_route(&d, 5, E, k, 1, 0, ids);
    CHECK_EQ_INT(ids[0], 0);
    CHECK_EQ_INT(ids[8 + 7], 15);
    CHECK_EQ_INT(ids[16], 0); /* cycled */
    CHECK_EQ_INT(nf_bench_unique_experts(ids, 5, k, E), 16);
    nf_bench_dist_free(&d);
    f = fopen(path, "w");
    fprintf(f, "0 1 2 3 4 5 6 7 200\n");
    fclose(f);
    CHECK_EQ_INT(nf_bench_parse_dist(spec, E, k, &d, &err), NF_ERR_FORMAT);
    CHECK_CONTAINS(err.msg, "id 200 at position 8");
    f = fopen(path, "w");
    fprintf(f, "0 1 2 3 4 5 6 6\n");
    fclose(f);
    CHECK_EQ_INT(nf_bench_parse_dist(spec, E, k, &d, &err), NF_ERR_FORMAT);
    CHECK_CONTAINS(err.msg, "twice");
    f = fopen(path, "w");
    fprintf(f, "0 1 2\n");
    fclose(f);
    CHECK_EQ_INT(nf_bench_parse_dist(spec, E, k, &d, &err), NF_ERR_FORMAT);
    CHECK_CONTAINS(err.msg, "multiple of top-k 8");
    remove(path);
    CHECK_EQ_INT(nf_bench_parse_dist("file:/nonexistent/x", E, k, &d, &err), NF_ERR_IO);
    CHECK_EQ_INT(nf_bench_parse_dist("zipf", E, k, &d, &err), NF_ERR_INVALID_ARG);
    free(ids);
    free(again);
}

static void test_accounting(void)
{
    const nf_moe_geometry *g = nf_bench_geometry("qwen3-30b-a3b");
    CHECK(g != NULL);
    nf_moe_profile p;
    nf_error err;
    CHECK_EQ_INT(nf_bench_parse_profile("q4_k+q6_k", 0, &p, &err), NF_OK);
    /* one token through 8 experts: q4_k gate/up (1536 rows of 8 blocks of 144 bytes) and q6_k down
     * (2048 rows of 3 blocks of 210 bytes), plus the bf16 router 128 x 2048 */
    int32_t ids[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    const uint64_t per = 1536ull * 8 * 144 + 2048ull * 3 * 210;
    CHECK_EQ_U64(nf_bench_unique_bytes(g, &p, ids, 1), 128ull * 2048 * 2 + 8 * per);
    /* a second token on the same experts reads nothing new */
    int32_t two[16] = {0, 1, 2, 3, 4, 5, 6, 7, 7, 6, 5, 4, 3, 2, 1, 0};
    CHECK_EQ_U64(nf_bench_unique_bytes(g, &p, two, 2), 128ull * 2048 * 2 + 8 * per);
    /* nvfp4: half a byte per weight plus a scale byte per 16 */
    CHECK_EQ_INT(nf_bench_parse_profile("nvfp4", 0, &p, &err), NF_OK);
    CHECK_EQ_U64(nf_bench_matrix_bytes(p.gu, 1536, 2048), 1536ull * 2048 / 2 + 1536ull * 2048 / 16);
    /* a shared expert adds its bytes once */
    const nf_moe_geometry *q35 = nf_bench_geometry("qwen3.5-35b-a3b");
    CHECK_EQ_INT(nf_bench_parse_profile("q4_k+q6_k", 1, &p, &err), NF_OK);
    CHECK_EQ_INT(p.sgu, NF_CODEC_Q8_0);
    const uint64_t with = nf_bench_unique_bytes(q35, &p, ids, 1);
    const uint64_t shared = 1024ull * 2048 / 32 * 34 + 2048ull * 512 / 32 * 34 + 2048 * 2;
    const uint64_t per35 = 1024ull * 8 * 144 + 2048ull * 2 * 210;
    CHECK_EQ_U64(with, 256ull * 2048 * 2 + 8 * per35 + shared);
    /* FLOPs: router + 8 experts of 3 matrices, 2 FLOPs per multiply-add */
    CHECK(fabs(nf_bench_flops(g, 1) - (2.0 * 128 * 2048 + 2.0 * 8 * (1536.0 * 2048 + 2048.0 * 768))) < 1);
    CHECK(fabs(nf_bench_flops(g, 10) - 10 * nf_bench_flops(g, 1)) < 1);
}

static void test_parsing(void)
{
    nf_error err;
    nf_moe_profile p;
    CHECK_EQ_INT(nf_bench_parse_profile("q8_0+q8_0", 0, &p, &err), NF_OK);
    CHECK(strcmp(p.name, "q8_0+q8_0") == 0);
    CHECK_EQ_INT(nf_bench_parse_profile("bf16", 1, &p, &err), NF_OK);
    CHECK_EQ_INT(p.sgu, NF_CODEC_BF16);
    CHECK_EQ_INT(nf_bench_parse_profile("q4_k+q5_k/q6_k+q6_k", 1, &p, &err), NF_OK);
    CHECK(strcmp(p.name, "q4_k+q5_k/q6_k+q6_k") == 0);
    CHECK_EQ_INT(nf_bench_parse_profile("q4_k+q5_k/q6_k+q6_k", 0, &p, &err), NF_ERR_INVALID_ARG);
    CHECK_CONTAINS(err.msg, "has none");
    CHECK_EQ_INT(nf_bench_parse_profile("q4_k+q9_k", 0, &p, &err), NF_ERR_INVALID_ARG);
    CHECK_CONTAINS(err.msg, "'q4_k+q9_k' is not a profile");
    nf_moe_profile all[16];
    CHECK(nf_bench_all_profiles(0, all, 16) >= 6);

    uint32_t T[128];
    int n = 0;
    CHECK_EQ_INT(nf_bench_parse_tokens("1,2,4,4096", 0, T, &n, 128, &err), NF_OK);
    CHECK_EQ_INT(n, 4);
    CHECK_EQ_INT(T[3], 4096);
    CHECK_EQ_INT(nf_bench_parse_tokens("3:7", 1, T, &n, 128, &err), NF_OK);
    CHECK_EQ_INT(n, 9);
    CHECK_EQ_INT(T[4], 3);
    CHECK_EQ_INT(T[8], 7);
    n = 0;
    CHECK_EQ_INT(nf_bench_parse_tokens("1,,2", 0, T, &n, 128, &err), NF_ERR_INVALID_ARG);
    n = 0;
    CHECK_EQ_INT(nf_bench_parse_tokens("0", 0, T, &n, 128, &err), NF_ERR_INVALID_ARG);
    n = 0;
    CHECK_EQ_INT(nf_bench_parse_tokens("8:2", 1, T, &n, 128, &err), NF_ERR_INVALID_ARG);
    n = 0;
    CHECK_EQ_INT(nf_bench_parse_tokens("1:500", 1, T, &n, 128, &err), NF_ERR_INVALID_ARG);
    CHECK_CONTAINS(err.msg, "more than 128");

    double v[5] = {5, 1, 4, 2, 3};
    CHECK(nf_bench_quantile(v, 5, 0.5) == 3);
    CHECK(nf_bench_quantile(v, 5, 0.0) == 1);
    CHECK(nf_bench_quantile(v, 5, 1.0) == 5);
    CHECK(fabs(nf_bench_quantile(v, 5, 0.1) - 1.4) < 1e-12);
    CHECK(nf_bench_geometry("qwen2-57b-a14b")->S == 20480);
    CHECK(nf_bench_geometry("gpt-5") == NULL);
}

/* Synthetic banks of the import-only codecs (no quantizer: random bytes with finite f16 scales)
 * decode to finite weights: q2_k and q3_k keep their scales last, where random bytes could be an
 * f16 NaN or infinity. */
static void test_import_payloads(void)
{
    const int codecs[] = {NF_CODEC_Q2_K, NF_CODEC_Q3_K, NF_CODEC_IQ4_XS, NF_CODEC_IQ4_NL};
    enum { ROWS = 64, COLS = 512 };
    static float y[COLS];
    for (size_t i = 0; i < sizeof codecs / sizeof codecs[0]; i++) {
        const nf_codec *c = nf_codec_get((nf_codec_id)codecs[i]);
        size_t bytes = 0;
        uint8_t *p = nf_bench_make_payload(codecs[i], 2, ROWS / 2, COLS, 1, 7, &bytes);
        CHECK(p != NULL && bytes == ROWS * nf_codec_row_bytes(c, COLS));
        size_t bad = 0;
        for (int r = 0; p && r < ROWS; r++) {
            c->dequantize_row(p + (size_t)r * nf_codec_row_bytes(c, COLS), y, COLS);
            for (int j = 0; j < COLS; j++) bad += !isfinite(y[j]);
        }
        CHECK_MSG(bad == 0, "%s: %zu non-finite weights in a synthetic bank", c->name, bad);
        free(p);
    }
}

int main(void)
{
    test_parsing();
    test_distributions();
    test_accounting();
    test_import_payloads();
    return nf_test_report();
}

/* `ninfer bench codec`: CPU throughput of every codec's dequantize_row and matvec, in GB/s of
 * encoded bytes, next to a memcpy of the same byte count measured in the same run.
 *
 * Method: one matrix of --size-mib MiB of encoded weights (cols = --cols, rows to fill the size;
 * larger than the last-level cache by default, so each pass streams from DRAM), split by rows over
 * a pool of --threads threads. dequantize decodes each row into a per-thread row buffer that stays
 * in L1 (so it measures decoding, not writing 4-8x more f32 bytes); matvec computes y = W x with
 * the kernel nf_codec_matvec picks (AVX2 when available; --scalar forces the portable one). One
 * warm-up pass, then the median of --repeat passes. The matrix is not a real model's: rows are
 * tiled from 64 distinct quantized random rows (codecs without a quantizer: random bytes with
 * sane f16 scales, nf_codec_fill_random), which does not change the bytes streamed or the work per byte. nvfp4 goes through its
 * plane API (codec/nvfp4.h) on a random plane set with one divisor. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/parallel.h"
#include "base/timer.h"
#include "cli.h"
#include "codec/a8.h"
#include "codec/codec.h"
#include "codec/nvfp4.h"
#include "commands.h"

typedef struct bench_job {
    const nf_codec *c;          /* NULL for nvfp4 */
    const nf_nvfp4_planes *nv;  /* nvfp4 only */
    const uint8_t *w;           /* [rows][row_bytes] (non-planar codecs) */
    size_t row_bytes, rows, cols;
    const float *x;             /* [cols] */
    float *y;                   /* [rows] */
    float *scratch;             /* [threads][cols] row buffers for dequantize */
    nf_matvec_fn mv;
    nf_a8_gemm_fn a8;           /* --a8: the integer kernel, over `tokens` quantised rows xa */
    const uint8_t *xa;
    size_t tokens;
    int scalar;
    uint8_t *dst;               /* memcpy destination, as large as the matrix */
    size_t bytes;
} bench_job;

enum { OP_MEMCPY, OP_DEQUANT, OP_MATVEC };
static int g_op; /* the operation the range function runs */

/* Work items are groups of 16 rows (a multiple of every kernel's row group). */
#define ROWS_PER_ITEM 16

static void run_range(void *ctx, size_t begin, size_t end, int worker)
{
    bench_job *j = ctx;
    size_t r0 = begin * ROWS_PER_ITEM, r1 = end * ROWS_PER_ITEM;
    if (r1 > j->rows) r1 = j->rows;
    if (r0 >= r1) return;
    if (g_op == OP_MEMCPY) {
        size_t b0 = j->bytes * r0 / j->rows, b1 = j->bytes * r1 / j->rows;
        memcpy(j->dst + b0, j->w + b0, b1 - b0);
    } else if (g_op == OP_DEQUANT) {
        float *buf = j->scratch + (size_t)worker * j->cols;
        for (size_t r = r0; r < r1; r++) {
            if (j->nv)
                nf_nvfp4_dequantize_row(j->nv, r, buf);
            else
                j->c->dequantize_row(j->w + r * j->row_bytes, buf, j->cols);
        }
    } else if (j->nv) {
        (j->scalar ? nf_nvfp4_matvec_scalar : nf_nvfp4_matvec)(j->nv, r0, r1 - r0, j->x, j->y + r0);
    } else if (j->a8) {
        j->a8(j->w + r0 * j->row_bytes, j->row_bytes, r1 - r0, j->xa, nf_a8_row_bytes(j->cols), j->tokens, j->y + r0,
              j->rows, j->cols);
    } else {
        j->mv(j->w + r0 * j->row_bytes, j->row_bytes, r1 - r0, j->x, j->y + r0, j->cols);
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median seconds of `repeat` passes of op after one warm-up pass. */
static double time_op(nf_pool *pool, bench_job *j, int op, int repeat)
{
    double t[64];
    size_t items = (j->rows + ROWS_PER_ITEM - 1) / ROWS_PER_ITEM;
    g_op = op;
    nf_parallel_for(pool, items, 1, run_range, j);
    for (int i = 0; i < repeat; i++) {
        uint64_t t0 = nf_time_ns();
        nf_parallel_for(pool, items, 1, run_range, j);
        t[i] = (double)(nf_time_ns() - t0) * 1e-9;
    }
    qsort(t, (size_t)repeat, sizeof t[0], cmp_double);
    return t[repeat / 2];
}

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static uint64_t rnd(void)
{
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return g_rng;
}
static float frand(void) { return (float)((double)(rnd() >> 11) * 0x1.0p-53 * 2.0 - 1.0); }

/* Fills rows x row_bytes with 64 distinct encoded rows, tiled. */
static void fill_matrix(const nf_codec *c, uint8_t *w, size_t rows, size_t cols, size_t rb)
{
    const size_t distinct = rows < 64 ? rows : 64;
    float *src = malloc(cols * sizeof(float));
    for (size_t r = 0; r < distinct; r++) {
        if (c->quantize_row) {
            for (size_t i = 0; i < cols; i++) src[i] = frand() + frand() + frand();
            c->quantize_row(src, w + r * rb, cols);
        } else { /* no quantizer (legacy, import-only): random levels, f16 scales around 0.01 */
            nf_codec_fill_random(c, w + r * rb, rb / c->block_bytes, &g_rng, 0.01f);
        }
    }
    for (size_t r = distinct; r < rows; r++) memcpy(w + r * rb, w + (r % distinct) * rb, rb);
    free(src);
}

/* A random nvfp4 plane set of rows x cols: random nibbles, e4m3 scales in [2^-3, 2^3], divisor 1. */
static int make_nvfp4(size_t rows, size_t cols, uint8_t **payload, nf_nvfp4_planes *p, size_t *bytes)
{
    nf_error err = {0};
    nf_nvfp4_layout l;
    if (nf_nvfp4_layout_of(rows, cols, 1, &l, &err) != NF_OK) return nf_cli_fail("nvfp4: %s", err.msg);
    uint8_t *buf = calloc(1, l.payload_bytes);
    if (!buf) return nf_cli_fail("nvfp4: cannot allocate %llu bytes", (unsigned long long)l.payload_bytes);
    for (uint64_t i = 0; i < l.data_bytes; i++) buf[i] = (uint8_t)rnd();
    for (uint64_t r = 0; r < rows; r++)
        for (uint64_t k = 0; k < cols / 16; k++) buf[l.scale_offset + nf_nvfp4_scale_index(r, k, cols)] = (uint8_t)(0x20 + rnd() % 0x30);
    const float one = 1.0f;
    memcpy(buf + l.divisor_offset, &one, 4);
    if (nf_nvfp4_view(buf, l.payload_bytes, rows, cols, 1, p, &err) != NF_OK) {
        free(buf);
        return nf_cli_fail("nvfp4: %s", err.msg);
    }
    *payload = buf;
    *bytes = l.payload_bytes;
    return 0;
}

static void print_row(const char *name, size_t bytes, double t_cpy, double t_deq, double t_mv)
{
    const double gb = (double)bytes * 1e-9;
    printf("%-6s %9.1f %12.2f %12.2f %12.2f %10.2f\n", name, (double)bytes / 1048576.0, gb / t_deq, gb / t_mv, gb / t_cpy,
           (gb / t_mv) / (gb / t_cpy));
}

int nf_cmd_bench_codec(int argc, char **argv)
{
    long size_mib = 256, repeat = 5, cols = 4096, threads = 0;
    const char *which = "all";
    int scalar = 0, a8 = 0;
    long tokens = 1;
    const nf_opt opts[] = {
        {"--size-mib", 0, NF_OPT_INT, &size_mib, "N", "encoded matrix size in MiB (default 256: above the LLC)", 1, 65536},
        {"--repeat", 0, NF_OPT_INT, &repeat, "N", "timed passes per measurement, median reported (default 5)", 1, 63},
        {"--codec", 0, NF_OPT_STRING, &which, "NAME", "one codec (f32, q4_k, nvfp4, ...) or all (default)", 0, 0},
        {"--cols", 0, NF_OPT_INT, &cols, "N", "row length in elements, a multiple of 256 (default 4096)", 256, 1 << 20},
        {"--threads", 't', NF_OPT_INT, &threads, "N", "worker threads (default: every CPU)", 0, 1024},
        {"--scalar", 0, NF_OPT_FLAG, &scalar, NULL, "use the portable scalar matvec instead of the SIMD one", 0, 0},
        {"--a8", 0, NF_OPT_FLAG, &a8, NULL,
         "matvec with int8 activations (codec/a8.h; ISA nf_isa_selected: NF_CPU_ISA); codecs without one are skipped", 0, 0},
        {"--tokens", 0, NF_OPT_INT, &tokens, "N", "--a8: tokens per product (GB/s then counts the weights once)", 1, 64},
    };
    const nf_cmd_usage u = {
        .name = "bench codec",
        .synopsis = "[--size-mib N] [--repeat N] [--codec NAME|all] [--cols N] [--threads N] [--scalar] [--a8 [--tokens N]]",
        .description = "Dequantize and matvec throughput per codec, in GB/s of encoded bytes, next to a memcpy of\n"
                       "the same size in the same run (median of --repeat passes after a warm-up).",
        .opts = opts,
        .n_opts = NF_CLI_COUNT(opts),
    };
    char *pos[1];
    int npos;
    int r = nf_cli_parse(&u, argc, argv, pos, &npos);
    if (r) return r == NF_CLI_HELP ? 0 : 2;
    if (cols % 256) return nf_cli_fail("bench codec: --cols %ld is not a multiple of 256", cols);
    const int all = strcmp(which, "all") == 0;
    if (!all && !nf_codec_by_name(which)) return nf_cli_fail("bench codec: unknown codec '%s'", which);

    nf_error err = {0};
    nf_pool *pool = NULL;
    if (nf_pool_create((int)threads, &pool, &err) != NF_OK) return nf_cli_fail("bench codec: %s", err.msg);
    const int nt = nf_pool_size(pool);
    const size_t target = (size_t)size_mib << 20;
    uint8_t *dst = malloc(target + (1u << 20));
    float *x = malloc((size_t)cols * sizeof(float)), *scratch = malloc((size_t)nt * (size_t)cols * sizeof(float));
    float *y = malloc((target / 8 + 16) * (size_t)tokens * sizeof(float)); /* >= rows x tokens (>= 8 bytes a row) */
    uint8_t *xa = malloc((size_t)tokens * nf_a8_row_bytes((size_t)cols));
    float *xt = malloc((size_t)cols * sizeof(float));
    if (!dst || !x || !scratch || !y || !xa || !xt) {
        nf_pool_destroy(pool);
        return nf_cli_fail("bench codec: cannot allocate %ld MiB", size_mib);
    }
    for (long i = 0; i < cols; i++) x[i] = frand();
    for (long t = 0; t < tokens; t++) {
        for (long i = 0; i < cols; i++) xt[i] = frand();
        nf_a8_quantize_row(xt, xa + t * nf_a8_row_bytes((size_t)cols), (size_t)cols, nf_isa_selected());
    }
    memset(dst, 1, target); /* fault the destination in before timing */

    printf("bench codec: %ld MiB per codec, %ld columns, %d thread%s, matvec %s, median of %ld (warm-up 1)\n", size_mib,
           cols, nt, nt == 1 ? "" : "s", a8 ? nf_isa_name(nf_isa_selected()) : scalar ? "scalar" : (nf_cpu_has_avx2_fma_f16c() && !getenv("NF_NO_SIMD") ? "AVX2 where the codec has it" : "scalar (no AVX2)"),
           repeat);
    printf("%-6s %9s %12s %12s %12s %10s\n", "codec", "MiB", "dequant GB/s", "matvec GB/s", "memcpy GB/s", "mv/memcpy");
    int rc = 0;
    for (int id = 0; id < NF_CODEC_COUNT && rc == 0; id++) {
        const nf_codec *c = nf_codec_get((nf_codec_id)id);
        if (!c || (!all && strcmp(c->name, which) != 0)) continue;
        if (a8 && !nf_codec_a8_kernel(c, nf_isa_selected())) continue;
        bench_job j = {.c = c, .cols = (size_t)cols, .x = x, .y = y, .scratch = scratch, .scalar = scalar, .dst = dst};
        uint8_t *payload = NULL;
        nf_nvfp4_planes nv;
        if (c->flags & NF_CODEC_PLANAR) {
            size_t rows = target / ((size_t)cols / 2 + (size_t)cols / 16) / 128 * 128;
            if (rows == 0) rows = 128;
            if ((rc = make_nvfp4(rows, (size_t)cols, &payload, &nv, &j.bytes)) != 0) break;
            j.nv = &nv, j.rows = rows, j.w = payload;
        } else {
            j.row_bytes = nf_codec_row_bytes(c, (size_t)cols);
            j.rows = target / j.row_bytes;
            if (j.rows == 0) j.rows = 1;
            j.bytes = j.rows * j.row_bytes;
            payload = malloc(j.bytes);
            if (!payload) {
                rc = nf_cli_fail("bench codec: cannot allocate %zu bytes", j.bytes);
                break;
            }
            fill_matrix(c, payload, j.rows, (size_t)cols, j.row_bytes);
            j.w = payload;
            j.mv = scalar ? c->matvec_scalar : nf_codec_matvec(c);
            if (a8) j.a8 = nf_codec_a8_kernel(c, nf_isa_selected()), j.xa = xa, j.tokens = (size_t)tokens;
        }
        if (j.bytes > target + (1u << 20)) j.bytes = target; /* memcpy never runs past dst */
        double t_cpy = time_op(pool, &j, OP_MEMCPY, (int)repeat);
        double t_deq = time_op(pool, &j, OP_DEQUANT, (int)repeat);
        double t_mv = time_op(pool, &j, OP_MATVEC, (int)repeat);
        double sink = 0;
        for (size_t i = 0; i < j.rows; i += 97) sink += y[i];
        if (!isfinite(sink)) fprintf(stderr, "bench codec: %s: non-finite matvec output\n", c->name);
        print_row(c->name, j.bytes, t_cpy, t_deq, t_mv);
        free(payload);
    }
    free(dst), free(x), free(scratch), free(y), free(xa), free(xt);
    nf_pool_destroy(pool);
    return rc;
}

/* The CPU context and matrix products (see cpu.h for the three paths). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/cpu_internal.h"

nf_cpu_weight nf_cpu_weight_rows(const nf_cpu_weight *w, uint32_t r0, uint32_t n)
{
    nf_cpu_weight v = *w;
    v.rows = n;
    if (w->nv) v.row0 = w->row0 + r0;
    else v.data = w->data + (size_t)r0 * w->row_bytes;
    return v;
}

void nf_cpu_weight_row(const nf_cpu_weight *w, uint32_t r, float *y)
{
    if (w->nv) nf_nvfp4_dequantize_row(w->nv, w->row0 + r, y);
    else w->codec->dequantize_row(w->data + (size_t)r * w->row_bytes, y, w->cols);
}

nf_status nf_cpu_create(int n_threads, uint32_t max_cols, uint32_t max_ctx, nf_cpu **out, nf_error *err)
{
    *out = NULL;
    nf_cpu *c = calloc(1, sizeof *c);
    if (!c) return nf_error_set(err, NF_ERR_NOMEM, "cpu backend: out of memory");
    nf_status st = nf_pool_create(n_threads, &c->pool, err);
    if (st) {
        free(c);
        return st;
    }
    c->n_threads = nf_pool_size(c->pool);
    c->max_cols = max_cols;
    c->max_ctx = max_ctx;
    c->block = calloc((size_t)c->n_threads * NF_CPU_RB * (max_cols ? max_cols : 1), sizeof(float));
    c->scores = calloc((size_t)c->n_threads * NF_CPU_ATTN_SC * (max_ctx ? max_ctx : 1), sizeof(float));
    if (!c->block || !c->scores) {
        nf_cpu_free(c);
        return nf_error_set(err, NF_ERR_NOMEM, "cpu backend: out of memory for %d threads x %u columns scratch",
                            n_threads, max_cols);
    }
    c->matvec_simd = nf_cpu_has_avx2_fma_f16c() && !getenv("NF_NO_SIMD");
    c->a8 = 1;
    c->isa = nf_isa_selected();
    *out = c;
    return NF_OK;
}

void nf_cpu_free(nf_cpu *c)
{
    if (!c) return;
    nf_pool_destroy(c->pool);
    free(c->block);
    free(c->scores);
    free(c->xa);
    free(c);
}

int nf_cpu_threads(const nf_cpu *c) { return c->n_threads; }
nf_pool *nf_cpu_pool(nf_cpu *c) { return c->pool; }
void nf_cpu_set_reference(nf_cpu *c, int on) { c->reference = on; }
int nf_cpu_reference(const nf_cpu *c) { return c->reference; }
void nf_cpu_set_a8(nf_cpu *c, int on) { c->a8 = on; }
int nf_cpu_a8(const nf_cpu *c) { return c->a8; }
void nf_cpu_set_isa(nf_cpu *c, nf_isa isa) { c->isa = isa < nf_isa_detect() ? isa : nf_isa_detect(); }
void nf_cpu_set_a8_tile(nf_cpu *c, int on) { c->no_tile = !on; }

/* ---- one row block of one job ----------------------------------------------------------------- */

/* Rows r0 .. r0 + nb - 1 for token t by the codec's matvec kernel. */
static void block_matvec(const nf_cpu_gemm_job *j, uint32_t r0, uint32_t nb, size_t t)
{
    const nf_cpu_weight *w = &j->w;
    const float *x = j->x + t * j->ldx;
    float *y = j->y + t * j->ldy + r0;
    if (w->nv) {
        nf_nvfp4_matvec(w->nv, w->row0 + r0, nb, x, y);
        return;
    }
    nf_codec_matvec(w->codec)(w->data + (size_t)r0 * w->row_bytes, w->row_bytes, nb, x, y, w->cols);
}

/* f32 tile: y[t][r] = sum_i blk[r][i] * x[t][i] for nb rows, n tokens (scalar fallback). */
void nf_cpu_tile_scalar(const float *blk, size_t nb, size_t cols, const float *x, size_t ldx, size_t n, float *y,
                        size_t ldy)
{
    for (size_t t = 0; t < n; t++) {
        const float *xt = x + t * ldx;
        for (size_t r = 0; r < nb; r++) {
            const float *wr = blk + r * cols;
            float acc[8] = {0};
            size_t i = 0;
            for (; i + 8 <= cols; i += 8)
                for (int l = 0; l < 8; l++) acc[l] += wr[i + l] * xt[i + l];
            float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
            for (; i < cols; i++) s += wr[i] * xt[i];
            y[t * ldy + r] = s;
        }
    }
}

static void block_reference(const nf_cpu_gemm_job *j, uint32_t r0, uint32_t nb, float *blk)
{
    const size_t cols = j->w.cols;
    for (uint32_t r = 0; r < nb; r++) {
        nf_cpu_weight_row(&j->w, r0 + r, blk);
        for (size_t t = 0; t < j->n; t++) {
            const float *xt = j->x + t * j->ldx;
            double s = 0;
            for (size_t i = 0; i < cols; i++) s += (double)blk[i] * xt[i];
            j->y[t * j->ldy + r0 + r] = (float)s;
        }
    }
}

/* One row block over every segment of the job (cpu.h: segments of up to NF_CPU_STEP_MAX tokens by
 * matvec token by token, longer ones by the tile over the block dequantized once). */
/* A job's int8 side (codec/a8.h): its kernel and its tokens' quantised rows, or fn NULL. */
typedef struct a8_job {
    nf_a8_gemm_fn fn;
    nf_a8_tile_fn tile; /* NULL: fn for every segment */
    const uint8_t *xa;
    size_t ldxa;
    const uint8_t *xt; /* the same rows regrouped for the AMX tile (codec/a8.h nf_a8_xt), or NULL */
    size_t xt_T;       /* the rows' count (xt's columns) */
} a8_job;

/* Segment g of n tokens runs token by token (cpu.h). */
static int by_token(const nf_cpu_gemm_job *j, size_t g, size_t n)
{
    return j->seg_step ? j->seg_step[g] : n <= NF_CPU_STEP_MAX;
}

static void run_block(nf_cpu *c, const nf_cpu_gemm_job *j, const a8_job *q, uint32_t r0, int worker)
{
    uint32_t nb = j->w.rows - r0 < NF_CPU_RB ? j->w.rows - r0 : NF_CPU_RB;
    float *blk = c->block + (size_t)worker * NF_CPU_RB * c->max_cols;
    if (c->reference) {
        block_reference(j, r0, nb, blk);
        return;
    }
    if (q && q->fn) { /* int8 activations: short segments token by token by the kernel, longer ones by the tile */
        const uint32_t whole[2] = {0, (uint32_t)j->n}, *seg = j->seg ? j->seg : whole;
        const size_t n_seg = j->seg ? j->n_seg : 1;
        const uint8_t *wr = j->w.data + (size_t)r0 * j->w.row_bytes;
        for (size_t g = 0; g < n_seg; g++) {
            const size_t t0 = seg[g], n = seg[g + 1] - t0;
            if (!by_token(j, g, n) && q->tile) {
                const nf_a8_xt xt = {q->xt, q->xt_T, t0};
                q->tile(wr, j->w.row_bytes, nb, q->xa + t0 * q->ldxa, q->ldxa, n, j->y + t0 * j->ldy + r0, j->ldy,
                        j->w.cols, blk, q->xt ? &xt : NULL);
            }
            else /* the kernel: every token gets its one-token (decode) bits however many it takes at once */
                q->fn(wr, j->w.row_bytes, nb, q->xa + t0 * q->ldxa, q->ldxa, n, j->y + t0 * j->ldy + r0, j->ldy, j->w.cols);
        }
        return;
    }
    const uint32_t whole[2] = {0, (uint32_t)j->n}, *seg = j->seg ? j->seg : whole;
    const size_t n_seg = j->seg ? j->n_seg : 1;
    int decoded = 0;
    for (size_t g = 0; g < n_seg; g++) {
        const size_t t0 = seg[g], n = seg[g + 1] - t0;
        if (by_token(j, g, n)) { /* as decoding them would: speculation's verification (cpu.h) */
            for (size_t t = t0; t < t0 + n; t++) block_matvec(j, r0, nb, t);
            continue;
        }
        if (!decoded)
            for (uint32_t r = 0; r < nb; r++) nf_cpu_weight_row(&j->w, r0 + r, blk + (size_t)r * j->w.cols);
        decoded = 1;
        const float *x = j->x + t0 * j->ldx;
        float *y = j->y + t0 * j->ldy + r0;
        if (c->matvec_simd) nf_cpu_tile_avx2(blk, nb, j->w.cols, x, j->ldx, n, y, j->ldy);
        else nf_cpu_tile_scalar(blk, nb, j->w.cols, x, j->ldx, n, y, j->ldy);
    }
}

/* ---- the batch: row blocks of every job as one parallel-for ------------------------------------ */

typedef struct batch_ctx {
    nf_cpu *c;
    const nf_cpu_gemm_job *jobs;
    const a8_job *a8; /* [n_jobs] or NULL */
    size_t n_jobs;
    const size_t *first; /* [n_jobs + 1] first work item of each job */
} batch_ctx;

/* The index j with first[j] <= it < first[j + 1]. */
static size_t find(const size_t *first, size_t n, size_t it)
{
    size_t lo = 0, hi = n;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (first[mid] <= it) lo = mid;
        else hi = mid;
    }
    return lo;
}

/* Whether every segment of the job runs the int8 kernel (no tile, no scratch): then its row blocks
 * may go to the kernel in one call, which gives each row the same bits as one call per block. */
static int kernel_only(const nf_cpu *c, const nf_cpu_gemm_job *j, const a8_job *q)
{
    if (c->reference || !q || !q->fn) return 0;
    if (!j->seg) return by_token(j, 0, j->n) || !q->tile;
    for (size_t g = 0; g < j->n_seg; g++)
        if (!by_token(j, g, j->seg[g + 1] - j->seg[g]) && q->tile) return 0;
    return 1;
}

/* Consecutive row blocks of one kernel-only job run as one kernel call (its prefetch then runs
 * ahead across them: q8_0's next row group); other jobs one block at a time. */
static void batch_fn(void *ctx, size_t begin, size_t end, int worker)
{
    batch_ctx *b = ctx;
    for (size_t it = begin; it < end;) {
        const size_t lo = find(b->first, b->n_jobs, it), stop = end < b->first[lo + 1] ? end : b->first[lo + 1];
        const nf_cpu_gemm_job *j = &b->jobs[lo];
        const a8_job *q = b->a8 ? &b->a8[lo] : NULL;
        const uint32_t r0 = (uint32_t)((it - b->first[lo]) * NF_CPU_RB);
        if (!kernel_only(b->c, j, q)) {
            run_block(b->c, j, q, r0, worker);
            it++;
            continue;
        }
        const uint32_t r1 = (uint32_t)((stop - b->first[lo]) * NF_CPU_RB), nr = (r1 < j->w.rows ? r1 : j->w.rows) - r0;
        const uint32_t whole[2] = {0, (uint32_t)j->n}, *seg = j->seg ? j->seg : whole;
        const size_t n_seg = j->seg ? j->n_seg : 1;
        for (size_t g = 0; g < n_seg; g++)
            q->fn(j->w.data + (size_t)r0 * j->w.row_bytes, j->w.row_bytes, nr, q->xa + seg[g] * q->ldxa, q->ldxa,
                  seg[g + 1] - seg[g], j->y + seg[g] * j->ldy + r0, j->ldy, j->w.cols);
        it = stop;
    }
}

/* ---- int8 activations: each distinct input of the batch quantised once ------------------------- */

typedef struct a8_src {
    const float *x;
    size_t ldx, n, cols;
    uint8_t *dst; /* n rows of nf_a8_row_bytes(cols) */
    uint8_t *xt;  /* NULL, or the rows regrouped (nf_a8_xt_bytes(cols, n)) for a tile that reads them */
} a8_src;

typedef struct quant_ctx {
    const a8_src *src;
    size_t n_src;
    const size_t *first; /* [n_src + 1] first row of each source */
    nf_isa isa;
} quant_ctx;

static void quant_fn(void *ctx, size_t begin, size_t end, int worker)
{
    (void)worker;
    const quant_ctx *q = ctx;
    for (size_t it = begin; it < end; it++) {
        const size_t s = find(q->first, q->n_src, it), t = it - q->first[s];
        const a8_src *a = &q->src[s];
        nf_a8_quantize_row(a->x + t * a->ldx, a->dst + t * nf_a8_row_bytes(a->cols), a->cols, q->isa);
    }
}

/* The regrouped rows (nf_a8_xt) of the sources that have them, 16 tokens per work item. */
static void xt_fn(void *ctx, size_t begin, size_t end, int worker)
{
    (void)worker;
    const quant_ctx *q = ctx;
    for (size_t it = begin; it < end; it++) {
        const size_t s = find(q->first, q->n_src, it), g = it - q->first[s];
        const a8_src *a = &q->src[s];
        const size_t t0 = 16 * g, nt = a->n - t0 < 16 ? a->n - t0 : 16, rb = nf_a8_row_bytes(a->cols);
        nf_a8_xt_fill(a->dst, rb, a->cols, a->n, t0, nt, a->xt, q->isa);
    }
}

/* Fills a8[j] for the jobs that take int8 activations. Returns 0 when none does or when memory
 * runs out (then every job runs with f32 activations). */
static int prepare_a8(nf_cpu *c, const nf_cpu_gemm_job *jobs, size_t n_jobs, a8_job *a8)
{
    a8_src stack[32], *src = n_jobs <= 32 ? stack : malloc(n_jobs * sizeof *src);
    size_t stack_first[33], *first = n_jobs <= 32 ? stack_first : malloc((n_jobs + 1) * sizeof *first);
    size_t which_stack[32], *which = n_jobs <= 32 ? which_stack : malloc(n_jobs * sizeof *which);
    size_t n_src = 0, bytes = 0;
    int any = 0;
    if (!src || !first || !which) goto out;
    for (size_t j = 0; j < n_jobs; j++) {
        const nf_cpu_gemm_job *jb = &jobs[j];
        a8[j].fn = jb->w.nv || !jb->n || jb->w.cols % NF_A8_BLOCK ? NULL : nf_codec_a8_kernel(jb->w.codec, c->isa);
        /* the tile's scratch is the worker's f32 block buffer: 64 max_cols >= 48 cols + 256 bytes */
        a8[j].tile = a8[j].fn && jb->w.cols % 64 == 0 && jb->w.cols >= 16 && !c->no_tile
                         ? nf_codec_a8_tile(jb->w.codec, c->isa) : NULL;
        if (!a8[j].fn) continue;
        size_t s = 0;
        while (s < n_src && !(src[s].x == jb->x && src[s].ldx == jb->ldx && src[s].n == jb->n && src[s].cols == jb->w.cols))
            s++;
        if (s == n_src) {
            src[n_src++] = (a8_src){jb->x, jb->ldx, jb->n, jb->w.cols, NULL, NULL};
            bytes += jb->n * nf_a8_row_bytes(jb->w.cols);
        }
        /* the AMX tile reads the rows regrouped: once per source, when a segment of one of its jobs takes the
         * tile (an expert's group of a few tokens of a long prompt does: segments are cut by sequence, not by
         * the group's size; the AMX tile itself runs the AVX-512 one on a segment too short for it) */
        if (a8[j].tile && nf_a8_tile_wants_xt(c->isa) && !kernel_only(c, jb, &a8[j]) && !src[s].xt) {
            src[s].xt = (uint8_t *)1; /* marked; placed below */
            bytes += nf_a8_xt_bytes(jb->w.cols, jb->n);
        }
        which[j] = s;
        any = 1;
    }
    if (!any) goto out;
    if (bytes > c->xa_cap) {
        uint8_t *p = malloc(bytes);
        if (!p) {
            any = 0;
            goto out;
        }
        free(c->xa);
        c->xa = p, c->xa_cap = bytes;
    }
    size_t off = 0;
    first[0] = 0;
    for (size_t s = 0; s < n_src; s++) {
        src[s].dst = c->xa + off;
        off += src[s].n * nf_a8_row_bytes(src[s].cols);
        if (src[s].xt) {
            src[s].xt = c->xa + off;
            nf_a8_xt_pad(src[s].xt, src[s].cols, src[s].n);
            off += nf_a8_xt_bytes(src[s].cols, src[s].n);
        }
        first[s + 1] = first[s] + src[s].n;
    }
    quant_ctx q = {src, n_src, first, c->isa};
    if (first[n_src] * src[0].cols >= 16384) nf_parallel_for(c->pool, first[n_src], 4, quant_fn, &q);
    else quant_fn(&q, 0, first[n_src], 0);
    size_t xt_items = 0; /* first[] reused: the sources' first 16-token group (none without xt) */
    first[0] = 0;
    for (size_t s = 0; s < n_src; s++) first[s + 1] = first[s] + (src[s].xt ? (src[s].n + 15) / 16 : 0);
    xt_items = first[n_src];
    if (xt_items > 1) nf_parallel_for(c->pool, xt_items, 1, xt_fn, &q);
    else if (xt_items) xt_fn(&q, 0, xt_items, 0);
    for (size_t j = 0; j < n_jobs; j++)
        if (a8[j].fn) {
            a8[j].xa = src[which[j]].dst, a8[j].ldxa = nf_a8_row_bytes(jobs[j].w.cols);
            a8[j].xt = src[which[j]].xt, a8[j].xt_T = src[which[j]].n;
        }
out:
    if (src != stack) free(src);
    if (first != stack_first) free(first);
    if (which != which_stack) free(which);
    return any;
}

void nf_cpu_gemm_batch(nf_cpu *c, const nf_cpu_gemm_job *jobs, size_t n_jobs)
{
    size_t stack[65], *first = n_jobs < 64 ? stack : malloc((n_jobs + 1) * sizeof *first);
    a8_job a8_stack[64], *a8 = NULL;
    if (c->a8 && !c->reference && n_jobs) {
        a8 = n_jobs <= 64 ? a8_stack : malloc(n_jobs * sizeof *a8);
        if (a8 && !prepare_a8(c, jobs, n_jobs, a8)) {
            if (a8 != a8_stack) free(a8);
            a8 = NULL;
        }
    }
    if (!first) { /* no memory for the index: run the jobs one at a time */
        if (a8 && a8 != a8_stack) free(a8);
        for (size_t j = 0; j < n_jobs; j++) nf_cpu_gemm_batch(c, jobs + j, 1);
        return;
    }
    first[0] = 0;
    for (size_t j = 0; j < n_jobs; j++)
        first[j + 1] = first[j] + (jobs[j].n ? (jobs[j].w.rows + NF_CPU_RB - 1) / NF_CPU_RB : 0);
    batch_ctx b = {c, jobs, a8, n_jobs, first};
    /* Guided claims (long runs of consecutive blocks first, short ones last so the threads end together):
     * a kernel-only (decoding) run is one long kernel call whose prefetch streams ahead, and a tile's
     * prefetch of the next 16-row block during its first token pass lands in the cache of the thread
     * that runs that block (with claims of one block the other thread usually took it; MoE prefill
     * from DRAM, perf/cpu_2026-12-06d.md) */
    if (first[n_jobs]) nf_parallel_for_guided(c->pool, first[n_jobs], 1, batch_fn, &b);
    if (first != stack) free(first);
    if (a8 && a8 != a8_stack) free(a8);
}

void nf_cpu_gemm(nf_cpu *c, const nf_cpu_weight *w, const float *x, size_t ldx, float *y, size_t ldy, size_t n)
{
    nf_cpu_gemm_job j = {*w, x, ldx, y, ldy, n, NULL, 0, NULL};
    nf_cpu_gemm_batch(c, &j, 1);
}

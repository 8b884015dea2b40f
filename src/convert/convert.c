/* Executing a conversion plan: see convert.h and docs/convert.md. */
#define _DEFAULT_SOURCE /* madvise */
#include "convert/convert.h"

/* Tensor names are built into fixed buffers far longer than any checkpoint key; an over-long name would
 * truncate and then be reported as a missing tensor, which is the right outcome. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/fnv.h"
#include "base/log.h"
#include "base/parallel.h"
#include "base/timer.h"
#include "codec/nvfp4.h"
#include "convert/modelmeta.h"
#include "convert/tokmeta.h"
#include "format/artifact.h"

enum { BATCH_BYTES = 4u << 20 };

/* ---- source access --------------------------------------------------------------------------- */

static const nf_st_tensor *st_key(const nf_plan *p, const char *m, const char *suffix)
{
    char key[320];
    snprintf(key, sizeof key, "%s%s", m, suffix);
    return nf_st_set_find(p->st, key);
}

/* The source row of part row r: llama.cpp permuted GGUF llama q/k rows within each head as
 * (pair index, half) -> 2 * pair + half; the HF order is half * hd/2 + pair. */
static uint64_t src_row(const nf_plan_part *q, uint64_t r)
{
    if (!q->rope_heads) return q->row0 + r;
    uint64_t hd = q->rows / q->rope_heads, h = r / hd, i = r % hd, half = i / (hd / 2), pair = i % (hd / 2);
    return q->row0 + h * hd + 2 * pair + half;
}

/* Encoded bytes of the part's source row (dense and GGUF kinds), and their codec. */
static const uint8_t *part_bytes(const nf_plan *p, const nf_plan_part *q, uint64_t cols, uint64_t r, size_t *n)
{
    const nf_codec *c = nf_codec_get(q->src_codec);
    size_t rb = nf_codec_row_bytes(c, cols);
    *n = rb;
    const uint8_t *base;
    if (q->kind == NF_PART_GGUF) base = nf_gguf_find_tensor(p->gguf, q->src)->data;
    else base = nf_st_set_find(p->st, q->src)->data;
    return base + src_row(q, r) * rb;
}

/* One row of an NVFP4 source: e2m1 * (e4m3 / divisor), each step in fp32. */
static void nvfp4_src_row(const nf_plan *p, const nf_plan_part *q, uint64_t cols, uint64_t r, float *y)
{
    const nf_st_tensor *w = st_key(p, q->src, q->kind == NF_PART_CT_NVFP4 ? ".weight_packed" : ".weight");
    const nf_st_tensor *sc = st_key(p, q->src, ".weight_scale");
    uint64_t sr = src_row(q, r);
    const uint8_t *d = (const uint8_t *)w->data + sr * (cols / 2), *s = (const uint8_t *)sc->data + sr * (cols / 16);
    for (uint64_t k = 0; k < cols; k++) {
        uint8_t nib = (uint8_t)((d[k / 2] >> (4 * (k & 1))) & 15);
        float scale = nf_e4m3_to_f32(s[k / 16]) / q->divisor;
        y[k] = nf_e2m1_to_f32(nib) * scale;
    }
}

/* The A_log the artifact stores for a GGUF ssm_a value a = -exp(A_log): the f32 nearest log(-a) (in
 * double), moved by up to 8 ulps to one whose -expf() is a bit for bit when the nearest is not, so
 * the engines' -expf(a_log) (backend/cpu/gdn.c) reproduces the GGUF's ssm_a exactly. The plan has
 * refused a >= 0 (gguf_check_ssm_a in plan_gguf.c). */
static float a_log_of(float a)
{
    float x0 = (float)log(-(double)a), lo = x0, hi = x0;
    if (!(a < 0) || !isfinite(x0) || -expf(x0) == a) return x0;
    for (int k = 0; k < 8; k++) {
        lo = nextafterf(lo, -INFINITY);
        hi = nextafterf(hi, INFINITY);
        if (-expf(lo) == a) return lo;
        if (-expf(hi) == a) return hi;
    }
    return x0;
}

/* Column group g of a tiled row: the source group it comes from (plan.h, untile_k/untile_w). */
static uint64_t untile_src_group(const nf_plan_part *q, uint64_t cols, uint64_t g)
{
    uint64_t k = q->untile_k, r = cols / q->untile_w / k, h = g / r, i = g % r;
    return i * k + h;
}

/* Copies one encoded source row of a part into dst (COPY action): as stored, or with its column
 * groups un-tiled whole blocks at a time (the plan allows it only when untile_w is a multiple of
 * the codec's block). */
static void copy_part_row(const nf_plan *p, const nf_plan_part *q, uint64_t cols, uint64_t r, uint8_t *dst)
{
    size_t rb;
    const uint8_t *src = part_bytes(p, q, cols, r, &rb);
    if (!q->untile_w) {
        memcpy(dst, src, rb);
        return;
    }
    size_t gb = nf_codec_row_bytes(nf_codec_get(q->src_codec), q->untile_w);
    for (uint64_t g = 0; g < cols / q->untile_w; g++) memcpy(dst + g * gb, src + untile_src_group(q, cols, g) * gb, gb);
}

nf_status nf_convert_part_row(const nf_plan *p, const nf_plan_part *q, uint64_t cols, uint64_t r, float *y,
                              nf_error *err)
{
    if (r >= q->rows) return nf_error_set(err, NF_ERR_INVALID_ARG, "%s: row %llu of %llu", q->src,
                                          (unsigned long long)r, (unsigned long long)q->rows);
    if (q->kind == NF_PART_CT_NVFP4 || q->kind == NF_PART_MO_NVFP4) {
        nvfp4_src_row(p, q, cols, r, y);
        return NF_OK;
    }
    size_t n;
    const uint8_t *b = part_bytes(p, q, cols, r, &n);
    const nf_codec *sc = nf_codec_get(q->src_codec);
    if (q->untile_w && q->untile_w % sc->block_elems == 0) { /* column groups back from the tiled v-head order */
        size_t gb = nf_codec_row_bytes(sc, q->untile_w);
        for (uint64_t g = 0; g < cols / q->untile_w; g++)
            sc->dequantize_row(b + untile_src_group(q, cols, g) * gb, y + g * q->untile_w, q->untile_w);
    } else if (q->untile_w) { /* groups that split blocks: each block they touch decoded on its own */
        float blk[256];
        const uint64_t B = sc->block_elems, w = q->untile_w;
        const size_t bb = nf_codec_row_bytes(sc, B);
        if (B > 256) return nf_error_set(err, NF_ERR_INTERNAL, "%s: %s blocks of %llu", q->src, sc->name,
                                         (unsigned long long)B);
        for (uint64_t g = 0; g < cols / w; g++) {
            uint64_t c0 = untile_src_group(q, cols, g) * w; /* source columns [c0, c0 + w) -> y[g w ...] */
            for (uint64_t k = c0 / B; k * B < c0 + w; k++) {
                sc->dequantize_row(b + k * bb, blk, B);
                uint64_t lo = k * B > c0 ? k * B : c0, hi = (k + 1) * B < c0 + w ? (k + 1) * B : c0 + w;
                memcpy(y + g * w + (lo - c0), blk + (lo - k * B), (hi - lo) * sizeof *blk);
            }
        }
    } else
        nf_codec_get(q->src_codec)->dequantize_row(b, y, cols);
    if (q->neg_exp_log)
        for (uint64_t k = 0; k < cols; k++) y[k] = a_log_of(y[k]);
    if (q->add != 0) /* 1 + w in f32, as transformers' (1.0 + self.weight.float()) */
        for (uint64_t k = 0; k < cols; k++) y[k] += q->add;
    return NF_OK;
}

/* Drops the mapped source pages of a tensor's parts: they were read once and are not needed again,
 * so they should not stay in this process's resident set. */
static void drop_pages(const void *data, uint64_t n)
{
    if (!data || !n) return;
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)data & ~(uintptr_t)(pg - 1), hi = (uintptr_t)data + n;
    (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

/* Source bytes a part reads (the progress figure). */
static uint64_t part_src_bytes(const nf_plan *p, const nf_plan_part *q)
{
    const char *const sfx[] = {".weight_packed", ".weight", ".weight_scale"};
    uint64_t tot = 0;
    if (q->kind == NF_PART_GGUF) {
        const nf_gguf_tensor *g = nf_gguf_find_tensor(p->gguf, q->src);
        return g->nbytes;
    }
    if (q->kind == NF_PART_DENSE) {
        const nf_st_tensor *s = nf_st_set_find(p->st, q->src);
        return s->nbytes;
    }
    for (int i = 0; i < 3; i++) {
        const nf_st_tensor *s = st_key(p, q->src, sfx[i]);
        if (s && (i != 1 || s->dtype == NF_ST_U8)) tot += s->nbytes;
    }
    return tot;
}

/* The mapped extent of every source file: [lo, lo + n) covers all its tensors' bytes. */
typedef struct src_span {
    const uint8_t *lo;
    uint64_t n;
} src_span;

static void span_add(src_span *sp, const void *data, uint64_t n)
{
    const uint8_t *a = data, *b = a + n, *end = sp->lo ? sp->lo + sp->n : NULL;
    if (!n) return;
    if (!sp->lo || a < sp->lo) sp->lo = a;
    if (!end || b > end) end = b;
    sp->n = (uint64_t)(end - sp->lo);
}

/* Drops every mapped source page. Called after each batch of output rows: a stacked tensor (an
 * expert bank of hundreds of MB from hundreds of sources) then never holds more than about a batch
 * of its source resident. All sources, not only the batch's rows: the kernel maps pages around each
 * fault (fault-around, whole large folios), so reading a source also maps the edges of its
 * neighbours in the file, some already converted, a few hundred KiB per source matrix, without
 * bound over a checkpoint of thousands of them. Pages needed again fault back in from the page
 * cache; the walk over a mostly unmapped range costs little next to a 4 MiB batch. */
static void drop_sources(const src_span *sp, size_t n)
{
    for (size_t k = 0; k < n; k++) drop_pages(sp[k].lo, sp[k].n);
}

/* One span per safetensors shard, or one for the GGUF. *n_out = 0 when out of memory (the per-part
 * drops still apply). */
static src_span *source_spans(const nf_plan *p, size_t *n_out)
{
    size_t n = p->src_kind == NF_SRC_GGUF ? 1 : nf_st_set_shard_count(p->st);
    src_span *sp = calloc(n ? n : 1, sizeof *sp);
    *n_out = sp ? n : 0;
    if (!sp) return NULL;
    if (p->src_kind == NF_SRC_GGUF) {
        for (size_t i = 0; i < nf_gguf_tensor_count(p->gguf); i++) {
            const nf_gguf_tensor *g = nf_gguf_tensor_at(p->gguf, i);
            span_add(&sp[0], g->data, g->nbytes);
        }
        return sp;
    }
    for (size_t k = 0; k < n; k++) {
        const nf_safetensors *f = nf_st_set_shard(p->st, k);
        for (size_t i = 0; i < nf_safetensors_count(f); i++) {
            const nf_st_tensor *t = nf_safetensors_at(f, i);
            span_add(&sp[k], t->data, t->nbytes);
        }
    }
    return sp;
}

/* ---- encoding -------------------------------------------------------------------------------- */

typedef struct enc_job {
    const nf_plan *p;
    const nf_plan_tensor *t;
    uint64_t row0;      /* first output row of the batch */
    uint64_t cols;
    size_t row_bytes;
    uint8_t *out;       /* [batch rows][row_bytes] */
    float *scratch;     /* [workers][cols] */
} enc_job;

/* Output row -> (part, row in part). */
static const nf_plan_part *locate(const nf_plan_tensor *t, uint64_t row, uint64_t *r)
{
    for (uint32_t i = 0; i < t->n_parts; i++) {
        if (row < t->parts[i].rows) {
            *r = row;
            return &t->parts[i];
        }
        row -= t->parts[i].rows;
    }
    return NULL;
}

static void enc_rows(void *ctx, size_t b, size_t e, int worker)
{
    enc_job *j = ctx;
    float *y = j->scratch + (size_t)worker * j->cols;
    const nf_codec *c = nf_codec_get(j->t->codec);
    for (size_t i = b; i < e; i++) {
        uint64_t r = 0;
        const nf_plan_part *q = locate(j->t, j->row0 + i, &r);
        nf_convert_part_row(j->p, q, j->cols, r, y, NULL);
        c->quantize_row(y, j->out + i * j->row_bytes, j->cols);
    }
}

static uint64_t tensor_rows(const nf_plan_tensor *t)
{
    uint64_t rows = 1;
    for (uint32_t i = 0; i + 1 < t->n_dims; i++) rows *= t->dims[i];
    return rows;
}

/* ENCODE and COPY: rows in batches of about BATCH_BYTES. */
static nf_status write_rows(const nf_plan *p, const nf_plan_tensor *t, nf_artifact_writer *w, nf_pool *pool,
                            const src_span *sp, size_t n_sp, nf_error *err)
{
    uint64_t rows = tensor_rows(t), cols = t->dims[t->n_dims - 1];
    size_t rb = nf_codec_row_bytes(nf_codec_get(t->codec), cols);
    uint64_t batch = BATCH_BYTES / rb ? BATCH_BYTES / rb : 1;
    uint8_t *out = malloc((size_t)(batch < rows ? batch : rows) * rb);
    float *scratch = malloc((size_t)nf_pool_size(pool) * cols * sizeof(float));
    nf_status s = out && scratch ? NF_OK : nf_error_set(err, NF_ERR_NOMEM, "%s: out of memory", t->name);
    /* import-only and dequant-only codecs can be copied, never encoded: a plan that asks is a bug */
    if (s == NF_OK && t->action != NF_ACT_COPY && !nf_codec_get(t->codec)->quantize_row)
        s = nf_error_set(err, NF_ERR_INTERNAL, "%s: planned as an encode to %s, which has no quantizer", t->name,
                         nf_codec_get(t->codec)->name);
    for (uint64_t r0 = 0; r0 < rows && s == NF_OK; r0 += batch) {
        uint64_t n = rows - r0 < batch ? rows - r0 : batch;
        if (t->action == NF_ACT_COPY) {
            for (uint64_t i = 0; i < n; i++) {
                uint64_t r = 0;
                const nf_plan_part *q = locate(t, r0 + i, &r);
                copy_part_row(p, q, cols, r, out + i * rb);
            }
        } else {
            enc_job j = {p, t, r0, cols, rb, out, scratch};
            nf_parallel_for(pool, (size_t)n, 8, enc_rows, &j);
        }
        s = nf_artifact_writer_write(w, out, (size_t)(n * rb), err);
        drop_sources(sp, n_sp);
    }
    free(out);
    free(scratch);
    return s;
}

/* ---- nvfp4: streamed ------------------------------------------------------------------------- */

/* An nvfp4 tensor is written as it is produced (codec/nvfp4.h: data plane, gap to scale_offset,
 * swizzled scale plane, divisor words). The data plane goes to the writer batch by batch, in row
 * order; the scale plane (rows x cols/16 bytes padded to 128x4 tiles, 1/8 of the data, where one
 * tile mixes 128 rows and so cannot be finished in order) and the D divisor words stay in memory
 * until the data plane is done. A batch is about BATCH_BYTES of f32 source rows. */
typedef struct nv_stream {
    const nf_plan *p;
    const nf_plan_tensor *t;
    const nf_nvfp4_layout *l;   /* the tensor's payload */
    nf_artifact_writer *w;
    const src_span *sp;
    size_t n_sp;
    uint8_t *scales;            /* [l->scale_bytes], swizzled for l */
    float *divs;                /* [l->divisors] */
    nf_nvfp4_layout bl;         /* one batch as a payload of its own: bl.rows rows, D = 1 */
    uint8_t *batch;             /* [bl.payload_bytes]: the batch's data rows, then their scales (bl) */
    float *scratch;             /* [workers][cols] */
    float *amax;                /* [workers] */
    const nf_plan_part *q;      /* the part being read, its rows [r0, ...) are batch rows [0, ...) */
    uint64_t r0;
    float g;                    /* the part's divisor (quantize) */
} nv_stream;

/* Pass 1 of a part: the absolute maximum of its rows, per worker. */
static void nv_amax_rows(void *ctx, size_t b, size_t e, int worker)
{
    nv_stream *s = ctx;
    uint64_t cols = s->l->cols;
    float *y = s->scratch + (size_t)worker * cols, a = s->amax[worker];
    for (size_t i = b; i < e; i++) {
        nf_convert_part_row(s->p, s->q, cols, s->r0 + i, y, NULL);
        for (uint64_t k = 0; k < cols; k++) a = fmaxf(a, fabsf(y[k]));
    }
    s->amax[worker] = a;
}

/* Pass 2: batch rows quantized into s->batch (row i at batch row i; rows are independent). */
static void nv_quant_rows(void *ctx, size_t b, size_t e, int worker)
{
    nv_stream *s = ctx;
    uint64_t cols = s->l->cols;
    float *y = s->scratch + (size_t)worker * cols;
    for (size_t i = b; i < e; i++) {
        nf_convert_part_row(s->p, s->q, cols, s->r0 + i, y, NULL);
        nf_nvfp4_quantize_rows(y, i, 1, s->g, &s->bl, s->batch);
    }
}

/* NVFP4_COPY, one batch: the source data rows as they are, its row-major scales into the batch's
 * plane (swizzled as bl). */
static void nv_copy_rows(nv_stream *s, uint64_t n)
{
    const nf_plan_part *q = s->q;
    uint64_t cols = s->l->cols;
    const nf_st_tensor *w = st_key(s->p, q->src, q->kind == NF_PART_CT_NVFP4 ? ".weight_packed" : ".weight");
    const nf_st_tensor *sc = st_key(s->p, q->src, ".weight_scale");
    for (uint64_t i = 0; i < n; i++) {
        uint64_t sr = src_row(q, s->r0 + i);
        memcpy(s->batch + i * (cols / 2), (const uint8_t *)w->data + sr * (cols / 2), cols / 2);
        const uint8_t *sb = (const uint8_t *)sc->data + sr * (cols / 16);
        for (uint64_t k = 0; k < cols / 16; k++) s->batch[s->bl.scale_offset + nf_nvfp4_scale_index(i, k, cols)] = sb[k];
    }
}

/* Batch rows [0, n) are tensor rows [row, row + n): their data to the writer, their scales from the
 * batch's plane into the tensor's. */
static nf_status nv_emit(nv_stream *s, uint64_t row, uint64_t n, nf_error *err)
{
    uint64_t cols = s->l->cols;
    const uint8_t *bs = s->batch + s->bl.scale_offset;
    for (uint64_t i = 0; i < n; i++)
        for (uint64_t k = 0; k < cols / 16; k++)
            s->scales[nf_nvfp4_scale_index(row + i, k, cols)] = bs[nf_nvfp4_scale_index(i, k, cols)];
    return nf_artifact_writer_write(s->w, s->batch, (size_t)(n * (cols / 2)), err);
}

/* One part: NVFP4_QUANT reads it twice (its amax, then its rows quantized with the divisor from
 * that amax); NVFP4_COPY once, keeping its divisor. Source pages are dropped after every batch. */
static nf_status nv_part(nv_stream *s, nf_pool *pool, uint64_t row, nf_error *err)
{
    const nf_plan_part *q = s->q;
    uint64_t nb = s->bl.rows;
    nf_status st = NF_OK;
    if (s->t->action == NF_ACT_NVFP4_QUANT) {
        for (int k = 0; k < nf_pool_size(pool); k++) s->amax[k] = 0.0f;
        for (s->r0 = 0; s->r0 < q->rows; s->r0 += nb) {
            nf_parallel_for(pool, (size_t)(q->rows - s->r0 < nb ? q->rows - s->r0 : nb), 8, nv_amax_rows, s);
            drop_sources(s->sp, s->n_sp);
        }
        float amax = 0.0f; /* a maximum: the same whatever the order the rows were read in */
        for (int k = 0; k < nf_pool_size(pool); k++) amax = fmaxf(amax, s->amax[k]);
        s->g = nf_nvfp4_global_from_amax(amax);
    } else
        s->g = q->divisor;
    for (s->r0 = 0; s->r0 < q->rows && st == NF_OK; s->r0 += nb) {
        uint64_t n = q->rows - s->r0 < nb ? q->rows - s->r0 : nb;
        if (s->t->action == NF_ACT_NVFP4_QUANT) nf_parallel_for(pool, (size_t)n, 8, nv_quant_rows, s);
        else nv_copy_rows(s, n);
        st = nv_emit(s, row + s->r0, n, err);
        drop_sources(s->sp, s->n_sp);
    }
    return st;
}

static nf_status write_nvfp4(const nf_plan *p, const nf_plan_tensor *t, const nf_tensor_desc *d,
                             nf_artifact_writer *w, nf_pool *pool, const src_span *sp, size_t n_sp, nf_error *err)
{
    nf_nvfp4_layout l;
    nv_stream s = {.p = p, .t = t, .l = &l, .w = w, .sp = sp, .n_sp = n_sp};
    nf_status st = nf_nvfp4_layout_of(tensor_rows(t), t->dims[t->n_dims - 1], t->divisors, &l, err);
    if (st) return nf_error_prefix(err, "%s", t->name);
    uint64_t nb = BATCH_BYTES / (l.cols * sizeof(float)), most = 0;
    for (uint32_t i = 0; i < t->n_parts; i++) most = t->parts[i].rows > most ? t->parts[i].rows : most;
    nb = nb < 1 ? 1 : nb > most ? most : nb;
    if (l.divisors != t->n_parts)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "%s: %u nvfp4 divisors for %u source matrices", t->name,
                            l.divisors, t->n_parts);
    if (nf_nvfp4_layout_of(nb, l.cols, 1, &s.bl, err)) return nf_error_prefix(err, "%s: batch", t->name);
    /* Mapped, not malloc'd: glibc raises its mmap threshold to the size of a freed mapped block, so
     * the next bank's plane of the same size would come from the heap and stay resident after
     * free (measured: 52 MB peak instead of 32 MB over two 128-expert banks). Zero-filled. */
    void *sm = mmap(NULL, (size_t)l.scale_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    s.scales = sm == MAP_FAILED ? NULL : sm;
    s.divs = malloc(sizeof(float) * l.divisors);
    s.batch = calloc(1, (size_t)s.bl.payload_bytes);
    s.scratch = malloc((size_t)nf_pool_size(pool) * l.cols * sizeof(float));
    s.amax = malloc((size_t)nf_pool_size(pool) * sizeof(float));
    if (!s.scales || !s.divs || !s.batch || !s.scratch || !s.amax)
        st = nf_error_set(err, NF_ERR_NOMEM, "%s: out of memory (%llu bytes of scale plane)", t->name,
                          (unsigned long long)l.scale_bytes);
    if (st == NF_OK) st = nf_artifact_writer_begin_tensor(w, d, err);
    uint64_t row = 0;
    for (uint32_t i = 0; i < t->n_parts && st == NF_OK; i++) {
        s.q = &t->parts[i];
        st = nv_part(&s, pool, row, err);
        s.divs[i] = s.g;
        row += s.q->rows;
    }
    static const uint8_t zero[256];
    if (st == NF_OK && l.scale_offset > l.data_bytes) /* < 256 bytes: the data plane's alignment */
        st = nf_artifact_writer_write(w, zero, (size_t)(l.scale_offset - l.data_bytes), err);
    if (st == NF_OK) st = nf_artifact_writer_write(w, s.scales, (size_t)l.scale_bytes, err);
    if (st == NF_OK) st = nf_artifact_writer_write(w, s.divs, sizeof(float) * l.divisors, err);
    if (st == NF_OK) st = nf_artifact_writer_end_tensor(w, err);
    if (s.scales) munmap(s.scales, (size_t)l.scale_bytes);
    free(s.divs);
    free(s.batch);
    free(s.scratch);
    free(s.amax);
    return st;
}

static nf_status write_tensor(const nf_plan *p, const nf_plan_tensor *t, nf_artifact_writer *w, nf_pool *pool,
                              const src_span *sp, size_t n_sp, nf_error *err)
{
    nf_tensor_desc d = {.name = t->name, .codec = t->codec, .n_dims = t->n_dims, .divisors = t->divisors,
                        .flags = t->flags, .n_input_divisors = t->n_input_divisors, .input_divisors = t->input_divisors};
    memcpy(d.dims, t->dims, sizeof d.dims);
    if (t->codec != NF_CODEC_NVFP4) {
        nf_status s = nf_artifact_writer_begin_tensor(w, &d, err);
        if (s == NF_OK) s = write_rows(p, t, w, pool, sp, n_sp, err);
        if (s == NF_OK) s = nf_artifact_writer_end_tensor(w, err);
        return s;
    }
    return write_nvfp4(p, t, &d, w, pool, sp, n_sp, err);
}

/* ---- metadata -------------------------------------------------------------------------------- */

static const char *rope_name(const char *t)
{
    if (!t[0] || strcmp(t, "default") == 0) return "none";
    return t;
}

/* The artifact's arch name: Qwen3.5-MoE's text model is "qwen3_5_moe" (one name for both of its
 * source layouts). */
static const char *artifact_arch(nf_hf_arch a) { return a == NF_HF_QWEN3_5_MOE_TEXT ? "qwen3_5_moe" : nf_hf_arch_name(a); }

static nf_status model_meta(const nf_plan *p, nf_artifact_writer *w, nf_error *err)
{
    const nf_hf_config *c = &p->cfg;
    const char *rt = rope_name(c->rope.type);
    const int none = strcmp(rt, "none") == 0, hyb = nf_hf_arch_hybrid(c->arch);
    int32_t *moe = malloc((c->n_layers ? c->n_layers : 1) * 2 * sizeof *moe), *lin = moe + c->n_layers;
    if (!moe) return nf_error_set(err, NF_ERR_NOMEM, "out of memory");
    for (uint32_t i = 0; i < c->n_layers; i++) {
        moe[i] = nf_hf_config_layer_is_moe(c, i);
        lin[i] = hyb && c->linear_layers[i];
    }
    const nf_model_keys k = {
        .arch = artifact_arch(c->arch), .hidden = c->hidden_size, .layers = c->n_layers, .heads = c->n_heads,
        .kv_heads = c->n_kv_heads, .head_dim = c->head_dim, .vocab = c->vocab_size, .rms_eps = (float)c->rms_eps,
        .rope_theta = c->rope.theta, .rope_scaling = rt,
        .rope_factor = none || !c->rope.factor ? 1.0f : (float)c->rope.factor,
        .rope_orig_ctx = none ? 0 : (uint32_t)c->rope.original_max_position,
        .rope_low_freq_factor = (float)c->rope.low_freq_factor, .rope_high_freq_factor = (float)c->rope.high_freq_factor,
        .max_ctx = c->max_position, .tie_embeddings = c->tie_word_embeddings, .qkv_bias = c->qkv_bias,
        .qk_norm = c->arch == NF_HF_QWEN3_MOE || hyb, .dense_inter = c->intermediate_size, .experts = c->n_experts,
        .top_k = c->n_experts_used, .moe_inter = c->moe_intermediate_size,
        .shared_inter = c->arch == NF_HF_QWEN2_MOE || hyb ? c->shared_intermediate_size : 0,
        .norm_topk = c->norm_topk_prob, .moe_layers = moe, .linear_layers = hyb ? lin : NULL,
        .rope_dim = hyb ? (uint32_t)(c->partial_rotary * c->head_dim) : 0, .attn_gate = hyb,
        .ssm_k_heads = c->lin_k_heads, .ssm_v_heads = c->lin_v_heads, .ssm_k_dim = c->lin_k_dim,
        .ssm_v_dim = c->lin_v_dim, .ssm_conv = c->conv_kernel};
    nf_status s = nf_convert_model_meta(w, &k, err);
    free(moe);
    return s;
}

/* The files a conversion reads: the GGUF, or the safetensors shards then config.json and the tokenizer
 * files of an HF folder (those present). */
static size_t source_files(const nf_plan *p, char (*f)[1200], size_t cap)
{
    static const char *const extra[] = {"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"};
    size_t n = 0;
    if (p->src_kind == NF_SRC_GGUF) {
        snprintf(f[n++], sizeof f[0], "%s", p->source);
        return n;
    }
    for (size_t i = 0; i < nf_st_set_shard_count(p->st) && n < cap; i++)
        snprintf(f[n++], sizeof f[0], "%s", nf_safetensors_path(nf_st_set_shard(p->st, i)));
    for (size_t i = 0; i < 4 && n < cap; i++) {
        snprintf(f[n], sizeof f[0], "%s/%s", p->source, extra[i]);
        if (access(f[n], R_OK) == 0) n++;
    }
    return n;
}

/* provenance.source_hash, FNV-1a 64 in hex with its kind: "stat:" over each source file's base name,
 * size and mtime (a fast identity: no extra read of a checkpoint of many GB), or "bytes:" over the
 * files' contents in source_files order (p->hash_bytes; a full read, in 1 MiB chunks). */
static nf_status source_hash(const nf_plan *p, char out[32], nf_error *err)
{
    enum { MAX_FILES = 1024, CHUNK = 1u << 20 };
    char (*f)[1200] = malloc(MAX_FILES * sizeof *f);
    uint8_t *buf = p->hash_bytes ? malloc(CHUNK) : NULL;
    if (!f || (p->hash_bytes && !buf)) {
        free(f);
        free(buf);
        return nf_error_set(err, NF_ERR_NOMEM, "source hash: out of memory");
    }
    size_t n = source_files(p, f, MAX_FILES);
    uint64_t h = NF_FNV1A64_INIT;
    nf_status s = NF_OK;
    for (size_t i = 0; i < n && s == NF_OK; i++) {
        if (p->hash_bytes) {
            FILE *fp = fopen(f[i], "rb");
            if (!fp) {
                s = nf_error_set(err, NF_ERR_IO, "%s: cannot open to hash it", f[i]);
                break;
            }
            size_t got;
            while ((got = fread(buf, 1, CHUNK, fp)) > 0) h = nf_fnv1a64_update(h, buf, got);
            if (ferror(fp)) s = nf_error_set(err, NF_ERR_IO, "%s: read error while hashing", f[i]);
            fclose(fp);
            continue;
        }
        struct stat st;
        const char *base = strrchr(f[i], '/') ? strrchr(f[i], '/') + 1 : f[i];
        h = nf_fnv1a64_update(h, base, strlen(base) + 1);
        if (stat(f[i], &st) == 0) {
            int64_t sz = (int64_t)st.st_size, mt = (int64_t)st.st_mtime;
            h = nf_fnv1a64_update(h, &sz, sizeof sz);
            h = nf_fnv1a64_update(h, &mt, sizeof mt);
        }
    }
    snprintf(out, 32, "%s:%016llx", p->hash_bytes ? "bytes" : "stat", (unsigned long long)h);
    free(f);
    free(buf);
    return s;
}

static nf_status provenance(const nf_plan *p, nf_artifact_writer *w, nf_error *err)
{
    char hash[32], date[32];
    nf_status hs = source_hash(p, hash, err);
    if (hs) return hs;
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return nf_convert_provenance(w, p->source, hash, p->recipe, date, err);
}

/* ---- the run --------------------------------------------------------------------------------- */

nf_status nf_convert_run(const nf_plan *p, const char *out, const nf_convert_opts *o, nf_convert_stats *stats,
                         nf_error *err)
{
    nf_pool *pool = NULL;
    nf_status s = nf_pool_create(o ? o->threads : 0, &pool, err);
    if (s) return s;
    nf_artifact_writer *w = NULL;
    if ((s = nf_artifact_writer_open(out, &w, err)) != NF_OK) {
        nf_pool_destroy(pool);
        return s;
    }
    s = model_meta(p, w, err);
    if (s == NF_OK) s = nf_convert_tokenizer_meta(p, w, err);
    if (s == NF_OK) s = provenance(p, w, err);
    size_t n_spans = 0;
    src_span *spans = source_spans(p, &n_spans);
    uint64_t t0 = nf_time_ns(), in = 0, outb = 0, last = t0;
    for (size_t i = 0; i < p->n && s == NF_OK; i++) {
        const nf_plan_tensor *t = &p->t[i];
        s = write_tensor(p, t, w, pool, spans, n_spans, err);
        for (uint32_t k = 0; k < t->n_parts; k++) {
            /* parts of one source tensor repeat: count each source once */
            int seen = 0;
            for (uint32_t m = 0; m < k && !seen; m++) seen = strcmp(t->parts[m].src, t->parts[k].src) == 0;
            if (!seen) in += part_src_bytes(p, &t->parts[k]);
        }
        drop_sources(spans, n_spans);
        uint64_t now = nf_time_ns();
        if (!(o && o->quiet) && (now - last > 500000000ull || i + 1 == p->n)) {
            double sec = (double)(now - t0) * 1e-9;
            fprintf(stderr, "\rconvert: tensor %zu/%zu %-26s %.1f MB/s in", i + 1, p->n, t->name,
                    sec > 0 ? (double)in / 1e6 / sec : 0.0);
            if (i + 1 == p->n) fputc('\n', stderr);
            last = now;
        }
    }
    if (s == NF_OK) {
        for (size_t i = 0; i < p->n; i++) {
            const nf_plan_tensor *t = &p->t[i];
            nf_tensor_desc d = {.codec = t->codec, .n_dims = t->n_dims, .divisors = t->divisors};
            memcpy(d.dims, t->dims, sizeof d.dims);
            nf_tensor_layout l;
            if (nf_tensor_layout_of(&d, &l, NULL) == NF_OK) outb += l.payload_bytes;
        }
        s = nf_artifact_writer_finish(w, err);
    } else
        nf_artifact_writer_abort(w);
    nf_pool_destroy(pool);
    free(spans);
    if (stats) {
        stats->bytes_in = in;
        stats->bytes_out = outb;
        stats->seconds = (double)(nf_time_ns() - t0) * 1e-9;
    }
    return s;
}

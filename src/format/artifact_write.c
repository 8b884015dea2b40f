/* The .nf streaming writer (docs/artifact.md, "Writing").
 *
 * Payloads go to the temporary file as they arrive; the metadata and the tensor table are
 * serialized into memory (they are small: a vocabulary and a few thousand entries) and written as
 * the index after the last payload; the fixed header at offset 0 is written last. This is why the
 * index is a footer: the table cannot be known before the last tensor, and a header-first layout
 * would need either a size reservation or a second pass over payloads that never sit in memory.
 *
 * Any error marks the writer failed: finish then refuses, so a half-written tensor can never be
 * renamed into place. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/fnv.h"
#include "format/artifact.h"
#include "format/artifact_internal.h"

#define NF_WRITER_CHUNK (4u << 20)

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

/* An open-addressing set of names (keys or tensor names), for duplicate refusal in O(1). */
typedef struct name_set {
    char **slot; /* [cap] */
    size_t n, cap;
} name_set;

/* The payload pipeline. nf_artifact_writer_write copies into one of two buffers while a worker
 * thread hashes (FNV-1a: serial, ~1 GB/s) and writes the other, so a producer makes its next bytes
 * while the last ones are hashed: on the caller's thread the hash was a third of a full-size
 * `ninfer synth`. Only payload bytes take this path, and every other write happens with the
 * pipeline drained (end_tensor drains it), so the file's bytes and their order are unchanged. */
enum { NF_PIPE_BYTES = 8u << 20 };
typedef struct pipeline {
    pthread_t th;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint8_t *buf[2];
    size_t len[2];
    int full[2];   /* handed to the worker, not yet written */
    int fill;      /* the buffer the caller fills */
    int next;      /* the buffer the worker takes next */
    int quit;
    int checksums; /* for the current tensor (set while drained) */
    uint64_t hash; /* FNV-1a of the current tensor's bytes (the worker's while it runs) */
    int fd;
    uint64_t pos;  /* file offset the worker writes next */
    int err_no;    /* the first failed write's errno (-1: no progress); then bytes are dropped */
    uint64_t err_pos;
} pipeline;

struct nf_artifact_writer {
    char *path, *tmp;
    int fd;
    int checksums;
    uint32_t align;           /* payload alignment; also the data section's offset */
    nf_status failed;         /* first error; NF_OK while healthy */
    nf_error first_err;
    uint64_t pos;             /* file offset of the next byte */
    buf meta, table;          /* serialized index parts */
    uint32_t n_meta, n_tensors;
    name_set keys, names;
    /* the tensor being written */
    int in_tensor;
    char cur_name[NF_TENSOR_NAME_MAX + 1];
    uint64_t cur_bytes, cur_written, cur_hash;
    size_t cur_checksum_at;   /* where its checksum goes in `table` */
    uint8_t *chunk;           /* [NF_WRITER_CHUNK] for add_tensor_fill */
    pipeline pipe;
};

/* ---- small containers -------------------------------------------------------------------------- */

static int buf_reserve(buf *b, size_t more)
{
    if (more <= b->cap - b->n) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap - b->n < more) {
        if (cap > SIZE_MAX / 2) return -1;
        cap *= 2;
    }
    uint8_t *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

static int buf_add(buf *b, const void *p, size_t n)
{
    if (buf_reserve(b, n)) return -1;
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
    return 0;
}

static int buf_u32(buf *b, uint32_t v)
{
    uint8_t x[4];
    nf_put_le32(x, v);
    return buf_add(b, x, 4);
}

static int buf_u64(buf *b, uint64_t v)
{
    uint8_t x[8];
    nf_put_le64(x, v);
    return buf_add(b, x, 8);
}

static int buf_str(buf *b, const char *s, size_t n)
{
    uint8_t z = 0;
    if (n > UINT32_MAX) return -1;
    return buf_u32(b, (uint32_t)n) || buf_add(b, s, n) || buf_add(b, &z, 1) ? -1 : 0;
}

static size_t set_hash(const char *s, size_t cap) { return (size_t)(nf_fnv1a64(s, strlen(s)) & (cap - 1)); }

/* Inserts s; returns 1 if it was already there, -1 when out of memory, 0 otherwise. */
static int set_insert(name_set *st, const char *s)
{
    if (2 * (st->n + 1) > st->cap) {
        size_t cap = st->cap ? st->cap * 2 : 64;
        char **slot = calloc(cap, sizeof *slot);
        if (!slot) return -1;
        for (size_t i = 0; i < st->cap; i++) {
            if (!st->slot[i]) continue;
            size_t h = set_hash(st->slot[i], cap);
            while (slot[h]) h = (h + 1) & (cap - 1);
            slot[h] = st->slot[i];
        }
        free(st->slot);
        st->slot = slot;
        st->cap = cap;
    }
    size_t h = set_hash(s, st->cap);
    for (; st->slot[h]; h = (h + 1) & (st->cap - 1))
        if (!strcmp(st->slot[h], s)) return 1;
    if (!(st->slot[h] = strdup(s))) return -1;
    st->n++;
    return 0;
}

static void set_free(name_set *st)
{
    for (size_t i = 0; i < st->cap; i++) free(st->slot[i]);
    free(st->slot);
}

/* ---- failure and I/O ------------------------------------------------------------------------- */

/* Records the first failure (the writer is unusable from then on) and copies it to err. */
static nf_status fail(nf_artifact_writer *w, nf_error *err, nf_status code, const char *fmt, ...) NF_PRINTF(4, 5);
static nf_status fail(nf_artifact_writer *w, nf_error *err, nf_status code, const char *fmt, ...)
{
    char msg[NF_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!w->failed) {
        w->failed = code;
        nf_error_set(&w->first_err, code, "%s", msg);
    }
    return nf_error_set(err, code, "%s", msg);
}

/* A failure already described in err (from a checker): record it too. */
static nf_status fail_err(nf_artifact_writer *w, nf_error *err, nf_status code)
{
    if (!w->failed) {
        w->failed = code;
        nf_error_set(&w->first_err, code, "%s", err ? err->msg : "error");
    }
    return code;
}

static nf_status refuse_if_failed(nf_artifact_writer *w, nf_error *err)
{
    if (!w->failed) return NF_OK;
    return nf_error_set(err, w->failed, "%s: the writer failed earlier: %s", w->path, w->first_err.msg);
}

static nf_status write_all(nf_artifact_writer *w, const void *p, size_t n, nf_error *err)
{
    const uint8_t *b = p;
    while (n) {
        ssize_t k = write(w->fd, b, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return fail(w, err, NF_ERR_IO, "%s: write of %zu bytes at offset %" PRIu64 " failed: %s", w->tmp, n, w->pos,
                        k < 0 ? strerror(errno) : "no progress");
        b += k;
        n -= (size_t)k;
        w->pos += (uint64_t)k;
    }
    return NF_OK;
}

/* ---- the payload pipeline ------------------------------------------------------------------------ */

static void *pipe_main(void *arg)
{
    pipeline *q = arg;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->quit && !q->full[q->next]) pthread_cond_wait(&q->cv, &q->mu);
        if (!q->full[q->next]) break; /* quit, nothing pending */
        const int i = q->next;
        pthread_mutex_unlock(&q->mu);
        if (q->checksums) q->hash = nf_fnv1a64_update(q->hash, q->buf[i], q->len[i]);
        for (size_t off = 0; off < q->len[i] && !q->err_no;) {
            ssize_t k = write(q->fd, q->buf[i] + off, q->len[i] - off);
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) {
                q->err_no = k < 0 ? errno : -1;
                q->err_pos = q->pos;
                break;
            }
            off += (size_t)k;
            q->pos += (uint64_t)k;
        }
        pthread_mutex_lock(&q->mu);
        q->full[i] = 0;
        q->next ^= 1;
        pthread_cond_broadcast(&q->cv);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

/* Starts the worker (once); 0 when it cannot, and the writer then hashes and writes inline. */
static int pipe_start(nf_artifact_writer *w)
{
    pipeline *q = &w->pipe;
    if (q->started) return 1;
    if (!(q->buf[0] = malloc(NF_PIPE_BYTES)) || !(q->buf[1] = malloc(NF_PIPE_BYTES))) {
        free(q->buf[0]);
        q->buf[0] = NULL;
        return 0;
    }
    q->fd = w->fd;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    if (pthread_create(&q->th, NULL, pipe_main, q)) {
        pthread_mutex_destroy(&q->mu);
        pthread_cond_destroy(&q->cv);
        free(q->buf[0]), free(q->buf[1]);
        q->buf[0] = q->buf[1] = NULL;
        return 0;
    }
    q->started = 1;
    return 1;
}

/* Hands the filled buffer to the worker and waits until the other one is free; nonzero when a
 * write has failed (read under the lock: the worker sets it before it frees a buffer). */
static int pipe_submit(pipeline *q)
{
    pthread_mutex_lock(&q->mu);
    q->full[q->fill] = 1;
    pthread_cond_broadcast(&q->cv);
    q->fill ^= 1;
    while (q->full[q->fill]) pthread_cond_wait(&q->cv, &q->mu);
    const int failed = q->err_no != 0;
    pthread_mutex_unlock(&q->mu);
    q->len[q->fill] = 0;
    return failed;
}

/* Copies n bytes in; nonzero when a write has failed. */
static int pipe_put(pipeline *q, const uint8_t *p, size_t n)
{
    int failed = 0;
    while (n && !failed) {
        size_t k = NF_PIPE_BYTES - q->len[q->fill];
        if (k > n) k = n;
        memcpy(q->buf[q->fill] + q->len[q->fill], p, k);
        q->len[q->fill] += k;
        p += k;
        n -= k;
        if (q->len[q->fill] == NF_PIPE_BYTES) failed = pipe_submit(q);
    }
    return failed;
}

/* Everything handed over is hashed and written; a failed write becomes the writer's error. */
static nf_status pipe_drain(nf_artifact_writer *w, nf_error *err)
{
    pipeline *q = &w->pipe;
    if (!q->started) return NF_OK;
    if (q->len[q->fill]) pipe_submit(q);
    pthread_mutex_lock(&q->mu);
    while (q->full[0] || q->full[1]) pthread_cond_wait(&q->cv, &q->mu);
    const int failed = q->err_no != 0;
    pthread_mutex_unlock(&q->mu);
    if (failed)
        return fail(w, err, NF_ERR_IO, "%s: write at offset %" PRIu64 " failed: %s", w->tmp, q->err_pos,
                    q->err_no > 0 ? strerror(q->err_no) : "no progress");
    return NF_OK;
}

/* Stops the worker (pending buffers are written first); before the file is closed. */
static void pipe_stop(pipeline *q)
{
    if (!q->started) return;
    pthread_mutex_lock(&q->mu);
    q->quit = 1;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    pthread_join(q->th, NULL);
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
    free(q->buf[0]), free(q->buf[1]);
    q->started = 0;
}

static const uint8_t zeros[NF_ARTIFACT_ALIGN];

/* Pads with zeros to a multiple of align. The first call also reserves the header region
 * [0, data_offset): its bytes stay zero (an invalid magic) until finish writes the header. */
static nf_status pad_to(nf_artifact_writer *w, uint64_t align, nf_error *err)
{
    if (w->pos == 0) return write_all(w, zeros, w->align, err);
    while (w->pos % align) {
        uint64_t n = align - w->pos % align;
        nf_status s = write_all(w, zeros, n < sizeof zeros ? (size_t)n : sizeof zeros, err);
        if (s) return s;
    }
    return NF_OK;
}

/* ---- open / abort ---------------------------------------------------------------------------- */

static void writer_free(nf_artifact_writer *w)
{
    pipe_stop(&w->pipe);
    if (w->fd >= 0) close(w->fd);
    free(w->path);
    free(w->tmp);
    free(w->meta.p);
    free(w->table.p);
    free(w->chunk);
    set_free(&w->keys);
    set_free(&w->names);
    free(w);
}

nf_status nf_artifact_writer_open(const char *path, nf_artifact_writer **out, nf_error *err)
{
    *out = NULL;
    nf_artifact_writer *w = calloc(1, sizeof *w);
    if (!w) return nf_error_set(err, NF_ERR_NOMEM, "%s: out of memory", path);
    w->fd = -1;
    w->checksums = 1;
    size_t n = strlen(path) + 32;
    w->path = strdup(path);
    w->tmp = malloc(n);
    if (!w->path || !w->tmp) {
        writer_free(w);
        return nf_error_set(err, NF_ERR_NOMEM, "%s: out of memory", path);
    }
    snprintf(w->tmp, n, "%s.tmp-%ld", path, (long)getpid());
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        nf_status s = nf_error_set(err, NF_ERR_IO, "%s: cannot create: %s", w->tmp, strerror(errno));
        writer_free(w);
        return s;
    }
    /* The header is written by finish; until then its bytes are zero (an invalid magic). */
    w->align = NF_ARTIFACT_ALIGN;
    *out = w;
    return NF_OK;
}

void nf_artifact_writer_abort(nf_artifact_writer *w)
{
    if (!w) return;
    pipe_stop(&w->pipe);
    if (w->fd >= 0) {
        close(w->fd);
        w->fd = -1;
    }
    unlink(w->tmp);
    writer_free(w);
}

void nf_artifact_writer_set_checksums(nf_artifact_writer *w, int on) { w->checksums = on != 0; }

nf_status nf_artifact_writer_set_alignment(nf_artifact_writer *w, uint32_t align, nf_error *err)
{
    nf_status s = refuse_if_failed(w, err);
    if (s) return s;
    if (align < 64 || align > NF_ARTIFACT_ALIGN || (align & (align - 1)))
        return fail(w, err, NF_ERR_INVALID_ARG, "%s: alignment %u (expected a power of two in [64, %u])", w->path,
                    align, NF_ARTIFACT_ALIGN);
    if (w->pos) return fail(w, err, NF_ERR_INVALID_ARG, "%s: alignment set after the first tensor", w->path);
    w->align = align;
    return NF_OK;
}
const char *nf_artifact_writer_temp_path(const nf_artifact_writer *w) { return w->tmp; }

/* ---- metadata -------------------------------------------------------------------------------- */

static nf_status check_key(nf_artifact_writer *w, const char *key, nf_error *err)
{
    nf_status s = refuse_if_failed(w, err);
    if (s) return s;
    size_t n = key ? strlen(key) : 0;
    if (n == 0 || n > NF_META_KEY_MAX)
        return fail(w, err, NF_ERR_INVALID_ARG, "%s: metadata key of %zu bytes (expected 1 to %d)", w->path, n,
                    NF_META_KEY_MAX);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)key[i] < 0x21 || (unsigned char)key[i] > 0x7e)
            return fail(w, err, NF_ERR_INVALID_ARG, "%s: metadata key '%s': byte %zu is not printable ASCII", w->path,
                        key, i);
    if (w->in_tensor)
        return fail(w, err, NF_ERR_INVALID_ARG, "%s: metadata key '%s' added inside tensor '%s'", w->path, key,
                    w->cur_name);
    int r = set_insert(&w->keys, key);
    if (r < 0) return fail(w, err, NF_ERR_NOMEM, "%s: out of memory", w->path);
    if (r) return fail(w, err, NF_ERR_INVALID_ARG, "%s: metadata key '%s' added twice", w->path, key);
    return NF_OK;
}

static nf_status meta_done(nf_artifact_writer *w, int oom, const char *key, nf_error *err)
{
    if (oom) return fail(w, err, NF_ERR_NOMEM, "%s: out of memory for metadata '%s'", w->path, key);
    w->n_meta++;
    return NF_OK;
}

/* A scalar: key, type, `n` little-endian bytes of v (n = 1, 4 or 8). */
static nf_status add_scalar(nf_artifact_writer *w, const char *key, nf_meta_type t, uint64_t v, nf_error *err)
{
    nf_status s = check_key(w, key, err);
    if (s) return s;
    uint8_t x[8];
    size_t n = nf_meta_type_size(t);
    nf_put_le64(x, v);
    int oom = buf_str(&w->meta, key, strlen(key)) || buf_u32(&w->meta, t) || buf_add(&w->meta, x, n);
    return meta_done(w, oom, key, err);
}

static uint64_t bits32(const void *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static uint64_t bits64(const void *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

nf_status nf_artifact_writer_add_u32(nf_artifact_writer *w, const char *key, uint32_t v, nf_error *err)
{
    return add_scalar(w, key, NF_META_U32, v, err);
}
nf_status nf_artifact_writer_add_i32(nf_artifact_writer *w, const char *key, int32_t v, nf_error *err)
{
    return add_scalar(w, key, NF_META_I32, bits32(&v), err);
}
nf_status nf_artifact_writer_add_u64(nf_artifact_writer *w, const char *key, uint64_t v, nf_error *err)
{
    return add_scalar(w, key, NF_META_U64, v, err);
}
nf_status nf_artifact_writer_add_i64(nf_artifact_writer *w, const char *key, int64_t v, nf_error *err)
{
    return add_scalar(w, key, NF_META_I64, bits64(&v), err);
}
nf_status nf_artifact_writer_add_f32(nf_artifact_writer *w, const char *key, float v, nf_error *err)
{
    return add_scalar(w, key, NF_META_F32, bits32(&v), err);
}
nf_status nf_artifact_writer_add_f64(nf_artifact_writer *w, const char *key, double v, nf_error *err)
{
    return add_scalar(w, key, NF_META_F64, bits64(&v), err);
}
nf_status nf_artifact_writer_add_bool(nf_artifact_writer *w, const char *key, int v, nf_error *err)
{
    return add_scalar(w, key, NF_META_BOOL, v != 0, err);
}

nf_status nf_artifact_writer_add_strn(nf_artifact_writer *w, const char *key, const char *str, size_t len,
                                      nf_error *err)
{
    nf_status s = check_key(w, key, err);
    if (s) return s;
    if (len > UINT32_MAX)
        return fail(w, err, NF_ERR_INVALID_ARG, "%s: metadata '%s': a string of %zu bytes (at most 2^32-1)", w->path,
                    key, len);
    int oom = buf_str(&w->meta, key, strlen(key)) || buf_u32(&w->meta, NF_META_STRING) || buf_str(&w->meta, str, len);
    return meta_done(w, oom, key, err);
}

nf_status nf_artifact_writer_add_str(nf_artifact_writer *w, const char *key, const char *str, nf_error *err)
{
    return nf_artifact_writer_add_strn(w, key, str ? str : "", str ? strlen(str) : 0, err);
}

nf_status nf_artifact_writer_add_array(nf_artifact_writer *w, const char *key, nf_meta_type et, const void *elems,
                                       size_t n, nf_error *err)
{
    nf_status s = check_key(w, key, err);
    if (s) return s;
    size_t esz = nf_meta_type_size(et);
    if (!esz)
        return fail(w, err, NF_ERR_INVALID_ARG, "%s: metadata '%s': %s is not a numeric or bool element type", w->path,
                    key, nf_meta_type_name(et));
    int oom = buf_str(&w->meta, key, strlen(key)) || buf_u32(&w->meta, NF_META_ARRAY) || buf_u32(&w->meta, et) ||
              buf_u64(&w->meta, n) || buf_reserve(&w->meta, n * esz);
    const uint8_t *e = elems;
    for (size_t i = 0; i < n && !oom; i++) {
        uint8_t x[8];
        if (esz == 1 && e[i] > 1)
            return fail(w, err, NF_ERR_INVALID_ARG, "%s: metadata '%s': bool element %zu is %u (expected 0 or 1)",
                        w->path, key, i, e[i]);
        nf_put_le64(x, esz == 1 ? e[i] : esz == 4 ? bits32(e + 4 * i) : bits64(e + 8 * i));
        oom = buf_add(&w->meta, x, esz);
    }
    return meta_done(w, oom, key, err);
}

nf_status nf_artifact_writer_add_str_array(nf_artifact_writer *w, const char *key, const char *const *strs,
                                           const uint32_t *lens, size_t n, nf_error *err)
{
    nf_status s = check_key(w, key, err);
    if (s) return s;
    int oom = buf_str(&w->meta, key, strlen(key)) || buf_u32(&w->meta, NF_META_ARRAY) ||
              buf_u32(&w->meta, NF_META_STRING) || buf_u64(&w->meta, n);
    for (size_t i = 0; i < n && !oom; i++) {
        size_t len = lens ? lens[i] : strlen(strs[i]);
        if (len > UINT32_MAX)
            return fail(w, err, NF_ERR_INVALID_ARG, "%s: metadata '%s': string %zu is too long", w->path, key, i);
        oom = buf_str(&w->meta, strs[i], len);
    }
    return meta_done(w, oom, key, err);
}

/* ---- tensors --------------------------------------------------------------------------------- */

/* Serializes the entry (checksum patched by end_tensor) and positions the file at its payload. */
static nf_status put_entry(nf_artifact_writer *w, const nf_tensor_desc *d, const nf_tensor_layout *l, nf_error *err)
{
    const nf_codec *c = nf_codec_get(d->codec);
    uint32_t flags = (d->flags & ~(uint32_t)NF_TENSOR_HAS_CHECKSUM) | (w->checksums ? NF_TENSOR_HAS_CHECKSUM : 0);
    buf *b = &w->table;
    int oom = buf_str(b, d->name, strlen(d->name)) || buf_str(b, c->name, strlen(c->name)) || buf_u32(b, d->n_dims);
    for (uint32_t i = 0; i < d->n_dims; i++) oom = oom || buf_u64(b, d->dims[i]);
    oom = oom || buf_u32(b, d->divisors ? d->divisors : 1) || buf_u32(b, flags) || buf_u32(b, d->n_input_divisors);
    for (uint32_t i = 0; i < d->n_input_divisors; i++) oom = oom || buf_u32(b, (uint32_t)bits32(&d->input_divisors[i]));
    oom = oom || buf_u32(b, l->n_planes);
    for (uint32_t i = 0; i < l->n_planes; i++)
        oom = oom || buf_u64(b, l->planes[i].offset) || buf_u64(b, l->planes[i].bytes);
    oom = oom || buf_u64(b, w->pos) || buf_u64(b, l->payload_bytes);
    w->cur_checksum_at = b->n;
    oom = oom || buf_u64(b, 0);
    if (oom) return fail(w, err, NF_ERR_NOMEM, "%s: out of memory for tensor '%s'", w->path, d->name);
    return NF_OK;
}

nf_status nf_artifact_writer_begin_tensor(nf_artifact_writer *w, const nf_tensor_desc *d, nf_error *err)
{
    nf_status s = refuse_if_failed(w, err);
    if (s) return s;
    if (w->in_tensor)
        return fail(w, err, NF_ERR_INVALID_ARG, "%s: tensor '%s' begun before tensor '%s' ended", w->path,
                    d->name ? d->name : "(null)", w->cur_name);
    const char *name = d->name ? d->name : "";
    if ((s = nf_tensor_check_name(name, strlen(name), err))) {
        nf_error_prefix(err, "%s", w->path);
        return fail_err(w, err, s);
    }
    nf_tensor_layout l;
    if ((s = nf_tensor_layout_of(d, &l, err))) {
        nf_error_prefix(err, "%s: tensor '%s'", w->path, name);
        return fail_err(w, err, s);
    }
    int r = set_insert(&w->names, name);
    if (r < 0) return fail(w, err, NF_ERR_NOMEM, "%s: out of memory", w->path);
    if (r) return fail(w, err, NF_ERR_INVALID_ARG, "%s: tensor '%s' added twice", w->path, name);
    if ((s = pad_to(w, w->align, err))) return s;
    if ((s = put_entry(w, d, &l, err))) return s;
    snprintf(w->cur_name, sizeof w->cur_name, "%s", name);
    w->in_tensor = 1;
    w->cur_bytes = l.payload_bytes;
    w->cur_written = 0;
    w->cur_hash = NF_FNV1A64_INIT;
    if (pipe_start(w)) { /* drained: no worker activity until the first buffer is handed over */
        w->pipe.checksums = w->checksums;
        w->pipe.hash = NF_FNV1A64_INIT;
        w->pipe.pos = w->pos;
    }
    return NF_OK;
}

nf_status nf_artifact_writer_write(nf_artifact_writer *w, const void *p, size_t n, nf_error *err)
{
    nf_status s = refuse_if_failed(w, err);
    if (s) return s;
    if (!w->in_tensor) return fail(w, err, NF_ERR_INVALID_ARG, "%s: payload bytes written outside a tensor", w->path);
    if (n > w->cur_bytes - w->cur_written)
        return fail(w, err, NF_ERR_INVALID_ARG,
                    "%s: tensor '%s': %zu more payload bytes after %" PRIu64 " overrun its payload of %" PRIu64,
                    w->path, w->cur_name, n, w->cur_written, w->cur_bytes);
    w->cur_written += n;
    if (!w->pipe.started) {
        if (w->checksums) w->cur_hash = nf_fnv1a64_update(w->cur_hash, p, n);
        return write_all(w, p, n, err);
    }
    w->pos += n;
    if (pipe_put(&w->pipe, p, n)) return pipe_drain(w, err); /* a failed write, reported when seen */
    return NF_OK;
}

nf_status nf_artifact_writer_end_tensor(nf_artifact_writer *w, nf_error *err)
{
    nf_status s = refuse_if_failed(w, err);
    if (s) return s;
    if (!w->in_tensor) return fail(w, err, NF_ERR_INVALID_ARG, "%s: end_tensor without begin_tensor", w->path);
    if (w->cur_written != w->cur_bytes)
        return fail(w, err, NF_ERR_INVALID_ARG, "%s: tensor '%s': %" PRIu64 " payload bytes written, expected %" PRIu64,
                    w->path, w->cur_name, w->cur_written, w->cur_bytes);
    if ((s = pipe_drain(w, err))) return s;
    if (w->pipe.started) w->cur_hash = w->pipe.hash;
    if (w->checksums) nf_put_le64(w->table.p + w->cur_checksum_at, w->cur_hash);
    w->in_tensor = 0;
    w->n_tensors++;
    return NF_OK;
}

nf_status nf_artifact_writer_add_tensor(nf_artifact_writer *w, const nf_tensor_desc *d, const void *payload,
                                        uint64_t bytes, nf_error *err)
{
    nf_status s = nf_artifact_writer_begin_tensor(w, d, err);
    if (s) return s;
    if (bytes != w->cur_bytes)
        return fail(w, err, NF_ERR_INVALID_ARG, "%s: tensor '%s': a payload of %" PRIu64 " bytes, its layout needs %" PRIu64,
                    w->path, w->cur_name, bytes, w->cur_bytes);
    /* In pieces, so a payload larger than SSIZE_MAX or size_t still goes through write(). */
    const uint8_t *p = payload;
    for (uint64_t off = 0; off < bytes && !s; off += NF_WRITER_CHUNK * 16u) {
        uint64_t n = bytes - off < NF_WRITER_CHUNK * 16u ? bytes - off : NF_WRITER_CHUNK * 16u;
        s = nf_artifact_writer_write(w, p + off, (size_t)n, err);
    }
    return s ? s : nf_artifact_writer_end_tensor(w, err);
}

nf_status nf_artifact_writer_add_tensor_fill(nf_artifact_writer *w, const nf_tensor_desc *d, nf_payload_fill_fn fill,
                                             void *ctx, nf_error *err)
{
    nf_status s = nf_artifact_writer_begin_tensor(w, d, err);
    if (s) return s;
    if (!w->chunk && !(w->chunk = malloc(NF_WRITER_CHUNK)))
        return fail(w, err, NF_ERR_NOMEM, "%s: out of memory for the write buffer", w->path);
    for (uint64_t off = 0; off < w->cur_bytes && !s; off += NF_WRITER_CHUNK) {
        size_t n = w->cur_bytes - off < NF_WRITER_CHUNK ? (size_t)(w->cur_bytes - off) : NF_WRITER_CHUNK;
        if ((s = fill(ctx, off, w->chunk, n, err))) {
            nf_error_prefix(err, "%s: tensor '%s' at payload offset %" PRIu64, w->path, w->cur_name, off);
            return fail_err(w, err, s);
        }
        s = nf_artifact_writer_write(w, w->chunk, n, err);
    }
    return s ? s : nf_artifact_writer_end_tensor(w, err);
}

/* ---- finish ---------------------------------------------------------------------------------- */

static nf_status write_index_and_header(nf_artifact_writer *w, nf_error *err)
{
    nf_status s = pad_to(w, 8, err);
    if (s) return s;
    uint8_t head[16];
    memcpy(head, NF_ARTIFACT_INDEX_MAGIC, 4);
    nf_put_le32(head + 4, w->n_meta);
    nf_put_le32(head + 8, w->n_tensors);
    nf_put_le32(head + 12, 0);
    uint64_t index_offset = w->pos;
    uint64_t h = nf_fnv1a64_update(nf_fnv1a64(head, 16), w->meta.p, w->meta.n);
    h = nf_fnv1a64_update(h, w->table.p, w->table.n);
    if ((s = write_all(w, head, 16, err)) || (s = write_all(w, w->meta.p, w->meta.n, err)) ||
        (s = write_all(w, w->table.p, w->table.n, err)))
        return s;
    uint8_t hdr[NF_ARTIFACT_HEADER_BYTES] = {0};
    memcpy(hdr, NF_ARTIFACT_MAGIC, 8);
    nf_put_le16(hdr + 8, NF_ARTIFACT_MAJOR);
    nf_put_le16(hdr + 10, NF_ARTIFACT_MINOR);
    nf_put_le32(hdr + 12, NF_ARTIFACT_HEADER_BYTES);
    nf_put_le32(hdr + 16, w->align);
    nf_put_le32(hdr + 20, 0);
    nf_put_le64(hdr + 24, w->align);
    nf_put_le64(hdr + 32, index_offset);
    nf_put_le64(hdr + 40, w->pos - index_offset);
    nf_put_le64(hdr + 48, h);
    if (pwrite(w->fd, hdr, sizeof hdr, 0) != (ssize_t)sizeof hdr)
        return fail(w, err, NF_ERR_IO, "%s: writing the header failed: %s", w->tmp, strerror(errno));
    return NF_OK;
}

static nf_status sync_and_close(nf_artifact_writer *w, nf_error *err)
{
    int r = fsync(w->fd);
    int e = errno;
    int c = close(w->fd);
    w->fd = -1;
    if (r || c) return fail(w, err, NF_ERR_IO, "%s: fsync/close failed: %s", w->tmp, strerror(r ? e : errno));
    return NF_OK;
}

/* After the rename, the directory entry itself must reach the disk. */
static void sync_dir(const char *path)
{
    char *dir = strdup(path);
    if (!dir) return;
    char *slash = strrchr(dir, '/');
    const char *d = slash ? (slash == dir ? "/" : (*slash = 0, dir)) : ".";
    int fd = open(d, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
    free(dir);
}

nf_status nf_artifact_writer_finish(nf_artifact_writer *w, nf_error *err)
{
    nf_status s = refuse_if_failed(w, err);
    if (!s && w->in_tensor)
        s = fail(w, err, NF_ERR_INVALID_ARG, "%s: finish while tensor '%s' is not ended", w->path, w->cur_name);
    if (!s) s = write_index_and_header(w, err);
    if (!s) s = sync_and_close(w, err);
    if (!s) {
        /* The writer's output must satisfy the reader, or it is not renamed into place. */
        nf_artifact *a;
        s = nf_artifact_open(w->tmp, &a, err);
        if (s) {
            s = NF_ERR_INTERNAL;
            nf_error_prefix(err, "the artifact just written fails validation (a writer bug)");
            if (err) err->code = s;
        }
        nf_artifact_close(a);
    }
    if (!s && rename(w->tmp, w->path) != 0)
        s = nf_error_set(err, NF_ERR_IO, "%s: cannot rename %s over it: %s", w->path, w->tmp, strerror(errno));
    if (s) {
        nf_artifact_writer_abort(w);
        return s;
    }
    sync_dir(w->path);
    writer_free(w);
    return NF_OK;
}

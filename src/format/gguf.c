/* GGUF reader: see gguf.h for the format and what is validated. */
#define _POSIX_C_SOURCE 200809L
#include "format/gguf.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mapfile.h"

#define GGUF_DEFAULT_ALIGNMENT 32u

/* ggml's block geometry per type id (ggml.c type_traits; gguf-py GGML_QUANT_SIZES): used for
 * names in messages, for sizing tensors ninfer has no codec for, and for NVFP4, whose GGUF block
 * (64 elements: 4 scale bytes + 32 data bytes) is not the planar layout of ninfer's nvfp4 codec. */
static const struct ggml_type_fact {
    uint32_t id;
    const char *name;
    uint32_t block_elems, block_bytes;
} ggml_types[] = {
    {0, "f32", 1, 4},          {1, "f16", 1, 2},          {2, "q4_0", 32, 18},      {3, "q4_1", 32, 20},
    {6, "q5_0", 32, 22},       {7, "q5_1", 32, 24},       {8, "q8_0", 32, 34},      {9, "q8_1", 32, 40},
    {10, "q2_K", 256, 84},     {11, "q3_K", 256, 110},    {12, "q4_K", 256, 144},   {13, "q5_K", 256, 176},
    {14, "q6_K", 256, 210},    {15, "q8_K", 256, 292},    {16, "iq2_xxs", 256, 66}, {17, "iq2_xs", 256, 74},
    {18, "iq3_xxs", 256, 98},  {19, "iq1_s", 256, 50},    {20, "iq4_nl", 32, 18},   {21, "iq3_s", 256, 110},
    {22, "iq2_s", 256, 82},    {23, "iq4_xs", 256, 136},  {24, "i8", 1, 1},         {25, "i16", 1, 2},
    {26, "i32", 1, 4},         {27, "i64", 1, 8},         {28, "f64", 1, 8},        {29, "iq1_m", 256, 56},
    {30, "bf16", 1, 2},        {34, "tq1_0", 256, 54},    {35, "tq2_0", 256, 66},   {39, "mxfp4", 32, 17},
    {40, "nvfp4", 64, 36},     {41, "q1_0", 128, 18},
};

static const struct ggml_type_fact *ggml_fact(uint32_t type)
{
    for (size_t i = 0; i < sizeof ggml_types / sizeof ggml_types[0]; i++)
        if (ggml_types[i].id == type) return &ggml_types[i];
    return NULL;
}

const char *nf_ggml_type_name(uint32_t type)
{
    const struct ggml_type_fact *f = ggml_fact(type);
    return f ? f->name : NULL;
}

static const char *const type_names[NF_GGUF_TYPE_COUNT] = {
    "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
    "bool",  "string", "array", "uint64", "int64", "float64",
};

const char *nf_gguf_type_name(nf_gguf_type t) { return (unsigned)t < NF_GGUF_TYPE_COUNT ? type_names[t] : "?"; }

/* Bytes of one scalar of type t; 0 for string/array/invalid. */
static uint32_t scalar_size(uint32_t t)
{
    switch (t) {
    case NF_GGUF_UINT8: case NF_GGUF_INT8: case NF_GGUF_BOOL: return 1;
    case NF_GGUF_UINT16: case NF_GGUF_INT16: return 2;
    case NF_GGUF_UINT32: case NF_GGUF_INT32: case NF_GGUF_FLOAT32: return 4;
    case NF_GGUF_UINT64: case NF_GGUF_INT64: case NF_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

static uint64_t load_le(const uint8_t *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = n; i-- > 0;) v = v << 8 | p[i];
    return v;
}

struct nf_gguf {
    nf_mapped_file file;              /* for open_memory: the caller's bytes, not a mapping */
    int borrowed;                     /* file.data belongs to the caller: close only frees path */
    uint32_t version, alignment;
    uint64_t data_start, data_size;
    nf_gguf_kv *kvs;                  /* [n_kv], file order */
    const nf_gguf_kv **kv_sorted;     /* [n_kv], by key */
    size_t n_kv;
    nf_gguf_tensor *tensors;          /* [n_tensors], file order */
    const nf_gguf_tensor **t_sorted;  /* [n_tensors], by name */
    size_t n_tensors;
};

/* ---- a bounds-checked cursor over the mapping -------------------------------------------- */

typedef struct cursor {
    const uint8_t *d;
    uint64_t size, pos;
} cursor;

static nf_status need(cursor *c, uint64_t n, const char *what, nf_error *err)
{
    if (n <= c->size - c->pos) return NF_OK;
    return nf_error_set(err, NF_ERR_FORMAT, "%s at offset %" PRIu64 " needs %" PRIu64 " bytes, the file ends at %" PRIu64,
                        what, c->pos, n, c->size);
}

static nf_status rd_u32(cursor *c, uint32_t *v, const char *what, nf_error *err)
{
    nf_status s = need(c, 4, what, err);
    if (s == NF_OK) *v = (uint32_t)load_le(c->d + c->pos, 4), c->pos += 4;
    return s;
}

static nf_status rd_u64(cursor *c, uint64_t *v, const char *what, nf_error *err)
{
    nf_status s = need(c, 8, what, err);
    if (s == NF_OK) *v = load_le(c->d + c->pos, 8), c->pos += 8;
    return s;
}

static nf_status rd_str(cursor *c, nf_gguf_str *out, const char *what, nf_error *err)
{
    uint64_t len;
    nf_status s = rd_u64(c, &len, what, err);
    if (s == NF_OK) s = need(c, len, what, err);
    if (s != NF_OK) return s;
    out->ptr = (const char *)c->d + c->pos;
    out->len = len;
    c->pos += len;
    return NF_OK;
}

/* A key or tensor name: non-empty, no NUL inside (it becomes a C string), copied. */
static nf_status rd_name(cursor *c, char **out, const char *what, nf_error *err)
{
    nf_gguf_str s;
    nf_status st = rd_str(c, &s, what, err);
    if (st != NF_OK) return st;
    if (s.len == 0) return nf_error_set(err, NF_ERR_FORMAT, "%s at offset %" PRIu64 " is empty", what, c->pos - 8);
    if (memchr(s.ptr, 0, s.len))
        return nf_error_set(err, NF_ERR_FORMAT, "%s at offset %" PRIu64 " contains a NUL byte", what,
                            c->pos - s.len - 8);
    *out = malloc(s.len + 1);
    if (!*out) return nf_error_set(err, NF_ERR_NOMEM, "out of memory for a %" PRIu64 "-byte %s", s.len, what);
    memcpy(*out, s.ptr, s.len);
    (*out)[s.len] = '\0';
    return NF_OK;
}

/* ---- metadata ------------------------------------------------------------------------------ */

static nf_status rd_scalar(cursor *c, nf_gguf_kv *kv, nf_error *err)
{
    if (kv->type == NF_GGUF_STRING) return rd_str(c, &kv->v.str, "string value", err);
    uint32_t n = scalar_size(kv->type);
    nf_status s = need(c, n, "value", err);
    if (s != NF_OK) return s;
    uint64_t bits = load_le(c->d + c->pos, n);
    c->pos += n;
    switch (kv->type) {
    case NF_GGUF_INT8: kv->v.i64 = (int8_t)bits; break;
    case NF_GGUF_INT16: kv->v.i64 = (int16_t)bits; break;
    case NF_GGUF_INT32: kv->v.i64 = (int32_t)bits; break;
    case NF_GGUF_INT64: kv->v.i64 = (int64_t)bits; break;
    case NF_GGUF_FLOAT32: {
        uint32_t b = (uint32_t)bits;
        float f;
        memcpy(&f, &b, 4);
        kv->v.f64 = f;
        break;
    }
    case NF_GGUF_FLOAT64: memcpy(&kv->v.f64, &bits, 8); break;
    case NF_GGUF_BOOL:
        if (bits > 1)
            return nf_error_set(err, NF_ERR_FORMAT, "bool value at offset %" PRIu64 " is %" PRIu64 ", not 0 or 1",
                                c->pos - 1, bits);
        kv->v.u64 = bits;
        break;
    default: kv->v.u64 = bits; break;
    }
    return NF_OK;
}

static nf_status rd_string_array(cursor *c, nf_gguf_kv *kv, nf_error *err)
{
    if (kv->n > (c->size - c->pos) / 8) /* every string takes at least its 8-byte length */
        return nf_error_set(err, NF_ERR_FORMAT, "array of %" PRIu64 " strings at offset %" PRIu64
                            " cannot fit in the %" PRIu64 " bytes left", kv->n, c->pos, c->size - c->pos);
    kv->strs = malloc((kv->n ? kv->n : 1) * sizeof *kv->strs);
    if (!kv->strs) return nf_error_set(err, NF_ERR_NOMEM, "out of memory for %" PRIu64 " strings", kv->n);
    for (uint64_t i = 0; i < kv->n; i++) {
        nf_status s = rd_str(c, &kv->strs[i], "array string", err);
        if (s != NF_OK) return nf_error_prefix(err, "element %" PRIu64, i);
    }
    return NF_OK;
}

static nf_status rd_array(cursor *c, nf_gguf_kv *kv, nf_error *err)
{
    uint32_t et;
    nf_status s = rd_u32(c, &et, "array element type", err);
    if (s == NF_OK) s = rd_u64(c, &kv->n, "array length", err);
    if (s != NF_OK) return s;
    if (et == NF_GGUF_ARRAY)
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "array of arrays at offset %" PRIu64 ": nested arrays are not supported",
                            c->pos - 12);
    if (et >= NF_GGUF_TYPE_COUNT)
        return nf_error_set(err, NF_ERR_FORMAT, "array element type %u at offset %" PRIu64 " is not a GGUF type", et,
                            c->pos - 12);
    kv->elem_type = (nf_gguf_type)et;
    if (et == NF_GGUF_STRING) return rd_string_array(c, kv, err);
    uint32_t es = scalar_size(et);
    if (kv->n > (c->size - c->pos) / es)
        return nf_error_set(err, NF_ERR_FORMAT, "array of %" PRIu64 " %s at offset %" PRIu64 " runs past the end of the file (%"
                            PRIu64 " bytes)", kv->n, type_names[et], c->pos, c->size);
    kv->raw = c->d + c->pos;
    c->pos += kv->n * es;
    for (uint64_t i = 0; et == NF_GGUF_BOOL && i < kv->n; i++)
        if (kv->raw[i] > 1)
            return nf_error_set(err, NF_ERR_FORMAT, "bool element %" PRIu64 " is %u, not 0 or 1", i, kv->raw[i]);
    return NF_OK;
}

static nf_status rd_kv(cursor *c, nf_gguf_kv *kv, size_t i, nf_error *err)
{
    uint64_t at = c->pos;
    nf_status s = rd_name(c, (char **)&kv->key, "key", err);
    if (s != NF_OK) return nf_error_prefix(err, "kv #%zu", i);
    uint32_t t;
    s = rd_u32(c, &t, "value type", err);
    if (s == NF_OK && t >= NF_GGUF_TYPE_COUNT)
        s = nf_error_set(err, NF_ERR_FORMAT, "value type %u at offset %" PRIu64 " is not a GGUF type", t, c->pos - 4);
    if (s == NF_OK) {
        kv->type = (nf_gguf_type)t;
        s = t == NF_GGUF_ARRAY ? rd_array(c, kv, err) : rd_scalar(c, kv, err);
    }
    if (s != NF_OK) return nf_error_prefix(err, "kv #%zu '%s' (at offset %" PRIu64 ")", i, kv->key, at);
    return NF_OK;
}

/* ---- tensor infos -------------------------------------------------------------------------- */

static nf_status rd_tensor_info(cursor *c, nf_gguf_tensor *t, size_t i, nf_error *err)
{
    nf_status s = rd_name(c, (char **)&t->name, "tensor name", err);
    if (s != NF_OK) return nf_error_prefix(err, "tensor info #%zu", i);
    s = rd_u32(c, &t->n_dims, "n_dims", err);
    if (s == NF_OK && t->n_dims > NF_GGUF_MAX_DIMS)
        s = nf_error_set(err, NF_ERR_FORMAT, "n_dims is %u, at most %d", t->n_dims, NF_GGUF_MAX_DIMS);
    t->n_elems = 1;
    for (uint32_t d = 0; d < NF_GGUF_MAX_DIMS && s == NF_OK; d++) {
        t->ne[d] = 1;
        if (d < t->n_dims) s = rd_u64(c, &t->ne[d], "dimension", err);
        if (s == NF_OK && t->ne[d] > (uint64_t)INT64_MAX)
            s = nf_error_set(err, NF_ERR_FORMAT, "ne[%u] = %" PRIu64 " is negative as int64", d, t->ne[d]);
        if (s == NF_OK && t->ne[d] && t->n_elems > (uint64_t)INT64_MAX / t->ne[d])
            s = nf_error_set(err, NF_ERR_FORMAT, "element count overflows int64 at ne[%u]", d);
        if (s == NF_OK) t->n_elems *= t->ne[d];
    }
    if (s == NF_OK) s = rd_u32(c, &t->ggml_type, "ggml type", err);
    if (s == NF_OK) s = rd_u64(c, &t->offset, "data offset", err);
    if (s != NF_OK) return nf_error_prefix(err, "tensor info #%zu '%s'", i, t->name);
    return NF_OK;
}

static void supported_types(char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < NF_CODEC_COUNT && len < cap; i++) {
        const nf_codec *c = nf_codec_get((nf_codec_id)i);
        if (c && c->ggml_type >= 0)
            len += (size_t)snprintf(buf + len, cap - len, "%s%s=%d", len ? " " : "", c->name, c->ggml_type);
    }
}

/* Resolves the codec and byte size. For block codecs the codec table gives the row size, and it
 * must agree with ggml's block geometry; nvfp4 (planar in ninfer) and types without a codec use
 * ggml's geometry. */
static nf_status size_tensor(nf_gguf_tensor *t, unsigned flags, nf_error *err)
{
    const struct ggml_type_fact *f = ggml_fact(t->ggml_type);
    t->codec = nf_codec_by_ggml_type((int)t->ggml_type);
    t->type_name = f ? f->name : "unknown";
    if (!t->codec && !(flags & NF_GGUF_METADATA_ONLY)) {
        char list[256];
        supported_types(list, sizeof list);
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "tensor '%s': ggml type %u (%s) is not supported (supported: %s)",
                            t->name, t->ggml_type, f ? f->name : "not a ggml type", list);
    }
    if (t->codec && !(t->codec->flags & NF_CODEC_PLANAR) &&
        (!f || f->block_elems != t->codec->block_elems || f->block_bytes != t->codec->block_bytes))
        return nf_error_set(err, NF_ERR_INTERNAL, "tensor '%s': codec %s disagrees with ggml's block geometry for type %u",
                            t->name, t->codec->name, t->ggml_type);
    if (!f) return NF_OK; /* metadata only: size unknown */
    if (t->ne[0] % f->block_elems)
        return nf_error_set(err, NF_ERR_FORMAT, "tensor '%s': row length ne[0] = %" PRIu64
                            " is not a multiple of the %s block (%u elements)", t->name, t->ne[0], f->name, f->block_elems);
    /* One formula for every type (a block codec's geometry equals ggml's, checked above). The row
     * itself can wrap: 2^62 float32 elements are 2^64 bytes, which would pass the bounds check below
     * as 0 bytes while a reader of ne[0] elements runs off the file. */
    uint64_t blocks = t->ne[0] / f->block_elems;
    if (blocks > UINT64_MAX / f->block_bytes)
        return nf_error_set(err, NF_ERR_FORMAT, "tensor '%s': a row of ne[0] = %" PRIu64 " %s elements overflows 64 bits",
                            t->name, t->ne[0], f->name);
    uint64_t row = blocks * f->block_bytes;
    uint64_t rows = t->ne[0] ? t->n_elems / t->ne[0] : 0;
    if (row && rows > UINT64_MAX / row)
        return nf_error_set(err, NF_ERR_FORMAT, "tensor '%s': byte size overflows 64 bits", t->name);
    t->nbytes = row * rows;
    return NF_OK;
}

static nf_status place_tensor(nf_gguf *g, nf_gguf_tensor *t, unsigned flags, nf_error *err)
{
    nf_status s = size_tensor(t, flags, err);
    if (s != NF_OK) return s;
    if (t->offset % g->alignment)
        return nf_error_set(err, NF_ERR_FORMAT, "tensor '%s': data offset %" PRIu64 " is not a multiple of the alignment %u",
                            t->name, t->offset, g->alignment);
    if (t->offset > g->data_size || t->nbytes > g->data_size - t->offset)
        return nf_error_set(err, NF_ERR_FORMAT,
                            "tensor '%s': %" PRIu64 " bytes at data offset %" PRIu64
                            " run past the end of the data section (%" PRIu64 " bytes from file offset %" PRIu64 ")",
                            t->name, t->nbytes, t->offset, g->data_size, g->data_start);
    t->data = t->nbytes ? g->file.data + g->data_start + t->offset : NULL;
    return NF_OK;
}

/* ---- whole-file checks ------------------------------------------------------------------------ */

static int kv_cmp(const void *a, const void *b)
{
    return strcmp((*(const nf_gguf_kv *const *)a)->key, (*(const nf_gguf_kv *const *)b)->key);
}

static int tensor_cmp(const void *a, const void *b)
{
    return strcmp((*(const nf_gguf_tensor *const *)a)->name, (*(const nf_gguf_tensor *const *)b)->name);
}

static int tensor_offset_cmp(const void *a, const void *b)
{
    const nf_gguf_tensor *x = *(const nf_gguf_tensor *const *)a, *y = *(const nf_gguf_tensor *const *)b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

static nf_status index_names(nf_gguf *g, nf_error *err)
{
    g->kv_sorted = malloc((g->n_kv ? g->n_kv : 1) * sizeof *g->kv_sorted);
    g->t_sorted = malloc((g->n_tensors ? g->n_tensors : 1) * sizeof *g->t_sorted);
    if (!g->kv_sorted || !g->t_sorted) return nf_error_set(err, NF_ERR_NOMEM, "out of memory for the index");
    for (size_t i = 0; i < g->n_kv; i++) g->kv_sorted[i] = &g->kvs[i];
    qsort(g->kv_sorted, g->n_kv, sizeof *g->kv_sorted, kv_cmp);
    for (size_t i = 1; i < g->n_kv; i++)
        if (strcmp(g->kv_sorted[i - 1]->key, g->kv_sorted[i]->key) == 0)
            return nf_error_set(err, NF_ERR_FORMAT, "key '%s' appears twice", g->kv_sorted[i]->key);
    for (size_t i = 0; i < g->n_tensors; i++) g->t_sorted[i] = &g->tensors[i];
    qsort(g->t_sorted, g->n_tensors, sizeof *g->t_sorted, tensor_cmp);
    for (size_t i = 1; i < g->n_tensors; i++)
        if (strcmp(g->t_sorted[i - 1]->name, g->t_sorted[i]->name) == 0)
            return nf_error_set(err, NF_ERR_FORMAT, "tensor name '%s' appears twice", g->t_sorted[i]->name);
    return NF_OK;
}

/* Sorted by offset, a tensor overlaps when it begins before the furthest end so far. Uses t_sorted
 * as scratch and restores name order afterwards. */
static nf_status check_overlaps(nf_gguf *g, nf_error *err)
{
    qsort(g->t_sorted, g->n_tensors, sizeof *g->t_sorted, tensor_offset_cmp);
    const nf_gguf_tensor *last = NULL;
    nf_status s = NF_OK;
    for (size_t i = 0; i < g->n_tensors && s == NF_OK; i++) {
        const nf_gguf_tensor *t = g->t_sorted[i];
        if (!t->nbytes) continue;
        if (last && t->offset < last->offset + last->nbytes)
            s = nf_error_set(err, NF_ERR_FORMAT, "tensors '%s' [%" PRIu64 ", %" PRIu64 ") and '%s' [%" PRIu64 ", %" PRIu64
                             ") overlap in the data section", last->name, last->offset, last->offset + last->nbytes,
                             t->name, t->offset, t->offset + t->nbytes);
        if (!last || t->offset + t->nbytes > last->offset + last->nbytes) last = t;
    }
    qsort(g->t_sorted, g->n_tensors, sizeof *g->t_sorted, tensor_cmp);
    return s;
}

static nf_status read_alignment(nf_gguf *g, nf_error *err)
{
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const nf_gguf_kv *kv = nf_gguf_find_kv(g, "general.alignment");
    if (!kv) return NF_OK;
    if (kv->type != NF_GGUF_UINT32)
        return nf_error_set(err, NF_ERR_FORMAT, "key 'general.alignment' is %s, expected uint32",
                            nf_gguf_type_name(kv->type));
    if (kv->v.u64 == 0 || (kv->v.u64 & (kv->v.u64 - 1)))
        return nf_error_set(err, NF_ERR_FORMAT, "general.alignment = %" PRIu64 " is not a power of two", kv->v.u64);
    g->alignment = (uint32_t)kv->v.u64;
    return NF_OK;
}

static nf_status read_header(nf_gguf *g, cursor *c, uint64_t *n_tensors, uint64_t *n_kv, nf_error *err)
{
    if (c->size < 4 || memcmp(c->d, "GGUF", 4) != 0)
        return nf_error_set(err, NF_ERR_FORMAT, "not a GGUF file (no \"GGUF\" magic at offset 0)");
    c->pos = 4;
    nf_status s = rd_u32(c, &g->version, "version", err);
    if (s == NF_OK && (g->version == 0x02000000u || g->version == 0x03000000u))
        s = nf_error_set(err, NF_ERR_UNSUPPORTED, "big-endian GGUF files are not supported");
    else if (s == NF_OK && g->version != 2 && g->version != 3)
        s = nf_error_set(err, NF_ERR_VERSION, "GGUF version %u is not supported (2 and 3 are)", g->version);
    if (s == NF_OK) s = rd_u64(c, n_tensors, "tensor count", err);
    if (s == NF_OK) s = rd_u64(c, n_kv, "kv count", err);
    if (s != NF_OK) return s;
    /* Cheapest possible entries: a kv is >= 14 bytes (8-byte key length, 1 key byte, 4-byte type,
     * 1 value byte); a tensor info is >= 25 (8 + 1 name byte + 4 n_dims + 4 type + 8 offset). */
    uint64_t left = c->size - c->pos;
    if (*n_kv > left / 14)
        return nf_error_set(err, NF_ERR_FORMAT, "kv count %" PRIu64 " cannot fit in the %" PRIu64 " bytes left", *n_kv, left);
    if (*n_tensors > left / 25)
        return nf_error_set(err, NF_ERR_FORMAT, "tensor count %" PRIu64 " cannot fit in the %" PRIu64 " bytes left",
                            *n_tensors, left);
    return NF_OK;
}

static nf_status parse(nf_gguf *g, unsigned flags, nf_error *err)
{
    cursor c = {g->file.data, g->file.size, 0};
    uint64_t n_tensors = 0, n_kv = 0;
    nf_status s = read_header(g, &c, &n_tensors, &n_kv, err);
    if (s != NF_OK) return s;
    g->kvs = calloc(n_kv ? n_kv : 1, sizeof *g->kvs);
    g->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *g->tensors);
    if (!g->kvs || !g->tensors) return nf_error_set(err, NF_ERR_NOMEM, "out of memory for the header");
    /* the counts include an entry that failed half-way, so close frees what it holds */
    for (; g->n_kv < n_kv && s == NF_OK; g->n_kv++) s = rd_kv(&c, &g->kvs[g->n_kv], g->n_kv, err);
    for (; g->n_tensors < n_tensors && s == NF_OK; g->n_tensors++)
        s = rd_tensor_info(&c, &g->tensors[g->n_tensors], g->n_tensors, err);
    if (s == NF_OK) s = index_names(g, err);
    if (s == NF_OK) s = read_alignment(g, err);
    if (s != NF_OK) return s;
    uint64_t pad = (g->alignment - c.pos % g->alignment) % g->alignment;
    g->data_start = c.pos + pad;
    if (pad > c.size - c.pos) {
        if (n_tensors) return nf_error_set(err, NF_ERR_FORMAT, "data section at offset %" PRIu64 " starts past the end of "
                                           "the file (%" PRIu64 " bytes)", g->data_start, c.size);
        g->data_start = c.size; /* metadata-only files may stop right after the kvs */
    }
    g->data_size = c.size - g->data_start;
    for (size_t i = 0; i < g->n_tensors && s == NF_OK; i++) s = place_tensor(g, &g->tensors[i], flags, err);
    if (s == NF_OK) s = check_overlaps(g, err);
    return s;
}

/* Parses g->file (mapped or borrowed); on failure closes g, with the error prefixed by its name. */
static nf_status open_common(nf_gguf *g, unsigned flags, nf_gguf **out, nf_error *err)
{
    nf_status s = parse(g, flags, err);
    if (s != NF_OK) {
        nf_error_prefix(err, "%s", g->file.path);
        nf_gguf_close(g);
        return s;
    }
    *out = g;
    return NF_OK;
}

nf_status nf_gguf_open(const char *path, unsigned flags, nf_gguf **out, nf_error *err)
{
    *out = NULL;
    nf_gguf *g = calloc(1, sizeof *g);
    if (!g) return nf_error_set(err, NF_ERR_NOMEM, "%s: out of memory", path);
    nf_status s = nf_map_file(path, &g->file, err);
    if (s != NF_OK) {
        free(g);
        return s;
    }
    return open_common(g, flags, out, err);
}

nf_status nf_gguf_open_memory(const void *data, size_t size, const char *name, unsigned flags, nf_gguf **out,
                              nf_error *err)
{
    *out = NULL;
    if (!name) name = "(memory)";
    nf_gguf *g = calloc(1, sizeof *g);
    char *path = strdup(name);
    if (!g || !path) {
        free(g);
        free(path);
        return nf_error_set(err, NF_ERR_NOMEM, "%s: out of memory", name);
    }
    g->borrowed = 1;
    g->file.data = size ? data : NULL; /* as nf_map_file leaves an empty file */
    g->file.size = size;
    g->file.path = path;
    return open_common(g, flags, out, err);
}

void nf_gguf_close(nf_gguf *g)
{
    if (!g) return;
    for (size_t i = 0; i < g->n_kv; i++) {
        free((char *)g->kvs[i].key);
        free(g->kvs[i].strs);
    }
    for (size_t i = 0; i < g->n_tensors; i++) free((char *)g->tensors[i].name);
    free(g->kvs);
    free(g->tensors);
    free(g->kv_sorted);
    free(g->t_sorted);
    if (g->borrowed) free(g->file.path);
    else nf_unmap_file(&g->file);
    free(g);
}

/* ---- lookups ------------------------------------------------------------------------------- */

const char *nf_gguf_path(const nf_gguf *g) { return g->file.path; }
uint32_t nf_gguf_version(const nf_gguf *g) { return g->version; }
uint32_t nf_gguf_alignment(const nf_gguf *g) { return g->alignment; }
uint64_t nf_gguf_data_offset(const nf_gguf *g) { return g->data_start; }
size_t nf_gguf_kv_count(const nf_gguf *g) { return g->n_kv; }
const nf_gguf_kv *nf_gguf_kv_at(const nf_gguf *g, size_t i) { return i < g->n_kv ? &g->kvs[i] : NULL; }
size_t nf_gguf_tensor_count(const nf_gguf *g) { return g->n_tensors; }
const nf_gguf_tensor *nf_gguf_tensor_at(const nf_gguf *g, size_t i)
{
    return i < g->n_tensors ? &g->tensors[i] : NULL;
}

const nf_gguf_kv *nf_gguf_find_kv(const nf_gguf *g, const char *key)
{
    size_t lo = 0, hi = g->n_kv;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(g->kv_sorted[mid]->key, key);
        if (c == 0) return g->kv_sorted[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

const nf_gguf_tensor *nf_gguf_find_tensor(const nf_gguf *g, const char *name)
{
    size_t lo = 0, hi = g->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(g->t_sorted[mid]->name, name);
        if (c == 0) return g->t_sorted[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

nf_status nf_gguf_get_tensor(const nf_gguf *g, const char *name, const nf_gguf_tensor **out, nf_error *err)
{
    *out = nf_gguf_find_tensor(g, name);
    if (*out) return NF_OK;
    return nf_error_set(err, NF_ERR_FORMAT, "%s: tensor '%s' is missing", g->file.path, name);
}

static int is_int_type(nf_gguf_type t)
{
    return t <= NF_GGUF_INT32 || t == NF_GGUF_UINT64 || t == NF_GGUF_INT64;
}

static int is_signed_type(nf_gguf_type t)
{
    return t == NF_GGUF_INT8 || t == NF_GGUF_INT16 || t == NF_GGUF_INT32 || t == NF_GGUF_INT64;
}

/* The kv for `key`, which must exist and pass `ok`; otherwise an error naming the key. */
static nf_status lookup(const nf_gguf *g, const char *key, int (*ok)(nf_gguf_type), const char *want,
                        const nf_gguf_kv **out, nf_error *err)
{
    *out = nf_gguf_find_kv(g, key);
    if (!*out) return nf_error_set(err, NF_ERR_FORMAT, "%s: key '%s' is missing", g->file.path, key);
    if (!ok((*out)->type))
        return nf_error_set(err, NF_ERR_FORMAT, "%s: key '%s' is %s%s%s, expected %s", g->file.path, key,
                            (*out)->type == NF_GGUF_ARRAY ? "an array of " : "a ",
                            nf_gguf_type_name((*out)->type == NF_GGUF_ARRAY ? (*out)->elem_type : (*out)->type),
                            (*out)->type == NF_GGUF_ARRAY ? "" : " value", want);
    return NF_OK;
}

nf_status nf_gguf_get_int(const nf_gguf *g, const char *key, int64_t *out, nf_error *err)
{
    const nf_gguf_kv *kv;
    nf_status s = lookup(g, key, is_int_type, "an integer", &kv, err);
    if (s != NF_OK) return s;
    if (!is_signed_type(kv->type) && kv->v.u64 > (uint64_t)INT64_MAX)
        return nf_error_set(err, NF_ERR_FORMAT, "%s: key '%s' = %" PRIu64 " is out of the int64 range", g->file.path, key,
                            kv->v.u64);
    *out = is_signed_type(kv->type) ? kv->v.i64 : (int64_t)kv->v.u64;
    return NF_OK;
}

nf_status nf_gguf_get_u32(const nf_gguf *g, const char *key, uint32_t *out, nf_error *err)
{
    const nf_gguf_kv *kv;
    nf_status s = lookup(g, key, is_int_type, "an integer", &kv, err);
    if (s != NF_OK) return s;
    int neg = is_signed_type(kv->type) && kv->v.i64 < 0;
    if (neg || kv->v.u64 > UINT32_MAX) {
        if (neg) return nf_error_set(err, NF_ERR_FORMAT, "%s: key '%s' = %" PRId64 " is out of the uint32 range",
                                     g->file.path, key, kv->v.i64);
        return nf_error_set(err, NF_ERR_FORMAT, "%s: key '%s' = %" PRIu64 " is out of the uint32 range", g->file.path, key,
                            kv->v.u64);
    }
    *out = (uint32_t)kv->v.u64;
    return NF_OK;
}

static int is_float_type(nf_gguf_type t) { return t == NF_GGUF_FLOAT32 || t == NF_GGUF_FLOAT64; }
static int is_bool_type(nf_gguf_type t) { return t == NF_GGUF_BOOL; }
static int is_str_type(nf_gguf_type t) { return t == NF_GGUF_STRING; }
static int is_array_type(nf_gguf_type t) { return t == NF_GGUF_ARRAY; }

nf_status nf_gguf_get_float(const nf_gguf *g, const char *key, double *out, nf_error *err)
{
    const nf_gguf_kv *kv;
    nf_status s = lookup(g, key, is_float_type, "a float", &kv, err);
    if (s == NF_OK) *out = kv->v.f64;
    return s;
}

nf_status nf_gguf_get_bool(const nf_gguf *g, const char *key, int *out, nf_error *err)
{
    const nf_gguf_kv *kv;
    nf_status s = lookup(g, key, is_bool_type, "a bool", &kv, err);
    if (s == NF_OK) *out = (int)kv->v.u64;
    return s;
}

nf_status nf_gguf_get_str(const nf_gguf *g, const char *key, nf_gguf_str *out, nf_error *err)
{
    const nf_gguf_kv *kv;
    nf_status s = lookup(g, key, is_str_type, "a string", &kv, err);
    if (s == NF_OK) *out = kv->v.str;
    return s;
}

nf_status nf_gguf_get_array(const nf_gguf *g, const char *key, nf_gguf_type want, const nf_gguf_kv **out,
                            nf_error *err)
{
    const char *wname = want == NF_GGUF_STRING ? "an array of strings"
                        : want == NF_GGUF_INT64 ? "an array of integers"
                                                : "an array of floats";
    nf_status s = lookup(g, key, is_array_type, wname, out, err);
    if (s != NF_OK) return s;
    nf_gguf_type et = (*out)->elem_type;
    int ok = want == NF_GGUF_STRING ? et == NF_GGUF_STRING
             : want == NF_GGUF_INT64 ? is_int_type(et) || et == NF_GGUF_BOOL
             : want == NF_GGUF_FLOAT64 ? is_float_type(et)
                                       : 0;
    if (!ok)
        return nf_error_set(err, NF_ERR_FORMAT, "%s: key '%s' is an array of %s, expected %s", g->file.path, key,
                            nf_gguf_type_name(et), wname);
    for (uint64_t i = 0; et == NF_GGUF_UINT64 && i < (*out)->n; i++)
        if (load_le((*out)->raw + 8 * i, 8) > (uint64_t)INT64_MAX)
            return nf_error_set(err, NF_ERR_FORMAT, "%s: key '%s': element %" PRIu64 " is out of the int64 range",
                                g->file.path, key, i);
    return NF_OK;
}

nf_gguf_str nf_gguf_arr_str(const nf_gguf_kv *a, uint64_t i) { return a->strs[i]; }

int64_t nf_gguf_arr_int(const nf_gguf_kv *a, uint64_t i)
{
    uint32_t es = scalar_size(a->elem_type);
    uint64_t bits = load_le(a->raw + es * i, es);
    switch (a->elem_type) {
    case NF_GGUF_INT8: return (int8_t)bits;
    case NF_GGUF_INT16: return (int16_t)bits;
    case NF_GGUF_INT32: return (int32_t)bits;
    default: return (int64_t)bits;
    }
}

double nf_gguf_arr_float(const nf_gguf_kv *a, uint64_t i)
{
    if (a->elem_type == NF_GGUF_FLOAT64) {
        uint64_t b = load_le(a->raw + 8 * i, 8);
        double d;
        memcpy(&d, &b, 8);
        return d;
    }
    uint32_t b = (uint32_t)load_le(a->raw + 4 * i, 4);
    float f;
    memcpy(&f, &b, 4);
    return f;
}

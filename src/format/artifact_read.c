/* The .nf reader: validates a whole artifact before handing out anything (docs/artifact.md).
 *
 * Every read goes through a bounds-checked cursor over the index, all arithmetic on file values is
 * overflow-checked, and every error names the file, the object (header field, metadata key,
 * tensor) and the offset at fault. */
#define _DEFAULT_SOURCE /* madvise */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/fnv.h"
#include "base/mapfile.h"
#include "codec/nvfp4.h"
#include "format/artifact.h"
#include "format/artifact_internal.h"

struct nf_artifact {
    nf_mapped_file map;       /* when opened from a path */
    const uint8_t *base;      /* [size] */
    uint64_t size;
    char *name;               /* path or caller's name, for messages */
    nf_artifact_info info;
    nf_tensor *tensors;       /* [n_tensors], file order */
    const nf_tensor **tensor_sorted; /* [n_tensors] by name */
    nf_meta *meta;            /* [n_meta], file order */
    const nf_meta **meta_sorted;     /* [n_meta] by key */
};

/* ---- cursor over the index ----------------------------------------------------------------- */

typedef struct rd {
    const uint8_t *p;         /* index bytes [size] */
    uint64_t size, pos;
    uint64_t file_off;        /* file offset of p[0], for messages */
    nf_error *err;
} rd;

static nf_status need(rd *r, uint64_t n, const char *what)
{
    if (n > r->size - r->pos)
        return nf_error_set(r->err, NF_ERR_FORMAT,
                            "%s at offset %" PRIu64 " needs %" PRIu64 " bytes, but the index ends at offset %" PRIu64,
                            what, r->file_off + r->pos, n, r->file_off + r->size);
    return NF_OK;
}

static nf_status rd_u32(rd *r, uint32_t *v, const char *what)
{
    nf_status s = need(r, 4, what);
    if (s) return s;
    *v = nf_le32(r->p + r->pos);
    r->pos += 4;
    return NF_OK;
}

static nf_status rd_u64(rd *r, uint64_t *v, const char *what)
{
    nf_status s = need(r, 8, what);
    if (s) return s;
    *v = nf_le64(r->p + r->pos);
    r->pos += 8;
    return NF_OK;
}

/* A string: u32 length, the bytes, one NUL. *out points at the bytes (NUL-terminated). When
 * `printable` is set the bytes must be 0x21..0x7e and the length 1..max. */
static nf_status rd_str(rd *r, const char **out, uint32_t *len, int printable, uint32_t max, const char *what)
{
    uint64_t at = r->file_off + r->pos;
    nf_status s = rd_u32(r, len, what);
    if (s) return s;
    if (printable && (*len == 0 || *len > max))
        return nf_error_set(r->err, NF_ERR_FORMAT, "%s at offset %" PRIu64 " has length %u (expected 1 to %u)", what,
                            at, *len, max);
    if ((s = need(r, (uint64_t)*len + 1, what))) return s;
    const char *b = (const char *)r->p + r->pos;
    if (b[*len] != 0)
        return nf_error_set(r->err, NF_ERR_FORMAT, "%s at offset %" PRIu64 " is not followed by a NUL byte", what, at);
    for (uint32_t i = 0; printable && i < *len; i++) {
        unsigned char ch = (unsigned char)b[i];
        if (ch < 0x21 || ch > 0x7e)
            return nf_error_set(r->err, NF_ERR_FORMAT,
                                "%s at offset %" PRIu64 ": byte %u is 0x%02x (expected printable ASCII 0x21-0x7e)",
                                what, at, i, ch);
    }
    r->pos += (uint64_t)*len + 1;
    *out = b;
    return NF_OK;
}

/* ---- metadata -------------------------------------------------------------------------------- */

static nf_status rd_fixed(rd *r, nf_meta_type t, void *dst, const char *what)
{
    uint64_t at = r->file_off + r->pos;
    size_t n = nf_meta_type_size(t);
    nf_status s = need(r, n, what);
    if (s) return s;
    const uint8_t *b = r->p + r->pos;
    switch (n) {
    case 1:
        if (b[0] > 1)
            return nf_error_set(r->err, NF_ERR_FORMAT, "%s at offset %" PRIu64 ": bool byte is %u (expected 0 or 1)",
                                what, at, b[0]);
        *(uint8_t *)dst = b[0];
        break;
    case 4: {
        uint32_t v = nf_le32(b);
        memcpy(dst, &v, 4);
        break;
    }
    default: {
        uint64_t v = nf_le64(b);
        memcpy(dst, &v, 8);
        break;
    }
    }
    r->pos += n;
    return NF_OK;
}

static nf_status rd_array(rd *r, nf_meta *m)
{
    uint32_t et;
    nf_status s = rd_u32(r, &et, "array element type");
    if (s) return s;
    if (et < NF_META_U32 || et > NF_META_STRING)
        return nf_error_set(r->err, NF_ERR_FORMAT, "array element type %u at offset %" PRIu64 " is not 1..8", et,
                            r->file_off + r->pos - 4);
    m->elem_type = (nf_meta_type)et;
    if ((s = rd_u64(r, &m->count, "array count"))) return s;
    uint64_t left = r->size - r->pos;
    size_t esz = et == NF_META_STRING ? 5 : nf_meta_type_size((nf_meta_type)et); /* smallest element */
    if (m->count > left / esz)
        return nf_error_set(r->err, NF_ERR_FORMAT,
                            "array of %" PRIu64 " %s elements at offset %" PRIu64 " cannot fit in the %" PRIu64
                            " bytes left in the index",
                            m->count, nf_meta_type_name(m->elem_type), r->file_off + r->pos, left);
    if (et != NF_META_STRING) {
        uint8_t *e = malloc(m->count * esz + 1);
        if (!e) return nf_error_set(r->err, NF_ERR_NOMEM, "out of memory for an array of %" PRIu64 " elements", m->count);
        m->elems = e;
        for (uint64_t i = 0; i < m->count; i++)
            if ((s = rd_fixed(r, m->elem_type, e + i * esz, "array element"))) return s;
        return NF_OK;
    }
    const char **strs = malloc((size_t)m->count * sizeof *strs + 1);
    uint32_t *lens = malloc((size_t)m->count * sizeof *lens + 1);
    m->strs = strs;
    m->str_lens = lens;
    if (!strs || !lens) return nf_error_set(r->err, NF_ERR_NOMEM, "out of memory for %" PRIu64 " strings", m->count);
    for (uint64_t i = 0; i < m->count; i++)
        if ((s = rd_str(r, &strs[i], &lens[i], 0, 0, "string element"))) return s;
    return NF_OK;
}

static nf_status rd_meta(rd *r, nf_meta *m)
{
    uint32_t klen, t;
    nf_status s = rd_str(r, &m->key, &klen, 1, NF_META_KEY_MAX, "metadata key");
    if (s) return s;
    uint64_t at = r->file_off + r->pos;
    if ((s = rd_u32(r, &t, "metadata type"))) return s;
    m->type = (nf_meta_type)t;
    switch (t) {
    case NF_META_U32: case NF_META_I32: case NF_META_U64: case NF_META_I64:
    case NF_META_F32: case NF_META_F64:
        return rd_fixed(r, m->type, &m->v, "value");
    case NF_META_BOOL: {
        uint8_t b;
        if ((s = rd_fixed(r, m->type, &b, "value"))) return s;
        m->v.b = b;
        return NF_OK;
    }
    case NF_META_STRING: {
        uint32_t len;
        if ((s = rd_str(r, &m->str, &len, 0, 0, "string value"))) return s;
        m->count = len;
        return NF_OK;
    }
    case NF_META_ARRAY:
        return rd_array(r, m);
    default:
        return nf_error_set(r->err, NF_ERR_FORMAT, "type %u at offset %" PRIu64 " is not a metadata type (1..9)", t, at);
    }
}

/* ---- tensors --------------------------------------------------------------------------------- */

static nf_status rd_tensor_fields(rd *r, nf_tensor *t, float **input_divs)
{
    uint32_t len, v;
    const char *codec = NULL;
    nf_status s = rd_str(r, &codec, &len, 1, 32, "codec name");
    if (s) return s;
    t->codec = nf_codec_by_name(codec);
    if (!t->codec) return nf_error_set(r->err, NF_ERR_FORMAT, "unknown codec '%s'", codec);
    t->desc.codec = t->codec->id;
    if ((s = rd_u32(r, &t->desc.n_dims, "dim count"))) return s;
    if (t->desc.n_dims < 1 || t->desc.n_dims > NF_TENSOR_MAX_DIMS)
        return nf_error_set(r->err, NF_ERR_FORMAT, "%u dims at offset %" PRIu64 " (expected 1 to %d)", t->desc.n_dims,
                            r->file_off + r->pos - 4, NF_TENSOR_MAX_DIMS);
    for (uint32_t i = 0; i < t->desc.n_dims; i++)
        if ((s = rd_u64(r, &t->desc.dims[i], "dim"))) return s;
    if ((s = rd_u32(r, &t->desc.divisors, "divisors"))) return s;
    if (t->desc.divisors == 0)
        return nf_error_set(r->err, NF_ERR_FORMAT, "divisors is 0 at offset %" PRIu64 " (a stored count is >= 1)",
                            r->file_off + r->pos - 4);
    if ((s = rd_u32(r, &t->desc.flags, "flags"))) return s;
    if ((s = rd_u32(r, &t->desc.n_input_divisors, "input divisor count"))) return s;
    if ((s = need(r, 4ull * t->desc.n_input_divisors, "input divisors"))) return s;
    if (t->desc.n_input_divisors) {
        *input_divs = malloc(4ull * t->desc.n_input_divisors);
        if (!*input_divs) return nf_error_set(r->err, NF_ERR_NOMEM, "out of memory for input divisors");
        for (uint32_t i = 0; i < t->desc.n_input_divisors; i++) rd_fixed(r, NF_META_F32, &(*input_divs)[i], "");
        t->desc.input_divisors = *input_divs;
    }
    if ((s = rd_u32(r, &v, "plane count"))) return s;
    if (v < 1 || v > NF_TENSOR_MAX_PLANES)
        return nf_error_set(r->err, NF_ERR_FORMAT, "%u planes at offset %" PRIu64 " (expected 1 to %d)", v,
                            r->file_off + r->pos - 4, NF_TENSOR_MAX_PLANES);
    nf_tensor_layout stored = {.n_planes = v};
    for (uint32_t i = 0; i < v; i++) {
        if ((s = rd_u64(r, &stored.planes[i].offset, "plane offset"))) return s;
        if ((s = rd_u64(r, &stored.planes[i].bytes, "plane size"))) return s;
    }
    if ((s = rd_u64(r, &t->offset, "payload offset"))) return s;
    if ((s = rd_u64(r, &stored.payload_bytes, "payload size"))) return s;
    if ((s = rd_u64(r, &t->checksum, "checksum"))) return s;

    /* The payload is a function of (codec, shape, divisors): recompute it and demand equality. */
    if ((s = nf_tensor_layout_of(&t->desc, &t->layout, r->err))) return s;
    if (stored.payload_bytes != t->layout.payload_bytes)
        return nf_error_set(r->err, NF_ERR_FORMAT,
                            "payload size %" PRIu64 " does not match %" PRIu64 " implied by codec %s, shape and divisors %u",
                            stored.payload_bytes, t->layout.payload_bytes, t->codec->name, t->desc.divisors);
    if (stored.n_planes != t->layout.n_planes)
        return nf_error_set(r->err, NF_ERR_FORMAT, "%u planes stored, codec %s has %u", stored.n_planes,
                            t->codec->name, t->layout.n_planes);
    for (uint32_t i = 0; i < v; i++)
        if (stored.planes[i].offset != t->layout.planes[i].offset || stored.planes[i].bytes != t->layout.planes[i].bytes)
            return nf_error_set(r->err, NF_ERR_FORMAT,
                                "plane %u at %" PRIu64 " (%" PRIu64 " bytes) does not match the %s layout: %" PRIu64
                                " (%" PRIu64 " bytes)",
                                i, stored.planes[i].offset, stored.planes[i].bytes, t->codec->name,
                                t->layout.planes[i].offset, t->layout.planes[i].bytes);
    return NF_OK;
}

static nf_status rd_tensor(rd *r, size_t i, nf_tensor *t, float **input_divs)
{
    uint64_t at = r->file_off + r->pos;
    uint32_t len;
    nf_status s = rd_str(r, &t->desc.name, &len, 1, NF_TENSOR_NAME_MAX, "tensor name");
    if (s) return nf_error_prefix(r->err, "tensor entry %zu at offset %" PRIu64, i, at);
    if ((s = rd_tensor_fields(r, t, input_divs)))
        return nf_error_prefix(r->err, "tensor '%s' (entry %zu at offset %" PRIu64 ")", t->desc.name, i, at);
    return NF_OK;
}

/* Drops the pages of [off, off + n) from this process's resident set once validation or
 * verification has read them, so neither pins a file that can be tens of GB (the pages stay in the
 * page cache). Only for a mapping we own: never for a caller's buffer. */
static void release_pages(const nf_artifact *a, uint64_t off, uint64_t n)
{
    if (!a->map.data || n == 0) return;
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t lo = off / page * page, hi = off + n;
    (void)madvise((void *)(a->map.data + lo), (size_t)(hi - lo), MADV_DONTNEED);
}

/* Payload placement: aligned, inside the data section, in ascending order without overlap. */
static nf_status check_payloads(nf_artifact *a, nf_error *err)
{
    uint64_t prev_end = a->info.data_offset;
    for (size_t i = 0; i < a->info.n_tensors; i++) {
        nf_tensor *t = &a->tensors[i];
        uint64_t off = t->offset, n = t->layout.payload_bytes;
        if (off % a->info.alignment)
            return nf_error_set(err, NF_ERR_FORMAT, "tensor '%s': payload offset %" PRIu64 " is not a multiple of %u",
                                t->desc.name, off, a->info.alignment);
        if (off < prev_end)
            return nf_error_set(err, NF_ERR_FORMAT,
                                "tensor '%s': payload at offset %" PRIu64 " starts before %" PRIu64
                                " (the data section start or the previous payload's end: payloads are in ascending "
                                "order and do not overlap)",
                                t->desc.name, off, prev_end);
        if (off > a->info.index_offset || n > a->info.index_offset - off)
            return nf_error_set(err, NF_ERR_FORMAT,
                                "tensor '%s': payload at offset %" PRIu64 ", %" PRIu64
                                " bytes, runs past the end of the data section (%" PRIu64 ")",
                                t->desc.name, off, n, a->info.index_offset);
        prev_end = off + n;
        t->data = a->base + off;
        if (t->codec->id != NF_CODEC_NVFP4) continue;
        nf_nvfp4_planes p;
        nf_status s = nf_nvfp4_view(t->data, n, t->layout.rows, t->layout.cols, t->desc.divisors, &p, err);
        if (!s) s = nf_nvfp4_validate(&p, err);
        if (s) return nf_error_prefix(err, "tensor '%s' (payload at offset %" PRIu64 ")", t->desc.name, off);
        release_pages(a, off + t->layout.planes[NF_PLANE_SCALES].offset, n - t->layout.planes[NF_PLANE_SCALES].offset);
    }
    return NF_OK;
}

/* ---- uniqueness and lookup ------------------------------------------------------------------- */

static int cmp_tensor(const void *x, const void *y)
{
    return strcmp((*(const nf_tensor *const *)x)->desc.name, (*(const nf_tensor *const *)y)->desc.name);
}

static int cmp_meta(const void *x, const void *y)
{
    return strcmp((*(const nf_meta *const *)x)->key, (*(const nf_meta *const *)y)->key);
}

static nf_status index_names(nf_artifact *a, nf_error *err)
{
    size_t nt = a->info.n_tensors, nm = a->info.n_meta;
    a->tensor_sorted = malloc(nt * sizeof *a->tensor_sorted + 1);
    a->meta_sorted = malloc(nm * sizeof *a->meta_sorted + 1);
    if (!a->tensor_sorted || !a->meta_sorted) return nf_error_set(err, NF_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < nt; i++) a->tensor_sorted[i] = &a->tensors[i];
    for (size_t i = 0; i < nm; i++) a->meta_sorted[i] = &a->meta[i];
    qsort(a->tensor_sorted, nt, sizeof *a->tensor_sorted, cmp_tensor);
    qsort(a->meta_sorted, nm, sizeof *a->meta_sorted, cmp_meta);
    for (size_t i = 1; i < nt; i++)
        if (!strcmp(a->tensor_sorted[i]->desc.name, a->tensor_sorted[i - 1]->desc.name))
            return nf_error_set(err, NF_ERR_FORMAT, "tensor name '%s' appears more than once (entries %zu and %zu)",
                                a->tensor_sorted[i]->desc.name, (size_t)(a->tensor_sorted[i - 1] - a->tensors),
                                (size_t)(a->tensor_sorted[i] - a->tensors));
    for (size_t i = 1; i < nm; i++)
        if (!strcmp(a->meta_sorted[i]->key, a->meta_sorted[i - 1]->key))
            return nf_error_set(err, NF_ERR_FORMAT, "metadata key '%s' appears more than once", a->meta_sorted[i]->key);
    return NF_OK;
}

/* ---- header and index ------------------------------------------------------------------------ */

static nf_status parse_header(nf_artifact *a, unsigned flags, nf_error *err)
{
    const uint8_t *b = a->base;
    uint64_t size = a->size;
    nf_artifact_info *h = &a->info;
    h->file_bytes = size;
    if (size < 8) return nf_error_set(err, NF_ERR_FORMAT, "file is %" PRIu64 " bytes, too small for an artifact", size);
    if (memcmp(b, NF_ARTIFACT_MAGIC, 8))
        return nf_error_set(err, NF_ERR_FORMAT,
                            "not a ninfer artifact: magic is %02x %02x %02x %02x %02x %02x %02x %02x "
                            "(expected \"NINFER\\x1a\\n\")",
                            b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]);
    if (size < 12) return nf_error_set(err, NF_ERR_FORMAT, "file is %" PRIu64 " bytes, truncated inside the header", size);
    h->major = nf_le16(b + 8);
    h->minor = nf_le16(b + 10);
    if (h->major > NF_ARTIFACT_MAJOR)
        return nf_error_set(err, NF_ERR_VERSION,
                            "written in format version %u.%u; this ninfer reads format version %d (up to %d.%d): "
                            "update ninfer",
                            h->major, h->minor, NF_ARTIFACT_MAJOR, NF_ARTIFACT_MAJOR, NF_ARTIFACT_MINOR);
    if (h->major == 0) return nf_error_set(err, NF_ERR_FORMAT, "format version 0.%u is not a valid version", h->minor);
    if (size < NF_ARTIFACT_HEADER_BYTES)
        return nf_error_set(err, NF_ERR_FORMAT, "file is %" PRIu64 " bytes, truncated inside the %d-byte header", size,
                            NF_ARTIFACT_HEADER_BYTES);
    uint32_t hdr = nf_le32(b + 12), hflags = nf_le32(b + 20);
    h->alignment = nf_le32(b + 16);
    h->data_offset = nf_le64(b + 24);
    h->index_offset = nf_le64(b + 32);
    h->index_bytes = nf_le64(b + 40);
    h->index_checksum = nf_le64(b + 48);
    uint64_t reserved = nf_le64(b + 56);
    if (hdr < NF_ARTIFACT_HEADER_BYTES || hdr % 8)
        return nf_error_set(err, NF_ERR_FORMAT, "header field header_bytes is %u (expected a multiple of 8, >= %d)", hdr,
                            NF_ARTIFACT_HEADER_BYTES);
    if (h->alignment < 64 || h->alignment > (1u << 24) || (h->alignment & (h->alignment - 1)))
        return nf_error_set(err, NF_ERR_FORMAT, "header field alignment is %u (expected a power of two in [64, 2^24])",
                            h->alignment);
    if (hflags || reserved)
        return nf_error_set(err, NF_ERR_FORMAT, "header flags 0x%x / reserved 0x%" PRIx64 " are not zero", hflags,
                            reserved);
    if (h->data_offset < hdr || h->data_offset % h->alignment || h->data_offset > size)
        return nf_error_set(err, NF_ERR_FORMAT,
                            "header field data_offset is %" PRIu64 " (expected a multiple of %u, >= header_bytes %u, "
                            "inside the file of %" PRIu64 " bytes)",
                            h->data_offset, h->alignment, hdr, size);
    if (h->index_offset < h->data_offset || h->index_offset > size || h->index_bytes > size - h->index_offset)
        return nf_error_set(err, NF_ERR_FORMAT,
                            "index at offset %" PRIu64 ", %" PRIu64 " bytes, is not inside the file (%" PRIu64
                            " bytes) after the data section (offset %" PRIu64 "): truncated?",
                            h->index_offset, h->index_bytes, size, h->data_offset);
    if (h->index_bytes != size - h->index_offset)
        return nf_error_set(err, NF_ERR_FORMAT, "%" PRIu64 " unexpected bytes after the index (which ends at %" PRIu64 ")",
                            size - h->index_offset - h->index_bytes, h->index_offset + h->index_bytes);
    if (!(flags & NF_ARTIFACT_SKIP_INDEX_CHECKSUM)) {
        uint64_t c = nf_fnv1a64(b + h->index_offset, (size_t)h->index_bytes);
        if (c != h->index_checksum)
            return nf_error_set(err, NF_ERR_FORMAT,
                                "index checksum 0x%016" PRIx64 " does not match the header's 0x%016" PRIx64
                                " (index at offset %" PRIu64 ", %" PRIu64 " bytes): the file is corrupt",
                                c, h->index_checksum, h->index_offset, h->index_bytes);
    }
    return NF_OK;
}

static nf_status parse_index(nf_artifact *a, nf_error *err)
{
    rd r = {a->base + a->info.index_offset, a->info.index_bytes, 0, a->info.index_offset, err};
    nf_status s = need(&r, 16, "index head");
    if (s) return s;
    if (memcmp(r.p, NF_ARTIFACT_INDEX_MAGIC, 4))
        return nf_error_set(err, NF_ERR_FORMAT, "index at offset %" PRIu64 " does not start with \"NFIX\"", r.file_off);
    uint32_t nm = nf_le32(r.p + 4), nt = nf_le32(r.p + 8), reserved = nf_le32(r.p + 12);
    r.pos = 16;
    if (reserved) return nf_error_set(err, NF_ERR_FORMAT, "index reserved field is 0x%x (expected 0)", reserved);
    uint64_t left = r.size - r.pos;
    if (nm > left / NF_META_MIN_BYTES || nt > left / NF_TENSOR_MIN_BYTES ||
        (uint64_t)nm * NF_META_MIN_BYTES + (uint64_t)nt * NF_TENSOR_MIN_BYTES > left)
        return nf_error_set(err, NF_ERR_FORMAT, "%u metadata entries and %u tensors cannot fit in an index of %" PRIu64
                            " bytes", nm, nt, r.size);
    a->meta = calloc((size_t)nm + 1, sizeof *a->meta);
    a->tensors = calloc((size_t)nt + 1, sizeof *a->tensors);
    if (!a->meta || !a->tensors) return nf_error_set(err, NF_ERR_NOMEM, "out of memory for the index");
    for (uint32_t i = 0; i < nm; i++, a->info.n_meta++) {
        uint64_t at = r.file_off + r.pos;
        if ((s = rd_meta(&r, &a->meta[i]))) {
            a->info.n_meta++; /* so close() frees what this entry allocated */
            if (a->meta[i].key) return nf_error_prefix(err, "metadata '%s' (entry %u at offset %" PRIu64 ")", a->meta[i].key, i, at);
            return nf_error_prefix(err, "metadata entry %u at offset %" PRIu64, i, at);
        }
    }
    for (uint32_t i = 0; i < nt; i++, a->info.n_tensors++) {
        float *divs = NULL;
        s = rd_tensor(&r, i, &a->tensors[i], &divs);
        a->tensors[i].desc.input_divisors = divs; /* owned (or NULL): freed by close() */
        if (s) {
            a->info.n_tensors++;
            return s;
        }
    }
    if (r.pos != r.size)
        return nf_error_set(err, NF_ERR_FORMAT, "%" PRIu64 " unexpected bytes at the end of the index (offset %" PRIu64 ")",
                            r.size - r.pos, r.file_off + r.pos);
    return NF_OK;
}

static nf_status validate(nf_artifact *a, unsigned flags, nf_error *err)
{
    nf_status s = parse_header(a, flags, err);
    if (!s) s = parse_index(a, err);
    if (!s) s = index_names(a, err);
    if (!s) s = check_payloads(a, err);
    return s;
}

static nf_status open_common(nf_artifact *a, unsigned flags, nf_artifact **out, nf_error *err)
{
    nf_status s = a->name ? validate(a, flags, err) : nf_error_set(err, NF_ERR_NOMEM, "out of memory");
    if (s) {
        if (a->name) nf_error_prefix(err, "%s", a->name);
        nf_artifact_close(a);
        return s;
    }
    *out = a;
    return NF_OK;
}

nf_status nf_artifact_open_memory(const void *data, size_t size, const char *name, unsigned flags, nf_artifact **out,
                                  nf_error *err)
{
    *out = NULL;
    nf_artifact *a = calloc(1, sizeof *a);
    if (!a) return nf_error_set(err, NF_ERR_NOMEM, "out of memory");
    a->base = data;
    a->size = size;
    a->name = strdup(name ? name : "(memory)");
    return open_common(a, flags, out, err);
}

nf_status nf_artifact_open_ex(const char *path, unsigned flags, nf_artifact **out, nf_error *err)
{
    *out = NULL;
    nf_artifact *a = calloc(1, sizeof *a);
    if (!a) return nf_error_set(err, NF_ERR_NOMEM, "out of memory");
    nf_status s = nf_map_file(path, &a->map, err);
    if (s) {
        free(a);
        return s;
    }
    a->base = a->map.data;
    a->size = a->map.size;
    a->name = strdup(path);
    return open_common(a, flags, out, err);
}

nf_status nf_artifact_open(const char *path, nf_artifact **out, nf_error *err)
{
    return nf_artifact_open_ex(path, 0, out, err);
}

void nf_artifact_close(nf_artifact *a)
{
    if (!a) return;
    for (uint64_t i = 0; i < a->info.n_meta; i++) {
        free((void *)a->meta[i].elems);
        free((void *)a->meta[i].strs);
        free((void *)a->meta[i].str_lens);
    }
    for (uint64_t i = 0; i < a->info.n_tensors; i++) free((void *)a->tensors[i].desc.input_divisors);
    free(a->meta);
    free(a->tensors);
    free(a->meta_sorted);
    free(a->tensor_sorted);
    if (a->map.path) nf_unmap_file(&a->map);
    free(a->name);
    free(a);
}

/* ---- accessors ------------------------------------------------------------------------------- */

const nf_artifact_info *nf_artifact_get_info(const nf_artifact *a) { return &a->info; }
const char *nf_artifact_path(const nf_artifact *a) { return a->name; }
size_t nf_artifact_n_tensors(const nf_artifact *a) { return (size_t)a->info.n_tensors; }
size_t nf_artifact_n_meta(const nf_artifact *a) { return (size_t)a->info.n_meta; }

const nf_tensor *nf_artifact_tensor(const nf_artifact *a, size_t i)
{
    return i < a->info.n_tensors ? &a->tensors[i] : NULL;
}

const nf_meta *nf_artifact_meta(const nf_artifact *a, size_t i) { return i < a->info.n_meta ? &a->meta[i] : NULL; }

static int key_cmp_tensor(const void *k, const void *e)
{
    return strcmp((const char *)k, (*(const nf_tensor *const *)e)->desc.name);
}

static int key_cmp_meta(const void *k, const void *e) { return strcmp((const char *)k, (*(const nf_meta *const *)e)->key); }

const nf_tensor *nf_artifact_find_tensor(const nf_artifact *a, const char *name)
{
    if (!name || !a->info.n_tensors) return NULL;
    const nf_tensor *const *t = bsearch(name, a->tensor_sorted, (size_t)a->info.n_tensors, sizeof *a->tensor_sorted,
                                        key_cmp_tensor);
    return t ? *t : NULL;
}

nf_status nf_artifact_get_tensor(const nf_artifact *a, const char *name, const nf_tensor **out, nf_error *err)
{
    *out = nf_artifact_find_tensor(a, name);
    if (!*out)
        return nf_error_set(err, NF_ERR_FORMAT, "%s: no tensor named '%s' (%" PRIu64 " tensors)", a->name,
                            name ? name : "(null)", a->info.n_tensors);
    return NF_OK;
}

const nf_meta *nf_artifact_find_meta(const nf_artifact *a, const char *key)
{
    if (!key || !a->info.n_meta) return NULL;
    const nf_meta *const *m = bsearch(key, a->meta_sorted, (size_t)a->info.n_meta, sizeof *a->meta_sorted, key_cmp_meta);
    return m ? *m : NULL;
}

nf_status nf_artifact_verify(const nf_artifact *a, size_t *checked, size_t *mismatched, nf_error *err)
{
    size_t nc = 0, nbad = 0;
    nf_status first = NF_OK;
    for (uint64_t i = 0; i < a->info.n_tensors; i++) {
        int did;
        nf_error e;
        nf_status s = nf_tensor_verify(&a->tensors[i], &did, &e);
        release_pages(a, a->tensors[i].offset, a->tensors[i].layout.payload_bytes);
        nc += (size_t)did;
        if (s) {
            nbad++;
            if (!first) first = nf_error_set(err, s, "%s: %s", a->name, e.msg);
        }
    }
    if (checked) *checked = nc;
    if (mismatched) *mismatched = nbad;
    return first;
}

/* safetensors reader: see safetensors.h for the format and what is validated. */
#define _POSIX_C_SOURCE 200809L
#include "format/safetensors.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/log.h"
#include "base/mapfile.h"

/* safetensors itself refuses headers over 100 MB; a real one is well under 1 MB per 1000 tensors. */
#define ST_MAX_HEADER 100000000ull
/* JSON numbers are doubles: integers above 2^53 cannot be represented exactly. */
#define ST_MAX_JSON_INT 9007199254740992.0

static const struct {
    const char *name;
    size_t size;
} dtypes[NF_ST_DTYPE_COUNT] = {
    [NF_ST_BOOL] = {"BOOL", 1},   [NF_ST_U8] = {"U8", 1},       [NF_ST_I8] = {"I8", 1},
    [NF_ST_F8_E4M3] = {"F8_E4M3", 1}, [NF_ST_F8_E5M2] = {"F8_E5M2", 1}, [NF_ST_F8_E8M0] = {"F8_E8M0", 1},
    [NF_ST_I16] = {"I16", 2},     [NF_ST_U16] = {"U16", 2},     [NF_ST_F16] = {"F16", 2},
    [NF_ST_BF16] = {"BF16", 2},   [NF_ST_I32] = {"I32", 4},     [NF_ST_U32] = {"U32", 4},
    [NF_ST_F32] = {"F32", 4},     [NF_ST_I64] = {"I64", 8},     [NF_ST_U64] = {"U64", 8},
    [NF_ST_F64] = {"F64", 8},
};

const char *nf_st_dtype_name(nf_st_dtype d) { return (unsigned)d < NF_ST_DTYPE_COUNT ? dtypes[d].name : "?"; }
size_t nf_st_dtype_size(nf_st_dtype d) { return (unsigned)d < NF_ST_DTYPE_COUNT ? dtypes[d].size : 0; }

static int dtype_by_name(const char *s, nf_st_dtype *out)
{
    for (int i = 0; i < NF_ST_DTYPE_COUNT; i++)
        if (strcmp(dtypes[i].name, s) == 0) {
            *out = (nf_st_dtype)i;
            return 1;
        }
    return 0;
}

struct nf_safetensors {
    nf_mapped_file file;        /* for open_memory: the caller's bytes, not a mapping */
    int borrowed;               /* file.data belongs to the caller: close only frees path */
    uint64_t data_start;        /* 8 + header length */
    nf_st_tensor *tensors;      /* [n], data-offset order */
    const nf_st_tensor **by_name; /* [n], sorted by name */
    size_t n;
    const char **meta;          /* [2 * n_meta]: key, value, key, value, ... */
    size_t n_meta;
    cJSON *root;                /* the parsed header: names and metadata point into it */
};

/* ---- header parsing ---------------------------------------------------------------------- */

/* A JSON number that is a non-negative integer exactly representable as a double. */
static int json_uint(const cJSON *j, uint64_t *out)
{
    if (!cJSON_IsNumber(j)) return 0;
    double v = j->valuedouble;
    if (!(v >= 0.0) || v > ST_MAX_JSON_INT || v != (double)(uint64_t)v) return 0;
    *out = (uint64_t)v;
    return 1;
}

static void format_shape(const nf_st_tensor *t, char *buf, size_t cap)
{
    size_t len = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < t->n_dims && len < cap; d++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%" PRIu64, d ? ", " : "", t->shape[d]);
    if (len < cap) snprintf(buf + len, cap - len, "]");
}

static nf_status parse_dtype(const cJSON *e, const char *name, nf_st_tensor *t, nf_error *err)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    if (!cJSON_IsString(j))
        return nf_error_set(err, NF_ERR_FORMAT, "tensor '%s': \"dtype\" is missing or not a string", name);
    if (!dtype_by_name(j->valuestring, &t->dtype)) {
        char known[256];
        size_t len = 0;
        for (int i = 0; i < NF_ST_DTYPE_COUNT && len < sizeof known; i++)
            len += (size_t)snprintf(known + len, sizeof known - len, "%s%s", i ? " " : "", dtypes[i].name);
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "tensor '%s': unknown dtype '%.40s' (known: %s)", name,
                            j->valuestring, known);
    }
    return NF_OK;
}

static nf_status parse_shape(const cJSON *e, const char *name, nf_st_tensor *t, nf_error *err)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(e, "shape");
    if (!cJSON_IsArray(j))
        return nf_error_set(err, NF_ERR_FORMAT, "tensor '%s': \"shape\" is missing or not an array", name);
    int n = cJSON_GetArraySize(j);
    if (n > NF_ST_MAX_DIMS)
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "tensor '%s': %d dimensions, at most %d supported", name, n,
                            NF_ST_MAX_DIMS);
    t->n_dims = n;
    t->n_elems = 1;
    uint64_t limit = UINT64_MAX / nf_st_dtype_size(t->dtype); /* so nbytes cannot overflow */
    int d = 0;
    for (const cJSON *x = j->child; x; x = x->next, d++) {
        if (!json_uint(x, &t->shape[d]))
            return nf_error_set(err, NF_ERR_FORMAT, "tensor '%s': shape[%d] is not a non-negative integer", name, d);
        if (t->shape[d] && t->n_elems > limit / t->shape[d])
            return nf_error_set(err, NF_ERR_FORMAT, "tensor '%s': shape overflows 64 bits", name);
        t->n_elems *= t->shape[d];
    }
    t->nbytes = t->n_elems * nf_st_dtype_size(t->dtype);
    return NF_OK;
}

/* begin/end are relative to the data section, which is data_size bytes long. */
static nf_status parse_offsets(const cJSON *e, const char *name, uint64_t data_size, nf_st_tensor *t,
                               uint64_t *begin, uint64_t *end, nf_error *err)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsArray(j) || cJSON_GetArraySize(j) != 2 || !json_uint(j->child, begin) ||
        !json_uint(j->child->next, end))
        return nf_error_set(err, NF_ERR_FORMAT, "tensor '%s': \"data_offsets\" is not [begin, end] of two "
                            "non-negative integers", name);
    if (*begin > *end)
        return nf_error_set(err, NF_ERR_FORMAT, "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 ") begin after end",
                            name, *begin, *end);
    if (*end > data_size)
        return nf_error_set(err, NF_ERR_FORMAT,
                            "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 ") run past the data section (%" PRIu64
                            " bytes)", name, *begin, *end, data_size);
    if (*end - *begin != t->nbytes) {
        char shape[160];
        format_shape(t, shape, sizeof shape);
        return nf_error_set(err, NF_ERR_FORMAT,
                            "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 ") hold %" PRIu64
                            " bytes, but shape %s of %s needs %" PRIu64, name, *begin, *end, *end - *begin, shape,
                            nf_st_dtype_name(t->dtype), t->nbytes);
    }
    return NF_OK;
}

static nf_status parse_tensor(nf_safetensors *st, const cJSON *e, nf_st_tensor *t, nf_error *err)
{
    const char *name = e->string;
    memset(t, 0, sizeof *t);
    t->name = name;
    if (!cJSON_IsObject(e)) return nf_error_set(err, NF_ERR_FORMAT, "tensor '%s': header entry is not an object", name);
    nf_status s = parse_dtype(e, name, t, err);
    if (s == NF_OK) s = parse_shape(e, name, t, err);
    uint64_t begin = 0, end = 0;
    if (s == NF_OK) s = parse_offsets(e, name, st->file.size - st->data_start, t, &begin, &end, err);
    if (s != NF_OK) return s;
    t->file_offset = st->data_start + begin;
    t->data = t->nbytes ? st->file.data + t->file_offset : NULL;
    return NF_OK;
}

static nf_status parse_metadata(nf_safetensors *st, const cJSON *m, nf_error *err)
{
    if (st->meta) return nf_error_set(err, NF_ERR_FORMAT, "\"__metadata__\" appears twice in the header");
    if (!cJSON_IsObject(m)) return nf_error_set(err, NF_ERR_FORMAT, "\"__metadata__\" is not an object");
    size_t n = (size_t)cJSON_GetArraySize(m);
    st->meta = calloc(2 * n + 1, sizeof *st->meta);
    if (!st->meta) return nf_error_set(err, NF_ERR_NOMEM, "out of memory for __metadata__");
    for (const cJSON *x = m->child; x; x = x->next) {
        if (!cJSON_IsString(x))
            return nf_error_set(err, NF_ERR_FORMAT, "\"__metadata__\" value of '%s' is not a string", x->string);
        st->meta[2 * st->n_meta] = x->string;
        st->meta[2 * st->n_meta + 1] = x->valuestring;
        st->n_meta++;
    }
    return NF_OK;
}

static int by_offset(const void *a, const void *b)
{
    const nf_st_tensor *x = a, *y = b;
    if (x->file_offset != y->file_offset) return x->file_offset < y->file_offset ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

static int by_name(const void *a, const void *b)
{
    return strcmp((*(const nf_st_tensor *const *)a)->name, (*(const nf_st_tensor *const *)b)->name);
}

/* Sorted by offset: a tensor overlaps an earlier one when it begins before the furthest end so far.
 * Zero-byte tensors occupy nothing and may sit anywhere. Names must be unique. */
static nf_status check_layout(nf_safetensors *st, nf_error *err)
{
    qsort(st->tensors, st->n, sizeof *st->tensors, by_offset);
    const nf_st_tensor *last = NULL;
    for (size_t i = 0; i < st->n; i++) {
        const nf_st_tensor *t = &st->tensors[i];
        if (!t->nbytes) continue;
        if (last && t->file_offset < last->file_offset + last->nbytes)
            return nf_error_set(err, NF_ERR_FORMAT,
                                "tensors '%s' [%" PRIu64 ", %" PRIu64 ") and '%s' [%" PRIu64 ", %" PRIu64 ") overlap",
                                last->name, last->file_offset - st->data_start,
                                last->file_offset - st->data_start + last->nbytes, t->name,
                                t->file_offset - st->data_start, t->file_offset - st->data_start + t->nbytes);
        if (!last || t->file_offset + t->nbytes > last->file_offset + last->nbytes) last = t;
    }
    st->by_name = malloc((st->n ? st->n : 1) * sizeof *st->by_name);
    if (!st->by_name) return nf_error_set(err, NF_ERR_NOMEM, "out of memory for %zu tensors", st->n);
    for (size_t i = 0; i < st->n; i++) st->by_name[i] = &st->tensors[i];
    qsort(st->by_name, st->n, sizeof *st->by_name, by_name);
    for (size_t i = 1; i < st->n; i++)
        if (strcmp(st->by_name[i - 1]->name, st->by_name[i]->name) == 0)
            return nf_error_set(err, NF_ERR_FORMAT, "tensor name '%s' appears twice in the header",
                                st->by_name[i]->name);
    return NF_OK;
}

static nf_status parse_entries(nf_safetensors *st, const cJSON *root, nf_error *err)
{
    size_t n = (size_t)cJSON_GetArraySize(root);
    st->tensors = calloc(n ? n : 1, sizeof *st->tensors);
    if (!st->tensors) return nf_error_set(err, NF_ERR_NOMEM, "out of memory for %zu header entries", n);
    for (const cJSON *e = root->child; e; e = e->next) {
        nf_status s = strcmp(e->string, "__metadata__") == 0 ? parse_metadata(st, e, err)
                                                            : parse_tensor(st, e, &st->tensors[st->n++], err);
        if (s != NF_OK) return s;
    }
    return check_layout(st, err);
}

/* The 8-byte length and the JSON it announces; the header may end in padding spaces. */
static nf_status parse_header(nf_safetensors *st, cJSON **root, nf_error *err)
{
    const nf_mapped_file *f = &st->file;
    if (f->size < 8)
        return nf_error_set(err, NF_ERR_FORMAT, "file is %zu bytes, too short for the 8-byte header length", f->size);
    uint64_t len = 0;
    for (int i = 7; i >= 0; i--) len = len << 8 | f->data[i];
    if (len > f->size - 8)
        return nf_error_set(err, NF_ERR_FORMAT, "header length %" PRIu64 " runs past the end of the file (%zu bytes)",
                            len, f->size);
    if (len > ST_MAX_HEADER)
        return nf_error_set(err, NF_ERR_FORMAT, "header length %" PRIu64 " exceeds the %llu-byte limit", len,
                            ST_MAX_HEADER);
    st->data_start = 8 + len;
    const char *json = (const char *)f->data + 8, *end = NULL;
    *root = cJSON_ParseWithLengthOpts(json, (size_t)len, &end, 0);
    if (!*root) {
        long at = end && end >= json ? (long)(end - json) : -1;
        return nf_error_set(err, NF_ERR_FORMAT, "header JSON (%" PRIu64 " bytes) does not parse (near header byte %ld)",
                            len, at);
    }
    for (const char *p = end; p < json + len; p++)
        if (*p != ' ' && *p != '\n' && *p != '\r' && *p != '\t')
            return nf_error_set(err, NF_ERR_FORMAT, "header has trailing bytes after the JSON at header byte %ld",
                                (long)(p - json));
    if (!cJSON_IsObject(*root)) return nf_error_set(err, NF_ERR_FORMAT, "header JSON is not an object");
    return NF_OK;
}

/* Parses st->file (mapped or borrowed); on failure closes st, with the error prefixed by its name. */
static nf_status open_common(nf_safetensors *st, nf_safetensors **out, nf_error *err)
{
    nf_status s = parse_header(st, &st->root, err);
    if (s == NF_OK) s = parse_entries(st, st->root, err);
    if (s != NF_OK) {
        nf_error_prefix(err, "%s", st->file.path);
        nf_safetensors_close(st);
        return s;
    }
    *out = st;
    return NF_OK;
}

nf_status nf_safetensors_open(const char *path, nf_safetensors **out, nf_error *err)
{
    *out = NULL;
    nf_safetensors *st = calloc(1, sizeof *st);
    if (!st) return nf_error_set(err, NF_ERR_NOMEM, "%s: out of memory", path);
    nf_status s = nf_map_file(path, &st->file, err);
    if (s != NF_OK) {
        free(st);
        return s;
    }
    return open_common(st, out, err);
}

nf_status nf_safetensors_open_memory(const void *data, size_t size, const char *name, nf_safetensors **out,
                                     nf_error *err)
{
    *out = NULL;
    if (!name) name = "(memory)";
    nf_safetensors *st = calloc(1, sizeof *st);
    char *path = strdup(name);
    if (!st || !path) {
        free(st);
        free(path);
        return nf_error_set(err, NF_ERR_NOMEM, "%s: out of memory", name);
    }
    st->borrowed = 1;
    st->file.data = size ? data : NULL; /* as nf_map_file leaves an empty file */
    st->file.size = size;
    st->file.path = path;
    return open_common(st, out, err);
}

void nf_safetensors_close(nf_safetensors *st)
{
    if (!st) return;
    cJSON_Delete(st->root);
    free(st->tensors);
    free(st->by_name);
    free(st->meta);
    if (st->borrowed) free(st->file.path);
    else nf_unmap_file(&st->file);
    free(st);
}

const char *nf_safetensors_path(const nf_safetensors *st) { return st->file.path; }
size_t nf_safetensors_count(const nf_safetensors *st) { return st->n; }
const nf_st_tensor *nf_safetensors_at(const nf_safetensors *st, size_t i) { return i < st->n ? &st->tensors[i] : NULL; }

static const nf_st_tensor *find_sorted(const nf_st_tensor *const *v, size_t n, const char *name)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(v[mid]->name, name);
        if (c == 0) return v[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

const nf_st_tensor *nf_safetensors_find(const nf_safetensors *st, const char *name)
{
    return find_sorted(st->by_name, st->n, name);
}

const char *nf_safetensors_metadata(const nf_safetensors *st, const char *key)
{
    for (size_t i = 0; i < st->n_meta; i++)
        if (strcmp(st->meta[2 * i], key) == 0) return st->meta[2 * i + 1];
    return NULL;
}

/* ---- checkpoints of several files --------------------------------------------------------- */

struct nf_st_set {
    nf_safetensors **shards;     /* [n_shards] */
    size_t n_shards;
    nf_st_tensor *tensors;       /* [n], copies with .shard set; names point into the shards */
    const nf_st_tensor **by_name; /* [n], sorted by name */
    size_t n;
};

void nf_st_set_close(nf_st_set *set)
{
    if (!set) return;
    for (size_t i = 0; i < set->n_shards; i++) nf_safetensors_close(set->shards[i]);
    free(set->shards);
    free(set->tensors);
    free(set->by_name);
    free(set);
}

size_t nf_st_set_count(const nf_st_set *set) { return set->n; }
const nf_st_tensor *nf_st_set_at(const nf_st_set *set, size_t i) { return i < set->n ? set->by_name[i] : NULL; }
const nf_st_tensor *nf_st_set_find(const nf_st_set *set, const char *name)
{
    return find_sorted(set->by_name, set->n, name);
}
size_t nf_st_set_shard_count(const nf_st_set *set) { return set->n_shards; }
const nf_safetensors *nf_st_set_shard(const nf_st_set *set, size_t i)
{
    return i < set->n_shards ? set->shards[i] : NULL;
}

nf_status nf_st_set_get(const nf_st_set *set, const char *name, const nf_st_tensor **out, nf_error *err)
{
    *out = nf_st_set_find(set, name);
    if (*out) return NF_OK;
    return nf_error_set(err, NF_ERR_FORMAT, "%s: tensor '%s' is missing from the checkpoint",
                        set->n_shards ? nf_safetensors_path(set->shards[0]) : "(checkpoint)", name);
}

static char *join_path(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (p) snprintf(p, a + b + 2, "%s/%s", dir, name);
    return p;
}

static nf_status set_alloc(nf_st_set *set, size_t n_shards, size_t n, nf_error *err)
{
    set->shards = calloc(n_shards ? n_shards : 1, sizeof *set->shards);
    set->tensors = calloc(n ? n : 1, sizeof *set->tensors);
    set->by_name = calloc(n ? n : 1, sizeof *set->by_name);
    if (!set->shards || !set->tensors || !set->by_name)
        return nf_error_set(err, NF_ERR_NOMEM, "out of memory for %zu tensors in %zu shards", n, n_shards);
    return NF_OK;
}

/* Sorts by name; the caller has filled set->tensors[0..n). */
static void set_index(nf_st_set *set)
{
    for (size_t i = 0; i < set->n; i++) set->by_name[i] = &set->tensors[i];
    qsort(set->by_name, set->n, sizeof *set->by_name, by_name);
}

static nf_status open_single(nf_st_set *set, const char *file, nf_error *err)
{
    nf_safetensors *st;
    nf_status s = nf_safetensors_open(file, &st, err);
    if (s != NF_OK) return s;
    s = set_alloc(set, 1, st->n, err);
    if (s != NF_OK) {
        nf_safetensors_close(st);
        return s;
    }
    set->shards[0] = st;
    set->n_shards = 1;
    for (size_t i = 0; i < st->n; i++) set->tensors[set->n++] = st->tensors[i];
    set_index(set);
    return NF_OK;
}

/* A shard must be a plain file name beside the index: no folders, no way out of the checkpoint. */
static int plain_file_name(const char *s)
{
    return s[0] && strcmp(s, ".") && strcmp(s, "..") && !strchr(s, '/') && !strchr(s, '\\');
}

/* Shard index of `file` among the names seen so far, adding it when new. */
static size_t shard_slot(const char **names, size_t *n, const char *file)
{
    for (size_t i = 0; i < *n; i++)
        if (strcmp(names[i], file) == 0) return i;
    names[*n] = file;
    return (*n)++;
}

static nf_status open_shards(nf_st_set *set, const char *dir, const char **names, size_t n, nf_error *err)
{
    for (size_t i = 0; i < n; i++) {
        char *p = join_path(dir, names[i]);
        if (!p) return nf_error_set(err, NF_ERR_NOMEM, "out of memory");
        nf_status s = nf_safetensors_open(p, &set->shards[i], err);
        free(p);
        if (s != NF_OK) return s;
        set->n_shards++;
    }
    return NF_OK;
}

/* Resolves every weight_map entry in its shard; warns about shard tensors the index leaves out. */
static nf_status map_tensors(nf_st_set *set, const char *index, const cJSON *map, const size_t *slot,
                             const char **names, nf_error *err)
{
    size_t i = 0;
    for (const cJSON *e = map->child; e; e = e->next, i++) {
        const nf_st_tensor *t = nf_safetensors_find(set->shards[slot[i]], e->string);
        if (!t)
            return nf_error_set(err, NF_ERR_FORMAT, "%s: tensor '%s' is mapped to shard '%s', which does not hold it",
                                index, e->string, names[slot[i]]);
        set->tensors[set->n] = *t;
        set->tensors[set->n++].shard = (int)slot[i];
    }
    set_index(set);
    for (size_t k = 1; k < set->n; k++)
        if (strcmp(set->by_name[k - 1]->name, set->by_name[k]->name) == 0)
            return nf_error_set(err, NF_ERR_FORMAT, "%s: tensor '%s' appears twice in weight_map", index,
                                set->by_name[k]->name);
    for (size_t s = 0; s < set->n_shards; s++) {
        size_t mapped = 0;
        for (size_t k = 0; k < set->n; k++) mapped += set->tensors[k].shard == (int)s;
        if (mapped < set->shards[s]->n)
            NF_WARN("%s: shard '%s' holds %zu tensors that weight_map does not name; they are ignored", index,
                    names[s], set->shards[s]->n - mapped);
    }
    return NF_OK;
}

static nf_status read_weight_map(const char *index, const cJSON *root, const cJSON **map, nf_error *err)
{
    *map = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (!cJSON_IsObject(*map)) return nf_error_set(err, NF_ERR_FORMAT, "%s: no \"weight_map\" object", index);
    for (const cJSON *e = (*map)->child; e; e = e->next)
        if (!cJSON_IsString(e) || !plain_file_name(e->valuestring))
            return nf_error_set(err, NF_ERR_FORMAT,
                                "%s: weight_map entry '%s' is not the file name of a shard beside the index", index,
                                e->string);
    return NF_OK;
}

static nf_status open_index(nf_st_set *set, const char *index, nf_error *err)
{
    nf_mapped_file f;
    nf_status s = nf_map_file(index, &f, err);
    if (s != NF_OK) return s;
    cJSON *root = cJSON_ParseWithLength((const char *)f.data, f.size);
    nf_unmap_file(&f);
    if (!root) return nf_error_set(err, NF_ERR_FORMAT, "%s: not valid JSON", index);
    const cJSON *map;
    s = read_weight_map(index, root, &map, err);
    size_t n = s == NF_OK ? (size_t)cJSON_GetArraySize(map) : 0, n_names = 0;
    const char **names = calloc(n ? n : 1, sizeof *names);
    size_t *slot = calloc(n ? n : 1, sizeof *slot);
    if (s == NF_OK && (!names || !slot)) s = nf_error_set(err, NF_ERR_NOMEM, "%s: out of memory", index);
    if (s == NF_OK) {
        size_t i = 0;
        for (const cJSON *e = map->child; e; e = e->next) slot[i++] = shard_slot(names, &n_names, e->valuestring);
        s = set_alloc(set, n_names, n, err);
    }
    char *dir = s == NF_OK ? strdup(index) : NULL;
    if (dir) {
        char *slash = strrchr(dir, '/');
        if (slash) *slash = '\0';
        else strcpy(dir, ".");
        s = open_shards(set, dir, names, n_names, err);
        if (s == NF_OK) s = map_tensors(set, index, map, slot, names, err);
    } else if (s == NF_OK) {
        s = nf_error_set(err, NF_ERR_NOMEM, "%s: out of memory", index);
    }
    free(dir);
    free(names);
    free(slot);
    cJSON_Delete(root); /* tensor names live in the shards' own headers, not here */
    return s;
}

static int is_file(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static nf_status open_folder(nf_st_set *set, const char *dir, nf_error *err)
{
    char *single = join_path(dir, "model.safetensors"), *index = join_path(dir, "model.safetensors.index.json");
    nf_status s;
    if (!single || !index) s = nf_error_set(err, NF_ERR_NOMEM, "out of memory");
    else if (is_file(single)) s = open_single(set, single, err);
    else if (is_file(index)) s = open_index(set, index, err);
    else s = nf_error_set(err, NF_ERR_IO, "%s: no model.safetensors or model.safetensors.index.json in this folder", dir);
    free(single);
    free(index);
    return s;
}

nf_status nf_st_set_open(const char *path, nf_st_set **out, nf_error *err)
{
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0) return nf_error_set(err, NF_ERR_IO, "%s: no such file or folder", path);
    nf_st_set *set = calloc(1, sizeof *set);
    if (!set) return nf_error_set(err, NF_ERR_NOMEM, "%s: out of memory", path);
    nf_status s = S_ISDIR(sb.st_mode)       ? open_folder(set, path, err)
                  : ends_with(path, ".json") ? open_index(set, path, err)
                                             : open_single(set, path, err);
    if (s != NF_OK) {
        nf_st_set_close(set);
        return s;
    }
    *out = set;
    return NF_OK;
}

/* Typed metadata lookups: a missing key or a wrong type is an error naming the file, the key and
 * both types, so a loader can `return` it as is. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "format/artifact.h"
#include "format/artifact_internal.h"

const char *nf_meta_type_name(nf_meta_type t)
{
    switch (t) {
    case NF_META_U32: return "u32";
    case NF_META_I32: return "i32";
    case NF_META_U64: return "u64";
    case NF_META_I64: return "i64";
    case NF_META_F32: return "f32";
    case NF_META_F64: return "f64";
    case NF_META_BOOL: return "bool";
    case NF_META_STRING: return "string";
    case NF_META_ARRAY: return "array";
    }
    return "?";
}

size_t nf_meta_type_size(nf_meta_type t)
{
    switch (t) {
    case NF_META_BOOL: return 1;
    case NF_META_U32: case NF_META_I32: case NF_META_F32: return 4;
    case NF_META_U64: case NF_META_I64: case NF_META_F64: return 8;
    default: return 0;
    }
}

/* The entry for key, of type t (and, for arrays, element type et), or an error. */
static nf_status lookup(const nf_artifact *a, const char *key, nf_meta_type t, nf_meta_type et, const nf_meta **out,
                        nf_error *err)
{
    const nf_meta *m = nf_artifact_find_meta(a, key);
    *out = m;
    if (!m) return nf_error_set(err, NF_ERR_FORMAT, "%s: metadata key '%s' is missing", nf_artifact_path(a), key);
    if (m->type != t || (t == NF_META_ARRAY && m->elem_type != et)) {
        char want[32], have[32];
        snprintf(want, sizeof want, t == NF_META_ARRAY ? "array of %s" : "%s",
                 nf_meta_type_name(t == NF_META_ARRAY ? et : t));
        snprintf(have, sizeof have, m->type == NF_META_ARRAY ? "array of %s" : "%s",
                 nf_meta_type_name(m->type == NF_META_ARRAY ? m->elem_type : m->type));
        *out = NULL;
        return nf_error_set(err, NF_ERR_FORMAT, "%s: metadata key '%s' is %s, expected %s", nf_artifact_path(a), key,
                            have, want);
    }
    return NF_OK;
}

#define NF_SCALAR_GETTER(fn, ctype, T, field)                                                      \
    nf_status fn(const nf_artifact *a, const char *key, ctype *v, nf_error *err)                   \
    {                                                                                              \
        const nf_meta *m;                                                                          \
        nf_status s = lookup(a, key, T, 0, &m, err);                                               \
        if (!s) *v = m->v.field;                                                                   \
        return s;                                                                                  \
    }

NF_SCALAR_GETTER(nf_artifact_get_u32, uint32_t, NF_META_U32, u32)
NF_SCALAR_GETTER(nf_artifact_get_i32, int32_t, NF_META_I32, i32)
NF_SCALAR_GETTER(nf_artifact_get_u64, uint64_t, NF_META_U64, u64)
NF_SCALAR_GETTER(nf_artifact_get_i64, int64_t, NF_META_I64, i64)
NF_SCALAR_GETTER(nf_artifact_get_f32, float, NF_META_F32, f32)
NF_SCALAR_GETTER(nf_artifact_get_f64, double, NF_META_F64, f64)
NF_SCALAR_GETTER(nf_artifact_get_bool, int, NF_META_BOOL, b)

nf_status nf_artifact_get_str(const nf_artifact *a, const char *key, const char **s, size_t *len, nf_error *err)
{
    const nf_meta *m;
    nf_status st = lookup(a, key, NF_META_STRING, 0, &m, err);
    if (st) return st;
    *s = m->str;
    if (len) *len = (size_t)m->count;
    return NF_OK;
}

nf_status nf_artifact_get_int(const nf_artifact *a, const char *key, int64_t *v, nf_error *err)
{
    const nf_meta *m = nf_artifact_find_meta(a, key);
    if (!m) return nf_error_set(err, NF_ERR_FORMAT, "%s: metadata key '%s' is missing", nf_artifact_path(a), key);
    switch (m->type) {
    case NF_META_U32: *v = m->v.u32; return NF_OK;
    case NF_META_I32: *v = m->v.i32; return NF_OK;
    case NF_META_I64: *v = m->v.i64; return NF_OK;
    case NF_META_U64:
        if (m->v.u64 <= INT64_MAX) {
            *v = (int64_t)m->v.u64;
            return NF_OK;
        }
        return nf_error_set(err, NF_ERR_FORMAT, "%s: metadata key '%s' = %" PRIu64 " does not fit in int64",
                            nf_artifact_path(a), key, m->v.u64);
    default:
        return nf_error_set(err, NF_ERR_FORMAT, "%s: metadata key '%s' is %s, expected an integer", nf_artifact_path(a),
                            key, nf_meta_type_name(m->type));
    }
}

#define NF_ARRAY_GETTER(fn, ctype, ET)                                                             \
    nf_status fn(const nf_artifact *a, const char *key, const ctype **v, size_t *n, nf_error *err) \
    {                                                                                              \
        const nf_meta *m;                                                                          \
        nf_status s = lookup(a, key, NF_META_ARRAY, ET, &m, err);                                  \
        if (s) return s;                                                                           \
        *v = (const ctype *)m->elems;                                                              \
        *n = (size_t)m->count;                                                                     \
        return NF_OK;                                                                              \
    }

NF_ARRAY_GETTER(nf_artifact_get_i32_array, int32_t, NF_META_I32)
NF_ARRAY_GETTER(nf_artifact_get_u32_array, uint32_t, NF_META_U32)
NF_ARRAY_GETTER(nf_artifact_get_i64_array, int64_t, NF_META_I64)
NF_ARRAY_GETTER(nf_artifact_get_f32_array, float, NF_META_F32)

nf_status nf_artifact_get_str_array(const nf_artifact *a, const char *key, const char *const **strs,
                                    const uint32_t **lens, size_t *n, nf_error *err)
{
    const nf_meta *m;
    nf_status s = lookup(a, key, NF_META_ARRAY, NF_META_STRING, &m, err);
    if (s) return s;
    *strs = m->strs;
    if (lens) *lens = m->str_lens;
    *n = (size_t)m->count;
    return NF_OK;
}

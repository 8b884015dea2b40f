/* Reading GGUF files (llama.cpp's container), versions 2 and 3, little-endian.
 *
 * Layout: "GGUF", u32 version, u64 tensor count, u64 kv count; kv pairs (string key, u32 value
 * type, value); tensor infos (string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset);
 * padding to `general.alignment` (default 32); the data section. A string is a u64 length and
 * that many bytes (not NUL-terminated). An array is a u32 element type, a u64 count and the
 * elements; arrays of arrays are refused.
 *
 * Dims order: ne[0] is the INNERMOST dimension (the row length, contiguous in memory), the
 * reverse of PyTorch/safetensors shapes. A [rows][cols] matrix has ne = {cols, rows}.
 *
 * nf_gguf_open maps the file read-only and validates everything before returning: every length,
 * count and offset against the file (overflow-safe), value types, unique keys and tensor names,
 * the alignment, every tensor's byte size (from its ggml type) inside the data section, aligned,
 * and no two tensors overlapping. A tensor whose ggml type ninfer has no codec for is refused with
 * the type number and the tensor name, unless NF_GGUF_METADATA_ONLY is given (then such a tensor
 * has codec == NULL; its size is still checked when ggml's block size for the type is known). */
#ifndef NF_FORMAT_GGUF_H
#define NF_FORMAT_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "codec/codec.h"

typedef enum nf_gguf_type {
    NF_GGUF_UINT8 = 0,
    NF_GGUF_INT8 = 1,
    NF_GGUF_UINT16 = 2,
    NF_GGUF_INT16 = 3,
    NF_GGUF_UINT32 = 4,
    NF_GGUF_INT32 = 5,
    NF_GGUF_FLOAT32 = 6,
    NF_GGUF_BOOL = 7,
    NF_GGUF_STRING = 8,
    NF_GGUF_ARRAY = 9,
    NF_GGUF_UINT64 = 10,
    NF_GGUF_INT64 = 11,
    NF_GGUF_FLOAT64 = 12,
    NF_GGUF_TYPE_COUNT
} nf_gguf_type;

const char *nf_gguf_type_name(nf_gguf_type t); /* "uint32", "string", ...; "?" if invalid */

/* A string inside the mapping: `len` bytes at `ptr`, NOT NUL-terminated, may hold any bytes. */
typedef struct nf_gguf_str {
    const char *ptr;
    uint64_t len;
} nf_gguf_str;

typedef struct nf_gguf_kv {
    const char *key;       /* NUL-terminated copy */
    nf_gguf_type type;
    /* scalars (integers widened, bool as 0/1, float32 widened) */
    union {
        uint64_t u64; /* UINT8..UINT64 and BOOL */
        int64_t i64;  /* INT8..INT64 */
        double f64;   /* FLOAT32, FLOAT64 */
        nf_gguf_str str;
    } v;
    /* arrays */
    nf_gguf_type elem_type;
    uint64_t n;           /* element count */
    const uint8_t *raw;   /* numeric arrays: n little-endian elements, unaligned */
    nf_gguf_str *strs;    /* string arrays: [n] */
} nf_gguf_kv;

#define NF_GGUF_MAX_DIMS 4

typedef struct nf_gguf_tensor {
    const char *name;           /* NUL-terminated copy */
    uint32_t n_dims;            /* 0..4 (0: a scalar) */
    uint64_t ne[NF_GGUF_MAX_DIMS]; /* ne[0] innermost (row length); dims past n_dims are 1 */
    uint64_t n_elems;
    uint32_t ggml_type;         /* as in the file */
    const char *type_name;      /* ggml's name ("q4_K"), or "unknown" */
    const nf_codec *codec;      /* NULL only with NF_GGUF_METADATA_ONLY */
    uint64_t offset;            /* relative to the data section */
    uint64_t nbytes;            /* 0 when the type's block size is unknown */
    const void *data;           /* [nbytes] inside the mapping (aligned to the file's alignment
                                   relative to the file start); NULL when nbytes == 0 */
} nf_gguf_tensor;

enum {
    NF_GGUF_METADATA_ONLY = 1u << 0, /* accept tensors of ggml types ninfer cannot decode */
};

typedef struct nf_gguf nf_gguf;

nf_status nf_gguf_open(const char *path, unsigned flags, nf_gguf **out, nf_error *err);
/* The same checks over `size` bytes at `data` (a GGUF already in memory; the fuzz targets use it).
 * Nothing is copied: the bytes must stay valid and unchanged until nf_gguf_close. `name` (NULL:
 * "(memory)") stands for the path in messages and in nf_gguf_path. */
nf_status nf_gguf_open_memory(const void *data, size_t size, const char *name, unsigned flags, nf_gguf **out,
                              nf_error *err);
void nf_gguf_close(nf_gguf *g);

const char *nf_gguf_path(const nf_gguf *g);
uint32_t nf_gguf_version(const nf_gguf *g);
uint32_t nf_gguf_alignment(const nf_gguf *g);
uint64_t nf_gguf_data_offset(const nf_gguf *g); /* absolute offset of the data section */

/* ---- metadata ---- */
size_t nf_gguf_kv_count(const nf_gguf *g);
const nf_gguf_kv *nf_gguf_kv_at(const nf_gguf *g, size_t i); /* file order */
const nf_gguf_kv *nf_gguf_find_kv(const nf_gguf *g, const char *key); /* NULL when absent */

/* Typed lookups. A missing key is NF_ERR_FORMAT "key 'x' is missing"; a key of another type is
 * NF_ERR_FORMAT naming the key, its type and the type asked for.
 *   get_int:   any integer type (u64 values above INT64_MAX are out of range)
 *   get_u32:   any integer type whose value fits in uint32
 *   get_float: float32 or float64
 *   get_str:   string (not NUL-terminated: see nf_gguf_str) */
nf_status nf_gguf_get_int(const nf_gguf *g, const char *key, int64_t *out, nf_error *err);
nf_status nf_gguf_get_u32(const nf_gguf *g, const char *key, uint32_t *out, nf_error *err);
nf_status nf_gguf_get_float(const nf_gguf *g, const char *key, double *out, nf_error *err);
nf_status nf_gguf_get_bool(const nf_gguf *g, const char *key, int *out, nf_error *err);
nf_status nf_gguf_get_str(const nf_gguf *g, const char *key, nf_gguf_str *out, nf_error *err);

/* Arrays. `want` is the element class asked for: NF_GGUF_STRING, NF_GGUF_INT64 (any integer type
 * or bool; u64 elements above INT64_MAX are refused here), or NF_GGUF_FLOAT64 (float32/float64).
 * The accessors take i < a->n and an array of the matching class. */
nf_status nf_gguf_get_array(const nf_gguf *g, const char *key, nf_gguf_type want, const nf_gguf_kv **out,
                            nf_error *err);
nf_gguf_str nf_gguf_arr_str(const nf_gguf_kv *a, uint64_t i);
int64_t nf_gguf_arr_int(const nf_gguf_kv *a, uint64_t i);
double nf_gguf_arr_float(const nf_gguf_kv *a, uint64_t i);

/* ---- tensors ---- */
size_t nf_gguf_tensor_count(const nf_gguf *g);
const nf_gguf_tensor *nf_gguf_tensor_at(const nf_gguf *g, size_t i); /* file order */
const nf_gguf_tensor *nf_gguf_find_tensor(const nf_gguf *g, const char *name); /* NULL when absent */
/* Like find, but a missing tensor is an error naming it and the file. */
nf_status nf_gguf_get_tensor(const nf_gguf *g, const char *name, const nf_gguf_tensor **out, nf_error *err);

/* ggml's name for a type id ("q4_K", "bf16"), or NULL if the id is not a ggml type. */
const char *nf_ggml_type_name(uint32_t type);

#endif

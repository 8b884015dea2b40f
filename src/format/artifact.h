/* The .nf artifact: one file holding typed metadata, a tensor table and 4096-aligned payloads.
 * docs/artifact.md is the normative specification; this is its C API.
 *
 * Writer: payloads are streamed to "<path>.tmp-<pid>" as tensors are added; the index (metadata +
 * tensor table) is written after the last payload and the fixed header at offset 0 is filled in
 * last. finish fsyncs, re-opens the temporary file with the validating reader, and only then
 * renames it over `path`. Peak memory is the index (metadata and table), never a payload.
 *
 * Reader: maps the file read-only and validates everything (header, index, every tensor, nvfp4
 * planes, metadata types) before returning; afterwards every pointer it hands out is in bounds. */
#ifndef NF_FORMAT_ARTIFACT_H
#define NF_FORMAT_ARTIFACT_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "format/tensor.h"

#define NF_ARTIFACT_MAGIC "NINFER\x1a\n" /* 8 bytes */
#define NF_ARTIFACT_MAJOR 1
#define NF_ARTIFACT_MINOR 0
#define NF_ARTIFACT_ALIGN 4096u /* payload alignment the writer uses */
#define NF_META_KEY_MAX 256     /* bytes, printable ASCII */

/* ---- metadata ---------------------------------------------------------------------------- */

typedef enum nf_meta_type {
    NF_META_U32 = 1,
    NF_META_I32 = 2,
    NF_META_U64 = 3,
    NF_META_I64 = 4,
    NF_META_F32 = 5,
    NF_META_F64 = 6,
    NF_META_BOOL = 7,
    NF_META_STRING = 8,
    NF_META_ARRAY = 9,
} nf_meta_type;

const char *nf_meta_type_name(nf_meta_type t); /* "u32", ..., "array"; "?" when unknown */

/* One metadata entry as the reader returns it. */
typedef struct nf_meta {
    const char *key;          /* NUL-terminated, inside the mapping */
    nf_meta_type type;
    nf_meta_type elem_type;   /* arrays only: any type but ARRAY */
    uint64_t count;           /* arrays: elements; strings: bytes (without the terminating NUL) */
    union {
        uint32_t u32;
        int32_t i32;
        uint64_t u64;
        int64_t i64;
        float f32;
        double f64;
        int b;
    } v;                      /* scalars */
    const char *str;          /* strings: [count] bytes followed by a NUL, inside the mapping */
    const void *elems;        /* numeric/bool arrays: an aligned copy, [count] of elem_type
                               * (bool elements as uint8_t 0/1) */
    const char *const *strs;  /* string arrays: [count] NUL-terminated views into the mapping */
    const uint32_t *str_lens; /* string arrays: [count] byte lengths */
} nf_meta;

/* ---- reader ------------------------------------------------------------------------------ */

typedef struct nf_artifact nf_artifact;

enum {
    /* Do not compare the index with its checksum. For the fuzzer and the corruption test, which
     * want to reach the structural validation behind it; never for loading a model. */
    NF_ARTIFACT_SKIP_INDEX_CHECKSUM = 1u << 0,
};

typedef struct nf_artifact_info {
    uint16_t major, minor;    /* format version of the file */
    uint32_t alignment;       /* payload alignment */
    uint64_t file_bytes;
    uint64_t data_offset;     /* first byte of the data section */
    uint64_t index_offset, index_bytes;
    uint64_t index_checksum;
    uint64_t n_meta, n_tensors;
} nf_artifact_info;

nf_status nf_artifact_open(const char *path, nf_artifact **out, nf_error *err);
nf_status nf_artifact_open_ex(const char *path, unsigned flags, nf_artifact **out, nf_error *err);
/* Validates a caller's buffer (which must outlive the artifact); `name` is used in messages. */
nf_status nf_artifact_open_memory(const void *data, size_t size, const char *name, unsigned flags, nf_artifact **out,
                                  nf_error *err);
void nf_artifact_close(nf_artifact *a); /* NULL is fine */

const nf_artifact_info *nf_artifact_get_info(const nf_artifact *a);
const char *nf_artifact_path(const nf_artifact *a);

/* Tensors in file order (payload order). */
size_t nf_artifact_n_tensors(const nf_artifact *a);
const nf_tensor *nf_artifact_tensor(const nf_artifact *a, size_t i);
const nf_tensor *nf_artifact_find_tensor(const nf_artifact *a, const char *name); /* NULL if absent */
/* As find, with an error naming the file and the tensor when absent. */
nf_status nf_artifact_get_tensor(const nf_artifact *a, const char *name, const nf_tensor **out, nf_error *err);

/* Metadata in file order. */
size_t nf_artifact_n_meta(const nf_artifact *a);
const nf_meta *nf_artifact_meta(const nf_artifact *a, size_t i);
const nf_meta *nf_artifact_find_meta(const nf_artifact *a, const char *key); /* NULL if absent */

/* Typed lookups: fail with NF_ERR_FORMAT naming the file and the key when it is missing, or when
 * its type is not the one asked for (naming both types). */
nf_status nf_artifact_get_u32(const nf_artifact *a, const char *key, uint32_t *v, nf_error *err);
nf_status nf_artifact_get_i32(const nf_artifact *a, const char *key, int32_t *v, nf_error *err);
nf_status nf_artifact_get_u64(const nf_artifact *a, const char *key, uint64_t *v, nf_error *err);
nf_status nf_artifact_get_i64(const nf_artifact *a, const char *key, int64_t *v, nf_error *err);
nf_status nf_artifact_get_f32(const nf_artifact *a, const char *key, float *v, nf_error *err);
nf_status nf_artifact_get_f64(const nf_artifact *a, const char *key, double *v, nf_error *err);
nf_status nf_artifact_get_bool(const nf_artifact *a, const char *key, int *v, nf_error *err);
/* *s is NUL-terminated; *len (may be NULL) is its byte length (the value may itself hold NULs). */
nf_status nf_artifact_get_str(const nf_artifact *a, const char *key, const char **s, size_t *len, nf_error *err);
/* Any integer type (u32, i32, u64, i64) whose value fits in int64_t. */
nf_status nf_artifact_get_int(const nf_artifact *a, const char *key, int64_t *v, nf_error *err);
/* Arrays: *v points at [*n] elements owned by the artifact. */
nf_status nf_artifact_get_i32_array(const nf_artifact *a, const char *key, const int32_t **v, size_t *n,
                                    nf_error *err);
nf_status nf_artifact_get_u32_array(const nf_artifact *a, const char *key, const uint32_t **v, size_t *n,
                                    nf_error *err);
nf_status nf_artifact_get_i64_array(const nf_artifact *a, const char *key, const int64_t **v, size_t *n,
                                    nf_error *err);
nf_status nf_artifact_get_f32_array(const nf_artifact *a, const char *key, const float **v, size_t *n,
                                    nf_error *err);
/* (*strs)[i] is NUL-terminated; (*lens)[i] its length. lens may be NULL. */
nf_status nf_artifact_get_str_array(const nf_artifact *a, const char *key, const char *const **strs,
                                    const uint32_t **lens, size_t *n, nf_error *err);

/* Checks every tensor's checksum. *checked / *mismatched (may be NULL) count tensors; the error
 * names the first tensor whose payload does not match. */
nf_status nf_artifact_verify(const nf_artifact *a, size_t *checked, size_t *mismatched, nf_error *err);

/* ---- writer ------------------------------------------------------------------------------ */

typedef struct nf_artifact_writer nf_artifact_writer;

/* Creates "<path>.tmp-<pid>" (refusing to clobber an existing temporary file). Nothing appears
 * under `path` until nf_artifact_writer_finish succeeds. */
nf_status nf_artifact_writer_open(const char *path, nf_artifact_writer **out, nf_error *err);
/* Per-tensor checksums (default on): costs one FNV-1a pass over each payload while writing. */
void nf_artifact_writer_set_checksums(nf_artifact_writer *w, int on);
/* Payload alignment (default NF_ARTIFACT_ALIGN = 4096, which lets a loader register the mapping
 * for DMA); any power of two in [64, 4096] before the first tensor. Smaller values exist for
 * compact test and fuzz inputs. */
nf_status nf_artifact_writer_set_alignment(nf_artifact_writer *w, uint32_t align, nf_error *err);
const char *nf_artifact_writer_temp_path(const nf_artifact_writer *w);

/* Metadata; keys are unique, 1..NF_META_KEY_MAX printable ASCII bytes. */
nf_status nf_artifact_writer_add_u32(nf_artifact_writer *w, const char *key, uint32_t v, nf_error *err);
nf_status nf_artifact_writer_add_i32(nf_artifact_writer *w, const char *key, int32_t v, nf_error *err);
nf_status nf_artifact_writer_add_u64(nf_artifact_writer *w, const char *key, uint64_t v, nf_error *err);
nf_status nf_artifact_writer_add_i64(nf_artifact_writer *w, const char *key, int64_t v, nf_error *err);
nf_status nf_artifact_writer_add_f32(nf_artifact_writer *w, const char *key, float v, nf_error *err);
nf_status nf_artifact_writer_add_f64(nf_artifact_writer *w, const char *key, double v, nf_error *err);
nf_status nf_artifact_writer_add_bool(nf_artifact_writer *w, const char *key, int v, nf_error *err);
nf_status nf_artifact_writer_add_str(nf_artifact_writer *w, const char *key, const char *s, nf_error *err);
nf_status nf_artifact_writer_add_strn(nf_artifact_writer *w, const char *key, const char *s, size_t len,
                                      nf_error *err);
/* A numeric or bool array: elems holds [n] values of elem_type in native (little-endian) layout
 * (bool as uint8_t 0/1). */
nf_status nf_artifact_writer_add_array(nf_artifact_writer *w, const char *key, nf_meta_type elem_type,
                                       const void *elems, size_t n, nf_error *err);
/* A string array; lens may be NULL (then each string is NUL-terminated). */
nf_status nf_artifact_writer_add_str_array(nf_artifact_writer *w, const char *key, const char *const *strs,
                                           const uint32_t *lens, size_t n, nf_error *err);

/* Tensors, one at a time, in the order their payloads go to the file. The descriptor is checked
 * (nf_tensor_layout_of, unique name) before a byte is written.
 *   begin -> write (any number of chunks, summing to the payload size) -> end */
nf_status nf_artifact_writer_begin_tensor(nf_artifact_writer *w, const nf_tensor_desc *d, nf_error *err);
nf_status nf_artifact_writer_write(nf_artifact_writer *w, const void *buf, size_t n, nf_error *err);
nf_status nf_artifact_writer_end_tensor(nf_artifact_writer *w, nf_error *err);
/* The whole payload from one buffer of `bytes` (must equal the layout's payload size). */
nf_status nf_artifact_writer_add_tensor(nf_artifact_writer *w, const nf_tensor_desc *d, const void *payload,
                                        uint64_t bytes, nf_error *err);
/* The payload from a callback asked for consecutive chunks: fill(ctx, offset, buf, n) writes bytes
 * [offset, offset + n) of the payload into buf. The writer's chunk buffer is 4 MiB. */
typedef nf_status (*nf_payload_fill_fn)(void *ctx, uint64_t offset, void *buf, size_t n, nf_error *err);
nf_status nf_artifact_writer_add_tensor_fill(nf_artifact_writer *w, const nf_tensor_desc *d,
                                             nf_payload_fill_fn fill, void *ctx, nf_error *err);

/* Writes the index and header, fsyncs, validates the temporary file with the reader, renames it
 * over `path` and fsyncs the directory. Always frees w; on failure the temporary file is removed
 * and nothing is left under `path` (an existing file there is untouched). */
nf_status nf_artifact_writer_finish(nf_artifact_writer *w, nf_error *err);
/* Removes the temporary file and frees w (NULL is fine). */
void nf_artifact_writer_abort(nf_artifact_writer *w);

#endif

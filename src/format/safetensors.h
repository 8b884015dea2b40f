/* Reading safetensors files (Hugging Face's checkpoint format) and multi-file checkpoints.
 *
 * File layout: u64 little-endian N, then N bytes of JSON (the header), then the data section.
 * The header is an object: "__metadata__" (optional, string -> string) and one entry per tensor,
 *   "name": {"dtype": "BF16", "shape": [rows, cols], "data_offsets": [begin, end]}
 * with offsets relative to the start of the data section, shapes outermost first (row-major, as
 * PyTorch), and no padding between elements.
 *
 * nf_safetensors_open maps the file read-only and validates everything before returning: the
 * header length against the file, the JSON, every entry's dtype, shape and offsets, that
 * end - begin == product(shape) * dtype size, that names are unique and that no two tensors
 * overlap. After a successful open every tensor's `data` pointer may be read for `nbytes` bytes.
 * Pointers into the data section are NOT aligned in general (the format does not promise it);
 * read them with memcpy or byte loads.
 *
 * nf_st_set presents one namespace over a checkpoint folder: model.safetensors, or the shards
 * named by model.safetensors.index.json (weight_map: tensor name -> shard file). */
#ifndef NF_FORMAT_SAFETENSORS_H
#define NF_FORMAT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

typedef enum nf_st_dtype {
    NF_ST_BOOL = 0,
    NF_ST_U8,
    NF_ST_I8,
    NF_ST_F8_E4M3, /* float8_e4m3fn: NVFP4 block scales */
    NF_ST_F8_E5M2,
    NF_ST_F8_E8M0, /* MX block scales */
    NF_ST_I16,
    NF_ST_U16,
    NF_ST_F16,
    NF_ST_BF16,
    NF_ST_I32,
    NF_ST_U32,
    NF_ST_F32,
    NF_ST_I64,
    NF_ST_U64,
    NF_ST_F64,
    NF_ST_DTYPE_COUNT
} nf_st_dtype;

const char *nf_st_dtype_name(nf_st_dtype d); /* "BF16", as written in the header; "?" if invalid */
size_t nf_st_dtype_size(nf_st_dtype d);      /* bytes per element; 0 if invalid */

#define NF_ST_MAX_DIMS 8

typedef struct nf_st_tensor {
    const char *name;
    nf_st_dtype dtype;
    int n_dims;                        /* 0 for a scalar */
    uint64_t shape[NF_ST_MAX_DIMS];    /* [n_dims], outermost first; shape[n_dims-1] is the row */
    uint64_t n_elems;                  /* product of shape (1 for a scalar) */
    uint64_t nbytes;                   /* n_elems * dtype size */
    uint64_t file_offset;              /* absolute offset of the first byte in the file */
    const void *data;                  /* [nbytes] inside the mapping; unaligned; NULL if nbytes == 0 */
    int shard;                         /* index of the file within an nf_st_set (0 for one file) */
} nf_st_tensor;

typedef struct nf_safetensors nf_safetensors;

nf_status nf_safetensors_open(const char *path, nf_safetensors **out, nf_error *err);
/* The same checks over `size` bytes at `data` (a file already in memory; the fuzz targets use it).
 * Nothing is copied: the bytes must stay valid and unchanged until nf_safetensors_close. `name`
 * (NULL: "(memory)") stands for the path in messages and in nf_safetensors_path. */
nf_status nf_safetensors_open_memory(const void *data, size_t size, const char *name, nf_safetensors **out,
                                     nf_error *err);
void nf_safetensors_close(nf_safetensors *st);

const char *nf_safetensors_path(const nf_safetensors *st);
size_t nf_safetensors_count(const nf_safetensors *st);
/* Tensors in data-offset order, i < count. */
const nf_st_tensor *nf_safetensors_at(const nf_safetensors *st, size_t i);
/* NULL when absent. */
const nf_st_tensor *nf_safetensors_find(const nf_safetensors *st, const char *name);
/* A "__metadata__" value, or NULL when the header has no such key. */
const char *nf_safetensors_metadata(const nf_safetensors *st, const char *key);

/* ---- a checkpoint of one or more files ---- */

typedef struct nf_st_set nf_st_set;

/* `path` is a folder holding model.safetensors (preferred, as transformers does) or
 * model.safetensors.index.json, or the path of a .safetensors file, or of an index json. An index
 * must map every tensor to a plain file name in the index's folder; each shard is opened and
 * validated once, and a mapped tensor missing from its shard is an error naming both. Tensors a
 * shard holds but the index does not map are left out with a warning. */
nf_status nf_st_set_open(const char *path, nf_st_set **out, nf_error *err);
void nf_st_set_close(nf_st_set *set);

size_t nf_st_set_count(const nf_st_set *set);
/* Tensors sorted by name, i < count. */
const nf_st_tensor *nf_st_set_at(const nf_st_set *set, size_t i);
const nf_st_tensor *nf_st_set_find(const nf_st_set *set, const char *name);
/* Like find, but a missing tensor is an error naming it and the checkpoint. */
nf_status nf_st_set_get(const nf_st_set *set, const char *name, const nf_st_tensor **out, nf_error *err);

size_t nf_st_set_shard_count(const nf_st_set *set);
const nf_safetensors *nf_st_set_shard(const nf_st_set *set, size_t i);

#endif

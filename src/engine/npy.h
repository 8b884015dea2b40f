/* numpy's .npy format (version 1.0/2.0, little-endian, C order): enough to exchange token ids and
 * logits with outside tools. The header is "\x93NUMPY", version, header length, then a Python
 * dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (T, V), } padded to 64 bytes. */
#ifndef NF_ENGINE_NPY_H
#define NF_ENGINE_NPY_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

enum { NF_NPY_MAX_DIMS = 4 };

typedef struct nf_npy {
    char descr[8];                    /* "<f4", "<f8", "<i4", "<i8", "<u4", "|u1", ... */
    uint32_t ndim;
    uint64_t shape[NF_NPY_MAX_DIMS];
    uint64_t count;                   /* product of the shape */
    void *data;                       /* [count] elements of descr, malloc'd */
} nf_npy;

/* Writes a float32 array of the given shape. */
nf_status nf_npy_write_f32(const char *path, const float *data, const uint64_t *shape, uint32_t ndim, nf_error *err);
/* Reads any little-endian numeric array; refuses Fortran order, big-endian and object arrays. */
nf_status nf_npy_read(const char *path, nf_npy *out, nf_error *err);
void nf_npy_free(nf_npy *a);
/* Element i as a double / as an int64 (integers and floats; a float must be integral). */
double nf_npy_get_f64(const nf_npy *a, uint64_t i);

#endif

/* The tensor object: what an artifact says about one tensor, independent of where its bytes are.
 *
 * A tensor is a codec, a shape of 1 to 4 dims (outermost first; the innermost dim is the row
 * length), and for nvfp4 the number of separately quantized source matrices stacked into it
 * (`divisors`), policy flags and the W4A4 input divisor(s). Its payload is a function of
 * (codec, shape, divisors) alone: nf_tensor_layout computes it, and both the writer and the
 * reader go through it, so they cannot disagree. docs/artifact.md is the normative text. */
#ifndef NF_FORMAT_TENSOR_H
#define NF_FORMAT_TENSOR_H

#include <stdint.h>

#include "base/error.h"
#include "codec/codec.h"

#define NF_TENSOR_MAX_DIMS 4
#define NF_TENSOR_MAX_PLANES 3
#define NF_TENSOR_NAME_MAX 1024 /* bytes, printable ASCII */

enum {
    NF_TENSOR_ALLOW_A4 = 1u << 0,     /* this weight's input may be quantized to four bits (nvfp4 only) */
    NF_TENSOR_HAS_CHECKSUM = 1u << 1, /* `checksum` holds FNV-1a 64 of the payload (set by the writer) */
    NF_TENSOR_KNOWN_FLAGS = NF_TENSOR_ALLOW_A4 | NF_TENSOR_HAS_CHECKSUM,
};

/* One plane of a payload: [offset, offset + bytes) from the payload start. Non-planar codecs have
 * one plane (the blocks); nvfp4 has three: data, swizzled scales, divisor words. */
typedef struct nf_tensor_plane {
    uint64_t offset;
    uint64_t bytes;
} nf_tensor_plane;

enum { NF_PLANE_DATA = 0, NF_PLANE_SCALES = 1, NF_PLANE_DIVISORS = 2 };

/* What a caller states about a tensor (writer input; also the reader's parsed entry). */
typedef struct nf_tensor_desc {
    const char *name;         /* 1..NF_TENSOR_NAME_MAX printable ASCII bytes (0x21..0x7e) */
    nf_codec_id codec;
    uint32_t n_dims;          /* 1..4 */
    uint64_t dims[NF_TENSOR_MAX_DIMS]; /* [n_dims], each >= 1; a bank is [experts][rows][cols] */
    uint32_t divisors;        /* D: separately quantized source matrices; 0 means 1; > 1 only nvfp4 */
    uint32_t flags;           /* NF_TENSOR_ALLOW_A4 (writers leave HAS_CHECKSUM to the writer) */
    uint32_t n_input_divisors;      /* nvfp4 only: 0, 1 (one for the whole tensor) or dims[0] of a
                                     * 3-D bank (one per expert) */
    const float *input_divisors;    /* [n_input_divisors], each finite and > 0 */
} nf_tensor_desc;

/* The payload a descriptor implies. */
typedef struct nf_tensor_layout {
    uint64_t rows, cols;      /* rows = product of the leading dims, cols = innermost dim */
    uint64_t payload_bytes;
    uint32_t n_planes;
    nf_tensor_plane planes[NF_TENSOR_MAX_PLANES];
} nf_tensor_layout;

/* A tensor as the reader returns it: its descriptor, its layout and where its bytes are. */
typedef struct nf_tensor {
    nf_tensor_desc desc;      /* name: NUL-terminated inside the mapping; input_divisors: an aligned
                               * copy owned by the artifact */
    const nf_codec *codec;
    nf_tensor_layout layout;
    uint64_t offset;          /* absolute file offset of the payload (a multiple of the alignment) */
    uint64_t checksum;        /* FNV-1a 64 of the payload, when desc.flags & NF_TENSOR_HAS_CHECKSUM */
    const uint8_t *data;      /* [layout.payload_bytes], inside the mapping */
} nf_tensor;

/* Checks every rule on a descriptor except the name (the caller names the tensor in the error
 * with nf_error_prefix) and computes its layout: dims, codec known and linked, divisors, flags,
 * input divisors, block multiple, nvfp4 tile rules, overflow. */
nf_status nf_tensor_layout_of(const nf_tensor_desc *d, nf_tensor_layout *out, nf_error *err);

/* Checks a tensor name: non-empty, at most NF_TENSOR_NAME_MAX bytes, printable ASCII. */
nf_status nf_tensor_check_name(const char *name, uint64_t len, nf_error *err);

/* Compares the payload's FNV-1a 64 with the stored checksum. *checked = 0 (and NF_OK) when the
 * tensor carries none. The error names the tensor and both hashes. */
nf_status nf_tensor_verify(const nf_tensor *t, int *checked, nf_error *err);

/* "[128, 768, 2048]" into buf (always NUL-terminated). */
const char *nf_tensor_shape_str(const nf_tensor_desc *d, char *buf, size_t cap);

#endif

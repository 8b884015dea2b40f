/* The tensor object's rules (docs/artifact.md, "Tensor entry"): the one place that decides what a
 * descriptor's payload is, used by the writer before it writes and by the reader before it trusts. */
#include "format/tensor.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/fnv.h"
#include "codec/nvfp4.h"

nf_status nf_tensor_check_name(const char *name, uint64_t len, nf_error *err)
{
    if (len == 0) return nf_error_set(err, NF_ERR_FORMAT, "empty tensor name");
    if (len > NF_TENSOR_NAME_MAX)
        return nf_error_set(err, NF_ERR_FORMAT, "tensor name of %" PRIu64 " bytes (at most %d)", len,
                            NF_TENSOR_NAME_MAX);
    for (uint64_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)name[i];
        if (ch < 0x21 || ch > 0x7e)
            return nf_error_set(err, NF_ERR_FORMAT,
                                "tensor name byte %" PRIu64 " is 0x%02x (names are printable ASCII 0x21-0x7e)", i, ch);
    }
    return NF_OK;
}

static nf_status check_dims(const nf_tensor_desc *d, uint64_t *rows, nf_error *err)
{
    if (d->n_dims < 1 || d->n_dims > NF_TENSOR_MAX_DIMS)
        return nf_error_set(err, NF_ERR_FORMAT, "%u dims (expected 1 to %d)", d->n_dims, NF_TENSOR_MAX_DIMS);
    uint64_t r = 1;
    for (uint32_t i = 0; i < d->n_dims; i++) {
        if (d->dims[i] == 0) return nf_error_set(err, NF_ERR_FORMAT, "dim %u is 0 (every dim must be >= 1)", i);
        if (i + 1 == d->n_dims) break;
        if (r > UINT64_MAX / d->dims[i])
            return nf_error_set(err, NF_ERR_FORMAT, "the product of the leading dims overflows 64 bits");
        r *= d->dims[i];
    }
    *rows = r;
    return NF_OK;
}

/* Policies and W4A4 input divisors: only nvfp4 may carry them, allow_a4 needs them. */
static nf_status check_policy(const nf_tensor_desc *d, const nf_codec *c, nf_error *err)
{
    int nvfp4 = c->id == NF_CODEC_NVFP4;
    if (d->flags & ~(uint32_t)NF_TENSOR_KNOWN_FLAGS)
        return nf_error_set(err, NF_ERR_FORMAT, "unknown flag bits 0x%x", d->flags & ~(uint32_t)NF_TENSOR_KNOWN_FLAGS);
    if ((d->flags & NF_TENSOR_ALLOW_A4) && !nvfp4)
        return nf_error_set(err, NF_ERR_FORMAT, "allow_a4 on a %s tensor (only nvfp4 weights may have it)", c->name);
    if (d->n_input_divisors && !nvfp4)
        return nf_error_set(err, NF_ERR_FORMAT, "%u input divisors on a %s tensor (only nvfp4 may have them)",
                            d->n_input_divisors, c->name);
    if ((d->flags & NF_TENSOR_ALLOW_A4) && d->n_input_divisors == 0)
        return nf_error_set(err, NF_ERR_FORMAT, "allow_a4 without an input divisor (W4A4 needs one)");
    if (d->n_input_divisors > 1 && !(d->n_dims == 3 && d->n_input_divisors == d->dims[0]))
        return nf_error_set(err, NF_ERR_FORMAT,
                            "%u input divisors (expected 0, 1, or one per expert: dims[0] of a 3-D bank)",
                            d->n_input_divisors);
    for (uint32_t i = 0; i < d->n_input_divisors; i++) {
        float v;
        memcpy(&v, &d->input_divisors[i], sizeof v); /* may point into a mapped file */
        if (!isfinite(v) || !(v > 0.0f))
            return nf_error_set(err, NF_ERR_FORMAT, "input divisor %u is %g (must be finite and > 0)", i, (double)v);
    }
    return NF_OK;
}

nf_status nf_tensor_layout_of(const nf_tensor_desc *d, nf_tensor_layout *out, nf_error *err)
{
    memset(out, 0, sizeof *out);
    const nf_codec *c = nf_codec_get(d->codec);
    if (!c) return nf_error_set(err, NF_ERR_FORMAT, "unknown codec id %d", (int)d->codec);
    uint64_t rows = 0;
    nf_status s = check_dims(d, &rows, err);
    if (s) return s;
    uint32_t D = d->divisors ? d->divisors : 1;
    s = check_policy(d, c, err);
    if (s) return s;
    out->rows = rows;
    out->cols = d->dims[d->n_dims - 1];
    if (c->id != NF_CODEC_NVFP4) {
        s = nf_codec_payload_bytes(c, rows, out->cols, D, &out->payload_bytes, err);
        if (s) return s;
        out->n_planes = 1;
        out->planes[NF_PLANE_DATA] = (nf_tensor_plane){0, out->payload_bytes};
        return NF_OK;
    }
    nf_nvfp4_layout l;
    s = nf_nvfp4_layout_of(rows, out->cols, D, &l, err);
    if (s) return s;
    out->payload_bytes = l.payload_bytes;
    out->n_planes = 3;
    out->planes[NF_PLANE_DATA] = (nf_tensor_plane){0, l.data_bytes};
    out->planes[NF_PLANE_SCALES] = (nf_tensor_plane){l.scale_offset, l.scale_bytes};
    out->planes[NF_PLANE_DIVISORS] = (nf_tensor_plane){l.divisor_offset, 4ull * D};
    return NF_OK;
}

nf_status nf_tensor_verify(const nf_tensor *t, int *checked, nf_error *err)
{
    *checked = 0;
    if (!(t->desc.flags & NF_TENSOR_HAS_CHECKSUM)) return NF_OK;
    *checked = 1;
    uint64_t h = NF_FNV1A64_INIT;
    /* In pieces: nf_fnv1a64_update takes a size_t, and a payload can exceed it on 32-bit hosts. */
    for (uint64_t off = 0; off < t->layout.payload_bytes;) {
        uint64_t n = t->layout.payload_bytes - off;
        if (n > (1u << 30)) n = 1u << 30;
        h = nf_fnv1a64_update(h, t->data + off, (size_t)n);
        off += n;
    }
    if (h != t->checksum)
        return nf_error_set(err, NF_ERR_FORMAT,
                            "tensor '%s': payload checksum 0x%016" PRIx64 " does not match the stored 0x%016" PRIx64
                            " (payload at offset %" PRIu64 ", %" PRIu64 " bytes)",
                            t->desc.name, h, t->checksum, t->offset, t->layout.payload_bytes);
    return NF_OK;
}

const char *nf_tensor_shape_str(const nf_tensor_desc *d, char *buf, size_t cap)
{
    if (!cap) return buf;
    size_t n = 0;
    buf[0] = 0;
    n += (size_t)snprintf(buf, cap, "[");
    for (uint32_t i = 0; i < d->n_dims && i < NF_TENSOR_MAX_DIMS && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%" PRIu64, i ? ", " : "", d->dims[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
    return buf;
}

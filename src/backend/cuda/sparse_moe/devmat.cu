// A bank matrix on the device in the kernels' layout (dev_codecs.cuh): sizing and upload, shared by
// the sparse-MoE operator and the dense layers of the CUDA engine (a dense matrix is one expert).
#include <stdlib.h>
#include <string.h>

#include "internal.cuh"

extern "C" {
#include "codec/codec.h"
#include "codec/nvfp4.h"
}

namespace nf {

// Field layout of each GGUF block (offset, size), largest field first: the order of the planes in
// the kernels' row-planar layout (dev_codecs.cuh). Must match the Row constructors there.
struct Field {
    uint32_t off, size;
};
struct PlanarLayout {
    int n;
    Field f[4];
};

static int planar_layout(int codec, PlanarLayout *pl)
{
    switch (codec) {
    case NF_CODEC_Q4_K: *pl = {3, {{16, 128}, {4, 12}, {0, 4}}}; return 1;
    case NF_CODEC_Q5_K: *pl = {4, {{48, 128}, {16, 32}, {4, 12}, {0, 4}}}; return 1;
    case NF_CODEC_Q6_K: *pl = {4, {{0, 128}, {128, 64}, {192, 16}, {208, 2}}}; return 1;
    case NF_CODEC_Q8_0: *pl = {2, {{2, 32}, {0, 2}}}; return 1;
    // the import-only codecs (dev_codecs_import.cuh); q2_k's d and dmin stay one 4-byte field, as do
    // iq4_xs's d, scales_h and scales_l (its 8-byte head: one load for every scale of a block)
    case NF_CODEC_Q2_K: *pl = {3, {{16, 64}, {0, 16}, {80, 4}}}; return 1;
    case NF_CODEC_Q3_K: *pl = {4, {{32, 64}, {0, 32}, {96, 12}, {108, 2}}}; return 1;
    case NF_CODEC_IQ4_XS: *pl = {2, {{8, 128}, {0, 8}}}; return 1;
    case NF_CODEC_IQ4_NL: *pl = {2, {{2, 16}, {0, 2}}}; return 1;
    case NF_CODEC_BF16: *pl = {1, {{0, 2}}}; return 1;
    case NF_CODEC_F32: *pl = {1, {{0, 4}}}; return 1;
    default: return 0;
    }
}

// A row codec's descriptor fields (row stride padded to 16 bytes, blocks per row, plane offsets).
static nf_status planar_desc(const nf_moe_matrix *mm, const char *name, DevMat *d, PlanarLayout *pl, nf_error *err)
{
    const nf_codec *c = nf_codec_get((nf_codec_id)mm->codec);
    if (!c || !planar_layout(mm->codec, pl))
        return nf_error_set(err, NF_ERR_INTERNAL, "%s: no device layout for %s", name, c ? c->name : "this codec");
    const size_t nb = mm->cols / c->block_elems, row = nb * c->block_bytes;
    d->row_stride = (row + 15) & ~(size_t)15;
    d->nb = (uint32_t)nb;
    for (int i = 0, off = 0; i < pl->n; off += (int)(nb * pl->f[i].size), i++) d->plane[i] = (uint32_t)off;
    return NF_OK;
}

// Expert e's rows, GGUF blocks gathered field by field into the row-planar layout at stage
// (rows * row_stride bytes; the padding is left as it is).
static void repack_expert(const nf_moe_matrix *mm, const PlanarLayout &pl, const DevMat &d, uint32_t e, uint8_t *stage)
{
    const nf_codec *c = nf_codec_get((nf_codec_id)mm->codec);
    const size_t nb = d.nb, row = nb * c->block_bytes;
    const uint8_t *src = (const uint8_t *)mm->data + (size_t)e * mm->rows * row;
    for (uint32_t r = 0; r < mm->rows; r++)
        for (int f = 0; f < pl.n; f++)
            for (size_t b = 0; b < nb; b++)
                memcpy(stage + r * d.row_stride + d.plane[f] + b * pl.f[f].size,
                       src + r * row + b * c->block_bytes + pl.f[f].off, pl.f[f].size);
}

// Device bytes of one matrix in the kernels' layout; refuses an nvfp4 plane set whose layout rules
// (divisor count, 128-row shares) fail.
nf_status devmat_bytes(const nf_moe_matrix *mm, const char *name, size_t *bytes, nf_error *err)
{
    if (mm->codec == NF_CODEC_NVFP4) {
        nf_nvfp4_layout nl;
        if (nf_nvfp4_layout_of((uint64_t)mm->experts * mm->rows, mm->cols, mm->divisors, &nl, err) != NF_OK) {
            nf_error_prefix(err, "%s", name);
            return err ? (err->code = NF_ERR_REFUSED) : NF_ERR_REFUSED;
        }
        *bytes = nl.payload_bytes;
        return NF_OK;
    }
    const nf_codec *c = nf_codec_get((nf_codec_id)mm->codec);
    size_t row = nf_codec_row_bytes(c, mm->cols);
    *bytes = (size_t)mm->experts * mm->rows * ((row + 15) & ~(size_t)15);
    return NF_OK;
}

// Copies one matrix to the device at `dst`, repacking row codecs to the row-planar layout one
// expert at a time (host staging stays one expert large). Fills the descriptor.
nf_status devmat_upload(const nf_moe_matrix *mm, uint8_t *dst, DevMat *d, const char *name, nf_error *err)
{
    memset(d, 0, sizeof *d);
    d->data = dst;
    d->rows = mm->rows;
    d->cols = mm->cols;
    if (mm->codec == NF_CODEC_NVFP4) {
        nf_nvfp4_planes p;
        nf_nvfp4_layout l;
        const uint64_t R = (uint64_t)mm->experts * mm->rows;
        if (R >= 0x80000000ull) // div_word's multiply-shift holds below 2^31 stacked rows
            return nf_error_set(err, NF_ERR_REFUSED, "%s: %llu stacked nvfp4 rows (experts x rows), the limit is 2^31 - 1",
                                name, (unsigned long long)R);
        nf_status s = nf_nvfp4_layout_of(R, mm->cols, mm->divisors, &l, err);
        if (s == NF_OK) s = nf_nvfp4_view(mm->data, l.payload_bytes, R, mm->cols, mm->divisors, &p, err);
        if (s == NF_OK) s = nf_nvfp4_validate(&p, err);
        if (s) {
            nf_error_prefix(err, "%s", name);
            if (err) err->code = NF_ERR_REFUSED;
            return NF_ERR_REFUSED;
        }
        d->row_stride = mm->cols / 2;
        d->scales = dst + p.layout.scale_offset;
        d->divisors = (const float *)(dst + p.layout.divisor_offset);
        d->rows_per_div = nf_fastdiv_make((uint32_t)(R / mm->divisors));
        d->kt = (mm->cols / 16 + 3) / 4;
        if (cudaMemcpy(dst, mm->data, p.layout.payload_bytes, cudaMemcpyHostToDevice) != cudaSuccess)
            return nf_error_set(err, NF_ERR_CUDA, "%s: upload failed", name);
        return NF_OK;
    }
    PlanarLayout pl = {};
    nf_status st = planar_desc(mm, name, d, &pl, err);
    if (st) return st;
    const size_t stride = d->row_stride;
    uint8_t *stage = (uint8_t *)calloc(mm->rows, stride);
    if (!stage) return nf_error_set(err, NF_ERR_NOMEM, "%s: no host memory for staging", name);
    for (uint32_t e = 0; e < mm->experts; e++) {
        repack_expert(mm, pl, *d, e, stage);
        if (cudaMemcpy(dst + (size_t)e * mm->rows * stride, stage, mm->rows * stride, cudaMemcpyHostToDevice) !=
            cudaSuccess) {
            free(stage);
            return nf_error_set(err, NF_ERR_CUDA, "%s: upload failed", name);
        }
    }
    free(stage);
    return NF_OK;
}

nf_status devmat_host(const nf_moe_matrix *mm, uint8_t *dst, DevMat *d, nf_error *err)
{
    memset(d, 0, sizeof *d);
    d->data = dst;
    d->rows = mm->rows;
    d->cols = mm->cols;
    PlanarLayout pl = {};
    nf_status st = planar_desc(mm, "matrix", d, &pl, err);
    if (st) return st;
    for (uint32_t e = 0; e < mm->experts; e++) repack_expert(mm, pl, *d, e, dst + (size_t)e * mm->rows * d->row_stride);
    return NF_OK;
}

} // namespace nf

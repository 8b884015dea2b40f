/* NVFP4: the plane layout, its validation, the compressed-tensors quantizer, the scalar decoder and
 * dot product (the oracle the AVX2 kernel in nvfp4_avx2.c is tested against). docs/nvfp4.md. */
#include "codec/nvfp4.h"

#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codec/codec.h"

const nf_codec nf_codec_nvfp4 = {
    .id = NF_CODEC_NVFP4,
    .name = "nvfp4",
    .ggml_type = 40,
    .block_elems = 16,
    .block_bytes = 8,
    .flags = NF_CODEC_PLANAR,
};

enum { TILE_ROWS = 128, TILE_BYTES = 512, SCALE_ALIGN = 256 };

/* ---- element codecs ------------------------------------------------------------------------- */

/* Indexed by the whole nibble: a table rather than a sign branch, which random data mispredicts.
 * 0x8 is -0.0, as compressed-tensors' unpack gives. */
static const float e2m1_val[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

float nf_e2m1_to_f32(uint8_t nibble) { return e2m1_val[nibble & 15]; }

/* compressed-tensors' cast_to_fp4 thresholds on |q| after clamping to [-6, 6]: ties go to the even
 * index (0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4). */
static uint8_t e2m1_index(float a)
{
    if (a <= 0.25f) return 0;
    if (a < 0.75f) return 1;
    if (a <= 1.25f) return 2;
    if (a < 1.75f) return 3;
    if (a <= 2.5f) return 4;
    if (a < 3.5f) return 5;
    if (a <= 5.0f) return 6;
    return 7;
}

uint8_t nf_f32_to_e2m1(float x)
{
    if (isnan(x)) return 0; /* torch's int8 cast of NaN gives 0; inputs are finite anyway */
    float q = x < -6.0f ? -6.0f : x > 6.0f ? 6.0f : x;
    /* torch.sign(q) * rounded |q|: the sign survives even when the magnitude rounds to zero, but
     * sign(-0.0) is 0, so only q < 0 sets the bit. */
    return (uint8_t)((q < 0.0f ? 8 : 0) | e2m1_index(fabsf(q)));
}

float nf_e4m3_to_f32(uint8_t b)
{
    if ((b & 0x7f) == 0x7f) return (b & 0x80) ? -NAN : NAN;
    /* Exponent and mantissa bits placed in an fp32 (e in bits 23-26, m in 20-22) and multiplied by
     * 2^120 rebias 7 -> 127 exactly; e = 0 is an fp32 subnormal m * 2^-129, i.e. m * 2^-9 after. */
    uint32_t u = (uint32_t)(b & 0x80) << 24 | (uint32_t)(b & 0x7f) << 20;
    float f;
    memcpy(&f, &u, 4);
    return f * 0x1p120f;
}

uint8_t nf_f32_to_e4m3(float x)
{
    if (isnan(x)) return 0x7f;
    uint8_t sign = signbit(x) ? 0x80 : 0;
    float a = fabsf(x);
    if (a >= 448.0f) return sign | 0x7e;
    unsigned code;
    if (a < 0x1p-6f) {
        code = (unsigned)nearbyintf(a * 512.0f); /* subnormal steps of 2^-9; 8 carries into e = 1 */
    } else {
        int e;
        frexpf(a, &e); /* a = f * 2^e, f in [0.5, 1) */
        float mant = (ldexpf(a, 1 - e) - 1.0f) * 8.0f; /* exact: in [0, 8) */
        code = (unsigned)((e - 1 + 7) << 3) + (unsigned)nearbyintf(mant); /* a carry bumps the exponent */
    }
    if (code > 0x7e) code = 0x7e; /* (448, 464) rounds to 448 anyway; never the NaN code */
    return (uint8_t)(sign | code);
}

/* ---- layout ---------------------------------------------------------------------------------- */

static uint64_t ceil_div(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

uint64_t nf_nvfp4_scale_index(uint64_t m, uint64_t k, uint64_t cols)
{
    uint64_t kt = ceil_div(cols / 16, 4);
    return (m / 128) * kt * 512 + (k / 4) * 512 + (m % 32) * 16 + ((m % 128) / 32) * 4 + (k % 4);
}

static nf_status layout_rules(uint64_t rows, uint64_t cols, uint32_t d, nf_error *err)
{
    if (cols % 16)
        return nf_error_set(err, NF_ERR_FORMAT, "nvfp4: cols = %" PRIu64 " is not a multiple of the 16-element block",
                            cols);
    if (d < 1) return nf_error_set(err, NF_ERR_FORMAT, "nvfp4: divisors = 0, need at least 1");
    if (rows % d)
        return nf_error_set(err, NF_ERR_FORMAT, "nvfp4: divisors = %u does not divide rows = %" PRIu64, d, rows);
    if (d > 1 && (rows / d) % TILE_ROWS)
        return nf_error_set(err, NF_ERR_FORMAT,
                            "nvfp4: each of %u divisors covers %" PRIu64 " rows, not a whole number of 128-row "
                            "scale tiles (rows = %" PRIu64 ")",
                            d, rows / d, rows);
    return NF_OK;
}

nf_status nf_nvfp4_layout_of(uint64_t rows, uint64_t cols, uint32_t divisors, nf_nvfp4_layout *out, nf_error *err)
{
    nf_status s = layout_rules(rows, cols, divisors, err);
    if (s) return s;
    uint64_t mt = ceil_div(rows, TILE_ROWS), kt = ceil_div(cols / 16, 4);
    /* Every term below is bounded by the one checked before it. */
    if ((cols && rows > UINT64_MAX / 4 / (cols / 2 + 1)) || (kt && mt > UINT64_MAX / 4 / TILE_BYTES / kt))
        return nf_error_set(err, NF_ERR_FORMAT, "nvfp4: %" PRIu64 " x %" PRIu64 " overflows the payload size", rows,
                            cols);
    nf_nvfp4_layout l = {.rows = rows, .cols = cols, .divisors = divisors};
    l.data_bytes = rows * (cols / 2);
    l.scale_offset = ceil_div(l.data_bytes, SCALE_ALIGN) * SCALE_ALIGN;
    l.scale_bytes = mt * kt * TILE_BYTES;
    l.divisor_offset = l.scale_offset + l.scale_bytes;
    l.payload_bytes = l.divisor_offset + 4ull * divisors;
    *out = l;
    return NF_OK;
}

nf_status nf_nvfp4_view(const void *payload, uint64_t payload_bytes, uint64_t rows, uint64_t cols,
                        uint32_t divisors, nf_nvfp4_planes *out, nf_error *err)
{
    nf_nvfp4_layout l;
    nf_status s = nf_nvfp4_layout_of(rows, cols, divisors, &l, err);
    if (s) return s;
    if (payload_bytes != l.payload_bytes)
        return nf_error_set(err, NF_ERR_FORMAT,
                            "nvfp4: payload is %" PRIu64 " bytes, a %" PRIu64 " x %" PRIu64 " plane set with %u "
                            "divisors needs %" PRIu64,
                            payload_bytes, rows, cols, divisors, l.payload_bytes);
    if (!payload && payload_bytes) return nf_error_set(err, NF_ERR_INVALID_ARG, "nvfp4: payload pointer is NULL");
    const uint8_t *b = payload;
    out->layout = l;
    out->data = b;
    out->scales = b + l.scale_offset;
    out->divisors = (const float *)(const void *)(b + l.divisor_offset);
    return NF_OK;
}

static float divisor_word(const nf_nvfp4_planes *p, uint32_t i)
{
    float v;
    memcpy(&v, (const uint8_t *)p->divisors + 4ull * i, 4);
    return v;
}

float nf_nvfp4_row_divisor(const nf_nvfp4_planes *p, uint64_t r)
{
    return divisor_word(p, (uint32_t)(r / (p->layout.rows / p->layout.divisors)));
}

/* ---- validation ------------------------------------------------------------------------------ */

static nf_status validate_layout(const nf_nvfp4_planes *p, nf_error *err)
{
    const nf_nvfp4_layout *g = &p->layout;
    nf_nvfp4_layout l;
    nf_status s = nf_nvfp4_layout_of(g->rows, g->cols, g->divisors, &l, err);
    if (s) return s;
    if (l.data_bytes != g->data_bytes || l.scale_offset != g->scale_offset || l.scale_bytes != g->scale_bytes ||
        l.divisor_offset != g->divisor_offset || l.payload_bytes != g->payload_bytes)
        return nf_error_set(err, NF_ERR_FORMAT,
                            "nvfp4: layout fields (scale at %" PRIu64 ", %" PRIu64 " bytes, divisors at %" PRIu64
                            ") are not those of %" PRIu64 " x %" PRIu64 " with %u divisors (%" PRIu64 ", %" PRIu64
                            ", %" PRIu64 ")",
                            g->scale_offset, g->scale_bytes, g->divisor_offset, g->rows, g->cols, g->divisors,
                            l.scale_offset, l.scale_bytes, l.divisor_offset);
    if ((!p->data && l.data_bytes) || (!p->scales && l.scale_bytes) || !p->divisors)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "nvfp4: a plane pointer is NULL");
    return NF_OK;
}

static nf_status validate_divisors(const nf_nvfp4_planes *p, nf_error *err)
{
    for (uint32_t i = 0; i < p->layout.divisors; i++) {
        float v = divisor_word(p, i);
        if (!isfinite(v) || !(v > 0.0f))
            return nf_error_set(err, NF_ERR_FORMAT,
                                "nvfp4: divisor word %u of %u is %g; every divisor must be finite and > 0", i,
                                p->layout.divisors, (double)v);
    }
    return NF_OK;
}

static nf_status validate_scales(const nf_nvfp4_planes *p, nf_error *err)
{
    uint64_t rows = p->layout.rows, kcols = p->layout.cols / 16;
    for (uint64_t m = 0; m < rows; m++)
        for (uint64_t k = 0; k < kcols; k++) {
            uint8_t b = p->scales[nf_nvfp4_scale_index(m, k, p->layout.cols)];
            if ((b & 0x7f) == 0x7f)
                return nf_error_set(err, NF_ERR_FORMAT,
                                    "nvfp4: scale byte of row %" PRIu64 ", scale column %" PRIu64
                                    " is 0x%02x, an e4m3 NaN; no scale may be NaN",
                                    m, k, b);
        }
    return NF_OK;
}

nf_status nf_nvfp4_validate(const nf_nvfp4_planes *p, nf_error *err)
{
    nf_status s = validate_layout(p, err);
    if (!s) s = validate_divisors(p, err);
    if (!s) s = validate_scales(p, err);
    return s;
}

/* ---- quantizer ------------------------------------------------------------------------------- */

float nf_nvfp4_global_from_amax(float amax)
{
    /* generate_gparam: clamp(amax, min=tiny) (NaN passes through), 448*6 / amax in fp32, then
     * nan_to_num(nan=1, posinf=1, neginf=1). */
    float a = amax < FLT_MIN ? FLT_MIN : amax;
    float g = 2688.0f / a;
    return isfinite(g) ? g : 1.0f;
}

uint8_t nf_nvfp4_block_scale(float amax_block, float global)
{
    float s = amax_block / 6.0f; /* max_val_pos / (bit_range / 2), bit_range = 6 - (-6) */
    s = global * s;
    uint8_t b = nf_f32_to_e4m3(s); /* clamp(s, -448, 448).to(float8_e4m3fn) */
    return (b & 0x7f) == 0 ? 0x20 : b; /* scales == 0 -> eps 0.125 */
}

static float block_amax(const float *x)
{
    float a = 0.0f; /* calculate_qparams clamps min <= 0 <= max, so an all-zero block has amax 0 */
    for (int i = 0; i < 16; i++) a = fmaxf(a, fabsf(x[i]));
    return a;
}

/* One block of 16: returns the scale byte, writes 8 data bytes. */
static uint8_t quantize_block(const float *x, float global, uint8_t *out)
{
    uint8_t sb = nf_nvfp4_block_scale(block_amax(x), global);
    float eff = nf_e4m3_to_f32(sb) / global; /* scale / global_scale, fp32 */
    for (int i = 0; i < 8; i++)
        out[i] = (uint8_t)(nf_f32_to_e2m1(x[2 * i] / eff) | nf_f32_to_e2m1(x[2 * i + 1] / eff) << 4);
    return sb;
}

void nf_nvfp4_quantize_rows(const float *w, uint64_t row0, uint64_t nrows, float global, const nf_nvfp4_layout *l,
                            uint8_t *payload)
{
    uint64_t cols = l->cols, half = cols / 2;
    uint8_t *scales = payload + l->scale_offset;
    for (uint64_t i = 0; i < nrows; i++) {
        uint64_t r = row0 + i;
        for (uint64_t k = 0; k < cols / 16; k++)
            scales[nf_nvfp4_scale_index(r, k, cols)] =
                quantize_block(w + i * cols + k * 16, global, payload + r * half + k * 8);
    }
}

void nf_nvfp4_quantize(const float *w, const nf_nvfp4_layout *l, uint8_t *payload)
{
    memset(payload + l->data_bytes, 0, l->divisor_offset - l->data_bytes); /* alignment gap + scale padding */
    uint64_t share = l->divisors ? l->rows / l->divisors : 0;
    for (uint32_t d = 0; d < l->divisors; d++) {
        const float *src = w + d * share * l->cols;
        float amax = 0.0f;
        for (uint64_t i = 0; i < share * l->cols; i++) amax = fmaxf(amax, fabsf(src[i]));
        float g = nf_nvfp4_global_from_amax(amax);
        nf_nvfp4_quantize_rows(src, d * share, share, g, l, payload);
        memcpy(payload + l->divisor_offset + 4ull * d, &g, 4);
    }
}

/* ---- decoder and dot product ----------------------------------------------------------------- */

void nf_nvfp4_dequantize_row(const nf_nvfp4_planes *p, uint64_t r, float *y)
{
    uint64_t cols = p->layout.cols;
    const uint8_t *d = p->data + r * (cols / 2);
    float g = nf_nvfp4_row_divisor(p, r);
    for (uint64_t k = 0; k < cols / 16; k++) {
        float eff = nf_e4m3_to_f32(p->scales[nf_nvfp4_scale_index(r, k, cols)]) / g;
        for (int i = 0; i < 8; i++) {
            uint8_t b = d[k * 8 + i];
            y[k * 16 + 2 * i] = nf_e2m1_to_f32(b & 15) * eff;
            y[k * 16 + 2 * i + 1] = nf_e2m1_to_f32(b >> 4) * eff;
        }
    }
}

float nf_nvfp4_dot_row(const nf_nvfp4_planes *p, uint64_t r, const float *x)
{
    uint64_t cols = p->layout.cols;
    const uint8_t *d = p->data + r * (cols / 2);
    float g = nf_nvfp4_row_divisor(p, r);
    double acc = 0.0;
    for (uint64_t k = 0; k < cols / 16; k++) {
        float eff = nf_e4m3_to_f32(p->scales[nf_nvfp4_scale_index(r, k, cols)]) / g;
        float s = 0.0f;
        for (int i = 0; i < 8; i++) {
            uint8_t b = d[k * 8 + i];
            s += nf_e2m1_to_f32(b & 15) * x[k * 16 + 2 * i];
            s += nf_e2m1_to_f32(b >> 4) * x[k * 16 + 2 * i + 1];
        }
        acc += (double)s * (double)eff;
    }
    return (float)acc;
}

void nf_nvfp4_matvec_scalar(const nf_nvfp4_planes *p, uint64_t row0, uint64_t rows, const float *x, float *y)
{
    for (uint64_t i = 0; i < rows; i++) y[i] = nf_nvfp4_dot_row(p, row0 + i, x);
}

void nf_nvfp4_matvec(const nf_nvfp4_planes *p, uint64_t row0, uint64_t rows, const float *x, float *y)
{
    static int simd = -1; /* decided once per process, like nf_codec_matvec */
    if (simd < 0) simd = nf_cpu_has_avx2_fma_f16c() && !getenv("NF_NO_SIMD");
    if (simd) nf_nvfp4_matvec_avx2(p, row0, rows, x, y);
    else nf_nvfp4_matvec_scalar(p, row0, rows, x, y);
}

/* int8 activations (codec/a8.h): the ISA choice, the activation quantiser and the portable integer
 * kernels. The scalar kernels unpack each block's levels to integers, take the exact integer sums and
 * combine them in f32 in block order; the SIMD ones (a8_avx2.c, a8_avx512.c) take the same integer
 * sums and combine them in other orders. */
#define _DEFAULT_SOURCE /* syscall(2): arch_prctl, to be granted the AMX tile state */
#include "codec/a8.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "codec/a8_simd.h"
#include "codec/ggml_blocks.h"

/* ---- ISA ---------------------------------------------------------------------------------------- */

static const char *const isa_names[NF_ISA_COUNT] = {"scalar", "avx2", "avx512vnni", "amx"};

const char *nf_isa_name(nf_isa isa) { return (unsigned)isa < NF_ISA_COUNT ? isa_names[isa] : "?"; }

int nf_isa_parse(const char *name, nf_isa *out)
{
    for (int i = 0; name && i < NF_ISA_COUNT; i++)
        if (strcmp(name, isa_names[i]) == 0) {
            *out = (nf_isa)i;
            return 0;
        }
    return -1;
}

/* AVX-512 F/BW/VL/VNNI from CPUID leaf 7 and the OS saving opmask and zmm state (XCR0 bits 5-7). */
static int has_avx512vnni(void)
{
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (!nf_cpu_has_avx2_fma_f16c()) return 0;
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    if ((xlo & 0xE6) != 0xE6) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    const int f = (b >> 16) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1, vnni = (c >> 11) & 1;
    return f && bw && vl && vnni;
#else
    return 0;
#endif
}

/* AMX-TILE and AMX-INT8 from CPUID leaf 7 (EDX bits 24, 25), the tile state granted to this process
 * and enabled in XCR0 (bits 17, 18). Linux grants the 8 KiB tile data state only on request
 * (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, process-wide); without it the first tile
 * instruction faults. Other systems: no AMX. */
static int has_amx(void)
{
#if defined(__linux__) && defined(__x86_64__)
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    unsigned a, b, c, d, xlo, xhi;
    if (!has_avx512vnni()) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    if (!((d >> 24) & 1) || !((d >> 25) & 1)) return 0;
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return 0;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    return (xlo & (3u << 17)) == (3u << 17);
#else
    return 0;
#endif
}

nf_isa nf_isa_detect(void)
{
    static int best = -1;
    if (best < 0)
        best = has_amx() ? NF_ISA_AMX
               : has_avx512vnni() ? NF_ISA_AVX512VNNI
               : nf_cpu_has_avx2_fma_f16c() ? NF_ISA_AVX2 : NF_ISA_SCALAR;
    return (nf_isa)best;
}

nf_isa nf_isa_selected(void)
{
    static int sel = -1;
    if (sel < 0) {
        nf_isa isa = nf_isa_detect(), want;
        const char *e = getenv("NF_CPU_ISA");
        if (e && *e && nf_isa_parse(e, &want) == 0 && want < isa) isa = want;
        if (getenv("NF_NO_SIMD")) isa = NF_ISA_SCALAR;
        sel = (int)isa;
    }
    return (nf_isa)sel;
}

/* ---- the activation quantiser --------------------------------------------------------------------- */

static void quantize_scalar(const float *x, uint8_t *dst, size_t n)
{
    int8_t *q = (int8_t *)dst;
    float *dd = (float *)(dst + n);
    int16_t bs[2];
    for (size_t b = 0; b < n / NF_A8_BLOCK; b++, x += NF_A8_BLOCK, q += NF_A8_BLOCK) {
        float amax = 0;
        int bad = 0;
        for (int i = 0; i < NF_A8_BLOCK; i++) amax = fmaxf(amax, fabsf(x[i])), bad |= !isfinite(x[i]);
        float d = amax / 127.0f;
        if (d < 0x1p-126f) d = 0; /* a subnormal scale would have no inverse: the block is zero */
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        if (bad) d = id = NAN; /* every product with this block becomes NaN, as in f32 */
        bs[0] = bs[1] = 0;
        for (int i = 0; i < NF_A8_BLOCK; i++) {
            /* clamped before the conversion: a NaN or inf input gives a NaN scale, not UB */
            const float v = fminf(fmaxf(rintf(x[i] * id), -127.0f), 127.0f);
            q[i] = (int8_t)(v == v ? v : 0);
            bs[i / 16] = (int16_t)(bs[i / 16] + q[i]);
        }
        memcpy(dd + b, &d, 4);
        memcpy(dst + n + n / 8 + 4 * b, bs, 4);
        const float ds = d * (float)(bs[0] + bs[1]);
        memcpy(dst + n + n / 4 + 4 * b, &ds, 4);
    }
}

void nf_a8_quantize_row(const float *x, uint8_t *dst, size_t n, nf_isa isa)
{
    const nf_isa has = nf_isa_detect();
    if (isa >= NF_ISA_AVX512VNNI && has >= NF_ISA_AVX512VNNI) nf_a8_quantize_row_avx512(x, dst, n);
    else if (isa >= NF_ISA_AVX2 && has >= NF_ISA_AVX2) nf_a8_quantize_row_avx2(x, dst, n);
    else quantize_scalar(x, dst, n);
    memset(dst + n + n / 4 + n / 8, 0, nf_a8_row_bytes(n) - (n + n / 4 + n / 8));
}

/* ---- scalar kernels ------------------------------------------------------------------------------ */

static int isum(const uint8_t *lv, const int8_t *q, int k)
{
    int s = 0;
    for (int i = 0; i < k; i++) s += lv[i] * q[i];
    return s;
}

static float q8_0_row(const uint8_t *b, const uint8_t *xa, size_t n)
{
    const int8_t *q = (const int8_t *)xa;
    const float *dx = NF_A8_D(xa, n);
    float acc = 0;
    for (size_t ib = 0; ib < n / 32; ib++, b += NF_Q8_0_BYTES) {
        int s = 0;
        for (int i = 0; i < 32; i++) s += (int8_t)b[2 + i] * q[32 * ib + i];
        acc += nf_rd_f16(b) * dx[ib] * (float)s;
    }
    return acc;
}

/* q4_k (qh NULL) and q5_k: levels of one super-block, then per sub-block d1 d_b isum - m1 d_b qsum. */
static float k45_row(const uint8_t *b, size_t bb, int q5, const uint8_t *xa, size_t n)
{
    const int8_t *q = (const int8_t *)xa;
    const float *dx = NF_A8_D(xa, n);
    const int16_t *bsum = NF_A8_BSUM(xa, n);
    float acc = 0, macc = 0;
    uint8_t lv[NF_QK_K], sm[16];
    for (size_t ib = 0; ib < n / NF_QK_K; ib++, b += bb) {
        const uint8_t *qh = b + 16, *qs = b + (q5 ? 48 : 16);
        for (int p = 0; p < 4; p++)
            for (int l = 0; l < 32; l++) {
                lv[64 * p + l] = (uint8_t)((qs[32 * p + l] & 0xF) | (q5 ? ((qh[l] >> (2 * p)) & 1) << 4 : 0));
                lv[64 * p + 32 + l] = (uint8_t)((qs[32 * p + l] >> 4) | (q5 ? ((qh[l] >> (2 * p + 1)) & 1) << 4 : 0));
            }
        nf_k4_unpack_scales(b + 4, sm);
        const float d = nf_rd_f16(b), dmin = nf_rd_f16(b + 2);
        for (int j = 0; j < 8; j++) {
            const size_t xb = ib * 8 + j;
            const float d1 = d * sm[j], m1 = dmin * sm[8 + j];
            acc += d1 * dx[xb] * (float)isum(lv + 32 * j, q + 32 * xb, 32);
            macc += m1 * dx[xb] * (float)(bsum[2 * xb] + bsum[2 * xb + 1]);
        }
    }
    return acc - macc;
}

static float q6_k_row(const uint8_t *b, const uint8_t *xa, size_t n)
{
    const int8_t *q = (const int8_t *)xa;
    const float *dx = NF_A8_D(xa, n);
    const int16_t *bsum = NF_A8_BSUM(xa, n);
    float acc = 0;
    uint8_t lv[NF_QK_K];
    for (size_t ib = 0; ib < n / NF_QK_K; ib++, b += NF_Q6_K_BYTES) {
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
            uint8_t *o = lv + 128 * h;
            for (int l = 0; l < 32; l++) {
                o[l] = (uint8_t)((ql[l] & 0xF) | (qh[l] & 3) << 4);
                o[l + 32] = (uint8_t)((ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4);
                o[l + 64] = (uint8_t)((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4);
                o[l + 96] = (uint8_t)((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4);
            }
        }
        const float d = nf_rd_f16(b + 208);
        const int8_t *sc = (const int8_t *)(b + 192);
        for (int k = 0; k < 16; k++) {
            const size_t x16 = ib * 16 + k;
            const int s = isum(lv + 16 * k, q + 16 * x16, 16) - 32 * bsum[x16];
            acc += d * sc[k] * dx[x16 / 2] * (float)s;
        }
    }
    return acc;
}

#define SCALAR_GEMM(name, expr)                                                                            \
    static void name(const void *w, size_t rb, size_t rows, const uint8_t *xa, size_t ldxa, size_t ntok,  \
                     float *y, size_t ldy, size_t n)                                                       \
    {                                                                                                      \
        for (size_t r = 0; r < rows; r++) {                                                                \
            const uint8_t *b = (const uint8_t *)w + r * rb;                                                \
            for (size_t t = 0; t < ntok; t++) {                                                            \
                const uint8_t *x = xa + t * ldxa;                                                          \
                y[t * ldy + r] = (expr);                                                                   \
            }                                                                                              \
        }                                                                                                  \
    }
SCALAR_GEMM(q8_0_scalar, q8_0_row(b, x, n))
SCALAR_GEMM(q4_k_scalar, k45_row(b, NF_Q4_K_BYTES, 0, x, n))
SCALAR_GEMM(q5_k_scalar, k45_row(b, NF_Q5_K_BYTES, 1, x, n))
SCALAR_GEMM(q6_k_scalar, q6_k_row(b, x, n))

nf_a8_gemm_fn nf_codec_a8_kernel(const nf_codec *c, nf_isa isa)
{
    if (!c || isa >= NF_ISA_COUNT || isa > nf_isa_detect()) return NULL;
    /* [codec][isa]; a NULL entry falls back to the ISA below (AMX: the AVX-512 VNNI kernels) */
    nf_a8_gemm_fn k[NF_ISA_COUNT] = {NULL};
    switch (c->id) {
    case NF_CODEC_Q8_0: k[0] = q8_0_scalar, k[1] = nf_q8_0_a8_avx2, k[2] = nf_q8_0_a8_avx512; break;
    case NF_CODEC_Q4_K: k[0] = q4_k_scalar, k[1] = nf_q4_k_a8_avx2, k[2] = nf_q4_k_a8_avx512; break;
    case NF_CODEC_Q5_K: k[0] = q5_k_scalar, k[1] = nf_q5_k_a8_avx2, k[2] = nf_q5_k_a8_avx512; break;
    case NF_CODEC_Q6_K: k[0] = q6_k_scalar, k[1] = nf_q6_k_a8_avx2, k[2] = nf_q6_k_a8_avx512; break;
    default: return NULL;
    }
    for (int i = (int)isa; i >= 0; i--)
        if (k[i]) return k[i];
    return NULL;
}

nf_a8_tile_fn nf_codec_a8_tile(const nf_codec *c, nf_isa isa)
{
    if (!c || isa < NF_ISA_AVX2 || isa >= NF_ISA_COUNT || isa > nf_isa_detect()) return NULL;
    return isa == NF_ISA_AMX ? nf_a8_tile_amx(c->id) : isa == NF_ISA_AVX512VNNI ? nf_a8_tile_avx512(c->id) : nf_a8_tile_avx2(c->id);
}

int nf_a8_tile_wants_xt(nf_isa isa) { return isa == NF_ISA_AMX; }

/* ---- the AMX tile's regrouped activations (a8.h, nf_a8_xt) ----------------------------------------- */

size_t nf_a8_xt_bytes(size_t n, size_t T) { return n * T + n / 32 * T * 8 + 64; }

void nf_a8_xt_put(const uint8_t *xa_t, size_t n, size_t t, size_t T, uint8_t *xt)
{
    for (size_t j = 0; j < n / 4; j++) memcpy(xt + 4 * (j * T + t), xa_t + 4 * j, 4);
    float *d = (float *)(xt + n * T), *ds = d + n / 32 * T;
    for (size_t b = 0; b < n / 32; b++) d[b * T + t] = NF_A8_D(xa_t, n)[b], ds[b * T + t] = NF_A8_DSUM(xa_t, n)[b];
}

void nf_a8_xt_pad(uint8_t *xt, size_t n, size_t T) { memset(xt + nf_a8_xt_bytes(n, T) - 64, 0, 64); }

void nf_a8_xt_fill(const uint8_t *xa, size_t ldxa, size_t n, size_t T, size_t t0, size_t nt, uint8_t *xt, nf_isa isa)
{
    size_t t = t0;
    if (isa >= NF_ISA_AVX512VNNI && isa <= nf_isa_detect() && n % 64 == 0)
        for (; t + 16 <= t0 + nt; t += 16) nf_a8_xt_fill16_avx512(xa + t * ldxa, ldxa, n, T, t, xt);
    for (; t < t0 + nt; t++) nf_a8_xt_put(xa + t * ldxa, n, t, T, xt);
}

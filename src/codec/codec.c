/* The codec table and what every codec shares: lookup, payload sizes, CPU dispatch. Each codec
 * defines its nf_codec in its own file (q4_k.c, ...); adding a codec is one file plus a line here. */
#include "codec/codec.h"

#include <stdlib.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <string.h>

#include "codec/nvfp4.h"

/* Strong references: with weak ones the linker would not pull a codec's object file out of the
 * static library nf_codec (a weak undefined reference never extracts an archive member), and every
 * codec a caller did not name directly would read as NULL. */
#define NF_CODEC_DECL(x) extern const nf_codec x
NF_CODEC_DECL(nf_codec_f32);
NF_CODEC_DECL(nf_codec_f16);
NF_CODEC_DECL(nf_codec_bf16);
NF_CODEC_DECL(nf_codec_q8_0);
NF_CODEC_DECL(nf_codec_q4_k);
NF_CODEC_DECL(nf_codec_q5_k);
NF_CODEC_DECL(nf_codec_q6_k);
NF_CODEC_DECL(nf_codec_q4_0);
NF_CODEC_DECL(nf_codec_q4_1);
NF_CODEC_DECL(nf_codec_q5_0);
NF_CODEC_DECL(nf_codec_q5_1);
NF_CODEC_DECL(nf_codec_nvfp4);
NF_CODEC_DECL(nf_codec_q2_k);
NF_CODEC_DECL(nf_codec_q3_k);
NF_CODEC_DECL(nf_codec_iq4_xs);
NF_CODEC_DECL(nf_codec_iq4_nl);

static const nf_codec *table(nf_codec_id id)
{
    switch (id) {
    case NF_CODEC_F32: return &nf_codec_f32;
    case NF_CODEC_F16: return &nf_codec_f16;
    case NF_CODEC_BF16: return &nf_codec_bf16;
    case NF_CODEC_Q8_0: return &nf_codec_q8_0;
    case NF_CODEC_Q4_K: return &nf_codec_q4_k;
    case NF_CODEC_Q5_K: return &nf_codec_q5_k;
    case NF_CODEC_Q6_K: return &nf_codec_q6_k;
    case NF_CODEC_Q4_0: return &nf_codec_q4_0;
    case NF_CODEC_Q4_1: return &nf_codec_q4_1;
    case NF_CODEC_Q5_0: return &nf_codec_q5_0;
    case NF_CODEC_Q5_1: return &nf_codec_q5_1;
    case NF_CODEC_NVFP4: return &nf_codec_nvfp4;
    case NF_CODEC_Q2_K: return &nf_codec_q2_k;
    case NF_CODEC_Q3_K: return &nf_codec_q3_k;
    case NF_CODEC_IQ4_XS: return &nf_codec_iq4_xs;
    case NF_CODEC_IQ4_NL: return &nf_codec_iq4_nl;
    case NF_CODEC_COUNT: break;
    }
    return NULL;
}

const nf_codec *nf_codec_get(nf_codec_id id) { return table(id); }

const nf_codec *nf_codec_by_name(const char *name)
{
    for (int i = 0; i < NF_CODEC_COUNT && name; i++) {
        const nf_codec *c = table((nf_codec_id)i);
        if (c && strcmp(c->name, name) == 0) return c;
    }
    return NULL;
}

const nf_codec *nf_codec_by_ggml_type(int type)
{
    for (int i = 0; i < NF_CODEC_COUNT; i++) {
        const nf_codec *c = table((nf_codec_id)i);
        if (c && c->ggml_type >= 0 && c->ggml_type == type) return c;
    }
    return NULL;
}

/* AVX2, FMA and F16C from CPUID, plus the OS saving AVX state (XGETBV): clang-14 does not accept
 * __builtin_cpu_supports("f16c"). */
int nf_cpu_has_avx2_fma_f16c(void)
{
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    const int fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, f16c = (c >> 29) & 1;
    if (!(fma && osxsave && avx && f16c)) return 0;
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    if ((xlo & 6) != 6) return 0; /* XMM and YMM state enabled */
    if (__get_cpuid_max(0, NULL) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    return (b >> 5) & 1; /* AVX2 */
#else
    return 0;
#endif
}

nf_matvec_fn nf_codec_matvec(const nf_codec *c)
{
    static int simd = -1; /* decided once per process */
    if (simd < 0) simd = nf_cpu_has_avx2_fma_f16c() && !getenv("NF_NO_SIMD");
    return simd && c->matvec_simd ? c->matvec_simd : c->matvec_scalar;
}

size_t nf_codec_row_bytes(const nf_codec *c, size_t n)
{
    if (!c || c->block_elems == 0 || n % c->block_elems) return 0;
    return n / c->block_elems * c->block_bytes;
}

nf_status nf_codec_payload_bytes(const nf_codec *c, uint64_t rows, uint64_t cols, uint32_t divisors,
                                 uint64_t *bytes, nf_error *err)
{
    if (c->flags & NF_CODEC_PLANAR) {
        nf_nvfp4_layout l;
        nf_status s = nf_nvfp4_layout_of(rows, cols, divisors, &l, err);
        if (s == NF_OK) *bytes = l.payload_bytes;
        return s;
    }
    if (divisors != 1)
        return nf_error_set(err, NF_ERR_FORMAT, "codec %s: divisors = %u, but only nvfp4 may carry more than one",
                            c->name, divisors);
    if (cols % c->block_elems)
        return nf_error_set(err, NF_ERR_FORMAT, "codec %s: row length %llu is not a multiple of its block (%u)",
                            c->name, (unsigned long long)cols, c->block_elems);
    uint64_t row = cols / c->block_elems * c->block_bytes;
    if (row && rows > UINT64_MAX / row)
        return nf_error_set(err, NF_ERR_FORMAT, "codec %s: %llu x %llu overflows", c->name,
                            (unsigned long long)rows, (unsigned long long)cols);
    *bytes = rows * row;
    return NF_OK;
}

int nf_codec_scale_fields(const nf_codec *c, int off[2])
{
    off[0] = off[1] = -1;
    switch (c->id) {
    case NF_CODEC_Q8_0:
    case NF_CODEC_Q4_0:
    case NF_CODEC_Q5_0:
    case NF_CODEC_IQ4_NL:
    case NF_CODEC_IQ4_XS: off[0] = 0; return 1;
    case NF_CODEC_Q4_1:
    case NF_CODEC_Q5_1:
    case NF_CODEC_Q4_K:
    case NF_CODEC_Q5_K: off[0] = 0, off[1] = 2; return 2;
    case NF_CODEC_Q6_K: off[0] = 208; return 1;
    case NF_CODEC_Q2_K: off[0] = 80, off[1] = 82; return 2;
    case NF_CODEC_Q3_K: off[0] = 108; return 1;
    default: return 0;
    }
}

static uint64_t xorshift(uint64_t *s)
{
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

int nf_codec_fill_random(const nf_codec *c, void *dst, size_t n_blocks, uint64_t *state, float d)
{
    int off[2];
    const int k = nf_codec_scale_fields(c, off);
    if (k == 0) return -1;
    uint8_t *b = dst;
    for (size_t i = 0; i < n_blocks * c->block_bytes; i++) b[i] = (uint8_t)(xorshift(state) >> 32);
    for (size_t i = 0; i < n_blocks; i++, b += c->block_bytes)
        for (int f = 0; f < k; f++) {
            const float u = (float)(xorshift(state) >> 40) * 0x1.0p-24f; /* [0, 1) */
            const uint16_t h = nf_f32_to_f16(d * (0.5f + u));
            memcpy(b + off[f], &h, 2);
        }
    return 0;
}

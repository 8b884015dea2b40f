/* Helpers shared by the artifact tests: a scratch directory, a seeded generator, real payloads for
 * every codec (nvfp4 through the codec's own quantizer), a reference artifact and raw file I/O. */
#ifndef NF_TEST_ARTIFACT_UTIL_H
#define NF_TEST_ARTIFACT_UTIL_H

#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codec/codec.h"
#include "codec/nvfp4.h"
#include "format/artifact.h"

static uint64_t ta_rng = 0x9e3779b97f4a7c15ULL;
static inline uint64_t ta_next(void)
{
    ta_rng ^= ta_rng << 13;
    ta_rng ^= ta_rng >> 7;
    ta_rng ^= ta_rng << 17;
    return ta_rng;
}
static inline float ta_uniform(void) { return (float)((ta_next() >> 40) / 16777216.0) * 2.0f - 1.0f; }

/* A fresh scratch directory under /tmp, removed (one level deep) by ta_rmdir. */
static inline char *ta_mkdtemp(void)
{
    static char dir[64];
    snprintf(dir, sizeof dir, "/tmp/nf_artifact_test.XXXXXX");
    return mkdtemp(dir);
}

static inline void ta_rmdir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[512];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static inline int ta_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static inline uint8_t *ta_read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(len > 0 ? (size_t)len : 1);
    *n = fread(b, 1, (size_t)len, f);
    fclose(f);
    return b;
}

static inline int ta_write_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t k = fwrite(p, 1, n, f);
    fclose(f);
    return k == n ? 0 : -1;
}

/* One tensor of the reference set, with its payload. */
typedef struct ta_tensor {
    nf_tensor_desc d;
    char name[64];
    float in_div[8];
    uint8_t *payload;
    uint64_t bytes;
} ta_tensor;

/* A real payload: blocks from the codec's quantizer when it has one, random bytes otherwise
 * (dequant-only codecs: the container does not look inside), nvfp4 through nf_nvfp4_quantize
 * with each divisor share scaled differently so the divisor words differ. */
static inline int ta_make_payload(ta_tensor *t)
{
    nf_tensor_layout l;
    nf_error e;
    if (nf_tensor_layout_of(&t->d, &l, &e)) {
        fprintf(stderr, "layout of %s: %s\n", t->name, e.msg);
        return -1;
    }
    t->bytes = l.payload_bytes;
    t->payload = calloc(1, (size_t)l.payload_bytes);
    float *w = malloc(sizeof(float) * (size_t)(l.rows * l.cols));
    uint32_t D = t->d.divisors ? t->d.divisors : 1;
    for (uint64_t r = 0; r < l.rows; r++)
        for (uint64_t c = 0; c < l.cols; c++) /* share s is scaled by 2^s: divisors differ */
            w[r * l.cols + c] = ta_uniform() * (float)(1u << (r / (l.rows / D) % 8));
    const nf_codec *c = nf_codec_get(t->d.codec);
    if (c->id == NF_CODEC_NVFP4) {
        nf_nvfp4_layout nl;
        nf_nvfp4_layout_of(l.rows, l.cols, D, &nl, &e);
        nf_nvfp4_quantize(w, &nl, t->payload);
    } else if (c->quantize_row) {
        size_t rb = nf_codec_row_bytes(c, (size_t)l.cols);
        for (uint64_t r = 0; r < l.rows; r++) c->quantize_row(w + r * l.cols, t->payload + r * rb, (size_t)l.cols);
    } else {
        for (uint64_t i = 0; i < l.payload_bytes; i++) t->payload[i] = (uint8_t)ta_next();
    }
    free(w);
    return 0;
}

static inline void ta_set(ta_tensor *t, const char *name, nf_codec_id codec, uint32_t nd, const uint64_t *dims,
                          uint32_t divisors, uint32_t flags, uint32_t n_in)
{
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->d.name = t->name;
    t->d.codec = codec;
    t->d.n_dims = nd;
    for (uint32_t i = 0; i < nd; i++) t->d.dims[i] = dims[i];
    t->d.divisors = divisors;
    t->d.flags = flags;
    t->d.n_input_divisors = n_in;
    for (uint32_t i = 0; i < n_in && i < 8; i++) t->in_div[i] = 100.0f + 17.5f * (float)i;
    t->d.input_divisors = n_in ? t->in_div : NULL;
}

/* The reference set: every codec this build links, nvfp4 with divisors = 1 and > 1, with and
 * without allow_a4, one input divisor and one per expert. Returns the count (at most 32). */
static inline int ta_reference_tensors(ta_tensor *ts)
{
    int n = 0;
    static const struct {
        const char *name;
        nf_codec_id id;
        uint32_t nd;
        uint64_t dims[4];
    } plain[] = {
        {"f32.norm", NF_CODEC_F32, 1, {64}},
        {"f16.w", NF_CODEC_F16, 2, {3, 32}},
        {"bf16.w4d", NF_CODEC_BF16, 4, {2, 3, 2, 32}},
        {"q8_0.w", NF_CODEC_Q8_0, 2, {4, 64}},
        {"q4_k.w", NF_CODEC_Q4_K, 2, {2, 256}},
        {"q5_k.w", NF_CODEC_Q5_K, 2, {2, 256}},
        {"q6_k.bank", NF_CODEC_Q6_K, 3, {2, 3, 256}},
        {"q4_0.w", NF_CODEC_Q4_0, 2, {2, 32}},
        {"q4_1.w", NF_CODEC_Q4_1, 2, {2, 32}},
        {"q5_0.w", NF_CODEC_Q5_0, 2, {2, 32}},
        {"q5_1.w", NF_CODEC_Q5_1, 2, {2, 32}},
        {"q2_k.w", NF_CODEC_Q2_K, 2, {2, 256}},
        {"q3_k.w", NF_CODEC_Q3_K, 2, {2, 256}},
        {"iq4_xs.bank", NF_CODEC_IQ4_XS, 3, {2, 2, 256}},
        {"iq4_nl.w", NF_CODEC_IQ4_NL, 2, {3, 64}},
    };
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) {
        if (!nf_codec_get(plain[i].id)) {
            fprintf(stderr, "note: codec %d not linked in this build; not in the reference set\n", (int)plain[i].id);
            continue;
        }
        ta_set(&ts[n], plain[i].name, plain[i].id, plain[i].nd, plain[i].dims, 0, 0, 0);
        n++;
    }
    if (!nf_codec_get(NF_CODEC_NVFP4)) return n;
    /* a single matrix, divisors absent (= 1), no policy */
    ta_set(&ts[n++], "nvfp4.d1", NF_CODEC_NVFP4, 2, (const uint64_t[]){256, 64}, 0, 0, 0);
    /* a gate/up bank of 4 experts, gate and up quantized apart: 8 divisors, W4A4, one input divisor */
    ta_set(&ts[n++], "blk.0.ffn_gate_up_exps", NF_CODEC_NVFP4, 3, (const uint64_t[]){4, 256, 64}, 8,
           NF_TENSOR_ALLOW_A4, 1);
    /* a down bank: one divisor per expert, W4A4 with one input divisor per expert */
    ta_set(&ts[n++], "blk.0.ffn_down_exps", NF_CODEC_NVFP4, 3, (const uint64_t[]){4, 128, 256}, 4,
           NF_TENSOR_ALLOW_A4, 4);
    /* divisors > 1 without allow_a4 (weight-only) */
    ta_set(&ts[n++], "nvfp4.d2.w4a16", NF_CODEC_NVFP4, 3, (const uint64_t[]){2, 128, 32}, 2, 0, 0);
    return n;
}

/* Metadata of every type, including the tokenizer-shaped arrays. */
static inline int ta_add_metadata(nf_artifact_writer *w, nf_error *e)
{
    static const char *vocab[] = {"a", "b", "", "\xc4\xa0the", "<|im_start|>"};
    static const int32_t types[] = {1, 1, 3, -7, 0x7fffffff};
    static const uint32_t u32s[] = {0, 4294967295u};
    static const int64_t i64s[] = {-1, INT64_MIN, INT64_MAX};
    static const float f32s[] = {0.5f, -0.0f, 1e-30f};
    static const double f64s[] = {3.141592653589793, -1e300};
    static const uint8_t bools[] = {1, 0, 1};
    static const char nul_str[] = {'x', 0, 'y'};
    int r = 0;
    r |= nf_artifact_writer_add_str(w, "general.architecture", "qwen3_moe", e);
    r |= nf_artifact_writer_add_u32(w, "model.n_layers", 48, e);
    r |= nf_artifact_writer_add_i32(w, "model.i32", -5, e);
    r |= nf_artifact_writer_add_u64(w, "model.u64", 0xfedcba9876543210ULL, e);
    r |= nf_artifact_writer_add_i64(w, "provenance.date_unix", -1234567890123LL, e);
    r |= nf_artifact_writer_add_f32(w, "model.rms_eps", 1e-6f, e);
    r |= nf_artifact_writer_add_f64(w, "model.rope_theta", 1000000.0, e);
    r |= nf_artifact_writer_add_bool(w, "model.norm_topk_prob", 1, e);
    r |= nf_artifact_writer_add_bool(w, "model.false", 0, e);
    r |= nf_artifact_writer_add_strn(w, "test.nul_string", nul_str, sizeof nul_str, e);
    r |= nf_artifact_writer_add_str(w, "test.empty", "", e);
    r |= nf_artifact_writer_add_str_array(w, "tokenizer.vocab", vocab, NULL, 5, e);
    r |= nf_artifact_writer_add_array(w, "tokenizer.token_types", NF_META_I32, types, 5, e);
    r |= nf_artifact_writer_add_array(w, "test.u32s", NF_META_U32, u32s, 2, e);
    r |= nf_artifact_writer_add_array(w, "test.i64s", NF_META_I64, i64s, 3, e);
    r |= nf_artifact_writer_add_array(w, "test.f32s", NF_META_F32, f32s, 3, e);
    r |= nf_artifact_writer_add_array(w, "test.f64s", NF_META_F64, f64s, 2, e);
    r |= nf_artifact_writer_add_array(w, "test.bools", NF_META_BOOL, bools, 3, e);
    r |= nf_artifact_writer_add_array(w, "test.empty_i32s", NF_META_I32, NULL, 0, e);
    return r;
}

/* Writes tensors ts[0..n) (payloads made) to path, with the reference metadata when with_meta, at
 * payload alignment `align` (0: the writer's default, 4096); returns 0 on success. */
static inline int ta_write_artifact(const char *path, const ta_tensor *ts, int n, uint32_t align, int with_meta)
{
    nf_artifact_writer *w;
    nf_error e;
    if (nf_artifact_writer_open(path, &w, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return -1;
    }
    if ((align && nf_artifact_writer_set_alignment(w, align, &e)) || (with_meta && ta_add_metadata(w, &e))) goto fail;
    for (int i = 0; i < n; i++)
        if (nf_artifact_writer_add_tensor(w, &ts[i].d, ts[i].payload, ts[i].bytes, &e)) goto fail;
    if (nf_artifact_writer_finish(w, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return -1;
    }
    return 0;
fail:
    fprintf(stderr, "%s\n", e.msg);
    nf_artifact_writer_abort(w);
    return -1;
}

/* The reference artifact: every reference tensor and the metadata, default alignment. */
static inline int ta_write_reference(const char *path, ta_tensor *ts, int n)
{
    return ta_write_artifact(path, ts, n, 0, 1);
}

#endif

#include "moe_bench.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/codec.h"

static const nf_moe_geometry geometries[] = {
    /* Qwen3-30B-A3B / Qwen3-Coder-30B-A3B: 128 experts, top-8, 768 x 2048, no shared expert */
    {"qwen3-30b-a3b", 2048, 128, 8, 768, 0},
    /* Qwen3.5-35B-A3B's MoE block: 256 experts, top-8, 512 x 2048, shared expert of 512 */
    {"qwen3.5-35b-a3b", 2048, 256, 8, 512, 512},
    /* Qwen2-57B-A14B: 64 experts, top-8, 2560 x 3584, shared expert of 20480 */
    {"qwen2-57b-a14b", 3584, 64, 8, 2560, 20480},
    {"tiny", 256, 16, 4, 256, 256},
};

const nf_moe_geometry *nf_bench_geometry(const char *name)
{
    for (size_t i = 0; i < sizeof geometries / sizeof geometries[0]; i++)
        if (strcmp(geometries[i].name, name) == 0) return &geometries[i];
    return NULL;
}

static int codec_id(const char *s, size_t n)
{
    char buf[16];
    if (n == 0 || n >= sizeof buf) return -1;
    memcpy(buf, s, n);
    buf[n] = 0;
    const nf_codec *c = nf_codec_by_name(buf);
    return c ? (int)c->id : -1;
}

/* "a+b" -> two codec ids; a single name means the same codec for both. */
static int parse_pair(const char *s, size_t n, int *a, int *b)
{
    const char *plus = memchr(s, '+', n);
    if (!plus) {
        *a = *b = codec_id(s, n);
        return *a >= 0;
    }
    *a = codec_id(s, (size_t)(plus - s));
    *b = codec_id(plus + 1, n - (size_t)(plus - s) - 1);
    return *a >= 0 && *b >= 0;
}

nf_status nf_bench_parse_profile(const char *s, int has_shared, nf_moe_profile *out, nf_error *err)
{
    memset(out, 0, sizeof *out);
    const char *slash = strchr(s, '/');
    size_t n = slash ? (size_t)(slash - s) : strlen(s);
    if (!parse_pair(s, n, &out->gu, &out->dn))
        return nf_error_set(err, NF_ERR_INVALID_ARG, "--codec: '%s' is not a profile (e.g. q4_k+q6_k, q8_0+q8_0, bf16, nvfp4)", s);
    out->sgu = out->sdn = -1;
    if (has_shared) {
        if (slash) {
            if (!parse_pair(slash + 1, strlen(slash + 1), &out->sgu, &out->sdn))
                return nf_error_set(err, NF_ERR_INVALID_ARG, "--codec: bad shared-expert codecs in '%s'", s);
        } else if (out->gu == NF_CODEC_BF16 || out->gu == NF_CODEC_NVFP4) {
            out->sgu = out->sdn = out->gu;
        } else {
            out->sgu = out->sdn = NF_CODEC_Q8_0;
        }
    } else if (slash) {
        return nf_error_set(err, NF_ERR_INVALID_ARG, "--codec: '%s' names shared-expert codecs but the geometry has none", s);
    }
    const nf_codec *a = nf_codec_get((nf_codec_id)out->gu), *b = nf_codec_get((nf_codec_id)out->dn);
    if (out->sgu >= 0)
        snprintf(out->name, sizeof out->name, "%s+%s/%s+%s", a->name, b->name, nf_codec_get((nf_codec_id)out->sgu)->name,
                 nf_codec_get((nf_codec_id)out->sdn)->name);
    else if (out->gu == out->dn && (out->gu == NF_CODEC_BF16 || out->gu == NF_CODEC_NVFP4))
        snprintf(out->name, sizeof out->name, "%s", a->name);
    else
        snprintf(out->name, sizeof out->name, "%s+%s", a->name, b->name);
    return NF_OK;
}

int nf_bench_all_profiles(int has_shared, nf_moe_profile *out, int max)
{
    static const char *const all[] = {"q4_k+q6_k", "q4_k+q5_k", "q4_k+q4_k", "q5_k+q6_k", "q6_k+q6_k",
                                      "q8_0+q8_0", "bf16", "nvfp4"};
    int n = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0] && n < max; i++)
        if (nf_bench_parse_profile(all[i], has_shared, &out[n], NULL) == NF_OK) n++;
    return n;
}

nf_status nf_bench_parse_tokens(const char *s, int is_sweep, uint32_t *list, int *n, int max, nf_error *err)
{
    char *end;
    if (is_sweep) {
        long a = strtol(s, &end, 10);
        if (end == s || *end != ':') return nf_error_set(err, NF_ERR_INVALID_ARG, "--sweep: expected A:B, got '%s'", s);
        const char *bs = end + 1;
        long b = strtol(bs, &end, 10);
        if (end == bs || *end || a < 1 || b < a || b > (1 << 20))
            return nf_error_set(err, NF_ERR_INVALID_ARG, "--sweep: expected 1 <= A <= B <= 1048576, got '%s'", s);
        for (long t = a; t <= b; t++) {
            if (*n >= max) return nf_error_set(err, NF_ERR_INVALID_ARG, "--sweep: more than %d token counts", max);
            list[(*n)++] = (uint32_t)t;
        }
        return NF_OK;
    }
    const char *p = s;
    while (*p) {
        long t = strtol(p, &end, 10);
        if (end == p || t < 1 || t > (1 << 20) || (*end && *end != ','))
            return nf_error_set(err, NF_ERR_INVALID_ARG, "--tokens: expected a comma-separated list of counts in 1..1048576, got '%s'", s);
        if (*n >= max) return nf_error_set(err, NF_ERR_INVALID_ARG, "--tokens: more than %d token counts", max);
        list[(*n)++] = (uint32_t)t;
        p = *end ? end + 1 : end;
    }
    if (*n == 0) return nf_error_set(err, NF_ERR_INVALID_ARG, "--tokens: empty list");
    return NF_OK;
}

static nf_status read_ids(const char *path, uint32_t E, uint32_t k, nf_moe_dist *d, nf_error *err)
{
    FILE *f = fopen(path, "r");
    if (!f) return nf_error_set(err, NF_ERR_IO, "--distribution file:%s: cannot open", path);
    size_t cap = 1024, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    long v;
    int c;
    nf_status st = NF_OK;
    while (ids && (c = fscanf(f, "%ld", &v)) == 1) {
        if (v < 0 || v >= (long)E) {
            st = nf_error_set(err, NF_ERR_FORMAT, "%s: id %ld at position %zu is not an expert (0..%u)", path, v, n, E - 1);
            break;
        }
        if (n == cap) {
            int32_t *grown = realloc(ids, 2 * cap * sizeof *ids);
            if (!grown) break;
            ids = grown;
            cap *= 2;
        }
        ids[n++] = (int32_t)v;
        while ((c = fgetc(f)) == ',' || c == ' ' || c == '\t') {
        }
        if (c != EOF) ungetc(c, f);
    }
    if (st == NF_OK && (!ids || !feof(f)))
        st = nf_error_set(err, NF_ERR_FORMAT, "%s: expected whitespace- or comma-separated expert ids, stopped at entry %zu",
                          path, n);
    fclose(f);
    if (st == NF_OK && (n == 0 || n % k))
        st = nf_error_set(err, NF_ERR_FORMAT, "%s: %zu ids is not a positive multiple of top-k %u", path, n, k);
    for (size_t t = 0; st == NF_OK && t < n / k; t++)
        for (uint32_t a = 0; a < k; a++)
            for (uint32_t b = 0; b < a; b++)
                if (ids[t * k + a] == ids[t * k + b])
                    st = nf_error_set(err, NF_ERR_FORMAT, "%s: token %zu routes to expert %d twice", path, t, ids[t * k + a]);
    if (st != NF_OK) {
        free(ids);
        return st;
    }
    d->file_ids = ids;
    d->file_tokens = (uint32_t)(n / k);
    return NF_OK;
}

nf_status nf_bench_parse_dist(const char *s, uint32_t E, uint32_t k, nf_moe_dist *out, nf_error *err)
{
    memset(out, 0, sizeof *out);
    out->zipf_s = 1.0;
    if (strcmp(s, "same") == 0) out->kind = NF_DIST_SAME;
    else if (strcmp(s, "uniform") == 0) out->kind = NF_DIST_UNIFORM;
    else if (strcmp(s, "trace-like") == 0) out->kind = NF_DIST_TRACE;
    else if (strncmp(s, "file:", 5) == 0) {
        out->kind = NF_DIST_FILE;
        return read_ids(s + 5, E, k, out, err);
    } else
        return nf_error_set(err, NF_ERR_INVALID_ARG, "--distribution: '%s' is not same|uniform|trace-like|file:PATH", s);
    return NF_OK;
}

void nf_bench_dist_free(nf_moe_dist *d)
{
    free((void *)d->file_ids);
    d->file_ids = NULL;
}

const char *nf_bench_dist_name(const nf_moe_dist *d)
{
    static const char *const names[] = {"same", "uniform", "trace-like", "file"};
    return names[d->kind];
}

/* splitmix64: small, seedable, good enough for routing draws */
static uint64_t next_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double next_unit(uint64_t *s) { return (double)(next_u64(s) >> 11) * (1.0 / 9007199254740992.0); }

/* Draws k distinct experts with probability proportional to w (w of taken experts set to 0). */
static void draw_weighted(double *w, uint32_t E, uint32_t k, uint64_t *s, int32_t *out)
{
    double total = 0;
    for (uint32_t e = 0; e < E; e++) total += w[e];
    for (uint32_t j = 0; j < k; j++) {
        double u = next_unit(s) * total, acc = 0;
        uint32_t pick = E;
        for (uint32_t e = 0; e < E; e++) {
            if (w[e] <= 0) continue;
            acc += w[e];
            pick = e;
            if (u < acc) break;
        }
        out[j] = (int32_t)pick;
        total -= w[pick];
        w[pick] = 0;
    }
}

void nf_bench_route(const nf_moe_dist *d, uint32_t T, uint32_t E, uint32_t k, uint64_t seed, uint32_t layer,
                    int32_t *ids)
{
    uint64_t s = seed * 0x100000001B3ull ^ (uint64_t)layer * 0x9E3779B97F4A7C15ull ^ 0xA5A5A5A5ull;
    double *base = malloc(sizeof(double) * E), *w = malloc(sizeof(double) * E);
    if (d->kind == NF_DIST_TRACE) {
        /* popularity 1/(rank+1)^s over a seeded permutation of the experts */
        uint32_t *perm = malloc(sizeof(uint32_t) * E);
        for (uint32_t e = 0; e < E; e++) perm[e] = e;
        for (uint32_t e = E - 1; e > 0; e--) {
            uint32_t j = (uint32_t)(next_u64(&s) % (e + 1)), t = perm[e];
            perm[e] = perm[j];
            perm[j] = t;
        }
        for (uint32_t r = 0; r < E; r++) base[perm[r]] = 1.0 / pow((double)r + 1.0, d->zipf_s);
        free(perm);
    } else {
        for (uint32_t e = 0; e < E; e++) base[e] = 1.0;
    }
    int32_t *fixed = malloc(sizeof(int32_t) * k);
    memcpy(w, base, sizeof(double) * E);
    draw_weighted(w, E, k, &s, fixed);
    for (uint32_t t = 0; t < T; t++) {
        int32_t *row = ids + (size_t)t * k;
        if (d->kind == NF_DIST_SAME) {
            memcpy(row, fixed, sizeof(int32_t) * k);
        } else if (d->kind == NF_DIST_FILE) {
            memcpy(row, d->file_ids + (size_t)(t % d->file_tokens) * k, sizeof(int32_t) * k);
        } else {
            memcpy(w, base, sizeof(double) * E);
            draw_weighted(w, E, k, &s, row);
        }
    }
    free(fixed);
    free(base);
    free(w);
}

uint32_t nf_bench_unique_experts(const int32_t *ids, uint32_t T, uint32_t k, uint32_t E)
{
    unsigned char *seen = calloc(E, 1);
    uint32_t n = 0;
    for (size_t i = 0; i < (size_t)T * k; i++)
        if (ids[i] >= 0 && (uint32_t)ids[i] < E && !seen[ids[i]]) {
            seen[ids[i]] = 1;
            n++;
        }
    free(seen);
    return n;
}

uint64_t nf_bench_matrix_bytes(int codec, uint64_t rows, uint64_t cols)
{
    if (codec == NF_CODEC_NVFP4) return rows * cols / 2 + rows * cols / 16;
    const nf_codec *c = nf_codec_get((nf_codec_id)codec);
    return c ? rows * nf_codec_row_bytes(c, cols) : 0;
}

uint64_t nf_bench_unique_bytes(const nf_moe_geometry *g, const nf_moe_profile *p, const int32_t *ids, uint32_t T)
{
    uint64_t per_expert = nf_bench_matrix_bytes(p->gu, 2ull * g->I, g->H) + nf_bench_matrix_bytes(p->dn, g->H, g->I);
    uint64_t b = (uint64_t)g->E * g->H * 2; /* router, bf16 */
    b += per_expert * nf_bench_unique_experts(ids, T, g->k, g->E);
    if (g->S && p->sgu >= 0)
        b += nf_bench_matrix_bytes(p->sgu, 2ull * g->S, g->H) + nf_bench_matrix_bytes(p->sdn, g->H, g->S) +
             (uint64_t)g->H * 2;
    return b;
}

double nf_bench_flops(const nf_moe_geometry *g, uint32_t T)
{
    double t = T, H = g->H, I = g->I, S = g->S;
    return 2 * t * g->E * H + 2 * t * g->k * (2 * I * H + H * I) + (S ? 2 * t * (2 * S * H + H * S + H) : 0);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double nf_bench_quantile(double *v, int n, double q)
{
    if (n <= 0) return NAN;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    double pos = q * (n - 1);
    int i = (int)pos;
    if (i >= n - 1) return v[n - 1];
    return v[i] + (pos - i) * (v[i + 1] - v[i]);
}

#include "codec/nvfp4.h"

static void fill_random(uint8_t *p, size_t n, uint64_t *s)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v = next_u64(s);
        memcpy(p + i, &v, 8);
    }
    for (; i < n; i++) p[i] = (uint8_t)next_u64(s);
}

/* An f16 in [lo, 2*lo) stored at p. */
static void put_f16_scale(uint8_t *p, float lo, uint64_t *s)
{
    uint16_t h = nf_f32_to_f16(lo * (float)(1.0 + next_unit(s)));
    memcpy(p, &h, 2);
}

void *nf_bench_make_payload(int codec, uint32_t experts, uint32_t rows, uint32_t cols, uint32_t divisors, uint64_t seed,
                            size_t *bytes)
{
    uint64_t s = seed ^ 0xC0FFEEull, R = (uint64_t)experts * rows;
    uint64_t total = 0;
    if (nf_codec_payload_bytes(nf_codec_get((nf_codec_id)codec), R, cols, codec == NF_CODEC_NVFP4 ? divisors : 1, &total,
                               NULL) != NF_OK)
        return NULL;
    uint8_t *p = calloc(1, total);
    if (!p) return NULL;
    *bytes = total;
    const nf_codec *c = nf_codec_get((nf_codec_id)codec);
    if (codec == NF_CODEC_NVFP4) {
        nf_nvfp4_layout l;
        nf_nvfp4_layout_of(R, cols, divisors, &l, NULL);
        fill_random(p, l.data_bytes, &s);
        for (uint64_t r = 0; r < R; r++)
            for (uint64_t k = 0; k < cols / 16; k++) /* e4m3 scales 0x28..0x47: 0.25 .. 2.9, never NaN */
                p[l.scale_offset + nf_nvfp4_scale_index(r, k, cols)] = (uint8_t)(0x28 + next_u64(&s) % 32);
        for (uint32_t d = 0; d < divisors; d++) {
            float v = 100.0f * (1.0f + 3.0f * (float)(d % 7) / 6.0f);
            memcpy(p + l.divisor_offset + 4 * d, &v, 4);
        }
        return p;
    }
    if (codec == NF_CODEC_BF16 || codec == NF_CODEC_F16 || codec == NF_CODEC_F32) {
        for (uint64_t i = 0; i < R * cols; i++) {
            float v = (float)(next_unit(&s) - 0.5) * 0.1f;
            if (codec == NF_CODEC_F32) memcpy(p + 4 * i, &v, 4);
            else {
                uint16_t h = codec == NF_CODEC_BF16 ? nf_f32_to_bf16(v) : nf_f32_to_f16(v);
                memcpy(p + 2 * i, &h, 2);
            }
        }
        return p;
    }
    fill_random(p, total, &s);
    const uint64_t blocks = total / c->block_bytes;
    for (uint64_t b = 0; b < blocks; b++) {
        uint8_t *blk = p + b * c->block_bytes;
        switch (codec) {
        case NF_CODEC_Q8_0: put_f16_scale(blk, 1e-3f, &s); break;
        case NF_CODEC_Q6_K: put_f16_scale(blk + 208, 1e-3f, &s); break;
        /* the import-only codecs (no quantizer): random bytes are valid blocks once the f16 scales
         * are finite, wherever the block keeps them (q2_k and q3_k last: nf_codec_scale_fields) */
        case NF_CODEC_Q2_K:
        case NF_CODEC_Q3_K:
        case NF_CODEC_IQ4_XS:
        case NF_CODEC_IQ4_NL: {
            int off[2];
            for (int f = 0, k = nf_codec_scale_fields(c, off); f < k; f++) put_f16_scale(blk + off[f], 1e-3f, &s);
            break;
        }
        default: /* q4_k, q5_k and the legacy codecs keep d (and dmin) first */
            put_f16_scale(blk, 1e-3f, &s);
            put_f16_scale(blk + 2, 1e-3f, &s);
            break;
        }
    }
    return p;
}

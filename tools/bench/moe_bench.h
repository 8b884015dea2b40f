/* The host side of `ninfer bench sparse-moe` that needs no GPU, so CPU tests can cover it:
 * geometries, profiles, token lists, routing distributions, unique-byte and FLOP accounting, and
 * order statistics. */
#ifndef NF_TOOLS_MOE_BENCH_H
#define NF_TOOLS_MOE_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

typedef struct nf_moe_geometry {
    const char *name;
    uint32_t H, E, k, I, S; /* S = 0: no shared expert */
} nf_moe_geometry;

/* Named geometries: qwen3-30b-a3b, qwen3.5-35b-a3b, qwen2-57b-a14b, tiny. NULL if unknown. */
const nf_moe_geometry *nf_bench_geometry(const char *name);

/* A profile: codecs of routed gate/up, routed down, shared gate/up, shared down (-1 = none). */
typedef struct nf_moe_profile {
    char name[48];
    int gu, dn, sgu, sdn;
} nf_moe_profile;

/* Parses "q4_k+q6_k", "q8_0+q8_0", "bf16", "nvfp4", optionally "/SGU+SDN" for the shared expert
 * (default: q8_0+q8_0 for GGUF profiles, the same codec for bf16 and nvfp4). has_shared says whether
 * the geometry has a shared expert. */
nf_status nf_bench_parse_profile(const char *s, int has_shared, nf_moe_profile *out, nf_error *err);
/* The list `--codec all` expands to. Returns the count (<= max). */
int nf_bench_all_profiles(int has_shared, nf_moe_profile *out, int max);

/* Token lists: "1,2,4" (--tokens) or "A:B" (--sweep, every T in [A, B]). Appends to list. */
nf_status nf_bench_parse_tokens(const char *s, int is_sweep, uint32_t *list, int *n, int max, nf_error *err);

typedef enum { NF_DIST_SAME, NF_DIST_UNIFORM, NF_DIST_TRACE, NF_DIST_FILE } nf_dist_kind;

typedef struct nf_moe_dist {
    nf_dist_kind kind;
    double zipf_s;          /* trace-like: popularity ~ 1 / (rank + 1)^zipf_s */
    const int32_t *file_ids;/* file: recorded ids, [file_tokens][k] */
    uint32_t file_tokens;
} nf_moe_dist;

/* Parses same|uniform|trace-like|file:PATH (the file's ids are read here; free with
 * nf_bench_dist_free). */
nf_status nf_bench_parse_dist(const char *s, uint32_t E, uint32_t k, nf_moe_dist *out, nf_error *err);
void nf_bench_dist_free(nf_moe_dist *d);
const char *nf_bench_dist_name(const nf_moe_dist *d);

/* ids[T][k]: k distinct experts per token drawn from the distribution, deterministic in (seed,
 * layer). same: one fixed set for every token. uniform: independent uniform draws without
 * replacement. trace-like: experts get a Zipf popularity over a permutation seeded by
 * (seed, layer); draws without replacement proportional to it. file: the recorded rows, cycled. */
void nf_bench_route(const nf_moe_dist *d, uint32_t T, uint32_t E, uint32_t k, uint64_t seed, uint32_t layer,
                    int32_t *ids);

/* Number of distinct experts in ids[T][k]. */
uint32_t nf_bench_unique_experts(const int32_t *ids, uint32_t T, uint32_t k, uint32_t E);

/* Encoded bytes of one expert's matrix of rows x cols in a codec (nvfp4: data + e4m3 scales, one
 * scale byte per 16 elements; divisor words and swizzle padding not counted). */
uint64_t nf_bench_matrix_bytes(int codec, uint64_t rows, uint64_t cols);

/* Unique weight bytes a forward reads: router (bf16) + every distinct routed expert's gate/up and
 * down + the shared expert (when present) and its gate. */
uint64_t nf_bench_unique_bytes(const nf_moe_geometry *g, const nf_moe_profile *p, const int32_t *ids, uint32_t T);

/* Logical FLOPs: router 2*T*E*H, routed 2*T*k*(2I*H + H*I), shared 2*T*(2S*H + H*S + H). */
double nf_bench_flops(const nf_moe_geometry *g, uint32_t T);

/* Sorts v[n] and returns the q-quantile (0..1) by linear interpolation. */
double nf_bench_quantile(double *v, int n, double q);



/* Synthetic weights: a host payload for `experts` matrices of rows x cols in `codec`, random but
 * valid (finite scales of moderate size; nvfp4 with `divisors` sources whose divisors differ),
 * deterministic in seed. Returns NULL on allocation failure; *bytes receives the size. */
void *nf_bench_make_payload(int codec, uint32_t experts, uint32_t rows, uint32_t cols, uint32_t divisors, uint64_t seed,
                            size_t *bytes);
#endif

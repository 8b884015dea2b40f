/* A fixed pool of worker threads and a parallel-for over it.
 *
 * nf_parallel_for splits [0, n) into chunks of `grain` items that workers (and the calling
 * thread) claim dynamically, so uneven chunks (experts with different token counts) balance.
 * It returns when every chunk has run. Calls must not nest: fn must not call nf_parallel_for
 * on the same pool. */
#ifndef NF_BASE_PARALLEL_H
#define NF_BASE_PARALLEL_H

#include <stddef.h>

#include "base/error.h"

/* fn runs items [begin, end); worker is 0..nf_pool_size-1 (0 is the calling thread), usable to
 * index per-thread scratch. */
typedef void (*nf_range_fn)(void *ctx, size_t begin, size_t end, int worker);

typedef struct nf_pool nf_pool;

/* Online CPUs (sched_getaffinity if available), at least 1. */
int nf_cpu_count(void);

/* n_threads <= 0 means nf_cpu_count(). A pool of 1 runs everything on the caller. */
nf_status nf_pool_create(int n_threads, nf_pool **out, nf_error *err);
void nf_pool_destroy(nf_pool *p);
int nf_pool_size(const nf_pool *p);

/* p == NULL runs inline on the caller. grain 0 is treated as 1. */
void nf_parallel_for(nf_pool *p, size_t n, size_t grain, nf_range_fn fn, void *ctx);
/* The same with guided claims: each a 2T-th of the items still unclaimed (T threads), at least
 * min_grain, so that early claims are long and the last ones short (the threads end together). */
void nf_parallel_for_guided(nf_pool *p, size_t n, size_t min_grain, nf_range_fn fn, void *ctx);

#endif

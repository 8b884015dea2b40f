/* A bump allocator over one block, with marks for scoped reuse and a peak for sizing.
 *
 * Three ways to back it:
 *   nf_arena_init    - owns a host block of `cap` bytes (NF_ARENA_BASE_ALIGN aligned);
 *   nf_arena_wrap    - hands out a caller's buffer (e.g. a cudaMalloc'd workspace);
 *   nf_arena_sizing  - no memory at all: takes only count, so the same carving code that later
 *                      lays out a workspace can first measure it (peak = bytes to allocate).
 * Offsets are aligned relative to the base, which is itself NF_ARENA_BASE_ALIGN aligned, so
 * alignments up to that value hold for real addresses too. */
#ifndef NF_BASE_ARENA_H
#define NF_BASE_ARENA_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

#define NF_ARENA_BASE_ALIGN 256u

typedef struct nf_arena {
    uint8_t *base; /* NULL in sizing mode */
    size_t cap;    /* bytes available (SIZE_MAX in sizing mode) */
    size_t used;   /* bytes in use: the offset where the next take starts before alignment */
    size_t peak;   /* largest `used` ever reached: what a sizing pass reports */
    int owns;      /* base was allocated by nf_arena_init and is freed by nf_arena_free */
} nf_arena;

nf_status nf_arena_init(nf_arena *a, size_t cap, nf_error *err);
nf_status nf_arena_wrap(nf_arena *a, void *buf, size_t cap, nf_error *err);
void nf_arena_sizing(nf_arena *a);
void nf_arena_free(nf_arena *a);

/* Reserves `size` bytes aligned to `align` (a power of two <= NF_ARENA_BASE_ALIGN); writes the
 * offset from the base. Fails with NF_ERR_NOMEM naming the request and the capacity left. */
nf_status nf_arena_take(nf_arena *a, size_t size, size_t align, size_t *offset, nf_error *err);
/* nf_arena_take returning a pointer; NULL when the arena is full or in sizing mode. */
void *nf_arena_alloc(nf_arena *a, size_t size, size_t align);

/* Everything taken after a mark is released by resetting to it; the peak is kept. */
static inline size_t nf_arena_mark(const nf_arena *a) { return a->used; }
void nf_arena_reset(nf_arena *a, size_t mark);

#endif

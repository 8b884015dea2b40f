/* A batch under construction for the batched-forward tests (tests/engine/test_batch.c on the CPU,
 * tests/cuda/test_batch_cuda.c on the GPU): the pieces of up to FXB_SEQS sequences, FXB_TOKENS
 * tokens in all, page tables FXB_STRIDE pages apart. Define the three before including. */
#pragma once

#include <stdint.h>
#include <string.h>

#include "base/batch.h"

typedef struct batch_buf {
    int32_t tokens[FXB_TOKENS];
    uint32_t seq_start[FXB_SEQS + 1], pos0[FXB_SEQS], pages[FXB_SEQS * FXB_STRIDE], n_seqs;
} batch_buf;

/* Appends n tokens of a sequence at positions pos0.. over its page table (FXB_STRIDE entries). */
static inline void batch_add(batch_buf *bb, const uint32_t *pages, uint32_t pos0, const int32_t *tokens, uint32_t n)
{
    const uint32_t i = bb->n_seqs++, t0 = bb->seq_start[i];
    memcpy(bb->tokens + t0, tokens, n * sizeof(int32_t));
    memcpy(bb->pages + (size_t)i * FXB_STRIDE, pages, FXB_STRIDE * sizeof(uint32_t));
    bb->pos0[i] = pos0;
    bb->seq_start[i + 1] = t0 + n;
}

static inline nf_batch batch_of(const batch_buf *bb, int all_logits)
{
    return (nf_batch){.n_tokens = bb->seq_start[bb->n_seqs], .n_seqs = bb->n_seqs, .tokens = bb->tokens,
                      .seq_start = bb->seq_start, .pos0 = bb->pos0, .pages = bb->pages, .page_stride = FXB_STRIDE,
                      .all_logits = all_logits};
}

/* perm[0 .. n) = the pages 0 .. n - 1 in a fixed shuffled order (Fisher-Yates over an LCG from seed):
 * page tables that interleave sequences and run backwards in places. */
static inline void shuffled_pages(uint32_t *perm, uint32_t n, uint64_t seed)
{
    uint64_t r = seed;
    for (uint32_t i = 0; i < n; i++) perm[i] = i;
    for (uint32_t i = n - 1; i > 0; i--) {
        r = r * 6364136223846793005ULL + 1442695040888963407ULL;
        uint32_t j = (uint32_t)((r >> 33) % (i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

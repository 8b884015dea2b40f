/* Expert-choice traces of two runs (nf_engine_routing, opts.trace_routing): where the roundings of
 * one engine tip a near-tie of two experts' router logits, the runs pick different expert sets, both
 * right, and the tests stop holding that sequence's later logits to their bounds. */
#pragma once
#include <stddef.h>
#include <stdint.h>

/* The same set of k expert ids in x and y (any order). */
static inline int fx_same_experts(const int32_t *x, const int32_t *y, size_t k)
{
    for (size_t i = 0; i < k; i++) {
        int found = 0;
        for (size_t j = 0; j < k; j++) found |= x[i] == y[j];
        if (!found) return 0;
    }
    return 1;
}

/* Expert sets of tokens [a, a + n) of a trace [L][T][k] against rows [0, n) of a trace [L][n][k]. */
static inline int fx_same_routing(const int32_t *bt, uint32_t T, uint32_t a, const int32_t *al, uint32_t n, uint32_t L,
                                  uint32_t k)
{
    for (uint32_t l = 0; l < L; l++)
        for (uint32_t t = 0; t < n; t++)
            if (!fx_same_experts(bt + ((size_t)l * T + a + t) * k, al + ((size_t)l * n + t) * k, k)) return 0;
    return 1;
}

/* Expert parallelism's bookkeeping, free of any backend: which rank holds which routed experts, and
 * for one MoE block on one rank which rows go to which rank (dispatch) and where each (token,
 * choice)'s result comes back (combine). A backend turns the tables into its exchange: the CUDA
 * backend into grouped NCCL send/recv calls, the CPU backend into copies between G simulated ranks
 * (nf_ep_exchange_sim, the same displacements), which is how the tables are tested without a second
 * GPU (docs/dist.md).
 *
 * One MoE block under expert parallelism, seen from rank s with its own T tokens (data-parallel
 * attention: a sequence lives on one rank):
 *   1. route its tokens (router and shared expert are replicated): ids [T][k], weights [T][k];
 *   2. nf_ep_send_build: send rows ordered by destination rank, then token, then choice;
 *   3. exchange counts, then rows (x of the row's token, its local expert id and segment key);
 *   4. the destination runs its experts over what it received (rows of one source in send order);
 *   5. results travel back with the counts transposed, landing in send-row order;
 *   6. combine: out[t] = sum over j = 0..k-1 of w[t][j] * result[row[t k + j]], in choice order —
 *      the one-rank combine's order, so the sum is the same bits when each row's result is. */
#ifndef NF_DIST_EP_H
#define NF_DIST_EP_H

#include <stddef.h>
#include <stdint.h>

#include "ninfer.h"

enum { NF_EP_MAX_RANKS = 64 };

/* Rank r holds experts [first[r], first[r + 1]): contiguous, sizes differing by at most one (the
 * first E % G ranks take one more), so a bank's rows split into G contiguous row ranges. */
typedef struct nf_ep_layout {
    uint32_t ranks, experts;
    uint32_t first[NF_EP_MAX_RANKS + 1];
} nf_ep_layout;

/* Fails (naming the values) for ranks == 0, ranks > NF_EP_MAX_RANKS or ranks > experts. */
nf_status nf_ep_layout_init(nf_ep_layout *l, uint32_t experts, uint32_t ranks, nf_error *err);
/* The rank holding expert e (e < experts). */
uint32_t nf_ep_rank_of(const nf_ep_layout *l, uint32_t e);

/* A row's travelling metadata: the expert id local to its destination, and the key of its segment
 * (rows of one expert with one key are one product segment there, as one sequence's tokens are on a
 * single rank: nf_cpu_gemm_job). */
typedef struct nf_ep_meta {
    uint32_t expert, key;
} nf_ep_meta;

/* One rank's dispatch of T tokens' k choices. Shapes: A = T * k. */
typedef struct nf_ep_send {
    uint32_t ranks;
    size_t tokens, top_k, cap; /* cap: A the arrays were sized for */
    uint32_t count[NF_EP_MAX_RANKS]; /* rows to rank d */
    uint32_t displ[NF_EP_MAX_RANKS]; /* first send row to rank d (prefix sums of count) */
    uint32_t *token;                 /* [A] send row -> the source token whose x it carries */
    nf_ep_meta *meta;                /* [A] send row -> (local expert, segment key) */
    uint32_t *row;                   /* [A] choice t k + j -> its send row (where its result returns) */
} nf_ep_send;

nf_status nf_ep_send_alloc(nf_ep_send *s, size_t max_rows, nf_error *err);
void nf_ep_send_free(nf_ep_send *s);

/* Builds s for ids [T][k] (experts < l->experts; checked: a bad id fails naming token, choice and
 * value). key_of_token (NULL: every key 0) gives each token its segment key, e.g. a sequence id
 * unique across ranks. */
nf_status nf_ep_send_build(const nf_ep_layout *l, const int32_t *ids, size_t T, uint32_t k,
                           const uint32_t *key_of_token, nf_ep_send *s, nf_error *err);

/* The receive side's counts from the exchanged count matrix: counts[s][d] = rows rank s sends to
 * rank d (row s is rank s's nf_ep_send.count). Rank d receives its rows in source order:
 * recv_count[s] = counts[s][d], recv_displ prefix sums; returns the total. */
size_t nf_ep_recv_counts(const uint32_t *counts, uint32_t ranks, uint32_t d, uint32_t *recv_count, uint32_t *recv_displ);

/* An all-to-all of variable row counts among G simulated ranks in one address space, with exactly
 * the displacements a grouped NCCL send/recv uses: rank s's rows [displ_s[d], + counts[s][d]) of
 * send[s] land in recv[d] at row recv_displ_d[s]. back = 1 runs it transposed (results returning:
 * rank d's rows [recv_displ_d[s], + counts[s][d]) of send[d] land in recv[s] at displ_s[d]). */
void nf_ep_exchange_sim(uint32_t ranks, const uint32_t *counts, size_t row_bytes, const void *const *send,
                        void *const *recv, int back);

/* One call of a grouped exchange as one thread issues it to G communicators (the CUDA backend's
 * NCCL exchange): rank `rank` sends `rows` rows starting at row `at` of its send buffer to `peer`, or
 * (recv) receives them from `peer` into its receive buffer at row `at`. */
typedef struct nf_ep_op {
    uint32_t rank, peer;
    int recv;
    size_t at, rows;
} nf_ep_op;
/* The calls of the exchange nf_ep_exchange_sim performs (back as there), rank after rank, for each
 * peer its send then its receive, calls of zero rows left out: ops needs 2 ranks^2 entries; returns
 * how many it wrote. Every send meets exactly one receive of the same rows (rank and peer swapped). */
size_t nf_ep_exchange_plan(uint32_t ranks, const uint32_t *counts, int back, nf_ep_op *ops);

#endif

/* Expert parallelism's dispatch and combine tables (ep.h). */
#include "dist/ep.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"

nf_status nf_ep_layout_init(nf_ep_layout *l, uint32_t experts, uint32_t ranks, nf_error *err)
{
    memset(l, 0, sizeof *l);
    if (ranks == 0 || ranks > NF_EP_MAX_RANKS)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "expert parallelism: %u ranks (1 .. %d)", ranks, NF_EP_MAX_RANKS);
    if (ranks > experts)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "expert parallelism: %u ranks for %u experts (a rank would hold none)",
                            ranks, experts);
    l->ranks = ranks;
    l->experts = experts;
    const uint32_t base = experts / ranks, extra = experts % ranks;
    for (uint32_t r = 0; r < ranks; r++) l->first[r + 1] = l->first[r] + base + (r < extra);
    return NF_OK;
}

uint32_t nf_ep_rank_of(const nf_ep_layout *l, uint32_t e)
{
    /* the first `extra` ranks hold base + 1 experts, the rest base */
    const uint32_t base = l->experts / l->ranks, extra = l->experts % l->ranks;
    const uint32_t big = extra * (base + 1);
    return e < big ? e / (base + 1) : extra + (e - big) / base;
}

nf_status nf_ep_send_alloc(nf_ep_send *s, size_t max_rows, nf_error *err)
{
    memset(s, 0, sizeof *s);
    const size_t n = max_rows ? max_rows : 1;
    s->token = malloc(n * sizeof *s->token);
    s->meta = malloc(n * sizeof *s->meta);
    s->row = malloc(n * sizeof *s->row);
    if (!s->token || !s->meta || !s->row) {
        nf_ep_send_free(s);
        return nf_error_set(err, NF_ERR_NOMEM, "expert parallelism: dispatch tables for %zu rows: out of memory", max_rows);
    }
    s->cap = max_rows;
    return NF_OK;
}

void nf_ep_send_free(nf_ep_send *s)
{
    free(s->token);
    free(s->meta);
    free(s->row);
    memset(s, 0, sizeof *s);
}

nf_status nf_ep_send_build(const nf_ep_layout *l, const int32_t *ids, size_t T, uint32_t k,
                           const uint32_t *key_of_token, nf_ep_send *s, nf_error *err)
{
    const size_t A = T * k;
    if (A > s->cap)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "expert parallelism: %zu choices for tables of %zu rows", A, s->cap);
    s->ranks = l->ranks;
    s->tokens = T;
    s->top_k = k;
    memset(s->count, 0, sizeof s->count);
    for (size_t a = 0; a < A; a++) {
        if (ids[a] < 0 || (uint32_t)ids[a] >= l->experts)
            return nf_error_set(err, NF_ERR_INVALID_ARG, "expert parallelism: token %zu choice %zu: expert %d of %u",
                                a / k, a % k, ids[a], l->experts);
        s->count[nf_ep_rank_of(l, (uint32_t)ids[a])]++;
    }
    uint32_t next[NF_EP_MAX_RANKS];
    for (uint32_t d = 0, o = 0; d < l->ranks; o += s->count[d++]) s->displ[d] = next[d] = o;
    /* a stable pass in (token, choice) order: each destination's rows keep token order, so one
     * sequence's rows to one expert arrive in the order the one-rank grouping has them */
    for (size_t a = 0; a < A; a++) {
        const uint32_t e = (uint32_t)ids[a], d = nf_ep_rank_of(l, e), r = next[d]++;
        s->token[r] = (uint32_t)(a / k);
        s->meta[r] = (nf_ep_meta){e - l->first[d], key_of_token ? key_of_token[a / k] : 0};
        s->row[a] = r;
    }
    return NF_OK;
}

size_t nf_ep_recv_counts(const uint32_t *counts, uint32_t ranks, uint32_t d, uint32_t *recv_count, uint32_t *recv_displ)
{
    size_t total = 0;
    for (uint32_t s = 0; s < ranks; s++) {
        recv_count[s] = counts[(size_t)s * ranks + d];
        recv_displ[s] = (uint32_t)total;
        total += recv_count[s];
    }
    return total;
}

void nf_ep_exchange_sim(uint32_t ranks, const uint32_t *counts, size_t row_bytes, const void *const *send,
                        void *const *recv, int back)
{
    uint32_t sd[NF_EP_MAX_RANKS] = {0}; /* rank s's send displacement to the current d */
    for (uint32_t d = 0; d < ranks; d++) {
        uint32_t rc[NF_EP_MAX_RANKS], rd[NF_EP_MAX_RANKS];
        nf_ep_recv_counts(counts, ranks, d, rc, rd);
        for (uint32_t s = 0; s < ranks; s++) {
            const size_t n = (size_t)rc[s] * row_bytes;
            const uint8_t *from = back ? (const uint8_t *)send[d] + (size_t)rd[s] * row_bytes
                                       : (const uint8_t *)send[s] + (size_t)sd[s] * row_bytes;
            uint8_t *to = back ? (uint8_t *)recv[s] + (size_t)sd[s] * row_bytes : (uint8_t *)recv[d] + (size_t)rd[s] * row_bytes;
            if (n) memcpy(to, from, n);
            sd[s] += rc[s];
        }
    }
}

size_t nf_ep_exchange_plan(uint32_t ranks, const uint32_t *counts, int back, nf_ep_op *ops)
{
    size_t n = 0;
    for (uint32_t a = 0; a < ranks; a++) {
        size_t sd = 0, rd = 0; /* a's first send row to b, its first receive row from b */
        for (uint32_t b = 0; b < ranks; b++) {
            const size_t ab = counts[(size_t)a * ranks + b], ba = counts[(size_t)b * ranks + a];
            /* forward: a's rows for b leave from sd, b's rows for a land at rd; back: the results of
             * b's rows leave from rd, the results of a's own rows land at sd */
            const size_t out = back ? ba : ab, out_at = back ? rd : sd, in = back ? ab : ba, in_at = back ? sd : rd;
            if (out) ops[n++] = (nf_ep_op){a, b, 0, out_at, out};
            if (in) ops[n++] = (nf_ep_op){a, b, 1, in_at, in};
            sd += ab, rd += ba;
        }
    }
    return n;
}

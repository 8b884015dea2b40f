/* Expert parallelism simulated on the CPU (cpu.h, nf_cpu_moe_forward_ep): every rank's stages run
 * here one after another, the exchanges are nf_ep_exchange_sim's copies with the displacements the
 * NCCL calls use, and each rank's experts are a row range of the bank (nf_cpu_weight_rows). */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"

/* One simulated rank's buffers. Shapes: A = max_tokens * k rows of H floats (a rank may receive every
 * row of the batch). */
typedef struct ep_rank {
    nf_cpu_moe_ws *ws;   /* its routing (ids, weights, shared expert) and its experts' scratch */
    nf_ep_send send;     /* its dispatch */
    float *sx, *rx;      /* [A][H] rows sent (x of their token) and received */
    float *res, *back;   /* [A][H] results of the received rows (receive order), returned ones (send order) */
    nf_ep_meta *rmeta;   /* [A] metadata received (what is sent is send.meta) */
    uint32_t *seq_start; /* [max_tokens + 1] its sequences' starts, local */
    uint32_t *key;       /* [max_tokens] each local token's segment key (nf_cpu_moe_key of its batch-wide sequence) */
} ep_rank;

struct nf_cpu_ep_sim {
    nf_ep_layout l;
    size_t max_tokens;
    uint32_t counts[NF_EP_MAX_RANKS * NF_EP_MAX_RANKS]; /* [s][d] rows rank s sends rank d */
    ep_rank r[NF_EP_MAX_RANKS];
};

void nf_cpu_ep_sim_free(nf_cpu_ep_sim *sim)
{
    if (!sim) return;
    for (uint32_t i = 0; i < sim->l.ranks; i++) {
        ep_rank *r = &sim->r[i];
        nf_cpu_moe_ws_free(r->ws);
        nf_ep_send_free(&r->send);
        free(r->sx);
        free(r->rx);
        free(r->res);
        free(r->back);
        free(r->rmeta);
        free(r->seq_start);
        free(r->key);
    }
    free(sim);
}

nf_status nf_cpu_ep_sim_create(const nf_cpu_moe *m, uint32_t ranks, size_t max_tokens, nf_cpu_ep_sim **out,
                               nf_error *err)
{
    *out = NULL;
    nf_cpu_ep_sim *sim = calloc(1, sizeof *sim);
    if (!sim) return nf_error_set(err, NF_ERR_NOMEM, "expert parallelism (simulated): out of memory");
    nf_status st = nf_ep_layout_init(&sim->l, m->experts, ranks, err);
    if (st != NF_OK) {
        free(sim);
        return st;
    }
    sim->max_tokens = max_tokens;
    const size_t A = max_tokens * m->top_k, X = A * m->hidden * sizeof(float);
    for (uint32_t i = 0; i < ranks && st == NF_OK; i++) {
        ep_rank *r = &sim->r[i];
        st = nf_cpu_moe_ws_create(m, max_tokens, &r->ws, err);
        if (st == NF_OK) st = nf_ep_send_alloc(&r->send, A, err);
        if (st != NF_OK) break;
        r->sx = malloc(X ? X : 1), r->rx = malloc(X ? X : 1), r->res = malloc(X ? X : 1), r->back = malloc(X ? X : 1);
        r->rmeta = malloc((A + 1) * sizeof(nf_ep_meta));
        r->seq_start = malloc((max_tokens + 1) * sizeof(uint32_t)), r->key = malloc((max_tokens + 1) * sizeof(uint32_t));
        if (!r->sx || !r->rx || !r->res || !r->back || !r->rmeta || !r->seq_start || !r->key)
            st = nf_error_set(err, NF_ERR_NOMEM, "expert parallelism (simulated): rank %u's buffers for %zu rows: out of memory",
                              i, A);
    }
    if (st != NF_OK) {
        nf_cpu_ep_sim_free(sim);
        return st;
    }
    *out = sim;
    return NF_OK;
}

/* Rank i's sequences [i n / G, (i + 1) n / G) of the batch's n (one when seq_start is NULL): their
 * first token *t0, their local starts and each token's batch-wide sequence id; returns how many. */
static size_t rank_tokens(nf_cpu_ep_sim *sim, uint32_t i, size_t T, const uint32_t *seq_start, size_t n_seqs,
                          size_t *t0)
{
    const uint32_t G = sim->l.ranks;
    const size_t n = seq_start ? n_seqs : 1, s0 = i * n / G, s1 = (i + 1) * n / G;
    /* without seq_start the one sequence is [0, T): starts 0 and T */
    const size_t a = seq_start ? seq_start[s0] : s0 * T;
    ep_rank *r = &sim->r[i];
    for (size_t s = s0; s <= s1; s++) r->seq_start[s - s0] = (uint32_t)((seq_start ? seq_start[s] : s * T) - a);
    for (size_t s = s0; s < s1; s++)
        for (uint32_t t = r->seq_start[s - s0]; t < r->seq_start[s - s0 + 1]; t++)
            r->key[t] = nf_cpu_moe_key((uint32_t)s, r->seq_start[s - s0 + 1] - r->seq_start[s - s0]);
    *t0 = a;
    return s1 - s0;
}

/* Rank i's experts as a block of their own: the bank's row ranges of experts first .. first + n. */
static nf_cpu_moe rank_bank(const nf_cpu_moe *m, const nf_ep_layout *l, uint32_t i)
{
    nf_cpu_moe b = *m;
    const uint32_t e0 = l->first[i], ne = l->first[i + 1] - e0;
    b.experts = ne;
    b.gate_up = nf_cpu_weight_rows(&m->gate_up, e0 * 2 * m->inter, ne * 2 * m->inter);
    b.down = nf_cpu_weight_rows(&m->down, e0 * m->hidden, ne * m->hidden);
    return b;
}

nf_status nf_cpu_moe_forward_ep(nf_cpu *c, const nf_cpu_moe *m, nf_cpu_ep_sim *sim, const float *x, size_t T,
                                const uint32_t *seq_start, size_t n_seqs, float *out, int32_t *ids, nf_error *err)
{
    const uint32_t G = sim->l.ranks, k = m->top_k, H = m->hidden;
    if (T > sim->max_tokens)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "expert parallelism (simulated): %zu tokens for buffers of %zu", T,
                            sim->max_tokens);
    size_t t0[NF_EP_MAX_RANKS], nt[NF_EP_MAX_RANKS], ns[NF_EP_MAX_RANKS];
    /* 1-2. each rank routes its own tokens and builds its dispatch */
    for (uint32_t i = 0; i < G; i++) {
        ep_rank *r = &sim->r[i];
        ns[i] = rank_tokens(sim, i, T, seq_start, n_seqs, &t0[i]);
        nt[i] = r->seq_start[ns[i]];
        if (nt[i]) nf_cpu_moe_route(c, m, r->ws, x + t0[i] * H, nt[i], r->seq_start, ns[i]);
        nf_status st = nf_ep_send_build(&sim->l, nf_cpu_moe_ids(r->ws), nt[i], k, r->key, &r->send, err);
        if (st != NF_OK) return st;
        for (size_t a = 0; a < nt[i] * k; a++) memcpy(r->sx + a * H, x + (t0[i] + r->send.token[a]) * H, H * sizeof(float));
        memcpy(sim->counts + (size_t)i * G, r->send.count, G * sizeof(uint32_t));
    }
    /* 3. the exchange: rows, then their metadata */
    const void *sx[NF_EP_MAX_RANKS] = {0}, *sm[NF_EP_MAX_RANKS] = {0}, *res[NF_EP_MAX_RANKS] = {0};
    void *rx[NF_EP_MAX_RANKS] = {0}, *rm[NF_EP_MAX_RANKS] = {0}, *back[NF_EP_MAX_RANKS] = {0};
    for (uint32_t i = 0; i < G; i++) {
        sx[i] = sim->r[i].sx, sm[i] = sim->r[i].send.meta, res[i] = sim->r[i].res;
        rx[i] = sim->r[i].rx, rm[i] = sim->r[i].rmeta, back[i] = sim->r[i].back;
    }
    nf_ep_exchange_sim(G, sim->counts, H * sizeof(float), sx, rx, 0);
    nf_ep_exchange_sim(G, sim->counts, sizeof(nf_ep_meta), sm, rm, 0);
    /* 4. each rank's experts over what it received */
    for (uint32_t d = 0; d < G; d++) {
        uint32_t rc[NF_EP_MAX_RANKS], rd[NF_EP_MAX_RANKS];
        const size_t n = nf_ep_recv_counts(sim->counts, G, d, rc, rd);
        const nf_cpu_moe b = rank_bank(m, &sim->l, d);
        if (n) nf_cpu_moe_experts(c, &b, sim->r[d].ws, sim->r[d].rx, n, sim->r[d].rmeta, sim->r[d].res);
    }
    /* 5. results back, 6. the shared expert's down and the combine at each token's rank */
    nf_ep_exchange_sim(G, sim->counts, H * sizeof(float), res, back, 1);
    for (uint32_t i = 0; i < G; i++) {
        ep_rank *r = &sim->r[i];
        if (!nt[i]) continue;
        if (m->shared_inter && m->shared_gate_up.rows) {
            const nf_cpu_gemm_job sd = nf_cpu_moe_shared_down_job(m, r->ws, nt[i], r->seq_start, ns[i]);
            nf_cpu_gemm_batch(c, &sd, 1);
        }
        nf_cpu_moe_combine(m, r->ws, nt[i], r->back, r->send.row, out + t0[i] * H);
        if (ids) memcpy(ids + t0[i] * k, nf_cpu_moe_ids(r->ws), nt[i] * k * sizeof(int32_t));
    }
    return NF_OK;
}

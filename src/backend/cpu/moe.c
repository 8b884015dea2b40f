/* The sparse-MoE block on the CPU: router, top-k, tokens grouped by expert, gate_up and down as
 * matrix-matrix products over each expert's group (all experts in one gemm batch), SwiGLU, the
 * weighted combine and qwen2's gated shared expert. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"

void nf_cpu_route(const float *logits, uint32_t E, uint32_t k, int norm, int32_t *ids, float *w)
{
    /* top-k by logit, ties to the lower index: a strict '>' keeps the earlier expert in front */
    for (uint32_t j = 0; j < k; j++) {
        int32_t best = -1;
        for (uint32_t e = 0; e < E; e++) {
            int taken = 0;
            for (uint32_t i = 0; i < j; i++) taken |= ids[i] == (int32_t)e;
            if (taken) continue;
            if (best < 0 || logits[e] > logits[best]) best = (int32_t)e;
        }
        ids[j] = best;
    }
    /* softmax over all E in f32 (max subtracted), then the chosen probabilities */
    float mx = logits[0];
    for (uint32_t e = 1; e < E; e++) mx = logits[e] > mx ? logits[e] : mx;
    double sum = 0;
    for (uint32_t e = 0; e < E; e++) sum += expf(logits[e] - mx);
    float ksum = 0;
    for (uint32_t j = 0; j < k; j++) {
        w[j] = (float)(expf(logits[ids[j]] - mx) / sum);
        ksum += w[j];
    }
    if (norm)
        for (uint32_t j = 0; j < k; j++) w[j] /= ksum;
}

static int moe_has_shared(const nf_cpu_moe *m) { return m->shared_inter && m->shared_gate_up.rows; }

struct nf_cpu_moe_ws {
    size_t max_tokens;
    float *logits;      /* [T][E] */
    int32_t *ids;       /* [T][k] */
    float *w;           /* [T][k] */
    uint32_t *count;    /* [E] tokens routed to each expert */
    uint32_t *start;    /* [E] first grouped slot of each expert */
    uint32_t *slot;     /* [T*k] grouped slot of (token, choice) */
    uint32_t *seq_of;   /* [T*k] the segment key (nf_cpu_moe_key) of each grouped slot's row */
    nf_ep_meta *meta;   /* [T*k] each row's expert and key (the one-rank forward's) */
    uint32_t *seg;      /* [T*k + E] each expert's segments (one per sequence in its group) */
    uint32_t *seg0;     /* [E] first entry of each expert's segments in seg */
    uint32_t *nseg;     /* [E] how many segments each expert's group has */
    uint8_t *seg_step;  /* [T*k + E] beside seg: each segment token by token (its key's low bit) */
    float *xg;          /* [T*k][H] inputs gathered in expert order */
    float *gu;          /* [T*k][2I] */
    float *dn;          /* [T*k][H] */
    float *sg;          /* [T] shared gate logits */
    float *sgu;         /* [T][2S] */
    float *sdn;         /* [T][H] */
    nf_cpu_gemm_job *jobs; /* [E + 2] */
};

void nf_cpu_moe_ws_free(nf_cpu_moe_ws *ws)
{
    if (!ws) return;
    free(ws->logits);
    free(ws->ids);
    free(ws->w);
    free(ws->count);
    free(ws->start);
    free(ws->slot);
    free(ws->seq_of);
    free(ws->meta);
    free(ws->seg);
    free(ws->seg0);
    free(ws->nseg);
    free(ws->seg_step);
    free(ws->xg);
    free(ws->gu);
    free(ws->dn);
    free(ws->sg);
    free(ws->sgu);
    free(ws->sdn);
    free(ws->jobs);
    free(ws);
}

nf_status nf_cpu_moe_ws_create(const nf_cpu_moe *m, size_t T, nf_cpu_moe_ws **out, nf_error *err)
{
    *out = NULL;
    nf_cpu_moe_ws *ws = calloc(1, sizeof *ws);
    if (!ws) return nf_error_set(err, NF_ERR_NOMEM, "moe workspace: out of memory");
    const size_t A = T * m->top_k, H = m->hidden, S = m->shared_inter ? m->shared_inter : 1;
    ws->max_tokens = T;
    ws->logits = malloc(T * m->experts * sizeof(float));
    ws->ids = malloc(A * sizeof(int32_t));
    ws->w = malloc(A * sizeof(float));
    ws->count = malloc(m->experts * sizeof(uint32_t));
    ws->start = malloc(m->experts * sizeof(uint32_t));
    ws->slot = malloc(A * sizeof(uint32_t));
    ws->seq_of = malloc(A * sizeof(uint32_t));
    ws->meta = malloc(A * sizeof(nf_ep_meta));
    ws->seg = malloc((A + m->experts) * sizeof(uint32_t));
    ws->seg0 = malloc(m->experts * sizeof(uint32_t));
    ws->nseg = malloc(m->experts * sizeof(uint32_t));
    ws->seg_step = malloc(A + m->experts);
    ws->xg = malloc(A * H * sizeof(float));
    ws->gu = malloc(A * 2 * m->inter * sizeof(float));
    ws->dn = malloc(A * H * sizeof(float));
    ws->sg = malloc(T * sizeof(float));
    ws->sgu = malloc(T * 2 * S * sizeof(float));
    ws->sdn = malloc(T * H * sizeof(float));
    ws->jobs = malloc((m->experts + 2) * sizeof(nf_cpu_gemm_job));
    if (!ws->logits || !ws->ids || !ws->w || !ws->count || !ws->start || !ws->slot || !ws->seq_of || !ws->meta || !ws->seg ||
        !ws->seg0 || !ws->nseg || !ws->seg_step || !ws->xg || !ws->gu ||
        !ws->dn || !ws->sg || !ws->sgu || !ws->sdn || !ws->jobs) {
        nf_cpu_moe_ws_free(ws);
        return nf_error_set(err, NF_ERR_NOMEM, "moe workspace for %zu tokens (E=%u, k=%u, H=%zu, I=%u): out of memory",
                            T, m->experts, m->top_k, H, m->inter);
    }
    *out = ws;
    return NF_OK;
}

/* Counting sort of n rows by expert, stable: row a (x row x + (a / per_x) H, expert and segment key
 * meta[a]) lands in slot[a]. Rows enter each group in row order, so a sequence's tokens (one key)
 * are consecutive in it. */
static void group_rows(const nf_cpu_moe *m, nf_cpu_moe_ws *ws, const float *x, size_t per_x, size_t n,
                       const nf_ep_meta *meta)
{
    const uint32_t E = m->experts, H = m->hidden;
    memset(ws->count, 0, E * sizeof(uint32_t));
    for (size_t a = 0; a < n; a++) ws->count[meta[a].expert]++;
    uint32_t s = 0;
    for (uint32_t e = 0; e < E; e++) {
        ws->start[e] = s;
        s += ws->count[e];
        ws->count[e] = 0;
    }
    for (size_t a = 0; a < n; a++) {
        const uint32_t e = meta[a].expert, sl = ws->start[e] + ws->count[e]++;
        ws->slot[a] = sl;
        ws->seq_of[sl] = meta[a].key;
        memcpy(ws->xg + (size_t)sl * H, x + (a / per_x) * H, H * sizeof(float));
    }
}

/* Each expert's group cut where the segment key changes: the segments of its gemm jobs. */
static void segment_groups(const nf_cpu_moe *m, nf_cpu_moe_ws *ws)
{
    uint32_t n = 0;
    for (uint32_t e = 0; e < m->experts; e++) {
        const uint32_t s0 = ws->start[e], c = ws->count[e];
        ws->seg0[e] = n;
        ws->nseg[e] = 0;
        if (!c) continue; /* no job: keeps the entries within T*k + E */
        ws->seg_step[n] = ws->seq_of[s0] & 1;
        ws->seg[n++] = 0;
        for (uint32_t i = 1; i < c; i++)
            if (ws->seq_of[s0 + i] != ws->seq_of[s0 + i - 1]) ws->seg_step[n] = ws->seq_of[s0 + i] & 1, ws->seg[n++] = i;
        ws->seg[n++] = c;
        ws->nseg[e] = n - ws->seg0[e] - 1;
    }
}

/* Expert e's job over its group: rows [r0, r0 + rows) of w, grouped inputs at x (row ldx apart). */
static nf_cpu_gemm_job expert_job(const nf_cpu_moe_ws *ws, const nf_cpu_weight *w, uint32_t e, uint32_t r0,
                                  uint32_t rows, const float *x, size_t ldx, float *y, size_t ldy)
{
    const size_t s0 = ws->start[e];
    return (nf_cpu_gemm_job){nf_cpu_weight_rows(w, r0, rows), x + s0 * ldx, ldx, y + s0 * ldy, ldy,
                             ws->count[e], ws->seg + ws->seg0[e], ws->nseg[e], ws->seg_step + ws->seg0[e]};
}

/* The routed experts over the n grouped rows (group_rows): gate_up, SwiGLU, down into ws->dn in slot
 * order. extra (may be NULL) joins the down batch (the shared expert's down, independent of it). */
static void run_experts(nf_cpu *c, const nf_cpu_moe *m, nf_cpu_moe_ws *ws, size_t n, const nf_cpu_gemm_job *extra)
{
    const uint32_t E = m->experts, H = m->hidden, I = m->inter;
    nf_cpu_gemm_job *jobs = ws->jobs;
    size_t nj = 0;
    segment_groups(m, ws);
    for (uint32_t e = 0; e < E; e++)
        if (ws->count[e])
            jobs[nj++] = expert_job(ws, &m->gate_up, e, e * 2 * I, 2 * I, ws->xg, H, ws->gu, 2 * (size_t)I);
    nf_cpu_gemm_batch(c, jobs, nj);
    /* SwiGLU in place: the first I columns of each row become silu(gate) * up */
    for (size_t a = 0; a < n; a++) nf_cpu_swiglu(ws->gu + a * 2 * I, ws->gu + a * 2 * I, ws->gu + a * 2 * I + I, I);
    nj = 0;
    for (uint32_t e = 0; e < E; e++)
        if (ws->count[e]) jobs[nj++] = expert_job(ws, &m->down, e, e * H, H, ws->gu, 2 * (size_t)I, ws->dn, H);
    if (extra) jobs[nj++] = *extra;
    nf_cpu_gemm_batch(c, jobs, nj);
}

void nf_cpu_moe_route(nf_cpu *c, const nf_cpu_moe *m, nf_cpu_moe_ws *ws, const float *x, size_t T,
                      const uint32_t *seq_start, size_t n_seqs)
{
    const uint32_t E = m->experts, k = m->top_k, H = m->hidden, S = m->shared_inter;
    const size_t n_seg = seq_start ? n_seqs : 0; /* seg NULL: one segment */
    nf_cpu_gemm_job *jobs = ws->jobs;
    size_t nj = 0;
    /* router logits, and the shared expert's gate and gate_up (independent of routing) */
    jobs[nj++] = (nf_cpu_gemm_job){m->router, x, H, ws->logits, E, T, seq_start, n_seg, NULL};
    if (moe_has_shared(m)) {
        jobs[nj++] = (nf_cpu_gemm_job){m->shared_gate, x, H, ws->sg, 1, T, seq_start, n_seg, NULL};
        jobs[nj++] = (nf_cpu_gemm_job){m->shared_gate_up, x, H, ws->sgu, 2 * (size_t)S, T, seq_start, n_seg, NULL};
    }
    nf_cpu_gemm_batch(c, jobs, nj);
    for (size_t t = 0; t < T; t++) nf_cpu_route(ws->logits + t * E, E, k, m->norm_topk, ws->ids + t * k, ws->w + t * k);
    if (moe_has_shared(m))
        for (size_t t = 0; t < T; t++) nf_cpu_swiglu(ws->sgu + t * 2 * S, ws->sgu + t * 2 * S, ws->sgu + t * 2 * S + S, S);
}

const int32_t *nf_cpu_moe_ids(const nf_cpu_moe_ws *ws) { return ws->ids; }

nf_cpu_gemm_job nf_cpu_moe_shared_down_job(const nf_cpu_moe *m, nf_cpu_moe_ws *ws, size_t T, const uint32_t *seq_start,
                                           size_t n_seqs)
{
    return (nf_cpu_gemm_job){m->shared_down, ws->sgu, 2 * (size_t)m->shared_inter, ws->sdn, m->hidden, T, seq_start,
                             seq_start ? n_seqs : 0, NULL};
}

void nf_cpu_moe_experts(nf_cpu *c, const nf_cpu_moe *m, nf_cpu_moe_ws *ws, const float *x, size_t n,
                        const nf_ep_meta *meta, float *y)
{
    group_rows(m, ws, x, 1, n, meta);
    run_experts(c, m, ws, n, NULL);
    for (size_t a = 0; a < n; a++)
        memcpy(y + a * m->hidden, ws->dn + (size_t)ws->slot[a] * m->hidden, m->hidden * sizeof(float));
}

void nf_cpu_moe_combine(const nf_cpu_moe *m, const nf_cpu_moe_ws *ws, size_t T, const float *res, const uint32_t *row,
                        float *out)
{
    const uint32_t k = m->top_k, H = m->hidden;
    for (size_t t = 0; t < T; t++) {
        float *o = out + t * H;
        memset(o, 0, H * sizeof(float));
        for (uint32_t j = 0; j < k; j++) {
            const float w = ws->w[t * k + j], *d = res + (size_t)row[t * k + j] * H;
            for (uint32_t i = 0; i < H; i++) o[i] += w * d[i];
        }
        if (moe_has_shared(m)) {
            const float g = 1.0f / (1.0f + expf(-ws->sg[t])), *d = ws->sdn + t * H;
            for (uint32_t i = 0; i < H; i++) o[i] += g * d[i];
        }
    }
}

void nf_cpu_moe_forward(nf_cpu *c, const nf_cpu_moe *m, nf_cpu_moe_ws *ws, const float *x, size_t T,
                        const uint32_t *seq_start, size_t n_seqs, float *out, int32_t *ids_out, float *w_out)
{
    const uint32_t k = m->top_k;
    nf_cpu_moe_route(c, m, ws, x, T, seq_start, n_seqs);
    /* each choice a row of its token's x, keyed by its sequence */
    uint32_t sq = 0;
    for (size_t t = 0; t < T; t++) {
        while (seq_start && t >= seq_start[sq + 1]) sq++;
        const uint32_t key = nf_cpu_moe_key(sq, seq_start ? seq_start[sq + 1] - seq_start[sq] : (uint32_t)T);
        for (uint32_t j = 0; j < k; j++) ws->meta[t * k + j] = (nf_ep_meta){(uint32_t)ws->ids[t * k + j], key};
    }
    group_rows(m, ws, x, k, T * k, ws->meta);
    const nf_cpu_gemm_job sd = nf_cpu_moe_shared_down_job(m, ws, T, seq_start, n_seqs);
    run_experts(c, m, ws, T * k, moe_has_shared(m) ? &sd : NULL);
    nf_cpu_moe_combine(m, ws, T, ws->dn, ws->slot, out);
    if (ids_out) memcpy(ids_out, ws->ids, T * k * sizeof(int32_t));
    if (w_out) memcpy(w_out, ws->w, T * k * sizeof(float));
}

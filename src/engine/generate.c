/* The generation loop with streaming decode, stop strings and speculation (see generate.h). */
#include "engine/generate.h"

#include <stdlib.h>
#include <string.h>

#include "base/timer.h"
#include "engine/spec.h"
#include "engine/stopstream.h"

void nf_engine_truncate(nf_engine *e, uint32_t n)
{
    /* a hybrid's recurrent state holds all n_past positions and cannot rewind: start over */
    if (n < e->n_past) e->n_past = e->model->cfg.n_linear ? 0 : n;
    e->mtp_hidden_pos = 0; /* MTP speculation's kept hidden state (spec.h) is of a position no longer held */
    e->spec_snap_pos = UINT32_MAX; /* and its state copy may no longer lead to what the session holds */
}

/* Room in v for `extra` more ids. */
static nf_status reserve(nf_tok_ids *v, size_t extra, nf_error *err)
{
    if (v->n + extra <= v->cap) return NF_OK;
    size_t cap = v->cap ? v->cap * 2 : 256;
    while (cap < v->n + extra) cap *= 2;
    int32_t *p = realloc(v->ids, cap * sizeof *p);
    if (!p) return nf_error_set(err, NF_ERR_NOMEM, "out of memory");
    v->ids = p;
    v->cap = cap;
    return NF_OK;
}

static nf_status push_ids(nf_tok_ids *v, const int32_t *ids, size_t n, nf_error *err)
{
    nf_status st = reserve(v, n, err);
    if (st) return st;
    memcpy(v->ids + v->n, ids, n * sizeof *ids);
    v->n += n;
    return NF_OK;
}

static int is_eos(const nf_gen_params *p, int32_t id)
{
    for (size_t i = 0; i < p->n_eos; i++)
        if (p->eos[i] == id) return 1;
    return 0;
}

/* One generation: every token the engine's cache takes is appended to seq; q holds the tokens picked and not yet
 * taken, all but the last already fed (accepted drafts). */
typedef struct gen_loop {
    nf_engine *e;
    nf_sampler *s;
    const nf_gen_params *p;
    nf_tok_ids *seq;
    nf_gen_stats *st;
    nf_stop_stream ss;
    nf_gen_emit_fn emit;
    void *ctx;
    float *rows; /* [spec_k + 1][vocab]: a verification's logits */
    int32_t q[NF_SPEC_MAX_K + 1];
    size_t n_q;
    nf_spec_mtp *mtp; /* --spec mtp:K, else NULL */
} gen_loop;

/* Counts and streams one picked token; 1 when it ends generation (st->end says why, or *rc). */
static int take(gen_loop *g, int32_t id, nf_status *rc, nf_error *err)
{
    g->st->gen_tokens++;
    if (is_eos(g->p, id)) {
        g->st->end = NF_GEN_EOS;
        return 1;
    }
    int stopped = 0;
    if ((*rc = nf_stop_stream_put(&g->ss, id, g->emit, g->ctx, &stopped, err))) return 1;
    if (stopped) g->st->end = NF_GEN_STOP;
    return stopped || g->st->gen_tokens == g->p->max_new; /* the last token is not fed: nothing would read its logits */
}

/* How many drafts the next step may verify: the speculation's K, within the context and the tokens
 * still to generate (the step always adds one token of its own). */
static size_t draft_room(const gen_loop *g)
{
    size_t k = g->p->spec_k;
    const size_t ctx_room = g->e->opts.ctx - g->e->n_past - 1, len_room = g->p->max_new - g->st->gen_tokens - 1;
    if (k > ctx_room) k = ctx_room;
    return k < len_room ? k : len_room;
}

/* Feeds id (the last picked token) and picks what follows: q = the accepted drafts and the next token,
 * or, without drafts, one decode and the next token. */
static nf_status advance(gen_loop *g, int32_t id, nf_error *err)
{
    nf_engine *e = g->e;
    nf_tok_ids *seq = g->seq;
    const size_t k = draft_room(g);
    nf_status rc = reserve(seq, 1 + k, err);
    if (rc) return rc;
    const size_t n0 = seq->n;
    const uint32_t past0 = e->n_past;
    seq->ids[seq->n++] = id;
    size_t nd = 0;
    if (g->mtp) rc = nf_spec_mtp_draft_q(g->mtp, g->s, seq->ids, seq->n, k, &nd, err);
    else if (k) nd = nf_spec_draft(seq->ids, seq->n, k, seq->ids + seq->n);
    if (rc) {
        seq->n = n0;
        return rc;
    }
    g->st->forwards++;
    if (nd) {
        seq->n += nd;
        rc = g->mtp ? nf_spec_mtp_verify(g->mtp, g->s, seq->ids, seq->n, nd, g->rows, g->q, &g->n_q, err)
                    : nf_spec_verify(e, g->s, seq->ids, seq->n, nd, g->rows, g->q, &g->n_q, err);
        g->st->drafted += nd;
        if (!rc) g->st->accepted += g->n_q - 1;
    } else if (g->mtp) {
        rc = nf_spec_mtp_decode(g->mtp, id, err);
        g->n_q = 1;
        if (!rc) rc = nf_engine_next(e, g->s, seq->ids, seq->n, &g->q[0], err);
    } else {
        const int defer = e->defer_logits;
        e->defer_logits = 1; /* decode steps: the next nf_engine_next reads what it needs from the device */
        rc = nf_engine_decode(e, id, err);
        e->defer_logits = defer;
        g->n_q = 1;
        if (!rc) rc = nf_engine_next(e, g->s, seq->ids, seq->n, &g->q[0], err);
    }
    seq->n = n0 + (e->n_past - past0); /* what the cache took, also after an error */
    return rc;
}

/* Takes the picked tokens in order; on the one that ends generation, forgets the fed tokens from it on. */
static int take_all(gen_loop *g, nf_status *rc, nf_error *err)
{
    for (size_t i = 0; i < g->n_q; i++) {
        if (!take(g, g->q[i], rc, err)) continue;
        const size_t fed_after = i + 1 < g->n_q ? g->n_q - 1 - i : 0; /* q[i .. n_q - 2] are in the cache */
        const uint32_t keep = g->e->n_past - (uint32_t)fed_after, seq_pos = g->e->n_past - (uint32_t)g->seq->n;
        g->seq->n -= fed_after;
        /* a hybrid's state goes back to the kept tokens (spec.h) */
        nf_status r = !fed_after ? NF_OK
                      : g->mtp   ? nf_spec_mtp_truncate(g->mtp, g->seq->ids, seq_pos, keep, err)
                                 : nf_spec_truncate(g->e, g->seq->ids, seq_pos, keep, err);
        if (r) *rc = r;
        return 1;
    }
    return 0;
}

static void run_loop(gen_loop *g, nf_status *rc, nf_error *err)
{
    g->n_q = 1;
    if (!g->p->max_new || (*rc = nf_engine_next(g->e, g->s, g->seq->ids, g->seq->n, &g->q[0], err))) return;
    while (!take_all(g, rc, err)) {
        if (g->e->n_past >= g->e->opts.ctx) {
            g->st->end = NF_GEN_CONTEXT;
            return;
        }
        if ((*rc = advance(g, g->q[g->n_q - 1], err))) return;
    }
}

/* With speculation: the check and the verification's logits. */
static nf_status spec_setup(gen_loop *g, nf_spec_mtp *mtp, nf_error *err)
{
    if (!g->p->spec_k) return NF_OK;
    nf_status st = g->p->spec_mtp ? nf_spec_mtp_init(mtp, g->e, g->p->spec_k, err)
                                  : nf_spec_check(g->e, NF_SPEC_MODE_NGRAM, g->p->spec_k, err);
    if (st) return st;
    if (g->p->spec_mtp) g->mtp = mtp;
    g->rows = malloc((size_t)(g->p->spec_k + 1) * g->e->model->cfg.vocab * sizeof(float));
    return g->rows ? NF_OK : nf_error_set(err, NF_ERR_NOMEM, "speculation: out of memory");
}

nf_status nf_generate(nf_engine *e, const nf_tokenizer *tok, nf_sampler *s, const int32_t *prompt, size_t n_prompt,
                      const nf_gen_params *p, nf_gen_emit_fn emit, void *ctx, nf_tok_ids *seq, nf_gen_stats *st,
                      nf_error *err)
{
    memset(st, 0, sizeof *st);
    nf_tok_ids own = {0}; /* the sequence when the caller keeps none: the sampler's history and the drafts' source */
    gen_loop g = {.e = e, .s = s, .p = p, .seq = seq ? seq : &own, .st = st, .emit = emit, .ctx = ctx};
    nf_spec_mtp mtp = {0};
    nf_status rc = spec_setup(&g, &mtp, err);
    if (rc || (rc = nf_stop_stream_init(&g.ss, tok, p->stops, p->n_stops, err))) {
        free(g.rows);
        nf_spec_mtp_free(&mtp);
        return rc;
    }
    uint64_t t0 = nf_time_ns();
    rc = g.mtp ? nf_spec_mtp_prefill(g.mtp, prompt, n_prompt, err) : nf_engine_prefill(e, prompt, n_prompt, NULL, err);
    if (!rc) rc = push_ids(g.seq, prompt, n_prompt, err);
    st->prompt_tokens = n_prompt;
    st->prompt_s = (double)(nf_time_ns() - t0) * 1e-9;
    uint64_t t1 = nf_time_ns();
    st->end = NF_GEN_LENGTH;
    if (!rc) run_loop(&g, &rc, err);
    int stopped = 0;
    if (!rc && st->end != NF_GEN_STOP && !(rc = nf_stop_stream_finish(&g.ss, emit, ctx, &stopped, err)) && stopped)
        st->end = NF_GEN_STOP;
    if (!rc && g.mtp) rc = nf_spec_mtp_finish(g.mtp, err); /* the block's keys for the next call */
    st->gen_s = (double)(nf_time_ns() - t1) * 1e-9;
    nf_stop_stream_free(&g.ss);
    nf_spec_mtp_free(&mtp);
    free(g.rows);
    nf_tok_ids_free(&own);
    return rc;
}

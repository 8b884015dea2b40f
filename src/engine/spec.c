/* Prompt-lookup drafting and draft verification (see spec.h). */
#include "engine/spec.h"

#include <stdlib.h>
#include <string.h>

#include "engine/generate.h"

size_t nf_spec_argmax(const float *l, size_t n)
{
    size_t b = 0;
    for (size_t i = 1; i < n; i++)
        if (l[i] > l[b]) b = i;
    return b;
}

nf_status nf_spec_check(const nf_engine *e, nf_spec_mode mode, uint32_t k, nf_error *err)
{
    if (mode == NF_SPEC_MODE_MTP) {
        if (k < 1 || k > NF_SPEC_MTP_MAX_K)
            return nf_error_set(err, NF_ERR_INVALID_ARG, "speculation: %u MTP drafts per step, the range is 1 .. %d", k,
                                NF_SPEC_MTP_MAX_K);
        if (!e->model->mtp)
            return nf_error_set(err, NF_ERR_UNSUPPORTED, "--spec mtp: this model has no MTP block (the checkpoint's "
                                "mtp.* weights; docs/hybrid.md); use --spec ngram:K or none");
        if (!e->ops->mtp || !e->ops->hidden || (e->model->cfg.n_linear && !e->ops->slot_copy))
            return nf_error_set(err, NF_ERR_UNSUPPORTED, "--spec mtp: the %s backend does not run the MTP block", e->ops->name);
        if (!e->opts.mtp)
            return nf_error_set(err, NF_ERR_UNSUPPORTED, "--spec mtp: the engine was created without its MTP block "
                                "(nf_engine_opts.mtp)");
        return NF_OK;
    }
    if (k < 1 || k > NF_SPEC_MAX_K)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "speculation: %u drafts per step, the range is 1 .. %d", k,
                            NF_SPEC_MAX_K);
    if (e->model->cfg.n_linear && !e->ops->slot_copy)
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "speculation: this model has Gated DeltaNet (linear attention) "
                            "layers, whose recurrent state the %s backend cannot copy out and back (the rollback of "
                            "rejected drafts); run without --spec", e->ops->name);
    return NF_OK;
}

nf_status nf_spec_parse(const char *spec, nf_spec_mode *mode, uint32_t *k, nf_error *err)
{
    char *end = NULL;
    const int mtp = strncmp(spec, "mtp:", 4) == 0;
    const size_t skip = mtp ? 4 : 6;
    const long v = mtp || strncmp(spec, "ngram:", 6) == 0 ? strtol(spec + skip, &end, 10) : 0;
    if (!end || end == spec + skip || *end || v < 1 || v > (mtp ? NF_SPEC_MTP_MAX_K : NF_SPEC_MAX_K))
        return nf_error_set(err, NF_ERR_INVALID_ARG, "--spec '%s': expected ngram:K with K in 1 .. %d or mtp:K with K "
                            "in 1 .. %d", spec, NF_SPEC_MAX_K, NF_SPEC_MTP_MAX_K);
    *mode = mtp ? NF_SPEC_MODE_MTP : NF_SPEC_MODE_NGRAM;
    *k = (uint32_t)v;
    return NF_OK;
}

size_t nf_spec_draft(const int32_t *seq, size_t n, size_t k, int32_t *draft)
{
    if (n < NF_SPEC_NGRAM_MIN + 1) return 0;
    for (size_t m = n - 1 < NF_SPEC_NGRAM ? n - 1 : NF_SPEC_NGRAM; m >= NF_SPEC_NGRAM_MIN; m--) {
        /* the latest start j whose m tokens end before the suffix's last one, so one token follows */
        for (size_t j = n - m; j-- > 0;) {
            if (memcmp(seq + j, seq + n - m, m * sizeof *seq)) continue;
            const size_t avail = n - (j + m), take = avail < k ? avail : k;
            memcpy(draft, seq + j + m, take * sizeof *seq);
            return take;
        }
    }
    return 0;
}

/* The drafts tokens[n - n_draft .. n) checked against rows (row i: the logits after tokens[.. first + i]);
 * out: the accepted drafts and the token after them. Returns how many drafts were accepted. */
static size_t accept(nf_sampler *s, const int32_t *tokens, size_t n, size_t n_draft, const float *rows, size_t V,
                     const float *q, int32_t *out)
{
    const size_t first = n - n_draft - 1;
    size_t acc = 0;
    int32_t id;
    /* q: the drafts' proposal rows [n_draft][V] (MTP under sampling), NULL: point masses */
    while (acc < n_draft && nf_sampler_verify_q(s, rows + acc * V, tokens, first + 1 + acc, tokens[first + 1 + acc],
                                                q ? q + acc * V : NULL, &id))
        out[acc++] = id;
    if (acc == n_draft) id = nf_sampler_sample(s, rows + acc * V, tokens, n);
    out[acc] = id;
    return acc;
}

/* The spare of the session's state slot 0 (engine.h slot_copy). */
static uint32_t spare0(const nf_engine *e) { return e->opts.max_seqs; }

/* A hybrid's slot 0 (the session's, holding n_past positions) copied to its spare before a verification,
 * so that rejected drafts can be undone (nf_spec_truncate); attention-only models need none. */
static nf_status snap_save(nf_engine *e, nf_error *err)
{
    e->spec_snap_pos = UINT32_MAX;
    if (!e->model->cfg.n_linear) return NF_OK;
    nf_status st = e->ops->slot_copy(e->state, spare0(e), 0, err);
    if (!st) e->spec_snap_pos = e->n_past;
    return st;
}

nf_status nf_spec_verify(nf_engine *e, nf_sampler *s, const int32_t *tokens, size_t n, size_t n_draft, float *rows,
                         int32_t *out, size_t *n_out, nf_error *err)
{
    if (n_draft > NF_SPEC_MAX_K || n <= n_draft)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "speculation: %zu drafts in a sequence of %zu tokens", n_draft, n);
    nf_status st = nf_spec_check(e, NF_SPEC_MODE_NGRAM, (uint32_t)n_draft, err);
    if (st || (st = snap_save(e, err))) return st;
    const size_t V = e->model->cfg.vocab, first = n - n_draft - 1; /* tokens[first]: the last accepted token */
    const uint32_t past = e->n_past;
    st = nf_engine_prefill(e, tokens + first, n_draft + 1, rows, err);
    if (st) return st;
    const size_t acc = accept(s, tokens, n, n_draft, rows, V, NULL, out);
    *n_out = acc + 1;
    st = nf_spec_truncate(e, tokens + first, past, past + (uint32_t)acc + 1, err);
    memcpy(e->logits, rows + acc * V, V * sizeof(float));
    return st;
}

nf_status nf_spec_truncate(nf_engine *e, const int32_t *toks, uint32_t toks_pos, uint32_t n, nf_error *err)
{
    const uint32_t sp = e->spec_snap_pos;
    if (n >= e->n_past) return NF_OK;
    if (!e->model->cfg.n_linear || sp == UINT32_MAX || n < sp || toks_pos > sp) {
        nf_engine_truncate(e, n); /* attention only: n_past moves back; else nothing saved that far back */
        return NF_OK;
    }
    nf_status st = e->ops->slot_copy(e->state, 0, spare0(e), err);
    if (st) return st;
    e->n_past = sp;
    e->mtp_hidden_pos = 0;
    if (n == sp) return NF_OK;
    const int defer = e->defer_logits;
    e->defer_logits = 0;
    st = nf_engine_prefill(e, toks + (sp - toks_pos), n - sp, NULL, err); /* the kept tokens again */
    e->defer_logits = defer;
    return st;
}

/* ---- MTP ---------------------------------------------------------------------------------------- */

static nf_status mtp_reserve(nf_spec_mtp *m, size_t rows, nf_error *err)
{
    if (rows <= m->cap) return NF_OK;
    float *ph = realloc(m->ph, rows * m->H * sizeof(float));
    if (ph) m->ph = ph;
    int32_t *pt = realloc(m->ptok, rows * sizeof(int32_t));
    if (pt) m->ptok = pt;
    if (!ph || !pt) return nf_error_set(err, NF_ERR_NOMEM, "speculation: out of memory");
    m->cap = rows;
    return NF_OK;
}

nf_status nf_spec_mtp_init(nf_spec_mtp *m, nf_engine *e, uint32_t k, nf_error *err)
{
    memset(m, 0, sizeof *m);
    m->e = e;
    m->k = k;
    m->H = e->model->cfg.hidden;
    m->V = e->model->cfg.vocab;
    m->snap_pos = UINT32_MAX;
    nf_status st = nf_spec_check(e, NF_SPEC_MODE_MTP, k, err);
    if (st) return st;
    m->snap = e->model->cfg.n_linear > 0;
    if (!(m->lg = malloc(m->V * sizeof(float))) || !(m->ho = malloc(2 * m->H * sizeof(float))) ||
        !(m->q = malloc((size_t)k * m->V * sizeof(float))))
        return nf_error_set(err, NF_ERR_NOMEM, "speculation: out of memory");
    st = mtp_reserve(m, 2 * ((size_t)k + 1), err);
    if (st) return st;
    /* the hidden state the last generation left, when the session still ends where it did */
    if (e->mtp_hidden && e->n_past && e->mtp_hidden_pos == e->n_past) {
        memcpy(m->ph, e->mtp_hidden, m->H * sizeof(float));
        m->n_ph = 1;
        m->pos0 = e->n_past - 1;
    } else
        m->pos0 = e->n_past;
    return NF_OK;
}

void nf_spec_mtp_free(nf_spec_mtp *m)
{
    free(m->ph), free(m->ptok), free(m->lg), free(m->ho), free(m->q);
    memset(m, 0, sizeof *m);
}

/* The pending rows must describe positions pos0 .. n_past - 1; a session moved by others starts over. */
static void mtp_sync(nf_spec_mtp *m)
{
    if (m->n_ph && m->pos0 + m->n_ph == m->e->n_past) return;
    m->n_ph = 0;
    m->pos0 = m->e->n_past;
}

/* Appends one token to the pending tokens when it follows a pending position. */
static void mtp_follow(nf_spec_mtp *m, int32_t id)
{
    if (m->n_ph) m->ptok[m->n_ph - 1] = id;
}

nf_status nf_spec_mtp_prefill(nf_spec_mtp *m, const int32_t *tokens, size_t n, nf_error *err)
{
    mtp_sync(m);
    nf_status st = mtp_reserve(m, m->n_ph + n + m->k + 1, err);
    if (st) return st;
    st = nf_engine_prefill_hidden(m->e, tokens, n, NULL, m->ph + m->n_ph * m->H, err);
    if (st) { /* what ran is in the session, its hidden states are not: start the pending rows over */
        m->n_ph = 0;
        m->pos0 = m->e->n_past;
        return st;
    }
    for (size_t i = 0; i < n; i++) {
        mtp_follow(m, tokens[i]);
        m->n_ph++;
    }
    return NF_OK;
}

/* Draft j from the block's logits in m->lg: greedy (s NULL) their argmax; under sampling a draw from
 * the sampler's distribution for them, kept in q row j (hist[n_hist]: the sequence before the draft). */
static int32_t mtp_pick(nf_spec_mtp *m, nf_sampler *s, const int32_t *hist, size_t n_hist, size_t j)
{
    if (!s) return (int32_t)nf_spec_argmax(m->lg, m->V);
    return nf_sampler_draft(s, m->lg, hist, n_hist, m->q + j * m->V);
}

/* The drafts (see nf_spec_mtp_draft_q); s NULL: argmax drafts; hist[n_hist] ends with id and, with s,
 * draft == hist + n_hist. */
static nf_status mtp_draft(nf_spec_mtp *m, nf_sampler *s, const int32_t *hist, size_t n_hist, int32_t id, size_t k,
                           int32_t *draft, size_t *n_draft, nf_error *err)
{
    *n_draft = 0;
    m->n_q = 0;
    mtp_sync(m);
    if (!m->n_ph || !k) return NF_OK;
    if (k > m->k) k = m->k; /* the q rows are sized for m->k */
    nf_status st = mtp_reserve(m, m->n_ph + 1, err);
    if (st) return st;
    mtp_follow(m, id);
    const size_t P = m->n_ph, H = m->H;
    st = nf_engine_mtp(m->e, m->ptok, m->ph, P, m->pos0, 0, m->lg, m->ho, err); /* the last row's logits */
    if (st) return st;
    /* the block's entries up to position pos0 + P - 1 are final: nothing is pending until the verification */
    const uint32_t last = m->pos0 + (uint32_t)P - 1;
    draft[0] = mtp_pick(m, s, hist, n_hist, 0);
    for (size_t j = 1; j < k; j++) { /* chained: position last + j takes the previous output and draft */
        float *in = m->ho + (j - 1) % 2 * H, *out = m->ho + j % 2 * H;
        st = nf_engine_mtp(m->e, &draft[j - 1], in, 1, last + (uint32_t)j, 0, m->lg, out, err);
        if (st) return st;
        draft[j] = mtp_pick(m, s, hist, n_hist + j, j);
    }
    m->n_ph = 0;
    m->pos0 = m->e->n_past;
    m->n_q = s ? k : 0;
    *n_draft = k;
    return NF_OK;
}

nf_status nf_spec_mtp_draft(nf_spec_mtp *m, int32_t id, size_t k, int32_t *draft, size_t *n_draft, nf_error *err)
{
    return mtp_draft(m, NULL, NULL, 0, id, k, draft, n_draft, err);
}

nf_status nf_spec_mtp_draft_q(nf_spec_mtp *m, nf_sampler *s, int32_t *seq, size_t n, size_t k, size_t *n_draft,
                              nf_error *err)
{
    if (!n) return nf_error_set(err, NF_ERR_INVALID_ARG, "speculation: drafting after an empty sequence");
    return mtp_draft(m, s && !nf_sampler_greedy(s) ? s : NULL, seq, n, seq[n - 1], k, seq + n, n_draft, err);
}

nf_status nf_spec_mtp_verify(nf_spec_mtp *m, nf_sampler *s, const int32_t *tokens, size_t n, size_t n_draft,
                             float *rows, int32_t *out, size_t *n_out, nf_error *err)
{
    nf_engine *e = m->e;
    if (n_draft < 1 || n_draft > m->k || n <= n_draft)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "speculation: %zu drafts in a sequence of %zu tokens", n_draft, n);
    nf_status st = mtp_reserve(m, n_draft + 1, err);
    if (st) return st;
    const size_t V = m->V, first = n - n_draft - 1;
    const uint32_t past = e->n_past;
    m->snap_pos = UINT32_MAX;
    if (m->snap) { /* the session's slot 0 (past positions) to its spare, which ngram's copy no longer holds */
        e->spec_snap_pos = UINT32_MAX;
        if ((st = e->ops->slot_copy(e->state, spare0(e), 0, err))) return st;
        m->snap_pos = past;
    }
    st = nf_engine_prefill_hidden(e, tokens + first, n_draft + 1, rows, m->ph, err);
    if (st) return st;
    const size_t acc = accept(s, tokens, n, n_draft, rows, V, m->n_q >= n_draft ? m->q : NULL, out);
    m->n_q = 0;
    *n_out = acc + 1;
    m->pos0 = past;
    m->n_ph = acc + 1; /* the verification's hidden states are the accepted positions' */
    for (size_t i = 0; i < acc; i++) m->ptok[i] = tokens[first + 1 + i];
    if (acc < n_draft) {
        if (m->snap) { /* the recurrent state went past the rejected drafts: back, and the kept tokens again */
            if ((st = nf_spec_mtp_truncate(m, tokens + first, past, past + (uint32_t)acc + 1, err))) return st;
        } else
            nf_engine_truncate(e, past + (uint32_t)acc + 1);
    }
    memcpy(e->logits, rows + acc * V, V * sizeof(float));
    return NF_OK;
}

nf_status nf_spec_mtp_truncate(nf_spec_mtp *m, const int32_t *toks, uint32_t toks_pos, uint32_t n, nf_error *err)
{
    nf_engine *e = m->e;
    if (n >= e->n_past) return NF_OK;
    if (!m->snap || m->snap_pos == UINT32_MAX || n < m->snap_pos || toks_pos > m->snap_pos) {
        nf_engine_truncate(e, n); /* no recurrent state, or nothing saved that far back */
        mtp_sync(m);
        return NF_OK;
    }
    /* the state before the last verification, then the kept tokens again (their hidden states pending) */
    nf_status st = e->ops->slot_copy(e->state, 0, spare0(e), err);
    if (st) return st;
    e->n_past = m->snap_pos;
    m->pos0 = m->snap_pos;
    m->n_ph = 0;
    if (n == m->snap_pos) return NF_OK;
    const int defer = e->defer_logits;
    e->defer_logits = 0;
    const int32_t *kept = toks + (m->snap_pos - toks_pos);
    st = nf_engine_prefill_hidden(e, kept, n - m->snap_pos, NULL, m->ph, err);
    e->defer_logits = defer;
    if (st) return st;
    m->n_ph = n - m->snap_pos;
    for (size_t i = 0; i + 1 < m->n_ph; i++) m->ptok[i] = kept[1 + i];
    return NF_OK;
}

nf_status nf_spec_mtp_decode(nf_spec_mtp *m, int32_t id, nf_error *err)
{
    mtp_sync(m);
    nf_status st = mtp_reserve(m, m->n_ph + 1, err);
    if (st) return st;
    st = nf_engine_prefill_hidden(m->e, &id, 1, NULL, m->ph + m->n_ph * m->H, err);
    if (st) {
        m->n_ph = 0;
        m->pos0 = m->e->n_past;
        return st;
    }
    mtp_follow(m, id);
    m->n_ph++;
    return NF_OK;
}

nf_status nf_spec_mtp_finish(nf_spec_mtp *m, nf_error *err)
{
    nf_engine *e = m->e;
    mtp_sync(m);
    if (!m->n_ph) return NF_OK;
    if (m->n_ph > 1) {
        nf_status st = nf_engine_mtp(e, m->ptok, m->ph, m->n_ph - 1, m->pos0, 0, m->lg, NULL, err);
        if (st) return st;
    }
    if (!e->mtp_hidden && !(e->mtp_hidden = malloc(m->H * sizeof(float))))
        return nf_error_set(err, NF_ERR_NOMEM, "speculation: out of memory");
    memcpy(e->mtp_hidden, m->ph + (m->n_ph - 1) * m->H, m->H * sizeof(float));
    e->mtp_hidden_pos = e->n_past;
    m->pos0 += (uint32_t)m->n_ph - 1;
    memmove(m->ph, m->ph + (m->n_ph - 1) * m->H, m->H * sizeof(float));
    m->n_ph = 1;
    return NF_OK;
}

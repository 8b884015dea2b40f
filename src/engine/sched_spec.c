/* Speculative decoding in the scheduler (docs/sched.md "Speculation"): a decoding sequence's drafts
 * go into the step's one forward after its token, with the logits of every verification position
 * (nf_batch.logit_rows); acceptance per sequence by nf_sampler_verify_q (engine/spec.h: greedy gives
 * the same tokens, sampling the same distribution; the MTP block's drafts under sampling are drawn
 * from its sampler distribution and verified against it, the others are point masses); rejected positions rolled back: n_cached stops at
 * the kept tokens, the pages past them go back to the pool, and a hybrid's state slot is restored to
 * its copy from before the forward, the kept tokens then fed again at the sequence's next decode. */
#include "engine/sched_internal.h"

#include <stdlib.h>
#include <string.h>

nf_status nf_sched_check_spec(const nf_sched *s, const nf_seq_params *p, nf_error *err)
{
    if (!p->spec_k) return NF_OK;
    const uint32_t most = p->spec_mtp ? NF_SPEC_MTP_MAX_K : NF_SPEC_MAX_K;
    if (p->spec_k > most)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "sched: %u %s drafts per step, the range is 1 .. %u", p->spec_k,
                            p->spec_mtp ? "mtp" : "ngram", most);
    if (!s->be.logit_rows)
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "sched: speculation needs a backend whose forward returns several "
                            "positions' logits of one sequence (nf_batch.logit_rows); this one does not yet");
    if (s->o.state_slots && !s->be.slot_copy)
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "sched: speculation on a model with recurrent state needs the "
                            "backend's slot_copy (the rollback of rejected drafts)");
    if (p->spec_mtp && !s->o.mtp_hidden)
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "sched: mtp speculation: the model has no MTP block, the backend "
                            "does not run it, or the engine did not load it (nf_engine_opts.mtp; docs/hybrid.md); "
                            "use ngram:K");
    return NF_OK;
}

/* The drafts q may verify after u uncached tokens: K, less what a verification of at most K + 1
 * positions leaves, within the context and the tokens still to generate (a step adds one of its own).
 * Only the sequence's own state decides, never the batch. */
static uint32_t draft_room(const nf_sched *s, const seq *q, uint32_t u)
{
    if (!q->spec_k || u > q->spec_k) return 0;
    size_t k = q->spec_k + 1 - u;
    const size_t ctx_room = s->o.ctx > q->n ? s->o.ctx - q->n : 0;
    if (k > ctx_room) k = ctx_room;
    if (q->p.max_new && k > q->p.max_new - q->n_gen - 1) k = q->p.max_new - q->n_gen - 1;
    return (uint32_t)k;
}

uint32_t nf_sched_spec_drafts(const nf_sched *s, seq *q, uint32_t u)
{
    const uint32_t k = draft_room(s, q, u);
    q->draft_q = NULL;
    if (!k) return 0;
    if (!q->spec_mtp && q->p.draft) {
        const uint32_t d = q->p.draft(q->p.draft_ctx, q->toks, q->n, k, q->draft);
        return d < k ? d : k;
    }
    if (!q->spec_mtp) return (uint32_t)nf_spec_draft(q->toks, q->n, k, q->draft);
    if (q->mtp_at != q->n) return 0; /* the block's drafts are for another point of the sequence */
    const uint32_t d = q->n_mtp < k ? q->n_mtp : k;
    memcpy(q->draft, q->mtp_draft, d * sizeof *q->draft);
    q->draft_q = nf_sampler_greedy(q->sampler) ? NULL : q->mtp_q; /* drawn from these rows (mtp_pick) */
    return d;
}

float *nf_sched_spec_logits(nf_sched *s, size_t rows)
{
    if (rows <= s->spec_cap) return s->spec_logits;
    float *l = realloc(s->spec_logits, rows * s->o.vocab * sizeof *l);
    if (!l) return NULL;
    s->spec_logits = l;
    s->spec_cap = rows;
    return l;
}

/* Each drafting sequence's slot to its spare (slot + max_seqs: engine.h slot_copy), with the positions it
 * holds; a sequence at position 0 starts its slot afresh anyway. */
nf_status nf_sched_spec_save(nf_sched *s, const plan *b, nf_error *err)
{
    if (!s->o.state_slots) return NF_OK;
    for (uint32_t i = 0; i < b->S; i++) {
        const seq *q = s->batch[i];
        nf_status rc = q->n_draft ? s->be.slot_copy(s->be.state, q->slot + s->o.max_seqs, q->slot, err) : NF_OK;
        if (rc) return rc;
    }
    return NF_OK;
}

/* Pages past the ones holding positions 0 .. n - 1 go back (a verification's rejected tail); under
 * opts.reserve they return to the sequence's reservation, which covered them. */
static void trim_pages(nf_sched *s, seq *q)
{
    const uint32_t pt = s->o.page_tokens, keep = (uint32_t)((q->n + pt - 1) / pt);
    while (q->n_pages > keep) {
        nf_kvpool_release(s->pool, q->pages[--q->n_pages]);
        if (s->o.reserve) q->reserved++, s->reserved++;
    }
}

nf_status nf_sched_spec_accept(nf_sched *s, seq *q, const float *rows, nf_sched_step_info *info, nf_error *err)
{
    const uint32_t V = s->o.vocab, d = q->n_draft;
    uint32_t a = 0; /* drafts accepted */
    info->n_verified++;
    info->n_drafted += d;
    for (int ok = 1; ok && q->state == SEQ_ACTIVE; a += (uint32_t)ok) {
        const float *l = rows + (size_t)a * V; /* the logits after the last kept token */
        size_t nh;
        const int32_t *h = nf_sched_pen_hist(q, &nh);
        int32_t id = -1;
        const float *qa = q->draft_q ? q->draft_q + (size_t)a * V : NULL;
        ok = a < d && nf_sampler_verify_q(q->sampler, l, h, nh, q->draft[a], qa, &id);
        if (a == d) id = nf_sampler_sample(q->sampler, l, h, nh);
        if (q->p.logprobs) nf_sched_logprobs(q, l, V, id);
        nf_status rc = nf_sched_accept_token(s, q, id, info, err);
        if (rc) return rc;
    }
    info->n_accepted += a;
    if (q->state != SEQ_ACTIVE) return NF_OK; /* ended (pages gone) or cancelled by its callback */
    q->kept += a;
    q->n_cached = q->n - 1; /* the kept tokens' keys and values are right; the new token is uncached */
    if (a < d && s->o.state_slots) { /* the state absorbed the rejected drafts: back, and the kept tokens again */
        nf_status rc = s->be.slot_copy(s->be.state, q->slot, q->slot + s->o.max_seqs, err);
        if (rc) return rc;
        q->n_cached = q->c0;
        q->redo = (uint32_t)(q->n - 1 - q->c0);
    }
    trim_pages(s, q);
    return NF_OK;
}

/* ---- MTP ---------------------------------------------------------------------------------------- */

/* The block over the batch in s's buffers (S sequences, T tokens of s->mtp_tok, input rows s->hid_in):
 * each sequence's last row's logits into s->logits, its output row into s->hid. */
static nf_status mtp_run(nf_sched *s, uint32_t S, uint32_t T, nf_error *err)
{
    s->seq_start[S] = T;
    const nf_batch mb = {.n_tokens = T, .n_seqs = S, .tokens = s->mtp_tok, .seq_start = s->seq_start, .pos0 = s->pos0,
                         .pages = s->pages, .page_stride = s->page_stride};
    return s->be.mtp(s->be.state, &mb, s->hid_in, s->logits, s->hid, err);
}

/* Sequence q into the block's batch as its S-th sequence, from position pos0, with its page table. */
static void mtp_add(nf_sched *s, seq *q, uint32_t S, uint32_t T, size_t pos0)
{
    s->mtp_seqs[S] = q;
    s->seq_start[S] = T;
    s->pos0[S] = (uint32_t)pos0;
    memcpy(s->pages + (size_t)S * s->page_stride, q->pages, q->n_pages * sizeof *s->pages);
}

/* The block over each MTP sequence's positions whose next token became final in this step
 * [max(mtp_done, c0), c0 + kept), from the forward's hidden states (s->hid, batch order). Returns
 * the sequences in s->mtp_seqs. */
static nf_status mtp_catch_up(nf_sched *s, const plan *b, uint32_t *n_seqs, nf_error *err)
{
    const size_t H = s->o.mtp_hidden;
    uint32_t S = 0, T = 0;
    for (uint32_t i = 0; i < b->S; i++) {
        seq *q = s->batch[i];
        const uint32_t t_main = s->seq_start[i]; /* read before mtp_add writes entry S <= i */
        if (!q->spec_mtp || !q->spec_k || q->state != SEQ_ACTIVE) continue;
        /* below c0 only after a gap (a prefix from the cache): its entries came with the pages */
        const size_t from = q->mtp_done > q->c0 ? q->mtp_done : q->c0, to = (size_t)q->c0 + q->kept;
        q->n_mtp = 0;
        if (from >= to) continue;
        mtp_add(s, q, S++, T, from);
        for (size_t p = from; p < to; p++, T++) {
            s->mtp_tok[T] = q->toks[p + 1];
            memcpy(s->hid_in + T * H, s->hid + (t_main + p - q->c0) * H, H * sizeof *s->hid);
        }
        q->mtp_done = to;
    }
    *n_seqs = S;
    return S ? mtp_run(s, S, T, err) : NF_OK;
}

/* q's draft j from the block's logits l: greedy their argmax; under sampling a draw from the
 * distribution q's sampler gives them (its history the sequence's, without the drafts before j: any
 * q is exact as long as the draft is drawn from it), the row kept for nf_sampler_verify_q. */
static nf_status mtp_pick(const nf_sched *s, seq *q, const float *l, uint32_t j, nf_error *err)
{
    const size_t V = s->o.vocab;
    if (nf_sampler_greedy(q->sampler)) {
        q->mtp_draft[j] = (int32_t)nf_spec_argmax(l, V);
        return NF_OK;
    }
    if (!q->mtp_q && !(q->mtp_q = malloc(NF_SPEC_MTP_MAX_K * V * sizeof *q->mtp_q)))
        return nf_error_set(err, NF_ERR_NOMEM, "sched: out of memory for the MTP drafts' distributions");
    size_t nh;
    const int32_t *h = nf_sched_pen_hist(q, &nh);
    q->mtp_draft[j] = nf_sampler_draft(q->sampler, l, h, nh, q->mtp_q + j * V);
    return NF_OK;
}

/* After the catch-up: draft 1 of each sequence that decodes next from its last row; then drafts 2 ..
 * chained (the block at the next position fed its own output and the draft just made), each link for
 * the sequences that still want one and have the page. */
static nf_status mtp_chain(nf_sched *s, uint32_t S, nf_error *err)
{
    const size_t H = s->o.mtp_hidden, V = s->o.vocab;
    uint32_t n = 0;
    for (uint32_t j = 0; j < S; j++) {
        seq *q = s->mtp_seqs[j];
        if (q->mtp_done + 1 != q->n) continue; /* mid-prompt: its next token is not sampled yet */
        nf_status rc = mtp_pick(s, q, s->logits + j * V, 0, err);
        if (rc) return rc;
        q->n_mtp = 1;
        q->mtp_at = q->n;
        memmove(s->hid_in + n * H, s->hid + j * H, H * sizeof *s->hid);
        s->mtp_seqs[n++] = q;
    }
    for (uint32_t link = 1; n; link++) {
        uint32_t m = 0;
        for (uint32_t j = 0; j < n; j++) {
            seq *q = s->mtp_seqs[j];
            const size_t pos = q->n - 2 + link; /* the block at pos reads draft `link` and predicts pos + 2 */
            nf_status rc;
            if (draft_room(s, q, 1) <= link ||
                nf_sched_ensure_pages(s, q, (uint32_t)(pos + 1 - q->n_cached), &rc, err) < pos + 1 - q->n_cached)
                continue; /* enough drafts, or no page for the link (the pool is dry) */
            memmove(s->hid_in + m * H, s->hid_in + j * H, H * sizeof *s->hid);
            s->mtp_tok[m] = q->mtp_draft[link - 1];
            mtp_add(s, q, m, m, pos);
            m++;
        }
        nf_status rc = m ? mtp_run(s, m, m, err) : NF_OK;
        if (rc) return rc;
        for (uint32_t j = 0; j < m && !rc; j++) {
            seq *q = s->mtp_seqs[j];
            rc = mtp_pick(s, q, s->logits + j * V, q->n_mtp, err);
            q->n_mtp += !rc;
        }
        if (rc) return rc;
        memcpy(s->hid_in, s->hid, m * H * sizeof *s->hid);
        n = m;
    }
    return NF_OK;
}

nf_status nf_sched_spec_mtp(nf_sched *s, const plan *b, nf_error *err)
{
    uint32_t S;
    nf_status rc = mtp_catch_up(s, b, &S, err);
    return rc ? rc : mtp_chain(s, S, err);
}

/* The continuous-batching scheduler (see sched.h for the step and docs/sched.md for the policy). */
#include "engine/sched.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/timer.h"
#include "engine/sched_internal.h"

const char *nf_seq_end_name(nf_seq_end e)
{
    static const char *const names[] = {"running", "length", "eos", "stop", "context", "cancelled", "no-pages"};
    return (unsigned)e < sizeof names / sizeof names[0] ? names[e] : "?";
}

nf_kvpool *nf_sched_pool(nf_sched *s) { return s->pool; }
int nf_sched_prefix_cache(const nf_sched *s) { return !s->o.no_prefix_cache; }

static nf_status check_opts(const nf_sched_backend *be, const nf_sched_opts *o, nf_error *err)
{
    if (!be->forward || !be->copy_page)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "sched: the backend needs forward and copy_page");
    if ((be->logits == NULL) != (be->topk == NULL))
        return nf_error_set(err, NF_ERR_INVALID_ARG, "sched: a backend keeping logits needs both logits and topk");
    if (be->penalize && !be->topk) return nf_error_set(err, NF_ERR_INVALID_ARG, "sched: penalize needs topk");
    if (!o->vocab || !o->ctx || !o->chunk || !o->max_seqs || !o->page_tokens || !o->kv_pages)
        return nf_error_set(err, NF_ERR_INVALID_ARG,
                            "sched: vocab %u, ctx %u, chunk %u, max_seqs %u, page_tokens %u, kv_pages %u (all must be > 0)",
                            o->vocab, o->ctx, o->chunk, o->max_seqs, o->page_tokens, o->kv_pages);
    const uint32_t align = o->piece_align ? o->piece_align : 1;
    if (o->state_slots && !o->no_prefix_cache && (!be->slot_copy || !o->state_snaps || o->page_tokens % align))
        return nf_error_set(err, NF_ERR_INVALID_ARG, "sched: the prefix cache of a backend with recurrent state slots "
                            "needs slot_copy, state_snaps > 0 (%u) and pages of a multiple of piece_align (%u, %u) "
                            "(or no_prefix_cache)", o->state_snaps, o->page_tokens, align);
    return NF_OK;
}

nf_status nf_sched_create(const nf_sched_backend *be, const nf_sched_opts *o, nf_sched **out, nf_error *err)
{
    *out = NULL;
    nf_status rc = check_opts(be, o, err);
    if (rc) return rc;
    nf_sched *s = calloc(1, sizeof *s);
    if (!s) return nf_error_set(err, NF_ERR_NOMEM, "sched: out of memory");
    s->be = *be;
    s->o = *o;
    s->page_stride = (o->ctx + o->page_tokens - 1) / o->page_tokens;
    s->next_id = 1;
    nf_kvpool_opts po = {.pages = o->kv_pages, .page_tokens = o->page_tokens,
                         .snaps = o->state_slots && !o->no_prefix_cache ? o->state_snaps : 0};
    if ((rc = nf_kvpool_create(&po, &s->pool, err))) {
        free(s);
        return rc;
    }
    const size_t S = o->max_seqs;
    s->tokens = malloc(o->chunk * sizeof *s->tokens);
    s->seq_start = malloc((S + 1) * sizeof *s->seq_start);
    s->pos0 = malloc(S * sizeof *s->pos0);
    s->pages = malloc(S * s->page_stride * sizeof *s->pages);
    s->batch = malloc(S * sizeof *s->batch);
    s->slots = malloc(S * sizeof *s->slots);
    s->slot_used = calloc(S, 1);
    s->logits = malloc(S * o->vocab * sizeof *s->logits);
    s->top_ids = malloc(S * NF_SAMPLER_DEVICE_MAX_K * sizeof *s->top_ids);
    s->top_vals = malloc(S * NF_SAMPLER_DEVICE_MAX_K * sizeof *s->top_vals);
    s->rows = malloc(S * sizeof *s->rows);
    s->row0 = malloc(S * sizeof *s->row0);
    if (o->mtp_hidden) {
        s->hid = malloc((size_t)o->chunk * o->mtp_hidden * sizeof *s->hid);
        s->hid_in = malloc((size_t)o->chunk * o->mtp_hidden * sizeof *s->hid_in);
        s->mtp_tok = malloc(o->chunk * sizeof *s->mtp_tok);
        s->mtp_seqs = malloc(S * sizeof *s->mtp_seqs);
    }
    if ((o->mtp_hidden && (!s->hid || !s->hid_in || !s->mtp_tok || !s->mtp_seqs)) || !s->rows || !s->row0 || !s->tokens || !s->seq_start || !s->pos0 || !s->pages || !s->batch || !s->slots || !s->slot_used || !s->logits ||
        !s->top_ids || !s->top_vals) {
        nf_sched_free(s);
        return nf_error_set(err, NF_ERR_NOMEM, "sched: out of memory for %u sequences of %u tokens", o->max_seqs,
                            o->chunk);
    }
    *out = s;
    return NF_OK;
}

nf_status nf_sched_create_engine(nf_engine *e, const nf_sched_opts *o, nf_sched **out, nf_error *err)
{
    const nf_backend_ops *ops = e->ops;
    const nf_sched_backend be = {e->state, ops->forward, ops->logits, ops->topk, ops->copy_page, ops->penalize,
                                 ops->logit_rows, ops->slot_copy, ops->hidden, ops->mtp};
    nf_sched_opts so = o ? *o : (nf_sched_opts){0};
    so.vocab = e->model->cfg.vocab;
    so.ctx = e->opts.ctx;
    so.chunk = e->opts.chunk;
    so.max_seqs = e->opts.max_seqs;
    so.page_tokens = e->opts.page_tokens;
    so.kv_pages = e->opts.kv_pages;
    so.state_slots = e->model->cfg.n_linear > 0;
    so.piece_min = ops->prefill_min;
    so.piece_align = so.state_slots && e->opts.gdn_chunk ? e->opts.gdn_chunk : 1;
    so.state_snaps = e->opts.state_snaps;
    if (so.state_slots && (!ops->slot_copy || so.page_tokens % so.piece_align))
        so.no_prefix_cache = 1; /* no snapshots, or a restored state would start a segment off its chunk grid */
    so.mtp_hidden = nf_engine_has_mtp(e) && ops->hidden ? e->model->cfg.hidden : 0;
    return nf_sched_create(&be, &so, out, err);
}

/* Pages and state slot back (ended, preempted, or not admitted after all). */
void nf_sched_release_pages(nf_sched *s, seq *q)
{
    if (q->slot != NO_SLOT) s->slot_used[q->slot] = 0;
    q->slot = NO_SLOT;
    s->reserved -= q->reserved;
    q->reserved = 0;
    for (uint32_t j = 0; j < q->n_pages; j++) nf_kvpool_release(s->pool, q->pages[j]);
    q->n_pages = 0;
    q->n_cached = 0;
    q->n_published = 0;
    q->redo = q->n_draft = q->n_mtp = 0; /* speculation starts over with the recompute */
    q->snap_cut = 0;
    q->snap_dec = NF_KVPOOL_NONE;
    q->mtp_done = 0;
}

static void seq_free(nf_sched *s, seq *q)
{
    if (!q) return;
    nf_sched_release_pages(s, q);
    for (size_t i = 0; q->stops && i < q->p.n_stops; i++) free(q->stops[i]);
    free(q->stops);
    free(q->eos);
    free(q->toks);
    free(q->pages);
    free(q->mtp_q);
    nf_sampler_free(q->sampler);
    if (q->has_text) nf_stop_stream_free(&q->ss);
    free(q);
}

void nf_sched_free(nf_sched *s)
{
    if (!s) return;
    for (size_t i = 0; i < s->n_seqs; i++) seq_free(s, s->seqs[i]);
    free(s->seqs);
    free(s->order);
    free(s->tokens);
    free(s->seq_start);
    free(s->pos0);
    free(s->pages);
    free(s->batch);
    free(s->slots);
    free(s->slot_used);
    free(s->logits);
    nf_penalty_lists_free(&s->pen);
    free(s->top_ids);
    free(s->top_vals);
    free(s->rows);
    free(s->row0);
    free(s->spec_logits);
    free(s->hid);
    free(s->hid_in);
    free(s->mtp_tok);
    free(s->mtp_seqs);
    nf_kvpool_free(s->pool);
    free(s);
}

static seq *find_seq(const nf_sched *s, uint64_t id)
{
    for (size_t i = 0; i < s->n_seqs; i++)
        if (s->seqs[i]->id == id) return s->seqs[i];
    return NULL;
}

static nf_status push_tok(seq *q, int32_t id, nf_error *err)
{
    if (q->n == q->cap) {
        size_t cap = q->cap ? q->cap * 2 : 64;
        int32_t *p = realloc(q->toks, cap * sizeof *p);
        if (!p) return nf_error_set(err, NF_ERR_NOMEM, "sched: out of memory");
        q->toks = p;
        q->cap = cap;
    }
    q->toks[q->n++] = id;
    return NF_OK;
}

/* The owned copies of eos ids and stop strings. */
static nf_status copy_stops(seq *q, const nf_seq_params *p, nf_error *err)
{
    if (p->n_eos && !(q->eos = malloc(p->n_eos * sizeof *q->eos))) return nf_error_set(err, NF_ERR_NOMEM, "sched: out of memory");
    if (p->n_eos) memcpy(q->eos, p->eos, p->n_eos * sizeof *q->eos);
    if (p->n_stops && !(q->stops = calloc(p->n_stops, sizeof *q->stops)))
        return nf_error_set(err, NF_ERR_NOMEM, "sched: out of memory");
    for (size_t i = 0; i < p->n_stops; i++) {
        size_t len = strlen(p->stops[i]);
        if (!(q->stops[i] = malloc(len + 1))) return nf_error_set(err, NF_ERR_NOMEM, "sched: out of memory");
        memcpy(q->stops[i], p->stops[i], len + 1);
    }
    q->p.eos = q->eos;
    q->p.stops = (const char *const *)q->stops;
    return NF_OK;
}

static nf_status check_add(const nf_sched *s, const int32_t *prompt, size_t n, const nf_seq_params *p, nf_error *err)
{
    if (!n || n > s->o.ctx)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "sched: a prompt of %zu tokens (1 .. the context, %u)", n, s->o.ctx);
    for (size_t i = 0; i < n; i++)
        if (prompt[i] < 0 || (uint32_t)prompt[i] >= s->o.vocab)
            return nf_error_set(err, NF_ERR_INVALID_ARG, "sched: prompt[%zu] = %d is not below the vocabulary (%u)", i,
                                prompt[i], s->o.vocab);
    if (p->n_stops && !s->o.tok)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "sched: stop strings need a tokenizer (nf_sched_opts.tok)");
    if (p->logprobs && p->top_logprobs > NF_SEQ_MAX_TOP_LOGPROBS)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "sched: top_logprobs %u (at most %d)", p->top_logprobs,
                            NF_SEQ_MAX_TOP_LOGPROBS);
    return nf_sched_check_spec(s, p, err);
}

static nf_status seq_init(nf_sched *s, seq *q, const int32_t *prompt, size_t n, const nf_seq_params *p, nf_error *err)
{
    q->p = *p;
    q->p.eos = NULL;
    q->p.stops = NULL;
    nf_status rc = copy_stops(q, p, err);
    if (!rc && !(q->pages = malloc(s->page_stride * sizeof *q->pages)))
        rc = nf_error_set(err, NF_ERR_NOMEM, "sched: out of memory");
    for (size_t i = 0; !rc && i < n; i++) rc = push_tok(q, prompt[i], err);
    if (!rc) rc = nf_sampler_create(&p->sampling, s->o.vocab, &q->sampler, err);
    if (!rc && s->o.tok) {
        rc = nf_stop_stream_init(&q->ss, s->o.tok, q->p.stops, q->p.n_stops, err);
        q->has_text = rc == NF_OK;
    }
    q->n_prompt = n;
    /* a verification of K + 1 positions must fit one forward: K is capped by the chunk, for every step
     * alike (so the drafts a sequence makes never depend on the batch) */
    q->spec_k = p->spec_k < s->o.chunk ? p->spec_k : s->o.chunk - 1;
    q->spec_mtp = p->spec_mtp;
    return rc;
}

nf_status nf_sched_add(nf_sched *s, const int32_t *prompt, size_t n, const nf_seq_params *p, uint64_t *id,
                       nf_error *err)
{
    nf_status rc = check_add(s, prompt, n, p, err);
    if (rc) return rc;
    if (s->n_seqs == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        seq **a = realloc(s->seqs, cap * sizeof *a), **b = a ? realloc(s->order, cap * sizeof *b) : NULL;
        if (a) s->seqs = a;
        if (b) s->order = b;
        if (!a || !b) return nf_error_set(err, NF_ERR_NOMEM, "sched: out of memory");
        s->cap = cap;
    }
    seq *q = calloc(1, sizeof *q);
    if (!q) return nf_error_set(err, NF_ERR_NOMEM, "sched: out of memory");
    q->n_pages = 0;
    q->slot = NO_SLOT;
    q->snap_dec = NF_KVPOOL_NONE;
    if ((rc = seq_init(s, q, prompt, n, p, err))) {
        seq_free(s, q);
        return rc;
    }
    q->id = s->next_id++;
    q->state = SEQ_WAITING;
    s->seqs[s->n_seqs++] = q;
    *id = q->id;
    return NF_OK;
}

/* The stop stream's text callback: the text lands in the event being built. */
static void take_text(void *ctx, const char *text, size_t len)
{
    seq *q = ctx;
    q->ev_text = text;
    q->ev_len = len;
}

static void emit(seq *q, int32_t token, nf_seq_end end)
{
    if (q->p.emit) {
        nf_seq_event ev = {q->id, token, q->ev_text ? q->ev_text : "", q->ev_len, end, 0, 0, NULL, NULL};
        if (q->p.logprobs && token >= 0) ev.logprob = q->lp, ev.n_top = q->n_top, ev.top_ids = q->top_ids, ev.top_lp = q->top_lp;
        q->p.emit(q->p.ctx, &ev);
    }
    q->ev_text = NULL;
    q->ev_len = 0;
}

/* Ends a sequence: pages back at once, the held-back text (unless a stop string ended it) and the
 * final event. */
void nf_sched_finish(nf_sched *s, seq *q, nf_seq_end end)
{
    nf_sched_release_pages(s, q);
    q->state = SEQ_DONE;
    q->end = end;
    int stopped = 0;
    if (q->has_text && end != NF_SEQ_STOP && nf_stop_stream_finish(&q->ss, take_text, q, &stopped, NULL) == NF_OK &&
        stopped && end != NF_SEQ_CANCELLED)
        q->end = end = NF_SEQ_STOP;
    emit(q, -1, end);
}

nf_status nf_sched_cancel(nf_sched *s, uint64_t id, nf_error *err)
{
    seq *q = find_seq(s, id);
    if (!q) return nf_error_set(err, NF_ERR_INVALID_ARG, "sched: no sequence %llu", (unsigned long long)id);
    if (q->state != SEQ_DONE) nf_sched_finish(s, q, NF_SEQ_CANCELLED);
    return NF_OK;
}

void nf_sched_remove(nf_sched *s, uint64_t id)
{
    for (size_t i = 0; i < s->n_seqs; i++) {
        seq *q = s->seqs[i];
        if (q->id != id) continue;
        if (q->state != SEQ_DONE) nf_sched_finish(s, q, NF_SEQ_CANCELLED);
        seq_free(s, q);
        memmove(&s->seqs[i], &s->seqs[i + 1], (s->n_seqs - i - 1) * sizeof *s->seqs);
        s->n_seqs--;
        return;
    }
}

void nf_sched_count(const nf_sched *s, size_t *waiting, size_t *active)
{
    *waiting = *active = 0;
    for (size_t i = 0; i < s->n_seqs; i++) {
        *waiting += s->seqs[i]->state == SEQ_WAITING;
        *active += s->seqs[i]->state == SEQ_ACTIVE;
    }
}

int nf_sched_idle(const nf_sched *s)
{
    for (size_t i = 0; i < s->n_seqs; i++)
        if (s->seqs[i]->state != SEQ_DONE) return 0;
    return 1;
}

const int32_t *nf_sched_tokens(const nf_sched *s, uint64_t id, size_t *n_prompt, size_t *n)
{
    const seq *q = find_seq(s, id);
    if (!q) return NULL;
    if (n_prompt) *n_prompt = q->n_prompt;
    if (n) *n = q->n;
    return q->toks;
}

nf_seq_end nf_sched_end(const nf_sched *s, uint64_t id)
{
    const seq *q = find_seq(s, id);
    return q ? q->end : NF_SEQ_RUNNING;
}

/* ---- building a batch ---- */

static nf_status copy_cb(void *ctx, uint32_t dst, uint32_t src, nf_error *err)
{
    const nf_sched *s = ctx;
    return s->be.copy_page(s->be.state, dst, src, err);
}

/* Pages for toks[n_cached, n_cached + want): the page holding position n_cached made private
 * (copy-on-write when shared or cached), new pages allocated. Returns how many of the tokens have
 * their pages (fewer when the pool ran dry); errors other than running dry go to *rc. */
uint32_t nf_sched_ensure_pages(nf_sched *s, seq *q, uint32_t want, nf_status *rc, nf_error *err)
{
    const uint32_t pt = s->o.page_tokens;
    const size_t first = q->n_cached / pt;
    *rc = NF_OK;
    if (first < q->n_pages) {
        const uint32_t before = q->pages[first];
        nf_status st = nf_kvpool_writable(s->pool, &q->pages[first], copy_cb, s, err);
        if (!st && q->pages[first] != before && q->reserved) q->reserved--, s->reserved--;
        if (st == NF_ERR_NOMEM) return 0;
        if (st) {
            *rc = st;
            return 0;
        }
    }
    const size_t last = (q->n_cached + want - 1) / pt;
    while (q->n_pages <= last) {
        uint32_t pg;
        if (nf_kvpool_alloc(s->pool, &pg, NULL)) break;
        q->pages[q->n_pages++] = pg;
        if (q->reserved) q->reserved--, s->reserved--;
    }
    const size_t covered = (size_t)q->n_pages * pt - q->n_cached;
    return covered < want ? (uint32_t)covered : want;
}

/* ---- running it ---- */

static void fill_batch(nf_sched *s, const plan *b, nf_batch *nb)
{
    uint32_t t = 0, drafts = 0;
    for (uint32_t i = 0; i < b->S; i++) {
        seq *q = s->batch[i];
        drafts += q->n_draft;
        s->seq_start[i] = t;
        s->pos0[i] = (uint32_t)q->n_cached;
        const uint32_t u = q->take - q->n_draft;
        memcpy(s->tokens + t, q->toks + q->n_cached, u * sizeof *s->tokens);
        memcpy(s->tokens + t + u, q->draft, q->n_draft * sizeof *s->tokens);
        s->rows[i] = 1 + q->n_draft;
        q->c0 = (uint32_t)q->n_cached;
        q->kept = u;
        memcpy(s->pages + (size_t)i * s->page_stride, q->pages, q->n_pages * sizeof *s->pages);
        s->slots[i] = q->slot;
        t += q->take;
    }
    s->seq_start[b->S] = t;
    *nb = (nf_batch){.n_tokens = t, .n_seqs = b->S, .tokens = s->tokens, .seq_start = s->seq_start, .pos0 = s->pos0,
                     .pages = s->pages, .page_stride = s->page_stride, .state_slot = s->o.state_slots ? s->slots : NULL,
                     .logit_rows = drafts ? s->rows : NULL};
    s->row0[0] = 0;
    for (uint32_t i = 1; i < b->S; i++) s->row0[i] = s->row0[i - 1] + s->rows[i - 1];
}

/* Full pages of the tokens just cached go into the prefix cache, parent first. A sequence drafting with
 * the MTP block stays out of it: its pages hold the block's keys and values too, which a twin swapped in
 * from another sequence would lack. */
static void publish(nf_sched *s, seq *q)
{
    if (s->o.no_prefix_cache || q->n_published == UINT32_MAX || nf_sched_mtp_seq(s, q)) return;
    const uint32_t pt = s->o.page_tokens, full = (uint32_t)(q->n_cached / pt);
    for (uint32_t j = q->n_published; j < full; j++) {
        const uint32_t parent = j ? q->pages[j - 1] : NF_KVPOOL_NONE;
        if (!nf_kvpool_publish(s->pool, &q->pages[j], parent, q->toks + (size_t)j * pt)) {
            q->n_published = UINT32_MAX;
            return;
        }
        q->n_published = j + 1;
    }
}

/* A hybrid's state after a forward that ended q's segment on a page boundary (no drafts: the slot holds
 * exactly the cached positions) goes to a snapshot held by that page, unless the page holds one. While
 * decoding, q keeps only its latest: the state at the end of a reply is what the conversation's next
 * turn can use. Out of memory for snapshots: the cache goes on without them. */
static nf_status snapshot(nf_sched *s, seq *q, nf_error *err)
{
    const uint32_t pt = s->o.page_tokens;
    if (!nf_sched_snapshots(s) || q->slot == NO_SLOT || q->n_draft ||
        !q->n_cached || q->n_cached % pt || q->n_published == UINT32_MAX || q->n_published < q->n_cached / pt)
        return NF_OK;
    const uint32_t page = q->pages[q->n_cached / pt - 1];
    if (nf_kvpool_snap(s->pool, page) != NF_KVPOOL_NONE) return NF_OK;
    const int decoding = q->n_cached > q->n_prompt;
    if (decoding && q->snap_dec != NF_KVPOOL_NONE) nf_kvpool_snap_drop(s->pool, nf_kvpool_snap(s->pool, q->snap_dec));
    const uint32_t j = nf_kvpool_snap_take(s->pool, page);
    if (j == NF_KVPOOL_NONE) return NF_OK;
    nf_error e2;
    nf_status rc = s->be.slot_copy(s->be.state, 2 * s->o.max_seqs + j, q->slot, &e2);
    if (rc == NF_ERR_NOMEM) {
        nf_kvpool_snap_drop(s->pool, j);
        s->o.state_snaps = 0;
        return NF_OK;
    }
    if (rc) {
        if (err) *err = e2;
        return rc;
    }
    if (decoding) q->snap_dec = page;
    return NF_OK;
}

/* The history q's penalties look at (nf_seq_params.penalty_reply_only). */
const int32_t *nf_sched_pen_hist(const seq *q, size_t *n)
{
    const size_t from = q->p.penalty_reply_only ? q->n_prompt : 0;
    *n = q->n - from;
    return q->toks + from;
}

/* The pairs a sequence's sampler needs from the device (0: every logit); with penalize the penalties
 * are applied there first. */
static uint32_t device_k(const nf_sched *s, const seq *q)
{
    size_t nh;
    const int32_t *h = nf_sched_pen_hist(q, &nh);
    return s->be.penalize ? nf_sampler_device_k_penalized(q->sampler) : nf_sampler_device_k(q->sampler, h, nh);
}

/* One penalize call for the batch: the sequences about to sample with their pairs, the rest empty. */
static nf_status penalize(nf_sched *s, const plan *b, nf_error *err)
{
    nf_penalty_lists_clear(&s->pen);
    for (uint32_t i = 0; i < b->S; i++) {
        seq *q = s->batch[i];
        const int samples = q->n_cached + q->take == q->n;
        size_t nh;
        const int32_t *h = nf_sched_pen_hist(q, &nh);
        nf_status rc = nf_penalty_lists_add(&s->pen, samples ? q->sampler : NULL, h, nh, err);
        if (rc) return rc;
    }
    if (!s->pen.start[b->S]) return NF_OK; /* no pairs: nothing to change */
    return s->be.penalize(s->be.state, s->pen.pen, s->pen.start, s->pen.ids, s->pen.counts, err);
}

/* Device backends: top-k pairs when every sampled sequence's sampler can decide from them and none
 * asked for log-probabilities, else every logit. Sets *k (0: logits in s->logits). */
static nf_status fetch(nf_sched *s, const plan *b, uint32_t *k, nf_error *err)
{
    *k = 0;
    if (!s->be.topk) return NF_OK;
    uint32_t kmax = 0;
    int all_top = 1;
    for (uint32_t i = 0; i < b->S; i++) {
        const seq *q = s->batch[i];
        if (q->n_cached + q->take != q->n) continue;
        const uint32_t ki = device_k(s, q);
        if (!ki || q->p.logprobs) all_top = 0;
        if (ki > kmax) kmax = ki;
    }
    if (all_top && kmax) {
        *k = kmax;
        nf_status rc = s->be.penalize ? penalize(s, b, err) : NF_OK;
        return rc ? rc : s->be.topk(s->be.state, kmax, s->top_ids, s->top_vals, err);
    }
    return s->be.logits(s->be.state, s->logits, err);
}

static int is_eos(const seq *q, int32_t id)
{
    for (size_t i = 0; i < q->p.n_eos; i++)
        if (q->eos[i] == id) return 1;
    return 0;
}

/* The sampled token's consequences: history, event, stops. */
nf_status nf_sched_accept_token(nf_sched *s, seq *q, int32_t id, nf_sched_step_info *info, nf_error *err)
{
    nf_status rc = push_tok(q, id, err);
    if (rc) return rc;
    q->n_gen++;
    info->n_sampled++;
    nf_seq_end end = NF_SEQ_RUNNING;
    int stopped = 0;
    if (is_eos(q, id)) end = NF_SEQ_EOS;
    else if (q->has_text && (rc = nf_stop_stream_put(&q->ss, id, take_text, q, &stopped, err))) return rc;
    if (stopped) end = NF_SEQ_STOP;
    else if (!end && q->p.max_new && q->n_gen >= q->p.max_new) end = NF_SEQ_LENGTH;
    else if (!end && q->n > s->o.ctx) end = NF_SEQ_CONTEXT; /* the new token has no position left */
    emit(q, id, NF_SEQ_RUNNING);
    if (end && q->state == SEQ_ACTIVE) {
        nf_sched_finish(s, q, end);
        info->n_ended++;
    }
    return NF_OK;
}

/* The log-softmax of logits[vocab] (double sums) at id and at the n_top best ids (insertion into a
 * sorted prefix: ties stay with the lower id, which comes first). */
void nf_sched_logprobs(seq *q, const float *l, uint32_t vocab, int32_t id)
{
    float mx = l[0];
    for (uint32_t i = 1; i < vocab; i++) mx = l[i] > mx ? l[i] : mx;
    double sum = 0;
    for (uint32_t i = 0; i < vocab; i++) sum += exp((double)l[i] - mx);
    const double lse = mx + log(sum);
    const uint32_t k = q->p.top_logprobs;
    uint32_t n = 0;
    for (uint32_t i = 0; i < vocab && k; i++) {
        if (n == k && !(l[i] > l[q->top_ids[n - 1]])) continue;
        uint32_t at = n < k ? n++ : n - 1;
        for (; at > 0 && l[i] > l[q->top_ids[at - 1]]; at--) q->top_ids[at] = q->top_ids[at - 1];
        q->top_ids[at] = (int32_t)i;
    }
    q->n_top = n;
    for (uint32_t j = 0; j < n; j++) q->top_lp[j] = (float)(l[q->top_ids[j]] - lse);
    q->lp = (float)(l[id] - lse);
}

/* Whether a sequence of the batch drafts with the MTP block: only then are the forward's hidden states
 * fetched and the block run (a GPU's copy of them would cost every step of a server not asking for it). */
static int batch_mtp(const nf_sched *s, const plan *b)
{
    for (uint32_t i = 0; i < b->S; i++)
        if (nf_sched_mtp_seq(s, s->batch[i])) return 1;
    return 0;
}

/* Step 3 after the forward: positions advance, pages are published, finished prompts sample (or
 * verify their drafts). lg: the host logits, sequence i's rows from row0[i] with drafts, else row i. */
static nf_status after_forward(nf_sched *s, const plan *b, uint32_t k, const float *lg, int rows,
                               nf_sched_step_info *info, nf_error *err)
{
    for (uint32_t i = 0; i < b->S; i++) {
        seq *q = s->batch[i];
        q->n_cached += q->take - q->n_draft; /* the drafts' positions count once accepted */
        if (q->redo) q->redo = q->n > q->n_cached + 1 ? (uint32_t)(q->n - q->n_cached - 1) : 0;
        q->take = 0;
        publish(s, q);
        nf_status rc = snapshot(s, q, err);
        if (rc) return rc;
    }
    for (uint32_t i = 0; i < b->S; i++) {
        seq *q = s->batch[i];
        if (q->state != SEQ_ACTIVE || q->n_cached != q->n) continue; /* cancelled by a callback, or mid-prompt */
        const float *l = lg + (size_t)(rows ? s->row0[i] : i) * s->o.vocab;
        if (q->n_draft) {
            nf_status rc = nf_sched_spec_accept(s, q, l, info, err);
            if (rc) return rc;
            continue;
        }
        int32_t id;
        if (k) {
            const uint32_t ki = device_k(s, q);
            id = nf_sampler_sample_top(q->sampler, s->top_ids + (size_t)i * k, s->top_vals + (size_t)i * k, ki);
        } else {
            size_t nh;
            const int32_t *h = nf_sched_pen_hist(q, &nh);
            id = nf_sampler_sample(q->sampler, l, h, nh);
            if (q->p.logprobs) nf_sched_logprobs(q, l, s->o.vocab, id);
        }
        nf_status rc = nf_sched_accept_token(s, q, id, info, err);
        if (rc) return rc;
    }
    return batch_mtp(s, b) ? nf_sched_spec_mtp(s, b, err) : NF_OK;
}

static uint32_t pages_used(const nf_sched *s)
{
    return nf_kvpool_pages(s->pool) - nf_kvpool_available(s->pool);
}

nf_status nf_sched_step(nf_sched *s, nf_sched_step_info *info, nf_error *err)
{
    const uint64_t t0 = nf_time_ns();
    memset(info, 0, sizeof *info);
    plan b;
    nf_status rc = nf_sched_plan_batch(s, &b, info, err);
    if (rc || !b.T) {
        for (uint32_t i = 0; i < b.S; i++) s->batch[i]->take = 0;
        info->pages_used = pages_used(s);
        info->total_ns = nf_time_ns() - t0;
        return rc;
    }
    nf_batch nb;
    fill_batch(s, &b, &nb);
    info->n_tokens = b.T;
    info->n_seqs = b.S;
    for (uint32_t i = 0; i < b.S; i++) {
        const seq *q = s->batch[i];
        info->n_decode += q->n - q->n_cached == 1 + q->redo && q->take == 1 + q->redo + q->n_draft;
    }
    const uint64_t f0 = nf_time_ns();
    uint32_t k = 0;
    /* a batch with drafts: every sequence's rows on the host (nf_batch.logit_rows) */
    float *lg = nb.logit_rows ? nf_sched_spec_logits(s, s->row0[b.S - 1] + s->rows[b.S - 1]) : s->logits;
    rc = lg ? nf_sched_spec_save(s, &b, err) : nf_error_set(err, NF_ERR_NOMEM, "sched: out of memory for logits");
    if (!rc) rc = s->be.forward(s->be.state, &nb, nb.logit_rows || !s->be.topk ? lg : NULL, err);
    if (!rc && !nb.logit_rows) rc = fetch(s, &b, &k, err);
    if (!rc && batch_mtp(s, &b)) rc = s->be.hidden(s->be.state, s->hid, err);
    info->forward_ns = nf_time_ns() - f0;
    if (rc) {
        for (uint32_t i = 0; i < b.S; i++) s->batch[i]->take = s->batch[i]->n_draft = 0;
        return rc;
    }
    rc = after_forward(s, &b, k, lg, nb.logit_rows != NULL, info, err);
    info->pages_used = pages_used(s);
    info->total_ns = nf_time_ns() - t0;
    return rc;
}

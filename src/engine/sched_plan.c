/* The scheduler's planning of a step (docs/sched.md "A step"): which sequences run and how many of
 * their tokens -- every decoding sequence's next token first, then prefill pieces of active and newly
 * admitted sequences into the rest of the token budget -- with admission against free pages and
 * preemption when they run out. sched.c runs what this plans. */
#include <stdlib.h>

#include "engine/sched_internal.h"

static int by_admission(const void *a, const void *b)
{
    const seq *x = *(seq *const *)a, *y = *(seq *const *)b;
    return (x->admitted > y->admitted) - (x->admitted < y->admitted);
}

/* The active sequences, oldest admission first, into s->order; returns how many. */
static size_t active_by_age(nf_sched *s)
{
    size_t k = 0;
    for (size_t i = 0; i < s->n_seqs; i++)
        if (s->seqs[i]->state == SEQ_ACTIVE) s->order[k++] = s->seqs[i];
    qsort(s->order, k, sizeof *s->order, by_admission);
    return k;
}

/* Back to waiting with nothing cached: it re-prefills all its tokens when admitted again. */
static void preempt(nf_sched *s, seq *q, nf_sched_step_info *info)
{
    nf_sched_release_pages(s, q);
    q->state = SEQ_WAITING;
    q->take = 0;
    info->n_preempted++;
}

/* The newest active sequence not yet in the batch (the one preempted when pages run out). */
static seq *newest_unbatched(nf_sched *s)
{
    seq *best = NULL;
    for (size_t i = 0; i < s->n_seqs; i++) {
        seq *q = s->seqs[i];
        if (q->state == SEQ_ACTIVE && !q->take && (!best || q->admitted > best->admitted)) best = q;
    }
    return best;
}

/* take: tokens in the batch, the last n_draft of them drafts */
static void add_to_batch(nf_sched *s, plan *b, seq *q, uint32_t take, uint32_t n_draft)
{
    q->take = take;
    q->n_draft = n_draft;
    s->batch[b->S++] = q;
    b->T += take;
}

/* Step 1: every decoding sequence's token (after the tokens a rolled-back verification kept, before
 * its drafts), preempting the newest when a page for the token is missing; drafts take only the pages
 * there are. */
static nf_status plan_decode(nf_sched *s, plan *b, nf_sched_step_info *info, nf_error *err)
{
    const size_t k = active_by_age(s);
    for (size_t i = 0; i < k; i++) {
        seq *q = s->order[i];
        const uint32_t u = 1 + q->redo;
        if (q->state != SEQ_ACTIVE || q->n - q->n_cached != u) continue;
        if (b->S == s->o.max_seqs || b->T == s->o.chunk) break;
        const uint32_t d = nf_sched_spec_drafts(s, q, u);
        if (u + d > s->o.chunk - b->T) continue; /* first in line next step: drafts are not cut to fit */
        nf_status rc;
        uint32_t got;
        while ((got = nf_sched_ensure_pages(s, q, u + d, &rc, err)) < u) {
            if (rc) return rc;
            seq *victim = newest_unbatched(s);
            preempt(s, victim, info);
            if (victim == q) break;
        }
        if (q->state != SEQ_ACTIVE) continue;
        add_to_batch(s, b, q, got, got - u);
    }
    return NF_OK;
}

/* Pages a waiting sequence needs beyond its matched prefix for its first `positions` positions (+1
 * for the copy of a fully matched last page). */
static uint32_t pages_needed(const nf_sched *s, const seq *q, size_t positions)
{
    const uint32_t pt = s->o.page_tokens;
    const uint32_t total = (uint32_t)((positions + pt - 1) / pt);
    return total - q->n_pages + (q->n_cached < (size_t)q->n_pages * pt);
}

/* The positions a sequence must hold: its tokens now, or with opts.reserve every token it may still
 * feed (the last one sampled is never fed). */
static size_t positions_wanted(const nf_sched *s, const seq *q)
{
    if (!s->o.reserve) return q->n;
    size_t most = q->p.max_new ? q->n_prompt + q->p.max_new - 1 : s->o.ctx;
    if (most > s->o.ctx) most = s->o.ctx;
    return most > q->n ? most : q->n;
}

/* The deepest page boundary a hybrid's match may restore: at least piece_min tokens (and one) left to
 * feed, so that the rest runs the path it would run without the hit. */
static size_t restorable(const nf_sched *s, const seq *q)
{
    const size_t m = s->o.piece_min > 1 ? s->o.piece_min : 1;
    return q->n > m ? (q->n - m) / s->o.page_tokens * s->o.page_tokens : 0;
}

/* A hybrid's match: the deepest cached page with a snapshot of the state, leaving at least one token
 * (and piece_min) to feed; *snap its snapshot. snap_cut marks a longer match that had no snapshot. When
 * another sequence is already cutting for that prefix, returns 1: q waits for its snapshot (a step)
 * rather than compute the prefix again. */
static int match_state(nf_sched *s, seq *q, uint32_t *snap)
{
    const uint32_t pt = s->o.page_tokens;
    size_t most = restorable(s, q) / pt, matched;
    if (most > s->page_stride) most = s->page_stride;
    q->n_pages = (uint32_t)nf_kvpool_match_state(s->pool, q->toks, q->n, q->pages, most, snap, &matched);
    q->snap_cut = 0;
    if (matched <= q->n_pages) return 0;
    const uint32_t deepest = q->pages[matched - 1];
    for (size_t i = 0; i < s->n_seqs; i++) {
        const seq *r = s->seqs[i];
        if (r->state == SEQ_ACTIVE && r->snap_cut > r->n_cached && r->snap_cut_page == deepest) return 1;
    }
    q->snap_cut = matched * pt;
    q->snap_cut_page = deepest;
    return 0;
}

/* The longest cached prefix (none for a sequence drafting with the MTP block: the cached pages may lack
 * the block's keys and values). Returns 1 when q should wait for another's snapshot (match_state). */
static int match(nf_sched *s, seq *q, uint32_t *snap)
{
    const uint32_t pt = s->o.page_tokens;
    *snap = NF_KVPOOL_NONE;
    if (s->o.no_prefix_cache || nf_sched_mtp_seq(s, q)) return 0;
    if (!s->o.state_slots) q->n_pages = (uint32_t)nf_kvpool_match(s->pool, q->toks, q->n, q->pages, s->page_stride);
    else if (match_state(s, q, snap)) return 1;
    q->n_published = q->n_pages;
    q->n_cached = (size_t)q->n_pages * pt;
    if (q->n_cached == q->n) q->n_cached--; /* its last token is fed again: the sampler needs its logits */
    return 0;
}

/* A hybrid's matched prefix: its snapshot into the sequence's slot. If that fails the sequence starts
 * from nothing (the slot is zeroed at position 0). */
static void restore(nf_sched *s, seq *q, uint32_t snap)
{
    nf_error err;
    if (snap == NF_KVPOOL_NONE || !s->be.slot_copy(s->be.state, q->slot, 2 * s->o.max_seqs + snap, &err)) return;
    for (uint32_t j = 0; j < q->n_pages; j++) nf_kvpool_release(s->pool, q->pages[j]);
    q->n_pages = q->n_published = 0;
    q->n_cached = 0;
}

/* Admission: the longest cached prefix, then the pages for the rest must be available now (beyond
 * what others have reserved). Returns 1 when admitted; 0 when it must wait (nothing held); a
 * sequence that cannot fit even an empty pool ends with NF_SEQ_NO_PAGES. */
static int admit(nf_sched *s, seq *q, nf_sched_step_info *info)
{
    uint32_t snap;
    if (match(s, q, &snap)) {
        nf_sched_release_pages(s, q);
        return 0;
    }
    const uint32_t need = pages_needed(s, q, positions_wanted(s, q)), avail = nf_kvpool_available(s->pool);
    if (need + q->n_pages > nf_kvpool_pages(s->pool)) {
        nf_sched_finish(s, q, NF_SEQ_NO_PAGES);
        info->n_ended++;
        return 0;
    }
    if (need + s->reserved > avail) {
        nf_sched_release_pages(s, q);
        return 0;
    }
    if (s->o.reserve) {
        q->reserved = need;
        s->reserved += need;
    }
    if (s->o.state_slots) { /* at most max_seqs are active (plan_prefill), so one is free */
        uint32_t sl = 0;
        while (sl < s->o.max_seqs && s->slot_used[sl]) sl++;
        if (sl == s->o.max_seqs) {
            nf_sched_release_pages(s, q);
            return 0;
        }
        s->slot_used[sl] = 1;
        q->slot = sl;
        restore(s, q, snap);
    }
    q->state = SEQ_ACTIVE;
    q->admitted = ++s->next_stamp;
    info->n_admitted++;
    return 1;
}

/* Hybrids with the cache: where a piece of q should end so that the state there is snapshot (a prefix
 * matched without one, then the deepest restorable boundary of its tokens); 0: nowhere. */
static size_t snap_cut(const nf_sched *s, const seq *q)
{
    if (!nf_sched_snapshots(s)) return 0;
    return q->snap_cut > q->n_cached ? q->snap_cut : restorable(s, q);
}

/* How many of q's left uncached tokens to prefill with room in the step (sched.h piece_min,
 * piece_align): all when they fit, else a cut at a multiple of piece_align that leaves the piece and
 * the rest at least piece_min tokens each; 0 when none fits (q waits for a roomier step), except in a
 * step's whole budget (a chunk too small for the rule): then as much as fits, so every prompt moves. */
static uint32_t piece(const nf_sched *s, const seq *q, size_t left, size_t room)
{
    const size_t a = s->o.piece_align ? s->o.piece_align : 1, m = s->o.piece_min, at = q->n_cached;
    const size_t cut = snap_cut(s, q);
    if (cut > at && cut < at + left && (cut - at) % a == 0 && cut - at >= m && at + left - cut >= m) left = cut - at;
    if (left <= room) return (uint32_t)left;
    for (size_t end = (at + room) / a * a; end > at; end -= end < a ? end : a)
        if (end - at >= m && left - (end - at) >= m) return (uint32_t)(end - at);
    return room == s->o.chunk ? (uint32_t)room : 0;
}

/* Pages for a piece of q (piece()), cut again where the pool gives fewer; 0 when nothing goes. */
static uint32_t take_piece(nf_sched *s, seq *q, size_t room, nf_status *rc, nf_error *err)
{
    const size_t left = q->n - q->n_cached;
    const uint32_t want = piece(s, q, left, room);
    *rc = NF_OK;
    if (!want) return 0;
    const uint32_t got = nf_sched_ensure_pages(s, q, want, rc, err);
    return got < want && !*rc ? piece(s, q, left, got) : got;
}

/* Step 2: prefill chunks into the rest of the budget: active sequences first, then admissions. */
static nf_status plan_prefill(nf_sched *s, plan *b, nf_sched_step_info *info, nf_error *err)
{
    const size_t k = active_by_age(s);
    for (size_t i = 0; i < k && b->T < s->o.chunk && b->S < s->o.max_seqs; i++) {
        seq *q = s->order[i];
        if (q->take || q->n - q->n_cached <= 1 + q->redo) continue;
        if (!piece(s, q, q->n - q->n_cached, s->o.chunk - b->T)) continue; /* no cut fits this step */
        nf_status rc;
        const uint32_t take = take_piece(s, q, s->o.chunk - b->T, &rc, err);
        if (rc) return rc;
        if (!take) return NF_OK; /* the pool is dry: what is planned runs */
        add_to_batch(s, b, q, take, 0);
    }
    size_t active = k; /* at most max_seqs active: an admitted sequence must fit a batch */
    for (size_t i = 0; i < s->n_seqs && b->T < s->o.chunk && b->S < s->o.max_seqs && active < s->o.max_seqs; i++) {
        seq *q = s->seqs[i];
        if (q->state != SEQ_WAITING) continue;
        if (!admit(s, q, info)) {
            if (q->state == SEQ_DONE) continue;
            break; /* first come, first served: no overtaking a sequence that waits for pages */
        }
        active++;
        nf_status rc;
        const uint32_t take = take_piece(s, q, s->o.chunk - b->T, &rc, err);
        if (rc) return rc;
        if (take) add_to_batch(s, b, q, take, 0);
    }
    return NF_OK;
}

/* Nothing could be planned though sequences are active (all stuck on pages): the newest goes back
 * to waiting; a lone sequence that cannot grow has outgrown the pool. Returns 1 when it changed
 * something worth planning again. */
static int unstick(nf_sched *s, nf_sched_step_info *info)
{
    seq *newest = newest_unbatched(s);
    if (!newest) return 0;
    size_t active = 0;
    for (size_t i = 0; i < s->n_seqs; i++) active += s->seqs[i]->state == SEQ_ACTIVE;
    if (active > 1) preempt(s, newest, info);
    else {
        nf_sched_finish(s, newest, NF_SEQ_NO_PAGES);
        info->n_ended++;
    }
    return 1;
}

nf_status nf_sched_plan_batch(nf_sched *s, plan *b, nf_sched_step_info *info, nf_error *err)
{
    for (;;) {
        *b = (plan){0, 0};
        nf_status rc = plan_decode(s, b, info, err);
        if (!rc) rc = plan_prefill(s, b, info, err);
        if (rc || b->T) return rc;
        for (uint32_t i = 0; i < b->S; i++) s->batch[i]->take = 0;
        if (!unstick(s, info)) return NF_OK;
    }
}

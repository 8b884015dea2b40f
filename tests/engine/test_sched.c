/* The scheduler against an independent oracle.
 *
 * The backend here is a toy whose "KV cache" holds the token id (and position) written into each page
 * slot, and whose logits for a sequence are a hash of the sequence's whole history READ BACK THROUGH
 * ITS PAGE TABLE: a wrong page table, a missed copy-on-write, a bad prefix match or a stale page
 * changes the logits, hence the tokens. It also counts contract violations (a write into a shared or
 * cached page, a read of a slot that does not hold the position asked for).
 *
 * The oracle runs each sequence alone without pages: the same hash over its token list, a fresh
 * sampler with the same parameters, the stop rules applied by decoding all generated ids and searching
 * the text (strstr), not incrementally. Every scheduled sequence must match it token for token, with
 * many sequences, ragged prompts, chunked prefill, shared prefixes, preemption, cancellation, stop
 * strings, a device-style backend (top-k), and the pool must be back to full at the end.
 *
 * Recurrent mode (state_slots, as for Gated DeltaNet hybrids): the toy also keeps, per state slot, a
 * running hash of the tokens fed through that slot, restarted when a sequence feeds position 0, and the
 * logits come from it (it must equal the page read-back's hash): a slot shared by two live sequences,
 * not restarted on admission or recompute after preemption, or skipped, changes the tokens; a batch
 * without slots, with a slot out of range or twice, or continuing a slot at a position it does not
 * hold, counts as a violation. With the prefix cache, the toy copies slots (slot_copy: the hash and the
 * position, to spares and snapshots): a hit must restore the hash of exactly the matched tokens, or the
 * tokens change; a restore to the wrong position is a violation. */
#include "nf_test.h"
#include "common/letters_tokenizer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sched.h"

enum { VOCAB = 32, MAXN = 512, LPN = 64 /* tokens whose log-probabilities are compared */ };

/* One token's log-probabilities as an event reported them or the oracle computed them. */
typedef struct lp_row {
    float lp;
    uint32_t n_top;
    int32_t ids[NF_SEQ_MAX_TOP_LOGPROBS];
    float lps[NF_SEQ_MAX_TOP_LOGPROBS];
} lp_row;

static uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t fold(uint64_t h, int32_t tok, uint32_t pos) { return mix(h ^ ((uint64_t)(uint32_t)tok << 20) ^ pos); }

static void logits_of_hash(uint64_t h, float *l)
{
    for (uint32_t v = 0; v < VOCAB; v++) l[v] = (float)((mix(h + v * 0x632be59bd9b4e019ULL) >> 40) % 1000) / 150.0f;
}

/* ---- the toy backend ---- */

typedef struct toy {
    uint32_t pages, pt, chunk, max_seqs, ctx;
    int32_t *tok;  /* [pages][pt] */
    int32_t *pos;  /* [pages][pt] position written, -1: never */
    nf_sched *sched; /* set after create: the pool the write contract is checked against */
    int device;    /* keeps logits: forward gets NULL, logits/topk fetch */
    float *held;   /* [max_seqs][VOCAB] */
    uint32_t held_S;
    int violations;
    long forwards;
    int recurrent;     /* state slots (see the top) */
    uint32_t snaps;    /* with the cache: snapshot slots 2 max_seqs .. */
    uint64_t slot_h[64];
    uint32_t slot_n[64];
} toy;

/* Recurrent mode: sequence i's slot advances by its tokens; returns its hash (0 on a violation). */
static uint64_t toy_slot(toy *t, const nf_batch *b, uint32_t i)
{
    if (!b->state_slot || b->state_slot[i] >= t->max_seqs || b->state_slot[i] >= 16) {
        t->violations++;
        return 0;
    }
    const uint32_t sl = b->state_slot[i], n = nf_batch_tokens_of(b, i);
    for (uint32_t j = 0; j < i; j++) t->violations += b->state_slot[j] == sl;
    if (b->pos0[i] == 0) t->slot_h[sl] = 0, t->slot_n[sl] = 0;
    if (t->slot_n[sl] != b->pos0[i]) t->violations++;
    for (uint32_t j = 0; j < n; j++) t->slot_h[sl] = fold(t->slot_h[sl], b->tokens[b->seq_start[i] + j], b->pos0[i] + j);
    t->slot_n[sl] = b->pos0[i] + n;
    return t->slot_h[sl];
}

static void toy_seq(toy *t, const nf_batch *b, uint32_t i, float *out)
{
    const uint32_t *pt = b->pages + (size_t)i * b->page_stride;
    const uint32_t n = nf_batch_tokens_of(b, i), p0 = b->pos0[i];
    for (uint32_t j = 0; j < n; j++) {
        const uint32_t p = p0 + j, page = pt[p / t->pt], slot = page * t->pt + p % t->pt;
        nf_kvpool *pool = nf_sched_pool(t->sched);
        if (page >= t->pages || nf_kvpool_refs(pool, page) != 1 || nf_kvpool_is_cached(pool, page)) {
            t->violations++;
            if (page >= t->pages) return;
        }
        t->tok[slot] = b->tokens[b->seq_start[i] + j];
        t->pos[slot] = (int32_t)p;
    }
    uint64_t h = 0;
    for (uint32_t p = 0; p < p0 + n; p++) {
        const uint32_t slot = pt[p / t->pt] * t->pt + p % t->pt;
        if (t->pos[slot] != (int32_t)p) t->violations++;
        h = fold(h, t->tok[slot], p);
    }
    if (t->recurrent) {
        const uint64_t hs = toy_slot(t, b, i);
        t->violations += hs != h;
        h = hs;
    }
    logits_of_hash(h, out);
}

static nf_status toy_forward(void *state, const nf_batch *b, float *logits, nf_error *err)
{
    toy *t = state;
    t->forwards++;
    if (!b->n_tokens || b->n_tokens > t->chunk || !b->n_seqs || b->n_seqs > t->max_seqs || b->seq_start[0] ||
        b->seq_start[b->n_seqs] != b->n_tokens || b->all_logits || (t->device != (logits == NULL)))
        return nf_error_set(err, NF_ERR_INVALID_ARG, "toy: bad batch");
    for (uint32_t i = 0; i < b->n_seqs; i++) {
        if (b->seq_start[i + 1] <= b->seq_start[i] || b->pos0[i] + nf_batch_tokens_of(b, i) > t->ctx)
            return nf_error_set(err, NF_ERR_INVALID_ARG, "toy: bad sequence %u", i);
        toy_seq(t, b, i, (logits ? logits : t->held) + (size_t)i * VOCAB);
    }
    t->held_S = b->n_seqs;
    return NF_OK;
}

static nf_status toy_logits(void *state, float *out, nf_error *err)
{
    (void)err;
    toy *t = state;
    memcpy(out, t->held, (size_t)t->held_S * VOCAB * sizeof *out);
    return NF_OK;
}

static nf_status toy_topk(void *state, uint32_t k, int32_t *ids, float *vals, nf_error *err)
{
    toy *t = state;
    if (!k || k > VOCAB) return nf_error_set(err, NF_ERR_INVALID_ARG, "toy: k %u", k);
    for (uint32_t i = 0; i < t->held_S; i++) {
        const float *l = t->held + (size_t)i * VOCAB;
        int taken[VOCAB] = {0};
        for (uint32_t j = 0; j < k; j++) {
            int best = -1;
            for (int v = 0; v < VOCAB; v++)
                if (!taken[v] && (best < 0 || l[v] > l[best])) best = v;
            taken[best] = 1;
            ids[i * k + j] = best;
            vals[i * k + j] = l[best];
        }
    }
    return NF_OK;
}

static nf_status toy_copy(void *state, uint32_t dst, uint32_t src, nf_error *err)
{
    toy *t = state;
    if (dst >= t->pages || src >= t->pages) return nf_error_set(err, NF_ERR_INVALID_ARG, "toy: copy %u <- %u", dst, src);
    memcpy(t->tok + (size_t)dst * t->pt, t->tok + (size_t)src * t->pt, t->pt * sizeof *t->tok);
    memcpy(t->pos + (size_t)dst * t->pt, t->pos + (size_t)src * t->pt, t->pt * sizeof *t->pos);
    return NF_OK;
}

/* The toy's page slots: nothing written yet (position -1). */
static void toy_pages(toy *t)
{
    const size_t n = (size_t)t->pages * t->pt;
    t->tok = calloc(n, sizeof *t->tok);
    t->pos = malloc(n * sizeof *t->pos);
    if (t->pos) memset(t->pos, 0xff, n * sizeof *t->pos);
}

static void toy_free(toy *t)
{
    free(t->tok);
    free(t->pos);
    free(t->held);
}

static nf_status toy_slot_copy(void *state, uint32_t dst, uint32_t src, nf_error *err)
{
    toy *t = state;
    const uint32_t n = 2 * t->max_seqs + t->snaps;
    if (dst >= n || src >= n || n > 64) return nf_error_set(err, NF_ERR_INVALID_ARG, "toy: slot %u <- %u", dst, src);
    t->slot_h[dst] = t->slot_h[src];
    t->slot_n[dst] = t->slot_n[src];
    return NF_OK;
}

/* ---- what the events said ---- */

typedef struct record {
    uint64_t id;
    int32_t toks[MAXN];
    size_t n_toks;
    char text[MAXN + 1];
    size_t len;
    int finals;
    nf_seq_end end;
    size_t cancel_after; /* > 0: the callback cancels the sequence after this many tokens */
    nf_sched *s;
    lp_row lp[LPN];
    int lp_events;       /* token events that carried log-probabilities */
} record;

static void on_event(void *ctx, const nf_seq_event *ev)
{
    record *r = ctx;
    if (r->len + ev->len <= MAXN) {
        memcpy(r->text + r->len, ev->text, ev->len);
        r->len += ev->len;
    }
    if (ev->end) {
        r->finals++;
        r->end = ev->end;
        return;
    }
    CHECK(r->finals == 0); /* nothing after the final event */
    if (ev->top_ids || ev->logprob != 0) r->lp_events++;
    if (r->n_toks < LPN) {
        lp_row *l = &r->lp[r->n_toks];
        l->lp = ev->logprob;
        l->n_top = ev->n_top;
        for (uint32_t j = 0; j < ev->n_top && j < NF_SEQ_MAX_TOP_LOGPROBS; j++) l->ids[j] = ev->top_ids[j], l->lps[j] = ev->top_lp[j];
    }
    if (r->n_toks < MAXN) r->toks[r->n_toks++] = ev->token;
    if (r->cancel_after && r->n_toks == r->cancel_after) CHECK(nf_sched_cancel(r->s, ev->id, NULL) == NF_OK);
}

/* ---- the oracle ---- */

typedef struct want {
    int32_t toks[MAXN];
    size_t n_toks;
    char text[MAXN + 1];
    nf_seq_end end;
    lp_row lp[LPN];
} want;

static const float *sort_logits; /* for by_logit */

static int by_logit(const void *a, const void *b)
{
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (sort_logits[x] != sort_logits[y]) return sort_logits[x] > sort_logits[y] ? -1 : 1;
    return (x > y) - (x < y);
}

/* The reference log-probabilities: log(softmax) summed in long double, alternatives by a full sort. */
static void oracle_lp(const float *l, int32_t id, uint32_t top, lp_row *out)
{
    long double sum = 0;
    for (int v = 0; v < VOCAB; v++) sum += expl((long double)l[v]);
    int32_t order[VOCAB];
    for (int v = 0; v < VOCAB; v++) order[v] = v;
    sort_logits = l;
    qsort(order, VOCAB, sizeof *order, by_logit);
    out->lp = (float)((long double)l[id] - logl(sum));
    out->n_top = top;
    for (uint32_t j = 0; j < top; j++) out->ids[j] = order[j], out->lps[j] = (float)((long double)l[order[j]] - logl(sum));
}

static int first_stop(const char *text, const nf_seq_params *p, size_t *at)
{
    int found = 0;
    for (size_t i = 0; i < p->n_stops; i++) {
        const char *hit = p->stops[i][0] ? strstr(text, p->stops[i]) : NULL;
        if (hit && (!found || (size_t)(hit - text) < *at)) *at = (size_t)(hit - text), found = 1;
    }
    return found;
}

static void oracle(const int32_t *prompt, size_t n, const nf_seq_params *p, uint32_t ctx, const nf_tokenizer *tok, want *w)
{
    memset(w, 0, sizeof *w);
    int32_t hist[MAXN + 64];
    memcpy(hist, prompt, n * sizeof *hist);
    nf_sampler *smp = NULL;
    CHECK(nf_sampler_create(&p->sampling, VOCAB, &smp, NULL) == NF_OK);
    float l[VOCAB];
    size_t text_ids = 0; /* generated ids that count as text (not an eos) */
    for (;;) {
        uint64_t h = 0;
        for (size_t q = 0; q < n; q++) h = fold(h, hist[q], (uint32_t)q);
        logits_of_hash(h, l);
        const int32_t id = nf_sampler_sample(smp, l, hist, n);
        if (p->logprobs && w->n_toks < LPN) oracle_lp(l, id, p->top_logprobs, &w->lp[w->n_toks]);
        hist[n++] = id;
        w->toks[w->n_toks++] = id;
        int eos = 0;
        for (size_t i = 0; i < p->n_eos; i++) eos |= p->eos[i] == id;
        if (eos) {
            w->end = NF_SEQ_EOS;
            break;
        }
        text_ids++;
        if (tok) {
            char *txt = NULL;
            size_t len = 0, at = 0;
            CHECK(nf_tok_decode(tok, w->toks, text_ids, NF_TOK_SKIP_SPECIAL, &txt, &len, NULL) == NF_OK);
            int stop = txt && first_stop(txt, p, &at);
            snprintf(w->text, sizeof w->text, "%.*s", (int)(stop ? at : len), txt ? txt : "");
            free(txt);
            if (stop) {
                w->end = NF_SEQ_STOP;
                break;
            }
        }
        if (p->max_new && w->n_toks >= p->max_new) {
            w->end = NF_SEQ_LENGTH;
            break;
        }
        if (n > ctx) {
            w->end = NF_SEQ_CONTEXT;
            break;
        }
    }
    nf_sampler_free(smp);
}

/* ---- one scheduled run ---- */

typedef struct scenario {
    const char *name;
    uint32_t n, pt, chunk, max_seqs, kv_pages, ctx;
    int prefix_cache, device;
    size_t shared_prefix;
    int with_text;
    size_t min_prompt, max_prompt, max_new;
    uint64_t seed;
    int reserve; /* admission reserves prompt + max_new pages */
    int recurrent; /* the backend keeps state slots (nf_sched_opts.state_slots) */
    uint32_t snaps; /* recurrent with the cache: state snapshots (0: 8) */
} scenario;

typedef struct outcome {
    long preempted, admitted, steps, forwards;
    int ends[NF_SEQ_NO_PAGES + 1]; /* sequences by how they ended */
    nf_kvpool_stats pool;
} outcome;

static void make_prompt(const scenario *sc, size_t i, uint64_t *rng, int32_t *out, size_t *n)
{
    *n = sc->min_prompt + mix((*rng)++) % (sc->max_prompt - sc->min_prompt + 1);
    /* shared_prefix tokens of every prompt are the same (a system prompt); every third prompt is a
     * whole number of pages of it, so its last page is fully cached and must be copied to be fed */
    if (sc->shared_prefix && i % 3 == 2) *n = (sc->shared_prefix / sc->pt) * sc->pt;
    else if (sc->shared_prefix && *n <= sc->shared_prefix) *n = sc->shared_prefix + 1 + i % 5;
    for (size_t j = 0; j < *n; j++)
        out[j] = (int32_t)(j < sc->shared_prefix ? (j * 7 + 3) % VOCAB : mix((*rng)++) % VOCAB);
}

static nf_seq_params params_for(const scenario *sc, size_t i, record *r, const int32_t *eos, const char *const *stops,
                                size_t n_stops)
{
    nf_seq_params p = {0};
    p.sampling = nf_sampler_defaults();
    p.sampling.temp = i % 2 ? 0.9f : 0; /* greedy and seeded sampling side by side */
    p.sampling.top_k = i % 4 == 1 ? 0 : 10; /* top_k 0: the device backend must fetch every logit */
    p.sampling.seed = sc->seed * 1000 + i;
    p.sampling.frequency_penalty = i % 5 == 3 ? 0.5f : 0;
    p.max_new = i % 7 == 6 ? 0 : sc->max_new - i % 5;
    if (i % 4 == 3) p.eos = eos, p.n_eos = 1;
    if (sc->with_text) p.stops = stops, p.n_stops = n_stops;
    p.logprobs = i % 3 == 0;
    p.top_logprobs = p.logprobs ? (uint32_t)(i * 7) % (NF_SEQ_MAX_TOP_LOGPROBS + 1) : 0;
    p.emit = on_event;
    p.ctx = r;
    return p;
}

/* Queues every sequence of the scenario; wants[i] = its oracle. */
static void add_all(const scenario *sc, nf_sched *s, const nf_tokenizer *tok, record *rec, want *wants)
{
    uint64_t rng = sc->seed;
    const int32_t eos[1] = {5};
    static char stop_text[64][3];
    for (size_t i = 0; i < sc->n; i++) {
        int32_t prompt[MAXN];
        size_t n;
        make_prompt(sc, i, &rng, prompt, &n);
        /* two stops: one that hardly ever completes (its beginnings are held back while they last) and
         * one of one letter (even i) or two */
        stop_text[i][0] = (char)('a' + i % 8), stop_text[i][1] = i % 2 ? (char)('a' + (i * 3) % 8) : 0;
        stop_text[i][2] = 0;
        const char *stops[2] = {"abcdefg", stop_text[i]};
        record *r = &rec[i];
        r->s = s;
        const nf_seq_params p = params_for(sc, i, r, eos, stops, 2);
        nf_error e;
        if (nf_sched_add(s, prompt, n, &p, &r->id, &e)) CHECK_MSG(0, "%s: add %zu: %s", sc->name, i, e.msg);
        oracle(prompt, n, &p, sc->ctx, p.n_stops ? tok : NULL, &wants[i]);
        size_t got_np = 0, got_n = 0;
        const int32_t *all = nf_sched_tokens(s, r->id, &got_np, &got_n);
        CHECK(all && got_np == n && got_n == n);
    }
}

/* Steps until idle; cancel_mid_prefill >= 0 cancels that sequence after the first step. */
static void drive(const scenario *sc, nf_sched *s, record *rec, long cancel_mid_prefill, outcome *out)
{
    nf_error e;
    for (long step = 0; step < 100000 && !nf_sched_idle(s); step++) {
        nf_sched_step_info info;
        CHECK(nf_sched_step(s, &info, &e) == NF_OK);
        out->steps += info.n_tokens > 0;
        out->preempted += info.n_preempted;
        out->admitted += info.n_admitted;
        CHECK(info.n_tokens <= sc->chunk && info.n_seqs <= sc->max_seqs);
        CHECK(info.pages_used <= sc->kv_pages);
        if (step == 0 && cancel_mid_prefill >= 0) {
            const uint32_t before = nf_kvpool_available(nf_sched_pool(s));
            CHECK(nf_sched_cancel(s, rec[cancel_mid_prefill].id, &e) == NF_OK);
            CHECK(nf_kvpool_available(nf_sched_pool(s)) > before); /* its pages came back at once */
        }
    }
    CHECK_MSG(nf_sched_idle(s), "%s: not idle after 100000 steps", sc->name);
}

/* One sequence's events and tokens against its oracle. */
static void compare(const scenario *sc, nf_sched *s, record *r, const want *w, size_t q)
{
    CHECK_MSG(r->finals == 1, "%s: seq %zu: %d final events", sc->name, q, r->finals);
    CHECK_EQ_INT(nf_sched_end(s, r->id), r->end);
    size_t np, nn;
    const int32_t *tk = nf_sched_tokens(s, r->id, &np, &nn);
    CHECK(tk && nn - np == r->n_toks && memcmp(tk + np, r->toks, r->n_toks * sizeof *tk) == 0);
    if (r->end == NF_SEQ_CANCELLED) { /* what it produced before the cancel is the oracle's beginning */
        CHECK(r->n_toks <= w->n_toks && memcmp(r->toks, w->toks, r->n_toks * sizeof *r->toks) == 0);
        return;
    }
    CHECK_MSG(r->end == w->end, "%s: seq %zu ended %s, alone %s", sc->name, q, nf_seq_end_name(r->end),
              nf_seq_end_name(w->end));
    CHECK_MSG(r->n_toks == w->n_toks && memcmp(r->toks, w->toks, w->n_toks * sizeof *r->toks) == 0,
              "%s: seq %zu: %zu tokens, alone %zu (or they differ)", sc->name, q, r->n_toks, w->n_toks);
    CHECK_MSG(r->lp_events == (q % 3 == 0 ? (int)r->n_toks : 0), "%s: seq %zu: %d events with log-probabilities",
              sc->name, q, r->lp_events);
    for (size_t t = 0; q % 3 == 0 && t < w->n_toks && t < LPN; t++) {
        const lp_row *a = &r->lp[t], *b = &w->lp[t];
        CHECK_MSG(fabsf(a->lp - b->lp) < 1e-5f && a->n_top == b->n_top, "%s: seq %zu token %zu: logprob %g, alone %g",
                  sc->name, q, t, (double)a->lp, (double)b->lp);
        for (uint32_t j = 0; j < b->n_top && j < a->n_top; j++)
            CHECK_MSG(a->ids[j] == b->ids[j] && fabsf(a->lps[j] - b->lps[j]) < 1e-5f, "%s: seq %zu token %zu: top %u",
                      sc->name, q, t, j);
    }
    if (sc->with_text) {
        r->text[r->len] = 0;
        CHECK_MSG(strcmp(r->text, w->text) == 0, "%s: seq %zu: text '%s', alone '%s'", sc->name, q, r->text, w->text);
    }
}

static outcome run(const scenario *sc, const nf_tokenizer *tok, record *rec, long cancel_mid_prefill)
{
    outcome out = {0};
    const uint32_t V = VOCAB;
    toy t = {.pages = sc->kv_pages, .pt = sc->pt, .chunk = sc->chunk, .max_seqs = sc->max_seqs, .ctx = sc->ctx,
             .device = sc->device, .recurrent = sc->recurrent,
             .snaps = sc->recurrent && sc->prefix_cache ? (sc->snaps ? sc->snaps : 8) : 0};
    toy_pages(&t);
    t.held = calloc((size_t)t.max_seqs * V, sizeof *t.held);
    nf_sched_backend be = {.state = &t, .forward = toy_forward, .logits = sc->device ? toy_logits : NULL,
                           .topk = sc->device ? toy_topk : NULL, .copy_page = toy_copy,
                           .slot_copy = sc->recurrent ? toy_slot_copy : NULL};
    nf_sched_opts o = {.vocab = V, .ctx = sc->ctx, .chunk = sc->chunk, .max_seqs = sc->max_seqs,
                       .page_tokens = sc->pt, .kv_pages = sc->kv_pages, .no_prefix_cache = !sc->prefix_cache,
                       .reserve = sc->reserve, .tok = sc->with_text ? tok : NULL, .state_slots = sc->recurrent,
                       .state_snaps = t.snaps};
    nf_sched *s = NULL;
    nf_error e;
    CHECK(nf_sched_create(&be, &o, &s, &e) == NF_OK);
    t.sched = s;
    static want wants[64];
    add_all(sc, s, tok, rec, wants);
    drive(sc, s, rec, cancel_mid_prefill, &out);
    for (size_t q = 0; q < sc->n; q++) {
        compare(sc, s, &rec[q], &wants[q], q);
        out.ends[rec[q].end]++;
    }
    CHECK_EQ_INT(t.violations, 0);
    nf_kvpool *pool = nf_sched_pool(s);
    CHECK_MSG(nf_kvpool_available(pool) == sc->kv_pages, "%s: %u of %u pages back", sc->name,
              nf_kvpool_available(pool), sc->kv_pages);
    out.pool = nf_kvpool_get_stats(pool);
    out.forwards = t.forwards;
    nf_sched_free(s);
    toy_free(&t);
    return out;
}

static void scenarios(const nf_tokenizer *tok)
{
    static record rec[64];
    /* many ragged sequences, plenty of pages, no cache; 1 forward per step */
    scenario a = {"ragged", 24, 4, 16, 8, 8 * 24, 96, 0, 0, 0, 0, 1, 40, 30, 1, 0, 0, 0};
    memset(rec, 0, sizeof rec);
    outcome o = run(&a, tok, rec, -1);
    CHECK_EQ_INT(o.forwards, o.steps);
    CHECK_EQ_INT(o.preempted, 0);
    CHECK(o.ends[NF_SEQ_LENGTH] && o.ends[NF_SEQ_EOS] && o.ends[NF_SEQ_CONTEXT]); /* the mix covers them */
    /* the same on a device-style backend: top-k pairs or the full logits fetched after the forward */
    a.name = "device", a.device = 1;
    memset(rec, 0, sizeof rec);
    run(&a, tok, rec, -1);
    /* shared prefixes through the prefix cache: hits, and copies of fully matched last pages */
    scenario b = {"prefix", 24, 4, 16, 8, 8 * 24, 96, 1, 0, 13, 0, 1, 30, 20, 2, 0, 0, 0};
    memset(rec, 0, sizeof rec);
    o = run(&b, tok, rec, -1);
    CHECK_MSG(o.pool.hits_pages >= 20, "prefix: %llu pages matched", (unsigned long long)o.pool.hits_pages);
    CHECK_MSG(o.pool.copies >= 1, "prefix: %llu copy-on-writes", (unsigned long long)o.pool.copies);
    /* a small pool: decode growth preempts the newest, which recomputes and still matches alone */
    scenario c = {"scarce", 12, 4, 16, 8, 24, 96, 0, 0, 0, 0, 10, 20, 30, 3, 0, 0, 0};
    memset(rec, 0, sizeof rec);
    o = run(&c, tok, rec, -1);
    CHECK_MSG(o.preempted > 0, "scarce: no preemption (%ld)", o.preempted);
    c.name = "scarce+cache", c.prefix_cache = 1, c.shared_prefix = 9;
    memset(rec, 0, sizeof rec);
    o = run(&c, tok, rec, -1);
    CHECK(o.preempted > 0 && o.pool.evictions > 0);
    c.name = "scarce+device", c.device = 1;
    memset(rec, 0, sizeof rec);
    run(&c, tok, rec, -1);
    /* the same pool with reservation at admission: fewer sequences at once, never a preemption */
    c.name = "scarce+reserve", c.device = 0, c.reserve = 1;
    memset(rec, 0, sizeof rec);
    o = run(&c, tok, rec, -1);
    CHECK_EQ_INT(o.preempted, 0);
    c.name = "scarce+reserve, no cache", c.shared_prefix = 0, c.prefix_cache = 0;
    memset(rec, 0, sizeof rec);
    o = run(&c, tok, rec, -1);
    CHECK_EQ_INT(o.preempted, 0);
    /* recurrent state slots: ragged, then a small pool (preemption: the victim's slot is released and it
     * restarts from position 0 in whatever slot is free when it is admitted again) */
    scenario r = a;
    r.name = "recurrent", r.recurrent = 1, r.device = 0;
    memset(rec, 0, sizeof rec);
    run(&r, tok, rec, -1);
    r = c;
    r.name = "recurrent+scarce", r.recurrent = 1, r.reserve = 0, r.prefix_cache = 0, r.shared_prefix = 0;
    memset(rec, 0, sizeof rec);
    o = run(&r, tok, rec, -1);
    CHECK_MSG(o.preempted > 0, "recurrent+scarce: no preemption (%ld)", o.preempted);
    r.name = "recurrent+scarce+device", r.device = 1;
    memset(rec, 0, sizeof rec);
    run(&r, tok, rec, -1);
    /* recurrent with the prefix cache: hits restore snapshots; with a small pool (preemption: recompute
     * from a snapshot); with two snapshots for everything (they move least recently used first) */
    r = b;
    r.name = "recurrent+prefix", r.recurrent = 1;
    memset(rec, 0, sizeof rec);
    o = run(&r, tok, rec, -1);
    CHECK_MSG(o.pool.hits_snaps >= 5, "recurrent+prefix: %llu snapshots restored", (unsigned long long)o.pool.hits_snaps);
    printf("recurrent+prefix: %llu of 24 sequences restored a snapshot\n", (unsigned long long)o.pool.hits_snaps);
    r.name = "recurrent+prefix, 2 snapshots", r.snaps = 2;
    memset(rec, 0, sizeof rec);
    o = run(&r, tok, rec, -1);
    CHECK_MSG(o.pool.hits_snaps >= 1 && o.pool.snaps_evicted >= 1, "recurrent+prefix, 2 snapshots: %llu restored, "
              "%llu moved", (unsigned long long)o.pool.hits_snaps, (unsigned long long)o.pool.snaps_evicted);
    r = c;
    r.name = "recurrent+scarce+cache", r.recurrent = 1, r.reserve = 0, r.device = 0, r.prefix_cache = 1,
    r.shared_prefix = 9;
    memset(rec, 0, sizeof rec);
    o = run(&r, tok, rec, -1);
    CHECK_MSG(o.preempted > 0 && o.pool.hits_snaps >= 1, "recurrent+scarce+cache: %ld preemptions, %llu snapshots "
              "restored", o.preempted, (unsigned long long)o.pool.hits_snaps);
    /* stop strings and text */
    scenario d = {"text", 16, 4, 16, 8, 8 * 16, 96, 1, 0, 0, 1, 1, 30, 40, 4, 0, 0, 0};
    memset(rec, 0, sizeof rec);
    o = run(&d, tok, rec, -1);
    CHECK_MSG(o.ends[NF_SEQ_STOP] >= 3, "text: %d sequences stopped on a string", o.ends[NF_SEQ_STOP]);
    /* cancellation: sequence 2 mid-decode (callback, after 3 tokens), sequence 0 mid-prefill (its prompt
     * is longer than the chunk: after step 1 it holds pages and has not sampled) */
    scenario x = {"cancel", 8, 4, 8, 4, 64, 128, 1, 0, 0, 0, 20, 60, 20, 5, 0, 0, 0};
    memset(rec, 0, sizeof rec);
    rec[2].cancel_after = 3;
    run(&x, tok, rec, 0);
    CHECK_EQ_INT(rec[2].end, NF_SEQ_CANCELLED);
    CHECK_EQ_INT(rec[2].n_toks, 3);
    CHECK_EQ_INT(rec[0].end, NF_SEQ_CANCELLED);
    CHECK_EQ_INT(rec[0].n_toks, 0);
}

/* A sequence that needs more pages than the pool ends with NF_SEQ_NO_PAGES, alone or not, and gives
 * its pages back; bad arguments are refused with messages. */
static void limits(void)
{
    toy t = {.pages = 3, .pt = 4, .chunk = 8, .max_seqs = 2, .ctx = 64};
    toy_pages(&t);
    nf_sched_backend be = {.state = &t, .forward = toy_forward, .copy_page = toy_copy};
    nf_sched_opts o = {.vocab = VOCAB, .ctx = 64, .chunk = 8, .max_seqs = 2, .page_tokens = 4, .kv_pages = 3};
    nf_sched *s = NULL;
    nf_error e;
    CHECK(nf_sched_create(&be, &o, &s, &e) == NF_OK);
    t.sched = s;
    record r1 = {0}, r2 = {0};
    nf_seq_params p = {.sampling = nf_sampler_defaults(), .max_new = 40, .emit = on_event, .ctx = &r1};
    p.sampling.temp = 0;
    int32_t prompt[20];
    for (int i = 0; i < 20; i++) prompt[i] = i % VOCAB;
    CHECK(nf_sched_add(s, prompt, 6, &p, &r1.id, &e) == NF_OK); /* grows past 12 positions */
    p.ctx = &r2;
    CHECK(nf_sched_add(s, prompt, 20, &p, &r2.id, &e) == NF_OK); /* 5 pages at admission */
    for (int i = 0; i < 100 && !nf_sched_idle(s); i++) {
        nf_sched_step_info info;
        CHECK(nf_sched_step(s, &info, &e) == NF_OK);
    }
    CHECK(nf_sched_idle(s));
    CHECK_EQ_INT(r1.end, NF_SEQ_NO_PAGES);
    CHECK_EQ_INT(r2.end, NF_SEQ_NO_PAGES);
    CHECK_EQ_INT(r1.n_toks, 12 - 6 + 1); /* the logits of position 11, the pool's last, give the 7th */
    CHECK_EQ_INT(r2.n_toks, 0);
    want w;
    oracle(prompt, 6, &p, 64, NULL, &w);
    CHECK(memcmp(r1.toks, w.toks, r1.n_toks * sizeof *w.toks) == 0);
    CHECK_EQ_INT(nf_kvpool_available(nf_sched_pool(s)), 3);
    CHECK_EQ_INT(t.violations, 0);
    uint64_t id;
    const int32_t bad[2] = {1, VOCAB};
    CHECK(nf_sched_add(s, bad, 2, &p, &id, &e) == NF_ERR_INVALID_ARG);
    CHECK_CONTAINS(e.msg, "prompt[1]");
    CHECK(nf_sched_add(s, bad, 0, &p, &id, &e) == NF_ERR_INVALID_ARG);
    const char *stop = "x";
    p.stops = &stop, p.n_stops = 1;
    CHECK(nf_sched_add(s, bad, 1, &p, &id, &e) == NF_ERR_INVALID_ARG);
    CHECK_CONTAINS(e.msg, "tokenizer");
    CHECK(nf_sched_cancel(s, 999, &e) == NF_ERR_INVALID_ARG);
    nf_sched_remove(s, r1.id);
    CHECK(nf_sched_tokens(s, r1.id, NULL, NULL) == NULL);
    nf_sched_free(s);
    nf_sched_opts z = o;
    z.chunk = 0;
    CHECK(nf_sched_create(&be, &z, &s, &e) == NF_ERR_INVALID_ARG && s == NULL);
    z = o; /* state slots with the prefix cache: the state is not in the pages, so snapshots are needed */
    z.state_slots = 1;
    CHECK(nf_sched_create(&be, &z, &s, &e) == NF_ERR_INVALID_ARG && s == NULL);
    CHECK_CONTAINS(e.msg, "state_snaps > 0 (0)");
    z.state_snaps = 4; /* and slot_copy (this backend has none) */
    CHECK(nf_sched_create(&be, &z, &s, &e) == NF_ERR_INVALID_ARG && s == NULL);
    CHECK_CONTAINS(e.msg, "needs slot_copy");
    toy_free(&t);
}

/* Recurrent with the cache: a finished sequence left a 16-token prefix's pages without a snapshot there;
 * four sequences with that prefix arrive together. The first computes it and cuts its piece at 16 (the
 * snapshot); the other three wait that step, then restore it: 24 + 3 x 8 prompt tokens fed instead of
 * 4 x 24, and every sequence's tokens the oracle's. */
static void snapshot_wait(void)
{
    toy t = {.pages = 64, .pt = 4, .chunk = 64, .max_seqs = 8, .ctx = 64, .recurrent = 1, .snaps = 8};
    toy_pages(&t);
    nf_sched_backend be = {.state = &t, .forward = toy_forward, .copy_page = toy_copy, .slot_copy = toy_slot_copy};
    nf_sched_opts o = {.vocab = VOCAB, .ctx = 64, .chunk = 64, .max_seqs = 8, .page_tokens = 4, .kv_pages = 64,
                       .state_slots = 1, .state_snaps = 8};
    nf_sched *s = NULL;
    nf_error e;
    CHECK(nf_sched_create(&be, &o, &s, &e) == NF_OK);
    t.sched = s;
    static record r[5];
    memset(r, 0, sizeof r);
    int32_t prompt[5][25];
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 25; j++) prompt[i][j] = j < 16 ? (j * 5 + 1) % VOCAB : (i * 11 + j * 3) % VOCAB;
    nf_seq_params p = {.sampling = nf_sampler_defaults(), .max_new = 5, .emit = on_event};
    p.sampling.temp = 0;
    long fed = 0;
    for (int i = 0; i < 5; i++) {
        p.ctx = &r[i];
        /* the first: 25 tokens (its own cut falls at 24, not at the shared 16); then four of 24 */
        CHECK(nf_sched_add(s, prompt[i], i ? 24 : 25, &p, &r[i].id, &e) == NF_OK);
        if (i && i < 4) continue;
        for (int k = 0; k < 100 && !nf_sched_idle(s); k++) {
            nf_sched_step_info info;
            CHECK(nf_sched_step(s, &info, &e) == NF_OK);
            if (i) fed += info.n_tokens;
        }
    }
    const nf_kvpool_stats ks = nf_kvpool_get_stats(nf_sched_pool(s));
    CHECK_MSG(ks.hits_snaps == 3, "snapshot wait: %llu snapshots restored (want 3)", (unsigned long long)ks.hits_snaps);
    CHECK_MSG(fed == 24 + 3 * 8 + 4 * 4, "snapshot wait: %ld tokens fed (want 64)", fed);
    for (int i = 0; i < 5; i++) {
        want w;
        oracle(prompt[i], i ? 24 : 25, &p, 64, NULL, &w);
        CHECK_MSG(r[i].n_toks == 5 && !memcmp(r[i].toks, w.toks, 5 * sizeof *w.toks), "snapshot wait: sequence %d", i);
    }
    CHECK_EQ_INT(t.violations, 0);
    nf_sched_free(s);
    toy_free(&t);
}

int main(void)
{
    nf_tokenizer *tok = letters_tokenizer(VOCAB);
    if (tok) scenarios(tok);
    limits();
    snapshot_wait();
    nf_tok_free(tok);
    return nf_test_report();
}

/* One engine, one job at a time (worker.h). The generation loop is the serving form of
 * nf_generate's (engine/generate.c): it also checks for cancellation between tokens, reports every
 * token as an event (with log-probabilities when asked), applies OpenAI's presence and frequency
 * penalties, and can ignore end-of-generation ids. */
#define _POSIX_C_SOURCE 200809L
#include "serve/worker.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/generate.h"
#include "serve/stops.h"

typedef struct worker {
    nf_serve_backend base;
    nf_serve_worker_opts o;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    nf_serve_job **queue; /* [cap] ring of waiting jobs */
    size_t q_head, q_n, q_cap;
    nf_serve_job *running;
    int stopping;
    nf_tok_ids seq; /* the tokens in the engine's cache, for prefix reuse between requests */
    size_t kv_used; /* seq.n as of the last job's end, under mu, for stats */
    float *scratch; /* [vocab] logits after penalties */
    int32_t *counts; /* [vocab] generated-token counts for the penalties */
} worker;

/* ---- one job ------------------------------------------------------------------------------ */

typedef struct run_state {
    worker *w;
    nf_serve_job *j;
    nf_sampler *s;
    nf_tok_stream ts;
    char *text; /* everything generated, for the stop strings */
    size_t len, cap, shown;
} run_state;

static int is_eos(const worker *w, int32_t id)
{
    for (size_t i = 0; i < w->o.n_eos; i++)
        if (w->o.eos[i] == id) return 1;
    return 0;
}

static nf_status push_id(nf_tok_ids *v, int32_t id, nf_error *err)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 256;
        int32_t *p = realloc(v->ids, cap * sizeof *p);
        if (!p) return nf_error_set(err, NF_ERR_NOMEM, "out of memory");
        v->ids = p;
        v->cap = cap;
    }
    v->ids[v->n++] = id;
    return NF_OK;
}

/* Runs the prompt after the longest prefix the cache already holds (a chat page resends the whole
 * conversation each turn). At least one token runs, to get logits. */
static nf_status prefill(worker *w, const nf_serve_req *r, nf_error *err)
{
    nf_engine *e = w->o.engine;
    if (!r->n_prompt) return nf_error_set(err, NF_ERR_INVALID_ARG, "an empty prompt"); /* nothing to get logits from */
    size_t common = 0;
    while (common < w->seq.n && common < r->n_prompt && common < e->n_past && w->seq.ids[common] == r->prompt[common])
        common++;
    if (common == r->n_prompt) common--;
    nf_engine_truncate(e, (uint32_t)common);
    w->seq.n = common;
    nf_status rc = nf_engine_prefill(e, r->prompt + common, r->n_prompt - common, NULL, err);
    for (size_t i = common; !rc && i < r->n_prompt; i++) rc = push_id(&w->seq, r->prompt[i], err);
    if (rc) w->seq.n = e->n_past = 0; /* the cache is in an unknown state: start afresh next time */
    return rc;
}

/* log-softmax of logits[id] and the k best alternatives (ties to the lower id). */
static void logprobs(const float *logits, uint32_t vocab, int32_t id, int k, nf_serve_event *ev)
{
    float mx = logits[0];
    for (uint32_t i = 1; i < vocab; i++) mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0;
    for (uint32_t i = 0; i < vocab; i++) sum += exp((double)(logits[i] - mx));
    double lse = (double)mx + log(sum);
    ev->logprob = (float)((double)logits[id] - lse);
    ev->n_top = 0;
    for (uint32_t i = 0; i < vocab && k > 0; i++) {
        int n = ev->n_top, at = n;
        while (at > 0 && logits[i] > logits[ev->top_ids[at - 1]]) at--;
        if (at >= k) continue;
        if (n < k) n++;
        memmove(ev->top_ids + at + 1, ev->top_ids + at, (size_t)(n - 1 - at) * sizeof *ev->top_ids);
        ev->top_ids[at] = (int32_t)i;
        ev->n_top = n;
    }
    for (int i = 0; i < ev->n_top; i++) ev->top_lp[i] = (float)((double)logits[ev->top_ids[i]] - lse);
}

/* The next id: on the host when penalties or log-probabilities need every logit, else through
 * nf_engine_next (which selects on the device when it can). */
static nf_status next_id(run_state *st, nf_serve_event *ev, int32_t *id, nf_error *err)
{
    worker *w = st->w;
    const nf_serve_req *r = &st->j->req;
    nf_engine *e = w->o.engine;
    int penalties = r->presence_penalty != 0 || r->frequency_penalty != 0;
    if (!penalties && !r->logprobs) return nf_engine_next(e, st->s, w->seq.ids, w->seq.n, id, err);
    const float *lg = nf_engine_logits(e, err);
    if (!lg) return err->code;
    uint32_t vocab = e->model->cfg.vocab;
    memcpy(w->scratch, lg, vocab * sizeof *lg);
    if (penalties)
        for (uint32_t i = 0; i < vocab; i++)
            if (w->counts[i])
                w->scratch[i] -= r->presence_penalty + r->frequency_penalty * (float)w->counts[i];
    *id = nf_sampler_sample(st->s, w->scratch, w->seq.ids, w->seq.n);
    if (r->logprobs) logprobs(lg, vocab, *id, r->top_logprobs, ev);
    return NF_OK;
}

static nf_status append_text(run_state *st, const char *s, size_t n, nf_error *err)
{
    if (st->len + n + 1 > st->cap) {
        size_t cap = (st->len + n + 1) * 2;
        char *p = realloc(st->text, cap);
        if (!p) return nf_error_set(err, NF_ERR_NOMEM, "out of memory");
        st->text = p;
        st->cap = cap;
    }
    memcpy(st->text + st->len, s, n);
    st->len += n;
    return NF_OK;
}

/* Adds a token's text; *stopped when a stop string completed. The event carries what is now safe. */
static nf_status take_piece(run_state *st, const char *piece, size_t n, int final, nf_serve_event *ev, int *stopped,
                            nf_error *err)
{
    nf_status rc = append_text(st, piece, n, err);
    if (rc) return rc;
    const nf_serve_req *r = &st->j->req;
    size_t safe;
    *stopped = nf_serve_stop_scan(st->text, st->len, st->shown, r->stops, r->n_stops, final, &safe);
    ev->text = st->text + st->shown;
    ev->len = safe - st->shown;
    st->shown = safe;
    return NF_OK;
}

static nf_status push(nf_serve_job *j, const nf_serve_event *ev, nf_error *err)
{
    return nf_serve_job_push(j, ev) ? nf_error_set(err, NF_ERR_NOMEM, "out of memory") : NF_OK;
}

/* The token loop; *finish says why it ended. */
static nf_status generate(run_state *st, nf_serve_finish *finish, nf_error *err)
{
    worker *w = st->w;
    nf_serve_job *j = st->j;
    nf_engine *e = w->o.engine;
    nf_status rc = NF_OK;
    *finish = NF_FINISH_LENGTH;
    for (size_t i = 0; i < j->req.max_tokens; i++) {
        if (nf_serve_job_cancelled(j)) {
            *finish = NF_FINISH_CANCELLED;
            break;
        }
        nf_serve_event ev = {.kind = NF_EV_TOKEN};
        if ((rc = next_id(st, &ev, &ev.id, err))) break;
        j->completion_tokens++;
        if (w->counts) w->counts[ev.id]++;
        if (!j->req.ignore_eos && is_eos(w, ev.id)) {
            *finish = NF_FINISH_STOP;
            break;
        }
        size_t n;
        const char *piece = nf_tok_stream_put(&st->ts, ev.id, &n, err);
        int stopped = 0;
        if (!piece) rc = err->code;
        if (rc || (rc = take_piece(st, piece, n, 0, &ev, &stopped, err)) || (rc = push(j, &ev, err))) break;
        if (stopped) {
            *finish = NF_FINISH_STOP;
            break;
        }
        if (i + 1 == j->req.max_tokens || e->n_past >= e->opts.ctx) break; /* nothing would read its logits */
        e->defer_logits = 1;
        rc = nf_engine_decode(e, ev.id, err);
        e->defer_logits = 0;
        if (rc) {
            w->seq.n = e->n_past = 0;
            break;
        }
        if ((rc = push_id(&w->seq, ev.id, err))) break;
    }
    return rc;
}

/* The END event: the held-back tail (at the end nothing more can complete a stop string). */
static void finish_job(run_state *st, nf_status rc, nf_serve_finish finish, const nf_error *err)
{
    nf_serve_event ev = {.kind = NF_EV_END, .finish = finish};
    nf_error e2;
    if (!rc && finish == NF_FINISH_LENGTH) {
        size_t n;
        const char *rest = nf_tok_stream_flush(&st->ts, &n);
        int stopped = 0;
        if (take_piece(st, rest, n, 1, &ev, &stopped, &e2) == NF_OK && stopped) ev.finish = NF_FINISH_STOP;
    }
    if (rc) {
        ev.finish = NF_FINISH_ERROR;
        ev.text = (char *)err->msg;
        ev.len = strlen(err->msg);
    }
    if (nf_serve_job_push(st->j, &ev)) {
        ev.text = NULL; /* out of memory: an END without text still ends the request */
        ev.len = 0;
        nf_serve_job_push(st->j, &ev);
    }
}

static void run_job(worker *w, nf_serve_job *j)
{
    run_state st = {.w = w, .j = j};
    nf_error err;
    nf_error_clear(&err);
    nf_serve_finish finish = NF_FINISH_ERROR;
    uint32_t vocab = w->o.engine->model->cfg.vocab;
    if (w->counts) memset(w->counts, 0, vocab * sizeof *w->counts);
    j->prompt_tokens = j->req.n_prompt;
    nf_status rc = nf_tok_stream_init(&st.ts, w->o.tok, NF_TOK_SKIP_SPECIAL, &err);
    if (!rc) {
        if (!(rc = nf_sampler_create(&j->req.sampling, vocab, &st.s, &err)) && !(rc = prefill(w, &j->req, &err)))
            rc = generate(&st, &finish, &err);
        finish_job(&st, rc, finish, &err);
        nf_tok_stream_free(&st.ts);
    } else
        finish_job(&st, rc, finish, &err);
    nf_sampler_free(st.s);
    free(st.text);
}

/* ---- the thread and the queue ------------------------------------------------------------- */

static void *worker_main(void *arg)
{
    worker *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->q_n && !w->stopping) pthread_cond_wait(&w->cv, &w->mu);
        if (w->stopping) break;
        nf_serve_job *j = w->queue[w->q_head];
        w->q_head = (w->q_head + 1) % w->q_cap;
        w->q_n--;
        w->running = j;
        pthread_mutex_unlock(&w->mu);
        run_job(w, j);
        pthread_mutex_lock(&w->mu);
        w->running = NULL;
        w->kv_used = w->seq.n;
        pthread_mutex_unlock(&w->mu);
        nf_serve_job_release(j);
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static nf_status w_submit(nf_serve_backend *b, nf_serve_job *j, nf_error *err)
{
    worker *w = (worker *)b;
    pthread_mutex_lock(&w->mu);
    nf_status rc = NF_OK;
    if (w->stopping)
        rc = nf_error_set(err, NF_ERR_REFUSED, "the server is shutting down");
    else if (w->q_n + (w->running != NULL) >= w->o.max_waiting + 1) /* one runs, max_waiting wait */
        rc = nf_error_set(err, NF_ERR_REFUSED, "the waiting queue is full (%zu requests)", w->q_n);
    else {
        nf_serve_job_retain(j);
        w->queue[(w->q_head + w->q_n++) % w->q_cap] = j;
        pthread_cond_signal(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return rc;
}

static void w_cancel(nf_serve_backend *b, nf_serve_job *j)
{
    (void)b;
    pthread_mutex_lock(&j->mu);
    j->cancelled = 1;
    pthread_mutex_unlock(&j->mu);
}

static void w_stats(nf_serve_backend *b, nf_serve_backend_stats *st)
{
    worker *w = (worker *)b;
    pthread_mutex_lock(&w->mu);
    st->running = w->running != NULL;
    st->waiting = w->q_n;
    st->kv_used = w->kv_used; /* as of the last finished request */
    pthread_mutex_unlock(&w->mu);
    st->kv_total = w->o.engine->opts.ctx;
}

static void w_destroy(nf_serve_backend *b)
{
    worker *w = (worker *)b;
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->stopping = 1;
    if (w->running) w_cancel(b, w->running);
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    for (; w->q_n; w->q_n--, w->q_head = (w->q_head + 1) % w->q_cap) {
        nf_serve_job *j = w->queue[w->q_head];
        nf_serve_event ev = {.kind = NF_EV_END, .finish = NF_FINISH_CANCELLED};
        nf_serve_job_push(j, &ev);
        nf_serve_job_release(j);
    }
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    nf_tok_ids_free(&w->seq);
    free(w->queue);
    free(w->scratch);
    free(w->counts);
    free(w);
}

static const nf_serve_backend_ops worker_ops = {w_submit, w_cancel, w_stats, w_destroy};

nf_status nf_serve_worker_create(const nf_serve_worker_opts *o, nf_serve_backend **out, nf_error *err)
{
    *out = NULL;
    worker *w = calloc(1, sizeof *w);
    uint32_t vocab = o->engine->model->cfg.vocab;
    if (w) {
        w->q_cap = o->max_waiting + 1;
        w->queue = calloc(w->q_cap, sizeof *w->queue);
        w->scratch = malloc(vocab * sizeof *w->scratch);
        w->counts = calloc(vocab, sizeof *w->counts);
    }
    if (!w || !w->queue || !w->scratch || !w->counts) {
        if (w) free(w->queue), free(w->scratch), free(w->counts);
        free(w);
        return nf_error_set(err, NF_ERR_NOMEM, "out of memory");
    }
    w->base.ops = &worker_ops;
    w->o = *o;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->thread, NULL, worker_main, w)) {
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        free(w->queue), free(w->scratch), free(w->counts);
        free(w);
        return nf_error_set(err, NF_ERR_INTERNAL, "cannot start the worker thread");
    }
    *out = &w->base;
    return NF_OK;
}

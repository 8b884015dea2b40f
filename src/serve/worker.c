/* The scheduler-backed backend (worker.h). The HTTP threads only touch the inbox, the counters and
 * the jobs' cancel flags, under the worker's mutex or the job's; the scheduler, the engine and the
 * list of live jobs belong to the worker thread. Its loop: take new jobs into the scheduler, cancel
 * the jobs whose clients went away (their pages return at once), run one step, and let go of the
 * jobs that ended. The scheduler's events become the jobs' events (sched.h's emit callback). */
#define _POSIX_C_SOURCE 200809L
#include "serve/worker.h"

#include <stdlib.h>
#include <string.h>

#include "engine/sched.h"

typedef struct worker worker;

/* A job while the scheduler holds its sequence. */
typedef struct live {
    worker *w;
    nf_serve_job *j;
    uint64_t id;  /* the scheduler's sequence */
    int ended;    /* its END was pushed: let go of it after the step */
    int failed;   /* it ends with NF_FINISH_ERROR and w->err's message */
} live;

struct worker {
    nf_serve_backend base;
    nf_serve_worker_opts o;
    nf_sched *sched;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* under mu */
    nf_serve_job **inbox; /* [cap] submitted, not yet in the scheduler, in arrival order */
    size_t n_inbox, cap;  /* cap = max_seqs + max_waiting: the most jobs held at once */
    size_t held;          /* jobs in the inbox or live */
    int stopping;
    nf_serve_backend_stats st; /* as of the last step (waiting: without the inbox) */
    /* the worker thread's */
    live **lives;         /* [cap] */
    size_t n_live;
    nf_serve_job **taken; /* [cap] scratch for the inbox */
    nf_error err;         /* why the last failing step or add failed */
};

/* ---- events ------------------------------------------------------------------------------- */

static int is_eos(const nf_serve_worker_opts *o, int32_t id)
{
    for (size_t i = 0; i < o->n_eos; i++)
        if (o->eos[i] == id) return 1;
    return 0;
}

static nf_serve_finish finish_of(nf_seq_end end)
{
    switch (end) {
    case NF_SEQ_EOS:
    case NF_SEQ_STOP: return NF_FINISH_STOP;
    case NF_SEQ_CANCELLED: return NF_FINISH_CANCELLED;
    case NF_SEQ_NO_PAGES: return NF_FINISH_ERROR;
    default: return NF_FINISH_LENGTH; /* max_tokens or the context */
    }
}

/* The END event; without memory for its text, an END without text still ends the request. */
static void push_end(nf_serve_job *j, nf_serve_finish finish, const char *text, size_t len)
{
    nf_serve_event ev = {.kind = NF_EV_END, .finish = finish, .text = (char *)text, .len = len};
    if (nf_serve_job_push(j, &ev)) {
        ev.text = NULL, ev.len = 0;
        nf_serve_job_push(j, &ev);
    }
}

static void on_token(live *l, const nf_seq_event *ev)
{
    nf_serve_job *j = l->j;
    j->completion_tokens++;
    if (!j->req.ignore_eos && is_eos(&l->w->o, ev->token)) return; /* the END that follows says "stop" */
    nf_serve_event e = {.kind = NF_EV_TOKEN, .text = (char *)ev->text, .len = ev->len, .id = ev->token,
                        .logprob = ev->logprob, .n_top = (int)ev->n_top};
    if (ev->n_top) {
        memcpy(e.top_ids, ev->top_ids, ev->n_top * sizeof *e.top_ids);
        memcpy(e.top_lp, ev->top_lp, ev->n_top * sizeof *e.top_lp);
    }
    if (nf_serve_job_push(j, &e) == NF_OK) return;
    l->failed = 1; /* a stream that lost a token must not go on as if it had not */
    nf_error_set(&l->w->err, NF_ERR_NOMEM, "out of memory for a token event");
    nf_sched_cancel(l->w->sched, l->id, NULL);
}

/* The scheduler's emit callback (on the worker thread, inside a step or a cancel). */
static void on_event(void *ctx, const nf_seq_event *ev)
{
    live *l = ctx;
    if (ev->token >= 0) {
        on_token(l, ev);
        return;
    }
    if (l->failed) push_end(l->j, NF_FINISH_ERROR, l->w->err.msg, strlen(l->w->err.msg));
    else if (ev->end == NF_SEQ_NO_PAGES) {
        static const char msg[] = "the request needs more KV pages than the pool holds";
        push_end(l->j, NF_FINISH_ERROR, msg, sizeof msg - 1);
    } else
        push_end(l->j, finish_of(ev->end), ev->text, ev->len);
    l->ended = 1;
}

/* ---- the worker thread -------------------------------------------------------------------- */

static nf_seq_params params_of(live *l)
{
    const nf_serve_req *r = &l->j->req;
    nf_seq_params p = {.sampling = r->sampling, .max_new = r->max_tokens,
                       .eos = r->ignore_eos ? NULL : l->w->o.eos, .n_eos = r->ignore_eos ? 0 : l->w->o.n_eos,
                       .stops = (const char *const *)r->stops, .n_stops = r->n_stops,
                       .logprobs = r->logprobs, .top_logprobs = (uint32_t)r->top_logprobs,
                       .emit = on_event, .ctx = l, .spec_k = l->w->o.spec_k, .spec_mtp = l->w->o.spec_mtp};
    /* OpenAI's presence and frequency penalties count every token of the reply and none of the
     * prompt; with llama.cpp's repetition penalty on, all three keep llama-server's window (the last
     * 64 tokens of prompt and reply: one window serves every penalty) */
    if (r->sampling.repeat_penalty == 1.0f) {
        p.penalty_reply_only = 1;
        p.sampling.repeat_last_n = (int)r->max_tokens;
    }
    return p;
}

static void drop_job(worker *w, nf_serve_job *j)
{
    nf_serve_job_release(j);
    pthread_mutex_lock(&w->mu);
    w->held--;
    pthread_mutex_unlock(&w->mu);
}

/* A new sequence for the job; a job the scheduler refuses ends at once with the reason. */
static void add_job(worker *w, nf_serve_job *j)
{
    j->prompt_tokens = j->req.n_prompt;
    live *l = calloc(1, sizeof *l);
    nf_error err;
    nf_status rc = l ? NF_OK : nf_error_set(&err, NF_ERR_NOMEM, "out of memory");
    if (l) {
        *l = (live){.w = w, .j = j};
        const nf_seq_params p = params_of(l);
        rc = nf_sched_add(w->sched, j->req.prompt, j->req.n_prompt, &p, &l->id, &err);
    }
    if (rc) {
        push_end(j, NF_FINISH_ERROR, err.msg, strlen(err.msg));
        free(l);
        drop_job(w, j);
        return;
    }
    w->lives[w->n_live++] = l;
}

static void take_jobs(worker *w)
{
    pthread_mutex_lock(&w->mu);
    const size_t n = w->n_inbox;
    memcpy(w->taken, w->inbox, n * sizeof *w->taken);
    w->n_inbox = 0;
    w->st.waiting += n; /* still counted until the step's figures replace it */
    pthread_mutex_unlock(&w->mu);
    for (size_t i = 0; i < n; i++) add_job(w, w->taken[i]);
}

/* Jobs whose client went away (or a stopping server, all = 1) end now; their pages go back. */
static void cancel_jobs(worker *w, int all)
{
    for (size_t i = 0; i < w->n_live; i++)
        if (!w->lives[i]->ended && (all || nf_serve_job_cancelled(w->lives[i]->j)))
            nf_sched_cancel(w->sched, w->lives[i]->id, NULL);
}

/* One step; a failed one ends every live job with the error (the scheduler's state is then unknown). */
static void step(worker *w, nf_sched_step_info *info)
{
    memset(info, 0, sizeof *info);
    if (nf_sched_idle(w->sched) || nf_sched_step(w->sched, info, &w->err) == NF_OK) return;
    for (size_t i = 0; i < w->n_live; i++) {
        live *l = w->lives[i];
        if (l->ended) continue;
        l->failed = 1;
        nf_sched_cancel(w->sched, l->id, NULL);
    }
}

/* Lets go of the jobs that ended (keeping the others in order). */
static void reap(worker *w)
{
    size_t k = 0;
    for (size_t i = 0; i < w->n_live; i++) {
        live *l = w->lives[i];
        if (!l->ended) {
            w->lives[k++] = l;
            continue;
        }
        nf_sched_remove(w->sched, l->id);
        drop_job(w, l->j);
        free(l);
    }
    w->n_live = k;
}

static void publish(worker *w, const nf_sched_step_info *info)
{
    size_t waiting, active;
    nf_sched_count(w->sched, &waiting, &active);
    const nf_kvpool *pool = nf_sched_pool(w->sched);
    const size_t avail = nf_kvpool_available(pool);
    pthread_mutex_lock(&w->mu);
    w->st.running = active;
    w->st.waiting = waiting;
    w->st.pages_free = avail;
    w->st.pages_used = nf_kvpool_pages(pool) - avail;
    w->st.pages_cached = nf_kvpool_n_evictable(pool);
    if (info->n_seqs > w->st.batch_max) w->st.batch_max = info->n_seqs;
    w->st.preemptions += info->n_preempted;
    w->st.steps += info->n_tokens > 0;
    w->st.spec_verifications += info->n_verified;
    w->st.spec_drafts += info->n_drafted;
    w->st.spec_accepted += info->n_accepted;
    pthread_mutex_unlock(&w->mu);
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    for (;;) {
        pthread_mutex_lock(&w->mu);
        while (!w->n_inbox && !w->n_live && !w->stopping) pthread_cond_wait(&w->cv, &w->mu);
        const int stopping = w->stopping;
        pthread_mutex_unlock(&w->mu);
        if (stopping) break;
        take_jobs(w);
        cancel_jobs(w, 0);
        nf_sched_step_info info;
        step(w, &info);
        reap(w);
        publish(w, &info);
    }
    cancel_jobs(w, 1);
    reap(w);
    return NULL;
}

/* ---- the HTTP threads' side --------------------------------------------------------------- */

static nf_status w_submit(nf_serve_backend *b, nf_serve_job *j, nf_error *err)
{
    worker *w = (worker *)b;
    pthread_mutex_lock(&w->mu);
    nf_status rc = NF_OK;
    if (w->stopping)
        rc = nf_error_set(err, NF_ERR_REFUSED, "the server is shutting down");
    else if (w->held >= w->cap)
        rc = nf_error_set(err, NF_ERR_REFUSED, "the waiting queue is full (%zu requests running or waiting)", w->held);
    else {
        nf_serve_job_retain(j);
        w->inbox[w->n_inbox++] = j;
        w->held++;
        pthread_cond_signal(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return rc;
}

/* The worker sees the flag before its next step (it never sleeps while a job is live). */
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
    *st = w->st;
    st->waiting += w->n_inbox;
    pthread_mutex_unlock(&w->mu);
}

static void w_free(worker *w)
{
    nf_sched_free(w->sched);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w->inbox);
    free(w->lives);
    free(w->taken);
    free(w);
}

static void w_destroy(nf_serve_backend *b)
{
    worker *w = (worker *)b;
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->stopping = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    for (size_t i = 0; i < w->n_inbox; i++) {
        push_end(w->inbox[i], NF_FINISH_CANCELLED, NULL, 0);
        nf_serve_job_release(w->inbox[i]);
    }
    w_free(w);
}

static const nf_serve_backend_ops worker_ops = {w_submit, w_cancel, w_stats, w_destroy};

nf_status nf_serve_worker_create(const nf_serve_worker_opts *o, nf_serve_backend **out, nf_error *err)
{
    *out = NULL;
    worker *w = calloc(1, sizeof *w);
    if (!w) return nf_error_set(err, NF_ERR_NOMEM, "out of memory");
    w->base.ops = &worker_ops;
    w->o = *o;
    w->cap = o->engine->opts.max_seqs + o->max_waiting;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->inbox = calloc(w->cap, sizeof *w->inbox);
    w->lives = calloc(w->cap, sizeof *w->lives);
    w->taken = calloc(w->cap, sizeof *w->taken);
    const nf_sched_opts so = {.tok = o->tok};
    nf_status rc = !w->inbox || !w->lives || !w->taken ? nf_error_set(err, NF_ERR_NOMEM, "out of memory")
                                                       : nf_sched_create_engine(o->engine, &so, &w->sched, err);
    const nf_seq_params spec = {.spec_k = o->spec_k, .spec_mtp = o->spec_mtp};
    if (!rc) rc = nf_sched_check_spec(w->sched, &spec, err); /* refused at start, not per request */
    if (!rc) w->st.pages_free = nf_kvpool_pages(nf_sched_pool(w->sched));
    if (!rc && pthread_create(&w->thread, NULL, worker_main, w))
        rc = nf_error_set(err, NF_ERR_INTERNAL, "cannot start the worker thread");
    if (rc) {
        w_free(w);
        return rc;
    }
    *out = &w->base;
    return NF_OK;
}

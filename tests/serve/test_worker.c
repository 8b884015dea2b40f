/* The scheduler-backed worker (serve/worker.h) over a toy engine whose model is one rule: after token
 * t comes t + 1 (mod 26; one letter per token), so every expected text is written down from the
 * prompt alone. The toy counts the sequences of each forward, can hold its first forward at a gate
 * (so that jobs submitted meanwhile meet in one batch), can be slow, and can fail every forward that
 * feeds a given letter.
 * Checked: texts, finish reasons and usage of jobs run together; batching; end-of-generation ids
 * (not sent, counted) and ignore_eos; log-probabilities against the closed form; cancellation and
 * the pool full again; the waiting bound (503); a failing forward ends the jobs of its batch with the
 * error and the worker serves on; destroy ends running jobs. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nf_test.h"
#include "common/letters_tokenizer.h"
#include "serve/worker.h"

enum { V = 26, CTX = 256, PT = 16, MAX_SEQS = 8, CHUNK = 64 };

typedef struct toy {
    pthread_mutex_t gate; /* held by the test to keep the first forward waiting */
    int gated;
    int fail_token;   /* a forward that feeds it fails; -1: none */
    long slow_ns;     /* each forward takes at least this long */
    uint32_t batch_max;
    long forwards;
} toy;

static nf_status toy_forward(void *state, const nf_batch *b, float *logits, nf_error *err)
{
    toy *t = state;
    if (t->gated) {
        pthread_mutex_lock(&t->gate);
        pthread_mutex_unlock(&t->gate);
    }
    if (t->slow_ns) nanosleep(&(struct timespec){0, t->slow_ns}, NULL);
    t->forwards++;
    if (b->n_seqs > t->batch_max) t->batch_max = b->n_seqs;
    for (uint32_t i = 0; i < b->n_tokens; i++)
        if (b->tokens[i] == t->fail_token) return nf_error_set(err, NF_ERR_INTERNAL, "toy: fed '%c'", 'a' + t->fail_token);
    for (uint32_t i = 0; i < b->n_seqs; i++) {
        const int32_t last = b->tokens[b->seq_start[i + 1] - 1];
        for (int v = 0; v < V; v++) logits[(size_t)i * V + v] = v == (last + 1) % V ? 1.0f : 0.0f;
    }
    return NF_OK;
}

static nf_status toy_copy(void *state, uint32_t dst, uint32_t src, nf_error *err)
{
    (void)state, (void)dst, (void)src, (void)err;
    return NF_OK; /* the toy keeps no keys or values */
}

/* ---- the fixture: a toy engine, a worker over it ---- */

typedef struct fixture {
    toy t;
    nf_backend_ops ops;
    nf_model model;
    nf_engine eng;
    nf_serve_backend *b;
} fixture;

static void start(fixture *f, const nf_tokenizer *tok, const int32_t *eos, size_t n_eos, size_t max_waiting, int gated)
{
    memset(f, 0, sizeof *f);
    pthread_mutex_init(&f->t.gate, NULL);
    f->t.gated = gated;
    f->t.fail_token = -1;
    if (gated) pthread_mutex_lock(&f->t.gate);
    f->ops = (nf_backend_ops){.name = "toy", .forward = toy_forward, .copy_page = toy_copy};
    f->model.cfg.vocab = V;
    f->eng = (nf_engine){.model = &f->model, .ops = &f->ops, .state = &f->t,
                         .opts = {.ctx = CTX, .chunk = CHUNK, .page_tokens = PT, .kv_pages = MAX_SEQS * (CTX / PT),
                                  .max_seqs = MAX_SEQS}};
    const nf_serve_worker_opts o = {.engine = &f->eng, .tok = tok, .eos = eos, .n_eos = n_eos, .max_waiting = max_waiting};
    nf_error e;
    if (nf_serve_worker_create(&o, &f->b, &e)) CHECK_MSG(0, "worker: %s", e.msg);
}

static void open_gate(fixture *f)
{
    pthread_mutex_unlock(&f->t.gate);
}

static void stop(fixture *f)
{
    f->b->ops->destroy(f->b);
    pthread_mutex_destroy(&f->t.gate);
}

static nf_serve_job *submit(fixture *f, int32_t first, size_t max_tokens, nf_status want)
{
    nf_serve_req r = {0};
    r.prompt = malloc(sizeof *r.prompt);
    r.prompt[0] = first;
    r.n_prompt = 1;
    r.max_tokens = max_tokens;
    r.sampling = nf_sampler_defaults();
    r.sampling.temp = 0;
    nf_serve_job *j = NULL;
    nf_error e;
    CHECK(nf_serve_job_create(&r, &j, &e) == NF_OK);
    CHECK_EQ_INT(f->b->ops->submit(f->b, j, &e), want);
    return j;
}

/* What a job said, read to its END. */
typedef struct heard {
    char text[CTX + 1];
    size_t len;
    int tokens;
    nf_serve_finish finish;
    char end_text[256];
} heard;

static heard listen(nf_serve_job *j)
{
    heard h = {.finish = (nf_serve_finish)-1};
    for (int waits = 0; waits < 500;) {
        nf_serve_event ev;
        if (!nf_serve_job_next(j, &ev, 20)) {
            waits++;
            continue;
        }
        const int text = ev.kind == NF_EV_TOKEN || ev.finish != NF_FINISH_ERROR; /* else the message */
        if (text && h.len + ev.len <= CTX) memcpy(h.text + h.len, ev.text, ev.len), h.len += ev.len;
        if (ev.kind == NF_EV_TOKEN) h.tokens++;
        else {
            h.finish = ev.finish;
            snprintf(h.end_text, sizeof h.end_text, "%.*s", (int)ev.len, ev.text ? ev.text : "");
        }
        free(ev.text);
        if (ev.kind == NF_EV_END) break;
    }
    h.text[h.len] = 0;
    return h;
}

/* The letters after `first`, n of them. */
static void letters_after(int first, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++) out[i] = (char)('a' + (first + 1 + (int)i) % V);
    out[n] = 0;
}

static nf_serve_backend_stats idle_stats(fixture *f)
{
    nf_serve_backend_stats st = {0};
    for (int i = 0; i < 500; i++) {
        f->b->ops->stats(f->b, &st);
        if (!st.running && !st.waiting && !st.pages_used) break;
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
    return st;
}

static void pool_full(fixture *f, const char *what)
{
    const nf_serve_backend_stats st = idle_stats(f);
    CHECK_MSG(st.running == 0 && st.pages_used == 0 && st.pages_free == MAX_SEQS * (CTX / PT), "%s: %zu running, %zu "
              "pages used, %zu free", what, st.running, st.pages_used, st.pages_free);
}

/* n sequences run, each holding one page (a prompt of one token and a few generated: under PT). */
static void pages_of(fixture *f, size_t n)
{
    nf_serve_backend_stats st = {0};
    for (int i = 0; i < 500; i++) {
        f->b->ops->stats(f->b, &st);
        if (st.running == n && st.pages_used == n) break;
        nanosleep(&(struct timespec){0, 1000 * 1000}, NULL);
    }
    CHECK_MSG(st.running == n && st.pages_used == n, "%zu running, %zu pages used, want %zu", st.running, st.pages_used, n);
}

/* ---- the cases ---- */

/* Jobs submitted while the first forward waits meet in one batch; each says exactly its letters. */
static void together(const nf_tokenizer *tok)
{
    fixture f;
    start(&f, tok, NULL, 0, 16, 1);
    nf_serve_job *jobs[12];
    for (int i = 0; i < 12; i++) jobs[i] = submit(&f, i, 20 + (size_t)i, NF_OK);
    open_gate(&f);
    for (int i = 0; i < 12; i++) {
        heard h = listen(jobs[i]);
        char want[CTX + 1];
        letters_after(i, 20 + (size_t)i, want);
        CHECK_MSG(strcmp(h.text, want) == 0 && h.finish == NF_FINISH_LENGTH, "job %d: '%s' (%d), want '%s'", i, h.text,
                  (int)h.finish, want);
        CHECK_EQ_INT(jobs[i]->completion_tokens, 20 + i);
        CHECK_EQ_INT(jobs[i]->prompt_tokens, 1);
        nf_serve_job_release(jobs[i]);
    }
    CHECK_MSG(f.t.batch_max == MAX_SEQS, "largest batch %u", f.t.batch_max);
    pool_full(&f, "together");
    nf_serve_backend_stats st;
    f.b->ops->stats(f.b, &st);
    CHECK_EQ_INT(st.batch_max, MAX_SEQS);
    stop(&f);
}

/* An end-of-generation id ends the job with "stop", is counted in usage and is not sent as text;
 * ignore_eos generates past it. */
static void eos(const nf_tokenizer *tok)
{
    const int32_t eos_id[1] = {5};
    fixture f;
    start(&f, tok, eos_id, 1, 4, 0);
    nf_serve_job *j = submit(&f, 2, 10, NF_OK);
    heard h = listen(j);
    CHECK_MSG(strcmp(h.text, "de") == 0 && h.finish == NF_FINISH_STOP && h.tokens == 2, "eos: '%s'", h.text);
    CHECK_EQ_INT(j->completion_tokens, 3);
    nf_serve_job_release(j);
    nf_serve_req r = {0};
    r.prompt = malloc(sizeof *r.prompt);
    r.prompt[0] = 2, r.n_prompt = 1, r.max_tokens = 6, r.ignore_eos = 1;
    r.sampling = nf_sampler_defaults();
    r.sampling.temp = 0;
    nf_error e;
    CHECK(nf_serve_job_create(&r, &j, &e) == NF_OK && f.b->ops->submit(f.b, j, &e) == NF_OK);
    h = listen(j);
    CHECK_MSG(strcmp(h.text, "defghi") == 0 && h.finish == NF_FINISH_LENGTH, "ignore_eos: '%s'", h.text);
    nf_serve_job_release(j);
    stop(&f);
}

/* Log-probabilities of the toy's logits (one 1, the rest 0) in closed form: the next letter
 * 1 - log(e + 25), the others -log(e + 25), alternatives best first then by id. */
static void logprobs(const nf_tokenizer *tok)
{
    fixture f;
    start(&f, tok, NULL, 0, 4, 0);
    nf_serve_req r = {0};
    r.prompt = malloc(sizeof *r.prompt);
    r.prompt[0] = 7, r.n_prompt = 1, r.max_tokens = 3, r.logprobs = 1, r.top_logprobs = 3;
    r.sampling = nf_sampler_defaults();
    r.sampling.temp = 0;
    nf_serve_job *j;
    nf_error e;
    CHECK(nf_serve_job_create(&r, &j, &e) == NF_OK && f.b->ops->submit(f.b, j, &e) == NF_OK);
    const double z = log(exp(1.0) + (V - 1));
    for (int k = 0; k < 3; k++) {
        nf_serve_event ev;
        CHECK(nf_serve_job_next(j, &ev, 5000));
        CHECK(ev.kind == NF_EV_TOKEN && ev.id == 8 + k && ev.n_top == 3);
        CHECK(fabs(ev.logprob - (1 - z)) < 1e-5 && fabs(ev.top_lp[0] - (1 - z)) < 1e-5 && fabs(ev.top_lp[1] + z) < 1e-5);
        CHECK(ev.top_ids[0] == 8 + k && ev.top_ids[1] == 0 && ev.top_ids[2] == 1);
        free(ev.text);
    }
    heard h = listen(j);
    CHECK(h.finish == NF_FINISH_LENGTH);
    nf_serve_job_release(j);
    stop(&f);
}

/* A cancelled job ends soon with "cancelled" and its pages come back; a job beyond max_seqs +
 * max_waiting is refused; destroy ends the jobs still running. */
static void cancel_and_bounds(const nf_tokenizer *tok)
{
    fixture f;
    start(&f, tok, NULL, 0, 1, 1);
    f.t.slow_ns = 10 * 1000 * 1000; /* 255 tokens take 2.5 s, a second page 150 ms: the cancel comes first */
    nf_serve_job *jobs[MAX_SEQS + 1];
    for (int i = 0; i < MAX_SEQS + 1; i++) jobs[i] = submit(&f, i % 20, CTX - 1, NF_OK);
    nf_serve_job *refused = submit(&f, 0, 4, NF_ERR_REFUSED);
    nf_serve_job_release(refused);
    open_gate(&f);
    nf_serve_event ev;
    CHECK(nf_serve_job_next(jobs[0], &ev, 5000) && ev.kind == NF_EV_TOKEN);
    free(ev.text);
    f.b->ops->cancel(f.b, jobs[0]);
    heard h = listen(jobs[0]);
    CHECK_MSG(h.finish == NF_FINISH_CANCELLED && h.tokens < 30, "cancelled after %d more tokens", h.tokens);
    pages_of(&f, MAX_SEQS); /* its page went back, and the waiting job took the free slot */
    stop(&f); /* the others are still running: each gets its END */
    for (int i = 0; i < MAX_SEQS + 1; i++) {
        if (i) h = listen(jobs[i]);
        CHECK_MSG(h.finish == NF_FINISH_CANCELLED, "job %d ended %d", i, (int)h.finish);
        nf_serve_job_release(jobs[i]);
    }
}

/* A forward that fails ends every job of its batch with the error; the worker serves on. */
static void failure(const nf_tokenizer *tok)
{
    fixture f;
    start(&f, tok, NULL, 0, 4, 1);
    f.t.fail_token = V - 1;
    nf_serve_job *a = submit(&f, 20, 10, NF_OK), *b = submit(&f, 0, 20, NF_OK);
    open_gate(&f);
    heard ha = listen(a), hb = listen(b);
    CHECK_MSG(ha.finish == NF_FINISH_ERROR && strstr(ha.end_text, "fed 'z'") && strcmp(ha.text, "vwxyz") == 0,
              "failing job: '%s', end '%s'", ha.text, ha.end_text);
    CHECK_MSG(hb.finish == NF_FINISH_ERROR && strstr(hb.end_text, "fed 'z'"), "its batch-mate: end '%s'", hb.end_text);
    pool_full(&f, "after a failed step");
    nf_serve_job_release(a);
    nf_serve_job_release(b);
    f.t.fail_token = -1;
    nf_serve_job *c = submit(&f, 1, 4, NF_OK);
    heard hc = listen(c);
    CHECK_MSG(strcmp(hc.text, "cdef") == 0 && hc.finish == NF_FINISH_LENGTH, "after the failure: '%s'", hc.text);
    nf_serve_job_release(c);
    stop(&f);
}

int main(void)
{
    nf_tokenizer *tok = letters_tokenizer(V);
    if (tok) {
        together(tok);
        eos(tok);
        logprobs(tok);
        cancel_and_bounds(tok);
        failure(tok);
    }
    nf_tok_free(tok);
    return nf_test_report();
}

/* A job's reference count and event queue (backend.h). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/timer.h"
#include "serve/backend.h"

static void req_free(nf_serve_req *r)
{
    free(r->prompt);
    for (size_t i = 0; i < r->n_stops; i++) free(r->stops[i]);
    memset(r, 0, sizeof *r);
}

nf_status nf_serve_job_create(nf_serve_req *req, nf_serve_job **out, nf_error *err)
{
    *out = NULL;
    nf_serve_job *j = calloc(1, sizeof *j);
    if (!j) {
        req_free(req);
        return nf_error_set(err, NF_ERR_NOMEM, "out of memory");
    }
    j->req = *req;
    memset(req, 0, sizeof *req);
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 1;
    j->ttft = -1;
    j->t0_ns = nf_time_ns();
    *out = j;
    return NF_OK;
}

void nf_serve_job_retain(nf_serve_job *j)
{
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
}

void nf_serve_job_release(nf_serve_job *j)
{
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int last = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (!last) return;
    for (size_t i = j->head; i < j->n_ev; i++) free(j->ev[i].text);
    free(j->ev);
    req_free(&j->req);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

nf_status nf_serve_job_push(nf_serve_job *j, const nf_serve_event *ev)
{
    char *text = malloc(ev->len + 1);
    if (!text) return NF_ERR_NOMEM;
    if (ev->len) memcpy(text, ev->text, ev->len);
    text[ev->len] = 0;
    pthread_mutex_lock(&j->mu);
    if (j->n_ev == j->cap_ev) {
        /* compact what was read before growing, so a long stream stays small */
        if (j->head) {
            memmove(j->ev, j->ev + j->head, (j->n_ev - j->head) * sizeof *j->ev);
            j->n_ev -= j->head;
            j->head = 0;
        }
        if (j->n_ev == j->cap_ev) {
            size_t cap = j->cap_ev ? 2 * j->cap_ev : 16;
            nf_serve_event *p = realloc(j->ev, cap * sizeof *p);
            if (!p) {
                pthread_mutex_unlock(&j->mu);
                free(text);
                return NF_ERR_NOMEM;
            }
            j->ev = p;
            j->cap_ev = cap;
        }
    }
    nf_serve_event *e = &j->ev[j->n_ev++];
    *e = *ev;
    e->text = text;
    e->t = (double)(nf_time_ns() - j->t0_ns) * 1e-9;
    if (ev->kind == NF_EV_TOKEN && j->ttft < 0) j->ttft = e->t;
    if (ev->kind == NF_EV_END) j->ended = 1;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    return NF_OK;
}

int nf_serve_job_cancelled(nf_serve_job *j)
{
    pthread_mutex_lock(&j->mu);
    int c = j->cancelled;
    pthread_mutex_unlock(&j->mu);
    return c;
}

int nf_serve_job_next(nf_serve_job *j, nf_serve_event *ev, int timeout_ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += timeout_ms / 1000;
    ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&j->mu);
    int rc = 0;
    while (j->head == j->n_ev && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&j->cv, &j->mu, &ts);
    int got = j->head < j->n_ev;
    if (got) *ev = j->ev[j->head++];
    pthread_mutex_unlock(&j->mu);
    return got;
}

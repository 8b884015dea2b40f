/* Prometheus metrics (metrics.h). Bucket bounds cover a GPU's few milliseconds per token up to a
 * CPU's seconds of prefill. */
#define _POSIX_C_SOURCE 200809L
#include "serve/metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const double bounds[NF_METRIC_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                 0.25,  0.5,    1,     2.5,  5,     10,  30};
static const int statuses[NF_METRIC_STATUSES] = {200, 400, 401, 404, 405, 408, 413, 415, 500, 503, 0, -1};

void nf_metrics_init(nf_metrics *m)
{
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
}

void nf_metrics_destroy(nf_metrics *m)
{
    pthread_mutex_destroy(&m->mu);
}

void nf_metrics_request(nf_metrics *m, int status)
{
    int i = 0;
    while (statuses[i] > 0 && statuses[i] != status) i++; /* unlisted codes share the "other" slot */
    pthread_mutex_lock(&m->mu);
    m->by_status[i]++;
    pthread_mutex_unlock(&m->mu);
}

void nf_metrics_tokens(nf_metrics *m, size_t prompt, size_t gen)
{
    pthread_mutex_lock(&m->mu);
    m->prompt_tokens += prompt;
    m->gen_tokens += gen;
    pthread_mutex_unlock(&m->mu);
}

void nf_metrics_cancelled(nf_metrics *m, size_t prompt, size_t gen)
{
    pthread_mutex_lock(&m->mu);
    m->cancelled++;
    m->prompt_tokens += prompt;
    m->gen_tokens += gen;
    pthread_mutex_unlock(&m->mu);
}

static void observe(nf_metrics *m, nf_histogram *h, double s)
{
    int b = 0;
    while (b < NF_METRIC_BUCKETS && s > bounds[b]) b++;
    pthread_mutex_lock(&m->mu);
    h->count[b]++;
    h->sum += s;
    h->n++;
    pthread_mutex_unlock(&m->mu);
}

void nf_metrics_ttft(nf_metrics *m, double s) { observe(m, &m->ttft, s); }
void nf_metrics_itl(nf_metrics *m, double s) { observe(m, &m->itl, s); }

typedef struct strbuf {
    char *s;
    size_t n, cap;
    int oom;
} strbuf;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void put(strbuf *b, const char *fmt, ...)
{
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = 1;
            return;
        }
        if (b->s && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = (b->cap + (size_t)k + 1) * 2;
        char *p = realloc(b->s, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->s = p;
        b->cap = cap;
    }
}

static void histogram(strbuf *b, const char *name, const char *help, const nf_histogram *h)
{
    put(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    unsigned long long cum = 0;
    for (int i = 0; i < NF_METRIC_BUCKETS; i++) {
        cum += h->count[i];
        put(b, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i], cum);
    }
    put(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", name, h->n, name, h->sum, name, h->n);
}

static void gauge(strbuf *b, const char *name, const char *help, size_t v)
{
    put(b, "# HELP %s %s\n# TYPE %s gauge\n%s %zu\n", name, help, name, name, v);
}

static void counter(strbuf *b, const char *name, const char *help, unsigned long long v)
{
    put(b, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name, name, v);
}

char *nf_metrics_render(nf_metrics *m, const nf_serve_backend_stats *st)
{
    strbuf b = {0};
    pthread_mutex_lock(&m->mu);
    put(&b, "# HELP ninfer_requests_total HTTP requests answered, by status code.\n# TYPE ninfer_requests_total counter\n");
    for (int i = 0; i < NF_METRIC_STATUSES; i++)
        if (statuses[i] > 0) put(&b, "ninfer_requests_total{status=\"%d\"} %llu\n", statuses[i], m->by_status[i]);
        else if (statuses[i] == 0) put(&b, "ninfer_requests_total{status=\"other\"} %llu\n", m->by_status[i]);
    put(&b, "# HELP ninfer_prompt_tokens_total Prompt tokens of finished requests.\n# TYPE ninfer_prompt_tokens_total counter\n"
            "ninfer_prompt_tokens_total %llu\n", m->prompt_tokens);
    put(&b, "# HELP ninfer_generation_tokens_total Generated tokens of finished requests.\n"
            "# TYPE ninfer_generation_tokens_total counter\nninfer_generation_tokens_total %llu\n", m->gen_tokens);
    put(&b, "# HELP ninfer_requests_cancelled_total Requests whose client went away before the end.\n"
            "# TYPE ninfer_requests_cancelled_total counter\nninfer_requests_cancelled_total %llu\n", m->cancelled);
    histogram(&b, "ninfer_time_to_first_token_seconds", "From request arrival to its first generated token.", &m->ttft);
    histogram(&b, "ninfer_inter_token_latency_seconds", "Between consecutive generated tokens of a request.", &m->itl);
    pthread_mutex_unlock(&m->mu);
    gauge(&b, "ninfer_requests_running", "Sequences admitted by the scheduler (holding KV pages).", st->running);
    gauge(&b, "ninfer_requests_waiting", "Requests not admitted yet: queued, or preempted to be recomputed.", st->waiting);
    gauge(&b, "ninfer_kv_pages_used", "KV cache pages held by sequences.", st->pages_used);
    gauge(&b, "ninfer_kv_pages_free", "KV cache pages an allocation can take (free, or holding an unused cached prefix).",
          st->pages_free);
    gauge(&b, "ninfer_kv_pages_cached", "Of the free pages, those holding a cached prefix (reclaimed least recently used).",
          st->pages_cached);
    gauge(&b, "ninfer_batch_sequences_max", "The most sequences one forward has carried since start.", st->batch_max);
    counter(&b, "ninfer_scheduler_steps_total", "Scheduler steps that ran a forward.", st->steps);
    counter(&b, "ninfer_preemptions_total", "Sequences sent back to waiting when KV pages ran out (recomputed later).",
            st->preemptions);
    counter(&b, "ninfer_spec_verifications_total", "Sequence steps that verified speculative drafts (serve --spec).",
            st->spec_verifications);
    counter(&b, "ninfer_spec_drafts_total", "Speculative drafts verified.", st->spec_drafts);
    counter(&b, "ninfer_spec_accepted_total", "Speculative drafts accepted.", st->spec_accepted);
    if (b.oom) free(b.s), b.s = NULL;
    return b.s;
}

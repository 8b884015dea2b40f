/* Counters and histograms for GET /metrics (Prometheus text format 0.0.4). Thread-safe. */
#ifndef NF_SERVE_METRICS_H
#define NF_SERVE_METRICS_H

#include <pthread.h>
#include <stddef.h>

#include "serve/backend.h"

enum { NF_METRIC_BUCKETS = 14, NF_METRIC_STATUSES = 12 };

typedef struct nf_histogram {
    unsigned long long count[NF_METRIC_BUCKETS + 1]; /* per bucket, the last is +Inf */
    double sum;
    unsigned long long n;
} nf_histogram;

typedef struct nf_metrics {
    pthread_mutex_t mu;
    unsigned long long by_status[NF_METRIC_STATUSES]; /* see metrics.c's status list */
    unsigned long long prompt_tokens, gen_tokens, cancelled;
    nf_histogram ttft, itl;
} nf_metrics;

void nf_metrics_init(nf_metrics *m);
void nf_metrics_destroy(nf_metrics *m);
void nf_metrics_request(nf_metrics *m, int status);
void nf_metrics_tokens(nf_metrics *m, size_t prompt, size_t gen);
/* A request whose client went away before its end (its tokens so far are counted too). */
void nf_metrics_cancelled(nf_metrics *m, size_t prompt, size_t gen);
void nf_metrics_ttft(nf_metrics *m, double s);
void nf_metrics_itl(nf_metrics *m, double s);
/* The exposition text (malloc'd), with the backend's gauges. */
char *nf_metrics_render(nf_metrics *m, const nf_serve_backend_stats *st);

#endif

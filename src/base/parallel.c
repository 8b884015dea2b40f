#define _GNU_SOURCE
#include "base/parallel.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

struct nf_pool {
    int n;                 /* threads including the caller */
    pthread_t *threads;    /* [n - 1] workers */
    pthread_mutex_t mu;
    pthread_cond_t wake;   /* workers wait here for a new generation */
    pthread_cond_t done;   /* the caller waits here for busy == 0 */
    unsigned long generation;
    int busy;              /* workers still inside the current job */
    int stop;
    /* the current job */
    nf_range_fn fn;
    void *ctx;
    size_t n_items, grain;
    atomic_size_t next;    /* first unclaimed item */
};

int nf_cpu_count(void)
{
#ifdef CPU_COUNT
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int c = CPU_COUNT(&set);
        if (c > 0) return c;
    }
#endif
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    return c > 0 ? (int)c : 1;
}

static void run_chunks(nf_pool *p, int worker)
{
    for (;;) {
        size_t begin = atomic_fetch_add(&p->next, p->grain);
        if (begin >= p->n_items) return;
        size_t end = begin + p->grain < p->n_items ? begin + p->grain : p->n_items;
        p->fn(p->ctx, begin, end, worker);
    }
}

struct worker_arg { nf_pool *p; int id; };

static void *worker_main(void *arg)
{
    struct worker_arg *wa = arg;
    nf_pool *p = wa->p;
    int id = wa->id;
    free(wa);
    unsigned long seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->generation == seen) pthread_cond_wait(&p->wake, &p->mu);
        if (p->stop) break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        run_chunks(p, id);
        pthread_mutex_lock(&p->mu);
        if (--p->busy == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

nf_status nf_pool_create(int n_threads, nf_pool **out, nf_error *err)
{
    *out = NULL;
    if (n_threads <= 0) n_threads = nf_cpu_count();
    nf_pool *p = calloc(1, sizeof *p);
    if (!p) return nf_error_set(err, NF_ERR_NOMEM, "thread pool: out of memory");
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof *p->threads);
        if (!p->threads) {
            nf_pool_destroy(p);
            return nf_error_set(err, NF_ERR_NOMEM, "thread pool: out of memory");
        }
    }
    for (int i = 1; i < n_threads; i++) {
        struct worker_arg *wa = malloc(sizeof *wa);
        if (wa) *wa = (struct worker_arg){p, i};
        if (!wa || pthread_create(&p->threads[i - 1], NULL, worker_main, wa) != 0) {
            free(wa);
            p->n = i; /* destroy joins only the threads that started */
            nf_pool_destroy(p);
            return nf_error_set(err, NF_ERR_INTERNAL, "thread pool: cannot start thread %d of %d", i, n_threads);
        }
    }
    *out = p;
    return NF_OK;
}

void nf_pool_destroy(nf_pool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n && p->threads; i++) pthread_join(p->threads[i - 1], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    free(p->threads);
    free(p);
}

int nf_pool_size(const nf_pool *p) { return p ? p->n : 1; }

void nf_parallel_for(nf_pool *p, size_t n, size_t grain, nf_range_fn fn, void *ctx)
{
    if (n == 0) return;
    if (grain == 0) grain = 1;
    if (!p || p->n == 1 || n <= grain) {
        fn(ctx, 0, n, 0);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n_items = n;
    p->grain = grain;
    atomic_store(&p->next, 0);
    p->busy = p->n - 1;
    p->generation++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);

    run_chunks(p, 0);

    pthread_mutex_lock(&p->mu);
    while (p->busy > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

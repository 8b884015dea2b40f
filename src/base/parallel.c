#define _GNU_SOURCE
#include "base/parallel.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define NF_CPU_RELAX() _mm_pause()
#else
#define NF_CPU_RELAX() ((void)0)
#endif

/* Hand-off: a job is published by bumping `generation`; a worker that finished the previous job
 * polls it for up to spin_ns before it sleeps on `wake`, and the caller polls `busy` as long before
 * it sleeps on `done`. Decoding a small model makes about 150 jobs of 10 - 50 us a token, and a
 * sleeping worker is woken by a futex call whose latency (tens of us on a VM) is of the job's
 * order (docs/perf/cpu_2026-12-06c.md); the poll is bounded so that an idle pool, or one whose
 * threads outnumber the CPUs, does not hold a core. The mutex only guards sleeping: `sleepers`
 * and `caller_sleeps` tell the other side whether a futex call is needed at all.
 *
 * Polling loses badly when another process wants one of our CPUs: a polling thread is only
 * preempted at a scheduler tick, while a sleeping one woken by a futex call preempts at once, so a
 * hand-off to a thread queued behind the other process waited milliseconds (SmolLM2 decode fell
 * from 87 to 16 tokens/s beside one busy process). Each thread therefore counts its involuntary
 * context switches (getrusage RUSAGE_THREAD) every CHECK_JOBS jobs: beside a busy process they came
 * at 1 400 - 13 000 a second (the whole process), alone at about 50, so more than IVCSW_PER_S a
 * second marks the CPUs contended, and every thread then sleeps at once for the next QUIET_NS. */
enum { CHECK_JOBS = 32, IVCSW_PER_S = 1000 };
#define QUIET_NS 50000000L

/* A thread's contention check: its jobs, and its involuntary switches and clock at the last check. */
typedef struct pace {
    unsigned jobs;
    long ivcsw, t_ns;
} pace;
struct nf_pool {
    int n;                 /* threads including the caller */
    pthread_t *threads;    /* [n - 1] workers */
    pthread_mutex_t mu;
    pthread_cond_t wake;   /* workers sleep here until generation moves */
    pthread_cond_t done;   /* the caller sleeps here until busy == 0 */
    atomic_ulong generation;
    atomic_int busy;       /* workers still inside the current job */
    atomic_int sleepers;   /* workers on `wake` (or about to be) */
    atomic_int caller_sleeps;
    atomic_int stop;
    long spin_ns;          /* 0: never poll */
    atomic_long no_poll_until; /* monotonic ns: contention seen, nobody polls before this */
    pace caller_pace;
    /* the current job, written before generation moves */
    nf_range_fn fn;
    void *ctx;
    size_t n_items, grain;
    int guided;            /* claims shrink with what is left (nf_parallel_for_guided) */
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

static long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* Involuntary context switches of the calling thread so far (-1 where unknown). */
static long ivcsw_now(void)
{
#ifdef RUSAGE_THREAD
    struct rusage ru;
    if (getrusage(RUSAGE_THREAD, &ru) == 0) return ru.ru_nivcsw;
#endif
    return -1;
}

/* Every CHECK_JOBS calls per thread: involuntary switches at more than IVCSW_PER_S since its last
 * check stop polling for QUIET_NS. */
static void check_contention(nf_pool *p, pace *c)
{
    if (!p->spin_ns || ++c->jobs % CHECK_JOBS) return;
    const long v = ivcsw_now(), t = now_ns(), d = v - c->ivcsw;
    if (c->ivcsw >= 0 && d >= 2 && d * 1000000000L > IVCSW_PER_S * (t - c->t_ns))
        atomic_store(&p->no_poll_until, t + QUIET_NS);
    c->ivcsw = v, c->t_ns = t;
}

/* The poll this thread may make now: spin_ns, or 0 while contention was seen lately. */
static long poll_ns(nf_pool *p)
{
    if (!p->spin_ns) return 0;
    const long until = atomic_load_explicit(&p->no_poll_until, memory_order_relaxed);
    return until && now_ns() < until ? 0 : p->spin_ns;
}

/* What a thread polls for: the generation moved past `seen` (a worker), or busy fell to 0 (the caller). */
static int job_moved(nf_pool *p, unsigned long seen)
{
    return atomic_load_explicit(&p->generation, memory_order_acquire) != seen;
}

static int job_done(nf_pool *p, unsigned long unused)
{
    (void)unused;
    return atomic_load_explicit(&p->busy, memory_order_acquire) == 0;
}

/* Polls ready(p, arg) until it holds (returns 1) or spin_ns has passed (returns whether it holds
 * then); the clock read every 64 polls. */
static int spin_for(int (*ready)(nf_pool *, unsigned long), nf_pool *p, unsigned long arg, long spin_ns)
{
    if (spin_ns <= 0) return ready(p, arg);
    const long t_end = now_ns() + spin_ns;
    for (;;) {
        for (int i = 0; i < 64; i++) {
            if (ready(p, arg)) return 1;
            NF_CPU_RELAX();
        }
        if (now_ns() >= t_end) return ready(p, arg);
    }
}

/* Guided claims: a 2n-th of the items left (n threads), at least grain, so the last claims are
 * short and the threads finish together. */
static void run_guided(nf_pool *p, int worker)
{
    size_t begin = atomic_load(&p->next);
    while (begin < p->n_items) {
        size_t g = (p->n_items - begin) / (2 * (size_t)p->n);
        if (g < p->grain) g = p->grain;
        const size_t end = begin + g < p->n_items ? begin + g : p->n_items;
        if (!atomic_compare_exchange_weak(&p->next, &begin, end)) continue; /* begin reloaded */
        p->fn(p->ctx, begin, end, worker);
        begin = atomic_load(&p->next);
    }
}

static void run_chunks(nf_pool *p, int worker)
{
    if (p->guided) {
        run_guided(p, worker);
        return;
    }
    for (;;) {
        size_t begin = atomic_fetch_add(&p->next, p->grain);
        if (begin >= p->n_items) return;
        size_t end = begin + p->grain < p->n_items ? begin + p->grain : p->n_items;
        p->fn(p->ctx, begin, end, worker);
    }
}

/* The next generation after `seen` (or stop): polled, then slept for. sleepers is raised before
 * generation is read again under the mutex, and the caller reads sleepers after moving generation
 * (both sequentially consistent), so one of the two sees the other: no lost wake-up. */
static unsigned long wait_job(nf_pool *p, unsigned long seen)
{
    if (spin_for(job_moved, p, seen, poll_ns(p))) return atomic_load(&p->generation);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->sleepers, 1);
    while (!atomic_load(&p->stop) && atomic_load(&p->generation) == seen) pthread_cond_wait(&p->wake, &p->mu);
    atomic_fetch_sub(&p->sleepers, 1);
    pthread_mutex_unlock(&p->mu);
    return atomic_load(&p->generation);
}

struct worker_arg { nf_pool *p; int id; };

static void *worker_main(void *arg)
{
    struct worker_arg *wa = arg;
    nf_pool *p = wa->p;
    int id = wa->id;
    free(wa);
    unsigned long seen = 0;
    pace pc = {0, -1, 0};
    for (;;) {
        seen = wait_job(p, seen);
        if (atomic_load(&p->stop)) break;
        run_chunks(p, id);
        check_contention(p, &pc);
        /* the last worker out wakes the caller if it sleeps (caller_sleeps read after busy moved) */
        if (atomic_fetch_sub(&p->busy, 1) == 1 && atomic_load(&p->caller_sleeps)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

/* NF_POOL_SPIN_US (default 200): how long a thread polls for the next job or the job's end before
 * it sleeps; 0 restores the sleeping pool. Never polls when the threads outnumber the CPUs. */
static long pool_spin_ns(int n_threads)
{
    if (n_threads > nf_cpu_count()) return 0;
    const char *e = getenv("NF_POOL_SPIN_US");
    long us = e && *e ? strtol(e, NULL, 10) : 200;
    return us > 0 ? us * 1000 : 0;
}

nf_status nf_pool_create(int n_threads, nf_pool **out, nf_error *err)
{
    *out = NULL;
    if (n_threads <= 0) n_threads = nf_cpu_count();
    nf_pool *p = calloc(1, sizeof *p);
    if (!p) return nf_error_set(err, NF_ERR_NOMEM, "thread pool: out of memory");
    p->n = n_threads;
    p->spin_ns = pool_spin_ns(n_threads);
    p->caller_pace.ivcsw = -1;
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
    atomic_store(&p->stop, 1);
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

/* Polls for the workers' end, then sleeps: caller_sleeps is raised before busy is read again, the
 * last worker reads it after lowering busy (see worker_main). */
static void wait_done(nf_pool *p)
{
    if (spin_for(job_done, p, 0, poll_ns(p))) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->caller_sleeps, 1);
    while (atomic_load(&p->busy) > 0) pthread_cond_wait(&p->done, &p->mu);
    atomic_store(&p->caller_sleeps, 0);
    pthread_mutex_unlock(&p->mu);
}

static void parallel_run(nf_pool *p, size_t n, size_t grain, int guided, nf_range_fn fn, void *ctx)
{
    if (n == 0) return;
    if (grain == 0) grain = 1;
    if (!p || p->n == 1 || n <= grain) {
        fn(ctx, 0, n, 0);
        return;
    }
    /* every worker has left the previous job (busy was 0): the fields are free to write */
    p->fn = fn;
    p->ctx = ctx;
    p->n_items = n;
    p->grain = grain;
    p->guided = guided;
    atomic_store(&p->next, 0);
    atomic_store(&p->busy, p->n - 1);
    atomic_fetch_add(&p->generation, 1);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mu);
    }

    run_chunks(p, 0);
    check_contention(p, &p->caller_pace);
    wait_done(p);
}

void nf_parallel_for(nf_pool *p, size_t n, size_t grain, nf_range_fn fn, void *ctx)
{
    parallel_run(p, n, grain, 0, fn, ctx);
}

void nf_parallel_for_guided(nf_pool *p, size_t n, size_t min_grain, nf_range_fn fn, void *ctx)
{
    parallel_run(p, n, min_grain, 1, fn, ctx);
}

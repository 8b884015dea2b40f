#define _DEFAULT_SOURCE /* setenv, usleep */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "base/parallel.h"
#include "nf_test.h"

typedef struct {
    atomic_int *hits;     /* [n] times each item ran */
    atomic_int max_worker;
    int pool_size;
    atomic_int bad_worker;
} job;

static void mark(void *ctx, size_t begin, size_t end, int worker)
{
    job *j = ctx;
    if (worker < 0 || worker >= j->pool_size) atomic_fetch_add(&j->bad_worker, 1);
    for (size_t i = begin; i < end; i++) atomic_fetch_add(&j->hits[i], 1);
}

static int run_case_as(nf_pool *p, size_t n, size_t grain, int guided)
{
    job j = {.pool_size = nf_pool_size(p)};
    j.hits = calloc(n ? n : 1, sizeof *j.hits);
    if (guided) nf_parallel_for_guided(p, n, grain, mark, &j);
    else nf_parallel_for(p, n, grain, mark, &j);
    int wrong = 0;
    for (size_t i = 0; i < n; i++) wrong += atomic_load(&j.hits[i]) != 1;
    wrong += atomic_load(&j.bad_worker);
    free(j.hits);
    return wrong;
}

static int run_case(nf_pool *p, size_t n, size_t grain) { return run_case_as(p, n, grain, 0); }

/* Keeps a CPU busy until *stop. */
static void *burner(void *arg)
{
    atomic_int *stop = arg;
    volatile unsigned long x = 0;
    while (!atomic_load(stop)) x++;
    return NULL;
}

int main(void)
{
    CHECK(nf_cpu_count() >= 1);
    nf_error e;
    nf_pool *p;
    CHECK_EQ_INT(nf_pool_create(4, &p, &e), NF_OK);
    CHECK_EQ_INT(nf_pool_size(p), 4);
    /* Every item runs exactly once, for sizes around the grain and the thread count. */
    size_t sizes[] = {0, 1, 3, 4, 5, 63, 64, 65, 1000, 100003};
    size_t grains[] = {0, 1, 7, 64};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
        for (size_t g = 0; g < sizeof grains / sizeof *grains; g++)
            CHECK_MSG(run_case(p, sizes[s], grains[g]) == 0, "n=%zu grain=%zu", sizes[s], grains[g]);
    /* Guided claims (shrinking with what is left, at least the grain) cover every item once too. */
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
        for (size_t g = 0; g < sizeof grains / sizeof *grains; g++)
            CHECK_MSG(run_case_as(p, sizes[s], grains[g], 1) == 0, "guided n=%zu grain=%zu", sizes[s], grains[g]);
    /* Many back-to-back jobs on one pool (generation handling, no lost wake-ups). */
    int wrong = 0;
    for (int r = 0; r < 2000; r++) wrong += run_case(p, 37, 1);
    CHECK_EQ_INT(wrong, 0);
    nf_pool_destroy(p);

    /* A pool of one and no pool run inline. */
    CHECK_EQ_INT(nf_pool_create(1, &p, &e), NF_OK);
    CHECK_EQ_INT(run_case(p, 1000, 3), 0);
    nf_pool_destroy(p);
    CHECK_EQ_INT(run_case(NULL, 1000, 3), 0);
    CHECK_EQ_INT(nf_pool_size(NULL), 1);

    /* A pool no larger than the CPUs polls between jobs (NF_POOL_SPIN_US): back-to-back jobs meet a
     * polling worker, jobs after a pause longer than the poll a sleeping one; a 1 us poll makes
     * both the worker's and the caller's sleeps race with the other side's hand-off. */
    const char *spins[] = {"1", "200", "0"};
    for (size_t k = 0; k < sizeof spins / sizeof *spins; k++) {
        setenv("NF_POOL_SPIN_US", spins[k], 1);
        CHECK_EQ_INT(nf_pool_create(2, &p, &e), NF_OK);
        wrong = 0;
        for (int r = 0; r < 3000; r++) {
            wrong += run_case_as(p, (size_t)(r % 50), 1, r % 3 == 0);
            if (r % 500 == 0) usleep(3000); /* longer than any poll: the workers sleep */
        }
        CHECK_MSG(wrong == 0, "spin %s: %d wrong", spins[k], wrong);
        nf_pool_destroy(p);
    }
    unsetenv("NF_POOL_SPIN_US");

    /* Beside a busy thread on every CPU the pool sees involuntary switches and stops polling for a
     * while (then polls again): every job must still run every item once through those changes. */
    atomic_int stop_burn = 0;
    const int n_burn = nf_cpu_count();
    pthread_t burn[64];
    for (int b = 0; b < n_burn && b < 64; b++) pthread_create(&burn[b], NULL, burner, &stop_burn);
    CHECK_EQ_INT(nf_pool_create(2, &p, &e), NF_OK);
    wrong = 0;
    for (int r = 0; r < 3000; r++) wrong += run_case(p, (size_t)(r % 50), 1);
    CHECK_MSG(wrong == 0, "beside busy threads: %d wrong", wrong);
    nf_pool_destroy(p);
    atomic_store(&stop_burn, 1);
    for (int b = 0; b < n_burn && b < 64; b++) pthread_join(burn[b], NULL);

    /* Default size is the machine's CPU count. */
    CHECK_EQ_INT(nf_pool_create(0, &p, &e), NF_OK);
    CHECK_EQ_INT(nf_pool_size(p), nf_cpu_count());
    nf_pool_destroy(p);
    return nf_test_report();
}

/* The scheduler end to end on the CPU engine over the tiny qwen3_moe fixture (converted q4q6 and
 * bf16): N sequences with ragged prompts, a shared prefix, greedy and seeded sampling, run together
 * through the scheduler (chunked prefill, mixed batches, the prefix cache, and a pool small enough to
 * preempt) produce, each, the tokens of the same sequence run alone through the engine's
 * single-sequence session with its own sampler. The CPU forward is row-independent per sequence
 * (batch.h), so the tokens must be equal, not close.
 *
 * The same for the Gated DeltaNet hybrids (qwen3_next bf16 and q4q6, qwen3_5_moe_text bf16): every
 * active sequence carries its recurrent state in its own slot, started afresh at admission and again
 * after a preemption (recompute from position 0); with the prefix cache a hit restores the state from
 * the snapshot its deepest matched page holds (the shared prefix's, taken where a piece was cut for it),
 * and the tokens are still those of each sequence alone. */
#define _POSIX_C_SOURCE 200809L
#include "nf_test.h"

#include <stdlib.h>
#include <unistd.h>

#include "common/engine_fixture.h"
#include "engine/sched.h"

enum { N = 7, MAXP = 60, GEN = 12, CTX = 96 };

typedef struct seq_case {
    int32_t prompt[MAXP];
    size_t n;
    nf_sampler_params sp;
    int32_t alone[GEN];
    size_t n_alone;
} seq_case;

static void make_cases(seq_case *c, uint32_t vocab)
{
    uint64_t r = 7;
    for (int i = 0; i < N; i++) {
        c[i].n = 5 + (size_t)(i * 9) % 50;
        if (i == 5) c[i].n = 32; /* exactly the two cached pages: its last page is copied before it is fed */
        if (i == 6) c[i].n = 50; /* admitted last: a hybrid restores the state after both shared pages */
        for (size_t j = 0; j < c[i].n; j++) {
            r = r * 6364136223846793005ULL + 1442695040888963407ULL;
            c[i].prompt[j] = (int32_t)((r >> 33) % vocab);
        }
        if (i >= 3) /* a shared "system prompt" of 34 tokens: two full pages of 16 and a bit */
            for (size_t j = 0; j < 34 && j < c[i].n; j++) c[i].prompt[j] = (int32_t)(j * 37 % vocab);
        c[i].sp = nf_sampler_defaults();
        c[i].sp.temp = i % 2 ? 0.8f : 0;
        c[i].sp.seed = 100 + (uint64_t)i;
    }
}

/* Each case alone: the engine's session, its own sampler. */
static void run_alone(const nf_model *m, seq_case *c)
{
    nf_engine_opts o = {.threads = 2, .ctx = CTX, .chunk = 16, .page_tokens = 16};
    nf_engine *e;
    nf_error err;
    if (nf_engine_create(m, &o, &e, &err)) {
        CHECK_MSG(0, "%s", err.msg);
        return;
    }
    for (int i = 0; i < N; i++) {
        fx_alone(e, c[i].prompt, c[i].n, &c[i].sp, GEN, c[i].alone);
        c[i].n_alone = GEN;
    }
    nf_engine_free(e);
}

/* All cases together through the scheduler; returns the preemptions. */
static long run_batched(const nf_model *m, seq_case *c, uint32_t kv_pages, int cache, int reserve, const char *what)
{
    nf_engine_opts o = {.threads = 2, .ctx = CTX, .chunk = 32, .page_tokens = 16, .max_seqs = 4, .kv_pages = kv_pages,
                        .state_snaps = 16};
    nf_engine *e;
    nf_sched *s = NULL;
    nf_error err;
    const nf_sched_opts so = {.no_prefix_cache = !cache, .reserve = reserve};
    if (nf_engine_create(m, &o, &e, &err) || nf_sched_create_engine(e, &so, &s, &err)) {
        CHECK_MSG(0, "%s: %s", what, err.msg);
        nf_engine_free(e);
        return 0;
    }
    uint64_t ids[N];
    for (int i = 0; i < N; i++) {
        nf_seq_params p = {.sampling = c[i].sp, .max_new = GEN};
        CHECK(nf_sched_add(s, c[i].prompt, c[i].n, &p, &ids[i], &err) == NF_OK);
    }
    long preempted = 0, mixed = 0;
    for (int step = 0; step < 10000 && !nf_sched_idle(s); step++) {
        nf_sched_step_info info;
        if (nf_sched_step(s, &info, &err)) {
            CHECK_MSG(0, "%s: %s", what, err.msg);
            break;
        }
        preempted += info.n_preempted;
        mixed += info.n_decode && info.n_decode < info.n_seqs; /* decode tokens beside prefill chunks */
    }
    for (int i = 0; i < N; i++) {
        size_t np, n;
        const int32_t *t = nf_sched_tokens(s, ids[i], &np, &n);
        CHECK_MSG(t && n - np == c[i].n_alone && memcmp(t + np, c[i].alone, c[i].n_alone * sizeof *t) == 0,
                  "%s: sequence %d (prompt %zu, temp %.1f) differs from its run alone", what, i, c[i].n,
                  (double)c[i].sp.temp);
    }
    CHECK(mixed > 0);
    const nf_kvpool_stats ks = nf_kvpool_get_stats(nf_sched_pool(s));
    printf("%s: %ld preemptions, %ld mixed steps, %llu pages from the prefix cache (%llu state snapshots restored, "
           "%llu taken), %llu copies\n", what, preempted, mixed, (unsigned long long)ks.hits_pages,
           (unsigned long long)ks.hits_snaps, (unsigned long long)ks.snaps_taken, (unsigned long long)ks.copies);
    if (cache) CHECK(ks.hits_pages >= 2);
    if (cache && m->cfg.n_linear) CHECK(ks.hits_snaps >= 1);
    if (!cache) CHECK(ks.hits_pages == 0 && ks.snaps_taken == 0);
    CHECK_EQ_INT(nf_kvpool_available(nf_sched_pool(s)), nf_kvpool_pages(nf_sched_pool(s)));
    nf_sched_free(s);
    nf_engine_free(e);
    return preempted;
}

int main(void)
{
    char tmp[] = "/tmp/nf_sched_cpu_XXXXXX";
    if (!mkdtemp(tmp)) return 1;
    char dir[1024], out[1200];
    const char *models[] = {"qwen3_moe", "qwen3_moe", "qwen3_next", "qwen3_next", "qwen3_5_moe_text"};
    const char *recipes[] = {"q4q6", "bf16", "q4q6", "bf16", "bf16"};
    for (int k = 0; k < 5; k++) {
        snprintf(dir, sizeof dir, "%s/fixtures/models/%s", NF_TEST_DATA, models[k]);
        snprintf(out, sizeof out, "%s/%s-%s.nf", tmp, models[k], recipes[k]);
        nf_model *m;
        nf_error err;
        if (!fx_convert(dir, recipes[k], out)) continue;
        if (nf_model_load(out, &m, &err)) {
            CHECK_MSG(0, "%s", err.msg);
            continue;
        }
        static seq_case c[N];
        make_cases(c, m->cfg.vocab);
        run_alone(m, c);
        char what[96];
        snprintf(what, sizeof what, "%s %s", models[k], recipes[k]);
        run_batched(m, c, 4 * 6, 0, 0, what);
        run_batched(m, c, 4 * 6, 1, 0, what);
        /* 8 pages of 16: four sequences of up to 54 + 12 tokens cannot all grow; reserving instead,
         * fewer run at once and none is preempted */
        CHECK(run_batched(m, c, 8, 1, 0, what) > 0);
        CHECK(run_batched(m, c, 8, 1, 1, what) == 0);
        nf_model_free(m);
        remove(out);
    }
    rmdir(tmp);
    return nf_test_report();
}

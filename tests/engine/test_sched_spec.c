/* Speculation in the scheduler (docs/sched.md "Speculation") on the CPU engine.
 *
 * Six sequences through one scheduler (4 at a time, chunked prefill beside verifications, one prompt
 * long enough to be prefilled in pieces while others verify): greedy ones with ngram:K or mtp:K
 * (K 1 .. 5; one with an oracle drafter whose drafts are right and wrong by design, so that
 * every acceptance count 0 .. K occurs), greedy and seeded ones without speculation, and a seeded one with it. Oracle: every
 * sequence that is greedy or does not speculate gives the tokens of the same sequence run alone
 * through the engine's single-sequence session without speculation (its own sampler, plain decodes);
 * the seeded speculating one gives the tokens of itself run alone through a scheduler with the same
 * speculation (batch independence: its drafts and its generator's draws depend on it alone). Some
 * drafts must be accepted and some rejected (the rollback runs), and the pool is back to full at the
 * end, also with a pool scarce enough to preempt, and when a sequence cancels itself from its callback
 * in the middle of taking a verification's accepted drafts.
 *
 * Fixtures: qwen3_moe (attention only; q4q6 with the default int8 activations, and bf16) with ngram;
 * the hybrids qwen3_next (bf16, and q8q8 with int8 activations) and qwen3_5_moe_text (bf16) with
 * ngram and mtp, so the Gated DeltaNet state is restored from its copy and the kept tokens fed again
 * after every rejection. Under sampling: ngram drafts on qwen3_moe_256 (sampled_distribution) and the
 * MTP block's own drafts on qwen3_next bf16 (sampled_mtp), chi-square against plain forwards. */
#define _POSIX_C_SOURCE 200809L
#include "nf_test.h"

#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/engine_fixture.h"
#include "common/spec_joint.h"
#include "engine/sched.h"

enum { N = 6, MAXP = 60, GEN = 40, CTX = 128, CANCEL_AT = 9 };

typedef struct scase {
    int32_t prompt[MAXP];
    size_t n;
    uint32_t vocab;
    unsigned calls; /* the oracle drafter's */
    nf_sampler_params sp;
    uint32_t spec_k;
    int32_t alone[GEN];
    size_t n_alone;
} scase;

static uint64_t lcg(uint64_t *r)
{
    *r = *r * 6364136223846793005ULL + 1442695040888963407ULL;
    return *r >> 33;
}

/* Repetitive prompts (a 5-token pattern: prompt lookup finds drafts at once) and random ones; case 2
 * is long (prefilled in pieces of the 32-token budget beside the others' verifications). */
static void make_cases(scase *c, uint32_t vocab, int mtp)
{
    uint64_t r = 11;
    static const uint32_t k_ngram[N] = {3, 4, 5, 0, 0, 3}, k_mtp[N] = {3, 1, 2, 0, 0, 3};
    for (int i = 0; i < N; i++) {
        c[i].n = i == 2 ? 57 : i % 2 ? 20 : 27;
        int32_t pat[5];
        for (int j = 0; j < 5; j++) pat[j] = (int32_t)(lcg(&r) % vocab);
        for (size_t j = 0; j < c[i].n; j++) c[i].prompt[j] = i % 2 ? (int32_t)(lcg(&r) % vocab) : pat[j % 5];
        c[i].sp = nf_sampler_defaults();
        c[i].sp.temp = i >= 4 ? 0.8f : 0;
        c[i].sp.seed = 200 + (uint64_t)i;
        c[i].spec_k = mtp ? k_mtp[i] : k_ngram[i];
        c[i].vocab = vocab;
    }
}

/* Case 1's drafts without MTP: its greedy tokens alone, the first a of them right and the rest wrong,
 * a = 0, 1, .. k in turn, so that every acceptance count occurs (prompt lookup on the hybrids' random
 * output finds nothing to draft). */
static uint32_t oracle_draft(void *ctx, const int32_t *toks, size_t n, uint32_t k, int32_t *draft)
{
    scase *c = ctx;
    (void)toks;
    const size_t g = n - c->n; /* tokens generated so far */
    const uint32_t a = c->calls++ % (k + 1);
    uint32_t d = 0;
    for (; d < k && g + d < c->n_alone; d++)
        draft[d] = d < a ? c->alone[g + d] : (int32_t)(((uint32_t)c->alone[g + d] + 1) % c->vocab);
    return d;
}

/* Each case alone in the engine's session, without speculation (the oracle). */
static void run_alone(const nf_model *m, scase *c)
{
    const nf_engine_opts o = {.mtp = 1, .threads = 2, .ctx = CTX, .chunk = 16, .page_tokens = 16};
    nf_engine *e;
    nf_error err;
    if (!nf_engine_create(m, &o, &e, &err))
        for (int i = 0; i < N; i++) fx_alone(e, c[i].prompt, c[i].n, &c[i].sp, c[i].n_alone = GEN, c[i].alone);
    else
        CHECK_MSG(0, "%s", err.msg);
    nf_engine_free(e);
}

typedef struct run_cfg {
    int mtp;
    uint32_t kv_pages;
    uint64_t cancel_id; /* the sequence that cancels itself at its CANCEL_AT-th token (0: none) */
    const char *what;
} run_cfg;

typedef struct run_out {
    int32_t toks[N][GEN];
    size_t n[N];
    nf_seq_end end[N];
    long drafted, accepted, verified, preempted, mixed;
} run_out;

typedef struct cancel_ctx {
    nf_sched *s;
    uint64_t id;
    int seen;
} cancel_ctx;

static void cancel_emit(void *ctx, const nf_seq_event *ev)
{
    cancel_ctx *cc = ctx;
    if (ev->id == cc->id && ev->token >= 0 && ++cc->seen == CANCEL_AT) CHECK(nf_sched_cancel(cc->s, cc->id, NULL) == NF_OK);
}

/* The cases whose mask bit is set, together through one scheduler. */
static void run_sched(const nf_model *m, scase *c, unsigned mask, const run_cfg *rc, run_out *out)
{
    memset(out, 0, sizeof *out);
    nf_engine_opts o = {.mtp = 1, .threads = 2, .ctx = CTX, .chunk = 32, .page_tokens = 16, .max_seqs = 4, .kv_pages = rc->kv_pages};
    nf_engine *e;
    nf_sched *s = NULL;
    nf_error err;
    if (nf_engine_create(m, &o, &e, &err) || nf_sched_create_engine(e, NULL, &s, &err)) {
        CHECK_MSG(0, "%s: %s", rc->what, err.msg);
        nf_engine_free(e);
        return;
    }
    uint64_t ids[N] = {0};
    cancel_ctx cc = {s, 0, 0};
    for (int i = 0; i < N; i++) {
        if (!(mask >> i & 1)) continue;
        nf_seq_params p = {.sampling = c[i].sp, .max_new = GEN, .spec_k = c[i].spec_k, .spec_mtp = rc->mtp,
                           .emit = cancel_emit, .ctx = &cc};
        if (i == 1 && !rc->mtp) p.draft = oracle_draft, p.draft_ctx = &c[i];
        CHECK_MSG(nf_sched_add(s, c[i].prompt, c[i].n, &p, &ids[i], &err) == NF_OK, "%s: %s", rc->what, err.msg);
        if (rc->cancel_id && ids[i] == rc->cancel_id) cc.id = ids[i];
    }
    const uint32_t pages = nf_kvpool_pages(nf_sched_pool(s));
    for (int step = 0; step < 10000 && !nf_sched_idle(s); step++) {
        nf_sched_step_info info;
        if (nf_sched_step(s, &info, &err)) {
            CHECK_MSG(0, "%s: %s", rc->what, err.msg);
            break;
        }
        out->drafted += info.n_drafted, out->accepted += info.n_accepted, out->verified += info.n_verified;
        out->preempted += info.n_preempted;
        out->mixed += info.n_verified && info.n_decode < info.n_seqs; /* verifications beside prefill chunks */
    }
    for (int i = 0; i < N; i++) {
        size_t np, n;
        const int32_t *t = ids[i] ? nf_sched_tokens(s, ids[i], &np, &n) : NULL;
        if (!t) continue;
        out->n[i] = n - np;
        memcpy(out->toks[i], t + np, out->n[i] * sizeof *t);
        out->end[i] = nf_sched_end(s, ids[i]);
    }
    CHECK_MSG(nf_kvpool_available(nf_sched_pool(s)) == pages, "%s: %u of %u pages back", rc->what,
              nf_kvpool_available(nf_sched_pool(s)), pages);
    nf_sched_free(s);
    nf_engine_free(e);
}

static void same_as_alone(const scase *c, int i, const run_out *o, const char *what)
{
    CHECK_MSG(o->n[i] == c[i].n_alone && !memcmp(o->toks[i], c[i].alone, c[i].n_alone * sizeof(int32_t)),
              "%s: sequence %d (K %u, temp %.1f) differs from its run alone without speculation", what, i, c[i].spec_k,
              (double)c[i].sp.temp);
}

static void fixture(const nf_model *m, int mtp, const char *name, int pools)
{
    static scase c[N];
    make_cases(c, m->cfg.vocab, mtp);
    run_alone(m, c);
    char what[128];
    static run_out all, one;
    const uint32_t ample = 4 * 8, scarce = 12;
    for (int scarce_pool = 0; scarce_pool < pools; scarce_pool++) {
        snprintf(what, sizeof what, "%s %s%s", name, mtp ? "mtp" : "ngram", scarce_pool ? " scarce pool" : "");
        run_cfg rc = {.mtp = mtp, .kv_pages = scarce_pool ? scarce : ample, .what = what};
        run_sched(m, c, (1u << N) - 1, &rc, &all);
        for (int i = 0; i < N; i++)
            if (c[i].sp.temp == 0 || !c[i].spec_k) same_as_alone(c, i, &all, what);
        printf("%s: %ld verifications, %ld of %ld drafts accepted, %ld preemptions, %ld mixed steps\n", what,
               all.verified, all.accepted, all.drafted, all.preempted, all.mixed);
        CHECK_MSG(all.drafted > all.accepted, "%s: no draft was rejected", what);
        if (!mtp) CHECK_MSG(all.accepted > 0, "%s: no draft was accepted", what); /* a random MTP block rarely is */
        if (scarce_pool) CHECK_MSG(all.preempted > 0, "%s: the scarce pool preempted nothing", what);
        else CHECK_MSG(all.mixed > 0, "%s: no verification beside a prefill chunk", what);
    }
    /* the seeded speculating sequence alone through a scheduler: the tokens it had among the others */
    snprintf(what, sizeof what, "%s %s alone", name, mtp ? "mtp" : "ngram");
    run_cfg rc = {.mtp = mtp, .kv_pages = 4 * 8, .what = what};
    run_sched(m, c, 1u << 5, &rc, &one);
    snprintf(what, sizeof what, "%s %s", name, mtp ? "mtp" : "ngram");
    run_sched(m, c, (1u << N) - 1, &rc, &all);
    CHECK_MSG(one.n[5] == all.n[5] && !memcmp(one.toks[5], all.toks[5], all.n[5] * sizeof(int32_t)),
              "%s: the seeded speculating sequence's tokens depend on the batch", what);
    /* case 1 (id 2: ids follow arrival) cancels itself at its CANCEL_AT-th token, inside a verification
     * when drafts were accepted there: its tokens are a prefix of its run alone, the pool is full */
    snprintf(what, sizeof what, "%s %s cancel", name, mtp ? "mtp" : "ngram");
    rc.cancel_id = 2, rc.what = what;
    run_sched(m, c, (1u << N) - 1, &rc, &all);
    CHECK_MSG(all.end[1] == NF_SEQ_CANCELLED && all.n[1] >= CANCEL_AT && all.n[1] < GEN &&
              !memcmp(all.toks[1], c[1].alone, all.n[1] * sizeof(int32_t)),
              "%s: ended %s after %zu tokens", what, nf_seq_end_name(all.end[1]), all.n[1]);
    same_as_alone(c, 0, &all, what);
}

/* Staggered arrivals through one scheduler: `trials` sequences of prompt[plen] with *sq (sequence i
 * seeded i + 1), four added a step while fewer than `wave` are in it, so verifications share forwards
 * with other sequences' prefills; each finished sequence's generated tokens go to seen(ctx, ...)
 * before it is removed. Returns the scheduler's draft counts and the sequences finished. */
typedef struct stagger_run {
    long drafted, accepted, mixed; /* drafts, accepted drafts, steps with verifications beside others */
    int done;
} stagger_run;
typedef void (*seen_fn)(void *ctx, const int32_t *gen, size_t n_gen);
static stagger_run run_staggered(nf_engine *e, const int32_t *prompt, size_t plen, nf_seq_params sq, int trials,
                                 int wave, seen_fn seen, void *ctx)
{
    stagger_run r = {0};
    nf_sched *s = NULL;
    nf_error err;
    uint64_t *out = malloc((size_t)wave * sizeof *out);
    int n_out = 0, added = 0;
    if (nf_sched_create_engine(e, NULL, &s, &err)) CHECK_MSG(0, "%s", err.msg);
    while (s && out && r.done < trials) {
        for (int now = 0; now < 4 && n_out < wave && added < trials; now++, added++) {
            sq.sampling.seed = (uint64_t)added + 1;
            CHECK(nf_sched_add(s, prompt, plen, &sq, &out[n_out++], &err) == NF_OK);
        }
        nf_sched_step_info info;
        if (nf_sched_step(s, &info, &err)) {
            CHECK_MSG(0, "%s", err.msg);
            break;
        }
        r.drafted += info.n_drafted, r.accepted += info.n_accepted;
        r.mixed += info.n_verified && info.n_verified < info.n_seqs;
        for (int i = 0; i < n_out; i++) {
            if (nf_sched_end(s, out[i]) == NF_SEQ_RUNNING) continue;
            size_t np, n;
            const int32_t *t = nf_sched_tokens(s, out[i], &np, &n);
            seen(ctx, t + np, n - np);
            nf_sched_remove(s, out[i]);
            out[i--] = out[--n_out];
            r.done++;
        }
    }
    free(out);
    nf_sched_free(s);
    return r;
}

enum { TRIALS = 10000, PMAX = 256 + 64, WAVE = 48 };

/* sampled_distribution's tally: each trial's three tokens as a cell of the top-SPEC_TK joint (the
 * extra cell: outside it). */
typedef struct joint_seen {
    int32_t (*ids)[SPEC_TK][SPEC_TK][3];
    long *cnt;
} joint_seen;
static void joint_cell(void *ctx, const int32_t *gen, size_t n_gen)
{
    joint_seen *js = ctx;
    CHECK_MSG(n_gen == 3, "a trial generated %zu tokens", n_gen);
    const int cell = n_gen == 3 ? spec_cell(js->ids, gen) : SPEC_TK * SPEC_TK * SPEC_TK;
    CHECK_MSG(cell < SPEC_TK * SPEC_TK * SPEC_TK, "tokens outside the top-%d cells", SPEC_TK);
    js->cnt[cell]++;
}

/* The scheduler's sampling with speculation (temperature 1.5, top-k 3, ngram:3, seeds 1 .. TRIALS) on
 * the vocabulary-256 fixture: TRIALS sequences of the loop prompt (common/spec_joint.h), up to WAVE at a
 * time and 4 more each step (the prefix cache holds the prompt's full pages), so verifications share
 * forwards with other sequences' first tokens; their first three
 * tokens (the second and third from a verification when the first continued the loop) against the
 * joint distribution of plain forwards, chi-square over the cells expected >= 5 times (the rest
 * pooled): at most 26 degrees of freedom < 75 (p < 1e-5 for a correct rule). */
static void sampled_distribution(const char *path)
{
    nf_model *m;
    nf_engine *e;
    nf_error err;
    if (nf_model_load(path, &m, &err)) return;
    nf_engine_opts o = {.mtp = 1, .threads = 2, .ctx = PMAX + 8, .chunk = 64, .page_tokens = 16, .max_seqs = 16};
    if (nf_engine_create(m, &o, &e, &err)) {
        nf_model_free(m);
        return;
    }
    const double temp = 1.5;
    int32_t prompt[PMAX], ids[SPEC_TK][SPEC_TK][SPEC_TK][3];
    static double p[SPEC_TK][SPEC_TK][SPEC_TK];
    const uint32_t plen = spec_loop_prompt(e, prompt, PMAX);
    spec_joint_reference(e, prompt, plen, temp, ids, p);
    static long cnt[SPEC_TK * SPEC_TK * SPEC_TK + 1];
    joint_seen js = {ids, cnt};
    const nf_seq_params sq = {.sampling = {.temp = (float)temp, .top_k = SPEC_TK, .top_p = 1, .repeat_penalty = 1},
                              .max_new = 3, .spec_k = 3};
    const stagger_run run = run_staggered(e, prompt, plen, sq, TRIALS, WAVE, joint_cell, &js);
    const long drafted = run.drafted, accepted = run.accepted, mixed = run.mixed;
    const int done = run.done;
    double ex[SPEC_TK * SPEC_TK * SPEC_TK];
    for (int c = 0; c < SPEC_TK * SPEC_TK * SPEC_TK; c++) ex[c] = TRIALS * p[c / 9][c / 3 % 3][c % 3];
    int df;
    const double chi2 = pooled_chi2(cnt, ex, SPEC_TK * SPEC_TK * SPEC_TK, &df);
    printf("scheduler sampling (prompt %u tokens): chi-square %.1f over %d degrees of freedom; %ld of %ld drafts "
           "accepted, %ld steps with verifications beside other sequences' tokens\n", plen, chi2, df, accepted, drafted, mixed);
    CHECK_MSG(done == TRIALS && chi2 < 75, "scheduler sampling with speculation: chi-square %.1f over %d degrees of "
              "freedom (%d trials)", chi2, df, done);
    CHECK_MSG(accepted > TRIALS / 10 && accepted < drafted - TRIALS / 10, "%ld of %ld drafts accepted: both branches "
              "must be exercised", accepted, drafted);
    CHECK(mixed > 0);
    nf_engine_free(e);
    nf_model_free(m);
}

/* softmax(l / temp) over all V logits, added to p[V] with weight w. */
static void add_softmax(const float *l, uint32_t V, double temp, double w, double *p)
{
    double z = 0, mx = l[0];
    for (uint32_t i = 1; i < V; i++) mx = l[i] > mx ? l[i] : mx;
    for (uint32_t i = 0; i < V; i++) z += exp((l[i] - mx) / temp);
    for (uint32_t i = 0; i < V; i++) p[i] += w * exp((l[i] - mx) / temp) / z;
}

enum { QTRIALS = 20000, QP = 4, QWAVE = 32 };

/* sampled_mtp's tally: each trial's second and third generated tokens (c[0], c[1]). */
static void second_third(void *ctx, const int32_t *gen, size_t n_gen)
{
    long **c = ctx;
    CHECK_MSG(n_gen == 4, "a trial generated %zu tokens", n_gen);
    if (n_gen == 4) c[0][gen[1]]++, c[1][gen[2]]++;
}

/* The scheduler's sampling with the MTP block's own drafts (mtp:2: drafts drawn from the block's
 * distribution q, verified with min(1, p/q) and the residual max(0, p - q), sched_spec.c mtp_pick and
 * sampler.c nf_sampler_verify_q) on qwen3_next bf16: top-k off (the random block's top few rarely meet
 * the main model's), temperature 1.5, QTRIALS seeded sequences of a QP-token prompt, up to QWAVE at a
 * time and 4 more each step (verifications beside other sequences' prefills), 4 tokens each (the first
 * sampled after the prefill, the second and third from the first verification of 2 drafts: accepted
 * drafts, the residual after a rejection, or the next verification's). The second and third tokens'
 * marginals over the whole vocabulary against the exact ones from plain forwards (p2 = sum over x1 of
 * p1(x1) times the distribution after x1; p3 likewise over (x1, x2): V * V forwards): chi-square over
 * the cells expected >= 5 times, each < 1.3 df + 35 (p about 1e-5 for a correct rule); acceptances and
 * rejections both occur (about 47 % of the drafts accepted). Drawing from p instead of the residual on
 * rejection gives chi-square 964 / 431 over 255; the point-mass rule (no q) stays exact, and accepts
 * about 0.3 % of the drafts. */
static void sampled_mtp(const nf_model *m)
{
    const uint32_t V = m->cfg.vocab;
    const double temp = 1.5;
    nf_engine_opts o = {.mtp = 1, .threads = 2, .ctx = 32, .chunk = 32, .page_tokens = 16, .max_seqs = 16};
    nf_engine *e;
    nf_error err;
    if (nf_engine_create(m, &o, &e, &err)) {
        CHECK_MSG(0, "%s", err.msg);
        return;
    }
    double *p1 = calloc(V, sizeof *p1), *p2 = calloc(V, sizeof *p2), *p2s = calloc((size_t)V * V, sizeof *p2s),
           *p3 = calloc(V, sizeof *p3), *ex = malloc(V * sizeof *ex);
    long *c2 = calloc(V, sizeof *c2), *c3 = calloc(V, sizeof *c3);
    int32_t prompt[QP + 2];
    uint64_t r = 77;
    for (int j = 0; j < QP; j++) prompt[j] = (int32_t)(lcg(&r) % V);
    /* the exact distributions from plain forwards of the single-sequence engine */
    nf_engine_reset(e);
    CHECK(nf_engine_prefill(e, prompt, QP, NULL, &err) == NF_OK);
    add_softmax(e->logits, V, temp, 1, p1);
    for (uint32_t x = 0; x < V; x++) {
        prompt[QP] = (int32_t)x;
        nf_engine_reset(e);
        CHECK(nf_engine_prefill(e, prompt, QP + 1, NULL, &err) == NF_OK);
        add_softmax(e->logits, V, temp, p1[x], p2);
        add_softmax(e->logits, V, temp, 1, p2s + (size_t)x * V); /* the distribution after (t1 = x) */
    }
    for (uint32_t x = 0; x < V; x++) {
        prompt[QP] = (int32_t)x;
        for (uint32_t y = 0; y < V; y++) {
            prompt[QP + 1] = (int32_t)y;
            nf_engine_reset(e);
            CHECK(nf_engine_prefill(e, prompt, QP + 2, NULL, &err) == NF_OK);
            add_softmax(e->logits, V, temp, p1[x] * p2s[(size_t)x * V + y], p3);
        }
    }
    nf_engine_reset(e);
    long *c[2] = {c2, c3};
    const nf_seq_params sq = {.sampling = {.temp = (float)temp, .top_p = 1, .repeat_penalty = 1}, .max_new = 4,
                              .spec_k = 2, .spec_mtp = 1};
    const stagger_run run = run_staggered(e, prompt, QP, sq, QTRIALS, QWAVE, second_third, c);
    const long drafted = run.drafted, accepted = run.accepted, mixed = run.mixed;
    const int done = run.done;
    int df2, df3;
    for (uint32_t x = 0; x < V; x++) ex[x] = QTRIALS * p2[x];
    const double chi2 = pooled_chi2(c2, ex, (int)V, &df2);
    for (uint32_t x = 0; x < V; x++) ex[x] = QTRIALS * p3[x];
    const double chi3 = pooled_chi2(c3, ex, (int)V, &df3);
    printf("scheduler sampling with MTP drafts against their q (full vocabulary): second token chi-square %.1f over "
           "%d degrees of freedom, third %.1f over %d; %ld of %ld drafts "
           "accepted, %ld steps with verifications beside other sequences' tokens\n", chi2, df2, chi3, df3,
           accepted, drafted, mixed);
    CHECK_MSG(done == QTRIALS && chi2 < 1.3 * df2 + 35 && chi3 < 1.3 * df3 + 35, "scheduler sampling with the MTP "
              "block's drafts: chi-square %.1f / %d, %.1f / %d (%d trials)", chi2, df2, chi3, df3, done);
    CHECK_MSG(accepted > drafted / 10 && accepted < drafted - drafted / 10, "%ld of %ld drafts accepted: both "
              "branches must be exercised", accepted, drafted);
    CHECK(mixed > 0);
    free(p1), free(p2), free(p2s), free(p3), free(ex), free(c2), free(c3);
    nf_engine_free(e);
}

int main(void)
{
    char tmp[] = "/tmp/nf_sched_spec_XXXXXX";
    if (!mkdtemp(tmp)) return 1;
    const char *models[] = {"qwen3_moe", "qwen3_moe", "qwen3_next", "qwen3_next", "qwen3_5_moe_text", "qwen3_moe_256"};
    const char *recipes[] = {"q4q6", "bf16", "bf16", "q8q8", "bf16", "bf16"};
    for (int k = 0; k < 6; k++) {
        char dir[1024], out[1200], name[96];
        snprintf(dir, sizeof dir, "%s/fixtures/models/%s", NF_TEST_DATA, models[k]);
        snprintf(out, sizeof out, "%s/%s-%s.nf", tmp, models[k], recipes[k]);
        snprintf(name, sizeof name, "%s %s", models[k], recipes[k]);
        nf_model *m;
        nf_error err;
        if (!fx_convert(dir, recipes[k], out)) continue;
        if (k == 5) {
            sampled_distribution(out);
            remove(out);
            continue;
        }
        if (nf_model_load(out, &m, &err)) {
            CHECK_MSG(0, "%s", err.msg);
            continue;
        }
        /* not the preempting pool for the int8 hybrid: a recompute re-prefills the generated tokens in
         * one long segment (the tile), which rounds otherwise than their decodes did, and an int8 step
         * tips a near tie there with or without speculation (docs/sched.md, "Speculation") */
        const int pools = strcmp(recipes[k], "q8q8") ? 2 : 1;
        fixture(m, 0, name, pools);
        if (m->mtp) fixture(m, 1, name, pools);
        if (k == 2) sampled_mtp(m);
        nf_model_free(m);
        remove(out);
    }
    rmdir(tmp);
    return nf_test_report();
}

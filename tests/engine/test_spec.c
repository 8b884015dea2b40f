/* Prompt-lookup speculation (engine/spec.h).
 *
 * - Drafting on hand-made sequences: the latest earlier occurrence of the last 3, then 2 tokens (not 1), and at most k of what followed (the expected drafts are read off the sequences by hand).
 * - Verification with temperature (nf_sampler_verify): over a vocabulary of 6, for drafts of high,
 *   low and zero probability, 200000 seeded verifications; the tokens they give against the softmax
 *   computed here from the definition (chi-square, 5 degrees of freedom < 30: p < 2e-5 for a
 *   correct rule, deterministic seeds), and the acceptance rate against p(draft) (binomial, 6 sd).
 *   A rule that accepts too often, or resamples without removing the draft, fails both.
 * - Verification against a proposal distribution (nf_sampler_verify_q): hand-built q over the same 6
 *   ids (q > p, q < p, q = 0 < p, and with top-k p = 0 < q), the draft drawn from q each trial, 200000
 *   trials: the tokens against p (chi-square, < 30) and the acceptance rate against sum min(p, q).
 * - Sampling through nf_generate on the vocabulary-256 fixture (sampled_generation below): the joint
 *   distribution of three tokens, two of them verified, against plain forwards.
 * - Generation over every non-hybrid tiny fixture (bf16; one q8q8): greedy nf_generate with
 *   spec_k 1, 3, 5 gives the same tokens, text, end reason and cache length as without, on a
 *   repetitive and a random prompt, up to the context end, with an end-of-generation id and a stop
 *   string that fall on accepted drafts, with a repetition penalty, and over two chat-like turns;
 *   some drafts must be accepted.
 * - Hybrids (qwen3_next, qwen3_5_moe_text, bf16): the generation cases (same tokens), and the rollback
 *   driven step by step with right and wrong drafts by design (hybrid_machinery). */
#define _POSIX_C_SOURCE 200809L
#include "nf_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/engine_fixture.h"
#include "common/letters_tokenizer.h"
#include "common/spec_joint.h"
#include "engine/generate.h"
#include "engine/spec.h"

static void drafting(void)
{
    int32_t d[8];
    const int32_t a[] = {1, 2, 3, 9, 8, 1, 2, 3, 7, 5, 1, 2, 3};
    CHECK(nf_spec_draft(a, 13, 3, d) == 3 && d[0] == 7 && d[1] == 5 && d[2] == 1); /* latest of 1 2 3: at 5 */
    CHECK(nf_spec_draft(a, 13, 8, d) == 5 && d[3] == 2 && d[4] == 3);                 /* up to the sequence end */
    const int32_t b[] = {4, 2, 3, 6, 0, 2, 3};                                         /* "0 2 3" never, "2 3" at 1 */
    CHECK(nf_spec_draft(b, 7, 2, d) == 2 && d[0] == 6 && d[1] == 0);
    const int32_t c[] = {5, 1, 6, 0, 2, 7, 6};                                         /* only "6": too short */
    CHECK(nf_spec_draft(c, 7, 4, d) == 0);
    const int32_t n[] = {1, 2, 3, 4};
    CHECK(nf_spec_draft(n, 4, 4, d) == 0);
    CHECK(nf_spec_draft(n, 1, 4, d) == 0 && nf_spec_draft(n, 0, 4, d) == 0);
    const int32_t r[] = {7, 7, 7};                                                     /* "7 7" at 0, one follows */
    CHECK(nf_spec_draft(r, 3, 4, d) == 1 && d[0] == 7);
    uint32_t k = 0;
    nf_spec_mode md;
    CHECK(nf_spec_parse("ngram:3", &md, &k, NULL) == NF_OK && k == 3 && md == NF_SPEC_MODE_NGRAM);
    CHECK(nf_spec_parse("ngram:0", &md, &k, NULL) != NF_OK && nf_spec_parse("ngram:9", &md, &k, NULL) != NF_OK);
    CHECK(nf_spec_parse("ngram:", &md, &k, NULL) != NF_OK && nf_spec_parse("mtp:4", &md, &k, NULL) != NF_OK);
    CHECK(nf_spec_parse("ngram:2x", &md, &k, NULL) != NF_OK && nf_spec_parse("mtp:0", &md, &k, NULL) != NF_OK);
    CHECK(nf_spec_parse("mtp:2", &md, &k, NULL) == NF_OK && k == 2 && md == NF_SPEC_MODE_MTP);
    CHECK(nf_spec_parse("lookup:2", &md, &k, NULL) != NF_OK);
}

enum { SV = 6, DRAWS = 200000 };

/* Pearson's chi-square of DRAWS counts against ref / z (tokens of zero probability must have none;
 * *df: the kept tokens less one). */
static double chi_square(const long *cnt, const double *ref, double z, int *df)
{
    double chi2 = 0;
    *df = -1;
    for (int i = 0; i < SV; i++) {
        const double e = DRAWS * ref[i] / z;
        if (e > 0) chi2 += (cnt[i] - e) * (cnt[i] - e) / e, ++*df;
        else CHECK_MSG(cnt[i] == 0, "token %d is outside the kept set but was given %ld times", i, cnt[i]);
    }
    return chi2;
}

/* The target of the verification tests: ref[i] / z = softmax(l / temp) over the top_k best (computed
 * here, temp 0.7), and a sampler of that temperature and top_k (NULL, with a failed check, if it cannot
 * be made). */
static nf_sampler *target(const float *l, int top_k, uint64_t seed, double *ref, double *z)
{
    const double temp = 0.7;
    *z = 0;
    for (int i = 0; i < SV; i++) {
        int better = 0;
        for (int j = 0; j < SV; j++) better += l[j] > l[i];
        ref[i] = top_k <= 0 || better < top_k ? exp(l[i] / temp) : 0;
        *z += ref[i];
    }
    nf_sampler_params p = {.temp = (float)temp, .top_k = top_k, .top_p = 1, .min_p = 0, .repeat_penalty = 1,
                           .repeat_last_n = 64, .seed = seed};
    nf_sampler *s;
    if (nf_sampler_create(&p, SV, &s, NULL)) {
        CHECK(0);
        return NULL;
    }
    return s;
}

/* The tokens verification gives for `draft` against the target (above). */
static void verify_distribution(const float *l, int top_k, int32_t draft, uint64_t seed)
{
    double ref[SV], z;
    nf_sampler *s = target(l, top_k, seed, ref, &z);
    if (!s) return;
    long cnt[SV] = {0}, acc = 0;
    for (int n = 0; n < DRAWS; n++) {
        int32_t id = -1;
        const int a = nf_sampler_verify(s, l, NULL, 0, draft, &id);
        CHECK_MSG(id >= 0 && id < SV && (a == (id == draft)), "verify gave %d (accepted %d) for draft %d", id, a, draft);
        if (id < 0 || id >= SV) break;
        cnt[id]++;
        acc += a;
    }
    int df;
    const double chi2 = chi_square(cnt, ref, z, &df);
    const double pd = ref[draft] / z, sd = sqrt(DRAWS * pd * (1 - pd));
    CHECK_MSG(chi2 < 30, "draft %d, top_k %d: chi-square %.1f over %d degrees of freedom", draft, top_k, chi2, df);
    CHECK_MSG(fabs((double)acc - DRAWS * pd) <= 6 * sd + 1e-9, "draft %d: %ld accepted, expected %.0f +- %.0f", draft,
              acc, DRAWS * pd, sd);
    printf("verify draft %d, top_k %d: chi-square %.1f (%d degrees of freedom), %ld accepted of %.0f expected\n", draft,
           top_k, chi2, df, acc, DRAWS * pd);
    nf_sampler_free(s);
}

/* nf_sampler_verify_q against a hand-built proposal q: each trial draws the draft from q (its own
 * generator here), verifies it against the target p (above); the
 * tokens given against p (chi-square) and the acceptance rate against sum min(p, q) (binomial, 6 sd). */
static void verify_q_distribution(const float *l, int top_k, const double *qd, uint64_t seed)
{
    double ref[SV], z, acc_p = 0;
    float q[SV];
    nf_sampler *s = target(l, top_k, seed, ref, &z);
    if (!s) return;
    for (int i = 0; i < SV; i++) q[i] = (float)qd[i], acc_p += fmin(ref[i] / z, qd[i]);
    uint64_t g = seed * 7919 + 1;
    long cnt[SV] = {0}, acc = 0;
    for (int n = 0; n < DRAWS; n++) {
        g = g * 6364136223846793005ULL + 1442695040888963407ULL; /* the draft from q: an LCG's top bits */
        double u = (double)(g >> 11) * 0x1.0p-53, cum = 0;
        int32_t draft = SV - 1, id = -1;
        for (int i = 0; i < SV; i++)
            if (u < (cum += qd[i])) {
                draft = i;
                break;
            }
        const int a = nf_sampler_verify_q(s, l, NULL, 0, draft, q, &id);
        CHECK_MSG(id >= 0 && id < SV && (!a || id == draft), "verify_q gave %d (accepted %d) for draft %d", id, a, draft);
        if (id < 0 || id >= SV) break;
        cnt[id]++;
        acc += a;
    }
    int df;
    const double chi2 = chi_square(cnt, ref, z, &df);
    const double sd = sqrt(DRAWS * acc_p * (1 - acc_p));
    CHECK_MSG(chi2 < 30, "verify_q, top_k %d: chi-square %.1f over %d degrees of freedom", top_k, chi2, df);
    CHECK_MSG(fabs((double)acc - DRAWS * acc_p) <= 6 * sd + 1e-9, "verify_q: %ld accepted, expected %.0f +- %.0f", acc,
              DRAWS * acc_p, sd);
    printf("verify_q top_k %d: chi-square %.1f (%d degrees of freedom), %ld accepted of %.0f expected\n", top_k, chi2,
           df, acc, DRAWS * acc_p);
    nf_sampler_free(s);
}

static void verification(void)
{
    const float l[SV] = {1.2f, 0.3f, 2.0f, -0.5f, 1.9f, 0.0f};
    verify_distribution(l, 0, 2, 11);  /* the likeliest */
    verify_distribution(l, 0, 3, 12);  /* the least likely */
    verify_distribution(l, 0, 5, 13);
    verify_distribution(l, 3, 0, 14);  /* kept, with top-k */
    verify_distribution(l, 3, 1, 15);  /* outside the kept set: p = 0, never accepted */
    verify_distribution(l, 1, 2, 16);  /* a lone candidate: p = 1, always accepted */
    /* against a proposal q (p here: 0.135 0.037 0.424 0.012 0.367 0.024 without top-k): q above p on some ids
     * and below on others, q = 0 < p (id 3), and with top-k 3 p = 0 < q (ids 1, 5) */
    const double q1[SV] = {0.40, 0.20, 0.10, 0.00, 0.20, 0.10};
    verify_q_distribution(l, 0, q1, 21);
    verify_q_distribution(l, 3, q1, 22);
    const double q2[SV] = {0.05, 0.05, 0.05, 0.05, 0.75, 0.05}; /* mass on one id, p's second */
    verify_q_distribution(l, 0, q2, 23);
    verify_q_distribution(l, 1, q2, 24); /* p a point mass on id 2 */
    /* greedy: accepted exactly when the draft is the argmax */
    nf_sampler_params g = {.temp = 0, .top_k = 0, .top_p = 1, .repeat_penalty = 1, .repeat_last_n = 64};
    nf_sampler *s;
    if (nf_sampler_create(&g, SV, &s, NULL)) return;
    int32_t id;
    CHECK(nf_sampler_verify(s, l, NULL, 0, 2, &id) == 1 && id == 2);
    CHECK(nf_sampler_verify(s, l, NULL, 0, 4, &id) == 0 && id == 2);
    nf_sampler_free(s);
}

enum { CTX = 192, MAXV = 2048 }; /* long enough for the llama fixture's greedy text to repeat a 2-gram */

typedef struct result {
    nf_tok_ids seq;
    char text[8192];
    size_t len;
    nf_gen_stats st;
    uint32_t n_past;
} result;

static void emit(void *ctx, const char *t, size_t len)
{
    result *r = ctx;
    if (r->len + len >= sizeof r->text) return;
    memcpy(r->text + r->len, t, len);
    r->len += len;
}

/* One generation case: prompts[i] run as turns on one session (chat-like), sampler settings, limits. */
typedef struct gen_case {
    const int32_t *prompt[2];
    size_t n[2];
    int turns;
    float repeat_penalty;
    nf_gen_params p;
} gen_case;

static void generate(nf_engine *e, const nf_tokenizer *tok, const gen_case *c, uint32_t k, result *r)
{
    memset(r, 0, sizeof *r);
    nf_engine_reset(e);
    nf_sampler_params sp = {.temp = 0, .top_p = 1, .repeat_penalty = c->repeat_penalty, .repeat_last_n = 64};
    nf_sampler *s;
    if (nf_sampler_create(&sp, e->model->cfg.vocab, &s, NULL)) return;
    nf_gen_params p = c->p;
    p.spec_k = k;
    nf_error err;
    for (int t = 0; t < c->turns; t++) {
        nf_gen_stats st;
        CHECK_MSG(nf_generate(e, tok, s, c->prompt[t], c->n[t], &p, emit, r, &r->seq, &st, &err) == NF_OK, "%s",
                  err.msg);
        r->st.gen_tokens += st.gen_tokens, r->st.accepted += st.accepted, r->st.drafted += st.drafted;
        r->st.end = st.end;
    }
    r->n_past = e->n_past;
    nf_sampler_free(s);
}

static int same(const result *a, const result *b)
{
    return a->seq.n == b->seq.n && !memcmp(a->seq.ids, b->seq.ids, a->seq.n * sizeof *a->seq.ids) &&
           a->len == b->len && !memcmp(a->text, b->text, a->len) && a->st.end == b->st.end &&
           a->st.gen_tokens == b->st.gen_tokens && a->n_past == b->n_past && b->n_past == b->seq.n;
}

/* Every k against no speculation on one case; returns the drafts accepted. */
static size_t compare_case(nf_engine *e, const nf_tokenizer *tok, const gen_case *c, const char *what, result *base)
{
    static result r;
    size_t accepted = 0;
    generate(e, tok, c, 0, base);
    CHECK(base->st.drafted == 0);
    const uint32_t ks[] = {1, 3, 5};
    for (int i = 0; i < 3; i++) {
        generate(e, tok, c, ks[i], &r);
        CHECK_MSG(same(base, &r), "%s, ngram:%u: %zu/%zu tokens (ends %d/%d, %zu/%zu generated) differ", what, ks[i],
                  r.seq.n, base->seq.n, r.st.end, base->st.end, r.st.gen_tokens, base->st.gen_tokens);
        accepted += r.st.accepted;
        nf_tok_ids_free(&r.seq);
    }
    return accepted;
}

/* The generation cases on one converted fixture. */
static void fixture_cases(const char *path, const char *name, int need_accepted)
{
    nf_model *m;
    nf_engine *e;
    nf_error err;
    if (nf_model_load(path, &m, &err)) {
        CHECK_MSG(0, "%s", err.msg);
        return;
    }
    nf_engine_opts o = {.threads = 2, .ctx = CTX, .page_tokens = 16};
    if (nf_engine_create(m, &o, &e, &err)) {
        CHECK_MSG(0, "%s", err.msg);
        nf_model_free(m);
        return;
    }
    const uint32_t V = m->cfg.vocab;
    nf_tokenizer *tok = names_tokenizer(V);
    int32_t rep[27], rnd[20];
    uint64_t x = 5;
    for (int i = 0; i < 20; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        rnd[i] = (int32_t)((x >> 33) % V);
    }
    for (int i = 0; i < 27; i++) rep[i] = rnd[i % 5];
    static result base;
    char what[192], stop[32];
    gen_case c = {.prompt = {rep, rnd}, .n = {27, 20}, .turns = 1, .repeat_penalty = 1, .p = {.max_new = 30}};
    size_t acc = 0;
    snprintf(what, sizeof what, "%s repetitive", name);
    acc += compare_case(e, tok, &c, what, &base);
    /* an end-of-generation id and a stop string from that output, where drafts are being accepted */
    const int32_t eos = base.seq.ids[27 + 12];
    snprintf(stop, sizeof stop, "t%dt%d", base.seq.ids[27 + 10], base.seq.ids[27 + 11]);
    const char *stops[] = {stop};
    nf_tok_ids_free(&base.seq);
    gen_case ce = c;
    ce.p.eos = &eos, ce.p.n_eos = 1;
    snprintf(what, sizeof what, "%s end-of-generation id %d", name, eos);
    acc += compare_case(e, tok, &ce, what, &base);
    CHECK(base.st.end == NF_GEN_EOS);
    nf_tok_ids_free(&base.seq);
    gen_case cs = c;
    cs.p.stops = stops, cs.p.n_stops = 1;
    snprintf(what, sizeof what, "%s stop '%s'", name, stop);
    acc += compare_case(e, tok, &cs, what, &base);
    CHECK(base.st.end == NF_GEN_STOP);
    nf_tok_ids_free(&base.seq);
    gen_case cc = c;
    cc.p.max_new = 1000;
    snprintf(what, sizeof what, "%s to the context end", name);
    acc += compare_case(e, tok, &cc, what, &base);
    CHECK(base.st.end == NF_GEN_CONTEXT && base.n_past == CTX);
    nf_tok_ids_free(&base.seq);
    gen_case cp = c;
    cp.repeat_penalty = 1.3f;
    snprintf(what, sizeof what, "%s repetition penalty", name);
    acc += compare_case(e, tok, &cp, what, &base);
    nf_tok_ids_free(&base.seq);
    gen_case cr = c;
    cr.prompt[0] = rnd, cr.n[0] = 20;
    snprintf(what, sizeof what, "%s random prompt", name);
    acc += compare_case(e, tok, &cr, what, &base);
    nf_tok_ids_free(&base.seq);
    gen_case ct = c;
    ct.turns = 2, ct.p.max_new = 20;
    snprintf(what, sizeof what, "%s two turns", name);
    acc += compare_case(e, tok, &ct, what, &base);
    nf_tok_ids_free(&base.seq);
    if (need_accepted) CHECK_MSG(acc > 0, "%s: no draft was accepted", name); /* a random hybrid's text rarely repeats */
    printf("%s: %zu drafts accepted over the cases\n", name, acc);
    nf_tok_free(tok);
    nf_engine_free(e);
    nf_model_free(m);
}

enum { HG = 48, HK = 3 };

/* A hybrid's rollback, driven step by step (prompt lookup rarely drafts on a random hybrid's text):
 * nf_spec_verify with drafts made of the greedy tokens of a run without speculation, the first a
 * right and the rest wrong, a = 0 .. k in turn (k = 1 .. HK), and every third step with an accepted
 * draft cut back by one (nf_spec_truncate, as when generation ends on it): every token picked equals
 * the run without speculation, so the state slot was restored and the kept tokens rerun each time. */
static size_t hybrid_machinery(nf_engine *e, const int32_t *prompt, size_t P, const char *name)
{
    const uint32_t V = e->model->cfg.vocab;
    int32_t seq[64 + HG + HK + 1], base[HG];
    memcpy(seq, prompt, P * sizeof *seq);
    nf_engine_reset(e);
    CHECK(nf_engine_prefill(e, prompt, P, NULL, NULL) == NF_OK);
    for (int g = 0; g < HG; g++) {
        base[g] = (int32_t)fx_argmax(e->logits, V);
        if (g + 1 < HG) CHECK(nf_engine_decode(e, base[g], NULL) == NF_OK);
    }
    nf_sampler_params sp = nf_sampler_defaults();
    sp.temp = 0;
    nf_sampler *s;
    if (nf_sampler_create(&sp, V, &s, NULL)) return 0;
    nf_engine_reset(e);
    CHECK(nf_engine_prefill(e, prompt, P, NULL, NULL) == NF_OK);
    static float rows[(HK + 1) * 256];
    size_t known = P + 1, accepted = 0; /* seq[0, known): the engine holds all but the last */
    seq[P] = base[0];
    for (unsigned step = 0; known + HK + 1 < P + HG && V <= 256; step++) {
        const uint32_t k = 1 + step % HK, a = step / HK % (k + 1);
        for (uint32_t j = 0; j < k; j++) {
            const int32_t right = base[known - P + j];
            seq[known + j] = j < a ? right : (int32_t)(((uint32_t)right + 1) % V);
        }
        int32_t out[HK + 1];
        size_t n_out = 0;
        nf_error err;
        CHECK_MSG(nf_spec_verify(e, s, seq, known + k, k, rows, out, &n_out, &err) == NF_OK, "%s: %s", name, err.msg);
        CHECK_MSG(n_out == a + 1 && !memcmp(out, base + (known - P), n_out * sizeof *out),
                  "%s step %u (k %u, %u right): the picked tokens differ from greedy without speculation", name, step, k, a);
        CHECK(e->n_past == known + a);
        memcpy(seq + known, base + (known - P), n_out * sizeof *seq);
        known += n_out;
        accepted += a;
        if (a && step % 3 == 0) { /* the last accepted draft ends generation: the session holds up to it */
            CHECK(nf_spec_truncate(e, seq, 0, e->n_past - 1, &err) == NF_OK);
            CHECK(e->n_past == known - 2);
            known -= 1;
        }
    }
    nf_sampler_free(s);
    return accepted;
}

/* Gated DeltaNet hybrids with prompt lookup (their state restored after rejections): the machinery
 * above on a random prompt, and nf_generate's cases on them (the same tokens with and without). */
static void hybrid_cases(const char *path, const char *name)
{
    nf_model *m;
    nf_engine *e;
    nf_error err;
    if (nf_model_load(path, &m, &err)) {
        CHECK_MSG(0, "%s", err.msg);
        return;
    }
    nf_engine_opts o = {.threads = 2, .ctx = CTX, .page_tokens = 16};
    if (!nf_engine_create(m, &o, &e, &err)) {
        int32_t prompt[30];
        uint64_t x = 9;
        for (int i = 0; i < 30; i++) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
            prompt[i] = (int32_t)((x >> 33) % m->cfg.vocab);
        }
        const size_t acc = hybrid_machinery(e, prompt, 30, name);
        printf("%s: %zu drafts accepted by the step-by-step verifications\n", name, acc);
        CHECK(acc > 0);
        nf_engine_free(e);
    }
    nf_model_free(m);
    fixture_cases(path, name, 0);
}

enum { TK = SPEC_TK, TRIALS = 10000, PMAX = 256 + 64 };

/* Sampling with speculation through nf_generate on the vocabulary-256 fixture: the first three tokens
 * (after a first token that continues the prompt's loop the second and third come from a verification
 * of a draft, accepted or rejected; after the others, from plain decodes) against the joint distribution of plain forwards; chi-square over the
 * cells expected >= 5 times (the rest pooled into one), at most 27 - 1 degrees of freedom < 75
 * (p < 1e-5 for a correct implementation; seeds 1 .. TRIALS, deterministic). */
static void sampled_generation(const char *path)
{
    nf_model *m;
    nf_engine *e;
    nf_error err;
    if (nf_model_load(path, &m, &err)) return;
    nf_engine_opts o = {.threads = 2, .ctx = PMAX + 8};
    if (nf_engine_create(m, &o, &e, &err)) {
        nf_model_free(m);
        return;
    }
    const double temp = 1.5;
    int32_t prompt[PMAX], ids[TK][TK][TK][3];
    const uint32_t PLEN = spec_loop_prompt(e, prompt, PMAX);
    static double p[TK][TK][TK];
    spec_joint_reference(e, prompt, PLEN, temp, ids, p);
    nf_tokenizer *tok = names_tokenizer(m->cfg.vocab);
    static long cnt[TK * TK * TK + 1];
    long accepted = 0, drafted = 0;
    /* the prompt but its last token stays cached: each trial runs that token again (as a chat turn would) */
    nf_tok_ids seq = {.ids = malloc((PMAX + 16) * sizeof(int32_t)), .cap = PMAX + 16};
    if (seq.ids) memcpy(seq.ids, prompt, PLEN * sizeof *prompt);
    nf_engine_reset(e);
    CHECK(nf_engine_prefill(e, prompt, PLEN - 1, NULL, NULL) == NF_OK);
    for (int t = 0; seq.ids && t < TRIALS; t++) {
        nf_sampler_params sp = {.temp = (float)temp, .top_k = TK, .top_p = 1, .repeat_penalty = 1, .seed = (uint64_t)t + 1};
        nf_sampler *s;
        if (nf_sampler_create(&sp, m->cfg.vocab, &s, NULL)) break;
        nf_gen_params gp = {.max_new = 3, .spec_k = 3};
        nf_gen_stats st;
        static result r;
        r.len = 0;
        nf_engine_truncate(e, PLEN - 1);
        seq.n = PLEN - 1;
        CHECK(nf_generate(e, tok, s, prompt + PLEN - 1, 1, &gp, emit, &r, &seq, &st, &err) == NF_OK);
        r.text[r.len] = 0;
        accepted += (long)st.accepted, drafted += (long)st.drafted;
        /* the third token is not fed: read the three back from the text */
        int32_t got[3] = {-1, -1, -1};
        CHECK(sscanf(r.text, "t%dt%dt%d", &got[0], &got[1], &got[2]) == 3);
        const int cell = spec_cell(ids, got);
        CHECK_MSG(cell < TK * TK * TK, "tokens %d %d %d are outside the top-%d cells", got[0], got[1], got[2], TK);
        cnt[cell]++;
        nf_sampler_free(s);
    }
    nf_tok_ids_free(&seq);
    double ex[TK * TK * TK];
    for (int c = 0; c < TK * TK * TK; c++) ex[c] = TRIALS * p[c / 9][c / 3 % 3][c % 3];
    int df;
    const double chi2 = pooled_chi2(cnt, ex, TK * TK * TK, &df);
    printf("sampled generation (prompt %u tokens): chi-square %.1f over %d degrees of freedom; %ld of %ld drafts accepted\n", PLEN,
           chi2, df, accepted, drafted);
    CHECK_MSG(chi2 < 75, "sampled generation with speculation: chi-square %.1f over %d degrees of freedom", chi2, df);
    CHECK_MSG(accepted > TRIALS / 10 && accepted < drafted - TRIALS / 10, "%ld of %ld drafts accepted: both "
              "branches must be exercised", accepted, drafted);
    nf_tok_free(tok);
    nf_engine_free(e);
    nf_model_free(m);
}

int main(void)
{
    drafting();
    verification();
    static const char *models[] = {"llama", "qwen2_moe", "qwen2_moe_nobias", "qwen3_moe", "qwen3_moe_256",
                                   "qwen3_moe_fused", "qwen3_moe", "qwen3_next", "qwen3_5_moe_text"};
    static const char *recipes[] = {"bf16", "bf16", "bf16", "bf16", "bf16", "bf16", "q8q8", "bf16", "bf16"};
    char tmp[] = "/tmp/nf_spec_XXXXXX";
    if (!mkdtemp(tmp)) return 1;
    for (size_t k = 0; k < sizeof models / sizeof *models; k++) {
        char dir[512], out[600], name[64];
        snprintf(dir, sizeof dir, "%s/fixtures/models/%s", NF_TEST_DATA, models[k]);
        snprintf(out, sizeof out, "%s/%s-%s.nf", tmp, models[k], recipes[k]);
        snprintf(name, sizeof name, "%s %s", models[k], recipes[k]);
        if (!fx_convert(dir, recipes[k], out)) continue;
        if (strcmp(models[k], "qwen3_next") == 0 || strcmp(models[k], "qwen3_5_moe_text") == 0) hybrid_cases(out, name);
        else if (strcmp(models[k], "qwen3_moe_256") == 0) fixture_cases(out, name, 1), sampled_generation(out);
        else fixture_cases(out, name, 1);
        unlink(out);
    }
    rmdir(tmp);
    return nf_test_report();
}

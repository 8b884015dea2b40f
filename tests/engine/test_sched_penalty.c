/* Penalties applied on the device (engine.h nf_backend_ops.penalize) before top-k give the tokens of
 * the host path that penalises full logits (nf_sampler_sample).
 *
 * The fake backend keeps its logits "on the device" (a host array) and implements penalize and topk
 * the straightforward way from their contracts: each pair's logit divided (positive) or multiplied
 * by the repetition penalty, then frequency * count and presence subtracted; top-k by repeated
 * selection, ties to the lower id. A sequence's logits depend only on its last token and position
 * (no KV cache), with values on a 1/8 grid (many ties) and a block of favoured ids, so that greedy and
 * sampled sequences repeat themselves and the penalties change the tokens.
 *
 * The same sequences run through the scheduler three ways: host logits (forward fills them), device
 * with penalize + topk, device without penalize (full logits fetched when a penalty is on); every
 * sequence's tokens must be equal. nf_engine_next is checked the same way on one sequence. */
#include "nf_test.h"

#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/sched.h"

enum { V = 300, MAXS = 4, CHUNK = 24, CTX = 160, PT = 16, GEN = 40 };

static uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* The logits after token `tok` at position `pos`: -4 .. 4 on a 1/8 grid, ids below 12 raised by 4. */
static void logits_after(int32_t tok, uint32_t pos, float *l)
{
    const uint64_t h = mix(((uint64_t)(uint32_t)tok << 32) ^ pos);
    for (uint32_t v = 0; v < V; v++)
        l[v] = (float)((int)(mix(h + v) >> 58) - 32) / 8.0f + (v < 12 ? 4.0f : 0.0f);
}

typedef struct fake {
    int device;     /* logits stay here (forward gets NULL) */
    float held[MAXS][V];
    uint32_t held_S;
    long penalize_calls, pairs, topk_calls, logits_calls, violations;
} fake;

static nf_status fake_forward(void *state, const nf_batch *b, float *logits, nf_error *err)
{
    fake *f = state;
    if (!b->n_seqs || b->n_seqs > MAXS || b->n_tokens > CHUNK || f->device != (logits == NULL))
        return nf_error_set(err, NF_ERR_INVALID_ARG, "fake: bad batch");
    for (uint32_t i = 0; i < b->n_seqs; i++) {
        const uint32_t n = nf_batch_tokens_of(b, i);
        logits_after(b->tokens[b->seq_start[i] + n - 1], b->pos0[i] + n - 1, logits ? logits + (size_t)i * V : f->held[i]);
    }
    f->held_S = b->n_seqs;
    return NF_OK;
}

static nf_status fake_logits(void *state, float *out, nf_error *err)
{
    (void)err;
    fake *f = state;
    f->logits_calls++;
    memcpy(out, f->held, (size_t)f->held_S * V * sizeof *out);
    return NF_OK;
}

static nf_status fake_topk(void *state, uint32_t k, int32_t *ids, float *vals, nf_error *err)
{
    fake *f = state;
    if (!k || k > NF_SAMPLER_DEVICE_MAX_K) return nf_error_set(err, NF_ERR_INVALID_ARG, "fake: k %u", k);
    f->topk_calls++;
    for (uint32_t i = 0; i < f->held_S; i++) {
        char taken[V] = {0};
        for (uint32_t j = 0; j < k; j++) {
            int best = -1;
            for (int v = 0; v < V; v++)
                if (!taken[v] && (best < 0 || f->held[i][v] > f->held[i][best])) best = v;
            taken[best] = 1;
            ids[i * k + j] = best;
            vals[i * k + j] = f->held[i][best];
        }
    }
    return NF_OK;
}

/* The contract: lists from 0, not backwards, ids in the vocabulary and distinct per sequence, counts > 0. */
static int bad_lists(const fake *f, const uint32_t *start, const int32_t *ids, const uint32_t *counts)
{
    if (start[0]) return 1;
    for (uint32_t i = 0; i < f->held_S; i++) {
        if (start[i + 1] < start[i]) return 1;
        char seen[V] = {0};
        for (uint32_t j = start[i]; j < start[i + 1]; j++) {
            if (ids[j] < 0 || ids[j] >= V || seen[ids[j]] || !counts[j]) return 1;
            seen[ids[j]] = 1;
        }
    }
    return 0;
}

static nf_status fake_penalize(void *state, const nf_penalty *pen, const uint32_t *start, const int32_t *ids,
                               const uint32_t *counts, nf_error *err)
{
    fake *f = state;
    f->penalize_calls++;
    if (bad_lists(f, start, ids, counts)) {
        f->violations++;
        return nf_error_set(err, NF_ERR_INVALID_ARG, "fake: malformed penalty lists");
    }
    for (uint32_t i = 0; i < f->held_S; i++)
        for (uint32_t j = start[i]; j < start[i + 1]; j++) {
            float x = f->held[i][ids[j]];
            if (x > 0) x /= pen[i].repetition;
            else x *= pen[i].repetition;
            x -= pen[i].frequency * (float)counts[j];
            x -= pen[i].presence;
            f->held[i][ids[j]] = x;
            f->pairs++;
        }
    return NF_OK;
}

static nf_status fake_copy(void *state, uint32_t dst, uint32_t src, nf_error *err)
{
    (void)state, (void)dst, (void)src, (void)err;
    return NF_OK;
}

enum { HOST, DEVICE_PENALIZE, DEVICE_LOGITS };

/* The cases: greedy and sampled, each penalty alone and together, windows short and long, one
 * without penalties and one whose window is off; `wide` adds a sampler that needs every logit. */
static size_t cases(nf_sampler_params *p, int wide)
{
    size_t n = 0;
    nf_sampler_params d = nf_sampler_defaults();
    d.seed = 11;
    p[n] = d, p[n].temp = 0, p[n].repeat_penalty = 1.3f, p[n++].repeat_last_n = 16;
    p[n] = d, p[n].repeat_penalty = 1.2f, p[n].presence_penalty = 0.5f, p[n].frequency_penalty = 0.3f, p[n++].seed = 5;
    p[n] = d, p[n].temp = 1.0f, p[n].top_k = 8, p[n].top_p = 0.9f, p[n].min_p = 0;
    p[n].frequency_penalty = 0.7f, p[n++].repeat_last_n = 8;
    p[n] = d, p[n].temp = 0, p[n++].presence_penalty = 1.1f;
    p[n] = d, p[n].temp = 0.7f, p[n++].top_k = 20;
    p[n] = d, p[n].temp = 0, p[n].repeat_penalty = 1.1f, p[n].frequency_penalty = -0.4f, p[n++].repeat_last_n = 0;
    p[n] = d, p[n].top_k = 256, p[n].min_p = 0, p[n].top_p = 1, p[n].repeat_penalty = 0.8f, p[n++].seed = 9;
    if (wide) p[n] = d, p[n].top_k = 0, p[n].repeat_penalty = 1.5f, p[n++].frequency_penalty = 0.2f;
    return n;
}

/* Every case through the scheduler; out[i][GEN] the generated ids. */
static void run(int mode, const nf_sampler_params *p, size_t n, int32_t out[][GEN], fake *f, int reply_only)
{
    memset(f, 0, sizeof *f);
    f->device = mode != HOST;
    nf_sched_backend be = {.state = f, .forward = fake_forward, .logits = f->device ? fake_logits : NULL,
                           .topk = f->device ? fake_topk : NULL, .copy_page = fake_copy,
                           .penalize = mode == DEVICE_PENALIZE ? fake_penalize : NULL};
    nf_sched_opts o = {.vocab = V, .ctx = CTX, .chunk = CHUNK, .max_seqs = MAXS, .page_tokens = PT,
                       .kv_pages = MAXS * CTX / PT, .no_prefix_cache = 1};
    nf_sched *s = NULL;
    nf_error e;
    if (nf_sched_create(&be, &o, &s, &e)) {
        CHECK_MSG(0, "%s", e.msg);
        return;
    }
    uint64_t ids[16];
    for (size_t i = 0; i < n; i++) {
        int32_t prompt[40];
        const size_t np = 3 + i * 4; /* ragged: several chunks, repeats of the favoured ids */
        for (size_t j = 0; j < np; j++) prompt[j] = (int32_t)((j * 7 + i) % (j % 3 ? 12 : V));
        nf_seq_params sp = {.sampling = p[i], .max_new = GEN, .penalty_reply_only = reply_only};
        CHECK(nf_sched_add(s, prompt, np, &sp, &ids[i], &e) == NF_OK);
    }
    nf_sched_step_info info;
    for (int steps = 0; !nf_sched_idle(s) && steps < 1000; steps++)
        if (nf_sched_step(s, &info, &e)) {
            CHECK_MSG(0, "step: %s", e.msg);
            break;
        }
    for (size_t i = 0; i < n; i++) {
        size_t np = 0, all = 0;
        const int32_t *t = nf_sched_tokens(s, ids[i], &np, &all);
        CHECK(t && all == np + GEN);
        if (t && all == np + GEN) memcpy(out[i], t + np, GEN * sizeof *t);
    }
    nf_sched_free(s);
}

static void check_sched(void)
{
    static int32_t host[16][GEN], dev[16][GEN], plain[16][GEN], nopen[16][GEN];
    nf_sampler_params p[16];
    fake f;
    for (int wide = 0; wide <= 1; wide++) {
        const size_t n = cases(p, wide);
        run(HOST, p, n, host, &f, 0);
        run(DEVICE_PENALIZE, p, n, dev, &f, 0);
        CHECK_EQ_INT(f.violations, 0);
        CHECK_MSG(f.penalize_calls > 0 && f.pairs > 0, "penalize: %ld calls, %ld pairs", f.penalize_calls, f.pairs);
        if (!wide) CHECK_MSG(f.logits_calls == 0, "%ld full-logits fetches though every sampler allows top-k", f.logits_calls);
        else CHECK_MSG(f.logits_calls > 0, "the wide sampler needs every logit");
        run(DEVICE_LOGITS, p, n, plain, &f, 0);
        CHECK_MSG(f.logits_calls > 0, "without penalize the penalised samplers fetch every logit");
        for (size_t i = 0; i < n; i++) {
            for (int j = 0; j < GEN; j++) {
                CHECK_MSG(dev[i][j] == host[i][j], "wide %d case %zu token %d: penalize+topk %d, host %d", wide, i, j,
                          dev[i][j], host[i][j]);
                CHECK_MSG(plain[i][j] == host[i][j], "wide %d case %zu token %d: logits %d, host %d", wide, i, j,
                          plain[i][j], host[i][j]);
            }
        }
    }
    /* the penalties matter here: without them the penalised cases generate other tokens */
    const size_t n = cases(p, 0);
    for (size_t i = 0; i < n; i++) p[i].repeat_penalty = 1, p[i].presence_penalty = p[i].frequency_penalty = 0;
    run(HOST, p, n, nopen, &f, 0);
    int changed = 0;
    for (size_t i = 0; i < n; i++) changed += memcmp(nopen[i], host[i], sizeof host[i]) != 0;
    CHECK_MSG(changed >= 5, "only %d of %zu cases change with their penalties", changed, n);
}

/* nf_engine_next on an engine over the fake ops: the token of nf_sampler_sample on host logits. */
static void check_engine_next(void)
{
    static const nf_backend_ops ops = {.name = "fake", .forward = fake_forward, .logits = fake_logits,
                                       .topk = fake_topk, .penalize = fake_penalize, .copy_page = fake_copy};
    fake f = {.device = 1};
    float logits[V], host[V];
    nf_engine e = {.ops = &ops, .state = &f, .logits = logits};
    nf_sampler_params p[16];
    const size_t n = cases(p, 1);
    const int32_t hist[12] = {3, 3, 1, 7, 3, 5, 299, 1, 3, 11, 0, 3};
    nf_error err;
    for (size_t i = 0; i < n; i++) {
        nf_sampler *a = NULL, *b = NULL;
        CHECK(nf_sampler_create(&p[i], V, &a, NULL) == NF_OK && nf_sampler_create(&p[i], V, &b, NULL) == NF_OK);
        for (uint32_t pos = 20; a && b && pos < 30; pos++) {
            const int32_t tok = hist[pos % 12];
            const uint32_t one[2] = {0, 1};
            const nf_batch batch = {.n_tokens = 1, .n_seqs = 1, .tokens = &tok, .seq_start = one, .pos0 = &pos};
            CHECK(fake_forward(&f, &batch, NULL, &err) == NF_OK);
            e.logits_stale = 1, e.logits_penalized = 0;
            logits_after(tok, pos, host);
            int32_t got = -1;
            CHECK(nf_engine_next(&e, a, hist, 12, &got, &err) == NF_OK);
            const int32_t want = nf_sampler_sample(b, host, hist, 12);
            CHECK_MSG(got == want, "case %zu pos %u: engine %d, host %d", i, pos, got, want);
            /* a second draw would penalise twice: refused when the sampler has penalties */
            if (nf_sampler_penalty_max(a, 12) && nf_sampler_device_k_penalized(a))
                CHECK(nf_engine_next(&e, a, hist, 12, &got, &err) == NF_ERR_INVALID_ARG);
        }
        nf_sampler_free(a), nf_sampler_free(b);
    }
    CHECK_EQ_INT(f.violations, 0);
}

/* penalty_reply_only (the server's OpenAI window): presence and frequency count the generated tokens
 * alone, all GEN of them. Greedy, against the rule written out here: logits_after the last token,
 * each id generated so far lowered by frequency * count then presence, argmax ties to the lower id;
 * every backend mode must give it, and the prompt-and-reply window must give something else (the
 * prompts are full of the favoured ids, which the reply-only window does not lower until used). */
static void check_reply_only(void)
{
    enum { N = 4 };
    nf_sampler_params p[N];
    for (int i = 0; i < N; i++)
        p[i] = (nf_sampler_params){.temp = 0, .top_p = 1, .repeat_penalty = 1, .presence_penalty = 1.5f,
                                   .frequency_penalty = 0.5f, .repeat_last_n = GEN};
    static int32_t got[3][N][GEN], full[N][GEN];
    fake f;
    const int modes[3] = {HOST, DEVICE_PENALIZE, DEVICE_LOGITS};
    for (int m = 0; m < 3; m++) run(modes[m], p, N, got[m], &f, 1);
    run(HOST, p, N, full, &f, 0);
    int differs = 0;
    for (int i = 0; i < N; i++) {
        const size_t np = 3 + (size_t)i * 4;
        int32_t last = (int32_t)(((np - 1) * 7 + (size_t)i) % ((np - 1) % 3 ? 12 : V)); /* run()'s prompt */
        uint32_t count[V] = {0};
        float l[V];
        for (int j = 0; j < GEN; j++) {
            logits_after(last, (uint32_t)(np - 1 + (size_t)j), l);
            int32_t best = 0;
            for (int32_t v = 0; v < V; v++) {
                if (count[v]) {
                    const float fc = p[i].frequency_penalty * (float)count[v];
                    l[v] = l[v] - fc;
                    l[v] = l[v] - p[i].presence_penalty;
                }
                if (l[v] > l[best]) best = v;
            }
            for (int m = 0; m < 3; m++)
                CHECK_MSG(got[m][i][j] == best, "reply-only, mode %d, sequence %d token %d: %d, the rule says %d", m, i, j,
                          got[m][i][j], best);
            count[best]++;
            last = best;
        }
        differs += memcmp(full[i], got[0][i], sizeof full[i]) != 0;
    }
    CHECK_MSG(differs > 0, "the prompt-and-reply window gives the reply-only tokens in all %d sequences", N);
}

int main(void)
{
    check_sched();
    check_reply_only();
    check_engine_next();
    return nf_test_report();
}

/* The hybrids' MTP block on the CPU against tests/oracle/hybrid_mtp.py's torch reference (vLLM's
 * formulation over transformers' decoder layer), for qwen3_next (per-expert keys, untied head) and
 * qwen3_5_moe_text (fused experts, tied head), bf16 recipe:
 *   - the main model prefills the 130-token prompt (engine chunks of 48) and keeps every position's
 *     final-normed hidden state; the MTP block runs over positions 0..129, fed (h_p, t_{p+1}) with
 *     t_130 = the first greedy token, in pieces of 48, 48, 34 on its own KV pages: every row's draft
 *     logits within rel-L2 1e-4 of the reference (test_oracle_tiny's bound for the main model: one more
 *     attention + MoE layer on fp32 activations, measured below);
 *   - two chained steps (positions 130, 131: the previous step's MTP hidden state and its argmax): the
 *     same bound, and the argmax tokens equal the reference's;
 *   - the last-row form (nf_engine_mtp without `all`, what speculation runs) gives the last row within
 *     rel-L2 1e-6;
 *   - the multimodal qwen3_5_moe folder (the same weights, mtp.* at top level) converts to the same MTP
 *     logits, bit for bit;
 *   - refusals: a model without mtp.* (qwen3_moe) has no MTP block, and nf_engine_mtp says so.
 * q8q8: the fast path against the reference path within 1e-4 (the quantized block is not close to the
 * bf16 oracle, for the reason docs/engine.md gives for the tiny models).
 *
 * Speculation (--spec mtp:K, engine/spec.h), on both fixtures, bf16 and q8q8:
 *   - the machinery, driven step by step: nf_spec_mtp_draft's drafts are replaced by a pattern of the
 *     right greedy tokens (from a run without speculation) and wrong ones, so that every acceptance
 *     count 0..K occurs, and some steps are cut back by one accepted draft (nf_spec_mtp_truncate, as when
 *     generation ends there); the tokens picked equal the run without speculation (so the recurrent
 *     state was rolled back and the kept tokens rerun correctly), and each step's first real draft is the argmax of
 *     the MTP block run afresh over the final sequence at that position (so the block's own keys stayed
 *     in step across rejections, the pending hidden states and the re-runs);
 *   - nf_generate greedy with mtp:1, 2, 3 gives the tokens, end reason and cache length of the run without,
 *     over two chat-like turns (the second continues the session: the hidden state kept in the engine)
 *     and with an end-of-generation id; a model without an MTP block is refused;
 *   - sampling (temperature 1.5, top-k 3) through nf_spec_mtp_verify on qwen3_next: the first three
 *     tokens after a prompt, drafts being the likeliest continuation (a point mass chosen from the
 *     tokens sampled so far, as the block's argmax is), 10000 seeded trials against the joint
 *     distribution from plain forwards: chi-square over the cells expected >= 5 times (the rest pooled),
 *     at most 26 degrees of freedom < 75 (p < 1e-5 for a correct rule); drafts accepted and rejected
 *     both occur. The recurrent state is restored between trials by slot_copy from slot 1 (max_seqs 2: the
 *     session's slot 0 and its spare 2 are speculation's);
 *   - sampling with the block's own drafts (nf_spec_mtp_draft_q: drafts drawn from the block's sampler
 *     distribution q, verified with min(1, p/q) and the residual max(0, p - q)) on qwen3_next: top-k off
 *     (the random block's top few rarely meet the main model's), temperature 1.5, after the prompt and
 *     its likeliest next token, 40000 trials of mtp:2 (one more step of one draft after a first
 *     rejection); the second and third tokens' marginals against the exact ones from plain forwards
 *     over the whole vocabulary, chi-square over the cells expected >= 5 times < 1.3 df + 35 (p about
 *     1e-5); acceptances and rejections both occur. Drawing from p instead of the residual on
 *     rejection gives chi-square 5072 / 938 over 255. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "engine/npy.h"
#include "nf_test.h"
#include "common/engine_fixture.h"
#include "common/letters_tokenizer.h"
#include "common/mtp_generate.h"
#include "common/spec_stats.h"
#include "engine/generate.h"
#include "engine/sched.h"
#include "engine/spec.h"

static int load_npy(const char *model, const char *file, nf_npy *out)
{
    char path[1200];
    nf_error err;
    snprintf(path, sizeof path, "%s/fixtures/models/%s/%s", NF_TEST_DATA, model, file);
    if (nf_npy_read(path, out, &err)) {
        CHECK_MSG(0, "%s", err.msg);
        return 0;
    }
    return 1;
}

/* Draft logits of every prompt position and two chained steps: rows[P + 2][V]. */
static int run_mtp(const char *path, int reference, const int32_t *prompt, size_t P, int32_t next, float *rows,
                   int32_t *chain_tok)
{
    nf_model *m;
    nf_engine *e;
    nf_error err;
    if (nf_model_load(path, &m, &err)) {
        CHECK_MSG(0, "%s", err.msg);
        return 0;
    }
    CHECK_MSG(m->mtp != NULL, "%s: no MTP block bound", path);
    const size_t V = m->cfg.vocab, H = m->cfg.hidden;
    /* f32 activations: the fast path against the reference within 1e-4 is the claim for the same
     * numerics (int8 activations, the CPU default for q8_0, move a product by up to sqrt(32)/254) */
    nf_engine_opts o = {.mtp = 1, .threads = 2, .ctx = 256, .chunk = 48, .reference = reference, .no_a8 = 1};
    if (nf_engine_create(m, &o, &e, &err)) {
        CHECK_MSG(0, "%s", err.msg);
        nf_model_free(m);
        return 0;
    }
    float *hid = malloc((P + 2) * H * sizeof(float)), *hout = malloc((P + 2) * H * sizeof(float));
    int32_t *tok = malloc((P + 2) * sizeof(int32_t));
    int ok = 0;
    if (nf_engine_prefill_hidden(e, prompt, P, NULL, hid, &err)) {
        CHECK_MSG(0, "%s", err.msg);
        goto out;
    }
    memcpy(tok, prompt + 1, (P - 1) * sizeof(int32_t));
    tok[P - 1] = next;
    if (nf_engine_mtp(e, tok, hid, P, 0, 1, rows, hout, &err)) {
        CHECK_MSG(0, "%s", err.msg);
        goto out;
    }
    { /* the last row alone (speculation's form, pieces of 48): the same row, within rounding */
        float *l1 = malloc(V * sizeof(float)), *h1 = malloc(H * sizeof(float));
        CHECK(nf_engine_mtp(e, tok, hid, P, 0, 0, l1, h1, &err) == NF_OK);
        const double dl = fx_rel_l2(l1, rows + (P - 1) * V, V), dh = fx_rel_l2(h1, hout + (P - 1) * H, H);
        CHECK_MSG(dl <= 1e-6 && dh <= 1e-6, "%s: the last-row form differs (logits %.3g, hidden %.3g)", path, dl, dh);
        free(l1), free(h1);
    }
    for (size_t k = 0; k < 2; k++) { /* chained: position P + k takes the last step's hidden and argmax */
        const size_t p = P + k;
        tok[p] = chain_tok[k] = (int32_t)fx_argmax(rows + (p - 1) * V, V);
        if (nf_engine_mtp(e, tok + p, hout + (p - 1) * H, 1, (uint32_t)p, 1, rows + p * V, hout + p * H, &err)) {
            CHECK_MSG(0, "%s", err.msg);
            goto out;
        }
    }
    ok = 1;
out:
    free(hid), free(hout), free(tok);
    nf_engine_free(e);
    nf_model_free(m);
    return ok;
}

static void against_torch(const char *tmp, const char *name, const char *mm)
{
    char dir[1024], out[1200];
    nf_npy pr, gr, ml, mc, mt;
    if (!load_npy(name, "ref_prompt.npy", &pr) || !load_npy(name, "ref_greedy.npy", &gr) ||
        !load_npy(name, "ref_mtp_logits.npy", &ml) || !load_npy(name, "ref_mtp_chain.npy", &mc) ||
        !load_npy(name, "ref_mtp_chain_tokens.npy", &mt))
        return;
    const size_t P = pr.count, V = ml.count / P;
    int32_t *ids = malloc(P * sizeof *ids), chain[2], chain2[2];
    for (size_t i = 0; i < P; i++) ids[i] = (int32_t)nf_npy_get_f64(&pr, i);
    const int32_t next = (int32_t)nf_npy_get_f64(&gr, 0);
    float *rows = malloc((P + 2) * V * sizeof(float)), *rows2 = malloc((P + 2) * V * sizeof(float));
    snprintf(dir, sizeof dir, "%s/fixtures/models/%s", NF_TEST_DATA, name);
    snprintf(out, sizeof out, "%s/%s-bf16.nf", tmp, name);
    if (fx_convert(dir, "bf16", out) && run_mtp(out, 0, ids, P, next, rows, chain)) {
        const double wp = fx_worst_rows(rows, ml.data, P, V), wc = fx_worst_rows(rows + P * V, mc.data, 2, V);
        printf("%s: MTP draft logits vs torch: prompt positions %.2e, chained steps %.2e (worst row); chain %d %d "
               "(reference %d %d)\n", name, wp, wc, chain[0], chain[1], (int)nf_npy_get_f64(&mt, 0),
               (int)nf_npy_get_f64(&mt, 1));
        CHECK_MSG(wp <= 1e-4, "%s: MTP logits rel-L2 %.3g > 1e-4", name, wp);
        CHECK_MSG(wc <= 1e-4, "%s: chained MTP logits rel-L2 %.3g > 1e-4", name, wc);
        CHECK(chain[0] == (int32_t)nf_npy_get_f64(&mt, 0) && chain[1] == (int32_t)nf_npy_get_f64(&mt, 1));
        if (mm) { /* the multimodal layout of the same weights */
            char mdir[1024], mout[1200];
            snprintf(mdir, sizeof mdir, "%s/fixtures/models/%s", NF_TEST_DATA, mm);
            snprintf(mout, sizeof mout, "%s/%s-bf16.nf", tmp, mm);
            if (fx_convert(mdir, "bf16", mout) && run_mtp(mout, 0, ids, P, next, rows2, chain2))
                CHECK_MSG(memcmp(rows, rows2, (P + 2) * V * sizeof(float)) == 0, "%s: MTP logits differ from %s's", mm,
                          name);
            remove(mout);
        }
        remove(out);
    }
    snprintf(out, sizeof out, "%s/%s-q8q8.nf", tmp, name);
    if (fx_convert(dir, "q8q8", out) && run_mtp(out, 0, ids, P, next, rows, chain) &&
        run_mtp(out, 1, ids, P, next, rows2, chain2)) {
        const double w = fx_worst_rows(rows, rows2, P + 2, V);
        printf("%s q8q8: MTP fast vs reference path %.2e\n", name, w);
        CHECK_MSG(w <= 1e-4, "%s q8q8: fast vs reference rel-L2 %.3g > 1e-4", name, w);
    }
    remove(out);
    free(ids), free(rows), free(rows2);
    nf_npy_free(&pr), nf_npy_free(&gr), nf_npy_free(&ml), nf_npy_free(&mc), nf_npy_free(&mt);
}

static void refusals(const char *tmp)
{
    char dir[1024], out[1200];
    snprintf(dir, sizeof dir, "%s/fixtures/models/qwen3_moe", NF_TEST_DATA);
    snprintf(out, sizeof out, "%s/qwen3_moe.nf", tmp);
    if (!fx_convert(dir, "bf16", out)) return;
    nf_model *m;
    nf_engine *e;
    nf_error err;
    if (nf_model_load(out, &m, &err)) {
        CHECK_MSG(0, "%s", err.msg);
        return;
    }
    CHECK(m->mtp == NULL && m->mtp_fc == NULL);
    nf_engine_opts o = {.mtp = 1, .threads = 2, .ctx = 64};
    if (!nf_engine_create(m, &o, &e, &err)) {
        float h[1024] = {0}, l[1024];
        int32_t t = 1;
        CHECK(nf_engine_mtp(e, &t, h, 1, 0, 1, l, NULL, &err) == NF_ERR_UNSUPPORTED);
        CHECK_CONTAINS(err.msg, "no MTP block");
        CHECK(nf_spec_check(e, NF_SPEC_MODE_MTP, 2, &err) == NF_ERR_UNSUPPORTED);
        CHECK_CONTAINS(err.msg, "no MTP block");
        nf_spec_mtp sm;
        CHECK(nf_spec_mtp_init(&sm, e, 2, &err) == NF_ERR_UNSUPPORTED);
        nf_spec_mtp_free(&sm);
        nf_engine_free(e);
    }
    nf_model_free(m);
    remove(out);
}

enum { CTX = 256, GEN = 48 };

/* Greedy without speculation: prompt then G tokens (base[G]) by plain decodes. */
static void plain_greedy(nf_engine *e, const int32_t *prompt, size_t P, size_t G, int32_t *base)
{
    nf_error err;
    nf_engine_reset(e);
    CHECK(nf_engine_prefill(e, prompt, P, NULL, &err) == NF_OK);
    for (size_t i = 0; i < G; i++) {
        base[i] = (int32_t)fx_argmax(e->logits, e->model->cfg.vocab);
        if (i + 1 < G) CHECK(nf_engine_decode(e, base[i], &err) == NF_OK);
    }
}

/* The step-by-step drive (see the top). */
static void machinery(nf_engine *e, const int32_t *prompt, size_t P, const char *what)
{
    const size_t V = e->model->cfg.vocab, H = e->model->cfg.hidden;
    int32_t base[GEN], seq[CTX], first_draft[CTX];
    uint32_t draft_pos[CTX];
    size_t n_first = 0, acc_seen[NF_SPEC_MTP_MAX_K + 1] = {0}, truncated = 0;
    plain_greedy(e, prompt, P, GEN, base);
    nf_sampler_params sp = {.temp = 0, .top_p = 1, .repeat_penalty = 1, .repeat_last_n = 64};
    nf_sampler *s;
    nf_error err;
    if (nf_sampler_create(&sp, (uint32_t)V, &s, NULL)) return;
    float *rows = malloc((NF_SPEC_MTP_MAX_K + 1) * V * sizeof(float));
    for (uint32_t K = 1; K <= NF_SPEC_MTP_MAX_K; K++) {
        nf_engine_reset(e);
        nf_spec_mtp m;
        if (nf_spec_mtp_init(&m, e, K, &err)) {
            CHECK_MSG(0, "%s", err.msg);
            break;
        }
        CHECK(nf_spec_mtp_prefill(&m, prompt, P, &err) == NF_OK);
        memcpy(seq, prompt, P * sizeof *seq);
        size_t n = P, got = 0, step = 0;
        int32_t id = (int32_t)fx_argmax(e->logits, V);
        int ok = id == base[0];
        got = 1;
        while (ok && got + K + 1 < GEN) {
            int32_t d[NF_SPEC_MTP_MAX_K], out[NF_SPEC_MTP_MAX_K + 1];
            size_t nd = 0, n_out = 0;
            seq[n] = id;
            if (nf_spec_mtp_draft(&m, id, K, d, &nd, &err) || nd != K) {
                CHECK_MSG(0, "%s: draft: %s", what, err.msg);
                break;
            }
            if (K == NF_SPEC_MTP_MAX_K) first_draft[n_first] = d[0], draft_pos[n_first++] = (uint32_t)n;
            const size_t want_acc = (step++ * 7 + K) % (K + 1); /* 0 .. K accepted */
            for (size_t j = 0; j < K; j++) /* right tokens up to want_acc, then a wrong one */
                seq[n + 1 + j] = j < want_acc ? base[got + j] : (base[got + j] + 1) % (int32_t)V;
            if (nf_spec_mtp_verify(&m, s, seq, n + 1 + K, K, rows, out, &n_out, &err)) {
                CHECK_MSG(0, "%s: verify: %s", what, err.msg);
                break;
            }
            acc_seen[n_out - 1]++;
            for (size_t j = 0; j < n_out; j++) ok &= out[j] == base[got + j];
            CHECK_MSG(n_out == want_acc + 1, "%s K=%u: %zu accepted, %zu expected", what, K, n_out - 1, want_acc);
            for (size_t j = 0; j + 1 < n_out; j++) seq[n + 1 + j] = out[j];
            if (n_out >= 2 && step % 4 == 1) { /* as when generation ends on an accepted draft: drop it, go on */
                CHECK(nf_spec_mtp_truncate(&m, seq, 0, (uint32_t)(n + n_out - 1), &err) == NF_OK);
                n += n_out - 1;
                got += n_out - 1;
                id = out[n_out - 2];
                truncated++;
            } else {
                n += n_out;
                got += n_out;
                id = out[n_out - 1];
            }
            CHECK(e->n_past == n);
        }
        CHECK_MSG(ok, "%s K=%u: a token differs from greedy without speculation (after %zu)", what, K, got);
        nf_spec_mtp_free(&m);
    }
    for (size_t a = 0; a <= NF_SPEC_MTP_MAX_K; a++) CHECK_MSG(acc_seen[a] > 0, "%s: no step accepted %zu", what, a);
    /* the block afresh over the final sequence: a draft made when token n was picked came from the block at
     * position n - 1 (fed h_{n-1} and token n) */
    const size_t D = draft_pos[n_first - 1];
    float *hid = malloc(D * H * sizeof(float)), *lg = malloc(D * V * sizeof(float));
    int32_t full[CTX];
    memcpy(full, prompt, P * sizeof *full);
    memcpy(full + P, base, (D + 1 - P) * sizeof *full);
    nf_engine_reset(e);
    size_t differ = 0;
    if (D + 1 - P <= GEN && !nf_engine_prefill_hidden(e, full, D, NULL, hid, &err) &&
        !nf_engine_mtp(e, full + 1, hid, D, 0, 1, lg, NULL, &err))
        for (size_t i = 0; i < n_first; i++)
            differ += first_draft[i] != (int32_t)fx_argmax(lg + (size_t)(draft_pos[i] - 1) * V, V);
    else
        CHECK_MSG(0, "%s: the fresh MTP run failed", what);
    printf("%s: drafts replaced by a right/wrong pattern, acceptances 0..3 seen %zu %zu %zu %zu times: tokens equal "
           "greedy (%zu steps cut back by one accepted draft); %zu of %zu first drafts differ from the block run "
           "afresh\n", what, acc_seen[0], acc_seen[1], acc_seen[2], acc_seen[3], truncated, differ, n_first);
    CHECK(truncated > 0);
    CHECK_MSG(differ == 0, "%s: %zu first drafts differ from the MTP block run over the final sequence", what, differ);
    free(hid), free(lg), free(rows);
    nf_sampler_free(s);
}

/* nf_generate greedy with mtp:K against without: two turns, then an end-of-generation id. */
static void generation(nf_engine *e, const int32_t *prompt, const char *what)
{
    nf_tokenizer *tok = names_tokenizer(e->model->cfg.vocab);
    nf_tok_ids ref[2] = {{0}}, got = {0};
    size_t accepted = 0, drafted = 0;
    int32_t eos = -1;
    for (int eos_case = 0; eos_case < 2; eos_case++) {
        for (uint32_t K = 0; K <= NF_SPEC_MTP_MAX_K; K++) {
            nf_tok_ids *r = K ? &got : &ref[eos_case];
            const nf_gen_end end = fx_mtp_generate(e, tok, prompt, GEN / 2, K, &eos, (size_t)eos_case, r, &drafted,
                                                   &accepted, what);
            if (!K && eos_case) CHECK(end == NF_GEN_EOS);
            if (K)
                CHECK_MSG(got.n == ref[eos_case].n && !memcmp(got.ids, ref[eos_case].ids, got.n * sizeof *got.ids),
                          "%s mtp:%u%s: %zu/%zu tokens, differ", what, K, eos_case ? " (eos)" : "", got.n,
                          ref[eos_case].n);
            if (!eos_case && !K) eos = ref[0].ids[40 + 10]; /* the 11th generated token ends the next case */
        }
    }
    printf("%s: nf_generate greedy with mtp:1..3 == without (two turns; with an end id): %zu of %zu drafts "
           "accepted\n", what, accepted, drafted);
    nf_tok_ids_free(&ref[0]), nf_tok_ids_free(&ref[1]), nf_tok_ids_free(&got);
    nf_tok_free(tok);
}

enum { TK = 3, TRIALS = 10000 };

/* Back to the state after the prompt (P tokens): slot 1, where it was kept then; n_past P. */
static void restore(nf_engine *e, uint32_t P)
{
    CHECK(e->ops->slot_copy(e->state, 0, 1, NULL) == NF_OK);
    e->n_past = P;
}

static int cell_of(const int32_t *ids, int32_t t)
{
    for (int j = 0; j < TK; j++)
        if (ids[j] == t) return j;
    return -1;
}

static void sampled(nf_engine *e, const int32_t *prompt, uint32_t P)
{
    const uint32_t V = e->model->cfg.vocab;
    const double temp = 1.5;
    nf_error err;
    float *pl = malloc(V * sizeof(float));
    float *rows = malloc(3 * V * sizeof(float));
    nf_engine_reset(e);
    CHECK(nf_engine_prefill(e, prompt, P, NULL, &err) == NF_OK);
    CHECK(e->ops->slot_copy(e->state, 1, 0, &err) == NF_OK);
    memcpy(pl, e->logits, V * sizeof(float));
    /* the joint distribution: i1, p1 after the prompt; i2[a], p2[a] after i1[a]; i3[a][b], p3[a][b] after both */
    int32_t i1[TK], i2[TK][TK], i3[TK][TK][TK];
    double p1[TK], p2[TK][TK], p3[TK][TK][TK];
    top_probs(pl, V, temp, TK, i1, p1);
    for (int a = 0; a < TK; a++) {
        restore(e, P);
        CHECK(nf_engine_decode(e, i1[a], &err) == NF_OK);
        top_probs(e->logits, V, temp, TK, i2[a], p2[a]);
        for (int b = 0; b < TK; b++) {
            const int32_t two[2] = {i1[a], i2[a][b]};
            restore(e, P);
            CHECK(nf_engine_prefill(e, two, 2, NULL, &err) == NF_OK);
            top_probs(e->logits, V, temp, TK, i3[a][b], p3[a][b]);
        }
    }
    static long cnt[TK * TK * TK + 1];
    long accepted = 0, drafted = 0;
    int32_t seq[CTX];
    memcpy(seq, prompt, P * sizeof *seq);
    for (int t = 0; t < TRIALS; t++) {
        nf_sampler_params sp = {.temp = (float)temp, .top_k = TK, .top_p = 1, .repeat_penalty = 1, .seed = (uint64_t)t + 1};
        nf_sampler *s;
        nf_spec_mtp m;
        if (nf_sampler_create(&sp, V, &s, NULL)) break;
        if (nf_spec_mtp_init(&m, e, 2, &err)) {
            nf_sampler_free(s);
            break;
        }
        restore(e, P);
        int32_t out[3];
        size_t n_out;
        const int32_t t1 = nf_sampler_sample(s, pl, seq, P);
        const int a = cell_of(i1, t1);
        int32_t x2 = -1, x3 = -1;
        if (a >= 0) {
            /* drafts: the likeliest second token, and the likeliest third after it */
            seq[P] = t1, seq[P + 1] = i2[a][0], seq[P + 2] = i3[a][0][0];
            CHECK(nf_spec_mtp_verify(&m, s, seq, P + 3, 2, rows, out, &n_out, &err) == NF_OK);
            drafted += 2, accepted += (long)n_out - 1;
            x2 = out[0];
            if (n_out >= 2) x3 = out[1];
            else { /* the second draft never ran: one more step, drafting the likeliest after x2 */
                const int b = cell_of(i2[a], x2);
                if (b >= 0) {
                    seq[P + 1] = x2, seq[P + 2] = i3[a][b][0];
                    CHECK(nf_spec_mtp_verify(&m, s, seq, P + 3, 1, rows, out, &n_out, &err) == NF_OK);
                    drafted += 1, accepted += (long)n_out - 1;
                    x3 = out[0];
                }
            }
        }
        const int b = a >= 0 ? cell_of(i2[a], x2) : -1, c = b >= 0 ? cell_of(i3[a][b], x3) : -1;
        CHECK_MSG(c >= 0, "tokens %d %d %d are outside the top-%d cells", t1, x2, x3, TK);
        cnt[c >= 0 ? (a * TK + b) * TK + c : TK * TK * TK]++;
        nf_spec_mtp_free(&m);
        nf_sampler_free(s);
    }
    double ex[TK * TK * TK];
    for (int c = 0; c < TK * TK * TK; c++) ex[c] = TRIALS * p1[c / 9] * p2[c / 9][c / 3 % 3] * p3[c / 9][c / 3 % 3][c % 3];
    int df;
    const double chi2 = pooled_chi2(cnt, ex, TK * TK * TK, &df);
    printf("sampled MTP verification: chi-square %.1f over %d degrees of freedom; %ld of %ld drafts accepted\n", chi2,
           df, accepted, drafted);
    CHECK_MSG(chi2 < 75, "sampling with MTP verification: chi-square %.1f over %d degrees of freedom", chi2, df);
    CHECK_MSG(accepted > TRIALS / 10 && accepted < drafted - TRIALS / 10, "%ld of %ld drafts accepted: both branches "
              "must be exercised", accepted, drafted);
    free(pl), free(rows);
}

/* softmax(l / temp) over all V logits, added to p[V] with weight w. */
static void add_softmax(const float *l, uint32_t V, double temp, double w, double *p)
{
    double z = 0, mx = l[0];
    for (uint32_t i = 1; i < V; i++) mx = l[i] > mx ? l[i] : mx;
    for (uint32_t i = 0; i < V; i++) z += exp((l[i] - mx) / temp);
    for (uint32_t i = 0; i < V; i++) p[i] += w * exp((l[i] - mx) / temp) / z;
}

enum { QTRIALS = 40000 };

/* The block's own drafts under sampling (nf_spec_mtp_draft_q, verified against their q rows): over the
 * whole vocabulary (top-k off, temperature 1.5), since the random block's top few rarely meet the main
 * model's. After the prompt and t1 = its likeliest next token (fixed: the conditional distribution is
 * what is checked), each trial drafts 2 and verifies (a second step of one draft when the first is
 * rejected); the second and third tokens' marginals against the exact ones from plain forwards
 * (p2 = the distribution after t1, p3 = sum over x2 of p2(x2) times the one after x2): chi-square over
 * the cells expected >= 5 times. */
static void sampled_q(nf_engine *e, const int32_t *prompt, uint32_t P)
{
    const uint32_t V = e->model->cfg.vocab;
    const double temp = 1.5;
    nf_error err;
    double *p2 = calloc(V, sizeof *p2), *p3 = calloc(V, sizeof *p3);
    float *rows = malloc(3 * V * sizeof(float));
    long *c2 = calloc(V, sizeof *c2), *c3 = calloc(V, sizeof *c3);
    nf_spec_mtp m;
    /* the prompt through the MTP machinery: the block's keys for 0 .. P - 2, h_{P-1} kept in the engine */
    nf_engine_reset(e);
    CHECK(nf_spec_mtp_init(&m, e, 2, &err) == NF_OK && nf_spec_mtp_prefill(&m, prompt, P, &err) == NF_OK);
    CHECK(nf_spec_mtp_finish(&m, &err) == NF_OK && e->mtp_hidden_pos == P);
    nf_spec_mtp_free(&m);
    CHECK(e->ops->slot_copy(e->state, 1, 0, &err) == NF_OK);
    int32_t seq[CTX];
    memcpy(seq, prompt, P * sizeof *seq);
    seq[P] = (int32_t)nf_spec_argmax(e->logits, V);
    restore(e, P);
    CHECK(nf_engine_decode(e, seq[P], &err) == NF_OK);
    add_softmax(e->logits, V, temp, 1, p2);
    for (uint32_t x = 0; x < V; x++) {
        const int32_t two[2] = {seq[P], (int32_t)x};
        restore(e, P);
        CHECK(nf_engine_prefill(e, two, 2, NULL, &err) == NF_OK);
        add_softmax(e->logits, V, temp, p2[x], p3);
    }
    long accepted = 0, drafted = 0;
    for (int t = 0; t < QTRIALS; t++) {
        nf_sampler_params sp = {.temp = (float)temp, .top_p = 1, .repeat_penalty = 1, .seed = (uint64_t)t + 1};
        nf_sampler *s;
        if (nf_sampler_create(&sp, V, &s, NULL)) break;
        restore(e, P);
        e->mtp_hidden_pos = P; /* drafting starts from the kept h_{P-1} */
        int32_t out[3];
        size_t n_out, nd = 0;
        int ok = nf_spec_mtp_init(&m, e, 2, &err) == NF_OK;
        ok = ok && nf_spec_mtp_draft_q(&m, s, seq, P + 1, 2, &nd, &err) == NF_OK && nd == 2 && m.n_q == 2;
        ok = ok && nf_spec_mtp_verify(&m, s, seq, P + 3, 2, rows, out, &n_out, &err) == NF_OK;
        drafted += 2, accepted += ok ? (long)n_out - 1 : 0;
        if (ok && n_out == 1) { /* the second draft never ran: one more step of one draft after x2 */
            seq[P + 1] = out[0];
            ok = nf_spec_mtp_draft_q(&m, s, seq, P + 2, 1, &nd, &err) == NF_OK && nd == 1;
            ok = ok && nf_spec_mtp_verify(&m, s, seq, P + 3, 1, rows, out + 1, &n_out, &err) == NF_OK;
            drafted += 1, accepted += ok ? (long)n_out - 1 : 0;
        }
        CHECK_MSG(ok, "trial %d: drafting or verification failed", t);
        nf_spec_mtp_free(&m);
        nf_sampler_free(s);
        if (!ok) break;
        c2[out[0]]++, c3[out[1]]++;
    }
    double *ex2 = malloc(V * sizeof *ex2), *ex3 = malloc(V * sizeof *ex3);
    for (uint32_t x = 0; x < V; x++) ex2[x] = QTRIALS * p2[x], ex3[x] = QTRIALS * p3[x];
    int df2, df3;
    const double chi2 = pooled_chi2(c2, ex2, (int)V, &df2), chi3 = pooled_chi2(c3, ex3, (int)V, &df3);
    printf("sampled MTP drafts against their q (full vocabulary): second token chi-square %.1f over %d degrees of "
           "freedom, third %.1f over %d; %ld of %ld drafts accepted\n", chi2, df2, chi3, df3, accepted, drafted);
    /* < 1.3 df + 35: p about 1e-5 for these df (200 .. 255; Wilson-Hilferty) under a correct rule */
    CHECK_MSG(chi2 < 1.3 * df2 + 35 && chi3 < 1.3 * df3 + 35, "sampling with the block's drafts: chi-square %.1f / "
              "%d, %.1f / %d", chi2, df2, chi3, df3);
    CHECK_MSG(accepted > drafted / 10 && accepted < drafted - drafted / 10, "%ld of %ld drafts accepted: both "
              "branches must be exercised", accepted, drafted);
    free(p2), free(p3), free(rows), free(c2), free(c3), free(ex2), free(ex3);
}

static void speculation(const char *tmp, const char *name, const char *recipe)
{
    char dir[1024], out[1200];
    nf_npy pr;
    if (!load_npy(name, "ref_prompt.npy", &pr)) return;
    int32_t prompt[64];
    for (size_t i = 0; i < 64; i++) prompt[i] = (int32_t)nf_npy_get_f64(&pr, i);
    nf_npy_free(&pr);
    snprintf(dir, sizeof dir, "%s/fixtures/models/%s", NF_TEST_DATA, name);
    snprintf(out, sizeof out, "%s/%s-spec-%s.nf", tmp, name, recipe);
    nf_model *m;
    nf_engine *e;
    nf_error err;
    char what[96];
    snprintf(what, sizeof what, "%s %s", name, recipe);
    if (!fx_convert(dir, recipe, out) || nf_model_load(out, &m, &err)) return;
    /* the CPU default, int8 activations for q8_0 weights: a verification's short segments run token by
     * token (backend/cpu/cpu.h NF_CPU_STEP_MAX), so they give decoding's bits; before that the f32 tile
     * of the bf16 products (ssm_ba, the fixture's down projections) rounded otherwise and an int8 step
     * downstream tipped a near tie after ~24 tokens */
    nf_engine_opts o = {.mtp = 1, .threads = 2, .ctx = CTX, .chunk = 16, .max_seqs = 2}; /* slot 1: sampled()'s copy */
    if (!nf_engine_create(m, &o, &e, &err)) {
        machinery(e, prompt, 40, what);
        generation(e, prompt, what);
        if (!strcmp(name, "qwen3_next") && !strcmp(recipe, "bf16")) sampled(e, prompt, 40), sampled_q(e, prompt, 40);
        nf_engine_free(e);
    }
    /* without nf_engine_opts.mtp the block is not loaded: every way in refuses it, naming the option */
    o.mtp = 0;
    if (!nf_engine_create(m, &o, &e, &err)) {
        float h[1024] = {0}, l[1024];
        int32_t t = 1;
        CHECK(!nf_engine_has_mtp(e));
        CHECK(nf_spec_check(e, NF_SPEC_MODE_MTP, 2, &err) == NF_ERR_UNSUPPORTED);
        CHECK_CONTAINS(err.msg, "nf_engine_opts.mtp");
        CHECK(m->cfg.hidden <= 1024 && nf_engine_mtp(e, &t, h, 1, 0, 1, l, NULL, &err) == NF_ERR_UNSUPPORTED);
        CHECK_CONTAINS(err.msg, "nf_engine_opts.mtp");
        CHECK(e->ops->hidden(e->state, h, &err) == NF_ERR_UNSUPPORTED);
        nf_sched *s = NULL;
        uint64_t id;
        nf_seq_params p = {.sampling = nf_sampler_defaults(), .max_new = 4, .spec_k = 2, .spec_mtp = 1};
        CHECK(nf_sched_create_engine(e, NULL, &s, &err) == NF_OK);
        CHECK(s && nf_sched_add(s, prompt, 8, &p, &id, &err) == NF_ERR_UNSUPPORTED);
        CHECK_CONTAINS(err.msg, "nf_engine_opts.mtp");
        nf_sched_free(s);
        nf_engine_free(e);
    }
    nf_model_free(m);
    remove(out);
}

int main(void)
{
    char tmp[] = "/tmp/nf_mtp_XXXXXX";
    if (!mkdtemp(tmp)) return 1;
    against_torch(tmp, "qwen3_next", NULL);
    against_torch(tmp, "qwen3_5_moe_text", "qwen3_5_moe");
    refusals(tmp);
    const char *recipes[] = {"bf16", "q8q8"};
    for (int r = 0; r < 2; r++) {
        speculation(tmp, "qwen3_next", recipes[r]);
        speculation(tmp, "qwen3_5_moe_text", recipes[r]);
    }
    rmdir(tmp);
    return nf_test_report();
}

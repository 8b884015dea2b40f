/* The CPU backend's state slots on a Gated DeltaNet hybrid (the tiny qwen3_next fixture, bf16 and
 * q8q8):
 *   - batched == alone, bit for bit: three sequences fed in ragged pieces (prefill chunks and decode
 *     tokens mixed, one absent from a step) through slots 2, 0, 1 and interleaved page tables give,
 *     piece by piece, the last-token logits of the same pieces run alone through slot 0 of another
 *     engine. Why memcmp and not a tolerance: the conv and the delta rule run per (sequence, head)
 *     on that sequence's own slot, and everything else is test_batch's argument;
 *   - the slot contract: a batch without slots, a slot out of range, two sequences in one slot, a
 *     sequence continuing at a position its slot does not hold: refused with the reason, and a
 *     refused batch leaves every slot as it was (continuing correctly afterwards gives the logits of
 *     a run that never saw the refusal);
 *   - the session: nf_engine_truncate keeps nothing of a hybrid (its state cannot rewind);
 *   - the chunked form (nf_engine_opts.gdn_chunk 16, engine chunks of 48: pieces of 48, 48, 34 tokens
 *     cut into GDN chunks of 16 with ragged ends) over the 130-token prompt: every position's logits
 *     within rel-L2 1e-4 of transformers' (test_oracle_tiny's bound for the recurrent form) and 1e-5 of
 *     the recurrent form's (test_gdn measures the op's two forms 3e-7 apart). */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <unistd.h>

#include "engine/generate.h"
#include "engine/npy.h"
#include "nf_test.h"
#include "common/engine_fixture.h"

enum { S = 3, STEPS = 5, PT = 8, CTX = 64, NPS = CTX / PT };

static const uint32_t plan[S][STEPS] = {{7, 1, 1, 5, 1}, {1, 9, 0, 1, 2}, {13, 1, 3, 1, 1}};

static int32_t token_of(uint32_t seq, uint32_t pos, uint32_t V) { return (int32_t)((seq * 31 + pos * 17 + 5) % V); }

static nf_engine *engine(const nf_model *m, uint32_t max_seqs)
{
    nf_engine_opts o = {.threads = 2, .ctx = CTX, .chunk = 32, .page_tokens = PT, .max_seqs = max_seqs,
                        .kv_pages = max_seqs * NPS};
    nf_engine *e = NULL;
    nf_error err;
    if (nf_engine_create(m, &o, &e, &err)) CHECK_MSG(0, "%s", err.msg);
    return e;
}

/* One sequence's piece alone: slot 0, pages 0 .. NPS-1 of its own engine. */
static nf_status alone(nf_engine *e, const int32_t *toks, uint32_t pos0, uint32_t n, float *logits, nf_error *err)
{
    const uint32_t ss[2] = {0, n}, slot = 0;
    const nf_batch b = {.n_tokens = n, .n_seqs = 1, .tokens = toks, .seq_start = ss, .pos0 = &pos0,
                        .pages = e->pages, .page_stride = NPS, .state_slot = &slot};
    return e->ops->forward(e->state, &b, logits, err);
}

static void batched_vs_alone(const nf_model *m, const char *what)
{
    const uint32_t V = m->cfg.vocab, slots_of[S] = {2, 0, 1};
    nf_engine *eb = engine(m, S), *ea[S] = {engine(m, 1), engine(m, 1), engine(m, 1)}; /* one alone run each */
    float *lb = malloc((size_t)S * V * sizeof(float)), *la = malloc((size_t)V * sizeof(float));
    uint32_t pages[S * NPS], pos[S] = {0}, differ = 0;
    for (uint32_t i = 0; i < S; i++)
        for (uint32_t p = 0; p < NPS; p++) pages[i * NPS + p] = p * S + i; /* interleaved */
    for (uint32_t step = 0; eb && ea[0] && ea[1] && ea[2] && step < STEPS; step++) {
        int32_t toks[64];
        uint32_t ss[S + 1] = {0}, p0[S], sl[S], pg[S * NPS], n = 0, k = 0, who[S];
        for (uint32_t i = 0; i < S; i++) {
            if (!plan[i][step]) continue;
            for (uint32_t j = 0; j < plan[i][step]; j++) toks[n + j] = token_of(i, pos[i] + j, V);
            memcpy(pg + k * NPS, pages + i * NPS, sizeof(uint32_t) * NPS);
            p0[k] = pos[i], sl[k] = slots_of[i], who[k] = i;
            n += plan[i][step];
            ss[++k] = n;
        }
        const nf_batch b = {.n_tokens = n, .n_seqs = k, .tokens = toks, .seq_start = ss, .pos0 = p0, .pages = pg,
                            .page_stride = NPS, .state_slot = sl};
        nf_error err;
        CHECK_MSG(eb->ops->forward(eb->state, &b, lb, &err) == NF_OK, "%s", err.msg);
        for (uint32_t q = 0; q < k; q++) {
            const uint32_t i = who[q];
            CHECK(alone(ea[i], toks + ss[q], pos[i], plan[i][step], la, &err) == NF_OK);
            differ += memcmp(la, lb + (size_t)q * V, V * sizeof(float)) != 0;
        }
        for (uint32_t i = 0; i < S; i++) pos[i] += plan[i][step];
    }
    CHECK_MSG(differ == 0, "%s: %u pieces differ from their runs alone", what, differ);
    printf("%s: batched == alone over %d steps (%u pieces differ)\n", what, STEPS, differ);
    free(lb);
    free(la);
    nf_engine_free(eb);
    for (uint32_t i = 0; i < S; i++) nf_engine_free(ea[i]);
}

static void slot_contract(const nf_model *m)
{
    const uint32_t V = m->cfg.vocab;
    nf_engine *e = engine(m, 2), *ref = engine(m, 2);
    if (!e || !ref) goto out;
    float *l = malloc((size_t)2 * V * sizeof(float)), *lr = malloc((size_t)2 * V * sizeof(float));
    int32_t toks[8];
    for (int j = 0; j < 8; j++) toks[j] = token_of(1, (uint32_t)j, V);
    uint32_t ss[3] = {0, 4, 8}, p0[2] = {0, 0}, sl[2] = {0, 1}, pages[2 * NPS];
    for (uint32_t p = 0; p < 2 * NPS; p++) pages[p] = p;
    nf_batch b = {.n_tokens = 8, .n_seqs = 2, .tokens = toks, .seq_start = ss, .pos0 = p0, .pages = pages,
                  .page_stride = NPS, .state_slot = sl};
    nf_error err;
    CHECK(e->ops->forward(e->state, &b, l, &err) == NF_OK);
    CHECK(ref->ops->forward(ref->state, &b, lr, &err) == NF_OK);
    /* refusals: no slots, out of range, shared, a position the slot does not hold */
    b.state_slot = NULL;
    CHECK(e->ops->forward(e->state, &b, l, &err) == NF_ERR_INVALID_ARG);
    CHECK_CONTAINS(err.msg, "needs state slots");
    b.state_slot = sl;
    p0[0] = p0[1] = 4;
    sl[1] = 2;
    CHECK(e->ops->forward(e->state, &b, l, &err) == NF_ERR_INVALID_ARG);
    CHECK_CONTAINS(err.msg, "state slot 2 is not below max_seqs 2");
    sl[1] = 0;
    CHECK(e->ops->forward(e->state, &b, l, &err) == NF_ERR_INVALID_ARG);
    CHECK_CONTAINS(err.msg, "share state slot 0");
    sl[1] = 1;
    p0[1] = 5;
    CHECK(e->ops->forward(e->state, &b, l, &err) == NF_ERR_INVALID_ARG);
    CHECK_CONTAINS(err.msg, "its state slot 1 holds 4 positions");
    /* the refused batches changed nothing: continuing matches the engine that never saw them */
    p0[1] = 4;
    CHECK(e->ops->forward(e->state, &b, l, &err) == NF_OK);
    CHECK(ref->ops->forward(ref->state, &b, lr, &err) == NF_OK);
    CHECK(memcmp(l, lr, (size_t)2 * V * sizeof(float)) == 0);
    free(l);
    free(lr);
    /* the session: truncation keeps nothing of a hybrid */
    CHECK(nf_engine_prefill(e, toks, 6, NULL, &err) == NF_OK);
    nf_engine_truncate(e, 3);
    CHECK_EQ_INT(e->n_past, 0);
out:
    nf_engine_free(e);
    nf_engine_free(ref);
}

static void chunked_form(const nf_model *m)
{
    char path[1100];
    nf_npy pr, lr;
    nf_error err;
    snprintf(path, sizeof path, "%s/fixtures/models/qwen3_next/ref_prompt.npy", NF_TEST_DATA);
    if (nf_npy_read(path, &pr, &err)) {
        CHECK_MSG(0, "%s", err.msg);
        return;
    }
    snprintf(path, sizeof path, "%s/fixtures/models/qwen3_next/ref_logits.npy", NF_TEST_DATA);
    if (nf_npy_read(path, &lr, &err)) {
        CHECK_MSG(0, "%s", err.msg);
        nf_npy_free(&pr);
        return;
    }
    const size_t P = pr.count, V = m->cfg.vocab;
    int32_t *ids = malloc(P * sizeof *ids);
    float *rec = malloc(P * V * sizeof(float)), *chk = malloc(P * V * sizeof(float));
    for (size_t i = 0; i < P; i++) ids[i] = (int32_t)nf_npy_get_f64(&pr, i);
    for (int form = 0; form < 2; form++) {
        nf_engine_opts o = {.threads = 2, .ctx = 256, .chunk = 48, .gdn_chunk = form ? 16 : 0};
        nf_engine *e;
        if (nf_engine_create(m, &o, &e, &err)) {
            CHECK_MSG(0, "%s", err.msg);
            continue;
        }
        CHECK(nf_engine_prefill(e, ids, P, form ? chk : rec, &err) == NF_OK);
        nf_engine_free(e);
    }
    const double wt = fx_worst_rows(chk, lr.data, P, V), wr = fx_worst_rows(chk, rec, P, V);
    printf("chunked GDN form (16): vs transformers %.2e, vs the recurrent form %.2e (worst position)\n", wt, wr);
    CHECK_MSG(wt <= 1e-4, "chunked form vs transformers rel-L2 %.3g > 1e-4", wt);
    CHECK_MSG(wr <= 1e-5, "chunked form vs recurrent rel-L2 %.3g > 1e-5", wr);
    free(ids), free(rec), free(chk);
    nf_npy_free(&pr), nf_npy_free(&lr);
}

int main(void)
{
    char tmp[] = "/tmp/nf_hybrid_XXXXXX";
    if (!mkdtemp(tmp)) return 1;
    char dir[1024], out[1200];
    snprintf(dir, sizeof dir, "%s/fixtures/models/qwen3_next", NF_TEST_DATA);
    const char *recipes[] = {"bf16", "q8q8"};
    for (int k = 0; k < 2; k++) {
        snprintf(out, sizeof out, "%s/next-%s.nf", tmp, recipes[k]);
        nf_model *m;
        nf_error err;
        if (!fx_convert(dir, recipes[k], out)) continue;
        if (nf_model_load(out, &m, &err)) {
            CHECK_MSG(0, "%s", err.msg);
            continue;
        }
        batched_vs_alone(m, recipes[k]);
        if (k == 0) slot_contract(m);
        if (k == 0) chunked_form(m);
        nf_model_free(m);
        remove(out);
    }
    rmdir(tmp);
    return nf_test_report();
}

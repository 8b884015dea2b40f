/* The CPU backend's state slots on a Gated DeltaNet hybrid (the tiny qwen3_next fixture, bf16 and
 * q8q8):
 *   - batched == alone, bit for bit (tests/common/hybrid_slots.h's plan: three sequences in ragged
 *     pieces through slots 2, 0, 1 and interleaved page tables against each piece alone through slot
 *     0 of another engine). Why memcmp and not a tolerance: the conv and the delta rule run per
 *     (sequence, head) on that sequence's own slot, and everything else is test_batch's argument;
 *   - the slot contract (hybrid_slots.h): refusals with the reason, a refused batch changes nothing;
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

#include "common/hybrid_slots.h"

/* Bit for bit: the conv and the delta rule run per (sequence, head) on that sequence's own slot, and
 * everything else is test_batch's argument. */
static void batched_vs_alone(const nf_model *m, const char *what)
{
    const size_t V = m->cfg.vocab;
    float *lb = malloc(HYB_PIECES * V * sizeof(float)), *la = malloc(HYB_PIECES * V * sizeof(float));
    uint32_t who[HYB_PIECES], step[HYB_PIECES], differ = 0;
    const size_t n = lb && la ? hyb_batched_vs_alone(m, "cpu", 0, 0, lb, la, who, step) : 0;
    CHECK_MSG(n > 0, "%s: the batched run failed", what);
    for (size_t p = 0; p < n; p++) {
        const int d = memcmp(la + p * V, lb + p * V, V * sizeof(float)) != 0;
        if (d && !differ) printf("  first difference: sequence %u at step %u\n", who[p], step[p]);
        differ += d;
    }
    CHECK_MSG(differ == 0, "%s: %u pieces differ from their runs alone", what, differ);
    printf("%s: batched == alone over %d steps (%u of %zu pieces differ)\n", what, HYB_STEPS, differ, n);
    free(lb);
    free(la);
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
        if (k == 0) hyb_slot_contract(m, "cpu");
        hyb_prefix_cache(m, recipes[k], "cpu");
        if (k == 0) chunked_form(m);
        nf_model_free(m);
        remove(out);
    }
    rmdir(tmp);
    return nf_test_report();
}

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
 *   - the multimodal qwen3_5_moe folder (the same weights, mtp.* at top level) converts to the same MTP
 *     logits, bit for bit;
 *   - refusals: a model without mtp.* (qwen3_moe) has no MTP block, and nf_engine_mtp says so.
 * q8q8: the fast path against the reference path within 1e-4 (the quantized block is not close to the
 * bf16 oracle, for the reason docs/engine.md gives for the tiny models). */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <unistd.h>

#include "engine/npy.h"
#include "nf_test.h"
#include "common/engine_fixture.h"

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
    nf_engine_opts o = {.threads = 2, .ctx = 256, .chunk = 48, .reference = reference};
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
    if (nf_engine_mtp(e, tok, hid, P, 0, rows, hout, &err)) {
        CHECK_MSG(0, "%s", err.msg);
        goto out;
    }
    for (size_t k = 0; k < 2; k++) { /* chained: position P + k takes the last step's hidden and argmax */
        const size_t p = P + k;
        tok[p] = chain_tok[k] = (int32_t)fx_argmax(rows + (p - 1) * V, V);
        if (nf_engine_mtp(e, tok + p, hout + (p - 1) * H, 1, (uint32_t)p, rows + p * V, hout + p * H, &err)) {
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
    nf_engine_opts o = {.threads = 2, .ctx = 64};
    if (!nf_engine_create(m, &o, &e, &err)) {
        float h[1024] = {0}, l[1024];
        int32_t t = 1;
        CHECK(nf_engine_mtp(e, &t, h, 1, 0, l, NULL, &err) == NF_ERR_UNSUPPORTED);
        CHECK_CONTAINS(err.msg, "no MTP block");
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
    rmdir(tmp);
    return nf_test_report();
}

/* One greedy nf_generate case of the MTP tests (include after nf_test.h): two turns on a fresh session,
 * prompt[0, 40) then prompt[40, 47), GEN_MAX tokens each at most, mtp:K (0: no speculation), ending at
 * eos when n_eos; the fed tokens into *r. Failures count as CHECKs of the including test. */
#ifndef NF_TESTS_MTP_GENERATE_H
#define NF_TESTS_MTP_GENERATE_H

#include "engine/generate.h"
#include "engine/spec.h"

static inline void fx_mtp_emit(void *ctx, const char *t, size_t len) { (void)ctx, (void)t, (void)len; }

/* Returns how the first turn ended; adds the turns' drafts and accepted drafts to *drafted, *accepted. */
static inline nf_gen_end fx_mtp_generate(nf_engine *e, const nf_tokenizer *tok, const int32_t *prompt, size_t gen_max,
                                         uint32_t K, const int32_t *eos, size_t n_eos, nf_tok_ids *r, size_t *drafted,
                                         size_t *accepted, const char *what)
{
    nf_gen_stats st[2] = {{0}};
    nf_sampler_params sp = {.temp = 0, .top_p = 1, .repeat_penalty = 1, .repeat_last_n = 64};
    nf_sampler *s;
    nf_error err;
    r->n = 0;
    nf_engine_reset(e);
    if (nf_sampler_create(&sp, e->model->cfg.vocab, &s, NULL)) {
        CHECK_MSG(0, "%s: no sampler", what);
        return NF_GEN_LENGTH;
    }
    nf_gen_params gp = {.max_new = gen_max, .spec_k = K, .spec_mtp = 1, .eos = eos, .n_eos = n_eos};
    for (int turn = 0; turn < 2; turn++) {
        CHECK_MSG(nf_generate(e, tok, s, prompt + turn * 40, turn ? 7 : 40, &gp, fx_mtp_emit, NULL, r, &st[turn], &err) ==
                      NF_OK, "%s mtp:%u: %s", what, K, err.msg);
        *accepted += st[turn].accepted, *drafted += st[turn].drafted;
    }
    CHECK(e->n_past == r->n);
    nf_sampler_free(s);
    return st[0].end;
}

#endif

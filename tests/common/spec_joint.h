/* The reference the sampled-speculation tests share (tests/engine/test_spec.c, test_sched_spec.c): a
 * prompt on which prompt lookup drafts likely tokens, and the model's joint distribution of the next
 * three sampled tokens from plain forwards. Include after nf_test.h and common/engine_fixture.h. */
#pragma once

#include "common/spec_stats.h"
#include "engine/generate.h"

enum { SPEC_TK = 3 }; /* top-k of the sampler, and cells per token */

/* Every id of a 256-token vocabulary once, then the model's own greedy continuation until it has gone
 * round a loop (its last two tokens occurred before in it), so that prompt lookup's drafts are often
 * the likely tokens: prompt[pmax]; returns its length. */
static inline uint32_t spec_loop_prompt(nf_engine *e, int32_t *prompt, uint32_t pmax)
{
    for (int i = 0; i < 256; i++) prompt[i] = (i * 97) % 256;
    nf_engine_reset(e);
    CHECK(nf_engine_prefill(e, prompt, 256, NULL, NULL) == NF_OK);
    uint32_t n = 256;
    for (int looped = 0; !looped && n < pmax; n++) {
        prompt[n] = (int32_t)fx_argmax(e->logits, e->model->cfg.vocab);
        CHECK(nf_engine_decode(e, prompt[n], NULL) == NF_OK);
        for (uint32_t j = 257; j < n; j++) looped |= prompt[j - 1] == prompt[n - 1] && prompt[j] == prompt[n];
    }
    return n;
}

/* The model's joint distribution of the first three sampled tokens after prompt (top-k SPEC_TK at
 * temp), from plain forwards: cells [TK][TK][TK] of ids and probabilities. */
static inline void spec_joint_reference(nf_engine *e, const int32_t *prompt, uint32_t plen, double temp,
                                        int32_t ids[SPEC_TK][SPEC_TK][SPEC_TK][3], double p[SPEC_TK][SPEC_TK][SPEC_TK])
{
    const uint32_t V = e->model->cfg.vocab;
    int32_t i1[SPEC_TK], i2[SPEC_TK], i3[SPEC_TK];
    double p1[SPEC_TK], p2[SPEC_TK], p3[SPEC_TK];
    nf_engine_reset(e);
    CHECK(nf_engine_prefill(e, prompt, plen, NULL, NULL) == NF_OK);
    top_probs(e->logits, V, temp, SPEC_TK, i1, p1);
    for (int a = 0; a < SPEC_TK; a++) {
        nf_engine_truncate(e, plen);
        CHECK(nf_engine_decode(e, i1[a], NULL) == NF_OK);
        top_probs(e->logits, V, temp, SPEC_TK, i2, p2);
        for (int b = 0; b < SPEC_TK; b++) {
            nf_engine_truncate(e, plen + 1);
            CHECK(nf_engine_decode(e, i2[b], NULL) == NF_OK);
            top_probs(e->logits, V, temp, SPEC_TK, i3, p3);
            for (int c = 0; c < SPEC_TK; c++) {
                ids[a][b][c][0] = i1[a], ids[a][b][c][1] = i2[b], ids[a][b][c][2] = i3[c];
                p[a][b][c] = p1[a] * p2[b] * p3[c];
            }
        }
    }
}

/* The cell of three tokens (SPEC_TK^3 when outside the top-k cells). */
static inline int spec_cell(int32_t ids[SPEC_TK][SPEC_TK][SPEC_TK][3], const int32_t *got)
{
    int cell = SPEC_TK * SPEC_TK * SPEC_TK;
    for (int c = 0; c < SPEC_TK * SPEC_TK * SPEC_TK; c++)
        if (!memcmp(ids[c / 9][c / 3 % 3][c % 3], got, 3 * sizeof *got)) cell = c;
    return cell;
}

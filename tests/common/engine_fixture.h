/* What the engine tests over the converted fixture models share (include after nf_test.h: the
 * helpers count their failures as CHECKs of the including test). */
#ifndef NF_TESTS_ENGINE_FIXTURE_H
#define NF_TESTS_ENGINE_FIXTURE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "convert/convert.h"
#include "convert/plan.h"
#include "engine/engine.h"
#include "engine/sampler.h"

/* ||a - b|| / ||b|| over n values, in double. */
static inline double fx_rel_l2(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den + 1e-300));
}

/* The index of the largest value, ties to the lower index (greedy decoding's rule). */
static inline size_t fx_argmax(const float *l, size_t n)
{
    size_t b = 0;
    for (size_t i = 1; i < n; i++)
        if (l[i] > l[b]) b = i;
    return b;
}

/* The median fx_rel_l2 of `rows` rows of V values each (rows <= 4096). */
static inline double fx_median_rows(const float *a, const float *b, size_t rows, size_t V)
{
    double d[4096];
    size_t n = rows < 4096 ? rows : 4096;
    for (size_t t = 0; t < n; t++) d[t] = fx_rel_l2(a + t * V, b + t * V, V);
    for (size_t i = 1; i < n; i++) /* insertion sort: a few hundred rows at most */
        for (size_t j = i; j > 0 && d[j - 1] > d[j]; j--) {
            double t = d[j];
            d[j] = d[j - 1], d[j - 1] = t;
        }
    return n ? (n % 2 ? d[n / 2] : 0.5 * (d[n / 2 - 1] + d[n / 2])) : 0;
}

/* The largest fx_rel_l2 of `rows` rows of V values each. */
static inline double fx_worst_rows(const float *a, const float *b, size_t rows, size_t V)
{
    double w = 0;
    for (size_t t = 0; t < rows; t++) w = fmax(w, fx_rel_l2(a + t * V, b + t * V, V));
    return w;
}

/* How fx_run_greedy runs the CPU engine: the fast path (int8 activations into q8_0 / k-quant
 * products, the default), the reference path (dequantize + double dot), or the fast path with f32
 * activations (no_a8). */
enum { FX_FAST = 0, FX_REFERENCE = 1, FX_FAST_F32 = 2 };

/* Loads the artifact at path and runs the CPU engine on it (`reference`: FX_FAST, FX_REFERENCE or
 * FX_FAST_F32; prompt chunks of `chunk`): the prefill logits [P][V] of ids, then G greedy steps
 * (their tokens, and each step's logits [G][V]). Failures count as CHECKs. */
static inline void fx_run_greedy(const char *path, int reference, uint32_t chunk, const int32_t *ids, size_t P,
                                 size_t G, float *pre, int32_t *greedy, float *gl)
{
    nf_model *m;
    nf_engine *eng;
    nf_error e;
    if (nf_model_load(path, &m, &e)) {
        CHECK_MSG(0, "%s", e.msg);
        return;
    }
    const size_t V = m->cfg.vocab;
    nf_engine_opts o = {.threads = 2, .ctx = (uint32_t)(P + G), .chunk = chunk, .reference = reference == FX_REFERENCE,
                        .no_a8 = reference == FX_FAST_F32};
    if (nf_engine_create(m, &o, &eng, &e)) {
        CHECK_MSG(0, "%s", e.msg);
        nf_model_free(m);
        return;
    }
    CHECK(nf_engine_prefill(eng, ids, P, pre, &e) == NF_OK);
    for (size_t g = 0; g < G; g++) {
        memcpy(gl + g * V, eng->logits, V * sizeof(float));
        greedy[g] = (int32_t)fx_argmax(eng->logits, V);
        if (g + 1 < G) CHECK(nf_engine_decode(eng, greedy[g], &e) == NF_OK);
    }
    nf_engine_free(eng);
    nf_model_free(m);
}

/* One sequence alone in the engine's session (the scheduler tests' oracle): prompt[n] prefilled, then
 * gen tokens into out[gen], each picked by its own sampler (sp, its seed) and fed by a plain decode. */
static inline void fx_alone(nf_engine *e, const int32_t *prompt, size_t n, const nf_sampler_params *sp, size_t gen,
                            int32_t *out)
{
    nf_sampler *s;
    int32_t *hist = malloc((n + gen) * sizeof *hist);
    nf_engine_reset(e);
    if (!hist || nf_sampler_create(sp, e->model->cfg.vocab, &s, NULL)) {
        CHECK_MSG(0, "fx_alone: out of memory or a bad sampler");
        free(hist);
        return;
    }
    memcpy(hist, prompt, n * sizeof *hist);
    nf_error err;
    CHECK_MSG(nf_engine_prefill(e, hist, n, NULL, &err) == NF_OK, "%s", err.msg);
    for (size_t g = 0; g < gen; g++) {
        CHECK(nf_engine_next(e, s, hist, n, &out[g], &err) == NF_OK);
        hist[n++] = out[g];
        if (g + 1 < gen) CHECK(nf_engine_decode(e, out[g], &err) == NF_OK);
    }
    nf_sampler_free(s);
    free(hist);
}

/* Converts a source (HF dir) with a recipe to out; 1 on success, else a failed CHECK. */
static inline int fx_convert(const char *src, const char *recipe, const char *out)
{
    nf_convert_opts o = {.recipe = recipe, .threads = 2, .quiet = 1};
    nf_plan p;
    nf_error e;
    if (nf_plan_build(src, &o, &p, &e)) {
        CHECK_MSG(0, "plan %s (%s): %s", src, recipe ? recipe : "the source's codecs", e.msg);
        return 0;
    }
    nf_status st = nf_convert_run(&p, out, &o, NULL, &e);
    nf_plan_free(&p);
    CHECK_MSG(st == NF_OK, "convert %s (%s): %s", src, recipe ? recipe : "the source's codecs", e.msg);
    return st == NF_OK;
}

#endif

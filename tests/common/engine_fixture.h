/* What the engine tests over the converted fixture models share (include after nf_test.h: the
 * helpers count their failures as CHECKs of the including test). */
#ifndef NF_TESTS_ENGINE_FIXTURE_H
#define NF_TESTS_ENGINE_FIXTURE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "convert/convert.h"
#include "convert/plan.h"

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

/* Converts a source (HF dir) with a recipe to out; 1 on success, else a failed CHECK. */
static inline int fx_convert(const char *src, const char *recipe, const char *out)
{
    nf_convert_opts o = {.recipe = recipe, .threads = 2, .quiet = 1};
    nf_plan p;
    nf_error e;
    if (nf_plan_build(src, &o, &p, &e)) {
        CHECK_MSG(0, "plan %s (%s): %s", src, recipe, e.msg);
        return 0;
    }
    nf_status st = nf_convert_run(&p, out, &o, NULL, &e);
    nf_plan_free(&p);
    CHECK_MSG(st == NF_OK, "convert %s (%s): %s", src, recipe, e.msg);
    return st == NF_OK;
}

#endif

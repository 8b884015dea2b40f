/* Prompt-lookup drafting and draft verification (see spec.h). */
#include "engine/spec.h"

#include <stdlib.h>
#include <string.h>

#include "engine/generate.h"

nf_status nf_spec_check(const nf_engine *e, uint32_t k, nf_error *err)
{
    if (k < 1 || k > NF_SPEC_MAX_K)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "speculation: %u drafts per step, the range is 1 .. %d", k,
                            NF_SPEC_MAX_K);
    if (e->model->cfg.n_linear)
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "speculation: this model has Gated DeltaNet (linear attention) "
                            "layers, whose recurrent state cannot be rolled back past rejected drafts yet; run "
                            "without --spec");
    return NF_OK;
}

nf_status nf_spec_parse(const char *spec, uint32_t *k, nf_error *err)
{
    char *end = NULL;
    const long v = strncmp(spec, "ngram:", 6) == 0 ? strtol(spec + 6, &end, 10) : 0;
    if (!end || end == spec + 6 || *end || v < 1 || v > NF_SPEC_MAX_K)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "--spec '%s': expected ngram:K with K in 1 .. %d", spec,
                            NF_SPEC_MAX_K);
    *k = (uint32_t)v;
    return NF_OK;
}

size_t nf_spec_draft(const int32_t *seq, size_t n, size_t k, int32_t *draft)
{
    if (n < NF_SPEC_NGRAM_MIN + 1) return 0;
    for (size_t m = n - 1 < NF_SPEC_NGRAM ? n - 1 : NF_SPEC_NGRAM; m >= NF_SPEC_NGRAM_MIN; m--) {
        /* the latest start j whose m tokens end before the suffix's last one, so one token follows */
        for (size_t j = n - m; j-- > 0;) {
            if (memcmp(seq + j, seq + n - m, m * sizeof *seq)) continue;
            const size_t avail = n - (j + m), take = avail < k ? avail : k;
            memcpy(draft, seq + j + m, take * sizeof *seq);
            return take;
        }
    }
    return 0;
}

nf_status nf_spec_verify(nf_engine *e, nf_sampler *s, const int32_t *tokens, size_t n, size_t n_draft, float *rows,
                         int32_t *out, size_t *n_out, nf_error *err)
{
    if (n_draft > NF_SPEC_MAX_K || n <= n_draft)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "speculation: %zu drafts in a sequence of %zu tokens", n_draft, n);
    nf_status st = nf_spec_check(e, (uint32_t)n_draft, err); /* also refuses a hybrid, which could not roll back */
    if (st) return st;
    const size_t V = e->model->cfg.vocab, first = n - n_draft - 1; /* tokens[first]: the last accepted token */
    st = nf_engine_prefill(e, tokens + first, n_draft + 1, rows, err);
    if (st) return st;
    size_t acc = 0;
    int32_t id;
    /* row i holds the logits after tokens[0 .. first + i], the distribution draft i must pass */
    while (acc < n_draft && nf_sampler_verify(s, rows + acc * V, tokens, first + 1 + acc, tokens[first + 1 + acc], &id))
        out[acc++] = id;
    if (acc == n_draft) id = nf_sampler_sample(s, rows + acc * V, tokens, n);
    out[acc] = id;
    *n_out = acc + 1;
    nf_engine_truncate(e, e->n_past - (uint32_t)(n_draft - acc));
    memcpy(e->logits, rows + acc * V, V * sizeof(float));
    return NF_OK;
}

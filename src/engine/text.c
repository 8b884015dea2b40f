/* The tokenizer of a .nf artifact (tokenizer.* keys) through the format-neutral nf_tok_desc. */
#include "engine/text.h"

#include <stdlib.h>
#include <string.h>

static int32_t opt_id(const nf_artifact *a, const char *key)
{
    int64_t v;
    if (!nf_artifact_find_meta(a, key) || nf_artifact_get_int(a, key, &v, NULL) || v < 0 || v > INT32_MAX) return -1;
    return (int32_t)v;
}

nf_status nf_text_tokenizer(const nf_artifact *a, nf_tokenizer **out, nf_error *err)
{
    *out = NULL;
    const char *path = nf_artifact_path(a);
    if (!nf_artifact_find_meta(a, "tokenizer.tokens"))
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "%s has no tokenizer (no tokenizer.tokens metadata): give token ids "
                            "(ninfer eval --tokens) instead of text", path);
    const char *model = "gpt2";
    if (nf_artifact_find_meta(a, "tokenizer.model") && nf_artifact_get_str(a, "tokenizer.model", &model, NULL, err))
        return nf_error_prefix(err, "tokenizer");
    if (strcmp(model, "gpt2") != 0)
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "%s: tokenizer.model '%s' is not supported (only gpt2 byte-level BPE)",
                            path, model);
    nf_tok_desc d = nf_tok_desc_empty();
    d.source = path;
    const char *const *tokens, *const *merges = NULL;
    size_t n_tok, n_merges = 0, n_types = 0;
    const int32_t *types = NULL;
    nf_status st = nf_artifact_get_str_array(a, "tokenizer.tokens", &tokens, NULL, &n_tok, err);
    if (!st && nf_artifact_find_meta(a, "tokenizer.merges"))
        st = nf_artifact_get_str_array(a, "tokenizer.merges", &merges, NULL, &n_merges, err);
    if (!st && nf_artifact_find_meta(a, "tokenizer.token_type"))
        st = nf_artifact_get_i32_array(a, "tokenizer.token_type", &types, &n_types, err);
    if (!st && types && n_types != n_tok)
        st = nf_error_set(err, NF_ERR_FORMAT, "%s: tokenizer.token_type has %zu entries, tokenizer.tokens %zu", path,
                          n_types, n_tok);
    if (!st && nf_artifact_find_meta(a, "tokenizer.pre")) st = nf_artifact_get_str(a, "tokenizer.pre", &d.pre, NULL, err);
    if (!st && nf_artifact_find_meta(a, "tokenizer.add_bos")) st = nf_artifact_get_bool(a, "tokenizer.add_bos", &d.add_bos, err);
    if (!st && nf_artifact_find_meta(a, "tokenizer.chat_template"))
        st = nf_artifact_get_str(a, "tokenizer.chat_template", &d.chat_template, NULL, err);
    if (st) return st;
    d.n_vocab = (uint32_t)n_tok;
    d.tokens = tokens;
    d.types = types;
    d.merges = merges;
    d.n_merges = (uint32_t)n_merges;
    if (!d.pre) d.pre = "gpt2";
    d.bos_id = opt_id(a, "tokenizer.bos_id");
    d.eos_id = opt_id(a, "tokenizer.eos_id");
    d.pad_id = opt_id(a, "tokenizer.pad_id");
    return nf_tok_create(&d, out, err);
}

void nf_text_eos_ids(const nf_artifact *a, const int32_t **ids, size_t *n, int32_t *one)
{
    *n = 0;
    *ids = NULL;
    if (nf_artifact_find_meta(a, "tokenizer.eos_ids") && !nf_artifact_get_i32_array(a, "tokenizer.eos_ids", ids, n, NULL))
        return;
    *one = opt_id(a, "tokenizer.eos_id");
    if (*one >= 0) {
        *ids = one;
        *n = 1;
    }
}

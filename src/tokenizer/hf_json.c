/* HF tokenizer.json (+ tokenizer_config.json) -> nf_tok_desc -> nf_tokenizer. Only byte-level BPE
 * is accepted; anything else is refused naming the JSON field, never guessed. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mapfile.h"
#include "tokenizer/tok_internal.h"

typedef struct hf_build {
    const char *src;
    char **tokens;          /* [n] borrowed from the cJSON tree */
    int32_t *types;         /* [n] */
    uint8_t *normalized;    /* [n] */
    uint32_t n;
    const char **merge_pairs; /* [2*n_merges] */
    uint32_t n_merges;
    const char *regex[NF_TOK_MAX_STAGES];
    uint32_t n_regex;
    nf_error *err;
} hf_build;

static nf_status bad(hf_build *b, nf_status code, const char *field, const char *expected)
{
    return nf_error_set(b->err, code, "%s: %s: %s", b->src, field, expected);
}

static const char *str_field(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int true_field(const cJSON *o, const char *key) { return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, key)); }

/* model.vocab and added_tokens give the id space; every id in 0..max must be named once. */
static nf_status read_vocab(hf_build *b, const cJSON *model, const cJSON *added)
{
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (!cJSON_IsObject(vocab)) return bad(b, NF_ERR_FORMAT, "model.vocab", "missing or not an object");
    double max_id = -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab)
    {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > 16777216 || e->valuedouble != (int)e->valuedouble)
            return nf_error_set(b->err, NF_ERR_FORMAT, "%s: model.vocab['%s']: expected an id in 0..2^24", b->src,
                                e->string);
        if (e->valuedouble > max_id) max_id = e->valuedouble;
    }
    cJSON_ArrayForEach(e, added)
    {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > 16777216 || !str_field(e, "content"))
            return bad(b, NF_ERR_FORMAT, "added_tokens", "each entry needs an integer 'id' and a string 'content'");
        if (id->valuedouble > max_id) max_id = id->valuedouble;
    }
    /* Every id 0..max must be named, so more ids than entries is an error; checked before the
     * tables are allocated, which a lone id near 2^24 would otherwise make ~200 MB. */
    const double entries = (double)cJSON_GetArraySize(vocab) + (added ? cJSON_GetArraySize(added) : 0);
    if (max_id + 1 > entries)
        return nf_error_set(b->err, NF_ERR_FORMAT, "%s: model.vocab: the largest id is %.0f but only %.0f tokens are "
                            "given (ids must be 0..%.0f without gaps)", b->src, max_id, entries, entries - 1);
    b->n = (uint32_t)(max_id + 1);
    b->tokens = calloc(b->n ? b->n : 1, sizeof *b->tokens);
    b->types = calloc(b->n ? b->n : 1, sizeof *b->types);
    b->normalized = calloc(b->n ? b->n : 1, 1);
    if (!b->tokens || !b->types || !b->normalized) return bad(b, NF_ERR_NOMEM, "vocabulary", "out of memory");
    cJSON_ArrayForEach(e, vocab)
    {
        uint32_t id = (uint32_t)e->valuedouble;
        if (b->tokens[id])
            return nf_error_set(b->err, NF_ERR_FORMAT, "%s: model.vocab: id %u is given to both '%s' and '%s'", b->src,
                                id, b->tokens[id], e->string);
        b->tokens[id] = e->string;
        b->types[id] = NF_TOK_NORMAL;
    }
    int i = 0;
    cJSON_ArrayForEach(e, added)
    {
        uint32_t id = (uint32_t)cJSON_GetObjectItemCaseSensitive(e, "id")->valuedouble;
        static const char *const unsupported[] = {"lstrip", "rstrip", "single_word"};
        for (int k = 0; k < 3; k++)
            if (true_field(e, unsupported[k]))
                return nf_error_set(b->err, NF_ERR_UNSUPPORTED, "%s: added_tokens[%d].%s is true: not supported", b->src,
                                    i, unsupported[k]);
        b->tokens[id] = (char *)str_field(e, "content"); // an added token may restate a vocab entry
        b->types[id] = true_field(e, "special") ? NF_TOK_CONTROL : NF_TOK_USER_DEFINED;
        b->normalized[id] = (uint8_t)true_field(e, "normalized");
        i++;
    }
    for (uint32_t id = 0; id < b->n; id++)
        if (!b->tokens[id])
            return nf_error_set(b->err, NF_ERR_FORMAT, "%s: model.vocab: no token has id %u (ids must be 0..%u)", b->src,
                                id, b->n - 1);
    return NF_OK;
}

/* model.merges: "left right" strings (older files) or [left, right] pairs (newer ones). */
static nf_status read_merges(hf_build *b, const cJSON *model)
{
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!cJSON_IsArray(merges)) return bad(b, NF_ERR_FORMAT, "model.merges", "missing or not an array");
    b->n_merges = (uint32_t)cJSON_GetArraySize(merges);
    b->merge_pairs = calloc(2 * (size_t)b->n_merges + 1, sizeof *b->merge_pairs);
    if (!b->merge_pairs) return bad(b, NF_ERR_NOMEM, "model.merges", "out of memory");
    uint32_t i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, merges)
    {
        if (cJSON_IsString(m)) {
            char *sp = strchr(m->valuestring, ' ');
            if (!sp || sp == m->valuestring || !sp[1])
                return nf_error_set(b->err, NF_ERR_FORMAT, "%s: model.merges[%u] = '%s': expected 'left right'", b->src,
                                    i, m->valuestring);
            *sp = 0; // split in place: the tree is ours and dies after the build
            b->merge_pairs[2 * i] = m->valuestring, b->merge_pairs[2 * i + 1] = sp + 1;
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(cJSON_GetArrayItem(m, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(m, 1))) {
            b->merge_pairs[2 * i] = cJSON_GetArrayItem(m, 0)->valuestring;
            b->merge_pairs[2 * i + 1] = cJSON_GetArrayItem(m, 1)->valuestring;
        } else {
            return nf_error_set(b->err, NF_ERR_FORMAT, "%s: model.merges[%u]: expected \"left right\" or [left, right]",
                                b->src, i);
        }
        i++;
    }
    return NF_OK;
}

static nf_status read_model(hf_build *b, const cJSON *model, int *ignore_merges)
{
    if (!cJSON_IsObject(model)) return bad(b, NF_ERR_FORMAT, "model", "missing or not an object");
    const char *type = str_field(model, "type");
    if (type && strcmp(type, "BPE") != 0)
        return nf_error_set(b->err, NF_ERR_UNSUPPORTED, "%s: model.type is '%s': only byte-level 'BPE' is supported",
                            b->src, type);
    if (true_field(model, "byte_fallback"))
        return bad(b, NF_ERR_UNSUPPORTED, "model.byte_fallback", "true (SentencePiece-style BPE) is not supported");
    const char *affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int k = 0; k < 2; k++) {
        const char *v = str_field(model, affixes[k]);
        if (v && *v)
            return nf_error_set(b->err, NF_ERR_UNSUPPORTED, "%s: model.%s = '%s': not supported", b->src, affixes[k], v);
    }
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (cJSON_IsNumber(dropout) && dropout->valuedouble != 0)
        return bad(b, NF_ERR_UNSUPPORTED, "model.dropout", "BPE dropout is not supported");
    *ignore_merges = true_field(model, "ignore_merges");
    return NF_OK;
}

static nf_status add_regex(hf_build *b, const char *re, const char *field)
{
    if (b->n_regex == NF_TOK_MAX_STAGES) return bad(b, NF_ERR_UNSUPPORTED, field, "too many split stages");
    b->regex[b->n_regex++] = re;
    return NF_OK;
}

/* Turns a pre_tokenizer tree into split regexes. `field` names the node for messages. */
static nf_status read_pre(hf_build *b, const cJSON *p, const char *field, int *byte_level)
{
    char sub[160];
    const char *type = str_field(p, "type");
    if (!type) return bad(b, NF_ERR_FORMAT, field, "missing 'type'");
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers"), *e;
        if (!cJSON_IsArray(list)) return bad(b, NF_ERR_FORMAT, field, "Sequence without a 'pretokenizers' array");
        int i = 0;
        cJSON_ArrayForEach(e, list)
        {
            snprintf(sub, sizeof sub, "%s.pretokenizers[%d]", field, i++);
            nf_status st = read_pre(b, e, sub, byte_level);
            if (st != NF_OK) return st;
        }
        return NF_OK;
    }
    if (strcmp(type, "ByteLevel") == 0) {
        if (true_field(p, "add_prefix_space"))
            return bad(b, NF_ERR_UNSUPPORTED, field, "ByteLevel add_prefix_space=true is not supported");
        const cJSON *use = cJSON_GetObjectItemCaseSensitive(p, "use_regex");
        *byte_level = 1;
        if (!use || cJSON_IsTrue(use)) { // HF's default is true
            const char *const *re;
            uint32_t n;
            nf_tok_pre_regexes("gpt2", &re, &n);
            return add_regex(b, re[0], field);
        }
        return NF_OK;
    }
    if (strcmp(type, "Digits") == 0)
        return add_regex(b, true_field(p, "individual_digits") ? "\\p{N}" : "\\p{N}+", field);
    if (strcmp(type, "Split") == 0) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
        const char *re = pat ? str_field(pat, "Regex") : NULL;
        const char *behavior = str_field(p, "behavior");
        if (!re) return bad(b, NF_ERR_UNSUPPORTED, field, "Split needs pattern.Regex (String patterns are not supported)");
        if (!behavior || strcmp(behavior, "Isolated") != 0 || true_field(p, "invert"))
            return nf_error_set(b->err, NF_ERR_UNSUPPORTED, "%s: %s.behavior = '%s': only Isolated without invert is supported",
                                b->src, field, behavior ? behavior : "(none)");
        return add_regex(b, re, field);
    }
    return nf_error_set(b->err, NF_ERR_UNSUPPORTED, "%s: %s.type = '%s': not a supported pre-tokenizer", b->src, field, type);
}

static nf_status read_normalizer(hf_build *b, const cJSON *n, nf_tok_norm *norm)
{
    *norm = NF_TOK_NORM_NONE;
    if (!n || cJSON_IsNull(n)) return NF_OK;
    const char *type = str_field(n, "type");
    if (type && strcmp(type, "NFC") == 0) {
        *norm = NF_TOK_NORM_NFC;
        return NF_OK;
    }
    if (type && strcmp(type, "Sequence") == 0 && cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(n, "normalizers")) == 0)
        return NF_OK;
    return nf_error_set(b->err, NF_ERR_UNSUPPORTED, "%s: normalizer.type = '%s': only NFC or none is supported", b->src,
                        type ? type : "(none)");
}

/* A special token in tokenizer_config.json: "text" or {"content": "text", ...}. */
static int32_t config_token(const nf_tokenizer *t, const cJSON *cfg, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    const char *s = cJSON_IsString(v) ? v->valuestring : cJSON_IsObject(v) ? str_field(v, "content") : NULL;
    return s ? nf_tok_find(t, s) : -1;
}

/* chat_template: a string, or a list of {name, template} of which "default" is the chat one. */
static const char *config_template(const cJSON *cfg)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template"), *e;
    if (cJSON_IsString(v)) return v->valuestring;
    cJSON_ArrayForEach(e, v)
    {
        const char *name = str_field(e, "name");
        if (name && strcmp(name, "default") == 0) return str_field(e, "template");
    }
    return NULL;
}

static void free_build(hf_build *b)
{
    free(b->tokens);
    free(b->types);
    free(b->normalized);
    free(b->merge_pairs);
}

nf_status nf_tok_load_hf_text(const char *json, size_t len, const char *config_json, size_t config_len,
                              const char *source, nf_tokenizer **out, nf_error *err)
{
    *out = NULL;
    hf_build b;
    memset(&b, 0, sizeof b);
    b.src = source ? source : "tokenizer.json";
    b.err = err;
    cJSON *root = cJSON_ParseWithLength(json, len), *cfg = NULL;
    if (!root || !cJSON_IsObject(root)) {
        size_t at = root ? 0 : (size_t)(cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() - json : 0);
        cJSON_Delete(root);
        return nf_error_set(err, NF_ERR_FORMAT, "%s: not a JSON object (parse error near byte %zu)", b.src, at);
    }
    if (config_json) {
        cfg = cJSON_ParseWithLength(config_json, config_len);
        if (!cJSON_IsObject(cfg)) {
            cJSON_Delete(cfg);
            cJSON_Delete(root);
            return nf_error_set(err, NF_ERR_FORMAT, "%s: tokenizer_config.json is not a JSON object", b.src);
        }
    }
    nf_tok_desc d = nf_tok_desc_empty();
    d.source = b.src;
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    int byte_level = 0;
    nf_status st = NF_OK;
    if (added && !cJSON_IsArray(added)) st = bad(&b, NF_ERR_FORMAT, "added_tokens", "not an array");
    if (st == NF_OK) st = read_model(&b, cJSON_GetObjectItemCaseSensitive(root, "model"), &d.ignore_merges);
    if (st == NF_OK) st = read_vocab(&b, cJSON_GetObjectItemCaseSensitive(root, "model"), added);
    if (st == NF_OK) st = read_merges(&b, cJSON_GetObjectItemCaseSensitive(root, "model"));
    if (st == NF_OK) st = read_normalizer(&b, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), &d.norm);
    if (st == NF_OK && !cJSON_IsObject(pre)) st = bad(&b, NF_ERR_UNSUPPORTED, "pre_tokenizer", "missing: byte-level BPE needs one");
    if (st == NF_OK) st = read_pre(&b, pre, "pre_tokenizer", &byte_level);
    if (st == NF_OK && !byte_level) st = bad(&b, NF_ERR_UNSUPPORTED, "pre_tokenizer", "has no ByteLevel step");
    if (st == NF_OK && dec && !cJSON_IsNull(dec) && (!str_field(dec, "type") || strcmp(str_field(dec, "type"), "ByteLevel")))
        st = nf_error_set(err, NF_ERR_UNSUPPORTED, "%s: decoder.type = '%s': only ByteLevel is supported", b.src,
                          str_field(dec, "type") ? str_field(dec, "type") : "(none)");
    if (st == NF_OK && b.n_regex == 0)
        st = bad(&b, NF_ERR_UNSUPPORTED, "pre_tokenizer", "splits nothing (ByteLevel use_regex=false and no Split)");
    nf_tokenizer *t = NULL;
    if (st == NF_OK) {
        d.n_vocab = b.n;
        d.tokens = (const char *const *)b.tokens;
        d.types = b.types;
        d.normalized = b.normalized;
        d.n_merges = b.n_merges;
        d.merge_pairs = b.merge_pairs;
        d.split_regex = b.regex;
        d.n_split = b.n_regex;
        d.chat_template = cfg ? config_template(cfg) : NULL;
        st = nf_tok_create(&d, &t, err);
    }
    if (st == NF_OK && cfg) {
        // bos/eos come from the config by name; add_bos_token decides whether encode adds BOS.
        t->bos = config_token(t, cfg, "bos_token");
        t->eos = config_token(t, cfg, "eos_token");
        t->pad = config_token(t, cfg, "pad_token");
        t->add_bos = true_field(cfg, "add_bos_token") && t->bos >= 0;
        t->add_eos = true_field(cfg, "add_eos_token") && t->eos >= 0;
    }
    free_build(&b);
    cJSON_Delete(cfg);
    cJSON_Delete(root);
    *out = t;
    return st;
}

static nf_status read_whole(const char *path, nf_mapped_file *m, nf_error *err)
{
    nf_status st = nf_map_file(path, m, err);
    if (st == NF_OK && m->size == 0) {
        nf_unmap_file(m);
        return nf_error_set(err, NF_ERR_FORMAT, "%s: empty file", path);
    }
    return st;
}

nf_status nf_tok_load_hf(const char *tokenizer_json, const char *tokenizer_config, nf_tokenizer **out, nf_error *err)
{
    nf_mapped_file tj, tc;
    memset(&tc, 0, sizeof tc);
    nf_status st = read_whole(tokenizer_json, &tj, err);
    if (st != NF_OK) return st;
    if (tokenizer_config && (st = read_whole(tokenizer_config, &tc, err)) != NF_OK) {
        nf_unmap_file(&tj);
        return st;
    }
    st = nf_tok_load_hf_text((const char *)tj.data, tj.size, tokenizer_config ? (const char *)tc.data : NULL, tc.size,
                             tokenizer_json, out, err);
    nf_unmap_file(&tj);
    if (tokenizer_config) nf_unmap_file(&tc);
    return st;
}

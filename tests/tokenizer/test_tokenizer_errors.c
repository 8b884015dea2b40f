/* Bad input gives a clear error naming the field, never a crash: malformed or unsupported
 * tokenizer.json, inconsistent descriptions (GGUF-style), invalid UTF-8 text, out-of-range ids. */
#include <stdio.h>

#include "nf_test.h"
#include "tok_fixture.h"
#include "base/log.h"

static const char base_json[] =
    "{\"added_tokens\":[{\"id\":3,\"content\":\"<s>\",\"special\":true}],\"normalizer\":null,"
    "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true},"
    "\"decoder\":{\"type\":\"ByteLevel\"},"
    "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\"]}}";

typedef void (*mutate_fn)(cJSON *root);

static cJSON *model(cJSON *r) { return cJSON_GetObjectItem(r, "model"); }
static void m_none(cJSON *r) { (void)r; }
static void m_no_model(cJSON *r) { cJSON_DeleteItemFromObject(r, "model"); }
static void m_unigram(cJSON *r) { cJSON_ReplaceItemInObject(model(r), "type", cJSON_CreateString("Unigram")); }
static void m_no_vocab(cJSON *r) { cJSON_DeleteItemFromObject(model(r), "vocab"); }
static void m_neg_id(cJSON *r) { cJSON_ReplaceItemInObject(cJSON_GetObjectItem(model(r), "vocab"), "b", cJSON_CreateNumber(-1)); }
static void m_dup_id(cJSON *r) { cJSON_ReplaceItemInObject(cJSON_GetObjectItem(model(r), "vocab"), "b", cJSON_CreateNumber(0)); }
static void m_gap(cJSON *r) { cJSON_ReplaceItemInObject(cJSON_GetObjectItem(model(r), "vocab"), "ab", cJSON_CreateNumber(7)); }
/* ids 0, 1, 3, 4 named (an added token restating 'a' keeps the count of entries at 5): 2 is missing */
static void m_gap_restated(cJSON *r)
{
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(model(r), "vocab"), "ab", cJSON_CreateNumber(4));
    cJSON *a = cJSON_CreateObject();
    cJSON_AddNumberToObject(a, "id", 0);
    cJSON_AddStringToObject(a, "content", "a");
    cJSON_AddItemToArray(cJSON_GetObjectItem(r, "added_tokens"), a);
}
/* one id near 2^24: refused by the count of entries before any table is allocated */
static void m_huge_id(cJSON *r) { cJSON_ReplaceItemInObject(cJSON_GetObjectItem(model(r), "vocab"), "ab", cJSON_CreateNumber(16777000)); }
static void m_merge_form(cJSON *r) { cJSON_ReplaceItemInArray(cJSON_GetObjectItem(model(r), "merges"), 0, cJSON_CreateString("ab")); }
static void m_merge_unknown(cJSON *r) { cJSON_ReplaceItemInArray(cJSON_GetObjectItem(model(r), "merges"), 0, cJSON_CreateString("a zz")); }
static void m_merge_result(cJSON *r) { cJSON_ReplaceItemInArray(cJSON_GetObjectItem(model(r), "merges"), 0, cJSON_CreateString("b a")); }
static void m_merge_type(cJSON *r) { cJSON_ReplaceItemInArray(cJSON_GetObjectItem(model(r), "merges"), 0, cJSON_CreateNumber(5)); }
static void m_byte_fallback(cJSON *r) { cJSON_AddTrueToObject(model(r), "byte_fallback"); }
static void m_lstrip(cJSON *r) { cJSON_AddTrueToObject(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "added_tokens"), 0), "lstrip"); }
static void m_added_noid(cJSON *r) { cJSON_DeleteItemFromObject(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "added_tokens"), 0), "id"); }
static void m_nfd(cJSON *r)
{
    cJSON *n = cJSON_CreateObject();
    cJSON_AddStringToObject(n, "type", "NFD");
    cJSON_ReplaceItemInObject(r, "normalizer", n);
}
static void m_whitespace(cJSON *r) { cJSON_ReplaceItemInObject(cJSON_GetObjectItem(r, "pre_tokenizer"), "type", cJSON_CreateString("Whitespace")); }
static void m_no_pre(cJSON *r) { cJSON_DeleteItemFromObject(r, "pre_tokenizer"); }
static void m_seq_bad(cJSON *r)
{
    cJSON *seq = cJSON_CreateObject(), *list = cJSON_AddArrayToObject(seq, "pretokenizers"), *p = cJSON_CreateObject();
    cJSON_AddStringToObject(seq, "type", "Sequence");
    cJSON_AddStringToObject(p, "type", "Metaspace");
    cJSON_AddItemToArray(list, p);
    cJSON_ReplaceItemInObject(r, "pre_tokenizer", seq);
}
static void m_bad_regex(cJSON *r)
{
    cJSON *seq = cJSON_CreateObject(), *list = cJSON_AddArrayToObject(seq, "pretokenizers"), *p = cJSON_CreateObject();
    cJSON_AddStringToObject(seq, "type", "Sequence");
    cJSON_AddStringToObject(p, "type", "Split");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(p, "pattern"), "Regex", "(\\p{L}+");
    cJSON_AddStringToObject(p, "behavior", "Isolated");
    cJSON_AddItemToArray(list, p);
    cJSON *bl = cJSON_CreateObject();
    cJSON_AddStringToObject(bl, "type", "ByteLevel");
    cJSON_AddFalseToObject(bl, "use_regex");
    cJSON_AddItemToArray(list, bl);
    cJSON_ReplaceItemInObject(r, "pre_tokenizer", seq);
}
static void m_split_removed(cJSON *r)
{
    m_bad_regex(r);
    cJSON *split = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(r, "pre_tokenizer"), "pretokenizers"), 0);
    cJSON_ReplaceItemInObject(split, "behavior", cJSON_CreateString("Removed"));
}
static void m_decoder(cJSON *r) { cJSON_ReplaceItemInObject(cJSON_GetObjectItem(r, "decoder"), "type", cJSON_CreateString("WordPiece")); }

static void check_json_errors(void)
{
    static const struct {
        const char *what;
        mutate_fn f;
        nf_status code;
        const char *needle;
    } cases[] = {
        {"valid", m_none, NF_OK, ""},
        {"no model", m_no_model, NF_ERR_FORMAT, "model: missing"},
        {"Unigram", m_unigram, NF_ERR_UNSUPPORTED, "model.type is 'Unigram'"},
        {"no vocab", m_no_vocab, NF_ERR_FORMAT, "model.vocab: missing"},
        {"negative id", m_neg_id, NF_ERR_FORMAT, "model.vocab['b']"},
        {"duplicate id", m_dup_id, NF_ERR_FORMAT, "id 0 is given to both"},
        {"id gap", m_gap, NF_ERR_FORMAT, "the largest id is 7 but only 4 tokens are given"},
        {"id gap restated", m_gap_restated, NF_ERR_FORMAT, "no token has id 2"},
        {"huge id", m_huge_id, NF_ERR_FORMAT, "the largest id is 16777000 but only 4 tokens"},
        {"merge form", m_merge_form, NF_ERR_FORMAT, "model.merges[0] = 'ab'"},
        {"merge unknown", m_merge_unknown, NF_ERR_FORMAT, "merges[0]: 'zz' is not in the vocabulary"},
        {"merge result", m_merge_result, NF_ERR_FORMAT, "merges[0]: the merged token 'ba'"},
        {"merge type", m_merge_type, NF_ERR_FORMAT, "model.merges[0]: expected"},
        {"byte_fallback", m_byte_fallback, NF_ERR_UNSUPPORTED, "model.byte_fallback"},
        {"lstrip", m_lstrip, NF_ERR_UNSUPPORTED, "added_tokens[0].lstrip"},
        {"added no id", m_added_noid, NF_ERR_FORMAT, "added_tokens: each entry needs"},
        {"NFD", m_nfd, NF_ERR_UNSUPPORTED, "normalizer.type = 'NFD'"},
        {"Whitespace", m_whitespace, NF_ERR_UNSUPPORTED, "pre_tokenizer.type = 'Whitespace'"},
        {"no pre", m_no_pre, NF_ERR_UNSUPPORTED, "pre_tokenizer: missing"},
        {"Metaspace", m_seq_bad, NF_ERR_UNSUPPORTED, "pre_tokenizer.pretokenizers[0].type = 'Metaspace'"},
        {"bad regex", m_bad_regex, NF_ERR_FORMAT, "pre-tokenizer regex 0 at offset"},
        {"Removed", m_split_removed, NF_ERR_UNSUPPORTED, "pre_tokenizer.pretokenizers[0].behavior = 'Removed'"},
        {"decoder", m_decoder, NF_ERR_UNSUPPORTED, "decoder.type = 'WordPiece'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cJSON *r = cJSON_Parse(base_json);
        cases[i].f(r);
        char *text = cJSON_PrintUnformatted(r);
        nf_tokenizer *t = NULL;
        nf_error e = {0};
        nf_status st = nf_tok_load_hf_text(text, strlen(text), NULL, 0, "x/tokenizer.json", &t, &e);
        CHECK_MSG(st == cases[i].code, "%s: status %s (%s)", cases[i].what, nf_status_name(st), e.msg);
        if (cases[i].code != NF_OK) {
            CHECK_CONTAINS(e.msg, cases[i].needle);
            CHECK_CONTAINS(e.msg, "x/tokenizer.json");
            CHECK(t == NULL);
        }
        nf_tok_free(t);
        free(text);
        cJSON_Delete(r);
    }
    nf_tokenizer *t = NULL;
    nf_error e;
    CHECK(nf_tok_load_hf_text("{\"model\": [", 11, NULL, 0, "trunc.json", &t, &e) == NF_ERR_FORMAT);
    CHECK_CONTAINS(e.msg, "trunc.json: not a JSON object");
    CHECK(nf_tok_load_hf(TOK_FIX "does-not-exist.json", NULL, &t, &e) == NF_ERR_IO);
    CHECK_CONTAINS(e.msg, "does-not-exist.json");
}

static void check_desc_errors(void)
{
    const char *tokens[] = {"a", "b", "ab"};
    int32_t types[] = {1, 1, 9};
    const char *merges[] = {"a b"};
    nf_tok_desc d = nf_tok_desc_empty();
    d.source = "m.gguf";
    d.n_vocab = 3, d.tokens = tokens, d.n_merges = 1, d.merges = merges, d.pre = "gpt2";
    nf_tokenizer *t = NULL;
    nf_error e;
    CHECK(nf_tok_create(&d, &t, &e) == NF_OK);
    nf_tok_free(t);
    d.types = types;
    CHECK(nf_tok_create(&d, &t, &e) == NF_ERR_FORMAT);
    CHECK_CONTAINS(e.msg, "m.gguf: token_type[2] = 9");
    d.types = NULL, d.bos_id = 3;
    CHECK(nf_tok_create(&d, &t, &e) == NF_ERR_FORMAT);
    CHECK_CONTAINS(e.msg, "bos_id = 3 is outside the vocabulary");
    d.bos_id = -1, d.add_bos = 1;
    CHECK(nf_tok_create(&d, &t, &e) == NF_ERR_FORMAT);
    CHECK_CONTAINS(e.msg, "add_bos is set but there is no bos token");
    d.add_bos = 0, d.pre = "t5";
    CHECK(nf_tok_create(&d, &t, &e) == NF_ERR_UNSUPPORTED);
    CHECK_CONTAINS(e.msg, "pre-tokenizer 't5' is not supported");
    d.pre = "gpt2", d.n_vocab = 0;
    CHECK(nf_tok_create(&d, &t, &e) == NF_ERR_FORMAT);
    CHECK_CONTAINS(e.msg, "empty vocabulary");
}

static void check_runtime_errors(void)
{
    nf_tokenizer *t = fix_smollm2();
    CHECK(t != NULL);
    if (!t) return;
    nf_tok_ids ids = {0};
    nf_error e;
    CHECK(nf_tok_encode(t, "abc\xc3(", 5, 0, &ids, &e) == NF_ERR_INVALID_ARG);
    CHECK_CONTAINS(e.msg, "not valid UTF-8 at byte 3");
    CHECK_EQ_U64(ids.n, 0);
    int32_t bad[] = {5, 999999};
    char *out;
    size_t len;
    CHECK(nf_tok_decode(t, bad, 2, 0, &out, &len, &e) == NF_ERR_INVALID_ARG);
    CHECK_CONTAINS(e.msg, "id 999999 at position 1");
    nf_tok_stream s;
    CHECK(nf_tok_stream_init(&s, t, 0, &e) == NF_OK);
    CHECK(nf_tok_stream_put(&s, -2, &len, &e) == NULL);
    CHECK_CONTAINS(e.msg, "id -2 is outside the vocabulary");
    nf_tok_stream_free(&s);
    // BOS is added only when asked and when the tokenizer says so: SmolLM2's GGUF says no.
    CHECK(nf_tok_encode(t, "Hi", 2, NF_TOK_ADD_SPECIAL, &ids, &e) == NF_OK);
    CHECK(ids.n > 0 && ids.ids[0] != nf_tok_bos(t));
    CHECK_EQ_INT(nf_tok_bos(t), 1);
    CHECK_EQ_INT(nf_tok_eos(t), 2);
    nf_tok_ids_free(&ids);
    nf_tok_free(t);
}

int main(void)
{
    nf_log_set_level(NF_LOG_OFF);
    check_json_errors();
    check_desc_errors();
    check_runtime_errors();
    return nf_test_report();
}

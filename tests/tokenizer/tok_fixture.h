/* Shared by the tokenizer tests: reading the committed fixtures (tests/fixtures/tokenizer/, written
 * by tests/oracle/tokenizer_fixtures.py) and building the three tokenizers they describe. */
#ifndef NF_TESTS_TOK_FIXTURE_H
#define NF_TESTS_TOK_FIXTURE_H

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "base/mapfile.h"
#include "tokenizer/tokenizer.h"

#define TOK_FIX NF_TEST_DATA "/fixtures/tokenizer/"

/* The whole file as a NUL-terminated malloc'd string (NULL on failure, with a message). */
static inline char *fix_read(const char *path, size_t *len)
{
    nf_mapped_file m;
    nf_error e;
    if (nf_map_file(path, &m, &e) != NF_OK) {
        fprintf(stderr, "fixture: %s\n", e.msg);
        return NULL;
    }
    char *s = malloc(m.size + 1);
    if (s) {
        memcpy(s, m.data, m.size);
        s[m.size] = 0;
    }
    if (len) *len = m.size;
    nf_unmap_file(&m);
    return s;
}

static inline cJSON *fix_json(const char *path)
{
    char *s = fix_read(path, NULL);
    cJSON *j = s ? cJSON_Parse(s) : NULL;
    if (s && !j) fprintf(stderr, "fixture: %s: not JSON\n", path);
    free(s);
    return j;
}

/* Hex string -> bytes (malloc'd, NUL-terminated); *n the byte count. */
static inline char *fix_unhex(const char *hex, size_t *n)
{
    size_t k = strlen(hex) / 2;
    char *out = malloc(k + 1);
    for (size_t i = 0; i < k; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        out[i] = (char)v;
    }
    out[k] = 0;
    *n = k;
    return out;
}

/* The id list of a JSON array. */
static inline int32_t *fix_ids(const cJSON *arr, size_t *n)
{
    *n = (size_t)cJSON_GetArraySize(arr);
    int32_t *ids = malloc((*n + 1) * sizeof *ids);
    size_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) ids[i++] = (int32_t)e->valuedouble;
    return ids;
}

static inline nf_tokenizer *fix_qwen3(void)
{
    nf_tokenizer *t = NULL;
    nf_error e;
    if (nf_tok_load_hf(TOK_FIX "qwen3/tokenizer.json", TOK_FIX "qwen3/tokenizer_config.json", &t, &e) != NF_OK)
        fprintf(stderr, "qwen3: %s\n", e.msg);
    return t;
}

/* SmolLM2 from its GGUF tokenizer.* metadata, through the format-neutral constructor, as a GGUF
 * or .nf loader fills it. */
static inline nf_tokenizer *fix_smollm2(void)
{
    cJSON *j = fix_json(TOK_FIX "smollm2/gguf_tokenizer.json");
    if (!j) return NULL;
    const cJSON *tok = cJSON_GetObjectItem(j, "tokenizer.ggml.tokens");
    const cJSON *types = cJSON_GetObjectItem(j, "tokenizer.ggml.token_type");
    const cJSON *merges = cJSON_GetObjectItem(j, "tokenizer.ggml.merges");
    uint32_t nv = (uint32_t)cJSON_GetArraySize(tok), nm = (uint32_t)cJSON_GetArraySize(merges);
    const char **tv = malloc(nv * sizeof *tv), **mv = malloc(nm * sizeof *mv);
    int32_t *ty = malloc(nv * sizeof *ty);
    uint32_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, tok) tv[i++] = e->valuestring;
    i = 0;
    cJSON_ArrayForEach(e, types) ty[i++] = (int32_t)e->valuedouble;
    i = 0;
    cJSON_ArrayForEach(e, merges) mv[i++] = e->valuestring;
    nf_tok_desc d = nf_tok_desc_empty();
    d.source = "smollm2/gguf_tokenizer.json";
    d.n_vocab = nv, d.tokens = tv, d.types = ty;
    d.n_merges = nm, d.merges = mv;
    d.pre = cJSON_GetObjectItem(j, "tokenizer.ggml.pre")->valuestring;
    d.bos_id = (int32_t)cJSON_GetObjectItem(j, "tokenizer.ggml.bos_token_id")->valuedouble;
    d.eos_id = (int32_t)cJSON_GetObjectItem(j, "tokenizer.ggml.eos_token_id")->valuedouble;
    d.add_bos = cJSON_IsTrue(cJSON_GetObjectItem(j, "tokenizer.ggml.add_bos_token"));
    d.chat_template = cJSON_GetObjectItem(j, "tokenizer.chat_template")->valuestring;
    nf_tokenizer *t = NULL;
    nf_error err;
    if (nf_tok_create(&d, &t, &err) != NF_OK) fprintf(stderr, "smollm2: %s\n", err.msg);
    free(tv);
    free(mv);
    free(ty);
    cJSON_Delete(j);
    return t;
}

/* The llama-3 split rule on Qwen's vocabulary: the same three edits the oracle made. */
#define LLAMA3_RE                                                                                  \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|" \
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

static inline nf_tokenizer *fix_qwen3_llama3pre(void)
{
    cJSON *j = fix_json(TOK_FIX "qwen3/tokenizer.json");
    if (!j) return NULL;
    cJSON_ReplaceItemInObject(j, "normalizer", cJSON_CreateNull());
    cJSON *pre = cJSON_CreateObject(), *list = cJSON_AddArrayToObject(pre, "pretokenizers");
    cJSON_AddStringToObject(pre, "type", "Sequence");
    cJSON *split = cJSON_CreateObject(), *bl = cJSON_CreateObject();
    cJSON_AddStringToObject(split, "type", "Split");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(split, "pattern"), "Regex", LLAMA3_RE);
    cJSON_AddStringToObject(split, "behavior", "Isolated");
    cJSON_AddFalseToObject(split, "invert");
    cJSON_AddStringToObject(bl, "type", "ByteLevel");
    cJSON_AddFalseToObject(bl, "add_prefix_space");
    cJSON_AddFalseToObject(bl, "use_regex");
    cJSON_AddItemToArray(list, split);
    cJSON_AddItemToArray(list, bl);
    cJSON_ReplaceItemInObject(j, "pre_tokenizer", pre);
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(j, "model"), "ignore_merges", cJSON_CreateTrue());
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    nf_tokenizer *t = NULL;
    nf_error e;
    if (nf_tok_load_hf_text(text, strlen(text), NULL, 0, "qwen3-llama3pre", &t, &e) != NF_OK)
        fprintf(stderr, "qwen3_llama3pre: %s\n", e.msg);
    free(text);
    return t;
}

#endif

/* Tokenizer metadata from a Hugging Face folder: a copy of the tiny qwen3_moe fixture with Qwen3's
 * tokenizer.json and tokenizer_config.json (tests/fixtures/tokenizer/qwen3/) and a
 * generation_config.json listing two eos ids. The tokenizer.* keys are checked against the JSON
 * files read here with cJSON (token count and texts, token types, merges, pre = qwen2, bos/eos/pad,
 * eos_ids, the chat template verbatim), and the tokenizer the engine builds from the artifact
 * (nf_text_tokenizer) must encode every qwen3 case of tests/fixtures/tokenizer/cases.json to the ids
 * HF tokenizers gave (the oracle) and to the ids of nf_tok_load_hf on the JSON directly. */
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert/convert.h"
#include "convert/plan.h"
#include "engine/text.h"
#include "format/artifact.h"
#include "nf_test.h"
#include "tokenizer/tokenizer.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation" /* fixture names are short */
#endif

#define TOKDIR NF_TEST_DATA "/fixtures/tokenizer/qwen3"

static char tmpdir[256];

static cJSON *read_json(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    cJSON *j = NULL;
    if (b && fread(b, 1, (size_t)n, f) == (size_t)n) j = cJSON_ParseWithLength(b, (size_t)n);
    free(b);
    fclose(f);
    return j;
}

static const char *meta_str(const nf_artifact *a, const char *key)
{
    const char *s = NULL;
    return nf_artifact_get_str(a, key, &s, NULL, NULL) == NF_OK ? s : NULL;
}

static int32_t meta_i32(const nf_artifact *a, const char *key)
{
    int32_t v = -99;
    nf_artifact_get_i32(a, key, &v, NULL);
    return v;
}

/* The tokenizer.* keys against tokenizer.json / tokenizer_config.json. */
static void check_keys(const nf_artifact *a)
{
    cJSON *tj = read_json(TOKDIR "/tokenizer.json"), *tc = read_json(TOKDIR "/tokenizer_config.json");
    CHECK(tj && tc);
    if (!tj || !tc) return;
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tj, "model"), "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tj, "model"), "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(tj, "added_tokens"), *e;
    int max = -1;
    cJSON_ArrayForEach(e, vocab) if (e->valueint > max) max = e->valueint;
    cJSON_ArrayForEach(e, added) if (cJSON_GetObjectItemCaseSensitive(e, "id")->valueint > max) max = cJSON_GetObjectItemCaseSensitive(e, "id")->valueint;

    const char *const *tok = NULL;
    size_t n_tok = 0, n_merges = 0, n_types = 0, n_eos = 0;
    const int32_t *types = NULL, *eos_ids = NULL;
    CHECK(nf_artifact_get_str_array(a, "tokenizer.tokens", &tok, NULL, &n_tok, NULL) == NF_OK);
    CHECK(nf_artifact_get_i32_array(a, "tokenizer.token_type", &types, &n_types, NULL) == NF_OK);
    CHECK_EQ_U64(n_tok, (uint64_t)max + 1);
    CHECK_EQ_U64(n_types, n_tok);
    if (n_tok != (size_t)max + 1 || n_types != n_tok) return;
    /* a few vocab entries, every added token with its type (3 special, 4 not) */
    static const char *const sample[] = {"hello", "!", "Ġworld", "ĠHello", "ĊĊ"};
    for (size_t i = 0; i < sizeof sample / sizeof sample[0]; i++) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(vocab, sample[i]);
        CHECK_MSG(id && strcmp(tok[id->valueint], sample[i]) == 0 && types[id->valueint] == 1, "%s", sample[i]);
    }
    cJSON_ArrayForEach(e, added) {
        int id = cJSON_GetObjectItemCaseSensitive(e, "id")->valueint;
        int want = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "special")) ? 3 : 4;
        CHECK_MSG(strcmp(tok[id], cJSON_GetObjectItemCaseSensitive(e, "content")->valuestring) == 0 && types[id] == want, "added %d", id);
    }
    const char *const *m = NULL;
    CHECK(nf_artifact_get_str_array(a, "tokenizer.merges", &m, NULL, &n_merges, NULL) == NF_OK);
    CHECK_EQ_U64(n_merges, (uint64_t)cJSON_GetArraySize(merges));
    for (int i = 0; m && i < 3 && (size_t)i < n_merges; i++) {
        int k = i == 2 ? (int)n_merges - 1 : i * 1000; /* first, one inside, last */
        const cJSON *x = cJSON_GetArrayItem(merges, k);
        char want[256];
        if (cJSON_IsArray(x))
            snprintf(want, sizeof want, "%s %s", cJSON_GetArrayItem(x, 0)->valuestring, cJSON_GetArrayItem(x, 1)->valuestring);
        else
            snprintf(want, sizeof want, "%s", x->valuestring);
        CHECK_MSG(strcmp(m[k], want) == 0, "merge %d: '%s' want '%s'", k, m[k], want);
    }
    CHECK(meta_str(a, "tokenizer.pre") && strcmp(meta_str(a, "tokenizer.pre"), "qwen2") == 0);
    CHECK(meta_str(a, "tokenizer.model") && strcmp(meta_str(a, "tokenizer.model"), "gpt2") == 0);
    /* bos_token null -> -1; eos <|im_end|>; pad <|endoftext|> (ids from tokenizer.json's added tokens) */
    int im_end = -1, eot = -1;
    cJSON_ArrayForEach(e, added) {
        const char *c = cJSON_GetObjectItemCaseSensitive(e, "content")->valuestring;
        if (strcmp(c, "<|im_end|>") == 0) im_end = cJSON_GetObjectItemCaseSensitive(e, "id")->valueint;
        if (strcmp(c, "<|endoftext|>") == 0) eot = cJSON_GetObjectItemCaseSensitive(e, "id")->valueint;
    }
    CHECK_EQ_INT(meta_i32(a, "tokenizer.bos_id"), -1);
    CHECK_EQ_INT(meta_i32(a, "tokenizer.eos_id"), im_end);
    CHECK_EQ_INT(meta_i32(a, "tokenizer.pad_id"), eot);
    int add_bos = -1;
    CHECK(nf_artifact_get_bool(a, "tokenizer.add_bos", &add_bos, NULL) == NF_OK && add_bos == 0);
    /* eos, then generation_config's [im_end, endoftext] without the repeat */
    CHECK(nf_artifact_get_i32_array(a, "tokenizer.eos_ids", &eos_ids, &n_eos, NULL) == NF_OK);
    CHECK_MSG(n_eos == 2 && eos_ids[0] == im_end && eos_ids[1] == eot, "eos_ids: %zu entries", n_eos);
    const char *ct = meta_str(a, "tokenizer.chat_template");
    CHECK(ct && strcmp(ct, cJSON_GetObjectItemCaseSensitive(tc, "chat_template")->valuestring) == 0);
    cJSON_Delete(tj);
    cJSON_Delete(tc);
}

static int hexval(char c) { return c <= '9' ? c - '0' : (c | 32) - 'a' + 10; }

/* Every qwen3 encode case: artifact tokenizer == HF ids == tokenizer.json tokenizer. */
static void check_encode(const nf_artifact *a)
{
    nf_tokenizer *ta = NULL, *th = NULL;
    nf_error err = {0};
    CHECK_MSG(nf_text_tokenizer(a, &ta, &err) == NF_OK, "%s", err.msg);
    CHECK_MSG(nf_tok_load_hf(TOKDIR "/tokenizer.json", TOKDIR "/tokenizer_config.json", &th, &err) == NF_OK, "%s", err.msg);
    cJSON *cases = read_json(NF_TEST_DATA "/fixtures/tokenizer/cases.json");
    const cJSON *enc = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(cases, "qwen3"), "encode"), *c;
    CHECK(ta && th && cJSON_GetArraySize(enc) > 100);
    int n = 0, same = 0;
    cJSON_ArrayForEach(c, enc) {
        if (!ta || !th) break;
        const char *hex = cJSON_GetObjectItemCaseSensitive(c, "hex")->valuestring;
        size_t len = strlen(hex) / 2;
        char *text = malloc(len + 1);
        for (size_t i = 0; i < len; i++) text[i] = (char)(hexval(hex[2 * i]) << 4 | hexval(hex[2 * i + 1]));
        nf_tok_ids x = {0}, y = {0};
        nf_status s1 = nf_tok_encode(ta, text, len, NF_TOK_PARSE_SPECIAL, &x, NULL);
        nf_status s2 = nf_tok_encode(th, text, len, NF_TOK_PARSE_SPECIAL, &y, NULL);
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(c, "ids");
        int ok = s1 == NF_OK && s2 == NF_OK && x.n == (size_t)cJSON_GetArraySize(ids) && x.n == y.n &&
                 (x.n == 0 || memcmp(x.ids, y.ids, x.n * sizeof *x.ids) == 0);
        for (size_t i = 0; ok && i < x.n; i++) ok = x.ids[i] == cJSON_GetArrayItem(ids, (int)i)->valueint;
        CHECK_MSG(ok, "case %d (hex %.40s): artifact tokenizer %zu ids, tokenizer.json %zu, HF %d", n, hex, x.n, y.n,
                  cJSON_GetArraySize(ids));
        same += ok;
        n++;
        nf_tok_ids_free(&x);
        nf_tok_ids_free(&y);
        free(text);
    }
    printf("qwen3 encode cases: %d of %d equal to HF tokenizers and to tokenizer.json\n", same, n);
    cJSON_Delete(cases);
    nf_tok_free(ta);
    nf_tok_free(th);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/nf_convert_tok.XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    char cmd[2048], out[512];
    snprintf(cmd, sizeof cmd,
             "cp " NF_TEST_DATA "/fixtures/models/qwen3_moe/config.json " NF_TEST_DATA
             "/fixtures/models/qwen3_moe/model.safetensors " TOKDIR "/tokenizer.json " TOKDIR "/tokenizer_config.json %s/ && "
             "printf '{\"bos_token_id\": 151643, \"eos_token_id\": [151645, 151643]}' > %s/generation_config.json",
             tmpdir, tmpdir);
    CHECK(system(cmd) == 0);
    snprintf(out, sizeof out, "%s/tok.nf", tmpdir);
    nf_convert_opts o = {"bf16", 0, 1, 1};
    nf_plan p;
    nf_error err = {0};
    nf_status s = nf_plan_build(tmpdir, &o, &p, &err);
    if (s == NF_OK) s = nf_convert_run(&p, out, &o, NULL, &err);
    nf_plan_free(&p);
    CHECK_MSG(s == NF_OK, "%s", err.msg);
    nf_artifact *a = NULL;
    CHECK(s == NF_OK && nf_artifact_open(out, &a, &err) == NF_OK);
    if (a) {
        check_keys(a);
        check_encode(a);
        nf_artifact_close(a);
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) return 1;
    return nf_test_report();
}

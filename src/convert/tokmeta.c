/* tokenizer.* metadata from tokenizer.json / GGUF: see tokmeta.h. */
#define _POSIX_C_SOURCE 200809L
#include "convert/tokmeta.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/mapfile.h"
#include "tokenizer/tokenizer.h"

/* ---- GGUF ------------------------------------------------------------------------------------ */

static nf_status gguf_id(const nf_gguf *g, const char *key, int32_t *id)
{
    int64_t v;
    *id = -1;
    if (nf_gguf_find_kv(g, key) && nf_gguf_get_int(g, key, &v, NULL) == NF_OK && v >= 0 && v < INT32_MAX) *id = (int32_t)v;
    return NF_OK;
}

static nf_status gguf_strs(const nf_gguf *g, const char *key, nf_artifact_writer *w, const char *out, nf_error *err)
{
    const nf_gguf_kv *a;
    nf_status s = nf_gguf_get_array(g, key, NF_GGUF_STRING, &a, err);
    if (s) return s;
    const char **v = malloc((a->n ? a->n : 1) * sizeof *v);
    uint32_t *l = malloc((a->n ? a->n : 1) * sizeof *l);
    if (!v || !l) s = nf_error_set(err, NF_ERR_NOMEM, "out of memory");
    for (uint64_t i = 0; s == NF_OK && i < a->n; i++) {
        nf_gguf_str x = nf_gguf_arr_str(a, i);
        v[i] = x.ptr;
        l[i] = (uint32_t)x.len;
    }
    if (s == NF_OK) s = nf_artifact_writer_add_str_array(w, out, v, l, (size_t)a->n, err);
    free(v);
    free(l);
    return s;
}

/* A GGUF string array as NUL-terminated copies: (*v)[i] points into *store. */
static nf_status gguf_cstrs(const nf_gguf *g, const char *key, char ***v, char **store, uint64_t *n, nf_error *err)
{
    const nf_gguf_kv *a;
    *v = NULL;
    *store = NULL;
    *n = 0;
    nf_status s = nf_gguf_get_array(g, key, NF_GGUF_STRING, &a, err);
    if (s) return s;
    size_t total = 1;
    for (uint64_t i = 0; i < a->n; i++) total += (size_t)nf_gguf_arr_str(a, i).len + 1;
    *v = malloc((a->n ? a->n : 1) * sizeof **v);
    *store = malloc(total);
    if (!*v || !*store) return nf_error_set(err, NF_ERR_NOMEM, "out of memory");
    char *o = *store;
    for (uint64_t i = 0; i < a->n; i++) {
        nf_gguf_str x = nf_gguf_arr_str(a, i);
        if (memchr(x.ptr, 0, (size_t)x.len))
            return nf_error_set(err, NF_ERR_FORMAT, "%s[%llu] holds a NUL byte", key, (unsigned long long)i);
        (*v)[i] = o;
        memcpy(o, x.ptr, (size_t)x.len);
        o += x.len;
        *o++ = 0;
    }
    *n = a->n;
    return NF_OK;
}

/* ggml's pre-tokenizer names where the tokenizer library spells them differently. */
static const char *gguf_pre_name(const char *pre) { return strcmp(pre, "gpt-2") == 0 ? "gpt2" : pre; }

/* The tokenizer library must build a tokenizer from what the artifact will carry (as it must load an HF
 * folder's tokenizer.json), so a GGUF whose vocabulary, merges, types, ids or pre-tokenizer it cannot
 * take fails here, naming the field, rather than when the artifact is run. */
static nf_status gguf_tok_check(const nf_plan *p, const char *pre, int32_t bos, int32_t eos, int32_t pad, int add_bos,
                                nf_error *err)
{
    const nf_gguf *g = p->gguf;
    char **tokens = NULL, **merges = NULL, *ts = NULL, *ms = NULL;
    uint64_t nt = 0, nm = 0;
    int32_t *types = NULL;
    nf_status s = gguf_cstrs(g, "tokenizer.ggml.tokens", &tokens, &ts, &nt, err);
    if (s == NF_OK && nf_gguf_find_kv(g, "tokenizer.ggml.merges"))
        s = gguf_cstrs(g, "tokenizer.ggml.merges", &merges, &ms, &nm, err);
    if (s == NF_OK && nf_gguf_find_kv(g, "tokenizer.ggml.token_type")) {
        const nf_gguf_kv *a;
        s = nf_gguf_get_array(g, "tokenizer.ggml.token_type", NF_GGUF_INT64, &a, err);
        if (s == NF_OK && a->n != nt)
            s = nf_error_set(err, NF_ERR_FORMAT, "tokenizer.ggml.token_type has %llu entries, tokenizer.ggml.tokens %llu",
                             (unsigned long long)a->n, (unsigned long long)nt);
        if (s == NF_OK && !(types = malloc((nt ? nt : 1) * sizeof *types))) s = nf_error_set(err, NF_ERR_NOMEM, "out of memory");
        for (uint64_t i = 0; s == NF_OK && i < nt; i++) types[i] = (int32_t)nf_gguf_arr_int(a, i);
    }
    if (s == NF_OK && (nt == 0 || nt > (1u << 24)))
        s = nf_error_set(err, NF_ERR_FORMAT, "tokenizer.ggml.tokens has %llu entries", (unsigned long long)nt);
    if (s == NF_OK) {
        nf_tok_desc d = nf_tok_desc_empty();
        d.source = "tokenizer.ggml";
        d.n_vocab = (uint32_t)nt;
        d.tokens = (const char *const *)tokens;
        d.types = types;
        d.n_merges = (uint32_t)nm;
        d.merges = (const char *const *)merges;
        d.pre = pre;
        d.bos_id = bos;
        d.eos_id = eos;
        d.pad_id = pad;
        d.add_bos = add_bos;
        nf_tokenizer *tk = NULL;
        s = nf_tok_create(&d, &tk, err);
        nf_tok_free(tk);
    }
    free(tokens);
    free(merges);
    free(ts);
    free(ms);
    free(types);
    return s ? nf_error_prefix(err, "%s", p->source) : NF_OK;
}

static nf_status gguf_tok(const nf_plan *p, nf_artifact_writer *w, nf_error *err)
{
    const nf_gguf *g = p->gguf;
    nf_gguf_str m;
    if (!nf_gguf_find_kv(g, "tokenizer.ggml.model")) {
        NF_WARN("convert: %s has no tokenizer.ggml.* keys; the artifact has no tokenizer", p->source);
        return NF_OK;
    }
    nf_status s = nf_gguf_get_str(g, "tokenizer.ggml.model", &m, err);
    if (s) return s;
    if (m.len != 4 || memcmp(m.ptr, "gpt2", 4) != 0)
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "%s: tokenizer.ggml.model '%.*s' is not supported (gpt2 byte-level BPE only)",
                            p->source, (int)m.len, m.ptr);
    nf_gguf_str pre = {"gpt2", 4};
    if (nf_gguf_find_kv(g, "tokenizer.ggml.pre")) nf_gguf_get_str(g, "tokenizer.ggml.pre", &pre, NULL);
    char pre_s[64];
    snprintf(pre_s, sizeof pre_s, "%.*s", (int)(pre.len < 63 ? pre.len : 63), pre.ptr);
    const char *pre_name = gguf_pre_name(pre_s);
    int32_t bos, eos, pad, eot;
    gguf_id(g, "tokenizer.ggml.bos_token_id", &bos);
    gguf_id(g, "tokenizer.ggml.eos_token_id", &eos);
    gguf_id(g, "tokenizer.ggml.padding_token_id", &pad);
    gguf_id(g, "tokenizer.ggml.eot_token_id", &eot);
    int add_bos = 0;
    if (nf_gguf_find_kv(g, "tokenizer.ggml.add_bos_token")) nf_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos, NULL);
    if ((s = gguf_tok_check(p, pre_name, bos, eos, pad, add_bos, err)) != NF_OK) return s;
    s = nf_artifact_writer_add_str(w, "tokenizer.model", "gpt2", err);
    if (s == NF_OK) s = nf_artifact_writer_add_str(w, "tokenizer.pre", pre_name, err);
    if (s == NF_OK) s = gguf_strs(g, "tokenizer.ggml.tokens", w, "tokenizer.tokens", err);
    if (s == NF_OK && nf_gguf_find_kv(g, "tokenizer.ggml.merges"))
        s = gguf_strs(g, "tokenizer.ggml.merges", w, "tokenizer.merges", err);
    if (s == NF_OK && nf_gguf_find_kv(g, "tokenizer.ggml.token_type")) {
        const nf_gguf_kv *a;
        s = nf_gguf_get_array(g, "tokenizer.ggml.token_type", NF_GGUF_INT64, &a, err);
        int32_t *tt = s == NF_OK ? malloc((a->n ? a->n : 1) * sizeof *tt) : NULL;
        if (s == NF_OK && !tt) s = nf_error_set(err, NF_ERR_NOMEM, "out of memory");
        for (uint64_t i = 0; s == NF_OK && i < a->n; i++) tt[i] = (int32_t)nf_gguf_arr_int(a, i);
        if (s == NF_OK) s = nf_artifact_writer_add_array(w, "tokenizer.token_type", NF_META_I32, tt, (size_t)a->n, err);
        free(tt);
    }
    if (s == NF_OK) s = nf_artifact_writer_add_i32(w, "tokenizer.bos_id", bos, err);
    if (s == NF_OK) s = nf_artifact_writer_add_i32(w, "tokenizer.eos_id", eos, err);
    if (s == NF_OK) s = nf_artifact_writer_add_i32(w, "tokenizer.pad_id", pad, err);
    int32_t ids[2];
    size_t n = 0;
    if (eos >= 0) ids[n++] = eos;
    if (eot >= 0 && eot != eos) ids[n++] = eot;
    if (s == NF_OK) s = nf_artifact_writer_add_array(w, "tokenizer.eos_ids", NF_META_I32, ids, n, err);
    if (s == NF_OK) s = nf_artifact_writer_add_bool(w, "tokenizer.add_bos", add_bos, err);
    nf_gguf_str ct;
    if (s == NF_OK && nf_gguf_find_kv(g, "tokenizer.chat_template") &&
        nf_gguf_get_str(g, "tokenizer.chat_template", &ct, NULL) == NF_OK)
        s = nf_artifact_writer_add_strn(w, "tokenizer.chat_template", ct.ptr, (size_t)ct.len, err);
    return s;
}

/* ---- Hugging Face ---------------------------------------------------------------------------- */

static cJSON *load_json(const char *path, nf_error *err)
{
    nf_mapped_file m;
    if (nf_map_file(path, &m, err) != NF_OK) return NULL;
    cJSON *j = cJSON_ParseWithLength((const char *)m.data, m.size);
    nf_unmap_file(&m);
    if (!j) nf_error_set(err, NF_ERR_FORMAT, "%s: not valid JSON", path);
    return j;
}

/* A token given as "text" or {"content": "text"}. */
static const char *tok_text(const cJSON *j)
{
    if (cJSON_IsString(j)) return j->valuestring;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "content");
    return cJSON_IsString(c) ? c->valuestring : NULL;
}

static int32_t find_id(char **tokens, uint32_t n, const char *text)
{
    if (!text) return -1;
    for (uint32_t i = 0; i < n; i++)
        if (tokens[i] && strcmp(tokens[i], text) == 0) return (int32_t)i;
    return -1;
}

/* The named pre-tokenizer whose regex tokenizer.json's pre_tokenizer uses. */
static const char *detect_pre(const cJSON *tj)
{
    char *pre = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(tj, "pre_tokenizer"));
    const char *names[] = {"qwen2", "llama3"}, *found = NULL;
    for (int i = 0; i < 2 && pre && !found; i++) {
        const char *const *re;
        uint32_t n;
        if (!nf_tok_pre_regexes(names[i], &re, &n)) continue;
        cJSON *s = cJSON_CreateString(re[0]); /* the regex as JSON escapes it */
        char *q = cJSON_PrintUnformatted(s);
        if (q && strstr(pre, q)) found = names[i];
        free(q);
        cJSON_Delete(s);
    }
    if (!found) found = pre && strstr(pre, "\"Digits\"") ? "smollm" : "gpt2";
    free(pre);
    return found;
}

typedef struct hf_vocab_t {
    char **tokens;   /* [n] borrowed from the JSON, NULL for holes */
    int32_t *types;  /* [n] */
    uint32_t n;
} hf_vocab_t;

static nf_status hf_vocab(const cJSON *tj, const char *path, hf_vocab_t *t, nf_error *err)
{
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(tj, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(tj, "added_tokens");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "BPE") != 0 || !cJSON_IsObject(vocab))
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "%s: model.type is not BPE with a vocab object", path);
    int64_t max = -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) if (cJSON_IsNumber(e) && e->valuedouble > max) max = (int64_t)e->valuedouble;
    cJSON_ArrayForEach(e, added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        if (cJSON_IsNumber(id) && id->valuedouble > max) max = (int64_t)id->valuedouble;
    }
    if (max < 0 || max >= (1 << 24)) return nf_error_set(err, NF_ERR_FORMAT, "%s: vocabulary ids out of range", path);
    t->n = (uint32_t)max + 1;
    t->tokens = calloc(t->n, sizeof *t->tokens);
    t->types = calloc(t->n, sizeof *t->types);
    if (!t->tokens || !t->types) return nf_error_set(err, NF_ERR_NOMEM, "out of memory");
    cJSON_ArrayForEach(e, vocab) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0) return nf_error_set(err, NF_ERR_FORMAT, "%s: vocab '%s': bad id", path, e->string);
        t->tokens[(uint32_t)e->valuedouble] = e->string;
        t->types[(uint32_t)e->valuedouble] = 1;
    }
    cJSON_ArrayForEach(e, added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id"), *c = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || !cJSON_IsString(c))
            return nf_error_set(err, NF_ERR_FORMAT, "%s: added_tokens entry without id/content", path);
        uint32_t i = (uint32_t)id->valuedouble;
        t->tokens[i] = c->valuestring;
        t->types[i] = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "special")) ? 3 : 4;
    }
    for (uint32_t i = 0; i < t->n; i++)
        if (!t->tokens[i]) return nf_error_set(err, NF_ERR_FORMAT, "%s: token id %u has no text (ids must be dense)", path, i);
    return NF_OK;
}

static nf_status hf_merges(const cJSON *tj, nf_artifact_writer *w, nf_error *err)
{
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tj, "model"), "merges");
    int n = cJSON_GetArraySize(merges);
    char **m = calloc(n ? (size_t)n : 1, sizeof *m);
    if (!m) return nf_error_set(err, NF_ERR_NOMEM, "out of memory");
    nf_status s = NF_OK;
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, merges) {
        if (cJSON_IsString(e)) m[i] = strdup(e->valuestring);
        else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(cJSON_GetArrayItem(e, 0))) {
            const char *a = cJSON_GetArrayItem(e, 0)->valuestring, *b = cJSON_GetArrayItem(e, 1)->valuestring;
            size_t L = strlen(a) + strlen(b) + 2;
            if ((m[i] = malloc(L)) != NULL) snprintf(m[i], L, "%s %s", a, b);
        }
        if (!m[i]) {
            s = nf_error_set(err, NF_ERR_FORMAT, "tokenizer.json: merges[%d] is not \"a b\" or [a, b]", i);
            break;
        }
        i++;
    }
    if (s == NF_OK) s = nf_artifact_writer_add_str_array(w, "tokenizer.merges", (const char *const *)m, NULL, (size_t)n, err);
    for (int k = 0; k < n; k++) free(m[k]);
    free(m);
    return s;
}

static nf_status hf_tok(const nf_plan *p, nf_artifact_writer *w, nf_error *err)
{
    char tjp[1200], tcp[1200], gcp[1200];
    snprintf(tjp, sizeof tjp, "%s/tokenizer.json", p->source);
    snprintf(tcp, sizeof tcp, "%s/tokenizer_config.json", p->source);
    snprintf(gcp, sizeof gcp, "%s/generation_config.json", p->source);
    if (access(tjp, R_OK) != 0) {
        NF_WARN("convert: %s has no tokenizer.json; the artifact has no tokenizer (text commands will refuse it)", p->source);
        return NF_OK;
    }
    int has_tc = access(tcp, R_OK) == 0;
    /* the tokenizer library must accept it, or the artifact would carry one nothing can load */
    nf_tokenizer *tk = NULL;
    nf_status s = nf_tok_load_hf(tjp, has_tc ? tcp : NULL, &tk, err);
    if (s) return nf_error_prefix(err, "tokenizer");
    nf_tok_free(tk);
    cJSON *tj = load_json(tjp, err), *tc = has_tc ? load_json(tcp, err) : NULL;
    cJSON *gc = access(gcp, R_OK) == 0 ? load_json(gcp, NULL) : NULL;
    hf_vocab_t t = {0};
    s = tj && (!has_tc || tc) ? hf_vocab(tj, tjp, &t, err) : NF_ERR_FORMAT;
    if (s == NF_OK) s = nf_artifact_writer_add_str(w, "tokenizer.model", "gpt2", err);
    if (s == NF_OK) s = nf_artifact_writer_add_str(w, "tokenizer.pre", detect_pre(tj), err);
    if (s == NF_OK)
        s = nf_artifact_writer_add_str_array(w, "tokenizer.tokens", (const char *const *)t.tokens, NULL, t.n, err);
    if (s == NF_OK) s = nf_artifact_writer_add_array(w, "tokenizer.token_type", NF_META_I32, t.types, t.n, err);
    if (s == NF_OK) s = hf_merges(tj, w, err);
    int32_t bos = find_id(t.tokens, t.n, tok_text(cJSON_GetObjectItemCaseSensitive(tc, "bos_token")));
    int32_t eos = find_id(t.tokens, t.n, tok_text(cJSON_GetObjectItemCaseSensitive(tc, "eos_token")));
    int32_t pad = find_id(t.tokens, t.n, tok_text(cJSON_GetObjectItemCaseSensitive(tc, "pad_token")));
    int32_t ids[16];
    size_t n = 0;
    if (eos >= 0) ids[n++] = eos;
    int32_t im_end = find_id(t.tokens, t.n, "<|im_end|>");
    if (im_end >= 0 && im_end != eos) ids[n++] = im_end;
    const cJSON *ge = cJSON_GetObjectItemCaseSensitive(gc, "eos_token_id"), *e;
    if (cJSON_IsNumber(ge)) ge = NULL; /* a single id: handled next */
    if (cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(gc, "eos_token_id"))) {
        int32_t v = (int32_t)cJSON_GetObjectItemCaseSensitive(gc, "eos_token_id")->valuedouble;
        int dup = 0;
        for (size_t k = 0; k < n; k++) dup |= ids[k] == v;
        if (!dup && n < 16) ids[n++] = v;
    }
    cJSON_ArrayForEach(e, ge) {
        int32_t v = (int32_t)e->valuedouble;
        int dup = 0;
        for (size_t k = 0; k < n; k++) dup |= ids[k] == v;
        if (!dup && n < 16) ids[n++] = v;
    }
    const cJSON *ab = cJSON_GetObjectItemCaseSensitive(tc, "add_bos_token");
    if (s == NF_OK) s = nf_artifact_writer_add_i32(w, "tokenizer.bos_id", bos, err);
    if (s == NF_OK) s = nf_artifact_writer_add_i32(w, "tokenizer.eos_id", eos, err);
    if (s == NF_OK) s = nf_artifact_writer_add_i32(w, "tokenizer.pad_id", pad, err);
    if (s == NF_OK) s = nf_artifact_writer_add_array(w, "tokenizer.eos_ids", NF_META_I32, ids, n, err);
    if (s == NF_OK) s = nf_artifact_writer_add_bool(w, "tokenizer.add_bos", cJSON_IsTrue(ab) && bos >= 0, err);
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(tc, "chat_template");
    if (s == NF_OK && cJSON_IsString(ct)) s = nf_artifact_writer_add_str(w, "tokenizer.chat_template", ct->valuestring, err);
    free(t.tokens);
    free(t.types);
    cJSON_Delete(tj);
    cJSON_Delete(tc);
    cJSON_Delete(gc);
    return s;
}

nf_status nf_convert_tokenizer_meta(const nf_plan *p, nf_artifact_writer *w, nf_error *err)
{
    return p->src_kind == NF_SRC_GGUF ? gguf_tok(p, w, err) : hf_tok(p, w, err);
}

/* The GGUF reader against files written by llama.cpp's gguf-py (tests/oracle/source_fixtures.py;
 * tests/fixtures/sources/manifest.json holds what gguf-py's own reader says they contain: every
 * kv with its type and value, every tensor's ne, ggml type, offset, size and FNV-1a of its bytes),
 * and against corrupted files: each refused with a message naming what is wrong, never a crash. */
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <unistd.h>

#include "base/fnv.h"
#include "format/gguf.h"
#include "nf_test.h"
#include "test_sources_util.h"

static const cJSON *get(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }
static uint64_t num(const cJSON *o, const char *k) { return (uint64_t)get(o, k)->valuedouble; }

static int str_eq(nf_gguf_str s, const char *c) { return s.len == strlen(c) && memcmp(s.ptr, c, s.len) == 0; }

/* ---- values against gguf-py ---- */

static int is_int(nf_gguf_type t) { return t <= NF_GGUF_INT32 || t == NF_GGUF_UINT64 || t == NF_GGUF_INT64; }
static int is_signed(nf_gguf_type t)
{
    return t == NF_GGUF_INT8 || t == NF_GGUF_INT16 || t == NF_GGUF_INT32 || t == NF_GGUF_INT64;
}

/* An integer as decimal text, the form the manifest gives ("text") so 64-bit values are exact. */
static void int_text(nf_gguf_type t, uint64_t u, int64_t i, char *buf, size_t cap)
{
    if (is_signed(t)) snprintf(buf, cap, "%" PRId64, i);
    else snprintf(buf, cap, "%" PRIu64, u);
}

static void check_scalar(const nf_gguf_kv *kv, const cJSON *e)
{
    const cJSON *v = get(e, "value");
    char buf[32];
    if (is_int(kv->type)) {
        int_text(kv->type, kv->v.u64, kv->v.i64, buf, sizeof buf);
        CHECK_MSG(strcmp(buf, get(e, "text")->valuestring) == 0, "%s: %s != %s", kv->key, buf,
                  get(e, "text")->valuestring);
    } else if (kv->type == NF_GGUF_FLOAT32 || kv->type == NF_GGUF_FLOAT64) {
        CHECK_MSG(kv->v.f64 == v->valuedouble, "%s: %.17g != %.17g", kv->key, kv->v.f64, v->valuedouble);
    } else if (kv->type == NF_GGUF_BOOL) {
        CHECK_EQ_INT(kv->v.u64, cJSON_IsTrue(v));
    } else if (kv->type == NF_GGUF_STRING) {
        CHECK_MSG(str_eq(kv->v.str, v->valuestring), "%s: string differs", kv->key);
    }
}

static void check_array(const nf_gguf_kv *kv, const cJSON *e)
{
    const cJSON *v = get(e, "value"), *text = get(e, "text");
    CHECK_EQ_INT(kv->n, cJSON_GetArraySize(v));
    CHECK_MSG(strcmp(nf_gguf_type_name(kv->elem_type), get(e, "elem")->valuestring) == 0, "%s: element type %s",
              kv->key, nf_gguf_type_name(kv->elem_type));
    uint64_t i = 0;
    int bad = 0;
    for (const cJSON *x = v->child; x && i < kv->n; x = x->next, i++) {
        if (kv->elem_type == NF_GGUF_STRING) {
            bad += !str_eq(nf_gguf_arr_str(kv, i), x->valuestring);
        } else if (kv->elem_type == NF_GGUF_FLOAT32 || kv->elem_type == NF_GGUF_FLOAT64) {
            bad += nf_gguf_arr_float(kv, i) != x->valuedouble;
        } else if (kv->elem_type == NF_GGUF_BOOL) {
            bad += nf_gguf_arr_int(kv, i) != cJSON_IsTrue(x);
        } else {
            char buf[32];
            int64_t s = nf_gguf_arr_int(kv, i);
            int_text(kv->elem_type, (uint64_t)s, s, buf, sizeof buf);
            bad += strcmp(buf, cJSON_GetArrayItem(text, (int)i)->valuestring) != 0;
        }
    }
    CHECK_MSG(bad == 0, "%s: %d elements differ from gguf-py's", kv->key, bad);
}

static void check_kvs(const nf_gguf *g, const cJSON *exp)
{
    CHECK_EQ_INT(nf_gguf_kv_count(g), cJSON_GetArraySize(exp));
    for (const cJSON *e = exp->child; e; e = e->next) {
        const nf_gguf_kv *kv = nf_gguf_find_kv(g, e->string);
        CHECK_MSG(kv != NULL, "key '%s' missing", e->string);
        if (!kv) continue;
        CHECK_MSG(strcmp(nf_gguf_type_name(kv->type), get(e, "type")->valuestring) == 0, "%s: type %s, gguf-py %s",
                  e->string, nf_gguf_type_name(kv->type), get(e, "type")->valuestring);
        if (kv->type == NF_GGUF_ARRAY) check_array(kv, e);
        else check_scalar(kv, e);
    }
}

static void check_tensors(const nf_gguf *g, const cJSON *exp, int metadata_only)
{
    CHECK_EQ_INT(nf_gguf_tensor_count(g), cJSON_GetArraySize(exp));
    size_t i = 0;
    for (const cJSON *e = exp->child; e; e = e->next, i++) {
        const char *name = get(e, "name")->valuestring;
        const nf_gguf_tensor *t = nf_gguf_find_tensor(g, name);
        CHECK_MSG(t != NULL && t == nf_gguf_tensor_at(g, i), "tensor '%s' not found in file order", name);
        if (!t) continue;
        const cJSON *ne = get(e, "ne");
        CHECK_EQ_INT(t->n_dims, cJSON_GetArraySize(ne));
        for (uint32_t d = 0; d < NF_GGUF_MAX_DIMS; d++)
            CHECK_EQ_U64(t->ne[d], d < t->n_dims ? (uint64_t)cJSON_GetArrayItem(ne, (int)d)->valuedouble : 1);
        CHECK_EQ_INT(t->ggml_type, num(e, "type"));
        CHECK_EQ_U64(t->offset, num(e, "offset"));
        CHECK_EQ_U64(t->nbytes, num(e, "nbytes"));
        CHECK_EQ_U64((uint64_t)((const unsigned char *)t->data - (const unsigned char *)nf_gguf_tensor_at(g, 0)->data),
                     t->offset - nf_gguf_tensor_at(g, 0)->offset);
        CHECK_MSG(nf_fnv1a64(t->data, t->nbytes) == strtoull(get(e, "fnv1a64")->valuestring, NULL, 16),
                  "tensor '%s': bytes differ from gguf-py's", name);
        if (!metadata_only) {
            CHECK_MSG(t->codec && t->codec->ggml_type == (int)t->ggml_type, "tensor '%s': codec", name);
            /* ggml's type names are gguf-py's enum names, lower-cased except the K */
            char lower[16] = {0};
            const char *tn = get(e, "type_name")->valuestring;
            for (size_t k = 0; k < sizeof lower - 1 && tn[k]; k++)
                lower[k] = tn[k] >= 'A' && tn[k] <= 'Z' && tn[k] != 'K' ? (char)(tn[k] + 32) : tn[k];
            CHECK_MSG(strcmp(t->type_name, lower) == 0, "%s vs %s", t->type_name, lower);
        }
    }
}

static void test_file(const cJSON *m, const char *file, unsigned flags)
{
    char path[512];
    snprintf(path, sizeof path, SRC "/%s", file);
    const cJSON *e = get(m, file);
    nf_error err = {0};
    nf_gguf *g = NULL;
    CHECK_MSG(nf_gguf_open(path, flags, &g, &err) == NF_OK, "%s: %s", file, err.msg);
    if (!g) return;
    CHECK_EQ_INT(nf_gguf_version(g), num(e, "version"));
    CHECK_EQ_INT(nf_gguf_alignment(g), num(e, "alignment"));
    CHECK_EQ_U64(nf_gguf_data_offset(g), num(e, "data_offset"));
    check_kvs(g, get(e, "kv"));
    check_tensors(g, get(e, "tensors"), flags & NF_GGUF_METADATA_ONLY);
    nf_gguf_close(g);
}

/* The typed lookups and their errors, on model.gguf. */
static void test_lookups(void)
{
    nf_error err = {0};
    nf_gguf *g = NULL;
    CHECK_EQ_INT(nf_gguf_open(SRC "/model.gguf", 0, &g, &err), NF_OK);
    if (!g) return;
    int64_t i;
    uint32_t u;
    double f;
    int b;
    nf_gguf_str s;
    const nf_gguf_kv *a;
    CHECK(nf_gguf_get_u32(g, "llama.context_length", &u, &err) == NF_OK && u == 4096);
    CHECK(nf_gguf_get_int(g, "test.i64", &i, &err) == NF_OK && i == INT64_MIN);
    CHECK(nf_gguf_get_int(g, "test.u8", &i, &err) == NF_OK && i == 255);
    CHECK(nf_gguf_get_float(g, "llama.rope.freq_base", &f, &err) == NF_OK && f == 1000000.0);
    CHECK(nf_gguf_get_float(g, "test.f32", &f, &err) == NF_OK && f == (double)0.1f);
    CHECK(nf_gguf_get_bool(g, "test.bool", &b, &err) == NF_OK && b == 1);
    CHECK(nf_gguf_get_str(g, "tokenizer.ggml.model", &s, &err) == NF_OK && str_eq(s, "gpt2"));
    CHECK(nf_gguf_get_array(g, "tokenizer.ggml.tokens", NF_GGUF_STRING, &a, &err) == NF_OK && a->n == 48);
    CHECK(str_eq(nf_gguf_arr_str(a, 5), "\xe4\xb8\x96\xe7\x95\x8c") && str_eq(nf_gguf_arr_str(a, 3), ""));
    CHECK(nf_gguf_get_array(g, "tokenizer.ggml.token_type", NF_GGUF_INT64, &a, &err) == NF_OK && a->n == 48);
    CHECK(nf_gguf_arr_int(a, 1) == 3);
    CHECK(nf_gguf_get_array(g, "test.arr_i8", NF_GGUF_INT64, &a, &err) == NF_OK && nf_gguf_arr_int(a, 0) == -128);
    CHECK(nf_gguf_get_array(g, "test.arr_f64", NF_GGUF_FLOAT64, &a, &err) == NF_OK && nf_gguf_arr_float(a, 1) == -1e-300);
    /* errors name the key and both types */
    CHECK_EQ_INT(nf_gguf_get_int(g, "tokenizer.ggml.model", &i, &err), NF_ERR_FORMAT);
    CHECK_CONTAINS(err.msg, "key 'tokenizer.ggml.model' is a string value, expected an integer");
    CHECK_EQ_INT(nf_gguf_get_float(g, "test.u8", &f, &err), NF_ERR_FORMAT);
    CHECK_CONTAINS(err.msg, "key 'test.u8' is a uint8 value, expected a float");
    CHECK_EQ_INT(nf_gguf_get_str(g, "tokenizer.ggml.tokens", &s, &err), NF_ERR_FORMAT);
    CHECK_CONTAINS(err.msg, "key 'tokenizer.ggml.tokens' is an array of string, expected a string");
    CHECK_EQ_INT(nf_gguf_get_array(g, "tokenizer.ggml.tokens", NF_GGUF_FLOAT64, &a, &err), NF_ERR_FORMAT);
    CHECK_CONTAINS(err.msg, "is an array of string, expected an array of floats");
    CHECK_EQ_INT(nf_gguf_get_array(g, "test.u32", NF_GGUF_INT64, &a, &err), NF_ERR_FORMAT);
    CHECK_CONTAINS(err.msg, "key 'test.u32' is a uint32 value, expected an array of integers");
    CHECK_EQ_INT(nf_gguf_get_bool(g, "test.u8", &b, &err), NF_ERR_FORMAT);
    CHECK_EQ_INT(nf_gguf_get_u32(g, "test.i32", &u, &err), NF_ERR_FORMAT);
    CHECK_CONTAINS(err.msg, "key 'test.i32' = -2147483648 is out of the uint32 range");
    CHECK_EQ_INT(nf_gguf_get_u32(g, "test.u64", &u, &err), NF_ERR_FORMAT);
    CHECK_EQ_INT(nf_gguf_get_int(g, "test.u64", &i, &err), NF_ERR_FORMAT);
    CHECK_CONTAINS(err.msg, "key 'test.u64' = 18446744073709551615 is out of the int64 range");
    CHECK_EQ_INT(nf_gguf_get_u32(g, "llama.block_count", &u, &err), NF_ERR_FORMAT);
    CHECK_CONTAINS(err.msg, "model.gguf: key 'llama.block_count' is missing");
    const nf_gguf_tensor *t;
    CHECK_EQ_INT(nf_gguf_get_tensor(g, "blk.7.attn_q.weight", &t, &err), NF_ERR_FORMAT);
    CHECK_CONTAINS(err.msg, "tensor 'blk.7.attn_q.weight' is missing");
    /* ne[0] is the row: the [3 experts][4 rows][64 cols] bank reads ne = {64, 4, 3} */
    CHECK(nf_gguf_get_tensor(g, "blk.0.ffn_gate_exps.weight", &t, &err) == NF_OK && t->ne[0] == 64 && t->ne[2] == 3);
    CHECK(nf_gguf_find_kv(g, "absent") == NULL && nf_gguf_find_tensor(g, "absent") == NULL);
    nf_gguf_close(g);
}

/* A type ggml knows but ninfer has no codec for (IQ2_XXS, tests/fixtures/gguf/bad_type.gguf):
 * refused by default with the type and tensor, readable (metadata, sizes from ggml's block
 * geometry) with NF_GGUF_METADATA_ONLY. iq4nl.gguf was that case before iq4_nl became an
 * import-only codec: it now opens in full, its tensor typed iq4_nl. */
static void test_unsupported_type(const cJSON *m)
{
    nf_error err = {0};
    nf_gguf *g = NULL;
    const char *bad = NF_TEST_DATA "/fixtures/gguf/bad_type.gguf";
    CHECK_EQ_INT(nf_gguf_open(bad, 0, &g, &err), NF_ERR_UNSUPPORTED);
    CHECK_CONTAINS(err.msg, "tensor 'token_embd.weight': ggml type 16 (iq2_xxs) is not supported");
    CHECK_CONTAINS(err.msg, "q4_k=12");
    CHECK_CONTAINS(err.msg, "iq4_nl=20");
    CHECK_EQ_INT(nf_gguf_open(bad, NF_GGUF_METADATA_ONLY, &g, &err), NF_OK);
    if (g) CHECK(nf_gguf_find_tensor(g, "token_embd.weight")->codec == NULL);
    nf_gguf_close(g);
    g = NULL;
    test_file(m, "iq4nl.gguf", 0);
    CHECK_EQ_INT(nf_gguf_open(SRC "/iq4nl.gguf", 0, &g, &err), NF_OK);
    const nf_gguf_tensor *t = g ? nf_gguf_find_tensor(g, "blk.0.ffn_down.weight") : NULL;
    CHECK(t && t->codec && t->codec->id == NF_CODEC_IQ4_NL && t->ne[0] == 64);
    nf_gguf_close(g);
}

/* ---- corruption ---- */

typedef struct image {
    unsigned char *b;
    size_t n;
} image;

static void put_le(unsigned char *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* Opens a patched copy and expects `code` with both needles in the message. */
static void expect(const image *im, size_t at, uint64_t v, int width, unsigned flags, nf_status code,
                   const char *needle1, const char *needle2)
{
    unsigned char *c = malloc(im->n);
    memcpy(c, im->b, im->n);
    put_le(c + at, v, width);
    const char *p = write_tmp("patched.gguf", c, im->n);
    free(c);
    nf_error err = {0};
    nf_gguf *g = NULL;
    nf_status s = nf_gguf_open(p, flags, &g, &err);
    CHECK_MSG(s == code, "patch %" PRIu64 " at %zu: status %d, expected %d (%s)", v, at, s, code, err.msg);
    if (code != NF_OK) {
        CHECK_CONTAINS(err.msg, "patched.gguf");
        CHECK_CONTAINS(err.msg, needle1);
        if (needle2) CHECK_CONTAINS(err.msg, needle2);
    }
    nf_gguf_close(g);
}

static const cJSON *tensor_entry(const cJSON *file, const char *name)
{
    for (const cJSON *e = get(file, "tensors")->child; e; e = e->next)
        if (strcmp(get(e, "name")->valuestring, name) == 0) return e;
    return NULL;
}

static void test_patches(const cJSON *m)
{
    image im;
    im.b = read_all(SRC "/model.gguf", &im.n);
    if (!im.b) return;
    const cJSON *f = get(m, "model.gguf");
    const cJSON *k = tensor_entry(f, "blk.0.attn_k.weight"), *q = tensor_entry(f, "blk.0.attn_q.weight");
    size_t ty = num(k, "type_field_offset"), off = ty + 4, info = num(k, "info_offset");
    size_t name_len = strlen("blk.0.attn_k.weight");

    expect(&im, 0, 0x58554747, 4, 0, NF_ERR_FORMAT, "not a GGUF file", NULL);
    expect(&im, 4, 1, 4, 0, NF_ERR_VERSION, "GGUF version 1 is not supported", NULL);
    expect(&im, 4, 4, 4, 0, NF_ERR_VERSION, "GGUF version 4", NULL);
    expect(&im, 4, 0x03000000, 4, 0, NF_ERR_UNSUPPORTED, "big-endian", NULL);
    expect(&im, 8, (uint64_t)1 << 60, 8, 0, NF_ERR_FORMAT, "tensor count 1152921504606846976 cannot fit", NULL);
    expect(&im, 16, UINT64_MAX, 8, 0, NF_ERR_FORMAT, "kv count 18446744073709551615 cannot fit", NULL);
    /* tensor infos */
    expect(&im, ty, 99, 4, 0, NF_ERR_UNSUPPORTED, "tensor 'blk.0.attn_k.weight': ggml type 99 (not a ggml type)", NULL);
    expect(&im, ty, 99, 4, NF_GGUF_METADATA_ONLY, NF_OK, NULL, NULL);
    expect(&im, ty, 20, 4, NF_GGUF_METADATA_ONLY, NF_OK, NULL, NULL);
    expect(&im, ty, 12, 4, 0, NF_ERR_FORMAT, "tensor 'blk.0.attn_k.weight': row length ne[0] = 64", "q4_K block (256");
    expect(&im, off, num(k, "offset") + 1, 8, 0, NF_ERR_FORMAT, "tensor 'blk.0.attn_k.weight': data offset",
           "not a multiple of the alignment 32");
    expect(&im, off, (uint64_t)1 << 62, 8, 0, NF_ERR_FORMAT, "tensor 'blk.0.attn_k.weight'",
           "run past the end of the data section");
    expect(&im, off, UINT64_MAX - 31, 8, 0, NF_ERR_FORMAT, "tensor 'blk.0.attn_k.weight'", "run past the end");
    expect(&im, off, num(q, "offset"), 8, 0, NF_ERR_FORMAT, "'blk.0.attn_q.weight'", "'blk.0.attn_k.weight'");
    expect(&im, info + 8 + name_len, 5, 4, 0, NF_ERR_FORMAT, "tensor info #3 'blk.0.attn_k.weight'", "n_dims is 5");
    expect(&im, info + 8 + name_len + 4, 63, 8, 0, NF_ERR_FORMAT, "ne[0] = 63", "q8_0 block (32");
    expect(&im, info + 8 + name_len + 12, (uint64_t)1 << 40, 8, 0, NF_ERR_FORMAT, "tensor 'blk.0.attn_k.weight'",
           "run past the end");
    expect(&im, info + 8 + name_len + 12, (uint64_t)1 << 63, 8, 0, NF_ERR_FORMAT, "ne[1]", "negative");
    expect(&im, info + 8 + name_len + 12, (uint64_t)1 << 60, 8, 0, NF_ERR_FORMAT, "ne[1]", "overflows");
    expect(&im, info, UINT64_MAX, 8, 0, NF_ERR_FORMAT, "tensor info #3", "tensor name at offset");
    expect(&im, info + 8 + 11, 'q', 1, 0, NF_ERR_FORMAT, "tensor name 'blk.0.attn_q.weight' appears twice", NULL);
    expect(&im, info + 8 + 11, 0, 1, 0, NF_ERR_FORMAT, "tensor info #3", "contains a NUL byte");
    expect(&im, info, 0, 8, 0, NF_ERR_FORMAT, "tensor info #3", "is empty");

    /* kvs: key length at offset, then key, value type, value */
    const cJSON *kv = get(f, "kv");
    size_t u8 = num(get(kv, "test.u8"), "offset"), tok = num(get(kv, "tokenizer.ggml.tokens"), "offset");
    size_t bo = num(get(kv, "test.bool"), "offset"), arr = num(get(kv, "test.arr_u32"), "offset");
    size_t i8 = num(get(kv, "test.i8"), "offset");
    size_t tok_type = tok + 8 + strlen("tokenizer.ggml.tokens");
    expect(&im, u8 + 8 + 7, 13, 4, 0, NF_ERR_FORMAT, "kv #", "'test.u8'");
    expect(&im, u8 + 8 + 7, 13, 4, 0, NF_ERR_FORMAT, "value type 13", "is not a GGUF type");
    expect(&im, bo + 8 + 9 + 4, 2, 1, 0, NF_ERR_FORMAT, "'test.bool'", "bool value at offset");
    expect(&im, tok_type + 4, NF_GGUF_ARRAY, 4, 0, NF_ERR_UNSUPPORTED, "'tokenizer.ggml.tokens'", "nested arrays");
    expect(&im, tok_type + 4, 77, 4, 0, NF_ERR_FORMAT, "'tokenizer.ggml.tokens'", "element type 77");
    expect(&im, tok_type + 8, (uint64_t)1 << 40, 8, 0, NF_ERR_FORMAT, "'tokenizer.ggml.tokens'", "strings at offset");
    expect(&im, tok_type + 16, UINT64_MAX, 8, 0, NF_ERR_FORMAT, "'tokenizer.ggml.tokens'", "element 0");
    expect(&im, arr + 8 + 12 + 8, (uint64_t)1 << 62, 8, 0, NF_ERR_FORMAT, "'test.arr_u32'", "runs past the end");
    expect(&im, i8 + 8 + 5, 'u', 1, 0, NF_ERR_FORMAT, "key 'test.u8' appears twice", NULL);
    expect(&im, u8, (uint64_t)1 << 50, 8, 0, NF_ERR_FORMAT, "kv #", "key at offset");
    free(im.b);

    /* alignment: must be a uint32 power of two */
    im.b = read_all(SRC "/align64.gguf", &im.n);
    if (!im.b) return;
    size_t al = num(get(get(get(m, "align64.gguf"), "kv"), "general.alignment"), "offset");
    al += 8 + strlen("general.alignment");
    expect(&im, al + 4, 48, 4, 0, NF_ERR_FORMAT, "general.alignment = 48 is not a power of two", NULL);
    expect(&im, al + 4, 0, 4, 0, NF_ERR_FORMAT, "general.alignment = 0", NULL);
    expect(&im, al, NF_GGUF_INT32, 4, 0, NF_ERR_FORMAT, "'general.alignment' is int32, expected uint32", NULL);
    expect(&im, al + 4, 512, 4, 0, NF_ERR_FORMAT, "data offset 768 is not a multiple of the alignment 512", NULL);
    expect(&im, al + 4, 32, 4, 0, NF_OK, NULL, NULL); /* every offset here is a multiple of 32 too */
    free(im.b);
}

/* Every prefix shorter than the end of the last tensor is refused; every single-byte change in
 * the header is refused or yields tensors inside the file. ASan/UBSan watch both. */
static void test_truncation_and_flips(const cJSON *m)
{
    image im;
    im.b = read_all(SRC "/model.gguf", &im.n);
    if (!im.b) return;
    const cJSON *f = get(m, "model.gguf");
    uint64_t data = num(f, "data_offset"), end = 0;
    for (const cJSON *e = get(f, "tensors")->child; e; e = e->next)
        if (num(e, "offset") + num(e, "nbytes") > end) end = num(e, "offset") + num(e, "nbytes");
    end += data;
    int not_refused = 0;
    for (size_t len = 0; len < im.n; len++) {
        nf_error err = {0};
        nf_gguf *g = NULL;
        nf_status s = nf_gguf_open(write_tmp("cut.gguf", im.b, len), 0, &g, &err);
        if (len < end && (s == NF_OK || !strstr(err.msg, "cut.gguf"))) {
            not_refused++;
            fprintf(stderr, "truncation at %zu: not refused\n", len);
        }
        nf_gguf_close(g);
    }
    CHECK_EQ_INT(not_refused, 0);
    const unsigned char masks[] = {0x01, 0x04, 0x20, 0x80, 0xff};
    int bad = 0, opened = 0, errors = 0;
    for (size_t at = 0; at < data; at++) {
        for (size_t k = 0; k < sizeof masks; k++) {
            im.b[at] ^= masks[k];
            nf_error err = {0};
            nf_gguf *g = NULL;
            if (nf_gguf_open(write_tmp("flip.gguf", im.b, im.n), NF_GGUF_METADATA_ONLY, &g, &err) == NF_OK) {
                opened++;
                for (size_t i = 0; i < nf_gguf_tensor_count(g); i++) {
                    const nf_gguf_tensor *t = nf_gguf_tensor_at(g, i);
                    if (t->offset + nf_gguf_data_offset(g) + t->nbytes > im.n) bad++;
                    if (t->nbytes) bad += nf_fnv1a64(t->data, t->nbytes) == 0; /* touch every byte */
                }
                for (size_t i = 0; i < nf_gguf_kv_count(g); i++) {
                    const nf_gguf_kv *kv = nf_gguf_kv_at(g, i);
                    for (uint64_t j = 0; kv->elem_type == NF_GGUF_STRING && kv->type == NF_GGUF_ARRAY && j < kv->n; j++)
                        bad += nf_fnv1a64(nf_gguf_arr_str(kv, j).ptr, nf_gguf_arr_str(kv, j).len) == 0;
                }
            } else {
                errors++;
                if (!strstr(err.msg, "flip.gguf")) bad++;
            }
            nf_gguf_close(g);
            im.b[at] ^= masks[k];
        }
    }
    CHECK_EQ_INT(bad, 0);
    CHECK(errors > 0 && opened > 0);
    printf("header flips: %d refused, %d opened\n", errors, opened);
    free(im.b);
}

int main(void)
{
    /* thousands of small files are written: memory-backed /dev/shm when there is one */
    snprintf(tmpdir, sizeof tmpdir, "%s/nf_gguf_XXXXXX", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    cJSON *m = manifest();
    CHECK(m != NULL);
    if (m) {
        test_file(m, "model.gguf", 0);
        test_file(m, "align64.gguf", 0);
        test_file(m, "v2.gguf", 0);
        test_lookups();
        test_unsupported_type(m);
        test_patches(m);
        test_truncation_and_flips(m);
    }
    nf_error err = {0};
    nf_gguf *g = NULL;
    CHECK_EQ_INT(nf_gguf_open("/nonexistent.gguf", 0, &g, &err), NF_ERR_IO);
    cJSON_Delete(m);
    const char *files[] = {"patched.gguf", "cut.gguf", "flip.gguf"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char p[600];
        snprintf(p, sizeof p, "%s/%s", tmpdir, files[i]);
        unlink(p);
    }
    rmdir(tmpdir);
    return nf_test_report();
}

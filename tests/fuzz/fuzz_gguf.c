/* libFuzzer target for the GGUF reader: any byte string must either open (and then every kv,
 * array element and tensor byte the reader hands out is safe to read, and every typed getter
 * answers or fails with a message) or fail with a message naming the input. Both open modes run:
 * strict and NF_GGUF_METADATA_ONLY. Built by `make fuzz FUZZ_TARGET=gguf`; test_fuzz_regress_gguf
 * feeds the seeds and tests/fixtures/gguf/regress/ through this same function. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"

static volatile uint64_t sink;

/* A getter either answers (returns 1) or fails with a message; the message is cleared for the next. */
static int answered(nf_status s, nf_error *e)
{
    if (s != NF_OK && e->msg[0] == 0) abort();
    e->msg[0] = 0;
    return s == NF_OK;
}

/* The converter's way in: typed getters, which must agree with the kv's type or say why not. */
static void get_typed(const nf_gguf *g, const nf_gguf_kv *kv)
{
    nf_error e = {0};
    int64_t i;
    uint32_t u;
    double f;
    int b;
    nf_gguf_str str;
    if (answered(nf_gguf_get_int(g, kv->key, &i, &e), &e)) sink += (uint64_t)i;
    if (answered(nf_gguf_get_u32(g, kv->key, &u, &e), &e)) sink += u;
    if (answered(nf_gguf_get_float(g, kv->key, &f, &e), &e)) sink += (uint64_t)(f == f);
    if (answered(nf_gguf_get_bool(g, kv->key, &b, &e), &e)) sink += (uint64_t)b;
    if (answered(nf_gguf_get_str(g, kv->key, &str, &e), &e) && str.len) sink += (uint8_t)str.ptr[str.len - 1];
}

static void walk_array(const nf_gguf *g, const nf_gguf_kv *kv)
{
    static const nf_gguf_type want[] = {NF_GGUF_STRING, NF_GGUF_INT64, NF_GGUF_FLOAT64};
    for (size_t w = 0; w < 3; w++) {
        const nf_gguf_kv *a = NULL;
        nf_error e = {0};
        if (!answered(nf_gguf_get_array(g, kv->key, want[w], &a, &e), &e)) continue;
        if (a != kv) abort();
        for (uint64_t k = 0; k < a->n; k++) {
            if (want[w] == NF_GGUF_STRING) {
                nf_gguf_str s = nf_gguf_arr_str(a, k);
                if (s.len) sink += (uint8_t)s.ptr[s.len - 1];
            } else if (want[w] == NF_GGUF_INT64) {
                sink += (uint64_t)nf_gguf_arr_int(a, k);
            } else {
                double d = nf_gguf_arr_float(a, k);
                sink += (uint64_t)(d == d);
            }
        }
    }
}

static void walk_tensors(const nf_gguf *g)
{
    nf_error e = {0};
    for (size_t i = 0; i < nf_gguf_tensor_count(g); i++) {
        const nf_gguf_tensor *t = nf_gguf_tensor_at(g, i), *f = NULL;
        if (nf_gguf_find_tensor(g, t->name) != t || nf_gguf_get_tensor(g, t->name, &f, &e) || f != t) abort();
        sink += strlen(t->type_name) + t->n_elems;
        /* every ggml type takes more than one bit per element: fewer bytes means the size wrapped */
        if (strcmp(t->type_name, "unknown") != 0 && t->nbytes < t->n_elems / 8) abort();
        if (t->nbytes) { /* first and last byte: ASan sees a tensor that leaves the input */
            const uint8_t *d = t->data;
            sink += d[0] + d[t->nbytes - 1];
        }
    }
    const nf_gguf_tensor *embd;
    (void)answered(nf_gguf_get_tensor(g, "token_embd.weight", &embd, &e), &e);
}

/* What plan_gguf.c asks of a source: the architecture string, then <arch>.* sizes. */
static void converter_keys(const nf_gguf *g)
{
    static const char *const keys[] = {"embedding_length", "block_count", "attention.head_count",
                                       "attention.head_count_kv", "rope.freq_base", "rope.scaling.factor",
                                       "expert_count", "context_length"};
    nf_error e = {0};
    nf_gguf_str a;
    if (!answered(nf_gguf_get_str(g, "general.architecture", &a, &e), &e)) return;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        char key[160];
        uint32_t u;
        double f;
        snprintf(key, sizeof key, "%.*s.%s", (int)(a.len < 63 ? a.len : 63), a.ptr, keys[i]);
        if (answered(nf_gguf_get_u32(g, key, &u, &e), &e)) sink += u;
        if (answered(nf_gguf_get_float(g, key, &f, &e), &e)) sink += (uint64_t)(f > 0);
    }
}

static void walk(const nf_gguf *g)
{
    sink += nf_gguf_version(g) + nf_gguf_alignment(g) + nf_gguf_data_offset(g) + strlen(nf_gguf_path(g));
    for (size_t i = 0; i < nf_gguf_kv_count(g); i++) {
        const nf_gguf_kv *kv = nf_gguf_kv_at(g, i);
        if (nf_gguf_find_kv(g, kv->key) != kv) abort();
        sink += strlen(nf_gguf_type_name(kv->type));
        if (kv->type == NF_GGUF_ARRAY) walk_array(g, kv);
        else get_typed(g, kv);
    }
    walk_tensors(g);
    converter_keys(g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    for (unsigned flags = 0; flags <= NF_GGUF_METADATA_ONLY; flags += NF_GGUF_METADATA_ONLY) {
        nf_gguf *g = NULL;
        nf_error e = {0};
        if (nf_gguf_open_memory(data, size, "fuzz.gguf", flags, &g, &e) == NF_OK) {
            walk(g);
            nf_gguf_close(g);
        } else if (g != NULL || !strstr(e.msg, "fuzz.gguf")) {
            abort(); /* an error must name the input, and leave nothing open */
        }
    }
    return 0;
}

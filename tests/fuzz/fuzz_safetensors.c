/* libFuzzer target for the safetensors reader: any byte string must either open (and then every
 * tensor's bytes, name, shape and the __metadata__ strings are safe to read, lookups find what the
 * table lists, the table is in offset order without overlap) or fail with a message naming the
 * input. Built by `make fuzz FUZZ_TARGET=safetensors`; test_fuzz_regress_safetensors feeds the
 * seeds and tests/fixtures/sources/regress/safetensors/ through this same function. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format/safetensors.h"

static volatile uint64_t sink;

static void walk_tensor(const nf_safetensors *st, const nf_st_tensor *t, uint64_t *end)
{
    if (nf_safetensors_find(st, t->name) == NULL) abort();
    sink += strlen(t->name) + strlen(nf_st_dtype_name(t->dtype));
    uint64_t n = 1;
    for (int d = 0; d < t->n_dims; d++) n *= t->shape[d];
    if (n != t->n_elems || t->nbytes != n * nf_st_dtype_size(t->dtype)) abort();
    if (!t->nbytes) return;
    if (t->file_offset < *end) abort(); /* the reader promised no overlap, in offset order */
    *end = t->file_offset + t->nbytes;
    const uint8_t *d = t->data; /* first and last byte: ASan sees a tensor that leaves the input */
    sink += d[0] + d[t->nbytes - 1];
}

static void walk(const nf_safetensors *st)
{
    uint64_t end = 0;
    sink += strlen(nf_safetensors_path(st));
    for (size_t i = 0; i < nf_safetensors_count(st); i++) walk_tensor(st, nf_safetensors_at(st, i), &end);
    if (nf_safetensors_at(st, nf_safetensors_count(st)) != NULL) abort();
    const char *v = nf_safetensors_metadata(st, "format"); /* what transformers writes */
    if (v) sink += strlen(v);
    if (nf_safetensors_find(st, "") || nf_safetensors_find(st, "model.embed_tokens.weight")) sink++;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    nf_safetensors *st = NULL;
    nf_error e = {0};
    if (nf_safetensors_open_memory(data, size, "fuzz.safetensors", &st, &e) == NF_OK) {
        walk(st);
        nf_safetensors_close(st);
    } else if (st != NULL || !strstr(e.msg, "fuzz.safetensors")) {
        abort(); /* an error must name the input, and leave nothing open */
    }
    return 0;
}

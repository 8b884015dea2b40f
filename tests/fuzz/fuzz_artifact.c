/* libFuzzer target for the .nf reader: any byte string must either open (and then every pointer
 * the reader hands out is safe to read in full) or fail with a non-empty message. Built by
 * `make fuzz` (NF_FUZZ=ON, clang, -fsanitize=fuzzer,address,undefined). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codec/nvfp4.h"
#include "format/artifact.h"

static volatile uint64_t sink;

static void sink_f32(float f)
{
    uint32_t v;
    memcpy(&v, &f, 4);
    sink += v;
}

/* Reads everything an opened artifact exposes, so ASan sees any pointer that is out of bounds. */
static void walk(const nf_artifact *a)
{
    nf_error e;
    for (size_t i = 0; i < nf_artifact_n_meta(a); i++) {
        const nf_meta *m = nf_artifact_meta(a, i);
        sink += strlen(m->key);
        if (nf_artifact_find_meta(a, m->key) != m) abort();
        if (m->type == NF_META_STRING) sink += (uint8_t)m->str[m->count];
        if (m->type != NF_META_ARRAY) continue;
        if (m->elem_type == NF_META_STRING) {
            for (uint64_t k = 0; k < m->count; k++) sink += (uint8_t)m->strs[k][m->str_lens[k]];
        } else if (m->count) {
            const uint8_t *b = m->elems;
            sink += b[0];
        }
    }
    for (size_t i = 0; i < nf_artifact_n_tensors(a); i++) {
        const nf_tensor *t = nf_artifact_tensor(a, i);
        if (nf_artifact_find_tensor(a, t->desc.name) != t) abort();
        int checked;
        (void)nf_tensor_verify(t, &checked, &e); /* reads the whole payload */
        for (uint32_t k = 0; k < t->desc.n_input_divisors; k++) sink_f32(t->desc.input_divisors[k]);
        if (t->codec->id != NF_CODEC_NVFP4) continue;
        nf_nvfp4_planes p;
        if (nf_nvfp4_view(t->data, t->layout.payload_bytes, t->layout.rows, t->layout.cols, t->desc.divisors, &p,
                          &e))
            abort(); /* the reader accepted it: the view must agree */
        if (t->layout.cols <= 4096) {
            float y[4096];
            nf_nvfp4_dequantize_row(&p, t->layout.rows - 1, y);
            sink_f32(y[0]);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    for (unsigned flags = 0; flags < 2; flags++) {
        nf_artifact *a = NULL;
        nf_error e = {0};
        nf_status s = nf_artifact_open_memory(data, size, "fuzz", flags ? NF_ARTIFACT_SKIP_INDEX_CHECKSUM : 0, &a, &e);
        if (s == NF_OK) {
            walk(a);
            nf_artifact_close(a);
        } else if (e.msg[0] == 0 || a != NULL) {
            abort(); /* an error must say what is wrong, and leave nothing open */
        }
    }
    return 0;
}

/* Round trip: an artifact holding every codec (nvfp4 with divisors = 1 and > 1, with and without
 * allow_a4) and metadata of every type is written, read back and compared bit for bit; the three
 * ways of streaming a payload give byte-identical files; the raw bytes obey docs/artifact.md
 * (checked here by hand, not through the reader); typed lookups fail by name. */
#include "test_artifact_util.h" /* first: it sets _POSIX_C_SOURCE */
#include "nf_test.h"

#include "base/fnv.h"

static ta_tensor ts[32];
static int nts;

static uint32_t le32(const uint8_t *p) { return (uint32_t)p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t le64(const uint8_t *p) { return le32(p) | (uint64_t)le32(p + 4) << 32; }

static void check_tensor(const nf_artifact *a, const ta_tensor *want)
{
    const nf_tensor *t = nf_artifact_find_tensor(a, want->name);
    CHECK_MSG(t != NULL, "tensor %s missing", want->name);
    if (!t) return;
    CHECK(strcmp(t->desc.name, want->name) == 0);
    CHECK_EQ_INT(t->desc.codec, want->d.codec);
    CHECK(t->codec == nf_codec_get(want->d.codec));
    CHECK_EQ_INT(t->desc.n_dims, want->d.n_dims);
    for (uint32_t i = 0; i < want->d.n_dims; i++) CHECK_EQ_U64(t->desc.dims[i], want->d.dims[i]);
    CHECK_EQ_INT(t->desc.divisors, want->d.divisors ? want->d.divisors : 1);
    CHECK_EQ_INT(t->desc.flags, want->d.flags | NF_TENSOR_HAS_CHECKSUM);
    CHECK_EQ_INT(t->desc.n_input_divisors, want->d.n_input_divisors);
    for (uint32_t i = 0; i < want->d.n_input_divisors; i++)
        CHECK(memcmp(&t->desc.input_divisors[i], &want->in_div[i], 4) == 0);
    CHECK_EQ_U64(t->layout.payload_bytes, want->bytes);
    CHECK_EQ_U64(t->offset % 4096, 0);
    CHECK_MSG(memcmp(t->data, want->payload, (size_t)want->bytes) == 0, "%s payload differs", want->name);
    /* The checksum is FNV-1a 64 of the payload, computed here from the original bytes. */
    CHECK_EQ_U64(t->checksum, nf_fnv1a64(want->payload, (size_t)want->bytes));
    int checked = 0;
    nf_error e;
    CHECK(nf_tensor_verify(t, &checked, &e) == NF_OK && checked == 1);
    if (want->d.codec != NF_CODEC_NVFP4) {
        CHECK_EQ_INT(t->layout.n_planes, 1);
        return;
    }
    /* nvfp4: the planes are the codec's layout, and the divisor words read back are the ones the
     * quantizer chose for each share (they differ across shares). */
    nf_nvfp4_layout nl;
    CHECK(nf_nvfp4_layout_of(t->layout.rows, t->layout.cols, t->desc.divisors, &nl, &e) == NF_OK);
    CHECK_EQ_INT(t->layout.n_planes, 3);
    CHECK_EQ_U64(t->layout.planes[NF_PLANE_SCALES].offset, nl.scale_offset);
    CHECK_EQ_U64(t->layout.planes[NF_PLANE_SCALES].bytes, nl.scale_bytes);
    CHECK_EQ_U64(t->layout.planes[NF_PLANE_DIVISORS].offset, nl.divisor_offset);
    CHECK_EQ_U64(t->layout.planes[NF_PLANE_DIVISORS].bytes, 4ull * t->desc.divisors);
    nf_nvfp4_planes p;
    CHECK(nf_nvfp4_view(t->data, t->layout.payload_bytes, t->layout.rows, t->layout.cols, t->desc.divisors, &p, &e) ==
          NF_OK);
    for (uint32_t d = 1; d < t->desc.divisors; d++)
        CHECK_MSG(nf_nvfp4_row_divisor(&p, d * (t->layout.rows / t->desc.divisors)) !=
                      nf_nvfp4_row_divisor(&p, (d - 1) * (t->layout.rows / t->desc.divisors)),
                  "%s: divisor words %u and %u are equal", want->name, d - 1, d);
}

static void check_metadata(const nf_artifact *a)
{
    nf_error e;
    const char *s;
    size_t n;
    uint32_t u;
    int32_t i32;
    uint64_t u64;
    int64_t i64;
    float f;
    double d;
    int b;
    CHECK(nf_artifact_get_str(a, "general.architecture", &s, &n, &e) == NF_OK && n == 9 && !strcmp(s, "qwen3_moe"));
    CHECK(nf_artifact_get_u32(a, "model.n_layers", &u, &e) == NF_OK && u == 48);
    CHECK(nf_artifact_get_i32(a, "model.i32", &i32, &e) == NF_OK && i32 == -5);
    CHECK(nf_artifact_get_u64(a, "model.u64", &u64, &e) == NF_OK && u64 == 0xfedcba9876543210ULL);
    CHECK(nf_artifact_get_i64(a, "provenance.date_unix", &i64, &e) == NF_OK && i64 == -1234567890123LL);
    CHECK(nf_artifact_get_f32(a, "model.rms_eps", &f, &e) == NF_OK && f == 1e-6f);
    CHECK(nf_artifact_get_f64(a, "model.rope_theta", &d, &e) == NF_OK && d == 1000000.0);
    CHECK(nf_artifact_get_bool(a, "model.norm_topk_prob", &b, &e) == NF_OK && b == 1);
    CHECK(nf_artifact_get_bool(a, "model.false", &b, &e) == NF_OK && b == 0);
    CHECK(nf_artifact_get_str(a, "test.nul_string", &s, &n, &e) == NF_OK && n == 3 && !memcmp(s, "x\0y", 4));
    CHECK(nf_artifact_get_str(a, "test.empty", &s, &n, &e) == NF_OK && n == 0 && s[0] == 0);
    CHECK(nf_artifact_get_int(a, "model.n_layers", &i64, &e) == NF_OK && i64 == 48);
    CHECK(nf_artifact_get_int(a, "model.i32", &i64, &e) == NF_OK && i64 == -5);
    CHECK(nf_artifact_get_int(a, "model.u64", &i64, &e) == NF_ERR_FORMAT);
    CHECK_CONTAINS(e.msg, "does not fit");

    const char *const *strs;
    const uint32_t *lens;
    CHECK(nf_artifact_get_str_array(a, "tokenizer.vocab", &strs, &lens, &n, &e) == NF_OK && n == 5);
    if (n == 5) {
        CHECK(!strcmp(strs[0], "a") && !strcmp(strs[2], "") && lens[2] == 0);
        CHECK(!strcmp(strs[3], "\xc4\xa0the") && lens[3] == 5 && !strcmp(strs[4], "<|im_start|>"));
    }
    const int32_t *iv;
    CHECK(nf_artifact_get_i32_array(a, "tokenizer.token_types", &iv, &n, &e) == NF_OK && n == 5 && iv[3] == -7 &&
          iv[4] == 0x7fffffff);
    const uint32_t *uv;
    CHECK(nf_artifact_get_u32_array(a, "test.u32s", &uv, &n, &e) == NF_OK && n == 2 && uv[1] == 4294967295u);
    const int64_t *lv;
    CHECK(nf_artifact_get_i64_array(a, "test.i64s", &lv, &n, &e) == NF_OK && n == 3 && lv[1] == INT64_MIN &&
          lv[2] == INT64_MAX);
    const float *fv;
    CHECK(nf_artifact_get_f32_array(a, "test.f32s", &fv, &n, &e) == NF_OK && n == 3 && fv[0] == 0.5f &&
          signbit(fv[1]) && fv[2] == 1e-30f);
    const nf_meta *m = nf_artifact_find_meta(a, "test.f64s");
    CHECK(m && m->type == NF_META_ARRAY && m->elem_type == NF_META_F64 && m->count == 2 &&
          ((const double *)m->elems)[1] == -1e300);
    m = nf_artifact_find_meta(a, "test.bools");
    CHECK(m && m->elem_type == NF_META_BOOL && m->count == 3 && ((const uint8_t *)m->elems)[1] == 0 &&
          ((const uint8_t *)m->elems)[2] == 1);
    CHECK(nf_artifact_get_i32_array(a, "test.empty_i32s", &iv, &n, &e) == NF_OK && n == 0);

    /* Missing and wrongly typed keys are errors naming the key and both types. */
    CHECK(nf_artifact_get_u32(a, "model.nope", &u, &e) == NF_ERR_FORMAT);
    CHECK_CONTAINS(e.msg, "'model.nope' is missing");
    CHECK(nf_artifact_get_u32(a, "model.rms_eps", &u, &e) == NF_ERR_FORMAT);
    CHECK_CONTAINS(e.msg, "'model.rms_eps' is f32, expected u32");
    CHECK(nf_artifact_get_f32_array(a, "tokenizer.token_types", &fv, &n, &e) == NF_ERR_FORMAT);
    CHECK_CONTAINS(e.msg, "is array of i32, expected array of f32");
    CHECK(nf_artifact_get_str(a, "tokenizer.vocab", &s, &n, &e) == NF_ERR_FORMAT);
    CHECK_CONTAINS(e.msg, "is array of string, expected string");
    const nf_tensor *t;
    CHECK(nf_artifact_find_tensor(a, "no.such") == NULL);
    CHECK(nf_artifact_get_tensor(a, "no.such", &t, &e) == NF_ERR_FORMAT);
    CHECK_CONTAINS(e.msg, "no tensor named 'no.such'");
}

/* The header and index by hand, following docs/artifact.md, without the reader. */
static void check_raw(const char *path)
{
    size_t n;
    uint8_t *f = ta_read_file(path, &n);
    CHECK(f && n >= 4096);
    if (!f || n < 4096) return;
    CHECK(memcmp(f, "NINFER\x1a\n", 8) == 0);
    CHECK_EQ_INT(f[8] | f[9] << 8, 1);                   /* major */
    CHECK_EQ_INT(f[10] | f[11] << 8, 0);                 /* minor */
    CHECK_EQ_INT(le32(f + 12), 64);                      /* header_bytes */
    CHECK_EQ_INT(le32(f + 16), 4096);                    /* alignment */
    CHECK_EQ_U64(le64(f + 24), 4096);                    /* data_offset */
    uint64_t io = le64(f + 32), ib = le64(f + 40);
    CHECK_EQ_U64(io + ib, n);                            /* the index ends the file */
    CHECK_EQ_U64(io % 8, 0);
    CHECK_EQ_U64(le64(f + 48), nf_fnv1a64(f + io, (size_t)ib));
    CHECK(memcmp(f + io, "NFIX", 4) == 0);
    CHECK_EQ_INT(le32(f + io + 8), nts);
    /* Payload bytes sit at their offsets in the raw file. */
    nf_artifact *a;
    nf_error e;
    if (nf_artifact_open(path, &a, &e) == NF_OK) {
        for (size_t i = 0; i < nf_artifact_n_tensors(a); i++) {
            const nf_tensor *t = nf_artifact_tensor(a, i);
            CHECK(t->offset + t->layout.payload_bytes <= io);
            CHECK(memcmp(f + t->offset, ts[i].payload, (size_t)ts[i].bytes) == 0);
        }
        nf_artifact_close(a);
    }
    free(f);
}

typedef struct fill_ctx {
    const ta_tensor *t;
    uint64_t next;  /* the offset the writer must ask for next */
    int out_of_order;
} fill_ctx;

static nf_status fill(void *ctx, uint64_t off, void *buf, size_t n, nf_error *err)
{
    fill_ctx *c = ctx;
    (void)err;
    if (off != c->next) c->out_of_order = 1;
    memcpy(buf, c->t->payload + off, n);
    c->next = off + n;
    return NF_OK;
}

/* The same artifact through the fill callback and through begin/write/end in 7-byte chunks. */
static void write_streamed(const char *path, int mode)
{
    nf_artifact_writer *w;
    nf_error e;
    CHECK(nf_artifact_writer_open(path, &w, &e) == NF_OK);
    CHECK(ta_add_metadata(w, &e) == 0);
    for (int i = 0; i < nts; i++) {
        if (mode == 0) {
            fill_ctx c = {&ts[i], 0, 0};
            CHECK(nf_artifact_writer_add_tensor_fill(w, &ts[i].d, fill, &c, &e) == NF_OK);
            CHECK(!c.out_of_order && c.next == ts[i].bytes);
            continue;
        }
        CHECK(nf_artifact_writer_begin_tensor(w, &ts[i].d, &e) == NF_OK);
        for (uint64_t off = 0; off < ts[i].bytes; off += 7) {
            size_t k = ts[i].bytes - off < 7 ? (size_t)(ts[i].bytes - off) : 7;
            CHECK(nf_artifact_writer_write(w, ts[i].payload + off, k, &e) == NF_OK);
        }
        CHECK(nf_artifact_writer_end_tensor(w, &e) == NF_OK);
    }
    CHECK_MSG(nf_artifact_writer_finish(w, &e) == NF_OK, "%s", e.msg);
}

static void check_same_file(const char *a, const char *b)
{
    size_t na, nb;
    uint8_t *fa = ta_read_file(a, &na), *fb = ta_read_file(b, &nb);
    CHECK(fa && fb && na == nb && memcmp(fa, fb, na) == 0);
    free(fa);
    free(fb);
}

int main(void)
{
    char *dir = ta_mkdtemp();
    CHECK(dir != NULL);
    if (!dir) return nf_test_report();
    nts = ta_reference_tensors(ts);
    CHECK_MSG(nts == 19, "reference set has %d tensors (15 codecs + 4 nvfp4 expected)", nts);
    for (int i = 0; i < nts; i++) CHECK(ta_make_payload(&ts[i]) == 0);
    int allow_a4 = 0, multi_div = 0;
    for (int i = 0; i < nts; i++) {
        allow_a4 += (ts[i].d.flags & NF_TENSOR_ALLOW_A4) != 0;
        multi_div += ts[i].d.divisors > 1;
    }
    CHECK(allow_a4 == 2 && multi_div == 3);

    char path[256], p2[256], p3[256];
    snprintf(path, sizeof path, "%s/ref.nf", dir);
    CHECK(ta_write_reference(path, ts, nts) == 0);
    nf_artifact *a = NULL;
    nf_error e;
    CHECK_MSG(nf_artifact_open(path, &a, &e) == NF_OK, "%s", e.msg);
    if (a) {
        const nf_artifact_info *in = nf_artifact_get_info(a);
        CHECK(in->major == 1 && in->minor == 0 && in->alignment == 4096);
        CHECK_EQ_INT(nf_artifact_n_tensors(a), nts);
        CHECK_EQ_INT(nf_artifact_n_meta(a), 19);
        for (int i = 0; i < nts; i++) {
            check_tensor(a, &ts[i]);
            CHECK(strcmp(nf_artifact_tensor(a, (size_t)i)->desc.name, ts[i].name) == 0); /* file order kept */
        }
        check_metadata(a);
        size_t checked, bad;
        CHECK(nf_artifact_verify(a, &checked, &bad, &e) == NF_OK && checked == (size_t)nts && bad == 0);
        nf_artifact_close(a);
    }
    check_raw(path);

    snprintf(p2, sizeof p2, "%s/fill.nf", dir);
    snprintf(p3, sizeof p3, "%s/chunks.nf", dir);
    write_streamed(p2, 0);
    write_streamed(p3, 1);
    check_same_file(path, p2);
    check_same_file(path, p3);

    /* Without checksums: the flag is clear, the field zero, and verify counts nothing. */
    nf_artifact_writer *w;
    snprintf(p2, sizeof p2, "%s/nock.nf", dir);
    CHECK(nf_artifact_writer_open(p2, &w, &e) == NF_OK);
    nf_artifact_writer_set_checksums(w, 0);
    CHECK(nf_artifact_writer_add_tensor(w, &ts[0].d, ts[0].payload, ts[0].bytes, &e) == NF_OK);
    CHECK(nf_artifact_writer_finish(w, &e) == NF_OK);
    CHECK(nf_artifact_open(p2, &a, &e) == NF_OK);
    if (a) {
        size_t checked = 9;
        CHECK(nf_artifact_tensor(a, 0)->desc.flags == 0 && nf_artifact_tensor(a, 0)->checksum == 0);
        CHECK(nf_artifact_verify(a, &checked, NULL, &e) == NF_OK && checked == 0);
        nf_artifact_close(a);
    }
    /* An empty artifact is valid. */
    snprintf(p2, sizeof p2, "%s/empty.nf", dir);
    CHECK(nf_artifact_writer_open(p2, &w, &e) == NF_OK && nf_artifact_writer_finish(w, &e) == NF_OK);
    CHECK(nf_artifact_open(p2, &a, &e) == NF_OK && nf_artifact_n_tensors(a) == 0 && nf_artifact_n_meta(a) == 0);
    nf_artifact_close(a);
    /* ... and is exactly the minimal file docs/artifact.md describes. */
    size_t en;
    uint8_t *ef = ta_read_file(p2, &en);
    static const uint8_t head[16] = {'N', 'F', 'I', 'X'};
    CHECK(ef && en == 4112 && le64(ef + 32) == 4096 && le64(ef + 40) == 16 && memcmp(ef + 4096, head, 16) == 0 &&
          le64(ef + 48) == nf_fnv1a64(head, 16));
    free(ef);

    for (int i = 0; i < nts; i++) free(ts[i].payload);
    ta_rmdir(dir);
    return nf_test_report();
}

/* Every validation rule of docs/artifact.md, one malformed file each, refused with a message that
 * names the field, the tensor or metadata key and the offset. The files are built here byte by
 * byte from the specification (not by our writer), so any field can be given any value. */
#include "test_artifact_util.h" /* first: it sets _POSIX_C_SOURCE */
#include "nf_test.h"

#include "base/fnv.h"

/* ---- a byte buffer and the raw builder ------------------------------------------------------- */

typedef struct rb {
    uint8_t *p;
    size_t n, cap;
} rb;

static void rb_add(rb *b, const void *p, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
}
static void rb_u8(rb *b, uint8_t v) { rb_add(b, &v, 1); }
static void rb_u32(rb *b, uint32_t v)
{
    for (int i = 0; i < 4; i++) rb_u8(b, (uint8_t)(v >> 8 * i));
}
static void rb_u64(rb *b, uint64_t v)
{
    for (int i = 0; i < 8; i++) rb_u8(b, (uint8_t)(v >> 8 * i));
}
static void rb_f32(rb *b, float f)
{
    uint32_t v;
    memcpy(&v, &f, 4);
    rb_u32(b, v);
}
static void rb_strn(rb *b, const char *s, uint32_t n)
{
    rb_u32(b, n);
    rb_add(b, s, n);
    rb_u8(b, 0);
}
static void rb_str(rb *b, const char *s) { rb_strn(b, s, (uint32_t)strlen(s)); }

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> 8 * i);
}
static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> 8 * i);
}
static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* A tensor entry with every field settable. np < 0: planes from the codec's layout. bytes == 0:
 * the layout's size. offset == 0: the next 4096-aligned place. */
typedef struct rt {
    const char *name, *codec;
    uint32_t nd;
    uint64_t dims[4];
    uint32_t divisors, flags, nin;
    float in[8];
    int np;
    nf_tensor_plane planes[3];
    uint64_t offset, bytes;
    uint8_t nan_scale, zero_divisor; /* poison the nvfp4 payload */
} rt;

static void layout(const rt *t, uint64_t *bytes, nf_tensor_plane *pl, uint32_t *np)
{
    const nf_codec *c = nf_codec_by_name(t->codec);
    uint64_t rows = 1;
    for (uint32_t i = 0; i + 1 < t->nd && i < 4; i++) rows *= t->dims[i];
    uint64_t cols = t->nd && t->nd <= 4 ? t->dims[t->nd - 1] : 16;
    *bytes = 4096;
    *np = 1;
    pl[0] = (nf_tensor_plane){0, 4096};
    nf_error e;
    if (!c) return;
    if (c->id == NF_CODEC_NVFP4) {
        nf_nvfp4_layout l;
        if (nf_nvfp4_layout_of(rows, cols, t->divisors, &l, &e)) return;
        *bytes = l.payload_bytes;
        *np = 3;
        pl[0] = (nf_tensor_plane){0, l.data_bytes};
        pl[1] = (nf_tensor_plane){l.scale_offset, l.scale_bytes};
        pl[2] = (nf_tensor_plane){l.divisor_offset, 4ull * t->divisors};
    } else if (nf_codec_payload_bytes(c, rows, cols, 1, bytes, &e) == NF_OK) {
        pl[0].bytes = *bytes;
    }
}

/* Builds header + payloads + index; meta is a prebuilt metadata section of nm entries. */
static uint8_t *build(const rt *ts, int nt, const rb *meta, uint32_t nm, size_t *size)
{
    rb f = {0}, ix = {0};
    uint8_t zero[4096] = {0};
    rb_add(&f, zero, 4096);
    rb_add(&ix, "NFIX", 4);
    rb_u32(&ix, nm);
    rb_u32(&ix, (uint32_t)nt);
    rb_u32(&ix, 0);
    if (meta) rb_add(&ix, meta->p, meta->n);
    for (int i = 0; i < nt; i++) {
        const rt *t = &ts[i];
        uint64_t bytes;
        nf_tensor_plane pl[3];
        uint32_t np;
        layout(t, &bytes, pl, &np);
        uint64_t payload = bytes;
        while (f.n % 4096) rb_u8(&f, 0);
        uint64_t off = t->offset ? t->offset : f.n;
        if (!t->offset) { /* a valid payload at the next aligned place */
            size_t at = f.n;
            for (uint64_t k = 0; k < payload; k++) rb_u8(&f, 0);
            if (np == 3) {
                memset(f.p + at + pl[1].offset, 0x38, (size_t)pl[1].bytes); /* e4m3 1.0 */
                for (uint32_t d = 0; d < t->divisors; d++) {
                    float one = t->zero_divisor && d == t->divisors - 1 ? 0.0f : 1.0f;
                    memcpy(f.p + at + pl[2].offset + 4 * d, &one, 4);
                }
                if (t->nan_scale) f.p[at + pl[1].offset + 5] = 0x7f;
            }
        }
        rb_str(&ix, t->name);
        rb_str(&ix, t->codec);
        rb_u32(&ix, t->nd);
        for (uint32_t k = 0; k < t->nd && k < 4; k++) rb_u64(&ix, t->dims[k]);
        rb_u32(&ix, t->divisors);
        rb_u32(&ix, t->flags);
        rb_u32(&ix, t->nin);
        for (uint32_t k = 0; k < t->nin && k < 8; k++) rb_f32(&ix, t->in[k]);
        if (t->np >= 0) {
            rb_u32(&ix, (uint32_t)t->np);
            for (int k = 0; k < t->np; k++) {
                rb_u64(&ix, t->planes[k].offset);
                rb_u64(&ix, t->planes[k].bytes);
            }
        } else {
            rb_u32(&ix, np);
            for (uint32_t k = 0; k < np; k++) {
                rb_u64(&ix, pl[k].offset);
                rb_u64(&ix, pl[k].bytes);
            }
        }
        rb_u64(&ix, off);
        rb_u64(&ix, t->bytes ? t->bytes : bytes);
        rb_u64(&ix, 0);
    }
    while (f.n % 8) rb_u8(&f, 0);
    uint64_t io = f.n;
    rb_add(&f, ix.p, ix.n);
    memcpy(f.p, "NINFER\x1a\n", 8);
    f.p[8] = 1; /* major 1, minor 0 */
    put32(f.p + 12, 64);
    put32(f.p + 16, 4096);
    put64(f.p + 24, 4096);
    put64(f.p + 32, io);
    put64(f.p + 40, ix.n);
    put64(f.p + 48, nf_fnv1a64(ix.p, ix.n));
    free(ix.p);
    *size = f.n;
    return f.p;
}

/* After patching the index, make its checksum right again so the structural rule is what fails. */
static void fix_checksum(uint8_t *f)
{
    uint64_t io = get64(f + 32), ib = get64(f + 40);
    put64(f + 48, nf_fnv1a64(f + io, (size_t)ib));
}

/* The three good tensors every case starts from. */
static void good(rt *t)
{
    memset(t, 0, 3 * sizeof *t);
    t[0] = (rt){.name = "a.q8", .codec = "q8_0", .nd = 2, .dims = {4, 64}, .divisors = 1, .np = -1};
    t[1] = (rt){.name = "a.nv", .codec = "nvfp4", .nd = 2, .dims = {256, 64}, .divisors = 1, .np = -1};
    t[2] = (rt){.name = "a.bank", .codec = "nvfp4", .nd = 3, .dims = {2, 256, 64}, .divisors = 4,
                .flags = NF_TENSOR_ALLOW_A4, .nin = 2, .in = {10.0f, 20.0f}, .np = -1};
}

static nf_status open_buf(const uint8_t *f, size_t n, nf_error *e)
{
    /* A private exact-size copy: ASan then catches any read past the end. */
    uint8_t *copy = malloc(n ? n : 1);
    if (n) memcpy(copy, f, n);
    nf_artifact *a = NULL;
    nf_status s = nf_artifact_open_memory(copy, n, "t.nf", 0, &a, e);
    nf_artifact_close(a);
    free(copy);
    return s;
}

#define EXPECT_FAIL(f, n, code, ...)                                                                \
    do {                                                                                            \
        nf_error e_;                                                                                \
        nf_status s_ = open_buf(f, n, &e_);                                                         \
        CHECK_MSG(s_ == (code), "status %d, expected %d (%s)", (int)s_, (int)(code),                \
                  s_ ? e_.msg : "opened");                                                          \
        const char *needles_[] = {__VA_ARGS__};                                                     \
        for (size_t k_ = 0; s_ && k_ < sizeof needles_ / sizeof needles_[0]; k_++)                  \
            CHECK_CONTAINS(e_.msg, needles_[k_]);                                                   \
        if (s_) CHECK_CONTAINS(e_.msg, "t.nf: ");                                                   \
    } while (0)

/* Builds from tensors t and checks the refusal. */
#define EXPECT_TENSORS_FAIL(t, nt, ...)                                                             \
    do {                                                                                            \
        size_t n_;                                                                                  \
        uint8_t *f_ = build(t, nt, NULL, 0, &n_);                                                   \
        EXPECT_FAIL(f_, n_, NF_ERR_FORMAT, __VA_ARGS__);                                            \
        free(f_);                                                                                   \
    } while (0)

static void test_header(void)
{
    rt t[3];
    good(t);
    size_t n;
    uint8_t *f = build(t, 3, NULL, 0, &n);
    nf_error e;
    CHECK_MSG(open_buf(f, n, &e) == NF_OK, "the good file: %s", e.msg);

    EXPECT_FAIL(f, 0, NF_ERR_FORMAT, "0 bytes, too small");
    EXPECT_FAIL(f, 5, NF_ERR_FORMAT, "5 bytes, too small");
    EXPECT_FAIL(f, 11, NF_ERR_FORMAT, "truncated inside the header");
    EXPECT_FAIL(f, 40, NF_ERR_FORMAT, "truncated inside the 64-byte header");
    uint8_t *g = malloc(n);
#define PATCHED(stmt, ...)                                                                          \
    do {                                                                                            \
        memcpy(g, f, n);                                                                            \
        stmt;                                                                                       \
        EXPECT_FAIL(g, n, NF_ERR_FORMAT, __VA_ARGS__);                                              \
    } while (0)
    PATCHED(g[0] = 'M', "not a ninfer artifact", "magic is 4d 49");
    PATCHED((g[8] = 0, g[10] = 4), "format version 0.4 is not a valid version");
    PATCHED(put32(g + 12, 60), "header_bytes is 60");
    PATCHED(put32(g + 16, 4095), "alignment is 4095");
    PATCHED(put32(g + 16, 32), "alignment is 32");
    PATCHED(put32(g + 20, 1), "header flags 0x1");
    PATCHED(g[60] = 1, "reserved");
    PATCHED(put64(g + 24, 4097), "data_offset is 4097");
    PATCHED(put64(g + 24, 0), "data_offset is 0");
    PATCHED(put64(g + 32, n + 8), "index at offset", "truncated?");
    PATCHED(put64(g + 40, UINT64_MAX), "index at offset", "not inside the file");
    PATCHED(put64(g + 32, 8), "index at offset 8");
    PATCHED(g[48] ^= 1, "index checksum", "does not match");
    PATCHED(put64(g + 40, get64(g + 40) - 8), "8 unexpected bytes after the index");

    /* Newer major: refused as a version error naming both versions, even when truncated. */
    memcpy(g, f, n);
    g[8] = 2;
    g[10] = 3;
    EXPECT_FAIL(g, n, NF_ERR_VERSION, "format version 2.3", "reads format version 1");
    EXPECT_FAIL(g, 12, NF_ERR_VERSION, "format version 2.3");
    /* A newer minor of the same major is read. */
    memcpy(g, f, n);
    g[10] = 7;
    nf_artifact *a = NULL;
    CHECK(nf_artifact_open_memory(g, n, "t.nf", 0, &a, &e) == NF_OK && nf_artifact_get_info(a)->minor == 7);
    nf_artifact_close(a);

    /* Index head. */
    uint64_t io = get64(f + 32);
    PATCHED((g[io] = 'X', fix_checksum(g)), "does not start with \"NFIX\"");
    PATCHED((g[io + 12] = 1, fix_checksum(g)), "index reserved field is 0x1");
    PATCHED((put32(g + io + 8, 0xffffffffu), fix_checksum(g)), "4294967295 tensors cannot fit");
    PATCHED((put32(g + io + 8, 2), fix_checksum(g)), "unexpected bytes at the end of the index");
    PATCHED((put32(g + io + 8, 4), fix_checksum(g)), "tensor entry 3", "needs 4 bytes, but the index ends");
    free(g);
    free(f);
}

/* A file whose only content is one metadata entry (built by fn). */
static void meta_case(void (*fn)(rb *), uint32_t nm, nf_status code, const char *n1, const char *n2)
{
    rb m = {0};
    fn(&m);
    size_t n;
    uint8_t *f = build(NULL, 0, &m, nm, &n);
    if (code == NF_OK) {
        nf_error e;
        CHECK_MSG(open_buf(f, n, &e) == NF_OK, "%s", e.msg);
    } else {
        EXPECT_FAIL(f, n, code, n1, n2);
    }
    free(f);
    free(m.p);
}

static void m_ok(rb *m)
{
    rb_str(m, "k.u32");
    rb_u32(m, NF_META_U32);
    rb_u32(m, 7);
}
static void m_bad_type(rb *m)
{
    rb_str(m, "k.t");
    rb_u32(m, 42);
    rb_u32(m, 7);
}
static void m_bool2(rb *m)
{
    rb_str(m, "k.b");
    rb_u32(m, NF_META_BOOL);
    rb_u8(m, 2);
}
static void m_space_key(rb *m)
{
    rb_str(m, "k b");
    rb_u32(m, NF_META_U32);
    rb_u32(m, 7);
}
static void m_empty_key(rb *m)
{
    rb_str(m, "");
    rb_u32(m, NF_META_U32);
    rb_u32(m, 7);
}
static void m_long_key(rb *m)
{
    char k[300];
    memset(k, 'k', sizeof k - 1);
    k[299] = 0;
    rb_str(m, k);
    rb_u32(m, NF_META_U32);
    rb_u32(m, 7);
}
static void m_dup(rb *m)
{
    m_ok(m);
    m_ok(m);
}
static void m_no_nul(rb *m)
{
    rb_str(m, "k.s");
    rb_u32(m, NF_META_STRING);
    rb_u32(m, 2);
    rb_add(m, "abc", 3); /* 'c' where the NUL must be */
}
static void m_str_past(rb *m)
{
    rb_str(m, "k.s");
    rb_u32(m, NF_META_STRING);
    rb_u32(m, 1000);
    rb_add(m, "ab", 3);
}
static void m_arr_type(rb *m)
{
    rb_str(m, "k.a");
    rb_u32(m, NF_META_ARRAY);
    rb_u32(m, NF_META_ARRAY);
    rb_u64(m, 0);
}
static void m_arr_count(rb *m)
{
    rb_str(m, "k.a");
    rb_u32(m, NF_META_ARRAY);
    rb_u32(m, NF_META_I32);
    rb_u64(m, 1ull << 62);
    rb_u32(m, 1);
}
static void m_arr_bool(rb *m)
{
    rb_str(m, "k.a");
    rb_u32(m, NF_META_ARRAY);
    rb_u32(m, NF_META_BOOL);
    rb_u64(m, 2);
    rb_u8(m, 1);
    rb_u8(m, 5);
}
static void m_arr_str_short(rb *m)
{
    rb_str(m, "k.a");
    rb_u32(m, NF_META_ARRAY);
    rb_u32(m, NF_META_STRING);
    rb_u64(m, 3);
    rb_str(m, "x");
    rb_str(m, "y");
}
static void m_truncated_u64(rb *m)
{
    rb_str(m, "k.u");
    rb_u32(m, NF_META_U64);
    rb_u32(m, 1);
}

static void test_metadata(void)
{
    meta_case(m_ok, 1, NF_OK, NULL, NULL);
    meta_case(m_bad_type, 1, NF_ERR_FORMAT, "metadata 'k.t' (entry 0", "type 42");
    meta_case(m_bool2, 1, NF_ERR_FORMAT, "metadata 'k.b'", "bool byte is 2");
    meta_case(m_space_key, 1, NF_ERR_FORMAT, "metadata entry 0", "byte 1 is 0x20");
    meta_case(m_empty_key, 1, NF_ERR_FORMAT, "metadata key", "has length 0");
    meta_case(m_long_key, 1, NF_ERR_FORMAT, "metadata key", "has length 299");
    meta_case(m_dup, 2, NF_ERR_FORMAT, "metadata key 'k.u32'", "more than once");
    meta_case(m_no_nul, 1, NF_ERR_FORMAT, "metadata 'k.s'", "not followed by a NUL");
    meta_case(m_str_past, 1, NF_ERR_FORMAT, "metadata 'k.s'", "index ends");
    meta_case(m_arr_type, 1, NF_ERR_FORMAT, "metadata 'k.a'", "array element type 9");
    meta_case(m_arr_count, 1, NF_ERR_FORMAT, "metadata 'k.a'", "cannot fit");
    meta_case(m_arr_bool, 1, NF_ERR_FORMAT, "metadata 'k.a'", "bool byte is 5");
    meta_case(m_arr_str_short, 1, NF_ERR_FORMAT, "metadata 'k.a'", "cannot fit");
    meta_case(m_truncated_u64, 1, NF_ERR_FORMAT, "metadata 'k.u'", "needs 8 bytes");
}

static void test_tensors(void)
{
    rt t[3];
    char long_name[1100];
    memset(long_name, 'n', 1025);
    long_name[1025] = 0;
#define CASE(mod, ...)                                                                              \
    do {                                                                                            \
        good(t);                                                                                    \
        mod;                                                                                        \
        EXPECT_TENSORS_FAIL(t, 3, __VA_ARGS__);                                                     \
    } while (0)
    CASE(t[1].name = "", "tensor entry 1", "length 0");
    CASE(t[1].name = "a\nb", "tensor entry 1", "0x0a");
    CASE(t[1].name = long_name, "tensor entry 1", "length 1025");
    CASE(t[2].name = "a.q8", "tensor name 'a.q8' appears more than once");
    CASE(t[0].codec = "q9_9", "tensor 'a.q8'", "unknown codec 'q9_9'");
    CASE(t[0].nd = 0, "tensor 'a.q8'", "0 dims");
    CASE(t[0].nd = 5, "tensor 'a.q8'", "5 dims");
    CASE(t[0].dims[0] = 0, "tensor 'a.q8'", "dim 0 is 0");
    CASE((t[0].nd = 3, t[0].dims[0] = 1ull << 40, t[0].dims[1] = 1ull << 40, t[0].dims[2] = 64), "tensor 'a.q8'",
         "overflows");
    CASE(t[0].dims[1] = 48, "tensor 'a.q8'", "not a multiple of its block");
    CASE(t[0].divisors = 0, "tensor 'a.q8'", "divisors is 0");
    CASE(t[0].divisors = 2, "tensor 'a.q8'", "only nvfp4 may carry more than one");
    CASE(t[1].dims[1] = 24, "tensor 'a.nv'", "not a multiple of the 16");
    CASE(t[1].divisors = 3, "tensor 'a.nv'", "does not divide rows");
    CASE(t[1].divisors = 4, "tensor 'a.nv'", "128-row");
    CASE(t[0].flags = 0x80, "tensor 'a.q8'", "unknown flag bits 0x80");
    CASE(t[0].flags = NF_TENSOR_ALLOW_A4, "tensor 'a.q8'", "allow_a4 on a q8_0 tensor");
    CASE((t[0].nin = 1, t[0].in[0] = 1), "tensor 'a.q8'", "only nvfp4 may have them");
    CASE(t[1].flags = NF_TENSOR_ALLOW_A4, "tensor 'a.nv'", "allow_a4 without an input divisor");
    CASE((t[2].nin = 3, t[2].in[2] = 1), "tensor 'a.bank'", "3 input divisors");
    CASE((t[1].nin = 2, t[1].in[1] = 1), "tensor 'a.nv'", "2 input divisors");
    CASE(t[2].in[1] = 0.0f, "tensor 'a.bank'", "input divisor 1 is 0");
    CASE(t[2].in[0] = -1.0f, "tensor 'a.bank'", "input divisor 0 is -1");
    CASE(t[2].in[0] = NAN, "tensor 'a.bank'", "input divisor 0 is nan");
    CASE(t[2].in[0] = INFINITY, "tensor 'a.bank'", "input divisor 0 is inf");
    CASE(t[0].bytes = 4 * 68 + 1, "tensor 'a.q8'", "payload size 273 does not match 272");
    CASE((t[1].np = 2, t[1].planes[0] = (nf_tensor_plane){0, 8192}, t[1].planes[1] = (nf_tensor_plane){8192, 1024}),
         "tensor 'a.nv'", "2 planes stored, codec nvfp4 has 3");
    CASE(t[1].np = 0, "tensor 'a.nv'", "0 planes");
    CASE((t[1].np = 3, t[1].planes[0] = (nf_tensor_plane){0, 8192}, t[1].planes[1] = (nf_tensor_plane){8448, 1024},
          t[1].planes[2] = (nf_tensor_plane){9216, 4}),
         "tensor 'a.nv'", "plane 1 at 8448");
    CASE((t[0].np = 1, t[0].planes[0] = (nf_tensor_plane){0, 271}), "tensor 'a.q8'", "plane 0 at 0 (271 bytes)");
    CASE(t[1].offset = 4096 + 4096 + 64, "tensor 'a.nv'", "payload offset 8256 is not a multiple of 4096");
}

/* Placement rules need real offsets: patch the payload offset fields of a good file. */
static void test_placement(void)
{
    rt t[3];
    good(t);
    size_t n;
    uint8_t *f = build(t, 3, NULL, 0, &n);
    uint64_t io = get64(f + 32), ib = get64(f + 40);
    /* The entries' payload offsets, found by their values (4096, 8192+..., ...) in the index tail of
     * each entry: offset, size, checksum are the last 24 bytes of an entry. Locate them by
     * scanning for the 8-byte little-endian offset values the builder used. */
    uint64_t offs[3] = {4096, 8192, 0};
    uint64_t at[3] = {0};
    int found = 0;
    for (uint64_t p = io; p + 8 <= io + ib; p++)
        for (int k = 0; k < 2; k++)
            if (!at[k] && get64(f + p) == offs[k] && p + 24 <= io + ib && get64(f + p + 16) == 0) {
                at[k] = p;
                found++;
            }
    CHECK(found == 2);
    uint8_t *g = malloc(n);
    PATCHED((put64(g + at[0], 0), fix_checksum(g)), "tensor 'a.q8'", "starts before 4096");
    PATCHED((put64(g + at[1], 4096), fix_checksum(g)), "tensor 'a.nv'", "starts before", "do not overlap");
    PATCHED((put64(g + at[1], 4096 * 1000), fix_checksum(g)), "tensor 'a.nv'", "runs past the end of the data section");
    PATCHED((put64(g + at[1], UINT64_MAX - 4095), fix_checksum(g)), "tensor 'a.nv'", "runs past");
    PATCHED((put64(g + at[1], 8192 + 1), fix_checksum(g)), "not a multiple of 4096");
    free(g);
    free(f);

    /* nvfp4 plane content: a NaN scale byte and a zero divisor word are refused, naming the tensor. */
    good(t);
    t[1].nan_scale = 1;
    EXPECT_TENSORS_FAIL(t, 3, "tensor 'a.nv'", "NaN");
    good(t);
    t[2].zero_divisor = 1;
    EXPECT_TENSORS_FAIL(t, 3, "tensor 'a.bank'", "divisor word 3");
}

int main(void)
{
    test_header();
    test_metadata();
    test_tensors();
    test_placement();
    return nf_test_report();
}

/* The committed artifact tests/fixtures/format/ref_v1.nf (format 1.0: every codec, nvfp4 with
 * divisors = 1 and > 1, with and without allow_a4, metadata of every type) must keep opening, and
 * the C reader must see exactly what the independent Python reader written from docs/artifact.md
 * (tests/oracle/artifact_reader.py) saw: tests/fixtures/format/ref_v1.json.
 *
 *   test_artifact_fixture --write PATH   regenerates the fixture (then rerun the oracle script) */
#include "test_artifact_util.h" /* first: it sets _POSIX_C_SOURCE */
#include "nf_test.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <inttypes.h>

#include "base/fnv.h"

typedef struct sb {
    char *p;
    size_t n, cap;
} sb;

static void sb_put(sb *s, const char *fmt, ...) NF_PRINTF(2, 3);
static void sb_put(sb *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (s->n + (size_t)k + 1 > s->cap) {
        s->cap = (s->n + (size_t)k + 1) * 2;
        s->p = realloc(s->p, s->cap);
    }
    va_start(ap, fmt);
    vsnprintf(s->p + s->n, (size_t)k + 1, fmt, ap);
    va_end(ap);
    s->n += (size_t)k;
}

static void put_hex(sb *s, const char *b, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) sb_put(s, "%02x", (unsigned char)b[i]);
    if (!n) sb_put(s, "%s", "");
}

/* The oracle's canonical rendering of one scalar. */
static void put_scalar(sb *s, nf_meta_type t, const uint8_t *p)
{
    uint32_t u;
    uint64_t q;
    switch (t) {
    case NF_META_U32: memcpy(&u, p, 4); sb_put(s, "%" PRIu32, u); break;
    case NF_META_I32: memcpy(&u, p, 4); sb_put(s, "%" PRId32, (int32_t)u); break;
    case NF_META_U64: memcpy(&q, p, 8); sb_put(s, "%" PRIu64, q); break;
    case NF_META_I64: memcpy(&q, p, 8); sb_put(s, "%" PRId64, (int64_t)q); break;
    case NF_META_F32: memcpy(&u, p, 4); sb_put(s, "0x%08" PRIx32, u); break;
    case NF_META_F64: memcpy(&q, p, 8); sb_put(s, "0x%016" PRIx64, q); break;
    case NF_META_BOOL: sb_put(s, "%u", p[0]); break;
    default: sb_put(s, "?");
    }
}

static char *render(const nf_meta *m, char *type, size_t tcap)
{
    sb s = {0};
    sb_put(&s, "%s", "");
    if (m->type == NF_META_STRING) {
        snprintf(type, tcap, "string");
        put_hex(&s, m->str, m->count);
    } else if (m->type == NF_META_ARRAY) {
        snprintf(type, tcap, "array of %s", nf_meta_type_name(m->elem_type));
        size_t esz = m->elem_type == NF_META_BOOL ? 1
                     : (m->elem_type == NF_META_U64 || m->elem_type == NF_META_I64 || m->elem_type == NF_META_F64) ? 8
                                                                                                                    : 4;
        for (uint64_t i = 0; i < m->count; i++) {
            if (i) sb_put(&s, ",");
            if (m->elem_type == NF_META_STRING) put_hex(&s, m->strs[i], m->str_lens[i]);
            else put_scalar(&s, m->elem_type, (const uint8_t *)m->elems + i * esz);
        }
    } else {
        snprintf(type, tcap, "%s", nf_meta_type_name(m->type));
        uint8_t b = (uint8_t)m->v.b;
        put_scalar(&s, m->type, m->type == NF_META_BOOL ? &b : (const uint8_t *)&m->v);
    }
    return s.p;
}

static const char *jstr(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static double jnum(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

static void compare(const nf_artifact *a, const cJSON *root)
{
    const nf_artifact_info *in = nf_artifact_get_info(a);
    CHECK(jnum(root, "major") == in->major && jnum(root, "minor") == in->minor);
    CHECK(jnum(root, "alignment") == in->alignment && jnum(root, "index_offset") == (double)in->index_offset);
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "metadata");
    CHECK_EQ_INT(cJSON_GetArraySize(meta), nf_artifact_n_meta(a));
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, meta)
    {
        const nf_meta *cm = nf_artifact_meta(a, (size_t)i++);
        if (!cm) break;
        char type[40];
        char *v = render(cm, type, sizeof type);
        CHECK_MSG(!strcmp(cm->key, jstr(m, "key")), "%s vs %s", cm->key, jstr(m, "key"));
        CHECK_MSG(!strcmp(type, jstr(m, "type")), "%s: %s vs %s", cm->key, type, jstr(m, "type"));
        CHECK_MSG(!strcmp(v, jstr(m, "value")), "%s: '%s' vs '%s'", cm->key, v, jstr(m, "value"));
        free(v);
    }
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(root, "tensors");
    CHECK_EQ_INT(cJSON_GetArraySize(ts), nf_artifact_n_tensors(a));
    i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, ts)
    {
        const nf_tensor *ct = nf_artifact_tensor(a, (size_t)i++);
        if (!ct) break;
        sb s = {0};
        sb_put(&s, "%s|%s|", ct->desc.name, ct->codec->name);
        for (uint32_t k = 0; k < ct->desc.n_dims; k++) sb_put(&s, "%s%" PRIu64, k ? "," : "", ct->desc.dims[k]);
        sb_put(&s, "|%u|%u|", ct->desc.divisors, ct->desc.flags);
        for (uint32_t k = 0; k < ct->desc.n_input_divisors; k++) {
            uint32_t bits;
            memcpy(&bits, &ct->desc.input_divisors[k], 4);
            sb_put(&s, "%s0x%08" PRIx32, k ? "," : "", bits);
        }
        sb_put(&s, "|");
        for (uint32_t k = 0; k < ct->layout.n_planes; k++)
            sb_put(&s, "%s%" PRIu64 ":%" PRIu64, k ? "," : "", ct->layout.planes[k].offset, ct->layout.planes[k].bytes);
        sb_put(&s, "|%" PRIu64 "|%" PRIu64 "|%016" PRIx64 "|%016" PRIx64, ct->offset, ct->layout.payload_bytes,
               ct->checksum, nf_fnv1a64(ct->data, (size_t)ct->layout.payload_bytes));
        char want[4096];
        snprintf(want, sizeof want, "%s|%s|%s|%.0f|%.0f|%s|%s|%.0f|%.0f|%s|%s", jstr(t, "name"), jstr(t, "codec"),
                 jstr(t, "dims"), jnum(t, "divisors"), jnum(t, "flags"), jstr(t, "input_divisors"), jstr(t, "planes"),
                 jnum(t, "offset"), jnum(t, "bytes"), jstr(t, "checksum"), jstr(t, "payload_fnv1a64"));
        CHECK_MSG(!strcmp(s.p, want), "\n  C:      %s\n  oracle: %s", s.p, want);
        free(s.p);
    }
}

static int write_fixture(const char *path)
{
    static ta_tensor ts[32];
    int n = ta_reference_tensors(ts);
    for (int i = 0; i < n; i++)
        if (ta_make_payload(&ts[i])) return 1;
    return ta_write_artifact(path, ts, n, 64, 1) ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--write")) return write_fixture(argv[2]);
    nf_artifact *a = NULL;
    nf_error e;
    CHECK_MSG(nf_artifact_open(NF_TEST_DATA "/fixtures/format/ref_v1.nf", &a, &e) == NF_OK, "%s", e.msg);
    size_t n;
    uint8_t *js = ta_read_file(NF_TEST_DATA "/fixtures/format/ref_v1.json", &n);
    CHECK(js != NULL);
    if (!a || !js) return nf_test_report();
    cJSON *root = cJSON_ParseWithLength((const char *)js, n);
    CHECK(root != NULL);
    if (root) compare(a, root);
    size_t checked, bad;
    CHECK(nf_artifact_verify(a, &checked, &bad, &e) == NF_OK && checked == nf_artifact_n_tensors(a) && bad == 0);
    CHECK(nf_artifact_n_tensors(a) == 19 && nf_artifact_n_meta(a) == 19);
    cJSON_Delete(root);
    free(js);
    nf_artifact_close(a);
    return nf_test_report();
}

/* The safetensors reader against files written by Hugging Face's `safetensors` library
 * (tests/oracle/source_fixtures.py; expected names, dtypes, shapes, offsets and FNV-1a hashes of
 * every tensor's bytes in tests/fixtures/sources/manifest.json), and against corrupted files:
 * every one must be refused with a message naming what is wrong, never a crash. */
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fnv.h"
#include "format/safetensors.h"
#include "nf_test.h"
#include "test_sources_util.h"

static uint64_t hex64(const char *s) { return strtoull(s, NULL, 16); }

/* One tensor against its manifest entry. */
static void check_tensor(const nf_st_tensor *t, const cJSON *e, const char *name)
{
    CHECK_MSG(t != NULL, "tensor '%s' not found", name);
    if (!t) return;
    CHECK_CONTAINS(nf_st_dtype_name(t->dtype), cJSON_GetObjectItem(e, "dtype")->valuestring);
    CHECK_EQ_INT(strlen(nf_st_dtype_name(t->dtype)), strlen(cJSON_GetObjectItem(e, "dtype")->valuestring));
    const cJSON *shape = cJSON_GetObjectItem(e, "shape");
    CHECK_EQ_INT(t->n_dims, cJSON_GetArraySize(shape));
    uint64_t elems = 1;
    for (int d = 0; d < t->n_dims && d < cJSON_GetArraySize(shape); d++) {
        CHECK_EQ_U64(t->shape[d], (uint64_t)cJSON_GetArrayItem(shape, d)->valuedouble);
        elems *= t->shape[d];
    }
    CHECK_EQ_U64(t->n_elems, elems);
    const cJSON *nb = cJSON_GetObjectItem(e, "nbytes"), *off = cJSON_GetObjectItem(e, "offset");
    if (nb) CHECK_EQ_U64(t->nbytes, (uint64_t)nb->valuedouble);
    if (off) CHECK_EQ_U64(t->file_offset, (uint64_t)off->valuedouble);
    CHECK_EQ_U64(t->nbytes, t->n_elems * nf_st_dtype_size(t->dtype));
    uint64_t h = nf_fnv1a64(t->data, t->nbytes);
    CHECK_MSG(h == hex64(cJSON_GetObjectItem(e, "fnv1a64")->valuestring), "tensor '%s': bytes differ from the oracle's",
              name);
}

static void test_dtypes(const cJSON *m)
{
    const cJSON *exp = cJSON_GetObjectItem(cJSON_GetObjectItem(m, "dtypes.safetensors"), "tensors");
    nf_error err = {0};
    nf_safetensors *st = NULL;
    CHECK_EQ_INT(nf_safetensors_open(SRC "/dtypes.safetensors", &st, &err), NF_OK);
    if (!st) {
        fprintf(stderr, "%s\n", err.msg);
        return;
    }
    CHECK_EQ_INT(nf_safetensors_count(st), cJSON_GetArraySize(exp));
    for (const cJSON *e = exp->child; e; e = e->next) check_tensor(nf_safetensors_find(st, e->string), e, e->string);
    /* every dtype of the manifest is one the reader names */
    CHECK(nf_safetensors_find(st, "f8.weight_scale")->dtype == NF_ST_F8_E4M3);
    CHECK(nf_safetensors_find(st, "bf16.weight")->dtype == NF_ST_BF16);
    const nf_st_tensor *sc = nf_safetensors_find(st, "scalar.weight_global_scale");
    CHECK(sc && sc->n_dims == 0 && sc->nbytes == 4);
    float g = 0;
    if (sc) memcpy(&g, sc->data, 4);
    CHECK(g == (float)(448.0 * 6 / 1.7));
    const nf_st_tensor *empty = nf_safetensors_find(st, "empty.bias");
    CHECK(empty && empty->nbytes == 0 && empty->data == NULL && empty->shape[0] == 0 && empty->shape[1] == 4);
    CHECK(nf_safetensors_find(st, "nope") == NULL);
    /* at() walks in data-offset order */
    for (size_t i = 1; i < nf_safetensors_count(st); i++)
        CHECK(nf_safetensors_at(st, i - 1)->file_offset <= nf_safetensors_at(st, i)->file_offset);
    CHECK(nf_safetensors_at(st, nf_safetensors_count(st)) == NULL);
    CHECK(strcmp(nf_safetensors_metadata(st, "format"), "pt") == 0);
    CHECK(strcmp(nf_safetensors_metadata(st, "producer"), "source_fixtures.py") == 0);
    CHECK(nf_safetensors_metadata(st, "absent") == NULL);
    nf_safetensors_close(st);
}

static void check_set(nf_st_set *set, const cJSON *exp, int sharded)
{
    CHECK_EQ_INT(nf_st_set_count(set), cJSON_GetArraySize(exp));
    CHECK_EQ_INT(nf_st_set_shard_count(set), sharded ? 2 : 1);
    for (const cJSON *e = exp->child; e; e = e->next) {
        const nf_st_tensor *t = nf_st_set_find(set, e->string);
        check_tensor(t, e, e->string);
        const cJSON *shard = cJSON_GetObjectItem(e, "shard");
        if (t && shard) {
            const char *p = nf_safetensors_path(nf_st_set_shard(set, (size_t)t->shard));
            CHECK_CONTAINS(p, shard->valuestring);
        }
    }
    for (size_t i = 1; i < nf_st_set_count(set); i++)
        CHECK(strcmp(nf_st_set_at(set, i - 1)->name, nf_st_set_at(set, i)->name) < 0);
    const nf_st_tensor *t;
    nf_error err = {0};
    CHECK_EQ_INT(nf_st_set_get(set, "model.layers.9.mlp.gate_proj.weight", &t, &err), NF_ERR_FORMAT);
    CHECK_CONTAINS(err.msg, "model.layers.9.mlp.gate_proj.weight");
}

static void test_sets(const cJSON *m)
{
    const char *paths[] = {SRC "/sharded", SRC "/sharded/model.safetensors.index.json", SRC "/single",
                           SRC "/single/model.safetensors"};
    for (int i = 0; i < 4; i++) {
        nf_error err = {0};
        nf_st_set *set = NULL;
        CHECK_MSG(nf_st_set_open(paths[i], &set, &err) == NF_OK, "%s: %s", paths[i], err.msg);
        if (!set) continue;
        check_set(set, cJSON_GetObjectItem(cJSON_GetObjectItem(m, i < 2 ? "sharded" : "single"), "tensors"), i < 2);
        nf_st_set_close(set);
    }
}

/* ---- broken checkpoints ---- */

static nf_status open_set(const char *path, nf_error *err)
{
    nf_st_set *set = NULL;
    nf_status s = nf_st_set_open(path, &set, err);
    nf_st_set_close(set);
    return s;
}

static void copy_shards(void)
{
    const char *names[] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
    for (int i = 0; i < 2; i++) {
        char p[512];
        snprintf(p, sizeof p, SRC "/sharded/%s", names[i]);
        size_t n = 0;
        unsigned char *b = read_all(p, &n);
        write_tmp(names[i], b, n);
        free(b);
    }
}

static void index_error(const char *json, nf_status code, const char *needle1, const char *needle2)
{
    const char *p = write_tmp("model.safetensors.index.json", json, strlen(json));
    nf_error err = {0};
    CHECK_EQ_INT(open_set(p, &err), code);
    CHECK_CONTAINS(err.msg, needle1);
    if (needle2) CHECK_CONTAINS(err.msg, needle2);
}

static void test_bad_index(void)
{
    copy_shards();
    /* a tensor mapped to a shard that does not hold it: named, with the shard */
    index_error("{\"weight_map\": {\"model.norm.weight\": \"model-00001-of-00002.safetensors\"}}", NF_ERR_FORMAT,
                "tensor 'model.norm.weight'", "shard 'model-00001-of-00002.safetensors'");
    index_error("{\"weight_map\": {\"model.norm.weight\": \"model-00009-of-00009.safetensors\"}}", NF_ERR_IO,
                "model-00009-of-00009.safetensors", NULL);
    index_error("{\"weight_map\": {\"model.norm.weight\": \"../x.safetensors\"}}", NF_ERR_FORMAT, "model.norm.weight",
                "file name");
    index_error("{\"weight_map\": {\"model.norm.weight\": 3}}", NF_ERR_FORMAT, "model.norm.weight", NULL);
    index_error("{\"metadata\": {}}", NF_ERR_FORMAT, "weight_map", NULL);
    index_error("{\"weight_map\": ", NF_ERR_FORMAT, "not valid JSON", NULL);
    index_error("{\"weight_map\": {\"model.norm.weight\": \"model-00002-of-00002.safetensors\","
                "\"model.norm.weight\": \"model-00002-of-00002.safetensors\"}}",
                NF_ERR_FORMAT, "'model.norm.weight' appears twice", NULL);
    /* a partial map is fine (unmapped shard tensors are left out with a warning) */
    const char *ok = "{\"weight_map\": {\"model.norm.weight\": \"model-00002-of-00002.safetensors\"}}";
    nf_st_set *set = NULL;
    nf_error err = {0};
    CHECK_EQ_INT(nf_st_set_open(write_tmp("model.safetensors.index.json", ok, strlen(ok)), &set, &err), NF_OK);
    CHECK(set && nf_st_set_count(set) == 1 && nf_st_set_find(set, "model.norm.weight"));
    CHECK(set && nf_st_set_find(set, "model.layers.2.mlp.gate_proj.weight") == NULL);
    nf_st_set_close(set);
    char empty_dir[600];
    snprintf(empty_dir, sizeof empty_dir, "%s/empty", tmpdir);
    mkdir(empty_dir, 0700);
    CHECK_EQ_INT(open_set(empty_dir, &err), NF_ERR_IO);
    CHECK_CONTAINS(err.msg, "no model.safetensors or model.safetensors.index.json");
    CHECK_EQ_INT(open_set("/nonexistent/ckpt", &err), NF_ERR_IO);
    rmdir(empty_dir);
}

/* A file made of an 8-byte length, the given header and `data` zero bytes. */
static nf_status open_made(const char *header, size_t data, nf_error *err)
{
    size_t h = strlen(header), n = 8 + h + data;
    unsigned char *b = calloc(1, n);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)h >> (8 * i));
    memcpy(b + 8, header, h);
    const char *p = write_tmp("made.safetensors", b, n);
    free(b);
    nf_safetensors *st = NULL;
    nf_status s = nf_safetensors_open(p, &st, err);
    nf_safetensors_close(st);
    return s;
}

static void refused(const char *header, size_t data, nf_status code, const char *needle1, const char *needle2)
{
    nf_error err = {0};
    nf_status s = open_made(header, data, &err);
    CHECK_MSG(s == code, "header %s: status %d, expected %d (%s)", header, s, code, err.msg);
    CHECK_CONTAINS(err.msg, "made.safetensors");
    CHECK_CONTAINS(err.msg, needle1);
    if (needle2) CHECK_CONTAINS(err.msg, needle2);
}

static void accepted(const char *header, size_t data)
{
    nf_error err = {0};
    CHECK_MSG(open_made(header, data, &err) == NF_OK, "header %s: %s", header, err.msg);
}

#define T(name, body) "\"" name "\": {" body "}"
static void test_bad_headers(void)
{
    refused("{" T("w", "\"dtype\": \"F4\", \"shape\": [2], \"data_offsets\": [0, 1]") "}", 1, NF_ERR_UNSUPPORTED,
            "tensor 'w'", "unknown dtype 'F4'");
    refused("{" T("w", "\"shape\": [2], \"data_offsets\": [0, 8]") "}", 8, NF_ERR_FORMAT, "tensor 'w'", "dtype");
    refused("{" T("w", "\"dtype\": \"F32\", \"shape\": 2, \"data_offsets\": [0, 8]") "}", 8, NF_ERR_FORMAT,
            "tensor 'w'", "shape");
    refused("{" T("w", "\"dtype\": \"F32\", \"shape\": [-2], \"data_offsets\": [0, 8]") "}", 8, NF_ERR_FORMAT,
            "tensor 'w'", "shape[0]");
    refused("{" T("w", "\"dtype\": \"F32\", \"shape\": [2.5], \"data_offsets\": [0, 8]") "}", 8, NF_ERR_FORMAT,
            "tensor 'w'", "shape[0]");
    refused("{" T("w", "\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8, 9]") "}", 9, NF_ERR_FORMAT,
            "tensor 'w'", "data_offsets");
    refused("{" T("w", "\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 0]") "}", 8, NF_ERR_FORMAT,
            "tensor 'w'", "begin after end");
    refused("{" T("w", "\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]") "}", 7, NF_ERR_FORMAT,
            "tensor 'w'", "past the data section (7 bytes)");
    refused("{" T("w", "\"dtype\": \"F32\", \"shape\": [2, 2], \"data_offsets\": [0, 12]") "}", 12, NF_ERR_FORMAT,
            "tensor 'w'", "hold 12 bytes, but shape [2, 2] of F32 needs 16");
    refused("{" T("w", "\"dtype\": \"F32\", \"shape\": [4503599627370496, 4503599627370496], "
                       "\"data_offsets\": [0, 8]") "}", 8, NF_ERR_FORMAT, "tensor 'w'", "overflows");
    refused("{" T("w", "\"dtype\": \"U8\", \"shape\": [1,1,1,1,1,1,1,1,1], \"data_offsets\": [0, 1]") "}", 1,
            NF_ERR_UNSUPPORTED, "tensor 'w'", "9 dimensions");
    refused("{" T("a", "\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]") ","
            T("b", "\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [8, 24]") "}", 24, NF_ERR_FORMAT,
            "tensors 'a' [0, 16) and 'b' [8, 24) overlap", NULL);
    refused("{" T("a", "\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]") ","
            T("a", "\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [16, 32]") "}", 32, NF_ERR_FORMAT,
            "tensor name 'a' appears twice", NULL);
    refused("{\"w\": 3}", 0, NF_ERR_FORMAT, "tensor 'w'", "not an object");
    refused("{\"__metadata__\": {\"format\": 1}}", 0, NF_ERR_FORMAT, "__metadata__", "format");
    refused("{\"__metadata__\": []}", 0, NF_ERR_FORMAT, "__metadata__", NULL);
    refused("[1, 2]", 0, NF_ERR_FORMAT, "not an object", NULL);
    refused("{\"w\": {", 0, NF_ERR_FORMAT, "does not parse", NULL);
    refused("", 0, NF_ERR_FORMAT, "does not parse", NULL);
    refused("{} x", 0, NF_ERR_FORMAT, "trailing bytes", NULL);
    /* what the format allows */
    accepted("{}", 0);
    accepted("{\"__metadata__\": {\"format\": \"pt\"}}       ", 0); /* space padding */
    accepted("{" T("s", "\"dtype\": \"F64\", \"shape\": [], \"data_offsets\": [0, 8]") "}", 8);
    accepted("{" T("z", "\"dtype\": \"F32\", \"shape\": [0, 3], \"data_offsets\": [4, 4]") ","
             T("a", "\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]") "}", 8);
    accepted("{" T("a", "\"dtype\": \"I32\", \"shape\": [1], \"data_offsets\": [4, 8]") "}", 16); /* gaps */
}

/* Header length fields that lie. */
static void test_bad_lengths(void)
{
    nf_error err = {0};
    unsigned char b[32] = {0};
    const char *p = write_tmp("len.safetensors", b, 5);
    nf_safetensors *st = NULL;
    CHECK_EQ_INT(nf_safetensors_open(p, &st, &err), NF_ERR_FORMAT);
    CHECK_CONTAINS(err.msg, "too short");
    uint64_t lens[] = {100, UINT64_MAX, (uint64_t)1 << 63, 25};
    for (int i = 0; i < 4; i++) {
        for (int k = 0; k < 8; k++) b[k] = (unsigned char)(lens[i] >> (8 * k));
        memcpy(b + 8, "{}", 2);
        p = write_tmp("len.safetensors", b, sizeof b);
        CHECK_EQ_INT(nf_safetensors_open(p, &st, &err), NF_ERR_FORMAT);
        CHECK_CONTAINS(err.msg, "runs past the end of the file (32 bytes)");
        CHECK(st == NULL);
    }
    CHECK_EQ_INT(nf_safetensors_open("/nonexistent.safetensors", &st, &err), NF_ERR_IO);
}

/* Every proper prefix of a real file must be refused (its last tensor ends at the end of the
 * file), and every single-byte corruption of its header must be refused or yield tensors that lie
 * inside the file; under ASan/UBSan neither may touch memory outside the mapping. */
static void test_truncation_and_flips(void)
{
    size_t n = 0;
    unsigned char *b = read_all(SRC "/dtypes.safetensors", &n);
    CHECK(b != NULL && n > 100);
    if (!b) return;
    int refused_all = 1;
    for (size_t len = 0; len < n; len++) {
        nf_error err = {0};
        nf_safetensors *st = NULL;
        const char *p = write_tmp("cut.safetensors", b, len);
        if (nf_safetensors_open(p, &st, &err) == NF_OK || !strstr(err.msg, "cut.safetensors")) {
            refused_all = 0;
            fprintf(stderr, "truncation at %zu: not refused\n", len);
        }
        nf_safetensors_close(st);
    }
    CHECK(refused_all);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | b[i];
    const unsigned char masks[] = {0x01, 0x02, 0x10, 0x20, 0x80, 0xff};
    int bad = 0, opened = 0, errors = 0;
    for (size_t at = 0; at < 8 + hlen; at++) {
        for (size_t k = 0; k < sizeof masks; k++) {
            b[at] ^= masks[k];
            nf_error err = {0};
            nf_safetensors *st = NULL;
            const char *p = write_tmp("flip.safetensors", b, n);
            if (nf_safetensors_open(p, &st, &err) == NF_OK) {
                opened++;
                for (size_t i = 0; i < nf_safetensors_count(st); i++) {
                    const nf_st_tensor *t = nf_safetensors_at(st, i);
                    if (t->file_offset > n || t->nbytes > n - t->file_offset) bad++;
                    if (t->nbytes) bad += nf_fnv1a64(t->data, t->nbytes) == 0; /* touch every byte */
                }
            } else {
                errors++;
                if (err.msg[0] == '\0') bad++;
            }
            nf_safetensors_close(st);
            b[at] ^= masks[k];
        }
    }
    CHECK_EQ_INT(bad, 0);
    CHECK(errors > 0 && opened > 0); /* both outcomes occur: flips in names/metadata are harmless */
    printf("header flips: %d refused, %d opened\n", errors, opened);
    free(b);
}

int main(void)
{
    /* thousands of small files are written: memory-backed /dev/shm when there is one */
    snprintf(tmpdir, sizeof tmpdir, "%s/nf_st_XXXXXX", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    cJSON *m = manifest();
    CHECK(m != NULL);
    if (m) {
        test_dtypes(m);
        test_sets(m);
    }
    test_bad_index();
    test_bad_headers();
    test_bad_lengths();
    test_truncation_and_flips();
    cJSON_Delete(m);
    const char *files[] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                           "model.safetensors.index.json", "made.safetensors", "len.safetensors",
                           "cut.safetensors", "flip.safetensors"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char p[600];
        snprintf(p, sizeof p, "%s/%s", tmpdir, files[i]);
        unlink(p);
    }
    rmdir(tmpdir);
    return nf_test_report();
}

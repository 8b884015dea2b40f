/* Every file under tests/fixtures/format/regress/ (inputs the fuzzer found interesting or that
 * once crashed the reader) is fed to the reader, with and without the index checksum: each must
 * be refused with a message naming the file, or open and then be walked in full, never crash
 * (the sanitizer build runs this). A file named ok-* must open; every other file must be refused. */
#include "test_artifact_util.h" /* first: it sets _POSIX_C_SOURCE */
#include "nf_test.h"

static void walk(const nf_artifact *a)
{
    nf_error e;
    for (size_t i = 0; i < nf_artifact_n_tensors(a); i++) {
        int checked;
        (void)nf_tensor_verify(nf_artifact_tensor(a, i), &checked, &e);
    }
    for (size_t i = 0; i < nf_artifact_n_meta(a); i++) {
        const nf_meta *m = nf_artifact_meta(a, i);
        CHECK(nf_artifact_find_meta(a, m->key) == m);
        if (m->type == NF_META_ARRAY && m->elem_type == NF_META_STRING)
            for (uint64_t k = 0; k < m->count; k++) CHECK(strlen(m->strs[k]) <= m->str_lens[k]);
    }
}

int main(void)
{
    const char *dir = NF_TEST_DATA "/fixtures/format/regress";
    DIR *d = opendir(dir);
    CHECK_MSG(d != NULL, "cannot open %s", dir);
    if (!d) return nf_test_report();
    int files = 0;
    struct dirent *ent;
    while ((ent = readdir(d))) {
        if (ent->d_name[0] == '.' || strstr(ent->d_name, ".md")) continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, ent->d_name);
        size_t n;
        uint8_t *f = ta_read_file(path, &n);
        CHECK(f != NULL);
        if (!f) continue;
        files++;
        int want_ok = strncmp(ent->d_name, "ok-", 3) == 0;
        for (unsigned flags = 0; flags < 2; flags++) {
            uint8_t *copy = malloc(n ? n : 1); /* exact size: ASan sees any overread */
            memcpy(copy, f, n);
            nf_artifact *a = NULL;
            nf_error e = {0};
            nf_status s = nf_artifact_open_memory(copy, n, ent->d_name, flags, &a, &e);
            if (s) {
                CHECK_MSG(!want_ok || flags, "%s: %s", ent->d_name, e.msg);
                CHECK_CONTAINS(e.msg, ent->d_name);
            } else {
                CHECK_MSG(want_ok || flags, "%s opened", ent->d_name);
                walk(a);
                nf_artifact_close(a);
            }
            free(copy);
        }
        free(f);
    }
    closedir(d);
    printf("%d regression inputs\n", files);
    CHECK(files > 0);
    return nf_test_report();
}

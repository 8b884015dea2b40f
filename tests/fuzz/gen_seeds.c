/* Writes the fuzzer's seed corpus into DIR: small valid artifacts (64-byte alignment keeps them a
 * few KB) covering every metadata type, every codec this build links, nvfp4 with divisors = 1 and
 * > 1, allow_a4 with one and with per-expert input divisors. Usage: gen_seeds DIR */
#include "../format/test_artifact_util.h"

static int write_seed(const char *dir, const char *name, ta_tensor *ts, int from, int to, int with_meta)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s.nf", dir, name);
    return ta_write_artifact(path, ts + from, to - from, 64, with_meta) ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: gen_seeds DIR\n");
        return 2;
    }
    static ta_tensor ts[32];
    int n = ta_reference_tensors(ts), rc = 0;
    for (int i = 0; i < n; i++)
        if (ta_make_payload(&ts[i])) return 1;
    rc |= write_seed(argv[1], "meta_only", ts, 0, 0, 1);
    for (int i = 0; i < n; i++) {
        char name[80];
        snprintf(name, sizeof name, "t%02d_%s", i, ts[i].name);
        rc |= write_seed(argv[1], name, ts, i, i + 1, 0);
    }
    rc |= write_seed(argv[1], "plain_all", ts, 0, n < 11 ? n : 11, 1);
    for (int i = 0; i < n; i++) free(ts[i].payload);
    return rc;
}

/* Helpers the source-reader tests (safetensors, GGUF) share: a scratch directory for corrupted
 * copies, and the oracle's manifest (tests/oracle/source_fixtures.py). */
#ifndef NF_TEST_SOURCES_UTIL_H
#define NF_TEST_SOURCES_UTIL_H

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>

#define SRC NF_TEST_DATA "/fixtures/sources"

static char tmpdir[64];

/* The whole file, NUL-terminated (so JSON can be parsed in place); NULL if it cannot be read. */
static unsigned char *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)len + 1);
    *n = fread(b, 1, (size_t)len, f);
    b[*n] = 0;
    fclose(f);
    return b;
}

/* Writes data to tmpdir/name; returns the path (a static buffer, valid until the next call). */
static const char *write_tmp(const char *name, const void *data, size_t n)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    fwrite(data, 1, n, f);
    fclose(f);
    return path;
}

static cJSON *manifest(void)
{
    size_t n = 0;
    unsigned char *b = read_all(SRC "/manifest.json", &n);
    cJSON *m = b ? cJSON_ParseWithLength((const char *)b, n) : NULL;
    free(b);
    return m;
}

#endif

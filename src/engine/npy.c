/* .npy reader and writer (see npy.h). */
#include "engine/npy.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

nf_status nf_npy_write_f32(const char *path, const float *data, const uint64_t *shape, uint32_t ndim, nf_error *err)
{
    if (ndim < 1 || ndim > NF_NPY_MAX_DIMS) return nf_error_set(err, NF_ERR_INVALID_ARG, "%s: %u dims", path, ndim);
    char dict[256];
    int n = snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (");
    uint64_t count = 1;
    for (uint32_t i = 0; i < ndim; i++) {
        n += snprintf(dict + n, sizeof dict - (size_t)n, "%" PRIu64 "%s", shape[i], ndim == 1 || i + 1 < ndim ? ", " : "");
        count *= shape[i];
    }
    n += snprintf(dict + n, sizeof dict - (size_t)n, "), }");
    /* magic(6) + version(2) + len(2) + dict + spaces + '\n', total a multiple of 64 */
    size_t total = 10 + (size_t)n + 1;
    size_t pad = (64 - total % 64) % 64;
    uint16_t hlen = (uint16_t)(n + pad + 1);
    FILE *f = fopen(path, "wb");
    if (!f) return nf_error_set(err, NF_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    uint8_t head[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (uint8_t)(hlen & 0xff), (uint8_t)(hlen >> 8)};
    int ok = fwrite(head, 1, 10, f) == 10 && fwrite(dict, 1, (size_t)n, f) == (size_t)n;
    for (size_t i = 0; ok && i < pad; i++) ok = fputc(' ', f) != EOF;
    ok = ok && fputc('\n', f) != EOF && fwrite(data, sizeof(float), count, f) == count;
    if (fclose(f) != 0) ok = 0;
    if (!ok) return nf_error_set(err, NF_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    return NF_OK;
}

static size_t elem_size(const char *d)
{
    switch (d[2]) {
    case '1': return 1;
    case '2': return 2;
    case '4': return 4;
    case '8': return 8;
    }
    return 0;
}

/* Parses the header dict; fills descr and shape. */
static nf_status parse_dict(const char *path, const char *h, nf_npy *a, nf_error *err)
{
    const char *d = strstr(h, "'descr':");
    const char *fo = strstr(h, "'fortran_order':");
    const char *sh = strstr(h, "'shape':");
    if (!d || !fo || !sh) return nf_error_set(err, NF_ERR_FORMAT, "%s: .npy header lacks descr/fortran_order/shape", path);
    d = strchr(d + 8, '\'');
    if (!d || strlen(d) < 5 || d[4] != '\'') return nf_error_set(err, NF_ERR_FORMAT, "%s: bad descr", path);
    memcpy(a->descr, d + 1, 3);
    a->descr[3] = 0;
    if ((a->descr[0] != '<' && a->descr[0] != '|') || !strchr("fiub", a->descr[1]) || !elem_size(a->descr))
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "%s: dtype '%s' (expected little-endian f/i/u/b)", path, a->descr);
    if (strncmp(fo + 16, " False", 6) != 0)
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "%s: fortran_order arrays are not supported", path);
    const char *p = strchr(sh, '(');
    if (!p) return nf_error_set(err, NF_ERR_FORMAT, "%s: bad shape", path);
    p++;
    a->ndim = 0;
    a->count = 1;
    while (*p && *p != ')') {
        while (*p == ' ' || *p == ',') p++;
        if (*p == ')') break;
        char *end;
        unsigned long long v = strtoull(p, &end, 10);
        if (end == p || a->ndim == NF_NPY_MAX_DIMS) return nf_error_set(err, NF_ERR_FORMAT, "%s: bad shape", path);
        a->shape[a->ndim++] = v;
        if (v && a->count > UINT64_MAX / v) return nf_error_set(err, NF_ERR_FORMAT, "%s: shape overflows", path);
        a->count *= v;
        p = end;
    }
    return NF_OK;
}

nf_status nf_npy_read(const char *path, nf_npy *a, nf_error *err)
{
    memset(a, 0, sizeof *a);
    FILE *f = fopen(path, "rb");
    if (!f) return nf_error_set(err, NF_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    uint8_t m[12];
    nf_status st = NF_OK;
    char *h = NULL;
    if (fread(m, 1, 10, f) != 10 || memcmp(m, "\x93NUMPY", 6) != 0) {
        st = nf_error_set(err, NF_ERR_FORMAT, "%s: not a .npy file (bad magic)", path);
        goto done;
    }
    size_t hlen = (size_t)m[8] | (size_t)m[9] << 8;
    if (m[6] >= 2) { /* version 2+: 4-byte header length */
        if (fread(m + 10, 1, 2, f) != 2) {
            st = nf_error_set(err, NF_ERR_FORMAT, "%s: truncated header", path);
            goto done;
        }
        hlen |= (size_t)m[10] << 16 | (size_t)m[11] << 24;
    }
    h = malloc(hlen + 1);
    if (!h || fread(h, 1, hlen, f) != hlen) {
        st = nf_error_set(err, NF_ERR_FORMAT, "%s: truncated header", path);
        goto done;
    }
    h[hlen] = 0;
    if ((st = parse_dict(path, h, a, err))) goto done;
    size_t es = elem_size(a->descr);
    a->data = malloc(a->count ? a->count * es : 1);
    if (!a->data) {
        st = nf_error_set(err, NF_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    if (fread(a->data, es, a->count, f) != a->count)
        st = nf_error_set(err, NF_ERR_FORMAT, "%s: data ends before %" PRIu64 " elements of %s", path, a->count, a->descr);
done:
    free(h);
    fclose(f);
    if (st) nf_npy_free(a);
    return st;
}

void nf_npy_free(nf_npy *a)
{
    free(a->data);
    a->data = NULL;
}

double nf_npy_get_f64(const nf_npy *a, uint64_t i)
{
    const uint8_t *p = (const uint8_t *)a->data + i * elem_size(a->descr);
    char k = a->descr[1], s = a->descr[2];
    if (k == 'f' && s == '4') { float v; memcpy(&v, p, 4); return v; }
    if (k == 'f' && s == '8') { double v; memcpy(&v, p, 8); return v; }
    if (k == 'i' && s == '4') { int32_t v; memcpy(&v, p, 4); return v; }
    if (k == 'i' && s == '8') { int64_t v; memcpy(&v, p, 8); return (double)v; }
    if (k == 'u' && s == '4') { uint32_t v; memcpy(&v, p, 4); return v; }
    if (k == 'u' && s == '8') { uint64_t v; memcpy(&v, p, 8); return (double)v; }
    if (s == '1') return k == 'i' ? (double)(int8_t)*p : (double)*p;
    if (k == 'i' && s == '2') { int16_t v; memcpy(&v, p, 2); return v; }
    if (k == 'u' && s == '2') { uint16_t v; memcpy(&v, p, 2); return v; }
    return 0; /* f2: not produced by our oracles */
}

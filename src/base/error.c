#define _POSIX_C_SOURCE 200809L
#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *const status_names[NF_STATUS_COUNT] = {
    [NF_OK] = "ok",
    [NF_ERR_INVALID_ARG] = "invalid argument",
    [NF_ERR_IO] = "io",
    [NF_ERR_FORMAT] = "format",
    [NF_ERR_VERSION] = "version",
    [NF_ERR_UNSUPPORTED] = "unsupported",
    [NF_ERR_REFUSED] = "refused",
    [NF_ERR_NOMEM] = "out of memory",
    [NF_ERR_CUDA] = "cuda",
    [NF_ERR_INTERNAL] = "internal",
};

const char *nf_status_name(nf_status s)
{
    if ((unsigned)s >= NF_STATUS_COUNT) return "unknown status";
    return status_names[s];
}

nf_status nf_error_set(nf_error *err, nf_status code, const char *fmt, ...)
{
    if (!err) return code;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return code;
}

nf_status nf_error_prefix(nf_error *err, const char *fmt, ...)
{
    if (!err) return NF_OK;
    char head[NF_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    if (n < 0) return err->code;
    /* Build "head: old" by hand: the truncation is intended, and snprintf would warn about it. */
    char out[NF_ERROR_MSG_MAX];
    size_t cap = sizeof out - 1, len = 0;
    const char *parts[3] = {head, ": ", err->msg};
    for (int i = 0; i < 3 && len < cap; i++) {
        size_t n = strnlen(parts[i], NF_ERROR_MSG_MAX);
        if (n > cap - len) n = cap - len;
        memcpy(out + len, parts[i], n);
        len += n;
    }
    out[len] = '\0';
    memcpy(err->msg, out, len + 1);
    return err->code;
}

void nf_error_clear(nf_error *err)
{
    if (!err) return;
    err->code = NF_OK;
    err->msg[0] = '\0';
}

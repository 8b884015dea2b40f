/* Filling an nf_error. Every function here accepts err == NULL (the caller does not want text). */
#ifndef NF_BASE_ERROR_H
#define NF_BASE_ERROR_H

#include "ninfer.h"

#if defined(__GNUC__)
#define NF_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define NF_PRINTF(a, b)
#endif

/* Sets err->code and formats err->msg; returns `code` so callers can write
 *   return nf_error_set(err, NF_ERR_FORMAT, "%s: bad magic", path); */
nf_status nf_error_set(nf_error *err, nf_status code, const char *fmt, ...) NF_PRINTF(3, 4);

/* Prepends "context: " to an existing message (e.g. the file name, once known); returns err->code
 * (NF_OK when err is NULL). Truncates rather than overflows. */
nf_status nf_error_prefix(nf_error *err, const char *fmt, ...) NF_PRINTF(2, 3);

void nf_error_clear(nf_error *err);

#endif

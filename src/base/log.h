/* Leveled logging to stderr. The threshold comes from NF_LOG=debug|info|warn|error (default warn),
 * read once on first use; nf_log_set_level overrides it (the CLI's -v, tests). */
#ifndef NF_BASE_LOG_H
#define NF_BASE_LOG_H

#include "base/error.h"

typedef enum nf_log_level { NF_LOG_DEBUG = 0, NF_LOG_INFO, NF_LOG_WARN, NF_LOG_ERROR, NF_LOG_OFF } nf_log_level;

void nf_log(nf_log_level level, const char *fmt, ...) NF_PRINTF(2, 3);
nf_log_level nf_log_get_level(void);
void nf_log_set_level(nf_log_level level);
/* Parses "debug"/"info"/"warn"/"error"/"off"; returns -1 for anything else. */
int nf_log_parse_level(const char *s);

#define NF_DEBUG(...) nf_log(NF_LOG_DEBUG, __VA_ARGS__)
#define NF_INFO(...) nf_log(NF_LOG_INFO, __VA_ARGS__)
#define NF_WARN(...) nf_log(NF_LOG_WARN, __VA_ARGS__)
#define NF_ERROR(...) nf_log(NF_LOG_ERROR, __VA_ARGS__)

#endif

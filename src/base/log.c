#include "base/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const level_names[] = {"debug", "info", "warn", "error", "off"};
static int current_level = -1; /* -1: not yet read from NF_LOG */

int nf_log_parse_level(const char *s)
{
    if (!s) return -1;
    for (int i = 0; i <= NF_LOG_OFF; i++)
        if (strcmp(s, level_names[i]) == 0) return i;
    return -1;
}

nf_log_level nf_log_get_level(void)
{
    if (current_level < 0) {
        const char *env = getenv("NF_LOG");
        int lvl = nf_log_parse_level(env);
        if (env && lvl < 0)
            fprintf(stderr, "ninfer: warn: NF_LOG=%s is not one of debug|info|warn|error|off; using warn\n", env);
        current_level = lvl < 0 ? NF_LOG_WARN : lvl;
    }
    return (nf_log_level)current_level;
}

void nf_log_set_level(nf_log_level level) { current_level = (int)level; }

void nf_log(nf_log_level level, const char *fmt, ...)
{
    if (level < nf_log_get_level() || level >= NF_LOG_OFF) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    /* One fputs per line so lines from worker threads do not interleave mid-line. */
    char out[1100];
    snprintf(out, sizeof out, "ninfer: %s: %s\n", level_names[level], line);
    fputs(out, stderr);
}

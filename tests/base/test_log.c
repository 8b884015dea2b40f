#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <unistd.h>

#include "base/log.h"
#include "nf_test.h"

/* Runs fn with stderr redirected to a temp file; returns what it wrote. */
static void capture(void (*fn)(void), char *buf, size_t n)
{
    fflush(stderr);
    FILE *tmp = tmpfile();
    int saved = dup(2);
    dup2(fileno(tmp), 2);
    fn();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(tmp);
    size_t got = fread(buf, 1, n - 1, tmp);
    buf[got] = '\0';
    fclose(tmp);
}

static void emit_all(void)
{
    NF_DEBUG("d%d", 1);
    NF_INFO("i%d", 2);
    NF_WARN("w%d", 3);
    NF_ERROR("e%d", 4);
}

int main(void)
{
    CHECK_EQ_INT(nf_log_parse_level("debug"), NF_LOG_DEBUG);
    CHECK_EQ_INT(nf_log_parse_level("error"), NF_LOG_ERROR);
    CHECK_EQ_INT(nf_log_parse_level("off"), NF_LOG_OFF);
    CHECK_EQ_INT(nf_log_parse_level("loud"), -1);
    CHECK_EQ_INT(nf_log_parse_level(NULL), -1);

    /* The environment sets the initial level. */
    setenv("NF_LOG", "info", 1);
    CHECK_EQ_INT(nf_log_get_level(), NF_LOG_INFO);

    char out[512];
    capture(emit_all, out, sizeof out);
    CHECK(strstr(out, "d1") == NULL);
    CHECK_CONTAINS(out, "ninfer: info: i2\n");
    CHECK_CONTAINS(out, "ninfer: warn: w3\n");
    CHECK_CONTAINS(out, "ninfer: error: e4\n");

    nf_log_set_level(NF_LOG_ERROR);
    capture(emit_all, out, sizeof out);
    CHECK(strstr(out, "i2") == NULL && strstr(out, "w3") == NULL);
    CHECK_CONTAINS(out, "e4");

    nf_log_set_level(NF_LOG_OFF);
    capture(emit_all, out, sizeof out);
    CHECK_EQ_INT(strlen(out), 0);
    return nf_test_report();
}

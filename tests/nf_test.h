/* A minimal test harness: each test program is one translation unit that includes this header,
 * runs CHECKs, and ends main with `return nf_test_report();`. A failed CHECK prints the file, line,
 * the expression and (for the typed forms) both values, and the program exits non-zero.
 * Exit status 77 means "skipped" (ctest's SKIP_RETURN_CODE), used by tests that need a GPU. */
#ifndef NF_TEST_H
#define NF_TEST_H

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#define NF_TEST_SKIP 77

static int nf_test_checks_, nf_test_failed_;

#define CHECK(cond)                                                                               \
    do {                                                                                          \
        nf_test_checks_++;                                                                        \
        if (!(cond)) {                                                                            \
            nf_test_failed_++;                                                                    \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);              \
        }                                                                                         \
    } while (0)

#define CHECK_MSG(cond, ...)                                                                      \
    do {                                                                                          \
        nf_test_checks_++;                                                                        \
        if (!(cond)) {                                                                            \
            nf_test_failed_++;                                                                    \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);              \
            fprintf(stderr, __VA_ARGS__);                                                         \
            fputc('\n', stderr);                                                                  \
        }                                                                                         \
    } while (0)

#define CHECK_EQ_U64(a, b)                                                                        \
    do {                                                                                          \
        uint64_t a_ = (uint64_t)(a), b_ = (uint64_t)(b);                                          \
        CHECK_MSG(a_ == b_, "%" PRIu64 " != %" PRIu64, a_, b_);                                   \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                                        \
    do {                                                                                          \
        long long a_ = (long long)(a), b_ = (long long)(b);                                       \
        CHECK_MSG(a_ == b_, "%lld != %lld", a_, b_);                                              \
    } while (0)

/* The message must contain `needle` (errors must name what is wrong). */
#define CHECK_CONTAINS(hay, needle)                                                               \
    do {                                                                                          \
        const char *h_ = (hay), *n_ = (needle);                                                   \
        CHECK_MSG(h_ && strstr(h_, n_), "'%s' does not contain '%s'", h_ ? h_ : "(null)", n_);    \
    } while (0)

static inline int nf_test_report_named(const char *name)
{
    printf("%s: %d checks, %d failed\n", name, nf_test_checks_, nf_test_failed_);
    if (nf_test_checks_ == 0) {
        fprintf(stderr, "%s: no checks ran\n", name);
        return 1;
    }
    return nf_test_failed_ ? 1 : 0;
}
#define nf_test_report() nf_test_report_named(__FILE__)

#endif

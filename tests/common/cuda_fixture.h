/* The start of a GPU engine test over tests/fixtures: where the fixtures are ($NF_TEST_DATA, else the
 * build tree's tests/), checked first, GPU or not (a bundle run from another copy of the tree, whose
 * CTestTestfile sets NF_TEST_DATA, must find that copy's and says which it reads), then the GPU. */
#ifndef NF_TESTS_CUDA_FIXTURE_H
#define NF_TESTS_CUDA_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "backend/cuda/cuda_backend.h"

static inline const char *fx_data_dir(void)
{
    const char *d = getenv("NF_TEST_DATA");
    return d && *d ? d : NF_TEST_DATA;
}

/* -1 when the test can run; else the exit code: 1 when fixtures/models/<model>/config.json is not
 * readable, 77 (skipped) without a GPU. */
static inline int fx_cuda_ready(const char *model)
{
    char probe[1100];
    snprintf(probe, sizeof probe, "%s/fixtures/models/%s/config.json", fx_data_dir(), model);
    printf("fixtures: %s/fixtures/models (NF_TEST_DATA %s)\n", fx_data_dir(),
           getenv("NF_TEST_DATA") && *getenv("NF_TEST_DATA") ? "set" : "unset: the build tree's path");
    if (access(probe, R_OK) != 0) {
        printf("FAIL: %s is not readable: set NF_TEST_DATA to the tree's tests/ folder\n", probe);
        return 1;
    }
    char why[256];
    if (nf_cuda_device_count(why, sizeof why) < 1) {
        printf("SKIP: %s\n", why);
        return 77;
    }
    return -1;
}

#endif

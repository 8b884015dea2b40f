/* The skip rule of the cuda-labelled tests: with no GPU visible a test says so and exits
 * NF_TEST_SKIP (77, which ctest reports as skipped, not passed). Only for tests linked to cudart. */
#ifndef NF_TESTS_NEED_GPU_H
#define NF_TESTS_NEED_GPU_H

#include <cuda_runtime_api.h>
#include <stdio.h>

/* 1 when a CUDA device is visible; else prints "<name>: no GPU visible: skipped" and returns 0. */
static inline int nf_test_gpu_visible(const char *name)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) return 1;
    printf("%s: no GPU visible: skipped\n", name);
    return 0;
}

#endif

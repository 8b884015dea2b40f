/* The CUDA backend's answers in a build without CUDA (NF_CUDA=OFF or no nvcc). */
#include <stdio.h>

#include "backend/cuda/cuda_backend.h"

int nf_cuda_compiled(void) { return 0; }

const char *nf_cuda_archs(void) { return ""; }

int nf_cuda_device_count(char *why, size_t why_size)
{
    if (why && why_size) snprintf(why, why_size, "this build has no CUDA backend");
    return 0;
}

int nf_cuda_device_describe(int dev, char *buf, size_t size)
{
    (void)dev;
    if (buf && size) buf[0] = '\0';
    return -1;
}

// Device discovery for the CLI's --version and for commands choosing a device.
#include <cuda_runtime.h>
#include <stdio.h>

#include "backend/cuda/cuda_backend.h"

extern "C" int nf_cuda_compiled(void) { return 1; }

extern "C" const char *nf_cuda_archs(void) { return NF_CUDA_ARCH_LIST; }

extern "C" int nf_cuda_device_count(char *why, size_t why_size)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        if (why && why_size) snprintf(why, why_size, "%s", cudaGetErrorString(e));
        cudaGetLastError(); // clear the sticky-free error so later calls start clean
        return 0;
    }
    if (n == 0 && why && why_size) snprintf(why, why_size, "no CUDA device");
    return n;
}

extern "C" int nf_cuda_device_describe(int dev, char *buf, size_t size)
{
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, dev) != cudaSuccess) return -1;
    snprintf(buf, size, "%s, sm_%d%d, %d SMs, %.1f GiB", p.name, p.major, p.minor, p.multiProcessorCount,
             (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
    return 0;
}

extern "C" int nf_cuda_mem_info(size_t *free_bytes, size_t *total_bytes)
{
    return cudaMemGetInfo(free_bytes, total_bytes) == cudaSuccess ? 0 : -1;
}

// Proves the toolchain and the skip logic: a kernel built for our targets runs on the GPU and its
// result matches the CPU exactly. Without a GPU the test exits 77 and ctest reports it skipped.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include "nf_test.h"
#include "common/need_gpu.h"

__global__ void axpy_kernel(int n, float a, const float *x, float *y)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __fmaf_rn(a, x[i], y[i]);
}

int main(void)
{
    if (!nf_test_gpu_visible("test_cuda_smoke")) return NF_TEST_SKIP;
    const int n = 1 << 20;
    float *hx = (float *)malloc(n * sizeof(float)), *hy = (float *)malloc(n * sizeof(float));
    float *out = (float *)malloc(n * sizeof(float));
    for (int i = 0; i < n; i++) {
        hx[i] = (float)(i % 1000) * 0.25f;
        hy[i] = (float)(i % 77) - 30.0f;
    }
    float *dx, *dy;
    CHECK(cudaMalloc(&dx, n * sizeof(float)) == cudaSuccess);
    CHECK(cudaMalloc(&dy, n * sizeof(float)) == cudaSuccess);
    cudaMemcpy(dx, hx, n * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemcpy(dy, hy, n * sizeof(float), cudaMemcpyHostToDevice);
    axpy_kernel<<<(n + 255) / 256, 256>>>(n, 1.5f, dx, dy);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(cudaMemcpy(out, dy, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
    int bad = 0;
    for (int i = 0; i < n; i++)
        if (out[i] != fmaf(1.5f, hx[i], hy[i])) bad++;
    CHECK_EQ_INT(bad, 0);
    cudaDeviceProp p;
    cudaGetDeviceProperties(&p, 0);
    printf("test_cuda_smoke: ran on %s (sm_%d%d)\n", p.name, p.major, p.minor);
    cudaFree(dx);
    cudaFree(dy);
    free(hx);
    free(hy);
    free(out);
    return nf_test_report();
}

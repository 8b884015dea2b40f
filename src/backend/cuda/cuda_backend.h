/* What the host side may ask of the CUDA backend without knowing whether it was compiled in.
 * Built with CUDA these live in probe.cu; without it, stub.c answers "not compiled in". The CUDA
 * runtime is linked statically and loads the driver (libcuda) only when first called, so the
 * ninfer binary starts on machines with no GPU and no driver. */
#ifndef NF_BACKEND_CUDA_H
#define NF_BACKEND_CUDA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when this build contains CUDA kernels. */
int nf_cuda_compiled(void);
/* The GPU architectures the kernels were compiled for, e.g. "sm_90a sm_120a"; "" without CUDA. */
const char *nf_cuda_archs(void);
/* Number of visible GPUs. On 0, `why` (if not NULL) receives the reason, e.g. "no CUDA driver". */
int nf_cuda_device_count(char *why, size_t why_size);
/* Name and compute capability of device `dev` ("NVIDIA H200, sm_90"); returns 0 on success. */
int nf_cuda_device_describe(int dev, char *buf, size_t size);

/* Free and total device memory of the current device; returns 0 on success. */
int nf_cuda_mem_info(size_t *free_bytes, size_t *total_bytes);

#ifdef __cplusplus
}
#endif
#endif

/* The GPU side of `ninfer bench sparse-moe` (C API over CUDA, in tools/bench/gpu_bench.cu):
 * ceilings measured in the same run (DRAM read, cuBLAS bf16 GEMM), graph/stream timing with a
 * cold or warm L2, device memory helpers, and the peer arm (per-expert cuBLAS bf16 GEMMs). */
#ifndef NF_TOOLS_GPU_BENCH_H
#define NF_TOOLS_GPU_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

typedef struct nf_gpu_bench nf_gpu_bench;

/* Number of visible GPUs (0 with the reason in why, also without CUDA compiled in). */
int nf_gpu_bench_devices(char *why, size_t n);

nf_status nf_gpu_bench_create(size_t flush_bytes, nf_gpu_bench **out, nf_error *err);
void nf_gpu_bench_destroy(nf_gpu_bench *b);
void *nf_gpu_bench_stream(nf_gpu_bench *b);
const char *nf_gpu_bench_device_name(nf_gpu_bench *b);

/* Median GB/s of a streaming read of `bytes` (>= 1 GiB recommended) over `repeat` passes. */
double nf_gpu_bench_dram_read(nf_gpu_bench *b, size_t bytes, int repeat);
/* The DRAM read peak measured now on a bench of its own (1 GiB streamed, median of 5): the ceiling
 * the engine commands put their GB/s against; < 0 when no GPU answers. */
double nf_gpu_bench_read_peak(void);
/* Median TFLOP/s of a cuBLAS bf16 GEMM n x n x n (fp32 accumulate); < 0 with why if cuBLAS cannot
 * be loaded (it is opened at run time, so ninfer never needs it to start). */
double nf_gpu_bench_gemm_peak(nf_gpu_bench *b, int n, int repeat, char *why, size_t why_n);
/* Smallest non-zero difference between two CUDA event timings seen over many empty intervals. */
double nf_gpu_bench_event_resolution_us(nf_gpu_bench *b);

/* Times `enqueue(ctx, stream)`: as one CUDA graph replayed (graph = 1) or issued on the stream, with
 * the L2 flushed before every repeat (cold = 1) by reading the flush buffer, which leaves it holding
 * clean lines (gpu_bench.cu says why). samples[repeat] in us. */
typedef nf_status (*nf_gpu_enqueue_fn)(void *ctx, void *stream, nf_error *err);
nf_status nf_gpu_bench_time(nf_gpu_bench *b, nf_gpu_enqueue_fn enqueue, void *ctx, int graph, int cold, int warmup,
                            int repeat, double *samples, nf_error *err);

void *nf_gpu_alloc(size_t bytes, nf_error *err);
void nf_gpu_free(void *p);
nf_status nf_gpu_upload(void *dst, const void *src, size_t bytes, nf_error *err);
nf_status nf_gpu_download(void *dst, const void *src, size_t bytes, nf_error *err);
/* Fills n bf16 values with deterministic pseudo-random N(0,1)-like values. */
void nf_gpu_fill_bf16(uint16_t *p, size_t n, uint64_t seed, float scale);

/* The peer arm: the same routed work as per-expert cuBLAS bf16 GEMMs (router GEMM, gather, gate/up
 * GEMM per active expert, SwiGLU, down GEMM per active expert, combine). */
typedef struct nf_gpu_peer nf_gpu_peer;
nf_status nf_gpu_peer_create(nf_gpu_bench *b, uint32_t H, uint32_t E, uint32_t k, uint32_t I, uint32_t max_tokens,
                             nf_gpu_peer **out, nf_error *err);
void nf_gpu_peer_destroy(nf_gpu_peer *p);
/* Sets the routing (host ids[T][k]) and input for the next enqueues. */
nf_status nf_gpu_peer_prepare(nf_gpu_peer *p, const int32_t *ids, uint32_t T, const uint16_t *dx, nf_error *err);
nf_status nf_gpu_peer_enqueue(void *peer, void *stream, nf_error *err);

#endif

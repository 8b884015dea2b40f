/* The GPU side of the benchmark in a build without CUDA: every call says so. */
#include <stdio.h>

#include "gpu_bench.h"

int nf_gpu_bench_devices(char *why, size_t n)
{
    if (why) snprintf(why, n, "this build has no CUDA backend");
    return 0;
}

nf_status nf_gpu_bench_create(size_t flush_bytes, nf_gpu_bench **out, nf_error *err)
{
    (void)flush_bytes;
    *out = NULL;
    return nf_error_set(err, NF_ERR_UNSUPPORTED, "bench: this build has no CUDA backend");
}
void nf_gpu_bench_destroy(nf_gpu_bench *b) { (void)b; }
void *nf_gpu_bench_stream(nf_gpu_bench *b) { (void)b; return NULL; }
const char *nf_gpu_bench_device_name(nf_gpu_bench *b) { (void)b; return ""; }
double nf_gpu_bench_dram_read(nf_gpu_bench *b, size_t bytes, int repeat) { (void)b, (void)bytes, (void)repeat; return -1; }
double nf_gpu_bench_read_peak(void) { return -1; }
double nf_gpu_bench_gemm_peak(nf_gpu_bench *b, int n, int repeat, char *why, size_t why_n)
{
    (void)b, (void)n, (void)repeat;
    if (why) snprintf(why, why_n, "no CUDA backend");
    return -1;
}
double nf_gpu_bench_event_resolution_us(nf_gpu_bench *b) { (void)b; return -1; }
nf_status nf_gpu_bench_time(nf_gpu_bench *b, nf_gpu_enqueue_fn enqueue, void *ctx, int graph, int cold, int warmup,
                            int repeat, double *samples, nf_error *err)
{
    (void)b, (void)enqueue, (void)ctx, (void)graph, (void)cold, (void)warmup, (void)repeat, (void)samples;
    return nf_error_set(err, NF_ERR_UNSUPPORTED, "bench: this build has no CUDA backend");
}
void *nf_gpu_alloc(size_t bytes, nf_error *err)
{
    (void)bytes;
    nf_error_set(err, NF_ERR_UNSUPPORTED, "bench: this build has no CUDA backend");
    return NULL;
}
void nf_gpu_free(void *p) { (void)p; }
nf_status nf_gpu_upload(void *dst, const void *src, size_t bytes, nf_error *err)
{
    (void)dst, (void)src, (void)bytes;
    return nf_error_set(err, NF_ERR_UNSUPPORTED, "no CUDA backend");
}
nf_status nf_gpu_download(void *dst, const void *src, size_t bytes, nf_error *err)
{
    (void)dst, (void)src, (void)bytes;
    return nf_error_set(err, NF_ERR_UNSUPPORTED, "no CUDA backend");
}
void nf_gpu_fill_bf16(uint16_t *p, size_t n, uint64_t seed, float scale) { (void)p, (void)n, (void)seed, (void)scale; }
nf_status nf_gpu_peer_create(nf_gpu_bench *b, uint32_t H, uint32_t E, uint32_t k, uint32_t I, uint32_t max_tokens,
                             nf_gpu_peer **out, nf_error *err)
{
    (void)b, (void)H, (void)E, (void)k, (void)I, (void)max_tokens;
    *out = NULL;
    return nf_error_set(err, NF_ERR_UNSUPPORTED, "no CUDA backend");
}
void nf_gpu_peer_destroy(nf_gpu_peer *p) { (void)p; }
nf_status nf_gpu_peer_prepare(nf_gpu_peer *p, const int32_t *ids, uint32_t T, const uint16_t *dx, nf_error *err)
{
    (void)p, (void)ids, (void)T, (void)dx;
    return nf_error_set(err, NF_ERR_UNSUPPORTED, "no CUDA backend");
}
nf_status nf_gpu_peer_enqueue(void *peer, void *stream, nf_error *err)
{
    (void)peer, (void)stream;
    return nf_error_set(err, NF_ERR_UNSUPPORTED, "no CUDA backend");
}

// GPU side of the sparse-MoE benchmark: ceilings, timing, the cuBLAS peer arm.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

extern "C" {
#include "gpu_bench.h"
}

struct nf_gpu_bench {
    cudaStream_t s;
    cudaEvent_t e0, e1;
    void *flush;      // the cold-L2 flush's buffer, read before each timed run
    size_t flush_bytes;
    unsigned *sink;   // read_kernel's never-taken store (the DRAM ceiling's and the flush's reads)
    int read_grid;    // read_kernel's CTAs (8 an SM): the DRAM ceiling's and the flush's reads
    char name[400];
};

static nf_status cuda_fail(nf_error *err, cudaError_t e, const char *what)
{
    return nf_error_set(err, NF_ERR_CUDA, "bench: %s: %s", what, cudaGetErrorString(e));
}

extern "C" int nf_gpu_bench_devices(char *why, size_t n)
{
    int c = 0;
    cudaError_t e = cudaGetDeviceCount(&c);
    if (e != cudaSuccess || c == 0) {
        if (why) snprintf(why, n, "%s", e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device");
        cudaGetLastError();
        return 0;
    }
    return c;
}

extern "C" nf_status nf_gpu_bench_create(size_t flush_bytes, nf_gpu_bench **out, nf_error *err)
{
    nf_gpu_bench *b = (nf_gpu_bench *)calloc(1, sizeof *b);
    if (!b) return nf_error_set(err, NF_ERR_NOMEM, "bench: out of memory");
    cudaError_t e = cudaStreamCreateWithFlags(&b->s, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreate(&b->e0);
    if (e == cudaSuccess) e = cudaEventCreate(&b->e1);
    b->flush_bytes = flush_bytes;
    if (e == cudaSuccess && flush_bytes) e = cudaMalloc(&b->flush, flush_bytes);
    if (e == cudaSuccess) e = cudaMalloc(&b->sink, 4);
    if (e != cudaSuccess) { // what was made before the failure goes back
        const nf_status st = cuda_fail(err, e, "setup");
        nf_gpu_bench_destroy(b);
        return st;
    }
    cudaDeviceProp p;
    cudaGetDeviceProperties(&p, 0);
    b->read_grid = p.multiProcessorCount * 8;
    snprintf(b->name, sizeof b->name, "%.256s (sm_%d%d, %d SMs, L2 %d MiB)", p.name, p.major, p.minor, p.multiProcessorCount,
             p.l2CacheSize >> 20);
    *out = b;
    return NF_OK;
}

extern "C" void nf_gpu_bench_destroy(nf_gpu_bench *b)
{
    if (!b) return;
    cudaFree(b->flush);
    cudaFree(b->sink);
    if (b->e0) cudaEventDestroy(b->e0);
    if (b->e1) cudaEventDestroy(b->e1);
    if (b->s) cudaStreamDestroy(b->s);
    free(b);
}

extern "C" void *nf_gpu_bench_stream(nf_gpu_bench *b) { return b->s; }
extern "C" const char *nf_gpu_bench_device_name(nf_gpu_bench *b) { return b->name; }

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double median(std::vector<double> v)
{
    qsort(v.data(), v.size(), sizeof(double), cmp_d);
    return v.empty() ? NAN : v[v.size() / 2];
}

// Each thread streams 16-byte loads, several in flight; the XOR keeps the loads alive.
__global__ void read_kernel(const uint4 *p, size_t n, unsigned *sink)
{
    uint32_t acc = 0;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        uint4 a = p[i], b = p[i + stride], c = p[i + 2 * stride], d = p[i + 3 * stride];
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n; i += stride) acc ^= p[i].x ^ p[i].y ^ p[i].z ^ p[i].w;
    if (acc == 0x12345678u) *sink = acc;
}

extern "C" double nf_gpu_bench_dram_read(nf_gpu_bench *b, size_t bytes, int repeat)
{
    void *buf;
    if (cudaMalloc(&buf, bytes) != cudaSuccess) return -1;
    cudaMemsetAsync(buf, 1, bytes, b->s);
    std::vector<double> gbs;
    for (int r = 0; r < repeat + 2; r++) {
        cudaEventRecord(b->e0, b->s);
        read_kernel<<<b->read_grid, 512, 0, b->s>>>((const uint4 *)buf, bytes / 16, b->sink);
        cudaEventRecord(b->e1, b->s);
        cudaEventSynchronize(b->e1);
        float ms;
        cudaEventElapsedTime(&ms, b->e0, b->e1);
        if (r >= 2) gbs.push_back(bytes / (ms * 1e-3) / 1e9);
    }
    cudaFree(buf);
    return median(gbs);
}

extern "C" double nf_gpu_bench_read_peak(void)
{
    nf_gpu_bench *b = nullptr;
    const double peak = nf_gpu_bench_create(0, &b, nullptr) ? -1 : nf_gpu_bench_dram_read(b, (size_t)1 << 30, 5);
    nf_gpu_bench_destroy(b);
    return peak;
}

// cuBLAS is opened at run time: the ninfer binary must start where it is absent.
struct Cublas {
    void *lib = nullptr;
    decltype(&cublasCreate_v2) create = nullptr;
    decltype(&cublasDestroy_v2) destroy = nullptr;
    decltype(&cublasSetStream_v2) set_stream = nullptr;
    cublasStatus_t (*gemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void *,
                           const void *, cudaDataType, int, const void *, cudaDataType, int, const void *, void *,
                           cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
    cublasHandle_t h = nullptr;
};

static int cublas_open(Cublas *c, cudaStream_t s, char *why, size_t n)
{
    const char *names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
    for (const char *nm : names)
        if ((c->lib = dlopen(nm, RTLD_NOW | RTLD_LOCAL))) break;
    if (!c->lib) {
        snprintf(why, n, "cannot load libcublas: %s", dlerror());
        return 0;
    }
    c->create = (decltype(c->create))dlsym(c->lib, "cublasCreate_v2");
    c->destroy = (decltype(c->destroy))dlsym(c->lib, "cublasDestroy_v2");
    c->set_stream = (decltype(c->set_stream))dlsym(c->lib, "cublasSetStream_v2");
    c->gemm = (decltype(c->gemm))dlsym(c->lib, "cublasGemmEx");
    if (!c->create || !c->destroy || !c->set_stream || !c->gemm || c->create(&c->h) != CUBLAS_STATUS_SUCCESS) {
        snprintf(why, n, "libcublas lacks the needed symbols or cannot create a handle");
        return 0;
    }
    c->set_stream(c->h, s);
    return 1;
}

static void cublas_close(Cublas *c)
{
    if (c->h) c->destroy(c->h);
    // the library stays loaded: cuBLAS keeps state the runtime refers to until exit
}

// Row-major C[M][N] = A[M][K] . W[N][K]^T (bf16 in, out, fp32 accumulate).
static cublasStatus_t gemm_rm(Cublas *c, int M, int N, int K, const void *A, const void *W, void *C)
{
    const float one = 1.f, zero = 0.f;
    return c->gemm(c->h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, W, CUDA_R_16BF, K, A, CUDA_R_16BF, K, &zero, C,
                   CUDA_R_16BF, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

__global__ void fill_bf16_kernel(uint16_t *p, size_t n, uint64_t seed, float scale)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = seed + i * 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        // sum of four uniforms, centred: roughly normal with unit variance
        float u = ((z & 0xFFFF) + ((z >> 16) & 0xFFFF) + ((z >> 32) & 0xFFFF) + (z >> 48)) / 65536.0f - 2.0f;
        p[i] = __bfloat16_as_ushort(__float2bfloat16_rn(u * 1.732f * scale));
    }
}

extern "C" void nf_gpu_fill_bf16(uint16_t *p, size_t n, uint64_t seed, float scale)
{
    fill_bf16_kernel<<<1024, 256>>>(p, n, seed, scale);
    cudaDeviceSynchronize();
}

extern "C" double nf_gpu_bench_gemm_peak(nf_gpu_bench *b, int n, int repeat, char *why, size_t why_n)
{
    Cublas c;
    if (!cublas_open(&c, b->s, why, why_n)) return -1;
    uint16_t *A, *B, *C;
    size_t bytes = (size_t)n * n * 2;
    if (cudaMalloc(&A, bytes) != cudaSuccess || cudaMalloc(&B, bytes) != cudaSuccess ||
        cudaMalloc(&C, bytes) != cudaSuccess) {
        snprintf(why, why_n, "cannot allocate the GEMM operands");
        return -1;
    }
    nf_gpu_fill_bf16(A, (size_t)n * n, 1, 1.f);
    nf_gpu_fill_bf16(B, (size_t)n * n, 2, 1.f);
    std::vector<double> tf;
    for (int r = 0; r < repeat + 3; r++) {
        cudaEventRecord(b->e0, b->s);
        gemm_rm(&c, n, n, n, A, B, C);
        cudaEventRecord(b->e1, b->s);
        cudaEventSynchronize(b->e1);
        float ms;
        cudaEventElapsedTime(&ms, b->e0, b->e1);
        if (r >= 3) tf.push_back(2.0 * n * n * (double)n / (ms * 1e-3) / 1e12);
    }
    cudaFree(A);
    cudaFree(B);
    cudaFree(C);
    cublas_close(&c);
    return median(tf);
}

extern "C" double nf_gpu_bench_event_resolution_us(nf_gpu_bench *b)
{
    double best = INFINITY;
    for (int i = 0; i < 200; i++) {
        cudaEventRecord(b->e0, b->s);
        cudaEventRecord(b->e1, b->s);
        cudaEventSynchronize(b->e1);
        float ms;
        cudaEventElapsedTime(&ms, b->e0, b->e1);
        if (ms > 0 && ms * 1e3 < best) best = ms * 1e3;
    }
    return best;
}

// Cold L2 for the next timed run: a read of a buffer several times the L2's size, which leaves the L2
// holding clean lines of it. A write (the memset this replaced) left every line dirty, so each line the
// timed run brought in first wrote one back: up to twice a decode step's DRAM traffic, where a decode
// step's kernels write little (activations) and the L2 a layer meets is mostly clean. H200, one binary
// and call, the three-launch T = 1 route: nvfp4 28.06 -> 26.82 us, bf16 48.37 -> 41.06 us
// (docs/bench.md, "Cold L2").
static void flush_l2(nf_gpu_bench *b)
{
    read_kernel<<<b->read_grid, 512, 0, b->s>>>((const uint4 *)b->flush, b->flush_bytes / 16, b->sink);
}

extern "C" nf_status nf_gpu_bench_time(nf_gpu_bench *b, nf_gpu_enqueue_fn enqueue, void *ctx, int graph, int cold,
                                       int warmup, int repeat, double *samples, nf_error *err)
{
    cudaGraph_t g = nullptr;
    cudaGraphExec_t ge = nullptr;
    if (graph) {
        cudaError_t e = cudaStreamBeginCapture(b->s, cudaStreamCaptureModeThreadLocal);
        if (e != cudaSuccess) return cuda_fail(err, e, "begin capture");
        nf_status st = enqueue(ctx, b->s, err);
        e = cudaStreamEndCapture(b->s, &g);
        if (st != NF_OK) return st;
        if (e != cudaSuccess) return cuda_fail(err, e, "end capture");
        e = cudaGraphInstantiate(&ge, g, 0);
        if (e != cudaSuccess) return cuda_fail(err, e, "graph instantiate");
    }
    nf_status st = NF_OK;
    for (int r = 0; r < warmup + repeat && st == NF_OK; r++) {
        if (cold && b->flush) flush_l2(b);
        cudaEventRecord(b->e0, b->s);
        if (graph) {
            cudaError_t e = cudaGraphLaunch(ge, b->s);
            if (e != cudaSuccess) st = cuda_fail(err, e, "graph launch");
        } else {
            st = enqueue(ctx, b->s, err);
        }
        cudaEventRecord(b->e1, b->s);
        cudaError_t e = cudaEventSynchronize(b->e1);
        if (e != cudaSuccess && st == NF_OK) st = cuda_fail(err, e, "timed run");
        float ms = 0;
        cudaEventElapsedTime(&ms, b->e0, b->e1);
        if (r >= warmup) samples[r - warmup] = ms * 1e3;
    }
    if (ge) cudaGraphExecDestroy(ge);
    if (g) cudaGraphDestroy(g);
    return st;
}

extern "C" void *nf_gpu_alloc(size_t bytes, nf_error *err)
{
    void *p = nullptr;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        cuda_fail(err, e, "cudaMalloc");
        cudaGetLastError();
        return nullptr;
    }
    return p;
}
extern "C" void nf_gpu_free(void *p) { cudaFree(p); }
extern "C" nf_status nf_gpu_upload(void *dst, const void *src, size_t n, nf_error *err)
{
    cudaError_t e = cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice);
    return e == cudaSuccess ? NF_OK : cuda_fail(err, e, "upload");
}
extern "C" nf_status nf_gpu_download(void *dst, const void *src, size_t n, nf_error *err)
{
    cudaError_t e = cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost);
    return e == cudaSuccess ? NF_OK : cuda_fail(err, e, "download");
}

// ---- the peer arm ---------------------------------------------------------------------------------

struct nf_gpu_peer {
    Cublas c;
    uint32_t H, E, k, I, max_tokens;
    uint16_t *wr, *wgu, *wdn;      // router [E][H], gate_up [E][2I][H], down [E][H][I]
    uint16_t *logits;              // [T][E]
    uint16_t *xg, *c1, *act, *y;   // [T*k][H], [T*k][2I], [T*k][I], [T*k][H]
    int32_t *gather, *slot;        // [T*k]
    const uint16_t *x;
    uint16_t *out;                 // [T][H]
    uint32_t T;
    std::vector<uint32_t> seg_expert, seg_start, seg_count;
};

__global__ void gather_kernel(const uint16_t *x, const int32_t *idx, uint32_t n, uint32_t H, uint16_t *xg)
{
    for (uint32_t p = blockIdx.x; p < n; p += gridDim.x)
        for (uint32_t h = threadIdx.x; h < H; h += blockDim.x) xg[(size_t)p * H + h] = x[(size_t)idx[p] * H + h];
}
__global__ void swiglu_kernel(const uint16_t *c1, uint32_t n, uint32_t I, uint16_t *act)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (size_t)n * I; i += (size_t)gridDim.x * blockDim.x) {
        size_t p = i / I, r = i % I;
        float g = __bfloat162float(__ushort_as_bfloat16(c1[p * 2 * I + r]));
        float u = __bfloat162float(__ushort_as_bfloat16(c1[p * 2 * I + I + r]));
        act[i] = __bfloat16_as_ushort(__float2bfloat16_rn(g / (1.f + expf(-g)) * u));
    }
}
__global__ void peer_combine_kernel(const uint16_t *y, const int32_t *slot, uint32_t k, uint32_t H, uint16_t *out)
{
    uint32_t t = blockIdx.x;
    for (uint32_t h = threadIdx.x; h < H; h += blockDim.x) {
        float acc = 0;
        for (uint32_t j = 0; j < k; j++) acc += __bfloat162float(__ushort_as_bfloat16(y[(size_t)slot[t * k + j] * H + h]));
        out[(size_t)t * H + h] = __bfloat16_as_ushort(__float2bfloat16_rn(acc / k));
    }
}

extern "C" nf_status nf_gpu_peer_create(nf_gpu_bench *b, uint32_t H, uint32_t E, uint32_t k, uint32_t I,
                                        uint32_t max_tokens, nf_gpu_peer **out, nf_error *err)
{
    nf_gpu_peer *p = new nf_gpu_peer();
    char why[256];
    if (!cublas_open(&p->c, b->s, why, sizeof why)) {
        delete p;
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "bench peer arm: %s", why);
    }
    p->H = H, p->E = E, p->k = k, p->I = I, p->max_tokens = max_tokens;
    size_t n = (size_t)max_tokens * k;
    cudaError_t e = cudaSuccess;
    void **bufs[] = {(void **)&p->wr, (void **)&p->wgu, (void **)&p->wdn, (void **)&p->logits, (void **)&p->xg,
                     (void **)&p->c1, (void **)&p->act, (void **)&p->y, (void **)&p->gather, (void **)&p->slot,
                     (void **)&p->out};
    size_t sizes[] = {(size_t)E * H * 2, (size_t)E * 2 * I * H * 2, (size_t)E * H * I * 2, (size_t)max_tokens * E * 2,
                      n * H * 2, n * 2 * I * 2, n * I * 2, n * H * 2, n * 4, n * 4, (size_t)max_tokens * H * 2};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0] && e == cudaSuccess; i++) e = cudaMalloc(bufs[i], sizes[i]);
    if (e != cudaSuccess) {
        nf_gpu_peer_destroy(p);
        return cuda_fail(err, e, "peer arm buffers");
    }
    nf_gpu_fill_bf16(p->wr, (size_t)E * H, 11, 0.02f);
    nf_gpu_fill_bf16(p->wgu, (size_t)E * 2 * I * H, 12, 0.02f);
    nf_gpu_fill_bf16(p->wdn, (size_t)E * H * I, 13, 0.02f);
    *out = p;
    return NF_OK;
}

extern "C" void nf_gpu_peer_destroy(nf_gpu_peer *p)
{
    if (!p) return;
    void *bufs[] = {p->wr, p->wgu, p->wdn, p->logits, p->xg, p->c1, p->act, p->y, p->gather, p->slot, p->out};
    for (void *b : bufs) cudaFree(b);
    cublas_close(&p->c);
    delete p;
}

extern "C" nf_status nf_gpu_peer_prepare(nf_gpu_peer *p, const int32_t *ids, uint32_t T, const uint16_t *dx,
                                         nf_error *err)
{
    if (T > p->max_tokens) return nf_error_set(err, NF_ERR_INVALID_ARG, "peer arm: T %u > %u", T, p->max_tokens);
    const uint32_t k = p->k, E = p->E;
    std::vector<uint32_t> cnt(E, 0), cur(E, 0);
    for (size_t i = 0; i < (size_t)T * k; i++) cnt[ids[i]]++;
    p->seg_expert.clear();
    p->seg_start.clear();
    p->seg_count.clear();
    uint32_t off = 0;
    for (uint32_t e = 0; e < E; e++) {
        cur[e] = off;
        if (cnt[e]) {
            p->seg_expert.push_back(e);
            p->seg_start.push_back(off);
            p->seg_count.push_back(cnt[e]);
        }
        off += cnt[e];
    }
    std::vector<int32_t> gather((size_t)T * k), slot((size_t)T * k);
    for (size_t i = 0; i < (size_t)T * k; i++) {
        uint32_t pos = cur[ids[i]]++;
        gather[pos] = (int32_t)(i / k);
        slot[i] = (int32_t)pos;
    }
    cudaMemcpy(p->gather, gather.data(), gather.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(p->slot, slot.data(), slot.size() * 4, cudaMemcpyHostToDevice);
    p->x = dx;
    p->T = T;
    return NF_OK;
}

extern "C" nf_status nf_gpu_peer_enqueue(void *peer, void *stream, nf_error *err)
{
    nf_gpu_peer *p = (nf_gpu_peer *)peer;
    cudaStream_t s = (cudaStream_t)stream;
    p->c.set_stream(p->c.h, s);
    const uint32_t H = p->H, I = p->I, k = p->k, n = p->T * k;
    cublasStatus_t cs = gemm_rm(&p->c, (int)p->T, (int)p->E, (int)H, p->x, p->wr, p->logits);
    gather_kernel<<<n < 4096 ? n : 4096, 256, 0, s>>>(p->x, p->gather, n, H, p->xg);
    for (size_t i = 0; i < p->seg_expert.size() && cs == CUBLAS_STATUS_SUCCESS; i++) {
        size_t e = p->seg_expert[i], st = p->seg_start[i];
        cs = gemm_rm(&p->c, (int)p->seg_count[i], (int)(2 * I), (int)H, p->xg + st * H, p->wgu + e * 2 * I * H,
                     p->c1 + st * 2 * I);
    }
    swiglu_kernel<<<1024, 256, 0, s>>>(p->c1, n, I, p->act);
    for (size_t i = 0; i < p->seg_expert.size() && cs == CUBLAS_STATUS_SUCCESS; i++) {
        size_t e = p->seg_expert[i], st = p->seg_start[i];
        cs = gemm_rm(&p->c, (int)p->seg_count[i], (int)H, (int)I, p->act + st * I, p->wdn + e * H * I, p->y + st * H);
    }
    peer_combine_kernel<<<p->T, 256, 0, s>>>(p->y, p->slot, k, H, p->out);
    if (cs != CUBLAS_STATUS_SUCCESS) return nf_error_set(err, NF_ERR_CUDA, "peer arm: cuBLAS GEMM failed (%d)", (int)cs);
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? NF_OK : cuda_fail(err, e, "peer arm kernels");
}

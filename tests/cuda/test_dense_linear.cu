// The decoder's dense linear layer (decoder/ops.cu linear) above kGemvMaxT on shapes neither GEMM
// takes whole (rows not a multiple of 128: a GDN layer's 64-row in_proj_ba, a 200-row matrix), where the
// positions run through the GEMV in groups of 64 (DenseTables tile_m0_64 / count64, written by
// prep_tables), and past kSplitMaxRows (1040 rows), where they stay one group; bf16 rows of at least
// one 128-row tile (200, 1040) take the prefill GEMM on their whole tiles and the GEMV on the tail.
// Reached as the decoder reaches it: prep_tables for T, then linear(), launched on a stream and again
// captured in a graph (the same bits). Against a double reference over the weights' values (bf16 as
// they are; q8_0 and q4_k as the CPU codec dequantizes them) and bf16 inputs.
//
// Bound. Every output is one row's dot with one position's input whichever CTA computes it: the
// bf16 weights take the tensor-core GEMV (within 2^-17 sum |w x| at these widths: the argument in
// test_gemv_mma.cu's header) or the bf16 GEMM (the same exact products, f32 accumulation over at most
// 2048 terms: within the same order), q8_0 / q4_k the f32 CUDA-core GEMV (the weight decoded in f32
// from the same scales as the CPU's, one rounding of each product, f32 chains of at most cols / 32
// blocks: below 2^-17 sum |w x| at cols 2048). The test allows 2^-15 sum_i |w_i x_i|. A group that
// starts at the wrong position, a count past T or a missing group leaves outputs unwritten (the
// NaN fill), writes past T into the guard rows, or pairs a row with another position's input (off
// by about sum |w x| / sqrt(cols), hundreds of times the allowance); a tail written at the wrong rows
// leaves rows unwritten or misplaced.
//
// Data: weights N(0, 1) per element times a per-row amplitude (1, 3, 1/2, 2 by row % 4); inputs
// N(0, 1) rounded to bf16, a different amplitude per position (2^((t % 7) - 3)) so a position paired
// with another's input is off by its ratio too. Output rows are out_stride = rows + 8 apart and
// the buffer holds T + 8 rows: the 8 guard columns of each row and the rows past T must keep their
// NaN fill.
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <vector>

#include "backend/cuda/decoder/ops.cuh"

extern "C" {
#include "codec/codec.h"
#include "common/cuda_test_util.h"
}
#include "nf_test.h"
#include "common/need_gpu.h"

namespace {

uint64_t rng = 0x5DEECE66Dull;
float nrand() { return nf_test_nrand(&rng); }

constexpr uint32_t kMaxT = 300, kGuardRows = 8, kGuardCols = 8;

struct DevBuf {
    void *p = nullptr;
    explicit DevBuf(size_t bytes) { CHECK(cudaMalloc(&p, bytes) == cudaSuccess); }
    ~DevBuf() { cudaFree(p); }
};

// rows x cols weights in codec c, their values as the kernels should see them in deq.
std::vector<uint8_t> make_weights(int codec, uint32_t rows, uint32_t cols, std::vector<float> &deq)
{
    const float amp[4] = {1.0f, 3.0f, 0.5f, 2.0f};
    std::vector<float> w((size_t)rows * cols);
    for (uint32_t r = 0; r < rows; r++)
        for (uint32_t i = 0; i < cols; i++) w[(size_t)r * cols + i] = nrand() * amp[r % 4];
    deq.resize(w.size());
    if (codec == NF_CODEC_BF16) {
        std::vector<uint8_t> payload(w.size() * 2);
        for (size_t i = 0; i < w.size(); i++) {
            const uint16_t h = nf_test_f2bf(w[i]);
            memcpy(&payload[2 * i], &h, 2);
            deq[i] = nf_test_bf2f(h);
        }
        return payload;
    }
    const nf_codec *c = nf_codec_get((nf_codec_id)codec);
    const size_t row_bytes = (size_t)cols / c->block_elems * c->block_bytes;
    std::vector<uint8_t> payload(row_bytes * rows);
    for (uint32_t r = 0; r < rows; r++) {
        c->quantize_row(&w[(size_t)r * cols], &payload[r * row_bytes], cols);
        c->dequantize_row(&payload[r * row_bytes], &deq[(size_t)r * cols], cols);
    }
    return payload;
}

// Runs linear() over T positions (captured in a graph when graph), the outputs into out (host).
bool run_linear(const nf::dec::Linear &L, const nf::dec::DenseTables &tab, const uint16_t *x, uint32_t T,
                float *dout, uint32_t stride, size_t out_floats, bool graph, std::vector<float> &out)
{
    CHECK(cudaMemset(dout, 0xff, out_floats * 4) == cudaSuccess); // NaN fill
    cudaStream_t st = nullptr;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess);
    auto launch = [&](cudaStream_t s) {
        nf::dec::prep_tables(tab, T, s);
        return nf::dec::linear(L, tab, x, T, dout, stride, s);
    };
    bool ok;
    if (graph) {
        cudaGraph_t g = nullptr;
        cudaGraphExec_t ex = nullptr;
        ok = cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
        const cudaError_t e = ok ? launch(st) : cudaErrorUnknown;
        ok = ok && cudaStreamEndCapture(st, &g) == cudaSuccess && e == cudaSuccess &&
             cudaGraphInstantiate(&ex, g, 0) == cudaSuccess && cudaGraphLaunch(ex, st) == cudaSuccess;
        if (ex) cudaGraphExecDestroy(ex);
        if (g) cudaGraphDestroy(g);
    } else {
        ok = launch(st) == cudaSuccess;
    }
    ok = ok && cudaStreamSynchronize(st) == cudaSuccess;
    cudaStreamDestroy(st);
    out.resize(out_floats);
    ok = ok && cudaMemcpy(out.data(), dout, out_floats * 4, cudaMemcpyDeviceToHost) == cudaSuccess;
    if (!ok) fprintf(stderr, "linear: %s\n", cudaGetErrorString(cudaGetLastError()));
    return ok;
}

void run_case(int codec, uint32_t rows, uint32_t cols)
{
    std::vector<float> deq;
    const std::vector<uint8_t> payload = make_weights(codec, rows, cols, deq);
    nf_moe_matrix mm{};
    mm.codec = codec, mm.data = payload.data(), mm.experts = 1, mm.rows = rows, mm.cols = cols, mm.divisors = 1;
    nf_error err;
    size_t wbytes = 0;
    CHECK_MSG(nf::devmat_bytes(&mm, "w", &wbytes, &err) == NF_OK, "%s", err.msg);
    DevBuf w(wbytes);
    nf::dec::Linear L{};
    CHECK_MSG(nf::devmat_upload(&mm, (uint8_t *)w.p, &L.m, "w", &err) == NF_OK, "%s", err.msg);
    L.codec = codec;
    L.gemm = nf::prefill_supported(L.m, L.m); // as the decoder sets them; neither GEMM may take these shapes
    CHECK_MSG(!L.gemm, "%u rows: the prefill GEMM takes it, the case tests nothing", rows);

    std::vector<float> x((size_t)kMaxT * cols);
    std::vector<uint16_t> xb(x.size());
    for (uint32_t t = 0; t < kMaxT; t++)
        for (uint32_t i = 0; i < cols; i++) {
            const size_t k = (size_t)t * cols + i;
            xb[k] = nf_test_f2bf(nrand() * ldexpf(1.0f, (int)(t % 7) - 3));
            x[k] = nf_test_bf2f(xb[k]);
        }
    // the tables as the decoder lays them (ops.cuh)
    DevBuf dx(xb.size() * 2), dtab(nf::dec::dense_tables_ints(kMaxT) * 4), dout((size_t)(kMaxT + kGuardRows) * (rows + kGuardCols) * 4);
    CHECK(cudaMemcpy(dx.p, xb.data(), xb.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess);
    const nf::dec::DenseTables tab = nf::dec::dense_tables_at((int32_t *)dtab.p, kMaxT, nullptr, nullptr);
    const uint32_t stride = rows + kGuardCols;
    const char *name = nf_codec_get((nf_codec_id)codec)->name;

    for (uint32_t T : {17u, 64u, 65u, 150u, 300u}) {
        const size_t n_out = (size_t)(T + kGuardRows) * stride;
        std::vector<float> out, again;
        CHECK(run_linear(L, tab, (const uint16_t *)dx.p, T, (float *)dout.p, stride, n_out, false, out));
        CHECK(run_linear(L, tab, (const uint16_t *)dx.p, T, (float *)dout.p, stride, n_out, true, again));
        size_t over = 0, guards = 0, same = 0;
        double worst = 0;
        for (uint32_t t = 0; t < T + kGuardRows; t++)
            for (uint32_t r = 0; r < stride; r++) {
                const float v = out[(size_t)t * stride + r];
                same += memcmp(&v, &again[(size_t)t * stride + r], 4) == 0;
                if (t >= T || r >= rows) {
                    guards += !isnan(v);
                    continue;
                }
                double ref = 0, mag = 0;
                for (uint32_t i = 0; i < cols; i++) {
                    const double p = (double)deq[(size_t)r * cols + i] * x[(size_t)t * cols + i];
                    ref += p, mag += fabs(p);
                }
                const double q = fabs(v - ref) / (ldexp(mag, -15) + 1e-30);
                if (!(q <= 1.0)) over++; // NaN counts
                if (q > worst || q != q) worst = q;
            }
        printf("  %-5s %4u x %u  T %3u: worst %.3g of the allowance, %zu over, %zu guards touched, graph = stream %s\n",
               name, rows, cols, T, worst, over, guards, same == n_out ? "yes" : "no");
        CHECK_MSG(over == 0, "%s %u rows T %u: %zu outputs over the allowance (worst %.3g)", name, rows, T, over, worst);
        CHECK_MSG(guards == 0, "%s %u rows T %u: %zu guard values written", name, rows, T, guards);
        CHECK_MSG(same == n_out, "%s %u rows T %u: the graph's outputs differ from the stream's", name, rows, T);
    }
}

} // namespace

int main(void)
{
    if (!nf_test_gpu_visible("test_dense_linear")) return NF_TEST_SKIP;
    for (int codec : {NF_CODEC_BF16, NF_CODEC_Q8_0, NF_CODEC_Q4_K}) {
        run_case(codec, 64, 2048);   // a GDN layer's in_proj_ba: four 16-row CTAs a group
        run_case(codec, 200, 2048);  // rows not a multiple of 16
        run_case(codec, 1040, 1024); // past kSplitMaxRows: one group of T
    }
    return nf_test_report();
}

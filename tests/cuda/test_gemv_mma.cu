// The tensor-core GEMV (gemv_mma.cu) for nvfp4 and bf16 weights, reached through launch_gemv_ex as
// the routes reach it, plain and GLU, bf16 and f32 inputs, against a double reference over the
// weights' values: nvfp4 as the CPU codec dequantizes them (nf_nvfp4_dequantize_row: e2m1 * (e4m3 /
// divisor) in f32), bf16 as they are.
//
// Bound. The kernel's MMA operands are exact (A = e2m1 * e4m3 * 2^-8 or the bf16 weight, bf16 x)
// and so are their products (at most 6 + 8 or 8 + 8 significant bits), so its error is the f32
// accumulation plus the epilogue. A warp's accumulator chain has at most n = cols / 128 MMAs per
// accumulator (nvfp4: ceil(cols / 512) chunks a warp, 4 MMAs each into each of two; bf16:
// ceil(cols / 256) chunks of 64 a warp, 2 each: 32 at cols = 4096; those are the 4-warp CTA's shares,
// the 8- and 16-warp CTAs' are shorter), each adding 16 exact products
// to the running sum; assuming one MMA is within 2 ulps of its largest partial sum (2^-22 (|c| +
// sum |p|); the tensor cores' accumulation truncates rather than rounds, but keeps at least full f32
// precision relative to the largest term), the chain is off by at most n 2^-22 sum_i |w_i x_i|
// (<= 2^-17 at 4096). The two accumulators' and the NW warps' sums add 2 NW - 1 f32 roundings (7 at 4
// warps, 31 at 16), nvfp4's 2^8 / divisor factor and its product two more, and the reference's own
// nvfp4 weights are two f32 roundings off the exact e2m1 e4m3 / divisor (bf16: no factor, exact
// reference weights): together below 2^-18 sum |w x| (2^-20 at 4 warps). The test allows
//     |gpu - ref| <= 2^-16 sum_i |w_i x_i|                    (bf16 inputs)
// For f32 inputs x = hi + lo + r with hi = bf16(x), lo = bf16(x - hi); bf16's unit roundoff is 2^-8,
// so |x - hi| <= 2^-8 |x| and |r| <= 2^-8 |x - hi| <= 2^-16 |x|: the split adds at most 2^-16 sum |w x|,
// and the lo column's own accumulation error is 2^-8 of the hi column's. With the chain's 2^-17 and
// the rest's 2^-18 the test allows 2^-15 sum |w x| (measured worst for nvfp4: 0.03 of that). GLU
// out = silu(g) u takes the first-order propagation of those allowances on g and u plus 2^-20 |out|
// for silu and the product.
// A wrong scale block, divisor, nibble pairing, row, token column or K share is off by a sizeable
// fraction of sum |w x| (about 1/sqrt(cols) of it even for a divisor off by 2x): at cols 2048 a
// numpy model of these data puts the median output 700x (scale block 2c + (i >= 3)) to 3000x
// (divisor of another share, token columns swapped) over the allowance. Dropping the f32 inputs'
// lo column is the smallest such bug: its signed errors cancel to a median 3x, worst 19x. (Those
// margins were estimated for nvfp4; a bf16 weight word paired with the wrong activation group is
// the same kind of bug, and tests/cuda/test_mma_tile.cu checks the pairing exactly on the host.)
//
// Data: two experts stacked. nvfp4: D = 4 divisor shares (each expert's gate half and up half its
// own source, amplitudes 1, 3, 1/2, 2: divisors differ up to 6x, so a wrong share or expert shows)
// or D = 1 where the row count is not a multiple of 256 (the 128-row share rule); bf16: the same
// row amplitudes, no divisors. Block amplitudes vary (spread e4m3 scales) and every 17th row is
// 2^-15 as large (nvfp4: subnormal e4m3 scales). Two groups (expert 1, then expert 0) at positions
// 1.. of a grid of three group slots (the third exits); position 0 and the guard columns past each
// output row must stay untouched (NaN fill).
//
// Cases, for each format: T in {1, 3, 8, 13} (13 > 8 tokens: several passes; f32 holds 4 tokens a
// pass), plain and GLU, bf16 and f32 inputs; rows not a multiple of 16; cols of one chunk (nvfp4 128,
// bf16 64: three warps idle), uneven K shares (nvfp4 640, bf16 320), 768, 2048, 4096; GLU through
// pos_entry addressing (entry_div = k, as the MoE route); the decode route's early staging
// (rows_are_x0, T = 1) with PDL and the down prefetch; the decoder's launch (PDL, group tables ready:
// rows prefetched before the wait). Which of the 4-, 8- and 16-warp forms (gemv_mma.cu, "Warps a CTA")
// a case takes follows from its grid and the device: the small grids above take the wide ones on an
// H200. Then, for each format: one group in a one-slot grid, as the decoder's dense layers launch them:
// the decode step's 2048 x 4096 and 5120 x 2048, two passes, f32 inputs, GLU, early staging, uneven K
// shares (33 chunks: five of 16 warps without one); and shapes from the SM count that must take 16, 8
// and 4 warps on any device (4: the routes' widths, early staging, dense, GLU with f32 inputs). On a
// 132-SM device the decode step's shapes (the LM head's and the routed gate/up's among them) must take
// the warps gemv_mma.cu says. Every launch is repeated through a captured graph, as the decoder's step
// runs it (the warp choice asks the occupancy calculator during the capture), and must give the same
// bits: the cross-warp sums are in a fixed order.
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <vector>

#include "backend/cuda/sparse_moe/internal.cuh"

extern "C" {
#include "codec/codec.h"
#include "codec/nvfp4.h"
#include "common/cuda_test_util.h"
}
#include "nf_test.h"
#include "common/need_gpu.h"

namespace {

uint64_t rng = 0x9E3779B97F4A7C15ull;
float nrand() { return nf_test_nrand(&rng); }
uint32_t urand(uint32_t n) { return (uint32_t)(nf_test_urand(&rng) * n) % n; }

constexpr uint32_t kTopK = 4; // entry_div of the pos_entry cases

struct Case {
    bool glu, bf16;      // GLU; bf16 inputs (else f32)
    uint32_t rows, cols; // per expert (GLU: gate rows then up rows)
    uint32_t T;          // max_tokens; group 0 (expert 1) has T positions, group 1 (expert 0) ceil(T / 2)
    bool entries = false; // input rows through pos_entry / kTopK
    bool early = false;   // decode route: rows_are_x0 (T = 1), PDL, down prefetch
    bool ready = false;   // decoder: PDL, group tables ready
    int codec = NF_CODEC_NVFP4; // of the weights: NF_CODEC_NVFP4 or NF_CODEC_BF16
    bool one = false;     // one group (expert 1) in a grid of one slot, as the decoder's dense layers
    int want = 0;         // the warps a CTA the launch must take (0: any)
};

Case bf16w(Case c) // the same case with bf16 weights
{
    c.codec = NF_CODEC_BF16;
    return c;
}

double silu(double g) { return g / (1.0 + exp(-g)); }

// Two experts of c.rows x c.cols: nvfp4 quantized with D shares, or rounded to bf16; deq gets the
// values the kernel should see (nvfp4: the CPU dequantization).
std::vector<uint8_t> make_weights(const Case &c, uint32_t D, std::vector<float> &deq)
{
    const uint64_t R = 2ull * c.rows, share = R / D;
    const float share_amp[4] = {1.0f, 3.0f, 0.5f, 2.0f};
    std::vector<float> w(R * c.cols);
    for (uint64_t r = 0; r < R; r++) {
        const float ra = share_amp[(r / share) % 4] * (r % 17 == 5 ? ldexpf(1.0f, -15) : 1.0f);
        for (uint32_t i = 0; i < c.cols; i++) w[r * c.cols + i] = nrand() * ra * ldexpf(1.0f, (int)((i / 16 + r) % 5) - 2);
    }
    deq.resize(R * c.cols);
    if (c.codec == NF_CODEC_BF16) {
        std::vector<uint8_t> payload(R * c.cols * 2);
        for (uint64_t i = 0; i < R * c.cols; i++) {
            const uint16_t h = nf_test_f2bf(w[i]);
            memcpy(&payload[2 * i], &h, 2);
            deq[i] = nf_test_bf2f(h);
        }
        return payload;
    }
    nf_nvfp4_layout l;
    nf_error err;
    CHECK_MSG(nf_nvfp4_layout_of(R, c.cols, D, &l, &err) == NF_OK, "layout: %s", err.msg);
    std::vector<uint8_t> payload(l.payload_bytes, 0);
    nf_nvfp4_quantize(w.data(), &l, payload.data());
    nf_nvfp4_planes p;
    CHECK(nf_nvfp4_view(payload.data(), l.payload_bytes, R, c.cols, D, &p, &err) == NF_OK);
    for (uint64_t r = 0; r < R; r++) nf_nvfp4_dequantize_row(&p, r, &deq[r * c.cols]);
    return payload;
}

// n input rows of c.cols values (bf16-representable for bf16 inputs, arbitrary f32 otherwise):
// 32-element blocks of amplitudes 2^-4 .. 2^4, one all-zero block per row.
std::vector<float> make_inputs(const Case &c, uint32_t n)
{
    std::vector<float> x((size_t)n * c.cols);
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t i = 0; i < c.cols; i++) {
            const uint32_t blk = i / 32;
            const float amp = blk == (t * 7 + 3) % (c.cols / 32) ? 0.0f : ldexpf(1.0f, (int)(blk % 9) - 4);
            const float v = nrand() * amp;
            x[(size_t)t * c.cols + i] = c.bf16 ? nf_test_bf2f(nf_test_f2bf(v)) : v;
        }
    return x;
}

struct Dev {
    uint8_t *w = nullptr;
    void *x = nullptr;
    float *out = nullptr;
    int32_t *tab = nullptr;
    ~Dev()
    {
        cudaFree(w);
        cudaFree(x);
        cudaFree(out);
        cudaFree(tab);
    }
};

// launch(stream) captured into a graph on a stream of its own, the graph run once; false on any error.
template <class F>
bool launch_captured(F &&launch)
{
    cudaStream_t st = nullptr;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    bool ok = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess &&
              cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
    if (ok) {
        const cudaError_t e = launch(st);
        ok = cudaStreamEndCapture(st, &graph) == cudaSuccess && e == cudaSuccess;
    }
    ok = ok && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess && cudaGraphLaunch(exec, st) == cudaSuccess &&
         cudaStreamSynchronize(st) == cudaSuccess;
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    if (st) cudaStreamDestroy(st);
    if (!ok) fprintf(stderr, "captured launch: %s\n", cudaGetErrorString(cudaGetLastError()));
    return ok;
}

// A launch's form as gemv_mma_warps names it: "4 w" .. "16 w", or "stream".
const char *form_name(int nw)
{
    return nw == -1 ? "stream" : nw == 4 ? "4 w" : nw == 8 ? "8 w" : nw == 16 ? "16 w" : "?";
}

void run_case(const Case &c)
{
    const bool fp4 = c.codec == NF_CODEC_NVFP4;
    const uint32_t D = fp4 && c.rows % 256 == 0 ? 4 : 1, E = 2;
    std::vector<float> deq;
    const std::vector<uint8_t> payload = make_weights(c, D, deq);

    // groups: slot 0 = expert 1 at positions 1 .. T, slot 1 = expert 0 after it (unless c.one); position 0
    // unused
    const uint32_t n0 = c.T, n1 = c.one ? 0 : (c.T + 1) / 2, P = 1 + n0 + n1;
    const int32_t expert_of[2] = {1, 0}, start_of[2] = {1, (int32_t)(1 + n0)}, count_of[2] = {(int32_t)n0, (int32_t)n1};
    // input row of each position: the position itself, or entry / kTopK (early: always row 0)
    const uint32_t nx = c.entries ? 5 : P;
    std::vector<int32_t> entry(P, 0);
    std::vector<uint32_t> xrow(P, 0);
    for (uint32_t p = 0; p < P; p++) {
        entry[p] = c.early ? (int32_t)urand(kTopK) : (int32_t)(urand(nx) * kTopK + urand(kTopK));
        xrow[p] = c.early ? 0 : c.entries ? (uint32_t)entry[p] / kTopK : p;
    }
    const std::vector<float> x = make_inputs(c, nx);
    const uint32_t in_stride = c.cols + (c.bf16 ? 8 : 4); // padded rows: the stride is honoured
    std::vector<uint8_t> xin((size_t)nx * in_stride * (c.bf16 ? 2 : 4), 0);
    for (uint32_t t = 0; t < nx; t++)
        for (uint32_t i = 0; i < c.cols; i++) {
            const float v = x[(size_t)t * c.cols + i];
            if (c.bf16) {
                const uint16_t h = nf_test_f2bf(v);
                memcpy(&xin[((size_t)t * in_stride + i) * 2], &h, 2);
            } else {
                memcpy(&xin[((size_t)t * in_stride + i) * 4], &v, 4);
            }
        }

    nf_moe_matrix mm;
    memset(&mm, 0, sizeof mm);
    mm.codec = c.codec;
    mm.data = payload.data();
    mm.experts = E;
    mm.rows = c.rows;
    mm.cols = c.cols;
    mm.divisors = D;
    nf_error err;
    size_t bytes = 0;
    Dev d;
    nf::DevMat W;
    const bool up = nf::devmat_bytes(&mm, "w", &bytes, &err) == NF_OK && cudaMalloc(&d.w, bytes) == cudaSuccess &&
                    nf::devmat_upload(&mm, d.w, &W, "w", &err) == NF_OK;
    CHECK_MSG(up, "upload: %s", err.msg);
    if (!up) return;
    CHECK(nf::gemv_mma_supported(c.codec, W));

    const uint32_t out_rows = c.glu ? c.rows / 2 : c.rows, stride = out_rows + 8;
    // tables: n, expert[3], start[3], count[3], pos_entry[P]
    std::vector<int32_t> tab = {c.one ? 1 : 2, expert_of[0], expert_of[1], 0, start_of[0], start_of[1], 0, count_of[0],
                                count_of[1], 0};
    tab.insert(tab.end(), entry.begin(), entry.end());
    CHECK(cudaMalloc(&d.x, xin.size()) == cudaSuccess);
    CHECK(cudaMalloc(&d.out, (size_t)P * stride * 4) == cudaSuccess);
    CHECK(cudaMalloc(&d.tab, tab.size() * 4) == cudaSuccess);
    cudaMemcpy(d.x, xin.data(), xin.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(d.tab, tab.data(), tab.size() * 4, cudaMemcpyHostToDevice);
    cudaMemset(d.out, 0xFF, (size_t)P * stride * 4); // NaN everywhere: unwritten outputs show
    const nf::Groups g{d.tab, d.tab + 1, d.tab + 4, d.tab + 7, c.entries || c.early ? d.tab + 10 : nullptr,
                       c.entries || c.early ? kTopK : 1, c.one ? 1u : 3u};
    const nf::NextMat next = c.early ? nf::NextMat{W.data, (uint64_t)c.rows * W.row_stride} : nf::NextMat{nullptr, 0};
    const nf::GemvLaunch opt{next, c.early || c.ready, c.early, false, c.ready};
    const int nw = nf::gemv_mma_warps(c.codec, c.glu, W, c.bf16, g.max_groups, c.T, opt.rows_are_x0);
    CHECK_MSG(c.want ? nw == c.want : nw == 4 || nw == 8 || nw == 16, "%d warps a CTA (want %d; -1: streams)", nw, c.want);
    cudaError_t e = nf::launch_gemv_ex(c.codec, c.glu, W, d.x, c.bf16, in_stride, g, d.out, stride, c.T, opt, 0);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    CHECK_MSG(e == cudaSuccess, "launch: %s", cudaGetErrorString(e));
    std::vector<float> got((size_t)P * stride), again(got.size());
    cudaMemcpy(got.data(), d.out, got.size() * 4, cudaMemcpyDeviceToHost);
    // the same launch captured into a graph, as the decoder's step (the warp choice queries the device
    // on the host: that must not break a capture), must give the same bits
    cudaMemset(d.out, 0xFF, (size_t)P * stride * 4);
    cudaDeviceSynchronize(); // the capture's stream does not wait for the legacy stream's memset
    CHECK(launch_captured([&](cudaStream_t st) {
        return nf::launch_gemv_ex(c.codec, c.glu, W, d.x, c.bf16, in_stride, g, d.out, stride, c.T, opt, st);
    }));
    cudaMemcpy(again.data(), d.out, again.size() * 4, cudaMemcpyDeviceToHost);
    CHECK_MSG(memcmp(got.data(), again.data(), got.size() * 4) == 0, "the graph's outputs differ from the launch's");

    const double eps = c.bf16 ? ldexp(1.0, -16) : ldexp(1.0, -15);
    size_t bad = 0, guard_bad = 0;
    double worst = 0;
    for (int gi = 0; gi < 2; gi++)
        for (int32_t q = 0; q < count_of[gi]; q++) {
            const uint32_t pos = (uint32_t)(start_of[gi] + q);
            const float *xv = &x[(size_t)xrow[pos] * c.cols];
            auto dot = [&](uint32_t r, double &abs) { // row r of expert expert_of[gi]
                const float *wr = &deq[((size_t)expert_of[gi] * c.rows + r) * c.cols];
                double s = 0;
                abs = 0;
                for (uint32_t i = 0; i < c.cols; i++) {
                    const double p = (double)wr[i] * xv[i];
                    s += p;
                    abs += fabs(p);
                }
                return s;
            };
            for (uint32_t r = 0; r < out_rows; r++) {
                double ref, lim, a1, a2;
                if (c.glu) {
                    const double gv = dot(r, a1), uv = dot(r + out_rows, a2);
                    const double eg = eps * a1, eu = eps * a2, sig = 1.0 / (1.0 + exp(-gv));
                    const double dsilu = sig * (1.0 + gv * (1.0 - sig)); // |silu'| <= 1.1
                    ref = silu(gv) * uv;
                    lim = 1.1 * fabs(dsilu) * fabs(uv) * eg + 1.1 * (fabs(silu(gv)) + eg) * eu + ldexp(fabs(ref), -20) +
                          1e-30;
                } else {
                    ref = dot(r, a1);
                    lim = eps * a1 + 1e-30;
                }
                const double dv = fabs((double)got[(size_t)pos * stride + r] - ref);
                if (!(dv <= lim)) bad++;
                if (!(dv == dv)) worst = INFINITY;
                else if (dv / lim > worst) worst = dv / lim;
            }
        }
    for (uint32_t p = 0; p < P; p++)
        for (uint32_t r = p == 0 ? 0 : out_rows; r < stride; r++) {
            uint32_t bits;
            memcpy(&bits, &got[(size_t)p * stride + r], 4);
            if (bits != 0xFFFFFFFFu) guard_bad++;
        }
    printf("  %-5s %-5s %-4s rows %5u cols %5u T %2u D %u%s%s%s%s, %6s: worst %.4f of the allowance, %zu outside\n",
           fp4 ? "nvfp4" : "bf16", c.glu ? "glu" : "plain", c.bf16 ? "bf16" : "f32", c.rows, c.cols, c.T, D, c.entries ? " entries" : "",
           c.early ? " early" : "", c.ready ? " ready" : "", c.one ? " one group" : "", form_name(nw), worst, bad);
    CHECK_MSG(bad == 0, "%s %s %s rows %u cols %u T %u: %zu outputs outside the allowance (worst %.2f x)",
              fp4 ? "nvfp4" : "bf16", c.glu ? "glu" : "plain", c.bf16 ? "bf16" : "f32", c.rows, c.cols, c.T, bad, worst);
    CHECK_MSG(guard_bad == 0, "%zu guard values written", guard_bad);
}

// The warps gemv_mma.cu's file comment says a Qwen3-30B-A3B decode step's shapes take on a 132-SM
// device (H100 SXM, H200), asked of the launch's planning with descriptors alone (nothing is read; the
// nvfp4 scale and divisor pointers only need to be set). Elsewhere printed, not checked.
void check_forms(int sms)
{
    static const uint8_t dummy[16] = {0};
    struct Shape {
        int codec;
        bool glu;
        uint32_t rows, cols, groups; // groups: the grid's slots (8: the routed experts at T = 1)
        bool early;
        int want;
        const char *what;
    };
    const Shape shapes[] = {
        {NF_CODEC_BF16, false, 2048, 4096, 1, false, 16, "attention output"},
        {NF_CODEC_BF16, false, 5120, 2048, 1, false, 8, "q/k/v"},
        {NF_CODEC_BF16, false, 151936, 2048, 1, false, -1, "LM head"},       // streams (gemv_stream.cu)
        {NF_CODEC_BF16, true, 1536, 2048, 8, true, 4, "routed gate/up"},
        {NF_CODEC_NVFP4, false, 2048, 4096, 1, false, 16, "attention output"},
        {NF_CODEC_NVFP4, false, 5120, 2048, 1, false, 8, "q/k/v"},
        {NF_CODEC_NVFP4, true, 1536, 2048, 8, true, 4, "routed gate/up"},
        {NF_CODEC_NVFP4, false, 151936, 2048, 1, false, 4, "LM head"},       // bf16 rows only stream
    };
    for (const Shape &f : shapes) {
        nf::DevMat W;
        memset(&W, 0, sizeof W);
        W.data = dummy;
        W.rows = f.rows;
        W.cols = f.cols;
        W.row_stride = f.codec == NF_CODEC_BF16 ? 2ull * f.cols : f.cols / 2;
        if (f.codec == NF_CODEC_NVFP4) {
            W.scales = dummy;
            W.divisors = reinterpret_cast<const float *>(dummy);
            W.kt = (f.cols + 63) / 64;
            W.rows_per_div = nf_fastdiv_make(f.rows);
        }
        const int nw = nf::gemv_mma_warps(f.codec, f.glu, W, true, f.groups, 1, f.early);
        printf("  %-5s %-16s %6u x %4u, %u group slots: %s (H200: %s)\n", f.codec == NF_CODEC_BF16 ? "bf16" : "nvfp4",
               f.what, f.rows, f.cols, f.groups, form_name(nw), form_name(f.want));
        if (sms == 132) CHECK_MSG(nw == f.want, "%s: %d warps, want %d", f.what, nw, f.want);
    }
}

} // namespace

int main(void)
{
    if (!nf_test_gpu_visible("test_gemv_mma")) return NF_TEST_SKIP;
    for (uint32_t T : {1u, 3u, 8u, 13u}) {
        run_case({false, true, 512, 2048, T});
        run_case({false, false, 512, 2048, T});
        Case glu{true, true, 768, 2048, T};
        glu.entries = true;
        run_case(glu);
    }
    run_case({false, true, 1001, 768, 3});   // rows not a multiple of 16 (D = 1)
    run_case({false, false, 1001, 768, 13});
    run_case({false, true, 40, 128, 2});     // one chunk: warps 1-3 have no K share
    run_case({false, true, 256, 640, 9});    // 5 chunks: uneven K shares, 2 passes
    run_case({false, true, 256, 4096, 1});   // long rows: several batches per warp
    run_case({false, true, 256, 4096, 13});
    run_case({false, false, 256, 4096, 5});
    run_case({true, true, 512, 4096, 1});
    run_case({false, false, 2048, 768, 1});  // the routed down projection's shape (f32 act)
    run_case({false, false, 2048, 768, 8});
    run_case({true, false, 768, 2048, 5});   // GLU with f32 inputs
    Case dec{true, true, 768, 2048, 1};      // the decode route's gate/up: early staging, PDL, prefetch
    dec.early = true;
    run_case(dec);
    Case dense{false, true, 512, 2048, 3};   // the decoder's dense layers: PDL, tables ready
    dense.ready = true;
    run_case(dense);
    dense.T = 1;
    run_case(dense);
    // bf16 weights (64-element chunks)
    for (uint32_t T : {1u, 3u, 8u, 13u}) {
        run_case(bf16w({false, true, 512, 2048, T}));
        run_case(bf16w({false, false, 512, 2048, T}));
        Case glu{true, true, 768, 2048, T};
        glu.entries = true;
        run_case(bf16w(glu));
        glu.bf16 = false;
        run_case(bf16w(glu));
    }
    run_case(bf16w({false, true, 1001, 768, 3}));   // rows not a multiple of 16
    run_case(bf16w({false, false, 1001, 768, 13}));
    run_case(bf16w({true, true, 1002, 768, 8}));    // GLU: 501 outputs, the last tile's rows clamp
    run_case(bf16w({false, true, 40, 64, 2}));      // one chunk: warps 1-3 have no K share
    run_case(bf16w({false, true, 40, 128, 3}));     // two chunks: warps 2-3 idle
    run_case(bf16w({false, true, 256, 320, 9}));    // 5 chunks: uneven K shares, 2 passes
    run_case(bf16w({false, false, 256, 320, 5}));
    run_case(bf16w({false, true, 256, 4096, 1}));   // long rows: several chunks per warp
    run_case(bf16w({false, true, 256, 4096, 13}));
    run_case(bf16w({false, false, 256, 4096, 5}));
    run_case(bf16w({true, true, 512, 4096, 1}));
    run_case(bf16w({false, false, 2048, 768, 1}));  // a down projection's shape (f32 act)
    run_case(bf16w({false, false, 2048, 768, 8}));
    run_case(bf16w({true, false, 768, 2048, 5}));   // GLU with f32 inputs
    run_case(bf16w(dec));                           // early staging, PDL, prefetch
    Case dense16{false, true, 512, 2048, 3};        // the decoder's dense layers: PDL, tables ready
    dense16.ready = true;
    run_case(bf16w(dense16));
    dense16.T = 1;
    run_case(bf16w(dense16));
    Case o_proj{false, true, 2048, 4096, 1};        // Qwen3-30B-A3B's attention output projection
    o_proj.ready = true;
    run_case(bf16w(o_proj));

    // The wide forms (8 and 16 warps a CTA): small grids, one group in a one-slot grid as the decoder's
    // dense layers launch them. On an H200 the commented warps; the two shapes from the SM count take
    // 16 and 8 warps on any device (one and two CTAs an SM).
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    check_forms(sms);
    Case qkv{false, true, 5120, 2048, 1};           // q/k/v stacked: 8 warps
    qkv.ready = true;
    const uint32_t S = (uint32_t)sms;
    for (int codec : {NF_CODEC_BF16, NF_CODEC_NVFP4}) {
        auto as = [&](Case c, bool one, int want) {
            c.codec = codec, c.one = one, c.want = want;
            return c;
        };
        const bool b16 = codec == NF_CODEC_BF16;
        run_case(as(o_proj, true, 0));                           // H200: 16 warps
        run_case(as(qkv, true, 0));                              // 8
        run_case(as({false, true, 2048, 4096, 13}, true, 0));    // 16, two passes
        run_case(as({false, false, 2048, 2048, 5}, true, 0));    // f32 inputs: bf16 16, nvfp4 8 (16 chunks)
        Case glu{true, true, 4096, 2048, 3};                     // 256 tiles: 8
        glu.entries = true;
        run_case(as(glu, true, 0));
        run_case(as(dec, true, 0));                              // early staging, 96 tiles: bf16 16, nvfp4 8
        // uneven K shares: 33 chunks, 3 a warp, warps 11 - 15 without a share (16 warps)
        run_case(as({false, true, 2048, b16 ? 2112u : 4224u, 3}, true, 0));
        // from the SM count, the same warps on any device: one CTA an SM, two, and (three grid slots of
        // two CTAs an SM) too many for 8 warps: the 4-warp forms at the routes' widths
        run_case(as({false, true, 16 * S, 4096, 2}, true, 16));
        run_case(as({false, true, 32 * S, 2048, 2}, true, 8));
        Case dec4{true, true, 32 * S, 2048, 1};
        dec4.early = true;
        run_case(as(dec4, false, 4));
        Case dense4{false, true, 32 * S, 2048, 3};
        dense4.ready = true;
        run_case(as(dense4, false, 4));
        run_case(as({true, false, 32 * S, 2048, 5}, false, 4));
    }

    // The streaming form (gemv_stream.cu): one token, one group, bf16 rows and inputs, more tiles than
    // one wave of 4-warp CTAs (8 S + 1 tiles: at 64 or more registers a thread no SM holds 8). Slices of 1024 columns: two, a
    // short last one (64), one narrow one, five; tiles whose last rows clamp; the group tables read
    // before the wait (ready, PDL) or after it (a plain launch).
    const uint32_t big = 16 * 8 * S;
    Case head{false, true, big + 5, 2048, 1};
    head.ready = true, head.one = true, head.want = -1;
    run_case(bf16w(head));
    Case plain_head = head;
    plain_head.ready = false;
    run_case(bf16w(plain_head));
    for (uint32_t cols : {1088u, 512u, 4160u}) {
        Case h = head;
        h.rows = cols == 4160 ? big + 1 : big + 16, h.cols = cols;
        run_case(bf16w(h));
    }
    Case two = head; // two tokens, or f32 inputs: the 4-warp form
    two.T = 2, two.want = 4;
    run_case(bf16w(two));
    return nf_test_report();
}

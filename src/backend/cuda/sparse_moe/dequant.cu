// The prefill of k-quant and q8_0 banks at large T through bf16: each slice decodes its active
// experts' rows once into a bf16 scratch bank (the codec's own device decode, then bf16 as the
// prefill kernels round every weight), which the bf16 wide tile (prefill_wg.cu) multiplies. Why: the
// mma.sync kernel decodes B in every warp of its MMA loop and reached 14 % of cuBLAS at T = 4096
// (q4_k+q6_k, H200), where the bf16 wide tile reaches 43 %; a slice's decode reads the quantised
// bank once and writes bf16 once (qwen3 geometry, all 128 experts: ~0.4 GB read, 1.2 GB written).
// The operands are the same bf16 values, so the route changes no tolerance: the test's witnesses
// of these cases are the mma.sync kernel's bits. Measured (H200, q4_k+q6_k, T = 4096): the layer
// 2748 -> 1336 us, the decode ~430 us of it (docs/sparse_moe.md, "k-quant and q8_0 prefill").
#include "base/fastdiv.h"
#include "internal.cuh"

namespace nf {

namespace {

constexpr int kDeqWarps = 8, kDeqRows = 32; // rows a CTA
constexpr int kDeqP = 4;                     // pieces a lane loads before it decodes any

// Rows blockIdx.x * kDeqRows .. of live group blockIdx.y's expert into dst[(e * rows + r) * cols],
// whose rows follow one another: the CTA's rows are one run of pieces (16 weights each), and a warp
// pass takes 32 kDeqP of them (whole blocks of every codec, across rows where a row is shorter).
// Each lane loads its kDeqP pieces, then decodes them into the warp's shared stage, and the warp
// stores the run 16 bytes a lane, whole sectors in order (a piece's runs are scattered 8-byte pieces
// of its block; stored straight from registers they cost 4x the store transactions). Four loads a
// lane in flight across rows, not one piece a row: the one-piece form moved 2.9 - 3.4 TB/s (ncu,
// H200, qwen3 bank), its down rows of 768 weights a pass and a half. A piece's row is a multiply and
// shift (`pieces`: a row's pieces), not a division (a software routine of ~20 instructions, two a
// piece), and its address is taken from the CTA's first row in 32 bits.
template <class C>
__global__ void __launch_bounds__(kDeqWarps * 32) dequant_kernel(DevMat W, Groups g, nf_fastdiv pieces, uint16_t *dst)
{
    constexpr uint32_t kRun = 32 * kDeqP; // pieces a warp pass
    static_assert(C::PE == 16 && kRun % C::PIECES == 0, "a warp pass is whole blocks of 16-weight pieces");
    __shared__ __align__(16) uint16_t stage[kDeqWarps][kRun * 16];
    const int gi = blockIdx.y;
    if (gi >= *g.n) return;
    const uint32_t e = (uint32_t)g.expert[gi], np = W.cols / C::BLK * C::PIECES; // a row's pieces
    const uint32_t r0 = blockIdx.x * kDeqRows, total = (min(W.rows, r0 + kDeqRows) - r0) * np;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    uint16_t *buf = stage[warp], *out = dst + ((size_t)e * W.rows + r0) * W.cols;
    DevMat V = W; // the CTA's rows as rows 0 .. of expert 0
    V.data = row_ptr(W, e, r0);
    for (uint32_t p0 = warp * kRun; p0 < total; p0 += kDeqWarps * kRun) {
        const uint32_t n = min(kRun, total - p0);
        typename C::Raw raw[kDeqP];
        typename C::Row row[kDeqP];
        int qs[kDeqP]; // each piece's index in its row
#pragma unroll
        for (int i = 0; i < kDeqP; i++) {
            const uint32_t p = p0 + lane + 32 * i;
            if (p >= p0 + n) continue;
            const uint32_t r = nf_fastdiv_apply(p, pieces);
            qs[i] = (int)(p - r * np);
            row[i] = C::row(V, 0, r);
            raw[i] = C::load(row[i], qs[i]);
        }
#pragma unroll
        for (int i = 0; i < kDeqP; i++) {
            const uint32_t p = p0 + lane + 32 * i;
            if (p >= p0 + n) continue;
            const int q = qs[i], base = (int)(p - p0) * C::PE - q * C::PE; // stage offset of the row
            float w[C::PE];
            C::decode(row[i], raw[i], q, w);
#pragma unroll
            for (int run = 0; run < C::RUNS; run++) {
                const int k0 = base + C::elem(q, run);
#pragma unroll
                for (int j = 0; j < C::RUN; j += 4)
                    *reinterpret_cast<uint2 *>(buf + k0 + j) =
                        make_uint2(pack_bf16x2(w[run * C::RUN + j], w[run * C::RUN + j + 1]),
                                   pack_bf16x2(w[run * C::RUN + j + 2], w[run * C::RUN + j + 3]));
            }
        }
        __syncwarp();
        for (uint32_t i = lane; i < n * 2; i += 32) // n pieces: n * 32 bytes
            reinterpret_cast<uint4 *>(out + (size_t)p0 * C::PE)[i] = reinterpret_cast<const uint4 *>(buf)[i];
        __syncwarp();
    }
}

} // namespace

// q8_0, q4_k, q5_k, q6_k and the import-only q2_k, q3_k, iq4_xs, iq4_nl (12 .. 15)
static bool dequant_takes(int codec) { return (codec >= 3 && codec <= 6) || (codec >= 12 && codec <= 15); }

// From the sweep (docs/perf/sparse_moe_history.md, "Routes"; qwen3 geometry, H200, this route
// against the k-quant kernel): q4_k, q5_k and q6_k gate/up gain from T = 512 (0.98x, 0.92x,
// 0.95x; 1.07 - 1.20x at 256); q8_0, whose own kernel decodes cheaply, from 1536 (1.016x at 1024,
// 0.878x at 1536). Gate/up holds two thirds of the bytes, so its codec decides. The sweep's routing
// is trace-like (skewed, as real routing is); under uniform routing the copy loses up to T = 768 and
// wins from 1024 (docs/data/dequant_from_h200.txt): the routing, not the cache, moves the crossover.
// The import-only codecs take the k-quants' 512 (not swept: their decode costs as much or more a
// weight than q4_k's, which is what makes the copy pay).
uint32_t dequant_from(int codec_gate_up, int codec_down)
{
    if (!dequant_takes(codec_gate_up) || !dequant_takes(codec_down)) return UINT32_MAX;
    return codec_gate_up == 3 /* q8_0 */ ? 1536 : 512;
}

cudaError_t launch_dequant_bf16(int codec, const DevMat W, const Groups &g, uint16_t *dst, DevMat *bf,
                                cudaStream_t s)
{
    // W by value: callers pass their own descriptor as both W and *bf
    if (!dequant_takes(codec)) return cudaErrorInvalidValue;
    *bf = DevMat{};
    bf->data = reinterpret_cast<const uint8_t *>(dst);
    bf->row_stride = 2ull * W.cols;
    bf->rows = W.rows;
    bf->cols = W.cols;
    const dim3 grid((W.rows + kDeqRows - 1) / kDeqRows, g.max_groups);
    return dispatch_codec(codec, [&](auto c) {
        using C = decltype(c);
        if constexpr (std::is_same<C, CBF16>::value || std::is_same<C, CNVFP4>::value) {
            return cudaErrorInvalidValue;
        } else {
            dequant_kernel<C><<<grid, kDeqWarps * 32, 0, s>>>(W, g, nf_fastdiv_make(W.cols / C::BLK * C::PIECES), dst);
            return cudaGetLastError();
        }
    });
}

} // namespace nf

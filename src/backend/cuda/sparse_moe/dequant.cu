// The prefill of k-quant and q8_0 banks at large T through bf16: each slice decodes its active
// experts' rows once into a bf16 scratch bank (the codec's own device decode, then bf16 as the
// prefill kernels round every weight), which the bf16 wide tile (prefill_wg.cu) multiplies. Why: the
// mma.sync kernel decodes B in every warp of its MMA loop and reached 14 % of cuBLAS at T = 4096
// (q4_k+q6_k, H200), where the bf16 wide tile reaches 43 %; a slice's decode reads the quantised
// bank once and writes bf16 once (qwen3 geometry, all 128 experts: ~0.4 GB read, 1.2 GB written).
// The operands are the same bf16 values, so the route changes no tolerance.
#include "internal.cuh"

namespace nf {

namespace {

constexpr int kDeqWarps = 8, kDeqRows = 32; // rows a CTA, a warp a row at a time

// Rows blockIdx.x * kDeqRows .. of live group blockIdx.y's expert into dst[(e * rows + r) * cols],
// a lane a piece at a time, each run of the piece stored 4 bf16 at once.
template <class C>
__global__ void __launch_bounds__(kDeqWarps * 32) dequant_kernel(DevMat W, Groups g, uint16_t *dst)
{
    const int gi = blockIdx.y;
    if (gi >= *g.n) return;
    const uint32_t e = (uint32_t)g.expert[gi], pieces = W.cols / C::BLK * C::PIECES;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (uint32_t r = blockIdx.x * kDeqRows + warp; r < min(W.rows, (blockIdx.x + 1) * kDeqRows); r += kDeqWarps) {
        const typename C::Row row = C::row(W, e, r);
        uint16_t *out = dst + ((size_t)e * W.rows + r) * W.cols;
        for (uint32_t q = lane; q < pieces; q += 32) {
            float w[C::PE];
            C::decode(row, C::load(row, (int)q), (int)q, w);
#pragma unroll
            for (int run = 0; run < C::RUNS; run++) {
                const int k0 = C::elem((int)q, run);
#pragma unroll
                for (int j = 0; j < C::RUN; j += 4)
                    *reinterpret_cast<uint2 *>(out + k0 + j) =
                        make_uint2(pack_bf16x2(w[run * C::RUN + j], w[run * C::RUN + j + 1]),
                                   pack_bf16x2(w[run * C::RUN + j + 2], w[run * C::RUN + j + 3]));
            }
        }
    }
}

} // namespace

bool dequant_route_codec(int codec) { return codec == 3 || codec == 4 || codec == 5 || codec == 6; }

cudaError_t launch_dequant_bf16(int codec, const DevMat W, const Groups &g, uint16_t *dst, DevMat *bf,
                                cudaStream_t s)
{
    // W by value: callers pass their own descriptor as both W and *bf
    if (!dequant_route_codec(codec)) return cudaErrorInvalidValue;
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
            dequant_kernel<C><<<grid, kDeqWarps * 32, 0, s>>>(W, g, dst);
            return cudaGetLastError();
        }
    });
}

} // namespace nf

// What the Gated DeltaNet kernels of gdn.cu (the conv, the per-token recurrence, the norm, a layer's
// launches) and gdn_chunk.cu (the chunked form) share; not an interface (that is gdn.cuh).
#pragma once
#include "gdn.cuh"

namespace nf {
namespace dec {

// Sequence i's tokens t0 .. t1 - 1 of the batch and whether it starts here (position 0: its slot's
// state counts as zeros, so nothing needs clearing between sequences).
struct SeqSpan {
    int t0, t1;
    bool fresh;
};
__device__ __forceinline__ SeqSpan seq_span(const Batch &b, uint32_t i)
{
    const int t0 = i ? b.last[i - 1] + 1 : 0;
    return SeqSpan{t0, b.last[i] + 1, b.pos[t0] == 0};
}

__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); } // F.softplus

// The chunked form's two launches (gdn_chunk.cu) for the batch's sequences of chunk_from tokens or more;
// C the conv's channels (2 Hk dk + Hv dv).
cudaError_t gdn_chunked(const GdnArgs &g, const Batch &b, uint32_t T, uint32_t S, uint32_t C, uint32_t chunk_from,
                        cudaStream_t s);

} // namespace dec
} // namespace nf

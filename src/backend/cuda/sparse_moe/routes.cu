// The routes' frontiers per profile (internal.cuh, "Route frontiers"): the measured crossings that
// nf_sparse_moe_bind turns into the bank's thresholds. Each figure is from a recorded sweep; a new
// kernel or card means a new sweep (`ninfer bench sparse-moe --sweep`, docs/sparse_moe.md).
#include "internal.cuh"

extern "C" {
#include "codec/codec.h"
}

namespace nf {

// The small-token/prefill frontier per profile: the largest T at which the CUDA-core route beats the
// tensor-core one, from the recorded sweep (docs/perf/sparse_moe_history.md, "Thresholds"; H200,
// qwen3-30b-a3b geometry, trace-like routing, cold L2, graph replay). q4_k+q6_k stands for the k-quant gate/up profiles, which
// share its kernels' per-byte cost; the other k-quant mixes were not swept apart. The import-only
// gate/up codecs were swept on an H100 (q3_k+q5_k, iq4_xs+q6_k, iq4_nl+q8_0, q2_k+q3_k). 16 is the kernels'
// limit (kSmallRouteMax), not a crossing. bf16 on sm_90 has the wgmma prefill (prefill_wg.cu), which
// wins from T = 7 (175 vs 169 us; 355 vs 220 at 16, docs/data/frontier_wg_h200.csv); elsewhere its
// prefill is prefill.cu's mma.sync kernel, which the small-token route beats up to 16.
uint32_t small_route_max(int gate_up_codec)
{
    switch (gate_up_codec) {
    case NF_CODEC_BF16: return prefill_wg_usable(NF_CODEC_BF16, 128, 0) ? 6 : 16;
    case NF_CODEC_NVFP4: return 12; // tensor-core gate/up: 254 vs 417 us at 12, the sweep's end
    case NF_CODEC_Q8_0: return 16;  // 347 vs 472 us at 16
    // the import-only codecs (H100, docs/data/import_a8_h100.txt): iq4's table lookups make its
    // small-token route lose from 13 (iq4_xs+q6_k 342 vs 274 us; iq4_nl+q8_0 even from 13 on);
    // q2_k has no int8 spans, its f32 GEMV loses from 5 (248 vs 162 us; even at 3 and 4)
    case NF_CODEC_IQ4_XS: return 12; // 224 vs 273 us at 12
    case NF_CODEC_IQ4_NL: return 12; // 174 vs 235 us at 12; 238 vs 237 at 13
    case NF_CODEC_Q2_K: return 4;    // 159 vs 160 us at 4
    default: return 16;             // q4_k+q6_k: 359 vs 568 us at 16; q3_k+q5_k (H100): 250 vs 293
    }
}

// Where the bank takes the mmq route, its two frontiers by gate/up codec: the last T at which the
// small-token route still wins (at most kSmallRouteMax), and the last at which mmq beats the prefill
// route (whose bf16 copy of the active experts, dequant.cu, wins above). The first from the sweep of
// the small-token route with the down by rows (docs/perf/down_rows_h100_2026-12-07.md: H100,
// qwen3-30b-a3b geometry, trace-like, cold L2, graph replay, --route small | mmq in one call, us):
// q4_k+q6_k T = 12 124.1 / 139.0, 14 138.0 / 148.9, 16 147.7 / 149.9; q5_k+q6_k 16 155.8 / 165.1;
// q8_0+q8_0 12 145.6 / 156.6, 14 161.9 / 160.8 (13 not measured; rows two passes a warp, one is within
// 1 %). (With the fused down they crossed at 11, 9 and 7.) The second from the mmq sweep
// (docs/perf/sparse_moe_history.md, "The mmq route"). q6_k gate/up was not swept: q5_k's.
uint32_t mmq_small_max(int gate_up_codec)
{
    switch (gate_up_codec) {
    case NF_CODEC_Q8_0: return 12;
    default: return kSmallRouteMax; // q4_k, q5_k (and q6_k)
    }
}
// Swept when the small-token route ran the shared expert on f32 CUDA-core GEMVs (8 positions a pass;
// from two tokens it now runs on int8 where its codecs allow: a re-sweep is due). Where it
// is at least half a token's routed work (S >= k I / 2: qwen2_moe's, e.g. qwen2-57b-a14b's 20480
// against 8 x 2560) and the mmq route runs it on the int8 kernels (sh_mmq), that route wins almost
// at once: H100, qwen2-57b-a14b, --route small | mmq in one call, us:
//   q4_k+q6_k/q4_k+q6_k  T = 2 535 / 547, 3 746 / 573, 4 1019 / 614, 8 2535 / 694, 16 4965 / 878
//   q8_0+q8_0/q8_0+q8_0  T = 2 895 / 522, 3 1170 / 541, 4 1775 / 606, 8 3491 / 716, 16 6664 / 900
// (q5_k gate/up not swept: q4_k's.) Qwen3.5's 512 against 8 x 512 keeps the codec's frontier (T = 8:
// 125 vs 131 us; 12: 191 vs 149).
uint32_t mmq_small_max_big_shared(int gate_up_codec)
{
    return gate_up_codec == NF_CODEC_Q8_0 ? 1 : 2;
}

uint32_t mmq_route_max(int gate_up_codec)
{
    switch (gate_up_codec) {
    case NF_CODEC_Q8_0: return kMmqMaxTokens; // T = 1024: 639.7 vs 854.2 us
    case NF_CODEC_Q4_K: return 896;           // q4_k+q6_k 1019.1 vs 1063.0 at 896, 1121.8 vs 1088.4 at 1024
    default: return 768;                      // q5_k+q6_k 1024.5 vs 1083.1 at 768, 1114.0 vs 1100.5 at 896
    }
}

} // namespace nf

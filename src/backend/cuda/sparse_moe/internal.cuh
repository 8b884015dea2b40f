// Internal interfaces between the sparse-MoE translation units (C++; not part of the C API).
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include <atomic>
#include <type_traits>

#include "dev_codecs.cuh"
#include "dev_codecs_import.cuh"

extern "C" {
#include "base/error.h"
#include "sparse_moe.h"
}

namespace nf {

// A fire-and-forget prefetch of the 128-byte line at p: into L1 (and L2), or into L2 only.
__device__ __forceinline__ void prefetch_line(const void *p, bool l1)
{
    if (l1) asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
    else asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// k<<<grid, block, smem, s>>>(args...), with programmatic dependent launch when pdl: the kernel may
// start while its predecessor drains, so it must call cudaGridDependencySynchronize() before it reads
// anything the predecessor writes.
template <class... P, class... A>
cudaError_t launch_pdl(void (*k)(P...), dim3 grid, dim3 block, size_t smem, bool pdl, cudaStream_t s, A &&...args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, k, static_cast<A &&>(args)...);
}

// Attribute A of the current device (0 when it cannot be queried), asked of the driver once per
// device: the admission predicates and launch shapes that use it run on every eager launch.
template <cudaDeviceAttr A>
inline int device_attr()
{
    static std::atomic<int> known[64]; // 0: not asked yet
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    if (dev < 64 && (v = known[dev].load(std::memory_order_relaxed)) > 0) return v;
    if (cudaDeviceGetAttribute(&v, A, dev) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    if (dev < 64) known[dev].store(v, std::memory_order_relaxed);
    return v;
}

// The opt-in shared memory per block: what the admission predicates hold a kernel's shared-memory
// stage to (H200: 227 KiB; client Blackwell: ~99).
inline size_t smem_optin_limit() { return (size_t)device_attr<cudaDevAttrMaxSharedMemoryPerBlockOptin>(); }
// The SM count (launch shapes of one wave).
inline int sm_count() { return device_attr<cudaDevAttrMultiProcessorCount>(); }

// Routing and the expert-sorted work list, all in the workspace (device memory).
//   logits    [T][E] f32
//   topk_id   [T][k] i32, topk_w [T][k] f32 (router weights after optional renormalisation)
//   shared_g  [T] f32: sigmoid(shared_gate . x[t]) (absent without a shared expert)
//   slot      [T*k]: position of entry (t, j) in the expert-sorted order
//   pos_entry [T*k]: the entry (t * k + j) each position holds
//   groups: n_groups active experts, in increasing expert id; group g is expert g_expert[g],
//           positions g_start[g] .. g_start[g] + g_count[g]
struct Routing {
    float *logits;
    int32_t *topk_id;
    float *topk_w;
    float *shared_g;
    int32_t *slot;
    int32_t *pos_entry;
    int32_t *n_groups;
    int32_t *g_expert, *g_start, *g_count;
    int32_t *shared_group; // [4]: n_groups = 1, expert 0, start 0, count T (set per slice)
    int32_t *wl_base;      // [E]: the prefill work list's first position of each expert
    int *wl_state;         // [1 + E] operator state, 0 between forwards: the work list's ticket, counts
    // prefill tile tables (routed; shared expert): tile i covers positions tile_m0[i] ..
    // + tile_m - 1 (sh_tile_m) of group tile_group[i]; n_tiles live entries
    int32_t *n_tiles, *tile_group, *tile_m0;
    int32_t *sh_n_tiles, *sh_tile_group, *sh_tile_m0;
    int32_t tile_m, sh_tile_m; // the slice's tile heights (host-chosen from T, never from routing)
};

// A prefill tile table as the GEMM reads it: tile i covers positions m0[i] .. m0[i] + height - 1
// of group group[i]; *n live entries (device), at most max (the grid bound).
struct TileList {
    const int32_t *n, *group, *m0;
    uint32_t max;
    int height; // 32, 64 or 128 (prefill.cu's BM)
};
constexpr int kPrefillTileM = 128;   // the tallest tile: dense layers, the shared expert above T = 128
constexpr int kPrefillTileMinM = 32; // the shortest: tile tables are sized for it

// prefill.cu: the tile height for groups of `avg` positions on average (T * k / E routed, T shared):
// a tile's MMAs cover all its rows, filled or not, and shorter tiles decode each weight slice once
// per tile, so the height follows the group size (thresholds: docs/sparse_moe.md, "Tile height").
// wg_codec: the bank's codec where its GEMMs may run on prefill_wg.cu's kernels (bf16, nvfp4 W4A16),
// -1 otherwise; height 128 then starts at prefill_wg_tall_from(wg_codec) positions (the wide tile).
int prefill_tile_height(double avg, int wg_codec);
double prefill_wg_tall_from(int codec); // prefill_wg.cu; INFINITY where the wide tile does not serve it

// devmat.cu: one matrix (experts x rows x cols) in the kernels' layout. devmat_bytes: the device
// bytes it takes (NF_ERR_REFUSED for an nvfp4 plane set breaking its layout rules); devmat_upload
// copies it to dst (that many bytes) and fills the descriptor. Errors name the matrix by `name`.
nf_status devmat_bytes(const nf_moe_matrix *mm, const char *name, size_t *bytes, nf_error *err);
nf_status devmat_upload(const nf_moe_matrix *mm, uint8_t *dst, DevMat *d, const char *name, nf_error *err);
// The same layout in host memory (row codecs only; tests check the span arithmetic on the CPU).
nf_status devmat_host(const nf_moe_matrix *mm, uint8_t *dst, DevMat *d, nf_error *err);

// A group list for the grouped GEMV/GEMM kernels: (n_groups on device, expert, start, count).
struct Groups {
    const int32_t *n, *expert, *start, *count;
    const int32_t *pos_entry; // entry of each position; input row = pos_entry[pos] / entry_div (NULL: pos)
    uint32_t entry_div;
    uint32_t max_groups;      // grid bound (the device-side count decides which exit early)
};

// The input row of a position: x through pos_entry (the routes' gate/up) or the position itself.
__device__ __forceinline__ int input_row(const Groups &g, int pos)
{
    return g.pos_entry ? g.pos_entry[pos] / (int)g.entry_div : pos;
}

// The prefill GEMMs' B tiles are kPrefillTileN weight rows. B row r of column block bx holds weight
// row prefill_b_row(bx, r): for gate/up, rows 2i and 2i + 1 are gate and up of intermediate element
// 64 bx + i, so a thread's accumulator pair (columns 2i, 2i + 1) is (gate, up) of one element and
// SwiGLU needs no exchange; for a plain matrix, row 128 bx + r.
constexpr int kPrefillTileN = 128;
template <bool GLU>
__device__ __forceinline__ uint32_t prefill_b_row(const DevMat &W, int bx, int r)
{
    return GLU ? (uint32_t)(bx * (kPrefillTileN / 2) + (r >> 1) + ((r & 1) ? (int)W.rows / 2 : 0))
               : (uint32_t)(bx * kPrefillTileN + r);
}

// A prefill tile's entries (TileList tile i): its group's expert, its first position and its live
// positions (at most `height`); threads 0 .. BM - 1 write rows[r] = the input row of position
// start + r (0 past count: those rows load zeros). The caller syncs before reading rows.
struct TileRows {
    int expert, start, count;
};
template <int BM>
__device__ __forceinline__ TileRows tile_rows(const Groups &g, const int32_t *tile_group, const int32_t *tile_m0,
                                              int tile, int height, int32_t *rows)
{
    const int gi = tile_group[tile], m0 = tile_m0[tile];
    const TileRows t{g.expert[gi], g.start[gi] + m0, min(height, g.count[gi] - m0)};
    // one pass (blockDim >= BM); written as a loop, not a guarded store, because that measured ~2 %
    // faster layers on the mma.sync k-quant tiles (q8_0+q8_0 at T = 512 and 1024, H200: a
    // code-generation effect in prefill.cu's kernel, not understood)
    for (int i = (int)threadIdx.x; i < BM; i += BM) rows[i] = i < t.count ? input_row(g, t.start + i) : 0;
    return t;
}

// A group slot's table entries: the live group count, and slot gi's expert, first position and count.
struct GroupEntry {
    int live, expert, start, count;
};

// The four entries of slot gi in one round trip, for a kernel's critical path after its wait. The
// loads are volatile so that the compiler keeps all four ahead of the `gi < live` test (it would sink
// a plain load below the branch, a second round trip); gi < max_groups keeps them in bounds whatever
// the live count (the values of a slot that is not live are not used).
__device__ __forceinline__ int ld_s32_volatile(const int32_t *p)
{
    int v;
    asm volatile("ld.global.s32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ GroupEntry group_entry(const Groups &g, int gi)
{
    return GroupEntry{ld_s32_volatile(g.n), ld_s32_volatile(g.expert + gi), ld_s32_volatile(g.start + gi),
                      ld_s32_volatile(g.count + gi)};
}

// The router as the tensor-core prefill router reads it: bf16 planes [n][E][H] whose sum is each row
// (n = 1: a bf16 router's own rows; 3: an f32 router split once at bind into hi + mid + lo, bf16x3.cuh).
struct RouterPlanes {
    const uint16_t *p;
    uint32_t n;
};

// router.cu: logits, top-k and the work list of a slice. small = the decode/small-token form (one
// launch; `counter` is a device int that is 0 between forwards). forced: benchmark routing or NULL.
void launch_routing(const DevMat &router, int router_codec, const RouterPlanes &rp, const DevMat *shared_gate,
                    int shared_gate_codec, const uint16_t *x, uint32_t T, uint32_t H, uint32_t E, uint32_t k,
                    int norm_topk, const Routing &r, const int32_t *forced, int *counter, bool small, cudaStream_t s);

// router_cluster.cu: the small routes' router (T <= 16) as one cluster of CTAs: logits, top-k and the
// work list in one launch (w f32 where w_f32, else bf16; gw likewise, or NULL). false: nothing
// launched (the device cannot run the cluster or its shared memory); launch_routing then runs the
// last-CTA form.
bool launch_router_cluster(const void *w, bool w_f32, const void *gw, bool gw_f32, const uint16_t *x, uint32_t T,
                           uint32_t H, uint32_t E, uint32_t k, int norm, const Routing &r, const int32_t *forced,
                           cudaStream_t s);

// router_mma.cu: the prefill form's logits on tensor cores with softmax, top-k and the shared gate in
// the same launch (writes r.topk_id, r.topk_w, r.shared_g; not r.logits). false: nothing launched
// (E > 512, k > 16, no bulk tensor copy, or its shared memory exceeds the device's). gw (the shared
// gate, f32 where gw_f32, else bf16) may be NULL.
bool launch_router_mma(const RouterPlanes &rp, const void *gw, int gw_f32, const uint16_t *x, uint32_t T, uint32_t H,
                       uint32_t E, uint32_t k, int norm, const Routing &r, cudaStream_t s);
// T from which the prefill router runs on tensor cores. One CTA takes 16 tokens against all E rows
// (the top-k needs them together), so below a few CTAs a slice pulls every router row through one SM:
// bf16 qwen3-30b-a3b router, ncu on the H200: 24.6 - 26.5 us at T = 8 .. 512 (1 .. 32 CTAs) against
// the CUDA-core logits + top-k's 24.3 at T = 8 and 27.3 at T = 512; 36.5 against 134.9 at T = 4096.
constexpr uint32_t kRouterMmaFrom = 512;

// dequant.cu: the prefill route of k-quant and q8_0 banks from dequant_from(gate/up codec, down
// codec) tokens (UINT32_MAX: a codec it does not take): the active experts of W (live groups of g)
// decoded into dst as a bf16 bank [E][W.rows][W.cols], *bf its descriptor, for the bf16 wide tile.
uint32_t dequant_from(int codec_gate_up, int codec_down);
cudaError_t launch_dequant_bf16(int codec, const DevMat W, const Groups &g, uint16_t *dst, DevMat *bf,
                                cudaStream_t s);

// decode.cu: down projection and combine in one pass for the decode and small-token routes:
// out[t][h] = bf16( sum over t's positions p of w(p) * (down_e(p)[h] . act[p]) + shared_g[t] * ys[t][h] )
// pdl: launched with programmatic dependent launch after gate/up (see decode.cu for what that needs).
cudaError_t launch_down_combine(int codec, const DevMat &W, const float *act, const Routing &r, uint32_t T,
                                uint32_t k, uint32_t max_groups, const float *ys, uint16_t *out, bool pdl,
                                cudaStream_t s);

// down_a8.cu: the same with the intermediate quantised to int8 per 32 elements (the down matrix
// allows A8) for q4_k, q5_k, q6_k and q8_0 banks; supported: the codec, the shape and T * k
// positions whose quantised intermediate fits one CTA's shared memory.
bool down_a8_supported(int codec, const DevMat &W, uint32_t T, uint32_t k);
// aq / ad: the intermediate already quantised by gate/up (GemvLaunch::aq, ad; act unused), else null.
cudaError_t launch_down_a8(int codec, const DevMat &W, const float *act, const int8_t *aq, const float2 *ad,
                           const Routing &r, uint32_t T, uint32_t k, const float *ys, uint16_t *out, bool pdl,
                           cudaStream_t s);

// down_a8.cu, by rows (2 <= T <= 16, the intermediate quantised by gate/up): each active expert's
// down rows streamed into the y plane [T k][H] f32 (g: the routed groups, pos_entry unused); the
// combine (launch_combine, y f32) finishes the layer. The small-token route takes it from
// kDownRowsFrom tokens, down_a8's fused form below: H100, qwen3-30b-a3b geometry, cold L2,
// trace-like, rows / fused time (docs/perf/down_rows_h100_2026-12-07.md): q4_k+q6_k T = 2 1.03,
// 4 1.00, 8 0.95, 12 0.94, 16 0.75; q8_0+q8_0 1.01, 0.98, 0.96, 0.93, 0.79 (the combine's launch
// costs what the rows gain at 2 - 4 tokens).
constexpr uint32_t kDownRowsFrom = 8;
// Its lanes a row: the fewest (a power of two, 4 .. 16) that leave a lane at most kDownRowsNS spans.
constexpr int kDownRowsNS = 3;
__host__ __device__ constexpr int down_rows_lanes(int spans)
{
    return spans <= 4 * kDownRowsNS ? 4 : spans <= 8 * kDownRowsNS ? 8 : 16;
}
cudaError_t launch_down_rows_a8(int codec, const DevMat &W, const int8_t *aq, const float2 *ad, const Groups &g,
                                uint32_t T, float *y, bool pdl, cudaStream_t s);

// down_mma.cu: the same on tensor cores for nvfp4 (codec 11) and bf16 (codec 2) down banks (exact
// operands, the f32 intermediate split into bf16 hi and lo columns; gemv_mma.cu's numerics).
// Supported: those codecs, cols a multiple of the format's chunk (nvfp4 128, bf16 64), T <= 16, and
// the 2 T k staged columns within the device's shared memory per block (down_mma_smem bytes: T = 8,
// k = 8, I = 768 fits an H200's 227 KB, T = 16 does not). down_mma_supported_within: the same against
// a given limit (host-checkable).
bool down_mma_supported(int codec, const DevMat &W, uint32_t T, uint32_t k);
bool down_mma_supported_within(int codec, const DevMat &W, uint32_t T, uint32_t k, size_t smem_limit);
size_t down_mma_smem(uint32_t T, uint32_t k, uint32_t I); // 0 for T outside 1..16
cudaError_t launch_down_mma(int codec, const DevMat &W, const float *act, const Routing &r, uint32_t T, uint32_t k,
                            const float *ys, uint16_t *out, bool pdl, cudaStream_t s);

// The small-token kernels' token tiles: f(std::integral_constant<int, MAXT>{}) with the smallest
// MAXT in {1, 2, 4, 8, 16} that covers T (registers hold MAXT accumulators); T > 16 is refused.
template <class F>
cudaError_t with_maxt(uint32_t T, F &&f)
{
    if (T <= 1) return f(std::integral_constant<int, 1>{});
    if (T <= 2) return f(std::integral_constant<int, 2>{});
    if (T <= 4) return f(std::integral_constant<int, 4>{});
    if (T <= 8) return f(std::integral_constant<int, 8>{});
    if (T <= 16) return f(std::integral_constant<int, 16>{});
    return cudaErrorInvalidValue;
}

// Calls f(Codec{}) with the device codec of an nf_codec_id; cudaErrorInvalidValue for others.
// nf_codec_id values (codec/codec.h): BF16 2, Q8_0 3, Q4_K 4, Q5_K 5, Q6_K 6, NVFP4 11, and the
// import-only Q2_K 12, Q3_K 13, IQ4_XS 14, IQ4_NL 15 (dev_codecs_import.cuh).
template <class F>
cudaError_t dispatch_codec(int codec, F &&f)
{
    switch (codec) {
    case 2: return f(CBF16{});
    case 3: return f(CQ8{});
    case 4: return f(CQ4K{});
    case 5: return f(CQ5K{});
    case 6: return f(CQ6K{});
    case 11: return f(CNVFP4{});
    case 12: return f(CQ2K{});
    case 13: return f(CQ3K{});
    case 14: return f(CIQ4XS{});
    case 15: return f(CIQ4NL{});
    default: return cudaErrorInvalidValue;
    }
}

// gemv.cu: the CUDA-core grouped GEMV used by the decode and small-token routes.
//   GLU (gate/up): out[pos][r] = silu(gate_r . in) * (up_r . in), r < W.rows / 2
//   plain (down):  out[pos][r] = W_r . in, r < W.rows
// in: bf16 rows (x, addressed through pos_entry) or f32 rows (act, addressed by position).
cudaError_t launch_gemv(int codec, bool glu, const DevMat &W, const void *in, bool in_bf16, uint32_t in_stride,
                        const Groups &g, float *out, uint32_t out_stride, uint32_t max_tokens, cudaStream_t s);

// The same with the decode route's options. next: the matrix the following launch reads, whose
// routed experts' bytes gate/up prefetches into L2 (data NULL: none); expert e's bytes are
// [data + e * expert_bytes, + expert_bytes). pdl: programmatic dependent launch (the kernel waits
// for its predecessor on the device). rows_are_x0: every position's input row is row 0 (one token),
// so a T = 1 launch may stage it before that wait. a8: the caller accepts int8-quantised
// activations (gemv_a8.cu: bf16 inputs, k-quant or q8_0 weights, 32-element blocks).
// groups_ready (gemv_a8.cu): the kernel may read the group tables before its wait and fetch its first
// rows then (a kernel of a PDL chain starts only after the one before its predecessor completed).
struct NextMat {
    const uint8_t *data;
    uint64_t expert_bytes;
};
struct GemvLaunch {
    NextMat next;
    bool pdl, rows_are_x0, a8;
    bool groups_ready; // the group tables were written before the predecessor: read before the wait
    // a8, plain: the input rows already quantised by launch_mmq_quant (padded), row = position; the
    // CTAs copy them instead of each quantising them again (null: quantised in the kernel)
    const int8_t *xq;
    const float2 *xd;
    // a8, GLU, 1 < T (the small-token route before down_a8): the SwiGLU outputs quantised per 32
    // instead of stored in f32 (quant_a8.cuh's quantiser: the bits down_a8's own staging would give),
    // position p's row at aq + p * a8_stride(rows / 2), its (d, d sum q) pairs at ad + p * (rows / 64);
    // rows / 2 % 32 == 0. Null: f32 out.
    int8_t *aq;
    float2 *ad;
};
cudaError_t launch_gemv_ex(int codec, bool glu, const DevMat &W, const void *in, bool in_bf16, uint32_t in_stride,
                           const Groups &g, float *out, uint32_t out_stride, uint32_t max_tokens,
                           const GemvLaunch &opt, cudaStream_t s);

// gemv_a8.cu: the GEMV (GLU or plain) for q4_k, q5_k, q6_k or q8_0 weights and bf16 inputs with the
// activations quantised to int8 per 32 elements (dp4a); same arguments as launch_gemv_ex.
bool gemv_a8_supported(int codec, const DevMat &W);
cudaError_t launch_gemv_a8(int codec, bool glu, const DevMat &W, const uint16_t *in, uint32_t in_stride,
                           const Groups &g, float *out, uint32_t out_stride, uint32_t max_tokens,
                           const GemvLaunch &opt, cudaStream_t s);

// gemv_a8.cu: up to kMaxA8Segs plain matrices of one bf16 input in one launch, T tokens:
// out_i[t][r] (rows of token t out_stride floats apart) = W_i row r . x_t (f32) for each segment i,
// int8 activations as launch_gemv_a8 (the same bits as one launch_gemv_a8 per matrix). Each its own
// codec (gemv_a8_supported), one expert, the same columns, and the same lane spans in flight (true
// of the k-quants among themselves). T = 1: in is the row, quantised by each CTA; 1 < T <=
// kMaxSegsTokens: xq / xd hold the T rows quantised by launch_mmq_quant (padded), cols % 64 == 0, one
// span of a row in flight per lane (k-quant rows up to 2048 wide, q8_0 up to 1024).
constexpr int kMaxA8Segs = 3;
constexpr uint32_t kMaxSegsTokens = 16;
struct A8Seg {
    DevMat W;
    int codec;
    float *out;
};
bool gemv_a8_segs_supported(const A8Seg *s, int n, uint32_t T);
cudaError_t launch_gemv_a8_segs(const A8Seg *s, int n, const uint16_t *in, uint32_t T, const int8_t *xq,
                                const float2 *xd, uint32_t out_stride, bool pdl, cudaStream_t st);

// gemv_mma.cu: the tensor-core GEMV (GLU or plain) for nvfp4 (codec 11) and bf16 (codec 2) weights,
// bf16 or f32 inputs (bf16 MMA on exact operands: nvfp4 as e2m1 * e4m3, bf16 as it is); same
// arguments and semantics as launch_gemv_ex, opt.a8 ignored. Supported: those codecs, cols a
// multiple of 128 (at most 12288), at least one row, one f32 token's staged columns within the
// device's shared memory per block.
bool gemv_mma_supported(int codec, const DevMat &W);
cudaError_t launch_gemv_mma(int codec, bool glu, const DevMat &W, const void *in, bool in_bf16, uint32_t in_stride,
                            const Groups &g, float *out, uint32_t out_stride, uint32_t max_tokens,
                            const GemvLaunch &opt, cudaStream_t s);
// The warps (4, 8 or 16; 0: not supported) a CTA of launch_gemv_mma with these arguments gets:
// 8 or 16 when the grid stays one wave (gemv_mma.cu, "Warps a CTA"); -1 when it streams
// (gemv_stream.cu).
int gemv_mma_warps(int codec, bool glu, const DevMat &W, bool in_bf16, uint32_t max_groups, uint32_t max_tokens,
                   bool rows_are_x0);

// gemv_stream.cu: one token of one group against bf16 rows, a resident CTA an SM walking 16-row tiles
// that bulk copies bring into shared memory; launch_gemv_mma's choice for matrices whose 4-warp grid
// is more than one wave (the LM head).
bool gemv_stream_supported(int codec, const DevMat &W);
cudaError_t launch_gemv_stream(const DevMat &W, const uint16_t *in, uint32_t in_stride, const Groups &g, float *out,
                               uint32_t out_stride, const GemvLaunch &opt, cudaStream_t s);

// prefill.cu: the tensor-core grouped GEMM. glu: in = x rows through pos_entry, out = act (bf16,
// [pos][W.rows / 2]); else in = act (bf16), out = y ([pos][W.rows], f32, or bf16 when y16: the
// sparse-MoE down's y plane, which the combine reads; the decoder's dense layers keep f32).
bool prefill_supported(const DevMat &gate_up, const DevMat &down);
cudaError_t launch_prefill_gemm(int codec, bool glu, const DevMat &W, const uint16_t *in, uint32_t in_stride,
                                const Groups &g, const TileList &tl, void *out, uint32_t out_stride, bool y16,
                                cudaStream_t s);

// prefill_wg.cu: the same GEMM on warpgroup MMA for bf16 and nvfp4 banks (W4A16) on sm_90 devices:
// usable says whether this codec, device and tile list can take it; launch_prefill_gemm uses it
// when so.
bool prefill_wg_usable(int codec, int height, uint32_t max_tiles);
cudaError_t launch_prefill_wg(int codec, bool glu, const DevMat &W, const uint16_t *in, uint32_t in_stride,
                              const Groups &g, const TileList &tl, void *out, uint32_t out_stride, bool y16,
                              cudaStream_t s);

// mmq.cu: the grouped int8 tensor-core GEMM of the mmq route (k-quant and q8_0 banks between the
// small-token route and the prefill): glu: act [pos][W.rows / 2] = silu(gate) * up, quantised per 32
// elements into aq [pos][W.rows / 2] int8 and ad [pos][W.rows / 64] (d, d * sum q) (out unused);
// else out = y [pos][W.rows] (f32; aq, ad unused). xq [row][W.cols] int8 and xd [row][W.cols / 32] (d, d * sum q): the
// input rows quantised by launch_mmq_quant (glu: x's rows, through pos_entry; else the positions'
// act rows). tl: the work list's tile table at height 32 or 64 (the kernel's position tile).
// Supported: q4_k, q5_k, q6_k, q8_0; cols a multiple of the codec's slice (256; q8_0 128), 128 rows
// a CTA (glu: 64 row pairs), the shared memory of a 64-position tile within smem_limit.
bool mmq_supported(int codec, const DevMat &W, bool glu);
bool mmq_supported_within(int codec, const DevMat &W, bool glu, size_t smem_limit);
// shared memory of one CTA (0: not a codec it takes), with the rows' scale fields staged or (staged
// false: plain form only) read from global memory; whether a plain (not GLU) matrix's are staged at
// this height, as launch_mmq decides it
size_t mmq_smem(int codec, const DevMat &W, int height, bool staged = true);
bool mmq_meta_staged(int codec, const DevMat &W, int height);
cudaError_t launch_mmq(int codec, bool glu, const DevMat &W, const int8_t *xq, const float2 *xd, const Groups &g,
                       const TileList &tl, float *out, uint32_t out_stride, int8_t *aq, float2 *ad, cudaStream_t s);
// rows x cols (bf16 when in_bf16, else f32; rows contiguous) quantised per 32 elements as the W·A8
// routes do (quant_a8.cuh): xq [rows][cols] int8 unpadded, or padded (quant_a8.cuh's staged rows,
// a8_stride(cols) bytes apart: GemvLaunch::xq's layout); xd [rows][cols / 32]. cols % 32 == 0.
// pdl: launched with programmatic dependent launch (it waits for its predecessor before reading).
cudaError_t launch_mmq_quant(const void *in, bool in_bf16, uint32_t rows, uint32_t cols, int8_t *xq, float2 *xd,
                             cudaStream_t s, bool padded = false, bool pdl = false);
// The most tokens a slice may take on the mmq route (the workspace's mmq planes are sized for
// min(max_tokens, this)); nf_sparse_moe_set_mmq_max clamps to it.
constexpr uint32_t kMmqMaxTokens = 1024;

// ---- Route frontiers (routes.cu), by the bank's gate/up codec ----
// The largest T the fused decode/small-token kernels take (launch_down_combine's widest
// instantiation); thresholds never exceed it.
constexpr uint32_t kSmallRouteMax = 16;
uint32_t small_route_max(int gate_up_codec);          // the small-token / prefill frontier
uint32_t mmq_small_max(int gate_up_codec);            // with the mmq route: small-token / mmq
uint32_t mmq_small_max_big_shared(int gate_up_codec); // the same with a shared expert of S >= k I / 2
uint32_t mmq_route_max(int gate_up_codec);            // mmq / prefill

// A plain epilogue's two adjacent outputs at element i of out: f32, or bf16 when y16.
__device__ __forceinline__ void store_plain2(void *out, size_t i, bool y16, float c0, float c1)
{
    if (y16) *reinterpret_cast<uint32_t *>((uint16_t *)out + i) = pack_bf16x2(c0, c1);
    else *reinterpret_cast<float2 *>((float *)out + i) = make_float2(c0, c1);
}

// combine.cu: out[t] = bf16( sum_j w[t,j] * y[slot(t,j)] + shared_g[t] * ys[t] ), y f32 or (y16) bf16,
// ys f32; pdl: launched to overlap its predecessor's drain (the routing must be older than that)
cudaError_t launch_combine(const Routing &r, const void *y, bool y16, const float *ys, uint32_t T, uint32_t H,
                           uint32_t k, uint16_t *out, cudaStream_t s, bool pdl = false);

} // namespace nf

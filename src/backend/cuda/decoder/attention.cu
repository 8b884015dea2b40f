// Causal GQA attention over the paged bf16 KV cache (ops.cuh Batch: every key row is found through
// its sequence's page table) with an online softmax, so no T x T matrix exists anywhere. A ragged
// batch takes two launches: decode tokens and short chunks the split kernel, prefill chunks the tile
// kernel, each over its own list of tokens / tiles (built by the host per forward, forward.cu).
// Decode and small chunks, flash-decoding style: one CTA per (token, q head, key split); its
// warps take blocks of 32 keys (a lane per key for the scores, a lane per pair of dimensions for the
// values); with more than one split the last split CTA of a (token, head) to finish merges the
// partial (max, sum, acc) triples. Prefill chunks (T >= 16): head dims 64 and 128 on the tensor
// cores, one CTA per tile of 64 tokens and a q head (attn_mma_kernel, FlashAttention-2 style,
// attn_mma.cuh); other head dims on the CUDA cores, one CTA per tile of 16 tokens and a q head
// (attn_prefill_kernel).
#include <math.h>

#include "attn_mma.cuh"
#include "ops.cuh"
#include "rope.cuh"

namespace nf {
namespace dec {

namespace {

constexpr int kWarps = 4;
constexpr int kMaxHd = 256;
// Keys a split keeps at least: the grid's split count is set for the full context (attention_splits),
// and a shorter context runs on ceil(keys / kSplitKeys) of them, the others exiting at once, down to
// one, which writes the output itself. 128 = one 32-key block for each of a CTA's warps: with fewer
// a split's keys take less time than the merge's ticket, partial stores and reloads. (256 left the
// N = 8 decode step's grouped attention at 3 splits of 4 warps over ~600 keys: 96 CTAs.)
constexpr int kSplitKeys = 128;

__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// The online-softmax state of one warp: running max m, sum l, and the lane's NP pairs of acc.
template <int NP>
struct Online {
    float m = -INFINITY, l = 0.0f;
    float acc[2 * NP] = {};
};

// Scores of keys k0 + lane (< k1) against q (smem f32), then the state update with their values.
// Every load of the block -- the lane's K row and its pairs of the 32 V rows -- is issued before any
// is used: a loop that waits on each load (a K chunk, a V row) pays a cache round trip each, ~50 a
// block, which made this kernel the decode step's slowest latency at short contexts. Keys past k1
// read row k0 (always valid) and get p = 0. Same summation order as a one-load-at-a-time loop.
// Pages: a lane looks up its key's pool slot (one cached load of the page table) for its K row, and
// the V rows of the block's 32 keys take those slots from the lanes by shuffles, so any page size
// (a power of two, even below 32) works with one table load per lane and block.
template <int NP>
__device__ void key_block(const AttnArgs &a, const Batch &b, int seq, const float *qs, uint32_t kvh, int k0, int k1,
                          float scale, Online<NP> &st)
{
    const int lane = threadIdx.x % 32, key = k0 + lane;
    const uint32_t kvd = a.kv_heads * a.hd, chunks = a.hd / 8;
    const bool live = key < k1;
    const uint32_t slot = kv_slot(b, seq, live ? key : k0);
    const uint4 *kr = reinterpret_cast<const uint4 *>(a.kc + (size_t)slot * kvd + kvh * a.hd);
    uint4 kv[8 * NP];
#pragma unroll
    for (uint32_t c = 0; c < 8 * NP; c++)
        if (c < chunks) kv[c] = kr[c];
    const int nk = min(32, k1 - k0);
    const uint32_t *vbase = reinterpret_cast<const uint32_t *>(a.vc + kvh * a.hd);
    // V pairs of keys g0 .. g0 + G - 1 (past nk: key 0's, never used); head dims above 128 take the
    // 32 keys in two groups to stay inside the register file
    constexpr int G = NP <= 2 ? 32 : 16;
    uint32_t vv[G][NP];
    auto load_v = [&](int g0) {
#pragma unroll
        for (int j = 0; j < G; j++) {
            const uint32_t vs = __shfl_sync(0xffffffffu, slot, g0 + j < nk ? g0 + j : 0);
#pragma unroll
            for (int i = 0; i < NP; i++) {
                const uint32_t pr = lane + 32 * i;
                if (2 * pr < a.hd) vv[j][i] = vbase[(size_t)vs * (kvd / 2) + pr];
            }
        }
    };
    load_v(0);
    float d = 0;
#pragma unroll
    for (uint32_t c = 0; c < 8 * NP; c++) {
        if (c >= chunks) break;
        const uint32_t w[4] = {kv[c].x, kv[c].y, kv[c].z, kv[c].w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            d = fmaf(__uint_as_float(w[i] << 16), qs[8 * c + 2 * i], d);
            d = fmaf(__uint_as_float(w[i] & 0xFFFF0000u), qs[8 * c + 2 * i + 1], d);
        }
    }
    const float sc = live ? d * scale : -INFINITY;
    const float mb = warp_max(sc);
    const float mn = fmaxf(st.m, mb);
    const float corr = expf(st.m - mn); // 0 while st.m is -inf
    const float p = live ? expf(sc - mn) : 0.0f;
    st.l = st.l * corr + warp_sum(p);
    st.m = mn;
#pragma unroll
    for (int i = 0; i < 2 * NP; i++) st.acc[i] *= corr;
#pragma unroll
    for (int g0 = 0; g0 < 32; g0 += G) {
        if (g0) load_v(g0);
#pragma unroll
        for (int j = 0; j < G; j++) {
            const float pj = __shfl_sync(0xffffffffu, p, g0 + j);
            if (g0 + j >= nk) continue;
#pragma unroll
            for (int i = 0; i < NP; i++) {
                const uint32_t pr = lane + 32 * i;
                if (2 * pr < a.hd) {
                    const uint32_t w = vv[j][i];
                    st.acc[2 * i] = fmaf(pj, __uint_as_float(w << 16), st.acc[2 * i]);
                    st.acc[2 * i + 1] = fmaf(pj, __uint_as_float(w & 0xFFFF0000u), st.acc[2 * i + 1]);
                }
            }
        }
    }
}

// out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M) over the splits' partials of (entry i of the
// split kernel's list, token t, head h), which other CTAs wrote: read through L2 (__ldcg). Warp 0
// takes one split a lane (at most 32); every partial load of an output element is independent of the
// others.
__device__ void merge_splits(const AttnArgs &a, uint32_t i, uint32_t t, uint32_t h, uint32_t used)
{
    __shared__ float sf[32], sl;
    const uint32_t hd = a.hd, row = hd + 2;
    const float *pp = a.part + ((size_t)i * a.heads + h) * a.splits * row;
    if (threadIdx.x < 32) {
        const uint32_t sp = threadIdx.x;
        const float m = sp < used ? __ldcg(pp + sp * row) : -INFINITY;
        const float l = sp < used ? __ldcg(pp + sp * row + 1) : 0.0f;
        const float M = warp_max(m), e = m == -INFINITY ? 0.0f : expf(m - M);
        const float L = warp_sum(l * e);
        sf[sp] = e;
        if (sp == 0) sl = L;
    }
    __syncthreads();
    for (uint32_t d = threadIdx.x; d < hd; d += blockDim.x) {
        float v = 0;
#pragma unroll 4
        for (uint32_t sp = 0; sp < used; sp++)
            if (sf[sp] != 0.0f) v += __ldcg(pp + sp * row + 2 + d) * sf[sp];
        a.out[((size_t)t * a.heads + h) * hd + d] = f2bf(v / sl);
    }
}

// ROPE (decode-only batches, AttnArgs::rope): the decode step's qk norm + rope + cache store happen
// here, one kernel boundary fewer: warp 0 rotates this CTA's q head into qs, and in the split that
// holds the new position (the last non-empty one) warp 1 rotates the kv head's k and stores it and v
// into the cache slot before any warp reads it (the CTAs of the q heads that share the kv head each
// store the same bits). head_in's loads come before the grid-dependency wait, as in qkv_rope_store.
// blockIdx.x is the entry of the split kernel's token list b.dtok (part and tickets are indexed by
// it); the token's sequence and position come from the batch tables.
template <int NP, bool ROPE>
__global__ void __launch_bounds__(kWarps * 32) attn_kernel(AttnArgs a, Batch b)
{
    __shared__ float qs[kMaxHd];
    __shared__ float wm[kWarps], wl[kWarps], wacc[kWarps][kMaxHd];
    const uint32_t di = blockIdx.x, h = blockIdx.y, split = blockIdx.z, hd = a.hd;
    const uint32_t t = (uint32_t)b.dtok[di];
    const int seq = b.seq[t];
    const uint32_t kvh = h / (a.heads / a.kv_heads);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    // the tables are written before the forward's first kernel; the cache rows of the warp's first
    // block start on their way into L2 while the predecessor (which writes only the new positions) runs
    const int n_keys = b.pos[t] + 1;
    const int used = min((int)a.splits, (n_keys + kSplitKeys - 1) / kSplitKeys);
    if ((int)split >= used) return; // reads and writes nothing: a no-op for the grid-dependency chain
    const int per = (n_keys + used - 1) / used;
    const int kb = (int)split * per, ke = min(n_keys, kb + per);
    if (kb + 32 * warp + lane < ke) {
        const size_t row = (size_t)kv_slot(b, seq, kb + 32 * warp + lane) * a.kv_heads * hd + kvh * hd;
        for (uint32_t b = 0; b < hd * 2; b += 128) {
            prefetch_line(reinterpret_cast<const uint8_t *>(a.kc + row) + b, false);
            prefetch_line(reinterpret_cast<const uint8_t *>(a.vc + row) + b, false);
        }
    }
    const int pos = n_keys - 1;
    const bool owner = ROPE && (int)split == pos / per; // the split whose keys include the new one
    const bool rot = ROPE && (warp == 0 || (warp == 1 && owner));
    HeadIn hin;
    if (rot) head_in(a.qk, warp == 0 ? h : a.heads + kvh, pos, hin);
    pdl_wait();
    if (!ROPE) {
        const float *q = a.q + (size_t)t * a.q_stride + h * hd;
        for (uint32_t i = threadIdx.x; i < hd; i += blockDim.x) qs[i] = q[i];
    } else if (rot) {
        const float *row = a.qk.qkv + (size_t)t * a.qk.stride;
        HeadOut o;
        head_rotate(a.qk, row, warp == 0 ? h : a.heads + kvh, hin, o);
        if (warp == 1) store_kv(a.qk, row, kvh, kv_slot(b, seq, pos), o);
        else head_write(a.qk, o, qs);
    }
    __syncthreads(); // qs, and the new cache row for the owner's warps
    Online<NP> st;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int k0 = kb + 32 * warp; k0 < ke; k0 += 32 * kWarps) key_block<NP>(a, b, seq, qs, kvh, k0, ke, scale, st);
    if (lane == 0) wm[warp] = st.m, wl[warp] = st.l;
#pragma unroll
    for (int i = 0; i < NP; i++) {
        const uint32_t pr = lane + 32 * i;
        if (2 * pr < hd) wacc[warp][2 * pr] = st.acc[2 * i], wacc[warp][2 * pr + 1] = st.acc[2 * i + 1];
    }
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < kWarps; w++) M = fmaxf(M, wm[w]);
    float L = 0, f[kWarps];
    for (int w = 0; w < kWarps; w++) f[w] = M == -INFINITY ? 0.0f : expf(wm[w] - M), L += wl[w] * f[w];
    if (used == 1) {
        for (uint32_t d = threadIdx.x; d < hd; d += blockDim.x) {
            float v = 0;
            for (int w = 0; w < kWarps; w++) v += wacc[w][d] * f[w];
            a.out[((size_t)t * a.heads + h) * hd + d] = f2bf(v / L);
        }
        return;
    }
    float *pp = a.part + (((size_t)di * a.heads + h) * a.splits + split) * (hd + 2);
    if (threadIdx.x == 0) pp[0] = M, pp[1] = L;
    for (uint32_t d = threadIdx.x; d < hd; d += blockDim.x) {
        float v = 0;
        for (int w = 0; w < kWarps; w++) v += wacc[w][d] * f[w];
        pp[2 + d] = v;
    }
    // The last of the (token, head)'s splits to finish merges them (a merge kernel would add a
    // launch to the decode step's chain): every writer fences, then one ticket per CTA.
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned *ticket = a.ticket + (size_t)di * a.heads + h;
        last = atomicAdd(ticket, 1u) == (unsigned)used - 1;
        if (last) atomicExch(ticket, 0u); // every split has taken its ticket: ready for the next launch
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    merge_splits(a, di, t, h, (uint32_t)used);
}

// ---- decode, grouped: one CTA per (token, kv head, split) -------------------------------------------
// The split kernel above gives each q head its own CTA, so the G q heads of a kv group each read the
// group's K and V: G times the bytes through L2 and G times the latency-bound key loops (batched
// decode ran at ~150 GB/s of unique K/V bytes, docs/perf/kv_page_tokens.md). Here one CTA takes the
// G heads: a lane's K row serves G dot products, a V pair G accumulators. Per head the arithmetic is
// attn_kernel's, in the same order (scores, online update, V accumulation, warp combine, merge), so
// with the same split count the output is the same bits. Not fused with rope (q must be rotated and
// the new keys stored: qkv_rope_store first). hd <= 128 (NP <= 2).
//
// A warp's 32-key block reaches shared memory through cp.async, K and V rows together, all of the
// block in flight at once: one memory round trip a block. Loaded into registers (the first form),
// the block cost a round trip for K and then one for each group of V rows that fit the registers
// beside the G accumulators (four at G = 8), after a page-table round trip: ncu put the N = 8 decode
// step's attention at 38 us a layer for 9 MB of K/V (~250 GB/s; docs/perf/batch.md).

// A warp's staging: K then V rows of its block, [32][hd + 8] bf16 each (the 16-byte pad puts the
// rows a quarter-warp reads, a row a lane, on distinct 16-byte bank groups).
__host__ __device__ constexpr uint32_t kv_row_elems(uint32_t hd) { return hd + 8; }
__host__ __device__ constexpr size_t gqa_stage_bytes(uint32_t hd) { return 2 * 32 * (size_t)kv_row_elems(hd) * 2; }

// Copies the K and V rows of keys k0 .. k0 + nk - 1 into the warp's staging (rows past nk zero-filled);
// slot is this lane's key's pool slot (lane < nk). Lanes take 16-byte chunks in row order, so each
// copy instruction covers whole rows (two of 256 bytes at hd = 128).
__device__ void stage_kv(const AttnArgs &a, uint32_t kvh, uint32_t slot, int nk, uint16_t *st)
{
    const int lane = threadIdx.x % 32;
    const uint32_t chunks = a.hd / 8, kvd = a.kv_heads * a.hd, re = kv_row_elems(a.hd);
    for (uint32_t i = lane; i < 32 * chunks; i += 32) {
        const uint32_t r = i / chunks, c = i % chunks;
        const uint32_t rs = __shfl_sync(0xffffffffu, slot, (int)r < nk ? r : 0);
        const size_t off = (size_t)rs * kvd + kvh * a.hd + 8 * c;
        const int bytes = (int)r < nk ? 16 : 0;
        cp_async16(smem_u32(st + r * re + 8 * c), a.kc + off, bytes);
        cp_async16(smem_u32(st + (32 + r) * re + 8 * c), a.vc + off, bytes);
    }
    cp_async_commit();
}

// Scores of the staged keys k0 + lane (< k1) against the G heads' q (smem f32), then the state
// update with their values.
template <int NP, int G>
__device__ void key_block_g(const AttnArgs &a, const uint16_t *st, const float (*qs)[128], int k0, int k1, float scale,
                            float (&m)[G], float (&l)[G], float (&acc)[G][2 * NP])
{
    const int lane = threadIdx.x % 32;
    const uint32_t chunks = a.hd / 8, re = kv_row_elems(a.hd);
    const bool live = k0 + lane < k1;
    const int nk = min(32, k1 - k0);
    const uint4 *kr = reinterpret_cast<const uint4 *>(st + lane * re);
    float d[G];
#pragma unroll
    for (int g = 0; g < G; g++) d[g] = 0;
#pragma unroll
    for (uint32_t c = 0; c < 8 * NP; c++) {
        if (c >= chunks) break;
        const uint4 kc = kr[c];
        const uint32_t w[4] = {kc.x, kc.y, kc.z, kc.w};
#pragma unroll
        for (int g = 0; g < G; g++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                d[g] = fmaf(__uint_as_float(w[i] << 16), qs[g][8 * c + 2 * i], d[g]);
                d[g] = fmaf(__uint_as_float(w[i] & 0xFFFF0000u), qs[g][8 * c + 2 * i + 1], d[g]);
            }
    }
    float p[G];
#pragma unroll
    for (int g = 0; g < G; g++) {
        const float sc = live ? d[g] * scale : -INFINITY;
        const float mb = warp_max(sc);
        const float mn = fmaxf(m[g], mb);
        const float corr = expf(m[g] - mn);
        p[g] = live ? expf(sc - mn) : 0.0f;
        l[g] = l[g] * corr + warp_sum(p[g]);
        m[g] = mn;
#pragma unroll
        for (int i = 0; i < 2 * NP; i++) acc[g][i] *= corr;
    }
    const uint32_t *vr = reinterpret_cast<const uint32_t *>(st + 32 * re);
#pragma unroll 4
    for (int j = 0; j < 32; j++) {
        float pj[G];
#pragma unroll
        for (int g = 0; g < G; g++) pj[g] = __shfl_sync(0xffffffffu, p[g], j);
        if (j >= nk) break;
#pragma unroll
        for (int i = 0; i < NP; i++) {
            const uint32_t pr = lane + 32 * i;
            if (2 * pr < a.hd) {
                const uint32_t w = vr[j * (re / 2) + pr];
                const float v0 = __uint_as_float(w << 16), v1 = __uint_as_float(w & 0xFFFF0000u);
#pragma unroll
                for (int g = 0; g < G; g++) {
                    acc[g][2 * i] = fmaf(pj[g], v0, acc[g][2 * i]);
                    acc[g][2 * i + 1] = fmaf(pj[g], v1, acc[g][2 * i + 1]);
                }
            }
        }
    }
}

// Dynamic shared memory: kWarps stagings (gqa_stage_bytes), reused after the key loop for the warps'
// accumulators wacc[kWarps][G][hd] (f32; 16 KB at G = 8, hd = 128: inside the first staging).
template <int NP, int G>
__global__ void __launch_bounds__(kWarps * 32) attn_gqa_kernel(AttnArgs a, Batch b)
{
    extern __shared__ __align__(16) uint8_t dsm[];
    __shared__ float qs[G][128];
    __shared__ float wm[kWarps][G], wl[kWarps][G];
    const uint32_t di = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z, hd = a.hd;
    const uint32_t t = (uint32_t)b.dtok[di];
    const int seq = b.seq[t];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int n_keys = b.pos[t] + 1;
    const int used = min((int)a.splits, (n_keys + kSplitKeys - 1) / kSplitKeys);
    if ((int)split >= used) return;
    const int per = (n_keys + used - 1) / used;
    const int kb = (int)split * per, ke = min(n_keys, kb + per);
    uint16_t *st = reinterpret_cast<uint16_t *>(dsm + warp * gqa_stage_bytes(hd));
    // the page table is written before the forward: the first block's slots and an L2 prefetch of
    // its rows go out while the predecessor (which stores the new keys) still runs
    int k0 = kb + 32 * warp;
    uint32_t slot = k0 + lane < ke ? kv_slot(b, seq, k0 + lane) : 0;
    if (k0 + lane < ke) {
        const size_t row = (size_t)slot * a.kv_heads * hd + kvh * hd;
        for (uint32_t o = 0; o < hd * 2; o += 128) {
            prefetch_line(reinterpret_cast<const uint8_t *>(a.kc + row) + o, false);
            prefetch_line(reinterpret_cast<const uint8_t *>(a.vc + row) + o, false);
        }
    }
    pdl_wait();
    if (k0 < ke) stage_kv(a, kvh, slot, min(32, ke - k0), st);
    for (uint32_t i = threadIdx.x; i < G * hd; i += blockDim.x)
        qs[i / hd][i % hd] = a.q[(size_t)t * a.q_stride + (kvh * G + i / hd) * hd + i % hd];
    __syncthreads();
    float m[G], l[G], acc[G][2 * NP];
#pragma unroll
    for (int g = 0; g < G; g++) {
        m[g] = -INFINITY, l[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < 2 * NP; i++) acc[g][i] = 0.0f;
    }
    const float scale = 1.0f / sqrtf((float)hd);
    for (; k0 < ke; k0 += 32 * kWarps) {
        const int k1 = k0 + 32 * kWarps; // the warp's next block: its slots load during this one's math
        slot = k1 + lane < ke ? kv_slot(b, seq, k1 + lane) : 0;
        cp_async_wait_all();
        __syncwarp();
        key_block_g<NP, G>(a, st, qs, k0, ke, scale, m, l, acc);
        if (k1 < ke) {
            __syncwarp(); // every lane is done with the staging before the next block lands in it
            stage_kv(a, kvh, slot, min(32, ke - k1), st);
        }
    }
    __syncthreads(); // every warp is done with its staging: wacc takes the first one's place
    float *wacc = reinterpret_cast<float *>(dsm); // [kWarps][G][hd]
#pragma unroll
    for (int g = 0; g < G; g++) {
        if (lane == 0) wm[warp][g] = m[g], wl[warp][g] = l[g];
        float *wa = wacc + ((size_t)warp * G + g) * hd;
#pragma unroll
        for (int i = 0; i < NP; i++) {
            const uint32_t pr = lane + 32 * i;
            if (2 * pr < hd) wa[2 * pr] = acc[g][2 * i], wa[2 * pr + 1] = acc[g][2 * i + 1];
        }
    }
    __syncthreads();
    for (int g = 0; g < G; g++) {
        const uint32_t h = kvh * G + g;
        float M = -INFINITY;
        for (int w = 0; w < kWarps; w++) M = fmaxf(M, wm[w][g]);
        float L = 0, f[kWarps];
        for (int w = 0; w < kWarps; w++) f[w] = M == -INFINITY ? 0.0f : expf(wm[w][g] - M), L += wl[w][g] * f[w];
        float *out = used == 1 ? nullptr : a.part + (((size_t)di * a.heads + h) * a.splits + split) * (hd + 2);
        if (out && threadIdx.x == 0) out[0] = M, out[1] = L;
        for (uint32_t dd = threadIdx.x; dd < hd; dd += blockDim.x) {
            float v = 0;
            for (int w = 0; w < kWarps; w++) v += wacc[((size_t)w * G + g) * hd + dd] * f[w];
            if (out) out[2 + dd] = v;
            else a.out[((size_t)t * a.heads + h) * hd + dd] = f2bf(v / L);
        }
    }
    if (used == 1) return;
    // the last split CTA of (token, kv head) merges its G heads (the ticket of the group's first head)
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned *ticket = a.ticket + (size_t)di * a.heads + kvh * G;
        last = atomicAdd(ticket, 1u) == (unsigned)used - 1;
        if (last) atomicExch(ticket, 0u);
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int g = 0; g < G; g++) {
        if (g) __syncthreads(); // merge_splits' shared factors are rewritten by the next head
        merge_splits(a, di, t, kvh * G + g, (uint32_t)used);
    }
}

// ---- prefill: a tile of query tokens per CTA -------------------------------------------------------
// One CTA per (tile of kTileQ consecutive tokens, q head): the key/value blocks are staged in shared
// memory once for the whole tile (kTileQ times less cache traffic than a CTA per token); each warp
// owns kQPerWarp queries, a lane a key for the scores (its K row read from shared memory once for
// all the warp's queries) and a pair of dimensions for the values.
constexpr int kQPerWarp = 4, kTileQ = kWarps * kQPerWarp, kKeyBlock = 32;

// Shared layout: q [kTileQ][hd] f32, then K and V [kKeyBlock][hd + 8] bf16 (the 16-byte pad puts the
// rows a quarter-warp reads with 16-byte loads on distinct banks).
size_t prefill_smem(uint32_t hd) { return (size_t)kTileQ * hd * 4 + 2 * (size_t)kKeyBlock * (hd + 8) * 2; }

// The tile (b.tiles[blockIdx.x]): `rows` consecutive tokens from batch index t0 of sequence seq, at
// positions pos0 .. pos0 + rows - 1.
template <int NP>
__global__ void __launch_bounds__(kWarps * 32) attn_prefill_kernel(AttnArgs a, Batch b)
{
    pdl_wait();
    extern __shared__ float smem[];
    const int4 tile = b.tiles[blockIdx.x];
    const uint32_t hd = a.hd, ks = hd + 8, t0 = (uint32_t)tile.x, rows = (uint32_t)tile.y, h = blockIdx.y;
    const int seq = tile.z, pos0 = tile.w;
    const uint32_t kvh = h / (a.heads / a.kv_heads), kvd = a.kv_heads * hd;
    float *qs = smem;
    uint16_t *Ks = reinterpret_cast<uint16_t *>(qs + kTileQ * hd), *Vs = Ks + kKeyBlock * ks;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (uint32_t i = threadIdx.x; i < kTileQ * hd; i += blockDim.x) {
        const uint32_t r = i / hd;
        qs[i] = r < rows ? a.q[(size_t)(t0 + r) * a.q_stride + h * hd + i % hd] : 0.0f;
    }
    const int n_tile_keys = pos0 + (int)rows; // keys the tile's last query sees
    const int qlast = pos0 + warp * kQPerWarp + kQPerWarp - 1; // this warp's last query position
    const float scale = 1.0f / sqrtf((float)hd);
    float m[kQPerWarp], l[kQPerWarp], acc[kQPerWarp][2 * NP];
#pragma unroll
    for (int i = 0; i < kQPerWarp; i++) {
        m[i] = -INFINITY, l[i] = 0.0f;
#pragma unroll
        for (int j = 0; j < 2 * NP; j++) acc[i][j] = 0.0f;
    }
    for (int kb = 0; kb < n_tile_keys; kb += kKeyBlock) {
        __syncthreads(); // the previous block's readers are done (and q is staged, the first time)
        const uint32_t vecs = hd / 8;
        for (uint32_t i = threadIdx.x; i < kKeyBlock * vecs; i += blockDim.x) {
            const uint32_t r = i / vecs, c = i % vecs;
            uint4 kv = {0, 0, 0, 0}, vv = {0, 0, 0, 0};
            if (kb + (int)r < n_tile_keys) {
                const size_t at = (size_t)kv_slot(b, seq, kb + (int)r) * kvd + kvh * hd + c * 8;
                kv = *reinterpret_cast<const uint4 *>(a.kc + at);
                vv = *reinterpret_cast<const uint4 *>(a.vc + at);
            }
            *reinterpret_cast<uint4 *>(Ks + r * ks + c * 8) = kv;
            *reinterpret_cast<uint4 *>(Vs + r * ks + c * 8) = vv;
        }
        __syncthreads();
        if (kb > qlast) continue; // every query of this warp is before the block (causal)
        const int key = kb + lane;
        float sc[kQPerWarp] = {};
        for (uint32_t c = 0; c < vecs; c++) {
            const uint4 v = *reinterpret_cast<const uint4 *>(Ks + lane * ks + c * 8);
            const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int i = 0; i < kQPerWarp; i++) {
                const float *q = qs + (warp * kQPerWarp + i) * hd + c * 8;
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    sc[i] = fmaf(__uint_as_float(w[e] << 16), q[2 * e], sc[i]);
                    sc[i] = fmaf(__uint_as_float(w[e] & 0xFFFF0000u), q[2 * e + 1], sc[i]);
                }
            }
        }
        float p[kQPerWarp];
#pragma unroll
        for (int i = 0; i < kQPerWarp; i++) {
            const int qpos = pos0 + warp * kQPerWarp + i;
            const bool ok = key <= qpos && key < n_tile_keys;
            const float s = ok ? sc[i] * scale : -INFINITY;
            const float mn = fmaxf(m[i], warp_max(s));
            const float corr = mn == -INFINITY ? 1.0f : expf(m[i] - mn);
            p[i] = ok ? expf(s - mn) : 0.0f;
            l[i] = l[i] * corr + warp_sum(p[i]);
            m[i] = mn;
#pragma unroll
            for (int j = 0; j < 2 * NP; j++) acc[i][j] *= corr;
        }
        const int nk = min(kKeyBlock, n_tile_keys - kb);
        for (int j = 0; j < nk; j++) {
            float pj[kQPerWarp];
#pragma unroll
            for (int i = 0; i < kQPerWarp; i++) pj[i] = __shfl_sync(0xffffffffu, p[i], j);
            const uint32_t *vr = reinterpret_cast<const uint32_t *>(Vs + j * ks);
#pragma unroll
            for (int u = 0; u < NP; u++) {
                const uint32_t pr = lane + 32 * u;
                if (2 * pr >= hd) break;
                const uint32_t w = vr[pr];
                const float v0 = __uint_as_float(w << 16), v1 = __uint_as_float(w & 0xFFFF0000u);
#pragma unroll
                for (int i = 0; i < kQPerWarp; i++) {
                    acc[i][2 * u] = fmaf(pj[i], v0, acc[i][2 * u]);
                    acc[i][2 * u + 1] = fmaf(pj[i], v1, acc[i][2 * u + 1]);
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < kQPerWarp; i++) {
        const uint32_t r = warp * kQPerWarp + i;
        if (r >= rows) break;
        uint16_t *o = a.out + ((size_t)(t0 + r) * a.heads + h) * hd;
#pragma unroll
        for (int u = 0; u < NP; u++) {
            const uint32_t pr = lane + 32 * u;
            if (2 * pr < hd) o[2 * pr] = f2bf(acc[i][2 * u] / l[i]), o[2 * pr + 1] = f2bf(acc[i][2 * u + 1] / l[i]);
        }
    }
}

template <int NP>
cudaError_t launch_prefill(const AttnArgs &a, const Batch &b, uint32_t n_tiles, cudaStream_t s)
{
    const size_t smem = prefill_smem(a.hd);
    cudaError_t e = cudaFuncSetAttribute(attn_prefill_kernel<NP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    return launch_pdl(attn_prefill_kernel<NP>, dim3(n_tiles, a.heads), dim3(kWarps * 32), smem, true, s, a, b);
}

// ---- prefill on the tensor cores: head dims 64 and 128 ---------------------------------------------
// The shapes and fragment layouts are in attn_mma.cuh. Numerics against attn_prefill_kernel (f32
// q, p and accumulation; K, V bf16 in both):
//   * Q is rounded to bf16 once (unit roundoff u = 2^-9): each score q.k moves by at most
//     u sum_i |q_i k_i| / sqrt(hd), a relative perturbation of the q vector by <= u in L2, the same
//     kind as the bf16 rounding of the attention input that the engine already does.
//   * P is rounded to bf16 and l sums the ROUNDED values, so the output is exactly (up to f32
//     accumulation, ~1e-6) the weighted mean of V under weights bf16(p_j) / sum bf16(p_j), i.e. the
//     softmax of scores each moved by |log(1 + d_j)| <= 1.002 u (natural-log units). Per element,
//     |o - o_exact| <= sum_j |w~_j - w_j| |v_j| <= 2.01 u max_j |v_j|, and for weights spread over
//     many keys the independent d_j make it about u |o|.
//   * S and O accumulate bf16 x bf16 products (exact) in f32 on the tensor cores; exp2 replaces exp
//     with the log2(e) folded into the f32 score scale (arguments off by ~1e-7 relative).
// So this kernel adds two bf16 rounding sites per layer to those tests/cuda/test_engine_cuda.c
// counts (its header has the count with them); the old kernel had none beyond the bf16 output.
// One staged key block (K at kb, V at vb: shared-space byte addresses) into a warp's 16 rows.
template <int HD, bool MASK>
__device__ __forceinline__ void mma_key_block(uint32_t kb_addr, uint32_t vb_addr, const uint32_t (&qf)[HD / 16][4],
                                              float (&o)[HD / 8][4], fa::RowState &st, int lane, int kb,
                                              const int (&lim)[2], float sl2)
{
    float s[fa::kNT][4] = {};
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
#pragma unroll
        for (int np = 0; np < fa::kNT / 2; np++) {
            uint32_t b[4];
            ldsm_x4(kb_addr + 2 * fa::k_ldsm<HD>(lane, np, kk), b);
            mma_bf16_16816(s[2 * np], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], b[0], b[1]);
            mma_bf16_16816(s[2 * np + 1], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], b[2], b[3]);
        }
    fa::scale_mask<MASK>(s, lane, kb, lim, sl2);
    float mx[2];
    fa::row_max(s, mx);
#pragma unroll
    for (int r = 0; r < 2; r++) { // a row's 4 lanes are one quad
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    }
    uint32_t pa[fa::kKK][4];
    fa::online_update(s, mx, st, o, pa);
#pragma unroll
    for (int kk = 0; kk < fa::kKK; kk++)
#pragma unroll
        for (int dp = 0; dp < HD / 16; dp++) {
            uint32_t b[4];
            ldsm_x4_trans(vb_addr + 2 * fa::v_ldsm<HD>(lane, kk, dp), b);
            mma_bf16_16816(o[2 * dp], pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3], b[0], b[1]);
            mma_bf16_16816(o[2 * dp + 1], pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3], b[2], b[3]);
        }
}

// Grid (heads, tiles of b.tiles: at most fa::kRows tokens of one sequence each, listed by the host
// most keys first); q heads sharing a kv head are neighbours in x, so their K/V blocks are read from
// L2 after the first. The tile's rows are tokens t0 .. t0 + rows - 1 of the batch at positions
// pos0 .. of sequence seq; its keys run to the tile's last row (n_keys = pos0 + rows): the same bits
// as the chunk alone when the tiles start where the chunk's own tiles would.
template <int HD>
__global__ void __launch_bounds__(fa::kWarps * 32, 2) attn_mma_kernel(AttnArgs a, Batch b)
{
    using S = fa::Shape<HD>;
    extern __shared__ uint4 kv_smem[];
    pdl_wait();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const uint32_t h = blockIdx.x, kvh = h / (a.heads / a.kv_heads), kv_row = a.kv_heads * HD;
    const int4 tile = b.tiles[blockIdx.y];
    const int t0 = tile.x, rows = tile.y, seq = tile.z, pos0 = tile.w, rw = 16 * warp; // the warp's first row
    const int n_keys = pos0 + rows, n_tile_keys = n_keys; // keys the tile's last query sees
    const int n_blocks = (n_tile_keys + fa::kKeys - 1) / fa::kKeys;
    const uint16_t *kg = a.kc + kvh * HD, *vg = a.vc + kvh * HD;
    uint16_t *Ks = reinterpret_cast<uint16_t *>(kv_smem), *Vs = Ks + 2 * S::kBlock;

    auto stage = [&](int blk) { // block blk into stage blk % 2, one cp.async group
        const int kb = blk * fa::kKeys, off = (blk & 1) * S::kBlock;
        for (int i = threadIdx.x; i < S::kChunks; i += blockDim.x) {
            const fa::Piece p = fa::piece<HD>(i, kb, n_tile_keys, kv_row);
            // the piece's row through the page table (p.global is its offset in a contiguous cache)
            const size_t g = p.ok ? (size_t)kv_slot(b, seq, kb + i / (HD / 8)) * kv_row + 8 * (i % (HD / 8)) : 0;
            cp_async16(smem_u32(Ks + off + p.smem), kg + g, p.ok ? 16 : 0);
            cp_async16(smem_u32(Vs + off + p.smem), vg + g, p.ok ? 16 : 0);
        }
        cp_async_commit();
    };
    stage(0);

    // Q's A fragments (bf16) for the warp's 16 rows, while block 0 lands; rows past the tile are zero.
    const bool live = rw < rows;
    uint32_t qf[HD / 16][4];
    const float *qh = a.q + (size_t)t0 * a.q_stride + (size_t)h * HD;
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = rw + fa::a_row(lane, i);
            float2 v = make_float2(0.0f, 0.0f);
            if (r < rows) v = *reinterpret_cast<const float2 *>(qh + (size_t)r * a.q_stride + 16 * kk + fa::a_col(lane, i));
            qf[kk][i] = bf16x2_bits(__floats2bfloat162_rn(v.x, v.y));
        }
    const int q_first = pos0 + rw, q_last = min(q_first + 15, n_keys - 1);
    const int lim[2] = {fa::row_limit(lane, 0, q_first, n_keys), fa::row_limit(lane, 1, q_first, n_keys)};
    const float sl2 = fa::score_scale_log2(HD);
    float o[HD / 8][4] = {};
    fa::RowState st = {{-INFINITY, -INFINITY}, {0.0f, 0.0f}};

    for (int j = 0; j < n_blocks; j++) {
        if (j + 1 < n_blocks) {
            stage(j + 1);
            cp_async_wait<1>(); // block j has landed (this thread's pieces)
        } else {
            cp_async_wait<0>();
        }
        __syncthreads(); // ... and every thread's
        const int kb = j * fa::kKeys;
        const fa::BlockKind kind = live ? fa::block_kind(kb, q_first, q_last) : fa::kSkip;
        const uint32_t kb_addr = smem_u32(Ks + (j & 1) * S::kBlock), vb_addr = smem_u32(Vs + (j & 1) * S::kBlock);
        if (kind == fa::kFull) mma_key_block<HD, false>(kb_addr, vb_addr, qf, o, st, lane, kb, lim, sl2);
        else if (kind == fa::kMasked) mma_key_block<HD, true>(kb_addr, vb_addr, qf, o, st, lane, kb, lim, sl2);
        __syncthreads(); // stage j % 2 is free for block j + 2
    }
    if (!live) return;

#pragma unroll
    for (int r = 0; r < 2; r++) {
        st.l[r] += __shfl_xor_sync(0xffffffffu, st.l[r], 1);
        st.l[r] += __shfl_xor_sync(0xffffffffu, st.l[r], 2);
    }
    const float inv[2] = {1.0f / st.l[0], 1.0f / st.l[1]};
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = rw + fa::acc_row(lane, 2 * r);
        if (row >= rows) continue;
        uint16_t *orow = a.out + ((size_t)(t0 + row) * a.heads + h) * HD + fa::acc_col(lane, 2 * r);
#pragma unroll
        for (int d = 0; d < HD / 8; d++)
            *reinterpret_cast<uint32_t *>(orow + 8 * d) =
                bf16x2_bits(__floats2bfloat162_rn(o[d][2 * r] * inv[r], o[d][2 * r + 1] * inv[r]));
    }
}

template <int HD>
cudaError_t launch_mma(const AttnArgs &a, const Batch &b, uint32_t n_tiles, cudaStream_t s)
{
    constexpr size_t smem = fa::Shape<HD>::kSmemBytes;
    cudaError_t e = cudaFuncSetAttribute(attn_mma_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    return launch_pdl(attn_mma_kernel<HD>, dim3(a.heads, n_tiles), dim3(fa::kWarps * 32), smem, true, s, a, b);
}

// The tensor-core kernel reads q as float2 pairs: an even stride keeps them 8-byte aligned.
bool mma_shape(uint32_t hd, uint32_t q_stride) { return q_stride % 2 == 0 && (hd == 128 || hd == 64); }

} // namespace

uint32_t attention_splits(uint32_t T, uint32_t ctx, uint32_t heads)
{
    // Enough CTAs to cover the GPU twice at decode sizes; each split keeps >= kSplitKeys keys at full
    // context (and at any shorter one, attn_kernel).
    const uint32_t want = (264 + T * heads - 1) / (T * heads), most = (ctx + kSplitKeys - 1) / kSplitKeys;
    uint32_t s = want < most ? want : most;
    if (s > 32) s = 32;
    return s ? s : 1;
}

bool attention_gqa_ok(uint32_t hd, uint32_t heads, uint32_t kv_heads)
{
    const uint32_t G = kv_heads && heads % kv_heads == 0 ? heads / kv_heads : 0;
    return hd <= 128 && (G == 1 || G == 2 || G == 4 || G == 8);
}

uint32_t attention_tile_rows(uint32_t hd, uint32_t q_stride) { return mma_shape(hd, q_stride) ? fa::kRows : kTileQ; }

cudaError_t attention(const AttnArgs &a, const Batch &b, uint32_t n_dec, uint32_t n_tiles, cudaStream_t s)
{
    if (!a.hd || a.hd % 8 || a.hd > kMaxHd || !a.kv_heads || a.heads % a.kv_heads || !a.splits || a.splits > 32 ||
        (a.splits > 1 && (!a.part || !a.ticket)) ||
        (a.rope && (n_tiles || a.qk.hd != a.hd || a.qk.heads != a.heads || a.qk.kv_heads != a.kv_heads)))
        return cudaErrorInvalidValue;
    const int np = (int)((a.hd + 63) / 64);
    cudaError_t e = cudaSuccess;
    if (n_tiles) { // prefill chunks: a tile of queries shares each key block
        if (mma_shape(a.hd, a.q_stride)) e = a.hd == 128 ? launch_mma<128>(a, b, n_tiles, s) : launch_mma<64>(a, b, n_tiles, s);
        else switch (np) {
            case 1: e = launch_prefill<1>(a, b, n_tiles, s); break;
            case 2: e = launch_prefill<2>(a, b, n_tiles, s); break;
            case 3: e = launch_prefill<3>(a, b, n_tiles, s); break;
            default: e = launch_prefill<4>(a, b, n_tiles, s); break;
            }
    }
    if (e != cudaSuccess || !n_dec) return e;
    if (a.gqa) {
        const uint32_t G = a.heads / a.kv_heads;
        if (a.rope || !attention_gqa_ok(a.hd, a.heads, a.kv_heads)) return cudaErrorInvalidValue;
        void (*const kg[2][4])(AttnArgs, Batch) = {
            {attn_gqa_kernel<1, 1>, attn_gqa_kernel<1, 2>, attn_gqa_kernel<1, 4>, attn_gqa_kernel<1, 8>},
            {attn_gqa_kernel<2, 1>, attn_gqa_kernel<2, 2>, attn_gqa_kernel<2, 4>, attn_gqa_kernel<2, 8>}};
        const int gi = G == 1 ? 0 : G == 2 ? 1 : G == 4 ? 2 : 3;
        const size_t smem = kWarps * gqa_stage_bytes(a.hd);
        e = cudaFuncSetAttribute(kg[np - 1][gi], cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
        return launch_pdl(kg[np - 1][gi], dim3(n_dec, a.kv_heads, a.splits), dim3(kWarps * 32), smem, true, s, a, b);
    }
    void (*const k[2][4])(AttnArgs, Batch) = {
        {attn_kernel<1, false>, attn_kernel<2, false>, attn_kernel<3, false>, attn_kernel<4, false>},
        {attn_kernel<1, true>, attn_kernel<2, true>, attn_kernel<3, true>, attn_kernel<4, true>}};
    return launch_pdl(k[a.rope][np - 1], dim3(n_dec, a.heads, a.splits), dim3(kWarps * 32), 0, true, s, a, b);
}

} // namespace dec
} // namespace nf

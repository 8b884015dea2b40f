// Hopper's warpgroup MMA (wgmma, sm_90a only) and the shared-memory barriers that feed it: one
// definition of each instruction the warp-specialised prefill GEMM (prefill_wg.cu) issues.
//
// Operand tiles are bf16, K-major (each row's K elements contiguous), in the 128-byte swizzle: a row
// holds 64 elements (128 bytes), 8 rows form a 1024-byte atom, and the 16-byte chunk c of row r of
// an atom sits at chunk c ^ (r % 8). The hardware applies the XOR to address bits 4-6 from bits 7-9,
// so atoms must be 1024-byte aligned, and the k16 step inside a row is a plain +32 bytes on the
// descriptor's start address.
#pragma once
#include <stdint.h>

#include "ptx.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define NF_WGMMA 1 // this compilation pass targets sm_90a: wgmma exists
#endif

namespace nf {

// byte offset of element (r, k) in a [rows][64] K-major tile in the 128-byte swizzle
__device__ __forceinline__ uint32_t sw128(int r, int k) { return r * 128 + ((((k >> 3) ^ r) & 7) << 4) + (k & 7) * 2; }

// The matrix descriptor of a K-major, 128-byte-swizzled tile at shared address `addr` (the start of
// its first row; 8-row atoms 1024 bytes apart): start >> 4 in bits 0-13, the leading byte offset
// (unused by swizzled K-major layouts: 1) in 16-29, the stride between atoms (1024 >> 4) in 32-45,
// the swizzle mode (1 = 128 bytes) in 62-63.
__device__ __forceinline__ uint64_t wg_desc(uint32_t addr)
{
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}

#ifdef NF_WGMMA
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

#define NF_WG_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
                    "+f"(d[i + 6]), "+f"(d[i + 7])

// d[64] += A (64 x 16, descriptor a) B^T (128 x 16, descriptor b) for one warpgroup: thread t of
// warp w holds rows 16 w + t / 4 (d[4j], d[4j + 1]) and + 8 (d[4j + 2], d[4j + 3]), columns
// 8 j + 2 (t % 4) and + 1: the mma.m16n8 accumulator layout repeated over 16 column blocks.
__device__ __forceinline__ void wg_mma_n128(float (&d)[64], uint64_t a, uint64_t b)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
                 "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, "
                 "%41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, "
                 "%61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : NF_WG_D8(0), NF_WG_D8(8), NF_WG_D8(16), NF_WG_D8(24), NF_WG_D8(32), NF_WG_D8(40), NF_WG_D8(48),
                   NF_WG_D8(56)
                 : "l"(a), "l"(b), "r"(1));
}
// The same with B 64 x 16: d[32], column blocks j = 0..7.
__device__ __forceinline__ void wg_mma_n64(float (&d)[32], uint64_t a, uint64_t b)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
                 "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : NF_WG_D8(0), NF_WG_D8(8), NF_WG_D8(16), NF_WG_D8(24)
                 : "l"(a), "l"(b), "r"(1));
}
// The same with B 256 x 16: d[128], column blocks j = 0..31 (the 128 x 256 tile's consumer).
__device__ __forceinline__ void wg_mma_n256(float (&d)[128], uint64_t a, uint64_t b)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
                 "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, "
                 "%41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, "
                 "%61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, "
                 "%81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, "
                 "%100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, "
                 "%116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 0;\n}\n"
                 : NF_WG_D8(0), NF_WG_D8(8), NF_WG_D8(16), NF_WG_D8(24), NF_WG_D8(32), NF_WG_D8(40), NF_WG_D8(48),
                   NF_WG_D8(56), NF_WG_D8(64), NF_WG_D8(72), NF_WG_D8(80), NF_WG_D8(88), NF_WG_D8(96), NF_WG_D8(104),
                   NF_WG_D8(112), NF_WG_D8(120)
                 : "l"(a), "l"(b), "r"(1));
}
#undef NF_WG_D8

#endif

// ---- the bulk tensor copy (TMA; sm_90 and later) ------------------------------------------------
// A 2D box of the tensor map (global address in generic space: a __grid_constant__ kernel parameter)
// at coordinates (x: innermost, y) into shared memory at dst; its bytes complete_tx on bar.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void *tmap, int x, int y, uint64_t *bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
                 ::"r"(dst), "l"(tmap), "r"(x), "r"(y), "r"(smem_u32(bar))
                 : "memory");
}
// The same for a 3D box at (x, y, z).
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void *tmap, int x, int y, int z, uint64_t *bar)
{
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
                 ::"r"(dst), "l"(tmap), "r"(x), "r"(y), "r"(z), "r"(smem_u32(bar))
                 : "memory");
}

// ---- mbarriers (shared memory, CTA scope) --------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint64_t *bar, uint32_t count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *bar)
{
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(smem_u32(bar)) : "memory");
}
// Blocks until the phase of the given parity has completed.
__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity)
{
    asm volatile("{\n.reg .pred done;\n"
                 "WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra WAIT;\n}\n" ::"r"(smem_u32(bar)),
                 "r"(parity)
                 : "memory");
}
// The arrival of this thread on bar, which then also waits for `bytes` of bulk copies (bulk_g2s).
__device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, uint32_t bytes)
{
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(smem_u32(bar)),
                 "r"(bytes)
                 : "memory");
}
// Makes this thread's mbarrier initialisations visible to the async proxy (the bulk copies that
// complete transactions on them); a CTA barrier then publishes them to the other threads.
__device__ __forceinline__ void fence_mbar_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
// A bulk copy by the tensor memory accelerator of `bytes` (a multiple of 16; both addresses 16-byte
// aligned) from global to this CTA's shared memory, completing that many bytes of bar's transaction.
__device__ __forceinline__ void bulk_g2s(void *dst, const void *src, uint32_t bytes, uint64_t *bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
}
// Orders this thread's generic-proxy shared-memory writes (st.shared, completed cp.async) before
// later async-proxy reads (wgmma) that a barrier hands them to.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

} // namespace nf

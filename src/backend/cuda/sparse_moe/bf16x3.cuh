// An f32 value as three bf16 values hi + mid + lo: each the round to nearest of what the previous
// ones left, so each residual is exact in f32 and the third holds the last <= 8 significant bits.
// The sum is w exactly for 2^-110 <= |w| <= bf16's largest finite value; below 2^-110 the residuals
// fall under bf16's subnormal spacing (2^-133) and the error is at most 2^-134. (The tensor-core
// router takes f32 rows as these three planes: router_mma.cu; test_bf16x3 checks the claim.)
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

#include "dev_codecs.cuh"

namespace nf {

NF_HD void bf16x3(float w, uint16_t (&p)[3])
{
    NF_UNROLL
    for (int i = 0; i < 3; i++) {
        const __nv_bfloat16 b = __float2bfloat16_rn(w);
        p[i] = __bfloat16_as_ushort(b);
        w -= __bfloat162float(b);
    }
}

} // namespace nf

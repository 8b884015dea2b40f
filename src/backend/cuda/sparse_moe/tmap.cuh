// Tensor maps for the bulk tensor copy (TMA) of bf16 operands: the driver's encoder, fetched through
// the runtime's entry-point query so that the library needs no link to the driver library, and one
// helper for the row-major, swizzled boxes the kernels read (prefill_wg.cu, router_mma.cu).
#pragma once
#include <cuda.h> // CUtensorMap
#include <cuda_runtime.h>

namespace nf {

using EncodeTiled = CUresult (*)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                 const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// cuTensorMapEncodeTiled, or NULL where the driver lacks it.
inline EncodeTiled tensor_map_encoder()
{
    static const EncodeTiled f = [] {
        void *p = nullptr;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess) {
            cudaGetLastError();
            p = nullptr;
        }
        return (EncodeTiled)p;
    }();
    return f;
}

// A bf16 tensor of `rank` dimensions (dim[0] innermost, in elements; stride[i] the bytes between
// steps of dim[i + 1]) read in boxes of box[] elements, swizzled as the reader expects; elements past
// a dimension's extent arrive as zeros. false: no encoder, or the driver refused the map.
inline bool tmap_bf16(CUtensorMap *m, const void *base, cuuint32_t rank, const cuuint64_t *dim,
                      const cuuint64_t *stride, const cuuint32_t *box, CUtensorMapSwizzle swizzle)
{
    const EncodeTiled f = tensor_map_encoder();
    const cuuint32_t es[3] = {1, 1, 1};
    return f && rank <= 3 &&
           f(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank, const_cast<void *>(base), dim, stride, box, es,
             CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

} // namespace nf

// The W4A4 prefill's chunk encoder: x [T][cols] bf16 -> nvfp4 (a4.cuh), once per slice, read by the
// routed and the shared gate/up GEMMs.
#include "a4.cuh"

namespace nf {

namespace {

// One thread per block of 16 elements: two 16-byte loads, one 8-byte and one 1-byte store.
__global__ void a4_encode_kernel(const uint16_t *x, uint32_t n_blocks, uint32_t cols, const float *divisor, A4Plane out)
{
    const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_blocks) return;
    const uint32_t row = i / (cols / 16), b = i % (cols / 16);
    const uint4 *src = reinterpret_cast<const uint4 *>(x + (size_t)row * cols + b * 16);
    const uint4 lo = src[0], hi = src[1];
    const uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    float v[16], amax = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        v[2 * j] = bf2f((uint16_t)w[j]);
        v[2 * j + 1] = bf2f((uint16_t)(w[j] >> 16));
        amax = fmaxf(amax, fmaxf(fabsf(v[2 * j]), fabsf(v[2 * j + 1])));
    }
    const float g = *divisor;
    const uint32_t sb = a4_scale_byte(amax, g);
    const float eff = a4_eff(sb, g);
    uint32_t d[2] = {0, 0};
#pragma unroll
    for (int j = 0; j < 16; j++) d[j >> 3] |= a4_nibble(v[j], eff) << (4 * (j & 7));
    *reinterpret_cast<uint2 *>(out.q + (size_t)row * (cols / 2) + b * 8) = make_uint2(d[0], d[1]);
    out.s[(size_t)row * (cols / 16) + b] = (uint8_t)sb;
}

} // namespace

cudaError_t launch_a4_encode(const uint16_t *x, uint32_t T, uint32_t cols, const float *divisor, A4Plane out,
                             cudaStream_t s)
{
    const uint32_t n = T * (cols / 16);
    a4_encode_kernel<<<(n + 255) / 256, 256, 0, s>>>(x, n, cols, divisor, out);
    return cudaGetLastError();
}

} // namespace nf

// The host emulation of mmq.cu's per-row dot (mmq.cuh's staging, words, scales and folds), which
// test_mmq (the kernels) and test_a8_ties (the route's emulated device) hold the device to.
#pragma once
#include <stdint.h>
#include <string.h>

#include "backend/cuda/sparse_moe/internal.cuh"
#include "backend/cuda/sparse_moe/mmq.cuh"
extern "C" {
#include "codec/codec.h"
}

// mmq.cu's dot of row r of expert e with one position's int8 activations (plain layout: element i
// at xq[i]): each slice's row bytes staged by the policy's chunk map and its scale fields, each
// group's int8 words against the activations (the MMA's exact int32 sum), folded in element order.
template <class C>
float mmq_rowdot_c(const nf::DevMat &W, uint32_t e, uint32_t r, const int8_t *xq, const float2 *xd)
{
    const uint8_t *row = nf::row_ptr(W, e, r), *meta = row + C::meta_off(W);
    uint8_t st[C::QB];
    float acc = 0.0f;
    for (uint32_t kt = 0; kt < W.cols / C::SLICE; kt++) {
        for (int c = 0; c < C::QB / 16; c++) memcpy(st + 16 * c, row + C::chunk(W, c, kt), 16);
        for (int j = 0; j < C::SLICE / C::GE; j++) {
            const uint32_t e0 = kt * C::SLICE + j * C::GE;
            int isum = 0;
            for (int c = 0; c < C::GE; c += 4) {
                const uint32_t wv = C::word(st, j, c);
                for (int by = 0; by < 4; by++) isum += (int)(int8_t)(wv >> (8 * by)) * xq[e0 + c + by];
            }
            float ds, ms;
            C::scale(meta, W.nb, kt, j, ds, ms);
            acc = nf::mmq_fold<C>(acc, isum, ds, ms, xd[e0 / 32]);
        }
    }
    return acc;
}
static inline float mmq_rowdot(int codec, const nf::DevMat &W, uint32_t e, uint32_t r, const int8_t *xq, const float2 *xd)
{
    switch (codec) {
    case NF_CODEC_Q4_K: return mmq_rowdot_c<nf::MmqQ4K>(W, e, r, xq, xd);
    case NF_CODEC_Q5_K: return mmq_rowdot_c<nf::MmqQ5K>(W, e, r, xq, xd);
    case NF_CODEC_Q6_K: return mmq_rowdot_c<nf::MmqQ6K>(W, e, r, xq, xd);
    default: return mmq_rowdot_c<nf::MmqQ8>(W, e, r, xq, xd);
    }
}

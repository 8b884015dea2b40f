// The Gated DeltaNet kernels (src/backend/cuda/decoder/gdn.cu: conv, recurrence, gated norm) against a
// double-precision host reference written from the definitions (tests/common/gdn_ref.h, which
// tests/cpu/test_gdn holds the CPU op to as well), on random inputs
// (label cuda; skipped without a GPU). Each case is one batch of several sequences with ragged token
// counts, each on its own state slot: some continue from a random state already in their slot, some
// start (position 0) from a slot filled with NaN, which the kernels must not read. Checked: the output
// (bf16, out_proj's input), the conv window and S written back to each slot, and the slots of no
// sequence untouched.
//
// Bounds. The output is rounded to bf16 once (8 significant bits, round to nearest: |got - ref| <= 2^-8
// |ref| per element). Before it, the f32 arithmetic: o = S^T q is a dot of dk <= 128 terms, off by at
// most ~dk 2^-24 |S_j| |q| <= 7.6e-6 sqrt(dk) of the head's RMS of o (q has norm 1 / sqrt(dk) after the
// scaling): 8.6e-5 at dk = 128 in the worst case, far less as a random walk; S itself is a decayed,
// contracting sum -- each step multiplies it by exp(g) (I - beta k k^T), of norm <= 1 for |k| = 1 and
// beta in (0, 1) -- so the <= 40 steps do not amplify its errors. The normalised o has RMS 1, so 1e-4
// times the element's own factor |w_j silu(z_j)| is added to the allowance. S carries no bf16
// rounding, only those f32 errors: rel-L2 <= 1e-4 per (slot, head). The conv window is a copy of raw
// inputs: exact.
// A wrong column, row, head mapping, state slot or a skipped decay gives errors of order one.
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <vector>

#include "backend/cuda/decoder/gdn.cuh"

extern "C" {
#include "common/cuda_test_util.h"
#include "common/gdn_ref.h"
}
#include "nf_test.h"
#include "common/need_gpu.h"

namespace {

uint64_t rng = 0x9E3779B97F4A7C15ull;

struct Seq {
    uint32_t n, slot;
    bool fresh;
};

struct Shape {
    uint32_t hk, hv, dk, dv;
};

double rel_l2(const float *got, const double *ref, size_t n)
{
    double e = 0, r = 0;
    for (size_t i = 0; i < n; i++) e += (got[i] - ref[i]) * (got[i] - ref[i]), r += ref[i] * ref[i];
    return sqrt(e / (r > 0 ? r : 1));
}

void check_case(const Shape &g, const std::vector<Seq> &seqs, uint32_t n_slots)
{
    const uint32_t K = nf::dec::kGdnConvK, Kd = g.hk * g.dk, C = 2 * Kd + g.hv * g.dv, Vd = g.hv * g.dv;
    const uint32_t stride = C + Vd + 2 * g.hv + 3; // a padded row
    const size_t layer = nf::dec::gdn_state_floats(g.hk, g.hv, g.dk, g.dv, K), slot_floats = layer + 5;
    uint32_t T = 0, S = (uint32_t)seqs.size();
    for (const Seq &s : seqs) T += s.n;
    std::vector<float> row((size_t)T * stride), conv_w((size_t)C * K), dtb(g.hv), alog(g.hv), nw(g.dv);
    std::vector<float> slots(slot_floats * n_slots, NAN);
    for (auto &v : row) v = nf_test_nrand(&rng);
    for (auto &v : conv_w) v = 0.5f * nf_test_nrand(&rng);
    for (uint32_t h = 0; h < g.hv; h++) dtb[h] = 0.5f * nf_test_nrand(&rng), alog[h] = 2.0f * (float)nf_test_urand(&rng) - 1.0f;
    for (auto &v : nw) v = 1.0f + 0.1f * nf_test_nrand(&rng);
    std::vector<int32_t> last(S), pos(T), slot(S);
    uint32_t t0 = 0;
    for (uint32_t i = 0; i < S; i++) {
        const Seq &s = seqs[i];
        float *st = slots.data() + (size_t)s.slot * slot_floats;
        if (!s.fresh) {
            for (size_t j = 0; j < (size_t)(K - 1) * C; j++) st[j] = nf_test_nrand(&rng);
            for (size_t j = (size_t)(K - 1) * C; j < layer; j++) st[j] = 0.1f * nf_test_nrand(&rng);
        }
        for (uint32_t j = 0; j < s.n; j++) pos[t0 + j] = (int32_t)((s.fresh ? 0 : 50) + j);
        last[i] = (int32_t)(t0 + s.n - 1), slot[i] = (int32_t)s.slot;
        t0 += s.n;
    }
    // the device side
    float *d_row = nullptr, *d_w = nullptr, *d_slots = nullptr;
    int32_t *d_tab = nullptr;
    uint16_t *d_out = nullptr;
    const size_t vec = (size_t)C * K + 2 * g.hv + g.dv;
    bool ok = cudaMalloc(&d_row, row.size() * 4) == cudaSuccess && cudaMalloc(&d_w, vec * 4) == cudaSuccess &&
              cudaMalloc(&d_slots, slots.size() * 4) == cudaSuccess &&
              cudaMalloc(&d_tab, (2 * S + T) * 4) == cudaSuccess && cudaMalloc(&d_out, (size_t)(T + 1) * Vd * 2) == cudaSuccess;
    ok = ok && cudaMemcpy(d_row, row.data(), row.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess &&
         cudaMemcpy(d_w, conv_w.data(), conv_w.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess &&
         cudaMemcpy(d_w + conv_w.size(), dtb.data(), g.hv * 4, cudaMemcpyHostToDevice) == cudaSuccess &&
         cudaMemcpy(d_w + conv_w.size() + g.hv, alog.data(), g.hv * 4, cudaMemcpyHostToDevice) == cudaSuccess &&
         cudaMemcpy(d_w + conv_w.size() + 2 * g.hv, nw.data(), g.dv * 4, cudaMemcpyHostToDevice) == cudaSuccess &&
         cudaMemcpy(d_slots, slots.data(), slots.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess &&
         cudaMemcpy(d_tab, last.data(), S * 4, cudaMemcpyHostToDevice) == cudaSuccess &&
         cudaMemcpy(d_tab + S, slot.data(), S * 4, cudaMemcpyHostToDevice) == cudaSuccess &&
         cudaMemcpy(d_tab + 2 * S, pos.data(), T * 4, cudaMemcpyHostToDevice) == cudaSuccess &&
         cudaMemset(d_out, 0xFF, (size_t)(T + 1) * Vd * 2) == cudaSuccess; // NaN; row T is a guard
    nf::dec::Batch b{};
    b.pos = d_tab + 2 * S, b.last = d_tab, b.slot = d_tab + S;
    const nf::dec::GdnArgs ga{d_row, stride, d_w, d_w + conv_w.size(), d_w + conv_w.size() + g.hv,
                              d_w + conv_w.size() + 2 * g.hv, d_slots, slot_floats, g.hk, g.hv, g.dk, g.dv, K, 1e-6f, d_out};
    ok = ok && nf::dec::gdn_forward(ga, b, T, S, 0) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess;
    std::vector<uint16_t> out((size_t)(T + 1) * Vd);
    std::vector<float> got(slots.size());
    ok = ok && cudaMemcpy(out.data(), d_out, out.size() * 2, cudaMemcpyDeviceToHost) == cudaSuccess &&
         cudaMemcpy(got.data(), d_slots, got.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess;
    CHECK_MSG(ok, "gdn dk %u dv %u: device run failed: %s", g.dk, g.dv, cudaGetErrorString(cudaGetLastError()));
    cudaFree(d_row), cudaFree(d_w), cudaFree(d_slots), cudaFree(d_tab), cudaFree(d_out);
    if (!ok) return;
    // the reference, sequence by sequence, and the comparisons (the first mismatch of each kind printed)
    double worst_out = 0, worst_S = 0;
    size_t bad = 0;
    t0 = 0;
    for (uint32_t i = 0; i < S; i++) {
        const Seq &s = seqs[i];
        const float *st = slots.data() + (size_t)s.slot * slot_floats;
        std::vector<double> cs((size_t)(K - 1) * C, 0.0), Sd((size_t)g.hv * g.dk * g.dv, 0.0), ref;
        for (size_t j = 0; !s.fresh && j < cs.size(); j++) cs[j] = st[j];
        for (size_t j = 0; !s.fresh && j < Sd.size(); j++) Sd[j] = st[cs.size() + j];
        const float *r0 = row.data() + (size_t)t0 * stride;
        const gdn_ref_shape rs = {g.hk, g.hv, g.dk, g.dv, K};
        const gdn_ref_weights rw = {conv_w.data(), dtb.data(), alog.data(), nw.data(), 1e-6};
        const gdn_ref_rows rr = {r0, r0 + C, r0 + C + Vd, stride};
        ref.resize((size_t)s.n * Vd);
        if (!gdn_ref_run(&rs, &rw, &rr, s.n, cs.data(), Sd.data(), ref.data())) return;
        for (uint32_t t = 0; t < s.n; t++)
            for (uint32_t h = 0; h < g.hv; h++) {
                const double *r = ref.data() + (size_t)t * Vd + h * g.dv;
                const float *z = row.data() + (size_t)(t0 + t) * stride + C + h * g.dv;
                for (uint32_t j = 0; j < g.dv; j++) {
                    const double v = nf_test_bf2f(out[(size_t)(t0 + t) * Vd + h * g.dv + j]), e = fabs(v - r[j]);
                    const double allow = ldexp(fabs(r[j]), -8) + 1e-4 * fabs(nw[j] * gdn_ref_silu(z[j]));
                    worst_out = fmax(worst_out, e / allow);
                    if (!(e <= allow) && bad++ == 0)
                        printf("  FIRST MISMATCH output: sequence %u token %u head %u column %u: got %.6g, want %.6g\n",
                               i, t, h, j, v, r[j]);
                }
            }
        const float *gs = got.data() + (size_t)s.slot * slot_floats;
        for (size_t j = 0; j < cs.size(); j++)
            if (gs[j] != (float)cs[j] && bad++ == 0)
                printf("  FIRST MISMATCH conv window: sequence %u element %zu: got %.6g, want %.6g\n", i, j, gs[j], cs[j]);
        for (uint32_t h = 0; h < g.hv; h++) {
            const size_t off = (size_t)h * g.dk * g.dv;
            const double e = rel_l2(gs + cs.size() + off, Sd.data() + off, (size_t)g.dk * g.dv);
            worst_S = fmax(worst_S, e);
            if (!(e <= 1e-4) && bad++ == 0) printf("  FIRST MISMATCH state: sequence %u head %u: rel-L2 %.3g\n", i, h, e);
        }
        for (size_t j = layer; j < slot_floats; j++) // past the layer's state: untouched (NaN stays NaN)
            if (!isnan(gs[j]) && bad++ == 0) printf("  FIRST MISMATCH: slot %u float %zu past the layer written\n", s.slot, j);
        t0 += s.n;
    }
    for (uint32_t sl = 0; sl < n_slots; sl++) { // slots of no sequence: untouched
        bool used = false;
        for (const Seq &s : seqs) used = used || s.slot == sl;
        for (size_t j = 0; !used && j < slot_floats; j++)
            if (!isnan(got[(size_t)sl * slot_floats + j]) && bad++ == 0) printf("  FIRST MISMATCH: unused slot %u written\n", sl);
    }
    for (uint32_t j = 0; j < Vd; j++)
        if (out[(size_t)T * Vd + j] != 0xFFFF && bad++ == 0) printf("  FIRST MISMATCH: guard row written\n");
    printf("gdn Hk %u Hv %u dk %3u dv %3u, %u sequences (%u tokens): output worst %.2f of its allowance, S worst rel-L2 "
           "%.2e, %zu mismatches\n", g.hk, g.hv, g.dk, g.dv, S, T, worst_out, worst_S, bad);
    CHECK_MSG(bad == 0, "gdn dk %u dv %u: %zu mismatches", g.dk, g.dv, bad);
}

} // namespace

int main(void)
{
    if (!nf_test_gpu_visible("test_gdn_cuda")) return NF_TEST_SKIP;
    // the published shape (Qwen3.5 / Qwen3-Next: dk = dv = 128, two v heads per k head) with a decode
    // token, a fresh prefill chunk and a short continuing chunk; the tiny fixtures' shape; a v head
    // dim that is not a whole number of the recurrence's 8-column warps
    const std::vector<Seq> mix = {{1, 2, false}, {37, 0, true}, {5, 3, false}};
    check_case(Shape{2, 4, 128, 128}, mix, 5);
    check_case(Shape{2, 4, 16, 16}, mix, 5);
    check_case(Shape{1, 2, 64, 24}, {{3, 1, true}, {1, 0, false}}, 2);
    check_case(Shape{4, 4, 32, 32}, {{40, 0, false}}, 1);
    return nf_test_report();
}

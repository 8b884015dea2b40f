// The Gated DeltaNet kernels (src/backend/cuda/decoder/gdn.cu: conv, the per-token and the chunked
// recurrence, gated norm) against a double-precision host reference written from the definitions
// (tests/common/gdn_ref.h, which tests/cpu/test_gdn holds the CPU op to as well), on random inputs
// (label cuda; skipped without a GPU). A case is a few forwards over the same state slots, each one
// batch of sequences with ragged token counts (a sequence can come back in a later forward: a second
// prefill piece, a decode step after a chunked prefill); a sequence's first piece continues from a
// random state already in its slot or starts (position 0) from a slot filled with NaN, which the
// kernels must not read. Every case runs three ways from the same inputs: every sequence on the
// per-token kernel (gdn_forward_split with chunk_from = UINT32_MAX), every sequence on the chunked
// one (chunk_from = 1, down to 1-token pieces), and gdn_forward's own split (kGdnChunkFrom). Checked
// after every forward: the output (bf16, out_proj's input), the conv window and S written back to
// each slot, the slots of no sequence untouched, nothing past the layer's state or the last row
// written.
//
// Bounds. The output is rounded to bf16 once (8 significant bits, round to nearest: |got - ref| <= 2^-8
// |ref| per element). Before it, the f32 arithmetic, which the double reference does not share:
// - per-token: o = S^T q is a dot of dk <= 128 terms, off by at most ~dk 2^-24 |S_j| |q| <= 7.6e-6
//   sqrt(dk) of the head's RMS of o (q has norm 1 / sqrt(dk) after the scaling): 8.6e-5 at dk = 128
//   in the worst case, far less as a random walk; S is a decayed, contracting sum -- each step
//   multiplies it by exp(g) (I - beta k k^T), of norm <= 1 for |k| = 1 and beta in (0, 1) -- so a
//   step's roundings (~sqrt(dk) 2^-24 |S| as RMS, dk 2^-24 at worst) are carried, not amplified.
// - chunked (chunks of N = 32): k_i . k_m and q_i . k_m are dk-term dots of unit (1 / sqrt(dk)) vectors,
//   off by <= dk 2^-24 absolute; |a_im| <= beta_i |k_i . k_m| <= 1 (random keys: ~1 / sqrt(dk)). W and U
//   (the prep pass's forward substitution, N-term sums) are the chunk's per-token steps run on the keys
//   and on the values from a zero state: each step non-expanding and adding one input, so their rows
//   stay within N max|k| and N max|v| (random inputs: ~|k|, |v|) and a rounding is carried, not
//   amplified. d = U - W S adds W S's dk-term dots; o's state part is one more, its within-chunk sum
//   and the state's sum over the chunk N-term sums. Per chunk the error is <= (dk + 4 N) N 2^-24 of
//   |S| + |v| at the very worst (dk = 128: ~5e-4; random-walk RMS ~ sqrt(dk + 4N) 2^-24 ~ 1e-6), and
//   chunks add, not multiply; the longest sequence here has 300 tokens (10 chunks): ~3e-6 RMS.
// The per-token kernel over 300 steps: <= 300 x 7.6e-6 worst case, ~sqrt(300) x 7e-7 ~ 1.2e-5 RMS.
// The normalised o has RMS 1, so 1e-4 times the element's own factor |w_j silu(z_j)| is added to the
// output's allowance; S carries no bf16 rounding: rel-L2 <= 1e-4 per (slot, head), an RMS over dk dv
// independent roundings (the worst-case sums above are not reached by rel-L2 unless every rounding
// goes the same way). Odd heads decay slowly (exp(g) ~ 0.995 a token), so their states remember whole
// sequences and chunks' errors do add up; even heads forget within tens of tokens. The conv window
// is a copy of raw inputs: exact.
// A wrong column, row, head mapping, state slot, a skipped decay, a dropped or mis-scaled inter-chunk
// state, a wrong ragged-chunk padding gives errors of order one.
//
// `test_gdn_cuda --bench`: times gdn_forward_split per-token against chunked (conv and gated norm
// included in both) at Qwen3.5's shape, 512 tokens a sequence for 1 and 4 sequences, then both over
// token counts around kGdnChunkFrom (the threshold's measurement).
#include <algorithm>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <vector>

#include "backend/cuda/decoder/gdn.cuh"

extern "C" {
#include "base/fnv.h"
#include "common/cuda_test_util.h"
#include "common/gdn_ref.h"
}
#include "nf_test.h"
#include "common/need_gpu.h"

namespace {

uint64_t rng = 0x9E3779B97F4A7C15ull;

struct Shape {
    uint32_t hk, hv, dk, dv;
};

struct SeqDef {
    uint32_t slot;
    bool fresh; // its first piece starts at position 0
};

struct Piece {
    uint32_t seq, n; // n tokens of sequence seq in a forward
};
using Forward = std::vector<Piece>;

// A case's inputs and the reference's results, computed once for the three runs.
struct Case {
    Shape g;
    uint32_t K, Kd, C, Vd, stride, n_slots;
    size_t layer, slot_floats;
    std::vector<SeqDef> seqs;
    std::vector<Forward> fwd;
    std::vector<float> conv_w, dtb, alog, nw, slots0;
    std::vector<std::vector<float>> rows;               // [forward][T][stride]
    std::vector<std::vector<int32_t>> tabs;             // [forward]: last [S] | slot [S] | pos [T]
    std::vector<std::vector<double>> out;               // [forward][T][Vd]
    std::vector<std::vector<std::vector<double>>> cs, S; // [forward][piece]: the slot's state after it
};

double rel_l2(const float *got, const double *ref, size_t n)
{
    double e = 0, r = 0;
    for (size_t i = 0; i < n; i++) e += (got[i] - ref[i]) * (got[i] - ref[i]), r += ref[i] * ref[i];
    return sqrt(e / (r > 0 ? r : 1));
}

uint32_t tokens(const Forward &f)
{
    uint32_t T = 0;
    for (const Piece &p : f) T += p.n;
    return T;
}

// Inputs, tables and the double reference of every forward.
bool build_case(Case &k)
{
    const Shape &g = k.g;
    k.K = nf::dec::kGdnConvK, k.Kd = g.hk * g.dk, k.C = 2 * k.Kd + g.hv * g.dv, k.Vd = g.hv * g.dv;
    k.stride = k.C + k.Vd + 2 * g.hv + 3; // a padded row
    k.layer = nf::dec::gdn_state_floats(g.hk, g.hv, g.dk, g.dv, k.K), k.slot_floats = k.layer + 5;
    k.conv_w.resize((size_t)k.C * k.K), k.dtb.resize(g.hv), k.alog.resize(g.hv), k.nw.resize(g.dv);
    k.slots0.assign(k.slot_floats * k.n_slots, NAN);
    for (auto &v : k.conv_w) v = 0.5f * nf_test_nrand(&rng);
    for (uint32_t h = 0; h < g.hv; h++) { // odd heads: exp(g) ~ 0.995, a memory of hundreds of tokens
        k.dtb[h] = 0.5f * nf_test_nrand(&rng);
        k.alog[h] = h % 2 ? -6.0f + (float)nf_test_urand(&rng) : 2.0f * (float)nf_test_urand(&rng) - 1.0f;
    }
    for (auto &v : k.nw) v = 1.0f + 0.1f * nf_test_nrand(&rng);
    const size_t cs_n = (size_t)(k.K - 1) * k.C, S_n = (size_t)g.hv * g.dk * g.dv;
    std::vector<std::vector<double>> cs(k.seqs.size(), std::vector<double>(cs_n, 0.0)), Sd(k.seqs.size());
    std::vector<int32_t> next_pos(k.seqs.size());
    for (size_t i = 0; i < k.seqs.size(); i++) {
        float *st = k.slots0.data() + (size_t)k.seqs[i].slot * k.slot_floats;
        Sd[i].assign(S_n, 0.0);
        next_pos[i] = k.seqs[i].fresh ? 0 : 50;
        if (k.seqs[i].fresh) continue;
        for (size_t j = 0; j < cs_n; j++) cs[i][j] = st[j] = nf_test_nrand(&rng);
        for (size_t j = 0; j < S_n; j++) Sd[i][j] = st[cs_n + j] = 0.1f * nf_test_nrand(&rng);
    }
    const gdn_ref_shape rs = {g.hk, g.hv, g.dk, g.dv, k.K};
    const gdn_ref_weights rw = {k.conv_w.data(), k.dtb.data(), k.alog.data(), k.nw.data(), 1e-6};
    for (const Forward &f : k.fwd) {
        const uint32_t T = tokens(f), S = (uint32_t)f.size();
        std::vector<float> row((size_t)T * k.stride);
        for (auto &v : row) v = nf_test_nrand(&rng);
        std::vector<int32_t> tab(2 * S + T);
        std::vector<double> out((size_t)T * k.Vd);
        std::vector<std::vector<double>> fcs, fS;
        uint32_t t0 = 0;
        for (uint32_t i = 0; i < S; i++) {
            const Piece &p = f[i];
            for (uint32_t j = 0; j < p.n; j++) tab[2 * S + t0 + j] = next_pos[p.seq]++;
            tab[i] = (int32_t)(t0 + p.n - 1), tab[S + i] = (int32_t)k.seqs[p.seq].slot;
            const float *r0 = row.data() + (size_t)t0 * k.stride;
            const gdn_ref_rows rr = {r0, r0 + k.C, r0 + k.C + k.Vd, k.stride};
            if (!gdn_ref_run(&rs, &rw, &rr, p.n, cs[p.seq].data(), Sd[p.seq].data(), out.data() + (size_t)t0 * k.Vd))
                return false;
            fcs.push_back(cs[p.seq]), fS.push_back(Sd[p.seq]);
            t0 += p.n;
        }
        k.rows.push_back(std::move(row)), k.tabs.push_back(std::move(tab)), k.out.push_back(std::move(out));
        k.cs.push_back(std::move(fcs)), k.S.push_back(std::move(fS));
    }
    return true;
}

// Forward f's results (out [T + 1][Vd] with a guard row, the slots) against the reference; the number
// of mismatches, the first of each kind printed.
size_t compare(const Case &k, size_t f, const std::vector<uint16_t> &out, const std::vector<float> &got, double &worst_out,
               double &worst_S)
{
    const Shape &g = k.g;
    const Forward &fw = k.fwd[f];
    const uint32_t T = tokens(fw);
    size_t bad = 0;
    uint32_t t0 = 0;
    for (uint32_t i = 0; i < fw.size(); i++) {
        for (uint32_t t = t0; t < t0 + fw[i].n; t++)
            for (uint32_t h = 0; h < g.hv; h++) {
                const double *r = k.out[f].data() + (size_t)t * k.Vd + h * g.dv;
                const float *z = k.rows[f].data() + (size_t)t * k.stride + k.C + h * g.dv;
                for (uint32_t j = 0; j < g.dv; j++) {
                    const double v = nf_test_bf2f(out[(size_t)t * k.Vd + h * g.dv + j]), e = fabs(v - r[j]);
                    const double allow = ldexp(fabs(r[j]), -8) + 1e-4 * fabs(k.nw[j] * gdn_ref_silu(z[j]));
                    worst_out = fmax(worst_out, e / allow);
                    if (!(e <= allow) && bad++ == 0)
                        printf("  FIRST MISMATCH output: forward %zu piece %u token %u head %u column %u: got %.6g, "
                               "want %.6g\n", f, i, t - t0, h, j, v, r[j]);
                }
            }
        const uint32_t slot = k.seqs[fw[i].seq].slot;
        const float *gs = got.data() + (size_t)slot * k.slot_floats;
        const std::vector<double> &cs = k.cs[f][i], &Sd = k.S[f][i];
        for (size_t j = 0; j < cs.size(); j++)
            if (gs[j] != (float)cs[j] && bad++ == 0)
                printf("  FIRST MISMATCH conv window: forward %zu piece %u element %zu: got %.6g, want %.6g\n", f, i, j,
                       gs[j], cs[j]);
        for (uint32_t h = 0; h < g.hv; h++) {
            const size_t off = (size_t)h * g.dk * g.dv;
            const double e = rel_l2(gs + cs.size() + off, Sd.data() + off, (size_t)g.dk * g.dv);
            worst_S = fmax(worst_S, e);
            if (!(e <= 1e-4) && bad++ == 0)
                printf("  FIRST MISMATCH state: forward %zu piece %u head %u: rel-L2 %.3g\n", f, i, h, e);
        }
        for (size_t j = k.layer; j < k.slot_floats; j++) // past the layer's state: untouched (NaN stays NaN)
            if (!isnan(gs[j]) && bad++ == 0) printf("  FIRST MISMATCH: slot %u float %zu past the layer written\n", slot, j);
        t0 += fw[i].n;
    }
    for (uint32_t sl = 0; sl < k.n_slots; sl++) { // slots of no sequence: untouched
        bool used = false;
        for (const SeqDef &s : k.seqs) used = used || s.slot == sl;
        for (size_t j = 0; !used && j < k.slot_floats; j++)
            if (!isnan(got[(size_t)sl * k.slot_floats + j]) && bad++ == 0) printf("  FIRST MISMATCH: unused slot %u written\n", sl);
    }
    for (uint32_t j = 0; j < k.Vd; j++)
        if (out[(size_t)T * k.Vd + j] != 0xFFFF && bad++ == 0) printf("  FIRST MISMATCH: guard row written\n");
    return bad;
}

// Device buffers of a case (or of the benchmark): rows, weights, slots, tables, output.
// The chunked form's workspace starts as NaN: a read of what the forward did not write shows.
struct Dev {
    float *row = nullptr, *w = nullptr, *slots = nullptr, *ws = nullptr;
    int32_t *tab = nullptr;
    uint16_t *out = nullptr;
    bool alloc(size_t row_f, size_t w_f, size_t slot_f, size_t tab_n, size_t out_n, size_t ws_f)
    {
        return cudaMalloc(&row, row_f * 4) == cudaSuccess && cudaMalloc(&w, w_f * 4) == cudaSuccess &&
               cudaMalloc(&slots, slot_f * 4) == cudaSuccess && cudaMalloc(&tab, tab_n * 4) == cudaSuccess &&
               cudaMalloc(&out, out_n * 2) == cudaSuccess && cudaMalloc(&ws, ws_f * 4) == cudaSuccess &&
               cudaMemset(ws, 0xFF, ws_f * 4) == cudaSuccess;
    }
    ~Dev() { cudaFree(row), cudaFree(w), cudaFree(slots), cudaFree(tab), cudaFree(out), cudaFree(ws); }
};

bool upload(void *d, const void *h, size_t bytes) { return cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice) == cudaSuccess; }

// The weights packed as Dev.w holds them: conv_w | dt_bias | A_log | norm.
nf::dec::GdnArgs args_of(const Shape &g, uint32_t C, uint32_t stride, size_t slot_floats, const Dev &d)
{
    const size_t cw = (size_t)C * nf::dec::kGdnConvK;
    return nf::dec::GdnArgs{d.row, stride, d.w, d.w + cw, d.w + cw + g.hv, d.w + cw + 2 * g.hv, d.slots, slot_floats,
                            g.hk, g.hv, g.dk, g.dv, nf::dec::kGdnConvK, 1e-6f, d.out, d.ws};
}

// The tables as Dev.tab holds them: last [S] | slot [S] | pos [T].
nf::dec::Batch batch_of(const Dev &d, uint32_t S)
{
    nf::dec::Batch b{};
    b.last = d.tab, b.slot = d.tab + S, b.pos = d.tab + 2 * S;
    return b;
}

// The case's forwards on the device with the given split, each checked against the reference.
void run_case(const Case &k, uint32_t chunk_from, const char *how)
{
    const Shape &g = k.g;
    uint32_t Tmax = 0, Smax = 0;
    for (const Forward &f : k.fwd) Tmax = tokens(f) > Tmax ? tokens(f) : Tmax, Smax = f.size() > Smax ? (uint32_t)f.size() : Smax;
    Dev d;
    bool ok = d.alloc((size_t)Tmax * k.stride, k.conv_w.size() + 2 * g.hv + g.dv, k.slots0.size(), 2 * Smax + Tmax,
                      (size_t)(Tmax + 1) * k.Vd, nf::dec::gdn_ws_floats(Tmax, g.hv, g.dk));
    ok = ok && upload(d.w, k.conv_w.data(), k.conv_w.size() * 4) && upload(d.w + k.conv_w.size(), k.dtb.data(), g.hv * 4) &&
         upload(d.w + k.conv_w.size() + g.hv, k.alog.data(), g.hv * 4) &&
         upload(d.w + k.conv_w.size() + 2 * g.hv, k.nw.data(), g.dv * 4) &&
         upload(d.slots, k.slots0.data(), k.slots0.size() * 4);
    double worst_out = 0, worst_S = 0;
    size_t bad = 0;
    uint64_t witness = NF_FNV1A64_INIT; // of every output and state bit: a kernel change that keeps the
                                        // arithmetic (layout, stores) must keep it
    for (size_t f = 0; ok && f < k.fwd.size(); f++) {
        const uint32_t T = tokens(k.fwd[f]), S = (uint32_t)k.fwd[f].size();
        ok = upload(d.row, k.rows[f].data(), k.rows[f].size() * 4) && upload(d.tab, k.tabs[f].data(), k.tabs[f].size() * 4) &&
             cudaMemset(d.out, 0xFF, (size_t)(T + 1) * k.Vd * 2) == cudaSuccess; // NaN; row T is a guard
        ok = ok && nf::dec::gdn_forward_split(args_of(g, k.C, k.stride, k.slot_floats, d), batch_of(d, S), T, S,
                                              chunk_from, 0) == cudaSuccess &&
             cudaDeviceSynchronize() == cudaSuccess;
        std::vector<uint16_t> out((size_t)(T + 1) * k.Vd);
        std::vector<float> got(k.slots0.size());
        ok = ok && cudaMemcpy(out.data(), d.out, out.size() * 2, cudaMemcpyDeviceToHost) == cudaSuccess &&
             cudaMemcpy(got.data(), d.slots, got.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess;
        if (ok) bad += compare(k, f, out, got, worst_out, worst_S);
        witness = nf_fnv1a64_update(nf_fnv1a64_update(witness, out.data(), out.size() * 2), got.data(), got.size() * 4);
    }
    CHECK_MSG(ok, "gdn dk %u dv %u %s: device run failed: %s", g.dk, g.dv, how, cudaGetErrorString(cudaGetLastError()));
    printf("gdn Hk %2u Hv %2u dk %3u dv %3u %-9s %zu forwards: output worst %.2f of its allowance, S worst rel-L2 %.2e, "
           "%zu mismatches, witness %016llx\n", g.hk, g.hv, g.dk, g.dv, how, k.fwd.size(), worst_out, worst_S, bad,
           (unsigned long long)witness);
    CHECK_MSG(bad == 0, "gdn dk %u dv %u %s: %zu mismatches", g.dk, g.dv, how, bad);
}

void check(const Shape &g, const std::vector<SeqDef> &seqs, const std::vector<Forward> &fwd, uint32_t n_slots)
{
    Case k;
    k.g = g, k.seqs = seqs, k.fwd = fwd, k.n_slots = n_slots;
    CHECK_MSG(build_case(k), "gdn reference: out of memory");
    if (k.out.size() != fwd.size()) return;
    run_case(k, UINT32_MAX, "per-token");
    run_case(k, 1, "chunked");
    run_case(k, nf::dec::kGdnChunkFrom, "split");
}

// ---- the microbenchmark ----

// Microseconds of one gdn_forward_split over S sequences of n tokens each (fresh), the median of reps.
double time_forward(const Shape &g, uint32_t n, uint32_t S, uint32_t chunk_from, int reps)
{
    const uint32_t K = nf::dec::kGdnConvK, C = 2 * g.hk * g.dk + g.hv * g.dv, Vd = g.hv * g.dv, T = n * S;
    const uint32_t stride = C + Vd + 2 * g.hv;
    const size_t slot_floats = nf::dec::gdn_state_floats(g.hk, g.hv, g.dk, g.dv, K);
    std::vector<float> row((size_t)T * stride), w((size_t)C * K + 2 * g.hv + g.dv);
    for (auto &v : row) v = nf_test_nrand(&rng);
    for (auto &v : w) v = 0.5f * nf_test_nrand(&rng);
    std::vector<int32_t> tab(2 * S + T);
    for (uint32_t i = 0; i < S; i++) {
        tab[i] = (int32_t)((i + 1) * n - 1), tab[S + i] = (int32_t)i;
        for (uint32_t j = 0; j < n; j++) tab[2 * S + i * n + j] = (int32_t)j;
    }
    Dev d;
    float *pristine = nullptr;
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    bool ok = d.alloc(row.size(), w.size(), slot_floats * S, tab.size(), (size_t)T * Vd, nf::dec::gdn_ws_floats(T, g.hv, g.dk)) &&
              cudaMalloc(&pristine, row.size() * 4) == cudaSuccess && upload(pristine, row.data(), row.size() * 4) &&
              upload(d.w, w.data(), w.size() * 4) && upload(d.tab, tab.data(), tab.size() * 4) &&
              cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess;
    std::vector<float> ms;
    const nf::dec::GdnArgs ga = args_of(g, C, stride, slot_floats, d);
    for (int r = -3; ok && r < reps; r++) { // 3 warm-up runs; the rows restored before each (the conv works in place)
        float t = 0;
        ok = cudaMemcpy(d.row, pristine, row.size() * 4, cudaMemcpyDeviceToDevice) == cudaSuccess &&
             cudaEventRecord(e0, 0) == cudaSuccess &&
             nf::dec::gdn_forward_split(ga, batch_of(d, S), T, S, chunk_from, 0) == cudaSuccess &&
             cudaEventRecord(e1, 0) == cudaSuccess && cudaEventSynchronize(e1) == cudaSuccess &&
             cudaEventElapsedTime(&t, e0, e1) == cudaSuccess;
        if (r >= 0) ms.push_back(t);
    }
    CHECK_MSG(ok, "bench n %u S %u: device run failed: %s", n, S, cudaGetErrorString(cudaGetLastError()));
    cudaFree(pristine), cudaEventDestroy(e0), cudaEventDestroy(e1);
    if (!ok || ms.empty()) return NAN;
    std::sort(ms.begin(), ms.end());
    return 1e3 * ms[ms.size() / 2];
}

void bench()
{
    const Shape q35{16, 32, 128, 128}; // Qwen3.5-35B-A3B / Qwen3-Next's GDN layer
    printf("gdn_forward (conv + recurrence + gated norm), Hk 16 Hv 32 dk = dv = 128, median of 20:\n");
    for (uint32_t S : {1u, 4u}) {
        const double a = time_forward(q35, 512, S, UINT32_MAX, 20), b = time_forward(q35, 512, S, 1, 20);
        printf("  S %u x 512 tokens: per-token %9.1f us, chunked %9.1f us, x%.1f\n", S, a, b, a / b);
    }
    printf("the threshold (kGdnChunkFrom = %u): tokens a sequence, per-token us / chunked us\n", nf::dec::kGdnChunkFrom);
    for (uint32_t S : {1u, 8u}) {
        printf("  S %u:", S);
        for (uint32_t n : {2u, 4u, 8u, 16u, 24u, 32u, 48u, 64u, 128u})
            printf("  %u: %.1f / %.1f", n, time_forward(q35, n, S, UINT32_MAX, 20), time_forward(q35, n, S, 1, 20));
        printf("\n");
    }
}

} // namespace

int main(int argc, char **argv)
{
    if (!nf_test_gpu_visible("test_gdn_cuda")) return NF_TEST_SKIP;
    if (argc > 1 && strcmp(argv[1], "--bench") == 0) {
        bench();
        return nf_test_report();
    }
    // Qwen3.5-35B-A3B and Qwen3-Next-80B-A3B (the same GDN shape: Hk 16, Hv 32, dk = dv = 128): the
    // chunk edges' lengths in one batch, fresh and continuing; then second pieces (a chunked piece
    // from the state a chunked piece left, a decode step after a chunked prefill, a short piece on
    // the per-token kernel under the split), then decode steps. Slots 1 and 6 belong to nobody.
    const std::vector<SeqDef> six = {{3, false}, {0, true}, {7, false}, {2, true}, {5, false}, {4, true}};
    const std::vector<Forward> real = {
        {{0, 1}, {1, 63}, {2, 64}, {3, 65}, {4, 130}, {5, 200}},
        {{3, 100}, {5, 1}, {1, 40}, {0, 9}},
        {{3, 1}, {5, 1}, {1, 1}, {4, 1}},
    };
    check(Shape{16, 32, 128, 128}, six, real, 8);
    // synth tiny-hybrid's shape (Hk 2, Hv 4, dk = dv = 64) and the other head dims, with a v head
    // dim that is not a whole number of the kernels' column groups (24: 3 of the per-token kernel's
    // 8-column warps, 3 / 4 of a chunk CTA's 32 columns)
    const std::vector<SeqDef> three = {{1, true}, {0, false}, {3, true}};
    const std::vector<Forward> mixed = {{{0, 37}, {1, 1}, {2, 5}}, {{0, 130}, {1, 70}}, {{0, 1}, {2, 33}}};
    check(Shape{2, 4, 64, 64}, three, mixed, 5);
    check(Shape{2, 4, 16, 16}, three, mixed, 5);
    check(Shape{1, 2, 64, 24}, three, mixed, 5);
    check(Shape{4, 4, 32, 32}, {{0, false}}, {{{0, 40}}, {{0, 300}}}, 1);
    check(Shape{2, 4, 128, 256}, three, {{{0, 65}, {1, 3}, {2, 32}}}, 4);
    return nf_test_report();
}

/* The Gated DeltaNet op (nf_cpu_gdn_forward) against a double-precision reference written from the
 * definitions (tests/common/gdn_ref.h, which test_gdn_cuda holds the device kernels to as well), and
 * its chunked form against its recurrent form.
 *
 * Two sequences (150 and 9 tokens) are fed in three calls of ragged pieces (70 + 5, 1 + 3, 79 + 1
 * tokens), so the conv window and the S matrices carry across calls and a decode-sized piece sits
 * between prefill pieces; the chunked form sees chunks of 16 (a 70-token piece is 4 full chunks and a
 * ragged 6). Random q/k/v/z/b/a rows, conv kernel, dt_bias and A_log with decays from 0.45 to 0.996 per
 * token, so the state remembers tens of tokens.
 *
 * Bounds: the recurrent form is the definition evaluated in f32; every value passes through sums of at
 * most max(dk, K) = 32 products and the state through 150 updates, each a contraction (decay < 1)
 * plus a rank-one term, so the error per step is a few f32 ulps (6e-8) of the state's magnitude and
 * does not accumulate (the contraction forgets it): measured 2e-7 relative (L2 over all outputs);
 * the bound 2e-6 is ~30 ulps. The chunked form reorders the same sums (a 16 x 16 triangular solve,
 * exp(G_i - G_j) factors instead of running products), measured 3e-7 from the recurrent form, the
 * same bound; a wrong term in the solve or the state update is off by orders of magnitude (a skipped
 * forward substitution: 4e-2). Thread count: 1 and 3 threads bit-identical in both forms (items
 * are (sequence, head), each summed in one order). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "common/gdn_ref.h"
#include "nf_test.h"

enum { HK = 2, HV = 4, DK = 32, DV = 16, KC = 4, CONV = 2 * HK * DK + HV * DV, VD = HV * DV, NS = 2, CALLS = 3 };
static const uint32_t pieces[CALLS][NS] = {{70, 5}, {1, 3}, {79, 1}};
enum { T0 = 150, T1 = 9, TMAX = 80 };

static uint64_t rng = 12345;
static float uni(void) /* [-1, 1) */
{
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2 - 1);
}

typedef struct inputs {
    float qkv[T0][CONV], z[T0][VD], ba[T0][2 * HV]; /* per sequence: its own rows */
} inputs;

static float conv_w[CONV * KC], dt_bias[HV], a_log[HV], norm_w[DV];

/* ---- the reference (tests/common/gdn_ref.h): one sequence, all its tokens, from a zero state ---- */

static void reference(const inputs *in, uint32_t n, double out[][VD], double S[HV][DK][DV])
{
    static double cs[(KC - 1) * CONV];
    const gdn_ref_shape g = {HK, HV, DK, DV, KC};
    const gdn_ref_weights w = {conv_w, dt_bias, a_log, norm_w, 1e-6};
    memset(cs, 0, sizeof cs);
    memset(S, 0, sizeof(double) * HV * DK * DV);
    for (uint32_t t = 0; t < n; t++) { /* a token a call: qkv, z and ba are three arrays of different strides */
        const gdn_ref_rows r = {in->qkv[t], in->z[t], in->ba[t], 0};
        CHECK(gdn_ref_run(&g, &w, &r, 1, cs, &S[0][0][0], out[t]));
    }
}

/* ---- the op: both sequences, the calls of `pieces` ---- */

static void run(nf_cpu *c, uint32_t chunk, const inputs *in, float *out0, float *out1, float *state)
{
    const nf_cpu_gdn g = {HK, HV, DK, DV, KC, conv_w, dt_bias, a_log, norm_w, 1e-6f, chunk};
    const size_t sf = nf_cpu_gdn_state_floats(&g);
    float *ws = chunk ? malloc((size_t)nf_cpu_threads(c) * nf_cpu_gdn_ws_floats(&g) * sizeof(float)) : NULL;
    static float qkv[TMAX + 8][CONV], z[TMAX + 8][VD], ba[TMAX + 8][2 * HV], out[TMAX + 8][VD];
    memset(state, 0, NS * sf * sizeof(float));
    uint32_t done[NS] = {0};
    for (int k = 0; k < CALLS; k++) {
        nf_cpu_gdn_seq seqs[NS];
        uint32_t t = 0;
        for (uint32_t i = 0; i < NS; i++) {
            seqs[i] = (nf_cpu_gdn_seq){state + i * sf, t, pieces[k][i]};
            for (uint32_t j = 0; j < pieces[k][i]; j++, t++) {
                memcpy(qkv[t], in[i].qkv[done[i] + j], sizeof qkv[t]);
                memcpy(z[t], in[i].z[done[i] + j], sizeof z[t]);
                memcpy(ba[t], in[i].ba[done[i] + j], sizeof ba[t]);
            }
        }
        nf_cpu_gdn_forward(c, &g, seqs, NS, &qkv[0][0], &z[0][0], &ba[0][0], &out[0][0], ws);
        for (uint32_t i = 0; i < NS; i++) {
            float *o = i ? out1 : out0;
            memcpy(o + (size_t)done[i] * VD, out[seqs[i].t0], (size_t)pieces[k][i] * VD * sizeof(float));
            done[i] += pieces[k][i];
        }
    }
    free(ws);
}

static double rel_d(const float *a, const double *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
    return sqrt(num / den);
}

static double rel_f(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), den += (double)b[i] * b[i];
    return sqrt(num / den);
}

int main(void)
{
    static inputs in[NS];
    for (uint32_t i = 0; i < NS; i++)
        for (uint32_t t = 0; t < T0; t++) {
            for (uint32_t c = 0; c < CONV; c++) in[i].qkv[t][c] = uni();
            for (uint32_t c = 0; c < VD; c++) in[i].z[t][c] = 2 * uni();
            for (uint32_t c = 0; c < 2 * HV; c++) in[i].ba[t][c] = 2 * uni();
        }
    for (uint32_t c = 0; c < CONV * KC; c++) conv_w[c] = 0.6f * uni();
    for (uint32_t h = 0; h < HV; h++) dt_bias[h] = -1.5f + 0.5f * uni(), a_log[h] = -1.0f + 0.5f * uni();
    for (uint32_t y = 0; y < DV; y++) norm_w[y] = 1 + 0.2f * uni();
    const nf_cpu_gdn g = {HK, HV, DK, DV, KC, conv_w, dt_bias, a_log, norm_w, 1e-6f, 0};
    const size_t sf = nf_cpu_gdn_state_floats(&g);
    static double ref0[T0][VD], ref1[T1][VD], S0[HV][DK][DV], S1[HV][DK][DV];
    reference(&in[0], T0, ref0, S0);
    reference(&in[1], T1, ref1, S1);

    static float o0[2][2][T0 * VD], o1[2][2][T1 * VD]; /* [form][threads 1, 3] */
    float *st[2][2];
    for (int th = 0; th < 2; th++) {
        nf_cpu *c;
        nf_error e;
        CHECK(nf_cpu_create(th ? 3 : 1, 256, 256, &c, &e) == NF_OK);
        for (int f = 0; f < 2; f++) {
            st[f][th] = malloc(NS * sf * sizeof(float));
            run(c, f ? 16 : 0, in, o0[f][th], o1[f][th], st[f][th]);
        }
        nf_cpu_free(c);
    }
    const float *S_rec = st[0][0] + (KC - 1) * CONV, *S_chk = st[1][0] + (KC - 1) * CONV;
    const double r0 = rel_d(o0[0][0], &ref0[0][0], T0 * VD), r1 = rel_d(o1[0][0], &ref1[0][0], T1 * VD);
    const double rs = rel_d(S_rec, &S0[0][0][0], HV * DK * DV);
    const double c0 = rel_f(o0[1][0], o0[0][0], T0 * VD), c1 = rel_f(o1[1][0], o1[0][0], T1 * VD);
    const double cs = rel_f(S_chk, S_rec, HV * DK * DV);
    printf("recurrent vs double reference: outputs %.2e / %.2e, final state %.2e\n", r0, r1, rs);
    printf("chunked (16) vs recurrent: outputs %.2e / %.2e, final state %.2e\n", c0, c1, cs);
    CHECK_MSG(r0 <= 2e-6 && r1 <= 2e-6 && rs <= 2e-6, "recurrent vs reference %.3g %.3g %.3g > 2e-6", r0, r1, rs);
    CHECK_MSG(c0 <= 2e-6 && c1 <= 2e-6 && cs <= 2e-6, "chunked vs recurrent %.3g %.3g %.3g > 2e-6", c0, c1, cs);
    for (int f = 0; f < 2; f++) {
        CHECK(memcmp(o0[f][0], o0[f][1], sizeof o0[f][0]) == 0 && memcmp(o1[f][0], o1[f][1], sizeof o1[f][0]) == 0);
        CHECK(memcmp(st[f][0], st[f][1], NS * sf * sizeof(float)) == 0);
        free(st[f][0]);
        free(st[f][1]);
    }
    return nf_test_report();
}

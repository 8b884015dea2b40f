/* The CPU engine on a GGUF in the import-only codecs: tests/fixtures/gguf/qwen3moe_lowbit.gguf
 * (tests/oracle/gguf_fixture.py: q2_k expert gate/up, iq4_nl expert down, iq4_xs/q3_k attention,
 * q3_k embedding, q6_k head, ...), converted with recipe `source` (carried over as it is), against
 * its f32 twin: an artifact with the same metadata whose every tensor is f32 holding gguf-py's
 * dequantization of the source (the fixture's .expected.safetensors), run through the same engine.
 *
 * Both models hold the same weight values bit for bit (test_convert_gguf checks the carried-over
 * tensors decode to exactly gguf-py's values), so the logits differ only by f32 summation order:
 * the q2_k/q3_k/iq4 kernels factor the block scales out of each partial sum (d*sc * sum(q x))
 * where the f32 kernels sum the decoded products. Per dot that is at most about (B + n/8 + 20) u
 * of sum|w x| (docs/codecs.md, SIMD tolerance; n <= 256, B = 256: 4e-5 worst case, typically 100x
 * less), compounded over 2 layers of about six products and the attention softmax; rel-L2 <= 1e-4
 * per position is the bound test_oracle_tiny uses for the same situation. Checked:
 *   - prefill logits of every prompt position (chunks of 4: several tiles, attention across them);
 *   - a 16-token greedy continuation, one decode step at a time (the SIMD matvec path), equal
 *     tokens and each step's logits within the bound, all finite;
 *   - the fast path vs the reference path (dequantize + double dot) on the quantized artifact.
 * Those run with f32 activations (no_a8). With the default int8 activations (into the q6_k head and
 * the other q8_0 / k-quant products) the logits may move further: every position within
 * sqrt(4 L + 1) sqrt(32) / 254 (L = 2) of the reference path (tests/engine/test_oracle_tiny.c argues
 * it), and the greedy tokens are printed. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "format/artifact.h"
#include "format/safetensors.h"
#include "nf_test.h"
#include "common/engine_fixture.h"

#define FIX NF_TEST_DATA "/fixtures/gguf/"

enum { P = 13, G = 16 };

/* One metadata entry of a into w, whatever its type. */
static nf_status copy_meta(nf_artifact_writer *w, const nf_meta *m, nf_error *e)
{
    switch (m->type) {
    case NF_META_U32: return nf_artifact_writer_add_u32(w, m->key, m->v.u32, e);
    case NF_META_I32: return nf_artifact_writer_add_i32(w, m->key, m->v.i32, e);
    case NF_META_U64: return nf_artifact_writer_add_u64(w, m->key, m->v.u64, e);
    case NF_META_I64: return nf_artifact_writer_add_i64(w, m->key, m->v.i64, e);
    case NF_META_F32: return nf_artifact_writer_add_f32(w, m->key, m->v.f32, e);
    case NF_META_F64: return nf_artifact_writer_add_f64(w, m->key, m->v.f64, e);
    case NF_META_BOOL: return nf_artifact_writer_add_bool(w, m->key, m->v.b, e);
    case NF_META_STRING: return nf_artifact_writer_add_strn(w, m->key, m->str, (size_t)m->count, e);
    case NF_META_ARRAY:
        if (m->elem_type == NF_META_STRING)
            return nf_artifact_writer_add_str_array(w, m->key, m->strs, m->str_lens, (size_t)m->count, e);
        return nf_artifact_writer_add_array(w, m->key, m->elem_type, m->elems, (size_t)m->count, e);
    }
    return nf_error_set(e, NF_ERR_INTERNAL, "metadata '%s': unknown type", m->key);
}

/* The f32 twin of the artifact at src: its metadata, and every tensor as f32 from the oracle. */
static int write_f32_twin(const char *src, const char *oracle, const char *out)
{
    nf_artifact *a = NULL;
    nf_safetensors *ex = NULL;
    nf_artifact_writer *w = NULL;
    nf_error e = {0};
    nf_status s = nf_artifact_open(src, &a, &e);
    if (!s) s = nf_safetensors_open(oracle, &ex, &e);
    if (!s) s = nf_artifact_writer_open(out, &w, &e);
    for (size_t i = 0; !s && i < nf_artifact_n_meta(a); i++) s = copy_meta(w, nf_artifact_meta(a, i), &e);
    for (size_t i = 0; !s && i < nf_artifact_n_tensors(a); i++) {
        const nf_tensor *t = nf_artifact_tensor(a, i);
        const nf_st_tensor *x = nf_safetensors_find(ex, t->desc.name);
        if (!x || x->dtype != NF_ST_F32 || x->nbytes != t->layout.rows * t->layout.cols * 4) {
            s = nf_error_set(&e, NF_ERR_FORMAT, "%s: no f32 oracle of its size", t->desc.name);
            break;
        }
        nf_tensor_desc d = t->desc;
        d.codec = NF_CODEC_F32;
        s = nf_artifact_writer_add_tensor(w, &d, x->data, x->nbytes, &e);
    }
    if (!s) s = nf_artifact_writer_finish(w, &e);
    else nf_artifact_writer_abort(w);
    nf_safetensors_close(ex);
    nf_artifact_close(a);
    CHECK_MSG(s == NF_OK, "f32 twin: %s", e.msg);
    return s == NF_OK;
}

static int all_finite(const float *a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(a[i])) return 0;
    return 1;
}

int main(void)
{
    char dir[] = "/tmp/nf_gguf_lowbit_XXXXXX", q[256], f[256];
    if (!mkdtemp(dir)) return 1;
    snprintf(q, sizeof q, "%s/lowbit.nf", dir);
    snprintf(f, sizeof f, "%s/lowbit-f32.nf", dir);
    enum { V = 32 }; /* the fixture's vocabulary */
    static float pre[4][P * V], gl[4][G * V];
    static int32_t greedy[4][G];
    const int32_t ids[P] = {1, 14, 3, 17, 5, 9, 26, 2, 31, 8, 0, 20, 11};
    if (fx_convert(FIX "qwen3moe_lowbit.gguf", "source", q) &&
        write_f32_twin(q, FIX "qwen3moe_lowbit.expected.safetensors", f)) {
        fx_run_greedy(q, FX_FAST_F32, 4, ids, P, G, pre[0], greedy[0], gl[0]); /* quantized, fast kernels */
        fx_run_greedy(q, 1, 4, ids, P, G, pre[1], greedy[1], gl[1]); /* quantized, reference path */
        fx_run_greedy(f, FX_FAST_F32, 4, ids, P, G, pre[2], greedy[2], gl[2]); /* f32 twin */
        fx_run_greedy(q, FX_FAST, 4, ids, P, G, pre[3], greedy[3], gl[3]); /* int8 activations */
        const double a8p = fx_worst_rows(pre[3], pre[1], P, V), a8b = sqrt(4.0 * 2 + 1) * 5.656854 / 254;
        size_t a8same = 0;
        while (a8same < G && greedy[3][a8same] == greedy[1][a8same]) a8same++;
        printf("int8 activations vs the reference path: prefill rel-L2 (worst position) %.2e (bound %.2e), greedy "
               "%zu/%d tokens equal\n", a8p, a8b, a8same, G);
        CHECK_MSG(a8p <= a8b && all_finite(pre[3], P * V), "int8 activations: prefill rel-L2 %.3g > %.3g", a8p, a8b);
        CHECK_MSG(all_finite(pre[0], P * V) && all_finite(gl[0], G * V), "non-finite logits");
        const double wp = fx_worst_rows(pre[0], pre[2], P, V), wg = fx_worst_rows(gl[0], gl[2], G, V);
        const double rp = fx_worst_rows(pre[0], pre[1], P, V), rg = fx_worst_rows(gl[0], gl[1], G, V);
        size_t same = 0;
        while (same < G && greedy[0][same] == greedy[2][same]) same++;
        printf("qwen3moe_lowbit vs its f32 twin: prefill rel-L2 (worst position) %.2e, decode %.2e, greedy %zu/%d "
               "tokens equal; fast vs reference path: prefill %.2e, decode %.2e\n",
               wp, wg, same, G, rp, rg);
        CHECK_MSG(wp <= 1e-4, "prefill logits vs the f32 twin: rel-L2 %.3g > 1e-4", wp);
        CHECK_MSG(wg <= 1e-4, "greedy-step logits vs the f32 twin: rel-L2 %.3g > 1e-4", wg);
        CHECK_MSG(same == G, "greedy continuation differs from the f32 twin's at token %zu", same);
        CHECK_MSG(rp <= 1e-4 && rg <= 1e-4, "fast vs reference path: %.3g / %.3g > 1e-4", rp, rg);
        /* the logits are not degenerate: they vary over the vocabulary */
        double sd = 0, mean = 0;
        for (int i = 0; i < V; i++) mean += pre[0][(P - 1) * V + i] / V;
        for (int i = 0; i < V; i++) sd += pow(pre[0][(P - 1) * V + i] - mean, 2) / V;
        CHECK_MSG(sqrt(sd) > 1e-3, "last position's logits are flat (sd %.3g)", sqrt(sd));
    }
    remove(q);
    remove(f);
    rmdir(dir);
    return nf_test_report();
}

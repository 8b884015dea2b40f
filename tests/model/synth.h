/* A small random model artifact written with the artifact writer, for model and engine tests that
 * do not need an outside oracle (load errors, invariances of the forward). Included by one test
 * file each (static functions). */
#ifndef NF_TEST_SYNTH_H
#define NF_TEST_SYNTH_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/artifact.h"

typedef struct synth_opts {
    const char *arch;      /* "llama", "qwen2_moe", "qwen3_moe", "qwen3_next" (layer 0 GDN, 1 gated attention) */
    nf_codec_id codec;     /* of the matrices */
    const char *skip;      /* a tensor name to leave out */
    const char *bend;      /* a tensor name written with one row too many */
    uint32_t seed;
    int bad_hybrid;        /* qwen3_next: 1 model.linear_layers one entry long, 2 ssm_v_heads 3 (not a
                            * multiple of ssm_k_heads) */
} synth_opts;

enum { SY_H = 64, SY_L = 2, SY_HEADS = 4, SY_KV = 2, SY_HD = 16, SY_V = 96, SY_D = 96, SY_E = 4, SY_K = 2, SY_I = 32,
       SY_S = 32, SY_HK = 2, SY_HV = 4, SY_DK = 8, SY_DV = 8, SY_CONV = 2 * SY_HK * SY_DK + SY_HV * SY_DV };

/* The hybrid's keys (qwen3_next): layer 0 Gated DeltaNet, layer 1 gated attention with rotary on 4 of 16. */
static int synth_hybrid_keys(nf_artifact_writer *w, const synth_opts *o)
{
    const int32_t lin[SY_L] = {1, 0};
    return !nf_artifact_writer_add_array(w, "model.linear_layers", NF_META_I32, lin, o->bad_hybrid == 1 ? 1 : SY_L,
                                         NULL) &&
           !nf_artifact_writer_add_u32(w, "model.rope_dim", 4, NULL) &&
           !nf_artifact_writer_add_bool(w, "model.attn_gate", 1, NULL) &&
           !nf_artifact_writer_add_u32(w, "model.ssm_k_heads", SY_HK, NULL) &&
           !nf_artifact_writer_add_u32(w, "model.ssm_v_heads", o->bad_hybrid == 2 ? 3 : SY_HV, NULL) &&
           !nf_artifact_writer_add_u32(w, "model.ssm_k_dim", SY_DK, NULL) &&
           !nf_artifact_writer_add_u32(w, "model.ssm_v_dim", SY_DV, NULL) &&
           !nf_artifact_writer_add_u32(w, "model.ssm_conv", 4, NULL);
}

static uint64_t synth_rng;
static float synth_rand(void)
{
    synth_rng = synth_rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((double)(synth_rng >> 11) * 0x1.0p-53 * 2 - 1);
}

static int synth_tensor(nf_artifact_writer *w, const synth_opts *o, const char *name, int f32, float scale, float bias,
                        uint32_t n, uint64_t d0, uint64_t d1, uint64_t d2)
{
    if (o->skip && strcmp(o->skip, name) == 0) return 1;
    nf_tensor_desc d = {.name = name, .codec = f32 ? NF_CODEC_F32 : o->codec, .n_dims = n};
    uint64_t dims[3] = {d0, d1, d2};
    for (uint32_t i = 0; i < n; i++) d.dims[i] = dims[i];
    if (o->bend && strcmp(o->bend, name) == 0) d.dims[0]++;
    uint64_t rows = 1, cols = d.dims[n - 1];
    for (uint32_t i = 0; i + 1 < n; i++) rows *= d.dims[i];
    const nf_codec *c = nf_codec_get(d.codec);
    size_t rb = nf_codec_row_bytes(c, cols);
    uint8_t *buf = malloc(rows * rb);
    float *row = malloc(cols * sizeof(float));
    for (uint64_t r = 0; r < rows; r++) {
        for (uint64_t i = 0; i < cols; i++) row[i] = bias + scale * synth_rand();
        c->quantize_row(row, buf + r * rb, cols);
    }
    nf_error e;
    nf_status st = nf_artifact_writer_add_tensor(w, &d, buf, rows * rb, &e);
    if (st) fprintf(stderr, "synth: %s: %s\n", name, e.msg);
    free(buf);
    free(row);
    return st == NF_OK;
}

/* Writes the model; returns 1 on success. */
static int synth_write(const char *path, const synth_opts *o)
{
    synth_rng = 0x9e3779b97f4a7c15ULL ^ o->seed;
    nf_artifact_writer *w;
    nf_error e;
    if (nf_artifact_writer_open(path, &w, &e)) {
        fprintf(stderr, "synth: %s\n", e.msg);
        return 0;
    }
    nf_artifact_writer_set_alignment(w, 64, NULL);
    const int hy = strcmp(o->arch, "qwen3_next") == 0, moe = strcmp(o->arch, "llama") != 0,
              q2 = strcmp(o->arch, "qwen2_moe") == 0 || hy, q3 = strcmp(o->arch, "qwen3_moe") == 0;
    int32_t moe_layers[SY_L] = {moe, moe && (!q2 || hy)}; /* qwen2: layer 1 dense */
    int ok = !nf_artifact_writer_add_str(w, "model.arch", o->arch, NULL) &&
             !nf_artifact_writer_add_u32(w, "model.hidden", SY_H, NULL) &&
             !nf_artifact_writer_add_u32(w, "model.layers", SY_L, NULL) &&
             !nf_artifact_writer_add_u32(w, "model.heads", SY_HEADS, NULL) &&
             !nf_artifact_writer_add_u32(w, "model.kv_heads", SY_KV, NULL) &&
             !nf_artifact_writer_add_u32(w, "model.head_dim", SY_HD, NULL) &&
             !nf_artifact_writer_add_u32(w, "model.vocab", SY_V, NULL) &&
             !nf_artifact_writer_add_f32(w, "model.rms_eps", 1e-6f, NULL) &&
             !nf_artifact_writer_add_f64(w, "model.rope_theta", 10000.0, NULL) &&
             !nf_artifact_writer_add_str(w, "model.rope_scaling", "none", NULL) &&
             !nf_artifact_writer_add_f32(w, "model.rope_factor", 1.0f, NULL) &&
             !nf_artifact_writer_add_u32(w, "model.rope_orig_ctx", 0, NULL) &&
             !nf_artifact_writer_add_u32(w, "model.max_ctx", 256, NULL) &&
             !nf_artifact_writer_add_bool(w, "model.tie_embeddings", !q3, NULL) &&
             !nf_artifact_writer_add_bool(w, "model.qkv_bias", q2 && !hy, NULL) &&
             !nf_artifact_writer_add_bool(w, "model.qk_norm", q3 || hy, NULL) &&
             !nf_artifact_writer_add_u32(w, "model.dense_inter", SY_D, NULL) &&
             !nf_artifact_writer_add_u32(w, "model.experts", moe ? SY_E : 0, NULL) &&
             !nf_artifact_writer_add_u32(w, "model.top_k", moe ? SY_K : 0, NULL) &&
             !nf_artifact_writer_add_u32(w, "model.moe_inter", moe ? SY_I : 0, NULL) &&
             !nf_artifact_writer_add_u32(w, "model.shared_inter", q2 ? SY_S : 0, NULL) &&
             !nf_artifact_writer_add_bool(w, "model.norm_topk", q3, NULL) &&
             !nf_artifact_writer_add_array(w, "model.moe_layers", NF_META_I32, moe_layers, SY_L, NULL) &&
             (!hy || synth_hybrid_keys(w, o));
    const uint64_t H = SY_H, Q = SY_HEADS * SY_HD, KV = SY_KV * SY_HD;
    ok = ok && synth_tensor(w, o, "token_embd", 0, 1, 0, 2, SY_V, H, 0) &&
         synth_tensor(w, o, "output_norm", 1, 0.2f, 1, 1, H, 0, 0);
    if (q3) ok = ok && synth_tensor(w, o, "output", 0, 0.3f, 0, 2, SY_V, H, 0);
    char nm[64];
#define T(suffix, f32, sc, b, n, a0, a1, a2) \
    (snprintf(nm, sizeof nm, "blk.%d.%s", l, suffix), synth_tensor(w, o, nm, f32, sc, b, n, a0, a1, a2))
    for (int l = 0; ok && l < SY_L; l++) {
        ok = T("attn_norm", 1, 0.2f, 1, 1, H, 0, 0) && T("ffn_norm", 1, 0.2f, 1, 1, H, 0, 0);
        if (ok && hy && l == 0) /* Gated DeltaNet */
            ok = T("ssm_qkv", 0, 0.25f, 0, 2, SY_CONV, H, 0) && T("ssm_z", 0, 0.25f, 0, 2, SY_HV * SY_DV, H, 0) &&
                 T("ssm_ba", 0, 0.25f, 0, 2, 2 * SY_HV, H, 0) && T("ssm_conv", 1, 0.3f, 0, 2, SY_CONV, 4, 0) &&
                 T("ssm_dt_bias", 1, 0.3f, 0, 1, SY_HV, 0, 0) && T("ssm_a_log", 1, 0.3f, 0, 1, SY_HV, 0, 0) &&
                 T("ssm_norm", 1, 0.2f, 1, 1, SY_DV, 0, 0) && T("ssm_out", 0, 0.15f, 0, 2, H, SY_HV * SY_DV, 0);
        else if (ok)
            ok = T("attn_q", 0, 0.25f, 0, 2, Q, H, 0) && T("attn_k", 0, 0.25f, 0, 2, KV, H, 0) &&
                 T("attn_v", 0, 0.25f, 0, 2, KV, H, 0) && T("attn_output", 0, 0.15f, 0, 2, H, Q, 0) &&
                 (!hy || (T("attn_gate", 0, 0.25f, 0, 2, Q, H, 0) && T("attn_q_norm", 1, 0.2f, 1, 1, SY_HD, 0, 0) &&
                          T("attn_k_norm", 1, 0.2f, 1, 1, SY_HD, 0, 0)));
        if (ok && q2 && !hy)
            ok = T("attn_q_bias", 1, 0.3f, 0, 1, Q, 0, 0) && T("attn_k_bias", 1, 0.3f, 0, 1, KV, 0, 0) &&
                 T("attn_v_bias", 1, 0.3f, 0, 1, KV, 0, 0);
        if (ok && q3) ok = T("attn_q_norm", 1, 0.2f, 1, 1, SY_HD, 0, 0) && T("attn_k_norm", 1, 0.2f, 1, 1, SY_HD, 0, 0);
        if (ok && moe_layers[l]) {
            ok = T("ffn_gate_inp", 0, 0.6f, 0, 2, SY_E, H, 0) && T("ffn_gate_up_exps", 0, 0.2f, 0, 3, SY_E, 2 * SY_I, H) &&
                 T("ffn_down_exps", 0, 0.2f, 0, 3, SY_E, H, SY_I);
            if (ok && q2)
                ok = T("ffn_gate_up_shexp", 0, 0.2f, 0, 2, 2 * SY_S, H, 0) && T("ffn_down_shexp", 0, 0.2f, 0, 2, H, SY_S, 0) &&
                     T("ffn_gate_inp_shexp", 0, 0.3f, 0, 1, H, 0, 0);
        } else if (ok) {
            ok = T("ffn_gate", 0, 0.2f, 0, 2, SY_D, H, 0) && T("ffn_up", 0, 0.2f, 0, 2, SY_D, H, 0) &&
                 T("ffn_down", 0, 0.15f, 0, 2, H, SY_D, 0);
        }
    }
#undef T
    if (!ok) {
        nf_artifact_writer_abort(w);
        return 0;
    }
    if (nf_artifact_writer_finish(w, &e)) {
        fprintf(stderr, "synth: %s\n", e.msg);
        return 0;
    }
    return 1;
}

#endif

/* Synthetic model artifacts (synth.h, docs/synth.md). */
#include "convert/synth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fnv.h"
#include "base/parallel.h"
#include "base/timer.h"
#include "codec/nvfp4.h"
#include "convert/modelmeta.h"
#include "convert/recipe.h"
#include "format/artifact.h"

/* ---- geometries -------------------------------------------------------------------------------- */

/* Figures from the published config.json files:
 * - Qwen/Qwen3-30B-A3B (Qwen3MoeForCausalLM): hidden_size 2048, num_hidden_layers 48,
 *   num_attention_heads 32, num_key_value_heads 4, head_dim 128, num_experts 128,
 *   num_experts_per_tok 8, moe_intermediate_size 768, intermediate_size 6144, vocab_size 151936,
 *   rope_theta 1e6, rms_norm_eps 1e-6, max_position_embeddings 40960, norm_topk_prob true,
 *   tie_word_embeddings false, mlp_only_layers [] with decoder_sparse_step 1 (every layer MoE),
 *   q/k RMSNorm (qwen3_moe), no attention bias, no shared expert.
 * - Qwen/Qwen2-57B-A14B (Qwen2MoeForCausalLM): hidden_size 3584, num_hidden_layers 28,
 *   num_attention_heads 28 (head_dim 3584/28 = 128), num_key_value_heads 4, num_experts 64,
 *   num_experts_per_tok 8, moe_intermediate_size 2560, shared_expert_intermediate_size 20480,
 *   intermediate_size 18944, vocab_size 151936, rope_theta 1e6, rms_norm_eps 1e-6,
 *   max_position_embeddings 32768, norm_topk_prob false, tie_word_embeddings false, q/k/v bias.
 * - Qwen/Qwen3.5-35B-A3B, MoE part only ("qwen3.5-35b-a3b-moe", issue 8): 40 layers, hidden 2048,
 *   256 experts, 8 routed + 1 shared, expert and shared intermediate 512, vocab 248320 (padded).
 *   Its 3:1 Gated DeltaNet / gated-attention stack has no counterpart in our schema: every layer
 *   here is plain GQA attention of the gated-attention layers' shape (16 q heads, 2 kv heads,
 *   head_dim 256, full RoPE, theta 1e7 assumed). The architecture is qwen2_moe, the one of our
 *   schema (and of both engines) with a shared expert and its sigmoid gate (Qwen3-Next/3.5's
 *   shared expert has the same gate); as the schema has it for qwen2_moe, q/k/v carry biases and
 *   there is no q/k norm. norm_topk_prob true (Qwen3-Next's sparse block).
 * - Qwen/Qwen3.5-35B-A3B whole ("qwen3.5-35b-a3b", arch qwen3_5_moe; transformers'
 *   Qwen3_5MoeTextConfig defaults, which are that model's text config): the geometry above, plus 3 of
 *   every 4 layers Gated DeltaNet (linear_num_key_heads 16, linear_num_value_heads 32, key and value
 *   head dims 128, conv kernel 4), the other 10 gated attention with partial rotary 0.25 (64 of 256
 *   dims), q/k norm, no biases, rope_theta 1e7. The MoE-only stand-in above is "qwen3.5-35b-a3b-moe" (the
 *   earlier GPU benchmarks' model, "qwen3.5-35b-a3b" before the whole model took the name; the whole
 *   model was "qwen3.5-35b-a3b-hybrid" in the logs of 2026-12-06 .. 07).
 * - Qwen/Qwen3-Next-80B-A3B ("qwen3-next-80b-a3b", arch qwen3_next; Qwen3NextConfig defaults): 48
 *   layers, hidden 2048, 512 experts top-10, expert and shared intermediate 512, vocab 151936, the
 *   same GDN / gated-attention shapes, rope_theta 1e7 (the published config's; the class default is
 *   10000), max_position_embeddings 262144.
 * - tiny, tiny-qwen2: a second on the CPU, for tests; rows are multiples of 256 so every k-quant of
 *   the recipes applies without fallback, and nvfp4 sources are whole 128-row tiles. tiny has E = 8
 *   (the recipe table's E == 8 rule), tiny-qwen2 ties its embeddings and has a shared expert. */
static const nf_synth_geometry geometries[] = {
#define NO_GDN 0, 0, 0, 0, 0, 0, 0
    {"qwen3-30b-a3b", "qwen3_moe", 2048, 48, 32, 4, 128, 151936, 128, 8, 768, 0, 6144, 40960, 1e6, 1e-6f, 0, 0, 1, 1, NO_GDN},
    {"qwen3.5-35b-a3b-moe", "qwen2_moe", 2048, 40, 16, 2, 256, 248320, 256, 8, 512, 512, 0, 262144, 1e7, 1e-6f, 0, 1, 0, 1, NO_GDN},
    {"qwen3.5-35b-a3b", "qwen3_5_moe", 2048, 40, 16, 2, 256, 248320, 256, 8, 512, 512, 0, 262144, 1e7, 1e-6f, 0, 0, 1,
     1, 4, 64, 16, 32, 128, 128, 4},
    {"qwen3-next-80b-a3b", "qwen3_next", 2048, 48, 16, 2, 256, 151936, 512, 10, 512, 512, 0, 262144, 1e7, 1e-6f, 0, 0, 1, 1,
     4, 64, 16, 32, 128, 128, 4},
    {"qwen2-57b-a14b", "qwen2_moe", 3584, 28, 28, 4, 128, 151936, 64, 8, 2560, 20480, 18944, 32768, 1e6, 1e-6f, 0, 1, 0, 0, NO_GDN},
    {"tiny", "qwen3_moe", 256, 2, 4, 2, 64, 512, 8, 2, 256, 0, 0, 1024, 1e6, 1e-6f, 0, 0, 1, 1, NO_GDN},
    {"tiny-qwen2", "qwen2_moe", 256, 2, 4, 2, 64, 512, 4, 2, 256, 256, 0, 1024, 1e6, 1e-6f, 1, 1, 0, 0, NO_GDN},
    /* a hybrid a second on the CPU: layers 0-2 GDN, 3 gated attention (with --layers 4) */
    {"tiny-hybrid", "qwen3_next", 256, 4, 2, 1, 128, 512, 4, 2, 256, 256, 0, 1024, 1e7, 1e-6f, 0, 0, 1, 1, 4, 32, 2, 4,
     64, 64, 4},
#undef NO_GDN
};

const nf_synth_geometry *nf_synth_geometry_find(const char *name)
{
    for (size_t i = 0; name && i < sizeof geometries / sizeof geometries[0]; i++)
        if (strcmp(geometries[i].name, name) == 0) return &geometries[i];
    return NULL;
}

const char *nf_synth_geometry_names(void)
{
    static char names[256]; /* from the table, so it cannot go stale */
    if (!names[0])
        for (size_t i = 0, at = 0; i < sizeof geometries / sizeof geometries[0] && at < sizeof names; i++)
            at += (size_t)snprintf(names + at, sizeof names - at, "%s%s", i ? ", " : "", geometries[i].name);
    return names;
}

static int is_linear(const nf_synth_geometry *g, uint32_t l) { return g->attn_every && (l + 1) % g->attn_every != 0; }

/* ---- codecs: the converter's recipe table (recipe.h) -------------------------------------------- */

/* The recipes synth writes: every one but "source" (GGUF only). */
static int recipe_ok(const char *r) { return nf_recipe_find(r) && strcmp(r, "source") != 0; }

nf_status nf_synth_codec(const char *recipe, const char *name, uint32_t layers, uint32_t experts, int tied,
                         uint64_t cols, nf_codec_id *out, int *fallback, nf_error *err)
{
    char note[256];
    if (!recipe_ok(recipe))
        return nf_error_set(err, NF_ERR_INVALID_ARG, "unknown recipe '%s' (bf16, q8q8, q4q6, q4q5, nvfp4)%s",
                            recipe ? recipe : "(null)", recipe ? nf_recipe_codec_note(recipe, note, sizeof note) : "");
    int layer, r = nf_recipe_role_of(name, &layer);
    if (r < 0) return nf_error_set(err, NF_ERR_INVALID_ARG, "'%s' is not a tensor name of docs/model_schema.md", name);
    const nf_recipe_model m = {layers, experts, tied};
    *out = nf_recipe_fit(nf_recipe_codec(nf_recipe_find(recipe), (nf_role)r, layer, &m), cols, fallback);
    return NF_OK;
}

/* ---- random values ----------------------------------------------------------------------------- */

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

#define GOLDEN 0x9e3779b97f4a7c15ULL

/* Every row has its own stream, keyed by (seed, tensor name, row): any thread may fill any row. */
static uint64_t row_key(uint64_t tensor_key, uint64_t row) { return mix64(tensor_key ^ mix64(row * GOLDEN + 1)); }

/* x[i] ~ N(0, std^2), approximately: the sum of the four 16-bit parts of a splitmix64 output
 * (Irwin-Hall of 4), centred and scaled to unit variance. */
static void fill_normal(float *x, size_t n, uint64_t key, float std)
{
    const float k = std / 37837.2273f; /* sqrt(4 * (65536^2 - 1) / 12): the sd of the sum */
    uint64_t s = key;
    for (size_t i = 0; i < n; i++) {
        uint64_t z = mix64(s += GOLDEN);
        int sum = (int)(z & 0xffff) + (int)((z >> 16) & 0xffff) + (int)((z >> 32) & 0xffff) + (int)(z >> 48);
        x[i] = (float)(sum - 131070) * k;
    }
}

/* ---- the tensor list --------------------------------------------------------------------------- */

enum { K_ONES = 0, K_NORMAL, K_BANK };

typedef struct spec {
    char name[48];
    nf_codec_id codec;
    uint32_t n_dims;
    uint64_t dims[3];  /* outermost first */
    int kind;          /* K_ONES (f32 1), K_NORMAL (rows ~ N(0, std^2)), K_BANK ([E][R][C] or nvfp4 [R][C], std) */
    float std;
    uint32_t sources;  /* banks: source matrices per expert stacked in R (gate_up 2, down 1) */
} spec;

typedef struct plan {
    spec *t;
    size_t n, cap;
} plan;

static nf_status add(plan *p, const nf_synth_geometry *g, const char *recipe, const char *name, int kind, float std,
                     uint32_t n_dims, uint64_t d0, uint64_t d1, uint64_t d2, nf_error *err)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 64;
        spec *t = realloc(p->t, cap * sizeof *t);
        if (!t) return nf_error_set(err, NF_ERR_NOMEM, "out of memory");
        p->t = t;
        p->cap = cap;
    }
    spec *s = &p->t[p->n];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    const uint64_t d[3] = {d0, d1, d2};
    s->n_dims = n_dims;
    memcpy(s->dims, d, sizeof d);
    s->std = std;
    nf_status st = nf_synth_codec(recipe, name, g->layers, g->experts, g->tie, d[n_dims - 1], &s->codec, NULL, err);
    /* the nvfp4 shared expert is a bank of one, its gate and up quantized apart as the converter does */
    s->kind = kind == K_NORMAL && n_dims == 2 && s->codec == NF_CODEC_NVFP4 ? K_BANK : kind;
    s->sources = s->kind == K_BANK && strstr(name, "gate_up") ? 2 : 1;
    if (!st) p->n++;
    return st;
}

#define STD 0.02f /* transformers' initializer_range for every Qwen MoE config */

/* A tensor of the block whose names start with pre ("blk.3." or the MTP block's "mtp.blk.0.") */
#define A(suffix, kind, std, n, a, b, c) \
    (snprintf(nm, sizeof nm, "%s%s", pre, suffix), add(p, g, recipe, nm, kind, std, n, a, b, c, err))

/* A block's attention (gated for the hybrids) and its two norms. */
static nf_status plan_attention(const nf_synth_geometry *g, const char *recipe, const char *pre, plan *p, nf_error *err)
{
    const uint64_t H = g->hidden, Q = (uint64_t)g->heads * g->head_dim, KV = (uint64_t)g->kv_heads * g->head_dim;
    char nm[48];
    nf_status st;
    if ((st = A("attn_norm", K_ONES, 0, 1, H, 0, 0)) || (st = A("attn_q", K_NORMAL, STD, 2, Q, H, 0)) ||
        (st = A("attn_k", K_NORMAL, STD, 2, KV, H, 0)) || (st = A("attn_v", K_NORMAL, STD, 2, KV, H, 0)))
        return st;
    if (g->qkv_bias && ((st = A("attn_q_bias", K_NORMAL, STD, 1, Q, 0, 0)) ||
                        (st = A("attn_k_bias", K_NORMAL, STD, 1, KV, 0, 0)) ||
                        (st = A("attn_v_bias", K_NORMAL, STD, 1, KV, 0, 0))))
        return st;
    if (g->qk_norm && ((st = A("attn_q_norm", K_ONES, 0, 1, g->head_dim, 0, 0)) ||
                       (st = A("attn_k_norm", K_ONES, 0, 1, g->head_dim, 0, 0))))
        return st;
    if (g->attn_every && (st = A("attn_gate", K_NORMAL, STD, 2, Q, H, 0))) return st;
    if ((st = A("attn_output", K_NORMAL, STD, 2, H, Q, 0))) return st;
    return A("ffn_norm", K_ONES, 0, 1, H, 0, 0);
}

/* A block's Gated DeltaNet mixer and its two norms: dt_bias 1 (transformers' init), A_log ~ 0
 * (a decay of exp(-softplus(a + 1)) per token), the conv kernel N(0, 0.2^2). */
static nf_status plan_gdn(const nf_synth_geometry *g, const char *recipe, const char *pre, plan *p, nf_error *err)
{
    const uint64_t H = g->hidden, Hv = g->ssm_v_heads, Vd = Hv * g->ssm_v_dim,
                   conv = 2ull * g->ssm_k_heads * g->ssm_k_dim + Vd;
    char nm[48];
    nf_status st;
    if ((st = A("attn_norm", K_ONES, 0, 1, H, 0, 0)) || (st = A("ssm_qkv", K_NORMAL, STD, 2, conv, H, 0)) ||
        (st = A("ssm_z", K_NORMAL, STD, 2, Vd, H, 0)) || (st = A("ssm_ba", K_NORMAL, STD, 2, 2 * Hv, H, 0)) ||
        (st = A("ssm_conv", K_NORMAL, 0.2f, 2, conv, g->ssm_conv, 0)) || (st = A("ssm_dt_bias", K_ONES, 0, 1, Hv, 0, 0)) ||
        (st = A("ssm_a_log", K_NORMAL, STD, 1, Hv, 0, 0)) || (st = A("ssm_norm", K_ONES, 0, 1, g->ssm_v_dim, 0, 0)) ||
        (st = A("ssm_out", K_NORMAL, STD, 2, H, Vd, 0)))
        return st;
    return A("ffn_norm", K_ONES, 0, 1, H, 0, 0);
}

/* A block's MoE. */
static nf_status plan_moe(const nf_synth_geometry *g, const char *recipe, const char *pre, plan *p, nf_error *err)
{
    const uint64_t H = g->hidden, E = g->experts, I = g->moe_inter, S = g->shared_inter;
    const float router_std = 2.0f / sqrtf((float)H);
    char nm[48];
    nf_status st;
    if ((st = A("ffn_gate_inp", K_NORMAL, router_std, 2, E, H, 0)) ||
        (st = A("ffn_gate_up_exps", K_BANK, STD, 3, E, 2 * I, H)) || (st = A("ffn_down_exps", K_BANK, STD, 3, E, H, I)))
        return st;
    if (S && ((st = A("ffn_gate_up_shexp", K_NORMAL, STD, 2, 2 * S, H, 0)) ||
              (st = A("ffn_down_shexp", K_NORMAL, STD, 2, H, S, 0)) ||
              (st = A("ffn_gate_inp_shexp", K_NORMAL, STD, 1, H, 0, 0))))
        return st;
    return NF_OK;
}

/* The hybrids' MTP block (docs/hybrid.md "MTP"), as the published Qwen3.5 and Qwen3-Next checkpoints
 * carry one: mtp.fc over [normed embedding | normed hidden], its three norms, and one gated-attention
 * + MoE layer, so `--spec mtp:K` runs on the whole synthetic models. */
static nf_status plan_mtp(const nf_synth_geometry *g, const char *recipe, plan *p, nf_error *err)
{
    const uint64_t H = g->hidden;
    const char *pre = "mtp.";
    char nm[48];
    nf_status st;
    if ((st = A("fc", K_NORMAL, STD, 2, H, 2 * H, 0)) || (st = A("norm_embd", K_ONES, 0, 1, H, 0, 0)) ||
        (st = A("norm_hidden", K_ONES, 0, 1, H, 0, 0)) || (st = A("output_norm", K_ONES, 0, 1, H, 0, 0)))
        return st;
    return (st = plan_attention(g, recipe, "mtp.blk.0.", p, err)) ? st : plan_moe(g, recipe, "mtp.blk.0.", p, err);
}
#undef A

/* Every tensor of docs/model_schema.md for geometry g, in the order they are written. */
static nf_status build_plan(const nf_synth_geometry *g, const char *recipe, plan *p, nf_error *err)
{
    const uint64_t H = g->hidden;
    nf_status st = add(p, g, recipe, "token_embd", K_NORMAL, STD, 2, g->vocab, H, 0, err);
    if (!st) st = add(p, g, recipe, "output_norm", K_ONES, 0, 1, H, 0, 0, err);
    if (!st && !g->tie) st = add(p, g, recipe, "output", K_NORMAL, STD, 2, g->vocab, H, 0, err);
    char pre[24];
    for (uint32_t l = 0; !st && l < g->layers; l++) {
        snprintf(pre, sizeof pre, "blk.%u.", l);
        st = is_linear(g, l) ? plan_gdn(g, recipe, pre, p, err) : plan_attention(g, recipe, pre, p, err);
        if (!st) st = plan_moe(g, recipe, pre, p, err);
    }
    return st || !g->attn_every ? st : plan_mtp(g, recipe, p, err);
}

/* ---- writing ----------------------------------------------------------------------------------- */

typedef struct gen {
    const nf_synth_opts *o;
    nf_artifact_writer *w;
    nf_pool *pool;
    int threads;
    float *scratch;    /* [threads][max_cols] */
    size_t max_cols;
    uint8_t *buf;      /* encoded rows of a batch */
    size_t buf_cap;
    uint64_t key;      /* the seed, mixed */
    /* progress */
    size_t i, n;
    uint64_t t0, last, bytes;
} gen;

static void progress(gen *G, const spec *s, int done)
{
    uint64_t now = nf_time_ns();
    const int last = done && G->i + 1 == G->n;
    if (G->o->quiet || (!last && now - G->last < 500000000ull)) return;
    double sec = (double)(now - G->t0) * 1e-9;
    fprintf(stderr, "\rsynth: tensor %zu/%zu %-24s %9.1f MB %7.1f MB/s", G->i + 1, G->n, s->name,
            (double)G->bytes / 1e6, sec > 0 ? (double)G->bytes / 1e6 / sec : 0.0);
    if (last) fputc('\n', stderr);
    G->last = now;
}

static nf_status put(gen *G, const spec *s, const void *p, size_t n, nf_error *err)
{
    nf_status st = nf_artifact_writer_write(G->w, p, n, err);
    G->bytes += n;
    progress(G, s, 0);
    return st;
}

static uint64_t tensor_key(const gen *G, const char *name) { return nf_fnv1a64(name, strlen(name)) ^ G->key; }

/* Encodes rows [r0, r0 + n) of a non-planar tensor into out (rows of rb bytes). */
typedef struct enc_job {
    gen *G;
    const spec *s;
    const nf_codec *c;
    uint64_t key, r0, cols;
    size_t rb;
    uint8_t *out;
} enc_job;

static void enc_rows(void *ctx, size_t begin, size_t end, int worker)
{
    const enc_job *j = ctx;
    float *x = j->G->scratch + (size_t)worker * j->G->max_cols;
    for (size_t i = begin; i < end; i++) {
        if (j->s->kind == K_ONES)
            for (uint64_t k = 0; k < j->cols; k++) x[k] = 1.0f;
        else
            fill_normal(x, j->cols, row_key(j->key, j->r0 + i), j->s->std);
        if (j->s->codec == NF_CODEC_F32) /* bf16 values, as a converted bf16 checkpoint's f32 tensors hold */
            for (uint64_t k = 0; k < j->cols; k++) x[k] = nf_bf16_to_f32(nf_f32_to_bf16(x[k]));
        j->c->quantize_row(x, j->out + i * j->rb, j->cols);
    }
}

static void encode_rows(gen *G, const spec *s, uint64_t r0, size_t n, uint8_t *out)
{
    const nf_codec *c = nf_codec_get(s->codec);
    enc_job j = {G, s, c, tensor_key(G, s->name), r0, s->dims[s->n_dims - 1], 0, out};
    j.rb = nf_codec_row_bytes(c, j.cols);
    nf_parallel_for(G->pool, n, 1, enc_rows, &j);
}

static nf_status grow(gen *G, size_t n, nf_error *err)
{
    if (n <= G->buf_cap) return NF_OK;
    uint8_t *b = realloc(G->buf, n);
    if (!b) return nf_error_set(err, NF_ERR_NOMEM, "out of memory for %zu bytes", n);
    G->buf = b;
    G->buf_cap = n;
    return NF_OK;
}

/* A dense (non-bank) tensor, encoded fresh in batches of about 8 MiB. */
static nf_status write_dense(gen *G, const spec *s, nf_error *err)
{
    uint64_t rows = 1, cols = s->dims[s->n_dims - 1];
    for (uint32_t i = 0; i + 1 < s->n_dims; i++) rows *= s->dims[i];
    const size_t rb = nf_codec_row_bytes(nf_codec_get(s->codec), cols);
    size_t batch = (8u << 20) / rb;
    if (batch < 1) batch = 1;
    nf_status st = grow(G, batch * rb, err);
    for (uint64_t r = 0; !st && r < rows; r += batch) {
        size_t n = (size_t)(rows - r < batch ? rows - r : batch);
        encode_rows(G, s, r, n, G->buf);
        st = put(G, s, G->buf, n * rb, err);
    }
    return st;
}

/* One source matrix of a bank (rows x cols, encoded): block rows, or an nvfp4 plane set with one
 * divisor (its scale plane is a whole number of 128-row tiles, the bank's share of them). */
typedef struct source {
    uint64_t rows, cols;
    size_t rb;          /* block codecs: bytes per row */
    nf_nvfp4_layout l;  /* nvfp4 */
    uint8_t *p;         /* block rows, or the nvfp4 payload (data, scales, divisor) */
    size_t bytes;
} source;

static nf_status source_init(source *src, const spec *s, uint64_t rows, nf_error *err)
{
    memset(src, 0, sizeof *src);
    src->rows = rows;
    src->cols = s->dims[s->n_dims - 1];
    if (s->codec == NF_CODEC_NVFP4) {
        nf_status st = nf_nvfp4_layout_of(rows, src->cols, 1, &src->l, err);
        if (st) return nf_error_prefix(err, "tensor '%s'", s->name);
        src->bytes = src->l.payload_bytes;
    } else {
        src->rb = nf_codec_row_bytes(nf_codec_get(s->codec), src->cols);
        src->bytes = rows * src->rb;
    }
    src->p = calloc(1, src->bytes);
    return src->p ? NF_OK : nf_error_set(err, NF_ERR_NOMEM, "tensor '%s': out of memory for %zu bytes", s->name, src->bytes);
}

typedef struct fill_job {
    gen *G;
    uint64_t key, row0, cols;
    float std, *w;
} fill_job;

static void fill_rows(void *ctx, size_t begin, size_t end, int worker)
{
    (void)worker;
    const fill_job *j = ctx;
    for (size_t i = begin; i < end; i++) fill_normal(j->w + i * j->cols, j->cols, row_key(j->key, j->row0 + i), j->std);
}

/* Source from its own random values: rows row0.. of the bank viewed as [E*R][C]. */
static nf_status source_fresh(gen *G, const spec *s, uint64_t row0, source *src, nf_error *err)
{
    if (s->codec != NF_CODEC_NVFP4) {
        encode_rows(G, s, row0, src->rows, src->p);
        return NF_OK;
    }
    float *w = malloc(src->rows * src->cols * sizeof *w);
    if (!w) return nf_error_set(err, NF_ERR_NOMEM, "tensor '%s': out of memory", s->name);
    fill_job j = {G, tensor_key(G, s->name), row0, src->cols, s->std, w};
    nf_parallel_for(G->pool, src->rows, 16, fill_rows, &j);
    nf_nvfp4_quantize(w, &src->l, src->p); /* divisor = 448*6/amax of this source */
    free(w);
    return NF_OK;
}

/* A random permutation of [0, R) from the stream at *s (Fisher-Yates); *s advances. */
static void shuffle(uint32_t *perm, uint64_t R, uint64_t *s)
{
    for (uint64_t i = 0; i < R; i++) perm[i] = (uint32_t)i;
    for (uint64_t i = R - 1; i > 0; i--) {
        uint64_t k = mix64(*s += GOLDEN) % (i + 1);
        uint32_t t = perm[i];
        perm[i] = perm[k];
        perm[k] = t;
    }
}

/* dst = the rows of `pool` in a random order, each row's blocks rotated by a random count, keyed
 * by (tensor, expert, source). Block codecs rotate whole blocks; nvfp4 rotates 16-element blocks,
 * moving their data bytes and swizzled scale bytes together, and keeps the pool's divisor (the
 * amax, and so 448*6/amax, is unchanged by a permutation). Row m's rotation is the (m+1)-th draw of
 * the stream after the shuffle, so rows are independent and run over the pool. */
typedef struct permute_job {
    const source *pool;
    const nf_codec *c;
    source *dst;
    const uint32_t *perm;
    uint64_t s; /* the stream after the shuffle */
} permute_job;

static void permute_rows(void *ctx, size_t begin, size_t end, int worker)
{
    (void)worker;
    const permute_job *j = ctx;
    const source *pool = j->pool;
    const uint64_t C = pool->cols;
    for (uint64_t m = begin; m < end; m++) {
        const uint64_t draw = mix64(j->s + (m + 1) * GOLDEN);
        if (j->c->id != NF_CODEC_NVFP4) {
            const size_t rb = pool->rb, bb = j->c->block_bytes, nb = rb / bb;
            const size_t rot = (size_t)(draw % nb) * bb;
            const uint8_t *sr = pool->p + j->perm[m] * rb;
            uint8_t *dr = j->dst->p + m * rb;
            memcpy(dr, sr + rot, rb - rot);
            memcpy(dr + rb - rot, sr, rot);
            continue;
        }
        const uint64_t half = C / 2, nk = C / 16, p = j->perm[m], rot = draw % nk;
        const uint8_t *ps = pool->p + pool->l.scale_offset;
        uint8_t *ds = j->dst->p + j->dst->l.scale_offset;
        const uint8_t *sr = pool->p + p * half;
        uint8_t *dr = j->dst->p + m * half;
        memcpy(dr, sr + rot * 8, half - rot * 8);
        memcpy(dr + half - rot * 8, sr, rot * 8);
        for (uint64_t k = 0; k < nk; k++)
            ds[nf_nvfp4_scale_index(m, k, C)] = ps[nf_nvfp4_scale_index(p, (k + rot) % nk, C)];
    }
}

static void source_permute(gen *G, const source *pool, const nf_codec *c, uint64_t key, source *dst, uint32_t *perm)
{
    uint64_t s = key;
    shuffle(perm, pool->rows, &s);
    permute_job j = {pool, c, dst, perm, s};
    nf_parallel_for(G->pool, pool->rows, 64, permute_rows, &j);
    if (c->id == NF_CODEC_NVFP4) memcpy(dst->p + dst->l.divisor_offset, pool->p + pool->l.divisor_offset, 4);
}

typedef struct bank_out {
    nf_nvfp4_layout l;  /* of the whole bank (nvfp4) */
    uint8_t *scales;    /* [l.scale_bytes] */
    float *divisors;    /* [l.divisors] */
} bank_out;

/* Appends source number d (stacking order) of the bank: block rows go to the file; an nvfp4
 * source's data rows go to the file, its scale tiles and divisor to the bank's planes. */
static nf_status emit(gen *G, const spec *s, bank_out *b, uint64_t d, const source *src, nf_error *err)
{
    if (s->codec != NF_CODEC_NVFP4) return put(G, s, src->p, src->bytes, err);
    memcpy(b->scales + d * src->l.scale_bytes, src->p + src->l.scale_offset, src->l.scale_bytes);
    memcpy(&b->divisors[d], src->p + src->l.divisor_offset, 4);
    return put(G, s, src->p, src->l.data_bytes, err);
}

/* The nvfp4 bank's tail: zero padding up to the scale plane, the scales, the divisors. */
static nf_status finish_nvfp4(gen *G, const spec *s, bank_out *b, nf_error *err)
{
    uint64_t pad = b->l.scale_offset - b->l.data_bytes;
    static const uint8_t zeros[256];
    nf_status st = put(G, s, zeros, (size_t)pad, err);
    if (!st) st = put(G, s, b->scales, b->l.scale_bytes, err);
    if (!st) st = put(G, s, b->divisors, 4 * (size_t)b->l.divisors, err);
    return st;
}

static nf_status write_bank(gen *G, const spec *s, nf_error *err)
{
    /* [E][R][C], or one matrix [R][C] of S sources (an nvfp4 shared expert: E = 1) */
    const int e3 = s->n_dims == 3;
    const uint64_t E = e3 ? s->dims[0] : 1, R = s->dims[e3 ? 1 : 0], C = s->dims[s->n_dims - 1], S = s->sources, rs = R / S;
    const nf_codec *c = nf_codec_get(s->codec);
    bank_out b = {0};
    source pool[2] = {0}, tmp = {0};
    uint32_t *perm = malloc(rs * sizeof *perm);
    nf_status st = perm ? NF_OK : nf_error_set(err, NF_ERR_NOMEM, "out of memory");
    if (!st && s->codec == NF_CODEC_NVFP4) {
        st = nf_nvfp4_layout_of(E * R, C, (uint32_t)(E * S), &b.l, err);
        if (st) nf_error_prefix(err, "tensor '%s'", s->name);
        if (!st) {
            b.scales = calloc(1, b.l.scale_bytes);
            b.divisors = calloc(b.l.divisors, sizeof *b.divisors);
            if (!b.scales || !b.divisors) st = nf_error_set(err, NF_ERR_NOMEM, "tensor '%s': out of memory", s->name);
        }
    }
    for (uint64_t k = 0; !st && k < S; k++) st = source_init(&pool[k], s, rs, err);
    if (!st) st = source_init(&tmp, s, rs, err);
    const uint64_t key = tensor_key(G, s->name);
    for (uint64_t e = 0; !st && e < E; e++)
        for (uint64_t k = 0; !st && k < S; k++) {
            const uint64_t d = e * S + k;
            if (e == 0) {
                if (!(st = source_fresh(G, s, d * rs, &pool[k], err))) st = emit(G, s, &b, d, &pool[k], err);
            } else if (G->o->fresh) {
                if (!(st = source_fresh(G, s, d * rs, &tmp, err))) st = emit(G, s, &b, d, &tmp, err);
            } else {
                const uint64_t pk = mix64(key ^ mix64(d * GOLDEN + 7));
                source_permute(G, &pool[k], c, pk, &tmp, perm);
                st = emit(G, s, &b, d, &tmp, err);
            }
        }
    if (!st && s->codec == NF_CODEC_NVFP4) st = finish_nvfp4(G, s, &b, err);
    for (int k = 0; k < 2; k++) free(pool[k].p);
    free(tmp.p);
    free(perm);
    free(b.scales);
    free(b.divisors);
    return st;
}

static nf_status write_tensor(gen *G, const spec *s, nf_error *err)
{
    nf_tensor_desc d = {.name = s->name, .codec = s->codec, .n_dims = s->n_dims};
    memcpy(d.dims, s->dims, sizeof s->dims);
    if (s->kind == K_BANK && s->codec == NF_CODEC_NVFP4) d.divisors = (uint32_t)((s->n_dims == 3 ? s->dims[0] : 1) * s->sources);
    nf_status st = nf_artifact_writer_begin_tensor(G->w, &d, err);
    if (!st) st = s->kind == K_BANK ? write_bank(G, s, err) : write_dense(G, s, err);
    if (!st) st = nf_artifact_writer_end_tensor(G->w, err);
    progress(G, s, 1);
    return st;
}

/* ---- metadata ---------------------------------------------------------------------------------- */

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the others for 256 + n. */
static int byte_token(int b, char out[4])
{
    int cp = b, n = 0;
    if (!((b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff))) {
        for (int x = 0; x < b; x++)
            if (!((x >= '!' && x <= '~') || (x >= 0xa1 && x <= 0xac) || (x >= 0xae && x <= 0xff))) n++;
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        out[2] = 0;
    }
    return 0;
}

/* A byte-level toy tokenizer: ids 0..255 are the bytes, the rest "<|synth_N|>" (type unused), no
 * merges, no bos/eos; enough for `ninfer run` text in and out. */
static nf_status tokenizer_meta(nf_artifact_writer *w, uint32_t V, nf_error *err)
{
    char **tok = calloc(V, sizeof *tok);
    int32_t *type = malloc(V * sizeof *type);
    nf_status st = tok && type ? NF_OK : nf_error_set(err, NF_ERR_NOMEM, "out of memory for %u tokens", V);
    for (uint32_t i = 0; !st && i < V; i++) {
        tok[i] = malloc(24);
        if (!tok[i]) st = nf_error_set(err, NF_ERR_NOMEM, "out of memory");
        else if (i < 256) byte_token((int)i, tok[i]);
        else snprintf(tok[i], 24, "<|synth_%u|>", i);
        if (type) type[i] = i < 256 ? 1 : 5;
    }
    if (!st) st = nf_artifact_writer_add_str(w, "tokenizer.model", "gpt2", err);
    if (!st) st = nf_artifact_writer_add_str(w, "tokenizer.pre", "gpt2", err);
    if (!st) st = nf_artifact_writer_add_str_array(w, "tokenizer.tokens", (const char *const *)tok, NULL, V, err);
    if (!st) st = nf_artifact_writer_add_array(w, "tokenizer.token_type", NF_META_I32, type, V, err);
    if (!st) st = nf_artifact_writer_add_str_array(w, "tokenizer.merges", NULL, NULL, 0, err);
    if (!st) st = nf_artifact_writer_add_i32(w, "tokenizer.bos_id", -1, err);
    if (!st) st = nf_artifact_writer_add_i32(w, "tokenizer.eos_id", -1, err);
    if (!st) st = nf_artifact_writer_add_i32(w, "tokenizer.pad_id", -1, err);
    if (!st) st = nf_artifact_writer_add_array(w, "tokenizer.eos_ids", NF_META_I32, NULL, 0, err);
    if (!st) st = nf_artifact_writer_add_bool(w, "tokenizer.add_bos", 0, err);
    for (uint32_t i = 0; tok && i < V; i++) free(tok[i]);
    free(tok);
    free(type);
    return st;
}

static nf_status model_meta(nf_artifact_writer *w, const nf_synth_geometry *g, nf_error *err)
{
    int32_t *moe = malloc(2 * g->layers * sizeof *moe), *lin = moe + g->layers;
    if (!moe) return nf_error_set(err, NF_ERR_NOMEM, "out of memory");
    for (uint32_t l = 0; l < g->layers; l++) {
        moe[l] = 1; /* every layer of these geometries is MoE */
        lin[l] = is_linear(g, l);
    }
    const nf_model_keys k = {
        .arch = g->arch, .hidden = g->hidden, .layers = g->layers, .heads = g->heads, .kv_heads = g->kv_heads,
        .head_dim = g->head_dim, .vocab = g->vocab, .rms_eps = g->rms_eps, .rope_theta = g->rope_theta,
        .rope_scaling = "none", .rope_factor = 1.0f, .rope_orig_ctx = 0, .max_ctx = g->max_ctx,
        .tie_embeddings = g->tie, .qkv_bias = g->qkv_bias, .qk_norm = g->qk_norm, .dense_inter = g->dense_inter,
        .experts = g->experts, .top_k = g->top_k, .moe_inter = g->moe_inter, .shared_inter = g->shared_inter,
        .norm_topk = g->norm_topk, .moe_layers = moe, .linear_layers = g->attn_every ? lin : NULL,
        .rope_dim = g->rope_dim, .attn_gate = g->attn_every != 0, .ssm_k_heads = g->ssm_k_heads,
        .ssm_v_heads = g->ssm_v_heads, .ssm_k_dim = g->ssm_k_dim, .ssm_v_dim = g->ssm_v_dim, .ssm_conv = g->ssm_conv};
    nf_status st = nf_convert_model_meta(w, &k, err);
    free(moe);
    return st;
}

/* provenance.*: no date, so the same options give the same bytes; the source names the options. */
static nf_status provenance(nf_artifact_writer *w, const nf_synth_geometry *g, const nf_synth_opts *o, nf_error *err)
{
    char src[256], hash[32];
    snprintf(src, sizeof src, "synth:%s seed=%llu layers=%u vocab=%u experts=%s%s", g->name,
             (unsigned long long)o->seed, g->layers, g->vocab, o->fresh ? "fresh" : "permuted",
             o->no_tokenizer ? " tokenizer=none" : "");
    snprintf(hash, sizeof hash, "synth:%016llx", (unsigned long long)nf_fnv1a64(src, strlen(src)));
    return nf_convert_provenance(w, src, hash, o->recipe, NULL, err);
}

/* ---- entry ------------------------------------------------------------------------------------- */

static nf_status check_opts(const nf_synth_opts *o, nf_synth_geometry *g, nf_error *err)
{
    const nf_synth_geometry *base = nf_synth_geometry_find(o->geometry);
    if (!base)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "unknown geometry '%s' (%s)", o->geometry ? o->geometry : "(null)",
                            nf_synth_geometry_names());
    if (!recipe_ok(o->recipe))
        return nf_error_set(err, NF_ERR_INVALID_ARG, "unknown recipe '%s' (bf16, q8q8, q4q6, q4q5, nvfp4)",
                            o->recipe ? o->recipe : "(null)");
    *g = *base;
    if (o->layers) g->layers = o->layers;
    if (o->vocab) g->vocab = o->vocab;
    if (!o->no_tokenizer && g->vocab < 256)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "vocab %u is below the byte-level tokenizer's 256 tokens (use a "
                            "larger vocab, or no tokenizer)", g->vocab);
    return NF_OK;
}

nf_status nf_synth_write(const char *path, const nf_synth_opts *o, nf_synth_stats *stats, nf_error *err)
{
    nf_synth_geometry g;
    nf_status st = check_opts(o, &g, err);
    if (st) return st;
    plan p = {0};
    gen G = {.o = o, .key = mix64(o->seed ^ 0x5eed5eed5eedULL)};
    if ((st = build_plan(&g, o->recipe, &p, err))) goto out;
    for (size_t i = 0; i < p.n; i++)
        if (p.t[i].dims[p.t[i].n_dims - 1] > G.max_cols) G.max_cols = p.t[i].dims[p.t[i].n_dims - 1];
    if ((st = nf_pool_create(o->threads, &G.pool, err))) goto out;
    G.threads = nf_pool_size(G.pool);
    G.scratch = malloc((size_t)G.threads * G.max_cols * sizeof *G.scratch);
    if (!G.scratch) {
        st = nf_error_set(err, NF_ERR_NOMEM, "out of memory");
        goto out;
    }
    if ((st = nf_artifact_writer_open(path, &G.w, err))) goto out;
    st = model_meta(G.w, &g, err);
    if (!st && !o->no_tokenizer) st = tokenizer_meta(G.w, g.vocab, err);
    if (!st) st = provenance(G.w, &g, o, err);
    G.n = p.n;
    G.t0 = G.last = nf_time_ns();
    uint64_t params = 0;
    for (G.i = 0; !st && G.i < p.n; G.i++) {
        const spec *s = &p.t[G.i];
        st = write_tensor(&G, s, err);
        uint64_t n = 1;
        for (uint32_t k = 0; k < s->n_dims; k++) n *= s->dims[k];
        params += n;
    }
    if (st) {
        if (!o->quiet) fputc('\n', stderr);
        nf_artifact_writer_abort(G.w);
    } else
        st = nf_artifact_writer_finish(G.w, err);
    G.w = NULL;
    if (!st && stats) *stats = (nf_synth_stats){p.n, G.bytes, params, (double)(nf_time_ns() - G.t0) * 1e-9};
out:
    nf_pool_destroy(G.pool);
    free(G.scratch);
    free(G.buf);
    free(p.t);
    return st;
}

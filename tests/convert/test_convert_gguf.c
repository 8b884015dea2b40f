/* ninfer convert on GGUF sources: tiny qwen3moe, qwen2moe and llama files written with gguf-py
 * (tests/oracle/gguf_fixture.py, tests/fixtures/gguf/). Each is converted with recipe `source`
 * (carry-over) and `q8q8` (re-encoding). Every artifact tensor is compared with gguf-py's
 * dequantization of the source (the .expected.safetensors, in artifact names and shapes, stacked and
 * un-permuted by the script): carried-over codecs (q8_0, q4_k, q5_k, q6_k, and f16/f32 under
 * `source`) must be byte-identical to the GGUF rows they come from and bit-exact in value; re-encoded
 * ones (q4_1 always, f16/f32 matrices under q8q8) must be q8_0 within its error bound, and the q4_1
 * ones named in a warning. Metadata is compared with what the script wrote (.meta.txt); refusals
 * (unknown ggml type, inconsistent shape, missing tensor, unknown architecture, nvfp4 recipe) must
 * name the tensor and the rule. qwen3moe_lowbit (q2_k, q3_k, iq4_xs, iq4_nl, the import-only codecs, mixed
 * with q5_k/q6_k/q8_0 as llama.cpp's low-bit types do) is carried over bit-exact under any recipe;
 * gate_up_mix (a q2_k gate with a q3_k up) is re-encoded with its warning. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "convert/convert.h"
#include "convert/plan.h"
#include "format/artifact.h"
#include "format/gguf.h"
#include "format/safetensors.h"
#include "nf_test.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation" /* fixture names are short */
#endif

#define FIX NF_TEST_DATA "/fixtures/gguf/"

static char tmpdir[256];

/* Runs f(ctx) with stderr redirected to a file; returns what was written (malloc'd). */
static char *capture_stderr(nf_status (*f)(void *), void *ctx, nf_status *st)
{
    char path[300];
    snprintf(path, sizeof path, "%s/stderr.txt", tmpdir);
    fflush(stderr);
    int saved = dup(2);
    FILE *cap = fopen(path, "w+");
    if (saved < 0 || !cap) return NULL;
    dup2(fileno(cap), 2);
    *st = f(ctx);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    long n = ftell(cap);
    char *buf = calloc(1, (size_t)(n > 0 ? n : 0) + 1);
    rewind(cap);
    if (buf && n > 0 && fread(buf, 1, (size_t)n, cap) != (size_t)n) buf[0] = 0;
    fclose(cap);
    return buf;
}

typedef struct conv_job {
    const char *src, *recipe, *out;
    nf_plan plan;
    nf_error err;
} conv_job;

/* Plans and converts; keeps the plan (the caller frees it). */
static nf_status conv_run(void *ctx)
{
    conv_job *j = ctx;
    nf_convert_opts o = {j->recipe, 0, 2, 1};
    nf_status s = nf_plan_build(j->src, &o, &j->plan, &j->err);
    if (s == NF_OK) s = nf_convert_run(&j->plan, j->out, &o, NULL, &j->err);
    return s;
}

/* The GGUF tensor(s) an artifact tensor comes from (docs/convert.md's name map, restated). */
static const nf_gguf_tensor *gguf_src(const nf_gguf *g, const char *name, int half)
{
    char gn[96];
    const char *p = strstr(name, "ffn_gate_up_exps"), *sh = strstr(name, "ffn_gate_up_shexp");
    size_t n = strlen(name);
    if (p) snprintf(gn, sizeof gn, "%.*s%s", (int)(p - name), name, half ? "ffn_up_exps.weight" : "ffn_gate_exps.weight");
    else if (sh) snprintf(gn, sizeof gn, "%.*s%s", (int)(sh - name), name, half ? "ffn_up_shexp.weight" : "ffn_gate_shexp.weight");
    else if (n > 5 && strcmp(name + n - 5, "_bias") == 0) snprintf(gn, sizeof gn, "%.*s.bias", (int)(n - 5), name);
    else snprintf(gn, sizeof gn, "%s.weight", name);
    return nf_gguf_find_tensor(g, gn);
}

/* The GGUF row that artifact row r of `name` holds: gate_up banks interleave gate_j, up_j per
 * expert (I rows each); llama q/k take the script's src_rows; else the same row. *half picks
 * gate (0) or up (1). */
static uint64_t gguf_row(const char *name, const nf_tensor *t, const nf_st_tensor *src_rows, uint64_t r, int *half)
{
    *half = 0;
    if (strstr(name, "ffn_gate_up_exps")) {
        uint64_t I = t->desc.dims[1] / 2, j = r / (2 * I), k = r % (2 * I);
        *half = k >= I;
        return j * I + k % I;
    }
    if (strstr(name, "ffn_gate_up_shexp")) { /* [2S][H]: the shared gate's S rows, then up's */
        uint64_t S = t->desc.dims[0] / 2;
        *half = r >= S;
        return r % S;
    }
    if (src_rows) {
        int32_t v;
        memcpy(&v, (const uint8_t *)src_rows->data + 4 * r, 4);
        return (uint64_t)v;
    }
    return r;
}

typedef struct counts {
    int copied, reencoded, vectors;
} counts;

/* One artifact tensor against the oracle: shape, codec, bytes (carried over) and values. */
static void check_tensor(const nf_artifact *a, const nf_gguf *g, const nf_safetensors *ex, const nf_st_tensor *e,
                         const char *recipe, counts *n)
{
    const nf_tensor *t = nf_artifact_find_tensor(a, e->name);
    CHECK_MSG(t != NULL, "%s: not in the artifact", e->name);
    if (!t) return;
    int same_shape = (int)t->desc.n_dims == e->n_dims;
    for (int d = 0; same_shape && d < e->n_dims; d++) same_shape = t->desc.dims[d] == e->shape[d];
    CHECK_MSG(same_shape, "%s: artifact shape differs from the expected shape", e->name);
    if (!same_shape) return;
    const nf_gguf_tensor *s0 = gguf_src(g, e->name, 0);
    CHECK_MSG(s0 != NULL, "%s: no GGUF source", e->name);
    if (!s0) return;
    char key[96];
    snprintf(key, sizeof key, "%s.src_rows", e->name);
    const nf_st_tensor *src_rows = nf_safetensors_find(ex, key);
    uint32_t st = s0->ggml_type; /* 0 f32, 1 f16, else a block codec */
    int vector = e->n_dims == 1, router = strstr(e->name, "ffn_gate_inp") != NULL;
    /* every GGUF block codec but the legacy dequant-only ones is carried over, the import-only q2_k,
     * q3_k, iq4_xs, iq4_nl included (the fixtures' stacked banks have one codec for gate and up) */
    int block_carried = st > 1 && !(s0->codec->flags & NF_CODEC_DEQUANT_ONLY);
    int carried = !vector && (block_carried || ((st == 0 || st == 1) && (strcmp(recipe, "source") == 0 || router)));
    nf_codec_id want = vector ? NF_CODEC_F32 : carried ? s0->codec->id : NF_CODEC_Q8_0;
    CHECK_MSG(t->desc.codec == want, "%s: codec %s, expected %s (source %s, recipe %s)", e->name, t->codec->name,
              nf_codec_get(want)->name, s0->type_name, recipe);
    if (t->desc.codec != want) return;
    n->vectors += vector;
    n->copied += carried;
    n->reencoded += !vector && !carried;
    uint64_t cols = t->layout.cols, rows = t->layout.rows;
    size_t rb = nf_codec_row_bytes(t->codec, cols);
    float *y = malloc(cols * sizeof *y);
    int bytes_ok = 1, vals_ok = 1;
    for (uint64_t r = 0; r < rows && y; r++) {
        int half;
        uint64_t gr = gguf_row(e->name, t, src_rows, r, &half);
        const nf_gguf_tensor *s = gguf_src(g, e->name, half);
        if (carried) bytes_ok &= memcmp(t->data + r * rb, (const uint8_t *)s->data + gr * rb, rb) == 0;
        t->codec->dequantize_row(t->data + r * rb, y, cols);
        const float *x = (const float *)e->data + r * cols; /* f32, little-endian, 4-aligned by the writer */
        for (uint64_t k0 = 0; k0 < cols; k0 += 32) {
            float amax = 0;
            for (uint64_t k = k0; k < k0 + 32 && k < cols; k++) amax = fmaxf(amax, fabsf(x[k]));
            /* q8_0: d = fp16(amax / 127), |q| <= 127: |x - q d| <= d / 2 + 127 * |d - amax/127| and fp16's
             * relative rounding is <= 2^-11, so the error is below (0.5 + 127 * 2^-11) * amax / 127. */
            double bound = (0.5 + 127.0 / 2048) * amax / 127 * (1 + 1e-6);
            for (uint64_t k = k0; k < k0 + 32 && k < cols; k++)
                vals_ok &= vector || carried ? memcmp(&x[k], &y[k], 4) == 0 : fabs((double)x[k] - y[k]) <= bound;
        }
    }
    CHECK_MSG(bytes_ok, "%s: carried-over rows are not byte-identical to the GGUF's", e->name);
    CHECK_MSG(vals_ok, "%s: values differ from gguf-py's dequantization (%s, recipe %s)", e->name,
              carried || vector ? "bit-exact" : "q8_0 bound", recipe);
    free(y);
}

/* ---- metadata --------------------------------------------------------------------------------- */

static size_t unhex(const char *h, char *out, size_t cap)
{
    size_t n = 0;
    if (strcmp(h, "-") == 0) return 0;
    for (; h[0] && h[1] && n + 1 < cap; h += 2) {
        unsigned v;
        if (sscanf(h, "%2x", &v) != 1) break;
        out[n++] = (char)v;
    }
    out[n] = 0;
    return n;
}

/* Every line of the script's .meta.txt matches the artifact's metadata; returns lines checked. */
static int check_meta(const nf_artifact *a, const char *meta_path)
{
    FILE *f = fopen(meta_path, "r");
    CHECK_MSG(f != NULL, "%s", meta_path);
    if (!f) return 0;
    static char line[1 << 16], buf[4096];
    int lines = 0;
    while (fgets(line, sizeof line, f)) {
        char type[16], key[96];
        int off = 0;
        if (sscanf(line, "%15s %95s %n", type, key, &off) != 2) continue;
        char *v = line + off;
        v[strcspn(v, "\n")] = 0;
        const nf_meta *m = nf_artifact_find_meta(a, key);
        CHECK_MSG(m != NULL, "metadata '%s' is missing", key);
        if (!m) continue;
        lines++;
        int ok = 0;
        if (strcmp(type, "u32") == 0) ok = m->type == NF_META_U32 && m->v.u32 == strtoul(v, NULL, 10);
        else if (strcmp(type, "i32") == 0) ok = m->type == NF_META_I32 && m->v.i32 == (int32_t)strtol(v, NULL, 10);
        else if (strcmp(type, "bool") == 0) ok = m->type == NF_META_BOOL && m->v.b == atoi(v);
        else if (strcmp(type, "f32") == 0) ok = m->type == NF_META_F32 && m->v.f32 == (float)strtod(v, NULL);
        else if (strcmp(type, "f64") == 0) ok = m->type == NF_META_F64 && m->v.f64 == strtod(v, NULL);
        else if (strcmp(type, "str") == 0) {
            size_t n = unhex(v, buf, sizeof buf);
            ok = m->type == NF_META_STRING && m->count == n && memcmp(m->str, buf, n) == 0;
        } else if (strcmp(type, "i32[]") == 0 || strcmp(type, "str[]") == 0) {
            char *p = v;
            unsigned long cnt = strtoul(p, &p, 10);
            int is_str = type[0] == 's';
            ok = m->type == NF_META_ARRAY && m->count == cnt && m->elem_type == (is_str ? NF_META_STRING : NF_META_I32);
            for (unsigned long i = 0; ok && i < cnt; i++) {
                char *tok = strtok(i ? NULL : p, " ");
                if (!tok) ok = 0;
                else if (is_str) {
                    size_t n = unhex(tok, buf, sizeof buf);
                    ok = m->str_lens[i] == n && memcmp(m->strs[i], buf, n) == 0;
                } else
                    ok = ((const int32_t *)m->elems)[i] == (int32_t)strtol(tok, NULL, 10);
            }
        }
        CHECK_MSG(ok, "metadata '%s' (%s) differs from the script's", key, type);
    }
    fclose(f);
    return lines;
}

/* ---- one fixture ------------------------------------------------------------------------------ */

static void check_fixture(const char *stem, const char *recipe, int expect_copied, int expect_reencoded,
                          const char *const *q41)
{
    static const char q41_warning[] = "2 tensors stored as q4_1 (decode-only in ninfer) are dequantized and re-encoded";
    char src[300], out[400], exp[300], meta[300];
    snprintf(src, sizeof src, FIX "%s.gguf", stem);
    snprintf(out, sizeof out, "%s/%s-%s.nf", tmpdir, stem, recipe);
    snprintf(exp, sizeof exp, FIX "%s.expected.safetensors", stem);
    snprintf(meta, sizeof meta, FIX "%s.meta.txt", stem);
    conv_job j;
    memset(&j, 0, sizeof j);
    j.src = src;
    j.recipe = recipe;
    j.out = out;
    nf_status s = NF_ERR_INTERNAL;
    char *log = capture_stderr(conv_run, &j, &s);
    CHECK_MSG(s == NF_OK, "%s (%s): %s", stem, recipe, j.err.msg);
    /* every q4_1 tensor is named in a warning and planned as a q8_0 re-encode; a fixture without
     * one warns of nothing */
    if (q41[0]) CHECK_CONTAINS(log ? log : "", q41_warning);
    else CHECK_MSG(log && !strstr(log, "re-encoded"), "%s (%s): unexpected warning: %s", stem, recipe, log ? log : "");
    for (int i = 0; q41[i]; i++) {
        char w[128];
        snprintf(w, sizeof w, "%s (as q8_0)", q41[i]);
        CHECK_MSG(log && strstr(log, w), "no warning naming '%s' in: %s", w, log ? log : "");
        const nf_plan_tensor *pt = nf_plan_find(&j.plan, q41[i]);
        CHECK(pt && pt->action == NF_ACT_ENCODE && pt->codec == NF_CODEC_Q8_0);
    }
    free(log);
    nf_plan_free(&j.plan);
    nf_artifact *a = NULL;
    nf_gguf *g = NULL;
    nf_safetensors *ex = NULL;
    nf_error err = {0};
    CHECK_MSG(nf_artifact_open(out, &a, &err) == NF_OK, "%s", err.msg);
    CHECK_MSG(nf_gguf_open(src, 0, &g, &err) == NF_OK, "%s", err.msg);
    CHECK_MSG(nf_safetensors_open(exp, &ex, &err) == NF_OK, "%s", err.msg);
    if (a && g && ex) {
        counts n = {0, 0, 0};
        size_t checked = 0;
        for (size_t i = 0; i < nf_safetensors_count(ex); i++) {
            const nf_st_tensor *e = nf_safetensors_at(ex, i);
            if (e->dtype != NF_ST_F32) continue; /* the .src_rows maps */
            check_tensor(a, g, ex, e, recipe, &n);
            checked++;
        }
        CHECK_EQ_U64(checked, nf_artifact_n_tensors(a)); /* nothing more in the artifact */
        CHECK_EQ_INT(n.copied, expect_copied);
        CHECK_EQ_INT(n.reencoded, expect_reencoded);
        CHECK(check_meta(a, meta) > 20);
        const char *rc;
        size_t len;
        CHECK(nf_artifact_get_str(a, "provenance.recipe", &rc, &len, NULL) == NF_OK && strcmp(rc, recipe) == 0);
    }
    nf_safetensors_close(ex);
    nf_gguf_close(g);
    nf_artifact_close(a);
}

/* ---- refusals --------------------------------------------------------------------------------- */

static void expect_refusal(const char *src, const char *recipe, nf_status want, const char *n1, const char *n2)
{
    nf_convert_opts o = {recipe, 0, 1, 1};
    nf_plan p;
    nf_error err = {0};
    nf_status s = nf_plan_build(src, &o, &p, &err);
    nf_plan_free(&p);
    CHECK_MSG(s == want, "%s: status %d, expected %d (%s)", src, (int)s, (int)want, err.msg);
    CHECK_CONTAINS(err.msg, n1);
    CHECK_CONTAINS(err.msg, n2);
}

static void check_refusals(void)
{
    expect_refusal(FIX "bad_type.gguf", NULL, NF_ERR_UNSUPPORTED, "'token_embd.weight'", "ggml type 16 (iq2_xxs)");
    expect_refusal(FIX "missing.gguf", NULL, NF_ERR_FORMAT, "'blk.0.ffn_up.weight' is missing", "blk.0.ffn_up");
    expect_refusal(FIX "bad_shape.gguf", NULL, NF_ERR_FORMAT, "'blk.0.attn_k.weight' has 32 rows of 32",
                   "metadata implies 16 rows of 32");
    expect_refusal(FIX "bad_arch.gguf", NULL, NF_ERR_UNSUPPORTED, "'phi3' is not supported", "qwen3moe, qwen2moe, llama");
    expect_refusal(FIX "llama.gguf", "nvfp4", NF_ERR_UNSUPPORTED, "nvfp4", "unquantized source");
    expect_refusal(FIX "partial_rope.gguf", NULL, NF_ERR_UNSUPPORTED, "'llama.rope.dimension_count' is 4 but head_dim is 8",
                   "partial RoPE");
    /* the tokenizer library must accept the GGUF tokenizer: checked when the artifact is written */
    char out[400];
    snprintf(out, sizeof out, "%s/bad_tok.nf", tmpdir);
    nf_convert_opts o = {NULL, 0, 1, 1};
    nf_plan p;
    nf_error err = {0};
    nf_status s = nf_plan_build(FIX "bad_tok.gguf", &o, &p, &err);
    if (s == NF_OK) s = nf_convert_run(&p, out, &o, NULL, &err);
    nf_plan_free(&p);
    CHECK(s == NF_ERR_UNSUPPORTED);
    CHECK_CONTAINS(err.msg, "bad_tok.gguf: tokenizer.ggml: pre-tokenizer 'default' is not supported");
    CHECK(access(out, F_OK) != 0); /* nothing written under the name */
}

/* gate_up_mix.gguf: ffn_gate_exps q2_k, ffn_up_exps q3_k. The stacked bank has one codec, neither
 * can be encoded, so it is re-encoded by the recipe (q8_0 under source), warned with the reason and
 * both codecs; its values are within q8_0's bound of the decoded sources, and everything else is
 * carried. */
static void check_gate_up_mix(void)
{
    char out[400];
    snprintf(out, sizeof out, "%s/gate_up_mix.nf", tmpdir);
    conv_job j;
    memset(&j, 0, sizeof j);
    j.src = FIX "gate_up_mix.gguf";
    j.recipe = NULL;
    j.out = out;
    nf_status s = NF_ERR_INTERNAL;
    char *log = capture_stderr(conv_run, &j, &s);
    CHECK_MSG(s == NF_OK, "gate_up_mix: %s", j.err.msg);
    CHECK_CONTAINS(log ? log : "", "1 stacked tensor mixes source codecs and is dequantized and re-encoded by recipe "
                                   "'source' (a stacked matrix has one codec");
    CHECK_CONTAINS(log ? log : "", "blk.0.ffn_gate_up_exps (q2_k+q3_k, as q8_0)");
    const nf_plan_tensor *pt = nf_plan_find(&j.plan, "blk.0.ffn_gate_up_exps");
    CHECK(pt && pt->reencoded && pt->action == NF_ACT_ENCODE && pt->codec == NF_CODEC_Q8_0);
    free(log);
    nf_plan_free(&j.plan);
    nf_artifact *a = NULL;
    nf_gguf *g = NULL;
    nf_error err = {0};
    CHECK_MSG(nf_artifact_open(out, &a, &err) == NF_OK, "%s", err.msg);
    CHECK_MSG(nf_gguf_open(j.src, 0, &g, &err) == NF_OK, "%s", err.msg);
    const nf_tensor *t = a ? nf_artifact_find_tensor(a, "blk.0.ffn_gate_up_exps") : NULL;
    CHECK(t && t->desc.codec == NF_CODEC_Q8_0 && t->desc.dims[1] == 64 && t->desc.dims[2] == 256);
    if (t && g) {
        const uint64_t cols = t->layout.cols, I = t->desc.dims[1] / 2;
        float y[256], x[256];
        int ok = 1;
        for (uint64_t r = 0; r < t->layout.rows; r++) {
            int half = (r % (2 * I)) >= I;
            const nf_gguf_tensor *src = gguf_src(g, t->desc.name, half);
            uint64_t gr = r / (2 * I) * I + r % I;
            src->codec->dequantize_row((const uint8_t *)src->data + gr * nf_codec_row_bytes(src->codec, cols), x, cols);
            t->codec->dequantize_row(t->data + r * nf_codec_row_bytes(t->codec, cols), y, cols);
            for (uint64_t k0 = 0; k0 < cols; k0 += 32) { /* q8_0's bound, as in check_tensor */
                float amax = 0;
                for (uint64_t k = k0; k < k0 + 32; k++) amax = fmaxf(amax, fabsf(x[k]));
                for (uint64_t k = k0; k < k0 + 32; k++)
                    ok &= fabs((double)x[k] - y[k]) <= (0.5 + 127.0 / 2048) * amax / 127 * (1 + 1e-6);
            }
        }
        CHECK_MSG(ok, "gate_up_mix: the q8_0 bank is not within q8_0's bound of the decoded q2_k/q3_k sources");
        const nf_tensor *dn = nf_artifact_find_tensor(a, "blk.0.ffn_down_exps");
        CHECK(dn && dn->desc.codec == NF_CODEC_Q8_0);
    }
    nf_gguf_close(g);
    nf_artifact_close(a);
}

/* --plan lists the stacked bank as a copy of the q4_k sources, the q4_1 re-encode and the warnings. */
static void check_plan_print(void)
{
    nf_convert_opts o = {NULL, 0, 1, 1};
    nf_plan p;
    nf_error err = {0};
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    nf_status s = nf_plan_build(FIX "qwen3moe.gguf", &o, &p, &err);
    CHECK_MSG(s == NF_OK, "%s", err.msg);
    if (s == NF_OK && f) nf_plan_print(&p, f);
    if (f) fclose(f);
    nf_plan_free(&p);
    if (!buf) return;
    CHECK_CONTAINS(buf, "recipe source");
    CHECK_CONTAINS(buf, "blk.0.ffn_gate_up_exps");
    CHECK_CONTAINS(buf, "8 sources: blk.0.ffn_gate_exps.weight[0..] ... blk.0.ffn_up_exps.weight[96..] (q4_k)");
    CHECK_CONTAINS(buf, "\n2 warnings");
    free(buf);
}

/* provenance.source_hash: "bytes:" + FNV-1a 64 of the file (the script's value) under hash_bytes,
 * "stat:" + a 16-digit identity otherwise. */
static void check_source_hash(const char *stem)
{
    char src[300], out[400], want[64] = "bytes:", path[300];
    snprintf(src, sizeof src, FIX "%s.gguf", stem);
    snprintf(path, sizeof path, FIX "%s.fnv1a64", stem);
    FILE *f = fopen(path, "r");
    CHECK(f && fscanf(f, "%16s", want + 6) == 1);
    if (f) fclose(f);
    for (int bytes = 0; bytes < 2; bytes++) {
        snprintf(out, sizeof out, "%s/hash%d.nf", tmpdir, bytes);
        nf_convert_opts o = {NULL, 0, 1, 1};
        nf_plan p;
        nf_error err = {0};
        nf_status s = nf_plan_build(src, &o, &p, &err);
        p.hash_bytes = bytes;
        if (s == NF_OK) s = nf_convert_run(&p, out, &o, NULL, &err);
        nf_plan_free(&p);
        CHECK_MSG(s == NF_OK, "%s", err.msg);
        nf_artifact *a = NULL;
        const char *h = "";
        size_t len = 0;
        if (nf_artifact_open(out, &a, NULL) == NF_OK) nf_artifact_get_str(a, "provenance.source_hash", &h, &len, NULL);
        if (bytes) CHECK_MSG(strcmp(h, want) == 0, "source_hash '%s', expected '%s'", h, want);
        else CHECK_MSG(len == 21 && strncmp(h, "stat:", 5) == 0, "source_hash '%s'", h);
        nf_artifact_close(a);
    }
}

/* rope.scaling.* keys reach model.rope_* (written by gguf-py's add_rope_scaling_*). */
static void check_yarn(void)
{
    char out[400];
    snprintf(out, sizeof out, "%s/yarn.nf", tmpdir);
    nf_convert_opts o = {NULL, 0, 1, 1};
    nf_plan p;
    nf_error err = {0};
    nf_status s = nf_plan_build(FIX "yarn.gguf", &o, &p, &err);
    if (s == NF_OK) s = nf_convert_run(&p, out, &o, NULL, &err);
    nf_plan_free(&p);
    CHECK_MSG(s == NF_OK, "%s", err.msg);
    nf_artifact *a = NULL;
    if (nf_artifact_open(out, &a, &err) != NF_OK) return;
    const char *t = "";
    size_t len;
    float f = 0;
    uint32_t orig = 0;
    CHECK(nf_artifact_get_str(a, "model.rope_scaling", &t, &len, NULL) == NF_OK && strcmp(t, "yarn") == 0);
    CHECK(nf_artifact_get_f32(a, "model.rope_factor", &f, NULL) == NF_OK && f == 4.0f);
    CHECK(nf_artifact_get_u32(a, "model.rope_orig_ctx", &orig, NULL) == NF_OK && orig == 32768);
    nf_artifact_close(a);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/nf_convert_gguf.XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    static const char *const q41_qwen[] = {"blk.0.attn_output", "blk.1.ffn_up", NULL};
    static const char *const q41_llama[] = {"blk.0.attn_output", "blk.1.attn_q", NULL};
    /* 2-D tensors carried over / re-encoded (the fixture script's codec lists): qwen3moe has 16, two
     * of them q4_1 and two f16 (re-encoded by q8q8; its f32 router stays f32); llama has 15, two q4_1
     * and four f16/f32 matrices */
    check_fixture("qwen3moe", "source", 14, 2, q41_qwen);
    check_fixture("qwen3moe", "q8q8", 12, 4, q41_qwen);
    /* qwen2moe: 17, two q4_1 and two f16 (blk.1.attn_q, blk.1.ffn_up); biases and the shared gate
     * are vectors; the shared expert's gate/up stacked into blk.0.ffn_gate_up_shexp */
    static const char *const q41_qwen2[] = {"blk.0.attn_output", "blk.1.ffn_down", NULL};
    check_fixture("qwen2moe", "source", 15, 2, q41_qwen2);
    check_fixture("qwen2moe", "q8q8", 13, 4, q41_qwen2);
    check_fixture("llama", "source", 13, 2, q41_llama);
    check_fixture("llama", "q8q8", 9, 6, q41_llama);
    /* qwen3moe_lowbit: every matrix in q2_k, q3_k, iq4_xs, iq4_nl (import-only) or q5_k/q6_k/q8_0 is
     * carried over byte for byte and bit-exact under any recipe: 15 matrices and the f32 router, nothing
     * re-encoded */
    static const char *const none[] = {NULL};
    check_fixture("qwen3moe_lowbit", "source", 16, 0, none);
    check_fixture("qwen3moe_lowbit", "q4q6", 16, 0, none);
    check_gate_up_mix();
    check_plan_print();
    check_yarn();
    check_source_hash("qwen3moe");
    check_source_hash("llama");
    check_source_hash("qwen2moe");
    check_refusals();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) return 1;
    return nf_test_report();
}

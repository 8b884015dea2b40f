/* The conversion plan: storage, codec decisions and the entry; the Hugging Face plan is plan_hf.c, the
 * GGUF plan plan_gguf.c, the recipe table recipe.c. See plan.h and docs/convert.md. */
#define _POSIX_C_SOURCE 200809L
#include "convert/plan.h"

/* Tensor names are built into fixed buffers far longer than any checkpoint key; an over-long name would
 * truncate and then be reported as a missing tensor, which is the right outcome. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/log.h"
#include "codec/nvfp4.h"
#include "convert/plan_internal.h"
#include "format/tensor.h"

const char *nf_plan_action_name(nf_plan_action a)
{
    static const char *const n[] = {"encode", "copy", "nvfp4-copy", "nvfp4-quant"};
    return (unsigned)a < 4 ? n[a] : "?";
}

/* ---- plan storage ---------------------------------------------------------------------------- */

nf_plan_tensor *nf_plan_add_tensor(nf_plan *p, const char *name, uint32_t n_dims, const uint64_t *dims, nf_error *err)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 64;
        nf_plan_tensor *t = realloc(p->t, cap * sizeof *t);
        if (!t) {
            nf_error_set(err, NF_ERR_NOMEM, "plan: out of memory");
            return NULL;
        }
        p->t = t;
        p->cap = cap;
    }
    nf_plan_tensor *t = &p->t[p->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = n_dims;
    for (uint32_t i = 0; i < n_dims; i++) t->dims[i] = dims[i];
    t->divisors = 1;
    return t;
}

nf_plan_part *nf_plan_add_part(nf_plan_tensor *t, nf_error *err)
{
    nf_plan_part *q = realloc(t->parts, (t->n_parts + 1) * sizeof *q);
    if (!q) {
        nf_error_set(err, NF_ERR_NOMEM, "plan: out of memory");
        return NULL;
    }
    t->parts = q;
    memset(&q[t->n_parts], 0, sizeof *q);
    return &q[t->n_parts++];
}

void nf_plan_free(nf_plan *p)
{
    if (!p) return;
    for (size_t i = 0; i < p->n; i++) {
        free(p->t[i].parts);
        free(p->t[i].input_divisors);
    }
    free(p->t);
    nf_hf_config_free(&p->cfg);
    nf_st_set_close(p->st);
    nf_gguf_close(p->gguf);
    memset(p, 0, sizeof *p);
}

const nf_plan_tensor *nf_plan_find(const nf_plan *p, const char *name)
{
    for (size_t i = 0; i < p->n; i++)
        if (strcmp(p->t[i].name, name) == 0) return &p->t[i];
    return NULL;
}

/* ---- recipes --------------------------------------------------------------------------------- */

/* The recipe's codec for an unquantized matrix (before the row-length fallback): recipe.h. */
static nf_codec_id recipe_codec(const nf_plan *p, nf_role r, int layer)
{
    const nf_recipe_model m = {p->cfg.n_layers, p->cfg.n_experts, p->cfg.tie_word_embeddings};
    return nf_recipe_codec(nf_recipe_find(p->recipe), r, layer, &m);
}

/* A codec that cannot take the row length falls back to q8_0 (then bf16), with a warning. */
static nf_codec_id fit_codec(nf_plan *p, nf_plan_tensor *t, nf_codec_id c)
{
    uint64_t cols = t->dims[t->n_dims - 1];
    nf_codec_id f = nf_recipe_fit(c, cols, &t->fallback);
    if (!t->fallback) return c;
    NF_WARN("convert: %s: row length %llu is not a multiple of %s's %u-element block; using %s", t->name,
            (unsigned long long)cols, nf_codec_get(c)->name, nf_codec_get(c)->block_elems, nf_codec_get(f)->name);
    p->n_warnings++;
    return f;
}

/* ---- reading small source values ------------------------------------------------------------- */

/* Decides codec and action of a tensor whose parts are known. */
nf_status nf_plan_decide(nf_plan *p, nf_plan_tensor *t, nf_role r, int layer, nf_error *err)
{
    if (t->n_dims == 1) {
        t->codec = NF_CODEC_F32;
        t->action = NF_ACT_ENCODE;
        return NF_OK;
    }
    int nv = 0, same = 1;
    for (uint32_t i = 0; i < t->n_parts; i++) {
        nv += t->parts[i].src_codec == NF_CODEC_NVFP4;
        same &= t->parts[i].src_codec == t->parts[0].src_codec;
    }
    if (nv && nv != (int)t->n_parts)
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "%s: mixes NVFP4 and non-NVFP4 source matrices (%s is %s)", t->name,
                            t->parts[0].src, nf_codec_get(t->parts[0].src_codec)->name);
    if (nv) {
        if (strcmp(p->recipe, "nvfp4") != 0 && !p->requantize)
            return nf_error_set(err, NF_ERR_REFUSED,
                                "%s: source '%s' is NVFP4 and recipe '%s' is not; re-quantizing an NVFP4 checkpoint "
                                "loses accuracy: use --recipe nvfp4, or --requantize to do it anyway",
                                t->name, t->parts[0].src, p->recipe);
        if (strcmp(p->recipe, "nvfp4") == 0) {
            t->codec = NF_CODEC_NVFP4;
            t->action = NF_ACT_NVFP4_COPY;
            t->divisors = t->n_parts;
            return NF_OK;
        }
    }
    const nf_codec *sc = nf_codec_get(t->parts[0].src_codec);
    int legacy = sc->flags & NF_CODEC_DEQUANT_ONLY;
    int quantized = !nv && sc->id != NF_CODEC_F32 && sc->id != NF_CODEC_F16 && sc->id != NF_CODEC_BF16;
    int split = 0; /* un-tiled column groups that are not whole blocks: no byte copy (plan.h untile_w) */
    for (uint32_t i = 0; i < t->n_parts; i++) split |= t->parts[i].untile_w % nf_codec_get(t->parts[i].src_codec)->block_elems != 0;
    if (split && quantized && !legacy) {
        t->reencoded = 2;
        p->n_warnings++;
        same = 0;
    }
    if (p->src_kind == NF_SRC_GGUF && quantized && !legacy && same) { /* k-quants, q8_0: carried over */
        t->codec = sc->id;
        t->action = NF_ACT_COPY;
        return NF_OK;
    }
    if (p->src_kind == NF_SRC_GGUF && strcmp(p->recipe, "source") == 0 && same && !legacy) {
        t->codec = sc->id; /* f32/f16/bf16 as the file has them */
        t->action = NF_ACT_COPY;
        return NF_OK;
    }
    if (!t->reencoded && (legacy || (quantized && !same))) { /* warned about, grouped, once the plan is complete */
        t->reencoded = 1;
        p->n_warnings++;
    }
    nf_codec_id c = fit_codec(p, t, recipe_codec(p, r, layer));
    t->codec = c;
    t->action = NF_ACT_ENCODE;
    if (c == NF_CODEC_NVFP4) {
        t->action = NF_ACT_NVFP4_QUANT;
        t->divisors = t->n_parts;
    }
    return NF_OK;
}

/* Tensors of one unify group read one encoded input: they all take the smallest input divisor (the
 * largest calibrated amax, so nothing saturates); the spread it replaced is recorded. */
static void unify_inputs(nf_plan *p)
{
    for (size_t i = 0; i < p->n; i++) {
        int g = p->t[i].unify_group;
        if (!g || p->t[i].n_input_divisors != 1) continue;
        float lo = INFINITY, hi = 0;
        for (size_t j = 0; j < p->n; j++)
            if (p->t[j].unify_group == g && p->t[j].n_input_divisors == 1) {
                lo = fminf(lo, p->t[j].in_spread_min);
                hi = fmaxf(hi, p->t[j].in_spread_max);
            }
        for (size_t j = 0; j < p->n; j++)
            if (p->t[j].unify_group == g && p->t[j].n_input_divisors == 1) {
                p->t[j].input_divisors[0] = lo;
                p->t[j].in_spread_min = lo;
                p->t[j].in_spread_max = hi;
            }
    }
}

/* ---- entry ------------------------------------------------------------------------------------ */

/* The distinct source codecs of t's parts, in order, joined by '+' ("q2_k+q3_k"); 1 if there are
 * more than one. */
static int part_codecs(const nf_plan_tensor *t, char *buf, size_t cap)
{
    int seen[NF_CODEC_COUNT] = {0}, k = 0;
    size_t o = 0;
    buf[0] = '\0';
    for (uint32_t i = 0; i < t->n_parts; i++) {
        nf_codec_id c = t->parts[i].src_codec;
        if (seen[c]++) continue;
        o += (size_t)snprintf(buf + o, o < cap ? cap - o : 0, "%s%s", k++ ? "+" : "", nf_codec_get(c)->name);
    }
    return k > 1;
}

/* One warning per source codec naming the decode-only tensors the recipe re-encodes, and one naming
 * the stacked tensors whose sources differ in codec (a real GGUF has hundreds: the first few are
 * named, --plan marks every one). */
static void warn_reencoded(const nf_plan *p)
{
    enum { SHOW = 8 };
    char names[SHOW * 96], mix[64];
    for (int c = 0; c < NF_CODEC_COUNT; c++) {
        size_t o = 0, n = 0;
        names[0] = '\0';
        for (size_t i = 0; i < p->n; i++) {
            const nf_plan_tensor *t = &p->t[i];
            if (t->reencoded != 1 || (int)t->parts[0].src_codec != c || part_codecs(t, mix, sizeof mix)) continue;
            if (n++ < SHOW) o += (size_t)snprintf(names + o, sizeof names - o, "%s%s (as %s)", n > 1 ? ", " : "", t->name,
                                                  nf_codec_get(t->codec)->name);
        }
        if (!n) continue;
        const nf_codec *sc = nf_codec_get((nf_codec_id)c);
        NF_WARN("convert: %zu tensor%s stored as %s (decode-only in ninfer) %s dequantized and re-encoded by recipe '%s': "
                "%s%s", n, n > 1 ? "s" : "", sc->name, n > 1 ? "are" : "is", p->recipe, names,
                n > SHOW ? ", ... (--plan marks every one [re-encoded])" : "");
    }
    /* Stacked from sources of different codecs (gate and up of a bank or shared expert): the stacked
     * matrix has one codec, and none holds both sources' values exactly (a grid of one k-quant is not
     * another's; q2_k, q3_k and iq4_* cannot be encoded at all), so there is no loss-free carry-over. */
    size_t o = 0, n = 0;
    names[0] = '\0';
    for (size_t i = 0; i < p->n; i++) {
        const nf_plan_tensor *t = &p->t[i];
        if (t->reencoded != 1 || !part_codecs(t, mix, sizeof mix)) continue;
        if (n++ < SHOW) o += (size_t)snprintf(names + o, sizeof names - o, "%s%s (%s, as %s)", n > 1 ? ", " : "", t->name,
                                              mix, nf_codec_get(t->codec)->name);
    }
    if (n)
        NF_WARN("convert: %zu stacked tensor%s mix%s source codecs and %s dequantized and re-encoded by recipe '%s' (a "
                "stacked matrix has one codec, and no codec holds both sources' values exactly, so it cannot be carried "
                "over): %s%s", n, n > 1 ? "s" : "", n > 1 ? "" : "es", n > 1 ? "are" : "is", p->recipe, names,
                n > SHOW ? ", ... (--plan marks every one [re-encoded])" : "");
    /* GGUF qwen35moe ssm_out: llama.cpp tiled its v-head column groups; a group narrower than (or not
     * a multiple of) the codec's block cannot be moved as encoded bytes. */
    o = 0, n = 0;
    names[0] = '\0';
    for (size_t i = 0; i < p->n; i++) {
        const nf_plan_tensor *t = &p->t[i];
        if (t->reencoded != 2) continue;
        if (n++ < SHOW) o += (size_t)snprintf(names + o, sizeof names - o, "%s%s (%s, as %s)", n > 1 ? ", " : "", t->name,
                                              nf_codec_get(t->parts[0].src_codec)->name, nf_codec_get(t->codec)->name);
    }
    if (n)
        NF_WARN("convert: %zu tensor%s %s dequantized and re-encoded by recipe '%s' because llama.cpp stored %s "
                "columns in tiled v-head order and a %u-column head group is not a whole number of the codec's blocks, "
                "so the columns cannot be put back in the artifact's order as encoded bytes: %s%s", n, n > 1 ? "s" : "",
                n > 1 ? "are" : "is", p->recipe, n > 1 ? "their" : "its", p->cfg.lin_v_dim, names,
                n > SHOW ? ", ... (--plan marks every one [re-encoded])" : "");
}

nf_status nf_plan_build(const char *source, const nf_convert_opts *o, nf_plan *p, nf_error *err)
{
    memset(p, 0, sizeof *p);
    snprintf(p->source, sizeof p->source, "%s", source);
    if (o && o->recipe) {
        char note[256];
        if (!nf_recipe_find(o->recipe))
            return nf_error_set(err, NF_ERR_INVALID_ARG, "unknown recipe '%s' (bf16, q8q8, q4q6, q4q5, nvfp4, source)%s",
                                o->recipe, nf_recipe_codec_note(o->recipe, note, sizeof note));
        snprintf(p->recipe, sizeof p->recipe, "%s", o->recipe);
    }
    p->requantize = o ? o->requantize : 0;
    struct stat st;
    if (stat(source, &st) != 0) return nf_error_set(err, NF_ERR_IO, "%s: no such file or folder", source);
    nf_status s;
    if (S_ISDIR(st.st_mode)) {
        p->src_kind = NF_SRC_HF;
        s = nf_plan_hf(p, source, err);
    } else {
        p->src_kind = NF_SRC_GGUF;
        s = nf_plan_gguf(p, err);
    }
    if (s == NF_OK) unify_inputs(p);
    if (s == NF_OK) warn_reencoded(p);
    if (s) nf_plan_free(p); /* nothing held after a failure (a caller's nf_plan_free is then a no-op) */
    return s;
}

void nf_plan_print(const nf_plan *p, FILE *f)
{
    static const char *const sq[] = {"unquantized", "compressed-tensors nvfp4", "modelopt nvfp4", "gguf"};
    fprintf(f, "source: %s (%s%s), arch %s, recipe %s, %zu tensors\n", p->source, sq[p->src_quant],
            p->w4a4 ? ", W4A4" : "", nf_hf_arch_name(p->cfg.arch), p->recipe, p->n);
    for (size_t i = 0; i < p->n; i++) {
        const nf_plan_tensor *t = &p->t[i];
        char shape[80];
        size_t o = 0;
        for (uint32_t d = 0; d < t->n_dims; d++)
            o += (size_t)snprintf(shape + o, sizeof shape - o, "%s%llu", d ? ", " : "[", (unsigned long long)t->dims[d]);
        snprintf(shape + o, sizeof shape - o, "]");
        fprintf(f, "%-26s %-6s %-16s %-11s <- ", t->name, nf_codec_get(t->codec)->name, shape, nf_plan_action_name(t->action));
        if (t->n_parts == 1) fprintf(f, "%s (%s)", t->parts[0].src, nf_codec_get(t->parts[0].src_codec)->name);
        else
            fprintf(f, "%u sources: %s[%llu..] ... %s[%llu..] (%s)", t->n_parts, t->parts[0].src,
                    (unsigned long long)t->parts[0].row0, t->parts[t->n_parts - 1].src,
                    (unsigned long long)t->parts[t->n_parts - 1].row0, nf_codec_get(t->parts[0].src_codec)->name);
        if (t->fallback) fprintf(f, " [fallback]");
        if (t->reencoded) fprintf(f, " [re-encoded]");
        if (t->n_parts && t->parts[0].add != 0) fprintf(f, " [1 + w]");
        if (t->n_parts && t->parts[0].neg_exp_log) fprintf(f, " [log(-x)]");
        if (t->n_parts && t->parts[0].untile_w) fprintf(f, " [v heads untiled]");
        fputc('\n', f);
        if (t->codec == NF_CODEC_NVFP4 && t->action == NF_ACT_NVFP4_COPY) {
            fprintf(f, "    divisors %u:", t->divisors);
            for (uint32_t k = 0; k < t->n_parts && k < 8; k++) fprintf(f, " %.6g", (double)t->parts[k].divisor);
            if (t->n_parts > 8) fprintf(f, " ...");
            fputc('\n', f);
        } else if (t->codec == NF_CODEC_NVFP4)
            fprintf(f, "    divisors %u: one per source, from its amax (weight-only)\n", t->divisors);
        if (t->flags & NF_TENSOR_ALLOW_A4) {
            fprintf(f, "    allow_a4, input divisors %u:", t->n_input_divisors);
            for (uint32_t k = 0; k < t->n_input_divisors && k < 8; k++) fprintf(f, " %.6g", (double)t->input_divisors[k]);
            if (t->n_input_divisors == 1)
                fprintf(f, " (unified: smallest of calibrated %.6g..%.6g)", (double)t->in_spread_min,
                        (double)t->in_spread_max);
            fputc('\n', f);
        }
    }
    fprintf(f, "%zu warnings\n", p->n_warnings);
}

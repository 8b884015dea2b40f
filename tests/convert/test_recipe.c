/* The recipe table (src/convert/recipe.h) against docs/convert.md, restated here cell by cell (the
 * table, llama.cpp's use_more_bits written out as layer lists, the fallback rule, `source` = q8_0
 * for what it re-encodes), and the schema name -> role map against docs/model_schema.md's names.
 * The converter's plan and synth both read this table; tests/synth checks their roles agree. */
#include <string.h>

#include "convert/recipe.h"
#include "nf_test.h"

static const char *recipes[] = {"bf16", "q8q8", "q4q6", "q4q5", "nvfp4", "source"};
#define NREC 6

/* One row of docs/convert.md's table: per recipe, the codec in a plain case, with E == 8, on a
 * more_bits layer and with tied embeddings (NULL: as plain). */
typedef struct cell {
    const char *plain, *e8, *more_bits, *tied;
} cell;

typedef struct doc_row {
    const char *names[3]; /* schema names of this row (layer 7 or 8 substituted for %d) */
    cell c[NREC];         /* bf16 q8q8 q4q6 q4q5 nvfp4 source */
} doc_row;

#define P(...) {.plain = __VA_ARGS__} /* a cell: P(plain codec, .e8 = ..., ...) */
#define BF P("bf16")
#define Q8 P("q8_0")
#define F32 P("f32")
static const doc_row doc[] = {
    {{"token_embd"}, {BF, Q8, P("q4_k", .tied = "q6_k"), P("q5_k", .tied = "q6_k"), BF, Q8}},
    {{"output"}, {BF, Q8, P("q6_k"), P("q6_k"), BF, Q8}},
    {{"blk.%d.attn_q"}, {BF, Q8, P("q4_k"), P("q5_k"), BF, Q8}},
    {{"blk.%d.attn_k"}, {BF, Q8, P("q4_k", .e8 = "q8_0"), P("q5_k", .e8 = "q8_0"), BF, Q8}},
    {{"blk.%d.attn_v"},
     {BF, Q8, P("q4_k", .e8 = "q8_0", .more_bits = "q6_k"), P("q5_k", .e8 = "q8_0", .more_bits = "q6_k"), BF, Q8}},
    {{"blk.%d.attn_output"}, {BF, Q8, P("q4_k", .e8 = "q5_k"), P("q5_k"), BF, Q8}},
    {{"blk.%d.ffn_gate", "blk.%d.ffn_up"}, {BF, Q8, P("q4_k"), P("q5_k"), BF, Q8}},
    {{"blk.%d.ffn_down"}, {BF, Q8, P("q4_k", .more_bits = "q6_k"), P("q5_k", .more_bits = "q6_k"), BF, Q8}},
    {{"blk.%d.ffn_gate_up_shexp"}, {BF, Q8, P("q4_k"), P("q5_k"), P("nvfp4"), Q8}},
    {{"blk.%d.ffn_down_shexp"}, {BF, Q8, P("q4_k", .more_bits = "q6_k"), P("q5_k", .more_bits = "q6_k"), P("nvfp4"), Q8}},
    {{"blk.%d.ffn_gate_up_exps"}, {BF, Q8, P("q4_k"), P("q4_k"), P("nvfp4"), Q8}},
    {{"blk.%d.ffn_down_exps"}, {BF, Q8, P("q6_k"), P("q5_k"), P("nvfp4"), Q8}},
    /* norms, biases, the shared-expert gate, routers: f32 in every recipe */
    {{"output_norm", "blk.%d.attn_norm", "blk.%d.ffn_norm"}, {F32, F32, F32, F32, F32, F32}},
    {{"blk.%d.attn_q_bias", "blk.%d.attn_k_bias", "blk.%d.attn_v_bias"}, {F32, F32, F32, F32, F32, F32}},
    {{"blk.%d.attn_q_norm", "blk.%d.attn_k_norm", "blk.%d.ffn_gate_inp_shexp"}, {F32, F32, F32, F32, F32, F32}},
    {{"blk.%d.ffn_gate_inp"}, {F32, F32, F32, F32, F32, F32}},
};

/* The codec of `name` (layer substituted) under recipe r for the model m, rows of 2048 (every
 * codec's block divides them: no fallback). */
static const char *codec_of(const char *recipe, const char *fmt, int layer, nf_recipe_model m)
{
    char name[64];
    snprintf(name, sizeof name, fmt, layer);
    int l, role = nf_recipe_role_of(name, &l);
    CHECK_MSG(role >= 0, "%s: no role", name);
    if (role < 0) return "?";
    CHECK_MSG(strncmp(name, "blk.", 4) != 0 || l == layer, "%s: layer %d", name, l);
    const nf_recipe *r = nf_recipe_find(recipe);
    int fb = -1;
    nf_codec_id c = nf_recipe_fit(nf_recipe_codec(r, (nf_role)role, l, &m), 2048, &fb);
    CHECK_MSG(fb == 0, "%s %s: fell back at 2048 columns", recipe, name);
    return nf_codec_get(c)->name;
}

static void expect(const char *recipe, const char *fmt, int layer, nf_recipe_model m, const char *want,
                   const char *situation)
{
    const char *got = codec_of(recipe, fmt, layer, m);
    CHECK_MSG(strcmp(got, want) == 0, "%s %s (layer %d, %s): %s, docs/convert.md says %s", recipe, fmt, layer, situation,
              got, want);
}

static void test_table(void)
{
    /* 48 layers (Qwen3-30B-A3B's): layer 7 is not a more_bits layer, layer 8 is (lists below) */
    const nf_recipe_model plain = {48, 128, 0}, e8 = {48, 8, 0}, tied = {48, 128, 1};
    int cells = 0;
    for (size_t i = 0; i < sizeof doc / sizeof doc[0]; i++)
        for (int k = 0; k < 3 && doc[i].names[k]; k++)
            for (int r = 0; r < NREC; r++) {
                const cell *c = &doc[i].c[r];
                const char *n = doc[i].names[k];
                expect(recipes[r], n, 7, plain, c->plain, "plain");
                expect(recipes[r], n, 7, e8, c->e8 ? c->e8 : c->plain, "E == 8");
                expect(recipes[r], n, 8, plain, c->more_bits ? c->more_bits : c->plain, "more_bits layer");
                expect(recipes[r], n, 7, tied, c->tied ? c->tied : c->plain, "tied");
                /* attn_v: E == 8 wins over more_bits (llama.cpp checks n_expert == 8 first) */
                const char *both = c->e8 ? c->e8 : c->more_bits ? c->more_bits : c->plain;
                expect(recipes[r], n, 8, e8, both, "E == 8 on a more_bits layer");
                cells++;
            }
    printf("recipe table: %d cells x 5 situations against docs/convert.md\n", cells);
    CHECK(cells == 23 * NREC);
}

/* use_more_bits(i, n) = i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2, evaluated by hand */
static void test_more_bits(void)
{
    static const int mb48[] = {0, 1, 2, 3, 4, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35, 38, 41, 42, 43, 44, 45, 46, 47};
    static const int mb28[] = {0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27}; /* n/8 = 3, 7n/8 = 24 */
    static const int mb2[] = {1};                                                 /* n/8 = 0, 7n/8 = 1 */
    const struct {
        uint32_t n;
        const int *l;
        size_t k;
    } cases[] = {{48, mb48, 24}, {28, mb28, 14}, {2, mb2, 1}};
    for (size_t c = 0; c < 3; c++) {
        const nf_recipe_model m = {cases[c].n, 64, 0};
        for (int i = 0; i < (int)cases[c].n; i++) {
            int want = 0;
            for (size_t j = 0; j < cases[c].k; j++) want |= cases[c].l[j] == i;
            expect("q4q6", "blk.%d.ffn_down", i, m, want ? "q6_k" : "q4_k", "more_bits list");
            expect("q4q5", "blk.%d.attn_v", i, m, want ? "q6_k" : "q5_k", "more_bits list");
        }
    }
}

/* "A row length a codec cannot take (k-quants need multiples of 256) falls back to q8_0 (bf16 if
 * not a multiple of 32)" */
static void test_fallback(void)
{
    const struct {
        nf_codec_id c;
        uint64_t cols;
        const char *want;
        int fb;
    } cases[] = {
        {NF_CODEC_Q4_K, 256, "q4_k", 0}, {NF_CODEC_Q4_K, 64, "q8_0", 1}, {NF_CODEC_Q6_K, 128, "q8_0", 1},
        {NF_CODEC_Q5_K, 48, "bf16", 1},  {NF_CODEC_Q8_0, 32, "q8_0", 0}, {NF_CODEC_Q8_0, 48, "bf16", 1},
        {NF_CODEC_BF16, 7, "bf16", 0},   {NF_CODEC_F32, 3, "f32", 0},    {NF_CODEC_NVFP4, 64, "nvfp4", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int fb = -1;
        nf_codec_id c = nf_recipe_fit(cases[i].c, cases[i].cols, &fb);
        CHECK_MSG(strcmp(nf_codec_get(c)->name, cases[i].want) == 0 && fb == cases[i].fb,
                  "%s at %llu columns: %s (fell back %d), want %s (%d)", nf_codec_get(cases[i].c)->name,
                  (unsigned long long)cases[i].cols, nf_codec_get(c)->name, fb, cases[i].want, cases[i].fb);
    }
    CHECK(nf_recipe_fit(NF_CODEC_Q4_K, 64, NULL) == NF_CODEC_Q8_0); /* fell_back may be NULL */
}

static void test_names(void)
{
    for (int r = 0; r < NREC; r++) CHECK_MSG(nf_recipe_find(recipes[r]) != NULL, "%s", recipes[r]);
    CHECK(nf_recipe_find("Q4Q6") == NULL);
    CHECK(nf_recipe_find("q4") == NULL);
    CHECK(nf_recipe_find("") == NULL);
    CHECK(nf_recipe_find(NULL) == NULL);
    static const char *bad[] = {"blk.0.attn_qq", "blk.x.attn_q", "blk.-1.attn_q", "blk.0", "blk..attn_q",
                                "tok_embd", "blk.0.attn_q.weight", "output.weight", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int l;
        CHECK_MSG(nf_recipe_role_of(bad[i], &l) == -1, "'%s' has a role", bad[i]);
    }
    int l;
    CHECK(nf_recipe_role_of("blk.123.ffn_down_exps", &l) == NF_ROLE_EXP_DOWN && l == 123);
    CHECK(nf_recipe_role_of("token_embd", &l) == NF_ROLE_EMBD && l == -1);
}

/* Import-only codecs (q2_k, q3_k, iq4_xs, iq4_nl) have no quantizer: no recipe may pick one for any
 * role, layer, expert count or tying, and their names given as a recipe are refused with the reason. */
static void test_import_only(void)
{
    int checked = 0;
    for (int r = 0; r < NREC; r++)
        for (int role = 0; role < NF_ROLE_COUNT; role++)
            for (uint32_t e = 0; e <= 8; e += 8)
                for (int tied = 0; tied < 2; tied++)
                    for (int layer = 0; layer < 24; layer++) {
                        const nf_recipe_model m = {24, e, tied};
                        const nf_codec *c = nf_codec_get(nf_recipe_codec(nf_recipe_find(recipes[r]), (nf_role)role, layer, &m));
                        CHECK_MSG(c && !(c->flags & NF_CODEC_IMPORT_ONLY) &&
                                      (c->quantize_row || (c->flags & NF_CODEC_PLANAR) || c->id == NF_CODEC_F32),
                                  "recipe %s role %d layer %d picks %s, which has no quantizer", recipes[r], role, layer,
                                  c ? c->name : "?");
                        checked++;
                    }
    CHECK(checked == NREC * NF_ROLE_COUNT * 2 * 2 * 24);
    static const char *imp[] = {"q2_k", "q3_k", "iq4_xs", "iq4_nl"};
    char note[256];
    for (size_t i = 0; i < 4; i++) {
        CHECK(nf_recipe_find(imp[i]) == NULL);
        CHECK_CONTAINS(nf_recipe_codec_note(imp[i], note, sizeof note), "cannot encode (no quantizer)");
        CHECK_CONTAINS(note, imp[i]);
    }
    CHECK_CONTAINS(nf_recipe_codec_note("q4_k", note, sizeof note), "q4_k is a codec, not a recipe");
    CHECK(strcmp(nf_recipe_codec_note("q9", note, sizeof note), "") == 0);
}

int main(void)
{
    test_table();
    test_more_bits();
    test_fallback();
    test_names();
    test_import_only();
    return nf_test_report();
}

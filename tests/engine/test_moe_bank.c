/* nf_moe_bank_of_layer on converted fixture models: every matrix of the operator's bank points at
 * the artifact tensor of that name with its shape, codec and divisors; dense layers and layers out
 * of range are refused naming the layer. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <unistd.h>

#include "convert/convert.h"
#include "engine/moe_bank.h"
#include "nf_test.h"

static int convert(const char *src, const char *recipe, const char *out)
{
    nf_convert_opts o = {.recipe = recipe, .threads = 2, .quiet = 1};
    nf_plan p;
    nf_error e;
    if (nf_plan_build(src, &o, &p, &e)) {
        CHECK_MSG(0, "plan %s: %s", src, e.msg);
        return 0;
    }
    nf_status st = nf_convert_run(&p, out, &o, NULL, &e);
    nf_plan_free(&p);
    CHECK_MSG(st == NF_OK, "convert %s: %s", src, e.msg);
    return st == NF_OK;
}

/* The bank matrix must be the named tensor, seen as [experts][rows][cols]. */
static void same(const nf_model *m, const nf_moe_matrix *x, const char *name, uint32_t e, uint32_t r, uint32_t c)
{
    const nf_tensor *t = nf_artifact_find_tensor(m->art, name);
    CHECK_MSG(t != NULL, "%s missing", name);
    if (!t) return;
    CHECK_MSG(x->data == t->data, "%s: data pointer", name);
    CHECK_EQ_INT(x->codec, t->desc.codec);
    CHECK_MSG(x->experts == e && x->rows == r && x->cols == c, "%s: [%u][%u][%u], want [%u][%u][%u]", name,
              x->experts, x->rows, x->cols, e, r, c);
    CHECK_EQ_INT(x->divisors, t->desc.divisors ? t->desc.divisors : 1);
}

int main(void)
{
    char dir[] = "/tmp/nf_moe_bank_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char out[512];
    nf_error e;

    /* qwen2_moe: layer 0 MoE with a shared expert, layer 1 dense (mlp_only_layers) */
    snprintf(out, sizeof out, "%s/q2.nf", dir);
    if (convert(NF_TEST_DATA "/fixtures/models/qwen2_moe", "q8q8", out)) {
        nf_model *m;
        CHECK_EQ_INT(nf_model_load(out, &m, &e), NF_OK);
        const nf_model_config *c = &m->cfg;
        nf_moe_bank b;
        CHECK_EQ_INT(nf_moe_bank_of_layer(m, 0, &b, &e), NF_OK);
        CHECK(b.hidden == c->hidden && b.experts == c->experts && b.top_k == c->top_k && b.inter == c->moe_inter);
        CHECK(b.shared_inter == c->shared_inter && b.shared_inter > 0);
        CHECK_EQ_INT(b.norm_topk, c->norm_topk);
        same(m, &b.router, "blk.0.ffn_gate_inp", 1, c->experts, c->hidden);
        same(m, &b.gate_up, "blk.0.ffn_gate_up_exps", c->experts, 2 * c->moe_inter, c->hidden);
        same(m, &b.down, "blk.0.ffn_down_exps", c->experts, c->hidden, c->moe_inter);
        same(m, &b.shared_gate_up, "blk.0.ffn_gate_up_shexp", 1, 2 * c->shared_inter, c->hidden);
        same(m, &b.shared_down, "blk.0.ffn_down_shexp", 1, c->hidden, c->shared_inter);
        same(m, &b.shared_gate, "blk.0.ffn_gate_inp_shexp", 1, 1, c->hidden);
        CHECK_EQ_INT(nf_moe_bank_of_layer(m, 1, &b, &e), NF_ERR_INVALID_ARG);
        CHECK_CONTAINS(e.msg, "layer 1 is a dense MLP layer");
        CHECK_EQ_INT(nf_moe_bank_of_layer(m, 99, &b, &e), NF_ERR_INVALID_ARG);
        CHECK_CONTAINS(e.msg, "layer 99: the model has");
        nf_model_free(m);
    }
    unlink(out);

    /* qwen3_moe: no shared expert, so the shared matrices are absent (codec -1) */
    snprintf(out, sizeof out, "%s/q3.nf", dir);
    if (convert(NF_TEST_DATA "/fixtures/models/qwen3_moe", "bf16", out)) {
        nf_model *m;
        CHECK_EQ_INT(nf_model_load(out, &m, &e), NF_OK);
        nf_moe_bank b;
        CHECK_EQ_INT(nf_moe_bank_of_layer(m, 0, &b, &e), NF_OK);
        CHECK_EQ_INT(b.shared_inter, 0);
        CHECK_EQ_INT(b.shared_gate_up.codec, -1);
        CHECK_EQ_INT(b.shared_gate.codec, -1);
        CHECK_EQ_INT(b.gate_up.codec, NF_CODEC_BF16);
        same(m, &b.gate_up, "blk.0.ffn_gate_up_exps", m->cfg.experts, 2 * m->cfg.moe_inter, m->cfg.hidden);
        nf_model_free(m);
    }
    unlink(out);

    /* a compressed-tensors W4A4 checkpoint: AllowA4 on the expert inputs, one gate/up input divisor,
     * one down input divisor per expert, all passed through (the operator's W4A4 route reads them) */
    snprintf(out, sizeof out, "%s/nv.nf", dir);
    if (convert(NF_TEST_DATA "/fixtures/convert/ct_nvfp4", NULL, out)) {
        nf_model *m;
        CHECK_EQ_INT(nf_model_load(out, &m, &e), NF_OK);
        nf_moe_bank b;
        CHECK_EQ_INT(nf_moe_bank_of_layer(m, 0, &b, &e), NF_OK);
        const nf_tensor *gu = nf_artifact_find_tensor(m->art, "blk.0.ffn_gate_up_exps");
        const nf_tensor *dn = nf_artifact_find_tensor(m->art, "blk.0.ffn_down_exps");
        CHECK(gu && dn);
        if (gu && dn) {
            CHECK_EQ_INT(b.gate_up.codec, NF_CODEC_NVFP4);
            CHECK(b.gate_up.allow_a4 && b.down.allow_a4);
            CHECK_EQ_INT(b.gate_up.n_input_divisors, 1);
            CHECK(b.gate_up.input_divisors == gu->desc.input_divisors);
            CHECK_EQ_INT(b.down.n_input_divisors, b.experts);
            CHECK(b.down.input_divisors == dn->desc.input_divisors);
            CHECK(b.down.input_divisor == dn->desc.input_divisors[0]);
            same(m, &b.down, "blk.0.ffn_down_exps", m->cfg.experts, m->cfg.hidden, m->cfg.moe_inter);
        }
        nf_model_free(m);
    }
    unlink(out);
    rmdir(dir);
    return nf_test_report();
}

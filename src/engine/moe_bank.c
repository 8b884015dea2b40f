#include "engine/moe_bank.h"

#include <string.h>

nf_moe_matrix nf_moe_matrix_of(const nf_tensor *t)
{
    nf_moe_matrix m;
    memset(&m, 0, sizeof m);
    m.codec = -1;
    if (!t) return m;
    const nf_tensor_desc *d = &t->desc;
    m.codec = (int)d->codec;
    m.data = t->data;
    m.experts = d->n_dims == 3 ? (uint32_t)d->dims[0] : 1;
    m.rows = d->n_dims >= 2 ? (uint32_t)d->dims[d->n_dims - 2] : 1;
    m.cols = (uint32_t)d->dims[d->n_dims - 1];
    m.divisors = d->divisors ? d->divisors : 1;
    m.allow_a4 = (d->flags & NF_TENSOR_ALLOW_A4) != 0;
    /* all of them: a down bank carries one per expert (the operator's W4A4 route encodes each
     * expert's intermediate with its own) */
    m.n_input_divisors = d->n_input_divisors;
    m.input_divisors = d->input_divisors;
    m.input_divisor = d->n_input_divisors ? d->input_divisors[0] : 0.0f;
    return m;
}

/* The bank of layer L (an MoE layer of m). */
static void bank_of(const nf_model *m, const nf_model_layer *L, nf_moe_bank *bank)
{
    const nf_model_config *c = &m->cfg;
    bank->hidden = c->hidden;
    bank->experts = c->experts;
    bank->top_k = c->top_k;
    bank->inter = c->moe_inter;
    bank->shared_inter = L->ffn_gate_up_shexp ? c->shared_inter : 0;
    bank->norm_topk = c->norm_topk;
    bank->router = nf_moe_matrix_of(L->ffn_gate_inp);
    bank->gate_up = nf_moe_matrix_of(L->ffn_gate_up_exps);
    bank->down = nf_moe_matrix_of(L->ffn_down_exps);
    bank->shared_gate_up = nf_moe_matrix_of(L->ffn_gate_up_shexp);
    bank->shared_down = nf_moe_matrix_of(L->ffn_down_shexp);
    bank->shared_gate = nf_moe_matrix_of(L->ffn_gate_inp_shexp);
}

nf_status nf_moe_bank_of_layer(const nf_model *m, uint32_t layer, nf_moe_bank *bank, nf_error *err)
{
    memset(bank, 0, sizeof *bank);
    const nf_model_config *c = &m->cfg;
    if (layer >= c->layers)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "layer %u: the model has %u layers", layer, c->layers);
    if (!m->layers[layer].is_moe)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "layer %u is a dense MLP layer, not a sparse-MoE block", layer);
    bank_of(m, &m->layers[layer], bank);
    return NF_OK;
}

nf_status nf_moe_bank_of_mtp(const nf_model *m, nf_moe_bank *bank, nf_error *err)
{
    memset(bank, 0, sizeof *bank);
    if (!m->mtp || !m->mtp->is_moe)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "%s", m->mtp ? "the MTP block has a dense MLP, not a sparse-MoE "
                            "block" : "the model has no MTP block");
    bank_of(m, m->mtp, bank);
    return NF_OK;
}

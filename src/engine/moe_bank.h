/* The sparse-MoE operator's view of one layer of a loaded model: host pointers into the mapped
 * artifact, shapes, divisors and policies, ready for nf_sparse_moe_bind (the GPU engine and
 * `ninfer bench sparse-moe -m model.nf --layer N` use it). */
#ifndef NF_ENGINE_MOE_BANK_H
#define NF_ENGINE_MOE_BANK_H

#include "backend/cuda/sparse_moe/sparse_moe.h"
#include "model/model.h"

/* A tensor as one of the operator's matrices: [E][rows][cols], [rows][cols] (1 expert) or [cols]
 * (1 x 1 x cols). NULL gives an absent matrix (codec -1). The GPU engine's dense layers use it too.
 * W4A4 input divisors: the matrix points at the tensor's (one for gate/up, one per expert for a
 * down bank); input_divisor repeats the first. */
nf_moe_matrix nf_moe_matrix_of(const nf_tensor *t);

/* Fills *bank for MoE layer `layer`. Fails naming the layer when it is out of range or dense. */
nf_status nf_moe_bank_of_layer(const nf_model *m, uint32_t layer, nf_moe_bank *bank, nf_error *err);
/* The same for the MTP block's layer (nf_model.mtp); fails when there is none or it is dense. */
nf_status nf_moe_bank_of_mtp(const nf_model *m, nf_moe_bank *bank, nf_error *err);

#endif

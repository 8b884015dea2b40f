/* The state-slot contract of a batch (batch.h), one check for every backend. */
#include "base/batch.h"

nf_status nf_batch_check_slots(const nf_batch *b, uint32_t max_seqs, const uint32_t *slot_pos, const char *who,
                               nf_error *err)
{
    if (!b->state_slot)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "%s: the model has Gated DeltaNet layers, so every batch needs "
                            "state slots (nf_batch.state_slot)", who);
    for (uint32_t i = 0; i < b->n_seqs; i++) {
        const uint32_t sl = b->state_slot[i];
        if (sl >= max_seqs)
            return nf_error_set(err, NF_ERR_INVALID_ARG, "%s: sequence %u's state slot %u is not below max_seqs %u", who,
                                i, sl, max_seqs);
        for (uint32_t j = 0; j < i; j++)
            if (b->state_slot[j] == sl)
                return nf_error_set(err, NF_ERR_INVALID_ARG, "%s: sequences %u and %u share state slot %u", who, j, i, sl);
        if (b->pos0[i] && b->pos0[i] != slot_pos[sl])
            return nf_error_set(err, NF_ERR_INVALID_ARG, "%s: sequence %u continues at position %u but its state slot %u "
                                "holds %u positions; a recurrent state cannot rewind or skip (recompute from 0)", who, i,
                                b->pos0[i], sl, slot_pos[sl]);
    }
    return NF_OK;
}

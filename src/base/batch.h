/* One batched forward: the shape every backend's forward takes (engine.h nf_backend_ops.forward, the
 * CUDA decoder's nf_cuda_decoder_forward_batch). It lives in base so that the engine and the backends
 * (which depend on codec and base only) share it without a translation layer.
 *
 * A batch is the tokens of n_seqs sequences, concatenated sequence by sequence: a decode step is one
 * token of a sequence, a prefill chunk several. Sequence i owns tokens seq_start[i] .. seq_start[i+1]-1
 * (at least one) at positions pos0[i], pos0[i] + 1, ...; pos0[i] is how many of its tokens are already
 * in the KV cache.
 *
 * The KV cache is a pool of pages of `page_tokens` positions each (every layer's K and V; the backend
 * allocates kv_pages of them at create). Position p of sequence i lives in slot p % page_tokens of page
 * pages[i * page_stride + p / page_tokens]. The forward writes its tokens' keys and values into their
 * slots, then every token attends to positions 0 .. its own of its own sequence: a decode token to its
 * cached pages, a prefill chunk to its cached prefix and causally within the chunk. Slots below pos0[i]
 * are only read, so a page several sequences share (a cached prefix) is never written by a forward: the
 * engine copies a shared partial page before a sequence appends to it (copy-on-write, copy_page).
 *
 * A sequence's logits depend only on its own tokens and pages, never on what else is in the batch
 * (CPU: bit-identical to running it alone with the same chunk boundaries; CUDA: within the routes'
 * argued tolerances). Dynamic NTK rope, whose frequencies follow one sequence's length, is the
 * exception: a backend refuses a batch of more than one sequence for such a model.
 *
 * Recurrent state (Gated DeltaNet hybrids): state_slot[i] names sequence i's fixed-size slot (conv state
 * and delta-rule matrices), allocated by the backend beside the pages; NULL for attention-only models. */
#ifndef NF_BASE_BATCH_H
#define NF_BASE_BATCH_H

#include <stdint.h>

#include "base/error.h"

typedef struct nf_batch {
    uint32_t n_tokens;          /* T: all sequences' tokens of this forward (T <= the backend's chunk) */
    uint32_t n_seqs;            /* S (S <= the backend's max_seqs) */
    const int32_t *tokens;      /* [T] ids < vocab */
    const uint32_t *seq_start;  /* [S + 1]: seq_start[0] = 0, increasing, seq_start[S] = T */
    const uint32_t *pos0;       /* [S]: positions already cached (pos0[i] + its tokens <= ctx) */
    const uint32_t *pages;      /* [S][page_stride] page ids < kv_pages; entries past a sequence's
                                 * last position are not read */
    uint32_t page_stride;       /* >= ceil(ctx / page_tokens) */
    const uint32_t *state_slot; /* [S] or NULL (see above) */
    int all_logits;             /* logits of every token, [T][vocab]; else each sequence's last token,
                                 * [S][vocab] */
    const uint32_t *logit_rows; /* [S] or NULL: sequence i's logits are those of its last logit_rows[i]
                                 * tokens (1 .. its tokens), the sequences' rows concatenated,
                                 * [sum][vocab] (speculation's verification positions); overrides
                                 * all_logits. Only backends with nf_backend_ops.logit_rows take it. */
} nf_batch;

/* Logits rows of sequence i (1 without logit_rows, all its tokens with all_logits). */
static inline uint32_t nf_batch_rows_of(const nf_batch *b, uint32_t i)
{
    return b->logit_rows ? b->logit_rows[i] : b->all_logits ? b->seq_start[i + 1] - b->seq_start[i] : 1;
}

/* Repetition, presence and frequency penalties of one sequence (1, 0, 0: off), as a backend applies
 * them to the sequence's logits before its top-k (engine/sampler.h says the rule, engine.h
 * nf_backend_ops.penalize takes one record per sequence of the last forward). Here beside nf_batch
 * so that the engine's sampler and the CUDA decoder share one record, not two layouts and a copy. */
typedef struct nf_penalty {
    float repetition, presence, frequency;
} nf_penalty;

/* Token t's sequence and position are found by walking seq_start; a helper for backends. */
static inline uint32_t nf_batch_tokens_of(const nf_batch *b, uint32_t i)
{
    return b->seq_start[i + 1] - b->seq_start[i];
}

/* The state-slot contract (hybrids), checked before a backend touches any slot: state_slot present,
 * every slot below max_seqs and distinct, and a sequence past position 0 continuing exactly where its
 * slot stopped (slot_pos[slot]: positions absorbed; a recurrent state cannot rewind). `who` opens the
 * message ("cpu backend"). */
nf_status nf_batch_check_slots(const nf_batch *b, uint32_t max_seqs, const uint32_t *slot_pos, const char *who,
                               nf_error *err);

#endif

/* The scheduler's sequence and state, shared by sched.c (the step), sched_plan.c (its planning) and
 * sched_spec.c (speculation); not a public interface. */
#ifndef NF_ENGINE_SCHED_INTERNAL_H
#define NF_ENGINE_SCHED_INTERNAL_H

#include "engine/sched.h"
#include "engine/spec.h"
#include "engine/stopstream.h"

typedef enum seq_state { SEQ_WAITING, SEQ_ACTIVE, SEQ_DONE } seq_state;

#define NO_SLOT UINT32_MAX

typedef struct seq {
    uint64_t id;
    uint64_t admitted;  /* admission stamp: the largest is the newest active sequence */
    seq_state state;
    nf_seq_end end;
    int32_t *toks;      /* [n] prompt then generated (cap allocated) */
    size_t n, cap, n_prompt, n_gen;
    size_t n_cached;    /* toks[0, n_cached) have keys/values in the pages */
    uint32_t *pages;    /* [page_stride] page table, n_pages used */
    uint32_t n_pages;
    uint32_t n_published; /* pages[0, n_published) are in the prefix cache; UINT32_MAX: chain broken */
    uint32_t reserved;  /* opts.reserve: pages set aside for it and not allocated yet */
    nf_sampler *sampler;
    nf_seq_params p;    /* eos and stops point at the copies below */
    int32_t *eos;
    char **stops;
    nf_stop_stream ss;
    int has_text;
    uint32_t take;      /* tokens in the batch being built */
    uint32_t slot;      /* opts.state_slots: its recurrent state slot while active, else NO_SLOT */
    size_t snap_cut;    /* hybrids with the cache: a piece ends here so that a snapshot of a prefix matched
                         * without one is taken (0: none) */
    uint32_t snap_cut_page; /* the cached page that snapshot is for (the deepest one matched) */
    uint32_t snap_dec;  /* the page whose snapshot it took last while decoding (dropped for the next) */
    /* the text of the event being built (set by the stop stream's callback) */
    const char *ev_text;
    size_t ev_len;
    /* p.logprobs: the sampled token's log-probability and the best alternatives (the event's) */
    float lp;
    uint32_t n_top;
    int32_t top_ids[NF_SEQ_MAX_TOP_LOGPROBS];
    float top_lp[NF_SEQ_MAX_TOP_LOGPROBS];
    /* speculation (sched_spec.c; 0 / NULL without) */
    uint32_t spec_k;    /* drafts a step at most */
    int spec_mtp;       /* drafts from the MTP block, else prompt lookup */
    uint32_t n_draft;   /* drafts in the batch being built, draft[n_draft] after its uncached tokens */
    int32_t draft[NF_SPEC_MAX_K];
    uint32_t redo;      /* uncached tokens before the last that a rolled-back verification left: they are
                         * fed again as part of the sequence's next decode */
    uint32_t c0, kept;  /* this step: the first fed position, and how many fed positions are final */
    size_t mtp_done;    /* positions the MTP block has run (its keys and values are in the pages) */
    size_t mtp_at;      /* the block's drafts mtp_draft[n_mtp] follow toks[0, mtp_at) */
    uint32_t n_mtp;
    int32_t mtp_draft[NF_SPEC_MTP_MAX_K];
    float *mtp_q;       /* [NF_SPEC_MTP_MAX_K][vocab] under sampling: mtp_draft's proposal rows (nf_sampler_draft) */
    const float *draft_q; /* draft's proposal rows (mtp_q), NULL: point masses (greedy, ngram, an outside drafter) */
} seq;

struct nf_sched {
    nf_sched_backend be;
    nf_sched_opts o;
    nf_kvpool *pool;
    uint32_t page_stride;
    seq **seqs; /* [n_seqs] in arrival order (ids increase) */
    size_t n_seqs, cap;
    uint64_t next_id, next_stamp;
    uint32_t reserved; /* opts.reserve: the sum of the active sequences' reservations (<= available pages) */
    /* batch buffers */
    int32_t *tokens;     /* [chunk] */
    uint32_t *seq_start; /* [max_seqs + 1] */
    uint32_t *pos0;      /* [max_seqs] */
    uint32_t *pages;     /* [max_seqs][page_stride] */
    uint32_t *slots;     /* [max_seqs]: each batched sequence's state slot (opts.state_slots) */
    uint8_t *slot_used;  /* [max_seqs]: slots held by active sequences */
    seq **batch;         /* [max_seqs] */
    seq **order;         /* [n_seqs] scratch: active sequences by admission */
    size_t order_cap;
    float *logits;       /* [max_seqs][vocab] */
    int32_t *top_ids;    /* [max_seqs][NF_SAMPLER_DEVICE_MAX_K] */
    float *top_vals;
    nf_penalty_lists pen; /* the batch's penalty pairs (backends with penalize) */
    /* speculation (sched_spec.c) */
    uint32_t *rows;      /* [max_seqs]: the batch's logit_rows (1 + drafts) */
    uint32_t *row0;      /* [max_seqs]: each batched sequence's first row in the logits */
    float *spec_logits;  /* [spec_cap][vocab]: a batch with drafts takes its rows here */
    size_t spec_cap;
    float *hid;          /* [chunk][mtp_hidden]: the forward's hidden states (mtp), then the block's */
    float *hid_in;       /* [chunk][mtp_hidden]: the block's input rows */
    int32_t *mtp_tok;    /* [chunk] */
    seq **mtp_seqs;      /* [max_seqs] */
};

typedef struct plan {
    uint32_t T, S;
} plan;

/* The hybrids' prefix cache takes state snapshots (docs/sched.md "The prefix cache for hybrids"). */
static inline int nf_sched_snapshots(const nf_sched *s)
{
    return s->o.state_slots && !s->o.no_prefix_cache && s->o.state_snaps;
}

/* q drafts with the MTP block */
static inline int nf_sched_mtp_seq(const nf_sched *s, const seq *q) { return s->o.mtp_hidden && q->spec_mtp && q->spec_k; }

/* sched.c */
void nf_sched_release_pages(nf_sched *s, seq *q);
/* q ends (end says why): its pages back to the pool, its last event sent */
void nf_sched_finish(nf_sched *s, seq *q, nf_seq_end end);
uint32_t nf_sched_ensure_pages(nf_sched *s, seq *q, uint32_t want, nf_status *rc, nf_error *err);
nf_status nf_sched_accept_token(nf_sched *s, seq *q, int32_t id, nf_sched_step_info *info, nf_error *err);
const int32_t *nf_sched_pen_hist(const seq *q, size_t *n);
void nf_sched_logprobs(seq *q, const float *l, uint32_t vocab, int32_t id);

/* sched_plan.c: the step's batch into s->batch[0, b->S) (each sequence's take and n_draft set);
 * b->T = 0 when nothing can run. */
nf_status nf_sched_plan_batch(nf_sched *s, plan *b, nf_sched_step_info *info, nf_error *err);

/* sched_spec.c: speculation per sequence (docs/sched.md "Speculation") */
/* q's drafts for a decode of u uncached tokens into q->draft (its own limits: K, the context, max_new,
 * K + 1 positions per verification); returns how many. */
uint32_t nf_sched_spec_drafts(const nf_sched *s, seq *q, uint32_t u);
/* Before the forward: the state slots of hybrid sequences that verify drafts are copied out. */
nf_status nf_sched_spec_save(nf_sched *s, const plan *b, nf_error *err);
/* After the forward: q's drafts checked against rows[1 + n_draft][vocab], the accepted ones and the
 * next token taken; rejected positions rolled back (pages past the kept tokens released; a hybrid's
 * slot restored, the kept tokens fed again next step). */
nf_status nf_sched_spec_accept(nf_sched *s, seq *q, const float *rows, nf_sched_step_info *info, nf_error *err);
/* After sampling: the MTP block over every MTP sequence's newly final positions, then its drafts. */
nf_status nf_sched_spec_mtp(nf_sched *s, const plan *b, nf_error *err);
/* Room for rows logits rows of the batch; the buffer or NULL (out of memory). */
float *nf_sched_spec_logits(nf_sched *s, size_t rows);

#endif

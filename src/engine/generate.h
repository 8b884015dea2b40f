/* Text generation over an engine: prefill the prompt, then sample and decode one token at a time,
 * streaming UTF-8-safe text to a callback, until max_new tokens, an end-of-generation id (not
 * printed) or a stop string (not printed; text that could still become a stop string is held back
 * until it cannot). */
#ifndef NF_ENGINE_GENERATE_H
#define NF_ENGINE_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "tokenizer/tokenizer.h"

typedef struct nf_gen_params {
    size_t max_new;            /* tokens to generate at most */
    const int32_t *eos;        /* [n_eos] ids that end generation */
    size_t n_eos;
    const char *const *stops;  /* [n_stops] strings that end generation */
    size_t n_stops;
    uint32_t spec_k;           /* 0: off; else speculation with up to spec_k drafts a step (engine/spec.h) */
    int spec_mtp;              /* the drafts come from the model's MTP block (--spec mtp:K), else prompt lookup
                                * (--spec ngram:K; hybrids refused) */
} nf_gen_params;

typedef enum nf_gen_end { NF_GEN_LENGTH = 0, NF_GEN_EOS, NF_GEN_STOP, NF_GEN_CONTEXT } nf_gen_end;

typedef struct nf_gen_stats {
    size_t prompt_tokens, gen_tokens; /* gen_tokens counts sampled tokens, the ending one included */
    double prompt_s, gen_s;           /* wall time of the prefill and of the generation loop */
    size_t forwards;                  /* forwards of the generation loop (decodes and verifications) */
    size_t drafted, accepted;         /* speculation: drafts verified, drafts accepted */
    nf_gen_end end;
} nf_gen_stats;

/* Text callback: bytes [0, len) of valid UTF-8 (not NUL-terminated). */
typedef void (*nf_gen_emit_fn)(void *ctx, const char *text, size_t len);

/* Runs prompt[n_prompt] after what the engine already holds (so chat turns can reuse the cache),
 * then generates; with p->spec_k, speculatively (engine/spec.h: the greedy tokens are the same, sampled
 * ones equally distributed). Every token fed to the model is appended to *seq (may be NULL): after the call
 * the engine's cache holds exactly *seq's tokens when the caller kept *seq in step. A prompt that
 * does not fit the context is an error before anything runs; generation that reaches the context
 * end stops with NF_GEN_CONTEXT. */
nf_status nf_generate(nf_engine *e, const nf_tokenizer *tok, nf_sampler *s, const int32_t *prompt, size_t n_prompt,
                      const nf_gen_params *p, nf_gen_emit_fn emit, void *ctx, nf_tok_ids *seq, nf_gen_stats *st,
                      nf_error *err);

/* Forgets cached tokens from position n on (n <= e->n_past). A Gated DeltaNet hybrid forgets them all
 * (its recurrent state cannot rewind): read e->n_past afterwards for what is kept. */
void nf_engine_truncate(nf_engine *e, uint32_t n);

#endif

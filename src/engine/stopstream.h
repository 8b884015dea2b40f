/* Generated ids to printable text with stop strings, shared by nf_generate and the scheduler: each
 * id is decoded through the tokenizer's UTF-8-safe stream (nf_tok_stream), and text that could still
 * become the start of a stop string is held back until it cannot; a completed stop string ends the
 * stream (the text before it is emitted, it and the rest are not). */
#ifndef NF_ENGINE_STOPSTREAM_H
#define NF_ENGINE_STOPSTREAM_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tokenizer.h"

/* Text callback: bytes [0, len) of valid UTF-8 (not NUL-terminated). */
typedef void (*nf_text_fn)(void *ctx, const char *text, size_t len);

typedef struct nf_stop_stream {
    nf_tok_stream ts;
    const char *const *stops; /* [n_stops] borrowed; empty strings are ignored */
    size_t n_stops;
    char *s;                  /* [len] text decoded so far (cap allocated) */
    size_t len, cap, emitted; /* s[0, emitted) has gone to the callback */
    int stopped;              /* a stop string completed */
} nf_stop_stream;

nf_status nf_stop_stream_init(nf_stop_stream *ss, const nf_tokenizer *tok, const char *const *stops, size_t n_stops,
                              nf_error *err);
/* Feeds one id; emits what became safe; *stopped = 1 when a stop string completed with it. */
nf_status nf_stop_stream_put(nf_stop_stream *ss, int32_t id, nf_text_fn emit, void *ctx, int *stopped, nf_error *err);
/* End of generation (not after a stop): the held-back tail is emitted (or a stop string found in it). */
nf_status nf_stop_stream_finish(nf_stop_stream *ss, nf_text_fn emit, void *ctx, int *stopped, nf_error *err);
void nf_stop_stream_free(nf_stop_stream *ss);

#endif

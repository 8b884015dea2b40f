/* Stop strings over streamed text (see stopstream.h). */
#include "engine/stopstream.h"

#include <stdlib.h>
#include <string.h>

nf_status nf_stop_stream_init(nf_stop_stream *ss, const nf_tokenizer *tok, const char *const *stops, size_t n_stops,
                              nf_error *err)
{
    memset(ss, 0, sizeof *ss);
    ss->stops = stops;
    ss->n_stops = n_stops;
    return nf_tok_stream_init(&ss->ts, tok, NF_TOK_SKIP_SPECIAL, err);
}

void nf_stop_stream_free(nf_stop_stream *ss)
{
    nf_tok_stream_free(&ss->ts);
    free(ss->s);
    ss->s = NULL;
}

static nf_status append(nf_stop_stream *b, const char *s, size_t n, nf_error *err)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = (b->len + n + 1) * 2;
        char *p = realloc(b->s, cap);
        if (!p) return nf_error_set(err, NF_ERR_NOMEM, "out of memory");
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    return NF_OK;
}

/* Where the earliest occurrence of any stop string starts in s[from, len) (not only the first
 * listed one's: "ab" and "bab" over "bab" stop at 0); len when none. */
static size_t first_stop(const nf_stop_stream *b, size_t from)
{
    size_t first = b->len;
    for (size_t i = 0; i < b->n_stops; i++) {
        const size_t sl = strlen(b->stops[i]);
        for (size_t at = from; sl && at + sl <= b->len && at < first; at++)
            if (memcmp(b->s + at, b->stops[i], sl) == 0) first = at;
    }
    return first;
}

/* Emits what can no longer be part of a stop string; returns 1 when a stop string completed
 * (the text before it is emitted, the rest dropped). */
static int flush(nf_stop_stream *b, nf_text_fn emit, void *ctx, int final)
{
    const size_t stop = first_stop(b, b->emitted);
    if (stop < b->len) {
        if (stop > b->emitted && emit) emit(ctx, b->s + b->emitted, stop - b->emitted);
        b->emitted = b->len;
        return 1;
    }
    size_t safe = b->len;
    for (size_t i = 0; i < b->n_stops && !final; i++) {
        /* the longest suffix that is a proper prefix of the stop string is held back */
        const size_t sl = strlen(b->stops[i]);
        for (size_t k = sl ? sl - 1 : 0; k > 0; k--)
            if (k <= b->len - b->emitted && memcmp(b->s + b->len - k, b->stops[i], k) == 0) {
                if (b->len - k < safe) safe = b->len - k;
                break;
            }
    }
    if (safe > b->emitted && emit) emit(ctx, b->s + b->emitted, safe - b->emitted);
    if (safe > b->emitted) b->emitted = safe;
    return 0;
}

nf_status nf_stop_stream_put(nf_stop_stream *ss, int32_t id, nf_text_fn emit, void *ctx, int *stopped, nf_error *err)
{
    *stopped = 0;
    if (ss->stopped) return NF_OK;
    size_t len;
    const char *piece = nf_tok_stream_put(&ss->ts, id, &len, err);
    if (!piece) return err ? err->code : NF_ERR_INVALID_ARG;
    nf_status rc = append(ss, piece, len, err);
    if (rc) return rc;
    *stopped = ss->stopped = flush(ss, emit, ctx, 0);
    return NF_OK;
}

nf_status nf_stop_stream_finish(nf_stop_stream *ss, nf_text_fn emit, void *ctx, int *stopped, nf_error *err)
{
    *stopped = 0;
    if (ss->stopped) return NF_OK;
    size_t len;
    const char *rest = nf_tok_stream_flush(&ss->ts, &len);
    nf_status rc = append(ss, rest, len, err);
    if (rc) return rc;
    *stopped = ss->stopped = flush(ss, emit, ctx, 1);
    return NF_OK;
}

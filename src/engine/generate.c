/* The generation loop with streaming decode and stop strings (see generate.h). */
#include "engine/generate.h"

#include <stdlib.h>
#include <string.h>

#include "base/timer.h"

void nf_engine_truncate(nf_engine *e, uint32_t n)
{
    if (n < e->n_past) e->n_past = n;
}

static nf_status push_id(nf_tok_ids *v, int32_t id, nf_error *err)
{
    if (!v) return NF_OK;
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 256;
        int32_t *p = realloc(v->ids, cap * sizeof *p);
        if (!p) return nf_error_set(err, NF_ERR_NOMEM, "out of memory");
        v->ids = p;
        v->cap = cap;
    }
    v->ids[v->n++] = id;
    return NF_OK;
}

/* Generated text not yet printed, with the stop-string hold-back. */
typedef struct text_buf {
    char *s;
    size_t len, cap, emitted;
} text_buf;

static nf_status tb_append(text_buf *b, const char *s, size_t n, nf_error *err)
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

/* Emits what can no longer be part of a stop string; returns 1 when a stop string completed
 * (the text before it is emitted, the rest dropped). */
static int tb_flush(text_buf *b, const nf_gen_params *p, nf_gen_emit_fn emit, void *ctx, int final)
{
    size_t safe = b->len;
    for (size_t i = 0; i < p->n_stops; i++) {
        const char *stop = p->stops[i];
        size_t sl = strlen(stop);
        if (!sl) continue;
        size_t from = b->emitted;
        for (size_t at = from; at + sl <= b->len; at++)
            if (memcmp(b->s + at, stop, sl) == 0) {
                if (at > b->emitted && emit) emit(ctx, b->s + b->emitted, at - b->emitted);
                b->emitted = b->len;
                return 1;
            }
        if (final) continue;
        /* the longest suffix that is a proper prefix of the stop string is held back */
        for (size_t k = sl - 1; k > 0; k--)
            if (k <= b->len - b->emitted && memcmp(b->s + b->len - k, stop, k) == 0) {
                if (b->len - k < safe) safe = b->len - k;
                break;
            }
    }
    if (safe > b->emitted && emit) emit(ctx, b->s + b->emitted, safe - b->emitted);
    if (safe > b->emitted) b->emitted = safe;
    return 0;
}

static int is_eos(const nf_gen_params *p, int32_t id)
{
    for (size_t i = 0; i < p->n_eos; i++)
        if (p->eos[i] == id) return 1;
    return 0;
}

nf_status nf_generate(nf_engine *e, const nf_tokenizer *tok, nf_sampler *s, const int32_t *prompt, size_t n_prompt,
                      const nf_gen_params *p, nf_gen_emit_fn emit, void *ctx, nf_tok_ids *seq, nf_gen_stats *st,
                      nf_error *err)
{
    memset(st, 0, sizeof *st);
    nf_tok_stream ts;
    text_buf tb = {0};
    nf_status rc = nf_tok_stream_init(&ts, tok, NF_TOK_SKIP_SPECIAL, err);
    if (rc) return rc;
    uint64_t t0 = nf_time_ns();
    rc = nf_engine_prefill(e, prompt, n_prompt, NULL, err);
    for (size_t i = 0; !rc && i < n_prompt; i++) rc = push_id(seq, prompt[i], err);
    st->prompt_tokens = n_prompt;
    st->prompt_s = (double)(nf_time_ns() - t0) * 1e-9;
    uint64_t t1 = nf_time_ns();
    st->end = NF_GEN_LENGTH;
    const int defer = e->defer_logits;
    for (size_t i = 0; !rc && i < p->max_new; i++) {
        int32_t id;
        if ((rc = nf_engine_next(e, s, seq ? seq->ids : NULL, seq ? seq->n : 0, &id, err))) break;
        st->gen_tokens++;
        if (is_eos(p, id)) {
            st->end = NF_GEN_EOS;
            break;
        }
        size_t len;
        const char *piece = nf_tok_stream_put(&ts, id, &len, err);
        if (!piece) {
            rc = err ? err->code : NF_ERR_INTERNAL;
            break;
        }
        if ((rc = tb_append(&tb, piece, len, err))) break;
        if (tb_flush(&tb, p, emit, ctx, 0)) {
            st->end = NF_GEN_STOP;
            break;
        }
        if (i + 1 == p->max_new) break; /* the last token is not fed: nothing would read its logits */
        if (e->n_past >= e->opts.ctx) {
            st->end = NF_GEN_CONTEXT;
            break;
        }
        e->defer_logits = 1; /* decode steps: the next nf_engine_next reads what it needs from the device */
        rc = nf_engine_decode(e, id, err);
        e->defer_logits = defer;
        if (rc || (rc = push_id(seq, id, err))) break;
    }
    if (!rc && st->end != NF_GEN_STOP) {
        size_t len;
        const char *rest = nf_tok_stream_flush(&ts, &len);
        if (!(rc = tb_append(&tb, rest, len, err)) && tb_flush(&tb, p, emit, ctx, 1)) st->end = NF_GEN_STOP;
    }
    st->gen_s = (double)(nf_time_ns() - t1) * 1e-9;
    nf_tok_stream_free(&ts);
    free(tb.s);
    return rc;
}

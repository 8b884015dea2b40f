/* The generation loop with streaming decode and stop strings (see generate.h). */
#include "engine/generate.h"

#include <stdlib.h>
#include <string.h>

#include "base/timer.h"
#include "engine/stopstream.h"

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
    nf_stop_stream ss;
    nf_status rc = nf_stop_stream_init(&ss, tok, p->stops, p->n_stops, err);
    if (rc) return rc;
    uint64_t t0 = nf_time_ns();
    rc = nf_engine_prefill(e, prompt, n_prompt, NULL, err);
    for (size_t i = 0; !rc && i < n_prompt; i++) rc = push_id(seq, prompt[i], err);
    st->prompt_tokens = n_prompt;
    st->prompt_s = (double)(nf_time_ns() - t0) * 1e-9;
    uint64_t t1 = nf_time_ns();
    st->end = NF_GEN_LENGTH;
    const int defer = e->defer_logits;
    int stopped = 0;
    for (size_t i = 0; !rc && i < p->max_new; i++) {
        int32_t id;
        if ((rc = nf_engine_next(e, s, seq ? seq->ids : NULL, seq ? seq->n : 0, &id, err))) break;
        st->gen_tokens++;
        if (is_eos(p, id)) {
            st->end = NF_GEN_EOS;
            break;
        }
        if ((rc = nf_stop_stream_put(&ss, id, emit, ctx, &stopped, err))) break;
        if (stopped) {
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
    if (!rc && st->end != NF_GEN_STOP && !(rc = nf_stop_stream_finish(&ss, emit, ctx, &stopped, err)) && stopped)
        st->end = NF_GEN_STOP;
    st->gen_s = (double)(nf_time_ns() - t1) * 1e-9;
    nf_stop_stream_free(&ss);
    return rc;
}

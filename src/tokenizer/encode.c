/* Encoding: added-token split, normalization, regex pre-tokenization, byte-level BPE. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"
#include "tokenizer/utf8.h"

typedef struct merge_cand {
    uint32_t rank, pos, new_id; // a candidate merge of the symbol at pos with its right neighbour
} merge_cand;

/* Per-call state: the tokenizer is shared and read-only, so all scratch lives here. */
typedef struct enc_ctx {
    const nf_tokenizer *t;
    unsigned flags;
    nf_tok_ids *out;
    nf_error *err;
    pcre2_match_data *md;
    uint32_t *sym;   /* [scap] symbol token ids of the word being merged */
    int32_t *prev;   /* [scap] index of the left neighbour, -1 at the start */
    int32_t *next;   /* [scap] index of the right neighbour, -1 at the end */
    uint8_t *alive;  /* [scap] 0 once merged into its left neighbour */
    size_t scap;
    merge_cand *heap; /* [hcap] min-heap by (rank, pos), as HF's merge queue */
    size_t hn, hcap;
    char *bl;        /* [blcap] byte-level text of a word, for ignore_merges */
    size_t blcap;
} enc_ctx;

static nf_status push_id(enc_ctx *c, uint32_t id)
{
    nf_tok_ids *v = c->out;
    if (v->n == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 64;
        int32_t *p = realloc(v->ids, cap * sizeof *p);
        if (!p) return nf_error_set(c->err, NF_ERR_NOMEM, "%s: encode: out of memory", c->t->source);
        v->ids = p, v->cap = cap;
    }
    v->ids[v->n++] = (int32_t)id;
    return NF_OK;
}

void nf_tok_ids_free(nf_tok_ids *v)
{
    free(v->ids);
    v->ids = NULL;
    v->n = v->cap = 0;
}

/* ---- BPE --------------------------------------------------------------------------------------- */

static int cand_less(const merge_cand *a, const merge_cand *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static nf_status heap_push(enc_ctx *c, uint32_t rank, uint32_t pos, uint32_t new_id)
{
    if (c->hn == c->hcap) {
        size_t cap = c->hcap ? 2 * c->hcap : 64;
        merge_cand *p = realloc(c->heap, cap * sizeof *p);
        if (!p) return nf_error_set(c->err, NF_ERR_NOMEM, "%s: encode: out of memory", c->t->source);
        c->heap = p, c->hcap = cap;
    }
    size_t i = c->hn++;
    merge_cand x = {rank, pos, new_id};
    while (i > 0 && cand_less(&x, &c->heap[(i - 1) / 2])) {
        c->heap[i] = c->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    c->heap[i] = x;
    return NF_OK;
}

static merge_cand heap_pop(enc_ctx *c)
{
    merge_cand top = c->heap[0], x = c->heap[--c->hn];
    size_t i = 0, n = c->hn;
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        if (l < n && cand_less(&c->heap[l], &x)) m = l;
        if (l + 1 < n && cand_less(&c->heap[l + 1], m == i ? &x : &c->heap[m])) m = l + 1;
        if (m == i) break;
        c->heap[i] = c->heap[m];
        i = m;
    }
    if (n) c->heap[i] = x;
    return top;
}

static nf_status push_pair(enc_ctx *c, int32_t left)
{
    int32_t right = c->next[left];
    uint32_t rank, new_id;
    if (right < 0 || !nf_tok_pair_lookup(c->t, c->sym[left], c->sym[right], &rank, &new_id)) return NF_OK;
    return heap_push(c, rank, (uint32_t)left, new_id);
}

static nf_status grow_word(enc_ctx *c, size_t n)
{
    if (n <= c->scap) return NF_OK;
    size_t cap = n < 64 ? 64 : 2 * n;
    uint32_t *sym = realloc(c->sym, cap * sizeof *sym);
    if (sym) c->sym = sym;
    int32_t *prev = realloc(c->prev, cap * sizeof *prev);
    if (prev) c->prev = prev;
    int32_t *next = realloc(c->next, cap * sizeof *next);
    if (next) c->next = next;
    uint8_t *alive = realloc(c->alive, cap);
    if (alive) c->alive = alive;
    if (!sym || !prev || !next || !alive)
        return nf_error_set(c->err, NF_ERR_NOMEM, "%s: encode: out of memory for a %zu-byte word", c->t->source, n);
    c->scap = cap;
    return NF_OK;
}

/* ignore_merges: the whole word, in byte-level text, looked up in the vocabulary. */
static int32_t whole_word(enc_ctx *c, const uint8_t *s, size_t n)
{
    if (2 * n > c->blcap) {
        char *p = realloc(c->bl, 2 * n);
        if (!p) return -1; // no memory: fall back to merging, which gives the same ids
        c->bl = p, c->blcap = 2 * n;
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = c->t->byte_id[s[i]];
        if (id < 0) return -1;
        memcpy(c->bl + m, tok_text(c->t, (uint32_t)id), c->t->text_len[id]);
        m += c->t->text_len[id];
    }
    return nf_tok_vmap_get(c->t, c->bl, m);
}

/* Merges one pre-token, lowest rank first and leftmost on ties, exactly as HF's Word::merge_all
 * (including its check that a queued candidate still yields the same token). */
static nf_status bpe_word(enc_ctx *c, const uint8_t *s, size_t n)
{
    const nf_tokenizer *t = c->t;
    if (n == 0) return NF_OK;
    if (t->ignore_merges) {
        int32_t id = whole_word(c, s, n);
        if (id >= 0) return push_id(c, (uint32_t)id);
    }
    nf_status st = grow_word(c, n);
    if (st != NF_OK) return st;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[s[i]];
        if (id < 0) continue; // HF drops a character the vocabulary lacks when there is no unk token
        c->sym[m] = (uint32_t)id;
        c->prev[m] = (int32_t)m - 1;
        c->next[m] = (int32_t)m + 1;
        c->alive[m] = 1;
        m++;
    }
    if (m == 0) return NF_OK;
    c->next[m - 1] = -1;
    c->hn = 0;
    for (size_t i = 0; i + 1 < m && st == NF_OK; i++) st = push_pair(c, (int32_t)i);
    while (c->hn > 0 && st == NF_OK) {
        merge_cand top = heap_pop(c);
        int32_t p = (int32_t)top.pos, r = c->next[p];
        uint32_t rank, new_id;
        if (!c->alive[p] || r < 0) continue;
        if (!nf_tok_pair_lookup(t, c->sym[p], c->sym[r], &rank, &new_id) || new_id != top.new_id) continue;
        c->sym[p] = top.new_id;
        c->alive[r] = 0;
        c->next[p] = c->next[r];
        if (c->next[r] >= 0) c->prev[c->next[r]] = p;
        if (c->prev[p] >= 0) st = push_pair(c, c->prev[p]);
        if (st == NF_OK) st = push_pair(c, p);
    }
    for (int32_t i = 0; i >= 0 && st == NF_OK; i = c->next[i]) st = push_id(c, c->sym[i]);
    return st;
}

/* ---- pre-tokenization -------------------------------------------------------------------------- */

/* Splits s with regex `stage`, keeping matches and the gaps between them (HF's Isolated
 * behaviour); each piece goes to the next stage, the last stage's pieces to BPE. */
static nf_status split_stage(enc_ctx *c, uint32_t stage, const uint8_t *s, size_t n)
{
    const nf_tokenizer *t = c->t;
    if (stage == t->n_re) return bpe_word(c, s, n);
    size_t pos = 0, done = 0;
    nf_status st = NF_OK;
    while (pos < n && st == NF_OK) {
        int rc = pcre2_match(t->re[stage], s, n, pos, PCRE2_NO_UTF_CHECK, c->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return nf_error_set(c->err, NF_ERR_INTERNAL, "%s: pre-tokenizer regex %u: %s", t->source, stage,
                                (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { // an empty match splits nothing: step over one character
            if (ms >= n) break; // "$" matches empty at the very end: no character left to read
            size_t l;
            uint32_t cp;
            nf_u8_next(s + ms, n - ms, &l, &cp);
            pos = ms + l;
            continue;
        }
        if (ms > done) st = split_stage(c, stage + 1, s + done, ms - done);
        if (st == NF_OK) st = split_stage(c, stage + 1, s + ms, me - ms);
        done = pos = me;
    }
    if (st == NF_OK && done < n) st = split_stage(c, stage + 1, s + done, n - done);
    return st;
}

/* ---- added tokens and normalization ------------------------------------------------------------ */

typedef nf_status (*segment_fn)(enc_ctx *c, const uint8_t *s, size_t n);

/* The added token of `group` that matches at s[0] (longest first), or -1. */
static int32_t match_added(const nf_tokenizer *t, int group, const uint8_t *s, size_t n)
{
    for (uint32_t k = t->added_at[group][s[0]]; k < t->added_at[group][s[0] + 1]; k++) {
        uint32_t id = t->added[group][k];
        if (t->text_len[id] <= n && memcmp(s, tok_text(t, id), t->text_len[id]) == 0) return (int32_t)id;
    }
    return -1;
}

/* Cuts the added tokens of `group` out of s, leftmost-longest; the text between goes to `fn`.
 * Without NF_TOK_PARSE_SPECIAL a matched CONTROL token stays text (HF's encode_special_tokens). */
static nf_status split_added(enc_ctx *c, int group, const uint8_t *s, size_t n, segment_fn fn)
{
    const nf_tokenizer *t = c->t;
    if (t->added_at[group][256] == 0) return fn(c, s, n);
    size_t start = 0, i = 0;
    nf_status st = NF_OK;
    while (i < n && st == NF_OK) {
        int32_t id = match_added(t, group, s + i, n - i);
        if (id < 0) {
            i++;
            continue;
        }
        if (t->type[id] == NF_TOK_CONTROL && !(c->flags & NF_TOK_PARSE_SPECIAL)) {
            i += t->text_len[id];
            continue;
        }
        if (i > start) st = fn(c, s + start, i - start);
        if (st == NF_OK) st = push_id(c, (uint32_t)id);
        i += t->text_len[id];
        start = i;
    }
    if (st == NF_OK && start < n) st = fn(c, s + start, n - start);
    return st;
}

static nf_status pretokenize(enc_ctx *c, const uint8_t *s, size_t n) { return split_stage(c, 0, s, n); }

/* A segment between raw-matched added tokens: normalize, then cut the normalized added tokens. */
static nf_status normalize_segment(enc_ctx *c, const uint8_t *s, size_t n)
{
    if (!c->t->nfc) return split_added(c, 1, s, n, pretokenize);
    char *norm;
    size_t m;
    nf_status st = nf_utf8_nfc((const char *)s, n, &norm, &m, c->err);
    if (st != NF_OK) return st;
    st = split_added(c, 1, (const uint8_t *)norm, m, pretokenize);
    free(norm);
    return st;
}

nf_status nf_tok_encode(const nf_tokenizer *t, const char *text, size_t len, unsigned flags, nf_tok_ids *out,
                        nf_error *err)
{
    size_t valid = nf_utf8_valid_prefix(text, len);
    if (valid != len)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "%s: encode: text is not valid UTF-8 at byte %zu (0x%02x)",
                            t->source, valid, (unsigned)(uint8_t)text[valid]);
    enc_ctx c;
    memset(&c, 0, sizeof c);
    c.t = t, c.flags = flags, c.out = out, c.err = err;
    c.md = pcre2_match_data_create(4, NULL);
    if (!c.md) return nf_error_set(err, NF_ERR_NOMEM, "%s: encode: out of memory", t->source);
    nf_status st = NF_OK;
    if ((flags & NF_TOK_ADD_SPECIAL) && t->add_bos) st = push_id(&c, (uint32_t)t->bos);
    if (st == NF_OK) st = split_added(&c, 0, (const uint8_t *)text, len, normalize_segment);
    if (st == NF_OK && (flags & NF_TOK_ADD_SPECIAL) && t->add_eos) st = push_id(&c, (uint32_t)t->eos);
    pcre2_match_data_free(c.md);
    free(c.sym);
    free(c.prev);
    free(c.next);
    free(c.alive);
    free(c.heap);
    free(c.bl);
    return st;
}

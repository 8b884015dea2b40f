/* Building a tokenizer from an nf_tok_desc, the lookups, and decoding (whole and streaming). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/fnv.h"
#include "base/log.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/utf8.h"

/* ---- named pre-tokenizers ---------------------------------------------------------------------- */

/* HF's ByteLevel(use_regex=true) split, GPT-2's regex. */
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
/* Qwen2 / Qwen3 tokenizer.json Split regex; llama-3's differs only in \p{N}{1,3}. */
#define RE_QWEN2                                                                                   \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|" \
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_LLAMA3                                                                                  \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|" \
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

static const char *const pre_qwen2[] = {RE_QWEN2};
static const char *const pre_llama3[] = {RE_LLAMA3};
/* SmolLM2 (and StarCoder): Digits(individual_digits=true), then ByteLevel's GPT-2 split. */
static const char *const pre_smollm[] = {"\\p{N}", RE_GPT2};
static const char *const pre_gpt2[] = {RE_GPT2};

int nf_tok_pre_regexes(const char *name, const char *const **regexes, uint32_t *n)
{
    static const struct {
        const char *name;
        const char *const *re;
        uint32_t n;
    } named[] = {{"qwen2", pre_qwen2, 1}, {"llama3", pre_llama3, 1}, {"llama-bpe", pre_llama3, 1},
                 {"smollm", pre_smollm, 2}, {"gpt2", pre_gpt2, 1}};
    for (size_t i = 0; i < sizeof named / sizeof named[0]; i++) {
        if (strcmp(name, named[i].name) == 0) {
            *regexes = named[i].re;
            *n = named[i].n;
            return 1;
        }
    }
    return 0;
}

/* ---- GPT-2 byte <-> unicode alphabet ----------------------------------------------------------- */

/* Printable bytes map to themselves; the other 68 to U+0100.. in byte order (GPT-2's bytes_to_unicode). */
static uint32_t byte_to_cp(uint8_t b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return b;
    uint32_t k = 0;
    for (unsigned x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174)) k++;
    return 256 + k;
}

static int cp_to_byte_table[324];
static pthread_once_t byte_tables_once = PTHREAD_ONCE_INIT;

static void init_byte_tables_once(void)
{
    for (int i = 0; i < 324; i++) cp_to_byte_table[i] = -1;
    for (int b = 0; b < 256; b++) cp_to_byte_table[byte_to_cp((uint8_t)b)] = b;
}

static void init_byte_tables(void) { pthread_once(&byte_tables_once, init_byte_tables_once); }

/* Byte-level text -> bytes, as HF's ByteLevel decoder: when a character is outside the alphabet
 * the token's text is used as is. Writes at most strlen(s) bytes. */
static size_t bytelevel_decode(const char *s, size_t n, uint8_t *out)
{
    const uint8_t *u = (const uint8_t *)s;
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        size_t l;
        uint32_t cp;
        if (nf_u8_next(u + i, n - i, &l, &cp) != NF_U8_OK || cp >= 324 || cp_to_byte_table[cp] < 0) {
            memcpy(out, s, n);
            return n;
        }
        out[m++] = (uint8_t)cp_to_byte_table[cp];
        i += l;
    }
    return m;
}

/* ---- hash maps --------------------------------------------------------------------------------- */

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

int32_t nf_tok_vmap_get(const nf_tokenizer *t, const char *s, size_t n)
{
    size_t mask = t->vcap - 1;
    for (size_t h = nf_fnv1a64(s, n) & mask;; h = (h + 1) & mask) {
        uint32_t v = t->vmap[h];
        if (!v) return -1;
        uint32_t id = v - 1;
        if (t->text_len[id] == n && memcmp(tok_text(t, id), s, n) == 0) return (int32_t)id;
    }
}

static void vmap_put(nf_tokenizer *t, uint32_t id)
{
    size_t mask = t->vcap - 1, n = t->text_len[id];
    const char *s = tok_text(t, id);
    for (size_t h = nf_fnv1a64(s, n) & mask;; h = (h + 1) & mask) {
        uint32_t v = t->vmap[h];
        if (!v) {
            t->vmap[h] = id + 1;
            return;
        }
        if (t->text_len[v - 1] == n && memcmp(tok_text(t, v - 1), s, n) == 0) return; // first id wins
    }
}

static size_t pair_slot(const nf_tokenizer *t, uint64_t key)
{
    size_t mask = t->pcap - 1;
    size_t h = (size_t)((key + 1) * 0x9E3779B97F4A7C15ULL >> 17) & mask;
    while (t->pkey[h] && t->pkey[h] != key + 1) h = (h + 1) & mask;
    return h;
}

int nf_tok_pair_lookup(const nf_tokenizer *t, uint32_t a, uint32_t b, uint32_t *rank, uint32_t *new_id)
{
    size_t h = pair_slot(t, ((uint64_t)a << 32) | b);
    if (!t->pkey[h]) return 0;
    *rank = t->prank[h];
    *new_id = t->pnew[h];
    return 1;
}

/* ---- construction ------------------------------------------------------------------------------ */

static char *dup_str(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

nf_tok_desc nf_tok_desc_empty(void)
{
    nf_tok_desc d;
    memset(&d, 0, sizeof d);
    d.bos_id = d.eos_id = d.pad_id = -1;
    return d;
}

static nf_status fill_vocab(nf_tokenizer *t, const nf_tok_desc *d, nf_error *err)
{
    const char *src = t->source;
    size_t total = 0;
    for (uint32_t i = 0; i < d->n_vocab; i++) {
        if (!d->tokens[i]) return nf_error_set(err, NF_ERR_FORMAT, "%s: tokens[%u] is missing", src, i);
        total += 2 * strlen(d->tokens[i]) + 2; // text, NUL, bytes (never longer than the text), NUL
    }
    if (total >= UINT32_MAX) return nf_error_set(err, NF_ERR_UNSUPPORTED, "%s: vocabulary text exceeds 4 GiB", src);
    t->pool = malloc(total);
    t->text_off = malloc(d->n_vocab * sizeof *t->text_off);
    t->text_len = malloc(d->n_vocab * sizeof *t->text_len);
    t->bytes_off = malloc(d->n_vocab * sizeof *t->bytes_off);
    t->bytes_len = malloc(d->n_vocab * sizeof *t->bytes_len);
    t->type = malloc(d->n_vocab);
    t->vcap = pow2_at_least((size_t)d->n_vocab * 2);
    t->vmap = calloc(t->vcap, sizeof *t->vmap);
    if (!t->pool || !t->text_off || !t->text_len || !t->bytes_off || !t->bytes_len || !t->type || !t->vmap)
        return nf_error_set(err, NF_ERR_NOMEM, "%s: out of memory for %u tokens", src, d->n_vocab);
    size_t at = 0;
    for (uint32_t i = 0; i < d->n_vocab; i++) {
        int32_t ty = d->types ? d->types[i] : NF_TOK_NORMAL;
        if (ty < NF_TOK_NORMAL || ty > NF_TOK_BYTE)
            return nf_error_set(err, NF_ERR_FORMAT, "%s: token_type[%u] = %d, expected 1..6", src, i, (int)ty);
        t->type[i] = (uint8_t)ty;
        size_t n = strlen(d->tokens[i]);
        t->text_off[i] = (uint32_t)at;
        t->text_len[i] = (uint32_t)n;
        memcpy(t->pool + at, d->tokens[i], n + 1);
        at += n + 1;
        t->bytes_off[i] = (uint32_t)at;
        t->bytes_len[i] = (uint32_t)bytelevel_decode(d->tokens[i], n, (uint8_t *)t->pool + at);
        if (t->bytes_len[i] > t->max_bytes) t->max_bytes = t->bytes_len[i];
        t->pool[at + t->bytes_len[i]] = 0;
        at += t->bytes_len[i] + 1;
        vmap_put(t, i);
    }
    for (int b = 0; b < 256; b++) {
        uint8_t buf[4];
        int n = nf_u8_put(buf, byte_to_cp((uint8_t)b));
        t->byte_id[b] = nf_tok_vmap_get(t, (const char *)buf, (size_t)n);
    }
    return NF_OK;
}

static nf_status add_merge(nf_tokenizer *t, uint32_t rank, const char *l, size_t ln, const char *r, size_t rn,
                           char **scratch, size_t *scap, nf_error *err)
{
    int32_t a = nf_tok_vmap_get(t, l, ln), b = nf_tok_vmap_get(t, r, rn);
    if (a < 0 || b < 0)
        return nf_error_set(err, NF_ERR_FORMAT, "%s: merges[%u]: '%.*s' is not in the vocabulary", t->source, rank,
                            (int)(a < 0 ? ln : rn), a < 0 ? l : r);
    if (ln + rn + 1 > *scap) {
        *scap = 2 * (ln + rn + 1);
        char *p = realloc(*scratch, *scap);
        if (!p) return nf_error_set(err, NF_ERR_NOMEM, "%s: out of memory", t->source);
        *scratch = p;
    }
    memcpy(*scratch, l, ln);
    memcpy(*scratch + ln, r, rn);
    int32_t c = nf_tok_vmap_get(t, *scratch, ln + rn);
    if (c < 0)
        return nf_error_set(err, NF_ERR_FORMAT, "%s: merges[%u]: the merged token '%.*s' is not in the vocabulary",
                            t->source, rank, (int)(ln + rn), *scratch);
    size_t h = pair_slot(t, ((uint64_t)(uint32_t)a << 32) | (uint32_t)b);
    t->pkey[h] = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    t->prank[h] = rank; // a repeated pair takes its later rank, as HF's map does
    t->pnew[h] = (uint32_t)c;
    return NF_OK;
}

static nf_status fill_merges(nf_tokenizer *t, const nf_tok_desc *d, nf_error *err)
{
    if (d->n_merges && !d->merges && !d->merge_pairs)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "%s: %u merges but no merge list", t->source, d->n_merges);
    t->pcap = pow2_at_least((size_t)d->n_merges * 2);
    t->pkey = calloc(t->pcap, sizeof *t->pkey);
    t->prank = malloc(t->pcap * sizeof *t->prank);
    t->pnew = malloc(t->pcap * sizeof *t->pnew);
    if (!t->pkey || !t->prank || !t->pnew) return nf_error_set(err, NF_ERR_NOMEM, "%s: out of memory", t->source);
    char *scratch = NULL;
    size_t scap = 0;
    nf_status st = NF_OK;
    for (uint32_t i = 0; i < d->n_merges && st == NF_OK; i++) {
        const char *l, *r;
        size_t ln, rn;
        if (d->merges) {
            const char *m = d->merges[i];
            const char *sp = m ? strchr(m, ' ') : NULL;
            if (!sp || sp == m || !sp[1]) {
                st = nf_error_set(err, NF_ERR_FORMAT, "%s: merges[%u] = '%s', expected 'left right'", t->source, i,
                                  m ? m : "(null)");
                break;
            }
            l = m, ln = (size_t)(sp - m), r = sp + 1, rn = strlen(sp + 1);
        } else {
            l = d->merge_pairs[2 * i], r = d->merge_pairs[2 * i + 1];
            if (!l || !r) {
                st = nf_error_set(err, NF_ERR_FORMAT, "%s: merges[%u] lacks a side", t->source, i);
                break;
            }
            ln = strlen(l), rn = strlen(r);
        }
        st = add_merge(t, i, l, ln, r, rn, &scratch, &scap, err);
    }
    free(scratch);
    return st;
}

typedef struct added_key {
    uint8_t first;  // first byte of the text
    uint32_t len;   // text length: longer first within a first byte
    uint32_t id;
} added_key;

static int cmp_added(const void *pa, const void *pb)
{
    const added_key *a = pa, *b = pb;
    if (a->first != b->first) return a->first < b->first ? -1 : 1;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

/* Indexes the added tokens by first byte, longest first, for leftmost-longest matching. */
static nf_status fill_added(nf_tokenizer *t, const nf_tok_desc *d, nf_error *err)
{
    added_key *keys = malloc((d->n_vocab + 1) * sizeof *keys);
    if (!keys) return nf_error_set(err, NF_ERR_NOMEM, "%s: out of memory", t->source);
    for (int g = 0; g < 2; g++) {
        size_t n = 0;
        for (uint32_t i = 0; i < d->n_vocab; i++) {
            int is_added = t->type[i] == NF_TOK_CONTROL || t->type[i] == NF_TOK_USER_DEFINED;
            int norm = d->normalized && d->normalized[i];
            if (is_added && t->text_len[i] > 0 && norm == g)
                keys[n++] = (added_key){(uint8_t)tok_text(t, i)[0], t->text_len[i], i};
        }
        qsort(keys, n, sizeof *keys, cmp_added);
        t->added[g] = malloc((n + 1) * sizeof(uint32_t));
        if (!t->added[g]) {
            free(keys);
            return nf_error_set(err, NF_ERR_NOMEM, "%s: out of memory", t->source);
        }
        size_t k = 0;
        for (int b = 0; b < 256; b++) {
            t->added_at[g][b] = (uint32_t)k;
            for (; k < n && keys[k].first == b; k++) t->added[g][k] = keys[k].id;
        }
        t->added_at[g][256] = (uint32_t)n;
    }
    free(keys);
    return NF_OK;
}

static nf_status compile_pre(nf_tokenizer *t, const nf_tok_desc *d, nf_error *err)
{
    const char *const *re = d->split_regex;
    uint32_t n = d->n_split;
    if (d->pre && !nf_tok_pre_regexes(d->pre, &re, &n))
        return nf_error_set(err, NF_ERR_UNSUPPORTED,
                            "%s: pre-tokenizer '%s' is not supported (known: qwen2, llama3, llama-bpe, smollm, gpt2)",
                            t->source, d->pre);
    if (n > NF_TOK_MAX_STAGES)
        return nf_error_set(err, NF_ERR_UNSUPPORTED, "%s: %u pre-tokenizer split stages, at most %d supported",
                            t->source, n, NF_TOK_MAX_STAGES);
    for (uint32_t i = 0; i < n; i++) {
        int ec;
        PCRE2_SIZE off;
        t->re[i] = pcre2_compile((PCRE2_SPTR)re[i], PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &off, NULL);
        if (!t->re[i]) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(ec, msg, sizeof msg);
            return nf_error_set(err, NF_ERR_FORMAT, "%s: pre-tokenizer regex %u at offset %zu: %s", t->source, i,
                                (size_t)off, (const char *)msg);
        }
        t->n_re = i + 1;
        (void)pcre2_jit_compile(t->re[i], PCRE2_JIT_COMPLETE); // optional: falls back to the interpreter
    }
    int pre_is_qwen2 = d->pre && strcmp(d->pre, "qwen2") == 0;
    t->nfc = d->norm == NF_TOK_NORM_NFC || (d->norm == NF_TOK_NORM_DEFAULT && pre_is_qwen2);
    return NF_OK;
}

static nf_status check_ids(const nf_tokenizer *t, const nf_tok_desc *d, nf_error *err)
{
    const struct {
        const char *name;
        int32_t id;
    } ids[] = {{"bos_id", d->bos_id}, {"eos_id", d->eos_id}, {"pad_id", d->pad_id}};
    for (size_t i = 0; i < 3; i++)
        if (ids[i].id < -1 || ids[i].id >= (int64_t)d->n_vocab)
            return nf_error_set(err, NF_ERR_FORMAT, "%s: %s = %d is outside the vocabulary (%u tokens)", t->source,
                                ids[i].name, (int)ids[i].id, d->n_vocab);
    if (d->add_bos && d->bos_id < 0)
        return nf_error_set(err, NF_ERR_FORMAT, "%s: add_bos is set but there is no bos token", t->source);
    if (d->add_eos && d->eos_id < 0)
        return nf_error_set(err, NF_ERR_FORMAT, "%s: add_eos is set but there is no eos token", t->source);
    return NF_OK;
}

nf_status nf_tok_create(const nf_tok_desc *d, nf_tokenizer **out, nf_error *err)
{
    *out = NULL;
    const char *src = d->source ? d->source : "tokenizer";
    if (d->n_vocab == 0 || !d->tokens) return nf_error_set(err, NF_ERR_FORMAT, "%s: empty vocabulary", src);
    if (!d->pre && d->n_split == 0)
        return nf_error_set(err, NF_ERR_INVALID_ARG, "%s: no pre-tokenizer (name or regexes)", src);
    init_byte_tables();
    nf_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return nf_error_set(err, NF_ERR_NOMEM, "%s: out of memory", src);
    t->source = dup_str(src);
    t->chat_template = d->chat_template ? dup_str(d->chat_template) : NULL;
    t->n_vocab = d->n_vocab;
    // llama-3's tokenizer.json sets ignore_merges; a GGUF records only the pre-tokenizer's name.
    t->ignore_merges = d->ignore_merges || (d->pre && (!strcmp(d->pre, "llama3") || !strcmp(d->pre, "llama-bpe")));
    t->bos = d->bos_id, t->eos = d->eos_id, t->pad = d->pad_id;
    t->add_bos = d->add_bos, t->add_eos = d->add_eos;
    nf_status st = !t->source || (d->chat_template && !t->chat_template)
                       ? nf_error_set(err, NF_ERR_NOMEM, "%s: out of memory", src)
                       : NF_OK;
    if (st == NF_OK) st = check_ids(t, d, err);
    if (st == NF_OK) st = fill_vocab(t, d, err);
    if (st == NF_OK) st = fill_merges(t, d, err);
    if (st == NF_OK) st = fill_added(t, d, err);
    if (st == NF_OK) st = compile_pre(t, d, err);
    if (st != NF_OK) {
        nf_tok_free(t);
        return st;
    }
    *out = t;
    return NF_OK;
}

void nf_tok_free(nf_tokenizer *t)
{
    if (!t) return;
    for (uint32_t i = 0; i < t->n_re; i++) pcre2_code_free(t->re[i]);
    free(t->added[0]);
    free(t->added[1]);
    free(t->pkey);
    free(t->prank);
    free(t->pnew);
    free(t->vmap);
    free(t->type);
    free(t->bytes_len);
    free(t->bytes_off);
    free(t->text_len);
    free(t->text_off);
    free(t->pool);
    free(t->chat_template);
    free(t->source);
    free(t);
}

/* ---- lookups ----------------------------------------------------------------------------------- */

uint32_t nf_tok_vocab_size(const nf_tokenizer *t) { return t->n_vocab; }
int32_t nf_tok_bos(const nf_tokenizer *t) { return t->bos; }
int32_t nf_tok_eos(const nf_tokenizer *t) { return t->eos; }
const char *nf_tok_chat_template(const nf_tokenizer *t) { return t->chat_template; }
int32_t nf_tok_find(const nf_tokenizer *t, const char *text) { return nf_tok_vmap_get(t, text, strlen(text)); }

nf_tok_type nf_tok_token_type(const nf_tokenizer *t, int32_t id)
{
    return id >= 0 && (uint32_t)id < t->n_vocab ? (nf_tok_type)t->type[id] : NF_TOK_UNUSED;
}

const uint8_t *nf_tok_token_bytes(const nf_tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || (uint32_t)id >= t->n_vocab) return NULL;
    *len = t->bytes_len[id];
    return tok_bytes(t, (uint32_t)id);
}

/* ---- decoding ---------------------------------------------------------------------------------- */

nf_status nf_tok_decode(const nf_tokenizer *t, const int32_t *ids, size_t n, unsigned flags, char **out,
                        size_t *len, nf_error *err)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (uint32_t)ids[i] >= t->n_vocab)
            return nf_error_set(err, NF_ERR_INVALID_ARG, "%s: decode: id %d at position %zu is outside the vocabulary (%u)",
                                t->source, (int)ids[i], i, t->n_vocab);
        total += t->bytes_len[ids[i]];
    }
    char *s = malloc(total + 1);
    if (!s) return nf_error_set(err, NF_ERR_NOMEM, "%s: decode: out of memory (%zu bytes)", t->source, total + 1);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if ((flags & NF_TOK_SKIP_SPECIAL) && t->type[ids[i]] == NF_TOK_CONTROL) continue;
        memcpy(s + m, tok_bytes(t, (uint32_t)ids[i]), t->bytes_len[ids[i]]);
        m += t->bytes_len[ids[i]];
    }
    s[m] = 0;
    *out = s;
    *len = m;
    return NF_OK;
}

nf_status nf_tok_stream_init(nf_tok_stream *s, const nf_tokenizer *t, unsigned flags, nf_error *err)
{
    memset(s, 0, sizeof *s);
    s->t = t;
    s->flags = flags;
    // Worst case: every held and new byte is invalid and becomes a 3-byte U+FFFD.
    s->cap = 3 * (t->max_bytes + 4) + 1;
    s->buf = malloc(s->cap);
    if (!s->buf) return nf_error_set(err, NF_ERR_NOMEM, "%s: stream: out of memory", t->source);
    return NF_OK;
}

static const uint8_t replacement[3] = {0xEF, 0xBF, 0xBD};

/* Moves what is complete in pend+b to s->buf; an incomplete tail stays pending unless `final`. */
static size_t stream_emit(nf_tok_stream *s, const uint8_t *b, size_t n, int final)
{
    size_t m = 0;
    uint8_t tmp[8];
    while (s->n_pend > 0 || n > 0) {
        // Work on the pending bytes followed by up to 4 new bytes: enough for any sequence.
        size_t k = (size_t)s->n_pend, take = n < 4 ? n : 4;
        memcpy(tmp, s->pend, k);
        if (take) memcpy(tmp + k, b, take); /* flush passes b = NULL: memcpy from NULL is undefined even for 0 bytes */
        size_t len;
        uint32_t cp;
        nf_u8_scan r = nf_u8_next(tmp, k + take, &len, &cp);
        if (r == NF_U8_INCOMPLETE && !final) {
            memcpy(s->pend, tmp, k + take); // k + take < 4 here, or the sequence would be decided
            s->n_pend = (int)(k + take);
            return m;
        }
        if (r == NF_U8_OK) {
            memcpy(s->buf + m, tmp, len);
            m += len;
        } else {
            memcpy(s->buf + m, replacement, 3); // invalid, or incomplete at the end of the stream
            m += 3;
        }
        // Consume len bytes: first the pending ones, then new ones.
        size_t from_pend = len < k ? len : k;
        memmove(s->pend, s->pend + from_pend, k - from_pend);
        s->n_pend = (int)(k - from_pend);
        b += len - from_pend;
        n -= len - from_pend;
    }
    return m;
}

const char *nf_tok_stream_put(nf_tok_stream *s, int32_t id, size_t *len, nf_error *err)
{
    const nf_tokenizer *t = s->t;
    if (id < 0 || (uint32_t)id >= t->n_vocab) {
        nf_error_set(err, NF_ERR_INVALID_ARG, "%s: stream: id %d is outside the vocabulary (%u)", t->source, (int)id,
                     t->n_vocab);
        return NULL;
    }
    size_t m = 0;
    if (!((s->flags & NF_TOK_SKIP_SPECIAL) && t->type[id] == NF_TOK_CONTROL))
        m = stream_emit(s, tok_bytes(t, (uint32_t)id), t->bytes_len[id], 0);
    s->buf[m] = 0;
    *len = m;
    return s->buf;
}

const char *nf_tok_stream_flush(nf_tok_stream *s, size_t *len)
{
    size_t m = stream_emit(s, NULL, 0, 1);
    s->buf[m] = 0;
    *len = m;
    return s->buf;
}

void nf_tok_stream_free(nf_tok_stream *s)
{
    free(s->buf);
    s->buf = NULL;
}

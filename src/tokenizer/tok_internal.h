/* The tokenizer object's layout, shared by the files of src/tokenizer only. */
#ifndef NF_TOKENIZER_INTERNAL_H
#define NF_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer/tokenizer.h"

struct nf_tokenizer {
    char *source;          /* for messages */
    uint32_t n_vocab;
    char *pool;            /* every token's text then its bytes, NUL-separated */
    uint32_t *text_off;    /* [n_vocab] offset of the token text (as given) in pool */
    uint32_t *text_len;    /* [n_vocab] */
    uint32_t *bytes_off;   /* [n_vocab] offset of the bytes it decodes to */
    uint32_t *bytes_len;   /* [n_vocab] */
    uint8_t *type;         /* [n_vocab] nf_tok_type */
    size_t max_bytes;      /* longest bytes_len */

    uint32_t *vmap;        /* [vcap] open addressing: id + 1 of a token text, 0 = empty */
    size_t vcap;           /* power of two */

    uint64_t *pkey;        /* [pcap] (left id << 32 | right id) + 1, 0 = empty */
    uint32_t *prank;       /* [pcap] merge rank */
    uint32_t *pnew;        /* [pcap] id of the merged token */
    size_t pcap;           /* power of two */

    int32_t byte_id[256];  /* id of the one-character token of each byte, -1 if the vocab lacks it */

    /* Added tokens, grouped by where they are matched (0: raw text, 1: normalized text), then by
     * first byte, longest first: ids of group g with first byte b are
     * added[g][added_at[g][b] .. added_at[g][b+1]). */
    uint32_t *added[2];
    uint32_t added_at[2][257];

    pcre2_code *re[NF_TOK_MAX_STAGES];
    uint32_t n_re;
    int nfc;
    int ignore_merges;
    int32_t bos, eos, pad;
    int add_bos, add_eos;
    char *chat_template;
};

static inline const char *tok_text(const nf_tokenizer *t, uint32_t id) { return t->pool + t->text_off[id]; }
static inline const uint8_t *tok_bytes(const nf_tokenizer *t, uint32_t id)
{
    return (const uint8_t *)t->pool + t->bytes_off[id];
}

/* Merge rank and merged id of the pair (a, b); 0 when the pair is not a merge. */
int nf_tok_pair_lookup(const nf_tokenizer *t, uint32_t a, uint32_t b, uint32_t *rank, uint32_t *new_id);
/* Id of the token whose text is s[0..n), -1 if none. */
int32_t nf_tok_vmap_get(const nf_tokenizer *t, const char *s, size_t n);

#endif

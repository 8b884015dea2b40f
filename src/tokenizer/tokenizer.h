/* Byte-level BPE tokenizer with the semantics of HF `tokenizers` (the ids are those HF produces),
 * built from a format-neutral description so tokenizer.json, GGUF metadata (tokenizer.ggml.*) and
 * the .nf artifact's metadata all fill the same struct.
 *
 * Encoding, as HF does it:
 *   1. added tokens (types CONTROL and USER_DEFINED) are cut out of the raw text, leftmost-longest;
 *   2. each remaining segment is normalized (NFC for Qwen2-style tokenizers);
 *   3. added tokens marked `normalized` are cut out of the normalized text;
 *   4. the pre-tokenizer splits each piece with one or more PCRE2 regexes (UTF + UCP), each stage
 *      applied to the pieces of the previous one, matches and gaps both kept ("Isolated");
 *   5. each pre-token's bytes are mapped to GPT-2's byte-to-unicode alphabet and merged by BPE
 *      (lowest merge rank first, leftmost on ties).
 * A tokenizer is immutable once built: any number of threads may encode and decode with it. */
#ifndef NF_TOKENIZER_TOKENIZER_H
#define NF_TOKENIZER_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

/* Token types, numbered as GGUF's tokenizer.ggml.token_type. CONTROL tokens are HF's `special`
 * added tokens; USER_DEFINED are HF's non-special added tokens. Both are matched in text before
 * BPE and decode to their text as is. */
typedef enum nf_tok_type {
    NF_TOK_NORMAL = 1,
    NF_TOK_UNKNOWN = 2,
    NF_TOK_CONTROL = 3,
    NF_TOK_USER_DEFINED = 4,
    NF_TOK_UNUSED = 5,
    NF_TOK_BYTE = 6,
} nf_tok_type;

typedef enum nf_tok_norm {
    NF_TOK_NORM_DEFAULT = 0, /* what the named pre-tokenizer's models use: NFC for "qwen2", else none */
    NF_TOK_NORM_NONE,
    NF_TOK_NORM_NFC,
} nf_tok_norm;

enum { NF_TOK_MAX_STAGES = 4 };

/* Everything a tokenizer is built from. Arrays are borrowed: the tokenizer copies what it keeps. */
typedef struct nf_tok_desc {
    const char *source;          /* names the origin in error messages, e.g. "model/tokenizer.json" */
    uint32_t n_vocab;            /* ids are 0 .. n_vocab-1, added tokens included */
    const char *const *tokens;   /* [n_vocab] NUL-terminated: GPT-2 byte-level text for model tokens,
                                    plain UTF-8 for added tokens (GGUF tokenizer.ggml.tokens form) */
    const int32_t *types;        /* [n_vocab] nf_tok_type, or NULL: all NORMAL */
    const uint8_t *normalized;   /* [n_vocab] 1: added token matched in normalized text (HF
                                    `normalized`); NULL: none */
    uint32_t n_merges;           /* merges in rank order, either as ... */
    const char *const *merges;   /* [n_merges] "left right" (GGUF / merges.txt form), or */
    const char *const *merge_pairs; /* [2*n_merges] left, right (when merges is NULL) */
    const char *pre;             /* named pre-tokenizer: "qwen2", "llama3" (GGUF "llama-bpe"),
                                    "smollm", "gpt2"; or NULL and ... */
    const char *const *split_regex; /* [n_split] explicit PCRE2 regexes, applied in order */
    uint32_t n_split;
    nf_tok_norm norm;
    int ignore_merges;           /* HF BPE ignore_merges: a pre-token found whole in the vocab is one
                                    token (implied by pre "llama3" / "llama-bpe", as llama-3 has it) */
    int32_t bos_id, eos_id, pad_id; /* -1 when absent */
    int add_bos, add_eos;        /* what NF_TOK_ADD_SPECIAL adds */
    const char *chat_template;   /* the checkpoint's Jinja template text, or NULL (kept for nf_chat_*) */
} nf_tok_desc;

/* A desc with every id -1 and every pointer NULL. */
nf_tok_desc nf_tok_desc_empty(void);

typedef struct nf_tokenizer nf_tokenizer;

/* Builds a tokenizer. Errors name d->source and the field at fault ("merges[12]: 'ab' is not in
 * the vocabulary"). */
nf_status nf_tok_create(const nf_tok_desc *d, nf_tokenizer **out, nf_error *err);
void nf_tok_free(nf_tokenizer *t);

/* HF tokenizer.json (path or text) and optionally tokenizer_config.json (bos/eos, add_bos_token,
 * chat_template; NULL to skip). Unsupported features (Unigram/WordPiece, byte_fallback, lstrip on
 * added tokens, unknown normalizers or pre-tokenizers) are refused with NF_ERR_UNSUPPORTED naming
 * the JSON field. */
nf_status nf_tok_load_hf(const char *tokenizer_json, const char *tokenizer_config, nf_tokenizer **out,
                         nf_error *err);
nf_status nf_tok_load_hf_text(const char *json, size_t len, const char *config_json, size_t config_len,
                              const char *source, nf_tokenizer **out, nf_error *err);

/* The regexes of a named pre-tokenizer (see nf_tok_desc.pre); 0 when the name is unknown. */
int nf_tok_pre_regexes(const char *name, const char *const **regexes, uint32_t *n);

/* ---- encoding ---------------------------------------------------------------------------------- */

enum {
    NF_TOK_ADD_SPECIAL = 1u,   /* prepend BOS / append EOS as the desc's add_bos/add_eos say */
    NF_TOK_PARSE_SPECIAL = 2u, /* match CONTROL tokens written in the text (HF's default); without
                                  it they are plain text, as HF's encode_special_tokens=True */
};

/* A growable id list; zero-initialise, free with nf_tok_ids_free. */
typedef struct nf_tok_ids {
    int32_t *ids; /* [n] */
    size_t n, cap;
} nf_tok_ids;

void nf_tok_ids_free(nf_tok_ids *v);

/* Appends the ids of text[0..len) to *out. The text must be valid UTF-8 (NF_ERR_INVALID_ARG with
 * the byte offset otherwise). */
nf_status nf_tok_encode(const nf_tokenizer *t, const char *text, size_t len, unsigned flags, nf_tok_ids *out,
                        nf_error *err);

/* ---- decoding ---------------------------------------------------------------------------------- */

enum { NF_TOK_SKIP_SPECIAL = 1u }; /* leave CONTROL tokens out of decoded text */

uint32_t nf_tok_vocab_size(const nf_tokenizer *t);
nf_tok_type nf_tok_token_type(const nf_tokenizer *t, int32_t id);
int32_t nf_tok_bos(const nf_tokenizer *t);
int32_t nf_tok_eos(const nf_tokenizer *t);
const char *nf_tok_chat_template(const nf_tokenizer *t); /* NULL when the source had none */
/* Id of a token by its exact vocabulary text (byte-level form for model tokens); -1 if absent. */
int32_t nf_tok_find(const nf_tokenizer *t, const char *text);

/* The bytes a token stands for (not NUL-terminated; may be part of a UTF-8 sequence); NULL when
 * id is out of range. */
const uint8_t *nf_tok_token_bytes(const nf_tokenizer *t, int32_t id, size_t *len);

/* The exact bytes of a token sequence (may be invalid UTF-8 when the ids split a character).
 * *out is malloc'd and NUL-terminated; free() it. */
nf_status nf_tok_decode(const nf_tokenizer *t, const int32_t *ids, size_t n, unsigned flags, char **out,
                        size_t *len, nf_error *err);

/* Streaming decoder for printing tokens as they come: it holds back an incomplete UTF-8 sequence
 * until the next token completes it, so every chunk it returns is valid UTF-8 by itself. Bytes that
 * can never form a character become U+FFFD, one per maximal invalid subpart (as Rust's
 * from_utf8_lossy and Python's errors="replace"), so the concatenated chunks equal HF's decode. */
typedef struct nf_tok_stream {
    const nf_tokenizer *t;
    unsigned flags;  /* NF_TOK_SKIP_SPECIAL */
    uint8_t pend[4]; /* held-back prefix of a UTF-8 sequence */
    int n_pend;
    char *buf;       /* [cap] output of the last call */
    size_t cap;
} nf_tok_stream;

nf_status nf_tok_stream_init(nf_tok_stream *s, const nf_tokenizer *t, unsigned flags, nf_error *err);
/* Feeds one id; returns the text that is now complete (possibly empty, NUL-terminated, valid
 * until the next call) and its length in *len; NULL with *err set for an out-of-range id. */
const char *nf_tok_stream_put(nf_tok_stream *s, int32_t id, size_t *len, nf_error *err);
/* End of stream: a held-back incomplete sequence becomes U+FFFD. */
const char *nf_tok_stream_flush(nf_tok_stream *s, size_t *len);
void nf_tok_stream_free(nf_tok_stream *s);

/* ---- helpers shared with the tests ------------------------------------------------------------- */

/* Unicode NFC of valid UTF-8 text; *out malloc'd, NUL-terminated. */
nf_status nf_utf8_nfc(const char *s, size_t len, char **out, size_t *out_len, nf_error *err);
/* Length of the longest prefix of s[0..n) that is valid UTF-8 (n when all of it is). */
size_t nf_utf8_valid_prefix(const char *s, size_t n);

#endif

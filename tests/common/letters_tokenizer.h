/* Toy tokenizers for scheduler, stop-string, speculation and server tests: letters_tokenizer(n) has n
 * tokens (n <= 52), token i the one letter 'a' + i (then 'A' + i - 26), so expected texts follow from
 * ids by hand. Include after nf_test.h. */
#ifndef NF_TEST_LETTERS_TOKENIZER_H
#define NF_TEST_LETTERS_TOKENIZER_H

#include "tokenizer/tokenizer.h"

/* A byte-level BPE tokenizer over the given token strings (no merges), named `source` in errors. */
static inline nf_tokenizer *toy_tokenizer(const char *const *tokens, uint32_t n, const char *source)
{
    nf_tok_desc d = nf_tok_desc_empty();
    d.source = source;
    d.n_vocab = n;
    d.tokens = tokens;
    d.pre = "gpt2";
    nf_tokenizer *t = NULL;
    nf_error e;
    if (nf_tok_create(&d, &t, &e)) CHECK_MSG(0, "tokenizer: %s", e.msg);
    return t;
}

static inline nf_tokenizer *letters_tokenizer(int n)
{
    static char text[52][2];
    const char *tokens[52];
    if (n > 52) n = 52;
    for (int i = 0; i < n; i++) {
        text[i][0] = (char)(i < 26 ? 'a' + i : 'A' + (i - 26));
        tokens[i] = text[i];
    }
    return toy_tokenizer(tokens, (uint32_t)n, "test letters");
}

#endif

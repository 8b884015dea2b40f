/* Toy tokenizers for scheduler, stop-string, speculation and server tests: letters_tokenizer(n) has n
 * tokens (n <= 52), token i the one letter 'a' + i (then 'A' + i - 26), so expected texts follow from
 * ids by hand. Include after nf_test.h. */
#ifndef NF_TEST_LETTERS_TOKENIZER_H
#define NF_TEST_LETTERS_TOKENIZER_H

#include <stdio.h>
#include <stdlib.h>

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

/* Token i decodes to "t<i>" (V of them): text for the text stream and stop strings. */
static inline nf_tokenizer *names_tokenizer(uint32_t V)
{
    char *buf = malloc((size_t)V * 12);
    const char **tokens = malloc((size_t)V * sizeof *tokens);
    nf_tokenizer *t = NULL;
    if (buf && tokens) {
        for (uint32_t i = 0; i < V; i++) {
            snprintf(buf + (size_t)i * 12, 12, "t%u", i);
            tokens[i] = buf + (size_t)i * 12;
        }
        t = toy_tokenizer(tokens, V, "test names"); /* nf_tok_create copies the strings */
    }
    free(buf);
    free(tokens);
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

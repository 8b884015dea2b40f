/* A toy tokenizer for scheduler, stop-string and server tests: n tokens (n <= 52), token i the one
 * letter 'a' + i (then 'A' + i - 26), so expected texts follow from ids by hand. Include after
 * nf_test.h. */
#ifndef NF_TEST_LETTERS_TOKENIZER_H
#define NF_TEST_LETTERS_TOKENIZER_H

#include "tokenizer/tokenizer.h"

static inline nf_tokenizer *letters_tokenizer(int n)
{
    static char text[52][2];
    const char *tokens[52];
    for (int i = 0; i < n && i < 52; i++) {
        text[i][0] = (char)(i < 26 ? 'a' + i : 'A' + (i - 26));
        tokens[i] = text[i];
    }
    nf_tok_desc d = nf_tok_desc_empty();
    d.source = "test letters";
    d.n_vocab = (uint32_t)(n < 52 ? n : 52);
    d.tokens = tokens;
    d.pre = "gpt2";
    nf_tokenizer *t = NULL;
    nf_error e;
    if (nf_tok_create(&d, &t, &e)) CHECK_MSG(0, "tokenizer: %s", e.msg);
    return t;
}

#endif

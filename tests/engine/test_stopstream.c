/* The stop-string stream (engine/stopstream.h, shared by nf_generate and the scheduler, hence the
 * server) against a brute-force reference: random texts over a small alphabet, fed one token (one
 * letter) at a time; what is emitted must never contain or end inside a stop string, and must equal
 * the text before the first occurrence of any stop string (the whole text when none occurs). */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>

#include "engine/stopstream.h"
#include "nf_test.h"
#include "common/letters_tokenizer.h"

enum { MAXLEN = 40 };

/* The earliest index where any stop string occurs; len when none. */
static size_t brute_first(const char *t, size_t len, const char *const *stops, size_t n)
{
    for (size_t at = 0; at < len; at++)
        for (size_t i = 0; i < n; i++)
            if (at + strlen(stops[i]) <= len && memcmp(t + at, stops[i], strlen(stops[i])) == 0) return at;
    return len;
}

typedef struct shown {
    char s[MAXLEN + 1];
    size_t len;
} shown;

static void take(void *ctx, const char *text, size_t len)
{
    shown *sh = ctx;
    CHECK(sh->len + len <= MAXLEN);
    if (sh->len + len > MAXLEN) return;
    memcpy(sh->s + sh->len, text, len);
    sh->len += len;
}

static void random_texts(const nf_tokenizer *tok)
{
    const char *const stops[] = {"ab", "bab", "ccc"};
    unsigned seed = 7;
    for (int trial = 0; trial < 2000; trial++) {
        char t[MAXLEN];
        const size_t len = (size_t)(rand_r(&seed) % (MAXLEN - 1));
        for (size_t i = 0; i < len; i++) t[i] = "abcd"[rand_r(&seed) % 4];
        nf_stop_stream ss;
        CHECK(nf_stop_stream_init(&ss, tok, stops, 3, NULL) == NF_OK);
        shown sh = {{0}, 0};
        int stopped = 0;
        for (size_t n = 0; n < len && !stopped; n++) {
            CHECK(nf_stop_stream_put(&ss, t[n] - 'a', take, &sh, &stopped, NULL) == NF_OK);
            CHECK(sh.len <= n + 1 && brute_first(sh.s, sh.len, stops, 3) == sh.len); /* no stop string shown */
        }
        if (!stopped) CHECK(nf_stop_stream_finish(&ss, take, &sh, &stopped, NULL) == NF_OK);
        const size_t want = brute_first(t, len, stops, 3);
        CHECK_MSG(sh.len == want && memcmp(sh.s, t, want) == 0 && stopped == (want < len),
                  "trial %d: shown %zu, want %zu (%.*s)", trial, sh.len, want, (int)len, t);
        nf_stop_stream_free(&ss);
    }
}

int main(void)
{
    nf_tokenizer *tok = letters_tokenizer(4);
    if (tok) random_texts(tok);
    nf_tok_free(tok);
    return nf_test_report();
}

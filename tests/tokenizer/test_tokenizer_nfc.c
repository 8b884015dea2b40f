/* NFC against Python's unicodedata.normalize('NFC', .) for every code point with a canonical
 * decomposition or a combining class (alone, followed by marks out of order, and pre-decomposed),
 * Hangul and a few composition edge cases (tests/fixtures/tokenizer/nfc_cases.json); and the UTF-8
 * validity scan on the boundaries of Table 3-7. */
#include <stdio.h>

#include "nf_test.h"
#include "tok_fixture.h"

static void check_nfc_fixture(void)
{
    cJSON *cases = fix_json(TOK_FIX "nfc_cases.json");
    CHECK(cases != NULL);
    if (!cases) return;
    int n = 0, bad = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases)
    {
        size_t in_len, want_len, got_len;
        char *in = fix_unhex(cJSON_GetObjectItem(c, "in")->valuestring, &in_len);
        char *want = fix_unhex(cJSON_GetObjectItem(c, "out")->valuestring, &want_len);
        char *got = NULL;
        nf_error e;
        CHECK_MSG(nf_utf8_nfc(in, in_len, &got, &got_len, &e) == NF_OK, "%s", e.msg);
        if (!got || got_len != want_len || memcmp(got, want, want_len) != 0) {
            if (bad++ < 3) fprintf(stderr, "NFC case %d differs from Python (%zu vs %zu bytes)\n", n, got_len, want_len);
        }
        free(in);
        free(want);
        free(got);
        n++;
    }
    CHECK_MSG(bad == 0, "%d of %d NFC cases differ from unicodedata", bad, n);
    CHECK(n > 100);
    cJSON_Delete(cases);
}

static void check_utf8_scan(void)
{
    static const struct {
        const char *s;
        size_t valid;
    } cases[] = {
        {"abc", 3},
        {"\xc3\xa9", 2},           // U+00E9
        {"\xc0\xaf", 0},           // overlong '/'
        {"\xc2", 0},               // truncated
        {"\xe0\x9f\xbf", 0},       // overlong 3-byte
        {"\xe0\xa0\x80", 3},       // U+0800, the first 3-byte
        {"\xed\xa0\x80", 0},       // a surrogate
        {"\xef\xbf\xbd", 3},       // U+FFFD
        {"\xf0\x8f\xbf\xbf", 0},   // overlong 4-byte
        {"\xf0\x90\x80\x80", 4},   // U+10000
        {"\xf4\x8f\xbf\xbf", 4},   // U+10FFFF
        {"\xf4\x90\x80\x80", 0},   // above U+10FFFF
        {"a\x80", 1},              // stray continuation
        {"ok\xf5", 2},             // never a lead byte
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        CHECK_EQ_U64(nf_utf8_valid_prefix(cases[i].s, strlen(cases[i].s)), cases[i].valid);
    char *out;
    size_t n;
    nf_error e;
    CHECK(nf_utf8_nfc("a\x80", 2, &out, &n, &e) == NF_ERR_INVALID_ARG);
    CHECK_CONTAINS(e.msg, "byte 1");
    CHECK(nf_utf8_nfc("\xcc\x81\xff", 3, &out, &n, &e) == NF_ERR_INVALID_ARG);
    CHECK_CONTAINS(e.msg, "byte 2");
}

int main(void)
{
    check_nfc_fixture();
    check_utf8_scan();
    return nf_test_report();
}

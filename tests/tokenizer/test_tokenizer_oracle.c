/* Token ids identical to HF `tokenizers` for every corpus string (Qwen3's tokenizer.json, SmolLM2
 * from its GGUF metadata, the llama-3 split rule on Qwen's vocabulary), with special tokens parsed
 * and as plain text; decode(encode(s)) == s (NFC(s) for Qwen); the streaming decoder emits only
 * whole UTF-8 characters and its output equals HF's decode, also for random id sequences that cut
 * characters apart. */
#include <stdio.h>

#include "base/timer.h"
#include "nf_test.h"
#include "tok_fixture.h"

static int valid_utf8(const char *s, size_t n) { return nf_utf8_valid_prefix(s, n) == n; }

/* Streams ids through the decoder; checks every chunk is valid UTF-8 on its own; returns the text. */
static char *stream_all(const nf_tokenizer *t, const int32_t *ids, size_t n, size_t *len, int *chunks_ok)
{
    nf_tok_stream s;
    nf_error e;
    *chunks_ok = 1;
    if (nf_tok_stream_init(&s, t, 0, &e) != NF_OK) return NULL;
    size_t cap = 64, m = 0;
    char *out = malloc(cap);
    for (size_t i = 0; i <= n; i++) {
        size_t k;
        const char *c = i < n ? nf_tok_stream_put(&s, ids[i], &k, &e) : nf_tok_stream_flush(&s, &k);
        if (!c) {
            *chunks_ok = 0;
            break;
        }
        if (!valid_utf8(c, k)) *chunks_ok = 0;
        while (m + k + 1 > cap) out = realloc(out, cap *= 2);
        memcpy(out + m, c, k);
        m += k;
    }
    out[m] = 0;
    *len = m;
    nf_tok_stream_free(&s);
    return out;
}

static void check_encode(const char *name, const nf_tokenizer *t, const cJSON *cases, int nfc)
{
    int n_case = 0, n_bad = 0, n_stream_bad = 0, n_rt_bad = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases)
    {
        size_t len, n_ref, n_ref2;
        char *text = fix_unhex(cJSON_GetObjectItem(c, "hex")->valuestring, &len);
        int32_t *ref = fix_ids(cJSON_GetObjectItem(c, "ids"), &n_ref);
        int32_t *ref2 = fix_ids(cJSON_GetObjectItem(c, "ids_special_as_text"), &n_ref2);
        nf_tok_ids got = {0}, got2 = {0};
        nf_error e;
        CHECK_MSG(nf_tok_encode(t, text, len, NF_TOK_PARSE_SPECIAL, &got, &e) == NF_OK, "%s", e.msg);
        CHECK(nf_tok_encode(t, text, len, 0, &got2, &e) == NF_OK);
        int same = got.n == n_ref && (n_ref == 0 || memcmp(got.ids, ref, n_ref * sizeof *ref) == 0);
        int same2 = got2.n == n_ref2 && (n_ref2 == 0 || memcmp(got2.ids, ref2, n_ref2 * sizeof *ref2) == 0);
        if (!same || !same2) {
            if (n_bad++ < 5) {
                fprintf(stderr, "%s: case %d (%zu bytes) '%.60s': %s ids differ (%zu vs HF %zu):", name, n_case, len,
                        text, same ? "special-as-text" : "parse-special", same ? got2.n : got.n, same ? n_ref2 : n_ref);
                const nf_tok_ids *g = same ? &got2 : &got;
                const int32_t *r = same ? ref2 : ref;
                for (size_t i = 0; i < g->n && i < 12; i++) fprintf(stderr, " %d/%d", g->ids[i], i < (same ? n_ref2 : n_ref) ? r[i] : -1);
                fputc('\n', stderr);
            }
        }
        // Round trip: the decoded bytes are the text (after NFC when the tokenizer normalizes).
        char *dec, *want = text;
        size_t dlen, wlen = len;
        if (nfc) CHECK(nf_utf8_nfc(text, len, &want, &wlen, &e) == NF_OK);
        CHECK(nf_tok_decode(t, got.ids, got.n, 0, &dec, &dlen, &e) == NF_OK);
        if (dlen != wlen || memcmp(dec, want, wlen) != 0) n_rt_bad++;
        int ok;
        size_t slen;
        char *st = stream_all(t, got.ids, got.n, &slen, &ok);
        if (!ok || slen != wlen || memcmp(st, want, wlen) != 0) n_stream_bad++;
        free(st);
        free(dec);
        if (nfc) free(want);
        nf_tok_ids_free(&got);
        nf_tok_ids_free(&got2);
        free(ref);
        free(ref2);
        free(text);
        n_case++;
    }
    CHECK_MSG(n_bad == 0, "%s: %d of %d corpus strings tokenized differently from HF", name, n_bad, n_case);
    CHECK_MSG(n_rt_bad == 0, "%s: %d round trips differ", name, n_rt_bad);
    CHECK_MSG(n_stream_bad == 0, "%s: %d streamed decodes split a character or differ", name, n_stream_bad);
    CHECK(n_case > 250);
    printf("%s: %d corpus strings, ids identical to HF: %s\n", name, n_case, n_bad ? "NO" : "yes");
}

/* Random id sequences: the stream's chunks are whole characters and add up to HF's lossy decode. */
static void check_decode(const char *name, const nf_tokenizer *t, const cJSON *cases)
{
    int n_case = 0, n_bad = 0, n_partial = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases)
    {
        size_t n, wlen;
        int32_t *ids = fix_ids(cJSON_GetObjectItem(c, "ids"), &n);
        char *want = fix_unhex(cJSON_GetObjectItem(c, "hex")->valuestring, &wlen);
        int ok;
        size_t slen;
        char *got = stream_all(t, ids, n, &slen, &ok);
        if (!ok) n_partial++;
        if (slen != wlen || memcmp(got, want, wlen) != 0) n_bad++;
        free(got);
        free(want);
        free(ids);
        n_case++;
    }
    CHECK_MSG(n_partial == 0, "%s: %d streams emitted a partial UTF-8 sequence", name, n_partial);
    CHECK_MSG(n_bad == 0, "%s: %d of %d streamed decodes differ from HF's decode", name, n_bad, n_case);
    CHECK(n_case >= 60);
}

/* Encoding speed on a ~1 MB mixed text (the corpus repeated), for the report. */
static void measure_speed(const char *name, const nf_tokenizer *t, const cJSON *cases)
{
    size_t cap = 1 << 20, n = 0;
    char *big = malloc(cap + 4096);
    while (n < cap) {
        const cJSON *c;
        cJSON_ArrayForEach(c, cases)
        {
            size_t len;
            char *s = fix_unhex(cJSON_GetObjectItem(c, "hex")->valuestring, &len);
            if (n + len < cap + 4096) memcpy(big + n, s, len), n += len;
            free(s);
            if (n >= cap) break;
        }
    }
    nf_tok_ids ids = {0};
    nf_error e;
    uint64_t t0 = nf_time_ns();
    CHECK(nf_tok_encode(t, big, n, NF_TOK_PARSE_SPECIAL, &ids, &e) == NF_OK);
    double s = (double)(nf_time_ns() - t0) * 1e-9;
    printf("%s: encoded %zu bytes into %zu tokens in %.3f s: %.2f MB/s, %.0f tokens/s\n", name, n, ids.n, s,
           (double)n / s / 1e6, (double)ids.n / s);
    nf_tok_ids_free(&ids);
    free(big);
}

int main(void)
{
    cJSON *cases = fix_json(TOK_FIX "cases.json");
    CHECK(cases != NULL);
    if (!cases) return nf_test_report();
    struct {
        const char *name;
        nf_tokenizer *(*load)(void);
        int nfc;
    } setups[] = {{"qwen3", fix_qwen3, 1}, {"smollm2", fix_smollm2, 0}, {"qwen3_llama3pre", fix_qwen3_llama3pre, 0}};
    for (int i = 0; i < 3; i++) {
        uint64_t t0 = nf_time_ns();
        nf_tokenizer *t = setups[i].load();
        double load_s = (double)(nf_time_ns() - t0) * 1e-9;
        CHECK_MSG(t != NULL, "%s did not load", setups[i].name);
        if (!t) continue;
        printf("%s: loaded %u tokens in %.3f s\n", setups[i].name, nf_tok_vocab_size(t), load_s);
        const cJSON *set = cJSON_GetObjectItem(cases, setups[i].name);
        check_encode(setups[i].name, t, cJSON_GetObjectItem(set, "encode"), setups[i].nfc);
        if (cJSON_GetObjectItem(set, "decode")) check_decode(setups[i].name, t, cJSON_GetObjectItem(set, "decode"));
        measure_speed(setups[i].name, t, cJSON_GetObjectItem(set, "encode"));
        nf_tok_free(t);
    }
    cJSON_Delete(cases);
    return nf_test_report();
}

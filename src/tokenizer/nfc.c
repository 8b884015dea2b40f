/* Unicode Normalization Form C (UAX #15): full canonical decomposition, canonical ordering of
 * combining marks, then canonical composition. Data from unicode_tables.c; Hangul is algorithmic. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode_tables.h"
#include "tokenizer/utf8.h"

enum { S_BASE = 0xAC00, L_BASE = 0x1100, V_BASE = 0x1161, T_BASE = 0x11A7, L_COUNT = 19, V_COUNT = 21,
       T_COUNT = 28, N_COUNT = V_COUNT * T_COUNT, S_COUNT = L_COUNT * N_COUNT };

static unsigned ccc_of(uint32_t c)
{
    if (c < 0x300) return 0;
    size_t lo = 0, hi = nf_ucd_ccc_count;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (c < nf_ucd_ccc[mid].lo) hi = mid;
        else if (c > nf_ucd_ccc[mid].hi) lo = mid + 1;
        else return nf_ucd_ccc[mid].ccc;
    }
    return 0;
}

static const nf_ucd_decomp_entry *decomp_of(uint32_t c)
{
    size_t lo = 0, hi = nf_ucd_decomp_count;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (c < nf_ucd_decomp[mid].cp) hi = mid;
        else if (c > nf_ucd_decomp[mid].cp) lo = mid + 1;
        else return &nf_ucd_decomp[mid];
    }
    return NULL;
}

/* The primary composite of a + b, or 0. */
static uint32_t compose(uint32_t a, uint32_t b)
{
    if (a >= L_BASE && a < L_BASE + L_COUNT && b >= V_BASE && b < V_BASE + V_COUNT)
        return S_BASE + ((a - L_BASE) * V_COUNT + (b - V_BASE)) * T_COUNT;
    if (a >= S_BASE && a < S_BASE + S_COUNT && (a - S_BASE) % T_COUNT == 0 && b > T_BASE && b < T_BASE + T_COUNT)
        return a + (b - T_BASE);
    size_t lo = 0, hi = nf_ucd_comp_count;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const nf_ucd_comp_entry *e = &nf_ucd_comp[mid];
        if (a < e->a || (a == e->a && b < e->b)) hi = mid;
        else if (a > e->a || b > e->b) lo = mid + 1;
        else return e->cp;
    }
    return 0;
}

/* Appends the full canonical decomposition of c to out[*n]; the caller reserves 4 slots per input
 * code point (the most any canonical decomposition in the UCD produces). */
static void decompose(uint32_t c, uint32_t *out, size_t *n)
{
    if (c >= S_BASE && c < S_BASE + S_COUNT) {
        uint32_t s = c - S_BASE;
        out[(*n)++] = L_BASE + s / N_COUNT;
        out[(*n)++] = V_BASE + (s % N_COUNT) / T_COUNT;
        if (s % T_COUNT) out[(*n)++] = T_BASE + s % T_COUNT;
        return;
    }
    const nf_ucd_decomp_entry *d = c >= 0xC0 ? decomp_of(c) : NULL;
    if (!d) {
        out[(*n)++] = c;
        return;
    }
    decompose(d->a, out, n);
    if (d->b) decompose(d->b, out, n);
}

/* Stable sort of each run of non-starters by combining class (insertion sort: runs are short). */
static void canonical_order(uint32_t *cp, size_t n)
{
    for (size_t i = 1; i < n; i++) {
        uint32_t c = cp[i];
        unsigned k = ccc_of(c);
        if (k == 0) continue;
        size_t j = i;
        while (j > 0 && ccc_of(cp[j - 1]) > k) {
            cp[j] = cp[j - 1];
            j--;
        }
        cp[j] = c;
    }
}

/* Canonical composition in place (UAX #15's reference algorithm); returns the new length. */
static size_t canonical_compose(uint32_t *cp, size_t n)
{
    if (n == 0) return 0;
    size_t starter = 0, out = 1;
    unsigned last = ccc_of(cp[0]);
    if (last != 0) last = 256; // a leading non-starter blocks everything after it
    for (size_t i = 1; i < n; i++) {
        uint32_t c = cp[i];
        unsigned k = ccc_of(c);
        uint32_t comp = compose(cp[starter], c);
        if (comp && (last < k || last == 0)) {
            cp[starter] = comp;
            continue;
        }
        if (k == 0) starter = out;
        last = k;
        cp[out++] = c;
    }
    return out;
}

nf_status nf_utf8_nfc(const char *s, size_t len, char **out, size_t *out_len, nf_error *err)
{
    const uint8_t *u = (const uint8_t *)s;
    size_t valid = nf_utf8_valid_prefix(s, len);
    if (valid != len) return nf_error_set(err, NF_ERR_INVALID_ARG, "NFC: invalid UTF-8 at byte %zu", valid);
    int simple = 1; // no code point >= U+0300: NFC leaves such text unchanged
    for (size_t i = 0; i < len && simple; i++)
        if (u[i] >= 0xCC) simple = 0; // lead bytes of U+0300 and above
    if (simple) {
        *out = malloc(len + 1);
        if (!*out) return nf_error_set(err, NF_ERR_NOMEM, "NFC: out of memory (%zu bytes)", len + 1);
        memcpy(*out, s, len);
        (*out)[len] = 0;
        *out_len = len;
        return NF_OK;
    }
    // Canonical decompositions in the UCD expand one code point to at most 4 (Hangul to 3).
    uint32_t *cp = malloc((len * 4 + 4) * sizeof *cp);
    if (!cp) return nf_error_set(err, NF_ERR_NOMEM, "NFC: out of memory for %zu bytes of text", len);
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        size_t l;
        uint32_t c;
        nf_u8_next(u + i, len - i, &l, &c); // validated above
        decompose(c, cp, &n);
        i += l;
    }
    canonical_order(cp, n);
    n = canonical_compose(cp, n);
    uint8_t *o = malloc(n * 4 + 1);
    if (!o) {
        free(cp);
        return nf_error_set(err, NF_ERR_NOMEM, "NFC: out of memory for %zu code points", n);
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++) m += (size_t)nf_u8_put(o + m, cp[i]);
    o[m] = 0;
    free(cp);
    *out = (char *)o;
    *out_len = m;
    return NF_OK;
}

#include "tokenizer/utf8.h"

#include "tokenizer/tokenizer.h"

nf_u8_scan nf_u8_next(const uint8_t *s, size_t n, size_t *len, uint32_t *cp)
{
    uint8_t b = s[0];
    if (b < 0x80) {
        *len = 1;
        *cp = b;
        return NF_U8_OK;
    }
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF; // allowed range of the second byte (Table 3-7)
    if (b >= 0xC2 && b <= 0xDF) {
        need = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
        need = 3;
        if (b == 0xE0) lo = 0xA0;     // no overlongs
        if (b == 0xED) hi = 0x9F;     // no surrogates
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 4;
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F;     // nothing above U+10FFFF
    } else {
        *len = 1;                     // 80..C1 and F5..FF never start a sequence
        return NF_U8_INVALID;
    }
    uint32_t c = b & (need == 2 ? 0x1F : need == 3 ? 0x0F : 0x07);
    for (size_t i = 1; i < need; i++) {
        if (i >= n) {
            *len = i;
            return NF_U8_INCOMPLETE;
        }
        uint8_t x = s[i];
        uint8_t l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (x < l || x > h) {
            *len = i;                 // the maximal subpart ends before the offending byte
            return NF_U8_INVALID;
        }
        c = (c << 6) | (x & 0x3F);
    }
    *len = need;
    *cp = c;
    return NF_U8_OK;
}

size_t nf_utf8_valid_prefix(const char *s, size_t n)
{
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0;
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        size_t len;
        uint32_t cp;
        if (nf_u8_next(u + i, n - i, &len, &cp) != NF_U8_OK) return i;
        i += len;
    }
    return n;
}

/* UTF-8 scanning per Unicode's Table 3-7 (well-formed byte sequences), internal to the tokenizer. */
#ifndef NF_TOKENIZER_UTF8_H
#define NF_TOKENIZER_UTF8_H

#include <stddef.h>
#include <stdint.h>

typedef enum nf_u8_scan { NF_U8_OK, NF_U8_INCOMPLETE, NF_U8_INVALID } nf_u8_scan;

/* Looks at the sequence starting at s[0] (n >= 1). OK: *len bytes form code point *cp. INCOMPLETE:
 * all n bytes are a valid prefix of a longer sequence. INVALID: the first *len bytes are a maximal
 * invalid subpart (replace them with one U+FFFD and go on). */
nf_u8_scan nf_u8_next(const uint8_t *s, size_t n, size_t *len, uint32_t *cp);

/* Appends code point cp as UTF-8 to out; returns the byte count (1..4). */
static inline int nf_u8_put(uint8_t *out, uint32_t cp)
{
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | (cp >> 6));
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | (cp >> 12));
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | (cp >> 18));
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

#endif

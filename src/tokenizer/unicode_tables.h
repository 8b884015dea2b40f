/* Unicode data for NFC, generated into unicode_tables.c by gen_unicode_tables.py. */
#ifndef NF_TOKENIZER_UNICODE_TABLES_H
#define NF_TOKENIZER_UNICODE_TABLES_H

#include <stddef.h>
#include <stdint.h>

typedef struct nf_ucd_ccc_range {
    uint32_t lo, hi; // inclusive code point range
    uint8_t ccc;     // canonical combining class shared by the range (non-zero)
} nf_ucd_ccc_range;

typedef struct nf_ucd_decomp_entry {
    uint32_t cp, a, b; // cp -> a b (b = 0 for a singleton); one level, apply recursively
} nf_ucd_decomp_entry;

typedef struct nf_ucd_comp_entry {
    uint32_t a, b, cp; // starter a + b compose to cp; sorted by (a, b)
} nf_ucd_comp_entry;

extern const char nf_ucd_version[];
extern const nf_ucd_ccc_range nf_ucd_ccc[];
extern const size_t nf_ucd_ccc_count;
extern const nf_ucd_decomp_entry nf_ucd_decomp[];
extern const size_t nf_ucd_decomp_count;
extern const nf_ucd_comp_entry nf_ucd_comp[];
extern const size_t nf_ucd_comp_count;

#endif

/* FNV-1a 64: the witness hash used to compare outputs bit-for-bit across builds and machines. */
#ifndef NF_BASE_FNV_H
#define NF_BASE_FNV_H

#include <stddef.h>
#include <stdint.h>

#define NF_FNV1A64_INIT 0xcbf29ce484222325ULL

/* Continues hash `h` over n bytes; start from NF_FNV1A64_INIT. */
uint64_t nf_fnv1a64_update(uint64_t h, const void *data, size_t n);
static inline uint64_t nf_fnv1a64(const void *data, size_t n) { return nf_fnv1a64_update(NF_FNV1A64_INIT, data, n); }

#endif

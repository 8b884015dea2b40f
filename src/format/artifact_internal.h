/* Shared by the artifact reader and writer: the fixed sizes of docs/artifact.md and
 * little-endian field access that does not depend on the host's byte order or alignment. */
#ifndef NF_FORMAT_ARTIFACT_INTERNAL_H
#define NF_FORMAT_ARTIFACT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "format/artifact.h"

#define NF_ARTIFACT_HEADER_BYTES 64
#define NF_ARTIFACT_INDEX_MAGIC "NFIX"
/* Smallest possible entries, used to bound counts before allocating for them:
 * metadata = key (4 + 1 + 1) + type 4 + a bool 1; tensor = name 6 + codec 6 + n_dims 4 + one dim 8
 * + divisors 4 + flags 4 + input count 4 + plane count 4 + one plane 16 + offset, size, checksum 24. */
#define NF_META_MIN_BYTES 11
#define NF_TENSOR_MIN_BYTES 80

static inline uint16_t nf_le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t nf_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t nf_le64(const uint8_t *p) { return (uint64_t)nf_le32(p) | (uint64_t)nf_le32(p + 4) << 32; }
static inline void nf_put_le16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void nf_put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void nf_put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Bytes of one scalar of type t (bool: 1); 0 for strings, arrays and unknown types. */
size_t nf_meta_type_size(nf_meta_type t);

#endif

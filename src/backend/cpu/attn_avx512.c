/* AVX-512 scores for up to 16 consecutive query tokens of one head (prefill): attn_avx2.c's score
 * loop with 16 lanes (attn_scores.h), so each broadcast key element and each mul / add serves twice
 * the queries. Lane j runs exactly the scalar's s = s + q_j[i] * k[i] (separate mul and add), so the
 * attention keeps ops.c's scalar bits for any block or thread split (tests/cpu/test_cpu_ops). */
#include <immintrin.h>

#include "backend/cpu/attn_scores.h"

NF_ATTN_SCORES(nf_cpu_attn_scores16_avx512, __m512, 16, _mm512)

/* Monotonic clock for host-side timing (progress, CPU benchmarks). GPU timings use CUDA events. */
#ifndef NF_BASE_TIMER_H
#define NF_BASE_TIMER_H

#include <stdint.h>

uint64_t nf_time_ns(void);
static inline double nf_time_s(void) { return (double)nf_time_ns() * 1e-9; }

#endif

/* Stop strings over streamed text: what may be shown now and where a stop string begins. */
#ifndef NF_SERVE_STOPS_H
#define NF_SERVE_STOPS_H

#include <stddef.h>

/* text[0, len) is everything generated so far. Returns 1 when a stop string occurs at or after
 * `from` (its first occurrence, earliest start): *safe is where it starts. Otherwise 0 and *safe is
 * the end of what can no longer become part of a stop string (unless final: then len). `from` is
 * what was already shown, so a stop string is never searched for inside shown text twice. */
int nf_serve_stop_scan(const char *text, size_t len, size_t from, char *const *stops, size_t n_stops, int final,
                       size_t *safe);

#endif

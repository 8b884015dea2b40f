/* Stop-string scan (stops.h). */
#include "serve/stops.h"

#include <string.h>

/* The start of the first occurrence of s at or after `from`, or len. None can start before `from`:
 * shown text never ends with a prefix of a stop string (that prefix is held back). */
static size_t find(const char *text, size_t len, size_t from, const char *s, size_t sl)
{
    for (size_t at = from; at + sl <= len; at++)
        if (memcmp(text + at, s, sl) == 0) return at;
    return len;
}

/* The length of the longest proper prefix of s that text[from, len) ends with. */
static size_t partial(const char *text, size_t len, size_t from, const char *s, size_t sl)
{
    for (size_t k = sl - 1; k > 0; k--)
        if (k <= len - from && memcmp(text + len - k, s, k) == 0) return k;
    return 0;
}

int nf_serve_stop_scan(const char *text, size_t len, size_t from, char *const *stops, size_t n_stops, int final,
                       size_t *safe)
{
    size_t first = len;
    for (size_t i = 0; i < n_stops; i++) {
        size_t sl = strlen(stops[i]);
        if (!sl) continue;
        size_t at = find(text, len, from, stops[i], sl);
        if (at < first) first = at;
    }
    if (first < len) {
        *safe = first;
        return 1;
    }
    *safe = len;
    if (final) return 0;
    for (size_t i = 0; i < n_stops; i++) {
        size_t sl = strlen(stops[i]);
        if (!sl) continue;
        size_t k = partial(text, len, from, stops[i], sl);
        if (len - k < *safe) *safe = len - k;
    }
    return 0;
}

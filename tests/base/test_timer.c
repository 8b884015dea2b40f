#define _POSIX_C_SOURCE 200809L
#include <time.h>

#include "base/timer.h"
#include "nf_test.h"

int main(void)
{
    uint64_t a = nf_time_ns();
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
    uint64_t b = nf_time_ns();
    CHECK(b >= a);
    CHECK_MSG(b - a >= 20 * 1000 * 1000ull, "slept 20 ms, clock advanced %llu ns", (unsigned long long)(b - a));
    /* Monotonic: successive reads never go back. */
    uint64_t prev = nf_time_ns();
    for (int i = 0; i < 100000; i++) {
        uint64_t t = nf_time_ns();
        CHECK(t >= prev);
        prev = t;
    }
    return nf_test_report();
}

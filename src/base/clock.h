/* Monotonic seconds, for timing steps, waits and profiles. */
#ifndef PT_CLOCK_H
#define PT_CLOCK_H

#include <time.h>

static inline double pt_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif

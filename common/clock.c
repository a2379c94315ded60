/* clock.c - devio_clock_us, devio_clock_s and devio_unix_ms over clock_gettime.
 * The only file that names a clock id. */
#include <time.h>

#include "common/clock.h"

static int read_clock(clockid_t id, struct timespec *ts)
{
    if (clock_gettime(id, ts) != 0) {
        ts->tv_sec = 0;
        ts->tv_nsec = 0;
        return -1;
    }
    return 0;
}

uint64_t devio_clock_us(void)
{
    struct timespec ts;
    read_clock(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

double devio_clock_s(void)
{
    struct timespec ts;
    read_clock(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int64_t devio_unix_ms(void)
{
    struct timespec ts;
    read_clock(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

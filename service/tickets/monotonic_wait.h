/* monotonic_wait.h - condition variables whose timed waits take devio_clock_us() deadlines (CLOCK_MONOTONIC).
 * For the service's timer threads (parked_awaits.c, leases.c); header-only, it never allocates. */
#ifndef DEVIO_MONOTONIC_WAIT_H
#define DEVIO_MONOTONIC_WAIT_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

/* Initialise cv so that pthread_cond_timedwait reads CLOCK_MONOTONIC. */
static inline void devio_cond_init_monotonic(pthread_cond_t *cv)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
}

/* A devio_clock_us() time as the absolute time a timed wait takes. */
static inline struct timespec devio_monotonic_at(int64_t us)
{
    return (struct timespec){.tv_sec = us / 1000000, .tv_nsec = (long)(us % 1000000) * 1000};
}

#endif

/* clock.h - the two clocks devio reads: monotonic for durations, wall for records.
 * Never allocates, never fails (a clock that cannot be read gives 0). */
#ifndef DEVIO_CLOCK_H
#define DEVIO_CLOCK_H

#include <stdint.h>

/* Monotonic microseconds since an arbitrary origin: step timings, deadlines. */
uint64_t devio_clock_us(void);

/* Monotonic seconds as a double, for benchmarks and client-side deadlines. */
double devio_clock_s(void);

/* Unix time in milliseconds: what history rows and adapter records store. */
int64_t devio_unix_ms(void);

#endif

/* process_metrics.h - the process_* families of the Prometheus client libraries, read from /proc.
 * Reads only; a file that cannot be read leaves its families out, never fails the scrape. */
#ifndef DEVIO_PROCESS_METRICS_H
#define DEVIO_PROCESS_METRICS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* What the client libraries export for a Linux process, each with the
 * file it comes from; a has_ flag is false when that file could not be read. */
typedef struct devio_process_stats {
    bool has_stat, has_start, has_fds, has_max_fds;
    double cpu_seconds;        /* /proc/self/stat utime + stime, in clock ticks / USER_HZ */
    uint64_t virtual_bytes;    /* /proc/self/stat vsize */
    uint64_t resident_bytes;   /* /proc/self/stat rss (pages) * page size */
    double start_time_seconds; /* /proc/stat btime + /proc/self/stat starttime / USER_HZ */
    uint64_t open_fds;         /* entries of /proc/self/fd */
    uint64_t max_fds;          /* soft "Max open files" of /proc/self/limits */
} devio_process_stats;

void devio_process_stats_read(devio_process_stats *out);

/* The families with their HELP and TYPE lines, those that were read. */
void devio_process_stats_write(FILE *o, const devio_process_stats *p);

#endif

/* process_metrics.c - process CPU, memory, file descriptors and start time from /proc, as client_golang defines them.
 * Reads a few small files per scrape; it must never allocate more than a line or block on anything but the kernel. */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "service/metrics/process_metrics.h"

/* Fields of /proc/self/stat counted from 1 (proc(5)), those read here. */
enum { STAT_UTIME = 14, STAT_STIME = 15, STAT_STARTTIME = 22, STAT_VSIZE = 23, STAT_RSS = 24 };

/* Fields 3.. of /proc/self/stat into f[3..24]; false when unreadable. The
 * command name (field 2) may hold spaces and parentheses: skip to its last ')'. */
static bool read_stat(uint64_t f[STAT_RSS + 1])
{
    char buf[1024];
    FILE *in = fopen("/proc/self/stat", "r");
    if (!in)
        return false;
    size_t n = fread(buf, 1, sizeof buf - 1, in);
    fclose(in);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    if (!p)
        return false;
    p++;
    for (int i = 3; i <= STAT_RSS; i++) {
        while (*p == ' ')
            p++;
        if (!*p)
            return false;
        char *end;
        if (i == 3) { /* the state, a letter */
            f[i] = 0;
            end = p + strcspn(p, " ");
        } else {
            long long v = strtoll(p, &end, 10); /* some fields are signed; none read here */
            f[i] = v < 0 ? 0 : (uint64_t)v;
        }
        if (end == p)
            return false;
        p = end;
    }
    return true;
}

/* The boot time, seconds since the epoch: /proc/stat's btime line. */
static bool read_btime(uint64_t *btime)
{
    FILE *in = fopen("/proc/stat", "r");
    if (!in)
        return false;
    char line[256];
    bool found = false;
    while (!found && fgets(line, sizeof line, in)) {
        unsigned long long v;
        if (sscanf(line, "btime %llu", &v) == 1) {
            *btime = v;
            found = true;
        }
    }
    fclose(in);
    return found;
}

static bool count_fds(uint64_t *n)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return false;
    uint64_t c = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            c++;
    closedir(d);
    *n = c;
    return true;
}

/* The soft limit of "Max open files" in /proc/self/limits; false when it is
 * unlimited or unreadable (client_golang leaves the family out then too). */
static bool read_max_fds(uint64_t *n)
{
    FILE *in = fopen("/proc/self/limits", "r");
    if (!in)
        return false;
    char line[256];
    bool found = false;
    static const char key[] = "Max open files";
    while (!found && fgets(line, sizeof line, in)) {
        if (strncmp(line, key, sizeof key - 1) != 0)
            continue;
        char *end;
        const char *p = line + sizeof key - 1;
        unsigned long long v = strtoull(p, &end, 10);
        found = end != p;
        *n = v;
    }
    fclose(in);
    return found;
}

void devio_process_stats_read(devio_process_stats *out)
{
    memset(out, 0, sizeof *out);
    long hz = sysconf(_SC_CLK_TCK);
    long page = sysconf(_SC_PAGESIZE);
    uint64_t f[STAT_RSS + 1] = {0};
    if (hz > 0 && page > 0 && read_stat(f)) {
        out->has_stat = true;
        out->cpu_seconds = (double)(f[STAT_UTIME] + f[STAT_STIME]) / (double)hz;
        out->virtual_bytes = f[STAT_VSIZE];
        out->resident_bytes = f[STAT_RSS] * (uint64_t)page;
        uint64_t btime = 0;
        if (read_btime(&btime)) {
            out->has_start = true;
            out->start_time_seconds = (double)btime + (double)f[STAT_STARTTIME] / (double)hz;
        }
    }
    out->has_fds = count_fds(&out->open_fds);
    out->has_max_fds = read_max_fds(&out->max_fds);
}

static void family(FILE *o, const char *name, const char *type, const char *help)
{
    fprintf(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void devio_process_stats_write(FILE *o, const devio_process_stats *p)
{
    if (p->has_stat) {
        family(o, "process_cpu_seconds_total", "counter",
               "Total user and system CPU time spent in seconds.");
        fprintf(o, "process_cpu_seconds_total %.2f\n", p->cpu_seconds);
        family(o, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.");
        fprintf(o, "process_resident_memory_bytes %llu\n",
                (unsigned long long)p->resident_bytes);
        family(o, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.");
        fprintf(o, "process_virtual_memory_bytes %llu\n", (unsigned long long)p->virtual_bytes);
    }
    if (p->has_start) {
        family(o, "process_start_time_seconds", "gauge",
               "Start time of the process since unix epoch in seconds.");
        fprintf(o, "process_start_time_seconds %.2f\n", p->start_time_seconds);
    }
    if (p->has_fds) {
        family(o, "process_open_fds", "gauge", "Number of open file descriptors.");
        fprintf(o, "process_open_fds %llu\n", (unsigned long long)p->open_fds);
    }
    if (p->has_max_fds) {
        family(o, "process_max_fds", "gauge", "Maximum number of open file descriptors.");
        fprintf(o, "process_max_fds %llu\n", (unsigned long long)p->max_fds);
    }
}

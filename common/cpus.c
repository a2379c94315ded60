/* cpus.c - the CPU count of --threads 0: affinity mask and cgroup quota.
 * Every read is bounded and best effort: a file that cannot be read means no limit from it. */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cpus.h"

#if defined(__linux__) && !defined(DEVIO_NO_THREADS)
#include <sched.h>
#endif

/* ceil(quota / period) when both are positive integers, else 0. */
static uint32_t quota_cpus(long long quota, long long period)
{
    if (quota <= 0 || period <= 0)
        return 0;
    long long n = (quota + period - 1) / period;
    return n > 4096 ? 4096 : (uint32_t)n;
}

/* A whole decimal integer (leading blanks, optional '-', then digits, then blanks or end). */
static bool parse_ll(const char *s, long long *out)
{
    char *end = NULL;
    long long v = strtoll(s, &end, 10);
    if (end == s)
        return false;
    while (*end == ' ' || *end == '\n' || *end == '\t')
        end++;
    if (*end)
        return false;
    *out = v;
    return true;
}

uint32_t devio_cpus_of_cpu_max(const char *text)
{
    char q[32], p[32];
    if (!text || sscanf(text, "%31s %31s", q, p) != 2 || strcmp(q, "max") == 0)
        return 0;
    long long quota, period;
    if (!parse_ll(q, &quota) || !parse_ll(p, &period))
        return 0;
    return quota_cpus(quota, period);
}

uint32_t devio_cpus_of_cfs(const char *quota, const char *period)
{
    long long q, p;
    if (!quota || !period || !parse_ll(quota, &q) || !parse_ll(period, &p))
        return 0;
    return quota_cpus(q, p);
}

#if defined(__linux__) && !defined(DEVIO_NO_THREADS)

/* The first line of a small file into buf; false when it cannot be read. */
static bool read_line(const char *path, char *buf, size_t n)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return false;
    bool ok = fgets(buf, (int)n, f) != NULL;
    fclose(f);
    return ok;
}

/* This process's cgroup v2 path ("0::/x/y" in /proc/self/cgroup), or "" . */
static void own_cgroup(char *buf, size_t n)
{
    buf[0] = '\0';
    FILE *f = fopen("/proc/self/cgroup", "re");
    if (!f)
        return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "0::", 3) == 0) {
            line[strcspn(line, "\n")] = '\0';
            snprintf(buf, n, "%s", line + 3);
            break;
        }
    }
    fclose(f);
}

/* The smallest quota of the process's cgroup and the root's, v2 then v1; 0 = none. */
static uint32_t cgroup_cpus(void)
{
    char cg[400], path[512], a[64], b[64];
    own_cgroup(cg, sizeof cg);
    const char *dirs[] = {cg, ""};
    uint32_t best = 0;
    for (size_t i = 0; i < 2; i++) {
        if (i == 1 && cg[0] == '\0')
            break;
        snprintf(path, sizeof path, "/sys/fs/cgroup%s/cpu.max",
                 strcmp(dirs[i], "/") == 0 ? "" : dirs[i]);
        uint32_t n = read_line(path, a, sizeof a) ? devio_cpus_of_cpu_max(a) : 0;
        if (n && (!best || n < best))
            best = n;
    }
    if (read_line("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", a, sizeof a) &&
        read_line("/sys/fs/cgroup/cpu/cpu.cfs_period_us", b, sizeof b)) {
        uint32_t n = devio_cpus_of_cfs(a, b);
        if (n && (!best || n < best))
            best = n;
    }
    return best;
}

uint32_t devio_usable_cpus(void)
{
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    uint32_t n = online > 0 ? (uint32_t)online : 1;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        n = (uint32_t)CPU_COUNT(&set);
    uint32_t q = cgroup_cpus();
    if (q && q < n)
        n = q;
    return n ? n : 1;
}

#else

uint32_t devio_usable_cpus(void) { return 1; }

#endif

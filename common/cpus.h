/* cpus.h - how many CPUs this process may use: the affinity mask, bounded by a cgroup CPU quota.
 * Reads /proc and /sys only; it never changes the process's affinity or limits. */
#ifndef DEVIO_CPUS_H
#define DEVIO_CPUS_H

#include <stdint.h>

/* CPUs for "--threads 0": the CPUs of the affinity mask (or online), at most
 * the cgroup's quota rounded up (cgroup v2 cpu.max "QUOTA PERIOD", or v1
 * cpu.cfs_quota_us / cpu.cfs_period_us) of the process's own cgroup or the
 * hierarchy's root, so that a container limited to 2 CPUs on a 64-core node
 * runs 2 threads. At least 1; 1 where there are no threads (WASI). */
uint32_t devio_usable_cpus(void);

/* The CPU limit of a cgroup v2 cpu.max text ("max 100000", "150000 100000"):
 * ceil(quota / period), or 0 when there is none or the text is malformed. */
uint32_t devio_cpus_of_cpu_max(const char *text);

/* The CPU limit of cgroup v1 quota and period texts (quota -1 is none), as above. */
uint32_t devio_cpus_of_cfs(const char *quota, const char *period);

#endif

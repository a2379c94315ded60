/* adapter_files.h - opens an adapter's directory and two files below the adapters root without following a link, and hashes through a descriptor.
 * Private to the adapter loader (adapter.c, adapter_files.c); it never opens anything by a path that could lead outside the root, and never parses a file. */
#ifndef DEVIO_ADAPTER_FILES_H
#define DEVIO_ADAPTER_FILES_H

#include <stdbool.h>
#include <stdint.h>

#include "device/devio.h"

#define DEVIO_ADAPTER_CONFIG_NAME "adapter_config.json"
#define DEVIO_ADAPTER_WEIGHTS_NAME "adapter_model.safetensors"

/* One adapter directory and its files, open for reading; -1 where not
 * open. Owned; released with devio_adapter_fds_close(). Everything about the
 * adapter is read through these descriptors, never by path again, so a
 * rename or symlink swap after the open cannot change what is read. */
typedef struct devio_adapter_fds {
    int dir;
    int config;  /* -1 unless asked for */
    int weights; /* a regular file */
    bool outside; /* after a failed open: the path was refused as leading outside the
                     root (absolute, '..', a link, a bad component), not as missing */
} devio_adapter_fds;

/* Opens root once (following it: the operator chose it), then walks rel
 * one component at a time with openat(O_NOFOLLOW | O_DIRECTORY), and opens
 * the weights file (and the config when want_config) with
 * openat(O_NOFOLLOW), checking with fstat that each is a regular file.
 * rel must be relative and non-empty, without '..' or empty components
 * ('.' is skipped, trailing '/' ignored); any symbolic link on the way is
 * refused, since it could lead outside the root. The statuses are those of
 * devio_adapter_load (adapter.h). On failure *F holds nothing open. */
devio_status devio_adapter_open(const char *root, const char *rel, bool want_config,
                                devio_adapter_fds *F, devio_error *err);

/* Closes what is open and sets every descriptor to -1. */
void devio_adapter_fds_close(devio_adapter_fds *F);

/* Streams fd (from offset 0, with pread) through SHA-256 without holding
 * it in memory: lower-case hex digest and byte size. `label` names the file
 * in errors. DEVIO_E_IO (a file that changes size while read included),
 * DEVIO_E_NOMEM. */
devio_status devio_adapter_hash_fd(int fd, const char *label, char hex[65], uint64_t *size,
                                   devio_error *err);

#endif

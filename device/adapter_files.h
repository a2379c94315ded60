/* adapter_files.h - where an adapter's two files are and which bytes they hold: path containment and hashing.
 * Private to the adapter loader (adapter.c, adapter_files.c); it never resolves a path outside the adapters root and never parses a file. */
#ifndef DEVIO_ADAPTER_FILES_H
#define DEVIO_ADAPTER_FILES_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "device/devio.h"

#define DEVIO_ADAPTER_CONFIG_NAME "adapter_config.json"
#define DEVIO_ADAPTER_WEIGHTS_NAME "adapter_model.safetensors"

/* Resolved, contained paths of one adapter directory; all three owned,
 * released with devio_adapter_paths_free(). */
typedef struct devio_adapter_paths {
    char *dir;
    char *config;  /* NULL unless asked for */
    char *weights;
} devio_adapter_paths;

/* Who a file is, to notice it being replaced between hashing and mapping. */
typedef struct devio_file_id {
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
} devio_file_id;

/* Resolves root/rel to a contained directory and its weights file (and
 * config file when want_config). Natively root, directory and files all go
 * through realpath(), so symlinks and ".." are judged by where they lead;
 * WASI checks rel lexically and relies on the preopen sandbox. The rules and
 * statuses are those of devio_adapter_load (adapter.h). On failure *P is
 * empty and holds nothing. */
devio_status devio_adapter_paths_resolve(const char *root, const char *rel, bool want_config,
                                         devio_adapter_paths *P, devio_error *err);

/* Frees the three paths and empties *P. */
void devio_adapter_paths_free(devio_adapter_paths *P);

/* Streams `path` through SHA-256 without holding it in memory: lower-case
 * hex digest and byte size, and the file's identity when id is not NULL.
 * `label` names the file in errors. DEVIO_E_IO, DEVIO_E_NOMEM. */
devio_status devio_adapter_hash_file(const char *path, const char *label, char hex[65],
                                     uint64_t *size, devio_file_id *id, devio_error *err);

/* DEVIO_OK when `path` is still the file `before` describes; DEVIO_E_IO
 * (naming `label`) when it cannot be looked at or was replaced. */
devio_status devio_adapter_file_unchanged(const char *path, const char *label,
                                          const devio_file_id *before, devio_error *err);

#endif

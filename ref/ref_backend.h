/* ref_backend.h - the reference backend's vtable: the definition of every number, built into every binary.
 * Callers reach it through a registry or devio_open, never through its slots. */
#ifndef DEVIO_REF_BACKEND_H
#define DEVIO_REF_BACKEND_H

#include "device/backend/backend.h"

extern const devio_backend_ops devio_ref_backend;

#endif

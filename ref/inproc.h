/* inproc.h - a script target that calls a device in this process.
 * Borrowed device; the target owns nothing. */
#ifndef DEVIO_INPROC_H
#define DEVIO_INPROC_H

#include "api/script.h"
#include "device/devio.h"

/* Fill t so that it drives `d` (borrowed, must outlive t). */
void devio_inproc_target(devio_device *d, devio_script_target *t);

#endif

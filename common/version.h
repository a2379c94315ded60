/* version.h - the one version string of every devio binary and of /v1/device.
 * Bumped by hand with each release; nothing else may spell a version. */
#ifndef DEVIO_VERSION_H
#define DEVIO_VERSION_H

#define DEVIO_VERSION "0.2.0"

#endif

/* path.h - joining a directory and a file name.
 * The result is the caller's, released with free(). */
#ifndef DEVIO_PATH_H
#define DEVIO_PATH_H

/* "DIR/NAME" in a fresh allocation; NULL when out of memory. */
char *devio_path_join(const char *dir, const char *name);

#endif

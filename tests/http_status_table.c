/* http_status_table.c - prints service/http/http_error.c's mapping as one JSON object, for
 * tests/python/status_table_check.py to compare with api/openapi.yaml. It must never hold a
 * mapping of its own: every number printed comes from devio_http_code. */
#include <stdio.h>

#include "device/devio.h"
#include "service/http/http_error.h"

int main(void)
{
    printf("{\"statuses\":{");
    for (int s = 0; s < DEVIO_STATUS_COUNT; s++)
        printf("%s\"%s\":%u", s ? "," : "", devio_status_str((devio_status)s),
               devio_http_code((devio_status)s));
    printf("},\"out_of_range\":%u}\n", devio_http_code(DEVIO_STATUS_COUNT));
    return fflush(stdout) == 0 ? 0 : 1;
}

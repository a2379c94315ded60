/* route_match.c - the one matcher of the route table: path templates with {id} and {name} against request paths.
 * Pure string work; it must never allocate, and never match a path the template does not spell. */
#include <string.h>

#include "service/http/route_match.h"

bool devio_route_parse_id(const char *p, size_t n, uint64_t *out)
{
    if (n == 0 || n > 19)
        return false;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9')
            return false;
        v = v * 10 + (uint64_t)(p[i] - '0');
    }
    if (v > (uint64_t)INT64_MAX)
        return false;
    *out = v;
    return true;
}

/* The next '/'-separated segment at *p (empty segments skipped); false at the end. */
static bool next_segment(const char **p, const char **seg, size_t *len)
{
    while (**p == '/')
        (*p)++;
    if (!**p)
        return false;
    *seg = *p;
    *len = strcspn(*p, "/");
    *p += *len;
    return true;
}

static bool is(const char *seg, size_t len, const char *lit)
{
    return strlen(lit) == len && memcmp(seg, lit, len) == 0;
}

bool devio_route_path_match(const char *tmpl, const char *url, devio_route_params *p)
{
    devio_route_params got = {0};
    const char *t = tmpl, *u = url, *ts, *us;
    size_t tl, ul;
    while (next_segment(&t, &ts, &tl)) {
        if (!next_segment(&u, &us, &ul))
            return false;
        if (is(ts, tl, "{id}")) {
            /* Any segment takes the {id} place, so that "/v1/sequences/1x" is a
             * bad id on a known route rather than no route at all. */
            got.id_text = us;
            got.id_len = ul;
            got.id_bad = !devio_route_parse_id(us, ul, &got.id);
        } else if (is(ts, tl, "{name}")) {
            got.name = us;
            got.name_len = ul;
        } else if (tl != ul || memcmp(ts, us, ul) != 0) {
            return false;
        }
    }
    if (next_segment(&u, &us, &ul))
        return false;
    *p = got;
    return true;
}

const devio_route *devio_route_find(const devio_route *table, size_t n, const char *method,
                                    const char *url, devio_route_params *p,
                                    const devio_route **on_path)
{
    *on_path = NULL;
    for (size_t i = 0; i < n; i++) {
        devio_route_params got;
        if (!devio_route_path_match(table[i].path, url, &got))
            continue;
        if (!*on_path)
            *on_path = &table[i];
        if (strcmp(table[i].method, method) == 0) {
            *p = got;
            return &table[i];
        }
    }
    return NULL;
}

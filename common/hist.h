/* hist.h - a histogram over fixed upper bounds, the shape Prometheus exports
 * (service/metrics/metrics.c renders it; the store times its commits with one).
 * Plain data: no locking (the owner's lock guards it), no allocation. */
#ifndef DEVIO_HIST_H
#define DEVIO_HIST_H

#include <stdint.h>

#define DEVIO_HIST_MAX 16 /* upper bounds a histogram may have (+Inf not counted) */

/* Counts are per bucket (made cumulative when rendered); bucket[n_le]
 * counts values above every bound. */
typedef struct devio_hist {
    const double *le; /* static, ascending; borrowed */
    uint32_t n_le;    /* <= DEVIO_HIST_MAX */
    uint64_t bucket[DEVIO_HIST_MAX + 1];
    double sum;
    uint64_t count;
} devio_hist;

/* A histogram over the static bounds le[0..n_le-1], all counts 0. */
devio_hist devio_hist_make(const double *le, uint32_t n_le);
/* Count v in the first bucket whose bound is >= v (Prometheus's le). */
void devio_hist_observe(devio_hist *h, double v);

#endif

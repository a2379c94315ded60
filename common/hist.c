/* hist.c - fixed-bound histograms (hist.h). */
#include "common/hist.h"

devio_hist devio_hist_make(const double *le, uint32_t n_le)
{
    return (devio_hist){.le = le, .n_le = n_le < DEVIO_HIST_MAX ? n_le : DEVIO_HIST_MAX};
}

void devio_hist_observe(devio_hist *h, double v)
{
    uint32_t b = 0;
    while (b < h->n_le && v > h->le[b])
        b++;
    h->bucket[b]++;
    h->sum += v;
    h->count++;
}

/* inproc.c - the in-process script target: dispatch + direct logits reads.
 * The same dispatch the server uses; it never encodes anything itself. */
#include <stdlib.h>

#include "api/dispatch.h"
#include "device/model.h"
#include "device/status.h"
#include "ref/inproc.h"

static devio_status inproc_call(void *ctx, const char *op, const json_t *body, json_t **result,
                                devio_error *err)
{
    return devio_api_call(ctx, op, body, result, err);
}

static devio_status inproc_logits(void *ctx, uint64_t id, float **data, uint32_t *n_rows,
                                  uint32_t *vocab, devio_error *err)
{
    devio_device *d = ctx;
    uint32_t rows = 0;
    *data = NULL;
    devio_status s = devio_logits_read(d, id, 0, 0, NULL, &rows, err);
    if (s != DEVIO_OK)
        return s;
    uint32_t v = devio_model_of(d)->cfg.vocab_size;
    float *buf = malloc((size_t)rows * v * sizeof *buf + 1);
    if (!buf)
        return devio_fail(err, DEVIO_E_NOMEM, "out of memory reading logits");
    s = devio_logits_read(d, id, 0, rows, buf, &rows, err);
    if (s != DEVIO_OK) {
        free(buf);
        return s;
    }
    *data = buf;
    *n_rows = rows;
    *vocab = v;
    return DEVIO_OK;
}

void devio_inproc_target(devio_device *d, devio_script_target *t)
{
    t->ctx = d;
    t->call = inproc_call;
    t->logits = inproc_logits;
}

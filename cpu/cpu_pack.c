/* cpu_pack.c - the cpu backend's weights packed once at load (ref/ref_gemm.h's ref_panels_pack and
 * ref_panels_free, built in place of the reference's in every path, cpu/isa.bzl): a quantized
 * weight's quants kept unsigned in the bits its type has, its scales and offsets as binary16,
 * in the places cpu/cpu_layout.h gives them; cpu/cpu_gemm.c multiplies by them. Any other
 * weight, or one whose scales do not fit binary16, is packed by the reference's own
 * (cpu_strict.h). Ownership: as cpu_gemm.c says of a packed weight. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_layout.h"
#include "cpu/cpu_strict.h"
#include "device/model/model.h"
#include "device/numerics/numerics.h"
#include "device/numerics/quant.h"
#include "ref/pool.h"
#include "ref/ref_gemm.h"

typedef struct pack_job {
    ref_panels *p;
    const void *w;
    uint32_t rows_per_job;
    int *overflow; /* set by any job that met a scale past binary16 */
} pack_job;

/* x as binary16; false when it is not finite there. */
static bool put_half(uint16_t *dst, float x)
{
    *dst = devio_f32_to_f16_rne(x);
    return (*dst & 0x7c00u) != 0x7c00u;
}

static void pack_rows(void *ctx, uint32_t job, uint32_t thread)
{
    (void)thread;
    const pack_job *j = ctx;
    ref_panels *p = j->p;
    uint32_t t = devio_dtype_ggml(p->dtype), blk = devio_quant_block(t), gs = p->qgroups;
    uint32_t sn = sweep_scales_n(p);
    pack_kind kind = kind_of(p->dtype);
    int shift = quant_shift(p->dtype);
    size_t src_bytes = (size_t)devio_dtype_row_bytes(p->dtype, p->n);
    uint32_t o1 = (job + 1) * j->rows_per_job < p->m ? (job + 1) * j->rows_per_job : p->m;
    bool ok = true;
    /* A half tail is packed whole here, then its kept bytes moved to their places. */
    const bool ht = half_tail(p);
    const uint32_t last = sweeps_of(p) - 1u;
    uint8_t tail[SWEEP];
    for (uint32_t o = job * j->rows_per_job; o < o1; o++) {
        memset(tail, 0, sizeof tail);
        for (uint32_t k0 = 0; k0 < p->n; k0 += blk) {
            int8_t q[256];
            float S[16], M[16] = {0};
            devio_quant_split(t, (const uint8_t *)j->w + o * src_bytes +
                                     k0 / blk * devio_quant_block_bytes(t), q, S, M);
            for (uint32_t g = 0; g < blk / gs; g++) {
                uint32_t k = k0 + g * gs;
                ok = put_half(halves_at(p, p->qscale, sn, o, k / SWEEP) + k % SWEEP / gs, S[g]) &&
                     ok;
                if (p->qoffset)
                    ok = put_half(halves_at(p, p->qoffset, SWEEP_OFFSETS, o, k / SWEEP) +
                                      k % SWEEP / 32u,
                                  M[g]) &&
                         ok;
            }
            /* Each element at its place in its sweep (quant_pos). */
            uint8_t *dst = NULL;
            for (uint32_t i = 0; i < blk && k0 + i < p->n; i++) {
                uint32_t k = k0 + i, at = quant_pos(kind, k % SWEEP);
                if (i == 0 || k % SWEEP == 0)
                    dst = ht && k / SWEEP == last ? tail : quants_at(p, o, k / SWEEP);
                int u = q[i] + shift;
                if (kind == PK_I8)
                    dst[at] = (uint8_t)q[i];
                else
                    dst[at % 64u] |= (uint8_t)((u & 15) << (at >= 64u ? 4 : 0));
                if (kind == PK_FIVE)
                    dst[high5_byte(at)] |= (uint8_t)(((u >> 4) & 1) << high5_bit(at));
                if (kind == PK_SIX)
                    dst[high6_byte(at)] |= (uint8_t)(((u >> 4) & 3) << high6_bit(at));
            }
        }
        for (uint32_t b = 0; ht && b < sweep_bytes(p); b++)
            if (tail_byte(kind, b) >= 0)
                quants_at(p, o, last)[tail_byte(kind, b)] = tail[b];
    }
    if (!ok)
        __atomic_store_n(j->overflow, 1, __ATOMIC_RELAXED);
}

int ref_panels_pack(ref_panels *p, devio_pool *pool, const void *w, devio_dtype dt, uint32_t m,
                    uint32_t n)
{
    if (!devio_dtype_quantized(dt))
        return ref_strict_panels_pack(p, pool, w, dt, m, n);
    memset(p, 0, sizeof *p);
    uint32_t t = devio_dtype_ggml(dt), width = width_of(n), gs = devio_quant_group(t);
    bool offsets = devio_quant_has_offset(t);
    *p = (ref_panels){.dtype = dt, .m = m, .n = n, .k32 = width / 32u, .qgroups = gs};
    /* Rows in whole fours: the last four's missing rows are zeros. */
    size_t rows = (size_t)(m + 3u) / 4u * 4u, sweeps = sweeps_of(p);
    size_t qbytes = rows * row_quant_bytes(p);
    size_t sc_floats = (rows * sweeps * sweep_scales_n(p) + 1u) / 2u; /* binary16 pairs */
    size_t of_floats = rows * sweeps * SWEEP_OFFSETS / 2u;
    if (posix_memalign(&p->data, 64, qbytes ? qbytes : 64) != 0) {
        p->data = NULL;
        return -1;
    }
    memset(p->data, 0, qbytes);
    p->qscale = calloc(sc_floats ? sc_floats : 1, sizeof(float));
    p->qoffset = offsets ? calloc(of_floats ? of_floats : 1, sizeof(float)) : NULL;
    if (!p->qscale || (offsets && !p->qoffset)) {
        ref_panels_free(p);
        return -1;
    }
    p->bytes = qbytes + (sc_floats + (p->qoffset ? of_floats : 0u)) * sizeof(float);
    int overflow = 0;
    pack_job j = {.p = p, .w = w, .rows_per_job = 64, .overflow = &overflow};
    devio_pool_run(pool, (m + j.rows_per_job - 1) / j.rows_per_job, pack_rows, &j);
    if (!overflow)
        return 0;
    /* A scale past binary16's range: this weight keeps the reference's form. */
    ref_panels_free(p);
    return ref_strict_panels_pack(p, pool, w, dt, m, n);
}

void ref_panels_free(ref_panels *p)
{
    ref_strict_panels_free(p); /* the same three buffers, whoever packed them */
}


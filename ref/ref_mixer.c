/* ref_mixer.c - conv, recurrence and gated norm of the Mamba-2 mixer (numspec rule 10) for the reference backend.
 * Every job runs its tokens in position order and writes only its own channels, heads or tokens. */
#include "ref/ref_mixer.h"

#include <string.h>

#include "device/numerics/numerics.h"
#include "ref/ref_kernels.h"

/* Channels of the conv per job. */
#define CONV_CHANNELS 64u

/* Eight lanes of the 32 of the lane rule; GCC and clang split it into
 * whatever vectors the target has. Lane-wise + and * are the scalar
 * operations, so the numbers do not depend on the width. */
typedef float v8 __attribute__((vector_size(32)));
typedef float v8_mem __attribute__((vector_size(32), aligned(4), may_alias));

static inline v8 ld8(const float *p) { return *(const v8_mem *)p; }
static inline void st8(float *p, v8 v) { *(v8_mem *)p = v; }

/* lane_dot(w, u, K) for K <= 32, exactly: lane l < K holds +0 + w[l]*u[l]
 * and the others +0; a fold step whose partner lane is still +0 leaves a
 * lane as it is (a lane is never -0), so only steps between lanes that
 * hold terms are done. */
static float conv_dot(const float *w, const float *u, uint32_t K)
{
    float p[32];
    for (uint32_t l = 0; l < K; l++)
        p[l] = 0.0f + w[l] * u[l];
    uint32_t live = K;
    for (uint32_t step = 16; step >= 1; step >>= 1) {
        for (uint32_t l = 0; l < step && l + step < live; l++)
            p[l] = p[l] + p[l + step];
        live = live < step ? live : step;
    }
    return p[0];
}

/* The state of row r's slot for this layer, and where snapshot i of the
 * row goes (END: its only one), both at this layer's offset. */
static float *slot_of(const ref_mixer *m, const devio_batch_row *row)
{
    return m->slots + (size_t)row->ssm_slot * m->shape->slot_floats + m->layer_off;
}

static float *snap_of(const ref_mixer *m, const devio_batch_row *row, uint32_t i)
{
    return m->snaps + (size_t)row->snap_slots[i] * m->shape->slot_floats + m->layer_off;
}

/* Whether the state after token i of the row is snapshotted, and where. */
static int snap_index(const devio_batch_row *row, uint32_t i)
{
    if (row->snapshot == DEVIO_SNAP_EACH)
        return (int)i;
    if (row->snapshot == DEVIO_SNAP_END && i + 1 == row->n_tokens)
        return 0;
    return -1;
}

/* Job (row, block of channels): the causal conv, token by token. */
static void conv_job(void *ctx, uint32_t job, uint32_t thread)
{
    (void)thread;
    const ref_mixer *m = ctx;
    const devio_model_shape *s = m->shape;
    uint32_t per_row = (s->conv_dim + CONV_CHANNELS - 1) / CONV_CHANNELS;
    const devio_batch_row *row = &m->batch->rows[job / per_row];
    uint32_t c0 = (job % per_row) * CONV_CHANNELS;
    uint32_t c1 = c0 + CONV_CHANNELS < s->conv_dim ? c0 + CONV_CHANNELS : s->conv_dim;
    uint32_t K = s->ssm_conv, W = K - 1;
    float *win = slot_of(m, row);
    float u[64];
    for (uint32_t i = 0; i < row->n_tokens; i++) {
        size_t t = row->tok_start + i;
        const float *xbc = m->zx + t * m->ldzx + s->ssm_inner;
        float *out = m->xa + t * m->ldxa;
        for (uint32_t c = c0; c < c1; c++) {
            float *wc = win + (size_t)c * W;
            memcpy(u, wc, W * sizeof(float));
            u[W] = xbc[c];
            const float *wc_ = m->w->conv_w + (size_t)c * K;
            float dot = K <= 32 ? conv_dot(wc_, u, K) : ref_lane_dot(wc_, u, K);
            float v = dot + m->w->conv_b[c];
            out[c] = devio_siluf(v);
            memcpy(wc, u + 1, W * sizeof(float));
        }
        int si = snap_index(row, i);
        if (si >= 0)
            memcpy(snap_of(m, row, (uint32_t)si) + (size_t)c0 * W, win + (size_t)c0 * W,
                   (size_t)(c1 - c0) * W * sizeof(float));
    }
}

/* One row of S: S[n] = S[n] * da + db[n] * xp, then lane_dot(S, C, N),
 * accumulated in the 32 lanes as S is written (lane n mod 32, increasing
 * n, from +0), folded by the rule. */
static float state_row(float *S, const float *db, const float *C, float da, float xp, uint32_t N)
{
    v8 acc[4] = {{0}, {0}, {0}, {0}};
    v8 vda = {da, da, da, da, da, da, da, da}, vxp = {xp, xp, xp, xp, xp, xp, xp, xp};
    uint32_t n = 0;
    for (; n + 32 <= N; n += 32)
        for (int v = 0; v < 4; v++) {
            size_t k = n + (uint32_t)v * 8;
            v8 s = ld8(S + k) * vda + ld8(db + k) * vxp;
            st8(S + k, s);
            acc[v] = acc[v] + s * ld8(C + k);
        }
    float p[32];
    for (int v = 0; v < 4; v++)
        st8(p + v * 8, acc[v]);
    for (; n < N; n++) {
        S[n] = S[n] * da + db[n] * xp;
        p[n % 32] = p[n % 32] + S[n] * C[n];
    }
    return devio_lane_fold(p);
}

/* Job (row, head): the selective-state recurrence, token by token. */
static void scan_job(void *ctx, uint32_t job, uint32_t thread)
{
    const ref_mixer *m = ctx;
    const devio_model_shape *s = m->shape;
    uint32_t H = s->ssm_heads, P = s->ssm_head_dim, N = s->ssm_state, I = s->ssm_inner;
    const devio_batch_row *row = &m->batch->rows[job / H];
    uint32_t h = job % H, g = h / (H / s->ssm_groups);
    size_t conv_floats = (size_t)s->conv_dim * (s->ssm_conv - 1);
    size_t head_floats = (size_t)P * N;
    float *S = slot_of(m, row) + conv_floats + h * head_floats;
    float *db = m->tmp + (size_t)thread * N;
    float a = m->w->a[h], dbias = m->w->dt_bias[h], dskip = m->w->d_skip[h];
    for (uint32_t i = 0; i < row->n_tokens; i++) {
        size_t t = row->tok_start + i;
        const float *xa = m->xa + t * m->ldxa;
        const float *B = xa + I + (size_t)g * N;
        const float *C = xa + I + (size_t)s->ssm_groups * N + (size_t)g * N;
        float dt = devio_softplusf(m->zx[t * m->ldzx + I + s->conv_dim + h] + dbias);
        dt = dt < s->dt_min ? s->dt_min : dt;
        dt = dt > s->dt_max ? s->dt_max : dt;
        float da = devio_expf(dt * a);
        for (uint32_t n = 0; n < N; n++)
            db[n] = dt * B[n];
        float *y = m->y + t * m->ldy + (size_t)h * P;
        for (uint32_t p = 0; p < P; p++) {
            float xp = xa[(size_t)h * P + p];
            y[p] = state_row(S + (size_t)p * N, db, C, da, xp, N) + dskip * xp;
        }
        int si = snap_index(row, i);
        if (si >= 0)
            memcpy(snap_of(m, row, (uint32_t)si) + conv_floats + h * head_floats, S,
                   head_floats * sizeof(float));
    }
}

/* Job (token): the gate, then the norm over each group of channels. */
static void norm_job(void *ctx, uint32_t t, uint32_t thread)
{
    (void)thread;
    const ref_mixer *m = ctx;
    const devio_model_shape *s = m->shape;
    uint32_t I = s->ssm_inner, gs = I / s->ssm_groups;
    const float *z = m->zx + (size_t)t * m->ldzx;
    float *y = m->y + (size_t)t * m->ldy;
    for (uint32_t i = 0; i < I; i++)
        y[i] = y[i] * devio_siluf(z[i]);
    for (uint32_t g = 0; g < s->ssm_groups; g++) {
        float *q = y + (size_t)g * gs;
        float ss = ref_lane_dot(q, q, gs);
        float r = devio_rsqrtf(ss / (float)gs + s->ssm_eps);
        const float *w = m->w->norm + (size_t)g * gs;
        for (uint32_t i = 0; i < gs; i++)
            q[i] = w[i] * (q[i] * r);
    }
}

void ref_mixer_run(devio_pool *pool, const ref_mixer *m)
{
    const devio_model_shape *s = m->shape;
    uint32_t rows = m->batch->n_rows;
    uint32_t per_row = (s->conv_dim + CONV_CHANNELS - 1) / CONV_CHANNELS;
    devio_pool_run(pool, rows * per_row, conv_job, (void *)m);
    devio_pool_run(pool, rows * s->ssm_heads, scan_job, (void *)m);
    devio_pool_run(pool, m->batch->n_tokens, norm_job, (void *)m);
}

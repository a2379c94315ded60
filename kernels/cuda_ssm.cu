/* cuda_ssm.cu - the kernels of cuda_ssm.h: numspec rule 10 (the Mamba-2
 * mixer between its projections) on a GPU. Every reduction follows the
 * 32-lane rule: the conv's K-tap dot is the rule written out for one thread
 * (K <= 32 terms, one per lane, then the tree), the scan's N-state dot and
 * the gated norm's sum of squares are a warp's lanes and fold(). Every float
 * operation is one of numerics.h's DEVIO_ADD/SUB/MUL/DIV or functions (the
 * _rn intrinsics, never contracted into FMA), as in cuda_kernels.cu. A row's
 * tokens always run in position order inside one thread or warp, so no
 * number depends on how a sequence was split into steps. */
#include <cuda_runtime.h>
#include <stdint.h>

#include "device/numerics/numerics.h"
#include "kernels/cuda_ssm.h"
#include "kernels/cuda_warp.cuh"

#define CONV_THREADS 128 /* channels per block of the conv */
#define SCAN_WARPS 4     /* channels (one per warp) per block of the scan */
#define NORM_WARPS 8     /* (token, group) pairs per block of the gated norm */

/* One slot's (or snapshot's) floats of this layer, from `off` on. */
__device__ __forceinline__ float *slot_at(const cuda_ssm &m, uint32_t index, size_t off)
{
    return m.state + (size_t)index * m.slot_floats + m.layer_off + off;
}

/* ---- the conv ------------------------------------------------------------- */

/* lane_dot(w, u, K) for K <= KM <= 32: lane l < K holds +0 + w[l] * u[l],
 * the other lanes +0, then the definition's tree over all 32 lanes. */
template <int KM>
__device__ __forceinline__ float lane_dot_taps(const float *w, const float *u, uint32_t K)
{
    float p[32];
#pragma unroll
    for (int l = 0; l < 32; l++)
        p[l] = 0.0f;
#pragma unroll
    for (int l = 0; l < KM; l++)
        if ((uint32_t)l < K)
            p[l] = DEVIO_ADD(p[l], DEVIO_MUL(w[l], u[l]));
#pragma unroll
    for (int s = 16; s >= 1; s >>= 1)
#pragma unroll
        for (int l = 0; l < s; l++)
            p[l] = DEVIO_ADD(p[l], p[l + s]);
    return p[0];
}

/* The window u[0, K-1) into dst. */
template <int KM>
__device__ __forceinline__ void window_store(float *dst, const float *u, uint32_t K)
{
#pragma unroll
    for (int j = 0; j < KM; j++)
        if ((uint32_t)j + 1 < K)
            dst[j] = u[j];
}

/* Channel c of a row before its first token: w its taps, u its window W[c][0..K-2] (zeros
 * for a fresh row), u[K-1] free. */
template <int KM>
__device__ __forceinline__ void conv_load(const cuda_ssm &m, const cuda_ssm_row &row, uint32_t c,
                                          float *w, float *u)
{
    const float *slot = slot_at(m, row.slot, (size_t)c * (m.K - 1));
#pragma unroll
    for (int j = 0; j < KM; j++) {
        w[j] = (uint32_t)j < m.K ? m.conv_w[(size_t)c * m.K + j] : 0.0f;
        u[j] = (uint32_t)j + 1 < m.K && !row.fresh ? slot[j] : 0.0f;
    }
}

/* Token t of channel c: xBC[c] into u[K-1], the activated output returned, then the window
 * moved by one. */
template <int KM>
__device__ __forceinline__ float conv_token(const cuda_ssm &m, uint32_t c, size_t t,
                                            const float *w, float *u)
{
    float in = m.zx[t * m.in_dim + m.I + c];
#pragma unroll
    for (int j = 0; j < KM; j++)
        if ((uint32_t)j + 1 == m.K)
            u[j] = in;
    float v = lane_dot_taps<KM>(w, u, m.K);
    if (m.conv_b)
        v = DEVIO_ADD(v, m.conv_b[c]);
#pragma unroll
    for (int j = 0; j + 1 < KM; j++)
        u[j] = u[j + 1];
    return devio_siluf(v);
}

/* Thread (row, channel c): u holds the window W[c][0..K-2] then the token's
 * xBC[c] in u[K-1]; after the token the window moves by one. Indices into u
 * and w are compile-time, so both stay in registers. */
template <int KM>
__global__ void __launch_bounds__(CONV_THREADS) k_conv(cuda_ssm m)
{
    uint32_t r = blockIdx.x, c = blockIdx.y * CONV_THREADS + threadIdx.x;
    if (c >= m.conv_dim)
        return;
    const cuda_ssm_row row = m.rows[r];
    uint32_t K = m.K;
    size_t off = (size_t)c * (K - 1);
    float *slot = slot_at(m, row.slot, off);
    float w[KM], u[KM];
    conv_load<KM>(m, row, c, w, u);
    for (uint32_t i = 0; i < row.n_tokens; i++) {
        size_t t = (size_t)row.tok_start + i;
        m.xa[t * m.conv_dim + c] = conv_token<KM>(m, c, t, w, u);
        if (row.snap_mode == CUDA_SNAP_EACH)
            window_store<KM>(slot_at(m, m.snaps[row.snap_off + i], off), u, K);
    }
    window_store<KM>(slot, u, K);
    if (row.snap_mode == CUDA_SNAP_END)
        window_store<KM>(slot_at(m, m.snaps[row.snap_off], off), u, K);
}

int cuda_ssm_conv(const cuda_ssm *m, void *stream)
{
    if (m->n_rows == 0)
        return 0;
    dim3 grid(m->n_rows, cuda_blocks_for(m->conv_dim, CONV_THREADS));
    cudaStream_t s = (cudaStream_t)stream;
    if (m->K <= 4)
        LAUNCH((k_conv<4>), grid, CONV_THREADS, 0, s, *m);
    else if (m->K <= 8)
        LAUNCH((k_conv<8>), grid, CONV_THREADS, 0, s, *m);
    else
        LAUNCH((k_conv<CUDA_SSM_MAX_CONV>), grid, CONV_THREADS, 0, s, *m);
    return cuda_launched();
}

/* ---- the scan ------------------------------------------------------------- */

/* The NL states of channel ch that lane `lane` holds (n = lane + 32 k) to dst. */
template <int NL>
__device__ __forceinline__ void states_store(float *dst, const float *s, uint32_t lane,
                                             uint32_t N)
{
#pragma unroll
    for (int k = 0; k < NL; k++)
        if (lane + 32u * k < N)
            dst[lane + 32u * k] = s[k];
}

/* Token t of the recurrence of channel ch (head h) in a warp: lane l's states s (n = l,
 * l + 32, ...) updated from B, C and the conv's output xp, y written by lane 0. */
template <int NL, class Q>
__device__ __forceinline__ void scan_token(const cuda_ssm &m, float *s, size_t t, uint32_t h,
                                           uint32_t ch, Q B, Q C, float xp)
{
    uint32_t lane = threadIdx.x & 31u;
    float A = -devio_expf(m.a_log[h]), D = m.d_skip[h];
    float dt = devio_softplusf(DEVIO_ADD(m.zx[t * m.in_dim + m.I + m.conv_dim + h], m.dt_bias[h]));
    dt = dt < m.dt_min ? m.dt_min : dt;
    dt = dt > m.dt_max ? m.dt_max : dt;
    float dA = devio_expf(DEVIO_MUL(dt, A)), acc = 0.0f;
#pragma unroll
    for (int k = 0; k < NL; k++) {
        uint32_t n = lane + 32u * k;
        if (n < m.N) {
            s[k] = DEVIO_ADD(DEVIO_MUL(s[k], dA), DEVIO_MUL(DEVIO_MUL(dt, B[n]), xp));
            acc = DEVIO_ADD(acc, DEVIO_MUL(s[k], C[n]));
        }
    }
    float dot = fold(acc);
    if (lane == 0)
        m.y[t * m.I + ch] = DEVIO_ADD(dot, DEVIO_MUL(D, xp));
}

/* Warp (row, head h, channel p): lane l holds S[h][p][n] for n = l, l+32,
 * ... < N in s[0], s[1], ...: exactly the terms the lane rule gives lane l,
 * added in increasing n. dt and dA are the same in every lane. */
template <int NL>
__global__ void __launch_bounds__(32 * SCAN_WARPS) k_scan(cuda_ssm m)
{
    uint32_t lane = threadIdx.x & 31u, r = blockIdx.x, h = blockIdx.y;
    uint32_t p = blockIdx.z * SCAN_WARPS + (threadIdx.x >> 5);
    if (p >= m.P)
        return; /* the whole warp: p is the same in every lane */
    const cuda_ssm_row row = m.rows[r];
    uint32_t N = m.N, g = h / (m.H / m.G), ch = h * m.P + p;
    size_t off = (size_t)m.conv_dim * (m.K - 1) + (size_t)ch * N;
    float *slot = slot_at(m, row.slot, off);
    float s[NL];
#pragma unroll
    for (int k = 0; k < NL; k++)
        s[k] = lane + 32u * k < N && !row.fresh ? slot[lane + 32u * k] : 0.0f;
    for (uint32_t i = 0; i < row.n_tokens; i++) {
        size_t t = (size_t)row.tok_start + i;
        const float *xa = m.xa + t * m.conv_dim;
        scan_token<NL>(m, s, t, h, ch, xa + m.I + (size_t)g * N, xa + m.I + (size_t)(m.G + g) * N,
                       xa[ch]);
        if (row.snap_mode == CUDA_SNAP_EACH)
            states_store<NL>(slot_at(m, m.snaps[row.snap_off + i], off), s, lane, N);
    }
    states_store<NL>(slot, s, lane, N);
    if (row.snap_mode == CUDA_SNAP_END)
        states_store<NL>(slot_at(m, m.snaps[row.snap_off], off), s, lane, N);
}

int cuda_ssm_scan(const cuda_ssm *m, void *stream)
{
    if (m->n_rows == 0)
        return 0;
    dim3 grid(m->n_rows, m->H, cuda_blocks_for(m->P, SCAN_WARPS));
    cudaStream_t s = (cudaStream_t)stream;
    if (m->N <= 32)
        LAUNCH((k_scan<1>), grid, 32 * SCAN_WARPS, 0, s, *m);
    else if (m->N <= 64)
        LAUNCH((k_scan<2>), grid, 32 * SCAN_WARPS, 0, s, *m);
    else if (m->N <= 128)
        LAUNCH((k_scan<4>), grid, 32 * SCAN_WARPS, 0, s, *m);
    else
        LAUNCH((k_scan<CUDA_SSM_MAX_STATE / 32>), grid, 32 * SCAN_WARPS, 0, s, *m);
    return cuda_launched();
}

/* ---- the conv and the scan as one kernel (decode steps) ------------------- */

/* Block (row, head h, channels p): the head's group's B and C first, every channel of them
 * (2N) by the block's threads into shared memory from its window as it stands, then each
 * warp its channel's x (lane 0 moving that window) and the recurrence as k_scan does for one
 * token (lane 0 computes x and broadcasts it). The B and C windows are the group's other
 * blocks' to read: they move later (bc_pending, k_gate_norm). */
template <int NL, int KM>
__global__ void __launch_bounds__(32 * SCAN_WARPS) k_conv_scan(cuda_ssm m)
{
    DEVIO_DYN_SHARED(float, bc);
    uint32_t lane = threadIdx.x & 31u, r = blockIdx.x, h = blockIdx.y;
    uint32_t p = blockIdx.z * SCAN_WARPS + (threadIdx.x >> 5);
    const cuda_ssm_row row = m.rows[r];
    uint32_t N = m.N, g = h / (m.H / m.G);
    size_t t = row.tok_start;
    float w[KM], u[KM];
    for (uint32_t k = threadIdx.x; k < 2 * N; k += blockDim.x) {
        uint32_t c = m.I + (k < N ? g * N + k : (m.G + g) * N + (k - N));
        conv_load<KM>(m, row, c, w, u);
        bc[k] = conv_token<KM>(m, c, t, w, u);
    }
    __syncthreads();
    if (p >= m.P)
        return; /* the whole warp, past the block's only barrier */
    uint32_t ch = h * m.P + p;
    float xp = 0.0f;
    if (lane == 0) { /* the window is read before the broadcast and moved after it */
        conv_load<KM>(m, row, ch, w, u);
        xp = conv_token<KM>(m, ch, t, w, u);
    }
    xp = __shfl_sync(FULL, xp, 0);
    if (lane == 0) {
        size_t woff = (size_t)ch * (m.K - 1);
        window_store<KM>(slot_at(m, row.slot, woff), u, m.K);
        if (row.snap_mode != CUDA_SNAP_NONE)
            window_store<KM>(slot_at(m, m.snaps[row.snap_off], woff), u, m.K);
    }
    size_t off = (size_t)m.conv_dim * (m.K - 1) + (size_t)ch * N;
    float *slot = slot_at(m, row.slot, off), s[NL];
#pragma unroll
    for (int k = 0; k < NL; k++)
        s[k] = lane + 32u * k < N && !row.fresh ? slot[lane + 32u * k] : 0.0f;
    scan_token<NL>(m, s, t, h, ch, bc + 0, bc + N, xp);
    states_store<NL>(slot, s, lane, N);
    if (row.snap_mode != CUDA_SNAP_NONE)
        states_store<NL>(slot_at(m, m.snaps[row.snap_off], off), s, lane, N);
}

template <int KM>
static void conv_scan(const cuda_ssm *m, cudaStream_t s)
{
    dim3 grid(m->n_rows, m->H, cuda_blocks_for(m->P, SCAN_WARPS));
    size_t smem = 2u * m->N * sizeof(float);
    if (m->N <= 32)
        LAUNCH((k_conv_scan<1, KM>), grid, 32 * SCAN_WARPS, smem, s, *m);
    else if (m->N <= 64)
        LAUNCH((k_conv_scan<2, KM>), grid, 32 * SCAN_WARPS, smem, s, *m);
    else if (m->N <= 128)
        LAUNCH((k_conv_scan<4, KM>), grid, 32 * SCAN_WARPS, smem, s, *m);
    else
        LAUNCH((k_conv_scan<CUDA_SSM_MAX_STATE / 32, KM>), grid, 32 * SCAN_WARPS, smem, s, *m);
}

int cuda_ssm_conv_scan(cuda_ssm *m, void *stream)
{
    m->bc_pending = 1;
    if (m->n_rows == 0)
        return 0;
    cudaStream_t s = (cudaStream_t)stream;
    if (m->K <= 4)
        conv_scan<4>(m, s);
    else if (m->K <= 8)
        conv_scan<8>(m, s);
    else
        conv_scan<CUDA_SSM_MAX_CONV>(m, s);
    return cuda_launched();
}

/* ---- the chunked scan (fast numerics) ------------------------------------- */

/* Chunk c of the step: its row r, its index k in the row, the row's chunk count, and, for a
 * row of more than one chunk, where its chunk k's state lies in the chunk states (rows of one
 * chunk keep none). Found by walking the rows: a step has few. */
struct chunk_at {
    uint32_t r, k, n, at;
};
__device__ inline uint32_t row_chunks(const cuda_ssm &m, uint32_t r)
{
    return (m.rows[r].n_tokens + CUDA_SSM_CHUNK - 1) / CUDA_SSM_CHUNK;
}
__device__ inline chunk_at chunk_of(const cuda_ssm &m, uint32_t c)
{
    uint32_t at = 0;
    for (uint32_t r = 0; r < m.n_rows; r++) {
        uint32_t n = row_chunks(m, r);
        if (c < n)
            return chunk_at{r, c, n, at + c};
        c -= n;
        at += n > 1 ? n : 0;
    }
    return chunk_at{0, 0, 0, 0};
}

/* The dt and dA of token t, head h (the same in every lane). */
__device__ inline void step_of(const cuda_ssm &m, size_t t, uint32_t h, float A, float dt_bias,
                               float *dt, float *dA)
{
    float v = devio_softplusf(DEVIO_ADD(m.zx[t * m.in_dim + m.I + m.conv_dim + h], dt_bias));
    v = v < m.dt_min ? m.dt_min : v;
    *dt = v > m.dt_max ? m.dt_max : v;
    *dA = devio_expf(DEVIO_MUL(*dt, A));
}

/* Phase 1, warp (chunk c, head h, channel p): the chunk's tokens from the row's state (chunk
 * 0) or from zero (the others), y as the sequential scan writes it (exact for chunk 0, the
 * part of the chunk's own tokens for the others) and lam[t][h] the product of dA over the
 * chunk up to t. The chunk's last state goes to the slot (a row of one chunk) or to cs. */
template <int NL>
__global__ void __launch_bounds__(32 * SCAN_WARPS) k_scan_local(cuda_ssm m, float *cs, float *lam)
{
    uint32_t lane = threadIdx.x & 31u, h = blockIdx.y;
    uint32_t p = blockIdx.z * SCAN_WARPS + (threadIdx.x >> 5);
    chunk_at c = chunk_of(m, blockIdx.x);
    if (p >= m.P || c.n == 0)
        return; /* the whole warp */
    const cuda_ssm_row row = m.rows[c.r];
    uint32_t N = m.N, g = h / (m.H / m.G), ch = h * m.P + p, t0 = row.tok_start + c.k * CUDA_SSM_CHUNK;
    uint32_t nt = row.n_tokens - c.k * CUDA_SSM_CHUNK;
    nt = nt < CUDA_SSM_CHUNK ? nt : CUDA_SSM_CHUNK;
    size_t off = (size_t)m.conv_dim * (m.K - 1) + (size_t)ch * N;
    float *slot = slot_at(m, row.slot, off), s[NL];
#pragma unroll
    for (int k = 0; k < NL; k++)
        s[k] = lane + 32u * k < N && !row.fresh && c.k == 0 ? slot[lane + 32u * k] : 0.0f;
    float A = -devio_expf(m.a_log[h]), dt_bias = m.dt_bias[h], D = m.d_skip[h], cum = 1.0f;
    for (uint32_t i = 0; i < nt; i++) {
        size_t t = (size_t)t0 + i;
        const float *xa = m.xa + t * m.conv_dim;
        const float *B = xa + m.I + (size_t)g * N, *C = xa + m.I + (size_t)(m.G + g) * N;
        float dt, dA, xp = xa[ch], acc = 0.0f;
        step_of(m, t, h, A, dt_bias, &dt, &dA);
        cum = cum * dA;
#pragma unroll
        for (int k = 0; k < NL; k++) {
            uint32_t n = lane + 32u * k;
            if (n < N) {
                s[k] = s[k] * dA + (dt * B[n]) * xp;
                acc = acc + s[k] * C[n];
            }
        }
        float dot = fold(acc);
        if (lane == 0) {
            m.y[t * m.I + ch] = dot + D * xp;
            if (p == 0)
                lam[t * m.H + h] = cum;
        }
    }
    if (c.n > 1) {
        states_store<NL>(cs + ((size_t)c.at * m.I + ch) * N, s, lane, N);
        return;
    }
    states_store<NL>(slot, s, lane, N);
    if (row.snap_mode == CUDA_SNAP_END)
        states_store<NL>(slot_at(m, m.snaps[row.snap_off], off), s, lane, N);
}

/* Phase 2, warp (row r, head h, channel p) of a row of more than one chunk: each chunk's last
 * state made whole, in order: S(k) = own(k) + lam(end of k) * S(k - 1), in place in cs; the
 * last one to the slot (and an END snapshot). */
template <int NL>
__global__ void __launch_bounds__(32 * SCAN_WARPS) k_scan_pass(cuda_ssm m, float *cs,
                                                               const float *lam)
{
    uint32_t lane = threadIdx.x & 31u, r = blockIdx.x, h = blockIdx.y;
    uint32_t p = blockIdx.z * SCAN_WARPS + (threadIdx.x >> 5);
    const cuda_ssm_row row = m.rows[r];
    uint32_t n = row_chunks(m, r), at = 0;
    if (p >= m.P || n < 2)
        return; /* the whole warp */
    for (uint32_t q = 0; q < r; q++)
        at += row_chunks(m, q) > 1 ? row_chunks(m, q) : 0;
    uint32_t N = m.N, ch = h * m.P + p;
    float prev[NL];
    float *st0 = cs + ((size_t)at * m.I + ch) * N;
#pragma unroll
    for (int k = 0; k < NL; k++)
        prev[k] = lane + 32u * k < N ? st0[lane + 32u * k] : 0.0f;
    for (uint32_t k = 1; k < n; k++) {
        uint32_t last = k * CUDA_SSM_CHUNK + CUDA_SSM_CHUNK - 1;
        last = last < row.n_tokens - 1 ? last : row.n_tokens - 1;
        float l = lam[((size_t)row.tok_start + last) * m.H + h];
        float *sk = cs + ((size_t)(at + k) * m.I + ch) * N;
#pragma unroll
        for (int j = 0; j < NL; j++)
            if (lane + 32u * j < N)
                prev[j] = sk[lane + 32u * j] + l * prev[j];
        states_store<NL>(sk, prev, lane, N);
    }
    size_t off = (size_t)m.conv_dim * (m.K - 1) + (size_t)ch * N;
    states_store<NL>(slot_at(m, row.slot, off), prev, lane, N);
    if (row.snap_mode == CUDA_SNAP_END)
        states_store<NL>(slot_at(m, m.snaps[row.snap_off], off), prev, lane, N);
}

/* Phase 3, warp (chunk c > 0 of a row, head h, channel p): what the state the chunk started
 * from adds, y[t] += lam[t][h] * (C_t . S(k - 1)). */
template <int NL>
__global__ void __launch_bounds__(32 * SCAN_WARPS) k_scan_fix(cuda_ssm m, const float *cs,
                                                              const float *lam)
{
    uint32_t lane = threadIdx.x & 31u, h = blockIdx.y;
    uint32_t p = blockIdx.z * SCAN_WARPS + (threadIdx.x >> 5);
    chunk_at c = chunk_of(m, blockIdx.x);
    if (p >= m.P || c.n < 2 || c.k == 0)
        return; /* the whole warp */
    const cuda_ssm_row row = m.rows[c.r];
    uint32_t N = m.N, g = h / (m.H / m.G), ch = h * m.P + p, t0 = row.tok_start + c.k * CUDA_SSM_CHUNK;
    uint32_t nt = row.n_tokens - c.k * CUDA_SSM_CHUNK;
    nt = nt < CUDA_SSM_CHUNK ? nt : CUDA_SSM_CHUNK;
    const float *s0 = cs + ((size_t)(c.at - 1) * m.I + ch) * N;
    float s[NL];
#pragma unroll
    for (int k = 0; k < NL; k++)
        s[k] = lane + 32u * k < N ? s0[lane + 32u * k] : 0.0f;
    for (uint32_t i = 0; i < nt; i++) {
        size_t t = (size_t)t0 + i;
        const float *C = m.xa + t * m.conv_dim + m.I + (size_t)(m.G + g) * N;
        float acc = 0.0f;
#pragma unroll
        for (int k = 0; k < NL; k++)
            if (lane + 32u * k < N)
                acc = acc + s[k] * C[lane + 32u * k];
        float dot = fold(acc);
        if (lane == 0)
            m.y[t * m.I + ch] = m.y[t * m.I + ch] + lam[t * m.H + h] * dot;
    }
}

template <int NL>
static void scan_chunked(const cuda_ssm *m, uint32_t chunks, float *cs, float *lam,
                         cudaStream_t s)
{
    dim3 by_chunk(chunks, m->H, cuda_blocks_for(m->P, SCAN_WARPS));
    dim3 by_row(m->n_rows, m->H, cuda_blocks_for(m->P, SCAN_WARPS));
    LAUNCH((k_scan_local<NL>), by_chunk, 32 * SCAN_WARPS, 0, s, *m, cs, lam);
    if (chunks > m->n_rows) { /* some row has more than one chunk */
        LAUNCH((k_scan_pass<NL>), by_row, 32 * SCAN_WARPS, 0, s, *m, cs, lam);
        LAUNCH((k_scan_fix<NL>), by_chunk, 32 * SCAN_WARPS, 0, s, *m, cs, lam);
    }
}

int cuda_ssm_scan_chunked(const cuda_ssm *m, uint32_t chunks, float *cs, float *lam,
                          void *stream)
{
    if (m->n_rows == 0)
        return 0;
    cudaStream_t s = (cudaStream_t)stream;
    if (m->N <= 32)
        scan_chunked<1>(m, chunks, cs, lam, s);
    else if (m->N <= 64)
        scan_chunked<2>(m, chunks, cs, lam, s);
    else if (m->N <= 128)
        scan_chunked<4>(m, chunks, cs, lam, s);
    else
        scan_chunked<CUDA_SSM_MAX_STATE / 32>(m, chunks, cs, lam, s);
    return cuda_launched();
}

/* ---- gate and gated norm -------------------------------------------------- */

/* When m.bc_pending, first the B and C windows cuda_ssm_conv_scan left: every (row, channel)
 * of them by the grid's threads, the window moved by the row's one token (its xBC) into the
 * slot and the snapshot. Then warp (token t, group g) over gs = I / G channels: q = y * silu(z)
 * stored in place, ss = lane_dot(q, q, gs), then y = norm_w * (q * r). */
__global__ void __launch_bounds__(32 * NORM_WARPS) k_gate_norm(cuda_ssm m, uint32_t n_tok)
{
    uint64_t n_bc = m.bc_pending ? (uint64_t)m.n_rows * 2u * m.G * m.N : 0u;
    for (uint64_t k = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; k < n_bc;
         k += (uint64_t)gridDim.x * blockDim.x) {
        const cuda_ssm_row row = m.rows[k / (2u * m.G * m.N)];
        uint32_t c = m.I + (uint32_t)(k % (2u * m.G * m.N)), K = m.K;
        size_t off = (size_t)c * (K - 1);
        float *slot = slot_at(m, row.slot, off);
        float in = m.zx[(size_t)row.tok_start * m.in_dim + m.I + c], v[CUDA_SSM_MAX_CONV];
        for (uint32_t j = 0; j + 1 < K; j++) /* the window after the token, read before written */
            v[j] = j + 2 < K ? (row.fresh ? 0.0f : slot[j + 1]) : in;
        for (uint32_t j = 0; j + 1 < K; j++) {
            slot[j] = v[j];
            if (row.snap_mode != CUDA_SNAP_NONE)
                slot_at(m, m.snaps[row.snap_off], off)[j] = v[j];
        }
    }
    uint32_t lane = threadIdx.x & 31u;
    uint64_t wid = (uint64_t)blockIdx.x * NORM_WARPS + (threadIdx.x >> 5);
    if (wid >= (uint64_t)n_tok * m.G)
        return; /* the whole warp */
    uint32_t t = (uint32_t)(wid / m.G), g = (uint32_t)(wid % m.G), gs = m.I / m.G;
    float *y = m.y + (size_t)t * m.I + (size_t)g * gs;
    const float *z = m.zx + (size_t)t * m.in_dim + (size_t)g * gs;
    const float *w = m.norm + (size_t)g * gs;
    float p = 0.0f;
    for (uint32_t i = lane; i < gs; i += 32) {
        float q = DEVIO_MUL(y[i], devio_siluf(z[i]));
        y[i] = q;
        p = DEVIO_ADD(p, DEVIO_MUL(q, q));
    }
    float ss = fold_all(p);
    float r = devio_rsqrtf(DEVIO_ADD(DEVIO_DIV(ss, (float)gs), m.eps));
    for (uint32_t i = lane; i < gs; i += 32)
        y[i] = DEVIO_MUL(w[i], DEVIO_MUL(y[i], r));
}

int cuda_ssm_gate_norm(const cuda_ssm *m, uint32_t n_tok, void *stream)
{
    if (n_tok == 0)
        return 0;
    uint64_t warps = (uint64_t)n_tok * m->G;
    uint64_t bc = m->bc_pending ? (uint64_t)m->n_rows * 2u * m->G * m->N : 0; /* windows */
    uint32_t grid = cuda_blocks_for(warps > bc / 32 ? warps : (bc + 31) / 32, NORM_WARPS);
    LAUNCH((k_gate_norm), grid, 32 * NORM_WARPS, 0, (cudaStream_t)stream, *m, n_tok);
    return cuda_launched();
}

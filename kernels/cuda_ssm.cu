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

#include "device/numerics.h"
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
#pragma unroll
    for (int j = 0; j < KM; j++) {
        w[j] = (uint32_t)j < K ? m.conv_w[(size_t)c * K + j] : 0.0f;
        u[j] = (uint32_t)j + 1 < K && !row.fresh ? slot[j] : 0.0f;
    }
    float bias = m.conv_b ? m.conv_b[c] : 0.0f;
    for (uint32_t i = 0; i < row.n_tokens; i++) {
        size_t t = (size_t)row.tok_start + i;
        float in = m.zx[t * m.in_dim + m.I + c];
#pragma unroll
        for (int j = 0; j < KM; j++)
            if ((uint32_t)j + 1 == K)
                u[j] = in;
        float v = lane_dot_taps<KM>(w, u, K);
        if (m.conv_b)
            v = DEVIO_ADD(v, bias);
        m.xa[t * m.conv_dim + c] = devio_siluf(v);
#pragma unroll
        for (int j = 0; j + 1 < KM; j++)
            u[j] = u[j + 1];
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
    float A = -devio_expf(m.a_log[h]), dt_bias = m.dt_bias[h], D = m.d_skip[h];
    for (uint32_t i = 0; i < row.n_tokens; i++) {
        size_t t = (size_t)row.tok_start + i;
        const float *xa = m.xa + t * m.conv_dim;
        const float *B = xa + m.I + (size_t)g * N, *C = xa + m.I + (size_t)(m.G + g) * N;
        float dt = devio_softplusf(DEVIO_ADD(m.zx[t * m.in_dim + m.I + m.conv_dim + h], dt_bias));
        dt = dt < m.dt_min ? m.dt_min : dt;
        dt = dt > m.dt_max ? m.dt_max : dt;
        float dA = devio_expf(DEVIO_MUL(dt, A)), xp = xa[ch];
        float acc = 0.0f;
#pragma unroll
        for (int k = 0; k < NL; k++) {
            uint32_t n = lane + 32u * k;
            if (n < N) {
                s[k] = DEVIO_ADD(DEVIO_MUL(s[k], dA), DEVIO_MUL(DEVIO_MUL(dt, B[n]), xp));
                acc = DEVIO_ADD(acc, DEVIO_MUL(s[k], C[n]));
            }
        }
        float dot = fold(acc);
        if (lane == 0)
            m.y[t * m.I + ch] = DEVIO_ADD(dot, DEVIO_MUL(D, xp));
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

/* Warp (token t, group g) over gs = I / G channels: q = y * silu(z) stored
 * in place, ss = lane_dot(q, q, gs), then y = norm_w * (q * r). */
__global__ void __launch_bounds__(32 * NORM_WARPS) k_gate_norm(cuda_ssm m, uint32_t n_tok)
{
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
    uint32_t grid = cuda_blocks_for((uint64_t)n_tok * m->G, NORM_WARPS);
    LAUNCH((k_gate_norm), grid, 32 * NORM_WARPS, 0, (cudaStream_t)stream, *m, n_tok);
    return cuda_launched();
}

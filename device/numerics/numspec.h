/* numspec.h - the numeric specification of devio: the exact order of every
 * floating-point operation of a forward step, which every backend implements
 * bit for bit under strict numerics (the reference in ref/, CUDA in kernels/).
 * A definition only: it declares nothing and must never gain code that a
 * backend could call instead of following it. docs/numerics.md explains it.
 *
 * GROUND RULES
 *   - binary32 throughout. Every product is rounded before it is added (no
 *     fused multiply-add: -ffp-contract=off in C, __fmul_rn/__fadd_rn or
 *     -fmad=false in CUDA). No -ffast-math, no reassociation.
 *   - Transcendentals come from device/numerics/numerics.h (devio_expf, devio_logf,
 *     devio_sinf, devio_cosf, devio_siluf, devio_rsqrtf, devio_powf_pos),
 *     written with + - * /, sqrt and bit operations; never from a libm.
 *   - Widening: BF16 bits b -> f32 bits b << 16; F16 -> f32 exactly (IEEE
 *     half, subnormals and infinities; a NaN stays a NaN, whether a
 *     signalling NaN comes out quiet is left open, so NaN bits are
 *     canonicalised wherever numbers are compared); F32 as is.
 *   - Quantized weights (GGUF's Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K,
 *     Q6_K; device/numerics/quant.h gives each block's layout): an element's value is
 *     formed in binary32 from its block's f16 scales (widened exactly) and
 *     its small integer quant q (exact), one rounding per operation:
 *       Q8_0  y = d * q                 Q4_0  y = d * (q - 8)
 *       Q5_0  y = d * (q - 16)          Q4_1, Q5_1  y = (d * q) + m
 *       Q4_K, Q5_K  y = ((d * sc) * q) - (dmin * mn), sc and mn the 6-bit
 *                   scale and min of the element's sub-block of 32
 *       Q6_K  y = (d * sc) * (q - 32), sc the int8 scale of its 16
 *     and is then a weight like any other: every rule below reads it as the
 *     widened value of a 16-bit weight.
 *
 * lane_dot(a, b, n) - THE 32-LANE RULE, used for every reduction:
 *   lane l (0 <= l < 32) starts at +0.0f and adds a[i]*b[i] (the rounded
 *   product) for i = l, l+32, l+64, ... < n in increasing i; then for
 *   w = 16, 8, 4, 2, 1: p[l] = p[l] + p[l+w] for l < w; the result is p[0].
 *   lane_sum(x, n) is the same with the term x[i]. Scalar definitions:
 *   devio_lane_dot, devio_lane_sum in device/numerics/numerics.h. This is a CUDA warp
 *   reducing with xor shuffles, and 8- or 16-wide SIMD on a CPU. A lane sum
 *   is never -0, so zero terms padded up to a multiple of 32 change nothing.
 *
 * 1. Embedding: x[i] = widen(embed[token][i]), times Granite's
 *    embedding_multiplier (one rounded multiply; no multiply otherwise).
 *
 * 2. rmsnorm(x, w) over d elements:
 *      ss = lane_dot(x, x, d)
 *      r  = devio_rsqrtf(ss / (float)d + eps)     (one division, one add)
 *      y_i = w_i * (x_i * r)                      (weight * (x * rsqrt))
 *
 * 3. Projections: y_o = lane_dot(W[o, :], h, n) for a weight W [m, n]
 *    (Hugging Face layout [out, in]), then
 *      with a bias:        y_o = y_o + b_o
 *      residual (o, down): x_o = x_o + y_o
 *    Each output element is one lane_dot over the whole input dimension: it
 *    never depends on a tile, the batch or the thread count.
 *
 * 3a. LoRA, for a row whose adapter targets module M (weight W [out, in],
 *    optional bias c, input x of the token; A = lora_A [r, in], B = lora_B
 *    [out, r], s = the adapter's scale, device/adapter/adapter.h), in this order:
 *      z[o]  = lane_dot(W[o], x, in) (+ c[o])      the base output
 *      a[j]  = lane_dot(A[j], x, in)               j < r
 *      u[o]  = lane_dot(B[o], a, r)
 *      z'[o] = z[o] + u[o] * s                     product rounded, then added
 *    and z' replaces z in what follows (RoPE, the residual add,
 *    silu(gate) * up). Rows without an adapter, or whose adapter does not
 *    target M (or not in this layer), use z: their bits never depend on the
 *    adapters of other rows.
 *
 * 4. RoPE (rotate_half) over the first rd = rotary_dim dimensions of a head
 *    of hd (rd = hd for the Llama family; Bamba turns half, rd = hd / 2,
 *    and leaves dimensions [rd, hd) as they are), half = rd / 2, i < half:
 *      inv_freq_i = devio_rope_inv_freq (device/backend/shape.c): for plain RoPE
 *                   1.0f / devio_powf_pos(theta, (float)(2*i) / (float)rd);
 *                   linear divides it by factor; llama3 and yarn rework it
 *                   by transformers' formulas, in binary32 with numerics.h
 *      ang        = (float)pos * inv_freq_i
 *      c = devio_cosf(ang) * af, s = devio_sinf(ang) * af
 *                   (af = yarn's attention factor; 1 for others, exact)
 *      out_i        = x_i * c - x_{i+half} * s
 *      out_{i+half} = x_{i+half} * c + x_i * s
 *    applied to every q head and every k head, at the token's absolute
 *    position pos. The table [max_seq_len, half] of c and s is built once on
 *    the host by the core (device/backend/shape.h) and handed to every backend.
 *
 * 4a. Qwen3: before RoPE, every q head and every k head of hd is replaced
 *    by rmsnorm(head, q_norm or k_norm) (rule 2 over hd, eps rms_norm_eps),
 *    after the projection's bias and LoRA.
 *
 * 5. K and V (after RoPE for K) go to the cache slot of position pos:
 *    block row.blocks[pos / block_size], offset pos % block_size. The pool's
 *    layout inside a block is the backend's and no part of the numbers.
 *
 * 6. Attention, head h reads kv head h / (n_heads / n_kv_heads); keys are
 *    the absolute positions j = j0 .. pos of the token's own sequence, read
 *    through its block table, j0 = 0, or with a sliding window W (Mistral)
 *    j0 = max(0, pos - W + 1) (transformers' mask keeps j > pos - W):
 *      scale = devio_rsqrtf((float)hd), or Granite's attention_multiplier
 *      s_j   = lane_dot(q, k_j, hd) * scale
 *      m     = s_j0, then for j = j0+1 .. pos: m = (s_j > m) ? s_j : m
 *      e_j   = devio_expf(s_j - m)
 *      Z     = lane_sum over j of e_j                  (lane = j mod 32)
 *      o[c]  = (lane_sum over j of e_j * v_j[c]) / Z   (lane = j mod 32)
 *    The sums run over the absolute key index j, so the result does not
 *    depend on how the sequence was chunked into steps or batched.
 *
 * 7. Layer: h = rmsnorm(x, attn_norm); q, k, v = projections (+ bias, +
 *    LoRA); RoPE; K, V to the cache; o = attention; x = x + o_proj(o);
 *    h2 = rmsnorm(x, ffn_norm); g = gate(h2), u = up(h2);
 *    a = devio_siluf(g) * u  (one rounded multiply); x = x + down(a).
 *    Granite adds each residual times residual_multiplier r: x = x + y * r
 *    (the product rounded, then added; y the projection with its bias and
 *    LoRA). A mixer layer replaces everything from q, k, v to o_proj with rule 10:
 *    h = rmsnorm(x, attn_norm); x = x + mixer(h); then the MLP as above
 *    (Bamba), or nothing more (Mamba2, which has no MLP).
 *
 * 8. Output: for tokens with logits wanted, hn = rmsnorm(x, norm) and
 *    logits = lm_head(hn) (rule 3, no bias), divided by Granite's
 *    logits_scaling (one division; none otherwise).
 *
 * 9. Sampling (the sampler of device/sample/sampler.h, on the host under strict
 *    numerics): Philox4x32-10 keyed by (seed, sequence position), Gumbel-max
 *    over the filtered logits, ties to the lowest token id; logprob is the
 *    log-softmax of the raw logits at the chosen token.
 *
 * 10. Mamba-2 mixer of a token at position pos of its sequence, with H heads
 *    of P channels, G groups of N states, I = H*P, conv_dim = I + 2*G*N,
 *    kernel K. The state is the conv window W [conv_dim][K-1] (the raw xBC
 *    of the K-1 previous tokens, oldest first) and S [H][P][N]; both are
 *    +0.0f at pos 0. Tokens of a sequence run in position order, so the
 *    numbers never depend on how a sequence was split into steps.
 *      zxbcdt = in_proj(h) (rule 3, + in_proj bias, + LoRA rule 3a)
 *      z = zxbcdt[0, I), xbc = zxbcdt[I, I + conv_dim), dtr = the last H
 *      conv, for c < conv_dim, window u = (W[c][0..K-2], xbc[c]):
 *        v_c = lane_dot(conv_w[c], u, K) (+ conv_b[c]);  xa_c = devio_siluf(v_c)
 *        then W[c] = (u[1..K-1])  (the window moves by one)
 *      x = xa[0, I), B = xa[I, I + G*N), C = xa[I + G*N, conv_dim)
 *      for head h, group g = h / (H / G), A_h = -devio_expf(a_log[h]):
 *        dt = devio_softplusf(dtr[h] + dt_bias[h])
 *        dt = dt < dt_min ? dt_min : dt;  dt = dt > dt_max ? dt_max : dt
 *        dA = devio_expf(dt * A_h)
 *        for p < P, n < N, with xp = x[h*P + p]:
 *          S[h][p][n] = S[h][p][n] * dA + (dt * B[g*N + n]) * xp
 *        y[h*P + p] = lane_dot(S[h][p], C[g*N ..], N) + D[h] * xp
 *      gate: q_i = y_i * devio_siluf(z_i)
 *      gated norm over each group of gs = I / G channels (the current
 *      Hugging Face and original Mamba-2 definition):
 *        ss = lane_dot(q_grp, q_grp, gs); r = devio_rsqrtf(ss / (float)gs + eps)
 *        o_i = norm_w_i * (q_i * r)
 *      mixer(h) = out_proj(o) (rule 3, + out_proj bias, + LoRA)
 *    A snapshot copies W and S of every mixer layer, bit for bit.
 */
#ifndef DEVIO_NUMSPEC_H
#define DEVIO_NUMSPEC_H
#endif

/* tests/numerics_test.c: device/numerics/numerics.h against double-precision libm (an oracle used only here), the lane rule and f16/bf16.
 * Never loosens a bound to make a failure pass: a bound that stops holding is a numerics.h bug.
 * long because every function of numerics.h is swept here through one set of accuracy helpers and generators. */
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/numerics/numerics.h"
#include "device/numerics/numerics_vec.h"

/* ---- helpers ------------------------------------------------------------- */

static uint32_t bits_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float float_of(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* Deterministic 64-bit generator (splitmix64) for jittered sweeps. */
static uint64_t mix_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* ulp of the binary32 nearest to ref (2^-149 in the subnormals). */
static double ulp_at(double ref)
{
    double a = fabs((double)(float)ref);
    if (a < 0x1p-126)
        return 0x1p-149;
    int e;
    frexp(a, &e); /* a = m 2^e, m in [0.5, 1) */
    return ldexp(1.0, e - 24);
}

/* Position of x on the line of floats, so neighbours differ by 1. */
static int64_t float_rank(float x)
{
    uint32_t u = bits_of(x);
    return (u >> 31) ? -(int64_t)(u & 0x7fffffffu) : (int64_t)u;
}

/* Accumulated accuracy of one function over a sweep. `ulp` is the error
 * against the double result in ulps of the float nearest it; `dist` counts
 * floats between ours and the double result rounded to float. `bad` counts
 * results of the wrong kind (finite vs inf vs NaN). */
typedef struct accuracy {
    const char *name;
    int floored; /* when set, inputs below `floor` are left out */
    float floor;
    double max_ulp;
    float worst_x;
    int64_t max_dist;
    uint64_t n, bad;
} accuracy;

static void acc_add(accuracy *a, float x, float y, double ref)
{
    float rf = (float)ref;
    a->n++;
    if (isnan(rf) || isinf(rf)) {
        int same = isnan(rf) ? isnan(y) : (bits_of(y) == bits_of(rf));
        if (!same) {
            if (a->bad < 5)
                printf("  %s(%a) = %a, want %a\n", a->name, (double)x, (double)y, (double)rf);
            a->bad++;
        }
        return;
    }
    if (!isfinite(y)) {
        if (a->bad < 5)
            printf("  %s(%a) = %a, want %a\n", a->name, (double)x, (double)y, ref);
        a->bad++;
        return;
    }
    double e = fabs((double)y - ref) / ulp_at(ref);
    if (e > a->max_ulp) {
        a->max_ulp = e;
        a->worst_x = x;
    }
    int64_t d = float_rank(y) - float_rank(rf);
    if (y == 0.0f && rf == 0.0f)
        d = 0;
    if (d < 0)
        d = -d;
    if (d > a->max_dist)
        a->max_dist = d;
}

static void acc_report(const accuracy *a, double bound)
{
    printf("  %-12s max %.4f ulp at x=%a (%.9g), max %lld ulp from the rounded "
           "reference, %llu points, bound %.2f\n",
           a->name, a->max_ulp, (double)a->worst_x, (double)a->worst_x, (long long)a->max_dist,
           (unsigned long long)a->n, bound);
    fflush(stdout);
    assert_int_equal(a->bad, 0);
    assert_true(a->max_ulp <= bound);
    assert_true((double)a->max_dist <= ceil(bound));
    assert_true(a->n > 0);
}

typedef float (*fn32)(float);
typedef double (*fn64)(double);

static float f_exp(float x) { return devio_expf(x); }
static float f_log(float x) { return devio_logf(x); }
static float f_log1p(float x) { return devio_log1pf(x); }
static float f_sin(float x) { return devio_sinf(x); }
static float f_cos(float x) { return devio_cosf(x); }
static float f_tanh(float x) { return devio_tanhf(x); }
static float f_sigmoid(float x) { return devio_sigmoidf(x); }
static float f_silu(float x) { return devio_siluf(x); }
static float f_softplus(float x) { return devio_softplusf(x); }
static double r_softplus(double x) { return x > 20.0 ? x : log1p(exp(x)); }

static double r_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
static double r_silu(double x) { return x / (1.0 + exp(-x)); }
static double r_rsqrt(double x) { return 1.0 / sqrt(x); }

static void check_point(accuracy *a, fn32 f, fn64 r, float x)
{
    if (a->floored && !(x >= a->floor))
        return;
    acc_add(a, x, f(x), r((double)x));
}

/* Every binade of both signs (subnormals as exponent 0): per_exp points
 * spread over the mantissas with a deterministic jitter. */
static void sweep_exponents(accuracy *a, fn32 f, fn64 r, uint32_t per_exp, uint64_t seed)
{
    uint32_t step = 0x800000u / per_exp;
    for (uint32_t sign = 0; sign < 2; sign++)
        for (uint32_t e = 0; e < 255; e++)
            for (uint32_t j = 0; j < per_exp; j++) {
                uint32_t m = j * step + (uint32_t)(mix_next(&seed) % step);
                check_point(a, f, r, float_of((sign << 31) | (e << 23) | m));
            }
}

/* n points evenly over [lo, hi]. */
static void sweep_grid(accuracy *a, fn32 f, fn64 r, double lo, double hi, uint32_t n)
{
    for (uint32_t i = 0; i <= n; i++)
        check_point(a, f, r, (float)(lo + (hi - lo) * (double)i / (double)n));
}

/* count consecutive floats on each side of c. */
static void sweep_around(accuracy *a, fn32 f, fn64 r, float c, uint32_t count)
{
    int64_t k = float_rank(c);
    for (int64_t i = k - (int64_t)count; i <= k + (int64_t)count; i++) {
        uint32_t u = i < 0 ? 0x80000000u | (uint32_t)(-i) : (uint32_t)i;
        check_point(a, f, r, float_of(u));
    }
}

/* ---- exp, log, log1p ----------------------------------------------------- */

static void test_expf_accuracy(void **state)
{
    (void)state;
    accuracy a = {.name = "expf"};
    sweep_exponents(&a, f_exp, exp, 2048, 1);
    sweep_grid(&a, f_exp, exp, -104.0, 89.0, 2000000);
    sweep_around(&a, f_exp, exp, 88.7228317f, 4096);   /* overflow */
    sweep_around(&a, f_exp, exp, -87.3365479f, 4096);  /* leaving the normals */
    sweep_around(&a, f_exp, exp, -103.972076f, 4096);  /* last nonzero */
    sweep_around(&a, f_exp, exp, 0.0f, 20000);
    acc_report(&a, 1.0);
}

/* devio_expf_sub_n against devio_expf, bit for bit: a sweep of every
 * 61st float from -120 to 100 (each value once as the vector's first lane
 * and once elsewhere), the branch edges, and the special values, with a
 * nonzero m so that the subtraction is the function's own. */
/* devio_silu_mul_n is bit for bit devio_siluf(a) * b, over a sweep of a
 * (both signs, past exp's fast range) and the specials. */
static void test_silu_mul_vector(void **state)
{
    (void)state;
    enum { N = 4101 };
    static float a[N], b[N], dst[N];
    uint64_t checked = 0;
    for (int sign = 0; sign < 2; sign++) {
        uint32_t bits = sign ? 0x80000000u : 0u;
        uint32_t end = devio_num_bits(sign ? -110.0f : 110.0f);
        while (bits <= end) {
            uint32_t n = 0;
            for (; n < N && bits <= end; n++, bits += 97) {
                a[n] = devio_num_float(bits);
                b[n] = devio_num_float(0x3f800000u + (bits & 0x7fffffu)) * (n & 1 ? -1.0f : 1.0f);
            }
            devio_silu_mul_n(dst, a, b, n);
            for (uint32_t i = 0; i < n; i++) {
                float want = devio_siluf(a[i]) * b[i];
                if (devio_num_bits(dst[i]) != devio_num_bits(want) && !(dst[i] != dst[i] && want != want))
                    fail_msg("silu(%a) * %a: %a, scalar %a", (double)a[i], (double)b[i],
                             (double)dst[i], (double)want);
            }
            checked += n;
            if (n < 8)
                break;
        }
    }
    float sp[16] = {87.0f, -87.0f, 88.0f, -88.0f, 88.75f, -88.75f, 89.0f, -89.0f, 0.0f, -0.0f,
                    0x1p-149f, -0x1p-149f, 1e30f, -1e30f};
    sp[14] = devio_num_float(DEVIO_NUM_INF);
    sp[15] = -devio_num_float(DEVIO_NUM_INF);
    float g[16], out[16];
    for (int i = 0; i < 16; i++)
        g[i] = 1.5f;
    devio_silu_mul_n(out, sp, g, 16);
    for (int i = 0; i < 16; i++) {
        float want = devio_siluf(sp[i]) * g[i];
        assert_true(devio_num_bits(out[i]) == devio_num_bits(want) || (out[i] != out[i] && want != want));
    }
    assert_true(checked > 80000);
}

static void test_expf_vector(void **state)
{
    (void)state;
    enum { N = 4099 }; /* not a multiple of 8: the tail runs too */
    static float src[N], dst[N];
    const float m = 0.75f;
    uint64_t checked = 0;
    uint32_t lo = devio_num_bits(-120.0f), hi = devio_num_bits(100.0f);
    /* negative floats run from bits 0x80000000 (-0) up to lo; positive
     * from 0 up to hi. */
    for (int sign = 0; sign < 2; sign++) {
        uint32_t b = sign ? 0x80000000u : 0u, end = sign ? lo : hi;
        while (b <= end) {
            uint32_t n = 0;
            for (; n < N && b <= end; n++, b += 61)
                src[n] = devio_num_float(b);
            devio_expf_sub_n(dst, src, m, n);
            for (uint32_t i = 0; i < n; i++) {
                float want = devio_expf(src[i] - m);
                if (devio_num_bits(dst[i]) != devio_num_bits(want))
                    fail_msg("exp(%a - m): %a, devio_expf %a", (double)src[i], (double)dst[i],
                             (double)want);
            }
            checked += n;
            if (n < 8)
                break;
        }
    }
    static const float edges[] = {-87.0f, -86.999f, -87.001f, 88.0f, 87.999f, 88.001f,
                                  -104.0f, -103.25f, 89.0f, 88.75f, 0.0f, -0.0f,
                                  1e-30f, -1e-30f, 0x1p-149f, -0x1p-149f};
    float sp[24];
    for (size_t i = 0; i < 24; i++)
        sp[i] = edges[i % (sizeof edges / sizeof *edges)] + m;
    sp[3] = devio_num_float(DEVIO_NUM_INF);
    sp[5] = -devio_num_float(DEVIO_NUM_INF);
    sp[9] = devio_num_float(DEVIO_NUM_QNAN);
    sp[17] = devio_num_float(0x7fa00001u); /* a signalling NaN's payload comes back */
    float out[24];
    devio_expf_sub_n(out, sp, m, 24);
    for (size_t i = 0; i < 24; i++) {
        float want = devio_expf(sp[i] - m);
        assert_int_equal(devio_num_bits(out[i]) == devio_num_bits(want) ||
                             (out[i] != out[i] && want != want),
                         1);
    }
    assert_true(checked > 1000000);
}

static void test_logf_accuracy(void **state)
{
    (void)state;
    accuracy a = {.name = "logf"};
    sweep_exponents(&a, f_log, log, 2048, 2);
    sweep_grid(&a, f_log, log, 0.0, 4.0, 1000000);
    sweep_around(&a, f_log, log, 1.0f, 200000);
    sweep_around(&a, f_log, log, 0.707106769f, 20000); /* sqrt(1/2) split */
    sweep_around(&a, f_log, log, 1.41421354f, 20000);
    sweep_around(&a, f_log, log, 0x1p-126f, 20000);
    acc_report(&a, 1.0);
}

static void test_log1pf_accuracy(void **state)
{
    (void)state;
    accuracy a = {.name = "log1pf"};
    sweep_exponents(&a, f_log1p, log1p, 2048, 3);
    sweep_grid(&a, f_log1p, log1p, -1.0, 4.0, 1000000);
    sweep_grid(&a, f_log1p, log1p, -1e-3, 1e-3, 500000);
    sweep_around(&a, f_log1p, log1p, -1.0f, 20000);
    sweep_around(&a, f_log1p, log1p, 0x1p-25f, 20000); /* the x-itself cut */
    sweep_around(&a, f_log1p, log1p, -0.292893231f, 20000);
    sweep_around(&a, f_log1p, log1p, 0.414213538f, 20000);
    acc_report(&a, 1.0);
}

static void test_exp_log_specials(void **state)
{
    (void)state;
    const float inf = INFINITY;
    assert_int_equal(bits_of(devio_expf(0.0f)), bits_of(1.0f));
    assert_int_equal(bits_of(devio_expf(-0.0f)), bits_of(1.0f));
    assert_int_equal(bits_of(devio_expf(inf)), bits_of(inf));
    assert_int_equal(bits_of(devio_expf(-inf)), 0u); /* +0 */
    assert_int_equal(bits_of(devio_expf(1000.0f)), bits_of(inf));
    assert_int_equal(bits_of(devio_expf(-1000.0f)), 0u);
    assert_int_equal(bits_of(devio_expf(1.0f)), bits_of(2.71828183f));
    /* Overflow threshold: the last finite result and the first inf. */
    assert_int_equal(bits_of(devio_expf(88.7228317f)), bits_of((float)exp((double)88.7228317f)));
    assert_true(isfinite(devio_expf(88.7228317f)));
    assert_int_equal(bits_of(devio_expf(88.7228394f)), bits_of(inf));
    /* Underflow: the smallest subnormal and the first zero. */
    assert_int_equal(bits_of(devio_expf(-103.972076f)), 1u);
    assert_int_equal(bits_of(devio_expf(nextafterf(-103.972076f, -200.0f))), 0u);
    /* The first subnormal result and the last normal one. */
    assert_int_equal(bits_of(devio_expf(-87.3365479f)), bits_of((float)exp((double)-87.3365479f)));
    assert_int_equal(bits_of(devio_expf(-87.3365479f)), 0x007fffe6u);
    assert_int_equal(bits_of(devio_expf(-87.3365402f)), bits_of((float)exp((double)-87.3365402f)));
    assert_int_equal(bits_of(devio_expf(-87.3365402f)), 0x00800026u);

    assert_int_equal(bits_of(devio_logf(1.0f)), 0u);
    assert_int_equal(bits_of(devio_logf(0.0f)), bits_of(-inf));
    assert_int_equal(bits_of(devio_logf(-0.0f)), bits_of(-inf));
    assert_int_equal(bits_of(devio_logf(inf)), bits_of(inf));
    assert_int_equal(bits_of(devio_logf(-1.0f)), 0x7fc00000u);
    assert_int_equal(bits_of(devio_logf(-inf)), 0x7fc00000u);
    assert_int_equal(bits_of(devio_logf(-0x1p-149f)), 0x7fc00000u);
    assert_int_equal(bits_of(devio_logf(0x1p-149f)), bits_of((float)(-149.0 * log(2.0))));
    assert_int_equal(bits_of(devio_logf(0x1.fffffcp-127f)), bits_of((float)log(0x1.fffffcp-127)));
    assert_int_equal(bits_of(devio_logf(3.40282347e38f)), bits_of(88.7228394f));
    assert_int_equal(bits_of(devio_logf(2.0f)), bits_of(0.693147182f));

    assert_int_equal(bits_of(devio_log1pf(0.0f)), 0u);
    assert_int_equal(bits_of(devio_log1pf(-0.0f)), 0x80000000u);
    assert_int_equal(bits_of(devio_log1pf(0x1p-149f)), 1u);
    assert_int_equal(bits_of(devio_log1pf(-0x1p-140f)), bits_of(-0x1p-140f));
    assert_int_equal(bits_of(devio_log1pf(-1.0f)), bits_of(-inf));
    assert_int_equal(bits_of(devio_log1pf(-1.5f)), 0x7fc00000u);
    assert_int_equal(bits_of(devio_log1pf(-inf)), 0x7fc00000u);
    assert_int_equal(bits_of(devio_log1pf(inf)), bits_of(inf));
    assert_int_equal(bits_of(devio_log1pf(3.40282347e38f)), bits_of(88.7228394f));
    assert_int_equal(bits_of(devio_log1pf(1e-5f)), bits_of((float)log1p((double)1e-5f)));

    /* NaN comes back with its own bits, sign and payload included. */
    const uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7fc12345u, 0xff812345u};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        float n = float_of(nans[i]);
        assert_int_equal(bits_of(devio_expf(n)), nans[i]);
        assert_int_equal(bits_of(devio_logf(n)), nans[i]);
        assert_int_equal(bits_of(devio_log1pf(n)), nans[i]);
        assert_int_equal(bits_of(devio_sinf(n)), nans[i]);
        assert_int_equal(bits_of(devio_cosf(n)), nans[i]);
        assert_int_equal(bits_of(devio_tanhf(n)), nans[i]);
        assert_true(isnan(devio_sigmoidf(n)));
        assert_true(isnan(devio_siluf(n)));
        assert_true(isnan(devio_rsqrtf(n)));
    }
}

/* ---- sin, cos ------------------------------------------------------------ */

/* The floats nearest k*pi/2 for k < 2^17 (|x| up to 2e5) and their
 * neighbours: where the reduced argument is smallest (down to 2^-27.8),
 * the hardest inputs for the range reduction. */
static void sweep_near_pio2_multiples(accuracy *a, fn32 f, fn64 r)
{
    for (uint32_t k = 1; k < (1u << 17); k++) {
        float c = (float)((double)k * 1.5707963267948966);
        float lo = nextafterf(c, 0.0f), hi = nextafterf(c, INFINITY);
        check_point(a, f, r, c);
        check_point(a, f, r, lo);
        check_point(a, f, r, hi);
        check_point(a, f, r, -c);
    }
}

static void check_trig(accuracy *a, fn32 f, fn64 r, uint64_t seed)
{
    sweep_exponents(a, f, r, 1024, seed);
    sweep_grid(a, f, r, -1e5, 1e5, 1000000);
    sweep_grid(a, f, r, -8.0, 8.0, 200000);
    sweep_near_pio2_multiples(a, f, r);
    sweep_around(a, f, r, 0.785398163f, 20000); /* no reduction up to pi/4 */
    sweep_around(a, f, r, 96.0f, 20000);        /* Cody-Waite / exact switch */
    sweep_around(a, f, r, 252.898209f, 2000);   /* closest to k pi/2 below 2e5 */
}

static void test_sinf_accuracy(void **state)
{
    (void)state;
    accuracy a = {.name = "sinf"};
    check_trig(&a, f_sin, sin, 4);
    acc_report(&a, 2.0);
}

static void test_cosf_accuracy(void **state)
{
    (void)state;
    accuracy a = {.name = "cosf"};
    check_trig(&a, f_cos, cos, 5);
    acc_report(&a, 2.0);
}

static void test_trig_specials(void **state)
{
    (void)state;
    const float inf = INFINITY;
    assert_int_equal(bits_of(devio_sinf(0.0f)), 0u);
    assert_int_equal(bits_of(devio_sinf(-0.0f)), 0x80000000u);
    assert_int_equal(bits_of(devio_sinf(0x1p-149f)), 1u);
    assert_int_equal(bits_of(devio_sinf(-0x1.fffffcp-127f)), bits_of(-0x1.fffffcp-127f));
    assert_int_equal(bits_of(devio_sinf(inf)), 0x7fc00000u);
    assert_int_equal(bits_of(devio_sinf(-inf)), 0x7fc00000u);
    assert_int_equal(bits_of(devio_cosf(0.0f)), bits_of(1.0f));
    assert_int_equal(bits_of(devio_cosf(-0.0f)), bits_of(1.0f));
    assert_int_equal(bits_of(devio_cosf(0x1p-149f)), bits_of(1.0f));
    assert_int_equal(bits_of(devio_cosf(inf)), 0x7fc00000u);
    assert_int_equal(bits_of(devio_cosf(-inf)), 0x7fc00000u);
    /* Odd and even symmetry hold bit for bit. */
    uint64_t seed = 6;
    for (int i = 0; i < 100000; i++) {
        float x = float_of((uint32_t)mix_next(&seed) & 0x7f7fffffu);
        assert_int_equal(bits_of(devio_sinf(-x)), bits_of(devio_sinf(x)) ^ 0x80000000u);
        assert_int_equal(bits_of(devio_cosf(-x)), bits_of(devio_cosf(x)));
    }
    /* Huge arguments are reduced exactly, so these are the rounded values. */
    assert_int_equal(bits_of(devio_sinf(3.40282347e38f)), bits_of((float)sin((double)3.40282347e38f)));
    assert_int_equal(bits_of(devio_cosf(3.40282347e38f)), bits_of((float)cos((double)3.40282347e38f)));
    int64_t d = float_rank(devio_sinf(1e22f)) - float_rank((float)sin((double)1e22f));
    assert_true(d >= -1 && d <= 1);
}

/* ---- tanh, sigmoid, silu, rsqrt, pow -------------------------------------- */

static void test_tanhf_accuracy(void **state)
{
    (void)state;
    accuracy a = {.name = "tanhf"};
    sweep_exponents(&a, f_tanh, tanh, 2048, 7);
    sweep_grid(&a, f_tanh, tanh, -10.0, 10.0, 2000000);
    sweep_around(&a, f_tanh, tanh, 0.75f, 20000); /* polynomial / exp switch */
    sweep_around(&a, f_tanh, tanh, 9.1f, 20000);
    acc_report(&a, 2.0);

    assert_int_equal(bits_of(devio_tanhf(0.0f)), 0u);
    assert_int_equal(bits_of(devio_tanhf(-0.0f)), 0x80000000u);
    assert_int_equal(bits_of(devio_tanhf(0x1p-149f)), 1u);
    assert_int_equal(bits_of(devio_tanhf(-0x1p-130f)), bits_of(-0x1p-130f));
    assert_int_equal(bits_of(devio_tanhf(INFINITY)), bits_of(1.0f));
    assert_int_equal(bits_of(devio_tanhf(-INFINITY)), bits_of(-1.0f));
    assert_int_equal(bits_of(devio_tanhf(20.0f)), bits_of(1.0f));
    assert_int_equal(bits_of(devio_tanhf(-9.5f)), bits_of(-1.0f));
    assert_true(devio_tanhf(9.0f) < 1.0f); /* not saturated yet */
}

/* Compositions: the bound is what their roundings allow (exp's error plus
 * one rounding per operation), checked so a change in order shows. Below
 * -88.7228317 exp(-x) overflows and both give zero (documented), so the
 * ulp sweep starts there and the zeros are asserted separately. */
static void test_sigmoid_silu(void **state)
{
    (void)state;
    accuracy s = {.name = "sigmoidf", .floored = 1, .floor = -88.7228317f};
    sweep_exponents(&s, f_sigmoid, r_sigmoid, 1024, 8);
    sweep_grid(&s, f_sigmoid, r_sigmoid, -88.7228317, 30.0, 500000);
    acc_report(&s, 2.5);
    /* silu from -87.3365479 on, where sigmoid is still a normal float;
     * below it sigmoid is subnormal and its absolute rounding (half of
     * 2^-149) is what x multiplies: checked as an absolute error after. */
    accuracy u = {.name = "siluf", .floored = 1, .floor = -87.3365479f};
    sweep_exponents(&u, f_silu, r_silu, 1024, 9);
    sweep_grid(&u, f_silu, r_silu, -87.3365479, 30.0, 500000);
    acc_report(&u, 3.0);
    double tail = 0.0;
    for (float x = -87.3365479f; x >= -88.7228317f; x = nextafterf(x, -100.0f)) {
        double ref = r_silu((double)x);
        double err = fabs((double)devio_siluf(x) - ref) / (ulp_at(ref) + fabs((double)x) * 0x1p-149);
        tail = err > tail ? err : tail;
    }
    printf("  siluf tail   max %.4f (ulp + |x| 2^-149) below -87.34\n", tail);
    assert_true(tail <= 1.5);
    for (float x = -88.7228394f; x > -200.0f; x = nextafterf(x, -1000.0f) - 0.001f) {
        assert_int_equal(bits_of(devio_sigmoidf(x)), 0u);
        assert_int_equal(bits_of(devio_siluf(x)), 0x80000000u);
    }
    /* The last nonzero sigmoid, a subnormal near 2^-128. */
    assert_true(devio_sigmoidf(-88.7228317f) > 0x1.fp-129f);
    assert_true(devio_sigmoidf(-88.7228317f) < 0x1.1p-128f);

    /* Exactly the documented order of operations. */
    uint64_t seed = 10;
    for (int i = 0; i < 200000; i++) {
        float x = (float)((double)(mix_next(&seed) >> 11) * 0x1p-53 * 240.0 - 120.0);
        volatile float e = devio_expf(-x);
        volatile float d = 1.0f + e;
        volatile float sg = 1.0f / d;
        volatile float sl = x * sg;
        assert_int_equal(bits_of(devio_sigmoidf(x)), bits_of(sg));
        assert_int_equal(bits_of(devio_siluf(x)), bits_of(sl));
    }
    assert_int_equal(bits_of(devio_sigmoidf(0.0f)), bits_of(0.5f));
    assert_int_equal(bits_of(devio_sigmoidf(INFINITY)), bits_of(1.0f));
    assert_int_equal(bits_of(devio_sigmoidf(-INFINITY)), 0u);
    assert_int_equal(bits_of(devio_sigmoidf(-200.0f)), 0u);
    assert_int_equal(bits_of(devio_siluf(0.0f)), 0u);
    assert_int_equal(bits_of(devio_siluf(INFINITY)), bits_of(INFINITY));
    assert_true(isnan(devio_siluf(-INFINITY))); /* -inf * 0, as documented */
    assert_int_equal(bits_of(devio_siluf(-200.0f)), 0x80000000u);
}

/* Softplus: PyTorch's threshold, the documented composition, 2 ulp. */
static void test_softplus(void **state)
{
    (void)state;
    accuracy a = {.name = "softplusf", .floored = 1, .floor = -87.0f};
    sweep_grid(&a, f_softplus, r_softplus, -87.0, 40.0, 500000);
    acc_report(&a, 2.0);
    uint64_t seed = 11;
    for (int i = 0; i < 100000; i++) {
        float x = (float)((double)(mix_next(&seed) >> 11) * 0x1p-53 * 60.0 - 30.0);
        volatile float e = devio_expf(x);
        float want = x > 20.0f ? x : devio_log1pf(e);
        assert_int_equal(bits_of(devio_softplusf(x)), bits_of(want));
    }
    assert_int_equal(bits_of(devio_softplusf(-INFINITY)), 0u);
    assert_int_equal(bits_of(devio_softplusf(INFINITY)), bits_of(INFINITY));
    assert_int_equal(bits_of(devio_softplusf(25.0f)), bits_of(25.0f));
}

static void test_rsqrtf(void **state)
{
    (void)state;
    accuracy a = {.name = "rsqrtf"};
    uint64_t seed = 11;
    /* Positive binades (negatives give NaN, checked below). */
    for (uint32_t e = 0; e < 255; e++)
        for (uint32_t j = 0; j < 4096; j++) {
            float x = float_of((e << 23) | (uint32_t)(mix_next(&seed) & 0x7fffffu));
            if (x == 0.0f)
                continue;
            float y = devio_rsqrtf(x);
            acc_add(&a, x, y, r_rsqrt((double)x));
            /* Two correctly rounded operations: the same bits as libm's
             * (correctly rounded) sqrtf followed by a division. */
            volatile float sq = sqrtf(x);
            assert_int_equal(bits_of(y), bits_of(1.0f / sq));
        }
    acc_report(&a, 1.5);
    assert_int_equal(bits_of(devio_rsqrtf(0.0f)), bits_of(INFINITY));
    assert_int_equal(bits_of(devio_rsqrtf(-0.0f)), bits_of(-INFINITY));
    assert_int_equal(bits_of(devio_rsqrtf(INFINITY)), 0u);
    assert_int_equal(bits_of(devio_rsqrtf(4.0f)), bits_of(0.5f));
    assert_int_equal(bits_of(devio_rsqrtf(0x1p-148f)), bits_of(0x1p74f));
    assert_true(isnan(devio_rsqrtf(-1.0f)));
    assert_true(isnan(devio_rsqrtf(-INFINITY)));
}

/* b^e = exp(e log b): the rounding of e*log(b) is magnified by |e log b|,
 * so the bound grows with it: 1 + 2.6 |e ln b| ulp (exp's 0.8 ulp, and
 * log's 0.8 ulp plus the product's 0.5 ulp, relative, times |e ln b|). */
static void test_powf_pos(void **state)
{
    (void)state;
    const float thetas[] = {10000.0f, 500000.0f, 1000000.0f, 10.0f};
    const uint32_t dims[] = {16, 32, 64, 80, 96, 128, 256};
    double worst = 0.0, worst_ratio = 0.0;
    uint64_t n = 0;
    for (size_t t = 0; t < sizeof thetas / sizeof thetas[0]; t++)
        for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++)
            for (uint32_t i = 0; i < dims[d] / 2; i++) {
                /* As RoPE asks: theta^(-2i/d), exponent rounded to float. */
                float e = -(float)(2 * i) / (float)dims[d];
                float y = devio_powf_pos(thetas[t], e);
                double ref = pow((double)thetas[t], (double)e);
                double err = fabs((double)y - ref) / ulp_at(ref);
                double bound = 1.0 + 2.6 * fabs((double)e * log((double)thetas[t]));
                assert_true(err <= bound);
                worst = err > worst ? err : worst;
                worst_ratio = err / bound > worst_ratio ? err / bound : worst_ratio;
                n++;
            }
    uint64_t seed = 12;
    for (int i = 0; i < 300000; i++) {
        float b = (float)exp2((double)(mix_next(&seed) >> 11) * 0x1p-53 * 40.0 - 20.0);
        float e = (float)((double)(mix_next(&seed) >> 11) * 0x1p-53 * 8.0 - 4.0);
        float y = devio_powf_pos(b, e);
        double ref = pow((double)b, (double)e);
        double err = fabs((double)y - ref) / ulp_at(ref);
        double bound = 1.0 + 2.6 * fabs((double)e * log((double)b));
        assert_true(err <= bound);
        worst = err > worst ? err : worst;
        worst_ratio = err / bound > worst_ratio ? err / bound : worst_ratio;
        /* Exactly the documented composition. */
        assert_int_equal(bits_of(y), bits_of(devio_expf(e * devio_logf(b))));
        n++;
    }
    printf("  powf_pos     max %.4f ulp, at most %.2f of the bound 1 + 2.6|e ln b|, "
           "%llu points\n",
           worst, worst_ratio, (unsigned long long)n);
    assert_int_equal(bits_of(devio_powf_pos(10000.0f, 0.0f)), bits_of(1.0f));
    assert_int_equal(bits_of(devio_powf_pos(1.0f, 7.5f)), bits_of(1.0f));
    assert_int_equal(bits_of(devio_powf_pos(2.0f, 10.0f)), bits_of(1024.0f));
}

/* ---- 32-lane reductions --------------------------------------------------- */

/* The rule restated as a tree: v(l, w) is lane l after the fold step of
 * width w; v(l, 32) is the lane's own sum. */
static float tree_fold(const float acc[32], uint32_t l, uint32_t w)
{
    if (w == 32)
        return acc[l];
    return tree_fold(acc, l, 2 * w) + tree_fold(acc, l + w, 2 * w);
}

static float rule_sum(const float *x, uint32_t n)
{
    float acc[32];
    for (uint32_t l = 0; l < 32; l++) {
        acc[l] = 0.0f;
        for (uint32_t i = l; i < n; i += 32)
            acc[l] += x[i];
    }
    return tree_fold(acc, 0, 1);
}

static float rule_dot(const float *a, const float *b, uint32_t n)
{
    float acc[32];
    for (uint32_t l = 0; l < 32; l++) {
        acc[l] = 0.0f;
        for (uint32_t i = l; i < n; i += 32) {
            volatile float prod = a[i] * b[i]; /* rounded before the add */
            acc[l] += prod;
        }
    }
    return tree_fold(acc, 0, 1);
}

/* Terms of wildly mixed size and sign, so every change of order shows. */
static float messy(uint64_t *seed)
{
    uint64_t r = mix_next(seed);
    float m = (float)((double)(r >> 40) * 0x1p-24 + 0.5);
    int ex = (int)((r >> 8) % 40) - 20;
    return ((r & 1) ? -1.0f : 1.0f) * ldexpf(m, ex);
}

static void test_lane_rule(void **state)
{
    (void)state;
    enum { MAXN = 5000 };
    float *x = malloc(MAXN * sizeof *x), *y = malloc(MAXN * sizeof *y);
    assert_non_null(x);
    assert_non_null(y);
    uint64_t seed = 13;
    uint32_t ns[200], cnt = 0;
    for (uint32_t n = 0; n <= 130; n++)
        ns[cnt++] = n;
    const uint32_t more[] = {159, 160, 161, 255, 256, 257, 511, 1000, 1023, 1024, 1025,
                             2047, 2048, 4095, 4096, 4097, 4999, 5000};
    for (size_t i = 0; i < sizeof more / sizeof more[0]; i++)
        ns[cnt++] = more[i];
    uint32_t order_matters = 0;
    for (int round = 0; round < 20; round++)
        for (uint32_t c = 0; c < cnt; c++) {
            uint32_t n = ns[c];
            for (uint32_t i = 0; i < n; i++) {
                x[i] = messy(&seed);
                y[i] = messy(&seed);
            }
            assert_int_equal(bits_of(devio_lane_sum(x, n)), bits_of(rule_sum(x, n)));
            assert_int_equal(bits_of(devio_lane_dot(x, y, n)), bits_of(rule_dot(x, y, n)));
            /* A plain left-to-right sum differs somewhere: the data can tell
             * orders apart, so the equalities above mean something. */
            float seq = 0.0f;
            for (uint32_t i = 0; i < n; i++)
                seq += x[i];
            order_matters += bits_of(seq) != bits_of(devio_lane_sum(x, n));
        }
    assert_true(order_matters > 100);

    /* The fold alone: p[l] = l + 1 sums to 528 exactly; p is overwritten. */
    float p[32];
    for (uint32_t l = 0; l < 32; l++)
        p[l] = (float)(l + 1);
    assert_int_equal(bits_of(devio_lane_fold(p)), bits_of(528.0f));
    assert_int_equal(bits_of(p[0]), bits_of(528.0f));
    /* Order of the fold: p[0] = 2^24 meets lane 16's 1 first (a tie,
     * rounded to even: lost); every later partner is even, so it stays. */
    for (uint32_t l = 0; l < 32; l++)
        p[l] = 1.0f;
    p[0] = 0x1p24f;
    assert_int_equal(bits_of(devio_lane_fold(p)), bits_of(0x1p24f + 30.0f));

    /* Starts from +0: an empty or all -0 input sums to +0. */
    const float negz[3] = {-0.0f, -0.0f, -0.0f};
    assert_int_equal(bits_of(devio_lane_sum(negz, 0)), 0u);
    assert_int_equal(bits_of(devio_lane_sum(negz, 3)), 0u);
    assert_int_equal(bits_of(devio_lane_dot(negz, x, 0)), 0u);
    /* Which lane a term lands in decides what survives next to a 1:
     * (a) terms 0 and 32 share lane 0, 1 + 2^-24 rounds back to 1 there,
     *     and lane 1's 2^-24 is lost in the fold too;
     * (b) two 2^-24 in lane 1 (terms 1 and 33) add up to 2^-23 and stay,
     *     where a left-to-right sum would lose both;
     * (c) lanes 1 and 16: lane 16 meets lane 0 at w = 16 and is lost;
     * (d) lanes 1 and 17 meet each other first and stay. */
    float t[64];
    for (uint32_t i = 0; i < 64; i++)
        t[i] = 0.0f;
    t[0] = 1.0f;
    t[1] = 0x1p-24f;
    t[32] = 0x1p-24f;
    assert_int_equal(bits_of(devio_lane_sum(t, 64)), bits_of(1.0f));
    t[32] = 0.0f;
    t[33] = 0x1p-24f;
    assert_int_equal(bits_of(devio_lane_sum(t, 64)), bits_of(1.0f + 0x1p-23f));
    t[33] = 0.0f;
    t[16] = 0x1p-24f;
    assert_int_equal(bits_of(devio_lane_sum(t, 64)), bits_of(1.0f));
    t[16] = 0.0f;
    t[17] = 0x1p-24f;
    assert_int_equal(bits_of(devio_lane_sum(t, 64)), bits_of(1.0f + 0x1p-23f));
    assert_int_equal(bits_of(devio_lane_sum(t, 18)), bits_of(1.0f + 0x1p-23f));
    free(x);
    free(y);
}

/* ---- f16 / bf16 --------------------------------------------------------- */

static double f16_value(uint16_t h)
{
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double s = (h & 0x8000) ? -1.0 : 1.0;
    if (e == 0)
        return s * ldexp((double)m, -24);
    return s * ldexp(1024.0 + m, e - 25);
}

/* Round to nearest even via rint, by scaling the value so that a half's
 * last mantissa bit is worth 1. */
static uint16_t ref_to_f16(float x)
{
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    double a = fabs((double)x);
    if (isnan(x))
        return sign | 0x7e00;
    if (isinf(x))
        return sign | 0x7c00;
    if (a < 0x1p-14) /* subnormal halves: units of 2^-24 */
        return sign | (uint16_t)rint(a * 0x1p24);
    int e;
    frexp(a, &e); /* a in [2^(e-1), 2^e) */
    double q = rint(ldexp(a, 11 - e)); /* in [1024, 2048] */
    if (q == 2048.0) {
        q = 1024.0;
        e += 1;
    }
    int he = e - 1 + 15;
    if (he >= 31)
        return sign | 0x7c00;
    return sign | (uint16_t)((he << 10) | ((int)q - 1024));
}

static uint16_t ref_to_bf16(float x)
{
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    double a = fabs((double)x);
    if (isnan(x))
        return sign | 0x7fc0;
    if (isinf(x))
        return sign | 0x7f80;
    if (a < 0x1p-126) /* subnormal: units of 2^-133 */
        return sign | (uint16_t)rint(a * 0x1p133);
    int e;
    frexp(a, &e);
    double q = rint(ldexp(a, 8 - e)); /* in [128, 256] */
    if (q == 256.0) {
        q = 128.0;
        e += 1;
    }
    int be = e - 1 + 127;
    if (be >= 255)
        return sign | 0x7f80;
    return sign | (uint16_t)((be << 7) | ((int)q - 128));
}

static void test_f16(void **state)
{
    (void)state;
    uint32_t checked = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float w = devio_f16_to_f32(h);
        int e = (h >> 10) & 0x1f, m = h & 0x3ff;
        if (e == 31 && m != 0) {
            assert_true(isnan(w));
            assert_int_equal(bits_of(w) >> 31, h >> 15);
            assert_int_equal((bits_of(w) >> 13) & 0x3ff, (uint32_t)m); /* payload */
            uint16_t back = devio_f32_to_f16_rne(w);
            assert_int_equal(back & 0x7c00, 0x7c00);
            assert_int_equal(back & 0x0200, 0x0200); /* quiet */
            assert_int_equal(back & 0x81ff, h & 0x81ff);
            continue;
        }
        if (e == 31)
            assert_int_equal(bits_of(w), bits_of(h >> 15 ? -INFINITY : INFINITY));
        else
            assert_int_equal(bits_of(w), bits_of((float)f16_value(h)));
        assert_int_equal(devio_f32_to_f16_rne(w), h); /* round trip */
        checked++;
        /* Around each finite half: the midpoint to the next one up (exact in
         * f32) and the floats on either side of it. */
        if (e < 31 && (h & 0x7fff) != 0x7bff) {
            uint16_t up = (uint16_t)(h + 1);
            float mid = (float)((f16_value(h) + f16_value(up)) / 2.0);
            assert_true((double)mid == (f16_value(h) + f16_value(up)) / 2.0);
            const float probes[3] = {mid, nextafterf(mid, 0.0f), nextafterf(mid, mid * 2.0f)};
            for (int k = 0; k < 3; k++)
                assert_int_equal(devio_f32_to_f16_rne(probes[k]), ref_to_f16(probes[k]));
        }
    }
    assert_int_equal(checked, 65536 - 2 * 1023);
    /* Random floats of every size against the reference. */
    uint64_t seed = 14;
    for (int i = 0; i < 2000000; i++) {
        float x = float_of((uint32_t)mix_next(&seed));
        if (isnan(x)) {
            uint16_t r = devio_f32_to_f16_rne(x);
            assert_true((r & 0x7c00) == 0x7c00 && (r & 0x3ff) != 0);
            continue;
        }
        assert_int_equal(devio_f32_to_f16_rne(x), ref_to_f16(x));
    }
    /* Thresholds. */
    assert_int_equal(devio_f32_to_f16_rne(65504.0f), 0x7bff);
    assert_int_equal(devio_f32_to_f16_rne(nextafterf(65520.0f, 0.0f)), 0x7bff);
    assert_int_equal(devio_f32_to_f16_rne(65520.0f), 0x7c00);
    assert_int_equal(devio_f32_to_f16_rne(-65520.0f), 0xfc00);
    assert_int_equal(devio_f32_to_f16_rne(3.40282347e38f), 0x7c00);
    assert_int_equal(devio_f32_to_f16_rne(INFINITY), 0x7c00);
    assert_int_equal(devio_f32_to_f16_rne(0x1p-25f), 0x0000);  /* tie to even 0 */
    assert_int_equal(devio_f32_to_f16_rne(nextafterf(0x1p-25f, 1.0f)), 0x0001);
    assert_int_equal(devio_f32_to_f16_rne(-0x1p-25f), 0x8000);
    assert_int_equal(devio_f32_to_f16_rne(0x1.8p-24f), 0x0002); /* tie to even 2 */
    assert_int_equal(devio_f32_to_f16_rne(0x1p-149f), 0x0000);
    assert_int_equal(devio_f32_to_f16_rne(-0.0f), 0x8000);
    assert_int_equal(devio_f32_to_f16_rne(nextafterf(0x1p-14f, 0.0f)), 0x0400);
    assert_int_equal(devio_f32_to_f16_rne(float_of(0x7f800001u)) & 0x7e00, 0x7e00);
}

static void test_bf16(void **state)
{
    (void)state;
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float w = devio_bf16_to_f32(h);
        int e = (h >> 7) & 0xff, m = h & 0x7f;
        double s = (h & 0x8000) ? -1.0 : 1.0;
        if (e == 255 && m != 0) {
            assert_true(isnan(w));
            uint16_t back = devio_f32_to_bf16_rne(w);
            assert_int_equal(back & 0x7fc0, 0x7fc0);
            assert_int_equal(back & 0x803f, h & 0x803f);
            continue;
        }
        double v = e == 255 ? s * INFINITY
                 : e == 0   ? s * ldexp((double)m, -133)
                            : s * ldexp(128.0 + m, e - 134);
        assert_int_equal(bits_of(w), bits_of((float)v));
        assert_true((double)w == v || (isinf(v) && isinf(w)));
        assert_int_equal(devio_f32_to_bf16_rne(w), h);
        if (e < 255 && (h & 0x7fff) != 0x7f7f) {
            float mid = (float)((v + (double)devio_bf16_to_f32((uint16_t)(h + 1))) / 2.0);
            const float probes[3] = {mid, nextafterf(mid, 0.0f), nextafterf(mid, mid * 2.0f)};
            for (int k = 0; k < 3; k++)
                assert_int_equal(devio_f32_to_bf16_rne(probes[k]), ref_to_bf16(probes[k]));
        }
    }
    uint64_t seed = 15;
    for (int i = 0; i < 2000000; i++) {
        float x = float_of((uint32_t)mix_next(&seed));
        if (isnan(x)) {
            uint16_t r = devio_f32_to_bf16_rne(x);
            assert_true((r & 0x7f80) == 0x7f80 && (r & 0x7f) != 0);
            continue;
        }
        assert_int_equal(devio_f32_to_bf16_rne(x), ref_to_bf16(x));
    }
    assert_int_equal(devio_f32_to_bf16_rne(3.40282347e38f), 0x7f80);
    assert_int_equal(devio_f32_to_bf16_rne(-INFINITY), 0xff80);
    assert_int_equal(devio_f32_to_bf16_rne(float_of(0x3f808000u)), 0x3f80); /* tie, even */
    assert_int_equal(devio_f32_to_bf16_rne(float_of(0x3f818000u)), 0x3f82);
    assert_int_equal(devio_f32_to_bf16_rne(float_of(0x7f800001u)) & 0x7fc0, 0x7fc0);
    assert_int_equal(devio_f32_to_bf16_rne(0x1p-149f), 0x0000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_expf_accuracy),  cmocka_unit_test(test_expf_vector),
        cmocka_unit_test(test_silu_mul_vector),
        cmocka_unit_test(test_logf_accuracy),
        cmocka_unit_test(test_log1pf_accuracy), cmocka_unit_test(test_exp_log_specials),
        cmocka_unit_test(test_sinf_accuracy),  cmocka_unit_test(test_cosf_accuracy),
        cmocka_unit_test(test_trig_specials),  cmocka_unit_test(test_tanhf_accuracy),
        cmocka_unit_test(test_sigmoid_silu),   cmocka_unit_test(test_rsqrtf),
        cmocka_unit_test(test_softplus),
        cmocka_unit_test(test_powf_pos),       cmocka_unit_test(test_lane_rule),
        cmocka_unit_test(test_f16),            cmocka_unit_test(test_bf16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

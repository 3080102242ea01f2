/* Vectorisable float exp, sigmoid and tanh for the CPU kernels' element loops.
 *
 * libm's expf is a call the compiler cannot vectorise, so an element loop that calls it
 * runs one element at a time. These are static inline, branch-free (selects only) and use
 * only +, −, ×, ÷ and bit moves, so GCC turns a loop over them into AVX-512/AVX2 code.
 * Accuracy (tested in tests/test_kernels.c against libm in double): expf within 2 ulp for
 * normal results, correct overflow to +inf and underflow through the subnormals to 0,
 * NaN in → NaN out. Private to kernels/ and its tests; not part of the public API. */
#ifndef PT_KERNELS_FASTMATH_H
#define PT_KERNELS_FASTMATH_H

#include <math.h>
#include <stdint.h>

/* a·b + c, fused where the target has FMA (one rounding, half the instructions); elsewhere
 * fmaf would be a libm call inside the loop, so the plain expression is used. */
#if defined(__FMA__)
#define FASTMATH_FMA(a, b, c) fmaf((a), (b), (c))
#else
#define FASTMATH_FMA(a, b, c) ((a) * (b) + (c))
#endif

static inline uint32_t fastmath_bits(float x)
{
    union { float f; uint32_t u; } v = { .f = x };
    return v.u;
}

static inline float fastmath_from_bits(uint32_t u)
{
    union { uint32_t u; float f; } v = { .u = u };
    return v.f;
}

/* e^x: x = n·ln2 + r with |r| ≤ ln2/2 (Cody–Waite split of ln2 so that n·C1 is exact),
 * e^r by Cephes' degree-7 polynomial, then 2^n applied as two halves so that results in
 * the subnormal range (n down to −150) are scaled without forming an invalid exponent. */
static inline float fastmath_expf(float x)
{
    /* exp(88.8) overflows and exp(−104) rounds to 0: clamping there keeps n in [−150, 129]
     * while giving the right saturated results. NaN fails both tests and stays NaN. */
    x = x > 88.8f ? 88.8f : x;
    x = x < -104.0f ? -104.0f : x;
    /* Adding 1.5·2^23 rounds to the nearest integer and leaves it in the low mantissa
     * bits, which avoids a float→int conversion (undefined for NaN). */
    const float shifter = 0x1.8p23f;
    float t = FASTMATH_FMA(x, 1.44269504088896341f, shifter);
    float n = t - shifter;
    int32_t ni = (int32_t)(fastmath_bits(t) - fastmath_bits(shifter));
    float r = FASTMATH_FMA(n, -0.693359375f, x);
    r = FASTMATH_FMA(n, 2.12194440e-4f, r);
    float r2 = r * r;
    float p = 1.9875691500e-4f;
    p = FASTMATH_FMA(p, r, 1.3981999507e-3f);
    p = FASTMATH_FMA(p, r, 8.3334519073e-3f);
    p = FASTMATH_FMA(p, r, 4.1665795894e-2f);
    p = FASTMATH_FMA(p, r, 1.6666665459e-1f);
    p = FASTMATH_FMA(p, r, 5.0000001201e-1f);
    p = FASTMATH_FMA(p, r2, r) + 1.0f;
    /* 2^n = 2^n1 · 2^n2 with both halves in the normal exponent range. Unsigned arithmetic:
     * for NaN inputs ni is garbage, and the result is NaN through p anyway. */
    int32_t n1 = ni / 2;
    int32_t n2 = ni - n1;
    float s1 = fastmath_from_bits((uint32_t)(n1 + 127) << 23);
    float s2 = fastmath_from_bits((uint32_t)(n2 + 127) << 23);
    return p * s1 * s2;
}

/* 1/(1+e^−x) for x ≥ 0 and e^x/(1+e^x) for x < 0, both through e = e^−|x| ≤ 1, so nothing
 * overflows and small results keep their relative accuracy. */
static inline float fastmath_sigmoidf(float x)
{
    float e = fastmath_expf(-fabsf(x));
    float num = x >= 0.0f ? 1.0f : e;
    return num / (1.0f + e);
}

/* |x| < 0.625: Cephes' odd polynomial (no cancellation near 0); otherwise
 * (1 − e)/(1 + e) with e = e^−2|x| ≤ 0.29, which saturates to ±1 without overflow. */
static inline float fastmath_tanhf(float x)
{
    float a = fabsf(x);
    float z = x * x;
    float q = -5.70498872745e-3f;
    q = FASTMATH_FMA(q, z, 2.06390887954e-2f);
    q = FASTMATH_FMA(q, z, -5.37397155531e-2f);
    q = FASTMATH_FMA(q, z, 1.33314422036e-1f);
    q = FASTMATH_FMA(q, z, -3.33332819422e-1f);
    float small = FASTMATH_FMA(q * z, x, x);
    float e = fastmath_expf(-2.0f * a);
    float big = (1.0f - e) / (1.0f + e);
    /* tanh is odd: taking the sign from x also keeps tanh(−0) = −0. */
    return copysignf(a < 0.625f ? small : big, x);
}

#endif

// The functions the spec language offers, for host and device, in two precisions.
//
// Functions<Exact> is libm-accurate and is what float32 kernels use. On the host its exp,
// tanh and erf are computed from arithmetic alone, within 1, 2 and 2 ulps (exp_arithmetic
// and below), so that the CPU kernels' loops vectorize; sigmoid is within a few ulps over
// its whole range (see there). Functions<Fast> is for kernels whose results are rounded
// to 16 bits afterwards (float16, bfloat16; PrecisionFor below), on the GPU and on the
// CPU: it trades the last fp32 bits, which that rounding discards anyway, for fewer
// instructions (on the GPU, so those kernels stay memory-bound; on the CPU, where exp and
// erf are most of the time of the ops that use them). Its absolute error stays below 1e-6
// (erf) and a few fp32 ulps (exp, sigmoid); the GPU's flushes results below 2^-126 to
// zero, the CPU's rounds them as Functions<Exact> does.
// Semantics follow torch: minimum/maximum propagate NaN, sign(0) == 0.
#pragma once

#include <cmath>

#include "common.h"
#include "dtype.h"

namespace avo {

#if !defined(__CUDA_ARCH__)
// Horner's rule: c[0] + u * (c[1] + u * (...)), plain products and sums.
template <int N>
inline float polynomial(float u, const float (&c)[N]) {
  float p = c[N - 1];
  for (int i = N - 2; i >= 0; --i) p = p * u + c[i];
  return p;
}

// e^x from arithmetic alone, for the CPU kernels: their loops vectorize where a call to
// libm's expf would keep them one element at a time. x = n ln2 + r with |r| <= ln2/2
// (ln2 in two parts, so that n * kLn2High is exact), e^r = 1 + r + r^2 P(r) with P fitted
// to e^r on that interval, then times 2^n as two powers of two, so that results among the
// subnormals are rounded once. Plain products and sums, no fused multiply-add: every
// instruction set gives the same bits. Inf above 88.73, 0 below -103.98, NaN for NaN.
template <int N>
inline float exp_with(float x, const float (&p_coefficients)[N]) {
  constexpr float kLog2E = 1.44269504f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: a sum this large has no fraction
  constexpr float kLn2High = 0.693359375f, kLn2Low = -2.12194440e-4f;
  const float c = x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x);
  const float t = c * kLog2E + kRound;  // n + kRound, n = round(c / ln2) in [-150, 128]
  const float n = t - kRound;
  const int32_t n_int = int32_t(float_to_bits(t) - float_to_bits(kRound));
  const float r = (c - n * kLn2High) - n * kLn2Low;
  const float p = polynomial(r, p_coefficients);
  const float e = 1.0f + (r + (r * r) * p);
  const int32_t half = n_int / 2;  // 2^n = 2^half * 2^(n - half), each a normal float
  const float scale_1 = bits_to_float(uint32_t(half + 127) << 23);
  const float scale_2 = bits_to_float(uint32_t(n_int - half + 127) << 23);
  const float y = (e * scale_1) * scale_2;
  return x != x ? x : y;
}

// Functions<Exact>'s: P of degree 5 (relative error 1.1e-9 before rounding), within an
// ulp of e^x over every float (tests/test_cpu_math.py).
inline float exp_arithmetic(float x) {
  static constexpr float kP[] = {5.000000000e-01f, 1.666666567e-01f, 4.166626930e-02f,
                                 8.333429694e-03f, 1.394602121e-03f, 1.982649555e-04f};
  return exp_with(x, kP);
}

// Functions<Fast>'s on the host: P of degree 3 (relative error 1.05e-7 before rounding),
// within 2 ulps of e^x over every float (tests/test_cpu_math.py), in 0.88x the time.
inline float exp_arithmetic_fast(float x) {
  static constexpr float kP[] = {4.999923176e-01f, 1.666711445e-01f, 4.189011625e-02f, 8.312526969e-03f};
  return exp_with(x, kP);
}

// tanh x from arithmetic alone (see exp_arithmetic). |x| < 0.55: x + x^3 P(x^2), P fitted
// to tanh on that interval (relative error 4.3e-9 before rounding); above, 1 - 2 / (e^2|x|
// + 1), which no longer cancels. Both are computed and one chosen, so that the loops stay
// vectorizable. Within 2 ulps of tanh over every float (tests/test_cpu_math.py).
inline float tanh_arithmetic(float x) {
  static constexpr float kSmall[] = {-3.333333433e-01f, 1.333331317e-01f, -5.396267772e-02f,
                                     2.180296928e-02f,  -8.474741131e-03f, 2.464027377e-03f};
  const float a = fabsf(x);
  const float u = x * x;
  const float small = x + (x * u) * polynomial(u, kSmall);
  const float large = 1.0f - 2.0f / (exp_arithmetic(2.0f * a) + 1.0f);
  return a < 0.55f ? small : copysignf(large, x);
}

// erf x from arithmetic alone (see exp_arithmetic). |x| < 0.875: x + x Q(x^2), Q fitted to
// erf(x) / x - 1 (relative error 1e-8 before rounding); above, 1 - e^(-x^2) R(t) with
// t = 1 / (1 + |x| / 2) and R fitted to erfc(x) e^(x^2) on [0.875, 4] (relative error
// 3.2e-8; erfc is below half an ulp of 1 from 3.92 on, and R(t) stays finite as t goes to
// 0). Both computed, one chosen. Within 2 ulps of erf over every float
// (tests/test_cpu_math.py).
inline float erf_arithmetic(float x) {
  static constexpr float kSmall[] = {1.283791661e-01f,  -3.761263788e-01f, 1.128374115e-01f, -2.686196938e-02f,
                                     5.207621492e-03f,  -8.220516029e-04f, 8.714052092e-05f};
  static constexpr float kLarge[] = {2.685718027e-05f, 2.814717591e-01f,  2.885926664e-01f, 2.067290843e-01f,
                                     3.382534683e-01f, -3.615582585e-01f, 8.320607543e-01f, -1.091893554e+00f,
                                     7.009007335e-01f, -2.221163660e-01f, 2.752532065e-02f};
  const float a = fabsf(x);
  const float u = x * x;
  const float small = x + x * polynomial(u, kSmall);
  const float t = 1.0f / (1.0f + 0.5f * a);
  const float large = 1.0f - exp_arithmetic(-u) * polynomial(t, kLarge);
  return a < 0.875f ? small : copysignf(large, x);
}

// erf x for Functions<Fast> on the host: the GPU's formula (Abramowitz & Stegun 7.1.26,
// Functions<Fast>::erf below) with an IEEE division and exp_arithmetic_fast; absolute
// error below 1e-6 over every float (tests/test_cpu_math.py), in 0.6x erf_arithmetic's
// time.
inline float erf_arithmetic_fast(float x) {
  static constexpr float kA[] = {2.54829592e-01f, -2.84496736e-01f, 1.421413741f, -1.453152027f, 1.061405429f};
  const float a = fabsf(x);
  const float t = 1.0f / (1.0f + 0.3275911f * a);
  return copysignf(1.0f - (t * polynomial(t, kA)) * exp_arithmetic_fast(-(a * a)), x);
}
#endif

#if defined(__CUDA_ARCH__)
// One hardware instruction each (MUFU.EX2, MUFU.RCP): relative error near 2^-22,
// subnormal inputs and results flushed to zero.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float reciprocal_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
#endif

struct Exact {};
struct Fast {};

template <typename Precision>
struct Functions;

template <>
struct Functions<Exact> {
  AVO_HOST_DEVICE static float exp(float x) {
#if defined(__CUDA_ARCH__)
    return expf(x);
#else
    return exp_arithmetic(x);
#endif
  }
  AVO_HOST_DEVICE static float log(float x) { return logf(x); }
  AVO_HOST_DEVICE static float sqrt(float x) { return sqrtf(x); }
#if defined(__CUDA_ARCH__)
  AVO_HOST_DEVICE static float tanh(float x) { return tanhf(x); }
  AVO_HOST_DEVICE static float erf(float x) { return erff(x); }
#else
  static float tanh(float x) { return tanh_arithmetic(x); }
  static float erf(float x) { return erf_arithmetic(x); }
#endif
  AVO_HOST_DEVICE static float abs(float x) { return fabsf(x); }
  AVO_HOST_DEVICE static float pow(float x, float y) { return powf(x, y); }
  // From e = exp(-|x|) in (0, 1]: 1 / (1 + e) for x >= 0, e / (1 + e) below, which stays
  // accurate where the result is tiny (1 / (1 + e^-x) flushes it to zero once e^-x
  // overflows, below x = -88.7). On the GPU the reciprocal of 1 + e, in [1, 2], is the
  // hardware's refined by one Newton step (within an ulp, no special cases): an IEEE
  // division checks for them and branches, and without it swish_layernorm's fp32 kernels
  // ran 1.13-1.15x faster on the H200.
  AVO_HOST_DEVICE static float sigmoid(float x) {
    const float e = exp(-fabsf(x));
    const float d = 1.0f + e;
#if defined(__CUDA_ARCH__)
    const float r0 = reciprocal_approx(d);
    const float r = fmaf(fmaf(-d, r0, 1.0f), r0, r0);
#else
    const float r = 1.0f / d;
#endif
    return x >= 0.0f ? r : e * r;
  }

  AVO_HOST_DEVICE static float rsqrt(float x) {
#if defined(__CUDA_ARCH__)
    return rsqrtf(x);
#else
    return 1.0f / sqrtf(x);
#endif
  }

  AVO_HOST_DEVICE static float sign(float x) { return float((x > 0.0f) - (x < 0.0f)); }
  // a * b + c rounded once. The generated math writes it for a product whose only use is
  // one sum (generator/emit_c.py), the same in every pass and on every device; nothing
  // else is contracted (the CUDA build passes -fmad=false).
  AVO_HOST_DEVICE static float fma(float a, float b, float c) { return fmaf(a, b, c); }
  AVO_HOST_DEVICE static float minimum(float a, float b) { return (a != a || a < b) ? a : b; }
  AVO_HOST_DEVICE static float maximum(float a, float b) { return (a != a || a > b) ? a : b; }
};

template <>
struct Functions<Fast> : Functions<Exact> {
#if defined(__CUDA_ARCH__)
  static constexpr float kLog2E = 1.4426950408889634f;

  __device__ __forceinline__ static float exp(float x) { return exp2_approx(x * kLog2E); }

  __device__ __forceinline__ static float sigmoid(float x) { return reciprocal_approx(1.0f + exp2_approx(x * -kLog2E)); }

  // Abramowitz & Stegun 7.1.26: erf|x| = 1 - t * P(t) * e^(-x^2), t = 1 / (1 + p|x|);
  // absolute error below 1.5e-7 in exact arithmetic, below 1e-6 in fp32.
  __device__ __forceinline__ static float erf(float x) {
    const float a = fabsf(x);
    const float t = reciprocal_approx(fmaf(0.3275911f, a, 1.0f));
    const float p = fmaf(fmaf(fmaf(fmaf(1.061405429f, t, -1.453152027f), t, 1.421413741f), t, -0.284496736f), t,
                         0.254829592f);
    const float gaussian = exp2_approx((a * -kLog2E) * a);
    return copysignf(fmaf(-t * p, gaussian, 1.0f), x);
  }
#else
  static float exp(float x) { return exp_arithmetic_fast(x); }
  static float erf(float x) { return erf_arithmetic_fast(x); }
  // Functions<Exact>::sigmoid's formula on the shorter exp.
  static float sigmoid(float x) {
    const float e = exp(-fabsf(x));
    const float r = 1.0f / (1.0f + e);
    return x >= 0.0f ? r : e * r;
  }
#endif
};

// The math precision of kernels on element type T, on the GPU and on the CPU: exact for
// float32, fast for the 16-bit types whose rounding hides the difference.
template <typename T>
struct PrecisionOf {
  using type = Fast;
};
template <>
struct PrecisionOf<float> {
  using type = Exact;
};
template <typename T>
using PrecisionFor = typename PrecisionOf<T>::type;

}  // namespace avo

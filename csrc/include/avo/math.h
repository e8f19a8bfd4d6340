// The functions the spec language offers, for host and device, in two precisions.
//
// Functions<Exact> is libm-accurate (sigmoid: within a few ulps over its whole range, see
// there) and is what float32 kernels (and every CPU kernel) use. Functions<Fast> is for
// kernels whose results are rounded to 16 bits afterwards (float16, bfloat16): on the GPU
// it trades the last fp32 bits, which that rounding discards anyway, for fewer
// instructions, so those kernels stay memory-bound. Its absolute error stays below 1e-6
// (erf) and a few fp32 ulps (exp, sigmoid).
// Semantics follow torch: minimum/maximum propagate NaN, sign(0) == 0.
#pragma once

#include <cmath>

#include "common.h"

namespace avo {

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
  AVO_HOST_DEVICE static float exp(float x) { return expf(x); }
  AVO_HOST_DEVICE static float log(float x) { return logf(x); }
  AVO_HOST_DEVICE static float sqrt(float x) { return sqrtf(x); }
  AVO_HOST_DEVICE static float tanh(float x) { return tanhf(x); }
  AVO_HOST_DEVICE static float erf(float x) { return erff(x); }
  AVO_HOST_DEVICE static float abs(float x) { return fabsf(x); }
  AVO_HOST_DEVICE static float pow(float x, float y) { return powf(x, y); }
  // From e = exp(-|x|) in (0, 1]: 1 / (1 + e) for x >= 0, e / (1 + e) below, which stays
  // accurate where the result is tiny (1 / (1 + e^-x) flushes it to zero once e^-x
  // overflows, below x = -88.7). On the GPU the reciprocal of 1 + e, in [1, 2], is the
  // hardware's refined by one Newton step (within an ulp, no special cases): an IEEE
  // division checks for them and branches, and without it swish_layernorm's fp32 kernels
  // ran 1.13-1.15x faster on the H200.
  AVO_HOST_DEVICE static float sigmoid(float x) {
    const float e = expf(-fabsf(x));
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
#endif
};

}  // namespace avo

// Element types and their conversions to and from float.
//
// Kernels load and store fp16/bf16 in their own type and compute in fp32. On the
// host the 16-bit types are plain bit patterns (BFloat16, Half) converted here with
// round-to-nearest-even; in device code the CUDA types (__nv_bfloat16, __half) and
// their conversion instructions are used instead.
#pragma once

#include <cstdint>
#include <cstring>
#include <cmath>

#include "common.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace avo {

enum class DType { Float32, Float16, BFloat16 };

struct BFloat16 {
  uint16_t bits;
};
struct Half {
  uint16_t bits;
};

inline float bits_to_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint32_t float_to_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

// Element<T>::to_float / Element<T>::from_float convert one element; each type's
// specialization lives where it can run (host, device, or both).
template <typename T>
struct Element;

template <>
struct Element<float> {
  AVO_HOST_DEVICE static float to_float(float x) { return x; }
  AVO_HOST_DEVICE static float from_float(float x) { return x; }
};

template <>
struct Element<BFloat16> {
  static float to_float(BFloat16 x) { return bits_to_float(uint32_t(x.bits) << 16); }

  static BFloat16 from_float(float x) {
    uint32_t bits = float_to_bits(x);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return BFloat16{uint16_t((bits >> 16) | 0x40u)};  // quiet NaN
    bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest, ties to even
    return BFloat16{uint16_t(bits >> 16)};
  }
};

template <>
struct Element<Half> {
  static float to_float(Half x) {
    const uint32_t sign = uint32_t(x.bits & 0x8000u) << 16;
    const uint32_t exponent = (x.bits >> 10) & 0x1fu;
    const uint32_t mantissa = x.bits & 0x3ffu;
    if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
      const float magnitude = float(mantissa) * 5.9604644775390625e-08f;
      return sign ? -magnitude : magnitude;
    }
    // Infinity; a NaN keeps its payload and comes out quiet, as the F16C instruction
    // (avo/cpu_copies.h) converts it.
    if (exponent == 31) return bits_to_float(sign | 0x7f800000u | (mantissa << 13) | (mantissa != 0 ? 0x400000u : 0u));
    return bits_to_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  }

  static Half from_float(float x) {
    const uint32_t bits = float_to_bits(x);
    const uint32_t sign = (bits >> 16) & 0x8000u;
    const uint32_t magnitude = bits & 0x7fffffffu;
    // NaN: quiet, with the payload's top bits, as the F16C instruction converts it.
    if (magnitude > 0x7f800000u) return Half{uint16_t(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu))};
    if (magnitude >= 0x477ff000u) return Half{uint16_t(sign | 0x7c00u)};  // rounds to infinity
    if (magnitude < 0x38800000u) {  // below 2^-14: a subnormal half, in units of 2^-24
      const float units = bits_to_float(magnitude) * 16777216.0f;  // exact: a power-of-two scale
      // Rounded to an integer, ties to even, by adding and taking away 2^23 (floats that
      // large have no fraction): plain arithmetic, which vectorizes where nearbyint may be
      // a call into libm.
      const float rounded = (units + 8388608.0f) - 8388608.0f;
      return Half{uint16_t(sign | uint32_t(rounded))};
    }
    uint32_t half_bits = ((magnitude >> 23) - 112u) << 10 | ((magnitude >> 13) & 0x3ffu);
    const uint32_t dropped = magnitude & 0x1fffu;
    // Round to nearest, ties to even; a carry into the exponent is still correct.
    if (dropped > 0x1000u || (dropped == 0x1000u && (half_bits & 1u))) half_bits += 1;
    return Half{uint16_t(sign | half_bits)};
  }

  // to_float(from_float(x)), the value a float16 tensor holds for x, in float arithmetic
  // that vectorizes in a few instructions (the CPU rows' as_stored: add_layernorm's and
  // add_rmsnorm's hidden). The same bits, NaN payloads included (tests/cpp/check_cpu_math.cpp).
  static float round(float x) {
    const uint32_t bits = float_to_bits(x);
    const float magnitude = fabsf(x);
    // Adding 2^(e + 13), e the exponent of |x| (at least -14, the subnormal halves'),
    // leaves the sum the ulp of a half of that exponent: the sum rounds |x| to nearest, ties
    // to even, and taking 2^(e + 13) away again is exact.
    const uint32_t exponent = bits & 0x7f800000u;
    const float shift = bits_to_float((exponent > (113u << 23) ? exponent : (113u << 23)) + (13u << 23));
    const float rounded = (magnitude + shift) - shift;
    const float finite = magnitude >= 65520.0f ? INFINITY : rounded;  // 65520 and up round to infinity
    const float nan = bits_to_float((bits & 0xffffe000u) | 0x7fc00000u);
    return x != x ? nan : copysignf(finite, x);
  }
};

#if defined(__CUDACC__)
template <>
struct Element<__nv_bfloat16> {
  __device__ __forceinline__ static float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  __device__ __forceinline__ static __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
};

template <>
struct Element<__half> {
  __device__ __forceinline__ static float to_float(__half x) { return __half2float(x); }
  __device__ __forceinline__ static __half from_float(float x) { return __float2half_rn(x); }
};
#endif

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<element type>{}) for `dtype`; the caller names its 16-bit element
// types (avo::Half and avo::BFloat16 on the host, __half and __nv_bfloat16 on the GPU).
template <typename HalfType, typename BFloat16Type, typename F>
void visit_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::Float32: f(TypeTag<float>{}); break;
    case DType::Float16: f(TypeTag<HalfType>{}); break;
    case DType::BFloat16: f(TypeTag<BFloat16Type>{}); break;
  }
}

}  // namespace avo

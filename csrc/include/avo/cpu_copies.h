// The CPU kernels' outermost loops (avo/row_cpu.h, avo/map_cpu.h) compiled for several
// instruction sets, and the choice between them. No torch headers (DESIGN.md).
//
// With GCC 12 or later on x86-64 Linux each loop is compiled three times: for AVX-512
// (x86-64-v4), AVX2 with FMA (x86-64-v3) and the x86-64 baseline (SSE2). A call runs the
// best copy the machine has, or the one a test or benchmark asked for (set_cpu_copy in
// avo_ops._C). `flatten` inlines the generated math into each copy, so that it is
// compiled, and vectorized, for that instruction set too. The copies give the same bits:
// the build passes -ffp-contract=off, so a fused multiply-add is only ever the one the
// generated math asks for (F::fma), which every instruction set rounds alike
// (tests/test_cpu_copies.py compares them); float16 conversions by F16C (the AVX2 and
// AVX-512 copies) or in software (the baseline) give the same bits too. Which NaN a
// result carries aside (its sign and payload): where both operands of a sum or product
// are NaN, the instruction passes one on, and the compiler orders the operands of each
// copy as it likes (softmax of a row with NaNs of both signs). Elsewhere, or where the
// build defines AVO_ONE_CPU_COPY, there is one copy, for the build's target.
#pragma once

#if defined(__CUDACC__)
#error "avo/cpu_copies.h is for the CPU kernels"
#endif

#include <atomic>
#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>  // F16C, for the copies that have it
#endif

#include "dtype.h"

namespace avo {

enum class CpuCopy : int { kAuto, kBaseline, kAvx2, kAvx512 };

#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12 && defined(__x86_64__) && defined(__linux__) && \
    !defined(AVO_ONE_CPU_COPY)
#define AVO_CPU_COPIES 1
#else
#define AVO_CPU_COPIES 0
#endif

// Whether copy c converts float16 with the F16C instructions (halves_to_floats and
// floats_to_halves below), which the AVX2 and AVX-512 machines have: element by element,
// the software conversions of Element<Half> vectorize but took most of the time of the
// float16 kernels (2-9x torch's, where bfloat16's took 1.2-3.4x).
constexpr bool converts_halves_in_hardware(CpuCopy c) {
  return AVO_CPU_COPIES && (c == CpuCopy::kAvx2 || c == CpuCopy::kAvx512);
}

// n float16 values to floats and back (round to nearest, ties to even): 8 at a time by
// F16C where the build has the copies, the rest by Element<Half>, which gives the same
// bits, NaN payloads included (tests/cpp/check_cpu_math.cpp). Only the copies that have
// F16C call them (converts_halves_in_hardware).
#if AVO_CPU_COPIES
#define AVO_F16C __attribute__((target("arch=x86-64-v3")))
#else
#define AVO_F16C
#endif
AVO_F16C inline void halves_to_floats(const Half* in, float* out, int64_t n) {
  const int64_t whole = AVO_CPU_COPIES ? n - n % 8 : 0;  // the elements F16C converts
#if AVO_CPU_COPIES
  for (int64_t i = 0; i < whole; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
#endif
  for (int64_t i = whole; i < n; ++i) out[i] = Element<Half>::to_float(in[i]);
}
AVO_F16C inline void floats_to_halves(const float* in, Half* out, int64_t n) {
  const int64_t whole = AVO_CPU_COPIES ? n - n % 8 : 0;
#if AVO_CPU_COPIES
  for (int64_t i = 0; i < whole; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
  for (int64_t i = whole; i < n; ++i) out[i] = Element<Half>::from_float(in[i]);
}
#undef AVO_F16C

// Whether this build has copy c and this machine can run it. A one-copy build has
// kBaseline alone (its copy, whatever the build's target).
inline bool cpu_copy_available(CpuCopy c) {
  switch (c) {
    case CpuCopy::kBaseline:
      return true;
#if AVO_CPU_COPIES
    case CpuCopy::kAvx2:
      return __builtin_cpu_supports("x86-64-v3");
    case CpuCopy::kAvx512:
      return __builtin_cpu_supports("x86-64-v4");
#endif
    default:
      return false;
  }
}

// The copy every call runs while not kAuto (set_cpu_copy, for tests and benchmarks; the
// caller checks cpu_copy_available).
inline CpuCopy& forced_cpu_copy() {
  static CpuCopy forced = CpuCopy::kAuto;
  return forced;
}

// The copy a call runs now: the forced one, else the best this machine has.
inline CpuCopy cpu_copy() {
  if (forced_cpu_copy() != CpuCopy::kAuto) return forced_cpu_copy();
  static const CpuCopy best = cpu_copy_available(CpuCopy::kAvx512) ? CpuCopy::kAvx512
                              : cpu_copy_available(CpuCopy::kAvx2) ? CpuCopy::kAvx2
                                                                   : CpuCopy::kBaseline;
  return best;
}

// The copy the last CPU kernel ran (last_cpu_copy in avo_ops._C, for tests: that a copy
// set_cpu_copy asked for is the one that runs). kAuto before any. The workers of a call
// all store the same value.
inline std::atomic<CpuCopy>& last_cpu_copy() {
  static std::atomic<CpuCopy> last{CpuCopy::kAuto};
  return last;
}

namespace cpu_copies {
// Kernel::run<copy>(a...), inlined whole into a function compiled for one instruction set.
#if AVO_CPU_COPIES
template <typename Kernel, typename... A>
__attribute__((target("arch=x86-64-v4"), flatten)) void avx512(const A&... a) {
  Kernel::template run<CpuCopy::kAvx512>(a...);
}
template <typename Kernel, typename... A>
__attribute__((target("arch=x86-64-v3"), flatten)) void avx2(const A&... a) {
  Kernel::template run<CpuCopy::kAvx2>(a...);
}
#endif
template <typename Kernel, typename... A>
__attribute__((flatten)) void baseline(const A&... a) {
  Kernel::template run<CpuCopy::kBaseline>(a...);
}
}  // namespace cpu_copies

// Runs Kernel::run<copy>(a...) (a CPU kernel's outermost loop) in the copy cpu_copy()
// names; the copy is a template argument, for what only some copies do
// (converts_halves_in_hardware).
template <typename Kernel, typename... A>
void run_cpu_copy(const A&... a) {
#if AVO_CPU_COPIES
  const CpuCopy copy = cpu_copy();
#else
  const CpuCopy copy = CpuCopy::kBaseline;
#endif
  last_cpu_copy().store(copy, std::memory_order_relaxed);
#if AVO_CPU_COPIES
  switch (copy) {
    case CpuCopy::kAvx512:
      return cpu_copies::avx512<Kernel>(a...);
    case CpuCopy::kAvx2:
      return cpu_copies::avx2<Kernel>(a...);
    default:
      break;
  }
#endif
  cpu_copies::baseline<Kernel>(a...);
}

}  // namespace avo

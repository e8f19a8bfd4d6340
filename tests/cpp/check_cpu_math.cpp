// Checks the CPU kernels' arithmetic functions (avo/math.h) against the C library's
// double-precision ones over float inputs, and their float16 conversions (avo/dtype.h)
// against the compiler's _Float16; tests/test_cpu_math.py compiles and runs it with the
// kernels' flags. Usage: check_cpu_math STRIDE [functions|half|f16c]. Every STRIDE-th float is
// checked, and every float near the ends of the ranges. It prints one line a check and
// exits 1 when one fails: a function further than its bound from the rounded double
// result (in ulps; Functions<Fast>::erf absolutely), a conversion that differs from
// _Float16's (3 when this compiler has none).
#include <avo/cpu_copies.h>
#include <avo/math.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <vector>

namespace {

// Distance in units in the last place between two floats (0 for two NaNs).
int64_t ulps_apart(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b) ? 0 : INT64_MAX;
  auto ordered = [](float f) {
    int32_t i;
    std::memcpy(&i, &f, sizeof i);
    return i < 0 ? int64_t(INT32_MIN) - i : int64_t(i);
  };
  const int64_t d = ordered(a) - ordered(b);
  return d < 0 ? -d : d;
}

struct Result {
  int64_t checked = 0, worst = 0;
  float worst_at = 0.0f;
};

template <typename Got, typename Want>
void check_one(Result& res, float x, Got got, Want want) {
  const int64_t d = ulps_apart(got(x), float(want(double(x))));
  ++res.checked;
  if (d > res.worst) {
    res.worst = d;
    res.worst_at = x;
  }
}

// visit(x) for every stride-th float bit pattern, and every one within 2^16 patterns of
// each listed value.
template <typename Visit>
void for_each_float(uint64_t stride, std::initializer_list<float> edges, Visit visit) {
  for (uint64_t bits = 0; bits < (uint64_t(1) << 32); bits += stride) visit(avo::bits_to_float(uint32_t(bits)));
  constexpr int64_t kEdge = 1 << 16;
  for (float e : edges) {
    const int64_t center = avo::float_to_bits(e);
    for (int64_t b = center - kEdge; b <= center + kEdge; ++b) visit(avo::bits_to_float(uint32_t(b)));
  }
}

template <typename Got, typename Want>
Result check_all(uint64_t stride, Got got, Want want, std::initializer_list<float> edges) {
  Result res;
  for_each_float(stride, edges, [&](float x) { check_one(res, x, got, want); });
  return res;
}

// The largest absolute difference between got(x) and want(double(x)) over the floats
// for_each_float visits (for a function bounded absolutely: Functions<Fast>::erf).
struct AbsoluteResult {
  int64_t checked = 0;
  double worst = 0.0;
  float worst_at = 0.0f;
};

template <typename Got, typename Want>
AbsoluteResult check_all_absolute(uint64_t stride, Got got, Want want, std::initializer_list<float> edges) {
  AbsoluteResult res;
  for_each_float(stride, edges, [&](float x) {
    const double g = got(x), w = want(double(x));
    const double d = std::isnan(g) || std::isnan(w) ? (std::isnan(g) && std::isnan(w) ? 0.0 : INFINITY)
                                                    : std::fabs(g - w);
    ++res.checked;
    if (d > res.worst) {
      res.worst = d;
      res.worst_at = x;
    }
  });
  return res;
}

bool report_absolute(const char* name, const AbsoluteResult& res, double bound) {
  std::printf("%s: %lld floats, worst %.3g absolute (at %.9g), bound %.3g\n", name, (long long)res.checked,
              res.worst, double(res.worst_at), bound);
  return res.worst <= bound;
}

bool report(const char* name, const Result& res, int64_t bound) {
  std::printf("%s: %lld floats, worst %lld ulp (at %.9g), bound %lld\n", name, (long long)res.checked,
              (long long)res.worst, double(res.worst_at), (long long)bound);
  return res.worst <= bound;
}

}  // namespace

// Float16 conversions: every half to float, and float to half (round to nearest, ties to
// even; NaN to a quiet NaN) on every stride-th float and every float near the rounding
// boundaries (the subnormal halves, the largest half, infinity).
int check_half(uint64_t stride) {
#if defined(__FLT16_MAX__)
  int64_t checked = 0, wrong = 0;
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    _Float16 h;
    const uint16_t b16 = uint16_t(bits);
    std::memcpy(&h, &b16, sizeof h);
    const float want = float(h), got = avo::Element<avo::Half>::to_float(avo::Half{b16});
    ++checked;
    if (avo::float_to_bits(want) != avo::float_to_bits(got) && !(std::isnan(want) && std::isnan(got))) ++wrong;
  }
  auto to_half = [&](float x) {
    const _Float16 h = _Float16(x);
    uint16_t want;
    std::memcpy(&want, &h, sizeof want);
    const uint16_t got = avo::Element<avo::Half>::from_float(x).bits;
    const bool both_nan = (want & 0x7fffu) > 0x7c00u && (got & 0x7fffu) > 0x7c00u;
    ++checked;
    if (got != want && !both_nan) ++wrong;
  };
  // Element<Half>::round, the round trip in float arithmetic, against the round trip.
  int64_t rounded = 0, wrong_rounding = 0;
  auto round_trip = [&](float x) {
    const float want = avo::Element<avo::Half>::to_float(avo::Element<avo::Half>::from_float(x));
    ++rounded;
    wrong_rounding += avo::float_to_bits(avo::Element<avo::Half>::round(x)) != avo::float_to_bits(want);
  };
  const std::initializer_list<float> edges = {0.0f, -0.0f, 5.9604645e-08f, -5.9604645e-08f, 6.1035156e-05f,
                                              -6.1035156e-05f, 65504.0f, -65504.0f, 65520.0f, -65520.0f,
                                              avo::bits_to_float(0x7f800000u), avo::bits_to_float(0xffc00000u)};
  for_each_float(stride, edges, to_half);
  for_each_float(stride, edges, round_trip);
  std::printf("half: %lld conversions, %lld differ from _Float16's; %lld round trips, %lld differ from "
              "Element<Half>::round's\n",
              (long long)checked, (long long)wrong, (long long)rounded, (long long)wrong_rounding);
  return wrong == 0 && wrong_rounding == 0 ? 0 : 1;
#else
  (void)stride;
  std::printf("half: this compiler has no _Float16\n");
  return 3;
#endif
}

// The F16C conversions of the CPU kernels' float16 rows (avo/cpu_copies.h,
// halves_to_floats and floats_to_halves, 8 at a time) against Element<Half>'s, bit for
// bit, NaN payloads included: every half, and every stride-th float and every float near
// the rounding boundaries and among the NaNs. 3 where the build or machine has no F16C.
int check_f16c(uint64_t stride) {
#if AVO_CPU_COPIES
  if (!__builtin_cpu_supports("f16c")) {
    std::printf("f16c: this machine has no F16C\n");
    return 3;
  }
  int64_t checked = 0, wrong = 0;
  std::vector<avo::Half> halves(65536);
  std::vector<float> floats(65536);
  for (uint32_t bits = 0; bits < 65536; ++bits) halves[bits] = avo::Half{uint16_t(bits)};
  avo::halves_to_floats(halves.data(), floats.data(), 65536);
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    ++checked;
    wrong += avo::float_to_bits(floats[bits]) != avo::float_to_bits(avo::Element<avo::Half>::to_float(halves[bits]));
  }
  constexpr size_t kBatch = 4096;  // a multiple of 8: every value goes through F16C
  std::vector<float> batch;
  std::vector<avo::Half> converted(kBatch);
  auto flush = [&] {
    avo::floats_to_halves(batch.data(), converted.data(), int64_t(batch.size()));
    for (size_t i = 0; i < batch.size(); ++i) {
      ++checked;
      wrong += converted[i].bits != avo::Element<avo::Half>::from_float(batch[i]).bits;
    }
    batch.clear();
  };
  for_each_float(stride,
                 {0.0f, -0.0f, 5.9604645e-08f, 6.1035156e-05f, 65504.0f, 65520.0f, -65520.0f,
                  avo::bits_to_float(0x7f800000u), avo::bits_to_float(0x7fc00000u), avo::bits_to_float(0xffa00000u),
                  avo::bits_to_float(0x7fffffffu)},
                 [&](float x) {
                   batch.push_back(x);
                   if (batch.size() == kBatch) flush();
                 });
  while (batch.size() % 8 != 0) batch.push_back(0.0f);
  flush();
  std::printf("f16c: %lld conversions, %lld differ from Element<Half>'s\n", (long long)checked, (long long)wrong);
  return wrong == 0 ? 0 : 1;
#else
  (void)stride;
  std::printf("f16c: this build has no copies of the CPU kernels\n");
  return 3;
#endif
}

int main(int argc, char** argv) {
  const uint64_t stride = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1;
  if (stride == 0) return 2;
  if (argc > 2 && std::strcmp(argv[2], "half") == 0) return check_half(stride);
  if (argc > 2 && std::strcmp(argv[2], "f16c") == 0) return check_f16c(stride);
  bool ok = true;
  // The ends of exp's range: overflow, the subnormal results, underflow to zero, 0.
  const Result exp = check_all(
      stride, [](float x) { return avo::exp_arithmetic(x); }, [](double x) { return std::exp(x); },
      {88.72283f, -87.33655f, -103.27893f, -103.97208f, 0.0f, -0.0f});
  ok &= report("exp", exp, 1);
  // tanh: where its two formulas meet, and where it reaches 1.
  const Result tanh = check_all(
      stride, [](float x) { return avo::tanh_arithmetic(x); }, [](double x) { return std::tanh(x); },
      {0.55f, -0.55f, 9.0f, 0.0f});
  ok &= report("tanh", tanh, 2);
  // erf: where its two formulas meet, and where it reaches 1.
  const Result erf = check_all(
      stride, [](float x) { return avo::erf_arithmetic(x); }, [](double x) { return std::erf(x); },
      {0.875f, -0.875f, 3.92f, 0.0f});
  ok &= report("erf", erf, 2);
  // Functions<Fast> on the host (the 16-bit CPU kernels): exp's shorter polynomial, the
  // sigmoid from it, erf's one formula.
  using Fast = avo::Functions<avo::Fast>;
  const Result exp_fast = check_all(
      stride, [](float x) { return Fast::exp(x); }, [](double x) { return std::exp(x); },
      {88.72283f, -87.33655f, -103.27893f, -103.97208f, 0.0f, -0.0f});
  ok &= report("exp_fast", exp_fast, 2);
  const Result sigmoid_fast = check_all(
      stride, [](float x) { return Fast::sigmoid(x); }, [](double x) { return 1.0 / (1.0 + std::exp(-x)); },
      {0.0f, -87.33655f, -103.27893f, 16.6355f});
  ok &= report("sigmoid_fast", sigmoid_fast, 4);
  const AbsoluteResult erf_fast = check_all_absolute(
      stride, [](float x) { return Fast::erf(x); }, [](double x) { return std::erf(x); }, {0.0f, 1.0f, -1.0f, 3.92f});
  ok &= report_absolute("erf_fast", erf_fast, 1e-6);
  return ok ? 0 : 1;
}

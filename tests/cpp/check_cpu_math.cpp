// Checks the CPU kernels' arithmetic functions (avo/math.h) against the C library's
// double-precision ones over float inputs; tests/test_cpu_math.py compiles and runs it
// with the kernels' flags. Usage: check_cpu_math STRIDE. Every STRIDE-th float is
// checked, and every float near the ends of the ranges. It prints one line a function and
// exits 1 when one is further than its bound from the rounded double result.
#include <avo/math.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

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

// Every stride-th bit pattern, and every one within `edge` patterns of each listed value.
template <typename Got, typename Want>
Result check_all(uint64_t stride, Got got, Want want, std::initializer_list<float> edges) {
  Result res;
  for (uint64_t bits = 0; bits < (uint64_t(1) << 32); bits += stride)
    check_one(res, avo::bits_to_float(uint32_t(bits)), got, want);
  constexpr int64_t kEdge = 1 << 16;
  for (float e : edges) {
    const int64_t center = avo::float_to_bits(e);
    for (int64_t b = center - kEdge; b <= center + kEdge; ++b)
      check_one(res, avo::bits_to_float(uint32_t(b)), got, want);
  }
  return res;
}

bool report(const char* name, const Result& res, int64_t bound) {
  std::printf("%s: %lld floats, worst %lld ulp (at %.9g), bound %lld\n", name, (long long)res.checked,
              (long long)res.worst, double(res.worst_at), (long long)bound);
  return res.worst <= bound;
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t stride = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1;
  if (stride == 0) return 2;
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
  return ok ? 0 : 1;
}

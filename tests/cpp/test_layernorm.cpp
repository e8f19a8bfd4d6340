// C++ test of the libtorch build: calls avo::layernorm and avo::layernorm_backward through
// the dispatcher and compares them with ATen's layer norm computed in float64, and checks
// backward() through the op (its C++ Autograd kernel), on the CPU
// and, when the library has CUDA kernels and a GPU is present, on CUDA.
// Exits non-zero on any failure. AVO_TEST_REQUIRE_CUDA=1 makes a skipped CUDA part a failure.
#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/native_layer_norm.h>
#include <ATen/ops/native_layer_norm_backward.h>
#include <ATen/ops/randn.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace {

using Forward = at::Tensor(const at::Tensor&, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                           double);
// avo::layernorm_forward: y and the per-row mu and rstd (float32) that the backward reads.
using Saving = std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&, const std::optional<at::Tensor>&,
                                                              const std::optional<at::Tensor>&, double);
// avo::layernorm_backward(grad_y, mu, rstd, x, weight, bias, eps).
using Backward = std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                const at::Tensor&, const at::Tensor&,
                                                                const std::optional<at::Tensor>&,
                                                                const std::optional<at::Tensor>&, double);

constexpr double kFp32Eps = 1.1920928955078125e-07;

struct Tolerance {
  double rtol, atol;
};

// The tolerances of tests/conftest.py: about four times the rounding of the output dtype.
Tolerance tolerance_of(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return {2e-5, 1e-6};
    case at::kHalf: return {2e-3, 1e-5};
    case at::kBFloat16: return {1.6e-2, 1e-5};
    default: TORCH_CHECK(false, "no tolerance for ", dtype);
  }
}

const char* dtype_name(at::ScalarType dtype) {
  return dtype == at::kFloat ? "float32"
         : dtype == at::kHalf ? "float16"
         : dtype == at::kBFloat16 ? "bfloat16"
                                  : c10::toString(dtype);
}

int checks = 0;
int failures = 0;

void fail(const std::string& what) {
  ++failures;
  std::printf("FAIL %s\n", what.c_str());
}

std::string shape_text(at::IntArrayRef sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + "]";
}

double max_abs(const at::Tensor& t) {
  return t.defined() && t.numel() > 0 ? t.abs().max().item<double>() : 0.0;
}

// max |actual - expected| / (atol + rtol |expected|): at most 1 passes; NaN fails.
double error_ratio(const at::Tensor& actual, const at::Tensor& expected64, double rtol, double atol) {
  if (expected64.numel() == 0) return 0.0;
  const at::Tensor a = actual.to(at::kCPU).to(at::kDouble);
  const at::Tensor ratio = (a - expected64).abs() / (expected64.abs() * rtol + atol);
  return ratio.max().item<double>();
}

// Checks one result against its float64 reference. `scale`: the size of the terms the
// result is computed from; the absolute tolerance grows to 16 fp32 eps of it (a
// normalized value or a gradient is a difference of such terms). Returns the error ratio.
double check(const std::string& what, const at::Tensor& actual, const at::Tensor& expected64, at::ScalarType dtype,
             at::Device device, double scale) {
  ++checks;
  if (actual.scalar_type() != dtype || actual.device() != device || actual.sizes() != expected64.sizes() ||
      !actual.is_contiguous()) {
    fail(what + ": got a " + std::string(dtype_name(actual.scalar_type())) + " tensor of shape " +
         shape_text(actual.sizes()) + " on " + actual.device().str() + ", expected " +
         std::string(dtype_name(dtype)) + " " + shape_text(expected64.sizes()) + " on " + device.str() +
         ", contiguous");
    return std::numeric_limits<double>::infinity();
  }
  const Tolerance tol = tolerance_of(dtype);
  const double atol = std::max(tol.atol, 16 * kFp32Eps * scale);
  const double ratio = error_ratio(actual, expected64, tol.rtol, atol);
  if (!(ratio <= 1.0)) {
    char text[160];
    std::snprintf(text, sizeof(text), ": error %.3g times the tolerance (rtol %.3g, atol %.3g)", ratio, tol.rtol,
                  atol);
    fail(what + text);
  }
  return ratio;
}

struct Case {
  std::vector<int64_t> shape;
  double eps;
  bool transposed;  // x is a non-contiguous view
};

const char* params_name(bool weight, bool bias) {
  return weight ? (bias ? "weight+bias" : "weight") : (bias ? "bias" : "no params");
}

at::Tensor make_x(const Case& c, at::ScalarType dtype, at::Device device) {
  at::Tensor x;
  if (c.transposed) {
    x = at::randn({c.shape[1], c.shape[0]}, at::kFloat).t();
  } else {
    x = at::randn(c.shape, at::kFloat);
  }
  // Rounded to dtype on the CPU, so that the reference sees the same values.
  return (x * 2 + 0.5).to(dtype).to(device);
}

// Forward: every combination of weight and bias, against at::layer_norm in float64.
void check_forward(const c10::TypedOperatorHandle<Forward>& layernorm, at::Device device, at::ScalarType dtype,
                   const Case& c) {
  const at::Tensor x = make_x(c, dtype, device);
  const int64_t n = c.shape.back();
  const at::Tensor w = (at::randn({n}, at::kFloat) * 0.5 + 1).to(dtype).to(device);
  const at::Tensor b = at::randn({n}, at::kFloat).to(dtype).to(device);
  const at::Tensor x64 = x.to(at::kCPU).to(at::kDouble);
  const at::Tensor w64 = w.to(at::kCPU).to(at::kDouble), b64 = b.to(at::kCPU).to(at::kDouble);
  double worst = 0;
  for (int mask = 0; mask < 4; ++mask) {
    const bool has_w = mask & 1, has_b = mask & 2;
    const std::optional<at::Tensor> wo = has_w ? std::optional<at::Tensor>(w) : std::nullopt;
    const std::optional<at::Tensor> bo = has_b ? std::optional<at::Tensor>(b) : std::nullopt;
    const at::Tensor expected = at::layer_norm(x64, {n}, has_w ? std::optional<at::Tensor>(w64) : std::nullopt,
                                               has_b ? std::optional<at::Tensor>(b64) : std::nullopt, c.eps);
    const at::Tensor y = layernorm.call(x, wo, bo, c.eps);
    const double scale = max_abs(expected) + (has_b ? max_abs(b64) : 0.0);
    const std::string what = "layernorm " + device.str() + " " + dtype_name(dtype) + " x" +
                             shape_text(c.shape) + " " + params_name(has_w, has_b);
    worst = std::max(worst, check(what, y, expected, dtype, device, scale));
  }
  std::printf("  layernorm          %-6s %-8s x%-13s eps %-6g 4 weight/bias combinations%s: "
              "worst error %.2f of tolerance\n",
              device.str().c_str(), dtype_name(dtype), shape_text(c.shape).c_str(), c.eps,
              c.transposed ? ", x non-contiguous" : "", worst);
}

// Backward: the mu and rstd avo::layernorm_forward saves, then grad_x, grad_weight and
// grad_bias from them, against at::native_layer_norm(_backward) in float64.
void check_backward(const c10::TypedOperatorHandle<Saving>& layernorm_forward,
                    const c10::TypedOperatorHandle<Backward>& layernorm_backward, at::Device device,
                    at::ScalarType dtype, const Case& c, bool params) {
  const at::Tensor x = make_x(c, dtype, device);
  const int64_t n = c.shape.back();
  const at::Tensor g = at::randn(c.shape, at::kFloat).to(dtype).to(device);
  const at::Tensor w = (at::randn({n}, at::kFloat) * 0.5 + 1).to(dtype).to(device);
  const at::Tensor b = at::randn({n}, at::kFloat).to(dtype).to(device);
  const at::Tensor x64 = x.to(at::kCPU).to(at::kDouble), g64 = g.to(at::kCPU).to(at::kDouble);
  std::optional<at::Tensor> w64, b64;
  if (params) {
    w64 = w.to(at::kCPU).to(at::kDouble);
    b64 = b.to(at::kCPU).to(at::kDouble);
  }

  const auto [y64, mean, rstd] = at::native_layer_norm(x64, {n}, w64, b64, c.eps);
  const auto [gx64, gw64, gb64] =
      at::native_layer_norm_backward(g64, x64, {n}, mean, rstd, w64, b64, {true, params, params});
  const std::optional<at::Tensor> w_given = params ? std::optional<at::Tensor>(w) : std::nullopt;
  const std::optional<at::Tensor> b_given = params ? std::optional<at::Tensor>(b) : std::nullopt;
  const auto [y, mu, rs] = layernorm_forward.call(x, w_given, b_given, c.eps);
  const auto [gx, gw, gb] = layernorm_backward.call(g, mu, rs, x, w_given, b_given, c.eps);

  // The sizes of the terms each gradient is a sum or difference of.
  const at::Tensor x_hat = (x64 - mean) * rstd;
  const at::Tensor gw_y = params ? g64 * *w64 : g64;
  const double rows = static_cast<double>(x64.numel() / std::max<int64_t>(n, 1));
  const double gx_scale = max_abs(rstd) * max_abs(gw_y) * (2 + max_abs(x_hat));
  const std::string what = "layernorm_backward " + device.str() + " " + dtype_name(dtype) + " x" +
                           shape_text(c.shape) + " " + params_name(params, params);
  // mean and rstd are [rows, 1] in at::native_layer_norm, [rows] here.
  double worst = check(what + " mu", mu, mean.view(mu.sizes()), at::kFloat, device, max_abs(x64));
  worst = std::max(worst, check(what + " rstd", rs, rstd.view(rs.sizes()), at::kFloat, device, max_abs(rstd)));
  worst = std::max(worst, check(what + " grad_x", gx, gx64, dtype, device, gx_scale));
  if (params) {
    worst = std::max(worst, check(what + " grad_weight", gw, gw64, dtype, device, rows * max_abs(g64 * x_hat)));
    worst = std::max(worst, check(what + " grad_bias", gb, gb64, dtype, device, rows * max_abs(g64)));
  } else {
    ++checks;  // without the parameters their gradients are empty tensors
    if (gw.numel() != 0 || gb.numel() != 0) fail(what + ": grad_weight and grad_bias should be empty");
  }
  std::printf("  layernorm_backward %-6s %-8s x%-13s %-11s: worst error %.2f of tolerance\n", device.str().c_str(),
              dtype_name(dtype), shape_text(c.shape).c_str(), params ? "weight+bias" : "no params", worst);
}

// The op is differentiable from C++ too (its Autograd kernel is registered by the
// library): backward() through avo::layernorm gives exactly what avo::layernorm_backward
// computes, for x, weight and bias.
void check_autograd(const c10::TypedOperatorHandle<Forward>& layernorm,
                    const c10::TypedOperatorHandle<Saving>& layernorm_forward,
                    const c10::TypedOperatorHandle<Backward>& layernorm_backward, at::Device device) {
  ++checks;
  const at::Tensor x = at::randn({6, 40}).to(device).set_requires_grad(true);
  const at::Tensor w = at::randn({40}).to(device).set_requires_grad(true);
  const at::Tensor b = at::randn({40}).to(device).set_requires_grad(true);
  const at::Tensor g = at::randn({6, 40}).to(device);
  layernorm.call(x, w, b, 1e-5).backward(g);
  const auto [y, mu, rstd] = layernorm_forward.call(x.detach(), w.detach(), b.detach(), 1e-5);
  const auto [gx, gw, gb] = layernorm_backward.call(g, mu, rstd, x.detach(), w.detach(), b.detach(), 1e-5);
  const bool same = x.grad().defined() && w.grad().defined() && b.grad().defined() && x.grad().equal(gx) &&
                    w.grad().equal(gw) && b.grad().equal(gb);
  if (!same) fail("layernorm " + device.str() + ": backward() through the op differs from avo::layernorm_backward");
  else std::printf("  layernorm          %-6s backward() through the op: x, weight and bias gradients as "
                   "avo::layernorm_backward\n", device.str().c_str());
}

// Argument errors come back as c10::Error naming the op and the argument.
void check_error(const c10::TypedOperatorHandle<Forward>& layernorm, at::Device device) {
  ++checks;
  const at::Tensor x = at::randn({4, 8}).to(device);
  const at::Tensor bad_weight = at::randn({9}).to(device);
  try {
    layernorm.call(x, bad_weight, std::nullopt, 1e-5);
    fail("layernorm " + device.str() + " with a [9] weight for x [4, 8]: no error raised");
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    if (message.find("avo::layernorm") == std::string::npos || message.find("weight") == std::string::npos) {
      fail("layernorm " + device.str() + ": the error should name avo::layernorm and 'weight', got: " + message);
    } else {
      std::printf("  layernorm          %-6s a [9] weight for x [4, 8] raises: %s\n", device.str().c_str(),
                  message.substr(0, message.find('\n')).c_str());
    }
  }
}

// The comparison itself must catch a wrong result: one element off by a few tolerances.
void check_the_checker() {
  ++checks;
  const at::Tensor expected = at::randn({16, 32}, at::kDouble);
  at::Tensor wrong = expected.to(at::kFloat);
  wrong[3][5].add_(1e-3 * (1 + std::abs(expected[3][5].item<double>())));
  at::Tensor nan = expected.to(at::kFloat);
  nan[0][0].fill_(std::numeric_limits<float>::quiet_NaN());
  const Tolerance tol = tolerance_of(at::kFloat);
  const bool ok = error_ratio(expected.to(at::kFloat), expected, tol.rtol, tol.atol) <= 1.0 &&
                  error_ratio(wrong, expected, tol.rtol, tol.atol) > 1.0 &&
                  !(error_ratio(nan, expected, tol.rtol, tol.atol) <= 1.0);
  if (!ok) fail("the comparison does not tell a wrong or NaN result from a right one");
}

void run_device(at::Device device, const c10::TypedOperatorHandle<Forward>& layernorm,
                const c10::TypedOperatorHandle<Saving>& layernorm_forward,
                const c10::TypedOperatorHandle<Backward>& layernorm_backward) {
  std::printf("%s:\n", device.str().c_str());
  const std::vector<Case> cases = {
      {{5, 1}, 1e-5, false},     {{4, 8}, 1e-5, false},   {{3, 5, 37}, 1e-5, false}, {{6, 37}, 1e-5, true},
      {{16, 1000}, 1e-5, false}, {{2, 4096}, 0.1, false}, {{0, 16}, 1e-5, false},
  };
  for (at::ScalarType dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    for (const Case& c : cases) check_forward(layernorm, device, dtype, c);
  }
  for (const Case& c : {Case{{3, 5, 37}, 1e-5, false}, Case{{64, 1000}, 1e-5, false}}) {
    for (bool params : {false, true}) check_backward(layernorm_forward, layernorm_backward, device, at::kFloat, c, params);
  }
  check_backward(layernorm_forward, layernorm_backward, device, at::kBFloat16, Case{{16, 256}, 1e-5, false}, true);
  check_autograd(layernorm, layernorm_forward, layernorm_backward, device);
  check_error(layernorm, device);
}

}  // namespace

int main() {
  at::manual_seed(0);
  auto& dispatcher = c10::Dispatcher::singleton();
  std::optional<c10::OperatorHandle> forward, saving, backward;
  try {
    forward = dispatcher.findSchemaOrThrow("avo::layernorm", "");
    saving = dispatcher.findSchemaOrThrow("avo::layernorm_forward", "");
    backward = dispatcher.findSchemaOrThrow("avo::layernorm_backward", "");
  } catch (const c10::Error& e) {
    std::printf("FAIL avo::layernorm is not registered: libavo_ops was not loaded (link it with "
                "-Wl,--no-as-needed)\n%s\n", e.what_without_backtrace());
    return 1;
  }
  std::printf("schema: %s\n", c10::toString(forward->schema()).c_str());
  std::printf("schema: %s\n", c10::toString(saving->schema()).c_str());
  std::printf("schema: %s\n", c10::toString(backward->schema()).c_str());
  const auto layernorm = forward->typed<Forward>();
  const auto layernorm_forward = saving->typed<Saving>();
  const auto layernorm_backward = backward->typed<Backward>();

  check_the_checker();
  try {
    if (!forward->hasKernelForDispatchKey(c10::DispatchKey::CPU)) {
      fail("avo::layernorm has no CPU kernel");
    } else {
      run_device(at::Device(at::kCPU), layernorm, layernorm_forward, layernorm_backward);
    }

    const bool cuda_kernel = forward->hasKernelForDispatchKey(c10::DispatchKey::CUDA);
#if defined(AVO_WITH_CUDA)
    if (!cuda_kernel) fail("the library was built with CUDA but avo::layernorm has no CUDA kernel");
#endif
    const char* require = std::getenv("AVO_TEST_REQUIRE_CUDA");
    const bool cuda_required = require != nullptr && std::strcmp(require, "1") == 0;
    const char* skipped = !cuda_kernel ? "the library was built without CUDA kernels"
                          : !at::hasCUDA() ? "no GPU found"
                                           : nullptr;
    if (skipped == nullptr) {
      run_device(at::Device(at::kCUDA, 0), layernorm, layernorm_forward, layernorm_backward);
    } else if (cuda_required) {
      fail(std::string("CUDA part skipped but AVO_TEST_REQUIRE_CUDA=1: ") + skipped);
    } else {
      std::printf("cuda: skipped (%s)\n", skipped);
    }
  } catch (const std::exception& e) {
    fail(std::string("unexpected exception: ") + e.what());
  }

  std::printf("%d checks, %d failed\n", checks, failures);
  return failures == 0 ? 0 : 1;
}

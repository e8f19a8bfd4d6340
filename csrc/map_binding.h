// Binding-layer helpers shared by every generated elementwise ("map") op: argument
// checks with messages that name the op and the argument, broadcasting, output
// allocation and the translation of tensors into avo::MapArgs for the kernels.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <array>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <avo/dtype.h>
#include <avo/map_args.h>

namespace avo::binding {

// One tensor argument as the op's schema names it; `tensor` is nullptr when an
// optional argument was not given.
struct NamedInput {
  const char* name;
  const at::Tensor* tensor;
};

// The dtype as Python names it (float32, float64, int32, ...).
inline std::string dtype_name(at::ScalarType t) { return std::string(c10::getDtypeNames(t).first); }

inline DType to_avo_dtype(const char* op, const char* arg, at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DType::Float32;
    case at::kHalf: return DType::Float16;
    case at::kBFloat16: return DType::BFloat16;
    default:
      TORCH_CHECK_TYPE(false, op, ": argument '", arg, "' has dtype ", dtype_name(t),
                       "; supported dtypes are float32, float16 and bfloat16");
  }
}

// Shape of `t` as text, e.g. [8, 16].
inline std::string shape_text(at::IntArrayRef sizes) {
  std::string text = "[";
  for (size_t d = 0; d < sizes.size(); ++d) text += (d ? ", " : "") + std::to_string(sizes[d]);
  return text + "]";
}
inline std::string shape_text(const at::Tensor& t) { return shape_text(t.sizes()); }

// Checks the given tensor arguments of `op` (each `Input` has a `name` and a `tensor`,
// nullptr for a missing optional one): a supported dtype, one dtype and one device for
// all. Returns the first given argument.
template <typename Input, size_t N>
const Input& check_tensor_arguments(const char* op, const std::array<Input, N>& inputs) {
  const Input* first = nullptr;
  for (const Input& in : inputs) {
    if (in.tensor == nullptr) continue;
    TORCH_CHECK(in.tensor->defined(), op, ": argument '", in.name, "' is an undefined tensor");
    to_avo_dtype(op, in.name, in.tensor->scalar_type());
    if (first == nullptr) {
      first = &in;
      continue;
    }
    TORCH_CHECK_TYPE(in.tensor->scalar_type() == first->tensor->scalar_type(), op, ": argument '", in.name,
                     "' has dtype ", dtype_name(in.tensor->scalar_type()), " but '", first->name, "' has dtype ",
                     dtype_name(first->tensor->scalar_type()), "; all tensor arguments must share one dtype");
    TORCH_CHECK(in.tensor->device() == first->tensor->device(), op, ": argument '", in.name, "' is on ",
                in.tensor->device(), " but '", first->name, "' is on ", first->tensor->device(),
                "; all tensor arguments must be on one device");
  }
  TORCH_CHECK(first != nullptr, op, ": no tensor argument given");
  return *first;
}

// Everything a map kernel launch needs, plus the tensors that keep its pointers valid.
template <int NumInputs, int NumOutputs>
struct MapCall {
  MapArgs<NumInputs, NumOutputs> args{};
  std::array<at::Tensor, NumOutputs> outputs;
  std::array<at::Tensor, NumInputs> inputs;  // the tensors behind args.inputs
  DType dtype = DType::Float32;
  at::Device device = at::kCPU;
};

// Merges dims that every input walks through as one (stride[d-1] == stride[d] * size[d])
// and drops size-1 dims; fills args.sizes/input_strides right-aligned. False when more
// than kMaxDims remain.
template <int NumInputs, int NumOutputs>
bool fill_layout(MapCall<NumInputs, NumOutputs>& call, at::IntArrayRef shape) {
  const int64_t rank = int64_t(shape.size());
  std::vector<int64_t> sizes;
  std::vector<std::array<int64_t, NumInputs>> strides;
  // Walk from the innermost dim out, building merged dims innermost-first.
  for (int64_t d = rank - 1; d >= 0; --d) {
    if (shape[d] == 1) continue;
    std::array<int64_t, NumInputs> dim_strides{};
    for (int k = 0; k < NumInputs; ++k) {
      const at::Tensor& t = call.inputs[k];
      if (!t.defined()) continue;
      const int64_t td = d - (rank - t.dim());  // the input's own dim, inputs are right-aligned
      dim_strides[k] = (td < 0 || t.size(td) == 1) ? 0 : t.stride(td);
    }
    if (!sizes.empty()) {
      bool mergeable = true;
      for (int k = 0; k < NumInputs; ++k)
        mergeable &= dim_strides[k] == strides.back()[k] * sizes.back();
      if (mergeable) {
        sizes.back() *= shape[d];
        continue;
      }
    }
    sizes.push_back(shape[d]);
    strides.push_back(dim_strides);
  }
  const int ndim = int(sizes.size());
  if (ndim > kMaxDims) return false;
  auto& args = call.args;
  args.ndim = ndim;
  for (int slot = 0; slot < kMaxDims; ++slot) {
    args.sizes[slot] = 1;
    for (int k = 0; k < NumInputs; ++k) args.input_strides[k][slot] = 0;
  }
  for (int j = 0; j < ndim; ++j) {  // j-th innermost merged dim -> slot kMaxDims-1-j
    args.sizes[kMaxDims - 1 - j] = sizes[j];
    for (int k = 0; k < NumInputs; ++k) args.input_strides[k][kMaxDims - 1 - j] = strides[j][k];
  }
  bool contiguous = ndim <= 1;
  for (int k = 0; k < NumInputs && contiguous; ++k)
    if (call.inputs[k].defined() && ndim == 1) contiguous = strides[0][k] == 1;
  args.contiguous = contiguous;
  return true;
}

// Checks the tensor arguments of `op`, broadcasts them, allocates the (contiguous)
// outputs and describes everything in a MapCall.
template <int NumInputs, int NumOutputs>
MapCall<NumInputs, NumOutputs> prepare_map(const char* op, const std::array<NamedInput, NumInputs>& inputs) {
  MapCall<NumInputs, NumOutputs> call;
  const NamedInput* first = &check_tensor_arguments(op, inputs);
  call.dtype = to_avo_dtype(op, first->name, first->tensor->scalar_type());
  call.device = first->tensor->device();

  // Broadcast shape, numpy-style, with a message that names the arguments.
  std::vector<int64_t> shape;
  const NamedInput* shaper = nullptr;
  for (const NamedInput& in : inputs) {
    if (in.tensor == nullptr) continue;
    const at::Tensor& t = *in.tensor;
    if (int64_t(shape.size()) < t.dim()) shape.insert(shape.begin(), t.dim() - shape.size(), 1);
    for (int64_t j = 1; j <= t.dim(); ++j) {
      int64_t& out = shape[shape.size() - j];
      const int64_t size = t.size(t.dim() - j);
      if (out == size || size == 1) continue;
      TORCH_CHECK(out == 1, op, ": the shapes of '", shaper->name, "' ", shape_text(*shaper->tensor), " and '",
                  in.name, "' ", shape_text(t), " do not broadcast together");
      out = size;
    }
    shaper = &in;
  }

  for (int k = 0; k < NumInputs; ++k) {
    if (inputs[k].tensor != nullptr) call.inputs[k] = *inputs[k].tensor;
  }
  const auto options = first->tensor->options();
  for (auto& out : call.outputs) out = at::empty(shape, options);
  if (!fill_layout(call, shape)) {
    // Too many independent dims for the strided kernel: copy to contiguous instead.
    for (auto& t : call.inputs)
      if (t.defined()) t = t.expand(shape).contiguous();
    TORCH_INTERNAL_ASSERT(fill_layout(call, shape));
  }
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  call.args.numel = numel;
  for (int k = 0; k < NumInputs; ++k)
    call.args.inputs[k] = call.inputs[k].defined() ? call.inputs[k].data_ptr() : nullptr;
  for (int k = 0; k < NumOutputs; ++k) call.args.outputs[k] = call.outputs[k].data_ptr();
  return call;
}

// Runs `chunk(begin, end)` over all elements in parallel on the CPU.
template <typename F>
void parallel_over_elements(int64_t numel, const F& chunk) {
  constexpr int64_t kGrain = 32768;  // elements per task: enough work to pay for a thread
  at::parallel_for(0, numel, kGrain, chunk);
}

// The outputs as the op returns them: one tensor, or a tuple of them.
template <size_t... I, size_t N>
std::tuple<decltype(I, at::Tensor())...> outputs_as_tuple(std::array<at::Tensor, N>& outputs, std::index_sequence<I...>) {
  return {outputs[I]...};
}

// The first Count outputs (every one by default), as the op returns them: a row op's
// forward leaves out the values only <op>_forward returns.
template <size_t Count = 0, size_t N>
auto returned(std::array<at::Tensor, N>& outputs) {
  constexpr size_t kCount = Count == 0 ? N : Count;
  static_assert(kCount <= N);
  if constexpr (kCount == 1) {
    return outputs[0];
  } else {
    return outputs_as_tuple(outputs, std::make_index_sequence<kCount>{});
  }
}

}  // namespace avo::binding

// The node that a differentiable call of an op adds to the autograd graph
// (csrc/generated/autograd.cpp instantiates one per op), as torch's own ops add theirs:
// a torch::autograd::Node that keeps what the backward reads and runs it in apply().
//
// A torch::autograd::Function would do the same work through a generic node (CppNode),
// which records the metadata of every input and output and wraps the outputs one by one:
// on a 1x1024 tensor on the CPU that cost 0.7 µs of host time in the forward and 3-7 µs in
// forward plus backward (benchmarks/results/2026-12-07-cpu-autograd-node/).
#pragma once

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/dynamo/compiled_autograd.h>

#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace avo::autograd {

using torch::autograd::variable_list;

// How torch holds a node: std::shared_ptr in older releases, c10::intrusive_ptr in newer.
using NodePtr = decltype(std::declval<torch::autograd::Node&>().getptr());

// A new node of type T, held the way torch holds nodes. With std::shared_ptr, torch's
// deleter (found by argument-dependent lookup, as only those releases have it) frees a
// long chain of nodes without recursing once per node.
template <typename T>
auto make_node() {
  if constexpr (std::is_same_v<NodePtr, std::shared_ptr<torch::autograd::Node>>) {
    return std::shared_ptr<T>(new T(), [](T* node) { deleteNode(node); });
  } else {
    return c10::make_intrusive<T>();
  }
}

// The node of one call of `Op`, a struct of csrc/generated/autograd.cpp with
//   static constexpr const char* name;          the node's name (grad_fn.name())
//   using Attributes = std::tuple<...>;          the op's non-tensor arguments
//   static variable_list gradients(const variable_list& grads, const variable_list& saved,
//                                  const Attributes& attributes);
// gradients() returns one gradient per tensor input of the op, from the gradients of its
// outputs (none undefined: missing ones are zeros here) and the tensors saved in the order
// the op's autograd kernel saved them.
template <typename Op>
struct OpNode final : torch::autograd::Node {
  // As SavedVariables, torch checks the tensors against changes in place before the
  // backward reads them, packs them with saved-tensor hooks and frees them after a
  // backward that does not retain the graph.
  std::vector<torch::autograd::SavedVariable> saved;
  typename Op::Attributes attributes;

  // Keeps `tensor` for the backward; `is_output` where it is an output of this node's call
  // (saved after the output's history is set), so that the node does not keep itself alive.
  void save(const at::Tensor& tensor, bool is_output) { saved.emplace_back(tensor, is_output); }

  std::string name() const override { return Op::name; }

  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const variable_list tensors = unpacked();
    for (size_t k = 0; k < grads.size(); ++k) {
      if (!grads[k].defined()) grads[k] = input_metadata(k).zeros_like();
    }
    return Op::gradients(grads, tensors, attributes);
  }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& s : saved) s.reset_data();
  }

  // Compiled autograd (torch._dynamo.config.compiled_autograd): what its cache key holds of
  // this node, and the backward as a function of tensors and packed values, which it puts
  // into its graph as one opaque call.
  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& args) const override {
    args.collect(std::string(Op::name));
    args.collect(saved, /*is_output=*/true);
    // The attributes by value: a call with another eps compiles again.
    std::apply([&](const auto&... a) { (args.collect(a), ...); }, attributes);
  }

  variable_list apply_with_saved(const variable_list& grads,
                                 torch::dynamo::autograd::SwapSavedVariables& swap) override {
    namespace dynamo = torch::dynamo::autograd;
    swap.before(saved);
    dynamo::PackedArgs packed;
    packed.pack(unpacked());
    for (size_t k = 0; k < num_inputs(); ++k) {  // what a missing gradient of output k is made of
      const torch::autograd::InputMetadata& output = input_metadata(k);
      packed.pack(output.shape_as_dim_vector().vec());
      packed.pack(output.options().dtype().toScalarType());
      packed.pack(output.device());
    }
    std::apply([&](const auto&... a) { (packed.pack(a), ...); }, attributes);
    std::vector<c10::IValue> args = std::move(packed).vec();
    std::vector<at::TypePtr> schema;
    for (const c10::IValue& v : args) schema.push_back(v.isTensor() ? at::TensorType::get() : v.type());
    const auto& compiler = dynamo::getPyCompilerInterface();
    const std::string function = compiler->bind_function(swap.get_py_compiler(), Op::name, &functional_apply, schema,
                                                         /*is_custom_function=*/true, /*is_traceable=*/true);
    const auto output_metadata = dynamo::IValuePacker<std::vector<std::optional<torch::autograd::InputMetadata>>>::pack(
        dynamo::get_input_metadata(next_edges()));
    variable_list results = compiler->call_function(swap.get_py_compiler(), "apply_functional", function, grads,
                                                    args, output_metadata);
    swap.after(saved);
    return results;
  }

 private:
  variable_list unpacked() {
    variable_list tensors;
    tensors.reserve(saved.size());
    for (const auto& s : saved) tensors.push_back(s.unpack(getptr()));
    return tensors;
  }

  // apply() on values packed by apply_with_saved, in the order packed.
  static variable_list functional_apply(const variable_list& grads_in, const std::vector<c10::IValue>& args) {
    torch::dynamo::autograd::PackedArgs packed(args);
    const auto tensors = packed.unpack<variable_list>();
    variable_list grads = grads_in;
    for (size_t k = 0; k < grads.size(); ++k) {
      const auto sizes = packed.unpack<std::vector<c10::SymInt>>();
      const auto dtype = packed.unpack<at::ScalarType>();
      const auto device = packed.unpack<c10::Device>();
      if (!grads[k].defined()) grads[k] = at::zeros_symint(sizes, at::TensorOptions().dtype(dtype).device(device));
    }
    typename Op::Attributes attributes;
    std::apply([&](auto&... a) { ((a = packed.unpack<std::decay_t<decltype(a)>>()), ...); }, attributes);
    return Op::gradients(grads, tensors, attributes);
  }
};

}  // namespace avo::autograd

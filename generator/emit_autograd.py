"""Emit `autograd.cpp`: the Autograd kernel of every op, which runs the op below autograd
and adds a node to the graph (avo::autograd::OpNode, csrc/autograd_node.h) that keeps the
tensors its backward reads (inputs; for a row op also per-row values and outputs of the
forward) and the attributes, and whose backward calls `<op>_backward` and sums each
gradient back to its input's shape. A call whose inputs carry tangents (forward-mode
differentiation), and one that records a graph under a torch.func transform (which runs
no C++ autograd node), takes the outputs from the op and their derivatives from the op's
math in ATen operations (emit_aten.py); so does a backward with create_graph=True, for its
gradients.

The kernels are C++ rather than Python (torch.library.register_autograd) because every
differentiable call passes through them: a Python autograd kernel costs about 8 µs of
host time per call, more than the whole torch call it replaces on a small tensor. All
ops share one file so that the autograd headers are compiled once."""
from __future__ import annotations

from .emit_aten import (emit_backward_math_in_aten, emit_math_from_kept, emit_math_in_aten, kept_output_math,
                        reads_only_kept_tensors)
from .emit_binding import _cpp_params, _return_type, op_handle
from .emit_kernels import header_comment
from .schedule import OpSchedule

# The C++ type of an attribute, as the node keeps it.
_ATTRIBUTE_TYPE = {"float": "double", "int": "int64_t", "bool": "bool", "str": "std::string"}


def _node_name(op: str) -> str:
    """The node's name, grad_fn.name(): AvoAddLayernormBackward for add_layernorm."""
    return "Avo" + "".join(part.capitalize() for part in op.split("_")) + "Backward"


def _function(s: OpSchedule) -> list[str]:
    spec, fwd, bwd = s.spec, s.forward, s.backward
    inputs, attrs = spec.inputs, spec.attrs
    arg_names = ", ".join([i.name for i in fwd.inputs] + [a.name for a in attrs])
    outputs = len(spec.outputs)
    saved_values = s.saved
    kept = s.kept_for_backward
    # How a double backward gets its gradients where autograd keeps outputs in place of
    # inputs: from the op's math rewritten on the kept outputs (add_layernorm's hidden), or
    # else, where the backward reads only kept tensors, from the backward's math (softmax's y).
    from_kept = kept_output_math(s)
    backward_in_aten = from_kept is None and reads_only_kept_tensors(s)

    def output(k: int) -> str:
        return f"std::get<{k}>(results)" if saved_values or outputs > 1 else "results"

    def kept_in_forward(kind: str, k: int) -> str:
        if kind == "input":
            return f"{inputs[k].name}.value_or(at::Tensor())" if inputs[k].optional else inputs[k].name
        if kind == "saved":
            return f"std::get<{outputs + k}>(results)"
        return output(k)

    # <op>_forward returns the outputs, then the per-row values the backward reads.
    running = "forward_saving_op" if saved_values else "forward_op"
    edges = ", ".join(f"{i.name}.value_or(at::Tensor())" if i.optional else i.name for i in inputs)
    returned = output(0) if outputs == 1 else "{" + ", ".join(output(k) for k in range(outputs)) + "}"
    recorded = ["// A call that records a graph: the op below autograd, then the node that runs its backward,",
                "// with the op's inputs as its next edges and the tensors that backward reads.",
                f"{_return_type(fwd)} differentiable_call({_cpp_params(fwd)}) {{",
                "  const auto results = [&] {",
                "    at::AutoDispatchBelowADInplaceOrView below_autograd;",
                f"    return {running}().call({arg_names});",
                "  }();",
                "  const auto node = avo::autograd::make_node<Node>();",
                f"  node->set_next_edges(torch::autograd::collect_next_edges({edges}));",
                *[f"  torch::autograd::set_history({output(k)}, node);" for k in range(outputs)],
                # An output is saved after its history is set: the SavedVariable then knows the
                # node as the output's own and keeps no reference to it.
                *[f"  node->save({kept_in_forward(kind, k)}, /*is_output=*/{'true' if kind == 'output' else 'false'});"
                  for kind, k in kept],
                *([f"  node->attributes = {{{', '.join(f'std::string({a.name})' if a.type == 'str' else a.name for a in attrs)}}};"]
                  if attrs else []),
                f"  return {returned};",
                "}", ""]
    lines = [f"// {spec.path}",
             f"namespace {spec.name} {{", "",
             "// The op and its backward, called below autograd (each handle looked up once).",
             f"const auto& forward_op() {{",
             f"  static const auto op = {op_handle(fwd)};",
             "  return op;",
             "}", "",
             *([f"const auto& forward_saving_op() {{",
                f"  static const auto op = {op_handle(fwd, saving=True)};",
                "  return op;",
                "}", ""] if saved_values else []),
             f"const auto& backward_op() {{",
             f"  static const auto op = {op_handle(bwd)};",
             "  return op;",
             "}", "",
             *emit_math_in_aten(s),
             *(emit_math_from_kept(s, from_kept) if from_kept else []),
             *(emit_backward_math_in_aten(s) if backward_in_aten else []),
             "// The backward of a differentiable call, which its node (avo::autograd::OpNode, csrc/autograd_node.h)",
             "// runs: the gradients of the tensor inputs from those of the outputs.",
             "struct Backward {",
             f'  static constexpr const char* name = "{_node_name(spec.name)}";',
             f"  using Attributes = std::tuple<{', '.join(_ATTRIBUTE_TYPE[a.type] for a in attrs)}>;", "",
             "  static torch::autograd::variable_list gradients(const torch::autograd::variable_list& grads,",
             "                                                  const torch::autograd::variable_list& saved,",
             f"                                                  {'const Attributes& attributes' if attrs else 'const Attributes&'}) {{"]
    if attrs:
        lines.append(f"    [[maybe_unused]] const auto& [{', '.join(a.name for a in attrs)}] = attributes;")
    call = [f"grads[{k}]" for k in range(outputs)]
    call += [f"avo::autograd::present(saved[{j}])" if kind == "input" and inputs[k].optional else f"saved[{j}]"
             for j, (kind, k) in enumerate(kept)]
    saved_attrs = [a.name for a in attrs]
    call += saved_attrs
    twice_differentiable = (from_kept is not None or backward_in_aten
                            or all(("input", k) in kept for k in range(len(inputs))))
    if backward_in_aten:
        # A backward that must itself be differentiable (create_graph=True) computes its math
        # in ATen operations from the kept outputs (softmax's y), whose graph leads back to
        # this op: torch differentiates it again as it would its own softmax backward.
        math = f"backward_math_in_aten({', '.join(call)})"
        returned = [f"gradients[{o}]" for o in s.gradient_outputs]
        lines += ["    if (at::GradMode::is_enabled()) {  // create_graph=True: gradients that have a graph of their own",
                  f"      const std::vector<at::Tensor> gradients = {math};",
                  f"      return {{{', '.join(returned)}}};", "    }"]
    elif twice_differentiable:
        # A backward that must itself be differentiable takes its gradients from the math: of
        # the inputs kept, and where outputs are kept in place of inputs (add_layernorm's
        # hidden for x and residual), of those outputs, the left-out inputs' from theirs.
        outputs_kept = from_kept.outputs if from_kept is not None else ()
        left_out = from_kept.left_out if from_kept is not None else ()
        names = [o.name for o in spec.outputs]
        inputs_kept = [k for k in range(len(inputs)) if ("input", k) in kept]
        tensors = [f"saved[{kept.index(('output', names.index(o)))}]" for o in outputs_kept]
        tensors += [f"saved[{kept.index(('input', k))}]" for k in inputs_kept]
        math_args = [f"inputs[{j}]" for j in range(len(outputs_kept))]
        math_args += [f"avo::autograd::present(inputs[{j}])" if inputs[k].optional else f"inputs[{j}]"
                      for j, k in enumerate(inputs_kept, start=len(outputs_kept))]
        math = "math_from_kept" if outputs_kept else "math_in_aten"
        returned = [f"left_out[{left_out.index(i.name)}]" if i.name in left_out
                    else f"gradients[{len(outputs_kept) + inputs_kept.index(k)}]" for k, i in enumerate(inputs)]
        lines += ["    if (at::GradMode::is_enabled()) {  // create_graph=True: gradients that have a graph of their own",
                  f"      const torch::autograd::variable_list inputs = avo::autograd::aliases({{{', '.join(tensors)}}});",
                  "      const torch::autograd::variable_list gradients = avo::autograd::differentiable_gradients(",
                  f"          {math}({', '.join(math_args + saved_attrs)}), inputs, grads);"]
        if left_out:
            kept_grads = [f"gradients[{j}]" for j in range(len(outputs_kept))]
            lines.append(f"      const std::vector<at::Tensor> left_out = left_out_gradients({', '.join(kept_grads + saved_attrs)});")
        lines += [f"      return {{{', '.join(returned)}}};", "    }"]
    gradients = f"backward_op().call({', '.join(call)})"
    if len(bwd.outputs) == 1:
        lines.append(f"    const torch::autograd::variable_list gradients = {{{gradients}}};")
    else:
        lines.append(f"    const torch::autograd::variable_list gradients = avo::autograd::as_list({gradients});")
    # An input whose gradient another's equals gets that tensor (add_layernorm's residual, x's).
    # An input the backward does not take (a row op's, which has its gradient's shape) gets
    # it as it is.
    returned = [f"avo::autograd::sum_to_input(gradients[{o}], saved[{kept.index(('input', k))}])"
                if ("input", k) in kept else f"gradients[{o}]" for k, o in enumerate(s.gradient_outputs)]
    lines += [f"    return {{{', '.join(returned)}}};", "  }", "};", "",
              "using Node = avo::autograd::OpNode<Backward>;", ""]
    lines += recorded
    body = [f"  return differentiable_call({arg_names});"]
    tensors = ", ".join(i.name for i in fwd.inputs)
    if outputs == 1:
        grafted = ["  return avo::autograd::with_derivatives_of(outputs, math[0]);"]
    else:
        grafted = ["  return {" + ", ".join(f"avo::autograd::with_derivatives_of(std::get<{k}>(outputs), math[{k}])"
                                          for k in range(outputs)) + "};"]
    detached = ", ".join([f"avo::autograd::detached({i.name})" for i in fwd.inputs] + [a.name for a in attrs])
    lines += ["// The kernels' outputs with the derivatives of math_in_aten: for a call whose inputs carry",
              "// tangents (torch.func.jvp, torch.autograd.forward_ad), and for one that records a graph",
              "// under a torch.func transform (grad, vjp, jacrev; vmap), which runs no C++ autograd",
              "// node. Tangents and graph both come from the math, so that they compose (a jvp of",
              "// a grad).",
              f"{_return_type(fwd)} math_call({_cpp_params(fwd)}) {{",
              "  // On detached inputs: values without a derivative at any level of nested transforms",
              "  // (a derivative reached through them too would count twice).",
              f"  {'const auto' if outputs > 1 else 'const at::Tensor'} outputs = forward_op().call({detached});",
              f"  const std::vector<at::Tensor> math = math_in_aten({arg_names});",
              *grafted,
              "}", ""]
    # Without a graph to record, the kernel passes the call on to the keys below autograd
    # (redispatch, as torch's own autograd kernels do) instead of dispatching it again from
    # the start; the guard keeps the ops the kernel calls below autograd too.
    lines += [f"{_return_type(fwd)} autograd_kernel(c10::DispatchKeySet keys, {_cpp_params(fwd)}) {{",
              f"  if (avo::autograd::any_tangent({tensors})) return math_call({arg_names});",
              f"  if (!avo::autograd::needs_grad({tensors})) {{  // no graph to record",
              "    at::AutoDispatchBelowADInplaceOrView below_autograd;",
              f"    return forward_op().redispatch(keys & c10::after_ADInplaceOrView_keyset, {arg_names});",
              "  }",
              f"  if (avo::autograd::in_transform()) return math_call({arg_names});",
              *body, "}", ""]
    backward_args = ", ".join([i.name for i in bwd.inputs] + [a.name for a in attrs])
    backward_tensors = ", ".join(i.name for i in bwd.inputs)
    if twice_differentiable:
        why = (f"differentiate {fwd.qualified_name} itself (its double backward takes the gradients from its math, "
               "not from this op)")
        comment = ["// The backward op has no derivative of its own (Backward::gradients takes the gradients",
                   "// of a double backward from the math in ATen instead): a call that would record a graph",
                   "// raises, where torch's fallback would warn and let no second derivative reach the inputs."]
    else:
        why = f"{fwd.qualified_name} has first derivatives only (no double backward, no create_graph=True)"
        comment = ["// The backward has no derivative of its own: a call that would record a graph (a double",
                   "// backward, create_graph=True) raises, where torch's fallback would warn and let no",
                   "// second derivative reach the inputs."]
    lines += [*comment,
              f"{_return_type(bwd)} backward_autograd_kernel(c10::DispatchKeySet keys, {_cpp_params(bwd)}) {{",
              f"  TORCH_CHECK(!avo::autograd::any_tangent({backward_tensors}), \"{bwd.qualified_name} has no forward-mode \"",
              f"              \"derivative: a tangent reached it (torch.func.jvp or torch.autograd.forward_ad)\");",
              f"  TORCH_CHECK(!avo::autograd::needs_grad({backward_tensors}), \"{bwd.qualified_name} is not differentiable: \"",
              f"              \"{why}\");",
              "  at::AutoDispatchBelowADInplaceOrView below_autograd;",
              f"  return backward_op().redispatch(keys & c10::after_ADInplaceOrView_keyset, {backward_args});",
              "}", ""]
    if saved_values:
        saving_name = f"{fwd.namespace}::{fwd.op_name(saving=True)}"
        lines += ["// Likewise the forward that returns the saved values: the autograd kernel above calls it",
                  "// below autograd; differentiable calls go through the op itself.",
                  f"{_return_type(fwd, saving=True)} forward_saving_autograd_kernel({_cpp_params(fwd)}) {{",
                  f"  TORCH_CHECK(!avo::autograd::any_tangent({tensors}), \"{saving_name} has no forward-mode derivative: \"",
                  f"              \"call {fwd.qualified_name}, whose tangents are defined\");",
                  f"  TORCH_CHECK(!avo::autograd::needs_grad({tensors}), \"{saving_name} is not differentiable: \"",
                  f"              \"call {fwd.qualified_name}, whose gradient is defined\");",
                  "  at::AutoDispatchBelowADInplaceOrView below_autograd;",
                  f"  return forward_saving_op().call({arg_names});",
                  "}", ""]
    lines += [f"}}  // namespace {spec.name}", ""]
    return lines


def emit_autograd(schedules: list[OpSchedule], namespace: str = "avo") -> str:
    lines = [header_comment("specs/*.yaml").rstrip("\n"), "",
             "#include <ATen/ATen.h>",
             "#include <ATen/core/dispatch/Dispatcher.h>",
             "#include <c10/core/impl/LocalDispatchKeySet.h>",
             "#include <c10/util/accumulate.h>",
             "#include <torch/csrc/autograd/autograd.h>",
             "#include <torch/library.h>", "",
             "#include <cmath>", "#include <optional>", "#include <string>", "#include <tuple>", "#include <vector>", "",
             '#include "autograd_node.h"', "",
             "// The Autograd kernel of every op: it runs the op below autograd and adds a node to the",
             "// graph that keeps what the backward reads and calls <op>_backward; tangents, and graphs",
             "// under torch.func, come from the op's math in ATen operations.",
             "namespace avo::autograd {", "",
             "// A saved optional input: undefined when the call passed none.",
             "inline std::optional<at::Tensor> present(const at::Tensor& saved) {",
             "  return saved.defined() ? std::optional<at::Tensor>(saved) : std::nullopt;",
             "}", "",
             "// The gradient of an input, summed back to the input's shape where the op broadcast",
             "// it; none for a missing optional input.",
             "inline at::Tensor sum_to_input(const at::Tensor& gradient, const at::Tensor& input) {",
             "  if (!input.defined()) return at::Tensor();",
             "  return gradient.sizes() == input.sizes() ? gradient : gradient.sum_to_size(input.sizes());",
             "}", "",
             "// Whether a call records a graph: grad mode on and an input that requires grad.",
             "inline bool requires_grad(const at::Tensor& t) { return t.defined() && t.requires_grad(); }",
             "inline bool requires_grad(const std::optional<at::Tensor>& t) { return t.has_value() && requires_grad(*t); }",
             "template <typename... Tensors>",
             "bool needs_grad(const Tensors&... tensors) {",
             "  return at::GradMode::is_enabled() && (requires_grad(tensors) || ...);",
             "}", "",
             "// Whether a tensor carries a tangent of forward-mode differentiation: a dual tensor of",
             "// torch.autograd.forward_ad, or of torch.func.jvp below its layer (level 0 in both).",
             "inline bool has_tangent(const at::Tensor& t) { return t.defined() && t._fw_grad(0).defined(); }",
             "inline bool has_tangent(const std::optional<at::Tensor>& t) { return t.has_value() && has_tangent(*t); }",
             "template <typename... Tensors>",
             "bool any_tangent(const Tensors&... tensors) {",
             "  return (has_tangent(tensors) || ...);",
             "}", "",
             "inline at::Tensor detached(const at::Tensor& t) { return t.detach(); }",
             "inline std::optional<at::Tensor> detached(const std::optional<at::Tensor>& t) {",
             "  return t.has_value() ? std::optional<at::Tensor>(t->detach()) : std::nullopt;",
             "}", "",
             "// Whether a torch.func transform is active (its layers keep this key in the thread's",
             "// dispatch keys): they run no C++ autograd node.",
             "inline bool in_transform() {",
             "  return c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::FuncTorchDynamicLayerBackMode);",
             "}", "",
             "// `kernel` (an output of the op's kernels) with the derivatives of `math` (its value from",
             "// math_in_aten, in float32 and the rows' layout): kernel - (m - m), one m detached, keeps",
             "// the kernel's bits (-0 too) and takes m's tangent and graph, cast to the kernel's dtype.",
             "// Where `math` is not finite the kernel's value stands alone, without a derivative (m - m",
             "// would be NaN there).",
             "inline at::Tensor with_derivatives_of(const at::Tensor& kernel, const at::Tensor& math) {",
             "  if (!math.defined()) return kernel;",
             "  const at::Tensor m = math.numel() == kernel.numel() ? math.reshape(kernel.sizes()) : math.expand(kernel.sizes());",
             "  const at::Tensor zero = (m.detach() - m).to(kernel.scalar_type());",
             "  return at::where(at::isfinite(m), kernel - zero, kernel);",
             "}", "",
             "// With create_graph=True: the saved tensors as aliases, whose gradients torch takes at",
             "// their own nodes. A tensor the op returned (add_layernorm's hidden) has this op's node",
             "// for its own; taking its gradient there would make that node, whose backward is running,",
             "// a step to the others (weight is an input of both) and run it again inside itself.",
             "inline torch::autograd::variable_list aliases(const torch::autograd::variable_list& saved) {",
             "  torch::autograd::variable_list out;",
             "  for (const at::Tensor& t : saved) out.push_back(t.defined() ? t.view_as(t) : t);",
             "  return out;",
             "}", "",
             "// With create_graph=True: the gradients of `inputs` (the op's tensor inputs, undefined",
             "// where the call left one out) for `grads` of the outputs of math_in_aten, which torch",
             "// differentiates with a graph of their own, so that they can be differentiated again",
             "// (a double backward, a gradient penalty).",
             "inline torch::autograd::variable_list differentiable_gradients(const std::vector<at::Tensor>& math,",
             "                                                              const torch::autograd::variable_list& inputs,",
             "                                                              const torch::autograd::variable_list& grads) {",
             "  torch::autograd::variable_list outputs, output_grads, wanted;",
             "  for (size_t k = 0; k < math.size(); ++k) {",
             "    if (!grads[k].defined() || !math[k].defined() || !math[k].requires_grad()) continue;",
             "    outputs.push_back(math[k]);",
             "    const at::Tensor g = grads[k].to(at::kFloat);",
             "    output_grads.push_back(g.numel() == math[k].numel() ? g.reshape(math[k].sizes()) : g.sum_to_size(math[k].sizes()));",
             "  }",
             "  std::vector<size_t> positions;",
             "  for (size_t k = 0; k < inputs.size(); ++k) {",
             "    if (inputs[k].defined() && inputs[k].requires_grad()) {",
             "      wanted.push_back(inputs[k]);",
             "      positions.push_back(k);",
             "    }",
             "  }",
             "  torch::autograd::variable_list gradients(inputs.size());",
             "  if (outputs.empty() || wanted.empty()) return gradients;",
             "  const auto found = torch::autograd::grad(outputs, wanted, output_grads, /*retain_graph=*/true,",
             "                                           /*create_graph=*/true, /*allow_unused=*/true);",
             "  for (size_t j = 0; j < positions.size(); ++j) gradients[positions[j]] = found[j];",
             "  return gradients;",
             "}", "",
             "// For math_in_aten: a number as a 0-dim float32 tensor beside `like`; a channel op's",
             "// tensor [B, C, *spatial] as float32 rows [B, C, spatial elements]; the functions of",
             "// numbers that the C++ library does not have.",
             "inline at::Tensor scalar_tensor(double value, const at::Tensor& like) {",
             "  return at::scalar_tensor(value, like.options().dtype(at::kFloat));",
             "}",
             "inline at::Tensor channel_rows(const at::Tensor& x) {",
             "  return x.reshape({x.size(0), x.size(1), c10::multiply_integers(x.sizes().slice(2))}).to(at::kFloat);",
             "}",
             "// An output that later math reads as the caller gets it (rounded to the op's dtype), as",
             "// the kernels do; its tangent unrounded, as the rounding's derivative is taken to be 1.",
             "inline at::Tensor as_stored(const at::Tensor& value, at::ScalarType dtype) {",
             "  return dtype == at::kFloat ? value : value + (value.to(dtype).to(at::kFloat) - value).detach();",
             "}",
             "inline double rsqrt(double v) { return 1.0 / std::sqrt(v); }",
             "inline double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }",
             "inline double sign(double v) { return double((v > 0) - (v < 0)); }",
             "inline double minimum(double a, double b) { return (a != a || a < b) ? a : b; }",
             "inline double maximum(double a, double b) { return (a != a || a > b) ? a : b; }", "",
             "template <typename... Tensors>",
             "torch::autograd::variable_list as_list(const std::tuple<Tensors...>& tensors) {",
             "  return std::apply([](const auto&... t) { return torch::autograd::variable_list{t...}; }, tensors);",
             "}", ""]
    for s in schedules:
        lines += _function(s)
    lines += [f"}}  // namespace avo::autograd", "",
              f"TORCH_LIBRARY_IMPL({namespace}, Autograd, m) {{"]
    for s in schedules:
        lines.append(f'  m.impl("{s.spec.name}", &avo::autograd::{s.spec.name}::autograd_kernel);')
        if s.saved:
            lines.append(f'  m.impl("{s.forward.op_name(saving=True)}", '
                         f'&avo::autograd::{s.spec.name}::forward_saving_autograd_kernel);')
        lines.append(f'  m.impl("{s.backward.registered_name}", &avo::autograd::{s.spec.name}::backward_autograd_kernel);')
    lines += ["}", ""]
    return "\n".join(lines)

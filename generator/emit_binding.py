"""Emit the binding layer: `<op>_binding.cpp` (argument checks, output allocation,
CPU and CUDA implementations) and `registration.cpp` (the one TORCH_LIBRARY(avo))."""
from __future__ import annotations

from .emit_kernels import enum_name, header_comment
from .model import Attr
from .schedule import MapKernel, OpSchedule, channels_first, returned_outputs

SCHEMA_TYPES = {"float": "float", "int": "int", "bool": "bool", "str": "str"}
CPP_ARG_TYPES = {"float": "double", "int": "int64_t", "bool": "bool", "str": "c10::string_view"}


def schema_default(a: Attr) -> str:
    if a.type == "str":
        return f'"{a.default}"'
    if a.type == "bool":
        return "True" if a.default else "False"
    return repr(a.default)


def _attr_schema(a: Attr) -> str:
    text = f"{SCHEMA_TYPES[a.type]} {a.name}"
    return text + (f"={schema_default(a)}" if a.default is not None else "")


def schema(kernel: MapKernel, saving: bool = False) -> str:
    """The op schema, e.g. `gelu(Tensor x, str approximate="none") -> Tensor`; with
    `saving`, that of the forward that also returns the saved values (<op>_forward)."""
    args = [f"Tensor? {i.name}=None" if i.optional else f"Tensor {i.name}" for i in kernel.inputs]
    args += [_attr_schema(a) for a in kernel.op.attrs]
    count = len(returned_outputs(kernel, saving))
    returns = "Tensor" if count == 1 else "(" + ", ".join(["Tensor"] * count) + ")"
    return f"{kernel.op_name(saving)}({', '.join(args)}) -> {returns}"


def _cpp_params(kernel: MapKernel) -> str:
    params = [f"const std::optional<at::Tensor>& {i.name}" if i.optional else f"const at::Tensor& {i.name}"
              for i in kernel.inputs]
    params += [f"{CPP_ARG_TYPES[a.type]} {a.name}" for a in kernel.op.attrs]
    return ", ".join(params)


def _return_type(kernel: MapKernel, saving: bool = False) -> str:
    count = len(returned_outputs(kernel, saving))
    if count == 1:
        return "at::Tensor"
    return "std::tuple<" + ", ".join(["at::Tensor"] * count) + ">"


def op_signature(kernel: MapKernel, saving: bool = False) -> str:
    """The C++ function type of the op, for Dispatcher::typed."""
    params = ["const std::optional<at::Tensor>&" if i.optional else "const at::Tensor&" for i in kernel.inputs]
    params += [CPP_ARG_TYPES[a.type] for a in kernel.op.attrs]
    return f"{_return_type(kernel, saving)}({', '.join(params)})"


def op_handle(kernel: MapKernel, saving: bool = False) -> str:
    """The expression that finds the op's typed dispatcher handle."""
    return (f'c10::Dispatcher::singleton().findSchemaOrThrow("{kernel.namespace}::{kernel.op_name(saving)}", "")'
            f".typed<{op_signature(kernel, saving)}>()")


def impl_name(kernel, device: str, saving: bool = False) -> str:
    return f"{kernel.role}{'_saving' if saving else ''}_{device}_impl"


def _launch_args(kernel: MapKernel) -> str:
    """Arguments after `call.args` for the launchers: enums first, then scalars."""
    args = [f"{a.name}_choice" for a in kernel.op.attrs if a.type == "str"]
    args += [f"static_cast<{ctype}>({name})" for name, ctype in kernel.scalars]
    return ", ".join(args)


def _impl_start(kernel, device: str, saving: bool = False) -> list[str]:
    """The implementation's signature, then its string attributes parsed into enums."""
    lines = [f"{_return_type(kernel, saving)} {impl_name(kernel, device, saving)}({_cpp_params(kernel)}) {{"]
    return lines + _parse_choices(kernel, f'"{kernel.qualified_name}"')


def _parse_choices(kernel, op: str) -> list[str]:
    """The string attributes parsed into enums; `op` (a C++ expression) names the op in errors."""
    return [f"  const {enum_name(a.name)} {a.name}_choice = parse_{a.name}({op}, {a.name});"
            for a in kernel.op.attrs if a.type == "str"]


def _cuda_launch(kernel, args: str, extra: str) -> list[str]:
    """On the tensors' device and its current stream, then the launch check."""
    return ["  const c10::cuda::CUDAGuard device_guard(call.device);",
            f"  {kernel.role}_cuda(call.dtype, {args}{extra}, c10::cuda::getCurrentCUDAStream());",
            "  C10_CUDA_KERNEL_LAUNCH_CHECK();"]


def _extra_launch_args(kernel) -> str:
    extra = _launch_args(kernel)
    return f", {extra}" if extra else ""


def _map_impl(kernel: MapKernel, device: str) -> list[str]:
    lines = _impl_start(kernel, device)
    named = ", ".join(
        f'{{"{i.name}", {i.name}.has_value() ? &*{i.name} : nullptr}}' if i.optional else f'{{"{i.name}", &{i.name}}}'
        for i in kernel.inputs
    )
    n_in, n_out = len(kernel.inputs), len(kernel.outputs)
    lines.append(f'  auto call = avo::binding::prepare_map<{n_in}, {n_out}>("{kernel.qualified_name}", {{{{{named}}}}});')
    extra = _extra_launch_args(kernel)
    if device == "cpu":
        lines += [
            "  avo::binding::parallel_over_elements(call.args.numel, [&](int64_t begin, int64_t end) {",
            f"    {kernel.role}_cpu(call.dtype, call.args{extra}, begin, end);",
            "  });",
        ]
    else:
        lines += _cuda_launch(kernel, "call.args", extra)
    lines += ["  return avo::binding::returned(call.outputs);", "}", ""]
    return lines


def _parser(a: Attr) -> list[str]:
    choices = ", ".join(f"'{c}'" for c in a.choices)
    lines = [f"{enum_name(a.name)} parse_{a.name}(const char* op, c10::string_view value) {{"]
    for c in a.choices:
        lines.append(f'  if (value == "{c}") return {enum_name(a.name)}::{c};')
    lines += [f"  TORCH_CHECK_VALUE(false, op, \": argument '{a.name}' must be one of {choices}, got '\", std::string(value), \"'\");",
              "}", ""]
    return lines


def emit_binding(s: OpSchedule) -> str:
    """`<op>_binding.cpp` of a map or a row op: checks, outputs, the CPU and CUDA
    implementations and their registration."""
    spec = s.spec
    kernels = (s.forward, s.backward)
    helpers = "row_binding.h" if s.pattern == "row" else "map_binding.h"
    lines = [header_comment(spec.path), "#include <torch/library.h>", "", "#include <optional>", "#include <string>", "",
             f'#include "{helpers}"', f'#include "{spec.name}.h"', "",
             "#if defined(AVO_WITH_CUDA)", "#include <c10/cuda/CUDAException.h>", "#include <c10/cuda/CUDAGuard.h>",
             "#include <c10/cuda/CUDAStream.h>", "#endif", "",
             f"namespace avo::ops::{spec.name} {{", "namespace {", ""]
    for a in spec.attrs:
        if a.type == "str":
            lines += _parser(a)

    registered = s.registrations

    def impl(kernel, device, saving):
        if s.pattern == "row":
            return _row_impl(kernel, device, s, saving)
        return _map_impl(kernel, device)

    for kernel, saving in registered:
        lines += impl(kernel, "cpu", saving)
    lines.append("#if defined(AVO_WITH_CUDA)")
    for kernel, saving in registered:
        lines += impl(kernel, "cuda", saving)
    lines += ["#endif", "", "}  // namespace", "", f"TORCH_LIBRARY_IMPL({s.namespace}, CPU, m) {{"]
    lines += [f'  m.impl("{k.op_name(saving)}", &{impl_name(k, "cpu", saving)});' for k, saving in registered]
    lines += ["}", "", "#if defined(AVO_WITH_CUDA)", f"TORCH_LIBRARY_IMPL({s.namespace}, CUDA, m) {{"]
    lines += [f'  m.impl("{k.op_name(saving)}", &{impl_name(k, "cuda", saving)});' for k, saving in registered]
    lines += ["}", "#endif", "", f"}}  // namespace avo::ops::{spec.name}", ""]
    return "\n".join(lines)


def emit_registration(schedules: list[OpSchedule], namespace: str = "avo") -> str:
    lines = [header_comment("specs/*.yaml"), "#include <torch/library.h>", "",
             f"// Every schema of the {namespace} namespace; the implementations live in <op>_binding.cpp.",
             f"TORCH_LIBRARY({namespace}, m) {{"]
    for s in schedules:
        lines.append(f"  // {s.spec.path}")
        for kernel, saving in s.registrations:
            text = schema(kernel, saving).replace('"', '\\"')
            lines.append(f'  m.def("{text}", {{at::Tag::pt2_compliant_tag}});')
    lines += ["}", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------
# Row ops
# ---------------------------------------------------------------------------------

DOMAIN_ENUM = {"elem": "avo::binding::Domain::Elem", "col": "avo::binding::Domain::Col",
               "row": "avo::binding::Domain::Row", "chan": "avo::binding::Domain::Channel",
               "saved": "avo::binding::Domain::Saved"}


def _row_impl(kernel, device: str, s: OpSchedule, saving: bool = False) -> list[str]:
    """The implementation of a row op, its backward, or its saving forward (<op>_forward).
    A forward that saves values runs once for both registered ops (`<role>_<device>_outputs`,
    emitted with the op's own implementation); each returns the outputs it has."""
    if kernel.role == "forward" and s.saved:
        run = f"forward_{device}_outputs"
        count = len(returned_outputs(kernel, saving))
        returned = "returned" if count == len(kernel.outputs) else f"returned<{count}>"
        args = ", ".join([f'"{kernel.namespace}::{kernel.op_name(saving)}"', "true" if saving else "false"]
                         + [i.name for i in kernel.inputs] + [a.name for a in kernel.op.attrs])
        lines = [] if saving else _row_outputs_function(kernel, device, run)
        return lines + _impl_start(kernel, device, saving)[:1] + [
            f"  auto outputs = {run}({args});", f"  return avo::binding::{returned}(outputs);", "}", ""]
    if kernel.role == "forward":
        wanted = ", ".join("true" for _ in kernel.outputs)
    else:  # the gradient of a missing optional input is not computed
        wanted = ", ".join(f"{i.name}.has_value()" if i.optional else "true" for i in s.gradient_owners)
    lines = _impl_start(kernel, device) + _row_call(kernel, device, f'"{kernel.qualified_name}"', wanted)
    return lines + ["  return avo::binding::returned(call.outputs);", "}", ""]


def _row_outputs_function(kernel, device: str, name: str) -> list[str]:
    """Every output of a forward that saves values; the saved ones only with `saving`."""
    params = ", ".join(["const char* op", "bool saving", _cpp_params(kernel)])
    wanted = ", ".join("saving" if o.domain == "saved" else "true" for o in kernel.outputs)
    lines = [f"// The outputs of {kernel.qualified_name}, and with `saving` the values its backward reads.",
             f"std::array<at::Tensor, {len(kernel.outputs)}> {name}({params}) {{"]
    lines += _parse_choices(kernel, "op") + _row_call(kernel, device, "op", wanted)
    return lines + ["  return call.outputs;", "}", ""]


def _row_call(kernel, device: str, op: str, wanted: str) -> list[str]:
    """The body of a row implementation up to its return: arguments checked, outputs made,
    kernels run; `op` (a C++ expression) names the op in errors."""
    named = ", ".join(
        (f'{{"{i.name}", {i.name}.has_value() ? &*{i.name} : nullptr, {DOMAIN_ENUM[i.domain]}}}' if i.optional
         else f'{{"{i.name}", &{i.name}, {DOMAIN_ENUM[i.domain]}}}') for i in kernel.inputs)
    domains = ", ".join(DOMAIN_ENUM[o.domain] for o in kernel.outputs)
    n_in, n_out = len(kernel.inputs), len(kernel.outputs)
    channel_op = channels_first(kernel)
    lines = [f'  auto call = avo::binding::prepare_rows<{n_in}, {n_out}>({op}, {{{{{named}}}}}, {{{{{domains}}}}}, '
             f"{{{{{wanted}}}}}, kColumnSums{', /*channels_first=*/true' if channel_op else ''});"]
    extra = _extra_launch_args(kernel)
    lines.append("  const auto& args = call.args;")
    if device == "cpu":
        lines += ["  if (args.rows > 0) {",
                  "    avo::binding::parallel_rows(args, [&](int64_t begin, int64_t end) {",
                  f"      {kernel.role}_cpu(call.dtype, args{extra}, begin, end);", "    });"]
        if kernel.role == "backward":
            lines += ["    if (args.partials != nullptr) {",
                      "      at::parallel_for(0, args.length, 256, [&](int64_t begin, int64_t end) {",
                      "        backward_columns_finish_cpu(call.dtype, args, begin, end);", "      });", "    }"]
        lines.append("  }")
    else:
        lines += _cuda_launch(kernel, "args", extra)
    if kernel.channel_outputs:
        lines.append(f"  const auto totals = avo::binding::channel_totals(call, {kernel.inputs[0].name}.scalar_type());")
        if device == "cpu":
            lines += ["  at::parallel_for(0, totals.length, 256, [&](int64_t begin, int64_t end) {",
                      "    backward_channels_finish_cpu(call.dtype, totals, begin, end);", "  });"]
        else:
            lines += ["  backward_channels_finish_cuda(call.dtype, totals, c10::cuda::getCurrentCUDAStream());",
                      "  C10_CUDA_KERNEL_LAUNCH_CHECK();"]
    return lines

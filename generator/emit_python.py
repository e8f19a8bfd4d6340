"""Emit the Python glue of one op (`avo_ops/_generated/<op>.py`): fake (meta)
implementations, the op's vmap rule, the autograd.Function class and the functional API (the autograd
kernel of the op itself is C++: emit_autograd.py); plus the package index `avo_ops/_generated/__init__.py`."""
from __future__ import annotations

import textwrap

from .emit_calls import PACKAGE_NAMESPACE
from .emit_kernels import header_comment
from .model import Attr
from .schedule import MapKernel, OpSchedule, RowKernel, _camel, channels_first, returned_outputs

PY_TYPES = {"float": "float", "int": "int", "bool": "bool", "str": "str"}


def _py_default(a: Attr) -> str:
    return repr(a.default)


def _params(kernel: MapKernel, annotate: bool) -> str:
    out = []
    for i in kernel.inputs:
        if annotate:
            out.append(f"{i.name}: torch.Tensor | None = None" if i.optional else f"{i.name}: torch.Tensor")
        else:
            out.append(f"{i.name}=None" if i.optional else i.name)
    for a in kernel.op.attrs:
        text = f"{a.name}: {PY_TYPES[a.type]}" if annotate else a.name
        if a.default is not None:
            text += f" = {_py_default(a)}" if annotate else f"={_py_default(a)}"
        out.append(text)
    return ", ".join(out)


def _fake(kernel: MapKernel, saving: bool = False, owners=()) -> list[str]:
    """`owners`: for a row backward, the op input whose gradient each output is."""
    op = f"{kernel.namespace}::{kernel.op_name(saving)}"
    lines = [f'@torch.library.register_fake("{op}")', f"def _{kernel.op_name(saving)}_fake({_params(kernel, False)}):"]
    for a in kernel.op.attrs:
        if a.type == "str":
            lines.append(f'    _runtime.check_choice("{op}", "{a.name}", {a.name}, {a.choices!r})')
    if isinstance(kernel, RowKernel):
        named = ", ".join(f'"{i.name}": ({i.name}, "{i.domain}")' for i in kernel.inputs)
        if kernel.role == "forward":
            outputs = ", ".join(f'("{o.domain}", True)' for o in returned_outputs(kernel, saving))
        else:  # no gradient for a missing optional input
            outputs = ", ".join(f'("{o.domain}", {i.name} is not None)' if i.optional else f'("{o.domain}", True)'
                                for o, i in zip(kernel.outputs, owners))
        channels = ", channels_first=True" if channels_first(kernel) else ""
        lines += [f'    return _runtime.row_fake("{op}", {{{named}}}, [{outputs}]{channels})', "", ""]
        return lines
    named = ", ".join(f'"{i.name}": {i.name}' for i in kernel.inputs)
    lines += [f'    return _runtime.map_fake("{op}", {{{named}}}, {len(kernel.outputs)})', "", ""]
    return lines


def _vmap_rule(s: OpSchedule) -> list[str]:
    """The op's vmap rule: one call on the whole batch (_runtime.batched_call)."""
    fwd = s.forward
    op = f"{fwd.namespace}::{fwd.registered_name}"
    domains = {i.name: i.domain for i in fwd.inputs} if isinstance(fwd, RowKernel) else {}
    named = ", ".join(f'"{i.name}": ({i.name}, "{domains.get(i.name, "elem")}")' for i in fwd.inputs)
    layout = "map" if s.pattern == "map" else ("channel" if channels_first(fwd) else "row")
    names = [a.name for a in fwd.op.attrs]
    attrs = ", ".join(names) + ("," if len(names) == 1 else "")
    return [f'@torch.library.register_vmap("{op}")',
            f"def _{fwd.registered_name}_vmap(info, in_dims, {_params(fwd, False)}):",
            f"    return _runtime.batched_call(torch.ops.{fwd.namespace}.{fwd.registered_name}.default, info, in_dims, "
            f'{{{named}}}, ({attrs}), "{layout}")', "", ""]


def emit_python(s: OpSchedule) -> str:
    spec, fwd, bwd = s.spec, s.forward, s.backward
    ns = s.namespace
    name = spec.name
    cls = f"{_camel(name)}Function"
    tensor_names = [i.name for i in spec.inputs]
    attr_names = [a.name for a in spec.attrs]
    grad_outputs = [f"grad_{o.name}" for o in spec.outputs]
    lines = [header_comment(spec.path, "#").rstrip("\n"), f'"""The generated glue of {ns}::{name} (see {spec.path})."""',
             "from __future__ import annotations", "", "import torch", "",
             "from avo_ops import _C, _runtime" if ns == PACKAGE_NAMESPACE else "from avo_ops import _runtime", "",
             f'__all__ = ["{name}", "{cls}"]', "", ""]
    owners = s.gradient_owners
    lines += [line for kernel, saving in s.registrations for line in _fake(kernel, saving, owners)]
    lines += _vmap_rule(s)

    all_inputs = ", ".join(tensor_names + attr_names)
    saved = list(s.saved)
    outputs = [o.name for o in spec.outputs]
    # What the backward takes after the gradients, by name, as the forward has it.
    kept = [{"input": tensor_names, "output": outputs, "saved": saved}[kind][k] for kind, k in s.kept_for_backward]
    lines += [f"def _backward(ctx, {', '.join(grad_outputs)}):",
              f"    {', '.join(kept)}{',' if len(kept) == 1 else ''} = ctx.saved_tensors"]
    call_args = ", ".join(grad_outputs + kept + [f"ctx.{a}" for a in attr_names])
    grads = [f"grad_{i.name}" for i in owners]  # one per backward output
    lines.append(f"    {', '.join(grads)} = torch.ops.{ns}.{bwd.registered_name}({call_args})")
    # An input the backward does not take (a row op's) has its gradient's shape already.
    returned = [f"_runtime.reduce_grad({grads[o]}, {n})" if n in kept else grads[o]
                for n, o in zip(tensor_names, s.gradient_outputs)]
    returned += ["None"] * len(attr_names)
    lines += [f"    return {', '.join(returned)}", "", ""]

    # torch.ops.<ns>.<op> is differentiable by itself (its Autograd kernel is C++:
    # csrc/generated/autograd.cpp); the class is for code that composes autograd.Functions.
    lines += [f"class {cls}(torch.autograd.Function):",
              f'    """autograd.Function of {ns}::{name}, with the same forward and backward as the op\'s',
              f'    own autograd kernel (torch.ops.{ns}.{name} is differentiable without it)."""', ""]
    if saved:  # the forward saves values that only <op>_forward returns: a forward with ctx
        lines += ["    @staticmethod", f"    def forward(ctx, {_params(fwd, False)}):",
                  f"        {', '.join(outputs + saved)} = torch.ops.{ns}.{fwd.op_name(saving=True)}({all_inputs})",
                  f"        ctx.save_for_backward({', '.join(kept)})"]
        lines += [f"        ctx.{a} = {a}" for a in attr_names]
        lines += [f"        return {', '.join(outputs)}", ""]
    else:
        lines += ["    @staticmethod", f"    def forward({_params(fwd, False)}):",
                  f"        return torch.ops.{ns}.{name}({all_inputs})", "",
                  "    @staticmethod", "    def setup_context(ctx, inputs, output):"]
        if attr_names or any(kind == "input" for kind, _ in s.kept_for_backward):
            lines.append(f"        {all_inputs}{',' if len(tensor_names + attr_names) == 1 else ''} = inputs")
        if any(kind == "output" for kind, _ in s.kept_for_backward):
            lines.append(f"        {', '.join(outputs)} = output")
        lines += [f"        ctx.save_for_backward({', '.join(kept)})"]
        lines += [f"        ctx.{a} = {a}" for a in attr_names]
        lines.append("")
    lines += ["    backward = staticmethod(_backward)", "", ""]

    ret = "torch.Tensor" if len(spec.outputs) == 1 else "tuple[" + ", ".join(["torch.Tensor"] * len(spec.outputs)) + "]"
    doc = textwrap.wrap(spec.doc, 88)
    lines += [f"def {name}({_params(fwd, True)}) -> {ret}:", f'    """{doc[0]}', *[f"    {d}" for d in doc[1:]], "", "    Args:"]
    for i in spec.inputs:
        doc = i.doc or "input tensor"
        extra = f" Optional: a missing tensor stands for {i.default}." if i.optional else ""
        lines.append(f"        {i.name}: {doc} (float32, float16 or bfloat16).{extra}")
    for a in spec.attrs:
        choices = f" One of {', '.join(repr(c) for c in a.choices)}." if a.choices else ""
        lines.append(f"        {a.name}: {a.doc or a.type}.{choices}")
    outs = ", ".join(o.name for o in spec.outputs)
    if s.pattern == "row":
        returns = "new contiguous tensors of the inputs' dtype, shaped like the input (per row: without its last dimension)."
    else:
        returns = "a new contiguous tensor of the inputs' broadcast shape and dtype."
    lines += ["", "    Returns:", f"        {outs}: {returns}",
              '    """']
    if ns == PACKAGE_NAMESPACE:  # avo_ops._C.<op> first (csrc/python_calls.h); torch.compile traces torch.ops
        lines += ["    if not torch.compiler.is_compiling():",
                  f"        result = _C.{name}({all_inputs})",
                  "        if result is not NotImplemented:",
                  "            return result"]
    lines += [f"    return torch.ops.{ns}.{name}.default({all_inputs})", ""]
    return "\n".join(lines)


def emit_python_index(schedules: list[OpSchedule]) -> str:
    lines = [header_comment("specs/*.yaml", "#").rstrip("\n"), '"""The generated ops, one module each."""',
             "from __future__ import annotations", ""]
    names = []
    for s in schedules:
        cls = f"{_camel(s.spec.name)}Function"
        lines.append(f"from .{s.spec.name} import {cls}, {s.spec.name}")
        names += [s.spec.name, cls]
    lines += ["", "# Every op: its name in torch.ops.avo and its spec.",
              "OPS = {" + ", ".join(f'"{s.spec.name}": "{s.spec.path}"' for s in schedules) + "}", "",
              "__all__ = [" + ", ".join(f'"{n}"' for n in ["OPS", *names]) + "]", ""]
    return "\n".join(lines)

"""Emit `python_calls.cpp`: the Python entry point of every op, `avo_ops._C.<op>`, which
the functional API calls (csrc/python_calls.h says why, what it takes, and reads the
arguments against the op's typed dispatcher handle). For arguments it does not take it
returns NotImplemented, and the functional API then calls torch.ops.<namespace>.<op>.

Only the package's extension (avo_ops._C, namespace "avo") compiles this file; ops built
in another namespace (the tests') keep a functional API that calls torch.ops."""
from __future__ import annotations

from .emit_binding import op_handle
from .emit_kernels import header_comment
from .schedule import OpSchedule

PACKAGE_NAMESPACE = "avo"


def emit_python_calls(schedules: list[OpSchedule], namespace: str = PACKAGE_NAMESPACE) -> str:
    lines = [header_comment("specs/*.yaml"),
             "#include <ATen/core/dispatch/Dispatcher.h>", "",
             "#include \"python_calls.h\"", "",
             "namespace avo::python {", "namespace {", "",
             "// The typed handle of each op (looked up once)."]
    for s in schedules:
        lines += [f"const auto& {s.spec.name}_op() {{",
                  f"  static const auto op = {op_handle(s.forward)};",
                  "  return op;",
                  "}", ""]
    lines += ["PyMethodDef op_call_methods[] = {"]
    for s in schedules:
        name = s.spec.name
        names = ", ".join([i.name for i in s.forward.inputs] + [a.name for a in s.forward.op.attrs])
        doc = (f"{namespace}::{name}({names}), every argument given in order; NotImplemented for arguments that "
               f"only torch.ops.{namespace}.{name} takes.")
        lines.append(f'    {{"{name}", entry_point_method<&{name}_op>(), METH_FASTCALL,')
        lines.append(f'     "{doc}"}},')
    lines += ["    {nullptr, nullptr, 0, nullptr},", "};", "", "}  // namespace", "",
              "// The entry points, for PyModule_AddFunctions (csrc/python_module.cpp).",
              "PyMethodDef* op_calls() { return op_call_methods; }", "",
              "}  // namespace avo::python", ""]
    return "\n".join(lines)

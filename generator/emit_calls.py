"""Emit `python_calls.cpp`: the Python entry point of every op, `avo_ops._C.<op>`, which
the functional API calls (csrc/python_calls.h says why, and what it takes). Each reads its
arguments, all of them given in order, and calls the op's typed dispatcher handle; for
arguments it does not take it returns NotImplemented, and the functional API then calls
torch.ops.<namespace>.<op>.

Only the package's extension (avo_ops._C, namespace "avo") compiles this file; ops built
in another namespace (the tests') keep a functional API that calls torch.ops."""
from __future__ import annotations

from .emit_binding import CPP_ARG_TYPES, op_handle
from .emit_kernels import header_comment
from .schedule import OpSchedule

PACKAGE_NAMESPACE = "avo"


def _entry_point(s: OpSchedule) -> list[str]:
    kernel = s.forward
    names = [i.name for i in kernel.inputs] + [a.name for a in kernel.op.attrs]
    declarations = [f"const at::Tensor* {i.name} = nullptr;" for i in kernel.inputs if not i.optional]
    declarations += [f"std::optional<at::Tensor> {i.name};" for i in kernel.inputs if i.optional]
    declarations += [f"{CPP_ARG_TYPES[a.type]} {a.name}{{}};" for a in kernel.op.attrs]
    reads = [f"read_argument(args[{k}], {name})" for k, name in enumerate(names)]
    call_args = [f"*{i.name}" if not i.optional else i.name for i in kernel.inputs] + [a.name for a in kernel.op.attrs]
    condition = " ||\n      ".join([f"count != {len(names)}", "!plain_call()"] + [f"!{r}" for r in reads])
    return [f"// {s.spec.path}: avo_ops._C.{s.spec.name}({', '.join(names)})",
            f"PyObject* {s.spec.name}(PyObject*, PyObject* const* args, Py_ssize_t count) {{",
            "  HANDLE_TH_ERRORS",
            f"  static const auto op = {op_handle(kernel)};",
            *[f"  {d}" for d in declarations],
            f"  if ({condition})",
            "    Py_RETURN_NOTIMPLEMENTED;",
            f"  return call_op(op, {', '.join(call_args)});",
            "  END_HANDLE_TH_ERRORS",
            "}", ""]


def emit_python_calls(schedules: list[OpSchedule], namespace: str = PACKAGE_NAMESPACE) -> str:
    lines = [header_comment("specs/*.yaml"),
             "#include <ATen/core/dispatch/Dispatcher.h>", "",
             "#include \"python_calls.h\"", "",
             "namespace avo::python {", "namespace {", ""]
    for s in schedules:
        lines += _entry_point(s)
    lines += ["// METH_FASTCALL: the arguments arrive as an array, without a tuple built for them.",
              "PyMethodDef op_call_methods[] = {"]
    for s in schedules:
        name = s.spec.name
        doc = (f"{namespace}::{name} with every argument given, in order; NotImplemented for arguments that "
               f"only torch.ops.{namespace}.{name} takes.")
        lines.append(f'    {{"{name}", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&{name})), '
                     f'METH_FASTCALL, "{doc}"}},')
    lines += ["    {nullptr, nullptr, 0, nullptr},", "};", "", "}  // namespace", "",
              "// The entry points, for PyModule_AddFunctions (csrc/python_module.cpp).",
              "PyMethodDef* op_calls() { return op_call_methods; }", "",
              "}  // namespace avo::python", ""]
    return "\n".join(lines)

"""Emit an op's forward math as ATen operations (C++), for the derivatives its kernels do
not give: forward mode, torch.func transforms, double backward.

The autograd kernels (emit_autograd.py) take the outputs' values from the op's kernels,
and, when an input carries a tangent (torch.func.jvp, torch.autograd.forward_ad) or a
torch.func transform (grad, vjp, vmap) wants a graph, the outputs' derivatives from this
function run on the same inputs: torch differentiates each ATen operation, forward or
backward, so the derivatives follow the same math as the kernels with nothing more to
derive, and nested transforms compose as with any torch code. A backward with
create_graph=True takes its gradients from it too, so that they can be differentiated
again. It computes in float32, as the kernels do (16-bit inputs are converted first).

One function per op, `math_in_aten`, with the op's C++ parameters (tensors named
`<input>_arg`): a branch per specialization (string and bool attributes), each a list of
assignments named as in the spec, returning the outputs in the order of the spec.
Reductions keep their dimension, so per-row values broadcast against the rows; a channel
op's tensors are viewed as [B, C, spatial elements] and its per-channel parameters as
[C, 1].
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass

from .autodiff import differentiate, grad_name, read_as_inputs
from .emit_binding import CPP_ARG_TYPES
from .emit_c import COMPARE, INFIX, PRECEDENCE, float_literal, needs_parentheses
from .ir import Graph, Node, tensor, topological_order
from .schedule import KernelInput, OpSchedule, RowKernel, channels_first

_ARITHMETIC = (*INFIX, "neg")  # the operations printed as C++ operators
_TENSOR_FUNCTIONS = {"exp": "at::exp", "log": "at::log", "sqrt": "at::sqrt", "rsqrt": "at::rsqrt",
                     "tanh": "at::tanh", "erf": "at::erf", "sigmoid": "at::sigmoid", "abs": "at::abs",
                     "sign": "at::sign", "min": "at::minimum", "max": "at::maximum", "pow": "at::pow",
                     "lt": "at::lt", "le": "at::le", "gt": "at::gt", "ge": "at::ge", "eq": "at::eq", "ne": "at::ne",
                     "rsum": "at::sum", "rmax": "at::amax", "rmin": "at::amin"}
# Values the same for every element (attributes, constants, lengths) are C++ doubles.
_SCALAR_FUNCTIONS = {"exp": "std::exp", "log": "std::log", "sqrt": "std::sqrt", "tanh": "std::tanh",
                     "erf": "std::erf", "abs": "std::fabs", "pow": "std::pow", "rsqrt": "avo::autograd::rsqrt",
                     "sigmoid": "avo::autograd::sigmoid", "sign": "avo::autograd::sign",
                     "min": "avo::autograd::minimum", "max": "avo::autograd::maximum"}
# A comparison with the scalar on the left, written with the tensor on the left.
_MIRRORED = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq", "ne": "ne"}


def _is_scalar(node: Node) -> bool:
    return node.domain == "scalar"


class _AtenPrinter:
    """The assignments of one specialization's outputs; inputs and attributes are named
    by `leaves`, each reduced dimension's length by its name."""

    def __init__(self, results: dict[str, Node], names: dict[Node, str], leaves: dict[str, str]):
        self.results = results
        self.leaves = leaves
        self.order = topological_order(results.values())
        self.uses: dict[int, int] = {}
        for node in self.order:
            for a in node.args:
                self.uses[id(a)] = self.uses.get(id(a), 0) + 1
        self.names: dict[int, str] = {}
        taken = set(leaves) | set(leaves.values())
        for node, name in names.items():
            if node.args and name not in taken and id(node) not in self.names:
                self.names[id(node)] = name
                taken.add(name)
        self.taken = taken

    def lines(self) -> list[str]:
        """The assignments, then `return {outputs};` (an output that no input reaches, such
        as a constant, returns an undefined tensor: it has no tangent)."""
        out = []
        temp = 0
        result_nodes = {id(n) for n in self.results.values()}
        for node in self.order:
            if not node.args or node.op == "dim":
                continue
            named = id(node) in self.names
            if not (named or id(node) in result_nodes or self.uses.get(id(node), 0) > 1):
                continue
            text = self.expr(node, top=True)
            if not named:
                while f"t{temp}" in self.taken:
                    temp += 1
                self.names[id(node)] = f"t{temp}"
                temp += 1
            ctype = ("bool" if node.type == "b" else "double") if _is_scalar(node) else "at::Tensor"
            out.append(f"const {ctype} {self.names[id(node)]} = {text};")
        returned = ["at::Tensor()" if _is_scalar(n) else self.ref(n) for n in self.results.values()]
        out.append(f"return {{{', '.join(returned)}}};")
        return out

    def ref(self, node: Node) -> str:
        if node.op == "const":
            return ("true" if node.value else "false") if node.type == "b" else float_literal(node.value).rstrip("f")
        if node.op in ("input", "attr"):
            return self.leaves[node.value]
        if node.op == "dim":
            return str(node.value)
        return self.names[id(node)]

    def tensor(self, node: Node) -> str:
        """`node` as a tensor: a scalar becomes a 0-dim float32 tensor (for the operations
        that take no C++ number on that side)."""
        text = self.expr(node)
        return f"avo::autograd::scalar_tensor({text}, {self.leaves['@like']})" if _is_scalar(node) else text

    def expr(self, node: Node, top: bool = False) -> str:
        if not top and (not node.args or id(node) in self.names or node.op == "dim"):
            return self.ref(node)
        op, args = node.op, node.args
        if _is_scalar(node):
            return self.scalar_expr(node)
        if op in INFIX:
            left, right = args
            if op in ("sub", "div") and _is_scalar(left):  # c - t, c / t: no ATen operator takes a number first
                return f"{self.tensor(left)} {INFIX[op]} {self.operand(right, op, True)}"
            return f"{self.operand(left, op, False)} {INFIX[op]} {self.operand(right, op, True)}"
        if op == "neg":
            return f"-{self.operand(args[0], op, False)}"
        if op in ("rsum", "rmax", "rmin"):
            return f"{_TENSOR_FUNCTIONS[op]}({self.expr(args[0])}, -1, /*keepdim=*/true)"
        if op == "no_grad":  # no tangent flows through it
            return f"{self.method_operand(args[0])}.detach()"
        if op == "stored":
            return f"avo::autograd::as_stored({self.expr(args[0])}, {self.leaves['@dtype']})"
        if op in COMPARE:
            left, right = args
            if _is_scalar(left):
                return f"{_TENSOR_FUNCTIONS[_MIRRORED[op]]}({self.expr(right)}, {self.expr(left)})"
            return f"{_TENSOR_FUNCTIONS[op]}({self.expr(left)}, {self.expr(right)})"
        if op == "where":
            cond, a, b = args
            if _is_scalar(cond):  # a condition on attributes: both branches as tensors
                return f"{self.expr(cond)} ? {self.tensor(a)} : {self.tensor(b)}"
            return f"at::where({self.expr(cond)}, {self.expr(a)}, {self.expr(b)})"
        if op in ("min", "max"):
            return f"{_TENSOR_FUNCTIONS[op]}({self.tensor(args[0])}, {self.tensor(args[1])})"
        if op == "pow" and _is_scalar(args[0]):
            return f"at::pow({self.expr(args[0])}, {self.expr(args[1])})"
        return f"{_TENSOR_FUNCTIONS[op]}({', '.join(self.expr(a) for a in args)})"

    def scalar_expr(self, node: Node) -> str:
        op, args = node.op, node.args
        if op in INFIX:
            return f"{self.operand(args[0], op, False)} {INFIX[op]} {self.operand(args[1], op, True)}"
        if op == "neg":
            return f"-{self.operand(args[0], op, False)}"
        if op in COMPARE:
            return f"({self.expr(args[0])} {COMPARE[op]} {self.expr(args[1])})"
        if op == "where":
            return f"({self.expr(args[0])} ? {self.expr(args[1])} : {self.expr(args[2])})"
        if op == "no_grad":
            return self.expr(args[0])
        return f"{_SCALAR_FUNCTIONS[op]}({', '.join(self.expr(a) for a in args)})"

    def method_operand(self, child: Node) -> str:
        """`child` before a method call: in parentheses where it is an inline operation."""
        text = self.expr(child)
        inline = child.args and id(child) not in self.names and child.op != "dim"
        return f"({text})" if inline and child.op in _ARITHMETIC else text

    def operand(self, child: Node, parent_op: str, right: bool) -> str:
        text = self.expr(child)
        if child.op == "const" and child.value < 0:
            return f"({text})"
        inline = child.args and id(child) not in self.names and child.op != "dim"
        if not inline or child.op not in _ARITHMETIC:
            return text
        return f"({text})" if needs_parentheses(PRECEDENCE[child.op], PRECEDENCE[parent_op], right) else text


def _leaf_lines(s: OpSchedule, tensors, like: str, convert: bool = True) -> list[str]:
    """Each tensor parameter (`<name>_arg`) as a local: with `convert`, in float32 and laid
    out to broadcast against the rows, a missing optional one its default; else as given."""
    channel = channels_first(s.forward)
    lines = []
    for i in tensors:
        arg = f"{i.name}_arg"
        if not convert:
            lines.append(f"const at::Tensor& {i.name} = {arg};")
            continue
        if i.domain == "elem" and channel:
            value = f"avo::autograd::channel_rows({'*' if i.optional else ''}{arg})"
        else:
            value = f"{arg}{'->' if i.optional else '.'}to(at::kFloat)"
            if i.domain in ("row", "chan"):  # one value per row: a trailing dimension of 1
                value += ".unsqueeze(-1)"
        if i.optional:
            default = float_literal(i.default).rstrip("f")
            value = f"{arg} ? {value} : avo::autograd::scalar_tensor({default}, {like}_arg)"
        lines.append(f"const at::Tensor {i.name} = {value};")
    return lines


def _condition(choices) -> str:
    parts = []
    for attribute, choice in choices:
        if isinstance(choice, bool):
            parts.append(attribute if choice else f"!{attribute}")
        else:
            parts.append(f'{attribute} == "{choice}"')
    return " && ".join(parts)


def _function(s: OpSchedule, name: str, comment: list[str], tensors, per_graph, convert: bool = True) -> list[str]:
    """A C++ function `name` of the tensors (KernelInput-like: name, optional, default,
    domain) and the op's attributes, returning the results of `per_graph(graph)` (a Graph)
    for the specialization the attributes choose."""
    spec = s.spec
    params = [f"const std::optional<at::Tensor>& {i.name}_arg" if i.optional else f"const at::Tensor& {i.name}_arg"
              for i in tensors]
    params += [f"{CPP_ARG_TYPES[a.type]} {a.name}" for a in spec.attrs]
    like = next(i.name for i in tensors if not i.optional)  # its dtype and device are every tensor's
    leaves = {i.name: i.name for i in tensors}
    leaves.update({a.name: a.name for a in spec.attrs})
    leaves["@like"] = like
    leaves["@dtype"] = f"{like}_arg.scalar_type()"
    body = _leaf_lines(s, tensors, like, convert)
    graphs = [(specialization, per_graph(graph).results, per_graph(graph).names)
              for specialization, graph in s.forward.graphs]
    dims = sorted({str(n.value) for _, results, _ in graphs for n in topological_order(results.values())
                   if n.op == "dim"})
    body += [f"const double {d} = double({like}.size(-1));  // the length of the rows" for d in dims]
    for k, (specialization, results, names) in enumerate(graphs):
        statements = _AtenPrinter(results, names, leaves).lines()
        if len(graphs) == 1:
            body += statements
            continue
        condition = _condition(specialization.choices)
        if k == len(graphs) - 1:
            body.append(f"}} else {{  // {condition}")
        else:
            body.append(f"{'if' if k == 0 else '} else if'} ({condition}) {{")
        body += ["  " + line for line in statements]
    if len(graphs) > 1:
        body.append("}")
    return [*comment, f"std::vector<at::Tensor> {name}({', '.join(params)}) {{", *("  " + line for line in body), "}", ""]


def emit_math_in_aten(s: OpSchedule) -> list[str]:
    """The C++ function `math_in_aten` of one op (see the module docstring)."""
    comment = [f"// The math of {s.forward.qualified_name} in ATen operations, in float32, for torch to differentiate",
               "// (see math_call)."]
    return _function(s, "math_in_aten", comment, s.forward.inputs,
                     lambda graph: Graph(graph.spec, graph.specialization,
                                         {o.name: graph.results[o.name] for o in s.spec.outputs}, graph.names))


def reads_only_kept_tensors(s: OpSchedule) -> bool:
    """Whether the op's backward reads nothing but the incoming gradients and tensors that
    autograd keeps with their graph, some outputs among them in place of inputs (softmax's
    y, not x): no per-row value the forward saved (computed from the inputs without a
    graph) and no per-column sum. Its math in ATen is then differentiable as it stands."""
    if not isinstance(s.backward, RowKernel) or channels_first(s.forward):
        return False
    return not s.saved and not s.backward.column_outputs and any(kind == "output" for kind, _ in s.kept_for_backward)


def emit_backward_math_in_aten(s: OpSchedule) -> list[str]:
    """For a double backward of an op whose backward reads only what autograd keeps
    (reads_only_kept_tensors): `backward_math_in_aten`, the backward's math in ATen
    operations, in float32, from the incoming gradients and the kept tensors."""
    backward = {id(f): b for (_, f), (_, b) in zip(s.forward.graphs, s.backward.graphs)}
    comment = textwrap.wrap(f"The math of {s.backward.qualified_name} in ATen operations, in float32, for a double "
                            "backward: torch differentiates it again, through the kept outputs back to this op.", 90)
    return _function(s, "backward_math_in_aten", ["// " + line for line in comment], s.backward.inputs,
                     lambda graph: backward[id(graph)])


def emit_math_from_kept(s: OpSchedule, kept: KeptOutputMath) -> list[str]:
    """For a double backward of an op whose autograd keeps outputs in place of inputs:
    `math_from_kept`, the outputs from the kept outputs and the inputs kept, and
    `left_out_gradients`, the left-out inputs' gradients from the kept outputs'."""
    outputs, left_out = _and(kept.outputs), _and(kept.left_out)
    comment = textwrap.wrap(f"The math of {s.forward.qualified_name} from {outputs}, which its autograd keeps in place "
                            f"of {left_out}, for a double backward: the outputs as math_in_aten computes them.", 90)
    math = _function(s, "math_from_kept", ["// " + line for line in comment],
                     [KernelInput(o, False, None, "elem") for o in kept.outputs] + list(kept.inputs),
                     lambda graph: kept.results[id(graph)])
    gradients = _function(s, "left_out_gradients",
                          [f"// The gradients of {left_out} from those of {outputs}, which stand in for them.",],
                          [KernelInput(grad_name(o), False, None, "elem") for o in kept.outputs],
                          lambda graph: kept.gradients[id(graph)], convert=False)
    return math + gradients


def _and(names) -> str:
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]


@dataclass
class KeptOutputMath:
    """An op whose autograd keeps `outputs` (add_layernorm's hidden) in place of the inputs
    `left_out` (x and residual), with `inputs` the inputs it keeps: per forward graph (by
    id), the graph of the outputs as functions of the kept outputs and inputs (`results`),
    and that of each left-out input's gradient as a function of the kept outputs'
    gradients only (`gradients`)."""

    outputs: tuple[str, ...]
    left_out: tuple[str, ...]
    inputs: tuple
    results: dict[int, Graph]
    gradients: dict[int, Graph]


def kept_output_math(s: OpSchedule) -> KeptOutputMath | None:
    """The math from the outputs the autograd keeps in place of inputs, where the outputs
    read none of the left-out inputs but through them and the left-out inputs' gradients
    need none of their values (add_layernorm: hidden = x + residual, so both gradients are
    hidden's); None otherwise, and for an op that keeps every input."""
    kept = s.kept_for_backward
    outputs = tuple(s.spec.outputs[k].name for kind, k in kept if kind == "output")
    left_out = tuple(i.name for k, i in enumerate(s.spec.inputs) if ("input", k) not in kept)
    if not outputs or not left_out:
        return None
    results, gradients = {}, {}
    for _, graph in s.forward.graphs:
        leaves = {id(graph.results[o]): tensor(o, "elem") for o in outputs}
        only_outputs = Graph(graph.spec, graph.specialization, {o.name: graph.results[o.name] for o in s.spec.outputs},
                             graph.names)
        results[id(graph)] = read_as_inputs(only_outputs, leaves)
        read = {n.value for r in results[id(graph)].results.values() for n in topological_order([r])
                if n.op == "input"}
        grads = differentiate(Graph(graph.spec, graph.specialization, {o: graph.results[o] for o in outputs}))
        gradients[id(graph)] = Graph(graph.spec, graph.specialization, {name: grads[name] for name in left_out})
        grads_read = {n.value for g in gradients[id(graph)].results.values() for n in topological_order([g])
                      if n.op == "input"}
        if read & set(left_out) or not grads_read <= {grad_name(o) for o in outputs}:
            return None
    inputs = tuple(i for i in s.forward.inputs if i.name not in left_out)
    return KeptOutputMath(outputs, left_out, inputs, results, gradients)

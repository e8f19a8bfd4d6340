"""The expression IR: one small immutable node type, interned so that equal
subexpressions are the same object (common subexpressions are shared for free).

Types:   'f' (a float value, computed in fp32 by the kernels) or 'b' (a boolean).
Domain:  where a value varies, for an op whose tensors are rows of a dimension N:
           'scalar'  the same everywhere (constants, attributes, N itself)
           'col'     varies along N only (parameters such as weight: [N])
           'row'     one value per row (results of reductions over N)
           'elem'    varies per element
         A node's domain is the smallest one holding all its arguments' (row with col
         gives elem); reductions over N take elem/col to row, `colsum` (a sum over all
         rows, from gradients of parameters) takes elem/row to col.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from .errors import Location, SpecError
from .expr import COMPARISONS, Syntax, parse_expression
from .model import ELLIPSIS, OpSpec

UNARY_FUNCTIONS = ("exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "abs", "sign")
BINARY_FUNCTIONS = ("min", "max")
# Reductions over a named dimension: sum(e, N), mean(e, N), max(e, N), min(e, N).
REDUCTIONS = {"sum": "rsum", "mean": "rsum", "max": "rmax", "min": "rmin"}
REDUCTION_OPS = ("rsum", "rmax", "rmin")
DOMAINS = ("scalar", "col", "row", "elem")
COMPARE_OPS = {"<": "lt", "<=": "le", ">": "gt", ">=": "ge", "==": "eq", "!=": "ne"}
ARITHMETIC_OPS = {"+": "add", "-": "sub", "*": "mul", "/": "div", "**": "pow"}
NAMED_CONSTANTS = {"pi": math.pi}


class Node:
    """An interned expression node. Build with `make` (or the helpers below), never directly."""

    __slots__ = ("op", "args", "value", "type", "domain", "__weakref__")
    _interned: dict = {}

    op: str  # 'input', 'attr', 'const', or an operation name
    args: tuple["Node", ...]
    value: object  # name for input/attr, number or bool for const
    type: str
    domain: str

    @classmethod
    def make(cls, op: str, args: tuple["Node", ...] = (), value=None, type_: str = "f", domain: str | None = None) -> "Node":
        """`domain` is given for leaves (inputs); other nodes derive theirs."""
        key = (op, tuple(id(a) for a in args), type(value).__name__, repr(value), type_, domain)
        node = cls._interned.get(key)
        if node is None:
            node = object.__new__(cls)
            node.op, node.args, node.value, node.type = op, args, value, type_
            node.domain = domain or _derived_domain(op, args)
            cls._interned[key] = node
        return node

    def __repr__(self) -> str:
        if self.op in ("input", "attr"):
            return str(self.value)
        if self.op == "const":
            return repr(self.value)
        return f"{self.op}({', '.join(map(repr, self.args))})"

    @property
    def is_const(self) -> bool:
        return self.op == "const"


def join_domains(*domains: str) -> str:
    present = set(domains)
    if "elem" in present or {"row", "col"} <= present:
        return "elem"
    for d in ("row", "col"):
        if d in present:
            return d
    return "scalar"


def _derived_domain(op: str, args: tuple[Node, ...]) -> str:
    if op in REDUCTION_OPS:
        return "row" if args[0].domain in ("elem", "col") else args[0].domain
    if op == "colsum":
        return "col" if args[0].domain in ("elem", "col") else "scalar"
    return join_domains(*(a.domain for a in args))


def const(value) -> Node:
    if isinstance(value, bool):
        return Node.make("const", value=value, type_="b")
    value = float(value)
    return Node.make("const", value=0.0 if value == 0 else value)  # fold -0.0 into 0.0


def tensor(name: str, domain: str = "elem") -> Node:
    return Node.make("input", value=name, domain=domain)


def dim(name: str) -> Node:
    """The length of dimension `name` (the row length N), known per call."""
    return Node.make("dim", value=name, domain="scalar")


def attr(name: str, type_: str) -> Node:
    return Node.make("attr", value=name, type_=type_)


def _cv(node: Node):
    return node.value if node.is_const else None


def _fold_unary(op: str, v: float) -> float | None:
    try:
        if op == "exp":
            return math.exp(v)
        if op == "log":
            return math.log(v) if v > 0 else None
        if op == "sqrt":
            return math.sqrt(v) if v >= 0 else None
        if op == "rsqrt":
            return 1.0 / math.sqrt(v) if v > 0 else None
        if op == "tanh":
            return math.tanh(v)
        if op == "erf":
            return math.erf(v)
        if op == "sigmoid":
            return 1.0 / (1.0 + math.exp(-v))
        if op == "abs":
            return abs(v)
        if op == "sign":
            return float((v > 0) - (v < 0))
        if op == "neg":
            return -v
    except OverflowError:
        return None
    return None


def make(op: str, *args: Node) -> Node:
    """Build `op(args)`, simplifying on the way (constant folding, x*1, x+0, ...)."""
    values = [_cv(a) for a in args]
    if op in REDUCTION_OPS:
        raise AssertionError("build reductions with reduce()")
    if op == "no_grad":
        (a,) = args
        return a if a.domain == "scalar" or a.op == "no_grad" else Node.make(op, args)
    if op == "where":
        cond, a, b = args
        if cond.is_const:
            return a if cond.value else b
        if a is b:
            return a
        return Node.make(op, args)
    if op in COMPARE_OPS.values():
        if all(v is not None for v in values):
            x, y = values
            return const({"lt": x < y, "le": x <= y, "gt": x > y, "ge": x >= y, "eq": x == y, "ne": x != y}[op])
        return Node.make(op, args, type_="b")
    if len(args) == 1:
        (v,) = values
        if v is not None:
            folded = _fold_unary(op, v)
            if folded is not None:
                return const(folded)
        if op == "neg" and args[0].op == "neg":
            return args[0].args[0]
        return Node.make(op, args)
    a, b = args
    va, vb = values
    if va is not None and vb is not None:
        folded = _fold_binary(op, va, vb)
        if folded is not None:
            return const(folded)
    if op == "add":
        if va == 0:
            return b
        if vb == 0:
            return a
        if b.op == "neg":
            return make("sub", a, b.args[0])
    elif op == "sub":
        if vb == 0:
            return a
        if va == 0:
            return make("neg", b)
        if b.op == "neg":
            return make("add", a, b.args[0])
    elif op == "mul":
        if va == 0 or vb == 0:
            return const(0.0)
        if va == 1:
            return b
        if vb == 1:
            return a
        if va == -1:
            return make("neg", b)
        if vb == -1:
            return make("neg", a)
        if a.op == "neg" and b.op == "neg":
            return make("mul", a.args[0], b.args[0])
        # A constant joins a per-row factor, computed once per row: c * (r * e) is
        # (c * r) * e, one multiply per element instead of two.
        if a.domain == "scalar" and b.op == "mul" and b.domain not in ("scalar", "row"):
            for r, e in (b.args, b.args[::-1]):
                if r.domain in ("scalar", "row"):
                    return make("mul", make("mul", a, r), e)
        if a.op == "neg":
            return make("neg", make("mul", a.args[0], b))
        if b.op == "neg":
            return make("neg", make("mul", a, b.args[0]))
    elif op == "div":
        if vb == 1:
            return a
        if va == 0:
            return const(0.0)
        if a.op == "neg":
            return make("neg", make("div", a.args[0], b))
    elif op == "pow":
        return _power(a, b)
    return Node.make(op, args)


def reduce(op: str, arg: Node, dimension: str) -> Node:
    """A reduction over `dimension` (rsum, rmax, rmin) of `arg`; per-row values pass
    through max/min unchanged and are multiplied by the length in a sum."""
    if arg.domain in ("scalar", "row"):
        return make("mul", arg, dim(dimension)) if op == "rsum" else arg
    return Node.make(op, (arg,), value=dimension)


def mean(arg: Node, dimension: str) -> Node:
    """mean(arg, dimension): the sum over `dimension` divided by its length."""
    return make("div", reduce("rsum", arg, dimension), dim(dimension))


def reduction_depth(node: Node, memo: dict[int, int]) -> int:
    """The longest chain of reductions in `node` (its own included): the pass over the
    row that can compute it, counting from 1; 0 for what needs no reduction."""
    if id(node) not in memo:
        below = max((reduction_depth(a, memo) for a in node.args), default=0)
        memo[id(node)] = below + 1 if node.op in REDUCTION_OPS else below
    return memo[id(node)]


def with_args(node: Node, args: tuple[Node, ...]) -> Node:
    """`node` with new arguments (the node itself when they are the same)."""
    if all(a is b for a, b in zip(args, node.args)):
        return node
    if node.op in REDUCTION_OPS or node.op == "colsum":
        return Node.make(node.op, args, value=node.value)
    return make(node.op, *args)


def rewrite_node(node: Node, step, memo: dict[int, Node]) -> Node:
    """`node` rebuilt from its rewritten arguments and then passed through `step`; each
    node is rewritten once per `memo`, so shared subexpressions stay shared."""
    done = memo.get(id(node))
    if done is None:
        done = memo[id(node)] = step(with_args(node, tuple(rewrite_node(a, step, memo) for a in node.args)))
    return done


def rewrite_bottom_up(results: dict[str, Node], step) -> dict[str, Node]:
    """`results` with every node rewritten by rewrite_node (one memo for all of them)."""
    memo: dict[int, Node] = {}
    return {name: rewrite_node(node, step, memo) for name, node in results.items()}


def row_factor(node: Node) -> tuple[Node, Node]:
    """(factor, rest) with node == factor * rest, the factor per row (or constant): the
    per-row factors of a product pulled out of it."""
    if node.domain in ("row", "scalar"):
        return node, const(1.0)
    if node.op == "mul":
        (fa, ra), (fb, rb) = row_factor(node.args[0]), row_factor(node.args[1])
        return make("mul", fa, fb), make("mul", ra, rb)
    if node.op == "div" and node.args[1].domain in ("row", "scalar"):
        f, r = row_factor(node.args[0])
        return make("div", f, node.args[1]), r
    if node.op == "neg":
        f, r = row_factor(node.args[0])
        return make("neg", f), r
    return const(1.0), node


def linear_parts(node: Node) -> list[tuple[Node, Node]]:
    """node == sum of factor * rest over the parts: its terms (through +, - and unary
    minus, not into products), each split by row_factor."""
    if node.op in ("add", "sub"):
        right = linear_parts(node.args[1])
        if node.op == "sub":
            right = [(make("neg", f), r) for f, r in right]
        return linear_parts(node.args[0]) + right
    if node.op == "neg":
        return [(make("neg", f), r) for f, r in linear_parts(node.args[0])]
    return [row_factor(node)]


def colsum(arg: Node) -> Node:
    """The sum over all rows of `arg` (gradients of per-column parameters)."""
    return Node.make("colsum", (arg,))


def _power(base: Node, exponent: Node) -> Node:
    """x**0.5 and x**-0.5 become roots; other constant powers stay `pow` and the
    printer writes small integer ones as products (exact, and faster than powf)."""
    c = _cv(exponent)
    if c == 0:
        return const(1.0)
    if c == 1:
        return base
    if c == 0.5:
        return make("sqrt", base)
    if c == -0.5:
        return make("rsqrt", base)
    return Node.make("pow", (base, exponent))


def _fold_binary(op: str, x: float, y: float) -> float | None:
    try:
        if op == "add":
            return x + y
        if op == "sub":
            return x - y
        if op == "mul":
            return x * y
        if op == "div":
            return x / y if y != 0 else None
        if op == "pow":
            result = x**y
            return result if isinstance(result, float) else None
        if op == "min":
            return min(x, y)
        if op == "max":
            return max(x, y)
    except (OverflowError, ZeroDivisionError, ValueError):
        return None
    return None


# ---------------------------------------------------------------------------------
# Lowering spec math to the IR
# ---------------------------------------------------------------------------------


@dataclass
class Graph:
    """The math of one op for one choice of its string attributes.

    `results` maps each output (or, for a backward graph, each input's gradient) to
    its node; `names` gives the spec's names to the nodes they were assigned to, so
    the generated code reads like the spec."""

    spec: OpSpec
    specialization: dict[str, str | bool]
    results: dict[str, Node]
    names: dict[Node, str] = field(default_factory=dict)
    bindings: dict[str, Node] = field(default_factory=dict)  # every name the math assigned


class _Lowering:
    def __init__(self, spec: OpSpec, specialization: dict[str, str | bool], env: dict[str, Node]):
        self.spec = spec
        self.specialization = specialization
        self.env = env
        self.string_attrs = {a.name: a for a in spec.attrs if a.type == "str"}
        self.dims = {reduced_dim(spec)} - {None}

    def lower(self, tree: Syntax, where: Location, context: str) -> Node:
        self.where, self.context = where, context
        return self.visit(tree)

    def fail(self, tree: Syntax, message: str):
        raise SpecError(self.where, f"in {self.context}: {message} (column {tree.column})")

    def visit(self, t: Syntax) -> Node:
        if t.kind == "num":
            return const(t.value)
        if t.kind == "str":
            self.fail(t, f"a string ('{t.value}') may only be compared with a string attribute")
        if t.kind == "name":
            if t.value in self.string_attrs:
                self.fail(t, f"string attribute '{t.value}' may only be compared with one of its choices")
            if t.value in self.env:
                return self.env[t.value]
            if t.value in NAMED_CONSTANTS:
                return const(NAMED_CONSTANTS[t.value])
            self.fail(t, f"unknown name '{t.value}'")
        if t.kind == "neg":
            return make("neg", self.number(t.args[0]))
        if t.kind == "binary":
            if t.value in COMPARISONS:
                return self.compare(t)
            return make(ARITHMETIC_OPS[t.value], self.number(t.args[0]), self.number(t.args[1]))
        if t.kind == "call":
            return self.call(t)
        raise AssertionError(t.kind)

    def number(self, t: Syntax) -> Node:
        node = self.visit(t)
        if node.type != "f":
            self.fail(t, "expected a number here, got a condition")
        return node

    def compare(self, t: Syntax) -> Node:
        left, right = t.args
        for name_side, str_side in ((left, right), (right, left)):
            if name_side.kind == "name" and name_side.value in self.string_attrs:
                attribute = self.string_attrs[name_side.value]
                if str_side.kind != "str" or t.value not in ("==", "!="):
                    self.fail(t, f"string attribute '{attribute.name}' may only be compared with == or != to a string")
                if str_side.value not in attribute.choices:
                    choices = ", ".join(repr(c) for c in attribute.choices)
                    self.fail(str_side, f"'{str_side.value}' is not a choice of '{attribute.name}' ({choices})")
                equal = self.specialization[attribute.name] == str_side.value
                return const(equal if t.value == "==" else not equal)
        return make(COMPARE_OPS[t.value], self.number(left), self.number(right))

    def call(self, t: Syntax) -> Node:
        name, args = t.value, t.args
        if name in REDUCTIONS and len(args) == 2 and args[1].kind == "name" and args[1].value in self.dims:
            if name == "mean":
                return mean(self.number(args[0]), args[1].value)
            return reduce(REDUCTIONS[name], self.number(args[0]), args[1].value)
        if name in ("sum", "mean") or (name in REDUCTIONS and len(args) == 2 and args[1].kind == "name"
                                       and args[1].value not in self.env and args[1].value not in NAMED_CONSTANTS):
            dims = ", ".join(sorted(self.dims)) or "none"
            self.fail(t, f"{name}() reduces over a dimension of the inputs' shapes, e.g. {name}(x, N) "
                         f"(this op's named dimensions: {dims})")
        if name == "no_grad":
            self.arity(t, 1)
            return make("no_grad", self.number(args[0]))
        if name in UNARY_FUNCTIONS:
            self.arity(t, 1)
            return make(name, self.number(args[0]))
        if name in BINARY_FUNCTIONS:
            self.arity(t, 2)
            return make(name, self.number(args[0]), self.number(args[1]))
        if name == "where":
            self.arity(t, 3)
            cond = self.visit(args[0])
            if cond.type != "b":
                self.fail(args[0], "the first argument of where() must be a condition such as x > 0")
            return make("where", cond, self.number(args[1]), self.number(args[2]))
        known = ", ".join((*UNARY_FUNCTIONS, *BINARY_FUNCTIONS, "where", "sum", "mean", "no_grad"))
        self.fail(t, f"unknown function '{name}' (known: {known})")

    def arity(self, t: Syntax, n: int) -> None:
        if len(t.args) != n:
            self.fail(t, f"{t.value}() takes {n} argument{'s' if n > 1 else ''}, got {len(t.args)}")


def named_dims(spec: OpSpec) -> set[str]:
    """The named dimensions of the op's shapes (a group `*S` counts as `S`)."""
    return {d.lstrip("*") for item in (*spec.inputs, *spec.outputs) for d in item.shape if d != ELLIPSIS}


def is_channel_op(spec: OpSpec) -> bool:
    """An op over [B, C, *S] tensors: rows are (batch, channel) pairs, reduced over S."""
    return any(item.shape and item.shape[-1].startswith("*") for item in (*spec.inputs, *spec.outputs))


def reduced_dim(spec: OpSpec) -> str | None:
    """The dimension reductions run over: the last one (N, or the group S)."""
    for item in (*spec.inputs, *spec.outputs):
        if item.shape and item.shape[-1] != ELLIPSIS:
            if len(item.shape) > 1 or not is_channel_op(spec):
                return item.shape[-1].lstrip("*")
    return None


def shape_domain(spec: OpSpec, shape: tuple[str, ...]) -> str:
    """[...] is per element in an elementwise op; with a named dimension N, [..., N] is
    per element, [N] per column and [...] per row. In a channel op, [B, C, *S] is per
    element and [C] is constant along each row (a per-channel parameter)."""
    if is_channel_op(spec):
        return "elem" if shape[-1].startswith("*") else "row"
    if not named_dims(spec) or len(shape) == 2:
        return "elem"
    return "row" if shape == (ELLIPSIS,) else "col"


def base_env(spec: OpSpec, specialization: dict[str, str | bool]) -> dict[str, Node]:
    """The inputs and the numeric attributes by name; a bool attribute is the constant its
    specialization gives it (a where() on it keeps one branch)."""
    env: dict[str, Node] = {i.name: tensor(i.name, shape_domain(spec, i.shape)) for i in spec.inputs}
    for a in spec.attrs:
        if a.type == "bool" and a.name in specialization:
            env[a.name] = const(bool(specialization[a.name]))
        elif a.type != "str":
            env[a.name] = attr(a.name, "b" if a.type == "bool" else "f")
    return env


def lower_forward(spec: OpSpec, specialization: dict[str, str | bool]) -> Graph:
    """Lower the spec's `math` to a Graph whose results are the outputs."""
    env = base_env(spec, specialization)
    lowering = _Lowering(spec, specialization, env)
    names: dict[Node, str] = {}
    string_attrs = {a.name for a in spec.attrs if a.type == "str"}
    bindings: dict[str, Node] = {}
    outputs_read_back = set()  # outputs of a row op that later lines of math read
    if reduced_dim(spec) is not None:
        for k, line in enumerate(spec.math):
            later = " ".join(m.source for m in spec.math[k + 1:])
            if line.name in {o.name for o in spec.outputs} and re.search(rf"\b{line.name}\b", later):
                outputs_read_back.add(line.name)
    for line in spec.math:
        if line.name in env or line.name in string_attrs:
            raise SpecError(line.where, f"'{line.name}' is already defined; each name is assigned once")
        tree = parse_expression(line.source, line.where, f"'{line.name}'")
        node = lowering.lower(tree, line.where, f"'{line.name}'")
        if node.type != "f":
            raise SpecError(line.where, f"'{line.name}' is a condition; only numbers can be assigned (use where())")
        if line.name in outputs_read_back and node.domain != "scalar" and node.op != "input":
            # An output of a row op is read by later math as the caller gets it, rounded to the
            # dtype (add_layernorm normalizes the hidden it returns, as torch's own
            # layer_norm(x + residual) does), so that a backward reading the output back
            # (autodiff.saved_element_outputs) computes with the values the forward used.
            node = make("stored", node)
        env[line.name] = node
        bindings[line.name] = node
        names.setdefault(node, line.name)
    for o in spec.outputs:
        if o.name not in env or o.name not in {m.name for m in spec.math}:
            raise SpecError(o.where, f"output '{o.name}' is never assigned in 'math'")
    results = {o.name: env[o.name] for o in spec.outputs}
    return Graph(spec, specialization, results, names, bindings)


def lower_gradient_override(spec: OpSpec, specialization: dict[str, str | bool], env: dict[str, Node], line) -> Node:
    """Lower a `grads:` formula; it may use the inputs, attributes, math names and grad_<output>."""
    lowering = _Lowering(spec, specialization, env)
    tree = parse_expression(line.source, line.where, f"the gradient of '{line.name}'")
    node = lowering.lower(tree, line.where, f"the gradient of '{line.name}'")
    if node.type != "f":
        raise SpecError(line.where, f"the gradient of '{line.name}' must be a number, not a condition")
    return node


def topological_order(roots, stop=()) -> list[Node]:
    """Every node reachable from `roots`, each after its arguments, in a stable order.
    Nodes whose id is in `stop` (values already computed) are listed but not entered."""
    order: list[Node] = []
    seen: set[int] = set()
    stack = [(r, False) for r in reversed(list(roots))]
    while stack:
        node, expanded = stack.pop()
        if id(node) in seen:
            continue
        if expanded or id(node) in stop:
            seen.add(id(node))
            order.append(node)
            continue
        stack.append((node, True))
        for a in reversed(node.args):
            if id(a) not in seen:
                stack.append((a, False))
    return order

"""Print an expression graph as C++ statements, shared by the CUDA and CPU emitters.

A node gets its own `const float` line when the spec named it, when it is used more
than once, or when it is a result; everything else is inlined, so the generated math
reads like the spec.
"""
from __future__ import annotations

from .ir import Graph, Node, topological_order

# Spec functions -> members of avo::Functions<Precision> (csrc/include/avo/math.h),
# which the generated math reaches through the alias `F`.
FUNCTIONS = {name: f"F::{name}" for name in
             ("exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "abs", "sign", "pow")}
FUNCTIONS.update({"min": "F::minimum", "max": "F::maximum"})
FUNCTIONS["stored"] = "row.as_stored"  # an output as rounded to the row's dtype (row ops only)
INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
COMPARE = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
# Binding strength, for the fewest parentheses that keep the meaning.
PRECEDENCE = {"where": 0, "lt": 1, "le": 1, "gt": 1, "ge": 1, "eq": 1, "ne": 1,
              "add": 2, "sub": 2, "mul": 3, "div": 3, "neg": 4}
ATOM = 5
SMALL_POWERS = (-1.0, 2.0, 3.0, 4.0)  # printed as products or a reciprocal


def needs_parentheses(child_prec: int, parent_prec: int, right: bool) -> bool:
    """Whether an operand printed inline needs parentheses under its parent: it binds less
    tightly, or as tightly on the right (which keeps the spec's order: a - (b - c))."""
    return child_prec < parent_prec or (child_prec == parent_prec and right)


def float_literal(value: float) -> str:
    text = repr(float(value))
    if "e" not in text and "." not in text:
        text += ".0"
    return text + "f"


def literal(node: Node) -> str:
    if node.type == "b":
        return "true" if node.value else "false"
    return float_literal(node.value)


def fusable_products(roots) -> set[int]:
    """The products (ids of "mul" nodes) of per-element values whose only use, anywhere
    under `roots`, is one add or sub: printed as one F::fma with it. A product used
    anywhere else is rounded on its own everywhere, so that every pass computes the same
    value from it (swish_layernorm sums x * sigmoid(x) over the row and then subtracts the
    mean from it: fused in the subtraction only, a row of one element would not
    normalize to exactly zero). Row-level products are left alone: they are hoisted out
    of the passes and named."""
    parents: dict[int, list[Node]] = {}
    order = topological_order(roots)
    for node in order:
        for a in node.args:
            parents.setdefault(id(a), []).append(node)
    return {id(n) for n in order
            if n.op == "mul" and n.domain in ("elem", "col") and len(parents.get(id(n), ())) == 1
            and parents[id(n)][0].op in ("add", "sub")}


class StatementPrinter:
    """Turns `graph.results` into C++ lines assigning each result variable."""

    def __init__(self, graph: Graph, leaf_names: dict[str, str]):
        self.graph = graph
        self.leaf_names = leaf_names  # spec name -> C++ expression for inputs and attributes
        self.order = topological_order(graph.results.values())
        self.fusable = fusable_products(graph.results.values())
        self.printed_fma = False
        uses: dict[int, int] = {}
        for node in self.order:
            for a in node.args:
                uses[id(a)] = uses.get(id(a), 0) + 1
        self.uses = uses
        self.names: dict[int, str] = {}
        taken = set(leaf_names) | set(graph.results)
        for node, name in graph.names.items():
            if node.args and name not in taken and id(node) not in self.names:
                self.names[id(node)] = name
                taken.add(name)
        self.taken = taken

    def uses_functions(self) -> bool:
        """True when the math calls any function (and so needs the alias `F`); asked
        after lines()."""
        calls = any(n.op in FUNCTIONS and not (n.op == "pow" and n.args[1].is_const and n.args[1].value in SMALL_POWERS)
                    for n in self.order)
        return calls or self.printed_fma

    def lines(self) -> list[str]:
        out: list[str] = []
        result_of = {}
        for name, node in self.graph.results.items():
            result_of.setdefault(id(node), name)
        temp = 0
        for node in self.order:
            if not node.args:
                continue
            is_result = id(node) in result_of
            if not (is_result or id(node) in self.names or self.uses.get(id(node), 0) > 1):
                continue
            text = self.expr(node, top=True)
            if is_result:
                self.names[id(node)] = result_of[id(node)]
                out.append(f"{result_of[id(node)]} = {text};")
                continue
            if id(node) not in self.names:
                while f"t{temp}" in self.taken:
                    temp += 1
                self.names[id(node)] = f"t{temp}"
                temp += 1
            ctype = "bool" if node.type == "b" else "float"
            out.append(f"const {ctype} {self.names[id(node)]} = {text};")
        for name, node in self.graph.results.items():
            if result_of[id(node)] != name or not node.args:
                out.append(f"{name} = {self.ref(node)};")
        return out

    def ref(self, node: Node) -> str:
        if node.op == "const":
            return literal(node)
        if node.op in ("input", "attr"):
            return self.leaf_names[node.value]
        return self.names[id(node)]

    def expr(self, node: Node, top: bool = False) -> str:
        if not top and (not node.args or id(node) in self.names):
            return self.ref(node)
        op, args = node.op, node.args
        fused = self.fused_multiply_add(node)
        if fused is not None:
            return fused
        if op in INFIX:
            left = self.operand(args[0], op, right=False)
            right = self.operand(args[1], op, right=True)
            return f"{left} {INFIX[op]} {right}"
        if op in COMPARE:
            return f"{self.operand(args[0], op, False)} {COMPARE[op]} {self.operand(args[1], op, True)}"
        if op == "neg":
            return f"-{self.operand(args[0], op, False)}"
        if op == "where":
            return f"{self.operand(args[0], op, False)} ? {self.expr(args[1])} : {self.expr(args[2])}"
        if op == "pow" and args[1].is_const and args[1].value in SMALL_POWERS:
            exponent = int(args[1].value)
            if exponent == -1:
                return f"1.0f / {self.operand(args[0], 'div', True)}"
            factor = self.operand(args[0], "mul", False)
            return " * ".join([factor] * exponent)
        return f"{FUNCTIONS[op]}({', '.join(self.expr(a) for a in args)})"

    def fused_multiply_add(self, node: Node) -> str | None:
        """a * b + c, c + a * b, a * b - c and c - a * b as F::fma where the product is
        fusable (fusable_products) and printed inline here; None otherwise."""
        if not self.is_fused(node):
            return None
        left, right = node.args
        if self.inline_product(left):  # a * b + c, a * b - c
            (a, b), c = left.args, right
            factor = self.expr(a)
            addend = self.expr(c) if node.op == "add" else self.negated(c)
        else:  # c + a * b, c - a * b
            (a, b), c = right.args, left
            factor = self.expr(a) if node.op == "add" else self.negated(a)
            addend = self.expr(c)
        self.printed_fma = True
        return f"F::fma({factor}, {self.expr(b)}, {addend})"

    def inline_product(self, node: Node) -> bool:
        return id(node) in self.fusable and id(node) not in self.names

    def is_fused(self, node: Node) -> bool:
        """Whether `node` prints as F::fma (fused_multiply_add)."""
        return node.op in ("add", "sub") and any(self.inline_product(a) for a in node.args)

    def negated(self, node: Node) -> str:
        if node.op == "const":
            return float_literal(-node.value)
        return f"-{self.operand(node, 'neg', False)}"

    def operand(self, child: Node, parent_op: str, right: bool) -> str:
        text = self.expr(child)
        inline = child.args and id(child) not in self.names
        if child.op == "const" and child.value < 0:
            return f"({text})"
        if not inline:
            return text
        child_prec = PRECEDENCE.get(child.op, ATOM)
        if self.is_fused(child):
            child_prec = ATOM  # printed as a call
        if child.op == "pow" and child.args[1].is_const and child.args[1].value in SMALL_POWERS:
            child_prec = PRECEDENCE["mul"]  # printed as a product or quotient
        needs = needs_parentheses(child_prec, PRECEDENCE[parent_op], right)
        if parent_op == "where":
            needs = child_prec <= PRECEDENCE["where"]
        return f"({text})" if needs else text

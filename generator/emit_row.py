"""Emit the kernels of the **row** pattern: per row, reductions over the last dimension
N (one pass over the row per level of nested reductions), then the elementwise outputs;
for a backward, also per-column sums (gradients of [N]-shaped parameters), accumulated
per chunk of rows and then summed over the chunks in a fixed order (deterministic).

The math of a row op is one function, `apply(row)`, written against a row object that
provides `row.sum(term)`, `row.max(term)`, `row.sums(out, terms)` (several
independent sums in one pass), `row.sum_squares(term)` (the sum of term * term),
`row.moments(out, term)` (a sum and the sum of the squares about its mean),
`row.for_each(body)` and, for a backward with per-column outputs,
`row.for_each_with_column_sums<K>(body)` (the last pass: the body stores the element
outputs and yields the K per-column terms); each calls its lambda once per element with
an element handle `at` (`at.load(k)`, `at.load_col(k, missing)`, `at.store(k, value)`).
The CPU (avo/row_cpu.h) and the GPU (avo/row_cuda.cuh: its row versions) supply their
own.

A costly per-element value that several passes need and that depends on the element's
inputs only (swish_layernorm's x * sigmoid(x)) is a *kept value*: the first pass computes
it with `at.keep(h, value)`, the later ones take it with `at.kept(h, value)`. A row that
holds the row in registers stores it there and computes it once; the others call
`value` again.

A costly value that several passes need and that depends on per-row values too
(softmax's exp(x - max), in its sum and in its output), or that a kernel's register rows
have no room for (channel_norm's backward with swish: sigmoid(x)), is a *host-kept value*
(`at.keep_on_host(h, value)` / `at.kept_on_host(h, value)`): the CPU rows keep it in a
scratch row like the others; the GPU rows compute it again in every pass, since their
registers are sized for the kept values alone.
"""
from __future__ import annotations

import json
import textwrap

from .emit_c import StatementPrinter, float_literal, fusable_products
from .emit_kernels import bitmask, entry_points, enum_name, header_comment, launcher_params
from .ir import (REDUCTION_OPS, Graph, Node, const, linear_parts, make, reduce, reduction_depth, rewrite_bottom_up,
                 rewrite_node, topological_order, with_args)
from .schedule import OpSchedule, RowKernel, Specialization
from .tuning import DTYPES as TUNING_DTYPES, TABLES as TUNING_TABLES, UP_TO_TABLES, ArchTuning

REDUCE_CALL = {"rsum": "sum", "rmax": "max", "rmin": "min"}
# Operations that cost many instructions per element (libm calls, special-function units):
# a value containing one is worth keeping rather than computing in every pass.
COSTLY_OPS = {"exp", "log", "tanh", "erf", "sigmoid", "pow"}


def strip_no_grad(node: Node, memo: dict[int, Node]) -> Node:
    """The same expression without no_grad markers (they only matter to autodiff)."""
    return rewrite_node(node, lambda n: n.args[0] if n.op == "no_grad" else n, memo)


def earlier_sums(results: dict[str, Node]) -> dict[str, Node]:
    """Rewrites sum(c1 * e1 + c2 * e2 + ...), c per row, as c1 * sum(e1) + c2 * sum(e2)
    + ... where every new sum needs fewer reductions before it than the original, so it
    joins an earlier pass over the row. In layernorm's backward the last sum,
    sum(-(dy * w * rstd + 2 * r0 * (x - mu))), becomes -(rstd * sum(dy * w) + 2 * r0 *
    (sum(x) - mu * N)), whose sums join the pass of the mean: one pass fewer. Products
    are never multiplied out, so sum((x - mu) * (x - mu)) stays as written."""
    depth: dict[int, int] = {}

    def step(node: Node) -> Node:
        if node.op != "rsum":
            return node
        sums = [(f, reduce("rsum", r, node.value)) for f, r in linear_parts(node.args[0])]
        if max(reduction_depth(s, depth) for _, s in sums) >= reduction_depth(node, depth):
            return node
        total = make("mul", *sums[0])
        for f, s in sums[1:]:
            total = make("add", total, make("mul", f, s))
        return total

    return rewrite_bottom_up(results, step)


def per_row_reciprocals(results: dict[str, Node]) -> dict[str, Node]:
    """Rewrites a / r, a per element and r per row, as a * (1 / r): one division per row,
    hoisted out of the pass, instead of one per element (an IEEE division costs about ten
    instructions, a multiply one). Softmax's e / sum(e) becomes e * (1 / sum(e)). The
    result may differ from the division in the last bit."""
    def step(node: Node) -> Node:
        if node.op == "div" and node.args[0].domain in ("elem", "col") and node.args[1].domain == "row":
            return make("mul", node.args[0], make("div", const(1.0), node.args[1]))
        return node

    return rewrite_bottom_up(results, step)


def column_default(i) -> str:
    """The C++ value of per-column input `i` where a call leaves it out."""
    return float_literal(i.default if i.default is not None else 0.0)


class ScopePrinter(StatementPrinter):
    """Declares `roots` (C++ name -> node) as `const float` lines; nodes in `known`
    are already computed and referenced by name. `fusable`: fusable_products of the whole
    program, so that every pass fuses the same products."""

    def __init__(self, roots: dict[str, Node], known: dict[int, str], leaf_names: dict[str, str],
                 spec_names: dict[Node, str], taken: set[str], fusable: set[int]):
        self.roots = roots
        self.fusable = fusable
        self.printed_fma = False
        self.leaf_names = leaf_names
        self.order = topological_order(roots.values(), stop=known)
        self.uses = {}
        for node in self.order:
            if id(node) in known:
                continue
            for a in node.args:
                self.uses[id(a)] = self.uses.get(id(a), 0) + 1
        self.names = dict(known)
        self.known = known
        self.taken = taken | set(roots)
        for node, name in spec_names.items():
            if node.args and id(node) not in self.names and name not in taken and id(node) in {id(n) for n in self.order}:
                self.names[id(node)] = name
                taken.add(name)

    def ref(self, node: Node) -> str:
        if node.op == "dim":
            return "length"
        return super().ref(node)

    def lines(self) -> list[str]:
        out = []
        root_of = {}
        for name, node in self.roots.items():
            root_of.setdefault(id(node), name)
        for node in self.order:
            if not node.args or id(node) in self.known:
                continue
            is_root = id(node) in root_of
            if not (is_root or id(node) in self.names or self.uses.get(id(node), 0) > 1):
                continue
            text = self.expr(node, top=True)
            if is_root and id(node) not in self.names:
                self.names[id(node)] = root_of[id(node)]
            elif id(node) not in self.names:
                self.names[id(node)] = _fresh(self.taken, "t")
            ctype = "bool" if node.type == "b" else "float"
            out.append(f"const {ctype} {self.names[id(node)]} = {text};")
        for name, node in self.roots.items():
            if self.names.get(id(node)) != name:
                out.append(f"const float {name} = {self.expr(node) if node.args else self.ref(node)};")
        return out


def _fresh(taken: set[str], prefix: str) -> str:
    k = 0
    while f"{prefix}{k}" in taken:
        k += 1
    taken.add(f"{prefix}{k}")
    return f"{prefix}{k}"


class RowProgram:
    """The C++ body of `apply(row)` of one graph."""

    def __init__(self, kernel: RowKernel, graph: Graph):
        self.kernel = kernel
        memo: dict[int, Node] = {}
        self.results = per_row_reciprocals(
            earlier_sums({name: strip_no_grad(node, memo) for name, node in graph.results.items()}))
        self.spec_names = {strip_no_grad(n, memo): name for n, name in graph.names.items()}
        self.fusable = fusable_products(self.results.values())
        self.taken = {i.name for i in kernel.inputs} | {name for name, _ in kernel.scalars} | {"length", "row", "at",
                                                                                               "terms"}
        self.known: dict[int, str] = {}
        self.leaf_names = {i.name: i.name for i in kernel.inputs}
        self.leaf_names.update({name: name for name, _ in kernel.scalars})
        self.input_index = {i.name: k for k, i in enumerate(kernel.inputs)}
        self.domains = {i.name: i.domain for i in kernel.inputs}
        element_only = self._element_only()
        self.kept = self._shared_costly_values(element_only) if self._has_room_to_keep() else []
        self.host_kept = self._shared_costly_values(lambda n: n.domain == "elem", settled=self.kept)
        self.kept_names = [self._kept_name(node) for node in self.kept]
        self.host_kept_names = [self._kept_name(node) for node in self.host_kept]
        self.kept_started: set[int] = set()  # kept values some pass computed already

    # -- kept values -------------------------------------------------------------

    def _has_room_to_keep(self) -> bool:
        """Whether a register row's threads have registers for kept values: not in a kernel
        of two or more per-element inputs without per-column sums, whose threads hold four
        vectors of each (kRowVectors in avo/row_cuda.cuh, 32 registers in all) and would
        need 32 more per kept value in 16 bits. channel_norm's backward with swish kept
        its sigmoid there and spilled 88 bytes: 10-15% slower in 16 bits on the H200 (rows
        of 256 to 16384) than computing the sigmoid in both passes."""
        element_inputs = sum(i.domain == "elem" for i in self.kernel.inputs)
        return element_inputs < 2 or bool(self.kernel.column_outputs)

    @staticmethod
    def _stage_passes(stage: list[Node]) -> list[list[Node]]:
        """The passes over the row that compute one level's reductions: its sums together
        when there are several (one pass, one exchange), every other reduction alone."""
        sums = [r for r in stage if r.op == "rsum"]
        if len(sums) < 2:
            return [[r] for r in stage]
        return [sums] + [[r] for r in stage if r.op != "rsum"]

    @staticmethod
    def _is_centered_squares(total: Node, squares: Node) -> bool:
        """Whether `squares` is sum((e - total / N) * (e - total / N)) for total = sum(e):
        the sums of a mean and a variance."""
        if total.op != "rsum" or not RowProgram._is_squares(squares):
            return False
        deviation = squares.args[0].args[0]
        if deviation.op != "sub" or deviation.args[0] is not total.args[0]:
            return False
        mean = deviation.args[1]
        return (mean.op == "div" and mean.args[0] is total and mean.args[1].op == "dim"
                and mean.args[1].value == total.value == squares.value)

    @staticmethod
    def _is_squares(r: Node) -> bool:
        """Whether r is sum(e * e)."""
        return r.op == "rsum" and r.args[0].op == "mul" and r.args[0].args[0] is r.args[0].args[1]

    def _reduction_steps(self) -> list[tuple[str, list[Node]]]:
        """The reductions in the order apply_lines computes them, one call of the row each
        (a pass over the row and one exchange between its threads, but for moments):
          - ("moments", [total, squares]): sum(e), then the sum of the squares of
            e - sum(e) / N at the next level, as one call (`row.moments`: one pass where
            the row type merges per-thread moments or, in the 16-bit cluster rows that
            keep no values, sums the squares with the terms; else two;
            Reductions::moments in avo/row_cuda.cuh);
          - ("sums", [...]): the sums of one level (one pass, one exchange);
          - ("squares", [r]): a sum of e * e alone, as `row.sum_squares(term = e)`
            (each square added in one fused multiply-add on the GPU);
          - ("reduce", [r]): any other reduction alone."""
        levels, steps, d = self.levels(), [], 0
        while d < len(levels):
            if (d + 1 < len(levels) and len(levels[d]) == 1 and len(levels[d + 1]) == 1
                    and self._is_centered_squares(levels[d][0], levels[d + 1][0])):
                steps.append(("moments", [levels[d][0], levels[d + 1][0]]))
                d += 2
                continue
            steps += [("sums" if len(reductions) > 1 else "squares" if self._is_squares(reductions[0]) else "reduce",
                       reductions) for reductions in self._stage_passes(levels[d])]
            d += 1
        return steps

    @staticmethod
    def _step_roots(kind: str, reductions: list[Node]) -> list[Node]:
        """What the pass of a reduction step computes at each element."""
        if kind == "moments":
            return [reductions[0].args[0]]
        if kind == "squares":
            return [reductions[0].args[0].args[0]]
        return [r.args[0] for r in reductions]

    def _passes(self) -> list[list[Node]]:
        """The roots of each pass over the row, in the order apply_lines emits them."""
        passes = [self._step_roots(kind, reductions) for kind, reductions in self._reduction_steps()]
        last = [self.results[o.name] for o in self.kernel.outputs if o.domain in ("elem", "col")]
        passes.append([n.args[0] if n.op == "colsum" else n for n in last])
        return [p for p in passes if p]

    def _kept_name(self, node: Node) -> str:
        """The C++ name of a kept value: its name in the spec where it has one."""
        preferred = self.spec_names.get(node)
        name = preferred if preferred and preferred not in self.taken else _fresh(self.taken, "kept")
        self.taken.add(name)
        return name

    def _element_only(self):
        """node -> whether it depends on per-element inputs (and constants) alone."""
        element_only: dict[int, bool] = {}

        def only_elements(node: Node) -> bool:
            if id(node) not in element_only:
                if node.op == "input":
                    element_only[id(node)] = self.domains.get(node.value) == "elem"
                elif not node.args:
                    element_only[id(node)] = node.domain == "scalar"
                else:
                    element_only[id(node)] = node.op not in REDUCTION_OPS and all(only_elements(a) for a in node.args)
            return element_only[id(node)]

        return only_elements

    def _shared_costly_values(self, may_keep, settled: list[Node] = ()) -> list[Node]:
        """The per-element values worth computing once per element (see the module
        docstring): the largest subexpressions for which may_keep(node) holds that need a
        COSTLY_OPS operation whatever their `where` conditions say, that every element
        computes (not only one branch of a where), and that two or more passes read. A
        kept value is read whole: where a pass also needs a costly part of it on its own
        (swish_layernorm's backward: sigmoid(x) in x * sigmoid(x) - mean, and alone in
        the gradient of x), those parts are kept instead, so that no pass computes them
        again. A value computed in one branch of a where on an element's value is not
        kept (a where on a bool attribute is gone: each value has its own struct).
        `settled`: values kept already, which cost nothing and are not looked into."""
        settled_ids = {id(n) for n in settled}
        cost: dict[int, bool] = {}

        def costly(node: Node) -> bool:  # costly on every path: where(c, a, b) only if a and b are
            if id(node) not in cost:
                if id(node) in settled_ids:
                    cost[id(node)] = False
                elif node.op in COSTLY_OPS:
                    cost[id(node)] = True
                elif node.op == "where":
                    cost[id(node)] = costly(node.args[1]) and costly(node.args[2])
                else:
                    cost[id(node)] = any(costly(a) for a in node.args)
            return cost[id(node)]

        def always_computed(roots: list[Node], stop: Node | None = None) -> list[Node]:
            # not only in a branch of a where; `stop` is reached but not entered, nor are a
            # reduction (an earlier pass computed it) and a settled value
            seen, stack, found = set(), list(roots), []
            while stack:
                node = stack.pop()
                if id(node) in seen:
                    continue
                seen.add(id(node))
                found.append(node)
                if node is not stop and id(node) not in settled_ids and node.op not in REDUCTION_OPS:
                    stack += node.args[:1] if node.op == "where" else node.args
            return found

        def worth_keeping(node: Node) -> bool:
            return bool(node.args) and may_keep(node) and costly(node)

        passes = self._passes()
        uses: dict[int, int] = {}
        nodes: dict[int, Node] = {}
        for roots in passes:
            for node in always_computed(roots):
                if worth_keeping(node):
                    uses[id(node)] = uses.get(id(node), 0) + 1
                    nodes[id(node)] = node
        shared = [nodes[k] for k, count in uses.items() if count > 1]
        inside = {id(n) for big in shared for n in topological_order([big]) if n is not big}
        # The largest shared values, each replaced by its costly parts that some pass
        # reads outside it, if any (then those parts are examined in turn).
        kept, todo = [], [n for n in shared if id(n) not in inside]
        while todo:
            node = todo.pop(0)
            parts = {id(n) for n in topological_order([node]) if n is not node and worth_keeping(n)}
            alone = {id(n): n for roots in passes for n in always_computed(roots, stop=node) if id(n) in parts}
            if not alone:
                kept.append(node)
                continue
            below = {id(n) for part in alone.values() for n in topological_order([part]) if n is not part}
            todo += [n for k, n in alone.items() if k not in below and all(n is not t for t in todo + kept)]
        return kept

    def _kept_lines(self, order: list[Node], loaded_outside: list[Node], known: dict[int, str]) -> list[str]:
        """The kept values this pass reads (`order`: its nodes), then its host-kept ones,
        each computed by a lambda that loads what it reads and the pass does not load
        outside it (so that a row that kept the value reads no input for it). `known`:
        the names of what is computed already, kept values included."""
        lines = []
        outside = {id(n) for n in loaded_outside}
        for values, names, suffix in ((self.kept, self.kept_names, ""),
                                      (self.host_kept, self.host_kept_names, "_on_host")):
            for h, node in enumerate(values):
                if not any(n is node for n in order):
                    continue
                call = "kept" if id(node) in self.kept_started else "keep"
                self.kept_started.add(id(node))
                inner = {k: v for k, v in known.items() if k != id(node)}
                printer = ScopePrinter({"value": node}, inner, self.leaf_names, self.spec_names,
                                       self.taken | set(self.kept_names) | set(self.host_kept_names), self.fusable)
                loads = self._loads([n for n in printer.order if id(n) not in outside])
                body = loads + printer.lines()
                root = "const float value = "
                assert body[-1].startswith(root), body[-1]  # ScopePrinter declares its root last
                body[-1] = "return " + body[-1][len(root):]
                lines.append(f"const float {names[h]} = at.{call}{suffix}({h}, [&] {{")
                lines += [f"  {line}" for line in body] + ["});"]
        return lines

    # -- helpers ----------------------------------------------------------------

    def _loads(self, nodes: list[Node]) -> list[str]:
        """Declarations of the per-element and per-column inputs these nodes read."""
        lines, seen = [], set()
        for node in nodes:
            if node.op != "input" or node.value in seen or self.domains[node.value] in ("row", "chan", "saved"):
                continue
            seen.add(node.value)
            k = self.input_index[node.value]
            i = self.kernel.inputs[k]
            if i.domain == "elem":
                value = f"at.load({k})"
            else:
                value = f"at.load_col({k}, {column_default(i)})"
            lines.append(f"const float {node.value} = {value};")
        return lines

    def _hoist(self, roots: list[Node]) -> list[str]:
        """Row-level (per-row or constant) subexpressions of `roots`, computed once per
        row before the loop that needs them; afterwards they are known by name."""
        below = topological_order(roots, stop=self.known)
        root_ids = {id(r) for r in roots}
        tops = []
        for node in below:
            if not node.args or id(node) in self.known or node.op in REDUCTION_OPS:
                continue
            if node.domain not in ("row", "scalar"):
                continue
            feeds_elements = any(p.domain in ("elem", "col") and any(a is node for a in p.args) for p in below)
            if id(node) in root_ids or feeds_elements:
                tops.append(node)
        if not tops:
            return []
        names = {}
        for node in tops:
            preferred = self.spec_names.get(node)
            name = preferred if preferred and preferred not in self.taken else _fresh(self.taken, "r")
            self.taken.add(name)
            names[name] = node
        lines = ScopePrinter(names, self.known, self.leaf_names, self.spec_names, self.taken, self.fusable).lines()
        for name, node in names.items():
            self.known[id(node)] = name
        return lines

    def _columns_read(self, nodes: list[Node]) -> str:
        """The per-column inputs these nodes read, as the tag a pass takes first:
        `avo::columns<1, 2>` (input indices; `avo::columns<>` for none). The GPU rows load
        exactly these, a 16-byte vector at a time, in that pass."""
        read = sorted({self.input_index[n.value] for n in nodes if n.op == "input" and self.domains[n.value] == "col"})
        return f"avo::columns<{', '.join(str(k) for k in read)}>"

    def _element_block(self, roots: dict[str, Node]) -> tuple[list[str], str]:
        """The body of a pass's lambda (its loads, its kept values, then its math) and its
        columns tag."""
        full_order = topological_order(roots.values(), stop=self.known)
        known = dict(self.known)
        known.update({id(n): name for n, name in zip(self.kept + self.host_kept, self.kept_names + self.host_kept_names)})
        printer = ScopePrinter(roots, known, self.leaf_names, self.spec_names, set(self.taken), self.fusable)
        body = printer.lines()
        loads = self._loads(printer.order)
        kept = self._kept_lines(full_order, printer.order, known)
        return loads + kept + body, self._columns_read(full_order)

    # -- the program ---------------------------------------------------------------

    def levels(self) -> list[list[Node]]:
        """The reductions, grouped by the pass over the row that computes them."""
        memo: dict[int, int] = {}
        reductions = [n for n in topological_order(self.results.values()) if n.op in REDUCTION_OPS]
        depth = max((reduction_depth(r, memo) for r in reductions), default=0)
        return [[r for r in reductions if reduction_depth(r, memo) == d] for d in range(1, depth + 1)]

    def reduction_passes(self) -> int:
        """How many calls of apply reduce the row (row.sum, row.max, row.sums, row.moments,
        row.sum_squares)."""
        return len(self._reduction_steps())

    def apply_lines(self) -> list[str]:
        lines = ["[[maybe_unused]] const float length = float(row.length());"]
        leaves = {n.value: n for n in topological_order(self.results.values()) if n.op == "input"}
        for k, i in enumerate(self.kernel.inputs):
            if i.domain in ("row", "chan") and i.name in leaves:
                load = "load_row" if i.domain == "row" else "load_channel"
                lines.append(f"const float {i.name} = row.{load}({k}, {float_literal(i.default or 0.0)});")
                self.known[id(leaves[i.name])] = i.name
            elif i.domain == "saved" and i.name in leaves:  # computed by the forward
                lines.append(f"const float {i.name} = row.load_saved({k});")
                self.known[id(leaves[i.name])] = i.name
        for kind, reductions in self._reduction_steps():
            lines += self._hoist(self._step_roots(kind, reductions))
            if kind == "moments":
                lines += self._moments(*reductions)
                continue
            if kind == "sums":  # independent sums: one pass over the row, one exchange
                lines += self._fused_sums(reductions)
                continue
            r = reductions[0]
            call = "sum_squares" if kind == "squares" else REDUCE_CALL[r.op]
            name = _fresh(self.taken, f"{REDUCE_CALL[r.op]}_")
            block, columns = self._element_block({"term": self._step_roots(kind, reductions)[0]})
            lines.append(f"const float {name} = row.{call}({columns}, [&](const auto& at) {{")
            lines += [f"  {line}" for line in block] + ["  return term;", "});"]
            self.known[id(r)] = name
        outputs = list(self.kernel.outputs)
        elem = {o.name: self.results[o.name] for o in outputs if o.domain == "elem"}
        row = {o.name: self.results[o.name] for o in outputs if o.domain in ("row", "chan", "saved")}
        # A per-channel gradient is stored per row in fp32 (the binding sums the batch), and
        # so is a value saved for the backward (when the call asked for it).
        store_row = {o.name: "store_row" if o.domain == "row" else "store_row_f32" for o in outputs}
        column_sums = {o.name: self.results[o.name] for o in outputs if o.domain == "col"}
        if row:
            lines += self._hoist(list(row.values()))
            for name, node in row.items():
                value = self.known.get(id(node)) or self._scalar(node)
                lines.append(f"row.{store_row[name]}({self._output_index(name)}, {value});")
        # The last pass: the per-element outputs, and with them the summand of each
        # per-column output at this element (term_k, in column_output order), so that the
        # pass reads the row once for both.
        terms = {f"term_{k}": node.args[0] if node.op == "colsum" else node
                 for k, node in enumerate(column_sums.values())}
        if elem or terms:
            roots = {**elem, **terms}
            lines += self._hoist(list(roots.values()))
            block, columns = self._element_block(roots)
            if terms:
                lines.append(f"row.template for_each_with_column_sums<kColumnSums>({columns}, "
                             "[&](const auto& at, float* terms) {")
            else:
                lines.append(f"row.for_each({columns}, [&](const auto& at) {{")
            lines += [f"  {line}" for line in block]
            lines += [f"  at.store({self._output_index(name)}, {name});" for name in elem]
            lines += [f"  terms[{k}] = {name};" for k, name in enumerate(terms)]
            lines.append("});")
        return lines

    def _moments(self, total: Node, squares: Node) -> list[str]:
        """sum(e) and the sum of the squares of e - sum(e) / N in one pass:
        `row.moments(array, term)`."""
        names = [_fresh(self.taken, "sum_") for _ in range(2)]
        array = _fresh(self.taken, "moments_")
        block, columns = self._element_block({"term": total.args[0]})
        lines = [f"// {names[0]}: the sum of term over the row; {names[1]}: the sum of the squares of its",
                 "// deviations from their mean.",
                 f"float {array}[2];", f"row.moments({columns}, {array}, [&](const auto& at) {{"]
        lines += [f"  {line}" for line in block] + ["  return term;", "});"]
        lines += [f"const float {name} = {array}[{k}];" for k, name in enumerate(names)]
        self.known[id(total)], self.known[id(squares)] = names
        return lines

    def _fused_sums(self, sums: list[Node]) -> list[str]:
        """Sums of one level computed together: `row.sums(array, terms)`."""
        names = [_fresh(self.taken, "sum_") for _ in sums]
        array = _fresh(self.taken, "sums_")
        block, columns = self._element_block({f"term_{k}": r.args[0] for k, r in enumerate(sums)})
        lines = [f"float {array}[{len(sums)}];", f"row.sums({columns}, {array}, [&](const auto& at, float* terms) {{"]
        lines += [f"  {line}" for line in block] + [f"  terms[{k}] = term_{k};" for k in range(len(sums))]
        lines += ["});"] + [f"const float {name} = {array}[{k}];" for k, name in enumerate(names)]
        for r, name in zip(sums, names):
            self.known[id(r)] = name
        return lines

    def _scalar(self, node: Node) -> str:
        return ScopePrinter({"v": node}, self.known, self.leaf_names, self.spec_names, set(self.taken),
                            self.fusable).expr(node, top=True)

    def _output_index(self, name: str) -> int:
        return [o.name for o in self.kernel.outputs].index(name)


# ---------------------------------------------------------------------------------
# Files of a row op
# ---------------------------------------------------------------------------------

CHANNEL_NOTE = ("// The per-channel outputs of the backward (gradients of [C] parameters): the kernels\n"
                "// write one fp32 value per row, [batch, channels]; the finish sums them over the batch\n"
                "// (avo::ColumnTotals, columns [begin, end) on the CPU).")


CHUNK_NOTE = ("// Per-column outputs of the backward: fp32 partial sums per chunk of rows, then the\n"
              "// partials summed in chunk order (deterministic, no atomics).")


def _programs(kernel: RowKernel) -> list[tuple[Specialization, list[str], int, int, int]]:
    """Per specialization: the body of apply(row), how many kept and host-kept values it
    has, and how many of its passes over the row reduce it."""
    programs = []
    for specialization, graph in kernel.graphs:
        program = RowProgram(kernel, graph)
        programs.append((specialization, program.apply_lines(), len(program.kept), len(program.host_kept),
                         program.reduction_passes()))
    return programs



def _describe(kernel: RowKernel) -> str:
    ins = ", ".join(f"inputs[{k}] = {i.name} (per {_WORD[i.domain]}{', optional' if i.optional else ''})"
                    for k, i in enumerate(kernel.inputs))
    outs = ", ".join(f"outputs[{k}] = {o.name} (per {_WORD[o.domain]})" for k, o in enumerate(kernel.outputs))
    return f"{ins}; {outs}"


_WORD = {"elem": "element", "col": "column", "row": "row", "chan": "channel", "saved": "row, fp32, saved by the forward"}


def emit_row_header(s: OpSchedule) -> str:
    spec, bwd = s.spec, s.backward
    lines = [header_comment(spec.path), "#pragma once", "", "#include <cstdint>", "",
             "#include <avo/dtype.h>", "#include <avo/row_args.h>", "",
             "#if defined(AVO_WITH_CUDA)", "#include <cuda_runtime_api.h>", "#endif", "",
             f"namespace avo::ops::{spec.name} {{", ""]
    for a in spec.attrs:
        if a.type == "str":
            lines += [f"// The choices of attribute '{a.name}'.", f"enum class {enum_name(a.name)} {{ {', '.join(a.choices)} }};", ""]
    for kernel in (s.forward, s.backward):
        lines += [f"// {kernel.role.capitalize()} ({kernel.registered_name}): " + line if i == 0 else "// " + line
                  for i, line in enumerate(textwrap.wrap(_describe(kernel), 84))]
        lines += [f"using {kernel.args_type} = avo::RowArgs<{len(kernel.inputs)}, {len(kernel.outputs)}>;", ""]
    columns = bwd.column_outputs
    lines += [CHUNK_NOTE,
              f"constexpr int kColumnSums = {len(columns)};", "",
              "// CPU: the row kernels take rows [begin, end) (whole chunks when there are per-column",
              "// outputs); the finish sums columns [begin, end). The caller splits the work."]
    for kernel in (s.forward, s.backward):
        lines.append(f"void {kernel.role}_cpu(avo::DType dtype, const {kernel.args_type}& args, "
                     f"{launcher_params(kernel, 'int64_t begin, int64_t end')});")
    lines.append("void backward_columns_finish_cpu(avo::DType dtype, const BackwardArgs& args, int64_t begin, int64_t end);")
    if bwd.channel_outputs:
        lines += [CHANNEL_NOTE, "void backward_channels_finish_cpu(avo::DType dtype, const avo::ColumnTotals& totals, "
                                "int64_t begin, int64_t end);"]
    lines += ["", "#if defined(AVO_WITH_CUDA)", "// CUDA launchers enqueue their kernels on `stream`."]
    for kernel in (s.forward, s.backward):
        lines.append(f"void {kernel.role}_cuda(avo::DType dtype, const {kernel.args_type}& args, "
                     f"{launcher_params(kernel, 'cudaStream_t stream')});")
    if bwd.channel_outputs:
        lines.append("void backward_channels_finish_cuda(avo::DType dtype, const avo::ColumnTotals& totals, cudaStream_t stream);")
    lines += ["#endif", "", f"}}  // namespace avo::ops::{spec.name}", ""]
    return "\n".join(lines)


def emit_row_math(s: OpSchedule) -> str:
    spec = s.spec
    lines = [header_comment(spec.path), "#pragma once", "", "#include <cmath>", "#include <cstdint>", "",
             "#include <avo/common.h>", "#include <avo/math.h>", "", f"namespace avo::ops::{spec.name} {{", ""]
    lines += [f"// {line}" for line in textwrap.wrap(spec.doc, 86)] + [""]
    for kernel in (s.forward, s.backward):
        for specialization, apply, kept, host_kept, reduction_passes in _programs(kernel):
            title = f"{kernel.role.capitalize()} of one row"
            if specialization.choices:
                title += f", for {specialization.description}"
            columns = kernel.column_outputs if kernel.role == "backward" else ()
            lines += [f"// {title}.", f"struct {kernel.math_struct(specialization)} {{"]
            lines += [f"  {ctype} {name};" for name, ctype in kernel.math_scalars]
            elem_inputs = bitmask([i.domain == "elem" for i in kernel.inputs])
            elem_outputs = bitmask([o.domain == "elem" for o in kernel.outputs])
            col_inputs = bitmask([i.domain == "col" for i in kernel.inputs])
            saved_inputs = bitmask([i.domain == "saved" for i in kernel.inputs])
            lines += ["  // Which inputs and outputs are per element, which inputs per column, and which are",
                      "  // per-row values the forward saved (row.load_saved) (bit k: input or output k).",
                      f"  static constexpr unsigned kElementInputs = {elem_inputs};",
                      f"  static constexpr unsigned kElementOutputs = {elem_outputs};",
                      f"  static constexpr unsigned kColumnInputs = {col_inputs};",
                      f"  static constexpr unsigned kSavedInputs = {saved_inputs};",
                      "  // Per-column outputs (summed over rows by the column pass): how many, and where.",
                      f"  static constexpr int kColumnSums = {len(columns)};",
                      "  AVO_HOST_DEVICE static constexpr int column_output(int k) { return "
                      + "".join(f"k == {k} ? {c} : " for k, c in enumerate(columns)) + "-1; }",
                      "  // The value of per-column input k where the call leaves it out (as in at.load_col).",
                      "  AVO_HOST_DEVICE static constexpr float column_default(int k) { return "
                      + "".join(f"k == {k} ? {column_default(i)} : " for k, i in enumerate(kernel.inputs)
                                if i.domain == "col") + "0.0f; }",
                      "  // Per-element values computed once and kept by rows that hold the row in registers",
                      "  // (at.keep / at.kept).",
                      f"  static constexpr int kKeptValues = {kept};",
                      "  // Per-element values kept by the CPU rows alone (at.keep_on_host / at.kept_on_host):",
                      "  // they depend on per-row values too, or the register rows have no room for them.",
                      f"  static constexpr int kHostKeptValues = {host_kept};",
                      "  // Calls that reduce the row (row.sum, row.max, row.sums, row.sum_squares, row.moments, ...).",
                      f"  static constexpr int kReductionPasses = {reduction_passes};", ""]
            lines += ["  // Precision: avo::Exact or avo::Fast (avo/math.h); Row: a row type of avo/row_cpu.h or",
                      "  // avo/row_cuda.cuh.",
                      "  template <typename Precision, typename Row>",
                      "  AVO_HOST_DEVICE void apply(const Row& row) const {",
                      "    using F [[maybe_unused]] = avo::Functions<Precision>;"]
            lines += [f"    {line}" for line in apply]
            lines.append("  }")
            lines += ["};", ""]
    lines += [f"}}  // namespace avo::ops::{spec.name}", ""]
    return "\n".join(lines)


def _tuning_label(t: ArchTuning) -> str:
    if t.own:
        return f"sm_{t.arch}, {t.gpu} only"
    return f"sm_{t.arch} ({t.gpu})" if t.gpu else f"sm_{t.arch}"


def _tuning_rows(s: OpSchedule, kernel: RowKernel,
                 tunings: list[ArchTuning]) -> list[tuple[str, int, str | None, dict]]:
    """(GPU label, arch, the device name of a GPU's own row or None, table name ->
    thresholds per dtype) of one kernel: the tuned GPUs, in the order the dispatch tries
    them (load_tunings), then the rest."""
    rows = [(_tuning_label(t), t.arch, t.gpu if t.own else None,
             {table: [t.threshold(table, s.spec.name, kernel.role, d) for d in TUNING_DTYPES]
              for table in TUNING_TABLES}) for t in tunings]
    return rows + [("any other GPU", 0, None, {table: [None] * len(TUNING_DTYPES) for table in TUNING_TABLES})]


def _dispatch_table(s: OpSchedule, tunings: list[ArchTuning]) -> list[str]:
    """The row-version dispatch of both kernels: a readable table, then the arrays the
    launchers pass to avo::launch_row_op."""
    kernels = [(k, _tuning_rows(s, k, tunings)) for k in (s.forward, s.backward)]
    width = max(len(gpu) for _, rows in kernels for gpu, _, _, _ in rows)
    lines = [
        "// Which version of avo/row_cuda.cuh a call runs (pick_row_version, on the host per",
        "// call): rows of 16-byte vectors take GlobalRow from the length in vectors of the",
        "// \"global\" line on, else the cluster version from that of the \"cluster\" line on",
        "// (where it fits), else StagedRow from that of the \"staged\" line on (where it",
        "// fits), RegisterRow below it (where it fits; on narrow rows up to the length of",
        "// the \"narrow\" line, else on wide rows from that of the \"wide\" line on and where",
        "// only they fit, else pipelined from that of the \"pipelined\" line on, where the",
        "// kernel can be), the cluster version or GlobalRow otherwise; before all of",
        "// them, the tiled version from the length of the \"tiled\" line on (a backward with",
        "// per-column sums, where it can be); \"never\": only where no other version fits. A",
        "// backward with per-column sums takes coarse chunks of rows (avo::rows_per_chunk)",
        "// from the length of the \"coarse\" line on, and the cluster version without",
        "// per-column sums small blocks (avo::cluster_block_threads) from that of the",
        "// \"small\" line on; the tiled version runs as one kernel from that of the \"one\"",
        "// line on (where its blocks fit), else as two. Measured by benchmarks/tune_rows.py",
        "// (tuning/sm_<arch>.json, and tuning/sm_<arch>-<gpu>.json for a GPU of its own: a",
        "// GPU takes the first of the rows below that is its own or its arch's).",
        f"//   | {'kernel':8} | {'GPU':{width}} | {'line':9} | " + " | ".join(f"{d:>8}" for d in TUNING_DTYPES) + " |",
    ]
    for kernel, rows in kernels:
        for gpu, _, _, tables in rows:
            for table in TUNING_TABLES:
                version = table.split("_")[0]
                lines.append(f"//   | {kernel.role:8} | {gpu:{width}} | {version:9} | "
                             + " | ".join(f"{'never' if v is None else v:>8}" for v in tables[table]) + " |")

    def array(table, values):
        never = "avo::kNeverUpTo" if table in UP_TO_TABLES else "avo::kNever"
        return "{" + ", ".join(never if v is None else str(v) for v in values) + "}"

    for kernel, rows in kernels:
        lines.append(f"constexpr avo::RowTuning k{kernel.role.capitalize()}Tuning[] = {{")
        lines += [f"    {{{arch}, {', '.join(array(t, tables[t]) for t in TUNING_TABLES)}"
                  + (f", {json.dumps(own_gpu)}" if own_gpu else "") + "},"
                  for _, arch, own_gpu, tables in rows]
        lines.append("};")
    return lines + [""]


def emit_row_cuda(s: OpSchedule, tunings: list[ArchTuning] = ()) -> str:
    """The CUDA entry points: pick the element type and the math, then run the row
    kernels of avo/row_cuda.cuh, with this op's dispatch table (tuning/*.json)."""
    spec = s.spec
    lines = [header_comment(spec.path), f'#include "{spec.name}.h"', f'#include "{spec.name}_math.h"', "",
             "#include <avo/row_cuda.cuh>", "", f"namespace avo::ops::{spec.name} {{", ""]
    lines += _dispatch_table(s, list(tunings))
    lines += entry_points(
        s, "cuda", "cudaStream_t stream", "__half, __nv_bfloat16",
        lambda k, init: f"avo::launch_row_op<T, {k.args_type}>(args, {init}, "
                        f"k{k.role.capitalize()}Tuning, stream);")
    if s.backward.channel_outputs:
        lines += [
            "void backward_channels_finish_cuda(avo::DType dtype, const avo::ColumnTotals& totals, cudaStream_t stream) {",
            "  avo::visit_dtype<__half, __nv_bfloat16>(dtype, [&](auto tag) {",
            "    avo::launch_column_totals<typename decltype(tag)::type>(totals, stream);",
            "  });",
            "}",
            "",
        ]
    lines += [f"}}  // namespace avo::ops::{spec.name}", ""]
    return "\n".join(lines)


def emit_row_cpu(s: OpSchedule) -> str:
    """The CPU entry points: pick the element type and the math, then run the loops of
    avo/row_cpu.h over the rows (and columns) the caller hands out."""
    spec, bwd = s.spec, s.backward
    any_backward_math = bwd.math_struct(bwd.graphs[0][0])
    lines = [header_comment(spec.path), f'#include "{spec.name}.h"', f'#include "{spec.name}_math.h"', "",
             "#include <avo/row_cpu.h>", "", f"namespace avo::ops::{spec.name} {{", ""]
    lines += entry_points(s, "cpu", "int64_t begin, int64_t end", "avo::Half, avo::BFloat16",
                           lambda k, init: f"avo::run_rows<T, {k.args_type}>(args, {init}, begin, end);")
    lines += [
        "void backward_columns_finish_cpu(avo::DType dtype, const BackwardArgs& args, int64_t begin, int64_t end) {",
        "  avo::visit_dtype<avo::Half, avo::BFloat16>(dtype, [&](auto tag) {",
        "    using T = typename decltype(tag)::type;",
        f"    avo::run_column_finish<T, BackwardArgs, {any_backward_math}>(args, begin, end);",
        "  });",
        "}",
        "",
    ]
    if bwd.channel_outputs:
        lines += [
            "void backward_channels_finish_cpu(avo::DType dtype, const avo::ColumnTotals& totals, int64_t begin, int64_t end) {",
            "  avo::visit_dtype<avo::Half, avo::BFloat16>(dtype, [&](auto tag) {",
            "    avo::run_column_totals<typename decltype(tag)::type>(totals, begin, end);",
            "  });",
            "}",
            "",
        ]
    lines += [f"}}  // namespace avo::ops::{spec.name}", ""]
    return "\n".join(lines)

"""Reverse-mode symbolic differentiation of an expression graph.

Given the forward graph (outputs as functions of the tensor inputs), build, for each
tensor input, the expression of d(loss)/d(input) in terms of the inputs, the
attributes and one incoming gradient `grad_<output>` per output. The result is again a
`Graph`, so the backward kernels come out of the same emitters as the forward ones.
"""
from __future__ import annotations

from .errors import SpecError
from .ir import (Graph, Node, base_env, colsum, const, linear_parts, lower_forward, lower_gradient_override, make, mean,
                 reduce, reduced_dim, reduction_depth, rewrite_bottom_up, shape_domain, tensor, topological_order,
                 with_args)
from .model import OpSpec

TWO_OVER_SQRT_PI = 1.1283791670955126


def grad_name(output: str) -> str:
    return f"grad_{output}"


def _local_gradients(node: Node, adjoint: Node) -> list[tuple[Node, Node]]:
    """(argument, contribution) pairs: how `adjoint` of `node` flows to its arguments."""
    op, args, g = node.op, node.args, adjoint
    if op == "add":
        return [(args[0], g), (args[1], g)]
    if op == "sub":
        return [(args[0], g), (args[1], make("neg", g))]
    if op == "mul":
        a, b = args
        if a is b:  # d(a*a)/da = 2a: one contribution, not the same product added twice
            return [(a, make("mul", const(2.0), make("mul", g, a)))]
        return [(a, make("mul", g, b)), (b, make("mul", g, a))]
    if op == "div":
        a, b = args
        # d(a/b)/db = -(a/b)/b: reuse the quotient already computed.
        return [(a, make("div", g, b)), (b, make("neg", make("div", make("mul", g, node), b)))]
    if op == "neg":
        return [(args[0], make("neg", g))]
    if op == "pow":
        a, b = args
        if b.is_const:  # d(a**c)/da = c * a**(c-1)
            return [(a, make("mul", g, make("mul", b, make("pow", a, const(b.value - 1.0)))))]
        da = make("mul", g, make("mul", b, make("pow", a, make("sub", b, const(1.0)))))
        db = make("mul", g, make("mul", node, make("log", a)))
        return [(a, da), (b, db)]
    if op == "exp":
        return [(args[0], make("mul", g, node))]
    if op == "log":
        return [(args[0], make("div", g, args[0]))]
    if op == "sqrt":
        return [(args[0], make("div", make("mul", g, const(0.5)), node))]
    if op == "rsqrt":
        cube = make("mul", make("mul", node, node), node)
        return [(args[0], make("mul", make("mul", g, const(-0.5)), cube))]
    if op == "tanh":
        return [(args[0], make("mul", g, make("sub", const(1.0), make("mul", node, node))))]
    if op == "erf":
        a = args[0]
        slope = make("mul", const(TWO_OVER_SQRT_PI), make("exp", make("neg", make("mul", a, a))))
        return [(a, make("mul", g, slope))]
    if op == "sigmoid":
        return [(args[0], make("mul", g, make("mul", node, make("sub", const(1.0), node))))]
    if op == "abs":
        return [(args[0], make("mul", g, make("sign", args[0])))]
    if op == "sign":
        return []
    if op in ("min", "max"):
        # As torch.minimum / torch.maximum: the winner takes the gradient, a tie splits it.
        a, b = args
        a_wins = make("lt" if op == "min" else "gt", a, b)
        b_wins = make("gt" if op == "min" else "lt", a, b)
        half = make("mul", g, const(0.5))
        to_a = make("where", a_wins, g, make("where", b_wins, const(0.0), half))
        to_b = make("where", b_wins, g, make("where", a_wins, const(0.0), half))
        return [(a, to_a), (b, to_b)]
    if op == "where":
        cond, a, b = args
        return [(a, make("where", cond, g, const(0.0))), (b, make("where", cond, const(0.0), g))]
    if op == "stored":
        return [(args[0], g)]  # rounding to the dtype passes the gradient through, as in torch
    if op in ("lt", "le", "gt", "ge", "eq", "ne", "no_grad"):
        return []  # conditions carry no gradient; no_grad(e) stops it on purpose
    if op in ("rsum", "colsum"):
        return [(args[0], g)]  # a per-row (per-column) adjoint, broadcast back over the sum
    if op in ("rmax", "rmin"):
        return [(args[0], make("where", make("eq", args[0], node), g, const(0.0)))]
    raise AssertionError(f"no derivative rule for {op}")


# (domain of the value, domain of a contribution to its adjoint) -> the sum that folds
# the contribution back onto the value's own shape.
_FOLD = {("row", "elem"): "rsum", ("row", "col"): "rsum", ("col", "elem"): "colsum", ("col", "row"): "colsum"}


def _reduced_to(contribution: Node, target: Node, row_dim: str | None) -> Node:
    """A contribution to the adjoint of `target`, summed over the dimensions `target`
    does not vary along: over N for a per-row value, over the rows for a per-column one."""
    fold = _FOLD.get((target.domain, contribution.domain))
    if fold == "rsum":
        return reduce("rsum", contribution, row_dim)
    if fold == "colsum":
        return colsum(contribution)
    return contribution


def differentiate(forward: Graph) -> dict[str, Node]:
    """d(loss)/d(input) for every tensor input of `forward`'s spec."""
    spec = forward.spec
    row_dim = reduced_dim(spec)
    outputs = {o.name: o for o in spec.outputs}
    adjoints: dict[int, Node] = {}
    for output, root in forward.results.items():
        seed = _reduced_to(tensor(grad_name(output), shape_domain(spec, outputs[output].shape)), root, row_dim)
        adjoints[id(root)] = make("add", adjoints[id(root)], seed) if id(root) in adjoints else seed
    for node in reversed(topological_order(forward.results.values())):
        g = adjoints.get(id(node))
        if g is None or not node.args:
            continue
        for arg, contribution in _local_gradients(node, g):
            if arg.domain == "scalar":
                continue  # constants and attributes have no gradient
            contribution = _reduced_to(contribution, arg, row_dim)
            previous = adjoints.get(id(arg))
            adjoints[id(arg)] = contribution if previous is None else make("add", previous, contribution)
    return {i.name: adjoints.get(id(tensor(i.name, shape_domain(spec, i.shape))), const(0.0)) for i in spec.inputs}


def simplified_row_sums(results: dict[str, Node]) -> dict[str, Node]:
    """Two exact rewrites of the sums over the row that differentiation produces.

    A part that is the sum of a centered value, sum(f * (a - mean(a))) with f per row, is
    zero and dropped: the derived layernorm backward summed x - mu beside dy * w and
    dy * w * (x - mu), a third sum that only added rounding error (torch's own backward
    leaves it out). The parts are those of linear_parts: f * (a - mean(a)) as one part,
    or f * a and -(f * mean(a)) as two.

    A sum of one part, sum(f * r), becomes f * sum(r): the per-row factor leaves the
    pass, and sums that differ only by it become one (channel_norm's backward summed
    dy * gamma * (s - mu) and dy * (s - mu) * rstd). Sums of several parts stay one sum
    (split, each part would take its own accumulator and exchange)."""
    def step(node: Node) -> Node:
        if node.op != "rsum":
            return node
        dimension = node.value
        parts = linear_parts(node.args[0])
        kept = [(f, r) for f, r in parts
                if not (r.op == "sub" and r.args[1] is mean(r.args[0], dimension))]
        for f, r in list(kept):
            cancelling = (make("neg", make("mul", f, mean(r, dimension))), const(1.0))
            if r.domain == "elem" and (f, r) in kept and cancelling in kept:
                kept.remove((f, r))
                kept.remove(cancelling)
        if not kept:
            return const(0.0)
        if len(kept) == 1:  # f * sum(r); sum(r) itself when f is 1
            factor, rest = kept[0]
            return make("mul", factor, reduce("rsum", rest, dimension))
        if len(kept) == len(parts):
            return node
        total = make("mul", *kept[0])
        for f, r in kept[1:]:
            total = make("add", total, make("mul", f, r))
        return reduce("rsum", total, dimension)

    return rewrite_bottom_up(results, step)


def lower_backward(spec: OpSpec, specialization: dict[str, str | bool]) -> Graph:
    """The backward Graph: results are `grad_<input>` for every tensor input.

    A `grads:` entry in the spec replaces the derived formula for that input. In a row
    op, the name of a per-element output in it reads that output as the caller has it
    (softmax's y * (grad_y - sum(grad_y * y)): its backward reads y, not x); elsewhere
    (a map op, a per-row output) an output's name is its value, computed again."""
    forward = lower_forward(spec, specialization)
    grads = differentiate(forward)
    env = base_env(spec, specialization)
    env.update(forward.bindings)
    for o in spec.outputs:
        env[grad_name(o.name)] = tensor(grad_name(o.name), shape_domain(spec, o.shape))
        if reduced_dim(spec) is not None and shape_domain(spec, o.shape) == "elem":
            env[o.name] = tensor(o.name, "elem")
    for override in spec.grads:
        grads[override.name] = lower_gradient_override(spec, specialization, env, override)
    results = simplified_row_sums({grad_name(name): node for name, node in grads.items()})
    names = dict(forward.names)
    return Graph(spec, specialization, results, names)


def saved_row_values(forward: Graph, backward: Graph) -> tuple[Graph, dict[str, Node]]:
    """The per-row values of the forward (its reductions and what it computes from them,
    such as layernorm's mu and rstd) that the backward uses, and the backward reading
    them as inputs instead of computing them again: the forward stores them (fp32, one
    value per row each) and the backward loads them, so its passes over the row are only
    those of its own sums. Each is named as in the spec where the spec names it
    (`saved_<k>` otherwise), in the order the forward computes them.

    The largest such values are taken, so that layernorm saves rstd, not the sum of
    squares inside it."""
    order = topological_order(forward.results.values())
    depth: dict[int, int] = {}
    computed = {id(n): n for n in order if n.domain == "row" and reduction_depth(n, depth) > 0}
    used: set[int] = set()
    seen: set[int] = set()
    stack = list(backward.results.values())
    while stack:  # down from the gradients, stopping at the first per-row forward value
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if id(node) in computed:
            used.add(id(node))
        else:
            stack.extend(node.args)
    saved: dict[str, Node] = {}
    for node in order:
        if id(node) in used:
            saved[forward.names.get(node) or f"saved_{len(saved)}"] = node
    return read_as_inputs(backward, {id(node): tensor(name, "row") for name, node in saved.items()}), saved


def read_as_inputs(backward: Graph, leaves: dict[int, Node]) -> Graph:
    """`backward` with each node whose id is a key of `leaves` replaced by that input."""
    memo: dict[int, Node] = {}

    def substitute(node: Node) -> Node:
        done = memo.get(id(node))
        if done is None:
            done = leaves.get(id(node)) or with_args(node, tuple(substitute(a) for a in node.args))
            memo[id(node)] = done
        return done

    results = {name: substitute(node) for name, node in backward.results.items()}
    names = {substitute(node): name for node, name in backward.names.items()}  # x - mu is still `centered`
    return Graph(backward.spec, backward.specialization, results, names, backward.bindings)


def tensors_read(graph: Graph, domain: str | None = None) -> set[str]:
    """The names of the tensors `graph` reads (inputs, incoming gradients, saved values and
    outputs); only those of `domain` where it is given."""
    return {n.value for n in topological_order(graph.results.values())
            if n.op == "input" and (domain is None or n.domain == domain)}


def element_inputs_read(graph: Graph) -> set[str]:
    """The per-element tensors `graph` reads."""
    return tensors_read(graph, "elem")


def saved_element_outputs(forward: Graph, backward: Graph) -> tuple[Graph, tuple[str, ...]]:
    """The backward reading per-element outputs of the forward instead of computing them
    again, where that reads fewer tensors: add_rmsnorm's backward reads `hidden` (which
    the forward returns anyway) instead of x and residual, one full tensor fewer, as
    torch's autograd does for `h = x + r`. Outputs are taken in the spec's order, each
    only where it lowers the count of per-element tensors the backward reads; returns
    the backward and the outputs it reads. The saved output holds the value rounded to
    the dtype, as the caller has it."""
    taken: list[str] = []
    for o in forward.spec.outputs:
        node = forward.results[o.name]
        if node.domain != "elem":
            continue
        trial = read_as_inputs(backward, {id(node): tensor(o.name, "elem")})
        if len(element_inputs_read(trial)) < len(element_inputs_read(backward)):
            backward = trial
            taken.append(o.name)
    return backward, tuple(taken)


def check_differentiable(spec: OpSpec, graph: Graph) -> None:
    """Reject specs whose gradient uses something the backward op cannot see."""
    allowed = {i.name for i in spec.inputs} | {grad_name(o.name) for o in spec.outputs}
    for node in topological_order(graph.results.values()):
        if node.op == "input" and node.value not in allowed:
            raise SpecError(spec.where, f"internal: gradient refers to unknown tensor '{node.value}'")

"""Choose the kernel pattern of an op and describe its kernels for the emitters.

Language v1 knows one pattern, **map**: every output element depends only on the
input elements at the same (broadcast) position. Each map kernel comes in two
versions, picked on the host per call by a table the CUDA emitter writes into the
generated source:

    | layout of the call                                       | version    |
    |----------------------------------------------------------|------------|
    | all inputs dense like the output, pointers 16B-aligned    | vectorized |
    | anything else (strided, broadcast, storage offset)        | strided    |

Reductions ("row reduction then map", "column reduction") will add patterns here.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from .autodiff import (element_inputs_read, grad_name, lower_backward, saved_element_outputs, saved_row_values,
                       tensors_read)
from .errors import SpecError
from .ir import Graph, is_channel_op, lower_forward, named_dims, shape_domain
from .model import ELLIPSIS, OpSpec

CPP_SCALAR_TYPES = {"float": "float", "int": "int64_t", "bool": "bool"}


@dataclass(frozen=True)
class KernelInput:
    name: str
    optional: bool
    default: float | None
    domain: str = "elem"  # elem, col, row or chan (see kernel_domain), or saved


@dataclass(frozen=True)
class KernelOutput:
    name: str
    domain: str  # as KernelInput's; "saved": a per-row fp32 value the backward reads


@dataclass(frozen=True)
class Specialization:
    """One choice of every string attribute and one value of every bool attribute;
    kernels are compiled per specialization, so that neither is tested inside a kernel
    (a bool's where() keeps only its branch: channel_norm without swish computes no
    sigmoid)."""

    choices: tuple[tuple[str, str | bool], ...]  # (attribute, choice or value), in the spec's order

    @property
    def as_dict(self) -> dict[str, str | bool]:
        return dict(self.choices)

    @property
    def suffix(self) -> str:
        """CamelCase name part, e.g. ApproximateTanh, Swish or NoSwish; empty without string
        or bool attributes."""
        return "".join((_camel(a) if c else "No" + _camel(a)) if isinstance(c, bool) else _camel(a) + _camel(c)
                       for a, c in self.choices)

    @property
    def description(self) -> str:
        return ", ".join(f"{a}={str(c).lower()}" if isinstance(c, bool) else f'{a}="{c}"' for a, c in self.choices)


class KernelNames:
    """The names a kernel goes by in the generated code and in torch.library; shared by
    the kernels of every pattern (which provide `op`, `role` and `namespace`)."""

    @property
    def registered_name(self) -> str:
        return self.op.name if self.role == "forward" else f"{self.op.name}_backward"

    @property
    def qualified_name(self) -> str:
        return f"{self.namespace}::{self.registered_name}"

    def op_name(self, saving: bool = False) -> str:
        """registered_name, or with `saving` the name of the saving forward (row ops)."""
        return f"{self.op.name}_forward" if saving else self.registered_name

    @property
    def args_type(self) -> str:
        return f"{self.role.capitalize()}Args"

    def math_struct(self, specialization: Specialization) -> str:
        return f"{self.role.capitalize()}{specialization.suffix}Math"

    @property
    def math_scalars(self) -> tuple[tuple[str, str], ...]:
        """The scalars a math struct holds: all but the bool attributes, which each
        specialization fixes."""
        flags = {a.name for a in self.op.attrs if a.type == "bool"}
        return tuple((name, ctype) for name, ctype in self.scalars if name not in flags)


@dataclass(frozen=True)
class MapKernel(KernelNames):
    """One elementwise kernel (the forward or the backward of an op)."""

    op: OpSpec
    role: str  # "forward" or "backward"
    inputs: tuple[KernelInput, ...]
    outputs: tuple[str, ...]
    scalars: tuple[tuple[str, str], ...]  # (attribute, C++ type) passed by value
    graphs: tuple[tuple[Specialization, Graph], ...]
    namespace: str  # the torch.library namespace, "avo" for the package


@dataclass(frozen=True)
class RowKernel(KernelNames):
    """One kernel of the row pattern: rows of the last dimension N, reductions over N,
    then per-element, per-row and (backward) per-column outputs."""

    op: OpSpec
    role: str
    inputs: tuple[KernelInput, ...]
    outputs: tuple[KernelOutput, ...]
    scalars: tuple[tuple[str, str], ...]
    graphs: tuple[tuple[Specialization, Graph], ...]
    namespace: str
    # A backward's output holding the gradient of each input of the op, in order; two
    # inputs whose gradients are the same expression share one (see _shared_gradients).
    gradient_outputs: tuple[int, ...] = ()

    @property
    def column_outputs(self) -> tuple[int, ...]:
        return tuple(k for k, o in enumerate(self.outputs) if o.domain == "col")

    @property
    def channel_outputs(self) -> tuple[int, ...]:
        """A channel op's per-channel outputs (its parameter gradients)."""
        return tuple(k for k, o in enumerate(self.outputs) if o.domain == "chan")

    @property
    def saved(self) -> tuple[str, ...]:
        """A forward's per-row values for its backward (its outputs of domain "saved", last)."""
        return tuple(o.name for o in self.outputs if o.domain == "saved")


def returned_outputs(kernel: "MapKernel | RowKernel", saving: bool = False) -> tuple:
    """The outputs a registered op of `kernel` returns: every one for the saving forward
    (<op>_forward), else all but the saved values."""
    if saving or not isinstance(kernel, RowKernel):
        return kernel.outputs
    return tuple(o for o in kernel.outputs if o.domain != "saved")


@dataclass(frozen=True)
class OpSchedule:
    spec: OpSpec
    pattern: str
    specializations: tuple[Specialization, ...]
    forward: "MapKernel | RowKernel"
    backward: "MapKernel | RowKernel"

    @property
    def namespace(self) -> str:
        return self.forward.namespace

    @property
    def saved(self) -> tuple[str, ...]:
        """The per-row values the forward saves for the backward (row ops; none for maps)."""
        return self.forward.saved if isinstance(self.forward, RowKernel) else ()

    @property
    def kept_for_backward(self) -> tuple[tuple[str, int], ...]:
        """What autograd keeps from the forward for the backward: for each input of the
        backward after the incoming gradients, where it comes from, as ("input", k), the
        op's input k, ("output", k), the forward's output k, or ("saved", k), its saved
        value k. A map's backward takes the op's inputs."""
        if not isinstance(self.backward, RowKernel):
            return tuple(("input", k) for k in range(len(self.spec.inputs)))
        outputs = [o.name for o in self.spec.outputs]
        inputs = [i.name for i in self.spec.inputs]
        kept = []
        for i in self.backward.inputs[len(outputs):]:
            if i.domain == "saved":
                kept.append(("saved", self.saved.index(i.name)))
            elif i.name in outputs:
                kept.append(("output", outputs.index(i.name)))
            else:
                kept.append(("input", inputs.index(i.name)))
        return tuple(kept)

    @property
    def gradient_outputs(self) -> tuple[int, ...]:
        """For each input of the op, the backward output that holds its gradient."""
        shared = getattr(self.backward, "gradient_outputs", ())
        return shared or tuple(range(len(self.spec.inputs)))

    @property
    def gradient_owners(self) -> list[KernelInput]:
        """For each backward output, the (first) input of the op whose gradient it is."""
        return [self.forward.inputs[self.gradient_outputs.index(k)] for k in range(len(self.backward.outputs))]

    @property
    def registrations(self) -> list[tuple["MapKernel | RowKernel", bool]]:
        """(kernel, saving) of each registered op: the op, its saving forward (<op>_forward)
        where the forward saves values, the backward."""
        return [(self.forward, False)] + ([(self.forward, True)] if self.saved else []) + [(self.backward, False)]


def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


def specializations(spec: OpSpec) -> tuple[Specialization, ...]:
    """Every combination of a choice of each string attribute and a value of each bool
    attribute (false first), in the order of the spec's attributes."""
    options = [[(a.name, c) for c in a.choices] if a.type == "str" else [(a.name, False), (a.name, True)]
               for a in spec.attrs if a.type in ("str", "bool")]
    return tuple(Specialization(tuple(combo)) for combo in itertools.product(*options))


def _row_dimension(spec: OpSpec) -> str | None:
    """The dimension N a row op reduces over, after checking every shape fits the row
    pattern: [..., N] per element, [N] per column, [...] per row."""
    dims = sorted(named_dims(spec))
    if not dims:
        return None
    if is_channel_op(spec):
        return _channel_dimensions(spec)
    first = next(item for item in (*spec.inputs, *spec.outputs) if any(d != ELLIPSIS for d in item.shape))
    if len(dims) > 1:
        raise SpecError(first.where, f"an op reduces over one named dimension for now, this one names {', '.join(dims)}")
    n = dims[0]
    allowed = {(ELLIPSIS, n), (n,), (ELLIPSIS,)}
    for item in (*spec.inputs, *spec.outputs):
        if item.shape not in allowed:
            raise SpecError(item.where, f"'{item.name}' has shape {list(item.shape)}; a row op takes [..., {n}] "
                                        f"(per element), [{n}] (per column) or [...] (per row)")
    for o in spec.outputs:
        if o.shape == (n,):
            raise SpecError(o.where, f"output '{o.name}' is per column; outputs are [..., {n}] or [...]")
    if not any(i.shape == (ELLIPSIS, n) for i in spec.inputs):
        raise SpecError(spec.inputs[0].where, f"a row op needs an input of shape [..., {n}]")
    return n


def _channel_dimensions(spec: OpSpec) -> str:
    """Checks a channel op's shapes: [B, C, *S] per element, [C] per channel."""
    shaped = next(item for item in (*spec.inputs, *spec.outputs) if item.shape[-1].startswith("*"))
    if len(shaped.shape) != 3 or ELLIPSIS in shaped.shape:
        raise SpecError(shaped.where, f"'{shaped.name}' has shape {list(shaped.shape)}; a channel op's tensors are "
                                      "[B, C, *S] (batch, channel, a group of spatial dimensions)")
    batch, channel, group = shaped.shape
    for item in (*spec.inputs, *spec.outputs):
        if item.shape != shaped.shape and item.shape != (channel,):
            raise SpecError(item.where, f"'{item.name}' has shape {list(item.shape)}; a channel op takes "
                                        f"[{batch}, {channel}, {group}] or [{channel}]")
    for o in spec.outputs:
        if o.shape != shaped.shape:
            raise SpecError(o.where, f"output '{o.name}' must have shape [{batch}, {channel}, {group}]")
    return group.lstrip("*")


def kernel_domain(spec: OpSpec, shape: tuple[str, ...]) -> str:
    """Where a tensor varies, as the kernels and bindings see it: a channel op's [C]
    parameters are read per channel ('chan'), everything else as in the IR."""
    if is_channel_op(spec) and not shape[-1].startswith("*"):
        return "chan"
    return shape_domain(spec, shape)


def schedule(spec: OpSpec, namespace: str = "avo") -> OpSchedule:
    row_dim = _row_dimension(spec)
    variants = specializations(spec)
    if row_dim is not None:
        return _schedule_rows(spec, namespace, variants)
    forward_graphs = tuple((s, lower_forward(spec, s.as_dict)) for s in variants)
    backward_graphs = tuple((s, lower_backward(spec, s.as_dict)) for s in variants)
    scalars = tuple((a.name, CPP_SCALAR_TYPES[a.type]) for a in spec.attrs if a.type != "str")
    inputs = tuple(KernelInput(i.name, i.optional, i.default) for i in spec.inputs)
    forward = MapKernel(spec, "forward", inputs, tuple(o.name for o in spec.outputs), scalars, forward_graphs, namespace)
    grad_inputs = tuple(KernelInput(grad_name(o.name), False, None) for o in spec.outputs)
    backward = MapKernel(
        spec, "backward", grad_inputs + inputs, tuple(grad_name(i.name) for i in spec.inputs), scalars,
        backward_graphs, namespace,
    )
    return OpSchedule(spec, "map", variants, forward, backward)


def _schedule_rows(spec: OpSpec, namespace: str, variants) -> OpSchedule:
    forward_graphs = tuple((s, lower_forward(spec, s.as_dict)) for s in variants)
    for _, graph in forward_graphs:
        for o in spec.outputs:
            if shape_domain(spec, o.shape) == "row" and graph.results[o.name].domain not in ("row", "scalar"):
                raise SpecError(o.where, f"output '{o.name}' has shape [...] (one value per row) but its math "
                                         "varies along the reduced dimension; reduce it or give it that dimension")
    backward_graphs = tuple((s, lower_backward(spec, s.as_dict)) for s in variants)
    forward_graphs, backward_graphs, saved = _save_row_values(forward_graphs, backward_graphs)
    backward_graphs, read_outputs = _read_outputs(spec, forward_graphs, backward_graphs)
    scalars = tuple((a.name, CPP_SCALAR_TYPES[a.type]) for a in spec.attrs if a.type != "str")
    inputs = tuple(KernelInput(i.name, i.optional, i.default, kernel_domain(spec, i.shape)) for i in spec.inputs)
    outputs = tuple(KernelOutput(o.name, kernel_domain(spec, o.shape)) for o in spec.outputs)
    saved_outputs = tuple(KernelOutput(name, "saved") for name in saved)
    forward = RowKernel(spec, "forward", inputs, outputs + saved_outputs, scalars, forward_graphs, namespace)
    grad_inputs = tuple(KernelInput(grad_name(o.name), False, None, o.domain) for o in outputs)
    saved_inputs = tuple(KernelInput(name, False, None, "saved") for name in saved)
    output_inputs = tuple(KernelInput(o.name, False, None, o.domain) for o in outputs if o.name in read_outputs)
    sources = _shared_gradients(inputs, backward_graphs)
    grad_outputs = tuple(KernelOutput(grad_name(i.name), i.domain) for k, i in enumerate(inputs) if sources[k] == k)
    gradient_outputs = tuple(sorted(set(sources)).index(source) for source in sources)
    # The saved values and outputs come before the inputs, whose optional ones (with their
    # defaults) end the list. A required input that no backward reads is left out (x and
    # residual of add_rmsnorm, whose backward reads hidden), so that autograd need not keep it.
    read = set().union(*(tensors_read(g) for _, g in backward_graphs))
    backward_inputs = tuple(i for i in inputs if i.optional or i.name in read)
    backward = RowKernel(spec, "backward", grad_inputs + saved_inputs + output_inputs + backward_inputs, grad_outputs,
                         scalars, backward_graphs, namespace, gradient_outputs)
    return OpSchedule(spec, "row", variants, forward, backward)


def _read_outputs(spec: OpSpec, forward_graphs, backward_graphs):
    """The backward graphs after saved_element_outputs, and the outputs they read, in the
    spec's order: those saved_element_outputs takes in place of inputs (as for the saved
    values, every specialization must take the same, else none) and the per-element ones
    a gradient formula of the spec names (softmax's y; per element, since a saved per-row
    value may share an output's name)."""
    pairs = [saved_element_outputs(f, b) for (_, f), (_, b) in zip(forward_graphs, backward_graphs)]
    names = {taken for _, taken in pairs}
    taken = set()
    if len(names) == 1:
        backward_graphs = tuple((s, b) for (s, _), (b, _) in zip(backward_graphs, pairs))
        taken = set(names.pop())
    named = set().union(*(element_inputs_read(b) for _, b in backward_graphs))
    return backward_graphs, tuple(o.name for o in spec.outputs if o.name in taken or o.name in named)


def _shared_gradients(inputs: tuple[KernelInput, ...], backward_graphs) -> list[int]:
    """For each input, the first input with the same gradient: add_layernorm's residual
    gets x's (both are grad_hidden + the gradient through y). The backward writes such a
    gradient once and autograd hands the tensor to both inputs, as torch's own add does:
    one full tensor fewer written. Only required per-element inputs share, and only
    where the gradients are the same node in every specialization."""
    sources = []
    for k, i in enumerate(inputs):
        same = [j for j in range(k) if sources[j] == j and not i.optional and not inputs[j].optional
                and i.domain == inputs[j].domain == "elem"
                and all(g.results[grad_name(i.name)] is g.results[grad_name(inputs[j].name)] for _, g in backward_graphs)]
        sources.append(same[0] if same else k)
    return sources


def _save_row_values(forward_graphs, backward_graphs):
    """The graphs of a row op after saved_row_values: the forward also yields the per-row
    values its backward reads, the backward reads them as inputs. The kernels of every
    specialization share one signature, so an op whose specializations would save
    different values saves none (its backward computes them again)."""
    pairs = [saved_row_values(f, b) for (_, f), (_, b) in zip(forward_graphs, backward_graphs)]
    names = {tuple(saved) for _, saved in pairs}
    if len(names) != 1:
        return forward_graphs, backward_graphs, ()
    forwards = tuple((s, Graph(f.spec, f.specialization, {**f.results, **saved}, f.names, f.bindings))
                     for (s, f), (_, saved) in zip(forward_graphs, pairs))
    backwards = tuple((s, b) for (s, _), (b, _) in zip(backward_graphs, pairs))
    return forwards, backwards, names.pop()


def channels_first(kernel) -> bool:
    """True for the kernels of a channel op ([B, C, *S] tensors)."""
    return is_channel_op(kernel.op)

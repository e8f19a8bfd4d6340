"""The spec model: frozen dataclasses built from a YAML spec, rejecting unknown keys.

Every object keeps `where` (file:line) so that later stages can point at the spec.
The language itself is documented in specs/README.md; keep the two in step.
"""
from __future__ import annotations

import keyword
import math
import re
import struct
from dataclasses import dataclass
from typing import Any

from .errors import Location, SpecError
from .yaml_source import YNode, load_yaml

SUPPORTED_DTYPES = ("float32", "float16", "bfloat16")
ATTR_TYPES = ("float", "int", "bool", "str")
ELLIPSIS = "..."

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Names that would clash with C++, with Python, or with the names the emitters use.
_RESERVED = frozenset(keyword.kwlist) | frozenset(
    """
    auto bool break case char const continue default delete do double else enum extern
    float for goto if inline int long namespace new operator private public register
    return short signed sizeof static struct switch template this typedef union unsigned
    void volatile while T n i k args stream dtype self ctx grad out pi
    """.split()
)


@dataclass(frozen=True)
class TensorInput:
    name: str
    shape: tuple[str, ...]  # symbolic dims; "..." stands for any number of leading dims
    optional: bool
    default: float | None  # the value a missing optional input stands for
    doc: str
    where: Location


@dataclass(frozen=True)
class Attr:
    name: str
    type: str  # one of ATTR_TYPES
    default: Any  # None when the attribute is required
    choices: tuple[str, ...]  # for type "str": the values it may take
    doc: str
    where: Location


@dataclass(frozen=True)
class Output:
    name: str
    shape: tuple[str, ...]
    doc: str
    where: Location


@dataclass(frozen=True)
class Assignment:
    """`name = source`: one line of math (or of a gradient override)."""

    name: str
    source: str
    where: Location


@dataclass(frozen=True)
class OpSpec:
    name: str
    doc: str
    dtypes: tuple[str, ...]
    inputs: tuple[TensorInput, ...]
    attrs: tuple[Attr, ...]
    outputs: tuple[Output, ...]
    math: tuple[Assignment, ...]
    grads: tuple[Assignment, ...]  # overrides: input name -> formula using grad_<output>
    path: str  # the spec file as shown in messages, e.g. specs/gelu.yaml
    where: Location

    def input(self, name: str) -> TensorInput:
        return next(i for i in self.inputs if i.name == name)

    @property
    def has_string_attrs(self) -> bool:
        return any(a.type == "str" for a in self.attrs)


class _Fields:
    """Consume the keys of a YAML mapping one by one; `finish` rejects what is left."""

    def __init__(self, node: YNode, what: str):
        if node.kind != "mapping":
            raise SpecError(node.where, f"{what} must be a mapping")
        self.node = node
        self.what = what
        self.left = dict(node.value)

    def pop(self, key: str, kind: str | None = None, required: bool = False) -> YNode | None:
        item = self.left.pop(key, None)
        if item is None:
            if required:
                raise SpecError(self.node.where, f"{self.what} is missing required key '{key}'")
            return None
        if kind is not None and item.kind != kind:
            raise SpecError(item.where, f"'{key}' in {self.what} must be a {kind}")
        return item

    def finish(self, allowed: tuple[str, ...]) -> None:
        for key, item in self.left.items():
            raise SpecError(
                item.where,
                f"unknown key '{key}' in {self.what} (allowed: {', '.join(allowed)})",
            )


def _text(item: YNode | None, what: str) -> str:
    if item is None:
        return ""
    if not isinstance(item.value, str):
        raise SpecError(item.where, f"{what} must be a string")
    return " ".join(item.value.split())


def check_name(name: str, where: Location, what: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise SpecError(where, f"{what} '{name}' is not a valid name (letters, digits, _)")
    if name in _RESERVED or name.startswith("grad_") or name.startswith("avo_"):
        raise SpecError(where, f"{what} '{name}' is a reserved name")
    return name


def _shape(item: YNode, what: str) -> tuple[str, ...]:
    if item.kind != "list":
        raise SpecError(item.where, f"the shape of {what} must be a list such as [...] or [..., N]")
    dims = []
    for position, dim in enumerate(item.value):
        value = dim.value
        if value is Ellipsis or value == ELLIPSIS:
            if position != 0:
                raise SpecError(dim.where, f"'...' may only lead the shape of {what}")
            dims.append(ELLIPSIS)
            continue
        if isinstance(value, str) and value.startswith("*") and _NAME.match(value[1:]):
            if position != len(item.value) - 1:
                raise SpecError(dim.where, f"a group of dimensions ('{value}') may only end the shape of {what}")
            dims.append(value)
            continue
        if not isinstance(value, str) or not _NAME.match(value):
            raise SpecError(dim.where, f"dimension {value!r} of {what} must be a symbol such as N")
        dims.append(value)
    if len(set(dims)) != len(dims):
        raise SpecError(item.where, f"the shape of {what} repeats a dimension")
    return tuple(dims)


def _number(item: YNode, what: str) -> float:
    value = item.value
    # YAML 1.1 reads 1e-5 (no dot) as a string: accept any Python float literal.
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SpecError(item.where, f"{what} must be a finite number, got {item.value!r}")
    return value


def _exact_in(value: float, dtype: str) -> bool:
    """Whether `value`, as the float32 literal the kernels write, survives a round trip
    through `dtype`."""
    try:
        single = struct.unpack("<f", struct.pack("<f", value))[0]
        if dtype == "float16":
            return struct.unpack("<e", struct.pack("<e", single))[0] == single
    except (OverflowError, struct.error):
        return False
    low_bits = struct.unpack("<I", struct.pack("<f", single))[0] & 0xFFFF  # bfloat16: a float32's upper half
    return dtype == "float32" or low_bits == 0


def _parse_input(name: str, node: YNode) -> TensorInput:
    check_name(name, node.where, "input")
    if node.kind == "list":  # shorthand: `x: [...]`
        return TensorInput(name, _shape(node, f"input '{name}'"), False, None, "", node.where)
    f = _Fields(node, f"input '{name}'")
    shape = _shape(f.pop("shape", required=True), f"input '{name}'")
    optional_node = f.pop("optional", "scalar")
    optional = bool(optional_node.value) if optional_node else False
    if optional_node and not isinstance(optional_node.value, bool):
        raise SpecError(optional_node.where, f"'optional' of input '{name}' must be true or false")
    default_node = f.pop("default", "scalar")
    default = None
    if default_node is not None:
        if not optional:
            raise SpecError(default_node.where, f"input '{name}' has a default but is not optional")
        default = _number(default_node, f"the default of input '{name}'")
    elif optional:
        raise SpecError(node.where, f"optional input '{name}' needs a default (the value a missing tensor stands for)")
    doc = _text(f.pop("doc"), "doc")
    f.finish(("shape", "optional", "default", "doc"))
    return TensorInput(name, shape, optional, default, doc, node.where)


def _parse_attr(name: str, node: YNode) -> Attr:
    check_name(name, node.where, "attribute")
    f = _Fields(node, f"attribute '{name}'")
    type_node = f.pop("type", "scalar", required=True)
    if type_node.value not in ATTR_TYPES:
        raise SpecError(type_node.where, f"attribute '{name}' has unknown type {type_node.value!r} (allowed: {', '.join(ATTR_TYPES)})")
    kind = type_node.value
    choices: tuple[str, ...] = ()
    choices_node = f.pop("choices", "list")
    if kind == "str":
        if choices_node is None:
            raise SpecError(node.where, f"string attribute '{name}' needs 'choices'")
        choices = tuple(str(c.value) for c in choices_node.value)
        for c in choices_node.value:
            if not isinstance(c.value, str) or not _NAME.match(c.value):
                raise SpecError(c.where, f"choice {c.value!r} of attribute '{name}' must be a name")
        if len(set(choices)) != len(choices) or not choices:
            raise SpecError(choices_node.where, f"the choices of attribute '{name}' must be distinct and non-empty")
    elif choices_node is not None:
        raise SpecError(choices_node.where, f"only string attributes take 'choices' ('{name}' is {kind})")
    default_node = f.pop("default", "scalar")
    default = None if default_node is None else _attr_value(kind, choices, default_node, name)
    doc = _text(f.pop("doc"), "doc")
    f.finish(("type", "choices", "default", "doc"))
    return Attr(name, kind, default, choices, doc, node.where)


def _attr_value(kind: str, choices: tuple[str, ...], item: YNode, name: str) -> Any:
    value = item.value
    if kind == "str":
        if value not in choices:
            raise SpecError(item.where, f"default {value!r} of attribute '{name}' is not one of its choices")
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise SpecError(item.where, f"default of bool attribute '{name}' must be true or false")
        return value
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(item.where, f"default of int attribute '{name}' must be an integer")
        return value
    return float(_number(item, f"the default of attribute '{name}'"))


def _parse_output(name: str, node: YNode) -> Output:
    check_name(name, node.where, "output")
    if node.kind == "list":
        return Output(name, _shape(node, f"output '{name}'"), "", node.where)
    f = _Fields(node, f"output '{name}'")
    shape = _shape(f.pop("shape", required=True), f"output '{name}'")
    doc = _text(f.pop("doc"), "doc")
    f.finish(("shape", "doc"))
    return Output(name, shape, doc, node.where)


def _parse_assignments(node: YNode, what: str) -> tuple[Assignment, ...]:
    if node.kind != "mapping":
        raise SpecError(node.where, f"'{what}' must map names to expressions, e.g. `y: x * sigmoid(x)`")
    out = []
    for name, item in node.value.items():
        check_name(name, item.where, f"{what} name")
        if isinstance(item.value, bool) or not isinstance(item.value, (str, int, float)):
            raise SpecError(item.where, f"'{name}' in '{what}' must be an expression")
        out.append(Assignment(name, str(item.value), item.where))
    return tuple(out)


def _named(node: YNode | None, parse) -> tuple:
    if node is None:
        return ()
    return tuple(parse(name, item) for name, item in node.value.items())


def parse_spec(root: YNode, path: str) -> OpSpec:
    f = _Fields(root, "the spec")
    name_node = f.pop("op", "scalar", required=True)
    name = check_name(name_node.value, name_node.where, "op")
    doc = _text(f.pop("doc", "scalar", required=True), "doc")
    dtypes_node = f.pop("dtypes", "list", required=True)
    dtypes = []
    for d in dtypes_node.value:
        if d.value not in SUPPORTED_DTYPES:
            raise SpecError(d.where, f"unsupported dtype {d.value!r} (supported: {', '.join(SUPPORTED_DTYPES)})")
        dtypes.append(d.value)
    if not dtypes:
        raise SpecError(dtypes_node.where, "'dtypes' must name at least one dtype")
    inputs = _named(f.pop("inputs", "mapping", required=True), _parse_input)
    attrs = _named(f.pop("attrs", "mapping"), _parse_attr)
    outputs = _named(f.pop("outputs", "mapping", required=True), _parse_output)
    math_node = f.pop("math", required=True)
    math_lines = _parse_assignments(math_node, "math")
    grads_node = f.pop("grads")
    grads = _parse_assignments(grads_node, "grads") if grads_node else ()
    f.finish(("op", "doc", "dtypes", "inputs", "attrs", "outputs", "math", "grads"))

    if not inputs:
        raise SpecError(root.where, "an op needs at least one tensor input")
    if not outputs:
        raise SpecError(root.where, "an op needs at least one output")
    seen: dict[str, Location] = {}
    for item in (*inputs, *attrs, *outputs):
        if item.name in seen:
            raise SpecError(item.where, f"'{item.name}' is declared twice (first at line {seen[item.name].line})")
        seen[item.name] = item.where
    required_after_optional = False
    for a in attrs:
        if a.default is None and required_after_optional:
            raise SpecError(a.where, f"attribute '{a.name}' has no default but follows one that has")
        required_after_optional |= a.default is not None
    for i in inputs:
        if i.default is None:
            continue
        for d in dtypes:
            if not _exact_in(i.default, d):
                raise SpecError(i.where, f"the default of input '{i.name}', {i.default!r}, is not exact in {d} "
                                         "(a missing input is read as a row of its default in the op's dtype)")
    input_names = {i.name for i in inputs}
    for g in grads:
        if g.name not in input_names:
            raise SpecError(g.where, f"gradient override for '{g.name}', which is not a tensor input")
    return OpSpec(name, doc, tuple(dtypes), inputs, attrs, outputs, math_lines, grads, path, root.where)


def load_spec(file_path: str, display_path: str) -> OpSpec:
    return parse_spec(load_yaml(file_path, display_path), display_path)

"""Read a YAML file into `YNode`s: values that remember the line they came from.

PyYAML's composer already knows where every node starts; we keep that position on
each value so that any later stage can report `specs/x.yaml:12: ...`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

import yaml

from .errors import Location, SpecError


@dataclass(frozen=True)
class YNode:
    """A YAML value with its location. `value` is a scalar, a list of YNode or a
    dict of str -> YNode (keys keep their YAML order)."""

    value: Any
    where: Location

    @property
    def kind(self) -> str:
        if isinstance(self.value, dict):
            return "mapping"
        if isinstance(self.value, list):
            return "list"
        return "scalar"


YValue = Union[YNode, None]


def load_yaml(path: str, display_path: str | None = None) -> YNode:
    """Parse one YAML document from `path`; errors carry `display_path:line`."""
    shown = display_path or path
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return parse_yaml(text, shown)


def parse_yaml(text: str, shown: str) -> YNode:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else 1
        raise SpecError(Location(shown, line), f"invalid YAML: {e.problem or e.context}") from None
    except yaml.reader.ReaderError as e:  # e.g. a control character; it knows its offset only
        line = text.count("\n", 0, e.position) + 1
        raise SpecError(Location(shown, line), f"invalid YAML: {e.reason} (character {e.character!r})") from None
    except yaml.YAMLError as e:
        raise SpecError(Location(shown, 1), f"invalid YAML: {e}") from None
    if root is None:
        raise SpecError(Location(shown, 1), "the spec file is empty")
    return _convert(root, shown)


def _convert(node: yaml.Node, shown: str) -> YNode:
    where = Location(shown, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        out: dict[str, YNode] = {}
        for key_node, value_node in node.value:
            key = _convert(key_node, shown)
            if not isinstance(key.value, str):
                raise SpecError(key.where, f"mapping keys must be names, got {key.value!r}")
            if key.value in out:
                raise SpecError(key.where, f"duplicate key '{key.value}'")
            value = _convert(value_node, shown)
            # A key's value is reported at the key's line: that is where a reader looks.
            out[key.value] = YNode(value.value, key.where)
        return YNode(out, where)
    if isinstance(node, yaml.SequenceNode):
        return YNode([_convert(item, shown) for item in node.value], where)
    # Scalars: let the safe constructor give ints, floats, bools, null and strings.
    try:
        value = yaml.SafeLoader("").construct_object(node, deep=True)  # a loader used only to construct
    except (yaml.YAMLError, ValueError, TypeError) as e:
        problem = getattr(e, "problem", None) or str(e)
        raise SpecError(where, f"invalid YAML value {node.value!r}: {problem}") from None
    return YNode(value, where)

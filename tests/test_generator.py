"""Tests of the code generator (generator/): spec parsing, error locations, autodiff
checked against torch.autograd, deterministic output and `python -m generator --check`.

Needs neither a GPU nor the compiled extension: only the generator and CPU torch.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from generator.autodiff import lower_backward  # noqa: E402
from generator.build import GENERATED_MARK, generate  # noqa: E402
from generator.errors import SpecError  # noqa: E402
from generator.ir import Node, lower_forward  # noqa: E402
from generator.model import OpSpec, parse_spec  # noqa: E402
from generator.schedule import schedule, specializations  # noqa: E402
from generator.yaml_source import parse_yaml  # noqa: E402

SPEC_PATH = "specs/t.yaml"

# ---------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------


def parse(text: str, path: str = SPEC_PATH) -> OpSpec:
    return parse_spec(parse_yaml(text, path), path)


def load_and_schedule(text: str, path: str = SPEC_PATH):
    """Every check the generator makes on one spec: parse, lower, differentiate, schedule."""
    return schedule(parse(text, path))


def spec_error(text: str) -> SpecError:
    with pytest.raises(SpecError) as info:
        load_and_schedule(text)
    return info.value


def run_cli(*args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "generator", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)


def fresh_root(tmp_path: Path, name: str, extra_specs: dict[str, str] | None = None) -> Path:
    """A temp repository root holding a copy of specs/ (plus extra specs) and nothing generated."""
    root = tmp_path / name
    shutil.copytree(REPO / "specs", root / "specs")
    for file_name, text in (extra_specs or {}).items():
        (root / "specs" / file_name).write_text(text)
    return root


def generated_tree(root: Path) -> dict[str, bytes]:
    """Relative path -> bytes of every file under root outside specs/."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.relative_to(root).parts[0] != "specs":
            out[path.relative_to(root).as_posix()] = path.read_bytes()
    return out


# --- an evaluator of IR graphs with float64 torch ops --------------------------------

UNARY = {"neg": torch.neg, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
         "tanh": torch.tanh, "erf": torch.erf, "sigmoid": torch.sigmoid, "abs": torch.abs, "sign": torch.sign}
BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "pow": torch.pow,
          "min": torch.minimum, "max": torch.maximum, "lt": torch.lt, "le": torch.le, "gt": torch.gt,
          "ge": torch.ge, "eq": torch.eq, "ne": torch.ne}
ALL_OPS = {"input", "attr", "const", "where", *UNARY, *BINARY}


def scalar(value) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.bool if isinstance(value, bool) else torch.float64)


def evaluate(results: dict[str, Node], env: dict[str, object], like: torch.Tensor) -> dict[str, torch.Tensor]:
    """Evaluate each result node; `env` maps input names to tensors and attribute names to values."""
    memo: dict[int, torch.Tensor] = {}

    def value(node: Node) -> torch.Tensor:
        if id(node) in memo:
            return memo[id(node)]
        if node.op == "input":
            out = env[node.value]
        elif node.op == "attr":
            out = scalar(env[node.value])
        elif node.op == "const":
            out = scalar(node.value)
        elif node.op == "where":
            out = torch.where(*(value(a) for a in node.args))
        elif node.op in UNARY:
            out = UNARY[node.op](value(node.args[0]))
        elif node.op in BINARY:
            out = BINARY[node.op](value(node.args[0]), value(node.args[1]))
        else:
            raise AssertionError(f"the evaluator does not know op {node.op!r}")
        memo[id(node)] = out
        return out

    return {name: value(node).expand_as(like) for name, node in results.items()}


def graph_ops(results: dict[str, Node]) -> set[str]:
    ops, stack, seen = set(), list(results.values()), set()
    while stack:
        node = stack.pop()
        if id(node) not in seen:
            seen.add(id(node))
            ops.add(node.op)
            stack.extend(node.args)
    return ops


def yaml_quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def elementwise_spec(math: dict[str, str], inputs=("x",), outputs=("y",), attrs: dict[str, str] | None = None,
                     grads: dict[str, str] | None = None) -> OpSpec:
    """A spec of [...] tensors; inputs given as `name` or `name?default` (optional)."""
    lines = ["op: t", "doc: test op", "dtypes: [float32]", "inputs:"]
    for i in inputs:
        name, _, default = i.partition("?")
        lines.append(f"  {name}: {{shape: [...], optional: true, default: {default}}}" if default else f"  {name}: [...]")
    if attrs:
        lines += ["attrs:"] + [f"  {name}: {decl}" for name, decl in attrs.items()]
    lines += ["outputs:"] + [f"  {o}: [...]" for o in outputs]
    lines += ["math:"] + [f"  {name}: {yaml_quoted(src)}" for name, src in math.items()]
    if grads:
        lines += ["grads:"] + [f"  {name}: {yaml_quoted(src)}" for name, src in grads.items()]
    return parse("\n".join(lines) + "\n")


# Input domains: values where every function used is defined and differentiable,
# kept away from 0 (abs, sign, min/max ties).
def anywhere(gen: torch.Generator, n: int) -> torch.Tensor:
    magnitude = 0.2 + 1.8 * torch.rand(n, generator=gen, dtype=torch.float64)
    return torch.where(torch.rand(n, generator=gen, dtype=torch.float64) < 0.5, -magnitude, magnitude)


def positive(gen: torch.Generator, n: int) -> torch.Tensor:
    return 0.3 + 2.2 * torch.rand(n, generator=gen, dtype=torch.float64)


DOMAINS = {"any": anywhere, "pos": positive}
N = 257


# ---------------------------------------------------------------------------------
# 1. Parsing a complete spec into the model
# ---------------------------------------------------------------------------------

COMPLETE_SPEC = """\
op: fancy
doc: >
  A test op
  whose doc is folded.
dtypes: [float32, bfloat16]
inputs:
  x: {shape: [...], doc: the input}
  bias: {shape: [...], optional: true, default: 6.25e-2}
  scale: [...]
attrs:
  alpha: {type: float}
  eps: {type: float, default: 1e-5}
  steps: {type: int, default: 3}
  enabled: {type: bool, default: true}
  mode: {type: str, choices: [fast, exact], default: exact, doc: how to compute}
outputs:
  y: {shape: [...], doc: the result}
  z: [...]
math:
  # a comment between math lines
  t: x * scale + bias
  y: where(enabled, t / (eps + steps) * alpha, t)

  z: where(mode == "fast", t, -t)
grads:
  scale: grad_y * x
"""


def test_complete_spec_parses_into_the_model():
    spec = parse(COMPLETE_SPEC)
    assert spec.name == "fancy"
    assert spec.doc == "A test op whose doc is folded."
    assert spec.dtypes == ("float32", "bfloat16")
    assert spec.path == SPEC_PATH

    assert [(i.name, i.shape, i.optional, i.default, i.doc) for i in spec.inputs] == [
        ("x", ("...",), False, None, "the input"),
        ("bias", ("...",), True, 0.0625, ""),
        ("scale", ("...",), False, None, ""),
    ]
    assert [i.where.line for i in spec.inputs] == [7, 8, 9]

    assert [(a.name, a.type, a.default, a.choices, a.doc) for a in spec.attrs] == [
        ("alpha", "float", None, (), ""),
        ("eps", "float", 1e-5, (), ""),
        ("steps", "int", 3, (), ""),
        ("enabled", "bool", True, (), ""),
        ("mode", "str", "exact", ("fast", "exact"), "how to compute"),
    ]
    assert [a.where.line for a in spec.attrs] == [11, 12, 13, 14, 15]
    eps, steps, enabled = spec.attrs[1:4]
    assert isinstance(eps.default, float) and type(steps.default) is int and enabled.default is True
    assert spec.has_string_attrs

    assert [(o.name, o.shape, o.doc, o.where.line) for o in spec.outputs] == [
        ("y", ("...",), "the result", 17),
        ("z", ("...",), "", 18),
    ]
    assert [(m.name, m.source, m.where.line) for m in spec.math] == [
        ("t", "x * scale + bias", 21),
        ("y", "where(enabled, t / (eps + steps) * alpha, t)", 22),
        ("z", 'where(mode == "fast", t, -t)', 24),
    ]
    assert [(g.name, g.source, g.where.line) for g in spec.grads] == [("scale", "grad_y * x", 26)]
    assert all(str(item.where).startswith(f"{SPEC_PATH}:") for item in (*spec.inputs, *spec.math))


def test_complete_spec_schedules_with_one_kernel_pair_per_choice():
    s = load_and_schedule(COMPLETE_SPEC)
    assert [sp.as_dict for sp in s.specializations] == [
        {"enabled": False, "mode": "fast"}, {"enabled": False, "mode": "exact"},
        {"enabled": True, "mode": "fast"}, {"enabled": True, "mode": "exact"},
    ]
    assert [s.forward.math_struct(sp) for sp in s.specializations] == [
        "ForwardNoEnabledModeFastMath", "ForwardNoEnabledModeExactMath",
        "ForwardEnabledModeFastMath", "ForwardEnabledModeExactMath",
    ]
    assert s.forward.outputs == ("y", "z")
    assert [i.name for i in s.backward.inputs] == ["grad_y", "grad_z", "x", "bias", "scale"]
    assert s.backward.outputs == ("grad_x", "grad_bias", "grad_scale")
    assert s.forward.scalars == (("alpha", "float"), ("eps", "float"), ("steps", "int64_t"), ("enabled", "bool"))
    # The launchers take the bool; each math struct has its value built in.
    assert s.forward.math_scalars == (("alpha", "float"), ("eps", "float"), ("steps", "int64_t"))


@pytest.mark.parametrize("text, value", [
    ("1e-5", 1e-5),        # YAML 1.1 reads this as a string
    ("1E-5", 1e-5),
    ("1.0e-5", 1e-5),      # ... and this as a float
    ("-2e3", -2000.0),
    ("3", 3.0),
    ("0.25", 0.25),
])
def test_scientific_notation_is_a_float_default(text, value):
    spec = parse(f"""\
op: t
doc: d
dtypes: [float32]
inputs:
  x: {{shape: [...], optional: true, default: {text}}}
attrs:
  eps: {{type: float, default: {text}}}
outputs:
  y: [...]
math:
  y: x + eps
""")
    assert spec.inputs[0].optional and spec.inputs[0].default == value
    assert spec.attrs[0].default == value and isinstance(spec.attrs[0].default, float)


def test_optional_input_default_reaches_the_kernels():
    s = load_and_schedule("""\
op: t
doc: d
dtypes: [float32]
inputs:
  x: [...]
  b: {shape: [...], optional: true, default: 0.5}
outputs:
  y: [...]
math:
  y: x * b
""")
    assert [(i.name, i.optional, i.default) for i in s.forward.inputs] == [("x", False, None), ("b", True, 0.5)]
    assert [(i.name, i.optional) for i in s.backward.inputs] == [("grad_y", False), ("x", False), ("b", True)]


# ---------------------------------------------------------------------------------
# 2. Errors: every message starts with `specs/<file>.yaml:<line>:`
# ---------------------------------------------------------------------------------

BASE = """\
op: t
doc: a test op
dtypes: [float32]
inputs:
  x: {shape: [...]}
  b: {shape: [...], optional: true, default: 0}
attrs:
  alpha: {type: float, default: 1e-5}
  mode: {type: str, choices: [fast, exact], default: exact}
outputs:
  y: {shape: [...]}
math:
  t: x * alpha
  y: where(mode == "fast", t, t + b)
"""
LAST_LINE = '  y: where(mode == "fast", t, t + b)\n'


def edited(*edits: tuple[str, str]) -> str:
    text = BASE
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


def expr(source: str) -> tuple[str, str]:
    """Replace the math line `t` (line 13)."""
    return ("  t: x * alpha\n", f"  t: {source}\n")


def grads(body: str) -> tuple[str, str]:
    """Append a `grads:` section: its first entry is on line 16."""
    return (LAST_LINE, LAST_LINE + "grads:\n  " + body + "\n")


ERROR_CASES = [
    # id, edits, line, phrase
    ("unknown-top-level-key", [("dtypes: [float32]\n", "dtypes: [float32]\ncolour: red\n")], 4,
     "unknown key 'colour' in the spec"),
    ("unknown-input-key", [("x: {shape: [...]}", "x: {shape: [...], colour: red}")], 5,
     "unknown key 'colour' in input 'x'"),
    ("unknown-attr-key", [("default: 1e-5}", "default: 1e-5, colour: red}")], 8,
     "unknown key 'colour' in attribute 'alpha'"),
    ("unknown-output-key", [("y: {shape: [...]}", "y: {shape: [...], colour: red}")], 11,
     "unknown key 'colour' in output 'y'"),
    ("missing-op", [("op: t\n", "")], 1, "the spec is missing required key 'op'"),
    ("missing-doc", [("doc: a test op\n", "")], 1, "the spec is missing required key 'doc'"),
    ("missing-outputs", [("outputs:\n  y: {shape: [...]}\n", "")], 1, "the spec is missing required key 'outputs'"),
    ("missing-math", [("math:\n  t: x * alpha\n" + LAST_LINE, "")], 1, "the spec is missing required key 'math'"),
    ("missing-input-shape", [("x: {shape: [...]}", "x: {doc: no shape}")], 5,
     "input 'x' is missing required key 'shape'"),
    ("empty-file", [(BASE, "# nothing here\n")], 1, "the spec file is empty"),
    ("bad-dtype", [("[float32]", "[float32, float64]")], 3, "unsupported dtype 'float64'"),
    ("no-dtype", [("[float32]", "[]")], 3, "'dtypes' must name at least one dtype"),
    ("bad-op-name", [("op: t\n", "op: my-op\n")], 1, "op 'my-op' is not a valid name"),
    ("bad-input-name", [("  x: {shape", "  2x: {shape")], 5, "input '2x' is not a valid name"),
    ("reserved-input-name", [("  x: {shape", "  int: {shape")], 5, "input 'int' is a reserved name"),
    ("reserved-attr-prefix", [("  alpha: {", "  avo_alpha: {")], 8, "attribute 'avo_alpha' is a reserved name"),
    ("reserved-math-prefix", [expr("x\n  grad_t: x * alpha")], 14, "math name 'grad_t' is a reserved name"),
    ("duplicate-key", [("  b: {shape", "  x: {shape: [...]}\n  b: {shape")], 6, "duplicate key 'x'"),
    ("math-name-assigned-twice", [(LAST_LINE, "  t: x\n" + LAST_LINE)], 14, "duplicate key 't'"),
    ("input-declared-again-as-output", [("  y: {shape: [...]}\n", "  y: {shape: [...]}\n  x: [...]\n")], 12,
     "'x' is declared twice (first at line 5)"),
    ("attr-declared-again-as-input", [("  alpha: {", "  b: {")], 8, "'b' is declared twice (first at line 6)"),
    ("str-attr-without-choices", [("choices: [fast, exact], ", "")], 9, "string attribute 'mode' needs 'choices'"),
    ("default-not-a-choice", [("default: exact}", "default: slow}")], 9,
     "default 'slow' of attribute 'mode' is not one of its choices"),
    ("choices-on-float-attr", [("type: float,", "type: float, choices: [a],")], 8,
     "only string attributes take 'choices'"),
    ("unknown-attr-type", [("type: float,", "type: double,")], 8, "attribute 'alpha' has unknown type 'double'"),
    ("required-attr-after-default", [(", default: exact}", "}")], 9,
     "attribute 'mode' has no default but follows one that has"),
    ("non-numeric-default", [("default: 1e-5}", "default: tiny}")], 8,
     "the default of attribute 'alpha' must be a finite number, got 'tiny'"),
    ("infinite-default", [("default: 1e-5}", "default: .inf}")], 8, "must be a finite number"),
    ("optional-input-without-default", [("optional: true, default: 0}", "optional: true}")], 6,
     "optional input 'b' needs a default"),
    ("default-on-required-input", [("optional: true, default: 0}", "default: 0}")], 6,
     "input 'b' has a default but is not optional"),
    ("default-not-exact-in-a-dtype", [("[float32]", "[float32, float16]"), ("default: 0}", "default: 0.1}")], 6,
     "the default of input 'b', 0.1, is not exact in float16"),
    ("default-not-exact-in-bfloat16", [("[float32]", "[float32, bfloat16]"), ("default: 0}", "default: 257}")], 6,
     "the default of input 'b', 257, is not exact in bfloat16"),
    ("ellipsis-not-first", [("x: {shape: [...]}", "x: {shape: [N, ...]}")], 5, "'...' may only lead the shape of input 'x'"),
    ("repeated-dimension", [("x: {shape: [...]}", "x: {shape: [..., N, N]}")], 5, "the shape of input 'x' repeats a dimension"),
    ("row-output-varies-along-the-row", [("x: {shape: [...]}", "x: {shape: [..., N]}")], 11,
     "output 'y' has shape [...] (one value per row) but its math varies along the reduced dimension"),
    ("row-op-without-a-row-input", [("y: {shape: [...]}", "y: {shape: [..., N]}")], 5,
     "a row op needs an input of shape [..., N]"),
    ("two-named-dimensions", [("x: {shape: [...]}", "x: {shape: [..., N]}"), ("y: {shape: [...]}", "y: {shape: [..., M]}")],
     5, "an op reduces over one named dimension for now, this one names M, N"),
    ("column-shaped-output", [("x: {shape: [...]}", "x: {shape: [..., N]}"), ("y: {shape: [...]}", "y: {shape: [N]}")],
     11, "output 'y' is per column; outputs are [..., N] or [...]"),
    ("invalid-yaml", [expr("x: alpha")], 13, "invalid YAML: mapping values are not allowed here"),
    ("invalid-yaml-tab", [("  b: {", "\tb: {")], 6, "invalid YAML"),
    # Expressions: the line of the math entry, then what is wrong and where in the text.
    ("dangling-operator", [expr("x *")], 13, "in 't': expected a value but found the end of the expression"),
    ("unclosed-parenthesis", [expr("(x")], 13, "in 't': expected ')' but found the end of the expression"),
    ("bad-character", [expr("x $ 2")], 13, "in 't': unexpected character '$' (column 3 of `x $ 2`)"),
    ("two-values-in-a-row", [expr("x alpha")], 13, "in 't': unexpected 'alpha'"),
    ("chained-comparison", [expr("where(0 < x < 1, x, 0)")], 13, "comparisons cannot be chained"),
    ("unknown-name", [expr("x * beta")], 13, "in 't': unknown name 'beta'"),
    ("unknown-function", [expr("cosh(x)")], 13, "in 't': unknown function 'cosh'"),
    ("unary-arity", [expr("exp(x, alpha)")], 13, "exp() takes 1 argument, got 2"),
    ("binary-arity", [expr("min(x)")], 13, "min() takes 2 arguments, got 1"),
    ("where-arity", [expr("where(x > 0, x)")], 13, "where() takes 3 arguments, got 2"),
    ("where-needs-a-condition", [expr("where(x, x, alpha)")], 13,
     "the first argument of where() must be a condition"),
    ("condition-used-as-number", [expr("(x > 0) * 2")], 13, "expected a number here, got a condition"),
    ("condition-assigned", [expr("x > 0")], 13, "'t' is a condition; only numbers can be assigned"),
    ("string-vs-float-attr", [expr('where(alpha == "fast", x, 0)')], 13,
     "a string ('fast') may only be compared with a string attribute"),
    ("string-vs-input", [expr('where(x != "fast", x, 0)')], 13,
     "a string ('fast') may only be compared with a string attribute"),
    ("string-in-arithmetic", [expr('x * "fast"')], 13, "a string ('fast') may only be compared with a string attribute"),
    ("choice-that-does-not-exist", [expr('where(mode == "slow", x, 0)')], 13,
     "'slow' is not a choice of 'mode' ('fast', 'exact')"),
    ("string-attr-ordered", [expr('where(mode < "fast", x, 0)')], 13,
     "string attribute 'mode' may only be compared with == or != to a string"),
    ("string-attr-as-number", [expr("x * mode")], 13,
     "string attribute 'mode' may only be compared with one of its choices"),
    ("output-never-assigned", [(LAST_LINE, LAST_LINE.replace("y:", "z:"))], 11, "output 'y' is never assigned in 'math'"),
    ("input-assigned", [expr("x\n  x: x * alpha")], 14, "'x' is already defined; each name is assigned once"),
    ("attr-assigned", [expr("x\n  alpha: x * 2")], 14, "'alpha' is already defined; each name is assigned once"),
    ("string-attr-assigned", [expr("x\n  mode: x * 2")], 14, "'mode' is already defined; each name is assigned once"),
    ("grad-for-math-name", [grads("t: grad_y")], 16, "gradient override for 't', which is not a tensor input"),
    ("grad-for-attr", [grads("alpha: grad_y")], 16, "gradient override for 'alpha', which is not a tensor input"),
    ("grad-for-output", [grads("y: grad_y")], 16, "gradient override for 'y', which is not a tensor input"),
    ("grad-unknown-name", [grads("x: grad_z * t")], 16, "in the gradient of 'x': unknown name 'grad_z'"),
    ("grad-syntax", [grads("x: grad_y *")], 16, "in the gradient of 'x': expected a value"),
    ("grad-is-condition", [grads("x: grad_y > 0")], 16, "the gradient of 'x' must be a number, not a condition"),
]


def test_base_of_the_error_table_is_valid():
    s = load_and_schedule(BASE)
    assert s.spec.name == "t" and len(s.specializations) == 2


@pytest.mark.parametrize("edits, line, phrase", [c[1:] for c in ERROR_CASES], ids=[c[0] for c in ERROR_CASES])
def test_error_names_file_and_line(edits, line, phrase):
    error = spec_error(edited(*edits))
    assert str(error).startswith(f"{SPEC_PATH}:{line}: "), str(error)
    assert error.where.path == SPEC_PATH and error.where.line == line
    assert phrase in error.message, error.message


# Mappings written in block style: the error belongs on the line of the key that names
# the item (`b:`), as it does in flow style, not on the line of its first field.
BLOCK_STYLE_CASES = [
    ("optional-input-without-default", """\
op: t
doc: d
dtypes: [float32]
inputs:
  x: [...]
  b:
    shape: [...]
    optional: true
outputs:
  y: [...]
math:
  y: x
""", 6, "optional input 'b' needs a default"),
    ("input-missing-shape", """\
op: t
doc: d
dtypes: [float32]
inputs:
  x:
    doc: no shape here
outputs:
  y: [...]
math:
  y: x
""", 5, "input 'x' is missing required key 'shape'"),
    ("str-attr-without-choices", """\
op: t
doc: d
dtypes: [float32]
inputs:
  x: [...]
attrs:
  mode:
    type: str
    default: a
outputs:
  y: [...]
math:
  y: x
""", 7, "string attribute 'mode' needs 'choices'"),
    ("declared-twice", """\
op: t
doc: d
dtypes: [float32]
inputs:
  x:
    shape: [...]
outputs:
  y: [...]
  x:
    shape: [...]
math:
  y: x
""", 9, "'x' is declared twice (first at line 5)"),
]


@pytest.mark.parametrize("text, line, phrase", [c[1:] for c in BLOCK_STYLE_CASES], ids=[c[0] for c in BLOCK_STYLE_CASES])
def test_block_style_error_names_the_line_of_the_key(text, line, phrase):
    error = spec_error(text)
    assert phrase in error.message, error.message
    assert str(error).startswith(f"{SPEC_PATH}:{line}: "), str(error)


def write_spec_root(tmp_path: Path, text: str, name: str = "t") -> Path:
    root = tmp_path / "root"
    (root / "specs").mkdir(parents=True)
    (root / "specs" / f"{name}.yaml").write_text(text, encoding="utf-8")
    return root


CLI_ERROR_CASES = [
    ("expression", edited(expr("x *")), 13),
    ("duplicate-key", edited(("  b: {shape", "  x: {shape: [...]}\n  b: {shape")), 6),
    ("named-dimension", edited(("y: {shape: [...]}", "y: {shape: [..., N]}")), 5),
    ("invalid-yaml", edited(expr("x: alpha")), 13),
]
# YAML the parser itself rejects, at a later stage than the syntax: a character YAML
# does not allow, a tag without a constructor, a tagged value the tag cannot read.
CLI_YAML_ERROR_CASES = [
    ("control-character", edited(("doc: a test op", "doc: a test\x07op")), 2),
    ("unknown-tag", edited(("doc: a test op", "doc: !foo a test op")), 2),
    ("bad-tagged-value", edited(("dtypes: [float32]", "dtypes: [!!int float32]")), 3),
]


def assert_cli_reports(tmp_path: Path, text: str, line: int):
    root = write_spec_root(tmp_path, text)
    result = run_cli("--root", str(root), "--specs", str(root / "specs"))
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith(f"error: specs/t.yaml:{line}: "), result.stderr
    assert not (root / "csrc").exists() and not (root / "avo_ops").exists(), "nothing may be written"


@pytest.mark.parametrize("text, line", [c[1:] for c in CLI_ERROR_CASES], ids=[c[0] for c in CLI_ERROR_CASES])
def test_cli_reports_spec_error_without_traceback(tmp_path, text, line):
    assert_cli_reports(tmp_path, text, line)


@pytest.mark.parametrize("text, line", [c[1:] for c in CLI_YAML_ERROR_CASES], ids=[c[0] for c in CLI_YAML_ERROR_CASES])
def test_cli_reports_yaml_error_without_traceback(tmp_path, text, line):
    assert_cli_reports(tmp_path, text, line)


def test_cli_rejects_spec_in_wrongly_named_file(tmp_path):
    root = write_spec_root(tmp_path, BASE, name="other")
    result = run_cli("--root", str(root), "--specs", str(root / "specs"))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("error: specs/other.yaml:1: op 't' must live in specs/t.yaml"), result.stderr


# ---------------------------------------------------------------------------------
# 3. Differentiation, checked numerically against torch.autograd
# ---------------------------------------------------------------------------------


@dataclass
class Case:
    id: str
    math: dict[str, str]
    reference: Callable[..., object]  # (**inputs, **attrs) -> output tensor, or dict of them
    inputs: dict[str, str] = field(default_factory=lambda: {"x": "any"})  # name -> domain
    outputs: tuple[str, ...] = ("y",)
    attrs: dict[str, str] = field(default_factory=dict)  # name -> YAML declaration
    attr_values: tuple[dict, ...] = ({},)  # values of the numeric and bool attributes to try

    def spec(self) -> OpSpec:
        # An input named `b` is declared optional (default 0.5); the tests always pass it.
        declared = [name + ("?0.5" if name == "b" else "") for name in self.inputs]
        return elementwise_spec(self.math, tuple(declared), self.outputs, self.attrs)


T = torch
AUTODIFF_CASES = [
    Case("silu", {"y": "x * sigmoid(x)"}, lambda x: x * T.sigmoid(x)),
    Case("gelu-erf", {"y": "0.5 * x * (1 + erf(x * 0.7071067811865476))"},
         lambda x: 0.5 * x * (1 + T.erf(x * 0.7071067811865476))),
    Case("gelu-tanh-cube", {"y": "0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x**3)))"},
         lambda x: 0.5 * x * (1 + T.tanh(0.7978845608028654 * (x + 0.044715 * x**3)))),
    Case("softplus-exp-log", {"y": "log(1 + exp(x))"}, lambda x: T.log(1 + T.exp(x))),
    Case("sqrt-rsqrt", {"y": "sqrt(x) * x + rsqrt(x)"}, lambda x: T.sqrt(x) * x + T.rsqrt(x), {"x": "pos"}),
    Case("powers", {"y": "x**2 + x**3 - x**-1 + x**0.5 - x**-0.5 + x**1.7"},
         lambda x: x**2 + x**3 - x**-1 + x**0.5 - x**-0.5 + x**1.7, {"x": "pos"}),
    Case("power-of-expression", {"y": "(x + 1)**1.7 / (x*x + 1)**-0.5 + (2 * x)**0"},
         lambda x: (x + 1)**1.7 / (x * x + 1)**-0.5 + 1, {"x": "pos"}),
    Case("unary-minus-and-power", {"y": "-x**2 + 2**x - -x + +x"}, lambda x: -(x**2) + 2**x + x + x),
    Case("div-neg", {"y": "-x / (1 + x*x) - (x - 1) / (x + 3) / (x + 3)"},
         lambda x: -x / (1 + x * x) - (x - 1) / (x + 3) / (x + 3)),
    Case("abs-sign", {"y": "abs(x) * x + sign(x) * exp(x) + abs(x * 3 - 1)"},
         lambda x: T.abs(x) * x + T.sign(x) * T.exp(x) + T.abs(x * 3 - 1)),
    Case("two-inputs", {"y": "x * w + x / w - w**2 + exp(x - w)"},
         lambda x, w: x * w + x / w - w**2 + T.exp(x - w), {"x": "any", "w": "pos"}),
    Case("general-power", {"y": "w ** x + x ** 3 * w"}, lambda x, w: w**x + x**3 * w, {"x": "any", "w": "pos"}),
    Case("min-max", {"y": "min(x, w) * max(x, 0.5 * w) + max(x, 0) - min(1, x)"},
         lambda x, w: T.minimum(x, w) * T.maximum(x, 0.5 * w) + T.clamp(x, min=0) - T.clamp(x, max=1),
         {"x": "any", "w": "any"}),
    Case("where-lt-le-gt", {"y": "where(x < 0, -x, x*x) + where(x <= w, x * w, w) + where(x > 1, exp(x), 0)"},
         lambda x, w: T.where(x < 0, -x, x * x) + T.where(x <= w, x * w, w) + T.where(x > 1, T.exp(x), 0),
         {"x": "any", "w": "any"}),
    Case("where-ge-eq-ne", {"y": "where(x >= w, log(w*w), x) + where(sign(x) == 1, x, 2 * x) + where(sign(w) != -1, w * x, 3)"},
         lambda x, w: T.where(x >= w, T.log(w * w), x) + T.where(T.sign(x) == 1, x, 2 * x)
         + T.where(T.sign(w) != -1, w * x, 3), {"x": "any", "w": "any"}),
    Case("shared-subexpressions", {"u": "x * w", "v": "exp(-u)", "z": "v * u + v / (1 + u*u) + tanh(u) * v"},
         lambda x, w: {"z": T.exp(-x * w) * (x * w) + T.exp(-x * w) / (1 + (x * w) ** 2) + T.tanh(x * w) * T.exp(-x * w)},
         {"x": "any", "w": "any"}, outputs=("z",)),
    Case("composition", {"y": "tanh(sigmoid(x) * log(1 + x*x)) / sqrt(1 + exp(-x)) + erf(sigmoid(x))"},
         lambda x: T.tanh(T.sigmoid(x) * T.log(1 + x * x)) / T.sqrt(1 + T.exp(-x)) + T.erf(T.sigmoid(x))),
    Case("pi", {"y": "pi * x * x"}, lambda x: 3.141592653589793 * x * x),
    Case("two-outputs", {"y": "x * x", "z": "exp(x) + y * w"},
         lambda x, w: {"y": x * x, "z": T.exp(x) + x * x * w}, {"x": "any", "w": "any"}, outputs=("y", "z")),
    Case("output-is-an-input", {"y": "x", "z": "x * w"}, lambda x, w: {"y": x, "z": x * w},
         {"x": "any", "w": "any"}, outputs=("y", "z")),
    Case("zero-gradient", {"y": "sign(x) * 2 + 1"}, lambda x, w: T.sign(x) * 2 + 1, {"x": "any", "w": "any"}),
    Case("optional-input", {"y": "x * b + b * b"}, lambda x, b: x * b + b * b, {"x": "any", "b": "any"}),
    Case("attributes", {"y": "where(flag, x ** p * alpha, -x / alpha) + min(x, alpha)"},
         lambda x, alpha, p, flag: (x**p * alpha if flag else -x / alpha) + T.clamp(x, max=alpha),
         attrs={"alpha": "{type: float}", "p": "{type: int, default: 3}", "flag": "{type: bool, default: true}"},
         attr_values=({"alpha": 0.7, "p": 3, "flag": True}, {"alpha": 1.3, "p": 2, "flag": False})),
    Case("string-attribute", {"y": 'where(mode == "tanh", tanh(x), erf(x)) * where(mode != "square", x, x * x)'},
         lambda x, mode: (T.tanh(x) if mode == "tanh" else T.erf(x)) * (x if mode != "square" else x * x),
         attrs={"mode": "{type: str, choices: [tanh, erf, square], default: tanh}"}),
]


def check_against_autograd(spec: OpSpec, case: Case | None, attr_values: dict, choice: dict, seed: int,
                           domains: dict[str, str]):
    """Forward graph == reference (when given); backward graph == torch.autograd.grad."""
    gen = torch.Generator().manual_seed(seed)
    inputs = {name: DOMAINS[d](gen, N).requires_grad_() for name, d in domains.items()}
    forward = lower_forward(spec, choice)
    backward = lower_backward(spec, choice)
    like = next(iter(inputs.values()))
    outs = evaluate(forward.results, {**inputs, **attr_values}, like)
    if case is not None:
        expected = case.reference(**inputs, **attr_values, **choice)
        expected = expected if isinstance(expected, dict) else {"y": expected}
        for name, value in expected.items():
            torch.testing.assert_close(outs[name], value.expand_as(like), rtol=1e-12, atol=1e-12)
    grad_outs = {o.name: torch.randn(N, generator=gen, dtype=torch.float64) for o in spec.outputs}
    names = list(inputs)
    auto = torch.autograd.grad([outs[o] for o in grad_outs], [inputs[n] for n in names],
                               grad_outputs=list(grad_outs.values()), allow_unused=True)
    env = {n: t.detach() for n, t in inputs.items()}
    env.update({f"grad_{o}": g for o, g in grad_outs.items()}, **attr_values)
    derived = evaluate(backward.results, env, like)
    assert set(derived) == {f"grad_{n}" for n in names}
    for name, expected in zip(names, auto):
        expected = torch.zeros_like(like) if expected is None else expected
        torch.testing.assert_close(derived[f"grad_{name}"], expected, rtol=1e-10, atol=1e-12,
                                   msg=lambda m, n=name: f"grad_{n} for {choice} {attr_values}: {m}")
    return forward, backward, derived, auto


@pytest.mark.parametrize("case", AUTODIFF_CASES, ids=[c.id for c in AUTODIFF_CASES])
def test_backward_matches_autograd(case: Case):
    spec = case.spec()
    checked = 0
    for k, choice in enumerate(s.as_dict for s in specializations(spec)):
        for j, values in enumerate(case.attr_values):
            # A bool attribute is a constant of its specialization: each value set runs on
            # the specialization that has its bools.
            if any(values.get(name, chosen) != chosen for name, chosen in choice.items()):
                continue
            numbers = {name: v for name, v in values.items() if name not in choice}
            check_against_autograd(spec, case, numbers, choice, seed=1000 * k + j, domains=case.inputs)
            checked += 1
    assert checked >= len(case.attr_values)


def test_autodiff_cases_cover_every_operation():
    seen: set[str] = set()
    for case in AUTODIFF_CASES:
        spec = case.spec()
        for choice in (s.as_dict for s in specializations(spec)):
            seen |= graph_ops(lower_forward(spec, choice).results)
    assert seen == ALL_OPS, f"not covered: {sorted(ALL_OPS - seen)}"


def test_gradient_override_replaces_the_derived_formula():
    # y = x**3 * w; the override says 2 * x**2 * w * grad_y (deliberately not 3 * ...).
    spec = elementwise_spec({"t": "x * x", "y": "t * x * w"}, ("x", "w"),
                            attrs={"gain": "{type: float, default: 2.0}"}, grads={"x": "grad_y * gain * t * w"})
    gen = torch.Generator().manual_seed(7)
    x, w, g = anywhere(gen, N), anywhere(gen, N), torch.randn(N, generator=gen, dtype=torch.float64)
    derived = evaluate(lower_backward(spec, {}).results, {"x": x, "w": w, "grad_y": g, "gain": 2.0}, x)
    torch.testing.assert_close(derived["grad_x"], g * 2.0 * x * x * w, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(derived["grad_x"], g * 3 * x * x * w), "the derived gradient was used"
    # w has no override: its gradient is still derived, and matches autograd.
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    (auto_w,) = torch.autograd.grad(xr**3 * wr, [wr], grad_outputs=[g])
    torch.testing.assert_close(derived["grad_w"], auto_w, rtol=1e-10, atol=1e-12)


def test_gradient_override_may_use_every_math_name():
    # `a` and `b` have the same value, so the IR shares one node for both; the
    # override must still be able to name `b`.
    spec = elementwise_spec({"a": "x * 2", "b": "x * 2", "y": "a * b"}, grads={"x": "grad_y * b"})
    x = anywhere(torch.Generator().manual_seed(3), N)
    g = torch.ones(N, dtype=torch.float64)
    derived = evaluate(lower_backward(spec, {}).results, {"x": x, "grad_y": g}, x)
    torch.testing.assert_close(derived["grad_x"], 2 * x, rtol=1e-12, atol=1e-12)


def test_gradient_override_naming_an_output_of_a_map_op_computes_it_again():
    # A map op's backward takes the inputs only: y in the formula is exp(x), computed again.
    spec = elementwise_spec({"y": "exp(x)"}, grads={"x": "grad_y * y"})
    gen = torch.Generator().manual_seed(5)
    x, g = anywhere(gen, N), torch.randn(N, generator=gen, dtype=torch.float64)
    derived = evaluate(lower_backward(spec, {}).results, {"x": x, "grad_y": g}, x)
    torch.testing.assert_close(derived["grad_x"], g * torch.exp(x), rtol=1e-12, atol=1e-12)
    assert [i.name for i in schedule(spec).backward.inputs] == ["grad_y", "x"]


# ---------------------------------------------------------------------------------
# 4-6. Generated files: determinism, --check, headers and includes
# ---------------------------------------------------------------------------------

RICH_SPEC = """\
op: rich_op
doc: An op with every kind of input, attribute and output, to exercise the emitters.
dtypes: [float32, float16, bfloat16]
inputs:
  x: [...]
  bias: {shape: [...], optional: true, default: 6.25e-2}
attrs:
  alpha: {type: float}
  steps: {type: int, default: 2}
  flag: {type: bool, default: false}
  mode: {type: str, choices: [fast, exact], default: exact}
  kind: {type: str, choices: [plain, squared], default: plain}
outputs:
  y: [...]
  z: [...]
math:
  t: x * alpha + bias
  y: where(flag, t ** steps, where(mode == "fast", tanh(t), erf(t)))
  z: where(kind == "squared", t * t, t) - min(x, bias)
grads:
  bias: grad_y + grad_z
"""


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> tuple[Path, dict[str, bytes]]:
    root = fresh_root(tmp_path_factory.mktemp("gen"), "root", {"rich_op.yaml": RICH_SPEC})
    outcome = generate(str(root), str(root / "specs"), check=False)
    tree = generated_tree(root)
    assert sorted(p.replace(os.sep, "/") for p in outcome.written) == sorted(tree)
    return root, tree


def test_generation_is_deterministic(tmp_path):
    trees = []
    for name in ("one", "two"):
        root = fresh_root(tmp_path, name, {"rich_op.yaml": RICH_SPEC})
        generate(str(root), str(root / "specs"), check=False)
        trees.append(generated_tree(root))
    # And in another process, with another string-hash seed.
    root = fresh_root(tmp_path, "three", {"rich_op.yaml": RICH_SPEC})
    result = run_cli("--root", str(root), "-q", env_extra={"PYTHONHASHSEED": "12345"})
    assert result.returncode == 0, result.stderr
    trees.append(generated_tree(root))
    assert trees[0] and "csrc/generated/rich_op.cu" in trees[0]
    assert trees[0] == trees[1] == trees[2]


def test_second_generate_writes_nothing(tmp_path):
    root = fresh_root(tmp_path, "root")
    first = generate(str(root), str(root / "specs"), check=False)
    assert first.written and not first.removed
    paths = [root / p for p in generated_tree(root)]
    old = 1_000_000_000
    for p in paths:
        os.utime(p, ns=(old, old))
    second = generate(str(root), str(root / "specs"), check=False)
    assert second.written == [] and second.removed == []
    assert [p.stat().st_mtime_ns for p in paths] == [old] * len(paths)
    result = run_cli("--root", str(root))
    assert result.returncode == 0 and "generated sources are up to date" in result.stdout


def check(root: Path) -> subprocess.CompletedProcess:
    return run_cli("--check", "--root", str(root))


def test_check_detects_stale_missing_and_leftover_files(tmp_path):
    root = fresh_root(tmp_path, "root")
    generate(str(root), str(root / "specs"), check=False)
    result = check(root)
    assert result.returncode == 0, result.stderr
    assert "up to date" in result.stdout

    edited_file = root / "csrc" / "generated" / "silu.cu"
    original = edited_file.read_text()
    edited_file.write_text(original + "// a hand edit\n")
    result = check(root)
    assert result.returncode == 1
    assert "stale: csrc/generated/silu.cu" in result.stderr
    assert edited_file.read_text().endswith("// a hand edit\n"), "--check must write nothing"
    edited_file.write_text(original)
    assert check(root).returncode == 0

    missing = root / "avo_ops" / "_generated" / "gelu.py"
    missing.unlink()
    result = check(root)
    assert result.returncode == 1 and "avo_ops/_generated/gelu.py" in result.stderr
    assert not missing.exists(), "--check must write nothing"
    generate(str(root), str(root / "specs"), check=False)
    assert check(root).returncode == 0

    leftover = root / "csrc" / "generated" / "old_op.cu"
    leftover.write_text(f"// {GENERATED_MARK} from specs/old_op.yaml.\n// Do not edit.\n")
    result = check(root)
    assert result.returncode == 1 and "left over: csrc/generated/old_op.cu" in result.stderr
    assert leftover.exists(), "--check must delete nothing"
    leftover.unlink()

    handwritten = root / "csrc" / "generated" / "notes.txt"
    handwritten.write_text("not generated\n")
    assert check(root).returncode == 0, "a file without the @generated mark is not the generator's"


def test_committed_generated_sources_are_up_to_date():
    result = run_cli("--check")
    assert result.returncode == 0, result.stdout + result.stderr


OP_FILE = re.compile(r"^(csrc/generated/(?P<c>\w+?)(?:_math\.h|_cpu\.cpp|_binding\.cpp|\.h|\.cu)"
                     r"|avo_ops/_generated/(?P<py>\w+)\.py)$")


def test_every_generated_file_has_the_generated_header(generated):
    _, tree = generated
    assert "csrc/generated/rich_op_math.h" in tree
    for path, data in tree.items():
        text = data.decode()
        comment = "#" if path.endswith(".py") else "//"
        if path in ("csrc/generated/registration.cpp", "csrc/generated/autograd.cpp", "csrc/generated/python_calls.cpp",
                    "avo_ops/_generated/__init__.py"):
            spec = "specs/*.yaml"
        else:
            m = OP_FILE.match(path)
            assert m, f"unexpected generated file {path}"
            spec = f"specs/{m.group('c') or m.group('py')}.yaml"
        first = text.splitlines()[0]
        assert first == f"{comment} {GENERATED_MARK} from {spec}.", (path, first)


INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)


def test_cuda_sources_include_no_torch_headers(generated):
    _, tree = generated
    cu_files = [p for p in tree if p.endswith(".cu")]
    specs = sorted(p.stem for p in (REPO / "specs").glob("*.yaml")) + ["rich_op"]
    assert sorted(cu_files) == sorted(f"csrc/generated/{name}.cu" for name in specs)
    for cu in cu_files:
        # The .cu file and, transitively, the generated headers it includes.
        pending, seen = [cu], set()
        while pending:
            path = pending.pop()
            if path in seen:
                continue
            seen.add(path)
            for kind, header in INCLUDE.findall(tree[path].decode()):
                assert not re.match(r"(torch|ATen|c10|caffe2|pybind11|Python)\b", header), (path, header)
                if kind == '"':
                    local = f"csrc/generated/{header}"
                    assert local in tree, f"{path} includes {header}, which is not a generated header"
                    pending.append(local)
                elif path == cu:
                    assert header.startswith(("avo/", "cuda")), (path, header)
                else:
                    assert header.startswith(("avo/", "cuda")) or "/" not in header and "." not in header, (path, header)
        assert len(seen) >= 3, seen  # the .cu, <op>.h and <op>_math.h


def test_row_schedule_saves_the_statistics_and_shares_equal_gradients():
    """add_layernorm: the forward also returns mu and rstd (fp32, per row) through
    add_layernorm_forward, the backward takes them after the gradients, then the output
    hidden in place of x and residual (whose gradients are one expression and share one
    gradient output)."""
    with open(REPO / "specs" / "add_layernorm.yaml", encoding="utf-8") as f:
        s = schedule(parse(f.read(), "specs/add_layernorm.yaml"))
    assert s.saved == ("mu", "rstd")
    assert [(o.name, o.domain) for o in s.forward.outputs] == [
        ("hidden", "elem"), ("y", "elem"), ("mu", "saved"), ("rstd", "saved")]
    assert [(i.name, i.domain) for i in s.backward.inputs] == [
        ("grad_hidden", "elem"), ("grad_y", "elem"), ("mu", "saved"), ("rstd", "saved"), ("hidden", "elem"),
        ("weight", "col"), ("bias", "col")]
    assert s.kept_for_backward == (("saved", 0), ("saved", 1), ("output", 0), ("input", 2), ("input", 3))
    assert [o.name for o in s.backward.outputs] == ["grad_x", "grad_weight", "grad_bias"]
    assert s.gradient_outputs == (0, 0, 1, 2)
    assert [i.name for i in s.gradient_owners] == ["x", "weight", "bias"]
    assert [(k.op_name(saving), saving) for k, saving in s.registrations] == [
        ("add_layernorm", False), ("add_layernorm_forward", True), ("add_layernorm_backward", False)]


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_backward_reads_the_y_its_gradient_formula_names(op):
    """softmax's and log_softmax's specs write x's gradient in y: the backward takes grad_y
    and y (no x, no saved row values), autograd keeps y alone, there is no saving forward,
    and the double backward runs the backward's math in ATen from y, whose graph leads
    back to x."""
    from generator.emit_autograd import emit_autograd

    with open(REPO / "specs" / f"{op}.yaml", encoding="utf-8") as f:
        s = schedule(parse(f.read(), f"specs/{op}.yaml"))
    assert s.saved == ()
    assert [(o.name, o.domain) for o in s.forward.outputs] == [("y", "elem")]
    assert [(i.name, i.domain) for i in s.backward.inputs] == [("grad_y", "elem"), ("y", "elem")]
    assert s.kept_for_backward == (("output", 0),)
    assert [(k.op_name(saving), saving) for k, saving in s.registrations] == [
        (op, False), (f"{op}_backward", False)]
    text = emit_autograd([s])
    assert "backward_math_in_aten(grads[0], saved[0])" in text and "first derivatives only" not in text


def test_a_per_row_output_named_in_a_gradient_formula_is_its_value():
    """Only per-element outputs are read by name: a per-row output in a row op's formula is
    its value, which the forward saves as the per-row value of that name."""
    s = load_and_schedule("""\
op: t
doc: test op
dtypes: [float32]
inputs:
  x: [..., N]
outputs:
  y: [..., N]
  total: [...]
math:
  total: sum(x, N)
  y: x / total
grads:
  x: grad_y / total + grad_total
""")
    assert s.saved == ("total",)
    assert [(i.name, i.domain) for i in s.backward.inputs] == [
        ("grad_y", "elem"), ("grad_total", "row"), ("total", "saved")]


def test_elementwise_schedule_saves_nothing_and_keeps_one_gradient_per_input():
    s = load_and_schedule(COMPLETE_SPEC)
    assert s.saved == () and s.gradient_outputs == (0, 1, 2)
    assert [saving for _, saving in s.registrations] == [False, False]

"""Reductions in the spec language (sum/mean/max/min over a named dimension, per-column
parameters, no_grad): lowering and the derived backward, checked numerically against
torch.autograd in float64. The IR is evaluated here by a small interpreter over torch
tensors laid out as [rows, N] (per-row values [rows, 1], per-column values [1, N])."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from generator.autodiff import (differentiate, element_inputs_read, grad_name, lower_backward, saved_row_values,
                                simplified_row_sums)
from generator.errors import SpecError
from generator.emit_row import earlier_sums, per_row_reciprocals, strip_no_grad
from generator.ir import REDUCTION_OPS, const, linear_parts, lower_forward, topological_order
from generator.model import parse_spec
from generator.schedule import schedule
from generator.yaml_source import parse_yaml

ROOT = Path(__file__).resolve().parent.parent
ROWS, N = 5, 7

OPS = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "neg": torch.neg,
    "pow": torch.pow, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
    "tanh": torch.tanh, "erf": torch.erf, "sigmoid": torch.sigmoid, "abs": torch.abs, "sign": torch.sign,
    "min": torch.minimum, "max": torch.maximum, "where": torch.where,
    "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge, "eq": torch.eq, "ne": torch.ne,
    "rsum": lambda a: a.sum(-1, keepdim=True), "rmax": lambda a: a.amax(-1, keepdim=True),
    "rmin": lambda a: a.amin(-1, keepdim=True), "colsum": lambda a: a.sum(0, keepdim=True),
    "no_grad": lambda a: a.detach(),
    "stored": lambda a: a,  # an output as its dtype holds it: here float64, which these tests compute in
}


def evaluate(roots: dict, values: dict[str, torch.Tensor], attrs: dict[str, float]) -> dict[str, torch.Tensor]:
    cache: dict[int, torch.Tensor] = {}
    for node in topological_order(roots.values()):
        if node.op == "input":
            out = values[node.value]
        elif node.op == "attr":
            out = torch.tensor(float(attrs[node.value]), dtype=torch.float64)
        elif node.op == "const":
            out = torch.tensor(node.value, dtype=torch.float64 if node.type == "f" else torch.bool)
        elif node.op == "dim":
            out = torch.tensor(float(N), dtype=torch.float64)
        else:
            out = OPS[node.op](*(cache[id(a)] for a in node.args))
        cache[id(node)] = out
    return {name: cache[id(node)] for name, node in roots.items()}


def spec_of(text: str):
    return parse_spec(parse_yaml(text, "specs/t.yaml"), "specs/t.yaml")


HEADER = "op: t\ndoc: test\ndtypes: [float32]\n"
LAYERNORM = HEADER + """\
inputs:
  x: [..., N]
  weight: {shape: [N], optional: true, default: 1}
  bias: {shape: [N], optional: true, default: 0}
attrs:
  eps: {type: float, default: 1e-5}
outputs:
  y: [..., N]
math:
  mu: mean(x, N)
  d: x - mu
  var: mean(d * d, N)
  y: d * rsqrt(var + eps) * weight + bias
"""
RMSNORM = HEADER + """\
inputs:
  x: [..., N]
  weight: {shape: [N], optional: true, default: 1}
attrs:
  eps: {type: float, default: 1e-6}
outputs:
  y: [..., N]
math:
  y: x * rsqrt(mean(x * x, N) + eps) * weight
"""
SOFTMAX = HEADER + """\
inputs:
  x: [..., N]
outputs:
  y: [..., N]
math:
  e: exp(x - no_grad(max(x, N)))
  y: e / sum(e, N)
"""
LOG_SOFTMAX = HEADER + """\
inputs:
  x: [..., N]
outputs:
  y: [..., N]
math:
  shifted: x - no_grad(max(x, N))
  y: shifted - log(sum(exp(shifted), N))
"""
SWISH_LAYERNORM = LAYERNORM.replace("  mu: mean(x, N)\n  d: x - mu", "  s: x * sigmoid(x)\n  mu: mean(s, N)\n  d: s - mu")
STATS = HEADER + """\
inputs:
  x: [..., N]
outputs:
  y: [..., N]
  top: [...]
math:
  top: max(x, N) - min(x, N)
  y: x * top + sum(abs(x), N)
"""


def torch_reference(name, x, weight, bias, eps):
    if name == "layernorm":
        return {"y": F.layer_norm(x, (N,), weight.squeeze(0), bias.squeeze(0), eps)}
    if name == "swish_layernorm":
        return {"y": F.layer_norm(F.silu(x), (N,), weight.squeeze(0), bias.squeeze(0), eps)}
    if name == "rmsnorm":
        return {"y": F.rms_norm(x, (N,), weight.squeeze(0), eps)}
    if name == "softmax":
        return {"y": torch.softmax(x, -1)}
    if name == "log_softmax":
        return {"y": torch.log_softmax(x, -1)}
    top = x.amax(-1, keepdim=True) - x.amin(-1, keepdim=True)
    return {"y": x * top + x.abs().sum(-1, keepdim=True), "top": top}


CASES = {"layernorm": LAYERNORM, "rmsnorm": RMSNORM, "softmax": SOFTMAX, "log_softmax": LOG_SOFTMAX,
         "swish_layernorm": SWISH_LAYERNORM, "stats": STATS}


@pytest.mark.parametrize("name", CASES)
def test_forward_and_derived_backward_match_torch(name):
    spec = spec_of(CASES[name])
    torch.manual_seed(0)
    x = (torch.randn(ROWS, N, dtype=torch.float64) * 2 + 0.5).requires_grad_(True)
    weight = torch.randn(1, N, dtype=torch.float64).requires_grad_(True)
    bias = torch.randn(1, N, dtype=torch.float64).requires_grad_(True)
    eps = 1e-5
    values = {"x": x, "weight": weight, "bias": bias}
    present = {i.name: values[i.name] for i in spec.inputs}

    forward = evaluate(lower_forward(spec, {}).results, present, {"eps": eps})
    expected = torch_reference(name, x, weight, bias, eps)
    for out, value in expected.items():
        torch.testing.assert_close(forward[out], value, rtol=1e-12, atol=1e-12)

    grads_in = {o: torch.randn_like(v) for o, v in expected.items()}
    wanted = torch.autograd.grad(list(expected.values()), list(present.values()),
                                 [grads_in[o] for o in expected], allow_unused=True)
    backward = lower_backward(spec, {})
    with torch.no_grad():
        got = evaluate(backward.results, {**present, **{f"grad_{o}": g for o, g in grads_in.items()}}, {"eps": eps})
    for (input_name, tensor), want in zip(present.items(), wanted):
        g = got[f"grad_{input_name}"].expand_as(tensor)
        torch.testing.assert_close(g, want if want is not None else torch.zeros_like(tensor), rtol=1e-9, atol=1e-10)


def _passes(results) -> int:
    """Passes over the row before the outputs: the longest chain of reductions."""
    depth = {}
    for node in topological_order(results.values()):
        below = max((depth[id(a)] for a in node.args), default=0)
        depth[id(node)] = below + (node.op in REDUCTION_OPS)
    return max(depth[id(n)] for n in results.values())


def _reductions(results) -> int:
    return sum(node.op in REDUCTION_OPS for node in topological_order(results.values()))


def _rewrite_inputs(spec, seed: int) -> dict[str, torch.Tensor]:
    """Random float64 values of every input and output gradient of a test spec, for
    checking that a rewrite of the IR keeps its results."""
    torch.manual_seed(seed)
    values = {"x": torch.randn(ROWS, N, dtype=torch.float64) * 3 + 2, "weight": torch.randn(1, N, dtype=torch.float64),
              "bias": torch.randn(1, N, dtype=torch.float64)}
    values.update({f"grad_{o.name}": torch.randn(ROWS, N if o.shape[-1] == "N" else 1, dtype=torch.float64)
                   for o in spec.outputs})
    return values


@pytest.mark.parametrize("name", CASES)
def test_earlier_sums_keeps_the_value_of_every_result(name):
    spec = spec_of(CASES[name])
    values = _rewrite_inputs(spec, seed=1)
    for graph in (lower_forward(spec, {}), lower_backward(spec, {})):
        results = {k: strip_no_grad(v, {}) for k, v in graph.results.items()}
        rewritten = earlier_sums(results)
        before, after = evaluate(results, values, {"eps": 1e-5}), evaluate(rewritten, values, {"eps": 1e-5})
        for out in results:
            torch.testing.assert_close(after[out], before[out], rtol=1e-11, atol=1e-11)
        assert _passes(rewritten) <= _passes(results)


@pytest.mark.parametrize("name,passes", [("layernorm", 2), ("swish_layernorm", 2), ("softmax", 2)])
def test_backward_passes_after_earlier_sums(name, passes):
    """layernorm's backward was 3 levels of sums (mean; variance and sum(dy*w*d);
    the sum of the dx terms); the last is rewritten into sums of the first two levels.
    softmax's sum(dy * e / sum(e)) becomes sum(dy * e) / sum(e), beside sum(e). Checked
    on the derivative as it comes out of differentiate, before simplified_row_sums."""
    results = {k: strip_no_grad(v, {}) for k, v in _derivative(spec_of(CASES[name])).items()}
    assert _passes(earlier_sums(results)) == passes < _passes(results)


def _derivative(spec) -> dict:
    """The backward's results as differentiate derives them, no rewrite applied."""
    return {grad_name(k): v for k, v in differentiate(lower_forward(spec, {})).items()}


def _row_sums(results) -> set:
    """The distinct sums over the row in `results`."""
    return {n for n in topological_order(results.values()) if n.op == "rsum"}


@pytest.mark.parametrize("name", CASES)
def test_simplified_row_sums_keep_the_value_of_every_gradient(name):
    """The sums of centered values dropped and the per-row factors taken out of the sums
    leave every gradient as it was (float64, random inputs)."""
    spec = spec_of(CASES[name])
    derived = {k: strip_no_grad(v, {}) for k, v in _derivative(spec).items()}
    simplified = simplified_row_sums(derived)
    values = _rewrite_inputs(spec, seed=5)
    before, after = evaluate(derived, values, {"eps": 1e-5}), evaluate(simplified, values, {"eps": 1e-5})
    for out in derived:
        torch.testing.assert_close(after[out], before[out], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name,sums,derived_sums", [("layernorm", 2, 3), ("swish_layernorm", 2, 3), ("rmsnorm", 1, 1),
                                                    ("softmax", 1, 1)])
def test_simplified_row_sums_leave_only_the_sums_the_gradient_needs(name, sums, derived_sums):
    """Counted as the row kernels compute them (after earlier_sums): layernorm's backward
    needs sum(dy * w) and sum(dy * w * (x - mu)) beside the forward's mean and variance;
    the derived one also summed x - mu, which is zero. No sum left holds a centered value
    or a per-row factor (softmax's summed dy * e / sum(e)**2, now dy * e)."""
    spec = spec_of(CASES[name])
    forward_sums = _row_sums({k: strip_no_grad(v, {}) for k, v in lower_forward(spec, {}).results.items()})

    def backward_sums(results):
        return _row_sums(earlier_sums({k: strip_no_grad(v, {}) for k, v in results.items()})) - forward_sums

    simplified = backward_sums(lower_backward(spec, {}).results)
    assert len(simplified) == sums and len(backward_sums(_derivative(spec))) == derived_sums
    for node in simplified:
        parts = linear_parts(node.args[0])
        assert not any(r.op == "sub" and r.args[1].op == "div" and r.args[1].args[0].op == "rsum"
                       and r.args[1].args[0].args[0] is r.args[0] for _, r in parts)
        assert len(parts) > 1 or parts[0][0] is const(1.0)


@pytest.mark.parametrize("op,sums", [("layernorm", 2), ("swish_layernorm", 2), ("add_layernorm", 2),
                                     ("channel_norm", 2)])
def test_generated_norm_backwards_sum_two_terms_per_row(op, sums):
    """The generated backwards of the layer norms sum dy * w and dy * w * (x - mu) per row
    and no more (they summed x - mu too; channel_norm also dy * (x - mu) * rstd), in every
    specialization (channel_norm's with and without swish)."""
    with open(ROOT / "csrc" / "generated" / f"{op}_math.h", encoding="utf-8") as f:
        backwards = re.split(r"struct Backward\w*Math", f.read())[1:]
    assert backwards
    for backward in backwards:
        assert f"float sums_0[{sums}];" in backward and "sums_1" not in backward


def test_a_bool_attribute_is_compiled_out_of_the_kernels():
    """channel_norm's math structs are one per value of swish, which none of them tests:
    without swish no sigmoid is computed (the backward computed one per element for a
    term it then multiplied by zero). With it, the forward keeps each element's x *
    sigmoid(x) for its second pass; the backward, whose threads hold four vectors of
    each of its two per-element inputs, has no registers to keep it (_has_room_to_keep):
    the sigmoid is host-kept (the GPU rows compute it in both passes, the CPU rows once)."""
    with open(ROOT / "csrc" / "generated" / "channel_norm_math.h", encoding="utf-8") as f:
        source = f.read()
    structs = dict(re.findall(r"struct (\w+Math) \{(.*?)\n\};", source, re.S))
    assert sorted(structs) == ["BackwardNoSwishMath", "BackwardSwishMath", "ForwardNoSwishMath", "ForwardSwishMath"]
    for name, body in structs.items():
        assert "swish" not in body
        assert body.count("F::sigmoid(x)") == (0 if "NoSwish" in name else 2)
        assert ("kKeptValues = 1;" in body) == (name == "ForwardSwishMath")
        assert ("at.keep(" in body) == (name == "ForwardSwishMath")
        assert ("kHostKeptValues = 1;" in body) == (name == "BackwardSwishMath")


@pytest.mark.parametrize("op,passes", [("layernorm", 1), ("rmsnorm", 1), ("softmax", 1), ("log_softmax", 1),
                                       ("swish_layernorm", 1), ("add_layernorm", 1)])
def test_generated_backward_makes_one_pass_per_level(op, passes):
    """Sums of one level share a pass (row.sums), and the forward's per-row values are
    read, not computed again: the generated backward makes `passes` reduction passes
    over the row before its outputs (layernorm's made 2 when it computed mu and rstd)."""
    with open(ROOT / "csrc" / "generated" / f"{op}_math.h", encoding="utf-8") as f:
        backward = f.read().split("struct BackwardMath")[1]
    calls = sum(backward.count(f"row.{call}(") for call in ("sum", "sums", "max", "min"))
    assert calls == passes


@pytest.mark.parametrize("name,expected", [("layernorm", ["mu", "saved_1"]), ("rmsnorm", ["saved_0"]),
                                           ("softmax", ["saved_0", "saved_1"]), ("stats", None)])
def test_backward_reads_the_saved_row_values_and_keeps_its_value(name, expected):
    """saved_row_values: the backward reads the forward's largest per-row values (named as
    in the spec) and no longer computes the reductions inside them; evaluated with the
    values the forward computes, it gives the derived backward's results."""
    spec = spec_of(CASES[name])
    forward, backward = lower_forward(spec, {}), lower_backward(spec, {})
    reading, saved = saved_row_values(forward, backward)
    if expected is not None:
        assert list(saved) == expected
    assert _reductions(reading.results) < _reductions(backward.results)
    values = _rewrite_inputs(spec, seed=4)
    attrs = {"eps": 1e-5}
    stats = evaluate({k: strip_no_grad(v, {}) for k, v in saved.items()}, values, attrs)
    assert all(v.shape == (ROWS, 1) for v in stats.values())
    before = evaluate({k: strip_no_grad(v, {}) for k, v in backward.results.items()}, values, attrs)
    after = evaluate({k: strip_no_grad(v, {}) for k, v in reading.results.items()}, {**values, **stats}, attrs)
    for out in before:
        torch.testing.assert_close(after[out], before[out], rtol=1e-12, atol=1e-12)


def test_earlier_sums_does_not_multiply_out_products():
    """The variance keeps its centered form: sum(d * d), never sum(x * x) - N * mu^2,
    which cancels catastrophically when the mean is large."""
    results = {k: strip_no_grad(v, {}) for k, v in lower_backward(spec_of(LAYERNORM), {}).results.items()}
    sums = [n for n in topological_order(earlier_sums(results).values()) if n.op == "rsum"]
    squares = [n for n in sums if n.args[0].op == "mul" and n.args[0].args[0] is n.args[0].args[1]]
    assert squares and all(n.args[0].args[0].op == "sub" for n in squares)


@pytest.mark.parametrize("name", CASES)
def test_per_row_reciprocals_keep_the_value_and_leave_no_division_by_a_row_value(name):
    """a / r, r per row, becomes a * (1 / r): the same value in float64, and no element
    of a pass divides by a per-row value any more (softmax's e / sum(e) did)."""
    spec = spec_of(CASES[name])
    values = _rewrite_inputs(spec, seed=2)
    for graph in (lower_forward(spec, {}), lower_backward(spec, {})):
        results = earlier_sums({k: strip_no_grad(v, {}) for k, v in graph.results.items()})
        rewritten = per_row_reciprocals(results)
        before, after = evaluate(results, values, {"eps": 1e-5}), evaluate(rewritten, values, {"eps": 1e-5})
        for out in results:
            torch.testing.assert_close(after[out], before[out], rtol=1e-12, atol=1e-12)
        divisions = [n for n in topological_order(rewritten.values()) if n.op == "div"]
        assert all(not (n.args[0].domain in ("elem", "col") and n.args[1].domain == "row") for n in divisions)


def test_softmax_divides_once_per_row():
    """The generated softmax multiplies each element by the reciprocal of the sum,
    computed once per row before the pass over the elements."""
    with open(ROOT / "csrc" / "generated" / "softmax_math.h", encoding="utf-8") as f:
        forward = f.read().split("struct ForwardMath")[1].split("struct BackwardMath")[0]
    elements = forward.split("row.for_each(")[1]
    assert "/ sum_0" not in elements and "1.0f / sum_0" in forward.split("row.for_each(")[0]


def test_domains_of_parameter_gradients_are_per_column():
    backward = lower_backward(spec_of(LAYERNORM), {})
    assert backward.results["grad_x"].domain == "elem"
    assert backward.results["grad_weight"].domain == "col"
    assert backward.results["grad_weight"].op == "colsum"


@pytest.mark.parametrize("line,message", [
    ("  y: sum(x, M)", "sum() reduces over a dimension of the inputs' shapes, e.g. sum(x, N) (this op's named dimensions: N)"),
    ("  y: sum(x)", "sum() reduces over a dimension"),
    ("  y: no_grad(x, x)", "no_grad() takes 1 argument"),
])
def test_reduction_errors_name_the_line(line, message):
    text = HEADER + "inputs:\n  x: [..., N]\noutputs:\n  y: [..., N]\nmath:\n" + line + "\n"
    with pytest.raises(SpecError) as error:
        lower_forward(spec_of(text), {})
    assert str(error.value).startswith("specs/t.yaml:9: ")
    assert message in str(error.value)


# The calls of a row that reduce it, and every call that makes a pass over it.
REDUCING_CALLS = "sum_squares|sum|sums|moments|max|min"
PASS_CALLS = REDUCING_CALLS + "|for_each_with_column_sums|for_each"
PASS_CALL = re.compile(rf"row\.(?:template )?({PASS_CALLS})(?:<\w+>)?\(avo::columns<([0-9, ]*)>")


def _passes_and_columns(source: str) -> list[tuple[str, set[int], set[int]]]:
    """(call, the columns its tag lists, the per-column inputs its lambda loads) for
    every pass over a row in a generated *_math.h."""
    found = []
    for match in PASS_CALL.finditer(source):
        body = source[match.end():source.index("});", match.end())]
        tagged = {int(k) for k in match.group(2).replace(" ", "").split(",") if k}
        loaded = {int(k) for k in re.findall(r"at\.load_col\((\d+),", body)}
        found.append((match.group(1), tagged, loaded))
    return found


ROW_MATH = [p for p in sorted((ROOT / "csrc" / "generated").glob("*_math.h"))
            if "apply(const Row& row)" in p.read_text(encoding="utf-8")]


@pytest.mark.parametrize("path", ROW_MATH, ids=lambda p: p.name)
def test_every_pass_lists_exactly_the_columns_it_reads(path):
    """Each pass over a row names the per-column inputs (weight, bias) its lambda loads:
    the GPU rows load only those, one 16-byte vector at a time, so a missing index would
    read an unloaded vector and an extra one would load for nothing."""
    source = path.read_text(encoding="utf-8")
    passes = _passes_and_columns(source)
    every_call = re.findall(rf"row\.(?:template )?(?:{PASS_CALLS})(?:<\w+>)?\(", source)
    assert passes and len(passes) == len(every_call)
    for call, tagged, loaded in passes:
        assert tagged == loaded, (call, tagged, loaded)


def test_layernorm_reads_weight_and_bias_only_where_it_uses_them():
    """The forward's one reduction (mean and variance, row.moments) reads no parameter;
    its output pass reads weight and bias (inputs 1 and 2). The backward (inputs grad_y,
    mu, rstd, x, weight, bias) reads weight (input 4) in its sums and in its last pass,
    which computes grad_x and the parameter gradients' terms together."""
    source = (ROOT / "csrc" / "generated" / "layernorm_math.h").read_text(encoding="utf-8")
    forward, backward = source.split("struct BackwardMath")
    assert [(c, t) for c, t, _ in _passes_and_columns(forward)] == [("moments", set()), ("for_each", {1, 2})]
    assert [(c, t) for c, t, _ in _passes_and_columns(backward)] == [
        ("sums", {4}), ("for_each_with_column_sums", {4})]


@pytest.mark.parametrize("path", ROW_MATH, ids=lambda p: p.name)
def test_parameter_gradients_come_from_the_pass_that_writes_the_input_gradient(path):
    """A backward with per-column outputs computes their terms in its last pass, together
    with the per-element outputs (one pass over the row for both, and the shared
    subexpressions computed once); a kernel without them ends with a plain for_each."""
    structs = path.read_text(encoding="utf-8").split("\nstruct ")[1:]
    assert structs
    for struct in structs:
        calls = [call for call, _, _ in _passes_and_columns(struct)]
        if "kColumnSums = 0;" in struct:
            assert "for_each_with_column_sums" not in calls and calls[-1] == "for_each", calls
        else:
            assert calls[-1] == "for_each_with_column_sums" and "for_each" not in calls, calls


def _struct(op: str, role: str) -> str:
    """The math struct of `op`'s forward or backward; of an op with specializations
    (channel_norm's swish), every struct of that role, one after the other."""
    source = (ROOT / "csrc" / "generated" / f"{op}_math.h").read_text(encoding="utf-8")
    structs = re.findall(rf"\nstruct {role.capitalize()}\w*Math \{{.*?\n\}};", source, re.S)
    assert structs, (op, role)
    return "\n".join(structs)


def test_swish_layernorm_keeps_swish_after_its_first_pass():
    """swish = x * sigmoid(x) is a kept value of the forward: its reduction (mean and
    variance, row.moments) computes it (at.keep), the output pass takes it (at.kept).
    Outside those lambdas no pass reads x or calls sigmoid, so a row that holds swish in
    registers computes it once per element (the second pass of a two-pass row.moments
    reads it back)."""
    forward = _struct("swish_layernorm", "forward")
    assert "static constexpr int kKeptValues = 1;" in forward
    assert [m for m in re.findall(r"at\.(keep|kept)\(0, ", forward)] == ["keep", "kept"]
    outside = re.sub(r"at\.(?:keep|kept)\(0, \[&\] \{.*?\n\s*\}\);", "KEPT", forward, flags=re.S)
    assert outside.count("KEPT") == 2
    assert "sigmoid" not in outside.split("apply(const Row& row)")[1]
    assert "at.load(0)" not in outside


def test_swish_layernorm_backward_keeps_the_sigmoid_that_both_passes_need():
    """Both passes of the backward need x * sigmoid(x) - mean, and its output pass needs
    sigmoid(x) alone as well (the derivative of swish): the kept value is sigmoid(x), not
    the larger expression, so that no pass computes the sigmoid outside the kept-value
    lambdas."""
    backward = _struct("swish_layernorm", "backward")
    assert "static constexpr int kKeptValues = 1;" in backward
    assert re.findall(r"at\.(keep|kept)\(0, \[&\] \{\s*return F::sigmoid\(x\);\s*\}\);", backward) == ["keep", "kept"]
    outside = re.sub(r"at\.(?:keep|kept)\(0, \[&\] \{.*?\n\s*\}\);", "KEPT", backward, flags=re.S)
    assert "sigmoid" not in outside.split("apply(const Row& row)")[1]


@pytest.mark.parametrize("op,role", [("layernorm", "forward"), ("softmax", "forward")])
def test_no_kept_values_where_they_do_not_pay(op, role):
    """Nothing costly to keep (layernorm; softmax's exp depends on the row maximum, so
    it is host-kept at most)."""
    struct = _struct(op, role)
    assert "static constexpr int kKeptValues = 0;" in struct
    assert "at.keep(" not in struct and "at.kept(" not in struct


def test_softmax_host_keeps_the_exponential_that_both_passes_need():
    """exp(x - max) is needed by the forward's sum and by its output pass, and depends on
    the row maximum: a host-kept value, computed by the first of those passes
    (keep_on_host) and taken by the second (kept_on_host); no pass calls exp outside those
    lambdas. The backward, which reads y, computes no exp at all."""
    backward = _struct("softmax", "backward")
    assert "F::exp" not in backward and "static constexpr int kHostKeptValues = 0;" in backward
    struct = _struct("softmax", "forward")
    assert "static constexpr int kHostKeptValues = 1;" in struct
    assert re.findall(r"at\.(keep|kept)_on_host\(0, \[&\] \{\s*const float x = at\.load\(\d\);\s*"
                      r"return F::exp\(x - \w+\);\s*\}\);", struct) == ["keep", "kept"]
    outside = re.sub(r"at\.(?:keep|kept)_on_host\(0, \[&\] \{.*?\n\s*\}\);", "KEPT", struct, flags=re.S)
    assert "exp" not in outside.split("apply(const Row& row)")[1]


@pytest.mark.parametrize("role", ["forward", "backward"])
def test_a_value_one_pass_reads_is_not_kept(role):
    """log_softmax's exp(x - max) is read by its sum alone (the output pass reads the sum,
    not the values it adds): nothing to keep."""
    struct = _struct("log_softmax", role)
    assert "static constexpr int kHostKeptValues = 0;" in struct
    assert "_on_host(" not in struct


@pytest.mark.parametrize("path", ROW_MATH, ids=lambda p: p.name)
def test_reduction_passes_count_the_calls_that_reduce_the_row(path):
    """kReductionPasses (which lets a backward take the tiled version when it is 1) is the
    number of row.sum / row.max / row.min / row.sums / row.sum_squares / row.moments calls
    of apply."""
    structs = path.read_text(encoding="utf-8").split("\nstruct ")[1:]
    assert structs
    for struct in structs:
        declared = re.search(r"static constexpr int kReductionPasses = (\d+);", struct)
        assert declared, struct[:60]
        calls = re.findall(rf"row\.(?:template )?(?:{REDUCING_CALLS})\(", struct)
        assert int(declared.group(1)) == len(calls), struct[:60]


def _printed(results: dict, names: dict | None = None) -> list[str]:
    from generator.emit_c import StatementPrinter
    from generator.ir import Graph

    graph = Graph(spec=None, specialization={}, results=results, names=names or {})
    printer = StatementPrinter(graph, {n: n for n in ("a", "b", "c", "d")})
    return printer.lines()


def test_a_product_whose_only_use_is_a_sum_is_one_fused_multiply_add():
    from generator.ir import make, tensor

    a, b, c, d = (tensor(n) for n in "abcd")
    assert _printed({"y": make("add", make("mul", a, b), c)}) == ["y = F::fma(a, b, c);"]
    assert _printed({"y": make("add", c, make("mul", a, b))}) == ["y = F::fma(a, b, c);"]
    assert _printed({"y": make("sub", make("mul", a, b), c)}) == ["y = F::fma(a, b, -c);"]
    assert _printed({"y": make("sub", c, make("mul", a, b))}) == ["y = F::fma(-a, b, c);"]
    # a fused sum inside a product needs no parentheses of its own
    assert _printed({"y": make("mul", make("add", make("mul", a, b), c), d)}) == ["y = F::fma(a, b, c) * d;"]


def test_a_product_with_another_use_is_rounded_on_its_own():
    """x * sigmoid(x) summed over the row and then less the mean: fused in the
    subtraction alone, a row of one element would not normalize to exactly zero."""
    from generator.ir import make, tensor

    a, b, c = (tensor(n) for n in "abc")
    product = make("mul", a, b)
    lines = _printed({"y": make("sub", product, c), "z": make("mul", product, c)})
    assert not any("F::fma" in line for line in lines)
    assert any(line.endswith("= a * b;") for line in lines)


def test_generated_layernorm_fuses_its_output_and_not_its_centered_values():
    forward = _struct("layernorm", "forward")
    assert "const float y = F::fma(centered * rstd, weight, bias);" in forward
    assert "const float centered = x - mu;" in forward
    swish = _struct("swish_layernorm", "forward")
    assert "F::fma" in swish and not re.search(r"F::fma\([^;]*sigmoid", swish)


def test_output_read_by_later_math_is_read_as_stored_and_its_backward_reads_it_back():
    """add_layernorm normalizes the hidden it returns (rounded to the dtype: `stored`), and
    its backward reads that output instead of x and residual; an output no later line
    reads (y, softmax's y) is not wrapped."""
    spec = parse_spec(parse_yaml((ROOT / "specs" / "add_layernorm.yaml").read_text(), "specs/add_layernorm.yaml"),
                      "specs/add_layernorm.yaml")
    forward = lower_forward(spec, {})
    assert forward.results["hidden"].op == "stored" and forward.results["y"].op != "stored"
    softmax = parse_spec(parse_yaml((ROOT / "specs" / "softmax.yaml").read_text(), "specs/softmax.yaml"),
                         "specs/softmax.yaml")
    assert lower_forward(softmax, {}).results["y"].op != "stored"
    (_, backward), = schedule(spec).backward.graphs
    assert element_inputs_read(backward) == {"grad_hidden", "grad_y", "hidden"}


@pytest.mark.parametrize("op,expected", [("layernorm", True), ("swish_layernorm", True), ("add_layernorm", True),
                                         ("channel_norm", True), ("rmsnorm", False), ("add_rmsnorm", False),
                                         ("softmax", False), ("log_softmax", False)])
def test_a_mean_and_the_variance_about_it_take_one_moments_pass(op, expected):
    """sum(e) followed by sum((e - sum(e) / N)^2) is one row.moments call (the global
    version makes it one pass and one exchange); a mean of squares (rmsnorm) or a
    maximum and a sum of exponentials (softmax) is no such pair."""
    forward = _struct(op, "forward")
    assert ("row.moments(" in forward) == expected
    if expected:
        assert "static constexpr int kReductionPasses = 1;" in forward
        assert not re.search(r"row\.(?:sum|sums)\(", forward)


@pytest.mark.parametrize("op,expected", [("rmsnorm", True), ("add_rmsnorm", True), ("layernorm", False),
                                         ("softmax", False), ("log_softmax", False)])
def test_a_sum_of_squares_is_one_sum_squares_call_on_the_base(op, expected):
    """sum(e * e) alone is row.sum_squares with e as its term (the GPU adds each square in
    one fused multiply-add), so no forward squares its term itself before a plain sum."""
    forward = _struct(op, "forward")
    assert ("row.sum_squares(" in forward) == expected
    if expected:
        body = forward[forward.index("row.sum_squares("):]
        body = body[:body.index("});")]
        term = re.search(r"const float term = (.*);", body).group(1)
        assert "*" not in term, term


SKIP_NORM = HEADER + """\
inputs:
  x: [..., N]
  residual: [..., N]
outputs:
  hidden: [..., N]
  y: [..., N]
math:
  hidden: x + residual
  y: hidden * rsqrt(mean(hidden * hidden, N) + 1e-6) + x
"""


def test_double_backward_from_a_kept_output_only_where_its_inputs_gradients_need_no_values():
    """add_rmsnorm's autograd keeps hidden in place of x and residual: its double backward
    runs the math from hidden, and x's and residual's gradients are hidden's (hidden = x +
    residual). Where y also reads x itself, its backward still needs only hidden (the
    derivative of + x is 1), but y cannot be computed from hidden: no math from hidden,
    and the double backward raises naming the op."""
    from generator.emit_aten import kept_output_math
    from generator.emit_autograd import emit_autograd

    add = schedule(parse_spec(parse_yaml((ROOT / "specs" / "add_rmsnorm.yaml").read_text(), "specs/add_rmsnorm.yaml"),
                              "specs/add_rmsnorm.yaml"))
    kept = kept_output_math(add)
    assert kept.outputs == ("hidden",) and kept.left_out == ("x", "residual")
    (gradients,) = kept.gradients.values()
    assert all(g.op == "input" and g.value == "grad_hidden" for g in gradients.results.values())
    (results,) = kept.results.values()
    read = {n.value for r in results.results.values() for n in topological_order([r]) if n.op == "input"}
    assert read == {"hidden", "weight"}
    assert "math_from_kept(" in emit_autograd([add])

    skip = schedule(spec_of(SKIP_NORM))
    assert ("output", 0) in skip.kept_for_backward and ("input", 0) not in skip.kept_for_backward
    assert kept_output_math(skip) is None
    text = emit_autograd([skip])
    assert "math_from_kept(" not in text and "avo::t has first derivatives only (no double backward" in text

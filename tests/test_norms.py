"""The row ops (reductions over the last dimension N) against float64 torch references:
avo::layernorm, rmsnorm, softmax, log_softmax, swish_layernorm, add_layernorm and
add_rmsnorm -- values, large-offset inputs, gradients, layouts, opcheck, torch.compile,
determinism of the parameter gradients and argument errors.

Tolerances. Every reference is computed by torch in float64 on the upcast inputs (which
are already rounded to the test dtype; the add ops' references round hidden = x + residual
to it too before normalizing it, as the ops do, like torch's layer_norm(x + residual); the
gradient checks take the gradients of an op whose backward reads an output (softmax's and
log_softmax's y, the add ops' hidden) at the output the op returned, which that backward
reads, as torch's does), so the only errors left are the kernels' own:
  * The result is rounded to the output dtype: half an ulp, 2^-8 relative for bfloat16
    and 2^-11 for float16. conftest.TOLERANCES allows four times that (rtol 1.6e-2 /
    2e-3); fp32 gets rtol 2e-5, a few ulps.
  * Inside, the kernels compute in fp32; reductions accumulate in fp32 on the GPU
    (per-thread partial sums, then a tree) and in double on the CPU, rounded to fp32.
    A result that is a difference of larger terms (a normalized value, a gradient) so
    carries an absolute error of a few fp32 eps times the size of those terms, even
    where the result itself is tiny. `assert_matches_reference(..., scale=S)` adds an
    absolute tolerance of 16 * eps_fp32 * S, S being the size of the terms:
      - normalized outputs: max|y| (plus max|bias|);
      - grad of x / residual: rstd * max|grad_y * weight| * (2 + max|x_hat|), the size of
        the three terms of the layer-norm backward (rmsnorm alike), plus max|grad_hidden|
        for add_*; softmax: max|grad_y|; log_softmax: max|grad_y| + max row sum |grad_y|;
      - grad of weight / bias: sums over rows, so rows * max|grad_y * x_hat| and
        rows * max|grad_y|.
  * Large offsets (x = c + randn): the fp32 mean of values of size c is off by a few
    eps_fp32 * c, so y carries an absolute error of ~eps_fp32 * c * rstd * |w|: the
    scale there is c * rstd * max|w| (far below the error of a naive E[x^2] - E[x]^2
    variance, eps_fp32 * c^2 * rstd^2, which is O(1) or worse at c = 1e3 and 1e4); the
    gradients' scales grow by the same factor c.
  * softmax / log_softmax in fp16/bf16: values span many binades; the rtol covers them,
    and an absolute 1e-3 * max|y| covers the smallest probabilities.
  * The one very long row (262144) sums 2^18 terms: fp32 gets rtol 1e-4 there.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import avo_ops
from conftest import ROW_VERSIONS, TOLERANCES, forced, needs_cuda

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from generator.tuning import load_tunings, tuning_for  # noqa: E402

FP32_EPS = torch.finfo(torch.float32).eps


# ---------------------------------------------------------------------------------
# The ops: tensor inputs (per-element, then per-column parameters), the float64
# reference, and the scales of their gradients' terms.
# ---------------------------------------------------------------------------------


def _ln(h, w, b, eps=1e-5):
    return F.layer_norm(h, (h.shape[-1],), w, b, eps)


def _rms(h, w, eps=1e-6):
    return F.rms_norm(h, (h.shape[-1],), w, eps)


class Op:
    def __init__(self, name, elems, params, reference, kind, backward_reads=()):
        self.name = name
        self.elems = elems  # ("x",) or ("x", "residual")
        self.params = params  # (), ("weight",) or ("weight", "bias")
        self.reference = reference  # float64 reference: (dtype, tensors in order) -> tuple of outputs
        self.kind = kind  # "layernorm", "rmsnorm", "softmax" or "log_softmax"
        # The outputs the backward reads in place of the per-element inputs (add_rmsnorm's
        # hidden, softmax's and log_softmax's y).
        self.backward_reads = backward_reads

    @property
    def outputs(self):
        return ("hidden", "y") if len(self.elems) == 2 else ("y",)

    def op(self, *args, **kwargs):
        return getattr(torch.ops.avo, self.name)(*args, **kwargs)

    def functional(self, *args, **kwargs):
        return getattr(avo_ops, self.name)(*args, **kwargs)

    def backward_op(self):
        return getattr(torch.ops.avo, self.name + "_backward")

    @property
    def saves(self):
        """Whether the forward saves per-row values for the backward (in <op>_forward)."""
        return self.kind not in ("softmax", "log_softmax")

    def saved(self, *tensors):
        """The per-row values <op>_forward returns after the outputs, for the backward."""
        if not self.saves:
            return ()
        return _tuple(getattr(torch.ops.avo, self.name + "_forward")(*tensors))[len(self.outputs):]

    def backward_args(self, grads, tensors):
        """The arguments of <op>_backward for these gradients, at these inputs: the
        gradients, what the forward saved there, the outputs it reads, then the inputs
        (without the per-element ones where it reads outputs in their place)."""
        if not self.backward_reads:
            return (*grads, *self.saved(*tensors), *tensors)
        outputs = dict(zip(self.outputs, _tuple(self.op(*tensors))))
        read = [outputs[name] for name in self.backward_reads]
        return (*grads, *self.saved(*tensors), *read, *tensors[len(self.elems):])

    def backward(self, grads, tensors):
        """<op>_backward of these gradients, at these inputs."""
        return _tuple(self.backward_op()(*self.backward_args(grads, tensors)))

    def __repr__(self):
        return self.name


def stored(h, dtype, held=None):
    """The float64 `h` as an output of `dtype` holds it, the gradient passing through:
    `held`, the output the op returned, where the test has it (a gradient check: the
    backward reads that tensor), else `h` rounded. The add ops normalize the hidden they
    return, as torch's layer_norm(x + residual) normalizes the rounded sum."""
    value = h.to(dtype) if held is None else held
    return h + (value.double() - h).detach()


def softmax_reading_stored(x, dtype, held=None):
    """float64 softmax whose gradient is taken at y as the caller holds it (y_r: `held`,
    the y the op returned, where the test has it, else y rounded to `dtype`):
    y_r * (g - sum(g * y_r)), the backward of the op and of torch, which read the output
    the caller has. (A y the kernel computed in fp32 may round to the neighbour of the
    rounded float64 y; the gradient at that y is what the backward owes.) Its value is
    softmax(x); the gradient comes from a linear function whose Jacobian is the softmax
    Jacobian at y_r (symmetric), added as zero."""
    y = torch.softmax(x, -1).detach()
    y_r = (y.to(dtype) if held is None else held).double()
    linear = y_r * (x - (x * y_r).sum(-1, keepdim=True))
    return y + (linear - linear.detach())


def log_softmax_reading_stored(x, dtype, held=None):
    """float64 log_softmax whose gradient is taken at y as the caller holds it (y_r, as in
    softmax_reading_stored): g - exp(y_r) * sum(g), the backward of the op and of torch.
    Its value is log_softmax(x); the gradient comes from x - sum(x * exp(y_r)), whose
    Jacobian is the log_softmax Jacobian at y_r, added as zero."""
    y = torch.log_softmax(x, -1).detach()
    p_r = torch.exp((y.to(dtype) if held is None else held).double())
    linear = x - (x * p_r).sum(-1, keepdim=True)
    return y + (linear - linear.detach())


# reference(dtype, *tensors64, held=None): the float64 outputs; `dtype` is the test's;
# `held` (an op with backward_reads): the outputs the op returned, whose values the
# backward reads, for the gradient to be taken at.
OPS = {
    "layernorm": Op("layernorm", ("x",), ("weight", "bias"), lambda dt, x, w, b: (_ln(x, w, b),), "layernorm"),
    "rmsnorm": Op("rmsnorm", ("x",), ("weight",), lambda dt, x, w: (_rms(x, w),), "rmsnorm"),
    "softmax": Op("softmax", ("x",), (), lambda dt, x, held=(None,): (softmax_reading_stored(x, dt, held[0]),), "softmax",
                  backward_reads=("y",)),
    "log_softmax": Op("log_softmax", ("x",), (), lambda dt, x, held=(None,): (log_softmax_reading_stored(x, dt, held[0]),),
                      "log_softmax", backward_reads=("y",)),
    "swish_layernorm": Op("swish_layernorm", ("x",), ("weight", "bias"),
                          lambda dt, x, w, b: (_ln(F.silu(x), w, b),), "layernorm"),
    "add_layernorm": Op("add_layernorm", ("x", "residual"), ("weight", "bias"),
                        lambda dt, x, r, w, b, held=(None, None): (x + r, _ln(stored(x + r, dt, held[0]), w, b)), "layernorm",
                        backward_reads=("hidden",)),
    "add_rmsnorm": Op("add_rmsnorm", ("x", "residual"), ("weight",),
                      lambda dt, x, r, w, held=(None, None): (x + r, _rms(stored(x + r, dt, held[0]), w)), "rmsnorm",
                      backward_reads=("hidden",)),
}
ALL = list(OPS)
NORMS = [name for name in OPS if OPS[name].params]  # the ops with parameters

SHAPES = [(1, 1), (4, 1), (0, 16), (3, 7), (5, 33), (2, 3, 130), (4, 1000)]


def randn(shape, dtype, device, offset=0.0, std=1.0):
    x = torch.randn(shape, dtype=torch.float64) * std + offset
    return x.to(dtype=dtype, device=device)


def make_inputs(op, shape, dtype, device, params=True, bias=True, offset=0.0):
    """The tensor arguments of `op` in order; a parameter left out is None."""
    n = shape[-1]
    tensors = [randn(shape, dtype, device, offset=offset)]
    if len(op.elems) == 2:
        tensors.append(randn(shape, dtype, device))
    if "weight" in op.params:
        tensors.append(randn((n,), dtype, device, offset=1.0, std=0.5) if params else None)
    if "bias" in op.params:
        tensors.append(randn((n,), dtype, device) if params and bias else None)
    return tensors


def upcast(tensors, requires_grad=False):
    return [None if t is None else t.detach().double().requires_grad_(requires_grad) for t in tensors]


def _max(t):
    return t.abs().max().item() if t is not None and t.numel() else 0.0


def assert_matches_reference(actual, expected64, dtype, scale=0.0, rtol=None, atol=0.0):
    """`scale`: the size of the terms the result is computed from (module docstring)."""
    assert actual.dtype == dtype
    assert actual.shape == expected64.shape
    tol = dict(TOLERANCES[dtype])
    if rtol is not None:
        tol["rtol"] = rtol
    tol["atol"] = max(tol["atol"], atol, 16 * FP32_EPS * scale)
    torch.testing.assert_close(actual.double(), expected64.double(), **tol)


def _normalized(op, tensors64, dtype=torch.float64):
    """x_hat and rstd (per row, keepdim) of the float64 reference's normalized tensor."""
    h = tensors64[0]
    if len(op.elems) == 2:
        h = stored(h + tensors64[1], dtype)
    if op.name == "swish_layernorm":
        h = F.silu(h)
    if op.kind == "layernorm":
        centered = h - h.mean(-1, keepdim=True)
        rstd = torch.rsqrt((centered * centered).mean(-1, keepdim=True) + 1e-5)
    else:
        centered = h
        rstd = torch.rsqrt((h * h).mean(-1, keepdim=True) + 1e-6)
    return centered * rstd, rstd


def output_scale(op, tensors64, outputs64, index):
    if op.outputs[index] == "hidden":
        return _max(outputs64[index])
    bias = tensors64[-1] if "bias" in op.params else None
    return _max(outputs64[index]) + _max(bias)


def grad_scales(op, tensors64, grads64):
    """Per tensor input, the size of the terms its gradient is computed from."""
    grad_y = grads64[-1]
    rows = grad_y.numel() // grad_y.shape[-1] if grad_y.numel() else 0
    scales = []
    if op.kind in ("softmax", "log_softmax"):
        s = _max(grad_y)
        if op.kind == "log_softmax" and grad_y.numel():
            s += grad_y.abs().sum(-1).max().item()
        return [s]
    x_hat, rstd = _normalized(op, tensors64)
    w = tensors64[len(op.elems)] if "weight" in op.params else None
    gw = grad_y if w is None else grad_y * w
    s = _max(rstd) * _max(gw) * (2 + _max(x_hat))
    if op.name == "swish_layernorm":
        s *= 1.1  # max |silu'|
    if len(op.elems) == 2:
        s += _max(grads64[0])
    scales += [s] * len(op.elems)
    if "weight" in op.params:
        scales.append(rows * _max(grad_y * x_hat))
    if "bias" in op.params:
        scales.append(rows * _max(grad_y))
    return scales


def _tuple(out):
    return out if isinstance(out, tuple) else (out,)


def check_values(op, tensors, dtype, rtol=None, call=None):
    outputs = _tuple((call or op.op)(*tensors))
    tensors64 = upcast(tensors)
    expected = op.reference(dtype, *tensors64)
    assert len(outputs) == len(expected)
    x = tensors[0]
    for k, (out, exp) in enumerate(zip(outputs, expected)):
        assert out.shape == x.shape and out.device == x.device and out.is_contiguous()
        atol = 1e-3 * _max(exp) if op.kind in ("softmax", "log_softmax") and dtype != torch.float32 else 0.0
        assert_matches_reference(out, exp, dtype, scale=output_scale(op, tensors64, expected, k), rtol=rtol,
                                 atol=atol)


def check_gradients(op, tensors, dtype, call):
    """Gradients of every tensor input, every output receiving a gradient."""
    device = tensors[0].device
    shape = tensors[0].shape
    leaves = [None if t is None else t.detach().clone().requires_grad_(True) for t in tensors]
    grads = [randn(shape, dtype, device) for _ in op.outputs]
    outputs = _tuple(call(*leaves))
    present = [t for t in leaves if t is not None]
    actual = torch.autograd.grad(outputs, present, grads)

    leaves64 = upcast(tensors, requires_grad=True)
    held = {"held": [o.detach() for o in outputs]} if op.backward_reads else {}
    outputs64 = op.reference(dtype, *leaves64, **held)
    grads64 = [g.double() for g in grads]
    present64 = [t for t in leaves64 if t is not None]
    expected = torch.autograd.grad(outputs64, present64, grads64, allow_unused=True)
    scales = [s for s, t in zip(grad_scales(op, upcast(tensors), grads64), leaves) if t is not None]
    for a, e, s, leaf in zip(actual, expected, scales, present):
        assert a.shape == leaf.shape
        e = torch.zeros_like(leaf, dtype=torch.float64) if e is None else e
        assert_matches_reference(a, e, dtype, scale=s)


# ---------------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------------


# (op, with parameters?) -- softmax and log_softmax have none.
PARAM_CASES = [(n, p) for n in ALL for p in (["params", "no_params"] if OPS[n].params else ["no_params"])]
# ... and for the gradients also weight given, bias None.
GRAD_PARAM_CASES = [(n, p) for n in ALL
                    for p in ["params", "weight_only", "no_params"]
                    if (p == "no_params" or OPS[n].params) and (p != "weight_only" or "bias" in OPS[n].params)]


def _ids(cases):
    return [f"{n}-{p}" for n, p in cases]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name,params", PARAM_CASES, ids=_ids(PARAM_CASES))
def test_forward_matches_float64_reference(name, params, shape, device, dtype):
    op = OPS[name]
    check_values(op, make_inputs(op, shape, dtype, device, params=params == "params"), dtype)


@pytest.mark.parametrize("name", ALL)
def test_functional_api_equals_registered_op(name, device, dtype):
    op = OPS[name]
    tensors = make_inputs(op, (6, 45), dtype, device)
    for a, b in zip(_tuple(op.functional(*tensors)), _tuple(op.op(*tensors))):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("name", NORMS)
def test_weight_without_bias(name, device, dtype):
    op = OPS[name]
    check_values(op, make_inputs(op, (5, 33), dtype, device, bias=False), dtype)


@pytest.mark.parametrize("name", ["layernorm", "swish_layernorm", "add_layernorm"])
def test_rows_of_one_element_normalize_to_exactly_the_bias(name, device):
    """A row of one element is its own mean. Every pass must compute the element the
    same way (a product rounded in one pass and fused into a subtraction in another would
    leave a rounding error), so the centered value is exactly zero and y is the bias."""
    op = OPS[name]
    tensors = make_inputs(op, (64, 1), torch.float32, device)
    y = _tuple(op.op(*tensors))[-1]
    assert torch.equal(y, tensors[-1].expand_as(y))


@pytest.mark.parametrize("name", NORMS)
def test_eps_is_used(name, device):
    # Rows of tiny variance: eps dominates, so a dropped or misplaced eps shows.
    op = OPS[name]
    tensors = make_inputs(op, (4, 40), torch.float32, device)
    tensors[0] = tensors[0] * 1e-3
    if len(op.elems) == 2:
        tensors[1] = tensors[1] * 1e-3
    eps = 1e-4
    out = _tuple(op.op(*tensors, eps=eps))
    t64 = upcast(tensors)
    h = t64[0] + t64[1] if len(op.elems) == 2 else t64[0]
    if op.name == "swish_layernorm":
        h = F.silu(h)
    w = t64[len(op.elems)]
    b = t64[len(op.elems) + 1] if "bias" in op.params else None
    ref = _ln(h, w, b, eps) if op.kind == "layernorm" else _rms(h, w, eps)
    assert_matches_reference(out[-1], ref, torch.float32, scale=_max(ref) + _max(b))


@pytest.mark.parametrize("name", ["layernorm", "rmsnorm", "softmax"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_very_long_row(name, dtype, device):
    op = OPS[name]
    check_values(op, make_inputs(op, (2, 262144), dtype, device), dtype,
                 rtol=1e-4 if dtype == torch.float32 else None)


@pytest.mark.parametrize("length", [8, 1024, 16384, 65536], ids=str)
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_rows_with_nan_or_infinity_match_torch(name, length, device, dtype):
    """The row maximum propagates NaN and infinities as torch does: a row holding a NaN or
    +inf, or only -inf, is NaN throughout; a -inf among finite values gives 0 (softmax)
    or -inf (log_softmax). On the H200 the lengths take the register, pipelined, cluster
    and global versions of the GPU kernels (tuning/sm_90.json)."""
    x = randn((6, length), torch.float64, "cpu")
    x[0, length // 3] = float("nan")
    x[1, length // 2] = float("inf")
    x[2] = -float("inf")
    x[3, 0] = -float("inf")
    x[4, length - 1] = float("nan")
    x = x.to(dtype=dtype, device=device)
    expected = getattr(torch, name)(x.double(), -1)
    assert expected[:3].isnan().all() and expected[4].isnan().all() and not expected[5].isnan().any()
    actual = getattr(torch.ops.avo, name)(x)
    # As check_values: the smallest probabilities in 16 bits, the long rows' sums in fp32.
    tol = dict(TOLERANCES[dtype])
    if dtype != torch.float32:
        tol["atol"] = 1e-3 * expected[5].abs().max().item()
    elif length >= 16384:
        tol["rtol"] = 1e-4
    torch.testing.assert_close(actual.double(), expected, equal_nan=True, **tol)


# ---------------------------------------------------------------------------------
# Large offsets: the variance must come from centered values
# ---------------------------------------------------------------------------------

OFFSET_CASES = [(torch.float32, 1e3), (torch.float32, 1e4), (torch.float16, 1e3), (torch.bfloat16, 1e3)]


@pytest.mark.parametrize("dtype,offset", OFFSET_CASES, ids=lambda v: str(v).replace("torch.", ""))
@pytest.mark.parametrize("shape", [(8, 1000), (16, 64)], ids=str)
@pytest.mark.parametrize("name", ["layernorm", "swish_layernorm", "add_layernorm"])
def test_large_offset(name, shape, dtype, offset, device):
    op = OPS[name]
    check_large_offset(op, make_inputs(op, shape, dtype, device, offset=offset), dtype, offset)


def check_large_offset(op, tensors, dtype, offset):
    """The forward of rows near `offset` against float64: y within offset * rstd * |w|."""
    out = _tuple(op.op(*tensors))
    t64 = upcast(tensors)
    expected = op.reference(dtype, *t64)
    _, rstd = _normalized(op, t64, dtype)
    w, b = t64[-2], t64[-1]
    # hidden = x + residual is a plain rounded sum
    if len(op.elems) == 2:
        assert_matches_reference(out[0], expected[0], dtype)
    scale = offset * _max(rstd) * _max(w)
    assert_matches_reference(out[-1], expected[-1], dtype, scale=scale + _max(expected[-1]) + _max(b))
    # The outputs are normalized: mean ~ bias, not garbage.
    assert torch.isfinite(out[-1]).all()


# Every GPU kernel version on rows far from zero, with a spike at every 16th element:
# the first value of many threads (the shift of their partial moments) lies far from the
# row's mean, and each thread's squared deviations are large beside the variance.
@needs_cuda
@pytest.mark.parametrize("row_version", ROW_VERSIONS, indirect=True)
@pytest.mark.parametrize("length", [1000, 4096, 65536], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("name", ["layernorm", "swish_layernorm", "add_layernorm"])
def test_large_offset_on_every_kernel_version(name, dtype, length, row_version):
    op = OPS[name]
    tensors = make_inputs(op, (6, length), dtype, "cuda", offset=1e3)
    tensors[0][:, ::16] += 1e2
    check_large_offset(op, tensors, dtype, 1e3 + 1e2)


# The 16-bit cluster rows that keep no values (layernorm's, add_layernorm's, channel_norm's
# without swish) take the variance from one pass's sum and sum of squares where the row's
# mean lies within about 8 standard deviations of zero (kOnePassMomentsBound), and make a
# second pass about the mean beyond: rows whose normalized values have their mean at 7 and
# at 9 standard deviations, one on each side of the bound, on every GPU kernel version
# (swish_layernorm's, which keep their values, for the two passes).
@needs_cuda
@pytest.mark.parametrize("row_version", ROW_VERSIONS, indirect=True)
@pytest.mark.parametrize("length", [1000, 4096, 65536], ids=str)
@pytest.mark.parametrize("deviations", [7.0, 9.0], ids=["7sd", "9sd"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("name", ["layernorm", "swish_layernorm", "add_layernorm"])
def test_offsets_beside_the_one_pass_bound(name, dtype, deviations, length, row_version):
    op = OPS[name]
    spread = math.sqrt(len(op.elems))  # add_layernorm normalizes x + residual, two unit normals
    tensors = make_inputs(op, (6, length), dtype, "cuda", offset=deviations * spread)
    check_values(op, tensors, dtype)


# Every GPU kernel version on softmax rows at the edges of its maximum and sum: the
# first half of a row -inf (threads, and blocks of a cluster, that hold only -inf), a row
# rising steadily, a row with a NaN, a row with +inf and a row of -inf only (NaN, as torch
# gives them).
@needs_cuda
@pytest.mark.parametrize("row_version", ROW_VERSIONS, indirect=True)
@pytest.mark.parametrize("length", [1000, 4096, 65536], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_statistics_on_every_kernel_version(name, dtype, length, row_version):
    x = randn((6, length), torch.float64, "cpu") * 4
    x[0, : length // 2] = -float("inf")
    x[1] = torch.linspace(-30.0, 30.0, length, dtype=torch.float64)
    x[2, length // 3] = float("nan")
    x[3, length - 1] = float("inf")
    x[4] = -float("inf")
    x = x.to(dtype=dtype, device="cuda")
    expected = getattr(torch, name)(x.double(), -1)
    assert expected[2:5].isnan().all()
    actual = getattr(torch.ops.avo, name)(x)
    tol = dict(TOLERANCES[dtype])
    if dtype != torch.float32:
        tol["atol"] = 1e-3 * expected[5].abs().max().item()
    else:
        tol["rtol"] = 1e-4
    torch.testing.assert_close(actual.double(), expected, equal_nan=True, **tol)


@pytest.mark.parametrize("length", [8, 1000, 16384, 65536], ids=str)
@pytest.mark.parametrize("name", ["layernorm", "swish_layernorm", "add_layernorm"])
def test_layernorm_rows_with_nan_or_infinity_are_nan_as_in_torch(name, length, device, dtype):
    """A NaN, +inf or -inf anywhere in a row makes its mean or variance NaN or infinite:
    torch's layer_norm gives NaN across the row, and so must the moments of every kernel
    version (the lengths take the register, staged or pipelined, cluster and global
    versions on the H200); the other rows stay finite."""
    op = OPS[name]
    tensors = make_inputs(op, (6, length), dtype, device)
    x = tensors[0]
    x[0, length // 3] = float("nan")
    x[1, length // 2] = float("inf")
    x[2, 0] = -float("inf")
    x[3, length - 1] = float("inf")
    x[3, 0] = -float("inf")
    expected = op.reference(dtype, *upcast(tensors))[-1]
    actual = _tuple(op.op(*tensors))[-1]
    assert expected[:4].isnan().all() and expected[4:].isfinite().all()
    assert actual[:4].isnan().all()
    assert_matches_reference(actual[4:], expected[4:], dtype, scale=_max(expected[4:]) + _max(upcast(tensors)[-1]))


@pytest.mark.parametrize("length", [1, 1000, 4096, 65536], ids=str)
@pytest.mark.parametrize("name", ["layernorm", "swish_layernorm", "add_layernorm"])
def test_constant_rows_normalize_to_exactly_the_bias(name, length, device, dtype):
    """Every value of a row equal: the mean is that value exactly and the variance zero,
    so y is the bias. The value times any count up to the length is exact in fp32
    (1000.5 has 11 significant bits, 1000 has 7), so neither the sums of the two-pass
    versions nor the global version's merged moments (each thread's start from its first
    value) round."""
    op = OPS[name]
    tensors = make_inputs(op, (4, length), dtype, device)
    value = 1000.5 if dtype == torch.float32 else 1000.0
    tensors[0] = torch.full_like(tensors[0], value)
    if len(op.elems) == 2:
        tensors[1] = torch.zeros_like(tensors[1])
    y = _tuple(op.op(*tensors))[-1]
    assert torch.equal(y, tensors[-1].expand_as(y))


@pytest.mark.parametrize("name", ["layernorm", "swish_layernorm", "add_layernorm"])
def test_large_offset_gradients(name, device):
    op = OPS[name]
    tensors = make_inputs(op, (8, 256), torch.float32, device, offset=1e3)
    leaves = [t.clone().requires_grad_(True) for t in tensors]
    grads = [randn((8, 256), torch.float32, device) for _ in op.outputs]
    actual = torch.autograd.grad(_tuple(op.op(*leaves)), leaves, grads)
    l64 = upcast(tensors, requires_grad=True)
    expected = torch.autograd.grad(op.reference(torch.float32, *l64), l64, [g.double() for g in grads])
    scales = grad_scales(op, upcast(tensors), [g.double() for g in grads])
    for a, e, s in zip(actual, expected, scales):
        assert_matches_reference(a, e, torch.float32, scale=s * 1e3)


# ---------------------------------------------------------------------------------
# Gradients
# ---------------------------------------------------------------------------------

GRAD_SHAPES = [(1, 1), (4, 1), (0, 16), (5, 33), (2, 3, 130), (16, 1000)]


@pytest.mark.parametrize("api", ["op", "functional"])
@pytest.mark.parametrize("shape", GRAD_SHAPES, ids=str)
@pytest.mark.parametrize("name,params", GRAD_PARAM_CASES, ids=_ids(GRAD_PARAM_CASES))
def test_gradient_matches_float64_autograd(name, params, shape, api, device, dtype):
    op = OPS[name]
    tensors = make_inputs(op, shape, dtype, device, params=params != "no_params", bias=params == "params")
    check_gradients(op, tensors, dtype, op.op if api == "op" else op.functional)


@pytest.mark.parametrize("which", ["hidden", "y"])
@pytest.mark.parametrize("name", ["add_layernorm", "add_rmsnorm"])
def test_gradient_through_one_output(name, which, device, dtype):
    # Only one of (hidden, y) reaches the loss: the other's gradient is implicitly zero.
    op = OPS[name]
    tensors = make_inputs(op, (6, 40), dtype, device)
    leaves = [t.clone().requires_grad_(True) for t in tensors]
    k = op.outputs.index(which)
    g = randn((6, 40), dtype, device)
    actual = torch.autograd.grad(op.op(*leaves)[k], leaves, g, allow_unused=True)
    l64 = upcast(tensors, requires_grad=True)
    expected = torch.autograd.grad(op.reference(dtype, *l64)[k], l64, g.double(), allow_unused=True)
    grads64 = [torch.zeros_like(g, dtype=torch.float64), torch.zeros_like(g, dtype=torch.float64)]
    grads64[k] = g.double()
    scales = grad_scales(op, upcast(tensors), grads64)
    for a, e, s, leaf in zip(actual, expected, scales, leaves):
        a = torch.zeros_like(leaf) if a is None else a
        e = torch.zeros_like(leaf, dtype=torch.float64) if e is None else e
        assert_matches_reference(a, e, dtype, scale=s)


@pytest.mark.parametrize("api", ["op", "function_class"])
@pytest.mark.parametrize("name", ["add_layernorm", "add_rmsnorm"])
def test_add_ops_backward_reads_hidden_not_x_and_residual(name, api, device):
    """Autograd keeps the output hidden for the backward, not x and residual: changing x
    and residual in place after the forward leaves the gradients as they were (against
    float64), while changing hidden in place is caught by autograd's version check."""
    op = OPS[name]
    function = getattr(avo_ops, "".join(part.title() for part in name.split("_")) + "Function").apply
    call = op.op if api == "op" else function
    tensors = make_inputs(op, (6, 40), torch.float32, device)
    g = [randn((6, 40), torch.float32, device) for _ in op.outputs]
    l64 = upcast(tensors, requires_grad=True)
    expected = torch.autograd.grad(op.reference(torch.float32, *l64), l64, [t.double() for t in g])
    scales = grad_scales(op, upcast(tensors), [t.double() for t in g])

    leaves = [t.clone().requires_grad_(True) for t in tensors]
    x, residual = leaves[0] * 1.0, leaves[1] * 1.0  # not leaves: they may change in place
    outputs = call(x, residual, *leaves[2:])
    x.add_(1.0)
    residual.mul_(3.0)
    actual = torch.autograd.grad(outputs, leaves, g)
    for a, e, s in zip(actual, expected, scales):
        assert_matches_reference(a, e, torch.float32, scale=s)

    hidden, y = call(leaves[0] * 1.0, leaves[1] * 1.0, *leaves[2:])
    hidden.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(y, leaves, g[1])


@pytest.mark.parametrize("name", ALL)
def test_backward_op_returns_one_gradient_per_input(name, device):
    """One gradient per input, except that x and residual of the add ops (whose gradients
    are the same) share one, which autograd hands to both."""
    op = OPS[name]
    dtype = torch.float32
    tensors = make_inputs(op, (3, 20), dtype, device)
    grads = [randn((3, 20), dtype, device) for _ in op.outputs]
    result = op.backward(grads, tensors)
    assert len(result) == len(tensors) - (len(op.elems) - 1)
    for r, t in zip(result, tensors[len(op.elems) - 1:]):
        assert r.shape == t.shape and r.dtype == dtype and r.device == t.device
    if len(op.elems) == 2:
        leaves = [t.clone().requires_grad_(True) for t in tensors]
        grad_x, grad_residual = torch.autograd.grad(op.op(*leaves), leaves[:2], grads)
        assert torch.equal(grad_x, result[0]) and torch.equal(grad_residual, result[0])
    if op.params:
        # A missing optional input gets an empty gradient.
        without = [t if k < len(op.elems) else None for k, t in enumerate(tensors)]
        result = op.backward(grads, without)
        for r in result[1:]:
            assert r.shape == (0,)


def _saved_reference(op, tensors64, dtype):
    """The per-row values <op>_forward saves, in float64: the mean and rstd (layernorm
    family) or the rstd (rmsnorm family) of the normalized tensor."""
    x = tensors64[0]
    h = stored(x + tensors64[1], dtype) if len(op.elems) == 2 else x
    h = F.silu(h) if op.name == "swish_layernorm" else h
    _, rstd = _normalized(op, tensors64, dtype)
    return [h.mean(-1), rstd.squeeze(-1)] if op.kind == "layernorm" else [rstd.squeeze(-1)]


@pytest.mark.parametrize("shape", [(5, 33), (2, 3, 130), (0, 16)], ids=str)
@pytest.mark.parametrize("name", [name for name in ALL if OPS[name].saves])
def test_forward_saves_per_row_values_matching_float64(name, shape, device, dtype):
    """<op>_forward returns exactly the op's outputs, then per-row fp32 values: those the
    backward reads, against their float64 definition."""
    op = OPS[name]
    tensors = make_inputs(op, shape, dtype, device)
    results = _tuple(getattr(torch.ops.avo, name + "_forward")(*tensors))
    outputs, saved = results[:len(op.outputs)], results[len(op.outputs):]
    for a, b in zip(outputs, _tuple(op.op(*tensors))):
        assert torch.equal(a, b)
    tensors64 = upcast(tensors)
    expected = _saved_reference(op, tensors64, dtype)
    assert len(saved) == len(expected)
    for value, reference in zip(saved, expected):
        assert value.device == tensors[0].device and value.is_contiguous()
        assert_matches_reference(value, reference, torch.float32, scale=_max(reference) + _max(tensors64[0]))


def test_backward_rejects_saved_values_it_cannot_read(device):
    x, w, b = make_inputs(OPS["layernorm"], (3, 8), torch.float16, device)
    g = torch.randn(3, 8, device=device).half()
    _, mu, rstd = torch.ops.avo.layernorm_forward(x, w, b)
    assert mu.dtype == torch.float32 and mu.shape == (3,)
    with pytest.raises(RuntimeError, match=r"avo::layernorm_backward: argument 'rstd' must be a float32 tensor of "
                                           r"shape \[3\] \(one value per row of 'grad_y', as avo::layernorm_forward "
                                           r"returns it\), got float16 \[3\]"):
        torch.ops.avo.layernorm_backward(g, mu, rstd.half(), x, w, b)
    with pytest.raises(RuntimeError, match=r"argument 'mu' must be a float32 tensor of shape \[3\] .*got float32 \[4\]"):
        torch.ops.avo.layernorm_backward(g, torch.zeros(4, device=device), rstd, x, w, b)


def test_saving_forward_is_not_differentiable(device):
    x = torch.randn(3, 8, device=device, requires_grad=True)
    with pytest.raises(RuntimeError, match="avo::rmsnorm_forward is not differentiable: call avo::rmsnorm"):
        torch.ops.avo.rmsnorm_forward(x, None, 1e-6)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_backward_reads_y_and_its_forward_saves_nothing(name, device):
    """softmax's and log_softmax's backwards are written in y (specs/*softmax.yaml), as
    torch's: each takes the incoming gradient and y, autograd keeps y alone, and there is
    no saving forward."""
    schema = getattr(torch.ops.avo, name + "_backward").default._schema
    assert [a.name for a in schema.arguments] == ["grad_y", "y"]
    assert not hasattr(torch.ops.avo, name + "_forward")
    x = torch.randn(4, 40, device=device, dtype=torch.float64).float().requires_grad_(True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = getattr(torch.ops.avo, name)(x)
    assert len(saved) == 1 and saved[0].data_ptr() == y.data_ptr()  # y, which the caller has anyway
    dy = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, x, dy)
    assert torch.equal(dx, getattr(torch.ops.avo, name + "_backward")(dy, y.detach()))


@pytest.mark.parametrize("name", ALL)
def test_function_class_has_the_op_gradients(name, device):
    """avo_ops.<Op>Function (for code that composes autograd.Functions) gives the outputs
    and gradients of the op's own autograd kernel, bit for bit."""
    op = OPS[name]
    function = getattr(avo_ops, "".join(part.title() for part in name.split("_")) + "Function")
    tensors = make_inputs(op, (4, 40), torch.float32, device)
    grads = [randn((4, 40), torch.float32, device) for _ in op.outputs]
    runs = []
    for call in (op.op, function.apply):
        leaves = [t.clone().requires_grad_(True) for t in tensors]
        outputs = _tuple(call(*leaves))
        runs.append((outputs, torch.autograd.grad(outputs, leaves, grads)))
    for a, b in zip(runs[0][0] + runs[0][1], runs[1][0] + runs[1][1]):
        assert torch.equal(a, b)


# ---------------------------------------------------------------------------------
# Layouts: non-contiguous and misaligned arguments
# ---------------------------------------------------------------------------------

R, N = 12, 37


def _layout(kind, dtype, device):
    if kind == "transposed":
        return randn((N, R), dtype, device).t()
    if kind == "sliced_step":
        return randn((R, 2 * N), dtype, device)[:, ::2]
    if kind == "storage_offset":  # contiguous, not 16-byte aligned
        return randn((R * N + 8,), dtype, device)[1:1 + R * N].view(R, N)
    if kind == "offset_rows":
        return randn((R + 1, N + 3), dtype, device)[1:, 3:]
    raise AssertionError(kind)


LAYOUTS = ["transposed", "sliced_step", "storage_offset", "offset_rows"]


def _layout_inputs(op, layout, dtype, device):
    tensors = make_inputs(op, (R, N), dtype, device)
    tensors[0] = _layout(layout, dtype, device)
    if len(op.elems) == 2:
        tensors[1] = _layout(layout, dtype, device)
    for k in range(len(op.elems), len(tensors)):  # non-contiguous parameters
        w2 = randn((2 * N,), dtype, device, offset=1.0 if k == len(op.elems) else 0.0)
        tensors[k] = w2[::2] if layout != "storage_offset" else w2[1:1 + N]
    if layout != "storage_offset":
        assert not tensors[0].is_contiguous()
    return tensors


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", ALL)
def test_non_contiguous_inputs(name, layout, device, dtype):
    op = OPS[name]
    check_values(op, _layout_inputs(op, layout, dtype, device), dtype)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", ALL)
def test_gradient_of_non_contiguous_inputs(name, layout, device):
    op = OPS[name]
    tensors = _layout_inputs(op, layout, torch.float32, device)
    check_gradients(op, tensors, torch.float32, op.functional)


def test_non_contiguous_gradient_argument(device):
    op = OPS["layernorm"]
    x, w, b = make_inputs(op, (R, N), torch.float32, device)
    g = randn((N, R), torch.float32, device).t()
    _, mu, rstd = torch.ops.avo.layernorm_forward(x, w, b)
    result = torch.ops.avo.layernorm_backward(g, mu, rstd, x, w, b)
    l64 = upcast([x, w, b], requires_grad=True)
    expected = torch.autograd.grad(op.reference(torch.float32, *l64), l64, g.double())
    scales = grad_scales(op, upcast([x, w, b]), [g.double()])
    for a, e, s in zip(result, expected, scales):
        assert_matches_reference(a, e, torch.float32, scale=s)


# ---------------------------------------------------------------------------------
# Every CUDA kernel version (avo/row_cuda.cuh) on shapes it takes
# ---------------------------------------------------------------------------------

# Rows of 16-byte-aligned lengths from one vector to the register and shared-memory
# limits, and beyond them (65536: a cluster of 2 to 8 blocks, or the global version);
# 600 rows make 200 chunks of 3 rows for the parameter-gradient partials, 7 rows chunks
# of one row (rows_per_chunk, csrc/include/avo/row_args.h). The tiled version takes rows of two tiles or more (4096 16-bit or 2048 fp32 elements a
# tile); 40x12296 ends in a tile of one or two vectors. In 16 bits rows of 200 to 16384
# elements (narrow rows: to 4096) take the register and narrow rows' kernels of fixed
# group widths (kFixedGroupWidths: 8 to 512 threads, to 64 where the math keeps values
# between passes, as swish_layernorm; in rows of 200, 2000 and 12296 some lanes hold no
# vector).
VERSION_SHAPES = [(600, 8), (600, 200), (600, 512), (600, 1024), (600, 2000), (600, 4096), (7, 16384), (3, 32768),
                  (5, 65536), (40, 12296)]


@needs_cuda
@pytest.mark.parametrize("row_version", [*ROW_VERSIONS[:-1], "tiled", "auto"], indirect=True)
@pytest.mark.parametrize("shape", VERSION_SHAPES, ids=str)
@pytest.mark.parametrize("name", ALL)
def test_every_kernel_version_matches_float64(name, shape, row_version, dtype):
    """Forced onto one version (where the call can take it: a row too long for registers
    or shared memory takes the next one), forward and gradients match float64."""
    op = OPS[name]
    tensors = make_inputs(op, shape, dtype, "cuda")
    rtol = 1e-4 if dtype == torch.float32 and shape[-1] >= 16384 else None
    check_values(op, tensors, dtype, rtol=rtol)
    check_gradients(op, tensors, dtype, op.op)


# The global version on rows long enough that a thread-block cluster shares each one
# (sm_90: over 4096 vectors; 300 rows of 40960 make 60 chunks of 5 rows, which the
# clusters add up in their partials), on the longest rows of the benchmark, and on a long
# row that is not whole 16-byte vectors (a block per row).
GLOBAL_SHAPES = [(300, 40960), (2, 262144), (3, 40001)]


@needs_cuda
@pytest.mark.parametrize("row_version", ["global"], indirect=True)
@pytest.mark.parametrize("shape", GLOBAL_SHAPES, ids=str)
@pytest.mark.parametrize("name", ALL)
def test_global_kernel_version_on_long_rows_matches_float64(name, shape, row_version, dtype):
    op = OPS[name]
    tensors = make_inputs(op, shape, dtype, "cuda")
    rtol = 1e-4 if dtype == torch.float32 else None
    check_values(op, tensors, dtype, rtol=rtol)
    check_gradients(op, tensors, dtype, op.op)


# Rows of 262144 elements take clusters of 16 blocks on sm_90, past the portable 8, where
# that holds them: 16-bit rows whose cluster row has blocks of 512 threads (two
# per-element inputs, or per-column sums), fp32 forwards of one per-element input
# (blocks of 1024 threads), and fp32 rows of two per-element inputs without per-column
# sums (wide cluster rows: blocks of 512 threads holding 8 vectors a thread); rows that
# need more take another version. A cluster row that
# sums no columns loads its next row while it computes one (pipelined_rows in
# avo/row_cuda.cuh): 301 rows of 65536 give the clusters several rows each, in counts
# that differ by one; 2 rows leave most clusters none.
@needs_cuda
@pytest.mark.parametrize("row_version", ["cluster"], indirect=True)
@pytest.mark.parametrize("shape", [(3, 262144), (301, 65536), (2, 65536)], ids=str)
@pytest.mark.parametrize("name", ALL)
def test_cluster_kernel_version_on_long_rows_matches_float64(name, shape, row_version, dtype):
    op = OPS[name]
    tensors = make_inputs(op, shape, dtype, "cuda")
    rtol = 1e-4 if dtype == torch.float32 else None
    check_values(op, tensors, dtype, rtol=rtol)
    check_gradients(op, tensors, dtype, op.op)


# fp32 rows of 262144 elements of a math of two per-element inputs (add_layernorm's and
# add_rmsnorm's forwards, softmax's and log_softmax's backwards) are too long for clusters
# of 16 blocks of 512 threads holding 4 vectors each: the cluster version gives them wide
# cluster rows (wide_cluster_row_kernel in avo/row_cuda.cuh, 8 vectors a thread).
@needs_cuda
@pytest.mark.parametrize("row_version", ["cluster"], indirect=True)
@pytest.mark.parametrize("name", ["add_layernorm", "add_rmsnorm", "softmax", "log_softmax"])
def test_wide_cluster_rows_take_fp32_rows_of_two_inputs(name, row_version):
    op = OPS[name]
    tensors = make_inputs(op, (3, 262144), torch.float32, "cuda")
    check_values(op, tensors, torch.float32, rtol=1e-4)
    forward = avo_ops._C.last_row_version()
    check_gradients(op, tensors, torch.float32, op.op)
    backward = avo_ops._C.last_row_version()
    assert (forward if name.startswith("add_") else backward) == "cluster"


# A cluster row that sums no columns (every forward, and a backward of a call without
# weight and bias) reads the per-column inputs from its own copy in shared memory, made
# once per kernel with a parameter left out as its default (ColumnStage in
# avo/row_cuda.cuh). The rows fit a cluster forward in every dtype (at most 8 blocks of
# 1024 threads, 16 of 512).
STAGE_CASES = [(n, p) for n in NORMS for p in ("params", "weight_only", "no_params")
               if p != "weight_only" or "bias" in OPS[n].params]


@needs_cuda
@pytest.mark.parametrize("row_version", ["cluster"], indirect=True)
@pytest.mark.parametrize("shape", [(5, 65536), (3, 131072)], ids=str)
@pytest.mark.parametrize("name,params", STAGE_CASES, ids=_ids(STAGE_CASES))
def test_cluster_kernel_version_reads_its_copy_of_weight_and_bias(name, params, shape, row_version, dtype):
    op = OPS[name]
    tensors = make_inputs(op, shape, dtype, "cuda", params=params != "no_params", bias=params != "weight_only")
    rtol = 1e-4 if dtype == torch.float32 else None
    check_values(op, tensors, dtype, rtol=rtol)
    assert avo_ops._C.last_row_version() == "cluster"
    check_gradients(op, tensors, dtype, op.op)


# (forced version, row length, the group width of a forward's rows in 16 bits, in fp32): a
# thread of the register rows holds 4 vectors of 16 bytes (8 elements in 16 bits, 4 in
# fp32), of the narrow rows 2, in a power of two of threads. Groups of 8 to 512 threads
# run kernels compiled for their width (kFixedGroupWidths in csrc/include/avo/row_cuda.cuh),
# and so do rmsnorm's register rows of 1024 (kLightRow: its fixed kernels are held to 32
# registers); other groups of 1024 take the kernel of any width (0). layernorm and
# softmax keep no values between passes, so they take every fixed width to 512.
ROW_GROUPS = [("register", 200, 8, 16), ("register", 512, 16, 32), ("register", 1024, 32, 64),
              ("register", 2000, 64, 128), ("register", 4096, 128, 256), ("register", 8192, 256, 512),
              ("register", 16000, 512, 1024), ("register", 32768, 1024, None),
              ("narrow", 200, 16, 32), ("narrow", 512, 32, 64), ("narrow", 1024, 64, 128),
              ("narrow", 2000, 128, 256), ("narrow", 4096, 256, 512), ("narrow", 8192, 512, 1024)]


def fixed_group_threads(name, version, threads):
    """The width of the kernel of fixed group width a forward's rows of `threads` take."""
    return threads if threads <= 512 or (name == "rmsnorm" and version == "register") else 0


@needs_cuda
@pytest.mark.parametrize("version,length,threads,fp32_threads", ROW_GROUPS, ids=str)
@pytest.mark.parametrize("name", ["layernorm", "rmsnorm", "softmax"])
def test_short_rows_take_the_kernel_of_their_group_width(name, version, length, threads, fp32_threads, dtype):
    """Forced onto the register or narrow rows (softmax's register rows: the lean kernel),
    a forward reports the fixed width of its kernel (0: the kernel of any width), and the
    values match float64."""
    op = OPS[name]
    if dtype == torch.float32 and fp32_threads is None:
        pytest.skip("fp32 rows of this length do not fit the register rows")
    tensors = make_inputs(op, (300, length), dtype, "cuda")
    with forced(avo_ops._C.set_row_version, version):
        check_values(op, tensors, dtype)
        assert avo_ops._C.last_row_version() == version
        width = fp32_threads if dtype == torch.float32 else threads
        assert avo_ops._C.last_fixed_group_threads() == fixed_group_threads(name, version, width)


# A backward with per-column sums (the parameter gradients) loads the next row of its
# chunk while it computes one, where the vectors of its two per-element inputs leave the
# registers for it (600 rows of 1024: 200 chunks of 3 rows, csrc/include/avo/row_args.h).
@needs_cuda
@pytest.mark.parametrize("row_version", ["pipelined"], indirect=True)
@pytest.mark.parametrize("name", ["layernorm", "rmsnorm", "swish_layernorm"])
def test_a_backward_with_parameter_gradients_takes_the_pipelined_kernel_version(name, row_version, dtype):
    op = OPS[name]
    tensors = make_inputs(op, (600, 1024), dtype, "cuda")
    check_gradients(op, tensors, dtype, op.op)
    assert avo_ops._C.last_row_version() == "pipelined"


@needs_cuda
def test_a_16_bit_softmax_backward_of_262144_takes_the_cluster_kernel_version_of_16_blocks():
    """Its two per-element inputs make blocks of 512 threads: 8192 threads, 16 blocks."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("thread-block clusters need sm_90")
    x = torch.randn(2, 262144, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = torch.ops.avo.softmax(x)
    with forced(avo_ops._C.set_row_version, "cluster"):
        y.backward(torch.randn_like(y))
        assert avo_ops._C.last_row_version() == "cluster"


@needs_cuda
def test_an_fp32_layernorm_forward_of_262144_takes_the_cluster_kernel_version_of_16_blocks():
    """One per-element input makes blocks of 1024 threads holding 16 fp32 elements each:
    16384 threads, 16 blocks; chosen by the dispatch table, not forced."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("thread-block clusters need sm_90")
    x = torch.randn(2, 262144, device="cuda", dtype=torch.float32)
    torch.ops.avo.layernorm(x)
    assert avo_ops._C.last_row_version() == "cluster"


def this_gpus_table(line):
    """The sm_90 tuning table this GPU's dispatch takes (its own file of tuning/, else
    tuning/sm_90.json), read as the generator reads it for the build; skips the test on a
    GPU of another arch, for which the `line` is not measured."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip(f"the {line} line is measured for sm_90")
    return tuning_for(load_tunings(str(ROOT)), 90, torch.cuda.get_device_name())


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_a_16_bit_rmsnorm_forward_takes_narrow_rows_up_to_the_tables_line(dtype):
    """The sm_90 table's narrow line for rmsnorm's 16-bit forwards (this GPU's, read as
    the generator reads it for the build: this_gpus_table) gives rows of that length to the narrow
    version, not forced; rows twice as long take another; both match float64. Where the
    table has no line (the H100's fp16 one), rows of 256 to 8192 elements take another."""
    line = this_gpus_table("narrow").threshold("narrow_max_vectors", "rmsnorm", "forward",
                                               str(dtype).removeprefix("torch."))
    op = OPS["rmsnorm"]
    if line is None:
        cases = [(length, False) for length in (256, 1024, 8192)]
    else:
        cases = [(line * 8, True), (line * 16, False)]  # 8 16-bit elements a vector
    for length, narrow in cases:
        tensors = make_inputs(op, (300, length), dtype, "cuda")
        check_values(op, tensors, dtype)
        assert (avo_ops._C.last_row_version() == "narrow") == narrow, length


@needs_cuda
def test_last_row_version_names_the_version_a_call_took():
    """What the tuner relies on to drop the times of versions a call could not take: a
    forced version that fits is reported; a row of 65536 elements does not fit the
    register version, so forced onto it the call reports another."""
    x = torch.randn(8, 1024, device="cuda")
    long_rows = torch.randn(2, 65536, device="cuda")
    for version in ("register", "narrow", "staged", "global"):
        with forced(avo_ops._C.set_row_version, version):
            torch.ops.avo.softmax(x)
            assert avo_ops._C.last_row_version() == version
    with forced(avo_ops._C.set_row_version, "register"):
        torch.ops.avo.softmax(long_rows)
        assert avo_ops._C.last_row_version() not in ("register", "auto")


@needs_cuda
def test_narrow_rows_take_only_calls_without_per_column_sums_on_whole_vectors():
    """The narrow version (half the vectors a thread) is the register version for maths
    without per-column sums, on rows of 16-byte vectors: forced onto it, a forward takes
    it; a backward that sums the weight's gradient, a row of 1001 elements (single
    elements, not vectors) and a row of 16384 fp32 elements (4096 vectors: more than
    1024 threads of 2) take another version, and every result matches float64."""
    op = OPS["rmsnorm"]
    with forced(avo_ops._C.set_row_version, "narrow"):
        tensors = make_inputs(op, (64, 1024), torch.float32, "cuda")
        check_values(op, tensors, torch.float32)
        assert avo_ops._C.last_row_version() == "narrow"
        check_gradients(op, tensors, torch.float32, op.op)
        assert avo_ops._C.last_row_version() != "narrow"
        for shape in [(64, 1001), (4, 16384)]:
            tensors = make_inputs(op, shape, torch.float32, "cuda")
            check_values(op, tensors, torch.float32, rtol=1e-4)
            assert avo_ops._C.last_row_version() not in ("narrow", "auto")


# Coarse chunks of rows for the parameter gradients (rows_per_chunk's `coarse`, which a
# GPU's table takes from a measured length on): 600 rows make 120 chunks of 5 rows instead
# of 200 of 3, 300 rows 100 of 3 instead of 150 of 2; 7 rows stay chunks of one row.
COARSE_SHAPES = [(600, 1024), (300, 4096), (7, 16384)]


@pytest.fixture
def coarse_chunks():
    with forced(avo_ops._C.set_chunk_size, "coarse"):
        yield


@needs_cuda
@pytest.mark.parametrize("row_version", ["register", "pipelined", "staged", "cluster", "global", "tiled", "auto"],
                         indirect=True)
@pytest.mark.parametrize("shape", COARSE_SHAPES, ids=str)
@pytest.mark.parametrize("name", NORMS)
def test_coarse_chunks_on_every_kernel_version_match_float64(name, shape, row_version, coarse_chunks, dtype):
    op = OPS[name]
    tensors = make_inputs(op, shape, dtype, "cuda")
    check_gradients(op, tensors, dtype, op.op)


@needs_cuda
def test_set_chunk_size_sets_the_rows_a_chunk_of_the_parameter_gradients():
    """What the tuner relies on: forced coarse, 600 rows of 1024 take chunks of 5 rows,
    forced fine chunks of 3; a call without parameter gradients reports 0."""
    x, w = torch.randn(600, 1024, device="cuda"), torch.randn(1024, device="cuda")
    g = torch.randn_like(x)
    rrms = torch.ops.avo.rmsnorm_forward(x, w)[1]
    for size, rows in (("fine", 3), ("coarse", 5)):
        with forced(avo_ops._C.set_chunk_size, size):
            torch.ops.avo.rmsnorm_backward(g, rrms, x, w)
            assert avo_ops._C.last_rows_per_chunk() == rows
    with forced(avo_ops._C.set_chunk_size, "coarse"):
        torch.ops.avo.softmax(x)
        assert avo_ops._C.last_rows_per_chunk() == 0


def test_set_chunk_size_rejects_unknown_names():
    with pytest.raises(ValueError, match="set_chunk_size: unknown size 'huge'"):
        avo_ops._C.set_chunk_size("huge")


# Small cluster blocks (cluster_block_threads' `small` in avo/row_cuda.cuh, which a GPU's
# table takes from a measured length on for cluster rows without per-column sums): a
# quarter of the threads a block, or as small as 16 blocks a cluster allow. 301 rows of
# 65536 give the clusters several rows each; 2 rows of 262144 leave most clusters none;
# 7 rows of 16384 make clusters of blocks of 128 threads. The backwards with parameter
# gradients keep their blocks.
SMALL_CLUSTER_SHAPES = [(301, 65536), (2, 262144), (7, 16384)]


@pytest.fixture
def small_cluster_blocks():
    with forced(avo_ops._C.set_cluster_blocks, "small"):
        yield


@needs_cuda
@pytest.mark.parametrize("row_version", ["cluster"], indirect=True)
@pytest.mark.parametrize("shape", SMALL_CLUSTER_SHAPES, ids=str)
@pytest.mark.parametrize("name", ALL)
def test_cluster_kernel_version_in_small_blocks_matches_float64(name, shape, row_version, small_cluster_blocks, dtype):
    op = OPS[name]
    tensors = make_inputs(op, shape, dtype, "cuda")
    rtol = 1e-4 if dtype == torch.float32 else None
    check_values(op, tensors, dtype, rtol=rtol)
    check_gradients(op, tensors, dtype, op.op)


@needs_cuda
def test_set_cluster_blocks_sets_the_threads_of_a_cluster_rows_blocks():
    """What the tuner relies on: rmsnorm's bf16 forward of 65536 in the cluster version
    takes blocks of 1024 threads (2 a cluster) forced full, of 256 (8 a cluster) forced
    small; its backward with the weight's gradient keeps its blocks either way."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("thread-block clusters need sm_90")
    x = torch.randn(4, 65536, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(65536, device="cuda", dtype=torch.bfloat16)
    g = torch.randn_like(x)
    rrms = torch.ops.avo.rmsnorm_forward(x, w)[1]
    backward_threads = {}
    with forced(avo_ops._C.set_row_version, "cluster"):
        for blocks, threads in (("full", 1024), ("small", 256)):
            with forced(avo_ops._C.set_cluster_blocks, blocks):
                torch.ops.avo.rmsnorm(x, w)
                assert avo_ops._C.last_row_version() == "cluster"
                assert avo_ops._C.last_cluster_block_threads() == threads
                torch.ops.avo.rmsnorm_backward(g, rrms, x, w)
                assert avo_ops._C.last_row_version() == "cluster"
                backward_threads[blocks] = avo_ops._C.last_cluster_block_threads()
    assert backward_threads["full"] == backward_threads["small"]


def sm_90_line_reached(table, name, role, dtype, length):
    """Whether rows of `length` elements reach the line `table` for `name`'s `role` kernel
    in `dtype` of this sm_90 GPU's table (this_gpus_table)."""
    dtype_name = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}[dtype]
    line = this_gpus_table(table).threshold(table, name, role, dtype_name)
    return line is not None and length * dtype.itemsize // 16 >= line


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_a_cluster_rmsnorm_forward_of_65536_takes_the_blocks_of_the_tables_small_line(dtype):
    """The small line for rmsnorm's forward of this sm_90 GPU's table (this_gpus_table),
    not forced: rows of 65536 elements in the cluster version take small blocks (256
    threads: 8 a cluster in bf16, 16 in fp32) where the line is at or below their length,
    full ones (1024) otherwise; both match float64."""
    small = sm_90_line_reached("small_cluster_blocks_min_vectors", "rmsnorm", "forward", dtype, 65536)
    op = OPS["rmsnorm"]
    tensors = make_inputs(op, (3, 65536), dtype, "cuda")
    with forced(avo_ops._C.set_row_version, "cluster"):
        check_values(op, tensors, dtype, rtol=1e-4 if dtype == torch.float32 else None)
        assert avo_ops._C.last_row_version() == "cluster"
        threads = avo_ops._C.last_cluster_block_threads()
    assert threads == (256 if small else 1024)


# The tiled version in its two forms (avo_ops._C.set_tiled_kernels): two kernels, the
# second reading the row again, or one kernel whose blocks all run at once, a tile of a
# chunk of rows each, waiting for the other tiles' parts of each row's reduction. Rows of
# 2 to 128 tiles; chunks of one row (3x32768), of a few (7x16384: 64 chunks in 16 bits),
# of rows not a multiple of the three row buffers (301x8192, 40x12296 ending in a part
# tile), and of many (600x8192 in fp32: 75 rows a chunk).
TILED_SHAPES = [(7, 16384), (3, 32768), (5, 65536), (40, 12296), (301, 8192), (600, 8192), (2, 262144)]
# The ops whose backward can take the tiled version: per-column parameter gradients
# (channel_norm's are per channel).
TILED = [name for name in NORMS if name != "channel_norm"]


@needs_cuda
@pytest.mark.parametrize("tiled_kernels", ["two", "one"])
@pytest.mark.parametrize("shape", TILED_SHAPES, ids=str)
@pytest.mark.parametrize("name", TILED)
def test_tiled_kernel_version_in_one_and_in_two_kernels_matches_float64(name, shape, tiled_kernels, dtype):
    check_forced_backward(name, shape, dtype, "tiled", avo_ops._C.set_tiled_kernels, tiled_kernels,
                          avo_ops._C.last_tiled_kernels)


def check_forced_backward(name, shape, dtype, version, choose, choice, chosen):
    """check_gradients on CUDA inputs of `shape` with every call forced onto `version` and
    `choice` of `choose`; the backward, the last call, took both (`chosen` says)."""
    op = OPS[name]
    tensors = make_inputs(op, shape, dtype, "cuda")
    with forced(avo_ops._C.set_row_version, version), forced(choose, choice):
        check_gradients(op, tensors, dtype, op.op)
        assert avo_ops._C.last_row_version() == version
        assert chosen() == choice


@needs_cuda
@pytest.mark.parametrize("name", TILED)
def test_the_tiled_version_in_one_kernel_gives_the_same_bits_on_every_call(name, dtype):
    """The blocks of the one kernel wait for each other in whatever order they run; the
    order of every sum is fixed all the same: two calls give the same gradients, bit for
    bit."""
    op = OPS[name]
    tensors = make_inputs(op, (257, 16384), dtype, "cuda")
    leaves = [None if t is None else t.detach().clone().requires_grad_(True) for t in tensors]
    outputs = _tuple(op.op(*leaves))
    grads = [randn(o.shape, dtype, "cuda") for o in outputs]
    present = [t for t in leaves if t is not None]
    with forced(avo_ops._C.set_row_version, "tiled"), forced(avo_ops._C.set_tiled_kernels, "one"):
        first = torch.autograd.grad(outputs, present, grads, retain_graph=True)
        assert avo_ops._C.last_tiled_kernels() == "one"
        second = torch.autograd.grad(outputs, present, grads)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_a_tiled_layernorm_backward_of_65536_takes_the_kernels_of_the_tables_one_line(dtype):
    """The one line for layernorm's backward of this sm_90 GPU's table (this_gpus_table),
    not forced: rows of 65536 elements in the tiled version run as one kernel where the
    line is at or below their length and its 256 blocks fit on the GPU at once (two a
    multiprocessor), as two otherwise; both match float64. With a table of its own for
    the GPU, this checks that the dispatch takes that one."""
    one = sm_90_line_reached("one_kernel_min_vectors", "layernorm", "backward", dtype, 65536)
    fits = 2 * torch.cuda.get_device_properties(0).multi_processor_count >= 256
    op = OPS["layernorm"]
    tensors = make_inputs(op, (64, 65536), dtype, "cuda")
    with forced(avo_ops._C.set_row_version, "tiled"):
        check_gradients(op, tensors, dtype, op.op)
        assert avo_ops._C.last_row_version() == "tiled"
        kernels = avo_ops._C.last_tiled_kernels()
    assert kernels == ("one" if one and fits else "two")


# The cluster version of the backwards with per-column sums, with and without the rows
# of each chunk prefetched into L2 (avo_ops._C.set_row_prefetch): the prefetch is a hint
# and changes no value. Chunks of several rows in blocks of 512 threads (301x16384 in 16
# bits; a last chunk shorter than the others), of small clusters (67x2048), and of long
# rows (5x32768).
PREFETCH_SHAPES = [(301, 16384), (67, 2048), (5, 32768)]


@needs_cuda
@pytest.mark.parametrize("prefetch", ["off", "on"])
@pytest.mark.parametrize("shape", PREFETCH_SHAPES, ids=str)
@pytest.mark.parametrize("name", TILED)
def test_cluster_backward_with_its_rows_prefetched_or_not_matches_float64(name, shape, prefetch, dtype):
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("thread-block clusters need sm_90")
    check_forced_backward(name, shape, dtype, "cluster", avo_ops._C.set_row_prefetch, prefetch,
                          avo_ops._C.last_row_prefetch)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_a_cluster_add_layernorm_backward_of_16384_prefetches_as_the_tables_line_says(dtype):
    """The prefetch line for add_layernorm's backward of this sm_90 GPU's table
    (this_gpus_table), not forced: rows of 16384 elements in the cluster version prefetch
    where the line is at or below their length; the forward (no per-column sums) never
    does."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("thread-block clusters need sm_90")
    prefetch = sm_90_line_reached("prefetch_min_vectors", "add_layernorm", "backward", dtype, 16384)
    op = OPS["add_layernorm"]
    tensors = make_inputs(op, (64, 16384), dtype, "cuda")
    with forced(avo_ops._C.set_row_version, "cluster"):
        check_gradients(op, tensors, dtype, op.op)
        assert avo_ops._C.last_row_version() == "cluster"
        assert avo_ops._C.last_row_prefetch() == ("on" if prefetch else "off")
        op.op(*tensors)
        assert avo_ops._C.last_row_prefetch() == "auto"


def test_set_row_prefetch_rejects_unknown_names():
    with pytest.raises(ValueError, match="set_row_prefetch: unknown prefetch 'maybe'"):
        avo_ops._C.set_row_prefetch("maybe")


def test_set_tiled_kernels_rejects_unknown_names():
    with pytest.raises(ValueError, match="set_tiled_kernels: unknown kernels 'three'"):
        avo_ops._C.set_tiled_kernels("three")


def test_set_cluster_blocks_rejects_unknown_names():
    with pytest.raises(ValueError, match="set_cluster_blocks: unknown blocks 'tiny'"):
        avo_ops._C.set_cluster_blocks("tiny")


def test_the_row_kernel_setters_take_each_of_their_names():
    """set_row_version, set_chunk_size, set_cluster_blocks, set_tiled_kernels and
    set_row_prefetch accept every name they list; each is set back by 'auto'."""
    setters = {avo_ops._C.set_row_version: ["register", "pipelined", "wide", "narrow", "staged", "cluster", "global",
                                            "tiled"],
               avo_ops._C.set_chunk_size: ["fine", "coarse"],
               avo_ops._C.set_cluster_blocks: ["full", "small"],
               avo_ops._C.set_tiled_kernels: ["two", "one"],
               avo_ops._C.set_row_prefetch: ["off", "on"]}
    for setter, names in setters.items():
        try:
            for name in names:
                assert setter(name) is None
        finally:
            setter("auto")


def test_set_row_version_rejects_unknown_names():
    with pytest.raises(ValueError, match="set_row_version: unknown version 'fast'"):
        avo_ops._C.set_row_version("fast")


# ---------------------------------------------------------------------------------
# Determinism of the parameter gradients (the column pass: no float atomics)
# ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NORMS)
def test_parameter_gradients_are_deterministic(name, device, dtype):
    op = OPS[name]
    shape = (3000, 64)
    tensors = make_inputs(op, shape, dtype, device)
    grads = [randn(shape, dtype, device) for _ in op.outputs]
    first = op.backward(grads, tensors)
    for _ in range(2):
        again = op.backward(grads, tensors)
        for a, b in zip(first, again):
            assert torch.equal(a, b)
    # Through autograd as well.
    runs = []
    for _ in range(2):
        leaves = [t.clone().requires_grad_(True) for t in tensors]
        runs.append(torch.autograd.grad(_tuple(op.op(*leaves)), leaves[len(op.elems):], grads))
    for a, b in zip(*runs):
        assert torch.equal(a, b)
    # ... and correct.
    l64 = upcast(tensors, requires_grad=True)
    expected = torch.autograd.grad(op.reference(dtype, *l64), l64, [g.double() for g in grads])
    scales = grad_scales(op, upcast(tensors), [g.double() for g in grads])
    for a, e, s in zip(first[1:], expected[len(op.elems):], scales[len(op.elems):]):
        assert_matches_reference(a, e, dtype, scale=s)


def test_cpu_kernels_run_on_torchs_intra_op_threads():
    # setup.py compiles the extension with torch's OpenMP; without it at::parallel_for
    # ran every CPU call on the calling thread, whatever torch.set_num_threads said.
    previous = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            assert avo_ops._C.cpu_threads() == threads
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("name", NORMS)
def test_cpu_results_do_not_depend_on_the_thread_count(name, dtype):
    # The CPU tasks split rows (and, for the parameter gradients, whole chunks of rows):
    # every value is computed by one thread in a fixed order, however many there are.
    op = OPS[name]
    shape = (3000, 64)
    tensors = make_inputs(op, shape, dtype, "cpu")
    grads = [randn(shape, dtype, "cpu") for _ in op.outputs]
    previous = torch.get_num_threads()
    runs = []
    try:
        for threads in (1, 3):
            torch.set_num_threads(threads)
            runs.append((_tuple(op.op(*tensors)), op.backward(grads, tensors)))
    finally:
        torch.set_num_threads(previous)
    for one, several in zip(runs[0], runs[1]):
        for a, b in zip(one, several):
            assert torch.equal(a, b)


# ---------------------------------------------------------------------------------
# torch.library.opcheck and torch.compile
# ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name,params", PARAM_CASES, ids=_ids(PARAM_CASES))
def test_opcheck(name, params, device):
    op = OPS[name]
    tensors = make_inputs(op, (6, 33), torch.float32, device, params=params == "params")
    forward_args = [None if t is None else t.clone().requires_grad_(True) for t in tensors]
    torch.library.opcheck(getattr(torch.ops.avo, name).default, tuple(forward_args))
    grads = [randn((6, 33), torch.float32, device) for _ in op.outputs]
    if op.saves:
        torch.library.opcheck(getattr(torch.ops.avo, name + "_forward").default, tuple(tensors))
    torch.library.opcheck(op.backward_op().default, op.backward_args(grads, tensors))


def _block(x, residual, w, b, w_rms):
    y = torch.ops.avo.layernorm(x, w, b)
    y = avo_ops.rmsnorm(y, w_rms)
    hidden, z = torch.ops.avo.add_rmsnorm(y, residual, w_rms)
    return torch.ops.avo.softmax(z) + hidden


def _reference_block(x, residual, w, b, w_rms):
    y = _rms(_ln(x, w, b), w_rms)
    hidden = y + residual
    return torch.softmax(_rms(hidden, w_rms), -1) + hidden


def test_torch_compile_fullgraph_forward_and_backward(device):
    torch._dynamo.reset()
    compiled = torch.compile(_block, fullgraph=True)
    shape = (16, 48)
    args = [randn(shape, torch.float32, device), randn(shape, torch.float32, device),
            randn((48,), torch.float32, device, offset=1.0, std=0.5), randn((48,), torch.float32, device),
            randn((48,), torch.float32, device, offset=1.0, std=0.5)]
    leaves = [a.clone().requires_grad_(True) for a in args]
    grad_out = randn(shape, torch.float32, device)
    out = compiled(*leaves)
    grads = torch.autograd.grad(out, leaves, grad_out)

    l64 = upcast(args, requires_grad=True)
    out64 = _reference_block(*l64)
    expected = torch.autograd.grad(out64, l64, grad_out.double())
    assert_matches_reference(out, out64, torch.float32, scale=_max(out64))
    # A chain of three normalizations: the terms grow with each rstd and weight.
    scale = _max(grad_out) * 50
    for a, e, leaf in zip(grads, expected, leaves):
        rows = shape[0] if leaf.dim() == 1 else 1
        assert_matches_reference(a, e, torch.float32, scale=scale * rows)
    # Same result as eager, bit for bit, in float32 (the compiled graph calls the same kernels).
    torch.testing.assert_close(out, _block(*args), rtol=0, atol=0)


# ---------------------------------------------------------------------------------
# Argument errors: each names the op and the argument
# ---------------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["op", "functional"])
@pytest.mark.parametrize("name", ALL)
def test_unsupported_dtype_is_rejected(name, api, device):
    op = OPS[name]
    call = op.op if api == "op" else op.functional
    tensors = make_inputs(op, (3, 8), torch.float32, device)
    bad = [tensors[0].double(), *tensors[1:]]
    supported = r"; supported dtypes are float32, float16 and bfloat16"
    with pytest.raises(TypeError, match=rf"avo::{name}: argument 'x' has dtype \w+{supported}"):
        call(*bad)
    with pytest.raises(TypeError, match=rf"avo::{name}: argument 'x' has dtype \w+{supported}"):
        call(torch.ones(3, 8, dtype=torch.int32, device=device), *tensors[1:])
    if op.params:  # a parameter of an unsupported dtype is named too
        bad = [t.double() if k == len(op.elems) else t for k, t in enumerate(tensors)]
        with pytest.raises(TypeError, match=rf"avo::{name}: argument 'weight' has dtype \w+{supported}"):
            call(*bad)


@pytest.mark.parametrize("name", ["layernorm", "add_rmsnorm"])
def test_unsupported_dtype_is_named_like_torch_names_it(name, device):
    # The message names the dtype as torch does (float64, int32), in eager mode as under
    # FakeTensorMode (whose check is in Python), so a traced program fails like an eager one.
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = OPS[name]
    for bad_dtype, text in [(torch.float64, "float64"), (torch.int32, "int32")]:
        expected = rf"avo::{name}: argument 'x' has dtype {text}; supported dtypes are float32, float16 and bfloat16"
        with FakeTensorMode():
            args = [torch.ones(3, 8, dtype=bad_dtype), *(torch.ones(3, 8) for _ in op.elems[1:])]
            with pytest.raises(TypeError, match=expected):
                op.op(*args)
        args = [torch.ones(3, 8, dtype=bad_dtype, device=device), *(torch.ones(3, 8, device=device)
                                                                   for _ in op.elems[1:])]
        with pytest.raises(TypeError, match=expected):
            op.op(*args)


@pytest.mark.parametrize("name", ALL)
def test_mixed_dtypes_are_rejected(name, device):
    op = OPS[name]
    tensors = make_inputs(op, (3, 8), torch.float32, device)
    if len(tensors) == 1:  # one tensor input: mix in the backward op's gradient
        read = op.backward_reads[0] if op.backward_reads else "x"  # softmax's backward reads y
        with pytest.raises(TypeError, match=rf"avo::{name}_backward: argument '{read}' has dtype float16 but "
                                            r"'grad_y' has dtype float32"):
            op.backward_op()(torch.randn(3, 8, device=device), *op.saved(tensors[0]), tensors[0].half())
        return
    last = len(tensors) - 1
    arg = op.elems[1] if len(op.elems) == 2 else op.params[-1]
    bad = [t.half() if k == (1 if len(op.elems) == 2 else last) else t for k, t in enumerate(tensors)]
    with pytest.raises(TypeError, match=rf"avo::{name}: argument '{arg}' has dtype float16 but 'x' has dtype "
                                        r"float32; all tensor arguments must share one dtype"):
        op.op(*bad)
    bad = [t.bfloat16() if k == len(op.elems) else t for k, t in enumerate(tensors)]
    with pytest.raises(TypeError, match=rf"avo::{name}: argument 'weight' has dtype bfloat16 but 'x' has dtype "
                                        r"float32"):
        op.functional(*bad)


@pytest.mark.parametrize("name", NORMS)
def test_wrong_parameter_shape_is_rejected(name, device):
    op = OPS[name]
    tensors = make_inputs(op, (3, 8), torch.float32, device)
    for k, pname in enumerate(op.params, start=len(op.elems)):
        for shape, text in [((7,), r"\[7\]"), ((1, 8), r"\[1, 8\]"), ((), r"\[\]")]:
            bad = list(tensors)
            bad[k] = torch.ones(shape, device=device)
            with pytest.raises(RuntimeError, match=rf"avo::{name}: argument '{pname}' must have shape \[8\] \(the "
                                                   rf"last dimension of 'x'\), got {text}"):
                op.op(*bad)


@pytest.mark.parametrize("name", ALL)
def test_zero_dim_input_is_rejected(name, device):
    op = OPS[name]
    tensors = [torch.tensor(1.0, device=device) for _ in op.elems]
    with pytest.raises(RuntimeError, match=rf"avo::{name}: argument 'x' must have at least one dimension"):
        op.op(*tensors)


@pytest.mark.parametrize("name", ["add_layernorm", "add_rmsnorm"])
def test_residual_shape_mismatch_is_rejected(name, device):
    op = OPS[name]
    x = torch.randn(3, 8, device=device)
    for shape, text in [((3, 7), r"\[3, 7\]"), ((1, 8), r"\[1, 8\]"), ((2, 3, 8), r"\[2, 3, 8\]")]:
        with pytest.raises(RuntimeError, match=rf"avo::{name}: argument 'residual' has shape {text} but 'x' has "
                                               r"shape \[3, 8\]; they must match"):
            op.op(x, torch.randn(shape, device=device))


@needs_cuda
def test_tensors_on_different_devices_are_rejected():
    with pytest.raises(RuntimeError, match=r"avo::layernorm: argument 'weight' is on cpu but 'x' is on cuda"):
        torch.ops.avo.layernorm(torch.randn(3, 8, device="cuda"), torch.randn(8))


def test_errors_under_fake_tensors_match_eager():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.randn(3, 8)
        with pytest.raises(RuntimeError, match=r"avo::layernorm: argument 'weight' must have shape \[8\] \(the "
                                               r"last dimension of 'x'\), got \[7\]"):
            torch.ops.avo.layernorm(x, torch.ones(7))
        with pytest.raises(TypeError, match=r"avo::rmsnorm: argument 'x' has dtype float64; supported dtypes"):
            torch.ops.avo.rmsnorm(x.double())
        with pytest.raises(RuntimeError, match=r"avo::add_rmsnorm: argument 'residual' has shape \[3, 7\] but 'x' "
                                               r"has shape \[3, 8\]; they must match"):
            torch.ops.avo.add_rmsnorm(x, torch.randn(3, 7))
        with pytest.raises(RuntimeError, match=r"avo::softmax: argument 'x' must have at least one dimension"):
            torch.ops.avo.softmax(torch.tensor(1.0))
        hidden, y = torch.ops.avo.add_layernorm(x, x, torch.ones(8), None)
        assert hidden.shape == y.shape == (3, 8)


@needs_cuda
def test_cuda_runs_on_the_current_stream():
    stream = torch.cuda.Stream()
    x = randn((4096, 1024), torch.float32, "cuda")
    with torch.cuda.stream(stream):
        y = torch.ops.avo.layernorm(x)
    stream.synchronize()
    assert_matches_reference(y, _ln(x.double(), None, None), torch.float32, scale=_max(y))

"""Every op under torch.func's transforms and forward-mode differentiation, against the
same transforms of float64 torch references: torch.func.jvp, jacfwd and
torch.autograd.forward_ad dual tensors (tangents); torch.func.grad, vjp, jacrev, hessian
and vmap of calls that record a graph (which run no C++ autograd node); double
backward (create_graph=True); the ops' vmap rules (one call for the whole batch). The
outputs' values stay the kernels'; the ops that have no forward-mode derivative
(<op>_backward, <op>_forward) raise naming themselves.

Tolerances: the tangents are computed in float32 from the inputs and the tangents as
given (16-bit ones converted exactly), then rounded to the op's dtype, so
conftest.TOLERANCES applies, with an absolute part of 64 fp32 eps times the largest
tangent for the entries that are differences of larger terms (a normalized tangent).
Runs on the CPU always and on CUDA when a device is present."""
from __future__ import annotations

import functools
import warnings

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F

import avo_ops
from conftest import TOLERANCES

FP32_EPS = torch.finfo(torch.float32).eps


def _ln(h, w=None, b=None, eps=1e-5):
    return F.layer_norm(h, (h.shape[-1],), w, b, eps)


def _rms(h, w=None, eps=1e-6):
    return F.rms_norm(h, (h.shape[-1],), w, eps)


def _stored(h, dtype):
    """The add ops' hidden as the kernels normalize it, rounded to the op's dtype; its
    tangent unrounded."""
    return h + (h.to(dtype).double() - h).detach()


def _add_ln(x, r, w, b, dtype):
    return x + r, _ln(_stored(x + r, dtype), w, b)


def _add_rms(x, r, w, dtype):
    return x + r, _rms(_stored(x + r, dtype), w)


def _channel(x, gamma, beta, swish):
    return F.group_norm(F.silu(x) if swish else x, x.shape[1], gamma, beta, 1e-5)


# id: (avo call, float64 reference, shapes of its tensor inputs for rows of 48)
CASES = {
    "gelu": (lambda x: avo_ops.gelu(x), F.gelu, [(5, 48)]),
    "gelu_tanh": (lambda x: avo_ops.gelu(x, "tanh"), lambda x: F.gelu(x, approximate="tanh"), [(5, 48)]),
    "silu": (avo_ops.silu, F.silu, [(2, 3, 48)]),
    "layernorm": (avo_ops.layernorm, _ln, [(5, 48)]),
    "layernorm_affine": (avo_ops.layernorm, _ln, [(5, 48), (48,), (48,)]),
    "rmsnorm": (avo_ops.rmsnorm, _rms, [(5, 48), (48,)]),
    "softmax": (avo_ops.softmax, lambda x: torch.softmax(x, -1), [(2, 3, 48)]),
    "log_softmax": (avo_ops.log_softmax, lambda x: torch.log_softmax(x, -1), [(5, 48)]),
    "swish_layernorm": (avo_ops.swish_layernorm, lambda x, w, b: _ln(F.silu(x), w, b), [(5, 48), (48,), (48,)]),
    "add_layernorm": (avo_ops.add_layernorm, _add_ln, [(5, 48), (5, 48), (48,), (48,)]),
    "add_rmsnorm": (avo_ops.add_rmsnorm, _add_rms, [(5, 48), (5, 48), (48,)]),
    "channel_norm": (avo_ops.channel_norm, lambda x, g, b: _channel(x, g, b, False), [(2, 3, 4, 5), (3,), (3,)]),
    "channel_norm_swish": (lambda x, g, b: avo_ops.channel_norm(x, g, b, swish=True),
                           lambda x, g, b: _channel(x, g, b, True), [(2, 3, 4, 5), (3,), (3,)]),
}


def _inputs(case, dtype, device, seed=0):
    generator = torch.Generator().manual_seed(seed)
    shapes = CASES[case][2]
    primals = [torch.randn(s, generator=generator, dtype=torch.float64) for s in shapes]
    tangents = [torch.randn(s, generator=generator, dtype=torch.float64) for s in shapes]
    to = dict(dtype=dtype, device=device)
    return [p.to(**to) for p in primals], [t.to(**to) for t in tangents]


def _as_tuple(value):
    return value if isinstance(value, tuple) else (value,)


def assert_tangents_match(actual, expected64, dtype):
    for a, e in zip(_as_tuple(actual), _as_tuple(expected64)):
        assert a.dtype == dtype and a.shape == e.shape
        tol = dict(TOLERANCES[dtype])
        tol["atol"] = max(tol["atol"], 64 * FP32_EPS * (e.abs().max().item() if e.numel() else 0.0))
        torch.testing.assert_close(a.double(), e, **tol)


def _reference(case, dtype):
    """The float64 reference of `case` for inputs of `dtype`."""
    reference = CASES[case][1]
    return functools.partial(reference, dtype=dtype) if case.startswith("add_") else reference


def _reference_jvp(case, primals, tangents):
    reference = _reference(case, primals[0].dtype)
    return torch.func.jvp(reference, tuple(p.double() for p in primals), tuple(t.double() for t in tangents))


@pytest.mark.parametrize("case", CASES)
def test_jvp_matches_float64_reference(case, device, dtype):
    primals, tangents = _inputs(case, dtype, device)
    outputs, output_tangents = torch.func.jvp(CASES[case][0], tuple(primals), tuple(tangents))
    _, expected = _reference_jvp(case, primals, tangents)
    assert_tangents_match(output_tangents, expected, dtype)
    # The values are the kernels', as without a tangent.
    for got, plain in zip(_as_tuple(outputs), _as_tuple(CASES[case][0](*primals))):
        torch.testing.assert_close(got, plain, rtol=0, atol=0)


@pytest.mark.parametrize("case", ["layernorm_affine", "add_rmsnorm", "channel_norm"])
def test_tangent_of_one_input_only(case, device):
    """Inputs without a tangent are constants: each input's tangent alone, the others none."""
    primals, tangents = _inputs(case, torch.float32, device, seed=1)
    for k in range(len(primals)):
        def with_only_k(value, k=k, call=CASES[case][0]):
            return call(*primals[:k], value, *primals[k + 1:])

        def reference_only_k(value, k=k, reference=_reference(case, torch.float32)):
            others = [p.double() for p in primals]
            return reference(*others[:k], value, *others[k + 1:])

        _, got = torch.func.jvp(with_only_k, (primals[k],), (tangents[k],))
        _, expected = torch.func.jvp(reference_only_k, (primals[k].double(),), (tangents[k].double(),))
        assert_tangents_match(got, expected, torch.float32)


@pytest.mark.parametrize("case", ["gelu", "layernorm_affine", "softmax", "add_layernorm"])
def test_dual_tensors_through_the_registered_op(case, device, dtype):
    """torch.autograd.forward_ad on torch.ops.avo.<op> directly (the functional API takes
    the same path through the dispatcher)."""
    primals, tangents = _inputs(case, dtype, device)
    op = getattr(torch.ops.avo, case.replace("_affine", ""))
    _, expected = _reference_jvp(case, primals, tangents)
    with fwAD.dual_level():
        outputs = op(*(fwAD.make_dual(p, t) for p, t in zip(primals, tangents)))
        got = tuple(fwAD.unpack_dual(o).tangent for o in _as_tuple(outputs))
    assert_tangents_match(got if len(got) > 1 else got[0], expected, dtype)


@pytest.mark.parametrize("case", ["silu", "log_softmax", "rmsnorm"])
def test_jacfwd_matches_float64_reference(case, device):
    primals, _ = _inputs(case, torch.float32, device)
    row = primals[0].reshape(-1, primals[0].shape[-1])[0]
    rest = primals[1:]
    jacobian = torch.func.jacfwd(lambda r: CASES[case][0](r, *rest))(row)
    expected = torch.func.jacfwd(lambda r: CASES[case][1](r, *(p.double() for p in rest)))(row.double())
    assert_tangents_match(jacobian, expected, torch.float32)


def test_second_order_forward_derivative(device):
    """jvp of jvp: the tangents' own computation is differentiable forward."""
    (x,), (t,) = _inputs("gelu", torch.float32, device)
    def derivative(f):
        return lambda a: torch.func.jvp(f, (a,), (t.to(a.dtype),))[1]

    got = torch.func.jvp(derivative(avo_ops.gelu), (x,), (t,))[1]
    expected = torch.func.jvp(derivative(F.gelu), (x.double(),), (t.double(),))[1]
    assert_tangents_match(got, expected, torch.float32)


def test_forward_and_reverse_mode_together(device):
    """A dual input that also requires grad: the output records a graph for backward, and
    the tangent itself can be differentiated backward. The reference is layer norm written
    out in float64 torch operations (torch's own layer_norm gives another gradient of its
    tangent here, which finite differences do not confirm)."""
    (x, w, b), (tx, tw, tb) = _inputs("layernorm_affine", torch.float32, device)
    x.requires_grad_()
    x64 = x.detach().double().requires_grad_()
    with fwAD.dual_level():
        y = avo_ops.layernorm(fwAD.make_dual(x, tx), w, b)
        primal, tangent = fwAD.unpack_dual(y)
        assert primal.grad_fn is not None
        (grad,) = torch.autograd.grad((primal * tangent).sum(), x)
    def layer_norm(a):
        centered = a - a.mean(-1, keepdim=True)
        return centered / torch.sqrt((centered * centered).mean(-1, keepdim=True) + 1e-5) * w.double() + b.double()

    _, tangent64 = torch.func.jvp(layer_norm, (x64,), (tx.double(),))
    (expected,) = torch.autograd.grad((layer_norm(x64) * tangent64).sum(), x64)
    assert_tangents_match(tangent, tangent64.detach(), torch.float32)
    torch.testing.assert_close(grad.double(), expected, rtol=1e-4, atol=1e-5)


def test_modules_are_differentiable_forward(device):
    module = avo_ops.nn.RMSNorm(48, eps=1e-6, device=device)
    with torch.no_grad():
        module.weight.normal_()
    (x,), (t,) = _inputs("silu", torch.float32, device)
    _, got = torch.func.jvp(module, (x,), (t,))
    _, expected = torch.func.jvp(lambda a: _rms(a, module.weight.detach().double()), (x.double(),), (t.double(),))
    assert_tangents_match(got, expected, torch.float32)


def test_backward_and_saving_forward_raise_naming_the_op(device):
    (x,), (t,) = _inputs("layernorm", torch.float32, device)
    with fwAD.dual_level():
        dual = fwAD.make_dual(x, t)
        with pytest.raises(RuntimeError, match=r"avo::gelu_backward has no forward-mode derivative"):
            torch.ops.avo.gelu_backward(dual, x)
        with pytest.raises(RuntimeError, match=r"avo::layernorm_forward has no forward-mode derivative"):
            torch.ops.avo.layernorm_forward(dual)


# ---------------------------------------------------------------------------------
# Reverse mode under torch.func: grad, vjp, jacrev, hessian, vmap.
# ---------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_vjp_matches_float64_reference(case, device, dtype):
    primals, _ = _inputs(case, dtype, device)
    outputs, pullback = torch.func.vjp(CASES[case][0], *primals)
    plain = CASES[case][0](*primals)
    generator = torch.Generator().manual_seed(2)
    cotangents = tuple(torch.randn(o.shape, generator=generator, dtype=torch.float64) for o in _as_tuple(plain))
    def unpacked(values):
        return values if isinstance(plain, tuple) else values[0]

    got = pullback(unpacked(tuple(c.to(dtype=dtype, device=device) for c in cotangents)))
    _, reference_pullback = torch.func.vjp(_reference(case, dtype), *(p.double() for p in primals))
    expected = reference_pullback(unpacked(tuple(c.to(dtype=dtype, device=device).double() for c in cotangents)))
    for g, e, p in zip(got, expected, primals):
        assert g.dtype == p.dtype and g.shape == p.shape
        tol = dict(TOLERANCES[dtype])
        # Parameter gradients sum over rows: 64 eps of the largest term times the rows.
        tol["atol"] = max(tol["atol"], 64 * FP32_EPS * e.abs().max().item() * (primals[0].numel() // p.numel()))
        torch.testing.assert_close(g.double(), e, **tol)
    # The values are the kernels', as without the transform.
    for got_value, plain_value in zip(_as_tuple(outputs), _as_tuple(plain)):
        torch.testing.assert_close(got_value, plain_value, rtol=0, atol=0)


def test_per_sample_gradients_with_vmap_of_grad(device):
    """vmap(grad(...)): a gradient of the weight for each sample of a batch."""
    (x, w, b), _ = _inputs("layernorm_affine", torch.float32, device)

    def loss(weight, sample, call):
        return (call(sample, weight, b) ** 2).sum()

    got = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, None))(w, x, avo_ops.layernorm)
    expected = torch.stack([torch.func.grad(loss)(w.double(), s.double(), lambda a, ww, bb: _ln(a, ww, bb.double()))
                            for s in x])
    assert got.shape == (x.shape[0], w.shape[0])
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["softmax", "rmsnorm", "channel_norm_swish"])
def test_jacrev_matches_float64_reference(case, device):
    primals, _ = _inputs(case, torch.float32, device)
    jacobian = torch.func.jacrev(lambda a: CASES[case][0](a, *primals[1:]))(primals[0])
    expected = torch.func.jacrev(lambda a: CASES[case][1](a, *(p.double() for p in primals[1:])))(primals[0].double())
    assert_tangents_match(jacobian, expected, torch.float32)


def test_hessian_matches_float64_reference(device):
    """jacfwd(jacrev(...)): second derivatives, through the math's graph."""
    x = torch.linspace(-3, 3, 24, device=device)
    got = torch.func.hessian(lambda a: avo_ops.swish_layernorm(a).pow(3).sum())(x)
    expected = torch.func.hessian(lambda a: _ln(F.silu(a)).pow(3).sum())(x.double())
    torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-4)


def test_vmap_of_a_module_that_records_a_graph(device):
    """vmap over a module whose parameters require grad, then backward: the call records a
    graph inside vmap (which runs no C++ autograd Function)."""
    module = avo_ops.nn.LayerNorm(48, device=device)
    with torch.no_grad():
        module.weight.normal_()
    (x,), (g,) = _inputs("layernorm", torch.float32, device)
    y = torch.func.vmap(module)(x.reshape(5, 1, 48)).reshape(5, 48)
    (y * g).sum().backward()
    w64 = module.weight.detach().double().requires_grad_()
    ((_ln(x.double(), w64, module.bias.detach().double()) * g.double()).sum()).backward()
    torch.testing.assert_close(module.weight.grad.double(), w64.grad, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------
# Double backward: create_graph=True through the ops.
# ---------------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES)
def test_double_backward_matches_float64_reference(case, device):
    """The gradient of a gradient penalty |dL/dx|^2 with respect to every input (the add_
    ops' from hidden, which their autograd keeps in place of x and residual)."""
    primals, weights = _inputs(case, torch.float32, device)

    def penalty_gradients(call, tensors):
        tensors = [t.clone().requires_grad_() for t in tensors]
        outputs = _as_tuple(call(*tensors))
        loss = sum((o * weights[0].to(o.dtype).reshape(o.shape)).sum() for o in outputs)
        (grad_x,) = torch.autograd.grad(loss, tensors[0], create_graph=True)
        gradients = torch.autograd.grad((grad_x * grad_x).sum(), tensors, allow_unused=True)
        # A bias does not reach dL/dx: no gradient (None) on both sides.
        return [torch.zeros_like(t) if g is None else g for g, t in zip(gradients, tensors)]

    got = penalty_gradients(CASES[case][0], primals)
    expected = penalty_gradients(_reference(case, torch.float32), [p.double() for p in primals])
    for g, e in zip(got, expected):
        torch.testing.assert_close(g.double(), e, rtol=1e-4, atol=1e-4 * max(1.0, e.abs().max().item()))


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_double_backward_from_y_in_bfloat16(op, device):
    """softmax's and log_softmax's autograd keeps y alone, and the double backward runs
    the backward's math (y * (dy - sum(dy * y)), dy - exp(y) * sum(dy)) from it: in
    bfloat16 the second-order gradient comes back in bfloat16 and matches float64 within
    bfloat16's rounding of x and y."""
    generator = torch.Generator().manual_seed(11)
    x64, w64 = (torch.randn(4, 48, generator=generator, dtype=torch.float64) for _ in range(2))

    def penalty_gradient(call, x):
        x = x.clone().requires_grad_()
        y = call(x)
        (grad_x,) = torch.autograd.grad((y * w64.to(device=y.device, dtype=y.dtype)).sum(), x, create_graph=True)
        (second,) = torch.autograd.grad((grad_x.float() * grad_x.float()).sum(), x)
        return second

    got = penalty_gradient(getattr(avo_ops, op), x64.to(device=device, dtype=torch.bfloat16))
    expected = penalty_gradient(lambda a: getattr(torch, op)(a, -1), x64.to(torch.bfloat16).double())
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double().cpu(), expected, rtol=3e-2, atol=3e-2 * expected.abs().max().item())


def test_hessian_vector_product_through_autograd(device):
    """torch.autograd.functional.hvp differentiates a gradient (create_graph=True)."""
    (x, w, b), (v, _, _) = _inputs("layernorm_affine", torch.float32, device)
    def loss(call):
        return lambda a: (call(a, w.to(a.dtype), b.to(a.dtype)) ** 3).sum()

    _, got = torch.autograd.functional.hvp(loss(avo_ops.layernorm), x, v)
    _, expected = torch.autograd.functional.hvp(loss(_ln), x.double(), v.double())
    torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-4 * expected.abs().max().item())


# ---------------------------------------------------------------------------------
# vmap: one call of the op for the whole batch (its rule), the same as a call per sample.
# ---------------------------------------------------------------------------------


def _per_sample(call, tensors, dims, size):
    outputs = [call(*(t if d is None else t.select(d, k) for t, d in zip(tensors, dims))) for k in range(size)]
    if isinstance(outputs[0], tuple):
        return tuple(torch.stack(o) for o in zip(*outputs))
    return torch.stack(outputs)


def _batched(tensors, dims, size, seed=3):
    """Each tensor with a batch of `size` inserted at its dim (None: left unbatched)."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for t, d in zip(tensors, dims):
        if d is None:
            out.append(t)
            continue
        batch = torch.randn((size,) + tuple(t.shape), generator=generator, dtype=torch.float64)
        out.append(batch.to(dtype=t.dtype, device=t.device).movedim(0, d))
    return out


def _assert_one_call_for_the_batch(call, tensors, dims, size):
    with warnings.catch_warnings():
        # torch's fallback (a call per sample) warns of its cost: the rule must not take it.
        warnings.filterwarnings("error", message=".*performance drop.*")
        got = torch.func.vmap(call, in_dims=tuple(dims))(*tensors)
    expected = _per_sample(call, tensors, dims, size)
    for g, e in zip(_as_tuple(got), _as_tuple(expected)):
        torch.testing.assert_close(g, e, rtol=0, atol=0)


@pytest.mark.parametrize("case", CASES)
def test_vmap_is_one_call_for_the_batch(case, device, dtype):
    """The per-element input batched along its second dimension, the rest unbatched: the
    values of a call per sample, bit for bit, without torch's fallback."""
    primals, _ = _inputs(case, dtype, device)
    dims = [1 if k == 0 else None for k in range(len(primals))]
    _assert_one_call_for_the_batch(CASES[case][0], _batched(primals, dims, 4), dims, 4)


@pytest.mark.parametrize("case,dims", [("add_layernorm", [None, 0, None, None]), ("add_rmsnorm", [2, 1, None]),
                                       ("layernorm_affine", [0, 0, None]), ("channel_norm", [3, None, 0]),
                                       ("rmsnorm", [None, 0])])
def test_vmap_of_other_batched_inputs(case, dims, device):
    """An unbatched x beside a batched residual, batch dimensions in other places, and a
    batched weight (a call per sample: the kernels take one weight for all rows)."""
    primals, _ = _inputs(case, torch.float32, device)
    _assert_one_call_for_the_batch(CASES[case][0], _batched(primals, dims, 3), dims, 3)


@pytest.mark.parametrize("call,shape,message", [
    (avo_ops.softmax, (5,), r"avo::softmax: argument 'x' must have at least one dimension"),
    (avo_ops.channel_norm, (5, 3), r"avo::channel_norm: argument 'x' must have at least two dimensions"),
])
def test_vmap_over_samples_too_small_for_the_op_raises_its_error(call, shape, message, device):
    """A 0-dim sample for a row op must fail as the op does, not have the batch read as its row."""
    with pytest.raises(RuntimeError, match=message):
        torch.func.vmap(call)(torch.randn(shape, device=device))

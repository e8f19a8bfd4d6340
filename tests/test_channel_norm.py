"""avo::channel_norm against float64 torch: statistics over the spatial dimensions of each
(batch, channel), a per-channel affine and an optional swish first. Tolerances as in
test_norms.py: conftest's per-dtype ones, plus an absolute part that scales with the
terms a gradient is summed from (16 fp32 eps each)."""
from __future__ import annotations

import pytest
import torch

import avo_ops
from conftest import ROW_VERSIONS, TOLERANCES, needs_cuda

FP32_EPS = torch.finfo(torch.float32).eps


def reference(x, gamma=None, beta=None, eps=1e-5, swish=False):
    """Float64: instance normalization of (swish of) x with a per-channel affine."""
    x = x.double()
    s = x * torch.sigmoid(x) if swish else x
    dims = tuple(range(2, x.dim()))
    mean = s.mean(dim=dims, keepdim=True) if dims else s
    var = ((s - mean) ** 2).mean(dim=dims, keepdim=True) if dims else torch.zeros_like(s)
    y = (s - mean) / torch.sqrt(var + eps)
    shape = (1, -1) + (1,) * (x.dim() - 2)
    if gamma is not None:
        y = y * gamma.double().view(shape)
    if beta is not None:
        y = y + beta.double().view(shape)
    return y


def close(actual, expected, dtype, scale=0.0, rtol=None, name="result"):
    """`scale`: the size of the terms the result is computed from; `rtol` replaces the
    dtype's; `name` says which result a failure is of."""
    tol = dict(TOLERANCES[dtype])
    tol["atol"] = max(tol["atol"], 16 * FP32_EPS * scale)
    if rtol is not None:
        tol["rtol"] = rtol
    torch.testing.assert_close(actual.double(), expected.double(), **tol, msg=lambda m: f"{name}: {m}")


SHAPES = [(2, 3, 5, 7), (4, 6, 10), (1, 2, 3, 4, 5), (3, 4, 1, 1), (0, 3, 4, 4), (2, 3)]


@pytest.mark.parametrize("swish", [False, True])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_values(shape, affine, swish, device, dtype):
    x = (torch.randn(shape, dtype=torch.float64) * 2 + 1).to(dtype=dtype, device=device)
    gamma = torch.randn(shape[1], device=device).to(dtype) if affine else None
    beta = torch.randn(shape[1], device=device).to(dtype) if affine else None
    y = torch.ops.avo.channel_norm(x, gamma, beta, swish=swish)
    assert y.shape == x.shape and y.dtype == dtype and y.is_contiguous()
    close(y, reference(x, gamma, beta, swish=swish), dtype)


def test_large_offset(device):
    x = (1000 + torch.randn(2, 3, 16, 16, dtype=torch.float64)).float().to(device)
    close(torch.ops.avo.channel_norm(x), reference(x), torch.float32, scale=1000)


@pytest.mark.parametrize("api", ["op", "functional"])
@pytest.mark.parametrize("swish", [False, True])
@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (3, 4, 9)], ids=str)
def test_gradients(shape, swish, api, device):
    x = torch.randn(shape, device=device, requires_grad=True)
    gamma = torch.randn(shape[1], device=device, requires_grad=True)
    beta = torch.randn(shape[1], device=device, requires_grad=True)
    grad_y = torch.randn(shape, device=device)
    call = torch.ops.avo.channel_norm if api == "op" else avo_ops.channel_norm
    got = torch.autograd.grad(call(x, gamma, beta, 1e-5, swish), (x, gamma, beta), grad_y)
    inputs64 = [t.detach().double().requires_grad_(True) for t in (x, gamma, beta)]
    want = torch.autograd.grad(reference(*inputs64, swish=swish), inputs64, grad_y.double())
    terms = grad_y.abs().max().item() * shape[0] * (x[0, 0].numel())
    for g, w in zip(got, want):
        close(g, w, torch.float32, scale=terms)


def test_non_contiguous_input_and_parameters(device):
    x = torch.randn(3, 8, 6, 5, device=device).transpose(2, 3)  # [3, 8, 5, 6], not dense
    gamma = torch.randn(16, device=device)[::2]
    close(torch.ops.avo.channel_norm(x, gamma, None, swish=True), reference(x, gamma, swish=True), torch.float32)


def test_parameter_gradients_are_deterministic(device):
    x = torch.randn(64, 32, 9, 9, device=device)
    gamma = torch.randn(32, device=device)
    grad_y = torch.randn_like(x)
    _, mu, rstd = torch.ops.avo.channel_norm_forward(x, gamma, gamma, 1e-5, True)
    first = torch.ops.avo.channel_norm_backward(grad_y, mu, rstd, x, gamma, gamma, 1e-5, True)
    second = torch.ops.avo.channel_norm_backward(grad_y, mu, rstd, x, gamma, gamma, 1e-5, True)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.parametrize("wanted", ["gamma", "beta"])
@pytest.mark.parametrize("shape", [(1100, 12, 4), (300, 5, 6), (0, 3, 4)], ids=str)
def test_parameter_gradients_sum_the_batch(shape, wanted, device, dtype):
    """The per-channel finish, for one parameter's gradient asked for alone: a batch of
    1100 (more rows than a finish thread loads at once) with 12 channels (four columns
    a GPU thread), a batch of 300 with 5 channels (one column a thread), and an empty
    batch (gradients of zeros)."""
    x = (torch.randn(shape, dtype=torch.float64) * 2 + 1).to(dtype=dtype, device=device)
    grad_y = torch.randn(shape, dtype=torch.float64).to(dtype=dtype, device=device)
    params = {name: torch.randn(shape[1], dtype=torch.float64).to(dtype=dtype, device=device) if name == wanted
              else None for name in ("gamma", "beta")}
    _, mu, rstd = torch.ops.avo.channel_norm_forward(x, params["gamma"], params["beta"], 1e-5, False)
    grads = torch.ops.avo.channel_norm_backward(grad_y, mu, rstd, x, params["gamma"], params["beta"], 1e-5, False)
    got = grads[1] if wanted == "gamma" else grads[2]
    missing = grads[2] if wanted == "gamma" else grads[1]
    assert got.shape == (shape[1],) and got.dtype == dtype and missing.numel() == 0
    inputs64 = {name: None if p is None else p.double().requires_grad_(True) for name, p in params.items()}
    (want,) = torch.autograd.grad(reference(x, inputs64["gamma"], inputs64["beta"]), inputs64[wanted],
                                  grad_y.double())
    terms = (grad_y.abs().max().item() if grad_y.numel() else 1.0) * shape[0] * shape[2]
    close(got, want, dtype, scale=terms)


@pytest.mark.parametrize("with_params", [True, False])
def test_opcheck(with_params, device):
    x = torch.randn(2, 3, 4, 5, device=device, requires_grad=True)
    gamma = torch.randn(3, device=device, requires_grad=True) if with_params else None
    beta = torch.randn(3, device=device, requires_grad=True) if with_params else None
    torch.library.opcheck(torch.ops.avo.channel_norm.default, (x, gamma, beta), {"swish": True})
    given = (x.detach(), gamma if gamma is None else gamma.detach(), None)
    torch.library.opcheck(torch.ops.avo.channel_norm_forward.default, (*given, 1e-5, False), {})
    _, mu, rstd = torch.ops.avo.channel_norm_forward(*given, 1e-5, False)
    grad_y = torch.randn(2, 3, 4, 5, device=device)
    torch.library.opcheck(torch.ops.avo.channel_norm_backward.default, (grad_y, mu, rstd, *given, 1e-5, False), {})


def test_torch_compile_fullgraph(device):
    torch._dynamo.reset()
    f = torch.compile(lambda x, g: torch.ops.avo.channel_norm(x, g, None, swish=True) * 2, fullgraph=True)
    x = torch.randn(2, 3, 6, 6, device=device, requires_grad=True)
    g = torch.randn(3, device=device, requires_grad=True)
    y = f(x, g)
    got = torch.autograd.grad(y.sum(), (x, g))
    x64, g64 = (t.detach().double().requires_grad_(True) for t in (x, g))
    y64 = reference(x64, g64, swish=True) * 2
    want = torch.autograd.grad(y64.sum(), (x64, g64))
    close(y, y64, torch.float32)
    for a, b in zip(got, want):
        close(a, b, torch.float32, scale=2 * 36 * 2)


def test_errors_name_the_op_and_argument(device):
    with pytest.raises(RuntimeError, match=r"avo::channel_norm: argument 'gamma' must have shape \[3\] \(the channels "
                                           r"of 'x'\), got \[4\]"):
        torch.ops.avo.channel_norm(torch.randn(2, 3, 4, device=device), torch.randn(4, device=device))
    with pytest.raises(RuntimeError, match=r"avo::channel_norm: argument 'x' must have at least two dimensions"):
        torch.ops.avo.channel_norm(torch.randn(5, device=device))
    with pytest.raises(TypeError, match=r"avo::channel_norm: argument 'x' has dtype float64"):
        torch.ops.avo.channel_norm(torch.randn(2, 3, 4, dtype=torch.float64, device=device))


# ---------------------------------------------------------------------------------
# Every CUDA kernel version (avo/row_cuda.cuh) on channel_norm's rows: one row per
# (batch, channel), as long as the spatial size. The lengths run from one vector to the
# cluster rows (65536, 262144: clusters of blocks share a row), which the spatial sizes
# of image models reach; 600 rows of 8 and of 1024 give the per-channel finish of the
# parameter gradients many rows a channel.
# ---------------------------------------------------------------------------------

VERSION_SHAPES = [(8, 75, 8), (4, 150, 32, 32), (2, 3, 128, 128), (1, 5, 256, 256), (1, 2, 512, 512)]


def check_values_and_gradients(x, gamma, beta, swish, offset=0.0):
    """Forward and the gradients of x, gamma and beta against float64. The absolute
    tolerances scale with the terms each result is computed from: the normalized
    values (plus beta, plus the error of a mean of values of size `offset`) for y;
    rstd * max|grad_y * gamma| * (2 + max|x_hat|), times swish's largest slope, for
    grad x; the rows' sums of grad_y * x_hat and of grad_y for gamma and beta."""
    dtype = x.dtype
    grad_y = torch.randn(x.shape, dtype=torch.float64).to(dtype=dtype, device=x.device)
    leaves = [t.detach().clone().requires_grad_(True) for t in (x, gamma, beta)]
    y = torch.ops.avo.channel_norm(*leaves, 1e-5, swish)
    got = torch.autograd.grad(y, leaves, grad_y)

    leaves64 = [t.detach().double().requires_grad_(True) for t in (x, gamma, beta)]
    y64 = reference(*leaves64, swish=swish)
    want = torch.autograd.grad(y64, leaves64, grad_y.double())

    x64 = x.double()
    s = x64 * torch.sigmoid(x64) if swish else x64
    dims = tuple(range(2, x.dim()))
    centered = s - s.mean(dim=dims, keepdim=True)
    rstd = 1.0 / torch.sqrt((centered * centered).mean(dim=dims, keepdim=True) + 1e-5)
    max_rstd = rstd.max().item()
    max_xhat = (centered * rstd).abs().max().item()
    max_gamma = gamma.double().abs().max().item()
    max_g = grad_y.double().abs().max().item()
    shift = offset * max_rstd  # the error of a mean of values of size `offset`, in units of x_hat
    slope = 1.1  # the largest slope of x * sigmoid(x), above 1 (kept without swish: a margin)
    per_channel = x[:, 0].numel()  # the terms each parameter gradient sums
    scales = {
        "y": y64.detach().abs().max().item() + beta.double().abs().max().item() + shift * max_gamma,
        "x": max_rstd * max_g * max_gamma * (2 + max_xhat) * slope * (1 + shift),
        "gamma": per_channel * max_g * (max_xhat + shift),
        "beta": per_channel * max_g,
    }
    # fp32 sums of 2^14 to 2^18 terms get rtol 1e-4, as in test_norms.py
    rtol = 1e-4 if dtype == torch.float32 and x[0, 0].numel() >= 16384 else None
    for name, actual, expected in (("y", y, y64), ("x", got[0], want[0]), ("gamma", got[1], want[1]),
                                   ("beta", got[2], want[2])):
        assert actual.dtype == dtype and actual.shape == expected.shape, name
        close(actual, expected.detach(), dtype, scale=scales[name], rtol=rtol, name=name)


def channel_inputs(shape, dtype, offset=0.0):
    x = (torch.randn(shape, dtype=torch.float64) + offset).to(dtype=dtype, device="cuda")
    gamma = (torch.randn(shape[1], dtype=torch.float64) * 0.5 + 1).to(dtype=dtype, device="cuda")
    beta = torch.randn(shape[1], dtype=torch.float64).to(dtype=dtype, device="cuda")
    return x, gamma, beta


@needs_cuda
@pytest.mark.parametrize("row_version", ROW_VERSIONS, indirect=True)
@pytest.mark.parametrize("swish", [False, True], ids=["plain", "swish"])
@pytest.mark.parametrize("shape", VERSION_SHAPES, ids=str)
def test_every_kernel_version_matches_float64(shape, swish, row_version, dtype):
    check_values_and_gradients(*channel_inputs(shape, dtype), swish)


# The 16-bit forwards without swish of 65536 and 262144 elements fit the cluster version
# (a cluster of blocks shares each row), which takes a row's moments in one pass where
# its mean lies within the one-pass bound and in two beyond: forced onto it, the calls
# take it (not a version they fall back to), and match float64 on both sides.
@needs_cuda
@pytest.mark.parametrize("row_version", ["cluster"], indirect=True)
@pytest.mark.parametrize("deviations", [0.0, 9.0], ids=["centred", "9sd"])
@pytest.mark.parametrize("shape", [(1, 5, 256, 256), (1, 2, 512, 512)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_long_16_bit_forwards_take_the_cluster_version(shape, dtype, deviations, row_version):
    x, gamma, beta = channel_inputs(shape, dtype, offset=deviations)
    torch.ops.avo.channel_norm(x, gamma, beta)
    assert avo_ops._C.last_row_version() == "cluster"
    check_values_and_gradients(x, gamma, beta, False, offset=deviations)


# The 16-bit cluster rows without swish take the variance from one pass's sum and sum of
# squares where a row's mean lies within about 8 standard deviations of zero
# (kOnePassMomentsBound), and make a second pass about the mean beyond: rows with their
# mean at 7 and at 9 standard deviations, one on each side of the bound, on every kernel
# version (with swish, which keeps its values, for the two passes).
@needs_cuda
@pytest.mark.parametrize("row_version", ROW_VERSIONS, indirect=True)
@pytest.mark.parametrize("deviations", [7.0, 9.0], ids=["7sd", "9sd"])
@pytest.mark.parametrize("swish", [False, True], ids=["plain", "swish"])
@pytest.mark.parametrize("shape", [(6, 1, 1000), (3, 2, 64, 64), (2, 3, 256, 256)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_offsets_beside_the_one_pass_bound(shape, dtype, swish, deviations, row_version):
    check_values_and_gradients(*channel_inputs(shape, dtype, offset=deviations), swish, offset=deviations)

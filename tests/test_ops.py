"""avo::gelu and avo::silu against float64 torch references: values, gradients,
layouts (strided, offset, broadcast), opcheck, torch.compile and argument errors.

Runs on the CPU always and on CUDA when a device is present."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import avo_ops
from conftest import DEVICES, TOLERANCES, needs_cuda


# (id, avo op call, float64 reference) -- the reference is plain torch.
def gelu_exact(x):
    return torch.ops.avo.gelu(x)


def gelu_tanh(x):
    return torch.ops.avo.gelu(x, approximate="tanh")


CASES = {
    "gelu": (gelu_exact, lambda x: F.gelu(x)),
    "gelu_tanh": (gelu_tanh, lambda x: F.gelu(x, approximate="tanh")),
    "silu": (torch.ops.avo.silu, F.silu),
}
FUNCTIONAL = {
    "gelu": lambda x: avo_ops.gelu(x),
    "gelu_tanh": lambda x: avo_ops.gelu(x, "tanh"),
    "silu": lambda x: avo_ops.silu(x),
}
SHAPES = [(), (0,), (3, 0, 2), (1,), (7,), (9,), (1000,), (33, 65), (4, 5, 6, 7), (2, 3, 1, 1, 5, 1, 2, 3, 1)]


def make_input(shape, dtype, device, requires_grad=False):
    # Values in [-6, 6] cover both tails and the curved middle of every activation.
    x = (torch.randn(shape, dtype=torch.float64) * 3).clamp(-6, 6)
    return x.to(dtype=dtype, device=device).requires_grad_(requires_grad)


def _scale(grad_y):
    return grad_y.abs().max().item() if grad_y.numel() else 0.0


FP32_EPS = torch.finfo(torch.float32).eps


def assert_matches_reference(actual, expected64, dtype, scale=0.0):
    """`scale`: the size of the terms a result is summed from. A gradient such as
    gelu's is a difference of terms near grad_y in size, so fp32 arithmetic leaves an
    absolute error of a few eps * |grad_y| even where the result itself is tiny."""
    assert actual.dtype == dtype
    tol = dict(TOLERANCES[dtype])
    tol["atol"] = max(tol["atol"], 16 * FP32_EPS * scale)
    torch.testing.assert_close(actual.double(), expected64.double(), **tol)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_matches_float64_reference(case, shape, device, dtype):
    x = make_input(shape, dtype, device)
    y = CASES[case][0](x)
    assert y.shape == x.shape and y.device == x.device and y.is_contiguous()
    assert_matches_reference(y, CASES[case][1](x.double()), dtype)


@pytest.mark.parametrize("case", CASES)
def test_functional_api_equals_registered_op(case, device, dtype):
    x = make_input((17, 31), dtype, device)
    torch.testing.assert_close(FUNCTIONAL[case](x), CASES[case][0](x), rtol=0, atol=0)


def _layouts(device, dtype):
    base = make_input((24, 40), dtype, device)
    big = make_input((64, 130), dtype, device)
    return {
        "transposed": base.t(),
        "sliced_step": big[:, ::3],
        "storage_offset": big.flatten()[1:1001],  # contiguous but not 16-byte aligned
        "offset_rows": big[1:, 2:],
        "broadcast": make_input((1, 40), dtype, device).expand(24, 40),
        "scalar_broadcast": make_input((), dtype, device).expand(5, 7),
        "many_dims": make_input((2,) * 10, dtype, device).permute(9, 0, 8, 1, 7, 2, 6, 3, 5, 4),
        "channels_last": make_input((2, 6, 5, 7), dtype, device).to(memory_format=torch.channels_last),
    }


@pytest.mark.parametrize("layout", ["transposed", "sliced_step", "storage_offset", "offset_rows", "broadcast",
                                    "scalar_broadcast", "many_dims", "channels_last"])
@pytest.mark.parametrize("case", CASES)
def test_non_contiguous_inputs(case, layout, device, dtype):
    x = _layouts(device, dtype)[layout]
    y = CASES[case][0](x)
    assert y.shape == x.shape and y.is_contiguous()
    assert_matches_reference(y, CASES[case][1](x.double()), dtype)


@pytest.mark.parametrize("case", CASES)
def test_large_input_split_across_threads(case, device, dtype):
    # Larger than one parallel chunk on the CPU and many blocks on the GPU (the 16-bit
    # kernels' inputs staged through shared memory, the fp32 ones' through registers), of
    # an odd length: the last block is partial and block 0 takes the elements past the
    # last 16-byte vector. The gradient too: its kernel reads two inputs.
    x = make_input((300_007,), dtype, device, requires_grad=True)
    grad_y = make_input((300_007,), dtype, device)
    y = CASES[case][0](x)
    (grad_x,) = torch.autograd.grad(y, x, grad_y)
    x64 = x.detach().double().requires_grad_(True)
    y64 = CASES[case][1](x64)
    (expected,) = torch.autograd.grad(y64, x64, grad_y.double())
    assert_matches_reference(y.detach(), y64.detach(), dtype)
    assert_matches_reference(grad_x, expected, dtype, scale=_scale(grad_y))


@pytest.mark.parametrize("case", CASES)
def test_special_values(case, device):
    # nan stays nan, +inf stays +inf, -inf gives nan (-inf times a vanishing factor, as
    # torch's formulas give on CUDA); finite extremes match the float64 reference.
    x = torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0, -0.0, 80.0, -80.0, 1e-30], device=device)
    y = CASES[case][0](x)
    assert y[0].item() == float("inf")
    assert torch.isnan(y[1]) and torch.isnan(y[2])
    torch.testing.assert_close(y[3:].double(), CASES[case][1](x[3:].double()), rtol=1e-6, atol=0)


def test_silu_float32_within_a_few_ulps(device):
    """float32 sigmoid (on the GPU a reciprocal refined by a Newton step, not a division)
    stays within a few ulps of float64 over its whole range: relative error where the
    result is a normal float, and where sigmoid(x) ~ e^x underflows to subnormals (x <
    -87) an error below the smallest normal float, not a flush to zero far from it."""
    x = torch.linspace(-100.0, 30.0, 1 << 20, dtype=torch.float32, device=device)
    y = torch.ops.avo.silu(x).double()
    expected = F.silu(x.double())
    normal = x > -80.0
    torch.testing.assert_close(y[normal], expected[normal], rtol=6 * FP32_EPS, atol=0)
    tiny = torch.finfo(torch.float32).tiny
    assert (y[~normal] - expected[~normal]).abs().max().item() < tiny
    assert (y[(x < -87.5) & (x > -95.0)] != 0).all()


@pytest.mark.parametrize("api", ["op", "functional"])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("shape", [(5,), (33, 65), (3, 0)], ids=str)
def test_gradient_matches_float64_autograd(case, api, shape, device, dtype):
    x = make_input(shape, dtype, device, requires_grad=True)
    grad_y = make_input(shape, dtype, device)
    call = CASES[case][0] if api == "op" else FUNCTIONAL[case]
    (grad_x,) = torch.autograd.grad(call(x), x, grad_y)

    x64 = x.detach().double().requires_grad_(True)
    (expected,) = torch.autograd.grad(CASES[case][1](x64), x64, grad_y.double())
    assert_matches_reference(grad_x, expected, dtype, scale=_scale(grad_y))


@pytest.mark.parametrize("op", sorted(avo_ops.OPS))
def test_autograd_kernel_is_the_generated_cpp_function(op):
    """Every op's Autograd kernel is registered from csrc/generated/autograd.cpp (C++, no
    Python on the call path)."""
    dump = torch._C._dispatch_dump(f"avo::{op}")
    autograd = [line for line in dump.splitlines() if line.startswith("Autograd")]
    assert len(autograd) == 1 and "csrc/generated/autograd.cpp" in autograd[0], dump


def test_graph_is_recorded_only_when_a_gradient_is_wanted(device):
    x = make_input((4, 33), torch.float32, device)
    assert torch.ops.avo.silu(x).grad_fn is None
    x.requires_grad_(True)
    y = torch.ops.avo.silu(x)
    assert y.requires_grad and y.grad_fn.name() == "AvoSiluBackward"
    with torch.no_grad():
        z = torch.ops.avo.silu(x)
    assert z.grad_fn is None and not z.requires_grad
    torch.testing.assert_close(z, y.detach(), rtol=0, atol=0)


def test_backward_op_itself_is_not_differentiable(device):
    """avo::silu_backward has no derivative of its own (a double backward through avo::silu
    takes its gradients from the math instead, tests/test_func_transforms.py): a call that
    would record a graph must fail loudly, not give zero second derivatives."""
    x = make_input((4, 33), torch.float32, device, requires_grad=True)
    grad_y = make_input((4, 33), torch.float32, device)
    with pytest.raises(RuntimeError, match=r"avo::silu_backward is not differentiable: differentiate avo::silu "
                                           r"itself \(its double backward takes the gradients from its math"):
        torch.ops.avo.silu_backward(grad_y, x)


@pytest.mark.parametrize("case", CASES)
def test_gradient_of_non_contiguous_input(case, device, dtype):
    x = make_input((40, 33), dtype, device).t().requires_grad_(True)
    grad_y = make_input((33, 40), dtype, device)[:, :].t().contiguous().t()  # a transposed gradient too
    (grad_x,) = torch.autograd.grad(CASES[case][0](x), x, grad_y.t().t())
    x64 = x.detach().double().requires_grad_(True)
    (expected,) = torch.autograd.grad(CASES[case][1](x64), x64, grad_y.double())
    assert grad_x.shape == x.shape
    assert_matches_reference(grad_x, expected, dtype, scale=_scale(grad_y))


def test_backward_op_broadcasts_its_arguments(device):
    grad_y = make_input((4, 5), torch.float32, device)
    x = make_input((5,), torch.float32, device)
    grad_x = torch.ops.avo.silu_backward(grad_y, x)
    x64 = x.double().expand(4, 5).clone().requires_grad_(True)
    (expected,) = torch.autograd.grad(F.silu(x64), x64, grad_y.double())
    assert grad_x.shape == (4, 5)
    assert_matches_reference(grad_x, expected, torch.float32, scale=_scale(grad_y))


def test_gradient_of_broadcast_input_is_reduced(device):
    # x of shape [5] used through an expanded view: autograd must give a [5] gradient.
    x = make_input((5,), torch.float64, device).float().requires_grad_(True)
    y = torch.ops.avo.gelu(x.expand(3, 5))
    (grad_x,) = torch.autograd.grad(y.sum(), x)
    x64 = x.detach().double().requires_grad_(True)
    (expected,) = torch.autograd.grad(F.gelu(x64.expand(3, 5)).sum(), x64)
    assert_matches_reference(grad_x, expected, torch.float32, scale=3.0)


def test_gradcheck_in_float32_against_finite_differences(device):
    # The kernels compute in fp32, so gradcheck (which wants float64) runs on a loose
    # tolerance here; the float64-reference tests above are the tight check.
    x = make_input((6,), torch.float32, device, requires_grad=True)
    for op in (gelu_exact, gelu_tanh, torch.ops.avo.silu):
        assert torch.autograd.gradcheck(op, (x,), eps=1e-2, atol=1e-2, rtol=1e-2, fast_mode=True)


# ---------------------------------------------------------------------------------
# torch.library.opcheck and torch.compile
# ---------------------------------------------------------------------------------

OPCHECK_CALLS = [
    ("gelu", lambda x, g: (torch.ops.avo.gelu.default, (x,), {})),
    ("gelu_tanh", lambda x, g: (torch.ops.avo.gelu.default, (x,), {"approximate": "tanh"})),
    ("gelu_backward", lambda x, g: (torch.ops.avo.gelu_backward.default, (g, x), {"approximate": "tanh"})),
    ("silu", lambda x, g: (torch.ops.avo.silu.default, (x,), {})),
    ("silu_backward", lambda x, g: (torch.ops.avo.silu_backward.default, (g, x), {})),
]


@pytest.mark.parametrize("name,build", OPCHECK_CALLS, ids=[c[0] for c in OPCHECK_CALLS])
@pytest.mark.parametrize("shape", [(8, 33), (0, 4)], ids=str)
def test_opcheck(name, build, shape, device, dtype):
    x = make_input(shape, dtype, device, requires_grad=not name.endswith("backward"))
    g = make_input(shape, dtype, device)
    op, args, kwargs = build(x, g)
    torch.library.opcheck(op, args, kwargs)


def _activations(x):
    return torch.ops.avo.silu(torch.ops.avo.gelu(x, approximate="tanh")) + avo_ops.gelu(x)


def _reference_activations(x):
    return F.silu(F.gelu(x, approximate="tanh")) + F.gelu(x)


@pytest.mark.parametrize("dynamic", [False, True])
def test_torch_compile_fullgraph_forward_and_backward(device, dynamic):
    torch._dynamo.reset()
    compiled = torch.compile(_activations, fullgraph=True, dynamic=dynamic)
    for shape in [(16, 24), (5, 7)]:
        x = make_input(shape, torch.float32, device, requires_grad=True)
        grad_y = make_input(shape, torch.float32, device)
        y = compiled(x)
        (grad_x,) = torch.autograd.grad(y, x, grad_y)
        x64 = x.detach().double().requires_grad_(True)
        y64 = _reference_activations(x64)
        (expected,) = torch.autograd.grad(y64, x64, grad_y.double())
        assert_matches_reference(y, y64, torch.float32)
        assert_matches_reference(grad_x, expected, torch.float32, scale=_scale(grad_y))


def test_compile_caches_are_keyed_by_the_ops_schemas():
    """Importing avo_ops adds a digest of its ops' schemas to torch's cache key tag, so that
    a graph compiled with a build whose ops took other arguments compiles again instead of
    being loaded from disk: the digest changes with the registered schemas, the tag is
    added once, and a tag of the user's stays."""
    from avo_ops._compile_cache import schemas_digest, tag_compile_caches

    digest = schemas_digest()
    assert f"avo_ops:{digest}" in torch.compiler.config.cache_key_tag.split()
    library = torch.library.Library("avo", "FRAGMENT")
    try:
        library.define("schema_digest_probe(Tensor x) -> Tensor")
        assert schemas_digest() != digest
    finally:
        library._destroy()
    assert schemas_digest() == digest
    with torch.compiler.config.patch(cache_key_tag="mine"):
        tag_compile_caches()
        tag_compile_caches()
        assert torch.compiler.config.cache_key_tag == f"mine avo_ops:{digest}"


# ---------------------------------------------------------------------------------
# Argument errors: each names the op and the argument
# ---------------------------------------------------------------------------------


def test_unsupported_dtype_is_rejected(device):
    for call in (lambda x: torch.ops.avo.gelu(x), lambda x: avo_ops.silu(x)):
        with pytest.raises(TypeError, match=r"avo::(gelu|silu): argument 'x' has dtype .*supported dtypes"):
            call(torch.randn(4, dtype=torch.float64, device=device))
        with pytest.raises(TypeError, match=r"argument 'x' has dtype"):
            call(torch.ones(4, dtype=torch.int32, device=device))


def test_mixed_dtypes_are_rejected(device):
    with pytest.raises(TypeError, match=r"avo::silu_backward: argument 'x' has dtype float16 but 'grad_y' has dtype float32"):
        torch.ops.avo.silu_backward(torch.randn(4, device=device), torch.randn(4, device=device).half())


def test_unknown_approximate_is_rejected(device):
    with pytest.raises(ValueError, match=r"avo::gelu: argument 'approximate' must be one of 'none', 'tanh', got 'fast'"):
        torch.ops.avo.gelu(torch.randn(4, device=device), approximate="fast")


def test_incompatible_shapes_are_rejected(device):
    with pytest.raises(RuntimeError, match=r"avo::gelu_backward: the shapes of 'grad_y' \[3\] and 'x' \[4\] do not broadcast"):
        torch.ops.avo.gelu_backward(torch.randn(3, device=device), torch.randn(4, device=device))


@needs_cuda
def test_tensors_on_different_devices_are_rejected():
    with pytest.raises(RuntimeError, match=r"avo::silu_backward: argument '\w+' is on .* but '\w+' is on"):
        torch.ops.avo.silu_backward(torch.randn(4, device="cuda"), torch.randn(4))


def test_errors_under_fake_tensors_match_eager():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.randn(4, dtype=torch.float64)
        with pytest.raises(TypeError, match=r"avo::gelu: argument 'x' has dtype float64"):
            torch.ops.avo.gelu(x)
        with pytest.raises(ValueError, match=r"argument 'approximate' must be one of"):
            torch.ops.avo.gelu(x.float(), approximate="fast")


@needs_cuda
def test_cuda_runs_on_the_current_stream():
    stream = torch.cuda.Stream()
    x = make_input((1 << 20,), torch.float32, "cuda")
    with torch.cuda.stream(stream):
        y = torch.ops.avo.silu(x)
    stream.synchronize()
    assert_matches_reference(y, F.silu(x.double()), torch.float32)


def test_built_extension_reports_cuda_consistently():
    # CUDA kernels are registered exactly when the extension says it has them, and a
    # machine with a GPU must have them.
    for op in ("avo::gelu", "avo::silu_backward"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op, "CUDA") == avo_ops.built_with_cuda()
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op, "CPU")
    if "cuda" in DEVICES:
        assert avo_ops.built_with_cuda()

"""The copies of the CPU kernels (avo/cpu_copies.h): AVX-512, AVX2 and the x86-64
baseline, where the build has them and the machine runs them. Every other test runs the
best copy the machine has against float64; here each other copy must give the same bits
as that one, forward and backward, with the optional parameters given or left out."""
from __future__ import annotations

import pytest
import torch

import avo_ops
from avo_ops import _C

COPIES = _C.cpu_copies()
BEST = COPIES[0]

# Row lengths: a vector of each instruction set and its remainders, the 64-element blocks
# of the CPU reductions and a tail, a long row.
SHAPES = [(64, 1000), (8, 37), (3, 4099), (2, 70001)]


def _weight(n, dtype):
    return torch.randn(n, dtype=dtype, requires_grad=True)


def _calls(shape, dtype):
    """name -> (function of the leaf tensors, leaf tensors)."""
    n = shape[-1]
    x = torch.randn(shape, dtype=dtype, requires_grad=True)
    res = torch.randn(shape, dtype=dtype, requires_grad=True)
    w, b = _weight(n, dtype), _weight(n, dtype)
    image = torch.randn((2, 3, shape[0], shape[1] // 2 + 1), dtype=dtype, requires_grad=True)
    gamma, beta = _weight(3, dtype), _weight(3, dtype)
    strided = torch.randn((shape[1], shape[0]), dtype=dtype).t().requires_grad_(True)
    return {
        "gelu": (lambda: avo_ops.gelu(x), [x]),
        "gelu_tanh": (lambda: avo_ops.gelu(x, "tanh"), [x]),
        "silu": (lambda: avo_ops.silu(x), [x]),
        "silu_strided": (lambda: avo_ops.silu(strided), [strided]),
        "softmax": (lambda: avo_ops.softmax(x), [x]),
        "log_softmax": (lambda: avo_ops.log_softmax(x), [x]),
        "layernorm": (lambda: avo_ops.layernorm(x, w, b), [x, w, b]),
        "layernorm_no_params": (lambda: avo_ops.layernorm(x), [x]),
        "layernorm_bias_only": (lambda: avo_ops.layernorm(x, None, b), [x, b]),
        "rmsnorm": (lambda: avo_ops.rmsnorm(x, w), [x, w]),
        "rmsnorm_no_weight": (lambda: avo_ops.rmsnorm(x), [x]),
        "swish_layernorm": (lambda: avo_ops.swish_layernorm(x, w, b), [x, w, b]),
        "swish_layernorm_weight_only": (lambda: avo_ops.swish_layernorm(x, w), [x, w]),
        "add_layernorm": (lambda: avo_ops.add_layernorm(x, res, w, b), [x, res, w, b]),
        "add_layernorm_no_params": (lambda: avo_ops.add_layernorm(x, res), [x, res]),
        "add_rmsnorm": (lambda: avo_ops.add_rmsnorm(x, res, w), [x, res, w]),
        "add_rmsnorm_no_weight": (lambda: avo_ops.add_rmsnorm(x, res), [x, res]),
        "channel_norm": (lambda: avo_ops.channel_norm(image, gamma, beta), [image, gamma, beta]),
        "channel_norm_swish": (lambda: avo_ops.channel_norm(image, None, beta, swish=True), [image, beta]),
    }


def _outputs_and_grads(copy, name, shape, dtype):
    """The op's outputs and its leaves' gradients, run on `copy`."""
    torch.manual_seed(0)
    call, leaves = _calls(shape, dtype)[name]
    _C.set_cpu_copy(copy)
    try:
        outputs = call()
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        torch.manual_seed(1)
        grads = [torch.randn_like(o) for o in outputs]
        torch.autograd.backward(outputs, grads)
        assert _C.last_cpu_copy() == copy
    finally:
        _C.set_cpu_copy("auto")
    return [o.detach() for o in outputs] + [leaf.grad for leaf in leaves]


def _bits(t):
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def test_the_best_copy_runs_by_default():
    assert _C.cpu_copy() == BEST
    assert COPIES[-1] == "baseline"
    assert set(COPIES) <= {"avx512", "avx2", "baseline"}


def test_set_cpu_copy_rejects_a_copy_it_cannot_run():
    with pytest.raises(ValueError, match="set_cpu_copy: 'avx1024' is not a copy of the CPU kernels"):
        _C.set_cpu_copy("avx1024")
    with pytest.raises(TypeError, match="set_cpu_copy: expected a str"):
        _C.set_cpu_copy(2)
    assert _C.cpu_copy() == BEST


@pytest.mark.parametrize("copy", COPIES)
def test_set_cpu_copy_selects_the_copy_that_runs(copy):
    _C.set_cpu_copy(copy)
    try:
        assert _C.cpu_copy() == copy
        avo_ops.silu(torch.randn(4, 5))
        assert _C.last_cpu_copy() == copy
    finally:
        _C.set_cpu_copy("auto")
    assert _C.cpu_copy() == BEST
    avo_ops.layernorm(torch.randn(4, 5))
    assert _C.last_cpu_copy() == BEST


@pytest.mark.skipif(len(COPIES) < 2, reason="this build or machine has one copy of the CPU kernels")
@pytest.mark.parametrize("copy", COPIES[1:])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("name", sorted(_calls((2, 4), torch.float32)))
def test_every_copy_gives_the_bits_of_the_best(name, dtype, copy):
    for shape in SHAPES:
        best = _outputs_and_grads(BEST, name, shape, dtype)
        other = _outputs_and_grads(copy, name, shape, dtype)
        assert len(best) == len(other)
        for i, (a, b) in enumerate(zip(best, other)):
            assert torch.equal(_bits(a), _bits(b)), f"{name} {shape}: tensor {i} differs between {BEST} and {copy}"


def _float16_with_specials(shape):
    """Standard-normal float16 values with NaNs of both signs and payloads, infinities,
    subnormal halves, the largest half and signed zeros among them."""
    x = torch.randn(shape).to(torch.float16)
    specials = torch.tensor([0x7E00, 0xFE00, 0x7D55, 0x7C00, 0xFC00, 0x0001, 0x83FF, 0x7BFF, 0x8000],
                            dtype=torch.int32).to(torch.int16).view(torch.float16)
    flat = x.view(-1)
    positions = torch.randperm(flat.numel())[: 4 * len(specials)]
    flat[positions] = specials.repeat(4)
    return x


@pytest.mark.skipif(len(COPIES) < 2, reason="this build or machine has one copy of the CPU kernels")
@pytest.mark.parametrize("copy", COPIES[1:])
@pytest.mark.parametrize("name", ["gelu", "silu", "softmax", "log_softmax", "layernorm", "add_rmsnorm"])
def test_float16_specials_give_the_bits_of_the_best(name, copy):
    """Float16 rows and elements that the best copy converts with F16C and the baseline in
    software (avo/cpu_copies.h): with NaNs, infinities, subnormal halves and the largest
    half among the inputs, every copy gives NaN in the same places and the same bits
    elsewhere. (Which NaN a result carries, its sign and payload, may differ: where both
    operands of an instruction are NaN, it passes one on, and each copy orders them as
    its compiler chose; the conversions themselves keep payloads alike,
    tests/test_cpu_math.py.)"""
    torch.manual_seed(0)
    x = _float16_with_specials((16, 1000))
    residual = torch.randn(16, 1000).to(torch.float16)
    calls = {
        "gelu": lambda: (avo_ops.gelu(x),),
        "silu": lambda: (avo_ops.silu(x),),
        "softmax": lambda: (avo_ops.softmax(x),),
        "log_softmax": lambda: (avo_ops.log_softmax(x),),
        "layernorm": lambda: (avo_ops.layernorm(x),),
        "add_rmsnorm": lambda: avo_ops.add_rmsnorm(x, residual),
    }
    results = {}
    for c in (BEST, copy):
        _C.set_cpu_copy(c)
        try:
            results[c] = calls[name]()
            assert _C.last_cpu_copy() == c
        finally:
            _C.set_cpu_copy("auto")
    for a, b in zip(results[BEST], results[copy]):
        assert a.isnan().any()  # the specials reached the outputs
        assert torch.equal(a.isnan(), b.isnan()), f"{name}: NaNs differ between {BEST} and {copy}"
        assert torch.equal(_bits(a)[~a.isnan()], _bits(b)[~b.isnan()]), f"{name}: differs between {BEST} and {copy}"

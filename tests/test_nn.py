"""avo_ops.nn: each module is a drop-in for its torch module (class, constructor
arguments, parameters, state_dict keys, extra_repr), computes what the torch module
computes in float64 (values and gradients), and falls back to torch, with one warning,
where the kernels do not cover a call.

The ops' own numerics are tested in test_ops.py / test_norms.py; here the tolerances
only need to tell a wrong wiring (a missing weight, a wrong eps, the wrong
approximation) from rounding: fp32 within 1e-4 relative, 16-bit types within a few of
their ulps, against float64 torch on the same rounded inputs and parameters.
"""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import avo_ops
from avo_ops import nn as avo_nn
from conftest import DEVICES, DTYPES

MODULE_TOLERANCES = {
    torch.float32: dict(rtol=1e-4, atol=1e-5),
    torch.float16: dict(rtol=4e-3, atol=2e-3),
    torch.bfloat16: dict(rtol=3e-2, atol=2e-2),
}

# (id, torch module factory, avo module factory, input shape): the same arguments to both.
PAIRS = [
    ("LayerNorm", lambda **f: nn.LayerNorm(64, eps=1e-3, **f), lambda **f: avo_nn.LayerNorm(64, eps=1e-3, **f)),
    ("LayerNorm-no-affine", lambda **f: nn.LayerNorm(64, elementwise_affine=False, **f),
     lambda **f: avo_nn.LayerNorm(64, elementwise_affine=False, **f)),
    ("LayerNorm-no-bias", lambda **f: nn.LayerNorm([64], bias=False, **f),
     lambda **f: avo_nn.LayerNorm([64], bias=False, **f)),
    ("RMSNorm-eps-None", lambda **f: nn.RMSNorm(64, **f), lambda **f: avo_nn.RMSNorm(64, **f)),
    ("RMSNorm-eps", lambda **f: nn.RMSNorm(64, eps=1e-2, **f), lambda **f: avo_nn.RMSNorm(64, eps=1e-2, **f)),
    ("GELU", lambda **f: nn.GELU(), lambda **f: avo_nn.GELU()),
    ("GELU-tanh", lambda **f: nn.GELU(approximate="tanh"), lambda **f: avo_nn.GELU(approximate="tanh")),
    ("SiLU", lambda **f: nn.SiLU(), lambda **f: avo_nn.SiLU()),
    ("Softmax-last", lambda **f: nn.Softmax(dim=-1), lambda **f: avo_nn.Softmax(dim=-1)),
    ("Softmax-2", lambda **f: nn.Softmax(dim=2), lambda **f: avo_nn.Softmax(dim=2)),
]
PAIR_IDS = [p[0] for p in PAIRS]
SHAPE = (3, 7, 64)


def _randomize(module: nn.Module) -> None:
    """Parameters away from their ones/zeros initialisation, so a dropped weight shows."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p, dtype=torch.float32) * 0.5 + 1.0)


@pytest.mark.parametrize("pair", PAIRS, ids=PAIR_IDS)
def test_drop_in_for_the_torch_module(pair):
    _, make_torch, make_avo = pair
    ours, theirs = make_avo(), make_torch()
    assert isinstance(ours, type(theirs))
    assert ours.extra_repr() == theirs.extra_repr()
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert [(n, p.shape) for n, p in ours.named_parameters()] == [(n, p.shape) for n, p in theirs.named_parameters()]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pair", PAIRS, ids=PAIR_IDS)
def test_values_and_gradients_match_float64_torch(pair, device, dtype):
    _, make_torch, make_avo = pair
    reference = make_torch(device=device, dtype=torch.float64) if "Norm" in pair[0] else make_torch()
    _randomize(reference)
    ours = make_avo(device=device, dtype=dtype) if "Norm" in pair[0] else make_avo()
    ours.load_state_dict(reference.state_dict())  # float64 -> dtype: the same rounded values below
    reference.load_state_dict(ours.state_dict())
    x = torch.randn(SHAPE, device=device).to(dtype).requires_grad_()
    x64 = x.detach().double().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a covered call must not fall back
        y = ours(x)
    y64 = reference(x64)
    assert y.dtype == dtype
    torch.testing.assert_close(y.double(), y64, **MODULE_TOLERANCES[dtype])
    grad = torch.randn_like(y64)
    y.backward(grad.to(dtype))
    y64.backward(grad)
    torch.testing.assert_close(x.grad.double(), x64.grad, **MODULE_TOLERANCES[dtype])
    for (name, p), p64 in zip(ours.named_parameters(), reference.parameters()):
        scale = p64.grad.abs().max().item() + 1.0
        torch.testing.assert_close(p.grad.double() / scale, p64.grad / scale, **MODULE_TOLERANCES[dtype], msg=name)


def test_the_modules_call_the_avo_ops():
    """The covered path is the kernel: the traced graph holds the avo op, not aten's."""
    x = torch.randn(4, 64)
    for module, op in [(avo_nn.LayerNorm(64), "avo.layernorm"), (avo_nn.RMSNorm(64), "avo.rmsnorm"),
                       (avo_nn.GELU(), "avo.gelu"), (avo_nn.SiLU(), "avo.silu"), (avo_nn.Softmax(-1), "avo.softmax"),
                       (avo_nn.SwishLayerNorm(64), "avo.swish_layernorm")]:
        graph = torch.fx.experimental.proxy_tensor.make_fx(module)(x).graph
        targets = {str(node.target) for node in graph.nodes if node.op == "call_function"}
        assert any(t.startswith(op) for t in targets), (module, targets)


@pytest.mark.parametrize("device", DEVICES)
def test_swish_layernorm_module(device):
    module = avo_nn.SwishLayerNorm(64, eps=1e-4, device=device)
    _randomize(module)
    assert [n for n, _ in module.named_parameters()] == ["weight", "bias"]
    assert module.extra_repr() == "(64,), eps=0.0001, elementwise_affine=True"
    x = torch.randn(5, 64, device=device, requires_grad=True)
    y = module(x)
    x64 = x.detach().double().requires_grad_()
    w64, b64 = (p.detach().double().requires_grad_() for p in (module.weight, module.bias))
    y64 = F.layer_norm(F.silu(x64), (64,), w64, b64, 1e-4)
    torch.testing.assert_close(y.double(), y64, **MODULE_TOLERANCES[torch.float32])
    y.sum().backward()
    y64.sum().backward()
    torch.testing.assert_close(module.weight.grad.double(), w64.grad, **MODULE_TOLERANCES[torch.float32])
    torch.testing.assert_close(x.grad.double(), x64.grad, **MODULE_TOLERANCES[torch.float32])
    assert avo_nn.SwishLayerNorm(8, elementwise_affine=False).weight is None
    assert avo_nn.SwishLayerNorm(8, bias=False).bias is None
    with pytest.raises(ValueError, match="SwishLayerNorm: normalized_shape must be one dimension"):
        avo_nn.SwishLayerNorm((4, 8))


@pytest.mark.parametrize("swish", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_channel_norm_module_is_group_norm_with_a_group_per_channel(device, swish):
    group_norm = nn.GroupNorm(6, 6, eps=1e-4, device=device, dtype=torch.float64)
    _randomize(group_norm)
    module = avo_nn.ChannelNorm(6, eps=1e-4, swish=swish, device=device)
    module.load_state_dict(group_norm.state_dict())
    assert list(module.state_dict()) == list(group_norm.state_dict())
    x = torch.randn(2, 6, 5, 7, device=device)
    y64 = group_norm(F.silu(x.double()) if swish else x.double())
    torch.testing.assert_close(module(x).double(), y64, **MODULE_TOLERANCES[torch.float32])
    with pytest.raises(ValueError, match=r"ChannelNorm: expected an input \[B, 6, \*spatial\]"):
        module(torch.randn(2, 5, 3, device=device))


# ----------------------------------------------------------------------------- fallbacks


def _fallback_warnings(module, x):
    """Calls `module` twice (on copies of `x`: SiLU(inplace=True) writes into it);
    returns the last result and the avo warnings of each call."""
    avo_nn._warned.clear()
    counts = []
    for _ in range(2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            y = module(x.clone())
        counts.append([str(w.message) for w in caught if "avo_ops.nn" in str(w.message)])
    return y, counts


def test_layernorm_over_two_dims_falls_back_with_one_warning():
    module = avo_nn.LayerNorm((4, 8))
    _randomize(module)
    x = torch.randn(3, 4, 8)
    y, (first, second) = _fallback_warnings(module, x)
    assert len(first) == 1 and "spans several dimensions" in first[0] and second == []
    torch.testing.assert_close(y, F.layer_norm(x, (4, 8), module.weight, module.bias))


@pytest.mark.parametrize("make, x, words", [
    (lambda: avo_nn.RMSNorm(8), torch.randn(2, 8, dtype=torch.float64), "dtype torch.float64"),
    (lambda: avo_nn.LayerNorm(8, dtype=torch.float32), torch.randn(2, 8).bfloat16(), "mixed dtypes"),
    (lambda: avo_nn.Softmax(dim=0), torch.randn(3, 8), "dim=0 is not the last dimension"),
    (lambda: avo_nn.Softmax(dim=None), torch.randn(3, 8), "dim=None"),
    (lambda: avo_nn.SiLU(inplace=True), torch.randn(3, 8), "inplace=True"),
    (lambda: avo_nn.GELU(), torch.randn(3, 8, dtype=torch.float64), "dtype torch.float64"),
], ids=["rmsnorm-float64", "layernorm-mixed", "softmax-dim0", "softmax-dimNone", "silu-inplace", "gelu-float64"])
def test_uncovered_calls_fall_back_to_torch(make, x, words):
    module = make()
    y, (first, second) = _fallback_warnings(module, x)
    assert len(first) == 1 and words in first[0], first
    assert second == []
    base = type(module).__mro__[2]  # the torch class the avo class subclasses
    assert base.__module__.startswith("torch.nn")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = base.forward(module, x.clone())
    torch.testing.assert_close(y, expected)


def test_shape_mismatch_raises_torch_error_without_a_warning():
    module = avo_nn.LayerNorm(8, elementwise_affine=False)  # no weight: the op alone would accept any N
    avo_nn._warned.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeError, match="normalized_shape"):
            module(torch.randn(2, 6))


def test_autocast_falls_back_to_torch_float32():
    module = avo_nn.LayerNorm(8).bfloat16()
    x = torch.randn(2, 8).bfloat16()
    avo_nn._warned.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = module(x)
        expected = F.layer_norm(x, (8,), module.weight, module.bias)
    assert any("autocast" in str(w.message) for w in caught)
    assert y.dtype == expected.dtype
    torch.testing.assert_close(y, expected)


def test_meta_device_construction_and_shapes():
    with torch.device("meta"):
        module = avo_nn.LayerNorm(32)
        y = module(torch.empty(4, 32))
    assert y.device.type == "meta" and y.shape == (4, 32)


def test_package_exports():
    assert avo_ops.nn is avo_nn
    assert set(avo_nn.__all__) == {"LayerNorm", "RMSNorm", "GELU", "SiLU", "Softmax", "SwishLayerNorm", "ChannelNorm"}

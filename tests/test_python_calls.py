"""The ops' Python entry points (avo_ops._C.<op>, csrc/python_calls.h) and the functional
API that calls them: the same results, gradients and errors as torch.ops.avo.<op>;
NotImplemented for every argument they leave to torch.ops (tensor subclasses, torch
function modes, values of other types), and torch.compile traces torch.ops.avo.<op>."""
from __future__ import annotations

import sys

import pytest
import torch
from torch.overrides import TorchFunctionMode

import avo_ops
from avo_ops import _C

N = 8  # the row length; channel_norm: 4 channels of N elements


def _tensor(shape, dtype, device, requires_grad=False):
    return torch.randn(shape, dtype=torch.float64).to(dtype=dtype, device=device).requires_grad_(requires_grad)


# Every op's arguments, all given in order (as the functional API passes them).
def _arguments(op, dtype=torch.float32, device="cpu", requires_grad=False):
    def t(*shape):
        return _tensor(shape, dtype, device, requires_grad)

    return {
        "gelu": lambda: (t(3, N), "tanh"),
        "silu": lambda: (t(3, N),),
        "layernorm": lambda: (t(3, N), t(N), t(N), 1e-5),
        "rmsnorm": lambda: (t(3, N), t(N), 1e-6),
        "softmax": lambda: (t(3, N),),
        "log_softmax": lambda: (t(3, N),),
        "swish_layernorm": lambda: (t(3, N), t(N), None, 1e-5),
        "add_layernorm": lambda: (t(3, N), t(3, N), t(N), t(N), 1e-5),
        "add_rmsnorm": lambda: (t(3, N), t(3, N), None, 1e-6),
        "channel_norm": lambda: (t(2, 4, N), t(4), t(4), 1e-5, True),
    }[op]()


def _as_tuple(out):
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def test_every_op_has_an_entry_point():
    assert sorted(avo_ops.OPS) == sorted(["gelu", "silu", "layernorm", "rmsnorm", "softmax", "log_softmax",
                                          "swish_layernorm", "add_layernorm", "add_rmsnorm", "channel_norm"])
    for op in avo_ops.OPS:
        assert callable(getattr(_C, op))


@pytest.mark.parametrize("op", sorted(avo_ops.OPS))
def test_entry_point_matches_the_registered_op(op, device, dtype):
    args = _arguments(op, dtype, device)
    actual = getattr(_C, op)(*args)
    assert actual is not NotImplemented
    expected = getattr(torch.ops.avo, op).default(*args)
    for a, e in zip(_as_tuple(actual), _as_tuple(expected), strict=True):
        assert a.dtype == e.dtype and a.shape == e.shape and a.device == e.device
        assert torch.equal(a, e)  # the same kernel ran


@pytest.mark.parametrize("op", sorted(avo_ops.OPS))
def test_entry_point_is_differentiable_like_the_registered_op(op, device):
    args = _arguments(op, torch.float32, device, requires_grad=True)
    leaves = [a for a in args if isinstance(a, torch.Tensor)]
    outputs = _as_tuple(getattr(_C, op)(*args))
    assert all(o.grad_fn is not None for o in outputs)
    grads_out = [torch.randn_like(o) for o in outputs]
    actual = torch.autograd.grad(outputs, leaves, grads_out)
    expected = torch.autograd.grad(_as_tuple(getattr(torch.ops.avo, op).default(*args)), leaves, grads_out)
    for a, e in zip(actual, expected, strict=True):
        assert torch.equal(a, e)


def test_functional_api_passes_every_argument_to_the_entry_point(monkeypatch):
    glue = sys.modules["avo_ops._generated.layernorm"]  # the package's `layernorm` is the function

    calls = []

    class Recorder:
        @staticmethod
        def layernorm(*args):
            calls.append(args)
            return "from the entry point"

    monkeypatch.setattr(glue, "_C", Recorder)
    x, w = torch.randn(2, N), torch.randn(N)
    assert avo_ops.layernorm(x, w) == "from the entry point"
    assert len(calls) == 1 and calls[0][0] is x and calls[0][1] is w and calls[0][2:] == (None, 1e-5)


def test_functional_api_falls_back_to_the_registered_op(monkeypatch):
    glue = sys.modules["avo_ops._generated.layernorm"]  # the package's `layernorm` is the function

    class Declines:
        @staticmethod
        def layernorm(*args):
            return NotImplemented

    monkeypatch.setattr(glue, "_C", Declines)
    x, w = torch.randn(2, N), torch.randn(N)
    assert torch.equal(avo_ops.layernorm(x, w), torch.ops.avo.layernorm(x, w))


class Marked(torch.Tensor):
    """A subclass with its own __torch_function__ (which here only counts the calls)."""

    calls = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.calls += 1
        return super().__torch_function__(func, types, args, kwargs or {})


class Recording(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.funcs = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.funcs.append(func)
        return func(*args, **(kwargs or {}))


def test_entry_point_declines_what_only_torch_ops_takes():
    x, w = torch.randn(2, N), torch.randn(N)
    assert _C.layernorm(x.as_subclass(Marked), w, None, 1e-5) is NotImplemented
    assert _C.layernorm(x, w.as_subclass(Marked), None, 1e-5) is NotImplemented
    assert _C.layernorm(x, w, None, 0) is NotImplemented  # an int eps: torch.ops converts it
    assert _C.layernorm(x.tolist(), w, None, 1e-5) is NotImplemented
    assert _C.layernorm(x, w, None) is NotImplemented  # an argument missing
    assert _C.channel_norm(x.view(1, 2, N), None, None, 1e-5, 1) is NotImplemented  # an int for a bool
    assert _C.gelu(x, None) is NotImplemented
    with Recording():
        assert _C.silu(x) is NotImplemented


def test_functional_api_handles_what_the_entry_point_declines():
    x, w = torch.randn(2, N), torch.randn(N)
    expected = torch.ops.avo.layernorm(x, w, None, 1e-5)
    Marked.calls = 0
    assert torch.equal(avo_ops.layernorm(x.as_subclass(Marked), w), expected)
    assert Marked.calls > 0  # torch.ops.avo.layernorm ran the subclass's __torch_function__
    assert torch.equal(avo_ops.layernorm(x, w, eps=1), torch.ops.avo.layernorm(x, w, None, 1.0))
    with Recording() as mode:
        y = avo_ops.layernorm(x, w)
    assert torch.equal(y, expected)
    assert mode.funcs == [torch.ops.avo.layernorm.default]
    with pytest.raises(RuntimeError, match="layernorm"):  # torch's error for a list where a Tensor goes
        avo_ops.layernorm(x.tolist(), w)


def test_entry_point_raises_the_ops_errors(device):
    with pytest.raises(TypeError, match="avo::silu: argument 'x' has dtype int32"):
        _C.silu(torch.zeros(3, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="avo::gelu: argument 'approximate' must be one of 'none', 'tanh'"):
        avo_ops.gelu(torch.zeros(3, device=device), "erf")
    with pytest.raises(RuntimeError, match="avo::layernorm: .*'weight'"):
        avo_ops.layernorm(torch.zeros(2, N, device=device), torch.zeros(N + 1, device=device))


def test_functional_api_under_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    with FakeTensorMode():
        hidden, y = avo_ops.add_rmsnorm(torch.empty(5, N), torch.empty(5, N), torch.empty(N))
    assert isinstance(y, FakeTensor) and y.shape == (5, N) and hidden.shape == (5, N)


def test_torch_compile_traces_the_registered_ops(device):
    torch._dynamo.reset()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def block(x, r, w):
        hidden, y = avo_ops.add_rmsnorm(x, r, w)
        return avo_ops.softmax(avo_ops.gelu(y, "tanh")) + avo_ops.silu(hidden)

    x, r, w = (_tensor(s, torch.float32, device) for s in ((4, N), (4, N), (N,)))
    out = torch.compile(block, fullgraph=True, backend=backend)(x, r, w)
    assert torch.equal(out, block(x, r, w))
    targets = {n.target for n in graphs[0].graph.nodes if n.op == "call_function"}
    assert {torch.ops.avo.add_rmsnorm.default, torch.ops.avo.softmax.default, torch.ops.avo.gelu.default,
            torch.ops.avo.silu.default} <= targets

"""Every feature of spec language v1, end to end: a test-only spec is generated, compiled
and loaded beside the package (namespace `avo_features`), then checked against a float64
torch reference. The shipped ops use only part of the language (gelu a string attribute,
silu nothing); this covers the rest: an optional input with its default, float, int and
bool attributes, two outputs, broadcasting between inputs, and a reduced gradient.

Compiling takes about a minute and a half on 2 cores (CPU kernels; CUDA kernels too when a GPU is
present), once per test session."""
from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from conftest import DEVICES, TOLERANCES
from generator.build import generate

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMESPACE = "avo_features"

BLEND_SPEC = """\
op: blend
doc: A test op that uses every feature of the spec language v1.
dtypes: [float32, float16, bfloat16]
inputs:
  a: {shape: [...]}
  b: {shape: [...], optional: true, default: 0.5}
attrs:
  weight: {type: float, default: 0.25}
  power: {type: int, default: 2}
  clamp: {type: bool, default: false}
  mode: {type: str, choices: [sum, diff], default: sum}
outputs:
  y: {shape: [...]}
  aux: {shape: [...]}
math:
  mixed: where(mode == "sum", a + weight * b, a - weight * b)
  y: where(clamp, min(max(mixed, -1), 1), mixed)
  aux: exp(-abs(a)) * b**2 + power * sigmoid(b) - log(1 + a * a) / sqrt(2 + b * b)
"""


def reference(a, b, weight=0.25, power=2, clamp=False, mode="sum"):
    """The blend math in float64 torch, written independently of the spec's IR."""
    a = a.double()
    b = torch.full_like(a, 0.5) if b is None else b.double()
    mixed = a + weight * b if mode == "sum" else a - weight * b
    out = torch.clamp(mixed, -1, 1) if clamp else mixed
    aux = torch.exp(-a.abs()) * b**2 + power * torch.sigmoid(b) - torch.log(1 + a * a) / torch.sqrt(2 + b * b)
    return out, aux


@pytest.fixture(scope="module")
def blend(tmp_path_factory):
    """torch.ops.avo_features.blend, built from BLEND_SPEC, and its generated Python module."""
    from torch.utils.cpp_extension import load

    root = tmp_path_factory.mktemp("features")
    (root / "specs").mkdir()
    (root / "specs" / "blend.yaml").write_text(BLEND_SPEC)
    generate(str(root), str(root / "specs"), check=False, namespace=NAMESPACE)
    generated = root / "csrc" / "generated"
    sources = [str(generated / f) for f in ("registration.cpp", "autograd.cpp", "blend_binding.cpp", "blend_cpu.cpp")]
    cuda = "cuda" in DEVICES
    flags = ["-O1"] + (["-DAVO_WITH_CUDA"] if cuda else [])
    if cuda:
        sources.append(str(generated / "blend.cu"))
    build_dir = root / "build"
    build_dir.mkdir()
    load(
        name="avo_features_blend",
        sources=sources,
        extra_include_paths=[os.path.join(REPO, "csrc", "include"), os.path.join(REPO, "csrc"), str(generated)],
        extra_cflags=flags,
        extra_cuda_cflags=["-O1", "-DAVO_WITH_CUDA"],
        build_directory=str(build_dir),
        is_python_module=False,
        verbose=False,
    )
    spec = importlib.util.spec_from_file_location("avo_features_blend_glue", root / "avo_ops" / "_generated" / "blend.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make(shape, dtype, device, requires_grad=False):
    t = (torch.randn(shape, dtype=torch.float64) * 1.5).to(dtype=dtype, device=device)
    return t.requires_grad_(requires_grad)


ATTRS = [
    {},
    {"weight": -1.5, "power": 3, "clamp": True, "mode": "diff"},
    {"weight": 0.75, "power": 0, "clamp": True, "mode": "sum"},
]


@pytest.mark.parametrize("attrs", ATTRS, ids=["defaults", "diff-clamp", "sum-clamp"])
@pytest.mark.parametrize("b_shape", [None, (33,), (17, 33)], ids=["b-missing", "b-broadcast", "b-full"])
def test_values(blend, attrs, b_shape, device, dtype):
    a = make((17, 33), dtype, device)
    b = None if b_shape is None else make(b_shape, dtype, device)
    out, aux = torch.ops.avo_features.blend(a, b, **attrs)
    expected_out, expected_aux = reference(a, b, **attrs)
    for actual, expected in ((out, expected_out), (aux, expected_aux)):
        assert actual.dtype == dtype and actual.shape == (17, 33)
        torch.testing.assert_close(actual.double(), expected, **TOLERANCES[dtype])


@pytest.mark.parametrize("attrs", ATTRS, ids=["defaults", "diff-clamp", "sum-clamp"])
@pytest.mark.parametrize("b_shape", [None, (33,), (17, 33)], ids=["b-missing", "b-broadcast", "b-full"])
def test_gradients_of_both_outputs(blend, attrs, b_shape, device):
    a = make((17, 33), torch.float32, device, requires_grad=True)
    b = None if b_shape is None else make(b_shape, torch.float32, device, requires_grad=True)
    grad_out, grad_aux = make((17, 33), torch.float32, device), make((17, 33), torch.float32, device)
    inputs = [a] if b is None else [a, b]
    out, aux = blend.blend(a, b, **attrs)
    actual = torch.autograd.grad((out, aux), inputs, (grad_out, grad_aux))

    inputs64 = [t.detach().double().requires_grad_(True) for t in inputs]
    out64, aux64 = reference(inputs64[0], None if b is None else inputs64[1], **attrs)
    expected = torch.autograd.grad((out64, aux64), inputs64, (grad_out.double(), grad_aux.double()))
    for got, want, like in zip(actual, expected, inputs):
        assert got.shape == like.shape  # a broadcast b gets its gradient summed back
        scale = 16 * torch.finfo(torch.float32).eps * 33 * 4  # summed over up to 17 rows of O(1) terms
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=scale)


@pytest.mark.parametrize("attrs", ATTRS, ids=["defaults", "diff-clamp", "sum-clamp"])
@pytest.mark.parametrize("b_shape", [None, (33,), (17, 33)], ids=["b-missing", "b-broadcast", "b-full"])
def test_tangents_of_both_outputs(blend, attrs, b_shape, device):
    """Forward mode (torch.func.jvp) through every function, a where() on a bool and on a
    string attribute, an int attribute and a broadcast optional input."""
    a, ta = make((17, 33), torch.float32, device), make((17, 33), torch.float32, device)
    primals, tangents = ([a], [ta]) if b_shape is None else ([a, make(b_shape, torch.float32, device)],
                                                            [ta, make(b_shape, torch.float32, device)])

    def call(module, *inputs):
        return module(*inputs, *([None] if len(inputs) == 1 else []), **attrs)

    outputs, got = torch.func.jvp(lambda *t: call(blend.blend, *t), tuple(primals), tuple(tangents))
    _, expected = torch.func.jvp(lambda *t: call(reference, *t), tuple(p.double() for p in primals),
                                 tuple(t.double() for t in tangents))
    for output, tangent, want in zip(outputs, got, expected):
        assert tangent.shape == output.shape == (17, 33)
        torch.testing.assert_close(tangent.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("b_shape", [None, (33,)], ids=["b-missing", "b-broadcast"])
def test_double_backward(blend, b_shape, device):
    """create_graph=True: the gradient of a gradient penalty, b broadcast and summed back."""
    attrs = {"weight": -1.5, "power": 3, "mode": "diff"}
    a = make((17, 33), torch.float32, device)
    b = None if b_shape is None else make(b_shape, torch.float32, device)

    def penalty_gradients(call, tensors):
        tensors = [t.clone().requires_grad_() for t in tensors]
        out, aux = call(tensors[0], tensors[1] if len(tensors) > 1 else None, **attrs)
        (grad_a,) = torch.autograd.grad((out * aux).sum(), tensors[0], create_graph=True)
        return torch.autograd.grad((grad_a * grad_a).sum(), tensors)

    inputs = [a] if b is None else [a, b]
    got = penalty_gradients(blend.blend, inputs)
    expected = penalty_gradients(reference, [t.double() for t in inputs])
    for g, e, like in zip(got, expected, inputs):
        assert g.shape == like.shape
        torch.testing.assert_close(g.double(), e, rtol=1e-4, atol=1e-4 * e.abs().max().item())


@pytest.mark.parametrize("a_dim,b_dim,b_shape", [(0, None, (33,)), (None, 1, (33,)), (1, 0, (17, 33)), (0, None, None)],
                         ids=["a-batched", "b-batched", "both", "b-missing"])
def test_vmap_is_one_call_for_the_batch(blend, a_dim, b_dim, b_shape, device):
    """The map rule lines the batch up against broadcast inputs of other ranks: the values
    of a call per sample, bit for bit."""
    a = make((17, 33), torch.float32, device)
    b = None if b_shape is None else make(b_shape, torch.float32, device)
    a = a if a_dim is None else torch.stack([a, a * 2, -a]).movedim(0, a_dim)
    if b_dim is not None:
        b = torch.stack([b, b + 1, b * 0.5]).movedim(0, b_dim)

    def call(x, y):
        return torch.ops.avo_features.blend(x, y, weight=0.75, mode="diff")

    got = torch.func.vmap(call, in_dims=(a_dim, b_dim))(a, b)
    samples = [call(a if a_dim is None else a.select(a_dim, k), b if b_dim is None else b.select(b_dim, k))
               for k in range(3)]
    for g, e in zip(got, zip(*samples)):
        torch.testing.assert_close(g, torch.stack(e), rtol=0, atol=0)


def test_defaults_are_the_schema_defaults(blend):
    schema = torch.ops.avo_features.blend.default._schema
    text = str(schema)
    assert "Tensor? b=None" in text and "float weight=0.25" in text and "int power=2" in text
    assert "bool clamp=False" in text and 'str mode="sum"' in text
    assert len(schema.returns) == 2


@pytest.mark.parametrize("b_given", [True, False])
def test_opcheck(blend, b_given, device):
    a = make((6, 5), torch.float32, device, requires_grad=True)
    b = make((5,), torch.float32, device, requires_grad=True) if b_given else None
    torch.library.opcheck(torch.ops.avo_features.blend.default, (a, b), {"weight": 0.5, "mode": "diff"})
    g = make((6, 5), torch.float32, device)
    torch.library.opcheck(torch.ops.avo_features.blend_backward.default, (g, g, a.detach(), None if b is None else b.detach()), {})


def test_bad_choice_names_the_argument(blend, device):
    with pytest.raises(ValueError, match=r"avo_features::blend: argument 'mode' must be one of 'sum', 'diff', got 'max'"):
        torch.ops.avo_features.blend(make((3,), torch.float32, device), None, mode="max")

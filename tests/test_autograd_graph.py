"""The node that a differentiable call of an op adds to the autograd graph (csrc/autograd_node.h,
one per op in csrc/generated/autograd.cpp): its name and edges, the tensors it keeps and frees,
and its backward under compiled autograd."""
from __future__ import annotations

import pytest
import torch
from torch._dynamo import compiled_autograd
from torch._dynamo.utils import counters

import avo_ops
from test_python_calls import _arguments, _as_tuple


def _node_name(op):
    return "Avo" + "".join(part.capitalize() for part in op.split("_")) + "Backward"


@pytest.mark.parametrize("op", sorted(avo_ops.OPS))
def test_node_is_named_after_the_op_and_has_an_edge_per_tensor_input(op, device):
    args = _arguments(op, torch.float32, device, requires_grad=True)
    outputs = _as_tuple(getattr(torch.ops.avo, op)(*args))
    node = outputs[0].grad_fn
    assert node.name() == _node_name(op)
    assert all(o.grad_fn is node for o in outputs)
    tensor_inputs = [a for a in args if a is None or isinstance(a, torch.Tensor)]  # None: a missing optional tensor
    assert len(node.next_functions) == len(tensor_inputs)
    for (edge, _), t in zip(node.next_functions, tensor_inputs):
        assert edge is None if t is None else edge.variable is t  # the leaf's AccumulateGrad


@pytest.mark.parametrize("op", ["silu", "softmax", "add_layernorm"])
def test_a_second_backward_without_a_retained_graph_raises(op, device):
    args = _arguments(op, torch.float32, device, requires_grad=True)
    leaves = [a for a in args if isinstance(a, torch.Tensor)]
    total = sum(o.sum() for o in _as_tuple(getattr(avo_ops, op)(*args)))
    torch.autograd.grad(total, leaves, retain_graph=False)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        torch.autograd.grad(total, leaves)


def test_saved_tensors_go_through_saved_tensor_hooks(device):
    """What the node keeps is packed and unpacked by torch.autograd.graph.saved_tensors_hooks."""
    x, weight, eps = _arguments("rmsnorm", torch.float32, device, requires_grad=True)
    packed, unpacked = [], []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or len(packed) - 1,
                                                  lambda k: unpacked.append(k) or packed[k]):
        y = avo_ops.rmsnorm(x, weight, eps)
    assert any(t is x for t in packed) and any(t is weight for t in packed)
    grad_y = torch.randn_like(y)
    actual = torch.autograd.grad(y, (x, weight), grad_y)
    assert sorted(unpacked) == list(range(len(packed)))
    expected = torch.autograd.grad(avo_ops.rmsnorm(x, weight, eps), (x, weight), grad_y)
    for a, e in zip(actual, expected, strict=True):
        assert torch.equal(a, e)


def _backward_compiled(outputs, grads):
    """.backward() of `outputs` under compiled autograd; how many graphs it captured."""
    torch._dynamo.reset()
    counters.clear()
    with compiled_autograd._enable(torch.compile(backend="eager")):
        torch.autograd.backward(outputs, grads)
    return counters["compiled_autograd"]["captures"]


@pytest.mark.parametrize("op", sorted(avo_ops.OPS))
def test_compiled_autograd_gives_the_eager_gradients(op, device):
    args = _arguments(op, torch.float32, device, requires_grad=True)
    leaves = [a for a in args if isinstance(a, torch.Tensor)]
    outputs = _as_tuple(getattr(avo_ops, op)(*args))
    grads = [torch.randn_like(o) for o in outputs]
    expected = torch.autograd.grad(outputs, leaves, grads, retain_graph=True)
    assert _backward_compiled(outputs, grads) == 1
    for leaf, e in zip(leaves, expected, strict=True):
        assert torch.equal(leaf.grad, e)  # the same kernels ran


@pytest.mark.parametrize("op", ["add_layernorm", "add_rmsnorm"])
def test_an_output_left_out_of_the_loss_has_zero_gradient(op, device):
    """y alone reaches the loss: hidden's gradient is missing, and the node takes it as zeros,
    in eager autograd and under compiled autograd."""
    args = _arguments(op, torch.float32, device, requires_grad=True)
    leaves = [a for a in args if isinstance(a, torch.Tensor)]
    hidden, y = getattr(avo_ops, op)(*args)
    grad_y = torch.randn_like(y)
    eager = torch.autograd.grad(y, leaves, grad_y, retain_graph=True)
    with_zeros = torch.autograd.grad((hidden, y), leaves, (torch.zeros_like(hidden), grad_y), retain_graph=True)
    assert _backward_compiled([y], [grad_y]) == 1
    for leaf, e, z in zip(leaves, eager, with_zeros, strict=True):
        assert torch.equal(e, z)
        assert torch.equal(leaf.grad, e)


def test_a_long_chain_of_nodes_is_freed_without_recursing_per_node():
    """Freeing a graph of 200000 nodes in a row, each the next one's input, does not take
    a stack frame per node (csrc/autograd_node.h: torch's way of releasing nodes)."""
    y = torch.randn(1, 4, requires_grad=True)
    for _ in range(200_000):
        y = avo_ops.silu(y)
    del y  # a crash here: the stack overflowed

"""Helpers the generated Python glue shares: fake (meta) implementations that check
arguments like the C++ binding does, and gradient reduction for broadcast inputs.

Nothing here computes an op's math; that lives in the kernels only.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

SUPPORTED_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def _dtype_name(dtype: torch.dtype) -> str:
    return SUPPORTED_DTYPES.get(dtype, str(dtype).replace("torch.", ""))


def check_choice(op: str, name: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        allowed = ", ".join(f"'{c}'" for c in choices)
        raise ValueError(f"{op}: argument '{name}' must be one of {allowed}, got '{value}'")


def map_fake(op: str, inputs: Mapping[str, torch.Tensor | None], num_outputs: int):
    """Outputs of an elementwise op: contiguous, in the inputs' broadcast shape.

    Checks the arguments as the binding layer does, so that a traced program fails
    where an eager one would."""
    present = [(name, t) for name, t in inputs.items() if t is not None]
    first_name, first = present[0]
    for name, t in present:
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(
                f"{op}: argument '{name}' has dtype {_dtype_name(t.dtype)}; "
                "supported dtypes are float32, float16 and bfloat16"
            )
        if t.dtype != first.dtype:
            raise TypeError(
                f"{op}: argument '{name}' has dtype {_dtype_name(t.dtype)} but '{first_name}' has dtype "
                f"{_dtype_name(first.dtype)}; all tensor arguments must share one dtype"
            )
        if t.device != first.device:
            raise RuntimeError(
                f"{op}: argument '{name}' is on {t.device} but '{first_name}' is on {first.device}; "
                "all tensor arguments must be on one device"
            )
    try:
        shape = torch.broadcast_shapes(*(t.shape for _, t in present))
    except RuntimeError:
        shapes = " and ".join(f"'{name}' {list(t.shape)}" for name, t in present)
        raise RuntimeError(f"{op}: the shapes of {shapes} do not broadcast together") from None
    outputs = tuple(first.new_empty(shape) for _ in range(num_outputs))
    return outputs[0] if num_outputs == 1 else outputs


def reduce_grad(grad: torch.Tensor, like: torch.Tensor | None) -> torch.Tensor | None:
    """The gradient of an input that was broadcast: summed back to the input's shape."""
    if like is None:
        return None
    if grad.shape != like.shape:
        grad = grad.sum_to_size(like.shape)
    return grad

"""Helpers the generated Python glue shares: fake (meta) implementations that check
arguments like the C++ binding does, vmap rules, and gradient reduction for broadcast
inputs.

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


def _check_same(op: str, present: list[tuple[str, torch.Tensor]]) -> None:
    """Every tensor argument has a supported dtype, and all share one dtype and device."""
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


def map_fake(op: str, inputs: Mapping[str, torch.Tensor | None], num_outputs: int):
    """Outputs of an elementwise op: contiguous, in the inputs' broadcast shape.

    Checks the arguments as the binding layer does, so that a traced program fails
    where an eager one would."""
    present = [(name, t) for name, t in inputs.items() if t is not None]
    _check_same(op, present)
    first = present[0][1]
    try:
        shape = torch.broadcast_shapes(*(t.shape for _, t in present))
    except RuntimeError:
        shapes = " and ".join(f"'{name}' {list(t.shape)}" for name, t in present)
        raise RuntimeError(f"{op}: the shapes of {shapes} do not broadcast together") from None
    outputs = tuple(first.new_empty(shape) for _ in range(num_outputs))
    return outputs[0] if num_outputs == 1 else outputs


def row_fake(op: str, inputs: Mapping[str, tuple[torch.Tensor | None, str]], outputs: Sequence[tuple[str, bool]],
             channels_first: bool = False):
    """Outputs of a row op (reductions over the last dimension N): per element like the
    first per-element input, per row without its last dimension, per column [N]; an
    output nobody asked for (the gradient of a missing input) is empty. A channel op
    ([B, C, *S]) has per-channel [C] tensors instead. Saved values (what <op>_forward
    returns for the backward) are float32, one per row: [B, C] in a channel op."""
    present = [(name, t) for name, (t, domain) in inputs.items() if t is not None and domain != "saved"]
    _check_same(op, present)
    ref_name, ref = next((name, t) for name, (t, domain) in inputs.items() if t is not None and domain == "elem")
    if ref.dim() < 1:
        raise RuntimeError(f"{op}: argument '{ref_name}' must have at least one dimension")
    if channels_first and ref.dim() < 2:
        raise RuntimeError(f"{op}: argument '{ref_name}' must have at least two dimensions (batch, channel, "
                           f"spatial...), got {list(ref.shape)}")
    length = ref.shape[-1]
    channels = ref.shape[1] if channels_first else 0
    rows = ref.shape[:2] if channels_first else ref.shape[:-1]
    for name, (t, domain) in inputs.items():
        if t is None:
            continue
        if domain == "elem" and t.shape != ref.shape:
            raise RuntimeError(f"{op}: argument '{name}' has shape {list(t.shape)} but '{ref_name}' has shape "
                               f"{list(ref.shape)}; they must match")
        if domain == "col" and (t.dim() != 1 or t.shape[0] != length):
            raise RuntimeError(f"{op}: argument '{name}' must have shape [{length}] (the last dimension of "
                               f"'{ref_name}'), got {list(t.shape)}")
        if domain == "chan" and (t.dim() != 1 or t.shape[0] != channels):
            raise RuntimeError(f"{op}: argument '{name}' must have shape [{channels}] (the channels of "
                               f"'{ref_name}'), got {list(t.shape)}")
        if domain == "row" and t.shape != ref.shape[:-1]:
            raise RuntimeError(f"{op}: argument '{name}' must have the shape of '{ref_name}' without its last "
                               f"dimension, got {list(t.shape)}")
        if domain == "saved":
            _check_saved(op, name, t, ref_name, ref, rows)
    shapes = {"elem": ref.shape, "row": ref.shape[:-1], "col": (length,), "chan": (channels,), "saved": rows}
    result = tuple(ref.new_empty(shapes[domain] if wanted else (0,), dtype=torch.float32 if domain == "saved" else None)
                   for domain, wanted in outputs)
    return result[0] if len(result) == 1 else result


def _check_saved(op: str, name: str, t: torch.Tensor, ref_name: str, ref: torch.Tensor, rows) -> None:
    """A saved value as <op>_forward returns it: float32, one per row of `ref`, on its device."""
    forward = op.replace("_backward", "_forward")
    if t.dtype != torch.float32 or t.shape != rows:
        raise RuntimeError(f"{op}: argument '{name}' must be a float32 tensor of shape {list(rows)} (one value "
                           f"per row of '{ref_name}', as {forward} returns it), got {_dtype_name(t.dtype)} "
                           f"{list(t.shape)}")
    if t.device != ref.device:
        raise RuntimeError(f"{op}: argument '{name}' is on {t.device} but '{ref_name}' is on {ref.device}; "
                           "all tensor arguments must be on one device")


def reduce_grad(grad: torch.Tensor, like: torch.Tensor | None) -> torch.Tensor | None:
    """The gradient of an input that was broadcast: summed back to the input's shape."""
    if like is None:
        return None
    if grad.shape != like.shape:
        grad = grad.sum_to_size(like.shape)
    return grad


def batched_call(op, info, in_dims: Sequence[int | None], inputs: Mapping[str, tuple[torch.Tensor | None, str]],
                 attrs: Sequence, layout: str):
    """The vmap rule of an op (torch.library.register_vmap): one call of `op` on the whole
    batch, as a leading dimension of its per-element (and per-row) tensors, instead of
    torch's fallback of one call per sample. `layout` is "map" (elementwise, broadcasting),
    "row" (rows over the last dimension: the batch is more rows) or "channel" ([B, C, *S]:
    the batch joins B). A batched parameter (a weight [N] or [C], one for every row of a
    call) has no such call: then one call per sample."""
    tensors = [t for t, _ in inputs.values()]
    domains = [domain for _, domain in inputs.values()]
    dims = tuple(in_dims) + (None,) * (len(tensors) - len(in_dims))  # the defaults the call left out
    size = info.batch_size
    # A sample too small for the op (a row op's 0-dim x) must fail as the op does on it, not
    # read the batch as its rows: one call per sample raises the op's own error.
    rank = max(t.dim() - (d is not None) for t, d, domain in zip(tensors, dims, domains)
               if t is not None and domain == "elem")
    too_small = layout != "map" and rank < (2 if layout == "channel" else 1)
    if too_small or any(d is not None and domain in ("col", "chan") for d, domain in zip(dims, domains)):
        samples = [op(*(t if d is None else t.select(d, k) for t, d in zip(tensors, dims)), *attrs) for k in range(size)]
        if isinstance(samples[0], tuple):
            return tuple(torch.stack(o) for o in zip(*samples)), (0,) * len(samples[0])
        return torch.stack(samples), 0
    args = []
    if layout == "map":  # batched tensors [size, 1..., shape]: right-aligned against every other
        for t, d in zip(tensors, dims):
            if t is not None and d is not None:
                t = t.movedim(d, 0)
                t = t.reshape((size,) + (1,) * (rank + 1 - t.dim()) + tuple(t.shape[1:]))
            args.append(t)
        result = op(*args, *attrs)
        return result, ((0,) * len(result) if isinstance(result, tuple) else 0)
    for t, d, domain in zip(tensors, dims, domains):
        if t is not None and domain in ("elem", "row"):  # per element or per row: the batch leads
            t = t.movedim(d, 0) if d is not None else t.expand((size,) + tuple(t.shape))
        args.append(t)
    sample_shape = next(a.shape[1:] for a, domain in zip(args, domains) if a is not None and domain == "elem")
    if layout == "channel":  # [size, B, C, *S] as [size * B, C, *S]
        args = [a.reshape((-1,) + tuple(a.shape[2:])) if a is not None and domain == "elem" else a
                for a, domain in zip(args, domains)]
    result = op(*args, *attrs)
    outputs = result if isinstance(result, tuple) else (result,)
    if layout == "channel":
        outputs = tuple(o.reshape((size,) + tuple(sample_shape)) for o in outputs)
    return (outputs, (0,) * len(outputs)) if isinstance(result, tuple) else (outputs[0], 0)

"""Drop-in modules backed by the avo ops.

Each module takes the constructor arguments, parameters, ``state_dict`` keys and
``extra_repr`` of the torch module it replaces (and subclasses it where torch has one),
so a checkpoint of one loads into the other::

    norm = avo_ops.nn.LayerNorm(1024)            # instead of torch.nn.LayerNorm(1024)
    norm.load_state_dict(torch_norm.state_dict())

A call the kernels do not cover runs the torch module's own computation instead, and
warns once per module class and reason: ``normalized_shape`` over several dimensions,
tensors of mixed dtypes (bf16 activations with fp32 weights), a dtype other than
float32/float16/bfloat16, a CUDA tensor on a CPU-only build, an enabled autocast
(torch computes norms and softmax in float32 there), an in-place SiLU, a softmax over
a dimension other than the last.

``avo_ops.patch(model)`` swaps these modules into a model that is already built.
"""
from __future__ import annotations

import warnings
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import _C
from . import _generated as _ops  # the functional API: its calls cost the least host time

__all__ = ["LayerNorm", "RMSNorm", "GELU", "SiLU", "Softmax", "SwishLayerNorm", "ChannelNorm"]

_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_CUDA_KERNELS = bool(_C.built_with_cuda())
_warned: set[tuple[str, str]] = set()


# A reason that sends the call to torch without a warning: torch raises the error.
_TORCH_RAISES = ""


def _norm_reason(normalized_shape: tuple[int, ...], x: Tensor, *params: Optional[Tensor]) -> Optional[str]:
    """Why a norm over `normalized_shape` with these parameters cannot run as a row op
    on `x`, or None when it can."""
    if len(normalized_shape) != 1:
        return f"normalized_shape {tuple(normalized_shape)} spans several dimensions"
    if x.dim() < 1 or x.shape[-1] != normalized_shape[0]:
        return _TORCH_RAISES
    return _uncovered(x, *params, autocast=True)


def _uncovered(x: Tensor, *params: Optional[Tensor], autocast: bool = False) -> Optional[str]:
    """Why the kernels cannot take this call, or None when they can. `autocast`: the
    module is one that autocast runs in float32 (norms, softmax)."""
    if x.dtype not in _KERNEL_DTYPES:
        return f"dtype {x.dtype} (the kernels take float32, float16 and bfloat16)"
    for p in params:
        if p is not None and p.dtype != x.dtype:
            return f"mixed dtypes (input {x.dtype}, parameter {p.dtype})"
    device = x.device.type
    if device == "cuda" and not _CUDA_KERNELS:
        return "a CUDA input, and this build of avo_ops has no CUDA kernels"
    if device not in ("cpu", "cuda", "meta"):
        return f"device {x.device} (the kernels run on cpu and cuda)"
    if autocast and device != "meta" and torch.is_autocast_enabled(device):
        return "autocast is enabled (torch computes this module in float32 there)"
    return None


class _AvoModule:
    """What every avo module shares: the fallback to torch's computation, with its
    one-time warning. When ``avo_ops.patch`` made the module, the fallback runs the
    module it replaced (kept, unregistered, in ``_avo_original``), so even an uncovered
    call computes exactly what the model did before."""

    def _fallback(self, reason: str, x: Tensor, torch_forward) -> Tensor:
        if reason and not torch.compiler.is_compiling():
            key = (type(self).__name__, reason)
            if key not in _warned:
                _warned.add(key)
                warnings.warn(f"avo_ops.nn.{type(self).__name__}: {reason}; this call runs the torch "
                              "implementation (warned once)", stacklevel=3)
        original = self.__dict__.get("_avo_original")
        if original is None:
            return torch_forward(x)
        share_parameters(self, original)
        return original(x)


def share_parameters(source: nn.Module, target: nn.Module) -> None:
    """Point `target`'s parameters and buffers at `source`'s current ones (same names)."""
    for name, value in source._parameters.items():
        if name in target._parameters:
            target._parameters[name] = value
    for name, value in source._buffers.items():
        if name in target._buffers:
            target._buffers[name] = value


class LayerNorm(_AvoModule, nn.LayerNorm):
    """torch.nn.LayerNorm over the last dimension, by ``avo::layernorm``."""

    def forward(self, x: Tensor) -> Tensor:
        reason = _norm_reason(self.normalized_shape, x, self.weight, self.bias)
        if reason is None:
            return _ops.layernorm(x, self.weight, self.bias, self.eps)
        return self._fallback(reason, x, super().forward)


class RMSNorm(_AvoModule, nn.RMSNorm):
    """torch.nn.RMSNorm over the last dimension, by ``avo::rmsnorm``. As in torch,
    ``eps=None`` means the machine epsilon of the input's dtype."""

    def forward(self, x: Tensor) -> Tensor:
        reason = _norm_reason(self.normalized_shape, x, self.weight)
        if reason is None:
            eps = torch.finfo(x.dtype).eps if self.eps is None else self.eps
            return _ops.rmsnorm(x, self.weight, eps)
        return self._fallback(reason, x, super().forward)


class GELU(_AvoModule, nn.GELU):
    """torch.nn.GELU (``approximate="none"`` or ``"tanh"``), by ``avo::gelu``."""

    def forward(self, x: Tensor) -> Tensor:
        reason = _uncovered(x)
        if reason is None:
            return _ops.gelu(x, self.approximate)
        return self._fallback(reason, x, super().forward)


class SiLU(_AvoModule, nn.SiLU):
    """torch.nn.SiLU, by ``avo::silu``. ``inplace=True`` runs torch's in-place kernel."""

    def forward(self, x: Tensor) -> Tensor:
        reason = "inplace=True (the kernel writes a new tensor)" if self.inplace else _uncovered(x)
        if reason is None:
            return _ops.silu(x)
        return self._fallback(reason, x, super().forward)


class Softmax(_AvoModule, nn.Softmax):
    """torch.nn.Softmax over the last dimension, by ``avo::softmax``."""

    def forward(self, x: Tensor) -> Tensor:
        if self.dim is None:
            reason = "dim=None (torch picks the dimension from the input's rank)"
        elif x.dim() == 0 or self.dim not in (-1, x.dim() - 1):
            reason = f"dim={self.dim} is not the last dimension of a {x.dim()}-d input"
        else:
            reason = _uncovered(x, autocast=True)
        if reason is None:
            return _ops.softmax(x)
        return self._fallback(reason, x, super().forward)


class SwishLayerNorm(_AvoModule, nn.Module):
    """LayerNorm of SiLU(x) over the last dimension, fused (``avo::swish_layernorm``).
    Constructor arguments, parameters and ``state_dict`` keys as torch.nn.LayerNorm
    over one dimension."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
                 device=None, dtype=None) -> None:
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        if len(shape) != 1:
            raise ValueError(f"avo_ops.nn.SwishLayerNorm: normalized_shape must be one dimension, got {shape}")
        self.normalized_shape = shape
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(shape, **factory)) if elementwise_affine else None
        self.bias = nn.Parameter(torch.empty(shape, **factory)) if elementwise_affine and bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def _torch_forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(F.silu(x), self.normalized_shape, self.weight, self.bias, self.eps)

    def forward(self, x: Tensor) -> Tensor:
        reason = _norm_reason(self.normalized_shape, x, self.weight, self.bias)
        if reason is None:
            return _ops.swish_layernorm(x, self.weight, self.bias, self.eps)
        return self._fallback(reason, x, self._torch_forward)

    def extra_repr(self) -> str:
        return "{normalized_shape}, eps={eps}, elementwise_affine={elementwise_affine}".format(**self.__dict__)


class ChannelNorm(_AvoModule, nn.Module):
    """Normalization of each (batch, channel) of ``x [B, C, *spatial]`` over its spatial
    dimensions, with a per-channel affine and an optional swish first, by
    ``avo::channel_norm``. Without swish it computes torch.nn.GroupNorm(C, C) and takes
    its parameters and ``state_dict`` keys (``weight``, ``bias``)."""

    def __init__(self, num_channels: int, eps: float = 1e-5, affine: bool = True, swish: bool = False,
                 device=None, dtype=None) -> None:
        super().__init__()
        self.num_channels = num_channels
        self.eps = eps
        self.affine = affine
        self.swish = swish
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(num_channels, **factory)) if affine else None
        self.bias = nn.Parameter(torch.empty(num_channels, **factory)) if affine else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.affine:
            nn.init.ones_(self.weight)
            nn.init.zeros_(self.bias)

    def _torch_forward(self, x: Tensor) -> Tensor:
        s = F.silu(x) if self.swish else x
        return F.group_norm(s, self.num_channels, self.weight, self.bias, self.eps)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() < 2 or x.shape[1] != self.num_channels:
            raise ValueError(f"avo_ops.nn.ChannelNorm: expected an input [B, {self.num_channels}, *spatial], "
                             f"got {list(x.shape)}")
        reason = _uncovered(x, self.weight, self.bias, autocast=True)
        if reason is None:
            return _ops.channel_norm(x, self.weight, self.bias, self.eps, self.swish)
        return self._fallback(reason, x, self._torch_forward)

    def extra_repr(self) -> str:
        return f"{self.num_channels}, eps={self.eps}, affine={self.affine}, swish={self.swish}"

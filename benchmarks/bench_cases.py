"""What bench_ops.py measures: one Case per op and direction.

Each Case holds the avo call, the torch eager reference with the same signature, the
builder of its inputs and its minimal memory traffic:

    avo      torch.ops.avo.<op> ("fwd") or torch.ops.avo.<op>_backward ("bwd")
    eager    "fwd": the torch call avo replaces (F.gelu, F.layer_norm, torch.softmax, ...);
             "bwd": the aten backward kernels torch's autograd runs (aten.gelu_backward,
             native_layer_norm_backward, _softmax_backward_data, ...), fed what its
             forward would have saved (mean/rstd, the softmax output, silu(x), x + residual),
             computed once by make_inputs, outside the timing

The torch.compile baseline compiles `eager`; the Liger baseline is in liger_baselines.py.

Minimal traffic (Traffic) counts each input of the avo call read once and each of its
outputs written once: `full` tensors shaped like x and `param` vectors (weight, bias and
their gradients; length N, the row length, or C for channel_norm). Saved statistics that
only the eager backward reads are not counted: they are its extra traffic.

Row ops normalize over the last dimension N. channel_norm normalizes x [B, C, S] over S for
each (batch, channel), with per-channel parameters: a row op with rows of length S, laid
out as B x C rows.

Adding an op: append its Cases to CASES (the gelu/silu and row-op entries below show how).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F

Tensor = torch.Tensor
Shape = tuple[int, ...]

LN_EPS = 1e-5
RMS_EPS = 1e-6
CHANNELS = 64  # channel_norm's C when the plan gives an R x N shape (see channel_layout)


@dataclass(frozen=True)
class Traffic:
    """Minimal traffic of one call, counted in tensors of the input dtype."""

    full_read: int
    full_written: int
    param_read: int = 0
    param_written: int = 0

    def nbytes(self, numel: int, param_len: int, itemsize: int) -> int:
        full = (self.full_read + self.full_written) * numel
        params = (self.param_read + self.param_written) * param_len
        return itemsize * (full + params)


def same_shape(shape: Shape) -> Shape:
    return shape


def channel_layout(shape: Shape) -> Shape:
    """channel_norm's [B, C, S] for an R x N plan: S = N and B * C = R, with C = 64 when 64
    divides R (else the largest power of two that does). Shapes of 3+ dims stay as given."""
    if len(shape) != 2:
        return shape
    rows, n = shape
    channels = math.gcd(rows, CHANNELS)
    return (rows // channels, channels, n)


@dataclass(frozen=True)
class Case:
    """One benchmarked operation (an op in one direction).

    make_inputs(shape, dtype, device) -> input tensors; ends with the tensors only the eager
                                         reference reads (saved statistics), if any
    avo(*inputs) / eager(*inputs)      -> output tensor(s), in the same order
    layout(shape)                      -> the input shape for a planned R x N shape
    param_dim                          -> the dimension the parameter vectors run along
    """

    op: str
    direction: str  # "fwd" or "bwd"
    make_inputs: Callable[[Shape, torch.dtype, torch.device], tuple[Tensor, ...]]
    avo: Callable[..., object]
    eager: Callable[..., object]
    traffic: Traffic
    layout: Callable[[Shape], Shape] = same_shape
    param_dim: int = -1

    @property
    def label(self) -> str:
        return f"{self.op}.{self.direction}"

    def nbytes(self, shape: Shape, dtype: torch.dtype) -> int:
        """Minimal bytes moved by one call on an input of this shape (after layout)."""
        itemsize = torch.finfo(dtype).bits // 8
        return self.traffic.nbytes(math.prod(shape), shape[self.param_dim], itemsize)


def randn_inputs(full: int, params: int = 0, extra: Optional[Callable] = None, param_dim: int = -1):
    """Builder of `full` standard-normal tensors of the requested shape, then `params`
    standard-normal vectors of length shape[param_dim], same dtype; `extra(*tensors)` may
    append precomputed tensors (what the eager backward reads)."""

    def make(shape: Shape, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, ...]:
        ts = [torch.randn(shape, dtype=dtype, device=device) for _ in range(full)]
        ts += [torch.randn(shape[param_dim], dtype=dtype, device=device) for _ in range(params)]
        return tuple(ts) + (tuple(extra(*ts)) if extra is not None else ())

    return make


def last_dim(x: Tensor) -> list[int]:
    return [x.shape[-1]]


# --------------------------------------------------------------------------- elementwise

ELEMENTWISE_FWD = Traffic(full_read=1, full_written=1)
ELEMENTWISE_BWD = Traffic(full_read=2, full_written=1)  # dy, x read; dx written


def gelu_cases(op: str, approximate: str) -> list[Case]:
    return [
        Case(op, "fwd", randn_inputs(1),
             avo=lambda x: torch.ops.avo.gelu(x, approximate=approximate),
             eager=lambda x: F.gelu(x, approximate=approximate),
             traffic=ELEMENTWISE_FWD),
        Case(op, "bwd", randn_inputs(2),
             avo=lambda dy, x: torch.ops.avo.gelu_backward(dy, x, approximate=approximate),
             eager=lambda dy, x: torch.ops.aten.gelu_backward(dy, x, approximate=approximate),
             traffic=ELEMENTWISE_BWD),
    ]


def silu_cases() -> list[Case]:
    return [
        Case("silu", "fwd", randn_inputs(1),
             avo=lambda x: torch.ops.avo.silu(x),
             eager=lambda x: F.silu(x),
             traffic=ELEMENTWISE_FWD),
        Case("silu", "bwd", randn_inputs(2),
             avo=lambda dy, x: torch.ops.avo.silu_backward(dy, x),
             eager=lambda dy, x: torch.ops.aten.silu_backward(dy, x),
             traffic=ELEMENTWISE_BWD),
    ]


# --------------------------------------------------------------------------- row ops
# The backward cases' make_inputs end with what torch's autograd would have saved in the
# forward, then what avo's forward saves (avo_saved); each implementation reads its own.


def avo_saved(op: str, outputs: int, *args) -> tuple[Tensor, ...]:
    """The per-row fp32 values avo's <op>_forward returns after its `outputs` outputs, for
    <op>_backward; none while avo_ops is not loaded (--no-avo), where avo never runs."""
    if not hasattr(torch.ops, "avo") or not hasattr(torch.ops.avo, f"{op}_forward"):
        return ()
    return tuple(getattr(torch.ops.avo, f"{op}_forward")(*args)[outputs:])

def layer_norm_stats(x: Tensor, w: Tensor, b: Tensor):
    """mean, rstd (fp32, R x 1) as F.layer_norm's autograd saves them."""
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, last_dim(x), w, b, LN_EPS)
    return mean, rstd


def layer_norm_backward_eager(dy, x, w, b, mean, rstd):
    return torch.ops.aten.native_layer_norm_backward(dy, x, last_dim(x), mean, rstd, w, b,
                                                     [True, True, True])


def layernorm_cases() -> list[Case]:
    return [
        Case("layernorm", "fwd", randn_inputs(1, params=2),
             avo=lambda x, w, b: torch.ops.avo.layernorm(x, w, b, LN_EPS),
             eager=lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, LN_EPS),
             traffic=Traffic(1, 1, param_read=2)),
        # dy, x read, dx written; w read, dw, db written.
        Case("layernorm", "bwd", randn_inputs(2, params=2, extra=lambda dy, x, w, b: (
                 *layer_norm_stats(x, w, b), *avo_saved("layernorm", 1, x, w, b, LN_EPS))),
             avo=lambda dy, x, w, b, mean, rstd, mu, rs:
                 torch.ops.avo.layernorm_backward(dy, mu, rs, x, w, b, LN_EPS),
             eager=lambda dy, x, w, b, mean, rstd, *_: layer_norm_backward_eager(dy, x, w, b, mean, rstd),
             traffic=Traffic(2, 1, param_read=1, param_written=2)),
    ]


def rms_rstd(x: Tensor, w: Tensor) -> Tensor:
    """The rstd (fp32, R x 1) that F.rms_norm's autograd saves for its backward."""
    fused = getattr(torch.ops.aten, "_fused_rms_norm", None)
    if fused is not None:
        return fused(x, last_dim(x), w, RMS_EPS)[1]
    xc = x.to(torch.promote_types(x.dtype, torch.float32))
    return torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + RMS_EPS)


def rmsnorm_backward_eager(dy: Tensor, x: Tensor, w: Tensor, rstd: Tensor):
    """The eager backward of F.rms_norm from its saved rstd.

    On CUDA, torch eager autograd runs the fused kernel aten._fused_rms_norm_backward
    (torch >= 2.8), so that is the reference there. Elsewhere (it has no CPU kernel) or on
    older torch, the same math in plain torch ops, as torch's own decomposition of that op
    computes it (fp32 compute, cast back):
        xhat = x * rstd, g = dy * w
        dx = rstd * (g - xhat * mean(g * xhat, -1)),  dw = sum over rows of dy * xhat
    """
    fused = getattr(torch.ops.aten, "_fused_rms_norm_backward", None)
    if fused is not None and x.is_cuda:
        return fused(dy, x, last_dim(x), rstd, w, [True, True])
    compute = torch.promote_types(x.dtype, torch.float32)
    xhat = x.to(compute) * rstd
    dyf = dy.to(compute)
    g = dyf * w.to(compute)
    dx = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
    dw = (dyf * xhat).reshape(-1, x.shape[-1]).sum(0)
    return dx.to(x.dtype), dw.to(w.dtype)


def rmsnorm_cases() -> list[Case]:
    return [
        Case("rmsnorm", "fwd", randn_inputs(1, params=1),
             avo=lambda x, w: torch.ops.avo.rmsnorm(x, w, RMS_EPS),
             eager=lambda x, w: F.rms_norm(x, (x.shape[-1],), w, RMS_EPS),
             traffic=Traffic(1, 1, param_read=1)),
        # dy, x read, dx written; w read, dw written.
        Case("rmsnorm", "bwd", randn_inputs(2, params=1, extra=lambda dy, x, w: (
                 rms_rstd(x, w), *avo_saved("rmsnorm", 1, x, w, RMS_EPS))),
             avo=lambda dy, x, w, rstd, rrms: torch.ops.avo.rmsnorm_backward(dy, rrms, x, w, RMS_EPS),
             eager=lambda dy, x, w, rstd, *_: rmsnorm_backward_eager(dy, x, w, rstd),
             traffic=Traffic(2, 1, param_read=1, param_written=1)),
    ]


def softmax_cases(op: str, fwd: Callable, aten_bwd: Callable) -> list[Case]:
    # torch.ops.avo.<op> is looked up at call time: avo_ops may not be loaded (--no-avo).
    def avo_backward(dy, x, y):
        # Both backwards read the output y, as torch's do.
        return getattr(torch.ops.avo, f"{op}_backward")(dy, y)

    backward_inputs = randn_inputs(2, extra=lambda dy, x: (fwd(x, -1),))
    return [
        Case(op, "fwd", randn_inputs(1),
             avo=lambda x: getattr(torch.ops.avo, op)(x),
             eager=lambda x: fwd(x, -1),
             traffic=Traffic(1, 1)),
        # dy and y read, dx written.
        Case(op, "bwd", backward_inputs, avo=avo_backward,
             eager=lambda dy, x, y: aten_bwd(dy, y, -1, x.dtype),
             traffic=Traffic(2, 1)),
    ]


def swish_layernorm_cases() -> list[Case]:
    def saved(dy, x, w, b):  # what layer_norm(silu(x)) saves: x, s = silu(x), mean, rstd
        s = F.silu(x)
        return (s, *layer_norm_stats(s, w, b), *avo_saved("swish_layernorm", 1, x, w, b, LN_EPS))

    def backward_eager(dy, x, w, b, s, mean, rstd, *_):
        ds, dw, db = layer_norm_backward_eager(dy, s, w, b, mean, rstd)
        return torch.ops.aten.silu_backward(ds, x), dw, db

    return [
        Case("swish_layernorm", "fwd", randn_inputs(1, params=2),
             avo=lambda x, w, b: torch.ops.avo.swish_layernorm(x, w, b, LN_EPS),
             eager=lambda x, w, b: F.layer_norm(F.silu(x), (x.shape[-1],), w, b, LN_EPS),
             traffic=Traffic(1, 1, param_read=2)),
        # Counted as layernorm's backward: dy, x read, dx written; w read, dw, db written.
        # The eager chain also reads the saved s and writes and re-reads ds.
        Case("swish_layernorm", "bwd", randn_inputs(2, params=2, extra=saved),
             avo=lambda dy, x, w, b, s, mean, rstd, mu, rs:
                 torch.ops.avo.swish_layernorm_backward(dy, mu, rs, x, w, b, LN_EPS),
             eager=backward_eager,
             traffic=Traffic(2, 1, param_read=1, param_written=2)),
    ]


def twice_first(gradients: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """(grad_x, grad_x, ...): the add ops' backward returns x's gradient once, for x and residual."""
    return (gradients[0], *gradients)


def add_norm_cases() -> list[Case]:
    # Forward: x, residual read; hidden = x + residual and y written; w (, b) read.
    # Backward: grad_hidden, grad_y, x, residual read; grad_x, grad_residual written; w read,
    # dw (, db) written. torch's autograd saves hidden, reads it instead of x and residual,
    # and hands one tensor to both x and residual (returned twice here), so it moves two
    # full tensors fewer than counted; so does avo's backward, which reads hidden too.
    def add_rmsnorm_eager(x, r, w):
        h = x + r
        return h, F.rms_norm(h, (x.shape[-1],), w, RMS_EPS)

    def add_layernorm_eager(x, r, w, b):
        h = x + r
        return h, F.layer_norm(h, (x.shape[-1],), w, b, LN_EPS)

    def add_rmsnorm_saved(gh, gy, x, r, w):
        h = x + r
        return h, rms_rstd(h, w), *avo_saved("add_rmsnorm", 2, x, r, w, RMS_EPS)

    def add_rmsnorm_backward_eager(gh, gy, x, r, w, h, rstd, *_):
        dh, dw = rmsnorm_backward_eager(gy, h, w, rstd)
        d = dh + gh
        return d, d, dw

    def add_layernorm_saved(gh, gy, x, r, w, b):
        h = x + r
        return (h, *layer_norm_stats(h, w, b), *avo_saved("add_layernorm", 2, x, r, w, b, LN_EPS))

    def add_layernorm_backward_eager(gh, gy, x, r, w, b, h, mean, rstd, *_):
        dh, dw, db = layer_norm_backward_eager(gy, h, w, b, mean, rstd)
        d = dh + gh
        return d, d, dw, db

    return [
        Case("add_rmsnorm", "fwd", randn_inputs(2, params=1),
             avo=lambda x, r, w: torch.ops.avo.add_rmsnorm(x, r, w, RMS_EPS),
             eager=add_rmsnorm_eager,
             traffic=Traffic(2, 2, param_read=1)),
        Case("add_rmsnorm", "bwd", randn_inputs(4, params=1, extra=add_rmsnorm_saved),
             avo=lambda gh, gy, x, r, w, h, rstd, rrms:
                 twice_first(torch.ops.avo.add_rmsnorm_backward(gh, gy, rrms, h, w, RMS_EPS)),
             eager=add_rmsnorm_backward_eager,
             traffic=Traffic(4, 2, param_read=1, param_written=1)),
        Case("add_layernorm", "fwd", randn_inputs(2, params=2),
             avo=lambda x, r, w, b: torch.ops.avo.add_layernorm(x, r, w, b, LN_EPS),
             eager=add_layernorm_eager,
             traffic=Traffic(2, 2, param_read=2)),
        Case("add_layernorm", "bwd", randn_inputs(4, params=2, extra=add_layernorm_saved),
             avo=lambda gh, gy, x, r, w, b, h, mean, rstd, mu, rs:
                 twice_first(torch.ops.avo.add_layernorm_backward(gh, gy, mu, rs, h, w, b, LN_EPS)),
             eager=add_layernorm_backward_eager,
             traffic=Traffic(4, 2, param_read=1, param_written=2)),
    ]


def channel_norm_cases() -> list[Case]:
    # torch's equivalent is group norm with one group per channel (swish=False).
    def group_norm_args(x: Tensor):
        batch, channels = x.shape[0], x.shape[1]
        return batch, channels, math.prod(x.shape[2:]), channels  # N, C, HxW, groups

    def saved(dy, x, g, b):
        _, mean, rstd = torch.ops.aten.native_group_norm(x, g, b, *group_norm_args(x), LN_EPS)
        return mean, rstd, *avo_saved("channel_norm", 1, x, g, b, LN_EPS)

    def backward_eager(dy, x, g, b, mean, rstd, *_):
        return torch.ops.aten.native_group_norm_backward(dy, x, mean, rstd, g,
                                                         *group_norm_args(x), [True, True, True])

    return [
        Case("channel_norm", "fwd", randn_inputs(1, params=2, param_dim=1),
             avo=lambda x, g, b: torch.ops.avo.channel_norm(x, g, b, LN_EPS),
             eager=lambda x, g, b: F.group_norm(x, x.shape[1], g, b, LN_EPS),
             traffic=Traffic(1, 1, param_read=2), layout=channel_layout, param_dim=1),
        # dy, x read, dx written; gamma read, dgamma, dbeta written.
        Case("channel_norm", "bwd", randn_inputs(2, params=2, extra=saved, param_dim=1),
             avo=lambda dy, x, g, b, mean, rstd, mu, rs:
                 torch.ops.avo.channel_norm_backward(dy, mu, rs, x, g, b, LN_EPS),
             eager=backward_eager,
             traffic=Traffic(2, 1, param_read=1, param_written=2),
             layout=channel_layout, param_dim=1),
    ]


CASES: list[Case] = [
    *gelu_cases("gelu", "none"),
    *gelu_cases("gelu_tanh", "tanh"),
    *silu_cases(),
    *layernorm_cases(),
    *rmsnorm_cases(),
    *softmax_cases("softmax", torch.softmax, torch.ops.aten._softmax_backward_data),
    *softmax_cases("log_softmax", torch.log_softmax, torch.ops.aten._log_softmax_backward_data),
    *swish_layernorm_cases(),
    *add_norm_cases(),
    *channel_norm_cases(),
]


def op_names() -> list[str]:
    return list(dict.fromkeys(c.op for c in CASES))


def find_case(op: str, direction: str) -> Case:
    return next(c for c in CASES if c.op == op and c.direction == direction)


def select(ops: Sequence[str], dirs: Sequence[str]) -> list[Case]:
    return [c for c in CASES if c.op in ops and c.direction in dirs]

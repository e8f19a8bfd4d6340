#!/usr/bin/env python3
"""Memory-bandwidth benchmark of avo ops against torch eager and torch.compile.

For every op x direction x shape x dtype this measures three implementations:

    avo      torch.ops.avo.<op> (or <op>_backward for "bwd")
    eager    the torch eager reference: F.gelu / F.silu / F.layer_norm / F.rms_norm /
             torch.softmax ... for "fwd"; for "bwd" the aten backward kernel torch's
             autograd runs (aten.gelu_backward, native_layer_norm_backward,
             _softmax_backward_data, ...), fed the statistics its forward would have
             saved (precomputed outside the timing)
    compile  torch.compile of the eager reference

Bandwidth = minimal bytes (each input read once, each output written once) / median
time. A device-to-device copy is measured in the same run and every result is also
reported as a fraction of the copy bandwidth (see DESIGN.md, "Measuring").

Timing: CUDA events around each call, warm-up first, median over many repetitions.
Inputs rotate among enough distinct buffers that the rotation's working set is several
times the L2 cache, so every timed call reads cold data from HBM. Before each chunk of
timed calls the GPU is parked on a short spin kernel while the host queues the chunk,
so host launch overhead never shows up in the per-call times.

Row ops (layernorm, rmsnorm, softmax, log_softmax, swish_layernorm, add_rmsnorm,
add_layernorm) normalize over the last dimension N of an RxN shape; their parameter
vectors (weight, bias) have length N and the input dtype.

Adding an op: append Case entries to CASES (see the gelu/silu and row-op entries below).

Usage:
    python benchmarks/bench_ops.py [--quick] [--ops gelu,layernorm] [--dirs fwd,bwd]
        [--dtypes bf16,fp32] [--shapes 16384x4096,...] [--json PATH] [--markdown PATH]

--quick: 16384x4096 only; gelu, silu, layernorm, rmsnorm, softmax (fwd and bwd), 50 reps.

Progress goes to stderr; the summary table is printed last on stdout.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F

Tensor = torch.Tensor
Shape = tuple[int, ...]

DEFAULT_SHAPES = ["32768x1024", "16384x4096", "4096x16384"]
QUICK_SHAPES = ["16384x4096"]
QUICK_OPS = ["gelu", "silu", "layernorm", "rmsnorm", "softmax"]
DEFAULT_REPS = 100
QUICK_REPS = 50          # --quick: 20 rows x 3 implementations, mostly torch.compile time
DEFAULT_DTYPES = ["bf16", "fp32"]
COPY_SIZES_MIB = [512, 2048]
FALLBACK_L2_BYTES = 64 << 20
L2_MULTIPLE = 3          # rotation working set >= this many L2 caches
MAX_ROTATION_MEM = 0.25  # ... but at most this fraction of free device memory
CHUNK = 25               # timed calls queued behind one spin kernel

DTYPES = {
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
}
SHORT_DTYPE = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


# --------------------------------------------------------------------------- registry

@dataclass(frozen=True)
class Case:
    """One benchmarked operation (an op in one direction).

    make_inputs(shape, dtype, device) -> tuple of input tensors (may end with tensors only
                                          the eager reference reads, e.g. saved statistics)
    avo(*inputs) / eager(*inputs)      -> output tensor(s); same signature
    nbytes(inputs)                     -> minimal bytes moved by one call
    """

    op: str
    direction: str  # "fwd" or "bwd"
    make_inputs: Callable[[Shape, torch.dtype, torch.device], tuple[Tensor, ...]]
    avo: Callable[..., object]
    eager: Callable[..., object]
    nbytes: Callable[[Sequence[Tensor]], int]

    @property
    def label(self) -> str:
        return f"{self.op}.{self.direction}"


def randn_inputs(count: int):
    """Builder of `count` standard-normal tensors of the requested shape and dtype."""

    def make(shape: Shape, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, ...]:
        return tuple(torch.randn(shape, dtype=dtype, device=device) for _ in range(count))

    return make


def elementwise_bytes(outputs: int = 1):
    """Byte count of an elementwise op: every input read once, `outputs` tensors shaped
    like the first input written once."""

    def nbytes(inputs: Sequence[Tensor]) -> int:
        read = sum(t.numel() * t.element_size() for t in inputs)
        written = outputs * inputs[0].numel() * inputs[0].element_size()
        return read + written

    return nbytes


def gelu_cases(op: str, approximate: str) -> list[Case]:
    aten_bwd = torch.ops.aten.gelu_backward
    return [
        Case(op, "fwd", randn_inputs(1),
             avo=lambda x: torch.ops.avo.gelu(x, approximate=approximate),
             eager=lambda x: F.gelu(x, approximate=approximate),
             nbytes=elementwise_bytes()),
        Case(op, "bwd", randn_inputs(2),
             avo=lambda dy, x: torch.ops.avo.gelu_backward(dy, x, approximate=approximate),
             eager=lambda dy, x: aten_bwd(dy, x, approximate=approximate),
             nbytes=elementwise_bytes()),
    ]


def silu_cases() -> list[Case]:
    return [
        Case("silu", "fwd", randn_inputs(1),
             avo=lambda x: torch.ops.avo.silu(x),
             eager=lambda x: F.silu(x),
             nbytes=elementwise_bytes()),
        Case("silu", "bwd", randn_inputs(2),
             avo=lambda dy, x: torch.ops.avo.silu_backward(dy, x),
             eager=lambda dy, x: torch.ops.aten.silu_backward(dy, x),
             nbytes=elementwise_bytes()),
    ]


# Row ops: normalize over the LAST dimension N of an RxN input. Their make_inputs return
# the tensors both callables take: what avo reads, plus anything the eager reference needs
# that torch's autograd would have saved in the forward (mean/rstd, the softmax output).
# Those extras are computed once in make_inputs, outside the timing, and avo ignores them.

LN_EPS = 1e-5
RMS_EPS = 1e-6


def nbytes_of(t: Tensor) -> int:
    return t.numel() * t.element_size()


def row_bytes(rows_read: Sequence[int], rows_written: int, cols_read: Sequence[int] = (),
              cols_written: int = 0):
    """Byte count of a row op: the RxN inputs at positions rows_read and the length-N
    parameter vectors at positions cols_read read once; rows_written RxN tensors (dtype of
    inputs[rows_read[0]]) and cols_written length-N vectors (dtype of inputs[cols_read[0]])
    written once. Inputs at other positions (saved statistics) are not counted."""

    def nbytes(inputs: Sequence[Tensor]) -> int:
        row = inputs[rows_read[0]]
        col_size = (inputs[cols_read[0]] if cols_read else row).element_size() * row.shape[-1]
        return (sum(nbytes_of(inputs[i]) for i in (*rows_read, *cols_read))
                + rows_written * nbytes_of(row) + cols_written * col_size)

    return nbytes


def row_inputs(rows: int, cols: int = 0, extra: Optional[Callable] = None):
    """Builder of `rows` standard-normal tensors of the requested shape, then `cols`
    standard-normal parameter vectors of length N (shape[-1]), same dtype; `extra(*tensors)`
    may append precomputed tensors (the statistics the eager backward reads)."""

    def make(shape: Shape, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, ...]:
        ts = [torch.randn(shape, dtype=dtype, device=device) for _ in range(rows)]
        ts += [torch.randn(shape[-1], dtype=dtype, device=device) for _ in range(cols)]
        return tuple(ts) + (tuple(extra(*ts)) if extra is not None else ())

    return make


def layernorm_cases() -> list[Case]:
    def stats(dy, x, w, b):  # what F.layer_norm's autograd saves: mean, rstd (fp32, Rx1)
        _, mean, rstd = torch.ops.aten.native_layer_norm(x, [x.shape[-1]], w, b, LN_EPS)
        return mean, rstd

    return [
        Case("layernorm", "fwd", row_inputs(1, cols=2),
             avo=lambda x, w, b: torch.ops.avo.layernorm(x, w, b, LN_EPS),
             eager=lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, LN_EPS),
             nbytes=row_bytes([0], 1, cols_read=[1, 2])),
        # Bytes: dy, x read, dx written; w read, dw, db written. The eager kernel also reads
        # the saved mean and rstd (R floats each), which are not counted.
        Case("layernorm", "bwd", row_inputs(2, cols=2, extra=stats),
             avo=lambda dy, x, w, b, mean, rstd:
                 torch.ops.avo.layernorm_backward(dy, x, w, b, LN_EPS),
             eager=lambda dy, x, w, b, mean, rstd: torch.ops.aten.native_layer_norm_backward(
                 dy, x, [x.shape[-1]], mean, rstd, w, b, [True, True, True]),
             nbytes=row_bytes([0, 1], 1, cols_read=[2], cols_written=2)),
    ]


def rms_rstd(x: Tensor, w: Tensor) -> Tensor:
    """The rstd (fp32, Rx1) that F.rms_norm's autograd saves for its backward."""
    fused = getattr(torch.ops.aten, "_fused_rms_norm", None)
    if fused is not None:
        return fused(x, [x.shape[-1]], w, RMS_EPS)[1]
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
        return fused(dy, x, [x.shape[-1]], rstd, w, [True, True])
    compute = torch.promote_types(x.dtype, torch.float32)
    xhat = x.to(compute) * rstd
    dyf = dy.to(compute)
    g = dyf * w.to(compute)
    dx = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
    dw = (dyf * xhat).reshape(-1, x.shape[-1]).sum(0)
    return dx.to(x.dtype), dw.to(w.dtype)


def rmsnorm_cases() -> list[Case]:
    return [
        Case("rmsnorm", "fwd", row_inputs(1, cols=1),
             avo=lambda x, w: torch.ops.avo.rmsnorm(x, w, RMS_EPS),
             eager=lambda x, w: F.rms_norm(x, (x.shape[-1],), w, RMS_EPS),
             nbytes=row_bytes([0], 1, cols_read=[1])),
        # Bytes: dy, x read, dx written; w read, dw written. The eager kernel also reads the
        # saved rstd (R floats), which is not counted.
        Case("rmsnorm", "bwd", row_inputs(2, cols=1, extra=lambda dy, x, w: (rms_rstd(x, w),)),
             avo=lambda dy, x, w, rstd: torch.ops.avo.rmsnorm_backward(dy, x, w, RMS_EPS),
             eager=rmsnorm_backward_eager,
             nbytes=row_bytes([0, 1], 1, cols_read=[2], cols_written=1)),
    ]


def softmax_cases(op: str, fwd: Callable, aten_bwd: Callable) -> list[Case]:
    # torch.ops.avo.<op> is looked up at call time: avo_ops may not be loaded (--no-avo).
    return [
        Case(op, "fwd", row_inputs(1),
             avo=lambda x: getattr(torch.ops.avo, op)(x),
             eager=lambda x: fwd(x, -1),
             nbytes=row_bytes([0], 1)),
        # avo recomputes from x, eager reads the saved output y (precomputed here): the same
        # bytes either way (dy and x-or-y read, dx written).
        Case(op, "bwd", row_inputs(2, extra=lambda dy, x: (fwd(x, -1),)),
             avo=lambda dy, x, y: getattr(torch.ops.avo, f"{op}_backward")(dy, x),
             eager=lambda dy, x, y: aten_bwd(dy, y, -1, x.dtype),
             nbytes=row_bytes([0, 1], 1)),
    ]


def swish_layernorm_cases() -> list[Case]:
    # Forward only: torch has no single backward kernel for layer_norm(silu(x)); its eager
    # autograd backward would be a chain of kernels reading saved intermediates.
    return [
        Case("swish_layernorm", "fwd", row_inputs(1, cols=2),
             avo=lambda x, w, b: torch.ops.avo.swish_layernorm(x, w, b, LN_EPS),
             eager=lambda x, w, b: F.layer_norm(F.silu(x), (x.shape[-1],), w, b, LN_EPS),
             nbytes=row_bytes([0], 1, cols_read=[1, 2])),
    ]


def add_norm_cases() -> list[Case]:
    # Forward only. Bytes: x, residual read; hidden = x + residual and y written; w (, b) read.
    def add_rmsnorm_eager(x, r, w):
        h = x + r
        return h, F.rms_norm(h, (x.shape[-1],), w, RMS_EPS)

    def add_layernorm_eager(x, r, w, b):
        h = x + r
        return h, F.layer_norm(h, (x.shape[-1],), w, b, LN_EPS)

    return [
        Case("add_rmsnorm", "fwd", row_inputs(2, cols=1),
             avo=lambda x, r, w: torch.ops.avo.add_rmsnorm(x, r, w, RMS_EPS),
             eager=add_rmsnorm_eager,
             nbytes=row_bytes([0, 1], 2, cols_read=[2])),
        Case("add_layernorm", "fwd", row_inputs(2, cols=2),
             avo=lambda x, r, w, b: torch.ops.avo.add_layernorm(x, r, w, b, LN_EPS),
             eager=add_layernorm_eager,
             nbytes=row_bytes([0, 1], 2, cols_read=[2, 3])),
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
]


def op_names() -> list[str]:
    return list(dict.fromkeys(c.op for c in CASES))


# --------------------------------------------------------------------------- timing

class Timer:
    """Median-of-N CUDA-event timing with L2-cold inputs and no launch-overhead leaks."""

    def __init__(self, reps: int, warmup: int):
        self.reps = reps
        self.warmup = warmup
        self.cycles_per_us = self._calibrate_spin()

    @staticmethod
    def _calibrate_spin() -> Optional[float]:
        """GPU clock cycles per microsecond of torch.cuda._sleep, or None if unavailable."""
        if not hasattr(torch.cuda, "_sleep"):
            return None
        cycles = 20_000_000
        torch.cuda._sleep(cycles)  # let the clocks ramp up
        start, end = _event_pair()
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        torch.cuda.synchronize()
        return cycles / (start.elapsed_time(end) * 1e3)

    def _spin(self, microseconds: float) -> None:
        if self.cycles_per_us is not None:
            torch.cuda._sleep(int(microseconds * self.cycles_per_us))

    def measure(self, fn: Callable, arg_sets: Sequence[Sequence[Tensor]]) -> list[float]:
        """Per-call GPU times in microseconds; call i uses arg_sets[i % len(arg_sets)]."""
        calls = _rotation(arg_sets)
        for _ in range(self.warmup):
            fn(*next(calls))
        torch.cuda.synchronize()
        host_us = self._host_cost(fn, calls)
        pairs = []
        for first in range(0, self.reps, CHUNK):
            count = min(CHUNK, self.reps - first)
            self._spin(1.5 * host_us * count + 50.0)
            pairs += [self._timed_call(fn, next(calls)) for _ in range(count)]
        torch.cuda.synchronize()
        return [start.elapsed_time(end) * 1e3 for start, end in pairs]

    @staticmethod
    def _timed_call(fn: Callable, args: Sequence[Tensor]):
        start, end = _event_pair()
        start.record()
        fn(*args)
        end.record()
        return start, end

    def _host_cost(self, fn: Callable, calls, count: int = 10) -> float:
        """Host microseconds to queue one timed call (events included)."""
        t0 = time.perf_counter()
        for _ in range(count):
            self._timed_call(fn, next(calls))
        host_us = (time.perf_counter() - t0) * 1e6 / count
        torch.cuda.synchronize()
        return host_us


def _event_pair():
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def _rotation(arg_sets):
    i = 0
    while True:
        yield arg_sets[i % len(arg_sets)]
        i += 1


def summarize(times_us: list[float], nbytes: int, copy_gbps: Optional[float]) -> dict:
    median = statistics.median(times_us)
    gbps = nbytes / (median * 1e-6) / 1e9
    return {
        "median_us": round(median, 3),
        "min_us": round(min(times_us), 3),
        "max_us": round(max(times_us), 3),
        "gbps": round(gbps, 1),
        "frac_copy": round(gbps / copy_gbps, 4) if copy_gbps else None,
    }


# --------------------------------------------------------------------------- device facts

def l2_bytes() -> int:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    size = getattr(props, "L2_cache_size", 0) or getattr(props, "l2_cache_size", 0)
    return int(size) if size else FALLBACK_L2_BYTES


def free_bytes() -> int:
    return torch.cuda.mem_get_info()[0]


def rotation_count(bytes_per_set: int) -> int:
    """Distinct input sets so that the rotation covers L2_MULTIPLE x L2 (at least 2)."""
    wanted = max(2, math.ceil(L2_MULTIPLE * l2_bytes() / bytes_per_set))
    affordable = int(MAX_ROTATION_MEM * free_bytes() // max(bytes_per_set, 1))
    return max(1, min(wanted, affordable))


# --------------------------------------------------------------------------- copy bandwidth

def measure_copy(timer: Timer) -> list[dict]:
    results = []
    for mib in COPY_SIZES_MIB:
        size = mib << 20
        if 2 * size > 0.8 * free_bytes():
            log(f"copy {mib} MiB: skipped (not enough free device memory)")
            continue
        src = torch.ones(size, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        times = timer.measure(lambda d, s: d.copy_(s), [(dst, src)])
        stats = summarize(times, 2 * size, None)
        stats.pop("frac_copy")
        results.append({"size_mib": mib, **stats})
        log(f"copy {mib} MiB: {stats['gbps']:.0f} GB/s")
        del src, dst
        torch.cuda.empty_cache()
    return results


# --------------------------------------------------------------------------- one row

IMPLS = ("avo", "eager", "compile")


def fresh_compile(fn: Callable) -> Callable:
    """torch.compile with a clean dynamo cache, so many shapes never hit recompile limits."""
    if hasattr(torch, "_dynamo"):
        torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, dynamic=False)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def compare(avo_out, ref_out, dtype: torch.dtype) -> dict:
    """Loose sanity check that avo computes what the reference computes.

    Ops with several outputs (most backwards) are compared output by output. Outputs
    smaller than the first (parameter gradients: sums over all R rows) get an absolute
    tolerance scaled by their largest magnitude, since summation order differs."""
    tol = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 4e-2}[dtype]
    avo_outs = list(avo_out) if isinstance(avo_out, (tuple, list)) else [avo_out]
    ref_outs = list(ref_out) if isinstance(ref_out, (tuple, list)) else [ref_out]
    if len(avo_outs) != len(ref_outs):
        return {"ok": False, "max_abs_diff": None,
                "error": f"{len(avo_outs)} outputs vs {len(ref_outs)} from eager"}
    per_output = []
    for a, r in zip(avo_outs, ref_outs):
        if a.shape != r.shape:
            per_output.append({"ok": False, "max_abs_diff": None,
                               "error": f"shape {list(a.shape)} vs {list(r.shape)}"})
            continue
        a, r = a.float(), r.float()
        atol = tol
        if r.numel() < ref_outs[0].numel() and r.numel() > 0:
            atol = tol * max(1.0, r.abs().max().item())
        max_abs = (a - r).abs().max().item() if r.numel() else 0.0
        per_output.append({"ok": bool(torch.allclose(a, r, rtol=tol, atol=atol)),
                           "max_abs_diff": max_abs})
    diffs = [o["max_abs_diff"] for o in per_output if o["max_abs_diff"] is not None]
    check = {"ok": all(o["ok"] for o in per_output),
             "max_abs_diff": max(diffs) if diffs else None}
    if len(per_output) > 1:
        check["outputs"] = per_output
    return check


class Notices:
    """Stderr notices, each distinct message printed once; kept for the reports."""

    def __init__(self):
        self.items: list[str] = []

    def add(self, message: str) -> None:
        if message not in self.items:
            self.items.append(message)
            log(f"NOTICE: {message}")


def bench_case(case: Case, shape: Shape, dtype: torch.dtype, timer: Timer, copy_gbps,
               impls: Sequence[str], notices: Notices) -> dict:
    torch.manual_seed(0)
    probe = case.make_inputs(shape, dtype, torch.device("cuda"))
    set_bytes = sum(t.numel() * t.element_size() for t in probe)
    count = rotation_count(set_bytes)
    arg_sets = [probe] + [case.make_inputs(shape, dtype, torch.device("cuda"))
                          for _ in range(count - 1)]
    nbytes = case.nbytes(probe)
    row = {"op": case.op, "dir": case.direction, "shape": list(shape),
           "dtype": SHORT_DTYPE[dtype], "bytes": nbytes, "buffers": count,
           "results": {}, "check": None}
    fns = {"avo": case.avo, "eager": case.eager}
    for impl in impls:
        tag = f"{case.label} {fmt_shape(shape)} {SHORT_DTYPE[dtype]} {impl}"
        try:
            fn = fresh_compile(case.eager) if impl == "compile" else fns[impl]
            fn(*probe)  # first call: compiles / surfaces missing ops
            stats = summarize(timer.measure(fn, arg_sets), nbytes, copy_gbps)
            log(f"{tag}: {stats['gbps']:.0f} GB/s ({stats['median_us']:.1f} us, "
                f"{count} buffers)")
        except Exception as exc:  # noqa: BLE001 - report and keep benchmarking
            stats = {"error": first_line(exc)}
            notices.add(f"{impl} unavailable for {case.label}: {stats['error']}")
            log(f"{tag}: unavailable")
        row["results"][impl] = stats
    if "gbps" in row["results"].get("avo", {}):
        try:
            row["check"] = compare(case.avo(*probe), case.eager(*probe), dtype)
        except Exception as exc:  # noqa: BLE001 - e.g. the eager reference is unavailable
            row["check"] = {"ok": False, "max_abs_diff": None, "error": first_line(exc)}
        if not row["check"]["ok"]:
            bad = [str(i) for i, o in enumerate(row["check"].get("outputs", [])) if not o["ok"]]
            diff = row["check"]["max_abs_diff"]
            notices.add(f"avo output differs from eager for {case.label} "
                        f"{fmt_shape(shape)} {SHORT_DTYPE[dtype]} "
                        + (f"(outputs {','.join(bad)}; " if bad else "(")
                        + (f"max abs diff {diff:.3g})" if diff is not None
                           else f"{row['check'].get('error', 'mismatch')})"))
    row["speedup_vs_best_other"] = speedup(row["results"])
    del arg_sets, probe
    torch.cuda.empty_cache()
    return row


def speedup(results: dict) -> Optional[float]:
    avo = results.get("avo", {}).get("gbps")
    others = [r["gbps"] for k, r in results.items() if k != "avo" and "gbps" in r]
    if avo is None or not others:
        return None
    return round(avo / max(others), 3)


# --------------------------------------------------------------------------- reports

def fmt_shape(shape: Sequence[int]) -> str:
    return "x".join(str(s) for s in shape)


def cell(value, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def table_rows(rows: list[dict]) -> list[list[str]]:
    out = []
    for r in rows:
        res = r["results"]
        out.append([
            r["op"], r["dir"], fmt_shape(r["shape"]), r["dtype"],
            cell(res.get("avo", {}).get("gbps"), ".0f"),
            cell(res.get("avo", {}).get("frac_copy"), ".2f"),
            cell(res.get("eager", {}).get("gbps"), ".0f"),
            cell(res.get("compile", {}).get("gbps"), ".0f"),
            cell(r["speedup_vs_best_other"], ".2f") + ("" if r["speedup_vs_best_other"] is None else "x"),
        ])
    return out


HEADER = ["op", "dir", "shape", "dtype", "avo GB/s", "avo/copy", "eager GB/s",
          "compile GB/s", "avo vs best"]


def text_table(rows: list[dict]) -> str:
    body = [HEADER] + table_rows(rows)
    widths = [max(len(line[i]) for line in body) for i in range(len(HEADER))]
    lines = ["  ".join(c.rjust(w) if i >= 4 else c.ljust(w)
                       for i, (c, w) in enumerate(zip(line, widths))).rstrip()
             for line in body]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def copy_line(meta: dict) -> str:
    parts = [f"{c['gbps']:.0f} GB/s ({c['size_mib']} MiB)" for c in meta["copy"]]
    return f"device copy: {', '.join(parts) or 'not measured'}"


def markdown_report(meta: dict, rows: list[dict]) -> str:
    lines = [
        f"# avo_ops benchmark — {meta['gpu']}",
        "",
        f"{meta['date']}; torch {meta['torch']}, CUDA {meta['cuda']}; "
        f"{meta['reps']} timed calls per result (median), L2 {meta['l2_bytes'] >> 20} MiB.",
        f"GB/s = minimal bytes (inputs read once, outputs written once) / median time. "
        f"{copy_line(meta)}; ratios use {meta['copy_gbps']:.0f} GB/s.",
        "",
        f"Command: `{meta['command']}`",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
    ]
    lines += ["| " + " | ".join(r) + " |" for r in table_rows(rows)]
    if meta["notices"]:
        lines += ["", "Notices:", ""] + [f"- {n}" for n in meta["notices"]]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- CLI

def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def parse_shape(text: str) -> Shape:
    try:
        shape = tuple(int(p) for p in text.lower().replace("×", "x").split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad shape {text!r}; expected e.g. 16384x4096")
    if not shape or min(shape) <= 0:
        raise argparse.ArgumentTypeError(f"bad shape {text!r}")
    return shape


def split_list(text: Optional[str]) -> Optional[list[str]]:
    return None if text is None else [p.strip() for p in text.split(",") if p.strip()]


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Bandwidth of avo ops vs torch eager and torch.compile (CUDA only).",
        epilog=f"ops: {', '.join(op_names())}. dtypes: bf16, fp16, fp32. "
               "Progress goes to stderr; the summary table is printed last on stdout.")
    p.add_argument("--quick", action="store_true",
                   help=f"only {', '.join(QUICK_SHAPES)} (unless --shapes is given), "
                        f"ops {','.join(QUICK_OPS)} (unless --ops is given), "
                        f"{QUICK_REPS} reps (unless --reps is given)")
    p.add_argument("--ops", help="comma-separated op names (default: all)")
    p.add_argument("--dirs", default="fwd,bwd", help="fwd, bwd or both (default: fwd,bwd)")
    p.add_argument("--dtypes", help=f"comma-separated (default: {','.join(DEFAULT_DTYPES)})")
    p.add_argument("--shapes", help=f"comma-separated (default: {','.join(DEFAULT_SHAPES)})")
    p.add_argument("--reps", type=int,
                   help=f"timed calls per result (default {DEFAULT_REPS}; {QUICK_REPS} with --quick)")
    p.add_argument("--warmup", type=int, default=10, help="untimed calls first (default 10)")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    p.add_argument("--no-avo", action="store_true",
                   help="benchmark only the torch references (no avo_ops needed)")
    p.add_argument("--json", metavar="PATH", help="write all results as JSON")
    p.add_argument("--markdown", metavar="PATH", help="write the summary as Markdown")
    args = p.parse_args(argv)

    args.ops = split_list(args.ops) or (QUICK_OPS if args.quick else op_names())
    unknown = set(args.ops) - set(op_names())
    if unknown:
        p.error(f"unknown op(s) {sorted(unknown)}; known: {op_names()}")
    args.dirs = split_list(args.dirs)
    if not args.dirs or set(args.dirs) - {"fwd", "bwd"}:
        p.error("--dirs takes fwd, bwd or fwd,bwd")
    dtype_names = split_list(args.dtypes) or DEFAULT_DTYPES
    if set(dtype_names) - set(DTYPES):
        p.error(f"unknown dtype(s) in {dtype_names}; known: bf16, fp16, fp32")
    args.dtypes = list(dict.fromkeys(DTYPES[d] for d in dtype_names))
    shape_texts = split_list(args.shapes) or (QUICK_SHAPES if args.quick else DEFAULT_SHAPES)
    try:
        args.shapes = [parse_shape(s) for s in shape_texts]
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    if args.reps is None:
        args.reps = QUICK_REPS if args.quick else DEFAULT_REPS
    if args.reps < 1 or args.warmup < 0:
        p.error("--reps must be >= 1 and --warmup >= 0")
    return args


def import_avo() -> bool:
    try:
        import avo_ops  # noqa: F401  (loads the extension, registers torch.ops.avo.*)
    except Exception as exc:  # noqa: BLE001
        log(f"error: `import avo_ops` failed: {first_line(exc)}")
        log("Build/install the package first (pip install --no-build-isolation -e .), "
            "or pass --no-avo to benchmark only the torch references.")
        return False
    return True


def run_meta(args, copy: list[dict], notices: Notices) -> dict:
    copy_gbps = max((c["gbps"] for c in copy), default=None)
    return {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable, *sys.argv]),
        "reps": args.reps,
        "warmup": args.warmup,
        "l2_bytes": l2_bytes(),
        "copy": copy,
        "copy_gbps": copy_gbps,
        "notices": notices.items,
    }


def write_reports(args, meta: dict, rows: list[dict]) -> None:
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**meta, "rows": rows}, f, indent=2)
        log(f"wrote {args.json}")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown_report(meta, rows))
        log(f"wrote {args.markdown}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device; nothing to benchmark")
        return 0
    if not args.no_avo and not import_avo():
        return 1
    impls = [i for i in IMPLS if not (i == "avo" and args.no_avo)
             and not (i == "compile" and args.no_compile)]
    cases = [c for c in CASES if c.op in args.ops and c.direction in args.dirs]
    total = len(cases) * len(args.dtypes) * len(args.shapes)
    log(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, L2 {l2_bytes() >> 20} MiB; "
        f"{total} cases x {len(impls)} implementations, {args.reps} reps each")

    notices = Notices()
    with torch.no_grad():
        timer = Timer(args.reps, args.warmup)
        copy = measure_copy(timer)
        copy_gbps = max((c["gbps"] for c in copy), default=None)
        rows = []
        for case in cases:
            for dtype in args.dtypes:
                for shape in args.shapes:
                    log(f"[{len(rows) + 1}/{total}]")
                    rows.append(bench_case(case, shape, dtype, timer, copy_gbps, impls, notices))

    meta = run_meta(args, copy, notices)
    write_reports(args, meta, rows)
    print(copy_line(meta))
    print(text_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Host overhead of avo calls on a small tensor, against the corresponding torch calls.

For each op, on a 1x1024 input (channel_norm: [1, 4, 256]) with its weight/bias/residual,
this times the host side of one call in four modes:

    fwd      torch.ops.avo.<op>(...)                  vs the torch call (F.layer_norm, ...)
    fwd_api  avo_ops.<op>(...), the functional API   vs the same torch call
    fwd_bwd  avo_ops.<op>(...) on inputs that require grad, then .backward() of its outputs,
             vs the same with the torch call (torch's autograd backward)
    fwd_ops  torch.ops.avo.<op>(...)                  vs torch.ops.aten.<op>(...), for the
             ops that torch has as one aten op (gelu, silu, layernorm, rmsnorm, softmax,
             log_softmax): both calls go through torch's Python op-call layer

The calls and their inputs are the forward cases of bench_cases.py (the torch calls: F.gelu,
F.silu, F.layer_norm, F.rms_norm, torch.softmax, torch.log_softmax, F.layer_norm(F.silu(x)),
x + residual followed by F.rms_norm or F.layer_norm, and F.group_norm with one group per
channel).

Host time per call = the wall time of the call itself (time.perf_counter_ns around it),
median over --iters calls. On CUDA the kernels run asynchronously, so that is the time
the host spends in Python, the dispatcher and the launches; the queue never fills up
because the device is synchronized every --sync-every calls, outside the timed calls.
Gradients are cleared outside the timed calls too, so every backward assigns fresh .grad
tensors. avo and torch are measured in alternating blocks (so slow drifts of the machine
affect both alike) with the garbage collector off. On CPU the kernels run inside the call
(on torch's intra-op threads), so there the time includes the computation.

Usage:
    python benchmarks/bench_host_overhead.py [--device cuda|cpu] [--dtype fp32|bf16|fp16]
        [--ops gelu,layernorm] [--iters 2000] [--warmup 200] [--sync-every 100] [--out DIR]

--out DIR writes DIR/host_overhead.json and DIR/host_overhead.md. The table (avo us,
torch us, avo/torch) is printed on stdout.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import os
import platform
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_cases  # noqa: E402  (the ops' calls and inputs)
import bench_report  # noqa: E402  (its table and JSON layouts)

N = 1024
MODES = ("fwd", "fwd_api", "fwd_bwd", "fwd_ops")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
ROUNDS = 10  # avo and torch alternate in this many blocks per mode


# The input shape per op: one row of N elements, or this.
SHAPES = {"channel_norm": (1, 4, N // 4)}

# torch.ops.aten's call for the ops torch has as one op, with the forward cases' inputs
# and eps: the torch side of the fwd_ops mode. The fused ops have no such op (their torch
# call is several aten ops), and no fwd_ops row.
ATEN_CALLS: dict[str, Callable] = {
    "gelu": lambda x: torch.ops.aten.gelu(x, approximate="none"),
    "silu": lambda x: torch.ops.aten.silu(x),
    "layernorm": lambda x, w, b: torch.ops.aten.layer_norm(
        x, [x.shape[-1]], w, b, bench_cases.LN_EPS),
    "rmsnorm": lambda x, w: torch.ops.aten.rms_norm(x, [x.shape[-1]], w, bench_cases.RMS_EPS),
    "softmax": lambda x: torch.ops.aten.softmax(x, -1),
    "log_softmax": lambda x: torch.ops.aten.log_softmax(x, -1),
}


@dataclass(frozen=True)
class OpCalls:
    """One op: its forward case of bench_cases.py (inputs, the torch.ops.avo call and the
    torch call) and its functional API, avo_ops.<op>, called with the same tensors (its
    defaults are the cases' eps)."""

    case: bench_cases.Case
    shape: tuple[int, ...]
    avo_api: Callable

    @property
    def op(self) -> str:
        return self.case.op


def op_table() -> list[OpCalls]:
    import avo_ops

    return [OpCalls(case, SHAPES.get(case.op, (1, N)), getattr(avo_ops, case.op))
            for case in bench_cases.CASES
            if case.direction == "fwd" and case.op in avo_ops.OPS]  # not gelu_tanh: gelu's twin


# --------------------------------------------------------------------------- timing

def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def as_tuple(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


class Step:
    """A callable timed as one call, and the untimed work to do before the next one."""

    def __init__(self, call: Callable, reset: Optional[Callable] = None):
        self.call, self.reset = call, reset


def forward_step(fn: Callable, tensors: Sequence[torch.Tensor]) -> Step:
    return Step(lambda: fn(*tensors))


def backward_step(fn: Callable, leaves: Sequence[torch.Tensor]) -> Step:
    """fn(*leaves) then backward through all its outputs, with ones as their gradients."""
    outs = as_tuple(fn(*leaves))
    grads = [torch.ones_like(o) for o in outs]

    def call():
        torch.autograd.backward(as_tuple(fn(*leaves)), grads)

    def reset():
        for t in leaves:
            t.grad = None

    return Step(call, reset)


def time_steps(steps: dict[str, Step], iters: int, warmup: int, sync_every: int,
               device: torch.device) -> dict[str, list[float]]:
    """Per-call host microseconds of each step, measured in ROUNDS alternating blocks."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    for step in steps.values():
        for _ in range(warmup):
            step.call()
            if step.reset:
                step.reset()
    synchronize(device)
    per_block = max(1, -(-iters // ROUNDS))
    clock = time.perf_counter_ns
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(ROUNDS):
            for name, step in steps.items():
                out = times[name]
                for i in range(min(per_block, iters - len(out))):
                    if i % sync_every == 0:
                        synchronize(device)  # the queue never fills: no call waits for it
                    t0 = clock()
                    step.call()
                    t1 = clock()
                    out.append((t1 - t0) / 1e3)
                    if step.reset:
                        step.reset()
                synchronize(device)
    finally:
        if gc_was_enabled:
            gc.enable()
    return times


# --------------------------------------------------------------------------- one op

def make_tensors(calls: OpCalls, dtype: torch.dtype, device: torch.device,
                 requires_grad: bool) -> list[torch.Tensor]:
    return [t.requires_grad_(requires_grad) for t in calls.case.make_inputs(calls.shape, dtype, device)]


def measure_op(calls: OpCalls, dtype, device, iters: int, warmup: int,
               sync_every: int) -> list[dict]:
    torch.manual_seed(0)
    plain = make_tensors(calls, dtype, device, requires_grad=False)
    leaves = make_tensors(calls, dtype, device, requires_grad=True)
    pairs = {
        "fwd": (forward_step(calls.case.avo, plain), forward_step(calls.case.eager, plain)),
        "fwd_api": (forward_step(calls.avo_api, plain), forward_step(calls.case.eager, plain)),
        "fwd_bwd": (backward_step(calls.avo_api, leaves),
                    backward_step(calls.case.eager, leaves)),
    }
    if calls.op in ATEN_CALLS:
        pairs["fwd_ops"] = (forward_step(calls.case.avo, plain),
                            forward_step(ATEN_CALLS[calls.op], plain))
    rows = []
    for mode, (avo_step, torch_step) in pairs.items():
        times = time_steps({"avo": avo_step, "torch": torch_step}, iters, warmup, sync_every,
                           device)
        avo_us, torch_us = statistics.median(times["avo"]), statistics.median(times["torch"])
        rows.append({
            "op": calls.op, "mode": mode, "shape": list(calls.shape),
            "avo_us": round(avo_us, 2), "torch_us": round(torch_us, 2),
            "avo_min_us": round(min(times["avo"]), 2),
            "torch_min_us": round(min(times["torch"]), 2),
            "ratio": round(avo_us / torch_us, 3),
        })
    return rows


# --------------------------------------------------------------------------- reports

HEADER = ["op", "mode", "shape", "avo us", "torch us", "avo/torch"]


def table_rows(rows: Sequence[dict]) -> list[list[str]]:
    return [[r["op"], r["mode"], "x".join(map(str, r["shape"])), f"{r['avo_us']:.1f}",
             f"{r['torch_us']:.1f}", f"{r['ratio']:.2f}"] for r in rows]


def text_table(rows: Sequence[dict]) -> str:
    return bench_report.aligned_columns([HEADER] + table_rows(rows), numbers_from=3)


def markdown_report(meta: dict, rows: Sequence[dict]) -> str:
    over = [f"{r['op']} {r['mode']}" for r in rows if r["ratio"] > 1.0]
    lines = [
        f"# avo_ops host overhead — {meta['device_name']}",
        "",
        f"{meta['date']}; torch {meta['torch']}, Python {meta['python']}; device "
        f"{meta['device']}, dtype {meta['dtype']}; median of {meta['iters']} calls per cell.",
        "Host time of one call (wall time of the call itself; on CUDA the kernels run "
        "asynchronously). fwd: torch.ops.avo.<op> vs the torch call; fwd_api: avo_ops.<op> "
        "vs the torch call; fwd_bwd: avo_ops.<op> with inputs requiring grad plus "
        ".backward(), vs the torch call plus .backward(); fwd_ops: torch.ops.avo.<op> vs "
        "torch.ops.aten.<op>, where torch has the op as one aten op.",
        "",
        f"Command: `{meta['command']}`",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
    ]
    lines += ["| " + " | ".join(r) + " |" for r in table_rows(rows)]
    lines += ["", ("avo costs more host time than torch for: " + ", ".join(over) + ".")
              if over else "avo costs no more host time than torch in every row."]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- CLI

def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Host time of one avo call on a 1x1024 tensor "
                                            "vs the corresponding torch call.")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    p.add_argument("--ops", help="comma-separated op names (default: all)")
    p.add_argument("--iters", type=int, default=2000,
                   help="timed calls per implementation and mode (default 2000)")
    p.add_argument("--warmup", type=int, default=200, help="untimed calls first (default 200)")
    p.add_argument("--sync-every", type=int, default=100,
                   help="synchronize the device every this many calls (default 100)")
    p.add_argument("--out", metavar="DIR",
                   help="write DIR/host_overhead.json and DIR/host_overhead.md")
    args = p.parse_args(argv)
    if args.iters < 1 or args.warmup < 0 or args.sync_every < 1:
        p.error("--iters and --sync-every must be >= 1, --warmup >= 0")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device; pass --device cpu to measure on the CPU")
        return 1
    table = op_table()
    known = [c.op for c in table]
    ops = known if args.ops is None else [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = set(ops) - set(known)
    if unknown:
        print(f"unknown op(s) {sorted(unknown)}; known: {known}", file=sys.stderr)
        return 2
    dtype = DTYPES[args.dtype]
    rows = []
    threads = torch.get_num_threads()
    if device.type == "cpu":
        # One intra-op thread: this measures call overhead, and thread wake-ups on a busy
        # machine would only add noise.
        torch.set_num_threads(1)
    try:
        for calls in table:
            if calls.op in ops:
                rows += measure_op(calls, dtype, device, args.iters, args.warmup,
                                   args.sync_every)
                print(f"{calls.op}: done", file=sys.stderr, flush=True)
    finally:
        torch.set_num_threads(threads)
    meta = {
        "device": str(device),
        "device_name": (torch.cuda.get_device_name(device) if device.type == "cuda"
                        else platform.processor() or platform.machine()),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "dtype": args.dtype,
        "iters": args.iters,
        "warmup": args.warmup,
        "sync_every": args.sync_every,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable, *sys.argv]),
    }
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "host_overhead.json"), "w") as f:
            f.write(bench_report.results_json({**meta, "rows": rows}))
        with open(os.path.join(args.out, "host_overhead.md"), "w") as f:
            f.write(markdown_report(meta, rows))
        print(f"wrote {args.out}/host_overhead.json and host_overhead.md", file=sys.stderr)
    print(text_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

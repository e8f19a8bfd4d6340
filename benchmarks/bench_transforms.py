#!/usr/bin/env python3
"""The ops under torch.func's transforms and in a double backward, against the torch calls
they replace under the same transforms.

There the outputs come from the kernels and their derivatives from the op's math run as
ATen operations (math_in_aten in csrc/generated/autograd.cpp), so these calls cost more
than the plain forward and backward: this measures how much, for every op's forward case
of bench_cases.py (the torch calls: F.gelu, F.layer_norm, torch.softmax, ...), in modes

    fwd       the call alone (for scale)
    jvp       torch.func.jvp with a tangent for every tensor input
    vjp       torch.func.vjp, then its pullback of one cotangent per output
    double    torch.autograd.grad of sum(y * g) with create_graph=True, then backward of
              the squared gradient (a gradient penalty)
    vmap      torch.func.vmap over the per-element inputs as 8 samples of rows / 8 rows
              (channel_norm: of B / 8 batches), the parameters unbatched

Each is the median wall time of --reps calls, the device synchronized before and after
each (so GPU time is included), avo and torch alternating in blocks of ten.

Usage:
    python benchmarks/bench_transforms.py [--device cpu|cuda] [--ops layernorm,gelu]
        [--modes fwd,jvp,vjp,double,vmap] [--dtype fp32|bf16|fp16] [--rows 4096] [--row-length 1024]
        [--reps 30] [--threads N] [--markdown PATH]
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_cases  # noqa: E402  (the ops' calls and inputs)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
MODES = ("fwd", "jvp", "vjp", "double", "vmap")
SAMPLES = 8
BLOCK = 10


def _tuple(value):
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def mode_call(mode: str, fn, inputs: tuple[torch.Tensor, ...]):
    """A no-argument callable running `fn` on `inputs` under `mode`; its tangents and
    cotangents are made once, outside the timing."""
    if mode == "fwd":
        return lambda: fn(*inputs)
    if mode == "vmap":  # the tensors shaped like the first are per element; the others are parameters
        dims = tuple(0 if t.shape == inputs[0].shape else None for t in inputs)
        batched = tuple(t.reshape((SAMPLES, -1) + tuple(t.shape[1:])) if d == 0 else t for t, d in zip(inputs, dims))
        vmapped = torch.func.vmap(fn, in_dims=dims)
        return lambda: vmapped(*batched)
    if mode == "jvp":
        tangents = tuple(torch.randn_like(t) for t in inputs)
        return lambda: torch.func.jvp(fn, inputs, tangents)
    cotangents = tuple(torch.randn_like(o) for o in _tuple(fn(*inputs)))
    if mode == "vjp":
        def vjp():
            outputs, pullback = torch.func.vjp(fn, *inputs)
            return pullback(cotangents if isinstance(outputs, tuple) else cotangents[0])
        return vjp
    leaves = tuple(t.detach().requires_grad_() for t in inputs)

    def double():
        outputs = _tuple(fn(*leaves))
        loss = sum((o * g).sum() for o, g in zip(outputs, cotangents))
        (grad_x,) = torch.autograd.grad(loss, leaves[0], create_graph=True)
        return torch.autograd.grad((grad_x * grad_x).sum(), leaves, allow_unused=True)
    return double


def median_ms(calls: dict[str, object], reps: int, device: torch.device) -> dict[str, float]:
    """Median milliseconds of each call, timed in alternating blocks."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {name: [] for name in calls}
    for call in calls.values():  # warm-up (and first-call costs) outside the timing
        for _ in range(3):
            call()
    while min(len(t) for t in times.values()) < reps:
        for name, call in calls.items():
            for _ in range(BLOCK):
                sync()
                start = time.perf_counter()
                call()
                sync()
                times[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(t[:reps]) for name, t in times.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--ops", help="comma-separated op names (default: all but gelu_tanh)")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    p.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--row-length", type=int, default=1024)
    p.add_argument("--reps", type=int, default=30, help="timed calls per implementation and mode (default 30)")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--markdown", metavar="PATH", help="write the table as Markdown")
    args = p.parse_args(argv)

    import avo_ops  # noqa: F401  (registers torch.ops.avo)

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    ops = args.ops.split(",") if args.ops else [op for op in bench_cases.op_names() if op != "gelu_tanh"]
    unknown = sorted(set(ops) - set(bench_cases.op_names()))
    modes = args.modes.split(",")
    if unknown or not set(modes) <= set(MODES):
        p.error(f"known ops: {', '.join(bench_cases.op_names())}; known modes: {', '.join(MODES)}")
    dtype = DTYPES[args.dtype]
    rows = []
    for op in ops:
        case = bench_cases.find_case(op, "fwd")
        torch.manual_seed(0)
        inputs = case.make_inputs(case.layout((args.rows, args.row_length)), dtype, device)
        for mode in modes:
            ms = median_ms({"avo": mode_call(mode, case.avo, inputs), "torch": mode_call(mode, case.eager, inputs)},
                           args.reps, device)
            rows.append((op, mode, ms["avo"], ms["torch"]))
            print(f"{op:16s} {mode:7s} avo {ms['avo']:8.2f} ms  torch {ms['torch']:8.2f} ms  "
                  f"avo/torch {ms['avo'] / ms['torch']:5.2f}", file=sys.stderr)

    table = ("| op | mode | avo ms | torch ms | avo / torch |\n|---|---|---:|---:|---:|\n"
             + "".join(f"| {op} | {mode} | {a:.2f} | {t:.2f} | {a / t:.2f} |\n" for op, mode, a, t in rows))
    print(table)
    if args.markdown:
        where = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or "CPU")
        with open(args.markdown, "w") as f:
            f.write(f"avo under torch.func transforms and double backward against torch, "
                    f"{datetime.date.today().isoformat()}, {where}, torch {torch.__version__}, {args.dtype}, "
                    f"{args.rows} x {args.row_length}, {torch.get_num_threads()} threads.\n\n"
                    f"`{' '.join(['python', *sys.argv])}`\n\n{table}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The CPU kernels against torch's own CPU kernels: every op of bench_cases.py, forward and
backward, on one shape.

Each case is timed as the median wall time of --reps calls (CPU calls return when their
work is done), avo and torch eager alternating in blocks so that slow drifts of the
machine affect both alike: bench_host_overhead.py's timing (time_steps), on the CPU. The
copy bandwidth of the machine (a float32 tensor copied into another, as many bytes as
a case's traffic, at most 256 MiB) is measured in the same run, and each result is given
as GB/s and as a fraction of it. The ops allocate their outputs in every call, as torch's
do; the copy writes into memory allocated once. The inputs of the default shape (4096 x 1024) are 16 MiB
in float32 per tensor: larger than the last-level cache of a small machine, not of a large
server's; pass --rows for more.

The kernels are compiled for several instruction sets (AVX-512, AVX2, the x86-64 baseline;
csrc/include/avo/cpu_copies.h) and a call runs the best the machine has: --cpu-copies all
times each copy the machine can run instead (or a comma-separated list of them), each
against the same torch calls, alternating with them.

Usage:
    python benchmarks/bench_cpu.py [--ops gelu,layernorm] [--dtypes fp32,bf16] [--rows 4096]
        [--row-length 1024] [--reps 50] [--threads N] [--cpu-copies all|avx512,avx2,baseline]
        [--json PATH] [--markdown PATH]
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_cases  # noqa: E402  (the ops' calls, inputs and traffic)
import bench_host_overhead  # noqa: E402  (its alternating-block timing)
import bench_report  # noqa: E402  (its JSON layout)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
CPU = torch.device("cpu")
WARMUP = 3


def median_seconds(steps: dict[str, bench_host_overhead.Step], reps: int) -> dict[str, float]:
    """Median seconds of each step, timed in alternating blocks."""
    times = bench_host_overhead.time_steps(steps, reps, WARMUP, sync_every=reps, device=CPU)
    return {name: statistics.median(us) / 1e6 for name, us in times.items()}


def copy_gbps(nbytes: int, reps: int) -> float:
    """GB/s of copying a float32 tensor into another, nbytes read and written in all (into
    memory already mapped: a fresh output's page faults would be timed too, and they vary
    from call to call more than the copy does)."""
    x = torch.empty(max(1, min(nbytes, 256 << 20) // 2 // 4), dtype=torch.float32).normal_()
    y = torch.empty_like(x)
    seconds = median_seconds({"copy": bench_host_overhead.Step(lambda: y.copy_(x))}, reps)["copy"]
    return 2 * x.numel() * 4 / seconds / 1e9


def on_copy(copy: str, fn):
    """fn run on one copy of the CPU kernels (then back to the best)."""
    from avo_ops import _C

    def call(*tensors):
        _C.set_cpu_copy(copy)
        try:
            return fn(*tensors)
        finally:
            _C.set_cpu_copy("auto")
    return call


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", help="comma-separated op names (default: all but gelu_tanh)")
    p.add_argument("--dirs", default="fwd,bwd", help="fwd, bwd or both (default: fwd,bwd)")
    p.add_argument("--dtypes", default="fp32,bf16", help="comma-separated (default: fp32,bf16)")
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--row-length", type=int, default=1024)
    p.add_argument("--reps", type=int, default=50, help="timed calls per implementation (default 50)")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--cpu-copies", default="auto",
                   help="copies of the CPU kernels to time: 'auto' (the one calls run, default), 'all' (each one "
                        "this machine runs) or a comma-separated list of avx512, avx2, baseline")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")
    p.add_argument("--markdown", metavar="PATH", help="write the table as Markdown")
    args = p.parse_args(argv)

    import avo_ops  # noqa: F401  (registers torch.ops.avo)
    from avo_ops import _C

    available = _C.cpu_copies()
    if args.cpu_copies == "auto":
        copies = [_C.cpu_copy()]
    elif args.cpu_copies == "all":
        copies = available
    else:
        copies = args.cpu_copies.split(",")
        missing = [c for c in copies if c not in available]
        if missing:
            p.error(f"--cpu-copies: this build and machine do not run {', '.join(missing)}; they run "
                    f"{', '.join(available)}")

    if args.threads:
        torch.set_num_threads(args.threads)
    ops = args.ops.split(",") if args.ops else [op for op in bench_cases.op_names() if op != "gelu_tanh"]
    unknown = sorted(set(ops) - set(bench_cases.op_names()))
    if unknown:
        p.error(f"unknown op(s) {', '.join(unknown)}; known: {', '.join(bench_cases.op_names())}")
    cases = bench_cases.select(ops, args.dirs.split(","))
    dtypes = args.dtypes.split(",")
    shape = (args.rows, args.row_length)

    copy = copy_gbps(4 * args.rows * args.row_length * 2, args.reps)
    print(f"threads {torch.get_num_threads()}, shape {shape}, copy {copy:.1f} GB/s, CPU kernels' copies "
          f"{', '.join(copies)}", file=sys.stderr)
    rows = []
    total = len(cases) * len(dtypes) * len(copies)
    for i, case in enumerate(cases):
        for dtype_name in dtypes:
            dtype = DTYPES[dtype_name]
            layout = case.layout(shape)
            torch.manual_seed(0)
            inputs = case.make_inputs(layout, dtype, CPU)
            steps = {c: bench_host_overhead.forward_step(on_copy(c, case.avo), inputs) for c in copies}
            seconds = median_seconds({**steps, "torch": bench_host_overhead.forward_step(case.eager, inputs)},
                                     args.reps)
            torch_s = seconds["torch"]
            nbytes = case.nbytes(layout, dtype)
            for c in copies:
                avo_s = seconds[c]
                row = {"op": case.op, "dir": case.direction, "dtype": dtype_name, "shape": list(layout), "copy": c,
                       "avo_ms": avo_s * 1e3, "torch_ms": torch_s * 1e3, "avo_over_torch": avo_s / torch_s,
                       "avo_gbps": nbytes / avo_s / 1e9, "avo_frac_copy": nbytes / avo_s / 1e9 / copy}
                rows.append(row)
                print(f"[{len(rows)}/{total}] {case.label:22s} {dtype_name} {c:8s}  avo {row['avo_ms']:7.2f} ms  "
                      f"torch {row['torch_ms']:7.2f} ms  avo/torch {row['avo_over_torch']:5.2f}", file=sys.stderr)

    header = ("| op | dir | dtype | copy | avo ms | torch ms | avo / torch | avo GB/s | of copy |\n"
              "|---|---|---|---|---:|---:|---:|---:|---:|\n")
    table = header + "".join(
        f"| {r['op']} | {r['dir']} | {r['dtype']} | {r['copy']} | {r['avo_ms']:.2f} | {r['torch_ms']:.2f} | "
        f"{r['avo_over_torch']:.2f} | {r['avo_gbps']:.1f} | {r['avo_frac_copy']:.2f} |\n" for r in rows)
    print(table)
    meta = {"date": datetime.date.today().isoformat(), "torch": torch.__version__, "python": platform.python_version(),
            "machine": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
            "copy_gbps": copy, "reps": args.reps, "cpu_copies": copies, "command": " ".join(["python", *sys.argv])}
    if args.json:
        with open(args.json, "w") as f:
            f.write(bench_report.results_json({**meta, "rows": rows}))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(f"CPU kernels against torch's, {meta['date']}, torch {meta['torch']}, "
                    f"{meta['threads']} threads, copy {copy:.1f} GB/s.\n\n`{meta['command']}`\n\n{table}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

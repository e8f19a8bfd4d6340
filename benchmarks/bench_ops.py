#!/usr/bin/env python3
"""Memory-bandwidth benchmark of avo ops against torch eager, torch.compile and Liger-Kernel.

One command runs the sweep: every op (bench_cases.py), forward and backward, in bf16, fp16
and fp32, over row lengths N = 256, 1024, ..., 262144 (powers of 4), each with as many
rows as fit in 2^26 elements, so that every input is far larger than the L2 cache:

    python benchmarks/bench_ops.py --out results/          # results.json, results.md, plots/

For each case it measures up to four implementations:

    avo      torch.ops.avo.<op> (or <op>_backward for "bwd")
    eager    the torch eager reference; for "bwd" the aten backward kernels torch's autograd
             runs, fed the statistics its forward would have saved (bench_cases.py)
    compile  torch.compile(fullgraph=True, dynamic=False) of the eager reference, compiled
             afresh for every case
    liger    Liger-Kernel, for the ops it has (liger_baselines.py); for "bwd" only its
             backward, fed what its forward saves. Optional: without liger-kernel one notice
             is printed and the column stays empty.

Bandwidth = minimal bytes (each input read once, each output written once) / median time.
A device-to-device copy is measured in the same run and every result is also reported as
a fraction of the copy bandwidth (see DESIGN.md, "Measuring").

Timing: CUDA events around each call, warm-up first, median over many repetitions.
Inputs rotate among enough distinct buffers that the rotation's working set is several
times the L2 cache, so every timed call reads cold data from HBM. Before each chunk of
timed calls the GPU is parked on a short spin kernel while the host queues the chunk,
so host launch overhead never shows up in the per-call times.

Shapes (the last dimension is the row length N; channel_norm lays R x N out as
[R/64, 64, N], see bench_cases.channel_layout):
    default          --row-lengths 256,1024,2048,4096,8192,16384,65536,262144 --elements 67108864
    --row-lengths    the N values of the sweep
    --elements E     rows = E // N for each N (default 2^26)
    --rows R         R rows for every N instead
    --shapes RxN,..  explicit shapes, instead of the sweep
    --quick          16384x4096 only, ops gelu, silu, layernorm, rmsnorm, softmax, dtypes
                     bf16, fp32 (each part only where not given explicitly)

Selection: --ops gelu,layernorm (default: every op but gelu_tanh, the tanh variant of
gelu, which runs the same kernels; name it to include it), --dirs fwd,bwd, --dtypes
bf16,fp16,fp32, --no-compile, --no-liger, --no-avo (only the baselines; no avo_ops needed).
Timing: --reps N (default 50), --warmup N (default 10).

Outputs: --out DIR writes DIR/results.json (GPU, versions, the avo_ops commit (--commit
LABEL, else `git describe` of the checkout), date, command, copy bandwidth, every
measurement with its median time, GB/s, fraction of copy and first-call time, and for a
row op the CUDA kernel version avo's call took), DIR/results.md (summary, the performance
targets and the rows that miss them, per-op tables) and DIR/plots/<op>_<dir>.png (GB/s
against row length, one line per implementation, one panel per dtype; needs matplotlib,
see requirements-bench.txt; --no-plots to skip). --json PATH and --markdown PATH write
those two files elsewhere. The JSON is rewritten after every case, so a killed run leaves
what it measured; on SIGTERM or Ctrl-C the run stops and writes all reports of the cases
done ("complete": false). `python benchmarks/bench_report.py DIR/results.json` redraws the
tables and plots from a saved JSON, without a GPU.

Progress: a tqdm bar on stderr counting cases and naming the current one, with one result
line per measurement above it; when stderr is not a terminal (a log), the same meter as one
line per case. --no-progress, or no tqdm installed: plain "[i/total] case" lines. The
summary table is printed last on stdout.

The default sweep is 480 cases (10 ops x 2 directions x 3 dtypes x 8 row lengths); its time
goes mostly to compiling: torch.compile (about a second per row-op case) and Liger's Triton
JIT. --no-compile, --no-liger, fewer --dtypes or --ops cut it down.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

import bench_cases
import bench_report
from bench_cases import Case, Shape, op_names

Tensor = torch.Tensor

DEFAULT_ROW_LENGTHS = [256, 1024, 2048, 4096, 8192, 16384, 65536, 262144]
DEFAULT_ELEMENTS = 1 << 26   # 128 MiB in bf16: every tensor is twice the H200's 60 MiB L2
DEFAULT_DTYPES = ["bf16", "fp16", "fp32"]
DEFAULT_OPS = [op for op in op_names() if op != "gelu_tanh"]
QUICK_SHAPES = ["16384x4096"]
QUICK_OPS = ["gelu", "silu", "layernorm", "rmsnorm", "softmax"]
QUICK_DTYPES = ["bf16", "fp32"]
# The row-kernel versions a run can force (avo_ops._C.set_row_version; besides "auto").
ROW_VERSIONS = ("register", "pipelined", "wide", "narrow", "staged", "cluster", "global", "tiled")
DEFAULT_REPS = 50        # the median of 50 is stable to well under 1% on these sizes
COPY_SIZES_MIB = [512, 2048]
FALLBACK_L2_BYTES = 64 << 20
L2_MULTIPLE = 3          # rotation working set >= this many L2 caches
MAX_ROTATION_MEM = 0.25  # ... but at most this fraction of free device memory
CHUNK = 25               # timed calls queued behind one spin kernel
DEVICE = "cuda"

DTYPES = {
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
}
SHORT_DTYPE = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
IMPLS = bench_report.IMPLS  # ("avo", "eager", "compile", "liger")


# --------------------------------------------------------------------------- the plan

@dataclass(frozen=True)
class Planned:
    """One case of the run: an op and direction on one input shape and dtype."""

    case: Case
    dtype: torch.dtype
    shape: Shape  # the input shape, after the case's layout

    @property
    def nbytes(self) -> int:
        return self.case.nbytes(self.shape, self.dtype)

    @property
    def row_length(self) -> int:
        return self.shape[-1]

    @property
    def rows(self) -> int:
        return math.prod(self.shape) // self.shape[-1]

    @property
    def label(self) -> str:
        return f"{self.case.label} {SHORT_DTYPE[self.dtype]} {fmt_shape(self.shape)}"


def sweep_shapes(row_lengths: Sequence[int], elements: int = DEFAULT_ELEMENTS,
                 rows: Optional[int] = None) -> list[Shape]:
    """R x N for each row length N: R = `rows` if given, else as many rows as fit in
    `elements` (at least one)."""
    return [(rows if rows else max(1, elements // n), n) for n in row_lengths]


def plan_cases(args: argparse.Namespace) -> list[Planned]:
    """Every case of the run, in the order it runs: op, direction, dtype, shape."""
    return [Planned(case, dtype, case.layout(shape))
            for case in bench_cases.select(args.ops, args.dirs)
            for dtype in args.dtypes
            for shape in args.shapes]


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

    def measure(self, fn: Callable, arg_sets: Sequence[Sequence]) -> list[float]:
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
    def _timed_call(fn: Callable, args: Sequence):
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


def input_sets(case: Case, shape: Shape, dtype: torch.dtype) -> list[tuple]:
    """The case's inputs for `shape` (seeded), and as many more distinct sets as
    rotation_count asks for; the first set is the one results are checked on."""
    torch.manual_seed(0)
    device = torch.device(DEVICE)
    probe = case.make_inputs(shape, dtype, device)
    count = rotation_count(sum(t.numel() * t.element_size() for t in probe))
    return [probe] + [case.make_inputs(shape, dtype, device) for _ in range(count - 1)]


# --------------------------------------------------------------------------- copy bandwidth

def measure_copy(timer: Timer) -> list[dict]:
    results = []
    for mib in COPY_SIZES_MIB:
        size = mib << 20
        if 2 * size > 0.8 * free_bytes():
            log(f"copy {mib} MiB: skipped (not enough free device memory)")
            continue
        src = torch.ones(size, dtype=torch.uint8, device=DEVICE)
        dst = torch.empty_like(src)
        times = timer.measure(lambda d, s: d.copy_(s), [(dst, src)])
        stats = summarize(times, 2 * size, None)
        stats.pop("frac_copy")
        results.append({"size_mib": mib, **stats})
        log(f"copy {mib} MiB: {stats['gbps']:.0f} GB/s")
        del src, dst
        torch.cuda.empty_cache()
    return results


# --------------------------------------------------------------------------- implementations

@dataclass(frozen=True)
class Impl:
    """One implementation of a case. make() returns the callable (torch.compile happens
    there); prepare(*inputs), when given, turns the case's inputs into this
    implementation's arguments, once per input set and outside the timing."""

    name: str
    make: Callable[[], Callable]
    prepare: Optional[Callable] = None


def fresh_compile(fn: Callable) -> Callable:
    """torch.compile with a clean dynamo cache, so many shapes never hit recompile limits."""
    if hasattr(torch, "_dynamo"):
        torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, dynamic=False)


def case_impls(case: Case, names: Sequence[str], liger: dict) -> list[Impl]:
    impls = []
    for name in names:
        if name == "avo":
            impls.append(Impl("avo", lambda: case.avo))
        elif name == "eager":
            impls.append(Impl("eager", lambda: case.eager))
        elif name == "compile":
            impls.append(Impl("compile", lambda: fresh_compile(case.eager)))
        elif name == "liger" and (case.op, case.direction) in liger:
            li = liger[(case.op, case.direction)]
            impls.append(Impl("liger", lambda li=li: li.fn, li.prepare))
    return impls


def load_liger(notices: "Notices") -> dict:
    """Liger's implementations by (op, direction), or {} with a notice when it is absent."""
    import liger_baselines
    try:
        table = liger_baselines.load(bench_cases.LN_EPS, bench_cases.RMS_EPS)
    except Exception as exc:  # noqa: BLE001 - absent (ImportError) or failing to load
        notices.add(f"Liger-Kernel baseline skipped: {first_line(exc)} "
                    "(pip install liger-kernel to include it)")
        return {}
    log(f"Liger-Kernel {liger_baselines.version()}: baseline for "
        + ", ".join(sorted({f'{op}.{d}' for op, d in table})))
    return table


# --------------------------------------------------------------------------- one case

def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def as_list(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def compare(out, ref_out, dtype: torch.dtype) -> dict:
    """Loose sanity check that an implementation computes what the eager reference computes.

    Ops with several outputs (most backwards) are compared output by output. Outputs
    smaller than the first (parameter gradients: sums over all R rows) get an absolute
    tolerance scaled by their largest magnitude, since summation order differs."""
    tol = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 4e-2}[dtype]
    outs, refs = as_list(out), as_list(ref_out)
    if len(outs) != len(refs):
        return {"ok": False, "max_abs_diff": None,
                "error": f"{len(outs)} outputs vs {len(refs)} from eager"}
    per_output = []
    for a, r in zip(outs, refs):
        if a is None or a.shape != r.shape:
            got = None if a is None else list(a.shape)
            per_output.append({"ok": False, "max_abs_diff": None,
                               "error": f"shape {got} vs {list(r.shape)}"})
            continue
        a, r = a.float(), r.float()
        atol = tol
        if r.numel() < refs[0].numel() and r.numel() > 0:
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


def check_notice(impl: str, planned: Planned, check: dict) -> str:
    bad = [str(i) for i, o in enumerate(check.get("outputs", [])) if not o["ok"]]
    diff = check["max_abs_diff"]
    return (f"{impl} output differs from eager for {planned.label} "
            + (f"(outputs {','.join(bad)}; " if bad else "(")
            + (f"max abs diff {diff:.3g})" if diff is not None
               else f"{check.get('error', 'mismatch')})"))


def bench_case(planned: Planned, impls: Sequence[Impl], timer: Timer, copy_gbps,
               notices: Notices) -> dict:
    case, dtype, shape = planned.case, planned.dtype, planned.shape
    row = {"op": case.op, "dir": case.direction, "shape": list(shape),
           "rows": planned.rows, "row_length": planned.row_length,
           "dtype": SHORT_DTYPE[dtype], "bytes": planned.nbytes, "buffers": None,
           "results": {}, "check": None, "kernel": None}
    try:
        arg_sets = input_sets(case, shape, dtype)
        probe, count = arg_sets[0], len(arg_sets)
    except Exception as exc:  # noqa: BLE001 - e.g. out of memory: report, keep going
        row["error"] = first_line(exc)
        notices.add(f"{planned.label} skipped: {row['error']}")
        torch.cuda.empty_cache()
        return row
    row["buffers"] = count

    try:
        reference = case.eager(*probe)  # what avo and Liger are checked against
    except Exception as exc:  # noqa: BLE001 - reported by the checks (and by eager's timing)
        reference = exc

    for impl in impls:
        tag = f"{planned.label} {impl.name}"
        try:
            stats, out = measure_impl(impl, probe, arg_sets, planned.nbytes, timer, copy_gbps)
            log(f"{tag}: {stats['gbps']:.0f} GB/s ({stats['median_us']:.1f} us, "
                f"{count} buffers)")
            if impl.name == "avo":
                row["kernel"] = avo_kernel(case)
            if impl.name in ("avo", "liger"):
                stats["check"] = check_against(reference, out, dtype)
                if not stats["check"]["ok"]:
                    notices.add(check_notice(impl.name, planned, stats["check"]))
            del out
        except Exception as exc:  # noqa: BLE001 - report and keep benchmarking
            stats = {"error": first_line(exc)}
            notices.add(f"{impl.name} unavailable for {case.label}: {stats['error']}")
            log(f"{tag}: unavailable")
        row["results"][impl.name] = stats
    row["check"] = row["results"].get("avo", {}).pop("check", None)
    row["speedup_vs_best_other"] = bench_report.speedup(row["results"])
    del arg_sets, probe, reference
    torch.cuda.empty_cache()
    return row


def avo_kernel(case: Case) -> Optional[str]:
    """The CUDA kernel version avo's last call of a row op took ("register", "cluster 256",
    "cluster 128 prefetch", "tiled one", "narrow fixed 16", ...: the row version, with a
    cluster row's block threads and whether it prefetched its rows, the tiled version's
    kernels, and the group width of a register or narrow rows' kernel compiled for it);
    None for the elementwise ops, which have no row versions."""
    if case.op in bench_report.ELEMENTWISE_OPS:
        return None
    import avo_ops  # loaded already: its call just ran
    ext = avo_ops._C
    version = ext.last_row_version()
    if version == "cluster":
        prefetch = " prefetch" if ext.last_row_prefetch() == "on" else ""
        return f"cluster {ext.last_cluster_block_threads()}{prefetch}"
    if version == "tiled":
        return f"tiled {ext.last_tiled_kernels()}"
    fixed = ext.last_fixed_group_threads()
    return f"{version} fixed {fixed}" if fixed else version


def measure_impl(impl: Impl, probe, arg_sets, nbytes: int, timer: Timer, copy_gbps):
    """(stats, output of the first call). The first call compiles or JITs; its wall time,
    synchronized, is kept as first_call_s."""
    t0 = time.perf_counter()
    fn = impl.make()
    first_args = impl.prepare(*probe) if impl.prepare else probe
    out = fn(*first_args)
    torch.cuda.synchronize()
    first_call_s = time.perf_counter() - t0
    sets = [impl.prepare(*s) for s in arg_sets] if impl.prepare else arg_sets
    stats = summarize(timer.measure(fn, sets), nbytes, copy_gbps)
    stats["first_call_s"] = round(first_call_s, 3)
    return stats, out


def check_against(reference, out, dtype) -> dict:
    """compare() of out with the eager output, or the reason there is none."""
    if isinstance(reference, Exception):
        return {"ok": False, "max_abs_diff": None,
                "error": f"no eager reference: {first_line(reference)}"}
    try:
        return compare(out, reference, dtype)
    except Exception as exc:  # noqa: BLE001 - e.g. outputs of an unexpected kind
        return {"ok": False, "max_abs_diff": None, "error": first_line(exc)}


# --------------------------------------------------------------------------- progress

class Progress:
    """Counts cases on stderr with tqdm. On a terminal: a bar naming the current case, with
    the log lines written above it. Otherwise (a log file, a pipe): the same tqdm meter as
    one line per case, so the log stays readable. Without tqdm: "[i/total] case" lines."""

    def __init__(self, total: int, enabled: bool = True):
        self.total, self.done = total, 0
        self.started = time.perf_counter()
        self.bar = self.meter = None
        if not enabled:
            return
        try:
            from tqdm import tqdm
        except ImportError:
            log("tqdm is not installed: progress as plain lines (pip install tqdm)")
            return
        if sys.stderr.isatty():
            self.bar = tqdm(total=total, unit="case", file=sys.stderr, dynamic_ncols=True)
        else:
            self.meter = tqdm.format_meter

    def start(self, planned: Planned) -> None:
        text = (f"{planned.case.label} {SHORT_DTYPE[planned.dtype]} "
                f"N={planned.row_length} ({fmt_shape(planned.shape)})")
        if self.bar is not None:
            self.bar.set_description_str(text)
        elif self.meter is not None:
            log(self.meter(self.done, self.total, time.perf_counter() - self.started,
                           prefix=text, unit="case"))
        else:
            log(f"[{self.done + 1}/{self.total}] {text}")

    def advance(self) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)

    def write(self, message: str) -> None:
        if self.bar is not None:
            self.bar.write(message, file=sys.stderr)
        else:
            print(message, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


_progress: Optional[Progress] = None


def log(message: str) -> None:
    if _progress is not None:
        _progress.write(message)
    else:
        print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- CLI

def fmt_shape(shape: Sequence[int]) -> str:
    return "x".join(str(s) for s in shape)


def parse_shape(text: str) -> Shape:
    try:
        shape = tuple(int(p) for p in text.lower().replace("×", "x").split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"bad shape {text!r}; expected e.g. 16384x4096") from None
    if not shape or min(shape) <= 0:
        raise argparse.ArgumentTypeError(f"bad shape {text!r}")
    return shape


def split_list(text: Optional[str]) -> Optional[list[str]]:
    return None if text is None else [p.strip() for p in text.split(",") if p.strip()]


def positive_ints(p: argparse.ArgumentParser, text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in split_list(text)]
    except ValueError:
        p.error(f"{what} takes comma-separated integers, got {text!r}")
    if not values or min(values) <= 0:
        p.error(f"{what} takes positive integers, got {text!r}")
    return values


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Bandwidth of avo ops vs torch eager, torch.compile and Liger-Kernel "
                    "(CUDA only), swept over row lengths.",
        epilog=f"ops: {', '.join(op_names())}. dtypes: bf16, fp16, fp32. "
               "Progress goes to stderr; the summary table is printed last on stdout.")
    p.add_argument("--quick", action="store_true",
                   help=f"only {', '.join(QUICK_SHAPES)} (unless shapes are given), "
                        f"ops {','.join(QUICK_OPS)} (unless --ops is given), dtypes "
                        f"{','.join(QUICK_DTYPES)} (unless --dtypes is given)")
    p.add_argument("--ops", help="comma-separated op names (default: all but gelu_tanh)")
    p.add_argument("--dirs", default="fwd,bwd", help="fwd, bwd or both (default: fwd,bwd)")
    p.add_argument("--dtypes", help=f"comma-separated (default: {','.join(DEFAULT_DTYPES)})")
    p.add_argument("--row-lengths", metavar="N,...",
                   help="row lengths of the sweep (default: "
                        f"{','.join(map(str, DEFAULT_ROW_LENGTHS))})")
    p.add_argument("--elements", type=int, default=DEFAULT_ELEMENTS,
                   help="elements per input tensor: rows = elements // N "
                        f"(default {DEFAULT_ELEMENTS} = 2^{DEFAULT_ELEMENTS.bit_length() - 1})")
    p.add_argument("--rows", type=int, help="this many rows for every row length instead")
    p.add_argument("--shapes", metavar="RxN,...",
                   help="explicit shapes instead of the sweep, e.g. 16384x4096,4096x16384")
    p.add_argument("--reps", type=int, default=DEFAULT_REPS,
                   help=f"timed calls per result (default {DEFAULT_REPS})")
    p.add_argument("--warmup", type=int, default=10, help="untimed calls first (default 10)")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    p.add_argument("--no-liger", action="store_true", help="skip Liger-Kernel")
    p.add_argument("--no-avo", action="store_true",
                   help="benchmark only the baselines (no avo_ops needed)")
    p.add_argument("--row-version", choices=["auto", *ROW_VERSIONS], default="auto",
                   help="run every row op on this CUDA kernel version where the call can take it "
                        "(default: auto, the dispatch table's choice)")
    p.add_argument("--out", metavar="DIR",
                   help="write DIR/results.json, DIR/results.md and DIR/plots/*.png")
    p.add_argument("--json", metavar="PATH", help="write all results as JSON")
    p.add_argument("--markdown", metavar="PATH", help="write the summary as Markdown")
    p.add_argument("--no-plots", action="store_true", help="no PNG plots with --out")
    p.add_argument("--no-progress", action="store_true",
                   help="plain progress lines instead of a progress bar")
    p.add_argument("--commit", metavar="LABEL",
                   help="the avo_ops commit the results name (default: `git describe --always --dirty` of this "
                        "checkout; give it where the files are not the checkout's history, e.g. a copied tree)")
    args = p.parse_args(argv)

    args.ops = split_list(args.ops) or (QUICK_OPS if args.quick else DEFAULT_OPS)
    unknown = set(args.ops) - set(op_names())
    if unknown:
        p.error(f"unknown op(s) {sorted(unknown)}; known: {op_names()}")
    args.dirs = split_list(args.dirs)
    if not args.dirs or set(args.dirs) - {"fwd", "bwd"}:
        p.error("--dirs takes fwd, bwd or fwd,bwd")
    dtype_names = split_list(args.dtypes) or (QUICK_DTYPES if args.quick else DEFAULT_DTYPES)
    if set(dtype_names) - set(DTYPES):
        p.error(f"unknown dtype(s) in {dtype_names}; known: bf16, fp16, fp32")
    args.dtypes = list(dict.fromkeys(DTYPES[d] for d in dtype_names))
    if args.elements <= 0 or (args.rows is not None and args.rows <= 0):
        p.error("--elements and --rows must be positive")

    args.sweep_elements = None  # the element count the rows were chosen for, if they were
    if args.shapes is not None:
        try:
            args.shapes = [parse_shape(s) for s in split_list(args.shapes)]
        except argparse.ArgumentTypeError as exc:
            p.error(str(exc))
        if not args.shapes:
            p.error("--shapes is empty")
    elif args.quick and args.row_lengths is None and args.rows is None:
        args.shapes = [parse_shape(s) for s in QUICK_SHAPES]
    else:
        lengths = (positive_ints(p, args.row_lengths, "--row-lengths")
                   if args.row_lengths is not None else DEFAULT_ROW_LENGTHS)
        args.shapes = sweep_shapes(lengths, args.elements, args.rows)
        args.sweep_elements = None if args.rows else args.elements
    if args.reps < 1 or args.warmup < 0:
        p.error("--reps must be >= 1 and --warmup >= 0")
    return args


def import_avo() -> bool:
    try:
        import avo_ops  # noqa: F401  (loads the extension, registers torch.ops.avo.*)
    except Exception as exc:  # noqa: BLE001
        log(f"error: `import avo_ops` failed: {first_line(exc)}")
        log("Build/install the package first (pip install --no-build-isolation -e .), "
            "or pass --no-avo to benchmark only the baselines.")
        return False
    return True


def package_version(module: str) -> Optional[str]:
    try:
        return __import__(module).__version__
    except Exception:  # noqa: BLE001 - absent or broken: informational only
        return None


def git_commit() -> Optional[str]:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        out = subprocess.run(["git", "-C", root, "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=10)
    except Exception:  # noqa: BLE001
        return None
    return out.stdout.strip() or None


def run_meta(args, copy: list[dict], impls: Sequence[str], liger_used: bool) -> dict:
    """What the reports say about the machine, the software and the run."""
    import liger_baselines
    return {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": package_version("triton"),
        "liger": liger_baselines.version() if liger_used else None,
        "python": platform.python_version(),
        "avo_ops_commit": args.commit or git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable, *sys.argv]),
        "impls": list(impls),
        "reps": args.reps,
        "warmup": args.warmup,
        "elements": args.sweep_elements,
        "l2_bytes": l2_bytes(),
        "copy": copy,
        "copy_gbps": max((c["gbps"] for c in copy), default=None),
    }


def report_paths(args) -> tuple[Optional[str], Optional[str]]:
    """(JSON path, Markdown path): --json/--markdown, else the files in --out, else None."""
    json_path, md_path = args.json, args.markdown
    if args.out:
        json_path = json_path or os.path.join(args.out, "results.json")
        md_path = md_path or os.path.join(args.out, "results.md")
    return json_path, md_path


def save_json(path: str, results: dict) -> None:
    """Write via a temporary file, so a run killed mid-write leaves the previous version."""
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(path + ".tmp", "w") as f:
        f.write(bench_report.results_json(results))
    os.replace(path + ".tmp", path)


def write_reports(args, results: dict) -> None:
    json_path, md_path = report_paths(args)
    paths = []
    if json_path:
        save_json(json_path, results)
        paths.append(json_path)
    if md_path:
        if os.path.dirname(md_path):
            os.makedirs(os.path.dirname(md_path), exist_ok=True)
        with open(md_path, "w") as f:
            f.write(bench_report.markdown_report(results))
        paths.append(md_path)
    if args.out and not args.no_plots:
        try:
            paths += bench_report.plot_results(results, os.path.join(args.out, "plots"))
        except ImportError as exc:
            log(f"NOTICE: no plots: {first_line(exc)} (pip install -r requirements-bench.txt)")
    for path in paths:
        log(f"wrote {path}")


def _interrupt(signum, frame):
    raise KeyboardInterrupt  # SIGTERM (e.g. from `timeout`): stop and report what ran


def main(argv: Optional[Sequence[str]] = None) -> int:
    global _progress
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device; nothing to benchmark")
        return 0
    if not args.no_avo and not import_avo():
        return 1
    if not args.no_avo:
        import avo_ops
        avo_ops._C.set_row_version(args.row_version)
    start = time.perf_counter()
    notices = Notices()
    liger = {} if args.no_liger else load_liger(notices)
    names = [i for i in IMPLS if not (i == "avo" and args.no_avo)
             and not (i == "compile" and args.no_compile)
             and not (i == "liger" and not liger)]
    plan = plan_cases(args)
    log(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, L2 {l2_bytes() >> 20} MiB; "
        f"{len(plan)} cases ({', '.join(names)}), {args.reps} reps each")
    previous_handler = signal.signal(signal.SIGTERM, _interrupt)
    json_path, _ = report_paths(args)
    rows: list[dict] = []
    interrupted = False

    def results(complete: bool) -> dict:
        return {**meta, "complete": complete, "cases_planned": len(plan),
                "wall_s": round(time.perf_counter() - start, 1), "notices": notices.items,
                "rows": rows}

    with torch.no_grad():
        timer = Timer(args.reps, args.warmup)
        copy = measure_copy(timer)
        copy_gbps = max((c["gbps"] for c in copy), default=None)
        meta = run_meta(args, copy, names, bool(liger))
        _progress = Progress(len(plan), enabled=not args.no_progress)
        try:
            for planned in plan:
                _progress.start(planned)
                impls = case_impls(planned.case, names, liger)
                rows.append(bench_case(planned, impls, timer, copy_gbps, notices))
                _progress.advance()
                if json_path:  # a checkpoint: what ran survives a killed run
                    save_json(json_path, results(complete=False))
        except KeyboardInterrupt:
            interrupted = True
            notices.add(f"interrupted after {len(rows)} of {len(plan)} cases")
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the reports get written in full
            _progress.close()
            _progress = None

    final = results(complete=not interrupted)
    write_reports(args, final)
    log(f"{'stopped' if interrupted else 'done'} after {final['wall_s']:.0f} s (first calls, "
        f"i.e. compile and JIT: {bench_report.first_call_seconds(rows):.0f} s)")
    print(bench_report.copy_line(final))
    print(bench_report.text_table(final))
    signal.signal(signal.SIGTERM, previous_handler)
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Time the versions of the row kernels against each other on this GPU and write the
dispatch thresholds the build takes in: tuning/sm_<arch>.json.

    python benchmarks/tune_rows.py                  # writes tuning/sm_<arch>.json
    pip install --no-build-isolation -e .           # regenerates the .cu tables, rebuilds

For every row op (the ops of csrc/include/avo/row_cuda.cuh), kernel (forward, backward),
dtype (float16, bfloat16, float32) and row length N (powers of two from 256 to 32768, as
many rows as fit in --elements elements), it times torch.ops.avo.<op>[_backward] with
every call forced onto the register version and then onto the staged version
(avo_ops._C.set_row_version; a call that cannot take the forced version takes the table's
choice, so beyond the register limit both runs time the same kernel). Timing is
bench_ops.py's: CUDA events, median of --reps calls, inputs rotated beyond L2.

The threshold of (op, kernel, dtype) is the shortest row, in 16-byte vectors, from which
the staged version is faster by more than --margin at that length and no slower by more
than --margin at every longer one; null (never) when there is none. The file also keeps
every time measured, the GPU, the versions and the command.

Options: --ops, --dtypes, --row-lengths, --elements (default 2^26), --reps (default 30),
--margin (default 0.01), --out PATH (default tuning/sm_<arch>.json under the repository).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_cases  # noqa: E402
import bench_ops  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from generator.build import load_schedules  # noqa: E402

# The ops whose kernels are row kernels, from their specs.
ROW_OPS = [s.spec.name for s in load_schedules(ROOT, os.path.join(ROOT, "specs")) if s.pattern == "row"]
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
ROLES = {"fwd": "forward", "bwd": "backward"}
DEFAULT_LENGTHS = [256 << i for i in range(8)]  # 256 ... 32768


def time_version(avo_ops, case, shape, dtype, version: str, timer: bench_ops.Timer) -> float:
    """Median microseconds of one call of the avo kernel, forced onto `version`."""
    arg_sets = bench_ops.input_sets(case, shape, dtype)
    avo_ops._C.set_row_version(version)
    try:
        times = timer.measure(case.avo, arg_sets)
    finally:
        avo_ops._C.set_row_version("auto")
    del arg_sets
    torch.cuda.empty_cache()
    return sorted(times)[len(times) // 2]


def threshold(points: list[tuple[int, float, float]], margin: float) -> int | None:
    """points: (vectors, register us, staged us) by increasing length. The shortest length
    from which staged wins by more than `margin` there and loses by no more than `margin`
    at every longer length; None if no length qualifies."""
    best = None
    for i, (vectors, register, staged) in enumerate(points):
        if staged < register * (1 - margin) and all(s <= r * (1 + margin) for _, r, s in points[i:]):
            best = vectors
            break
    return best


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", default=",".join(ROW_OPS))
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--row-lengths", default=",".join(map(str, DEFAULT_LENGTHS)))
    p.add_argument("--elements", type=int, default=1 << 26)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--margin", type=float, default=0.01)
    p.add_argument("--out", help="default: tuning/sm_<arch>.json in the repository")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("tune_rows: no CUDA device", file=sys.stderr)
        return 1
    import avo_ops

    ops = [o for o in args.ops.split(",") if o]
    unknown = set(ops) - set(ROW_OPS)
    if unknown:
        p.error(f"not row ops: {sorted(unknown)}; row ops: {ROW_OPS}")
    dtypes = [d for d in args.dtypes.split(",") if d]
    if set(dtypes) - set(DTYPES):
        p.error(f"dtypes: {', '.join(DTYPES)}")
    lengths = sorted(int(n) for n in args.row_lengths.split(","))
    major, minor = torch.cuda.get_device_capability()
    arch = major * 10 + minor
    out = args.out or os.path.join(ROOT, "tuning", f"sm_{arch}.json")

    timer = bench_ops.Timer(args.reps, warmup=5)
    plan = [(op, d, dtype, n) for op in ops for d in ROLES for dtype in dtypes for n in lengths]
    measurements, table = [], {}
    with torch.no_grad():
        for i, (op, direction, dtype_name, n) in enumerate(plan, 1):
            case = bench_cases.find_case(op, direction)
            dtype = DTYPES[dtype_name]
            shape = case.layout((max(1, args.elements // n), n))
            times = {v: time_version(avo_ops, case, shape, dtype, v, timer) for v in ("register", "staged")}
            vectors = n * dtype.itemsize // 16
            measurements.append({"op": op, "kernel": ROLES[direction], "dtype": dtype_name, "row_length": n,
                                 "vectors": vectors, "shape": list(shape),
                                 "register_us": round(times["register"], 2), "staged_us": round(times["staged"], 2)})
            print(f"[{i}/{len(plan)}] {op}.{direction} {dtype_name} N={n}: register {times['register']:.1f} us, "
                  f"staged {times['staged']:.1f} us", file=sys.stderr, flush=True)
    for op in ops:
        for direction, role in ROLES.items():
            for dtype_name in dtypes:
                points = [(m["vectors"], m["register_us"], m["staged_us"]) for m in measurements
                          if (m["op"], m["kernel"], m["dtype"]) == (op, role, dtype_name)]
                table.setdefault(op, {}).setdefault(role, {})[dtype_name] = threshold(points, args.margin)
    result = {
        "arch": arch,
        "gpu": torch.cuda.get_device_name(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([os.path.basename(sys.executable), *sys.argv]),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "rule": f"staged from the shortest row where it is faster by more than {args.margin:.0%} and no "
                f"slower by more than {args.margin:.0%} at every longer row; null: never",
        "staged_min_vectors": table,
        "measurements": measurements,
    }
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(f"wrote {out}")
    for op, roles in table.items():
        for role, by_dtype in roles.items():
            print(f"  {op:16} {role:8} " + "  ".join(f"{d}: {v if v is not None else 'never'}"
                                                     for d, v in by_dtype.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

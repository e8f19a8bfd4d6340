#!/usr/bin/env python3
"""Compare avo's figures of two bench_ops.py runs (JSON), case by case.

    python benchmarks/compare_runs.py before.json after.json [--markdown PATH]

Each run's GB/s is divided by the copy bandwidth of that same run before comparing, so
two runs on machines of the same kind compare fairly. Prints, for every case the two
runs share, avo's fraction of copy in each and the ratio after / before (and, where the
runs recorded it, the row-kernel version avo's call took in each: "cluster 256 -> tiled
one" where it changed), then the geometric mean of that ratio per op and direction. No
GPU needed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_report import case_key, geomean  # noqa: E402


def run_rows(path: str) -> list[dict]:
    with open(path) as f:
        return json.load(f)["rows"]


def load_cases(path: str) -> dict[tuple, float]:
    """(op, dir, dtype, shape) -> avo's fraction of the run's copy bandwidth."""
    cases = {}
    for row in run_rows(path):
        avo = row.get("results", {}).get("avo")
        if avo and avo.get("frac_copy"):
            cases[case_key(row)] = avo["frac_copy"]
    return cases


def load_kernels(path: str) -> dict[tuple, str]:
    """(op, dir, dtype, shape) -> the row-kernel version avo's call took, for the cases
    whose run recorded one (bench_ops.avo_kernel)."""
    return {case_key(row): row["kernel"] for row in run_rows(path) if row.get("kernel")}


def kernel_cell(before: Optional[str], after: Optional[str]) -> str:
    if before == after:
        return before or "–"
    return f"{before or '–'} -> {after or '–'}"


def compare(before: dict[tuple, float], after: dict[tuple, float],
            kernels_before: Optional[dict[tuple, str]] = None,
            kernels_after: Optional[dict[tuple, str]] = None) -> list[str]:
    """The tables; with the kernels of either run (load_kernels), a column of them."""
    shared = [key for key in before if key in after]
    if not shared:
        return ["no case is in both runs"]
    kernels_before, kernels_after = kernels_before or {}, kernels_after or {}
    with_kernels = bool(kernels_before or kernels_after)
    lines = ["| op | dir | dtype | shape | before (of copy) | after (of copy) | after / before |"
             + (" avo kernel |" if with_kernels else ""),
             "|---|---|---|---|---|---|---|" + ("---|" if with_kernels else "")]
    per_op: dict[tuple, list[float]] = {}
    for key in shared:
        op, direction, dtype, shape = key
        ratio = after[key] / before[key]
        per_op.setdefault((op, direction), []).append(ratio)
        kernel = f" {kernel_cell(kernels_before.get(key), kernels_after.get(key))} |" if with_kernels else ""
        lines.append(f"| {op} | {direction} | {dtype} | {'x'.join(map(str, shape))} | {before[key]:.2f} | "
                     f"{after[key]:.2f} | {ratio:.3f} |{kernel}")
    lines += ["", "| op | dir | cases | after / before (geomean) | worst | best |", "|---|---|---|---|---|---|"]
    for (op, direction), ratios in per_op.items():
        lines.append(f"| {op} | {direction} | {len(ratios)} | {geomean(ratios):.3f} | {min(ratios):.3f} | "
                     f"{max(ratios):.3f} |")
    every = [r for ratios in per_op.values() for r in ratios]
    lines += ["", f"All {len(every)} cases: after / before {geomean(every):.3f} (geomean), "
                  f"{min(every):.3f} to {max(every):.3f}."]
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--markdown", metavar="PATH", help="also write the tables here")
    args = parser.parse_args(argv)
    lines = compare(load_cases(args.before), load_cases(args.after),
                    load_kernels(args.before), load_kernels(args.after))
    print("\n".join(lines))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python3
"""Merge bench_ops.py runs of different cases (JSON) into one results file.

    python benchmarks/merge_runs.py OUT.json RUN.json [RUN.json ...]

For a sweep split over several calls on one machine (say, the row ops with torch.compile
in one call and the elementwise ops in another, each under a time limit): the rows are
concatenated in the order of bench_cases.py, every row keeps the fractions of copy its own
run measured, and the copy measurements of every run are kept (`copy`, `merged_from`);
`copy_gbps` is their median. A case in two runs is an error. No GPU needed.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_cases import CASES  # noqa: E402
from bench_report import results_json  # noqa: E402

DTYPE_ORDER = ("bf16", "fp16", "fp32")


def case_key(row: dict) -> tuple:
    return row["op"], row["dir"], row["dtype"], tuple(row["shape"])


def merge(runs: list[dict], names: list[str]) -> dict:
    seen: dict[tuple, str] = {}
    rows = []
    for run, name in zip(runs, names):
        for row in run["rows"]:
            key = case_key(row)
            if key in seen:
                raise ValueError(f"{key} is in both {seen[key]} and {name}")
            seen[key] = name
            rows.append(row)
    order = {(c.op, c.direction): k for k, c in enumerate(CASES)}
    rows.sort(key=lambda r: (order.get((r["op"], r["dir"]), len(order)), DTYPE_ORDER.index(r["dtype"]),
                             r.get("row_length") or r["shape"][-1]))
    merged = dict(runs[0])
    merged.update(
        rows=rows,
        impls=list(dict.fromkeys(i for run in runs for i in run.get("impls", []))),
        copy=[c for run in runs for c in run.get("copy", [])],
        copy_gbps=statistics.median(run["copy_gbps"] for run in runs),
        command=" && ".join(run["command"] for run in runs),
        wall_s=sum(run.get("wall_s") or 0 for run in runs),
        notices=list(dict.fromkeys(n for run in runs for n in run.get("notices", []))),
        complete=all(run.get("complete", True) for run in runs),
        cases_planned=sum(run.get("cases_planned") or len(run["rows"]) for run in runs),
        merged_from=[{"file": name, "date": run.get("date"), "copy_gbps": run["copy_gbps"], "cases": len(run["rows"])}
                     for run, name in zip(runs, names)],
    )
    return merged


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("runs", nargs="+")
    args = parser.parse_args(argv)
    runs = []
    for path in args.runs:
        with open(path) as f:
            runs.append(json.load(f))
    merged = merge(runs, [os.path.basename(p) for p in args.runs])
    with open(args.out, "w") as f:
        f.write(results_json(merged))
    print(f"{args.out}: {len(merged['rows'])} cases from {len(runs)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

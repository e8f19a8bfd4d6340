#!/usr/bin/env python3
"""Tables and plots of bench_ops.py results; works from the saved JSON alone (no GPU, no
torch).

    python benchmarks/bench_report.py RESULTS.json [--out DIR] [--no-plots] [--baselines OTHER.json ...]

writes DIR/results.md and DIR/plots/<op>_<dir>.png (DIR defaults to the JSON's folder) and
prints the text table. The plots need matplotlib (requirements-bench.txt): GB/s against the
row length N on a log2 axis, one line per implementation, a dashed line at the device copy
bandwidth, one PNG per op and direction with one panel per dtype. Where several shapes of a
run share a row length, the plot keeps the one with the most elements.

--baselines takes the implementations this run did not measure (say torch.compile and
Liger, skipped to save time) from OTHER.json, a run of the same cases on the same GPU; the
report says which run they come from. Given several times, each run fills in what the
earlier ones left missing (say torch.compile from one run, Liger from an older one).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Optional, Sequence

IMPLS = ("avo", "eager", "compile", "liger")
ELEMENTWISE_OPS = ("gelu", "gelu_tanh", "silu")  # the other ops are norms and softmaxes
# The performance targets: forwards at this fraction of the copy bandwidth or more,
# backwards at this one, and no row more than this much slower than the best other.
FORWARD_TARGET, BACKWARD_TARGET, BEST_SLACK = 0.90, 0.80, 0.03
# The short rows of the by-length table: one block, group or warp holds such a row; longer
# rows take the cluster, global or tiled versions.
SHORT_ROWS = 16384
DTYPE_ORDER = ("bf16", "fp16", "fp32")
COLORS = {"avo": "tab:red", "eager": "tab:blue", "compile": "tab:green", "liger": "tab:orange"}


# --------------------------------------------------------------------------- saving

def results_json(results: dict) -> str:
    """A run's JSON with one case (a row of the sweep, a copy size) a line and the header one
    key a line: a quarter smaller than one value a line, and a diff of two runs shows the
    cases that changed."""
    lines = []
    for key, value in results.items():
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            items = ",\n".join(f"  {json.dumps(v)}" for v in value)
            text = f"[\n{items}\n ]"
        else:
            text = json.dumps(value)
        lines.append(f" {json.dumps(key)}: {text}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


# --------------------------------------------------------------------------- row helpers

def row_length(row: dict) -> int:
    return row.get("row_length") or row["shape"][-1]


def gbps(row: dict, impl: str) -> Optional[float]:
    return row["results"].get(impl, {}).get("gbps")


def speedup(results: dict) -> Optional[float]:
    """avo GB/s over the best other implementation's, or None."""
    avo = results.get("avo", {}).get("gbps")
    others = [r["gbps"] for k, r in results.items() if k != "avo" and r.get("gbps")]
    if avo is None or not others:
        return None
    return round(avo / max(others), 3)


def first_call_seconds(rows: Sequence[dict]) -> float:
    """Seconds spent in first calls (torch.compile, Triton JIT) over the run."""
    return sum(r.get("first_call_s", 0.0) for row in rows for r in row["results"].values())


def impls_of(results: dict) -> list[str]:
    """The implementations of a run, in IMPLS order: as recorded, else those with results."""
    seen = set(results.get("impls") or [])
    for row in results["rows"]:
        seen.update(row["results"])
    return [i for i in IMPLS if i in seen]


def case_key(row: dict) -> tuple:
    return row["op"], row["dir"], row["dtype"], tuple(row["shape"])


def merge_baselines(results: dict, other: dict) -> dict:
    """`results` with the implementations its rows lack taken from `other` (matched by op,
    direction, dtype and shape) and the speedups recomputed; `baselines_from` lists the
    runs they came from (a second merge adds to the list)."""
    theirs = {case_key(r): r["results"] for r in other["rows"]}
    rows = []
    for row in results["rows"]:
        merged = dict(row["results"])
        for impl, value in theirs.get(case_key(row), {}).items():
            if impl != "avo" and impl not in merged:
                merged[impl] = value
        rows.append({**row, "results": merged, "speedup_vs_best_other": speedup(merged)})
    source = {k: other.get(k) for k in ("date", "command", "avo_ops_commit", "copy_gbps", "liger")}
    own = set(results.get("impls") or [])
    source["impls"] = [i for i in IMPLS if i not in own and i in set(other.get("impls") or [])]
    impls = [i for i in IMPLS if i in own | set(other.get("impls") or [])]
    return {**results, "rows": rows, "impls": impls, "baselines_from": [*baseline_sources(results), source]}


def baseline_sources(results: dict) -> list[dict]:
    """The runs a report's baselines came from (a single dict in files of older reports)."""
    sources = results.get("baselines_from") or []
    return [sources] if isinstance(sources, dict) else list(sources)


def geomean(values: Sequence[float]) -> Optional[float]:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def missed_targets(row: dict) -> list[str]:
    """The targets a row misses: "copy" (its direction's fraction of copy), "best" (more
    than BEST_SLACK slower than the best other implementation)."""
    missed = []
    target = FORWARD_TARGET if row["dir"] == "fwd" else BACKWARD_TARGET
    if row["results"]["avo"]["frac_copy"] < target:
        missed.append("copy")
    if row.get("speedup_vs_best_other") and row["speedup_vs_best_other"] < 1 - BEST_SLACK:
        missed.append("best")
    return missed


def target_counts(rows: Sequence[dict]) -> tuple[list[tuple[str, float, int, int]], int, int]:
    """Against the targets: per direction (its name, its target, the rows that meet it, its
    rows), then the rows within BEST_SLACK of the best other implementation or faster, and
    the rows compared with one."""
    directions = []
    for direction, name, target in (("fwd", "forwards", FORWARD_TARGET), ("bwd", "backwards", BACKWARD_TARGET)):
        group = [r for r in rows if r["dir"] == direction]
        met = sum(1 for r in group if "copy" not in missed_targets(r))
        directions.append((name, target, met, len(group)))
    compared = [r for r in rows if r.get("speedup_vs_best_other")]
    close = sum(1 for r in compared if "best" not in missed_targets(r))
    return directions, close, len(compared)


def target_lines(results: dict) -> list[str]:
    """Markdown bullets: the rows that meet each performance target, the geometric mean of
    avo over torch.compile on the norm/softmax rows and on the elementwise rows, and the
    norm/softmax rows against each target."""
    rows = [r for r in results["rows"] if r["results"].get("avo", {}).get("frac_copy") is not None]
    directions, close, compared = target_counts(rows)
    lines = [f"- {name.capitalize()} at ≥ {target:.0%} of copy: {met} of {total}."
             for name, target, met, total in directions]
    lines.append(f"- Within {BEST_SLACK:.0%} of the best other implementation or faster: "
                 f"{close} of {compared}.")
    for label, pick in (("norm and softmax rows", lambda r: r["op"] not in ELEMENTWISE_OPS),
                        ("norm and softmax rows with N ≤ 16384",
                         lambda r: r["op"] not in ELEMENTWISE_OPS and row_length(r) <= 16384),
                        ("elementwise rows", lambda r: r["op"] in ELEMENTWISE_OPS)):
        ratios = [r["results"]["avo"]["gbps"] / gbps(r, "compile") for r in rows
                  if pick(r) and gbps(r, "compile")]
        if ratios:
            lines.append(f"- Geometric mean of avo over torch.compile, {label}: {geomean(ratios):.2f}x "
                         f"({len(ratios)} rows).")
    norms = [r for r in rows if r["op"] not in ELEMENTWISE_OPS]
    if norms:
        directions, close, compared = target_counts(norms)
        counts = [f"{name} at ≥ {target:.0%} of copy {met} of {total}" for name, target, met, total in directions]
        counts.append(f"within {BEST_SLACK:.0%} of the best other {close} of {compared}")
        lines.append(f"- Norm and softmax rows: {', '.join(counts)}.")
    return lines


def misses_table(results: dict) -> list[str]:
    """A Markdown table of the rows that miss a target, in the report's order, with the
    CUDA kernel version avo's call took where the run recorded it (bench_ops.avo_kernel)."""
    rows = [r for r in results["rows"] if r["results"].get("avo", {}).get("frac_copy") is not None]
    body = []
    for op, direction in ordered_groups(rows):
        group = [r for r in rows if (r["op"], r["dir"]) == (op, direction)]
        for dtype in ordered_dtypes(group):
            for r in sorted((r for r in group if r["dtype"] == dtype), key=row_length):
                missed = missed_targets(r)
                if missed:
                    body.append([op, direction, dtype, str(row_length(r)),
                                 f"{r['results']['avo']['frac_copy']:.3f}",  # 0.8979 is no 0.90
                                 cell(r.get("speedup_vs_best_other"), ".2f", "x"),
                                 ", ".join(missed), r.get("kernel") or "–"])
    if not body:
        return ["Every row meets the targets."]
    return md_table(["op", "dir", "dtype", "N", "avo/copy", "avo vs best", "misses", "avo kernel"], body)


def by_length_table(results: dict) -> list[str]:
    """Markdown table, a line per op: avo's fraction of the copy bandwidth (lowest–highest
    over dtypes and row lengths) for rows of up to SHORT_ROWS elements and longer ones, in
    each direction, and the geometric mean of avo over torch.compile per direction (– where
    a cell has no rows)."""
    rows = [r for r in results["rows"] if r["results"].get("avo", {}).get("frac_copy") is not None]
    body = []
    for op in dict.fromkeys(r["op"] for r in rows):
        cells = [op]
        for direction in ("fwd", "bwd"):
            for short in (True, False):
                fracs = [r["results"]["avo"]["frac_copy"] for r in rows
                         if r["op"] == op and r["dir"] == direction and (row_length(r) <= SHORT_ROWS) == short]
                cells.append(f"{min(fracs):.2f}–{max(fracs):.2f}" if fracs else "–")
        means = []
        for direction in ("fwd", "bwd"):
            mean = geomean([r["results"]["avo"]["gbps"] / gbps(r, "compile") for r in rows
                            if r["op"] == op and r["dir"] == direction and gbps(r, "compile")])
            means.append(f"{mean:.2f}×" if mean else "–")
        body.append(cells + [" / ".join(means)])
    return md_table(["op", f"forward, N ≤ {SHORT_ROWS}", f"forward, N > {SHORT_ROWS}",
                     f"backward, N ≤ {SHORT_ROWS}", f"backward, N > {SHORT_ROWS}",
                     "over torch.compile (fwd / bwd)"], body)


def fmt_shape(shape: Sequence[int]) -> str:
    return "x".join(str(s) for s in shape)


def cell(value, spec: str, suffix: str = "") -> str:
    return "–" if value is None else format(value, spec) + suffix


def ordered_groups(rows: Sequence[dict]) -> list[tuple[str, str]]:
    return list(dict.fromkeys((r["op"], r["dir"]) for r in rows))


def ordered_dtypes(rows: Sequence[dict]) -> list[str]:
    present = {r["dtype"] for r in rows}
    return [d for d in DTYPE_ORDER if d in present] + sorted(present - set(DTYPE_ORDER))


# --------------------------------------------------------------------------- tables

def copy_line(results: dict) -> str:
    parts = [f"{c['gbps']:.0f} GB/s ({c['size_mib']} MiB)" for c in results.get("copy", [])]
    return f"device copy: {', '.join(parts) or 'not measured'}"


def impl_cells(row: dict, impls: Sequence[str]) -> list[str]:
    cells = []
    for impl in impls:
        cells.append(cell(gbps(row, impl), ".0f"))
        if impl == "avo":
            cells.append(cell(row["results"].get("avo", {}).get("frac_copy"), ".2f"))
    cells.append(cell(row.get("speedup_vs_best_other"), ".2f", "x"))
    return cells


def impl_headers(impls: Sequence[str]) -> list[str]:
    headers = []
    for impl in impls:
        headers.append(f"{impl} GB/s")
        if impl == "avo":
            headers.append("avo/copy")
    return headers + ["avo vs best"]


def text_table(results: dict) -> str:
    impls = impls_of(results)
    header = ["op", "dir", "shape", "dtype"] + impl_headers(impls)
    body = [header] + [[r["op"], r["dir"], fmt_shape(r["shape"]), r["dtype"]]
                       + impl_cells(r, impls) for r in results["rows"]]
    return aligned_columns(body, numbers_from=4)


def aligned_columns(body: Sequence[Sequence[str]], numbers_from: int) -> str:
    """Plain-text table: the first line is the header, underlined; columns from
    `numbers_from` on are right-aligned."""
    widths = [max(len(line[i]) for line in body) for i in range(len(body[0]))]
    lines = ["  ".join(c.rjust(w) if i >= numbers_from else c.ljust(w)
                       for i, (c, w) in enumerate(zip(line, widths))).rstrip()
             for line in body]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            + ["| " + " | ".join(r) + " |" for r in rows])


def summary_line(op: str, direction: str, dtype: str, rows: Sequence[dict]) -> list[str]:
    """op, dir, dtype, row lengths, avo/copy range, avo vs best: geomean, min, max, wins."""
    lengths = sorted({row_length(r) for r in rows})
    fracs = [r["results"]["avo"]["frac_copy"] for r in rows
             if r["results"].get("avo", {}).get("frac_copy") is not None]
    ratios = [(r["speedup_vs_best_other"], row_length(r)) for r in rows
              if r.get("speedup_vs_best_other")]
    span = f"{lengths[0]}–{lengths[-1]}" if len(lengths) > 1 else str(lengths[0])
    frac = "–" if not fracs else f"{min(fracs):.2f}" + (
        f"–{max(fracs):.2f}" if f"{max(fracs):.2f}" != f"{min(fracs):.2f}" else "")
    if not ratios:
        return [op, direction, dtype, span, frac, "–", "–", "–", "–"]
    mean = geomean([s for s, _ in ratios])
    low, high = min(ratios), max(ratios)
    wins = sum(1 for s, _ in ratios if s >= 1.0)
    return [op, direction, dtype, span, frac, f"{mean:.2f}x",
            f"{low[0]:.2f}x (N={low[1]})", f"{high[0]:.2f}x (N={high[1]})",
            f"{wins} of {len(ratios)}"]


def markdown_report(results: dict) -> str:
    rows = results["rows"]
    impls = impls_of(results)
    copy_gbps = results.get("copy_gbps")
    versions = [f"torch {results.get('torch')}", f"CUDA {results.get('cuda')}"]
    if results.get("triton"):
        versions.append(f"triton {results['triton']}")
    liger = results.get("liger") or next((s["liger"] for s in baseline_sources(results) if s.get("liger")), None)
    versions.append(f"Liger-Kernel {liger}" if liger else "Liger-Kernel not run")
    if results.get("python"):
        versions.append(f"Python {results['python']}")
    l2 = results.get("l2_bytes")
    sizing = (f"each input tensor holds {results['elements']} elements (rows = elements / N); "
              if results.get("elements") else "")
    lines = [
        f"# avo_ops benchmark — {results.get('gpu', '?')}",
        "",
        f"{results.get('date', '')}; {', '.join(versions)}"
        + (f"; avo_ops {results['avo_ops_commit']}" if results.get("avo_ops_commit") else "")
        + ".",
        f"{results.get('reps')} timed calls per result (median of CUDA-event times); "
        f"{sizing}inputs rotated over at least 3x the L2 cache"
        + (f" ({l2 >> 20} MiB)" if l2 else "") + ".",
        "GB/s = minimal bytes (inputs read once, outputs written once) / median time. "
        f"{copy_line(results)}"
        + (f"; ratios to copy use {copy_gbps:.0f} GB/s" if copy_gbps else "") + ". "
        "\"avo vs best\" is avo's GB/s over the best of the other implementations.",
        "",
        f"Command: `{results.get('command', '')}`"
        + (f" ({results['wall_s']:.0f} s)" if results.get("wall_s") else ""),
        "",
    ]
    for source in baseline_sources(results):
        if not source.get("impls"):
            continue  # a baseline run that filled in nothing
        lines += [f"The {', '.join(source['impls'])} columns come from another run "
                  f"of the same cases on this GPU ({source.get('date')}, avo_ops {source.get('avo_ops_commit')}, "
                  f"copy {source.get('copy_gbps') or 0:.0f} GB/s): `{source.get('command')}`.", ""]
    if results.get("complete") is False:
        lines += [f"**Incomplete run**: {len(rows)} of {results.get('cases_planned', '?')} "
                  "cases (see the notices).", ""]
    lines += [
        "## Summary",
        "",
        "Per op, direction and dtype, over the row lengths N measured: avo's fraction of the "
        "copy bandwidth, avo against the best other implementation (geometric mean, "
        "worst and best N), and at how many N avo is at least as fast as all others.",
        "",
    ]
    summary = []
    for op, direction in ordered_groups(rows):
        group = [r for r in rows if (r["op"], r["dir"]) == (op, direction) and "results" in r]
        for dtype in ordered_dtypes(group):
            summary.append(summary_line(op, direction, dtype,
                                        [r for r in group if r["dtype"] == dtype]))
    lines += md_table(["op", "dir", "dtype", "N", "avo/copy", "avo vs best (geomean)",
                       "worst", "best", "avo fastest"], summary)
    lines += ["", "## Against the performance targets", ""] + target_lines(results)
    lines += ["", "## Rows that miss a target", "",
              f"Forwards under {FORWARD_TARGET:.0%} of copy or backwards under {BACKWARD_TARGET:.0%} "
              f"(\"copy\"), rows more than {BEST_SLACK:.0%} slower than the best other implementation "
              "(\"best\"), and the CUDA kernel version avo's call took (the row version; the tiled "
              "version's kernels, one or two; a cluster row's block threads).", ""] + misses_table(results)
    lines += ["", "## By row length", "",
              f"avo's fraction of copy over the dtypes and row lengths up to {SHORT_ROWS} elements "
              "and beyond, and avo over torch.compile (geometric mean over the op's rows), as the "
              "README's table has them.", ""] + by_length_table(results)

    for op, direction in ordered_groups(rows):
        lines += ["", f"## {op} {direction}", ""]
        body = []
        for r in rows:
            if (r["op"], r["dir"]) != (op, direction):
                continue
            body.append([r["dtype"], str(row_length(r)), fmt_shape(r["shape"])]
                        + impl_cells(r, impls))
        lines += md_table(["dtype", "N", "shape"] + impl_headers(impls), body)
    if results.get("notices"):
        lines += ["", "## Notices", ""] + [f"- {n}" for n in results["notices"]]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- plots

def tick_label(n: int) -> str:
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20}M"
    if n >= 1024 and n % 1024 == 0:
        return f"{n >> 10}K"
    return str(n)


def series(rows: Sequence[dict], impl: str) -> tuple[list[int], list[float]]:
    """(row lengths, GB/s) of one implementation, sorted by N; for a row length measured
    on several shapes, the one with the most elements."""
    best: dict[int, tuple[int, float]] = {}
    for r in rows:
        value = gbps(r, impl)
        if value is None:
            continue
        n, numel = row_length(r), math.prod(r["shape"])
        if n not in best or numel > best[n][0]:
            best[n] = (numel, value)
    lengths = sorted(best)
    return lengths, [best[n][1] for n in lengths]


def plot_results(results: dict, out_dir: str) -> list[str]:
    """One PNG per op and direction in out_dir; returns their paths. Raises ImportError
    without matplotlib."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no display needed

    os.makedirs(out_dir, exist_ok=True)
    rows = [r for r in results["rows"] if r.get("results")]
    impls = impls_of(results)
    copy_gbps = results.get("copy_gbps")
    paths = []
    for op, direction in ordered_groups(rows):
        group = [r for r in rows if (r["op"], r["dir"]) == (op, direction)]
        dtypes = ordered_dtypes(group)
        fig = Figure(figsize=(4.4 * len(dtypes) + 2.0, 4.2), layout="constrained")
        axes = fig.subplots(1, len(dtypes), sharey=True, squeeze=False)[0]
        top = copy_gbps or 0.0
        for ax, dtype in zip(axes, dtypes):
            panel = [r for r in group if r["dtype"] == dtype]
            all_lengths = sorted({row_length(r) for r in panel})
            for impl in impls:
                xs, ys = series(panel, impl)
                if xs:
                    ax.plot(xs, ys, marker="o", markersize=4, label=impl,
                            color=COLORS.get(impl), linewidth=2 if impl == "avo" else 1.3)
                    top = max(top, max(ys))
            if copy_gbps:
                ax.axhline(copy_gbps, linestyle="--", color="gray", linewidth=1,
                           label=f"device copy ({copy_gbps:.0f} GB/s)")
            ax.set_xscale("log", base=2)
            ax.set_xticks(all_lengths, [tick_label(n) for n in all_lengths])
            ax.minorticks_off()
            ax.set_title(dtype)
            ax.set_xlabel("row length N")
            ax.grid(True, alpha=0.3)
        axes[0].set_ylabel("GB/s (minimal bytes / median time)")
        axes[0].set_ylim(0, 1.08 * top if top else None)
        handles, labels = axes[-1].get_legend_handles_labels()
        try:  # beside the panels, clear of the data (matplotlib >= 3.7)
            fig.legend(handles, labels, loc="outside right upper", fontsize="small")
        except ValueError:
            axes[-1].legend(loc="best", fontsize="small")
        fig.suptitle(f"{op} {direction} — {results.get('gpu', '')}")
        path = os.path.join(out_dir, f"{op}_{direction}.png")
        fig.savefig(path, dpi=110)
        paths.append(path)
    return paths


# --------------------------------------------------------------------------- CLI

def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description="Markdown tables and PNG plots from a "
                                            "bench_ops.py results JSON.")
    p.add_argument("json", help="results.json written by bench_ops.py")
    p.add_argument("--out", metavar="DIR", help="output folder (default: the JSON's folder)")
    p.add_argument("--no-plots", action="store_true", help="only the Markdown")
    p.add_argument("--baselines", metavar="JSON", action="append", default=[],
                   help="take the implementations this run lacks from another run's JSON (repeatable)")
    args = p.parse_args(argv)
    with open(args.json) as f:
        results = json.load(f)
    for path in args.baselines:
        with open(path) as f:
            results = merge_baselines(results, json.load(f))
    out = args.out or os.path.dirname(os.path.abspath(args.json))
    os.makedirs(out, exist_ok=True)
    written = [os.path.join(out, "results.md")]
    with open(written[0], "w") as f:
        f.write(markdown_report(results))
    if not args.no_plots:
        written += plot_results(results, os.path.join(out, "plots"))
    for path in written:
        print(f"wrote {path}", file=sys.stderr)
    print(text_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The narrow line of tuning/sm_90.json from the H200 measurements of
benchmarks/results/2026-12-05-h200-narrow-rows (the shipped kernels against the same
kernels with narrow register rows where the plain register version ran, two runs each, 4
row lengths), by tune_rows.py's rule (threshold over the lengths from the longest down). Run from the
repository root:

    python benchmarks/results/2026-12-05-narrow-line/narrow_from_experiment.py

It sets the narrow_max_vectors table of tuning/sm_90.json and adds itself to the file's
runs; `python -m generator` then writes the line into the generated sources."""
import json, re, statistics, sys
sys.path.insert(0, "benchmarks")
from tune_rows import rule_text, threshold, write_tuning

DT = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
rows = {}
for line in open("benchmarks/results/2026-12-05-h200-narrow-rows/compare.md"):
    m = re.match(r"\| (\w+) \| (\w+) \| (\d+) \| ([\d.]+), ([\d.]+) \| ([\d.]+), ([\d.]+) \|", line)
    if m:
        op, dt, n = m.group(1), m.group(2), int(m.group(3))
        plain = statistics.mean(map(float, m.group(4, 5)))
        narrow = statistics.mean(map(float, m.group(6, 7)))
        rows.setdefault((op, dt), []).append((n * (4 if dt == "fp32" else 2) // 16, plain, narrow))
data = json.load(open("tuning/sm_90.json"))
table = {}
for (op, dt), points in sorted(rows.items()):
    table.setdefault(op, {}).setdefault("forward", {})[DT[dt]] = threshold(sorted(points)[::-1], 0.01, 0.03)
data["narrow_max_vectors"] = table
data["rule"] = rule_text(0.01, 0.03)
data["runs"].append({"date": "2026-12-05T05:09:39+00:00",
                     "command": "narrow_max_vectors of the forwards from benchmarks/results/2026-12-05-h200-narrow-rows "
                                "(N = 256, 1024, 4096, 16384; the mean of two runs) by tune_rows.threshold",
                     "torch": "2.11.0+cu130", "cuda": "13.0"})
write_tuning("tuning/sm_90.json", data)

#!/usr/bin/env python3
"""Time the versions of the row kernels against each other on this GPU and write the
dispatch thresholds the build takes in: this GPU's table in tuning/.

    python benchmarks/tune_rows.py                  # writes this GPU's tuning file
    pip install --no-build-isolation -e .           # regenerates the .cu tables, rebuilds

The file is the one this GPU's dispatch reads (generator/tuning.py): its own,
tuning/sm_<arch>-<gpu>.json, where there is one; else its arch's, tuning/sm_<arch>.json,
where that was measured on a GPU of the same name or does not exist yet; else a new file
of its own, which starts from the arch's tables (its "based_on" says so) and takes this
run's lines. A run never writes over the table another GPU measured.

For every row op (the ops of csrc/include/avo/row_cuda.cuh), kernel (forward, backward),
dtype (float16, bfloat16, float32) and row length N (powers of two from 256 to 262144, as
many rows as fit in --elements elements), it times torch.ops.avo.<op>[_backward] with
every call forced onto each version in turn: register, pipelined (the register version
loading the next row ahead), wide (the register version on wide rows: groups of 512
threads holding twice the vectors), narrow (the register version on narrow rows: twice
the threads holding half the vectors), staged, cluster, global, and for backwards tiled
(avo_ops._C.set_row_version). A call that cannot take the forced version (the row does
not fit it) takes the table's choice; avo_ops._C.last_row_version tells, and such a run
is not recorded as that version's time. Timing is bench_ops.py's: CUDA events, median of
--reps calls, inputs rotated beyond L2. With --rounds R, every version of a case is timed
R times, each round timing them all in turn, and keeps the median of its rounds: where
two versions are level within the margin, one round's order can follow a moment's noise.

Six thresholds per (op, kernel, dtype), in 16-byte vectors, each the shortest row from
which a version is faster by more than --margin at that length and no slower by more than
--tolerance at every longer one where another version was timed; null (never) when there
is none. The tolerance is wider than the margin because two runs of one kernel differed by
up to 1.7% on the H200. Each version is compared with the fastest of those the dispatch
would otherwise take (pick_row_version in csrc/include/avo/row_cuda.cuh tries tiled,
global, cluster, staged, then narrow, wide, pipelined or register):
  - staged_min_vectors: staged against register, pipelined, wide and narrow, over N up to
    32768 (beyond, none of them fits);
  - global_min_vectors: global against register, pipelined, wide, narrow, staged and
    cluster;
  - pipelined_min_vectors: pipelined against register, over N up to 32768;
  - tiled_min_vectors: tiled against register, pipelined, wide, narrow, staged, cluster
    and global;
  - cluster_min_vectors: cluster against register, pipelined, wide, narrow and staged,
    over N up to 32768 (beyond, only the cluster and global versions fit, and the global
    table decides);
  - wide_min_vectors: wide against register and pipelined, over N up to 32768 (rows that
    only the wide version holds in registers take it without a threshold).
A seventh, coarse_chunks_min_vectors, times each backward with per-column sums on the
table's version with fine and with coarse chunks of rows (avo_ops._C.set_chunk_size;
rows_per_chunk in csrc/include/avo/row_args.h) and compares coarse against fine, at the
lengths where the two differ (avo_ops._C.last_rows_per_chunk): with the default
--elements, rows of 16384 elements (the shorter ones have 32 rows a chunk either way,
the longer ones take the long rows' chunks).
An eighth, narrow_max_vectors, is the other way round: the longest row up to which
narrow is faster than the fastest of register, pipelined and wide by more than --margin
there and no slower by more than --tolerance at every shorter one, over N up to 32768
(the kernels with per-column sums have no narrow rows: never).
A ninth, small_cluster_blocks_min_vectors, times each call that takes the cluster
version without per-column sums (the table's choice) with full and with small blocks
(avo_ops._C.set_cluster_blocks; cluster_block_threads in csrc/include/avo/row_cuda.cuh)
and compares small against full, at the lengths where the two differ
(avo_ops._C.last_cluster_block_threads).
A tenth, one_kernel_min_vectors, times each backward with per-column sums in the tiled
version (forced) run as two kernels and as one (avo_ops._C.set_tiled_kernels;
one_kernel_tiled_rows_kernel in csrc/include/avo/row_cuda.cuh) and compares one against
two, at the lengths where both ran (avo_ops._C.last_tiled_kernels: the one kernel runs
only where all its blocks fit on the GPU at once). The tiled line's own times take the
tiled version as the file's one line has it: after a change of the one line, a second
run of the tiled line (--tables tiled) measures the version the build now runs.
An eleventh, prefetch_min_vectors, times each backward with per-column sums that takes the
cluster version (the table's choice) with and without its rows prefetched into L2
(avo_ops._C.set_row_prefetch; cluster_rows in csrc/include/avo/row_cuda.cuh) and compares
on against off, at the lengths where the call took the cluster version
(avo_ops._C.last_row_prefetch).
Forwards are not timed tiled: the tiled version takes only backwards with per-column
sums. A run that took another version (a backward of two per-element inputs of four
vectors a thread cannot pipeline) is dropped because, kept, it would time the table's
choice under every version's name at the longest rows, where then no threshold could
be found.
A line the file already has stays where this run's times do not beat it: where, at every
row timed, the version it gives is no slower than the one the new line gives by more than
--margin (two runs of one kernel differ by up to 1.7% on the H200, and a line whose gain
sits at the margin would otherwise move back and forth between runs); --fresh takes every
line from this run's times alone.
--tables computes some of them (and times only the versions they compare); --ops,
--kernels and --dtypes limit what is measured. Whatever a run does not measure is kept
from the file it writes over. The file also keeps the date, versions and command of
every run, and the times the tables come from: a run of every table replaces the times
of each (op, kernel, dtype) it measured, whose tables all come from it now; a run of some
--tables adds its times to those (the other tables came from them). --recompute PATH
times nothing: it computes --tables again from the measurements of the last run in PATH
(after a change of the rule), no GPU needed, and writes PATH again (or --out). A timing
run ends by listing the lines that changed against the file it wrote over.

Options: --ops, --kernels, --dtypes, --tables, --row-lengths, --elements (default 2^26),
--reps (default 30), --rounds (default 1), --margin (default 0.01), --tolerance (default 0.03), --out PATH
(default: this GPU's file, above), --recompute PATH, --fresh.
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
from generator.tuning import TUNING_DIR, UP_TO_TABLES, load_tunings, tuning_file_name, tuning_for  # noqa: E402

# The ops whose kernels are row kernels, from their specs.
ROW_OPS = [s.spec.name for s in load_schedules(ROOT, os.path.join(ROOT, "specs")) if s.pattern == "row"]
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
ROLES = {"fwd": "forward", "bwd": "backward"}
DIRECTIONS = {role: direction for direction, role in ROLES.items()}
DEFAULT_LENGTHS = [256 << i for i in range(11)]  # 256 ... 262144
STAGED_MAX_LENGTH = 32768  # the longest row of one input the staged version holds (bf16/fp16)
VERSIONS = bench_ops.ROW_VERSIONS
# The versions each table compares: the last one against the fastest of the others that
# a measurement has (forwards have no tiled time, some backwards no pipelined one).
TABLE_VERSIONS = {"staged_min_vectors": ("register", "pipelined", "wide", "narrow", "staged"),
                  "global_min_vectors": ("register", "pipelined", "wide", "narrow", "staged", "cluster", "global"),
                  "pipelined_min_vectors": ("register", "pipelined"),
                  "tiled_min_vectors": ("register", "pipelined", "wide", "narrow", "staged", "cluster", "global",
                                        "tiled"),
                  "cluster_min_vectors": ("register", "pipelined", "wide", "narrow", "staged", "cluster"),
                  "wide_min_vectors": ("register", "pipelined", "wide"),
                  "coarse_chunks_min_vectors": ("fine_chunks", "coarse_chunks"),
                  "narrow_max_vectors": ("register", "pipelined", "wide", "narrow"),
                  "small_cluster_blocks_min_vectors": ("full_cluster_blocks", "small_cluster_blocks"),
                  "one_kernel_min_vectors": ("two_tiled_kernels", "one_tiled_kernels"),
                  "prefetch_min_vectors": ("off_row_prefetch", "on_row_prefetch")}
# A table's name on the command line: "staged" for staged_min_vectors, "narrow" for
# narrow_max_vectors.
TABLE_NAMES = {t.removesuffix("_min_vectors").removesuffix("_max_vectors"): t for t in TABLE_VERSIONS}
# The table of the chunks of rows, and its two timings (named like versions).
CHUNK_TABLE = "coarse_chunks_min_vectors"
CHUNK_SIZES = ("fine", "coarse")
# The table of the cluster version's blocks, and its two timings (named like versions).
CLUSTER_BLOCKS_TABLE = "small_cluster_blocks_min_vectors"
CLUSTER_BLOCKS = ("full", "small")
# The table of the tiled version's kernels, and its two timings (named like versions).
TILED_KERNELS_TABLE = "one_kernel_min_vectors"
TILED_KERNELS = ("two", "one")
# The table of the cluster rows' prefetch, and its two timings (named like versions).
PREFETCH_TABLE = "prefetch_min_vectors"
PREFETCHES = ("off", "on")
# The versions a direction is not timed on: forwards never tile and have no chunks.
UNTIMED = {"fwd": ("tiled", "fine_chunks", "coarse_chunks", "two_tiled_kernels", "one_tiled_kernels",
                   "off_row_prefetch", "on_row_prefetch"), "bwd": ()}
# The tables compared on rows of up to STAGED_MAX_LENGTH only: beyond, only the last
# version of the table (or none of them) fits.
SHORT_ROW_TABLES = ("staged_min_vectors", "pipelined_min_vectors", "cluster_min_vectors", "wide_min_vectors",
                    "narrow_max_vectors")


def upper_median(values: list[float]) -> float:
    """The median of `values`, the upper one of an even count: always one of the times."""
    return sorted(values)[len(values) // 2]


def time_version(avo_ops, case, shape, dtype, version: str, timer: bench_ops.Timer) -> float | None:
    """Median microseconds of one call of the avo kernel, forced onto `version`; None
    where the call could not take it (it ran another version: avo_ops._C.last_row_version)."""
    arg_sets = bench_ops.input_sets(case, shape, dtype)
    avo_ops._C.set_row_version(version)
    try:
        times = timer.measure(case.avo, arg_sets)
        took = avo_ops._C.last_row_version()
    finally:
        avo_ops._C.set_row_version("auto")
    del arg_sets
    torch.cuda.empty_cache()
    return upper_median(times) if took == version else None


def time_choices(case, shape, dtype, timer: bench_ops.Timer, choose, choices: tuple[str, ...], suffix: str,
                 taken) -> dict[str, float]:
    """Median microseconds of one call of the avo kernel (the table's version) with each of
    `choices` forced by `choose`, as {f"{choice}_{suffix}": us}; {} where `taken()`, what
    the call took after it ran (the rows of a chunk, a cluster row's block threads), is 0
    for any choice (the call had none to make) or the same for two of them."""
    arg_sets = bench_ops.input_sets(case, shape, dtype)
    times, took = {}, []
    try:
        for choice in choices:
            choose(choice)
            measured = timer.measure(case.avo, arg_sets)
            times[f"{choice}_{suffix}"] = upper_median(measured)
            took.append(taken())
    finally:
        choose("auto")
    del arg_sets
    torch.cuda.empty_cache()
    return times if all(took) and len(set(took)) == len(took) else {}


def time_chunk_sizes(avo_ops, case, shape, dtype, timer: bench_ops.Timer) -> dict[str, float]:
    """{"fine_chunks": us, "coarse_chunks": us} of a backward with per-column sums (time_choices)."""
    return time_choices(case, shape, dtype, timer, avo_ops._C.set_chunk_size, CHUNK_SIZES, "chunks",
                        avo_ops._C.last_rows_per_chunk)


def time_cluster_blocks(avo_ops, case, shape, dtype, timer: bench_ops.Timer) -> dict[str, float]:
    """{"full_cluster_blocks": us, "small_cluster_blocks": us} of a call that takes the
    cluster version (time_choices)."""
    def block_threads():
        clustered = avo_ops._C.last_row_version() == "cluster"
        return avo_ops._C.last_cluster_block_threads() if clustered else 0

    return time_choices(case, shape, dtype, timer, avo_ops._C.set_cluster_blocks, CLUSTER_BLOCKS,
                        "cluster_blocks", block_threads)


def time_tiled_kernels(avo_ops, case, shape, dtype, timer: bench_ops.Timer) -> dict[str, float]:
    """{"two_tiled_kernels": us, "one_tiled_kernels": us} of a backward with per-column
    sums forced onto the tiled version (time_choices)."""
    def kernels():
        return avo_ops._C.last_tiled_kernels() if avo_ops._C.last_row_version() == "tiled" else ""

    avo_ops._C.set_row_version("tiled")
    try:
        return time_choices(case, shape, dtype, timer, avo_ops._C.set_tiled_kernels, TILED_KERNELS, "tiled_kernels",
                            kernels)
    finally:
        avo_ops._C.set_row_version("auto")


def time_row_prefetch(avo_ops, case, shape, dtype, timer: bench_ops.Timer) -> dict[str, float]:
    """{"off_row_prefetch": us, "on_row_prefetch": us} of a backward with per-column sums
    that takes the cluster version (time_choices)."""
    def prefetched():
        taken = avo_ops._C.last_row_prefetch()
        return taken if taken != "auto" else ""

    return time_choices(case, shape, dtype, timer, avo_ops._C.set_row_prefetch, PREFETCHES, "row_prefetch",
                        prefetched)


def median_of_rounds(rounds: list[dict[str, float | None]]) -> dict[str, float | None]:
    """One time per key from several rounds' timings of the same calls: the median of its
    rounds (the upper one of an even count); None for a key that is None in any round (the
    call could not take that version); only the keys every round has (a round where the
    choices took the same, time_choices, has none)."""
    keys = [k for k in rounds[0] if all(k in r for r in rounds[1:])]
    return {k: None if any(r[k] is None for r in rounds) else upper_median([r[k] for r in rounds]) for k in keys}


def threshold(points: list[tuple[int, float, float]], margin: float, tolerance: float) -> int | None:
    """points: (vectors, incumbent us, challenger us) by increasing length. The shortest
    length from which the challenger wins by more than `margin` there and loses by no
    more than `tolerance` at every longer length; None if no length qualifies. Given
    by decreasing length, the longest up to which it does so at every shorter one."""
    best = None
    for i, (vectors, incumbent, challenger) in enumerate(points):
        if challenger < incumbent * (1 - margin) and all(c <= n * (1 + tolerance) for _, n, c in points[i:]):
            best = vectors
            break
    return best


def timed_us(measurement: dict, version: str) -> float | None:
    """The time of `version` in a measurement, None where it was not timed or its
    direction never takes it (a file of an older run may hold such times)."""
    direction = DIRECTIONS.get(measurement.get("kernel"))
    if direction is not None and version in UNTIMED[direction]:
        return None
    return measurement.get(f"{version}_us")


def settled(points: list[tuple[int, float, float]], previous: int | None, found: int | None, up_to: bool,
            margin: float) -> int | None:
    """points: (vectors, incumbent us, challenger us). The line to write: `previous` (the
    file's) where, at every point, the version it gives the row is no slower than the one
    `found` gives by more than `margin`; otherwise `found`. Two runs of one kernel differ by
    up to 1.7% on the H200, so a line whose gain sits at the margin would otherwise move
    back and forth between runs."""
    def takes(line, vectors):
        return line is not None and (vectors <= line if up_to else vectors >= line)

    for vectors, incumbent, challenger in points:
        before = challenger if takes(previous, vectors) else incumbent
        after = challenger if takes(found, vectors) else incumbent
        if before > after * (1 + margin):
            return found
    return previous


def thresholds(measurements: list[dict], tables: list[str], margin: float, tolerance: float,
               previous: dict[str, int | None] | None = None) -> dict[str, int | None]:
    """Each of `tables` of one (op, kernel, dtype) from its measurements by increasing
    length: the last version TABLE_VERSIONS lists for the table against the fastest of the
    others that were timed, over the rows the staged version could hold for
    SHORT_ROW_TABLES, over all rows for the rest, and only where the challenger and at
    least one other were timed (forwards are not timed tiled, and a version is not timed
    where the call cannot take it). `previous`: the lines the file has for this group
    (table -> vectors or None), each kept where the measurements do not beat it (settled)."""
    found = {}
    for table in tables:
        *incumbents, challenger = TABLE_VERSIONS[table]
        points = []
        for m in measurements:
            if table in SHORT_ROW_TABLES and m["row_length"] > STAGED_MAX_LENGTH:
                continue
            incumbent = [t for t in (timed_us(m, v) for v in incumbents) if t is not None]
            challenger_us = timed_us(m, challenger)
            if incumbent and challenger_us is not None:
                points.append((m["vectors"], min(incumbent), challenger_us))
        found[table] = threshold(points[::-1] if table in UP_TO_TABLES else points, margin, tolerance)
        if previous is not None and table in previous:
            found[table] = settled(points, previous[table], found[table], table in UP_TO_TABLES, margin)
    return found


def previous_lines(previous: dict, group: tuple[str, str, str], tables: list[str]) -> dict[str, int | None]:
    """The lines of `tables` that the file `previous` has for (op, kernel, dtype) `group`
    (None: never); a table without an entry for it is left out."""
    op, role, dtype = group
    lines = {}
    for table in tables:
        by_dtype = previous.get(table, {}).get(op, {}).get(role, {})
        if dtype in by_dtype:
            lines[table] = by_dtype[dtype]
    return lines


def by_group(measurements: list[dict]) -> dict[tuple[str, str, str], list[dict]]:
    """Measurements per (op, kernel, dtype), by increasing row length (what thresholds takes)."""
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for m in sorted(measurements, key=lambda m: m["row_length"]):
        groups.setdefault((m["op"], m["kernel"], m["dtype"]), []).append(m)
    return groups


def default_out(root: str, arch: int, gpu: str) -> str:
    """The file a run on the GPU named `gpu` writes: the one its dispatch reads
    (tuning_for), where that is its own or its arch's measured on a GPU of the same name
    (or of none); with no file yet, its arch's; a new file of its own otherwise, so that a
    run on one GPU does not write over the table another GPU of the arch measured."""
    table = tuning_for(load_tunings(root), arch, gpu)
    own = table is not None and (table.own or table.gpu not in ("", gpu))
    return os.path.join(root, TUNING_DIR, tuning_file_name(arch, gpu if own else None))


def previous_file(path: str, arch: int, gpu: str) -> dict:
    """The tuning file this run writes over, or an empty one. A GPU's new file of its own
    starts from the tables of its arch's file, which its runs then replace line by line
    ("based_on" says so); a file measured on another GPU is refused."""
    if not os.path.exists(path):
        shared = os.path.join(os.path.dirname(os.path.abspath(path)), tuning_file_name(arch))
        if os.path.basename(path) != tuning_file_name(arch, gpu) or not os.path.exists(shared):
            return {}
        with open(shared, encoding="utf-8") as f:
            data = json.load(f)
        return {"based_on": f"{TUNING_DIR}/{tuning_file_name(arch)} ({data.get('gpu', '')}): the lines this "
                            f"GPU's runs did not measure", "runs": [],
                **{name: data[name] for name in TABLE_VERSIONS if name in data}}
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if data.get("arch") != arch:
        raise SystemExit(f"tune_rows: {path} is for sm_{data.get('arch')}, this GPU is sm_{arch}")
    if data.get("gpu", gpu) != gpu:
        raise SystemExit(f"tune_rows: {path} holds the table of the {data['gpu']}, this GPU is the {gpu}; "
                         f"its own is {TUNING_DIR}/{tuning_file_name(arch, gpu)} (the default --out)")
    return data


def merged_file(previous: dict, found: dict, measurements: list[dict], run: dict, header: dict) -> dict:
    """The tuning file after a run: `previous` (the file it writes over, or {}) with the
    thresholds `found` ((op, kernel, dtype) -> table -> vectors or None) set, the run
    added to "runs" (a file of one run has its date and command at the top level) and
    its measurements added, each tagged with its run's place in "runs". The previous
    measurements of an (op, kernel, dtype) whose every table the run computed are dropped:
    none of its tables comes from them any more (without that the file grew by every
    run's times, 1.9 MB after 23 runs)."""
    tables = {name: json.loads(json.dumps(previous.get(name, {}))) for name in TABLE_VERSIONS}
    for (op, role, dtype), values in found.items():
        for name, value in values.items():
            tables[name].setdefault(op, {}).setdefault(role, {})[dtype] = value
    runs = previous.get("runs", [{k: previous[k] for k in ("date", "command", "torch", "cuda") if k in previous}]
                        if previous else [])
    replaced = {group for group, values in found.items() if set(values) == set(TABLE_VERSIONS)}
    kept = [{"run": 0, **m} for m in previous.get("measurements", [])
            if (m["op"], m["kernel"], m["dtype"]) not in replaced]
    based_on = {"based_on": previous["based_on"]} if "based_on" in previous else {}
    return {**header, **based_on, "runs": runs + [run], **tables,
            "measurements": kept + [{"run": len(runs), **m} for m in measurements]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", default=",".join(ROW_OPS))
    p.add_argument("--kernels", default=",".join(ROLES.values()))
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--tables", default=",".join(TABLE_VERSIONS))
    p.add_argument("--row-lengths", default=",".join(map(str, DEFAULT_LENGTHS)))
    p.add_argument("--elements", type=int, default=1 << 26)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=1,
                   help="time every version this many times, in turn, and take the median (default 1)")
    p.add_argument("--margin", type=float, default=0.01)
    p.add_argument("--tolerance", type=float, default=0.03)
    p.add_argument("--out", help="default: this GPU's file in tuning/ (sm_<arch>.json or sm_<arch>-<gpu>.json)")
    p.add_argument("--recompute", metavar="PATH", help="time nothing: compute --tables again from PATH's last run")
    p.add_argument("--fresh", action="store_true",
                   help="every line from this run's times alone, none kept from the file it writes over")
    args = p.parse_args(argv)

    ops = [o for o in args.ops.split(",") if o]
    unknown = set(ops) - set(ROW_OPS)
    if unknown:
        p.error(f"not row ops: {sorted(unknown)}; row ops: {ROW_OPS}")
    dtypes = [d for d in args.dtypes.split(",") if d]
    if set(dtypes) - set(DTYPES):
        p.error(f"dtypes: {', '.join(DTYPES)}")
    kernels = [k for k in args.kernels.split(",") if k]
    if set(kernels) - set(ROLES.values()):
        p.error(f"kernels: {', '.join(ROLES.values())}")
    directions = [d for d, role in ROLES.items() if role in kernels]
    table_names = [t.strip() for t in args.tables.split(",") if t.strip()]
    table_names = [TABLE_NAMES.get(t, t) for t in table_names]
    if set(table_names) - set(TABLE_VERSIONS):
        p.error(f"tables: {', '.join(TABLE_NAMES)}")
    if args.recompute:
        return recompute(args.recompute, table_names, args.margin, args.tolerance, args.out)
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, not {args.rounds}")
    versions = [v for v in VERSIONS if any(v in TABLE_VERSIONS[t] for t in table_names)]
    lengths = sorted(int(n) for n in args.row_lengths.split(","))
    if not torch.cuda.is_available():
        print("tune_rows: no CUDA device", file=sys.stderr)
        return 1
    import avo_ops

    major, minor = torch.cuda.get_device_capability()
    arch = major * 10 + minor
    gpu = torch.cuda.get_device_name()
    out = args.out or default_out(ROOT, arch, gpu)
    previous = previous_file(out, arch, gpu)

    timer = bench_ops.Timer(args.reps, warmup=5)
    plan = [(op, d, dtype, n) for op in ops for d in directions for dtype in dtypes for n in lengths]
    measurements = []
    with torch.no_grad():
        for i, (op, direction, dtype_name, n) in enumerate(plan, 1):
            case = bench_cases.find_case(op, direction)
            dtype = DTYPES[dtype_name]
            shape = case.layout((max(1, args.elements // n), n))
            tried = [v for v in versions if v not in UNTIMED[direction]]
            chunked = CHUNK_TABLE in table_names and direction == "bwd"
            clustered = CLUSTER_BLOCKS_TABLE in table_names
            tiled = TILED_KERNELS_TABLE in table_names and direction == "bwd"
            prefetched = PREFETCH_TABLE in table_names and direction == "bwd"
            rounds = []
            for _ in range(args.rounds):  # every version once a round, so that a slow spell of the GPU hits them all
                rounds.append((
                    {v: time_version(avo_ops, case, shape, dtype, v, timer) for v in tried},
                    time_chunk_sizes(avo_ops, case, shape, dtype, timer) if chunked else {},
                    time_cluster_blocks(avo_ops, case, shape, dtype, timer) if clustered else {},
                    time_tiled_kernels(avo_ops, case, shape, dtype, timer) if tiled else {},
                    time_row_prefetch(avo_ops, case, shape, dtype, timer) if prefetched else {}))
            times, chunk_times, block_times, tiled_times, prefetch_times = (median_of_rounds(list(r))
                                                                            for r in zip(*rounds))
            timed = [v for v in tried if times[v] is not None]
            vectors = n * dtype.itemsize // 16
            measurements.append({"op": op, "kernel": ROLES[direction], "dtype": dtype_name, "row_length": n,
                                 "vectors": vectors, "shape": list(shape),
                                 **{f"{v}_us": round(times[v], 2) for v in timed},
                                 **{f"{k}_us": round(t, 2) for k, t in chunk_times.items()},
                                 **{f"{k}_us": round(t, 2) for k, t in block_times.items()},
                                 **{f"{k}_us": round(t, 2) for k, t in tiled_times.items()},
                                 **{f"{k}_us": round(t, 2) for k, t in prefetch_times.items()}})
            chunk_note = ([f"{k} {t:.1f} us" for k, t in chunk_times.items()] or ["chunks the same either way"]
                          if chunked else [])
            block_note = ([f"{k} {t:.1f} us" for k, t in block_times.items()] or ["cluster blocks the same either way"]
                          if clustered else [])
            tiled_note = ([f"{k} {t:.1f} us" for k, t in tiled_times.items()] or ["the tiled version in two kernels only"]
                          if tiled else [])
            prefetch_note = ([f"{k} {t:.1f} us" for k, t in prefetch_times.items()]
                             or ["no cluster rows with per-column sums"] if prefetched else [])
            print(f"[{i}/{len(plan)}] {op}.{direction} {dtype_name} N={n}: "
                  + ", ".join([f"{v} {times[v]:.1f} us" if times[v] is not None else f"{v} cannot take it"
                               for v in tried] + chunk_note + block_note + tiled_note + prefetch_note),
                  file=sys.stderr, flush=True)
    found = {group: thresholds(points, table_names, args.margin, args.tolerance,
                               None if args.fresh else previous_lines(previous, group, table_names))
             for group, points in by_group(measurements).items()}
    run = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": shlex.join([os.path.basename(sys.executable), *sys.argv]),
           "torch": torch.__version__, "cuda": torch.version.cuda}
    header = {"arch": arch, "gpu": gpu,
              "rule": rule_text(args.margin, args.tolerance, kept=not args.fresh)}
    result = merged_file(previous, found, measurements, run, header)
    write_tuning(out, result)
    changes = changed_lines(previous, result)
    print(f"lines changed: {len(changes)}")
    for change in changes:
        print(f"  {change}")
    return 0


def changed_lines(before: dict, after: dict) -> list[str]:
    """Every line of the tables that differs between two tuning files, as "table op kernel
    dtype: before -> after" (16-byte vectors; "never" for null, "none" where the line was
    not in the file)."""
    def shown(line):
        return "never" if line is None else str(line)

    changes = []
    for name in TABLE_VERSIONS:
        for op, roles in after.get(name, {}).items():
            for role, by_dtype in roles.items():
                for dtype, line in by_dtype.items():
                    old = before.get(name, {}).get(op, {}).get(role, {})
                    if dtype not in old or old[dtype] != line:
                        was = shown(old[dtype]) if dtype in old else "none"
                        changes.append(f"{name} {op} {role} {dtype}: {was} -> {shown(line)}")
    return changes


def rule_text(margin: float, tolerance: float, kept: bool = True) -> str:
    """The rule of thresholds(), as the tuning file states it; `kept`: with the lines it
    keeps from the file (settled)."""
    parts = {False: [], True: []}
    for table, (*incumbents, challenger) in TABLE_VERSIONS.items():
        rows = f" (N <= {STAGED_MAX_LENGTH})" if table in SHORT_ROW_TABLES else ""
        against = incumbents[0] if len(incumbents) == 1 else \
            f"the fastest of {', '.join(incumbents[:-1])} and {incumbents[-1]} that were timed"
        parts[table in UP_TO_TABLES].append(f"{challenger} against {against}{rows}")
    return (f"each version from the shortest row where it is faster than the others by more than {margin:.0%} "
            f"and slower by no more than {tolerance:.0%} at every longer row: " + "; ".join(parts[False])
            + "; and up to the longest row where it is faster by more than that and slower by no more than that "
            "at every shorter row: " + "; ".join(parts[True]) + "; null: never"
            + (f"; a line the file had stays where the version it gives is no slower than the new line's by more "
               f"than {margin:.0%} at every row timed" if kept else ""))


def recompute(path: str, tables: list[str], margin: float, tolerance: float, out: str | None = None) -> int:
    """--recompute: `tables` of the file at `path` computed again from the measurements
    of its last run, by the current rule; nothing timed; written to `out`, else to `path`.
    A table whose version that run did not time keeps its values (say global after a run
    of --tables staged)."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    last = len(data.get("runs", [])) - 1
    measured = [m for m in data.get("measurements", []) if m.get("run", 0) == max(last, 0)]
    for (op, role, dtype_name), points in by_group(measured).items():
        timed = [t for t in tables if any(f"{TABLE_VERSIONS[t][-1]}_us" in m for m in points)]
        for name, value in thresholds(points, timed, margin, tolerance).items():
            data.setdefault(name, {}).setdefault(op, {}).setdefault(role, {})[dtype_name] = value
    data["rule"] = rule_text(margin, tolerance, kept=False)
    write_tuning(out or path, data)
    return 0


def write_tuning(path: str, data: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    print(f"wrote {path}")
    for name in TABLE_VERSIONS:
        print(name)
        for op, roles in data.get(name, {}).items():
            for role, by_dtype in roles.items():
                print(f"  {op:16} {role:8} " + "  ".join(f"{d}: {v if v is not None else 'never'}"
                                                         for d, v in by_dtype.items()))


if __name__ == "__main__":
    sys.exit(main())

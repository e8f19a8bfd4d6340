"""The measured part of the row kernels' dispatch: JSON files in tuning/, written by
benchmarks/tune_rows.py on a GPU and read here at generation time, so that the
thresholds land in the generated .cu sources. Two kinds of file:

  - tuning/sm_<arch>.json (tuning/sm_90.json): the table of every GPU of that compute
    capability without a file of its own; its "gpu" names the GPU it was measured on;
  - tuning/sm_<arch>-<gpu>.json (tuning/sm_90-nvidia-h100-80gb-hbm3.json): the table of
    the GPU whose device name is its "gpu" exactly; <gpu> is that name in lower case,
    each run of other characters than letters and digits a "-" (gpu_file_key).

GPUs of one architecture differ in memory rate and clocks, and so in where one version
overtakes another (the H100 and the H200 are both sm_90).

A file holds, besides how it was measured, eleven tables. For each row op and kernel
("forward", "backward") and element type: the row length in 16-byte vectors from which
the staged (shared-memory) version beats the register version, the one from which the
global version beats every other, the one from which the register version pipelined
(loading the next row while it computes one) beats it unpipelined, the one from which
the tiled version (backwards with per-column sums) beats every other, the one from
which the cluster version beats the register and staged versions on rows they hold,
and the one from which the register version on wide rows (groups of 512 threads holding
twice the vectors) beats it pipelined and not; and for backwards with per-column sums,
the one from which coarse chunks of rows (rows_per_chunk in avo/row_args.h) beat the fine
ones; and for kernels without per-column sums, the longest row up to which the
register version on narrow rows (twice the threads holding half the vectors) beats it
pipelined, not and on wide rows; and for the cluster version without per-column sums,
the one from which small blocks (a quarter of the threads) beat the full ones; and for
backwards with per-column sums, the one from which the tiled version run as one kernel
beats it run as two; and for the cluster version with per-column sums, the one from
which prefetching the rows of its chunks into L2 beats not doing so; null where it never
does. A file may
leave out any table but "staged_min_vectors"; the version of a table it leaves out is
never taken by choice:

    {"arch": 90, "gpu": "NVIDIA H200",
     "staged_min_vectors": {"layernorm": {"forward": {"float16": 512, "bfloat16": 512, "float32": null}, ...}},
     "global_min_vectors": {"softmax": {"forward": {"float16": 8192, ...}, ...}, ...}}
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

from .errors import SpecError

TUNING_DIR = "tuning"
DTYPES = ("float16", "bfloat16", "float32")  # the order of the arrays of avo::RowTuning
TABLES = ("staged_min_vectors", "global_min_vectors", "pipelined_min_vectors", "tiled_min_vectors",
          "cluster_min_vectors", "wide_min_vectors", "coarse_chunks_min_vectors",
          "narrow_max_vectors", "small_cluster_blocks_min_vectors", "one_kernel_min_vectors",
          "prefetch_min_vectors")  # avo::RowTuning's order
# The tables that give a version rows up to a length (the others: from a length on).
UP_TO_TABLES = ("narrow_max_vectors",)
ROLES = ("forward", "backward")


@dataclass(frozen=True)
class ArchTuning:
    arch: int  # compute capability, major * 10 + minor
    gpu: str  # the device name of the GPU it was measured on ("" where the file has none)
    own: bool  # the table of that GPU alone (sm_<arch>-<gpu>.json), not of its arch
    # table name (TABLES) -> (op, role, dtype) -> threshold in vectors; absent or None:
    # never by choice
    thresholds: dict[str, dict[tuple[str, str, str], int | None]]

    def threshold(self, table: str, op: str, role: str, dtype: str) -> int | None:
        return self.thresholds[table].get((op, role, dtype))


def gpu_file_key(name: str) -> str:
    """The part of a GPU's own tuning file's name that names it: "NVIDIA H100 80GB HBM3"
    -> "nvidia-h100-80gb-hbm3"."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def tuning_file_name(arch: int, gpu: str | None = None) -> str:
    """tuning/'s file of the GPUs of `arch`, or of the GPU named `gpu` alone."""
    return f"sm_{arch}.json" if gpu is None else f"sm_{arch}-{gpu_file_key(gpu)}.json"


def load_tunings(root: str) -> list[ArchTuning]:
    """Every tuning file under `root`, newest architecture first, and within one the
    GPUs' own files before the architecture's: the order the dispatch tries them in."""
    folder = os.path.join(root, TUNING_DIR)
    if not os.path.isdir(folder):
        return []
    tunings = []
    for name in sorted(os.listdir(folder)):
        match = re.fullmatch(r"sm_(\d+)(?:-([a-z0-9-]+))?\.json", name)
        if match:
            tunings.append(_parse(os.path.join(folder, name), f"{TUNING_DIR}/{name}", int(match.group(1)),
                                  match.group(2)))
    return sorted(tunings, key=lambda t: (-t.arch, not t.own))


def tuning_for(tunings: list[ArchTuning], arch: int, gpu: str) -> ArchTuning | None:
    """The table the dispatch takes on a GPU of compute capability `arch` whose device
    name is `gpu` (avo::row_thresholds picks the same): its own, else its arch's, else
    none (every version but the register, cluster and global ones never by choice)."""
    for tuning in tunings:
        if tuning.arch == arch and (not tuning.own or tuning.gpu == gpu):
            return tuning
    return None


def _parse(path: str, shown: str, arch: int, gpu_key: str | None) -> ArchTuning:
    def fail(message: str):
        raise SpecError(None, f"{shown}: {message}")

    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as error:
        fail(f"cannot be read: {error}")
    if data.get("arch") != arch:
        fail(f"'arch' is {data.get('arch')!r} but the file name says {arch}")
    gpu = data.get("gpu", "")
    if not isinstance(gpu, str):
        fail(f"'gpu' must be the GPU's device name, got {gpu!r}")
    if gpu_key is not None and gpu_file_key(gpu) != gpu_key:
        fail(f"a GPU's own table must be named after its 'gpu' ({gpu!r}: {tuning_file_name(arch, gpu) if gpu else 'none given'})")
    tables = {}
    for name in TABLES:
        table = data.get(name, None if name == "staged_min_vectors" else {})
        if not isinstance(table, dict):
            fail(f"'{name}' must map op -> kernel -> dtype -> vectors or null")
        tables[name] = _parse_table(table, fail)
    return ArchTuning(arch, gpu, gpu_key is not None, tables)


def _parse_table(table: dict, fail) -> dict[tuple[str, str, str], int | None]:
    thresholds = {}
    for op, roles in table.items():
        if not isinstance(roles, dict) or set(roles) - set(ROLES):
            fail(f"'{op}' must map 'forward'/'backward' to thresholds")
        for role, by_dtype in roles.items():
            if not isinstance(by_dtype, dict) or set(by_dtype) - set(DTYPES):
                fail(f"'{op}.{role}' must map {', '.join(DTYPES)} to thresholds")
            for dtype, value in by_dtype.items():
                if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                    fail(f"'{op}.{role}.{dtype}' must be a positive number of vectors or null, got {value!r}")
                thresholds[(op, role, dtype)] = value
    return thresholds

"""The tiled version of the backwards with per-column sums in two kernels against one
(avo_ops._C.set_tiled_kernels), with the dispatch table's choice and the cluster version
beside them: the tables of this folder. Run from the repository root on a GPU, after the
build; bench_ops' timing (median of 30 CUDA-event-timed calls, inputs rotated beyond L2).

    PYTHONPATH=$PWD AB_DTYPES=bfloat16,float32 AB_N=8192,16384,32768,65536,131072,262144 \
        python benchmarks/results/2026-12-06-h100-one-kernel-tiled/tiled_kernels_ab.py

AB_OPS, AB_DTYPES and AB_N choose the ops, dtypes and row lengths (2^26 elements a call).
"""
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import torch  # noqa: E402
import bench_cases  # noqa: E402
import bench_ops  # noqa: E402
import avo_ops  # noqa: E402

ops = (os.environ.get("AB_OPS") or "layernorm,rmsnorm,swish_layernorm,add_layernorm,add_rmsnorm").split(",")
lengths = [int(n) for n in (os.environ.get("AB_N") or "8192,16384,32768,65536,131072,262144").split(",")]
dtypes = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
chosen = (os.environ.get("AB_DTYPES") or "bfloat16,float16,float32").split(",")
timer = bench_ops.Timer(30, warmup=5)
copy_gbps = max(c["gbps"] for c in bench_ops.measure_copy(timer))
print(f"copy {copy_gbps:.0f} GB/s", flush=True)


def timed(case, arg_sets, version, kernels):
    """Median us of the call forced onto `version` and `kernels`, and what it took."""
    avo_ops._C.set_row_version(version)
    avo_ops._C.set_tiled_kernels(kernels)
    try:
        times = timer.measure(case.avo, arg_sets)
        took = avo_ops._C.last_row_version()
        form = avo_ops._C.last_tiled_kernels() if took == "tiled" else ""
    finally:
        avo_ops._C.set_row_version("auto")
        avo_ops._C.set_tiled_kernels("auto")
    return statistics.median(times), took, form


print("| op | dtype | N | two us | one us | two/one | one frac | auto (took) us | cluster us |")
print("|---|---|---|---|---|---|---|---|---|")
with torch.no_grad():
    for op in ops:
        case = bench_cases.find_case(op, "bwd")
        for name in chosen:
            for n in lengths:
                shape = case.layout((max(1, (1 << 26) // n), n))
                arg_sets = bench_ops.input_sets(case, shape, dtypes[name])
                nbytes = case.nbytes(shape, dtypes[name])
                two, took2, k2 = timed(case, arg_sets, "tiled", "two")
                one, took1, k1 = timed(case, arg_sets, "tiled", "one")
                auto, tooka, ka = timed(case, arg_sets, "auto", "auto")
                cluster, tookc, _ = timed(case, arg_sets, "cluster", "auto")
                frac = nbytes / (one * 1e-6) / 1e9 / copy_gbps
                print(f"| {op} | {name} | {n} | {two:.1f} {took2}/{k2} | {one:.1f} {took1}/{k1} | {two / one:.3f} "
                      f"| {frac:.2f} | {auto:.1f} ({tooka}{'/' + ka if ka else ''}) | {cluster:.1f} ({tookc}) |",
                      flush=True)
                del arg_sets
                torch.cuda.empty_cache()

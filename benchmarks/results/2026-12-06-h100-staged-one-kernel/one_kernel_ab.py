"""The backwards with per-column sums forced onto the tiled version in one kernel, timed
with bench_ops' timer (median of 30 CUDA-event-timed calls, inputs rotated beyond L2), as
a fraction of the copy bandwidth measured in the same run. Run from the repository root
of a build, on a GPU:

    PYTHONPATH=$PWD AVO_ONE_KERNEL_VARIANT=new AB_OUT=new.json \
        python benchmarks/results/2026-12-06-h100-staged-one-kernel/one_kernel_ab.py

AVO_ONE_KERNEL_VARIANT labels the run (the experiment build of experiment_variants.diff
also reads it to pick a variant); AB_OPS, AB_DTYPES and AB_N choose the cases (2^26
elements a call)."""
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import torch  # noqa: E402
import bench_cases  # noqa: E402
import bench_ops  # noqa: E402
import avo_ops  # noqa: E402

ops = os.environ.get("AB_OPS", "layernorm,rmsnorm,swish_layernorm,add_layernorm,add_rmsnorm").split(",")
lengths = [int(n) for n in os.environ.get("AB_N", "16384,65536,262144").split(",")]
dtypes = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
chosen = os.environ.get("AB_DTYPES", "bfloat16,float32").split(",")
variant = os.environ.get("AVO_ONE_KERNEL_VARIANT", "0")
timer = bench_ops.Timer(30, warmup=5)
copy_gbps = max(c["gbps"] for c in bench_ops.measure_copy(timer))
out = {"copy": copy_gbps, "variant": variant, "rows": []}
with torch.no_grad():
    for op in ops:
        case = bench_cases.find_case(op, "bwd")
        for name in chosen:
            for n in lengths:
                shape = case.layout((max(1, (1 << 26) // n), n))
                arg_sets = bench_ops.input_sets(case, shape, dtypes[name])
                nbytes = case.nbytes(shape, dtypes[name])
                avo_ops._C.set_row_version("tiled")
                avo_ops._C.set_tiled_kernels("one")
                t = statistics.median(timer.measure(case.avo, arg_sets))
                k = avo_ops._C.last_tiled_kernels()
                avo_ops._C.set_row_version("auto")
                avo_ops._C.set_tiled_kernels("auto")
                frac = nbytes / (t * 1e-6) / 1e9 / copy_gbps
                out["rows"].append([op, name, n, t, frac, k])
                print(f"v{variant} {op} {name} {n} {t:.1f}us {frac:.3f} {k}", flush=True)
                del arg_sets
                torch.cuda.empty_cache()
json.dump(out, open(os.environ["AB_OUT"], "w"))

"""../2026-12-06-h100-short-row-profile/profile_short_case.py with Liger-Kernel beside avo
and torch.compile. From the repository's root:
python benchmarks/results/2026-12-06-h100-rows-behind-profile/profile_case.py
avo|compile|liger OP DTYPE N fwd|bwd (DTYPE a torch name: bfloat16). Three calls warm up
(and compile), then one call inside the NVTX range "measured", which ncu --nvtx-include
measured/ profiles alone."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import avo_ops  # noqa: E402
import bench_cases  # noqa: E402
import bench_ops  # noqa: E402
import liger_baselines  # noqa: E402

impl, op, dtype, n, direction = sys.argv[1], sys.argv[2], getattr(torch, sys.argv[3]), int(sys.argv[4]), sys.argv[5]
case = bench_cases.find_case(op, direction)
arg_sets = bench_ops.input_sets(case, case.layout(((1 << 26) // n, n)), dtype)
if impl == "liger":
    li = liger_baselines.load(bench_cases.LN_EPS, bench_cases.RMS_EPS)[(op, direction)]
    if li.prepare is not None:
        arg_sets = [li.prepare(*a) for a in arg_sets]
    call = li.fn
else:
    call = case.avo if impl == "avo" else torch.compile(case.eager, fullgraph=True, dynamic=False)
with torch.no_grad():
    for args in arg_sets[:3]:
        call(*args)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("measured")
    call(*arg_sets[0])
    torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
print(impl, op, direction, n, avo_ops._C.last_row_version() if impl == "avo" else "")

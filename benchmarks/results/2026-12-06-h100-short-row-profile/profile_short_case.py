"""../2026-12-06-h100-cluster-forward-profile/profile_case.py with torch.compile's call
beside avo's, and the profiled call marked: from the repository's root,
python benchmarks/results/2026-12-06-h100-short-row-profile/profile_short_case.py
avo|compile OP DTYPE N fwd|bwd (DTYPE a torch name: bfloat16). Three calls warm up (and
compile), then one call inside the NVTX range "measured", which ncu --nvtx-include
measured/ profiles alone."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import avo_ops  # noqa: E402
import bench_cases  # noqa: E402
import bench_ops  # noqa: E402

impl, op, dtype, n, direction = sys.argv[1], sys.argv[2], getattr(torch, sys.argv[3]), int(sys.argv[4]), sys.argv[5]
case = bench_cases.find_case(op, direction)
arg_sets = bench_ops.input_sets(case, case.layout(((1 << 26) // n, n)), dtype)
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

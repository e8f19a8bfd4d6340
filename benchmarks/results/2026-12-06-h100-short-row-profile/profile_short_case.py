"""One call of a benchmark case for Nsight Compute, from the repository's root:
python benchmarks/results/2026-12-06-h100-short-row-profile/profile_short_case.py
avo|compile OP DTYPE N fwd|bwd (DTYPE a torch name: bfloat16). Three calls warm up (and
compile), then one call inside the NVTX range "measured", which ncu --nvtx-include
measured/ profiles alone."""
import os, sys, torch
sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import bench_cases, bench_ops, avo_ops
impl, op, dt, n, d = sys.argv[1], sys.argv[2], getattr(torch, sys.argv[3]), int(sys.argv[4]), sys.argv[5]
case = bench_cases.find_case(op, d)
shape = case.layout(((1 << 26) // n, n))
arg_sets = bench_ops.input_sets(case, shape, dt)
fn = case.avo if impl == "avo" else torch.compile(case.eager, fullgraph=True, dynamic=False)
with torch.no_grad():
    for a in arg_sets[:3]: fn(*a)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("measured")
    fn(*arg_sets[0])
    torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
print(impl, op, d, n, avo_ops._C.last_row_version() if impl == "avo" else "")

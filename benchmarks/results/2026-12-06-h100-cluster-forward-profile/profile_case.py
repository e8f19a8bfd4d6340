"""Runs one op's avo call three times on the benchmark's inputs (2^26 elements), for a
profiler to catch its kernel: python profile_case.py OP DTYPE N DIR, e.g.
ncu -k regex:row_kernel -c 1 python profile_case.py layernorm bfloat16 65536 fwd.
Prints the row version the dispatch took and a cluster row's block threads."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import avo_ops  # noqa: E402
import bench_cases  # noqa: E402
import bench_ops  # noqa: E402

op, dtype, n, direction = sys.argv[1], getattr(torch, sys.argv[2]), int(sys.argv[3]), sys.argv[4]
case = bench_cases.find_case(op, direction)
arg_sets = bench_ops.input_sets(case, case.layout(((1 << 26) // n, n)), dtype)
with torch.no_grad():
    for args in arg_sets[:3]:
        case.avo(*args)
torch.cuda.synchronize()
print(op, direction, n, avo_ops._C.last_row_version(), avo_ops._C.last_cluster_block_threads())

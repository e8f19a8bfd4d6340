#!/usr/bin/env bash
# ncu of the rows behind another implementation: avo vs Liger vs torch.compile, one call each.
# Needs a built tree (run after a build). Writes $OUT/miss.tgz.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
W=/tmp/wm; rm -rf $W; mkdir -p $W
NCU=/usr/local/cuda/bin/ncu
M=gpu__time_duration.sum,launch__registers_per_thread,launch__grid_size,launch__block_size,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,dram__bytes.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__occupancy_limit_registers,smsp__warps_eligible.avg.per_cycle_active,smsp__issue_active.avg.pct_of_peak_sustained_active
for c in "rmsnorm bfloat16 4096 fwd" "rmsnorm float32 4096 fwd" "layernorm bfloat16 256 fwd" "add_layernorm bfloat16 4096 bwd"; do
  set -- $c
  impls="avo compile"; case $1 in rmsnorm) impls="avo liger compile";; esac
  for impl in $impls; do
    timeout 120 $NCU --clock-control none --nvtx --nvtx-include measured/ --metrics $M python3 benchmarks/results/2026-12-06-h100-rows-behind-profile/profile_case.py $impl $c > $W/$impl-$1-$2-$3-$4.txt 2>&1
    echo "== $impl $c rc=$?"; grep -E "^  [a-z_]+.*(\(|$)|gpu__time|registers_per|grid_size|block_size|warps_active|inst_executed|dram__bytes|dram__thr|limit_reg|eligible|issue_active" $W/$impl-$1-$2-$3-$4.txt | grep -v "^==PROF" | head -40
    tar czf $OUT/miss.tgz -C $W . 2>/dev/null
  done
done

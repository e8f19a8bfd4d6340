#!/usr/bin/env bash
# Any GPU: A/B of benchmarks/results/2026-12-06-h100-fixed-backward-widths/fixed_backward_widths.diff (fixed group widths also for the
# pipelined rows and the backwards with per-column sums) against HEAD; tests of the new build.
set -uo pipefail
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
LIMIT=${LIMIT:-580}  # the run here had LIMIT=340
left() { [ $SECONDS -lt $((LIMIT - $1)) ]; }
W=/tmp/wb; rm -rf $W; mkdir -p $W
step() { echo "[$SECONDS s] $*"; tar czf $OUT/bw.tgz -C $W . 2>/dev/null; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import sys,torch; print("python", sys.version.split()[0], "torch", torch.__version__, "CUDA", torch.version.cuda)'
  nvcc --version | tail -n 1; python3 -c 'import triton; print("triton", triton.__version__)'; } > $W/gpu.txt 2>&1; cat $W/gpu.txt
BASE=$PWD; NEW=/tmp/new; rm -rf $NEW; cp -r $BASE $NEW
(cd $NEW && git apply benchmarks/results/2026-12-06-h100-fixed-backward-widths/fixed_backward_widths.diff) || { echo "diff does not apply"; exit 1; }
(cd $BASE && MAX_JOBS=8 python3 setup.py build_ext --inplace > $W/build_base.log 2>&1; echo $? > $W/build_base.rc) &
(cd $NEW && MAX_JOBS=8 python3 setup.py build_ext --inplace > $W/build_new.log 2>&1; echo $? > $W/build_new.rc) &
wait; step "built base=$(cat $W/build_base.rc) new=$(cat $W/build_new.rc)"
grep -q 0 $W/build_new.rc || { tail -30 $W/build_new.log; exit 1; }
(cd $NEW && PYTHONPATH=$NEW timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_norms.py tests/test_channel_norm.py -k "not cpu and ((every_kernel_version and (200 or 512 or 1024 or 2000)) or group_width)" > $W/tests-new.log 2>&1)
step "tests new rc=$? $(tail -n1 $W/tests-new.log)"; grep -E "^(FAILED|ERROR)" $W/tests-new.log | head -20
OPS=layernorm,rmsnorm,swish_layernorm,add_layernorm,add_rmsnorm,channel_norm
for i in 1 2; do
  left 60 || break
  for run in base new; do
    d=$([ $run = base ] && echo $BASE || echo $NEW)
    (cd $d && PYTHONPATH=$d python3 benchmarks/bench_ops.py --ops $OPS --dirs bwd --dtypes bf16,fp16 --row-lengths 256,512,1024,2048 --no-compile --no-liger --no-progress --commit $run --json $W/bwd-$run-$i.json > $W/bwd-$run-$i.md 2>$W/bwd-$run-$i.log)
    step "bench $run $i"
  done
  PYTHONPATH=$BASE python3 benchmarks/compare_runs.py $W/bwd-base-$i.json $W/bwd-new-$i.json --markdown $W/cmp-bwd-$i.md | sed -n '/^| op | dir | cases/,$p' | tail -10
done
step done

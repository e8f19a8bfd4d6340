#!/usr/bin/env bash
# The narrow line (and, on an H200, the one-kernel line) of this GPU's table measured again:
# build, sweep before, tune, regenerate, build, sweep after, the lines' tests.
# From the repository root; writes $OUT/h200.tgz.
set -uo pipefail
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$PWD
LIMIT=${LIMIT:-560}
left() { [ $SECONDS -lt $((LIMIT - $1)) ]; }
W=/tmp/wh; rm -rf $W; mkdir -p $W
step() { echo "[$SECONDS s] $*"; tar czf $OUT/h200.tgz -C $W . 2>/dev/null; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import sys,torch; print("python", sys.version.split()[0], "torch", torch.__version__, "CUDA", torch.version.cuda)'
  nvcc --version | tail -n 1; python3 -c 'import triton; print("triton", triton.__version__)'; } > $W/gpu.txt 2>&1; cat $W/gpu.txt
H200=0; grep -q H200 $W/gpu.txt && H200=1; echo "H200=$H200"
build() { MAX_JOBS=16 python3 setup.py build_ext --inplace > $W/build_$1.log 2>&1 || { echo BUILD FAILED; tail -20 $W/build_$1.log; step buildfail; exit 1; }; step "built $1"; }
build 0
python3 benchmarks/bench_ops.py --no-compile --no-liger --no-progress --commit before --json $W/before.json > $W/before.md 2>$W/before.log; step "sweep before rc=$?"
L=256,512,1024,2048,4096,8192
python3 benchmarks/tune_rows.py --tables narrow --kernels forward --row-lengths $L --reps 30 > $W/tune_narrow_forward.log 2>&1; step "tune narrow fwd rc=$?"; tail -n 12 $W/tune_narrow_forward.log
python3 benchmarks/tune_rows.py --tables narrow --kernels backward --ops softmax,log_softmax,channel_norm --row-lengths $L --reps 30 > $W/tune_narrow_backward.log 2>&1; step "tune narrow bwd rc=$?"
PG=layernorm,rmsnorm,swish_layernorm,add_layernorm,add_rmsnorm
LL=8192,16384,32768,65536,131072,262144
[ $H200 = 1 ] && left 330 && { python3 benchmarks/tune_rows.py --tables one_kernel --kernels backward --ops $PG --row-lengths $LL --reps 30 > $W/tune_one_kernel.log 2>&1; step "tune one rc=$?"; tail -n 7 $W/tune_one_kernel.log; }
cp tuning/*.json $W/; git diff tuning/ > $W/tuning.diff; git diff --stat tuning/
left 200 || { step "no time to rebuild"; exit 0; }
python3 -m generator > /dev/null && build 1
ONE=0; [ $H200 = 1 ] && ONE=$(python3 -c 'import json; t=json.load(open("tuning/sm_90.json")).get("one_kernel_min_vectors", {}); print(sum(v is not None for o in t.values() for k in o.values() for v in k.values()))' 2>&1); echo "one-kernel entries: $ONE"
if [ "$ONE" != 0 ] && left 260; then
  python3 benchmarks/tune_rows.py --tables tiled --kernels backward --ops $PG --row-lengths $LL --reps 30 > $W/tune_tiled.log 2>&1; step "tune tiled rc=$?"; tail -n 7 $W/tune_tiled.log
  cp tuning/*.json $W/; git diff tuning/ > $W/tuning.diff
  python3 -m generator > /dev/null && build 2
fi
python3 benchmarks/bench_ops.py --no-compile --no-liger --no-progress --commit after --json $W/results.json > $W/results.md 2>$W/results.log; step "sweep after rc=$?"
python3 benchmarks/compare_runs.py $W/before.json $W/results.json --markdown $W/compare.md | sed -n '/^| op | dir | cases/,$p' | tail -24
left 25 && { timeout $((LIMIT - SECONDS - 8)) python3 -m pytest -q -p no:cacheprovider tests/test_norms.py tests/test_tuning.py -k "not cpu and (narrow or table or tuning or one_kernel)" > $W/tests-line.log 2>&1; step "line tests rc=$? $(tail -n1 $W/tests-line.log)"; grep -E "^FAILED" $W/tests-line.log | head; }
step done

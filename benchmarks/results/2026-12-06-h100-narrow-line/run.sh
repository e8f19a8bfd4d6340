#!/usr/bin/env bash
# The narrow line of this GPU's table measured again now that 16-bit short rows take kernels
# of fixed group widths (both sides of the line): build, forward sweep, tune, regenerate,
# build, sweep, the line's tests. From the repository's root; writes $OUT/narrow.tgz.
set -uo pipefail
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$PWD
LIMIT=${LIMIT:-270}
left() { [ $SECONDS -lt $((LIMIT - $1)) ]; }
W=/tmp/wn; rm -rf $W; mkdir -p $W
step() { echo "[$SECONDS s] $*"; tar czf $OUT/narrow.tgz -C $W . 2>/dev/null; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import sys,torch; print("python", sys.version.split()[0], "torch", torch.__version__, "CUDA", torch.version.cuda)'
  nvcc --version | tail -n 1; python3 -c 'import triton; print("triton", triton.__version__)'; } > $W/gpu.txt 2>&1; cat $W/gpu.txt
build() { MAX_JOBS=16 python3 setup.py build_ext --inplace > $W/build_$1.log 2>&1 || { echo BUILD FAILED; tail -20 $W/build_$1.log; exit 1; }; step "built $1"; }
build 0
OPS=layernorm,rmsnorm,channel_norm,softmax,log_softmax,swish_layernorm,add_layernorm,add_rmsnorm
L=256,512,1024,2048,4096,8192
python3 benchmarks/bench_ops.py --ops $OPS --dirs fwd --row-lengths $L --no-compile --no-liger --no-progress --json $W/before.json > $W/before.md 2>$W/before.log; step "sweep before rc=$?"
python3 benchmarks/tune_rows.py --tables narrow --kernels forward --row-lengths $L --reps 30 > $W/tune_narrow_forward.log 2>&1; step "tune fwd rc=$?"; tail -10 $W/tune_narrow_forward.log
left 150 && { python3 benchmarks/tune_rows.py --tables narrow --kernels backward --ops softmax,log_softmax,channel_norm --row-lengths $L --reps 30 > $W/tune_narrow_backward.log 2>&1; step "tune bwd rc=$?"; tail -5 $W/tune_narrow_backward.log; }
cp tuning/*.json $W/; git diff --stat tuning/ > $W/tuning.diffstat; git diff tuning/ > $W/tuning.diff
left 110 || { step "no time to rebuild"; exit 0; }
python3 -m generator > /dev/null && build 1
python3 benchmarks/bench_ops.py --ops $OPS --dirs fwd --row-lengths $L --no-compile --no-liger --no-progress --json $W/results.json > $W/results.md 2>$W/results.log; step "sweep after rc=$?"
python3 benchmarks/compare_runs.py $W/before.json $W/results.json --markdown $W/compare.md | sed -n '/^| op | dir | cases/,$p' | tail -12
left 20 && { timeout $((LIMIT - SECONDS - 5)) python3 -m pytest -q -p no:cacheprovider tests/test_norms.py -k "not cpu and (narrow or table)" > $W/tests-line.log 2>&1; step "line tests rc=$? $(tail -n1 $W/tests-line.log)"; grep -E "^FAILED" $W/tests-line.log | head; }
step done

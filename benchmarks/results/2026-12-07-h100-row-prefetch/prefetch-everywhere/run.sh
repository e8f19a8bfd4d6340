#!/usr/bin/env bash
# One GPU call, all outputs in results.tgz: build this tree and the base (.prof/base.tgz,
# 855df36) side by side; rounds of: base forwards, this tree with row prefetch off, on
# (full avo+eager sweep); then host time and CUDA tests with the default (prefetch on).
set -uo pipefail
FINAL=$OUT; W=/tmp/w; mkdir -p $W
trap 'tar -czf $FINAL/results.tgz -C $W .' EXIT
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
HERE=$PWD; LIMIT=${LIMIT:-570}
left() { echo $(( LIMIT - SECONDS )); }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import sys,torch; print("python", sys.version.split()[0], "torch", torch.__version__, "CUDA", torch.version.cuda)'
  nvcc --version | tail -n 1; } > $W/gpu.txt 2>&1; cat $W/gpu.txt
mkdir -p /tmp/base && tar -xzf .prof/base.tgz -C /tmp/base
(MAX_JOBS=9 python3 setup.py build_ext --inplace > $W/build_this.log 2>&1; echo $? > $W/build_this.rc) &
(cd /tmp/base && MAX_JOBS=7 python3 setup.py build_ext --inplace > $W/build_base.log 2>&1; echo $? > $W/build_base.rc) &
wait; echo "[$SECONDS s] builds: this $(cat $W/build_this.rc) base $(cat $W/build_base.rc)"
[ "$(cat $W/build_this.rc)" = 0 ] || { tail -30 $W/build_this.log; exit 1; }
bench() {  # label tree prefetch args...
  local label=$1 tree=$2 pf=$3; shift 3
  (cd $tree && PYTHONPATH=$tree:$tree/benchmarks timeout $(( $(left) - 60 )) python3 -c "
import sys, avo_ops, bench_ops
if '$pf' != 'none': avo_ops._C.set_row_prefetch('$pf')
sys.exit(bench_ops.main(sys.argv[1:]))" --no-compile --no-liger --no-progress --commit $label --json $W/bench_$label.json "$@" \
    > $W/bench_$label.md 2> $W/bench_$label.log); echo "[$SECONDS s] $label rc=$?"
}
for r in 1 2; do
  [ $(left) -gt 200 ] || break
  [ "$(cat $W/build_base.rc)" = 0 ] && bench base_r$r /tmp/base none --dirs fwd
  bench off_r$r $HERE off
  bench on_r$r $HERE on
  python3 benchmarks/compare_runs.py $W/bench_off_r$r.json $W/bench_on_r$r.json --markdown $W/cmp_off_on_r$r.md | sed -n '/^| op | dir | cases/,$p'
  [ -f $W/bench_base_r$r.json ] && python3 benchmarks/compare_runs.py $W/bench_base_r$r.json $W/bench_off_r$r.json --markdown $W/cmp_base_off_r$r.md | sed -n '/^| op | dir | cases/,$p'
done
export PYTHONPATH=$HERE
[ $(left) -gt 60 ] && timeout 40 python3 benchmarks/bench_host_overhead.py --device cuda --out $W/host > /dev/null 2>&1; echo "[$SECONDS s] host rc=$?"
[ $(left) -gt 20 ] && timeout $(( $(left) )) python3 -m pytest -q -p no:cacheprovider tests/test_norms.py -k "cuda and every_kernel_version and (layernorm or rmsnorm or softmax)" > $W/tests.log 2>&1; echo "[$SECONDS s] tests rc=$?"; tail -2 $W/tests.log

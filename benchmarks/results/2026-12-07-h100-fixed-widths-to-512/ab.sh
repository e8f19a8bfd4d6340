#!/usr/bin/env bash
# Any GPU: A/B of fixed512_v2.diff (in this folder) against the commit it applies to (fed4349):
# every case of the sweep, twice in turn; then the CUDA row tests of the diff's build. Run here with LIMIT=500.
set -uo pipefail
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
LIMIT=${LIMIT:-570}
HERE=benchmarks/results/2026-12-07-h100-fixed-widths-to-512
left() { [ $SECONDS -lt $((LIMIT - $1)) ]; }
W=/tmp/wa; rm -rf $W; mkdir -p $W
step() { echo "[$SECONDS s] $*"; tar czf $OUT/ab.tgz -C $W . 2>/dev/null; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import sys,torch; print("python", sys.version.split()[0], "torch", torch.__version__, "CUDA", torch.version.cuda)'
  nvcc --version | tail -n 1; python3 -c 'import triton; print("triton", triton.__version__)'; } > $W/gpu.txt 2>&1; cat $W/gpu.txt
BASE=$PWD; NEW=/tmp/b_fixed512_v2; rm -rf $NEW; cp -r $BASE $NEW
(cd $NEW && git apply $BASE/$HERE/fixed512_v2.diff) || { echo "the diff does not apply"; exit 1; }
(cd $BASE && MAX_JOBS=9 python3 setup.py build_ext --inplace > $W/build_base.log 2>&1; echo $? > $W/build_base.rc) &
(cd $NEW && MAX_JOBS=9 python3 setup.py build_ext --inplace > $W/build_fixed512_v2.log 2>&1; echo $? > $W/build_fixed512_v2.rc) &
wait; step "built base=$(cat $W/build_base.rc) fixed512_v2=$(cat $W/build_fixed512_v2.rc)"
for i in 1 2; do
  left 110 || break
  for n in base fixed512_v2; do
    d=$([ $n = base ] && echo $BASE || echo $NEW)
    (cd $d && PYTHONPATH=$d python3 benchmarks/bench_ops.py --no-compile --no-liger --no-progress --commit $n --json $W/$n-$i.json > $W/$n-$i.md 2>$W/$n-$i.log)
    step "sweep $n $i rc=$?"
  done
  PYTHONPATH=$BASE python3 benchmarks/compare_runs.py $W/base-$i.json $W/fixed512_v2-$i.json --markdown $W/cmp-fixed512_v2-$i.md | sed -n '/^| op | dir | cases/,$p' | tail -14
done
left 30 && { (cd $NEW && PYTHONPATH=$NEW timeout $((LIMIT - SECONDS - 10)) python3 -m pytest -q -p no:cacheprovider -x tests/test_norms.py tests/test_channel_norm.py -k "not cpu and (group_width or (every_kernel_version and (register or narrow or auto)))" > $W/tests-fixed512_v2.log 2>&1); step "tests rc=$? $(tail -n1 $W/tests-fixed512_v2.log)"; }
step done

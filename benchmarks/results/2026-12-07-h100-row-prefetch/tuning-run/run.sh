#!/usr/bin/env bash
# One GPU call, outputs in results.tgz: build; the prefetch tests; the tuner's prefetch
# line for the backwards with per-column sums; then CUDA tests until the limit.
set -uo pipefail
FINAL=$OUT; W=/tmp/w; mkdir -p $W
trap 'cp tuning/*.json $W/ 2>/dev/null; tar -czf $FINAL/results.tgz -C $W .' EXIT
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$PWD
LIMIT=${LIMIT:-570}
left() { echo $(( LIMIT - SECONDS )); }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import sys,torch; print("python", sys.version.split()[0], "torch", torch.__version__, "CUDA", torch.version.cuda)'
  nvcc --version | tail -n 1; } > $W/gpu.txt 2>&1; cat $W/gpu.txt
MAX_JOBS=16 python3 setup.py build_ext --inplace > $W/build.log 2>&1 || { echo BUILD FAILED; tail -30 $W/build.log; exit 1; }
echo "[$SECONDS s] built"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_norms.py -k "prefetch or row_kernel_setters" > $W/tests_prefetch.log 2>&1
echo "[$SECONDS s] prefetch tests rc=$?"; tail -3 $W/tests_prefetch.log
timeout $(( $(left) - 150 )) python3 benchmarks/tune_rows.py --tables prefetch --kernels backward \
  --ops layernorm,rmsnorm,swish_layernorm,add_layernorm,add_rmsnorm --row-lengths 1024,2048,4096,8192,16384,32768,65536 \
  --rounds 2 > $W/tune.log 2>&1; echo "[$SECONDS s] tune rc=$?"; grep -v "no cluster rows" $W/tune.log | tail -40
[ $(left) -gt 30 ] && timeout $(( $(left) - 15 )) python3 -m pytest -q -p no:cacheprovider tests/test_norms.py -k "cuda and (cluster or every_kernel_version) and not small and not prefetch" > $W/tests_cuda.log 2>&1
echo "[$SECONDS s] cuda tests rc=$?"; tail -3 $W/tests_cuda.log

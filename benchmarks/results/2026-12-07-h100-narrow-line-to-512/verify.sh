#!/usr/bin/env bash
# The build and the narrow and table tests again, after the test fix (second call).
set -uo pipefail
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
MAX_JOBS=16 python3 setup.py build_ext --inplace > $OUT/build.log 2>&1 || { echo BUILD FAILED; tail -20 $OUT/build.log; exit 1; }
echo "[$SECONDS s] built"
python3 -m pytest -q -p no:cacheprovider tests/test_norms.py tests/test_tuning.py -k "not cpu and (narrow or table or tuning or one_kernel)" 2>&1 | tee $OUT/tests-line.log | tail -n 5
echo "[$SECONDS s] done"

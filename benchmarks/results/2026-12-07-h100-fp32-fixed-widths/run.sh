#!/usr/bin/env bash
# One GPU call: fp32 fixed group widths + rmsnorm's 32-register fixed kernels (this tree)
# against 855df36, the tree before them (base.tgz: `git archive 855df36 | gzip`): builds,
# tests, forward sweeps in turn; then host time, baselines and this tree's tuner times.
# From the repository root, with the Liger-Kernel wheel in .whl/: LIMIT=585 bash run.sh
set -uo pipefail
R=$OUT
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import sys,torch; print("python", sys.version.split()[0], "torch", torch.__version__, "CUDA", torch.version.cuda)'
  nvcc --version | tail -n 1; python3 -c 'import triton; print("triton", triton.__version__)'; } > $R/gpu.txt 2>&1; cat $R/gpu.txt
mkdir -p /tmp/base && tar -xzf base.tgz -C /tmp/base
TESTS='group_width or (every_kernel_version_matches and float32 and (register or narrow or lean or auto))' \
BENCH_ARGS='--no-compile --no-liger --dirs fwd --row-lengths 256,1024,2048,4096,8192,16384,32768' ROUNDS=3 \
  timeout 400 bash scripts/gpu_compare.sh /tmp/base > $R/compare.log 2>&1; echo "[$SECONDS s] compare rc=$?"
grep -E "builds done|tests|total" $R/compare.log
left() { echo $(( ${LIMIT:-585} - SECONDS )); }
export PYTHONPATH=$PWD
timeout 60 python3 benchmarks/bench_host_overhead.py --device cuda --out $R/host > /dev/null 2>&1; echo "[$SECONDS s] host rc=$?"
PYTHONPATH=$PWD:/tmp/site timeout $(( $(left) > 200 ? 150 : $(left) - 50 )) python3 benchmarks/bench_ops.py --no-avo --dirs fwd --dtypes fp32,bf16 \
  --ops rmsnorm,channel_norm --row-lengths 4096,16384 --no-progress --json $R/baselines.json > $R/baselines.md 2> $R/baselines.log; echo "[$SECONDS s] baselines rc=$?"
case "$(head -1 $R/gpu.txt)" in *H100*) T=tuning/sm_90-nvidia-h100-80gb-hbm3.json ;; *) T=tuning/sm_90.json ;; esac
cp $T $R/tune_wide.json
timeout $(( $(left) - 5 )) python3 benchmarks/tune_rows.py --tables wide_min_vectors --ops rmsnorm,channel_norm,layernorm --kernels forward --dtypes float32,bfloat16 \
  --row-lengths 4096,8192,16384,32768 --rounds 3 --out $R/tune_wide.json > $R/tune.log 2>&1; echo "[$SECONDS s] tune rc=$?"
grep "^\[" $R/tune.log | tail -24; tail -8 $R/tune.log

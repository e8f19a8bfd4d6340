#!/usr/bin/env bash
# Every CUDA test and the host time, on the tree with the retuned table.
R=$OUT; export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $R/gpu.txt
python3 -c "import torch, sys; print(torch.__version__, torch.version.cuda, sys.version.split()[0])" | tee -a $R/gpu.txt
s=$(date +%s)
MAX_JOBS=16 python3 setup.py build_ext --inplace > $R/build.log 2>&1; echo "build rc=$? $(( $(date +%s) - s )) s"
timeout 100 python3 benchmarks/bench_host_overhead.py --device cuda --out $R/host1 > $R/host1.log 2>&1; echo "host rc=$? $(( $(date +%s) - s )) s"
T="python3 -m pytest -q -p no:cacheprovider --durations=5"
OTHERS=$(ls tests/test_*.py | grep -v -E "test_norms.py|test_channel_norm.py|test_ops.py")
( timeout 400 $T tests/test_norms.py -k "not cpu" > $R/tests-norms.log 2>&1; echo "norms rc=$? $(( $(date +%s) - s )) s" ) &
( timeout 400 $T tests/test_channel_norm.py tests/test_ops.py -k "not cpu" > $R/tests-channel-ops.log 2>&1; echo "channel-ops rc=$? $(( $(date +%s) - s )) s" ) &
( timeout 400 $T $OTHERS -k "not cpu" > $R/tests-others.log 2>&1; echo "others rc=$? $(( $(date +%s) - s )) s"
  ) &
wait
for f in $R/tests-*.log; do echo "$f: $(tail -1 $f)"; grep -E "^FAILED|^ERROR" $f | head -5; done
echo "[$(( $(date +%s) - s )) s] done"

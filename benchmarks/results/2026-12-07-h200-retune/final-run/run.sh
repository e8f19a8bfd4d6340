#!/usr/bin/env bash
# The last tuner run of the H200 tuning (tiled backward lines), then the sweep with eager,
# torch.compile and Liger-Kernel; the logs tarred into $OUT.
PG=layernorm,rmsnorm,swish_layernorm,add_layernorm,add_rmsnorm
LL=4096,8192,16384,32768,65536,131072,262144
RESULT=$OUT; export OUT=/tmp/tune2; rm -rf $OUT; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
( while sleep 20; do tar czf $RESULT/h200.tgz -C $OUT . 2>/dev/null; done ) &
SWEEP_ARGS="--no-compile --no-liger --row-lengths 256,1024,2048,4096,8192,16384,65536,262144" \
REQUIRE_GPU=H200 LIMIT=${LIMIT:-580} FINISH=${FINISH:-60} BASELINES=${BASELINES:-330} \
bash scripts/gpu_tune.sh \
  "--tables tiled --kernels backward --ops $PG --row-lengths $LL --rounds 3"
rc=$?
kill %1; tar czf $RESULT/h200.tgz -C $OUT .
exit $rc

#!/usr/bin/env bash
# Build avo_ops in place, run the tests and the quick benchmark, in one call on the GPU
# machine (H200, 16 cores, torch preinstalled as python3, no network).
#
#   scripts/gpu_check.sh                      # every test, then the quick benchmark
#   scripts/gpu_check.sh tests/test_norms.py  # only these test files (pytest arguments)
#
# With a GPU the whole suite takes about 11 minutes; to stay within a shorter time limit
# per command, run it as two commands on the same machine (the second build only checks
# that nothing changed), e.g.
#   BENCH_ARGS=none scripts/gpu_check.sh tests/test_norms.py tests/test_ops.py \
#       tests/test_patch.py tests/test_python_calls.py tests/test_tuning.py     # ~8 min
#   scripts/gpu_check.sh tests/test_benchmarks.py tests/test_channel_norm.py \
#       tests/test_cpu_copies.py tests/test_cpu_math.py tests/test_docs.py \
#       tests/test_func_transforms.py tests/test_generator.py \
#       tests/test_generator_reductions.py tests/test_language_features.py \
#       tests/test_nn.py                                                       # ~4 min
# The tests that need the GPU, whose CPU variants CI runs, fit in one command: with -k
# "not cpu" (the test_cpu_* files and every test whose id names the CPU left out) the files
# above but test_language_features.py and the two test_generator files took 230 s on an
# H100 (2026-12-06, 4165 passed); those three took 25 s on a CPU alone:
#   BENCH_ARGS=none scripts/gpu_check.sh tests -k "not cpu"
#
# Full logs and the benchmark reports go to "$OUT" when it is set, otherwise to a new
# temporary directory. A summary (test result line, benchmark table) is printed last.
# Exit status: non-zero when the build, the tests or the benchmark failed.
# Environment: BENCH_ARGS (default --quick) are the benchmark's arguments; "none" skips it.

set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
LOGS="${OUT:-$(mktemp -d -t avo_gpu_check.XXXXXX)}"
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1

SCRIPT_START=$SECONDS
STEP_START=$SECONDS
build_rc=-1 tests_rc=-1 bench_rc=-1

banner() {
    STEP_START=$SECONDS
    printf '\n==================== %s ====================\n' "$*"
}

took() {
    printf -- '---- %s: %ss\n' "$1" "$((SECONDS - STEP_START))"
}

test_line() {
    grep -E '[0-9]+ (passed|failed|error)|no tests ran' "$LOGS/tests.log" 2>/dev/null | tail -n 1
}

summary() {
    banner "summary (logs in $LOGS, total $((SECONDS - SCRIPT_START))s)"
    echo "build: $([ "$build_rc" -eq 0 ] && echo ok || echo "FAILED (rc=$build_rc)")"
    if [ "$tests_rc" -ge 0 ]; then
        echo "tests: rc=$tests_rc  $(test_line)"
    fi
    if [ "$bench_rc" -ge 0 ]; then
        echo "bench: rc=$bench_rc"
        cat "$LOGS/bench_summary.txt" 2>/dev/null
    fi
}

# (a) machine ----------------------------------------------------------------------
banner "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem \
    --format=csv 2>&1 || echo "nvidia-smi failed"
python3 - <<'EOF' 2>&1
import sys, torch
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, "
      f"CUDA {torch.version.cuda}, cuda available: {torch.cuda.is_available()}")
EOF
command -v nvcc >/dev/null && nvcc --version | tail -n 1
took machine

# (b) build --------------------------------------------------------------------------
banner "build (pip install -e .)"
MAX_JOBS=16 TORCH_CUDA_ARCH_LIST="9.0" \
    python3 -m pip install --no-build-isolation --no-deps -e . 2>&1 \
    | tee "$LOGS/build.log" | tail -n 30
build_rc=${PIPESTATUS[0]}
took build
if [ "$build_rc" -ne 0 ]; then
    echo "!!!! BUILD FAILED (rc=$build_rc); full log: $LOGS/build.log"
    summary
    exit 1
fi

# (c) tests --------------------------------------------------------------------------
banner "tests (pytest -q ${*:-tests})"
# --durations: the slowest tests' times on the GPU go into tests.log, to keep a quick subset
# of the GPU tests honest about what it leaves out.
python3 -m pytest -q --durations=300 "${@:-tests}" 2>&1 | tee "$LOGS/tests.log" | tail -n 40
tests_rc=${PIPESTATUS[0]}
took tests
[ "$tests_rc" -ne 0 ] && echo "!!!! TESTS FAILED (rc=$tests_rc); full log: $LOGS/tests.log"

# (d) benchmark ----------------------------------------------------------------------
if [ "${BENCH_ARGS-}" = "none" ]; then
    summary
    exit $(( tests_rc != 0 ))
fi
banner "benchmark (${BENCH_ARGS---quick})"
# stdout (the summary table) to a file, stderr (progress) on screen and into the log.
# BENCH_ARGS replaces --quick, e.g. BENCH_ARGS="--quick --no-compile" to stay inside a short
# time limit, or BENCH_ARGS="" for the full sweep.
python3 benchmarks/bench_ops.py ${BENCH_ARGS---quick} --json "$LOGS/bench.json" --markdown "$LOGS/bench.md" \
    2>&1 >"$LOGS/bench_summary.txt" | tee "$LOGS/bench.log"
bench_rc=${PIPESTATUS[0]}
took benchmark
[ "$bench_rc" -ne 0 ] && echo "!!!! BENCHMARK FAILED (rc=$bench_rc); full log: $LOGS/bench.log"

# (e) summary ------------------------------------------------------------------------
summary
exit $(( tests_rc != 0 || bench_rc != 0 ))

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
# PARALLEL_TESTS=1 runs the suite as three pytest runs at once on the one GPU
# (tests/test_norms.py; test_channel_norm.py and test_ops.py; every other file), the
# arguments (pytest options, not files) given to each: with -k "not cpu" they took 264 s
# instead of 399 one after another (H100, 2026-12-07, 6063 passed;
# benchmarks/results/2026-12-07-h100-cuda-tests/):
#   PARALLEL_TESTS=1 BENCH_ARGS=none scripts/gpu_check.sh -k "not cpu"
#
# Full logs and the benchmark reports go to "$OUT" when it is set, otherwise to a new
# temporary directory. A summary (test result line, benchmark table) is printed last.
# Exit status: non-zero when the build, the tests or the benchmark failed.
# Environment: BENCH_ARGS (default --quick) are the benchmark's arguments; "none" skips it.
# PARALLEL_TESTS=1: the three test runs at once, above (logs tests_<group>.log and tests.log).

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
    grep -E '[0-9]+ (passed|failed|errors?|deselected)|no tests ran' "$1" 2>/dev/null | tail -n 1
}

# The three groups of PARALLEL_TESTS, by file: test_norms.py holds most of the GPU tests.
test_groups() {
    local others
    others=$(ls tests/test_*.py | grep -v -e /test_norms.py -e /test_channel_norm.py -e /test_ops.py | tr '\n' ' ')
    printf '%s\n' "norms tests/test_norms.py" "channel_ops tests/test_channel_norm.py tests/test_ops.py" "others $others"
}

summary() {
    banner "summary (logs in $LOGS, total $((SECONDS - SCRIPT_START))s)"
    echo "build: $([ "$build_rc" -eq 0 ] && echo ok || echo "FAILED (rc=$build_rc)")"
    if [ "$tests_rc" -ge 0 ]; then
        if [ "${PARALLEL_TESTS:-0}" = 1 ]; then
            echo "tests: rc=$tests_rc"
            while read -r group _; do echo "  $group: $(test_line "$LOGS/tests_$group.log")"; done < <(test_groups)
        else
            echo "tests: rc=$tests_rc  $(test_line "$LOGS/tests.log")"
        fi
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
# --durations: the slowest tests' times on the GPU go into tests.log, to keep a quick subset
# of the GPU tests honest about what it leaves out.
if [ "${PARALLEL_TESTS:-0}" = 1 ]; then
    banner "tests (three pytest runs at once, options: ${*:-none})"
    for arg in "$@"; do
        if [[ "$arg" == tests || "$arg" == tests/* || "$arg" == *.py* ]]; then
            echo "!!!! PARALLEL_TESTS=1 takes pytest options, not files ('$arg'): the groups are fixed"
            summary
            exit 2
        fi
    done
    pids=()
    while read -r group files; do
        # shellcheck disable=SC2086  # the group's files, one word each
        python3 -m pytest -q --durations=300 $files "$@" >"$LOGS/tests_$group.log" 2>&1 &
        pids+=($!)
    done < <(test_groups)
    tests_rc=0
    for pid in "${pids[@]}"; do
        wait "$pid"
        rc=$?
        [ $rc -eq 0 ] || [ $rc -eq 5 ] || tests_rc=1  # 5: the options deselected a whole group
    done
    cat "$LOGS"/tests_*.log >"$LOGS/tests.log"
    grep -hE '^(FAILED|ERROR)' "$LOGS"/tests_*.log | head -n 40  # each group's result line: the summary
else
    banner "tests (pytest -q ${*:-tests})"
    python3 -m pytest -q --durations=300 "${@:-tests}" 2>&1 | tee "$LOGS/tests.log" | tail -n 40
    tests_rc=${PIPESTATUS[0]}
fi
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

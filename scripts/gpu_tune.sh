#!/usr/bin/env bash
# Tune this GPU's dispatch table and measure what it changed, in one run on a GPU machine:
# build, sweep (before), run the tuner once per argument, regenerate and build, sweep
# (after), compare the two sweeps, and run the dispatch-line tests on the new build.
#
#   scripts/gpu_tune.sh TUNER_ARGS [TUNER_ARGS | rebuild ...]
#
# Each TUNER_ARGS is one benchmarks/tune_rows.py command's arguments, as one word; the word
# "rebuild" regenerates the sources and builds between two of them (a tuner run that
# should time what an earlier one changed, such as --tables tiled after --tables
# one_kernel). For example, the narrow line of every forward:
#   scripts/gpu_tune.sh "--tables narrow --kernels forward --row-lengths 256,512,1024,2048,4096,8192"
# The tuner writes this GPU's file in tuning/ (its docstring says which); the script does
# not commit it: the copy of tuning/ and its diff come back with the logs.
#
# Environment:
#   REQUIRE_GPU  a part of the GPU's name (e.g. H200): on any other GPU the script stops at
#                once with exit status 3, before building
#   LIMIT        seconds the whole run may take (default 590). A tuner run is cut off (and
#                writes nothing) where it would leave less than FINISH seconds; later ones
#                are skipped
#   FINISH       seconds kept for the regenerate, build, sweep and tests at the end
#                (default 240; on an H100 the build took about 50 s, the sweep 30 s and
#                the tests 20 s)
#   SWEEP_ARGS   benchmarks/bench_ops.py arguments of both sweeps (default: --no-compile
#                --no-liger, avo and eager over the whole sweep)
#   TESTS        pytest -k expression of the line tests (default below); "none" skips them
#   BASELINES    seconds for a last sweep of the other implementations alone (bench_ops.py
#                --no-avo: eager, torch.compile and, where it is installed, Liger-Kernel,
#                over the cases SWEEP_ARGS chooses), so that the report sets the new table
#                against baselines of the same GPU and run (default 0: none). The time is
#                kept from the tuner runs as FINISH is; the sweep runs after the tests, is
#                stopped at LIMIT and keeps what it measured (on an H200, avo, eager and
#                torch.compile over the whole sweep took 186 s)
# Logs, gpu.txt (GPU, driver, versions), before.json and results.json (the sweeps),
# compare.md, the tuning files and tuning.diff go to "$OUT" when it is set, otherwise to a
# new temporary directory; with BASELINES, also baselines.json and report/results.md
# (bench_report.py on results.json with those baselines; plots: run it again where
# matplotlib is). Files are written as each step ends, so a run that is stopped keeps
# what it had done. PYTHONPATH is kept, after this checkout, so that packages installed
# into a directory of their own are found. Exit status: non-zero when a build, a tuner
# run, a sweep or the tests failed.
set -uo pipefail

[ $# -ge 1 ] || { sed -n '2,12p' "$0"; exit 2; }
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
LOGS="${OUT:-$(mktemp -d -t avo_gpu_tune.XXXXXX)}"
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST="9.0" PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
LIMIT=${LIMIT:-590} BASELINES=${BASELINES:-0} FINISH=$(( ${FINISH:-240} + ${BASELINES:-0} ))
SWEEP_ARGS=${SWEEP_ARGS:---no-compile --no-liger}
TESTS=${TESTS:-not cpu and (narrow or table or tuning or one_kernel)}
failed=0 builds=0

say() { echo "[$SECONDS s] $*"; }
left() { echo $((LIMIT - SECONDS)); }

build() {
    builds=$((builds + 1))
    MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace >"$LOGS/build_$builds.log" 2>&1 \
        || { say "build $builds FAILED"; tail -n 30 "$LOGS/build_$builds.log"; exit 1; }
    say "build $builds done"
}

case_args() {  # the options of SWEEP_ARGS that choose the cases, not the implementations
    local -a words=($SWEEP_ARGS)
    local i
    for ((i = 0; i < ${#words[@]}; i++)); do
        case ${words[i]} in
            --ops | --dirs | --dtypes | --row-lengths | --elements | --rows | --shapes)
                echo "${words[i]} ${words[i + 1]:-}"; i=$((i + 1)) ;;
            --ops=* | --dirs=* | --dtypes=* | --row-lengths=* | --elements=* | --rows=* | --shapes=* | --quick)
                echo "${words[i]}" ;;
        esac
    done
}

sweep() {  # sweep NAME SECONDS BENCH_OPS_ARGS...: stopped after SECONDS (0: never), keeping what it measured
    local name=$1 seconds=$2
    shift 2
    timeout "$seconds" python3 benchmarks/bench_ops.py "$@" --no-progress --json "$LOGS/$name.json" \
        >"$LOGS/$name.md" 2>"$LOGS/$name.log"
    case $? in
        0) say "sweep $name done" ;;
        124) say "sweep $name stopped at the limit (what it measured is kept)" ;;
        *) say "sweep $name FAILED"; tail -n 20 "$LOGS/$name.log"; failed=1 ;;
    esac
}

{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "CUDA", torch.version.cuda)'
    nvcc --version | tail -n 1
} >"$LOGS/gpu.txt" 2>&1
cat "$LOGS/gpu.txt"
if [ -n "${REQUIRE_GPU:-}" ] && ! head -n 1 "$LOGS/gpu.txt" | grep -q -- "$REQUIRE_GPU"; then
    say "the GPU's name does not contain $REQUIRE_GPU: stopping"
    exit 3
fi

build
# shellcheck disable=SC2086  # SWEEP_ARGS: several arguments
sweep before 0 $SWEEP_ARGS --commit before
step=0
for arg in "$@"; do
    if [ "$arg" = rebuild ]; then
        [ "$(left)" -gt $((FINISH + 100)) ] || { say "no time to rebuild: the tuning stops here"; break; }
        build
        continue
    fi
    step=$((step + 1))
    budget=$(( $(left) - FINISH ))
    [ "$budget" -gt 30 ] || { say "no time for tuner run $step and the rest: skipped"; break; }
    say "tuner run $step ($budget s at most): $arg"
    # shellcheck disable=SC2086  # one argument holds one tuner command's arguments
    timeout "$budget" python3 benchmarks/tune_rows.py $arg >"$LOGS/tune_$step.log" 2>&1
    rc=$?
    [ $rc -eq 0 ] || { say "tuner run $step rc=$rc (124: cut off, nothing written)"; failed=1; }
    sed -n '/^lines changed: /,$p' "$LOGS/tune_$step.log"
    cp tuning/*.json "$LOGS/"
    git diff tuning/ >"$LOGS/tuning.diff"
done
git diff --stat tuning/

build
# shellcheck disable=SC2086
sweep results 0 $SWEEP_ARGS --commit after
[ -s "$LOGS/before.json" ] && [ -s "$LOGS/results.json" ] \
    && python3 benchmarks/compare_runs.py "$LOGS/before.json" "$LOGS/results.json" --markdown "$LOGS/compare.md" \
        | sed -n '/^| op | dir | cases/,$p'

if [ "$TESTS" != none ]; then
    # The tests come first: what the baselines sweep does not reach, it leaves out.
    timeout $(( $(left) > 20 ? $(left) - 10 : 10 )) python3 -m pytest -q -p no:cacheprovider \
        tests/test_norms.py tests/test_tuning.py -k "$TESTS" >"$LOGS/tests-line.log" 2>&1
    rc=$?
    say "line tests rc=$rc: $(tail -n 1 "$LOGS/tests-line.log")"
    grep -E '^(FAILED|ERROR)' "$LOGS/tests-line.log" | head -n 20
    [ $rc -eq 0 ] || failed=1
fi
if [ "$BASELINES" -gt 0 ]; then
    budget=$(( $(left) > 10 ? $(left) - 5 : 5 ))
    say "baselines ($budget s at most)"
    sweep baselines "$budget" --no-avo $(case_args)
    [ -s "$LOGS/results.json" ] && [ -s "$LOGS/baselines.json" ] \
        && python3 benchmarks/bench_report.py "$LOGS/results.json" --baselines "$LOGS/baselines.json" \
            --out "$LOGS/report" --no-plots >"$LOGS/report.log" 2>&1 \
        && sed -n '/^## Against the performance targets/,/^## Rows that miss/p' "$LOGS/report/results.md"
fi
say "done; logs in $LOGS"
exit $failed

#!/usr/bin/env bash
# Measure a kernel change against the trees before it, in one run on a GPU machine: build
# this tree and each BASE_DIR (in place, all at the same time, the cores shared), run the
# CUDA tests on this tree, run the same benchmark on every build, and print avo's
# fraction of the copy bandwidth of each base run against this one
# (benchmarks/compare_runs.py).
#
#   scripts/gpu_compare.sh BASE_DIR [BASE_DIR ...]     # from the repository root
#
# A BASE_DIR is another checkout of the project, for example
#   git worktree add ../base HEAD   or   mkdir base && git archive HEAD | tar -x -C base
# Environment:
#   BENCH_ARGS  benchmark arguments for every run (default: --no-compile --no-liger, the
#               whole avo and eager sweep, about 30 s a run on an H200)
#   TESTS       pytest -k expression for this tree's tests (default: "cuda or
#               kernel_version"); TESTS=none skips them
#   ROUNDS      how many times to run the benchmark on every build, the builds in turn
#               within a round (default 1); a change smaller than the spread between
#               rounds is noise
# The test log, the benchmark JSON of every run (bench_this.json, bench_<base>.json; with
# ROUNDS > 1 bench_this_r<k>.json, ...) and the comparisons (compare_<base>.md, or
# compare_<base>_r<k>.md) go to "$OUT" when it is set; build and benchmark logs to a
# temporary directory (their tails are printed on failure).
set -uo pipefail

[ $# -ge 1 ] || { echo "usage: scripts/gpu_compare.sh BASE_DIR [BASE_DIR ...]"; exit 2; }
BASES=()
for base in "$@"; do BASES+=("$(cd "$base" && pwd)") || exit 2; done
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
HERE=$(pwd)
LOGS="${OUT:-$(mktemp -d -t avo_gpu_compare.XXXXXX)}"
mkdir -p "$LOGS"
SCRATCH=$(mktemp -d -t avo_gpu_compare_logs.XXXXXX)
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST="9.0"
TREES=("$HERE" "${BASES[@]}")
JOBS=$(( $(nproc) / ${#TREES[@]} > 0 ? $(nproc) / ${#TREES[@]} : 1 ))
START=$SECONDS
name_of() { [ "$1" = "$HERE" ] && echo this || basename "$1"; }

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1
python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)'

echo "== building ${#TREES[@]} trees ($JOBS jobs each)"
pids=()
for tree in "${TREES[@]}"; do
    (cd "$tree" && MAX_JOBS=$JOBS python3 setup.py build_ext --inplace >"$SCRATCH/build_$(name_of "$tree").log" 2>&1) &
    pids+=($!)
done
failed=0
for i in "${!pids[@]}"; do
    if ! wait "${pids[$i]}"; then
        failed=1
        echo "build of ${TREES[$i]} FAILED"
        tail -n 30 "$SCRATCH/build_$(name_of "${TREES[$i]}").log"
    fi
done
echo "builds done ($((SECONDS - START)) s)"
[ $failed -eq 0 ] || exit 1

tests_rc=0
if [ "${TESTS:-}" != "none" ]; then
    echo "== tests of this tree: -k \"${TESTS:-cuda or kernel_version}\""
    PYTHONPATH="$HERE" python3 -m pytest -q -x tests -k "${TESTS:-cuda or kernel_version}" \
        >"$LOGS/tests.log" 2>&1
    tests_rc=$?
    tail -n 3 "$LOGS/tests.log"
    echo "tests: rc=$tests_rc ($((SECONDS - START)) s)"
fi

ROUNDS=${ROUNDS:-1}
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || { echo "ROUNDS must be a positive integer, not '$ROUNDS'"; exit 2; }
# One round's file suffix: none for a single round, so that the names stay as before.
suffix_of() { [ "$ROUNDS" -eq 1 ] && echo "" || echo "_r$1"; }

echo "== benchmark: ${BENCH_ARGS:---no-compile --no-liger}, $ROUNDS round(s)"
for round in $(seq 1 "$ROUNDS"); do
    sfx=$(suffix_of "$round")
    for tree in "${BASES[@]}" "$HERE"; do
        name=$(name_of "$tree")$sfx
        PYTHONPATH="$tree" python3 "$tree/benchmarks/bench_ops.py" ${BENCH_ARGS:---no-compile --no-liger} --no-progress \
            --json "$LOGS/bench_$name.json" >"$SCRATCH/bench_$name.txt" 2>"$SCRATCH/bench_$name.log" \
            || { tail -n 20 "$SCRATCH/bench_$name.log"; exit 1; }
    done
    for tree in "${BASES[@]}"; do
        name=$(name_of "$tree")
        echo "-- $name -> this tree${sfx:+ (round $round)}"
        python3 benchmarks/compare_runs.py "$LOGS/bench_$name$sfx.json" "$LOGS/bench_this$sfx.json" \
            --markdown "$LOGS/compare_$name$sfx.md" | sed -n '/^| op | dir | cases/,$p'
    done
done
echo "total $((SECONDS - START)) s"
exit $tests_rc

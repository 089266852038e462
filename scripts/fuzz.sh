#!/usr/bin/env bash
# Run every fuzz harness of tests/fuzz for a bounded time (make fuzz).
#
#   FUZZ_SECONDS=180 bash scripts/fuzz.sh [harness ...]
#
# FUZZ_SECONDS (default 180) is the total budget, split evenly across the harnesses run
# (at least 5 s each), which run FUZZ_JOBS at a time (default: one per core).
# ICECRYPT_FUZZ_TIMEOUT (default 10) is the per-input time bound the oracle checks;
# libFuzzer's -timeout (twice that) backs it up for a hang in native code.  FUZZ_SEED
# (default: none, libFuzzer picks one per run) fixes the mutation sequence: CI sets it so
# that a run's outcome can be reproduced; leave it unset to explore.  atheris is
# installed into the project venv (.venv) if missing.
#
# Coverage: icecrypt's Python code is instrumented by atheris (instrument_imports).  The
# native module is not: that needs clang's -fsanitize=fuzzer-no-link in a separate build,
# which this script does not do (clang is not installed here); it never rebuilds or
# replaces the venv's in-place extension.  The native core still runs on every input
# (every decrypt goes through it), so its crashes and the oracle's checks of its output
# count; it just gives the fuzzer no coverage feedback.
#
# Per harness it prints the executions and the outcome; any finding (an oracle failure,
# an undocumented exception, a hang, a crash) makes it exit non-zero after all harnesses
# ran, with the crashing input saved under a temporary directory whose path it prints.
# Replay a saved input with the normal suite: copy it to
# tests/fuzz/regressions/<harness>/ (test_regressions.py replays every file there).
set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
TOTAL="${FUZZ_SECONDS:-180}"
TIMEOUT="${ICECRYPT_FUZZ_TIMEOUT:-10}"
SEED_ARGS=()
[ -n "${FUZZ_SEED:-}" ] && SEED_ARGS=("-seed=$FUZZ_SEED")
export ICECRYPT_FUZZ_TIMEOUT="$TIMEOUT"

if [ ! -x "$PY" ]; then
    echo "fuzz.sh: no virtual environment at $VENV (run make build first)" >&2
    exit 2
fi
if ! "$PY" -c "import atheris" 2>/dev/null; then
    echo "fuzz.sh: installing atheris into $VENV"
    "$PY" -m pip install --disable-pip-version-check -q atheris || { echo "fuzz.sh: cannot install atheris" >&2; exit 2; }
fi

if [ "$#" -gt 0 ]; then
    HARNESSES=("$@")
else
    mapfile -t HARNESSES < <(cd "$ROOT/tests/fuzz" && "$PY" -c "import fuzzlib; print('\n'.join(fuzzlib.HARNESSES))")
fi
N=${#HARNESSES[@]}
EACH=$(( TOTAL / N ))
[ "$EACH" -lt 5 ] && EACH=5

OUT="$(mktemp -d "${TMPDIR:-/tmp}/icecrypt-fuzz.XXXXXX")"
# the harnesses' scratch files (libFuzzer exits without running Python's finalizers)
SCRATCH_BASE=/dev/shm
[ -d "$SCRATCH_BASE" ] && [ -w "$SCRATCH_BASE" ] || SCRATCH_BASE="${TMPDIR:-/tmp}"
ICECRYPT_FUZZ_WORKDIR="$(mktemp -d "$SCRATCH_BASE/icecrypt-fuzz-scratch.XXXXXX")"
export ICECRYPT_FUZZ_WORKDIR
trap 'rm -rf "$ICECRYPT_FUZZ_WORKDIR"' EXIT

if command -v clang >/dev/null 2>&1; then
    echo "fuzz.sh: clang is installed, but an instrumented native build is not wired in yet: Python coverage only"
else
    echo "fuzz.sh: no clang: the native module runs uninstrumented (Python coverage only)"
fi

echo "fuzz.sh: ${N} harnesses, ${EACH} s each (FUZZ_SECONDS=${TOTAL}, FUZZ_SEED=${FUZZ_SEED:-random}), per-input bound ${TIMEOUT} s, artifacts in $OUT"
# One libFuzzer process per harness, JOBS at a time (default: one per core).  Each process is
# single-threaded and its budget is wall time, so two side by side on two cores each get
# what one alone gets; the table prints in harness order once all ended.
run_one() {
    local name=$1 dir="$OUT/$1" t0 rc
    mkdir -p "$dir/corpus" "$dir/crashes"
    t0=$(date +%s)
    (cd "$ROOT" && "$PY" tests/fuzz/run.py "$name" "$dir/corpus" \
        -max_total_time="$EACH" -timeout=$(( ${TIMEOUT%.*} * 2 + 5 )) -rss_limit_mb=3072 \
        -max_len=2200000 -print_final_stats=1 -artifact_prefix="$dir/crashes/" "${SEED_ARGS[@]}" \
        >"$dir/log" 2>&1)
    rc=$?
    echo "$rc $(( $(date +%s) - t0 ))" >"$dir/status"
}
JOBS=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 1)}
echo "fuzz.sh: ${JOBS} harness(es) at a time"
FAILED=0
START=$(date +%s)
running=0
for name in "${HARNESSES[@]}"; do
    if [ "$running" -ge "$JOBS" ]; then
        wait -n
        running=$(( running - 1 ))
    fi
    run_one "$name" &
    running=$(( running + 1 ))
done
wait
printf '%-16s %12s %8s  %s\n' harness executions seconds outcome
for name in "${HARNESSES[@]}"; do
    dir="$OUT/$name"
    read -r rc took <"$dir/status" || { rc=99; took="?"; }
    execs=$(grep -a 'stat::number_of_executed_units' "$dir/log" | tail -1 | awk '{print $2}')
    crashes=$(find "$dir/crashes" -type f | sort)
    if [ "$rc" -eq 0 ] && [ -z "$crashes" ]; then
        outcome="ok"
    else
        FAILED=1
        if [ -n "$crashes" ]; then
            outcome="FINDING: $(echo "$crashes" | tr '\n' ' ')"
        else
            outcome="FAILED (exit $rc, no input saved): see $dir/log"
        fi
    fi
    printf '%-16s %12s %8s  %s\n' "$name" "${execs:-?}" "$took" "$outcome"
    if [ "$outcome" != "ok" ]; then
        grep -a -m1 -A3 -E 'Finding|Hang|Uncaught Python exception|ERROR: libFuzzer' "$dir/log" | sed 's/^/    /' | cut -c1-300
    fi
done
echo "fuzz.sh: total $(( $(date +%s) - START )) s; logs in $OUT"
if [ "$FAILED" -ne 0 ]; then
    echo "fuzz.sh: FINDINGS (crashing inputs saved above; replay: tests/fuzz/regressions/<harness>/)" >&2
    exit 1
fi
echo "fuzz.sh: no findings"

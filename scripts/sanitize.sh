#!/usr/bin/env bash
# Sanitizers over the native core (issue 11, section 2); `make sanitize` runs this.
#
#   asan   the extension built with AddressSanitizer + UndefinedBehaviorSanitizer; the whole
#          AGS1 suite runs against it (tests/ags1: codec, streams, tamper matrix, Java vectors,
#          CLI, and the C/Cython boundary tests of test_boundary.py).
#   tsan   the extension built with ThreadSanitizer; the same suite with 4 threads per call
#          (ICECRYPT_THREADS=4, so the pool has 3 helpers even on 2 cores): the worker pool,
#          nonce batches, fork handlers, concurrent read_at, buffers resized under a call.
#   leak   LeakSanitizer (with ASan + UBSan) over the native core alone, without Python:
#          scripts/sanitizers/leak_check.c drives every allocating path of gcm.c (context
#          pools overflowing, the worker pool, failures, a forked child); suppressions in
#          scripts/sanitizers/lsan.supp name OpenSSL internals only, each justified.
#
# Each build goes into its own copy of the package under a temporary directory (never over
# src/icecrypt/_gcm*.so, which the venv imports), first on PYTHONPATH; the script prints the
# module each run imports and refuses to go on if it is not the sanitized one (and
# test_boundary.py checks it again inside pytest).  The sanitizer runtime is preloaded into
# the uninstrumented interpreter, and inherited by the CLI subprocesses and forked children
# the tests start.  Every report goes to a log file, so reports from children count too.
#
# Before the tests, a canary (a deliberate heap overflow, signed overflow, data race in a
# scrap library built with the same flags) must produce a report under the same settings:
# a run with no reports means the sanitizer was live and found nothing.
#
# Exit status: non-zero on any sanitizer report, any test failure, a canary that was not
# caught, or a run past its time limit (SANITIZE_TIMEOUT seconds per run, default 240).
# One SUMMARY line per build.  Takes about 2 minutes on 2 cores, plus 5-6 minutes the first
# time, to build the instrumented OpenSSL (below).
#
# OpenSSL.  The ASan build links the pinned static libcrypto as it ships: ASan does not see
# accesses made inside it (its AES-GCM is assembly anyway), only icecrypt's own.  The TSan
# build links the same OpenSSL source built with -fsanitize=thread (its AES/GHASH assembly
# stays, uninstrumented): an uninstrumented libcrypto would hide a race between two threads
# on one EVP_CIPHER_CTX, exactly what a context pool bug would produce.  It is built once
# from the tarball build-openssl.sh verified, into the cache next to the pinned build
# (about 6 minutes on 2 busy cores; later runs reuse it).  With it there are no reports from
# libcrypto, so scripts/sanitizers/tsan.supp has no entries.  SANITIZE_TSAN_OPENSSL=pinned
# links the uninstrumented one instead (faster on a cold cache, and still report-free).
#
# `sanitize.sh --prepare` only builds: that instrumented OpenSSL, and the ASan and TSan
# builds of the extension, into the cache, and exits (.ci/run starts it at nice 19 beside the
# test suite, so that it takes only the CPU the suite leaves).  A prepared build is kept under
# a key of everything it is made of (the package's sources, the flags, the OpenSSL); a run
# whose sources differ builds afresh, so a prepared build never stands in for other code.
#
# Environment: SANITIZE_BUILDS="asan tsan leak", SANITIZE_KEEP=1 (keep the work directory),
# SANITIZE_TIMEOUT, SANITIZE_WORKERS, SANITIZE_TSAN_OPENSSL=instrumented|pinned,
# SANITIZE_CACHE (where the instrumented OpenSSL is kept; default: the pinned build's cache),
# PYTEST_ARGS.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
BUILDS=${SANITIZE_BUILDS:-asan tsan leak}
TIMEOUT=${SANITIZE_TIMEOUT:-240}
SUPP=$ROOT/scripts/sanitizers
WORK=$(mktemp -d -t icecrypt-sanitize.XXXXXX)
if [[ -z ${SANITIZE_KEEP:-} ]]; then trap 'rm -rf "$WORK"' EXIT; else echo "sanitize: work directory $WORK"; fi
log() { echo "sanitize: $*" >&2; }

# The pinned static OpenSSL (build-openssl.sh builds it once into the cache, else is a no-op).
OPENSSL_PREFIX=$(bash "$ROOT/scripts/build-openssl.sh" | tail -n1)
export ICECRYPT_OPENSSL=static

# tsan_openssl: the prefix of libcrypto built with -fsanitize=thread from the same verified
# source (built and cached on first use).
tsan_openssl() {
    local cache=${SANITIZE_CACHE:-$(dirname "$OPENSSL_PREFIX")} name version tarball prefix src
    name=$(basename "$OPENSSL_PREFIX")          # openssl-3.5.7
    version=${name#openssl-}
    prefix=$cache/tsan-$name   # not openssl-*: build-openssl.sh takes those for pinned builds
    if [[ -f $prefix/lib/libcrypto.a ]]; then echo "$prefix"; return; fi
    tarball=$(dirname "$OPENSSL_PREFIX")/openssl_$version.orig.tar.gz
    [[ -f $tarball ]] || { log "no $tarball (kept by build-openssl.sh) to build an instrumented OpenSSL from; SANITIZE_TSAN_OPENSSL=pinned skips it"; return 1; }
    log "building OpenSSL $version with -fsanitize=thread into $prefix (once)"
    src=$WORK/openssl-tsan
    mkdir -p "$src" "$cache"
    tar xzf "$tarball" -C "$src" --strip-components=1
    (
        cd "$src"
        # the pinned build's options (libcrypto alone, only what icecrypt calls), instrumented
        # shellcheck disable=SC2046
        ./Configure $(bash "$ROOT/scripts/build-openssl.sh" --print-options) -g -O1 \
            -fsanitize=thread >configure.log 2>&1 &&
            make -j2 build_generated >make.log 2>&1 &&
            make -j2 libcrypto.a >>make.log 2>&1
    ) || { tail -n 30 "$src"/configure.log "$src"/make.log >&2; log "instrumented OpenSSL build failed"; return 1; }
    local stage
    stage=$(mktemp -d "$cache/.tsan-$name.XXXXXX")
    mkdir -p "$stage/lib" "$stage/include" &&
        cp "$src/libcrypto.a" "$stage/lib/" &&
        cp -r "$src/include/openssl" "$stage/include/" || { rm -rf "$stage"; return 1; }
    mv -T "$stage" "$prefix" 2>/dev/null || rm -rf "$stage"   # a concurrent run got there first
    echo "$prefix"
}

# prepare <name> <flags> <OpenSSL prefix>: build it and keep it in the cache (the older
# prepared builds of that name are removed).
prepare() {
    local ready stage
    ready=$(prepared_dir "$@")
    [[ -f $ready/.done ]] && return 0
    build "$@" || return 1
    rm -rf "$(dirname "$ready")/sanitize-$1-"*
    stage=$(mktemp -d "$ready.XXXXXX")
    cp -a "$WORK/$1/." "$stage/" && touch "$stage/.done" || { rm -rf "$stage"; return 1; }
    mv -T "$stage" "$ready" 2>/dev/null || rm -rf "$stage"
}

UBSAN_EXIT=99

# Lines a runtime writes to its log that are not reports.
# (LeakSanitizer in a forked child lists the parent's threads, which do not exist there.)
BENIGN='starting new threads after multi-threaded fork is not supported|Continuing because of die_after_fork=0'
BENIGN+='|^==[0-9]+==Running thread [0-9]+ was not suspended. False leaks are possible.$'
BENIGN+='|^-+$|^Suppressions used:|^ +count +bytes +template|^ +[0-9]+ +[0-9]+ +[a-z_]+$|^$'

ASAN_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
TSAN_FLAGS="-fsanitize=thread"

# prepared_dir <name> <flags> <OpenSSL prefix>: where --prepare keeps that build in the cache,
# named by a digest of the flags, the OpenSSL and every source file the build copies.
prepared_dir() {
    local key
    key=$( {
        printf '%s\n' "$2" "$3"
        cd "$ROOT" && find setup.py pyproject.toml include src -type f ! -name '*.so' ! -name '_gcm.c' \
            ! -path '*/__pycache__/*' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
    } | sha256sum | cut -c1-16)
    echo "${SANITIZE_CACHE:-$(dirname "$OPENSSL_PREFIX")}/sanitize-$1-$key"
}

# build <name> <flags> <OpenSSL prefix>: the extension, built with <flags>, in
# $WORK/<name>/src (a copy of the package; setup.py's -O3 comes after CFLAGS, so the code
# checked is the optimised code that ships), or the same build --prepare made of the same
# sources.
build() {
    local name=$1 flags=$2 dir=$WORK/$1 ready
    ready=$(prepared_dir "$@")
    if [[ -f $ready/.done ]]; then
        mkdir -p "$dir" && cp -a "$ready/." "$dir/" && rm -f "$dir/.done" &&
            { log "$name: using the build prepared in $ready"; return 0; }
    fi
    mkdir -p "$dir"
    cp -a "$ROOT/setup.py" "$ROOT/pyproject.toml" "$ROOT/include" "$ROOT/src" "$dir/"
    rm -f "$dir"/src/icecrypt/_gcm*.so "$dir"/src/icecrypt/_gcm.c   # Cython regenerates it
    find "$dir/src" -name __pycache__ -prune -exec rm -rf {} +
    (
        cd "$dir"
        export ICECRYPT_OPENSSL_DIR=$3
        CFLAGS="$flags -g -fno-omit-frame-pointer" LDFLAGS="$flags" \
            "$PY" setup.py -q build_ext --inplace --build-temp "$dir/tmp" >"$dir/build.log" 2>&1
    ) || { cat "$dir/build.log" >&2; log "$name: build failed"; return 1; }
    # The canaries: a scrap library with one deliberate bug of each kind the build checks.
    cat >"$dir/canary.c" <<'EOF'
#include <pthread.h>
#include <stdlib.h>
static int counter;
static void *bump(void *arg) { for (int i = 0; i < 100000; i++) counter++; return arg; }
int race(void) { pthread_t t; pthread_create(&t, 0, bump, 0); bump(0); pthread_join(t, 0); return counter; }
int overflow(int i) { char *p = malloc(8); p[i] = 1; int r = p[0]; free(p); return r; }
int signed_overflow(int x) { return x + 0x7fffffff; }
EOF
    gcc -shared -fPIC -g $flags "$dir/canary.c" -o "$dir/canary.so"
}

# sanitizer_env <name> <runtime library> <options variable> <options> <log dir>: the env(1)
# arguments of a sanitized run.
sanitizer_env() {
    local name=$1 lib=$2 var=$3 opts=$4 logs=$5 preload
    preload=$(gcc -print-file-name="$lib")
    [[ -f $preload ]] || { log "$name: $lib not found (gcc -print-file-name)"; return 1; }
    # UBSan (inside the ASan build) writes its reports to stderr whatever log_path says
    # (gcc 12's libubsan next to libasan), so its reports end the process with a status of
    # their own, 99, that no test expects from a child and that this script reports.
    ENV=(env "PYTHONPATH=$WORK/$name/src" "LD_PRELOAD=$preload" "$var=$opts:log_path=$logs/$name"
         "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:exitcode=$UBSAN_EXIT"
         "ICECRYPT_SANITIZED_BUILD=$name")
}

# reports <log dir>: print every report, and the number of report files (benign lines aside).
reports() {
    local n=0 f
    for f in "$1"/*; do
        [[ -e $f ]] || continue
        if grep -vqE "$BENIGN" "$f"; then
            n=$((n + 1))
            { echo "---- $f"; cat "$f"; } >&2
        fi
    done
    echo "$n"
}

# canary <name> <call>...: each call into canary.so must be caught (a report, a failed process).
canary() {
    local name=$1 call logs
    shift
    for call in "$@"; do
        logs=$WORK/$name/canary-${call%%(*}
        mkdir -p "$logs"
        local ENV rc=0
        sanitizer_env "$name" "$LIB" "$VAR" "$OPTS" "$logs"
        "${ENV[@]}" "$PY" -c "import ctypes; ctypes.CDLL('$WORK/$name/canary.so').$call" \
            >"$logs.out" 2>&1 || rc=$?
        if ((rc == 0)) || { ((rc != UBSAN_EXIT)) && ! compgen -G "$logs/*" >/dev/null; }; then
            cat "$logs.out" >&2
            log "$name: the canary $call was not caught (exit $rc): the sanitizer is not active"
            return 1
        fi
    done
}

# The suite on every core (SANITIZE_WORKERS, default one per core; 0: one process): the
# xdist workers are children of the preloaded interpreter and inherit the runtime and its
# options, and their reports go to the same log directory.
XDIST=()
workers=${SANITIZE_WORKERS:-$(nproc 2>/dev/null || echo 1)}
if ((workers > 0)) && "$PY" -c "import xdist" 2>/dev/null; then XDIST=(-n "$workers"); fi

# run <name> <extra env>... -- <pytest args>...
run() {
    local name=$1 dir=$WORK/$1 logs=$WORK/$1/reports rc=0 start n
    shift
    local -a extra=()
    while [[ $1 != -- ]]; do extra+=("$1"); shift; done
    shift
    mkdir -p "$logs"
    local ENV
    sanitizer_env "$name" "$LIB" "$VAR" "$OPTS" "$logs"
    local where
    where=$("${ENV[@]}" "$PY" -c 'import icecrypt._gcm as g; print(g.__file__)')
    echo "sanitize: $name imports $where"
    [[ $where == "$dir/src/"* ]] || { log "$name: imported $where, not the sanitized build"; return 1; }
    start=$(date +%s)
    (cd "$ROOT" && "${ENV[@]}" "${extra[@]}" timeout --signal=INT --kill-after=30 "$TIMEOUT" \
        "$PY" -m pytest -q -p no:cacheprovider -o addopts= --timeout=200 "${XDIST[@]}" "$@" ${PYTEST_ARGS:-}) \
        >"$dir/pytest.log" 2>&1 || rc=$?
    n=$(reports "$logs")
    # UBSan reports on stderr: the ones pytest showed, or the whole run ended by one
    local ub
    ub=$(grep -c 'runtime error:' "$dir/pytest.log" || true)
    ((rc == UBSAN_EXIT && ub == 0)) && ub=1
    n=$((n + ub))
    ((rc == 0)) || tail -n 80 "$dir/pytest.log" >&2
    local summary
    summary=$(grep -E '[0-9]+ (passed|failed|errors?|deselected)|no tests ran' "$dir/pytest.log" | tail -n1 | tr -d '=' | xargs || true)
    ((rc == 124)) && summary="TIMEOUT after ${TIMEOUT}s; $summary"
    echo "SUMMARY $name: ${summary:-no pytest summary}; sanitizer reports: $n; pytest exit $rc; wall $(($(date +%s) - start))s"
    ((rc == 0 && n == 0))
}

if [[ ${1:-} == --prepare ]]; then
    s=$(date +%s)
    ossl=$(tsan_openssl)
    log "instrumented OpenSSL ready in $(($(date +%s) - s))s"
    prepare asan "$ASAN_FLAGS" "$OPENSSL_PREFIX"
    prepare tsan "$TSAN_FLAGS" "$ossl"
    log "asan and tsan builds ready in $(($(date +%s) - s))s"
    exit 0
fi

status=0
t0=$(date +%s)
for b in $BUILDS; do
    s=$(date +%s)
    case $b in
    asan)
        LIB=libasan.so VAR=ASAN_OPTIONS
        # detect_leaks=0: the interpreter is not instrumented and CPython frees little of
        # what it allocates before exit; LeakSanitizer would report the interpreter's memory,
        # and its stacks (frame-pointer unwinding through an interpreter built without frame
        # pointers) could not tell icecrypt's allocations from CPython's for a suppression.
        OPTS="detect_leaks=0:halt_on_error=1:abort_on_error=0:detect_stack_use_after_return=1"
        OPTS+=":check_initialization_order=1:strict_string_checks=1:detect_invalid_pointer_pairs=1"
        build asan "$ASAN_FLAGS" "$OPENSSL_PREFIX" ||
            { status=1; continue; }
        canary asan "overflow(8)" "signed_overflow(1)" || { status=1; continue; }
        echo "sanitize: asan build and canaries $(($(date +%s) - s))s"
        run asan -- tests/ags1 || status=1
        ;;
    tsan)
        LIB=libtsan.so VAR=TSAN_OPTIONS
        # die_after_fork=0: the fork tests fork a multi-threaded process on purpose and the
        # child starts a worker pool of its own (what PySpark's forked Python workers do).
        OPTS="halt_on_error=1:second_deadlock_stack=1:die_after_fork=0:suppressions=$SUPP/tsan.supp"
        if [[ ${SANITIZE_TSAN_OPENSSL:-instrumented} == pinned ]]; then
            ossl=$OPENSSL_PREFIX
        else
            ossl=$(tsan_openssl) || { status=1; continue; }
        fi
        build tsan "$TSAN_FLAGS" "$ossl" || { status=1; continue; }
        canary tsan "race()" || { status=1; continue; }
        echo "sanitize: tsan build (OpenSSL: $ossl) and canary $(($(date +%s) - s))s"
        run tsan ICECRYPT_THREADS=4 -- tests/ags1 || status=1
        ;;
    leak)
        # The driver and gcm.c compiled with ASan + UBSan (LeakSanitizer is part of ASan),
        # linked with the pinned libcrypto.  fast_unwind_on_malloc=0: libcrypto has no frame
        # pointers, and the suppressions match frames inside it.
        dir=$WORK/leak logs=$WORK/leak/reports
        mkdir -p "$logs"
        rc=0
        gcc -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g -O1 \
            -I"$ROOT/include" -I"$OPENSSL_PREFIX/include" "$SUPP/leak_check.c" "$ROOT/src/icecrypt/_native/gcm.c" \
            "$OPENSSL_PREFIX/lib/libcrypto.a" -lpthread -ldl -o "$dir/leak_check" || { status=1; continue; }
        ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:fast_unwind_on_malloc=0:quarantine_size_mb=64:log_path=$logs/asan" \
            LSAN_OPTIONS="suppressions=$SUPP/lsan.supp:print_suppressions=1" \
            UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:exitcode=$UBSAN_EXIT" \
            timeout "$TIMEOUT" "$dir/leak_check" >"$dir/out.log" 2>&1 || rc=$?
        n=$(reports "$logs")
        ((rc == 0)) || cat "$dir/out.log" >&2
        ((rc == UBSAN_EXIT)) && n=$((n + 1))
        echo "SUMMARY leak: native core driver $(tail -n1 "$dir/out.log"); suppressed: $(grep -hE '^ +[0-9]+ +[0-9]+ +[a-z_]+$' "$logs"/* 2>/dev/null | awk '{c += $1} END {print c + 0}') OpenSSL per-thread allocations; sanitizer reports: $n; exit $rc; wall $(($(date +%s) - s))s"
        ((rc == 0 && n == 0)) || status=1
        ;;
    *) log "unknown build $b"; status=1 ;;
    esac
done
echo "sanitize: total $(($(date +%s) - t0))s: $( ((status == 0)) && echo clean || echo FAILED)"
exit $status

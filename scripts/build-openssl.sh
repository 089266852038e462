#!/usr/bin/env bash
# Build the OpenSSL 3.5 LTS that icecrypt links statically, once, into a cache.
#
#   scripts/build-openssl.sh            fetch (if needed), verify, build, install; prints the prefix
#   scripts/build-openssl.sh --check    fetch into an empty temporary cache, verify, configure,
#                                       then throw it away (what `make test` runs, to prove the
#                                       cold path on every run)
#
# The source is the upstream release tarball (Debian ships it unmodified as the orig tarball of
# its `openssl` source package). It is obtained by the first of these that works, each verified:
#   1. ICECRYPT_OPENSSL_TARBALL=/path/openssl-3.5.x.tar.gz   checked against the pins below
#   2. apt: the newest 3.5.x >= $MIN that Debian trixie's signed source index lists, downloaded
#      from the index's pool directory and checked against the index's own sha256 (apt verified
#      the index's signature when it fetched it)
#   3. the pinned orig tarballs, fetched from the same archive's pool path, newest first
# The archive's URI is derived from this machine's apt configuration (its bookworm entry), so no
# host name is written here. Nothing falls back to the system OpenSSL: on failure the script
# says what each step answered and which escape hatches exist, and exits non-zero.
#
# Result: ${ICECRYPT_CACHE:-~/.cache/icecrypt}/openssl-<version>/{include,lib/libcrypto.a}: libcrypto
# alone, configured with only what icecrypt calls (OPTIONS below); no libssl, no `openssl` binary.
# Concurrent runs are serialized by a lock in the cache, and each install is staged in a
# temporary directory and renamed into place, so a cache never holds half an install.
# Prints the install prefix on the last line of stdout.
set -euo pipefail

MIN=3.5.7
# (version sha256) of upstream release tarballs, newest first. 3.5.9's sum is the one trixie's
# signed index lists; the others match that index's history and upstream's published sums.
# 3.5.5 stays as a last resort below MIN (it has the same AES-GCM code; later releases fixed
# issues in parts icecrypt does not use), and is announced when it is used.
PINS=(
    "3.5.9 603f5602e2eef00d77fbd429d34dcd5822bb301757a1bc9cdb24c670f1eb859a"
    "3.5.7 a8c0d28a529ca480f9f36cf5792e2cd21984552a3c8e4aa11a24aa31aeac98e8"
    "3.5.5 b28c91532a8b65a1f983b4c28b7488174e4a01008e29ce8e69bd789f28bc2a89"
)
# Configure options.  icecrypt calls EVP AES-GCM, RAND_bytes, OPENSSL_cleanse and the version
# query, nothing else: libcrypto is built without TLS, the command-line tool, engines, and every
# algorithm family outside AES, the SHA families and the DRBGs that seed RAND_bytes (AES stays
# in full, with its AES-NI/VAES assembly).  Less to build (about 1.5 min on 2 cores instead
# of 3.3) and less linked into the module.  `--print-options` prints them (sanitize.sh builds
# its instrumented libcrypto with the same set).
OPTIONS=(no-shared no-tests no-docs no-module -fPIC
         no-apps no-engine no-legacy no-dso no-comp no-ui-console
         no-ssl no-tls no-dtls no-quic no-sock no-http no-ocsp no-cmp no-cms no-ct no-ts no-srp no-srtp
         no-aria no-bf no-blake2 no-camellia no-cast no-chacha no-des no-idea no-md4 no-mdc2 no-ocb
         no-poly1305 no-rc2 no-rc4 no-rmd160 no-seed no-siphash no-siv no-sm2 no-sm3 no-sm4 no-whirlpool
         no-dh no-dsa no-ec no-ecx no-ml-kem no-ml-dsa no-slh-dsa no-scrypt no-argon2)
if [[ ${1:-} == --print-options ]]; then printf '%s\n' "${OPTIONS[@]}"; exit 0; fi

# Which steps to try, in order (the tests narrow it to exercise one step at a time).
STEPS=${ICECRYPT_OPENSSL_FETCH:-tarball apt pool}

CHECK=0
[[ ${1:-} == --check ]] && CHECK=1
[[ ${1:-} == --print-archive ]] && CHECK=1    # (for the tests: the archive URI this machine uses)
log() { echo "build-openssl: $*" >&2; }

if ((CHECK)); then
    CACHE=$(mktemp -d)
    trap 'rm -rf "$CACHE"' EXIT
else
    CACHE=${ICECRYPT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/icecrypt}
fi
mkdir -p "$CACHE"

version_ge() { [[ $(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1) == "$2" ]]; }
pinned_sum() { local p; for p in "${PINS[@]}"; do [[ ${p%% *} == "$1" ]] && { echo "${p#* }"; return 0; }; done; return 1; }
sum_ok() { echo "$2  $1" | sha256sum -c --status 2>/dev/null; }

# The URI serving bookworm in the machine's apt configuration (deb822 or one-line format).
archive_uri() {
    local uri="" f
    local etc=${ICECRYPT_APT_ETC:-/etc/apt}   # tests point this at a sources list of their own
    for f in "$etc"/sources.list.d/*.sources; do
        [[ -f $f ]] || continue
        uri=$(awk '/^URIs:/{u=$2} /^Suites:/{for(i=2;i<=NF;i++) if($i=="bookworm") {print u; exit}}' "$f")
        [[ -n $uri ]] && break
    done
    if [[ -z $uri ]]; then
        uri=$(cat "$etc"/sources.list "$etc"/sources.list.d/*.list 2>/dev/null |
              awk '$1=="deb" && $0 ~ / bookworm / {for(i=2;i<=NF;i++) if($i ~ /^[a-z+]+:\/\//) {print $i; exit}}')
    fi
    [[ -n $uri ]] && echo "${uri%/}"
}

if [[ ${1:-} == --print-archive ]]; then archive_uri; exit; fi

# An install already in the cache (newest first) is used as it is: no network.
cached_prefix() {
    local d best=""
    for d in "$CACHE"/openssl-3.5.*; do
        [[ -f $d/.complete && -f $d/lib/libcrypto.a ]] || continue
        local v=${d##*/openssl-}
        [[ -z $best ]] || version_ge "$v" "${best##*/openssl-}" && best=$d
    done
    [[ -n $best ]] && echo "$best"
}

# Everything below that writes into the cache holds its lock (flock(1), or perl's flock where
# util-linux is missing, as on macOS).
exec 9>>"$CACHE/.lock"
if command -v flock >/dev/null; then
    flock 9
else
    perl -MFcntl=:flock -e 'open(my $f, ">>&=", 9) or die; flock($f, LOCK_EX) or die'
fi

if ((!CHECK)) && [[ -z ${ICECRYPT_OPENSSL_TARBALL:-} ]] && prefix=$(cached_prefix); then
    echo "$prefix"
    exit 0
fi

REPORT=()          # one line per step: what was tried and what it answered
VERSION="" TARBALL=""

# download URI FILE SHA256: apt's own downloader (honours the machine's apt proxy settings and
# checks the hash), else curl; the file appears only once its hash matched.
download() {
    local tmp="$2.part"
    rm -f "$tmp"
    if [[ -x /usr/lib/apt/apt-helper ]]; then
        /usr/lib/apt/apt-helper -qq download-file "$1" "$tmp" "SHA256:$3" >/dev/null 2>&1 || { rm -f "$tmp"; return 1; }
    elif command -v curl >/dev/null; then
        curl -fsSL --retry 2 -o "$tmp" "$1" || { rm -f "$tmp"; return 1; }
    else
        return 1
    fi
    sum_ok "$tmp" "$3" || { rm -f "$tmp"; return 2; }
    mv "$tmp" "$2"
}

step_tarball() {
    local f=${ICECRYPT_OPENSSL_TARBALL:-}
    if [[ -z $f ]]; then REPORT+=("1. ICECRYPT_OPENSSL_TARBALL: not set"); return 1; fi
    if [[ ! -f $f ]]; then REPORT+=("1. ICECRYPT_OPENSSL_TARBALL=$f: no such file"); return 1; fi
    local base=${f##*/} v
    v=$(sed -nE 's/^openssl[-_](3\.5\.[0-9]+)(\.orig)?\.tar\.gz$/\1/p' <<<"$base")
    local p sum
    for p in "${PINS[@]}"; do
        sum=${p#* }
        if sum_ok "$f" "$sum"; then
            VERSION=${p%% *} TARBALL=$f
            REPORT+=("1. ICECRYPT_OPENSSL_TARBALL=$f: OpenSSL $VERSION, sha256 matches its pin")
            return 0
        fi
    done
    REPORT+=("1. ICECRYPT_OPENSSL_TARBALL=$f: sha256 $(sha256sum "$f" | cut -c1-16)... matches no pin${v:+ (name says $v)}; refused")
    return 1
}

APT_WORK=""
step_apt() {
    local uri
    if ! command -v apt-get >/dev/null; then REPORT+=("2. apt: apt-get not found"); return 1; fi
    if ! uri=$(archive_uri); then REPORT+=("2. apt: no bookworm entry in the apt configuration to derive the archive from"); return 1; fi
    APT_WORK=$(mktemp -d)
    mkdir -p "$APT_WORK/lists/partial"
    cat >"$APT_WORK/trixie.sources" <<SRC
Types: deb-src
URIs: $uri
Suites: trixie trixie-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    local opts=(-o "Dir::Etc::SourceList=$APT_WORK/trixie.sources" -o "Dir::Etc::SourceParts=/dev/null"
                -o "Dir::State::Lists=$APT_WORK/lists" -o "Dir::Cache=$APT_WORK/cache"
                -o "APT::Get::List-Cleanup=0" -o "APT::Sandbox::User=root")
    log "reading Debian trixie's signed source index"
    local out
    if ! out=$(apt-get -q "${opts[@]}" update 2>&1); then
        REPORT+=("2. apt: updating trixie's source index failed: $(grep -E '^(E|W):' <<<"$out" | head -n1)")
        return 1
    fi
    # Each stanza: version, pool directory, sha256 of the orig tarball (from the signed index).
    local candidates
    candidates=$(apt-cache "${opts[@]}" showsrc openssl 2>/dev/null | awk '
        function emit() { if (pkg == "openssl" && file != "") print ver, dir, sum, file; pkg = ver = dir = sum = file = "" }
        /^$/ { emit(); next }
        /^Package: / { pkg = $2 }
        /^Version: / { ver = $2 }
        /^Directory: / { dir = $2 }
        /^Checksums-Sha256:/ { sums = 1; next }
        /^[^ ]/ { sums = 0 }
        sums && $3 ~ /^openssl_3\.5\.[0-9]+\.orig\.tar\.gz$/ { sum = $1; file = $3 }
        END { emit() }' | sort -u -k1,1Vr)
    if [[ -z $candidates ]]; then REPORT+=("2. apt: trixie's index lists no openssl 3.5.x source"); return 1; fi
    local ver dir sum file v tried=()
    while read -r ver dir sum file; do
        v=${file#openssl_}; v=${v%.orig.tar.gz}
        version_ge "$v" "$MIN" || continue
        log "downloading $file (index version $ver)"
        if download "$uri/$dir/$file" "$CACHE/$file" "$sum"; then
            VERSION=$v TARBALL=$CACHE/$file
            REPORT+=("2. apt: $file of $ver, sha256 matches trixie's signed index")
            return 0
        fi
        tried+=("$ver: $uri/$dir/$file not served or wrong sum")
    done <<<"$candidates"
    local IFS=';'
    REPORT+=("2. apt: index lists $(awk '{printf "%s%s", (NR>1?", ":""), $1}' <<<"$candidates"); ${tried[*]:-none >= $MIN}")
    return 1
}

step_pool() {
    local uri
    if ! uri=$(archive_uri); then REPORT+=("3. pool: no bookworm entry in the apt configuration to derive the archive from"); return 1; fi
    local p v sum file answers=()
    for p in "${PINS[@]}"; do
        v=${p%% *} sum=${p#* } file=openssl_${p%% *}.orig.tar.gz
        log "downloading pinned $file from the pool"
        local rc=0
        download "$uri/pool/main/o/openssl/$file" "$CACHE/$file" "$sum" || rc=$?
        if ((rc == 0)); then
            VERSION=$v TARBALL=$CACHE/$file
            REPORT+=("3. pool: $file, sha256 matches its pin")
            version_ge "$v" "$MIN" || log "WARNING: using OpenSSL $v, older than $MIN: no newer pinned tarball could be fetched"
            return 0
        fi
        answers+=("$v: $( ((rc == 2)) && echo 'checksum mismatch' || echo 'not served')")
    done
    local IFS=';'
    REPORT+=("3. pool: $uri/pool/main/o/openssl/ tried ${answers[*]}")
    return 1
}

cleanup_apt() { [[ -n $APT_WORK ]] && rm -rf "$APT_WORK"; APT_WORK=""; }

# A tarball already in the cache that matches a pin is reused (no network) unless a specific
# tarball was named.
if ((!CHECK)) && [[ -z ${ICECRYPT_OPENSSL_TARBALL:-} ]]; then
    for p in "${PINS[@]}"; do
        f=$CACHE/openssl_${p%% *}.orig.tar.gz
        if [[ -f $f ]] && sum_ok "$f" "${p#* }"; then VERSION=${p%% *} TARBALL=$f; break; fi
    done
fi

if [[ -z $TARBALL ]]; then
    for step in $STEPS; do
        case $step in
            tarball) step_tarball && break ;;
            apt) step_apt && { cleanup_apt; break; }; cleanup_apt ;;
            pool) step_pool && break ;;
            *) log "unknown step '$step' in ICECRYPT_OPENSSL_FETCH"; exit 2 ;;
        esac
        # An explicitly named tarball that fails its check is an error, not a reason to fetch.
        if [[ $step == tarball && -n ${ICECRYPT_OPENSSL_TARBALL:-} ]]; then break; fi
    done
fi

if [[ -z $TARBALL ]]; then
    {
        echo "build-openssl: could not obtain a verified OpenSSL 3.5 source tarball (need >= $MIN)."
        echo "What was tried:"
        printf '  %s\n' "${REPORT[@]}"
        echo "Ways out: set ICECRYPT_OPENSSL_TARBALL to an upstream openssl-3.5.x.tar.gz whose sha256 is"
        echo "one of the pins in scripts/build-openssl.sh (an offline build); or ICECRYPT_OPENSSL_DIR to"
        echo "the prefix of an OpenSSL 3.5 you built (include/ and lib/libcrypto.a); or, knowingly,"
        echo "ICECRYPT_OPENSSL=system to link the system libcrypto (OpenSSL 3.0 runs AES-GCM about 4x slower)."
    } >&2
    exit 1
fi
printf '%s\n' "${REPORT[@]}" | sed 's/^/build-openssl: /' >&2

PREFIX=$CACHE/openssl-$VERSION
if ((!CHECK)) && [[ -f $PREFIX/.complete && -f $PREFIX/lib/libcrypto.a ]]; then
    echo "$PREFIX"     # this version is already built (a named tarball that was built before)
    exit 0
fi
build=$(mktemp -d)
if ((CHECK)); then trap 'rm -rf "$build" "$CACHE"' EXIT; else trap 'rm -rf "$build"' EXIT; fi
tar -xzf "$TARBALL" -C "$build"
cd "$build/openssl-$VERSION"
log "configuring OpenSSL $VERSION (static, PIC) for $PREFIX"
# no-shared: only static archives; -fPIC: they go into a Python extension module.
./Configure "${OPTIONS[@]}" \
    --prefix="$PREFIX" --libdir=lib --openssldir="$PREFIX/ssl" >"$build/configure.log" 2>&1 ||
    { cat "$build/configure.log" >&2; log "Configure failed"; exit 1; }
if ((CHECK)); then
    log "check passed: OpenSSL $VERSION fetched, verified and configured in an empty cache"
    exit 0
fi
log "building (a few minutes)"
# Output goes to a log, shown only if a step fails.
quiet() { "$@" >"$build/log" 2>&1 || { tail -n 40 "$build/log" >&2; log "failed: $*"; exit 1; }; }
jobs=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)
# The generated headers, then the static libcrypto alone (`make` would also build libssl).
quiet make -j"$jobs" build_generated
quiet make -j"$jobs" libcrypto.a
# Stage the install (the headers, generated ones included, and the archive), then rename it
# into place: a cache never holds half an install (the stage lives in the cache directory, so
# the rename stays on one file system).
stage=$(mktemp -d "$CACHE/.stage.XXXXXX")
trap 'rm -rf "$build" "$stage"' EXIT
chmod 755 "$stage"
mkdir -p "$stage/include" "$stage/lib"
cp -R include/openssl "$stage/include/"
cp libcrypto.a "$stage/lib/"
touch "$stage/.complete"
rm -rf "$PREFIX.old"
[[ -e $PREFIX ]] && mv "$PREFIX" "$PREFIX.old"
mv "$stage" "$PREFIX"
rm -rf "$PREFIX.old"
echo "$PREFIX"

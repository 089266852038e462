#!/usr/bin/env bash
# Build the pinned OpenSSL 3.5 LTS that icecrypt links statically.
#
# The source is Debian trixie's `openssl` source package (upstream tarball only, no
# Debian patches), fetched with apt from the archive this machine already uses: the
# deb-src entry is derived from the machine's own bookworm entry, so no host name is
# written here.  The result is installed once into a cache directory outside the
# repository and reused by every later build:
#
#   ${ICECRYPT_CACHE:-~/.cache/icecrypt}/openssl-3.5.7/{include,lib/libcrypto.a,bin/openssl}
#
# Prints the install prefix on its last line of stdout.
set -euo pipefail

VERSION=3.5.7
SHA256=a8c0d28a529ca480f9f36cf5792e2cd21984552a3c8e4aa11a24aa31aeac98e8
CACHE=${ICECRYPT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/icecrypt}
PREFIX=$CACHE/openssl-$VERSION
TARBALL=$CACHE/openssl_$VERSION.orig.tar.gz

log() { echo "build-openssl: $*" >&2; }

if [[ -f $PREFIX/lib/libcrypto.a && -f $PREFIX/.complete ]]; then
    echo "$PREFIX"
    exit 0
fi
mkdir -p "$CACHE"

fetch_source() {
    # Find the URI serving bookworm in the machine's apt configuration (deb822 or
    # one-line format), and point a private deb-src list at trixie on the same URI.
    local uri=""
    if compgen -G "/etc/apt/sources.list.d/*.sources" >/dev/null; then
        uri=$(awk '/^URIs:/{u=$2} /^Suites:/{for(i=2;i<=NF;i++) if($i=="bookworm") {print u; exit}}' \
              /etc/apt/sources.list.d/*.sources | head -n1)
    fi
    if [[ -z $uri ]]; then
        uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
              awk '$1=="deb" && $0 ~ / bookworm / {for(i=2;i<=NF;i++) if($i ~ /^[a-z]+:\/\//) {print $i; exit}}' | head -n1)
    fi
    [[ -n $uri ]] || { log "no bookworm entry in the apt configuration"; return 1; }

    local work
    work=$(mktemp -d)
    mkdir -p "$work/lists/partial"
    cat >"$work/trixie.sources" <<SRC
Types: deb-src
URIs: $uri
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    local opts=(-o "Dir::Etc::SourceList=$work/trixie.sources" -o "Dir::Etc::SourceParts=/dev/null"
                -o "Dir::State::Lists=$work/lists" -o "APT::Get::List-Cleanup=0" -o "APT::Sandbox::User=root")
    log "fetching the openssl source package from trixie"
    apt-get -qq "${opts[@]}" update >&2
    (cd "$work" && apt-get -qq "${opts[@]}" source --download-only "openssl" >&2)
    mv "$work/openssl_$VERSION.orig.tar.gz" "$TARBALL"
    rm -rf "$work"
}

if [[ ! -f $TARBALL ]] || ! echo "$SHA256  $TARBALL" | sha256sum -c --status; then
    rm -f "$TARBALL"
    fetch_source
fi
echo "$SHA256  $TARBALL" | sha256sum -c --status || { log "checksum mismatch for $TARBALL"; exit 1; }

build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
tar -xzf "$TARBALL" -C "$build"
cd "$build/openssl-$VERSION"
log "configuring OpenSSL $VERSION (static, PIC) into $PREFIX"
# no-shared: only static archives; -fPIC: they go into a Python extension module.
./Configure no-shared no-tests no-docs no-module -fPIC \
    --prefix="$PREFIX" --libdir=lib --openssldir="$PREFIX/ssl" >&2
log "building (a few minutes)"
make -s -j"$(nproc)" >/dev/null
rm -rf "$PREFIX"
make -s install_sw >/dev/null
touch "$PREFIX/.complete"
echo "$PREFIX"

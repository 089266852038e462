#!/usr/bin/env bash
# Install the system packages the build and the tests need, with apt-get, only when
# something is missing.  Safe to run again and again.
set -euo pipefail

need=()
have() { command -v "$1" >/dev/null 2>&1; }

have gcc || need+=(gcc)
have make || need+=(make)
have perl || need+=(perl)                     # OpenSSL's Configure
have java || need+=(openjdk-17-jre-headless)   # PySpark and parquet-mr interop tests
have javac || need+=(openjdk-17-jdk-headless)  # icecrypt's Spark jar (scripts/build-jar.sh)
have softhsm2-util || need+=(softhsm2)         # the PKCS#11 KMS tests
# the PostgreSQL catalog tests (initdb/postgres run as an unprivileged user)
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || need+=(postgresql)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
python3 - <<'PY' 2>/dev/null || need+=(python3-dev)
import os, sysconfig, sys
sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else 1)
PY

if ((${#need[@]})); then
    echo "ensure-system: installing ${need[*]}" >&2
    sudo=""
    [[ $(id -u) == 0 ]] || sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

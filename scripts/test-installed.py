"""Run the test suites against an installed icecrypt (a wheel), never the source tree.

    python scripts/test-installed.py ROOT [PYTEST ARGS...]

Copies ROOT/tests (and the wheel checker) into a temporary directory, writes pytest's
settings from ROOT/pyproject.toml there, proves that `import icecrypt` finds the installed
package and not ROOT, then runs pytest on the AGS1, keys, Parquet, Avro suites, the table
tests that read and write real files (Java's tables, round trips, deletes, damage) and the
packaging checks (or on the given arguments). The table suite's logic tests (schema, refs,
commit model, CLI) are the same pure Python as in the tree and run there, in `make test`. Used by `make wheel-test` and by
cibuildwheel's test-command.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

SUITES = [
    "tests/test_packaging.py",
    "tests/ags1",
    "tests/keys",
    "tests/parquet",
    "tests/avro",
    *(
        f"tests/table/test_{name}.py"
        for name in ("java_tables", "write_java_tables", "write_roundtrip", "write_format", "deletes", "damage", "verify")
    ),
]


def main(argv: list[str]) -> int:
    root = Path(argv[0]).resolve()
    args = argv[1:] or SUITES
    import icecrypt._gcm

    where = Path(icecrypt._gcm.__file__).resolve()
    if root / "src" in where.parents or "site-packages" not in where.parts:
        print(f"test-installed: icecrypt is imported from the source tree ({where})", file=sys.stderr)
        return 1
    print(f"test-installed: icecrypt {icecrypt.__version__} from {where.parent}, {icecrypt.openssl_version()}")

    options = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    env = dict(os.environ)
    env.setdefault("ICECRYPT_VECTORS", str(root.parent / "shared" / "vectors"))
    with tempfile.TemporaryDirectory(prefix="icecrypt-installed-") as work:
        shutil.copytree(root / "tests", Path(work) / "tests", ignore=shutil.ignore_patterns("__pycache__"))
        (Path(work) / "scripts").mkdir()
        shutil.copy(root / "scripts" / "check-wheel.py", Path(work) / "scripts")
        with open(Path(work) / "pytest.ini", "w") as ini:
            ini.write("[pytest]\n")
            for key, value in options.items():
                if isinstance(value, list):
                    value = "".join(f"\n    {item}" for item in value)
                ini.write(f"{key} = {value}\n")
        # on every core when pytest-xdist is there (the test extra has it), files kept whole
        xdist = (["-n", os.environ.get("TEST_WORKERS", "auto"), "--dist", "loadfile", "--no-loadscope-reorder"]
                 if _has("xdist") else [])
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *xdist, *args]
        return subprocess.run(command, cwd=work, env=env).returncode


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""What a user installs: the version, the linked OpenSSL, the module's symbol table, the wheel.

Runs in the main suite (against the in-tree build) and in `make wheel-test` (against the
installed wheel, with ICECRYPT_WHEEL naming it).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

import icecrypt
import icecrypt._gcm

CHECKER = Path(__file__).resolve().parents[1] / "scripts" / "check-wheel.py"


@pytest.fixture(scope="module")
def checker():
    spec = importlib.util.spec_from_file_location("check_wheel", CHECKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_one_version_everywhere():
    assert icecrypt.__version__ == importlib.metadata.version("icecrypt")
    assert icecrypt.__version__.count(".") == 2


def test_cli_version_names_the_linked_openssl():
    out = subprocess.run(
        [sys.executable, "-m", "icecrypt", "--version"], check=True, capture_output=True, text=True
    ).stdout.strip()
    assert out == f"icecrypt {icecrypt.__version__} ({icecrypt.openssl_version()}, {icecrypt._gcm.OPENSSL_LINKAGE})"


def test_links_openssl_3_5():
    # The speed of the codec depends on it (OpenSSL 3.0 is ~4x slower on AES-GCM).
    assert icecrypt.openssl_version().startswith("OpenSSL 3.5."), icecrypt.openssl_version()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the ELF dynamic symbol table")
def test_module_exports_no_openssl_symbols(checker):
    if icecrypt._gcm.OPENSSL_LINKAGE != "static":
        pytest.skip("built against a shared OpenSSL (ICECRYPT_OPENSSL=system)")
    exported, needed = checker.elf_dynamic(icecrypt._gcm.__file__)
    assert exported == ["PyInit__gcm"], exported[:10]
    assert not [lib for lib in needed if lib.startswith(("libcrypto", "libssl"))], needed
    assert checker.module_problems(icecrypt._gcm.__file__) == []


def test_symbol_check_catches_a_leak(checker, tmp_path):
    """The checker itself can fail: a shared object that exports an OpenSSL-like symbol."""
    source = tmp_path / "leak.c"
    source.write_text("int EVP_leaked(void) { return 1; }\nint PyInit__gcm(void) { return 0; }\n")
    library = tmp_path / "leak.so"
    compiler = os.environ.get("CC", "cc")
    try:
        subprocess.run([compiler, "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("no C compiler")
    problems = checker.module_problems(str(library))
    assert problems and "1 of OpenSSL" in problems[0], problems


@pytest.mark.skipif(not os.environ.get("ICECRYPT_WHEEL"), reason="only under make wheel-test")
def test_the_wheel(checker):
    assert checker.check_wheel(os.environ["ICECRYPT_WHEEL"]) == []
    # And the module under test is the wheel's, not a source tree's.
    assert "site-packages" in Path(icecrypt._gcm.__file__).parts


SOURCE_TREE = Path(__file__).resolve().parents[1]
WORKFLOW = SOURCE_TREE / ".github" / "workflows" / "wheels.yml"


@pytest.mark.skipif(not WORKFLOW.exists(), reason="only in the source tree")
def test_hosted_workflow_parses_and_uses_the_shared_pieces():
    yaml = pytest.importorskip("yaml")
    workflow = yaml.safe_load(WORKFLOW.read_text())
    jobs = workflow["jobs"]
    assert set(jobs) == {"wheels", "sdist"}
    matrix = {(m["os"].split("-")[0], m["arch"]) for m in jobs["wheels"]["strategy"]["matrix"]["include"]}
    assert matrix == {("ubuntu", "x86_64"), ("ubuntu", "aarch64"), ("macos", "arm64")}
    text = WORKFLOW.read_text()
    assert "config-file: cibuildwheel.toml" in text and "scripts/test-installed.py" in text
    # The OpenSSL version it downloads is one the build script pins.
    version = workflow["env"]["OPENSSL_VERSION"]
    assert f'"{version} ' in (SOURCE_TREE / "scripts" / "build-openssl.sh").read_text()


@pytest.mark.skipif(not WORKFLOW.exists(), reason="only in the source tree")
@pytest.mark.parametrize(
    "platform, archs, expected",
    [("linux", "x86_64,aarch64", 10), ("macos", "arm64", 5)],
)
def test_cibuildwheel_reads_the_configuration(platform, archs, expected):
    pytest.importorskip("cibuildwheel")
    out = subprocess.run(
        [sys.executable, "-m", "cibuildwheel", "--config-file", "cibuildwheel.toml", "--platform", platform,
         "--archs", archs, "--print-build-identifiers"],
        cwd=SOURCE_TREE, check=True, capture_output=True, text=True,
    ).stdout.split()
    assert len(out) == expected, out
    assert all(ident.startswith(("cp310-", "cp311-", "cp312-", "cp313-", "cp314-")) for ident in out)

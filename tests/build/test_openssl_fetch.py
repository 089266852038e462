"""scripts/build-openssl.sh: every step of the source chain, its refusals, its failure
report, and the cache lock. Steps that fetch use the machine's own Debian archive (the
same one a new user's build uses); each runs with --check (fetch, verify, configure into
an empty cache that is then removed), so nothing here builds OpenSSL."""

from __future__ import annotations

import fcntl
import functools
import hashlib
import http.server
import os
import re
import subprocess
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build-openssl.sh"


def run(*args, timeout=600, **env):
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@functools.cache
def pins() -> dict[str, str]:
    text = SCRIPT.read_text()
    return dict(re.findall(r'^\s+"(3\.5\.\d+) ([0-9a-f]{64})"$', text, re.M))


@pytest.fixture(scope="module")
def pinned_tarball(tmp_path_factory):
    """The pinned 3.5.7 upstream tarball, fetched from the pool and checked, as a user names it."""
    version = "3.5.7"
    target = tmp_path_factory.mktemp("src") / f"openssl-{version}.tar.gz"
    subprocess.run(
        ["/usr/lib/apt/apt-helper", "-qq", "download-file", _pool_uri(version), str(target), f"SHA256:{pins()[version]}"],
        check=True,
        capture_output=True,
    )
    return target, version


def _pool_uri(version: str) -> str:
    out = run("--print-archive").stdout.strip()
    return f"{out}/pool/main/o/openssl/openssl_{version}.orig.tar.gz"


def test_pins_are_newest_first_and_include_the_floor():
    versions = list(pins())
    assert versions == sorted(versions, key=lambda v: tuple(map(int, v.split("."))), reverse=True)
    assert "3.5.7" in versions


def test_apt_step_alone_gets_a_verified_source():
    result = run("--check", ICECRYPT_OPENSSL_FETCH="apt")
    assert result.returncode == 0, result.stderr
    assert "sha256 matches trixie's signed index" in result.stderr
    assert "check passed" in result.stderr


def test_pool_step_alone_gets_a_pinned_source():
    result = run("--check", ICECRYPT_OPENSSL_FETCH="pool")
    assert result.returncode == 0, result.stderr
    assert re.search(r"3\. pool: openssl_3\.5\.\d+\.orig\.tar\.gz, sha256 matches its pin", result.stderr)


def test_named_tarball_is_checked_against_the_pins(pinned_tarball):
    tarball, version = pinned_tarball
    result = run("--check", ICECRYPT_OPENSSL_TARBALL=str(tarball))
    assert result.returncode == 0, result.stderr
    assert f"OpenSSL {version}, sha256 matches its pin" in result.stderr


def test_a_named_tarball_that_matches_no_pin_is_refused_without_fetching(tmp_path, pinned_tarball):
    tarball, version = pinned_tarball
    forged = tmp_path / tarball.name
    data = bytearray(tarball.read_bytes())
    data[len(data) // 2] ^= 1
    forged.write_bytes(bytes(data))
    result = run("--check", ICECRYPT_OPENSSL_TARBALL=str(forged))
    assert result.returncode == 1
    assert "matches no pin" in result.stderr and f"name says {version}" in result.stderr
    assert "downloading" not in result.stderr  # an explicit tarball is never replaced by a fetch
    for hatch in ("ICECRYPT_OPENSSL_TARBALL", "ICECRYPT_OPENSSL_DIR", "ICECRYPT_OPENSSL=system"):
        assert hatch in result.stderr


class _NotFound(http.server.BaseHTTPRequestHandler):
    requests: list[str] = []

    def do_GET(self):
        self.requests.append(self.path)
        self.send_error(404)

    def log_message(self, *args):
        pass


@pytest.fixture
def archive_that_serves_nothing(tmp_path):
    """An apt configuration whose bookworm entry points at a server on 127.0.0.1 that
    answers 404 to everything: what a broken or moved archive looks like."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    etc = tmp_path / "apt"
    (etc / "sources.list.d").mkdir(parents=True)
    (etc / "sources.list.d" / "debian.sources").write_text(
        f"Types: deb\nURIs: http://127.0.0.1:{server.server_port}/debian\nSuites: bookworm\n"
        "Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
    )
    _NotFound.requests = []
    yield etc
    server.shutdown()
    server.server_close()


def test_when_every_step_fails_the_report_says_what_each_answered(archive_that_serves_nothing):
    result = run("--check", ICECRYPT_APT_ETC=str(archive_that_serves_nothing), timeout=120)
    assert result.returncode == 1
    err = result.stderr
    assert "could not obtain a verified OpenSSL 3.5 source tarball" in err
    assert "1. ICECRYPT_OPENSSL_TARBALL: not set" in err
    assert "2. apt: updating trixie's source index failed" in err
    assert re.search(r"3\. pool: http://127\.0\.0\.1:\d+/debian/pool/main/o/openssl/ tried 3\.5\.9: not served", err)
    assert "Ways out" in err and "ICECRYPT_OPENSSL=system" in err
    # Every pin was asked for, newest first, at the pool path.
    asked = [p for p in _NotFound.requests if p.endswith(".orig.tar.gz")]
    assert asked == [f"/debian/pool/main/o/openssl/openssl_{v}.orig.tar.gz" for v in pins()]


def test_no_apt_configuration_is_reported(tmp_path):
    result = run("--check", ICECRYPT_APT_ETC=str(tmp_path), ICECRYPT_OPENSSL_FETCH="apt pool", timeout=60)
    assert result.returncode == 1
    assert "2. apt: no bookworm entry in the apt configuration" in result.stderr
    assert "3. pool: no bookworm entry in the apt configuration" in result.stderr


def test_builds_wait_for_the_cache_lock(tmp_path):
    """A second build waits while another holds the cache's lock, then uses its install."""
    prefix = tmp_path / "openssl-3.5.7"
    (prefix / "lib").mkdir(parents=True)
    (prefix / "lib" / "libcrypto.a").write_bytes(b"")
    with open(tmp_path / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another build holds the cache
        waiter = subprocess.Popen(
            ["bash", str(SCRIPT)], env={**os.environ, "ICECRYPT_CACHE": str(tmp_path)},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        try:
            with pytest.raises(subprocess.TimeoutExpired):
                waiter.wait(timeout=1.5)
            # The other build finishes its install (staged, then renamed) and lets go.
            (prefix / ".complete").touch()
            fcntl.flock(lock, fcntl.LOCK_UN)
            out, err = waiter.communicate(timeout=30)
        finally:
            waiter.kill()
    assert waiter.returncode == 0, err
    assert out.strip().splitlines()[-1] == str(prefix)


def test_a_half_install_is_never_used(tmp_path):
    """An install without its completion mark (a build killed mid-install) is not taken."""
    prefix = tmp_path / "openssl-3.5.7"
    (prefix / "lib").mkdir(parents=True)
    (prefix / "lib" / "libcrypto.a").write_bytes(b"")
    result = run(ICECRYPT_CACHE=str(tmp_path), ICECRYPT_APT_ETC=str(tmp_path / "none"), ICECRYPT_OPENSSL_FETCH="apt", timeout=60)
    assert result.returncode == 1  # it tried to fetch instead of using the half install
    assert "could not obtain" in result.stderr


def test_sha256_pins_are_real_sha256_digests():
    for version, digest in pins().items():
        assert len(bytes.fromhex(digest)) == hashlib.sha256().digest_size, version

"""The test servers stop when the process that started them is stopped by a signal
(tests/servers/reaper.py): a pytest run ended by SIGTERM or SIGKILL leaves nothing running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for this purpose (the reaper is its parent's business)
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120.0) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text().endswith("\n"):
        assert proc.poll() is None, f"the child exited with {proc.returncode} before writing {path.name}"
        assert time.monotonic() < deadline, f"{path.name} not written"
        time.sleep(0.05)
    return path.read_text().strip()


def _gone(pid: int, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _stop_owner(owner: subprocess.Popen, out: Path, sig: int) -> None:
    """Once ``owner`` wrote its server's PID to ``out``, send it ``sig``: the server must go."""
    server = None
    try:
        server = int(_wait_for(out, owner))
        assert _alive(server)
        owner.send_signal(sig)
        owner.wait(timeout=60)
        assert _gone(server), f"process {server} outlived its owner ({signal.Signals(sig).name})"
    finally:
        owner.kill()
        owner.wait()
        if server is not None and _alive(server):
            os.killpg(server, signal.SIGKILL)  # leave nothing behind, even when the test failed


_OWNER = """
import sys, time
sys.path.insert(0, sys.argv[1])
from servers import start_process
proc = start_process([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[2], "w").write(f"{proc.pid}\\n")
time.sleep(600)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_process_started_by_a_killed_owner_is_stopped(tmp_path, sig):
    """A process started with servers.start_process, in a session of its own (so no signal
    to the owner's group reaches it), is stopped when its owner dies without stopping it."""
    out = tmp_path / "pid"
    owner = subprocess.Popen([sys.executable, "-c", _OWNER, str(TESTS), str(out)])
    _stop_owner(owner, out, sig)


_SUITE = """
import os, time

def test_holds_a_server(moto_server):
    with open(os.environ["OUT"] + ".tmp", "w") as f:
        f.write(f"{moto_server.pid}\\n")
    os.rename(os.environ["OUT"] + ".tmp", os.environ["OUT"])
    time.sleep(600)
"""


@pytest.mark.slow
def test_pytest_stopped_by_sigterm_stops_its_servers(tmp_path):
    """A pytest run holding the session's moto server, stopped with SIGTERM, leaves no
    moto server behind."""
    pytest.importorskip("moto.server")
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["kms_fixtures_services"]\n')
    (tmp_path / "test_holder.py").write_text(textwrap.dedent(_SUITE))
    out = tmp_path / "pid"
    env = {**os.environ, "OUT": str(out), "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                            "--rootdir", str(tmp_path), str(tmp_path)], cwd=tmp_path, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _stop_owner(run, out, signal.SIGTERM)

"""The local keystore under concurrent master-key rotation (issue 16, item 11): two
processes adding and removing master keys at once never lose one another's change."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

from icecrypt.kms import LocalKms

_ROTATOR = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from icecrypt.kms import LocalKms

    keystore, tag, count, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
    kms = LocalKms(keystore)
    deadline = time.monotonic() + 60
    while not go.exists():  # both start together
        if time.monotonic() > deadline:
            sys.exit("never started")
        time.sleep(0.001)
    for i in range(count):
        kms.add_key(f"{tag}-{i}")
        if i % 3 == 2:
            kms.remove_key(f"{tag}-{i - 1}")
    """
)

COUNT = 30


def test_two_processes_rotating_master_keys_lose_nothing(tmp_path):
    keystore = tmp_path / "keystore.json"
    LocalKms.create_keystore(keystore, ["master"])
    go = tmp_path / "go"
    src = Path(__file__).resolve().parents[2] / "src"
    env = {"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"}
    procs = [subprocess.Popen([sys.executable, "-c", _ROTATOR, str(keystore), tag, str(COUNT), str(go)], env=env)
             for tag in ("a", "b")]
    time.sleep(0.5)
    go.touch()
    for proc in procs:
        assert proc.wait(timeout=120) == 0
    removed = {i - 1 for i in range(COUNT) if i % 3 == 2}
    expected = {"master"} | {f"{tag}-{i}" for tag in ("a", "b") for i in range(COUNT) if i not in removed}
    assert set(LocalKms(keystore).key_ids) == expected
    assert (tmp_path / "keystore.json.lock").stat().st_mode & 0o077 == 0

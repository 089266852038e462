"""The command line against an attacker who can write the table's storage (issue 16, items
17 and 18): decrypted rows are written as ``icecrypt decrypt`` writes them (0600, through a
temporary file, a symlink at the output replaced and its target untouched), and text from
storage (paths, key ids, messages quoting them, names found by listing) reaches the
operator's terminal with every control character escaped."""

from __future__ import annotations

import json
import os
import pty
import select
import stat
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from icecrypt.cli import main

MEMORY_KMS = ["--kms-type", "memory", "--kms-property", "encryption.kms.memory.iceberg-test-keys=true"]
#: sets the terminal's window title, clears the screen, reverses the text after it
HOSTILE = "\x1b]0;pwned\x07x\x1b[2J\u202e"
HOSTILE_SHOWN = "\\x1b]0;pwned\\x07x\\x1b[2J\\u202e"
RAW_CONTROLS = (b"\x1b", b"\x07", "\u202e".encode())


def run(capfd, *argv) -> tuple[int, str, str]:
    status = main([str(a) for a in argv])
    out, err = capfd.readouterr()
    return status, out, err


def run_process(*argv, **kwargs) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run([sys.executable, "-m", "icecrypt", *map(str, argv)], capture_output=True, timeout=120,
                          env=env, check=False, **kwargs)  # fmt: skip


def assert_no_controls(*outputs: str | bytes) -> None:
    for output in outputs:
        data = output.encode("utf-8", "surrogateescape") if isinstance(output, str) else output
        for control in RAW_CONTROLS:
            assert control not in data, output


@pytest.fixture
def table(tmp_path, capfd) -> Path:
    """An encrypted table of 600 rows made with the CLI."""
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": pa.array(range(600), pa.int64()), "cat": ["a", "b", "c"] * 200}), source)
    where = tmp_path / "t"
    assert run(capfd, "table", "create", where, "--schema", "id long required, cat string", "--table-key-id", "keyA",
               *MEMORY_KMS)[0] == 0  # fmt: skip
    assert run(capfd, "table", "append", where, source, "-q", *MEMORY_KMS)[0] == 0
    return where


def newest_metadata(where: Path) -> Path:
    return max((where / "metadata").glob("v*.metadata.json"), key=lambda p: int(p.name[1:].split(".")[0]))


def commit_edit(where: Path, change) -> Path:
    """What the attacker writes: the next metadata version (and the hint) with ``change``."""
    current = newest_metadata(where)
    metadata = json.loads(current.read_text())
    change(metadata)
    version = int(current.name[1:].split(".")[0]) + 1
    target = where / "metadata" / f"v{version}.metadata.json"
    target.write_text(json.dumps(metadata))
    (where / "metadata" / "version-hint.text").write_text(str(version))
    return target


# --- item 17: scan --output -----------------------------------------------------------------------


@pytest.mark.parametrize("suffix", ["csv", "parquet", "arrow", "jsonl"])
def test_scan_output_is_0600_and_replaces_a_symlink(tmp_path, capfd, table, suffix):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    victim.chmod(0o644)
    out = tmp_path / f"rows.{suffix}"
    out.symlink_to(victim)
    old_umask = os.umask(0o022)
    try:
        status, _, err = run(capfd, "table", "scan", table, "-o", out, *MEMORY_KMS)
    finally:
        os.umask(old_umask)
    assert status == 0, err
    assert victim.read_text() == "precious\n" and stat.S_IMODE(victim.stat().st_mode) == 0o644
    info = out.lstat()
    assert stat.S_ISREG(info.st_mode), "the symlink was followed"
    assert stat.S_IMODE(info.st_mode) == 0o600
    if suffix == "csv":
        rows = pacsv.read_csv(out)
    elif suffix == "parquet":
        rows = pq.read_table(out)
    elif suffix == "arrow":
        rows = pa.ipc.open_file(out).read_all()
    else:
        rows = pa.Table.from_pylist([json.loads(line) for line in out.read_text().splitlines()])
    assert sorted(rows.column("id").to_pylist()) == list(range(600))
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left


def test_scan_output_replaces_an_existing_file_with_a_private_one(tmp_path, capfd, table):
    out = tmp_path / "rows.parquet"
    out.write_bytes(b"old")
    out.chmod(0o666)
    status, _, err = run(capfd, "table", "scan", table, "-o", out, "--limit", "5", *MEMORY_KMS)
    assert status == 0, err
    assert stat.S_IMODE(out.stat().st_mode) == 0o600 and pq.read_table(out).num_rows == 5


def test_failed_scan_leaves_the_output_untouched(tmp_path, capfd, table):
    """A data file that fails to authenticate halfway: no partial plaintext under the
    output's name (the old one stays), no temporary file left."""
    data_file = next((table / "data").rglob("*.parquet"))
    blob = bytearray(data_file.read_bytes())
    blob[len(blob) // 2] ^= 1
    data_file.write_bytes(bytes(blob))
    out = tmp_path / "rows.csv"
    out.write_text("old\n")
    status, _, err = run(capfd, "table", "scan", table, "-o", out, *MEMORY_KMS)
    assert status == 2 and "authentication failed" in err
    assert out.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_scan_output_subprocess_symlink(tmp_path, capfd, table):
    victim = tmp_path / "victim.parquet"
    victim.write_bytes(b"keep me")
    out = tmp_path / "rows.parquet"
    out.symlink_to(victim)
    done = run_process("table", "scan", table, "-o", out, "--columns", "id", *MEMORY_KMS)
    assert done.returncode == 0, done.stderr
    assert victim.read_bytes() == b"keep me" and not out.is_symlink()
    assert stat.S_IMODE(out.stat().st_mode) == 0o600 and pq.read_table(out).num_rows == 600

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
from forgery import publish_next_version

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
    """What the attacker writes: the next metadata version (and the hint) with ``change``
    (without the authenticator, which would refuse it: the CLI loads without
    --require-authenticated-metadata here)."""
    return publish_next_version(where, change)


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


@pytest.mark.parametrize("limit", ["-1", "-5", "x", "1.5", str(2**63)])
def test_scan_limit_must_be_a_number_of_rows(tmp_path, table, limit):
    """``--limit -1`` reached pyarrow's slice: a C++ length_error aborted the interpreter
    (exit 134) and left the hidden temporary file of decrypted rows beside the output.
    Now argparse refuses it, before anything is read or written."""
    out = tmp_path / "rows.csv"
    done = run_process("table", "scan", table, "--limit", limit, "-o", out, *MEMORY_KMS)
    assert done.returncode not in (0, 134) and -done.returncode not in (6, 11), done.returncode
    assert b"argument --limit" in done.stderr and b"is not a number of rows" in done.stderr, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.parquet", "t"]  # no output, no temporary file
    done = run_process("table", "scan", table, "--limit", "0", "-o", out, *MEMORY_KMS)
    assert done.returncode == 0, done.stderr
    assert pacsv.read_csv(out).num_rows == 0 and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


_KILLED_MID_SCAN = """
import os, signal, sys
import icecrypt.table
from icecrypt.cli import main

real = icecrypt.table.read_task

def read_task(*args, **kwargs):
    for n, batch in enumerate(real(*args, **kwargs)):
        yield batch
        os.kill(os.getpid(), getattr(signal, sys.argv[1]))  # after the first batch is written

icecrypt.table.read_task = read_task
signal.signal(getattr(signal, sys.argv[1]), signal.SIG_DFL)  # as in a terminal (nohup leaves SIGHUP ignored)
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_scan_output_ended_by_a_signal_leaves_no_temporary_file(tmp_path, table, signame):
    """A scan to a file ended by SIGTERM (or SIGHUP) while it writes: the temporary file of
    decrypted rows is removed, the old output stays, the exit status says the signal."""
    import signal

    out = tmp_path / "rows.csv"
    out.write_text("old\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    argv = ["table", "scan", str(table), "-o", str(out), *MEMORY_KMS]
    done = subprocess.run([sys.executable, "-c", _KILLED_MID_SCAN, signame, *argv], capture_output=True,
                          timeout=120, env=env, check=False)  # fmt: skip
    assert done.returncode == 128 + getattr(signal, signame), done.stderr
    assert out.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


# --- issue 30: commands on an existing table never create a catalog ---------------------------------


READ_ONLY = (["scan"], ["snapshots"], ["inspect", "_", "snapshots"], ["verify"], ["refs"], ["properties"],
             ["schema"], ["spec"])


def _command(words: list[str], identifier: str) -> list[str]:
    return [words[0], identifier, *words[2:]] if len(words) > 1 else [words[0], identifier]


@pytest.mark.parametrize("words", READ_ONLY, ids=[w[0] for w in READ_ONLY])
def test_a_read_only_command_never_creates_a_catalog_database(tmp_path, capfd, words):
    """``table scan db.t --catalog uri=sqlite:///missing.db`` created an SQLite database
    with the catalog's tables at the mistyped path (and a warehouse directory and
    database when only warehouse= was given).  Now it says the database does not exist
    and creates nothing."""
    missing = tmp_path / "cat" / "missing.db"
    missing.parent.mkdir()
    status, out, err = run(capfd, "table", *_command(words, "db.t"), "--catalog", f"uri=sqlite:///{missing}",
                           *MEMORY_KMS)
    assert status != 0 and f"the SQLite database {missing} does not exist" in err, err
    assert list(missing.parent.iterdir()) == []
    warehouse = tmp_path / "wh"
    status, out, err = run(capfd, "table", *_command(words, "db.t"), "--catalog", f"warehouse={warehouse}",
                           *MEMORY_KMS)
    assert status != 0 and "does not exist" in err, err
    assert not warehouse.exists()


def test_commands_on_an_existing_catalog_create_no_tables_in_it(tmp_path, capfd):
    """A database that exists but holds no catalog (another application's): a command on
    a table reports that it has no catalog tables and adds none; a real catalog works."""
    import sqlite3

    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE notes (x TEXT)")
    status, out, err = run(capfd, "table", "scan", "db.t", "--catalog", f"uri=sqlite:///{other}", *MEMORY_KMS)
    assert status != 0 and "iceberg_tables" in err, err
    with sqlite3.connect(other) as conn:
        assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")] == ["notes"]
    catalog = ["--catalog", f"uri=sqlite:///{tmp_path / 'cat.db'}", "--catalog", f"warehouse={tmp_path / 'wh'}"]
    assert run(capfd, "table", "create", "db.t", "--schema", "id long", *catalog, *MEMORY_KMS)[0] == 0
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int64())}), source)
    assert run(capfd, "table", "append", "db.t", source, "-q", *catalog, *MEMORY_KMS)[0] == 0
    status, out, err = run(capfd, "table", "scan", "db.t", *catalog, *MEMORY_KMS)
    assert status == 0 and out.split() == ['"id"', "1", "2"], err


# --- item 18: terminal injection ---------------------------------------------------------------------


def hostile_manifest_list(where: Path) -> Path:
    def change(metadata: dict) -> None:
        snapshot = metadata["snapshots"][0]
        snapshot["manifest-list"] = str(where / "metadata" / f"snap-{HOSTILE}.avro")

    return commit_edit(where, change)


def test_error_message_quoting_a_path_is_escaped(capfd, table):
    hostile_manifest_list(table)
    status, out, err = run(capfd, "table", "scan", table, *MEMORY_KMS)
    assert status != 0
    assert_no_controls(out, err)
    assert HOSTILE_SHOWN in err and err.count("\n") == 1  # one line, the path in it escaped


def test_verify_report_is_escaped(capfd, table):
    hostile_manifest_list(table)
    status, out, err = run(capfd, "table", "verify", table, *MEMORY_KMS)
    assert status != 0
    assert_no_controls(out, err)
    assert HOSTILE_SHOWN in out
    status, out, err = run(capfd, "table", "verify", table, "--json", *MEMORY_KMS)
    assert status != 0
    assert_no_controls(out, err)
    assert HOSTILE in json.loads(out)["problems"][0]["path"]  # JSON keeps the value, escaped in the text


def test_subprocess_output_has_no_control_bytes(table):
    """The real entry point, bytes as the terminal would get them."""
    hostile_manifest_list(table)
    for command in ("scan", "verify"):
        done = run_process("table", command, table, *MEMORY_KMS)
        assert done.returncode != 0
        assert_no_controls(done.stdout, done.stderr)
        assert HOSTILE_SHOWN.encode() in done.stdout + done.stderr


def test_a_newline_in_a_path_cannot_forge_a_line(capfd, table):
    def change(metadata: dict) -> None:
        metadata["snapshots"][0]["manifest-list"] = str(table / "metadata" / "x\nicecrypt: all good\r.avro")

    commit_edit(table, change)
    status, _, err = run(capfd, "table", "scan", table, *MEMORY_KMS)
    assert status != 0
    assert err.count("\n") == 1 and "x\\nicecrypt: all good\\r.avro" in err and "\r" not in err


def test_orphan_file_names_are_escaped(tmp_path, capfd, table):
    """Names found by listing the storage: a file planted in the table directory."""
    planted = table / "data" / f"{HOSTILE}.parquet"
    two_lines = table / "data" / "a.parquet\n" / "b.parquet"  # a directory whose name ends a line
    two_lines.parent.mkdir()
    for path in (planted, two_lines):
        path.write_bytes(b"x")
        os.utime(path, (1_000_000_000, 1_000_000_000))
    status, out, err = run(capfd, "table", "remove-orphan-files", table, "--dry-run", "--older-than", "1d", *MEMORY_KMS)
    assert status == 0, err
    assert_no_controls(out, err)
    assert HOSTILE_SHOWN in out and planted.exists()
    lines = out.splitlines()
    assert len(lines) == 2 and any(line.endswith("a.parquet\\n/b.parquet") for line in lines)  # one line per file


def test_key_ids_from_metadata_are_escaped(capfd, table):
    """``keys list`` and ``table snapshots`` print key ids straight from metadata.json."""

    def change(metadata: dict) -> None:
        metadata["encryption-keys"].append(
            {"key-id": f"forged{HOSTILE}", "encrypted-key-metadata": "AAAA", "encrypted-by-id": f"keyA{HOSTILE}"}
        )
        metadata["properties"]["encryption.key-id"] = f"keyA{HOSTILE}"

    forged = commit_edit(table, change)
    status, out, err = run(capfd, "keys", "list", forged)
    assert status == 0, err
    assert_no_controls(out, err)
    assert out.count(HOSTILE_SHOWN) == 3  # the table key, the forged entry's id and its encrypted-by-id


def test_snapshot_table_cells_are_escaped(capfd, table):
    """``table snapshots`` prints each snapshot's key id: the attacker names an entry
    (a copy of the real one) with escape sequences and points the snapshot at it."""

    def change(metadata: dict) -> None:
        snapshot = metadata["snapshots"][0]
        entry = next(k for k in metadata["encryption-keys"] if k["key-id"] == snapshot["key-id"])
        metadata["encryption-keys"].append(dict(entry, **{"key-id": f"k{HOSTILE}"}))
        snapshot["key-id"] = f"k{HOSTILE}"

    commit_edit(table, change)
    status, out, err = run(capfd, "table", "snapshots", table, *MEMORY_KMS)
    assert status == 0, err
    assert_no_controls(out, err)
    assert f"k{HOSTILE_SHOWN}" in out


def test_repair_report_is_escaped(capfd, table):
    """``table repair`` names key ids it takes from older metadata files, which the
    attacker can rename (only the wrapped bytes are authenticated): one line each, escaped."""
    hostile_id = f"k{HOSTILE}\nrestored: all keys"
    old = newest_metadata(table)
    metadata = json.loads(old.read_text())
    snapshot = metadata["snapshots"][0]
    for key in metadata["encryption-keys"]:
        if key["key-id"] == snapshot["key-id"]:
            key["key-id"] = hostile_id
    snapshot["key-id"] = hostile_id
    old.write_text(json.dumps(metadata))

    def drop_keys(metadata: dict) -> None:  # what a writer without encryption support commits
        metadata["encryption-keys"] = [k for k in metadata["encryption-keys"] if "properties" in k]
        del metadata["snapshots"][0]["key-id"]
        metadata["metadata-log"].append({"timestamp-ms": metadata["last-updated-ms"], "metadata-file": str(old)})

    commit_edit(table, drop_keys)
    status, out, err = run(capfd, "table", "repair", table, "--dry-run", *MEMORY_KMS)
    assert status == 0, err
    assert_no_controls(out, err)
    assert f"key-id k{HOSTILE_SHOWN}\\nrestored: all keys restored" in out
    assert not any(line.startswith("restored: all keys") for line in out.splitlines())


def test_inspect_escapes_what_the_file_holds(tmp_path, capfd):
    """``icecrypt inspect`` prints a file's magic and the error quoting its name."""
    path = tmp_path / f"file{HOSTILE}.ags1"
    path.write_bytes(b"\x1b]0;" + bytes(20))
    status, out, err = run(capfd, "inspect", path)
    assert status == 3
    assert_no_controls(out, err)
    assert HOSTILE_SHOWN in err


def _avro_header(schema: dict) -> bytes:
    """An Avro container file with ``schema`` and no blocks."""

    def long(n: int) -> bytes:
        n, out = (n << 1) ^ (n >> 63), bytearray()
        while n > 0x7F:
            out.append((n & 0x7F) | 0x80)
            n >>= 7
        return bytes(out + bytes([n]))

    text = json.dumps(schema).encode()
    return b"Obj\x01" + long(1) + long(11) + b"avro.schema" + long(len(text)) + text + long(0) + bytes(16)


def test_unforeseen_exception_is_escaped(tmp_path, capfd):
    """An exception no handler expects (here fastavro's own, from a manifest list of a
    plaintext table whose schema defines one name twice) still leaves escaped: the
    traceback goes through the same escaping as everything else."""
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": pa.array([1], pa.int64())}), source)
    where = tmp_path / "plain"
    assert run(capfd, "table", "create", where, "--schema", "id long")[0] == 0
    assert run(capfd, "table", "append", where, source, "-q")[0] == 0
    manifest_list = next((where / "metadata").glob("snap-*.avro"))
    name = f"R{HOSTILE}"
    manifest_list.write_bytes(_avro_header(
        {"type": "record", "name": name, "fields": [{"name": "a", "type": {"type": "record", "name": name, "fields": []}}]}
    ))  # fmt: skip
    done = run_process("table", "scan", where)
    assert done.returncode != 0
    assert_no_controls(done.stdout, done.stderr)
    assert HOSTILE_SHOWN.encode() in done.stderr


def test_csv_rows_on_a_terminal_are_escaped(tmp_path, capfd):
    """Row values of a plaintext table are storage too: on a terminal (a pty here) they
    come out escaped; into a pipe or file, byte for byte."""
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": pa.array([1], pa.int64()), "note": [f"hi{HOSTILE}"]}), source)
    where = tmp_path / "plain"
    assert run(capfd, "table", "create", where, "--schema", "id long, note string")[0] == 0
    assert run(capfd, "table", "append", where, source, "-q")[0] == 0

    piped = run_process("table", "scan", where)
    assert piped.returncode == 0 and f"hi{HOSTILE}".encode() in piped.stdout  # data, unchanged

    leader, follower = pty.openpty()
    try:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        process = subprocess.Popen([sys.executable, "-m", "icecrypt", "table", "scan", str(where)], stdout=follower,
                                   stderr=subprocess.PIPE, env=env)  # fmt: skip
        os.close(follower)
        follower = -1
        shown = b""
        while True:
            ready, _, _ = select.select([leader], [], [], 60)
            if not ready:
                break
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            shown += chunk
        assert process.wait(timeout=60) == 0, process.stderr.read()
        process.stderr.close()
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)
    assert_no_controls(shown)
    assert b"hi" + HOSTILE_SHOWN.encode() in shown


# --- the operator's own pin: --require-encryption ---------------------------------------------------


def test_require_encryption_refuses_a_downgraded_table(tmp_path, capfd, table):
    """A version committed by the attacker without ``encryption.key-id`` (and without the
    snapshots it cannot forge): with ``--require-encryption`` every table command refuses it
    and writes nothing; an append without the flag would add plaintext files."""

    def downgrade(metadata: dict) -> None:
        del metadata["properties"]["encryption.key-id"]
        metadata.pop("encryption-keys", None)
        metadata.update({"snapshots": [], "snapshot-log": [], "refs": {}, "current-snapshot-id": -1})

    forged = commit_edit(table, downgrade)
    source = tmp_path / "more.parquet"
    pq.write_table(pa.table({"id": pa.array([7], pa.int64()), "cat": ["secret"]}), source)
    before = sorted(p for p in table.rglob("*"))
    for argv in (["append", table, source], ["scan", table], ["verify", table], ["snapshots", table],
                 ["rewrite-data-files", table], ["remove-orphan-files", table, "--dry-run"]):
        status, out, err = run(capfd, "table", *argv, "--require-encryption", *MEMORY_KMS)
        assert status == 3, (argv, err)
        assert "encryption.key-id" in err and str(forged) in err
    assert sorted(p for p in table.rglob("*")) == before

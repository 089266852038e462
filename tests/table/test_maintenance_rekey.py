"""Re-keying after a compromise, and damage drills: a rewrite killed mid-way leaves the
table readable at its old version and only orphans, which remove_orphan_files removes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from tablelib import TABLE_NAMES
from test_maintenance import assert_clean, data_files, small_table
from test_write_roundtrip import digest

from icecrypt.table import EncryptedTable
from icecrypt.table.maintenance.actions import fingerprint, key_usage


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def test_rekey_a_leaked_data_key(tmp_path, kms):
    table = small_table(tmp_path, kms, appends=3)
    table.delete("id in (1, 2, 3)")
    rows = digest(table.scan().to_arrow())
    leaked = data_files(table)[0]
    result = table.rekey(files=[leaked.path], expire=True)
    assert fingerprint(leaked.key_metadata) in result.retired_fingerprints
    assert result.rewrite.rewritten_data_files == 1
    assert leaked.path not in {f.path for f in data_files(table)}
    assert not os.path.exists(table.fs_path(leaked.path))  # expiry deleted it
    assert result.check(table) == []
    assert digest(table.scan().to_arrow()) == rows
    assert len(table.snapshots()) == 1 and table.metadata["metadata-log"] == []
    assert_clean(table)


def test_rekey_without_expire_reports_the_old_snapshots(tmp_path, kms):
    table = small_table(tmp_path, kms, appends=2)
    snap = table.current_snapshot()
    result = table.rekey(snapshot_ids=[snap.snapshot_id])
    problems = result.check(table)
    assert problems and all("retired" in p for p in problems)  # old snapshots still reach old keys
    table.expire_snapshots(_now_ms() + 1)
    # the old metadata files in the log still hold the leaked KEK's entries? (KEK not leaked here)
    assert [p for p in result.check(table) if "uses a retired key" in p] == []


@pytest.mark.parametrize("name", TABLE_NAMES)
def test_rekey_everything_on_java_tables(golden_copy, name, kms):
    table, root = golden_copy(name)
    rows = digest(table.scan().to_arrow())
    old = key_usage(table)
    old_keks = set(old.keks)
    result = table.rekey(everything=True, expire=True, new_master_key_id="keyB")
    assert set(old.files.values()) <= result.retired_fingerprints
    assert old_keks <= result.retired_kek_ids
    assert result.check(table) == []
    new = key_usage(table)
    assert not set(new.files.values()) & set(old.files.values())
    assert not new.keks & old_keks
    assert table.metadata["properties"]["encryption.key-id"] == "keyB"
    assert digest(table.scan().to_arrow()) == rows
    assert_clean(table)
    # no file of the old key set is left on disk
    for path in old.files:
        assert not os.path.exists(table.fs_path(path)), path
    reloaded = EncryptedTable.load(table.metadata_location, kms=kms, location_map=table.location_map)
    assert digest(reloaded.scan().to_arrow()) == rows


def test_rekey_a_leaked_kek(tmp_path, kms):
    table = small_table(tmp_path, kms, appends=2)
    rows = digest(table.scan().to_arrow())
    kek = key_usage(table).snapshot_keks[table.current_snapshot_id]
    result = table.rekey(kek_ids=[kek], expire=True)
    assert result.check(table) == []
    assert kek not in {k["key-id"] for k in table.metadata["encryption-keys"]}
    assert digest(table.scan().to_arrow()) == rows
    assert_clean(table)


# --- damage drills -----------------------------------------------------------------------------------

_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from icecrypt.kms.memory import MemoryKms
    from icecrypt.table import EncryptedTable

    path, action, stop_at = sys.argv[1:4]
    table = EncryptedTable.load(path, kms=MemoryKms.with_iceberg_test_keys())
    seen = []

    def progress(event, detail):
        seen.append(event)
        if event == stop_at:
            os.kill(os.getpid(), signal.SIGKILL)

    if action == "rewrite":
        table.rewrite_data_files(options={"rewrite-all": "true"}, progress=progress)
    else:
        table.rekey(everything=True, expire=True, progress=progress)
    print("finished", seen)
    """
)


def _files(root) -> set[str]:
    return {str(p) for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    "action,stop_at",
    [("rewrite", "group-written"), ("rewrite", "commit"), ("rekey", "group-written"), ("rekey", "rewrite-manifests")],
)
def test_killed_maintenance_leaves_the_table_readable_and_only_orphans(tmp_path, kms, action, stop_at):
    table = small_table(tmp_path, kms, appends=4)
    root = tmp_path / "t"
    rows = digest(table.scan().to_arrow())
    before_snapshot = table.current_snapshot_id
    before_files = _files(root)
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(root), action, stop_at], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    table = EncryptedTable.load(str(root), kms=kms)
    if action == "rewrite" or stop_at == "group-written":
        assert table.current_snapshot_id == before_snapshot  # nothing committed
    assert digest(table.scan().to_arrow()) == rows
    assert_clean(table)
    leftovers = _files(root) - before_files
    assert leftovers  # the killed writer left files behind
    orphans = table.remove_orphan_files(older_than=_now_ms() + 1000, dry_run=True).orphan_files
    assert set(orphans) <= leftovers  # only new files, never one that was there
    if stop_at != "rewrite-manifests":  # (there the re-key's rewrite had committed: its files are the table's)
        assert orphans
    table.remove_orphan_files(older_than=_now_ms() + 1000)
    assert table.remove_orphan_files(older_than=_now_ms() + 1000, dry_run=True).orphan_files == []
    assert digest(table.scan().to_arrow()) == rows
    assert_clean(table)


@pytest.mark.slow
def test_killed_writer_temporaries_are_orphans(tmp_path, kms):
    """A writer killed while a data file is being written leaves its hidden temporary."""
    table = small_table(tmp_path, kms, appends=4)
    root = tmp_path / "t"
    rows = digest(table.scan().to_arrow())
    child = textwrap.dedent(
        """
        import sys
        import pyarrow as pa
        sys.path[:0] = sys.argv[2:]
        from test_write_roundtrip import make_rows
        from icecrypt.kms.memory import MemoryKms
        from icecrypt.table import EncryptedTable
        table = EncryptedTable.load(sys.argv[1], kms=MemoryKms.with_iceberg_test_keys())
        big = make_rows(0, 400_000)
        def batches():
            while True:
                yield from big.to_batches(max_chunksize=50_000)
        table.append(batches())
        """
    )
    here = os.path.dirname(__file__)
    proc = subprocess.Popen([sys.executable, "-c", child, str(root), here, os.path.join(here, "..")])
    try:
        deadline = time.monotonic() + 120
        temp = []
        while not temp and time.monotonic() < deadline and proc.poll() is None:
            temp = [p for p in root.rglob(".*.tmp")]
            time.sleep(0.01)
        assert temp, "no temporary file appeared"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    table.refresh()
    assert digest(table.scan().to_arrow()) == rows
    orphans = table.remove_orphan_files(older_than=_now_ms() + 1000, dry_run=True).orphan_files
    assert any(os.path.basename(p).startswith(".") and p.endswith(".tmp") for p in orphans)
    table.remove_orphan_files(older_than=_now_ms() + 1000)
    assert not list(root.rglob(".*.tmp"))
    assert_clean(table)

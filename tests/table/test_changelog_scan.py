"""Changelog scans: ``changelog_scan(from_snapshot_id=, to_snapshot_id=)`` returns the rows
each snapshot of the range inserted and deleted, whole data files at a time (Iceberg Java's
IncrementalChangelogScan), with ``_change_type``, ``_change_ordinal`` and
``_commit_snapshot_id``; ``replace`` snapshots are skipped, snapshots with row-level delete
files refused as Java refuses them."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest
from tablelib import expected, table_digest

from icecrypt.table import ChangelogScan, EncryptedTable, read_changelog_task

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("s", pa.string())])


def rows(ids) -> pa.Table:
    ids = list(ids)
    return pa.table({"id": pa.array(ids, pa.int64()), "s": [f"row-{i}" for i in ids]}, schema=SCHEMA)


def changes(table: pa.Table) -> list[tuple]:
    """(ordinal, type, snapshot, id) of every changelog row, sorted."""
    return sorted(zip(table.column("_change_ordinal").to_pylist(), table.column("_change_type").to_pylist(),
                      table.column("_commit_snapshot_id").to_pylist(), table.column("id").to_pylist()))


@pytest.fixture
def table(tmp_path, kms) -> EncryptedTable:
    return EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA")


def test_append_overwrite_and_whole_file_delete(table):
    a = table.append(rows(range(0, 3)))
    b = table.append(rows(range(3, 5)))
    c = table.overwrite(rows([7, 8]))  # every file rewritten: DELETE of the old, INSERT of the new
    table.append(rows([9]))
    e = table.delete("id = 9")  # removes the appended file whole
    scan = table.changelog_scan(from_snapshot_id=a)
    assert isinstance(scan, ChangelogScan)
    got = scan.to_arrow()
    assert got.column_names == ["id", "s", "_change_type", "_change_ordinal", "_commit_snapshot_id"]
    d = table.snapshot(e).parent_snapshot_id
    assert changes(got) == sorted([
        (0, "INSERT", b, 3), (0, "INSERT", b, 4),
        *((1, "DELETE", c, i) for i in range(5)), (1, "INSERT", c, 7), (1, "INSERT", c, 8),
        (2, "INSERT", d, 9),
        (3, "DELETE", e, 9),
    ])
    assert got.schema.field("_change_type").type == pa.string()
    assert got.schema.field("_change_ordinal").type == pa.int32()
    assert got.schema.field("_commit_snapshot_id").type == pa.int64()
    # DELETE rows of a snapshot come before its INSERT rows, snapshots in order
    assert got.column("_change_ordinal").to_pylist() == sorted(got.column("_change_ordinal").to_pylist())
    # from the beginning (inclusive), a sub-range, projection and filter
    assert len(table.changelog_scan().to_arrow()) == len(got) + 3
    assert changes(table.changelog_scan(from_snapshot_id=b, to_snapshot_id=c).to_arrow()) == sorted(
        [*((0, "DELETE", c, i) for i in range(5)), (0, "INSERT", c, 7), (0, "INSERT", c, 8)])
    some = table.changelog_scan(["id"], "id >= 4", from_snapshot_id=a, to_snapshot_id=c).to_arrow()
    assert some.column_names == ["id", "_change_type", "_change_ordinal", "_commit_snapshot_id"]
    assert changes(some) == [(0, "INSERT", b, 4), (1, "DELETE", c, 4), (1, "INSERT", c, 7), (1, "INSERT", c, 8)]
    assert table.changelog_scan(from_snapshot_id=e).to_arrow().num_rows == 0


def test_tasks_are_picklable_and_read_alone(table):
    a = table.append(rows(range(3)))
    table.overwrite(rows([5]))
    scan = table.changelog_scan(from_snapshot_id=a)
    tasks = pickle.loads(pickle.dumps(scan.plan_changes()))
    assert [(t.change_type, t.change_ordinal) for t in tasks] == [("DELETE", 0), ("INSERT", 0)]
    assert "key" not in repr(tasks[0]).lower()
    batches = [b for t in tasks for b in read_changelog_task(t, table.filesystem)]
    assert changes(pa.Table.from_batches(batches)) == changes(scan.to_arrow())


def test_replace_snapshots_are_skipped(table):
    a = table.append(rows(range(3)))
    table.append(rows(range(3, 6)))
    result = table.rewrite_data_files(options={"min-input-files": "1", "rewrite-all": "true"})
    assert table.current_snapshot().operation == "replace", result
    got = table.changelog_scan(from_snapshot_id=a).to_arrow()
    assert sorted(got.column("id").to_pylist()) == [3, 4, 5]
    assert set(got.column("_change_type").to_pylist()) == {"INSERT"}
    assert set(got.column("_change_ordinal").to_pylist()) == {0}


def test_row_level_deletes_are_refused(table):
    """A deletion vector is a row-level delete: Java's changelog scan refuses the snapshot."""
    a = table.append(rows(range(5)))
    b = table.delete("id = 2")  # part of a file: a deletion vector
    with pytest.raises(NotImplementedError, match=rf"snapshot {b} \(delete\) has delete files"):
        table.changelog_scan(from_snapshot_id=a).to_arrow()
    assert table.changelog_scan(to_snapshot_id=a).to_arrow().num_rows == 5


def test_errors(table):
    a = table.append(rows(range(2)))
    b = table.append(rows(range(2, 4)))
    with pytest.raises(ValueError, match=rf"snapshot {b} \(start, exclusive\) is not an ancestor of snapshot {a}"):
        table.changelog_scan(from_snapshot_id=b, to_snapshot_id=a)
    with pytest.raises(KeyError, match="has no snapshot 42"):
        table.changelog_scan(to_snapshot_id=42)


def test_java_tables(golden):
    table = golden("enc_parquet_dek16")
    states = expected("enc_parquet_dek16")["snapshots"]
    (_, n1), (s2, n2) = [(s["snapshot_id"], s["expected_row_count"]) for s in states]
    got = table.changelog_scan().to_arrow()
    assert got.num_rows == n2
    assert got.filter(pa.compute.equal(got["_commit_snapshot_id"], s2)).num_rows == n2 - n1
    assert set(got.column("_change_type").to_pylist()) == {"INSERT"}
    assert table_digest(got.drop_columns(["_change_type", "_change_ordinal", "_commit_snapshot_id"])) == \
        expected("enc_parquet_dek16")["expected"]["digest_sha256"]
    # Java's deletes table: its delete snapshots carry a DV and an equality delete file
    deletes = golden("enc_deletes_dek16")
    first = expected("enc_deletes_dek16")["snapshots"][0]
    assert deletes.changelog_scan(to_snapshot_id=first["snapshot_id"]).count() == first["expected_row_count"]
    with pytest.raises(NotImplementedError, match="has delete files"):
        deletes.changelog_scan(from_snapshot_id=first["snapshot_id"]).to_arrow()


def test_timestamp_range_as_java_spark(table):
    """start/end timestamps (Spark's changelog options) map to snapshot ids as Java's Spark
    does: the start excludes a snapshot committed exactly at it, takes in one after it."""
    import time

    from icecrypt.table.read.incremental import timestamp_range

    snaps = []
    for i in range(3):  # distinct milliseconds, so each moment names one snapshot
        while snaps and int(time.time() * 1000) <= table.snapshot(snaps[-1]).timestamp_ms:
            time.sleep(0.001)
        snaps.append(table.append(rows([i])))
    a, b, c = snaps
    ts = {s: table.snapshot(s).timestamp_ms for s in snaps}
    assert timestamp_range(table, ts[b]) == (b, None, False)
    assert timestamp_range(table, ts[b] - 1) == (a, None, False)
    assert timestamp_range(table, ts[a] - 1) == (None, None, False)  # from the first snapshot
    assert timestamp_range(table, None, ts[b]) == (None, b, False)
    assert timestamp_range(table, ts[a], ts[c] - 1) == (a, b, False)
    assert timestamp_range(table, ts[c] + 1) == (None, None, True)   # nothing after it
    assert timestamp_range(table, None, ts[a] - 1) == (None, None, True)  # nothing before it
    assert timestamp_range(table, ts[b], ts[b]) == (None, None, True)

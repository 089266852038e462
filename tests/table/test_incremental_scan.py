"""Incremental append scans: ``scan(from_snapshot_id=, to_snapshot_id=)`` returns the rows
the ``append`` snapshots between them added (Iceberg Java's IncrementalAppendScan: from
exclusive, to inclusive, one line of descent, other operations skipped, deletes not
applied), on icecrypt tables and Java-written ones; every file read is authenticated."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from tablelib import edit_metadata, expected, flip_byte, table_digest

from icecrypt.errors import DecryptionError, FormatError
from icecrypt.table import EncryptedTable, IncrementalAppendScan

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("s", pa.string())])


def rows(ids) -> pa.Table:
    ids = list(ids)
    return pa.table({"id": pa.array(ids, pa.int64()), "s": [f"row-{i}" for i in ids]}, schema=SCHEMA)


def ids(table: pa.Table) -> list[int]:
    return sorted(table.column("id").to_pylist())


@pytest.fixture
def abc(tmp_path, kms):
    """An encrypted table with appends A, B, C; (table, [a, b, c])."""
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA")
    snaps = [table.append(rows(range(0, 10))), table.append(rows(range(10, 25))), table.append(rows(range(25, 27)))]
    return table, snaps


def test_appends_between_two_snapshots(abc):
    table, (a, b, c) = abc
    scan = table.scan(from_snapshot_id=a, to_snapshot_id=c)
    assert isinstance(scan, IncrementalAppendScan)
    assert [s.snapshot_id for s in scan.range] == [b, c]
    assert ids(scan.to_arrow()) == list(range(10, 27))
    assert scan.count() == 17
    # to defaults to the current snapshot; from exclusive, to inclusive
    assert ids(table.scan(from_snapshot_id=a).to_arrow()) == list(range(10, 27))
    assert ids(table.scan(from_snapshot_id=a, to_snapshot_id=b).to_arrow()) == list(range(10, 25))
    assert ids(table.scan(from_snapshot_id=b, from_inclusive=True, to_snapshot_id=b).to_arrow()) == list(range(10, 25))
    # no from: everything since the first snapshot (inclusive)
    assert ids(table.scan(to_snapshot_id=b).to_arrow()) == list(range(0, 25))
    # an empty range
    assert table.scan(from_snapshot_id=c).to_arrow().num_rows == 0
    # filter and projection as in any scan
    got = table.scan(["s"], "id >= 20", from_snapshot_id=a).to_arrow()
    assert got.column_names == ["s"] and sorted(got.column("s").to_pylist()) == [f"row-{i}" for i in range(20, 27)]
    # batches stream the same rows as to_arrow
    assert ids(pa.Table.from_batches(list(table.scan(from_snapshot_id=a).to_batches()))) == list(range(10, 27))


def test_overwrite_and_delete_snapshots_are_skipped(abc):
    """As Java's: only append snapshots contribute, and no delete is applied to their rows."""
    table, (a, b, c) = abc
    d = table.delete("id >= 10 and id < 25")  # drops B's file whole: a delete snapshot
    e = table.delete("id = 26")  # a deletion vector on C's file
    assert table.snapshot(d).operation == table.snapshot(e).operation == "delete"
    f = table.append(rows(range(100, 103)))
    assert ids(table.scan(from_snapshot_id=c).to_arrow()) == [100, 101, 102]
    # B's and C's rows as appended, though deleted since
    assert ids(table.scan(from_snapshot_id=a).to_arrow()) == [*range(10, 27), 100, 101, 102]
    g = table.overwrite(rows(range(500, 505)))
    assert table.snapshot(g).operation == "overwrite"
    assert table.scan(from_snapshot_id=f).to_arrow().num_rows == 0
    h = table.append(rows([900]))
    assert ids(table.scan(from_snapshot_id=f).to_arrow()) == [900]
    assert ids(table.scan(from_snapshot_id=f, to_snapshot_id=h).to_arrow()) == [900]


def test_from_must_be_an_ancestor_of_to(abc):
    table, (a, b, c) = abc
    with pytest.raises(ValueError, match=rf"snapshot {c} \(start, exclusive\) is not an ancestor of snapshot {a}"):
        table.scan(from_snapshot_id=c, to_snapshot_id=a)
    with pytest.raises(ValueError, match=rf"snapshot {c} \(start, inclusive\) is not an ancestor of snapshot {b}"):
        table.scan(from_snapshot_id=c, from_inclusive=True, to_snapshot_id=b)
    # a snapshot on another line: roll back to A, append D; B is not an ancestor of D
    with table.manage_snapshots() as ms:
        ms.rollback_to_snapshot(a)
    d = table.append(rows([50]))
    with pytest.raises(ValueError, match=rf"snapshot {b} \(start, exclusive\) is not an ancestor of snapshot {d}"):
        table.scan(from_snapshot_id=b)
    assert ids(table.scan(from_snapshot_id=a).to_arrow()) == [50]
    # unknown ids
    with pytest.raises(ValueError, match="snapshot 12345 .* is not an ancestor"):
        table.scan(from_snapshot_id=12345)
    with pytest.raises(KeyError, match="has no snapshot 12345"):
        table.scan(from_snapshot_id=12345, from_inclusive=True)
    with pytest.raises(KeyError, match="has no snapshot 12345"):
        table.scan(from_snapshot_id=a, to_snapshot_id=12345)
    with pytest.raises(ValueError, match="takes no snapshot_id"):
        table.scan(snapshot_id=a, from_snapshot_id=a)
    with pytest.raises(TypeError, match="from_snapshot_id must be a snapshot id"):
        table.scan(from_snapshot_id=str(a))


def test_expired_start_is_accepted_as_a_parent(abc):
    """From exclusive may be a snapshot since expired, when it is the parent of an ancestor
    of ``to`` (as Java allows)."""
    table, (a, b, c) = abc

    def drop_a(metadata):
        metadata["snapshots"] = [s for s in metadata["snapshots"] if s["snapshot-id"] != a]
        metadata["snapshot-log"] = [e for e in metadata["snapshot-log"] if e["snapshot-id"] != a]

    edit_metadata(Path(table.metadata_location), drop_a)
    table = EncryptedTable.load(table.metadata_location, kms=table.kms)
    assert ids(table.scan(from_snapshot_id=a).to_arrow()) == list(range(10, 27))
    assert ids(table.scan().to_arrow()) == list(range(0, 27))


def test_parent_loop_is_damage(abc):
    table, (a, b, c) = abc

    def loop(metadata):
        for s in metadata["snapshots"]:
            if s["snapshot-id"] == a:
                s["parent-snapshot-id"] = c

    edit_metadata(Path(table.metadata_location), loop)
    table = EncryptedTable.load(table.metadata_location, kms=table.kms)
    with pytest.raises(FormatError, match=f"parent-snapshot-id chain of snapshot {c} loops"):
        table.scan(from_snapshot_id=12345)


def test_tampered_data_file_is_refused(abc):
    """An appended file is read through the key chain like any other: a flipped byte is an
    authentication failure naming the file, never rows."""
    table, (a, b, c) = abc
    task = table.scan(from_snapshot_id=b).plan_files()[0]
    flip_byte(Path(table.fs_path(task.file.path)), 100)
    with pytest.raises(DecryptionError, match=Path(task.file.path).name):
        table.scan(from_snapshot_id=b).to_arrow()


def test_empty_table(tmp_path, kms):
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA")
    assert table.scan(to_snapshot_id=None, from_inclusive=True).to_arrow().num_rows == 0
    with pytest.raises(ValueError, match="has no current snapshot"):
        table.scan(from_snapshot_id=1)


@pytest.mark.parametrize("name", ["enc_parquet_dek16", "enc_avro_dek16"])
def test_java_tables_of_appends(golden, name):
    table = golden(name)
    states = [(s["snapshot_id"], s["expected_row_count"]) for s in expected(name)["snapshots"]]
    (first, n1), (second, n2) = states
    assert table.scan(from_snapshot_id=first).count() == n2 - n1
    assert table.scan(to_snapshot_id=first).count() == n1
    whole = table.scan(from_snapshot_id=first, from_inclusive=True).to_arrow()
    assert table_digest(whole) == expected(name)["snapshots"][1]["expected_digest_sha256"]
    # the increment is the current rows minus the first snapshot's
    assert table_digest(pa.concat_tables([table.scan(snapshot_id=first).to_arrow(),
                                          table.scan(from_snapshot_id=first).to_arrow()])) == table_digest(whole)


def test_java_table_with_deletes(golden):
    """enc_deletes_dek16: append, delete (DV), delete (equality), append.  The deletes are
    skipped and not applied: the two appends' rows as written."""
    table = golden("enc_deletes_dek16")
    snaps = [(s["snapshot_id"], s["expected_row_count"]) for s in expected("enc_deletes_dek16")["snapshots"]]
    (s1, n1), _, (s3, n3), (s4, n4) = snaps
    assert table.scan(from_snapshot_id=s1).count() == n4 - n3
    assert table.scan(from_snapshot_id=s3).count() == n4 - n3
    assert table.scan(to_snapshot_id=s1).count() == n1
    assert table.scan(from_snapshot_id=s1, from_inclusive=True).count() == n1 + n4 - n3

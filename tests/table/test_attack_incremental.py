"""Incremental and changelog reads against someone who can write the table's storage:
the range is defined by ``metadata.json`` (parent links, operations), which is input; the
files it reaches are authenticated like any other read."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from tablelib import edit_metadata, flip_byte

from icecrypt.errors import DecryptionError, SnapshotIntegrityError
from icecrypt.table import EncryptedTable, PlaintextFileError
from icecrypt.table.read.incremental import check_snapshot_operation

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False)])


def rows(ids) -> pa.Table:
    return pa.table({"id": pa.array(list(ids), pa.int64())}, schema=SCHEMA)


@pytest.fixture
def history(tmp_path, kms):
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA")
    snaps = [table.append(rows(range(3))), table.overwrite(rows([7])), table.append(rows([8]))]
    return table, snaps


def _edit(table: EncryptedTable, change, **load) -> EncryptedTable:
    edit_metadata(Path(table.metadata_location), change)
    return EncryptedTable.load(table.metadata_location, kms=table.kms, **load)


def test_tampered_deleted_file_in_a_changelog(history):
    """The changelog reads the files a snapshot removed: a flipped byte in one is an
    authentication failure naming it, never DELETE rows made up by the attacker."""
    table, (a, b, c) = history
    deleted = next(ch for ch in table.changelog_scan(from_snapshot_id=a).plan_changes() if ch.change_type == "DELETE")
    flip_byte(Path(table.fs_path(deleted.task.file.path)), 200)
    with pytest.raises(DecryptionError, match=Path(deleted.task.file.path).name):
        table.changelog_scan(from_snapshot_id=a).to_arrow()
    # the incremental read never touches it (the overwrite is skipped)
    assert table.scan(from_snapshot_id=a).to_arrow()["id"].to_pylist() == [8]


def test_snapshot_in_range_without_key_id(history):
    """A snapshot of the range stripped of its key-id would have an unencrypted manifest
    list: refused, as in any read."""
    table, (a, b, c) = history

    def strip(metadata):
        for s in metadata["snapshots"]:
            if s["snapshot-id"] == c:
                del s["key-id"]

    table = _edit(table, strip, check_keys=False)  # (loading checks it too: KeysLostError)
    with pytest.raises(PlaintextFileError, match=f"snapshot {c} of an encrypted table has no key-id"):
        table.scan(from_snapshot_id=a).to_arrow()
    with pytest.raises(PlaintextFileError, match=f"snapshot {c} of an encrypted table has no key-id"):
        table.changelog_scan(from_snapshot_id=a).to_arrow()


def test_reparented_history(history):
    """Parent links re-pointed to hide a snapshot from the range: ``from`` is then no
    longer an ancestor, and the read says so instead of returning another range."""
    table, (a, b, c) = history

    def reparent(metadata):
        for s in metadata["snapshots"]:
            if s["snapshot-id"] == c:
                s["parent-snapshot-id"] = 999
    table = _edit(table, reparent)
    with pytest.raises(ValueError, match=rf"snapshot {a} \(start, exclusive\) is not an ancestor of snapshot {c}"):
        table.scan(from_snapshot_id=a)
    with pytest.raises(ValueError, match=rf"snapshot {b} \(start, exclusive\) is not an ancestor"):
        table.changelog_scan(from_snapshot_id=b)


def test_operation_relabelled_as_append(history):
    """``operation`` is metadata input: the overwrite relabelled as an append (whose added
    rows an incremental read would return as appended) disagrees with its manifests,
    which show a data file removed: refused, naming the snapshot and what it did."""
    table, (a, b, c) = history
    table = _edit(table, lambda m: _relabel(m, b, "append"))
    for scan in (lambda: table.scan(from_snapshot_id=a).to_arrow(), lambda: table.changelog_scan(from_snapshot_id=a).to_arrow()):
        with pytest.raises(SnapshotIntegrityError, match=rf"snapshot {b} is labelled operation 'append', but its "
                           r"manifests show data files \+1/-1 \(rows \+1/-3\).*an append only adds data files") as caught:
            scan()
        assert caught.value.snapshot_id == b and caught.value.table == table.location


def _relabel(metadata, snapshot_id, operation):
    for s in metadata["snapshots"]:
        if s["snapshot-id"] == snapshot_id:
            if operation is None:
                del s["summary"]["operation"]
            else:
                s["summary"]["operation"] = operation


@pytest.mark.parametrize("encrypted", [True, False], ids=["encrypted", "plaintext"])
@pytest.mark.parametrize("label", ["replace", "delete"])
def test_a_relabelled_append_never_hides_its_rows(tmp_path, kms, encrypted, label):
    """An append relabelled ``replace`` (or ``delete``) in ``metadata.json`` was skipped
    by the incremental read and the changelog: its rows silently gone.  Its manifests
    show data rows added and none removed, which no rewrite and no delete does: the reads
    refuse it, naming the snapshot and the label.  (A label Iceberg does not write is
    refused when the version loads.)"""
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms if encrypted else None,
                                  table_key_id="keyA" if encrypted else None)
    a, b, c = (table.append(rows(range(n * 3, n * 3 + 3))) for n in range(3))
    table = _edit(table, lambda m: _relabel(m, b, label))
    why = {"replace": "a replace \\(rewrite\\) adds no data rows", "delete": "a delete adds no data files"}[label]
    for scan in (lambda: table.scan(from_snapshot_id=a).to_arrow(),
                 lambda: table.scan(from_snapshot_id=a, to_snapshot_id=c).plan_files(),
                 lambda: table.scan(to_snapshot_id=c).to_arrow(),
                 lambda: table.changelog_scan(from_snapshot_id=a).to_arrow()):
        with pytest.raises(SnapshotIntegrityError, match=rf"snapshot {b} is labelled operation {label!r}, but its "
                           rf"manifests show data files \+1/-0 \(rows \+3/-0\).*{why}"):
            scan()
    # reads that do not act on labels are unaffected
    assert sorted(table.scan().to_arrow()["id"].to_pylist()) == list(range(9))


def test_a_relabelled_delete_is_not_passed_over_as_a_rewrite(tmp_path, kms):
    """A snapshot that added a deletion vector relabelled ``replace``: the changelog,
    which refuses row-level deletes, would pass over it (its DELETE rows silently gone).
    Its manifests show delete rows added and none removed: refused."""
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA",
                                  properties={"format-version": "3"})
    a = table.append(rows(range(10)))
    b = table.delete("id < 4")
    assert table.snapshot(b).operation == "delete"
    with pytest.raises(NotImplementedError, match="row-level deletes"):
        table.changelog_scan(from_snapshot_id=a).to_arrow()
    table = _edit(table, lambda m: _relabel(m, b, "replace"))
    with pytest.raises(SnapshotIntegrityError, match=rf"snapshot {b} .*'replace'.*delete files \+1/-0 \(rows \+4/-0\)"
                       r".*a replace \(rewrite\) deletes no row"):
        table.changelog_scan(from_snapshot_id=a).to_arrow()


def _every_label_checks(table: EncryptedTable) -> list[str]:
    for snapshot in table.snapshots():
        check_snapshot_operation(table, snapshot)
    return [s.operation for s in table.snapshots()]


@pytest.mark.parametrize("mode", ["copy-on-write", "merge-on-read"])
def test_what_icecrypt_writes_passes_the_label_check(tmp_path, kms, mode):
    """Every operation icecrypt commits carries the label its manifests show (appends,
    deletes, updates, merges, overwrites, compaction applying deletes, rewritten
    manifests, rekeyed files), and the incremental read and changelog return what
    they returned before the check: the appends' rows, the compaction passed over."""
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.string())])
    modes = {f"write.{op}.mode": mode for op in ("delete", "update", "merge")}
    table = EncryptedTable.create(str(tmp_path / "t"), schema, kms=kms, table_key_id="keyA",
                                  properties={"format-version": "3", **modes})

    def batch(ids):
        return pa.table({"id": pa.array(list(ids), pa.int64()), "v": [f"v{i}" for i in ids]}, schema=schema)

    first = table.append(batch(range(10)))
    table.append(batch(range(10, 20)))
    table.delete("id < 3")
    table.update({"v": "changed"}, "id = 12")
    table.merge(batch([15, 30]), ["id"], when_matched_update="all", when_not_matched_insert="all")
    table.rewrite_data_files(options={"min-input-files": "1", "rewrite-all": "true"})
    table.rewrite_manifests(force=True)
    last = table.append(batch([40]))
    table.rekey(files=[t.file.path for t in table.scan().plan_files()][:1])
    table.overwrite(batch([50, 51]), "id >= 40")
    labels = _every_label_checks(table)
    assert {"append", "replace", "overwrite"} <= set(labels) and labels.count("replace") >= 2
    assert ("delete" in labels) is (mode == "merge-on-read")
    appended = sorted(table.scan(from_snapshot_id=first, to_snapshot_id=last).to_arrow()["id"].to_pylist())
    assert set(range(10, 20)) | {40} <= set(appended) <= set(range(10, 20)) | {30, 40}
    assert sorted(table.scan().to_arrow()["id"].to_pylist()) == [*range(3, 20), 30, 50, 51]


def test_a_conversion_starts_the_history_and_compaction_passes(tmp_path, kms):
    """encrypt_table's converted snapshot is a ``replace`` that adds the table's rows, with
    no parent in the table (where the known history starts): accepted, and passed over
    by the incremental read as Java's would; a later compaction and append read as
    before; the changelog over a compaction shows only the appended rows."""
    from icecrypt.table.maintenance.encrypt import encrypt_table

    plain = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=None, table_key_id=None)
    plain.append(rows(range(5)))
    plain.append(rows(range(5, 8)))
    table = encrypt_table(plain, kms=kms, table_key_id="keyA").table
    converted = table.current_snapshot_id
    assert table.snapshot(converted).operation == "replace"
    assert table.scan(to_snapshot_id=converted).to_arrow().num_rows == 0
    assert table.changelog_scan(to_snapshot_id=converted).to_arrow().num_rows == 0
    table.append(rows(range(8, 10)))
    table.rewrite_data_files(options={"min-input-files": "1", "rewrite-all": "true"})
    table.append(rows([10]))
    assert sorted(table.scan(from_snapshot_id=converted).to_arrow()["id"].to_pylist()) == [8, 9, 10]
    changes = table.changelog_scan(from_snapshot_id=converted).to_arrow()
    assert sorted(changes["id"].to_pylist()) == [8, 9, 10] and set(changes["_change_type"].to_pylist()) == {"INSERT"}
    assert _every_label_checks(table)[0] == "replace"
    # the same shape anywhere but at the start of the history is an append relabelled
    second = table.snapshots()[1].snapshot_id
    table = _edit(table, lambda m: _relabel(m, second, "replace"))
    with pytest.raises(SnapshotIntegrityError, match=rf"snapshot {second} is labelled operation 'replace'"):
        table.scan(from_snapshot_id=converted).to_arrow()


@pytest.mark.parametrize("name", ["enc_parquet_dek16", "enc_avro_dek16", "enc_deletes_dek16"])
def test_the_java_tables_pass_the_label_check(golden, name):
    table = golden(name)
    assert set(_every_label_checks(table)) <= {"append", "delete"}

"""Incremental and changelog reads against someone who can write the table's storage:
the range is defined by ``metadata.json`` (parent links, operations), which is input; the
files it reaches are authenticated like any other read."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from tablelib import edit_metadata, flip_byte

from icecrypt.errors import DecryptionError
from icecrypt.table import EncryptedTable, PlaintextFileError

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
    """``operation`` is metadata input: relabelling the overwrite as an append makes the
    incremental read return the overwrite's added rows -- rows the table really holds,
    authenticated; nothing from outside the table and nothing unauthenticated."""
    table, (a, b, c) = history

    def relabel(metadata):
        for s in metadata["snapshots"]:
            if s["snapshot-id"] == b:
                s["summary"]["operation"] = "append"
    table = _edit(table, relabel)
    assert sorted(table.scan(from_snapshot_id=a).to_arrow()["id"].to_pylist()) == [7, 8]

"""Writes to a branch (``append``/``append_files``/``overwrite``/``overwrite_files``/
``delete`` with ``branch=``): the branch moves, main does not; a branch that does not
exist is created from main's head (Java's ``SnapshotUtil.latestSnapshot``); a tag is
never written to; PyIceberg agrees on refs and lineage; a racing writer on the same
branch is re-applied (append) or refused (overwrite, delete)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyiceberg.table import StaticTable
from test_write_commit import _race

from icecrypt import CommitConflictError
from icecrypt.kms.memory import MemoryKms
from icecrypt.table import EncryptedTable
from icecrypt.table.ops import write as _write

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False)])


def batch(*ids: int) -> pa.Table:
    return pa.table({"id": list(ids)}, schema=SCHEMA)


@pytest.fixture(params=["encrypted", "plaintext"])
def table(request, tmp_path):
    kms = MemoryKms.with_iceberg_test_keys()
    t = EncryptedTable.create(
        str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA" if request.param == "encrypted" else None
    )
    t.append(batch(1, 2, 3))
    t.kms_client = kms
    return t


def rows(table: EncryptedTable, **scan) -> list[int]:
    return sorted(table.scan(**scan).to_arrow().column("id").to_pylist())


def test_append_to_a_new_branch_creates_it_from_main(table):
    main_head = table.current_snapshot_id
    sid = table.append(batch(10), branch="dev")
    refs = table.metadata["refs"]
    assert refs["dev"] == {"snapshot-id": sid, "type": "branch"}
    assert table.current_snapshot_id == main_head and refs["main"]["snapshot-id"] == main_head
    snapshot = table.snapshot(sid)
    assert snapshot.parent_snapshot_id == main_head
    assert rows(table, branch="dev") == [1, 2, 3, 10]
    assert rows(table) == [1, 2, 3]
    # the branch keeps moving; main's log records main only
    sid2 = table.append(batch(11), branch="dev")
    assert table.snapshot(sid2).parent_snapshot_id == sid
    assert rows(table, branch="dev") == [1, 2, 3, 10, 11]
    assert [e["snapshot-id"] for e in table.metadata["snapshot-log"]] == [main_head]
    # main moves on independently; the branch does not see it
    table.append(batch(4))
    assert rows(table) == [1, 2, 3, 4] and rows(table, branch="dev") == [1, 2, 3, 10, 11]
    assert table.verify().ok
    # PyIceberg reads the same refs and lineage
    theirs = StaticTable.from_metadata(table.metadata_location).metadata
    assert theirs.refs["dev"].snapshot_id == sid2 and theirs.refs["main"].snapshot_id == table.current_snapshot_id
    assert theirs.snapshot_by_id(sid2).parent_snapshot_id == sid
    assert theirs.last_sequence_number == table.metadata["last-sequence-number"]
    if not table.encrypted:  # PyIceberg reads plaintext tables: the branch's rows and main's
        static = StaticTable.from_metadata(table.metadata_location)
        assert sorted(static.scan(snapshot_id=sid2).to_arrow().column("id").to_pylist()) == [1, 2, 3, 10, 11]
        assert sorted(static.scan().to_arrow().column("id").to_pylist()) == [1, 2, 3, 4]


def test_branch_retention_is_kept_by_a_write(table):
    table.manage_snapshots().create_branch("dev", min_snapshots_to_keep=3, max_ref_age_ms=10**9).commit()
    sid = table.append(batch(5), branch="dev")
    assert table.metadata["refs"]["dev"] == {
        "snapshot-id": sid, "type": "branch", "min-snapshots-to-keep": 3, "max-ref-age-ms": 10**9
    }


def test_overwrite_and_delete_on_a_branch(table):
    table.append(batch(4, 5), branch="dev")
    sid = table.overwrite(batch(7, 8, 9), branch="dev")
    assert table.metadata["refs"]["dev"]["snapshot-id"] == sid
    assert rows(table, branch="dev") == [7, 8, 9] and rows(table) == [1, 2, 3]
    did = table.delete("id = 8", branch="dev")
    assert table.snapshot(did).parent_snapshot_id == sid
    assert rows(table, branch="dev") == [7, 9] and rows(table) == [1, 2, 3]
    # a delete on a branch that does not exist starts from main and creates it
    new = table.delete("id = 1", branch="fresh")
    assert rows(table, branch="fresh") == [2, 3] and rows(table) == [1, 2, 3]
    assert table.snapshot(new).parent_snapshot_id == table.current_snapshot_id
    assert table.verify().ok


def test_append_files_and_overwrite_files_to_a_branch(table):
    files = _write.write_files(table, batch(20, 21))
    sid = _write.append_files(table, files, branch="b")
    assert rows(table, branch="b") == [1, 2, 3, 20, 21] and rows(table) == [1, 2, 3]
    files = _write.write_files(table, batch(30))
    oid = _write.overwrite_files(table, files, branch="b")
    assert table.snapshot(oid).parent_snapshot_id == sid
    assert rows(table, branch="b") == [30] and rows(table) == [1, 2, 3]


def test_a_tag_is_never_written_to(table):
    table.manage_snapshots().create_tag("v1", table.current_snapshot_id).commit()
    before = table.metadata_location
    for write in (lambda: table.append(batch(9), branch="v1"), lambda: table.overwrite(batch(9), branch="v1"),
                  lambda: table.delete("id = 1", branch="v1")):  # fmt: skip
        with pytest.raises(ValueError, match="'v1' is a tag, not a branch"):
            write()
    with pytest.raises(ValueError, match="non-empty string"):
        table.append(batch(9), branch="")
    assert table.refresh().metadata_location == before


def test_racing_appends_to_a_branch_are_both_kept(table, monkeypatch):
    table.append(batch(10), branch="dev")
    rival = EncryptedTable.load(table.metadata_location, kms=table.kms_client)
    _race(monkeypatch, lambda: rival.append(batch(11), branch="dev"))
    sid = table.append(batch(12), branch="dev")
    assert rows(table, branch="dev") == [1, 2, 3, 10, 11, 12]
    chain = [table.snapshot(sid)]
    while chain[-1].parent_snapshot_id is not None:
        chain.append(table.snapshot(chain[-1].parent_snapshot_id))
    assert len(chain) == 4  # main's first snapshot, then the three branch appends in a line


@pytest.mark.parametrize("operation", ["overwrite", "delete"])
def test_racing_writer_on_the_branch_refuses_overwrite_and_delete(table, monkeypatch, operation):
    table.append(batch(10), branch="dev")
    rival = EncryptedTable.load(table.metadata_location, kms=table.kms_client)
    _race(monkeypatch, lambda: rival.append(batch(11), branch="dev"))
    with pytest.raises(CommitConflictError, match="branch 'dev' moved"):
        if operation == "overwrite":
            table.overwrite(batch(0), branch="dev")
        else:
            table.delete("id >= 10", branch="dev")
    assert rows(table.refresh(), branch="dev") == [1, 2, 3, 10, 11]


@pytest.mark.parametrize("operation", ["overwrite", "delete"])
def test_a_commit_elsewhere_does_not_refuse_a_branch_overwrite(table, monkeypatch, operation):
    """Only the branch written to matters: an append to main (another ref) in between
    is no conflict for an overwrite or delete of ``dev``; the change is committed on the
    newer version as planned."""
    table.append(batch(10), branch="dev")
    rival = EncryptedTable.load(table.metadata_location, kms=table.kms_client)
    _race(monkeypatch, lambda: rival.append(batch(4)))
    if operation == "overwrite":
        table.overwrite(batch(0), branch="dev")
        assert rows(table, branch="dev") == [0]
    else:
        table.delete("id >= 10", branch="dev")
        assert rows(table, branch="dev") == [1, 2, 3]
    assert rows(table) == [1, 2, 3, 4]
    assert table.verify().ok

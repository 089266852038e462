"""Write-audit-publish and cherry-pick: with ``write.wap.enabled=true`` an append with a
``wap_id`` adds a staged snapshot (summary ``wap.id``) that no branch points at; it is
read by snapshot id (the audit), published by ``manage_snapshots().cherry_pick`` (a
fast-forward of main when main has not moved, else the append's files re-applied as a
new snapshot with ``published-wap-id`` and ``source-snapshot-id``), and refused as Java
refuses it: a wap id published twice, a snapshot already in main's history or already
picked, a non-append that cannot be fast-forwarded.  PyIceberg agrees on the result."""

from __future__ import annotations

import pytest
from pyiceberg.table import StaticTable
from test_branch_writes import SCHEMA, batch, rows

from icecrypt.kms.memory import MemoryKms
from icecrypt.table import EncryptedTable


@pytest.fixture(params=["encrypted", "plaintext"])
def table(request, tmp_path):
    kms = MemoryKms.with_iceberg_test_keys()
    t = EncryptedTable.create(
        str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA" if request.param == "encrypted" else None,
        properties={"write.wap.enabled": "true"},
    )  # fmt: skip
    t.append(batch(1, 2))
    return t


def test_staged_snapshot_moves_no_branch(table):
    head = table.current_snapshot_id
    staged = table.append(batch(3), wap_id="job-1")
    assert table.current_snapshot_id == head and set(table.metadata["refs"]) == {"main"}
    snapshot = table.snapshot(staged)
    assert snapshot.summary["wap.id"] == "job-1" and snapshot.parent_snapshot_id == head
    assert rows(table) == [1, 2] and rows(table, snapshot_id=staged) == [1, 2, 3]  # the audit
    assert [e["snapshot-id"] for e in table.metadata["snapshot-log"]] == [head]
    theirs = StaticTable.from_metadata(table.metadata_location).metadata
    assert theirs.current_snapshot_id == head and theirs.snapshot_by_id(staged).summary["wap.id"] == "job-1"


def test_publish_by_fast_forward(table):
    staged = table.append(batch(3), wap_id="job-1")
    table.manage_snapshots().cherry_pick(staged).commit()
    assert table.current_snapshot_id == staged and rows(table) == [1, 2, 3]
    assert len(table.snapshots()) == 2  # no new snapshot
    with pytest.raises(ValueError, match="wap id 'job-1' was already published"):
        table.manage_snapshots().cherry_pick(staged)


def test_publish_after_main_moved_reapplies_the_append(table):
    staged = table.append(batch(3), wap_id="job-1")
    table.append(batch(4))  # main moved on: no fast-forward
    before = len(table.snapshots())
    table.manage_snapshots().cherry_pick(staged).commit()
    assert len(table.snapshots()) == before + 1
    new = table.snapshot(table.current_snapshot_id)
    assert new.summary["operation"] == "append"
    assert new.summary["published-wap-id"] == "job-1" and new.summary["source-snapshot-id"] == str(staged)
    assert new.summary["added-data-files"] == "1" and new.summary["total-records"] == "4"
    assert rows(table) == [1, 2, 3, 4]
    assert table.verify().ok
    reloaded = EncryptedTable.load(table.metadata_location, kms=table.kms)
    assert rows(reloaded) == [1, 2, 3, 4]
    # row ids of the published rows are new ids of main, with no overlap
    assert table.metadata["next-row-id"] == 2 + 1 + 1 + 1
    with pytest.raises(ValueError, match="already published"):
        table.manage_snapshots().cherry_pick(staged)
    theirs = StaticTable.from_metadata(table.metadata_location)
    assert theirs.metadata.current_snapshot_id == new.snapshot_id
    assert theirs.metadata.snapshot_by_id(new.snapshot_id).summary["published-wap-id"] == "job-1"
    if not table.encrypted:  # PyIceberg reads plaintext tables: the same rows on main
        assert sorted(theirs.scan().to_arrow().column("id").to_pylist()) == [1, 2, 3, 4]


def test_cherry_pick_of_a_branch_append_and_refusals(table):
    base = table.current_snapshot_id
    dev = table.append(batch(7), branch="dev")
    table.append(batch(3))
    table.manage_snapshots().cherry_pick(dev).commit()
    picked = table.current_snapshot_id
    assert rows(table) == [1, 2, 3, 7] and table.snapshot(picked).summary["source-snapshot-id"] == str(dev)
    location = table.metadata_location
    with pytest.raises(ValueError, match="already picked to create ancestor"):
        table.manage_snapshots().cherry_pick(dev)
    with pytest.raises(ValueError, match="already an ancestor of main"):
        table.manage_snapshots().cherry_pick(base)
    with pytest.raises(ValueError, match="not in the table"):
        table.manage_snapshots().cherry_pick(12345)
    # a delete on a branch is no append: only a fast-forward could publish it
    deleted = table.delete("id = 1", branch="dev")
    with pytest.raises(ValueError, match="'delete' snapshot that is not a fast-forward"):
        table.manage_snapshots().cherry_pick(deleted)
    # a re-applying pick is a commit of its own
    staged = table.append(batch(9), wap_id="w2")
    table.append(batch(10))
    with pytest.raises(ValueError, match="its own commit"):
        table.manage_snapshots().create_tag("t", picked).cherry_pick(staged)
    assert table.refresh().metadata_location != location  # (the appends above committed)
    assert "t" not in table.metadata["refs"]


def test_wap_needs_the_property_and_no_branch(tmp_path):
    t = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=None, table_key_id=None)
    t.append(batch(1))
    location = t.metadata_location
    with pytest.raises(ValueError, match="write.wap.enabled=true"):
        t.append(batch(2), wap_id="x")
    t.update_properties().set("write.wap.enabled", "true").commit()
    with pytest.raises(ValueError, match="either stages"):
        t.append(batch(2), wap_id="x", branch="dev")
    assert len(t.refresh().snapshots()) == 1 and t.metadata_location != location

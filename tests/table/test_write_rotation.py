"""Key rotation of a table: a new KEK and a new KMS master key, each committed as one
metadata version; every snapshot stays readable, and only through the new master key."""

from __future__ import annotations

import pyarrow as pa
import pytest

from icecrypt import KmsKeyNotFoundError
from icecrypt.keys import read_encryption_keys
from icecrypt.kms.memory import MemoryKms
from icecrypt.table import EncryptedTable

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string())])

def rows(lo: int, hi: int) -> pa.Table:
    return pa.table({"id": pa.array(range(lo, hi), pa.int64()), "name": [f"n{i}" for i in range(lo, hi)]}, schema=SCHEMA)

def kek_ids(table: EncryptedTable) -> list[str]:
    keys = read_encryption_keys(table.metadata)
    return [k.key_id for k in keys if k.encrypted_by_id == table.properties["encryption.key-id"]]

def test_rotate_kek_then_master_key(tmp_path):
    kms = MemoryKms({"m1": bytes(range(16)), "m2": bytes(range(1, 17))})
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="m1")
    first = table.append(rows(0, 100))
    (old_kek,) = kek_ids(table)

    summary = table.rotate_keys()
    assert table.current_snapshot_id == first  # a metadata-only commit
    assert summary["kek_id"] != old_kek and summary["rewrapped_kek_ids"] == []
    assert kek_ids(table)[0] == summary["kek_id"]  # first in list order: writers pick it
    second = table.append(rows(100, 250))
    ml_key = next(s for s in table.metadata["snapshots"] if s["snapshot-id"] == second)["key-id"]
    wrapped_by = {k.key_id: k.encrypted_by_id for k in read_encryption_keys(table.metadata)}
    assert wrapped_by[ml_key] == summary["kek_id"]

    summary = table.rotate_keys(new_kek=False, new_master_key_id="m2")
    assert summary["table_key_id"] == "m2" and sorted(summary["rewrapped_kek_ids"]) == sorted([old_kek, wrapped_by[ml_key]])
    assert table.properties["encryption.key-id"] == "m2"

    # Only m2 is needed now: a KMS without m1 reads every snapshot.
    only_m2 = MemoryKms({"m2": bytes(range(1, 17))})
    reloaded = EncryptedTable.load(str(tmp_path / "t"), kms=only_m2)
    assert reloaded.scan(snapshot_id=first).to_arrow().num_rows == 100
    assert sorted(reloaded.scan().to_arrow().column("id").to_pylist()) == list(range(250))
    # ...and a KMS with m1 only can no longer unwrap anything.
    with pytest.raises(KmsKeyNotFoundError):
        EncryptedTable.load(str(tmp_path / "t"), kms=MemoryKms({"m1": bytes(range(16))})).scan().to_arrow()

def test_rotation_refused_on_plaintext_table_and_without_work(tmp_path):
    table = EncryptedTable.create(str(tmp_path / "p"), SCHEMA, kms=None, table_key_id=None)
    with pytest.raises(ValueError, match="not encrypted"):
        table.rotate_keys()
    with pytest.raises(ValueError, match="nothing to rotate"):
        table.rotate_keys(new_kek=False)


def _race_once(monkeypatch, other_commit, times: int = 1):
    """The next ``times`` metadata commits each find that ``other_commit`` committed just
    before them."""
    from icecrypt.table.commit import store as _commit

    original = _commit.commit_metadata
    state = {"left": times, "racing": False}

    def racing(*args, **kwargs):
        if state["left"] and not state["racing"]:  # the other writer's own commit goes through
            state["left"] -= 1
            state["racing"] = True
            try:
                other_commit()
            finally:
                state["racing"] = False
        return original(*args, **kwargs)

    monkeypatch.setattr(_commit, "commit_metadata", racing)


def test_a_rotation_that_lost_to_an_append_is_reapplied_on_the_newer_version(tmp_path, monkeypatch):
    kms = MemoryKms({"m1": bytes(range(16)), "m2": bytes(range(1, 17))})
    mine = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="m1")
    mine.append(rows(0, 10))
    theirs = EncryptedTable.load(str(tmp_path / "t"), kms=kms)
    _race_once(monkeypatch, lambda: theirs.append(rows(10, 20)))

    summary = mine.rotate_keys(new_kek=True, new_master_key_id="m2")
    assert mine.metadata_location.endswith("v4.metadata.json")  # theirs is v3, the rotation after it
    assert mine.current_snapshot_id == theirs.current_snapshot_id  # their append kept
    assert mine.pin.table_key_id == "m2" and mine.properties["encryption.key-id"] == "m2"
    # rebuilt on their version: the KEK their manifest list key is wrapped under was
    # re-wrapped too, and the new KEK is first
    assert kek_ids(mine)[0] == summary["kek_id"]
    ml_key = next(s for s in mine.metadata["snapshots"] if s["snapshot-id"] == theirs.current_snapshot_id)["key-id"]
    wrapped_by = {k.key_id: k.encrypted_by_id for k in read_encryption_keys(mine.metadata)}
    assert wrapped_by[wrapped_by[ml_key]] == "m2"
    only_m2 = MemoryKms({"m2": bytes(range(1, 17))})
    assert sorted(EncryptedTable.load(str(tmp_path / "t"), kms=only_m2).scan().to_arrow().column("id").to_pylist()) == \
        list(range(20))


def test_the_pin_moves_only_when_the_rotation_landed(tmp_path, monkeypatch):
    from icecrypt.errors import CommitConflictError

    kms = MemoryKms({"m1": bytes(range(16)), "m2": bytes(range(1, 17))})
    new_kms = MemoryKms({"m2": bytes(range(1, 17))})
    mine = EncryptedTable.create(
        str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="m1", properties={"commit.retry.num-retries": "1"}
    )
    mine.append(rows(0, 10))
    theirs = EncryptedTable.load(str(tmp_path / "t"), kms=kms)
    before = mine.metadata_location
    _race_once(monkeypatch, lambda: theirs.refresh().append(rows(10, 11)), times=2)
    with pytest.raises(CommitConflictError, match="key rotation kept losing"):
        mine.rotate_keys(new_kek=True, new_master_key_id="m2", new_kms=new_kms)
    # nothing of the rotation committed, and the table object keeps its pin and KMS
    assert mine.metadata_location == before and mine.pin.table_key_id == "m1" and mine.kms is kms
    assert theirs.refresh().properties["encryption.key-id"] == "m1"
    assert mine.refresh().properties["encryption.key-id"] == "m1"
    assert sorted(mine.scan().to_arrow().column("id").to_pylist()) == [*range(10), 10, 10]  # their two appends

"""Key rotation of a catalog table on the one committer: a rotation that lost the
compare-and-swap to another writer's append is rebuilt on the newer version (their
snapshot kept, its keys re-wrapped), and the catalog records the new master key and the
retired KEKs with the commit that landed, never with one that did not."""

from __future__ import annotations

import pyarrow as pa
import pytest

from icecrypt.errors import CommitConflictError
from icecrypt.keys import read_encryption_keys
from icecrypt.table.commit.pin import retired_keks

SCHEMA = pa.schema([pa.field("id", pa.int64())])


def _rows(start: int, stop: int) -> pa.Table:
    return pa.table({"id": list(range(start, stop))}, schema=SCHEMA)


def test_a_lost_rotation_is_reapplied_on_the_newer_version(sqlite_catalog, race_once):
    sqlite_catalog.create_namespace("db")
    mine = sqlite_catalog.create_table("db.t", SCHEMA, table_key_id="keyA")
    mine.append(_rows(0, 10))
    old_kek = next(k.key_id for k in read_encryption_keys(mine.metadata) if k.encrypted_by_id == "keyA")
    theirs = sqlite_catalog.load_table("db.t")
    race_once(lambda: theirs.append(_rows(10, 20)))

    summary = mine.rotate_keys(new_kek=True, new_master_key_id="keyB")
    assert mine.current_snapshot_id == theirs.current_snapshot_id  # their append kept
    assert mine.pin.table_key_id == "keyB"
    loaded = sqlite_catalog.load_table("db.t")
    assert loaded.metadata_location == mine.metadata_location and loaded.pin.table_key_id == "keyB"
    keys = {k.key_id: k for k in read_encryption_keys(loaded.metadata)}
    ml_key = next(s for s in loaded.metadata["snapshots"] if s["snapshot-id"] == theirs.current_snapshot_id)["key-id"]
    assert keys[keys[ml_key].encrypted_by_id].encrypted_by_id == "keyB"  # their key's KEK re-wrapped
    assert read_encryption_keys(loaded.metadata)[0].key_id == summary["kek_id"]
    assert old_kek in [key_id for key_id, _ in retired_keks(sqlite_catalog._pin_get(("db",), "t"))]
    assert sorted(loaded.scan().to_arrow().column("id").to_pylist()) == list(range(20))


def test_a_rotation_that_never_landed_changes_no_pin(sqlite_catalog, race_once):
    sqlite_catalog.create_namespace("db")
    mine = sqlite_catalog.create_table("db.t", SCHEMA, table_key_id="keyA", properties={"commit.retry.num-retries": "0"})
    mine.append(_rows(0, 10))
    theirs = sqlite_catalog.load_table("db.t")
    before = mine.metadata_location
    race_once(lambda: theirs.append(_rows(10, 20)))

    with pytest.raises(CommitConflictError, match="key rotation kept losing"):
        mine.rotate_keys(new_kek=True, new_master_key_id="keyB")
    assert mine.metadata_location == before and mine.pin.table_key_id == "keyA"
    loaded = sqlite_catalog.load_table("db.t")
    assert loaded.pin.table_key_id == "keyA" and loaded.properties["encryption.key-id"] == "keyA"
    assert retired_keks(sqlite_catalog._pin_get(("db",), "t")) == []  # nothing retired without a commit
    assert sorted(loaded.scan().to_arrow().column("id").to_pylist()) == list(range(20))

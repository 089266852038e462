"""The commit model: updates applied copy-on-write (base untouched, key order and unknown
fields kept, logs maintained), requirements derived as Java derives them, and the one
committer (retries on a lost race with the newest base re-validated, refusal when a
requirement no longer holds, the retry budget of ``commit.retry.*``)."""

from __future__ import annotations

import copy
import json

import pyarrow as pa
import pytest

from icecrypt.errors import CommitConflictError
from icecrypt.kms.memory import MemoryKms
from icecrypt.table import EncryptedTable
from icecrypt.table.commit import store as _commit
from icecrypt.table.commit import committer as _committer
from icecrypt.table.model import changes as _model
from icecrypt.table.model.changes import (
    AddEncryptionKey,
    AddSchema,
    AssertRefSnapshotId,
    AssertTableUUID,
    Change,
    RemoveEncryptionKey,
    RemoveProperties,
    RemoveSnapshotRef,
    RemoveSnapshots,
    RequirementFailed,
    SetCurrentSchema,
    SetProperties,
    SetSnapshotRef,
    UpgradeFormatVersion,
)

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False)])


def base_doc() -> dict:
    return {
        "format-version": 3,
        "table-uuid": "9c12d441-03fe-4693-9a96-a0705ddf69c1",
        "location": "s3://b/t",
        "last-updated-ms": 1000,
        "x-unknown": {"kept": [1, 2]},
        "properties": {"a": "1"},
        "current-snapshot-id": 2,
        "snapshots": [
            {"snapshot-id": 1, "timestamp-ms": 10, "sequence-number": 1},
            {"snapshot-id": 2, "parent-snapshot-id": 1, "timestamp-ms": 20, "sequence-number": 2},
        ],
        "refs": {"main": {"snapshot-id": 2, "type": "branch"}},
        "snapshot-log": [{"timestamp-ms": 10, "snapshot-id": 1}, {"timestamp-ms": 20, "snapshot-id": 2}],
        "metadata-log": [],
        "schemas": [{"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "required": True, "type": "long"}]}],
        "current-schema-id": 0,
        "last-column-id": 1,
        "encryption-keys": [{"key-id": "k1", "encrypted-key-metadata": "AA==", "encrypted-by-id": "m"}],
    }


def test_apply_is_copy_on_write_and_keeps_order_and_unknown_fields():
    base = base_doc()
    frozen = copy.deepcopy(base)
    new = _model.apply(base, [SetProperties({"b": "2"}), RemoveProperties(("a",))],
                       base_location="/w/t/metadata/v3.metadata.json", now=5000)  # fmt: skip
    assert base == frozen  # the base is never edited
    assert list(new) == list(base)  # key order kept, nothing added or dropped
    assert new["x-unknown"] is base["x-unknown"] and new["snapshots"] is base["snapshots"]  # shared, unchanged
    assert new["properties"] == {"b": "2"} and new["last-updated-ms"] == 5000
    assert new["metadata-log"] == [{"timestamp-ms": 1000, "metadata-file": "s3://b/t/metadata/v3.metadata.json"}]
    # never earlier than the base
    assert _model.apply(base, [], now=1)["last-updated-ms"] == 1000


def test_metadata_log_trimmed_as_the_write_path_trims_it():
    from icecrypt.table.ops.write import _log_previous

    base = base_doc()
    base["properties"]["write.metadata.previous-versions-max"] = "2"
    base["metadata-log"] = [{"timestamp-ms": i, "metadata-file": f"s3://b/t/metadata/v{i}.metadata.json"} for i in (1, 2)]
    ours = _model.apply(base, [], base_location="/x/v3.metadata.json", now=1000)
    theirs = dict(base)
    _log_previous(theirs, base, "/x/v3.metadata.json")
    assert ours["metadata-log"] == theirs["metadata-log"] and len(ours["metadata-log"]) == 2
    assert json.dumps(ours) == json.dumps({**theirs, "last-updated-ms": 1000})


def test_refs_move_current_snapshot_and_log_it():
    base = base_doc()
    new = _model.apply(base, [SetSnapshotRef("main", 1), SetSnapshotRef("t", 2, "tag", max_ref_age_ms=5)], now=3000)
    assert new["current-snapshot-id"] == 1 and new["snapshot-log"][-1] == {"timestamp-ms": 3000, "snapshot-id": 1}
    assert new["refs"]["t"] == {"snapshot-id": 2, "type": "tag", "max-ref-age-ms": 5}
    assert base["refs"] == {"main": {"snapshot-id": 2, "type": "branch"}}
    assert "t" not in _model.apply(new, [RemoveSnapshotRef("t")])["refs"]
    with pytest.raises(ValueError, match="snapshot 99 is not in the table"):
        _model.apply(base, [SetSnapshotRef("x", 99)])
    with pytest.raises(ValueError, match="type must be"):
        _model.apply(base, [SetSnapshotRef("x", 1, "leaf")])


def test_other_updates():
    base = base_doc()
    new = _model.apply(base, [
        RemoveSnapshots((1,)),
        AddEncryptionKey({"key-id": "k2", "encrypted-key-metadata": "AQ==", "encrypted-by-id": "m"}),
        AddEncryptionKey({"key-id": "k1", "encrypted-key-metadata": "ignored"}),  # an id that exists is kept
        RemoveEncryptionKey("k1"),
        AddSchema({"type": "struct", "schema-id": 1, "fields": [
            {"id": 1, "name": "id", "required": True, "type": "long"},
            {"id": 4, "name": "s", "required": False, "type": {"type": "list", "element-id": 7, "element": "int",
                                                               "element-required": False}}]}),
        SetCurrentSchema(1),
        UpgradeFormatVersion(3),
    ])  # fmt: skip
    assert [s["snapshot-id"] for s in new["snapshots"]] == [2] and [e["snapshot-id"] for e in new["snapshot-log"]] == [2]
    assert [k["key-id"] for k in new["encryption-keys"]] == ["k2"]
    assert new["current-schema-id"] == 1 and new["last-column-id"] == 7
    with pytest.raises(ValueError, match="schema 5"):
        _model.apply(base, [SetCurrentSchema(5)])
    with pytest.raises(ValueError, match="downgrade"):
        _model.apply(base, [UpgradeFormatVersion(2)])


def test_requirements_derived_as_java_does():
    base = base_doc()
    change = Change.on(base, [SetSnapshotRef("main", 1), SetSnapshotRef("main", 2), SetSnapshotRef("dev", 1),
                              SetProperties({"k": "v"})])  # fmt: skip
    assert change.requirements == (
        AssertTableUUID(base["table-uuid"]), AssertRefSnapshotId("main", 2), AssertRefSnapshotId("dev", None),
    )  # fmt: skip
    change.validate(base)
    moved = _model.apply(base, [SetSnapshotRef("main", 1)])
    with pytest.raises(RequirementFailed, match="'main' moved concurrently: expected snapshot 2, found 1"):
        change.validate(moved)
    with pytest.raises(RequirementFailed, match="'dev' was created concurrently"):
        change.validate(_model.apply(base, [SetSnapshotRef("dev", 2)]))
    with pytest.raises(RequirementFailed, match="UUID"):
        change.validate({**base, "table-uuid": "other"})
    assert issubclass(RequirementFailed, CommitConflictError)


def test_retry_policy_from_properties():
    policy = _committer.RetryPolicy.from_properties({"commit.retry.num-retries": "9", "commit.retry.min-wait-ms": "1"})
    assert (policy.num_retries, policy.min_wait_ms, policy.max_wait_ms, policy.total_timeout_ms) == (9, 1, 60000, 1800000)
    assert _committer.RetryPolicy.from_properties({}) == _committer.RetryPolicy(4, 100, 60000, 1800000)
    assert 1 <= policy.delay_ms(1) <= 2 and policy.delay_ms(40) <= 60000 * 1.1
    with pytest.raises(ValueError, match="commit.retry.num-retries"):
        _committer.RetryPolicy.from_properties({"commit.retry.num-retries": "many"})


# --- the committer against real tables -----------------------------------------------------------


@pytest.fixture(params=["encrypted", "plaintext"])
def tables(request, tmp_path):
    """Two table objects of one path table with three snapshots."""
    kms = MemoryKms.with_iceberg_test_keys()
    key = "keyA" if request.param == "encrypted" else None
    t = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id=key,
                              properties={"commit.retry.min-wait-ms": "1"})  # fmt: skip
    ids = [t.append(pa.table({"id": [i]}, schema=SCHEMA)) for i in range(3)]
    return t, EncryptedTable.load(str(tmp_path / "t"), kms=kms), ids


def race_once(monkeypatch, other_commit):
    """The next metadata commit finds that ``other_commit`` committed just before it."""
    original = _commit.commit_metadata
    state = {"raced": 0}

    def racing(*args, **kwargs):
        if state["raced"] == 0:
            state["raced"] = 1
            other_commit()
        return original(*args, **kwargs)

    monkeypatch.setattr(_commit, "commit_metadata", racing)
    return state


def test_a_lost_race_is_replayed_on_the_newer_version(tables, monkeypatch):
    mine, theirs, ids = tables
    props = mine.update_properties().set("owner", "ops")
    race_once(monkeypatch, lambda: theirs.append(pa.table({"id": [99]}, schema=SCHEMA)))
    location = props.commit()
    assert location == mine.metadata_location and location.endswith("v6.metadata.json")
    assert mine.properties["owner"] == "ops" and mine.current_snapshot_id == theirs.current_snapshot_id not in ids
    assert sorted(mine.scan().to_arrow().column("id").to_pylist()) == [0, 1, 2, 99]
    assert theirs.refresh().properties["owner"] == "ops"


def test_a_requirement_failing_on_the_newer_version_refuses(tables, monkeypatch):
    mine, theirs, ids = tables
    rollback = mine.manage_snapshots().rollback_to_snapshot(ids[0])
    race_once(monkeypatch, lambda: theirs.append(pa.table({"id": [99]}, schema=SCHEMA)))
    before = mine.metadata_location
    with pytest.raises(RequirementFailed, match="'main' moved concurrently"):
        rollback.commit()
    assert mine.metadata_location == before
    assert theirs.refresh().metadata_location.endswith("v5.metadata.json")  # theirs only: nothing of mine
    assert theirs.current_snapshot_id not in ids and "v6.metadata.json" not in str(theirs.metadata.get("metadata-log"))


def test_retries_run_out(tables, monkeypatch):
    mine, theirs, _ = tables
    with mine.update_properties() as p:
        p.set("commit.retry.num-retries", "0")
    props = mine.update_properties().set("owner", "ops")
    race_once(monkeypatch, lambda: theirs.refresh().append(pa.table({"id": [7]}, schema=SCHEMA)))
    with pytest.raises(CommitConflictError, match="kept losing"):
        props.commit()
    assert "owner" not in theirs.refresh().properties


def test_committer_checks_the_pin(tables):
    from icecrypt.errors import TableIdentityError

    mine, _, _ = tables
    change = Change.on(mine.metadata, [SetProperties({"write.data.path": "/elsewhere"})])
    before = mine.metadata_location
    assert mine.pin.data_location is None
    with pytest.raises(TableIdentityError, match="write.data.path"):
        _committer.commit(mine, change)  # the built version would move the data: refused
    assert mine.refresh().metadata_location == before


def test_expiry_is_rebuilt_on_the_newer_version(tables, monkeypatch):
    mine, theirs, ids = tables
    race_once(monkeypatch, lambda: theirs.append(pa.table({"id": [99]}, schema=SCHEMA)))
    expired = mine.expire_snapshots(4_102_444_800_000)
    # rebuilt on theirs: their append is the current snapshot, and the snapshot that was
    # current when the expiry started expired too
    assert sorted(expired) == sorted(ids)
    assert [s.snapshot_id for s in mine.snapshots()] == [theirs.current_snapshot_id]
    assert sorted(mine.scan().to_arrow().column("id").to_pylist()) == [0, 1, 2, 99] and mine.verify().ok


def test_upgrading_a_v1_document_writes_the_lists_v2_and_v3_write():
    """upgrade-format-version of a v1 document with only the legacy single schema and
    partition spec (an old writer's): the result has schemas, partition-specs,
    last-partition-id, sort-orders, last-sequence-number and (v3) next-row-id, the legacy
    fields gone, and the base untouched."""
    schema = {"type": "struct", "fields": [{"id": 1, "name": "id", "required": True, "type": "long"}]}
    spec = [{"name": "id_b", "transform": "bucket[4]", "source-id": 1, "field-id": 1000}]
    base = {"format-version": 1, "table-uuid": "u", "location": "/t", "last-updated-ms": 5, "last-column-id": 1,
            "schema": schema, "partition-spec": spec, "properties": {}}  # fmt: skip
    frozen = copy.deepcopy(base)
    new = _model.apply(base, [UpgradeFormatVersion(3)], now=7)
    assert base == frozen
    assert "schema" not in new and "partition-spec" not in new and new["format-version"] == 3
    assert new["schemas"] == [{**schema, "schema-id": 0}] and new["current-schema-id"] == 0
    assert new["partition-specs"] == [{"spec-id": 0, "fields": spec}] and new["default-spec-id"] == 0
    assert new["last-partition-id"] == 1000 and new["sort-orders"] == [{"order-id": 0, "fields": []}]
    assert new["last-sequence-number"] == 0 and new["next-row-id"] == 0
    v2 = _model.apply(base, [UpgradeFormatVersion(2)], now=7)
    assert "next-row-id" not in v2 and v2["last-sequence-number"] == 0 and "schema" not in v2

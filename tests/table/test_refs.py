"""Branches, tags, rollback and properties (``manage_snapshots``, ``update_properties``):
round trips on encrypted and plaintext tables, PyIceberg agreeing on what was written,
bad input refused with nothing committed, refs read from storage validated, and the
Java-written tables accepting a tag and a branch."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.table import StaticTable
from tablelib import TABLE_NAMES, edit_metadata, metadata_path

from icecrypt.errors import FormatError
from icecrypt.kms.memory import MemoryKms
from icecrypt.table import EncryptedTable

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False)])


def versions(table: EncryptedTable) -> list[str]:
    root = table.fs_path(f"{table.location}/metadata")
    return sorted(info.base_name for info in table.filesystem.get_file_info(
        __import__("pyarrow.fs").fs.FileSelector(root)) if info.base_name.endswith(".metadata.json"))  # fmt: skip


@pytest.fixture(params=["encrypted", "plaintext"])
def table(request, tmp_path):
    kms = MemoryKms.with_iceberg_test_keys()
    t = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA" if request.param == "encrypted" else None)
    for i in range(3):
        t.append(pa.table({"id": [i]}, schema=SCHEMA))
    t.ids = [s.snapshot_id for s in t.snapshots()]
    t.kms_client = kms
    return t


def rows(table, **scan) -> list[int]:
    return sorted(table.scan(**scan).to_arrow().column("id").to_pylist())


def test_branches_and_tags_round_trip(table):
    a, b, c = table.ids
    with table.manage_snapshots() as ms:
        ms.create_tag("v1", a, max_ref_age_ms=86_400_000).create_branch("audit", b, min_snapshots_to_keep=2)
        ms.create_branch("here")  # at the current snapshot
    refs = table.metadata["refs"]
    assert refs["v1"] == {"snapshot-id": a, "type": "tag", "max-ref-age-ms": 86_400_000}
    assert refs["audit"] == {"snapshot-id": b, "type": "branch", "min-snapshots-to-keep": 2}
    assert refs["here"]["snapshot-id"] == c and table.current_snapshot_id == c

    (table.manage_snapshots().replace_branch("audit", c, max_snapshot_age_ms=1000).replace_tag("v1", b)
     .rename_branch("here", "there").commit())  # fmt: skip
    refs = table.metadata["refs"]
    assert refs["audit"] == {"snapshot-id": c, "type": "branch", "min-snapshots-to-keep": 2, "max-snapshot-age-ms": 1000}
    assert refs["v1"] == {"snapshot-id": b, "type": "tag", "max-ref-age-ms": 86_400_000}
    assert "here" not in refs and refs["there"]["snapshot-id"] == c

    with table.manage_snapshots() as ms:
        ms.remove_tag("v1").remove_branch("there")
    reloaded = EncryptedTable.load(table.location, kms=table.kms_client)
    assert set(reloaded.metadata["refs"]) == {"main", "audit"}
    assert rows(reloaded) == [0, 1, 2] and reloaded.verify().ok


def test_rollback_set_current_and_fast_forward(table):
    a, b, c = table.ids
    table.manage_snapshots().create_tag("first", a).commit()
    table.manage_snapshots().rollback_to_snapshot(b).commit()
    assert table.current_snapshot_id == b and rows(table) == [0, 1]
    assert table.metadata["snapshot-log"][-1]["snapshot-id"] == b
    newest = max(s.timestamp_ms for s in table.snapshots() if s.snapshot_id == a)
    table.manage_snapshots().rollback_to_timestamp(newest + 1).commit()
    assert table.current_snapshot_id == a and rows(table) == [0]
    table.manage_snapshots().set_current_snapshot(c).commit()  # not an ancestor: allowed here
    assert table.current_snapshot_id == c
    table.manage_snapshots().set_current_snapshot("first").commit()  # by ref name
    assert table.current_snapshot_id == a
    # a branch behind main fast-forwards to it
    table.manage_snapshots().set_current_snapshot(c).create_branch("stale", a).fast_forward("stale", "main").commit()
    assert table.metadata["refs"]["stale"]["snapshot-id"] == c
    # appends continue from the current snapshot, on main
    d = table.append(pa.table({"id": [3]}, schema=SCHEMA))
    assert table.snapshot(d).parent_snapshot_id == c and table.metadata["refs"]["stale"]["snapshot-id"] == c
    assert rows(table) == [0, 1, 2, 3] and table.verify().ok


def test_pyiceberg_agrees(tmp_path):
    t = EncryptedTable.create(str(tmp_path / "p"), SCHEMA, kms=None, table_key_id=None)
    ids = [t.append(pa.table({"id": [i]}, schema=SCHEMA)) for i in range(3)]
    with t.manage_snapshots() as ms:
        ms.create_tag("v1", ids[0], max_ref_age_ms=1000).create_branch("dev", ids[1], min_snapshots_to_keep=3,
                                                                         max_snapshot_age_ms=5000)
        ms.rollback_to_snapshot(ids[1])
    with t.update_properties() as props:
        props.set("owner", "team").set("commit.retry.num-retries", "7")
    theirs = StaticTable.from_metadata(t.metadata_location).metadata
    assert theirs.current_snapshot_id == ids[1] == t.current_snapshot_id
    refs = {name: (ref.snapshot_id, ref.snapshot_ref_type.value, ref.min_snapshots_to_keep, ref.max_snapshot_age_ms,
                   ref.max_ref_age_ms) for name, ref in theirs.refs.items()}  # fmt: skip
    assert refs == {"main": (ids[1], "branch", None, None, None), "v1": (ids[0], "tag", None, None, 1000),
                    "dev": (ids[1], "branch", 3, 5000, None)}  # fmt: skip
    assert theirs.properties == {"owner": "team", "commit.retry.num-retries": "7"}
    assert [(s.snapshot_id, s.parent_snapshot_id) for s in theirs.snapshots] == [
        (s.snapshot_id, s.parent_snapshot_id) for s in t.snapshots()
    ]
    assert [e.snapshot_id for e in theirs.snapshot_log] == [*ids, ids[1]]
    assert len(theirs.metadata_log) == len(t.metadata["metadata-log"]) == 5


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda ms, ids: ms.create_branch("main"), "ref 'main' exists"),
        (lambda ms, ids: ms.create_tag("t", 12345), "snapshot 12345 is not in the table"),
        (lambda ms, ids: ms.create_tag("t", "12"), "must be an integer"),
        (lambda ms, ids: ms.create_branch("b", ids[0], min_snapshots_to_keep=0), "positive integer"),
        (lambda ms, ids: ms.replace_branch("nope", ids[0]), "there is no branch 'nope'"),
        (lambda ms, ids: ms.create_tag("t", ids[0]).replace_branch("t", ids[1]), "'t' is a tag, not a branch"),
        (lambda ms, ids: ms.remove_branch("main"), "main branch cannot be removed"),
        (lambda ms, ids: ms.rename_branch("main", "x"), "main branch cannot be renamed"),
        (lambda ms, ids: ms.remove_tag("main"), "'main' is a branch, not a tag"),
        (lambda ms, ids: ms.set_current_snapshot("nope"), "there is no ref 'nope'"),
        (lambda ms, ids: ms.rollback_to_snapshot(ids[2]).rollback_to_snapshot(ids[2]).set_current_snapshot(ids[0])
         .rollback_to_snapshot(ids[1]), "not an ancestor of the current snapshot"),
        (lambda ms, ids: ms.rollback_to_timestamp(0), "no ancestor of the current snapshot is older than 0"),
        (lambda ms, ids: ms.create_branch("b", ids[1]).fast_forward("b", "nope"), "there is no ref 'nope'"),
        (lambda ms, ids: ms.create_branch("b", ids[2]).fast_forward("b", "main").rollback_to_snapshot(ids[0])
         .fast_forward("b", "main"), "not an ancestor of"),
    ],
)  # fmt: skip
def test_bad_input_commits_nothing(table, build, message):
    before, files = table.metadata_location, versions(table)
    with pytest.raises(ValueError, match=message):
        with table.manage_snapshots() as ms:
            build(ms, table.ids)
    assert versions(table) == files and table.refresh().metadata_location == before


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("encryption.key-id", "keyB", "encryption property"),
        ("encryption.data-key-length", "32", "encryption property"),
        ("write.data.path", "/elsewhere", "pins"),
        ("format-version", "2", "reserved"),
        ("commit.retry.num-retries", "-1", "non-negative integer"),
        ("owner", 5, "values are strings"),
    ],
)
def test_guarded_properties(table, key, value, message):
    before, files = table.metadata_location, versions(table)
    with pytest.raises(ValueError, match=message):
        with table.update_properties() as props:
            props.set("fine", "yes").set(key, value)
    if message in ("encryption property", "pins", "reserved"):
        with pytest.raises(ValueError, match=message):
            table.update_properties().remove(key)
    assert versions(table) == files and table.refresh().metadata_location == before and "fine" not in table.properties


def test_properties_set_and_remove(table):
    with table.update_properties() as props:
        props.set("owner", "a").set("comment", "x")
    with table.update_properties() as props:
        props.remove("comment").set("owner", "b")
    expected = {"owner": "b"} | ({"encryption.key-id": "keyA"} if table.encrypted else {})
    assert table.properties == expected
    assert EncryptedTable.load(table.location, kms=table.kms_client).properties == expected
    ops = table.update_properties()
    ops.commit()  # nothing to commit: no new version
    with pytest.raises(ValueError, match="already committed"):
        ops.set("a", "b")
    with pytest.raises(ValueError, match="both set and removed"):
        table.update_properties().set("a", "b").remove("a")


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda m: m["refs"].__setitem__("x", {"snapshot-id": 1, "type": "branch"}), "'x' points at snapshot 1"),
        (lambda m: m["refs"].__setitem__("x", {"snapshot-id": "1", "type": "tag"}), "no integer snapshot-id"),
        (lambda m: m["refs"].__setitem__("x", [1]), "'x' is not a JSON object"),
        (lambda m: m["refs"]["main"].__setitem__("type", "tag"), "type|main"),
        (lambda m: m["refs"]["main"].__setitem__("min-snapshots-to-keep", -3), "expected a positive integer"),
        (lambda m: m["refs"].__setitem__("x", {"snapshot-id": m["current-snapshot-id"], "type": "tag",
                                               "min-snapshots-to-keep": 2}), "branch retention"),
        (lambda m: m["refs"]["main"].__setitem__("snapshot-id", m["snapshots"][0]["snapshot-id"]),
         "current-snapshot-id is"),
    ],
)  # fmt: skip
def test_refs_read_from_storage_are_validated(table, damage, message):
    edit_metadata(Path(table.fs_path(table.metadata_location)), damage)
    with pytest.raises(FormatError, match=message) as info:
        EncryptedTable.load(table.location, kms=table.kms_client)
    assert table.metadata_location.rsplit("/", 1)[1] in str(info.value)


@pytest.mark.parametrize("name", TABLE_NAMES)
def test_java_tables_accept_a_branch_and_a_tag(golden_copy, kms, name):
    table, root = golden_copy(name)
    current = table.current_snapshot_id
    with table.manage_snapshots() as ms:
        ms.create_tag("java-v1", current).create_branch("audit")
    reloaded = EncryptedTable.load(metadata_path(name, root).parent, kms=kms, location_map=table.location_map)
    assert reloaded.metadata["refs"]["java-v1"] == {"snapshot-id": current, "type": "tag"}
    assert reloaded.metadata["refs"]["audit"]["snapshot-id"] == current
    assert reloaded.verify().ok
    assert json.loads(json.dumps(reloaded.metadata["encryption-keys"])) == table.metadata["encryption-keys"]


def test_expiry_keeps_what_refs_retain(table):
    import time

    a, b, c = table.ids
    d = table.append(pa.table({"id": [3]}, schema=SCHEMA))
    with table.manage_snapshots() as ms:
        ms.create_branch("keep2", b, min_snapshots_to_keep=2).create_tag("old", a, max_ref_age_ms=1).create_tag("kept", c)
    head_ms = table.snapshot(a).timestamp_ms
    while time.time_ns() // 1_000_000 <= head_ms + 1:  # the tag's head is past its max-ref-age-ms
        time.sleep(0.002)
    far_future = 4_102_444_800_000
    expired = table.expire_snapshots(far_future)
    # keep2 keeps b and its parent a; the tag "old" is past its age (removed) but a stays
    # for keep2; "kept" keeps c; main keeps d
    assert sorted(expired) == [] and set(table.metadata["refs"]) == {"main", "keep2", "kept"}
    with table.manage_snapshots() as ms:
        ms.replace_branch("keep2", b, min_snapshots_to_keep=1)
    assert sorted(table.expire_snapshots(far_future)) == [a]
    assert {s.snapshot_id for s in table.snapshots()} == {b, c, d}
    assert rows(table, snapshot_id=b) == [0, 1] and rows(table, snapshot_id=c) == [0, 1, 2] and table.verify().ok
    # the table default applies to main
    with table.update_properties() as props:
        props.set("history.expire.min-snapshots-to-keep", "2")
    with table.manage_snapshots() as ms:
        ms.remove_branch("keep2").remove_tag("kept")
    assert sorted(table.expire_snapshots(far_future)) == sorted([b])  # c is d's parent: main keeps 2
    assert {s.snapshot_id for s in table.snapshots()} == {c, d}
    reloaded = EncryptedTable.load(table.location, kms=table.kms_client)
    assert rows(reloaded, snapshot_id=c) == [0, 1, 2] and reloaded.verify().ok


def test_expiry_retain_last_and_snapshot_ids(table):
    """Java's ``retainLast`` (the branches' default number of ancestors kept) and
    ``expireSnapshotId`` (removed whatever their age; never a ref's head)."""
    a, b, c = table.ids
    d = table.append(pa.table({"id": [3]}, schema=SCHEMA))
    far_future = 4_102_444_800_000
    with pytest.raises(ValueError, match="at least 1"):
        table.expire_snapshots(far_future, retain_last=0)
    with pytest.raises(ValueError, match=f"cannot expire snapshot {d}: still referenced by refs"):
        table.expire_snapshots(0, snapshot_ids=[d])
    with pytest.raises(ValueError, match="no such snapshot"):
        table.expire_snapshots(0, snapshot_ids=[12345])
    assert {s.snapshot_id for s in table.snapshots()} == {a, b, c, d}  # refused: nothing went
    assert sorted(table.expire_snapshots(0, snapshot_ids=[b])) == [b]  # by id, though not old
    assert sorted(table.expire_snapshots(far_future, retain_last=2)) == [a]  # main keeps d and c
    assert {s.snapshot_id for s in table.snapshots()} == {c, d}
    assert rows(table) == [0, 1, 2, 3] and table.verify().ok

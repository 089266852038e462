"""Partition evolution (``update_spec``): field ids and spec ids as Java assigns them,
reads, filters, deletes and inspection across specs, PyIceberg agreeing on what was
written, the Java-written tables evolving, bad input and lost races committing
nothing, and injected storage faults leaving the old or the new version."""

from __future__ import annotations

import datetime
import json
import decimal

import pyarrow as pa
import pytest
from forgery import without_authenticator
from faults.faultfs import FaultPlan, failing_filesystem
from pyiceberg.table import StaticTable
from tablelib import TABLE_NAMES, metadata_path

from icecrypt.errors import CommitConflictError
from icecrypt.kms.memory import MemoryKms
from icecrypt.table import EncryptedTable, UpdateSpec

SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False),
    pa.field("cat", pa.string()),
    pa.field("ts", pa.timestamp("us")),
    pa.field("amount", pa.decimal128(10, 2)),
    pa.field("name", pa.string()),
])  # fmt: skip


def rows(ids) -> pa.Table:
    ids = list(ids)
    return pa.table({
        "id": ids,
        "cat": [None if i % 7 == 0 else f"c{i % 3}" for i in ids],
        "ts": [datetime.datetime(2024, 1 + i % 3, 1 + i % 27, i % 24) for i in ids],
        "amount": pa.array([None if i % 5 == 0 else decimal.Decimal(i * 10) for i in ids], pa.decimal128(10, 2)),
        "name": [f"n{i:04d}" for i in ids],
    }, schema=SCHEMA)  # fmt: skip


@pytest.fixture(params=["encrypted", "plaintext"])
def table(request, tmp_path):
    kms = MemoryKms.with_iceberg_test_keys()
    key = "keyA" if request.param == "encrypted" else None
    t = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id=key)
    t.append(rows(range(0, 40)))
    t.kms_client = kms
    return t


def ids(table, row_filter=None) -> list[int]:
    scan = table.scan(row_filter=row_filter) if row_filter is not None else table.scan()
    return sorted(scan.to_arrow().column("id").to_pylist())


def expected(all_ids, keep) -> list[int]:
    frame = rows(all_ids).to_pylist()
    return sorted(r["id"] for r in frame if keep(r))


def test_every_transform_round_trips_across_specs(table):
    with table.update_spec() as update:
        (update.add_identity("cat").add_field("ts", "day").add_field("id", "bucket[8]")
         .add_field("name", "truncate[2]").add_field("amount", "truncate[100]", "amount_band"))  # fmt: skip
    spec = table.metadata["partition-specs"][-1]
    assert table.metadata["default-spec-id"] == spec["spec-id"] == 1
    assert [(f["name"], f["transform"], f["field-id"]) for f in spec["fields"]] == [
        ("cat", "identity", 1000), ("ts_day", "day", 1001), ("id_bucket_8", "bucket[8]", 1002),
        ("name_trunc_2", "truncate[2]", 1003), ("amount_band", "truncate[100]", 1004),
    ]  # fmt: skip
    assert table.metadata["last-partition-id"] == 1004
    table.append(rows(range(40, 80)))
    with table.update_spec() as update:
        update.remove_field("ts_day").add_field("ts", "month").rename_field("id_bucket_8", "shard")
    table.append(rows(range(80, 120)))
    with pytest.raises(ValueError, match="conflicts with 'ts_year'"):  # two time transforms of one column
        with table.update_spec() as update:
            update.remove_field("ts_month").add_field("ts", "year").add_field("ts", "hour", "ts_h")
    assert table.metadata["default-spec-id"] == 2
    with table.update_spec() as update:
        update.remove_field("ts_month").add_field("ts", "hour").add_field("cat", "void", "cat_void")
    table.append(rows(range(120, 160)))

    files = table.inspect.files().to_pylist()
    assert {f["spec_id"] for f in files} == {0, 1, 2, 3}
    everything = range(160)
    assert ids(table) == list(everything)
    for text, keep in [
        ("cat = 'c1'", lambda r: r["cat"] == "c1"),
        ("ts >= '2024-02-01T00:00:00'", lambda r: r["ts"] >= datetime.datetime(2024, 2, 1)),
        ("id in (3, 57, 99, 141)", lambda r: r["id"] in (3, 57, 99, 141)),
        ("name >= 'n0150'", lambda r: r["name"] >= "n0150"),
        ("cat is null", lambda r: r["cat"] is None),
    ]:
        assert ids(table, text) == expected(everything, keep), text
    partitions = table.inspect.partitions()
    assert sum(partitions.column("record_count").to_pylist()) == 160
    assert set(partitions.column("spec_id").to_pylist()) == {0, 1, 2, 3}
    assert table.verify().ok


def test_pruning_uses_each_files_spec(table):
    table.update_spec().add_identity("cat").commit()
    table.append(rows(range(40, 100)))
    planned = table.scan(row_filter="cat = 'c2'").plan_files()
    # the unpartitioned file of spec 0 is kept; of spec 1's files only partition c2
    kept = {(t.spec_id, tuple(t.partition)) for t in planned}
    assert kept == {(0, ()), (1, ("c2",))}


def test_delete_by_filter_on_mixed_specs(table):
    table.update_spec().add_field("ts", "month").add_identity("cat").commit()
    table.append(rows(range(40, 100)))
    table.update_spec().remove_field("cat").commit()
    table.append(rows(range(100, 130)))
    table.delete("cat = 'c0'")  # whole partitions in spec 1, rows in spec 0 and 2 files
    keep = lambda r: r["cat"] != "c0"  # noqa: E731
    assert ids(table) == expected(range(130), keep)
    table.delete("ts < '2024-02-01T00:00:00' and id > 10")
    keep2 = lambda r: keep(r) and not (r["ts"] < datetime.datetime(2024, 2, 1) and r["id"] > 10)  # noqa: E731
    assert ids(table) == expected(range(130), keep2)
    reloaded = EncryptedTable.load(table.location, kms=table.kms_client)
    assert ids(reloaded) == expected(range(130), keep2) and reloaded.verify().ok


def test_field_ids_are_recycled_and_specs_reused(tmp_path):
    kms = MemoryKms.with_iceberg_test_keys()
    v2 = EncryptedTable.create(str(tmp_path / "v2"), SCHEMA, kms=kms, table_key_id=None)
    v2.update_spec().add_field("id", "bucket[4]").add_identity("cat").commit()
    v2.update_spec().remove_field("id_bucket_4").commit()
    assert [f["name"] for f in v2.metadata["partition-specs"][-1]["fields"]] == ["cat"]
    v2.update_spec().add_field("id", "bucket[4]").commit()  # same source and transform: Java reuses 1000
    fields = v2.metadata["partition-specs"][-1]["fields"]
    assert [(f["name"], f["field-id"]) for f in fields] == [("cat", 1001), ("id_bucket_4", 1000)]
    assert v2.metadata["last-partition-id"] == 1001
    # back to an earlier spec's fields: its id is reused, nothing added
    v2.update_spec().remove_field("id_bucket_4").commit()
    assert v2.metadata["default-spec-id"] == 2 and len(v2.metadata["partition-specs"]) == 4

    # (a v1 table's removed field would stay as void; icecrypt commits to v3 tables only)


def test_pyiceberg_agrees(table):
    with table.update_spec() as update:
        update.add_field("ts", "day").add_field("id", "bucket[16]", "shard")
    table.append(rows(range(40, 60)))
    table.update_spec().rename_field("shard", "bucket").remove_field("ts_day").commit()
    static = StaticTable.from_metadata(table.metadata_location)
    assert static.metadata.last_partition_id == table.metadata["last-partition-id"] == 1001
    assert static.metadata.default_spec_id == table.metadata["default-spec-id"] == 2
    specs = static.specs()
    assert [(f.name, str(f.transform), f.field_id) for f in specs[1].fields] == [
        ("ts_day", "day", 1000), ("shard", "bucket[16]", 1001)]
    assert [(f.name, str(f.transform), f.field_id) for f in specs[2].fields] == [("bucket", "bucket[16]", 1001)]
    if not table.encrypted:  # PyIceberg reads the plaintext table's files of every spec
        assert sorted(static.scan().to_arrow().column("id").to_pylist()) == list(range(60))


@pytest.mark.parametrize("build,message", [
    (lambda u: u.add_field("nope", "day"), "no such column"),
    (lambda u: u.add_field("cat", "day"), "does not apply"),
    (lambda u: u.add_field("id", "bucket[x]"), "unknown transform"),
    (lambda u: u.add_field("id", "sideways"), "unknown transform"),
    (lambda u: u.add_identity("cat").add_identity("cat"), "twice"),
    (lambda u: u.add_field("ts", "day").add_field("ts", "month"), "conflicts"),
    (lambda u: u.add_field("id", "bucket[2]", "name"), "column of the schema"),
    (lambda u: u.add_field("id", "bucket[2]", "x").add_field("cat", "identity", "x"), "already added"),
    (lambda u: u.remove_field("ghost"), "no partition field 'ghost'"),
    (lambda u: u.rename_field("ghost", "x"), "no partition field 'ghost'"),
])  # fmt: skip
def test_bad_input_commits_nothing(table, build, message):
    before = table.metadata_location
    with pytest.raises(ValueError, match=message):
        with table.update_spec() as update:
            build(update)
    assert table.refresh().metadata_location == before
    assert len(table.metadata["partition-specs"]) == 1


def test_changes_within_one_update_are_checked(table):
    table.update_spec().add_identity("cat").add_field("ts", "day").commit()
    before = table.metadata_location
    update = table.update_spec()
    update.remove_field("cat")
    with pytest.raises(ValueError, match="removed in this update"):
        update.rename_field("cat", "c")
    with pytest.raises(ValueError, match="added in this update"):
        update.add_field("id", "bucket[2]").remove_field("id_bucket_2")
    with pytest.raises(ValueError, match="redundant"):
        table.update_spec().add_field("ts", "hour").commit()
    assert table.refresh().metadata_location == before
    # the same spec as the default: nothing to commit
    assert table.update_spec().commit() is None
    assert table.update_spec().remove_field("cat").add_identity("cat").commit() is None
    assert table.refresh().metadata_location == before


def test_concurrent_spec_change_from_the_same_base_is_refused(table):
    first, second = table.update_spec(), EncryptedTable.load(table.location, kms=table.kms_client).update_spec()
    first.add_identity("cat").commit()
    second.add_field("ts", "day")
    with pytest.raises(CommitConflictError, match="last partition id|default spec id"):
        second.commit()
    reloaded = EncryptedTable.load(table.location, kms=table.kms_client)
    assert [f.name for f in reloaded.spec.fields] == ["cat"]


@pytest.mark.parametrize("name", TABLE_NAMES)
def test_java_tables_evolve_and_stay_readable(golden_copy, kms, name):
    table, root = golden_copy(name)
    before = table.scan().to_arrow().num_rows
    old_spec = table.metadata["default-spec-id"]
    table.update_spec().add_field("id", "bucket[4]").commit()
    assert table.metadata["default-spec-id"] != old_spec
    sample = table.scan().to_arrow().slice(0, 20)
    table.append(sample)
    fresh = EncryptedTable.load(str(metadata_path(name, root).parent.parent), kms=kms, location_map=table.location_map)
    assert fresh.scan().to_arrow().num_rows == before + 20
    spec_ids = {f["spec_id"] for f in fresh.inspect.files().to_pylist()}
    assert spec_ids == {old_spec, fresh.metadata["default-spec-id"]}
    assert fresh.verify().ok
    static = StaticTable.from_metadata(str(metadata_path(name, root).parent / fresh.metadata_location.rsplit("/", 1)[-1]))
    assert static.metadata.last_partition_id == fresh.metadata["last-partition-id"]


OPERATIONS = {
    "spec": (lambda t: t.update_spec().add_identity("cat").commit(), lambda t: [f.name for f in t.spec.fields], ["cat"]),
    "sort": (lambda t: t.replace_sort_order().desc("id").commit(), lambda t: t.metadata["default-sort-order-id"], 1),
}


def _faulty_table(root):
    kms = MemoryKms.with_iceberg_test_keys()
    fs, handler = failing_filesystem(root)
    t = EncryptedTable.create("wh/t", SCHEMA, kms=kms, table_key_id="keyA", filesystem=fs)
    t.append(rows(range(10)))
    return t, handler, kms


@pytest.mark.parametrize("kind", ["error", "enospc"])
@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_fault_at_each_call_leaves_old_or_new_version(tmp_path, operation, kind):
    """Every counted filesystem call of a spec update and of a sort order replacement,
    failed in turn: the table loads at the old version (nothing of the change) or the new
    one (all of it), reads its rows, verifies, and the operation can be repeated."""
    run, state, changed = OPERATIONS[operation]
    census, handler, _ = _faulty_table(tmp_path / "census")
    handler.plan = FaultPlan()
    run(census)
    calls = handler.plan.count
    assert calls >= 10  # reads of the base, the exclusive create, the hint
    for at in range(1, calls + 1):
        root = tmp_path / f"at{at}"
        table, handler, kms = _faulty_table(root)
        base = table.metadata_location
        unchanged = state(table)
        handler.plan = FaultPlan(at=at, kind=kind)
        try:
            run(table)
        except OSError:
            pass
        assert handler.plan.fired is not None, at
        reloaded = EncryptedTable.load("wh/t", kms=kms, filesystem=failing_filesystem(root)[0])
        now = state(reloaded)
        assert now in (unchanged, changed), at
        assert (reloaded.metadata_location == base) == (now == unchanged), at
        assert ids(reloaded) == list(range(10)) and reloaded.verify().ok, at
        if now == unchanged:
            run(reloaded)
        assert state(reloaded) == changed
        reloaded.append(rows(range(10, 20)))
        assert ids(reloaded) == list(range(20)), at


def test_update_spec_is_public():
    assert UpdateSpec.__module__ == "icecrypt.table.ops.spec"


def test_a_lowered_last_partition_id_does_not_reuse_a_field_id(table):
    """last-partition-id is read from storage: set below the ids the specs use, a new
    field still gets an id no spec has (the id of another field would give partition
    values of one meaning to another)."""
    table.update_spec().add_identity("cat").add_field("ts", "day").commit()
    table.update_spec().remove_field("ts_day").commit()
    path = table.fs_path(table.metadata_location)
    with open(path, encoding="utf-8") as f:
        metadata = without_authenticator(json.load(f))  # written by storage's attacker (or another engine)
    metadata["last-partition-id"] = 999
    with open(path, "w", encoding="utf-8") as f:
        json.dump(metadata, f)
    table = EncryptedTable.load(table.location, kms=table.kms_client)
    table.update_spec().add_field("id", "bucket[2]").commit()
    assert [(f["name"], f["field-id"]) for f in table.metadata["partition-specs"][-1]["fields"]] == [
        ("cat", 1000), ("id_bucket_2", 1002)]
    assert table.metadata["last-partition-id"] == 1002


def test_case_insensitive_columns(table):
    table.update_spec(case_sensitive=False).add_field("TS", "month").commit()
    assert [f.name for f in table.spec.fields] == ["ts_month"]
    with pytest.raises(ValueError, match="no such column"):
        table.update_spec().add_identity("CAT")


def test_struct_fields_are_refused_as_partition_sources(tmp_path):
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("s", pa.struct([pa.field("x", pa.int32())]))])
    t = EncryptedTable.create(str(tmp_path / "t"), schema, kms=MemoryKms.with_iceberg_test_keys(), table_key_id="keyA")
    before = t.metadata_location
    with pytest.raises(ValueError, match="only top-level columns"):
        t.update_spec().add_identity("s.x").commit()
    assert t.refresh().metadata_location == before
    t.append(pa.table({"id": [1], "s": [{"x": 2}]}, schema=schema))


def test_a_renamed_partition_field_shows_its_values_under_the_new_name(tmp_path):
    """The metadata tables name a partition field as the newest spec does, for the files
    of every spec (Java's unified partition type), and `partitions` groups them by value."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import IdentityTransform

    data = pa.table({"id": pa.array([1, 2], pa.int64()), "cat": ["a", "b"]})
    t = EncryptedTable.create(str(tmp_path / "r"), data.schema, kms=None, table_key_id=None,
                              partition_spec=PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "cat")))
    t.append(data)
    with t.update_spec() as update:
        update.rename_field("cat", "category")
    # no file of the new spec yet: `partitions` (typed by the snapshot's specs) keeps the values
    assert sorted(str(p["partition"]) for p in t.inspect.partitions().to_pylist()) == [
        "{'cat': 'a'}", "{'cat': 'b'}"]
    t.append(data)
    assert sorted((f["spec_id"], str(f["partition"])) for f in t.inspect.files().to_pylist()) == [
        (0, "{'category': 'a'}"), (0, "{'category': 'b'}"), (1, "{'category': 'a'}"), (1, "{'category': 'b'}")]
    assert sorted((str(p["partition"]), p["record_count"], p["file_count"]) for p in t.inspect.partitions().to_pylist()) == [
        ("{'category': 'a'}", 2, 2), ("{'category': 'b'}", 2, 2)]

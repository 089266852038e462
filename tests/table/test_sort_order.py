"""Sort orders (``replace_sort_order``): order ids as Java assigns them, PyIceberg
agreeing, writers sorting the rows within each new file by the default order (every
transform, both directions, both null placements) and recording its id, the ``sort``
strategy of ``rewrite_data_files``, and bad input committing nothing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pytest
from forgery import without_authenticator
from pyiceberg.table import StaticTable
from tablelib import TABLE_NAMES

from icecrypt.errors import CommitConflictError
from icecrypt.kms.memory import MemoryKms
from icecrypt.table import EncryptedTable, ReplaceSortOrder, read_task

SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False),
    pa.field("cat", pa.string()),
    pa.field("score", pa.int32()),
])  # fmt: skip


def rows(ids) -> pa.Table:
    ids = list(ids)
    return pa.table({
        "id": ids,
        "cat": [None if i % 5 == 0 else f"c{(i * 7) % 4}" for i in ids],
        "score": [None if i % 6 == 0 else (i * 37) % 101 for i in ids],
    }, schema=SCHEMA)  # fmt: skip


@pytest.fixture(params=["encrypted", "plaintext"])
def table(request, tmp_path):
    kms = MemoryKms.with_iceberg_test_keys()
    key = "keyA" if request.param == "encrypted" else None
    t = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id=key)
    t.kms_client = kms
    return t


def file_rows(table) -> list[tuple[dict, list[dict]]]:
    """(files-table row, the file's rows in stored order) of each live data file."""
    out = []
    for task in table.scan().plan_files():
        rows_in_file = pa.Table.from_batches(list(read_task(task, table.filesystem)))
        out.append((task.file, rows_in_file.to_pylist()))
    return out


def test_written_files_are_sorted_by_the_default_order(table):
    with table.replace_sort_order() as order:
        order.asc("cat", null_order="nulls-last").desc("score")
    assert table.metadata["default-sort-order-id"] == 1
    assert table.metadata["sort-orders"][-1]["fields"] == [
        {"transform": "identity", "source-id": 2, "direction": "asc", "null-order": "nulls-last"},
        {"transform": "identity", "source-id": 3, "direction": "desc", "null-order": "nulls-last"},
    ]
    table.append(rows(range(200)))
    files = file_rows(table)
    assert files
    assert {r["sort_order_id"] for r in table.inspect.files().to_pylist()} == {1}
    for _, stored in files:
        cats = [r["cat"] for r in stored]
        assert cats == sorted(cats, key=lambda c: (c is None, c or ""))
        for cat in set(cats):
            scores = [r["score"] for r in stored if r["cat"] == cat]
            assert scores == sorted(scores, key=lambda s: (s is None, -(s or 0)))
    assert sorted(r["id"] for _, stored in files for r in stored) == list(range(200))


@pytest.mark.parametrize("transform,column", [("bucket[4]", "id"), ("truncate[10]", "score"), ("truncate[1]", "cat")])
def test_transforms_on_sort_keys(table, transform, column):
    from pyiceberg.transforms import parse_transform
    from pyiceberg.types import IntegerType, LongType, StringType

    source = {"id": LongType(), "score": IntegerType(), "cat": StringType()}[column]
    apply = parse_transform(transform).transform(source)
    table.replace_sort_order().desc(column, transform, null_order="nulls-first").asc("id").commit()
    table.append(rows(range(120)))
    for _, stored in file_rows(table):
        keys = [(apply(r[column]) if r[column] is not None else None, r["id"]) for r in stored]
        expected = sorted(keys, key=lambda k: (k[0] is not None, k[0] if k[0] is None else _neg(k[0]), k[1]))
        assert keys == expected


def _neg(value):
    return -value if isinstance(value, int) else tuple(-b for b in value.encode())


def test_order_ids_as_java(table):
    table.replace_sort_order().asc("id").commit()
    table.replace_sort_order().desc("score").commit()
    assert table.metadata["default-sort-order-id"] == 2
    table.replace_sort_order().asc("id").commit()  # the same fields: id 1 again, nothing added
    assert table.metadata["default-sort-order-id"] == 1 and len(table.metadata["sort-orders"]) == 3
    before = table.metadata_location
    assert table.replace_sort_order().asc("id").commit() is None  # already the default
    assert table.metadata_location == before
    table.replace_sort_order().commit()  # no field: unsorted
    assert table.metadata["default-sort-order-id"] == 0
    table.append(rows(range(10)))
    assert {r["sort_order_id"] for r in table.inspect.files().to_pylist()} == {0}


def test_pyiceberg_agrees(table):
    table.replace_sort_order().desc("cat", "truncate[2]", null_order="nulls-first").asc("id").commit()
    static = StaticTable.from_metadata(table.metadata_location)
    order = static.sort_order()
    assert order.order_id == 1
    assert [(f.source_id, str(f.transform), f.direction.value, f.null_order.value) for f in order.fields] == [
        (2, "truncate[2]", "desc", "nulls-first"), (1, "identity", "asc", "nulls-first")]


@pytest.mark.parametrize("build,message", [
    (lambda o: o.asc("nope"), "no such column"),
    (lambda o: o.asc("cat", "day"), "does not apply"),
    (lambda o: o.asc("id", "bucket[0"), "unknown transform"),
    (lambda o: o.asc("id", null_order="sometimes"), "null order"),
    (lambda o: o.asc("id").desc("id"), "twice"),
])  # fmt: skip
def test_bad_input_commits_nothing(table, build, message):
    before = table.metadata_location
    with pytest.raises(ValueError, match=message):
        with table.replace_sort_order() as order:
            build(order)
    assert table.refresh().metadata_location == before and table.metadata["default-sort-order-id"] == 0


def test_concurrent_replacement_from_the_same_base_is_refused(table):
    first = table.replace_sort_order()
    second = EncryptedTable.load(table.location, kms=table.kms_client).replace_sort_order()
    first.asc("id").commit()
    with pytest.raises(CommitConflictError, match="default sort order id"):
        second.desc("score").commit()
    assert EncryptedTable.load(table.location, kms=table.kms_client).metadata["default-sort-order-id"] == 1


def test_rewrite_with_the_sort_strategy(table):
    for start in range(0, 100, 20):  # unsorted files
        table.append(rows(range(start, start + 20)))
    with pytest.raises(ValueError, match="unsorted and no sort order"):
        table.rewrite_data_files(strategy="sort", options={"rewrite-all": "true"})
    with pytest.raises(ValueError, match="unknown rewrite strategy"):
        table.rewrite_data_files(strategy="zorder")
    result = table.rewrite_data_files(options={"rewrite-all": "true", "strategy": "sort", "sort-order": "score DESC NULLS LAST, id"})
    assert result.rewritten_data_files == 5 and result.added_data_files == 1
    (_, stored), = file_rows(table)
    assert [r["id"] for r in stored] == [r["id"] for r in sorted(rows(range(100)).to_pylist(),
                                                              key=lambda r: (r["score"] is None, -(r["score"] or 0), r["id"]))]
    assert {r["sort_order_id"] for r in table.inspect.files().to_pylist()} == {0}  # not one of the table's orders
    table.replace_sort_order().asc("cat").commit()
    table.rewrite_data_files(strategy="sort", options={"rewrite-all": "true"})
    (_, stored), = file_rows(table)
    cats = [r["cat"] for r in stored]
    assert cats == sorted(cats, key=lambda c: (c is not None, c or ""))  # asc: nulls first
    assert {r["sort_order_id"] for r in table.inspect.files().to_pylist()} == {1}
    assert sorted(r["id"] for r in stored) == list(range(100)) and table.verify().ok


@pytest.mark.parametrize("name", TABLE_NAMES)
def test_java_tables_take_a_sort_order(golden_copy, kms, name):
    table, _ = golden_copy(name)
    before = table.scan().to_arrow().num_rows
    table.replace_sort_order().desc("id").commit()
    sample = table.scan().to_arrow().slice(0, 50)
    table.append(sample)
    assert table.scan().to_arrow().num_rows == before + 50
    newest = max(table.snapshots(), key=lambda s: s.sequence_number).snapshot_id
    added = [f for f in table.inspect.files().to_pylist() if f["sort_order_id"] == 1]
    assert added and table.verify().ok and newest == table.current_snapshot_id


def test_replace_sort_order_is_public():
    assert ReplaceSortOrder.__module__ == "icecrypt.table.ops.sort_order"


def test_struct_fields_sort_and_lists_are_refused(tmp_path):
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("s", pa.struct([pa.field("x", pa.int32())])),
                        pa.field("l", pa.list_(pa.int32()))])  # fmt: skip
    t = EncryptedTable.create(str(tmp_path / "t"), schema, kms=MemoryKms.with_iceberg_test_keys(), table_key_id="keyA")
    with pytest.raises(ValueError, match="inside a list or map"):
        t.replace_sort_order().asc("l.element").commit()
    with pytest.raises(ValueError, match="not a primitive"):
        t.replace_sort_order().asc("s").commit()
    t.replace_sort_order().desc("s.x").commit()
    t.append(pa.table({"id": [1, 2, 3, 4], "s": [{"x": 3}, {"x": None}, {"x": 9}, {"x": 1}], "l": [[1]] * 4},
                      schema=schema))  # fmt: skip
    ((_, stored),) = file_rows(t)
    assert [r["id"] for r in stored] == [3, 1, 4, 2]  # desc, nulls last


def test_an_order_the_schema_cannot_serve_is_not_claimed(table):
    """An order read from storage whose source column is not in the current schema (a
    dropped column, or a damaged file): new files are written unsorted and record order
    0 rather than claim an order they do not follow; the append does not fail."""
    table.replace_sort_order().asc("score").commit()
    path = table.fs_path(table.metadata_location)
    with open(path, encoding="utf-8") as f:
        metadata = without_authenticator(json.load(f))  # written by storage's attacker (or another engine)
    metadata["sort-orders"][-1]["fields"][0]["source-id"] = 99
    with open(path, "w", encoding="utf-8") as f:
        json.dump(metadata, f)
    table = EncryptedTable.load(table.location, kms=table.kms_client)
    table.append(rows(range(10)))
    assert table.inspect.data_files().column("sort_order_id").to_pylist() == [0]
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == list(range(10))


@pytest.mark.parametrize("transform,source", [("bogus", 1), ("bucket[0]", 1), ("truncate[0]", 2), ("day", 2)])
def test_an_order_no_writer_can_follow_is_refused_before_writing(table, transform, source):
    """A default order read from storage with an unknown transform, a zero bucket count
    or width, or a transform that cannot apply to its column: the write is refused with
    a FormatError naming the table, before any data file is written."""
    from icecrypt.errors import FormatError

    table.replace_sort_order().asc("id").commit()
    path = table.fs_path(table.metadata_location)
    with open(path, encoding="utf-8") as f:
        metadata = without_authenticator(json.load(f))  # written by storage's attacker (or another engine)
    metadata["sort-orders"][-1]["fields"][0].update({"transform": transform, "source-id": source})
    with open(path, "w", encoding="utf-8") as f:
        json.dump(metadata, f)
    table = EncryptedTable.load(table.location, kms=table.kms_client)
    before = table.metadata_location
    with pytest.raises(FormatError, match=rf"sort order 1: transform '{re.escape(transform)}'"):
        table.append(rows(range(10)))
    assert table.refresh().metadata_location == before
    data_dir = Path(table.fs_path(table.location)) / "data"
    assert not data_dir.exists() or not any(p.is_file() for p in data_dir.rglob("*"))

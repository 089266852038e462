"""Partition evolution and sort orders on a catalog table: the compare-and-swap through
the committer, a lost race with an append replayed on the catalog's newer version, a
race with another spec change refused."""

from __future__ import annotations

import pyarrow as pa
import pytest

from icecrypt.catalog import load_catalog
from icecrypt.table.model.changes import RequirementFailed

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("cat", pa.string())])


@pytest.fixture
def two(warehouse, kms):
    catalog = load_catalog("test", warehouse=warehouse, kms=kms)
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", SCHEMA, table_key_id="keyA", properties={"commit.retry.min-wait-ms": "1"})
    table.append(pa.table({"id": [0, 1], "cat": ["a", "b"]}, schema=SCHEMA))
    return catalog, table, catalog.load_table("db.t")


def test_spec_and_order_through_the_catalog(two, race_once):
    catalog, mine, theirs = two
    race_once(lambda: theirs.append(pa.table({"id": [9], "cat": ["c"]}, schema=SCHEMA)))
    mine.update_spec().add_identity("cat").commit()  # lost the swap once, replayed on theirs
    mine.replace_sort_order().desc("id").commit()
    mine.append(pa.table({"id": [3, 5, 4], "cat": ["a", "a", "a"]}, schema=SCHEMA))
    loaded = catalog.load_table("db.t")
    assert loaded.metadata_location == mine.metadata_location
    assert [f.name for f in loaded.spec.fields] == ["cat"] and loaded.metadata["default-sort-order-id"] == 1
    files = loaded.inspect.data_files().to_pylist()
    assert sorted((f["spec_id"], f["sort_order_id"]) for f in files) == [(0, 0), (0, 0), (1, 1)]
    assert sorted(loaded.scan(row_filter="cat = 'a'").to_arrow().column("id").to_pylist()) == [0, 3, 4, 5]
    assert loaded.verify().ok


def test_a_spec_change_refused_when_another_landed_first(two, race_once):
    catalog, mine, theirs = two
    update = mine.update_spec().add_field("id", "bucket[4]")
    race_once(lambda: theirs.update_spec().add_identity("cat").commit())
    with pytest.raises(RequirementFailed, match="last partition id changed concurrently"):
        update.commit()
    loaded = catalog.load_table("db.t")
    assert loaded.metadata_location == theirs.metadata_location
    assert [f.name for f in loaded.spec.fields] == ["cat"]

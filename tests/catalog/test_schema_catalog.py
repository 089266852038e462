"""Schema evolution on a catalog table: the committer's compare-and-swap; an append that
won the race is kept and the schema change replayed on top of it; a schema change that
won the race refuses the second one (its requirements fail), nothing committed."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyiceberg.types import LongType, StringType

from icecrypt.catalog import load_catalog
from icecrypt.table.model.changes import RequirementFailed

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("qty", pa.int32())])


@pytest.fixture
def two(warehouse, kms):
    catalog = load_catalog("test", warehouse=warehouse, kms=kms)
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", SCHEMA, table_key_id="keyA", properties={"commit.retry.min-wait-ms": "1"})
    table.append(pa.table({"id": [1], "qty": [2]}, schema=SCHEMA))
    return catalog, table, catalog.load_table("db.t")


def test_schema_change_replayed_over_a_concurrent_append(two, race_once):
    catalog, mine, theirs = two
    update = mine.update_schema().add_column("region", StringType()).update_column("qty", field_type=LongType())
    race_once(lambda: theirs.append(pa.table({"id": [9], "qty": [3]}, schema=SCHEMA)))
    update.commit()
    loaded = catalog.load_table("db.t")
    assert loaded.metadata_location == mine.metadata_location
    assert loaded.current_snapshot_id == theirs.current_snapshot_id  # their append kept
    rows = loaded.scan().to_arrow().sort_by("id")
    assert rows.column("qty").type == pa.int64() and rows.column("qty").to_pylist() == [2, 3]
    assert rows.column("region").null_count == 2 and loaded.verify().ok


def test_second_schema_change_refused_through_the_catalog(two, race_once):
    catalog, mine, theirs = two
    update = mine.update_schema().add_column("a", StringType())
    race_once(lambda: theirs.update_schema().add_column("b", StringType()).commit())
    with pytest.raises(RequirementFailed, match="changed concurrently"):
        update.commit()
    loaded = catalog.load_table("db.t")
    assert loaded.metadata_location == theirs.metadata_location
    assert [f.name for f in loaded.schema.fields] == ["id", "qty", "b"]

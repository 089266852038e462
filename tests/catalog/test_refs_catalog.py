"""Refs and properties on a catalog table: the committer's compare-and-swap, a lost race
replayed on the catalog's newer version, a requirement that fails there refused."""

from __future__ import annotations

import pyarrow as pa
import pytest

from icecrypt.catalog import load_catalog
from icecrypt.table.model.changes import RequirementFailed

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False)])


@pytest.fixture
def two(warehouse, kms):
    catalog = load_catalog("test", warehouse=warehouse, kms=kms)
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", SCHEMA, table_key_id="keyA", properties={"commit.retry.min-wait-ms": "1"})
    ids = [table.append(pa.table({"id": [i]}, schema=SCHEMA)) for i in range(2)]
    return catalog, table, catalog.load_table("db.t"), ids


def test_refs_and_properties_through_the_catalog(two, race_once):
    catalog, mine, theirs, ids = two
    with mine.manage_snapshots() as ms:
        ms.create_tag("v1", ids[0]).create_branch("audit")
    race_once(lambda: theirs.append(pa.table({"id": [9]}, schema=SCHEMA)))
    with mine.update_properties() as props:
        props.set("owner", "ops")  # lost the swap once, replayed on theirs
    loaded = catalog.load_table("db.t")
    assert loaded.metadata_location == mine.metadata_location
    assert loaded.properties["owner"] == "ops" and set(loaded.metadata["refs"]) == {"main", "v1", "audit"}
    assert sorted(loaded.scan().to_arrow().column("id").to_pylist()) == [0, 1, 9] and loaded.verify().ok


def test_a_rollback_refused_when_main_moved_in_the_catalog(two, race_once):
    catalog, mine, theirs, ids = two
    rollback = mine.manage_snapshots().rollback_to_snapshot(ids[0])
    race_once(lambda: theirs.append(pa.table({"id": [9]}, schema=SCHEMA)))
    with pytest.raises(RequirementFailed, match="'main' moved concurrently"):
        rollback.commit()
    loaded = catalog.load_table("db.t")
    assert loaded.metadata_location == theirs.metadata_location
    assert loaded.current_snapshot_id == theirs.current_snapshot_id not in ids

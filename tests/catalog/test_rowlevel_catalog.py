"""Row-level changes on a table of the SQL catalog (SQLite): commits through the
catalog's compare-and-swap, conflicts detected between two table objects."""

from __future__ import annotations

import pyarrow as pa
import pytest

from icecrypt.catalog import load_catalog
from icecrypt.errors import CommitConflictError

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string())])


def rows(ids, prefix="r") -> pa.Table:
    ids = list(ids)
    return pa.table({"id": ids, "name": [f"{prefix}{i}" for i in ids]}, schema=SCHEMA)


def test_upsert_and_merge_through_the_catalog_and_a_stale_writer_conflicts(warehouse, kms, monkeypatch):
    mode = "merge-on-read"
    catalog = load_catalog("test", warehouse=warehouse, kms=kms)
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", SCHEMA, table_key_id="keyA",
                                 properties={"write.merge.mode": mode, "write.update.mode": mode})  # fmt: skip
    table.append(rows(range(6)))
    stale = catalog.load_table("db.t")
    result = table.upsert(rows([1, 9], "u"), ["id"])
    assert (result.rows_updated, result.rows_inserted) == (1, 1)
    # the stale object's merge is planned after a refresh: it sees the upsert and lands
    merged = stale.merge(rows([9]), ["id"], when_matched_delete=True)
    assert merged.rows_deleted == 1
    loaded = catalog.load_table("db.t")
    assert sorted((r["id"], r["name"]) for r in loaded.scan().to_arrow().to_pylist()) == [
        (0, "r0"), (1, "u1"), (2, "r2"), (3, "r3"), (4, "r4"), (5, "r5")]  # fmt: skip
    # a real race: the other object commits between this update's planning and its commit
    from icecrypt.table.ops import write as _write

    original = _write._commit_change

    def racing(*args, **kwargs):
        monkeypatch.setattr(_write, "_commit_change", original)
        loaded.update({"name": "theirs"}, where="id = 2")
        return original(*args, **kwargs)

    monkeypatch.setattr(_write, "_commit_change", racing)
    with pytest.raises(CommitConflictError, match="update conflicts with snapshot"):
        table.update({"name": "mine"}, where="id = 2")
    assert catalog.load_table("db.t").scan(row_filter="id = 2").to_arrow().column("name").to_pylist() == ["theirs"]

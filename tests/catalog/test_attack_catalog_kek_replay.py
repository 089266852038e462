"""A storage attacker against a catalog table's KEKs (issue 16, item 5): the catalog keeps
the metadata location where storage cannot reach, but the file it points to is in storage.
The attacker rewrites it in place with an old KEK's wrapped bytes first under a fresh id;
writers refuse to wrap under it, and nothing is written or committed."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import pyarrow as pa
import pytest
from forgery import forget_recorded_digest, without_authenticator

from icecrypt.errors import ReplayedKeyError

SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("name", pa.string())])


def _rows(start: int) -> pa.Table:
    return pa.table({"id": list(range(start, start + 5)), "name": [f"n{i}" for i in range(5)]}, schema=SCHEMA)


def _files(root: str) -> set[str]:
    return {str(p) for p in Path(root).rglob("*") if p.is_file() and not p.name.startswith("catalog.db")}


def test_a_catalog_table_refuses_an_old_kek_put_back_in_its_current_file(sqlite_catalog, warehouse):
    sqlite_catalog.create_namespace("db")
    table = sqlite_catalog.create_table("db.t", SCHEMA, table_key_id="keyA")
    table.append(_rows(0))
    old = table.encryption_manager.current_kek()
    table.rotate_keys(new_kek=True)
    table.append(_rows(100))
    current = Path(table.metadata_location)
    metadata = without_authenticator(json.loads(current.read_text()))
    metadata["encryption-keys"].insert(0, {
        "key-id": "cmVwbGF5ZWQtY2F0YWxvZy1rZWs=", "encrypted-by-id": "keyA",
        "encrypted-key-metadata": base64.b64encode(old.encrypted_key_metadata).decode(),
        "properties": {"KEY_TIMESTAMP": str(time.time_ns() // 1_000_000)},
    })
    current.write_text(json.dumps(metadata))  # in place: the catalog still points here
    forget_recorded_digest(table)  # (the digest refuses the edit first: the KEK checks are tested here)
    before = _files(warehouse)
    fresh = sqlite_catalog.load_table("db.t")
    with pytest.raises(ReplayedKeyError, match="cmVwbGF5ZWQtY2F0YWxvZy1rZWs="):
        fresh.append(_rows(200))
    assert _files(warehouse) == before
    assert sqlite_catalog.load_table("db.t").metadata_location == str(current)  # nothing committed
    # the recovery: a fresh KEK first
    fresh.rotate_keys(new_kek=True)
    fresh.append(_rows(200))
    assert fresh.encryption_manager.current_kek().key_id not in (old.key_id, "cmVwbGF5ZWQtY2F0YWxvZy1rZWs=")
    assert sorted(sqlite_catalog.load_table("db.t").scan().to_arrow().column("id").to_pylist()) == \
        list(range(5)) + list(range(100, 105)) + list(range(200, 205))

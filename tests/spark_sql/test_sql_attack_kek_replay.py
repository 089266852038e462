"""The storage attacker of tests/catalog/test_attack_catalog_kek_replay.py against the SQL
catalog: the current metadata file rewritten in place with an old, retired KEK's wrapped
bytes under a fresh id.  Every SQL write refuses to wrap under it -- an INSERT, and the
statements that commit through a staged transaction (CREATE OR REPLACE TABLE ... AS SELECT,
ALTER TABLE) -- and nothing is written or committed."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import MASTER
from forgery import forget_recorded_digest, without_authenticator

pytestmark = pytest.mark.spark

REPLAYED = "cmVwbGF5ZWQtc3FsLWtlaw=="


def _files(root: Path) -> set[str]:
    return {str(p) for p in root.rglob("*") if p.is_file() and not p.name.startswith("catalog.db")}


def test_sql_writes_refuse_a_retired_kek_put_back(new_catalog):
    catalog = new_catalog("sql")
    catalog.sql("CREATE NAMESPACE {c}.db")
    catalog.sql("CREATE TABLE {c}.db.t (id bigint, name string) USING iceberg "
                f"TBLPROPERTIES ('encryption.key-id'='{MASTER}')")
    catalog.sql("INSERT INTO {c}.db.t VALUES (1, 'a')")
    table = catalog.table("db.t")
    old = table.encryption_manager.current_kek()
    table.rotate_keys(new_kek=True)  # the catalog records the old KEK as retired
    table.append(pa.table({"id": pa.array([2], pa.int64()), "name": ["b"]}))
    current = Path(table.metadata_location)
    metadata = without_authenticator(json.loads(current.read_text()))
    metadata["encryption-keys"].insert(0, {
        "key-id": REPLAYED, "encrypted-by-id": MASTER,
        "encrypted-key-metadata": base64.b64encode(old.encrypted_key_metadata).decode(),
        "properties": {"KEY_TIMESTAMP": str(time.time_ns() // 1_000_000)},
    })
    current.write_text(json.dumps(metadata))  # in place: the catalog still points here
    before = _files(catalog.warehouse)
    with pytest.raises(Exception, match="changed in place"):  # the catalog's digest refuses the edit first
        catalog.sql("INSERT INTO {c}.db.t VALUES (3, 'c')")
    assert _files(catalog.warehouse) == before
    forget_recorded_digest(table)  # (as if another engine had committed it: the KEK checks are tested here)
    for statement in [
        "INSERT INTO {c}.db.t VALUES (3, 'c')",
        f"CREATE OR REPLACE TABLE {{c}}.db.t USING iceberg TBLPROPERTIES ('encryption.key-id'='{MASTER}') "
        "AS SELECT id, name FROM {c}.db.t",
    ]:
        with pytest.raises(Exception, match=REPLAYED):
            catalog.sql(statement)
        assert _files(catalog.warehouse) == before, statement
        assert catalog.table("db.t").metadata_location == str(current)

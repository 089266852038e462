"""PyIceberg's SqlCatalog and ours on one database: same tables, same metadata locations,
tables registered or created by PyIceberg load here; PyIceberg reads our plaintext
tables and fails (safely: no rows) on encrypted ones."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog as PyIcebergSqlCatalog

from icecrypt.catalog import load_catalog
from icecrypt.table import EncryptedTable

SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("name", pa.string())])
DATA = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "name": pa.array(["a", "b", "c"], pa.string())})


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.servers)])
def catalogs(request, warehouse, kms):
    """(ours, PyIceberg's) on the same database."""
    if request.param == "sqlite":
        ours = load_catalog("shared", warehouse=warehouse, kms=kms)
    else:
        ours = load_catalog("shared", uri=request.getfixturevalue("postgres_uri"), warehouse=warehouse, kms=kms)
    theirs = PyIcebergSqlCatalog("shared", uri=ours.uri, warehouse=f"file://{warehouse}")
    return ours, theirs


def test_pyiceberg_lists_and_locates_our_tables(catalogs):
    ours, theirs = catalogs
    ours.create_namespace("db")
    encrypted = ours.create_table("db.secret", SCHEMA, table_key_id="keyA")
    encrypted.append(DATA)
    plain = ours.create_table("db.plain", SCHEMA, table_key_id=None)
    plain.append(DATA)

    assert theirs.list_namespaces() == [("db",)]
    assert sorted(theirs.list_tables("db")) == [("db", "plain"), ("db", "secret")]
    assert theirs.load_table("db.secret").metadata_location == encrypted.metadata_location
    assert theirs.load_table("db.plain").metadata_location == plain.metadata_location

    # a plaintext table reads in PyIceberg
    assert sorted(theirs.load_table("db.plain").scan().to_arrow()["id"].to_pylist()) == [1, 2, 3]
    # an encrypted one fails there (its files are AGS1 streams), never yields rows
    with pytest.raises(Exception, match="Avro|schema|magic|Parquet"):  # PyIceberg's error types vary
        theirs.load_table("db.secret").scan().to_arrow()


def test_tables_pyiceberg_created_or_registered_load_here(catalogs, kms, tmp_path):
    ours, theirs = catalogs
    theirs.create_namespace("db")
    created = theirs.create_table("db.theirs", schema=SCHEMA)
    created.append(DATA)
    loaded = ours.load_table("db.theirs")
    recorded = loaded.metadata_store.to_recorded(loaded.metadata_location)
    assert recorded == theirs.load_table("db.theirs").metadata_location  # a file:// URI, as PyIceberg wrote it
    assert sorted(loaded.scan().to_arrow()["id"].to_pylist()) == [1, 2, 3]

    path_table = EncryptedTable.create(str(tmp_path / "pathtable"), SCHEMA, kms=kms, table_key_id="keyA")
    path_table.append(DATA)
    theirs.register_table("db.registered", path_table.metadata_location)
    registered = ours.load_table("db.registered")
    assert registered.encrypted
    assert registered.scan().to_arrow().num_rows == 3
    registered.append(DATA)  # our commit through the shared catalog; PyIceberg sees it
    assert theirs.load_table("db.registered").metadata_location == registered.metadata_store.to_recorded(
        registered.metadata_location
    )
    assert ours.list_tables("db") == [("db", "registered"), ("db", "theirs")]
    # and PyIceberg reads what it wrote after our catalog loaded it (nothing changed there)
    assert theirs.load_table("db.theirs").scan().to_arrow().num_rows == 3

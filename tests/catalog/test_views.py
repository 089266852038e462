"""Views of the SQL catalog (SQLite and PostgreSQL): Iceberg view metadata, recorded in
the JDBC catalog's own rows (``iceberg_type = 'VIEW'``) with its SHA-256; what storage
holds is checked against it on every load."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType

from icecrypt.catalog import NamespaceNotEmptyError, NoSuchNamespaceError, load_catalog
from icecrypt.errors import CatalogError, NoSuchViewError, TableIntegrityError, ViewAlreadyExistsError

SCHEMA = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "name", StringType(), required=False))


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.servers)])
def catalog(request, warehouse, kms):
    if request.param == "sqlite":
        c = load_catalog("test", warehouse=warehouse, kms=kms)
    else:
        c = load_catalog("test", uri=request.getfixturevalue("postgres_uri"), warehouse=warehouse, kms=kms)
    c.create_namespace("db")
    return c


def test_create_replace_rename_drop(catalog, warehouse):
    view = catalog.create_view("db.v", "SELECT id, name FROM db.t", SCHEMA, default_catalog="enc",
                               default_namespace="db", properties={"comment": "all"})  # fmt: skip
    assert (view.version_id, view.sql, view.dialect, view.default_catalog, view.default_namespace) == \
        (1, "SELECT id, name FROM db.t", "spark", "enc", ("db",))
    assert view.schema == SCHEMA and view.properties == {"comment": "all"}
    assert view.location == f"{warehouse}/db/v" and view.metadata_location.startswith(f"{warehouse}/db/v/metadata/00000-")
    assert catalog.list_views("db") == [("db", "v")] and catalog.list_tables("db") == []
    assert catalog.view_exists("db.v") and not catalog.table_exists("db.v")
    with pytest.raises(ViewAlreadyExistsError):
        catalog.create_view("db.v", "SELECT 1", SCHEMA)
    again = catalog.create_view("db.v", "SELECT id FROM db.t", Schema(SCHEMA.fields[0]), replace=True)
    assert again.view_uuid == view.view_uuid and again.version_id == 2 and again.sql == "SELECT id FROM db.t"
    assert [s["schema-id"] for s in again.document["schemas"]] == [0, 1]
    assert again.metadata_location.startswith(f"{warehouse}/db/v/metadata/00001-")
    catalog.rename_view("db.v", "db.w")
    assert catalog.list_views("db") == [("db", "w")] and catalog.load_view("db.w").version_id == 2
    with pytest.raises(NoSuchViewError):
        catalog.load_view("db.v")
    catalog.create_namespace("other")
    with pytest.raises(NoSuchNamespaceError):
        catalog.rename_view("db.w", "nowhere.w")
    with pytest.raises(NamespaceNotEmptyError):
        catalog.drop_namespace("db")
    catalog.drop_view("db.w")
    with pytest.raises(NoSuchViewError):
        catalog.drop_view("db.w")
    assert catalog.list_views("db") == []
    catalog.drop_namespace("db")


def test_tables_and_views_share_names(catalog):
    import pyarrow as pa

    catalog.create_table("db.t", pa.schema([pa.field("id", pa.int64())]), table_key_id="keyA")
    with pytest.raises(ViewAlreadyExistsError, match="a table of that name exists"):
        catalog.create_view("db.t", "SELECT 1", SCHEMA)
    catalog.create_view("db.v", "SELECT 1", SCHEMA)
    with pytest.raises(ViewAlreadyExistsError, match="the name is taken"):
        catalog.rename_view("db.v", "db.t")
    from icecrypt.catalog import TableAlreadyExistsError

    with pytest.raises(TableAlreadyExistsError):
        catalog.create_table("db.v", pa.schema([pa.field("id", pa.int64())]), table_key_id="keyA")
    with pytest.raises(NoSuchNamespaceError):
        catalog.create_view("nope.v", "SELECT 1", SCHEMA)
    with pytest.raises(ValueError, match="empty"):
        catalog.create_view("db.blank", "  ", SCHEMA)


def test_what_storage_holds_is_checked(catalog):
    view = catalog.create_view("db.v", "SELECT id FROM db.t WHERE id < 10", SCHEMA)
    path = Path(view.metadata_location)
    original = path.read_bytes()
    changed = json.loads(original)
    changed["versions"][0]["representations"][0]["sql"] = "SELECT id FROM db.secrets"
    path.write_text(json.dumps(changed))
    with pytest.raises(TableIntegrityError, match="view db.v: view metadata .* is not the file the catalog recorded"):
        catalog.load_view("db.v")
    path.write_bytes(original + b" ")
    with pytest.raises(TableIntegrityError):
        catalog.load_view("db.v")
    path.write_bytes(original)
    assert catalog.load_view("db.v").sql == "SELECT id FROM db.t WHERE id < 10"
    path.unlink()
    with pytest.raises(CatalogError, match="cannot be read"):
        catalog.load_view("db.v")


def test_java_jdbc_rows_and_a_catalog_without_the_type_column(warehouse, kms, tmp_path):
    catalog = load_catalog("test", warehouse=warehouse, kms=kms)
    catalog.create_namespace("db")
    view = catalog.create_view("db.v", "SELECT 1", SCHEMA)
    with sqlite3.connect(Path(warehouse) / "catalog.db") as db:
        rows = db.execute("SELECT table_namespace, table_name, metadata_location, iceberg_type FROM iceberg_tables "
                          "WHERE catalog_name = 'test'").fetchall()
    assert rows == [("db", "v", view.metadata_location, "VIEW")]  # as Iceberg Java's JdbcCatalog keeps views
    # a catalog made before views (no iceberg_type column) keeps none
    old = tmp_path / "old.db"
    with sqlite3.connect(old) as db:
        db.execute("CREATE TABLE iceberg_tables (catalog_name VARCHAR(255) NOT NULL, table_namespace VARCHAR(255) "
                   "NOT NULL, table_name VARCHAR(255) NOT NULL, metadata_location VARCHAR(1000), "
                   "previous_metadata_location VARCHAR(1000), PRIMARY KEY (catalog_name, table_namespace, table_name))")
    v0 = load_catalog("old", uri=f"sqlite:///{old}", warehouse=str(tmp_path / "wh"), kms=kms)
    v0.create_namespace("db")
    with pytest.raises(CatalogError, match="keeps no views"):
        v0.create_view("db.v", "SELECT 1", SCHEMA)
    assert v0.list_views("db") == []

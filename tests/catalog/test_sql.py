"""The SQL catalog (SQLite embedded default and PostgreSQL): namespaces, tables, commits
through the catalog, errors."""

from __future__ import annotations

import os
import sqlite3

import pyarrow as pa
import pytest

from icecrypt.catalog import (
    CatalogError,
    InvalidIdentifierError,
    NamespaceAlreadyExistsError,
    NamespaceNotEmptyError,
    NoSuchNamespaceError,
    NoSuchTableError,
    SqlCatalog,
    TableAlreadyExistsError,
    load_catalog,
)
from icecrypt.errors import CommitConflictError
from icecrypt.table import EncryptedTable
from icecrypt.table.ops import write as w

SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("name", pa.string())])


def rows(start: int, n: int) -> pa.Table:
    return pa.table({"id": list(range(start, start + n)), "name": [f"r{i}" for i in range(start, start + n)]})


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.servers)])
def catalog(request, warehouse, kms):
    if request.param == "sqlite":
        return load_catalog("test", warehouse=warehouse, kms=kms)
    uri = request.getfixturevalue("postgres_uri")
    return load_catalog("test", uri=uri, warehouse=warehouse, kms=kms)


def test_embedded_default_is_sqlite_next_to_the_warehouse(warehouse, kms):
    catalog = load_catalog("local", warehouse=warehouse, kms=kms)
    assert isinstance(catalog, SqlCatalog)
    assert catalog.uri == f"sqlite:///{os.path.join(warehouse, 'catalog.db')}"
    catalog.create_namespace("db")
    with sqlite3.connect(os.path.join(warehouse, "catalog.db")) as conn:
        names = {r[0] for r in conn.execute("select name from sqlite_master where type = 'table'")}
        assert {"iceberg_tables", "iceberg_namespace_properties"} <= names
        assert conn.execute("select * from iceberg_namespace_properties").fetchall() == [("local", "db", "exists", "true")]
    # a file:// warehouse names the same place
    assert load_catalog("local", warehouse=f"file://{warehouse}").uri == catalog.uri


def test_namespaces(catalog):
    assert catalog.list_namespaces() == []
    catalog.create_namespace("db", {"owner": "me"})
    catalog.create_namespace(("db", "sub"))
    assert catalog.namespace_exists("db") and catalog.namespace_exists("db.sub")
    assert not catalog.namespace_exists("other")
    assert catalog.list_namespaces() == [("db",), ("db", "sub")]
    with pytest.raises(NamespaceAlreadyExistsError, match="db"):
        catalog.create_namespace("db")
    with pytest.raises(NoSuchNamespaceError, match="nope"):
        catalog.drop_namespace("nope")
    catalog.drop_namespace("db.sub")
    assert catalog.list_namespaces() == [("db",)]
    with pytest.raises(InvalidIdentifierError):
        catalog.create_namespace("a..b")


def test_namespace_properties(catalog):
    catalog.create_namespace("db", {"owner": "me", "comment": "orders"})
    assert catalog.namespace_properties("db") == {"owner": "me", "comment": "orders"}
    catalog.update_namespace_properties("db", removals=["comment"], updates={"owner": "you", "team": "x"})
    assert catalog.namespace_properties("db") == {"owner": "you", "team": "x"}
    catalog.update_namespace_properties("db", removals=["absent"])  # removing what is not there: nothing
    assert catalog.namespace_properties("db") == {"owner": "you", "team": "x"}
    with pytest.raises(ValueError, match="both removed and set"):
        catalog.update_namespace_properties("db", removals=["team"], updates={"team": "y"})
    with pytest.raises(ValueError, match="'exists'"):
        catalog.update_namespace_properties("db", updates={"exists": "false"})
    assert catalog.namespace_properties("db") == {"owner": "you", "team": "x"}
    with pytest.raises(NoSuchNamespaceError, match="nope"):
        catalog.namespace_properties("nope")
    with pytest.raises(NoSuchNamespaceError, match="nope"):
        catalog.update_namespace_properties("nope", updates={"a": "b"})
    catalog.create_namespace("bare")
    assert catalog.namespace_properties("bare") == {}
    catalog.update_namespace_properties("bare", updates={"a": "b"})
    assert catalog.namespace_properties("bare") == {"a": "b"}
    assert catalog.list_namespaces() == [("bare",), ("db",)]


def test_create_append_load_encrypted(catalog):
    catalog.create_namespace("db")
    table = catalog.create_table("db.events", SCHEMA, table_key_id="keyA", properties={"owner": "test"})
    assert table.encrypted and table.metadata_store is not None
    assert os.path.basename(table.metadata_location).startswith("00000-")
    first = table.metadata_location
    table.append(rows(0, 3))
    table.append(rows(3, 2))
    assert os.path.basename(table.metadata_location).startswith("00002-")
    loaded = catalog.load_table(("db", "events"))
    assert loaded.metadata_location == table.metadata_location
    assert loaded.scan().to_arrow().num_rows == 5
    assert [e["metadata-file"] for e in loaded.metadata["metadata-log"]][0] == first
    assert catalog.list_tables("db") == [("db", "events")]
    assert catalog.table_exists("db.events") and not catalog.table_exists("db.other")
    # writes through a second table object commit on top of the first one's
    loaded.delete("id < 2")
    table.refresh()
    assert table.metadata_location == loaded.metadata_location
    assert table.scan().to_arrow().num_rows == 3
    # the catalog records the previous location
    assert catalog._table_location(("db",), "events") == loaded.metadata_location


def test_stale_writer_retries_append_and_refuses_overwrite(catalog):
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", SCHEMA, table_key_id="keyA")
    table.append(rows(0, 1))
    stale = catalog.load_table("db.t")
    table.append(rows(1, 1))  # `stale` now holds an old version
    stale.append(rows(2, 1))  # re-applied on the newer version, through the catalog
    fresh = catalog.load_table("db.t")
    assert sorted(fresh.scan().to_arrow()["id"].to_pylist()) == [0, 1, 2]
    assert len(fresh.snapshots()) == 3


def test_lost_swap_deletes_its_metadata_file_and_is_retryable(catalog):
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", SCHEMA, table_key_id=None)
    target = w._Target.of(table)
    base_location, base = target.latest()
    other = catalog.load_table("db.t")
    other.append(rows(0, 1))  # the catalog moves on
    metadata_dir = os.path.dirname(base_location)
    before = set(os.listdir(metadata_dir))
    metadata = dict(base, **{"last-updated-ms": base["last-updated-ms"] + 1})
    with pytest.raises(w._commit.VersionExistsError):
        target.commit_metadata(base_location, metadata, base=base)
    assert set(os.listdir(metadata_dir)) == before
    assert catalog.load_table("db.t").metadata_location == other.metadata_location


def test_overwrite_conflict_is_clean(catalog):
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", SCHEMA, table_key_id="keyA")
    table.append(rows(0, 2))
    a, b = catalog.load_table("db.t"), catalog.load_table("db.t")
    a.overwrite(rows(10, 1))
    # b's overwrite is built on the version it saw; after a committed, its commit is refused
    target = w._Target.of(b)
    base_location, base = b.metadata_location, b.metadata
    with pytest.raises(w._commit.VersionExistsError):
        target.commit_metadata(base_location, dict(base), base=base)
    assert catalog.load_table("db.t").scan().to_arrow()["id"].to_pylist() == [10]


def test_plaintext_table_and_errors(catalog, tmp_path):
    with pytest.raises(NoSuchNamespaceError, match="db"):
        catalog.create_table("db.t", SCHEMA, table_key_id=None)
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", SCHEMA, table_key_id=None, location=str(tmp_path / "elsewhere"))
    assert not table.encrypted and table.location == str(tmp_path / "elsewhere")
    table.append(rows(0, 4))
    from icecrypt.table import PlaintextFileError

    with pytest.raises(PlaintextFileError, match="not encrypted"):
        catalog.load_table("db.t", require_encryption=True)
    with pytest.raises(TableAlreadyExistsError, match="db.t"):
        catalog.create_table("db.t", SCHEMA, table_key_id=None)
    with pytest.raises(NoSuchTableError, match="db.missing"):
        catalog.load_table("db.missing")
    with pytest.raises(InvalidIdentifierError, match="namespace"):
        catalog.load_table("t")
    with pytest.raises(NamespaceNotEmptyError, match="db"):
        catalog.drop_namespace("db")
    with pytest.raises(NoSuchNamespaceError):
        catalog.list_tables("nope")
    catalog.drop_table("db.t")
    assert catalog.list_tables("db") == []
    with pytest.raises(NoSuchTableError):
        catalog.drop_table("db.t")
    # a write through a table object whose catalog entry was dropped is refused
    with pytest.raises((NoSuchTableError, CommitConflictError)):
        table.append(rows(4, 1))
    catalog.drop_namespace("db")


def test_register_and_purge(catalog, kms, tmp_path):
    path_table = EncryptedTable.create(str(tmp_path / "pathtable"), SCHEMA, kms=kms, table_key_id="keyA")
    path_table.append(rows(0, 2))
    catalog.create_namespace("db")
    registered = catalog.register_table("db.reg", path_table.metadata_location)
    assert registered.scan().to_arrow().num_rows == 2
    registered.append(rows(2, 1))  # the first catalog commit continues v2 with 00003-<uuid>
    assert os.path.basename(registered.metadata_location).startswith("00003-")
    assert catalog.load_table("db.reg").scan().to_arrow().num_rows == 3
    with pytest.raises(FileNotFoundError):
        catalog.register_table("db.bad", str(tmp_path / "nothing" / "v1.metadata.json"))
    assert not catalog.table_exists("db.bad")

    table = catalog.create_table("db.gone", SCHEMA, table_key_id="keyA")
    table.append(rows(0, 2))
    data_files = [f for f in os.listdir(os.path.join(table.location, "data"))]
    assert data_files
    catalog.drop_table("db.gone", purge=True)
    assert not os.listdir(os.path.join(table.location, "data"))
    assert not os.listdir(os.path.join(table.location, "metadata"))


def test_expire_rotate_and_housekeeping(catalog):
    catalog.create_namespace("db")
    table = catalog.create_table(
        "db.t", SCHEMA, table_key_id="keyA",
        properties={"write.metadata.previous-versions-max": "2", "write.metadata.delete-after-commit.enabled": "true"},
    )  # fmt: skip
    for i in range(4):
        table.append(rows(i, 1))
    metadata_dir = os.path.dirname(table.metadata_location)
    json_files = sorted(f for f in os.listdir(metadata_dir) if f.endswith(".metadata.json"))
    assert len(json_files) == 3  # two in the log plus the current one
    assert len(table.metadata["metadata-log"]) == 2
    table.rotate_keys()
    expired = table.expire_snapshots(older_than_ms=table.current_snapshot().timestamp_ms)
    assert len(expired) == 3
    again = catalog.load_table("db.t")
    assert again.metadata_location == table.metadata_location
    assert again.scan().to_arrow().num_rows == 4
    assert sorted(f for f in os.listdir(metadata_dir) if f.endswith(".metadata.json")) == sorted(
        [os.path.basename(e["metadata-file"]) for e in again.metadata["metadata-log"]]
        + [os.path.basename(again.metadata_location)]
    )


def test_kms_from_properties(warehouse):
    catalog = load_catalog(
        "props", warehouse=warehouse, **{"encryption.kms-impl": "icecrypt.kms.memory.MemoryKms"}
    )  # fmt: skip
    assert catalog.kms is not None
    with pytest.raises(CatalogError, match="unknown type"):
        load_catalog("x", type="hive", warehouse=warehouse)
    with pytest.raises(CatalogError, match="uri or a"):
        load_catalog("x")


@pytest.mark.servers
def test_secrets_not_in_repr(postgres_server):
    catalog = load_catalog("x", uri=postgres_server.uri().replace("postgres@", "postgres:hunter2@"))
    assert "hunter2" not in repr(catalog)


def test_cli_names_tables_by_catalog_identifier(tmp_path, capfd, warehouse):
    import pyarrow.parquet as pq

    from icecrypt.cli import main

    kms = ["--kms-type", "memory", "--kms-property", "encryption.kms.memory.iceberg-test-keys=true"]
    cat = ["--catalog", f"warehouse={warehouse}", "--catalog-name", "cli"]
    pq.write_table(rows(0, 3), tmp_path / "in.parquet")

    def run(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        out, err = capfd.readouterr()
        return code, out, err

    assert run("table", "create", "db.t", "--schema", "id long, name string", "--table-key-id", "keyA", *kms, *cat)[0] == 0
    assert run("table", "append", "db.t", str(tmp_path / "in.parquet"), "-q", *kms, *cat)[0] == 0
    code, out, _ = run("table", "scan", "db.t", "--count", *kms, *cat)
    assert (code, out.strip()) == (0, "3")
    catalog = load_catalog("cli", warehouse=warehouse)
    assert catalog.list_tables("db") == [("db", "t")]
    code, _, err = run("table", "scan", "db.nope", "--count", *kms, *cat)
    assert code != 0 and "db.nope does not exist" in err


def test_unreachable_database_is_a_catalog_error():
    from servers import closed_port

    uri = f"postgresql+psycopg2://someone:hunter2@127.0.0.1:{closed_port()}/nothing"
    with pytest.raises(CatalogError, match="catalog 'down'") as failure:
        load_catalog("down", uri=uri)
    assert "hunter2" not in str(failure.value)


def test_maintenance_commits_through_the_catalog(catalog):
    import time

    catalog.create_namespace("db")
    table = catalog.create_table("db.t", SCHEMA, table_key_id="keyA")
    for i in range(3):
        table.append(rows(i * 10, 2))
    table.rewrite_manifests(force=True)
    table.rewrite_data_files(options={"min-input-files": "2"})
    loaded = catalog.load_table("db.t")
    assert loaded.metadata_location == table.metadata_location
    assert sorted(loaded.scan().to_arrow()["id"].to_pylist()) == [0, 1, 10, 11, 20, 21]
    assert [s.operation for s in loaded.snapshots()][-2:] == ["replace", "replace"]
    # every metadata file is referenced (current or in the log): none is an orphan
    result = loaded.remove_orphan_files(older_than=int(time.time() * 1000) + 60_000, dry_run=True)
    assert not [p for p in result.orphan_files if p.endswith(".metadata.json")], result.orphan_files
    loaded.rekey(everything=True, expire=True)
    assert catalog.load_table("db.t").scan().to_arrow().num_rows == 6


def test_rename_keeps_the_table_and_its_pin(catalog):
    catalog.create_namespace("db")
    catalog.create_namespace("other")
    table = catalog.create_table("db.before", SCHEMA, table_key_id="keyA")
    table.append(rows(0, 3))
    pin = catalog._pin_get(("db",), "before")
    catalog.rename_table("db.before", "other.after")
    assert catalog.list_tables("db") == [] and catalog.list_tables("other") == [("other", "after")]
    assert catalog._pin_get(("other",), "after") == pin and catalog._pin_get(("db",), "before") is None
    renamed = catalog.load_table("other.after")
    assert renamed.metadata_location == table.metadata_location and renamed.scan().to_arrow().num_rows == 3
    renamed.append(rows(3, 1))  # commits go to the new name
    assert catalog.load_table("other.after").scan().to_arrow().num_rows == 4
    catalog.create_table("db.taken", SCHEMA, table_key_id=None)
    with pytest.raises(TableAlreadyExistsError, match="taken"):
        catalog.rename_table("other.after", "db.taken")
    with pytest.raises(NoSuchTableError, match="before"):
        catalog.rename_table("db.before", "db.x")
    with pytest.raises(NoSuchNamespaceError, match="nowhere"):
        catalog.rename_table("other.after", "nowhere.t")
    assert catalog.load_table("other.after").scan().to_arrow().num_rows == 4

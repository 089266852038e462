"""The catalog keeps what storage cannot be trusted with: a table's roots (``location``,
``write.data.path``, ``write.metadata.path``; plaintext tables too) and the KEKs its
rotations retired.  The attacker is a tenant who can write its own table's storage (not
the catalog database): it rewrites its current metadata file in place to move its table
onto a victim's directory, or to put a retired KEK back under a fresh id."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import time

import pytest
from test_attack_catalog_pin import _files, _rewrite, setup  # noqa: F401  (setup: the fixture)
from test_sql import SCHEMA, rows

from icecrypt import TableIdentityError
from icecrypt.catalog import load_catalog
from icecrypt.errors import ReplayedKeyError
from icecrypt.table.commit import store as _commit
from icecrypt.table.commit.pin import CATALOG_DATA_PATH, CATALOG_LOCATION, CATALOG_UUID, retired_keks


def _contents(table) -> dict[str, bytes]:
    fs = table.filesystem
    out = {}
    for path in sorted(_files(table)):
        with fs.open_input_stream(path) as f:
            out[path] = f.read()
    return out


def _again(catalog):
    """The same catalog opened afresh (another process: no state carried over)."""
    return load_catalog(catalog.name, kms=catalog._kms, **catalog.properties)


@pytest.mark.slow
@pytest.mark.parametrize("field", ["location", "write.data.path", "write.metadata.path"])
def test_tenant_moving_its_table_onto_a_victim_is_refused(setup, field):  # noqa: F811
    catalog, ns, _, _ = setup
    victim = catalog.create_table(f"{ns}.victim", SCHEMA, table_key_id=None)
    victim.append(rows(0, 5))
    tenant = catalog.create_table(f"{ns}.tenant", SCHEMA, table_key_id=None)
    tenant.append(rows(100, 2))
    tenant.append(rows(200, 2))
    before = _contents(victim)
    current = tenant.metadata_location
    target = victim.metadata["location"]

    def move(doc):
        if field == "location":
            doc["location"] = target
        else:
            doc["properties"][field] = target + ("/data" if field == "write.data.path" else "/metadata")

    _rewrite(tenant, current, move)
    for loader in (catalog, _again(catalog)):
        with pytest.raises(TableIdentityError) as caught:
            loader.load_table(f"{ns}.tenant")
        assert caught.value.metadata_location == current and current in str(caught.value)
        assert caught.value.source == "catalog" and field in str(caught.value)
    # the tenant's object loaded before the edit never walks or deletes the victim's files
    for attempt in (lambda: tenant.remove_orphan_files(older_than=2**62), lambda: tenant.expire_snapshots(1)):
        with contextlib.suppress(TableIdentityError):
            attempt()
    with pytest.raises(TableIdentityError):
        catalog.drop_table(f"{ns}.tenant", purge=True)
    assert _contents(victim) == before
    assert catalog.load_table(f"{ns}.victim").scan().to_arrow().num_rows == 5


@pytest.mark.slow
def test_a_commit_changing_the_roots_is_refused_by_the_catalog(setup):  # noqa: F811
    """A client committing through the catalog a version that moves the table (or sets a
    write path) is refused by the catalog itself, plaintext tables included."""
    catalog, ns, key_a, _ = setup
    for name, key_id in (("p", None), ("e", key_a)):
        table = catalog.create_table(f"{ns}.{name}", SCHEMA, table_key_id=key_id)
        table.append(rows(0, 3))
        store, base = table.metadata_store, table.metadata_location
        for change in ("location", "write.data.path"):
            forged = json.loads(json.dumps(table.metadata))
            if change == "location":
                forged["location"] = forged["location"] + "-elsewhere"
            else:
                forged["properties"]["write.data.path"] = forged["location"] + "/../x"
            with pytest.raises(TableIdentityError, match=f"{change} changed") as caught:
                _commit.commit_metadata_to_store(table.filesystem, store, base, forged)
            assert caught.value.source == "catalog" and store.current() == base
        assert catalog.load_table(f"{ns}.{name}").scan().to_arrow().num_rows == 3


def test_write_paths_are_recorded_and_kept(setup):  # noqa: F811
    catalog, ns, _, _ = setup
    probe = catalog.create_table(f"{ns}.probe", SCHEMA, table_key_id=None)
    data_path = probe.metadata["location"] + "/elsewhere-data"
    table = catalog.create_table(f"{ns}.w", SCHEMA, table_key_id=None, properties={"write.data.path": data_path})
    table.append(rows(0, 3))
    assert catalog._pin_get((ns,), "w")[CATALOG_DATA_PATH] == data_path
    loaded = _again(catalog).load_table(f"{ns}.w")
    assert loaded.pin.data_location == data_path and loaded.pin.source == "catalog"
    _rewrite(table, table.metadata_location, lambda doc: doc["properties"].pop("write.data.path"))
    with pytest.raises(TableIdentityError, match="write.data.path"):
        catalog.load_table(f"{ns}.w")


def test_a_table_without_a_record_gets_one_at_its_first_commit(sql_catalog):
    """A table created by Java or PyIceberg has no record: until icecrypt's first commit
    (or register_table, or a load with table_key_id) the version loaded is the anchor."""
    sql_catalog.create_namespace("db")
    table = sql_catalog.create_table("db.j", SCHEMA, table_key_id=None)
    sql_catalog._pin_set(("db",), "j", None)  # as if another engine had created it
    assert sql_catalog._pin_get(("db",), "j") is None
    loaded = sql_catalog.load_table("db.j")
    assert loaded.pin.source == "loaded version"
    loaded.append(rows(0, 2))
    record = sql_catalog._pin_get(("db",), "j")
    assert record[CATALOG_LOCATION] == table.metadata["location"] and record[CATALOG_UUID] == table.metadata["table-uuid"]
    _rewrite(loaded, loaded.metadata_location, lambda doc: doc.update(location=doc["location"] + "2"))
    with pytest.raises(TableIdentityError, match="location changed"):
        sql_catalog.load_table("db.j")


@pytest.mark.parametrize("database", ["sqlite", pytest.param("postgres", marks=pytest.mark.servers)])
def test_pins_table_of_an_earlier_version_is_migrated(request, warehouse, kms, database):
    """A catalog whose icecrypt_table_pins has only (key id, UUID) columns -- made by the
    previous version -- gains the new nullable columns; its records keep working and a
    table gets its roots at its next commit."""
    from sqlalchemy import inspect, text

    uri = {"uri": request.getfixturevalue("postgres_uri")} if database == "postgres" else {}
    catalog = load_catalog("test", warehouse=warehouse, kms=kms, **uri)
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", SCHEMA, table_key_id="keyA")
    table.append(rows(0, 2))
    engine = catalog._engine
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE icecrypt_table_pins"))
        conn.execute(text(
            "CREATE TABLE icecrypt_table_pins (catalog_name VARCHAR(255) NOT NULL, table_namespace VARCHAR(255) NOT NULL, "
            "table_name VARCHAR(255) NOT NULL, table_key_id VARCHAR(1000), table_uuid VARCHAR(255), "
            "PRIMARY KEY (catalog_name, table_namespace, table_name))"))
        conn.execute(text("INSERT INTO icecrypt_table_pins VALUES ('test', 'db', 't', 'keyA', :u)"),
                     {"u": table.metadata["table-uuid"]})
    old = load_catalog("test", warehouse=warehouse, kms=kms, **uri)  # migrates (init_catalog_tables=false alters nothing)
    assert old._pin_get(("db",), "t") == {"icecrypt.table-key-id": "keyA", CATALOG_UUID: table.metadata["table-uuid"]}
    columns = {c["name"] for c in inspect(engine).get_columns("icecrypt_table_pins")}
    assert {"location", "write_data_path", "write_metadata_path", "retired_keks"} <= columns
    loaded = old.load_table("db.t")
    assert loaded.pin.source == "catalog" and loaded.pin.table_key_id == "keyA"
    loaded.append(rows(2, 2))
    assert old._pin_get(("db",), "t")[CATALOG_LOCATION] == table.metadata["location"]
    assert old.load_table("db.t").scan().to_arrow().num_rows == 4


@pytest.fixture
def sql_catalog(warehouse, kms):
    return load_catalog("test", warehouse=warehouse, kms=kms)


def _replay(old, doc):
    """The attacker's replay: the retired KEK's wrapped bytes under a fresh id, listed
    first with a fresh timestamp (the original entry is gone: rekey dropped it)."""
    doc["encryption-keys"].insert(0, {
        "key-id": "cmVwbGF5ZWQtYnktdGhlLXRlbmFudA==", "encrypted-by-id": old.encrypted_by_id,
        "encrypted-key-metadata": base64.b64encode(old.encrypted_key_metadata).decode(),
        "properties": {"KEY_TIMESTAMP": str(time.time_ns() // 1_000_000)},
    })  # fmt: skip


@pytest.mark.slow
def test_a_fresh_process_refuses_a_kek_the_catalog_saw_retired(setup):  # noqa: F811
    catalog, ns, key_a, _ = setup
    table = catalog.create_table(f"{ns}.t", SCHEMA, table_key_id=key_a)
    table.append(rows(0, 3))
    old = table.encryption_manager.current_kek()
    table.rekey(kek_ids=[old.key_id], expire=True)
    digest = hashlib.sha256(old.encrypted_key_metadata).hexdigest()
    assert (old.key_id, digest) in retired_keks(catalog._pin_get((ns,), "t"))
    table.append(rows(3, 3))
    current = table.metadata_location
    assert old.key_id not in {k["key-id"] for k in table.metadata["encryption-keys"]}
    _rewrite(table, current, lambda doc: _replay(old, doc))  # in place: the catalog still points here
    before = _contents(table)
    fresh = _again(catalog).load_table(f"{ns}.t")  # no ledger of its own: the catalog's record
    for attempt in (lambda: fresh.append(rows(10, 1)), lambda: fresh.rewrite_data_files(options={"rewrite-all": "true"})):
        with pytest.raises(ReplayedKeyError, match="cmVwbGF5ZWQtYnktdGhlLXRlbmFudA=="):
            attempt()
    assert _contents(table) == before and fresh.metadata_store.current() == current  # nothing written
    fresh.rotate_keys(new_kek=True)  # the recovery
    fresh.append(rows(10, 1))
    assert sorted(catalog.load_table(f"{ns}.t").scan().to_arrow().column("id").to_pylist()) == [0, 1, 2, 3, 4, 5, 10]


def test_rotate_keys_records_retired_keks_and_the_list_is_bounded(sql_catalog, monkeypatch):
    from icecrypt.table.commit import pin as _pin

    sql_catalog.create_namespace("db")
    table = sql_catalog.create_table("db.t", SCHEMA, table_key_id="keyA")
    table.append(rows(0, 1))
    seen = [table.encryption_manager.current_kek().key_id]
    monkeypatch.setattr(_pin, "MAX_RETIRED_KEKS", 3)
    for _ in range(4):
        table.rotate_keys(new_kek=True)
        seen.append(table.encryption_manager.current_kek().key_id)
    recorded = [key_id for key_id, _ in retired_keks(sql_catalog._pin_get(("db",), "t"))]
    assert recorded == seen[1:4]  # the newest three retired; the current KEK is never listed


def test_register_and_a_load_naming_the_key_record_the_roots(sql_catalog, tmp_path, kms):
    from icecrypt.table import EncryptedTable

    sql_catalog.create_namespace("db")
    path_table = EncryptedTable.create(str(tmp_path / "p"), SCHEMA, kms=kms, table_key_id=None)
    path_table.append(rows(0, 2))
    registered = sql_catalog.register_table("db.r", path_table.metadata_location)
    assert sql_catalog._pin_get(("db",), "r")[CATALOG_LOCATION] == path_table.metadata["location"]
    _rewrite(registered, registered.metadata_location, lambda doc: doc.update(location=str(tmp_path)))
    with pytest.raises(TableIdentityError, match="location changed"):
        sql_catalog.load_table("db.r")
    # a table created elsewhere, loaded with the caller's key id: recorded from that load
    table = sql_catalog.create_table("db.k", SCHEMA, table_key_id="keyA")
    table.append(rows(0, 2))
    sql_catalog._pin_set(("db",), "k", None)
    sql_catalog.load_table("db.k", table_key_id="keyA")
    record = sql_catalog._pin_get(("db",), "k")
    assert record[CATALOG_LOCATION] == table.metadata["location"] and record["icecrypt.table-key-id"] == "keyA"

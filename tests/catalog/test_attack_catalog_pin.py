"""The catalog keeps each encrypted table's master key id and UUID where whoever can write
the table's storage cannot reach (SQL: icecrypt_table_pins; Glue: table parameters): a
metadata file that disagrees is refused at load and refresh, a commit that removes or
changes encryption.key-id is refused unless it is the table's own master-key rotation."""

from __future__ import annotations

import json
import uuid

import pyarrow.fs as pafs
import pytest
from forgery import forget_recorded_digest, without_authenticator
from test_sql import SCHEMA, rows

from icecrypt import TableIdentityError
from icecrypt.catalog import load_catalog
from icecrypt.table.commit import store as _commit
from icecrypt.table.commit.pin import (
    CATALOG_DEK_LENGTH,
    CATALOG_DIGEST,
    CATALOG_DIGEST_OF,
    CATALOG_KEY_ID,
    CATALOG_LOCATION,
    CATALOG_UUID,
)

@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.servers)])
def sql_catalog(request, warehouse, kms):
    if request.param == "sqlite":
        return load_catalog("test", warehouse=warehouse, kms=kms)
    return load_catalog("test", uri=request.getfixturevalue("postgres_uri"), warehouse=warehouse, kms=kms)


class _Glue:
    """A Glue catalog on the moto server, with the two AWS KMS keys as keyA/keyB."""

    def __init__(self, request):
        from test_glue import _glue_properties

        server = request.getfixturevalue("moto_server")
        keys = request.getfixturevalue("aws_key_ids")
        bucket = f"icecrypt-pin-{uuid.uuid4().hex[:8]}"
        server.boto3_client("s3").create_bucket(Bucket=bucket)
        self.catalog = load_catalog("glue_pin", **_glue_properties(server, bucket))
        self.key_a, self.key_b = keys["a"], keys["b"]
        self.namespace = f"db_{uuid.uuid4().hex[:10]}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.servers), pytest.param("glue", marks=pytest.mark.servers)])
def setup(request, warehouse, kms):
    """(catalog, namespace, key A, key B) for each catalog kind."""
    if request.param == "glue":
        glue = _Glue(request)
        glue.catalog.create_namespace(glue.namespace)
        return glue.catalog, glue.namespace, glue.key_a, glue.key_b
    if request.param == "sqlite":
        catalog = load_catalog("test", warehouse=warehouse, kms=kms)
    else:
        catalog = load_catalog("test", uri=request.getfixturevalue("postgres_uri"), warehouse=warehouse, kms=kms)
    catalog.create_namespace("db")
    return catalog, "db", "keyA", "keyB"


def _rewrite(table, path: str, change) -> None:
    """The attacker: edit the metadata file at ``path`` in storage, in place (without the
    authenticator, which would refuse it).  The catalog's digest of the file refuses any
    such edit first (test_attack_catalog_digest.py); these tests are of the pins, which
    stand where the catalog holds no digest of the current file (another engine made it
    current): that digest is forgotten here."""
    fs = table.filesystem
    with fs.open_input_file(path) as f:
        doc = without_authenticator(json.loads(f.read()))
    change(doc)
    with fs.open_output_stream(path) as out:
        out.write(json.dumps(doc).encode())
    forget_recorded_digest(table)


def _files(table) -> set[str]:
    root = table.fs_path(table.location)
    return {i.path for i in table.filesystem.get_file_info(pafs.FileSelector(root, recursive=True)) if i.is_file}


def test_catalog_records_the_pin_and_hands_it_to_loads(setup):
    catalog, ns, key_a, _ = setup
    table = catalog.create_table(f"{ns}.t", SCHEMA, table_key_id=key_a)
    recorded = catalog._pin_get((ns,), "t")
    assert recorded == {CATALOG_KEY_ID: key_a, CATALOG_UUID: table.metadata["table-uuid"],
                        CATALOG_LOCATION: table.metadata["location"], CATALOG_DEK_LENGTH: "16",
                        CATALOG_DIGEST: recorded[CATALOG_DIGEST],
                        CATALOG_DIGEST_OF: table.metadata_store.to_recorded(table.metadata_location)}
    table.append(rows(0, 3))
    loaded = catalog.load_table(f"{ns}.t")
    assert loaded.pin.source == "catalog" and loaded.pin.table_key_id == key_a
    assert loaded.pin.table_uuid == table.metadata["table-uuid"]


@pytest.mark.parametrize("change", ["no-key-id", "other-key-id", "other-uuid"])
def test_storage_edit_of_the_current_file_is_refused(setup, change):
    """The catalog row cannot be touched; the file it points to can be rewritten."""
    catalog, ns, key_a, key_b = setup
    table = catalog.create_table(f"{ns}.t", SCHEMA, table_key_id=key_a)
    table.append(rows(0, 3))
    holder = catalog.load_table(f"{ns}.t")
    current = table.metadata_location

    def forge(doc):
        if change == "no-key-id":
            del doc["properties"]["encryption.key-id"]
        elif change == "other-key-id":
            doc["properties"]["encryption.key-id"] = key_b
        else:
            doc["table-uuid"] = str(uuid.uuid4())

    _rewrite(table, current, forge)
    before = _files(table)
    with pytest.raises(TableIdentityError) as caught:
        catalog.load_table(f"{ns}.t")
    assert caught.value.metadata_location == current and current in str(caught.value)
    assert caught.value.source == "catalog"
    # (an object holding the version as it was written builds on that, never on the forgery)
    for attempt in (holder.refresh, table.rewrite_manifests, table.remove_orphan_files):
        with pytest.raises(TableIdentityError, match="pinned from the catalog"):
            attempt()
    with pytest.raises(TableIdentityError):  # purge reads the forged file's references: refused
        catalog.drop_table(f"{ns}.t", purge=True)
    assert catalog.table_exists(f"{ns}.t")
    assert _files(table) == before  # nothing written, nothing deleted


def test_commit_removing_encryption_is_refused_by_the_catalog(setup):
    """A client committing through the catalog a version without encryption.key-id (or
    under another key) is refused by the catalog itself; nothing changes there."""
    catalog, ns, key_a, key_b = setup
    table = catalog.create_table(f"{ns}.t", SCHEMA, table_key_id=key_a)
    table.append(rows(0, 3))
    store = table.metadata_store
    base = table.metadata_location
    for change in ("remove", "other"):
        forged = json.loads(json.dumps(table.metadata))
        if change == "remove":
            del forged["properties"]["encryption.key-id"]
        else:
            forged["properties"]["encryption.key-id"] = key_b
        with pytest.raises(TableIdentityError, match="only the table's master-key rotation") as caught:
            _commit.commit_metadata_to_store(table.filesystem, store, base, forged)
        assert caught.value.source == "catalog"
        assert store.current() == base
    assert catalog.load_table(f"{ns}.t").scan().to_arrow().num_rows == 3


def test_own_rotation_updates_the_catalog_pin(setup):
    catalog, ns, key_a, key_b = setup
    table = catalog.create_table(f"{ns}.t", SCHEMA, table_key_id=key_a)
    table.append(rows(0, 3))
    other = catalog.load_table(f"{ns}.t")
    table.rotate_keys(new_master_key_id=key_b)
    assert catalog._pin_get((ns,), "t")[CATALOG_KEY_ID] == key_b
    table.append(rows(3, 3))
    with pytest.raises(TableIdentityError, match="master key changed"):
        other.refresh()  # pinned to key A from the catalog when it was loaded: reload
    fresh = catalog.load_table(f"{ns}.t")
    assert fresh.pin.table_key_id == key_b
    fresh.append(rows(6, 3))
    assert sorted(catalog.load_table(f"{ns}.t").scan().to_arrow().column("id").to_pylist()) == list(range(9))


def test_caller_key_id_after_another_engines_rotation(sql_catalog):
    """Another engine (Java's JdbcCatalog, which knows nothing of the pin) rotated the
    master key: icecrypt refuses the table until the caller names the new key id, which
    then becomes the catalog's record."""
    sql_catalog.create_namespace("db")
    table = sql_catalog.create_table("db.t", SCHEMA, table_key_id="keyA")
    table.append(rows(0, 3))
    rotated = without_authenticator(json.loads(json.dumps(table.metadata)))  # Java drops it
    from icecrypt.keys import EncryptionManager

    manager = EncryptionManager.from_table_metadata(sql_catalog.kms, rotated)
    manager.rotate_master_key("keyB")
    rotated = manager.apply_to_metadata(rotated)
    path = table.metadata_location.replace("00001-", "00002-")
    with table.filesystem.open_output_stream(path) as out:
        out.write(_commit.serialize_metadata(rotated))
    store = table.metadata_store
    sql_catalog._table_swap(("db",), "t", store.to_recorded(table.metadata_location), store.to_recorded(path))
    with pytest.raises(TableIdentityError, match="master key changed"):
        sql_catalog.load_table("db.t")
    with pytest.raises(TableIdentityError):
        sql_catalog.load_table("db.t", table_key_id="keyC")
    assert sql_catalog.load_table("db.t", table_key_id="keyB").scan().to_arrow().num_rows == 3
    assert sql_catalog.load_table("db.t").pin.table_key_id == "keyB"


def test_register_and_drop(sql_catalog, tmp_path, kms):
    from icecrypt.table import EncryptedTable

    sql_catalog.create_namespace("db")
    path_table = EncryptedTable.create(str(tmp_path / "p"), SCHEMA, kms=kms, table_key_id="keyA")
    path_table.append(rows(0, 2))
    with pytest.raises(TableIdentityError):
        sql_catalog.register_table("db.r", path_table.metadata_location, table_key_id="keyB")
    assert not sql_catalog.table_exists("db.r")
    registered = sql_catalog.register_table("db.r", path_table.metadata_location, table_key_id="keyA")
    assert registered.pin.source == "catalog"
    assert sql_catalog._pin_get(("db",), "r")[CATALOG_KEY_ID] == "keyA"
    sql_catalog.drop_table("db.r")
    assert sql_catalog._pin_get(("db",), "r") is None
    # a new table of that name starts without the old one's pin
    sql_catalog.create_table("db.r", SCHEMA, table_key_id="keyB").append(rows(0, 1))
    assert sql_catalog._pin_get(("db",), "r")[CATALOG_KEY_ID] == "keyB"


def test_plaintext_tables_record_location_and_uuid_only(sql_catalog):
    sql_catalog.create_namespace("db")
    table = sql_catalog.create_table("db.p", SCHEMA, table_key_id=None)
    table.append(rows(0, 2))
    recorded = sql_catalog._pin_get(("db",), "p")
    assert recorded == {
        CATALOG_LOCATION: table.metadata["location"], CATALOG_UUID: table.metadata["table-uuid"],
        CATALOG_DIGEST: recorded[CATALOG_DIGEST], CATALOG_DIGEST_OF: table.metadata_store.to_recorded(table.metadata_location)}
    loaded = sql_catalog.load_table("db.p")
    assert not loaded.pin.encrypted and loaded.pin.source == "catalog"


def test_refresh_never_goes_back_to_an_ancestor(sql_catalog):
    """The catalog's pointer moved back to an older version (a restored database, a
    rollback by hand): an object holding a newer version refuses to go back; a fresh load
    takes the catalog's word."""
    from icecrypt import TableVersionError

    sql_catalog.create_namespace("db")
    table = sql_catalog.create_table("db.t", SCHEMA, table_key_id="keyA")
    table.append(rows(0, 2))
    older = table.metadata_location
    table.append(rows(2, 2))
    store = table.metadata_store
    sql_catalog._table_swap(("db",), "t", store.to_recorded(table.metadata_location), store.to_recorded(older))
    with pytest.raises(TableVersionError) as caught:
        table.refresh()
    assert set(caught.value.metadata_locations) == {table.metadata_location, older}
    with pytest.raises(TableVersionError):
        table.append(rows(4, 2))
    assert sql_catalog.load_table("db.t").scan().to_arrow().num_rows == 2

"""icecrypt's Glue catalog against moto's Glue, S3 and KMS (one moto server, the suite's
``moto_server`` fixture): namespaces as databases, tables as PyIceberg and Iceberg Java
store them, PyIceberg's GlueCatalog seeing the same entries, and commits by
compare-and-swap, including a race moto's Glue does not refuse by itself (it ignores
``VersionId`` on ``UpdateTable``) and N processes appending to one table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from icecrypt.catalog import load_catalog
from icecrypt.errors import (
    CatalogError,
    CommitConflictError,
    InvalidIdentifierError,
    NamespaceAlreadyExistsError,
    NamespaceNotEmptyError,
    NoSuchNamespaceError,
    NoSuchTableError,
    TableAlreadyExistsError,
)

pytestmark = pytest.mark.servers

ROWS = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "name": pa.array(["a", "b", "c"], pa.string())})


def _glue_properties(server, bucket: str) -> dict[str, str]:
    """Catalog properties of a Glue catalog on ``server`` with its warehouse in ``bucket``
    (KMS on the same server)."""
    return {
        "type": "glue",
        "warehouse": f"s3://{bucket}/warehouse",
        "glue.endpoint": server.endpoint,
        "glue.region": server.region,
        "glue.access-key-id": server.access_key_id,
        "glue.secret-access-key": server.secret_access_key,
        "s3.endpoint": server.endpoint,
        "s3.access-key-id": server.access_key_id,
        "s3.secret-access-key": server.secret_access_key,
        "s3.region": server.region,
        **server.kms_properties(),
    }


@pytest.fixture(scope="module")
def glue_bucket(moto_server) -> str:
    bucket = f"icecrypt-glue-{uuid.uuid4().hex[:8]}"
    moto_server.boto3_client("s3").create_bucket(Bucket=bucket)
    return bucket


@pytest.fixture
def glue_properties(moto_server, glue_bucket) -> dict[str, str]:
    return _glue_properties(moto_server, glue_bucket)


@pytest.fixture
def glue_catalog(glue_properties):
    return load_catalog("glue_test", **glue_properties)


@pytest.fixture
def glue(moto_server):
    """A plain boto3 Glue client on the same server (to look at what the catalog stored)."""
    return moto_server.boto3_client("glue")


@pytest.fixture
def database(glue_catalog) -> str:
    """A fresh database (moto's Glue is shared by the whole session)."""
    name = f"db_{uuid.uuid4().hex[:10]}"
    glue_catalog.create_namespace(name)
    return name


@pytest.fixture
def key_id(aws_key_ids) -> str:
    return aws_key_ids["a"]


def _entry(glue, database: str, name: str) -> dict:
    return glue.get_table(DatabaseName=database, Name=name)["Table"]


# --- namespaces -------------------------------------------------------------------------------


def test_namespaces_are_glue_databases(glue_catalog, glue, moto_server, glue_bucket):
    name = f"ns_{uuid.uuid4().hex[:8]}"
    assert not glue_catalog.namespace_exists(name)
    glue_catalog.create_namespace(name, {"location": f"s3://{glue_bucket}/elsewhere/{name}", "owner": "team"})
    record = glue.get_database(Name=name)["Database"]
    assert record["LocationUri"] == f"s3://{glue_bucket}/elsewhere/{name}"
    assert record["Parameters"] == {"owner": "team"}
    assert glue_catalog.namespace_exists((name,))
    assert (name,) in glue_catalog.list_namespaces()
    with pytest.raises(NamespaceAlreadyExistsError, match=name):
        glue_catalog.create_namespace(name)
    # a table of a database with a LocationUri goes under it (as PyIceberg and Java do)
    assert glue_catalog._default_table_location((name,), "t") == f"s3://{glue_bucket}/elsewhere/{name}/t"
    glue_catalog.drop_namespace(name)
    assert not glue_catalog.namespace_exists(name)
    with pytest.raises(NoSuchNamespaceError, match=name):
        glue_catalog.drop_namespace(name)


def test_namespace_properties_are_the_databases(glue_catalog, glue, glue_bucket):
    name = f"ns_{uuid.uuid4().hex[:8]}"
    glue_catalog.create_namespace(name, {"location": f"s3://{glue_bucket}/p/{name}", "comment": "orders", "a": "1"})
    assert glue_catalog.namespace_properties(name) == {"location": f"s3://{glue_bucket}/p/{name}", "comment": "orders",
                                                       "a": "1"}
    assert glue.get_database(Name=name)["Database"]["Description"] == "orders"
    glue_catalog.update_namespace_properties(name, removals=["comment", "a"], updates={"b": "2"})
    assert glue_catalog.namespace_properties(name) == {"location": f"s3://{glue_bucket}/p/{name}", "b": "2"}
    record = glue.get_database(Name=name)["Database"]
    assert record["Parameters"] == {"b": "2"} and "Description" not in record
    glue_catalog.drop_namespace(name)
    with pytest.raises(NoSuchNamespaceError, match=name):
        glue_catalog.update_namespace_properties(name, updates={"c": "3"})


def test_namespace_names_glue_refuses(glue_catalog, database):
    # Glue has one level of databases
    assert not glue_catalog.namespace_exists((database, "sub"))
    with pytest.raises(NoSuchNamespaceError, match="one level"):
        glue_catalog.create_namespace((database, "sub"))
    with pytest.raises(NoSuchNamespaceError, match=f"{database}.sub"):
        glue_catalog.list_tables(f"{database}.sub")
    with pytest.raises(NoSuchTableError):
        glue_catalog.load_table(f"{database}.sub.t")
    # names Glue would change (lower-cases) or refuse, as Iceberg Java checks them
    with pytest.raises(InvalidIdentifierError, match="Sales"):
        glue_catalog.create_namespace("Sales")
    with pytest.raises(InvalidIdentifierError, match="Events"):
        glue_catalog.create_table(f"{database}.Events", ROWS.schema, table_key_id=None)
    assert glue_catalog.list_tables(database) == []


def test_skip_name_validation(glue_properties):
    catalog = load_catalog("lenient", **glue_properties, **{"glue.skip-name-validation": "true"})
    name = f"Mixed_{uuid.uuid4().hex[:6]}"
    catalog.create_namespace(name)  # moto keeps the case (AWS would lower-case it)
    assert catalog.namespace_exists(name)
    catalog.drop_namespace(name)


def test_default_location_needs_a_warehouse(glue_properties, database):
    properties = {k: v for k, v in glue_properties.items() if k != "warehouse"}
    catalog = load_catalog("no_warehouse", **properties)
    with pytest.raises(CatalogError, match=f"{database}.t.*location|no warehouse"):
        catalog.create_table(f"{database}.t", ROWS.schema, table_key_id=None)
    assert catalog.list_tables(database) == []


# --- tables -------------------------------------------------------------------------------------


def test_encrypted_table_round_trip(glue_catalog, glue_properties, glue, database, key_id, glue_bucket):
    table = glue_catalog.create_table(f"{database}.events", ROWS.schema, table_key_id=key_id)
    created = _entry(glue, database, "events")
    assert created["TableType"] == "EXTERNAL_TABLE"
    assert created["Parameters"]["table_type"] == "ICEBERG"
    assert "previous_metadata_location" not in created["Parameters"]
    location = f"s3://{glue_bucket}/warehouse/{database}.db/events"
    assert created["StorageDescriptor"]["Location"] == location
    assert created["Parameters"]["metadata_location"].startswith(f"{location}/metadata/00000-")

    table.append(ROWS)
    table.append(ROWS)
    entry = _entry(glue, database, "events")
    assert entry["Parameters"]["metadata_location"].startswith(f"{location}/metadata/00002-")
    assert entry["Parameters"]["previous_metadata_location"].startswith(f"{location}/metadata/00001-")
    assert int(entry["VersionId"]) == int(created["VersionId"]) + 2
    columns = entry["StorageDescriptor"]["Columns"]
    assert [(c["Name"], c["Type"], c["Parameters"]["iceberg.field.id"]) for c in columns] == [
        ("id", "bigint", "1"),
        ("name", "string", "2"),
    ]

    # another catalog object (another process, in effect) sees the same table
    fresh = load_catalog("glue_test", **glue_properties).load_table((database, "events"))
    assert fresh.metadata["properties"]["encryption.key-id"] == key_id
    assert fresh.scan().to_arrow().sort_by("id").column("id").to_pylist() == [1, 1, 2, 2, 3, 3]
    assert len(fresh.snapshots()) == 2
    assert glue_catalog.list_tables(database) == [(database, "events")]
    assert glue_catalog.table_exists(f"{database}.events")

    # the files on S3 are encrypted
    s3 = fresh.filesystem
    files = [i.path for i in s3.get_file_info(pafs.FileSelector(location[len("s3://") :], recursive=True)) if i.is_file]
    data = [f for f in files if f.endswith((".parquet", ".avro"))]
    assert data
    for path in data:
        with s3.open_input_file(path) as f:
            assert f.read(4) in (b"AGS1", b"PARE"), path

    with pytest.raises(TableAlreadyExistsError, match="events"):
        glue_catalog.create_table(f"{database}.events", ROWS.schema, table_key_id=key_id)
    glue_catalog.drop_table(f"{database}.events", purge=True)
    assert not glue_catalog.table_exists(f"{database}.events")
    with pytest.raises(NoSuchTableError, match="events"):
        glue_catalog.load_table(f"{database}.events")
    with pytest.raises(NoSuchTableError, match="events"):
        glue_catalog.drop_table(f"{database}.events")
    left = s3.get_file_info(pafs.FileSelector(location[len("s3://") :], recursive=True))
    assert not [i.path for i in left if i.is_file and i.path.endswith(".metadata.json")]


def test_create_table_in_a_missing_database(glue_catalog):
    with pytest.raises(NoSuchNamespaceError, match="no_such_db"):
        glue_catalog.create_table("no_such_db.t", ROWS.schema, table_key_id=None)


def test_drop_namespace_with_tables(glue_catalog, database):
    glue_catalog.create_table(f"{database}.t", ROWS.schema, table_key_id=None)
    with pytest.raises(NamespaceNotEmptyError, match=rf"{database}.*Iceberg tables \(t\)"):
        glue_catalog.drop_namespace(database)
    glue_catalog.drop_table(f"{database}.t")
    glue_catalog.drop_namespace(database)


def test_other_glue_tables_are_not_iceberg_tables(glue_catalog, glue, database):
    glue.create_table(
        DatabaseName=database,
        TableInput={"Name": "hive_t", "TableType": "EXTERNAL_TABLE", "Parameters": {"classification": "csv"}},
    )
    assert glue_catalog.list_tables(database) == []
    assert not glue_catalog.table_exists(f"{database}.hive_t")
    with pytest.raises(NoSuchTableError):
        glue_catalog.load_table(f"{database}.hive_t")
    with pytest.raises(NoSuchTableError, match="not an Iceberg table"):
        glue_catalog.drop_table(f"{database}.hive_t")
    with pytest.raises(TableAlreadyExistsError, match="hive_t"):
        glue_catalog.create_table(f"{database}.hive_t", ROWS.schema, table_key_id=None)
    with pytest.raises(NamespaceNotEmptyError, match="non-Iceberg tables"):
        glue_catalog.drop_namespace(database)
    assert _entry(glue, database, "hive_t")["Parameters"] == {"classification": "csv"}


def test_iceberg_entry_without_metadata_location(glue_catalog, glue, database):
    glue.create_table(
        DatabaseName=database,
        TableInput={"Name": "broken", "TableType": "EXTERNAL_TABLE", "Parameters": {"table_type": "ICEBERG"}},
    )
    with pytest.raises(CatalogError, match=f"{database}.broken has no metadata_location"):
        glue_catalog.load_table(f"{database}.broken")


def test_glue_id_is_sent_as_catalog_id(glue_properties, database):
    # moto's account id: every call carries CatalogId (moto accepts its own account)
    catalog = load_catalog("with_id", **glue_properties, **{"glue.id": "123456789012"})
    sent = []
    catalog._glue.meta.events.register(
        "before-parameter-build.glue", lambda params, **_: sent.append(params.get("CatalogId"))
    )
    assert catalog.namespace_exists(database)
    assert sent == ["123456789012"]



def test_client_properties_are_the_fallback(glue_properties, database):
    properties = {k: v for k, v in glue_properties.items() if not k.startswith("glue.") or k == "glue.endpoint"}
    properties.update({
        "client.region": glue_properties["glue.region"],
        "client.access-key-id": glue_properties["glue.access-key-id"],
        "client.secret-access-key": glue_properties["glue.secret-access-key"],
    })  # fmt: skip
    catalog = load_catalog("fallback", **properties)
    assert catalog.namespace_exists(database)
    credentials = catalog._glue._request_signer._credentials
    assert credentials.access_key == glue_properties["glue.access-key-id"]
    assert catalog._glue.meta.region_name == glue_properties["glue.region"]


def test_unreachable_glue_is_a_catalog_error(glue_properties):
    from servers import closed_port

    properties = {**glue_properties, "glue.endpoint": f"http://127.0.0.1:{closed_port()}", "glue.max-retries": "0"}
    catalog = load_catalog("unreachable", **properties)
    with pytest.raises(CatalogError, match="glue catalog 'unreachable': get database sales failed"):
        catalog.namespace_exists("sales")


@pytest.mark.parametrize(
    ("properties", "message"),
    [
        ({"glue.region": "us-east-1", "glue.max-retries": "many"}, "glue.max-retries must be a number"),
        ({"glue.region": "us-east-1", "glue.retry-mode": "eager"}, "cannot make a Glue client: .*eager"),
        ({"glue.profile-name": "icecrypt-no-such-profile"}, "cannot make a Glue client: .*icecrypt-no-such-profile"),
    ],
)
def test_bad_client_properties(properties, message, monkeypatch):
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/aws-config")
    with pytest.raises(CatalogError, match=f"glue catalog 'bad': {message}"):
        load_catalog("bad", type="glue", **properties)

# --- PyIceberg sees the same tables -----------------------------------------------------------------


def _pyiceberg_catalog(properties: dict[str, str]):
    from pyiceberg.catalog.glue import GlueCatalog as PyIcebergGlue

    shared = {k: v for k, v in properties.items() if k.startswith(("glue.", "s3.")) or k == "warehouse"}
    return PyIcebergGlue("pyiceberg", **shared)


def test_pyiceberg_lists_our_tables(glue_catalog, glue_properties, database, key_id):
    ours = glue_catalog.create_table(f"{database}.ours", ROWS.schema, table_key_id=key_id)
    ours.append(ROWS)
    plain = glue_catalog.create_table(f"{database}.plain", ROWS.schema, table_key_id=None)
    plain.append(ROWS)
    pyiceberg = _pyiceberg_catalog(glue_properties)
    assert sorted(pyiceberg.list_tables(database)) == [(database, "ours"), (database, "plain")]
    assert (database,) in pyiceberg.list_namespaces()
    for name in ("ours", "plain"):
        theirs = pyiceberg.load_table((database, name))
        assert theirs.metadata_location == glue_catalog._table_location((database,), name)
        assert theirs.metadata_location.startswith("s3://")
    # a plaintext table PyIceberg can read all the way
    assert pyiceberg.load_table((database, "plain")).scan().to_arrow().num_rows == 3


def test_tables_pyiceberg_created_load_here(glue_catalog, glue_properties, database):
    pyiceberg = _pyiceberg_catalog(glue_properties)
    theirs = pyiceberg.create_table((database, "theirs"), schema=ROWS.schema)  # format-version 2
    theirs.append(ROWS)
    assert glue_catalog.list_tables(database) == [(database, "theirs")]
    assert glue_catalog._table_location((database,), "theirs") == theirs.metadata_location
    table = glue_catalog.load_table(f"{database}.theirs")
    assert table.scan().to_arrow().sort_by("id").column("id").to_pylist() == [1, 2, 3]
    # icecrypt writes format-version 3 only (PyIceberg 0.12 cannot write v3): refused, nothing changes
    with pytest.raises(ValueError, match="format-version 3"):
        table.append(ROWS)
    assert glue_catalog._table_location((database,), "theirs") == theirs.metadata_location


def test_register_table(glue_catalog, database):
    source = glue_catalog.create_table(f"{database}.source", ROWS.schema, table_key_id=None)
    source.append(ROWS)
    location = glue_catalog._table_location((database,), "source")
    table = glue_catalog.register_table(f"{database}.copy", location)
    assert table.scan().to_arrow().num_rows == 3
    with pytest.raises(TableAlreadyExistsError, match="copy"):
        glue_catalog.register_table(f"{database}.copy", location)


# --- compare-and-swap -------------------------------------------------------------------------------


def test_swap_refuses_a_moved_table(glue_catalog, glue, database):
    table = glue_catalog.create_table(f"{database}.t", ROWS.schema, table_key_id=None)
    base = glue_catalog._table_location((database,), "t")
    stale = glue_catalog.load_table(f"{database}.t")
    table.append(ROWS)
    moved = glue_catalog._table_location((database,), "t")
    with pytest.raises(CommitConflictError, match=f"{database}.t moved"):
        glue_catalog._table_swap((database,), "t", base, base.replace("00000-", "00009-"))
    assert glue_catalog._table_location((database,), "t") == moved
    # a stale table object re-applies its append on the new version
    stale.append(ROWS)
    assert glue_catalog.load_table(f"{database}.t").scan().to_arrow().num_rows == 6
    glue_catalog.drop_table(f"{database}.t")
    with pytest.raises(NoSuchTableError, match=f"{database}.t"):
        glue_catalog._table_swap((database,), "t", moved, moved)


def test_swap_undoes_an_update_that_replaced_a_concurrent_commit(glue_catalog, glue, database):
    """Two writers pass the metadata_location check of one base; the second UpdateTable
    lands on top of the first (moto does not check VersionId).  The second commit must
    notice, put the first one back and report a conflict."""
    glue_catalog.create_table(f"{database}.t", ROWS.schema, table_key_id=None)
    base = glue_catalog._table_location((database,), "t")
    rival = glue_catalog.load_table(f"{database}.t")
    real_update = glue_catalog._glue.update_table
    raced = []

    def update_after_a_rival(**kwargs):
        if not raced:  # the rival's whole commit happens between our GetTable and UpdateTable
            raced.append(True)
            rival.append(ROWS)
        return real_update(**kwargs)

    # this writer's new metadata file (its content matters not: a copy of the base)
    new = base.replace("00000-", "00001-mine-")
    locations = glue_catalog._locations(base)
    locations.filesystem.copy_file(locations.to_fs_path(base), locations.to_fs_path(new))
    glue_catalog._glue.update_table = update_after_a_rival
    try:
        with pytest.raises(CommitConflictError, match="landed first; the table was set back"):
            glue_catalog._table_swap((database,), "t", base, new)
    finally:
        glue_catalog._glue.update_table = real_update
    winner = rival.metadata_location
    assert glue_catalog._table_location((database,), "t").endswith(winner.rsplit("/", 1)[1])
    assert _entry(glue, database, "t")["Parameters"]["previous_metadata_location"] == base
    assert glue_catalog.load_table(f"{database}.t").scan().to_arrow().num_rows == 3



def test_readers_skip_an_overwrite_whose_writer_died(glue_catalog, glue, database):
    """A writer that overwrote a concurrent commit and died before putting it back: the
    Glue entry names its commit, but icecrypt reads (and builds on) the commit that won."""
    table = glue_catalog.create_table(f"{database}.t", ROWS.schema, table_key_id=None)
    base = glue_catalog._table_location((database,), "t")
    table.append(ROWS)  # the winner, from ``base``
    winner = glue_catalog._table_location((database,), "t")
    # the dead writer's update, from the same base (its metadata file: a copy of the base)
    dead = base.replace("00000-", "00001-dead-")
    locations = glue_catalog._locations(base)
    locations.filesystem.copy_file(locations.to_fs_path(base), locations.to_fs_path(dead))
    entry = _entry(glue, database, "t")
    overwrite = {k: entry[k] for k in ("Name", "TableType", "StorageDescriptor")}
    overwrite["Parameters"] = {**entry["Parameters"], "metadata_location": dead, "previous_metadata_location": base}
    glue.update_table(DatabaseName=database, TableInput=overwrite)
    assert _entry(glue, database, "t")["Parameters"]["metadata_location"] == dead

    assert glue_catalog._table_location((database,), "t") == winner
    assert glue_catalog.load_table(f"{database}.t").scan().to_arrow().num_rows == 3
    # a commit from the winner goes on top of it, which also ends the overwrite
    glue_catalog.load_table(f"{database}.t").append(ROWS)
    parameters = _entry(glue, database, "t")["Parameters"]
    assert parameters["previous_metadata_location"] == winner
    assert glue_catalog.load_table(f"{database}.t").scan().to_arrow().num_rows == 6

_WORKER = r"""
import json, sys, time
import pyarrow as pa
from icecrypt.catalog import load_catalog

properties, identifier, worker, appends, start_file = json.loads(sys.argv[1])
table = load_catalog("worker", **properties).load_table(identifier)
deadline = time.monotonic() + 60
while not __import__("os").path.exists(start_file):   # start together
    if time.monotonic() > deadline:
        sys.exit("never started")
    time.sleep(0.01)
for n in range(appends):
    rows = pa.table({"id": pa.array([worker * 1000 + n], pa.int64()), "name": pa.array([f"w{worker}-{n}"], pa.string())})
    table.append(rows)
print("done")
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_concurrent_appends_lose_no_commit(glue_catalog, glue_properties, glue, database, key_id, tmp_path):
    """N=3 processes x M=4 appends to one encrypted Glue-on-S3 table: every append lands."""
    processes, appends = 3, 4
    glue_catalog.create_table(
        f"{database}.shared", ROWS.schema, table_key_id=key_id, properties={"commit.retry.num-retries": "50"}
    )
    start = tmp_path / "start"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, json.dumps([glue_properties, f"{database}.shared", w, appends, str(start)])],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for w in range(processes)
    ]
    try:
        start.touch()
        outcomes = [w.communicate(timeout=240) for w in workers]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
    for w, (out, err) in zip(workers, outcomes):
        assert w.returncode == 0 and out.strip() == "done", err[-2000:]
    table = glue_catalog.load_table(f"{database}.shared")
    ids = sorted(table.scan().to_arrow().column("id").to_pylist())
    assert ids == sorted(w * 1000 + n for w in range(processes) for n in range(appends))
    assert len(table.snapshots()) == processes * appends
    # one chain of commits: each metadata file's predecessor is the previous current one
    log = [entry["metadata-file"] for entry in table.metadata.get("metadata-log") or ()]
    assert len(log) == processes * appends  # 00000 (create) .. 00011, then the current one
    parameters = glue.get_table(DatabaseName=database, Name="shared")["Table"]["Parameters"]
    assert parameters["previous_metadata_location"] == log[-1]
    assert parameters["metadata_location"] == glue_catalog._table_location((database,), "shared")

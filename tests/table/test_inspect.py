"""Metadata tables (``table.inspect``): the columns and values PyIceberg gives on a
plaintext table, the right rows through appends, deletes with deletion vectors,
overwrite and expiry of an encrypted table and on the Java-written tables, manifests
authenticated as they are read, and no key material in any cell."""

from __future__ import annotations

import base64
import collections
import json

import pyarrow as pa
import pyarrow.parquet  # noqa: F401  (pa.parquet)
import pytest
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.table import StaticTable
from pyiceberg.transforms import IdentityTransform
from tablelib import TABLE_NAMES, expected

from icecrypt.errors import DecryptionError, FormatError
from icecrypt.keys import StandardKeyMetadata
from icecrypt.table import METADATA_TABLES, EncryptedTable
from icecrypt.table.files.manifest import read_manifest

SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False),
    pa.field("category", pa.string(), nullable=False),
    pa.field("amount", pa.float64()),
    pa.field("day", pa.date32()),
])  # fmt: skip
CATEGORY = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="category"))
#: columns icecrypt's file tables add to PyIceberg's (format v3's, as Java's)
V3_FILE_COLUMNS = {"first_row_id", "referenced_data_file", "content_offset", "content_size_in_bytes"}


def rows(lo: int, hi: int) -> pa.Table:
    ids = list(range(lo, hi))
    return pa.table(
        {
            "id": ids,
            "category": [("alpha", "beta", "gamma")[i % 3] for i in ids],
            "amount": [float("nan") if i % 17 == 0 else i * 1.5 for i in ids],
            "day": pa.array([19000 + i % 40 for i in ids], pa.date32()),
        },
        schema=SCHEMA,
    )


def history_table(location: str, kms, key_id: str | None) -> EncryptedTable:
    """append, append (Avro when encrypted), delete (deletion vectors), append: four
    snapshots."""
    table = EncryptedTable.create(location, SCHEMA, kms=kms, table_key_id=key_id, partition_spec=CATEGORY)
    table.append(rows(0, 300))
    table.append(rows(300, 450), file_format="avro" if key_id else "parquet")
    table.delete("id < 40 or id = 301")
    table.append(rows(450, 500))
    return table


def comparable(column: pa.ChunkedArray) -> list[str]:
    """A column's values in a form that compares across readers (order-free)."""
    return sorted(json.dumps(v, sort_keys=True, default=repr) for v in column.to_pylist())


# --- against PyIceberg ---------------------------------------------------------------------------


def test_plaintext_table_matches_pyiceberg(tmp_path):
    """Every metadata table PyIceberg 0.12 reads from a plaintext v3 table has the same
    columns, the same Arrow types and the same values here; the only differences are the
    key_metadata type (a fingerprint string) and format v3's extra file columns."""
    table = history_table(str(tmp_path / "t"), None, None)
    first = table.snapshots()[0].snapshot_id
    theirs_table = StaticTable.from_metadata(table.metadata_location)
    compared = 0
    for name in METADATA_TABLES:
        if name in ("all_entries", "position_deletes"):  # not in PyIceberg 0.12 (tested below)
            continue
        ours = table.inspect.table(name)
        if name == "entries":  # PyIceberg 0.12 fails on a deletion vector's entry (no column_sizes)
            ours, theirs = table.inspect.entries(snapshot_id=first), theirs_table.inspect.entries(snapshot_id=first)
            ours = ours.set_column(
                4, "data_file", pa.array([
                    {k: v for k, v in d.items() if k not in V3_FILE_COLUMNS | {"spec_id"}}
                    for d in ours.column("data_file").to_pylist()
                ], theirs.schema.field("data_file").type)
            )  # fmt: skip
        else:
            theirs = getattr(theirs_table.inspect, name)()
        assert ours.num_rows == theirs.num_rows > 0, name
        names = theirs.column_names
        if name.endswith("files"):  # v3's columns before readable_metrics, as Java's
            names = [*names[:-1], "first_row_id", "referenced_data_file", "content_offset", "content_size_in_bytes",
                     names[-1]]  # fmt: skip
        assert ours.column_names == names, name
        for column in theirs.column_names:
            if column == "key_metadata":
                assert ours.schema.field(column).type == pa.string()
                assert ours.column(column).null_count == ours.num_rows  # plaintext files have no key
                continue
            assert ours.schema.field(column).type == theirs.schema.field(column).type, (name, column)
            assert comparable(ours.column(column)) == comparable(theirs.column(column)), (name, column)
            compared += 1
    assert compared > 80


# --- an encrypted table through its history ------------------------------------------------------


def test_encrypted_history(tmp_path, kms):
    table = history_table(str(tmp_path / "t"), kms, "keyA")
    ids = [s.snapshot_id for s in table.snapshots()]
    inspect = table.inspect

    snapshots = inspect.snapshots()
    assert snapshots.column("snapshot_id").to_pylist() == ids
    assert snapshots.column("operation").to_pylist() == ["append", "append", "delete", "append"]
    assert snapshots.column("parent_id").to_pylist() == [None, *ids[:-1]]
    summary = dict(snapshots.column("summary").to_pylist()[2])
    assert "operation" not in summary and summary["added-position-deletes"] == "41"
    assert inspect.history().column("is_current_ancestor").to_pylist() == [True] * 4
    assert inspect.refs().to_pylist() == [{
        "name": "main", "type": "BRANCH", "snapshot_id": ids[-1], "max_reference_age_in_ms": None,
        "min_snapshots_to_keep": None, "max_snapshot_age_in_ms": None,
    }]  # fmt: skip
    log = inspect.metadata_log_entries()
    assert log.column("file").to_pylist()[-1] == table.metadata_location
    assert log.column("latest_snapshot_id").to_pylist()[-1] == ids[-1]

    files = inspect.files()
    data, deletes = inspect.data_files(), inspect.delete_files()
    assert files.num_rows == data.num_rows + deletes.num_rows
    assert sorted(data.column("file_format").to_pylist()) == ["AVRO"] * 3 + ["PARQUET"] * 6
    # the deletion vectors: one Puffin blob per data file it deletes from
    assert set(deletes.column("file_format").to_pylist()) == {"PUFFIN"}
    assert set(deletes.column("referenced_data_file").to_pylist()) <= set(data.column("file_path").to_pylist())
    assert sum(deletes.column("record_count").to_pylist()) == 41
    assert all(v is not None for v in deletes.column("content_offset").to_pylist())
    # every file has a key, shown as the fingerprint key_usage() reports
    usage = table.key_usage().files
    for row in files.select(["file_path", "key_metadata"]).to_pylist():
        assert row["key_metadata"] == usage[row["file_path"]] and len(row["key_metadata"]) == 16

    # partitions: live rows = data records - deleted positions, per partition
    live = collections.Counter(table.scan(columns=["category"]).to_arrow().column("category").to_pylist())
    parts = {r["partition"]["category"]: r for r in inspect.partitions().to_pylist()}
    assert {c: r["record_count"] - r["position_delete_record_count"] for c, r in parts.items()} == live
    assert sum(r["file_count"] for r in parts.values()) == data.num_rows
    assert parts["beta"]["last_updated_snapshot_id"] == ids[-1]  # the last append wrote to every partition
    gamma = inspect.partitions(row_filter="category = 'gamma'").to_pylist()
    assert [r["partition"] for r in gamma] == [{"category": "gamma"}]

    # readable metrics decode the bounds
    metrics = [r["readable_metrics"] for r in data.to_pylist() if r["file_format"] == "PARQUET"]
    assert min(m["id"]["lower_bound"] for m in metrics) == 0
    assert max(m["id"]["upper_bound"] for m in metrics) == 499
    assert {type(m["day"]["lower_bound"]).__name__ for m in metrics} == {"date"}

    # time travel: the first snapshot's files
    first = inspect.files(snapshot_id=ids[0])
    assert sum(first.column("record_count").to_pylist()) == 300 and first.num_rows == 3
    assert inspect.manifests(snapshot_id=ids[0]).num_rows == 1

    # manifests: counts by content, summaries readable
    manifests = inspect.manifests()
    by_content = collections.defaultdict(int)
    for row in manifests.to_pylist():
        by_content[row["content"]] += row["added_data_files_count"] + row["existing_data_files_count"]
        by_content[row["content"]] += row["added_delete_files_count"] + row["existing_delete_files_count"]
        assert [s["lower_bound"] is not None for s in row["partition_summaries"]] == [True]
    assert dict(by_content) == {0: data.num_rows, 1: deletes.num_rows}
    all_manifests = inspect.all_manifests()
    assert set(all_manifests.column("reference_snapshot_id").to_pylist()) == set(ids)
    assert all(len(fp) == 16 for fp in all_manifests.column("key_metadata").to_pylist())


def test_overwrite_and_expire(tmp_path, kms):
    """An overwrite shows the replaced files as DELETED entries; after expiry the old
    snapshots are gone from every table."""
    table = history_table(str(tmp_path / "t"), kms, "keyA")
    before = table.inspect.data_files().column("file_path").to_pylist()
    table.overwrite(rows(1000, 1010))
    entries = table.inspect.entries()
    deleted = [e["data_file"]["file_path"] for e in entries.to_pylist() if e["status"] == 2 and e["data_file"]["content"] == 0]
    assert sorted(deleted) == sorted(before)
    assert table.inspect.data_files().num_rows == 3  # one file per partition
    assert table.inspect.snapshots().column("operation").to_pylist()[-1] == "overwrite"

    # all_data_files: the replaced files too, still reachable from the older snapshots
    every = set(table.inspect.all_data_files().column("file_path").to_pylist())
    assert set(before) | set(table.inspect.data_files().column("file_path").to_pylist()) == every
    assert table.inspect.all_delete_files().num_rows == 4  # the DVs of the delete

    # all_entries: every manifest of every snapshot once, DELETED entries too; the older
    # snapshots' manifests still hold the replaced files as added or existing
    all_entries = table.inspect.all_entries().to_pylist()
    keyed = [(e["status"], e["snapshot_id"], e["data_file"]["file_path"]) for e in all_entries]
    counts = {m["path"]: sum(m[f"{kind}_{content}_files_count"] for kind in ("added", "existing", "deleted")
                             for content in ("data", "delete"))
              for m in table.inspect.all_manifests().to_pylist()}  # fmt: skip
    assert len(keyed) == sum(counts.values())  # each manifest once
    assert {e["data_file"]["file_path"] for e in all_entries} == every | set(
        table.inspect.all_delete_files().column("file_path").to_pylist())
    assert {e["data_file"]["file_path"] for e in all_entries
            if e["status"] == 2 and e["data_file"]["content"] == 0} == set(before)
    assert {f for s, _, f in keyed if s != 2} >= set(before)
    current = {(e["status"], e["snapshot_id"], e["data_file"]["file_path"]) for e in entries.to_pylist()}
    assert current <= set(keyed)
    assert table.inspect.all_entries().schema == entries.schema

    expired = table.expire_snapshots(2**62)
    assert expired
    assert sorted(table.inspect.all_files().column("file_path").to_pylist()) == sorted(
        table.inspect.files().column("file_path").to_pylist())
    current = table.current_snapshot_id
    assert table.inspect.snapshots().column("snapshot_id").to_pylist() == [current]
    assert set(table.inspect.all_manifests().column("reference_snapshot_id").to_pylist()) == {current}
    assert table.inspect.all_entries().num_rows == table.inspect.entries().num_rows
    history = table.inspect.history().to_pylist()
    assert history[-1]["snapshot_id"] == current and history[-1]["is_current_ancestor"]
    assert sum(table.inspect.partitions().column("record_count").to_pylist()) == 10
    with pytest.raises(ValueError, match=f"no snapshot {expired[0]}"):
        table.inspect.files(snapshot_id=expired[0])


def test_empty_table_and_bad_names(tmp_path, kms):
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA", partition_spec=CATEGORY)
    for name in METADATA_TABLES:
        assert table.inspect.table(name).num_rows == (1 if name == "metadata_log_entries" else 0), name
    with pytest.raises(ValueError, match="unknown metadata table 'snapshot'; the metadata tables are: snapshots"):
        table.inspect.table("snapshot")
    with pytest.raises(ValueError, match="'history' shows the whole table and takes no snapshot id"):
        table.inspect.table("history", snapshot_id=1)


# --- the Java-written tables -------------------------------------------------------------------


@pytest.mark.parametrize("name", TABLE_NAMES)
def test_java_tables(golden, name):
    table = golden(name)
    facts = expected(name)
    inspect = table.inspect
    assert inspect.snapshots().column("snapshot_id").to_pylist() == [s["snapshot_id"] for s in facts["snapshots"]]
    # every file of the current version, against a plain scan plan
    tasks = table.scan().plan_files()
    data = inspect.data_files()
    assert sorted(data.column("file_path").to_pylist()) == sorted({t.file.path for t in tasks})
    delete_paths = {d.path for t in tasks for d in t.deletes}
    assert sorted(inspect.delete_files().column("file_path").to_pylist()) == sorted(delete_paths)
    log = inspect.metadata_log_entries().column("file").to_pylist()
    assert all(f.startswith("s3://icecrypt-golden/") for f in log)  # the current one too, as recorded
    assert log[-1].endswith(facts["metadata_location"].rsplit("/", 1)[-1])
    live = table.scan(columns=[]).count()
    parts = inspect.partitions().to_pylist()
    assert sum(p["record_count"] for p in parts) == sum(data.column("record_count").to_pylist())
    deleted = inspect.position_deletes()
    assert deleted.num_rows == sum(p["position_delete_record_count"] for p in parts)
    assert set(deleted.column("delete_file_path").to_pylist()) <= delete_paths
    assert set(deleted.column("file_path").to_pylist()) <= {t.file.path for t in tasks}
    if name == "enc_deletes_dek16":
        dv = inspect.delete_files().filter(pa.compute.equal(inspect.delete_files()["file_format"], "PUFFIN"))
        assert dv.num_rows == 1 and dv.column("referenced_data_file")[0].as_py().endswith(".parquet")
        assert {p["partition"]["category"]: p["position_delete_record_count"] for p in parts}["alpha"] == 400
        assert sum(p["equality_delete_file_count"] for p in parts) == 1
    else:
        assert live == sum(p["record_count"] for p in parts)
    for name_ in METADATA_TABLES:
        assert_no_key_material(table, inspect.table(name_))


# --- no key material, authenticated reads ------------------------------------------------------


def table_keys(table: EncryptedTable) -> list[bytes]:
    """Every key the table's reachable files use: the DEKs in the scan tasks' key metadata
    (data and delete files), the manifests' and the manifest lists' keys."""
    keys = set()
    for snapshot in table.snapshots():
        keys.add(table.manifest_list_key_metadata(snapshot).encryption_key)
        for task in table.scan(snapshot_id=snapshot.snapshot_id).plan_files():
            for file in (task.file, *task.deletes):
                keys.add(StandardKeyMetadata.decode(file.key_metadata).encryption_key)
        for manifest in table.manifests(snapshot):
            keys.add(manifest.key_metadata.encryption_key)
            for entry in read_manifest(manifest, table.locations, table.specs, table.schema, encrypted=True,
                                       include_deleted=True):  # fmt: skip
                keys.add(entry.file.key_metadata.encryption_key)
    assert keys and all(len(k) >= 16 for k in keys)
    return sorted(keys)


def _cells(value) -> list:
    if isinstance(value, dict):
        return [c for v in value.values() for c in _cells(v)]
    if isinstance(value, (list, tuple)):
        return [c for v in value for c in _cells(v)]
    return [value]


def assert_no_key_material(table: EncryptedTable, result: pa.Table) -> None:
    """No key of the table in any cell: raw, hex (both cases), base64 (standard and
    URL-safe, also inside a longer base64 text such as encoded key metadata)."""
    from test_secrets_hygiene import encodings

    forms = {f for k in table_keys(table) for f in encodings(k)}
    for cell in _cells(result.to_pylist()):
        if isinstance(cell, (bytes, str)):
            blob = cell if isinstance(cell, bytes) else cell.encode()
            for form in forms:
                assert form not in blob


def test_no_key_material_in_any_table(tmp_path, kms):
    table = history_table(str(tmp_path / "t"), kms, "keyA")
    table.overwrite(rows(0, 20))
    ids = [s.snapshot_id for s in table.snapshots()]
    for name in METADATA_TABLES:
        assert_no_key_material(table, table.inspect.table(name))
    for snapshot_id in ids:
        for name in ("entries", "files", "manifests", "partitions"):
            assert_no_key_material(table, table.inspect.table(name, snapshot_id=snapshot_id))
    # the check itself sees a key where one is (a cell holding the raw key metadata)
    key_metadata = table.scan().plan_files()[0].file.key_metadata
    for leaked in (key_metadata, key_metadata.hex(), base64.b64encode(key_metadata).decode()):
        with pytest.raises(AssertionError):
            assert_no_key_material(table, pa.table({"key_metadata": [leaked]}))


def test_tampered_manifest_is_refused(golden_copy):
    """A manifest changed in storage is refused, not shown: metadata tables read through
    the authenticated manifest reader."""
    table, root = golden_copy("enc_parquet_dek16")
    manifest = table.manifests(table.current_snapshot())[0]
    path = table.fs_path(manifest.path)
    with open(path, "r+b") as f:
        f.seek(40)
        byte = f.read(1)
        f.seek(40)
        f.write(bytes([byte[0] ^ 1]))
    for name in ("files", "entries", "all_entries", "partitions", "data_files", "all_files"):
        with pytest.raises((DecryptionError, FormatError)):
            table.inspect.table(name)
    assert table.inspect.snapshots().num_rows == 2  # what does not read the manifest still works


@pytest.mark.parametrize("unit", ["us", "ns"])
def test_readable_metrics_of_a_date_promoted_to_timestamp(tmp_path, kms, unit):
    """Bounds keep the type the file was written with (spec: a 4-byte bound of a
    timestamp column is a date): files written before the v3 date -> timestamp promotion
    show their dates' midnights, files written after it their timestamps."""
    import datetime

    from pyiceberg.types import TimestampNanoType, TimestampType

    table = EncryptedTable.create(str(tmp_path / "t"), pa.schema([pa.field("id", pa.int64()), pa.field("day", pa.date32())]),
                                  kms=kms, table_key_id="keyA")  # fmt: skip
    table.append(pa.table({"id": [1, 2], "day": [datetime.date(2024, 1, 2), datetime.date(2024, 3, 4)]}))
    target = TimestampNanoType() if unit == "ns" else TimestampType()
    table.update_schema(allow_incompatible_changes=True).update_column("day", field_type=target).commit()
    late = datetime.datetime(2025, 5, 6, 7, 8)
    table.append(pa.table({"id": [3], "day": pa.array([late], pa.timestamp(unit))}))
    metrics = sorted((r["readable_metrics"]["day"] for r in table.refresh().inspect.files().to_pylist()),
                     key=lambda m: m["lower_bound"])  # fmt: skip
    as_int = [(pa.scalar(m["lower_bound"], pa.timestamp(unit)).value, pa.scalar(m["upper_bound"], pa.timestamp(unit)).value)
              for m in metrics]  # fmt: skip
    per_day = 86_400 * (10**9 if unit == "ns" else 10**6)
    first, last = datetime.date(2024, 1, 2), datetime.date(2024, 3, 4)
    epoch = datetime.date(1970, 1, 1)
    late_value = pa.scalar(late, pa.timestamp(unit)).value
    assert as_int == [((first - epoch).days * per_day, (last - epoch).days * per_day), (late_value, late_value)]


def test_uuid_bounds(tmp_path, kms):
    """A uuid column's bounds in readable_metrics are a struct nesting Arrow's uuid
    extension type, which Arrow does not build from Python values: files and entries
    still show them, as uuids."""
    import uuid

    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, UUIDType

    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "u", UUIDType()))
    table = EncryptedTable.create(str(tmp_path / "t"), schema, kms=kms, table_key_id="keyA")
    ids = [uuid.UUID(int=7), uuid.UUID(int=2**100)]
    table.append(pa.table({"id": pa.array([1, 2], pa.int64()), "u": pa.array([u.bytes for u in ids], pa.uuid())}))
    (metrics,) = [r["readable_metrics"]["u"] for r in table.refresh().inspect.files().to_pylist()]
    assert (metrics["lower_bound"], metrics["upper_bound"]) == (ids[0], ids[1])
    (entry,) = table.inspect.entries().to_pylist()
    assert entry["readable_metrics"]["u"]["upper_bound"] == ids[1]


# --- the CLI -------------------------------------------------------------------------------------

MEMORY_KMS = ["--kms-type", "memory", "--kms-property", "encryption.kms.memory.iceberg-test-keys=true"]


def cli(capfd, *argv) -> tuple[int, str, str]:
    from icecrypt.cli import main

    status = main([str(a) for a in argv])
    out, err = capfd.readouterr()
    return status, out, err


def test_cli_inspect_java_table(golden, capfd, tmp_path):
    from tablelib import location_map, metadata_path

    name = "enc_deletes_dek16"
    table = golden(name)
    (prefix, root), = location_map(name).items()
    args = [metadata_path(name), "--location-map", f"{prefix}={root}", *MEMORY_KMS]
    status, out, _ = cli(capfd, "table", "inspect", args[0], "files", *args[1:])
    assert status == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert sorted(r["file_path"] for r in rows) == sorted(table.inspect.files().column("file_path").to_pylist())
    assert {r["key_metadata"] for r in rows} == {table.key_usage().files[r["file_path"]] for r in rows}
    for key in table_keys(table):
        assert key.hex() not in out and base64.b64encode(key).decode() not in out

    first, rows_then = (expected(name)["snapshots"][0][k] for k in ("snapshot_id", "expected_row_count"))
    status, out, _ = cli(capfd, "table", "inspect", args[0], "partitions", "--snapshot", first,
                         "--columns", "partition,record_count", *args[1:])  # fmt: skip
    assert status == 0 and sum(json.loads(line)["record_count"] for line in out.splitlines()) == rows_then
    assert set(json.loads(out.splitlines()[0])) == {"partition", "record_count"}

    status, _, _ = cli(capfd, "table", "inspect", args[0], "snapshots", "-o", tmp_path / "s.parquet", *args[1:])
    assert status == 0 and pa.parquet.read_table(tmp_path / "s.parquet").num_rows == 4

    status, _, err = cli(capfd, "table", "inspect", args[0], "history", "--snapshot", first, *args[1:])
    assert status == 1 and "takes no snapshot id" in err
    status, _, err = cli(capfd, "table", "inspect", args[0], "files", "--columns", "path", *args[1:])
    assert status == 1 and "has no column(s) path; its columns are: content, file_path" in err
    with pytest.raises(SystemExit):
        cli(capfd, "table", "inspect", args[0], "snapshot", *args[1:])


def test_cli_inspect_escapes_what_the_table_holds(tmp_path, kms, capfd):
    """Values come from storage: control characters are printed escaped, never raw."""
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("category", pa.string(), nullable=False)])
    location = tmp_path / "t"
    table = EncryptedTable.create(str(location), schema, kms=None, table_key_id=None, partition_spec=CATEGORY)
    evil = "\x1b]0;owned\x07\x1b[2J\r\u202etxt"
    table.append(pa.table({"id": [1, 2], "category": [evil, "plain"]}, schema=schema))
    status, out, _ = cli(capfd, "table", "inspect", location, "partitions")
    assert status == 0
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out and "\u202e" not in out
    assert {json.loads(line)["partition"]["category"] for line in out.splitlines()} == {evil, "plain"}


def test_cli_inspect_catalog_table(tmp_path, kms, capfd):
    """A table named by catalog identifier; inspect shows the catalog's current version."""
    from icecrypt.catalog import load_catalog

    warehouse = str(tmp_path / "wh")
    catalog = load_catalog("inspect", warehouse=warehouse, kms=kms)
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", SCHEMA, table_key_id="keyA")
    table.append(rows(0, 30))
    table.delete("id < 5")
    status, out, _ = cli(capfd, "table", "inspect", "db.t", "snapshots", "--columns", "operation", *MEMORY_KMS,
                         "--catalog", f"warehouse={warehouse}", "--catalog-name", "inspect")  # fmt: skip
    assert status == 0 and [json.loads(line)["operation"] for line in out.splitlines()] == ["append", "delete"]
    assert catalog.load_table("db.t").inspect.delete_files().column("record_count").to_pylist() == [5]  # one DV


# --- damaged statistics in a plaintext table (storage is input) -----------------------------------


def _rewrite_avro(path, change) -> None:
    """Rewrite the Avro file at ``path`` with ``change(record)`` applied to each record
    (same schema, header metadata and codec)."""
    import fastavro

    with open(path, "rb") as f:
        reader = fastavro.reader(f)
        schema, codec = reader.writer_schema, reader.codec
        metadata = {k: v for k, v in reader.metadata.items() if not k.startswith("avro.")}
        records = [change(r) or r for r in reader]
    with open(path, "wb") as f:
        fastavro.writer(f, fastavro.parse_schema(schema), records, codec=codec, metadata=metadata)


def test_bounds_that_do_not_decode_name_the_file(tmp_path):
    """A plaintext table's manifests are not authenticated: a bound that does not decode
    as its column's type is a FormatError naming the manifest or the data file, not a
    struct.error or UnicodeDecodeError from the decoder."""
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=None, table_key_id=None, partition_spec=CATEGORY)
    table.append(rows(0, 10))
    manifest = table.manifests(table.current_snapshot())[0]

    def bad_summary(record):
        record["partitions"][0]["lower_bound"] = b"\xff\xfe"

    _rewrite_avro(table.fs_path(table.current_snapshot().manifest_list), bad_summary)
    with pytest.raises(FormatError, match=f"manifest list entry of {manifest.path}: partition bound of 'category'"):
        table.inspect.manifests()

    def bad_bound(record):
        record["data_file"]["lower_bounds"] = [
            {"key": item["key"], "value": b"\x01\x02\x03" if item["key"] == 1 else item["value"]}
            for item in record["data_file"]["lower_bounds"]
        ]

    _rewrite_avro(table.fs_path(manifest.path), bad_bound)
    with pytest.raises(FormatError, match=r"manifest entry of .*\.parquet: bound of column 'id' does not decode"):
        table.inspect.files()
    assert table.inspect.snapshots().num_rows == 1


@pytest.mark.parametrize(("log", "entry"), [
    ("snapshot-log", {"timestamp-ms": "soon", "snapshot-id": 1}),
    ("snapshot-log", {"timestamp-ms": 1}),
    ("metadata-log", {"timestamp-ms": 1, "metadata-file": 7}),
    ("metadata-log", "v1.metadata.json"),
])  # fmt: skip
def test_malformed_logs_name_the_metadata_file(tmp_path, log, entry):
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=None, table_key_id=None)
    table.append(rows(0, 3))
    # load() validates the logs through PyIceberg's model already; this is inspect's own
    # guard, for a document that reached the table object some other way
    table.metadata[log] = [entry]
    name = "history" if log == "snapshot-log" else "metadata_log_entries"
    with pytest.raises(FormatError, match=f"{table.metadata_location}: malformed {log}"):
        table.inspect.table(name)



def test_position_deletes(tmp_path, kms):
    """position_deletes: one row per deleted position of each deletion vector, naming the
    data file and the position the row had, as Iceberg's table; per snapshot."""
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA", partition_spec=CATEGORY)
    table.append(rows(0, 300))
    before = table.snapshot(table.current_snapshot_id).snapshot_id
    where = {r["id"]: (r["_file"], r["_pos"]) for r in
             table.scan(columns=["id", "_file", "_pos"]).to_arrow().to_pylist()}
    table.delete("id < 40 or id = 201")
    got = table.inspect.position_deletes()
    assert got.schema.names == ["file_path", "pos", "row", "partition", "spec_id", "delete_file_path",
                                "content_offset", "content_size_in_bytes"]
    assert sorted(zip(got["file_path"].to_pylist(), got["pos"].to_pylist())) == \
        sorted(where[i] for i in [*range(40), 201])
    dvs = {(r["file_path"], r["referenced_data_file"]): r for r in table.inspect.delete_files().to_pylist()}
    for row in got.to_pylist():
        assert row["row"] is None and row["spec_id"] == 0
        assert row["partition"] == {"category": ("alpha", "beta", "gamma")[[i for i, w in where.items()
                                                                          if w == (row["file_path"], row["pos"])][0] % 3]}
        dv = dvs[row["delete_file_path"], row["file_path"]]
        assert (row["content_offset"], row["content_size_in_bytes"]) == (dv["content_offset"], dv["content_size_in_bytes"])
    assert table.inspect.position_deletes(snapshot_id=before).num_rows == 0
    assert_no_key_material(table, got)

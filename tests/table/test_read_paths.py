"""The read path on tables written here (every type, both formats, plaintext tables,
splits of large Avro files), schema evolution, and Java's tables on S3 (moto)."""

from __future__ import annotations

import datetime
import decimal
import json
import shutil
from pathlib import Path

import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from pyiceberg.expressions.parser import parse
from pyiceberg.expressions.visitors import bind
from pyiceberg.io.pyarrow import expression_to_pyarrow
from tablelib import TABLE_NAMES, edit_metadata, expected, sort_table, table_digest
from vectorlib import TABLES_DIR

from icecrypt.errors import FormatError
from icecrypt.table import EncryptedTable

N = 300


def all_types(n: int = N) -> pa.Table:
    rng = np.random.default_rng(7)
    return pa.table({
        "id": pa.array(np.arange(n), pa.int64()),
        "i": pa.array(rng.integers(-1000, 1000, n), pa.int32()),
        "f": pa.array(rng.random(n), pa.float32()),
        "d": pa.array(rng.standard_normal(n), pa.float64()),
        "dec": pa.array([decimal.Decimal(f"{i}.{i % 100:02d}") if i % 7 else None for i in range(n)], pa.decimal128(12, 2)),
        "day": pa.array([datetime.date(2020, 1, 1) + datetime.timedelta(days=i) for i in range(n)], pa.date32()),
        "t": pa.array([i * 1_000_000 for i in range(n)], pa.time64("us")),
        "ts": pa.array([1_600_000_000_000_000 + i * 3_600_000_000 for i in range(n)], pa.timestamp("us")),
        "tstz": pa.array([1_600_000_000_000_000 + i * 60_000_000 for i in range(n)], pa.timestamp("us", tz="UTC")),
        "s": pa.array([f"s{i:04d}" if i % 5 else None for i in range(n)]),
        "b": pa.array([bytes([i % 256]) * 3 for i in range(n)], pa.binary()),
        "fx": pa.array([bytes([i % 256]) * 4 for i in range(n)], pa.binary(4)),
        "flag": pa.array([None if i % 11 == 0 else i % 2 == 0 for i in range(n)]),
        "l": pa.array([[i, i + 1] if i % 3 else None for i in range(n)], pa.list_(pa.int64())),
        "st": pa.array([{"x": i, "y": str(i)} for i in range(n)], pa.struct([("x", pa.int32()), ("y", pa.string())])),
        "m": pa.array([[("k", i)] for i in range(n)], pa.map_(pa.string(), pa.int64())),
    })


@pytest.fixture(params=["parquet", "avro"])
def typed_table(request, tmp_path, kms):
    """An encrypted table of every type, appended in three commits."""
    data = all_types()
    table = EncryptedTable.create(str(tmp_path / "t"), data.schema, kms=kms, table_key_id="keyA")
    for lo, hi in ((0, 100), (100, 250), (250, N)):
        table.append(data.slice(lo, hi - lo), file_format=request.param)
    return table, data


def _same(got: pa.Table, want: pa.Table) -> None:
    got = sort_table(got)
    want = sort_table(want)
    assert got.column_names == want.column_names
    for name in want.column_names:
        assert got.column(name).cast(want.column(name).type).equals(want.column(name)), name


def test_every_type_reads_back(typed_table):
    table, data = typed_table
    _same(table.scan().to_arrow(), data)
    assert table.verify().ok


TYPE_FILTERS = [
    "id >= 120 and id < 130",
    "i < -900",
    "d > 1.5",
    "dec >= 250.00",
    "dec is null",
    "day < '2020-02-01'",
    "ts >= '2020-09-20T00:00:00'",
    "tstz < '2020-09-13T13:00:00+00:00'",
    "s = 's0042'",
    "s like 's01%'",
    "s is null",
    "flag = true",
    "flag is null",
    "t > '00:04:00'",
]


@pytest.mark.parametrize("row_filter", TYPE_FILTERS)
def test_filters_on_every_type(typed_table, row_filter):
    table, data = typed_table
    predicate = expression_to_pyarrow(bind(table.schema, parse(row_filter), True), table.schema)
    want = data.filter(predicate)
    assert want.num_rows > 0  # the filter is not vacuous
    scan = table.scan(row_filter=row_filter)
    _same(scan.to_arrow(), want)


def test_stats_prune_written_files(typed_table):
    table, _ = typed_table
    scan = table.scan(row_filter="id >= 260")
    scan.plan_files()
    if table.scan().plan_files()[0].file.file_format == "PARQUET":
        assert scan.metrics.data_files_skipped == 2  # only the third append holds ids >= 260


def test_nested_projection(typed_table):
    table, data = typed_table
    got = table.scan(columns=["st.x", "id"]).to_arrow()
    assert got.column_names == ["id", "st"]  # nested selections keep schema order
    assert got.schema.field("st").type == pa.struct([pa.field("x", pa.int32())])
    got = sort_table(got)
    assert got.column("st").combine_chunks().field("x").to_pylist() == data.column("st").combine_chunks().field("x").to_pylist()


# --- plaintext tables -------------------------------------------------------------------------------


def test_plaintext_table(tmp_path):
    data = all_types(120)
    table = EncryptedTable.create(str(tmp_path / "plain"), data.schema, kms=None, table_key_id=None)
    table.append(data.slice(0, 60))
    table.append(data.slice(60))
    table = EncryptedTable.load(tmp_path / "plain")  # no KMS needed
    assert not table.encrypted and table.encryption_manager is None
    _same(table.scan().to_arrow(), data)
    _same(table.scan(row_filter="id < 70 and id >= 50").to_arrow(), data.slice(50, 20))
    assert table.verify().ok


def test_require_encryption_refuses_plaintext_tables(tmp_path, kms):
    import json

    from icecrypt.table import PlaintextFileError

    data = all_types(10)
    EncryptedTable.create(str(tmp_path / "plain"), data.schema, kms=None, table_key_id=None).append(data)
    with pytest.raises(PlaintextFileError, match=r"plain/metadata/v2\.metadata\.json: the table is not encrypted"):
        EncryptedTable.load(tmp_path / "plain", require_encryption=True)
    table = EncryptedTable.create(str(tmp_path / "enc"), data.schema, kms=kms, table_key_id="keyA")
    table.append(data)
    table = EncryptedTable.load(tmp_path / "enc", kms=kms, require_encryption=True)
    assert table.encrypted
    # a newer version that dropped encryption.key-id is refused at refresh; the object keeps its state
    current = json.loads((tmp_path / "enc/metadata/v2.metadata.json").read_text())
    del current["properties"]["encryption.key-id"]
    (tmp_path / "enc/metadata/v3.metadata.json").write_text(json.dumps(current))
    with pytest.raises(PlaintextFileError, match="v3.metadata.json"):
        table.refresh()
    assert table.metadata_location.endswith("v2.metadata.json")


def test_plaintext_avro_data_files(tmp_path):
    """Plain Avro data files (as Java writes in unencrypted tables): the data file of the
    second append is replaced by an Avro file with the same rows, and its manifest entry
    rewritten to point at it."""
    from icecrypt.avro import arrow_to_avro_schema

    data = all_types(80).select(["id", "i", "d", "dec", "day", "ts", "s", "b", "flag"])
    table = EncryptedTable.create(str(tmp_path / "plain"), data.schema, kms=None, table_key_id=None)
    table.append(data.slice(0, 30))
    table.append(data.slice(30))
    avro_path = tmp_path / "plain" / "data" / "rows.avro"
    rows = table.scan(snapshot_id=table.current_snapshot_id, row_filter="id >= 30").to_arrow()
    with open(avro_path, "wb") as out:
        fastavro.writer(out, fastavro.parse_schema(arrow_to_avro_schema(rows.schema)), rows.to_pylist())
    manifest = table.manifests(table.current_snapshot())[0]
    assert manifest.added_snapshot_id == table.current_snapshot_id
    path = Path(table.fs_path(manifest.path))
    with open(path, "rb") as f:
        reader = fastavro.reader(f)
        schema, meta, entries = reader.writer_schema, reader.metadata, list(reader)
    (entry,) = entries
    entry["data_file"].update(file_path=str(avro_path), file_format="AVRO", file_size_in_bytes=avro_path.stat().st_size, split_offsets=None)
    with open(path, "wb") as f:
        fastavro.writer(f, fastavro.parse_schema(schema), entries, metadata={k: v for k, v in meta.items() if not k.startswith("avro.")})
    assert [t.file.file_format for t in table.scan().plan_files()].count("AVRO") == 1
    _same(table.scan().to_arrow(), data)
    _same(table.scan(columns=["s", "id"], row_filter="id > 70").to_arrow(), data.slice(71).select(["s", "id"]))
    assert table.verify().ok


def test_plaintext_table_refuses_encrypted_files_and_key_ids(tmp_path, kms):
    data = all_types(50)
    plain = EncryptedTable.create(str(tmp_path / "plain"), data.schema, kms=None, table_key_id=None)
    plain.append(data)
    enc = EncryptedTable.create(str(tmp_path / "enc"), data.schema, kms=kms, table_key_id="keyA")
    enc.append(data)
    snapshot = plain.current_snapshot()
    # an AGS1 manifest list where a plaintext one is expected
    shutil.copyfile(enc.fs_path(enc.current_snapshot().manifest_list), plain.fs_path(snapshot.manifest_list))
    with pytest.raises(FormatError, match="encrypted \\(AGS1\\), but the table has no encryption.key-id"):
        plain.scan().to_arrow()
    assert [p.kind for p in plain.verify().problems] == ["damaged"]

    def add_key_id(metadata: dict) -> None:
        metadata["snapshots"][0]["key-id"] = "abc"

    edit_metadata(Path(plain.metadata_location), add_key_id)
    with pytest.raises(FormatError, match="has key-id 'abc', but the table has no encryption.key-id"):
        plain.refresh().scan().to_arrow()


# --- splits of a large Avro file ------------------------------------------------------------------------


def test_avro_splits_of_a_multi_block_file(tmp_path, kms):
    rng = np.random.default_rng(3)
    n = 60_000
    noise = rng.bytes(40 * n).hex()
    data = pa.table({"id": pa.array(np.arange(n), pa.int64()), "payload": [noise[i * 80 : i * 80 + 80] for i in range(n)]})
    table = EncryptedTable.create(str(tmp_path / "big"), data.schema, kms=kms, table_key_id="keyA")
    table.append(data, file_format="avro")
    whole = table.scan()
    (task,) = whole.plan_files()
    assert task.file.file_size_in_bytes > 2 * 2**20  # several AGS1 blocks
    split = table.scan(split_size=700_000)
    assert len(split.plan_files()) == 5  # ceil(3.07 MB / 0.7 MB)
    _same(split.to_arrow(), data)
    table.delete("id < 10")  # a DV: the file is then read whole (positions)
    after = table.scan(split_size=700_000)
    assert len(after.plan_files()) == 1
    _same(after.to_arrow(), data.slice(10))


# --- schema evolution (by field id) ------------------------------------------------------------------------


def test_renamed_and_added_columns(golden_copy):
    table, _ = golden_copy("enc_parquet_dek16")

    def evolve(metadata: dict) -> None:
        schema = json.loads(json.dumps(metadata["schemas"][0]))
        schema["schema-id"] = 1
        for field in schema["fields"]:
            if field["name"] == "category":
                field["name"] = "kind"
            if field["name"] == "qty":
                field["type"] = "long"  # int -> long promotion
        schema["fields"].append({"id": 10, "name": "extra", "required": False, "type": "string"})
        metadata["schemas"].append(schema)
        metadata["current-schema-id"] = 1
        metadata["last-column-id"] = 10

    edit_metadata(Path(table.metadata_location), evolve)
    table = table.refresh()
    got = table.scan().to_arrow()
    assert got.column_names[:2] == ["id", "kind"] and got.column_names[-1] == "extra"
    assert got.schema.field("qty").type == pa.int64()
    assert got.column("extra").null_count == got.num_rows
    java = table.scan(snapshot_id=table.current_snapshot_id)  # time travel: the snapshot's schema
    assert "category" in java.arrow_schema.names and "extra" not in java.arrow_schema.names
    gamma = table.scan(row_filter="kind = 'gamma'")
    assert set(gamma.to_arrow().column("kind").to_pylist()) == {"gamma"}
    assert gamma.metrics.manifests_skipped == 1


# --- Java's tables on S3 (moto), at their recorded locations --------------------------------------------


@pytest.fixture(scope="module")
def golden_s3():
    """A moto S3 server holding the shared tables in bucket icecrypt-golden, exactly at
    the locations their metadata records (no location map)."""
    pytest.importorskip("boto3")
    pytest.importorskip("moto.server")
    from servers.moto import moto_server

    with moto_server() as server:
        s3 = server.boto3_client("s3")
        s3.create_bucket(Bucket="icecrypt-golden")
        for name in TABLE_NAMES:
            for path in (TABLES_DIR / name).rglob("*"):
                if path.is_file() and path.parts[-2] != name:  # data/ and metadata/, not expected.json
                    s3.upload_file(str(path), "icecrypt-golden", f"{name}/{path.relative_to(TABLES_DIR / name)}")
        fs = pafs.S3FileSystem(
            endpoint_override=f"{server.host}:{server.port}", scheme="http", access_key=server.access_key_id,
            secret_key=server.secret_access_key, region=server.region,
        )  # fmt: skip
        yield fs


@pytest.mark.servers
@pytest.mark.parametrize("name", TABLE_NAMES)
def test_java_tables_on_s3(golden_s3, kms, name):
    uri = f"s3://icecrypt-golden/{name}/{expected(name)['metadata_location']}"
    table = EncryptedTable.load(uri, kms=kms, filesystem=golden_s3)
    assert table_digest(table.scan().to_arrow()) == expected(name)["expected"]["digest_sha256"]
    assert table.verify().ok


# --- files without field ids or without their identity-partition column -----------------------------------


def _replace_data_file(table: EncryptedTable, rows: pa.Table) -> None:
    """Overwrite the (only) data file of a plaintext table with ``rows`` written by plain
    pyarrow: no field ids, only the given columns; the manifest still describes it (same
    row count)."""
    (task,) = table.scan().plan_files()
    pq.write_table(rows, task.file.fs_path)
    size = Path(task.file.fs_path).stat().st_size
    manifest = table.manifests(table.current_snapshot())[0]
    path = Path(table.fs_path(manifest.path))
    with open(path, "rb") as f:
        reader = fastavro.reader(f)
        schema, meta, entries = reader.writer_schema, reader.metadata, list(reader)
    entries[0]["data_file"].update(file_size_in_bytes=size, split_offsets=None)
    with open(path, "wb") as f:
        fastavro.writer(f, fastavro.parse_schema(schema), entries, metadata={k: v for k, v in meta.items() if not k.startswith("avro.")})


def test_files_without_field_ids_use_the_name_mapping(tmp_path):
    from pyiceberg.table.name_mapping import create_mapping_from_schema

    data = pa.table({"id": pa.array(range(20), pa.int64()), "name": [f"n{i}" for i in range(20)]})
    table = EncryptedTable.create(str(tmp_path / "t"), data.schema, kms=None, table_key_id=None)
    table.append(data)
    _replace_data_file(table, pa.table({"name": data["name"], "id": data["id"]}))  # no ids, other order
    with pytest.raises(FormatError, match="without field ids.*name-mapping"):
        table.scan().to_arrow()
    mapping = create_mapping_from_schema(table.schema).model_dump_json()
    edit_metadata(Path(table.metadata_location), lambda m: m["properties"].update({"schema.name-mapping.default": mapping}))
    _same(table.refresh().scan().to_arrow(), data)
    _same(table.scan(row_filter="id >= 15").to_arrow(), data.slice(15))


def test_identity_partition_values_fill_missing_columns(tmp_path):
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import IdentityTransform

    data = pa.table({"id": pa.array(range(10), pa.int64()), "cat": ["x"] * 10})
    spec = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="cat"))
    table = EncryptedTable.create(str(tmp_path / "t"), data.schema, kms=None, table_key_id=None, partition_spec=spec)
    table.append(data)
    ids_only = data.select(["id"])
    ids_only = ids_only.cast(pa.schema([pa.field("id", pa.int64(), metadata={b"PARQUET:field_id": b"1"})]))
    _replace_data_file(table, ids_only)
    _same(table.scan().to_arrow(), data)

"""Partition directories as Iceberg Java names them (``PartitionSpec.partitionToPath``:
the transform's human string, escaped by ``java.net.URLEncoder``), and tables whose
partition values hold ``/`` or ``\\``: Java writes them as one directory
(``category=N%2FA``), and every reader takes that name literally.

The expected names below are what Iceberg Java (apache/iceberg @7f879b1, run on Java 17)
printed for the same values; "Java-shaped" tables put their data files at those
literal names, written here without icecrypt's own path code, and commit them."""

from __future__ import annotations

import datetime
import os
import uuid
from decimal import Decimal

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from pyiceberg.expressions import EqualTo
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    TruncateTransform,
    YearTransform,
)
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    LongType,
    NestedField,
    StringType,
    TimestampNanoType,
    TimestampType,
    TimestamptzNanoType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from icecrypt.table import EncryptedTable
from icecrypt.table.files.layout import escape, human_string, partition_path
from icecrypt.table.files.write_data import (
    DataWriteOptions,
    _ParquetFile,
    _parquet_stats,
    _statistics_plan,
    data_file_record,
)
from icecrypt.table.model.schema import arrow_write_schema
from icecrypt.table.ops.write import append_files

SCHEMA = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "category", StringType(), required=False))
MEMORY_KMS = ["--kms-type", "memory", "--kms-property", "encryption.kms.memory.iceberg-test-keys=true"]
BY_CATEGORY = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "category"))

#: partition value -> the directory Iceberg Java wrote for it (identity of a string column)
JAVA_DIRECTORIES = {
    "N/A": "category=N%2FA",
    "a/b": "category=a%2Fb",
    "a\\b": "category=a%5Cb",
    "../x": "category=..%2Fx",
    "..": "category=..",
    ".": "category=.",
    "x y+z": "category=x+y%2Bz",
    "~*.-_": "category=%7E*.-_",
    "a b~*'()!": "category=a+b%7E*%27%28%29%21",
    "\u00e9\u20ac": "category=%C3%A9%E2%82%AC",
    "%2F": "category=%252F",
    "a%2e%2e": "category=a%252e%252e",
    "\x01": "category=%01",
    "https://h/p?q=1": "category=https%3A%2F%2Fh%2Fp%3Fq%3D1",
    None: "category=null",
}


def test_directory_names_are_javas():
    for value, directory in JAVA_DIRECTORIES.items():
        assert partition_path(BY_CATEGORY, SCHEMA, (value,)) == directory, value
    assert escape("a b~*'()!-_.\u00e9\u0001/\\%") == "a+b%7E*%27%28%29%21-_.%C3%A9%01%2F%5C%25"


@pytest.mark.parametrize(
    ("transform", "source", "value", "java"),
    [
        (IdentityTransform(), BooleanType(), True, "true"),
        (IdentityTransform(), FloatType(), 1.5, "1.5"),
        (IdentityTransform(), FloatType(), float("nan"), "NaN"),
        (IdentityTransform(), FloatType(), 1.401298464324817e-45, "1.4E-45"),
        (IdentityTransform(), FloatType(), 16777216.0, "1.6777216E7"),
        (IdentityTransform(), DoubleType(), 1e20, "1.0E20"),
        (IdentityTransform(), DoubleType(), 1e-7, "1.0E-7"),
        (IdentityTransform(), DoubleType(), 9.99e-4, "9.99E-4"),
        (IdentityTransform(), DoubleType(), 0.002, "0.002"),
        (IdentityTransform(), DoubleType(), 5e-324, "4.9E-324"),
        (IdentityTransform(), DoubleType(), float("-inf"), "-Infinity"),
        (IdentityTransform(), DoubleType(), -0.0, "-0.0"),
        (IdentityTransform(), DoubleType(), 100.0, "100.0"),
        (IdentityTransform(), DecimalType(9, 2), Decimal("-1.50"), "-1.50"),
        (IdentityTransform(), DateType(), -1, "1969-12-31"),
        (IdentityTransform(), DateType(), 2932897, "10000-01-01"),
        (IdentityTransform(), DateType(), -719529, "-001-12-31"),
        (IdentityTransform(), TimeType(), 0, "00:00"),
        (IdentityTransform(), TimeType(), 1000, "00:00:00.001"),
        (IdentityTransform(), TimeType(), 3723000001, "01:02:03.000001"),
        (IdentityTransform(), TimestampType(), 0, "1970-01-01T00:00:00"),
        (IdentityTransform(), TimestampType(), 1000, "1970-01-01T00:00:00.001"),
        (IdentityTransform(), TimestampType(), -1, "1969-12-31T23:59:59.999999"),
        (IdentityTransform(), TimestampType(), 253402300800000000, "+10000-01-01T00:00:00"),
        (IdentityTransform(), TimestamptzType(), 1, "1970-01-01T00:00:00.000001+00:00"),
        (IdentityTransform(), TimestampNanoType(), -1, "1969-12-31T23:59:59.999999999"),
        (IdentityTransform(), TimestamptzNanoType(), 1, "1970-01-01T00:00:00.000000001+00:00"),
        (IdentityTransform(), UUIDType(), uuid.UUID("f79c3e09-677c-4bbd-a479-3f349cb785e7"),
         "f79c3e09-677c-4bbd-a479-3f349cb785e7"),
        (IdentityTransform(), BinaryType(), b"\xfb\xff\xbf", "+/+/"),
        (IdentityTransform(), FixedType(3), b"\x01\x02\x03", "AQID"),
        (IdentityTransform(), LongType(), -(2**63), "-9223372036854775808"),
        (YearTransform(), DateType(), -1, "1969"),
        (MonthTransform(), DateType(), -1, "1969-12"),
        (DayTransform(), TimestampType(), -1, "1969-12-31"),
        (HourTransform(), TimestampType(), -1, "1969-12-31-23"),
        (BucketTransform(16), StringType(), 3, "3"),
        (TruncateTransform(3), BinaryType(), b"\xfb\xff\xbf", "+/+/"),
        (IdentityTransform(), StringType(), None, "null"),
    ],
)
def test_human_strings_are_javas(transform, source, value, java):
    assert human_string(transform, source, value) == java


# --- Java-shaped tables: data files at the directory names Java wrote ---------------------------------


def java_file(table: EncryptedTable, directory: str, rows: pa.Table, partition: dict) -> dict:
    """Write ``rows`` as one data file at ``<location>/data/<directory>/`` (the literal
    directory name Iceberg Java wrote, "" for none); returns its manifest record."""
    from icecrypt.table.commit.target import _Target

    target = _Target.of(table)
    io = target.io(target.manager(table.metadata))
    arrow_schema = arrow_write_schema(table.schema)
    location = f"{table.location}/data/{directory + '/' if directory else ''}00000-0-{uuid.uuid4()}-00001.parquet"
    file = _ParquetFile(io, io.ensure_parent(location), arrow_schema, DataWriteOptions.from_properties(table.properties))
    file.write(rows.select(arrow_schema.names).cast(arrow_schema))
    length, key, metadata = file.close()
    stats = _parquet_stats(metadata, {}, table.schema, _statistics_plan(table.schema, table.properties))
    return data_file_record(location, "PARQUET", partition, rows.num_rows, length, key, stats, 0)


def java_append(table: EncryptedTable, directories: dict) -> None:
    """Commit one data file per ``directories`` entry (partition value -> Java's directory
    name), as Iceberg Java places it."""
    records = [
        java_file(table, directory, pa.table({"id": pa.array([n], pa.int64()), "category": pa.array([value], pa.string())}),
                  {"category": value})
        for n, (value, directory) in enumerate(directories.items())
    ]  # fmt: skip
    append_files(table, records)


@pytest.fixture(params=["encrypted", "plaintext"])
def java_table(request, tmp_path, kms):
    key = "keyA" if request.param == "encrypted" else None
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id=key, partition_spec=BY_CATEGORY)
    java_append(table, JAVA_DIRECTORIES)
    return table.refresh()


def test_java_tables_with_escaped_separators_read_verify_and_prune(java_table, tmp_path):
    directories = sorted(os.listdir(tmp_path / "t" / "data"))
    assert directories == sorted(JAVA_DIRECTORIES.values())  # literal names on disk, one directory each
    rows = java_table.scan().to_arrow()
    assert sorted(rows.column("category").to_pylist(), key=str) == sorted(JAVA_DIRECTORIES, key=str)
    report = java_table.verify()
    assert report.ok, report.problems
    for n, value in enumerate(JAVA_DIRECTORIES):
        if value is None:
            continue
        scan = java_table.scan(row_filter=EqualTo("category", value))
        assert scan.to_arrow().column("id").to_pylist() == [n], value
        assert len(scan.plan_files()) == 1  # pruned by the partition value, as Java plans it
    assert java_table.scan(row_filter="category is null").to_arrow().num_rows == 1


def test_the_cli_reads_and_verifies_a_java_table(java_table, capfd):
    from tablelib import run_cli

    status, out, err = run_cli(capfd, "table", "verify", java_table.metadata_location, *MEMORY_KMS)
    assert status == 0, err
    status, out, err = run_cli(capfd, "table", "scan", java_table.metadata_location, *MEMORY_KMS,
                               "--filter", "category = 'N/A'")
    assert status == 0, err
    assert "N/A" in out and "a/b" not in out


def test_appending_values_with_separators_writes_javas_directories(tmp_path, kms):
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA", partition_spec=BY_CATEGORY)
    values = list(JAVA_DIRECTORIES)
    table.append(pa.table({"id": pa.array(range(len(values)), pa.int64()), "category": pa.array(values, pa.string())}))
    assert sorted(os.listdir(tmp_path / "t" / "data")) == sorted(JAVA_DIRECTORIES.values())
    assert sorted(os.listdir(tmp_path)) == ["t"]  # '../x' stayed one name inside data/
    paths = [task.file.path for task in table.scan().plan_files()]
    for value, directory in JAVA_DIRECTORIES.items():
        assert sum(f"/data/{directory}/" in p for p in paths) == 1, value
    assert table.scan(row_filter="category = '../x'").to_arrow().column("id").to_pylist() == [values.index("../x")]
    assert table.verify().ok
    # and rewrite, expiry and orphan removal keep to those names
    table.rewrite_data_files()
    table = table.refresh()
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == list(range(len(values)))
    assert table.remove_orphan_files(older_than=datetime.datetime.now(datetime.timezone.utc), dry_run=True) is not None


@pytest.mark.servers
def test_java_table_on_s3_keeps_the_encoded_name_as_one_key(moto_server, kms):
    """pyarrow's S3 filesystem sends ``N%2FA`` as those five characters of the key: the
    object is listed under one directory name, never under ``N/A``."""
    bucket = f"icecrypt-{uuid.uuid4().hex[:12]}"
    client = moto_server.boto3_client("s3")
    client.create_bucket(Bucket=bucket)
    fs = pafs.S3FileSystem(endpoint_override=f"{moto_server.host}:{moto_server.port}", scheme="http",
                           access_key=moto_server.access_key_id, secret_key=moto_server.secret_access_key,
                           region=moto_server.region)  # fmt: skip
    table = EncryptedTable.create(f"s3://{bucket}/t", SCHEMA, kms=kms, table_key_id="keyA", partition_spec=BY_CATEGORY,
                                  filesystem=fs)  # fmt: skip
    java_append(table, {"N/A": "category=N%2FA", "a\\b": "category=a%5Cb"})
    table.append(pa.table({"id": pa.array([7], pa.int64()), "category": pa.array(["x/y"], pa.string())}))
    listed = client.list_objects_v2(Bucket=bucket, Prefix="t/data/")["Contents"]
    keys = [o["Key"] for o in listed if not o["Key"].endswith("/")]  # not pyarrow's directory markers
    assert {k.split("/")[2] for k in keys} == {"category=N%2FA", "category=a%5Cb", "category=x%2Fy"}
    assert all(len(k.split("/")) == 4 for k in keys)
    table = EncryptedTable.load(f"s3://{bucket}/t", kms=kms, filesystem=fs)
    assert sorted(table.scan().to_arrow().column("category").to_pylist()) == ["N/A", "a\\b", "x/y"]
    assert table.scan(row_filter="category = 'x/y'").to_arrow().num_rows == 1
    assert table.verify().ok


def test_java_table_through_fsspec(tmp_path, kms):
    """The same table read and written through fsspec's local filesystem (pyarrow's
    FSSpecHandler): the encoded name is a name there too."""
    from fsspec.implementations.local import LocalFileSystem

    fs = pafs.PyFileSystem(pafs.FSSpecHandler(LocalFileSystem()))
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA", partition_spec=BY_CATEGORY,
                                  filesystem=fs)  # fmt: skip
    java_append(table, {"N/A": "category=N%2FA"})
    table.append(pa.table({"id": pa.array([7], pa.int64()), "category": pa.array(["../y"], pa.string())}))
    assert sorted(os.listdir(tmp_path / "t" / "data")) == ["category=..%2Fy", "category=N%2FA"]
    table = EncryptedTable.load(str(tmp_path / "t"), kms=kms, filesystem=fs)
    assert sorted(table.scan().to_arrow().column("category").to_pylist()) == ["../y", "N/A"]
    assert table.verify().ok

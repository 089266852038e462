"""``icecrypt.spark.read_table``: Spark's own Parquet reader over encrypted tables (the
native path, ``icecrypt.spark._native``) gives, row for row, what the Python path
(``icecrypt.iceberg``) and ``EncryptedTable.scan()`` give: on the tables Iceberg Java wrote
(../shared/tables), and on tables icecrypt writes with a renamed and a re-added column and
with deletes (deletion vectors and position deletes applied in Spark's Parquet scan by
the LiveRows format, equality deletes in Python tasks); tampered files fail the read, naming
the file."""

from __future__ import annotations

import base64
import json
import os
import struct

import pyarrow as pa
import pytest
from pyiceberg.types import LongType, StringType
from sparkhelpers import table_lines
from table.tablelib import TABLE_NAMES, copy_table, flip_byte, location_map, metadata_path

import icecrypt.spark
from icecrypt.kms.local import LocalKms
from icecrypt.kms.memory import MemoryKms
from icecrypt.spark import _native
from icecrypt.table import EncryptedTable

pytestmark = pytest.mark.spark

JAVA_KMS = {"encryption.kms-type": "memory", "encryption.kms.memory.iceberg-test-keys": "true"}


@pytest.fixture(scope="module")
def nspark(spark):
    """The shared session, icecrypt's jar added at run time (what read_table does itself)."""
    assert _native.native_available(spark)
    return spark


def _plan(frame) -> str:
    return frame._jdf.queryExecution().executedPlan().toString()


def _three_ways(spark, location: str, table: EncryptedTable, options: dict[str, str], columns=None):
    """(native, Python path, EncryptedTable.scan) rows as canonical lines, and the native plan."""
    extra = {"columns": ",".join(columns)} if columns else {}
    native = icecrypt.spark.read_table(spark, location, **options, **extra)
    python = icecrypt.spark.read_table(spark, location, **options, **extra, native="false")
    want = table.scan(columns=columns).to_arrow()
    names = want.column_names
    assert native.columns == python.columns == names
    got = [table_lines(frame.toArrow(), names) for frame in (native, python)]
    return got[0], got[1], table_lines(want, names), _plan(native), _plan(python)


@pytest.mark.parametrize("name", TABLE_NAMES)
def test_java_tables_native_equals_python_equals_scan(nspark, name):
    table = EncryptedTable.load(metadata_path(name), kms=MemoryKms.with_iceberg_test_keys(),
                                location_map=location_map(name))
    options = {**JAVA_KMS, "location-map": json.dumps(location_map(name))}
    native, python, scan, plan, python_plan = _three_ways(nspark, str(metadata_path(name)), table, options)
    assert native == python == scan and len(scan) > 1000
    assert "BatchEvalPython" not in python_plan and "FileScan parquet" not in python_plan
    if name == "enc_avro_dek16":  # Avro data files only: all of it on the Python path
        assert "FileScan parquet" not in plan
    else:
        assert "FileScan parquet" in plan
    # the deletes table: files with a deletion vector or equality deletes go through Python
    assert ("MapInArrow" in plan) == (name == "enc_deletes_dek16")
    # a projection
    cols = ["qty", "id"] if name == "enc_parquet_dek16" else ["id"]
    native, python, scan, _, _ = _three_ways(nspark, str(metadata_path(name)), table, options, cols)
    assert native == python == scan


def _icecrypt_table(tmp_path) -> tuple[EncryptedTable, dict[str, str]]:
    keystore = tmp_path / "keystore.json"
    LocalKms.create_keystore(keystore, ["master"])
    kms = LocalKms(keystore)
    schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.float64())])
    table = EncryptedTable.create(str(tmp_path / "t"), schema, kms=kms, table_key_id="master")
    table.append(pa.table({"id": pa.array(range(100), pa.int64()), "name": [f"n{i % 7}" for i in range(100)],
                           "amount": [i * 1.5 for i in range(100)]}), target_file_size=600)
    return table, {"encryption.kms-type": "local", "encryption.kms.local.keystore": str(keystore)}


def test_icecrypt_table_renamed_readded_columns_and_deletes(nspark, tmp_path):
    """A column renamed, one dropped and a new one added (field ids differ: Spark matching
    by name would read the old values), then deletes: native, Python and scan agree at
    each step.  A name given to another column (re-added) sends the read to the Python
    path (Spark's Parquet filters match names: test_filters_on_reused_names_read_right)."""
    table, options = _icecrypt_table(tmp_path)
    with table.update_schema() as update:
        update.rename_column("name", "label")
    with table.update_schema() as update:
        update.delete_column("amount")
    with table.update_schema() as update:
        update.add_column("total", LongType())
    table.append(pa.table({"id": pa.array([1000, 1001], pa.int64()), "label": ["x", None],
                           "total": pa.array([7, 8], pa.int64())}))
    native, python, scan, plan, _ = _three_ways(nspark, table.location, table, options)
    assert native == python == scan and len(scan) == 102
    assert "FileScan parquet" in plan and "MapInArrow" not in plan
    assert {json.loads(line)[1] for line in scan} >= {"n0", "x"}  # the renamed column's values
    table.delete("id < 10")  # a deletion vector on the first file: Spark's reader through LiveRows
    native, python, scan, plan, _ = _three_ways(nspark, table.location, table, options)
    assert native == python == scan and len(scan) == 92
    assert "FileScan parquet" in plan and "FileScan icecrypt-live-rows" in plan and "MapInArrow" not in plan
    with table.update_schema() as update:
        update.add_column("name", StringType())  # the old name of "label", for another column
    native, python, scan, plan, _ = _three_ways(nspark, table.location, table, options)
    assert native == python == scan and len(scan) == 92
    assert "FileScan parquet" not in plan and "(Python)" in plan


def test_a_read_of_more_files_than_sparks_listing_threshold(nspark, tmp_path):
    """Past spark.sql.sources.parallelPartitionDiscovery.threshold (32 paths) Spark lists a
    read's files in a job of its own; the read's keys and deletes, which that job is not
    given (NativeRouting.plannedRead), still reach the reader: 40 files, then deletes in
    every one of them (the LiveRows read of 40 files)."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import IdentityTransform

    keystore = tmp_path / "keystore.json"
    LocalKms.create_keystore(keystore, ["master"])
    kms = LocalKms(keystore)
    schema = pa.schema([("id", pa.int64()), ("p", pa.int64())])
    spec = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="p"))
    table = EncryptedTable.create(str(tmp_path / "t"), schema, kms=kms, table_key_id="master", partition_spec=spec)
    table.append(pa.table({"id": pa.array(range(400), pa.int64()), "p": pa.array([i % 40 for i in range(400)], pa.int64())}))
    assert len(list(table.scan().plan_files())) == 40
    options = {"encryption.kms-type": "local", "encryption.kms.local.keystore": str(keystore)}
    native, python, scan, plan, _ = _three_ways(nspark, table.location, table, options)
    assert native == python == scan and len(scan) == 400
    assert "FileScan parquet" in plan and "MapInArrow" not in plan
    table.delete("id < 40")  # a row of each file
    native, python, scan, plan, _ = _three_ways(nspark, table.location, table, options)
    assert native == python == scan and len(scan) == 360
    assert "FileScan icecrypt-live-rows" in plan and "FileScan parquet" not in plan and "MapInArrow" not in plan


def test_tampered_file_fails_the_native_read_naming_it(nspark, tmp_path):
    name = "enc_parquet_dek16"
    root = copy_table(name, tmp_path)
    options = {**JAVA_KMS, "location-map": json.dumps(location_map(name, root)), "native": "true"}
    victim = sorted((root / "data").rglob("*.parquet"))[0]
    flip_byte(victim, os.path.getsize(victim) // 2)
    # the session's "skip what cannot be read" settings do not apply to a native read
    saved = {k: nspark.conf.get(k) for k in ("spark.sql.files.ignoreCorruptFiles", "spark.sql.files.ignoreMissingFiles")}
    try:
        for key in saved:
            nspark.conf.set(key, "true")
        frame = icecrypt.spark.read_table(nspark, str(metadata_path(name, root)), **options)
        assert "FileScan parquet" in _plan(frame)
        with pytest.raises(Exception) as caught:
            frame.collect()
    finally:
        for key, value in saved.items():
            nspark.conf.set(key, value)
    text = str(caught.value)
    assert victim.name in text and ("Tag" in text or "tag" in text), text[:3000]


def test_a_file_of_another_size_or_outside_the_plan_is_refused(nspark, tmp_path):
    """A data file replaced by a longer one fails on the key metadata's file_length."""
    name = "enc_parquet_dek16"
    root = copy_table(name, tmp_path)
    options = {**JAVA_KMS, "location-map": json.dumps(location_map(name, root)), "native": "true"}
    victim = sorted((root / "data").rglob("*.parquet"))[-1]
    with open(victim, "ab") as f:
        f.write(b"\0" * 10)
    with pytest.raises(Exception) as caught:
        icecrypt.spark.read_table(nspark, str(metadata_path(name, root)), **options).count()
    assert victim.name in str(caught.value) and "longer than written" in str(caught.value)


def test_native_true_says_why_it_does_not_apply(nspark):
    name = "enc_parquet_dek16"
    options = {**JAVA_KMS, "location-map": json.dumps(location_map(name)), "native": "true"}
    with pytest.raises(ValueError, match="option filter"):
        icecrypt.spark.read_table(nspark, str(metadata_path(name)), **options, filter="qty > 3")
    with pytest.raises(ValueError, match="must be auto, true or false"):
        icecrypt.spark.read_table(nspark, str(metadata_path(name)), **{**options, "native": "yes"})


def test_configure_adds_the_jar():
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.config("spark.jars", "/x/other.jar")
    icecrypt.spark.configure(builder)
    jars = builder._options["spark.jars"].split(",")
    assert jars[0] == "/x/other.jar" and jars[1] == icecrypt.spark.jar_path() and os.path.isfile(jars[1])
    assert builder._options[_native.FIELD_ID_READ] == "true"
    assert builder._options[_native.FIELD_ID_IGNORE_MISSING] == "false"


def test_the_factory_refuses_files_outside_the_read_and_malformed_entries(nspark, tmp_path):
    """org.icecrypt.spark.FileDecryption, called as parquet-java calls it: a file the read
    did not plan, a read without keys and a malformed entry fail with messages that name
    the file or entry and hold no key; a planned file gets its DEK and AAD prefix."""
    from py4j.protocol import Py4JJavaError

    from icecrypt.keys import StandardKeyMetadata

    jvm = nspark.sparkContext._jvm
    factory = jvm.org.icecrypt.spark.FileDecryption()
    planned, other = tmp_path / "a.parquet", tmp_path / "b.parquet"
    planned.write_bytes(b"x" * 40)
    other.write_bytes(b"x" * 40)
    km = StandardKeyMetadata(os.urandom(16), os.urandom(16), 40)

    class File:
        def key(self):
            return km

    def conf(value: str | None):
        c = jvm.org.apache.hadoop.conf.Configuration(False)
        if value is not None:
            c.set(_native.KEYS_PROPERTY, value)
        return c

    keys = _native._file_keys({f"file://{planned}": File()})
    props = factory.getFileDecryptionProperties(conf(keys), jvm.org.apache.hadoop.fs.Path(f"file://{planned}"))
    assert bytes(props.getFooterKey()) == km.encryption_key and bytes(props.getAADPrefix()) == km.aad_prefix
    secret_forms = [km.encryption_key.hex(), keys.split(".")[1]]
    for value, path, message in ((keys, other, "is not a data file of this read"),
                                 (None, planned, "has no icecrypt.secret.file-keys"),
                                 (keys.replace(".", ":", 1), planned, "entry 0 of icecrypt.secret.file-keys is malformed")):
        with pytest.raises(Py4JJavaError) as caught:
            factory.getFileDecryptionProperties(conf(value), jvm.org.apache.hadoop.fs.Path(f"file://{path}"))
        text = str(caught.value.java_exception.getMessage())
        assert message in text and not any(form in text for form in secret_forms), text
        if value is not None and message.startswith("is not"):
            assert path.name in text
    planned.write_bytes(b"x" * 39)  # the file no longer has the key metadata's length
    with pytest.raises(Py4JJavaError, match="truncated"):
        factory.getFileDecryptionProperties(conf(keys), jvm.org.apache.hadoop.fs.Path(f"file://{planned}"))


def test_plaintext_table_with_encryption_none(nspark, tmp_path):
    """A plaintext table (option encryption=none) is read natively without the factory."""
    schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
    table = EncryptedTable.create(str(tmp_path / "plain"), schema, kms=None, table_key_id=None)
    table.append(pa.table({"id": pa.array(range(30), pa.int64()), "name": [f"p{i}" for i in range(30)]}))
    native, python, scan, plan, _ = _three_ways(nspark, table.location, table, {"encryption": "none"})
    assert native == python == scan and len(scan) == 30 and "FileScan parquet" in plan


def _ids(keep) -> str:
    """A row filter naming the ids in 0..1999 for which ``keep(id)`` holds (no arithmetic in filters)."""
    return "id IN (" + ", ".join(str(i) for i in range(2000) if keep(i)) + ")"


def _deletes_table(location, kms, properties=None) -> EncryptedTable:
    """4 data files of 500 rows (ids 0..1999), row groups of a few hundred bytes."""
    schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.float64())])
    table = EncryptedTable.create(location, schema, kms=kms, table_key_id="master" if kms else None,
                                  properties={"write.parquet.row-group-size-bytes": "1500", **(properties or {})})
    for part in range(4):
        ids = range(part * 500, part * 500 + 500)
        table.append(pa.table({"id": pa.array(ids, pa.int64()), "name": [f"n{i % 11}" for i in ids],
                               "amount": [i * 0.25 for i in ids]}))
    return table


def test_deletes_applied_on_spark_reader_split_files(nspark, tmp_path):
    """Deletion vectors on every file (deleted again, merged; a merge-on-read update; a
    delete that drops a whole file's rows) are applied by the LiveRows format in Spark's
    reader, also when Spark splits a file into several partitions by row group: native,
    Python path and scan agree row for row, with a projection too."""
    keystore = tmp_path / "keystore.json"
    LocalKms.create_keystore(keystore, ["master"])
    options = {"encryption.kms-type": "local", "encryption.kms.local.keystore": str(keystore)}
    table = _deletes_table(str(tmp_path / "t"), LocalKms(keystore), {"write.update.mode": "merge-on-read"})
    saved = nspark.conf.get("spark.sql.files.maxPartitionBytes")
    nspark.conf.set("spark.sql.files.maxPartitionBytes", "4096")  # several splits per file
    try:
        steps = [lambda: table.delete(_ids(lambda i: i % 7 == 0)), lambda: table.delete("id < 40 or id >= 1990"),
                 lambda: table.update({"name": "updated"}, where=_ids(lambda i: i % 5 == 1)),
                 lambda: table.delete("id >= 500 and id < 1000")]
        for number, step in enumerate(steps):
            step()
            native, python, scan, plan, _ = _three_ways(nspark, table.location, table, options)
            assert native == python == scan, f"step {number}"
            assert "FileScan icecrypt-live-rows" in plan and "Filter (" not in plan and "MapInArrow" not in plan
            native, python, scan, _, _ = _three_ways(nspark, table.location, table, options, ["amount", "id"])
            assert native == python == scan, f"step {number}, projected"
        frame = icecrypt.spark.read_table(nspark, table.location, **options, native="true")
        assert frame.rdd.getNumPartitions() > 4  # the files were split
        want = {i for i in range(2000) if i % 7 and 40 <= i < 1990 and not 500 <= i < 1000}
        assert {row.id for row in frame.select("id").collect()} == want
    finally:
        nspark.conf.set("spark.sql.files.maxPartitionBytes", saved)


def test_deletes_on_every_type_nested_and_null(nspark, tmp_path):
    """The live rows LiveRows gives are views of the reader's vectors: every column type,
    nulls, structs in structs, lists of structs and maps read right through them, whole
    files (counted) and split ones (row index), all columns or a few, with a filter too."""
    import datetime
    import decimal

    keystore = tmp_path / "keystore.json"
    LocalKms.create_keystore(keystore, ["master"])
    options = {"encryption.kms-type": "local", "encryption.kms.local.keystore": str(keystore)}
    point = pa.struct([("x", pa.int64()), ("label", pa.string()), ("inner", pa.struct([("z", pa.float64())]))])
    schema = pa.schema([
        ("id", pa.int64()), ("flag", pa.bool_()), ("small", pa.int32()), ("ratio", pa.float32()),
        ("price", pa.decimal128(12, 3)), ("wide", pa.decimal128(30, 4)), ("note", pa.string()), ("blob", pa.binary()),
        ("day", pa.date32()), ("at", pa.timestamp("us")), ("at_utc", pa.timestamp("us", tz="UTC")),
        ("point", point), ("tags", pa.list_(pa.string())), ("attrs", pa.map_(pa.string(), pa.int32())),
        ("items", pa.list_(pa.struct([("k", pa.int32())]))),
    ])
    table = EncryptedTable.create(str(tmp_path / "t"), schema, kms=LocalKms(keystore), table_key_id="master",
                                  properties={"write.parquet.row-group-size-bytes": "4000"})

    def value(i, v):
        return None if i % 13 == 5 else v

    for part in range(2):
        ids = range(part * 1500, part * 1500 + 1500)
        table.append(pa.table({
            "id": pa.array(ids, pa.int64()),
            "flag": [value(i, i % 2 == 0) for i in ids],
            "small": pa.array([value(i, i % 1000 - 500) for i in ids], pa.int32()),
            "ratio": pa.array([value(i, i / 7) for i in ids], pa.float32()),
            "price": pa.array([value(i, decimal.Decimal(i * 37 - 9000).scaleb(-3)) for i in ids], pa.decimal128(12, 3)),
            "wide": pa.array([value(i, decimal.Decimal(i * 10**12 + 7).scaleb(-4)) for i in ids], pa.decimal128(30, 4)),
            "note": [value(i, f"note {i} " + "x" * (i % 17)) for i in ids],
            "blob": [value(i, bytes([i % 256]) * (i % 5)) for i in ids],
            "day": [value(i, datetime.date(2020, 1, 1) + datetime.timedelta(days=i)) for i in ids],
            "at": pa.array([value(i, 1_700_000_000_000_000 + i * 1_000_003) for i in ids], pa.timestamp("us")),
            "at_utc": pa.array([value(i, 1_600_000_000_000_000 + i * 7) for i in ids], pa.timestamp("us", tz="UTC")),
            "point": pa.array([value(i, {"x": i, "label": value(i + 1, f"p{i}"), "inner": {"z": i / 3}}) for i in ids],
                              point),
            "tags": pa.array([value(i, [f"t{j}" for j in range(i % 4)]) for i in ids], pa.list_(pa.string())),
            "attrs": pa.array([value(i, [(f"a{j}", i + j) for j in range(i % 3)]) for i in ids],
                              pa.map_(pa.string(), pa.int32())),
            "items": pa.array([value(i, [{"k": i * j} for j in range(i % 3)]) for i in ids],
                              pa.list_(pa.struct([("k", pa.int32())]))),
        }, schema=schema))
    gone = [i for i in range(3000) if i % 3 == 0 or 700 <= i < 900]
    table.delete("id IN (" + ", ".join(map(str, gone)) + ")")
    saved = nspark.conf.get("spark.sql.files.maxPartitionBytes")
    try:
        for split in (False, True):
            if split:
                nspark.conf.set("spark.sql.files.maxPartitionBytes", "8192")
            for columns in (None, ["items", "id", "point", "attrs"], ["wide", "at_utc"]):
                native, python, scan, plan, _ = _three_ways(nspark, table.location, table, options, columns)
                assert native == python == scan and len(scan) == 3000 - len(gone), (split, columns)
                assert "FileScan icecrypt-live-rows" in plan and "MapInArrow" not in plan
            frame = icecrypt.spark.read_table(nspark, table.location, **options, native="true")
            picked = frame.where("small > 100 AND point.inner.z > 10").select("id", "point.label", "tags")
            want = table.scan().to_arrow().to_pylist()
            expected = sorted((r["id"], r["point"]["label"] if r["point"] else None, r["tags"]) for r in want
                              if r["small"] is not None and r["small"] > 100 and r["point"] is not None
                              and r["point"]["inner"]["z"] > 10)
            assert sorted((r.id, r.label, r.tags) for r in picked.collect()) == expected and expected
    finally:
        nspark.conf.set("spark.sql.files.maxPartitionBytes", saved)


def test_deletes_with_odd_paths_and_shadowing_columns(nspark, tmp_path):
    """A table under a path with a space and non-ASCII letters (the format matches the file
    Spark reports); a column named ``_metadata`` (Spark's own metadata column) is read
    natively with deletes; a column named as the one Spark's reader gives the row index in,
    in any case, sends the files with deletes to the Python path."""
    keystore = tmp_path / "keystore.json"
    LocalKms.create_keystore(keystore, ["master"])
    options = {"encryption.kms-type": "local", "encryption.kms.local.keystore": str(keystore)}
    table = _deletes_table(str(tmp_path / "dir with space ünï" / "t"), LocalKms(keystore))
    table.delete(_ids(lambda i: i % 3 == 0))
    native, python, scan, plan, _ = _three_ways(nspark, table.location, table, options)
    assert native == python == scan and len(scan) == 1333 and "FileScan icecrypt-live-rows" in plan

    for name, native_deletes in (("_metadata", True), (_native.ROW_INDEX_COLUMN.upper(), False)):
        schema = pa.schema([("id", pa.int64()), (name, pa.string())])
        shadow = EncryptedTable.create(str(tmp_path / f"shadow{name}"), schema, kms=LocalKms(keystore),
                                       table_key_id="master")
        shadow.append(pa.table({"id": pa.array(range(50), pa.int64()), name: [f"m{i}" for i in range(50)]}))
        shadow.append(pa.table({"id": pa.array(range(50, 60), pa.int64()), name: ["x"] * 10}))
        shadow.delete("id < 5")
        for columns in (None, ["id"]):
            native, python, scan, plan, _ = _three_ways(nspark, shadow.location, shadow, options, columns)
            assert native == python == scan and len(scan) == 55, name
            assert ("FileScan icecrypt-live-rows" in plan) is native_deletes, plan
            assert ("MapInArrow" in plan) is not native_deletes and "FileScan parquet" in plan, plan


def test_the_deletes_format_gives_live_rows_and_fails_closed(nspark, tmp_path):
    """LiveRows gives the live rows only: counted over a whole file read in batches with
    nothing pushed (and refused when the count is not the record count), by parquet-java's
    row index when a filter is pushed or a file is split, row by row (vectorized reader
    off); ``_metadata.row_index`` still gives each row's position; deltas of 255 and more
    and a deleted first row encode; it refuses a file it has no deletes for, a table column
    named as the row index column and a malformed option; a tampered deletion vector fails
    the read naming it."""
    import numpy as np
    from pyspark.sql import types as T

    keystore = tmp_path / "keystore.json"
    LocalKms.create_keystore(keystore, ["master"])
    plain = _deletes_table(str(tmp_path / "plain"), None)
    files = [f"file://{p}" for p in sorted(str(p) for p in (tmp_path / "plain" / "data").rglob("*.parquet"))]
    schema = nspark.read.parquet(files[0]).schema
    gone = [1, 2, 300, 499]  # deltas 1, 1, 298 (wide), 199
    deleted = {files[0]: (500, np.array(gone, dtype=np.int64))}
    ids = [r.id for r in nspark.read.parquet(files[0]).collect()]
    want = [(ids[i], i) for i in range(500) if i not in gone]

    def load(path, deletes=deleted, option=None, read_schema=schema):
        return nspark.read.format(_native.DELETES_FORMAT).schema(read_schema) \
            .option(_native.DELETES_OPTION, option or _native._deletes_option(deletes)).load(path)

    def rows(frame):
        return [(r.id, r.row_index) for r in frame.select("id", "_metadata.row_index").collect()]

    counted = load(files[0])
    assert rows(counted) == want and "PushedFilters: []" in _plan(counted)
    assert [r.id for r in counted.select("id").collect()] == [i for i, _ in want]
    whole = [tuple(r) for r in counted.collect()]
    assert counted.count() == 496 and "Filter (" not in _plan(counted.groupBy().count())
    pushed = load(files[0]).where("id >= 0")  # row index: a pushed filter may skip pages
    assert rows(pushed) == want and "GreaterThanOrEqual(id,0)" in _plan(pushed)
    assert [r.id for r in pushed.select("id").collect()] == [i for i, _ in want]
    first = load(files[0], {files[0]: (500, np.array([0, 499], dtype=np.int64))})
    assert [r.id for r in first.collect()] == ids[1:499]
    saved = {key: nspark.conf.get(key) for key in ("spark.sql.files.maxPartitionBytes",
                                                   "spark.sql.parquet.enableVectorizedReader")}
    try:
        nspark.conf.set("spark.sql.files.maxPartitionBytes", "2048")  # splits: row index
        split = load(files[0])
        assert split.rdd.getNumPartitions() > 1 and sorted(rows(split)) == sorted(want)
        assert sorted(r.id for r in split.collect()) == sorted(i for i, _ in want)
        nspark.conf.set("spark.sql.files.maxPartitionBytes", saved["spark.sql.files.maxPartitionBytes"])
        nspark.conf.set("spark.sql.parquet.enableVectorizedReader", "false")  # row by row: dropped here
        assert rows(load(files[0])) == want
        assert [tuple(r) for r in load(files[0]).collect()] == whole
    finally:
        for key, value in saved.items():
            nspark.conf.set(key, value)
    miscounted = {files[0]: (499, deleted[files[0]][1])}  # the count is checked where it is used
    with pytest.raises(Exception, match=r"gave 500 rows, its manifest entry records 499: refused"):
        load(files[0], miscounted).collect()
    assert rows(load(files[0], miscounted).where("id >= 0")) == want
    with pytest.raises(Exception, match="has no deletes planned for that file"):
        load(files[1]).collect()
    shadowing = T.StructType([*schema.fields, T.StructField(_native.ROW_INDEX_COLUMN, T.LongType())])
    with pytest.raises(Exception, match=f"with a column named {_native.ROW_INDEX_COLUMN}"):
        load(files[0], read_schema=shadowing).collect()
    with pytest.raises(Exception, match=r"malformed deletes option"):
        load(files[0], option="not base64 !").collect()
    truncated = base64.b64encode(b"\0\0\0\x05abc").decode()
    with pytest.raises(Exception, match=r"malformed deletes buffer \(BufferUnderflowException\)"):
        load(files[0], option=truncated).collect()
    one_wide_missing = struct.pack(">i", 1) + b"x" + struct.pack(">qii", 500, 1, 0) + b"\xff"
    with pytest.raises(Exception, match=r"malformed deletes buffer .*more wide deltas than 0"):
        load(files[0], option=base64.b64encode(one_wide_missing).decode()).collect()
    assert plain.scan().to_arrow().num_rows == 2000

    options = {"encryption.kms-type": "local", "encryption.kms.local.keystore": str(keystore), "native": "true"}
    table = _deletes_table(str(tmp_path / "t"), LocalKms(keystore))
    table.delete(_ids(lambda i: i % 4 == 0))
    victim = next(p for p in (tmp_path / "t" / "data").rglob("*.puffin"))
    flip_byte(victim, os.path.getsize(victim) // 2)
    with pytest.raises(Exception) as caught:
        icecrypt.spark.read_table(nspark, table.location, **options).collect()
    assert victim.name in str(caught.value), str(caught.value)[:2000]


def test_listed_files_is_what_spark_reads(nspark, tmp_path):
    """The planned-files check takes the files Spark's file index keeps (as inputFiles()
    does, without optimizing the plan): a data file with a hidden name (``_x``, ``.x``),
    which Spark skips even when named, is not counted, so such a read takes the Python
    path instead of losing that file's rows."""
    import pyarrow.parquet as pq

    names = ["a.parquet", "_b.parquet", ".c.parquet"]
    for name in names:
        pq.write_table(pa.table({"x": [1, 2]}), tmp_path / name)
    paths = [f"file://{tmp_path / name}" for name in names]
    listed = nspark.sparkContext._jvm.org.icecrypt.spark.NativeRouting.listedFiles
    frame = nspark.read.parquet(*paths)
    assert listed(frame._jdf).size() == len(frame.inputFiles()) == 1 and frame.count() == 2
    both = frame.unionAll(nspark.read.parquet(paths[0], paths[0]))
    assert listed(both._jdf).size() == len(both.inputFiles()) == 1


def test_partition_directories_with_escaped_separators(nspark, tmp_path):
    """Directories as Iceberg Java names partition values holding '/', '\\' or '%'
    (``category=N%2FA``): Hadoop's ``Path`` takes the name literally, so Spark's reader
    opens the very file icecrypt planned, with its key (native, Python and scan agree,
    and a delete through LiveRows on such a file applies).  The one directory holding
    '*' (Java keeps it; Spark's file source would expand it) is read in Python."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import IdentityTransform

    from table.test_partition_paths import JAVA_DIRECTORIES, SCHEMA, java_append

    keystore = tmp_path / "keystore.json"
    LocalKms.create_keystore(keystore, ["master"])
    kms = LocalKms(keystore)
    options = {"encryption.kms-type": "local", "encryption.kms.local.keystore": str(keystore)}
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="master",
                                  partition_spec=PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "category")))
    java_append(table, JAVA_DIRECTORIES)
    table.append(pa.table({"id": pa.array([100, 101, 102], pa.int64()),
                           "category": pa.array(["x/y", "p%2Fq", "x/y"], pa.string())}))
    table = table.refresh()
    native, python, scan, plan, _ = _three_ways(nspark, table.location, table, options)
    assert native == python == scan and len(scan) == len(JAVA_DIRECTORIES) + 3
    assert "FileScan parquet" in plan and "MapInArrow" in plan
    table.delete("id = 100")
    native, python, scan, plan, _ = _three_ways(nspark, table.location, table, options)
    assert native == python == scan and len(scan) == len(JAVA_DIRECTORIES) + 2
    assert "FileScan icecrypt-live-rows" in plan  # the deletion vector of category=x%2Fy's file


def test_filters_on_reused_names_read_right(nspark, tmp_path):
    """Spark's Parquet filters match a file's columns by name, not field id: on a table
    where a name moved to another column (two columns swapped names, a column dropped
    and another added under its name) they would skip row groups that hold matching rows.
    Such a table reads on the Python path (or the SQL catalog's scan, which pushes only
    names no schema reused); the filtered rows are the scan's."""
    table, options = _icecrypt_table(tmp_path)
    with table.update_schema() as update:
        update.rename_column("name", "label")
    with table.update_schema() as update:
        update.add_column("name", StringType())
    frame = icecrypt.spark.read_table(nspark, table.location, **options)
    want = table.scan(row_filter="name is null").to_arrow().num_rows
    assert want == 100
    assert frame.where("name IS NULL").count() == want
    assert frame.where("label = 'n5'").count() == table.scan(row_filter="label = 'n5'").to_arrow().num_rows == 14

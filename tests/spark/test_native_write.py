"""``df.write.format("icecrypt.iceberg")`` by Spark's own Parquet writer (the native write
path, icecrypt.spark._native_write), in a session built with ``icecrypt.spark.configure``
and registered: files encrypted as Iceberg Java encrypts them (each under its own DEK,
derived from the write's secret and the file's name), with field ids, row counts and
statistics, committed as the Python source commits; the rows read back equal through
``EncryptedTable.scan()``, Spark's native reader and the Python path.  Writes the native
path does not take go to the Python source; failed jobs leave nothing behind."""

from __future__ import annotations

import datetime
import decimal
import math
import os
import re
import struct
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.transforms import IdentityTransform
from pyspark.sql import functions as F
from sparkhelpers import MASTER, table_lines
from parquet.parquet_mr import encryption_type, read_longs
from table.tablelib import flip_byte

import icecrypt.parquet
import icecrypt.spark
from icecrypt.keys import StandardKeyMetadata
from icecrypt.spark import _native_write
from icecrypt.table import EncryptedTable

pytestmark = pytest.mark.spark

SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False),
    pa.field("category", pa.string()),
    pa.field("qty", pa.int32()),
    pa.field("amount", pa.float64()),
    pa.field("ts", pa.timestamp("us", tz="UTC")),
    pa.field("local", pa.timestamp("us")),
    pa.field("day", pa.date32()),
    pa.field("price", pa.decimal128(10, 2)),
    pa.field("big", pa.decimal128(30, 4)),
    pa.field("flag", pa.bool_()),
    pa.field("blob", pa.binary()),
    pa.field("point", pa.struct([("x", pa.float32()), ("y", pa.float64())])),
])


@pytest.fixture(scope="module")
def wspark(spark):
    icecrypt.spark.register(spark)
    assert icecrypt.spark.route(spark)
    return spark


@pytest.fixture(scope="module")
def options(keystore):
    """KMS options for icecrypt.iceberg (conftest's keystore and kms)."""
    return {"encryption.kms-type": "local", "encryption.kms.local.keystore": str(keystore)}


def _rows(n: int, start: int = 0) -> pa.Table:
    ids = list(range(start, start + n))
    base = datetime.datetime(2026, 3, 1, tzinfo=datetime.timezone.utc)
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "category": [None if i % 11 == 0 else f"c{i % 4}" for i in ids],
        "qty": pa.array([None if i % 7 == 0 else i % 50 for i in ids], pa.int32()),
        "amount": [float("nan") if i % 13 == 0 else i * 0.5 for i in ids],
        "ts": pa.array([base + datetime.timedelta(seconds=i) for i in ids], pa.timestamp("us", tz="UTC")),
        "local": pa.array([datetime.datetime(2026, 1, 1) + datetime.timedelta(minutes=i) for i in ids],
                          pa.timestamp("us")),
        "day": pa.array([datetime.date(2026, 1, 1) + datetime.timedelta(days=i % 90) for i in ids], pa.date32()),
        "price": pa.array([decimal.Decimal(i % 1000) / 100 for i in ids], pa.decimal128(10, 2)),
        "big": pa.array([decimal.Decimal(i) * 10**20 + decimal.Decimal("0.1234") for i in ids], pa.decimal128(30, 4)),
        "flag": [i % 2 == 0 for i in ids],
        "blob": [bytes([i % 256]) * (i % 5) for i in ids],
        "point": [None if i % 17 == 0 else {"x": float(i), "y": -float(i)} for i in ids],
    }, schema=SCHEMA)


def _frame(spark, rows: pa.Table):
    return spark.createDataFrame(rows, schema=_spark_schema(rows.schema))  # NaN stays NaN


def _spark_schema(schema: pa.Schema):
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema, prefer_timestamp_ntz=True)


def _table(tmp_path: Path, kms, name: str = "t", schema: pa.Schema = SCHEMA, **properties) -> EncryptedTable:
    return EncryptedTable.create(str(tmp_path / name), schema, kms=kms, table_key_id=MASTER,
                                 properties=properties or None)


def _native_files(location: str) -> list[Path]:
    return sorted(p for p in Path(location, "data").rglob("part-*.parquet"))


def _data_files(location: str) -> list[Path]:
    return sorted(p for p in Path(location, "data").rglob("*") if p.is_file())


def _files(table: EncryptedTable) -> list:
    return sorted({t.file.path: t.file for t in table.scan().plan_files()}.values(), key=lambda f: f.path)


def _same(got: pa.Table, want: pa.Table) -> bool:
    """The same rows (in any order; NaN equals NaN)."""
    return got.num_rows == want.num_rows and table_lines(got, want.column_names) == table_lines(want, want.column_names)


def test_append_and_overwrite_by_sparks_writer(wspark, tmp_path, kms, options):
    """Two appends and an overwrite: every file is Spark's (part-*), encrypted with its own
    key (PARE magic, no plaintext readable), carries field ids, and the rows of every
    snapshot equal what was written, through scan(), the native read and the Python path."""
    table = _table(tmp_path, kms)
    first, second, third = _rows(3000), _rows(2000, 3000), _rows(500, 10_000)
    _frame(wspark, first).write.format("icecrypt.iceberg").options(**options).mode("append").save(table.location)
    _frame(wspark, second).repartition(3).write.format("icecrypt.iceberg").options(**options).mode("append") \
        .save(table.location)
    table.refresh()
    assert len(table.snapshots()) == 2
    files = _native_files(table.location)
    assert len(files) >= 4 and _data_files(table.location) == files  # no checksum, _SUCCESS or temporary file
    keys = set()
    for path in files:
        raw = path.read_bytes()
        assert raw[:4] == b"PARE" and raw[-4:] == b"PARE"
        with pytest.raises(Exception):
            pq.read_metadata(path)  # no plaintext footer
    for file in _files(table):
        km = StandardKeyMetadata.decode(file.key_metadata)
        assert km.key_length == 16 and len(km.aad_prefix) == 16 and km.file_length == file.file_size_in_bytes
        keys.add(km.encryption_key)
        with icecrypt.parquet.open_file(file.fs_path, km) as opened:
            ids = [opened.schema_arrow.field(name).metadata[b"PARQUET:field_id"] for name in ("id", "ts", "point")]
            assert ids == [b"1", b"5", b"12"]
            assert opened.metadata.num_rows == file.record_count
    assert len(keys) == len(files)
    assert table.verify().ok  # page indexes (Spark's writer writes them) included
    want = pa.concat_tables([first, second])
    assert _same(table.scan().to_arrow(), want)
    names = SCHEMA.names
    for native in ("true", "false"):
        frame = wspark.read.format("icecrypt.iceberg").options(**options, native=native).load(table.location)
        assert table_lines(frame.toArrow(), names) == table_lines(want, names)

    _frame(wspark, third).write.format("icecrypt.iceberg").options(**options).mode("overwrite").save(table.location)
    table.refresh()
    assert _same(table.scan().to_arrow(), third)
    assert _same(table.scan(snapshot_id=table.snapshots()[1].snapshot_id).to_arrow(), want)
    assert table.current_snapshot().summary["operation"] == "overwrite"


def test_statistics_let_scans_skip_files(wspark, tmp_path, kms, options):
    """Row counts, value and null counts and bounds come from the files' footers: a filter
    prunes the files whose bounds exclude it, NaN never becomes a bound."""
    table = _table(tmp_path, kms)
    for start in (0, 1000, 2000):
        _frame(wspark, _rows(1000, start)).coalesce(1).write.format("icecrypt.iceberg").options(**options) \
            .mode("append").save(table.location)
    table.refresh()
    entries = table.inspect.files().to_pylist()
    assert len(entries) == 3
    for entry in entries:
        assert entry["record_count"] == 1000
        lower = dict(entry["lower_bounds"])
        start = int.from_bytes(lower[1], "little")
        assert start in (0, 1000, 2000) and int.from_bytes(dict(entry["upper_bounds"])[1], "little") == start + 999
        assert dict(entry["value_counts"])[1] == 1000
        assert dict(entry["null_value_counts"])[3] == sum(1 for i in range(start, start + 1000) if i % 7 == 0)
        assert 4 not in dict(entry["nan_value_counts"] or [])  # unknown, not zero
        bounds = [struct.unpack("<d", b[4])[0] for b in (lower, dict(entry["upper_bounds"])) if 4 in b]
        assert not any(math.isnan(v) for v in bounds)
    tasks = table.scan(row_filter="id >= 2500").plan_files()
    assert len(tasks) == 1
    # a struct's fields have bounds too, as Iceberg Java's writer gives them
    assert len(table.scan(row_filter="point.x >= 2500").plan_files()) == 1
    assert table.scan(row_filter="point.y > -10").to_arrow().num_rows == 9
    assert table.scan(row_filter="id >= 2500").to_arrow().num_rows == 500
    assert table.scan(row_filter="amount > 1000").to_arrow().num_rows == \
        sum(1 for i in range(3000) if i % 13 and i * 0.5 > 1000)


def test_statistics_equal_the_python_writers(wspark, tmp_path, kms, options):
    """One file of the same rows written by each path: the same value and null counts and
    the same bounds for every column (the native path records no NaN counts)."""
    metrics = {}
    for native in ("true", "false"):
        table = _table(tmp_path, kms, name=f"t{native}")
        _frame(wspark, _rows(1000)).coalesce(1).write.format("icecrypt.iceberg").options(**options, native=native) \
            .mode("append").save(table.location)
        (entry,) = table.refresh().inspect.files().to_pylist()
        metrics[native] = {k: dict(entry[k]) for k in ("value_counts", "null_value_counts", "lower_bounds",
                                                       "upper_bounds")}
        assert entry["record_count"] == 1000
    # parquet-java's float and double statistics are NaN when a NaN comes first: such bounds
    # are dropped (Iceberg's bounds are never NaN), any others are the Python writer's
    floats = {4, 13, 14}
    for name in ("lower_bounds", "upper_bounds"):
        native, python = metrics["true"].pop(name), metrics["false"].pop(name)
        assert set(native) >= set(python) - floats and set(native) <= set(python)
        assert native == {k: python[k] for k in native}
        assert set(native) >= {1, 2, 3, 5, 6, 7, 8, 9, 10, 13, 14}  # 13, 14: the struct's fields
    assert metrics["true"] == metrics["false"]


def test_an_empty_dataframe_commits_as_the_python_source_does(wspark, tmp_path, kms, options):
    outcome = {}
    for native in ("true", "false"):
        table = _table(tmp_path, kms, name=f"e{native}")
        _frame(wspark, _rows(0)).write.format("icecrypt.iceberg").options(**options, native=native) \
            .mode("append").save(table.location)
        table.refresh()
        outcome[native] = (len(table.snapshots()), table.scan().to_arrow().num_rows, len(_data_files(table.location)))
    assert outcome["true"] == outcome["false"] and outcome["true"][1:] == (0, 0)


def test_types_are_cast_and_widened(wspark, tmp_path, kms, options):
    """DataFrame columns matched by name (any order, case-insensitive), int to long,
    float to double, a narrower decimal; a missing optional column is null."""
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.float64()),
                        pa.field("d", pa.decimal128(12, 2)), pa.field("note", pa.string())])
    table = _table(tmp_path, kms, schema=schema)
    frame = wspark.createDataFrame([(1.5, 7, decimal.Decimal("1.25")), (2.5, 8, None)],
                                   "V float, ID int, d decimal(5,2)")
    frame.write.format("icecrypt.iceberg").options(**options, native="true").mode("append").save(table.location)
    got = table.refresh().scan().to_arrow().sort_by("id")
    assert got.to_pylist() == [{"id": 7, "v": 1.5, "d": decimal.Decimal("1.25"), "note": None},
                               {"id": 8, "v": 2.5, "d": None, "note": None}]
    assert _native_files(table.location)


def test_a_table_path_with_a_space_non_ascii_letters_and_percent_encoding(wspark, tmp_path, kms, options):
    # '%2F' in a directory name (as Java names partition values) is one name for Hadoop's
    # Path too: the native write applies and its files land in that directory
    table = _table(tmp_path / "a dir ü" / "p=N%2FA%41", kms)
    _frame(wspark, _rows(300)).write.format("icecrypt.iceberg").options(**options, native="true").mode("append") \
        .save(table.location)
    assert _native_files(table.location) and _same(table.refresh().scan().to_arrow(), _rows(300))
    assert sorted(os.listdir(tmp_path / "a dir ü")) == ["p=N%2FA%41"]
    frame = wspark.read.format("icecrypt.iceberg").options(**options).load(table.location)
    assert table_lines(frame.toArrow(), SCHEMA.names) == table_lines(_rows(300), SCHEMA.names)


def test_data_key_length_follows_the_table(wspark, tmp_path, kms, options):
    table = _table(tmp_path, kms, **{"encryption.data-key-length": "32"})
    _frame(wspark, _rows(100)).write.format("icecrypt.iceberg").options(**options).mode("append").save(table.location)
    files = _files(table.refresh())
    assert files and {StandardKeyMetadata.decode(f.key_metadata).key_length for f in files} == {32}
    assert table.scan().to_arrow().num_rows == 100


def test_a_new_table_from_the_dataframe_branches_and_wap(wspark, tmp_path, kms, options):
    location = str(tmp_path / "new")
    _frame(wspark, _rows(50)).write.format("icecrypt.iceberg").options(**options, native="true") \
        .option("table-key-id", MASTER).mode("append").save(location)
    table = EncryptedTable.load(location, kms=kms)
    assert table.scan().to_arrow().num_rows == 50 and _native_files(location)
    _frame(wspark, _rows(5, 100)).write.format("icecrypt.iceberg").options(**options, native="true") \
        .option("branch", "b1").mode("append").save(location)
    table.refresh()
    assert table.scan().to_arrow().num_rows == 50
    assert table.scan(branch="b1").to_arrow().num_rows == 55
    table.update_properties().set("write.wap.enabled", "true").commit()
    _frame(wspark, _rows(5, 200)).write.format("icecrypt.iceberg").options(**options, native="true") \
        .option("wap-id", "w1").mode("append").save(location)
    table.refresh()
    assert table.scan().to_arrow().num_rows == 50
    staged = [s for s in table.snapshots() if (s.summary or {}).get("wap.id") == "w1"]
    assert len(staged) == 1


@pytest.mark.parametrize("case", ["partitioned", "avro", "list column", "sorted", "string to int"])
def test_writes_the_native_path_does_not_take_go_to_the_python_source(wspark, tmp_path, kms, options, case):
    """Same rows either way; native=true fails saying why, before anything is written."""
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("tags", pa.list_(pa.string()))]) \
        if case == "list column" else pa.schema([pa.field("id", pa.int64()), pa.field("c", pa.string())])
    table = _table(tmp_path, kms, schema=schema)
    if case == "partitioned":
        table.update_spec().add_field("c", IdentityTransform(), "c").commit()
    if case == "sorted":
        table.replace_sort_order().asc("id").commit()
    extra = {"write-format": "avro"} if case == "avro" else {}
    if case == "list column":
        frame = wspark.createDataFrame([(1, ["a"]), (2, None)], "id long, tags array<string>")
    elif case == "string to int":
        frame = wspark.createDataFrame([("1", "a"), ("2", "b")], "id string, c string")
    else:
        frame = wspark.createDataFrame([(1, "a"), (2, "b")], "id long, c string")
    with pytest.raises(Exception, match="native write does not apply"):
        frame.write.format("icecrypt.iceberg").options(**options, **extra, native="true").mode("append") \
            .save(table.location)
    assert not table.refresh().snapshots() and not _data_files(table.location)
    frame.write.format("icecrypt.iceberg").options(**options, **extra).mode("append").save(table.location)
    table.refresh()
    assert table.scan().to_arrow().num_rows == 2
    assert _data_files(table.location) and not _native_files(table.location)


def test_native_false_writes_through_the_python_source(wspark, tmp_path, kms, options):
    table = _table(tmp_path, kms)
    _frame(wspark, _rows(20)).write.format("icecrypt.iceberg").options(**options, native="false").mode("append") \
        .save(table.location)
    assert _data_files(table.location) and not _native_files(table.location)
    assert _same(table.refresh().scan().to_arrow(), _rows(20))


def test_failed_jobs_leave_nothing(wspark, tmp_path, kms, options):
    """A task that fails (a null in a required column, a failing expression) fails the
    write with the reason; no file, directory or snapshot is left."""
    table = _table(tmp_path, kms)
    rows = _frame(wspark, _rows(200))
    nulls = rows.withColumn("id", F.when(F.col("id") == 150, F.lit(None)).otherwise(F.col("id")))
    with pytest.raises(Exception, match="null in required column 'id'"):
        nulls.write.format("icecrypt.iceberg").options(**options).mode("append").save(table.location)
    boom = rows.withColumn("qty", F.when(F.col("id") == 199, F.raise_error(F.lit("boom in task"))).otherwise(F.col("qty")))
    with pytest.raises(Exception, match="boom in task"):
        boom.write.format("icecrypt.iceberg").options(**options).mode("append").save(table.location)
    assert not table.refresh().snapshots()
    data = Path(table.location, "data")
    assert not data.exists() or not any(data.iterdir())  # no file, no job directory


def test_tampered_native_file_fails_the_read_naming_it(wspark, tmp_path, kms, options):
    table = _table(tmp_path, kms)
    _frame(wspark, _rows(500)).coalesce(1).write.format("icecrypt.iceberg").options(**options).mode("append") \
        .save(table.location)
    victim = _native_files(table.location)[0]
    flip_byte(victim, os.path.getsize(victim) // 2)
    for read in (lambda: table.refresh().scan().to_arrow(),
                 lambda: wspark.read.format("icecrypt.iceberg").options(**options).load(table.location).collect()):
        with pytest.raises(Exception) as caught:
            read()
        assert victim.name in str(caught.value), str(caught.value)[:2000]


def test_a_damaged_page_index_is_found_by_verify_and_by_filtered_reads(wspark, tmp_path, kms, options):
    """Spark's writer puts the page indexes between the last column chunk and the footer.
    A full read never decrypts them; verify() does, and so does parquet-java when a
    filter lets it skip pages."""
    table = _table(tmp_path, kms)
    _frame(wspark, _rows(5000)).coalesce(1).write.format("icecrypt.iceberg").options(**options).mode("append") \
        .save(table.location)
    (file,) = _files(table.refresh())
    km = StandardKeyMetadata.decode(file.key_metadata)
    with icecrypt.parquet.open_file(file.fs_path, km) as opened:
        meta = opened.metadata
        chunks_end = max(
            (c.dictionary_page_offset or c.data_page_offset) + c.total_compressed_size
            for g in range(meta.num_row_groups) for c in (meta.row_group(g).column(i) for i in range(meta.num_columns))
        )
    raw = Path(file.fs_path).read_bytes()
    footer_start = len(raw) - 8 - struct.unpack_from("<I", raw, len(raw) - 8)[0]
    assert footer_start - chunks_end > 100  # the page indexes
    flip_byte(Path(file.fs_path), (chunks_end + footer_start) // 2)

    assert table.refresh().scan().to_arrow().num_rows == 5000  # no read of ours uses those bytes
    report = table.verify()
    assert [(Path(p.path).name, p.kind) for p in report.problems] == [(Path(file.path).name, "damaged")], str(report)
    assert "index of column" in report.problems[0].message
    with pytest.raises(Exception) as caught:
        wspark.read.format("icecrypt.iceberg").options(**options).load(table.location).where("id = 2500").collect()
    assert "GCM" in str(caught.value) or "AEADBadTag" in str(caught.value), str(caught.value)[:2000]


def test_parquet_java_reads_the_files_as_iceberg_java_does(wspark, tmp_path, kms, options):
    """Iceberg Java opens a Parquet data file with parquet-java and
    ``FileDecryptionProperties`` of the DEK as footer key and the key metadata's AAD
    prefix (SPEC.md section 5): so configured, parquet-java's record reader decrypts every
    page of a file Spark's writer wrote here and gives its rows; without the AAD prefix it
    refuses the file."""
    table = _table(tmp_path, kms)
    rows = _rows(300)
    _frame(wspark, rows).coalesce(1).write.format("icecrypt.iceberg").options(**options).mode("append") \
        .save(table.location)
    (file,) = _files(table.refresh())
    km = StandardKeyMetadata.decode(file.key_metadata)
    jvm = wspark.sparkContext._jvm
    assert encryption_type(jvm, file.fs_path, km.encryption_key, km.aad_prefix) == "ENCRYPTED_FOOTER"
    ids = read_longs(jvm, file.fs_path, km.encryption_key, km.aad_prefix, "id")
    assert len(ids) == file.record_count == 300 and sorted(ids) == rows.column("id").to_pylist()
    with pytest.raises(Exception, match="AAD"):
        read_longs(jvm, file.fs_path, km.encryption_key, None, "id")


def test_keys_derive_from_the_secret_and_the_name():
    """The Python derivation is FileEncryption's (the JVM's): checked through a file Spark
    wrote above by decrypting it; here the derivation's separation."""
    secret = bytes(range(32))
    a = _native_write.file_key(secret, "part-00000-x-c000.zstd.parquet", 16)
    b = _native_write.file_key(secret, "part-00001-x-c000.zstd.parquet", 16)
    assert a.encryption_key != b.encryption_key and a.aad_prefix != b.aad_prefix
    assert a.encryption_key != a.aad_prefix and len(a.aad_prefix) == 16
    assert _native_write.file_key(secret, "n", 24).key_length == 24
    assert _native_write.file_key(bytes(32), "n", 16).encryption_key != _native_write.file_key(secret, "n", 16).encryption_key


def test_write_locations_of_the_table_are_honoured(wspark, tmp_path, kms, options):
    """write.data.path: Spark's native writer puts its files there; the object-storage
    layout (a hashed directory per file) goes to the Python source, which writes it as
    Iceberg Java does; <location>/data stays empty either way."""
    elsewhere = tmp_path / "elsewhere"
    table = _table(tmp_path, kms, **{"write.data.path": str(elsewhere)})
    _frame(wspark, _rows(100)).write.format("icecrypt.iceberg").options(**options, native="true").mode("append") \
        .save(table.location)
    table.refresh()
    assert list(elsewhere.rglob("part-*.parquet"))  # Spark's own files, under the data path
    assert all(f.path.startswith(f"{elsewhere}/") for f in _files(table)) and not Path(table.location, "data").exists()
    assert _same(table.scan().to_arrow(), _rows(100))

    hashed = _table(tmp_path, kms, name="hashed", **{"write.object-storage.enabled": "true"})
    with pytest.raises(Exception, match="object-storage layout"):
        _frame(wspark, _rows(10)).write.format("icecrypt.iceberg").options(**options, native="true") \
            .mode("append").save(hashed.location)
    _frame(wspark, _rows(100)).write.format("icecrypt.iceberg").options(**options).mode("append").save(hashed.location)
    hashed.refresh()
    for file in _files(hashed):
        relative = file.path[len(hashed.location) + len("/data/"):]
        assert re.fullmatch(r"[01]{4}/[01]{4}/[01]{4}/[01]{8}/[^/]+\.parquet", relative), file.path
    assert _same(hashed.scan().to_arrow(), _rows(100))

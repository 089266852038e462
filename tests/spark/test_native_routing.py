"""``spark.read.format("icecrypt.iceberg")`` takes the native path by itself in a session
built with ``icecrypt.spark.configure`` (the shared test session is): the analyzer rule
``org.icecrypt.spark.NativeRouting`` asks the driver's planner and puts Spark's Parquet
reader in the Python source's place.  Rows are those of the Python path and of
``EncryptedTable.scan()``; Spark prunes columns and pushes filters into the encrypted
scan; ``native=false`` and tables the native path cannot read keep the Python source;
appends and overwrites take Spark's writer (tests/spark/test_native_write.py); damage
fails the query, naming the file."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pytest
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
def rspark(spark):
    """The shared session with icecrypt's sources registered and reads routed."""
    icecrypt.spark.register(spark)
    assert icecrypt.spark.route(spark)
    return spark


def _plan(frame) -> str:
    return frame._jdf.queryExecution().executedPlan().toString()


def _read(spark, location, options, **extra):
    return spark.read.format("icecrypt.iceberg").options(**options, **extra).load(str(location))


def _java(name, root=None):
    table = EncryptedTable.load(metadata_path(name, root), kms=MemoryKms.with_iceberg_test_keys(),
                                location_map=location_map(name, root))
    return table, {**JAVA_KMS, "location-map": json.dumps(location_map(name, root))}


@pytest.mark.parametrize("name", TABLE_NAMES)
def test_java_tables_routed_equal_python_and_scan(rspark, name):
    table, options = _java(name)
    routed = _read(rspark, metadata_path(name), options)
    python = _read(rspark, metadata_path(name), options, native="false")
    want = table.scan().to_arrow()
    names = want.column_names
    assert routed.columns == python.columns == names
    lines = [table_lines(frame.toArrow(), names) for frame in (routed, python)]
    assert lines[0] == lines[1] == table_lines(want, names) and len(lines[0]) > 1000
    plan, python_plan = _plan(routed), _plan(python)
    assert "BatchScan icecrypt.iceberg" in python_plan and "FileScan parquet" not in python_plan
    if name == "enc_avro_dek16":  # Avro data files: the Python source reads the table
        assert "BatchScan icecrypt.iceberg" in plan and "FileScan parquet" not in plan
    else:
        assert "FileScan parquet" in plan and "BatchScan icecrypt.iceberg" not in plan
    # the equality deletes of enc_deletes_dek16 stay in Python tasks, beside Spark's reader
    assert ("MapInArrow" in plan) == (name == "enc_deletes_dek16")


def test_spark_prunes_and_pushes_into_the_encrypted_scan(rspark):
    name = "enc_parquet_dek16"
    table, options = _java(name)
    frame = _read(rspark, metadata_path(name), options).where("qty < 10").select("id", "amount")
    plan = _plan(frame)
    assert "FileScan parquet" in plan and "ReadSchema: struct<id:bigint,qty:int,amount:double>" in plan, plan
    assert "LessThan(qty,10)" in plan, plan
    want = table.scan(row_filter="qty < 10", columns=["id", "amount"]).to_arrow()
    assert table_lines(frame.toArrow(), ["id", "amount"]) == table_lines(want, ["id", "amount"])
    # aggregates, SQL over a view and a self-join (Spark gives the second side new ids)
    whole = _read(rspark, metadata_path(name), options)
    assert whole.count() == table.scan().to_arrow().num_rows
    whole.createOrReplaceTempView("icecrypt_routed")
    try:
        got = rspark.sql("SELECT category, count(*) AS n, max(id) AS m FROM icecrypt_routed GROUP BY category").collect()
    finally:
        rspark.catalog.dropTempView("icecrypt_routed")
    arrow = table.scan().to_arrow().to_pylist()
    want_groups = {}
    for row in arrow:
        n, m = want_groups.get(row["category"], (0, -1))
        want_groups[row["category"]] = (n + 1, max(m, row["id"]))
    assert {r["category"]: (r["n"], r["m"]) for r in got} == want_groups
    counts: dict = {}
    for row in arrow:
        counts[row["id"]] = counts.get(row["id"], 0) + 1
    assert whole.alias("a").join(whole.alias("b"), "id").count() == sum(n * n for n in counts.values())


def test_options_decide(rspark):
    """``columns``, ``snapshot-id`` and the other options read as on the Python path;
    ``filter`` (only the Python path has it) keeps the Python source; native=true
    fails the analysis saying why."""
    name = "enc_parquet_dek16"
    table, options = _java(name)
    routed = _read(rspark, metadata_path(name), options, columns="id,category")
    assert routed.columns == ["id", "category"] and "FileScan parquet" in _plan(routed)
    want = table.scan(columns=["id", "category"]).to_arrow()
    assert table_lines(routed.toArrow(), ["id", "category"]) == table_lines(want, ["id", "category"])
    first = table.snapshots()[0].snapshot_id
    old = _read(rspark, metadata_path(name), options, **{"snapshot-id": str(first)})
    assert "FileScan parquet" in _plan(old)
    want = table.scan(snapshot_id=first).to_arrow()
    assert table_lines(old.toArrow(), want.column_names) == table_lines(want, want.column_names)
    filtered = _read(rspark, metadata_path(name), options, filter="qty > 3")
    assert "BatchScan icecrypt.iceberg" in _plan(filtered)
    with pytest.raises(Exception, match="native path does not apply.*option filter"):
        _read(rspark, metadata_path(name), options, filter="qty > 3", native="true")
    with pytest.raises(Exception, match="native path does not apply"):
        _read(rspark, metadata_path("enc_avro_dek16"), _java("enc_avro_dek16")[1], native="true")
    with pytest.raises(Exception, match="option native=yes must be auto, true or false"):
        _read(rspark, metadata_path(name), options, native="yes")


def test_without_a_planner_the_python_source_reads(rspark):
    name = "enc_parquet_dek16"
    _, options = _java(name)
    routing = rspark.sparkContext._jvm.org.icecrypt.spark.NativeRouting
    routing.unregister(rspark._jsparkSession)
    try:
        assert "BatchScan icecrypt.iceberg" in _plan(_read(rspark, metadata_path(name), options))
    finally:
        routing.register(rspark._jsparkSession, rspark._icecrypt_planner)
    assert "FileScan parquet" in _plan(_read(rspark, metadata_path(name), options))


def test_a_routed_read_appended_by_the_native_write(rspark, tmp_path):
    """An append of a routed read to another table: the query is routed (Spark's reader)
    and so is the write (Spark's writer: NativeWrite takes the Python table's place in the
    command); the copy reads back the same rows."""
    name = "enc_parquet_dek16"
    table, options = _java(name)
    keystore = tmp_path / "keystore.json"
    LocalKms.create_keystore(keystore, ["master"])
    kms = {"encryption.kms-type": "local", "encryption.kms.local.keystore": str(keystore)}
    source = _read(rspark, metadata_path(name), options).select("id", "category", "qty")
    target = EncryptedTable.create(str(tmp_path / "copy"), pa.schema([("id", pa.int64()), ("category", pa.string()),
                                                                      ("qty", pa.int32())]),
                                   kms=LocalKms(keystore), table_key_id="master")
    source.write.format("icecrypt.iceberg").options(**kms).mode("append").save(target.location)
    written = {t.file.path.rsplit("/", 1)[-1] for t in target.refresh().scan().plan_files()}
    assert written and all(name.startswith("part-") for name in written), written
    copy = _read(rspark, target.location, kms)
    assert "FileScan parquet" in _plan(copy)
    names = ["id", "category", "qty"]
    want = table.scan(columns=names).to_arrow()
    assert table_lines(copy.toArrow(), names) == table_lines(want, names)
    assert table_lines(EncryptedTable.load(target.location, kms=LocalKms(keystore)).scan().to_arrow(),
                       names) == table_lines(want, names)


def test_damage_fails_the_routed_query_naming_the_file(rspark, tmp_path):
    """A tampered data file fails Spark's reader (the GCM tag, naming the file); a
    tampered manifest fails the planning, and the read then takes the Python source,
    which fails naming the manifest.  No rows either way."""
    name = "enc_parquet_dek16"
    root = copy_table(name, tmp_path / "data")
    _, options = _java(name, root)
    victim = sorted((root / "data").rglob("*.parquet"))[0]
    flip_byte(victim, os.path.getsize(victim) // 2)
    frame = _read(rspark, metadata_path(name, root), options)
    assert "FileScan parquet" in _plan(frame)
    with pytest.raises(Exception) as caught:
        frame.collect()
    text = str(caught.value)
    assert victim.name in text and ("Tag" in text or "tag" in text), text[:3000]

    root = copy_table(name, tmp_path / "manifest")
    _, options = _java(name, root)
    manifest = sorted(p for p in (root / "metadata").glob("*-m0.avro"))[0]
    flip_byte(manifest, os.path.getsize(manifest) // 2)
    frame = _read(rspark, metadata_path(name, root), options)
    assert "BatchScan icecrypt.iceberg" in _plan(frame)
    with pytest.raises(Exception) as caught:
        frame.collect()
    assert manifest.name in str(caught.value), str(caught.value)[:3000]


def test_configure_adds_the_extension():
    from pyspark.sql import SparkSession

    builder = SparkSession.Builder().config("spark.sql.extensions", "x.Other")
    icecrypt.spark.configure(builder)
    assert builder._options["spark.sql.extensions"] == "x.Other," + _native.EXTENSIONS_CLASS
    icecrypt.spark.configure(builder)
    assert builder._options["spark.sql.extensions"] == "x.Other," + _native.EXTENSIONS_CLASS

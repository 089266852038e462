"""``icecrypt.iceberg`` reads: the tables Iceberg Java wrote (../shared/tables) at every
snapshot, projection, the ``filter`` option, Spark filters with pushdown on, splits, and keys
that never show in plans, partitions or errors.

Few Spark jobs: the snapshots of all tables are read as one union."""

from __future__ import annotations

import base64
import json
import pickle
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql import functions as F
from pyspark.sql.datasource import CaseInsensitiveDict
from table.tablelib import (
    TABLE_NAMES,
    copy_table,
    expected,
    flip_byte,
    location_map,
    metadata_path,
    table_digest,
)
from vectorlib import TABLES_DIR

from icecrypt.kms.memory import MemoryKms
from icecrypt.spark._iceberg import TaskPartition
from icecrypt.spark._iceberg_source import IcebergDataSource
from icecrypt.table import EncryptedTable

pytestmark = pytest.mark.spark

#: Iceberg's test KMS (master keys keyA/keyB are public test values)
JAVA_KMS = {"encryption.kms-type": "memory", "encryption.kms.memory.iceberg-test-keys": "true"}
FORMAT = "icecrypt.iceberg"


@pytest.fixture(scope="module")
def ispark(spark):
    spark.dataSource.register(IcebergDataSource)
    return spark


def _options(name: str, root: Path | None = None, **extra: str) -> dict[str, str]:
    return {**JAVA_KMS, "location-map": json.dumps(location_map(name, root)), **extra}


def _read(spark, name: str, root: Path | None = None, **extra: str):
    return spark.read.format(FORMAT).options(**_options(name, root, **extra)).load(str(metadata_path(name, root)))


def _golden(name: str) -> EncryptedTable:
    return EncryptedTable.load(metadata_path(name), kms=MemoryKms.with_iceberg_test_keys(),
                               location_map=location_map(name))


def _secrets(name: str) -> list[str]:
    """Every key of a shared table (DEKs, AAD prefixes, encoded key metadata, KEKs) in
    the forms it could leak in: hex (both cases) and base64."""
    found: list[str] = []

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("dek_hex", "aad_prefix_hex", "key_metadata_hex", "kek_hex") and isinstance(value, str):
                    found.append(value)
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads((TABLES_DIR / name / "keys.json").read_text(encoding="utf-8")))
    forms = []
    for value in set(found):
        forms += [value.lower(), value.upper(), base64.b64encode(bytes.fromhex(value)).decode()]
    assert len(forms) > 30
    return forms


def _sorted(table: pa.Table) -> pa.Table:
    return table.take(pc.sort_indices(table, [("id", "ascending")]))


def test_every_snapshot_of_the_java_tables(ispark):
    """Each snapshot of each table (deletion vector, equality deletes, Avro blocks,
    partitions) through Spark equals Java's expected rows; variants split into smaller
    tasks yield the same rows from more partitions."""
    variants: list[tuple[str, dict, object]] = []
    for name in TABLE_NAMES:
        for snapshot in expected(name)["snapshots"]:
            frame = _read(ispark, name, **{"snapshot-id": str(snapshot["snapshot_id"])})
            variants.append((name, snapshot, frame))
    # Parquet split at every row group; Avro split in 512 KiB ranges of the decrypted file (the
    # Python source's tasks: the snapshots above take the native path where it applies)
    for split_name, size in (("enc_parquet_dek16", "1"), ("enc_avro_dek16", "512k")):
        split = _read(ispark, split_name, **{"split-size": size, "native": "false"})
        variants.append((split_name, expected(split_name)["snapshots"][-1], split))
        whole = _read(ispark, split_name, native="false").rdd.getNumPartitions()
        assert split.rdd.getNumPartitions() > whole == len(_golden(split_name).scan().plan_files())

    frames = [frame.withColumn("_variant", F.lit(index)) for index, (_, _, frame) in enumerate(variants)]
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame)
    rows = union.toArrow()  # one Spark job
    for index, (name, snapshot, frame) in enumerate(variants):
        mine = rows.filter(pc.equal(rows["_variant"], index)).drop_columns(["_variant"])
        assert mine.column_names == [f["name"] for f in expected(name)["schema"]["fields"]]
        assert mine.num_rows == snapshot["expected_row_count"], (name, snapshot["snapshot_id"])
        assert table_digest(mine) == snapshot["expected_digest_sha256"], (name, snapshot["snapshot_id"])


def test_schema_nullability_and_field_ids(ispark):
    schema = _read(ispark, "enc_avro_dek16").schema
    assert [f.name for f in schema] == [f["name"] for f in expected("enc_avro_dek16")["schema"]["fields"]]
    assert schema["ts"].dataType.simpleString() == "timestamp_ntz"
    assert schema["price"].dataType.simpleString() == "decimal(10,2)"
    assert not schema["id"].nullable and schema["note"].nullable
    assert schema["id"].metadata == {"parquet.field.id": 1}


def test_projection_filter_and_time_travel_equal_the_table_scan(ispark):
    """Options columns, filter and snapshot-id give what EncryptedTable.scan gives."""
    cases = [
        ("enc_parquet_dek16", ["qty", "id", "category"], "qty > 50 and category = 'alpha'", None),
        ("enc_deletes_dek16", ["id", "note", "price"], "price >= 100.00 or note is null",
         expected("enc_deletes_dek16")["snapshots"][2]["snapshot_id"]),
        ("enc_avro_dek16", ["id", "ts"], "id < 1000 or id >= 29500", None),
    ]
    frames = []
    for name, columns, row_filter, snapshot_id in cases:
        extra = {"columns": ",".join(columns), "filter": row_filter}
        if snapshot_id is not None:
            extra["snapshot-id"] = str(snapshot_id)
        frame = _read(ispark, name, **extra)
        assert frame.columns == columns
        frames.append(frame)
    for (name, columns, row_filter, snapshot_id), frame in zip(cases, frames):
        want = _golden(name).scan(columns=columns, row_filter=row_filter, snapshot_id=snapshot_id).to_arrow()
        got = frame.toArrow()
        assert 0 < got.num_rows < expected(name)["expected"]["row_count"]
        assert _sorted(got).to_pylist() == _sorted(want).to_pylist()


def test_spark_filters_stay_with_spark_even_with_python_pushdown_on(ispark):
    """The reader pushes no Spark filter: with spark.sql.python.filterPushdown.enabled,
    PySpark 4.3 would reuse a pushed-down read plan for later queries on the same
    DataFrame.  So a count after a filtered count still sees every row, and the
    ``filter`` option is the way to prune (fewer partitions, same rows as the scan)."""
    name = "enc_parquet_dek16"
    table = _golden(name)
    ispark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    try:
        frame = _read(ispark, name)
        filtered = frame.where("category = 'alpha' and qty > 50")
        counts = [filtered.count(), frame.count()]
        pruned = _read(ispark, name, filter="category = 'alpha' and qty > 50")
        partitions = pruned.rdd.getNumPartitions()
        got = pruned.where("amount < 500000.0").toArrow()
    finally:
        ispark.conf.unset("spark.sql.python.filterPushdown.enabled")
    want = table.scan(row_filter="category = 'alpha' and qty > 50").to_arrow()
    assert counts == [want.num_rows, expected(name)["expected"]["row_count"]]
    assert partitions == len(table.scan(row_filter="category = 'alpha'").plan_files()) < len(table.scan().plan_files())
    want = want.filter(pc.less(want["amount"], 500000.0))
    assert got.num_rows > 0 and _sorted(got).to_pylist() == _sorted(want).to_pylist()


def test_keys_stay_out_of_plans_and_partition_reprs(ispark, capfd):
    name = "enc_deletes_dek16"
    frame = _read(ispark, name, columns="id,category,qty", filter="id > 10")
    frame.where("qty > 3").groupBy("category").count().explain(True)
    frame.explain("formatted")
    plans = capfd.readouterr().out
    assert "BatchScan icecrypt.iceberg" in plans
    secrets = _secrets(name)
    assert not [s for s in secrets if s in plans]

    # The partitions carry the keys (inside the pickled tasks), their reprs do not.
    source = IcebergDataSource(CaseInsensitiveDict({**_options(name), "path": str(metadata_path(name))}))
    reader = source.reader(source.schema())
    partitions = reader.partitions()
    assert all(isinstance(p, TaskPartition) for p in partitions) and len(partitions) == 3
    shown = " ".join(repr(p) + repr(p.task) for p in partitions) + repr(reader.__getstate__())
    assert "delete files" in shown and not [s for s in secrets if s in shown]
    shipped_reader = pickle.dumps(reader)
    dek = bytes.fromhex(next(s for s in secrets if len(s) == 32 and re.fullmatch("[0-9a-f]+", s)))
    assert dek not in shipped_reader  # the reader Spark ships to every task holds no key
    assert any(p.task.file.key_metadata for p in pickle.loads(pickle.dumps(partitions)))


def test_damaged_data_file_fails_naming_the_file_without_keys(ispark, tmp_path):
    name = "enc_parquet_dek16"
    root = copy_table(name, tmp_path)
    victim = min((root / "data" / "category=beta").glob("*.parquet"))
    flip_byte(victim, victim.stat().st_size // 2)  # inside a page: authentication fails
    with pytest.raises(Exception) as info:  # the Python source's tasks (test_native_routing: Spark's reader)
        _read(ispark, name, root, native="false").collect()
    text = str(info.value)
    assert "AuthenticationError" in text and victim.name in text and "icecrypt.iceberg: task" in text
    assert not [s for s in _secrets(name) if s in text]


def test_wrong_master_key_is_a_clear_error(ispark, tmp_path):
    """keyA of another KMS cannot unwrap the table's KEK: planning fails, naming the
    manifest list and the table key, before any task runs."""
    from icecrypt.kms.local import LocalKms

    keystore = tmp_path / "keystore.json"
    LocalKms.create_keystore(keystore, ["keyA", "keyB"], key_length=16)
    name = "enc_deletes_dek16"
    options = {"encryption.kms-type": "local", "encryption.kms.local.keystore": str(keystore),
               "location-map": json.dumps(location_map(name))}
    frame = ispark.read.format(FORMAT).options(**options).load(str(metadata_path(name)))
    assert frame.columns[0] == "id"  # the schema needs no key
    with pytest.raises(Exception) as info:
        frame.collect()
    text = str(info.value)
    assert "planning the scan" in text and "manifest list" in text and "'keyA'" in text
    assert re.search(r"Kms\w*Error|AuthenticationError", text)
    assert not [s for s in _secrets(name) if s in text]


def test_refusals(ispark, tmp_path):
    """No KMS options, a plaintext table without encryption=none, unknown columns,
    snapshots and malformed options: errors that say what is wrong."""
    name = "enc_avro_dek16"

    def error(action) -> str:
        with pytest.raises(Exception) as info:
            action()
        return str(info.value)

    path = str(metadata_path(name))
    text = error(lambda: ispark.read.format(FORMAT).option("location-map", json.dumps(location_map(name)))
                 .load(path))
    assert "no KMS given" in text
    assert "nope" in error(lambda: _read(ispark, name, columns="id,nope").schema)
    assert "no snapshot 12345" in error(lambda: _read(ispark, name, **{"snapshot-id": "12345"}).schema)
    assert "location-map" in error(lambda: ispark.read.format(FORMAT).options(**JAVA_KMS)
                                   .option("location-map", "{not json").load(path).schema)
    assert "cannot parse row filter" in error(lambda: _read(ispark, name, filter="id >>> 3").schema)

    plain = EncryptedTable.create(str(tmp_path / "plain"), pa.schema([pa.field("id", pa.int64())]), kms=None,
                                  table_key_id=None)
    plain.append(pa.table({"id": pa.array([1, 2, 3], pa.int64())}))
    text = error(lambda: ispark.read.format(FORMAT).options(**JAVA_KMS).load(str(tmp_path / "plain")).schema)
    assert "PlaintextFileError" in text and "encryption=none" in text
    rows = ispark.read.format(FORMAT).option("encryption", "none").load(str(tmp_path / "plain")).collect()
    assert sorted(r.id for r in rows) == [1, 2, 3]

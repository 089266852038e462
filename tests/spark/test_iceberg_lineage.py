"""``icecrypt.iceberg`` with Iceberg's metadata columns: ``_row_id`` and
``_last_updated_sequence_number`` (and ``_file``, ``_pos``, ...) through the ``columns``
option, and a rewrite in Spark executors that keeps every row's lineage."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from pyspark.sql import types as T
from table.tablelib import location_map, metadata_path

import icecrypt.spark
from icecrypt.kms.memory import MemoryKms
from icecrypt.table import EncryptedTable

pytestmark = pytest.mark.spark

JAVA_KMS = {"encryption.kms-type": "memory", "encryption.kms.memory.iceberg-test-keys": "true"}
FORMAT = "icecrypt.iceberg"
COLUMNS = ["id", "_row_id", "_last_updated_sequence_number", "_file", "_pos", "_spec_id", "_partition", "_deleted"]


def _rows_by_id(rows: list[dict]) -> dict:
    return {r["id"]: r for r in rows}


def test_java_table_lineage_through_the_columns_option(icespark):
    name = "enc_deletes_dek16"
    df = (icespark.read.format(FORMAT).options(**JAVA_KMS, **{"location-map": json.dumps(location_map(name))})
          .option("columns", ",".join(COLUMNS)).load(str(metadata_path(name))))  # fmt: skip
    schema = df.schema
    assert schema.fieldNames() == COLUMNS
    assert schema["_row_id"].dataType == T.LongType() and schema["_row_id"].nullable
    assert schema["_last_updated_sequence_number"].dataType == T.LongType()
    assert schema["_pos"].dataType == T.LongType() and not schema["_pos"].nullable
    assert schema["_spec_id"].dataType == T.IntegerType()
    assert schema["_deleted"].dataType == T.BooleanType()
    assert isinstance(schema["_partition"].dataType, T.StructType)
    got = [r.asDict(recursive=True) for r in df.collect()]
    table = EncryptedTable.load(metadata_path(name), kms=MemoryKms.with_iceberg_test_keys(), location_map=location_map(name))
    want = table.scan(columns=COLUMNS).to_arrow().to_pylist()
    assert len(got) == len(want) == 10500  # deleted rows too: _deleted is projected
    assert _rows_by_id(got) == _rows_by_id(want)
    assert len({r["_row_id"] for r in got}) == len(got)
    # lineage alone: only the live rows
    lineage = (icespark.read.format(FORMAT).options(**JAVA_KMS, **{"location-map": json.dumps(location_map(name))})
               .option("columns", "id,_row_id,_last_updated_sequence_number").load(str(metadata_path(name))))  # fmt: skip
    live = {r["id"]: (r["_row_id"], r["_last_updated_sequence_number"]) for r in lineage.collect()}
    assert live == {r["id"]: (r["_row_id"], r["_last_updated_sequence_number"]) for r in want if not r["_deleted"]}
    # the filter option may name them too
    picked = (icespark.read.format(FORMAT).options(**JAVA_KMS, **{"location-map": json.dumps(location_map(name))})
              .option("columns", "id,_row_id").option("filter", "_row_id >= 8000 and _pos < 10")
              .load(str(metadata_path(name))))  # fmt: skip
    assert sorted(r["_row_id"] for r in picked.collect()) == sorted(
        r["_row_id"] for r in want if not r["_deleted"] and r["_row_id"] >= 8000 and r["_pos"] < 10)


def test_spark_rewrite_keeps_row_lineage(icespark, kms, kms_options, tmp_path):
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("s", pa.string())])
    location = str(tmp_path / "t")
    table = EncryptedTable.create(location, schema, kms=kms, table_key_id="master")
    for i in range(4):
        table.append(pa.table({"id": pa.array(range(i * 50, i * 50 + 50), pa.int64()), "s": ["x"] * 50}, schema=schema))
    table.delete("id in (3, 70, 120)")

    def lineage() -> dict:
        df = icespark.read.format(FORMAT).options(**kms_options).option("columns", "id,_row_id,_last_updated_sequence_number").load(location)
        return {r["id"]: (r["_row_id"], r["_last_updated_sequence_number"]) for r in df.collect()}

    before = lineage()
    assert len(before) == 197 and sorted(r for r, _ in before.values()) == [i for i in range(200) if i not in (3, 70, 120)]
    result = icecrypt.spark.rewrite_data_files(icespark, location, kms_properties=kms_options, options={"rewrite-all": "true"})
    assert result.rewritten_data_files == 4 and result.added_data_files == 1
    assert lineage() == before
    table.refresh()
    assert table.current_snapshot().summary["operation"] == "replace"
    # an unpartitioned table: _partition is an empty struct
    df = icespark.read.format(FORMAT).options(**kms_options).option("columns", "id,_partition,_spec_id").load(location)
    assert df.schema["_partition"].dataType == T.StructType([])
    assert {r["_spec_id"] for r in df.collect()} == {0}

"""``icecrypt.iceberg`` reads a table whose schema evolved after its files were written
(``update_schema``): Iceberg Java's table with a column renamed and one added with a v3
default, read by field id through Spark: the renamed column under its new name, the
added one with its ``initial-default``, a filter on each; rows appended after the change
(new schema, field ids) read back beside the old ones."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from pyiceberg.types import StringType
from table.tablelib import copy_table, location_map, metadata_path

from icecrypt.kms.memory import MemoryKms
from icecrypt.spark._iceberg_source import IcebergDataSource
from icecrypt.table import EncryptedTable

pytestmark = pytest.mark.spark

JAVA_KMS = {"encryption.kms-type": "memory", "encryption.kms.memory.iceberg-test-keys": "true"}
FORMAT = "icecrypt.iceberg"
NAME = "enc_parquet_dek16"


@pytest.fixture(scope="module")
def ispark(spark):
    spark.dataSource.register(IcebergDataSource)
    return spark


def test_spark_reads_evolved_java_table(ispark, tmp_path):
    root = copy_table(NAME, tmp_path)
    table = EncryptedTable.load(metadata_path(NAME, root), kms=MemoryKms.with_iceberg_test_keys(),
                                location_map=location_map(NAME, root))  # fmt: skip
    before = table.scan().to_arrow()
    first = table.schema.fields[0].name
    with table.update_schema() as update:
        update.rename_column(first, "renamed")
        update.add_column("origin", StringType(), default_value="java")
    options = {**JAVA_KMS, "location-map": json.dumps(location_map(NAME, root))}
    frame = ispark.read.format(FORMAT).options(**options).load(table.metadata_location)
    assert frame.columns[0] == "renamed" and frame.columns[-1] == "origin"
    rows = frame.toArrow()
    assert rows.num_rows == before.num_rows
    assert sorted(rows.column("renamed").to_pylist(), key=repr) == sorted(before.column(first).to_pylist(), key=repr)
    assert set(rows.column("origin").to_pylist()) == {"java"}
    value = before.column(first)[0].as_py()
    filtered = frame.where(frame["renamed"] == value).where(frame["origin"] == "java").count()
    assert filtered == sum(1 for v in before.column(first).to_pylist() if v == value)

    # an append after the change (new schema, field ids), then both generations read back
    row = before.slice(0, 1)
    row = row.rename_columns(["renamed", *row.column_names[1:]]).append_column("origin", pa.array(["python"]))
    table.append(row)
    again = ispark.read.format(FORMAT).options(**options).load(table.metadata_location).toArrow()
    assert again.num_rows == before.num_rows + 1
    assert sorted(set(again.column("origin").to_pylist())) == ["java", "python"]

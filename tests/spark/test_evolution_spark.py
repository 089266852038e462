"""``icecrypt.iceberg`` on tables whose partition spec and sort order changed: Spark reads
files of every spec with filters equal to the table scan, and Spark writes use the new
default spec and sort each file by the default order."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from icecrypt.kms.local import LocalKms
from icecrypt.spark._iceberg_source import IcebergDataSource
from icecrypt.table import EncryptedTable, read_task

pytestmark = pytest.mark.spark

FORMAT = "icecrypt.iceberg"
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("cat", pa.string()),
                    pa.field("ts", pa.timestamp("us"))])  # fmt: skip


def _rows(ids) -> pa.Table:
    ids = list(ids)
    return pa.table({"id": ids, "cat": [None if i % 7 == 0 else f"c{(i * 5) % 3}" for i in ids],
                     "ts": [1_700_000_000_000_000 + i * 3_600_000_000 for i in ids]}, schema=SCHEMA)  # fmt: skip


def test_spark_reads_and_writes_across_specs_and_sort_orders(spark, tmp_path):
    spark.dataSource.register(IcebergDataSource)
    keystore = tmp_path / "keystore.json"
    LocalKms.create_keystore(keystore, ["master"])
    kms = LocalKms(keystore)
    options = {"encryption.kms-type": "local", "encryption.kms.local.keystore": str(keystore)}
    location = str(tmp_path / "t")
    table = EncryptedTable.create(location, SCHEMA, kms=kms, table_key_id="master")
    table.append(_rows(range(0, 50)))
    table.update_spec().add_identity("cat").add_field("ts", "day").commit()
    table.append(_rows(range(50, 100)))
    table.update_spec().remove_field("ts_day").add_field("id", "bucket[4]").commit()
    table.replace_sort_order().desc("ts").commit()
    frame = spark.createDataFrame(_rows(range(100, 160))).repartition(2)
    frame.write.format(FORMAT).options(**options).mode("append").save(location)

    table = EncryptedTable.load(location, kms=kms)
    files = table.inspect.data_files().to_pylist()
    assert {f["spec_id"] for f in files} == {0, 1, 2}
    assert {f["sort_order_id"] for f in files if f["spec_id"] == 2} == {1}
    for task in table.scan(row_filter="id >= 100").plan_files():
        if task.spec_id == 2:
            ts = pa.Table.from_batches(list(read_task(task, table.filesystem))).column("ts").to_pylist()
            assert ts == sorted(ts, reverse=True)

    reader = spark.read.format(FORMAT).options(**options)
    for condition, row_filter in [
        (F.col("cat") == "c1", "cat = 'c1'"),
        (F.col("id").isin(3, 61, 140), "id in (3, 61, 140)"),
        ((F.col("id") > 40) & F.col("cat").isNull(), "id > 40 and cat is null"),
    ]:
        got = sorted(reader.load(location).filter(condition).select("id").toArrow().column("id").to_pylist())
        assert got and got == sorted(table.scan(row_filter=row_filter).to_arrow().column("id").to_pylist())
    both = reader.option("filter", "cat = 'c2'").load(location).count()
    assert both == table.scan(row_filter="cat = 'c2'").to_arrow().num_rows

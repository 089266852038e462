"""Spark's Iceberg writer cleans up only inside the table (issue 16, confined paths): an
aborted job deletes the data files its tasks reported, and none outside the table's pinned
roots, however the reported location is spelled.  No Spark session is needed: the
driver-side abort runs as Spark would call it."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StructField, StructType

from icecrypt.spark._iceberg import IcebergWriter, TaskDataFiles
from icecrypt.table import EncryptedTable
from icecrypt.table.files.io import PathOutsideTableWarning


def test_abort_never_deletes_outside_the_table(tmp_path):
    table = EncryptedTable.create(str(tmp_path / "t"), pa.schema([pa.field("id", pa.int64())]), kms=None, table_key_id=None)
    table.append(pa.table({"id": [1, 2]}))
    (tmp_path / "elsewhere").mkdir()
    victim = tmp_path / "elsewhere" / "payroll.parquet"
    victim.write_bytes(b"victim")
    writer = IcebergWriter({"path": str(tmp_path / "t"), "encryption": "none"}, StructType([StructField("id", LongType())]), False)
    own = tmp_path / "t" / "data" / f"00000-1-{writer.operation_id}-00001.parquet"
    own.write_bytes(b"written by a task")
    reported = [str(victim), f"file://{victim}", f"{tmp_path}/t/data/../../elsewhere/payroll.parquet", str(own)]
    with pytest.warns(PathOutsideTableWarning, match="payroll.parquet"):
        writer.abort([TaskDataFiles([{"file_path": p} for p in reported])])
    assert victim.read_bytes() == b"victim"
    assert not own.exists()  # the job's own file inside the table went
    assert sorted(EncryptedTable.load(str(tmp_path / "t")).scan().to_arrow()["id"].to_pylist()) == [1, 2]

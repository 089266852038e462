"""``icecrypt.iceberg`` incremental reads: ``start-snapshot-id`` / ``end-snapshot-id`` (the
rows appended between), ``changelog=true`` (inserted and deleted rows with Iceberg's change
columns) and ``start-timestamp`` / ``end-timestamp``, on an icecrypt table and a Java one;
bad combinations are clear errors."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from table.tablelib import expected, location_map, metadata_path

from icecrypt.kms.memory import MemoryKms
from icecrypt.spark._iceberg_source import IcebergDataSource
from icecrypt.table import EncryptedTable

pytestmark = pytest.mark.spark

JAVA_KMS = {"encryption.kms-type": "memory", "encryption.kms.memory.iceberg-test-keys": "true"}
FORMAT = "icecrypt.iceberg"
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("s", pa.string())])


def rows(ids) -> pa.Table:
    ids = list(ids)
    return pa.table({"id": pa.array(ids, pa.int64()), "s": [f"row-{i}" for i in ids]}, schema=SCHEMA)


@pytest.fixture(scope="module")
def ispark(spark):
    spark.dataSource.register(IcebergDataSource)
    return spark


@pytest.fixture
def history(tmp_path):
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=MemoryKms.with_iceberg_test_keys(),
                                  table_key_id="keyA")
    snaps = [table.append(rows(range(3))), table.append(rows(range(3, 5))), table.overwrite(rows([7, 8])),
             table.append(rows([9]))]
    return table, snaps


def _read(spark, table, **options):
    return spark.read.format(FORMAT).options(**JAVA_KMS, **options).load(table.metadata_location)


def test_incremental_and_changelog(ispark, history):
    table, (a, b, c, d) = history
    got = _read(ispark, table, **{"start-snapshot-id": str(a)})
    assert sorted(r.id for r in got.collect()) == [3, 4, 9]  # the overwrite is skipped
    got = _read(ispark, table, **{"start-snapshot-id": str(a), "end-snapshot-id": str(b)})
    assert sorted(r.id for r in got.collect()) == [3, 4]
    changes = _read(ispark, table, changelog="true", **{"start-snapshot-id": str(a)})
    assert changes.columns == ["id", "s", "_change_type", "_change_ordinal", "_commit_snapshot_id"]
    found = sorted((r._change_ordinal, r._change_type, r._commit_snapshot_id, r.id) for r in changes.collect())
    want = table.changelog_scan(from_snapshot_id=a).to_arrow()
    assert found == sorted(zip(want["_change_ordinal"].to_pylist(), want["_change_type"].to_pylist(),
                               want["_commit_snapshot_id"].to_pylist(), want["id"].to_pylist()))
    assert (1, "DELETE", c, 0) in found and (1, "INSERT", c, 7) in found and (2, "INSERT", d, 9) in found
    # by moments: from the second snapshot's timestamp (exclusive of it, as Java's Spark) to now
    ts_b = table.snapshot(b).timestamp_ms
    by_time = _read(ispark, table, changelog="true", columns="id", **{"start-timestamp": str(ts_b)})
    assert by_time.columns == ["id", "_change_type", "_change_ordinal", "_commit_snapshot_id"]
    commits = {r._commit_snapshot_id for r in by_time.collect()}
    assert d in commits and a not in commits  # (b too when it shares a's millisecond)


def test_bad_options(ispark, history):
    table, (a, b, c, d) = history
    with pytest.raises(Exception, match="end-snapshot-id alone is not an incremental read"):
        _read(ispark, table, **{"end-snapshot-id": str(b)}).collect()
    with pytest.raises(Exception, match="cannot be combined with snapshot-id"):
        _read(ispark, table, **{"start-snapshot-id": str(a), "snapshot-id": str(b)}).collect()
    with pytest.raises(Exception, match=rf"snapshot {c} \(start, exclusive\) is not an ancestor of snapshot {b}"):
        _read(ispark, table, **{"start-snapshot-id": str(c), "end-snapshot-id": str(b)}).collect()
    with pytest.raises(Exception, match="changelog='yes' must be true or false"):
        _read(ispark, table, changelog="yes").collect()
    with pytest.raises(Exception, match="start-snapshot-id \\(incremental reads\\) have no meaning with option"):
        _read(ispark, table, **{"metadata-table": "snapshots", "start-snapshot-id": str(a)}).collect()
    frame = _read(ispark, table, **{"start-snapshot-id": str(a)})
    with pytest.raises(Exception, match="start-snapshot-id \\(incremental reads\\) have no meaning in a write"):
        (frame.write.format(FORMAT).options(**JAVA_KMS, **{"start-snapshot-id": str(a)}).mode("append")
         .save(table.metadata_location))
    assert table.refresh().current_snapshot_id == d  # nothing written


def test_java_table(ispark, tmp_path):
    name = "enc_parquet_dek16"
    (s1, n1), (_, n2) = [(s["snapshot_id"], s["expected_row_count"]) for s in expected(name)["snapshots"]]
    frame = (ispark.read.format(FORMAT).options(**JAVA_KMS, **{"location-map": json.dumps(location_map(name))})
             .option("start-snapshot-id", str(s1)).load(str(metadata_path(name))))
    assert frame.count() == n2 - n1

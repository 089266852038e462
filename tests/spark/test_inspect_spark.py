"""``icecrypt.iceberg`` with option ``metadata-table``: every metadata table of a table
Iceberg Java wrote, read as a DataFrame, equals ``table.inspect``; no key in any row."""

from __future__ import annotations

import base64
import json

import pytest
from table.tablelib import location_map, metadata_path

from icecrypt.keys import StandardKeyMetadata
from icecrypt.kms.memory import MemoryKms
from icecrypt.spark._iceberg_source import IcebergDataSource
from icecrypt.table import METADATA_TABLES, EncryptedTable

pytestmark = pytest.mark.spark

NAME = "enc_deletes_dek16"
JAVA_KMS = {"encryption.kms-type": "memory", "encryption.kms.memory.iceberg-test-keys": "true"}


@pytest.fixture(scope="module")
def ispark(spark):
    spark.dataSource.register(IcebergDataSource)
    return spark


def _read(spark, **options: str):
    options = {**JAVA_KMS, "location-map": json.dumps(location_map(NAME)), **options}
    return spark.read.format("icecrypt.iceberg").options(**options).load(str(metadata_path(NAME)))


def _table() -> EncryptedTable:
    return EncryptedTable.load(metadata_path(NAME), kms=MemoryKms.with_iceberg_test_keys(), location_map=location_map(NAME))


def test_every_metadata_table(ispark):
    table = _table()
    keys = {StandardKeyMetadata.decode(f.key_metadata).encryption_key
            for t in table.scan().plan_files() for f in (t.file, *t.deletes)}  # fmt: skip
    assert keys
    for name in METADATA_TABLES:
        expected = table.inspect.table(name)
        df = _read(ispark, **{"metadata-table": name})
        assert df.columns == expected.column_names, name
        rows = [r.asDict(recursive=True) for r in df.collect()]
        assert len(rows) == expected.num_rows, name
        text = repr(rows)
        for key in keys:
            assert key.hex() not in text and base64.b64encode(key).decode() not in text
    files = {r["file_path"]: r for r in (x.asDict() for x in _read(ispark, **{"metadata-table": "files"}).collect())}
    for row in table.inspect.files().select(["file_path", "record_count", "key_metadata", "file_format"]).to_pylist():
        spark_row = files[row["file_path"]]
        assert (spark_row["record_count"], spark_row["key_metadata"], spark_row["file_format"]) == (
            row["record_count"], row["key_metadata"], row["file_format"])


def test_options(ispark):
    table = _table()
    first = table.snapshots()[0].snapshot_id
    df = _read(ispark, **{"metadata-table": "data_files", "snapshot-id": str(first), "columns": "file_path,record_count"})
    assert df.columns == ["file_path", "record_count"]
    assert sorted(r.file_path for r in df.collect()) == sorted(
        table.inspect.data_files(snapshot_id=first).column("file_path").to_pylist())
    parts = _read(ispark, **{"metadata-table": "partitions", "filter": "category = 'alpha'"}).collect()
    assert [r.partition.category for r in parts] == ["alpha"] and parts[0].position_delete_record_count == 400

    for options, message in [
        ({"metadata-table": "snapshot"}, "unknown metadata table 'snapshot'"),
        ({"metadata-table": "history", "snapshot-id": str(first)}, "takes no snapshot id"),
        ({"metadata-table": "files", "filter": "id > 3"}, "not to 'files'"),
        ({"metadata-table": "files", "columns": "path"}, "has no column(s) path"),
    ]:
        with pytest.raises(Exception, match=message.replace("(", r"\(").replace(")", r"\)")):
            _read(ispark, **options).collect()

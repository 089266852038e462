"""``icecrypt.iceberg`` keeps the driver's pin: a version forged in storage after the job
started (encryption.key-id dropped or changed) is refused by the write tasks and by the
commit before any file is written; option ``table-key-id`` pins reads."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from forgery import publish_next_version
from pyspark.sql import types as T

from icecrypt import TableIdentityError
from icecrypt.kms.local import LocalKms
from icecrypt.spark._iceberg import IcebergWriter
from icecrypt.spark._iceberg_source import IcebergDataSource
from icecrypt.table import EncryptedTable

pytestmark = pytest.mark.spark

MASTER, OTHER = "master", "other"
FORMAT = "icecrypt.iceberg"
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string())])
SPARK_SCHEMA = T.StructType([T.StructField("id", T.LongType(), False), T.StructField("name", T.StringType())])


@pytest.fixture
def keystore(tmp_path) -> Path:
    path = tmp_path / "keystore.json"
    LocalKms.create_keystore(path, [MASTER, OTHER])
    return path


@pytest.fixture
def options(keystore) -> dict[str, str]:
    return {"encryption.kms-type": "local", "encryption.kms.local.keystore": str(keystore)}


def _rows(start: int, n: int) -> pa.Table:
    return pa.table({"id": pa.array(range(start, start + n), pa.int64()), "name": [f"r{i}" for i in range(start, start + n)]},
                    schema=SCHEMA)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _forge(root: Path, change) -> Path:
    """A next version written straight into storage (hint moved to it; the pin refuses it
    before the authenticator it carries from its base is even looked at)."""
    return publish_next_version(root, change, strip=False)


def _drop_key(doc):
    del doc["properties"]["encryption.key-id"]


def _other_key(doc):
    doc["properties"]["encryption.key-id"] = OTHER


@pytest.mark.parametrize("change", [_drop_key, _other_key], ids=["no-key-id", "other-key-id"])
def test_tasks_and_commit_refuse_a_version_forged_mid_job(tmp_path, keystore, options, change):
    root = tmp_path / "t"
    table = EncryptedTable.create(str(root), SCHEMA, kms=LocalKms(keystore), table_key_id=MASTER)
    table.append(_rows(0, 10))
    writer = IcebergWriter({**options, "path": str(root)}, SPARK_SCHEMA, overwrite=False)  # the driver
    finished = writer.write(iter(_rows(10, 5).to_batches()))  # a task before the forgery
    forged = _forge(root, change)
    before = _files(tmp_path)
    with pytest.raises(TableIdentityError) as caught:
        writer.write(iter(_rows(20, 5).to_batches()))  # a task after it
    assert str(forged) in str(caught.value)
    with pytest.raises(TableIdentityError):
        writer.commit([finished])
    writer.abort([finished])  # what Spark does after a failed commit
    # nothing written; the finished task's encrypted files are gone again
    removed = {f["file_path"] for f in finished.data_files}
    assert {p: c for p, c in before.items() if p not in removed} == _files(tmp_path)
    forged.unlink()
    (root / "metadata" / "version-hint.text").write_text(str(int(forged.name[1:].split(".")[0]) - 1))
    reloaded = EncryptedTable.load(str(root), kms=LocalKms(keystore))
    assert reloaded.verify().ok and reloaded.scan().to_arrow().num_rows == 10


def test_table_key_id_option_pins_reads(spark, tmp_path, keystore, options):
    spark.dataSource.register(IcebergDataSource)
    root = tmp_path / "t"
    EncryptedTable.create(str(root), SCHEMA, kms=LocalKms(keystore), table_key_id=MASTER).append(_rows(0, 10))
    read = spark.read.format(FORMAT).options(**options)
    assert read.option("table-key-id", MASTER).load(str(root)).count() == 10
    with pytest.raises(Exception, match="master key changed") as caught:
        read.option("table-key-id", OTHER).load(str(root)).collect()
    assert "TableIdentityError" in str(caught.value) or "pinned from the caller" in str(caught.value)

"""``icecrypt.iceberg`` and authenticated metadata (issue "Trust, part 2"): a fresh Spark
load is anchored at the path it is given, option ``require-authenticated-metadata``
refuses a version without a valid authenticator in planning, write tasks and commits."""

from __future__ import annotations

from pathlib import Path

import pytest
from forgery import hide_newest_snapshot, publish_next_version
from test_attack_spark_pin import MASTER, SCHEMA, SPARK_SCHEMA, _rows, keystore, options  # noqa: F401 (fixtures)

from icecrypt import TableIntegrityError
from icecrypt.kms.local import LocalKms
from icecrypt.spark._iceberg import IcebergWriter
from icecrypt.spark._iceberg_source import IcebergDataSource
from icecrypt.table import EncryptedTable

pytestmark = pytest.mark.spark

FORMAT = "icecrypt.iceberg"


@pytest.fixture
def table_root(tmp_path, keystore) -> Path:  # noqa: F811
    root = tmp_path / "t"
    table = EncryptedTable.create(str(root), SCHEMA, kms=LocalKms(keystore), table_key_id=MASTER)
    table.append(_rows(0, 10))
    table.append(_rows(10, 10))
    return root


def test_a_read_requiring_authentication_refuses_a_forged_descendant(spark, table_root, options):  # noqa: F811
    """The newest append hidden, the identity kept: without the option a fresh Spark read
    takes the unauthenticated version (documented); with it, refused in planning."""
    spark.dataSource.register(IcebergDataSource)
    read = spark.read.format(FORMAT).options(**options)
    assert read.load(str(table_root)).count() == 20
    publish_next_version(table_root, hide_newest_snapshot)
    assert read.load(str(table_root)).count() == 10  # what a reader that requires nothing sees
    strict = read.option("require-authenticated-metadata", "true").option("table-key-id", MASTER)
    with pytest.raises(Exception, match="TableIntegrityError|requires authenticated metadata"):
        strict.load(str(table_root)).collect()


def test_a_fresh_spark_load_is_anchored_at_its_path(spark, tmp_path, table_root, options):  # noqa: F811
    spark.dataSource.register(IcebergDataSource)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    publish_next_version(table_root, lambda doc: doc.update(location=str(elsewhere)))
    with pytest.raises(Exception, match="is not the table directory"):
        spark.read.format(FORMAT).options(**options).load(str(table_root)).collect()


def test_write_tasks_and_commit_require_authentication(tmp_path, table_root, options):  # noqa: F811
    writer = IcebergWriter({**options, "path": str(table_root), "require-authenticated-metadata": "true"},
                           SPARK_SCHEMA, overwrite=False)  # fmt: skip
    finished = writer.write(iter(_rows(100, 5).to_batches()))
    publish_next_version(table_root, hide_newest_snapshot)
    with pytest.raises(TableIntegrityError):
        writer.write(iter(_rows(200, 5).to_batches()))
    with pytest.raises(TableIntegrityError):
        writer.commit([finished])
    writer.abort([finished])


def test_the_option_is_checked(spark, table_root, options):  # noqa: F811
    spark.dataSource.register(IcebergDataSource)
    with pytest.raises(Exception, match="require-authenticated-metadata='yes' must be true or false"):
        spark.read.format(FORMAT).options(**options).option("require-authenticated-metadata", "yes").load(
            str(table_root)).collect()

"""``icecrypt.iceberg`` writes: executors write encrypted data files, the driver commits
one snapshot per job (append, overwrite), a table can be created from the DataFrame,
and failed jobs or unfit DataFrames leave the table as it was."""

from __future__ import annotations

import decimal
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.transforms import IdentityTransform
from pyspark.sql import functions as F
from pyspark.sql import types as T

from icecrypt.kms.local import LocalKms
from icecrypt.spark._iceberg_source import IcebergDataSource
from icecrypt.table import EncryptedTable

pytestmark = pytest.mark.spark

MASTER = "master"
FORMAT = "icecrypt.iceberg"
SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False),
    pa.field("category", pa.string(), nullable=False),
    pa.field("qty", pa.int32()),
    pa.field("amount", pa.float64()),
    pa.field("ts", pa.timestamp("us")),
    pa.field("price", pa.decimal128(10, 2)),
    pa.field("note", pa.string()),
])


@pytest.fixture(scope="module")
def ispark(spark):
    spark.dataSource.register(IcebergDataSource)
    return spark


@pytest.fixture(scope="module")
def keystore(tmp_path_factory):
    path = tmp_path_factory.mktemp("iceberg-kms") / "keystore.json"
    LocalKms.create_keystore(path, [MASTER])
    return path


@pytest.fixture(scope="module")
def kms(keystore) -> LocalKms:
    return LocalKms(keystore)


@pytest.fixture(scope="module")
def kms_options(keystore) -> dict[str, str]:
    return {"encryption.kms-type": "local", "encryption.kms.local.keystore": str(keystore)}


def _rows(n: int, start: int) -> pa.Table:
    rng = np.random.default_rng(start)
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table({
        "id": ids,
        "category": pa.array(["alpha", "beta", "gamma"]).take(pa.array(ids % 3)),
        "qty": pa.array((ids % 97).astype(np.int32)),
        "amount": pa.array(rng.random(n) * 1000),
        "ts": pa.array(1_700_000_000_000_000 + ids * 1_000_003, pa.timestamp("us")),
        "price": pa.array([decimal.Decimal(int(i) * 7 - 5000).scaleb(-2) for i in ids], pa.decimal128(10, 2)),
        "note": pa.array([None if i % 5 == 0 else f"n{i}" for i in ids]),
    }).cast(SCHEMA)


def _frame(spark, table: pa.Table, partitions: int):
    return spark.createDataFrame(table).repartition(partitions)


def _sorted(table: pa.Table) -> pa.Table:
    return table.take(pc.sort_indices(table, [("id", "ascending")]))


def _create(location, kms) -> EncryptedTable:
    spec = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="category"))
    return EncryptedTable.create(str(location), SCHEMA, kms=kms, table_key_id=MASTER, partition_spec=spec)


def _data_files(table: EncryptedTable) -> list:
    return [task.file for task in table.scan().plan_files()]


def test_append_twice_then_overwrite(ispark, kms, kms_options, tmp_path):
    location = tmp_path / "events"
    _create(location, kms)
    first, second, third = _rows(3_000, 0), _rows(1_000, 3_000), _rows(1_500, 10_000)

    def save(rows: pa.Table, partitions: int, mode: str) -> EncryptedTable:
        _frame(ispark, rows, partitions).write.format(FORMAT).options(**kms_options).mode(mode).save(str(location))
        return EncryptedTable.load(str(location), kms=kms)

    table = save(first, 2, "append")
    table = save(second, 1, "append")
    assert [s.summary["operation"] for s in table.snapshots()] == ["append", "append"]
    assert _sorted(table.scan().to_arrow()).equals(_sorted(pa.concat_tables([first, second])))
    files = _data_files(table)
    # two tasks x three partitions, then one task x three: a fresh DEK for every file
    assert len(files) == 9 and len({f.key().encryption_key for f in files}) == 9
    for f in files:
        with open(f.fs_path, "rb") as handle:
            assert handle.read(4) == b"PARE"  # natively encrypted Parquet (encrypted footer)

    table = save(third, 2, "overwrite")
    snapshots = table.snapshots()
    assert [s.summary["operation"] for s in snapshots] == ["append", "append", "overwrite"]
    assert _sorted(table.scan().to_arrow()).equals(_sorted(third))
    assert table.verify().ok

    # Back through Spark: the current state and, by time travel, the second append.
    reads = [ispark.read.format(FORMAT).options(**kms_options).load(str(location)),
             ispark.read.format(FORMAT).options(**kms_options).option("snapshot-id", str(snapshots[1].snapshot_id))
             .load(str(location))]
    both = reads[0].withColumn("_v", F.lit(0)).unionByName(reads[1].withColumn("_v", F.lit(1))).toArrow()
    for variant, want in enumerate([third, pa.concat_tables([first, second])]):
        got = both.filter(pc.equal(both["_v"], variant)).drop_columns(["_v"])
        assert _sorted(got).cast(SCHEMA).equals(_sorted(want))

    # A keystore whose "master" is another key cannot read the table.
    other = tmp_path / "other-keystore.json"
    LocalKms.create_keystore(other, [MASTER])
    with pytest.raises(Exception) as info:
        ispark.read.format(FORMAT).option("encryption.kms-type", "local").option(
            "encryption.kms.local.keystore", str(other)).load(str(location)).collect()
    text = str(info.value)
    # the load verifies the version's authenticator first: its metadata key does not unwrap
    assert "does not unwrap under master key 'master'" in text and "KmsInvalidWrappedKeyError" in text


def test_create_from_the_dataframe_with_avro_files(ispark, kms, kms_options, tmp_path):
    location = tmp_path / "new-table"
    rows = _rows(2_000, 0)
    frame = _frame(ispark, rows, 2)
    assert frame.schema["ts"].dataType == T.TimestampType()  # Spark reads naive Arrow timestamps as instants
    (frame.write.format(FORMAT).options(**kms_options).option("table-key-id", MASTER)
     .option("write-format", "avro").mode("append").save(str(location)))
    table = EncryptedTable.load(str(location), kms=kms)
    assert table.encrypted and table.properties["encryption.key-id"] == MASTER
    assert [f.name for f in table.schema.fields] == SCHEMA.names
    assert [str(f.field_type) for f in table.schema.fields] == [
        "long", "string", "int", "double", "timestamptz", "decimal(10, 2)", "string"]
    files = _data_files(table)
    assert len(files) == 2 and all(f.file_format == "AVRO" for f in files)
    for f in files:
        with open(f.fs_path, "rb") as handle:
            assert handle.read(4) == b"AGS1"
    got = table.scan().to_arrow()
    assert _sorted(got).select(SCHEMA.names).cast(SCHEMA).equals(_sorted(rows))


def test_failed_jobs_leave_nothing(ispark, kms, kms_options, tmp_path):
    """A task fails after another wrote its files: abort deletes them, the table keeps its
    snapshot; a table the failed job created is removed again."""
    location = tmp_path / "events"
    table = _create(location, kms)
    table.append(_rows(100, 0))
    before = sorted(p for p in (location / "data").rglob("*") if p.is_file())

    def failing(watch, files, old=frozenset()):
        """The frame whose row with id 2500 fails its task once the other task has written
        its ``files`` files under ``watch`` (whole: they end in the Parquet magic) and had
        time to report them; a fixed sleep was not enough on a slow host."""

        @F.udf(T.LongType())
        def explode_at_2500(value):
            if value == 2500:
                from pyspark import TaskContext

                own = f"{TaskContext.get().taskAttemptId():05d}-"
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    done = [p for p in watch.rglob("*.parquet")
                            if p.name not in old and not p.name.startswith((own, "."))
                            and p.read_bytes()[-4:] in (b"PARE", b"PAR1")]
                    if len(done) >= files:
                        break
                    time.sleep(0.1)
                time.sleep(2)  # its commit message on the way to the driver
                raise RuntimeError("boom")
            return value

        return _frame(ispark, _rows(3_000, 1_000), 2).sortWithinPartitions("id").withColumn(
            "id", explode_at_2500("id"))

    with pytest.raises(Exception, match="boom"):
        failing(location / "data", 3, frozenset(p.name for p in before)).write.format(FORMAT).options(
            **kms_options).mode("append").save(str(location))
    assert EncryptedTable.load(str(location), kms=kms).current_snapshot_id == table.current_snapshot_id
    assert sorted(p for p in (location / "data").rglob("*") if p.is_file()) == before

    fresh = tmp_path / "fresh"
    with pytest.raises(Exception, match="boom"):
        failing(fresh, 1).write.format(FORMAT).options(**kms_options).option("table-key-id", MASTER).mode(
            "append").save(str(fresh))
    assert not [p for p in fresh.rglob("*") if p.is_file()]


def test_unfit_writes_are_refused(ispark, kms, kms_options, tmp_path):
    """Refused on the driver before any task runs: no table, a plaintext table, columns
    the table lacks, a missing required column, another master key."""
    location = tmp_path / "events"
    _create(location, kms)
    plain = tmp_path / "plain"
    EncryptedTable.create(str(plain), SCHEMA, kms=None, table_key_id=None)
    frame = _frame(ispark, _rows(10, 0), 1)

    def error(df, path, **options) -> str:
        with pytest.raises(Exception) as info:
            df.write.format(FORMAT).options(**{**kms_options, **options}).mode("append").save(str(path))
        return str(info.value)

    text = error(frame, tmp_path / "nowhere")
    assert "no table at" in text and "table-key-id" in text
    text = error(frame, plain)
    assert "PlaintextFileError" in text and "encryption=none" in text
    assert "no column 'extra'" in error(frame.withColumn("extra", F.lit(1)), location)
    assert "required column(s) 'category' missing" in error(frame.drop("category"), location)
    assert "not encrypted under master key 'other'" in error(frame, location, **{"table-key-id": "other"})
    assert EncryptedTable.load(str(location), kms=kms).current_snapshot_id is None
    assert not list(location.rglob("*.parquet")) and not (tmp_path / "nowhere").exists()


def test_catalog_tables_by_identifier(ispark, kms, kms_options, tmp_path):
    """Option ``catalog``: load()/save() take an identifier; the commit swaps the catalog's
    pointer (the table PyIceberg's SqlCatalog sees moves too); a missing table is created
    in the catalog from the DataFrame with option table-key-id."""
    from pyiceberg.catalog.sql import SqlCatalog

    from icecrypt.catalog import load_catalog

    warehouse = str(tmp_path / "wh")
    catalog = load_catalog("spark", warehouse=warehouse, kms=kms)
    catalog.create_namespace("db")
    options = {**kms_options, "catalog": "spark", "catalog.warehouse": warehouse}
    rows = ispark.createDataFrame([(i, f"c{i % 3}", float(i)) for i in range(40)], "id long, category string, amount double")
    rows.repartition(2).write.format(FORMAT).options(**options).option("table-key-id", MASTER).mode("append").save("db.events")
    table = catalog.load_table("db.events")
    assert table.encrypted and len(table.snapshots()) == 1
    first = table.metadata_location
    rows.where("id < 10").write.format(FORMAT).options(**options).mode("append").save("db.events")
    table = catalog.load_table("db.events")
    assert len(table.snapshots()) == 2 and table.metadata_location != first
    assert not any(p.name.startswith("v") for p in (tmp_path / "wh/db/events/metadata").glob("*.metadata.json"))
    py = SqlCatalog("spark", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}")
    assert py.load_table("db.events").metadata_location.endswith(table.metadata_location.rsplit("/", 1)[1])
    back = ispark.read.format(FORMAT).options(**options).load("db.events")
    assert back.count() == 50 and back.where("id < 10").count() == 20
    with pytest.raises(Exception, match="db.missing"):
        ispark.read.format(FORMAT).options(**options).load("db.missing").count()

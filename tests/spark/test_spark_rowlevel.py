"""``icecrypt.iceberg`` row-level overwrites: ``overwrite-mode=dynamic`` (the partitions
the DataFrame has rows in are replaced) and ``overwrite-filter`` (the rows a filter
matches are replaced).  Executors write the encrypted data files, the driver commits
them through the table API's row-level logic, with its conflict validation."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.transforms import IdentityTransform
from pyspark.sql import functions as F
from pyspark.sql import types as T

from icecrypt.kms.local import LocalKms
from icecrypt.table import EncryptedTable

pytestmark = pytest.mark.spark

MASTER = "master"  # the conftest keystore's key (kms, kms_options, keystore fixtures)
FORMAT = "icecrypt.iceberg"
SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False),
    pa.field("category", pa.string(), nullable=False),
    pa.field("qty", pa.int32()),
])


def _rows(ids: range, categories: tuple[str, ...], qty: int) -> pa.Table:
    ids = list(ids)
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "category": pa.array([categories[i % len(categories)] for i in range(len(ids))]),
        "qty": pa.array([qty] * len(ids), pa.int32()),
    }).cast(SCHEMA)


def _sorted(table: pa.Table) -> pa.Table:
    return table.select(SCHEMA.names).cast(SCHEMA).take(pc.sort_indices(table, [("id", "ascending")]))


def _table(location, kms, *, partitioned: bool = True) -> EncryptedTable:
    spec = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="category"))
    table = EncryptedTable.create(str(location), SCHEMA, kms=kms, table_key_id=MASTER,
                                  **({"partition_spec": spec} if partitioned else {}))
    table.append(_rows(range(0, 30), ("alpha", "beta", "gamma"), 1))
    table.append(_rows(range(100, 112), ("beta", "gamma"), 2))
    return table


def _files_on_disk(location) -> set[str]:
    return {p.name for p in (location / "data").rglob("*") if p.is_file()}


def _live_files(table: EncryptedTable) -> set[str]:
    return {os.path.basename(task.file.path) for task in table.scan().plan_files()}


def _save(icespark, rows: pa.Table, location, kms_options, **options) -> None:
    frame = icespark.createDataFrame(rows).repartition(2)
    frame.write.format(FORMAT).options(**kms_options).options(**options).mode("overwrite").save(str(location))


def test_dynamic_overwrite_replaces_exactly_the_touched_partitions(icespark, kms, kms_options, tmp_path):
    location = tmp_path / "events"
    before = _sorted(_table(location, kms).scan().to_arrow())
    new = _rows(range(500, 520), ("beta", "delta"), 9)  # beta is replaced, delta is new
    _save(icespark, new, location, kms_options, **{"overwrite-mode": "dynamic"})

    table = EncryptedTable.load(str(location), kms=kms)
    kept = before.filter(pc.invert(pc.is_in(before["category"], pa.array(["beta", "delta"]))))
    assert _sorted(table.scan().to_arrow()).equals(_sorted(pa.concat_tables([kept, new])))
    assert kept.num_rows == 26 and set(kept["category"].to_pylist()) == {"alpha", "gamma"}
    snapshot = table.snapshots()[-1]
    assert snapshot.summary["operation"] == "overwrite"
    assert snapshot.summary["deleted-data-files"] == "2"  # beta's file of each append
    assert table.verify().ok
    for task in table.scan().plan_files():  # the executors' files are encrypted (a fresh DEK each)
        with open(task.file.fs_path, "rb") as handle:
            assert handle.read(4) == b"PARE"

    # an unpartitioned table is replaced whole, as Java's ReplacePartitions does
    flat = tmp_path / "flat"
    _table(flat, kms, partitioned=False)
    _save(icespark, new, flat, kms_options, **{"overwrite-mode": "dynamic"})
    assert _sorted(EncryptedTable.load(str(flat), kms=kms).scan().to_arrow()).equals(_sorted(new))


def test_overwrite_filter_replaces_exactly_the_matching_rows(icespark, kms, kms_options, tmp_path):
    location = tmp_path / "events"
    table = _table(location, kms)
    table.update_properties().set("write.delete.mode", "merge-on-read").commit()  # partly matched files get DVs
    before = _sorted(table.scan().to_arrow())
    new = _rows(range(700, 705), ("alpha",), 7)
    _save(icespark, new, location, kms_options, **{"overwrite-filter": "id >= 10 and id < 20 or id = 105"})

    table = EncryptedTable.load(str(location), kms=kms)
    ids = before["id"]
    gone = pc.or_(pc.and_(pc.greater_equal(ids, 10), pc.less(ids, 20)), pc.equal(ids, 105))
    assert _sorted(table.scan().to_arrow()).equals(_sorted(pa.concat_tables([before.filter(pc.invert(gone)), new])))
    summary = table.snapshots()[-1].summary
    assert summary["operation"] == "overwrite" and int(summary.get("added-dvs", 0)) > 0
    assert table.verify().ok


def test_bad_overwrite_options_fail_clearly_and_commit_nothing(icespark, kms, kms_options, tmp_path):
    location = tmp_path / "events"
    table = _table(location, kms)
    head, files = table.current_snapshot_id, _files_on_disk(location)
    new = _rows(range(900, 910), ("alpha",), 3)

    def error(**options) -> str:
        with pytest.raises(Exception) as info:
            _save(icespark, new, location, kms_options, **options)
        return str(info.value)

    text = error(**{"overwrite-filter": "no_such_column > 3"})
    assert "overwrite-filter" in text and "no_such_column" in text
    text = error(**{"overwrite-filter": "id >>> 3"})
    assert "overwrite-filter" in text and "cannot parse row filter" in text
    assert "must be static or dynamic" in error(**{"overwrite-mode": "dynamc"})
    assert "overwrite-filter is empty" in error(**{"overwrite-filter": "  "})  # never a full overwrite
    assert "exclude each other" in error(**{"overwrite-mode": "dynamic", "overwrite-filter": "id > 3"})
    with pytest.raises(Exception, match="goes with mode"):
        (icespark.createDataFrame(new).write.format(FORMAT).options(**kms_options).option("overwrite-mode", "dynamic")
         .mode("append").save(str(location)))
    table = EncryptedTable.load(str(location), kms=kms)
    assert table.current_snapshot_id == head and len(table.snapshots()) == 2
    assert _files_on_disk(location) == files


@pytest.mark.parametrize("isolation", ["serializable", "snapshot"])
def test_concurrent_append_to_a_replaced_partition(icespark, kms, kms_options, keystore, tmp_path, isolation):
    """An append to a partition the job replaces lands while the executors write: under
    serializable isolation the commit is refused and the job's files are deleted (Java
    validates from the job's starting snapshot); under snapshot isolation the overwrite
    replaces that partition, the appended rows with it."""
    location = tmp_path / "events"
    _table(location, kms)
    flag = str(tmp_path / "appended")
    where = str(location)
    keystore_path = str(keystore)

    @F.udf(T.LongType())
    def append_once(value):
        try:  # the first task row to get here appends one beta row, from the executor
            os.close(os.open(flag, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return value
        concurrent = EncryptedTable.load(where, kms=LocalKms(keystore_path))
        concurrent.append(pa.table({"id": pa.array([9999], pa.int64()), "category": ["beta"],
                                    "qty": pa.array([0], pa.int32())}).cast(SCHEMA))
        return value

    new = _rows(range(500, 510), ("beta",), 9)
    frame = icespark.createDataFrame(new).repartition(2).withColumn("id", append_once("id"))
    writer = (frame.write.format(FORMAT).options(**kms_options).option("overwrite-mode", "dynamic")
              .option("isolation-level", isolation).mode("overwrite"))
    if isolation == "serializable":
        with pytest.raises(Exception) as info:
            writer.save(str(location))
        assert "CommitConflictError" in str(info.value) and "partitions it replaces" in str(info.value)
        table = EncryptedTable.load(str(location), kms=kms)
        assert [s.summary["operation"] for s in table.snapshots()] == ["append", "append", "append"]
        assert 9999 in table.scan().to_arrow()["id"].to_pylist()
        assert _files_on_disk(location) == _live_files(table)  # the job's data files are gone
    else:
        writer.save(str(location))
        table = EncryptedTable.load(str(location), kms=kms)
        got = table.scan(row_filter="category = 'beta'").to_arrow()
        assert _sorted(got).equals(_sorted(new))


def test_overwrite_filter_on_a_branch_leaves_main_alone(icespark, kms, kms_options, tmp_path):
    location = tmp_path / "events"
    before = _sorted(_table(location, kms).scan().to_arrow())
    new = _rows(range(800, 803), ("gamma",), 4)
    _save(icespark, new, location, kms_options, **{"overwrite-filter": "category = 'gamma'", "branch": "audit"})

    table = EncryptedTable.load(str(location), kms=kms)
    assert _sorted(table.scan().to_arrow()).equals(before)  # main is untouched
    kept = before.filter(pc.not_equal(before["category"], "gamma"))
    assert _sorted(table.scan(branch="audit").to_arrow()).equals(_sorted(pa.concat_tables([kept, new])))

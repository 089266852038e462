"""``icecrypt.spark.merge`` / ``upsert``: a MERGE whose join and data files run in Spark
executors and whose commit (one snapshot, validated from the snapshot the target was
read at) runs on the driver.  Results are compared with the table API's merge and upsert
on an identical table."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.transforms import IdentityTransform

import icecrypt.spark
from icecrypt.errors import CommitConflictError
from icecrypt.spark import _merge
from icecrypt.table import EncryptedTable
from test_spark_rowlevel import SCHEMA, _rows, _sorted

pytestmark = pytest.mark.spark

MASTER = "master"  # the conftest keystore's key
def _table(location, kms, mode: str) -> EncryptedTable:
    spec = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="category"))
    table = EncryptedTable.create(str(location), SCHEMA, kms=kms, table_key_id=MASTER, partition_spec=spec)
    table.update_properties().set("write.merge.mode", mode).commit()
    table.append(_rows(range(0, 30), ("alpha", "beta", "gamma"), 1))
    table.append(_rows(range(100, 112), ("beta", "gamma"), 2))
    return table


def _lineage(table: EncryptedTable) -> dict[int, tuple[int, int]]:
    rows = table.scan(columns=["id", "_row_id", "_last_updated_sequence_number"]).to_arrow().to_pylist()
    return {r["id"]: (r["_row_id"], r["_last_updated_sequence_number"]) for r in rows}


def _files_on_disk(location) -> set[str]:
    return {p.name for p in (location / "data").rglob("*") if p.is_file()}


def _source(icespark, rows: pa.Table):
    return icespark.createDataFrame(rows.to_pylist(), "id long, category string, qty int").repartition(2)


@pytest.mark.parametrize("mode", ["copy-on-write", "merge-on-read"])
def test_merge_and_upsert_equal_the_table_api(icespark, kms, kms_options, tmp_path, mode):
    spark_table, api_table = _table(tmp_path / "spark", kms, mode), _table(tmp_path / "api", kms, mode)
    location = str(tmp_path / "spark")
    # ids 5..14 match (their qty changes), 200..204 are new; 5 keeps its values (upsert leaves it)
    source = pa.concat_tables([_rows([5], ("gamma",), 1), _rows(range(6, 15), ("alpha", "beta"), 7),
                               _rows(range(200, 205), ("delta",), 8)])  # fmt: skip
    source = source.set_column(1, "category", pa.array(["gamma"] + [
        ("alpha", "beta", "gamma")[i % 3] for i in range(6, 15)] + ["delta"] * 5))  # keys' rows keep their category

    before = _lineage(spark_table)
    got = icecrypt.spark.merge(icespark, location, _source(icespark, source), ["id"], when_matched_update="all",
                               when_not_matched_insert="all", **kms_options)
    want = api_table.merge(source, ["id"], when_matched_update="all", when_not_matched_insert="all")
    # row lineage as the table API keeps it: moved and updated rows keep their row ids (an
    # updated row takes the merge's sequence number), new rows get new, unique ids
    spark_table.refresh()
    after, api_after = _lineage(spark_table), _lineage(api_table)
    assert {i: after[i] for i in before} == {i: api_after[i] for i in before}
    assert all(after[i][0] == before[i][0] for i in before)
    merged = spark_table.snapshots()[-1].sequence_number
    assert {i for i in before if after[i][1] == merged} == set(range(5, 15))
    new_ids = [after[i][0] for i in after if i not in before]
    assert len(new_ids) == 5 and len(set(new_ids)) == 5 and min(new_ids) > max(v[0] for v in before.values())
    assert (got.rows_updated, got.rows_deleted, got.rows_inserted) == (10, 0, 5)
    assert (got.rows_updated, got.rows_deleted, got.rows_inserted) == (
        want.rows_updated, want.rows_deleted, want.rows_inserted)
    spark_table.refresh()
    assert _sorted(spark_table.scan().to_arrow()).equals(_sorted(api_table.scan().to_arrow()))
    summary = spark_table.snapshots()[-1].summary
    assert summary["operation"] == "overwrite"
    assert (int(summary.get("added-dvs", 0)) > 0) == (mode == "merge-on-read")

    # upsert: only rows whose values differ are updated; 300 is new
    again = pa.concat_tables([_rows([5, 6], ("gamma",), 1), _rows([300], ("alpha",), 3)])
    again = again.set_column(1, "category", pa.array(["gamma", "alpha", "alpha"]))  # 5 unchanged, 6 changed
    got = icecrypt.spark.upsert(icespark, location, _source(icespark, again), ["id"], **kms_options)
    want = api_table.upsert(again, ["id"])
    assert (got.rows_updated, got.rows_inserted) == (want.rows_updated, want.rows_inserted) == (1, 1)

    # matched rows deleted
    gone = _rows([0, 1, 2, 999], ("alpha", "beta", "gamma"), 0)
    got = icecrypt.spark.merge(icespark, location, _source(icespark, gone), ["id"], when_matched_delete=True,
                               **kms_options)
    want = api_table.merge(gone, ["id"], when_matched_delete=True)
    assert (got.rows_deleted, got.rows_inserted) == (want.rows_deleted, want.rows_inserted) == (3, 0)
    spark_table.refresh()
    assert _sorted(spark_table.scan().to_arrow()).equals(_sorted(api_table.scan().to_arrow()))
    assert spark_table.verify().ok
    for task in spark_table.scan().plan_files():  # the executors' files are encrypted
        with open(task.file.fs_path, "rb") as handle:
            assert handle.read(4) == b"PARE"


@pytest.mark.parametrize("mode", ["copy-on-write", "merge-on-read"])
def test_update_equals_the_table_api(icespark, kms, kms_options, tmp_path, mode):
    from pyspark.sql import functions as F

    spark_table, api_table = _table(tmp_path / "spark", kms, mode), _table(tmp_path / "api", kms, mode)
    for table in (spark_table, api_table):
        table.update_properties().set("write.update.mode", mode).commit()
    location = str(tmp_path / "spark")
    before = _lineage(spark_table)
    snapshot = icecrypt.spark.update(icespark, location, {"qty": F.col("qty") * 10 + F.col("id")},
                                     "category = 'beta' and id < 105", **kms_options)
    api_table.update({"qty": pc.field("qty") * 10 + pc.field("id").cast(pa.int32())},
                     where="category = 'beta' and id < 105")
    spark_table.refresh()
    assert spark_table.current_snapshot_id == snapshot
    assert _sorted(spark_table.scan().to_arrow()).equals(_sorted(api_table.scan().to_arrow()))
    after = _lineage(spark_table)
    assert after == _lineage(api_table) and {i: v[0] for i, v in after.items()} == {i: v[0] for i, v in before.items()}
    assert (int(spark_table.snapshots()[-1].summary.get("added-dvs", 0)) > 0) == (mode == "merge-on-read")
    assert spark_table.verify().ok

    head, files = spark_table.current_snapshot_id, _files_on_disk(tmp_path / "spark")
    assert icecrypt.spark.update(icespark, location, {"qty": 1}, "id = 99999", **kms_options) is None
    with pytest.raises(ValueError, match="no column 'nope'"):
        icecrypt.spark.update(icespark, location, {"nope": 1}, "id = 1", **kms_options)
    with pytest.raises(ValueError, match="where="):
        icecrypt.spark.update(icespark, location, {"qty": 1}, "missing_column = 1", **kms_options)
    spark_table.refresh()
    assert spark_table.current_snapshot_id == head and _files_on_disk(tmp_path / "spark") == files


def test_a_commit_since_the_read_is_a_conflict(icespark, kms, kms_options, tmp_path, monkeypatch):
    location = tmp_path / "events"
    table = _table(location, kms, "copy-on-write")
    real = _merge.merge_files

    def concurrent_then_commit(*args, **kwargs):  # another writer lands a matching row meanwhile
        EncryptedTable.load(str(location), kms=kms).append(_rows([7], ("beta",), 42))
        files_before_commit.update(_files_on_disk(location))
        return real(*args, **kwargs)

    files_before_commit: set[str] = set()
    monkeypatch.setattr(_merge, "merge_files", concurrent_then_commit)
    source = _source(icespark, _rows(range(5, 10), ("alpha",), 9))
    with pytest.raises(CommitConflictError, match="serializable"):
        icecrypt.spark.merge(icespark, str(location), source, ["id"], when_matched_update="all",
                             when_not_matched_insert="all", **kms_options)
    table.refresh()
    assert table.snapshots()[-1].summary["operation"] == "append"  # the concurrent append is the head
    assert len(table.snapshots()) == 3
    written = files_before_commit - _files_on_disk(location)
    assert written, "the merge's executors wrote files before the commit"
    assert not (_files_on_disk(location) & written)
    assert _files_on_disk(location) == {tp.file.path.rsplit("/", 1)[1] for tp in table.scan().plan_files()}


def test_a_target_row_matched_twice_is_an_error(icespark, kms, kms_options, tmp_path):
    location = tmp_path / "events"
    table = _table(location, kms, "merge-on-read")
    head, files = table.current_snapshot_id, _files_on_disk(location)
    twice = _rows([3, 3, 500], ("alpha",), 5)
    with pytest.raises(ValueError, match="2 source rows match the same target row"):
        icecrypt.spark.merge(icespark, str(location), _source(icespark, twice), ["id"], when_matched_update="all",
                             when_not_matched_insert="all", **kms_options)
    with pytest.raises(ValueError, match="duplicate rows in the source"):
        icecrypt.spark.upsert(icespark, str(location), _source(icespark, twice), ["id"], **kms_options)
    table.refresh()
    assert table.current_snapshot_id == head and _files_on_disk(location) == files

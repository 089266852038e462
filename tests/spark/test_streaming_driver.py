"""The driver side of ``icecrypt.iceberg`` streaming, called directly (no Spark session:
fast, and in runs without the ``spark`` marker): the sink's exactly-once commit (replays
skipped and their files deleted, complete mode, per-branch epochs, Java's summary keys)
and the source's offsets and start points (offsets from the checkpoint are checked)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from icecrypt.spark._stream import EPOCH_ID_PROPERTY, QUERY_ID_PROPERTY  # noqa: E402
from streamcrash import KMS, new_table, rows  # noqa: E402


def test_sink_replayed_epoch_is_skipped_and_its_files_deleted(tmp_path):
    """The sink's commit on the driver, without Spark: an epoch committed once is never
    committed again (the replay's files are deleted), an older epoch neither."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from icecrypt.spark._stream import IcebergStreamWriter, StreamTaskDataFiles
    from icecrypt.table.ops.write import write_files

    sink = new_table(tmp_path / "sink")
    schema = StructType([StructField("id", LongType(), False), StructField("s", StringType(), True)])
    options = {**KMS, "path": str(tmp_path / "sink")}

    def epoch_files(ids, epoch, query="q-1"):
        files = write_files(sink, rows(ids), operation_id=f"op-{query}-{epoch}-{ids[0]}")
        return [StreamTaskDataFiles(files, query, epoch, f"op-{query}-{epoch}-{ids[0]}")]

    IcebergStreamWriter(options, schema, False).commit(epoch_files([1, 2], 0), 0)
    IcebergStreamWriter(options, schema, False).commit(epoch_files([3], 1), 1)
    for epoch in (1, 0):  # replays
        replay = epoch_files([100 + epoch], epoch)
        IcebergStreamWriter(options, schema, False).commit(replay, epoch)
        assert not Path(replay[0].data_files[0]["file_path"].removeprefix("file://")).exists()
    IcebergStreamWriter(options, schema, False).commit(epoch_files([4], 1, query="q-2"), 1)  # another query
    sink.refresh()
    assert sorted(sink.scan().to_arrow()["id"].to_pylist()) == [1, 2, 3, 4]
    assert [(s.summary[QUERY_ID_PROPERTY], s.summary[EPOCH_ID_PROPERTY]) for s in sink.snapshots()] == \
        [("q-1", "0"), ("q-1", "1"), ("q-2", "1")]


def test_sink_complete_mode_overwrites_once_per_epoch(tmp_path):
    """Complete mode (Spark passes overwrite=True): each epoch replaces the rows, with the
    epoch summary; a replay of a committed epoch changes nothing."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from icecrypt.spark._stream import IcebergStreamWriter, StreamTaskDataFiles
    from icecrypt.table.ops.write import write_files

    sink = new_table(tmp_path / "sink")
    sink.append(rows([0]))
    schema = StructType([StructField("id", LongType(), False), StructField("s", StringType(), True)])
    options = {**KMS, "path": str(tmp_path / "sink")}
    for epoch, ids in ((0, [1, 2]), (1, [3]), (1, [99])):
        operation_id = f"op-{epoch}-{ids[0]}"
        files = write_files(sink, rows(ids), operation_id=operation_id)
        IcebergStreamWriter(options, schema, True).commit([StreamTaskDataFiles(files, "q", epoch, operation_id)], epoch)
    sink.refresh()
    assert sink.scan().to_arrow()["id"].to_pylist() == [3]
    assert [(s.operation, s.summary.get(EPOCH_ID_PROPERTY)) for s in sink.snapshots()] == \
        [("append", None), ("overwrite", "0"), ("overwrite", "1")]


def _reader(path: Path, **options):
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from icecrypt.spark._stream import IcebergStreamReader

    schema = StructType([StructField("id", LongType(), False), StructField("s", StringType(), True)])
    return IcebergStreamReader({**KMS, "path": str(path), **options}, schema)


def test_source_offsets_from_storage_are_checked(tmp_path):
    """Offsets come back from the checkpoint: a malformed one, one naming a snapshot the
    table does not have, and one the branch no longer descends from are clear errors,
    never a silent skip or re-read."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxFiles

    table = new_table(tmp_path / "t")
    a = table.append(rows([1]))
    b = table.append(rows([2]))
    reader = _reader(tmp_path / "t")
    start = reader.initialOffset()
    assert start == {"version": 1, "snapshot_id": a, "position": 0, "scan_all_files": True}
    first = reader.latestOffset(start, ReadMaxFiles(1))
    assert first == {"version": 1, "snapshot_id": a, "position": 1, "scan_all_files": True}
    end = reader.latestOffset(first, ReadAllAvailable())
    assert end == {"version": 1, "snapshot_id": b, "position": 1, "scan_all_files": False}
    assert [p.task.file.record_count for p in reader.partitions(first, end)] == [1]
    for bad in ({"snapshot_id": a}, {**start, "position": -1}, {**start, "version": 2}, "nonsense",
                {**start, "snapshot_id": "1"}):
        with pytest.raises(ValueError, match="is not an offset of this source"):
            reader.latestOffset(bad, ReadAllAvailable())
    with pytest.raises(LookupError, match="no longer has snapshot 12345"):
        reader.partitions({**start, "snapshot_id": 12345}, end)
    table.manage_snapshots().rollback_to_snapshot(a).commit()
    c = table.append(rows([3]))
    with pytest.raises(ValueError, match=f"snapshot {b}, where the stream stands, is not an ancestor of snapshot {c}"):
        reader.latestOffset(end, ReadAllAvailable())


def test_source_start_points_around_an_overwrite(tmp_path):
    """Starting after an overwrite streams what follows it; starting at it (by its
    timestamp) reaches it and fails unless overwrites are skipped."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    table = new_table(tmp_path / "t")
    table.append(rows([1]))
    table.overwrite(rows([5]))
    table.append(rows([6]))
    overwrite = table.snapshots()[1]
    after = _reader(tmp_path / "t", **{"start-snapshot-id": str(overwrite.snapshot_id)})
    start = after.initialOffset()
    end = after.latestOffset(start, ReadAllAvailable())
    assert [p.task.file.record_count for p in after.partitions(start, end)] == [1]
    moment = {"stream-from-timestamp": str(overwrite.timestamp_ms)}
    at = _reader(tmp_path / "t", **moment)
    with pytest.raises(ValueError, match=f"snapshot {overwrite.snapshot_id} is an overwrite"):
        at.latestOffset(at.initialOffset(), ReadAllAvailable())
    skipping = _reader(tmp_path / "t", **moment, **{"streaming-skip-overwrite-snapshots": "true"})
    start = skipping.initialOffset()
    end = skipping.latestOffset(start, ReadAllAvailable())
    assert len(skipping.partitions(start, end)) == 1


def test_sink_epochs_are_per_branch(tmp_path):
    """With option branch, the epoch check looks at that branch's history (Java's keys,
    literally): an epoch committed to main does not count for a query writing to a branch."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from icecrypt.spark._stream import IcebergStreamWriter, StreamTaskDataFiles
    from icecrypt.table.ops.write import write_files

    sink = new_table(tmp_path / "sink")
    schema = StructType([StructField("id", LongType(), False), StructField("s", StringType(), True)])

    def commit(ids, epoch, **branch):
        operation_id = f"op-{epoch}-{ids[0]}"
        files = write_files(sink, rows(ids), operation_id=operation_id)
        writer = IcebergStreamWriter({**KMS, "path": str(tmp_path / "sink"), **branch}, schema, False)
        writer.commit([StreamTaskDataFiles(files, "q", epoch, operation_id)], epoch)

    commit([1], 0)
    commit([2], 0, branch="audit")  # main's epoch 0 is not the branch's
    commit([3], 0, branch="audit")  # replay on the branch: skipped
    sink.refresh()
    assert sorted(sink.scan(branch="audit").to_arrow()["id"].to_pylist()) == [1, 2]
    assert sink.scan().to_arrow()["id"].to_pylist() == [1]
    assert [(s.summary["spark.sql.streaming.queryId"], s.summary["spark.sql.streaming.epochId"])
            for s in sink.snapshots()] == [("q", "0"), ("q", "0")]


def test_sink_refuses_messages_of_another_query_or_epoch(tmp_path):
    """Task messages that disagree on the query or name another epoch than the commit's:
    nothing is committed and their files are deleted."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from icecrypt.spark._stream import IcebergStreamWriter, StreamTaskDataFiles
    from icecrypt.table.ops.write import write_files

    sink = new_table(tmp_path / "sink")
    schema = StructType([StructField("id", LongType(), False), StructField("s", StringType(), True)])
    writer = IcebergStreamWriter({**KMS, "path": str(tmp_path / "sink")}, schema, False)
    for query_ids, epochs in ((("q", "other"), (0, 0)), (("q", "q"), (0, 1)), ((None, None), (0, 0))):
        messages = []
        for n, (query_id, epoch) in enumerate(zip(query_ids, epochs)):
            files = write_files(sink, rows([n]), operation_id=f"op-{n}")
            messages.append(StreamTaskDataFiles(files, query_id, epoch, f"op-{n}"))
        with pytest.raises(ValueError, match="nothing was committed"):
            writer.commit(messages, 0)
        for message in messages:
            assert not Path(message.data_files[0]["file_path"].removeprefix("file://")).exists()
    assert sink.refresh().snapshots() == []


def test_commit_summary_cannot_take_icebergs_own_names(tmp_path):
    """append_files/overwrite_files summary=: a caller's name that Iceberg's own summary
    sets (operation, added-*, total-*, ...) is refused before anything is committed, and
    the data files are deleted."""
    from icecrypt.table.ops.write import append_files, overwrite_files, write_files

    table = new_table(tmp_path / "t")
    for commit, name in ((append_files, "operation"), (append_files, "added-records"),
                         (overwrite_files, "total-records"), (append_files, "wap.id")):
        files = write_files(table, rows([1]))
        with pytest.raises(ValueError, match=f"summary property {name!r}"):
            commit(table, files, summary={name: "1"})
        assert not Path(files[0]["file_path"].removeprefix("file://")).exists()
    assert table.refresh().snapshots() == []

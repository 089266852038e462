"""Structured Streaming on ``icecrypt.iceberg``: the source reads exactly the appended rows
of new snapshots, in order, across restarts and under rate limits; non-append snapshots
fail or are skipped per option; the sink commits every epoch exactly once, also when the
driver is killed (SIGKILL) between writing and committing an epoch or between the table
commit and Spark's commit log; a tampered data file fails the stream naming the file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

from icecrypt.kms.memory import MemoryKms
from icecrypt.spark._iceberg import IcebergDataSource
from icecrypt.spark._stream import EPOCH_ID_PROPERTY, QUERY_ID_PROPERTY
from icecrypt.table import EncryptedTable

pytestmark = pytest.mark.spark

KMS = {"encryption.kms-type": "memory", "encryption.kms.memory.iceberg-test-keys": "true"}
FORMAT = "icecrypt.iceberg"
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("s", pa.string())])
HERE = Path(__file__).resolve().parent


def rows(ids) -> pa.Table:
    ids = list(ids)
    return pa.table({"id": pa.array(ids, pa.int64()), "s": [f"row-{i}" for i in ids]}, schema=SCHEMA)


def new_table(path: Path) -> EncryptedTable:
    return EncryptedTable.create(str(path), SCHEMA, kms=MemoryKms.with_iceberg_test_keys(), table_key_id="keyA")


@pytest.fixture(scope="module")
def ispark(spark):
    spark.dataSource.register(IcebergDataSource)
    return spark


def run_batches(spark, table, checkpoint, **options) -> list[list[int]]:
    """One availableNow run of a stream of ``table`` from ``checkpoint``: the sorted ids of
    each micro-batch that had rows, in batch order."""
    batches: dict[int, list[int]] = {}

    def collect(df, batch_id):
        batches[batch_id] = sorted(r.id for r in df.collect())

    stream = spark.readStream.format(FORMAT).options(**KMS, **options).load(table.metadata_location.rsplit("/metadata/", 1)[0])
    query = (stream.writeStream.foreachBatch(collect).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    return [batches[b] for b in sorted(batches) if batches[b]]


def test_source_appends_in_order_limits_and_restart(ispark, tmp_path):
    table = new_table(tmp_path / "src")
    for ids in ([0, 1, 2], [3, 4], [5]):
        table.append(rows(ids))
    checkpoint = tmp_path / "cp"
    # one file per batch: each snapshot's rows are one micro-batch, oldest first
    got = run_batches(ispark, table, checkpoint, **{"streaming-max-files-per-micro-batch": "1"})
    assert got == [[0, 1, 2], [3, 4], [5]]
    for ids in ([6, 7], [8], [9, 10, 11]):
        table.append(rows(ids))
    # restarted from the checkpoint: only what came after, nothing skipped or repeated;
    # rows limit 3: [6,7] + [8] fit, [9,10,11] would exceed it
    got = run_batches(ispark, table, checkpoint, **{"streaming-max-rows-per-micro-batch": "3"})
    assert got == [[6, 7, 8], [9, 10, 11]]
    # start after a snapshot (stream-from-timestamp: test_source_start_points_around_an_overwrite);
    # a file larger than the rows limit still goes (one file per batch at least)
    snaps = table.snapshots()
    got = run_batches(ispark, table, tmp_path / "cp3", **{"start-snapshot-id": str(snaps[3].snapshot_id),
                                                          "streaming-max-rows-per-micro-batch": "1"})
    assert got == [[8], [9, 10, 11]]


def test_source_process_all_available_sees_new_snapshots(ispark, tmp_path):
    table = new_table(tmp_path / "src")
    table.append(rows([1, 2]))
    seen: list[int] = []
    stream = ispark.readStream.format(FORMAT).options(**KMS).load(str(tmp_path / "src"))
    query = (stream.writeStream.foreachBatch(lambda df, _: seen.extend(r.id for r in df.collect()))
             .option("checkpointLocation", str(tmp_path / "cp")).trigger(processingTime="200 milliseconds").start())
    try:
        query.processAllAvailable()
        table.append(rows([3]))
        table.append(rows([4, 5]))
        query.processAllAvailable()
    finally:
        query.stop()
    assert sorted(seen) == [1, 2, 3, 4, 5] and len(seen) == 5


def test_source_non_append_snapshots_fail_or_are_skipped(ispark, tmp_path):
    table = new_table(tmp_path / "src")
    table.append(rows([1, 2, 3]))
    table.delete("id = 2")
    table.overwrite(rows([7, 8]))
    table.append(rows([9]))
    with pytest.raises(Exception, match=r"is an delete.*streaming-skip-delete-snapshots=true"):
        run_batches(ispark, table, tmp_path / "cp1")
    with pytest.raises(Exception, match=r"is an overwrite.*streaming-skip-overwrite-snapshots=true"):
        run_batches(ispark, table, tmp_path / "cp2", **{"streaming-skip-delete-snapshots": "true"})
    got = run_batches(ispark, table, tmp_path / "cp3", **{"streaming-skip-delete-snapshots": "true",
                                                          "streaming-skip-overwrite-snapshots": "true"})
    assert sorted(sum(got, [])) == [1, 2, 3, 9]


def test_source_tampered_data_file_fails_naming_it(ispark, tmp_path):
    table = new_table(tmp_path / "src")
    table.append(rows(range(50)))
    data_file = next((tmp_path / "src" / "data").rglob("*.parquet"))
    raw = bytearray(data_file.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    data_file.write_bytes(bytes(raw))
    with pytest.raises(Exception) as failure:
        run_batches(ispark, table, tmp_path / "cp")
    message = str(failure.value)
    assert data_file.name in message
    assert "authenticat" in message.lower() or "tag" in message.lower()


def _sink_snapshots(sink: EncryptedTable) -> list[tuple[str, int, int]]:
    sink.refresh()
    return [(s.summary.get(QUERY_ID_PROPERTY), int(s.summary.get(EPOCH_ID_PROPERTY)), s.snapshot_id)
            for s in sink.snapshots()]


def _kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def _run_until(source, sink, checkpoint, flags, pause: str, timeout: float = 240) -> list[str]:
    """Start the crash driver with ``pause``, wait until it stands there, SIGKILL its whole
    process group (driver, JVM, Python workers); the paused epoch's data files."""
    env = dict(os.environ, ICECRYPT_TEST_PAUSE=pause, ICECRYPT_TEST_FLAGS=str(flags),
               PYTHONPATH=os.pathsep.join([str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    flag = flags / f"{pause.replace(':', '-')}.json"
    proc = subprocess.Popen([sys.executable, str(HERE / "streamcrash.py"), source, sink, str(checkpoint)], env=env,
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + timeout
        while not flag.exists():
            if proc.poll() is not None:
                raise AssertionError(f"the driver ended ({proc.returncode}) before {pause}: "
                                     f"{proc.stderr.read().decode(errors='replace')[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"the driver did not reach {pause}")
            time.sleep(0.2)
    finally:
        _kill_group(proc)
        proc.stderr.close()
    return json.loads(flag.read_text())


def test_sink_killed_driver_commits_each_epoch_exactly_once(ispark, tmp_path):
    source = new_table(tmp_path / "src")
    for start in range(0, 40, 10):  # four snapshots: one epoch each
        source.append(rows(range(start, start + 10)))
    sink_path = tmp_path / "sink"
    sink = new_table(sink_path)
    checkpoint, flags = tmp_path / "cp", tmp_path / "flags"
    flags.mkdir()
    # 1: epoch 0 lands; epoch 1 lands in the table, the driver dies before Spark's commit log
    _run_until(str(tmp_path / "src"), str(sink_path), checkpoint, flags, "after:1")
    first = _sink_snapshots(sink)
    assert [e for _, e, _ in first] == [0, 1]
    query_id = first[0][0]
    # 2: restarted: epoch 1 is replayed and skipped; epoch 2's files are written, the
    # driver dies before they are committed
    orphans = _run_until(str(tmp_path / "src"), str(sink_path), checkpoint, flags, "before:2")
    assert orphans and [e for _, e, _ in _sink_snapshots(sink)] == [0, 1]
    # 3: restarted in this session: epochs 2 and 3 commit once each
    stream = ispark.readStream.format(FORMAT).options(**KMS).option("streaming-max-files-per-micro-batch", "1") \
        .load(str(tmp_path / "src"))
    query = (stream.writeStream.format(FORMAT).options(**KMS).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start(str(sink_path)))
    query.awaitTermination()
    final = _sink_snapshots(sink)
    assert [e for _, e, _ in final] == [0, 1, 2, 3]
    assert {q for q, _, _ in final} == {query_id}
    got = sink.scan().to_arrow()
    assert sorted(got["id"].to_pylist()) == list(range(40))  # every row, once
    # the replay of epoch 1 left no file behind; only the killed epoch 2's own writes are
    # unreferenced (a crash's orphans, for remove_orphan_files)
    live = {f.file.path.rsplit("/", 1)[-1] for f in sink.scan().plan_files()}
    on_disk = {p.name for p in (sink_path / "data").rglob("*") if p.is_file()}
    assert on_disk - live <= {p.rsplit("/", 1)[-1] for p in orphans}


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

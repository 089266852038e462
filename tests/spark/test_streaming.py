"""Structured Streaming on ``icecrypt.iceberg`` in a Spark session (the driver-side logic alone:
test_streaming_driver.py): the source reads exactly the appended rows
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

import pytest

from icecrypt.spark._iceberg_source import IcebergDataSource
from icecrypt.spark._stream import EPOCH_ID_PROPERTY, QUERY_ID_PROPERTY
from icecrypt.table import EncryptedTable
from streamcrash import KMS, new_table, rows

pytestmark = pytest.mark.spark

FORMAT = "icecrypt.iceberg"
HERE = Path(__file__).resolve().parent


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


def _run_until(source, sink, checkpoint, flags, pause: str, timeout: float = 420) -> list[str]:
    """Start the crash driver with ``pause``, wait until it stands there, SIGKILL its whole
    process group (driver, JVM, Python workers); the paused epoch's data files."""
    # TMPDIR: the driver's linked SPARK_HOME (spark_fixtures.compiled_spark_home), which the
    # SIGKILL below leaves behind, goes with the test's own directory
    tmp = flags.parent / "tmp"
    tmp.mkdir(exist_ok=True)
    env = dict(os.environ, ICECRYPT_TEST_PAUSE=pause, ICECRYPT_TEST_FLAGS=str(flags), TMPDIR=str(tmp),
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

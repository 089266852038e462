"""The streaming sink and source against someone who can write the table's storage
(issue 30).

Sink: it decides that an epoch is already in the table from snapshot summaries
(``spark.sql.streaming.queryId`` / ``epochId``), which live in ``metadata.json``.  A forged
summary with the query's id and epoch 10**15 made every later epoch "already committed":
its files deleted, nothing committed, success reported -- rows silently lost.  Now only a
snapshot of exactly the epoch being committed counts, it must show data files it added in
its manifests, and a later epoch without this one, an epoch that is not an epoch id or
epochs going backwards fail the commit loudly (SnapshotIntegrityError); a query restarted
once the history is repaired commits every row once.  The driver-side tests call the
sink's commit as Spark does; the ``spark``-marked ones run a real query.

Source: the operation label of each snapshot decides what a stream reads; an append
relabelled ``replace`` was passed over, its rows never streamed.  Each snapshot's label is
now checked against its manifests before the stream acts on it.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from icecrypt import SnapshotIntegrityError  # noqa: E402
from icecrypt.spark._stream import EPOCH_ID_PROPERTY, QUERY_ID_PROPERTY  # noqa: E402
from icecrypt.table import EncryptedTable  # noqa: E402
from forgery import legacy, without_authenticator  # noqa: E402
from streamcrash import KMS, SCHEMA, new_table, rows  # noqa: E402

QUERY = "5a1d5e4e-0000-4000-8000-000000000001"


def _forge(root: Path, change) -> None:
    """A next version of the table written straight into storage, the hint moved to it
    (without icecrypt's authenticator, which would refuse it: the tables here are
    :func:`forgery.legacy` ones, so that the checks behind authentication are reached)."""
    current = max((root / "metadata").glob("v*.metadata.json"), key=lambda p: int(p.name[1:].split(".")[0]))
    doc = without_authenticator(json.loads(current.read_text()))
    change(doc)
    version = int(current.name[1:].split(".")[0]) + 1
    (root / "metadata" / f"v{version}.metadata.json").write_text(json.dumps(doc))
    (root / "metadata" / "version-hint.text").write_text(str(version))


def _snapshot(doc, snapshot_id):
    return next(s for s in doc["snapshots"] if s["snapshot-id"] == snapshot_id)


def _head(doc):
    return _snapshot(doc, doc["refs"]["main"]["snapshot-id"])


class _Sink:
    """The sink's driver side, committing epochs of one query as Spark calls it."""

    def __init__(self, path: Path, encrypted: bool = True, overwrite: bool = False):
        from pyspark.sql.types import LongType, StringType, StructField, StructType

        self.path = path
        self.table = legacy(new_table(path)) if encrypted else EncryptedTable.create(str(path), SCHEMA, kms=None,
                                                                              table_key_id=None)
        self.options = {**KMS, "path": str(path)} if encrypted else {"path": str(path), "encryption": "none"}
        self.schema = StructType([StructField("id", LongType(), False), StructField("s", StringType(), True)])
        self.overwrite = overwrite
        self.written: list[str] = []

    def commit(self, epoch: int, ids) -> None:
        from icecrypt.spark._stream import IcebergStreamWriter, StreamTaskDataFiles
        from icecrypt.table.ops.write import write_files

        operation_id = str(uuid.uuid4())  # one per writer, as the sink's
        files = write_files(self.table, rows(ids), operation_id=operation_id)
        self.written = [f["file_path"] for f in files]
        writer = IcebergStreamWriter(self.options, self.schema, self.overwrite)
        writer.commit([StreamTaskDataFiles(files, QUERY, epoch, operation_id)], epoch)

    def written_exist(self) -> bool:
        return all(Path(p.removeprefix("file://")).exists() for p in self.written)

    def ids(self) -> list[int]:
        return sorted(self.table.refresh().scan().to_arrow()["id"].to_pylist())


@pytest.mark.parametrize("encrypted", [True, False], ids=["encrypted", "plaintext"])
def test_a_forged_later_epoch_never_drops_an_epoch(tmp_path, encrypted):
    """Rows 1..7, one epoch each; after epoch 2 the head's summary is forged to epoch
    10**15.  Every later epoch fails loudly naming the forged snapshot (before: each was
    skipped, its files deleted, success reported, rows 4..7 lost); once the summary is
    repaired, the query's replays commit every row once."""
    sink = _Sink(tmp_path / "sink", encrypted)
    for epoch in range(3):
        sink.commit(epoch, [epoch + 1])
    head_id = sink.table.refresh().current_snapshot_id
    _forge(sink.path, lambda doc: _head(doc)["summary"].update({EPOCH_ID_PROPERTY: str(10**15)}))
    for epoch in range(3, 7):
        with pytest.raises(SnapshotIntegrityError, match=rf"snapshot {head_id} records epoch {10**15} of streaming "
                           rf"query {QUERY}, later than epoch {epoch} that Spark commits now") as caught:
            sink.commit(epoch, [epoch + 1])
        assert caught.value.snapshot_id == head_id and caught.value.table == str(sink.path)
        assert not sink.written_exist()  # the failed commit's files are gone; nothing committed
        assert sink.ids() == [1, 2, 3]
    # the operator repairs the summary; Spark replays the epoch it did not record
    _forge(sink.path, lambda doc: _head(doc)["summary"].update({EPOCH_ID_PROPERTY: "2"}))
    for epoch in range(3, 7):
        sink.commit(epoch, [epoch + 1])
    sink.commit(6, [7])  # a replay of the last epoch: skipped, its files deleted
    assert not sink.written_exist()
    assert sink.ids() == [1, 2, 3, 4, 5, 6, 7]


@pytest.mark.parametrize("value", ["abc", "-1", "1e3", " 3", "03", "", "9223372036854775808", "٣"])
def test_an_epoch_summary_that_is_no_epoch_id_is_refused(tmp_path, value):
    """Before, a summary epoch that did not parse was passed over ("not one of ours")."""
    sink = _Sink(tmp_path / "sink")
    sink.commit(0, [1])
    sink.commit(1, [2])
    first = sink.table.refresh().snapshots()[0].snapshot_id
    _forge(sink.path, lambda doc: _snapshot(doc, first)["summary"].update({EPOCH_ID_PROPERTY: value}))
    with pytest.raises(SnapshotIntegrityError) as caught:
        sink.commit(2, [3])
    assert f"snapshot {first} records streaming epoch {value!r}" in str(caught.value)
    assert not sink.written_exist() and sink.ids() == [1, 2]


def test_epochs_going_backwards_are_refused(tmp_path):
    sink = _Sink(tmp_path / "sink")
    for epoch in range(3):
        sink.commit(epoch, [epoch + 1])
    first = sink.table.refresh().snapshots()[0].snapshot_id
    _forge(sink.path, lambda doc: _snapshot(doc, first)["summary"].update({EPOCH_ID_PROPERTY: "5"}))
    with pytest.raises(SnapshotIntegrityError, match=rf"epochs go backwards along branch 'main': snapshot {first} "
                       r"records epoch 5"):
        sink.commit(3, [4])
    assert sink.ids() == [1, 2, 3]


def test_the_epoch_copied_onto_a_snapshot_that_added_no_rows(tmp_path):
    """The next epoch's summary put on a delete made by someone else (a deletion vector:
    no data file added): the epoch is not skipped as committed (before: it was)."""
    sink = _Sink(tmp_path / "sink")
    sink.commit(0, [1])
    sink.commit(1, [2])
    sink.table.refresh().delete("id = 1")
    deleted = sink.table.current_snapshot_id
    _forge(sink.path, lambda doc: _head(doc)["summary"].update({QUERY_ID_PROPERTY: QUERY, EPOCH_ID_PROPERTY: "2"}))
    with pytest.raises(SnapshotIntegrityError, match=rf"snapshot {deleted} records epoch 2 of streaming query {QUERY}, "
                       r"but its manifests show no data file added by it"):
        sink.commit(2, [3])
    assert sink.ids() == [2]


def test_the_epoch_copied_onto_an_overwrite_relabelled_append(tmp_path):
    """The next epoch's summary and the label ``append`` put on someone else's overwrite
    (it added data files, so the first check passes): its manifests show data files
    removed, which no append does: refused."""
    sink = _Sink(tmp_path / "sink")
    sink.commit(0, [1])
    sink.table.refresh().overwrite(rows([50]))
    overwrite = sink.table.current_snapshot_id
    _forge(sink.path, lambda doc: _head(doc)["summary"].update(
        {QUERY_ID_PROPERTY: QUERY, EPOCH_ID_PROPERTY: "1", "operation": "append"}))
    with pytest.raises(SnapshotIntegrityError, match=rf"snapshot {overwrite} is labelled operation 'append'"):
        sink.commit(1, [2])
    assert sink.ids() == [50]


def test_authentic_replays_are_still_skipped_in_both_modes(tmp_path):
    """What the checks must not break: Spark replaying the epoch it did not record, in
    append and complete mode (an overwrite that added nothing: an empty result)."""
    sink = _Sink(tmp_path / "a")
    sink.commit(0, [1])
    sink.commit(1, [2])
    sink.commit(1, [2])
    assert not sink.written_exist() and sink.ids() == [1, 2]
    complete = _Sink(tmp_path / "c", overwrite=True)
    complete.commit(0, [1, 2])
    complete.commit(0, [1, 2])
    assert not complete.written_exist() and complete.ids() == [1, 2]


@pytest.mark.spark
def test_a_running_query_fails_loudly_and_loses_no_row(spark, tmp_path):
    """A real query (availableNow, one source snapshot per epoch): rows 1..3 reach the
    sink; the sink's head summary is forged to epoch 10**15; the query restarted from its
    checkpoint with rows 4..7 waiting fails naming the forged snapshot, committing
    nothing; restarted after the repair, it commits rows 4..7, each once."""
    from icecrypt.spark._iceberg_source import IcebergDataSource

    spark.dataSource.register(IcebergDataSource)
    source, sink_path, checkpoint = legacy(new_table(tmp_path / "src")), tmp_path / "sink", tmp_path / "cp"
    sink = legacy(new_table(sink_path))

    def run() -> None:
        stream = (spark.readStream.format("icecrypt.iceberg").options(**KMS)
                  .option("streaming-max-files-per-micro-batch", "1").load(str(tmp_path / "src")))
        query = (stream.writeStream.format("icecrypt.iceberg").options(**KMS)
                 .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start(str(sink_path)))
        query.awaitTermination()

    for i in (1, 2, 3):
        source.append(rows([i]))
    run()
    assert sorted(sink.refresh().scan().to_arrow()["id"].to_pylist()) == [1, 2, 3]
    head = sink.current_snapshot_id
    _forge(sink_path, lambda doc: _head(doc)["summary"].update({EPOCH_ID_PROPERTY: str(10**15)}))
    for i in range(4, 8):
        source.append(rows([i]))
    with pytest.raises(Exception) as caught:
        run()
    assert f"snapshot {head} records epoch {10**15}" in str(caught.value)
    assert sorted(sink.refresh().scan().to_arrow()["id"].to_pylist()) == [1, 2, 3]
    _forge(sink_path, lambda doc: _head(doc)["summary"].update({EPOCH_ID_PROPERTY: "2"}))
    run()
    assert sorted(sink.refresh().scan().to_arrow()["id"].to_pylist()) == list(range(1, 8))


# --- the source: the operation label decides what a stream reads -------------------------------


def _reader(path: Path, options: dict[str, str]):
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from icecrypt.spark._stream import IcebergStreamReader

    schema = StructType([StructField("id", LongType(), False), StructField("s", StringType(), True)])
    return IcebergStreamReader({**options, "path": str(path)}, schema)


@pytest.mark.parametrize("encrypted", [True, False], ids=["encrypted", "plaintext"])
@pytest.mark.parametrize("label", ["replace", "delete", "overwrite"])
def test_the_source_never_passes_over_a_relabelled_append(tmp_path, encrypted, label):
    """An append relabelled ``replace`` was passed over by the stream (its rows never
    streamed); ``delete`` / ``overwrite`` with the skip options likewise.  Its manifests
    show rows added and none removed: the stream fails naming the snapshot -- except as
    ``overwrite``, which may add rows only (Java's producers label such commits so): that
    label stops the stream unless the skip option says to pass over overwrites."""
    path = tmp_path / "src"
    table = legacy(new_table(path)) if encrypted else EncryptedTable.create(str(path), SCHEMA, kms=None, table_key_id=None)
    options = {**KMS} if encrypted else {"encryption": "none"}
    first = table.append(rows([1]))
    relabelled = table.append(rows([2]))
    table.append(rows([3]))
    _forge(path, lambda doc: _snapshot(doc, relabelled)["summary"].update({"operation": label}))
    skip = {"streaming-skip-delete-snapshots": "true", "streaming-skip-overwrite-snapshots": "true"}
    reader = _reader(path, {**options, **skip, "start-snapshot-id": str(first)})
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    start = reader.initialOffset()
    if label == "overwrite":  # not detectable from the manifests: skipped only when asked to
        end = reader.latestOffset(start, ReadAllAvailable())
        assert [p.task.file.record_count for p in reader.partitions(start, end)] == [1]
        strict = _reader(path, {**options, "start-snapshot-id": str(first)})
        with pytest.raises(ValueError, match=rf"snapshot {relabelled} is an overwrite"):
            strict.latestOffset(strict.initialOffset(), ReadAllAvailable())
        return
    with pytest.raises(SnapshotIntegrityError, match=rf"icecrypt.iceberg: stream of table {path}: snapshot "
                       rf"{relabelled} is labelled operation '{label}', but its manifests show data files \+1/-0"):
        reader.latestOffset(start, ReadAllAvailable())


@pytest.mark.spark
def test_a_running_source_fails_on_a_relabelled_append(spark, tmp_path):
    from icecrypt.spark._iceberg_source import IcebergDataSource

    spark.dataSource.register(IcebergDataSource)
    table = legacy(new_table(tmp_path / "src"))
    table.append(rows([1]))
    relabelled = table.append(rows([2]))
    table.append(rows([3]))
    _forge(tmp_path / "src", lambda doc: _snapshot(doc, relabelled)["summary"].update({"operation": "replace"}))
    seen: list[int] = []
    stream = spark.readStream.format("icecrypt.iceberg").options(**KMS).load(str(tmp_path / "src"))
    query = (stream.writeStream.foreachBatch(lambda df, _: seen.extend(r.id for r in df.collect()))
             .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start())
    with pytest.raises(Exception) as caught:
        query.awaitTermination()
    assert f"snapshot {relabelled} is labelled operation 'replace'" in str(caught.value)
    assert 2 not in seen and 3 not in seen

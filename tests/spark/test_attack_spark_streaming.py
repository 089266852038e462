"""The streaming source and sink against someone who can write the table's storage
(issue 30).

Source: the operation label of each snapshot (``metadata.json``) decides what a stream
reads; an append relabelled ``replace`` was passed over, its rows never streamed.  Each
snapshot's label is now checked against its manifests before the stream acts on it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from icecrypt import SnapshotIntegrityError  # noqa: E402
from icecrypt.table import EncryptedTable  # noqa: E402
from streamcrash import KMS, SCHEMA, new_table, rows  # noqa: E402


def _forge(root: Path, change) -> None:
    """A next version of the table written straight into storage, the hint moved to it."""
    current = max((root / "metadata").glob("v*.metadata.json"), key=lambda p: int(p.name[1:].split(".")[0]))
    doc = json.loads(current.read_text())
    change(doc)
    version = int(current.name[1:].split(".")[0]) + 1
    (root / "metadata" / f"v{version}.metadata.json").write_text(json.dumps(doc))
    (root / "metadata" / "version-hint.text").write_text(str(version))


def _snapshot(doc, snapshot_id):
    return next(s for s in doc["snapshots"] if s["snapshot-id"] == snapshot_id)


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
    table = new_table(path) if encrypted else EncryptedTable.create(str(path), SCHEMA, kms=None, table_key_id=None)
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
    from icecrypt.spark._iceberg import IcebergDataSource

    spark.dataSource.register(IcebergDataSource)
    table = new_table(tmp_path / "src")
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

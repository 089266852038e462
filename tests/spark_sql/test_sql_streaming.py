"""Structured Streaming through the SQL catalog.

Sink (``df.writeStream.toTable("cat.db.t")``): each micro-batch is committed once (Spark's
Parquet writer, a fresh key per file; the snapshot summary records the query and epoch as
icecrypt's Python sink does), checked against a plain-Python model and
``EncryptedTable.scan()``; a restart that replays an epoch the table already holds commits
nothing twice; output mode complete replaces the rows.  Source
(``spark.readStream.table("cat.db.t")``): the table's rows, then each append (SQL and Python
API) once; an overwrite refused naming the table, or passed over with the option; offsets
are snapshot positions only.  Encrypted and plaintext tables."""

from __future__ import annotations

import json
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import data_files, magic

from icecrypt.spark._stream import EPOCH_ID_PROPERTY, QUERY_ID_PROPERTY

pytestmark = pytest.mark.spark

SCHEMA = "id bigint, cat string"


def _drop(inbox, start: int, count: int) -> list[tuple]:
    """A new Parquet file of rows ``start ..`` in the stream's input directory; its rows."""
    rows = [(i, "a" if i % 2 else "b") for i in range(start, start + count)]
    pq.write_table(pa.table({"id": [r[0] for r in rows], "cat": [r[1] for r in rows]}),
                   inbox / f"part-{start:05d}.parquet")
    return rows


def _stream(cat, inbox, name: str, checkpoint) -> None:
    """Run the stream over what the input directory holds now (one file per batch)."""
    source = (cat.spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", "1").parquet(str(inbox)))
    query = (source.writeStream.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True)
             .toTable(f"{cat.name}.{name}"))
    query.awaitTermination(120)
    assert query.exception() is None


def _epochs(table) -> list[tuple[str, int]]:
    table.refresh()
    return [(s.summary.get(QUERY_ID_PROPERTY), int(s.summary.get(EPOCH_ID_PROPERTY)))
            for s in table.snapshots() if s.summary.get(QUERY_ID_PROPERTY)]


def _check(cat, name: str, model: list[tuple]) -> None:
    want = sorted(model)
    assert cat.rows(f"SELECT * FROM {{c}}.{name}") == want
    got = cat.table(name).scan().to_arrow()
    assert sorted(zip(got["id"].to_pylist(), got["cat"].to_pylist(), strict=True)) == want


@pytest.mark.parametrize("encrypted", [True, False], ids=["encrypted", "plaintext"])
def test_stream_into_table_exactly_once(cat, tmp_path, encrypted):
    name = f"db.sink_{'enc' if encrypted else 'plain'}"
    props = "TBLPROPERTIES ('encryption.key-id'='master')" if encrypted else ""
    cat.sql(f"CREATE TABLE {{c}}.{name} ({SCHEMA}) USING iceberg PARTITIONED BY (cat) {props}")
    inbox, checkpoint = tmp_path / "in", tmp_path / "cp"
    inbox.mkdir()
    model: list[tuple] = []
    for start in (0, 10, 20):
        model += _drop(inbox, start, 10)
    _stream(cat, inbox, name, checkpoint)  # three micro-batches, one file each
    _check(cat, name, model)
    table = cat.table(name)
    epochs = _epochs(table)
    assert [e for _, e in epochs] == [0, 1, 2] and len({q for q, _ in epochs}) == 1
    files = [p for p in data_files(cat.warehouse) if p.suffix == ".parquet" and f"sink_{'enc' if encrypted else 'plain'}" in str(p)]
    assert files and all(magic(p) == (b"PARE" if encrypted else b"PAR1") for p in files)
    if encrypted:
        metadata = [p for p in data_files(cat.warehouse) if p.name.endswith(".avro")
                    and f"sink_{'enc'}" in str(p)]
        assert metadata and all(magic(p) == b"AGS1" for p in metadata)

    # epoch 2 is in the table, but the checkpoint forgets having committed it (the
    # driver died between the table commit and Spark's commit log): the restart replays
    # it, which commits nothing; the next file is epoch 3
    for forgotten in ("2", ".2.crc"):
        (checkpoint / "commits" / forgotten).unlink(missing_ok=True)
    model += _drop(inbox, 30, 10)
    _stream(cat, inbox, name, checkpoint)
    _check(cat, name, model)
    after = _epochs(table)
    assert [e for _, e in after] == [0, 1, 2, 3] and {q for q, _ in after} == {epochs[0][0]}
    live = {f.file.path.rsplit("/", 1)[-1] for f in table.scan().plan_files()}
    on_disk = {p.name for p in data_files(cat.warehouse) if p.suffix == ".parquet"
               and f"sink_{'enc' if encrypted else 'plain'}" in str(p)}
    assert on_disk == live  # the replay's files were deleted


def _read_stream(cat, name: str, out, checkpoint, **options: str) -> list[tuple]:
    """Run a streaming read of the table (availableNow) into Parquet files at ``out``;
    every row the stream has delivered so far."""
    reader = cat.spark.readStream
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (reader.table(f"{cat.name}.{name}").writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    query.awaitTermination(120)
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    return sorted(tuple(r) for r in cat.spark.read.parquet(str(out)).collect())


@pytest.mark.parametrize("encrypted", [True, False], ids=["encrypted", "plaintext"])
def test_stream_reads_each_append_once(cat, tmp_path, encrypted):
    name = f"db.source_{'enc' if encrypted else 'plain'}"
    props = "TBLPROPERTIES ('encryption.key-id'='master')" if encrypted else ""
    cat.sql(f"CREATE TABLE {{c}}.{name} ({SCHEMA}) USING iceberg {props}")
    out, checkpoint = tmp_path / "out", tmp_path / "cp"
    cat.sql(f"INSERT INTO {{c}}.{name} VALUES (1, 'a'), (2, 'b')")
    model = [(1, "a"), (2, "b")]
    assert _read_stream(cat, name, out, checkpoint) == model  # the current snapshot's rows
    cat.sql(f"INSERT INTO {{c}}.{name} VALUES (3, 'a')")  # SQL append
    cat.table(name).append(pa.table({"id": pa.array([4, 5], pa.int64()), "cat": ["b", "a"]}))  # Python API append
    model += [(3, "a"), (4, "b"), (5, "a")]
    assert _read_stream(cat, name, out, checkpoint) == sorted(model)  # each append once
    assert _read_stream(cat, name, out, checkpoint) == sorted(model)  # nothing new: nothing again
    # the source's offsets (last line of each log entry) are snapshot positions, nothing else
    logged = [json.loads(p.read_text().splitlines()[-1]) for p in (checkpoint / "offsets").iterdir()
              if p.is_file() and p.name.isdigit()]
    assert logged and all(set(o) == {"version", "snapshot_id", "position", "scan_all_files"} for o in logged)

    # an overwrite cannot be streamed as appends: refused naming the table, or passed over
    cat.sql(f"INSERT OVERWRITE {{c}}.{name} VALUES (6, 'b')")
    cat.sql(f"INSERT INTO {{c}}.{name} VALUES (7, 'a')")
    with pytest.raises(Exception) as refused:
        _read_stream(cat, name, out, checkpoint)
    assert "overwrite" in str(refused.value) and name.split(".")[1] in str(refused.value)
    assert "streaming-skip-overwrite-snapshots" in str(refused.value)
    got = _read_stream(cat, name, out, checkpoint, **{"streaming-skip-overwrite-snapshots": "true"})
    assert got == sorted(model + [(7, "a")])


def test_stream_from_table_to_table_with_rate_limit(cat, tmp_path):
    cat.sql(f"CREATE TABLE {{c}}.db.chain_src ({SCHEMA}) USING iceberg TBLPROPERTIES ('encryption.key-id'='master')")
    cat.sql(f"CREATE TABLE {{c}}.db.chain_dst ({SCHEMA}) USING iceberg TBLPROPERTIES ('encryption.key-id'='master')")
    model = []
    for start in (0, 3, 6):
        rows = [(i, "a" if i % 2 else "b") for i in range(start, start + 3)]
        cat.sql(f"INSERT INTO {{c}}.db.chain_src VALUES {', '.join(f'({i}, {c!r})' for i, c in rows)}")
        model += rows
    query = (cat.spark.readStream.option("streaming-max-files-per-micro-batch", "1").table(f"{cat.name}.db.chain_src")
             .writeStream.option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True)
             .toTable(f"{cat.name}.db.chain_dst"))
    query.awaitTermination(120)
    assert query.exception() is None
    _check(cat, "db.chain_dst", model)
    assert len(_epochs(cat.table("db.chain_dst"))) > 1  # the limit made several micro-batches


def test_stream_complete_mode_replaces_the_rows(cat, tmp_path):
    cat.sql("CREATE TABLE {c}.db.counts (cat string, n bigint) USING iceberg "
            "TBLPROPERTIES ('encryption.key-id'='master')")
    inbox, checkpoint = tmp_path / "in", tmp_path / "cp"
    inbox.mkdir()
    rows = _drop(inbox, 0, 5) + _drop(inbox, 5, 4)
    counts = (cat.spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", "1").parquet(str(inbox))
              .groupBy("cat").count().withColumnRenamed("count", "n"))
    query = (counts.writeStream.outputMode("complete").option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).toTable(f"{cat.name}.db.counts"))
    query.awaitTermination(120)
    assert query.exception() is None
    want = sorted((c, sum(1 for _, k in rows if k == c)) for c in ("a", "b"))
    assert cat.rows("SELECT * FROM {c}.db.counts") == want  # the last epoch's rows only
    assert [e for _, e in _epochs(cat.table("db.counts"))] == [0, 1]


def test_stream_gives_spec_id_and_partition(cat, tmp_path):
    """A streaming read gives ``_spec_id`` and ``_partition`` as a batch read does."""
    name = "db.stream_meta"
    cat.sql(f"CREATE TABLE {{c}}.{name} ({SCHEMA}) USING iceberg PARTITIONED BY (cat)")
    cat.sql(f"INSERT INTO {{c}}.{name} VALUES (1, 'a'), (2, 'b')")
    query = (cat.spark.readStream.table(f"{cat.name}.{name}").selectExpr("id", "_spec_id", "_partition.cat AS p")
             .writeStream.format("parquet").option("path", str(tmp_path / "out"))
             .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert sorted(tuple(r) for r in cat.spark.read.parquet(str(tmp_path / "out")).collect()) == \
        [(1, 0, "a"), (2, 0, "b")]

"""Structured Streaming on ``icecrypt.iceberg``: a source of appended rows and an
exactly-once sink.

::

    stream = (spark.readStream.format("icecrypt.iceberg").options(**kms)
              .option("streaming-max-files-per-micro-batch", "10")     # optional rate limits
              .load("/warehouse/db/events"))
    query = (stream.writeStream.format("icecrypt.iceberg").options(**kms)
             .option("checkpointLocation", "/checkpoints/copy")
             .start("/warehouse/db/events_copy"))

**Source** (``spark.readStream``).  Each micro-batch reads the data files that the
snapshots of the table's ``main`` branch (option ``branch``) added, oldest snapshot first,
as Iceberg's Spark source does.  An offset is JSON ``{"version": 1, "snapshot_id": S,
"position": P, "scan_all_files": B}``: the next file to read is number ``P`` of snapshot
``S``'s files (sorted by location) -- the files ``S`` added, or with ``scan_all_files``
every live file of ``S`` (how a stream starts from a snapshot whose history it does not
read).  Offsets name only snapshots and positions, so a query restarted from its
checkpoint continues exactly where it stopped.  Where a stream starts:

* by default from the beginning: every row of the oldest ancestor of the branch's head
  (all of it, in case older history was expired), then each later snapshot's appends;
* ``stream-from-timestamp`` (ms since the epoch): from the oldest ancestor committed at
  or after that moment (its appended rows and the later snapshots');
* ``start-snapshot-id``: after that snapshot (exclusive, as the batch incremental read).

Rate limits (Iceberg's names): ``streaming-max-files-per-micro-batch`` and
``streaming-max-rows-per-micro-batch`` (a batch takes whole files while both hold, and
always at least one file).  ``trigger(availableNow=True)`` honours them and stops at the
head the query saw when it started.  Snapshots whose operation is ``replace``
(compaction) add no rows and are passed over (each snapshot's ``operation`` is first
checked against its manifests: a label forged in ``metadata.json`` fails the query with
``SnapshotIntegrityError``); ``overwrite`` and ``delete`` snapshots fail
the query with a clear error unless ``streaming-skip-overwrite-snapshots`` /
``streaming-skip-delete-snapshots`` is ``true`` (their files are then not read), as in
Iceberg's Spark source.  Options ``columns`` and ``filter`` apply as to batch reads.

Planning (``latestOffset``, ``partitions``) runs in the driver's streaming worker with the
table's key chain; the tasks are the batch reader's (:class:`TaskPartition`): each
carries its file's key metadata to the executor, which decrypts and authenticates the
file with it and never calls the KMS.

**Sink** (``df.writeStream``, output mode ``append``).  Executors write encrypted data
files as the batch writer does; the driver's ``commit(messages, batch_id)`` appends them
in one snapshot whose summary records the query (``spark.sql.streaming.queryId``) and the
epoch (``spark.sql.streaming.epochId``), Iceberg Java's keys.  Before it commits -- on
every attempt of the commit, against the version it is about to build on -- it looks
through the branch's ancestry for a snapshot of the same query and exactly this epoch:
Spark replays only the epoch whose commit its checkpoint did not record (a query
restarted after its driver died between the table commit and the checkpoint's commit
log), so if there is one the epoch was committed before and the replay's files are
deleted instead, so each epoch lands exactly once.  Summaries are storage, not
authority (:func:`committed_epoch`): such a snapshot must show, in its manifests
(authenticated in an encrypted table), data files it added; and an epoch summary that is
not an epoch id, epochs of the query going backwards along the ancestry, or a later
epoch of the query without this one (Java's sink would skip every epoch up to it) fail
the commit with ``SnapshotIntegrityError`` instead of dropping the epoch.  Output mode
``complete`` replaces the table's rows in every epoch (an overwrite snapshot with the
same summary), as Iceberg Java does.  The query id is the one Spark keeps in the
checkpoint: it comes from the tasks (Spark's task-local property), so a restarted query
recognises its own epochs.
"""

from __future__ import annotations

import contextlib
import copy
import json
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamArrowWriter, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxFiles, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from icecrypt.errors import SnapshotIntegrityError
from icecrypt.spark._common import OPT_BATCH_SIZE, file_error, positive_int, split_size
from icecrypt.spark._iceberg import (
    NAME,
    OPT_AS_OF_TIMESTAMP,
    OPT_BRANCH,
    OPT_CHANGELOG,
    OPT_END_SNAPSHOT_ID,
    OPT_END_TIMESTAMP,
    OPT_FILTER,
    OPT_MAX_FILES_PER_BATCH,
    OPT_MAX_ROWS_PER_BATCH,
    OPT_METADATA_TABLE,
    OPT_SKIP_DELETES,
    OPT_SKIP_OVERWRITES,
    OPT_SNAPSHOT_ID,
    OPT_START_SNAPSHOT_ID,
    OPT_START_TIMESTAMP,
    OPT_STREAM_FROM_TIMESTAMP,
    OPT_TAG,
    IcebergWriter,
    TaskDataFiles,
    TaskPartition,
    _integer_option,
    _location,
    _open_table,
)
from icecrypt.spark._schema import Projection
from icecrypt.table import EncryptedTable, FileScanTask, TableScan, read_task
from icecrypt.table.files.metadata import Snapshot
from icecrypt.table.model.operations import SnapshotChanges, check_operation
from icecrypt.table.read.incremental import _ancestry, check_snapshot_operation, snapshot_range
from icecrypt.table.read.scan import parse_row_filter

__all__ = ["EPOCH_ID_PROPERTY", "QUERY_ID_PROPERTY", "IcebergStreamReader", "IcebergStreamWriter",
           "StreamTaskDataFiles", "committed_epoch"]

#: the snapshot summary properties of a streaming write (Iceberg Java's Spark sink's names)
QUERY_ID_PROPERTY = "spark.sql.streaming.queryId"
EPOCH_ID_PROPERTY = "spark.sql.streaming.epochId"

#: Spark's task-local properties of a micro-batch: the query's id and the batch (epoch) id
_SPARK_QUERY_ID = "sql.streaming.queryId"
_SPARK_BATCH_ID = "streaming.sql.batchId"

_OFFSET_VERSION = 1
_NO_SNAPSHOT = -1  # an offset taken while the table had no snapshot: start at its first
_MAIN = "main"


# --- offsets ------------------------------------------------------------------------------------


def _offset(snapshot_id: int, position: int, scan_all_files: bool) -> dict[str, Any]:
    return {"version": _OFFSET_VERSION, "snapshot_id": int(snapshot_id), "position": int(position),
            "scan_all_files": bool(scan_all_files)}


def _parse_offset(offset: Any, location: str) -> tuple[int, int, bool]:
    """(snapshot id, position, scan all files) of an offset (Spark hands back what the
    checkpoint holds: checked, never trusted)."""
    if isinstance(offset, str):
        try:
            offset = json.loads(offset)
        except ValueError:
            offset = None
    ok = (isinstance(offset, dict) and offset.get("version") == _OFFSET_VERSION
          and all(isinstance(offset.get(k), int) and not isinstance(offset.get(k), bool)
                  for k in ("snapshot_id", "position"))
          and isinstance(offset.get("scan_all_files"), bool) and offset["position"] >= 0)
    if not ok:
        raise ValueError(f"{NAME}: table {location}: {offset!r} is not an offset of this source "
                         f"(expected {{\"version\": 1, \"snapshot_id\": ..., \"position\": ..., \"scan_all_files\": ...}}); "
                         "was the checkpoint written by another source?")
    return offset["snapshot_id"], offset["position"], offset["scan_all_files"]


def _true(options: Mapping[str, str], name: str) -> bool:
    raw = str(options.get(name) or "false").strip().lower()
    if raw not in ("true", "false"):
        raise ValueError(f"{NAME}: option {name}={options.get(name)!r} must be true or false")
    return raw == "true"


class _Limit:
    """What one micro-batch may still take (files, rows); it always takes one file."""

    def __init__(self, max_files: int | None, max_rows: int | None) -> None:
        self.files, self.rows, self.taken = max_files, max_rows, 0

    def admits(self, record_count: int) -> bool:
        if self.taken == 0:
            return True
        return (self.files is None or self.taken < self.files) and (self.rows is None or record_count <= self.rows)

    def take(self, record_count: int) -> None:
        self.taken += 1
        if self.rows is not None:
            self.rows -= record_count


# --- the source ---------------------------------------------------------------------------------


class _File:
    """One data file of a snapshot as the stream sees it: its tasks (splits) and rows."""

    def __init__(self, path: str, tasks: list[FileScanTask]) -> None:
        self.path = path
        self.tasks = tasks
        self.record_count = tasks[0].file.record_count


class IcebergStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The streaming source (see the module's documentation).  Lives in the driver's
    streaming worker for the life of the query (offsets, planning); pickled to the
    executors for ``read``, without the table object or its caches."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.options = dict(options)
        self.location = _location(self.options, "load")
        for name in (OPT_SNAPSHOT_ID, OPT_AS_OF_TIMESTAMP, OPT_TAG, OPT_END_SNAPSHOT_ID, OPT_START_TIMESTAMP,
                     OPT_END_TIMESTAMP, OPT_CHANGELOG, OPT_METADATA_TABLE):
            if str(self.options.get(name) or "").strip():
                raise ValueError(f"{NAME}: option {name} has no meaning in a streaming read (start with "
                                 f"{OPT_STREAM_FROM_TIMESTAMP} or {OPT_START_SNAPSHOT_ID}; follow a branch "
                                 f"with {OPT_BRANCH})")
        self.branch = (self.options.get(OPT_BRANCH) or "").strip() or _MAIN
        self.from_timestamp = _integer_option(self.options, OPT_STREAM_FROM_TIMESTAMP,
                                              "a timestamp (milliseconds since the epoch)")
        self.start_after = _integer_option(self.options, OPT_START_SNAPSHOT_ID, "a snapshot id (an integer)")
        if self.from_timestamp is not None and self.start_after is not None:
            raise ValueError(f"{NAME}: give {OPT_STREAM_FROM_TIMESTAMP} or {OPT_START_SNAPSHOT_ID}, not both")
        self.max_files = positive_int(self.options, OPT_MAX_FILES_PER_BATCH, 1) \
            if str(self.options.get(OPT_MAX_FILES_PER_BATCH) or "").strip() else None
        self.max_rows = positive_int(self.options, OPT_MAX_ROWS_PER_BATCH, 1) \
            if str(self.options.get(OPT_MAX_ROWS_PER_BATCH) or "").strip() else None
        self.skip_overwrites = _true(self.options, OPT_SKIP_OVERWRITES)
        self.skip_deletes = _true(self.options, OPT_SKIP_DELETES)
        self.columns = list(schema.fieldNames())
        self.row_filter = parse_row_filter(self.options.get(OPT_FILTER))
        self.split = split_size(self.options, default=0, minimum=1) or None
        self.batch_size = positive_int(self.options, OPT_BATCH_SIZE, 1) if self.options.get(OPT_BATCH_SIZE) else None
        table = _open_table(self.options, self.location)
        try:
            scan = table.scan(columns=self.columns, row_filter=self.row_filter)
        except ValueError as exc:
            raise ValueError(f"{NAME}: table {self.location}: {exc}") from None
        self.projection = Projection(scan.arrow_schema, schema, f"{NAME}: table {self.location}")
        self.filesystem = table.filesystem
        self._table: EncryptedTable | None = table
        self._files: dict[tuple[int, bool], list[_File]] = {}
        self._target: dict[str, Any] | None = None  # availableNow: the head when the query started

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("_table", "_files", "_target", "_checked"):
            state.pop(name, None)
        return state

    # --- the table's snapshots ---------------------------------------------------------------

    def _fresh(self) -> EncryptedTable:
        table = getattr(self, "_table", None)
        try:
            if table is None:
                table = self._table = _open_table(self.options, self.location)
            else:
                table.refresh()
        except Exception as exc:
            raise file_error(exc, f"{NAME}: loading table {self.location}") from exc
        return table

    def _head(self, table: EncryptedTable) -> Snapshot | None:
        if self.branch == _MAIN:
            return table.current_snapshot()
        ref = (table.metadata.get("refs") or {}).get(self.branch)
        if ref is None:
            return None  # not created yet: nothing to read
        if ref.get("type") != "branch":
            raise ValueError(f"{NAME}: table {self.location}: {self.branch!r} is a tag, not a branch: a stream "
                             "follows a branch")
        return table.snapshot(ref["snapshot-id"])

    def _snapshot(self, table: EncryptedTable, snapshot_id: int) -> Snapshot:
        try:
            return table.snapshot(snapshot_id)
        except KeyError:
            raise LookupError(f"{NAME}: table {self.location} no longer has snapshot {snapshot_id}, where the stream "
                              "stands (expired?): the stream cannot tell which rows came after it") from None

    def _after(self, table: EncryptedTable, snapshot: Snapshot, head: Snapshot) -> list[Snapshot]:
        """The snapshots after ``snapshot`` up to ``head``, oldest first."""
        try:
            return snapshot_range(table, snapshot.snapshot_id, head.snapshot_id)[1]
        except ValueError:
            raise ValueError(f"{NAME}: table {self.location}: snapshot {snapshot.snapshot_id}, where the stream stands, "
                             f"is not an ancestor of snapshot {head.snapshot_id}, the head of branch {self.branch!r} "
                             "(the branch was rolled back or replaced): the stream cannot continue") from None

    def _first(self, table: EncryptedTable, head: Snapshot) -> tuple[int, int, bool] | None:
        """Where a stream starts on a table whose branch head is ``head``: (snapshot id,
        position, scan all files); None when the start lies after ``head``."""
        if self.start_after is not None:
            start = self._snapshot(table, self.start_after)
            self._after(table, start, head)  # on the branch's line, or a clear error
            return start.snapshot_id, len(self._snapshot_files(table, start, False)), False
        ancestors = list(_ancestry(table, head))
        if self.from_timestamp is not None:
            after = [s for s in ancestors if s.timestamp_ms >= self.from_timestamp]
            if not after:
                return None
            first = after[-1]
            if first is not ancestors[-1]:  # after its parent: the walk enters (and checks) it
                parent = ancestors[len(after)]
                return parent.snapshot_id, len(self._snapshot_files(table, parent, False)), False
        return ancestors[-1].snapshot_id, 0, True

    def _snapshot_files(self, table: EncryptedTable, snapshot: Snapshot, scan_all: bool) -> list[_File]:
        """The files of ``snapshot`` the stream reads, sorted by location: every live file
        (``scan_all``) or those it added (an append; no other operation adds rows to a
        stream)."""
        key = (snapshot.snapshot_id, scan_all)
        cache = self.__dict__.setdefault("_files", {})
        if key not in cache:
            common = {"columns": self.columns, "row_filter": self.row_filter, "split_size": self.split,
                      "batch_size": self.batch_size}
            try:
                if scan_all:
                    tasks = TableScan(table, _at=(snapshot, table.schema), **common).plan_files()
                elif snapshot.operation == "append":
                    tasks = table.scan(from_snapshot_id=snapshot.snapshot_id, to_snapshot_id=snapshot.snapshot_id,
                                       from_inclusive=True, **common).plan_files()
                else:
                    tasks = []
            except Exception as exc:
                raise file_error(exc, f"{NAME}: planning snapshot {snapshot.snapshot_id} of table {self.location}") \
                    from exc
            by_path: dict[str, list[FileScanTask]] = {}
            for task in tasks:
                by_path.setdefault(task.file.path, []).append(task)
            cache[key] = [_File(path, by_path[path]) for path in sorted(by_path)]
        return cache[key]

    def _admitted(self, table: EncryptedTable, snapshot: Snapshot) -> list[_File]:
        """The files a snapshot the stream reaches contributes (its appended ones), or []
        for one it passes over; an overwrite or delete not to be skipped stops the stream.
        The label decides, so it is checked against the snapshot's manifests first (once
        per snapshot): a forged one is a SnapshotIntegrityError, never rows passed over."""
        checked = self.__dict__.setdefault("_checked", set())
        if snapshot.snapshot_id not in checked:
            try:
                check_snapshot_operation(table, snapshot)
            except SnapshotIntegrityError as exc:
                raise SnapshotIntegrityError(f"{NAME}: stream of {exc}", table=exc.table,
                                             snapshot_id=exc.snapshot_id) from None
            checked.add(snapshot.snapshot_id)
        operation = snapshot.operation
        if operation == "append" or operation == "replace":
            return self._snapshot_files(table, snapshot, False)
        for kind, skip, option in (("overwrite", self.skip_overwrites, OPT_SKIP_OVERWRITES),
                                   ("delete", self.skip_deletes, OPT_SKIP_DELETES)):
            if operation == kind:
                if skip:
                    return []
                raise ValueError(f"{NAME}: table {self.location}: snapshot {snapshot.snapshot_id} is an {kind}, "
                                 f"which a stream of appended rows cannot express; set option {option}=true to "
                                 "pass over such snapshots (their changes are then not streamed)")
        raise ValueError(f"{NAME}: table {self.location}: snapshot {snapshot.snapshot_id} has operation "
                         f"{operation!r}, which the stream cannot read")

    def _walk(self, table: EncryptedTable, start: Any, head: Snapshot) -> Iterator[tuple[Snapshot, int, bool, _File | None]]:
        """From offset ``start`` to ``head``: (snapshot, position, scan all files, file at
        that position) for each file in stream order, and (snapshot, len, flag, None) at
        the end of each snapshot."""
        snapshot_id, position, scan_all = _parse_offset(start, self.location)
        if snapshot_id == _NO_SNAPSHOT:
            first = self._first(table, head)
            if first is None:
                return
            snapshot_id, position, scan_all = first
        current = self._snapshot(table, snapshot_id)
        later = self._after(table, current, head)
        # where the stream stands was checked when the walk entered it (or is a start
        # point, whose own changes are not streamed): only the snapshots after it are
        files = self._snapshot_files(table, current, scan_all)
        while True:
            for index in range(position, len(files)):
                yield current, index, scan_all, files[index]
            yield current, max(position, len(files)), scan_all, None
            if not later:
                return
            current, position, scan_all = later.pop(0), 0, False
            files = self._admitted(table, current)

    # --- DataSourceStreamReader --------------------------------------------------------------

    def initialOffset(self) -> dict[str, Any]:
        table = self._fresh()
        head = self._head(table)
        if head is None:
            return _offset(_NO_SNAPSHOT, 0, self.start_after is None and self.from_timestamp is None)
        first = self._first(table, head)
        if first is None:  # everything so far is before the start: from the head's end
            return _offset(head.snapshot_id, len(self._snapshot_files(table, head, False)), False)
        return _offset(*first)

    def getDefaultReadLimit(self) -> Any:
        # Spark takes one limit; the source applies both options whenever a limit is asked
        if self.max_files is not None:
            return ReadMaxFiles(self.max_files)
        if self.max_rows is not None:
            return ReadMaxRows(self.max_rows)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        head = self._head(self._fresh())
        self._target = {"snapshot_id": None if head is None else head.snapshot_id}

    def _budget(self, limit: Any) -> _Limit:
        """The engine's limit, and the options' other limit with it (Spark passes one);
        none with ReadAllAvailable (Trigger.Once) or no limit."""
        if limit is None or isinstance(limit, ReadAllAvailable):
            return _Limit(None, None)
        if isinstance(limit, ReadMaxFiles):
            return _Limit(limit.max_files, self.max_rows)
        if isinstance(limit, ReadMaxRows):
            return _Limit(self.max_files, limit.max_rows)
        return _Limit(self.max_files, self.max_rows)

    def latestOffset(self, start: dict[str, Any], limit: Any = None) -> dict[str, Any]:
        table = self._fresh()
        head = self._head(table)
        target = getattr(self, "_target", None)
        if target is not None:  # availableNow: never past the head the query started with
            head = None if target["snapshot_id"] is None else self._snapshot(table, target["snapshot_id"])
        if head is None:
            return start
        budget = self._budget(limit)
        end = start
        for snapshot, position, scan_all, file in self._walk(table, start, head):
            if file is None:
                end = _offset(snapshot.snapshot_id, position, scan_all)
                continue
            if not budget.admits(file.record_count):
                return end  # after the last file taken (or snapshot passed over)
            budget.take(file.record_count)
            end = _offset(snapshot.snapshot_id, position + 1, scan_all)
        return end

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        table = self._fresh()
        end_id, end_position, _ = _parse_offset(end, self.location)
        if end_id == _NO_SNAPSHOT:
            return []
        end_snapshot = self._snapshot(table, end_id)
        tasks: list[FileScanTask] = []
        for snapshot, position, _, file in self._walk(table, start, end_snapshot):
            if snapshot.snapshot_id == end_id and position >= end_position:
                break
            if file is not None:
                tasks.extend(file.tasks)
        return [TaskPartition(index, task) for index, task in enumerate(tasks)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, TaskPartition):
            return
        apply = self.projection.apply
        try:
            for batch in read_task(partition.task, self.filesystem):
                yield apply(batch)
        except Exception as exc:
            raise file_error(exc, f"{NAME}: streaming task {partition.value} of table {self.location}") from exc

    def commit(self, end: dict[str, Any]) -> None:
        # files of snapshots wholly behind ``end`` are never planned again
        with contextlib.suppress(Exception):
            end_id = _parse_offset(end, self.location)[0]
            cache = self.__dict__.get("_files") or {}
            if end_id != _NO_SNAPSHOT and self._table is not None:
                behind = {s.snapshot_id for s in _ancestry(self._table, self._table.snapshot(end_id))} - {end_id}
                for key in [k for k in cache if k[0] in behind]:
                    cache.pop(key, None)

    def __repr__(self) -> str:
        return f"<IcebergStreamReader {self.location} branch={self.branch}>"


# --- the sink ---------------------------------------------------------------------------------


class StreamTaskDataFiles(TaskDataFiles):
    """A streaming write task's commit message: its data files, and the query, epoch and
    job (file name marker) it wrote them for."""

    def __init__(self, data_files: Sequence[dict[str, Any]], query_id: str | None, epoch: int | None,
                 operation_id: str) -> None:
        super().__init__(data_files)
        self.query_id, self.epoch, self.operation_id = query_id, epoch, operation_id


#: the largest epoch id (Spark's batch ids are Java longs)
_MAX_EPOCH = 2**63 - 1


def _summary_epoch(snapshot: Mapping[str, Any], table: str) -> int:
    """The epoch a snapshot of the query records: a non-negative integer in canonical
    decimal, as Spark and Java write it; anything else is SnapshotIntegrityError."""
    raw = (snapshot.get("summary") or {}).get(EPOCH_ID_PROPERTY)
    if (isinstance(raw, str) and raw.isascii() and raw.isdigit() and (raw == "0" or raw[0] != "0")
            and int(raw) <= _MAX_EPOCH):
        return int(raw)
    raise SnapshotIntegrityError(
        f"{NAME}: table {table}: snapshot {snapshot.get('snapshot-id')} records streaming epoch {raw!r} "
        f"({EPOCH_ID_PROPERTY}), which is not an epoch id (a non-negative integer): refused rather than acted on",
        table=table, snapshot_id=snapshot.get("snapshot-id"),
    )


def _query_epochs(metadata: Mapping[str, Any], query_id: str, branch: str, table: str) -> list[tuple[dict, int]]:
    """(snapshot, epoch) of each snapshot of streaming query ``query_id`` among the
    ancestors of ``branch``'s head, newest first; the epochs must not go backwards along
    the ancestry (an older snapshot of the query with a later epoch than a newer one:
    SnapshotIntegrityError)."""
    snapshots = {s.get("snapshot-id"): s for s in metadata.get("snapshots") or ()}
    ref = (metadata.get("refs") or {}).get(branch)
    current = ref.get("snapshot-id") if ref else (metadata.get("current-snapshot-id") if branch == _MAIN else None)
    found: list[tuple[dict, int]] = []
    seen: set[int] = set()
    while current is not None and current in snapshots:
        if current in seen:
            raise SnapshotIntegrityError(f"{NAME}: table {table}: the parent chain of branch {branch!r} loops at "
                                         f"snapshot {current}", table=table, snapshot_id=current)
        seen.add(current)
        snapshot = snapshots[current]
        if (snapshot.get("summary") or {}).get(QUERY_ID_PROPERTY) == query_id:
            epoch = _summary_epoch(snapshot, table)
            if found and epoch > found[-1][1]:
                newer, newer_epoch = found[-1]
                raise SnapshotIntegrityError(
                    f"{NAME}: table {table}: streaming query {query_id}'s epochs go backwards along branch "
                    f"{branch!r}: snapshot {current} records epoch {epoch}, its descendant {newer['snapshot-id']} "
                    f"epoch {newer_epoch} (a forged or damaged history): refused", table=table, snapshot_id=current,
                )
            found.append((snapshot, epoch))
        current = snapshot.get("parent-snapshot-id")
    return found


def committed_epoch(
    metadata: Mapping[str, Any], query_id: str, epoch: int, changes: Callable[[Mapping[str, Any]], SnapshotChanges],
    *, branch: str = _MAIN, table: str, files: bool,
) -> int | None:
    """The snapshot among the ancestors of ``branch``'s head in a table version (its
    metadata document) that committed epoch ``epoch`` of streaming query ``query_id``, or
    None when the epoch is not in the table.  Spark replays only the epoch whose commit it
    did not record, so only a snapshot of exactly this query and epoch counts, and it is
    checked against what can be authenticated: its manifests (``changes(snapshot)``) must
    show data files it added when the replay has data files (``files``), and its
    operation must fit them.  A snapshot of the query with a later epoch and none with
    this one (the table ahead of the query's checkpoint), an epoch that is not an epoch id
    and epochs that go backwards are SnapshotIntegrityError naming the table, the
    snapshot and the epochs: never a reason to drop an epoch."""
    epochs = _query_epochs(metadata, query_id, branch, table)
    exact = next((snapshot for snapshot, e in epochs if e == epoch), None)
    if exact is None:
        if epochs and epochs[0][1] > epoch:
            newest, newest_epoch = epochs[0]
            raise SnapshotIntegrityError(
                f"{NAME}: table {table}: snapshot {newest['snapshot-id']} records epoch {newest_epoch} of streaming "
                f"query {query_id}, later than epoch {epoch} that Spark commits now, and no snapshot records epoch "
                f"{epoch}: the table's history is ahead of the query's checkpoint (a forged summary, or a checkpoint "
                "restored from an older copy); nothing was committed", table=table, snapshot_id=newest["snapshot-id"],
            )
        return None
    snapshot_id = exact["snapshot-id"]
    found = changes(exact)
    if files and not found.added_data_files:
        raise SnapshotIntegrityError(
            f"{NAME}: table {table}: snapshot {snapshot_id} records epoch {epoch} of streaming query {query_id}, but "
            f"its manifests show no data file added by it ({found}): it did not commit this epoch's rows (a forged "
            "summary); nothing was committed", table=table, snapshot_id=snapshot_id,
        )
    parent = exact.get("parent-snapshot-id")
    root = parent is None or all(s.get("snapshot-id") != parent for s in metadata.get("snapshots") or ())
    check_operation(table, snapshot_id, (exact.get("summary") or {}).get("operation"), found, root=root,
                    format_version=int(metadata.get("format-version") or 1))
    return snapshot_id


class EpochAlreadyCommitted(Exception):
    """The epoch a streaming commit was about to make is in the table already."""


def _local_property(name: str) -> str | None:
    try:
        from pyspark import TaskContext

        context = TaskContext.get()
        return None if context is None else context.getLocalProperty(name)
    except Exception:
        return None


class IcebergStreamWriter(IcebergWriter, DataSourceStreamArrowWriter):
    """The streaming sink: tasks write encrypted files, the driver commits each epoch once."""

    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        if str(options.get("wap-id") or "").strip():
            raise ValueError(f"{NAME}: option wap-id has no meaning in a streaming write")
        super().__init__(options, schema, overwrite)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StreamTaskDataFiles:
        query_id = _local_property(_SPARK_QUERY_ID)
        raw_epoch = _local_property(_SPARK_BATCH_ID)
        epoch = int(raw_epoch) if raw_epoch is not None and raw_epoch.lstrip("-").isdigit() else None
        # one file-name marker per (writer, epoch): a replay of the epoch by a restarted
        # query never reuses a name, and leftovers are found per epoch
        task_writer = copy.copy(self)
        task_writer.operation_id = str(uuid.uuid5(uuid.UUID(self.operation_id), f"epoch-{epoch}"))
        message = IcebergWriter.write(task_writer, iterator)
        return StreamTaskDataFiles(message.data_files, query_id, epoch, task_writer.operation_id)

    def commit(self, messages: list[StreamTaskDataFiles | None], batchId: int) -> None:  # type: ignore[override]
        from icecrypt.table.ops.write import append_files, overwrite_files, remove_job_leftovers

        epoch = int(batchId)
        reported = [m for m in messages if m is not None]
        data_files = [f for m in reported for f in m.data_files]
        query_ids = {m.query_id for m in reported}
        if len(query_ids) > 1 or None in query_ids or any(m.epoch != epoch for m in reported):
            self.abort(messages, batchId)
            raise ValueError(f"{NAME}: streaming commit of epoch {epoch} to table {self.location}: the tasks report "
                             f"queries {sorted(map(str, query_ids))} and epochs {sorted({str(m.epoch) for m in reported})}; "
                             "nothing was committed")
        if not reported:
            return  # no task ran: nothing to commit
        query_id = query_ids.pop()
        branch = self.branch or _MAIN

        def check(version: Mapping[str, Any], changes: Callable[[Mapping[str, Any]], SnapshotChanges]) -> None:
            committed = committed_epoch(version, query_id, epoch, changes, branch=branch, table=self.location,
                                        files=bool(data_files))
            if committed is not None:
                raise EpochAlreadyCommitted(f"epoch {epoch} of query {query_id} (snapshot {committed})")

        summary = {QUERY_ID_PROPERTY: query_id, EPOCH_ID_PROPERTY: str(epoch)}
        table = None
        try:
            table = self._table(commit=True)
            if self.overwrite:
                overwrite_files(table, data_files, branch=self.branch, summary=summary, check=check)
            else:
                append_files(table, data_files, branch=self.branch, summary=summary, check=check)
        except EpochAlreadyCommitted:
            pass  # the replay's data files are deleted by the failed commit
        except SnapshotIntegrityError:
            raise  # names the table, the snapshot and the epochs already
        except Exception as exc:
            raise file_error(exc, f"{NAME}: committing epoch {epoch} to table {self.location}") from exc
        keep = [f["file_path"] for f in data_files]
        with contextlib.suppress(Exception):  # files of attempts that died before reporting
            for operation_id in {m.operation_id for m in reported}:
                remove_job_leftovers(table, operation_id, keep)

    def abort(self, messages: list[Any], batchId: int = -1) -> None:  # type: ignore[override]
        from icecrypt.table.ops.write import remove_job_leftovers

        operation_ids = {m.operation_id for m in messages if isinstance(m, StreamTaskDataFiles)}
        super().abort(messages)
        with contextlib.suppress(Exception):
            table = self._table()
            for operation_id in operation_ids:
                remove_job_leftovers(table, operation_id, [])

    def __repr__(self) -> str:
        return f"<IcebergStreamWriter {self.location} {'complete' if self.overwrite else 'append'}>"

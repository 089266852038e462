"""Incremental reads: the rows appended between two snapshots, and the changelog.

The range is Iceberg's: ``from`` exclusive (or inclusive with ``from_inclusive``), ``to``
inclusive (default: the current snapshot), both on one line of descent -- ``from`` must be
``to`` itself, or reached from ``to`` by following ``parent-snapshot-id`` (exclusive: some
ancestor's parent, which may itself have been expired, as Java allows).  No ``from``: from
the oldest ancestor of ``to``, inclusive.

Every snapshot of the range must carry the ``operation`` its manifests show
(:func:`check_snapshot_operation`, rules in :mod:`icecrypt.table.model.operations`): the
scans act on the label, so one forged in ``metadata.json`` (an append relabelled
``replace``, whose rows would be skipped) is a :class:`~icecrypt.SnapshotIntegrityError`
naming the snapshot, never a silent skip.

* :class:`IncrementalAppendScan` (Java's ``IncrementalAppendScan``): only snapshots whose
  operation is ``append`` contribute, and of them only the data files they ADDED (manifest
  entries with status ADDED and the snapshot's id).  Other operations in the range
  (``overwrite``, ``delete``, ``replace``) are skipped, and no delete file is applied: the
  scan returns rows as appended, whatever happened to them later (as Java's, whose plan has
  no delete manifests).
* :class:`ChangelogScan` (Java's ``IncrementalChangelogScan`` as released): for every
  snapshot in the range except ``replace`` ones (compaction changes no row), the rows of
  the data files it ADDED as ``INSERT`` and of those it DELETED as ``DELETE``, with
  ``_change_type``, ``_change_ordinal`` (0 for the oldest snapshot of the range) and
  ``_commit_snapshot_id``.  A snapshot in the range that has delete files (row-level
  deletes, deletion vectors) is refused, as Java refuses it.

Everything is planned and read by :class:`~icecrypt.table.read.scan.TableScan`'s
machinery: manifests and data files decrypted and authenticated through the table's
locations and key chain, pruned and filtered by the row filter, projected.  The parent
links that define the range come from the metadata document; a chain that loops or a
snapshot the document does not have is damage or a clear error, never followed blindly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyiceberg.expressions import BooleanExpression

from icecrypt.errors import FormatError
from icecrypt.table.files.manifest import ADDED, DELETED, ManifestFile, read_manifest
from icecrypt.table.files.metadata import Snapshot
from icecrypt.table.files.read import FileScanTask, read_task
from icecrypt.table.model.operations import check_operation, snapshot_changes
from icecrypt.table.read.scan import TableScan, _Evaluators
from icecrypt.table.read.travel import timestamp_ms

if TYPE_CHECKING:
    from icecrypt.table.commit.state import TableView

__all__ = [
    "CHANGE_COLUMNS",
    "CHANGE_ORDINAL",
    "CHANGE_TYPE",
    "COMMIT_SNAPSHOT_ID",
    "ChangelogScan",
    "ChangelogTask",
    "IncrementalAppendScan",
    "check_snapshot_operation",
    "read_changelog_task",
    "snapshot_range",
]

APPEND, REPLACE = "append", "replace"
INSERT, DELETE = "INSERT", "DELETE"
#: the changelog's columns (Java's names), after the projected ones
CHANGE_TYPE, CHANGE_ORDINAL, COMMIT_SNAPSHOT_ID = "_change_type", "_change_ordinal", "_commit_snapshot_id"
CHANGE_COLUMNS = (CHANGE_TYPE, CHANGE_ORDINAL, COMMIT_SNAPSHOT_ID)
_CHANGE_FIELDS = (pa.field(CHANGE_TYPE, pa.string(), nullable=False),
                  pa.field(CHANGE_ORDINAL, pa.int32(), nullable=False),
                  pa.field(COMMIT_SNAPSHOT_ID, pa.int64(), nullable=False))


def _ancestry(table: TableView, snapshot: Snapshot) -> Iterator[Snapshot]:
    """``snapshot`` and its ancestors the table still has, newest first; a parent chain
    that comes back to a snapshot already seen is damage."""
    seen: set[int] = set()
    current: Snapshot | None = snapshot
    while current is not None:
        if current.snapshot_id in seen:
            raise FormatError(f"{table.metadata_location}: the parent-snapshot-id chain of snapshot "
                              f"{snapshot.snapshot_id} loops at snapshot {current.snapshot_id}")
        seen.add(current.snapshot_id)
        yield current
        parent = current.parent_snapshot_id
        if parent is None:
            return
        try:
            current = table.snapshot(parent)
        except KeyError:  # expired: the history known ends here
            return


def check_snapshot_operation(table: TableView, snapshot: Snapshot, manifests: list[ManifestFile] | None = None) -> None:
    """Refuse (:class:`~icecrypt.SnapshotIntegrityError`) a snapshot whose ``operation``
    its own manifests contradict (an append relabelled ``replace``, a ``delete`` that adds
    data files, ...: :mod:`icecrypt.table.model.operations`).  ``manifests``: the
    snapshot's manifest list when the caller has read it already."""
    if manifests is None:
        manifests = table.manifests(snapshot)
    by_path = {m.path: m for m in manifests}

    def entries(record: Any) -> Iterator[tuple[int, int | None, int]]:
        for entry in read_manifest(by_path[record["manifest_path"]], table.locations, table.specs,
                                   table.schema_for(snapshot), encrypted=table.encrypted, include_deleted=True):
            yield entry.status, entry.snapshot_id, entry.file.record_count

    changes = snapshot_changes(snapshot.snapshot_id, [m.record for m in manifests], entries)
    root = snapshot.parent_snapshot_id is None
    if not root:
        try:
            table.snapshot(snapshot.parent_snapshot_id)
        except KeyError:
            root = True  # its parent expired: the known history starts here
    check_operation(table.location, snapshot.snapshot_id, snapshot.operation, changes, root=root,
                    format_version=table.format_version)


def snapshot_range(
    table: TableView,
    from_snapshot_id: int | None = None,
    to_snapshot_id: int | None = None,
    *,
    from_inclusive: bool = False,
) -> tuple[Snapshot | None, list[Snapshot]]:
    """``(to, snapshots)``: the end snapshot (None: the table has no snapshot and neither
    end was given) and the snapshots of the range, oldest first.

    ``to_snapshot_id`` unknown, or ``from_snapshot_id`` unknown with ``from_inclusive``:
    ``KeyError`` naming the table.  ``from`` not on ``to``'s line of descent (for an
    exclusive ``from``: not the parent of one of ``to``'s ancestors): ``ValueError``
    naming both ids."""
    for name, value in (("from_snapshot_id", from_snapshot_id), ("to_snapshot_id", to_snapshot_id)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(f"{name} must be a snapshot id (an int), not {type(value).__name__}")
    if to_snapshot_id is not None:
        to = table.snapshot(to_snapshot_id)  # KeyError naming the table when unknown
    else:
        to = table.current_snapshot()
        if to is None:
            if from_snapshot_id is None:
                return None, []
            raise ValueError(f"table {table.location} has no current snapshot: give to_snapshot_id")
    if from_inclusive and from_snapshot_id is not None:
        table.snapshot(from_snapshot_id)  # KeyError naming the table when unknown
    chain: list[Snapshot] = []
    for snapshot in _ancestry(table, to):
        if from_snapshot_id is not None and not from_inclusive and snapshot.snapshot_id == from_snapshot_id:
            break
        chain.append(snapshot)
        if from_snapshot_id is None:
            continue
        if from_inclusive and snapshot.snapshot_id == from_snapshot_id:
            break
        if not from_inclusive and snapshot.parent_snapshot_id == from_snapshot_id:
            break
    else:
        if from_snapshot_id is not None:
            kind = "inclusive" if from_inclusive else "exclusive"
            raise ValueError(f"table {table.location}: snapshot {from_snapshot_id} (start, {kind}) is not an ancestor "
                             f"of snapshot {to.snapshot_id} (end): an incremental read follows one line of descent")
    return to, chain[::-1]


def _range_text(snapshots: Sequence[Snapshot]) -> str:
    return f"snapshots {[s.snapshot_id for s in snapshots]}"


class _IncrementalBase(TableScan):
    """A :class:`~icecrypt.table.TableScan` whose plan is the files a range of snapshots added (and, for
    the changelog, deleted); reads with the table's current schema, as Java does."""

    def __init__(
        self,
        table: TableView,
        columns: Sequence[str] | None = None,
        row_filter: BooleanExpression | str | None = None,
        *,
        from_snapshot_id: int | None = None,
        to_snapshot_id: int | None = None,
        from_inclusive: bool = False,
        **options: Any,
    ):
        to, self.range = snapshot_range(table, from_snapshot_id, to_snapshot_id, from_inclusive=from_inclusive)
        self.to_snapshot = to
        super().__init__(table, columns, row_filter, _at=(to, table.schema), **options)
        self._manifest_lists: dict[int, list[ManifestFile]] = {}

    def _manifests(self, snapshot: Snapshot) -> list[ManifestFile]:
        """The snapshot's manifests (its manifest list read once per scan)."""
        found = self._manifest_lists.get(snapshot.snapshot_id)
        if found is None:
            found = self._manifest_lists[snapshot.snapshot_id] = self.table.manifests(snapshot)
        return found

    def _checked_range(self) -> list[Snapshot]:
        """The range, each snapshot's ``operation`` checked against its manifests first:
        the scans act on the labels."""
        for snapshot in self.range:
            check_snapshot_operation(self.table, snapshot, self._manifests(snapshot))
        return self.range

    def _entries(self, snapshots: list[Snapshot], statuses: tuple[int, ...]) -> Iterator[Any]:
        """The data manifest entries the snapshots wrote themselves with one of ``statuses``,
        that the row filter may match (partition values and statistics)."""
        ids = {s.snapshot_id for s in snapshots}
        evaluators = _Evaluators(self.table, self.schema, self._prune_filter, self.case_sensitive)
        manifests: dict[str, ManifestFile] = {}
        for snapshot in snapshots:
            for manifest in self._manifests(snapshot):
                self.metrics.manifests += 1
                if manifest.is_deletes or manifest.added_snapshot_id not in ids or manifest.path in manifests:
                    continue
                if not evaluators.manifest(manifest):
                    self.metrics.manifests_skipped += 1
                    continue
                manifests[manifest.path] = manifest
        for manifest, found in self._read_manifests(list(manifests.values()), include_deleted=DELETED in statuses):
            for entry in self._checked(manifest, found):
                if entry.status not in statuses or entry.snapshot_id not in ids:
                    continue
                self.metrics.data_files += 1
                if not (evaluators.partition(entry.file) and evaluators.metrics(entry.file)):
                    self.metrics.data_files_skipped += 1
                    continue
                yield entry

    def count(self) -> int:
        """The number of rows the scan returns."""
        return sum(b.num_rows for b in self.to_batches())


class IncrementalAppendScan(_IncrementalBase):
    """The rows the ``append`` snapshots of a range added (Java's ``IncrementalAppendScan``).

    Create it with ``table.scan(from_snapshot_id=..., to_snapshot_id=...)``; it reads like a
    :class:`TableScan` (``to_arrow``, ``to_batches``, ``plan_files``, ``count``).  Snapshots
    of other operations in the range are skipped and no delete is applied, as in Java's."""

    def plan_tasks(self) -> Iterator[FileScanTask]:
        if self._tasks is not None:
            yield from self._tasks
            return
        self.metrics = type(self.metrics)()
        appends = [s for s in self._checked_range() if s.operation == APPEND]
        for entry in self._entries(appends, (ADDED,)):
            for task in self._tasks_for(entry, []):
                self.metrics.tasks += 1
                yield task

    def __repr__(self) -> str:
        return (f"<IncrementalAppendScan {_range_text(self.range)} "
                f"columns={[f.name for f in self.projected.fields]} filter={self.row_filter}>")


@dataclasses.dataclass(frozen=True)
class ChangelogTask:
    """A file scan task of a changelog scan and the change its rows are (picklable, for
    distributed readers; its file's key metadata travels in ``task``, never shown)."""

    task: FileScanTask
    change_type: str
    change_ordinal: int
    commit_snapshot_id: int

    def __repr__(self) -> str:
        return (f"ChangelogTask({self.change_type} ordinal={self.change_ordinal} snapshot={self.commit_snapshot_id} "
                f"{self.task.file.path} bytes {self.task.start}+{self.task.length})")


def changelog_schema(schema: pa.Schema) -> pa.Schema:
    """The schema of a changelog of rows of ``schema``."""
    return pa.schema([*schema, *_CHANGE_FIELDS])


def read_changelog_task(
    task: ChangelogTask, filesystem: Any = None, *, cache: dict | None = None,
) -> Iterator[pa.RecordBatch]:
    """The rows of a :class:`ChangelogTask` (authenticated as :func:`read_task` reads them),
    with the changelog columns."""
    for batch in read_task(task.task, filesystem, cache=cache):
        n = batch.num_rows
        yield pa.RecordBatch.from_arrays(
            [*batch.columns,
             pa.array([task.change_type] * n, pa.string()),
             pa.array([task.change_ordinal] * n, pa.int32()),
             pa.array([task.commit_snapshot_id] * n, pa.int64())],
            schema=changelog_schema(batch.schema),
        )


class ChangelogScan(_IncrementalBase):
    """Inserted and deleted rows of a range of snapshots (Java's ``IncrementalChangelogScan``).

    Create it with ``table.changelog_scan(from_snapshot_id=..., to_snapshot_id=...)``.
    ``to_arrow()`` / ``to_batches()`` return the projected columns and ``_change_type``
    (``INSERT`` or ``DELETE``), ``_change_ordinal`` and ``_commit_snapshot_id``, in the order
    of the snapshots; ``plan_changes()`` the picklable :class:`ChangelogTask` s."""

    def _changelog_snapshots(self) -> list[Snapshot]:
        snapshots = [s for s in self._checked_range() if s.operation != REPLACE]
        for snapshot in snapshots:
            deletes = [m for m in self._manifests(snapshot) if m.is_deletes]
            if deletes:
                raise NotImplementedError(
                    f"table {self.table.location}: snapshot {snapshot.snapshot_id} ({snapshot.operation}) has delete "
                    f"files (manifest {deletes[0].path}); changelog scans do not support row-level deletes "
                    "(as Iceberg Java's)"
                )
        return snapshots

    def plan_changes(self) -> list[ChangelogTask]:
        """The changelog's tasks, oldest snapshot first, DELETE before INSERT within one."""
        if getattr(self, "_changes", None) is None:
            self.metrics = type(self.metrics)()
            snapshots = self._changelog_snapshots()
            ordinals = {s.snapshot_id: i for i, s in enumerate(snapshots)}
            changes = []
            for entry in self._entries(snapshots, (ADDED, DELETED)):
                kind = INSERT if entry.status == ADDED else DELETE
                for task in self._tasks_for(entry, []):
                    self.metrics.tasks += 1
                    changes.append(ChangelogTask(task, kind, ordinals[entry.snapshot_id], entry.snapshot_id))
            changes.sort(key=lambda c: (c.change_ordinal, c.change_type != DELETE))
            self._changes = changes
        return list(self._changes)

    def plan_tasks(self) -> Iterator[FileScanTask]:
        """The file scan tasks (without the change each is: see :meth:`plan_changes`)."""
        return iter([c.task for c in self.plan_changes()])

    @property
    def arrow_schema(self) -> pa.Schema:
        return changelog_schema(super().arrow_schema)

    def to_batches(self) -> pa.RecordBatchReader:
        changes = self.plan_changes()
        filesystem = self.table.locations.filesystem

        def generate() -> Iterator[pa.RecordBatch]:
            cache: dict = {}
            for change in changes:
                yield from read_changelog_task(change, filesystem, cache=cache)

        return pa.RecordBatchReader.from_batches(self.arrow_schema, generate())

    def to_arrow(self) -> pa.Table:
        return self.to_batches().read_all()

    def __repr__(self) -> str:
        return (f"<ChangelogScan {_range_text(self.range)} "
                f"columns={[f.name for f in self.projected.fields]} filter={self.row_filter}>")


def timestamp_range(table: TableView, start: Any = None, end: Any = None) -> tuple[int | None, int | None, bool]:
    """``(from_snapshot_id (exclusive), to_snapshot_id, empty)`` for a changelog between two
    moments, by the current snapshot's ancestors as Java's Spark reads it: the start is
    the parent of the oldest ancestor at or after ``start`` (that ancestor itself when its
    timestamp equals ``start``); the end the newest ancestor at or before ``end``.
    ``empty``: no snapshot lies between them."""
    current = table.current_snapshot()
    ancestors = [] if current is None else list(_ancestry(table, current))
    from_id = to_id = None
    if end is not None:
        end_ms = timestamp_ms(end, what="end timestamp")
        to_id = next((s.snapshot_id for s in ancestors if s.timestamp_ms <= end_ms), None)
        if to_id is None:
            return None, None, True
    if start is not None:
        start_ms = timestamp_ms(start, what="start timestamp")
        if current is None or start_ms > current.timestamp_ms:
            return None, None, True
        after = [s for s in ancestors if s.timestamp_ms >= start_ms]
        oldest = after[-1]
        from_id = oldest.snapshot_id if oldest.timestamp_ms == start_ms else oldest.parent_snapshot_id
        if from_id is not None and from_id == to_id:
            return None, None, True
    return from_id, to_id, current is None

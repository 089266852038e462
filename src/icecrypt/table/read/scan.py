"""Scan planning: from a snapshot to file scan tasks, through the key chain.

snapshot ``key-id`` → manifest-list key metadata (KEK-wrapped, ``encryption-keys``) →
manifest list (AGS1 Avro) → manifests (key metadata field 519) → data and delete files
(key metadata field 131).  Manifests are skipped by their partition summaries, data files
by their partition values and column statistics (PyIceberg's evaluators on the
decrypted manifest contents); deletes are matched to data files with Iceberg's
sequence-number rules (Java's ``DeleteFileIndex``):

* a deletion vector applies to the data file it references if its data sequence number
  is ≥ the data file's; when a data file has one, position delete files are not used
  (a DV replaces them);
* a position delete file applies to data files of its partition (or the one file it
  references) with data sequence number ≤ its own;
* an equality delete file applies to data files of its partition (all partitions when
  its spec is unpartitioned) with data sequence number **<** its own.

Large files are split: Parquet at the row-group offsets the manifest records
(``split_offsets``), Avro by byte ranges of the decrypted file (an Avro file with
position deletes is not split, its row positions must be counted from the start).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import os
import threading
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.fs as pafs
from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.expressions.visitors import (
    _InclusiveMetricsEvaluator,
    bind,
    expression_evaluator,
    extract_field_ids,
    inclusive_projection,
    manifest_evaluator,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import NestedField

from icecrypt.errors import FormatError
from icecrypt.table.files.manifest import (
    DATA,
    EQUALITY_DELETES,
    ContentFile,
    ManifestEntry,
    ManifestFile,
    read_manifest,
)
from icecrypt.table.files.metadata import Snapshot
from icecrypt.table.model.metadata_columns import (
    LINEAGE,
    LINEAGE_FORMAT_VERSION,
    PARTITION_ID,
    ROW_ID,
    ROW_POSITION,
    filter_schema,
    metadata_field,
    partition_type,
    without_metadata,
)
from icecrypt.table.files.read import (
    FileScanTask,
    ReadSpec,
    TaskFile,
    arrow_schema,
    load_deletes,
    read_task,
)
from icecrypt.table.read.travel import resolve_read
from icecrypt.table.model.transforms import java_spec

if TYPE_CHECKING:
    from icecrypt.table.commit.state import TableView

__all__ = ["ROW_FILTER_FORMS", "PlanMetrics", "TableScan", "parse_row_filter"]

#: Iceberg's read.split.target-size default
DEFAULT_SPLIT_SIZE = 128 * 1024 * 1024
SPLIT_SIZE_PROPERTY = "read.split.target-size"
_MANIFEST_THREADS = 8


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _manifest_pool() -> ThreadPoolExecutor:
    """Threads that read manifests from remote filesystems (shared: starting threads per
    scan costs more than reading a small manifest)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(_MANIFEST_THREADS, thread_name_prefix="icecrypt-manifests")
        return _POOL


def _forget_pool_in_child() -> None:
    # A forked child inherits the pool object but none of its threads: work submitted
    # there would wait forever (multiprocessing with fork, a forking server, a test that
    # forks). The child starts a pool of its own when it first needs one.
    global _POOL, _POOL_LOCK
    _POOL = None
    _POOL_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_pool_in_child)


#: What a row filter string may say (PyIceberg's grammar), for the error a filter the
#: parser cannot read gets.
ROW_FILTER_FORMS = (
    "supported: <column> <op> <literal> with = == != <> < <= > >=, <column> BETWEEN <literal> AND <literal>, "
    "<column> [NOT] IN (<literal>, ...), <column> IS [NOT] NULL, <column> IS [NOT] NAN, "
    "<column> [NOT] LIKE 'prefix%', true, false, combined with AND, OR, NOT and parentheses "
    "(literals: numbers, 'strings', true/false; no arithmetic or functions)"
)


def parse_row_filter(row_filter: BooleanExpression | str | None) -> BooleanExpression:
    """A PyIceberg expression from an expression, a string such as
    ``"id > 5 and category = 'alpha'"`` (PyIceberg's parser), or None (all rows).

    A string the parser cannot read is a ``ValueError`` naming the filter, where it
    stopped, and the forms a filter may take (not pyparsing's own exception, whose
    message spells out the whole grammar)."""
    if row_filter is None:
        return AlwaysTrue()
    if isinstance(row_filter, BooleanExpression):
        return row_filter
    if isinstance(row_filter, str):
        from pyiceberg.expressions.parser import parse
        from pyparsing import ParseBaseException

        try:
            return parse(row_filter)
        except ParseBaseException as exc:  # its message lists the whole grammar: keep it short
            raise ValueError(
                f"cannot parse row filter {row_filter!r} (at character {exc.loc + 1}); {ROW_FILTER_FORMS}"
            ) from None
        except (ValueError, TypeError) as exc:
            raise ValueError(f"cannot parse row filter {row_filter!r}: {exc}; {ROW_FILTER_FORMS}") from None
    raise TypeError(f"row_filter must be a pyiceberg expression or a str, not {type(row_filter).__name__}")


@dataclasses.dataclass
class PlanMetrics:
    """What planning read and skipped (to see pruning at work)."""

    manifests: int = 0
    manifests_skipped: int = 0
    data_files: int = 0
    data_files_skipped: int = 0
    delete_files: int = 0
    tasks: int = 0


class _DeleteIndex:
    """Delete files of a snapshot, ready to be matched to data files."""

    def __init__(self, entries: Iterable[ManifestEntry], unpartitioned_specs: set[int]):
        self._dvs: dict[str, list[tuple[int, ContentFile]]] = defaultdict(list)
        self._pos_by_path: dict[str, list[tuple[int, ContentFile]]] = defaultdict(list)
        self._pos_by_partition: dict[tuple, list[tuple[int, ContentFile]]] = defaultdict(list)
        self._eq_by_partition: dict[tuple, list[tuple[int, ContentFile]]] = defaultdict(list)
        self._eq_global: list[tuple[int, ContentFile]] = []
        for entry in entries:
            file, seq = entry.file, entry.sequence_number
            if file.content == EQUALITY_DELETES:
                if file.spec_id in unpartitioned_specs:
                    self._eq_global.append((seq, file))
                else:
                    self._eq_by_partition[(file.spec_id, file.partition)].append((seq, file))
            elif file.is_dv:
                if file.referenced_data_file is None:
                    raise FormatError(f"deletion vector {file.file_path} has no referenced_data_file")
                self._dvs[file.referenced_data_file].append((seq, file))
            else:
                target = file.referenced_data_file or _single_path(file)
                if target is not None:
                    self._pos_by_path[target].append((seq, file))
                else:
                    self._pos_by_partition[(file.spec_id, file.partition)].append((seq, file))

    def __len__(self) -> int:
        return (
            sum(map(len, self._dvs.values()))
            + sum(map(len, self._pos_by_path.values()))
            + sum(map(len, self._pos_by_partition.values()))
            + sum(map(len, self._eq_by_partition.values()))
            + len(self._eq_global)
        )

    def for_data_file(self, entry: ManifestEntry) -> list[tuple[int, ContentFile]]:
        file, seq = entry.file, entry.sequence_number
        result: list[tuple[int, ContentFile]] = []
        dvs = [(s, d) for s, d in self._dvs.get(file.file_path, ()) if s >= seq]
        if len(dvs) > 1:
            raise FormatError(f"data file {file.file_path} has {len(dvs)} deletion vectors (at most one is allowed)")
        if dvs:
            result.extend(dvs)
        else:
            key = (file.spec_id, file.partition)
            for s, d in (*self._pos_by_path.get(file.file_path, ()), *self._pos_by_partition.get(key, ())):
                if s >= seq:
                    result.append((s, d))
        for s, d in (*self._eq_by_partition.get((file.spec_id, file.partition), ()), *self._eq_global):
            if s > seq:
                result.append((s, d))
        return result


def _single_path(file: ContentFile) -> str | None:
    """The data file a position delete file references, when its file_path bounds say
    it references exactly one (Java's ``ContentFileUtil.referencedDataFile``)."""
    from icecrypt.table.files.read import DELETE_FILE_PATH_ID

    lower = file.lower_bounds.get(DELETE_FILE_PATH_ID)
    upper = file.upper_bounds.get(DELETE_FILE_PATH_ID)
    if lower is not None and lower == upper:
        try:
            return bytes(lower).decode("utf-8")
        except UnicodeDecodeError:
            return None
    return None


class _Evaluators:
    """The pruning predicates of one scan, per partition spec."""

    def __init__(self, table: TableView, schema: Schema, row_filter: BooleanExpression, case_sensitive: bool):
        self.schema = schema
        self.row_filter = row_filter
        self.case_sensitive = case_sensitive
        self.specs = table.specs
        self.trivial = row_filter == AlwaysTrue()
        self._manifest: dict[int, Callable[[ManifestFile], bool]] = {}
        self._partition: dict[int, Callable[[tuple], bool]] = {}
        self._metrics = None if self.trivial else _InclusiveMetricsEvaluator(schema, row_filter, case_sensitive)
        self._widened = () if self.trivial else _widened_bounds(table, schema)

    def _projected(self, spec_id: int) -> BooleanExpression:
        # Java's truncate arithmetic: the partition values Java and icecrypt write
        return inclusive_projection(self.schema, java_spec(self.specs[spec_id]), self.case_sensitive)(self.row_filter)

    def manifest(self, manifest: ManifestFile) -> bool:
        if self.trivial:
            return True
        if manifest.spec_id not in self.specs:
            raise FormatError(f"manifest {manifest.path}: unknown partition spec id {manifest.spec_id}")
        evaluate = self._manifest.get(manifest.spec_id)
        if evaluate is None:
            evaluate = manifest_evaluator(self.specs[manifest.spec_id], self.schema, self._projected(manifest.spec_id), self.case_sensitive)
            self._manifest[manifest.spec_id] = evaluate
        return evaluate(manifest)

    def partition(self, file: ContentFile) -> bool:
        if self.trivial:
            return True
        evaluate = self._partition.get(file.spec_id)
        if evaluate is None:
            spec = self.specs[file.spec_id]
            partition_schema = Schema(*spec.partition_type(self.schema).fields)
            evaluate = expression_evaluator(partition_schema, self._projected(file.spec_id), self.case_sensitive)
            self._partition[file.spec_id] = evaluate
        return evaluate(_literal_form(file.partition))

    def metrics(self, file: ContentFile) -> bool:
        if self._metrics is None:
            return True
        for field_id, width in self._widened:
            # bounds written before a promotion whose stored form changed (date -> timestamp):
            # not comparable with the new type's, so the file is not pruned on them
            for bounds in (file.lower_bounds, file.upper_bounds):
                if bounds and field_id in bounds and len(bounds[field_id]) != width:
                    return True
        return self._metrics.eval(file)


def _literal_form(partition: tuple) -> tuple:
    """``partition`` as PyIceberg's bound literals hold values: a uuid as its 16 bytes
    (a UUIDLiteral's value), so an identity-partitioned uuid compares equal."""
    if not any(isinstance(v, uuid.UUID) for v in partition):
        return partition
    return tuple(v.bytes if isinstance(v, uuid.UUID) else v for v in partition)


def _widened_bounds(table: Any, schema: Schema) -> tuple[tuple[int, int], ...]:
    """(field id, bound width) of the timestamp columns of ``schema`` that an older schema
    of the table had as dates (format v3 promotion): their older files' bounds are dates."""
    from pyiceberg.types import DateType, TimestampNanoType, TimestampType

    timestamps = {f.field_id for f in schema._lazy_id_to_field.values()
                  if isinstance(f.field_type, (TimestampType, TimestampNanoType))}  # fmt: skip
    if not timestamps:
        return ()
    dates = {fid for old in table.model.schemas for fid, f in old._lazy_id_to_field.items()
             if fid in timestamps and isinstance(f.field_type, DateType)}  # fmt: skip
    return tuple((fid, 8) for fid in sorted(dates))


class TableScan:
    """A scan of one snapshot of an :class:`~icecrypt.table.EncryptedTable`.

    Create it with ``table.scan(...)``.  Planning happens once, on first use; the plan is
    kept.  ``to_arrow()`` reads everything into a table (tasks in parallel threads);
    ``to_batches()`` streams (one task at a time, memory bounded by a row group);
    ``plan_files()`` returns the picklable tasks for distributed readers.
    """

    def __init__(
        self,
        table: TableView,
        columns: Sequence[str] | None = None,
        row_filter: BooleanExpression | str | None = None,
        snapshot_id: int | None = None,
        *,
        as_of_timestamp: Any = None,
        branch: str | None = None,
        tag: str | None = None,
        case_sensitive: bool = True,
        split_size: int | None = None,
        batch_size: int | None = None,
        threads: int | None = None,
        _at: tuple[Snapshot | None, Schema] | None = None,
    ):
        self.table = table
        # as Java and PyIceberg: time travel reads with the snapshot's schema, the
        # current snapshot (and a branch) with the current schema (so evolution shows at once)
        # (``_at``: the snapshot and schema another scan of this table resolved)
        self.snapshot: Snapshot | None
        self.schema: Schema
        self.snapshot, self.schema = _at or resolve_read(
            table, snapshot_id=snapshot_id, as_of_timestamp=as_of_timestamp, branch=branch, tag=tag)
        self.row_filter = parse_row_filter(row_filter)
        self.case_sensitive = case_sensitive
        if self.row_filter != AlwaysTrue():
            # unknown columns fail here, not in a worker; metadata columns may be named
            lineage = table.format_version >= LINEAGE_FORMAT_VERSION
            filter_ids = extract_field_ids(bind(filter_schema(self.schema, lineage=lineage), self.row_filter, case_sensitive))
        else:
            filter_ids = set()
        # pruning by partition values and statistics knows nothing of metadata columns
        self._prune_filter = without_metadata(self.row_filter, self.schema)
        self.projected = _project(self.schema, columns, case_sensitive, table.specs, table.format_version)
        projected_ids = {f.field_id for f in self.projected.fields}
        # row positions are counted from a file's start: its Avro files are then not split
        self._needs_positions = bool((projected_ids | filter_ids) & {ROW_ID.field_id, ROW_POSITION.field_id})
        self._partition_names = None
        if PARTITION_ID in projected_ids:
            self._partition_names = {f.field_id: f.name for f in partition_type(table.specs, self.schema).fields}
        self.split_size = split_size or int(table.properties.get(SPLIT_SIZE_PROPERTY, DEFAULT_SPLIT_SIZE))
        if self.split_size <= 0:
            raise ValueError(f"split_size must be positive, not {self.split_size}")
        self.threads = threads
        self.read_spec = ReadSpec(
            schema=self.schema,
            projected=self.projected,
            row_filter=self.row_filter,
            case_sensitive=case_sensitive,
            encrypted=table.encrypted,
            name_mapping=table.properties.get("schema.name-mapping.default"),
            **({"batch_size": batch_size} if batch_size else {}),
        )
        self.metrics = PlanMetrics()
        self._tasks: list[FileScanTask] | None = None
        #: directories this scan's planning found free of symbolic links (Locations.to_fs_path)
        self._verified_directories: set[str] = set()

    @property
    def arrow_schema(self) -> pa.Schema:
        """The schema of what the scan returns."""
        return arrow_schema(self.projected)

    # --- planning ---------------------------------------------------------------------------

    def plan_files(self) -> list[FileScanTask]:
        """The file scan tasks of this scan (planned once)."""
        if self._tasks is None:
            self._tasks = list(self.plan_tasks())
        return list(self._tasks)

    def plan_tasks(self) -> Iterator[FileScanTask]:
        """The file scan tasks of this scan, streamed: delete manifests are read first
        (every data file needs the whole delete index), then the data manifests one at a
        time, so memory holds the delete index and one manifest, not the whole plan.
        ``metrics`` is complete once the iterator is exhausted.  (After ``plan_files()``,
        the kept plan is returned instead.)"""
        if self._tasks is not None:
            yield from self._tasks
            return
        metrics = self.metrics = PlanMetrics()
        if self.snapshot is None:
            return
        table = self.table
        evaluators = _Evaluators(table, self.schema, self._prune_filter, self.case_sensitive)
        data_manifests: list[ManifestFile] = []
        delete_manifests: list[ManifestFile] = []
        for manifest in table.manifests(self.snapshot):
            metrics.manifests += 1
            if not evaluators.manifest(manifest):
                metrics.manifests_skipped += 1
            else:
                (delete_manifests if manifest.is_deletes else data_manifests).append(manifest)

        deletes: list[ManifestEntry] = []
        for manifest, found in self._read_manifests(delete_manifests):
            deletes.extend(entry for entry in self._checked(manifest, found) if evaluators.partition(entry.file))
        unpartitioned = {spec_id for spec_id, spec in table.specs.items() if spec.is_unpartitioned()}
        index = _DeleteIndex(deletes, unpartitioned)
        metrics.delete_files = len(index)
        del deletes

        for manifest, found in self._read_manifests(data_manifests):
            for entry in self._checked(manifest, found):
                metrics.data_files += 1
                if not (evaluators.partition(entry.file) and evaluators.metrics(entry.file)):
                    metrics.data_files_skipped += 1
                    continue
                for task in self._tasks_for(entry, index.for_data_file(entry)):
                    metrics.tasks += 1
                    yield task

    @staticmethod
    def _checked(manifest: ManifestFile, entries: Iterable[ManifestEntry]) -> Iterator[ManifestEntry]:
        for entry in entries:
            if manifest.is_deletes != (entry.file.content != DATA):
                raise FormatError(f"manifest {manifest.path}: {entry.file.file_path} does not match the manifest's content type")
            yield entry

    def _read_manifests(
        self, manifests: list[ManifestFile], *, include_deleted: bool = False,
    ) -> Iterator[tuple[ManifestFile, Iterable[ManifestEntry]]]:
        """``(manifest, entries)`` in order.  Local files: the entries are decoded as they
        are consumed (one entry at a time, however large a merged manifest is).  Object
        stores: up to ``_MANIFEST_THREADS`` manifests are fetched and decoded ahead in the
        shared pool (to hide latency) — a bounded window, so memory stays flat however
        many manifests the snapshot has.  ``include_deleted``: DELETED entries too (for
        the changelog)."""
        table = self.table
        partition_types: dict[int, Any] = {}  # by spec id, computed once for this scan's schema

        def read(manifest: ManifestFile) -> Iterator[ManifestEntry]:
            return read_manifest(manifest, table.locations, table.specs, self.schema, encrypted=table.encrypted,
                                 include_deleted=include_deleted, partition_types=partition_types)

        def entries(manifest: ManifestFile) -> list[ManifestEntry]:
            return list(read(manifest))

        if len(manifests) <= 1 or isinstance(table.filesystem, pafs.LocalFileSystem):
            for manifest in manifests:
                yield manifest, read(manifest)
            return
        pool = _manifest_pool()
        window: collections.deque = collections.deque()
        pending = iter(manifests)
        try:
            for manifest in itertools.islice(pending, _MANIFEST_THREADS):
                window.append((manifest, pool.submit(entries, manifest)))
            while window:
                manifest, future = window.popleft()
                found = future.result()
                following = next(pending, None)
                if following is not None:
                    window.append((following, pool.submit(entries, following)))
                yield manifest, found
        finally:
            for _, future in window:
                future.cancel()

    def _task_file(self, file: ContentFile, sequence_number: int) -> TaskFile:
        return TaskFile(
            path=file.file_path,
            fs_path=self.table.locations.to_fs_path(file.file_path, verified=self._verified_directories),
            file_format=file.file_format,
            content=file.content,
            record_count=file.record_count,
            file_size_in_bytes=file.file_size_in_bytes,
            sequence_number=sequence_number,
            key_metadata=None if file.key_metadata is None else (file.key_metadata_bytes or file.key_metadata.encode()),
            equality_ids=file.equality_ids,
            referenced_data_file=file.referenced_data_file,
            content_offset=file.content_offset,
            content_size_in_bytes=file.content_size_in_bytes,
        )

    def _tasks_for(self, entry: ManifestEntry, deletes: list[tuple[int, ContentFile]]) -> Iterator[FileScanTask]:
        file = entry.file
        task_file = self._task_file(file, entry.sequence_number)
        delete_files = tuple(self._task_file(d, s) for s, d in deletes)
        constants = self._constants(file)
        has_positions = self._needs_positions or any(d.content != EQUALITY_DELETES for _, d in deletes)
        for start, length in self._splits(file, has_positions=has_positions):
            yield FileScanTask(
                file=task_file,
                start=start,
                length=length,
                deletes=delete_files,
                spec_id=file.spec_id,
                partition=file.partition,
                constants=constants,
                read=self.read_spec,
                first_row_id=file.first_row_id,
            )

    def _constants(self, file: ContentFile) -> dict[int, Any]:
        """Identity-partition values by source field id (for columns a file lacks), and
        the file's ``_partition`` value (by name) if the scan projects it."""
        spec = self.table.specs[file.spec_id]
        constants: dict[int, Any] = {
            field.source_id: value
            for field, value in zip(spec.fields, file.partition)
            if isinstance(field.transform, IdentityTransform) and value is not None
        }
        if self._partition_names is not None:
            values = {name: None for name in self._partition_names.values()}
            for field, value in zip(spec.fields, file.partition):
                if field.field_id in self._partition_names:
                    values[self._partition_names[field.field_id]] = value
            constants[PARTITION_ID] = values
        return constants

    def _splits(self, file: ContentFile, *, has_positions: bool) -> list[tuple[int, int]]:
        target = self.split_size
        if file.file_format == "PARQUET":
            size = file.file_size_in_bytes
            offsets = file.split_offsets
            if size <= target or not offsets or list(offsets) != sorted(offsets) or offsets[-1] >= size:
                return [(0, size)]
            bounds = [*offsets, size]
            splits, start = [], bounds[0]
            for i in range(1, len(bounds)):
                if bounds[i] - start >= target or i == len(bounds) - 1:
                    splits.append((start, bounds[i] - start))
                    start = bounds[i]
            splits[0] = (0, splits[0][0] + splits[0][1])  # the first split starts at the file's start
            return splits
        if file.file_format == "AVRO":
            if file.key_metadata is not None:
                from icecrypt.avro import plaintext_size

                size = plaintext_size(file.key_metadata)
            else:
                size = file.file_size_in_bytes
            if size <= target or has_positions or file.key_metadata is None:
                return [(0, size)]
            return [(start, min(target, size - start)) for start in range(0, size, target)]
        raise FormatError(f"data file {file.file_path}: unsupported format {file.file_format}")

    # --- reading --------------------------------------------------------------------------------

    def to_batches(self) -> pa.RecordBatchReader:
        """A streaming reader of the scan's rows (one task at a time, planned as it goes)."""
        tasks = self.plan_tasks()
        filesystem = self.table.locations.filesystem

        def generate() -> Iterator[pa.RecordBatch]:
            cache: dict = {}
            for task in tasks:
                yield from read_task(task, filesystem, cache=cache)

        return pa.RecordBatchReader.from_batches(self.arrow_schema, generate())

    def to_arrow(self) -> pa.Table:
        """All rows of the scan as one table (tasks read in parallel, in plan order)."""
        tasks = self.plan_files()
        filesystem = self.table.locations.filesystem
        cache: dict = {}
        if len(tasks) <= 1 or self.threads == 1:
            batches = [b for task in tasks for b in read_task(task, filesystem, cache=cache)]
        else:
            _preload_deletes(tasks, filesystem, cache)
            workers = self.threads or min(os.cpu_count() or 2, len(tasks))  # Arrow decodes in its own pool too
            with ThreadPoolExecutor(workers) as pool:
                parts = list(pool.map(lambda t: list(read_task(t, filesystem, cache=cache)), tasks))
            batches = [b for part in parts for b in part]
        return pa.Table.from_batches(batches, schema=self.arrow_schema)

    def count(self) -> int:
        """The number of live rows matching the filter (reads no column it does not need)."""
        return sum(b.num_rows for b in TableScan(
            self.table, [], self.row_filter, case_sensitive=self.case_sensitive, _at=(self.snapshot, self.schema),
        ).to_batches())

    def __repr__(self) -> str:
        snap = self.snapshot.snapshot_id if self.snapshot else None
        return f"<TableScan snapshot={snap} columns={[f.name for f in self.projected.fields]} filter={self.row_filter}>"


def _preload_deletes(tasks: list[FileScanTask], filesystem: Any, cache: dict) -> None:
    """Load each delete file once, before tasks share the cache from several threads."""
    seen: set[str] = set()
    for task in tasks:
        paths = {d.path for d in task.deletes}
        if not paths <= seen:
            seen |= paths
            load_deletes(task, filesystem, cache)


def _project(
    schema: Schema,
    columns: Sequence[str] | None,
    case_sensitive: bool,
    specs: Mapping[int, PartitionSpec] | None = None,
    format_version: int = LINEAGE_FORMAT_VERSION,
) -> Schema:
    """The output schema: all columns, or the named ones in the order given (nested
    names like ``"a.b"`` select parts of structs, in schema order, metadata columns
    after them).  A name the table schema does not have may be a metadata column
    (``_file``, ``_pos``, ``_row_id``, ...; see :mod:`._metadata_columns`)."""
    if columns is None:
        return schema
    if isinstance(columns, str):
        raise TypeError("columns must be a sequence of column names, not a str")
    columns = list(columns)
    if not columns:
        return Schema(schema_id=schema.schema_id)

    def key(name: str) -> str:
        return name if case_sensitive else name.lower()

    # a table column hides the metadata column of its name, compared ignoring case (as in
    # row filters, where a case-insensitive match must have one candidate)
    own = {f.name.lower() for f in schema.fields}
    metadata: dict[str, NestedField] = {}
    for name in columns:
        if name.lower() in own:
            continue
        field = metadata_field(name, specs or {}, schema, case_sensitive=case_sensitive)
        if field is None:
            continue
        if field in LINEAGE and format_version < LINEAGE_FORMAT_VERSION:
            raise ValueError(f"column {name!r}: row lineage exists in format-version {LINEAGE_FORMAT_VERSION} tables, "
                             f"this one is format-version {format_version}")
        metadata[name] = field
    data_columns = [c for c in columns if c not in metadata]
    try:
        selected = schema.select(*data_columns, case_sensitive=case_sensitive) if data_columns else Schema()
    except ValueError as exc:
        raise ValueError(f"unknown column in {columns}: {exc}") from None
    if all("." not in c for c in data_columns):
        by_name = {key(f.name): f for f in selected.fields}
        fields = [metadata[c] if c in metadata else by_name[key(c)] for c in dict.fromkeys(columns)]
    else:
        fields = [*selected.fields, *(metadata[c] for c in dict.fromkeys(columns) if c in metadata)]
    unique = list({f.field_id: f for f in reversed(fields)}.values())[::-1]  # first of each field id
    return Schema(*unique, schema_id=schema.schema_id)

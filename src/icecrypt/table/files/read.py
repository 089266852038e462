"""Reading one planned file scan task: data file, deletes, projection, row filter.

:func:`read_task` is what Spark executors (and :class:`~icecrypt.table.TableScan`) call.
A task is self-contained and picklable: it carries the paths of its data file and of the
delete files that apply to it, each with its key metadata, the byte range to read, the
schema and the row filter.  Keys travel inside the task, as in Iceberg Java, and never
appear in its repr.

Per task: the deleted positions (deletion vectors, position delete files) and the
equality delete keys are loaded first; then the data file is read row group by row group
(Parquet, natively encrypted) or Avro block by block (AGS1), only the columns needed
(projection, filter, equality keys), mapped to the table schema by field id, and deleted
and non-matching rows are dropped.  Memory is bounded by one row group (or Avro split
batch) plus the deletes.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyiceberg.expressions import (
    AlwaysTrue,
    BooleanExpression,
    BoundLiteralPredicate,
    BoundReference,
    BoundSetPredicate,
)
from pyiceberg.expressions.literals import FixedLiteral
from pyiceberg.expressions.visitors import bind, extract_field_ids, visit
from pyiceberg.schema import Schema, prune_columns
from pyiceberg.types import DateType, FixedType, LongType, NestedField, StringType, UUIDType

from icecrypt.errors import FormatError
from icecrypt.keys import StandardKeyMetadata
from icecrypt.table.files.deletes import (
    decode_deletion_vector,
    deleted_mask,
    equality_delete_mask,
    read_dv_blob,
)
from icecrypt.table.files.io import PlaintextFileError, reading
from icecrypt.table.files.manifest import DATA, EQUALITY_DELETES
from icecrypt.table.model.metadata_columns import (
    FILE_PATH,
    IS_DELETED,
    LINEAGE,
    PARTITION_ID,
    ROW_ID,
    ROW_POSITION,
    SPEC_ID,
    RebuildingVisitor,
    filter_schema,
    is_metadata,
    without_metadata,
)
from icecrypt.table.model.schema import arrow_storage_type, arrow_write_schema

__all__ = ["FileScanTask", "ReadSpec", "TaskFile", "arrow_schema", "read_task"]

FIELD_ID = b"PARQUET:field_id"
#: reserved field ids of position delete files (Iceberg spec "Reserved Field IDs")
DELETE_FILE_PATH_ID = 2147483546
DELETE_POS_ID = 2147483545
DEFAULT_BATCH_SIZE = 65536


def arrow_schema(schema: Schema) -> pa.Schema:
    """The Arrow schema scans return for ``schema``: field ids in each field's
    ``PARQUET:field_id`` metadata, nullability from ``required``, 32-bit offsets — the
    schema the write path writes data files with, so what is written reads back equal."""
    return arrow_write_schema(schema)


@dataclasses.dataclass(frozen=True)
class ReadSpec:
    """What every task of one scan reads: the snapshot's ``schema``, the ``projected``
    output schema (columns in output order), the unbound ``row_filter``, and whether the
    table is encrypted (a file without key metadata is then refused)."""

    schema: Schema
    projected: Schema
    row_filter: BooleanExpression
    case_sensitive: bool
    encrypted: bool
    name_mapping: str | None = None
    batch_size: int = DEFAULT_BATCH_SIZE


@dataclasses.dataclass(frozen=True)
class TaskFile:
    """A data or delete file as a task reads it.  ``path`` is the location recorded in
    the manifest (for messages and for matching position deletes), ``fs_path`` the path
    on the filesystem.  ``key_metadata`` is the encoded StandardKeyMetadata (None only in
    plaintext tables) and never shown."""

    path: str
    fs_path: str
    file_format: str
    content: int
    record_count: int
    file_size_in_bytes: int
    sequence_number: int
    key_metadata: bytes | None = dataclasses.field(repr=False)
    equality_ids: tuple[int, ...] | None = None
    referenced_data_file: str | None = None
    content_offset: int | None = None
    content_size_in_bytes: int | None = None

    @property
    def is_dv(self) -> bool:
        return self.file_format == "PUFFIN"

    def key(self) -> StandardKeyMetadata | None:
        return None if self.key_metadata is None else StandardKeyMetadata.decode(self.key_metadata)


@dataclasses.dataclass(frozen=True)
class FileScanTask:
    """One unit of scan work: the part ``[start, start + length)`` of a data file (a
    byte range of the stored Parquet file, whose row groups starting in it are read, or
    of the decrypted Avro bytes), with the delete files that apply to it.

    ``constants`` holds identity-partition values by source field id (columns a data file
    does not store), and under ``PARTITION_ID`` the file's ``_partition`` value when the
    scan projects it.  ``first_row_id`` is the data file's (inherited from its manifest as
    the spec says; None before row lineage): with ``file.sequence_number`` (the data
    sequence number) it gives the rows that do not store their lineage their
    ``_row_id`` and ``_last_updated_sequence_number``.  Picklable; ``read_task`` runs it
    anywhere.
    """

    file: TaskFile
    start: int
    length: int
    deletes: tuple[TaskFile, ...]
    spec_id: int
    partition: tuple
    constants: Mapping[int, Any]
    read: ReadSpec = dataclasses.field(repr=False)
    first_row_id: int | None = None

    @property
    def whole_file(self) -> bool:
        return self.start == 0 and self.length >= self._full_length()

    def _full_length(self) -> int:
        if self.file.file_format == "AVRO" and self.file.key_metadata is not None:
            from icecrypt.avro import plaintext_size

            return plaintext_size(self.file.key())
        return self.file.file_size_in_bytes


# --- schema projection --------------------------------------------------------------------------


def _field_id(field: pa.Field) -> int | None:
    raw = (field.metadata or {}).get(FIELD_ID)
    return int(raw) if raw is not None else None


def _file_field_ids(source: pa.Schema, name_mapping: str | None, what: str) -> list[int | None]:
    """Field ids of the top-level columns of a data file: from the file, else from the
    table's name mapping (``schema.name-mapping.default``)."""
    ids = [_field_id(f) for f in source]
    if all(i is not None for i in ids) or not len(ids):
        return ids
    if name_mapping is None:
        raise FormatError(f"{what} has columns without field ids and the table has no schema.name-mapping.default")
    from pyiceberg.table.name_mapping import parse_mapping_from_json

    by_name = {name: mapped.field_id for mapped in parse_mapping_from_json(name_mapping) for name in mapped.names}
    return [i if i is not None else by_name.get(f.name) for i, f in zip(ids, source)]


def _scalar(value: Any, arrow_type: pa.DataType, field: NestedField, what: str) -> pa.Scalar:
    try:
        return pa.scalar(value, type=arrow_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
        raise FormatError(f"{what}: value {value!r} of column {field.name!r} (field id {field.field_id}) does not fit "
                          f"{field.field_type} ({exc})") from None


class _Projector:
    """Maps batches of a file's columns to a target schema by field id: renames, type
    promotion (int -> long, float -> double, decimal precision, date -> timestamp),
    identity-partition constants, and for columns the file lacks their
    ``initial-default`` (format v3) or nulls."""

    def __init__(self, source: pa.Schema, target: Schema, constants: Mapping[int, Any], name_mapping: str | None, what: str):
        self.target = arrow_schema(target)
        ids = _file_field_ids(source, name_mapping, what)
        by_id = {fid: i for i, fid in enumerate(ids) if fid is not None}
        self.columns: list[str] = []
        self._plan: list[tuple[str, Any]] = []
        for field, target_field in zip(target.fields, self.target):
            index = by_id.get(field.field_id)
            if index is None:
                value = constants.get(field.field_id)
                if value is None:  # a column added later: its v3 initial-default, if any
                    value = field.initial_default
                if value is not None:
                    self._plan.append(("const", _scalar(value, target_field.type, field, what)))
                elif field.optional:
                    self._plan.append(("null", target_field.type))
                else:
                    raise FormatError(f"{what} lacks required column {field.name!r} (field id {field.field_id})")
                continue
            source_field = source.field(index)
            self.columns.append(source_field.name)
            self._plan.append(("col", (source_field.name, self._converter(source_field, field, target_field, what))))

    @staticmethod
    def _converter(source_field: pa.Field, field: NestedField, target_field: pa.Field, what: str) -> Any:
        source_type, target_type = source_field.type, target_field.type
        if source_type.equals(target_type, check_metadata=False):
            return None
        if isinstance(target_type, pa.BaseExtensionType) and source_type.equals(target_type.storage_type):
            return lambda array: pa.ExtensionArray.from_storage(target_type, array)
        if field.field_type.is_primitive:
            if is_metadata(field) and not pa.types.is_integer(source_type):
                # row lineage is stored as longs; anything else is not lineage
                raise FormatError(f"{what}: column {source_field.name!r} (field id {field.field_id}) is {source_type}, "
                                  f"not {field.field_type}")

            def cast(array: pa.Array) -> pa.Array:
                try:
                    return array.cast(target_type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                    raise FormatError(f"{what}: column {source_field.name!r} (field id {field.field_id}) cannot be read "
                                      f"as {field.field_type} ({exc})") from None

            return cast
        # nested types that differ (evolved structs, renamed children): PyIceberg's projection
        from pyiceberg.io.pyarrow import _to_requested_schema, pyarrow_to_schema

        try:
            file_schema = pyarrow_to_schema(pa.schema([source_field]), format_version=3)
        except ValueError as exc:
            raise FormatError(f"{what}: column {source_field.name!r} cannot be mapped to the table schema ({exc})") from None
        requested = Schema(field)

        def convert(array: pa.Array) -> pa.Array:
            batch = pa.RecordBatch.from_arrays([array], schema=pa.schema([source_field]))
            return _to_requested_schema(requested, file_schema, batch).column(0).cast(target_type)

        return convert

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        n = batch.num_rows
        if not self._plan:
            return batch.select([])  # no columns, but the row count
        arrays = []
        for kind, arg in self._plan:
            if kind == "col":
                name, convert = arg
                array = batch.column(name)
                arrays.append(array if convert is None else convert(array))
            elif kind == "const":
                arrays.append(pa.repeat(arg, n))
            else:
                arrays.append(pa.nulls(n, type=arg))
        return pa.RecordBatch.from_arrays(arrays, schema=self.target)


# --- data files ------------------------------------------------------------------------------------


def _open_parquet(file: TaskFile, fs: pafs.FileSystem, encrypted: bool) -> pq.ParquetFile:
    if encrypted:
        from icecrypt import parquet

        return parquet.open_file(file.fs_path, file.key(), filesystem=_base_filesystem(fs))
    source = fs.open_input_file(file.fs_path)
    try:
        if source.read_at(4, 0) == b"PARE":
            raise FormatError(f"{file.path} is an encrypted Parquet file, but the table has no encryption.key-id")
        return pq.ParquetFile(source)
    except BaseException:
        source.close()
        raise


def _base_filesystem(fs: pafs.FileSystem) -> pafs.FileSystem | None:
    return None if isinstance(fs, pafs.LocalFileSystem) else fs


def _row_group_start(rg: pq.RowGroupMetaData) -> int:
    """Where a row group starts in the file (Iceberg's split offsets are these)."""
    column = rg.column(0)
    if column.has_dictionary_page and column.dictionary_page_offset:
        return min(column.dictionary_page_offset, column.data_page_offset)
    return column.data_page_offset


class _RowGroupMetrics:
    """The statistics of one row group, shaped like a manifest entry's metrics (what
    PyIceberg's metrics evaluator reads): counts, and bounds in Iceberg's single-value
    serialization, for the top-level primitive columns of the table schema."""

    def __init__(self, rg: pq.RowGroupMetaData, columns: Mapping[str, NestedField]):
        from pyiceberg.io.pyarrow import StatsAggregator
        from pyiceberg.types import DecimalType
        from pyiceberg.utils.decimal import unscaled_to_decimal

        self.record_count = rg.num_rows
        self.value_counts: dict[int, int] = {}
        self.null_value_counts: dict[int, int] = {}
        self.nan_value_counts: dict[int, int] = {}
        self.lower_bounds: dict[int, bytes] = {}
        self.upper_bounds: dict[int, bytes] = {}
        for index in range(rg.num_columns):
            column = rg.column(index)
            field = columns.get(column.path_in_schema)
            if field is None or not column.is_stats_set:
                continue
            stats = column.statistics
            try:
                if stats.has_null_count:
                    self.null_value_counts[field.field_id] = stats.null_count
                self.value_counts[field.field_id] = column.num_values
                if not stats.has_min_max:
                    continue
                bounds = StatsAggregator(field.field_type, stats.physical_type)
                if isinstance(field.field_type, DecimalType) and stats.physical_type != "FIXED_LEN_BYTE_ARRAY":
                    bounds.update_min(unscaled_to_decimal(stats.min_raw, field.field_type.scale))
                    bounds.update_max(unscaled_to_decimal(stats.max_raw, field.field_type.scale))
                else:
                    bounds.update_min(stats.min)
                    bounds.update_max(stats.max)
                lower, upper = bounds.min_as_bytes(), bounds.max_as_bytes()
            except (ValueError, TypeError, NotImplementedError, pa.ArrowException):
                continue  # statistics this reader cannot use: the row group is not pruned on them
            if lower is not None and upper is not None:
                self.lower_bounds[field.field_id] = lower
                self.upper_bounds[field.field_id] = upper


def _row_group_filter(task: FileScanTask, source: pa.Schema, read_schema: Schema) -> Any:
    """A predicate on row-group metadata: False when the row group's statistics show that
    no row can match the task's filter (None when there is no filter)."""
    spec = task.read
    row_filter = without_metadata(spec.row_filter, spec.schema)
    if row_filter == AlwaysTrue():
        return None
    from pyiceberg.expressions.visitors import _InclusiveMetricsEvaluator

    ids = _file_field_ids(source, spec.name_mapping, task.file.path)
    columns = {}
    for field, field_id in zip(source, ids):
        if field_id is not None and pa.types.is_primitive(field.type):
            try:
                table_field = spec.schema.find_field(field_id)
            except ValueError:
                continue
            if table_field.field_type.is_primitive and not (
                pa.types.is_date(field.type) and not isinstance(table_field.field_type, DateType)
            ):  # a date promoted to a timestamp: its statistics are dates, not used for pruning
                columns[field.name] = table_field
    evaluator = _InclusiveMetricsEvaluator(spec.schema, row_filter, spec.case_sensitive, include_empty_files=True)
    return lambda rg: evaluator.eval(_RowGroupMetrics(rg, columns))


def _parquet_batches(task: FileScanTask, fs: pafs.FileSystem, target: Schema) -> Iterator[tuple[pa.RecordBatch, int]]:
    """(batch in the target schema, position of its first row in the file).  Row groups
    outside the task's byte range, or whose statistics rule the filter out, are skipped."""
    file = task.file
    pf = _open_parquet(file, fs, task.read.encrypted)
    try:
        meta = pf.metadata
        if meta.num_rows != file.record_count:
            raise FormatError(f"{file.path} holds {meta.num_rows} rows, its manifest entry says {file.record_count}")
        project = _Projector(pf.schema_arrow, target, task.constants, task.read.name_mapping, file.path)
        might_match = _row_group_filter(task, pf.schema_arrow, target)
        whole = task.whole_file
        end = task.start + task.length
        first_row = 0
        for index in range(meta.num_row_groups):
            rg = meta.row_group(index)
            if (whole or task.start <= _row_group_start(rg) < end) and (might_match is None or might_match(rg)):
                position = first_row
                for batch in pf.iter_batches(
                    batch_size=task.read.batch_size, row_groups=[index], columns=project.columns, use_threads=True
                ):
                    yield project(batch), position
                    position += batch.num_rows
            first_row += rg.num_rows
    finally:
        pf.close()


def _avro_batches(task: FileScanTask, fs: pafs.FileSystem, target: Schema) -> Iterator[tuple[pa.RecordBatch, int]]:
    file = task.file
    if task.read.encrypted:
        from icecrypt import avro

        km = file.key()
        base = _base_filesystem(fs)
        project = _Projector(avro.read_schema(file.fs_path, km, filesystem=base), target, task.constants, task.read.name_mapping, file.path)
        batches = avro.read_split(
            file.fs_path, km, task.start, task.length, filesystem=base, columns=project.columns, batch_size=task.read.batch_size
        )
    else:
        project, batches = _plain_avro(file, fs, target, task)
    position = 0  # planned tasks with position deletes cover the whole file
    for batch in batches:
        yield project(batch), position
        position += batch.num_rows


def _plain_avro(file: TaskFile, fs: pafs.FileSystem, target: Schema, task: FileScanTask) -> tuple[_Projector, Iterator[pa.RecordBatch]]:
    """A plaintext Avro data file (plaintext tables only), read whole through the reader
    and checks of an encrypted one (schema, per-block budgets)."""
    from icecrypt.avro import _AvroFile

    try:
        avro_file = _AvroFile.unencrypted(file.fs_path, fs)
    except FormatError as exc:
        with fs.open_input_file(file.fs_path) as stream:
            if stream.read(4) == b"AGS1":  # not an Avro header: say why
                raise FormatError(f"{file.path} is encrypted (AGS1), but the table has no encryption.key-id") from exc
        raise
    try:
        project = _Projector(avro_file.arrow_schema(), target, task.constants, task.read.name_mapping, file.path)
    except BaseException:
        avro_file.close()
        raise

    def generate() -> Iterator[pa.RecordBatch]:
        with avro_file:
            yield from avro_file.batches(project.columns, task.read.batch_size)

    return project, generate()


def _file_batches(task: FileScanTask, fs: pafs.FileSystem, target: Schema) -> Iterator[tuple[pa.RecordBatch, int]]:
    fmt = task.file.file_format
    if fmt == "PARQUET":
        return _parquet_batches(task, fs, target)
    if fmt == "AVRO":
        return _avro_batches(task, fs, target)
    raise FormatError(f"{task.file.path}: unsupported data file format {fmt}")


# --- deletes --------------------------------------------------------------------------------------


def _check_key(file: TaskFile, encrypted: bool) -> None:
    if encrypted and file.key_metadata is None:
        raise PlaintextFileError(f"delete file {file.path} has no key metadata, but the table is encrypted (refused)")


def _dv_positions(dv: TaskFile, fs: pafs.FileSystem, encrypted: bool) -> np.ndarray:
    if dv.content_offset is None or dv.content_size_in_bytes is None:
        raise FormatError(f"deletion vector {dv.path}: manifest entry lacks content_offset/content_size_in_bytes")
    with reading("deletion vector file", dv.path, fs, dv.fs_path, encrypted=encrypted):
        with fs.open_input_file(dv.fs_path) as source:
            km = dv.key() if encrypted else None
            if not encrypted and source.read_at(4, 0) == b"AGS1":
                raise FormatError(f"{dv.path} is encrypted (AGS1), but the table has no encryption.key-id")
            blob = read_dv_blob(source, dv.content_offset, dv.content_size_in_bytes, key=km, name=dv.path)
        return decode_deletion_vector(blob, dv.path, expected_cardinality=dv.record_count)


def _delete_file_table(file: TaskFile, fs: pafs.FileSystem, schema: Schema, encrypted: bool) -> pa.Table:
    """A position or equality delete file's rows in ``schema`` (by field id)."""
    task = FileScanTask(
        file=file, start=0, length=file.file_size_in_bytes, deletes=(), spec_id=0, partition=(), constants={},
        read=ReadSpec(schema=schema, projected=schema, row_filter=AlwaysTrue(), case_sensitive=True, encrypted=encrypted),
    )
    what = "position delete file" if file.content != EQUALITY_DELETES else "equality delete file"
    with reading(what, file.path, fs, file.fs_path, encrypted=encrypted):
        batches = [batch for batch, _ in _file_batches(task, fs, schema)]
    return pa.Table.from_batches(batches, schema=arrow_schema(schema))


_POSITION_DELETE_SCHEMA = Schema(
    NestedField(DELETE_FILE_PATH_ID, "file_path", StringType(), required=True),
    NestedField(DELETE_POS_ID, "pos", LongType(), required=True),
)


def _positions(task: FileScanTask, fs: pafs.FileSystem, cache: dict | None) -> np.ndarray | None:
    """Sorted deleted row positions of the task's data file, or None."""
    encrypted = task.read.encrypted
    dvs = [d for d in task.deletes if d.content != EQUALITY_DELETES and d.is_dv]
    files = [d for d in task.deletes if d.content != EQUALITY_DELETES and not d.is_dv]
    parts = []
    for dv in dvs:
        _check_key(dv, encrypted)
        parts.append(_cached(cache, ("dv", dv.path, dv.content_offset), lambda dv=dv: _dv_positions(dv, fs, encrypted)))
    for file in files:
        _check_key(file, encrypted)
        table = _cached(cache, ("pos", file.path), lambda file=file: _delete_file_table(file, fs, _POSITION_DELETE_SCHEMA, encrypted))
        mine = table.filter(pc.equal(table.column("file_path"), task.file.path))
        parts.append(mine.column("pos").to_numpy())
    if not parts:
        return None
    positions = (np.concatenate(parts) if len(parts) > 1 else parts[0]).astype(np.int64, copy=False)
    if len(parts) > 1 or not bool(np.all(positions[1:] > positions[:-1])):  # a lone DV: sorted, unique
        positions = np.unique(positions)
    return positions if len(positions) else None


def _equality_deletes(task: FileScanTask, fs: pafs.FileSystem, cache: dict | None) -> list[tuple[tuple[int, ...], pa.Table]]:
    result = []
    for file in task.deletes:
        if file.content != EQUALITY_DELETES:
            continue
        _check_key(file, task.read.encrypted)
        ids = file.equality_ids or ()
        if not ids:
            raise FormatError(f"equality delete file {file.path} has no equality_ids")
        try:
            schema = prune_columns(task.read.schema, set(ids), select_full_types=True)
        except ValueError as exc:
            raise FormatError(f"equality delete file {file.path}: {exc}") from None
        order = {fid: i for i, fid in enumerate(ids)}
        schema = Schema(*sorted(schema.fields, key=lambda f: order[f.field_id]))
        table = _cached(cache, ("eq", file.path), lambda file=file, schema=schema: _delete_file_table(file, fs, schema, task.read.encrypted))
        result.append((tuple(f.field_id for f in schema.fields), table))
    return result


def _cached(cache: dict | None, key: tuple, load: Any) -> Any:
    if cache is None:
        return load()
    if key not in cache:
        cache[key] = load()
    return cache[key]


# --- tasks --------------------------------------------------------------------------------------------


def load_deletes(task: FileScanTask, filesystem: pafs.FileSystem, cache: dict) -> None:
    """Load the deletes of ``task`` into ``cache`` (see :func:`read_task`)."""
    _positions(task, filesystem, cache)
    _equality_deletes(task, filesystem, cache)


def read_task(task: FileScanTask, filesystem: pafs.FileSystem | None = None, *, cache: dict | None = None) -> Iterator[pa.RecordBatch]:
    """The rows of ``task`` that are live (not deleted) and match its row filter, in the
    scan's projected schema, as record batches.

    ``filesystem`` holds the stored files (None = local).  ``cache`` (any dict, owned by
    the caller) shares loaded deletes between tasks of one scan.  Every file is
    authenticated as it is read; errors name the file.  Metadata columns in the
    projection (``_file``, ``_pos``, ``_row_id``, ...) are filled in per row; with
    ``_deleted`` projected, rows removed by deletes are kept and marked (as Iceberg Java
    does), the row filter still applies.
    """
    if task.file.content != DATA:
        raise ValueError(f"{task.file.path} is not a data file")
    fs = filesystem if filesystem is not None else pafs.LocalFileSystem()
    spec = task.read
    if spec.encrypted and task.file.key_metadata is None:
        raise PlaintextFileError(f"data file {task.file.path} has no key metadata, but the table is encrypted (refused)")
    has_filter = spec.row_filter != AlwaysTrue()
    filter_ids: set[int] = set()
    filtered: list[NestedField] = []  # metadata columns the filter names
    if has_filter:
        searchable = filter_schema(spec.schema)
        filter_ids = extract_field_ids(bind(searchable, spec.row_filter, spec.case_sensitive))
        filtered = [f for f in searchable.fields if is_metadata(f) and f.field_id in filter_ids]
    metadata = _MetadataValues.of(task, filtered)
    positions = _positions(task, fs, cache)
    equality = _equality_deletes(task, fs, cache)
    read_ids = {i for f in spec.projected.fields if not is_metadata(f) for i in _nested_ids(f)} | filter_ids
    for ids, _ in equality:
        read_ids |= set(ids)
    read_schema = _top_level(spec.schema, read_ids)
    if metadata is not None and metadata.lineage:
        read_schema = Schema(*read_schema.fields, *LINEAGE, schema_id=read_schema.schema_id)
    batch_schema = read_schema if metadata is None else metadata.schema(read_schema)
    arrow_filter = None
    if has_filter:
        from pyiceberg.io.pyarrow import expression_to_pyarrow

        bound = bind(batch_schema, spec.row_filter, spec.case_sensitive)
        uuid_columns = [f.name for f in batch_schema.fields if isinstance(f.field_type, UUIDType)]
        if uuid_columns:
            bound = visit(bound, _UuidAsFixed())
        arrow_filter = expression_to_pyarrow(bound, batch_schema)
    output = _Projector(arrow_schema(batch_schema), spec.projected, {}, None, task.file.path)
    names = {f.field_id: f.name for f in read_schema.fields}
    mark_deleted = metadata is not None and metadata.mark_deleted

    with reading("data file", task.file.path, fs, task.file.fs_path, encrypted=spec.encrypted):
        for batch, first in _file_batches(task, fs, read_schema):
            n = batch.num_rows
            keep = deleted_mask(positions, first, n) if positions is not None else None
            for ids, deletes in equality:
                hit = equality_delete_mask(pa.table([batch.column(names[i]) for i in ids], names=[names[i] for i in ids]), deletes)
                if hit.any():
                    keep = ~hit if keep is None else keep & ~hit
            if metadata is not None:
                batch = metadata.add(batch, first, keep)
            if keep is not None and not mark_deleted:
                batch = batch.filter(pa.array(keep))
            if arrow_filter is not None and batch.num_rows:
                batch = _filter(batch, arrow_filter, uuid_columns)
            if batch.num_rows:
                yield output(batch)


class _UuidAsFixed(RebuildingVisitor):
    """A bound filter whose predicates on uuid columns compare the 16 bytes as
    ``fixed[16]``: Arrow has no compute kernel for its uuid extension type, so the rows
    are filtered on the columns' storage (see :func:`_filter`)."""

    def visit_bound_predicate(self, predicate: Any) -> BooleanExpression:
        ref = predicate.term.ref()
        if not isinstance(ref.field.field_type, UUIDType):
            return predicate
        field = NestedField(ref.field.field_id, ref.field.name, FixedType(16), required=ref.field.required)
        term = BoundReference(field, ref.accessor)
        if isinstance(predicate, BoundSetPredicate):
            return type(predicate)(term, {FixedLiteral(lit.value) for lit in predicate.literals})
        if isinstance(predicate, BoundLiteralPredicate):
            return type(predicate)(term, FixedLiteral(predicate.literal.value))
        return type(predicate)(term)


def _filter(batch: pa.RecordBatch, arrow_filter: Any, uuid_columns: list[str]) -> pa.RecordBatch:
    """The rows of ``batch`` that ``arrow_filter`` keeps; uuid columns are compared on
    their storage (the 16 bytes), for which the filter was written."""
    if not uuid_columns:
        return batch.filter(arrow_filter)
    columns = [c.storage if n in uuid_columns and isinstance(c.type, pa.BaseExtensionType) else c
               for n, c in zip(batch.schema.names, batch.columns)]  # fmt: skip
    view = pa.RecordBatch.from_arrays([*columns, pa.array(range(batch.num_rows), pa.int64())],
                                      names=[*batch.schema.names, "\0row"])  # fmt: skip
    return batch.take(view.filter(arrow_filter).column("\0row"))


class _MetadataValues:
    """The metadata columns a task's projection asks for, computed per batch of the data
    file: lineage inherited where the file stores none (``_row_id`` = the file's
    ``first_row_id`` + position, ``_last_updated_sequence_number`` = its data sequence
    number), positions counted in the file before any delete is applied."""

    def __init__(self, task: FileScanTask, fields: list[NestedField]) -> None:
        self.task = task
        self.fields = fields
        ids = {f.field_id for f in fields}
        self.lineage = bool(ids & {f.field_id for f in LINEAGE})
        self.mark_deleted = IS_DELETED.field_id in ids
        self.needs_positions = bool(ids & {ROW_ID.field_id, ROW_POSITION.field_id})
        # the columns appended to a batch of the read schema (lineage is read, then filled)
        self.extra = [f for f in fields if f.field_id not in {g.field_id for g in LINEAGE}]
        self._arrow = arrow_schema(Schema(*self.extra)) if self.extra else None
        self._partition = None
        if PARTITION_ID in ids:
            self._partition = _partition_scalar(task, self._arrow.field(self._arrow.get_field_index("_partition")).type)
        file = task.file
        if self.needs_positions and file.file_format == "AVRO" and task.start > 0:
            # a split's rows cannot be numbered without reading the file from its start
            raise ValueError(
                f"{file.path}: the task reads an Avro split starting at byte {task.start}, whose row positions are "
                "unknown; plan the scan with _pos or _row_id projected (its Avro files are then not split)"
            )

    @classmethod
    def of(cls, task: FileScanTask, filtered: list[NestedField]) -> _MetadataValues | None:
        """The metadata columns the task projects, and those its row filter names
        (``filtered``), or None."""
        fields = [f for f in task.read.projected.fields if is_metadata(f)]
        fields += [f for f in filtered if f.field_id not in {g.field_id for g in fields}]
        return cls(task, fields) if fields else None

    def schema(self, read_schema: Schema) -> Schema:
        """The schema of the batches :meth:`add` returns."""
        return Schema(*read_schema.fields, *self.extra, schema_id=read_schema.schema_id)

    def add(self, batch: pa.RecordBatch, first: int, keep: np.ndarray | None) -> pa.RecordBatch:
        n = batch.num_rows
        task = self.task
        positions = pa.array(np.arange(first, first + n, dtype=np.int64)) if self.needs_positions else None
        arrays = list(batch.columns)
        if self.lineage:  # the last two columns of the read schema
            row_ids, sequence_numbers = arrays[-2], arrays[-1]
            if positions is not None and row_ids.null_count and task.first_row_id is not None:
                try:
                    inherited = pc.add_checked(positions, pa.scalar(task.first_row_id, pa.int64()))
                except (pa.ArrowInvalid, OverflowError):  # a first_row_id no table reaches: never wrap around
                    raise FormatError(f"data file {task.file.path}: first_row_id {task.first_row_id} + row positions "
                                      "overflow a long") from None
                row_ids = pc.coalesce(row_ids, inherited)
            if sequence_numbers.null_count:
                sequence_numbers = pc.coalesce(sequence_numbers, pa.scalar(task.file.sequence_number, pa.int64()))
            arrays[-2], arrays[-1] = row_ids, sequence_numbers
        if self._arrow is None:
            return pa.RecordBatch.from_arrays(arrays, schema=batch.schema)
        for field, target in zip(self.extra, self._arrow):
            fid = field.field_id
            if fid == FILE_PATH.field_id:
                arrays.append(pa.repeat(pa.scalar(task.file.path, target.type), n))
            elif fid == ROW_POSITION.field_id:
                arrays.append(positions)
            elif fid == IS_DELETED.field_id:
                arrays.append(pa.array(np.zeros(n, dtype=bool) if keep is None else ~keep))
            elif fid == SPEC_ID.field_id:
                arrays.append(pa.repeat(pa.scalar(task.spec_id, target.type), n))
            else:  # _partition
                arrays.append(pa.repeat(self._partition, n))
        return pa.RecordBatch.from_arrays(arrays, schema=pa.schema([*batch.schema, *self._arrow]))


def _partition_scalar(task: FileScanTask, struct_type: pa.StructType) -> pa.Scalar:
    """The task's ``_partition`` value (planned into its constants) as an Arrow scalar."""
    value = task.constants.get(PARTITION_ID) or {}
    try:
        # Arrow builds no uuid from Python values: the 16 bytes on the storage type, cast
        storage = arrow_storage_type(struct_type)
        if storage == struct_type:
            return pa.scalar(value, type=struct_type)
        plain = {k: v.bytes if isinstance(v, uuid.UUID) else v for k, v in value.items()}
        return pa.scalar(plain, type=storage).cast(struct_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as exc:
        raise FormatError(f"{task.file.path}: partition value {value!r} does not fit {struct_type} ({exc})") from None


def _top_level(schema: Schema, ids: set[int]) -> Schema:
    """The top-level columns of ``schema`` that hold any of ``ids`` (whole), in order."""
    fields = []
    for field in schema.fields:
        if field.field_id in ids or (not field.field_type.is_primitive and ids & _nested_ids(field)):
            fields.append(field)
    return Schema(*fields, schema_id=schema.schema_id)


def _nested_ids(field: NestedField) -> set[int]:
    return set(Schema(field).field_ids)

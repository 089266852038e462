"""Add existing Parquet files to a plaintext table as they are (Iceberg's ``add_files``).

The files are not read beyond their footers and not rewritten: each becomes a data file
of one new ``append`` snapshot, with the row count, column statistics and partition its
footer gives, or the partition values its caller names (a Hive-style directory's
``col=value``).  The files carry no field ids; the table reads them by column name
through its name mapping (``schema.name-mapping.default``), which the commit sets from
the current schema when the table has none, as Iceberg's procedure does.

What is refused, before anything is committed (``AddFilesError``, naming the file):
- any file of an **encrypted** table: an added file is stored as it is, in plaintext, and
  every file of an encrypted table is sealed (write the rows instead: ``append``, or SQL
  ``INSERT INTO``, encrypts them);
- a file outside the table's directories (``location``, ``write.data.path``): a table
  reads nothing else (``PathOutsideTableError``);
- a file that is not plaintext Parquet, that has field ids (written for another Iceberg
  table: its ids could mean other columns here), whose columns the table does not have or
  whose types it cannot read as its own;
- a partition the footer cannot tell: the statistics of a partition source column span
  more than one partition, or are missing;
- with ``check_duplicate_files``, a file the current snapshot already holds, or one named
  twice.

The caller's files are never deleted, whatever fails: only the manifests the commit
wrote are.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import posixpath
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    LongType,
    StringType,
    TimestampType,
    TimestamptzType,
)

from icecrypt.errors import FormatError
from icecrypt.table.files.manifest import read_manifest
from icecrypt.table.files.manifest_write import to_internal
from icecrypt.table.ops.schema import NAME_MAPPING

__all__ = ["AddFilesError", "AddFilesResult", "HIVE_DEFAULT_PARTITION", "SourceFile", "add_files", "list_files"]

#: the directory value Hive and Spark write for a null partition value
HIVE_DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"


class AddFilesError(FormatError):
    """A file ``add_files`` was given cannot become a data file of the table as it is
    (the message names the file and why); nothing was committed."""


@dataclasses.dataclass(frozen=True)
class SourceFile:
    """A file of a Hive-style directory (:func:`list_files`): its location and the text
    values of its ``col=value`` directories (unescaped by :func:`add_files`)."""

    location: str
    partition: dict[str, str | None]


@dataclasses.dataclass(frozen=True)
class AddFilesResult:
    snapshot_id: int | None  # the new snapshot (None: no file was given)
    added_files: int
    changed_partitions: int


def add_files(
    table: Any,
    files: Iterable[str],
    *,
    partition_values: Mapping[str, Mapping[str, str | None]] | None = None,
    check_duplicate_files: bool = True,
    branch: str | None = None,
) -> AddFilesResult:
    """Commit the Parquet ``files`` (locations as the table records them: paths or URIs
    under the table's directories) as one append snapshot of ``branch`` (default main).

    ``partition_values``: for a file (by its location as given), the values of the
    table's identity partition columns as text, as a Hive-style directory holds them
    (``{"region": "eu"}``; None or ``__HIVE_DEFAULT_PARTITION__`` for null).  Partition
    fields without a given value come from the file's statistics."""
    from icecrypt.table.ops.write import _Target, _write_ref, append_files

    if isinstance(files, str):
        raise TypeError("files must be a collection of locations, not a single string")
    files = list(files)
    if table.encrypted:
        raise AddFilesError(
            f"{table.location}: the table is encrypted, and add_files adds files as they are, in plaintext; an "
            "encrypted table holds sealed files only (write the rows instead: append, or INSERT INTO ... SELECT); "
            "nothing was added"
        )
    if not files:
        return AddFilesResult(table.current_snapshot_id, 0, 0)
    partition_values = dict(partition_values or {})
    unknown = sorted(set(partition_values) - set(files))
    if unknown:
        raise ValueError(f"partition_values names files that are not added: {', '.join(unknown)}")
    _, base = _Target.of(table).latest()
    _write_ref(base, branch, None)  # refused before any footer is read
    schema = table.schema
    spec = table.spec
    mapping = table.properties.get(NAME_MAPPING) or _mapping_of(schema)
    by_path: dict[str, str] = {}
    records = []
    for location in files:
        if not isinstance(location, str) or not location:
            raise TypeError(f"files: {location!r} is not a location")
        path = table.fs_path(location, what="added file")
        if check_duplicate_files and path in by_path:
            raise AddFilesError(f"{location}: named twice (as {by_path[path]} too); nothing was added")
        by_path[path] = location
        records.append(_record(table, location, path, schema, spec, mapping, partition_values.get(location)))
    if check_duplicate_files:
        held = _current_files(table) & set(by_path)
        if held:
            names = ", ".join(sorted(by_path[p] for p in held)[:5])
            raise AddFilesError(f"{names}: already data files of the table's current snapshot ({len(held)} of the "
                                "files given); nothing was added (check_duplicate_files=False adds them again)")
    properties = None if NAME_MAPPING in table.properties else {NAME_MAPPING: mapping}
    snapshot_id = append_files(table, records, branch=branch, keep_data_files=True, properties=properties)
    partitions = {tuple(sorted(r["partition"].items(), key=lambda kv: kv[0])) for r in records}
    return AddFilesResult(snapshot_id, len(records), len(partitions) if spec.fields else 0)


def _mapping_of(schema: Any) -> str:
    from pyiceberg.table.name_mapping import create_mapping_from_schema

    return create_mapping_from_schema(schema).model_dump_json()


def _current_files(table: Any) -> set[str]:
    """The normalized paths of the data files the current snapshot holds."""
    snapshot = table.current_snapshot()
    if snapshot is None:
        return set()
    paths = set()
    for manifest in table.manifests(snapshot):
        for entry in read_manifest(manifest, table.locations, table.specs, table.schema, encrypted=False):
            paths.add(table.locations.normalized_fs_path(entry.file.file_path))
    return paths


def _record(table: Any, location: str, path: str, schema: Any, spec: Any, mapping: str,
            given: Mapping[str, str | None] | None) -> dict[str, Any]:
    from pyiceberg.io.pyarrow import (
        MetricModeTypes,
        MetricsMode,
        data_file_statistics_from_parquet_metadata,
        parquet_path_to_id_mapping,
    )
    from pyiceberg.table.name_mapping import parse_mapping_from_json

    from icecrypt.table.files.write_data import _statistics_plan, data_file_record, drop_nan_bounds

    metadata, size = _footer(table.filesystem, location, path)
    arrow_schema = metadata.schema.to_arrow_schema()
    if any(f.metadata and b"PARQUET:field_id" in f.metadata for f in arrow_schema):
        raise AddFilesError(f"{location}: its columns have field ids (a file written for an Iceberg table, whose ids "
                            "may mean other columns here); add_files takes files without them; nothing was added")
    arrow_schema = _spark_timestamps(metadata, arrow_schema, schema)
    _check_schema(location, schema, arrow_schema, parse_mapping_from_json(mapping))
    plan = _statistics_plan(schema, table.properties)
    name_ids = parquet_path_to_id_mapping(schema)
    for i in range(metadata.num_columns):  # INT96 has no order Iceberg's bounds could keep: counts only
        column = metadata.schema.column(i)
        if column.physical_type == "INT96" and column.path in name_ids and name_ids[column.path] in plan:
            collector = plan[name_ids[column.path]]
            plan[name_ids[column.path]] = dataclasses.replace(collector, mode=MetricsMode(MetricModeTypes.COUNTS))
    try:
        statistics = data_file_statistics_from_parquet_metadata(metadata, plan, name_ids)
    except (KeyError, ValueError) as exc:
        raise AddFilesError(f"{location}: its footer's statistics cannot be read as the table's columns ({exc}); "
                            "nothing was added") from None
    stats = statistics.to_serialized_dict()
    stats = {
        "column_sizes": _records(stats["column_sizes"]), "value_counts": _records(stats["value_counts"]),
        "null_value_counts": _records(stats["null_value_counts"]), "nan_value_counts": None,
        "lower_bounds": _records(stats["lower_bounds"]), "upper_bounds": _records(stats["upper_bounds"]),
        "split_offsets": stats["split_offsets"] or None,
    }  # fmt: skip
    drop_nan_bounds(stats, schema)
    partition = _partition(location, schema, spec, statistics, metadata, arrow_schema, given)
    return data_file_record(location, "PARQUET", partition, metadata.num_rows, size, None, stats, 0)


def _records(values: Mapping[int, Any]) -> list[dict[str, Any]] | None:
    return [{"key": k, "value": v} for k, v in sorted(values.items())] or None


def _footer(filesystem: pafs.FileSystem, location: str, path: str) -> tuple[pq.FileMetaData, int]:
    info = filesystem.get_file_info(path)
    if info.type != pafs.FileType.File:
        what = "does not exist" if info.type == pafs.FileType.NotFound else "is not a file"
        raise AddFilesError(f"{location}: {what}; nothing was added")
    with filesystem.open_input_file(path) as f:
        size = f.size()
        head = f.read(4)
        f.seek(max(size - 4, 0))
        tail = f.read(4)
        if head == b"PARE" or tail == b"PARE":
            raise AddFilesError(f"{location}: an encrypted Parquet file (its own keys, unknown here); add_files takes "
                                "plaintext Parquet files; nothing was added")
        if size < 12 or head != b"PAR1" or tail != b"PAR1":
            raise AddFilesError(f"{location}: not a Parquet file (add_files takes Parquet files); nothing was added")
        f.seek(0)
        try:
            return pq.read_metadata(f), size
        except ValueError as exc:  # (an I/O error is an OSError: it propagates as it is)
            raise AddFilesError(f"{location}: its Parquet footer cannot be read ({exc}); nothing was added") from None


def _spark_timestamps(metadata: pq.FileMetaData, arrow_schema: Any, schema: Any) -> Any:
    """``arrow_schema`` with each top-level INT96 column (Spark's default timestamp
    encoding, which Arrow reads as nanoseconds) typed as the table's timestamp column of
    that name: INT96 holds an instant, which Iceberg's readers read as a timestamp."""
    import pyarrow as pa

    int96 = {metadata.schema.column(i).path for i in range(metadata.num_columns)
             if metadata.schema.column(i).physical_type == "INT96"}
    fields = []
    for field in arrow_schema:
        target = None
        if field.name in int96 and pa.types.is_timestamp(field.type):
            try:
                target = schema.find_field(field.name).field_type
            except ValueError:
                target = None
        if isinstance(target, TimestamptzType):
            field = field.with_type(pa.timestamp("us", tz="UTC"))
        elif isinstance(target, TimestampType):
            field = field.with_type(pa.timestamp("us"))
        fields.append(field)
    return pa.schema(fields, metadata=arrow_schema.metadata)


def _check_schema(location: str, schema: Any, arrow_schema: Any, mapping: Any) -> None:
    """The file's columns must all be the table's (by name) and of types the table reads
    as its own; the table's required columns must be in it."""
    from pyiceberg.io.pyarrow import _check_schema_compatible, pyarrow_to_schema

    try:
        provided = pyarrow_to_schema(arrow_schema, name_mapping=mapping, format_version=3)
    except ValueError:
        known = set(schema._name_to_id)
        extra = sorted({f.name for f in arrow_schema} - {n.split(".")[0] for n in known})
        detail = f"columns the table does not have: {', '.join(extra)}" if extra else "nested fields the table lacks"
        raise AddFilesError(f"{location}: {detail}; nothing was added (add the columns to the table first)") from None
    try:
        _check_schema_compatible(schema, provided)
    except ValueError as exc:
        raise AddFilesError(f"{location}: its columns do not match the table's ({exc}); nothing was added") from None


def _partition(location: str, schema: Any, spec: Any, statistics: Any, metadata: pq.FileMetaData, arrow_schema: Any,
               given: Mapping[str, str | None] | None) -> dict[str, Any]:
    given = dict(given or {})
    identity = {schema.find_column_name(f.source_id): f for f in spec.fields if isinstance(f.transform, IdentityTransform)}
    unknown = sorted(set(given) - set(identity))
    if unknown:
        raise AddFilesError(f"{location}: partition values for {', '.join(unknown)}, which the table's spec does not "
                            "partition by identity; nothing was added")
    values: dict[str, Any] = {}
    for field in spec.fields:
        source = schema.find_field(field.source_id)
        column = schema.find_column_name(field.source_id)
        if column in given:
            values[field.name] = _parse(location, column, given[column], source.field_type)
            continue
        if field.source_id in statistics.column_aggregates:
            try:
                values[field.name] = to_internal(statistics._partition_value(field, schema),
                                                 field.transform.result_type(source.field_type))
            except ValueError as exc:
                raise AddFilesError(f"{location}: partition field {field.name!r}: {exc}; nothing was added") from None
            continue
        if column not in arrow_schema.names:
            raise AddFilesError(f"{location}: partition field {field.name!r}: the file has no column {column!r} and "
                                "no value of it was given (a Hive-style col=value directory gives one: add the "
                                "directory); nothing was added")
        if not _all_null(metadata, column):
            raise AddFilesError(f"{location}: partition field {field.name!r}: the footer has no statistics of "
                                f"column {column!r} to tell its partition from; nothing was added")
        values[field.name] = None  # the column holds only nulls: so is its partition value
    return values


def _all_null(metadata: pq.FileMetaData, column: str) -> bool:
    nulls = 0
    for group in range(metadata.num_row_groups):
        rg = metadata.row_group(group)
        for i in range(rg.num_columns):
            chunk = rg.column(i)
            if chunk.path_in_schema == column:
                if chunk.statistics is None or not chunk.statistics.has_null_count:
                    return False
                nulls += chunk.statistics.null_count
    return nulls == metadata.num_rows


def _parse(location: str, column: str, text: str | None, field_type: IcebergType) -> Any:
    """A Hive-style directory's partition value (escaped as Hive escapes it) as the
    column's internal value."""
    if text is None or text == HIVE_DEFAULT_PARTITION:
        return None
    text = urllib.parse.unquote(text)
    try:
        if isinstance(field_type, (IntegerType, LongType)):
            return int(text)
        if isinstance(field_type, StringType):
            return text
        if isinstance(field_type, BooleanType):
            if text.lower() not in ("true", "false"):
                raise ValueError("not true or false")
            return text.lower() == "true"
        if isinstance(field_type, DateType):
            return to_internal(datetime.date.fromisoformat(text), field_type)
        if isinstance(field_type, DecimalType):
            value = decimal.Decimal(text)
            if not value.is_finite():
                raise ValueError("not a finite decimal")
            return value.quantize(decimal.Decimal(1).scaleb(-field_type.scale))
        if isinstance(field_type, (FloatType, DoubleType)):
            return float(text)
        if isinstance(field_type, (TimestampType, TimestamptzType)):
            value = datetime.datetime.fromisoformat(text)
            if isinstance(field_type, TimestamptzType) and value.tzinfo is None:
                value = value.replace(tzinfo=datetime.timezone.utc)
            return to_internal(value, field_type)
        if isinstance(field_type, BinaryType):
            return text.encode()
    except (ValueError, decimal.InvalidOperation) as exc:
        raise AddFilesError(f"{location}: partition value {text!r} of column {column!r} is not a {field_type} ({exc}); "
                            "nothing was added") from None
    raise AddFilesError(f"{location}: partition column {column!r} of type {field_type} cannot be given as a "
                        "directory value; nothing was added")


def list_files(filesystem: pafs.FileSystem, root: str, directory: str, columns: tuple[str, ...] | None,
               partition_filter: Mapping[str, str] | None, registered: frozenset[str] | None = None) -> list[SourceFile]:
    """The Parquet files under ``directory`` (a location; ``root`` its path on
    ``filesystem``), with partition columns ``columns`` (None: as the directories name
    them); with ``registered`` (a catalog table's partitions), only the files of those
    partitions (a directory the catalog does not register is not the table's).  Hidden
    files (``_SUCCESS``, ``.crc``) are skipped; a file at another depth than the
    partition columns, or under a directory that is not ``col=value`` of them, is refused,
    naming it, rather than guessed at."""
    base = directory.rstrip("/")
    info = filesystem.get_file_info(root)
    if info.type != pafs.FileType.Directory:
        raise ValueError(f"{directory}: not a directory of files to add")
    found: list[tuple[str, tuple[str, ...]]] = []
    for entry in filesystem.get_file_info(pafs.FileSelector(root, recursive=True)):
        relative = posixpath.relpath(entry.path, root)
        parts = tuple(relative.split("/"))
        if any(p.startswith(("_", ".")) for p in parts) or entry.type != pafs.FileType.File:
            continue  # Spark's and Hadoop's hidden files (_SUCCESS, .crc), and directories
        found.append((relative, parts[:-1]))
    if columns is None:  # a directory: its partition columns as its directories name them
        depths = {len(dirs) for _, dirs in found}
        if len(depths) > 1:
            raise ValueError(f"{directory}: files at different depths ({sorted(depths)} directories down); a source's "
                             "files are all in its root or all under col=value directories")
        columns = tuple(d.split("=", 1)[0] for d in found[0][1]) if found else ()
    unknown = sorted(set(partition_filter or {}) - set(columns))
    if unknown:
        raise ValueError(f"partition_filter names {', '.join(unknown)}, which the source is not partitioned by "
                         f"({', '.join(columns) or 'not partitioned'})")
    files = []
    for relative, dirs in sorted(found):
        names = tuple(d.split("=", 1)[0] for d in dirs)
        if names != columns or any("=" not in d for d in dirs):
            raise ValueError(f"{base}/{relative}: not under directories {'/'.join(c + '=...' for c in columns) or '(none)'}"
                             " of the source's partition columns")
        if registered is not None and "/".join(dirs) not in registered:
            continue
        values = {c: d.split("=", 1)[1] for c, d in zip(columns, dirs)}
        if any(urllib.parse.unquote(values[c]) != str(v) for c, v in (partition_filter or {}).items()):
            continue
        files.append(SourceFile(f"{base}/{relative}", values))
    return files

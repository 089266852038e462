"""Data files of an append: Arrow rows in, encrypted Parquet (or Avro) files and their
manifest ``data_file`` records out.

Rows are conformed to the table schema (columns by name, field ids attached), split by
partition (vectorized transforms; PyIceberg's own transform for anything else, applied
to distinct values only), buffered per partition into row groups and rolled into a new
file once a file holds about ``target_file_size`` bytes of Arrow data (the in-memory
size is the measure, as in PyIceberg; compressed files come out smaller).

Each file gets a fresh DEK and AAD prefix; its key metadata, with ``file_length``, goes
into the manifest entry (field 131).  Column statistics follow Iceberg's metrics modes
(``write.metadata.metrics.default``, default ``truncate(16)``): value, null and NaN
counts and lower/upper bounds in Iceberg's single-value binary form, per field id.
For Parquet they come from the footer the writer produced (PyIceberg's
``data_file_statistics_from_parquet_metadata``), for Avro from the Arrow data.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.sorting import NullOrder, SortDirection, SortOrder
from pyiceberg.transforms import (
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    VoidTransform,
    YearTransform,
)
from pyiceberg.types import (
    BinaryType,
    DateType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    LongType,
    PrimitiveType,
    StringType,
    TimestampNanoType,
    TimestampType,
    TimestamptzNanoType,
    TimestamptzType,
    TimeType,
)

from icecrypt.errors import FormatError
from icecrypt.parquet import _AtomicTarget  # the one output target of Parquet writers
from icecrypt.table.files.layout import WriteLayout, partition_path
from icecrypt.table.files.manifest_write import DATA, to_internal
from icecrypt.table.model.metadata_columns import LINEAGE
from icecrypt.table.files.write_io import TableIO
from icecrypt.table.model.schema import arrow_storage, arrow_write_schema
from icecrypt.table.model.transforms import truncate_integers
from icecrypt.table.files.zorder import ZOrder, struct_path_ids

__all__ = ["DataWriteOptions", "conform", "iter_batches", "write_data_files"]

DEFAULT_TARGET_FILE_SIZE = 512 * 1024 * 1024  # write.target-file-size-bytes (Java's default)
DEFAULT_ROW_GROUP_SIZE = 128 * 1024 * 1024  # write.parquet.row-group-size-bytes
_FORMATS = ("parquet", "avro")


def _int_property(properties: dict[str, str], name: str, default: int) -> int:
    raw = properties.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"table property {name}={raw!r} is not an integer") from None
    if value <= 0:
        raise ValueError(f"table property {name}={raw!r} must be positive")
    return value


@dataclass(frozen=True)
class DataWriteOptions:
    """How data files are written (from table properties, overridable per call)."""

    file_format: str
    target_file_size: int
    row_group_size: int
    parquet_options: dict[str, Any]
    avro_codec: str

    @classmethod
    def from_properties(
        cls, properties: dict[str, str], *, file_format: str | None = None, target_file_size: int | None = None
    ) -> DataWriteOptions:
        fmt = (file_format or properties.get("write.format.default", "parquet")).lower()
        if fmt not in _FORMATS:
            raise ValueError(f"file_format must be 'parquet' or 'avro', not {fmt!r}")
        target = target_file_size or _int_property(properties, "write.target-file-size-bytes", DEFAULT_TARGET_FILE_SIZE)
        if target <= 0:
            raise ValueError(f"target_file_size must be positive, not {target}")
        row_group = _int_property(properties, "write.parquet.row-group-size-bytes", DEFAULT_ROW_GROUP_SIZE)
        codec = properties.get("write.parquet.compression-codec", "zstd").lower()
        parquet_options: dict[str, Any] = {"compression": "none" if codec == "uncompressed" else codec}
        if "write.parquet.compression-level" in properties:
            parquet_options["compression_level"] = int(properties["write.parquet.compression-level"])
        if "write.parquet.page-size-bytes" in properties:
            parquet_options["data_page_size"] = _int_property(properties, "write.parquet.page-size-bytes", 0)
        if "write.parquet.dict-size-bytes" in properties:
            parquet_options["dictionary_pagesize_limit"] = _int_property(properties, "write.parquet.dict-size-bytes", 0)
        if "write.parquet.page-row-limit" in properties:
            parquet_options["write_batch_size"] = _int_property(properties, "write.parquet.page-row-limit", 0)
        avro_codec = properties.get("write.avro.compression-codec", "gzip").lower()
        avro_codec = {"gzip": "deflate", "uncompressed": "null"}.get(avro_codec, avro_codec)
        return cls(fmt, target, min(row_group, target), parquet_options, avro_codec)


# --- input -------------------------------------------------------------------------------


def iter_batches(data: Any) -> Iterator[pa.RecordBatch]:
    """Record batches of a Table, RecordBatch, RecordBatchReader or iterable of batches."""
    if isinstance(data, pa.Table):
        yield from data.to_batches()
    elif isinstance(data, pa.RecordBatch):
        yield data
    elif isinstance(data, pa.RecordBatchReader):
        yield from data
    elif isinstance(data, Iterable) and not isinstance(data, (str, bytes, dict)):
        for batch in data:
            if isinstance(batch, pa.Table):
                yield from batch.to_batches()
            elif isinstance(batch, pa.RecordBatch):
                yield batch
            else:
                raise TypeError(f"expected pyarrow RecordBatches, got {type(batch).__name__}")
    else:
        raise TypeError(
            f"append data must be a pyarrow Table, RecordBatch, RecordBatchReader or batches, not {type(data).__name__}"
        )


def conform(batch: pa.RecordBatch, target: pa.Schema, defaults: dict[str, Any] | None = None) -> pa.RecordBatch:
    """``batch`` with the table's columns in schema order, types and field ids.

    Columns are matched by name; a missing column with a ``write-default`` (format v3,
    ``defaults`` by column name) holds that value; a missing optional column becomes nulls; a missing
    required column, an unknown column, nulls in a required column or a lossy cast are
    errors (ValueError), so nothing that the table's schema forbids is written.
    """
    names = set(batch.schema.names)
    unknown = names - set(target.names)
    if unknown:
        raise ValueError(f"columns not in the table schema: {sorted(unknown)}")
    columns = []
    for field in target:
        if field.name in names:
            column = batch.column(field.name)
            if column.type != field.type:
                try:
                    column = column.cast(field.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise ValueError(f"column {field.name!r}: cannot write {column.type} as {field.type} ({exc})") from None
        elif defaults and defaults.get(field.name) is not None:
            column = pa.repeat(pa.scalar(defaults[field.name], type=field.type), batch.num_rows)
        elif field.nullable:
            column = pa.nulls(batch.num_rows, field.type)
        else:
            raise ValueError(f"required column {field.name!r} is missing")
        if not field.nullable and column.null_count:
            raise ValueError(f"required column {field.name!r} holds {column.null_count} null(s)")
        columns.append(column)
    return pa.RecordBatch.from_arrays(columns, schema=target)


# --- partition transforms ----------------------------------------------------------------


def _floordiv(values: pa.Array, divisor: int) -> pa.Array:
    quotient = pc.divide(values, divisor)  # truncates toward zero
    inexact = pc.and_(pc.less(values, 0), pc.not_equal(pc.multiply(quotient, divisor), values))
    return pc.if_else(inexact, pc.subtract(quotient, 1), quotient)


def _micros(values: pa.Array, field_type: IcebergType) -> pa.Array:
    raw = values.cast(pa.int64())
    if isinstance(field_type, (TimestampNanoType, TimestamptzNanoType)):
        return _floordiv(raw, 1000)
    return raw


def _transform_array(transform: Transform, source_type: IcebergType, values: pa.Array) -> pa.Array:
    """The partition values of ``values`` (internal representation where it matters)."""
    if isinstance(transform, IdentityTransform):
        return values
    if isinstance(transform, VoidTransform):
        return pa.nulls(len(values))
    temporal = (DateType, TimestampType, TimestamptzType, TimestampNanoType, TimestamptzNanoType)
    if isinstance(transform, (YearTransform, MonthTransform)) and isinstance(source_type, temporal):
        years = pc.subtract(pc.year(values), 1970)
        if isinstance(transform, YearTransform):
            return years.cast(pa.int32())
        return pc.add(pc.multiply(years, 12), pc.subtract(pc.month(values), 1)).cast(pa.int32())
    if isinstance(transform, DayTransform) and isinstance(source_type, temporal):
        if isinstance(source_type, DateType):
            return values.cast(pa.int32())
        return _floordiv(_micros(values, source_type), 86_400_000_000).cast(pa.int32())
    if isinstance(transform, HourTransform) and isinstance(source_type, temporal[1:]):
        return _floordiv(_micros(values, source_type), 3_600_000_000).cast(pa.int32())
    if isinstance(transform, TruncateTransform):
        width = transform.width
        if isinstance(source_type, (IntegerType, LongType)):
            return truncate_integers(values, width)  # Java's wrapping arithmetic (model.transforms)
        if isinstance(source_type, StringType):
            return pc.utf8_slice_codeunits(values, 0, width)
        if isinstance(source_type, BinaryType):
            return pc.binary_slice(values, 0, width)
    return _transform_distinct(transform, source_type, values)


def _transform_distinct(transform: Transform, source_type: IcebergType, values: pa.Array) -> pa.Array:
    """PyIceberg's scalar transform, applied once per distinct value."""
    encoded = pc.dictionary_encode(arrow_storage(values))  # a uuid: its 16 bytes
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.combine_chunks()
    function = transform.transform(source_type)
    results = [function(to_internal(v, source_type)) if v is not None else None for v in encoded.dictionary.to_pylist()]
    mapped = pa.array(results)
    return mapped.take(encoded.indices)


def table_sort_order(metadata: dict[str, Any]) -> SortOrder | None:
    """The table's default sort order (None when unsorted).  FormatError (naming the
    table) for an order no writer can follow: an unknown transform, a bucket count or
    truncate width below 1, a transform that cannot apply to its source column."""
    order_id = metadata.get("default-sort-order-id", 0)
    for entry in metadata.get("sort-orders") or ():
        if entry.get("order-id") == order_id:
            where = f"{metadata.get('location')}: sort order {order_id}"
            try:
                order = SortOrder.model_validate(entry)
            except ValueError as exc:
                raise FormatError(f"{where} is malformed ({type(exc).__name__})") from None
            schema_id = metadata.get("current-schema-id")
            current = next((s for s in metadata.get("schemas") or () if s.get("schema-id") == schema_id), None)
            schema = Schema.model_validate(current) if current is not None else None
            for field, raw in zip(order.fields, entry.get("fields") or ()):
                transform = field.transform
                bad = type(transform).__name__ == "UnknownTransform" or (
                    min(getattr(transform, "num_buckets", 1), getattr(transform, "width", 1)) < 1)
                if not bad and schema is not None and field.source_id in struct_path_ids(schema):
                    bad = not transform.can_transform(schema.find_field(field.source_id).field_type)
                if bad:
                    raise FormatError(
                        f"{where}: transform {raw.get('transform')!r} of source column {field.source_id} cannot be applied"
                    )
            return order if order.fields else None
    return None


def sortable(order: SortOrder | ZOrder | None, schema: Schema) -> bool:
    """Whether every field of ``order`` has a primitive source in ``schema`` outside lists
    and maps (an order read from storage may name a dropped or a repeated column: such
    files are written unsorted and say so, ``sort_order_id`` 0).  A z-order's columns were
    checked when it was made: they must still be there (a column dropped since: unsorted)."""
    if isinstance(order, ZOrder):
        return set(order.source_ids) <= struct_path_ids(schema)
    if order is None or not order.fields:
        return False
    for field in order.fields:
        try:
            source = schema.find_field(field.source_id)
        except ValueError:
            return False
        name = schema.find_column_name(field.source_id)
        if name is None or not source.field_type.is_primitive or field.source_id not in struct_path_ids(schema):
            return False
    return True


def _sort_source(table: pa.Table, schema: Schema, source_id: int) -> pa.Array:
    """The column ``source_id`` of ``table`` (a struct's field by its path)."""
    path = schema.find_column_name(source_id).split(".")
    column = table.column(path[0]).combine_chunks()
    for part in path[1:]:
        column = pc.struct_field(column, part)
    return column


def sort_rows(table: pa.Table, order: SortOrder | ZOrder, schema: Schema) -> pa.Table:
    """``table``'s rows in ``order`` (stable): each key is the field's transform of its
    source column, with its own direction and null placement; or in a z-order."""
    if isinstance(order, ZOrder):
        if table.num_rows < 2:
            return table
        columns = [(_sort_source(table, schema, i), schema.find_field(i).field_type) for i in order.source_ids]
        return table.take(pc.sort_indices(order.values(columns)))  # stable: equal z-values keep their order
    keys, names, sort_keys = [], [], []
    for i, field in enumerate(order.fields):
        values = _sort_source(table, schema, field.source_id)
        key = _transform_array(field.transform, schema.find_field(field.source_id).field_type, values)
        key = arrow_storage(key)  # a uuid sorts by its 16 bytes (unsigned, as its bounds)
        nulls_first = field.null_order == NullOrder.NULLS_FIRST
        keys += [pc.is_valid(key) if nulls_first else pc.is_null(key), key]  # False sorts first
        names += [f"n{i}", f"k{i}"]
        sort_keys += [(f"n{i}", "ascending"), (f"k{i}", "ascending" if field.direction == SortDirection.ASC else "descending")]
    if not keys or table.num_rows < 2:
        return table
    return table.take(pc.sort_indices(pa.table(keys, names=names), sort_keys=sort_keys))


@dataclass(frozen=True)
class _PartitionPlan:
    spec: PartitionSpec
    schema: Schema
    sources: list[tuple[str, IcebergType]]  # column name and type of each field's source

    @classmethod
    def create(cls, spec: PartitionSpec, schema: Schema) -> _PartitionPlan:
        sources = []
        for field in spec.fields:
            source = schema.find_field(field.source_id)
            name = schema.find_column_name(field.source_id)
            if name is None or "." in name:
                raise ValueError(f"partition field {field.name!r}: only top-level source columns are supported")
            sources.append((name, source.field_type))
        return cls(spec, schema, sources)

    def split(self, batch: pa.RecordBatch) -> Iterator[tuple[tuple, pa.RecordBatch]]:
        """(partition tuple in internal representation, rows of that partition)."""
        if not self.spec.fields:
            yield (), batch
            return
        keys = [
            _transform_array(field.transform, source_type, batch.column(name))
            for field, (name, source_type) in zip(self.spec.fields, self.sources)
        ]
        result_types = [f.transform.result_type(t) for f, (_, t) in zip(self.spec.fields, self.sources)]
        names = [f"p{i}" for i in range(len(keys))]
        # Arrow groups on no extension type (uuid): group on its storage (the 16 bytes)
        keys = [arrow_storage(key) for key in keys]
        grouping = pa.table(keys + [pa.array(range(batch.num_rows), pa.int64())], names=names + ["row"])
        groups = grouping.group_by(names, use_threads=False).aggregate([("row", "list")])
        for index in range(groups.num_rows):
            values = tuple(
                to_internal(groups.column(name)[index].as_py(), result_type)
                for name, result_type in zip(names, result_types)
            )
            rows = groups.column("row_list")[index].values
            yield values, batch if len(rows) == batch.num_rows else batch.take(rows)

    def path(self, values: tuple) -> str:
        return partition_path(self.spec, self.schema, values)


# --- files ------------------------------------------------------------------------------------


class _ParquetFile:
    """One Parquet data file being written (natively encrypted unless the table is not)."""

    def __init__(self, io: TableIO, path: str, schema: pa.Schema, options: DataWriteOptions) -> None:
        self.key = io.new_file_key()
        self._collector: list[pq.FileMetaData] = []
        if self.key is not None:
            from icecrypt.parquet import open_writer

            self._writer = open_writer(
                path, schema, filesystem=io.format_filesystem, key_metadata=self.key,
                metadata_collector=self._collector, **options.parquet_options,
            )  # fmt: skip
        else:
            # Plaintext tables only (the benchmark baseline): the same writer settings and
            # the very output target icecrypt.parquet publishes through (temporary file,
            # fsync, rename), so the two variants differ by encryption alone.
            self._target = _AtomicTarget(path, io.format_filesystem)
            self._writer = pq.ParquetWriter(
                self._target.stream, schema, metadata_collector=self._collector, **options.parquet_options
            )

    def write(self, table: pa.Table) -> None:
        self._writer.write_table(table, row_group_size=max(1, table.num_rows))

    def close(self) -> tuple[int, Any, pq.FileMetaData]:
        """(stored length, key metadata with file_length or None, footer metadata)."""
        if self.key is not None:
            key = self._writer.close()
            return key.file_length, key, self._collector[0]
        self._writer.close()
        try:
            length = self._target.commit()
        except BaseException:
            self._target.discard()
            raise
        return length, None, self._collector[0]

    def abort(self) -> None:
        if self.key is not None:
            self._writer.abort()
            return
        with contextlib.suppress(Exception):
            self._writer.close()
        self._target.discard()


def _statistics_plan(schema: Schema, properties: dict[str, str]) -> dict:
    """The metrics to keep per field id, as Iceberg Java's ``MetricsConfig`` and
    ``ParquetMetrics`` keep them: a field inside structs gets the mode a top-level field
    would (PyIceberg keeps counts only: no bounds to prune ``addr.zip = 30`` on), a field
    inside a list or map none at all.  None for the lineage columns too: their nulls stand
    for inherited values, so counts and bounds of the stored values would mislead any
    reader that prunes on them; only their column sizes are recorded."""
    # pyiceberg.io.pyarrow imports pyarrow.dataset, which imports pandas (~0.5 s): only
    # where a file is written, not in every process that imports the table package.
    from pyiceberg.io.pyarrow import MetricModeTypes, MetricsMode, compute_statistics_plan, match_metrics_mode

    plan = compute_statistics_plan(schema, properties)
    struct_paths = struct_path_ids(schema)
    none = MetricsMode(MetricModeTypes.NONE)
    default = properties.get("write.metadata.metrics.default", "truncate(16)")
    for field_id, collector in plan.items():
        if field_id not in struct_paths:  # inside a list or a map
            plan[field_id] = replace(collector, mode=none)
        elif "." in collector.column_name:  # inside structs only
            mode = match_metrics_mode(properties.get(f"write.metadata.metrics.column.{collector.column_name}", default))
            if mode.type == MetricModeTypes.TRUNCATE and not isinstance(collector.iceberg_type, (StringType, BinaryType)):
                mode = MetricsMode(MetricModeTypes.FULL)
            plan[field_id] = replace(collector, mode=mode)
    for field in LINEAGE:
        if field.field_id in plan:
            plan[field.field_id] = replace(plan[field.field_id], mode=none)
    return plan


def _map_records(values: dict[int, Any]) -> list[dict[str, Any]] | None:
    return [{"key": k, "value": v} for k, v in sorted(values.items())] or None


def _nan_counts(table: pa.Table, schema: Schema, stats_plan: dict) -> dict[int, int]:
    """NaN counts of the float and double fields, top-level and inside structs (Java's
    writer counts both; fields inside lists and maps get no metrics)."""
    counts = {}
    for field_id, collector in stats_plan.items():
        if not isinstance(collector.iceberg_type, (FloatType, DoubleType)) or collector.mode.type.value == "none":
            continue
        column = _sort_source(table, schema, field_id)
        counts[field_id] = int(pc.sum(pc.is_nan(column)).as_py() or 0)
    return counts


def _arrow_stats(table: pa.Table, schema: Schema, stats_plan: dict) -> dict[str, Any]:
    """Statistics of a file written from ``table`` (Avro: no footer to read them from)."""
    from pyiceberg.io.pyarrow import StatsAggregator, _primitive_to_physical

    value_counts, null_counts = {}, {}
    aggregates: dict[int, Any] = {}
    for field in schema.fields:
        collector = stats_plan.get(field.field_id)
        if collector is None or not isinstance(field.field_type, PrimitiveType):
            continue
        mode = collector.mode.type.value
        if mode == "none":
            continue
        column = table.column(field.name)
        value_counts[field.field_id] = len(column)
        null_counts[field.field_id] = column.null_count
        if mode == "counts" or isinstance(field.field_type, TimeType):
            continue
        if isinstance(field.field_type, (FloatType, DoubleType)):
            column = pc.filter(column, pc.invert(pc.is_nan(column)))
        extremes = pc.min_max(arrow_storage(column))  # a uuid: its 16 bytes, unsigned order
        lower, upper = extremes["min"].as_py(), extremes["max"].as_py()
        if lower is None:
            continue
        try:
            aggregate = StatsAggregator(field.field_type, _primitive_to_physical(field.field_type), collector.mode.length)
        except ValueError:
            continue
        aggregate.update_min(to_internal(lower, field.field_type))
        aggregate.update_max(to_internal(upper, field.field_type))
        aggregates[field.field_id] = aggregate
    lower_bounds, upper_bounds = {}, {}
    for field_id, aggregate in aggregates.items():
        if (low := aggregate.min_as_bytes()) is not None:
            lower_bounds[field_id] = low
        if (high := aggregate.max_as_bytes()) is not None:
            upper_bounds[field_id] = high
    return {
        "column_sizes": None,
        "value_counts": _map_records(value_counts),
        "null_value_counts": _map_records(null_counts),
        "nan_value_counts": _map_records(_nan_counts(table, schema, stats_plan)),
        "lower_bounds": _map_records(lower_bounds),
        "upper_bounds": _map_records(upper_bounds),
        "split_offsets": None,
    }


def _parquet_stats(metadata: pq.FileMetaData, nan_counts: dict[int, int], schema: Schema, stats_plan: dict) -> dict:
    from pyiceberg.io.pyarrow import data_file_statistics_from_parquet_metadata, parquet_path_to_id_mapping

    stats = data_file_statistics_from_parquet_metadata(metadata, stats_plan, parquet_path_to_id_mapping(schema))
    serialized = stats.to_serialized_dict()
    return {
        "column_sizes": _map_records(serialized["column_sizes"]),
        "value_counts": _map_records(serialized["value_counts"]),
        "null_value_counts": _map_records(serialized["null_value_counts"]),
        "nan_value_counts": _map_records(nan_counts),
        "lower_bounds": _map_records(serialized["lower_bounds"]),
        "upper_bounds": _map_records(serialized["upper_bounds"]),
        "split_offsets": serialized["split_offsets"] or None,
    }


def drop_nan_bounds(stats: dict[str, Any], schema: Schema) -> None:
    """Remove the float and double bounds that are NaN from ``stats`` (as
    :func:`_parquet_stats` gives them) of a file another writer wrote: Iceberg's bounds
    never are NaN, and a NaN bound would make readers skip files wrongly."""
    import math
    import struct

    kinds = {}
    for name in ("lower_bounds", "upper_bounds"):
        for record in stats.get(name) or ():
            if record["key"] not in kinds:
                try:
                    field_type = schema.find_type(record["key"])
                except ValueError:
                    field_type = None
                kinds[record["key"]] = ("<f" if isinstance(field_type, FloatType)
                                        else "<d" if isinstance(field_type, DoubleType) else None)
    for name in ("lower_bounds", "upper_bounds"):
        if stats.get(name):
            kept = [r for r in stats[name]
                    if kinds[r["key"]] is None or not math.isnan(struct.unpack(kinds[r["key"]], r["value"])[0])]
            stats[name] = kept or None


class _PartitionWriter:
    """Rows of one partition: buffered into row groups, rolled into files."""

    def __init__(self, job: _WriteJob, values: tuple) -> None:
        self._job = job
        self._values = values
        self._partition_path = job.plan.path(values) if values else ""
        self._buffer: list[pa.RecordBatch] = []
        self._buffered = 0
        self._file: _ParquetFile | None = None
        self._file_location: str | None = None
        self._file_bytes = 0
        self._file_rows = 0
        self._nan_counts: dict[int, int] = {}
        self._avro_parts: list[pa.Table] = []
        self._pending: list[pa.RecordBatch] = []

    def write(self, batch: pa.RecordBatch) -> None:
        if self._job.sort_order is not None:  # sorted at close: a file's rows are in order
            self._pending.append(batch)
            return
        self._append(batch)

    def _append(self, batch: pa.RecordBatch) -> None:
        self._buffer.append(batch)
        self._buffered += batch.nbytes
        options = self._job.options
        limit = options.row_group_size if options.file_format == "parquet" else options.target_file_size
        if self._buffered >= limit:
            self._flush()

    def _new_location(self, extension: str) -> str:
        return self._job.layout.data_file(self._job.next_file_name(extension), self._partition_path)

    def _flush(self) -> None:
        if not self._buffer:
            return
        table = pa.Table.from_batches(self._buffer, self._job.arrow_schema)
        self._buffer, self._buffered = [], 0
        if self._job.options.file_format == "avro":
            self._write_avro(table)
            return
        if self._file is None:
            self._file_location = self._new_location("parquet")
            path = self._job.io.ensure_parent(self._file_location)
            self._job.started.append(self._file_location)
            self._file = _ParquetFile(self._job.io, path, self._job.arrow_schema, self._job.options)
            self._nan_counts = {}
        self._file.write(table)
        for field_id, count in _nan_counts(table, self._job.schema, self._job.stats_plan).items():
            self._nan_counts[field_id] = self._nan_counts.get(field_id, 0) + count
        self._file_bytes += table.nbytes
        self._file_rows += table.num_rows
        if self._file_bytes >= self._job.options.target_file_size:
            self._close_file()

    def _close_file(self) -> None:
        file, self._file = self._file, None
        if file is None:
            return
        length, key, metadata = file.close()
        stats = _parquet_stats(metadata, self._nan_counts, self._job.file_schema, self._job.stats_plan)
        self._job.add(self._file_location, "PARQUET", self._values, self._file_rows, length, key, stats)
        self._file_bytes = self._file_rows = 0

    def _write_avro(self, table: pa.Table) -> None:
        location = self._new_location("avro")
        path = self._job.io.ensure_parent(location)
        self._job.started.append(location)
        key = self._job.io.new_file_key()
        if key is None:
            raise ValueError("Avro data files are written encrypted only; this table has no encryption.key-id")
        from icecrypt.avro import write

        key = write(
            table, path, filesystem=self._job.io.format_filesystem, key_metadata=key, codec=self._job.options.avro_codec
        )
        stats = _arrow_stats(table, self._job.schema, self._job.stats_plan)
        self._job.add(location, "AVRO", self._values, table.num_rows, key.file_length, key, stats)

    def close(self) -> None:
        if self._pending:
            rows = sort_rows(pa.Table.from_batches(self._pending, self._job.arrow_schema), self._job.sort_order,
                             self._job.file_schema)  # fmt: skip
            self._pending = []
            chunk = max(1, self._job.options.row_group_size // max(1, rows.nbytes // max(1, rows.num_rows)))
            for batch in rows.to_batches(max_chunksize=chunk):
                self._append(batch)
        self._flush()
        self._close_file()

    def abort(self) -> None:
        if self._file is not None:
            self._file.abort()
            self._file = None


class _WriteJob:
    """State shared by the partition writers of one append."""

    def __init__(self, io: TableIO, schema: Schema, spec: PartitionSpec, layout: WriteLayout,
                 properties: dict[str, str], options: DataWriteOptions, sort_order_id: int,
                 operation_id: str | None = None, task_id: int = 0, lineage: bool = False,
                 sort_order: SortOrder | ZOrder | None = None) -> None:  # fmt: skip
        self.io = io
        self.schema = schema
        self.plan = _PartitionPlan.create(spec, schema)
        self.layout = layout
        self.options = options
        self.sort_order = sort_order if sortable(sort_order, schema) else None
        self.sort_order_id = (
            self.sort_order.order_id if self.sort_order is not None else 0 if sort_order is not None else sort_order_id
        )
        # rows moved from other files carry their row lineage as columns of the new file
        # (reserved ids and names, after the table's columns, as Iceberg Java writes them)
        self.file_schema = Schema(*schema.fields, *LINEAGE, schema_id=schema.schema_id) if lineage else schema
        self.arrow_schema = arrow_write_schema(self.file_schema)
        self.write_defaults = {f.name: f.write_default for f in schema.fields if f.write_default is not None}
        self.stats_plan = _statistics_plan(self.file_schema, properties)
        # a distributed job passes one operation id to all its tasks (and a task id unique
        # per attempt), so the driver can find what its killed attempts left behind
        self.write_id = operation_id or uuid.uuid4()
        self.task_id = task_id
        self._counter = itertools.count(1)
        self.started: list[str] = []  # every file location opened, for cleanup on failure
        self.data_files: list[dict[str, Any]] = []

    def next_file_name(self, extension: str) -> str:
        # Java's OutputFileFactory: <partition id>-<task id>-<operation id>-<file count>
        return f"{self.task_id:05d}-{os.getpid() % 100000}-{self.write_id}-{next(self._counter):05d}.{extension}"

    def add(self, location: str, file_format: str, values: tuple, rows: int, length: int, key: Any, stats: dict) -> None:
        partition = {field.name: value for field, value in zip(self.plan.spec.fields, values)}
        self.data_files.append(data_file_record(location, file_format, partition, rows, length, key, stats,
                                                self.sort_order_id))


def data_file_record(location: str, file_format: str, partition: dict[str, Any], rows: int, length: int, key: Any,
                     stats: dict, sort_order_id: int) -> dict[str, Any]:
    """The manifest ``data_file`` record of a new data file (``stats``: as
    :func:`_parquet_stats` or :func:`_arrow_stats` give them; ``key``: its key metadata,
    None in a plaintext table)."""
    return {
        "content": DATA,
        "file_path": location,
        "file_format": file_format,
        "partition": partition,
        "record_count": rows,
        "file_size_in_bytes": length,
        **{k: stats[k] for k in ("column_sizes", "value_counts", "null_value_counts", "nan_value_counts",
                                 "lower_bounds", "upper_bounds")},
        "key_metadata": key.encode() if key is not None else None,
        "split_offsets": stats["split_offsets"],
        "equality_ids": None,
        "sort_order_id": sort_order_id,
        "first_row_id": None,
        "referenced_data_file": None,
        "content_offset": None,
        "content_size_in_bytes": None,
    }  # fmt: skip


def write_data_files(
    io: TableIO,
    data: Any,
    *,
    schema: Schema,
    spec: PartitionSpec,
    layout: WriteLayout,
    properties: dict[str, str],
    options: DataWriteOptions,
    sort_order_id: int = 0,
    operation_id: str | None = None,
    task_id: int = 0,
    lineage: bool = False,
    sort_order: SortOrder | None = None,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Write ``data`` as data files of a table, where ``layout`` places them (Java's
    layout: ``write.data.path``, partition directories, object-storage prefixes).

    With ``lineage``, ``data`` also has the columns ``_row_id`` and
    ``_last_updated_sequence_number`` (rows moved from other files, with the lineage
    they had) and the files store them.  With ``sort_order`` (not unsorted) the rows of
    each partition are sorted by it before they are written (each file's rows in order;
    the files record its id).  Returns the ``data_file`` records and the
    locations of every file started.  On an exception, files in progress are aborted
    and the finished ones deleted before it propagates, so a failed append leaves
    nothing behind.
    """
    job = _WriteJob(io, schema, spec, layout, properties, options, sort_order_id, operation_id, task_id, lineage,
                    sort_order)  # fmt: skip
    writers: dict[tuple, _PartitionWriter] = {}
    try:
        for batch in iter_batches(data):
            if batch.num_rows == 0:
                continue
            batch = conform(batch, job.arrow_schema, job.write_defaults)
            for values, rows in job.plan.split(batch):
                writer = writers.get(values)
                if writer is None:
                    writer = writers[values] = _PartitionWriter(job, values)
                writer.write(rows)
        for writer in writers.values():
            writer.close()
    except BaseException:
        for writer in writers.values():
            with contextlib.suppress(Exception):
                writer.abort()
        for started in job.started:
            with contextlib.suppress(Exception):
                io.remove(started)
        raise
    return job.data_files, job.started

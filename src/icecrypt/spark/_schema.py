"""Arrow schemas of the files versus the Spark schema of the DataFrame.

A Python data source must yield batches whose Arrow schema equals, field for field
(names, order, types, nullability), ``to_arrow_schema(<declared schema>)``; anything else
fails the task with ``DATA_SOURCE_RETURN_SCHEMA_MISMATCH`` (FIELD-NOTES.md).  Files hold
types Spark has no twin for (unsigned integers, fixed-size binary, UUID, large and
dictionary types, time zones other than UTC, ``time64[us]``), so :class:`Projection`
picks the requested columns of each batch and casts them to exactly the declared types.
Casts are Arrow's safe casts: a value that would change (a nanosecond timestamp that is
not a whole microsecond, an out-of-range number) is an error naming the file.

Iceberg field ids travel as Arrow field metadata ``PARQUET:field_id`` in the files and as
Spark field metadata ``parquet.field.id`` (the key Spark's own Parquet source uses) in
the DataFrame, in both directions.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.types as pat
from pyspark.sql.pandas.types import from_arrow_type, to_arrow_schema
from pyspark.sql.types import StructField, StructType

__all__ = ["Projection", "arrow_for_write", "spark_arrow_type", "spark_schema"]

FIELD_ID = b"PARQUET:field_id"
SPARK_FIELD_ID = "parquet.field.id"
_SPARK_METADATA = b"SPARK::metadata::json"


def spark_arrow_type(t: pa.DataType) -> pa.DataType:
    """The Arrow type closest to ``t`` that Spark can hold (its values cast losslessly)."""
    if isinstance(t, pa.BaseExtensionType):
        return spark_arrow_type(t.storage_type)
    if pat.is_dictionary(t):
        return spark_arrow_type(t.value_type)
    if pat.is_unsigned_integer(t):
        return {8: pa.int16(), 16: pa.int32(), 32: pa.int64()}.get(t.bit_width, pa.decimal128(20, 0))
    if pat.is_float16(t):
        return pa.float32()
    if pat.is_large_string(t) or pat.is_string_view(t):
        return pa.string()
    if pat.is_fixed_size_binary(t) or pat.is_large_binary(t) or pat.is_binary_view(t):
        return pa.binary()
    if pat.is_decimal(t) and t.precision <= 38 and not pat.is_decimal128(t):
        return pa.decimal128(t.precision, t.scale)
    if pat.is_time(t):
        return pa.time64("ns")
    if pat.is_timestamp(t):
        return pa.timestamp("us", tz=None if t.tz is None else "UTC")
    if pat.is_date64(t):
        return pa.date32()
    if pat.is_list(t) or pat.is_large_list(t) or pat.is_fixed_size_list(t) or pat.is_list_view(t):
        field = t.value_field
        return pa.list_(pa.field("element", spark_arrow_type(field.type), field.nullable))
    if pat.is_map(t):
        return pa.map_(pa.field("key", spark_arrow_type(t.key_type), False),
                       pa.field("value", spark_arrow_type(t.item_type), t.item_field.nullable))
    if pat.is_struct(t):
        return pa.struct([_spark_field(t.field(i)) for i in range(t.num_fields)])
    return t


def _spark_field(field: pa.Field) -> pa.Field:
    """``field`` with a Spark-holdable type; a field id becomes Spark metadata."""
    metadata = None
    if field.metadata and FIELD_ID in field.metadata:
        try:
            metadata = {_SPARK_METADATA: json.dumps({SPARK_FIELD_ID: int(field.metadata[FIELD_ID])}).encode()}
        except ValueError:
            metadata = None
    return pa.field(field.name, spark_arrow_type(field.type), field.nullable, metadata)


def spark_schema(schema: pa.Schema) -> StructType:
    """The Spark schema for files with Arrow schema ``schema`` (nullability kept)."""
    return StructType([_struct_field(_spark_field(field)) for field in schema])


def _struct_field(field: pa.Field) -> StructField:
    spark_type = from_arrow_type(field.type, prefer_timestamp_ntz=True)
    metadata = None
    if field.metadata and _SPARK_METADATA in field.metadata:
        metadata = json.loads(field.metadata[_SPARK_METADATA])
    return StructField(field.name, spark_type, field.nullable, metadata)


def _castable(source: pa.DataType, target: pa.DataType) -> bool:
    try:
        pa.array([], type=source).cast(target)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError, ValueError, TypeError):
        return False
    return True


def _find(names: Sequence[str], wanted: str) -> str | None:
    if wanted in names:
        return wanted
    folded = [name for name in names if name.lower() == wanted.lower()]
    return folded[0] if len(folded) == 1 else None


class Projection:
    """Select and cast a file's batches to the DataFrame's Arrow schema.

    ``columns`` are the file's column names to read, in the DataFrame's order, and
    ``target`` the exact Arrow schema Spark expects.  Built on the planner, pickled into
    the read function; nothing in it is secret.
    """

    def __init__(self, source: pa.Schema, schema: StructType, origin: str) -> None:
        names = source.names
        columns, problems = [], []
        target = to_arrow_schema(schema, timezone="UTC")
        for field in target:
            name = _find(names, field.name)
            if name is None:
                problems.append(f"no column {field.name!r}")
                continue
            source_type = spark_arrow_type(source.field(name).type)
            if source_type != field.type and not _castable(source_type, field.type):
                problems.append(f"column {field.name!r} is {source.field(name).type}, which cannot be read as "
                                f"{schema[field.name].dataType.simpleString()}")
            columns.append(name)
        if problems:
            raise ValueError(f"{origin}: the schema does not fit the file ({'; '.join(problems)}); file columns: "
                             f"{', '.join(names)}")
        self.columns = columns
        self.target = target

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The batch's columns in order, cast to the target schema (safe casts)."""
        if batch.schema.names != self.columns:
            batch = batch.select(self.columns)
        if batch.schema.equals(self.target):
            return batch
        arrays = [
            column if column.type == field.type else column.cast(field.type)
            for column, field in zip(batch.columns, self.target, strict=True)
        ]
        for array, field in zip(arrays, self.target, strict=True):
            if not field.nullable and array.null_count:
                raise ValueError(f"column {field.name!r} holds nulls but the schema declares it NOT NULL")
        return pa.RecordBatch.from_arrays(arrays, schema=self.target)

    def __repr__(self) -> str:
        return f"Projection(columns={self.columns!r})"


def arrow_for_write(schema: pa.Schema) -> pa.Schema:
    """The schema a writer gives the file for a batch from Spark: Spark's metadata JSON
    dropped, ``parquet.field.id`` turned back into ``PARQUET:field_id``."""

    def field_for(field: pa.Field) -> pa.Field:
        metadata = None
        if field.metadata and _SPARK_METADATA in field.metadata:
            try:
                spark_meta = json.loads(field.metadata[_SPARK_METADATA])
            except ValueError:
                spark_meta = {}
            if isinstance(spark_meta, dict) and isinstance(spark_meta.get(SPARK_FIELD_ID), int):
                metadata = {FIELD_ID: str(spark_meta[SPARK_FIELD_ID]).encode()}
        return pa.field(field.name, type_for(field.type), field.nullable, metadata)

    def type_for(t: pa.DataType) -> pa.DataType:
        if pat.is_struct(t):
            return pa.struct([field_for(t.field(i)) for i in range(t.num_fields)])
        if pat.is_list(t):
            return pa.list_(field_for(t.value_field))
        if pat.is_map(t):
            return pa.map_(field_for(t.key_field), field_for(t.item_field))
        return t

    return pa.schema([field_for(field) for field in schema])

"""Iceberg types as Spark types and back, for the SQL catalog.

A table's columns reach Spark twice: as the table's schema (what ``DESCRIBE`` shows and
queries resolve against: field comments from the Iceberg docs, nothing else) and as the
schema Spark's Parquet reader reads the files with (the same structure, every field
carrying its Iceberg field id as ``parquet.field.id``, so columns are matched by id and
renamed or re-added columns read right).  A type Spark's Parquet reader cannot read as
Iceberg defines it (uuid, time, nanosecond timestamps, geometry, variant) is shown as the
closest Spark type and marked ``icecrypt.unreadable`` in the read schema: a query that
reads such a column fails saying so, the other columns read as usual.

Spark types become Iceberg types as Iceberg's Spark integration converts them (byte and
short are ints, char and varchar strings, ``timestamp`` is ``timestamptz``,
``timestamp_ntz`` is ``timestamp``), with fresh field ids in Iceberg's order.
"""

from __future__ import annotations

from typing import Any

from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
)

__all__ = ["FIELD_ID", "UNREADABLE", "iceberg_type", "read_schema", "spark_schema", "spark_type"]

#: the field metadata Spark's Parquet reader and writer take the Iceberg field id from
FIELD_ID = "parquet.field.id"
#: read-schema metadata of a column Spark's Parquet reader cannot read (the reason)
UNREADABLE = "icecrypt.unreadable"

_PRIMITIVES: dict[type, str] = {
    BooleanType: "boolean", IntegerType: "integer", LongType: "long", FloatType: "float", DoubleType: "double",
    DateType: "date", TimestampType: "timestamp_ntz", TimestamptzType: "timestamp", StringType: "string",
    BinaryType: "binary", FixedType: "binary",
}
#: Iceberg types with no Spark twin Spark's Parquet reader reads: (shown as, why not readable)
_SHOWN_AS: dict[str, tuple[str, str]] = {
    "uuid": ("string", "a uuid column (Spark's Parquet reader has no uuid type)"),
    "time": ("long", "a time column (Spark has no time type)"),
    "timestamp_ns": ("timestamp_ntz", "a nanosecond timestamp column (Spark's timestamps are microseconds)"),
    "timestamptz_ns": ("timestamp", "a nanosecond timestamp column (Spark's timestamps are microseconds)"),
    "variant": ("binary", "a variant column"),
    "unknown": ("void", "a column of type unknown"),
}


def _unreadable(t: IcebergType) -> tuple[str, str] | None:
    name = str(t)
    if name in _SHOWN_AS:
        return _SHOWN_AS[name]
    if name.startswith(("geometry", "geography")):
        return "binary", f"a {name} column"
    return None


def spark_type(t: IcebergType, *, ids: bool) -> tuple[Any, str | None]:
    """(Spark type JSON of ``t``, why Spark's Parquet reader cannot read it or None).

    ``ids``: struct fields carry their field ids (the read schema)."""
    for kind, name in _PRIMITIVES.items():
        if type(t) is kind:
            return name, None
    if isinstance(t, DecimalType):
        return f"decimal({t.precision},{t.scale})", None
    if isinstance(t, StructType):
        fields, why = [], None
        for field in t.fields:
            entry, inner = _spark_field(field, ids=ids)
            fields.append(entry)
            why = why or inner
        return {"type": "struct", "fields": fields}, why
    if isinstance(t, ListType):
        element, why = spark_type(t.element_type, ids=ids)
        return {"type": "array", "elementType": element, "containsNull": not t.element_required}, why
    if isinstance(t, MapType):
        key, why_key = spark_type(t.key_type, ids=ids)
        value, why_value = spark_type(t.value_type, ids=ids)
        return ({"type": "map", "keyType": key, "valueType": value, "valueContainsNull": not t.value_required},
                why_key or why_value)
    shown = _unreadable(t)
    if shown is not None:
        return shown
    raise ValueError(f"Iceberg type {t} has no Spark type")


def _spark_field(field: NestedField, *, ids: bool) -> tuple[dict[str, Any], str | None]:
    data_type, why = spark_type(field.field_type, ids=ids)
    metadata: dict[str, Any] = {}
    if ids:
        metadata[FIELD_ID] = field.field_id
        own = _unreadable(field.field_type)
        if own is not None:
            metadata[UNREADABLE] = own[1]
        elif field.initial_default is not None:
            metadata[UNREADABLE] = ("a column with an initial-default value (Spark's Parquet reader would read the "
                                    "rows written before it was added as nulls)")
    elif field.doc:
        metadata["comment"] = field.doc
    return {"name": field.name, "type": data_type, "nullable": not field.required, "metadata": metadata}, why


def spark_schema(schema: Schema) -> dict[str, Any]:
    """The table's Spark schema (JSON): names, types, nullability, comments."""
    return {"type": "struct", "fields": [_spark_field(f, ids=False)[0] for f in schema.fields]}


def read_schema(schema: Schema) -> dict[str, Any]:
    """The schema Spark's Parquet reader reads the data files with (JSON): the table's
    Spark schema with the field id of every struct field (``parquet.field.id``) and, on a
    field of a type it cannot read, ``icecrypt.unreadable`` saying why."""
    return {"type": "struct", "fields": [_spark_field(f, ids=True)[0] for f in schema.fields]}


# --- Spark -> Iceberg ---------------------------------------------------------------------


_FROM_SPARK: dict[str, IcebergType] = {
    "boolean": BooleanType(), "byte": IntegerType(), "short": IntegerType(), "integer": IntegerType(),
    "long": LongType(), "float": FloatType(), "double": DoubleType(), "date": DateType(),
    "timestamp": TimestamptzType(), "timestamp_ntz": TimestampType(), "string": StringType(),
    "binary": BinaryType(),
}


class _Ids:
    """Placeholder field ids (assign_fresh_schema_ids replaces them)."""

    def __init__(self) -> None:
        self.last = 0

    def __call__(self) -> int:
        self.last += 1
        return self.last


def iceberg_type(data_type: Any, what: str, ids: _Ids | None = None) -> IcebergType:
    """The Iceberg type of a Spark type (its JSON form); ValueError naming ``what`` for a
    type Iceberg has none for."""
    ids = ids or _Ids()
    if isinstance(data_type, str):
        if data_type in _FROM_SPARK:
            return _FROM_SPARK[data_type]
        if data_type.startswith("decimal("):
            precision, scale = (int(p) for p in data_type[len("decimal("):-1].split(","))
            return DecimalType(precision, scale)
        if data_type.startswith(("char(", "varchar(")) or data_type.startswith("string collate"):
            return StringType()
        raise ValueError(f"{what}: Spark type {data_type} has no Iceberg type icecrypt writes")
    kind = data_type.get("type")
    if kind == "struct":
        return StructType(*iceberg_fields(data_type["fields"], what, ids))
    if kind == "array":
        element = iceberg_type(data_type["elementType"], f"{what} (element)", ids)
        return ListType(ids(), element, element_required=not data_type.get("containsNull", True))
    if kind == "map":
        key = iceberg_type(data_type["keyType"], f"{what} (key)", ids)
        value = iceberg_type(data_type["valueType"], f"{what} (value)", ids)
        return MapType(ids(), key, ids(), value, value_required=not data_type.get("valueContainsNull", True))
    raise ValueError(f"{what}: Spark type {kind} has no Iceberg type icecrypt writes")


def iceberg_fields(fields: list[dict[str, Any]], what: str, ids: _Ids) -> list[NestedField]:
    out = []
    for field in fields:
        name = field["name"]
        metadata = field.get("metadata") or {}
        data_type = field["type"]
        # Spark keeps char(n) / varchar(n) as string with the declared type in the metadata
        out.append(NestedField(ids(), name, iceberg_type(data_type, f"{what} column {name!r}", ids),
                               required=not field.get("nullable", True), doc=metadata.get("comment")))
    return out


def iceberg_schema(struct: dict[str, Any], what: str) -> Schema:
    """A Spark schema (JSON) as an Iceberg schema with fresh field ids (Iceberg's order)."""
    fields = iceberg_fields(struct.get("fields") or [], what, _Ids())
    names = [f.name.lower() for f in fields]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise ValueError(f"{what}: column {duplicated[0]!r} is given twice")
    return assign_fresh_schema_ids(Schema(*fields))

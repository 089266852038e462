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


#: Spark's column-default metadata keys: what a write gives a row that does not name the
#: column, and what its Parquet reader gives the rows of a file without the column
CURRENT_DEFAULT, EXISTS_DEFAULT = "CURRENT_DEFAULT", "EXISTS_DEFAULT"


def sql_literal(value: Any, t: IcebergType) -> str | None:
    """``value`` (an Iceberg default: days, microseconds, ...) as a Spark SQL literal of
    type ``t``, or None for a type Spark's defaults cannot hold."""
    import datetime
    import math

    if value is None:
        return None
    if isinstance(t, BooleanType):
        return "true" if value else "false"
    if isinstance(t, IntegerType):
        return str(int(value))
    if isinstance(t, LongType):
        return f"{int(value)}L"
    if isinstance(t, (FloatType, DoubleType)):
        kind = "FLOAT" if isinstance(t, FloatType) else "DOUBLE"
        number = float(value)
        text = repr(number) if math.isfinite(number) else ("NaN" if math.isnan(number) else
                                                           "Infinity" if number > 0 else "-Infinity")
        return f"CAST('{text}' AS {kind})"
    if isinstance(t, DecimalType):
        return f"CAST('{value}' AS DECIMAL({t.precision},{t.scale}))"
    if isinstance(t, StringType):
        return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(t, DateType):
        day = value if isinstance(value, datetime.date) else datetime.date(1970, 1, 1) + datetime.timedelta(days=int(value))
        return f"DATE '{day.isoformat()}'"
    if isinstance(t, (TimestampType, TimestamptzType)):
        if isinstance(value, datetime.datetime):
            moment = value.replace(tzinfo=None) if value.tzinfo is None else \
                value.astimezone(datetime.timezone.utc).replace(tzinfo=None)
        else:
            moment = datetime.datetime(1970, 1, 1) + datetime.timedelta(microseconds=int(value))
        if isinstance(t, TimestampType):
            return f"TIMESTAMP_NTZ '{moment.isoformat(sep=' ')}'"
        return f"TIMESTAMP '{moment.isoformat(sep=' ')}+00:00'"
    if isinstance(t, BinaryType):
        return f"X'{bytes(value).hex().upper()}'"
    return None


def _spark_field(field: NestedField, *, ids: bool, top: bool = False) -> tuple[dict[str, Any], str | None]:
    data_type, why = spark_type(field.field_type, ids=ids)
    metadata: dict[str, Any] = {}
    # Spark keeps defaults of top-level columns only: a nested field's initial default is
    # a value its reader cannot give
    exists = sql_literal(field.initial_default, field.field_type) if top else None
    if ids:
        metadata[FIELD_ID] = field.field_id
        own = _unreadable(field.field_type)
        if own is not None:
            metadata[UNREADABLE] = own[1]
        elif field.initial_default is not None and exists is None:
            metadata[UNREADABLE] = ("a column with an initial-default value Spark cannot hold (its Parquet reader "
                                    "would read the rows written before it was added as nulls)")
    elif field.doc:
        metadata["comment"] = field.doc
    if exists is not None:
        metadata[EXISTS_DEFAULT] = exists
    current = sql_literal(field.write_default, field.field_type) if top and not ids else None
    if current is not None:
        metadata[CURRENT_DEFAULT] = current
    return {"name": field.name, "type": data_type, "nullable": not field.required, "metadata": metadata}, why


def spark_schema(schema: Schema) -> dict[str, Any]:
    """The table's Spark schema (JSON): names, types, nullability, comments, and the
    defaults of top-level columns (``CURRENT_DEFAULT``: the write default, which Spark
    gives a row an INSERT does not name the column of; ``EXISTS_DEFAULT``: the initial
    default)."""
    return {"type": "struct", "fields": [_spark_field(f, ids=False, top=True)[0] for f in schema.fields]}


def read_schema(schema: Schema) -> dict[str, Any]:
    """The schema Spark's Parquet reader reads the data files with (JSON): the table's
    Spark schema with the field id of every struct field (``parquet.field.id``), on a
    top-level column with an initial default that value as ``EXISTS_DEFAULT`` (the
    reader gives it to the rows of files written before the column was added), and, on a
    field it cannot read, ``icecrypt.unreadable`` saying why."""
    return {"type": "struct", "fields": [_spark_field(f, ids=True, top=True)[0] for f in schema.fields]}


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


#: the field metadata a CREATE TABLE column's DEFAULT comes in (the JVM's Changes.defaultLiteral, JSON)
DEFAULT_METADATA = "icecrypt.default"


def iceberg_schema(struct: dict[str, Any], what: str) -> Schema:
    """A Spark schema (JSON) as an Iceberg schema with fresh field ids (Iceberg's order);
    a top-level column's DEFAULT (CREATE TABLE) becomes its write default."""
    fields = iceberg_fields(struct.get("fields") or [], what, _Ids())
    names = [f.name.lower() for f in fields]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise ValueError(f"{what}: column {duplicated[0]!r} is given twice")
    schema = assign_fresh_schema_ids(Schema(*fields))
    defaults = {}
    for field in struct.get("fields") or ():
        raw = (field.get("metadata") or {}).get(DEFAULT_METADATA)
        if raw is not None:
            defaults[field["name"]] = _create_default(raw, schema.find_field(field["name"]), what)
    if not defaults:
        return schema
    return Schema(*(NestedField(f.field_id, f.name, f.field_type, required=f.required, doc=f.doc,
                                write_default=defaults.get(f.name)) for f in schema.fields),
                  schema_id=schema.schema_id, identifier_field_ids=schema.identifier_field_ids)


def _create_default(raw: str, field: NestedField, what: str) -> Any:
    import json

    from pyiceberg.expressions.literals import literal

    from icecrypt.spark._sql.filters import literal_value

    node = json.loads(raw)
    if "lit" not in node or not field.field_type.is_primitive:
        raise ValueError(f"{what}: column {field.name!r}: DEFAULT {node.get('unsupported')} is not a value icecrypt "
                         "can keep as a column default (a boolean, number, string, date, timestamp, binary or "
                         "decimal literal)")
    value = literal_value(node)
    if value is None:
        return None
    try:
        return literal(value).to(field.field_type).value
    except (ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"{what}: column {field.name!r}: DEFAULT {value!r} is not a {field.field_type} ({exc})") from None

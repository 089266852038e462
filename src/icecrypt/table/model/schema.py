"""Iceberg schemas, partition specs and sort orders in the JSON and Avro forms Iceberg
Java writes, and the Arrow schema data files are written with.

PyIceberg models the types; the serialisation is ours because table metadata must keep
Java's field order (``TableMetadataParser`` / ``SchemaParser``) and manifests must carry
Java's Avro schema (``AvroSchemaUtil.convert``: records named ``r<field-id>``, maps with
non-string keys as arrays of ``k<key-id>_v<value-id>`` records, unions with ``null``
first, ``field-id`` / ``element-id`` / ``key-id`` / ``value-id`` attributes) so that
Iceberg Java resolves every field by id.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.table.sorting import SortOrder
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
    PrimitiveType,
    StringType,
    StructType,
    TimestampNanoType,
    TimestampType,
    TimestamptzNanoType,
    TimestamptzType,
    TimeType,
    UnknownType,
    UUIDType,
)

__all__ = [
    "arrow_storage",
    "arrow_storage_type",
    "arrow_write_schema",
    "iceberg_schema",
    "partition_struct",
    "schema_to_json",
    "sort_order_to_json",
    "spec_to_json",
    "struct_to_avro",
    "struct_to_json",
]


def arrow_storage(array: Any) -> Any:
    """``array`` (an Arrow array or chunked array) itself, or the storage of an extension
    array: a uuid column's 16 bytes, which Arrow's compute functions (grouping, hashing,
    min/max, comparisons) take where they have no kernel for its uuid type."""
    if not isinstance(array.type, pa.BaseExtensionType):
        return array
    if isinstance(array, pa.Array):
        return array.storage
    return pa.chunked_array([c.storage for c in array.chunks], array.type.storage_type)


def arrow_storage_type(t: pa.DataType) -> pa.DataType:
    """``t`` with every extension type (PyIceberg's uuid) replaced by its storage type."""
    if isinstance(t, pa.BaseExtensionType):
        return arrow_storage_type(t.storage_type)
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(arrow_storage_type(f.type)) for f in t])
    if pa.types.is_map(t):
        return pa.map_(t.key_field.with_type(arrow_storage_type(t.key_type)),
                       t.item_field.with_type(arrow_storage_type(t.item_type)))  # fmt: skip
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(arrow_storage_type(t.value_type)))
    return t


# --- Iceberg JSON (SchemaParser / PartitionSpecParser / SortOrderParser order) ----------


def type_to_json(field_type: IcebergType) -> Any:
    """One type as Java's ``SchemaParser`` writes it."""
    if isinstance(field_type, StructType):
        return struct_to_json(field_type)
    if isinstance(field_type, ListType):
        return {
            "type": "list",
            "element-id": field_type.element_id,
            "element": type_to_json(field_type.element_type),
            "element-required": field_type.element_required,
        }
    if isinstance(field_type, MapType):
        return {
            "type": "map",
            "key-id": field_type.key_id,
            "key": type_to_json(field_type.key_type),
            "value-id": field_type.value_id,
            "value": type_to_json(field_type.value_type),
            "value-required": field_type.value_required,
        }
    return str(field_type)  # "decimal(10, 2)", "fixed[16]", "timestamptz", ... as in Java


def _field_to_json(field: NestedField) -> dict[str, Any]:
    result: dict[str, Any] = {
        "id": field.field_id,
        "name": field.name,
        "required": field.required,
        "type": type_to_json(field.field_type),
    }
    if field.doc:
        result["doc"] = field.doc
    # format v3 default values, in the JSON single-value form (after doc, as Java writes them)
    for key, value in (("initial-default", field.initial_default), ("write-default", field.write_default)):
        if value is not None:
            if not field.field_type.is_primitive:
                raise ValueError(f"field {field.name!r}: only primitive fields take a default value")
            from pyiceberg.conversions import to_json

            result[key] = to_json(field.field_type, value)
    return result


def struct_to_json(struct: StructType, *, schema_id: int | None = None, identifier_field_ids=()) -> dict[str, Any]:
    """A struct (or, with ``schema_id``, a whole schema) in Java's field order."""
    result: dict[str, Any] = {"type": "struct"}
    if schema_id is not None:
        result["schema-id"] = schema_id
        if identifier_field_ids:
            result["identifier-field-ids"] = list(identifier_field_ids)
    result["fields"] = [_field_to_json(field) for field in struct.fields]
    return result


def schema_to_json(schema: Schema) -> dict[str, Any]:
    """A table schema as it appears in ``schemas`` of ``metadata.json``."""
    return struct_to_json(
        schema.as_struct(), schema_id=schema.schema_id, identifier_field_ids=schema.identifier_field_ids
    )


def spec_fields_to_json(spec: PartitionSpec) -> list[dict[str, Any]]:
    """The ``fields`` of a partition spec (also the ``partition-spec`` manifest header)."""
    return [
        {"name": f.name, "transform": str(f.transform), "source-id": f.source_id, "field-id": f.field_id}
        for f in spec.fields
    ]


def spec_to_json(spec: PartitionSpec) -> dict[str, Any]:
    return {"spec-id": spec.spec_id, "fields": spec_fields_to_json(spec)}


def sort_order_to_json(order: SortOrder) -> dict[str, Any]:
    return {
        "order-id": order.order_id,
        "fields": [
            {
                "transform": str(f.transform),
                "source-id": f.source_id,
                "direction": f.direction.value,
                "null-order": f.null_order.value,
            }
            for f in order.fields
        ],
    }


# --- schemas from user input -----------------------------------------------------------


def _arrow_field_id(field: pa.Field) -> int | None:
    metadata = field.metadata or {}
    raw = metadata.get(b"PARQUET:field_id")
    return int(raw) if raw is not None else None


def iceberg_schema(schema: Schema | pa.Schema) -> Schema:
    """A PyIceberg schema for ``schema``: given as is, or converted from Arrow.

    Arrow fields become required when not nullable.  Field ids come from the fields'
    ``PARQUET:field_id`` metadata when every top-level field has one, otherwise fresh
    ids are assigned the way Java does (top-level fields 1..n, then nested ones).
    """
    if isinstance(schema, Schema):
        return schema
    if not isinstance(schema, pa.Schema):
        raise TypeError(f"schema must be a pyarrow.Schema or a pyiceberg Schema, not {type(schema).__name__}")
    from pyiceberg.io.pyarrow import (
        _ConvertToIcebergWithoutIDs,
        pyarrow_to_schema,
        visit_pyarrow,
    )

    ids = [_arrow_field_id(field) for field in schema]
    if ids and all(i is not None for i in ids):
        return pyarrow_to_schema(schema, format_version=3)
    if any(i is not None for i in ids):
        raise ValueError("either every top-level Arrow field has a PARQUET:field_id or none has")
    converted = visit_pyarrow(schema, _ConvertToIcebergWithoutIDs(format_version=3))
    return assign_fresh_schema_ids(converted)


def _small_types(data_type: pa.DataType) -> pa.DataType:
    """``data_type`` with 32-bit-offset strings, binaries and lists (what callers usually
    hand in, so conforming their data is a no-op instead of a copy)."""
    if pa.types.is_large_string(data_type):
        return pa.string()
    if pa.types.is_large_binary(data_type):
        return pa.binary()
    if pa.types.is_large_list(data_type) or pa.types.is_list(data_type):
        return pa.list_(_small_field(data_type.value_field))
    if pa.types.is_map(data_type):
        return pa.map_(_small_field(data_type.key_field), _small_field(data_type.item_field))
    if pa.types.is_struct(data_type):
        return pa.struct([_small_field(data_type.field(i)) for i in range(data_type.num_fields)])
    return data_type


def _small_field(field: pa.Field) -> pa.Field:
    return pa.field(field.name, _small_types(field.type), field.nullable, field.metadata)


#: Arrow types of Iceberg's primitives, as PyIceberg's ``schema_to_pyarrow`` gives them
#: (with the 32-bit offsets :func:`_small_types` gives strings and binaries)
_ARROW_PRIMITIVES: dict[type, pa.DataType] = {
    BooleanType: pa.bool_(), IntegerType: pa.int32(), LongType: pa.int64(), FloatType: pa.float32(),
    DoubleType: pa.float64(), DateType: pa.date32(), TimeType: pa.time64("us"),
    TimestampType: pa.timestamp("us"), TimestamptzType: pa.timestamp("us", tz="UTC"),
    TimestampNanoType: pa.timestamp("ns"), TimestamptzNanoType: pa.timestamp("ns", tz="UTC"),
    StringType: pa.string(), BinaryType: pa.binary(), UUIDType: pa.uuid(), UnknownType: pa.null(),
}


def _arrow_type(t: IcebergType) -> pa.DataType | None:
    """The Arrow type of ``t`` in a written schema, or None for a type left to PyIceberg
    (geometry, geography and any type newer than this table)."""
    if type(t) in _ARROW_PRIMITIVES:
        return _ARROW_PRIMITIVES[type(t)]
    if isinstance(t, DecimalType):
        return pa.decimal128(t.precision, t.scale)
    if isinstance(t, FixedType):
        return pa.binary(len(t))
    if isinstance(t, StructType):
        fields = [_arrow_field(f) for f in t.fields]
        return None if any(f is None for f in fields) else pa.struct(fields)
    if isinstance(t, ListType):
        element = _arrow_field(t.element_field)
        return None if element is None else pa.list_(element)
    if isinstance(t, MapType):
        key, value = _arrow_field(t.key_field), _arrow_field(t.value_field)
        return None if key is None or value is None else pa.map_(key, value)
    return None


def _arrow_field(field: NestedField) -> pa.Field | None:
    arrow_type = _arrow_type(field.field_type)
    if arrow_type is None:
        return None
    metadata = {b"doc": field.doc} if field.doc else {}  # PyIceberg's keys, in its order
    metadata[b"PARQUET:field_id"] = str(field.field_id)
    return pa.field(field.name, arrow_type, nullable=field.optional, metadata=metadata)


def arrow_write_schema(schema: Schema) -> pa.Schema:
    """The Arrow schema data files of ``schema`` are written with: field ids in each
    field's ``PARQUET:field_id`` metadata, nullability from ``required``.

    PyIceberg's ``schema_to_pyarrow`` with 32-bit offsets, made here: importing it imports
    ``pyarrow.dataset`` and pandas (0.7 s of CPU, most of what a Spark worker that only
    asks for a table's schema did).  A schema holding a type not made here (geometry,
    geography, a type newer than this code) is left to PyIceberg."""
    fields = [_arrow_field(f) for f in schema.fields]
    if all(f is not None for f in fields):
        return pa.schema(fields)
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    converted = schema_to_pyarrow(schema, include_field_ids=True)
    return pa.schema([_small_field(field) for field in converted])


# --- partition tuples ------------------------------------------------------------------


def partition_struct(spec: PartitionSpec, schema: Schema, schemas: Sequence[Schema] = (), *,
                     unknown_dropped: bool = False) -> StructType:
    """The ``partition`` struct of manifest entries: every field optional, as in Java.

    An older spec may partition by a column ``schema`` dropped since (Iceberg checks only
    the current spec): its field keeps the type its source had in the newest of the
    table's ``schemas`` that has it, so the spec's manifests are written as before; with
    ``unknown_dropped``, the type its transform gives an unknown source, as Java's
    ``PartitionSpec.partitionType`` (for display: an identity's values are not shown)."""
    fields = []
    for f in spec.fields:
        source_type = _source_type(spec, f, schema, schemas, unknown_dropped)
        fields.append(NestedField(f.field_id, f.name, f.transform.result_type(source_type), required=False))
    return StructType(*fields)


def _source_type(spec: PartitionSpec, field: Any, schema: Schema, schemas: Sequence[Schema], unknown: bool) -> Any:
    source = schema._lazy_id_to_field.get(field.source_id)
    if source is None:  # (only then are the other schemas looked at)
        for older in sorted(schemas, key=lambda s: s.schema_id, reverse=True):
            source = older._lazy_id_to_field.get(field.source_id)
            if source is not None:
                break
    if source is not None:
        return source.field_type
    if unknown:
        return UnknownType()
    raise ValueError(f"partition field {field.name!r} of spec {spec.spec_id}: no schema of the table has its "
                     f"source column (field id {field.source_id})")


# --- Avro (AvroSchemaUtil.convert) -----------------------------------------------------

_AVRO_PRIMITIVES: dict[type, Any] = {
    BooleanType: "boolean",
    IntegerType: "int",
    LongType: "long",
    FloatType: "float",
    DoubleType: "double",
    DateType: {"type": "int", "logicalType": "date"},
    TimeType: {"type": "long", "logicalType": "time-micros"},
    TimestampType: {"type": "long", "logicalType": "timestamp-micros", "adjust-to-utc": False},
    TimestamptzType: {"type": "long", "logicalType": "timestamp-micros", "adjust-to-utc": True},
    TimestampNanoType: {"type": "long", "logicalType": "timestamp-nanos", "adjust-to-utc": False},
    TimestamptzNanoType: {"type": "long", "logicalType": "timestamp-nanos", "adjust-to-utc": True},
    StringType: "string",
    BinaryType: "bytes",
    UUIDType: {"type": "fixed", "name": "uuid_fixed", "size": 16, "logicalType": "uuid"},
}


def _decimal_bytes(precision: int) -> int:
    """Fewest bytes of a two's-complement integer holding ``precision`` decimal digits."""
    size = 1
    while 2 ** (8 * size - 1) - 1 < 10**precision - 1:
        size += 1
    return size


def _avro_primitive(field_type: PrimitiveType) -> Any:
    if isinstance(field_type, DecimalType):
        return {
            "type": "fixed",
            "name": f"decimal_{field_type.precision}_{field_type.scale}",
            "size": _decimal_bytes(field_type.precision),
            "logicalType": "decimal",
            "precision": field_type.precision,
            "scale": field_type.scale,
        }
    if isinstance(field_type, FixedType):
        return {"type": "fixed", "name": f"fixed_{len(field_type)}", "size": len(field_type)}
    try:
        return _AVRO_PRIMITIVES[type(field_type)]
    except KeyError:
        raise ValueError(f"type {field_type} cannot be stored in a manifest") from None


def _avro_type(field_type: IcebergType, field_id: int | None) -> Any:
    if isinstance(field_type, StructType):
        return struct_to_avro(field_type, f"r{field_id}")
    if isinstance(field_type, ListType):
        element = _avro_type(field_type.element_type, field_type.element_id)
        if not field_type.element_required:
            element = ["null", element]
        return {"type": "array", "items": element, "element-id": field_type.element_id}
    if isinstance(field_type, MapType):
        value = _avro_type(field_type.value_type, field_type.value_id)
        if not field_type.value_required:
            value = ["null", value]
        if isinstance(field_type.key_type, StringType):
            return {"type": "map", "values": value, "key-id": field_type.key_id, "value-id": field_type.value_id}
        key = _avro_type(field_type.key_type, field_type.key_id)
        pair = {
            "type": "record",
            "name": f"k{field_type.key_id}_v{field_type.value_id}",
            "fields": [
                {"name": "key", "type": key, "field-id": field_type.key_id},
                {"name": "value", "type": value, "field-id": field_type.value_id},
            ],
        }
        return {"type": "array", "items": pair, "logicalType": "map"}
    return _avro_primitive(field_type)


def struct_to_avro(struct: StructType, name: str) -> dict[str, Any]:
    """An Avro record schema for ``struct`` exactly as Java's ``AvroSchemaUtil`` builds it."""
    fields = []
    for field in struct.fields:
        avro_type = _avro_type(field.field_type, field.field_id)
        entry: dict[str, Any] = {"name": field.name, "type": avro_type if field.required else ["null", avro_type]}
        if field.doc:
            entry["doc"] = field.doc
        if not field.required:
            entry["default"] = None
        entry["field-id"] = field.field_id
        fields.append(entry)
    return {"type": "record", "name": name, "fields": fields}

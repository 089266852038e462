"""Avro schemas <-> Arrow schemas, and Avro values <-> Arrow arrays, the Iceberg way.

Private to :mod:`icecrypt.avro`.  Type mapping (Iceberg's Avro conventions, as
``AvroSchemaUtil``/``TypeToSchema`` in Iceberg Java write them):

=====================================  ================================================
Avro                                   Arrow
=====================================  ================================================
boolean, int, long, float, double      bool, int32, int64, float32, float64
string / bytes / fixed(n) / enum       string / binary / fixed_size_binary(n) / string
int date                               date32
int time-millis / long time-micros     time32[ms] / time64[us]
long timestamp-{millis,micros,nanos}   timestamp[ms|us|ns, tz="UTC"] when ``adjust-to-utc``
                                       is true or absent, no tz when false
long local-timestamp-*                 timestamp without tz
fixed / bytes decimal(p, s)            decimal128(p, s) (decimal256 above 38 digits)
fixed(16) / string uuid                arrow.uuid extension type
["null", T] (either order)             T, nullable
array (``element-id``)                 list<element>
map (``key-id``, ``value-id``)         map<string, V>
array of {key, value} records with     map<K, V> (Iceberg's map with non-string keys)
``logicalType: map``
record                                 struct
=====================================  ================================================

Field ids (``field-id``, ``element-id``, ``key-id``, ``value-id``) go to Arrow field
metadata ``b"PARQUET:field_id"``; a name Avro cannot hold is sanitized as Iceberg Java
does and the original kept in the ``iceberg-field-name`` attribute.

Reading: fastavro decodes with logical types stripped from the schema (dates, times and
timestamps arrive as ints, decimals and UUIDs as bytes), ``pa.array`` builds a "raw"
Arrow array from those Python values in one C++ call per batch, and the few types that
need it are then converted column-wise with numpy (no per-value Python work).  Writing
runs the same way backwards.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import islice
from typing import Any

import numpy as np
import pyarrow as pa

FIELD_ID = b"PARQUET:field_id"
ICEBERG_FIELD_NAME = "iceberg-field-name"
ELEMENT = "element"

_PRIMITIVES = {
    "null": pa.null(),
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "bytes": pa.binary(),
    "string": pa.string(),
}
_NAMED = ("record", "error", "enum", "fixed")
_KINDS = frozenset((*_NAMED, "array", "map", *_PRIMITIVES))
_TIMESTAMPS = {
    "timestamp-millis": ("ms", True),
    "timestamp-micros": ("us", True),
    "timestamp-nanos": ("ns", True),
    "local-timestamp-millis": ("ms", False),
    "local-timestamp-micros": ("us", False),
    "local-timestamp-nanos": ("ns", False),
}


class SchemaError(ValueError):
    """An Avro or Arrow schema this module cannot map."""


# --------------------------------------------------------------------------- named types


def _fullname(name: str, namespace: str | None) -> str:
    return name if "." in name or not namespace else f"{namespace}.{name}"


def _namespace_of(fullname: str) -> str | None:
    return fullname.rpartition(".")[0] or None


def resolve(name: str, namespace: str | None, active: set[str], defined: Mapping[str, Any], error: type[Exception]) -> Any:
    """What a reference to the named type ``name`` resolves to in ``defined``;
    ``error`` for a name being defined (``active``: a recursive type) or unknown."""
    for candidate in (_fullname(name, namespace), name):
        if candidate in active:
            raise error(f"recursive Avro type {candidate!r} is not supported")
        if candidate in defined:
            return defined[candidate]
    raise error(f"unknown Avro type {name!r}")


def expand(schema: Any) -> Any:
    """The schema as a tree: every named type's definition in place of each reference
    (the same dict object), named with its full name and no ``namespace``.  Recursive
    types are refused (Arrow cannot hold them)."""
    defined: dict[str, Any] = {}
    active: set[str] = set()

    def walk(t: Any, ns: str | None) -> Any:
        if isinstance(t, str):
            if t in _PRIMITIVES:
                return t
            return resolve(t, ns, active, defined, SchemaError)
        if isinstance(t, list):
            return [walk(branch, ns) for branch in t]
        if not isinstance(t, dict) or "type" not in t:
            raise SchemaError(f"invalid Avro schema: {t!r}")
        kind = t["type"]
        if not isinstance(kind, str) or kind not in _KINDS:
            return walk(kind, ns)  # {"type": <a schema or a name>}: that schema
        out = {k: v for k, v in t.items() if k != "namespace"}
        if kind in _NAMED:
            if not isinstance(t.get("name"), str):
                raise SchemaError(f"Avro {kind} without a name: {t!r}")
            full = _fullname(t["name"], t.get("namespace", ns))
            if full in defined or full in active:
                raise SchemaError(f"Avro type {full!r} is defined twice")
            out["name"] = full
            if kind in ("record", "error"):
                active.add(full)
                inner_ns = _namespace_of(full)
                fields = t.get("fields")
                if not isinstance(fields, list):
                    raise SchemaError(f"Avro record {full!r} has no field list")
                out["fields"] = []
                for f in fields:
                    if not isinstance(f, dict) or not isinstance(f.get("name"), str) or "type" not in f:
                        raise SchemaError(f"invalid field in Avro record {full!r}: {f!r}")
                    out["fields"].append({**f, "type": walk(f["type"], inner_ns)})
                active.discard(full)
            defined[full] = out
        elif kind == "array":
            out["items"] = walk(t.get("items"), ns)
        elif kind == "map":
            out["values"] = walk(t.get("values"), ns)
        return out

    return walk(schema, None)


def emit(tree: Any) -> Any:
    """An expanded tree as Avro JSON: each named type defined at its first use and
    referenced by name afterwards."""
    seen: set[str] = set()

    def walk(t: Any) -> Any:
        if isinstance(t, list):
            return [walk(b) for b in t]
        if not isinstance(t, dict):
            return t
        kind = t["type"]
        if kind in _NAMED:
            if t["name"] in seen:
                return t["name"]
            seen.add(t["name"])
        out = dict(t)
        if kind in ("record", "error"):
            out["fields"] = [{**f, "type": walk(f["type"])} for f in t["fields"]]
        elif kind == "array":
            out["items"] = walk(t["items"])
        elif kind == "map":
            out["values"] = walk(t["values"])
        return out

    return walk(tree)


def strip_logical_types(tree: Any) -> Any:
    """An expanded tree without ``logicalType`` attributes: fastavro then hands out the
    stored values (ints for dates and times, bytes for decimals) unconverted."""
    memo: dict[int, Any] = {}

    def walk(t: Any) -> Any:
        if isinstance(t, list):
            return [walk(b) for b in t]
        if not isinstance(t, dict):
            return t
        if id(t) in memo:
            return memo[id(t)]
        out = {k: v for k, v in t.items() if k != "logicalType"}
        memo[id(t)] = out
        kind = t["type"]
        if kind in ("record", "error"):
            out["fields"] = [{**f, "type": walk(f["type"])} for f in t["fields"]]
        elif kind == "array":
            out["items"] = walk(t["items"])
        elif kind == "map":
            out["values"] = walk(t["values"])
        return out

    return walk(tree)


def top_level_fields(tree: Any) -> list[dict]:
    """The fields of the top-level record."""
    if not isinstance(tree, dict) or tree.get("type") not in ("record", "error"):
        raise SchemaError("the Avro schema of a table must be a record")
    return tree["fields"]


def arrow_name(field: Mapping[str, Any]) -> str:
    """The Arrow/Iceberg name of an Avro field (the original of a sanitized name)."""
    original = field.get(ICEBERG_FIELD_NAME)
    return original if isinstance(original, str) else field["name"]


# --------------------------------------------------------------------------- Avro -> Arrow


@dataclasses.dataclass(frozen=True)
class _Node:
    """How one Avro type reads into Arrow: ``raw`` is what ``pa.array`` builds from
    fastavro's (logical-type-free) values; ``fix`` turns that into ``type``."""

    type: pa.DataType
    raw: pa.DataType
    nullable: bool = False
    fix: Callable[[pa.Array], pa.Array] | None = None


def _field_id(value: Any) -> dict[bytes, bytes] | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return {FIELD_ID: str(value).encode()}
    return None


def _is_valid(arr: pa.Array) -> np.ndarray:
    return arr.is_valid().to_numpy(zero_copy_only=False)


def _validity(arr: pa.Array) -> pa.Buffer | None:
    return arr.is_valid().buffers()[1] if arr.null_count else None


def _decimal_type(precision: Any, scale: Any) -> pa.DataType | None:
    if not isinstance(precision, int) or isinstance(precision, bool) or not 0 < precision <= 76:
        return None
    scale = 0 if scale is None else scale
    if not isinstance(scale, int) or isinstance(scale, bool) or not 0 <= scale <= precision:
        return None
    return pa.decimal128(precision, scale) if precision <= 38 else pa.decimal256(precision, scale)


def _decimal_from_bytes(arr: pa.Array, target: pa.DataType) -> pa.Array:
    """Big-endian two's-complement bytes (fixed or variable width) -> decimal."""
    n, width = len(arr), target.byte_width
    buffers = arr.buffers()
    if pa.types.is_fixed_size_binary(arr.type):
        size = arr.type.byte_width
        if size > width:
            raise ValueError(f"decimal stored in {size} bytes does not fit {target}")
        data = np.frombuffer(buffers[1], np.uint8, count=(arr.offset + n) * size)[arr.offset * size :]
        data = data.reshape(n, size)
        out = np.empty((n, width), np.uint8)
        out[:, :size] = data[:, ::-1]
        out[:, size:] = np.where(data[:, :1] >= 0x80, 0xFF, 0) if size else 0
    else:
        offsets = np.frombuffer(buffers[1], np.int32, count=arr.offset + n + 1)[arr.offset :].astype(np.int64)
        values = np.frombuffer(buffers[2], np.uint8) if buffers[2] is not None and buffers[2].size else np.zeros(1, np.uint8)
        starts, ends = offsets[:-1], offsets[1:]
        lengths = ends - starts
        if n and lengths.max() > width:
            raise ValueError(f"decimal of {int(lengths.max())} bytes does not fit {target}")
        k = np.arange(width)
        take = np.clip(ends[:, None] - 1 - k[None, :], 0, len(values) - 1)
        first = values[np.clip(starts, 0, len(values) - 1)]
        sign = np.where((lengths > 0) & (first >= 0x80), 0xFF, 0).astype(np.uint8)
        out = np.where(k[None, :] < lengths[:, None], values[take], sign[:, None]).astype(np.uint8)
    return pa.Array.from_buffers(target, n, [_validity(arr), pa.py_buffer(out)], arr.null_count)


_UUID_HEX = np.array([i for i in range(36) if i not in (8, 13, 18, 23)])
_HEX = np.full(256, 255, np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX[_c] = _i
for _i, _c in enumerate(b"ABCDEF", 10):
    _HEX[_c] = _i


def _uuid_from_string(arr: pa.Array) -> pa.Array:
    """Canonical UUID strings (8-4-4-4-12 hex digits) -> arrow.uuid."""
    n = len(arr)
    buffers = arr.buffers()
    offsets = np.frombuffer(buffers[1], np.int32, count=arr.offset + n + 1)[arr.offset :].astype(np.int64)
    values = np.frombuffer(buffers[2], np.uint8) if buffers[2] is not None and buffers[2].size else np.zeros(1, np.uint8)
    valid = _is_valid(arr)
    starts = np.where(valid, offsets[:-1], 0)
    if (valid & (np.diff(offsets) != 36)).any():
        raise ValueError("a uuid value is not a 36-character UUID string")
    text = values[np.clip(starts[:, None] + np.arange(36)[None, :], 0, len(values) - 1)]
    digits = _HEX[text[:, _UUID_HEX]]
    bad = ((digits == 255).any(axis=1) | (text[:, [8, 13, 18, 23]] != ord("-")).any(axis=1)) & valid
    if bad.any():
        raise ValueError("a uuid value is not a canonical UUID string")
    out = np.ascontiguousarray((digits[:, 0::2] << 4) | digits[:, 1::2]).astype(np.uint8)
    storage = pa.Array.from_buffers(pa.binary(16), n, [_validity(arr), pa.py_buffer(out)], arr.null_count)
    return pa.ExtensionArray.from_storage(pa.uuid(), storage)


def _uuid_from_fixed(arr: pa.Array) -> pa.Array:
    return pa.ExtensionArray.from_storage(pa.uuid(), arr)


def _mask(arr: pa.Array) -> pa.Array | None:
    return arr.is_null() if arr.null_count else None


def _offsets(arr: pa.Array) -> pa.Array:
    """The offsets of a list or map array as an unsliced array (``from_arrays`` refuses
    a validity mask together with sliced offsets)."""
    offsets = arr.offsets
    return offsets if offsets.offset == 0 else pa.array(offsets.to_numpy(), offsets.type)


def _node(t: Any) -> _Node:
    if isinstance(t, list):
        branches = [b for b in t if b != "null"]
        if not branches:
            return _Node(pa.null(), pa.null(), True)
        if len(branches) > 1:
            raise SchemaError(f"Avro unions other than [null, T] are not supported: {t!r}")
        return dataclasses.replace(_node(branches[0]), nullable=len(branches) < len(t))
    if isinstance(t, str):
        return _Node(_PRIMITIVES[t], _PRIMITIVES[t], t == "null")
    kind, logical = t["type"], t.get("logicalType")
    if kind in ("record", "error"):
        return _record_node(t)
    if kind == "array":
        return _array_node(t)
    if kind == "map":
        return _map_node(t)
    if kind == "enum":
        return _Node(pa.string(), pa.string())
    if kind == "fixed":
        size = t.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise SchemaError(f"Avro fixed {t.get('name')!r} has an invalid size")
        raw = pa.binary(size)
        if logical == "decimal":
            target = _decimal_type(t.get("precision"), t.get("scale"))
            if target is not None:
                return _Node(target, raw, fix=lambda a, _t=target: _decimal_from_bytes(a, _t))
        if logical == "uuid" and size == 16:
            return _Node(pa.uuid(), raw, fix=_uuid_from_fixed)
        return _Node(raw, raw)
    base = _PRIMITIVES.get(kind)
    if base is None:
        raise SchemaError(f"unknown Avro type {kind!r}")
    if kind == "int" and logical == "date":
        return _Node(pa.date32(), pa.date32())
    if kind == "int" and logical == "time-millis":
        return _Node(pa.time32("ms"), pa.time32("ms"))
    if kind == "long" and logical == "time-micros":
        return _Node(pa.time64("us"), pa.time64("us"))
    if kind == "long" and logical in _TIMESTAMPS:
        unit, utc = _TIMESTAMPS[logical]
        if utc:  # Iceberg: adjust-to-utc false is a timestamp without zone; absent means UTC
            utc = t.get("adjust-to-utc", True) not in (False, "false")
        ts = pa.timestamp(unit, "UTC" if utc else None)
        return _Node(ts, ts)
    if kind == "bytes" and logical == "decimal":
        target = _decimal_type(t.get("precision"), t.get("scale"))
        if target is not None:
            return _Node(target, pa.binary(), fix=lambda a, _t=target: _decimal_from_bytes(a, _t))
    if kind == "string" and logical == "uuid":
        return _Node(pa.uuid(), pa.string(), fix=_uuid_from_string)
    return _Node(base, base, kind == "null")


def _record_node(t: Mapping[str, Any]) -> _Node:
    fields, raw_fields, fixes = [], [], []
    for f in t["fields"]:
        child = _node(f["type"])
        fields.append(pa.field(arrow_name(f), child.type, child.nullable, _field_id(f.get("field-id"))))
        raw_fields.append(pa.field(f["name"], child.raw, child.nullable))
        fixes.append(child.fix)
    target, raw = pa.struct(fields), pa.struct(raw_fields)
    if not any(fixes) and all(a.name == b.name for a, b in zip(fields, raw_fields)):
        return _Node(target, target)

    def fix(arr: pa.Array) -> pa.Array:
        children = [fn(arr.field(i)) if fn else arr.field(i) for i, fn in enumerate(fixes)]
        return pa.StructArray.from_arrays(children, fields=fields, mask=_mask(arr))

    return _Node(target, raw, fix=fix)


def _is_key_value_record(t: Any) -> bool:
    return (
        isinstance(t, dict)
        and t.get("type") == "record"
        and [f["name"] for f in t["fields"]] == ["key", "value"]
    )


def _array_node(t: Mapping[str, Any]) -> _Node:
    items = t["items"]
    if t.get("logicalType") == "map" and _is_key_value_record(items):
        key_f, value_f = items["fields"]
        key, value = _node(key_f["type"]), _node(value_f["type"])
        target = pa.map_(
            pa.field("key", key.type, False, _field_id(key_f.get("field-id"))),
            pa.field("value", value.type, value.nullable, _field_id(value_f.get("field-id"))),
        )
        raw = pa.list_(pa.field(ELEMENT, pa.struct([("key", key.raw), ("value", value.raw)]), False))

        def fix_map(arr: pa.Array) -> pa.Array:
            entries = arr.values
            keys, values = entries.field(0), entries.field(1)
            keys = key.fix(keys) if key.fix else keys
            values = value.fix(values) if value.fix else values
            return pa.MapArray.from_arrays(_offsets(arr), keys, values, type=target, mask=_mask(arr))

        return _Node(target, raw, fix=fix_map)
    element = _node(items)
    target = pa.list_(pa.field(ELEMENT, element.type, element.nullable, _field_id(t.get("element-id"))))
    if element.fix is None:
        return _Node(target, target)
    raw = pa.list_(pa.field(ELEMENT, element.raw, element.nullable))

    def fix_list(arr: pa.Array) -> pa.Array:
        return pa.ListArray.from_arrays(_offsets(arr), element.fix(arr.values), type=target, mask=_mask(arr))

    return _Node(target, raw, fix=fix_list)


def _map_node(t: Mapping[str, Any]) -> _Node:
    value = _node(t["values"])
    key_field = pa.field("key", pa.string(), False, _field_id(t.get("key-id")))
    target = pa.map_(key_field, pa.field("value", value.type, value.nullable, _field_id(t.get("value-id"))))
    if value.fix is None:
        return _Node(target, target)
    raw = pa.map_(pa.string(), pa.field("value", value.raw, value.nullable))

    def fix(arr: pa.Array) -> pa.Array:
        return pa.MapArray.from_arrays(_offsets(arr), arr.keys, value.fix(arr.items), type=target, mask=_mask(arr))

    return _Node(target, raw, fix=fix)


def to_arrow_schema(tree: Any, metadata: Mapping[bytes, bytes] | None = None) -> pa.Schema:
    """The Arrow schema of an expanded Avro record schema."""
    fields = []
    for f in top_level_fields(tree):
        node = _node(f["type"])
        fields.append(pa.field(arrow_name(f), node.type, node.nullable, _field_id(f.get("field-id"))))
    return pa.schema(fields, metadata=metadata or None)


class BatchBuilder:
    """Turns fastavro records (decoded with logical types stripped) of the given
    top-level Avro fields into Arrow record batches of ``schema``."""

    def __init__(self, fields: list[dict], schema: pa.Schema):
        nodes = [_node(f["type"]) for f in fields]
        self.schema = schema
        self._raw = pa.struct([pa.field(f["name"], n.raw, n.nullable) for f, n in zip(fields, nodes)])
        self._fixes = [n.fix for n in nodes]

    def batch(self, records: list[dict]) -> pa.RecordBatch:
        rows = pa.array(records, type=self._raw)  # one C++ pass over the dicts
        if not self._fixes:  # no columns asked for: only the row count
            return pa.RecordBatch.from_struct_array(rows).replace_schema_metadata(self.schema.metadata)
        columns = [fn(rows.field(i)) if fn else rows.field(i) for i, fn in enumerate(self._fixes)]
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)

    def batches(self, records: Iterator[dict], batch_size: int) -> Iterator[pa.RecordBatch]:
        while True:
            chunk = list(islice(records, batch_size))
            if not chunk:
                return
            yield self.batch(chunk)


# --------------------------------------------------------------------------- Arrow -> Avro


def avro_name(name: str) -> str:
    """``name`` made a valid Avro name exactly as Iceberg Java's
    ``AvroSchemaUtil.makeCompatibleName`` does (over UTF-16 code units)."""
    if not name:
        raise SchemaError("empty field name")
    encoded = name.encode("utf-16-le", "surrogatepass")
    chars = [chr(int.from_bytes(encoded[i : i + 2], "little")) for i in range(0, len(encoded), 2)]

    def ok(c: str, first: bool) -> bool:  # Java's isLetter / isDigit: categories L* / Nd
        return c == "_" or c.isalpha() or (not first and c.isdecimal())

    if all(ok(c, i == 0) for i, c in enumerate(chars)):
        return name
    out = []
    for i, c in enumerate(chars):
        if ok(c, i == 0):
            out.append(c)
        elif c.isdecimal():
            out.append("_" + c)
        else:
            out.append("_x" + format(ord(c), "X"))
    return "".join(out)


def decimal_required_bytes(precision: int) -> int:
    """Bytes of the fixed type Iceberg stores a decimal of ``precision`` digits in
    (TypeUtil.decimalRequiredBytes: the fewest bytes whose signed range has that many
    digits)."""
    n = 1
    while len(str(2 ** (8 * n - 1) - 1)) - 1 < precision:
        n += 1
    return n


def _meta_field_id(meta: Mapping[bytes, bytes] | None) -> int | None:
    if meta and FIELD_ID in meta:
        try:
            return int(meta[FIELD_ID])
        except ValueError:
            raise SchemaError(f"field id {meta[FIELD_ID]!r} is not an integer") from None
    return None


class _AvroBuilder:
    def __init__(self) -> None:
        self.names: set[str] = set()

    def _fresh_name(self, base: str) -> str:
        """A record name from ``base`` that no other named type in the schema has."""
        name, i = base, 1
        while name in self.names:
            i += 1
            name = f"{base}_{i}"
        self.names.add(name)
        return name

    def _fixed(self, name: str, size: int, **extra: Any) -> Any:
        if name in self.names:
            return name  # defined earlier in the schema: refer to it
        self.names.add(name)
        return {"type": "fixed", "name": name, "size": size, **extra}

    def record(self, fields: Iterable[pa.Field], name: str, path: str) -> dict:
        return {"type": "record", "name": self._fresh_name(name), "fields": [self.field(f, f"{path}_{f.name}") for f in fields]}

    def field(self, field: pa.Field, path: str) -> dict:
        sanitized = avro_name(field.name)
        field_id = _meta_field_id(field.metadata)
        t = self.type(field.type, field_id, path)
        out: dict[str, Any] = {"name": sanitized}
        if field.nullable and t != "null":
            out["type"], out["default"] = ["null", t], None
        else:
            out["type"] = t
        if field_id is not None:
            out["field-id"] = field_id
        if sanitized != field.name:
            out[ICEBERG_FIELD_NAME] = field.name
        return out

    def _item(self, field: pa.Field, path: str) -> Any:
        t = self.type(field.type, _meta_field_id(field.metadata), path)
        return ["null", t] if field.nullable and t != "null" else t

    def type(self, dt: pa.DataType, field_id: int | None, path: str) -> Any:
        types = pa.types
        if isinstance(dt, pa.BaseExtensionType):
            if dt.extension_name == "arrow.uuid":
                return self._fixed("uuid_fixed", 16, logicalType="uuid")
            raise SchemaError(f"{path}: Arrow extension type {dt.extension_name} has no Avro form")
        if types.is_dictionary(dt):
            return self.type(dt.value_type, field_id, path)
        if types.is_null(dt):
            return "null"
        if types.is_boolean(dt):
            return "boolean"
        if dt in (pa.int8(), pa.int16(), pa.int32(), pa.uint8(), pa.uint16()):
            return "int"
        if dt in (pa.int64(), pa.uint32()):
            return "long"
        if dt in (pa.float16(), pa.float32()):
            return "float"
        if dt == pa.float64():
            return "double"
        if types.is_string(dt) or types.is_large_string(dt) or types.is_string_view(dt):
            return "string"
        if types.is_binary(dt) or types.is_large_binary(dt) or types.is_binary_view(dt):
            return "bytes"
        if types.is_fixed_size_binary(dt) and not types.is_decimal(dt):
            return self._fixed(f"fixed_{dt.byte_width}", dt.byte_width)
        if types.is_decimal(dt):
            p, s = dt.precision, dt.scale
            return self._fixed(f"decimal_{p}_{s}", decimal_required_bytes(p), logicalType="decimal",
                               precision=p, scale=s)
        if types.is_date(dt):
            return {"type": "int", "logicalType": "date"}
        if types.is_time32(dt) or (types.is_time64(dt) and dt.unit == "us"):
            return {"type": "long", "logicalType": "time-micros"}
        if types.is_timestamp(dt):
            logical = "timestamp-nanos" if dt.unit == "ns" else "timestamp-micros"
            return {"type": "long", "logicalType": logical, "adjust-to-utc": dt.tz is not None}
        if types.is_struct(dt):
            base = f"r{field_id}" if field_id is not None else f"r{avro_name(path)}"
            return self.record(list(dt), base, path)
        if types.is_map(dt):
            key, item = dt.key_field, dt.item_field
            kid, vid = _meta_field_id(key.metadata), _meta_field_id(item.metadata)
            if types.is_string(key.type) or types.is_large_string(key.type) or types.is_string_view(key.type):
                out = {"type": "map", "values": self._item(item, f"{path}_value")}
                if kid is not None:
                    out["key-id"] = kid
                if vid is not None:
                    out["value-id"] = vid
                return out
            kv_name = f"k{kid}_v{vid}" if kid is not None and vid is not None else f"kv{avro_name(path)}"
            record = self.record([key.with_nullable(False), item], kv_name, path)
            return {"type": "array", "items": record, "logicalType": "map"}
        if types.is_list(dt) or types.is_large_list(dt) or types.is_fixed_size_list(dt) or \
                types.is_list_view(dt) or types.is_large_list_view(dt):
            element = dt.value_field
            out = {"type": "array", "items": self._item(element, f"{path}_element")}
            eid = _meta_field_id(element.metadata)
            if eid is not None:
                out["element-id"] = eid
            return out
        raise SchemaError(f"{path}: Arrow type {dt} has no Avro form")


def to_avro_schema(schema: pa.Schema, name: str = "record") -> dict:
    """The Avro record schema for an Arrow schema (Iceberg conventions)."""
    builder = _AvroBuilder()
    return builder.record(list(schema), avro_name(name), "")


# --------------------------------------------------------------------------- Arrow -> values


def _needs_conversion(dt: pa.DataType) -> bool:
    """Whether ``to_writable`` changes arrays of this type."""
    types = pa.types
    if isinstance(dt, pa.BaseExtensionType) or types.is_dictionary(dt) or types.is_decimal(dt):
        return True
    if types.is_timestamp(dt) or types.is_date(dt) or types.is_time(dt) or dt == pa.float16():
        return True
    if types.is_struct(dt):
        return any(_needs_conversion(f.type) or avro_name(f.name) != f.name for f in dt)
    if types.is_map(dt):
        key = dt.key_type
        string_key = types.is_string(key) or types.is_large_string(key) or types.is_string_view(key)
        return not string_key or _needs_conversion(key) or _needs_conversion(dt.item_type)
    if types.is_list(dt) or types.is_large_list(dt):
        return _needs_conversion(dt.value_type)
    return bool(types.is_fixed_size_list(dt) or types.is_list_view(dt) or types.is_large_list_view(dt))


def _decimal_to_fixed(arr: pa.Array) -> pa.Array:
    """decimal -> big-endian two's-complement bytes of Iceberg's fixed width."""
    dt = arr.type
    arr.validate(full=True)  # every value within the precision (as Java checks on write)
    if dt.byte_width < 16:
        arr = arr.cast(pa.decimal128(dt.precision, dt.scale))
    n, width = len(arr), arr.type.byte_width
    size = decimal_required_bytes(dt.precision)
    data = np.frombuffer(arr.buffers()[1], np.uint8, count=(arr.offset + n) * width)[arr.offset * width :]
    data = data.reshape(n, width)
    out = np.ascontiguousarray(data[:, size - 1 :: -1])  # the low bytes, big-endian
    return pa.Array.from_buffers(pa.binary(size), n, [_validity(arr), pa.py_buffer(out)], arr.null_count)


def to_writable(arr: pa.Array) -> pa.Array:
    """An array whose ``to_pylist(maps_as_pydicts="strict")`` gives the values fastavro
    writes for the Avro type of ``arr.type``: ints for dates, times and timestamps,
    bytes for decimals and UUIDs, structs keyed by Avro names, lists of key/value
    structs for maps with non-string keys."""
    dt = arr.type
    if not _needs_conversion(dt):
        return arr
    types = pa.types
    if isinstance(dt, pa.BaseExtensionType):
        return to_writable(arr.storage)
    if types.is_dictionary(dt):
        return to_writable(arr.dictionary_decode())
    if types.is_decimal(dt):
        return _decimal_to_fixed(arr)
    if types.is_timestamp(dt):
        if dt.unit in ("s", "ms"):
            arr = arr.cast(pa.timestamp("us", dt.tz))
        return arr.view(pa.int64())
    if types.is_date(dt):
        return (arr.cast(pa.date32()) if types.is_date64(dt) else arr).view(pa.int32())
    if types.is_time(dt):
        return arr.cast(pa.time64("us")).view(pa.int64())
    if dt == pa.float16():
        return arr.cast(pa.float32())
    if types.is_struct(dt):
        children = [to_writable(arr.field(i)) for i in range(dt.num_fields)]
        names = [avro_name(f.name) for f in dt]
        return pa.StructArray.from_arrays(children, names=names, mask=_mask(arr))
    if types.is_map(dt):
        keys, items = to_writable(arr.keys), to_writable(arr.items)
        key = dt.key_type
        if types.is_string(key) or types.is_large_string(key) or types.is_string_view(key):
            return pa.MapArray.from_arrays(_offsets(arr), keys, items, mask=_mask(arr))
        entries = pa.StructArray.from_arrays([keys, items], names=["key", "value"])
        return pa.ListArray.from_arrays(_offsets(arr), entries, mask=_mask(arr))
    if types.is_fixed_size_list(dt) or types.is_list_view(dt) or types.is_large_list_view(dt):
        return to_writable(arr.cast(pa.large_list(dt.value_field)))
    values = to_writable(arr.values)
    cls = pa.LargeListArray if types.is_large_list(dt) else pa.ListArray
    return cls.from_arrays(_offsets(arr), values, mask=_mask(arr))


def writable_rows(batch: pa.RecordBatch) -> list[dict]:
    """The rows of ``batch`` as the dicts fastavro writes (keys are Avro field names)."""
    columns = [to_writable(c) for c in batch.columns]
    names = [avro_name(f.name) for f in batch.schema]
    return pa.RecordBatch.from_arrays(columns, names=names).to_pylist(maps_as_pydicts="strict")

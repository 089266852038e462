"""Z-order: the row order of a ``rewrite_data_files`` with ``sort_order => 'zorder(a, b)'``,
computed as Iceberg Java's Spark rewrite computes it (``ZOrderByteUtils``,
``SparkZOrderUDF``).

Each column becomes bytes that sort as its values do:

* whole numbers (int, long; a date as its day number, a ``timestamp`` as Spark's cast of
  it to long, whole seconds; a ``timestamp_ntz`` as microseconds): 8 bytes big-endian with
  the sign bit flipped;
* float and double: the double's 8 bytes with the sign bit flipped, or every bit of a
  negative one flipped (a NaN as Java's canonical NaN);
* boolean: 8 bytes, the first 0x81 for true;
* string (a uuid as its text) and binary (fixed too): the first ``var-length-contribution``
  bytes (default 8) of the UTF-8 (a character that does not fit whole is left out, as
  Java's encoder leaves it) or of the value, zero-filled;
* null: zeros.

The columns' bits are interleaved (the first bit of each column, then the second, ...; a
column out of bytes is passed over) into at most ``max-output-size`` bytes, and the rows
are sorted by those bytes, unsigned.  Decimals, times, nanosecond timestamps and nested
types cannot be z-ordered (as in Java); identity partition columns are left out with a
warning (their value is constant within a partition; all of them: refused); a column
named twice contributes twice, as in Java.
"""

from __future__ import annotations

import re
import uuid
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DoubleType,
    FixedType,
    FloatType,
    IntegerType,
    LongType,
    StringType,
    TimestampType,
    TimestamptzType,
    UUIDType,
)

__all__ = ["ZOrder", "parse_zorder", "struct_path_ids"]

#: bytes of a fixed-width column (Java's PRIMITIVE_BUFFER_SIZE)
PRIMITIVE_SIZE = 8
VAR_LENGTH_OPTION = "var-length-contribution"
MAX_OUTPUT_OPTION = "max-output-size"
#: the name of Java's internal z-value column: a table with a column of that name is refused there
Z_COLUMN = "ICEZVALUE"
_JAVA_INT_MAX = 2**31 - 1
_CHUNK_ROWS = 1 << 16
_CANONICAL_NAN = np.uint64(0x7FF8000000000000)
_SIGN = np.uint64(1 << 63)
_ZORDER = re.compile(r"\s*zorder\s*\((?P<columns>[^()]*)\)\s*", re.IGNORECASE)
_ZORDER_CALL = re.compile(r"(?<![\w`])zorder\s*\(", re.IGNORECASE)  # (a column named zorder_rank is a plain one)
_WHOLE = (IntegerType, LongType, DateType, TimestampType, TimestamptzType)
_VARIABLE = (StringType, UUIDType, BinaryType, FixedType)


@dataclass(frozen=True)
class ZOrder:
    """The z-order of the fields ``source_ids`` (resolved and checked by :func:`parse_zorder`)."""

    source_ids: tuple[int, ...]
    var_length: int = PRIMITIVE_SIZE
    max_output: int = _JAVA_INT_MAX

    #: files written in a z-order claim no sort order of the table
    order_id = 0

    def values(self, columns: list[tuple[pa.Array, Any]]) -> pa.Array:
        """The z-value of each row (fixed-size binary) of ``columns``: the values of the
        fields ``source_ids`` in that order, each with its Iceberg type."""
        ordered = [_ordered_bytes(values, field_type, self.var_length) for values, field_type in columns]
        rows = len(columns[0][0])
        widths = [c.shape[1] for c in ordered]
        size = min(sum(widths), self.max_output)
        order = _interleaving(tuple(widths), size)
        packed = np.empty((rows, size), dtype=np.uint8)
        for start in range(0, rows, _CHUNK_ROWS):  # the rows' bits, a bounded number at a time
            chunk = slice(start, start + _CHUNK_ROWS)
            bits = np.concatenate([np.unpackbits(c[chunk], axis=1) for c in ordered], axis=1)
            packed[chunk] = np.packbits(bits[:, order], axis=1)
        return pa.FixedSizeBinaryArray.from_buffers(pa.binary(size), rows, [None, pa.py_buffer(packed.tobytes())])


def struct_path_ids(schema: Schema) -> set[int]:
    """Ids of the fields reachable through structs only (not inside a list or map)."""
    found: set[int] = set()
    pending = list(schema.fields)
    while pending:
        field = pending.pop()
        found.add(field.field_id)
        if field.field_type.is_struct:
            pending.extend(field.field_type.fields)
    return found


def parse_zorder(text: Any, schema: Schema, identity_sources: set[int], options: dict[str, Any], *,
                 where: str = "") -> ZOrder | None:
    """A :class:`ZOrder` for ``text`` when it is ``zorder(a, b, ...)`` (one or more such
    terms, comma-separated), None when it names no z-order; ValueError when it mixes
    z-order with plain sort columns or names a column that cannot be z-ordered."""
    if not isinstance(text, str) or not _ZORDER_CALL.search(text):
        return None
    terms = _split_terms(text)
    matched = [_ZORDER.fullmatch(term) for term in terms]
    if not all(matched):
        raise ValueError(f"{where}cannot mix plain sort columns and a zorder expression: {text!r}")
    names = [name.strip() for m in matched for name in m["columns"].split(",")]
    if not names or any(not name for name in names):
        raise ValueError(f"{where}cannot z-order: {text!r} names an empty column")
    if any(f.name.lower() == Z_COLUMN.lower() for f in schema.fields):
        raise ValueError(f"{where}cannot z-order: the table has a column named {Z_COLUMN!r} (the name Iceberg "
                         "gives its z-value)")
    ids, reachable = [], struct_path_ids(schema)
    for name in names:
        field = _find(schema, name)
        if field is None:
            raise ValueError(f"{where}cannot z-order by {name!r}: no such column")
        if not isinstance(field.field_type, (*_WHOLE, FloatType, DoubleType, BooleanType, *_VARIABLE)):
            raise ValueError(f"{where}cannot z-order by column {name!r} of type {field.field_type}: the type is "
                             "unsupported")
        if field.field_id not in reachable:
            raise ValueError(f"{where}cannot z-order by {name!r}: a field inside a list or map")
        if field.field_id in identity_sources:  # as Java: left out, with a warning
            warnings.warn(f"{where}z-order: column {name!r} left out: an identity partition column is constant "
                          "within a partition", stacklevel=3)
            continue
        ids.append(field.field_id)  # a column named twice counts twice, as in Java
    if not ids:
        raise ValueError(f"{where}cannot z-order: every column given is an identity partition column (constant "
                         "within a partition)")
    return ZOrder(tuple(ids), _positive_option(options, VAR_LENGTH_OPTION, PRIMITIVE_SIZE, where),
                  _positive_option(options, MAX_OUTPUT_OPTION, _JAVA_INT_MAX, where))


def _split_terms(text: str) -> list[str]:
    """``text`` split at the commas outside parentheses."""
    terms, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += (char == "(") - (char == ")")
        if char == "," and depth == 0:
            terms.append(text[start:i])
            start = i + 1
    terms.append(text[start:])
    return terms


def _find(schema: Schema, name: str) -> Any:
    """The field ``name`` names: exactly, or else ignoring case (as Spark's default
    resolution, under which Java's procedure looks columns up)."""
    for case_sensitive in (True, False):
        try:
            return schema.find_field(name, case_sensitive=case_sensitive)
        except ValueError:
            pass
    return None


def _positive_option(options: dict[str, Any], name: str, default: int, where: str) -> int:
    value = options.get(name)
    if value is None:
        return default
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ValueError(f"{where}option {name!r} is not a whole number: {value!r}") from None
    if not 1 <= number <= _JAVA_INT_MAX:
        raise ValueError(f"{where}option {name!r} must be at least 1 byte, was {value!r}")
    return number


def _interleaving(widths: tuple[int, ...], size: int) -> np.ndarray:
    """For each output bit, its index among the columns' bits laid side by side (Java's
    ``interleaveBits``: bit b of byte y of every column in turn, a column out of bytes
    passed over)."""
    offsets = np.cumsum((0, *widths[:-1])) * 8
    order = []
    column, byte, bit = 0, 0, 0
    while True:
        order.append(offsets[column] + byte * 8 + bit)
        if len(order) == size * 8:
            break
        while True:
            column += 1
            if column == len(widths):
                column, bit = 0, bit + 1
                if bit == 8:
                    byte, bit = byte + 1, 0
            if widths[column] > byte:
                break
    return np.asarray(order, dtype=np.int64)


def _ordered_bytes(values: pa.Array, field_type: Any, var_length: int) -> np.ndarray:
    """(rows, width) unsigned bytes of one column, sorting as its values."""
    valid = np.asarray(values.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    if isinstance(field_type, _VARIABLE):
        return _variable_bytes(values, field_type, var_length, valid)
    out = np.zeros((len(values), PRIMITIVE_SIZE), dtype=np.uint8)
    if isinstance(field_type, BooleanType):
        truth = np.asarray(values.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)
        out[truth & valid, 0] = 0x81
        return out
    if isinstance(field_type, (FloatType, DoubleType)):
        doubles = np.asarray(values.cast(pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False), dtype=np.float64)
        bits = doubles.view(np.uint64).copy()
        bits[np.isnan(doubles)] = _CANONICAL_NAN
        negative = (bits & _SIGN) != 0
        bits = np.where(negative, ~bits, bits | _SIGN)
    else:
        bits = _whole(values, field_type).view(np.uint64) ^ _SIGN
    out[valid] = bits[valid].astype(">u8").view(np.uint8).reshape(-1, PRIMITIVE_SIZE)
    return out


def _whole(values: pa.Array, field_type: Any) -> np.ndarray:
    """The signed 64-bit number Java orders a whole-number-like value by (0 for a null)."""
    if isinstance(field_type, DateType):
        values = values.cast(pa.int32())
    elif isinstance(field_type, TimestampType):  # Spark's timestamp_ntz: microseconds
        values = values.cast(pa.timestamp("us")).cast(pa.int64())
    elif isinstance(field_type, TimestamptzType):  # Spark's cast of a timestamp to long: floor seconds
        micros = values.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
        return np.floor_divide(np.asarray(micros.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64),
                               1_000_000)
    return np.asarray(values.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)


def _variable_bytes(values: pa.Array, field_type: Any, length: int, valid: np.ndarray) -> np.ndarray:
    """The first ``length`` bytes of each value, zero-filled; a string's UTF-8 cut before a
    character that does not fit whole."""
    out = np.zeros((len(values), length), dtype=np.uint8)
    text = isinstance(field_type, (StringType, UUIDType))
    for row, value in enumerate(values.to_pylist()):
        if not valid[row]:
            continue
        if isinstance(field_type, UUIDType) and isinstance(value, (bytes, bytearray)):
            value = uuid.UUID(bytes=bytes(value))  # Spark reads a uuid as its text
        data = str(value).encode("utf-8", "replace") if text else bytes(value)
        if len(data) > length:
            cut = length
            if text:
                while cut > 0 and (data[cut] & 0xC0) == 0x80:  # data[cut] continues a character
                    cut -= 1
            data = data[:cut]
        out[row, :len(data)] = np.frombuffer(data, dtype=np.uint8)
    return out

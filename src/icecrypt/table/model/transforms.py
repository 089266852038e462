"""Partition transforms in Iceberg Java's arithmetic, where PyIceberg's differs.

Java computes ``truncate[W]`` of an ``int`` in 32-bit and of a ``long`` in 64-bit
arithmetic, ``v - (((v % W) + W) % W)`` with ``%`` taking the sign of the dividend, so
values near the minimum wrap around: ``truncate[10](-2147483648)`` is ``2147483646``
(and, for a width above 2^30, ``(v % W) + W`` itself wraps).  Tables Java wrote hold
those partition values; PyIceberg computes with Python's unbounded integers.  This module
gives the one definition both the write path (:func:`truncate_integers`, vectorized)
and pruning (:func:`java_spec`: the projections of a row filter onto the partition
values) use.  Every other transform already agrees with Java (bucket hashes, decimal
and string truncation, the temporal transforms).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import (
    BoundGreaterThan,
    BoundGreaterThanOrEqual,
    BoundLessThan,
    BoundLessThanOrEqual,
    EqualTo,
    Or,
    Reference,
    UnboundPredicate,
)
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.transforms import BoundTransform, TruncateTransform
from pyiceberg.types import IcebergType, IntegerType, LongType

__all__ = ["JavaTruncateTransform", "java_spec", "truncate_integer", "truncate_integers"]


def _wrap(value: int, bits: int) -> int:
    """``value`` as a two's-complement integer of ``bits`` bits holds it (Java's overflow)."""
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def _rem(a: int, b: int) -> int:
    """Java's ``a % b``: the remainder takes the sign of the dividend."""
    r = abs(a) % abs(b)
    return -r if a < 0 else r


def truncate_integer(value: int, width: int, bits: int) -> int:
    """Java's ``truncate[width]`` of an integer of ``bits`` (32: int, 64: long) bits."""
    value = _wrap(value, bits)
    return _wrap(value - _rem(_wrap(_rem(value, width) + width, bits), width), bits)


def truncate_integers(values: pa.Array, width: int) -> pa.Array:
    """:func:`truncate_integer` of an int32 or int64 array, in its own type with Arrow's
    wrapping (unchecked) arithmetic, exactly as Java computes it."""
    w = pa.scalar(width, values.type)

    def rem(a: pa.Array) -> pa.Array:  # integer division truncates toward zero, as Java's
        return pc.subtract(a, pc.multiply(pc.divide(a, w), w))

    return pc.subtract(values, rem(pc.add(rem(values), w)))


class JavaTruncateTransform(TruncateTransform):
    """PyIceberg's ``truncate`` with Java's integer arithmetic, for projecting row filters
    onto partition values Java (and icecrypt) wrote.

    Projections stay inclusive where wrapping breaks the order: the values just above the
    integer minimum land in the top partition ``truncate(MIN)``, so a ``<``/``<=``
    projection keeps that partition too, and a ``>``/``>=`` whose boundary lies among
    those values does not prune (Java's own projection drops those rows there)."""

    def transform(self, source: IcebergType, bucket: bool = True) -> Any:
        bits = _bits(source)
        if bits is None:
            return super().transform(source)
        width = self.width
        return lambda value: None if value is None else truncate_integer(value, width, bits)

    def project(self, name: str, pred: Any) -> UnboundPredicate | None:
        projected = super().project(name, pred)
        bits = _bits(pred.term.ref().field.field_type)
        if projected is None or bits is None or isinstance(pred.term, BoundTransform):
            return projected
        lowest = -(1 << (bits - 1))
        wrapped = truncate_integer(lowest, self.width, bits)
        if wrapped == lowest:  # the minimum is a multiple of the width: nothing wraps
            return projected
        if isinstance(pred, (BoundLessThan, BoundLessThanOrEqual)):
            return Or(projected, EqualTo(Reference(name), wrapped))
        if isinstance(pred, (BoundGreaterThan, BoundGreaterThanOrEqual)):
            boundary = _wrap(pred.literal.value + (1 if isinstance(pred, BoundGreaterThan) else 0), bits)
            if truncate_integer(boundary, self.width, bits) > boundary:  # among the wrapped values
                return None
        return projected


def _bits(source: IcebergType) -> int | None:
    return 32 if isinstance(source, IntegerType) else 64 if isinstance(source, LongType) else None


def java_spec(spec: PartitionSpec) -> PartitionSpec:
    """``spec`` with its ``truncate`` fields computing as Java does (for projections)."""
    if not any(type(f.transform) is TruncateTransform for f in spec.fields):
        return spec
    fields = [
        PartitionField(f.source_id, f.field_id, JavaTruncateTransform(f.transform.width), f.name)
        if type(f.transform) is TruncateTransform else f
        for f in spec.fields
    ]  # fmt: skip
    return PartitionSpec(*fields, spec_id=spec.spec_id)

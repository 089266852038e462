"""Spark's pushed predicates (their JSON form, ``org.icecrypt.spark.catalog.Changes``) as
Iceberg row filters.

A scan uses them to prune manifests, files and row groups only: Spark evaluates every
predicate again on the rows, so a predicate that has no Iceberg form is simply left out
(never approximated by something narrower).  An overwrite's condition must convert
whole (it decides which rows go): :func:`to_filter` with ``strict`` raises then.

Literals arrive in Spark's internal form and are turned into the column's Iceberg
value: dates as days, timestamps as microseconds, decimals as their digits, binaries in
base64.  Spark's ``x = NaN`` (true for NaN in Spark) becomes ``is_nan(x)``; other
comparisons with NaN are left out.
"""

from __future__ import annotations

import base64
import decimal
import math
from collections.abc import Mapping
from typing import Any

from pyiceberg.expressions import (
    AlwaysFalse,
    AlwaysTrue,
    And,
    BooleanExpression,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNaN,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    NotEqualTo,
    NotNull,
    Or,
    StartsWith,
)

__all__ = ["to_filter"]


class _NoForm(Exception):
    """A predicate (or part of one) with no Iceberg form."""


_COMPARISONS = {"=": EqualTo, "<>": NotEqualTo, "<": LessThan, "<=": LessThanOrEqual, ">": GreaterThan,
                ">=": GreaterThanOrEqual}
_FLIPPED = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "=": "=", "<>": "<>"}


def _column(node: Mapping[str, Any], rename: Any) -> str:
    if "ref" not in node:
        raise _NoForm
    return rename(".".join(node["ref"]))


def _value(node: Mapping[str, Any]) -> Any:
    if "lit" not in node:
        raise _NoForm
    value, kind = node["lit"], node.get("type")
    if value is None:
        return None
    if kind in ("float", "double"):
        return float(value)
    if kind == "decimal" or (kind or "").startswith("decimal("):  # Spark's typeName: decimal(p,s)
        return decimal.Decimal(value)
    if kind == "binary":
        return base64.b64decode(value)
    if kind in ("boolean", "integer", "short", "byte", "long", "date", "timestamp", "timestamp_ntz", "string"):
        return value
    raise _NoForm


def literal_value(node: Mapping[str, Any]) -> Any:
    """The Python value of a literal the JVM sent (``Changes.literal``: dates as days,
    timestamps as microseconds); ValueError for one without that form."""
    try:
        return _value(node)
    except _NoForm:
        raise ValueError(f"not a literal: {node!r}") from None


def _nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _convert(node: Mapping[str, Any], rename: Any) -> BooleanExpression:
    op = node.get("op")
    args = node.get("args") or []
    if op == "AND":
        return And(_convert(args[0], rename), _convert(args[1], rename))
    if op == "OR":
        return Or(_convert(args[0], rename), _convert(args[1], rename))
    if op == "NOT":
        return Not(_convert(args[0], rename))
    if "lit" in node and isinstance(node["lit"], bool):  # Spark's AlwaysTrue / AlwaysFalse, as literals
        return AlwaysTrue() if node["lit"] else AlwaysFalse()
    if op == "ALWAYS_TRUE":
        return AlwaysTrue()
    if op == "ALWAYS_FALSE":
        return AlwaysFalse()
    if op == "IS_NULL":
        return IsNull(_column(args[0], rename))
    if op == "IS_NOT_NULL":
        return NotNull(_column(args[0], rename))
    if op in _COMPARISONS or op == "<=>":
        left, right = args
        if "ref" not in left:
            left, right = right, left
            op = _FLIPPED.get(op, op)
        column, value = _column(left, rename), _value(right)
        if value is None:
            if op == "<=>":
                return IsNull(column)
            return AlwaysFalse()  # a comparison with NULL is never true
        if _nan(value):
            if op in ("=", "<=>"):
                return IsNaN(column)
            raise _NoForm
        if isinstance(value, float) and math.isinf(value):
            raise _NoForm
        return _COMPARISONS["=" if op == "<=>" else op](column, value)
    if op == "IN":
        column = _column(args[0], rename)
        values = [_value(a) for a in args[1:]]
        values = [v for v in values if v is not None]
        if any(_nan(v) for v in values):
            raise _NoForm
        return In(column, values) if values else AlwaysFalse()
    if op == "STARTS_WITH":
        value = _value(args[1])
        if not isinstance(value, str):
            raise _NoForm
        return StartsWith(_column(args[0], rename), value)
    raise _NoForm


def _renamer(schema: Any, read_schema: Any) -> Any:
    """Column name in ``read_schema`` -> the name of the same field (by id) in ``schema``."""
    if read_schema is None or read_schema is schema:
        return lambda name: name

    def rename(name: str) -> str:
        try:
            field_id = read_schema.find_field(name).field_id
            return schema.find_column_name(field_id) or _missing(name)
        except ValueError:
            raise _NoForm from None

    return rename


def _missing(name: str) -> str:
    raise _NoForm


def to_filter(predicates: list[Mapping[str, Any]], schema: Any, *, strict: bool = False,
              read_schema: Any = None) -> BooleanExpression:
    """The conjunction of ``predicates`` that bind to ``schema`` (the rest left out), or
    with ``strict`` all of them (ValueError naming one that has no Iceberg form).
    ``read_schema``: the schema the predicates' column names are of, when it is not
    ``schema`` (a scan of a snapshot written before columns were renamed: names are
    translated by field id; a predicate on a column the snapshot's schema lacks is left
    out)."""
    from icecrypt.table.ops.write import _bind_filter

    rename = _renamer(schema, read_schema)
    result: BooleanExpression = AlwaysTrue()
    for predicate in predicates:
        try:
            expression = _convert(predicate, rename)
            _bind_filter(expression, schema)
        except (_NoForm, ValueError, TypeError, KeyError, IndexError):
            if strict:
                raise ValueError(f"the condition {_show(predicate)} has no Iceberg row filter form") from None
            continue
        result = expression if isinstance(result, AlwaysTrue) else And(result, expression)
    return result


def _show(node: Any) -> str:
    if isinstance(node, Mapping):
        if "ref" in node:
            return ".".join(node["ref"])
        if "lit" in node:
            return repr(node["lit"])
        return f"{node.get('op')}({', '.join(_show(a) for a in node.get('args') or [])})"
    return repr(node)


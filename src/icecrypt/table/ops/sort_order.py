"""Sort orders (``table.replace_sort_order()``): replace the table's default sort order,
committed as ``add-sort-order`` + ``set-default-sort-order`` on the commit model.

As Iceberg Java's ``ReplaceSortOrder``: the order is built from nothing by ``asc`` and
``desc`` calls (no call: the table becomes unsorted, order 0); ``asc`` puts nulls first
and ``desc`` nulls last unless told otherwise; the order takes the id of an existing
order with the same fields, 0 when unsorted, else the highest id + 1.  Writers then sort
the rows of each new data file by the default order and record its id in the file's
``sort_order_id``; ``rewrite_data_files(strategy="sort")`` rewrites files sorted.
"""

from __future__ import annotations

import re
from typing import Any

from pyiceberg.schema import Schema
from pyiceberg.table.sorting import NullOrder, SortDirection
from pyiceberg.types import PrimitiveType

from icecrypt.table.model import changes as _model
from icecrypt.table.ops.refs import _Operation
from icecrypt.table.ops.spec import to_transform
from icecrypt.table.files.zorder import struct_path_ids

__all__ = ["ReplaceSortOrder", "parse_sort_order", "sort_order_json"]

UNSORTED_ORDER_ID = 0
DISTRIBUTION_MODE = "write.distribution-mode"
DISTRIBUTION_MODES = ("none", "hash", "range")


def _null_order(value: Any, direction: SortDirection) -> str:
    if value is None:
        return (NullOrder.NULLS_FIRST if direction == SortDirection.ASC else NullOrder.NULLS_LAST).value
    if isinstance(value, NullOrder):
        return value.value
    text = str(value).strip().lower().replace("_", "-").replace(" ", "-")
    if text in ("nulls-first", "first"):
        return NullOrder.NULLS_FIRST.value
    if text in ("nulls-last", "last"):
        return NullOrder.NULLS_LAST.value
    raise ValueError(f"null order must be 'nulls-first' or 'nulls-last', not {value!r}")


def sort_field_json(
    schema: Schema, column: Any, transform: Any, direction: SortDirection, null_order: Any, *, case_sensitive: bool = True,
    where: str = "",
) -> dict[str, Any]:
    """One ``sort-orders`` field, checked against ``schema``."""
    if not isinstance(column, str) or not column:
        raise ValueError(f"a sort column name must be a non-empty string, not {column!r}")
    try:
        field = schema.find_field(column, case_sensitive=case_sensitive)
    except ValueError:
        raise ValueError(f"{where}cannot sort by {column!r}: no such column in the schema") from None
    name = schema.find_column_name(field.field_id) or column
    if field.field_id not in struct_path_ids(schema):
        raise ValueError(f"{where}cannot sort by {name!r}: a field inside a list or map cannot be a sort key")
    if not isinstance(field.field_type, PrimitiveType):
        raise ValueError(f"{where}cannot sort by {name!r}: {field.field_type} is not a primitive type")
    parsed = to_transform(transform)
    if not parsed.can_transform(field.field_type):
        raise ValueError(f"{where}cannot sort by {parsed}({name}): {parsed} does not apply to {field.field_type} values")
    return {
        "transform": str(parsed),
        "source-id": field.field_id,
        "direction": direction.value,
        "null-order": _null_order(null_order, direction),
    }


def sort_order_json(metadata: dict[str, Any], fields: list[dict[str, Any]]) -> dict[str, Any]:
    """The order with ``fields`` and its id in ``metadata`` (as Java: an existing order
    with the same fields keeps its id; unsorted is 0; else the highest id + 1)."""
    if not fields:
        return {"order-id": UNSORTED_ORDER_ID, "fields": []}
    new_id = 1
    for order in metadata.get("sort-orders") or ():
        if list(order.get("fields") or ()) == fields:
            return {"order-id": order["order-id"], "fields": [dict(f) for f in fields]}
        new_id = max(new_id, order["order-id"] + 1)
    return {"order-id": new_id, "fields": fields}


_TERM = re.compile(r"(\w+)\(\s*(?:(\d+)\s*,\s*)?([^()\s,]+)\s*\)")
_SORT_TERM = re.compile(r"(?P<expr>.+?)(?:\s+(?P<dir>asc|desc))?(?:\s+nulls\s+(?P<nulls>first|last))?\s*", re.IGNORECASE)


def parse_term(item: str) -> tuple[str, str]:
    """``(column, transform name)`` of ``COLUMN`` / ``transform(COLUMN)`` /
    ``bucket(N, COLUMN)`` / ``truncate(W, COLUMN)`` (Spark SQL's forms)."""
    item = item.strip()
    match = _TERM.fullmatch(item)
    if match is None:
        return item, "identity"
    name, width, column = match.groups()
    return column, f"{name}[{width}]" if width else name


def split_terms(text: str) -> list[str]:
    """Split on commas outside parentheses (``bucket(16, id)`` stays whole)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


def parse_sort_terms(text: Any, *, where: str = "") -> list[tuple[str, str, SortDirection, str | None]]:
    """``(column, transform, direction, null order or None)`` of each term of a Spark SQL
    style order: ``"day(ts) DESC NULLS LAST, bucket(16, id), name"``."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{where}a sort order is terms like 'id DESC NULLS LAST, day(ts)', not {text!r}")
    terms = []
    for term in split_terms(text):
        match = _SORT_TERM.fullmatch(term)
        if not term or match is None or " " in match["expr"].strip() and _TERM.fullmatch(match["expr"].strip()) is None:
            raise ValueError(
                f"{where}cannot read sort term {term!r} of {text!r} "
                "(expected: column or transform(column), then ASC|DESC, then NULLS FIRST|NULLS LAST)"
            )
        column, transform = parse_term(match["expr"])
        direction = SortDirection.DESC if (match["dir"] or "asc").lower() == "desc" else SortDirection.ASC
        nulls = f"nulls-{match['nulls'].lower()}" if match["nulls"] else None
        terms.append((column, transform, direction, nulls))
    return terms


def parse_sort_order(text: Any, schema: Schema, *, where: str = "") -> list[dict[str, Any]]:
    """Sort fields (checked against ``schema``) from a Spark SQL style order."""
    return [
        sort_field_json(schema, column, transform, direction, nulls, where=where)
        for column, transform, direction, nulls in parse_sort_terms(text, where=where)
    ]


class ReplaceSortOrder(_Operation):
    """A new default sort order, built from nothing and committed once::

        with table.replace_sort_order() as order:
            order.asc("category").desc("ts", "day", null_order="nulls-first")

    ``asc(column, transform="identity", null_order="nulls-first")`` and
    ``desc(column, transform="identity", null_order="nulls-last")``; a transform is an
    Iceberg transform name or a PyIceberg transform.  No call at all makes the table
    unsorted.  Committed on leaving the ``with`` block (or by :meth:`commit`); an order
    equal to the current default commits nothing."""

    what = "sort order replacement"

    def __init__(self, table: Any, *, case_sensitive: bool = True) -> None:
        super().__init__(table)
        from icecrypt.table.ops.write import _schema

        self._schema = _schema(self._base)
        self._case_sensitive = case_sensitive
        self._fields: list[dict[str, Any]] = []
        self._distribution_mode: str | None = None

    def _term(self, column: str, transform: Any, direction: SortDirection, null_order: Any):
        if self._done:
            raise ValueError(f"this {self.what} was already committed; start a new one")
        field = sort_field_json(
            self._schema, column, transform, direction, null_order, case_sensitive=self._case_sensitive,
            where=f"{self._base_location}: ",
        )
        if any(f["source-id"] == field["source-id"] and f["transform"] == field["transform"] for f in self._fields):
            raise ValueError(f"cannot sort by {field['transform']}({column}) twice in one order")
        self._fields.append(field)
        return self

    def asc(self, source_column_name: str, transform: Any = "identity", null_order: Any = None):
        """Sort ascending by ``transform(source_column_name)`` (nulls first by default)."""
        return self._term(source_column_name, transform, SortDirection.ASC, null_order)

    def desc(self, source_column_name: str, transform: Any = "identity", null_order: Any = None):
        """Sort descending by ``transform(source_column_name)`` (nulls last by default)."""
        return self._term(source_column_name, transform, SortDirection.DESC, null_order)

    def distribution_mode(self, mode: str):
        """Also set ``write.distribution-mode`` (``none``, ``hash`` or ``range``), in the same
        commit (Iceberg's ``ALTER TABLE ... WRITE ...``)."""
        if self._done:
            raise ValueError(f"this {self.what} was already committed; start a new one")
        if mode not in DISTRIBUTION_MODES:
            raise ValueError(f"write.distribution-mode is one of {', '.join(DISTRIBUTION_MODES)}, not {mode!r}")
        self._distribution_mode = mode
        return self

    def apply(self) -> dict[str, Any]:
        """The sort order this replacement makes (``metadata.json`` form), with its id."""
        return sort_order_json(self._base, self._fields)

    def commit(self) -> str | None:
        """Commit the order as the table's default (nothing when it already is);
        returns the new metadata location or None."""
        if self._done:
            raise ValueError(f"this {self.what} was already committed; start a new one")
        order = self.apply()
        if order["order-id"] != self._base.get("default-sort-order-id", UNSORTED_ORDER_ID):
            known = {o["order-id"] for o in self._base.get("sort-orders") or ()}
            updates: list[_model.TableUpdate] = [] if order["order-id"] in known else [_model.AddSortOrder(order)]
            self._updates = [*updates, _model.SetDefaultSortOrder(order["order-id"])]
        mode = self._distribution_mode
        if mode is not None and (self._base.get("properties") or {}).get(DISTRIBUTION_MODE) != mode:
            self._updates.append(_model.SetProperties({DISTRIBUTION_MODE: mode}))
        return super().commit()

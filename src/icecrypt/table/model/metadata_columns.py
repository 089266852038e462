"""Iceberg's metadata columns: what a scan can project beside the table's own columns.

Field ids and names are the spec's reserved ones (table "Reserved Field IDs"), the same
Iceberg Java's ``MetadataColumns`` gives them:

==========  ==================================  ========  ==========================================
field id    name                                type      value
==========  ==================================  ========  ==========================================
2147483646  ``_file``                           string    the data file's location (as recorded)
2147483645  ``_pos``                            long      the row's position in its data file
                                                          (before deletes are applied)
2147483644  ``_deleted``                        boolean   whether a delete removes the row; a scan
                                                          that projects it keeps deleted rows
2147483643  ``_spec_id``                        int       the data file's partition spec id
2147483642  ``_partition``                      struct    the data file's partition (all specs'
                                                          fields, null where a spec lacks one)
2147483540  ``_row_id``                         long      row lineage (format v3): the row's id
2147483539  ``_last_updated_sequence_number``   long      row lineage: the sequence number of the
                                                          commit that last added or changed the row
==========  ==================================  ========  ==========================================

Row lineage is inherited where a data file does not store it (the column is missing or
null): ``_row_id`` = the file's ``first_row_id`` + the row's position,
``_last_updated_sequence_number`` = the file's data sequence number.  A writer that moves
rows into a new file (compaction, re-keying) stores both columns, under the reserved ids
and names, so that the rows keep them.  A table column of the same name (compared ignoring
case) hides the metadata column, in projections and row filters alike.  Row filters may name
all but ``_partition``; pruning ignores such predicates (:func:`without_metadata`).
"""

from __future__ import annotations

from collections.abc import Mapping

from pyiceberg.expressions import (
    AlwaysFalse,
    AlwaysTrue,
    And,
    BooleanExpression,
    BoundPredicate,
    Not,
    Or,
    UnboundPredicate,
)
from pyiceberg.expressions.visitors import BooleanExpressionVisitor, rewrite_not, visit
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.types import BooleanType, IntegerType, LongType, NestedField, StringType, StructType

__all__ = [
    "FILE_PATH",
    "IS_DELETED",
    "LAST_UPDATED_SEQUENCE_NUMBER",
    "LINEAGE",
    "METADATA_NAMES",
    "PARTITION_ID",
    "ROW_ID",
    "ROW_POSITION",
    "SPEC_ID",
    "RebuildingVisitor",
    "filter_schema",
    "is_metadata",
    "lineage_columns",
    "metadata_field",
    "partition_type",
    "without_metadata",
]

FILE_PATH = NestedField(2147483646, "_file", StringType(), required=True)
ROW_POSITION = NestedField(2147483645, "_pos", LongType(), required=True)
IS_DELETED = NestedField(2147483644, "_deleted", BooleanType(), required=True)
SPEC_ID = NestedField(2147483643, "_spec_id", IntegerType(), required=True)
PARTITION_ID = 2147483642
PARTITION_NAME = "_partition"
ROW_ID = NestedField(2147483540, "_row_id", LongType(), required=False)
LAST_UPDATED_SEQUENCE_NUMBER = NestedField(2147483539, "_last_updated_sequence_number", LongType(), required=False)

#: the row lineage columns, in the order writers append them to a data file's columns
LINEAGE = (ROW_ID, LAST_UPDATED_SEQUENCE_NUMBER)
_FIXED = {f.name: f for f in (FILE_PATH, ROW_POSITION, IS_DELETED, SPEC_ID, ROW_ID, LAST_UPDATED_SEQUENCE_NUMBER)}
METADATA_NAMES = frozenset([*_FIXED, PARTITION_NAME])
_IDS = frozenset([*(f.field_id for f in _FIXED.values()), PARTITION_ID])
#: formats with row lineage
LINEAGE_FORMAT_VERSION = 3


def is_metadata(field: NestedField) -> bool:
    """Whether ``field`` (of a projected schema) is a metadata column."""
    return field.field_id in _IDS


def partition_type(specs: Mapping[int, PartitionSpec], schema: Schema) -> StructType:
    """The type of ``_partition`` and of the metadata tables' ``partition``: every
    partition field of every spec (by partition field id, in id order, the newest spec's
    name), all optional — a row of a file written under another spec has nulls for the
    fields its spec lacks.  A field whose source column ``schema`` no longer has is left
    out, as Iceberg Java leaves it out of a table's partition type."""
    fields: dict[int, NestedField] = {}
    columns = schema._lazy_id_to_field
    for spec_id in sorted(specs):
        for field in specs[spec_id].fields:
            source = columns.get(field.source_id)
            if source is not None:
                fields[field.field_id] = NestedField(field.field_id, field.name,
                                                     field.transform.result_type(source.field_type), required=False)
    return StructType(*(fields[i] for i in sorted(fields)))


def metadata_field(name: str, specs: Mapping[int, PartitionSpec], schema: Schema, *, case_sensitive: bool = True) -> NestedField | None:
    """The metadata column called ``name`` (None if there is none)."""
    key = name if case_sensitive else name.lower()
    if key == PARTITION_NAME:
        return NestedField(PARTITION_ID, PARTITION_NAME, partition_type(specs, schema), required=False)
    return _FIXED.get(key)


def lineage_columns(schema: Schema) -> list[str] | None:
    """The projection of a rewrite that keeps row lineage: every top-level column of
    ``schema``, then the row lineage columns.  None when the table's own columns take a
    lineage column's name (compared ignoring case): such a table's lineage is hidden from
    every reader by its own column, and a data file cannot hold two columns of one name,
    so its rewrites cannot carry lineage."""
    own = [f.name for f in schema.fields]
    if {f.name for f in LINEAGE} & {name.lower() for name in own}:
        return None
    return [*own, *(f.name for f in LINEAGE)]


# --- row filters ---------------------------------------------------------------------------------

#: the metadata columns a row filter may refer to (``_partition`` is a struct: not filterable)
_FILTERABLE = (FILE_PATH, ROW_POSITION, IS_DELETED, SPEC_ID, ROW_ID, LAST_UPDATED_SEQUENCE_NUMBER)


def _hidden(schema: Schema) -> set[str]:
    """Metadata column names a table column hides (compared ignoring case, so that a
    case-insensitive filter never has two candidates)."""
    own = {f.name.lower() for f in schema.fields}
    return {f.name for f in _FILTERABLE if f.name.lower() in own}


def filter_schema(schema: Schema, *, lineage: bool = True) -> Schema:
    """``schema`` with the metadata columns a row filter may name (``_file``, ``_pos``,
    ``_deleted``, ``_spec_id`` and, with ``lineage``, ``_row_id`` and
    ``_last_updated_sequence_number``), except those a table column hides."""
    hidden = _hidden(schema)
    extra = [f for f in _FILTERABLE if f.name not in hidden and (lineage or f not in LINEAGE)]
    return Schema(*schema.fields, *extra, schema_id=schema.schema_id)


class RebuildingVisitor(BooleanExpressionVisitor[BooleanExpression]):
    """A visitor that rebuilds an expression as it is (subclasses change predicates)."""

    def visit_true(self) -> BooleanExpression:
        return AlwaysTrue()

    def visit_false(self) -> BooleanExpression:
        return AlwaysFalse()

    def visit_not(self, child_result: BooleanExpression) -> BooleanExpression:
        return Not(child_result)

    def visit_and(self, left_result: BooleanExpression, right_result: BooleanExpression) -> BooleanExpression:
        return And(left_result, right_result)

    def visit_or(self, left_result: BooleanExpression, right_result: BooleanExpression) -> BooleanExpression:
        return Or(left_result, right_result)

    def visit_unbound_predicate(self, predicate: UnboundPredicate) -> BooleanExpression:
        return predicate

    def visit_bound_predicate(self, predicate: BoundPredicate) -> BooleanExpression:
        return predicate


class _WithoutMetadata(RebuildingVisitor):
    def __init__(self, names: set[str]) -> None:
        self.names = names

    def visit_unbound_predicate(self, predicate: UnboundPredicate) -> BooleanExpression:
        return AlwaysTrue() if predicate.term.name.lower() in self.names else predicate

    def visit_bound_predicate(self, predicate: BoundPredicate) -> BooleanExpression:
        return AlwaysTrue() if predicate.term.ref().field.field_id in _IDS else predicate


def without_metadata(expression: BooleanExpression, schema: Schema) -> BooleanExpression:
    """What pruning may use of a row filter: every predicate on a metadata column made
    true (negations pushed down first, so that this only widens the filter).  Partition
    values and column statistics say nothing about metadata columns (a file's stored
    ``_row_id`` bounds leave out the inherited values its nulls stand for)."""
    names = {f.name.lower() for f in _FILTERABLE} - {n.lower() for n in _hidden(schema)}
    return visit(rewrite_not(expression), _WithoutMetadata(names))

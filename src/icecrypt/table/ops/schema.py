"""Schema evolution (``table.update_schema()``): add, rename, drop, re-type, re-order
columns and set identifier fields, as one ``add-schema`` + ``set-current-schema``
change of the commit model (``_model``), committed by the one committer.

Each call checks its input against the schema the operation started from (with the
earlier calls of the same operation) and raises ValueError naming the column for
what the Iceberg spec refuses, before anything is committed; the whole new schema is
checked again when it is built (names unique per struct, identifier fields, partition
and sort-order sources kept).  New field ids continue from the table's
``last-column-id`` in the order Iceberg Java assigns them: the new column first, then
the fields of its type, each struct's own fields before those nested in them.  A new
schema equal to one the table already has is not added again: that schema is made
current (Java's reuse of schema ids).  Data files are never rewritten: readers map
columns by field id, so old files read under the new schema (``_read``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pyarrow as pa
from pyiceberg.expressions import literal
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.types import (
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StructType,
    TimestampNanoType,
    TimestampType,
)

from icecrypt.table.model.changes import AddSchema, SetCurrentSchema, SetProperties, _highest_field_id
from icecrypt.table.ops.refs import _Operation
from icecrypt.table.model.schema import iceberg_schema, schema_to_json

__all__ = ["UpdateSchema"]

ROOT = -1  # the parent id of top-level columns
NAME_MAPPING = "schema.name-mapping.default"
#: transforms whose value is the same for a date and the timestamp it is promoted to
_DATE_SAFE_TRANSFORMS = ("year", "month", "day")


def _path(path: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    if isinstance(path, str):
        parts = tuple(path.split("."))
    elif isinstance(path, (tuple, list)) and path and all(isinstance(p, str) for p in path):
        parts = tuple(path)
    else:
        raise ValueError(f"a column path must be a name or a tuple of names, not {path!r}")
    if any(not p for p in parts):
        raise ValueError(f"column path {path!r} has an empty name")
    return parts


def promotion_allowed(old: IcebergType, new: IcebergType, format_version: int) -> bool:
    """Whether the spec lets a column of type ``old`` become ``new``: int -> long,
    float -> double, decimal(P, S) -> decimal(P', S) with P' > P; from format v3
    also date -> timestamp / timestamp_ns (never to the tz types)."""
    if old == new:
        return True
    if isinstance(old, IntegerType):
        return isinstance(new, LongType)
    if isinstance(old, FloatType):
        return isinstance(new, DoubleType)
    if isinstance(old, DecimalType):
        return isinstance(new, DecimalType) and new.scale == old.scale and new.precision > old.precision
    if isinstance(old, DateType) and format_version >= 3:
        return isinstance(new, (TimestampType, TimestampNanoType))
    return False


def _children(field_type: IcebergType) -> list[NestedField]:
    if isinstance(field_type, StructType):
        return list(field_type.fields)
    if isinstance(field_type, ListType):
        return [field_type.element_field]
    if isinstance(field_type, MapType):
        return [field_type.key_field, field_type.value_field]
    return []


def _walk(fields: Iterable[NestedField], parent: int, prefix: str, out: dict[int, tuple[int, str, NestedField]]) -> None:
    """Every field by id: (parent id, full name, field)."""
    for field in fields:
        name = f"{prefix}{field.name}"
        out[field.field_id] = (parent, name, field)
        _walk(_children(field.field_type), field.field_id, f"{name}.", out)


class UpdateSchema(_Operation):
    """Changes to the table's schema (``table.update_schema()``), chainable, committed
    together on leaving a ``with`` block (or by :meth:`commit`)::

        with table.update_schema() as update:
            update.add_column("region", StringType(), doc="sales region")
            update.rename_column("amount", "total")
            update.update_column("qty", field_type=LongType())

    Column paths are dotted names (``"address.city"``, ``"tags.element"``,
    ``"attrs.value.size"``) or tuples of names (for names holding a dot).  Everything
    the spec refuses -- an unknown column, a type change other than a promotion, a
    required column without a default, a name taken, dropping an identifier field or
    a partition or sort source -- raises ValueError naming the column; nothing is
    committed.  ``allow_incompatible_changes=True`` permits making a column required
    and adding a required column without a default (old files then cannot be read),
    and the format v3 promotion of a date to a timestamp, which the spec allows but
    Iceberg Java does not read (its readers return the old files' dates as they are)."""

    what = "schema update"

    def __init__(self, table: Any, *, allow_incompatible_changes: bool = False, case_sensitive: bool = True) -> None:
        super().__init__(table)
        base = self._base
        current = base.get("current-schema-id", 0)
        entry = next((s for s in base.get("schemas") or () if s.get("schema-id") == current), None)
        if entry is None:
            raise ValueError(f"{self._base_location}: the table has no current schema {current}")
        self._schema = Schema.model_validate(entry)
        self._format = int(base.get("format-version", 1))
        # never below an id any schema of the table used: a last-column-id lowered in storage
        # must not make a new column reuse a dropped column's id (its old values would return)
        self._last_id = max([int(base.get("last-column-id", 0)), self._schema.highest_field_id,
                             *(_highest_field_id(s) for s in base.get("schemas") or ())])  # fmt: skip
        self._allow_incompatible = allow_incompatible_changes
        self._case_sensitive = case_sensitive
        self._fields: dict[int, tuple[int, str, NestedField]] = {}
        _walk(self._schema.fields, ROOT, "", self._fields)
        self._adds: dict[int, list[NestedField]] = {}
        self._changed: dict[int, NestedField] = {}  # field id -> the field with its new name/type/doc/required
        self._deletes: set[int] = set()
        self._moves: dict[int, list[tuple[str, int, int | None]]] = {}
        self._identifiers: tuple[str, ...] | None = None  # None: the current ones (followed through renames)

    # --- finding columns ----------------------------------------------------------------

    def _check_open(self) -> None:
        if self._done:
            raise ValueError(f"this {self.what} was already committed; start a new one")

    def _find(self, path: Any) -> int:
        """The field id of the column at ``path`` (names as the operation started, or of
        columns it added); ValueError naming it when there is none."""
        self._check_open()
        name = ".".join(_path(path))
        wanted = name if self._case_sensitive else name.lower()
        for field_id, (_, full, _) in self._fields.items():
            if (full if self._case_sensitive else full.lower()) == wanted:
                return field_id
        raise ValueError(f"{self._base_location}: the schema has no column {name!r}")

    def _old_ids(self) -> set[int]:
        return set(self._schema._lazy_id_to_field)  # every field id of the starting schema

    def _current(self, field_id: int) -> NestedField:
        return self._changed.get(field_id) or self._fields[field_id][2]

    def _name(self, field_id: int) -> str:
        return self._fields[field_id][1]

    def _not_deleted(self, field_id: int, doing: str) -> None:
        parent = field_id
        while parent != ROOT:
            if parent in self._deletes:
                raise ValueError(f"cannot {doing} column {self._name(field_id)!r}: it is deleted in this update")
            parent = self._fields[parent][0]

    def _new_id(self) -> int:
        self._last_id += 1
        return self._last_id

    def _default(self, name: str, field_type: IcebergType, value: Any) -> Any:
        if value is None:
            return None
        if self._format < 3:
            raise ValueError(f"column {name!r}: default values need table format version 3 (the table is v{self._format})")
        if not field_type.is_primitive:
            raise ValueError(f"column {name!r}: only primitive columns take a default value")
        try:
            converted = literal(value).to(field_type)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"column {name!r}: default {value!r} is not a {field_type} ({exc})") from None
        if converted is None or not hasattr(converted, "value"):
            raise ValueError(f"column {name!r}: default {value!r} does not fit {field_type}")
        return converted.value

    # --- adding -------------------------------------------------------------------------

    def add_column(
        self,
        path: str | tuple[str, ...],
        field_type: IcebergType,
        doc: str | None = None,
        required: bool = False,
        default_value: Any = None,
    ) -> UpdateSchema:
        """Add a column at the end of the table (a name) or of a struct (a path whose
        parent is a struct, a list's ``element`` struct or a map's ``value`` struct).
        Nested types get fresh field ids.  ``required=True`` needs ``default_value``
        (format v3: it fills the column in rows written before), unless
        ``allow_incompatible_changes``.  A name of a top-level column may not hold a
        dot: pass a tuple for that."""
        self._check_open()
        if isinstance(path, str) and "." in path:
            raise ValueError(f"cannot add column {path!r}: a dotted name is ambiguous; pass a tuple of names")
        parts = _path(path)
        name, full = parts[-1], ".".join(parts)
        if not isinstance(field_type, IcebergType):
            raise ValueError(f"column {full!r}: field_type must be a pyiceberg type, not {field_type!r}")
        parent_id, prefix = ROOT, ""
        if len(parts) > 1:
            parent_id = self._find(parts[:-1])
            self._not_deleted(parent_id, "add to")
            parent_type = self._current(parent_id).field_type
            if isinstance(parent_type, MapType):
                parent_id = parent_type.value_id
            elif isinstance(parent_type, ListType):
                parent_id = parent_type.element_id
            if not isinstance(self._fields[parent_id][2].field_type, StructType):
                raise ValueError(f"cannot add column {full!r}: {'.'.join(parts[:-1])!r} is not a struct")
            prefix = self._name(parent_id) + "."
        for sibling in self._siblings(parent_id):
            if self._same(self._current(sibling).name, name) and sibling not in self._deletes:
                raise ValueError(f"cannot add column {full!r}: a column of that name exists")
        if required and default_value is None and not self._allow_incompatible:
            raise ValueError(
                f"cannot add required column {full!r} without a default value (rows written before it have none); "
                "give default_value (format v3) or add it optional"
            )
        default = self._default(full, field_type, default_value)
        field_id = self._new_id()
        new_type = assign_fresh_schema_ids(field_type, self._new_id) if not field_type.is_primitive else field_type
        field = NestedField(field_id, name, new_type, required=required, doc=doc,
                            initial_default=default, write_default=default)  # fmt: skip
        self._adds.setdefault(parent_id, []).append(field)
        _walk([field], parent_id, prefix, self._fields)
        return self

    def _siblings(self, parent_id: int) -> list[int]:
        return [fid for fid, (parent, _, _) in self._fields.items() if parent == parent_id]

    def _same(self, a: str, b: str) -> bool:
        return a == b if self._case_sensitive else a.lower() == b.lower()

    # --- changing -----------------------------------------------------------------------

    def _change(self, field_id: int, **values: Any) -> None:
        field = self._current(field_id)
        merged = {"field_id": field.field_id, "name": field.name, "field_type": field.field_type,
                  "required": field.required, "doc": field.doc, "initial_default": field.initial_default,
                  "write_default": field.write_default, **values}  # fmt: skip
        self._changed[field_id] = NestedField(**merged)

    def _existing(self, path: Any, doing: str) -> int:
        field_id = self._find(path)
        if field_id not in self._old_ids():
            raise ValueError(f"cannot {doing} column {'.'.join(_path(path))!r}: it is added in this update")
        self._not_deleted(field_id, doing)
        parent = self._fields[field_id][0]
        if parent != ROOT and isinstance(self._fields[parent][2].field_type, MapType):
            if self._fields[parent][2].field_type.key_id == field_id and doing not in ("update",):
                raise ValueError(f"cannot {doing} map key {self._name(field_id)!r}")
        return field_id

    def rename_column(self, path_from: str | tuple[str, ...], new_name: str) -> UpdateSchema:
        """Rename a column (its data is kept: files are read by field id)."""
        field_id = self._existing(path_from, "rename")
        if not isinstance(new_name, str) or not new_name:
            raise ValueError(f"column {self._name(field_id)!r}: the new name must be a non-empty string")
        parent = self._fields[field_id][0]
        if parent != ROOT and not isinstance(self._fields[parent][2].field_type, StructType):
            raise ValueError(f"cannot rename {self._name(field_id)!r}: list elements and map keys/values keep their names")
        for sibling in self._siblings(parent):
            if sibling != field_id and sibling not in self._deletes and self._same(self._current(sibling).name, new_name):
                raise ValueError(f"cannot rename {self._name(field_id)!r} to {new_name!r}: a column of that name exists")
        self._change(field_id, name=new_name)
        return self

    def delete_column(self, path: str | tuple[str, ...]) -> UpdateSchema:
        """Drop a column (with everything nested in it).  Identifier fields and the
        sources of the current partition spec and sort order cannot be dropped (those of
        older ones can, as in Iceberg Java)."""
        field_id = self._existing(path, "delete")
        parent = self._fields[field_id][0]
        if parent != ROOT and not isinstance(self._fields[parent][2].field_type, StructType):
            raise ValueError(f"cannot delete {self._name(field_id)!r}: a list element or map value cannot be dropped")
        if field_id in self._adds:
            raise ValueError(f"cannot delete column {self._name(field_id)!r}: columns are added to it in this update")
        if field_id in self._changed:
            raise ValueError(f"cannot delete column {self._name(field_id)!r}: it is changed in this update")
        self._deletes.add(field_id)
        return self

    def make_column_optional(self, path: str | tuple[str, ...]) -> UpdateSchema:
        """Make a required column optional."""
        return self.update_column(path, required=False)

    def update_column(
        self,
        path: str | tuple[str, ...],
        field_type: IcebergType | None = None,
        required: bool | None = None,
        doc: str | None = None,
    ) -> UpdateSchema:
        """Widen a column's type (int -> long, float -> double, decimal precision;
        format v3 also date -> timestamp / timestamp_ns, only with
        ``allow_incompatible_changes``: Iceberg Java does not read it), make it optional
        (``required=False``; required only with ``allow_incompatible_changes``), or
        change its doc."""
        field_id = self._existing(path, "update")
        field = self._current(field_id)
        name = self._name(field_id)
        values: dict[str, Any] = {}
        if field_type is not None and field_type != field.field_type:
            if not isinstance(field_type, IcebergType):
                raise ValueError(f"column {name!r}: field_type must be a pyiceberg type, not {field_type!r}")
            if not field.field_type.is_primitive:
                raise ValueError(f"cannot change the type of column {name!r}: {field.field_type} is not primitive")
            original = self._fields[field_id][2].field_type
            if not self._allow_incompatible and not promotion_allowed(original, field_type, self._format):
                raise ValueError(
                    f"cannot change column {name!r} from {original} to {field_type}: not a promotion the Iceberg spec "
                    f"allows for format v{self._format} (int -> long, float -> double, decimal precision"
                    + (", date -> timestamp/timestamp_ns)" if self._format >= 3 else ")")
                )
            if isinstance(original, DateType):
                self._check_date_promotion(field_id, name)
                if not self._allow_incompatible:
                    raise ValueError(
                        f"cannot promote column {name!r} from date to {field_type}: Iceberg Java does not read this "
                        "promotion (its readers return the old files' dates in the timestamp column, and its own "
                        "schema updates refuse it); allow_incompatible_changes=True makes it all the same"
                    )
            values["field_type"] = field_type
        if required is not None and required != field.required:
            if required and not self._allow_incompatible:
                raise ValueError(f"cannot make column {name!r} required: rows written before may hold nulls")
            values["required"] = bool(required)
        if doc is not None:
            values["doc"] = doc
        if values:
            self._change(field_id, **values)
        return self

    def update_default(self, path: str | tuple[str, ...], value: Any) -> UpdateSchema:
        """Set (None: remove) a column's ``write-default``, the value a write gives rows
        that do not name the column (format v3).  Its ``initial-default``, the value of
        rows written before the column was added, never changes."""
        field_id = self._existing(path, "update")
        field = self._current(field_id)
        self._change(field_id, write_default=self._default(self._name(field_id), field.field_type, value))
        return self

    def _check_date_promotion(self, field_id: int, name: str) -> None:
        """The spec forbids a promotion that changes a partition transform's value: a date
        partitioned by anything but year/month/day cannot become a timestamp."""
        for what, source, transform in _sources(self._base):
            if source == field_id and what.startswith("partition") and transform not in _DATE_SAFE_TRANSFORMS:
                raise ValueError(f"cannot promote column {name!r} from date to timestamp: {what} would change its values")

    # --- order --------------------------------------------------------------------------

    def _move(self, op: str, path: Any, other: Any = None) -> UpdateSchema:
        field_id = self._find(path)
        self._not_deleted(field_id, "move")
        parent = self._fields[field_id][0]
        other_id = None
        if other is not None:
            other_id = self._find(other)
            if other_id == field_id:
                raise ValueError(f"cannot move column {self._name(field_id)!r} {op} itself")
            if self._fields[other_id][0] != parent:
                raise ValueError(
                    f"cannot move column {self._name(field_id)!r} {op} {self._name(other_id)!r}: they are in different structs"
                )
            self._not_deleted(other_id, "move next to")
        if parent != ROOT and not isinstance(self._fields[parent][2].field_type, StructType):
            raise ValueError(f"cannot move {self._name(field_id)!r}: only struct fields have an order")
        self._moves.setdefault(parent, []).append((op, field_id, other_id))
        return self

    def move_first(self, path: str | tuple[str, ...]) -> UpdateSchema:
        """Move a column to the start of its struct (or of the table)."""
        return self._move("first", path)

    def move_before(self, path: str | tuple[str, ...], before_path: str | tuple[str, ...]) -> UpdateSchema:
        """Move a column just before another of the same struct."""
        return self._move("before", path, before_path)

    def move_after(self, path: str | tuple[str, ...], after_path: str | tuple[str, ...]) -> UpdateSchema:
        """Move a column just after another of the same struct."""
        return self._move("after", path, after_path)

    # --- identifier fields, union -------------------------------------------------------

    def set_identifier_fields(self, *names: str) -> UpdateSchema:
        """Make these columns (names in the new schema) the identifier fields (none:
        clear them).  Each must be a required primitive (not float/double) not inside a
        list or map."""
        self._check_open()
        if len(names) == 1 and isinstance(names[0], (list, tuple, set)):
            names = tuple(names[0])
        for name in names:
            if not isinstance(name, str) or not name:
                raise ValueError(f"identifier field names are non-empty strings, not {name!r}")
        self._identifiers = tuple(names)
        return self

    def union_by_name(self, new_schema: Schema | pa.Schema) -> UpdateSchema:
        """Add the columns of ``new_schema`` (an Arrow or PyIceberg schema) the table
        lacks, matched by name at every level; widen types and relax ``required`` where
        ``new_schema`` does; columns only the table has are kept."""
        self._check_open()
        other = iceberg_schema(new_schema)
        self._union(other.fields, ROOT, ())
        return self

    def _union(self, fields: Iterable[NestedField], parent_id: int, prefix: tuple[str, ...]) -> None:
        existing = {self._current(fid).name if self._case_sensitive else self._current(fid).name.lower(): fid
                    for fid in self._siblings(parent_id)}  # fmt: skip
        for field in fields:
            match = existing.get(field.name if self._case_sensitive else field.name.lower())
            path = (*prefix, field.name)
            if match is None:
                self.add_column(path if prefix else field.name if "." not in field.name else (field.name,),
                                field.field_type, doc=field.doc, required=False)  # fmt: skip
                continue
            self._union_field(field, match, path)

    def _union_field(self, field: NestedField, match: int, path: tuple[str, ...]) -> None:
        current = self._current(match)
        full = tuple(self._name(match).split(".")) if "." not in current.name else path
        if field.optional and current.required:
            self.update_column(full, required=False)
        new, old = field.field_type, current.field_type
        if new.is_primitive and old.is_primitive:
            if new != old and not promotion_allowed(new, old, self._format):  # the table's type is not wider
                self.update_column(full, field_type=new)
        elif isinstance(new, StructType) and isinstance(old, StructType):
            self._union(new.fields, match, full)
        elif isinstance(new, ListType) and isinstance(old, ListType):
            self._union_field(new.element_field, old.element_id, (*full, "element"))
        elif isinstance(new, MapType) and isinstance(old, MapType):
            self._union_field(new.key_field, old.key_id, (*full, "key"))
            self._union_field(new.value_field, old.value_id, (*full, "value"))
        else:
            raise ValueError(f"cannot merge column {'.'.join(path)!r}: {old} in the table, {new} in the new schema")
        if field.doc is not None and field.doc != current.doc:
            self.update_column(full, doc=field.doc)

    # --- the new schema -----------------------------------------------------------------

    def _struct(self, fields: Iterable[NestedField], parent_id: int) -> list[NestedField]:
        result = [self._field(f) for f in fields if f.field_id not in self._deletes]
        result += [self._field(f) for f in self._adds.get(parent_id, ())]
        for op, field_id, other_id in self._moves.get(parent_id, ()):
            moving = next(f for f in result if f.field_id == field_id)
            result.remove(moving)
            if op == "first":
                result.insert(0, moving)
            else:
                at = next(i for i, f in enumerate(result) if f.field_id == other_id)
                result.insert(at if op == "before" else at + 1, moving)
        seen: dict[str, str] = {}
        for f in result:
            key = f.name if self._case_sensitive else f.name.lower()
            if key in seen:
                where = "the table" if parent_id == ROOT else repr(self._name(parent_id))
                raise ValueError(f"two columns named {f.name!r} in {where}")
            seen[key] = f.name
        return result

    def _field(self, field: NestedField) -> NestedField:
        current = self._changed.get(field.field_id, field)
        field_type = current.field_type
        if isinstance(field_type, StructType):
            field_type = StructType(*self._struct(field_type.fields, field.field_id))
        elif isinstance(field_type, ListType):
            element = self._field(field_type.element_field)
            field_type = ListType(element.field_id, element.field_type, element_required=element.required)
        elif isinstance(field_type, MapType):
            key, value = self._field(field_type.key_field), self._field(field_type.value_field)
            field_type = MapType(key.field_id, key.field_type, value.field_id, value.field_type,
                                 value_required=value.required)  # fmt: skip
        return NestedField(field.field_id, current.name, field_type, required=current.required, doc=current.doc,
                           initial_default=current.initial_default, write_default=current.write_default)  # fmt: skip

    def apply(self) -> Schema:
        """The new schema (not committed); ValueError when it is not a valid one."""
        fields = self._struct(self._schema.fields, ROOT)
        draft = Schema(*fields)
        kept = set(draft._lazy_id_to_field)
        gone = self._old_ids() - kept
        self._check_sources(gone)
        self._check_partition_names(draft)
        identifier_ids = self._identifier_ids(draft, gone)
        schemas = self._base.get("schemas") or ()
        next_id = 1 + max([-1, *(int(s.get("schema-id", 0)) for s in schemas)])
        return Schema(*fields, schema_id=next_id, identifier_field_ids=identifier_ids)

    def _check_sources(self, gone: set[int]) -> None:
        """The current spec's and sort order's sources stay (but for a format v1 spec's void
        fields, the removed ones).  Older specs and orders may name a dropped column, as in
        Iceberg Java (which checks only the defaults): their files keep the partition
        values they were written with, typed as before."""
        for what, source, transform in _sources(self._base, current_only=True):
            if source in gone and transform != "void":
                raise ValueError(f"cannot delete column {self._name(source)!r}: it is the source of {what}")

    def _check_partition_names(self, draft: Schema) -> None:
        """A partition field's name may not be a top-level column's (an identity partition
        may carry its source's name), as Java and PyIceberg check; only collisions this
        update makes are refused."""
        def collisions(schema: Schema) -> set[tuple[str, int]]:
            columns = {f.name: f.field_id for f in schema.fields}
            found = set()
            for spec in self._base.get("partition-specs") or ():
                for pf in spec.get("fields") or ():
                    name, source = pf.get("name"), pf.get("source-id")
                    if name in columns and not (str(pf.get("transform")) == "identity" and columns[name] == source):
                        found.add((name, spec.get("spec-id")))
            return found

        made = sorted(collisions(draft) - collisions(self._schema), key=str)
        if made:
            name, spec_id = made[0]
            raise ValueError(f"column {name!r} would have the name of a partition field of spec {spec_id}")

    def _identifier_ids(self, draft: Schema, gone: set[int]) -> list[int]:
        if self._identifiers is None:
            ids = list(self._schema.identifier_field_ids)
            for field_id in ids:
                if field_id in gone:
                    raise ValueError(
                        f"cannot delete identifier field {self._name(field_id)!r}; change the identifier fields first "
                        "(set_identifier_fields)"
                    )
        else:
            ids = []
            for name in self._identifiers:
                try:
                    ids.append(draft.find_field(name, self._case_sensitive).field_id)
                except ValueError:
                    raise ValueError(f"identifier field {name!r} is not a column of the new schema") from None
        parents = draft._lazy_id_to_parent
        for field_id in ids:
            field = draft.find_field(field_id)
            name = draft.find_column_name(field_id)
            if not field.field_type.is_primitive:
                raise ValueError(f"identifier field {name!r} must be a primitive column, not {field.field_type}")
            if isinstance(field.field_type, (FloatType, DoubleType)):
                raise ValueError(f"identifier field {name!r} cannot be a {field.field_type}")
            if not field.required:
                raise ValueError(f"identifier field {name!r} must be required")
            parent = parents.get(field_id)
            while parent is not None:
                outer = draft.find_field(parent)
                if not isinstance(outer.field_type, StructType):
                    raise ValueError(f"identifier field {name!r} cannot be inside a list or map")
                if not outer.required:
                    raise ValueError(f"identifier field {name!r} cannot be inside an optional struct")
                parent = parents.get(parent)
        return ids

    # --- commit -------------------------------------------------------------------------

    def commit(self) -> str | None:
        """Commit the new schema (an existing identical one is made current instead;
        nothing is written when it is the current schema).  Returns the new metadata
        location, or None."""
        self._check_open()
        schema = self.apply()
        document = schema_to_json(schema)
        same = Schema.model_validate(document)  # defaults as read back, to compare with the table's
        current_id = self._base.get("current-schema-id", 0)
        existing = next((s for s in self._base.get("schemas") or () if Schema.model_validate(s) == same), None)
        if existing is not None and existing.get("schema-id") == current_id:
            self._done = True
            return None
        if existing is None:
            self._updates.append(AddSchema(document))
            self._updates.append(SetCurrentSchema(schema.schema_id))
        else:
            self._updates.append(SetCurrentSchema(existing["schema-id"]))
        mapping = (self._base.get("properties") or {}).get(NAME_MAPPING)
        if mapping is not None:
            self._updates.append(SetProperties({NAME_MAPPING: self._mapping(mapping)}))
        return super().commit()

    def _mapping(self, raw: str) -> str:
        """The table's name mapping with renamed columns' new names added (old names kept,
        as Java) and added columns mapped."""
        from pyiceberg.table.name_mapping import parse_mapping_from_json, update_mapping

        try:
            mapping = parse_mapping_from_json(raw)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{self._base_location}: {NAME_MAPPING} is not a name mapping ({exc})") from None
        renames = {fid: f for fid, f in self._changed.items() if f.name != self._fields[fid][2].name}
        return update_mapping(mapping, renames, self._adds).model_dump_json()



def _sources(metadata: Any, *, current_only: bool = False) -> Iterable[tuple[str, int, str]]:
    """(what, source field id, transform) of every partition field and sort field of
    the table (every spec and order it keeps: old files and orders still name them), or
    of its default spec and sort order only."""
    for key, id_key, what, default in (("partition-specs", "spec-id", "partition field", "default-spec-id"),
                                       ("sort-orders", "order-id", "sort field", "default-sort-order-id")):
        for entry in metadata.get(key) or ():
            if current_only and entry.get(id_key) != metadata.get(default):
                continue
            for f in entry.get("fields") or ():
                sources = f.get("source-ids") or [f.get("source-id")]
                label = f"{what} {f.get('name')!r} of spec {entry.get(id_key)}" if what == "partition field" else (
                    f"a sort field of sort order {entry.get(id_key)}")
                for source in sources:
                    yield label, source, str(f.get("transform"))

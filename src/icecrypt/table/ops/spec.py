"""Partition evolution (``table.update_spec()``): add, remove and rename partition
fields, committed as ``add-spec`` + ``set-default-spec`` on the commit model.

Field ids follow Iceberg Java's ``BaseUpdatePartitionSpec``: a new field takes
``last-partition-id + 1``, except that a v2+ table reuses the id of a field with the
same source and transform in any earlier spec (so partition values stay comparable
across specs); a field removed from a v1 table stays in place with the ``void``
transform (v1 specs are positional), from a v2+ table it is dropped.  The new spec
takes the id of an existing spec with the same fields (Java's ``compatibleWith``) or
the highest id + 1.  Old data files keep the spec they were written with; new writes
use the new default spec; scans project their filter into each file's spec.

Every check happens before anything is committed: an unknown column, a transform that
cannot apply to the column's type, a duplicate field or name, two time transforms of
one column, an unknown field to remove or rename raise ValueError.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyiceberg.schema import Schema
from pyiceberg.transforms import (
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    VoidTransform,
    YearTransform,
    parse_transform,
)

from icecrypt.table.model import changes as _model
from icecrypt.table.ops.refs import _Operation

__all__ = ["UpdateSpec"]

_TIME = (YearTransform, MonthTransform, DayTransform, HourTransform)
PARTITION_FIELD_ID_START = 1000


def to_transform(transform: Any) -> Transform:
    """A PyIceberg transform from a transform or its Iceberg name (``bucket[16]``)."""
    if isinstance(transform, Transform):
        return transform
    if not isinstance(transform, str) or not transform.strip():
        raise ValueError(f"a transform is a name such as 'identity', 'bucket[16]' or 'day', not {transform!r}")
    try:
        parsed = parse_transform(transform.strip())
    except Exception:
        parsed = None
    if parsed is None or type(parsed).__name__ == "UnknownTransform":
        raise ValueError(
            f"unknown transform {transform!r} (expected identity, bucket[N], truncate[W], year, month, day, hour or void)"
        )
    return parsed


def default_field_name(column: str, transform: Transform) -> str:
    """The partition field name Java's ``PartitionNameGenerator`` gives."""
    name = str(transform)
    if isinstance(transform, IdentityTransform):
        return column
    if name.startswith("bucket["):
        return f"{column}_bucket_{name[7:-1]}"
    if name.startswith("truncate["):
        return f"{column}_trunc_{name[9:-1]}"
    if isinstance(transform, VoidTransform):
        return f"{column}_null"
    return f"{column}_{name}"


@dataclass(frozen=True)
class _Field:
    source_id: int
    field_id: int
    name: str
    transform: str

    def json(self) -> dict[str, Any]:
        return {"name": self.name, "transform": self.transform, "source-id": self.source_id, "field-id": self.field_id}

    def same_partitioning(self, other: _Field) -> bool:
        return self.source_id == other.source_id and self.transform == other.transform


def _fields(spec: dict[str, Any]) -> list[_Field]:
    return [_Field(f["source-id"], f["field-id"], f["name"], f["transform"]) for f in spec.get("fields") or ()]


def _is_time(transform: str) -> bool:
    return isinstance(to_transform(transform), _TIME)


class UpdateSpec(_Operation):
    """Changes to the table's default partition spec, committed together::

        with table.update_spec() as update:
            update.add_field("ts", "day").remove_field("category").rename_field("id_bucket_16", "shard")

    ``add_field(source_column_name, transform, partition_field_name=None)`` with any
    Iceberg transform (``identity``, ``bucket[N]``, ``truncate[W]``, ``year``,
    ``month``, ``day``, ``hour``, ``void``; a name or a PyIceberg transform);
    ``add_identity(column)``; ``remove_field(name)``; ``rename_field(name, new_name)``.
    Committed on leaving the ``with`` block (or by :meth:`commit`); a spec equal to the
    current default commits nothing."""

    what = "partition spec update"

    def __init__(self, table: Any, *, case_sensitive: bool = True) -> None:
        super().__init__(table)
        from icecrypt.table.ops.write import _schema

        self._case_sensitive = case_sensitive
        self._schema: Schema = _schema(self._base)
        self._format = int(self._base.get("format-version", 1))
        self._specs = list(self._base.get("partition-specs") or ())
        default_id = self._base.get("default-spec-id", 0)
        default = next((s for s in self._specs if s.get("spec-id") == default_id), None)
        if default is None:
            raise ValueError(f"{self._base_location}: the default partition spec {default_id} is not in the table")
        self._current = _fields(default)
        # never below an id a spec uses: a lowered last-partition-id read from storage must
        # not make a new field take the id of another spec's field (another meaning)
        recorded = self._base.get("last-partition-id")
        used = [f.field_id for s in self._specs for f in _fields(s)]
        self._last_id = max([PARTITION_FIELD_ID_START - 1, *used, *([recorded] if type(recorded) is int else [])])
        self._adds: list[_Field] = []
        self._deletes: set[int] = set()
        self._renames: dict[str, str] = {}

    # --- building ------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._done:
            raise ValueError(f"this {self.what} was already committed; start a new one")

    def _column(self, name: Any) -> tuple[int, str]:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a source column name must be a non-empty string, not {name!r}")
        try:
            found = self._schema.find_field(name, case_sensitive=self._case_sensitive)
        except ValueError:
            raise ValueError(f"{self._base_location}: cannot partition by {name!r}: no such column in the schema") from None
        return found.field_id, self._schema.find_column_name(found.field_id) or name

    def _by_name(self, name: str) -> _Field | None:
        return next((f for f in self._current if f.name == name), None)

    def _recycled_or_new(self, source_id: int, transform: str, name: str | None) -> _Field:
        if self._format >= 2:  # Java reuses ids across the spec history (v2+ only)
            for spec in self._specs:
                for old in _fields(spec):
                    if old.source_id == source_id and old.transform == transform and (name is None or old.name == name):
                        return old
        self._last_id += 1
        return _Field(source_id, self._last_id, name or "", transform)

    def add_field(self, source_column_name: str, transform: Any = "identity", partition_field_name: str | None = None):
        """Partition new data by ``transform(source_column_name)``, named
        ``partition_field_name`` (default: Java's name, e.g. ``ts_day``, ``id_bucket_16``)."""
        self._check_open()
        source_id, column = self._column(source_column_name)
        if self._schema.find_field(source_id) not in self._schema.fields:
            # Java allows struct fields; icecrypt's writers partition by top-level columns
            # only, and a spec they cannot write would stop every later append
            raise ValueError(f"cannot partition by {column!r}: only top-level columns can be partition sources here")
        parsed = to_transform(transform)
        source_type = self._schema.find_field(source_id).field_type
        if not parsed.can_transform(source_type):
            raise ValueError(f"cannot partition by {parsed}({column}): {parsed} does not apply to {source_type} values")
        transform_name = str(parsed)
        if partition_field_name is not None and (not isinstance(partition_field_name, str) or not partition_field_name):
            raise ValueError(f"a partition field name must be a non-empty string, not {partition_field_name!r}")
        for existing in self._current:
            if existing.source_id == source_id and existing.transform == transform_name:
                if existing.field_id in self._deletes:  # re-added after removal: keep it
                    self._deletes.discard(existing.field_id)
                    if partition_field_name is not None and partition_field_name != existing.name:
                        self._renames[existing.name] = partition_field_name
                    return self
                raise ValueError(f"cannot add partition field {transform_name}({column}): the spec has it as {existing.name!r}")
        for added in self._adds:
            if added.source_id == source_id and added.transform == transform_name:
                raise ValueError(f"cannot add partition field {transform_name}({column}) twice")
            if isinstance(parsed, _TIME) and added.source_id == source_id and _is_time(added.transform):
                raise ValueError(
                    f"cannot add time partition field {transform_name}({column}): it conflicts with {added.name!r}"
                )
        last_id = self._last_id
        field = self._recycled_or_new(source_id, transform_name, partition_field_name)
        name = partition_field_name or field.name or default_field_name(column, parsed)
        try:
            if any(a.name == name for a in self._adds):
                raise ValueError(f"cannot add partition field {name!r}: the name is already added")
            self._check_schema_name(name, source_id, parsed)
        except ValueError:
            self._last_id = last_id  # nothing of a refused call stays
            raise
        self._adds.append(_Field(source_id, field.field_id, name, transform_name))
        return self

    def add_identity(self, source_column_name: str):
        """Partition new data by the values of ``source_column_name``."""
        return self.add_field(source_column_name, IdentityTransform())

    def _existing(self, name: str, verb: str) -> _Field:
        """The current spec's field ``name``, untouched so far by this update."""
        self._check_open()
        if any(a.name == name for a in self._adds):
            raise ValueError(f"cannot {verb} partition field {name!r}: it was added in this update")
        field = self._by_name(name)
        if field is None:
            raise ValueError(f"{self._base_location}: there is no partition field {name!r} to {verb}")
        if field.field_id in self._deletes or name in self._renames:
            done = "removed" if field.field_id in self._deletes else "renamed"
            raise ValueError(f"cannot {verb} partition field {name!r}: it was {done} in this update")
        return field

    def remove_field(self, name: str):
        """Stop partitioning new data by the partition field ``name``."""
        field = self._existing(name, "remove")
        self._deletes.add(field.field_id)
        return self

    def rename_field(self, name: str, new_name: str):
        """Rename the partition field ``name`` to ``new_name``."""
        if not isinstance(new_name, str) or not new_name:
            raise ValueError(f"a partition field name must be a non-empty string, not {new_name!r}")
        field = self._existing(name, "rename")
        self._check_schema_name(new_name, field.source_id, to_transform(field.transform))
        self._renames[name] = new_name
        return self

    def _check_schema_name(self, name: str, source_id: int, transform: Transform) -> None:
        """As Java's spec builder: a partition name may equal a column name only for an
        identity partition of that very column."""
        try:
            column = self._schema.find_field(name, case_sensitive=self._case_sensitive)
        except ValueError:
            return
        if not (isinstance(transform, (IdentityTransform, VoidTransform)) and column.field_id == source_id):
            raise ValueError(f"cannot name a partition field {name!r}: a column of the schema has that name")

    # --- the new spec ----------------------------------------------------------------------

    def _new_fields(self) -> list[_Field]:
        fields: list[_Field] = []
        for field in self._current:
            name = self._renames.get(field.name, field.name)
            if field.field_id not in self._deletes:
                fields.append(_Field(field.source_id, field.field_id, name, field.transform))
            elif self._format == 1:  # v1 specs are positional: a removed field stays, void
                fields.append(_Field(field.source_id, field.field_id, name, "void"))
        added_names = {a.name for a in self._adds}
        for i, field in enumerate(fields):
            if field.name in added_names and field.transform == "void":  # Java renames the void field
                fields[i] = _Field(field.source_id, field.field_id, f"{field.name}_{field.field_id}", "void")
        fields.extend(self._adds)
        names: set[str] = set()
        time_sources: dict[int, str] = {}
        for field in fields:
            if field.name in names:
                raise ValueError(f"cannot use partition field name {field.name!r} more than once")
            names.add(field.name)
            if _is_time(field.transform):
                if field.source_id in time_sources:
                    raise ValueError(
                        f"cannot partition by {field.name!r}: redundant with time partition field "
                        f"{time_sources[field.source_id]!r} of the same column"
                    )
                time_sources[field.source_id] = field.name
        return fields

    def apply(self) -> dict[str, Any]:
        """The partition spec this update makes (``metadata.json`` form), with its id."""
        fields = [f.json() for f in self._new_fields()]
        key = [(f["source-id"], f["transform"], f["name"]) for f in fields]
        new_id = 0
        for spec in self._specs:
            if [(f["source-id"], f["transform"], f["name"]) for f in spec.get("fields") or ()] == key:
                return {"spec-id": spec["spec-id"], "fields": [dict(f) for f in spec.get("fields") or ()]}
            new_id = max(new_id, spec["spec-id"] + 1)
        return {"spec-id": new_id, "fields": fields}

    def commit(self) -> str | None:
        """Commit the new spec as the table's default (nothing when it is the current
        default); returns the new metadata location or None."""
        self._check_open()
        spec = self.apply()
        if spec["spec-id"] != self._base.get("default-spec-id"):
            known = {s["spec-id"] for s in self._specs}
            updates: list[_model.TableUpdate] = [] if spec["spec-id"] in known else [_model.AddSpec(spec)]
            self._updates = [*updates, _model.SetDefaultSpec(spec["spec-id"])]
        return super().commit()

"""Time travel: which snapshot (and schema) a read of a table sees.

A read names at most one of a snapshot id, a moment (``as_of_timestamp``), a branch or
a tag; none means the current snapshot.  The rules are Iceberg's:

* a moment selects the snapshot that was current then: the last ``snapshot-log`` entry
  (in the log's order) whose timestamp is at or before it; there is none before the
  table's first snapshot;
* refs come from the metadata's ``refs`` (``main`` is the current snapshot when the
  document has no such entry);
* a snapshot id, a moment or a tag reads with the schema the snapshot was written with;
  the current snapshot and a branch read with the table's current schema (a branch's
  next write uses it).

Refs and the snapshot log are read from storage like everything else: one naming a
snapshot the document does not have is damage, reported with the metadata file.
"""

from __future__ import annotations

import datetime
import numbers
from typing import TYPE_CHECKING, Any

from pyiceberg.schema import Schema

from icecrypt.errors import FormatError
from icecrypt.table.files.metadata import Snapshot

if TYPE_CHECKING:
    from icecrypt.table.commit.state import TableView

__all__ = ["MAIN_BRANCH", "resolve_read", "snapshot_as_of_timestamp", "snapshot_by_name", "timestamp_ms"]

MAIN_BRANCH = "main"
_KINDS = ("branch", "tag")


def timestamp_ms(value: Any, *, what: str = "as_of_timestamp") -> int:
    """Milliseconds since the epoch from an int or a timezone-aware datetime."""
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            raise ValueError(f"{what}: a datetime needs a time zone (e.g. tzinfo=datetime.timezone.utc), "
                             f"not a naive {value.isoformat()}")
        delta = value - datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
        return delta // datetime.timedelta(milliseconds=1)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{what} must be milliseconds since the epoch (an int) or a datetime, "
                        f"not {type(value).__name__}")
    return int(value)


def _format_ms(ms: int) -> str:
    try:
        moment = datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc)
    except (OverflowError, OSError, ValueError):
        return f"{ms} ms"
    return f"{moment.isoformat(timespec='milliseconds')} ({ms} ms)"


def _known(table: TableView, snapshot_id: int, what: str) -> Snapshot:
    try:
        return table.snapshot(snapshot_id)
    except KeyError:
        raise FormatError(
            f"{table.metadata_location}: {what} names snapshot {snapshot_id}, which is not among the table's snapshots"
        ) from None


def snapshot_as_of_timestamp(table: TableView, timestamp: Any, *, inclusive: bool = True) -> Snapshot | None:
    """The snapshot that was current at ``timestamp`` (ms or aware datetime), or None
    when the table had none then.  ``inclusive=False``: strictly before it."""
    ms = timestamp_ms(timestamp)
    chosen = None
    for entry in table.model.snapshot_log:
        if entry.timestamp_ms <= ms if inclusive else entry.timestamp_ms < ms:
            chosen = entry
    if chosen is None:
        return None
    return _known(table, chosen.snapshot_id, f"the snapshot-log entry at {_format_ms(chosen.timestamp_ms)}")


def _ref(table: TableView, name: str) -> tuple[str, Snapshot | None] | None:
    """(kind, snapshot) of the ref ``name``; None when the table has no such ref."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"a ref name must be a non-empty string, not {name!r}")
    raw_refs = table.metadata.get("refs") or {}
    ref = table.model.refs.get(name)
    if name == MAIN_BRANCH:
        current = table.current_snapshot_id
        if MAIN_BRANCH in raw_refs and ref is not None:
            if ref.snapshot_ref_type.value != "branch":
                raise FormatError(f"{table.metadata_location}: ref {MAIN_BRANCH!r} is a {ref.snapshot_ref_type.value}, "
                                  "not a branch")
            if ref.snapshot_id != current:
                raise FormatError(f"{table.metadata_location}: ref {MAIN_BRANCH!r} names snapshot {ref.snapshot_id} "
                                  f"but current-snapshot-id is {current}")
        return "branch", table.current_snapshot()
    if ref is None:
        return None
    kind = ref.snapshot_ref_type.value
    return kind, _known(table, ref.snapshot_id, f"{kind} {name!r}")


def snapshot_by_name(table: TableView, name: str) -> Snapshot | None:
    """The snapshot the branch or tag ``name`` points at; None when there is no such ref
    (or it is ``main`` of a table without snapshots)."""
    found = _ref(table, name)
    return None if found is None else found[1]


def _named(table: TableView, name: str, kind: str) -> Snapshot | None:
    found = _ref(table, name)
    if found is None:
        refs = sorted(r for r, v in table.model.refs.items() if v.snapshot_ref_type.value == kind)
        known = ", ".join(map(repr, refs)) or "none"
        plural = "branches" if kind == "branch" else "tags"
        raise KeyError(f"table {table.location} has no {kind} {name!r} (its {plural}: {known})")
    actual, snapshot = found
    if actual != kind:
        raise ValueError(f"table {table.location}: {name!r} is a {actual}, not a {kind}: read it with {actual}={name!r}")
    return snapshot


def resolve_read(
    table: TableView,
    *,
    snapshot_id: int | None = None,
    as_of_timestamp: Any = None,
    branch: str | None = None,
    tag: str | None = None,
) -> tuple[Snapshot | None, Schema]:
    """The snapshot a read selects (None: the table has no snapshot to read) and the
    schema it reads with."""
    given = {name: value for name, value in (("snapshot_id", snapshot_id), ("as_of_timestamp", as_of_timestamp),
                                              ("branch", branch), ("tag", tag)) if value is not None}
    if len(given) > 1:
        raise ValueError(f"give at most one of snapshot_id, as_of_timestamp, branch and tag, not {' and '.join(given)}")
    if snapshot_id is not None:
        snapshot = table.snapshot(snapshot_id)  # KeyError naming the table when unknown
        return snapshot, schema_of(table, snapshot)
    if as_of_timestamp is not None:
        snapshot = snapshot_as_of_timestamp(table, as_of_timestamp)
        if snapshot is None:
            ms = timestamp_ms(as_of_timestamp)
            raise ValueError(f"table {table.location} has no snapshot as of {_format_ms(ms)}: "
                             "its snapshot log starts later")
        return snapshot, schema_of(table, snapshot)
    if tag is not None:
        snapshot = _named(table, tag, "tag")
        return snapshot, schema_of(table, snapshot)
    if branch is not None:
        return _named(table, branch, "branch"), table.schema
    return table.current_snapshot(), table.schema


def schema_of(table: TableView, snapshot: Snapshot | None) -> Schema:
    """The schema ``snapshot`` was written with (the current one when it records none, as
    for snapshots written before Iceberg recorded it); a schema id the table does not
    have is damage."""
    if snapshot is None or snapshot.schema_id is None:
        return table.schema
    for schema in table.model.schemas:
        if schema.schema_id == snapshot.schema_id:
            return schema
    raise FormatError(f"{table.metadata_location}: snapshot {snapshot.snapshot_id} names schema {snapshot.schema_id}, "
                      "which is not among the table's schemas")

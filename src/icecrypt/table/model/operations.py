"""What a snapshot changed, by its manifests, and whether its ``operation`` says so (pure:
no IO; the callers read the manifests).

A snapshot's ``operation`` (``append``, ``replace``, ``overwrite``, ``delete``) is a label
in ``metadata.json``; readers act on it (an incremental read takes the rows of appends
only, a changelog and a stream pass over ``replace`` snapshots), so a forged label would
hide rows.  The manifests a snapshot wrote (manifest list entries whose
``added_snapshot_id`` is the snapshot's; authenticated in an encrypted table) say what it
did: their counts of entries it ADDED and DELETED, data files and delete files apart.
The label must fit them as Iceberg Java's producers choose it:

* ``append`` adds data files only: no data file removed, no delete file added (a row
  delta that only adds rows may drop delete files: allowed);
* ``replace`` (compaction, rewritten manifests or deletes) changes no row: it adds no more
  data rows than it removes, no more delete rows than it removes, and adds data (delete)
  files only where it removes some.  Its snapshot may add rows when it has no parent in
  the table (where the known history starts: ``encrypt_table``'s conversion), as Java's
  scans pass over such a snapshot too;
* ``delete`` adds no data file;
* ``overwrite`` may do any of it;
* no other label is one Iceberg writes (a format v1 snapshot may have none).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from icecrypt.errors import SnapshotIntegrityError

__all__ = ["SnapshotChanges", "check_operation", "snapshot_changes"]

APPEND, REPLACE, OVERWRITE, DELETE = "append", "replace", "overwrite", "delete"
#: manifest entry status and manifest content (Iceberg spec)
_ADDED, _DELETED = 1, 2
_DATA_MANIFEST = 0


@dataclasses.dataclass(frozen=True)
class SnapshotChanges:
    """The entries a snapshot's own manifests record it ADDED and DELETED: files and rows
    of data files, and of delete files (rows: deleted positions or equality rows)."""

    added_data_files: int = 0
    added_data_rows: int = 0
    removed_data_files: int = 0
    removed_data_rows: int = 0
    added_delete_files: int = 0
    added_delete_rows: int = 0
    removed_delete_files: int = 0
    removed_delete_rows: int = 0

    def __add__(self, other: SnapshotChanges) -> SnapshotChanges:
        return SnapshotChanges(*(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))

    def __str__(self) -> str:
        return (f"data files +{self.added_data_files}/-{self.removed_data_files} "
                f"(rows +{self.added_data_rows}/-{self.removed_data_rows}), "
                f"delete files +{self.added_delete_files}/-{self.removed_delete_files} "
                f"(rows +{self.added_delete_rows}/-{self.removed_delete_rows})")


#: manifest list count fields: (added files, removed files, added rows, removed rows)
_COUNTS = ("added_files_count", "deleted_files_count", "added_rows_count", "deleted_rows_count")


def _of(content_is_data: bool, added_files: int, removed_files: int, added_rows: int, removed_rows: int) -> SnapshotChanges:
    if content_is_data:
        return SnapshotChanges(added_files, added_rows, removed_files, removed_rows)
    return SnapshotChanges(added_delete_files=added_files, added_delete_rows=added_rows,
                           removed_delete_files=removed_files, removed_delete_rows=removed_rows)


def snapshot_changes(
    snapshot_id: int,
    manifests: Iterable[Mapping[str, Any]],
    entries: Callable[[Mapping[str, Any]], Iterable[tuple[int, int | None, int]]],
) -> SnapshotChanges:
    """What snapshot ``snapshot_id`` changed, from its manifest list's records
    (``manifests``): the counts of each manifest it wrote, or, where a count is missing
    (optional in format v1), the manifest's entries, ``entries(record)`` giving
    ``(status, snapshot id, record_count)`` of each (inherited ids resolved)."""
    total = SnapshotChanges()
    for manifest in manifests:
        if manifest.get("added_snapshot_id") != snapshot_id:
            continue  # written by an earlier snapshot: nothing of this one's
        is_data = (manifest.get("content") or _DATA_MANIFEST) == _DATA_MANIFEST
        counts = [manifest.get(name) for name in _COUNTS]
        if all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts):
            total += _of(is_data, *counts)
            continue
        tally = [0, 0, 0, 0]
        for status, entry_snapshot, record_count in entries(manifest):
            if entry_snapshot != snapshot_id or status not in (_ADDED, _DELETED):
                continue
            tally[0 if status == _ADDED else 1] += 1
            tally[2 if status == _ADDED else 3] += record_count
        total += _of(is_data, *tally)
    return total


def _disagreement(operation: str | None, changes: SnapshotChanges, *, root: bool, format_version: int) -> str | None:
    """Why ``operation`` cannot be the label of a snapshot that made ``changes`` (None: it
    can); ``root``: the snapshot has no parent in the table."""
    c = changes
    if operation == APPEND:
        if c.removed_data_files or c.added_delete_files:
            return "an append only adds data files"
    elif operation == REPLACE:
        if root and not (c.removed_data_files or c.removed_delete_files or c.added_delete_files):
            return None  # where the known history starts (a conversion): its rows are the table's first
        if c.added_data_rows > c.removed_data_rows or (c.added_data_files and not c.removed_data_files):
            return "a replace (rewrite) adds no data rows: it only rewrites rows it removes"
        if c.added_delete_rows > c.removed_delete_rows or (c.added_delete_files and not c.removed_delete_files):
            return "a replace (rewrite) deletes no row: it only rewrites delete files it removes"
    elif operation == DELETE:
        if c.added_data_files:
            return "a delete adds no data files"
    elif operation == OVERWRITE:
        return None
    elif operation is None and format_version == 1:
        return None  # format v1 snapshots may have no summary
    else:
        return f"{operation!r} is not an operation Iceberg writes (append, replace, overwrite, delete)"
    return None


def check_operation(
    table: str, snapshot_id: int, operation: str | None, changes: SnapshotChanges, *, root: bool, format_version: int,
) -> None:
    """Refuse (SnapshotIntegrityError naming ``table``, the snapshot, its label and what
    its manifests show) a snapshot whose ``operation`` its manifests contradict."""
    why = _disagreement(operation, changes, root=root, format_version=format_version)
    if why is not None:
        raise SnapshotIntegrityError(
            f"table {table}: snapshot {snapshot_id} is labelled operation {operation!r}, but its manifests show "
            f"{changes}: {why} (metadata.json was changed after the commit?); refused rather than acted on",
            table=table, snapshot_id=snapshot_id,
        )

"""Metadata housekeeping after a commit, as Iceberg Java's table operations do it.

Table properties (Java's names and defaults)::

    write.metadata.previous-versions-max        100    entries kept in ``metadata-log``
    write.metadata.delete-after-commit.enabled  false  delete the metadata files that
                                                       drop out of ``metadata-log``

The log itself is trimmed when a commit builds its metadata (``_write._log_previous``).
After the commit, with deletion enabled, the files the commit dropped from the log
(Java's ``deleteRemovedMetadataFiles``: the base version's log minus the new one's) are
deleted; failures to delete are warnings, never a failed commit.

Deleting what a metadata log names elsewhere (``rekey(expire=True)``, ``encrypt_table``'s
expiry, ``drop_table(purge=True)``) follows one rule, :func:`delete_logged_metadata_files`:
the log is storage's word, so only entries named as Iceberg names metadata files are
deleted, and only inside the table.

One check more than Java: in an encrypted table the keys of every snapshot live in the
metadata's ``encryption-keys``.  An old metadata file is deleted only when the new
metadata carries the whole key chain (manifest-list key entry and the KEK that wraps it)
of every snapshot it keeps; otherwise nothing is deleted and a warning says which key is
missing, since an old version may then be the only place that key is left.
"""

from __future__ import annotations

import contextlib
import posixpath
import warnings
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs

if TYPE_CHECKING:
    from icecrypt.table.files.io import Deletions

__all__ = [
    "DELETE_AFTER_COMMIT",
    "METADATA_FILE_SUFFIXES",
    "PREVIOUS_VERSIONS_MAX",
    "delete_logged_metadata_files",
    "delete_removed_metadata_files",
    "is_metadata_file_name",
    "missing_snapshot_keys",
]

DELETE_AFTER_COMMIT = "write.metadata.delete-after-commit.enabled"
PREVIOUS_VERSIONS_MAX = "write.metadata.previous-versions-max"


#: how Iceberg names metadata files: what a metadata-log entry must be called to be deleted
METADATA_FILE_SUFFIXES = (".metadata.json", ".metadata.json.gz")


def is_metadata_file_name(location: str) -> bool:
    """Whether a recorded location names a file as Iceberg names metadata files."""
    name = posixpath.basename(location)
    return name not in ("", ".", "..") and name.endswith(METADATA_FILE_SUFFIXES)


def delete_logged_metadata_files(deletions: Deletions, logged: Iterable[str]) -> None:
    """Delete the metadata files that metadata-log entries (``logged``: the locations
    as recorded) name, through ``deletions`` (under the table's pinned roots, never
    through a symbolic link; missing files ignored).  The log is storage's word: an entry
    not named ``*.metadata.json`` / ``*.metadata.json.gz`` (a data file, a manifest, a
    key store) is never deleted, only reported as skipped."""
    for recorded in logged:
        if not is_metadata_file_name(recorded):
            deletions.skipped.append((recorded, f"metadata-log entry {recorded} is not a metadata file"))
            continue
        with contextlib.suppress(OSError):
            deletions.location(recorded, what="metadata-log entry")


def _enabled(metadata: Mapping[str, Any]) -> bool:
    raw = (metadata.get("properties") or {}).get(DELETE_AFTER_COMMIT, "false")
    return str(raw).strip().lower() == "true"  # Java's Boolean.parseBoolean


def _log_files(metadata: Mapping[str, Any]) -> list[str]:
    return [e["metadata-file"] for e in metadata.get("metadata-log") or () if isinstance(e, Mapping) and "metadata-file" in e]


def missing_snapshot_keys(metadata: Mapping[str, Any]) -> list[str]:
    """The keys retained snapshots need that ``metadata`` lacks: for each snapshot with a
    ``key-id``, that ``encryption-keys`` entry and the entry of the KEK that wraps it
    (named by its ``encrypted-by-id``; a KEK itself is wrapped by the KMS master key,
    which is not in the list).  Empty when nothing is missing (and for plaintext tables)."""
    keys = {e.get("key-id"): e for e in metadata.get("encryption-keys") or () if isinstance(e, Mapping)}
    missing = []
    for snapshot in metadata.get("snapshots") or ():
        key_id = snapshot.get("key-id")
        if key_id is None:
            continue
        entry = keys.get(key_id)
        if entry is None:
            missing.append(f"{key_id} (snapshot {snapshot.get('snapshot-id')})")
            continue
        kek = entry.get("encrypted-by-id")
        if kek is None or kek not in keys:
            missing.append(f"{kek} (KEK of {key_id}, snapshot {snapshot.get('snapshot-id')})")
    return missing


def delete_removed_metadata_files(
    filesystem: pafs.FileSystem, base_location: str, base: Mapping[str, Any] | None, metadata: Mapping[str, Any]
) -> list[str]:
    """After committing ``metadata`` on top of the version at ``base_location`` (whose
    content is ``base``, read here when None), delete the metadata files that dropped
    out of the log, if the table says so.  Returns the paths deleted."""
    if not _enabled(metadata):
        return []
    if base is None:
        from icecrypt.table.files.metadata import read_metadata_file

        base = read_metadata_file(filesystem, base_location)
    kept = {posixpath.basename(f) for f in _log_files(metadata)}
    removed = [f for f in _log_files(base) if posixpath.basename(f) not in kept]
    if not removed:
        return []
    missing = missing_snapshot_keys(metadata)
    if missing:
        warnings.warn(
            f"{base_location}: old metadata files kept: the new metadata lacks keys its snapshots need "
            f"({', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''})",
            stacklevel=3,
        )
        return []
    metadata_dir = posixpath.dirname(base_location)
    deleted = []
    for recorded in removed:
        # the table's metadata files live beside its versions (Hadoop layout); a
        # recorded location is matched there by name, whatever prefix it was written with
        if not is_metadata_file_name(recorded):
            continue  # not a metadata file's name: the log is storage's word, nothing to delete
        path = posixpath.join(metadata_dir, posixpath.basename(recorded))
        try:
            filesystem.delete_file(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            warnings.warn(f"{path}: old metadata file not deleted ({exc})", stacklevel=3)
            continue
        deleted.append(path)
    return deleted

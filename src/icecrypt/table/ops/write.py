"""The write path of encrypted Iceberg tables: create, append, overwrite, delete (with
deletion vectors) and snapshot expiry, each ending in one atomic metadata commit.

Keys flow as in Iceberg Java (SPEC.md §3): every data, delete and manifest file gets a
fresh DEK and AAD prefix whose key metadata is stored in its (encrypted) parent file;
the manifest list's key metadata is wrapped by the table's current KEK (created, and
wrapped by the KMS master key, when there is none) and stored in ``encryption-keys``;
the snapshot's ``key-id`` names that entry.  Nothing is written in plaintext into an
encrypted table (``_write_io``).

Every commit goes through the one committer (``_committer``): a snapshot producer
(:func:`_commit_change`) turns its change into table updates (``add-encryption-key``,
``add-snapshot``, ``set-snapshot-ref`` of the branch written to) on the newest committed
version.  When another writer got there first, an append is re-applied on top of the
new version (its data files and manifest are reused; the manifest list, keys and
snapshot are rebuilt) until ``commit.retry.total-timeout-ms``; overwrite and delete,
whose effect depends on the rows they saw, are refused with
:class:`~icecrypt.CommitConflictError` when their branch moved; expiry is recomputed.
Whatever a failed operation wrote is deleted before the error propagates, unless a
catalog could not tell whether the commit landed (then the files are kept).
"""

from __future__ import annotations

import contextlib
import datetime
import posixpath
import secrets
import time
import types
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER, SortOrder
from pyiceberg.types import DateType, TimestampType

from icecrypt import __version__
from icecrypt.errors import CommitConflictError, FormatError, PathOutsideTableError
from icecrypt.keys import EncryptionManager, StandardKeyMetadata
from icecrypt.keys.manager import ENCRYPTION_TABLE_KEY, removable_keys, validate_table_properties
from icecrypt.table.commit import store as _commit
from icecrypt.table.commit.target import FORMAT_VERSION, _Target
from icecrypt.table.model import changes as _model
from icecrypt.table.files.io import Deletions, Locations, file_key_metadata
from icecrypt.table.files.manifest_write import (
    ADDED,
    DATA,
    DELETED,
    EQUALITY_DELETES,
    EXISTING,
    POSITION_DELETES,
    WrittenManifest,
    resolve_entries,
    to_internal,
    write_manifest,
    write_manifest_list,
)
from icecrypt.table.commit.pin import TablePin, check_unambiguous
from icecrypt.table.model.operations import SnapshotChanges, snapshot_changes
from icecrypt.table.model.retention import plan_expiry
from icecrypt.table.files.layout import WriteLayout
from icecrypt.table.files.write_data import DataWriteOptions, table_sort_order, write_data_files
from icecrypt.table.files.write_dv import DeletionVector, decode_dv, puffin_file
from icecrypt.table.files.write_io import TableIO
from icecrypt.table.model.schema import iceberg_schema, schema_to_json, sort_order_to_json, spec_to_json

__all__ = [
    "append",
    "append_files",
    "create_metadata",
    "delete",
    "expire_snapshots",
    "overwrite",
    "overwrite_files",
    "write_files",
]

MAX_PREVIOUS_VERSIONS = 100  # write.metadata.previous-versions-max, as in Java


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


# --- reading what is there -----------------------------------------------------------------


def _schema(metadata: dict[str, Any]) -> Schema:
    schema_id = metadata.get("current-schema-id", 0)
    for entry in metadata.get("schemas") or ():
        if entry.get("schema-id") == schema_id:
            return Schema.model_validate(entry)
    raise FormatError(f"table metadata has no schema {schema_id}")


class _Schemas(Sequence[Schema]):
    """Every schema of the table (what older specs' partition fields are typed by),
    parsed on first use: only a spec whose source column was dropped needs them."""

    def __init__(self, metadata: Mapping[str, Any]) -> None:
        self._entries = list(metadata.get("schemas") or ())
        self._parsed: list[Schema] | None = None

    def _all(self) -> list[Schema]:
        if self._parsed is None:
            self._parsed = [Schema.model_validate(entry) for entry in self._entries]
        return self._parsed

    def __getitem__(self, index: Any) -> Any:
        return self._all()[index]

    def __len__(self) -> int:
        return len(self._entries)


def _schemas(metadata: Mapping[str, Any]) -> Sequence[Schema]:
    return _Schemas(metadata)


def _specs(metadata: dict[str, Any]) -> dict[int, PartitionSpec]:
    return {entry["spec-id"]: PartitionSpec.model_validate(entry) for entry in metadata.get("partition-specs") or ()}


def _current_snapshot(metadata: dict[str, Any]) -> dict[str, Any] | None:
    snapshot_id = metadata.get("current-snapshot-id")
    if snapshot_id is None or snapshot_id == -1:
        return None
    for snapshot in metadata.get("snapshots") or ():
        if snapshot["snapshot-id"] == snapshot_id:
            return snapshot
    raise FormatError(f"current snapshot {snapshot_id} is not in the table metadata")


def _new_snapshot_id(metadata: dict[str, Any]) -> int:
    taken = {s["snapshot-id"] for s in metadata.get("snapshots") or ()}
    while True:
        candidate = secrets.randbits(63)  # positive, like Java's UUID-derived ids
        if candidate and candidate not in taken:
            return candidate


def _read_manifest_list(io: TableIO, manager: EncryptionManager | None, snapshot: dict[str, Any]) -> list[dict]:
    key = None
    if manager is not None:
        key_id = snapshot.get("key-id")
        if key_id is None:
            raise FormatError(f"snapshot {snapshot['snapshot-id']} of an encrypted table has no key-id")
        key = manager.unwrap_manifest_list_key_metadata(key_id)
        if key.file_length is None:
            raise FormatError(f"manifest list {snapshot['manifest-list']}: key metadata has no file_length "
                              "(needed to authenticate an AGS1 file)")
    with io.read_avro(snapshot["manifest-list"], key) as records:
        manifests = [dict(record) for record in records]
    for manifest in manifests:  # refused here as reads refuse them, before anything is written
        _file_key(io, manifest.get("key_metadata"), "manifest", manifest["manifest_path"])
    return manifests


def _file_key(io: TableIO, raw: bytes | None, what: str, location: str, *, needs_length: bool = True) -> StandardKeyMetadata | None:
    """The key metadata of a file of an encrypted table, checked as reads check it
    (decodable; for an AGS1 file with ``file_length``, without which a stream cut at a
    block boundary would authenticate); None when absent or in a plaintext table."""
    if raw is None or not io.encrypted:
        return None
    return file_key_metadata(raw, what, location, encrypted=True, needs_length=needs_length)


def _read_entries(io: TableIO, manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """Entries of a manifest, inherited fields made explicit."""
    location = manifest["manifest_path"]
    with io.read_avro(location, _file_key(io, manifest.get("key_metadata"), "manifest", location)) as records:
        entries = resolve_entries(manifest, list(records))
    for entry in entries:  # as reads check them: merges and rewrites carry them into new manifests
        df = entry["data_file"]
        _file_key(io, df.get("key_metadata"), "data file" if (df.get("content") or DATA) == DATA else "delete file",
                  df["file_path"], needs_length=str(df.get("file_format")).upper() != "PARQUET")
    return entries


def _changes_of(io: TableIO, manager: EncryptionManager | None) -> Callable[[Mapping[str, Any]], SnapshotChanges]:
    """What a snapshot of a version changed (``snapshot_changes``), by its manifest list
    and, where counts are missing, its manifests, read and authenticated with ``io`` and
    ``manager`` (that version's keys)."""

    def changes(snapshot: Mapping[str, Any]) -> SnapshotChanges:
        def entries(manifest: Mapping[str, Any]) -> Iterator[tuple[int, int | None, int]]:
            for entry in _read_entries(io, dict(manifest)):
                yield entry["status"], entry["snapshot_id"], entry["data_file"]["record_count"]

        return snapshot_changes(snapshot["snapshot-id"], _read_manifest_list(io, manager, dict(snapshot)), entries)

    return changes


def _has_live_files(manifest: dict[str, Any]) -> bool:
    added, existing = manifest.get("added_files_count"), manifest.get("existing_files_count")
    return added is None or existing is None or added + existing > 0


def _is_dv(data_file: dict[str, Any]) -> bool:
    return data_file["content"] == POSITION_DELETES and data_file["file_format"].upper() == "PUFFIN"


def _entry_key(data_file: dict[str, Any]) -> tuple[str, int | None]:
    """Identifies a manifest entry: DVs share Puffin files, so their offset counts."""
    return data_file["file_path"], data_file.get("content_offset") if _is_dv(data_file) else None


# --- snapshots and commits --------------------------------------------------------------------


@dataclass
class _Change:
    """One snapshot's worth of change, before it is bound to a base version."""

    operation: str
    new_manifests: list[WrittenManifest]
    kept_manifests: list[dict[str, Any]]
    added_files: list[dict[str, Any]] = field(default_factory=list)
    removed_files: list[dict[str, Any]] = field(default_factory=list)
    replaced_manifests: int = 0
    summary_extra: dict[str, str] = field(default_factory=dict)  # e.g. entries-processed (rewrite manifests)
    order: list[Any] | None = None  # the manifest list in its final order (manifest merging), else new then kept
    attempt_written: list[str] = field(default_factory=list)  # files this attempt wrote (removed if it loses)
    updates: list[Any] = field(default_factory=list)  # further table updates of the same commit


def _tally(files: list[dict[str, Any]]) -> dict[str, int]:
    t = dict.fromkeys(("data", "eq_files", "pos_files", "deletes", "dvs", "records", "size", "pos", "eq"), 0)
    for f in files:
        # a DV counts with the size of its blob, as in Java's summaries
        t["size"] += f["content_size_in_bytes"] if _is_dv(f) else f["file_size_in_bytes"]
        if f["content"] == DATA:
            t["data"] += 1
            t["records"] += f["record_count"]
            continue
        t["deletes"] += 1
        if f["content"] == EQUALITY_DELETES:
            t["eq_files"] += 1
            t["eq"] += f["record_count"]
        else:
            t["dvs" if _is_dv(f) else "pos_files"] += 1
            t["pos"] += f["record_count"]
    return t


def _partition_key(partition: dict[str, Any] | None) -> str:
    """A partition as one key, whether its values were read from a manifest (a date, a
    datetime, a uuid's 16 bytes) or come from splitting new rows (days, micros, a UUID),
    so that a partition a commit both adds to and removes from counts once."""

    def internal(value: Any) -> Any:
        if isinstance(value, uuid.UUID):
            return value.bytes
        if isinstance(value, datetime.datetime):
            return to_internal(value, TimestampType())
        if isinstance(value, datetime.date):
            return to_internal(value, DateType())
        return value

    return repr(sorted((name, internal(value)) for name, value in (partition or {}).items()))


def _summary(change: _Change, parent: dict[str, Any] | None) -> dict[str, str]:
    """The snapshot summary, with Java's property names, order and running totals."""
    add, rem = _tally(change.added_files), _tally(change.removed_files)
    result = {
        "operation": change.operation,
        "manifests-created": str(len(change.new_manifests)),
        "manifests-kept": str(len(change.kept_manifests)),
        "manifests-replaced": str(change.replaced_manifests),
        **change.summary_extra,
    }
    for name, value in (
        ("added-data-files", add["data"]), ("deleted-data-files", rem["data"]),
        ("added-equality-delete-files", add["eq_files"]), ("removed-equality-delete-files", rem["eq_files"]),
        ("added-position-delete-files", add["pos_files"]), ("removed-position-delete-files", rem["pos_files"]),
        ("added-delete-files", add["deletes"]), ("added-dvs", add["dvs"]), ("removed-dvs", rem["dvs"]),
        ("removed-delete-files", rem["deletes"]),
        ("added-records", add["records"]), ("deleted-records", rem["records"]),
        ("added-files-size", add["size"]), ("removed-files-size", rem["size"]),
        ("added-position-deletes", add["pos"]), ("removed-position-deletes", rem["pos"]),
        ("added-equality-deletes", add["eq"]), ("removed-equality-deletes", rem["eq"]),
    ):  # fmt: skip
        if value:
            result[name] = str(value)
    partitions = {_partition_key(f["partition"]) for f in change.added_files + change.removed_files}
    result["changed-partition-count"] = str(len(partitions))
    before = (parent or {}).get("summary") or {}
    for name, delta in (
        ("total-records", add["records"] - rem["records"]),
        ("total-files-size", add["size"] - rem["size"]),
        ("total-data-files", add["data"] - rem["data"]),
        ("total-delete-files", add["deletes"] - rem["deletes"]),
        ("total-position-deletes", add["pos"] - rem["pos"]),
        ("total-equality-deletes", add["eq"] - rem["eq"]),
    ):
        if parent is None:
            result[name] = str(delta)
        elif name in before:
            result[name] = str(int(before[name]) + delta)
    result["engine-name"] = "icecrypt"
    result["engine-version"] = __version__
    return result


def _log_previous(metadata: dict[str, Any], base: dict[str, Any], base_location: str) -> None:
    """Append the base version to ``metadata-log`` (trimmed as Java trims it)."""
    _model.log_previous(metadata, base, base_location)


def _head(metadata: dict[str, Any], branch: str) -> dict[str, Any] | None:
    """The snapshot a write to ``branch`` builds on: the one it points at, or for a
    branch that does not exist yet main's current snapshot (Java's
    ``SnapshotUtil.latestSnapshot``); None for an empty table."""
    ref = (metadata.get("refs") or {}).get(branch)
    if branch == _model.MAIN_BRANCH or ref is None:
        return _current_snapshot(metadata)
    for snapshot in metadata.get("snapshots") or ():
        if snapshot["snapshot-id"] == ref["snapshot-id"]:
            return snapshot
    raise FormatError(f"ref {branch!r} points at snapshot {ref['snapshot-id']}, which is not in the table metadata")


def _new_snapshot(
    base: dict[str, Any], parent: dict[str, Any] | None, change: _Change, snapshot_id: int, list_location: str,
    next_row_id: int,
) -> dict[str, Any]:
    """The snapshot entry (Java's field order, no ``key-id`` yet) of ``change`` committed
    on ``base`` after ``parent``, its manifest list at ``list_location`` having assigned
    row ids up to ``next_row_id``."""
    first_row_id = base.get("next-row-id", 0)
    snapshot: dict[str, Any] = {"sequence-number": base.get("last-sequence-number", 0) + 1, "snapshot-id": snapshot_id}
    if parent is not None:
        snapshot["parent-snapshot-id"] = parent["snapshot-id"]
    snapshot["timestamp-ms"] = max(_now_ms(), base.get("last-updated-ms", 0))
    snapshot["summary"] = _summary(change, parent)
    snapshot["manifest-list"] = list_location
    snapshot["schema-id"] = base.get("current-schema-id", 0)
    snapshot["first-row-id"] = first_row_id
    snapshot["added-rows"] = next_row_id - first_row_id
    return snapshot


def _snapshot_updates(
    target: _Target,
    base: dict[str, Any],
    manager: EncryptionManager | None,
    change: _Change,
    snapshot_id: int,
    list_location: str,
    *,
    branch: str,
    stage_only: bool,
) -> list[_model.TableUpdate]:
    """Write the manifest list of ``change`` as the next snapshot of ``branch`` on top of
    ``base``; returns the table updates that commit it: the keys the wrap of its
    manifest-list key added (a KEK created if none is current), the snapshot, and the
    branch moved to it (unless ``stage_only``: a write-audit-publish snapshot).  The
    manifest list is removed if this raises."""
    parent = _head(base, branch)
    sequence_number = base.get("last-sequence-number", 0) + 1
    first_row_id = base.get("next-row-id", 0)
    key, next_row_id = write_manifest_list(
        target.io(manager), list_location, change.new_manifests, change.kept_manifests,
        snapshot_id=snapshot_id, parent_snapshot_id=parent["snapshot-id"] if parent else None,
        sequence_number=sequence_number, first_row_id=first_row_id, ordered=change.order,
    )  # fmt: skip
    try:
        snapshot = _new_snapshot(base, parent, change, snapshot_id, list_location, next_row_id)
        updates: list[_model.TableUpdate] = list(change.updates)
        if manager is not None:
            snapshot["key-id"] = manager.wrap_manifest_list_key_metadata(key).key_id
            known = {entry.get("key-id") for entry in base.get("encryption-keys") or ()}
            updates += [_model.AddEncryptionKey(k.to_json()) for k in manager.encryption_keys if k.key_id not in known]
    except BaseException:
        target.io(None).remove(list_location)
        raise
    updates.append(_model.AddSnapshot(snapshot))
    if not stage_only:
        updates.append(_branch_update(base, branch, snapshot_id))
    return updates


def _head_id(metadata: dict[str, Any], branch: str) -> int | None:
    head = _head(metadata, branch)
    return None if head is None else head["snapshot-id"]


WAP_ENABLED = "write.wap.enabled"
WAP_ID = "wap.id"  # the summary property of a staged snapshot (Java's STAGED_WAP_ID_PROP)


def _write_ref(base: dict[str, Any], branch: str | None, wap_id: str | None) -> tuple[str, bool, dict[str, str]]:
    """(branch, stage only, summary properties) of a write: ``branch`` (default main)
    must not be a tag; a ``wap_id`` needs ``write.wap.enabled=true`` and stages the
    snapshot (no branch moves) with summary ``wap.id``, as Java's Spark writes do."""
    if branch is not None and (not isinstance(branch, str) or not branch):
        raise ValueError(f"branch must be a non-empty string, not {branch!r}")
    name = branch or _model.MAIN_BRANCH
    if name not in (base.get("refs") or {}):
        _model.check_ref_name(name)  # a write to a new branch creates it: refused before any file is written
    ref = (base.get("refs") or {}).get(name)
    if ref is not None and ref.get("type") != "branch":
        raise ValueError(f"{name!r} is a tag, not a branch: a write cannot commit to it")
    if wap_id is None:
        return name, False, {}
    if not isinstance(wap_id, str) or not wap_id:
        raise ValueError(f"wap_id must be a non-empty string, not {wap_id!r}")
    if str((base.get("properties") or {}).get(WAP_ENABLED, "false")).lower() != "true":
        raise ValueError(f"wap_id {wap_id!r}: write-audit-publish needs the table property {WAP_ENABLED}=true")
    if branch is not None:
        raise ValueError(f"wap_id {wap_id!r} and branch {branch!r}: a write either stages (WAP) or commits to a branch")
    return name, True, {WAP_ID: wap_id}


def _branch_update(base: dict[str, Any], branch: str, snapshot_id: int) -> _model.SetSnapshotRef:
    """``branch`` moved to ``snapshot_id``, its retention kept (a new branch has none)."""
    ref = (base.get("refs") or {}).get(branch) or {}
    if ref.get("type", "branch") != "branch":
        raise ValueError(f"{branch!r} is a tag, not a branch: a write cannot move it")
    return _model.SetSnapshotRef(
        branch, snapshot_id, "branch", ref.get("min-snapshots-to-keep"), ref.get("max-snapshot-age-ms"),
        ref.get("max-ref-age-ms"),
    )  # fmt: skip


def _commit_change(
    target: _Target,
    base_location: str,
    base: dict[str, Any],
    build: Callable[[dict[str, Any], EncryptionManager | None], _Change],
    *,
    snapshot_id: int,
    retry: bool,
    conflict_free: bool = False,
    branch: str = _model.MAIN_BRANCH,
    stage_only: bool = False,
    on_retry: Callable[[int], None] | None = None,
) -> str:
    """Commit the change ``build`` makes of a table version as snapshot ``snapshot_id``
    of ``branch``, through the one committer (``_committer``); returns the new metadata
    location (installed in the table object).

    Each attempt builds on the newest version: ``build`` (validations of a rewrite
    included), then a new manifest list, its key wrapped, and the updates that add the
    snapshot and move the branch (whose requirement, derived as Java derives it, is
    that the branch still points where the attempt found it).  The first attempt uses
    ``base``.  With ``retry`` the change is rebuilt on a newer version when another
    writer committed first: an append (``conflict_free``: it cannot conflict) until
    ``commit.retry.total-timeout-ms``, others up to ``commit.retry.num-retries`` times;
    without ``retry`` (overwrite, delete: their effect depends on the rows they saw) a
    version whose branch moved refuses the change (CommitConflictError), while one
    where only metadata changed (properties, other refs) takes it as planned.  A lost
    attempt's manifest list is deleted; if this raises, nothing was committed (or, on a
    catalog that cannot tell whether its swap landed, nobody knows: nothing is deleted).
    """
    from icecrypt.table.commit import committer as _committer

    commit_id = str(uuid.uuid4())
    planned = _head_id(base, branch)  # where the branch was when the change was planned
    attempts = iter(range(1, 1 << 62))

    def attempt(version_location: str, version: dict[str, Any]) -> _committer.Staged:
        n = next(attempts)
        if any(s["snapshot-id"] == snapshot_id for s in version.get("snapshots") or ()):
            raise CommitConflictError(f"snapshot id {snapshot_id} was taken by a concurrent commit; nothing was committed")
        head = _head_id(version, branch)
        if not retry and head != planned:
            raise CommitConflictError(
                f"{target.metadata_location}: another writer committed first (branch {branch!r} moved from snapshot "
                f"{planned} to {head}; this change is not re-applied to a newer version); nothing was committed"
            )
        manager = target.manager(version)
        keys_whole = target.check_base_keys(version_location, version, manager)
        change = build(version, manager)
        list_location = write_layout(target, version).metadata_file(f"snap-{snapshot_id}-{n}-{commit_id}.avro")
        updates = _snapshot_updates(
            target, version, manager, change, snapshot_id, list_location, branch=branch, stage_only=stage_only
        )
        what = f"{change.operation} (snapshot {snapshot_id})"
        return _committer.Staged(
            _model.Change.on(version, updates, what=what), manager=manager,
            written=(list_location, *change.attempt_written),
            keys_whole=keys_whole, conflict_free=retry and conflict_free,
        )  # fmt: skip

    location = _committer.commit(target, attempt, first_base=(base_location, base), on_retry=on_retry)
    assert location is not None
    return location


def _cleanup(io: TableIO, locations: list[str]) -> None:
    """Best-effort removal of files an operation wrote before it failed."""
    for location in locations:
        with contextlib.suppress(Exception):  # the error being propagated matters more
            io.remove(location)


def _discard(io: TableIO, locations: list[str], exc: BaseException) -> None:
    """Remove what an operation that failed with ``exc`` wrote, unless its commit landed
    or nobody can tell (a catalog that could not say, an interrupt once the version file
    was in place): that version may be current, and names them."""
    if not _commit.files_needed(exc):
        _cleanup(io, locations)


def _commit_planned(
    target: _Target, base_location: str, base: dict[str, Any], change: _Change, snapshot_id: int, branch: str
) -> str:
    """Commit ``change``, planned on ``base`` from the rows it saw (an overwrite, a
    delete): never rebuilt, refused when ``branch`` moved meanwhile."""
    return _commit_change(
        target, base_location, base, lambda _version, _manager: change, snapshot_id=snapshot_id, retry=False,
        branch=branch,
    )  # fmt: skip


def write_layout(target: _Target, metadata: dict[str, Any]) -> WriteLayout:
    """Where the table's new files go: under its pinned roots (the table object's pin,
    never a root read from a newer version; ``metadata``'s own when nothing is pinned)
    in the layout ``metadata``'s properties ask for (Java's ``LocationProviders``).
    ValueError for a layout Iceberg Java refuses (deprecated location properties, a path
    table with ``write.metadata.path``), before anything is written."""
    pin = target.pin if target.pin is not None else TablePin.from_metadata(metadata)
    return WriteLayout.of(pin.location, metadata.get("properties"), data_path=pin.data_location,
                          metadata_path=pin.metadata_dir, catalog=target.store is not None)  # fmt: skip


# --- create -----------------------------------------------------------------------------------


def _resolve_location(location: str, filesystem: pafs.FileSystem | None) -> tuple[pafs.FileSystem, str, str]:
    """(filesystem, table directory on it, location to record in metadata)."""
    location = str(location).rstrip("/")
    if "://" in location:
        scheme, rest = location.split("://", 1)
        if filesystem is None:
            filesystem, path = pafs.FileSystem.from_uri(location)
            return filesystem, path.rstrip("/"), location
        return filesystem, ("/" + rest.lstrip("/") if scheme == "file" else rest), location
    if filesystem is None or isinstance(filesystem, pafs.LocalFileSystem):
        path = posixpath.abspath(location)
        return filesystem or pafs.LocalFileSystem(), path, path
    return filesystem, location, location


def create_metadata(
    location: str,
    schema: Schema | pa.Schema,
    *,
    kms: Any,
    table_key_id: str | None,
    partition_spec: PartitionSpec | None = None,
    sort_order: SortOrder | None = None,
    properties: dict[str, str] | None = None,
    filesystem: pafs.FileSystem | None = None,
    store: Any = None,
) -> tuple[pafs.FileSystem, str, dict[str, str]]:
    """Write the first metadata file of a new table; returns (filesystem, its path there,
    location map {recorded location: filesystem path}, empty when they are equal).

    Without ``store`` that is ``v1.metadata.json`` (Hadoop layout, version hint); with a
    catalog's ``store`` (``_commit.MetadataStore``) it is
    ``00000-<uuid>.metadata.json``, registered through ``store.create``."""
    filesystem, fs_location, recorded = _resolve_location(location, filesystem)
    metadata = new_table_metadata(
        recorded, schema, kms=kms, table_key_id=table_key_id, partition_spec=partition_spec,
        sort_order=sort_order, properties=properties,
    )  # fmt: skip
    location_map = {recorded: fs_location} if recorded != fs_location else {}
    to_fs_path = Locations(filesystem, location_map).to_fs_path
    target = _Target(filesystem, "", to_fs_path, kms, store=store)
    path = target.commit_metadata(None, metadata)
    return filesystem, path, location_map


def new_table_metadata(
    recorded: str,
    schema: Schema | pa.Schema,
    *,
    kms: Any,
    table_key_id: str | None,
    partition_spec: PartitionSpec | None = None,
    sort_order: SortOrder | None = None,
    properties: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The first metadata document of a new format-version 3 table at location
    ``recorded`` (checks the properties, and that the KMS can use the master key)."""
    properties = {str(k): str(v) for k, v in (properties or {}).items()}
    if table_key_id is not None:
        if properties.get(ENCRYPTION_TABLE_KEY, table_key_id) != table_key_id:
            raise ValueError(f"table_key_id {table_key_id!r} differs from property {ENCRYPTION_TABLE_KEY}")
        properties[ENCRYPTION_TABLE_KEY] = table_key_id
    key_id, data_key_length = validate_table_properties(properties, FORMAT_VERSION)
    if key_id is not None:
        if kms is None:
            raise ValueError("an encrypted table needs a KMS client (kms=...)")
        # fail now rather than at the first commit if the master key cannot be used
        kms.unwrap_key(kms.wrap_key(secrets.token_bytes(data_key_length), key_id), key_id)
    table_schema = iceberg_schema(schema)
    if table_schema.schema_id != 0:
        table_schema = Schema(*table_schema.fields, schema_id=0, identifier_field_ids=table_schema.identifier_field_ids)
    spec = partition_spec or UNPARTITIONED_PARTITION_SPEC
    for spec_field in spec.fields:
        source = table_schema.find_field(spec_field.source_id)
        if not spec_field.transform.can_transform(source.field_type):
            raise ValueError(
                f"partition field {spec_field.name!r}: {spec_field.transform} cannot transform {source.field_type}"
            )
    order = sort_order or UNSORTED_SORT_ORDER
    metadata = {
        "format-version": FORMAT_VERSION,
        "table-uuid": str(uuid.uuid4()),
        "location": recorded,
        "last-sequence-number": 0,
        "last-updated-ms": _now_ms(),
        "last-column-id": table_schema.highest_field_id,
        "current-schema-id": 0,
        "schemas": [schema_to_json(table_schema)],
        "default-spec-id": spec.spec_id,
        "partition-specs": [spec_to_json(spec)],
        "last-partition-id": spec.last_assigned_field_id,
        "default-sort-order-id": order.order_id,
        "sort-orders": [sort_order_to_json(order)],
        "properties": properties,
        "current-snapshot-id": None,
        "next-row-id": 0,
        "refs": {},
        "snapshots": [],
        "statistics": [],
        "partition-statistics": [],
        "snapshot-log": [],
        "metadata-log": [],
    }
    return metadata


# --- append / overwrite ---------------------------------------------------------------------


def _write_new_data(
    target: _Target, base: dict[str, Any], data: Any, file_format: str | None, target_file_size: int | None,
    operation_id: str | None = None, task_id: int = 0, *, check_kek: bool = True, lineage: bool = False,
) -> tuple[TableIO, list[dict[str, Any]], list[str], PartitionSpec, Schema]:
    io = target.io(target.manager(base, check_kek=check_kek))
    schema = _schema(base)
    spec = _specs(base)[base.get("default-spec-id", 0)]
    properties = base.get("properties") or {}
    options = DataWriteOptions.from_properties(properties, file_format=file_format, target_file_size=target_file_size)
    data_files, started = write_data_files(
        io, data, schema=schema, spec=spec, layout=write_layout(target, base), properties=properties,
        options=options, sort_order_id=base.get("default-sort-order-id", 0), operation_id=operation_id,
        task_id=task_id, sort_order=table_sort_order(base), lineage=lineage,
    )  # fmt: skip
    return io, data_files, started, spec, schema


def _added_entries(data_files: list[dict[str, Any]], snapshot_id: int) -> list[dict[str, Any]]:
    # sequence numbers are inherited from the manifest list (assigned at commit)
    return [
        {"status": ADDED, "snapshot_id": snapshot_id, "sequence_number": None, "file_sequence_number": None,
         "data_file": data_file}
        for data_file in data_files
    ]  # fmt: skip


def write_files(
    table: Any, data: Any, *, file_format: str | None = None, target_file_size: int | None = None,
    operation_id: str | None = None, task_id: int = 0, lineage: bool = False,
) -> list[dict[str, Any]]:
    """Write ``data`` as data files of the table's current schema and partition spec,
    without committing them; returns their manifest ``data_file`` records (plain,
    picklable dicts holding each file's encoded key metadata) for :func:`append_files`.

    This is the half of an append a distributed writer runs on its workers; the driver
    then commits every worker's records in one :func:`append_files`.  Nothing is left
    behind if this raises.  ``operation_id`` (one per distributed job) and ``task_id``
    (unique per task attempt) go into the file names,
    ``<task id>-<pid>-<operation id>-<count>.<ext>``, as Java's ``OutputFileFactory``
    names them: the driver can then find files of attempts that died before reporting
    (:func:`remove_job_leftovers`).  With ``lineage``, ``data`` also has the columns
    ``_row_id`` and ``_last_updated_sequence_number`` (rows a row-level change moves keep
    them; nulls are assigned at commit) and the files store them.
    """
    target = _Target.of(table)
    _, base = target.latest()
    # data files need fresh DEKs only: no KEK is checked here (a Spark executor may have no
    # KMS access); the driver's append_files checks it before it commits anything
    _, data_files, _, _, _ = _write_new_data(target, base, data, file_format, target_file_size, operation_id, task_id,
                                             check_kek=False, lineage=lineage)
    return data_files


def remove_job_leftovers(
    table: Any, operation_id: str, keep: Iterable[str], directories: Iterable[str] = ()
) -> list[str]:
    """Delete the data files of job ``operation_id`` (see :func:`write_files`) that are
    not in ``keep`` (the job's committed or still-wanted file locations), looking in the
    directories of ``keep``, in ``directories`` and in the table's ``data`` directory;
    hidden temporary files of the job's unfinished writes go too.  Best effort: returns
    the locations deleted, never raises for a file it cannot list or delete."""
    import pyarrow.fs as _pafs

    marker = f"-{operation_id}-"
    locations = table.locations
    deletions = Deletions(locations, f"cleanup of job {operation_id}")
    keep_fs = set()
    for path in keep:
        with contextlib.suppress(ValueError):  # a file outside the table is nobody's to keep here
            keep_fs.add(locations.to_fs_path(path))
    dirs = {posixpath.dirname(path) for path in keep_fs}
    for directory in (*directories, table.pin.data_location or f"{table.pin.location}/data"):
        try:
            dirs.add(locations.delete_path(directory, what="directory"))
        except ValueError:  # outside the table: never listed, never cleaned
            continue
    removed = []
    for directory in sorted(dirs):
        try:
            infos = table.filesystem.get_file_info(_pafs.FileSelector(directory, allow_not_found=True))
        except OSError:
            continue
        for info in infos:
            if info.type == _pafs.FileType.File and marker in info.base_name and info.path not in keep_fs:
                with contextlib.suppress(OSError):
                    if deletions.path(info.path):
                        removed.append(info.path)
    return removed


def append_files(
    table: Any, data_files: list[dict[str, Any]], *, branch: str | None = None, wap_id: str | None = None,
    on_retry: Callable[[int], None] | None = None, summary: Mapping[str, str] | None = None,
    check: Callable[[dict[str, Any], Callable[[Mapping[str, Any]], SnapshotChanges]], None] | None = None,
    keep_data_files: bool = False, properties: Mapping[str, str] | None = None,
) -> int | None:
    """Commit data files written by :func:`write_files` as one append snapshot; returns
    its id (the current one if there are none).  A concurrent commit is not lost: the
    append is re-applied on top of it (retried until ``commit.retry.total-timeout-ms``:
    an append cannot conflict).  If this raises, the data files are deleted (unless a
    catalog could not tell whether the commit landed: then they are kept).

    ``branch``: the branch to commit to (default ``main``; one that does not exist is
    created at the new snapshot, whose parent is then main's head, as Java's writes to a
    new branch).  ``wap_id``: with ``write.wap.enabled=true``, stage the snapshot for
    write-audit-publish (summary ``wap.id``; no branch moves; publish it with
    ``manage_snapshots().cherry_pick(id)``).  ``summary``: further snapshot summary
    properties (names Iceberg's own summary uses are refused).  ``check``: called with
    each version the commit is about to build on (every attempt) and a function giving
    what a snapshot of that version changed by its manifests (``SnapshotChanges``, read
    with that version's keys); whatever it raises stops the commit, and the data files
    are deleted as for any failure (a streaming sink's test that its epoch is not
    already committed).  ``keep_data_files``: the data files are the caller's (added as
    they are, ``add_files``): never deleted.  ``properties``: table properties the same
    commit sets where a version does not already have them (``add_files``' name mapping).
    """
    target = _Target.of(table)
    io: TableIO | None = None
    written = [] if keep_data_files else [f["file_path"] for f in data_files]
    merged_written: list[str] = []  # manifests written by merging, in any attempt
    try:
        extra_summary = _summary_properties(summary)
        base_location, base = target.latest()
        base_manager = target.manager(base)
        io = target.io(base_manager)
        branch, stage_only, extra = _write_ref(base, branch, wap_id)
        if not data_files:
            if check is not None:
                check(base, _changes_of(io, base_manager))
            return _model.ref_snapshot(base, branch)
        _check_data_files(io, data_files)
        snapshot_id = _new_snapshot_id(base)
        layout = write_layout(target, base)
        manifest_location = layout.metadata_file(f"{uuid.uuid4()}-m0.avro")
        written.append(manifest_location)
        manifest = write_manifest(
            io, manifest_location, _added_entries(data_files, snapshot_id),
            spec=_specs(base)[base.get("default-spec-id", 0)], schema=_schema(base), content=DATA,
        )  # fmt: skip

        last: list[_Change] = []

        def build(version: dict[str, Any], manager: EncryptionManager | None) -> _Change:
            if check is not None:
                check(version, _changes_of(target.io(manager), manager))
            parent = _head(version, branch)
            kept = []
            if parent is not None:
                kept = [m for m in _read_manifest_list(target.io(manager), manager, parent) if _has_live_files(m)]
            change = _merge_append(target.io(manager), version, manifest, kept, data_files, snapshot_id, merged_written,
                                   layout)
            change.summary_extra.update(extra)
            change.summary_extra.update(extra_summary)
            missing = {k: v for k, v in (properties or {}).items() if k not in (version.get("properties") or {})}
            if missing:
                change.updates.append(_model.SetProperties(missing))
            last[:] = [change]
            return change

        _commit_change(
            target, base_location, base, build, snapshot_id=snapshot_id, retry=True, conflict_free=True,
            branch=branch, stage_only=stage_only, on_retry=on_retry,
        )  # fmt: skip
    except BaseException as exc:
        _discard(io or target.io(None), written + merged_written, exc)
        raise
    # manifests this commit wrote that its manifest list does not hold: the new manifest
    # when it was merged, merges of attempts that lost a race (Java's cleanUncommitted)
    referenced = {(m.record if isinstance(m, WrittenManifest) else m)["manifest_path"]
                  for m in (*last[0].new_manifests, *last[0].kept_manifests)}  # fmt: skip
    _cleanup(io, [p for p in (manifest_location, *merged_written) if p not in referenced])
    return snapshot_id


def _merge_append(
    io: TableIO,
    version: dict[str, Any],
    manifest: WrittenManifest,
    kept: list[dict[str, Any]],
    data_files: list[dict[str, Any]],
    snapshot_id: int,
    merged_written: list[str],
    layout: WriteLayout,
) -> _Change:
    """An append's change, its manifests merged as Java's MergeAppend merges them
    (``icecrypt.table.files.merge``): data and delete manifests separately."""
    from icecrypt.table.files.merge import MergeSettings, merge_manifests

    settings = MergeSettings.from_properties(version.get("properties"))
    if not settings.enabled:
        return _Change("append", [manifest], kept, added_files=data_files)
    common = dict(
        settings=settings, snapshot_id=snapshot_id, specs=_specs(version), schema=_schema(version),
        schemas=_schemas(version), read_entries=lambda record: _read_entries(io, record), io=io,
        new_location=lambda: layout.metadata_file(f"{uuid.uuid4()}-m0.avro"), written=merged_written,
    )  # fmt: skip
    data, replaced_data = merge_manifests([manifest, *(m for m in kept if m["content"] == DATA)], **common)
    deletes, replaced_deletes = merge_manifests([m for m in kept if m["content"] != DATA], **common)
    order = data + deletes
    new = [m for m in order if isinstance(m, WrittenManifest)]
    still_kept = [m for m in order if not isinstance(m, WrittenManifest)]
    return _Change(
        "append", new, still_kept, added_files=data_files, replaced_manifests=replaced_data + replaced_deletes, order=order
    )


def _check_data_files(io: TableIO, data_files: list[dict[str, Any]]) -> None:
    """Fail closed on records handed to :func:`append_files`: data content only, and in
    an encrypted table each with key metadata that carries the file's stored length."""
    for data_file in data_files:
        location = data_file.get("file_path")
        if data_file.get("content") != DATA:
            raise ValueError(f"{location}: append_files takes data files only")
        raw = data_file.get("key_metadata")
        if not io.encrypted:
            if raw is not None:
                raise ValueError(f"{location}: has key metadata, but the table is not encrypted")
            continue
        if raw is None:
            raise FormatError(f"{location}: a data file of an encrypted table must have key metadata")
        if StandardKeyMetadata.decode(raw).file_length != data_file.get("file_size_in_bytes"):
            raise FormatError(f"{location}: key metadata file_length differs from file_size_in_bytes")


def append(
    table: Any, data: Any, *, file_format: str | None = None, target_file_size: int | None = None,
    branch: str | None = None, wap_id: str | None = None,
) -> int | None:
    """Append rows (a pyarrow Table, RecordBatch, RecordBatchReader or iterable of
    batches) as a new snapshot; returns its id (the current one if ``data`` is empty).

    ``file_format``: "parquet" (default, or ``write.format.default``) or "avro";
    ``target_file_size``: bytes of Arrow data per file (``write.target-file-size-bytes``).
    ``branch`` and ``wap_id`` as for :func:`append_files`.  A concurrent commit is not
    lost: the append is re-applied on top of it.  Whatever a failed append wrote is
    deleted.
    """
    if wap_id is not None or branch is not None:
        _, base = _Target.of(table).latest()
        _write_ref(base, branch, wap_id)  # refused before any file is written
    data_files = write_files(table, data, file_format=file_format, target_file_size=target_file_size)
    return append_files(table, data_files, branch=branch, wap_id=wap_id)


def overwrite(
    table: Any, data: Any, *, file_format: str | None = None, target_file_size: int | None = None,
    branch: str | None = None,
) -> int | None:
    """Replace all rows of the table (of ``branch``, default main) with ``data`` in one
    snapshot (operation "overwrite"): every live data and delete file is marked DELETED
    and the new data files are added.  Refused with CommitConflictError if another
    commit moves the branch first.  Returns the new snapshot id (None for an empty
    table overwritten with nothing)."""
    target = _Target.of(table)
    base_location, base = target.latest()
    name, _, _ = _write_ref(base, branch, None)
    io, data_files, written, spec, schema = _write_new_data(target, base, data, file_format, target_file_size)
    return _commit_overwrite(target, base_location, base, io, data_files, written, spec, schema, branch=name)


def overwrite_files(
    table: Any, data_files: list[dict[str, Any]], *, branch: str | None = None,
    summary: Mapping[str, str] | None = None,
    check: Callable[[dict[str, Any], Callable[[Mapping[str, Any]], SnapshotChanges]], None] | None = None,
) -> int | None:
    """Commit data files written by :func:`write_files` as one overwrite snapshot that
    replaces every row of the table (of ``branch``): the distributed form of
    :func:`overwrite` (workers write, the driver commits once).  If this raises, the
    data files are deleted.  ``summary`` and ``check`` as for :func:`append_files` (an
    overwrite is never rebuilt: ``check`` sees the one version it builds on, and the
    commit is refused if the branch moves meanwhile)."""
    target = _Target.of(table)
    written = [f["file_path"] for f in data_files]
    io: TableIO | None = None
    try:
        extra_summary = _summary_properties(summary)
        base_location, base = target.latest()
        name, _, _ = _write_ref(base, branch, None)
        manager = target.manager(base)
        io = target.io(manager)
        _check_data_files(io, data_files)
        if check is not None:
            check(base, _changes_of(io, manager))
    except BaseException:
        _cleanup(io or target.io(None), written)
        raise
    spec = _specs(base)[base.get("default-spec-id", 0)]
    return _commit_overwrite(
        target, base_location, base, io, list(data_files), written, spec, _schema(base), branch=name,
        summary=extra_summary,
    )


#: summary names Iceberg's own snapshot summary uses (``_summary``): never given by a caller
_OWN_SUMMARY = ("operation", "manifests-", "added-", "deleted-", "removed-", "total-", "changed-partition-count",
                "engine-", WAP_ID, "entries-processed")


def _summary_properties(summary: Mapping[str, str] | None) -> dict[str, str]:
    """A caller's snapshot summary properties, checked: string names and values, none
    of Iceberg's own names."""
    result: dict[str, str] = {}
    for name, value in (summary or {}).items():
        if not isinstance(name, str) or not name or not isinstance(value, str):
            raise TypeError(f"summary properties are non-empty string names with string values, not {name!r}: {value!r}")
        if any(name == own or (own.endswith("-") and name.startswith(own)) for own in _OWN_SUMMARY):
            raise ValueError(f"summary property {name!r} is one of the names Iceberg's snapshot summary sets itself")
        result[name] = value
    return result


def _commit_overwrite(
    target: _Target,
    base_location: str,
    base: dict[str, Any],
    io: TableIO,
    data_files: list[dict[str, Any]],
    written: list[str],
    spec: PartitionSpec,
    schema: Schema,
    *,
    branch: str = _model.MAIN_BRANCH,
    summary: Mapping[str, str] | None = None,
) -> int | None:
    """The commit half of an overwrite on top of ``base``: ``data_files`` added, every
    live file of the branch's head snapshot marked DELETED.  Whatever ``written`` lists (the
    new data files; the manifests written here join it) is deleted if this raises."""
    layout = write_layout(target, base)
    commit_id = str(uuid.uuid4())
    snapshot_id = _new_snapshot_id(base)
    try:
        manager = target.manager(base)
        parent = _head(base, branch)
        if parent is None and not data_files:
            return None
        removed: list[dict[str, Any]] = []
        new_manifests: list[WrittenManifest] = []
        replaced = 0
        if data_files:
            manifest_location = layout.metadata_file(f"{commit_id}-m0.avro")
            written.append(manifest_location)
            new_manifests.append(write_manifest(
                io, manifest_location, _added_entries(data_files, snapshot_id), spec=spec, schema=schema, content=DATA
            ))  # fmt: skip
        if parent is not None:
            groups: dict[tuple[int, int], list[dict[str, Any]]] = {}
            for manifest in _read_manifest_list(io, manager, parent):
                if not _has_live_files(manifest):
                    continue
                replaced += 1
                content = DATA if manifest["content"] == DATA else POSITION_DELETES
                for entry in _read_entries(io, manifest):
                    if entry["status"] == DELETED:
                        continue
                    entry["status"] = DELETED
                    entry["snapshot_id"] = snapshot_id
                    groups.setdefault((content, manifest["partition_spec_id"]), []).append(entry)
                    removed.append(entry["data_file"])
            specs = _specs(base)
            for n, ((content, spec_id), entries) in enumerate(sorted(groups.items(), key=lambda kv: kv[0]), 1):
                manifest_location = layout.metadata_file(f"{commit_id}-m{n}.avro")
                written.append(manifest_location)
                new_manifests.append(write_manifest(
                    io, manifest_location, entries, spec=specs[spec_id], schema=schema, content=content,
                    schemas=_schemas(base),
                ))  # fmt: skip
        change = _Change("overwrite", new_manifests, [], data_files, removed, replaced, dict(summary or {}))
        _commit_planned(target, base_location, base, change, snapshot_id, branch)
    except BaseException as exc:
        _discard(io, written, exc)
        raise
    return snapshot_id


# --- delete -----------------------------------------------------------------------------------


def _bind_filter(row_filter: Any, schema: Schema) -> tuple[Any, Any]:
    """(PyIceberg expression, pyarrow compute expression) of a row filter given as a
    PyIceberg expression or a string such as ``"id > 10 and category = 'a'"``."""
    from pyiceberg.expressions.visitors import bind
    from pyiceberg.io.pyarrow import expression_to_pyarrow

    from icecrypt.table.read.scan import parse_row_filter

    if row_filter is None:
        raise TypeError("row_filter must be a string or a pyiceberg expression, not None")
    expression = parse_row_filter(row_filter)
    return expression, expression_to_pyarrow(bind(schema, expression, case_sensitive=True), schema)


def _filter_columns(expression: Any, schema: Schema) -> list[str]:
    from pyiceberg.expressions.visitors import bind, extract_field_ids

    names = {schema.find_column_name(i) for i in extract_field_ids(bind(schema, expression, case_sensitive=True))}
    return sorted({name.split(".")[0] for name in names if name is not None})


def _metrics_view(data_file: dict[str, Any]) -> types.SimpleNamespace:
    """A data_file record as PyIceberg's metrics evaluators read a DataFile."""

    def as_map(name: str) -> dict[int, Any]:
        return {pair["key"]: pair["value"] for pair in data_file.get(name) or ()}

    return types.SimpleNamespace(
        record_count=data_file["record_count"],
        value_counts=as_map("value_counts"),
        null_value_counts=as_map("null_value_counts"),
        nan_value_counts=as_map("nan_value_counts"),
        lower_bounds=as_map("lower_bounds"),
        upper_bounds=as_map("upper_bounds"),
    )


def _read_data_columns(io: TableIO, data_file: dict[str, Any], columns: list[str]) -> pa.Table:
    """Columns of a data file, decrypted with its key metadata (which an encrypted
    table requires)."""
    location = data_file["file_path"]
    path = io.to_fs_path(location)
    file_format = data_file["file_format"].upper()
    if io.encrypted:
        key = _file_key(io, data_file.get("key_metadata"), "data file", location, needs_length=file_format != "PARQUET")
        if key is None:
            raise FormatError(f"{location}: data file of an encrypted table has no key metadata")
        if file_format == "PARQUET":
            from icecrypt.parquet import read_table

            return read_table(path, key, filesystem=io.format_filesystem, columns=columns)
        if file_format == "AVRO":
            from icecrypt.avro import read

            return read(path, key, filesystem=io.format_filesystem, columns=columns)
    elif file_format == "PARQUET":
        import pyarrow.parquet as pq

        return pq.read_table(path, filesystem=io.filesystem, columns=columns)
    raise ValueError(f"{location}: cannot read {file_format} data files")


def _read_dv(io: TableIO, dv_file: dict[str, Any]) -> np.ndarray:
    content = io.read_bytes(dv_file["file_path"], _file_key(io, dv_file.get("key_metadata"), "delete file", dv_file["file_path"]))
    offset, length = dv_file["content_offset"], dv_file["content_size_in_bytes"]
    return decode_dv(content[offset : offset + length], name=dv_file["file_path"])


@dataclass
class _Vector:
    """A new deletion vector for one data file."""

    data_file: dict[str, Any]
    spec_id: int
    positions: np.ndarray


def delete(table: Any, row_filter: Any, *, branch: str | None = None) -> int | None:
    """Delete the rows matching ``row_filter``; returns the new snapshot id, or None when
    no row matched (nothing is committed then).

    A data file all of whose rows are deleted is dropped (its entry becomes DELETED,
    with its deletion vector).  Otherwise the positions of the matching rows, merged
    with those of the file's current deletion vector, go into a new deletion vector
    (a Puffin file in AGS1, one blob per data file) that replaces the old one.  Rows
    hidden by equality deletes count as live here (a DV on them is harmless); a table
    with v2 position-delete files is refused (ValueError).  Refused with
    CommitConflictError if another commit moves the branch first.  ``branch``: the
    branch to delete from (default main; one that does not exist starts from main's
    current snapshot and is created).
    """
    from pyiceberg.expressions.visitors import _InclusiveMetricsEvaluator, _StrictMetricsEvaluator

    target = _Target.of(table)
    base_location, base = target.latest()
    branch, _, _ = _write_ref(base, branch, None)
    parent = _head(base, branch)
    if parent is None:
        return None
    schema = _schema(base)
    expression, arrow_filter = _bind_filter(row_filter, schema)
    may_match = _InclusiveMetricsEvaluator(schema, expression).eval
    must_match = _StrictMetricsEvaluator(schema, expression).eval
    columns = _filter_columns(expression, schema)
    manager = target.manager(base)
    io = target.io(manager)
    manifests = [m for m in _read_manifest_list(io, manager, parent) if _has_live_files(m)]
    live: dict[str, list[dict[str, Any]]] = {}
    dv_of: dict[str, dict[str, Any]] = {}  # data file path -> its DV's data_file record
    for manifest in manifests:
        entries = [e for e in _read_entries(io, manifest) if e["status"] != DELETED]
        live[manifest["manifest_path"]] = entries
        for entry in entries:
            data_file = entry["data_file"]
            if data_file["content"] != POSITION_DELETES:
                continue
            if not _is_dv(data_file) or data_file.get("referenced_data_file") is None:
                raise ValueError(f"{data_file['file_path']}: v2 position-delete files are not supported by delete()")
            dv_of[data_file["referenced_data_file"]] = data_file

    dropped: set[tuple[str, int | None]] = set()
    vectors: list[_Vector] = []
    for manifest in manifests:
        if manifest["content"] != DATA:
            continue
        for entry in live[manifest["manifest_path"]]:
            data_file = entry["data_file"]
            view = _metrics_view(data_file)
            if not may_match(view):
                continue
            old = dv_of.get(data_file["file_path"])
            if not must_match(view):
                rows = _read_data_columns(io, data_file, columns)
                rows = rows.append_column("__pos", pa.array(np.arange(rows.num_rows, dtype=np.int64)))
                matched = rows.filter(arrow_filter).column("__pos").to_numpy()
                previous = _read_dv(io, old) if old is not None else np.empty(0, dtype=np.int64)
                positions = np.union1d(previous, matched)
                if positions.size == previous.size:
                    continue  # nothing new to delete in this file
                if positions.size < data_file["record_count"]:
                    vectors.append(_Vector(data_file, manifest["partition_spec_id"], positions))
                    if old is not None:
                        dropped.add(_entry_key(old))
                    continue
            dropped.add(_entry_key(data_file))
            if old is not None:
                dropped.add(_entry_key(old))
    if not dropped and not vectors:
        return None
    return _commit_delete(target, base_location, base, io, schema, manifests, live, dropped, vectors, branch)


def _dv_record(location: str, length: int, key: StandardKeyMetadata | None, vector: _Vector, placement: Any) -> dict:
    return {
        "content": POSITION_DELETES, "file_path": location, "file_format": "PUFFIN",
        "partition": vector.data_file["partition"], "record_count": placement.cardinality,
        "file_size_in_bytes": length, "column_sizes": None, "value_counts": None, "null_value_counts": None,
        "nan_value_counts": None, "lower_bounds": None, "upper_bounds": None,
        "key_metadata": key.encode() if key is not None else None, "split_offsets": None,
        "equality_ids": None, "sort_order_id": None, "first_row_id": None,
        "referenced_data_file": vector.data_file["file_path"], "content_offset": placement.offset,
        "content_size_in_bytes": placement.length,
    }  # fmt: skip


def _commit_delete(
    target: _Target,
    base_location: str,
    base: dict[str, Any],
    io: TableIO,
    schema: Schema,
    manifests: list[dict[str, Any]],
    live: dict[str, list[dict[str, Any]]],
    dropped: set[tuple[str, int | None]],
    vectors: list[_Vector],
    branch: str = _model.MAIN_BRANCH,
    operation: str = "delete",
    added: list[dict[str, Any]] | None = None,
) -> int:
    """Commit ``dropped`` (entry keys) removed and ``vectors`` added, planned on ``base``;
    ``added`` (when given) receives the new deletion vectors' records."""
    layout = write_layout(target, base)
    commit_id = str(uuid.uuid4())
    snapshot_id = _new_snapshot_id(base)
    specs = _specs(base)
    written: list[str] = []
    names = (layout.metadata_file(f"{commit_id}-m{n}.avro") for n in range(1 << 30))
    try:
        new_manifests: list[WrittenManifest] = []
        kept: list[dict[str, Any]] = []
        removed: list[dict[str, Any]] = []
        for manifest in manifests:
            entries = live[manifest["manifest_path"]]
            if not any(_entry_key(e["data_file"]) in dropped for e in entries):
                kept.append(manifest)
                continue
            rewritten = []
            for entry in entries:
                entry = dict(entry)
                if _entry_key(entry["data_file"]) in dropped:
                    entry["status"] = DELETED
                    entry["snapshot_id"] = snapshot_id
                    removed.append(entry["data_file"])
                else:
                    entry["status"] = EXISTING
                rewritten.append(entry)
            written.append(manifest_location := next(names))
            content = DATA if manifest["content"] == DATA else POSITION_DELETES
            new_manifests.append(write_manifest(
                io, manifest_location, rewritten, spec=specs[manifest["partition_spec_id"]], schema=schema,
                content=content, schemas=_schemas(base),
            ))  # fmt: skip
        added = [] if added is None else added
        if vectors:
            written.append(puffin_location := layout.data_file(f"00000-0-{commit_id}-00001.puffin"))
            content_bytes, placements = puffin_file(
                [DeletionVector(v.data_file["file_path"], v.positions) for v in vectors]
            )
            length, key = io.write_bytes(puffin_location, content_bytes)
            by_spec: dict[int, list[dict[str, Any]]] = {}
            for vector, placement in zip(vectors, placements):
                record = _dv_record(puffin_location, length, key, vector, placement)
                added.append(record)
                by_spec.setdefault(vector.spec_id, []).append(_added_entries([record], snapshot_id)[0])
            for spec_id, entries in sorted(by_spec.items()):
                written.append(manifest_location := next(names))
                new_manifests.append(write_manifest(
                    io, manifest_location, entries, spec=specs[spec_id], schema=schema, content=POSITION_DELETES,
                    schemas=_schemas(base),
                ))  # fmt: skip
        replaced = len(manifests) - len(kept)
        change = _Change(operation, new_manifests, kept, added, removed, replaced)
        _commit_planned(target, base_location, base, change, snapshot_id, branch)
    except BaseException as exc:
        _discard(io, written, exc)
        raise
    return snapshot_id


# --- expire -----------------------------------------------------------------------------------


def _referenced_files(
    io: TableIO, manager: EncryptionManager | None, snapshot: dict[str, Any], cache: dict, *, live_only: bool
) -> set[str]:
    """Every file a snapshot references: manifest list, manifests, data and delete files
    (with ``live_only``, data and delete files only if not DELETED there)."""
    found = {snapshot["manifest-list"]}
    for manifest in _read_manifest_list(io, manager, snapshot):
        path = manifest["manifest_path"]
        found.add(path)
        if path not in cache:
            cache[path] = _read_entries(io, manifest)
        for entry in cache[path]:
            if not live_only or entry["status"] != DELETED:
                found.add(entry["data_file"]["file_path"])
    return found


def expire_snapshots(table: Any, older_than_ms: int, *, retain_last: int | None = None,
                     snapshot_ids: Any = ()) -> list[int]:
    """Remove the snapshots committed before ``older_than_ms`` (ms since the epoch),
    except the current one, every branch or tag head and what the refs' retention keeps
    (``min-snapshots-to-keep``, or ``retain_last`` for a branch that sets none;
    ``max-snapshot-age-ms``; refs older than their ``max-ref-age-ms`` are removed), and
    the snapshots ``snapshot_ids`` names, as Java decides it (``retention.plan_expiry``);
    then delete the files and ``encryption-keys`` entries only they needed.  Returns the
    removed snapshot ids.

    Files are deleted after the commit, and only those no remaining snapshot lists as
    live; keys go as :func:`icecrypt.keys.manager.removable_keys` decides (a KEK stays
    while a writer may still choose it).
    """
    from icecrypt.table.commit import committer as _committer

    target = _Target.of(table)
    plan: dict[str, Any] = {}  # what the attempt that committed found

    def build(base_location: str, base: dict[str, Any]) -> _model.Change | None:
        check_unambiguous(target.store, target.filesystem, base_location, base)  # it deletes files
        # refs and their retention decide, as in Java (_retention); expired refs go too
        expired_ids, expired_refs = plan_expiry(base, older_than_ms, retain_last=retain_last,
                                                snapshot_ids=snapshot_ids)
        if not expired_ids and not expired_refs:
            return None
        manager = target.manager(base, check_kek=False)  # a metadata-only commit: wraps nothing
        io = target.io(manager)
        cache: dict[str, list[dict[str, Any]]] = {}
        still_needed: set[str] = set()
        candidates: set[str] = set()
        unread: list[tuple[str, str]] = []  # expired snapshots whose files are not the table's to list
        for snapshot in base.get("snapshots") or []:
            if snapshot["snapshot-id"] in expired_ids:
                try:
                    candidates |= _referenced_files(io, manager, snapshot, cache, live_only=False)
                except PathOutsideTableError as exc:
                    # a manifest list or manifest outside the table is never read: the
                    # snapshot still expires, and nothing it names is deleted
                    unread.append((exc.location or snapshot["manifest-list"], str(exc)))
            else:
                still_needed |= _referenced_files(io, manager, snapshot, cache, live_only=True)
        plan.update(expired_ids=expired_ids, candidates=candidates, still_needed=still_needed, unread=unread)
        updates: list[_model.TableUpdate] = [_model.RemoveSnapshotRef(name) for name in expired_refs]
        if expired_ids:
            updates.append(_model.RemoveSnapshots(tuple(sorted(expired_ids))))
        if manager is not None:
            updates += [_model.RemoveEncryptionKey(k) for k in sorted(removable_keys(base, expired_ids))]
        return _model.Change.on(base, updates, what="snapshot expiry")

    location = _committer.commit(target, build)  # retried on a newer version as it comes
    if location is None:
        return []
    deletions = Deletions(table.locations, f"expire_snapshots of {table.pin.location}")
    deletions.skipped.extend(plan["unread"])
    keep = {_same_file(table.locations, p) for p in plan["still_needed"]}
    for path in sorted(plan["candidates"] - plan["still_needed"]):
        if _same_file(table.locations, path) in keep:
            continue  # another spelling of a file a remaining snapshot needs
        try:
            deletions.location(path)
        except OSError:
            pass  # an orphan file is harmless; the commit stands
    deletions.warn()
    return ExpiredSnapshots(sorted(plan["expired_ids"]), deleted_files=deletions.deleted,
                            skipped_files=deletions.skipped_locations)


class ExpiredSnapshots(list):
    """The snapshot ids :meth:`EncryptedTable.expire_snapshots <icecrypt.table.EncryptedTable.expire_snapshots>` removed (a list, as before), with the
    files it deleted (``deleted_files``, filesystem paths) and those it did not delete
    because they are not the table's (``skipped_files``, as recorded: outside the
    table's pinned location or behind a symbolic link; a PathOutsideTableWarning
    names them too)."""

    def __init__(self, ids: Iterable[int] = (), *, deleted_files: Iterable[str] = (), skipped_files: Iterable[str] = ()):
        super().__init__(ids)
        self.deleted_files = list(deleted_files)
        self.skipped_files = list(skipped_files)


def _same_file(locations: Locations, location: str) -> str:
    """A key under which two spellings of one location compare equal."""
    try:
        return str(locations.canonical(location))
    except ValueError:
        return location


def rotate_keys(
    table: Any,
    *,
    new_kek: bool = True,
    new_master_key_id: str | None = None,
    new_kms: Any = None,
) -> dict[str, Any]:
    """Rotate an encrypted table's keys in one metadata commit (no new snapshot).

    ``new_kek``: a fresh KEK wraps the manifest-list keys of later commits (older entries
    keep theirs; they stay readable).  ``new_master_key_id``: every KEK is re-wrapped
    under that KMS master key (held by ``new_kms``, default the table's KMS) and
    ``encryption.key-id`` changes with it.  Data files and manifests are never rewritten:
    only ``encryption-keys`` and the table property change.  Returns a summary with the
    new KEK id and the ids of the re-wrapped KEKs (ids only, never key bytes).
    """
    if not new_kek and new_master_key_id is None:
        raise ValueError("nothing to rotate: pass new_kek=True and/or new_master_key_id")
    from icecrypt.table.commit import committer as _committer

    target = _Target.of(table)
    summary: dict[str, Any] = {}

    def build(base_location: str, base: dict[str, Any]) -> _committer.Staged:
        # no check of the current KEK: a rotation is how a refused one is replaced
        manager = target.manager(base, check_kek=False)
        if manager is None:
            raise ValueError(f"{base_location}: the table is not encrypted (no encryption.key-id); no keys to rotate")
        summary.clear()
        summary.update(kek_id=None, rewrapped_kek_ids=[], table_key_id=manager.table_key_id)
        # Re-wrap first: the new KEK is then created directly under the new master key.
        if new_master_key_id is not None:
            summary["rewrapped_kek_ids"] = [e.key_id for e in manager.rotate_master_key(new_master_key_id, new_kms)]
            summary["table_key_id"] = new_master_key_id
        if new_kek:
            summary["kek_id"] = manager.rotate_kek().key_id
        return _committer.Staged(
            _model.Change.on(base, _key_updates(base, manager), what="key rotation"),
            manager=manager,
            keys_whole=False,  # not checked here: installing the new version checks them
            # the explicit change of a pinned value: this object's pin follows its own rotation
            pin_change=target.pin.rotated(new_master_key_id) if new_master_key_id and target.pin else None,
            kms=new_kms,  # the new version's KEKs are read back through the new KMS
            # a catalog remembers the KEKs the rotation retired (every process refuses them)
            retired=manager.retired_kek_digests if new_kek else None,
        )

    _committer.commit(target, build)
    return summary


def _key_updates(base: dict[str, Any], manager: Any) -> list[Any]:
    """The updates that make ``base`` carry ``manager``'s keys: its ``encryption-keys``
    in its order (a new KEK first) and, when it changed, ``encryption.key-id``."""
    updates: list[Any] = [_model.SetEncryptionKeys(tuple(k.to_json() for k in manager.encryption_keys))]
    if (base.get("properties") or {}).get(ENCRYPTION_TABLE_KEY) != manager.table_key_id:
        updates.append(_model.SetProperties({ENCRYPTION_TABLE_KEY: manager.table_key_id}))
    return updates

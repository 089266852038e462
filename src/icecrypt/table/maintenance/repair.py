"""Keys dropped by a writer that does not know encryption: detection and ``repair_keys``.

A writer whose model of ``metadata.json`` has no ``encryption-keys`` and no snapshot
``key-id`` (PyIceberg's, for one) rewrites the whole document on every commit, so a
metadata-only change (a property, a schema column) leaves every snapshot of an
encrypted table without the key of its manifest list.  The data is all still there,
and so are the keys: each earlier metadata file, listed in the new one's
``metadata-log``, holds them.

**Detection** (:func:`check_keys`, run whenever an encrypted table is loaded or
refreshed) looks only at the document it was given, unless something is lost:

* a snapshot whose ``key-id`` names no ``encryption-keys`` entry, or whose entry's KEK
  (its ``encrypted-by-id``) is not in the list: lost, decided from the document alone;
* a snapshot without ``key-id``: lost when its manifest list is an AGS1 stream (its
  first four bytes are ``AGS1``), since such a file cannot be read without the key a
  ``key-id`` names.  A plaintext manifest list (Avro's ``Obj\\x01``) is a snapshot
  written before encryption was enabled and is not flagged.  This costs one 4-byte
  read per key-less snapshot (remembered by the table object), none for tables whose
  snapshots all carry keys.

Only once something is lost are the files of the ``metadata-log`` read, newest first,
to name the commit that dropped the keys: the first file after the newest one that
still held them (the current file if that was the newest log entry).

**Repair** (:meth:`EncryptedTable.repair_keys <icecrypt.table.EncryptedTable.repair_keys>`) takes every lost ``key-id`` and ``encryption-keys``
entry from the previous metadata files, refusing when two files disagree (two key ids
for one snapshot, two different entries under one id) or none holds it, unwraps each
recovered manifest-list key through the KMS and reads the manifest list with it (the
AGS1 tags authenticate the key), and commits the current document with the keys put
back as a new version.  Everything else stays as the current metadata has it, so the
other writer's change (its properties, its schema) is kept.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
from collections.abc import Iterator, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

from icecrypt.errors import (
    CommitConflictError,
    DecryptionError,
    EncryptionKeyNotFoundError,
    FormatError,
    KeysLostError,
    KmsInvalidWrappedKeyError,
    RepairError,
)
from icecrypt.keys.manager import ENCRYPTION_TABLE_KEY

if TYPE_CHECKING:
    from icecrypt.table.files.io import Locations
    from icecrypt.table.commit.state import TableView

__all__ = ["LostKey", "RepairReport", "check_keys", "find_lost_keys", "repair_keys"]

_AGS1_MAGIC = b"AGS1"
_HOW_TO_REPAIR = (
    "run EncryptedTable.repair_keys() or `icecrypt table repair TABLE` to restore them from the metadata log"
)


@dataclasses.dataclass(frozen=True)
class LostKey:
    """One snapshot whose key chain the metadata lost.

    ``reason``: ``"no-key-id"`` (no ``key-id``, encrypted manifest list),
    ``"no-entry"`` (its ``key-id`` names no ``encryption-keys`` entry) or ``"no-kek"``
    (the entry's KEK ``kek_id`` is not in the list)."""

    snapshot_id: int
    manifest_list: str
    reason: str
    key_id: str | None = None
    kek_id: str | None = None

    def describe(self) -> str:
        if self.reason == "no-key-id":
            return f"snapshot {self.snapshot_id} has no key-id but its manifest list is encrypted (AGS1)"
        if self.reason == "no-entry":
            return f"snapshot {self.snapshot_id}: key-id {self.key_id!r} names no encryption-keys entry"
        return f"snapshot {self.snapshot_id}: the KEK {self.kek_id!r} of key {self.key_id!r} is not in encryption-keys"


# --- detection ------------------------------------------------------------------------------


def _entries(metadata: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """``key-id -> entry`` of a document's ``encryption-keys`` (first one wins; malformed
    entries are left to the key manager to refuse)."""
    result: dict[str, Mapping[str, Any]] = {}
    entries = metadata.get("encryption-keys")
    if isinstance(entries, list):
        for entry in entries:
            if isinstance(entry, Mapping) and isinstance(entry.get("key-id"), str):
                result.setdefault(entry["key-id"], entry)
    return result


def _snapshots(metadata: Mapping[str, Any]) -> dict[int, Mapping[str, Any]]:
    result: dict[int, Mapping[str, Any]] = {}
    snapshots = metadata.get("snapshots")
    if isinstance(snapshots, list):
        for raw in snapshots:
            if isinstance(raw, Mapping) and isinstance(raw.get("snapshot-id"), int):
                result[raw["snapshot-id"]] = raw
    return result


def _is_ags1(locations: Locations, location: str, cache: MutableMapping[str, bool] | None) -> bool:
    """Whether the file at ``location`` starts with the AGS1 magic.  A file that cannot
    be read counts as not known to be encrypted (reading the snapshot fails anyway)."""
    from icecrypt.table.files.io import _magic

    if cache is not None and location in cache:
        return cache[location]
    try:
        path = locations.to_fs_path(location)
    except ValueError:
        return False
    magic = _magic(locations.filesystem, path)
    if magic and cache is not None:
        cache[location] = magic == _AGS1_MAGIC
    return magic == _AGS1_MAGIC


def find_lost_keys(
    metadata: Mapping[str, Any], locations: Locations, *, cache: MutableMapping[str, bool] | None = None
) -> list[LostKey]:
    """The snapshots of an encrypted table's ``metadata`` whose key chain is lost (see
    the module docstring for the rule); empty for plaintext tables.  No KMS call; file
    reads only for key-less snapshots (4 bytes each, remembered in ``cache``)."""
    table_key = (metadata.get("properties") or {}).get(ENCRYPTION_TABLE_KEY)
    if not table_key:
        return []
    entries = _entries(metadata)
    lost = []
    for snapshot_id, raw in _snapshots(metadata).items():
        key_id = raw.get("key-id")
        manifest_list = raw.get("manifest-list")
        if key_id is None:
            if isinstance(manifest_list, str) and _is_ags1(locations, manifest_list, cache):
                lost.append(LostKey(snapshot_id, manifest_list, "no-key-id"))
            continue
        entry = entries.get(key_id)
        if entry is None:
            lost.append(LostKey(snapshot_id, manifest_list, "no-entry", key_id))
            continue
        kek_id = entry.get("encrypted-by-id")
        if isinstance(kek_id, str) and kek_id != table_key and kek_id not in entries:
            lost.append(LostKey(snapshot_id, manifest_list, "no-kek", key_id, kek_id))
    return lost


class _History:
    """The metadata files of a table's ``metadata-log``, newest first, each read (once)
    when first needed.  A recorded location is looked for where it says and, failing
    that, by name beside the current metadata file (a table that moved)."""

    def __init__(self, metadata: Mapping[str, Any], metadata_location: str, locations: Locations):
        self.metadata_location = metadata_location
        self.locations = locations
        log = metadata.get("metadata-log")
        self.recorded = [
            e["metadata-file"] for e in (log if isinstance(log, list) else ())
            if isinstance(e, Mapping) and isinstance(e.get("metadata-file"), str)
        ][::-1]  # fmt: skip
        self._docs: dict[str, Mapping[str, Any] | None] = {}
        self.unreadable: dict[str, str] = {}  # recorded location -> why

    def _read(self, recorded: str) -> Mapping[str, Any] | None:
        from icecrypt.table.files.metadata import read_metadata_file

        if recorded in self._docs:
            return self._docs[recorded]
        candidates = []
        try:
            candidates.append(self.locations.to_fs_path(recorded))
        except ValueError:
            pass
        beside = posixpath.join(posixpath.dirname(self.metadata_location), posixpath.basename(recorded))
        if beside not in candidates:
            candidates.append(beside)
        doc, why = None, "not found"
        for path in candidates:
            try:
                doc = read_metadata_file(self.locations.filesystem, path)
                break
            except FileNotFoundError:
                continue
            except (OSError, FormatError) as exc:
                why = str(exc)
        if doc is None:
            self.unreadable[recorded] = why
        self._docs[recorded] = doc
        return doc

    def __iter__(self) -> Iterator[tuple[str, Mapping[str, Any]]]:
        """``(recorded location, document)`` newest first, skipping unreadable files."""
        for recorded in self.recorded:
            doc = self._read(recorded)
            if doc is not None:
                yield recorded, doc


def _chain_intact(doc: Mapping[str, Any], snapshot_id: int) -> bool:
    """Whether ``doc`` has snapshot ``snapshot_id`` with its whole key chain."""
    raw = _snapshots(doc).get(snapshot_id)
    if raw is None or not isinstance(raw.get("key-id"), str):
        return False
    entries = _entries(doc)
    entry = entries.get(raw["key-id"])
    if entry is None:
        return False
    kek_id = entry.get("encrypted-by-id")
    table_key = (doc.get("properties") or {}).get(ENCRYPTION_TABLE_KEY)
    return isinstance(kek_id, str) and (kek_id in entries or kek_id == table_key)


def _dropped_by(history: _History, snapshot_id: int) -> tuple[str | None, str | None]:
    """``(the file that dropped the snapshot's keys, the newest file that held them)``:
    walking the log newest first, the file after the newest one holding the whole
    chain (the current file when that is the newest log entry)."""
    newer = history.metadata_location
    for recorded, doc in history:
        if _chain_intact(doc, snapshot_id):
            return newer, recorded
        if snapshot_id not in _snapshots(doc):
            break  # the snapshot is younger than this file: no older file has it
        newer = recorded
    return None, None


def check_keys(
    metadata: Mapping[str, Any],
    metadata_location: str,
    locations: Locations,
    *,
    cache: MutableMapping[str, bool] | None = None,
) -> None:
    """Raise :class:`~icecrypt.errors.KeysLostError` when ``metadata`` (read from
    ``metadata_location``) lost keys its snapshots need; return None otherwise.

    Nothing beyond the document is read unless a snapshot lacks ``key-id`` (see the
    module docstring); the ``metadata-log`` files are read only once keys are lost."""
    lost = find_lost_keys(metadata, locations, cache=cache)
    if not lost:
        return
    history = _History(metadata, metadata_location, locations)
    droppers: dict[str, list[int]] = {}
    held: dict[str, str] = {}
    unknown = []
    for item in lost:
        dropper, holder = _dropped_by(history, item.snapshot_id)
        if dropper is None:
            unknown.append(item.snapshot_id)
        else:
            droppers.setdefault(dropper, []).append(item.snapshot_id)
            held[dropper] = holder or ""
    ids = [item.snapshot_id for item in lost]
    shown = "; ".join(item.describe() for item in lost[:5]) + ("; ..." if len(lost) > 5 else "")
    # the first file in log order (the oldest) that lacks them: the commit that dropped them
    order = {recorded: index for index, recorded in enumerate(history.recorded)}
    first = max(droppers, key=lambda f: order.get(f, -1)) if droppers else None
    parts = [f"{metadata_location}: encryption keys lost for {len(lost)} snapshot(s) ({shown})"]
    if first is not None:
        parts.append(
            f"they were dropped by the commit that wrote {first} (the first metadata file in the "
            f"metadata-log without them; {held[first]} still holds them), probably a writer that does "
            "not know Iceberg encryption"
        )
        if len(droppers) > 1:
            parts.append(f"other snapshots lost theirs in {', '.join(sorted(set(droppers) - {first}))}")
    if unknown:
        parts.append(
            f"no metadata file in the metadata-log holds the keys of snapshot(s) "
            f"{', '.join(map(str, unknown[:5]))}{', ...' if len(unknown) > 5 else ''}"
        )
    if droppers:
        parts.append(_HOW_TO_REPAIR)
    else:
        parts.append(
            "they cannot be restored from the metadata log; EncryptedTable.load(..., check_keys=False) opens "
            "the table to read what is left (`icecrypt table verify` lists what is lost)"
        )
    raise KeysLostError(
        "; ".join(parts), metadata_location=metadata_location, snapshot_ids=tuple(ids), dropped_by=first
    )


# --- repair ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RepairReport:
    """What :meth:`EncryptedTable.repair_keys <icecrypt.table.EncryptedTable.repair_keys>` restored (ids and file names, never key bytes).

    ``restored_key_ids``: snapshot id -> the ``key-id`` put back; ``restored_entries``:
    ``encryption-keys`` id -> the metadata file it was taken from; ``dropped_by``: the
    commit that dropped them; ``committed_location``: the new metadata file (None for a
    dry run or when nothing was lost)."""

    metadata_location: str
    restored_key_ids: dict[int, str]
    restored_entries: dict[str, str]
    dropped_by: str | None = None
    dry_run: bool = False
    committed_location: str | None = None

    @property
    def changed(self) -> bool:
        """Whether anything was (or, in a dry run, would be) restored."""
        return bool(self.restored_key_ids or self.restored_entries)

    def __str__(self) -> str:
        if not self.changed:
            return f"{self.metadata_location}: no keys lost, nothing to repair"
        lines = [
            f"snapshot {sid}: key-id {key_id} restored" for sid, key_id in sorted(self.restored_key_ids.items())
        ] + [f"encryption key {key_id}: restored from {source}" for key_id, source in self.restored_entries.items()]
        if self.dropped_by:
            lines.append(f"dropped by {self.dropped_by}")
        if self.dry_run:
            lines.append(f"dry run: nothing committed ({self.metadata_location} unchanged)")
        else:
            lines.append(f"committed {self.committed_location}")
        return "\n".join(lines)


def _canonical(entry: Mapping[str, Any]) -> str:
    return json.dumps(entry, sort_keys=True, separators=(",", ":"))


def _recover_entry(
    key_id: str,
    current: Mapping[str, Mapping[str, Any]],
    history: _History,
    what: str,
    *,
    wrapped_by: str | None = None,
) -> tuple[Mapping[str, Any], str | None]:
    """The ``encryption-keys`` entry ``key_id``: ``(entry, source)``, source None when
    the current document has it (then it is used as is).  Otherwise every previous file
    holding the id must hold the same entry.  ``wrapped_by`` (for KEKs: the current
    table key) considers only versions wrapped by that key: a master-key rotation
    re-wraps a KEK under the same id, and older files keep the old wrapping."""
    if key_id in current:
        return current[key_id], None
    versions: dict[str, tuple[Mapping[str, Any], list[str]]] = {}
    others: list[str] = []
    for recorded, doc in history:
        entry = _entries(doc).get(key_id)
        if entry is None:
            continue
        if wrapped_by is not None and entry.get("encrypted-by-id") != wrapped_by:
            others.append(f"{recorded} (wrapped by {entry.get('encrypted-by-id')!r})")
            continue
        versions.setdefault(_canonical(entry), (entry, []))[1].append(recorded)
    if not versions:
        extra = f"; found only {', '.join(others[:3])}, not wrapped by {wrapped_by!r}" if others else ""
        raise RepairError(
            f"{history.metadata_location}: {what} {key_id!r} is in no metadata file of the metadata-log "
            f"({len(history.recorded)} file(s) listed{_unreadable(history)}{extra}); it cannot be restored"
        )
    if len(versions) > 1:
        where = " vs ".join(files[0] for _, files in versions.values())
        raise RepairError(
            f"{history.metadata_location}: ambiguous: previous metadata files hold different encryption-keys "
            f"entries under id {key_id!r} ({where}); refusing to choose"
        )
    entry, files = next(iter(versions.values()))
    return entry, files[0]


def _unreadable(history: _History) -> str:
    if not history.unreadable:
        return ""
    return f", {len(history.unreadable)} unreadable: {', '.join(list(history.unreadable)[:3])}"


def _recover_key_id(snapshot_id: int, history: _History) -> str:
    found: dict[str, list[str]] = {}
    for recorded, doc in history:
        raw = _snapshots(doc).get(snapshot_id)
        if raw is not None and isinstance(raw.get("key-id"), str):
            found.setdefault(raw["key-id"], []).append(recorded)
    if not found:
        raise RepairError(
            f"{history.metadata_location}: no metadata file of the metadata-log records a key-id for snapshot "
            f"{snapshot_id} ({len(history.recorded)} file(s) listed{_unreadable(history)}); it cannot be restored"
        )
    if len(found) > 1:
        shown = "; ".join(f"{key_id!r} in {files[0]}" for key_id, files in found.items())
        raise RepairError(
            f"{history.metadata_location}: ambiguous: previous metadata files disagree about the key-id of "
            f"snapshot {snapshot_id} ({shown}); refusing to choose"
        )
    return next(iter(found))


def _authenticate(table: TableView, location: str, metadata: dict[str, Any], restored: list[LostKey]) -> Any:
    """Unwrap each restored snapshot's manifest-list key through the KMS and read its
    manifest list with it (the AGS1 tags authenticate the recovered key); returns the
    encryption manager of ``metadata``."""
    from icecrypt.keys import EncryptionManager
    from icecrypt.table.files.manifest import read_manifest_list

    try:
        manager = EncryptionManager.from_table_metadata(table.kms, metadata)
    except (ValueError, TypeError) as exc:  # FormatError is a ValueError
        raise RepairError(f"{location}: the restored encryption-keys are not usable: {exc}") from None
    manager.share_kek_cache(table.encryption_manager)
    snapshots = _snapshots(metadata)
    for item in restored:
        key_id = snapshots[item.snapshot_id]["key-id"]
        try:
            km = manager.unwrap_manifest_list_key_metadata(key_id)
            if km.file_length is None:
                raise FormatError("key metadata without file_length")
            read_manifest_list(item.manifest_list, table.locations, km, encrypted=True)
        except (DecryptionError, EncryptionKeyNotFoundError, KmsInvalidWrappedKeyError, OSError) as exc:
            raise RepairError(
                f"{location}: the recovered key {key_id!r} of snapshot {item.snapshot_id} does not "
                f"authenticate its manifest list {item.manifest_list} ({type(exc).__name__}: {exc}); nothing committed"
            ) from None
    return manager


def _ordered_additions(added: Mapping[str, Any], history: _History) -> list[str]:
    """Ids of the entries to add, in the order the newest files holding them list them
    (Java's writers take the first unexpired KEK in list order)."""
    order: list[str] = []
    for _, doc in history:
        for key_id in _entries(doc):
            if key_id in added and key_id not in order:
                order.append(key_id)
        if len(order) == len(added):
            break
    return order + [key_id for key_id in added if key_id not in order]


def _commit(table: TableView, base_location: str, base: dict[str, Any], updates: list[Any], manager: Any) -> str:
    """Commit ``updates`` on the damaged version ``base_location`` (``base``) through the
    one committer; returns the new metadata file.

    Built once, on that version only (no retry): a repair that lost a race refuses
    rather than re-plan on a version it did not check.  A path table's next version
    follows the newest ``v<N>`` in the base's log when the base is named otherwise
    (``store.next_version``); a catalog table swaps from the base."""
    from icecrypt.table.commit import committer as _committer
    from icecrypt.table.commit.target import _Target
    from icecrypt.table.model import changes as _model

    target = _Target.of(table)

    def build(location: str, version: dict[str, Any]) -> Any:
        _check_newest(target, location)
        return _committer.Staged(
            _model.Change.on(version, updates, what="key repair"),
            manager=manager,
            keys_whole=False,  # never the base's (damaged) keys; the new version is checked on install
        )

    try:
        location = _committer.commit(
            target, build, first_base=(base_location, base), policy=_committer.RetryPolicy(num_retries=0)
        )
    except CommitConflictError as exc:
        raise CommitConflictError(
            f"{base_location}: another commit landed while the keys were being restored; "
            "load the table again and repeat the repair"
        ) from exc
    assert location is not None
    return location


def _check_newest(target: Any, base_location: str) -> None:
    """Refuse (RepairError) to commit a repair of ``base_location`` when a newer version
    exists (one that follows it: repair that one; or one beside it that does not)."""
    from icecrypt.errors import TableVersionError

    try:
        newest = target.current_location()
    except TableVersionError as exc:
        others = [p for p in exc.metadata_locations if p != base_location]
        raise RepairError(
            f"{base_location}: a newer version {', '.join(others)} exists that does not follow it (it is not in its "
            "metadata-log); load the newest version and repair that"
        ) from None
    if newest != base_location:
        raise RepairError(f"{base_location}: a newer version {newest} follows it; load the newest version and repair that")


def _check_pinned(table: TableView, base_location: str, base: dict[str, Any]) -> None:
    """Refuse (TableIdentityError) to repair a version, or to commit beside a newer one,
    that differs from the table object's pin (encryption removed, key id or UUID changed)."""
    from icecrypt.errors import TableVersionError
    from icecrypt.table.commit.target import _Target
    from icecrypt.table.files.metadata import read_metadata_file

    target = _Target.of(table)
    target.check_pin(base_location, base)
    try:
        newest = target.current_location()
    except TableVersionError:
        return  # a fork: the commit refuses it (_check_newest)
    if newest != base_location:
        target.check_pin(newest, read_metadata_file(table.filesystem, newest))


def repair_keys(table: TableView, *, dry_run: bool = False) -> RepairReport:
    """Restore the keys the table's current metadata lost from the previous metadata
    files and commit the result as a new version (see the module docstring).

    ``dry_run``: find and authenticate everything, commit nothing.  Raises
    :class:`~icecrypt.errors.RepairError` (nothing committed) when anything is
    ambiguous, missing or does not authenticate."""
    from icecrypt.keys.encrypted_key import EncryptedKey
    from icecrypt.table.model import changes as _model

    base_location, base = table.metadata_location, table.metadata
    store = getattr(table, "metadata_store", None)
    if store is not None:
        # a catalog table: repair the catalog's current version, which this object may
        # not hold (loading or refreshing it raised KeysLostError)
        pointer = store.current()
        if pointer != base_location:
            from icecrypt.table.files.metadata import read_metadata_file

            base_location, base = pointer, read_metadata_file(table.filesystem, pointer)
    _check_pinned(table, base_location, base)
    lost = find_lost_keys(base, table.locations, cache=getattr(table, "_repair_cache", None))
    if not lost:
        return RepairReport(base_location, {}, {}, dry_run=dry_run)
    if table.kms is None:
        raise RepairError(f"{base_location}: restoring keys needs the table's KMS (to authenticate them)")
    history = _History(base, base_location, table.locations)
    current = _entries(base)
    restored_ids: dict[int, str] = {}
    added: dict[str, tuple[Mapping[str, Any], str]] = {}
    dropper = None
    for item in lost:
        key_id = item.key_id
        if key_id is None:
            key_id = _recover_key_id(item.snapshot_id, history)
            restored_ids[item.snapshot_id] = key_id
        entry, source = _recover_entry(key_id, current, history, "the manifest-list key")
        if source is not None:
            added[key_id] = (entry, source)
        kek_id = entry.get("encrypted-by-id")
        if not isinstance(kek_id, str):
            raise RepairError(f"{base_location}: encryption key {key_id!r} names no KEK (encrypted-by-id)")
        table_key = (base.get("properties") or {}).get(ENCRYPTION_TABLE_KEY)
        if kek_id != table_key:
            kek, kek_source = _recover_entry(kek_id, current, history, "the KEK", wrapped_by=table_key)
            if kek_source is not None:
                added[kek_id] = (kek, kek_source)
        dropper = dropper or _dropped_by(history, item.snapshot_id)[0]
    try:
        keys = [EncryptedKey.from_json(entry) for entry in current.values()]
        keys += [EncryptedKey.from_json(added[key_id][0]) for key_id in _ordered_additions(added, history)]
    except (ValueError, TypeError) as exc:
        raise RepairError(f"{base_location}: a recovered encryption-keys entry is malformed: {exc}") from None
    updates = [_model.SetEncryptionKeys(tuple(key.to_json() for key in keys))]
    if restored_ids:
        updates.append(_model.RestoreSnapshotKeyIds(restored_ids))
    metadata = _model.apply(base, updates)  # what the commit holds (bar its log and time)
    still = find_lost_keys(metadata, table.locations, cache=getattr(table, "_repair_cache", None))
    if still:
        raise RepairError(f"{base_location}: keys still missing after the repair: {still[0].describe()}")
    manager = _authenticate(table, base_location, metadata, lost)
    report = RepairReport(
        base_location, restored_ids, {key_id: source for key_id, (_, source) in added.items()}, dropper, dry_run
    )
    if dry_run:
        return report
    location = _commit(table, base_location, base, updates, manager)
    return dataclasses.replace(report, committed_location=location)

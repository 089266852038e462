"""Turn a plaintext Iceberg table into an encrypted one (:func:`encrypt_table`), and back
(:func:`decrypt_table`).

The source may be any Iceberg table of format v1, v2 or v3 (written by Java, Spark,
PyIceberg or icecrypt).  Its current snapshot's live rows -- every delete applied:
position-delete files, deletion vectors, equality deletes -- are read and written again
as new data files under fresh keys, with one new manifest and manifest list, and
committed as one new version that also upgrades the table to format v3 and sets (or, to
decrypt, removes) ``encryption.key-id``.  The snapshots of the old kind are removed from
that version: an encrypted table never reads a plaintext manifest list, so nothing
plaintext is reachable from it.  Schemas, partition specs, sort orders, properties and
the table UUID stay; rows keep their row ids (v3 sources) or get the ids an upgrade to
v3 gives them (``first_row_id`` assigned from 0 over the data files in manifest-list
order, ``_last_updated_sequence_number`` the file's data sequence number).

In place, the commit goes through the one committer as table updates on the source
version (``upgrade-format-version``, ``set-properties`` / ``remove-properties``,
``add-snapshot``, ``set-snapshot-ref``, ``remove-snapshots``, ``set-encryption-keys``,
and with the expiry ``reset-metadata-log``), built once: a concurrent commit refuses
the conversion.  It is the one commit that changes what a table object pins
(``TablePin``: encrypted or not): the object's pin, and a catalog's record
(``icecrypt.table-key-id``, in the same transaction as the metadata swap), follow it
explicitly (``Staged.pin_change``).  Branches and tags other than ``main`` are not
converted: refused, or dropped on request (``drop_refs=True``, with a warning).

Restartable: the files of one conversion of one table version are named after a run id
derived from that version, so a rerun after a killed run first deletes what the killed
run left; a run that fails with an exception deletes what it wrote before the error
propagates (unless its commit landed, or may have).  The source stays at its old version
until the one commit lands.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import posixpath
import secrets
import uuid
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from icecrypt.errors import CommitConflictError, KmsError
from icecrypt.keys import EncryptionManager
from icecrypt.keys.manager import ENCRYPTION_DEK_LENGTH, ENCRYPTION_TABLE_KEY, validate_table_properties
from icecrypt.table.commit import authenticity as _authenticity
from icecrypt.table.commit import store as _commit
from icecrypt.table.commit.housekeeping import METADATA_FILE_SUFFIXES, delete_logged_metadata_files
from icecrypt.table.model import changes as _model
from icecrypt.table.ops import write as w
from icecrypt.table.files.io import Deletions, Locations
from icecrypt.table.files.layout import WriteLayout
from icecrypt.table.files.manifest import read_manifest
from icecrypt.table.files.manifest_write import ADDED, DATA, write_manifest, write_manifest_list
from icecrypt.table.model.metadata_columns import LAST_UPDATED_SEQUENCE_NUMBER, ROW_ID, ROW_POSITION, lineage_columns
from icecrypt.table.commit.pin import TablePin
from icecrypt.table.files.read import read_task
from icecrypt.table.files.write_data import DataWriteOptions, write_data_files
from icecrypt.table.files.write_io import TableIO

__all__ = ["ConvertTableResult", "decrypt_table", "encrypt_table"]

#: snapshot summary property naming the version a conversion started from
CONVERTED_FROM = "icecrypt.converted-from"
CONVERSION = "icecrypt.conversion"  # "encrypt" or "decrypt"
#: properties that point into the source table's storage: dropped for a new table
_SOURCE_PATHS = ("write.data.path", "write.metadata.path", "write.object-storage.path", "write.folder-storage.path")
_ENCRYPTION_PROPERTIES = (ENCRYPTION_TABLE_KEY, ENCRYPTION_DEK_LENGTH)


@dataclasses.dataclass
class ConvertTableResult:
    """What :func:`encrypt_table` / :func:`decrypt_table` did (ids and paths, never keys)."""

    #: the converted table, loaded (the source object itself when converted in place)
    table: Any
    #: the new snapshot (None for a table without snapshots)
    snapshot_id: int | None
    metadata_location: str
    in_place: bool
    rewritten_data_files: int = 0
    rewritten_delete_files: int = 0
    added_data_files: int = 0
    records: int = 0
    #: snapshots of the old kind removed from the new version
    removed_snapshot_ids: list[int] = dataclasses.field(default_factory=list)
    #: refs (other than main) that pointed at them and were dropped (``drop_refs=True``)
    dropped_refs: list[str] = dataclasses.field(default_factory=list)
    #: files of the old kind deleted (``expire_plaintext`` / ``expire_encrypted``)
    deleted_files: list[str] = dataclasses.field(default_factory=list)
    #: files not deleted because they are not the table's (outside its roots, links)
    skipped_files: list[str] = dataclasses.field(default_factory=list)
    #: nothing was left to do: the table already was the result of this conversion
    already_done: bool = False


# --- entry points ------------------------------------------------------------------------------


def encrypt_table(
    source: Any,
    *,
    kms: Any,
    table_key_id: str,
    target: str | None = None,
    expire_plaintext: bool = False,
    drop_refs: bool = False,
    data_key_length: int | None = None,
    filesystem: pafs.FileSystem | None = None,
    location_map: Mapping[str, str] | None = None,
    target_file_size: int | None = None,
) -> ConvertTableResult:
    """Encrypt a plaintext Iceberg table (format v1, v2 or v3) under the KMS master key
    ``table_key_id`` held by ``kms``.

    ``source``: an :class:`~icecrypt.table.EncryptedTable` (a path table or a catalog's)
    or a table location / metadata file (loaded with ``filesystem`` and ``location_map``).
    ``target`` None converts in place: the next version of the table is encrypted, the
    plaintext snapshots are no longer in it, and with ``expire_plaintext=True`` their
    files and the older (plaintext) metadata files are deleted.  With ``target`` (a new
    table location on the same filesystem) a new path table is created there and the
    source is left untouched.  Refs other than ``main`` (branches, tags) point at
    plaintext snapshots, which are not converted: refused unless ``drop_refs=True``,
    which drops them (a UserWarning and ``ConvertTableResult.dropped_refs`` name them).  ``data_key_length``: ``encryption.data-key-length``
    (16, 24 or 32; default the table's property or 16).

    Refused (nothing written): an encrypted source (ValueError), a master key the KMS
    cannot use (the KMS's error), a ``target`` that holds a table (FileExistsError), a
    concurrent commit to the source (CommitConflictError; run it again).  Rerunning
    after an interruption finishes the conversion."""
    if not table_key_id:
        raise ValueError("encrypt_table needs table_key_id (the KMS master key)")
    return _convert(source, encrypt=True, kms=kms, table_key_id=str(table_key_id), target=target,
                    expire=expire_plaintext, drop_refs=drop_refs, data_key_length=data_key_length,
                    filesystem=filesystem, location_map=location_map, target_file_size=target_file_size)  # fmt: skip


def decrypt_table(
    source: Any,
    *,
    kms: Any,
    target: str | None = None,
    expire_encrypted: bool = False,
    drop_refs: bool = False,
    filesystem: pafs.FileSystem | None = None,
    location_map: Mapping[str, str] | None = None,
    target_file_size: int | None = None,
) -> ConvertTableResult:
    """Decrypt an encrypted table into a plaintext format-v3 table any engine reads
    (for leaving icecrypt): the opposite of :func:`encrypt_table`, with the same modes.
    In place (``target`` None) is for path tables only: a catalog keeps the table's key
    id pinned, so decrypt a catalog table into a new ``target`` location.  Afterwards no
    key is needed to read the result; the source's keys remain needed for its old
    versions until ``expire_encrypted=True`` removes them."""
    return _convert(source, encrypt=False, kms=kms, table_key_id=None, target=target, expire=expire_encrypted,
                    drop_refs=drop_refs, data_key_length=None, filesystem=filesystem, location_map=location_map,
                    target_file_size=target_file_size)  # fmt: skip


# --- the conversion ----------------------------------------------------------------------------


def _open(source: Any, kms: Any, filesystem: Any, location_map: Any) -> Any:
    from icecrypt.table._table import EncryptedTable

    if isinstance(source, EncryptedTable):
        return source.refresh()
    return EncryptedTable.load(source, kms=kms, filesystem=filesystem, location_map=location_map)


def _run_id(kind: str, base: Mapping[str, Any], base_location: str, target: str | None) -> str:
    """The name of one conversion of one table version: a rerun after an interruption
    gets the same one (and so finds what the interrupted run left)."""
    seed = "\0".join((kind, str(base.get("table-uuid")), posixpath.basename(base_location), str(target)))
    return f"{kind}-{hashlib.sha256(seed.encode()).hexdigest()[:16]}"


def _marker(base: Mapping[str, Any], base_location: str) -> str:
    return f"{base.get('table-uuid')}@{posixpath.basename(base_location)}"


def _convert(
    source: Any, *, encrypt: bool, kms: Any, table_key_id: str | None, target: str | None, expire: bool,
    drop_refs: bool, data_key_length: int | None, filesystem: Any, location_map: Any, target_file_size: int | None,
) -> ConvertTableResult:
    table = _open(source, kms, filesystem, location_map)
    kind = "encrypt" if encrypt else "decrypt"
    base_location, base = table.metadata_location, table.metadata
    if table.encrypted == encrypt:
        done = _finished(table, kind, expire, target)
        if done is not None:
            return done
        state = "encrypted" if table.encrypted else "not encrypted"
        raise ValueError(f"{base_location}: the table is already {state}; nothing to {kind}")
    if target is None and not encrypt and table.metadata_store is not None:
        raise ValueError(f"{base_location}: a catalog table is decrypted into a new table (target=...): its catalog "
                         "pins the table's key id")
    refs = {name: ref for name, ref in (base.get("refs") or {}).items() if name != _model.MAIN_BRANCH}
    if refs and not drop_refs:
        raise ValueError(f"{base_location}: the table has refs other than main ({', '.join(sorted(refs))}) that point "
                         f"at snapshots the {kind}ion does not convert; pass drop_refs=True to drop them")
    manager = None
    if encrypt:
        properties = dict(base.get("properties") or {})
        if data_key_length is not None:
            properties[ENCRYPTION_DEK_LENGTH] = str(data_key_length)
        properties[ENCRYPTION_TABLE_KEY] = table_key_id
        _, length = validate_table_properties(properties, 3)
        try:  # an unknown or unusable master key fails here, before anything is written
            kms.unwrap_key(kms.wrap_key(secrets.token_bytes(length), table_key_id), table_key_id)
        except KmsError as exc:
            raise type(exc)(f"encrypt_table: KMS master key {table_key_id!r} cannot be used: {exc}",
                            backend=exc.backend) from exc  # fmt: skip
    # where the new version goes
    if target is None:
        fs, locations, to_fs_path = table.filesystem, table.locations, table.fs_path
        recorded = base["location"].rstrip("/")
    else:
        fs, fs_dir, recorded = w._resolve_location(target, table.filesystem)
        # the new table's files go under its location only (and are deleted only there)
        locations = Locations(fs, {recorded: fs_dir} if recorded != fs_dir else None).confined((recorded,))
        to_fs_path = locations.to_fs_path
        found = _existing_target(fs, to_fs_path, recorded)
        if found is not None:
            done = _target_done(found, fs, locations, kms, _marker(base, base_location), table_key_id)
            if done is not None:
                return done
            raise FileExistsError(f"{target}: a table exists there ({found}); refused, nothing written")
    run = _run_id(kind, base, base_location, target)
    kind_updates = _kind_updates(encrypt=encrypt, table_key_id=table_key_id, data_key_length=data_key_length)
    new_base, row_ids = _upgraded(table, base, kind_updates, target=recorded if target else None)
    if encrypt:
        manager = EncryptionManager.from_table_metadata(kms, new_base)
    io = TableIO(fs, to_fs_path, manager)
    # in place: the table's pinned roots and layout; a new table: its own location
    layout = (w.write_layout(w._Target.of(table), new_base) if target is None
              else WriteLayout.of(recorded, new_base.get("properties"), catalog=False))  # fmt: skip
    _remove_leftovers(locations, to_fs_path, layout, run)
    # what expiry deletes after the commit is listed before it: a failure to read it
    # then fails the conversion, not the deletions after a commit that stands
    old_files = _old_files(table, base, base_location) if expire and target is None else None
    written: list[str] = []
    try:
        updates, stats = _build(table, base, base_location, new_base, io, manager, layout, run, row_ids,
                                target_file_size, written, in_place=target is None)  # fmt: skip
        if target is None:
            updates = [*kind_updates, *updates]
            if expire:
                updates.append(_model.ResetMetadataLog())  # the older versions go with the files they name
            location = _commit_in_place(table, base_location, base, new_base, updates, manager, kms if encrypt else None)
        else:
            metadata_dir = to_fs_path(f"{recorded}/metadata")
            sealer = _authenticity.sealer_for(manager, None) if manager is not None else None
            location = _commit.create_table_metadata(fs, metadata_dir, _model.apply(new_base, updates), sealer=sealer)
    except (_commit.VersionExistsError, CommitConflictError) as exc:
        w._discard(io, written, exc)
        raise CommitConflictError(f"{base_location}: another writer committed while the table was being "
                                  f"{kind}ed; nothing was committed (run it again)") from exc  # fmt: skip
    except BaseException as exc:
        w._discard(io, written, exc)  # kept when the commit landed (an interrupt after it) or may have
        raise
    # committed: nothing below may undo it
    snapshot_id = next((u.snapshot_id for u in updates if isinstance(u, _model.SetSnapshotRef)), None)
    result = ConvertTableResult(None, snapshot_id, location, target is None, **stats)
    if stats["dropped_refs"]:
        where = "dropped from the table" if target is None else f"not carried into {location}"
        warnings.warn(f"{base_location}: branches and tags {', '.join(stats['dropped_refs'])} {where} (drop_refs=True): "
                      f"they point at snapshots of the old kind, which the {kind}ion does not convert", UserWarning,
                      stacklevel=3)  # fmt: skip
    if target is None:
        result.table = table
        if old_files is not None:
            _expire_old(table, base_location, old_files, result)
    else:
        from icecrypt.table._table import EncryptedTable

        result.table = EncryptedTable.load(location, kms=kms if encrypt else None, filesystem=fs,
                                           location_map=locations.location_map or None)  # fmt: skip
    return result


def _commit_in_place(
    table: Any, base_location: str, base: dict[str, Any], new_base: dict[str, Any], updates: list[Any],
    manager: EncryptionManager | None, new_kms: Any,
) -> str:
    """Commit ``updates`` on ``base`` through the one committer: once, on that version
    (whose rows were rewritten; no retry: a concurrent commit refuses the conversion),
    which may be of format v1 or v2 (the updates upgrade it).  The commit changes what
    the table object pins (encrypted or not, the key id): the new pin, taken from the
    version before its snapshot, is the commit's explicit ``pin_change`` (a catalog
    records the key id in the same transaction); the object takes it, and ``new_kms``,
    once the commit landed."""
    from icecrypt.table.commit import committer as _committer

    target = w._Target.of(table)
    pin = dataclasses.replace(TablePin.from_metadata(new_base), source=table.pin.source if table.pin else "caller")
    kind = "encryption" if manager is not None else "decryption"

    def build(location: str, version: dict[str, Any]) -> _committer.Staged:
        return _committer.Staged(
            _model.Change.on(version, updates, what=f"table {kind}"), manager=manager,
            keys_whole=False,  # the new version's keys are checked when it is installed
            pin_change=pin, kms=new_kms,
            # an encrypted table's versions are authenticated from its first encrypted one on
            authenticate=manager is not None,
        )  # fmt: skip

    location = _committer.commit(
        target, build, first_base=(base_location, base), policy=_committer.RetryPolicy(num_retries=0),
        any_format_version=True,  # a v1 or v2 source: the updates upgrade it
    )
    assert location is not None
    return location


def _finished(table: Any, kind: str, expire: bool, target: str | None) -> ConvertTableResult | None:
    """A rerun after an interrupted in-place conversion whose commit landed: finish what
    came after it (the expiry) instead of refusing."""
    if target is not None:
        return None
    snapshot = table.current_snapshot()
    summary = (snapshot.summary or {}) if snapshot is not None else {}
    if CONVERTED_FROM not in summary or summary.get(CONVERSION) != kind:
        return None
    result = ConvertTableResult(table, snapshot.snapshot_id, table.metadata_location, True, already_done=True)
    if expire:
        _remove_unreferenced_old_kind(table, result, encrypted_old=(kind == "decrypt"))
    return result


def _existing_target(fs: pafs.FileSystem, to_fs_path: Any, recorded: str) -> str | None:
    """The metadata file of a table at ``recorded`` (None when there is none)."""
    metadata_dir = to_fs_path(f"{recorded}/metadata")
    infos = fs.get_file_info(pafs.FileSelector(metadata_dir, allow_not_found=True))
    found = sorted(i.path for i in infos if i.type == pafs.FileType.File
                   and (i.base_name.endswith(".metadata.json") or i.base_name == _commit.VERSION_HINT))  # fmt: skip
    if not found:
        return None
    hinted = [p for p in found if p.endswith(".metadata.json")]
    return hinted[-1] if hinted else found[0]


def _target_done(
    found: str, fs: Any, locations: Locations, kms: Any, marker: str, table_key_id: str | None
) -> ConvertTableResult | None:
    """The table at the target when it is the finished result of this conversion: its
    snapshot names the source version, and -- since whoever can write the target's
    storage could put such a table there -- it is encrypted under ``table_key_id`` (None:
    plaintext) and every file of it verifies."""
    from icecrypt.table._table import EncryptedTable

    try:
        table = EncryptedTable.load(posixpath.dirname(posixpath.dirname(found)), kms=kms, filesystem=fs,
                                    location_map=locations.location_map or None, table_key_id=table_key_id)  # fmt: skip
    except Exception:  # noqa: BLE001 - not the result of this conversion: refused by the caller
        return None
    snapshot = table.current_snapshot()
    if snapshot is None or (snapshot.summary or {}).get(CONVERTED_FROM) != marker or table.encrypted != bool(table_key_id):
        return None
    if not table.verify().ok:
        return None
    return ConvertTableResult(table, snapshot.snapshot_id, table.metadata_location, False, already_done=True)


def _kind_updates(*, encrypt: bool, table_key_id: str | None, data_key_length: int | None) -> list[Any]:
    """The updates that make a table of the other kind, before its new snapshot: format
    v3, and ``encryption.key-id`` (with ``encryption.data-key-length``) set, or removed
    with every ``encryption-keys`` entry."""
    updates: list[Any] = [_model.UpgradeFormatVersion(3)]
    if encrypt:
        properties = {ENCRYPTION_TABLE_KEY: str(table_key_id)}
        if data_key_length is not None:
            properties[ENCRYPTION_DEK_LENGTH] = str(data_key_length)
        updates.append(_model.SetProperties(properties))
    else:
        updates += [_model.RemoveProperties(_ENCRYPTION_PROPERTIES), _model.SetEncryptionKeys(())]
    return updates


def _upgraded(
    table: Any, base: Mapping[str, Any], kind_updates: list[Any], *, target: str | None
) -> tuple[dict[str, Any], dict[str, int] | None]:
    """``base`` as a format-v3 document of the new kind, before the new snapshot
    (``kind_updates`` applied), and for a new table a new UUID and location without the
    source's history.  For a source below v3 also the ``first_row_id`` an upgrade gives
    each live data file (by path), and the ``next-row-id`` after them."""
    doc = _model.apply(base, kind_updates)
    row_ids = None
    if int(base.get("format-version", 1)) < 3:
        row_ids, doc["next-row-id"] = _upgrade_row_ids(table)
    if target is not None:
        properties = {k: v for k, v in (doc.get("properties") or {}).items() if k not in _SOURCE_PATHS}
        doc.update({
            "table-uuid": str(uuid.uuid4()), "location": target, "current-snapshot-id": -1, "refs": {},
            "snapshots": [], "snapshot-log": [], "metadata-log": [], "statistics": [], "partition-statistics": [],
        })  # fmt: skip
        doc.pop("encryption-keys", None)
        doc["properties"] = properties
    return doc, row_ids


def _upgrade_row_ids(table: Any) -> tuple[dict[str, int], int]:
    """What upgrading a v1/v2 table to v3 assigns: each live data file of the current
    snapshot gets a ``first_row_id``, counted from 0 over the data manifests in
    manifest-list order and their live entries in order; returns them and the table's
    ``next-row-id`` after them."""
    ids: dict[str, int] = {}
    next_id = 0
    snapshot = table.current_snapshot()
    if snapshot is None:
        return ids, 0
    for manifest in table.manifests(snapshot):
        if manifest.content != DATA:
            continue
        for entry in read_manifest(manifest, table.locations, table.specs, table.schema, encrypted=table.encrypted):
            ids[entry.file.file_path] = next_id
            next_id += entry.file.record_count
    return ids, next_id


def _lineage_batches(table: Any, row_ids: dict[str, int] | None) -> tuple[Iterator[pa.RecordBatch], bool, dict[str, Any]]:
    """The live rows of the current snapshot (deletes applied) with their row lineage
    columns, and counts of the source's live files."""
    schema = table.schema
    columns = lineage_columns(schema)
    stats = {"rewritten_data_files": 0, "rewritten_delete_files": 0}
    if columns is None:
        warnings.warn(f"{table.metadata_location}: the table has a column named like a row lineage column; the "
                      "converted rows get new row ids", stacklevel=3)  # fmt: skip
        tasks = table.scan().plan_files()
    elif row_ids is None:
        tasks = table.scan(columns=columns).plan_files()
    else:  # below v3: lineage from the ids the upgrade assigns and the files' sequence numbers
        tasks = table.scan(columns=[f.name for f in schema.fields] + [ROW_POSITION.name]).plan_files()
    stats["rewritten_data_files"] = len({t.file.path for t in tasks})
    stats["rewritten_delete_files"] = len({(d.path, d.content_offset) for t in tasks for d in t.deletes})
    cache: dict = {}

    def batches() -> Iterator[pa.RecordBatch]:
        for task in tasks:
            for batch in read_task(task, table.filesystem, cache=cache):
                if columns is not None and row_ids is not None:
                    positions = batch.column(batch.num_columns - 1)
                    first = row_ids[task.file.path]
                    arrays = [*batch.columns[:-1], pc.add(positions, pa.scalar(first, pa.int64())),
                              pa.repeat(pa.scalar(task.file.sequence_number, pa.int64()), batch.num_rows)]
                    names = [*batch.schema.names[:-1], ROW_ID.name, LAST_UPDATED_SEQUENCE_NUMBER.name]
                    batch = pa.RecordBatch.from_arrays(arrays, names=names)
                yield batch

    return batches(), columns is not None, stats


def _build(
    table: Any, base: Mapping[str, Any], base_location: str, new_base: dict[str, Any], io: TableIO,
    manager: EncryptionManager | None, layout: WriteLayout, run: str, row_ids: dict[str, int] | None,
    target_file_size: int | None, written: list[str], *, in_place: bool,
) -> tuple[list[Any], dict[str, Any]]:
    """Write the new files (each name recorded in ``written`` before it is created) and
    return the updates that commit them on ``new_base``: the converted snapshot added
    and ``main`` moved to it, the snapshots of the old kind removed (in place), and the
    ``encryption-keys`` of ``manager`` (which wrapped the manifest-list key)."""
    schema = w._schema(new_base)
    specs = w._specs(new_base)
    spec = specs[new_base.get("default-spec-id", 0)]
    properties = new_base.get("properties") or {}
    stats: dict[str, Any] = {}
    snapshot_id = w._new_snapshot_id(base)
    updates: list[Any] = []
    old_ids = [s["snapshot-id"] for s in base.get("snapshots") or ()] if in_place else []
    if table.current_snapshot() is not None:
        batches, lineage, counts = _lineage_batches(table, row_ids)
        stats.update(counts)
        options = DataWriteOptions.from_properties(properties, target_file_size=target_file_size)
        data_files, started = write_data_files(
            io, batches, schema=schema, spec=spec, layout=layout, properties=properties, options=options,
            sort_order_id=new_base.get("default-sort-order-id", 0), operation_id=run, lineage=lineage,
        )  # fmt: skip
        written.extend(started)
        entries = [{"status": ADDED, "snapshot_id": snapshot_id, "sequence_number": None,
                    "file_sequence_number": None, "data_file": f} for f in data_files]  # fmt: skip
        manifests = []
        if entries:
            written.append(loc := layout.metadata_file(f"{run}-m0.avro"))
            manifests.append(write_manifest(io, loc, entries, spec=spec, schema=schema, content=DATA))
        written.append(list_location := layout.metadata_file(f"snap-{snapshot_id}-1-{run}.avro"))
        parent = w._current_snapshot(new_base)
        key, next_row_id = write_manifest_list(
            io, list_location, manifests, [], snapshot_id=snapshot_id,
            parent_snapshot_id=parent["snapshot-id"] if parent else None,
            sequence_number=new_base.get("last-sequence-number", 0) + 1, first_row_id=new_base.get("next-row-id", 0),
        )  # fmt: skip
        removed = _live_file_records(table) if in_place else []
        change = w._Change("replace", manifests, [], added_files=data_files, removed_files=removed,
                           summary_extra={CONVERTED_FROM: _marker(base, base_location),
                                          CONVERSION: "encrypt" if manager is not None else "decrypt"})  # fmt: skip
        snapshot = w._new_snapshot(new_base, parent, change, snapshot_id, list_location, next_row_id)
        if manager is not None:  # wrapped under the table's current KEK (created if none)
            snapshot["key-id"] = manager.wrap_manifest_list_key_metadata(key).key_id
        updates += [_model.AddSnapshot(snapshot), _model.SetSnapshotRef(_model.MAIN_BRANCH, snapshot_id, "branch")]
        stats.update(added_data_files=len(data_files), records=sum(f["record_count"] for f in data_files))
    if manager is not None:
        updates.append(_model.SetEncryptionKeys(tuple(k.to_json() for k in manager.encryption_keys)))
    if old_ids:
        updates.append(_model.RemoveSnapshots(tuple(old_ids)))
        stats["removed_snapshot_ids"] = old_ids
    stats["dropped_refs"] = sorted(n for n in (base.get("refs") or {}) if n != _model.MAIN_BRANCH)
    return updates, stats


def _live_file_records(table: Any) -> list[dict[str, Any]]:
    """The live data and delete files of the current snapshot, as the summary counts them."""
    out = []
    snapshot = table.current_snapshot()
    for manifest in table.manifests(snapshot):
        for entry in read_manifest(manifest, table.locations, table.specs, table.schema, encrypted=table.encrypted):
            f = entry.file
            out.append({"content": f.content, "file_path": f.file_path, "file_format": f.file_format,
                        "record_count": f.record_count, "file_size_in_bytes": f.file_size_in_bytes,
                        "content_size_in_bytes": f.content_size_in_bytes,
                        "partition": {str(i): v for i, v in enumerate(f.partition)}})  # fmt: skip
    return out


def _remove_leftovers(locations: Locations, to_fs_path: Any, layout: WriteLayout, run: str) -> None:
    """Delete what an interrupted run of this conversion left: its files carry ``run``
    in their names (data files: ``<task>-<pid>-<run>-<n>``; manifests, manifest list)
    and no committed version references them (a version that did would no longer be
    the source this run id was derived from)."""
    fs = locations.filesystem
    deletions = Deletions(locations, f"cleanup of conversion {run}")  # never through a link, never elsewhere
    for recorded_root in (layout.data_root, layout.metadata_root):
        root = to_fs_path(recorded_root)
        for info in fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True)):
            if info.type == pafs.FileType.File and run in info.base_name:
                deletions.path(info.path)
    deletions.warn()


def _old_files(table: Any, base: Mapping[str, Any], base_location: str) -> tuple[list[str], list[str]]:
    """(every file the snapshots of ``base`` reference, the metadata files of its log)
    as recorded locations."""
    from icecrypt.table._table import EncryptedTable

    old = EncryptedTable(dict(base), base_location, table.locations, table.kms, check_keys=False,
                         pin=TablePin.from_metadata(dict(base), source="caller"))  # fmt: skip
    files = _referenced(old)
    for name in ("statistics", "partition-statistics"):
        for stat in base.get(name) or ():
            if stat.get("statistics-path"):
                files.add(stat["statistics-path"])
    logged = [e["metadata-file"] for e in base.get("metadata-log") or ()]
    return sorted(files), logged


def _expire_old(table: Any, base_location: str, old_files: tuple[list[str], list[str]], result: ConvertTableResult) -> None:
    """After the commit: delete the old kind's files (the old snapshots' and the older
    metadata files, which the new version's log no longer names).  Best effort per
    file: the commit stands; a rerun finds what is left (``_finished``)."""
    files, logged = old_files
    try:
        live = _referenced(table)
    except Exception as exc:  # noqa: BLE001 - the commit stands; the rerun's sweep deletes them
        warnings.warn(f"{base_location}: the old snapshots' files were not deleted ({exc}); run the conversion "
                      "again to delete them", RuntimeWarning, stacklevel=3)  # fmt: skip
        return
    deletions = Deletions(table.locations, f"conversion of {table.pin.location}")
    for location in files:
        if location in live:
            continue
        with contextlib.suppress(OSError, ValueError):
            deletions.location(location)
    # the older metadata files: only what drop_table(purge=True) deletes there (entries
    # named *.metadata.json[.gz]; the log is storage's word, a data file it names stays)
    delete_logged_metadata_files(deletions, logged)
    with contextlib.suppress(OSError):
        deletions.path(base_location)
    deletions.warn()
    result.deleted_files = list(deletions.deleted)
    result.skipped_files = list(deletions.skipped_locations)


def _referenced(table: Any) -> set[str]:
    """Every file the table's snapshots reference (as recorded)."""
    files: set[str] = set()
    for snapshot in table.snapshots():
        files.add(snapshot.manifest_list)
        for manifest in table.manifests(snapshot):
            files.add(manifest.path)
            for entry in read_manifest(manifest, table.locations, table.specs, table.schema, encrypted=table.encrypted,
                                       include_deleted=True):  # fmt: skip
                files.add(entry.file.file_path)
    return files


def _remove_unreferenced_old_kind(table: Any, result: ConvertTableResult, *, encrypted_old: bool) -> None:
    """The rerun of an in-place conversion whose expiry was interrupted: delete the
    files under the table's roots that nothing references and that are of the old kind
    (plaintext after encrypting: no writer of the encrypted table writes one; AGS1 or
    encrypted Parquet after decrypting, for metadata of icecrypt's names only)."""
    from icecrypt.table.maintenance.actions import referenced_files

    refs = referenced_files(table)
    fs = table.filesystem
    deletions = Deletions(table.locations, f"conversion of {table.pin.location}")
    for root in sorted({posixpath.normpath(r) for r in table.locations.fs_roots()}):
        for info in fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True)):
            path = posixpath.normpath(info.path)
            if info.type != pafs.FileType.File or path in refs or info.base_name.startswith((".", "_")):
                continue
            if info.base_name == _commit.VERSION_HINT or _newer_metadata(path, table.metadata_location):
                continue  # a version committed since this object's refresh is never an orphan
            if _is_encrypted_file(fs, path) == encrypted_old:
                with contextlib.suppress(OSError, ValueError):
                    deletions.path(path)
    deletions.warn()
    result.deleted_files = list(deletions.deleted)
    result.skipped_files = list(deletions.skipped_locations)


def _newer_metadata(path: str, current: str) -> bool:
    """Whether ``path`` is a metadata file not older than the ``current`` one (or of a
    name whose version is unknown: kept)."""
    if not path.endswith(METADATA_FILE_SUFFIXES):
        return False
    try:
        return _commit.version_of(path) >= _commit.version_of(current)
    except ValueError:
        return True


def _is_encrypted_file(fs: pafs.FileSystem, path: str) -> bool:
    with fs.open_input_file(path) as f:
        head = f.read(4)
    return head in (b"AGS1", b"PARE")

"""``EncryptedTable``: an Iceberg table (encrypted or not) on a pyarrow filesystem."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema

from icecrypt.errors import (
    DecryptionError,
    EncryptionKeyNotFoundError,
    FormatError,
    KmsError,
)
from icecrypt.keys import ENCRYPTION_TABLE_KEY, EncryptionManager, StandardKeyMetadata
from icecrypt.kms.base import KeyManagementClient
from icecrypt.table.files.io import Locations, PlaintextFileError
from icecrypt.table.files.manifest import ManifestFile, read_manifest_list
from icecrypt.table.files.metadata import (
    Snapshot,
    parse_metadata,
    read_metadata_file,
    resolve_metadata_file,
)
from icecrypt.table.model.changes import check_refs
from icecrypt.table.commit import authenticity as _authenticity
from icecrypt.table.commit.pin import TablePin

if TYPE_CHECKING:  # imported where a scan is made: opening a table does not load the read path
    from pyiceberg.expressions import BooleanExpression

    from icecrypt.table.read.scan import TableScan

__all__ = ["EncryptedTable"]


def _allowed(locations: Sequence[str]) -> tuple[str, ...]:
    if isinstance(locations, (str, bytes)):
        raise TypeError("allowed_locations must be a collection of locations, not a single string")
    return tuple(str(location).rstrip("/") or str(location) for location in locations)


class EncryptedTable:
    """An Iceberg table read (and, through ``icecrypt.table.ops.write``, written) with
    Iceberg's table encryption.

    Load one with :meth:`load`, create one with :meth:`create`.  The table is encrypted
    when its metadata has the property ``encryption.key-id``; then every manifest list,
    manifest, data and delete file must be encrypted and is authenticated as it is read,
    and a snapshot without ``key-id`` is refused.  Tables without the property (format
    v1-v3) are read as plain Iceberg tables.

    What writers use: ``metadata`` (the ``metadata.json`` document as read, field
    order and unknown fields kept), ``metadata_location`` (its path on
    ``filesystem``), ``locations`` / :meth:`fs_path` (recorded location ->
    filesystem path), ``kms``, ``encryption_manager`` and :meth:`refresh`.
    """

    def __init__(
        self,
        metadata: dict[str, Any],
        metadata_location: str,
        locations: Locations,
        kms: KeyManagementClient | None,
        *,
        check_keys: bool = True,
        require_encryption: bool = False,
        pin: TablePin | None = None,
        allowed_locations: Sequence[str] = (),
        require_authenticated_metadata: bool = False,
        anchor: Any = None,
        metadata_store: Any = None,
    ):
        self.locations = locations
        self.allowed_locations = _allowed(allowed_locations)
        self.kms = kms
        self.check_keys = check_keys  # repair: KeysLostError when keys were dropped (_repair)
        self.require_authenticated_metadata = bool(require_authenticated_metadata)
        self.require_encryption = require_encryption or self.require_authenticated_metadata
        self.pin = pin  # None: pinned from the first version installed
        if metadata_store is not None:
            self.metadata_store = metadata_store
        self._anchor = anchor  # a fresh load's word on where the table is (icecrypt.table.commit.pin.Anchor)
        self._install(metadata, metadata_location)
        self._anchor = None

    # --- loading ------------------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        metadata_location: str | os.PathLike[str],
        *,
        kms: KeyManagementClient | None = None,
        filesystem: pafs.FileSystem | None = None,
        location_map: Mapping[str, str] | None = None,
        check_keys: bool = True,
        require_encryption: bool = False,
        table_key_id: str | None = None,
        table_uuid: str | None = None,
        allowed_locations: Sequence[str] = (),
        require_authenticated_metadata: bool = False,
        data_location: str | None = None,
        pin: TablePin | None = None,
    ) -> EncryptedTable:
        """Load a table from a ``metadata.json`` file or a table directory.

        ``metadata_location``: a metadata file (``v3.metadata.json``, Java's
        ``00004-<uuid>.metadata.json``) or a table directory (Hadoop layout: the
        version hint, then the newest ``metadata/v<N>.metadata.json``), as a path on
        ``filesystem`` (None = local) or a URI the ``location_map`` rewrites.
        ``kms`` holds the table key (``encryption.key-id``); it is required for an
        encrypted table.  ``location_map`` rewrites recorded path prefixes, e.g.
        ``{"s3://bucket/table": "/data/table"}``.  ``check_keys=False`` opens an
        encrypted table whose metadata lost keys (a ``KeysLostError`` otherwise), to
        inspect it or :meth:`repair_keys` it.  ``require_encryption=True`` refuses a
        table without ``encryption.key-id`` (:class:`PlaintextFileError`), at load and
        at every refresh: a pipeline that must only ever see encrypted data says so,
        instead of reading whatever the path holds.

        ``table_key_id`` / ``table_uuid``: the master key id and table UUID the caller
        knows the table has (from its own configuration, not from storage).  The object
        pins them (``pin``) -- and otherwise the encryption state, key id, UUID and
        locations of the version it loads -- and refuses every later version that
        differs (:class:`~icecrypt.TableIdentityError`), at refresh and before every
        write: whoever can write the table's storage cannot remove its encryption or
        swap its master key behind this object.  ``table_key_id`` also refuses a table
        that is not encrypted under that key at load.  A master-key rotation committed
        by another writer is refused the same way: load the table again with the new
        ``table_key_id``.

        Every file the table reads, writes or deletes must lie under the table's pinned
        location (or ``write.data.path`` / ``write.metadata.path``): a manifest or
        metadata log naming a file elsewhere is refused
        (:class:`~icecrypt.errors.PathOutsideTableError`) and never deleted.
        ``allowed_locations``: further locations (as recorded, e.g.
        ``["s3://shared/lookup"]``) whose files this table may read, for tables that
        legitimately reference files outside their location.

        **The table is where the caller points.**  The table directory is the one named
        (or, for a metadata file, the directory holding its ``metadata/`` directory): a
        version whose ``location`` is another directory, or a metadata file that does not
        lie in ``<table>/metadata/``, is refused (TableIdentityError) before anything is
        read through it.  A ``write.data.path`` outside the table directory is accepted
        only when the caller names it (``data_location``) or the version is authenticated;
        a table root that is a symbolic link is refused.

        ``require_authenticated_metadata=True``: refuse a version that carries no valid
        authenticator (TableIntegrityError), at load and at every refresh and write;
        implies ``require_encryption``.  Without it, an authenticator present is still
        verified, and once this object held an authenticated version it refuses
        unauthenticated ones (see ``icecrypt.table.commit.authenticity`` and docs/security.md).  Pass
        ``table_key_id`` with it, so that the master key vouching for the metadata is the
        one you expect.  ``pin``: a :class:`~icecrypt.table.commit.pin.TablePin` from a
        trusted source (the driver's table object), which the version must match.
        """
        from icecrypt.table.commit.pin import Anchor, trusted_pin

        locations = Locations(filesystem, location_map)
        path = resolve_metadata_file(locations.filesystem, locations.to_fs_path(metadata_location))
        anchor = Anchor.of(locations, path, pin=pin, data_location=data_location)
        metadata = read_metadata_file(locations.filesystem, path)
        anchor.check_location(metadata)  # before anything else is done with the version
        if pin is None:
            pin = trusted_pin(metadata, table_key_id=table_key_id, table_uuid=table_uuid)
        return cls(metadata, path, locations, kms, check_keys=check_keys, require_encryption=require_encryption,
                   pin=pin, allowed_locations=allowed_locations,
                   require_authenticated_metadata=require_authenticated_metadata, anchor=anchor)

    def _install(
        self,
        metadata: dict[str, Any],
        metadata_location: str,
        committed_manager: EncryptionManager | None = None,
        *,
        keys_checked: bool = False,
        own: bool = False,
    ) -> None:
        """Make ``metadata`` (read from ``metadata_location``) this table's state.

        ``committed_manager``: the manager whose ``encryption-keys`` the write path just
        committed as ``metadata`` (used as is when configured as ``metadata`` says, which
        spares parsing every entry again).  Otherwise the new manager shares the previous
        one's cache of unwrapped KEKs when configured alike, so a table object asks the
        KMS for a KEK once per cache TTL, not once per commit or refresh.
        ``keys_checked``: ``metadata`` is this object's own commit on top of a version
        whose keys were checked, so the lost-key check is not repeated.  ``own``:
        ``metadata`` is the document this object just committed (its authenticator, if
        any, is the one the commit made: not verified again)."""
        if not own:  # a catalog's digest first: it says whether any of this is what was committed
            _authenticity.check_digest(self, metadata_location, metadata)
        check_refs(metadata, metadata_location)  # before PyIceberg's model: clearer errors
        model = parse_metadata(metadata, metadata_location)
        properties = metadata.get("properties") or {}
        if getattr(self, "require_encryption", False) and not properties.get(ENCRYPTION_TABLE_KEY):
            raise PlaintextFileError(
                f"{metadata_location}: the table is not encrypted (no {ENCRYPTION_TABLE_KEY} property) "
                "and encryption is required (refused)"
            )
        if getattr(self, "pin", None) is None:
            self.pin = TablePin.from_metadata(metadata)
        else:
            self.pin.check(metadata, metadata_location)  # before any key is unwrapped through it
        manager = None
        if properties.get(ENCRYPTION_TABLE_KEY):
            if self.kms is None:
                raise ValueError(
                    f"{metadata_location}: the table is encrypted (encryption.key-id = "
                    f"{properties[ENCRYPTION_TABLE_KEY]!r}) and no KMS client was given"
                )
            if committed_manager is not None and committed_manager.matches_metadata(self.kms, metadata):
                manager = committed_manager
            else:
                try:
                    manager = EncryptionManager.from_table_metadata(self.kms, metadata)
                except ValueError as exc:
                    raise FormatError(f"{metadata_location}: {exc}") from None
                manager.share_kek_cache(getattr(self, "encryption_manager", None))
        snapshots = {}
        for raw in metadata.get("snapshots") or ():
            snapshot = Snapshot.from_json(raw)
            snapshots[snapshot.snapshot_id] = snapshot
        current = metadata.get("current-snapshot-id")
        if current is not None and current != -1 and current not in snapshots:
            # as Java's TableMetadata ("Cannot find current version"): a dangling id is damage
            raise FormatError(f"{metadata_location}: current-snapshot-id {current} is not among the table's snapshots")
        if own:
            authenticator = _authenticity.own_authenticator(metadata, metadata_location)
        else:
            authenticator = _authenticity.check_version(self, metadata_location, metadata, manager=manager)
        anchor = getattr(self, "_anchor", None)
        if anchor is not None:  # a fresh load: the roots a version names must be the caller's or authenticated
            anchor.check_roots(metadata, metadata_location, authenticated=authenticator is not None)
        self._confine_locations()  # before the key check below reads manifest lists
        if manager is not None and not (keys_checked and manager is committed_manager):
            self._check_lost_keys(metadata, metadata_location)
        self.metadata = metadata
        self.metadata_location = metadata_location
        self.model = model
        self.encryption_manager: EncryptionManager | None = manager
        self._snapshots = snapshots
        self.authenticator = authenticator
        if authenticator is not None:
            self.authenticated_seen = True
        store = getattr(self, "metadata_store", None)
        if store is not None and hasattr(store, "admitted"):
            store.admitted(metadata_location)  # a catalog records the digest of a version it had none for

    def _confine_locations(self) -> None:
        """Make ``locations`` map only locations under the pinned roots (and the caller's
        ``allowed_locations``): never those of a newer version's ``location``.  The roots
        are resolved once, here (a root that is a symbolic link is refused)."""
        key = (self.pin.roots(), getattr(self, "allowed_locations", ()))
        if self.__dict__.get("_confined_by") != key:
            confined = self.locations.unconfined.confined(key[0], allowed_locations=key[1])
            confined.check_roots(f"table {self.pin.location}")
            self.locations = confined
            self._confined_by = key

    def _check_lost_keys(self, metadata: dict[str, Any], metadata_location: str) -> None:
        """KeysLostError when an encrypted version lost keys its snapshots need (dropped by
        another writer; see repair_keys), unless the table was opened with
        ``check_keys=False``."""
        if not getattr(self, "check_keys", True):
            return
        from icecrypt.table.maintenance.repair import check_keys

        check_keys(metadata, metadata_location, self.locations, cache=self.__dict__.setdefault("_repair_cache", {}))

    #: Where the table's catalog keeps its current metadata location
    #: (``icecrypt.table.commit.store.MetadataStore``); None for a table loaded by path.
    #: Set by ``icecrypt.catalog``: refresh() then asks the catalog, and every commit
    #: swaps the catalog's metadata location.
    metadata_store: Any = None

    #: What this object holds fixed (``icecrypt.table.commit.pin.TablePin``): encryption state,
    #: master key id, table UUID and locations, from the caller, the catalog or the first
    #: version it loaded.
    pin: TablePin | None = None

    #: The verified authenticator of the version held (``icecrypt.table.commit.authenticity``;
    #: None: the version has none), and whether this object ever held an authenticated
    #: version (it then refuses unauthenticated ones).
    authenticator: Any = None
    authenticated_seen: bool = False
    require_authenticated_metadata: bool = False

    def refresh(self) -> EncryptedTable:
        """Re-read the newest committed version of this table (after a commit here or
        elsewhere); returns self.  A catalog table asks its catalog which version is
        current; a path table looks for newer ``v<N>.metadata.json`` files.  Never goes
        back to an ancestor of the version held (TableVersionError when the layouts
        disagree, see ``_commit.latest_metadata_location``); a version that differs from
        the pin is refused (TableIdentityError)."""
        from icecrypt.table.commit.store import check_not_ancestor, latest_metadata_location

        if self.metadata_store is not None:
            path = check_not_ancestor(self.metadata_location, self.metadata, self.metadata_store.current())
        else:
            try:
                path = latest_metadata_location(self.filesystem, self.metadata_location, self.metadata)
            except ValueError:  # a metadata file name that is neither Hadoop's nor Java's
                path = self.metadata_location
        self._install(read_metadata_file(self.filesystem, path), path)
        return self

    # --- what the table is -----------------------------------------------------------------

    @property
    def filesystem(self) -> pafs.FileSystem:
        return self.locations.filesystem

    @property
    def location_map(self) -> dict[str, str]:
        return dict(self.locations.location_map)

    def fs_path(self, location: str, *, what: str = "file") -> str:
        """The path on ``filesystem`` of a location recorded in the metadata
        (PathOutsideTableError, naming ``what``, for one outside the table)."""
        return self.locations.to_fs_path(location, what=what)

    @property
    def location(self) -> str:
        """The table location recorded in the metadata."""
        return self.metadata["location"]

    @property
    def encrypted(self) -> bool:
        return self.encryption_manager is not None

    @property
    def format_version(self) -> int:
        return int(self.metadata.get("format-version", 1))

    @property
    def properties(self) -> dict[str, str]:
        return dict(self.metadata.get("properties") or {})

    @property
    def schema(self) -> Schema:
        """The current schema (PyIceberg)."""
        return self.model.schema()

    @property
    def spec(self) -> PartitionSpec:
        """The default partition spec (PyIceberg)."""
        return self.model.spec()

    @property
    def specs(self) -> dict[int, PartitionSpec]:
        return self.model.specs()

    def schema_for(self, snapshot: Snapshot | None) -> Schema:
        """The schema a snapshot was written with (the current one if it says none)."""
        if snapshot is not None and snapshot.schema_id is not None:
            for schema in self.model.schemas:
                if schema.schema_id == snapshot.schema_id:
                    return schema
        return self.schema

    # --- snapshots ------------------------------------------------------------------------------

    def snapshots(self) -> list[Snapshot]:
        """All snapshots, in metadata order (oldest first)."""
        return list(self._snapshots.values())

    @property
    def current_snapshot_id(self) -> int | None:
        current = self.metadata.get("current-snapshot-id")
        return None if current is None or current == -1 else int(current)

    def current_snapshot(self) -> Snapshot | None:
        current = self.current_snapshot_id
        return None if current is None else self.snapshot(current)

    def snapshot(self, snapshot_id: int) -> Snapshot:
        """The snapshot ``snapshot_id``; KeyError if the table has none such."""
        try:
            return self._snapshots[int(snapshot_id)]
        except KeyError:
            raise KeyError(f"table {self.location} has no snapshot {snapshot_id}") from None

    def snapshot_as_of_timestamp(self, timestamp: Any, *, inclusive: bool = True) -> Snapshot | None:
        """The snapshot that was current at ``timestamp`` (ms since the epoch or an aware
        datetime) by the table's snapshot log -- the last entry at or before it (strictly
        before with ``inclusive=False``) -- or None when there was none yet."""
        from icecrypt.table.read.travel import snapshot_as_of_timestamp

        return snapshot_as_of_timestamp(self, timestamp, inclusive=inclusive)

    def snapshot_by_name(self, name: str) -> Snapshot | None:
        """The snapshot the branch or tag ``name`` points at (``main``: the current
        one), or None when the table has no such ref."""
        from icecrypt.table.read.travel import snapshot_by_name

        return snapshot_by_name(self, name)

    def manifest_list_key_metadata(self, snapshot: Snapshot) -> StandardKeyMetadata | None:
        """The key metadata of a snapshot's manifest list, unwrapped through the KEK
        (None in a plaintext table).  A snapshot of an encrypted table without
        ``key-id`` is refused."""
        if self.encryption_manager is None:
            if snapshot.key_id is not None:
                raise FormatError(
                    f"snapshot {snapshot.snapshot_id} has key-id {snapshot.key_id!r}, but the table has no encryption.key-id"
                )
            return None
        if snapshot.key_id is None:
            raise PlaintextFileError(
                f"snapshot {snapshot.snapshot_id} of an encrypted table has no key-id: its manifest list "
                f"{snapshot.manifest_list} would be unencrypted (refused)"
            )
        try:
            km = self.encryption_manager.unwrap_manifest_list_key_metadata(snapshot.key_id)
        except EncryptionKeyNotFoundError as exc:
            raise EncryptionKeyNotFoundError(
                f"manifest list {snapshot.manifest_list} of snapshot {snapshot.snapshot_id}: {exc}"
            ) from None
        except DecryptionError as exc:
            raise type(exc)(
                f"manifest list {snapshot.manifest_list} of snapshot {snapshot.snapshot_id}: "
                f"its key metadata (encryption key {snapshot.key_id!r}) does not unwrap: {exc}"
            ) from exc
        except KmsError as exc:
            raise type(exc)(
                f"manifest list {snapshot.manifest_list} of snapshot {snapshot.snapshot_id}: the KEK of key "
                f"{snapshot.key_id!r} could not be unwrapped with table key "
                f"{self.encryption_manager.table_key_id!r}: {exc}",
                backend=exc.backend,
            ) from exc
        if km.file_length is None:
            raise FormatError(f"manifest list {snapshot.manifest_list}: key metadata has no file_length")
        return km

    def manifests(self, snapshot: Snapshot) -> list[ManifestFile]:
        """The manifests of ``snapshot`` (its manifest list, decrypted)."""
        km = self.manifest_list_key_metadata(snapshot)
        return read_manifest_list(snapshot.manifest_list, self.locations, km, encrypted=self.encrypted)

    # --- reading ---------------------------------------------------------------------------------

    def scan(
        self,
        columns: Sequence[str] | None = None,
        row_filter: BooleanExpression | str | None = None,
        snapshot_id: int | None = None,
        *,
        as_of_timestamp: Any = None,
        branch: str | None = None,
        tag: str | None = None,
        from_snapshot_id: int | None = None,
        to_snapshot_id: int | None = None,
        from_inclusive: bool = False,
        **options: Any,
    ) -> TableScan:
        """A scan of the current snapshot: ``columns`` to return (None = all),
        ``row_filter`` a PyIceberg expression or a string such as
        ``"id > 5 and category = 'alpha'"``.  ``options``: ``case_sensitive``,
        ``split_size`` (bytes per task), ``batch_size`` (rows), ``threads``.

        Time travel (at most one): ``snapshot_id``; ``as_of_timestamp`` (ms since the
        epoch or an aware datetime: the snapshot current then, per the snapshot log);
        ``tag``; these read with the snapshot's schema.  ``branch`` reads the branch's
        head with the current schema.  Unknown snapshot or ref: KeyError; a tag given
        as ``branch`` (or the reverse), a moment before the first snapshot: ValueError.

        Incremental read: ``from_snapshot_id`` (exclusive; inclusive with
        ``from_inclusive=True``) and/or ``to_snapshot_id`` (inclusive, default the current
        snapshot) return an :class:`~icecrypt.table.IncrementalAppendScan` of the rows the
        ``append`` snapshots between them added (Iceberg's incremental append scan);
        ``from`` must be an ancestor of ``to`` (ValueError naming both)."""
        if from_snapshot_id is not None or to_snapshot_id is not None or from_inclusive:
            travel = {"snapshot_id": snapshot_id, "as_of_timestamp": as_of_timestamp, "branch": branch, "tag": tag}
            given = [name for name, value in travel.items() if value is not None]
            if given:
                raise ValueError(
                    f"an incremental read (from_snapshot_id, to_snapshot_id) takes no {' or '.join(given)}")
            from icecrypt.table.read.incremental import IncrementalAppendScan

            return IncrementalAppendScan(self, columns, row_filter, from_snapshot_id=from_snapshot_id,
                                         to_snapshot_id=to_snapshot_id, from_inclusive=from_inclusive, **options)
        from icecrypt.table.read.scan import TableScan

        return TableScan(self, columns, row_filter, snapshot_id, as_of_timestamp=as_of_timestamp, branch=branch,
                         tag=tag, **options)

    def changelog_scan(
        self,
        columns: Sequence[str] | None = None,
        row_filter: BooleanExpression | str | None = None,
        *,
        from_snapshot_id: int | None = None,
        to_snapshot_id: int | None = None,
        from_inclusive: bool = False,
        **options: Any,
    ) -> Any:
        """The rows inserted and deleted by the snapshots between ``from_snapshot_id``
        (exclusive; inclusive with ``from_inclusive=True``; default from the first) and
        ``to_snapshot_id`` (inclusive, default the current snapshot), with the columns
        ``_change_type`` (``INSERT``/``DELETE``), ``_change_ordinal`` and
        ``_commit_snapshot_id`` (Iceberg's changelog scan): a
        :class:`~icecrypt.table.ChangelogScan`.  Snapshots with row-level delete files are
        refused (NotImplementedError), as Iceberg Java refuses them."""
        from icecrypt.table.read.incremental import ChangelogScan

        return ChangelogScan(self, columns, row_filter, from_snapshot_id=from_snapshot_id,
                             to_snapshot_id=to_snapshot_id, from_inclusive=from_inclusive, **options)

    @property
    def inspect(self) -> Any:
        """The metadata tables (snapshots, history, refs, manifests, files, entries,
        partitions, ...) as Arrow tables: ``table.inspect.snapshots()``; key metadata
        shows as a fingerprint, never the key (:class:`~icecrypt.table.InspectTable`)."""
        from icecrypt.table.read.inspect import InspectTable

        return InspectTable(self)

    def verify(self, snapshot_id: int | None = None, *, progress: Any = None) -> Any:
        """Read and authenticate every file reachable from every snapshot (or one);
        returns a :class:`~icecrypt.table.VerifyReport`, never raises for damage."""
        from icecrypt.table.read.verify import verify

        return verify(self, snapshot_id, progress=progress)

    # --- writing (icecrypt.table.ops.write) ------------------------------------------------------

    @classmethod
    def create(
        cls,
        location: str,
        schema: Any,
        *,
        kms: KeyManagementClient | None,
        table_key_id: str | None,
        partition_spec: PartitionSpec | None = None,
        properties: Mapping[str, str] | None = None,
        filesystem: pafs.FileSystem | None = None,
    ) -> EncryptedTable:
        """Create a format-version 3 table at ``location`` (encrypted under the KMS master
        key ``table_key_id``, ``encryption.data-key-length`` from ``properties``, default 16;
        None makes a plaintext table) and return it.  ``schema``: a PyIceberg schema, or an
        Arrow schema (ids assigned unless every field carries ``PARQUET:field_id``).  The
        table is laid out as Iceberg's Hadoop catalog lays tables out
        (``metadata/v1.metadata.json``, version hint)."""
        from icecrypt.table.ops import write as _write

        filesystem, path, location_map = _write.create_metadata(
            location, schema, kms=kms, table_key_id=table_key_id, partition_spec=partition_spec,
            properties=dict(properties) if properties is not None else None, filesystem=filesystem,
        )  # fmt: skip
        # the caller's own write.data.path: its word, as a load of the new table must know it
        data_location = (properties or {}).get("write.data.path")
        return cls.load(path, kms=kms, filesystem=filesystem, location_map=location_map or None,
                        data_location=data_location)

    def append(self, data: Any, **options: Any) -> int | None:
        """Append rows (a pyarrow Table, RecordBatch or iterable of batches); returns the
        new snapshot id.  ``branch=``: commit to that branch (created from main's head
        when it does not exist); ``wap_id=``: stage the snapshot for write-audit-publish
        (needs ``write.wap.enabled=true``; publish with ``manage_snapshots().cherry_pick``)."""
        from icecrypt.table.ops import write as _write

        return _write.append(self, data, **options)

    def add_files(self, files: Any, *, partition_values: Any = None, check_duplicate_files: bool = True,
                  branch: str | None = None) -> Any:
        """Add existing plaintext Parquet files under the table's directories as they are,
        in one append snapshot (Iceberg's ``add_files``; a plaintext table only); returns
        an ``AddFilesResult``.  ``partition_values``: per file, its identity partition
        columns' values as Hive-style directory text; other partition values come from the
        files' statistics.  See ``icecrypt.table.ops.add_files``."""
        from icecrypt.table.ops.add_files import add_files

        return add_files(self, files, partition_values=partition_values, check_duplicate_files=check_duplicate_files,
                         branch=branch)

    def overwrite(self, data: Any, overwrite_filter: BooleanExpression | str | None = None, **options: Any) -> int | None:
        """Replace all of the table's rows with ``data`` (one ``overwrite`` snapshot);
        ``branch=``: of that branch.  With ``overwrite_filter`` only the rows matching it
        are deleted (files it matches whole removed, the rest per ``write.delete.mode``)
        before ``data`` is added, in the same snapshot (``isolation_level=``, ``branch=``)."""
        from icecrypt.table.ops import write as _write

        if overwrite_filter is not None:
            from icecrypt.table.ops import rowlevel as _rowlevel

            unknown = set(options) - {"isolation_level", "branch"}
            if unknown:
                raise TypeError(f"overwrite with overwrite_filter takes no {', '.join(sorted(unknown))}")
            return _rowlevel.overwrite_by_filter(self, data, overwrite_filter, **options)
        return _write.overwrite(self, data, **options)

    def delete(self, row_filter: BooleanExpression | str, *, branch: str | None = None) -> int | None:
        """Delete the rows matching ``row_filter`` (from ``branch``, default main);
        returns the new snapshot id.  With ``write.delete.mode=copy-on-write`` the files
        holding matching rows are rewritten; otherwise (merge-on-read, and
        when the property is unset) deletion vectors are written."""
        from icecrypt.table.ops import rowlevel as _rowlevel
        from icecrypt.table.ops import write as _write

        if _rowlevel.write_mode(self.properties, "delete", default=_rowlevel.MERGE_ON_READ) == _rowlevel.COPY_ON_WRITE:
            return _rowlevel.delete_rows(self, row_filter, mode=_rowlevel.COPY_ON_WRITE, branch=branch)
        return _write.delete(self, row_filter, branch=branch)

    def update(self, set: Mapping[str, Any], where: BooleanExpression | str | None = None, *,
               isolation_level: str | None = None, branch: str | None = None) -> int | None:
        """Set columns of the rows matching ``where`` (every row when None); ``set`` maps
        a column to a constant, a ``pyarrow.compute`` expression of the row's columns or a
        function of the matching rows (a pyarrow Table) returning their new values.
        ``write.update.mode`` picks copy-on-write (default) or merge-on-read; conflicts
        with concurrent commits are checked as Java checks them (``isolation_level``,
        default ``write.update.isolation-level`` or serializable).  ``branch``: the
        branch to change (default main).  Returns the new snapshot id (None when no row
        matched)."""
        from icecrypt.table.ops import rowlevel as _rowlevel

        return _rowlevel.update(self, set, where, isolation_level=isolation_level, branch=branch)

    def upsert(self, data: Any, join_cols: Sequence[str] | None = None, *, when_matched_update_all: bool = True,
               when_not_matched_insert_all: bool = True, isolation_level: str | None = None,
               branch: str | None = None) -> Any:
        """PyIceberg's upsert in one snapshot: rows of ``data`` whose ``join_cols`` (default
        the identifier fields) match a row replace it when a value differs, the others are
        inserted.  ``write.merge.mode`` picks copy-on-write or merge-on-read.  Returns an
        ``UpsertResult`` (``rows_updated``, ``rows_inserted``, ``snapshot_id``)."""
        from icecrypt.table.ops import rowlevel as _rowlevel

        return _rowlevel.upsert(
            self, data, None if join_cols is None else list(join_cols), when_matched_update_all=when_matched_update_all,
            when_not_matched_insert_all=when_not_matched_insert_all, isolation_level=isolation_level, branch=branch,
        )  # fmt: skip

    def merge(self, source: Any, on: Sequence[str], *, when_matched_update: Any = None,
              when_matched_delete: bool = False, when_not_matched_insert: str | None = None,
              isolation_level: str | None = None, branch: str | None = None) -> Any:
        """``MERGE INTO`` the table from ``source`` (a pyarrow Table) on the columns ``on``:
        a matched row is updated (``when_matched_update="all"``: to the source row; a
        mapping: those columns to constants, compute expressions or functions over the
        target's columns and the source's as ``source.<name>``) or deleted
        (``when_matched_delete=True``); unmatched source rows are inserted
        (``when_not_matched_insert="all"``).  Two source rows matching one target row is
        an error.  ``write.merge.mode`` picks the mode.  Returns a ``MergeResult``."""
        from icecrypt.table.ops import rowlevel as _rowlevel

        return _rowlevel.merge(
            self, source, list(on), when_matched_update=when_matched_update, when_matched_delete=when_matched_delete,
            when_not_matched_insert=when_not_matched_insert, isolation_level=isolation_level, branch=branch,
        )  # fmt: skip

    def dynamic_partition_overwrite(self, data: Any, *, isolation_level: str | None = None,
                                    branch: str | None = None) -> int | None:
        """Replace every partition ``data`` has rows in with ``data`` (Java's
        ``ReplacePartitions``; an unpartitioned table is replaced whole), in one
        snapshot; returns its id."""
        from icecrypt.table.ops import rowlevel as _rowlevel

        return _rowlevel.dynamic_partition_overwrite(self, data, isolation_level=isolation_level, branch=branch)

    def expire_snapshots(self, older_than_ms: int, *, retain_last: int | None = None,
                         snapshot_ids: Any = ()) -> Any:
        """Remove snapshots older than ``older_than_ms`` (never the current one, a ref's
        head, or what a branch's ``min-snapshots-to-keep`` -- ``retain_last`` for a
        branch that sets none -- or ``max-snapshot-age-ms`` keeps; refs past their
        ``max-ref-age-ms`` go, as in Java), and the snapshots ``snapshot_ids`` names
        (never a ref's head), and the files and keys only they needed."""
        from icecrypt.table.ops import write as _write

        return _write.expire_snapshots(self, older_than_ms, retain_last=retain_last, snapshot_ids=snapshot_ids)

    def rotate_keys(self, *, new_kek: bool = True, new_master_key_id: str | None = None, new_kms: Any = None) -> dict[str, Any]:
        """Commit a new KEK and/or re-wrap every KEK under KMS master key
        ``new_master_key_id`` (held by ``new_kms``, default this table's KMS); no data file
        changes.  Returns the ids involved (never key bytes)."""
        from icecrypt.table.ops import write as _write

        return _write.rotate_keys(self, new_kek=new_kek, new_master_key_id=new_master_key_id, new_kms=new_kms)

    # --- maintenance (icecrypt.table.maintenance.actions) ---------------------------------------------

    def manage_snapshots(self) -> Any:
        """Branches, tags, rollback and the current snapshot, committed together
        (:class:`~icecrypt.table.ManageSnapshots`; use as a context manager or call
        ``commit()``)."""
        from icecrypt.table.ops.refs import ManageSnapshots

        return ManageSnapshots(self)

    def update_properties(self) -> Any:
        """Set and remove table properties in one commit
        (:class:`~icecrypt.table.UpdateProperties`); encryption properties are refused."""
        from icecrypt.table.ops.refs import UpdateProperties

        return UpdateProperties(self)

    def update_schema(self, *, allow_incompatible_changes: bool = False, case_sensitive: bool = True) -> Any:
        """Add, rename, drop, widen and move columns in one commit
        (:class:`~icecrypt.table.UpdateSchema`; use as a context manager or call
        ``commit()``); data files are not rewritten."""
        from icecrypt.table.ops.schema import UpdateSchema

        return UpdateSchema(self, allow_incompatible_changes=allow_incompatible_changes, case_sensitive=case_sensitive)

    def update_spec(self, *, case_sensitive: bool = True) -> Any:
        """Evolve the partition spec: add, remove and rename partition fields in one
        commit (:class:`~icecrypt.table.UpdateSpec`; a context manager, or call
        ``commit()``). Files already written keep their spec."""
        from icecrypt.table.ops.spec import UpdateSpec

        return UpdateSpec(self, case_sensitive=case_sensitive)

    def replace_sort_order(self, *, case_sensitive: bool = True) -> Any:
        """Replace the table's default sort order (:class:`~icecrypt.table.ReplaceSortOrder`;
        a context manager, or call ``commit()``); writers sort the rows of each new data
        file by it."""
        from icecrypt.table.ops.sort_order import ReplaceSortOrder

        return ReplaceSortOrder(self, case_sensitive=case_sensitive)

    def rewrite_manifests(
        self, *, target_size: int | None = None, force: bool = False, progress: Any = None
    ) -> Any:
        """Regroup the current snapshot's manifests, clustered by partition, into manifests
        of ``target_size`` bytes (default ``commit.manifest.target-size-bytes``, 8 MiB),
        each a new AGS1 file under a fresh key, in one ``replace`` snapshot as Java's
        ``RewriteManifests``. Returns a ``RewriteManifestsResult``."""
        from icecrypt.table.maintenance import actions as _maintenance

        return _maintenance.rewrite_manifests(self, target_size=target_size, force=force, progress=progress)

    def rewrite_position_delete_files(self, row_filter: Any = None, options: dict[str, Any] | None = None) -> Any:
        """Rewrite the table's v2-format position-delete files (a table upgraded from v2
        may hold them) into deletion vectors merged with each data file's own, dropping
        deletes of data files no longer live, as Java's ``rewritePositionDeletes`` does
        on a format-version 3 table; which files is its bin-pack planner's choice
        (``options``: ``rewrite-all``, ``min-input-files``, ``target-file-size-bytes``,
        ...). A table whose position deletes are all deletion vectors is left as it is.
        One ``replace`` commit. Returns a ``RewritePositionDeletesResult``."""
        from icecrypt.table.maintenance import actions as _maintenance

        return _maintenance.rewrite_position_delete_files(self, row_filter, options)

    def rewrite_data_files(
        self,
        target_file_size: int | None = None,
        row_filter: Any = None,
        options: dict[str, Any] | None = None,
        *,
        strategy: str | None = None,
        sort_order: str | None = None,
        progress: Any = None,
    ) -> Any:
        """Bin-pack small data files into files of ``target_file_size`` (default
        ``write.target-file-size-bytes``), applying deletion vectors and position/equality
        deletes, under fresh DEKs, in one ``replace`` commit; appends committed meanwhile
        survive. ``row_filter`` limits the files considered; ``options`` takes Java's
        rewrite options (``min-input-files``, ``rewrite-all``, ``delete-file-threshold``,
        ...). ``strategy="sort"`` (Java's sort strategy; also the option ``strategy``)
        writes the rows sorted by ``sort_order`` (``"id DESC NULLS LAST, name"``, or
        ``"zorder(id, name)"`` for Java's z-order; also the option ``sort-order``) or else
        the table's sort order. Returns a
        ``RewriteDataFilesResult``."""
        from icecrypt.table.maintenance import actions as _maintenance

        return _maintenance.rewrite_data_files(
            self, target_file_size, row_filter, options, progress=progress, strategy=strategy, sort_order=sort_order
        )

    def rekey(
        self,
        *,
        files: Any = (),
        key_metadata: Any = (),
        snapshot_ids: Any = (),
        kek_ids: Any = (),
        everything: bool = False,
        new_master_key_id: str | None = None,
        new_kms: Any = None,
        expire: bool = False,
        target_file_size: int | None = None,
        progress: Any = None,
    ) -> Any:
        """Respond to a key compromise: re-encrypt under fresh keys everything the leaked
        keys protect (data and delete ``files`` or their ``key_metadata``, the manifest
        lists of ``snapshot_ids``, the KEKs ``kek_ids``, or ``everything``), rotate the KEK
        (and the master key to ``new_master_key_id``), and with ``expire=True`` drop every
        snapshot, metadata file and key entry that still reaches the old keys. Returns a
        ``RekeyResult`` whose ``check(table)`` lists what still uses a retired key."""
        from icecrypt.table.maintenance import actions as _maintenance

        return _maintenance.rekey(
            self,
            files=files,
            key_metadata=key_metadata,
            snapshot_ids=snapshot_ids,
            kek_ids=kek_ids,
            everything=everything,
            new_master_key_id=new_master_key_id,
            new_kms=new_kms,
            expire=expire,
            target_file_size=target_file_size,
            progress=progress,
        )

    def remove_orphan_files(self, older_than: Any = None, dry_run: bool = False, *, location: str | None = None) -> Any:
        """Delete (or, with ``dry_run``, only list) the files under the table location that
        no snapshot or metadata file references, including killed writers' temporaries,
        if older than ``older_than`` (ms or datetime; default now - 3 days, as Java's
        ``deleteOrphanFiles``). Returns an ``OrphanFilesResult``."""
        from icecrypt.table.maintenance import actions as _maintenance

        return _maintenance.remove_orphan_files(self, older_than, dry_run, location=location)

    def authenticate_metadata(self) -> str | None:
        """Adopt the version this object holds into the table's chain of authenticated
        metadata: commit it again with an authenticator under a key only the KMS can
        unwrap (the table's master key wraps it), so that loads with
        ``require_authenticated_metadata`` accept it and every later icecrypt commit chains
        to it.  For a table made before authentication existed, or after another engine
        (Iceberg Java, PyIceberg) committed a version, which carries none: check that
        version first (``inspect``, ``verify``), then authenticate it.  Returns the new
        metadata location; None when the version is authenticated already.  A newer
        version committed meanwhile refuses it (CommitConflictError); ValueError for a
        plaintext table."""
        from icecrypt.table.ops.authenticate import authenticate_metadata

        return authenticate_metadata(self)

    def repair_keys(self, *, dry_run: bool = False) -> Any:
        """Restore the ``key-id`` values and ``encryption-keys`` entries the current
        metadata lost (a writer that does not know encryption dropped them) from the
        previous metadata files, each authenticated, in one new commit; refuses
        (``RepairError``) when anything is ambiguous.  Returns a ``RepairReport``."""
        from icecrypt.table.maintenance import repair as _repair

        return _repair.repair_keys(self, dry_run=dry_run)

    def key_usage(self) -> Any:
        """Key fingerprints (never keys) of every reachable file, and KEK ids in use."""
        from icecrypt.table.maintenance import actions as _maintenance

        return _maintenance.key_usage(self)

    def __repr__(self) -> str:
        state = "encrypted" if self.encrypted else "plaintext"
        return f"<EncryptedTable {self.location!r} {state} snapshot={self.current_snapshot_id}>"

"""The table as the write path and the committer see it (:class:`_Target`): where its
metadata is, how recorded paths map to the filesystem, the KMS, the store that keeps its
current version, and the pin every version written on or committed is checked against."""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow.fs as pafs

from icecrypt.keys import ENCRYPTION_TABLE_KEY, EncryptionManager
from icecrypt.keys.manager import validate_table_properties
from icecrypt.table.commit import authenticity as _authenticity
from icecrypt.table.commit import store as _commit
from icecrypt.table.files.write_io import TableIO

__all__ = ["FORMAT_VERSION"]

#: the format version icecrypt writes
FORMAT_VERSION = 3


WRITE_METADATA_PATH = "write.metadata.path"


def metadata_root(metadata: dict[str, Any]) -> str:
    """Where the metadata files of the table ``metadata`` describes go, as Iceberg Java's
    ``BaseMetastoreTableOperations.metadataFileLocation`` says: ``write.metadata.path``
    when set, else ``<location>/metadata``."""
    custom = (metadata.get("properties") or {}).get(WRITE_METADATA_PATH)
    return custom.rstrip("/") if custom else f"{str(metadata['location']).rstrip('/')}/metadata"


def check_format_version(location: str, metadata: dict[str, Any]) -> None:
    """Refuse (ValueError) to write on a version not of the format icecrypt writes."""
    if metadata.get("format-version") != FORMAT_VERSION:
        raise ValueError(
            f"{location}: icecrypt writes format-version {FORMAT_VERSION} tables only "
            f"(this one is {metadata.get('format-version')})"
        )


@dataclass
class _Target:
    """What the write path needs of a table: where its metadata is, how recorded paths
    map to the filesystem, and the KMS (plus a catalog's own table key id, if it keeps
    one, as Hive does; None = ``encryption.key-id`` of the metadata)."""

    filesystem: pafs.FileSystem
    metadata_location: str
    to_fs_path: Callable[[str], str]
    kms: Any
    table_key_id: str | None = None
    table: Any = None  # the EncryptedTable to refresh after a commit
    # (location, metadata, manager, built on a version whose keys were checked) of the
    # last commit made through this target
    last_commit: tuple[str, dict[str, Any], EncryptionManager | None, bool] | None = field(default=None, repr=False)
    # where a catalog keeps the table's current metadata location (_commit.MetadataStore);
    # None = a path table, committed Hadoop-style
    store: Any = None
    # what the table object pinned (icecrypt.table.commit.pin.TablePin): every version written
    # on and every version committed is checked against it; None = nothing pinned (create)
    pin: Any = None
    base_location: str | None = field(default=None, repr=False)  # the version latest() returned last
    # (location, verified authenticator or None) of the last base checked (check_base)
    base_authenticator: tuple[str, Any] | None = field(default=None, repr=False)

    @classmethod
    def of(cls, table: Any) -> _Target:
        # Encryption state, master key id, UUID and locations are the table object's pin
        # (caller, catalog or the version it loaded), never whatever the newest version
        # says: a version that differs is refused before anything is written on it.
        return cls(
            filesystem=table.filesystem or pafs.LocalFileSystem(),
            metadata_location=table.metadata_location,
            to_fs_path=table.fs_path,
            kms=table.kms,
            table=table,
            store=getattr(table, "metadata_store", None),
            pin=getattr(table, "pin", None),
        )

    def current_location(self) -> str:
        """The table's newest committed metadata file: what its catalog says, or for a
        path table the newest version in lineage (hint, then probing forward; never an
        ancestor of the version the table object holds)."""
        held = None
        if self.table is not None and self.metadata_location == self.table.metadata_location:
            held = self.table.metadata
        if self.store is not None:
            current = self.store.current()
            return current if held is None else _commit.check_not_ancestor(self.metadata_location, held, current)
        return _commit.latest_metadata_location(self.filesystem, self.metadata_location, held)

    def check_pin(self, location: str, metadata: dict[str, Any], pin: Any = None) -> None:
        """Refuse (TableIdentityError) a version to write on, or to commit, that differs
        from the table object's pin (``pin``: this commit's own, after a rotation)."""
        pin = pin if pin is not None else self.pin
        if pin is not None:
            pin.check(metadata, location)

    def check_base(self, location: str, metadata: dict[str, Any]) -> None:
        """Refuse a version to build on that differs from the pin (TableIdentityError) or
        fails the table object's authenticity checks (TableIntegrityError: a catalog
        digest, an authenticator, the chain from the version held), before anything is
        read through it or written on it; remembers its verified authenticator, which the
        commit on top of it chains to."""
        table = self.table
        if table is not None:
            _authenticity.check_digest(table, location, metadata)
        self.check_pin(location, metadata)
        if table is None:
            auth = None
        elif metadata is table.metadata and location == table.metadata_location:
            auth = table.authenticator
        else:
            auth = _authenticity.check_version(table, location, metadata, filesystem=self.filesystem)
        self.base_authenticator = (location, auth)

    def sealer(
        self, base_location: str | None, metadata: dict[str, Any], manager: Any, *, new_key: bool = False,
        authenticate: bool = False,
    ) -> Any:
        """What authenticates the version about to be committed on ``base_location``
        (None: a new table): the base's metadata key and tag when the base is
        authenticated; a new key when the table is new or the commit ``authenticate``-s
        an unauthenticated base (``authenticate_metadata``); None (no authenticator) for
        a plaintext table and on an unauthenticated base, so that nothing unverified is
        vouched for.  ``new_key``: a master-key rotation (the key is made anew under the
        new master key)."""
        if manager is None or not (metadata.get("properties") or {}).get(ENCRYPTION_TABLE_KEY):
            return None  # a plaintext version (decrypt_table's too): nothing vouches for it
        if base_location is None:
            return _authenticity.sealer_for(manager, None)
        known = self.base_authenticator
        base = known[1] if known is not None and known[0] == base_location else None
        if base is None and not authenticate:
            return None
        return _authenticity.sealer_for(manager, base, new_key=new_key)

    def commit_metadata(
        self, base_location: str | None, metadata: dict[str, Any], base: dict[str, Any] | None = None, *,
        pin: Any = None, retired: Any = None, sealer: Any = None,
    ) -> str:
        """Commit ``metadata`` as the version after ``base_location`` (whose content is
        ``base``, if the caller has it); returns the new metadata file's path.
        ``base_location`` None creates the table (its first metadata file, in
        ``<location>/metadata``).

        Every write path commits here: a path table creates ``v<N+1>.metadata.json``
        exclusively (``_commit.commit_metadata``), a catalog table writes
        ``<NNNNN>-<uuid>.metadata.json`` and has the catalog swap its metadata location
        (``_commit.commit_metadata_to_store``).  Raising ``_commit.VersionExistsError``
        (another writer committed first; retryable) or CommitConflictError means
        nothing was committed.  ``retired``: KEKs a key rotation retired (id, digest), kept
        by a catalog.  ``sealer``: authenticates the new version (:meth:`sealer`); a new
        encrypted table is authenticated without one given."""
        properties = metadata.get("properties") or {}
        if self.store is None and properties.get(WRITE_METADATA_PATH):
            # as Java's HadoopTableOperations: a path table's metadata lies in <location>/metadata
            raise ValueError(
                f"{base_location or metadata.get('location')}: a path table cannot relocate its metadata "
                f"({WRITE_METADATA_PATH} is for catalog tables); nothing committed"
            )
        if base_location is None:
            if sealer is None and self.kms is not None and properties.get(ENCRYPTION_TABLE_KEY):
                sealer = self.sealer(None, metadata, EncryptionManager.from_table_metadata(self.kms, metadata))
            metadata_dir = self.to_fs_path(metadata_root(metadata))
            if self.store is None:
                return _commit.create_table_metadata(self.filesystem, metadata_dir, metadata, sealer=sealer)
            return _commit.commit_metadata_to_store(
                self.filesystem, self.store, None, metadata, metadata_dir=metadata_dir, sealer=sealer
            )
        if self.store is None:
            return _commit.commit_metadata(self.filesystem, base_location, metadata, base=base, sealer=sealer)
        rotation = pin.table_key_id if pin is not None and pin != self.pin else None
        # a catalog table's metadata files go where Java's metastore catalogs put them:
        # write.metadata.path as pinned, else <location>/metadata
        pinned = pin if pin is not None else self.pin
        root = (pinned.metadata_dir or f"{pinned.location}/metadata") if pinned is not None else metadata_root(metadata)
        return _commit.commit_metadata_to_store(
            self.filesystem, self.store, base_location, metadata, base=base, rotate_to=rotation, retired=retired,
            sealer=sealer, metadata_dir=self.to_fs_path(root),
        )

    def latest(self, *, any_format_version: bool = False) -> tuple[str, dict[str, Any]]:
        """The newest committed metadata file and its content.

        When the table object already holds that version, its parsed document is
        returned (version files are created once and never change; the write path
        replaces containers rather than editing them), so a commit parses no JSON.
        A version not of format v3 is refused (ValueError) unless ``any_format_version``
        (a change that upgrades it: ``encrypt_table``)."""
        location = self.current_location()
        if self.table is not None and location == self.table.metadata_location:
            metadata = self.table.metadata
        else:
            metadata = _commit.read_metadata(self.filesystem, location)
        self.check_base(location, metadata)  # before any key is read through it or file written
        self.base_location = location
        if not any_format_version:
            check_format_version(location, metadata)
        return location, metadata

    def manager(self, metadata: dict[str, Any], *, check_kek: bool = True) -> EncryptionManager | None:
        """A fresh encryption manager for ``metadata`` (None for a plaintext table).

        When ``metadata`` is the table object's own document, a copy of the table's
        manager (same keys; the cache of unwrapped KEKs, and its TTL, shared across the
        table object's commits); otherwise one built from ``metadata``.  A version that
        differs from the pin gets none (TableIdentityError): never a plaintext writer, or
        one under another master key, for a pinned table.  With ``check_kek`` the KEK new
        wraps would use is checked first (ReplayedKeyError before anything is written);
        key rotation and metadata-only commits skip it."""
        own_version = self.table is not None and metadata is self.table.metadata
        location = self.table.metadata_location if own_version else self.base_location
        self.check_pin(location or self.metadata_location, metadata)
        manager = self._manager(metadata)
        if manager is not None and check_kek:
            manager.check_current_kek()
        return manager

    def _manager(self, metadata: dict[str, Any]) -> EncryptionManager | None:
        key_id, _ = validate_table_properties(metadata.get("properties") or {}, FORMAT_VERSION)
        if key_id is None and self.table_key_id is None:
            return None
        if self.kms is None:
            raise ValueError("the table is encrypted (encryption.key-id is set) but no KMS client was given")
        own = getattr(self.table, "encryption_manager", None)
        if (
            own is not None and self.table_key_id is None and metadata is self.table.metadata
            and own.matches_metadata(self.kms, metadata)
        ):  # fmt: skip
            return own.copy()
        manager = EncryptionManager.from_table_metadata(self.kms, metadata, table_key_id=self.table_key_id)
        manager.share_kek_cache(own)
        return manager

    def check_base_keys(self, location: str, metadata: dict[str, Any], manager: EncryptionManager | None) -> bool:
        """Refuse (KeysLostError) to build on a version another writer committed without
        keys its snapshots need, before anything is written: a commit on top of it would
        land and carry the damage on.  Returns whether the version's keys are known to
        be whole (the table object's own version was checked when it was installed), so
        that a commit on top of it, which only adds keys, need not be checked again."""
        table = self.table
        if manager is None or table is None or not getattr(table, "check_keys", True):
            return False
        if metadata is not table.metadata:
            table._check_lost_keys(metadata, location)
        return True

    def io(self, manager: EncryptionManager | None) -> TableIO:
        return TableIO(self.filesystem, self.to_fs_path, manager)

    def committed(self, location: str) -> None:
        """Point the table object at its new version.

        The commit stands once its metadata file landed: a failure to read it back here
        must not reach the caller as a failed operation (a retried append would add its
        rows twice). Reads are retried; if they keep failing the table object keeps its
        old state (scans read the old version until refresh(); writes always start from
        the newest version on storage) and a RuntimeWarning says so."""
        self.metadata_location = location
        if self.table is None:
            return
        last, self.last_commit = self.last_commit, None
        # a catalog that cannot be asked right now (database, network) counts as storage
        # that cannot be read: the commit stands either way
        transient: tuple[type[BaseException], ...] = (Exception,) if self.store is not None else (OSError,)
        if last is not None and last[0] == location:
            # what this target just committed is the table's new state, unless a newer
            # version landed meanwhile: no need to read back and parse the file
            with contextlib.suppress(ValueError, *transient):
                if self.current_location() == location:
                    # built on the version the table object holds, whose key chain was
                    # checked when installed: the commit only added keys
                    self.table._install(last[1], location, last[2], keys_checked=last[3], own=True)
                    return
        for attempt in range(3):
            try:
                self.table.refresh()
                return
            except transient as exc:
                failure = exc
                time.sleep(0.05 * (attempt + 1))
        warnings.warn(
            f"{location}: committed, but reading it back failed ({failure}); "
            "call refresh() before using this table object again",
            RuntimeWarning,
            stacklevel=3,
        )

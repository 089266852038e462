"""Several commits of icecrypt's table API that reach the catalog as one: what makes
``CREATE TABLE ... AS SELECT``, ``REPLACE TABLE ... AS SELECT`` and an ``ALTER TABLE``
with several kinds of change atomic.

A :class:`Transaction` holds a table object whose metadata store is a
:class:`StagedStore`: every commit made through it (by the ordinary write path, the
commit model and its checks: ``create_metadata``, ``append_files``, ``overwrite_files``,
``update_schema``, ...) writes its ``<NNNNN>-<uuid>.metadata.json`` file as a catalog
table's commit does, but the store keeps the new location to itself instead of swapping
the catalog's pointer.  Nobody else sees any of it: a catalog still names the version it
named, and a path table's readers look for ``v<N>.metadata.json`` and the version hint
only.  :meth:`Transaction.publish` then makes the last of those versions current in one
step:

* a new catalog table: ``catalog.register_table`` (the catalog refuses an identifier
  taken meanwhile);
* an existing catalog table: the catalog's compare-and-swap from the version the
  transaction started on (a commit by anyone else meanwhile is a conflict);
* a path table: ``v<N+1>.metadata.json`` (``v1`` for a new one) created exclusively with
  the last version's content, as every path-table commit creates its version; the
  staged file that content came from is removed, its ancestors stay (the new version's
  metadata log lists them).

:meth:`Transaction.discard` removes what the transaction wrote: its metadata files and
the manifest lists and manifests of the snapshots it added (data files are their
writer's to remove).
"""

from __future__ import annotations

import contextlib
import posixpath
from collections.abc import Mapping
from typing import Any

from icecrypt.errors import CommitConflictError, NoSuchTableError, TableAlreadyExistsError

__all__ = ["StagedStore", "Transaction"]


class StagedStore:
    """A metadata store (``icecrypt.table.commit.store.MetadataStore``) that keeps a
    table's commits to itself: ``current`` is the last version committed through it."""

    def __init__(self, base_location: str | None, base: Mapping[str, Any] | None) -> None:
        self.base_location = base_location
        self.latest = base_location
        self.metadata = dict(base) if base is not None else None
        self.written: list[str] = []

    def current(self) -> str:
        if self.latest is None:
            raise NoSuchTableError("the staged table has no metadata yet")
        return self.latest

    def create(self, new: str, *, metadata: Mapping[str, Any], **_: Any) -> None:
        if self.latest is not None:
            raise CommitConflictError(f"{new}: the staged table exists already")
        self._take(new, metadata)

    def swap(self, expected: str, new: str, *, metadata: Mapping[str, Any], **_: Any) -> None:
        if expected != self.latest:
            raise CommitConflictError(f"{new}: the staged table moved from {expected} to {self.latest}")
        self._take(new, metadata)

    def _take(self, new: str, metadata: Mapping[str, Any]) -> None:
        self.written.append(new)
        self.latest = new
        self.metadata = dict(metadata)

    def __repr__(self) -> str:
        return f"<staged store {self.latest}>"


class Transaction:
    """Commits to one table (new or existing) published together; see the module."""

    def __init__(self, catalog: Any, identifier: tuple[str, ...], table: Any, *, real_store: Any, new: bool) -> None:
        self.catalog = catalog
        self.identifier = tuple(identifier)
        self.table = table  # the object the transaction's commits go through
        self.store: StagedStore = table.metadata_store
        self.real_store = real_store  # a catalog table's store; None for a path table
        self.new = new
        self.base_ids = {s.snapshot_id for s in table.snapshots()}

    @classmethod
    def on(cls, catalog: Any, identifier: tuple[str, ...], table: Any) -> Transaction:
        """A transaction on the existing table ``table`` (as loaded from ``catalog``)."""
        from icecrypt.table import EncryptedTable

        staged = EncryptedTable(table.metadata, table.metadata_location, table.locations, table.kms, pin=table.pin,
                                allowed_locations=table.allowed_locations)
        if staged.encryption_manager is not None:
            # the KEKs the catalog recorded as retired (and the unwrapped ones) are the table's
            staged.encryption_manager.share_kek_cache(table.encryption_manager)
        staged.metadata_store = StagedStore(table.metadata_location, table.metadata)
        return cls(catalog, identifier, staged, real_store=table.metadata_store, new=False)

    @classmethod
    def create(cls, catalog: Any, identifier: tuple[str, ...], location: str, schema: Any, *, kms: Any,
               table_key_id: str | None, partition_spec: Any, properties: Mapping[str, str], filesystem: Any,
               sort_order: Any = None) -> Transaction:
        """A transaction that creates the table ``identifier`` at ``location``."""
        from icecrypt.table import EncryptedTable, Locations
        from icecrypt.table.files.metadata import read_metadata_file
        from icecrypt.table.ops.write import create_metadata

        store = StagedStore(None, None)
        if _is_path_catalog(catalog):
            catalog.begin_staging(location)
        filesystem, path, location_map = create_metadata(
            location, schema, kms=kms, table_key_id=table_key_id, partition_spec=partition_spec,
            sort_order=sort_order, properties=dict(properties), filesystem=filesystem, store=store,
        )  # fmt: skip
        table = EncryptedTable(read_metadata_file(filesystem, path), path, Locations(filesystem, location_map or None),
                               kms)
        table.metadata_store = store
        return cls(catalog, identifier, table, real_store=None, new=True)

    def _recorded(self, path: str) -> str:
        """The location a catalog records for the metadata file at ``path``."""
        for recorded, fs_path in self.table.locations.location_map.items():
            if path == fs_path or path.startswith(fs_path.rstrip("/") + "/"):
                return recorded + path[len(fs_path):]
        return path

    def publish(self) -> None:
        """Make the transaction's last version the table's current one (one step)."""
        from icecrypt.table.commit import store as commits

        latest, metadata = self.store.latest, self.store.metadata
        if latest is None or metadata is None:
            raise NoSuchTableError(f"table {'.'.join(self.identifier)}: nothing was staged")
        filesystem = self.table.filesystem
        if self.real_store is not None:  # an existing catalog table
            if latest != self.store.base_location:
                self.real_store.swap(self.store.base_location, latest, metadata=metadata)
            return
        if self.new and not _is_path_catalog(self.catalog):
            try:
                self.catalog.register_table(self.identifier, self._recorded(latest))
            except TableAlreadyExistsError:
                raise TableAlreadyExistsError(f"catalog {self.catalog.name!r}: table {'.'.join(self.identifier)} "
                                              "was created by another writer meanwhile") from None
            return
        if latest == self.store.base_location:
            return
        metadata_dir = posixpath.dirname(latest)
        if self.new:
            try:
                commits.create_table_metadata(filesystem, metadata_dir, metadata)
            except FileExistsError:
                raise TableAlreadyExistsError(f"table {'.'.join(self.identifier)} was created by another writer "
                                              "meanwhile") from None
            self.catalog.end_staging(posixpath.dirname(metadata_dir))
        else:
            try:
                commits.commit_metadata(filesystem, self.store.base_location, metadata)
            except commits.VersionExistsError:
                raise CommitConflictError(f"table {'.'.join(self.identifier)}: another writer committed since this "
                                          "statement started; nothing was committed") from None
        with contextlib.suppress(OSError):  # the published copy's source: every other staged file is its ancestor
            filesystem.delete_file(latest)

    def discard(self) -> None:
        """Remove what the transaction wrote (best effort): its metadata files and the
        manifest lists and manifests of its snapshots."""
        written = list(self.store.written)
        metadata = self.store.metadata
        files: list[str] = []
        if metadata is not None and written:
            with contextlib.suppress(Exception):
                from icecrypt.table import EncryptedTable

                view = EncryptedTable(metadata, written[-1], self.table.locations, self.table.kms, pin=self.table.pin)
                added = [s for s in view.snapshots() if s.snapshot_id not in self.base_ids]
                ids = {s.snapshot_id for s in added}
                for snapshot in added:
                    files.append(view.fs_path(snapshot.manifest_list, what="manifest list"))
                    for manifest in view.manifests(snapshot):
                        if manifest.added_snapshot_id in ids:
                            files.append(view.fs_path(manifest.path, what="manifest"))
        for path in [*files, *written]:
            with contextlib.suppress(Exception):
                self.table.filesystem.delete_file(path)
        if self.new:  # the directories a new table's staging made, when nothing else is in them
            location = self.table.fs_path(self.table.location, what="table location")
            if _is_path_catalog(self.catalog):
                self.catalog.end_staging(location)
            for directory in (f"{location}/metadata", f"{location}/data", location):
                with contextlib.suppress(Exception):
                    if not self.table.filesystem.get_file_info(_selector(directory)):
                        self.table.filesystem.delete_dir(directory)


def _selector(directory: str) -> Any:
    import pyarrow.fs as pafs

    return pafs.FileSelector(directory, allow_not_found=False, recursive=False)


def _is_path_catalog(catalog: Any) -> bool:
    from icecrypt.spark._sql.catalogs import PathCatalog

    return isinstance(catalog, PathCatalog)

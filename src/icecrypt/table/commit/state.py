"""What the layers above ``commit/`` need of a loaded table: :class:`TableView`.

Reading (``read/``), the operations (``ops/``) and maintenance work on a table object
through this interface, never through the facade's class
(:class:`icecrypt.table.EncryptedTable` implements it), so the facade can import them
while none of them imports the facade.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import pyarrow.fs as pafs
    from pyiceberg.partitioning import PartitionSpec
    from pyiceberg.schema import Schema

    from icecrypt.keys import EncryptionManager, StandardKeyMetadata
    from icecrypt.kms.base import KeyManagementClient
    from icecrypt.table.commit.pin import TablePin
    from icecrypt.table.files.io import Locations
    from icecrypt.table.files.manifest import ManifestFile
    from icecrypt.table.files.metadata import Snapshot

__all__ = ["TableView"]


class TableView(Protocol):
    """One loaded version of a table (its ``metadata.json`` document, where it lies, and
    the keys to read it), as :class:`icecrypt.table.EncryptedTable` holds it."""

    metadata: dict[str, Any]
    metadata_location: str
    locations: Locations
    kms: KeyManagementClient | None
    pin: TablePin | None
    metadata_store: Any
    encryption_manager: EncryptionManager | None

    @property
    def filesystem(self) -> pafs.FileSystem: ...
    @property
    def location(self) -> str: ...
    @property
    def location_map(self) -> dict[str, str]: ...
    @property
    def encrypted(self) -> bool: ...
    @property
    def format_version(self) -> int: ...
    @property
    def properties(self) -> dict[str, str]: ...
    @property
    def schema(self) -> Schema: ...
    @property
    def specs(self) -> dict[int, PartitionSpec]: ...
    @property
    def current_snapshot_id(self) -> int | None: ...

    def fs_path(self, location: str, *, what: str = "file") -> str: ...
    def schema_for(self, snapshot: Snapshot | None) -> Schema: ...
    def snapshots(self) -> list[Snapshot]: ...
    def current_snapshot(self) -> Snapshot | None: ...
    def snapshot(self, snapshot_id: int) -> Snapshot: ...
    def manifest_list_key_metadata(self, snapshot: Snapshot) -> StandardKeyMetadata | None: ...
    def manifests(self, snapshot: Snapshot) -> list[ManifestFile]: ...
    def refresh(self) -> Any: ...

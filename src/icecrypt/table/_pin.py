"""What a loaded table object takes from a trusted source and holds fixed.

``metadata.json`` is not authenticated (in Iceberg or here): whoever can write the table's
storage can write a new version.  A table object therefore *pins* what must not change
behind its back -- whether the table is encrypted, its master key id (``encryption.key-id``),
its UUID and where it lives -- from the caller, the catalog database, or else the version it
first loaded, and checks every version it builds on against the pin.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ENCRYPTION_TABLE_KEY = "encryption.key-id"
WRITE_DATA_PATH = "write.data.path"
WRITE_METADATA_PATH = "write.metadata.path"

__all__ = ["TablePin"]


@dataclass(frozen=True)
class TablePin:
    """The identity a table object holds fixed.

    ``encrypted`` / ``table_key_id``: whether the table is encrypted and under which KMS
    master key; ``table_uuid``: ``table-uuid``; ``location``: the recorded table location;
    ``data_location`` / ``metadata_dir``: ``write.data.path`` / ``write.metadata.path`` when
    the table sets them (None otherwise); ``source``: where the pin came from
    (``"caller"``, ``"catalog"`` or ``"loaded version"``), for error messages."""

    encrypted: bool
    table_key_id: str | None
    table_uuid: str | None
    location: str
    data_location: str | None = None
    metadata_dir: str | None = None
    source: str = "loaded version"

    @classmethod
    def from_metadata(cls, metadata: dict[str, Any], *, source: str = "loaded version") -> TablePin:
        properties = metadata.get("properties") or {}
        key_id = properties.get(ENCRYPTION_TABLE_KEY) or None
        return cls(
            encrypted=key_id is not None,
            table_key_id=key_id,
            table_uuid=metadata.get("table-uuid"),
            location=str(metadata.get("location") or "").rstrip("/"),
            data_location=(properties.get(WRITE_DATA_PATH) or "").rstrip("/") or None,
            metadata_dir=(properties.get(WRITE_METADATA_PATH) or "").rstrip("/") or None,
            source=source,
        )

    def roots(self) -> tuple[str, ...]:
        """Every location under which the table's files may live."""
        return tuple(r for r in (self.location, self.data_location, self.metadata_dir) if r)

"""What a loaded table object takes from a trusted source and holds fixed.

``metadata.json`` is not authenticated (in Iceberg or here): whoever can write the table's
storage can write a new version.  A table object therefore *pins* what must not change
behind its back -- whether the table is encrypted, its master key id (``encryption.key-id``),
its UUID and where it lives -- from the caller, the catalog database, or else the version it
first loaded, and checks every version it builds on against the pin.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from icecrypt.errors import TableIdentityError

ENCRYPTION_TABLE_KEY = "encryption.key-id"
WRITE_DATA_PATH = "write.data.path"
WRITE_METADATA_PATH = "write.metadata.path"

__all__ = ["TablePin", "check_pin", "trusted_pin"]


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

    def differences(self, metadata: dict[str, Any]) -> list[tuple[str, Any, Any]]:
        """What ``metadata`` changes of this pin: ``(field, pinned, found)`` triples."""
        found = TablePin.from_metadata(metadata)
        changes: list[tuple[str, Any, Any]] = []
        if self.encrypted != found.encrypted or self.table_key_id != found.table_key_id:
            changes.append((ENCRYPTION_TABLE_KEY, self.table_key_id, found.table_key_id))
        if self.table_uuid is not None and self.table_uuid != found.table_uuid:
            changes.append(("table-uuid", self.table_uuid, found.table_uuid))
        for name, pinned, now in (
            ("location", self.location, found.location),
            (WRITE_DATA_PATH, self.data_location, found.data_location),
            (WRITE_METADATA_PATH, self.metadata_dir, found.metadata_dir),
        ):
            if pinned != now:
                changes.append((name, pinned or None, now or None))
        return changes

    def check(self, metadata: dict[str, Any], metadata_location: str) -> None:
        """Refuse (:class:`~icecrypt.errors.TableIdentityError`, naming the file and what
        changed) a version that disagrees with this pin."""
        changes = self.differences(metadata)
        if changes:
            raise TableIdentityError(
                f"{metadata_location}: {'; '.join(_describe(self, *change) for change in changes)} "
                f"(pinned from the {self.source}); refused, nothing written",
                metadata_location=metadata_location, changes=tuple(changes), source=self.source,
            )  # fmt: skip

    def rotated(self, new_table_key_id: str) -> TablePin:
        """This pin after this object's own master-key rotation to ``new_table_key_id``."""
        return replace(self, encrypted=True, table_key_id=new_table_key_id)


def _describe(pin: TablePin, name: str, pinned: Any, found: Any) -> str:
    if name == ENCRYPTION_TABLE_KEY:
        if pinned is None:
            return f"encryption added ({ENCRYPTION_TABLE_KEY} {found!r}, the table is pinned as plaintext)"
        if found is None:
            return f"encryption removed (no {ENCRYPTION_TABLE_KEY}; the table is pinned as encrypted under {pinned!r})"
        return (
            f"master key changed ({ENCRYPTION_TABLE_KEY} {found!r}, pinned {pinned!r}; after a rotation by "
            "another writer, load the table again with table_key_id= the new key id)"
        )
    return f"{name} changed ({found!r}, pinned {pinned!r})"


def trusted_pin(
    metadata: dict[str, Any], *, table_key_id: str | None = None, table_uuid: str | None = None, source: str = "caller"
) -> TablePin:
    """The pin of a table object about to install its first version ``metadata``: the
    trusted ``table_key_id`` / ``table_uuid`` (from ``source``) where given, the rest
    from ``metadata`` (which is then checked against it)."""
    pin = TablePin.from_metadata(metadata)
    if table_key_id is None and table_uuid is None:
        return pin
    if table_key_id is not None:
        pin = replace(pin, encrypted=True, table_key_id=str(table_key_id))
    if table_uuid is not None:
        pin = replace(pin, table_uuid=str(table_uuid))
    return replace(pin, source=source)


def check_pin(table: Any, metadata: dict[str, Any], metadata_location: str) -> None:
    """Refuse a version ``table`` (an EncryptedTable) would build on or read through when it
    disagrees with the table object's pin (no-op before the first version is installed)."""
    pin = getattr(table, "pin", None)
    if pin is not None:
        pin.check(metadata, metadata_location)


# --- the pin a catalog keeps in its database (icecrypt.catalog) ----------------------------

#: names of the pinned values in a catalog's record (SQL columns, Glue table parameters)
CATALOG_KEY_ID = "icecrypt.table-key-id"
CATALOG_UUID = "icecrypt.table-uuid"
#: the table's roots (``location``, ``write.data.path``, ``write.metadata.path``): recorded
#: for every table, plaintext too; a record with CATALOG_LOCATION holds all three (a path
#: absent from it is one the table does not set)
CATALOG_LOCATION = "icecrypt.location"
CATALOG_DATA_PATH = "icecrypt.write-data-path"
CATALOG_METADATA_PATH = "icecrypt.write-metadata-path"
#: KEKs retired by the table's own rotations and rekeys, JSON ``[[kek id, sha256 hex of the
#: wrapped KEK bytes or null], ...]``, oldest first, the last MAX_RETIRED_KEKS kept
CATALOG_RETIRED_KEKS = "icecrypt.retired-keks"
CATALOG_ROOTS = (CATALOG_LOCATION, CATALOG_DATA_PATH, CATALOG_METADATA_PATH)
CATALOG_KEYS = (CATALOG_KEY_ID, CATALOG_UUID, *CATALOG_ROOTS, CATALOG_RETIRED_KEKS)
MAX_RETIRED_KEKS = 1000

_ROOT_NAMES = {CATALOG_LOCATION: "location", CATALOG_DATA_PATH: WRITE_DATA_PATH, CATALOG_METADATA_PATH: WRITE_METADATA_PATH}


def _roots_record(pin: TablePin) -> dict[str, str]:
    record = {CATALOG_LOCATION: pin.location}
    if pin.data_location:
        record[CATALOG_DATA_PATH] = pin.data_location
    if pin.metadata_dir:
        record[CATALOG_METADATA_PATH] = pin.metadata_dir
    return record


def catalog_record(metadata: dict[str, Any]) -> dict[str, str]:
    """What a catalog records for a table version: its roots (every table) and UUID, and
    its key id when encrypted."""
    pin = TablePin.from_metadata(metadata)
    record = _roots_record(pin)
    if pin.encrypted:
        record[CATALOG_KEY_ID] = str(pin.table_key_id)
    if pin.table_uuid:
        record[CATALOG_UUID] = str(pin.table_uuid)
    return record


def adopt_record(recorded: dict[str, str] | None, metadata: dict[str, Any], *, key_id: bool = False) -> dict[str, str]:
    """``recorded`` completed from ``metadata`` (a version checked against it): roots and
    UUID where the record has none, and with ``key_id`` the key id and UUID of
    ``metadata`` (the caller's word, see ``Catalog.load_table``)."""
    found = catalog_record(metadata)
    record = dict(recorded or {})
    if not record.get(CATALOG_LOCATION):
        for key in CATALOG_ROOTS:
            record.pop(key, None)
        record.update({k: v for k, v in found.items() if k in CATALOG_ROOTS})
    if key_id or not record.get(CATALOG_KEY_ID):
        for key in (CATALOG_KEY_ID, CATALOG_UUID):
            if found.get(key):
                record[key] = found[key]
    elif not record.get(CATALOG_UUID) and found.get(CATALOG_UUID):
        record[CATALOG_UUID] = found[CATALOG_UUID]
    return record


def retired_keks(record: dict[str, str] | None) -> list[tuple[str, str | None]]:
    """The (KEK id, SHA-256 hex of its wrapped bytes or None) pairs a record keeps."""
    import json

    raw = (record or {}).get(CATALOG_RETIRED_KEKS)
    if not raw:
        return []
    try:
        items = json.loads(raw)
    except ValueError:
        return []
    return [(str(i[0]), str(i[1]) if i[1] else None) for i in items if isinstance(i, list) and len(i) == 2 and i[0]]


def _with_retired(record: dict[str, str], retired: Any) -> dict[str, str]:
    import json

    known = retired_keks(record)
    seen = set(known)
    for item in retired or ():
        item = (str(item[0]), item[1])
        if item not in seen:
            seen.add(item)
            known.append(item)
    if known:
        record[CATALOG_RETIRED_KEKS] = json.dumps([list(i) for i in known[-MAX_RETIRED_KEKS:]], separators=(",", ":"))
    return record


def catalog_commit(
    recorded: dict[str, str] | None,
    metadata: dict[str, Any],
    new_location: str,
    what: str,
    *,
    rotate_to: str | None = None,
    retired: Any = None,
) -> dict[str, str] | None:
    """Check a commit of ``metadata`` (file ``new_location``) against the pin a catalog
    recorded for the table ``what``; returns the record to store with the commit (None:
    unchanged).  A commit that removes or changes ``encryption.key-id`` of a pinned
    table, changes its UUID or any of its recorded roots (``location``,
    ``write.data.path``, ``write.metadata.path``) is refused (TableIdentityError) -- except
    the explicit master-key rotation to ``rotate_to``, which the catalog then records.  A
    table without a record gets one (roots, UUID; key id at its first encrypted commit).
    ``retired``: (KEK id, wrapped-bytes digest) pairs this commit's rotation retired,
    added to the record."""
    found = catalog_record(metadata)
    record = dict(recorded or {})
    key_id, uuid = record.get(CATALOG_KEY_ID), record.get(CATALOG_UUID)
    found_key = found.get(CATALOG_KEY_ID)
    changes: list[tuple[str, Any, Any]] = []
    if key_id and found_key != key_id and not (rotate_to is not None and found_key == rotate_to):
        changes.append((ENCRYPTION_TABLE_KEY, key_id, found_key))
    if uuid and metadata.get("table-uuid") != uuid:
        changes.append(("table-uuid", uuid, metadata.get("table-uuid")))
    if record.get(CATALOG_LOCATION):
        for key in CATALOG_ROOTS:
            if record.get(key) != found.get(key):
                changes.append((_ROOT_NAMES[key], record.get(key), found.get(key)))
    if changes:
        pin = TablePin(bool(key_id), key_id, uuid, "", source="catalog")
        raise TableIdentityError(
            f"{what}: commit of {new_location} refused: {'; '.join(_describe(pin, *change) for change in changes)} "
            "(pinned in the catalog); only the table's master-key rotation changes encryption.key-id, "
            "and a table's location and write paths do not change",
            metadata_location=new_location, changes=tuple(changes), source="catalog",
        )  # fmt: skip
    if key_id and found_key != key_id:  # the rotation
        record[CATALOG_KEY_ID] = str(found_key)
    record = _with_retired(adopt_record(record, metadata), retired)
    return None if record == (recorded or {}) else record


def catalog_pin(
    recorded: dict[str, str] | None, metadata: dict[str, Any], *, table_key_id: str | None = None
) -> TablePin:
    """The pin of a table a catalog loads: the caller's ``table_key_id`` when given, else
    the catalog's record (source "catalog"), else the version loaded; the roots are the
    catalog's record when it has them (the version's otherwise)."""
    recorded = recorded or {}
    if table_key_id is not None:
        pin = trusted_pin(metadata, table_key_id=table_key_id, table_uuid=recorded.get(CATALOG_UUID))
    elif recorded.get(CATALOG_KEY_ID):
        pin = trusted_pin(
            metadata, table_key_id=recorded[CATALOG_KEY_ID], table_uuid=recorded.get(CATALOG_UUID), source="catalog"
        )
    elif recorded.get(CATALOG_UUID):
        pin = trusted_pin(metadata, table_uuid=recorded[CATALOG_UUID], source="catalog")
    else:
        pin = TablePin.from_metadata(metadata)
    if recorded.get(CATALOG_LOCATION):
        pin = replace(
            pin, location=recorded[CATALOG_LOCATION], data_location=recorded.get(CATALOG_DATA_PATH) or None,
            metadata_dir=recorded.get(CATALOG_METADATA_PATH) or None,
            source=pin.source if pin.source == "caller" else "catalog",
        )  # fmt: skip
    return pin


def check_unambiguous(store: Any, filesystem: Any, metadata_location: str, metadata: dict[str, Any]) -> None:
    """Before maintenance deletes files: refuse (TableVersionError) while a path table
    (``store`` None; a catalog decides for its tables) has a newer version than
    ``metadata_location`` that its version hint does not name -- what that version
    references would look unreferenced (``_commit.check_unambiguous``)."""
    if store is None:
        from icecrypt.table.commit.store import check_unambiguous as check

        check(filesystem, metadata_location, metadata)

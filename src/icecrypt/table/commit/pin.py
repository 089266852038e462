"""What a loaded table object takes from a trusted source and holds fixed.

``metadata.json`` is not authenticated (in Iceberg or here): whoever can write the table's
storage can write a new version.  A table object therefore *pins* what must not change
behind its back -- whether the table is encrypted, its master key id (``encryption.key-id``),
its UUID and where it lives -- from the caller, the catalog database, or else the version it
first loaded, and checks every version it builds on against the pin.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass, replace
from typing import Any

from icecrypt.errors import PathOutsideTableError, TableIdentityError

ENCRYPTION_TABLE_KEY = "encryption.key-id"
ENCRYPTION_DEK_LENGTH = "encryption.data-key-length"
#: Iceberg's default length of data keys (and KEKs), when the property is absent
DEFAULT_DATA_KEY_LENGTH = 16
WRITE_DATA_PATH = "write.data.path"
WRITE_METADATA_PATH = "write.metadata.path"

__all__ = ["Anchor", "TablePin", "check_pin", "trusted_pin"]


@dataclass(frozen=True)
class TablePin:
    """The identity a table object holds fixed.

    ``encrypted`` / ``table_key_id``: whether the table is encrypted and under which KMS
    master key; ``data_key_length``: the length of its data keys and KEKs
    (``encryption.data-key-length``, 16 when absent; None for a plaintext table: a version
    may not lower it, as Java's Hive catalog pins it too); ``table_uuid``: ``table-uuid``;
    ``location``: the recorded table location;
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
    data_key_length: int | None = None

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
            data_key_length=_data_key_length(properties) if key_id is not None else None,
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
        elif (
            self.encrypted and self.data_key_length is not None and found.data_key_length != self.data_key_length
        ):  # fmt: skip
            changes.append((ENCRYPTION_DEK_LENGTH, self.data_key_length, found.data_key_length))
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


def _data_key_length(properties: dict[str, Any]) -> int | None:
    """``encryption.data-key-length`` as a number (16 when absent; None when it is not
    one: a version with such a value disagrees with every pin)."""
    raw = properties.get(ENCRYPTION_DEK_LENGTH)
    if raw is None:
        return DEFAULT_DATA_KEY_LENGTH
    text = str(raw).strip()
    return int(text) if text.isascii() and text.isdigit() else None


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
    if name == ENCRYPTION_DEK_LENGTH:
        return f"data key length changed ({ENCRYPTION_DEK_LENGTH} {found!r}, pinned {pinned!r})"
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


@dataclass
class Anchor:
    """Where a fresh load of a table by path was pointed: the only word on which table it
    is that does not come from storage.

    ``table_dir``: the table directory (normalized filesystem path) -- the directory
    holding the ``metadata/`` directory of the metadata file loaded (a table directory,
    its ``metadata/`` or a file in it, as the caller named it); None when the file lies
    in no ``metadata/`` directory.  ``pin``: a pin from a trusted source instead (the
    driver's table object), which the version must match.  ``data_location``: the
    caller's word for ``write.data.path``, when it lies outside the table directory."""

    locations: Any  # icecrypt.table.files.io.Locations (unconfined)
    metadata_path: str
    table_dir: str | None
    pin: TablePin | None = None
    data_location: str | None = None

    @classmethod
    def of(cls, locations: Any, metadata_path: str, *, pin: TablePin | None = None, data_location: str | None = None) -> Anchor:
        from icecrypt._paths import normalize_path

        path = normalize_path(metadata_path)
        metadata_dir = posixpath.dirname(path)
        table_dir = posixpath.dirname(metadata_dir) if posixpath.basename(metadata_dir) == "metadata" else None
        return cls(locations, metadata_path, table_dir, pin, data_location)

    def _fs(self, location: Any, what: str) -> str:
        if not isinstance(location, str) or not location:
            raise TableIdentityError(
                f"{self.metadata_path}: {what} is missing or not a string (refused)",
                metadata_location=self.metadata_path, changes=((what, None, location),), source="caller",
            )  # fmt: skip
        try:
            return self.locations.normalized_fs_path(location)
        except (PathOutsideTableError, ValueError) as exc:
            raise TableIdentityError(
                f"{self.metadata_path}: {what} {location!r} cannot be a location of this table ({exc}); refused",
                metadata_location=self.metadata_path, changes=((what, self.table_dir, location),), source="caller",
            ) from None  # fmt: skip

    def _same_dir(self, a: str, b: str) -> bool:
        if a == b:
            return True
        import pyarrow.fs as pafs

        local = isinstance(self.locations.filesystem, pafs.LocalFileSystem)
        return local and os.path.realpath(a) == os.path.realpath(b)

    def check_location(self, metadata: dict[str, Any]) -> None:
        """Refuse (TableIdentityError) a version that is not the table the caller named:
        its ``location`` is another directory, or the metadata file does not lie in
        ``<location>/metadata/`` (nor, with a trusted pin, in the pinned
        ``write.metadata.path``)."""
        from icecrypt.table.files.io import _below

        path = self.metadata_path
        if self.pin is not None:
            if str(metadata.get("location") or "").rstrip("/") != self.pin.location:
                self.pin.check(metadata, path)  # names what changed
            homes = [f"{self.pin.location}/metadata"] + ([self.pin.metadata_dir] if self.pin.metadata_dir else [])
            file_dir = posixpath.dirname(path)
            if not any(_below(file_dir, self._fs(home, "metadata directory")) is not None for home in homes):
                raise TableIdentityError(
                    f"{path}: the metadata file lies outside the table's metadata directories "
                    f"({', '.join(homes)}); refused",
                    metadata_location=path, changes=(("metadata file", homes[0], path),), source=self.pin.source,
                )  # fmt: skip
            return
        if self.table_dir is None:
            raise TableIdentityError(
                f"{path}: the metadata file does not lie in a table's metadata/ directory, so a load by path cannot "
                "tell which table it belongs to (refused: load it through its catalog, or from its table "
                "directory)",
                metadata_location=path, changes=(("metadata file", None, path),), source="caller",
            )  # fmt: skip
        location = self._fs(metadata.get("location"), "location")
        if not self._same_dir(location, self.table_dir):
            raise TableIdentityError(
                f"{path}: its location {metadata.get('location')!r} is not the table directory {self.table_dir} it was "
                "loaded from (refused: a version cannot move a table; whoever wrote it could otherwise point "
                "maintenance at any directory)",
                metadata_location=path, changes=(("location", self.table_dir, metadata.get("location")),),
                source="caller",
            )  # fmt: skip

    def check_roots(self, metadata: dict[str, Any], metadata_location: str, *, authenticated: bool) -> None:
        """Refuse (TableIdentityError) a ``write.data.path`` / ``write.metadata.path``
        outside the table directory, unless the caller named it (``data_location``), a
        trusted pin holds it, or the version is ``authenticated`` (its content is then the
        word of a holder of the master key)."""
        from icecrypt.table.files.io import _below

        if self.pin is not None or authenticated or self.table_dir is None:
            return
        properties = metadata.get("properties") or {}
        for name in (WRITE_DATA_PATH, WRITE_METADATA_PATH):
            value = properties.get(name)
            if not value:
                continue
            root = self._fs(value, name)
            if _below(root, self.table_dir) is not None:
                continue
            if name == WRITE_DATA_PATH and self.data_location and self._same_dir(
                root, self._fs(self.data_location, "data_location")
            ):  # fmt: skip
                continue
            hint = " (pass data_location= that path if it is where this table's data lives)" if name == WRITE_DATA_PATH else ""
            raise TableIdentityError(
                f"{metadata_location}: {name} {value!r} lies outside the table directory {self.table_dir}, and the "
                f"version is not authenticated: a load by path trusts only the directory it is given{hint}; refused",
                metadata_location=metadata_location, changes=((name, None, value),), source="caller",
            )  # fmt: skip


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
#: an encrypted table's ``encryption.data-key-length`` (decimal)
CATALOG_DEK_LENGTH = "icecrypt.data-key-length"
#: the SHA-256 (hex) of the bytes of the current metadata file, and the metadata location it
#: was recorded for (as the catalog records locations): a file changed in place is refused
#: (icecrypt.table.commit.authenticity); a current location other than the digest's is a
#: commit by another engine, admitted and recorded
CATALOG_DIGEST = "icecrypt.metadata-sha256"
CATALOG_DIGEST_OF = "icecrypt.metadata-sha256-of"
CATALOG_ROOTS = (CATALOG_LOCATION, CATALOG_DATA_PATH, CATALOG_METADATA_PATH)
CATALOG_KEYS = (
    CATALOG_KEY_ID, CATALOG_UUID, *CATALOG_ROOTS, CATALOG_RETIRED_KEKS, CATALOG_DEK_LENGTH, CATALOG_DIGEST,
    CATALOG_DIGEST_OF,
)  # fmt: skip
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
        if pin.data_key_length is not None:
            record[CATALOG_DEK_LENGTH] = str(pin.data_key_length)
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
        for key in (CATALOG_KEY_ID, CATALOG_UUID, CATALOG_DEK_LENGTH):
            if found.get(key):
                record[key] = found[key]
    elif not record.get(CATALOG_DEK_LENGTH) and found.get(CATALOG_DEK_LENGTH):
        record[CATALOG_DEK_LENGTH] = found[CATALOG_DEK_LENGTH]
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
    recorded_length = record.get(CATALOG_DEK_LENGTH)
    if key_id and recorded_length and found_key and found.get(CATALOG_DEK_LENGTH) != recorded_length:
        changes.append((ENCRYPTION_DEK_LENGTH, recorded_length, found.get(CATALOG_DEK_LENGTH)))
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
    length = recorded.get(CATALOG_DEK_LENGTH)
    if pin.encrypted and length and length.isascii() and length.isdigit():
        pin = replace(pin, data_key_length=int(length))
    return pin


def check_unambiguous(store: Any, filesystem: Any, metadata_location: str, metadata: dict[str, Any]) -> None:
    """Before maintenance deletes files: refuse (TableVersionError) while a path table
    (``store`` None; a catalog decides for its tables) has a newer version than
    ``metadata_location`` that its version hint does not name -- what that version
    references would look unreferenced (``_commit.check_unambiguous``)."""
    if store is None:
        from icecrypt.table.commit.store import check_unambiguous as check

        check(filesystem, metadata_location, metadata)

"""Authenticated table metadata: what makes a version of an encrypted table unforgeable.

``metadata.json`` is not authenticated in Iceberg: whoever can write a table's storage can
write a version.  icecrypt adds an *authenticator* to every version it writes of an
encrypted table: a top-level field that Iceberg Java and PyIceberg ignore (their parsers
drop unknown fields, so a version they commit carries none)::

    "icecrypt-authenticator": {
      "format": 1,
      "key-id": "<id of the metadata key>",
      "encrypted-by-id": "<the table's master key id>",
      "wrapped-key": "<base64: the metadata key, wrapped by the KMS under that master key>",
      "file": "v7.metadata.json",          (the name of the file it authenticates)
      "previous": "<base64 tag of the version this one was committed on>" or null,
      "tag": "<base64: nonce(12) || GMAC tag(16)>"
    }

The tag is AES-256-GCM over an empty plaintext (GMAC) under the *metadata key*, a random
32-byte key that only the KMS can unwrap (only a holder of the master key can make one
or use one), with the additional data::

    "icecrypt metadata authenticator" 0x00 "v1" 0x00
    || for key-id, encrypted-by-id, wrapped-key (base64), file, previous (base64 or ""):
           uint32 big-endian length || UTF-8 bytes
    || SHA-256 of the document without the field, serialized as icecrypt writes metadata
       (compact JSON, field order kept; the field is the last member of the file, so a
       reader hashes the bytes before it instead of serializing again)

So the tag covers every byte a reader uses (snapshots, summaries, properties, refs,
``encryption-keys``, the location), binds the version to its file name (a version copied
under another name fails) and chains it to the version before it (``previous``).  The
metadata key stays the same from version to version (a new one after a master-key
rotation); it is cached with the table's KEKs.

Who writes one: every commit of an encrypted table on top of an authenticated version,
every new encrypted table, and :func:`authenticate_metadata` (the explicit adoption of an
unauthenticated version, after a Java commit or for a table made before this existed).
A commit on top of an *unauthenticated* version writes none: an authenticator would vouch
for content nobody verified.

What readers check (:func:`check_version`): an authenticator present is always verified
(unwrapped under the table's pinned master key, file name, tag); a table object loaded
with ``require_authenticated_metadata`` refuses a version without one, and a table object
that has held an authenticated version refuses unauthenticated ones afterwards and
accepts a newer version only if its chain of ``previous`` tags, through the files its
``metadata-log`` names, leads back to the version it held.  Catalog tables are also
checked against the SHA-256 of the file the catalog recorded at the commit
(:class:`~icecrypt.table.files.metadata.MetadataDocument`, ``catalog._base``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import posixpath
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from icecrypt.errors import AuthenticationError, FormatError, KmsInvalidWrappedKeyError, TableIntegrityError
from icecrypt.table.files.metadata import AUTHENTICATOR_FIELD, serialize_metadata

__all__ = [
    "FIELD",
    "Authenticator",
    "Sealer",
    "check_digest",
    "check_version",
    "is_authenticated",
    "strip",
]

#: the top-level field of metadata.json that holds a version's authenticator
FIELD = AUTHENTICATOR_FIELD
FORMAT = 1
_DOMAIN = b"icecrypt metadata authenticator\x00v1\x00"
_NONCE_AND_TAG = 28  # GcmKey.seal of an empty plaintext: nonce(12) || tag(16)
#: longest id or file name an authenticator may carry (a bound, not a format rule)
_MAX_TEXT = 4096


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: Any, what: str, location: str) -> bytes:
    if not isinstance(text, str):
        raise _malformed(location, f"{what} is not a string")
    try:
        data = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise _malformed(location, f"{what} is not base64") from None
    if _b64(data) != text:  # one spelling per value: unused padding bits set are a change too
        raise _malformed(location, f"{what} is not canonical base64")
    return data


def _malformed(location: str, what: str) -> TableIntegrityError:
    return TableIntegrityError(
        f"{location}: malformed {FIELD} ({what}); refused", metadata_location=location, reason="malformed authenticator"
    )


@dataclass(frozen=True)
class Authenticator:
    """A version's authenticator, as parsed (its tag not yet checked)."""

    key_id: str
    encrypted_by_id: str
    wrapped_key: bytes
    file: str
    previous: bytes | None
    tag: bytes

    @classmethod
    def from_json(cls, raw: Any, location: str) -> Authenticator:
        if not isinstance(raw, Mapping):
            raise _malformed(location, "not a JSON object")
        if raw.get("format") != FORMAT or isinstance(raw.get("format"), bool):
            raise _malformed(location, f"format {raw.get('format')!r}, expected {FORMAT}")
        texts = {}
        for name in ("key-id", "encrypted-by-id", "file"):
            value = raw.get(name)
            if not isinstance(value, str) or not value or len(value) > _MAX_TEXT:
                raise _malformed(location, f"{name} is not a non-empty string")
            texts[name] = value
        previous = raw.get("previous")
        tag = _unb64(raw.get("tag"), "tag", location)
        if len(tag) != _NONCE_AND_TAG:
            raise _malformed(location, f"tag of {len(tag)} bytes, expected {_NONCE_AND_TAG}")
        return cls(
            key_id=texts["key-id"],
            encrypted_by_id=texts["encrypted-by-id"],
            wrapped_key=_unb64(raw.get("wrapped-key"), "wrapped-key", location),
            file=texts["file"],
            previous=None if previous is None else _unb64(previous, "previous", location),
            tag=tag,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "key-id": self.key_id,
            "encrypted-by-id": self.encrypted_by_id,
            "wrapped-key": _b64(self.wrapped_key),
            "file": self.file,
            "previous": None if self.previous is None else _b64(self.previous),
            "tag": _b64(self.tag),
        }


def _additional_data(
    key_id: str, encrypted_by_id: str, wrapped_key: bytes, file: str, previous: bytes | None, body_sha256: bytes
) -> bytes:
    parts = [_DOMAIN]
    for text in (key_id, encrypted_by_id, _b64(wrapped_key), file, "" if previous is None else _b64(previous)):
        raw = text.encode("utf-8")
        parts += [struct.pack(">I", len(raw)), raw]
    parts.append(body_sha256)
    return b"".join(parts)


def _body_sha256(document: Mapping[str, Any]) -> bytes:
    """SHA-256 of the document without its authenticator, as icecrypt serializes it: from
    the bytes read when the file ends with the authenticator member exactly as icecrypt
    writes it (``MetadataDocument.body``; nothing follows it, so the text before it parses
    to the rest of the document), else by serializing the rest again."""
    body = getattr(document, "body", None)
    if body is not None:
        digest, member = body
        expected = b"".join((b',"', FIELD.encode("ascii"), b'":', serialize_metadata(document[FIELD]), b"}"))
        if member == expected:
            return digest
    return hashlib.sha256(serialize_metadata(strip(document))).digest()


def strip(document: Mapping[str, Any]) -> dict[str, Any]:
    """``document`` without its authenticator (a shallow copy, field order kept)."""
    return {k: v for k, v in document.items() if k != FIELD}


def is_authenticated(document: Mapping[str, Any]) -> bool:
    """Whether ``document`` carries an authenticator (verified or not)."""
    return FIELD in document


@dataclass(frozen=True)
class Sealer:
    """What a commit needs to authenticate the version it writes: the metadata key (its
    id, wrapped bytes, the master key that wraps it, and the key itself) and the tag of
    the version it is committed on (None: the start of a chain)."""

    key_id: str
    encrypted_by_id: str
    wrapped_key: bytes
    key: Any  # icecrypt._gcm.GcmKey
    previous: bytes | None

    def seal(self, metadata: dict[str, Any], file_name: str) -> bytes:
        """The bytes of ``metadata`` as the file ``file_name``, with its authenticator
        last; ``metadata`` gets the field too (in place), so that what a table object
        holds after the commit is what the file says."""
        metadata.pop(FIELD, None)
        body = serialize_metadata(metadata)
        aad = _additional_data(
            self.key_id, self.encrypted_by_id, self.wrapped_key, file_name, self.previous, hashlib.sha256(body).digest()
        )
        authenticator = Authenticator(
            self.key_id, self.encrypted_by_id, self.wrapped_key, file_name, self.previous, self.key.seal(b"", aad)
        )
        field = authenticator.to_json()
        metadata[FIELD] = field
        if body == b"{}":
            return serialize_metadata(metadata)
        return b"".join((body[:-1], b",", serialize_metadata({FIELD: field})[1:]))


def seal_or_plain(metadata: dict[str, Any], file_name: str, sealer: Sealer | None) -> bytes:
    """The bytes to store for ``metadata`` as the file ``file_name``: authenticated by
    ``sealer``, or without any authenticator (a stale one copied from the base removed)."""
    if sealer is not None:
        return sealer.seal(metadata, file_name)
    metadata.pop(FIELD, None)
    return serialize_metadata(metadata)


def sealer_for(manager: Any, base: Authenticator | None, *, new_key: bool = False) -> Sealer:
    """The sealer of a version committed with ``manager`` (the encryption manager of the
    commit) on top of a version whose verified authenticator is ``base`` (None: a new
    chain).  The base's metadata key is kept unless ``new_key`` (a master-key rotation:
    the key is then new, wrapped under the new master key) or it is wrapped under
    another master key than the manager's."""
    previous = None if base is None else base.tag
    if base is not None and not new_key and base.encrypted_by_id == manager.table_key_id:
        key = manager.unwrap_metadata_key(base.key_id, base.wrapped_key)
        return Sealer(base.key_id, base.encrypted_by_id, base.wrapped_key, key, previous)
    key_id, wrapped, key = manager.new_metadata_key()
    return Sealer(key_id, manager.table_key_id, wrapped, key, previous)


def verify(document: Mapping[str, Any], location: str, manager: Any, *, table_key_id: str | None) -> Authenticator | None:
    """The verified authenticator of ``document`` (read from ``location``), or None when
    it has none.  TableIntegrityError when it is malformed, names another file, is
    wrapped under another master key than ``table_key_id`` (the pinned one), does not
    unwrap, or its tag fails.  ``manager``: an encryption manager of the table under its
    pinned master key (None: a plaintext table, whose authenticator proves nothing)."""
    raw = document.get(FIELD)
    if raw is None:
        return None
    auth = Authenticator.from_json(raw, location)
    name = posixpath.basename(location.rstrip("/"))
    if auth.file != name:
        raise TableIntegrityError(
            f"{location}: its authenticator is for the file {auth.file!r}, not {name!r} (a version copied under "
            "another name); refused",
            metadata_location=location, reason="authenticator of another file",
        )  # fmt: skip
    if manager is None or table_key_id is None:
        raise TableIntegrityError(
            f"{location}: an authenticator in a table that is not encrypted proves nothing (refused)",
            metadata_location=location, reason="authenticator without encryption",
        )  # fmt: skip
    if auth.encrypted_by_id != table_key_id:
        raise TableIntegrityError(
            f"{location}: its authenticator's key is wrapped under master key {auth.encrypted_by_id!r}, not the "
            f"table's {table_key_id!r}; refused",
            metadata_location=location, reason="authenticator under another master key",
        )  # fmt: skip
    try:
        key = manager.unwrap_metadata_key(auth.key_id, auth.wrapped_key)
    except KmsInvalidWrappedKeyError as exc:  # other KMS errors (unreachable, no access) are no verdict: raised
        raise TableIntegrityError(
            f"{location}: its metadata key {auth.key_id!r} does not unwrap under master key {table_key_id!r} "
            f"({type(exc).__name__}: the KMS holds another key of that id, or the authenticator was tampered "
            "with); refused",
            metadata_location=location, reason="metadata key does not unwrap",
        ) from exc  # fmt: skip
    aad = _additional_data(
        auth.key_id, auth.encrypted_by_id, auth.wrapped_key, auth.file, auth.previous, _body_sha256(document)
    )
    try:
        key.open(auth.tag, aad)
    except (AuthenticationError, FormatError):
        raise TableIntegrityError(
            f"{location}: the metadata authenticator does not verify: the file was changed after it was written "
            "(or its authenticator was taken from another version); refused",
            metadata_location=location, reason="authenticator tag check failed",
        ) from None  # fmt: skip
    return auth


def own_authenticator(document: Mapping[str, Any], location: str) -> Authenticator | None:
    """The authenticator of a document this process just committed (made by
    :meth:`Sealer.seal`: nothing to verify), None when it has none."""
    raw = document.get(FIELD)
    return None if raw is None else Authenticator.from_json(raw, location)


# --- what a table object checks of every version it installs or builds on -----------------


def _manager_for(table: Any, document: Mapping[str, Any], manager: Any) -> Any:
    """An encryption manager to unwrap ``document``'s metadata key with: ``manager`` when
    given, the table's own when ``document`` is encrypted under the pinned key."""
    if manager is not None:
        return manager
    own = getattr(table, "encryption_manager", None)
    pin = getattr(table, "pin", None)
    if own is not None and pin is not None and own.table_key_id == pin.table_key_id:
        return own
    kms = getattr(table, "kms", None)
    if kms is None or pin is None or not pin.table_key_id:
        return None
    from icecrypt.keys import EncryptionManager

    try:
        fresh = EncryptionManager.from_table_metadata(kms, document, table_key_id=pin.table_key_id)
    except ValueError:
        return None
    fresh.share_kek_cache(own)
    return fresh


def check_digest(table: Any, location: str, document: Mapping[str, Any]) -> None:
    """TableIntegrityError when ``table``'s catalog recorded another SHA-256 for the file
    ``document`` was read from (``catalog._base._CatalogTableStore.check_digest``); a
    no-op for path tables and documents built in memory."""
    store = getattr(table, "metadata_store", None)
    if store is not None and hasattr(store, "check_digest"):
        store.check_digest(location, document)


def check_version(
    table: Any, location: str, document: Mapping[str, Any], *, manager: Any = None, filesystem: Any = None
) -> Authenticator | None:
    """Check a version ``table`` (an EncryptedTable) is about to install or build on,
    before anything is read through it; returns its verified authenticator (None: it has
    none).  TableIntegrityError when:

    - the table's catalog recorded another digest for this file (changed in place);
    - its authenticator fails (:func:`verify`);
    - it has none and the table object requires authentication, or has held an
      authenticated version;
    - it follows the authenticated version the table object holds, but its chain of
      ``previous`` tags does not lead back to it (a version dropped, reordered or spliced
      in from another history).
    """
    check_digest(table, location, document)
    pin = getattr(table, "pin", None)
    table_key_id = pin.table_key_id if pin is not None else None
    auth = verify(document, location, _manager_for(table, document, manager) if FIELD in document else None,
                  table_key_id=table_key_id)
    held = getattr(table, "authenticator", None)
    if auth is None:
        if getattr(table, "require_authenticated_metadata", False) or getattr(table, "authenticated_seen", False):
            why = ("the table object requires authenticated metadata"
                   if getattr(table, "require_authenticated_metadata", False)
                   else "this table object has held an authenticated version of it")
            raise TableIntegrityError(
                f"{location}: the version has no {FIELD} and {why}: it was written by another engine (Iceberg Java, "
                "PyIceberg) or forged; refused (after checking it, authenticate_metadata() adopts it)",
                metadata_location=location, reason="authenticator missing",
            )  # fmt: skip
        return None
    held_location = getattr(table, "metadata_location", None)
    if held is not None and held_location is not None and location != held_location and auth.tag != held.tag:
        _check_chain(table, location, document, auth, held, manager=_manager_for(table, document, manager),
                     filesystem=filesystem)  # fmt: skip
    return auth


def _previous_file(document: Mapping[str, Any]) -> str | None:
    log = document.get("metadata-log") or ()
    if not isinstance(log, list) or not log:
        return None
    entry = log[-1]
    if not isinstance(entry, Mapping) or not isinstance(entry.get("metadata-file"), str):
        return None
    return entry["metadata-file"]


def _check_chain(
    table: Any, location: str, document: Mapping[str, Any], auth: Authenticator, held: Authenticator, *,
    manager: Any, filesystem: Any,
) -> None:
    """Refuse ``document`` unless its chain of ``previous`` tags leads to ``held`` through
    the versions its metadata-log names, each verified in turn."""
    from icecrypt.table.files.metadata import read_metadata_file

    pin = getattr(table, "pin", None)
    table_key_id = pin.table_key_id if pin is not None else None
    fs = filesystem if filesystem is not None else table.filesystem
    current_location, current_doc, current = location, document, auth
    steps = len(document.get("metadata-log") or ()) + 1
    while current.previous != held.tag:
        reason = None
        if current.previous is None:
            reason = f"{current_location} starts a new chain of authenticated versions"
        elif steps <= 0:
            reason = "the chain is longer than the metadata-log"
        else:
            steps -= 1
            recorded = _previous_file(current_doc)
            if recorded is None:
                reason = f"{current_location} names no previous version in its metadata-log"
            else:
                try:
                    path = table.fs_path(recorded, what="metadata file")
                    previous_doc = read_metadata_file(fs, path)
                except (OSError, ValueError) as exc:
                    reason = f"its previous version {recorded} cannot be read ({exc})"
                else:
                    previous = verify(previous_doc, path, manager, table_key_id=table_key_id)
                    if previous is None or previous.tag != current.previous:
                        reason = f"{path} is not the version {current_location} was committed on"
                    else:
                        current_location, current_doc, current = path, previous_doc, previous
        if reason is not None:
            raise TableIntegrityError(
                f"{location}: its chain of authenticated versions does not lead back to {table.metadata_location}, "
                f"the version this table object holds ({reason}); refused (load the table again to accept it)",
                metadata_location=location, reason="broken chain",
            )  # fmt: skip

"""Key manifests: the key metadata of a set of encrypted files, safe to store beside them.

A key manifest is a JSON document that maps file paths to their
:class:`~icecrypt.keys.StandardKeyMetadata` without a single key byte in clear, using the
envelope of Iceberg's table metadata (SPEC.md §3)::

    {
      "format": "icecrypt-key-manifest",
      "version": 1,
      "table-key-id": "<KMS master key id>",
      "encryption-keys": [
        {"key-id": "<KEK id>", "encrypted-key-metadata": "<KEK wrapped by the KMS>",
         "encrypted-by-id": "<table-key-id>", "properties": {"KEY_TIMESTAMP": "<ms>"}},
        {"key-id": "<id>", "encrypted-key-metadata": "<key metadata wrapped by the KEK>",
         "encrypted-by-id": "<KEK id>"},
        ...
      ],
      "files": {"<path>": "<id>", ...},
      "digest-key-id": "<id>"
    }

Each ``encryption-keys`` entry is exactly what Iceberg keeps in ``metadata.json``: one KEK
wrapped by the KMS master key, and per file the key metadata wrapped by the KEK with
AES-GCM (``EncryptionManager.wrap_manifest_list_key_metadata``).  GCM authenticates every
entry on its own, but not which path it belongs to: the ``digest-key-id`` entry wraps,
under the same KEK, the SHA-256 of the ``files`` map and of the wrapped bytes it points
to, so a manifest whose entries were swapped between paths, dropped, added or edited
fails to read (:class:`~icecrypt.AuthenticationError`).

Every manifest gets a KEK of its own (one KMS call to write, one to read), made by a
private :class:`~icecrypt.keys.EncryptionManager` over the caller's KMS and master key: the caller's
manager, which may be a table's, gains no entries.

A manifest's ``table-key-id`` is part of the file, and whoever can write the file can
write a manifest of their own, wrapped under any master key the reader's KMS client can
use (another key of the same keystore or account).  The master key a reader expects
therefore comes from the reader: :func:`read_key_manifest` takes it as ``table_key_id``
and refuses a manifest under any other.  The Spark file sources always pass it (option
``encryption.key-id``); without it the low-level function accepts the manifest's own
``table-key-id``, which is safe only when the KMS client can use that one master key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Mapping
from typing import Any

from icecrypt._atomic import AtomicFile
from icecrypt._limits import MAX_METADATA_BYTES_ENV, max_metadata_bytes
from icecrypt.errors import (
    AuthenticationError,
    EncryptionKeyNotFoundError,
    FormatError,
    KmsError,
)
from icecrypt.keys.encrypted_key import EncryptedKey
from icecrypt.keys.manager import EncryptionManager
from icecrypt.keys.metadata import StandardKeyMetadata
from icecrypt.kms.base import KeyManagementClient

__all__ = ["MANIFEST_FORMAT", "MANIFEST_VERSION", "read_key_manifest", "write_key_manifest"]

MANIFEST_FORMAT = "icecrypt-key-manifest"
MANIFEST_VERSION = 1


def _digest(files: Mapping[str, str], entries: Mapping[str, EncryptedKey]) -> bytes:
    """SHA-256 over the sorted ``path, key id, wrapped key metadata`` triples."""
    h = hashlib.sha256(MANIFEST_FORMAT.encode() + b"\0")
    for path in sorted(files):
        key_id = files[path]
        wrapped = entries[key_id].encrypted_key_metadata
        for part in (path.encode("utf-8"), key_id.encode("utf-8"), wrapped):
            h.update(len(part).to_bytes(8, "big"))
            h.update(part)
    return h.digest()


def _filesystem_name(path: Any, filesystem: Any) -> str:
    return os.fsdecode(os.fspath(path)) if filesystem is None else str(path)


def _is_local(filesystem: Any) -> bool:
    if filesystem is None:
        return True
    import pyarrow.fs as pafs

    return isinstance(filesystem, pafs.LocalFileSystem)


def _refuse_encrypting(filesystem: Any) -> None:
    if filesystem is None:
        return
    from icecrypt._encrypting import is_encrypted_filesystem

    if is_encrypted_filesystem(filesystem):
        raise ValueError(
            "a key manifest must not be written through an EncryptedFileSystem (its keys are "
            "already wrapped, and it could not be read back without a key); pass its base filesystem"
        )


def write_key_manifest(
    path: str | os.PathLike[str],
    keys: Mapping[Any, StandardKeyMetadata | bytes],
    manager: EncryptionManager,
    *,
    filesystem: Any = None,
) -> None:
    """Write the key manifest of ``keys`` (``path -> key metadata``) to ``path``.

    ``manager`` supplies the KMS, the master key (``table_key_id``) and the data-key
    length of the manifest's KEK; it is not modified.  ``filesystem``: a pyarrow
    filesystem, or None for a local path.  Local files are written atomically (a
    temporary file renamed into place, mode 0600); on other filesystems the file appears
    when its stream closes, as the filesystem publishes it.
    """
    _refuse_encrypting(filesystem)
    name = _filesystem_name(path, filesystem)
    private = EncryptionManager(manager.kms, manager.table_key_id, (), manager.data_key_length)
    files: dict[str, str] = {}
    entries: dict[str, EncryptedKey] = {}
    for file_path, value in keys.items():
        file_name = os.fsdecode(os.fspath(file_path))
        key_metadata = value if isinstance(value, StandardKeyMetadata) else StandardKeyMetadata.decode(value)
        entry = private.wrap_manifest_list_key_metadata(key_metadata)
        files[file_name] = entry.key_id
        entries[entry.key_id] = entry
    digest = private.wrap_manifest_list_key_metadata(StandardKeyMetadata(_digest(files, entries)))
    document = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "table-key-id": private.table_key_id,
        "encryption-keys": [entry.to_json() for entry in private.encryption_keys],
        "files": files,
        "digest-key-id": digest.key_id,
    }
    data = (json.dumps(document, indent=1) + "\n").encode("utf-8")
    if _is_local(filesystem):
        with AtomicFile(name) as out:
            out.file.write(data)
    else:
        with filesystem.open_output_stream(name, compression=None) as out:
            out.write(data)


def _load(path: Any, filesystem: Any, name: str) -> dict:
    limit = max_metadata_bytes()
    try:
        if _is_local(filesystem):
            with open(name, "rb") as f:
                raw = f.read(limit + 1)
        else:
            with filesystem.open_input_stream(name, compression=None) as f:
                raw = f.read(limit + 1)
    except FileNotFoundError:
        raise FileNotFoundError(f"{name}: key manifest not found") from None
    if len(raw) > limit:
        raise FormatError(f"{name}: key manifest is larger than {limit} bytes (the limit; set {MAX_METADATA_BYTES_ENV} to raise it)")
    try:
        document = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:  # RecursionError: nested too deep
        raise FormatError(f"{name}: not a key manifest (invalid JSON: {exc})") from None
    if not isinstance(document, dict) or document.get("format") != MANIFEST_FORMAT:
        raise FormatError(f"{name}: not a key manifest (no \"format\": {MANIFEST_FORMAT!r})")
    if document.get("version") != MANIFEST_VERSION:
        raise FormatError(f"{name}: unsupported key manifest version {document.get('version')!r}")
    for field, kind in (("table-key-id", str), ("encryption-keys", list), ("files", dict), ("digest-key-id", str)):
        if not isinstance(document.get(field), kind):
            raise FormatError(f"{name}: key manifest field {field!r} is missing or not a {kind.__name__}")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in document["files"].items()):
        raise FormatError(f"{name}: key manifest 'files' must map paths to key ids")
    return document


def read_key_manifest(
    path: str | os.PathLike[str],
    kms: KeyManagementClient,
    *,
    table_key_id: str | None = None,
    filesystem: Any = None,
) -> dict[str, StandardKeyMetadata]:
    """Read a key manifest written by :func:`write_key_manifest`: ``path -> key metadata``.

    ``table_key_id``: the master key the manifest must be wrapped under, as the caller
    knows it (a manifest naming another one is refused with
    :class:`~icecrypt.AuthenticationError` before any KMS call).  None accepts the master
    key the manifest names, which is safe only when ``kms`` can use no other key: a
    manifest is a file, and whoever can write it can wrap one under any key ``kms``
    unwraps with.  ``kms`` must hold the manifest's master key.  Raises
    :class:`~icecrypt.FormatError` for a file that is not a key manifest, a
    :class:`~icecrypt.KmsError` when the KMS cannot unwrap the KEK (wrong or unknown
    master key), and :class:`~icecrypt.AuthenticationError` when an entry does not
    authenticate or the manifest was altered; every message names the manifest.
    """
    if table_key_id is not None and (not isinstance(table_key_id, str) or not table_key_id):
        raise ValueError("table_key_id must be a non-empty str (or None)")
    name = _filesystem_name(path, filesystem)
    document = _load(path, filesystem, name)
    if table_key_id is not None and document["table-key-id"] != table_key_id:
        raise AuthenticationError(
            f"{name}: the key manifest is wrapped under master key {document['table-key-id']!r}, not the "
            f"expected {table_key_id!r} (refused: a manifest under another key is not this data's)"
        )
    try:
        entries = [EncryptedKey.from_json(entry) for entry in document["encryption-keys"]]
        manager = EncryptionManager(kms, document["table-key-id"], entries)
    except FormatError as exc:
        raise FormatError(f"{name}: {exc}") from None
    except ValueError as exc:  # an empty table-key-id
        raise FormatError(f"{name}: not a key manifest ({exc})") from None
    by_id = {entry.key_id: entry for entry in entries}  # unambiguous: the manager refuses conflicting ids

    def unwrap(key_id: str, what: str) -> StandardKeyMetadata:
        try:
            return manager.unwrap_manifest_list_key_metadata(key_id)
        except KmsError as exc:
            raise type(exc)(f"{name}: cannot unwrap the key manifest's KEK: {exc}", backend=exc.backend) from exc
        except AuthenticationError:
            raise AuthenticationError(
                f"{name}: {what} (key {key_id!r}) does not authenticate: the manifest was altered "
                "or its KEK is not the one that wrapped it"
            ) from None
        except (FormatError, EncryptionKeyNotFoundError) as exc:
            raise type(exc)(f"{name}: {what}: {exc}") from None

    files = document["files"]
    keys = {file_path: unwrap(key_id, f"entry of {file_path!r}") for file_path, key_id in files.items()}
    digest = unwrap(document["digest-key-id"], "the manifest digest")
    if not hmac.compare_digest(digest.encryption_key, _digest(files, by_id)):
        raise AuthenticationError(f"{name}: the key manifest was altered (its files map does not match its digest)")
    return keys

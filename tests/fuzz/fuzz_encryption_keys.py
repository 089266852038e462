"""Fuzz harness: the ``encryption-keys`` list of table metadata and the unwrapping of
its entries (``read_encryption_keys``, ``EncryptedKey.from_json``,
``EncryptionManager.current_kek``, ``check_current_kek`` (the replay checks a writer
makes before it wraps) and ``unwrap_manifest_list_key_metadata``).

Input: JSON text, either a table metadata object holding ``encryption-keys`` or the list
itself (inputs that are not JSON are skipped: the JSON parser is Python's).  The
manager's table key is ``keyA`` of Iceberg's test KMS (``MemoryKms``).  Seeds: the list
of the Java bundle (``../shared/vectors/table/dek16``), the ``metadata.json`` files of
the Java tables (``../shared/tables``), and a list made here (two KEKs, three wrapped
manifest-list keys).

Oracle:

* only ``icecrypt.DecryptionError`` (``FormatError`` for a malformed entry,
  ``AuthenticationError`` for wrapped bytes that do not verify),
  ``EncryptionKeyNotFoundError`` (an id that is not in the list) and ``KmsError`` (the
  KMS refuses a wrapped KEK) may be raised; never another exception, no hang;
* no unauthenticated output: every key metadata that unwraps is one that was wrapped
  into a seed (entries can be relabelled or moved, never forged);
* a KEK that ``check_current_kek`` lets a writer use shares its wrapped bytes with no
  other entry (a copy of a KEK under a fresh id is never adopted).
"""

from __future__ import annotations

import json
from functools import lru_cache

from fuzzlib import Finding, json_or_none, memory_kms

from icecrypt import DecryptionError, EncryptionKeyNotFoundError, KmsError
from icecrypt.keys import EncryptionManager, StandardKeyMetadata
from icecrypt.keys.manager import read_encryption_keys
from vectorlib import TABLES_DIR, VECTORS_DIR

ALLOWED = (DecryptionError, EncryptionKeyNotFoundError, KmsError)
TABLE_KEY = "keyA"


def _fresh_list() -> list:
    clock = iter(range(1795316508059, 1795316508059 + 1000))
    manager = EncryptionManager(memory_kms(), TABLE_KEY, clock=lambda: next(clock))
    for i in range(2):
        manager.wrap_manifest_list_key_metadata(StandardKeyMetadata(bytes([i]) * 16, bytes(16), 1000 + i))
    manager.rotate_kek()
    manager.wrap_manifest_list_key_metadata(StandardKeyMetadata(bytes(32), None, None))
    return [k.to_json() for k in manager.encryption_keys]


@lru_cache(maxsize=None)
def _seed_documents() -> tuple[bytes, ...]:
    docs = [json.dumps(json.loads((VECTORS_DIR / "table" / "dek16" / "bundle.json").read_text())["encryption-keys"]).encode()]
    for path in sorted(TABLES_DIR.glob("*/metadata/*.metadata.json")):
        docs.append(path.read_bytes())
    docs.append(json.dumps(_fresh_list()).encode())
    return tuple(docs)


def seeds() -> list[bytes]:
    return list(_seed_documents())


def _unwrap_all(document) -> list[tuple[str, StandardKeyMetadata]]:
    """(key id, key metadata) of every entry that unwraps; the documented errors are fine."""
    metadata = document if isinstance(document, dict) else {"encryption-keys": document}
    entries = read_encryption_keys(metadata)
    manager = EncryptionManager(memory_kms(), TABLE_KEY, entries)
    out = []
    try:
        manager.current_kek()
    except ALLOWED:
        pass
    try:
        adopted = manager.check_current_kek()
    except ALLOWED:
        adopted = None
    if adopted is not None and any(
        e.key_id != adopted.key_id and e.encrypted_key_metadata == adopted.encrypted_key_metadata for e in entries
    ):
        raise Finding(f"KEK {adopted.key_id!r} was adopted although another entry carries its wrapped bytes")
    for entry in entries:
        try:
            out.append((entry.key_id, manager.unwrap_manifest_list_key_metadata(entry.key_id)))
        except ALLOWED:
            pass
    return out


@lru_cache(maxsize=None)
def authentic() -> frozenset[StandardKeyMetadata]:
    found = set()
    for doc in _seed_documents():
        found.update(km for _, km in _unwrap_all(json.loads(doc)))
    return frozenset(found)


def check(data: bytes) -> None:
    document = json_or_none(data)
    if document is None:
        return
    keys = authentic()
    for key_id, km in _unwrap_all(document):
        if km not in keys:
            raise Finding(f"entry {key_id!r} unwrapped to key metadata no seed wrapped")

"""The envelope key hierarchy of an encrypted Iceberg table (SPEC.md §3).

::

    KMS master key ("table key", property encryption.key-id)
      └─ wraps KEKs            encryption-keys entry, encrypted-by-id = table key id,
                               properties {"KEY_TIMESTAMP": ms}; lives 730 days
           └─ wraps manifest-list key metadata
                               encryption-keys entry, encrypted-by-id = KEK id;
                               AES-GCM(KEK, StandardKeyMetadata, AAD = KEY_TIMESTAMP)
                               snapshot["key-id"] = this entry's id
                └─ every other file's key metadata travels inside its (encrypted) parent

:class:`EncryptionManager` makes per-file keys, wraps and unwraps manifest-list key
metadata exactly as Iceberg Java's ``StandardEncryptionManager`` does, and adds what Java
lacks: master-key and KEK rotation and the bookkeeping to drop keys of expired snapshots.
The module also reads and writes the ``encryption-keys`` list and snapshot ``key-id``
fields of a ``metadata.json`` document, keeping Java's field placement.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from typing import Any

from icecrypt._gcm import GcmKey
from icecrypt.errors import (
    EncryptionKeyNotFoundError,
    FormatError,
    KmsError,
    KmsInvalidWrappedKeyError,
    ReplayedKeyError,
)
from icecrypt.keys.encrypted_key import KEY_TIMESTAMP, EncryptedKey
from icecrypt.keys.metadata import StandardKeyMetadata
from icecrypt.kms.base import KeyManagementClient

__all__ = [
    "ENCRYPTION_DEK_LENGTH",
    "ENCRYPTION_TABLE_KEY",
    "KEK_LIFESPAN_MS",
    "EncryptionKeyNotFoundError",
    "EncryptionManager",
    "read_encryption_keys",
    "referenced_keys",
    "removable_keys",
    "snapshot_key_ids",
    "unwrap_key_metadata",
    "validate_table_properties",
    "with_snapshot_key_id",
    "wrap_key_metadata",
    "write_encryption_keys",
]

ENCRYPTION_TABLE_KEY = "encryption.key-id"
ENCRYPTION_DEK_LENGTH = "encryption.data-key-length"
DEFAULT_DATA_KEY_LENGTH = 16
AAD_PREFIX_LENGTH = 16
KEY_ID_BYTES = 16
#: length of the key that authenticates a table's metadata versions (AES-256 GMAC)
METADATA_KEY_LENGTH = 32
#: the cache slot of a metadata key is its id under this prefix, apart from KEK ids
_METADATA_KEY_SLOT = "metadata-key:"
#: a KEK is used for new wraps for 730 days after its KEY_TIMESTAMP
KEK_LIFESPAN_MS = 730 * 24 * 3600 * 1000
#: table property (icecrypt's; Java ignores it): milliseconds an
#: unwrapped KEK stays cached in this process (default 3600000; 0 = never cached)
KEK_CACHE_TTL_PROPERTY = "encryption.kek-cache-ttl-ms"

_DECIMAL = re.compile(r"[+-]?[0-9]+\Z")  # what Java's Long.parseLong accepts (ASCII digits)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _parse_timestamp(entry: EncryptedKey) -> int:
    stamp = entry.key_timestamp
    if stamp is None:
        raise FormatError(f"key encryption key {entry.key_id!r} has no {KEY_TIMESTAMP} property")
    if not _DECIMAL.match(stamp):
        raise FormatError(f"key encryption key {entry.key_id!r} has a malformed {KEY_TIMESTAMP} {stamp!r}")
    return int(stamp)


# --- wrapping of manifest-list key metadata (EncryptionUtil) --------------------------


def _as_gcm_key(key: GcmKey | bytes) -> GcmKey:
    return key if isinstance(key, GcmKey) else GcmKey(key)


def wrap_key_metadata(kek: GcmKey | bytes, key_timestamp: str, key_metadata: StandardKeyMetadata) -> bytes:
    """``nonce || AES-GCM(kek, key_metadata.encode(), AAD = UTF-8(key_timestamp)) || tag``
    with a fresh random nonce."""
    return _seal_key_metadata(kek, key_timestamp, key_metadata, None)


def _seal_key_metadata(
    kek: GcmKey | bytes, key_timestamp: str, key_metadata: StandardKeyMetadata, nonce: bytes | None
) -> bytes:
    # ``nonce`` is given only by tests that reproduce Java's output byte for byte (they set
    # a manager's ``_nonce`` attribute); no public function passes one
    return _as_gcm_key(kek).seal(key_metadata.encode(), key_timestamp.encode("utf-8"), _nonce=nonce)


def unwrap_key_metadata(kek: GcmKey | bytes, key_timestamp: str, wrapped: bytes) -> StandardKeyMetadata:
    """Inverse of :func:`wrap_key_metadata`; AuthenticationError / FormatError on bad input."""
    return StandardKeyMetadata.decode(_as_gcm_key(kek).open(wrapped, key_timestamp.encode("utf-8")))


# --- table properties -----------------------------------------------------------------


def validate_table_properties(properties: Mapping[str, str], format_version: int) -> tuple[str | None, int]:
    """Check the encryption table properties; returns ``(table_key_id, data_key_length)``.

    ``table_key_id`` is ``None`` for an unencrypted table.  Both properties are refused
    for format versions below 3 and the key length must be 16, 24 or 32 (ValueError), as
    in Java's ``EncryptionUtil``.
    """
    present = [name for name in (ENCRYPTION_TABLE_KEY, ENCRYPTION_DEK_LENGTH) if name in properties]
    if present and format_version < 3:
        shown = ", ".join(f"{name}={properties[name]}" for name in present)
        raise ValueError(
            f"Invalid properties for v{format_version}: {shown} (table encryption needs format-version 3)"
        )
    table_key_id = properties.get(ENCRYPTION_TABLE_KEY) or None
    raw = properties.get(ENCRYPTION_DEK_LENGTH)
    if raw is None:
        return table_key_id, DEFAULT_DATA_KEY_LENGTH
    text = str(raw).strip()
    if not _DECIMAL.match(text) or int(text) not in (16, 24, 32):
        raise ValueError(f"Invalid data key length: {raw} (must be 16, 24, or 32)")
    return table_key_id, int(text)


# --- metadata.json --------------------------------------------------------------------


def read_encryption_keys(metadata: Mapping[str, Any]) -> list[EncryptedKey]:
    """The ``encryption-keys`` list of a table metadata document, in order."""
    entries = metadata.get("encryption-keys")
    if entries is None:
        return []
    if not isinstance(entries, list):
        raise FormatError("table metadata 'encryption-keys' must be a list")
    return [EncryptedKey.from_json(entry) for entry in entries]


def snapshot_key_ids(metadata: Mapping[str, Any]) -> dict[int, str]:
    """``snapshot-id -> key-id`` for every snapshot that has a ``key-id``."""
    result: dict[int, str] = {}
    for snapshot in metadata.get("snapshots") or ():
        key_id = snapshot.get("key-id")
        if key_id is not None:
            if not isinstance(key_id, str):
                raise FormatError(f"snapshot {snapshot.get('snapshot-id')}: 'key-id' must be a string")
            result[snapshot["snapshot-id"]] = key_id
    return result


def write_encryption_keys(metadata: Mapping[str, Any], keys: Iterable[EncryptedKey]) -> dict[str, Any]:
    """A copy of ``metadata`` whose ``encryption-keys`` list holds ``keys``.

    Placement follows Java's ``TableMetadataParser``: an existing list is replaced where
    it stands; a new one goes right after ``next-row-id`` (else before ``refs``, else
    before ``snapshots``, else at the end).  An empty list removes the field, since Java
    writes it only when non-empty.  Every other field is kept, in order.
    """
    entries = [key.to_json() for key in keys]
    result: dict[str, Any] = {}
    if "encryption-keys" in metadata or not entries:
        for name, value in metadata.items():
            if name == "encryption-keys":
                if entries:
                    result[name] = entries
            else:
                result[name] = value
        return result
    names = list(metadata)
    if "next-row-id" in metadata:
        index = names.index("next-row-id") + 1
    elif "refs" in metadata:
        index = names.index("refs")
    elif "snapshots" in metadata:
        index = names.index("snapshots")
    else:
        index = len(names)
    for position, name in enumerate(names):
        if position == index:
            result["encryption-keys"] = entries
        result[name] = metadata[name]
    if index == len(names):
        result["encryption-keys"] = entries
    return result


def with_snapshot_key_id(snapshot: Mapping[str, Any], key_id: str | None) -> dict[str, Any]:
    """A copy of a snapshot object with ``key-id`` set as its last field (or removed)."""
    result = {name: value for name, value in snapshot.items() if name != "key-id"}
    if key_id is not None:
        result["key-id"] = key_id
    return result


def referenced_keys(metadata: Mapping[str, Any]) -> dict[int, set[str]]:
    """``snapshot-id -> ids of the encryption-keys entries it needs to be read``.

    That is the snapshot's manifest-list key and the KEK that wraps it (when that KEK is
    in the list).  Snapshots without a ``key-id`` map to an empty set.
    """
    by_id = {key.key_id: key for key in read_encryption_keys(metadata)}
    result: dict[int, set[str]] = {}
    for snapshot in metadata.get("snapshots") or ():
        needed: set[str] = set()
        key_id = snapshot.get("key-id")
        if key_id is not None:
            needed.add(key_id)
            entry = by_id.get(key_id)
            if entry is not None and entry.encrypted_by_id in by_id:
                needed.add(entry.encrypted_by_id)
        result[snapshot["snapshot-id"]] = needed
    return result


def removable_keys(
    metadata: Mapping[str, Any], expired_snapshot_ids: Iterable[int], *, now_ms: int | None = None
) -> set[str]:
    """Ids of ``encryption-keys`` entries that may be dropped once the snapshots
    ``expired_snapshot_ids`` are removed from ``metadata``.

    A manifest-list key of an expired snapshot goes unless a remaining snapshot uses it.
    Its KEK goes only if no remaining snapshot uses it **and** it is past its 730-day
    lifespan at ``now_ms``: an unexpired KEK may be picked by a writer working from older
    metadata at this very moment, and its new snapshot would be unreadable without it.
    """
    now = _now_ms() if now_ms is None else now_ms
    expired = set(expired_snapshot_ids)
    by_id = {key.key_id: key for key in read_encryption_keys(metadata)}
    refs = referenced_keys(metadata)
    still_needed: set[str] = set()
    for sid, ids in refs.items():
        if sid not in expired:
            still_needed |= ids
    candidates: set[str] = set()
    for sid, key_id in snapshot_key_ids(metadata).items():
        if sid not in expired or key_id not in by_id:
            continue
        candidates.add(key_id)
        kek = by_id.get(by_id[key_id].encrypted_by_id or "")
        if kek is not None and _kek_expired(kek, now):
            candidates.add(kek.key_id)
    return candidates - still_needed


def _kek_expired(kek: EncryptedKey, now: int) -> bool:
    stamp = kek.key_timestamp
    # without a readable timestamp no writer can select it (Java would fail on it)
    return stamp is None or not _DECIMAL.match(stamp) or now - int(stamp) >= KEK_LIFESPAN_MS


# --- the manager ----------------------------------------------------------------------


def _ttl_property(properties: Mapping[str, Any]) -> float | None:
    """``encryption.kek-cache-ttl-ms`` in seconds, None when unset; ValueError if malformed."""
    raw_ttl = properties.get(KEK_CACHE_TTL_PROPERTY)
    if raw_ttl is None:
        return None
    text = str(raw_ttl).strip()
    if not _DECIMAL.match(text) or int(text) < 0:
        raise ValueError(f"Invalid {KEK_CACHE_TTL_PROPERTY}: {raw_ttl} (milliseconds, >= 0)")
    return int(text) / 1000


#: per-process key of the KEK fingerprints below (they never leave the process)
_FINGERPRINT_KEY = os.urandom(32)


def _fingerprint(material: bytes) -> bytes:
    """A keyed digest of unwrapped KEK material: equal for equal keys, useless without
    this process's random key."""
    return hmac.new(_FINGERPRINT_KEY, material, hashlib.sha256).digest()


def _kek_slot(entry: EncryptedKey, table_key_id: str) -> tuple[str, bytes, str]:
    """What names one unwrapped KEK: its id, its wrapped bytes and the master key that
    unwraps them.  An id alone names nothing: metadata.json is not authenticated, and a
    version may give one id other bytes (item 6 of the storage-attacker review)."""
    return (entry.key_id, entry.encrypted_key_metadata, table_key_id)


class _KekCache:
    """Unwrapped KEKs (and their fingerprints) with a time to live, by (KEK id, wrapped
    bytes, master key id); one KMS call per KEK however many threads ask."""

    def __init__(self, ttl_ms: float, clock: Callable[[], int]) -> None:
        self._ttl_ms = ttl_ms
        self._clock = clock
        self._lock = threading.Lock()
        # slot -> (future (GcmKey, fingerprint), expiry)
        self._slots: dict[tuple[str, bytes, str], tuple[Future, float]] = {}

    def get(self, slot_key: tuple[str, bytes, str], load: Callable[[], tuple[GcmKey, bytes]]) -> tuple[GcmKey, bytes]:
        now = self._clock()
        with self._lock:
            slot = self._slots.get(slot_key)
            if slot is not None and (not slot[0].done() or now < slot[1]):
                future, owner = slot[0], False
            else:
                future, owner = Future(), True
                self._slots[slot_key] = (future, float("inf"))
        if not owner:
            return future.result()
        try:
            value = load()
        except BaseException as exc:
            with self._lock:
                if self._slots.get(slot_key, (None,))[0] is future:
                    del self._slots[slot_key]
            future.set_exception(exc)
            raise
        with self._lock:
            if self._slots.get(slot_key, (None,))[0] is future:
                self._slots[slot_key] = (future, self._clock() + self._ttl_ms)
        future.set_result(value)
        return value

    def peek(self, slot_key: tuple[str, bytes, str]) -> tuple[GcmKey, bytes] | None:
        """The cached value of a slot, if it is there and loaded (expired or not)."""
        with self._lock:
            slot = self._slots.get(slot_key)
        if slot is None or not slot[0].done() or slot[0].exception() is not None:
            return None
        return slot[0].result()

    @property
    def ttl_ms(self) -> float:
        return self._ttl_ms

    def put(self, slot_key: tuple[str, bytes, str], value: tuple[GcmKey, bytes]) -> None:
        future: Future = Future()
        future.set_result(value)
        with self._lock:
            self._slots[slot_key] = (future, self._clock() + self._ttl_ms)

    def clear(self) -> None:
        with self._lock:
            self._slots.clear()


class _KekLedger:
    """What one writer (a table object and the managers of its commits) knows about KEKs:
    those it wrapped with (wrapped bytes and fingerprint -> KEK id) and those its own
    rotations retired (ids, wrapped bytes, fingerprints).  Only what the writer did goes
    in, never what a metadata version merely lists, so a version cannot poison it."""

    _MAX = 1 << 14  # KEKs come one per rotation: far more than any table holds

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.used_wrapped: dict[bytes, str] = {}
        self.used_fingerprints: dict[bytes, str] = {}
        self.retired_ids: set[str] = set()
        self.retired_wrapped: set[bytes] = set()
        self.retired_fingerprints: set[bytes] = set()
        # SHA-256 of retired KEKs' wrapped bytes (not secret): what a catalog keeps, so
        # that a later process refuses the same wrapped bytes under a fresh id
        self.retired_digests: set[bytes] = set()
        self.retired_pairs: dict[str, str | None] = {}  # KEK id -> digest hex, in order

    def record_use(self, entry: EncryptedKey, fingerprint: bytes) -> None:
        with self._lock:
            if len(self.used_wrapped) < self._MAX:
                self.used_wrapped.setdefault(entry.encrypted_key_metadata, entry.key_id)
            if len(self.used_fingerprints) < self._MAX:
                self.used_fingerprints.setdefault(fingerprint, entry.key_id)

    def retire(self, entry: EncryptedKey | str, fingerprint: bytes | None) -> None:
        """Retire a KEK entry (id, wrapped bytes and, when known, fingerprint), or an id alone."""
        with self._lock:
            if len(self.retired_ids) < self._MAX:
                if isinstance(entry, str):
                    self.retired_ids.add(entry)
                    self.retired_pairs.setdefault(entry, None)
                    return
                self.retired_ids.add(entry.key_id)
                self.retired_wrapped.add(entry.encrypted_key_metadata)
                digest = hashlib.sha256(entry.encrypted_key_metadata).digest()
                self.retired_digests.add(digest)
                self.retired_pairs[entry.key_id] = digest.hex()
                if fingerprint is not None:
                    self.retired_fingerprints.add(fingerprint)

    def retire_digest(self, key_id: str, digest: bytes | None) -> None:
        """Retire a KEK known by id and wrapped-bytes digest only (a catalog's record)."""
        with self._lock:
            if len(self.retired_ids) < self._MAX:
                self.retired_ids.add(key_id)
                if digest is not None:
                    self.retired_digests.add(digest)
                if self.retired_pairs.get(key_id) is None:
                    self.retired_pairs[key_id] = None if digest is None else digest.hex()

    def refusal(self, entry: EncryptedKey, fingerprint: bytes | None) -> str | None:
        """Why ``entry`` must not wrap new keys, or None."""
        with self._lock:
            if entry.key_id in self.retired_ids or entry.encrypted_key_metadata in self.retired_wrapped:
                return "a key rotation or rekey of this table object retired it"
            if self.retired_digests and hashlib.sha256(entry.encrypted_key_metadata).digest() in self.retired_digests:
                return "a key rotation or rekey of this table retired it (its wrapped bytes are a retired KEK's)"
            other = self.used_wrapped.get(entry.encrypted_key_metadata, entry.key_id)
            if other != entry.key_id:
                return f"its wrapped key is that of KEK {other!r}, which this table object used before"
            if fingerprint is None:
                return None
            if fingerprint in self.retired_fingerprints:
                return "it unwraps to a KEK that a key rotation or rekey of this table object retired"
            other = self.used_fingerprints.get(fingerprint, entry.key_id)
            if other != entry.key_id:
                return f"it unwraps to the key of KEK {other!r}, which this table object used before"
        return None


class EncryptionManager:
    """Per-file keys and the KEK-wrapped manifest-list keys of one encrypted table.

    ``kms`` holds the table's master key ``table_key_id``; ``encryption_keys`` is the
    table's current ``encryption-keys`` list (entries are kept in order; a repeated id
    is ignored, as Java's metadata builder does).  ``data_key_length`` (16, 24 or 32)
    sizes DEKs and KEKs.  Unwrapped KEKs are cached for ``kek_cache_ttl`` seconds (tables:
    the property ``encryption.kek-cache-ttl-ms``; 0 = a KMS call for every unwrap).
    ``clock`` returns the time in milliseconds since the epoch (KEK timestamps, expiry,
    and the cache).  The manager is safe to share between threads.

    New manifest-list keys are wrapped only with a KEK this manager can show to be the
    table's current one (:meth:`current_kek` by Java's rule, then
    :class:`~icecrypt.errors.ReplayedKeyError` for one whose wrapped bytes are another
    entry's, or that this writer's own rotations retired, or that unwraps to a key this
    writer used under another id).  What a writer used and retired is kept in a ledger
    shared, like the KEK cache, by the managers of one table object.
    """

    def __init__(
        self,
        kms: KeyManagementClient,
        table_key_id: str,
        encryption_keys: Iterable[EncryptedKey] = (),
        data_key_length: int = DEFAULT_DATA_KEY_LENGTH,
        *,
        kek_cache_ttl: float = 3600,
        clock: Callable[[], int] | None = None,
    ) -> None:
        if not isinstance(table_key_id, str) or not table_key_id:
            raise ValueError("table_key_id must be a non-empty str")
        if data_key_length not in (16, 24, 32):
            raise ValueError(f"Invalid data key length: {data_key_length} (must be 16, 24, or 32)")
        self._kms = kms
        self._table_key_id = table_key_id
        self._data_key_length = data_key_length
        self._clock = clock or _now_ms
        # random bytes (DEKs, KEKs, key ids) and GCM nonces; tests that reproduce Java's
        # output byte for byte replace these attributes (no argument reaches them)
        self._random: Callable[[int], bytes] = os.urandom
        self._nonce: Callable[[], bytes] | None = None
        self._lock = threading.RLock()
        self._keys: dict[str, EncryptedKey] = {}
        for key in encryption_keys:
            if not isinstance(key, EncryptedKey):
                raise TypeError(f"encryption_keys must hold EncryptedKey objects, not {type(key).__name__}")
            known = self._keys.setdefault(key.key_id, key)
            if known != key:
                # which entry would win is a choice an attacker could exploit (a digest
                # or reader taking the other one): two different entries are damage
                raise FormatError(f"encryption-keys holds two different entries with key id {key.key_id!r}")
        self._cache = _KekCache(kek_cache_ttl * 1000.0, self._clock)
        self._ledger = _KekLedger()

    @classmethod
    def from_table_metadata(
        cls,
        kms: KeyManagementClient,
        metadata: Mapping[str, Any],
        *,
        table_key_id: str | None = None,
        **options: Any,
    ) -> EncryptionManager:
        """A manager for the table described by a ``metadata.json`` document.

        ``table_key_id`` overrides ``properties["encryption.key-id"]`` (a catalog such as
        Hive keeps its own copy, which is the one to trust).
        """
        properties = metadata.get("properties") or {}
        key_id, dek_length = validate_table_properties(properties, int(metadata.get("format-version", 1)))
        key_id = table_key_id or key_id
        if key_id is None:
            raise ValueError(f"table is not encrypted: no {ENCRYPTION_TABLE_KEY} property")
        ttl = _ttl_property(properties)
        if ttl is not None and "kek_cache_ttl" not in options:
            options["kek_cache_ttl"] = ttl
        return cls(kms, key_id, read_encryption_keys(metadata), dek_length, **options)

    def matches_metadata(self, kms: KeyManagementClient, metadata: Mapping[str, Any]) -> bool:
        """Whether a manager built by :meth:`from_table_metadata` from ``metadata`` and
        ``kms`` (no options) would be configured as this one is: same KMS client, table
        key, data key length and KEK cache TTL (the ``encryption-keys`` are not compared)."""
        properties = metadata.get("properties") or {}
        try:
            key_id, dek_length = validate_table_properties(properties, int(metadata.get("format-version", 1)))
            ttl = _ttl_property(properties)
        except ValueError:
            return False
        ttl_ms = (3600 if ttl is None else ttl) * 1000.0
        return (
            kms is self._kms and key_id == self._table_key_id and dek_length == self._data_key_length
            and ttl_ms == self._cache.ttl_ms
        )  # fmt: skip

    def copy(self) -> EncryptionManager:
        """An independent manager with the same configuration and ``encryption-keys``
        (changes to either's keys do not affect the other) that shares this one's cache
        of unwrapped KEKs, entries expiring as they would here.  For the commits of one
        table object: each works on its own copy, and the KMS is asked for a KEK once
        per cache TTL rather than once per commit."""
        with self._lock:
            clone = object.__new__(type(self))
            clone.__dict__.update(self.__dict__)
            clone._lock = threading.RLock()
            clone._keys = dict(self._keys)
        return clone

    def share_kek_cache(self, other: EncryptionManager | None) -> bool:
        """Use ``other``'s cache of unwrapped KEKs when it is configured alike (same KMS
        client, table key and TTL); returns whether it does.  Cached keys are found by
        KEK id, wrapped bytes and master key id together, and keep their expiry time.
        ``other``'s ledger of the KEKs it used and retired is shared in any case (a
        table object keeps what it learnt across versions)."""
        if other is not None and other is not self:
            self._ledger = other._ledger
        if (
            other is None or other is self or other._kms is not self._kms
            or other._table_key_id != self._table_key_id or other._cache.ttl_ms != self._cache.ttl_ms
            or other._clock is not self._clock
        ):  # fmt: skip
            return False
        self._cache = other._cache
        return True

    @classmethod
    def from_table_properties(
        cls,
        kms: KeyManagementClient,
        properties: Mapping[str, str],
        format_version: int,
        encryption_keys: Iterable[EncryptedKey] = (),
        **options: Any,
    ) -> EncryptionManager | None:
        """A manager for a table with these properties, or ``None`` if it is not encrypted."""
        key_id, dek_length = validate_table_properties(properties, format_version)
        if key_id is None:
            return None
        return cls(kms, key_id, encryption_keys, dek_length, **options)

    # --- properties --------------------------------------------------------------------

    @property
    def kms(self) -> KeyManagementClient:
        return self._kms

    @property
    def table_key_id(self) -> str:
        return self._table_key_id

    @property
    def data_key_length(self) -> int:
        return self._data_key_length

    @property
    def encryption_keys(self) -> list[EncryptedKey]:
        """The ``encryption-keys`` list, in order (a copy)."""
        with self._lock:
            return list(self._keys.values())

    def get_key(self, key_id: str) -> EncryptedKey:
        """The entry ``key_id``; EncryptionKeyNotFoundError if there is none."""
        with self._lock:
            entry = self._keys.get(key_id)
        if entry is None:
            raise EncryptionKeyNotFoundError(f"no encryption key {key_id!r} in the table's encryption-keys")
        return entry

    def is_kek(self, entry: EncryptedKey) -> bool:
        """Whether ``entry`` is a key-encryption key of this table (wrapped by the table key)."""
        return entry.encrypted_by_id == self._table_key_id

    # --- per-file keys -----------------------------------------------------------------

    def new_file_key(self) -> StandardKeyMetadata:
        """Fresh key metadata for one file: a random DEK and a random 16-byte AAD prefix."""
        return StandardKeyMetadata(self._random(self._data_key_length), self._random(AAD_PREFIX_LENGTH))

    def _new_key_id(self) -> str:
        return base64.b64encode(self._random(KEY_ID_BYTES)).decode("ascii")

    # --- KEKs ----------------------------------------------------------------------------

    def _kek_is_current(self, entry: EncryptedKey, now: int) -> bool:
        return self.is_kek(entry) and now - _parse_timestamp(entry) < KEK_LIFESPAN_MS

    def current_kek(self) -> EncryptedKey | None:
        """The KEK new wraps use: the first unexpired one in list order (Java's rule)."""
        now = self._clock()
        with self._lock:
            for entry in self._keys.values():
                if self._kek_is_current(entry, now):
                    return entry
        return None

    def _create_kek(self) -> tuple[EncryptedKey, GcmKey, bytes]:
        material = self._random(self._data_key_length)
        kek = GcmKey(material)
        fingerprint = _fingerprint(material)
        wrapped = self._kms.wrap_key(material, self._table_key_id)
        del material
        entry = EncryptedKey(
            self._new_key_id(), wrapped, self._table_key_id, {KEY_TIMESTAMP: str(self._clock())}
        )
        return entry, kek, fingerprint

    def _unwrap_kek_and_fingerprint(self, entry: EncryptedKey) -> tuple[GcmKey, bytes]:
        def load() -> tuple[GcmKey, bytes]:
            material = self._kms.unwrap_key(entry.encrypted_key_metadata, self._table_key_id)
            try:
                return GcmKey(material), _fingerprint(material)
            except (TypeError, ValueError):
                raise KmsInvalidWrappedKeyError(
                    f"KMS returned a {len(material)}-byte key for KEK {entry.key_id!r} "
                    "(expected 16, 24 or 32)",
                    backend=self._kms.kms_type,
                ) from None

        return self._cache.get(_kek_slot(entry, self._table_key_id), load)

    def _unwrap_kek(self, entry: EncryptedKey) -> GcmKey:
        return self._unwrap_kek_and_fingerprint(entry)[0]

    def _refuse(self, entry: EncryptedKey, reason: str, *, rewrap: bool = False) -> ReplayedKeyError:
        if rewrap:
            what = " is not re-wrapped under the new master key"
        else:
            what = (", which the table's encryption-keys list makes current, is not used to wrap new keys "
                    "(rotate_keys(new_kek=True) puts a fresh KEK first)")
        return ReplayedKeyError(f"key encryption key {entry.key_id!r}{what}: {reason}", key_id=entry.key_id)

    def _check_listed(self, entry: EncryptedKey) -> None:
        """ReplayedKeyError when ``entry`` shares its wrapped bytes with another listed
        entry, or the ledger says this writer used them under another id or retired it.
        (Under the lock.)"""
        for other in self._keys.values():
            if other.key_id != entry.key_id and other.encrypted_key_metadata == entry.encrypted_key_metadata:
                raise self._refuse(entry, f"its wrapped key is also that of entry {other.key_id!r}")
        reason = self._ledger.refusal(entry, None)
        if reason is not None:
            raise self._refuse(entry, reason)

    def _kek_for_wrap(self) -> tuple[EncryptedKey, GcmKey]:
        with self._lock:
            entry = self.current_kek()
            if entry is None:
                entry, kek, fingerprint = self._create_kek()
                self._keys[entry.key_id] = entry
                self._cache.put(_kek_slot(entry, self._table_key_id), (kek, fingerprint))
                self._ledger.record_use(entry, fingerprint)
                return entry, kek
            self._check_listed(entry)
        kek, fingerprint = self._unwrap_adoptable(entry)
        self._ledger.record_use(entry, fingerprint)
        return entry, kek

    @property
    def retired_kek_ids(self) -> frozenset[str]:
        """Ids of the KEKs this writer retired (its rotations, :meth:`retire_keks`): what a
        catalog may keep to refuse them in later processes too."""
        with self._ledger._lock:
            return frozenset(self._ledger.retired_ids)

    @property
    def retired_kek_digests(self) -> list[tuple[str, str | None]]:
        """(KEK id, SHA-256 hex of its wrapped bytes, or None when only the id is known) of
        the KEKs this writer retired, in the order retired: what a catalog keeps so that a
        later process refuses them too (:meth:`retire_recorded_keks`).  Not secret."""
        with self._ledger._lock:
            return list(self._ledger.retired_pairs.items())

    def retire_recorded_keks(self, pairs: Iterable[tuple[str, str | None]]) -> None:
        """Retire KEKs a catalog recorded as retired (``retired_kek_digests`` of an earlier
        writer): never wrap new keys with an entry of such an id or whose wrapped bytes
        have such a digest, whatever its id and timestamp."""
        for key_id, digest in pairs:
            try:
                raw = bytes.fromhex(digest) if digest else None
            except ValueError:
                raw = None
            self._ledger.retire_digest(str(key_id), raw)

    def _unwrap_adoptable(self, entry: EncryptedKey) -> tuple[GcmKey, bytes]:
        """The current KEK ``entry`` unwrapped, after the ledger's checks of its key."""
        try:
            kek, fingerprint = self._unwrap_kek_and_fingerprint(entry)
        except KmsInvalidWrappedKeyError as exc:
            # not wrapped by the table's master key (e.g. a KEK of a master key retired
            # after a leak, put back): never adopted, whatever the list says
            raise self._refuse(entry, f"it does not unwrap under master key {self._table_key_id!r} ({exc})") from exc
        reason = self._ledger.refusal(entry, fingerprint)
        if reason is not None:
            raise self._refuse(entry, reason)
        return kek, fingerprint

    def check_current_kek(self) -> EncryptedKey | None:
        """The KEK new wraps would use (None: one would be created), after the checks a
        wrap makes (:class:`~icecrypt.errors.ReplayedKeyError`); unwraps it (one KMS call,
        cached).  Lets a writer refuse before it writes any file."""
        with self._lock:
            entry = self.current_kek()
            if entry is None:
                return None
            self._check_listed(entry)
        self._unwrap_adoptable(entry)
        return entry

    def retire_keks(self, key_ids: Iterable[str], *, unwrap: bool = False) -> None:
        """Never wrap new keys with the KEKs ``key_ids`` (e.g. leaked ones), nor with any
        entry that carries their wrapped bytes or their key, in this manager and every
        manager sharing its ledger.  Their keys are recognized when this writer has them
        unwrapped in its cache, or with ``unwrap`` (a KMS call per KEK; one the KMS
        refuses is retired by id and wrapped bytes only); an id not in the list is retired
        by id (e.g. ids a catalog keeps as retired).  Reads of what they wrapped are
        unaffected."""
        with self._lock:
            ids = list(key_ids)
            entries = [self._keys[key_id] for key_id in ids if key_id in self._keys]
            for key_id in ids:
                if key_id not in self._keys:
                    self._ledger.retire(key_id, None)
        for entry in entries:
            cached = self._cache.peek(_kek_slot(entry, self._table_key_id))
            if cached is None and unwrap and self.is_kek(entry):
                try:
                    cached = self._unwrap_kek_and_fingerprint(entry)
                except KmsError:
                    pass
            self._ledger.retire(entry, None if cached is None else cached[1])

    # --- the key that authenticates table metadata (icecrypt.table.commit.authenticity) ----

    def new_metadata_key(self) -> tuple[str, bytes, GcmKey]:
        """A fresh 32-byte key for authenticating the table's metadata versions, wrapped
        by the KMS under the table's master key: ``(key id, wrapped bytes, key)``.  Only
        a holder of the master key can make one or unwrap it.  Cached as KEKs are."""
        material = self._random(METADATA_KEY_LENGTH)
        key = GcmKey(material)
        fingerprint = _fingerprint(material)
        wrapped = self._kms.wrap_key(material, self._table_key_id)
        del material
        key_id = self._new_key_id()
        self._cache.put((_METADATA_KEY_SLOT + key_id, wrapped, self._table_key_id), (key, fingerprint))
        return key_id, wrapped, key

    def unwrap_metadata_key(self, key_id: str, wrapped: bytes) -> GcmKey:
        """The metadata key ``key_id`` unwrapped by the KMS under the table's master key
        (one KMS call per cache TTL; KmsError when the master key does not unwrap it)."""

        def load() -> tuple[GcmKey, bytes]:
            material = self._kms.unwrap_key(wrapped, self._table_key_id)
            if len(material) != METADATA_KEY_LENGTH:
                raise KmsInvalidWrappedKeyError(
                    f"KMS returned a {len(material)}-byte key for metadata key {key_id!r} "
                    f"(expected {METADATA_KEY_LENGTH})",
                    backend=self._kms.kms_type,
                )
            return GcmKey(material), _fingerprint(material)

        return self._cache.get((_METADATA_KEY_SLOT + key_id, bytes(wrapped), self._table_key_id), load)[0]

    # --- manifest-list key metadata ------------------------------------------------------

    def wrap_manifest_list_key_metadata(self, key_metadata: StandardKeyMetadata) -> EncryptedKey:
        """Wrap a manifest list's key metadata with the current KEK and add the entry.

        Creates (and adds) a KEK first if none is current.  Returns the new entry, whose
        ``key_id`` is the snapshot's ``key-id``.
        """
        kek_entry, kek = self._kek_for_wrap()
        nonce = self._nonce() if self._nonce is not None else None
        wrapped = _seal_key_metadata(kek, kek_entry.key_timestamp, key_metadata, nonce)
        entry = EncryptedKey(self._new_key_id(), wrapped, kek_entry.key_id)
        with self._lock:
            self._keys.setdefault(entry.key_id, entry)
        return entry

    def unwrap_manifest_list_key_metadata(self, snapshot_key_id: str) -> StandardKeyMetadata:
        """The key metadata of the manifest list of the snapshot whose ``key-id`` is given."""
        entry = self.get_key(snapshot_key_id)
        if entry.encrypted_by_id is None:
            raise FormatError(f"encryption key {snapshot_key_id!r} has no encrypted-by-id")
        with self._lock:
            kek_entry = self._keys.get(entry.encrypted_by_id)
        if kek_entry is None:
            raise EncryptionKeyNotFoundError(
                f"key encryption key {entry.encrypted_by_id!r} (of encryption key {snapshot_key_id!r}) "
                "is not in the table's encryption-keys"
            )
        if not self.is_kek(kek_entry):
            raise FormatError(
                f"encryption key {snapshot_key_id!r} is wrapped by {kek_entry.key_id!r}, which is not "
                f"a key encryption key of table key {self._table_key_id!r}"
            )
        timestamp = kek_entry.key_timestamp
        if timestamp is None:
            raise FormatError(f"key encryption key {kek_entry.key_id!r} has no {KEY_TIMESTAMP} property")
        return unwrap_key_metadata(self._unwrap_kek(kek_entry), timestamp, entry.encrypted_key_metadata)

    # --- rotation (beyond Java) ------------------------------------------------------------

    def rotate_kek(self) -> EncryptedKey:
        """Create a new KEK that subsequent wraps use, here and in Java; returns it.

        Java's writer takes the first unexpired KEK in list order, so the new KEK is put
        at the front of the list: Java writers then pick it too, readers look entries up
        by id so order does not matter to them, and Java keeps the order when it
        rewrites metadata.  (Through REST, whose add-encryption-key appends, the same
        order is reached by removing the older KEKs and adding them back after the new
        one; their ids and bytes are unchanged.)
        """
        with self._lock:
            entry, kek, fingerprint = self._create_kek()
            rest = self._keys
            # every KEK there was is retired for new wraps by this writer: a version that
            # lists one of them first again (or its wrapped bytes under a fresh id) is
            # refused, not followed
            self.retire_keks([k for k, v in rest.items() if self.is_kek(v)])
            self._keys = {entry.key_id: entry}
            self._keys.update((k, v) for k, v in rest.items() if k != entry.key_id)
            self._cache.put(_kek_slot(entry, self._table_key_id), (kek, fingerprint))
            self._ledger.record_use(entry, fingerprint)
            return entry

    def rotate_master_key(self, new_key_id: str, new_kms: KeyManagementClient | None = None) -> list[EncryptedKey]:
        """Re-wrap every KEK under master key ``new_key_id`` (held by ``new_kms``, default
        the current KMS) and make it the table key; returns the re-wrapped entries.

        KEK ids and ``KEY_TIMESTAMP`` stay (the timestamp is the AAD of the key metadata
        the KEK wrapped); manifest-list entries and data files are untouched.  The table
        property ``encryption.key-id`` (and a catalog's copy of it) must be updated to
        ``new_key_id`` together with the new ``encryption-keys``.  All KEKs are unwrapped
        and re-wrapped before anything changes, so a failure leaves the manager as it was.

        A replayed KEK is never carried over to the new master key: two KEKs that unwrap
        to the same key, or one that unwraps to the key of a KEK this writer retired
        under another id, raise :class:`~icecrypt.errors.ReplayedKeyError` (nothing
        changes).
        """
        if not isinstance(new_key_id, str) or not new_key_id:
            raise ValueError("new_key_id must be a non-empty str")
        target = new_kms or self._kms
        with self._lock:
            replaced: dict[str, EncryptedKey] = {}
            unwrapped: list[tuple[GcmKey, bytes]] = []
            owners: dict[bytes, str] = {}
            for entry in self._keys.values():
                if not self.is_kek(entry):
                    continue
                material = self._kms.unwrap_key(entry.encrypted_key_metadata, self._table_key_id)
                fingerprint = _fingerprint(material)
                other = owners.setdefault(fingerprint, entry.key_id)
                if other != entry.key_id:
                    raise self._refuse(entry, f"it unwraps to the key of KEK {other!r} (a replayed KEK)", rewrap=True)
                if fingerprint in self._ledger.retired_fingerprints and entry.key_id not in self._ledger.retired_ids:
                    raise self._refuse(
                        entry, "it unwraps to the key of a KEK a rotation of this table object retired", rewrap=True
                    )
                wrapped = target.wrap_key(material, new_key_id)
                unwrapped.append((GcmKey(material), fingerprint))
                del material
                replaced[entry.key_id] = entry.replace(encrypted_key_metadata=wrapped, encrypted_by_id=new_key_id)
            self._keys = {key_id: replaced.get(key_id, entry) for key_id, entry in self._keys.items()}
            self._kms = target
            self._table_key_id = new_key_id
            for entry, value in zip(replaced.values(), unwrapped):
                self._cache.put(_kek_slot(entry, new_key_id), value)
            return list(replaced.values())

    # --- metadata.json -----------------------------------------------------------------

    def remove_keys(self, key_ids: Iterable[str]) -> None:
        """Drop entries (e.g. those :func:`removable_keys` found); unknown ids are ignored."""
        drop = set(key_ids)
        with self._lock:
            self._keys = {k: v for k, v in self._keys.items() if k not in drop}

    def apply_to_metadata(self, metadata: Mapping[str, Any]) -> dict[str, Any]:
        """A copy of ``metadata`` with this manager's ``encryption-keys`` and table key id."""
        result = write_encryption_keys(metadata, self.encryption_keys)
        properties = result.get("properties")
        if isinstance(properties, Mapping) and properties.get(ENCRYPTION_TABLE_KEY) != self._table_key_id:
            properties = dict(properties)
            properties[ENCRYPTION_TABLE_KEY] = self._table_key_id
            result["properties"] = properties
        return result

    def __repr__(self) -> str:
        return (
            f"<EncryptionManager table_key_id={self._table_key_id!r} kms={self._kms!r} "
            f"keys={len(self._keys)} data_key_length={self._data_key_length}>"
        )

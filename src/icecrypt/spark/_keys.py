"""Where the Spark data sources get key metadata from, without key bytes in any option.

Spark options travel with the query (into plans, the UI, SQL ``OPTIONS``), so they only
ever hold *wrapped* keys, in the envelope Iceberg uses for table metadata: a KEK wrapped
by a KMS master key, and each file's key metadata AES-GCM-wrapped by the KEK with the
KEK's ``KEY_TIMESTAMP`` as AAD (:class:`icecrypt.keys.EncryptionManager`).  Two sources:

* ``keys.manifest`` — a key-metadata manifest file (:mod:`icecrypt.keys.manifest`);
* ``keys.wrapped`` — the text of such a manifest inline, made by :func:`wrap_keys`.

How keys reach the tasks of the file sources (option ``keys.transport``):

* ``executor`` (the default) — partitions and commit messages carry no key bytes in
  clear: every Python worker (planner and executors) resolves keys itself from the
  options, with the KMS the options describe, and keeps what it unwrapped in a small
  per-process cache (Spark reuses Python workers, so a KEK is unwrapped once per worker,
  not once per task).  Key metadata that has to cross Spark (write tasks -> commit)
  travels wrapped under a per-job KEK.  Executors need KMS access.
* ``task`` — the driver's planner unwraps the keys and each read partition carries the
  key metadata (DEK and AAD prefix) of its own files; a write task returns the key
  metadata it made for its file in its commit message.  Executors never call the KMS
  (they never even build a client: :func:`kms_client` connects on first use), and no
  KEK or master key ever leaves the driver.  This is how ``icecrypt.iceberg`` always
  works, as Iceberg Java does.

``docs/guides/spark.md`` ("Key transport") weighs the two.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow.fs as pafs

from icecrypt._gcm import GcmKey
from icecrypt.errors import EncryptionKeyNotFoundError, FormatError, IcecryptError
from icecrypt.keys import (
    ENCRYPTION_DEK_LENGTH,
    ENCRYPTION_TABLE_KEY,
    KEY_TIMESTAMP,
    EncryptedKey,
    EncryptionManager,
    StandardKeyMetadata,
    unwrap_key_metadata,
    wrap_key_metadata,
)
from icecrypt.kms import KeyManagementClient, create_kms_client
from icecrypt.spark._common import OPT_KEYS_MANIFEST, OPT_KEYS_WRAPPED, DataFile, kms_properties, resolve

__all__ = [
    "KeyRing",
    "canonical",
    "keyring",
    "kms_client",
    "manifest_manager",
    "new_file_key",
    "new_job_kek",
    "open_key",
    "seal_key",
    "table_key_id",
    "unwrap_keys",
    "wrap_keys",
]

_CACHE_SIZE = 8


class _Lru:
    """A tiny thread-safe LRU map for per-process caches."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._items: collections.OrderedDict[Any, Any] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Any, make: Callable[[], Any]) -> Any:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        value = make()
        with self._lock:
            self._items[key] = value
            while len(self._items) > self._size:
                self._items.popitem(last=False)
        return value


_CLIENTS = _Lru(_CACHE_SIZE)
_KEYRINGS = _Lru(_CACHE_SIZE)
_KEKS = _Lru(_CACHE_SIZE)


def _fingerprint(properties: Mapping[str, str]) -> str:
    """A digest of the KMS properties, used only as an in-process cache key."""
    data = json.dumps(sorted(properties.items()), separators=(",", ":")).encode("utf-8")
    return hashlib.sha256(data).hexdigest()


class _LazyKms(KeyManagementClient):
    """A KMS client that is created on its first wrap or unwrap.

    Executors load table metadata, which needs a client object, but with task-carried
    keys they never wrap or unwrap anything: building the real client there (reading a
    keystore, resolving credentials) would fail where executors have no KMS access."""

    def __init__(self, properties: Mapping[str, str]) -> None:
        self._properties = dict(properties)
        self._client: KeyManagementClient | None = None
        self._lock = threading.Lock()
        self.kms_type = self._properties.get("encryption.kms-type") or "custom"

    def _real(self) -> KeyManagementClient:
        with self._lock:
            if self._client is None:
                self._client = create_kms_client(self._properties)
            return self._client

    def wrap_key(self, key: bytes, wrapping_key_id: str) -> bytes:
        return self._real().wrap_key(key, wrapping_key_id)

    def unwrap_key(self, wrapped_key: bytes, wrapping_key_id: str) -> bytes:
        return self._real().unwrap_key(wrapped_key, wrapping_key_id)

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} kms-type={self.kms_type!r}>"


def kms_client(options: Mapping[str, str]) -> KeyManagementClient:
    """The KMS client the options describe (one per set of properties and process),
    created when it is first used."""
    properties = kms_properties(options)
    return _CLIENTS.get(_fingerprint(properties), lambda: _LazyKms(properties))


def table_key_id(options: Mapping[str, str], *, purpose: str = "write") -> str:
    """The master key id (option ``encryption.key-id``): the one new KEKs are wrapped
    under, and the only one a key manifest or ``keys.wrapped`` document is accepted under
    (a manifest names its own master key, and whoever can write it can name another)."""
    key_id = options.get(ENCRYPTION_TABLE_KEY)
    if not key_id or not str(key_id).strip():
        raise ValueError(f"option {ENCRYPTION_TABLE_KEY} (the KMS master key that wraps the files' keys) is "
                         f"required to {purpose}")
    return str(key_id).strip()


def data_key_length(options: Mapping[str, str]) -> int:
    """``encryption.data-key-length``: 16 (default), 24 or 32."""
    raw = options.get(ENCRYPTION_DEK_LENGTH)
    if raw is None or not str(raw).strip():
        return 16
    try:
        length = int(str(raw).strip())
    except ValueError:
        length = 0
    if length not in (16, 24, 32):
        raise ValueError(f"option {ENCRYPTION_DEK_LENGTH}={raw!r} must be 16, 24 or 32")
    return length


# --- keys.wrapped: a key manifest document carried inline -----------------------------


def wrap_keys(
    keys: Mapping[str, StandardKeyMetadata | bytes],
    kms: KeyManagementClient,
    table_key_id: str,
    *,
    data_key_length: int = 16,
) -> str:
    """The ``keys.wrapped`` option value for ``keys`` (path -> key metadata): the JSON
    text of a key manifest (:func:`icecrypt.keys.manifest.write_key_manifest`), so the
    option holds wrapped keys only and reads exactly like a manifest file."""
    from icecrypt.keys.manifest import write_key_manifest

    manager = EncryptionManager(kms, table_key_id, data_key_length=data_key_length)
    with tempfile.TemporaryDirectory(prefix="icecrypt-keys-") as directory:
        path = os.path.join(directory, "keys.json")
        write_key_manifest(path, keys, manager)
        with open(path, encoding="utf-8") as f:
            document = json.load(f)
    return json.dumps(document, separators=(",", ":"))


def unwrap_keys(text: str, kms: KeyManagementClient, *, table_key_id: str | None = None) -> dict[str, StandardKeyMetadata]:
    """Inverse of :func:`wrap_keys`: FormatError / AuthenticationError / KmsError on bad input,
    with messages that name the option.  ``table_key_id``: the master key the document
    must be wrapped under (:func:`icecrypt.keys.manifest.read_key_manifest`); the data
    sources always pass option ``encryption.key-id``."""
    from icecrypt.keys.manifest import read_key_manifest

    origin = f"option {OPT_KEYS_WRAPPED}"
    with tempfile.TemporaryDirectory(prefix="icecrypt-keys-") as directory:
        path = os.path.join(directory, "keys.json")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        try:
            return read_key_manifest(path, kms, table_key_id=table_key_id)
        except (IcecryptError, ValueError) as exc:
            message = str(exc).replace(path, origin)
            try:
                renamed = type(exc)(message)
            except TypeError:  # KmsError subclasses take backend= too
                renamed = type(exc)(message, backend=getattr(exc, "backend", None))
            raise renamed from None


# --- looking up a file's key -----------------------------------------------------------------


def canonical(name: str) -> str:
    """The name a file's key is looked up by: a local absolute path normalized, the path
    part of a URI (``s3://bucket/key`` -> ``bucket/key``, as pyarrow names it), or the name
    as it is (a path on a remote file system)."""
    scheme, sep, rest = name.partition("://")
    if sep and len(scheme) >= 2:
        if scheme.lower() != "file":
            return rest.rstrip("/")
        name = rest
    return os.path.normpath(name) if os.path.isabs(name) else name.rstrip("/")


class KeyRing:
    """The key metadata of data files, by path, from one manifest or wrapped document."""

    def __init__(self, keys: Mapping[str, StandardKeyMetadata], origin: str) -> None:
        self._origin = origin
        self._keys = {canonical(name): km for name, km in keys.items()}

    def __len__(self) -> int:
        return len(self._keys)

    def get(self, file: DataFile) -> StandardKeyMetadata:
        """The key metadata of ``file``; EncryptionKeyNotFoundError naming it if there is none."""
        km = self._keys.get(canonical(file.uri))
        if km is None:
            raise EncryptionKeyNotFoundError(f"no key metadata for {file.uri} in {self._origin}")
        return km

    def __repr__(self) -> str:
        return f"<KeyRing {len(self._keys)} files from {self._origin}>"


def _load_manifest(location: str, options: Mapping[str, str]) -> KeyRing:
    from icecrypt.keys.manifest import read_key_manifest

    filesystem, path, prefix = resolve(location, options)
    info = filesystem.get_file_info(path)
    if info.type != pafs.FileType.File:
        raise EncryptionKeyNotFoundError(f"key manifest {location} (option {OPT_KEYS_MANIFEST}) does not exist")
    properties = kms_properties(options)
    expected = table_key_id(options, purpose="read encrypted files")
    cache_key = ("manifest", prefix + path, info.mtime_ns, info.size, _fingerprint(properties), expected)

    def load() -> KeyRing:
        keys = read_key_manifest(path, kms_client(options), table_key_id=expected, filesystem=filesystem)
        return KeyRing(keys, f"key manifest {location}")

    return _KEYRINGS.get(cache_key, load)


def keyring(options: Mapping[str, str]) -> KeyRing:
    """The key metadata the options point to (``keys.manifest`` or ``keys.wrapped``)."""
    manifest = options.get(OPT_KEYS_MANIFEST)
    wrapped = options.get(OPT_KEYS_WRAPPED)
    if manifest and wrapped:
        raise ValueError(f"give one of the options {OPT_KEYS_MANIFEST} and {OPT_KEYS_WRAPPED}, not both")
    if manifest:
        return _load_manifest(manifest, options)
    if wrapped:
        properties = kms_properties(options)
        expected = table_key_id(options, purpose="read encrypted files")
        digest = hashlib.sha256(wrapped.encode("utf-8")).hexdigest()
        return _KEYRINGS.get(
            ("wrapped", digest, _fingerprint(properties), expected),
            lambda: KeyRing(unwrap_keys(wrapped, kms_client(options), table_key_id=expected),
                            f"option {OPT_KEYS_WRAPPED}"),
        )
    raise EncryptionKeyNotFoundError(
        f"no key metadata given: set option {OPT_KEYS_MANIFEST} (a key manifest file) or {OPT_KEYS_WRAPPED} "
        "(icecrypt.spark.wrap_keys), with the KMS properties (encryption.kms-type, ...); plaintext files "
        "are only read with encryption=none"
    )


# --- keys in transit: wrapped under a per-job KEK -------------------------------------------
# Key metadata that must cross Spark (from write tasks to the driver's commit, from the
# planner to read tasks of tables) travels wrapped by a KEK made for the job: an
# ``encryption-keys`` entry wrapped by the KMS master key (as Iceberg's KEKs), with
# AES-GCM under the KEK and its KEY_TIMESTAMP as AAD (as Iceberg wraps manifest-list keys).


def new_job_kek(options: Mapping[str, str], master_key_id: str | None = None) -> EncryptedKey:
    """A fresh KEK for one job, wrapped by master key ``master_key_id`` (default option
    ``encryption.key-id``): one KMS call, on the driver."""
    manager = EncryptionManager(kms_client(options), master_key_id or table_key_id(options),
                                data_key_length=data_key_length(options))
    return manager.rotate_kek()


def _job_kek(options: Mapping[str, str], kek: EncryptedKey) -> GcmKey:
    """The unwrapped KEK, once per process (Spark reuses Python workers across tasks)."""
    properties = kms_properties(options)

    def unwrap() -> GcmKey:
        if kek.encrypted_by_id is None or kek.key_timestamp is None:
            raise FormatError(f"job KEK {kek.key_id!r} lacks its master key id or {KEY_TIMESTAMP}")
        return GcmKey(kms_client(options).unwrap_key(kek.encrypted_key_metadata, kek.encrypted_by_id))

    return _KEKS.get((_fingerprint(properties), kek), unwrap)


def seal_key(options: Mapping[str, str], kek: EncryptedKey, key_metadata: StandardKeyMetadata) -> bytes:
    """``key_metadata`` wrapped by the job's KEK."""
    return wrap_key_metadata(_job_kek(options, kek), kek.key_timestamp or "", key_metadata)


def open_key(options: Mapping[str, str], kek: EncryptedKey, wrapped: bytes) -> StandardKeyMetadata:
    """Inverse of :func:`seal_key`; AuthenticationError if ``wrapped`` was altered."""
    return unwrap_key_metadata(_job_kek(options, kek), kek.key_timestamp or "", wrapped)


def new_file_key(options: Mapping[str, str]) -> StandardKeyMetadata:
    """A fresh DEK (``encryption.data-key-length`` bytes) and 16-byte AAD prefix for one file."""
    return StandardKeyMetadata(os.urandom(data_key_length(options)), os.urandom(16))


def manifest_manager(options: Mapping[str, str]) -> EncryptionManager:
    """The manager whose KMS, master key and key length a written key manifest uses."""
    return EncryptionManager(kms_client(options), table_key_id(options), data_key_length=data_key_length(options))

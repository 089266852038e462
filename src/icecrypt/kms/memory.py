"""An in-memory KMS in the format of Iceberg's test KMS (``UnitestKMS`` / ``MemoryMockKMS``).

A wrapped key is ``nonce(12) || AES-GCM(master key, key, no AAD) || tag(16)``, so keys
wrapped by Iceberg Java's tests (and the tables in ``shared/tables``) unwrap here with the
same master keys.  For tests and local experiments only: the master keys live in process
memory.

Configured through properties (``encryption.kms-type = memory``)::

    encryption.kms.memory.key.<key-id> = <hex>            # 16, 24 or 32 bytes
    encryption.kms.memory.key.<key-id> = base64:<base64>
    encryption.kms.memory.iceberg-test-keys = true        # adds keyA and keyB

A bare value is hex, never guessed: a 32-digit hex string is also valid base64.
"""

from __future__ import annotations

import base64
import binascii
import os
import threading
from collections.abc import Mapping

from icecrypt._gcm import GcmKey
from icecrypt.errors import (
    AuthenticationError,
    FormatError,
    KmsError,
    KmsInvalidWrappedKeyError,
    KmsKeyNotFoundError,
)
from icecrypt.kms.base import KeyManagementClient

__all__ = ["MemoryKms", "ICEBERG_TEST_MASTER_KEYS", "KEY_PROPERTY_PREFIX"]

KEY_PROPERTY_PREFIX = "encryption.kms.memory.key."
TEST_KEYS_PROPERTY = "encryption.kms.memory.iceberg-test-keys"

#: the master keys of Iceberg Java's test KMS (ASCII strings used as AES-128 keys)
ICEBERG_TEST_MASTER_KEYS: Mapping[str, bytes] = {
    "keyA": b"0123456789012345",
    "keyB": b"1123456789012345",
}


def _parse_key_value(key_id: str, value: str) -> bytes:
    text = value.strip()
    try:
        if text.startswith("base64:"):
            return base64.b64decode(text[len("base64:") :], validate=True)
        if text.startswith("hex:"):
            text = text[len("hex:") :]
        return bytes.fromhex(text)
    except (ValueError, binascii.Error):
        raise KmsError(
            f"property {KEY_PROPERTY_PREFIX}{key_id}: not hex or 'base64:...'", backend="memory"
        ) from None


class MemoryKms(KeyManagementClient):
    """Master keys held in memory; wraps as Iceberg's test KMS does (no AAD)."""

    kms_type = "memory"

    def __init__(self, master_keys: Mapping[str, bytes] | None = None) -> None:
        self._lock = threading.Lock()
        self._keys: dict[str, GcmKey] = {}
        for key_id, material in (master_keys or {}).items():
            self.add_key(key_id, material)

    @classmethod
    def with_iceberg_test_keys(cls) -> MemoryKms:
        """A client holding Iceberg's test master keys ``keyA`` and ``keyB``."""
        return cls(ICEBERG_TEST_MASTER_KEYS)

    def initialize(self, properties: Mapping[str, str]) -> None:
        """Add master keys from ``encryption.kms.memory.*`` properties (see module doc)."""
        if str(properties.get(TEST_KEYS_PROPERTY, "")).strip().lower() == "true":
            for key_id, material in ICEBERG_TEST_MASTER_KEYS.items():
                self.add_key(key_id, material)
        for name, value in properties.items():
            if name.startswith(KEY_PROPERTY_PREFIX):
                key_id = name[len(KEY_PROPERTY_PREFIX) :]
                self.add_key(key_id, _parse_key_value(key_id, value))

    def add_key(self, key_id: str, material: bytes | None = None) -> None:
        """Hold a master key (random 32 bytes if ``material`` is None); replaces an old one."""
        if not isinstance(key_id, str) or not key_id:
            raise ValueError("master key id must be a non-empty str")
        if material is None:
            material = os.urandom(32)
        try:
            key = GcmKey(material)
        except ValueError:
            raise KmsError(
                f"master key {key_id!r} must be 16, 24 or 32 bytes", backend="memory"
            ) from None
        with self._lock:
            self._keys[key_id] = key

    @property
    def key_ids(self) -> list[str]:
        with self._lock:
            return list(self._keys)

    def _key(self, key_id: str) -> GcmKey:
        with self._lock:
            key = self._keys.get(key_id)
        if key is None:
            raise KmsKeyNotFoundError(f"memory KMS has no master key {key_id!r}", backend="memory")
        return key

    def wrap_key(self, key: bytes, wrapping_key_id: str) -> bytes:
        return self._key(wrapping_key_id).seal(key)

    def unwrap_key(self, wrapped_key: bytes, wrapping_key_id: str) -> bytes:
        master = self._key(wrapping_key_id)
        try:
            return master.open(wrapped_key)
        except FormatError as exc:
            raise KmsInvalidWrappedKeyError(
                f"wrapped key is malformed ({exc})", backend="memory"
            ) from exc
        except AuthenticationError as exc:
            raise KmsInvalidWrappedKeyError(
                f"wrapped key does not authenticate under master key {wrapping_key_id!r} "
                "(wrong master key, or tampered)",
                backend="memory",
            ) from exc

    def __repr__(self) -> str:
        return f"<MemoryKms keys={self.key_ids!r}>"

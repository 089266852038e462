"""The embedded default KMS: master keys in a local keystore file.

For single-machine use and development, where no key service is at hand.  The keystore is
a JSON file readable by its owner only (mode 0600)::

    {"format": "icecrypt-local-keystore", "version": 1,
     "keys": {"master": {"material": "<base64 of 16, 24 or 32 bytes>",
                         "created-ms": 1795316508059}}}

A wrapped key is ``0x01 || nonce(12) || AES-GCM(master, key, AAD) || tag(16)`` with
``AAD = 0x01 || UTF-8(master key id)``: the version byte and the master key id are
authenticated, so a blob wrapped under one master key never unwraps under another name.

Properties (``encryption.kms-type = local``): ``encryption.kms.local.keystore`` = path;
without it the ``ICECRYPT_KEYSTORE`` environment variable is used.

:meth:`LocalKms.add_key` and :meth:`LocalKms.remove_key` read, change and replace the
keystore under an exclusive ``flock`` of ``<keystore>.lock`` (created 0600 beside it), so
two processes rotating master keys at once never lose one another's key.  (Where ``fcntl``
is missing, as on Windows, only threads of one process are serialized.)
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
import stat
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from icecrypt._atomic import AtomicFile
from icecrypt._gcm import GcmKey
from icecrypt.errors import (
    AuthenticationError,
    KmsAccessDeniedError,
    KmsError,
    KmsInvalidWrappedKeyError,
    KmsKeyNotFoundError,
)
from icecrypt.kms.base import KeyManagementClient

__all__ = ["LocalKms", "KEYSTORE_PROPERTY", "KEYSTORE_ENV", "WRAP_VERSION"]

KEYSTORE_PROPERTY = "encryption.kms.local.keystore"
KEYSTORE_ENV = "ICECRYPT_KEYSTORE"
KEYSTORE_FORMAT = "icecrypt-local-keystore"
KEYSTORE_VERSION = 1
WRAP_VERSION = 1
_BACKEND = "local"


def _error(cls: type[KmsError], message: str) -> KmsError:
    return cls(message, backend=_BACKEND)


def _write_keystore(path: Path, document: dict, *, overwrite: bool) -> None:
    """Write the keystore atomically, mode 0600 (AtomicFile's temporary file is created
    0600, whatever the umask); with ``overwrite=False`` an existing file is refused."""
    with AtomicFile(path) as out:
        out.file.write((json.dumps(document, indent=2) + "\n").encode("utf-8"))
        out.commit(overwrite=overwrite)


@contextlib.contextmanager
def _keystore_lock(path: Path):
    """An exclusive inter-process lock on ``<path>.lock`` for a read-modify-write of the
    keystore (the keystore itself is replaced by rename, so it cannot carry the lock)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    lock_path = path.with_name(path.name + ".lock")
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError as exc:
        raise _error(KmsAccessDeniedError, f"cannot open the keystore lock {lock_path}: {exc.strerror}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _new_entry(key_length: int) -> dict:
    return {
        "material": base64.b64encode(os.urandom(key_length)).decode("ascii"),
        "created-ms": time.time_ns() // 1_000_000,
    }


class LocalKms(KeyManagementClient):
    """Master keys from a local 0600 keystore file (see the module doc for the format)."""

    kms_type = "local"

    def __init__(self, keystore: str | os.PathLike[str] | None = None) -> None:
        self._lock = threading.RLock()
        self._path: Path | None = None
        self._keys: dict[str, GcmKey] = {}
        self._created: dict[str, int] = {}
        self._stamp: tuple[int, int, int] | None = None  # (inode, size, mtime_ns) of what was loaded
        if keystore is not None:
            self._load(Path(keystore))

    # --- keystore management -----------------------------------------------------------

    @classmethod
    def create_keystore(
        cls,
        path: str | os.PathLike[str],
        key_ids: Iterable[str] = ("master",),
        key_length: int = 32,
    ) -> LocalKms:
        """Create a new keystore at ``path`` with fresh random master keys; returns a client.

        The file is written with mode 0600 to a temporary name and linked into place, so
        it appears complete or not at all; an existing file is never overwritten
        (:class:`FileExistsError`).
        """
        path = Path(path)
        if key_length not in (16, 24, 32):
            raise ValueError(f"key_length must be 16, 24 or 32, not {key_length}")
        ids = list(key_ids)
        if not ids or not all(isinstance(k, str) and k for k in ids):
            raise ValueError("key_ids must be non-empty strings")
        if len(set(ids)) != len(ids):
            raise ValueError("key_ids must be distinct")
        document = {
            "format": KEYSTORE_FORMAT,
            "version": KEYSTORE_VERSION,
            "keys": {key_id: _new_entry(key_length) for key_id in ids},
        }
        _write_keystore(path, document, overwrite=False)  # FileExistsError instead of replacing
        return cls(path)

    def add_key(self, key_id: str, key_length: int = 32) -> None:
        """Add a fresh random master key to the keystore file (master-key rotation).

        The file is re-read, extended and atomically replaced under the keystore's
        inter-process lock; an existing id is refused.
        """
        if not isinstance(key_id, str) or not key_id:
            raise ValueError("master key id must be a non-empty str")
        if key_length not in (16, 24, 32):
            raise ValueError(f"key_length must be 16, 24 or 32, not {key_length}")
        with self._lock:
            path = self._require_path()
            with _keystore_lock(path):
                document = self._read_document(path)
                if key_id in document["keys"]:
                    raise KmsError(f"keystore {path} already has a master key {key_id!r}", backend=_BACKEND)
                document["keys"][key_id] = _new_entry(key_length)
                _write_keystore(path, document, overwrite=True)
                self._load(path)

    def remove_key(self, key_id: str) -> None:
        """Remove master key ``key_id`` from the keystore file (retire it after a rotation).

        Whatever it wrapped can no longer be unwrapped: re-wrap first (e.g.
        ``EncryptionManager.rotate_master_key``).  The file is re-read, reduced and
        atomically replaced under the keystore's inter-process lock; an unknown id is
        :class:`~icecrypt.KmsKeyNotFoundError`.
        """
        with self._lock:
            path = self._require_path()
            with _keystore_lock(path):
                document = self._read_document(path)
                if key_id not in document["keys"]:
                    raise _error(KmsKeyNotFoundError, f"keystore {path} has no master key {key_id!r}")
                del document["keys"][key_id]
                _write_keystore(path, document, overwrite=True)
                self._load(path)

    @property
    def keystore_path(self) -> Path | None:
        return self._path

    @property
    def key_ids(self) -> list[str]:
        with self._lock:
            return list(self._keys)

    def created_ms(self, key_id: str) -> int:
        """When master key ``key_id`` was created (ms since the epoch)."""
        with self._lock:
            if key_id not in self._created:
                raise _error(KmsKeyNotFoundError, f"local keystore has no master key {key_id!r}")
            return self._created[key_id]

    # --- loading -----------------------------------------------------------------------

    def initialize(self, properties: Mapping[str, str]) -> None:
        """Load the keystore named by ``encryption.kms.local.keystore`` or ``$ICECRYPT_KEYSTORE``."""
        location = properties.get(KEYSTORE_PROPERTY) or os.environ.get(KEYSTORE_ENV)
        if not location:
            raise KmsError(
                f"local KMS needs a keystore: set {KEYSTORE_PROPERTY} or ${KEYSTORE_ENV}",
                backend=_BACKEND,
            )
        self._load(Path(location))

    def _require_path(self) -> Path:
        if self._path is None:
            raise KmsError("local KMS has no keystore loaded", backend=_BACKEND)
        return self._path

    @staticmethod
    def _read_document(path: Path) -> dict:
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            raise KmsError(f"keystore {path} does not exist", backend=_BACKEND) from None
        except OSError as exc:
            raise _error(KmsAccessDeniedError, f"cannot open keystore {path}: {exc.strerror}") from exc
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise KmsError(f"keystore {path} is not a regular file", backend=_BACKEND)
            if os.name == "posix" and st.st_mode & 0o077:
                raise _error(
                    KmsAccessDeniedError,
                    f"keystore {path} has mode {stat.S_IMODE(st.st_mode):04o}: group/other may "
                    "access it; run chmod 600",
                )
            raw = f.read()
        try:
            document = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:  # RecursionError: nested too deep
            raise KmsError(f"keystore {path} is not valid JSON ({exc})", backend=_BACKEND) from None
        if (
            not isinstance(document, dict)
            or document.get("format") != KEYSTORE_FORMAT
            or not isinstance(document.get("keys"), dict)
        ):
            raise KmsError(f"keystore {path} is not an icecrypt local keystore", backend=_BACKEND)
        if document.get("version") != KEYSTORE_VERSION:
            raise KmsError(
                f"keystore {path} has unsupported version {document.get('version')!r}", backend=_BACKEND
            )
        return document

    @staticmethod
    def _file_stamp(path: Path) -> tuple[int, int, int] | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _load(self, path: Path) -> None:
        stamp = self._file_stamp(path)
        document = self._read_document(path)
        keys: dict[str, GcmKey] = {}
        created: dict[str, int] = {}
        for key_id, entry in document["keys"].items():
            bad = f"keystore {path}: master key {key_id!r} is malformed"
            if not isinstance(entry, dict) or not isinstance(entry.get("material"), str):
                raise KmsError(bad, backend=_BACKEND)
            try:
                keys[key_id] = GcmKey(base64.b64decode(entry["material"], validate=True))
            except (binascii.Error, ValueError):
                raise KmsError(f"{bad} (material must be base64 of 16, 24 or 32 bytes)", backend=_BACKEND) from None
            created_ms = entry.get("created-ms")
            created[key_id] = created_ms if isinstance(created_ms, int) and not isinstance(created_ms, bool) else 0
        with self._lock:
            self._path = path
            self._keys = keys
            self._created = created
            self._stamp = stamp

    # --- wrapping ----------------------------------------------------------------------

    def _master(self, key_id: str) -> GcmKey:
        with self._lock:
            path = self._require_path()
            # Another process may have rotated the keystore (added or retired a master key,
            # always by replacing the file): follow it, so long-lived clients (Spark
            # workers) neither miss a new key nor keep using a removed one.
            if self._file_stamp(path) != self._stamp:
                self._load(path)
            key = self._keys.get(key_id)
        if key is None:
            raise _error(KmsKeyNotFoundError, f"local keystore {self._path} has no master key {key_id!r}")
        return key

    @staticmethod
    def _aad(key_id: str) -> bytes:
        return bytes((WRAP_VERSION,)) + key_id.encode("utf-8")

    def wrap_key(self, key: bytes, wrapping_key_id: str) -> bytes:
        master = self._master(wrapping_key_id)
        return bytes((WRAP_VERSION,)) + master.seal(key, self._aad(wrapping_key_id))

    def unwrap_key(self, wrapped_key: bytes, wrapping_key_id: str) -> bytes:
        master = self._master(wrapping_key_id)
        blob = memoryview(wrapped_key)
        if len(blob) < 1 + 28:
            raise _error(KmsInvalidWrappedKeyError, f"wrapped key is too short ({len(blob)} bytes)")
        if blob[0] != WRAP_VERSION:
            raise _error(KmsInvalidWrappedKeyError, f"wrapped key has unknown version byte 0x{blob[0]:02x}")
        try:
            return master.open(blob[1:], self._aad(wrapping_key_id))
        except AuthenticationError as exc:
            raise _error(
                KmsInvalidWrappedKeyError,
                f"wrapped key does not authenticate under master key {wrapping_key_id!r} "
                "(wrapped by another key, or tampered)",
            ) from exc

    def __repr__(self) -> str:
        return f"<LocalKms keystore={str(self._path) if self._path else None!r} keys={self.key_ids!r}>"

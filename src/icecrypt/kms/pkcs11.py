"""PKCS#11 key management client (``encryption.kms-type=pkcs11``) over python-pkcs11.

The master key is an AES secret key object in a PKCS#11 token (an HSM, or SoftHSM2 for
tests), found by its label (``CKA_LABEL``) = the ``wrapping_key_id``.  Wrapping is AES-GCM
(``CKM_AES_GCM``, C_Encrypt/C_Decrypt) computed inside the token, so the master key never
leaves it; :meth:`Pkcs11Kms.generate_master_key` creates one that is sensitive,
non-extractable and allowed only to encrypt and decrypt.  GCM was chosen over RFC 5649 key
wrap (``CKM_AES_KEY_WRAP_PAD``) because it works on the raw key bytes (C_WrapKey needs the
wrapped key to be an extractable token object first), authenticates additional data, and
behaves the same on every token (SoftHSM2's "KEY_WRAP_PAD" is really ``KWP``).

Wrapped blob (all offsets in bytes)::

    0      1       version = 0x01
    1      12      GCM IV (random)
    13     n       ciphertext (n = len(key))
    13+n   16      GCM tag

The AAD is ``b"icecrypt-pkcs11-wrap" || version || utf-8(label)``: a blob unwraps only
under the label it was wrapped for, even if two labels name copies of the same key.

Properties read by :meth:`Pkcs11Kms.initialize`:

``pkcs11.module`` (path of the PKCS#11 library, required), ``pkcs11.token-label`` and/or
``pkcs11.slot`` (slot id; at least one), ``pkcs11.pin`` (user PIN; when absent, the
environment variable named by ``pkcs11.pin-env``, default ``ICECRYPT_PKCS11_PIN``).
SoftHSM2 reads ``SOFTHSM2_CONF`` when the module is first loaded in the process.  The
module is loaded under its real path (symlinks resolved); python-pkcs11 caches modules by
path string, so other code in the process must load it under that same path, or the
second ``C_Initialize`` fails (``CKR_CRYPTOKI_ALREADY_INITIALIZED``).

Sessions and threads.  python-pkcs11 calls ``C_Initialize(NULL)``, which (PKCS#11 v2.40
§5.4) lets the library assume it is never entered by two threads at once, and SoftHSM2
then runs without internal locks.  So every call into a module goes through one lock per
module, and all clients of one token in this process share one logged-in session (PKCS#11
login state belongs to the application, not to a session: a second ``C_Login`` fails
with ``CKR_USER_ALREADY_LOGGED_IN`` even with a wrong PIN, and any ``C_Logout`` logs out
every session).  The shared session is reference-counted and logged out when the last
client closes; a client whose PIN differs from the one the token was logged in with is
refused.  Calls after :meth:`~Pkcs11Kms.close` log in again.

Errors: a module that cannot be loaded, an unknown token or slot, a removed device ->
:class:`KmsUnavailableError`; a wrong or locked PIN -> :class:`KmsAccessDeniedError`; no
AES key with the label -> :class:`KmsKeyNotFoundError`; a failed C_Decrypt (SoftHSM2
reports a GCM tag mismatch as ``CKR_GENERAL_ERROR``) or a malformed blob ->
:class:`KmsInvalidWrappedKeyError`; anything else -> :class:`KmsError`.  No message holds
key bytes or the PIN.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from icecrypt.errors import (
    KmsAccessDeniedError,
    KmsError,
    KmsInvalidWrappedKeyError,
    KmsKeyNotFoundError,
    KmsUnavailableError,
)
from icecrypt.kms.base import KeyManagementClient

__all__ = ["Pkcs11Kms"]

VERSION = 0x01
IV_LENGTH = 12
TAG_LENGTH = 16
_AAD_LABEL = b"icecrypt-pkcs11-wrap"
_HEADER_LENGTH = 1 + IV_LENGTH
_DEFAULT_PIN_ENV = "ICECRYPT_PKCS11_PIN"
_BACKEND = "pkcs11"


def _pkcs11():
    """Import python-pkcs11 lazily (an optional extra: ``icecrypt[pkcs11]``)."""
    try:
        import pkcs11
        from pkcs11 import exceptions
        from pkcs11.mechanisms import GCMParams
    except ImportError as exc:  # pragma: no cover - depends on the environment
        message = f"the pkcs11 KMS needs python-pkcs11 (pip install 'icecrypt[pkcs11]'): {exc}"
        raise KmsError(message, backend=_BACKEND) from exc
    return pkcs11, exceptions, GCMParams


# -- process-wide state: one lock per module, one logged-in session per token ----------------

_REGISTRY_LOCK = threading.Lock()
_MODULE_LOCKS: dict[str, threading.Lock] = {}


@dataclass
class _Login:
    """The logged-in session of one token, shared by every client in this process."""

    session: object
    salt: bytes
    pin_digest: bytes
    users: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


_LOGINS: dict[tuple[str, int], _Login] = {}


def _digest(salt: bytes, pin: str) -> bytes:
    return hashlib.sha256(salt + pin.encode("utf-8")).digest()


def _module_lock(module: str) -> threading.Lock:
    with _REGISTRY_LOCK:
        return _MODULE_LOCKS.setdefault(module, threading.Lock())


def _aad(label: str) -> bytes:
    return _AAD_LABEL + bytes([VERSION]) + label.encode("utf-8")


def _bytes_like(value, what: str) -> bytes:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"{what} must be bytes-like, not {type(value).__name__}")
    return bytes(value)


class Pkcs11Kms(KeyManagementClient):
    """Wraps keys with AES-GCM inside a PKCS#11 token (see the module docstring)."""

    kms_type = "pkcs11"

    def __init__(self) -> None:
        self._module = ""
        self._token_label: str | None = None
        self._slot: int | None = None
        self._pin: str | None = None
        self._token = None
        self._login_key: tuple[str, int] | None = None
        self._login: _Login | None = None
        self._state_lock = threading.Lock()

    # -- configuration -------------------------------------------------------------------

    def initialize(self, properties: Mapping[str, str]) -> None:
        """Load the module, find the token and log in (failing early on a bad setup)."""
        module = properties.get("pkcs11.module")
        if not module:
            raise KmsError("pkcs11.module is required", backend=self.kms_type)
        self._module = os.path.realpath(module)
        self._token_label = properties.get("pkcs11.token-label") or None
        slot = properties.get("pkcs11.slot")
        if slot is not None and slot != "":
            try:
                self._slot = int(slot, 0)
            except ValueError:
                raise KmsError(f"pkcs11.slot must be an integer, not {slot!r}", backend=self.kms_type) from None
        if self._token_label is None and self._slot is None:
            raise KmsError("set pkcs11.token-label or pkcs11.slot", backend=self.kms_type)
        pin = properties.get("pkcs11.pin")
        if pin is None:
            pin = os.environ.get(properties.get("pkcs11.pin-env") or _DEFAULT_PIN_ENV)
        if not pin:
            raise KmsError("no PKCS#11 user PIN: set pkcs11.pin or the pkcs11.pin-env variable", backend=self.kms_type)
        self._pin = pin
        self._token = self._find_token()
        self._acquire_login()

    def _find_token(self):
        pkcs11, exceptions, _ = _pkcs11()
        where = self._where()
        with _module_lock(self._module):
            try:
                lib = pkcs11.lib(self._module)
                if self._slot is None:
                    return lib.get_token(token_label=self._token_label)
                for slot in lib.get_slots(token_present=True):
                    if slot.slot_id == self._slot:
                        token = slot.get_token()
                        if self._token_label is not None and token.label != self._token_label:
                            raise KmsUnavailableError(
                                f"{where}: slot {self._slot} holds token {token.label!r}", backend=self.kms_type
                            )
                        return token
                raise KmsUnavailableError(f"{where}: no token in slot {self._slot}", backend=self.kms_type)
            except exceptions.PKCS11Error as exc:
                # Loading errors are plain PKCS11Error; NoSuchToken, TokenNotPresent, ...
                raise KmsUnavailableError(f"{where}: {type(exc).__name__}: {exc}", backend=self.kms_type) from exc

    def _acquire_login(self) -> _Login:
        """Join (or create) the shared logged-in session of this token."""
        with self._state_lock:
            if self._login is not None:
                return self._login
            _, exceptions, _ = _pkcs11()
            key = (self._module, int(self._token.slot.slot_id))
            with _module_lock(self._module):
                login = _LOGINS.get(key)
                if login is None:
                    try:
                        session = self._token.open(user_pin=self._pin)
                    except exceptions.UserAlreadyLoggedIn:
                        # Logged in by code outside icecrypt: the PIN cannot be checked, and
                        # every session of this process may already use the token's keys.
                        session = self._token.open()
                    except exceptions.PKCS11Error as exc:
                        raise self._map(exc, "C_Login") from exc
                    salt = os.urandom(16)
                    login = _Login(session, salt, _digest(salt, self._pin))
                    _LOGINS[key] = login
                elif not hmac.compare_digest(login.pin_digest, _digest(login.salt, self._pin)):
                    raise KmsAccessDeniedError(
                        f"{self._where()}: the token is logged in in this process with a different PIN",
                        backend=self.kms_type,
                    )
                login.users += 1
            self._login, self._login_key = login, key
            return login

    def close(self) -> None:
        """Leave the shared session; the last client of a token logs out.  Idempotent."""
        with self._state_lock:
            login, key = self._login, self._login_key
            self._login = None
            if login is None:
                return
            with _module_lock(self._module):
                login.users -= 1
                if login.users == 0:
                    del _LOGINS[key]
                    try:
                        login.session.close()
                    except Exception:  # noqa: BLE001 - the token may be gone; nothing to do
                        pass

    def __repr__(self) -> str:
        return f"<Pkcs11Kms kms-type='pkcs11' module={self._module!r} token={self._token_label!r}>"

    # -- the protocol ----------------------------------------------------------------------

    def wrap_key(self, key: bytes, wrapping_key_id: str) -> bytes:
        """Encrypt ``key`` with AES-GCM under the token key labelled ``wrapping_key_id``."""
        key = _bytes_like(key, "key")
        if not key:
            raise ValueError("key must not be empty")
        pkcs11, _, GCMParams = _pkcs11()
        iv = os.urandom(IV_LENGTH)
        params = GCMParams(iv, _aad(wrapping_key_id), TAG_LENGTH * 8)
        sealed = self._run(
            wrapping_key_id, "C_Encrypt",
            lambda k: k.encrypt(key, mechanism=pkcs11.Mechanism.AES_GCM, mechanism_param=params),
        )
        if len(sealed) != len(key) + TAG_LENGTH:
            raise KmsError(f"{self._where()}: C_Encrypt returned {len(sealed)} bytes", backend=self.kms_type)
        return bytes([VERSION]) + iv + bytes(sealed)

    def unwrap_key(self, wrapped_key: bytes, wrapping_key_id: str) -> bytes:
        """Decrypt and authenticate a blob from :meth:`wrap_key` inside the token."""
        wrapped_key = _bytes_like(wrapped_key, "wrapped_key")
        if len(wrapped_key) <= _HEADER_LENGTH + TAG_LENGTH or wrapped_key[0] != VERSION:
            raise KmsInvalidWrappedKeyError(
                f"not a PKCS#11-wrapped key (length {len(wrapped_key)}, expected version {VERSION})",
                backend=self.kms_type,
            )
        pkcs11, _, GCMParams = _pkcs11()
        params = GCMParams(wrapped_key[1:_HEADER_LENGTH], _aad(wrapping_key_id), TAG_LENGTH * 8)
        sealed = wrapped_key[_HEADER_LENGTH:]
        return bytes(
            self._run(
                wrapping_key_id, "C_Decrypt",
                lambda k: k.decrypt(sealed, mechanism=pkcs11.Mechanism.AES_GCM, mechanism_param=params),
            )
        )

    def generate_master_key(self, label: str, key_length: int = 32) -> str:
        """Generate an AES master key inside the token and return its label.

        The key is a token object, private, sensitive and non-extractable, usable only for
        encrypt/decrypt: its value can never be read out.  An existing label is refused.
        """
        if key_length not in (16, 24, 32):
            raise ValueError("key_length must be 16, 24 or 32 bytes")
        if not label:
            raise ValueError("label must not be empty")
        pkcs11, exceptions, _ = _pkcs11()
        Attribute = pkcs11.Attribute
        template = {
            Attribute.TOKEN: True,
            Attribute.PRIVATE: True,
            Attribute.SENSITIVE: True,
            Attribute.EXTRACTABLE: False,
            Attribute.MODIFIABLE: False,
        }
        self._acquire_login()
        with _module_lock(self._module):
            try:
                with self._token.open(rw=True) as session:
                    existing = list(
                        session.get_objects({Attribute.CLASS: pkcs11.ObjectClass.SECRET_KEY, Attribute.LABEL: label})
                    )
                    if existing:
                        message = f"{self._where()}: a key labelled {label!r} already exists"
                        raise KmsError(message, backend=self.kms_type)
                    session.generate_key(
                        pkcs11.KeyType.AES,
                        key_length * 8,
                        label=label,
                        store=True,
                        capabilities=pkcs11.MechanismFlag.ENCRYPT | pkcs11.MechanismFlag.DECRYPT,
                        template=template,
                    )
            except exceptions.PKCS11Error as exc:
                raise self._map(exc, "C_GenerateKey") from exc
        return label

    # -- internals -------------------------------------------------------------------------

    def _where(self) -> str:
        token = self._token_label if self._token_label is not None else f"slot {self._slot}"
        return f"PKCS#11 token {token!r} ({os.path.basename(self._module)})"

    def _run(self, label: str, operation: str, action):
        """Find the AES key ``label`` and run ``action(key)`` on the shared session."""
        if self._token is None:
            raise KmsError("Pkcs11Kms is not initialized", backend=self.kms_type)
        pkcs11, exceptions, _ = _pkcs11()
        login = self._acquire_login()
        with _module_lock(self._module):
            try:
                key = login.session.get_key(
                    object_class=pkcs11.ObjectClass.SECRET_KEY, key_type=pkcs11.KeyType.AES, label=label
                )
            except exceptions.NoSuchKey:
                message = f"{self._where()}: no AES key labelled {label!r}"
                raise KmsKeyNotFoundError(message, backend=self.kms_type) from None
            except exceptions.MultipleObjectsReturned:
                message = f"{self._where()}: several AES keys are labelled {label!r}"
                raise KmsError(message, backend=self.kms_type) from None
            except exceptions.PKCS11Error as exc:
                raise self._map(exc, "C_FindObjects", label) from exc
            try:
                return action(key)
            except exceptions.PKCS11Error as exc:
                raise self._map(exc, operation, label) from exc

    def _map(self, exc: Exception, operation: str, label: str | None = None) -> KmsError:
        _, e, _ = _pkcs11()
        key = f" with key {label!r}" if label is not None else ""
        text = f"{self._where()}: {operation}{key} failed: {type(exc).__name__}"
        detail = str(exc)
        if detail:
            text += f": {detail}"
        if isinstance(exc, (e.PinIncorrect, e.PinInvalid, e.PinLenRange, e.PinLocked, e.PinExpired,
                            e.UserNotLoggedIn, e.UserPinNotInitialized)):
            return KmsAccessDeniedError(text, backend=self.kms_type)
        if isinstance(exc, (e.NoSuchToken, e.TokenNotPresent, e.TokenNotRecognised, e.DeviceRemoved,
                            e.DeviceError, e.DeviceMemory, e.SlotIDInvalid, e.SessionHandleInvalid,
                            e.SessionClosed)):
            return KmsUnavailableError(text, backend=self.kms_type)
        if isinstance(exc, (e.KeyHandleInvalid, e.ObjectHandleInvalid)):
            return KmsKeyNotFoundError(text, backend=self.kms_type)
        if operation == "C_Decrypt" and isinstance(
            exc, (e.GeneralError, e.EncryptedDataInvalid, e.EncryptedDataLenRange, e.DataInvalid, e.DataLenRange)
        ):
            return KmsInvalidWrappedKeyError(text, backend=self.kms_type)
        return KmsError(text, backend=self.kms_type)

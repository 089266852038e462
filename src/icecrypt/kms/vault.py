"""HashiCorp Vault / OpenBao transit client (``encryption.kms-type = vault``).

Iceberg Java has no Vault client; this one follows the same contract as the others:
wrapping is transit ``encrypt`` of the base64 key under the transit key named
``wrapping_key_id``, and the wrapped key is the returned ciphertext string
(``vault:v<version>:<base64>``) encoded as UTF-8 bytes; unwrapping is transit ``decrypt``.
Transit keys keep their old versions when rotated, so keys wrapped before a rotation still
unwrap after it; :meth:`VaultKms.rewrap_key` re-wraps one under the newest version without
the key ever leaving Vault.

Properties (catalog properties, all optional; environment variables as the Vault CLI):

============================  ==============================  ===============================
property                      default                         meaning
============================  ==============================  ===============================
``vault.address``             ``VAULT_ADDR`` / ``BAO_ADDR``   server URL (required somewhere)
``vault.token``               ``VAULT_TOKEN`` / ``BAO_TOKEN``  token (required somewhere)
``vault.namespace``           ``VAULT_NAMESPACE``             namespace (Vault Enterprise)
``vault.transit-mount``       ``transit``                     mount path of the engine
``vault.tls-verify``          ``true``                        verify the server certificate
``vault.ca-cert``             ``VAULT_CACERT``                CA bundle file for TLS
``vault.client-cert``         ``VAULT_CLIENT_CERT``           client certificate (PEM file)
``vault.client-key``          ``VAULT_CLIENT_KEY``            its private key (PEM file)
``vault.connect-timeout-ms``  2000                            TCP connect timeout per attempt
``vault.read-timeout-ms``     10000                           response timeout per attempt
``vault.max-attempts``        3                               connection attempts per call
``vault.max-connections``     32                              HTTP connection pool size
``vault.allow-insecure-       false                           allow an ``http://`` address or
transport``                                                   ``vault.tls-verify=false`` (local
                                                              test servers; warns)
============================  ==============================  ===============================

Keys cross the wire to Vault in clear inside the request, so an ``http://`` address or
``vault.tls-verify=false`` is refused unless ``vault.allow-insecure-transport=true``, which
then warns (:class:`~icecrypt.errors.InsecureTransportWarning`).  Key ids are transit key
names (checked against Vault's name rule): they select a key on the configured server and
cannot name another server; the token's policy decides which keys it may use.

Only failures to connect are retried (an answer from Vault is final).  The transit engine
creates a missing key on ``encrypt`` when the token may create it ("upsert"); set
``disable_upsert`` in ``<mount>/config/keys`` (or withhold the ``create`` capability) so
that an unknown ``wrapping_key_id`` fails with :class:`KmsKeyNotFoundError` instead.
A caller with an ``hvac.Client`` already set up passes it as ``VaultKms(client=...)``;
:meth:`VaultKms.close` then leaves it open.
"""

from __future__ import annotations

import base64
import binascii
import functools
import os
import re
from collections.abc import Mapping
from typing import Any

from icecrypt.errors import (
    KmsAccessDeniedError,
    KmsError,
    KmsInvalidWrappedKeyError,
    KmsKeyNotFoundError,
    KmsUnavailableError,
)
from icecrypt.kms import _properties
from icecrypt.kms.base import KeyManagementClient

__all__ = ["VaultKms"]

VAULT_ADDRESS = "vault.address"
VAULT_TOKEN = "vault.token"
VAULT_NAMESPACE = "vault.namespace"
VAULT_TRANSIT_MOUNT = "vault.transit-mount"
VAULT_TRANSIT_MOUNT_DEFAULT = "transit"
VAULT_TLS_VERIFY = "vault.tls-verify"
VAULT_CA_CERT = "vault.ca-cert"
VAULT_CLIENT_CERT = "vault.client-cert"
VAULT_CLIENT_KEY = "vault.client-key"
VAULT_CONNECT_TIMEOUT_MS = "vault.connect-timeout-ms"
VAULT_READ_TIMEOUT_MS = "vault.read-timeout-ms"
VAULT_MAX_ATTEMPTS = "vault.max-attempts"
VAULT_MAX_CONNECTIONS = "vault.max-connections"
VAULT_ALLOW_INSECURE_TRANSPORT = "vault.allow-insecure-transport"

_DEFAULT_CONNECT_TIMEOUT_MS = 2000
_DEFAULT_READ_TIMEOUT_MS = 10000
_DEFAULT_MAX_ATTEMPTS = 3
_DEFAULT_MAX_CONNECTIONS = 32

_BACKEND = "vault"
_int_property = functools.partial(_properties.int_property, backend=_BACKEND)
_bool_property = functools.partial(_properties.bool_property, backend=_BACKEND, lenient=True)
_key_bytes = functools.partial(_properties.key_bytes, backend=_BACKEND)

# Transit key names as Vault's router accepts them (framework.GenericNameRegex): word
# characters, '-' and '.', starting and ending with a word character.  Checking here keeps
# a key id from ever changing the request path.
_KEY_NAME = re.compile(r"\w(?:[\w.-]*\w)?", re.ASCII)
_MOUNT_PATH = re.compile(r"\w(?:[\w.-]*\w)?(?:/\w(?:[\w.-]*\w)?)*", re.ASCII)

# Fragments of transit's 400 messages, checked in order.
_NOT_FOUND_MARKERS = ("encryption key not found", "key not found")
_INVALID_WRAPPED_MARKERS = (
    "message authentication failed",
    "invalid ciphertext",
    "could not decode",
    "version is too new",
    "invalid key version",
)
_POLICY_MARKERS = ("disallowed by policy", "permission denied")


def _first_setting(properties: Mapping[str, str], name: str, *env_names: str) -> str | None:
    value = properties.get(name)
    if value is not None and str(value).strip():
        return str(value).strip()
    for env in env_names:
        value = os.environ.get(env)
        if value:
            return value.strip()
    return None


def _check_key_name(wrapping_key_id: Any) -> str:
    if not isinstance(wrapping_key_id, str) or not _KEY_NAME.fullmatch(wrapping_key_id):
        raise KmsKeyNotFoundError(f"invalid transit key name {wrapping_key_id!r}", backend=_BACKEND)
    return wrapping_key_id


def _ciphertext_text(wrapped_key: Any) -> str:
    data = _key_bytes(wrapped_key, "wrapped key")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise KmsInvalidWrappedKeyError("wrapped key is not a transit ciphertext (not ASCII)", backend=_BACKEND) from None
    if not text.startswith("vault:"):
        raise KmsInvalidWrappedKeyError("wrapped key is not a transit ciphertext (no 'vault:' prefix)", backend=_BACKEND)
    return text


def map_vault_error(exc: BaseException, operation: str, wrapping_key_id: str) -> KmsError:
    """Translate an hvac/requests exception raised by transit ``operation`` into a :class:`KmsError`."""
    import hvac.exceptions as hx
    import requests

    where = f"Vault transit {operation} with key {wrapping_key_id!r} failed"
    if isinstance(exc, hx.VaultError):
        errors = exc.errors if isinstance(exc.errors, list) else [exc.errors] if exc.errors else []
        detail = "; ".join(" ".join(str(e).split()) for e in errors) or " ".join(str(exc).split())
        text = f"{where}: {type(exc).__name__}: {detail}"
        lowered = detail.lower()
        if isinstance(exc, (hx.Unauthorized, hx.Forbidden)):
            return KmsAccessDeniedError(text, backend=_BACKEND)
        if isinstance(exc, hx.InvalidPath):
            return KmsKeyNotFoundError(text, backend=_BACKEND)
        if isinstance(exc, (hx.RateLimitExceeded, hx.InternalServerError, hx.VaultDown, hx.BadGateway, hx.VaultNotInitialized)):
            return KmsUnavailableError(text, backend=_BACKEND)
        if isinstance(exc, hx.InvalidRequest):
            if any(m in lowered for m in _NOT_FOUND_MARKERS):
                return KmsKeyNotFoundError(text, backend=_BACKEND)
            if any(m in lowered for m in _POLICY_MARKERS):
                return KmsAccessDeniedError(text, backend=_BACKEND)
            if operation != "encrypt" and any(m in lowered for m in _INVALID_WRAPPED_MARKERS):
                return KmsInvalidWrappedKeyError(text, backend=_BACKEND)
        return KmsError(text, backend=_BACKEND)
    if isinstance(exc, (requests.ConnectionError, requests.Timeout)):
        return KmsUnavailableError(f"{where}: {type(exc).__name__}: {exc}", backend=_BACKEND)
    if isinstance(exc, requests.RequestException):
        return KmsError(f"{where}: {type(exc).__name__}: {exc}", backend=_BACKEND)
    return KmsError(f"{where}: {type(exc).__name__}", backend=_BACKEND)


def _safe_cause(exc: BaseException) -> BaseException | None:
    """Chain only exceptions that cannot carry request bodies (hvac's and requests')."""
    import hvac.exceptions as hx
    import requests

    return exc if isinstance(exc, (hx.VaultError, requests.RequestException)) else None


class VaultKms(KeyManagementClient):
    """Wraps keys with HashiCorp Vault / OpenBao transit keys.

    ``wrapping_key_id`` is the transit key name.  Safe to use from several threads at once:
    calls share one HTTP session whose connection pool holds ``vault.max-connections``.
    """

    kms_type = "vault"

    def __init__(self, *, client: Any = None) -> None:
        """Create an unconfigured client; ``client`` is an existing ``hvac.Client`` to use."""
        self._client = client
        self._owns_client = client is None
        self.transit_mount = VAULT_TRANSIT_MOUNT_DEFAULT

    def initialize(self, properties: Mapping[str, str]) -> None:
        """Read the properties listed in the module docstring and build the hvac client."""
        mount = (properties.get(VAULT_TRANSIT_MOUNT) or VAULT_TRANSIT_MOUNT_DEFAULT).strip().strip("/")
        if not _MOUNT_PATH.fullmatch(mount):
            raise KmsError(f"invalid {VAULT_TRANSIT_MOUNT} {mount!r}", backend=_BACKEND)
        self.transit_mount = mount
        if self._client is not None:
            return
        try:
            import hvac
            import requests
            from requests.adapters import HTTPAdapter
            from urllib3.util.retry import Retry
        except ImportError as exc:
            raise KmsError("the vault KMS client needs hvac: pip install 'icecrypt[vault]'", backend=_BACKEND) from exc

        address = _first_setting(properties, VAULT_ADDRESS, "VAULT_ADDR", "BAO_ADDR")
        if address is None:
            raise KmsError(f"no Vault address: set {VAULT_ADDRESS} or VAULT_ADDR", backend=_BACKEND)
        token = _first_setting(properties, VAULT_TOKEN, "VAULT_TOKEN", "BAO_TOKEN")
        if token is None:
            raise KmsError(f"no Vault token: set {VAULT_TOKEN} or VAULT_TOKEN", backend=_BACKEND)
        verify: bool | str = _bool_property(properties, VAULT_TLS_VERIFY, True)
        if address.lower().startswith("http://"):
            _properties.allow_insecure_transport(
                properties, VAULT_ALLOW_INSECURE_TRANSPORT, f"Vault address {address!r} is plain HTTP", backend=_BACKEND
            )
        elif not verify:
            _properties.allow_insecure_transport(
                properties, VAULT_ALLOW_INSECURE_TRANSPORT, f"{VAULT_TLS_VERIFY}=false: the server is not verified",
                backend=_BACKEND,
            )
        ca_cert = _first_setting(properties, VAULT_CA_CERT, "VAULT_CACERT")
        if verify and ca_cert:
            verify = ca_cert
        client_cert = _first_setting(properties, VAULT_CLIENT_CERT, "VAULT_CLIENT_CERT")
        client_key = _first_setting(properties, VAULT_CLIENT_KEY, "VAULT_CLIENT_KEY")
        if (client_cert is None) != (client_key is None):
            raise KmsError(f"set both {VAULT_CLIENT_CERT} and {VAULT_CLIENT_KEY}, or neither", backend=_BACKEND)
        attempts = _int_property(properties, VAULT_MAX_ATTEMPTS, _DEFAULT_MAX_ATTEMPTS, 1)
        pool = _int_property(properties, VAULT_MAX_CONNECTIONS, _DEFAULT_MAX_CONNECTIONS, 1)
        timeout = (
            _int_property(properties, VAULT_CONNECT_TIMEOUT_MS, _DEFAULT_CONNECT_TIMEOUT_MS, 1) / 1000,
            _int_property(properties, VAULT_READ_TIMEOUT_MS, _DEFAULT_READ_TIMEOUT_MS, 1) / 1000,
        )

        # Retry only connection failures: a request Vault has answered is never repeated.
        retry = Retry(
            total=attempts - 1,
            connect=attempts - 1,
            read=0,
            status=0,
            other=0,
            redirect=0,
            allowed_methods=None,
            backoff_factor=0.1,
            raise_on_status=False,
        )
        session = requests.Session()
        adapter = HTTPAdapter(max_retries=retry, pool_connections=1, pool_maxsize=pool)
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        self._client = hvac.Client(
            url=address,
            token=token,
            namespace=_first_setting(properties, VAULT_NAMESPACE, "VAULT_NAMESPACE"),
            verify=verify,
            cert=(client_cert, client_key) if client_cert else None,
            timeout=timeout,
            session=session,
        )
        self._owns_client = True

    def _transit(self) -> Any:
        if self._client is None:
            raise KmsError("VaultKms is not initialized (or was closed)", backend=_BACKEND)
        return self._client.secrets.transit

    def wrap_key(self, key: bytes, wrapping_key_id: str) -> bytes:
        """Transit ``encrypt`` of ``key``; returns the ``vault:v<n>:...`` ciphertext as bytes."""
        plaintext = base64.b64encode(_key_bytes(key, "key")).decode("ascii")
        name = _check_key_name(wrapping_key_id)
        transit = self._transit()
        try:
            response = transit.encrypt_data(name, plaintext=plaintext, mount_point=self.transit_mount)
        except Exception as exc:  # noqa: BLE001 - every backend failure is mapped
            raise map_vault_error(exc, "encrypt", name) from _safe_cause(exc)
        return self._field(response, "ciphertext", "encrypt", name).encode("utf-8")

    def unwrap_key(self, wrapped_key: bytes, wrapping_key_id: str) -> bytes:
        """Transit ``decrypt`` of a ciphertext made by :meth:`wrap_key` (any key version)."""
        ciphertext = _ciphertext_text(wrapped_key)
        name = _check_key_name(wrapping_key_id)
        transit = self._transit()
        try:
            response = transit.decrypt_data(name, ciphertext=ciphertext, mount_point=self.transit_mount)
        except Exception as exc:  # noqa: BLE001 - every backend failure is mapped
            raise map_vault_error(exc, "decrypt", name) from _safe_cause(exc)
        encoded = self._field(response, "plaintext", "decrypt", name)
        try:
            return base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise KmsError(f"Vault transit decrypt with key {name!r} returned malformed plaintext", backend=_BACKEND) from None

    def rewrap_key(self, wrapped_key: bytes, wrapping_key_id: str) -> bytes:
        """Transit ``rewrap``: the same key wrapped under the newest version of the transit key.

        The key itself never leaves Vault.  Use after rotating a transit key to retire old
        key versions (``min_decryption_version``).
        """
        ciphertext = _ciphertext_text(wrapped_key)
        name = _check_key_name(wrapping_key_id)
        transit = self._transit()
        try:
            response = transit.rewrap_data(name, ciphertext=ciphertext, mount_point=self.transit_mount)
        except Exception as exc:  # noqa: BLE001 - every backend failure is mapped
            raise map_vault_error(exc, "rewrap", name) from _safe_cause(exc)
        return self._field(response, "ciphertext", "rewrap", name).encode("utf-8")

    @staticmethod
    def _field(response: Any, field: str, operation: str, name: str) -> str:
        try:
            value = response["data"][field]
        except (KeyError, TypeError):
            value = None
        if not isinstance(value, str) or not value:
            raise KmsError(f"Vault transit {operation} with key {name!r} returned no {field}", backend=_BACKEND)
        return value

    def close(self) -> None:
        """Close the HTTP session if this object created the client.  Idempotent."""
        client, self._client = self._client, None
        if client is not None and self._owns_client:
            adapter = getattr(client, "adapter", None)
            close = getattr(adapter, "close", None)
            if close is not None:
                close()

    def __repr__(self) -> str:
        return f"<VaultKms kms-type='vault' transit-mount={self.transit_mount!r}>"

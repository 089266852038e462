"""Azure Key Vault client (``encryption.kms-type = azure``), as Iceberg Java's ``AzureKeyManagementClient``.

Wrapping is ``CryptographyClient.wrap_key(algorithm, key)`` and the wrapped key is the
returned ``encrypted_key``, verbatim; unwrapping is ``unwrap_key(algorithm, wrapped)``
(SPEC.md section 4), with ``azure.keyvault.key-wrap-algorithm``.  The wrapped bytes are the
algorithm's raw output (an RSA-OAEP block), so they are interchangeable with Java's.

``wrapping_key_id`` is, as in Java (``KeyClient.getCryptographyClient(name)``), a key name
resolved against ``azure.keyvault.url``.  ``name/version`` pins a version, and a full key
identifier (``https://vault.vault.azure.net/keys/name[/version]``) names a key in that vault
or one of ``azure.keyvault.allowed-vault-urls``.  Without a version both wrap and unwrap use the key's *latest* version, exactly as
Java does: after the master key is rotated, keys wrapped earlier unwrap only through a
versioned id.  Pin versions where master keys rotate.

The Azure SDK fetches the key (``keys/get``) and wraps locally with its public key when it
may; otherwise Key Vault wraps.  Unwrapping always happens in Key Vault.  With a versioned
id the fetched key is kept; without one it is fetched again on every call (the latest
version can change).

Properties (catalog properties, all optional):

============================================  ================  ====================================
property                                      default           meaning
============================================  ================  ====================================
``azure.keyvault.url``                        none              vault URL, as Java (AzureProperties)
``azure.keyvault.key-wrap-algorithm``         ``RSA-OAEP-256``  as Java; Key Vault's names
                                                                (``RSA-OAEP``, ``RSA1_5``, ``A256KW``..)
``adls.token-credential-provider``            none              ``package.module.Class`` built without
                                                                arguments, ``initialize``-d with the
                                                                ``adls.token-credential-provider.*``
                                                                properties (prefix removed); its
                                                                ``credential()`` is the azure-core
                                                                TokenCredential, as Java's
                                                                AdlsTokenCredentialProvider
``adls.token``                                none              static bearer token (as Java's ADLS
                                                                ``adls.token``; icecrypt applies it
                                                                to Key Vault too)
``azure.keyvault.ca-cert``                    system CAs        CA bundle (PEM) for the vault's TLS
                                                                certificate (icecrypt only)
``azure.keyvault.verify-challenge-resource``  true              check that the auth challenge names
                                                                the vault's domain (icecrypt only;
                                                                only IP-addressed test vaults need
                                                                ``false``)
``azure.keyvault.connect-timeout-ms``         2000              TCP connect timeout per attempt
``azure.keyvault.read-timeout-ms``            10000             response timeout per attempt
``azure.keyvault.max-attempts``               3                 attempts per request, first included
``azure.keyvault.allowed-vault-urls``         none              further vaults whose full key id
                                                                URLs may be used (comma-separated;
                                                                icecrypt only)
============================================  ================  ====================================

Key ids come from table metadata, which whoever can write the table's storage can edit, so
the configuration says where keys may be: a full key identifier is accepted only when its
vault (scheme, host and port) is ``azure.keyvault.url`` or one of
``azure.keyvault.allowed-vault-urls``.  Otherwise a key id naming a host of the attacker's
would have this client fetch the attacker's public key to wrap new KEKs, and send it
every unwrap; it is :class:`~icecrypt.KmsKeyNotFoundError` before any request.

Without a credential property ``DefaultAzureCredential`` applies, as in Java.  TLS
verification cannot be turned off.  azure-core's network trace (``logging_enable=True``)
logs request bodies, including the key of a remote wrap: do not enable it where keys are
wrapped.
"""

from __future__ import annotations

import functools
import importlib
import os
import threading
import time
import urllib.parse
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

__all__ = [
    "AzureKms",
    "StaticTokenCredential",
    "map_azure_error",
    "AZURE_KEYVAULT_URL",
    "AZURE_KEYVAULT_KEY_WRAP_ALGORITHM",
    "ADLS_TOKEN",
    "ADLS_TOKEN_CREDENTIAL_PROVIDER",
    "AZURE_KEYVAULT_CA_CERT",
    "AZURE_KEYVAULT_VERIFY_CHALLENGE_RESOURCE",
    "AZURE_KEYVAULT_CONNECT_TIMEOUT_MS",
    "AZURE_KEYVAULT_READ_TIMEOUT_MS",
    "AZURE_KEYVAULT_MAX_ATTEMPTS",
    "AZURE_KEYVAULT_ALLOWED_VAULT_URLS",
]

AZURE_KEYVAULT_URL = "azure.keyvault.url"
AZURE_KEYVAULT_KEY_WRAP_ALGORITHM = "azure.keyvault.key-wrap-algorithm"
ADLS_TOKEN = "adls.token"
ADLS_TOKEN_CREDENTIAL_PROVIDER = "adls.token-credential-provider"
ADLS_TOKEN_PROVIDER_PREFIX = "adls.token-credential-provider."
AZURE_KEYVAULT_CA_CERT = "azure.keyvault.ca-cert"
AZURE_KEYVAULT_VERIFY_CHALLENGE_RESOURCE = "azure.keyvault.verify-challenge-resource"
AZURE_KEYVAULT_CONNECT_TIMEOUT_MS = "azure.keyvault.connect-timeout-ms"
AZURE_KEYVAULT_READ_TIMEOUT_MS = "azure.keyvault.read-timeout-ms"
AZURE_KEYVAULT_MAX_ATTEMPTS = "azure.keyvault.max-attempts"
AZURE_KEYVAULT_ALLOWED_VAULT_URLS = "azure.keyvault.allowed-vault-urls"

_DEFAULT_ALGORITHM = "RSA-OAEP-256"  # Java: KeyWrapAlgorithm.RSA_OAEP_256
_DEFAULT_CONNECT_TIMEOUT_MS = 2000
_DEFAULT_READ_TIMEOUT_MS = 10000
_DEFAULT_MAX_ATTEMPTS = 3
_BACKEND = "azure"
_int_property = functools.partial(_properties.int_property, backend=_BACKEND)
_bool_property = functools.partial(_properties.bool_property, backend=_BACKEND)
_key_bytes = functools.partial(_properties.key_bytes, backend=_BACKEND)


class StaticTokenCredential:
    """An azure-core TokenCredential that always returns one bearer token.

    As Java's ``adls.token`` credential, the token is taken to be valid for an hour from
    each request for it; the vault rejects it once it really expires.  Its repr hides it.
    """

    def __init__(self, token: str, lifetime_seconds: int = 3600) -> None:
        self._token = token
        self._lifetime = lifetime_seconds

    def get_token(self, *scopes: str, **kwargs: Any):
        """The token, for any scope."""
        from azure.core.credentials import AccessToken

        return AccessToken(self._token, int(time.time()) + self._lifetime)

    def close(self) -> None:
        """Nothing to release."""

    def __repr__(self) -> str:
        return "<StaticTokenCredential token=***>"


def _vault_origin(url: str) -> str | None:
    """``https://host[:port]`` of a vault URL, lower-cased, default port dropped; None if
    it is not an https URL with a host and nothing but an optional ``/`` after it."""
    try:
        parts = urllib.parse.urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme.lower() != "https" or not parts.hostname or parts.path.strip("/") or parts.query or parts.fragment:
        return None
    if parts.username is not None or parts.password is not None:
        return None
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    return f"https://{host}" + (f":{port}" if port not in (None, 443) else "")


def _credential(properties: Mapping[str, str]) -> Any:
    """The TokenCredential the properties ask for (see the module docstring)."""
    provider_path = properties.get(ADLS_TOKEN_CREDENTIAL_PROVIDER)
    if provider_path:
        module_name, sep, attr = provider_path.partition(":")
        if not sep:
            module_name, _, attr = provider_path.rpartition(".")
        try:
            provider = getattr(importlib.import_module(module_name), attr)()
        except Exception as exc:
            message = f"cannot load {ADLS_TOKEN_CREDENTIAL_PROVIDER} {provider_path!r}: {type(exc).__name__}: {exc}"
            raise KmsError(message, backend=_BACKEND) from None
        prefix = ADLS_TOKEN_PROVIDER_PREFIX
        if hasattr(provider, "initialize"):
            provider.initialize({k[len(prefix) :]: v for k, v in properties.items() if k.startswith(prefix)})
        return provider.credential()
    token = properties.get(ADLS_TOKEN)
    if token:
        return StaticTokenCredential(token)
    try:
        from azure.identity import DefaultAzureCredential
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise KmsError(
            "DefaultAzureCredential needs azure-identity (pip install azure-identity)", backend=_BACKEND
        ) from exc
    return DefaultAzureCredential()


class AzureKms(KeyManagementClient):
    """Wraps keys with Azure Key Vault keys through the SDK's ``CryptographyClient``.

    Thread safe: one ``KeyClient`` (HTTP pipeline) per vault serves all threads.
    """

    kms_type = _BACKEND

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._initialized = False
        self._vault_url: str | None = None
        self._algorithm: Any = None
        self._credential: Any = None
        self._client_kwargs: dict[str, Any] = {}
        self._key_clients: dict[str, Any] = {}  # vault URL -> KeyClient
        self._allowed_vaults: frozenset[str] = frozenset()  # origins full key ids may name
        self._crypto_clients: dict[tuple[str, str, str], Any] = {}  # (vault, name, version) -> client

    def initialize(self, properties: Mapping[str, str]) -> None:
        """Read ``properties`` (see the module docstring) and set up the credential."""
        try:
            from azure.keyvault.keys.crypto import KeyWrapAlgorithm
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise KmsError(
                "the azure KMS needs azure-keyvault-keys (pip install 'icecrypt[azure]')", backend=_BACKEND
            ) from exc
        name = properties.get(AZURE_KEYVAULT_KEY_WRAP_ALGORITHM) or _DEFAULT_ALGORITHM
        try:
            algorithm = KeyWrapAlgorithm(name)
        except ValueError:
            known = ", ".join(a.value for a in KeyWrapAlgorithm)
            raise KmsError(
                f"invalid {AZURE_KEYVAULT_KEY_WRAP_ALGORITHM} {name!r}: known are {known}", backend=_BACKEND
            ) from None
        connect_ms = _int_property(properties, AZURE_KEYVAULT_CONNECT_TIMEOUT_MS, _DEFAULT_CONNECT_TIMEOUT_MS, 1)
        read_ms = _int_property(properties, AZURE_KEYVAULT_READ_TIMEOUT_MS, _DEFAULT_READ_TIMEOUT_MS, 1)
        attempts = _int_property(properties, AZURE_KEYVAULT_MAX_ATTEMPTS, _DEFAULT_MAX_ATTEMPTS, 1)
        client_kwargs: dict[str, Any] = {
            "verify_challenge_resource": _bool_property(properties, AZURE_KEYVAULT_VERIFY_CHALLENGE_RESOURCE, True),
            # azure-core RequestsTransport
            "connection_timeout": connect_ms / 1000,
            "read_timeout": read_ms / 1000,
            # azure-core RetryPolicy: a few quick retries of connection errors, 408, 429, 5xx
            "retry_total": attempts - 1,
            "retry_backoff_factor": 0.2,
            "retry_backoff_max": 2,
        }
        ca_cert = (properties.get(AZURE_KEYVAULT_CA_CERT) or "").strip()
        if ca_cert:
            if not os.path.isfile(ca_cert):
                raise KmsError(f"invalid {AZURE_KEYVAULT_CA_CERT} {ca_cert!r}: no such file", backend=_BACKEND)
            client_kwargs["connection_verify"] = ca_cert
        allowed = set()
        for url in ((properties.get(AZURE_KEYVAULT_URL) or "").strip(), *_properties.list_property(
                properties, AZURE_KEYVAULT_ALLOWED_VAULT_URLS)):
            if not url:
                continue
            origin = _vault_origin(url)
            if origin is None:
                raise KmsError(f"invalid vault URL {url!r}: expected https://<vault host>[:port]", backend=_BACKEND)
            allowed.add(origin)
        credential = _credential(properties)

        self.close()
        with self._lock:
            self._vault_url = (properties.get(AZURE_KEYVAULT_URL) or "").strip().rstrip("/") or None
            self._algorithm = algorithm
            self._credential = credential
            self._client_kwargs = client_kwargs
            self._allowed_vaults = frozenset(allowed)
            self._initialized = True

    def _key_client(self, vault_url: str) -> Any:
        with self._lock:
            if not self._initialized:
                raise KmsError("AzureKms is not initialized (or was closed)", backend=_BACKEND)
            client = self._key_clients.get(vault_url)
            if client is None:
                from azure.keyvault.keys import KeyClient

                client = KeyClient(vault_url, self._credential, **self._client_kwargs)
                self._key_clients[vault_url] = client
            return client

    def _crypto_client(self, wrapping_key_id: Any) -> Any:
        """The CryptographyClient for ``wrapping_key_id`` (see the module docstring)."""
        if not isinstance(wrapping_key_id, str) or not wrapping_key_id.strip("/ "):
            raise KmsKeyNotFoundError(f"invalid wrapping key id {wrapping_key_id!r}", backend=_BACKEND)
        if "://" in wrapping_key_id:
            # A key identifier: https://vault/keys/name[/version] (Key Vault is HTTPS only)
            url = urllib.parse.urlsplit(wrapping_key_id)
            parts = url.path.strip("/").split("/")
            if url.scheme != "https" or not url.netloc or len(parts) not in (2, 3) or parts[0] != "keys":
                raise KmsKeyNotFoundError(f"invalid Key Vault key id {wrapping_key_id!r}", backend=_BACKEND)
            vault_url, name = f"https://{url.netloc}", parts[1]
            version = parts[2] if len(parts) == 3 else None
            if _vault_origin(vault_url) not in self._allowed_vaults:
                raise _properties.refuse_key_id(
                    wrapping_key_id, f"its vault is not {AZURE_KEYVAULT_URL} nor in {AZURE_KEYVAULT_ALLOWED_VAULT_URLS}",
                    backend=_BACKEND)
        else:
            if not self._vault_url:
                message = f"key name {wrapping_key_id!r} needs {AZURE_KEYVAULT_URL} (or use a full key id URL)"
                raise KmsError(message, backend=_BACKEND)
            name, _, version = wrapping_key_id.strip("/").partition("/")
            vault_url, version = self._vault_url, version or None
        if not name or (version is not None and "/" in version):
            raise KmsKeyNotFoundError(f"invalid Key Vault key id {wrapping_key_id!r}", backend=_BACKEND)
        key_client = self._key_client(vault_url)
        if version is None:
            # The latest version can change: look it up on every call, as Java does.
            return key_client.get_cryptography_client(name)
        with self._lock:
            client = self._crypto_clients.get((vault_url, name, version))
            if client is None:
                # A version's key material never changes: keep its client and the public
                # key it fetches for local wrapping.
                client = key_client.get_cryptography_client(name, key_version=version)
                self._crypto_clients[(vault_url, name, version)] = client
            return client

    def wrap_key(self, key: bytes, wrapping_key_id: str) -> bytes:
        """``CryptographyClient(wrapping_key_id).wrap_key(algorithm, key).encrypted_key``."""
        data = _key_bytes(key, "key")
        client = self._crypto_client(wrapping_key_id)
        try:
            result = client.wrap_key(self._algorithm, data)
        except Exception as exc:
            raise map_azure_error(exc, "wrapKey", wrapping_key_id) from _safe_cause(exc)
        return bytes(result.encrypted_key)

    def unwrap_key(self, wrapped_key: bytes, wrapping_key_id: str) -> bytes:
        """``CryptographyClient(wrapping_key_id).unwrap_key(algorithm, wrapped_key).key``."""
        data = _key_bytes(wrapped_key, "wrapped key", KmsInvalidWrappedKeyError)
        client = self._crypto_client(wrapping_key_id)
        try:
            result = client.unwrap_key(self._algorithm, data)
        except Exception as exc:
            raise map_azure_error(exc, "unwrapKey", wrapping_key_id) from _safe_cause(exc)
        return bytes(result.key)

    def close(self) -> None:
        """Close the HTTP pipelines and the credential.  Idempotent."""
        with self._lock:
            clients = list(self._key_clients.values())
            credential, self._credential = self._credential, None
            self._key_clients.clear()
            self._crypto_clients.clear()
            self._initialized = False
        for client in clients:
            client.close()
        if credential is not None and hasattr(credential, "close"):
            credential.close()

    def __repr__(self) -> str:
        algorithm = self._algorithm.value if self._algorithm is not None else None
        return f"<AzureKms kms-type='azure' vault={self._vault_url!r} algorithm={algorithm!r}>"


def map_azure_error(exc: BaseException, operation: str, wrapping_key_id: str) -> KmsError:
    """Translate an azure-core exception raised by ``operation`` into a :class:`KmsError`.

    Key Vault's error code and message are kept (it never quotes key material in them);
    for exceptions outside azure-core only the type is.
    """
    from azure.core import exceptions as aexc

    where = f"Azure Key Vault {operation} with key {wrapping_key_id!r} failed"
    if not isinstance(exc, aexc.AzureError):
        if isinstance(exc, ValueError):  # the SDK's own checks, e.g. a challenge for another domain
            return KmsError(f"{where}: {exc}", backend=_BACKEND)
        return KmsError(f"{where}: {type(exc).__name__}", backend=_BACKEND)
    error = getattr(exc, "error", None)  # the service's ODataV4 error, when it sent one
    if error is not None and getattr(error, "message", None):
        message = f"({error.code}) {error.message}" if error.code else str(error.message)
    else:
        message = str(exc.message or type(exc).__name__).strip()
    if isinstance(exc, aexc.ResourceNotFoundError):
        return KmsKeyNotFoundError(f"{where}: {message}", backend=_BACKEND)
    if isinstance(exc, aexc.ClientAuthenticationError):  # 401, and credentials that fail
        return KmsAccessDeniedError(f"{where}: authentication failed: {message}", backend=_BACKEND)
    if isinstance(exc, aexc.HttpResponseError):
        status = exc.status_code or 0
        if status == 403:
            return KmsAccessDeniedError(f"{where}: {message}", backend=_BACKEND)
        if status == 400 and operation == "unwrapKey":
            return KmsInvalidWrappedKeyError(f"{where}: {message}", backend=_BACKEND)
        if status in (408, 429) or status >= 500:
            return KmsUnavailableError(f"{where}: HTTP {status}: {message}", backend=_BACKEND)
        return KmsError(f"{where}: HTTP {status}: {message}", backend=_BACKEND)
    if isinstance(exc, (aexc.ServiceRequestError, aexc.ServiceResponseError)):  # connect, TLS, timeouts
        return KmsUnavailableError(f"{where}: cannot reach the vault: {message}", backend=_BACKEND)
    return KmsError(f"{where}: {type(exc).__name__}: {message}", backend=_BACKEND)


def _safe_cause(exc: BaseException) -> BaseException | None:
    """The exception to chain as ``__cause__``: azure-core's (which keep request bodies out
    of their text) and the SDK's ValueErrors; nothing else."""
    from azure.core.exceptions import AzureError

    return exc if isinstance(exc, (AzureError, ValueError)) else None

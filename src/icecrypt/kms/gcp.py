"""Google Cloud KMS client (``encryption.kms-type = gcp``), as Iceberg Java's ``GcpKeyManagementClient``.

Wrapping is Cloud KMS ``Encrypt(name=wrapping_key_id, plaintext=key)`` and the wrapped key
is the returned ``ciphertext``, verbatim; unwrapping is ``Decrypt(name, ciphertext)``
(SPEC.md section 4).  ``wrapping_key_id`` is a CryptoKey resource name,
``projects/P/locations/L/keyRings/R/cryptoKeys/K``, and the key's own (symmetric)
algorithm applies.  Wrapped keys are therefore interchangeable with Java's.

Beyond Java, every call carries the CRC32C checksums Google recommends
(``plaintext_crc32c`` / ``ciphertext_crc32c``) and checks the ones that come back
(``verified_plaintext_crc32c``, ``ciphertext_crc32c``, ``plaintext_crc32c``); a mismatch
is a :class:`KmsError`.

Properties (catalog properties, all optional):

================================  ===========  ================================================
property                          default      meaning
================================  ===========  ================================================
``gcs.oauth2.token``              ADC          static OAuth2 access token, as Java
                                               (GCPProperties); else Application Default
                                               Credentials, as Java
``gcs.oauth2.token-expires-at``   none         its expiry, epoch milliseconds, as Java
``gcs.no-auth``                   false        send no credentials (emulators and local test
                                               endpoints), as Java's GCS option
``gcp.kms.endpoint``              Google's     endpoint override (icecrypt only):
                                               ``host[:port]`` for gRPC, a URL
                                               (``http://127.0.0.1:8080``) for REST
``gcp.kms.transport``             see right    ``grpc`` (Java's transport; default) or
                                               ``rest`` (default when the endpoint is a URL)
``gcp.kms.timeout-ms``            10000        deadline of one call, retries of transient
                                               failures included (icecrypt only)
``gcp.kms.allowed-key-rings``     none         where keys may be (required; icecrypt only):
                                               comma-separated ``projects/P``,
                                               ``projects/P/locations/L`` or
                                               ``projects/P/locations/L/keyRings/R``
``gcp.kms.allow-insecure-transport``  false    allow an ``http://`` endpoint (local test
                                               servers; warns; icecrypt only)
================================  ===========  ================================================

Key ids come from table metadata, which whoever can write the table's storage can edit, so
the configuration says which keys may be used: a CryptoKey name is accepted only under one
of ``gcp.kms.allowed-key-rings`` (a key in another project whose IAM policy lets this
client encrypt and decrypt would otherwise serve a storage attacker); anything else is
:class:`~icecrypt.KmsKeyNotFoundError` before a call.

Only failures that cannot have changed anything are retried (UNAVAILABLE, DEADLINE_EXCEEDED,
connection errors), with backoff, until the deadline.

google-cloud-kms's own debug logging (``GOOGLE_SDK_PYTHON_LOGGING_SCOPE``) prints request
and response payloads, including the plaintext key: do not enable it where keys are wrapped.
"""

from __future__ import annotations

import datetime
import functools
import re
import threading
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
    "GcpKms",
    "crc32c",
    "map_gcp_error",
    "GCS_OAUTH2_TOKEN",
    "GCS_OAUTH2_TOKEN_EXPIRES_AT",
    "GCS_NO_AUTH",
    "GCP_KMS_ENDPOINT",
    "GCP_KMS_TRANSPORT",
    "GCP_KMS_TIMEOUT_MS",
    "GCP_KMS_ALLOWED_KEY_RINGS",
    "GCP_KMS_ALLOW_INSECURE_TRANSPORT",
]

GCS_OAUTH2_TOKEN = "gcs.oauth2.token"
GCS_OAUTH2_TOKEN_EXPIRES_AT = "gcs.oauth2.token-expires-at"
GCS_NO_AUTH = "gcs.no-auth"
GCP_KMS_ENDPOINT = "gcp.kms.endpoint"
GCP_KMS_TRANSPORT = "gcp.kms.transport"
GCP_KMS_TIMEOUT_MS = "gcp.kms.timeout-ms"
GCP_KMS_ALLOWED_KEY_RINGS = "gcp.kms.allowed-key-rings"
GCP_KMS_ALLOW_INSECURE_TRANSPORT = "gcp.kms.allow-insecure-transport"

_DEFAULT_TIMEOUT_MS = 10_000
_BACKEND = "gcp"
_int_property = functools.partial(_properties.int_property, backend=_BACKEND)
_bool_property = functools.partial(_properties.bool_property, backend=_BACKEND)
_key_bytes = functools.partial(_properties.key_bytes, backend=_BACKEND)
_check_key_id = functools.partial(_properties.check_key_id, backend=_BACKEND)

# a resource id: letters, digits, '_', '-', and '.' / ':' (domain-scoped projects such as
# "example.com:proj"), never a segment of dots only (it would move the REST request path)
_SEGMENT = r"(?!\.+(?:/|\Z))[A-Za-z0-9_.:-]+"
_KEY_NAME = re.compile(rf"projects/{_SEGMENT}/locations/{_SEGMENT}/keyRings/{_SEGMENT}/cryptoKeys/{_SEGMENT}")
_SCOPE = re.compile(rf"projects/{_SEGMENT}(?:/locations/{_SEGMENT}(?:/keyRings/{_SEGMENT})?)?")


def _key_rings(properties: Mapping[str, str]) -> tuple[str, ...]:
    scopes = tuple(item.rstrip("/") for item in _properties.list_property(properties, GCP_KMS_ALLOWED_KEY_RINGS))
    for scope in scopes:
        if not _SCOPE.fullmatch(scope):
            raise KmsError(
                f"invalid {GCP_KMS_ALLOWED_KEY_RINGS} entry {scope!r}: expected projects/P, "
                "projects/P/locations/L or projects/P/locations/L/keyRings/R",
                backend=_BACKEND,
            )
    return scopes


def _crc32c_table() -> tuple[int, ...]:
    # Castagnoli polynomial 0x1EDC6F41, bit-reflected.
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_CRC32C_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC32C (Castagnoli) of ``data``, the checksum of Cloud KMS's integrity fields.

    Plain Python: the inputs are keys and wrapped keys, a few dozen bytes.
    """
    crc = 0xFFFFFFFF
    table = _CRC32C_TABLE
    for byte in bytes(data):
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _credentials(properties: Mapping[str, str]):
    """google-auth credentials from the properties; None means Application Default Credentials."""
    token = properties.get(GCS_OAUTH2_TOKEN)
    no_auth = _bool_property(properties, GCS_NO_AUTH, False)
    if token and no_auth:
        # Java's GCPProperties refuses the same combination.
        raise KmsError(
            f"invalid auth settings: must not configure {GCS_NO_AUTH} and {GCS_OAUTH2_TOKEN}", backend=_BACKEND
        )
    if no_auth:
        from google.auth.credentials import AnonymousCredentials

        return AnonymousCredentials()
    if not token:
        return None
    import google.oauth2.credentials

    expiry = None
    if properties.get(GCS_OAUTH2_TOKEN_EXPIRES_AT):
        millis = _int_property(properties, GCS_OAUTH2_TOKEN_EXPIRES_AT, 0, 0)
        # google-auth compares expiry with a naive UTC datetime.
        expiry = datetime.datetime.fromtimestamp(millis / 1000, datetime.timezone.utc).replace(tzinfo=None)
    return google.oauth2.credentials.Credentials(token=token, expiry=expiry)


class GcpKms(KeyManagementClient):
    """Wraps keys with Google Cloud KMS symmetric CryptoKeys (``Encrypt``/``Decrypt``).

    Thread safe: one ``KeyManagementServiceClient`` (gRPC channel or HTTP session) serves
    all threads.
    """

    kms_type = _BACKEND

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._client: Any = None
        self._retry: Any = None
        self._timeout = _DEFAULT_TIMEOUT_MS / 1000
        self._endpoint: str | None = None
        self._transport = "grpc"
        self._key_rings: tuple[str, ...] = ()

    def initialize(self, properties: Mapping[str, str]) -> None:
        """Build the Cloud KMS client from ``properties`` (see the module docstring)."""
        try:
            from google.api_core import client_options as client_options_lib
            from google.api_core import exceptions as gexc
            from google.api_core import retry as retries
            from google.cloud import kms_v1
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise KmsError(
                "the gcp KMS needs google-cloud-kms (pip install 'icecrypt[gcp]')", backend=_BACKEND
            ) from exc

        key_rings = _key_rings(properties)
        endpoint = (properties.get(GCP_KMS_ENDPOINT) or "").strip() or None
        is_url = endpoint is not None and endpoint.startswith(("http://", "https://"))
        if endpoint is not None and endpoint.startswith("http://"):
            _properties.allow_insecure_transport(
                properties, GCP_KMS_ALLOW_INSECURE_TRANSPORT, f"{GCP_KMS_ENDPOINT} {endpoint!r} is plain HTTP",
                backend=_BACKEND,
            )
        transport = (properties.get(GCP_KMS_TRANSPORT) or ("rest" if is_url else "grpc")).strip().lower()
        if transport not in ("grpc", "rest"):
            raise KmsError(f"invalid {GCP_KMS_TRANSPORT} {transport!r}: expected grpc or rest", backend=_BACKEND)
        if is_url and transport == "grpc":
            raise KmsError(f"{GCP_KMS_ENDPOINT} {endpoint!r} is a URL: use {GCP_KMS_TRANSPORT}=rest", backend=_BACKEND)
        timeout = _int_property(properties, GCP_KMS_TIMEOUT_MS, _DEFAULT_TIMEOUT_MS, 1) / 1000
        credentials = _credentials(properties)

        transient: tuple[type[BaseException], ...] = (gexc.ServiceUnavailable, gexc.DeadlineExceeded)
        if transport == "rest":
            import requests

            # The REST transport lets connection failures through as requests exceptions.
            transient += (requests.ConnectionError, requests.Timeout)
        retry = retries.Retry(
            predicate=retries.if_exception_type(*transient), initial=0.05, maximum=1.0, multiplier=2.0, timeout=timeout
        )
        options = client_options_lib.ClientOptions(api_endpoint=endpoint) if endpoint else None
        try:
            client = kms_v1.KeyManagementServiceClient(
                credentials=credentials, transport=transport, client_options=options
            )
        except Exception as exc:  # DefaultCredentialsError when there are no ADC, ...
            raise map_gcp_error(exc, "create client", None) from _safe_cause(exc)
        self.close()
        with self._lock:
            self._client, self._retry, self._timeout = client, retry, timeout
            self._endpoint, self._transport = endpoint, transport
            self._key_rings = key_rings

    def _allowed_key_id(self, wrapping_key_id: Any) -> str:
        """``wrapping_key_id`` if it is a CryptoKey name under ``gcp.kms.allowed-key-rings``."""
        key_id = _check_key_id(wrapping_key_id)
        if not _KEY_NAME.fullmatch(key_id):
            raise _properties.refuse_key_id(
                key_id, "not a CryptoKey name projects/P/locations/L/keyRings/R/cryptoKeys/K", backend=_BACKEND)
        if not any(key_id.startswith(scope + "/") for scope in self._key_rings):
            where = ", ".join(self._key_rings) or "nothing (unset)"
            raise _properties.refuse_key_id(
                key_id, f"it is not under {GCP_KMS_ALLOWED_KEY_RINGS} ({where})", backend=_BACKEND)
        return key_id

    def _require_client(self) -> Any:
        client = self._client
        if client is None:
            raise KmsError("GcpKms is not initialized (or was closed)", backend=_BACKEND)
        return client

    def wrap_key(self, key: bytes, wrapping_key_id: str) -> bytes:
        """Cloud KMS ``Encrypt(name=wrapping_key_id, plaintext=key)`` -> ciphertext."""
        data = _key_bytes(key, "key")
        key_id = self._allowed_key_id(wrapping_key_id)
        client = self._require_client()
        try:
            response = client.encrypt(
                request={"name": key_id, "plaintext": data, "plaintext_crc32c": crc32c(data)},
                retry=self._retry,
                timeout=self._timeout,
            )
        except Exception as exc:
            raise map_gcp_error(exc, "Encrypt", key_id) from _safe_cause(exc)
        ciphertext = bytes(response.ciphertext)
        # Google's integrity checks: the service saw the plaintext that was sent, and the
        # ciphertext that arrived is the one it produced.
        if not response.verified_plaintext_crc32c:
            raise KmsError(f"Cloud KMS Encrypt with key {key_id!r}: request corrupted in transit", backend=_BACKEND)
        if response.ciphertext_crc32c != crc32c(ciphertext):
            raise KmsError(f"Cloud KMS Encrypt with key {key_id!r}: response CRC32C mismatch", backend=_BACKEND)
        return ciphertext

    def unwrap_key(self, wrapped_key: bytes, wrapping_key_id: str) -> bytes:
        """Cloud KMS ``Decrypt(name=wrapping_key_id, ciphertext=wrapped_key)`` -> plaintext."""
        data = _key_bytes(wrapped_key, "wrapped key", KmsInvalidWrappedKeyError)
        key_id = self._allowed_key_id(wrapping_key_id)
        client = self._require_client()
        try:
            response = client.decrypt(
                request={"name": key_id, "ciphertext": data, "ciphertext_crc32c": crc32c(data)},
                retry=self._retry,
                timeout=self._timeout,
            )
        except Exception as exc:
            raise map_gcp_error(exc, "Decrypt", key_id) from _safe_cause(exc)
        plaintext = bytes(response.plaintext)
        if response.plaintext_crc32c != crc32c(plaintext):
            raise KmsError(f"Cloud KMS Decrypt with key {key_id!r}: response CRC32C mismatch", backend=_BACKEND)
        return plaintext

    def close(self) -> None:
        """Close the gRPC channel or HTTP session.  Idempotent."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.transport.close()

    def __repr__(self) -> str:
        # Where the client talks to, never its credentials.
        return f"<GcpKms kms-type='gcp' transport={self._transport!r} endpoint={self._endpoint or 'default'!r}>"


def map_gcp_error(exc: BaseException, operation: str, wrapping_key_id: str | None) -> KmsError:
    """Translate a google-api-core / google-auth / requests exception into a :class:`KmsError`.

    The service's status and message are kept (Cloud KMS never quotes plaintext or
    ciphertext in them); messages of other exceptions are kept only for the families known
    not to carry request data.
    """
    from google.api_core import exceptions as gexc
    from google.auth import exceptions as auth_exc

    where = f"Cloud KMS {operation}" + (f" with key {wrapping_key_id!r}" if wrapping_key_id else "") + " failed"
    if isinstance(exc, gexc.RetryError):
        # The deadline ran out while retrying a transient failure.
        return KmsUnavailableError(f"{where}: gave up retrying: {exc.cause or exc}", backend=_BACKEND)
    if isinstance(exc, gexc.NotFound):
        return KmsKeyNotFoundError(f"{where}: {exc}", backend=_BACKEND)
    if isinstance(exc, (gexc.Forbidden, gexc.Unauthorized)):  # PermissionDenied, Unauthenticated
        return KmsAccessDeniedError(f"{where}: {exc}", backend=_BACKEND)
    if isinstance(exc, (auth_exc.DefaultCredentialsError, auth_exc.RefreshError)):
        return KmsAccessDeniedError(f"{where}: credentials missing or rejected: {exc}", backend=_BACKEND)
    if isinstance(exc, gexc.BadRequest) and operation == "Decrypt":  # InvalidArgument: not our ciphertext
        return KmsInvalidWrappedKeyError(f"{where}: {exc}", backend=_BACKEND)
    transient = (gexc.ServerError, gexc.TooManyRequests, auth_exc.TransportError)  # 5xx, 429
    if isinstance(exc, transient):
        return KmsUnavailableError(f"{where}: {exc}", backend=_BACKEND)
    if isinstance(exc, (gexc.GoogleAPIError, auth_exc.GoogleAuthError)):
        return KmsError(f"{where}: {exc}", backend=_BACKEND)
    import requests

    if isinstance(exc, (requests.ConnectionError, requests.Timeout, ConnectionError, TimeoutError)):
        return KmsUnavailableError(f"{where}: cannot reach the endpoint: {exc}", backend=_BACKEND)
    if isinstance(exc, requests.RequestException):
        return KmsError(f"{where}: {type(exc).__name__}: {exc}", backend=_BACKEND)
    return KmsError(f"{where}: {type(exc).__name__}", backend=_BACKEND)


def _safe_cause(exc: BaseException) -> BaseException | None:
    """The exception to chain as ``__cause__``: only families that cannot carry request data."""
    import requests
    from google.api_core import exceptions as gexc
    from google.auth import exceptions as auth_exc

    known = (gexc.GoogleAPIError, auth_exc.GoogleAuthError, requests.RequestException, ConnectionError, TimeoutError)
    return exc if isinstance(exc, known) else None

"""AWS KMS client (``encryption.kms-type = aws``), as Iceberg Java's ``AwsKeyManagementClient``.

Wrapping is KMS ``Encrypt(KeyId=wrapping_key_id, Plaintext=key, EncryptionAlgorithm=spec)``
and the wrapped key is the returned ``CiphertextBlob``, verbatim; unwrapping is
``Decrypt(KeyId, CiphertextBlob, EncryptionAlgorithm)`` (SPEC.md section 4).  Wrapped keys
are therefore interchangeable with Java's.

Properties (catalog properties, all optional):

=================================  =================  ===========================================
property                           default            meaning
=================================  =================  ===========================================
``kms.encryption-algorithm-spec``  SYMMETRIC_DEFAULT  as Java (AwsProperties)
``kms.data-key-spec``              AES_256            as Java; read for compatibility, unused
``kms.endpoint``                   AWS's              endpoint URL override, as Java
``client.region``                  boto3's chain      region, as Java (AwsClientProperties)
``kms.access-key-id``              boto3's chain      static credentials (icecrypt only; Java
``kms.secret-access-key``                             uses ``client.credentials-provider``,
``kms.session-token``                                 a Java class, which has no equivalent here)
``kms.connect-timeout-ms``         2000               TCP connect timeout per attempt
``kms.read-timeout-ms``            10000              response timeout per attempt
``kms.max-attempts``               3                  attempts per call, first included
``kms.max-connections``            32                 HTTP connection pool size
``kms.allowed-account-ids``        none               accounts whose key and alias ARNs may be
                                                      used (comma-separated; icecrypt only)
``kms.allowed-key-ids``            none               further key ids, aliases or ARNs that may
                                                      be used (comma-separated; icecrypt only)
``kms.allow-insecure-transport``   false              allow an ``http://`` ``kms.endpoint``
                                                      (local test servers; warns)
=================================  =================  ===========================================

Key ids come from table metadata, which whoever can write the table's storage can edit, so
the configuration says which keys may be used: a bare key id or alias name (they resolve
in the client's own account and region) is always accepted; an ARN only when its account
is in ``kms.allowed-account-ids`` or the ARN is listed in ``kms.allowed-key-ids``.  Another
account's key whose policy lets this client encrypt and decrypt would otherwise serve a
storage attacker.  Anything else is :class:`~icecrypt.KmsKeyNotFoundError` before a call.

Without static credentials boto3's default chain applies (``AWS_ACCESS_KEY_ID`` ...,
``AWS_PROFILE``, ``~/.aws``, instance and container roles), like Java's
``DefaultCredentialsProvider``.  A caller that already has a boto3 KMS client passes it
as ``AwsKms(client=...)``; then only the algorithm properties are read, and
:meth:`AwsKms.close` leaves that client open.

botocore's own DEBUG logging prints request parameters, including the plaintext key of
``Encrypt``: do not enable DEBUG logging for ``botocore`` where keys are wrapped.
"""

from __future__ import annotations

import functools
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

__all__ = ["AwsKms"]

# Property names.  The first four are Iceberg Java's; the rest are icecrypt's own.
KMS_ENCRYPTION_ALGORITHM_SPEC = "kms.encryption-algorithm-spec"
KMS_ENCRYPTION_ALGORITHM_SPEC_DEFAULT = "SYMMETRIC_DEFAULT"
KMS_DATA_KEY_SPEC = "kms.data-key-spec"
KMS_DATA_KEY_SPEC_DEFAULT = "AES_256"
KMS_ENDPOINT = "kms.endpoint"
CLIENT_REGION = "client.region"
KMS_ACCESS_KEY_ID = "kms.access-key-id"
KMS_SECRET_ACCESS_KEY = "kms.secret-access-key"
KMS_SESSION_TOKEN = "kms.session-token"
KMS_CONNECT_TIMEOUT_MS = "kms.connect-timeout-ms"
KMS_READ_TIMEOUT_MS = "kms.read-timeout-ms"
KMS_MAX_ATTEMPTS = "kms.max-attempts"
KMS_MAX_CONNECTIONS = "kms.max-connections"
KMS_ALLOWED_ACCOUNT_IDS = "kms.allowed-account-ids"
KMS_ALLOWED_KEY_IDS = "kms.allowed-key-ids"
KMS_ALLOW_INSECURE_TRANSPORT = "kms.allow-insecure-transport"

_DEFAULT_CONNECT_TIMEOUT_MS = 2000
_DEFAULT_READ_TIMEOUT_MS = 10000
_DEFAULT_MAX_ATTEMPTS = 3
_DEFAULT_MAX_CONNECTIONS = 32

_BACKEND = "aws"
_int_property = functools.partial(_properties.int_property, backend=_BACKEND)
_key_bytes = functools.partial(_properties.key_bytes, backend=_BACKEND)
_check_key_id = functools.partial(_properties.check_key_id, backend=_BACKEND)


def _arn_account(key_id: str) -> str | None:
    """The account of a key or alias ARN (``arn:<partition>:kms:<region>:<account>:...``),
    None for a bare key id or alias name; KmsKeyNotFoundError for a malformed ARN."""
    if not key_id.startswith("arn:"):
        return None
    parts = key_id.split(":", 5)
    if len(parts) != 6 or parts[2] != "kms" or not parts[4] or not parts[5].startswith(("key/", "alias/")):
        raise _properties.refuse_key_id(key_id, "not a KMS key or alias ARN", backend=_BACKEND)
    return parts[4]

# KMS error codes -> icecrypt exception classes.  Codes not listed become plain KmsError.
_ERROR_CLASSES: dict[str, type[KmsError]] = {
    "NotFoundException": KmsKeyNotFoundError,
    "AccessDeniedException": KmsAccessDeniedError,
    "AccessDenied": KmsAccessDeniedError,
    "DisabledException": KmsAccessDeniedError,
    "KMSInvalidStateException": KmsAccessDeniedError,
    "UnrecognizedClientException": KmsAccessDeniedError,
    "InvalidSignatureException": KmsAccessDeniedError,
    "IncompleteSignature": KmsAccessDeniedError,
    "ExpiredTokenException": KmsAccessDeniedError,
    "InvalidClientTokenId": KmsAccessDeniedError,
    "InvalidCiphertextException": KmsInvalidWrappedKeyError,
    "IncorrectKeyException": KmsInvalidWrappedKeyError,
    "KeyUnavailableException": KmsUnavailableError,
    "DependencyTimeoutException": KmsUnavailableError,
    "KMSInternalException": KmsUnavailableError,
    "ThrottlingException": KmsUnavailableError,
    "ServiceUnavailableException": KmsUnavailableError,
}


def map_aws_error(exc: BaseException, operation: str, wrapping_key_id: str) -> KmsError:
    """Translate a botocore exception raised by ``operation`` into a :class:`KmsError`.

    The backend's error code and message are kept; request parameters (the key) are not.
    """
    from botocore import exceptions as bx

    where = f"AWS KMS {operation} with key {wrapping_key_id!r} failed"
    if isinstance(exc, bx.ClientError):
        error = exc.response.get("Error", {}) if isinstance(exc.response, dict) else {}
        code = str(error.get("Code") or "Unknown")
        message = str(error.get("Message") or "").strip()
        cls = _ERROR_CLASSES.get(code, KmsError)
        return cls(f"{where}: {code}" + (f": {message}" if message else ""), backend=_BACKEND)
    if isinstance(exc, (bx.EndpointConnectionError, bx.ConnectionClosedError, bx.ConnectTimeoutError, bx.ReadTimeoutError)):
        return KmsUnavailableError(f"{where}: {exc}", backend=_BACKEND)
    if isinstance(exc, (bx.HTTPClientError, bx.ConnectionError)):
        return KmsUnavailableError(f"{where}: {exc}", backend=_BACKEND)
    if isinstance(exc, (bx.NoCredentialsError, bx.PartialCredentialsError)):
        return KmsAccessDeniedError(f"{where}: {exc}", backend=_BACKEND)
    if isinstance(exc, bx.NoRegionError):
        return KmsError(f"{where}: no region: set {CLIENT_REGION} or AWS_DEFAULT_REGION", backend=_BACKEND)
    if isinstance(exc, bx.ParamValidationError):
        # Its text can quote parameter values, which include the plaintext key.
        return KmsError(f"{where}: invalid request parameters", backend=_BACKEND)
    return KmsError(f"{where}: {type(exc).__name__}", backend=_BACKEND)


class AwsKms(KeyManagementClient):
    """Wraps keys with AWS KMS symmetric keys (``Encrypt``/``Decrypt``), as Iceberg Java.

    ``wrapping_key_id`` is anything KMS accepts as ``KeyId``: key id, key ARN, alias name
    (``alias/...``) or alias ARN.  Safe to use from several threads at once (boto3 clients
    are thread-safe).
    """

    kms_type = "aws"

    def __init__(self, *, client: Any = None) -> None:
        """Create an unconfigured client; ``client`` is an existing boto3 KMS client to use."""
        self._client = client
        self._owns_client = client is None
        self.encryption_algorithm_spec = KMS_ENCRYPTION_ALGORITHM_SPEC_DEFAULT
        self.data_key_spec = KMS_DATA_KEY_SPEC_DEFAULT
        self._allowed_accounts: frozenset[str] = frozenset()
        self._allowed_key_ids: frozenset[str] = frozenset()

    def initialize(self, properties: Mapping[str, str]) -> None:
        """Read the properties listed in the module docstring and build the boto3 client."""
        self._allowed_accounts = frozenset(_properties.list_property(properties, KMS_ALLOWED_ACCOUNT_IDS))
        self._allowed_key_ids = frozenset(_properties.list_property(properties, KMS_ALLOWED_KEY_IDS))
        spec = properties.get(KMS_ENCRYPTION_ALGORITHM_SPEC)
        if spec:
            self.encryption_algorithm_spec = spec.strip().upper()
        data_key_spec = properties.get(KMS_DATA_KEY_SPEC)
        if data_key_spec:
            self.data_key_spec = data_key_spec.strip().upper()
        if self._client is not None:
            return
        try:
            import boto3
            from botocore.config import Config
        except ImportError as exc:
            raise KmsError("the aws KMS client needs boto3: pip install 'icecrypt[aws]'", backend=_BACKEND) from exc

        config = Config(
            connect_timeout=_int_property(properties, KMS_CONNECT_TIMEOUT_MS, _DEFAULT_CONNECT_TIMEOUT_MS, 1) / 1000,
            read_timeout=_int_property(properties, KMS_READ_TIMEOUT_MS, _DEFAULT_READ_TIMEOUT_MS, 1) / 1000,
            retries={
                "mode": "standard",
                "total_max_attempts": _int_property(properties, KMS_MAX_ATTEMPTS, _DEFAULT_MAX_ATTEMPTS, 1),
            },
            max_pool_connections=_int_property(properties, KMS_MAX_CONNECTIONS, _DEFAULT_MAX_CONNECTIONS, 1),
        )
        access_key_id = properties.get(KMS_ACCESS_KEY_ID) or None
        secret_access_key = properties.get(KMS_SECRET_ACCESS_KEY) or None
        if (access_key_id is None) != (secret_access_key is None):
            raise KmsError(f"set both {KMS_ACCESS_KEY_ID} and {KMS_SECRET_ACCESS_KEY}, or neither", backend=_BACKEND)
        from botocore import exceptions as bx

        endpoint = (properties.get(KMS_ENDPOINT) or "").strip() or None
        if endpoint is not None and endpoint.lower().startswith("http://"):
            _properties.allow_insecure_transport(
                properties, KMS_ALLOW_INSECURE_TRANSPORT, f"{KMS_ENDPOINT} {endpoint!r} is plain HTTP", backend=_BACKEND
            )
        try:
            # A session of our own: boto3's default session is not thread-safe to create.
            self._client = boto3.session.Session().client(
                "kms",
                region_name=properties.get(CLIENT_REGION) or None,
                endpoint_url=endpoint,
                aws_access_key_id=access_key_id,
                aws_secret_access_key=secret_access_key,
                aws_session_token=properties.get(KMS_SESSION_TOKEN) or None,
                config=config,
            )
        except bx.NoRegionError:
            raise KmsError(f"no AWS region: set {CLIENT_REGION} or AWS_DEFAULT_REGION", backend=_BACKEND) from None
        except (bx.BotoCoreError, ValueError) as exc:
            raise KmsError(f"cannot create the AWS KMS client: {exc}", backend=_BACKEND) from exc
        self._owns_client = True

    def _allowed_key_id(self, wrapping_key_id: Any) -> str:
        """``wrapping_key_id`` if the configuration allows it (see the module docstring)."""
        key_id = _check_key_id(wrapping_key_id)
        if key_id in self._allowed_key_ids:
            return key_id
        account = _arn_account(key_id)
        if account is not None and account not in self._allowed_accounts:
            raise _properties.refuse_key_id(
                key_id, f"account {account} is not in {KMS_ALLOWED_ACCOUNT_IDS} and the ARN is not in "
                f"{KMS_ALLOWED_KEY_IDS}", backend=_BACKEND)
        return key_id

    def _require_client(self) -> Any:
        if self._client is None:
            raise KmsError("AwsKms is not initialized (or was closed)", backend=_BACKEND)
        return self._client

    def wrap_key(self, key: bytes, wrapping_key_id: str) -> bytes:
        """KMS ``Encrypt`` of ``key`` under ``wrapping_key_id``; returns the ``CiphertextBlob``."""
        plaintext = _key_bytes(key, "key")
        key_id = self._allowed_key_id(wrapping_key_id)
        client = self._require_client()
        try:
            response = client.encrypt(
                KeyId=key_id,
                Plaintext=plaintext,
                EncryptionAlgorithm=self.encryption_algorithm_spec,
            )
        except Exception as exc:  # noqa: BLE001 - every backend failure is mapped
            raise map_aws_error(exc, "Encrypt", key_id) from _safe_cause(exc)
        return bytes(response["CiphertextBlob"])

    def unwrap_key(self, wrapped_key: bytes, wrapping_key_id: str) -> bytes:
        """KMS ``Decrypt`` of ``wrapped_key`` (a ``CiphertextBlob``) with ``wrapping_key_id``."""
        blob = _key_bytes(wrapped_key, "wrapped key")
        key_id = self._allowed_key_id(wrapping_key_id)
        client = self._require_client()
        try:
            response = client.decrypt(
                KeyId=key_id,
                CiphertextBlob=blob,
                EncryptionAlgorithm=self.encryption_algorithm_spec,
            )
        except Exception as exc:  # noqa: BLE001 - every backend failure is mapped
            raise map_aws_error(exc, "Decrypt", key_id) from _safe_cause(exc)
        return bytes(response["Plaintext"])

    def close(self) -> None:
        """Close the boto3 client if this object created it.  Idempotent."""
        client, self._client = self._client, None
        if client is not None and self._owns_client:
            close = getattr(client, "close", None)
            if close is not None:
                close()

    def __repr__(self) -> str:
        return f"<AwsKms kms-type='aws' algorithm={self.encryption_algorithm_spec!r}>"


def _safe_cause(exc: BaseException) -> BaseException | None:
    """The exception to chain as ``__cause__``: none for those that may quote the key."""
    from botocore import exceptions as bx

    if isinstance(exc, bx.ParamValidationError) or not isinstance(exc, (bx.BotoCoreError, bx.ClientError)):
        return None
    return exc

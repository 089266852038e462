"""KMIP key management client (``encryption.kms-type=kmip``) over PyKMIP's message layer.

Wrapping is AES-GCM performed *by the KMIP server* with a master key that never leaves it:
``wrap_key`` sends a KMIP 1.4 Encrypt request (Cryptographic Parameters: AES, block cipher
mode GCM, tag length 16; a 12-byte IV drawn here; Authenticated Encryption Additional Data)
and ``unwrap_key`` the matching Decrypt request with the tag.  PyKMIP's high-level
``ProxyKmipClient`` only offers CBC, which authenticates nothing: a flipped ciphertext bit
would unwrap to a different key without any error.  The GCM fields exist only in KMIP 1.4
payloads, so this module builds the request payloads itself and speaks KMIP 1.4 over its
own TLS connections (client certificate required; the server certificate and host name
are verified).  PyKMIP's server (0.11) implements GCM Encrypt/Decrypt with AAD and tags.

Wrapped blob (all offsets in bytes)::

    0      1       version = 0x01
    1      12      GCM IV (random, drawn by the client)
    13     n       ciphertext (n = len(key))
    13+n   16      GCM tag

The AAD is ``b"icecrypt-kmip-wrap" || version || utf-8(wrapping_key_id)``, so a blob
only unwraps under the key id it was wrapped for, and the version byte is authenticated.

Master key ids are KMIP *unique identifiers* (what Create returns), used verbatim: no
Locate round trip, and no ambiguity when two objects share a name.  The key must be an
active AES key whose usage mask allows Encrypt and Decrypt; :meth:`KmipKms.create_master_key`
makes one.  (PyKMIP's server checks the *Get* policy for Encrypt/Decrypt, so there the
owner could also Get the key; production servers should mark master keys non-extractable.)

Properties read by :meth:`KmipKms.initialize`:

``kmip.host`` (required), ``kmip.port`` (default 5696), ``kmip.certfile`` and
``kmip.keyfile`` (client certificate and key, PEM; required), ``kmip.ca-certs`` (PEM CA
bundle that signs the server certificate; default: the system trust store),
``kmip.server-hostname`` (name checked against the server certificate; default
``kmip.host``), ``kmip.timeout`` (seconds for connect, TLS handshake and each reply;
default 10).

Errors: Item Not Found -> :class:`KmsKeyNotFoundError`; Permission Denied or
Authentication Not Successful, and a TLS handshake the server aborts over the client
certificate -> :class:`KmsAccessDeniedError`; a failed Decrypt (PyKMIP reports a GCM tag
mismatch as General Failure) or a malformed blob -> :class:`KmsInvalidWrappedKeyError`;
refused connections, timeouts and other TLS/socket failures -> :class:`KmsUnavailableError`;
anything else -> :class:`KmsError`.  Messages carry the KMIP result reason and message,
never key bytes.
"""

from __future__ import annotations

import os
import socket
import ssl
import struct
import threading
from collections.abc import Mapping

from icecrypt.errors import (
    KmsAccessDeniedError,
    KmsError,
    KmsInvalidWrappedKeyError,
    KmsKeyNotFoundError,
    KmsUnavailableError,
)
from icecrypt.kms.base import KeyManagementClient

__all__ = ["KmipKms"]

VERSION = 0x01
IV_LENGTH = 12
TAG_LENGTH = 16
_AAD_LABEL = b"icecrypt-kmip-wrap"
_HEADER_LENGTH = 1 + IV_LENGTH
_DEFAULT_PORT = 5696
_DEFAULT_TIMEOUT = 10.0
_MAX_RESPONSE = 1 << 20  # KMIP replies here are tiny; refuse absurd lengths
_MAX_IDLE_CONNECTIONS = 8


def _kmip():
    """Import PyKMIP lazily (an optional extra: ``icecrypt[kmip]``)."""
    try:
        from kmip.core import attributes, enums, objects, primitives, utils
        from kmip.core.factories.attributes import AttributeFactory
        from kmip.core.messages import contents, messages, payloads
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise KmsError(f"the kmip KMS needs PyKMIP (pip install 'icecrypt[kmip]'): {exc}", backend="kmip") from exc
    return attributes, enums, messages, objects, primitives, utils, AttributeFactory, contents, payloads


class _Failure(Exception):
    """A KMIP operation answered with a failure status (internal)."""

    def __init__(self, reason, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


class _MalformedResponse(Exception):
    """The server's reply is not a KMIP response this client understands (internal)."""


class _Connection:
    """One TLS connection speaking KMIP 1.4; used by one thread at a time."""

    def __init__(self, sock: ssl.SSLSocket):
        self._sock = sock

    def call(self, operation, payload):
        """Send one request with one batch item; return its response payload or raise _Failure."""
        _, enums, messages, _, primitives, utils, _, contents, _ = _kmip()
        version = enums.KMIPVersion.KMIP_1_4
        header = messages.RequestHeader(
            protocol_version=contents.ProtocolVersion(1, 4),
            batch_count=contents.BatchCount(1),
        )
        item = messages.RequestBatchItem(
            operation=primitives.Enumeration(enums.Operation, operation, tag=enums.Tags.OPERATION),
            request_payload=payload,
        )
        stream = utils.BytearrayStream()
        messages.RequestMessage(request_header=header, batch_items=[item]).write(stream, version)
        self._sock.sendall(bytes(stream.buffer))

        head = self._recv_exact(8)
        (length,) = struct.unpack("!I", head[4:])
        if length > _MAX_RESPONSE:
            raise _MalformedResponse(f"response length {length} refused")
        body = self._recv_exact(length)
        response = messages.ResponseMessage()
        try:
            response.read(utils.BytearrayStream(head + body), version)
        except Exception as exc:  # PyKMIP raises assorted types on bad TTLV
            raise _MalformedResponse(str(exc)) from exc
        if len(response.batch_items) != 1:
            raise _MalformedResponse("not exactly one batch item")
        result = response.batch_items[0]
        if result.result_status.value != enums.ResultStatus.SUCCESS:
            reason = result.result_reason.value if result.result_reason is not None else None
            message = result.result_message.value if result.result_message is not None else ""
            raise _Failure(reason, message)
        return result.response_payload

    def _recv_exact(self, n: int) -> bytes:
        chunks = []
        while n:
            chunk = self._sock.recv(n)
            if not chunk:
                raise ConnectionResetError("KMIP server closed the connection")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass


def _bytes_like(value, what: str) -> bytes:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"{what} must be bytes-like, not {type(value).__name__}")
    return bytes(value)


def _aad(wrapping_key_id: str) -> bytes:
    return _AAD_LABEL + bytes([VERSION]) + wrapping_key_id.encode("utf-8")


class KmipKms(KeyManagementClient):
    """Wraps keys with AES-GCM inside a KMIP server (see the module docstring).

    Thread-safe: each call borrows a TLS connection from a small pool (opening one when
    none is idle) and returns it afterwards, so concurrent callers never share a socket.
    """

    kms_type = "kmip"

    def __init__(self) -> None:
        self._context: ssl.SSLContext | None = None
        self._host = ""
        self._port = _DEFAULT_PORT
        self._server_hostname = ""
        self._timeout = _DEFAULT_TIMEOUT
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()
        self._closed = False

    # -- configuration -------------------------------------------------------------------

    def initialize(self, properties: Mapping[str, str]) -> None:
        """Read ``kmip.*`` properties and build the TLS context (no connection yet)."""
        host = properties.get("kmip.host")
        certfile = properties.get("kmip.certfile")
        if not host:
            raise KmsError("kmip.host is required", backend=self.kms_type)
        if not certfile:
            raise KmsError("kmip.certfile is required (the server wants a client certificate)", backend=self.kms_type)
        try:
            self._port = int(properties.get("kmip.port", _DEFAULT_PORT))
            self._timeout = float(properties.get("kmip.timeout", _DEFAULT_TIMEOUT))
        except ValueError as exc:
            raise KmsError(f"invalid kmip.port or kmip.timeout: {exc}", backend=self.kms_type) from None
        if not 0 < self._port < 65536 or not self._timeout > 0:
            raise KmsError("kmip.port must be 1-65535 and kmip.timeout positive", backend=self.kms_type)
        self._host = host
        self._server_hostname = properties.get("kmip.server-hostname") or host
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ca_certs = properties.get("kmip.ca-certs")
            if ca_certs:
                context.load_verify_locations(cafile=ca_certs)
            context.load_cert_chain(certfile, properties.get("kmip.keyfile") or None)
        except (OSError, ssl.SSLError) as exc:
            raise KmsError(f"cannot load KMIP TLS files: {exc}", backend=self.kms_type) from exc
        self._context = context
        self._closed = False

    # -- the protocol ----------------------------------------------------------------------

    def wrap_key(self, key: bytes, wrapping_key_id: str) -> bytes:
        """Encrypt ``key`` with AES-GCM under the server-held key ``wrapping_key_id``."""
        key = _bytes_like(key, "key")
        if not key:
            raise ValueError("key must not be empty")
        attributes, enums, *_, payloads = _kmip()
        iv = os.urandom(IV_LENGTH)
        payload = payloads.EncryptRequestPayload(
            unique_identifier=wrapping_key_id,
            cryptographic_parameters=self._gcm_parameters(attributes, enums),
            data=key,
            iv_counter_nonce=iv,
            auth_additional_data=_aad(wrapping_key_id),
        )
        result = self._call(enums.Operation.ENCRYPT, payload, "Encrypt", wrapping_key_id)
        tag = result.auth_tag or b""
        if len(result.data or b"") != len(key) or len(tag) != TAG_LENGTH:
            raise KmsError(
                f"KMIP Encrypt with key {wrapping_key_id!r} returned no GCM ciphertext and tag "
                "(does the server support KMIP 1.4 authenticated encryption?)",
                backend=self.kms_type,
            )
        return bytes([VERSION]) + iv + result.data + tag

    def unwrap_key(self, wrapped_key: bytes, wrapping_key_id: str) -> bytes:
        """Decrypt and authenticate a blob from :meth:`wrap_key` inside the server."""
        wrapped_key = _bytes_like(wrapped_key, "wrapped_key")
        if len(wrapped_key) <= _HEADER_LENGTH + TAG_LENGTH or wrapped_key[0] != VERSION:
            raise KmsInvalidWrappedKeyError(
                f"not a KMIP-wrapped key (length {len(wrapped_key)}, expected version {VERSION})",
                backend=self.kms_type,
            )
        attributes, enums, *_, payloads = _kmip()
        payload = payloads.DecryptRequestPayload(
            unique_identifier=wrapping_key_id,
            cryptographic_parameters=self._gcm_parameters(attributes, enums),
            data=wrapped_key[_HEADER_LENGTH:-TAG_LENGTH],
            iv_counter_nonce=wrapped_key[1:_HEADER_LENGTH],
            auth_additional_data=_aad(wrapping_key_id),
            auth_tag=wrapped_key[-TAG_LENGTH:],
        )
        result = self._call(enums.Operation.DECRYPT, payload, "Decrypt", wrapping_key_id)
        return bytes(result.data)

    def create_master_key(self, name: str | None = None, length: int = 256) -> str:
        """Create and activate an AES master key in the server; return its unique identifier.

        The key is generated by the server (usage mask Encrypt|Decrypt) and never sent here.
        """
        if length not in (128, 192, 256):
            raise ValueError("length must be 128, 192 or 256 bits")
        attributes, enums, _, objects, _, _, AttributeFactory, _, payloads = _kmip()
        factory = AttributeFactory()
        attrs = [
            factory.create_attribute(enums.AttributeType.CRYPTOGRAPHIC_ALGORITHM, enums.CryptographicAlgorithm.AES),
            factory.create_attribute(enums.AttributeType.CRYPTOGRAPHIC_LENGTH, length),
            factory.create_attribute(
                enums.AttributeType.CRYPTOGRAPHIC_USAGE_MASK,
                [enums.CryptographicUsageMask.ENCRYPT, enums.CryptographicUsageMask.DECRYPT],
            ),
        ]
        if name:
            attrs.append(factory.create_attribute(enums.AttributeType.NAME, name))
        create = payloads.CreateRequestPayload(
            object_type=enums.ObjectType.SYMMETRIC_KEY,
            template_attribute=objects.TemplateAttribute(attributes=attrs),
        )
        uid = self._call(enums.Operation.CREATE, create, "Create", name or "(unnamed)", retry=False).unique_identifier
        activate = payloads.ActivateRequestPayload(unique_identifier=attributes.UniqueIdentifier(uid))
        self._call(enums.Operation.ACTIVATE, activate, "Activate", uid)
        return uid

    def close(self) -> None:
        """Close every idle connection; later calls open new ones.  Idempotent."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def __repr__(self) -> str:
        return f"<KmipKms kms-type='kmip' server={self._host}:{self._port}>"

    # -- internals -------------------------------------------------------------------------

    @staticmethod
    def _gcm_parameters(attributes, enums):
        return attributes.CryptographicParameters(
            block_cipher_mode=enums.BlockCipherMode.GCM,
            cryptographic_algorithm=enums.CryptographicAlgorithm.AES,
            tag_length=TAG_LENGTH,
        )

    def _connect(self) -> _Connection:
        if self._context is None:
            raise KmsError("KmipKms is not initialized", backend=self.kms_type)
        sock = socket.create_connection((self._host, self._port), timeout=self._timeout)
        try:
            tls = self._context.wrap_socket(sock, server_hostname=self._server_hostname)
        except BaseException:
            sock.close()
            raise
        return _Connection(tls)

    def _call(self, operation, payload, name: str, key_id: str, *, retry: bool = True):
        """Run one operation; map every failure to a KmsError subclass."""
        where = f"KMIP {name} with key {key_id!r} at {self._host}:{self._port}"
        for attempt in (0, 1):
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            reused = conn is not None
            try:
                if conn is None:
                    conn = self._connect()
                result = conn.call(operation, payload)
            except _Failure as failure:
                self._release(conn)  # the connection is fine; the request failed
                raise self._map_failure(failure, operation, where) from None
            except ssl.SSLError as exc:
                if conn is not None:
                    conn.close()
                if reused and retry and attempt == 0:
                    continue
                raise self._map_tls_error(exc, where) from exc
            except OSError as exc:  # refused, reset, timed out (socket.timeout is an OSError)
                if conn is not None:
                    conn.close()
                if reused and retry and attempt == 0:
                    continue  # an idle connection the server dropped: try once on a new one
                raise KmsUnavailableError(f"{where}: {exc}", backend=self.kms_type) from exc
            except _MalformedResponse as exc:
                conn.close()
                raise KmsError(f"{where}: malformed KMIP response: {exc}", backend=self.kms_type) from exc
            self._release(conn)
            return result
        raise AssertionError("unreachable")  # pragma: no cover

    def _release(self, conn: _Connection | None) -> None:
        if conn is None:
            return
        with self._lock:
            if len(self._idle) < _MAX_IDLE_CONNECTIONS:
                self._idle.append(conn)
                return
        conn.close()

    def _map_failure(self, failure: _Failure, operation, where: str) -> KmsError:
        _, enums, *_ = _kmip()
        reason = failure.reason
        text = f"{where}: {getattr(reason, 'name', reason)}: {failure.message}"
        if reason == enums.ResultReason.ITEM_NOT_FOUND:
            return KmsKeyNotFoundError(text, backend=self.kms_type)
        if reason in (enums.ResultReason.PERMISSION_DENIED, enums.ResultReason.AUTHENTICATION_NOT_SUCCESSFUL):
            return KmsAccessDeniedError(text, backend=self.kms_type)
        if operation == enums.Operation.DECRYPT and reason in (
            enums.ResultReason.CRYPTOGRAPHIC_FAILURE,
            enums.ResultReason.GENERAL_FAILURE,  # PyKMIP: an unhandled InvalidTag
        ):
            return KmsInvalidWrappedKeyError(text, backend=self.kms_type)
        return KmsError(text, backend=self.kms_type)

    def _map_tls_error(self, exc: ssl.SSLError, where: str) -> KmsError:
        # The server aborts the handshake with an alert when it rejects our certificate.
        reason = (getattr(exc, "reason", None) or "").upper()
        if "ALERT" in reason and any(
            word in reason for word in ("CERTIFICATE", "UNKNOWN_CA", "ACCESS_DENIED", "HANDSHAKE_FAILURE")
        ):
            text = f"{where}: the server refused the client certificate: {exc}"
            return KmsAccessDeniedError(text, backend=self.kms_type)
        return KmsUnavailableError(f"{where}: TLS failure: {exc}", backend=self.kms_type)

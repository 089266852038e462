"""A local stand-in for the slice of the Cloud KMS REST API (v1) that icecrypt uses.

Run as ``python -m servers.gcp_endpoint --port N --token T --key NAME ...``.  It serves,
on 127.0.0.1 over plain HTTP::

    POST /v1/{cryptoKey}:encrypt   {"plaintext", "plaintextCrc32c"}   -> {"name", "ciphertext", "ciphertextCrc32c", ...}
    POST /v1/{cryptoKey}:decrypt   {"ciphertext", "ciphertextCrc32c"} -> {"plaintext", "plaintextCrc32c", ...}
    GET  /__stats                  request counters (test hook, no auth)

Each CryptoKey is a random AES-256 key held only by this process.  The ciphertext is
``nonce(12) || AES-256-GCM(plaintext, aad=key name) || tag(16)`` -- opaque to clients, as
Cloud KMS ciphertext is.  Errors use Google's JSON error shape and status codes so that
google-api-core raises its real exception classes (NotFound, PermissionDenied,
Unauthenticated, InvalidArgument).

Authentication: ``Authorization: Bearer <--token>`` is required (401 UNAUTHENTICATED
otherwise); ``--denied-token`` is a valid identity without permissions (403
PERMISSION_DENIED).  ``--corrupt-key`` names a key whose responses carry a wrong CRC32C,
to test the client's integrity checks.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from icecrypt.kms.gcp import crc32c

_KEY = r"projects/[^/]+/locations/[^/]+/keyRings/[^/]+/cryptoKeys/[^/:]+"
_ENCRYPT = re.compile(rf"^/v1/({_KEY})(?:/cryptoKeyVersions/[^/:]+)?:encrypt$")
_DECRYPT = re.compile(rf"^/v1/({_KEY}):decrypt$")
_MAX_PLAINTEXT = 64 * 1024  # Cloud KMS's limit for Encrypt


class ApiError(Exception):
    """An error answered in Google's JSON error format."""

    def __init__(self, http_status: int, status: str, message: str):
        super().__init__(message)
        self.http_status, self.status, self.message = http_status, status, message


class KmsState:
    """Keys and counters shared by the handler threads."""

    def __init__(self, keys: list[str], token: str, denied_token: str | None, corrupt_keys: list[str]):
        self.keys = {name: AESGCM(AESGCM.generate_key(bit_length=256)) for name in keys}
        self.token, self.denied_token = token, denied_token
        self.corrupt_keys = set(corrupt_keys)
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()

    def count(self, what: str) -> None:
        with self.lock:
            self.counts[what] += 1


def _b64decode(value: object, field: str) -> bytes:
    if not isinstance(value, str):
        raise ApiError(400, "INVALID_ARGUMENT", f"Invalid value at '{field}': expected base64 bytes.")
    try:
        # proto3 JSON accepts standard and URL-safe base64, padded or not
        value = value.replace("-", "+").replace("_", "/")
        return base64.b64decode(value + "=" * (-len(value) % 4), validate=True)
    except ValueError:
        raise ApiError(400, "INVALID_ARGUMENT", f"Invalid value at '{field}': invalid base64.") from None


def _check_crc(body: dict, field: str, data: bytes) -> bool:
    """Verify an optional Int64Value checksum field; return whether one was sent."""
    raw = body.get(field + "Crc32c")
    if raw is None:
        return False
    if int(raw) != crc32c(data):
        snake = re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), field)
        raise ApiError(
            400, "INVALID_ARGUMENT", f"The checksum in field {snake}_crc32c did not match the data in field {snake}."
        )
    return True


class Handler(BaseHTTPRequestHandler):
    """One request of the Cloud KMS REST API slice."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in separate writes
    server_version = "icecrypt-gcp-kms-test"
    state: KmsState  # set on the class by main()

    def log_message(self, format, *args):  # noqa: A002 - quiet; the tests count requests instead
        pass

    def _send_json(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        self._read_body()
        if self.path == "/__stats":
            with self.state.lock:
                self._send_json(200, dict(self.state.counts))
            return
        self._send_json(404, {"error": {"code": 404, "message": "Not found.", "status": "NOT_FOUND"}})

    def do_POST(self) -> None:  # noqa: N802
        raw = self._read_body()
        path = self.path.split("?", 1)[0]
        state = self.state
        try:
            encrypt, decrypt = _ENCRYPT.match(path), _DECRYPT.match(path)
            if not (encrypt or decrypt):
                raise ApiError(404, "NOT_FOUND", "The requested URL was not found on this server.")
            operation = "encrypt" if encrypt else "decrypt"
            state.count(operation)
            self._authorize(operation)
            name = (encrypt or decrypt).group(1)
            aead = state.keys.get(name)
            if aead is None:
                raise ApiError(404, "NOT_FOUND", f"{name} not found.")
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                raise ApiError(400, "INVALID_ARGUMENT", "Invalid JSON payload received.") from None
            result = self._encrypt(name, aead, body) if encrypt else self._decrypt(name, aead, body)
        except ApiError as err:
            state.count(f"error:{err.status}")
            self._send_json(
                err.http_status, {"error": {"code": err.http_status, "message": err.message, "status": err.status}}
            )
            return
        self._send_json(200, result)

    def _authorize(self, operation: str) -> None:
        header = self.headers.get("Authorization", "")
        token = header[len("Bearer ") :] if header.startswith("Bearer ") else None
        if token == self.state.token:
            return
        if token is not None and token == self.state.denied_token:
            permission = "useToEncrypt" if operation == "encrypt" else "useToDecrypt"
            raise ApiError(
                403,
                "PERMISSION_DENIED",
                f"Permission 'cloudkms.cryptoKeyVersions.{permission}' denied on resource (or it may not exist).",
            )
        raise ApiError(
            401, "UNAUTHENTICATED", "Request had invalid authentication credentials. Expected OAuth 2 access token."
        )

    def _encrypt(self, name: str, aead: AESGCM, body: dict) -> dict:
        plaintext = _b64decode(body.get("plaintext", ""), "plaintext")
        if len(plaintext) > _MAX_PLAINTEXT:
            raise ApiError(400, "INVALID_ARGUMENT", f"The plaintext must be at most {_MAX_PLAINTEXT} bytes.")
        verified = _check_crc(body, "plaintext", plaintext)
        nonce = os.urandom(12)
        ciphertext = nonce + aead.encrypt(nonce, plaintext, name.encode())
        checksum = crc32c(ciphertext) ^ (1 if name in self.state.corrupt_keys else 0)
        return {
            "name": f"{name}/cryptoKeyVersions/1",
            "ciphertext": base64.b64encode(ciphertext).decode(),
            "ciphertextCrc32c": str(checksum),
            "verifiedPlaintextCrc32c": verified,
            "verifiedAdditionalAuthenticatedDataCrc32c": False,
            "protectionLevel": "SOFTWARE",
        }

    def _decrypt(self, name: str, aead: AESGCM, body: dict) -> dict:
        ciphertext = _b64decode(body.get("ciphertext", ""), "ciphertext")
        _check_crc(body, "ciphertext", ciphertext)
        try:
            if len(ciphertext) < 12 + 16:
                raise InvalidTag
            plaintext = aead.decrypt(ciphertext[:12], ciphertext[12:], name.encode())
        except InvalidTag:
            raise ApiError(
                400, "INVALID_ARGUMENT", "Decryption failed: verify that 'name' refers to the correct CryptoKey."
            ) from None
        checksum = crc32c(plaintext) ^ (1 if name in self.state.corrupt_keys else 0)
        return {
            "plaintext": base64.b64encode(plaintext).decode(),
            "plaintextCrc32c": str(checksum),
            "usedPrimary": True,
            "protectionLevel": "SOFTWARE",
        }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token", required=True, help="the accepted bearer token")
    parser.add_argument("--denied-token", help="a bearer token that is answered 403")
    parser.add_argument("--key", action="append", default=[], help="CryptoKey resource name (repeatable)")
    parser.add_argument("--corrupt-key", action="append", default=[], help="key whose responses carry a wrong CRC32C")
    args = parser.parse_args(argv)
    Handler.state = KmsState(args.key + args.corrupt_key, args.token, args.denied_token, args.corrupt_key)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()

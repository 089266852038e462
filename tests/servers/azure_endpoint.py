"""A local stand-in for the slice of the Azure Key Vault REST API that icecrypt uses.

Run as ``python -m servers.azure_endpoint --port N --cert C --cert-key K --token T
--key NAME:BITS ...``.  It serves HTTPS on 127.0.0.1 (the Azure SDK refuses plain HTTP)::

    GET  /keys/{name}[/{version}]            -> KeyBundle (public JWK: kid, kty, key_ops, n, e)
    POST /keys/{name}[/{version}]/wrapkey    {"alg", "value"} -> {"kid", "value"}
    POST /keys/{name}[/{version}]/unwrapkey  {"alg", "value"} -> {"kid", "value"}
    GET  /__stats, GET /__keys               request counters / key ids (test hooks, no auth)

Each key is an RSA key pair held by this process with one version; wrap/unwrap do real
RSA-OAEP-256, RSA-OAEP (SHA-1) or RSA1_5 with ``cryptography``.  Binary values are
base64url without padding, as in Key Vault.

Authentication follows Key Vault's challenge protocol: a request without a bearer token,
or with an unknown one, is answered 401 with a ``WWW-Authenticate: Bearer
authorization=..., resource=...`` challenge.  ``--token`` may do everything;
``--denied-token`` is answered 403 on everything; ``--no-get-token`` is answered 403 on
``keys/get`` only (so the SDK must wrap remotely instead of locally).
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import ssl
import threading
import time
import uuid
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

_NAME = re.compile(r"^[0-9A-Za-z-]{1,127}$")
_CHALLENGE = (
    'Bearer authorization="https://login.microsoftonline.com/00000000-0000-0000-0000-000000000000", '
    'resource="https://vault.azure.net"'
)


def _padding(alg: str) -> padding.AsymmetricPadding:
    if alg == "RSA-OAEP-256":
        return padding.OAEP(mgf=padding.MGF1(hashes.SHA256()), algorithm=hashes.SHA256(), label=None)
    if alg == "RSA-OAEP":
        return padding.OAEP(mgf=padding.MGF1(hashes.SHA1()), algorithm=hashes.SHA1(), label=None)
    if alg == "RSA1_5":
        return padding.PKCS1v15()
    raise ApiError(400, "BadParameter", f"Algorithm '{alg}' is not supported for this key type.")


def _parse_path(path: str) -> tuple[str, str, str] | None:
    """``/keys/{name}[/{version}][/wrapkey|/unwrapkey][/]`` -> (name, version, operation).

    The SDK asks for the latest version with an empty segment (``/keys/a//wrapkey``).
    """
    parts = path.split("/")
    if len(parts) < 3 or parts[0] != "" or parts[1] != "keys" or not _NAME.match(parts[2]):
        return None
    rest = parts[3:]
    if rest and rest[-1] == "":
        rest.pop()
    operation = rest.pop() if rest and rest[-1] in ("wrapkey", "unwrapkey") else "get"
    if len(rest) > 1:
        return None
    return parts[2], (rest[0] if rest else ""), operation


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64url(value: object) -> bytes:
    if not isinstance(value, str):
        raise ApiError(400, "BadParameter", "Property 'value' is required and must be a base64url string.")
    try:
        return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    except ValueError:
        raise ApiError(400, "BadParameter", "Property 'value' is not valid base64url.") from None


def _int_b64url(value: int) -> str:
    return _b64url(value.to_bytes((value.bit_length() + 7) // 8, "big"))


class ApiError(Exception):
    """An error answered in Key Vault's JSON error format."""

    def __init__(self, http_status: int, code: str, message: str):
        super().__init__(message)
        self.http_status, self.code, self.message = http_status, code, message


class VaultKey:
    """One RSA key (a single version) of the vault."""

    def __init__(self, name: str, bits: int):
        self.name = name
        self.version = uuid.uuid4().hex
        self.private_key = rsa.generate_private_key(public_exponent=65537, key_size=bits)
        self.created = int(time.time())


class VaultState:
    """Keys, tokens and counters shared by the handler threads."""

    def __init__(self, keys: dict[str, int], token: str, denied_token: str | None, no_get_token: str | None):
        self.keys = {name: VaultKey(name, bits) for name, bits in keys.items()}
        self.token, self.denied_token, self.no_get_token = token, denied_token, no_get_token
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.base_url = ""  # https://127.0.0.1:PORT, set by main()

    def count(self, what: str) -> None:
        with self.lock:
            self.counts[what] += 1

    def kid(self, key: VaultKey) -> str:
        return f"{self.base_url}/keys/{key.name}/{key.version}"


class Handler(BaseHTTPRequestHandler):
    """One request of the Key Vault REST API slice."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in separate writes
    server_version = "icecrypt-azure-keyvault-test"
    state: VaultState  # set on the class by main()

    def log_message(self, format, *args):  # noqa: A002 - quiet; the tests count requests instead
        pass

    def _send_json(self, status: int, payload: dict, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        self._handle("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._handle("POST")

    def _handle(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        path = self.path.split("?", 1)[0]
        state = self.state
        if method == "GET" and path in ("/__stats", "/__keys"):
            with state.lock:
                payload = (
                    dict(state.counts) if path == "/__stats" else {k.name: state.kid(k) for k in state.keys.values()}
                )
            self._send_json(200, payload)
            return
        headers = None
        try:
            parsed = _parse_path(path)
            if parsed is None or (method == "GET") != (parsed[2] == "get"):
                raise ApiError(404, "NotFound", "The requested resource was not found.")
            name, version, operation = parsed
            state.count(operation)
            self._authorize(operation)
            key = state.keys.get(name)
            if key is None or version not in ("", key.version):
                raise ApiError(404, "KeyNotFound", f"A key with (name/id) {name} was not found in this key vault.")
            if operation == "get":
                result = self._key_bundle(key)
            else:
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    raise ApiError(400, "BadParameter", "The request body is not valid JSON.") from None
                result = self._wrap(key, body) if operation == "wrapkey" else self._unwrap(key, body)
        except ApiError as err:
            state.count(f"error:{err.http_status}")
            if err.http_status == 401:
                headers = {"WWW-Authenticate": _CHALLENGE}
            self._send_json(err.http_status, {"error": {"code": err.code, "message": err.message}}, headers)
            return
        self._send_json(200, result)

    def _authorize(self, operation: str) -> None:
        header = self.headers.get("Authorization", "")
        token = header[len("Bearer ") :] if header.startswith("Bearer ") else None
        state = self.state
        if token is None:
            raise ApiError(401, "Unauthorized", "AKV10000: Request is missing a Bearer or PoP token.")
        if token == state.token or (token == state.no_get_token and operation != "get"):
            return
        if token in (state.denied_token, state.no_get_token):
            raise ApiError(
                403, "Forbidden", f"Caller is not authorized to perform action on resource. Action: keys/{operation}."
            )
        raise ApiError(401, "Unauthorized", "AKV10022: Invalid audience or token.")

    def _key_bundle(self, key: VaultKey) -> dict:
        numbers = key.private_key.public_key().public_numbers()
        return {
            "key": {
                "kid": self.state.kid(key),
                "kty": "RSA",
                "key_ops": ["encrypt", "decrypt", "sign", "verify", "wrapKey", "unwrapKey"],
                "n": _int_b64url(numbers.n),
                "e": _int_b64url(numbers.e),
            },
            "attributes": {
                "enabled": True,
                "created": key.created,
                "updated": key.created,
                "recoveryLevel": "Recoverable+Purgeable",
                "recoverableDays": 90,
            },
        }

    def _wrap(self, key: VaultKey, body: dict) -> dict:
        value = _unb64url(body.get("value"))
        try:
            wrapped = key.private_key.public_key().encrypt(value, _padding(str(body.get("alg"))))
        except ValueError:
            raise ApiError(400, "BadParameter", "The value is too long for this key and algorithm.") from None
        return {"kid": self.state.kid(key), "value": _b64url(wrapped)}

    def _unwrap(self, key: VaultKey, body: dict) -> dict:
        value = _unb64url(body.get("value"))
        try:
            unwrapped = key.private_key.decrypt(value, _padding(str(body.get("alg"))))
        except ValueError:
            raise ApiError(
                400, "BadParameter", "Unwrap failed: the value is not a valid wrapped key for this key."
            ) from None
        return {"kid": self.state.kid(key), "value": _b64url(unwrapped)}


class TlsServer(ThreadingHTTPServer):
    """ThreadingHTTPServer whose connections do their TLS handshake in their own thread."""

    daemon_threads = True

    def __init__(self, address, handler, context: ssl.SSLContext):
        super().__init__(address, handler)
        self.socket = context.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)

    def finish_request(self, request, client_address) -> None:
        try:
            request.do_handshake()
        except (ssl.SSLError, OSError):
            return  # a client that does not trust us, or went away
        super().finish_request(request, client_address)

    def handle_error(self, request, client_address) -> None:
        pass  # broken connections are the client's business


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cert", required=True, help="server certificate chain (PEM)")
    parser.add_argument("--cert-key", required=True, help="server private key (PEM)")
    parser.add_argument("--token", required=True)
    parser.add_argument("--denied-token")
    parser.add_argument("--no-get-token")
    parser.add_argument("--key", action="append", default=[], help="NAME:BITS (repeatable)")
    args = parser.parse_args(argv)
    keys = {}
    for spec in args.key:
        name, _, bits = spec.partition(":")
        keys[name] = int(bits or 2048)
    Handler.state = state = VaultState(keys, args.token, args.denied_token, args.no_get_token)
    state.base_url = f"https://127.0.0.1:{args.port}"
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(args.cert, args.cert_key)
    server = TlsServer(("127.0.0.1", args.port), Handler, context)
    server.serve_forever()


if __name__ == "__main__":
    main()

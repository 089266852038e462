"""A local Cloud KMS endpoint (``servers.gcp_endpoint``) in its own process.

The real ``google-cloud-kms`` client talks HTTP to it through its REST transport.  How it
differs from Cloud KMS is listed in ``servers/gcp_endpoint.py`` and the final report of
issue 3 (key versions, IAM, ciphertext format).

Usage::

    with gcp_kms_server() as server:
        kms = create_kms_client(server.kms_properties())
        kms.wrap_key(key, server.key_id("key-a"))
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import secrets
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from servers import HOST, free_port, start_process, stop_process, wait_for_port

__all__ = ["GcpKmsServer", "gcp_kms_server", "KEY_RING", "KEY_NAMES", "CORRUPT_KEY_NAME"]

KEY_RING = "projects/icecrypt-test/locations/global/keyRings/icecrypt"
KEY_NAMES = ("key-a", "key-b")
#: a key whose responses carry a wrong CRC32C (tests the client's integrity checks)
CORRUPT_KEY_NAME = "key-corrupt-crc"

_TESTS_DIR = Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class GcpKmsServer:
    """A running local Cloud KMS endpoint."""

    host: str
    port: int
    pid: int
    token: str
    denied_token: str
    log_path: Path

    @property
    def endpoint(self) -> str:
        """The HTTP endpoint URL (``gcp.kms.endpoint``)."""
        return f"http://{self.host}:{self.port}"

    @staticmethod
    def key_id(name: str) -> str:
        """The CryptoKey resource name (a ``wrapping_key_id``) of key ``name``."""
        return f"{KEY_RING}/cryptoKeys/{name}"

    def kms_properties(self, **overrides: str) -> dict[str, str]:
        """Catalog properties that point icecrypt's ``gcp`` KMS client at this server."""
        properties = {
            "encryption.kms-type": "gcp",
            "gcp.kms.endpoint": self.endpoint,
            "gcs.oauth2.token": self.token,
            "gcp.kms.timeout-ms": "10000",
            "gcp.kms.allowed-key-rings": KEY_RING,
            "gcp.kms.allow-insecure-transport": "true",  # the local endpoint speaks plain HTTP
        }
        properties.update(overrides)
        return properties

    def raw_encrypt(self, name: str, plaintext: bytes) -> bytes:
        """Encrypt through the REST API directly (test setup that bypasses the client)."""
        request = urllib.request.Request(
            f"{self.endpoint}/v1/{self.key_id(name)}:encrypt",
            data=json.dumps({"plaintext": base64.b64encode(plaintext).decode()}).encode(),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            return base64.b64decode(json.load(response)["ciphertext"])

    def stats(self) -> dict[str, int]:
        """Request counters of the server (``encrypt``, ``decrypt``, ``error:<STATUS>``)."""
        with urllib.request.urlopen(f"{self.endpoint}/__stats", timeout=5) as response:
            return json.load(response)


@contextlib.contextmanager
def gcp_kms_server(start_timeout: float = 20.0, log_dir: str | Path | None = None) -> Iterator[GcpKmsServer]:
    """Start the endpoint on a free 127.0.0.1 port; stop it (by PID) on exit."""
    port = free_port()
    token, denied_token = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    # "--opt=value": a token may start with "-"
    args = [sys.executable, "-m", "servers.gcp_endpoint", f"--port={port}", f"--token={token}"]
    args.append(f"--denied-token={denied_token}")
    for name in KEY_NAMES:
        args += ["--key", GcpKmsServer.key_id(name)]
    args += ["--corrupt-key", GcpKmsServer.key_id(CORRUPT_KEY_NAME)]
    with contextlib.ExitStack() as stack:
        if log_dir is None:
            log_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="icecrypt-gcp-"))
        log_path = Path(log_dir) / f"gcp-kms-{port}.log"
        proc = start_process(args, cwd=_TESTS_DIR, log_path=log_path)
        try:
            wait_for_port(HOST, port, timeout=start_timeout, proc=proc)
            yield GcpKmsServer(
                host=HOST, port=port, pid=proc.pid, token=token, denied_token=denied_token, log_path=log_path
            )
        finally:
            stop_process(proc)

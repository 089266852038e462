"""A real ``KeyManagementClient`` that delegates to another one (LocalKms, MemoryKms)
and, at the Nth ``wrap_key``/``unwrap_key`` call, fails (``KmsUnavailableError``) or
hangs until its timeout.

The hang is a real one, bounded the way icecrypt's network backends bound their calls
(``kmip.timeout``, ``kms.read-timeout-ms``, ...): the call connects to a local socket
that accepts no request and never answers, and waits for a reply with a socket timeout
(``timeout`` seconds, the client's ``failing.timeout-ms`` property); the timeout surfaces
as ``KmsUnavailableError``, as the backends report theirs.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping

from icecrypt.errors import KmsUnavailableError
from icecrypt.kms.base import KeyManagementClient


class SilentServer:
    """A listening TCP socket nobody answers on (connections complete in the kernel)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.address = self.sock.getsockname()

    def close(self) -> None:
        self.sock.close()


class FailingKms(KeyManagementClient):
    kms_type = "failing"

    def __init__(self, delegate: KeyManagementClient, *, at: int | None = None, mode: str = "fail",
                 server: SilentServer | None = None, timeout: float = 0.2) -> None:
        self.delegate, self.at, self.mode, self.server, self.timeout = delegate, at, mode, server, timeout
        self.calls: list[str] = []
        self.fired: str | None = None

    def initialize(self, properties: Mapping[str, str]) -> None:
        if "failing.timeout-ms" in properties:
            self.timeout = int(properties["failing.timeout-ms"]) / 1000

    def _call(self, what: str) -> None:
        self.calls.append(what)
        if self.at is None or len(self.calls) != self.at:
            return
        self.fired = what
        if self.mode == "hang":
            with socket.create_connection(self.server.address, timeout=self.timeout) as conn:
                try:
                    conn.recv(1)  # never answered
                except TimeoutError:
                    raise KmsUnavailableError(
                        f"{what}: no answer from the KMS within {self.timeout:g} s (timed out)", backend=self.kms_type
                    ) from None
            raise AssertionError("the silent server answered")
        raise KmsUnavailableError(f"{what}: KMS unavailable (injected at call {len(self.calls)})", backend=self.kms_type)

    def wrap_key(self, key: bytes, wrapping_key_id: str) -> bytes:
        self._call(f"wrap_key({wrapping_key_id})")
        return self.delegate.wrap_key(key, wrapping_key_id)

    def unwrap_key(self, wrapped_key: bytes, wrapping_key_id: str) -> bytes:
        self._call(f"unwrap_key({wrapping_key_id})")
        return self.delegate.unwrap_key(wrapped_key, wrapping_key_id)

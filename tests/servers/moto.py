"""A local moto server: the AWS KMS (and S3) API on 127.0.0.1, for tests and benchmarks.

moto's standalone server is a separate process here (not moto's in-process mocks), so the
client code under test talks real HTTP to it exactly as it would to AWS.  Known
differences from AWS KMS are listed in FIELD-NOTES.md ("Local key servers").

Usage::

    with moto_server() as server:
        boto3.client("kms", endpoint_url=server.endpoint, region_name=server.region, ...)
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from servers import HOST, free_port, start_process, stop_process, wait_for_port

__all__ = ["MotoServer", "moto_server", "REGION", "ACCESS_KEY_ID", "SECRET_ACCESS_KEY"]

REGION = "us-east-1"
# moto accepts any credentials; these fixed dummies keep the real credential chain
# (environment, ~/.aws, instance metadata) out of the tests.
ACCESS_KEY_ID = "AKIAICECRYPTTESTKEY0"
SECRET_ACCESS_KEY = "icecrypt-test-secret-not-a-real-key"
#: the account moto gives every resource (its default; key ARNs carry it)
MOTO_ACCOUNT_ID = "123456789012"

# Run moto's server module with werkzeug's per-request log silenced.
_LAUNCHER = (
    "import logging, sys\n"
    "logging.getLogger('werkzeug').setLevel(logging.ERROR)\n"
    "from moto.server import main\n"
    "main(sys.argv[1:])\n"
)


@dataclasses.dataclass(frozen=True)
class MotoServer:
    """A running moto server."""

    host: str
    port: int
    pid: int
    log_path: Path

    @property
    def endpoint(self) -> str:
        """The HTTP endpoint URL (``kms.endpoint`` / boto3 ``endpoint_url``)."""
        return f"http://{self.host}:{self.port}"

    region: str = REGION
    access_key_id: str = ACCESS_KEY_ID
    secret_access_key: str = SECRET_ACCESS_KEY

    def kms_properties(self) -> dict[str, str]:
        """Catalog properties that point icecrypt's ``aws`` KMS client at this server."""
        return {
            "encryption.kms-type": "aws",
            "kms.endpoint": self.endpoint,
            "client.region": self.region,
            "kms.access-key-id": self.access_key_id,
            "kms.secret-access-key": self.secret_access_key,
            "kms.allow-insecure-transport": "true",  # moto speaks plain HTTP on 127.0.0.1
            "kms.allowed-account-ids": MOTO_ACCOUNT_ID,
        }

    def boto3_client(self, service: str = "kms"):
        """A boto3 client for ``service`` on this server (for test setup: create keys etc.)."""
        import boto3

        return boto3.session.Session().client(
            service,
            endpoint_url=self.endpoint,
            region_name=self.region,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
        )


@contextlib.contextmanager
def moto_server(start_timeout: float = 20.0, log_dir: str | Path | None = None) -> Iterator[MotoServer]:
    """Start a moto server on a free 127.0.0.1 port; stop it (by PID) on exit."""
    port = free_port()
    with contextlib.ExitStack() as stack:
        if log_dir is None:
            log_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="icecrypt-moto-"))
        log_path = Path(log_dir) / f"moto-{port}.log"
        proc = start_process(
            [sys.executable, "-c", _LAUNCHER, "-H", HOST, "-p", str(port)],
            log_path=log_path,
        )
        try:
            wait_for_port(HOST, port, timeout=start_timeout, proc=proc)
            yield MotoServer(host=HOST, port=port, pid=proc.pid, log_path=log_path)
        finally:
            stop_process(proc)

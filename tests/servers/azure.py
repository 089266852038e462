"""A local Azure Key Vault endpoint (``servers.azure_endpoint``) in its own process.

The Azure SDK only talks HTTPS to a vault and authenticates through a 401 challenge, so the
endpoint gets a certificate for 127.0.0.1 issued by a throw-away CA made here with
``cryptography``; the client trusts that CA through ``azure.keyvault.ca-cert``.
Because the vault is addressed by IP, its challenge (``resource=https://vault.azure.net``,
as the real service sends) cannot match the vault's domain, so the tests switch off the
SDK's challenge-domain check with ``azure.keyvault.verify-challenge-resource=false``.

Usage::

    with azure_keyvault_server(tmp_dir) as server:
        kms = create_kms_client(server.kms_properties())
        kms.wrap_key(key, "key-a")
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import ipaddress
import json
import secrets
import ssl
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from servers import HOST, free_port, start_process, stop_process, wait_for_port

__all__ = ["AzureKeyVaultServer", "azure_keyvault_server", "make_tls_files", "KEYS"]

#: name -> RSA modulus bits of the vault's keys
KEYS = {"key-a": 2048, "key-b": 3072}

_TESTS_DIR = Path(__file__).resolve().parent.parent


def make_tls_files(directory: Path, host: str = HOST) -> tuple[Path, Path, Path]:
    """Write a CA certificate and a server certificate/key for ``host`` into ``directory``.

    Returns ``(ca_cert, server_cert, server_key)`` PEM paths.  The certificates carry the
    extensions strict X.509 verification wants (key ids, key usage, SAN).
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "icecrypt test CA")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )  # keyCertSign, cRLSign
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True
        )  # digitalSignature
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host)), x509.DNSName("localhost")]),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(server_key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    directory = Path(directory)
    ca_path, cert_path, key_path = directory / "ca.pem", directory / "server.pem", directory / "server-key.pem"
    ca_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        server_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    key_path.chmod(0o600)
    return ca_path, cert_path, key_path


@dataclasses.dataclass(frozen=True)
class AzureKeyVaultServer:
    """A running local Key Vault endpoint."""

    host: str
    port: int
    pid: int
    ca_path: Path
    token: str
    denied_token: str
    no_get_token: str
    log_path: Path

    @property
    def vault_url(self) -> str:
        """The vault URL (``azure.keyvault.url``)."""
        return f"https://{self.host}:{self.port}"

    def kms_properties(self, **overrides: str) -> dict[str, str]:
        """Catalog properties that point icecrypt's ``azure`` KMS client at this vault."""
        properties = {
            "encryption.kms-type": "azure",
            "azure.keyvault.url": self.vault_url,
            "adls.token": self.token,
            "azure.keyvault.ca-cert": str(self.ca_path),
            "azure.keyvault.verify-challenge-resource": "false",
        }
        properties.update(overrides)
        return properties

    def _get(self, path: str) -> dict:
        context = ssl.create_default_context(cafile=str(self.ca_path))
        with urllib.request.urlopen(f"{self.vault_url}{path}", timeout=5, context=context) as response:
            return json.load(response)

    def stats(self) -> dict[str, int]:
        """Request counters (``get``, ``wrapkey``, ``unwrapkey``, ``error:<HTTP status>``)."""
        return self._get("/__stats")

    def key_ids(self) -> dict[str, str]:
        """Key name -> full key id (``https://.../keys/name/version``)."""
        return self._get("/__keys")


@contextlib.contextmanager
def azure_keyvault_server(
    work_dir: str | Path | None = None, start_timeout: float = 30.0
) -> Iterator[AzureKeyVaultServer]:
    """Start the endpoint on a free 127.0.0.1 port; stop it (by PID) on exit.

    TLS files and the log go to ``work_dir`` (a temporary directory if not given).
    """
    port = free_port()
    tokens = [secrets.token_urlsafe(24) for _ in range(3)]
    with contextlib.ExitStack() as stack:
        if work_dir is None:
            work_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="icecrypt-azure-"))
        work_dir = Path(work_dir)
        ca_path, cert_path, key_path = make_tls_files(work_dir)
        log_path = work_dir / f"azure-keyvault-{port}.log"
        args = [
            sys.executable, "-m", "servers.azure_endpoint", "--port", str(port),
            "--cert", str(cert_path), "--cert-key", str(key_path),
            # "--opt=value": a token may start with "-"
            f"--token={tokens[0]}", f"--denied-token={tokens[1]}", f"--no-get-token={tokens[2]}",
        ]  # fmt: skip
        for name, bits in KEYS.items():
            args += ["--key", f"{name}:{bits}"]
        proc = start_process(args, cwd=_TESTS_DIR, log_path=log_path)
        try:
            wait_for_port(HOST, port, timeout=start_timeout, proc=proc)
            yield AzureKeyVaultServer(
                host=HOST, port=port, pid=proc.pid, ca_path=ca_path, token=tokens[0],
                denied_token=tokens[1], no_get_token=tokens[2], log_path=log_path,
            )  # fmt: skip
        finally:
            stop_process(proc)

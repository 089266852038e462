"""A local PyKMIP server for tests and benchmarks: its own CA, TLS client certificates.

:func:`make_pki` writes a throw-away certificate authority and the certificates the tests
need into a directory; :func:`kmip_server` starts ``pykmip-server`` on 127.0.0.1 with a
free port in its own session (PyKMIP forks a ``multiprocessing`` manager, and SIGTERM can
take ~10 s, so it is stopped by killing its process group) and yields a
:class:`KmipServer` that knows how to build client properties for each identity.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from servers import HOST, free_port, start_process, stop_process, venv_bin, wait_for_port

__all__ = ["Identity", "Pki", "KmipServer", "make_pki", "kmip_server"]

#: PyKMIP's server offers only TLS 1.2 suites from its own list; these two fit EC keys.
_CIPHER_SUITES = "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256 TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384"


@dataclass(frozen=True)
class Identity:
    """A certificate and its private key (PEM files)."""

    certfile: Path
    keyfile: Path


@dataclass(frozen=True)
class Pki:
    """Everything :func:`make_pki` writes.

    ``client`` and ``other_client`` are valid TLS clients with different identities (the
    server's owner-only policy keeps their keys apart); ``no_client_auth`` lacks the
    clientAuth extended key usage; ``foreign`` is signed by a CA the server does not trust.
    """

    ca_certs: Path
    server: Identity
    client: Identity
    other_client: Identity
    no_client_auth: Identity
    foreign: Identity


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _issue(
    directory: Path,
    stem: str,
    common_name: str,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool = False,
    usages: list[x509.ObjectIdentifier] | None = None,
    server: bool = False,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """Write ``stem.pem``/``stem.key``; self-signed when ``issuer`` is None."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    issuer_cert, issuer_key = issuer if issuer is not None else (None, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(issuer_cert.subject if issuer_cert is not None else _name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
    else:
        builder = builder.add_extension(
            x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True
        )
    if issuer_cert is not None:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_cert.public_key()), critical=False
        )
    if usages:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address(HOST)), x509.DNSName("localhost")]
            ),
            critical=False,
        )
    cert = builder.sign(issuer_key, hashes.SHA256())
    (directory / f"{stem}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, directory / f"{stem}.key")
    return cert, key


def make_pki(directory: Path) -> Pki:
    """Write a CA, a server certificate for 127.0.0.1 and client certificates into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = _issue(directory, "ca", "icecrypt test CA", None, ca=True)
    other_ca = _issue(directory, "foreign-ca", "icecrypt untrusted CA", None, ca=True)
    _issue(directory, "server", "localhost", ca, usages=[ExtendedKeyUsageOID.SERVER_AUTH], server=True)
    client_auth = [ExtendedKeyUsageOID.CLIENT_AUTH]
    _issue(directory, "client", "icecrypt-client", ca, usages=client_auth)
    _issue(directory, "other-client", "icecrypt-other-client", ca, usages=client_auth)
    _issue(directory, "no-client-auth", "icecrypt-no-client-auth", ca, usages=[ExtendedKeyUsageOID.SERVER_AUTH])
    _issue(directory, "foreign", "icecrypt-client", other_ca, usages=client_auth)

    def identity(stem: str) -> Identity:
        return Identity(directory / f"{stem}.pem", directory / f"{stem}.key")

    return Pki(
        ca_certs=directory / "ca.pem",
        server=identity("server"),
        client=identity("client"),
        other_client=identity("other-client"),
        no_client_auth=identity("no-client-auth"),
        foreign=identity("foreign"),
    )


@dataclass(frozen=True)
class KmipServer:
    """A running PyKMIP server and the PKI it trusts."""

    host: str
    port: int
    pki: Pki
    log_path: Path

    def properties(self, identity: Identity | None = None, **extra: str) -> dict[str, str]:
        """``encryption.kms-type=kmip`` client properties for ``identity`` (default: the client)."""
        identity = identity or self.pki.client
        props = {
            "encryption.kms-type": "kmip",
            "kmip.host": self.host,
            "kmip.port": str(self.port),
            "kmip.certfile": str(identity.certfile),
            "kmip.keyfile": str(identity.keyfile),
            "kmip.ca-certs": str(self.pki.ca_certs),
            "kmip.timeout": "10",
        }
        props.update(extra)
        return props


def _write_config(directory: Path, pki: Pki, port: int) -> Path:
    policies = directory / "policies"
    policies.mkdir(exist_ok=True)
    config = directory / "server.conf"
    config.write_text(
        textwrap.dedent(
            f"""\
            [server]
            hostname={HOST}
            port={port}
            certificate_path={pki.server.certfile}
            key_path={pki.server.keyfile}
            ca_path={pki.ca_certs}
            auth_suite=TLS1.2
            policy_path={policies}
            enable_tls_client_auth=True
            tls_cipher_suites={_CIPHER_SUITES}
            logging_level=INFO
            database_path={directory / "pykmip.db"}
            """
        )
    )
    return config


@contextlib.contextmanager
def kmip_server(directory: Path, start_timeout: float = 30.0) -> Iterator[KmipServer]:
    """Run ``pykmip-server`` on 127.0.0.1 for the duration of the context.

    The server process leads its own process group, which is killed on exit (PyKMIP's
    SIGTERM handling is slow and leaves its multiprocessing manager behind).
    """
    pki = make_pki(directory / "pki")
    port = free_port()
    config = _write_config(directory, pki, port)
    log_path = directory / "server.log"
    proc = start_process(
        [venv_bin("pykmip-server"), "-f", str(config), "-l", str(log_path)],
        cwd=directory,
        log_path=directory / "server.out",
    )
    try:
        wait_for_port(HOST, port, timeout=start_timeout, proc=proc)
        yield KmipServer(HOST, port, pki, log_path)
    finally:
        stop_process(proc, timeout=1.0)

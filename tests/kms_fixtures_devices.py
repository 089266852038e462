"""Pytest plugin: a PyKMIP server and SoftHSM2 tokens, one of each per test session.

Load it with ``pytest_plugins = ["kms_fixtures_devices"]`` in a conftest (or ``-p
kms_fixtures_devices``).  Fixtures skip (or, under make test, fail) the test when PyKMIP, python-pkcs11 or SoftHSM2 is
not installed; they never touch anything outside their temporary directories and
127.0.0.1.
"""

from __future__ import annotations


from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from servers import require_module, unavailable
from servers.kmip import KmipServer
from servers.kmip import kmip_server as _run_kmip_server
from servers.softhsm import SoftHsmToken, find_softhsm_module, softhsm_tokens

#: labels of the SoftHSM2 tokens: the main one and a second that nobody logs in to
SOFTHSM_LABELS = ("icecrypt", "icecrypt-spare")


@dataclass(frozen=True)
class MasterKeys:
    """Two master key ids in one KMS: ``a`` (AES-256) and ``b`` (AES-128)."""

    a: str
    b: str


def _require(module: str) -> None:
    require_module(module)


@pytest.fixture(scope="session")
def kmip_server(tmp_path_factory) -> Iterator[KmipServer]:
    """A PyKMIP server on 127.0.0.1 with its own CA; stopped (process group) at the end."""
    _require("kmip")
    with _run_kmip_server(tmp_path_factory.mktemp("kmip")) as server:
        yield server


@pytest.fixture(scope="session")
def kmip_keys(kmip_server) -> MasterKeys:
    """Master keys created in the KMIP server by the test client identity."""
    from icecrypt.kms.kmip import KmipKms

    with KmipKms() as kms:
        kms.initialize(kmip_server.properties())
        return MasterKeys(a=kms.create_master_key("icecrypt-a", 256), b=kms.create_master_key("icecrypt-b", 128))


@pytest.fixture(scope="session")
def softhsm_token_pair(tmp_path_factory) -> tuple[SoftHsmToken, SoftHsmToken]:
    """Two initialized SoftHSM2 tokens in a private store (sets SOFTHSM2_CONF)."""
    _require("pkcs11")
    if find_softhsm_module() is None:
        unavailable("SoftHSM2 is not installed")
    main, spare = softhsm_tokens(tmp_path_factory.mktemp("softhsm"), list(SOFTHSM_LABELS))
    return main, spare


@pytest.fixture(scope="session")
def softhsm_token(softhsm_token_pair) -> SoftHsmToken:
    """The token holding the master keys of :func:`pkcs11_keys`."""
    return softhsm_token_pair[0]


@pytest.fixture(scope="session")
def pkcs11_keys(softhsm_token) -> Iterator[MasterKeys]:
    """Non-extractable AES master keys generated inside the token.

    A client stays open for the session so the token stays logged in (PKCS#11 login state
    is per process, see icecrypt.kms.pkcs11).
    """
    from icecrypt.kms.pkcs11 import Pkcs11Kms

    kms = Pkcs11Kms()
    kms.initialize(softhsm_token.properties())
    try:
        yield MasterKeys(a=kms.generate_master_key("icecrypt-a", 32), b=kms.generate_master_key("icecrypt-b", 16))
    finally:
        kms.close()

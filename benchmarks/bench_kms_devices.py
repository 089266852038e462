"""Wrap/unwrap latency of the KMIP and PKCS#11 clients against local devices (pytest-benchmark).

Run::

    .venv/bin/python -m pytest benchmarks/bench_kms_devices.py -o addopts="" -p no:cacheprovider \
        --benchmark-columns=min,median,mean,ops,rounds

KMIP: a PyKMIP server on 127.0.0.1 (TLS 1.2, client certificates); ``*_new_connection``
closes the client before each call, so it adds a TCP connect and TLS handshake and shows
what the connection pool saves.  PKCS#11: SoftHSM2; ``*_raw_*`` is python-pkcs11's AES-GCM
with a key handle held across calls, so the difference to ``wrap`` is icecrypt's key
lookup by label, locking and framing.  Compare only figures from the same run.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# The server helpers live in tests/servers (pytest's pythonpath covers only tests/).
_TESTS = Path(__file__).resolve().parent.parent / "tests"
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))

from icecrypt.kms import create_kms_client  # noqa: E402

KEY = os.urandom(32)
ROUNDS = 300
WARMUP = 20

pytestmark = pytest.mark.servers


def _run(benchmark, function, *args, rounds: int = ROUNDS):
    return benchmark.pedantic(function, args=args, rounds=rounds, iterations=1, warmup_rounds=WARMUP)


# --- KMIP (PyKMIP server) --------------------------------------------------------------------


@pytest.fixture(scope="module")
def kmip(tmp_path_factory):
    pytest.importorskip("kmip")
    from servers.kmip import kmip_server

    with kmip_server(tmp_path_factory.mktemp("kmip-bench")) as server:
        with create_kms_client(server.properties()) as kms:
            yield kms, kms.create_master_key("bench", 256)


def test_kmip_wrap(benchmark, kmip):
    kms, key_id = kmip
    benchmark.group = "kmip (PyKMIP)"
    assert _run(benchmark, kms.wrap_key, KEY, key_id)


def test_kmip_unwrap(benchmark, kmip):
    kms, key_id = kmip
    benchmark.group = "kmip (PyKMIP)"
    wrapped = kms.wrap_key(KEY, key_id)
    assert _run(benchmark, kms.unwrap_key, wrapped, key_id) == KEY


def test_kmip_wrap_new_connection(benchmark, kmip):
    kms, key_id = kmip
    benchmark.group = "kmip (PyKMIP)"

    def wrap_fresh():
        kms.close()
        return kms.wrap_key(KEY, key_id)

    assert _run(benchmark, wrap_fresh, rounds=100)


# --- PKCS#11 (SoftHSM2) ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pkcs11_kms(tmp_path_factory):
    pytest.importorskip("pkcs11")
    from servers.softhsm import find_softhsm_module, softhsm_tokens

    if find_softhsm_module() is None:
        pytest.skip("SoftHSM2 is not installed")
    (token,) = softhsm_tokens(tmp_path_factory.mktemp("softhsm-bench"), ["icecrypt-bench"])
    with create_kms_client(token.properties()) as kms:
        yield token, kms, kms.generate_master_key("bench", 32)


def test_pkcs11_wrap(benchmark, pkcs11_kms):
    _, kms, label = pkcs11_kms
    benchmark.group = "pkcs11 (SoftHSM2)"
    assert _run(benchmark, kms.wrap_key, KEY, label)


def test_pkcs11_unwrap(benchmark, pkcs11_kms):
    _, kms, label = pkcs11_kms
    benchmark.group = "pkcs11 (SoftHSM2)"
    wrapped = kms.wrap_key(KEY, label)
    assert _run(benchmark, kms.unwrap_key, wrapped, label) == KEY


def test_pkcs11_raw_gcm_encrypt(benchmark, pkcs11_kms):
    import pkcs11
    from pkcs11.mechanisms import GCMParams

    token, _, label = pkcs11_kms
    benchmark.group = "pkcs11 (SoftHSM2)"
    lib_token = pkcs11.lib(str(token.module)).get_token(token_label=token.label)
    with lib_token.open() as session:  # logged in already through the client
        key = session.get_key(object_class=pkcs11.ObjectClass.SECRET_KEY, label=label)

        def encrypt():
            params = GCMParams(os.urandom(12), b"aad", 128)
            return key.encrypt(KEY, mechanism=pkcs11.Mechanism.AES_GCM, mechanism_param=params)

        assert _run(benchmark, encrypt)

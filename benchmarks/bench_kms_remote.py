"""Wrap/unwrap latency of the remote KMS clients against local servers (pytest-benchmark).

Run::

    .venv/bin/python -m pytest benchmarks/bench_kms_remote.py -o addopts="" -p no:cacheprovider \
        --benchmark-columns=min,median,mean,ops,rounds

Each backend is measured through icecrypt (``wrap_key``/``unwrap_key``) and, for the
overhead ratio in the same run, through its own client library directly (``*_raw_*``).
The servers are local (moto on 127.0.0.1, OpenBao dev server with transit), so the figures
are the client stacks plus loopback HTTP, not a real KMS's network latency.
"""

from __future__ import annotations

import base64
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


def _run(benchmark, function, *args):
    return benchmark.pedantic(function, args=args, rounds=ROUNDS, iterations=1, warmup_rounds=WARMUP)


# --- AWS KMS (moto) ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def moto():
    pytest.importorskip("boto3")
    pytest.importorskip("moto.server")
    from servers.moto import moto_server

    with moto_server() as server:
        key_id = server.boto3_client("kms").create_key()["KeyMetadata"]["KeyId"]
        with create_kms_client(server.kms_properties()) as kms:
            yield server, kms, key_id


def test_aws_wrap(benchmark, moto):
    _, kms, key_id = moto
    benchmark.group = "aws (moto)"
    assert _run(benchmark, kms.wrap_key, KEY, key_id)


def test_aws_unwrap(benchmark, moto):
    _, kms, key_id = moto
    benchmark.group = "aws (moto)"
    wrapped = kms.wrap_key(KEY, key_id)
    assert _run(benchmark, kms.unwrap_key, wrapped, key_id) == KEY


def test_aws_raw_boto3_encrypt(benchmark, moto):
    server, _, key_id = moto
    benchmark.group = "aws (moto)"
    client = server.boto3_client("kms")
    assert _run(benchmark, lambda: client.encrypt(KeyId=key_id, Plaintext=KEY)["CiphertextBlob"])


# --- Vault transit (OpenBao) ---------------------------------------------------------------


@pytest.fixture(scope="module")
def openbao():
    pytest.importorskip("hvac")
    from servers.openbao import openbao_server

    with openbao_server() as server:
        server.create_transit_key("bench")
        with create_kms_client(server.kms_properties()) as kms:
            yield server, kms, "bench"


def test_vault_wrap(benchmark, openbao):
    _, kms, name = openbao
    benchmark.group = "vault (openbao)"
    assert _run(benchmark, kms.wrap_key, KEY, name)


def test_vault_unwrap(benchmark, openbao):
    _, kms, name = openbao
    benchmark.group = "vault (openbao)"
    wrapped = kms.wrap_key(KEY, name)
    assert _run(benchmark, kms.unwrap_key, wrapped, name) == KEY


def test_vault_raw_hvac_encrypt(benchmark, openbao):
    server, _, name = openbao
    benchmark.group = "vault (openbao)"
    transit = server.hvac_client().secrets.transit
    plaintext = base64.b64encode(KEY).decode("ascii")
    assert _run(benchmark, lambda: transit.encrypt_data(name, plaintext=plaintext)["data"]["ciphertext"])

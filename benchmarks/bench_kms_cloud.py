"""Wrap/unwrap latency of the gcp and azure KMS backends against their local endpoints.

    .venv/bin/pytest benchmarks/bench_kms_cloud.py --benchmark-only

The endpoints are the test servers (tests/servers), on 127.0.0.1: the figures are the
client libraries' own cost plus a local HTTP(S) round trip, not a cloud round trip.
Azure wraps locally with the public key after fetching it (``keys/get``); with a
versioned key id the fetched key is kept, without one it is fetched on every call (as in
Java), and without ``keys/get`` permission the vault wraps remotely.
"""

from __future__ import annotations

import os

import pytest

from icecrypt.kms import create_kms_client

pytest.importorskip("google.cloud.kms_v1")
pytest.importorskip("azure.keyvault.keys")

from servers.azure import azure_keyvault_server  # noqa: E402
from servers.gcp import gcp_kms_server  # noqa: E402

KEY = os.urandom(32)


@pytest.fixture(scope="module")
def gcp():
    with gcp_kms_server() as server, create_kms_client(server.kms_properties()) as kms:
        key_id = server.key_id("key-a")
        kms.wrap_key(KEY, key_id)  # warm up the HTTP session
        yield kms, key_id


@pytest.fixture(scope="module")
def azure(tmp_path_factory):
    with azure_keyvault_server(tmp_path_factory.mktemp("bench-azure")) as server:
        with (
            create_kms_client(server.kms_properties()) as kms,
            create_kms_client(server.kms_properties(**{"adls.token": server.no_get_token})) as remote_kms,
        ):
            kms.wrap_key(KEY, "key-a")  # warm up: TLS session, auth challenge
            remote_kms.wrap_key(KEY, "key-a")
            yield kms, remote_kms, server.key_ids()["key-a"]


def test_gcp_wrap(benchmark, gcp):
    kms, key_id = gcp
    benchmark.group = "gcp"
    benchmark(kms.wrap_key, KEY, key_id)


def test_gcp_unwrap(benchmark, gcp):
    kms, key_id = gcp
    benchmark.group = "gcp"
    wrapped = kms.wrap_key(KEY, key_id)
    assert benchmark(kms.unwrap_key, wrapped, key_id) == KEY


def test_azure_wrap_latest_version(benchmark, azure):
    kms, _, _ = azure
    benchmark.group = "azure"
    benchmark(kms.wrap_key, KEY, "key-a")


def test_azure_wrap_pinned_version(benchmark, azure):
    kms, _, full_id = azure
    benchmark.group = "azure"
    benchmark(kms.wrap_key, KEY, full_id)


def test_azure_wrap_remote(benchmark, azure):
    _, remote_kms, _ = azure
    benchmark.group = "azure"
    benchmark(remote_kms.wrap_key, KEY, "key-a")


def test_azure_unwrap_latest_version(benchmark, azure):
    kms, _, _ = azure
    benchmark.group = "azure"
    wrapped = kms.wrap_key(KEY, "key-a")
    assert benchmark(kms.unwrap_key, wrapped, "key-a") == KEY


def test_azure_unwrap_pinned_version(benchmark, azure):
    kms, _, full_id = azure
    benchmark.group = "azure"
    wrapped = kms.wrap_key(KEY, full_id)
    assert benchmark(kms.unwrap_key, wrapped, full_id) == KEY

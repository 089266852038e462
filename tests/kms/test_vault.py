"""VaultKms against a real OpenBao dev server (transit engine over HTTP on 127.0.0.1)."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from icecrypt.errors import (
    KmsAccessDeniedError,
    KmsError,
    KmsInvalidWrappedKeyError,
    KmsKeyNotFoundError,
    KmsUnavailableError,
)
from icecrypt.kms import create_kms_client

hvac = pytest.importorskip("hvac")

pytestmark = [pytest.mark.servers, pytest.mark.timeout(30)]

#: a recognizable key: it must never show up in messages or reprs
SECRET_KEY = b"ICECRYPT-SECRET-KEY-BYTES-0123!!"


def _properties(server, **overrides: str) -> dict[str, str]:
    properties = server.kms_properties()
    properties.update(overrides)
    return properties


# --- round trips and selection -------------------------------------------------------------


@pytest.mark.parametrize("length", [16, 24, 32])
def test_round_trip(vault_kms, vault_key_names, length):
    key = os.urandom(length)
    wrapped = vault_kms.wrap_key(key, vault_key_names["a"])
    assert wrapped.startswith(b"vault:v1:")
    wrapped.decode("ascii")
    assert vault_kms.unwrap_key(wrapped, vault_key_names["a"]) == key


def test_wrapping_is_randomized(vault_kms, vault_key_names):
    name = vault_key_names["a"]
    assert vault_kms.wrap_key(SECRET_KEY, name) != vault_kms.wrap_key(SECRET_KEY, name)


def test_wrapped_key_is_the_transit_ciphertext(vault_kms, vault_key_names, openbao_server):
    """The wrapped bytes are transit's ciphertext string: the Vault CLI/API unwraps them too."""
    import base64

    wrapped = vault_kms.wrap_key(SECRET_KEY, vault_key_names["a"])
    response = openbao_server.hvac_client().secrets.transit.decrypt_data(
        vault_key_names["a"], ciphertext=wrapped.decode("utf-8")
    )
    assert base64.b64decode(response["data"]["plaintext"]) == SECRET_KEY


@pytest.mark.parametrize("kms_type", ["vault", "VAULT"])
def test_selected_by_kms_type(openbao_server, vault_key_names, kms_type):
    from icecrypt.kms.vault import VaultKms

    with create_kms_client(_properties(openbao_server, **{"encryption.kms-type": kms_type})) as client:
        assert isinstance(client, VaultKms)
        name = vault_key_names["a"]
        assert client.unwrap_key(client.wrap_key(SECRET_KEY, name), name) == SECRET_KEY


def test_address_and_token_from_environment(openbao_server, vault_key_names, monkeypatch):
    monkeypatch.setenv("VAULT_ADDR", openbao_server.address)
    monkeypatch.setenv("VAULT_TOKEN", openbao_server.token)
    with create_kms_client({"encryption.kms-type": "vault", "vault.allow-insecure-transport": "true"}) as client:
        name = vault_key_names["b"]
        assert client.unwrap_key(client.wrap_key(SECRET_KEY, name), name) == SECRET_KEY


def test_missing_address_or_token(monkeypatch):
    for name in ("VAULT_ADDR", "BAO_ADDR", "VAULT_TOKEN", "BAO_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(KmsError, match="address"):
        create_kms_client({"encryption.kms-type": "vault", "vault.token": "t"})
    with pytest.raises(KmsError, match="token"):
        create_kms_client({"encryption.kms-type": "vault", "vault.address": "http://127.0.0.1:1"})


def test_injected_hvac_client(openbao_server, vault_key_names):
    from icecrypt.kms.vault import VaultKms

    client = openbao_server.hvac_client()
    kms = VaultKms(client=client)
    kms.initialize({})
    with kms:
        name = vault_key_names["a"]
        assert kms.unwrap_key(kms.wrap_key(SECRET_KEY, name), name) == SECRET_KEY
    assert client.is_authenticated()  # close() leaves a client it did not create usable


def test_custom_transit_mount(openbao_server):
    admin = openbao_server.hvac_client()
    admin.sys.enable_secrets_engine("transit", path="icecrypt/transit2")
    admin.secrets.transit.create_key("k2", mount_point="icecrypt/transit2")
    properties = _properties(openbao_server, **{"vault.transit-mount": "/icecrypt/transit2/"})
    with create_kms_client(properties) as kms:
        assert kms.unwrap_key(kms.wrap_key(SECRET_KEY, "k2"), "k2") == SECRET_KEY


# --- key rotation --------------------------------------------------------------------------


def test_rotation_keeps_old_wrapped_keys(openbao_server, vault_kms):
    name = "icecrypt-rotating"
    openbao_server.create_transit_key(name)
    transit = openbao_server.hvac_client().secrets.transit
    old = vault_kms.wrap_key(SECRET_KEY, name)
    transit.rotate_key(name)
    new = vault_kms.wrap_key(SECRET_KEY, name)
    assert old.startswith(b"vault:v1:") and new.startswith(b"vault:v2:")
    assert vault_kms.unwrap_key(old, name) == SECRET_KEY
    assert vault_kms.unwrap_key(new, name) == SECRET_KEY

    rewrapped = vault_kms.rewrap_key(old, name)
    assert rewrapped.startswith(b"vault:v2:")
    assert vault_kms.unwrap_key(rewrapped, name) == SECRET_KEY

    # Retiring version 1 makes its ciphertexts fail as refused by policy.
    transit.update_key_configuration(name, min_decryption_version=2)
    with pytest.raises(KmsAccessDeniedError, match="disallowed by policy"):
        vault_kms.unwrap_key(old, name)
    assert vault_kms.unwrap_key(rewrapped, name) == SECRET_KEY


# --- failures ------------------------------------------------------------------------------


def test_unknown_key(vault_kms, vault_key_names, assert_no_key_material):
    """Transit would create a missing key on encrypt; the server has upsert disabled."""
    with pytest.raises(KmsKeyNotFoundError) as wrap_error:
        vault_kms.wrap_key(SECRET_KEY, "icecrypt-no-such-key")
    assert "encryption key not found" in str(wrap_error.value)
    assert wrap_error.value.backend == "vault"
    wrapped = vault_kms.wrap_key(SECRET_KEY, vault_key_names["a"])
    with pytest.raises(KmsKeyNotFoundError) as unwrap_error:
        vault_kms.unwrap_key(wrapped, "icecrypt-no-such-key")
    assert_no_key_material(SECRET_KEY, wrap_error.value, unwrap_error.value)


@pytest.mark.parametrize("name", ["", "../sys/mounts", "a/b", "key?x=1", ".hidden", "name with space", "ключ"])
def test_invalid_key_names_never_reach_the_server(vault_kms, name):
    with pytest.raises(KmsKeyNotFoundError, match="invalid transit key name"):
        vault_kms.wrap_key(SECRET_KEY, name)


def test_wrong_key(vault_kms, vault_key_names, assert_no_key_material):
    wrapped = vault_kms.wrap_key(SECRET_KEY, vault_key_names["a"])
    with pytest.raises(KmsInvalidWrappedKeyError, match="message authentication failed") as error:
        vault_kms.unwrap_key(wrapped, vault_key_names["b"])
    assert_no_key_material(SECRET_KEY, error.value)


def _tamper(wrapped: bytes, how: str) -> bytes:
    if how == "body":  # change one base64 character of the ciphertext body
        index = len(b"vault:v1:") + 5
        return wrapped[:index] + (b"A" if wrapped[index:index + 1] != b"A" else b"B") + wrapped[index + 1:]
    if how == "truncated":
        return wrapped[:-6]
    if how == "version":
        return wrapped.replace(b"vault:v1:", b"vault:v9:", 1)
    if how == "base64":
        return wrapped[:-4] + b"!!!!"
    if how == "prefix":
        return wrapped[len(b"vault:v1:"):]
    if how == "binary":
        return b"\xff" + wrapped
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["body", "truncated", "version", "base64", "prefix", "binary"])
def test_tampered_wrapped_key(vault_kms, vault_key_names, how, assert_no_key_material):
    wrapped = vault_kms.wrap_key(SECRET_KEY, vault_key_names["a"])
    with pytest.raises(KmsInvalidWrappedKeyError) as error:
        vault_kms.unwrap_key(_tamper(wrapped, how), vault_key_names["a"])
    assert_no_key_material(SECRET_KEY, error.value)


def test_permission_denied(openbao_server, vault_key_names, assert_no_key_material):
    admin = openbao_server.hvac_client()
    name_a, name_b = vault_key_names["a"], vault_key_names["b"]
    admin.sys.create_or_update_policy(
        "icecrypt-wrap-only", f'path "transit/encrypt/{name_a}" {{ capabilities = ["update"] }}'
    )
    token = admin.auth.token.create(policies=["icecrypt-wrap-only"], ttl="10m")["auth"]["client_token"]
    with create_kms_client(_properties(openbao_server, **{"vault.token": token})) as kms:
        wrapped = kms.wrap_key(SECRET_KEY, name_a)
        with pytest.raises(KmsAccessDeniedError, match="permission denied") as unwrap_error:
            kms.unwrap_key(wrapped, name_a)
        with pytest.raises(KmsAccessDeniedError):
            kms.wrap_key(SECRET_KEY, name_b)
    with create_kms_client(_properties(openbao_server, **{"vault.token": "icecrypt-bogus-token"})) as kms:
        with pytest.raises(KmsAccessDeniedError) as bad_token_error:
            kms.wrap_key(SECRET_KEY, name_a)
    assert_no_key_material(SECRET_KEY, unwrap_error.value, bad_token_error.value)


def test_server_not_listening_is_unavailable(assert_no_key_material):
    """Default timeouts and retries: a refused connection fails in well under a second."""
    from servers import closed_port

    properties = {
        "encryption.kms-type": "vault",
        "vault.address": f"http://127.0.0.1:{closed_port()}",
        "vault.token": "icecrypt-unused",
        "vault.allow-insecure-transport": "true",
    }
    with create_kms_client(properties) as kms:
        with pytest.raises(KmsUnavailableError, match="ConnectionError") as error:
            kms.wrap_key(SECRET_KEY, "icecrypt-a")
    assert_no_key_material(SECRET_KEY, error.value)


def test_stopped_server_is_unavailable():
    """A second OpenBao server, stopped after wrapping: unwrapping reports it unavailable."""
    from servers.openbao import openbao_server

    with openbao_server() as second:
        second.create_transit_key("icecrypt-short-lived")
        kms = create_kms_client(_properties(second, **{"vault.max-attempts": "2"}))
        wrapped = kms.wrap_key(SECRET_KEY, "icecrypt-short-lived")
    with kms, pytest.raises(KmsUnavailableError):
        kms.unwrap_key(wrapped, "icecrypt-short-lived")


def test_hung_server_times_out_as_unavailable(openbao_server):
    from servers import silent_listener

    with silent_listener() as port:
        properties = _properties(
            openbao_server,
            **{"vault.address": f"http://127.0.0.1:{port}", "vault.read-timeout-ms": "300"},
        )
        with create_kms_client(properties) as kms, pytest.raises(KmsUnavailableError, match="Timeout"):
            kms.wrap_key(SECRET_KEY, "icecrypt-a")


def test_no_key_material_in_reprs(openbao_server, vault_kms, vault_key_names, assert_no_key_material):
    wrapped = vault_kms.wrap_key(SECRET_KEY, vault_key_names["a"])
    assert_no_key_material(SECRET_KEY, vault_kms, wrapped)
    assert openbao_server.token not in repr(vault_kms)
    assert openbao_server.token not in repr(openbao_server)


@pytest.mark.parametrize(
    "overrides",
    [
        {"vault.read-timeout-ms": "later"},
        {"vault.max-attempts": "0"},
        {"vault.tls-verify": "maybe"},
        {"vault.transit-mount": "../sys"},
        {"vault.client-cert": "/nonexistent/cert.pem"},
    ],
)
def test_invalid_properties(openbao_server, overrides):
    with pytest.raises(KmsError):
        create_kms_client(_properties(openbao_server, **overrides))


# --- concurrency ---------------------------------------------------------------------------


def test_concurrent_wrap_unwrap(vault_kms, vault_key_names):
    threads, rounds = 16, 8
    barrier = threading.Barrier(threads)

    def work(index: int) -> int:
        barrier.wait()
        done = 0
        for round_ in range(rounds):
            key = os.urandom(16 + 8 * ((index + round_) % 3))
            name = vault_key_names["a" if (index + round_) % 2 else "b"]
            assert vault_kms.unwrap_key(vault_kms.wrap_key(key, name), name) == key
            done += 1
        return done

    with ThreadPoolExecutor(max_workers=threads) as pool:
        assert sum(pool.map(work, range(threads))) == threads * rounds

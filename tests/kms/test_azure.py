"""The azure KMS backend: the real azure-keyvault-keys client against a local Key Vault."""

from __future__ import annotations

import base64
import concurrent.futures
import os

import pytest

from icecrypt.errors import (
    KmsAccessDeniedError,
    KmsError,
    KmsInvalidWrappedKeyError,
    KmsKeyNotFoundError,
    KmsUnavailableError,
)
from icecrypt.kms import create_kms_client
from icecrypt.kms.azure import AzureKms, StaticTokenCredential

pytest.importorskip("azure.keyvault.keys")

from servers import free_port  # noqa: E402
from servers.azure import KEYS  # noqa: E402

pytestmark = pytest.mark.servers

KEY_A = "key-a"  # RSA-2048
KEY_B = "key-b"  # RSA-3072


@pytest.fixture(scope="module")
def kms(azure_keyvault_endpoint):
    client = create_kms_client(azure_keyvault_endpoint.kms_properties())
    yield client
    client.close()


def _delta(before: dict, after: dict) -> dict:
    return {
        k: after.get(k, 0) - before.get(k, 0) for k in set(before) | set(after) if after.get(k, 0) != before.get(k, 0)
    }


def test_create_kms_client_selects_azure(kms):
    assert isinstance(kms, AzureKms)
    assert kms.kms_type == "azure"
    assert "RSA-OAEP-256" in repr(kms)  # Java's default algorithm


@pytest.mark.parametrize("size", [16, 24, 32])
@pytest.mark.parametrize("key_name", [KEY_A, KEY_B])
def test_round_trip(kms, azure_keyvault_endpoint, key_name, size):
    key = os.urandom(size)
    before = azure_keyvault_endpoint.stats()
    wrapped = kms.wrap_key(key, key_name)
    # Raw RSA-OAEP output, one modulus long, as Java's WrapResult.getEncryptedKey().
    assert len(wrapped) == KEYS[key_name] // 8
    assert kms.unwrap_key(wrapped, key_name) == key
    # The SDK wrapped locally with the public key it fetched; the vault's private key
    # did the unwrap.
    delta = _delta(before, azure_keyvault_endpoint.stats())
    assert delta.get("unwrapkey") == 1
    assert delta.get("get", 0) >= 1


def test_remote_wrap_without_get_permission(azure_keyvault_endpoint):
    # Without keys/get the SDK cannot fetch the public key and must ask the vault to wrap.
    properties = azure_keyvault_endpoint.kms_properties(**{"adls.token": azure_keyvault_endpoint.no_get_token})
    key = os.urandom(32)
    before = azure_keyvault_endpoint.stats()
    with create_kms_client(properties) as kms:
        assert kms.unwrap_key(kms.wrap_key(key, KEY_A), KEY_A) == key
    delta = _delta(before, azure_keyvault_endpoint.stats())
    assert delta.get("wrapkey") == 1 and delta.get("unwrapkey") == 1


@pytest.mark.parametrize("algorithm", ["RSA-OAEP-256", "RSA-OAEP"])
def test_algorithms(azure_keyvault_endpoint, algorithm):
    properties = azure_keyvault_endpoint.kms_properties(**{"azure.keyvault.key-wrap-algorithm": algorithm})
    key = os.urandom(32)
    with create_kms_client(properties) as kms:
        wrapped = kms.wrap_key(key, KEY_A)
        assert kms.unwrap_key(wrapped, KEY_A) == key
    # Wrapped with one OAEP hash, unwrapped assuming the other: the vault refuses.
    other = "RSA-OAEP" if algorithm == "RSA-OAEP-256" else "RSA-OAEP-256"
    properties["azure.keyvault.key-wrap-algorithm"] = other
    with create_kms_client(properties) as kms, pytest.raises(KmsInvalidWrappedKeyError):
        kms.unwrap_key(wrapped, KEY_A)


def test_key_id_forms(kms, azure_keyvault_endpoint):
    """A name, ``name/version``, and full key ids with and without version all work."""
    full_id = azure_keyvault_endpoint.key_ids()[KEY_B]
    version = full_id.rsplit("/", 1)[1]
    forms = [KEY_B, f"{KEY_B}/{version}", full_id, full_id.rsplit("/", 1)[0]]
    key = os.urandom(32)
    for wrap_form in forms:
        wrapped = kms.wrap_key(key, wrap_form)
        for unwrap_form in forms:
            assert kms.unwrap_key(wrapped, unwrap_form) == key


def test_full_key_id_without_vault_url(azure_keyvault_endpoint):
    properties = azure_keyvault_endpoint.kms_properties()
    del properties["azure.keyvault.url"]
    key = os.urandom(24)
    full_id = azure_keyvault_endpoint.key_ids()[KEY_A]
    with create_kms_client(properties) as kms:  # no vault configured: no full key id either
        with pytest.raises(KmsKeyNotFoundError, match="azure.keyvault.allowed-vault-urls"):
            kms.wrap_key(key, full_id)
    properties["azure.keyvault.allowed-vault-urls"] = azure_keyvault_endpoint.vault_url
    with create_kms_client(properties) as kms:
        assert kms.unwrap_key(kms.wrap_key(key, full_id), full_id) == key
        with pytest.raises(KmsError, match="azure.keyvault.url"):
            kms.wrap_key(key, KEY_A)


def test_unknown_key(kms, azure_keyvault_endpoint):
    with pytest.raises(KmsKeyNotFoundError) as info:
        kms.wrap_key(os.urandom(32), "no-such-key")
    assert info.value.backend == "azure"
    with pytest.raises(KmsKeyNotFoundError):
        kms.unwrap_key(os.urandom(256), "no-such-key")
    with pytest.raises(KmsKeyNotFoundError):
        kms.unwrap_key(os.urandom(256), f"{KEY_A}/{'0' * 32}")  # unknown version


def test_wrapped_under_a_unwrapped_with_b(kms):
    wrapped = kms.wrap_key(os.urandom(32), KEY_A)
    with pytest.raises(KmsInvalidWrappedKeyError):
        kms.unwrap_key(wrapped, KEY_B)


@pytest.mark.parametrize("damage", ["flip-first", "flip-middle", "flip-last", "truncate", "empty"])
def test_tampered_wrapped_key(kms, damage):
    wrapped = bytearray(kms.wrap_key(os.urandom(32), KEY_A))
    if damage.startswith("flip"):
        index = {"flip-first": 0, "flip-middle": len(wrapped) // 2, "flip-last": -1}[damage]
        wrapped[index] ^= 0x01
    elif damage == "truncate":
        del wrapped[-1]
    else:
        wrapped = bytearray()
    with pytest.raises(KmsInvalidWrappedKeyError):
        kms.unwrap_key(bytes(wrapped), KEY_A)


def test_bad_arguments(kms):
    with pytest.raises(TypeError):
        kms.wrap_key("not bytes", KEY_A)
    with pytest.raises(KmsError, match="empty"):
        kms.wrap_key(b"", KEY_A)
    with pytest.raises(KmsKeyNotFoundError):
        kms.wrap_key(os.urandom(32), "")
    with pytest.raises(KmsKeyNotFoundError):
        kms.wrap_key(os.urandom(32), "https://127.0.0.1:1/secrets/not-a-key")
    with pytest.raises(KmsKeyNotFoundError):
        kms.wrap_key(os.urandom(32), "http://127.0.0.1:1/keys/plain-http")


def test_closed_client_refuses(azure_keyvault_endpoint):
    kms = create_kms_client(azure_keyvault_endpoint.kms_properties())
    kms.close()
    kms.close()  # idempotent
    with pytest.raises(KmsError, match="not initialized"):
        kms.wrap_key(os.urandom(32), KEY_A)


def test_permission_denied(azure_keyvault_endpoint):
    properties = azure_keyvault_endpoint.kms_properties(**{"adls.token": azure_keyvault_endpoint.denied_token})
    with create_kms_client(properties) as kms:
        with pytest.raises(KmsAccessDeniedError):
            kms.wrap_key(os.urandom(32), KEY_A)
        with pytest.raises(KmsAccessDeniedError):
            kms.unwrap_key(os.urandom(256), KEY_A)


def test_credentials_rejected(azure_keyvault_endpoint):
    properties = azure_keyvault_endpoint.kms_properties(**{"adls.token": "not-the-token"})
    before = azure_keyvault_endpoint.stats()
    with create_kms_client(properties) as kms, pytest.raises(KmsAccessDeniedError):
        kms.unwrap_key(os.urandom(256), KEY_A)
    assert _delta(before, azure_keyvault_endpoint.stats()).get("error:401", 0) >= 1


class FixedTokenProvider:
    """An ``adls.token-credential-provider`` (Java's AdlsTokenCredentialProvider shape)."""

    def initialize(self, properties):
        self.token = properties["token"]

    def credential(self):
        return StaticTokenCredential(self.token)


def test_token_credential_provider(azure_keyvault_endpoint):
    properties = azure_keyvault_endpoint.kms_properties()
    token = properties.pop("adls.token")
    properties["adls.token-credential-provider"] = f"{__name__}:FixedTokenProvider"
    properties["adls.token-credential-provider.token"] = token
    key = os.urandom(16)
    with create_kms_client(properties) as kms:
        assert kms.unwrap_key(kms.wrap_key(key, KEY_A), KEY_A) == key


@pytest.mark.timeout(30)
def test_tls_is_verified(azure_keyvault_endpoint):
    # Without the test CA the vault's certificate is untrusted: no request gets through.
    properties = azure_keyvault_endpoint.kms_properties(**{"azure.keyvault.max-attempts": "1"})
    del properties["azure.keyvault.ca-cert"]
    with create_kms_client(properties) as kms, pytest.raises(KmsUnavailableError):
        kms.wrap_key(os.urandom(32), KEY_A)


def test_challenge_resource_checked_by_default(azure_keyvault_endpoint):
    # The endpoint's challenge names vault.azure.net, which is not 127.0.0.1: the SDK's
    # check (on unless turned off) refuses to send a token there.
    properties = azure_keyvault_endpoint.kms_properties()
    del properties["azure.keyvault.verify-challenge-resource"]
    with create_kms_client(properties) as kms, pytest.raises(KmsError, match="challenge"):
        kms.unwrap_key(os.urandom(256), KEY_A)


@pytest.mark.timeout(30)
def test_endpoint_down(azure_keyvault_endpoint):
    properties = azure_keyvault_endpoint.kms_properties(
        **{"azure.keyvault.url": f"https://127.0.0.1:{free_port()}", "azure.keyvault.connect-timeout-ms": "1000"}
    )
    with create_kms_client(properties) as kms:
        with pytest.raises(KmsUnavailableError):
            kms.wrap_key(os.urandom(32), KEY_A)
        with pytest.raises(KmsUnavailableError):
            kms.unwrap_key(os.urandom(256), KEY_A)


def _leaks(exc: BaseException, secret: bytes) -> list[str]:
    """Renderings of ``secret`` found in the messages/reprs of ``exc`` and its causes."""
    forms = [
        secret.hex(),
        repr(secret),
        base64.b64encode(secret).decode(),
        base64.urlsafe_b64encode(secret).decode().rstrip("="),
    ]
    found = []
    while exc is not None:
        for text in (str(exc), repr(exc)):
            found += [form for form in forms if form in text]
        exc = exc.__cause__ or exc.__context__
    return found


def test_no_key_bytes_in_errors_or_reprs(kms, azure_keyvault_endpoint):
    key = os.urandom(32)
    failures = []
    for call in (
        lambda: kms.wrap_key(key, "no-such-key"),
        lambda: kms.unwrap_key(kms.wrap_key(key, KEY_A), KEY_B),
    ):
        with pytest.raises(KmsError) as info:
            call()
        failures.append(info.value)
    for exc in failures:
        assert _leaks(exc, key) == []
    assert azure_keyvault_endpoint.token not in repr(kms)
    assert azure_keyvault_endpoint.token not in repr(StaticTokenCredential(azure_keyvault_endpoint.token))


def test_eight_threads(kms, azure_keyvault_endpoint):
    full_id = azure_keyvault_endpoint.key_ids()[KEY_A]
    key_ids = [KEY_A, KEY_B, full_id]

    def work(worker: int) -> int:
        for i in range(6):
            key, key_id = os.urandom(16 + 8 * (i % 3)), key_ids[(worker + i) % 3]
            assert kms.unwrap_key(kms.wrap_key(key, key_id), key_id) == key
        return worker

    before = azure_keyvault_endpoint.stats()
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        assert sorted(pool.map(work, range(8))) == list(range(8))
    assert _delta(before, azure_keyvault_endpoint.stats()).get("unwrapkey") == 48


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"azure.keyvault.key-wrap-algorithm": "ROT13"}, "known"),
        ({"azure.keyvault.ca-cert": "/nonexistent/ca.pem"}, "no such file"),
        ({"azure.keyvault.read-timeout-ms": "soon"}, "integer"),
        ({"azure.keyvault.max-attempts": "0"}, "at least 1"),
        ({"azure.keyvault.verify-challenge-resource": "maybe"}, "true or false"),
        ({"adls.token-credential-provider": "no.such.module.Provider"}, "cannot load"),
    ],
)
def test_invalid_properties(azure_keyvault_endpoint, overrides, match):
    with pytest.raises(KmsError, match=match):
        create_kms_client(azure_keyvault_endpoint.kms_properties(**overrides))

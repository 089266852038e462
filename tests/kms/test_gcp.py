"""The gcp KMS backend: the real google-cloud-kms client against a local Cloud KMS endpoint."""

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
from icecrypt.kms.gcp import GcpKms, crc32c

pytest.importorskip("google.cloud.kms_v1")

from servers import free_port  # noqa: E402
from servers.gcp import CORRUPT_KEY_NAME  # noqa: E402

KEY_A = "key-a"
KEY_B = "key-b"


def test_crc32c_known_values():
    # RFC 3720 (iSCSI) B.4 test vectors, and the classic check value.
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(bytes(32)) == 0x8A9136AA
    assert crc32c(b"\xff" * 32) == 0x62A8AB43
    assert crc32c(bytes(range(32))) == 0x46DD794E
    assert crc32c(b"") == 0


pytestmark = pytest.mark.servers


@pytest.fixture(scope="module")
def kms(gcp_kms_endpoint):
    client = create_kms_client(gcp_kms_endpoint.kms_properties())
    yield client
    client.close()


def _delta(before: dict, after: dict) -> dict:
    return {
        k: after.get(k, 0) - before.get(k, 0) for k in set(before) | set(after) if after.get(k, 0) != before.get(k, 0)
    }


def test_create_kms_client_selects_gcp(kms):
    assert isinstance(kms, GcpKms)
    assert kms.kms_type == "gcp"


@pytest.mark.parametrize("size", [16, 24, 32])
def test_round_trip(kms, gcp_kms_endpoint, size):
    key = os.urandom(size)
    key_id = gcp_kms_endpoint.key_id(KEY_A)
    before = gcp_kms_endpoint.stats()
    wrapped = kms.wrap_key(key, key_id)
    assert isinstance(wrapped, bytes)
    assert key not in wrapped
    assert kms.unwrap_key(wrapped, key_id) == key
    # The endpoint really did the work: one Encrypt and one Decrypt arrived.
    assert _delta(before, gcp_kms_endpoint.stats()) == {"encrypt": 1, "decrypt": 1}


def test_wraps_are_randomized(kms, gcp_kms_endpoint):
    key, key_id = os.urandom(32), gcp_kms_endpoint.key_id(KEY_A)
    first, second = kms.wrap_key(key, key_id), kms.wrap_key(key, key_id)
    assert first != second
    assert kms.unwrap_key(first, key_id) == kms.unwrap_key(second, key_id) == key


def test_accepts_buffers(kms, gcp_kms_endpoint):
    key, key_id = os.urandom(32), gcp_kms_endpoint.key_id(KEY_B)
    wrapped = kms.wrap_key(bytearray(key), key_id)
    assert kms.unwrap_key(memoryview(wrapped), key_id) == key


def test_unknown_key(kms, gcp_kms_endpoint):
    with pytest.raises(KmsKeyNotFoundError) as info:
        kms.wrap_key(os.urandom(32), gcp_kms_endpoint.key_id("no-such-key"))
    assert info.value.backend == "gcp"
    with pytest.raises(KmsKeyNotFoundError):
        kms.unwrap_key(os.urandom(60), gcp_kms_endpoint.key_id("no-such-key"))


def test_wrapped_under_a_unwrapped_with_b(kms, gcp_kms_endpoint):
    wrapped = kms.wrap_key(os.urandom(32), gcp_kms_endpoint.key_id(KEY_A))
    with pytest.raises(KmsInvalidWrappedKeyError):
        kms.unwrap_key(wrapped, gcp_kms_endpoint.key_id(KEY_B))


@pytest.mark.parametrize("damage", ["flip-first", "flip-middle", "flip-last", "truncate", "extend", "empty"])
def test_tampered_wrapped_key(kms, gcp_kms_endpoint, damage):
    key_id = gcp_kms_endpoint.key_id(KEY_A)
    wrapped = bytearray(kms.wrap_key(os.urandom(32), key_id))
    if damage.startswith("flip"):
        index = {"flip-first": 0, "flip-middle": len(wrapped) // 2, "flip-last": -1}[damage]
        wrapped[index] ^= 0x01
    elif damage == "truncate":
        del wrapped[-1]
    elif damage == "extend":
        wrapped += b"\x00"
    else:
        wrapped = bytearray()
    with pytest.raises(KmsInvalidWrappedKeyError):
        kms.unwrap_key(bytes(wrapped), key_id)


def test_response_checksums_are_verified(kms, gcp_kms_endpoint):
    # This key's responses carry a wrong CRC32C: the client must refuse them.
    key_id = gcp_kms_endpoint.key_id(CORRUPT_KEY_NAME)
    with pytest.raises(KmsError, match="CRC32C") as info:
        kms.wrap_key(os.urandom(32), key_id)
    assert type(info.value) is KmsError
    wrapped = gcp_kms_endpoint.raw_encrypt(CORRUPT_KEY_NAME, os.urandom(32))
    with pytest.raises(KmsError, match="CRC32C") as info:
        kms.unwrap_key(wrapped, key_id)
    assert type(info.value) is KmsError


def test_default_transport_is_grpc():
    # As in Java; constructing the client opens no connection.
    with create_kms_client({"encryption.kms-type": "gcp", "gcs.oauth2.token": "token"}) as kms:
        assert "grpc" in repr(kms) and "token" not in repr(kms).replace("transport", "")


def test_permission_denied(gcp_kms_endpoint):
    properties = gcp_kms_endpoint.kms_properties(**{"gcs.oauth2.token": gcp_kms_endpoint.denied_token})
    with create_kms_client(properties) as kms, pytest.raises(KmsAccessDeniedError):
        kms.wrap_key(os.urandom(32), gcp_kms_endpoint.key_id(KEY_A))


@pytest.mark.parametrize("credentials", ["wrong-token", "no-auth"])
def test_credentials_rejected(gcp_kms_endpoint, credentials):
    if credentials == "wrong-token":
        properties = gcp_kms_endpoint.kms_properties(**{"gcs.oauth2.token": "not-the-token"})
    else:
        properties = gcp_kms_endpoint.kms_properties()
        del properties["gcs.oauth2.token"]
        properties["gcs.no-auth"] = "true"
    before = gcp_kms_endpoint.stats()
    with create_kms_client(properties) as kms, pytest.raises(KmsAccessDeniedError):
        kms.unwrap_key(os.urandom(60), gcp_kms_endpoint.key_id(KEY_A))
    assert _delta(before, gcp_kms_endpoint.stats()).get("error:UNAUTHENTICATED", 0) >= 1


@pytest.mark.timeout(30)
def test_endpoint_down():
    properties = {
        "encryption.kms-type": "gcp",
        "gcp.kms.endpoint": f"http://127.0.0.1:{free_port()}",  # nothing listens there
        "gcs.oauth2.token": "token",
        "gcp.kms.timeout-ms": "1500",
        "gcp.kms.allowed-key-rings": "projects/p",
        "gcp.kms.allow-insecure-transport": "true",
    }
    with create_kms_client(properties) as kms:
        with pytest.raises(KmsUnavailableError):
            kms.wrap_key(os.urandom(32), "projects/p/locations/l/keyRings/r/cryptoKeys/k")
        with pytest.raises(KmsUnavailableError):
            kms.unwrap_key(os.urandom(60), "projects/p/locations/l/keyRings/r/cryptoKeys/k")


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


def test_no_key_bytes_in_errors_or_reprs(kms, gcp_kms_endpoint):
    key = os.urandom(32)
    failures = []
    for call in (
        lambda: kms.wrap_key(key, gcp_kms_endpoint.key_id("no-such-key")),
        lambda: kms.unwrap_key(kms.wrap_key(key, gcp_kms_endpoint.key_id(KEY_A)), gcp_kms_endpoint.key_id(KEY_B)),
        lambda: kms.wrap_key(key, gcp_kms_endpoint.key_id(CORRUPT_KEY_NAME)),
    ):
        with pytest.raises(KmsError) as info:
            call()
        failures.append(info.value)
    for exc in failures:
        assert _leaks(exc, key) == []
    assert gcp_kms_endpoint.token not in repr(kms)


def test_eight_threads(kms, gcp_kms_endpoint):
    key_ids = [gcp_kms_endpoint.key_id(KEY_A), gcp_kms_endpoint.key_id(KEY_B)]

    def work(worker: int) -> int:
        for i in range(10):
            key, key_id = os.urandom(16 + 8 * (i % 3)), key_ids[(worker + i) % 2]
            assert kms.unwrap_key(kms.wrap_key(key, key_id), key_id) == key
        return worker

    before = gcp_kms_endpoint.stats()
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        assert sorted(pool.map(work, range(8))) == list(range(8))
    assert _delta(before, gcp_kms_endpoint.stats()) == {"encrypt": 80, "decrypt": 80}


def test_bad_arguments(kms, gcp_kms_endpoint):
    key_id = gcp_kms_endpoint.key_id(KEY_A)
    with pytest.raises(TypeError):
        kms.wrap_key("not bytes", key_id)
    with pytest.raises(KmsError, match="empty"):
        kms.wrap_key(b"", key_id)
    with pytest.raises(KmsKeyNotFoundError):
        kms.wrap_key(os.urandom(32), "")


def test_closed_client_refuses(gcp_kms_endpoint):
    kms = create_kms_client(gcp_kms_endpoint.kms_properties())
    kms.close()
    kms.close()  # idempotent
    with pytest.raises(KmsError, match="not initialized"):
        kms.wrap_key(os.urandom(32), gcp_kms_endpoint.key_id(KEY_A))


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"gcs.no-auth": "true"}, "must not configure"),  # with gcs.oauth2.token, as Java
        ({"gcp.kms.transport": "carrier-pigeon"}, "grpc"),
        ({"gcp.kms.transport": "grpc"}, "is a URL"),
        ({"gcp.kms.timeout-ms": "0"}, "at least 1"),
        ({"gcs.oauth2.token-expires-at": "tomorrow"}, "integer"),
        ({"gcs.no-auth": "maybe"}, "true or false"),
    ],
)
def test_invalid_properties(gcp_kms_endpoint, overrides, match):
    with pytest.raises(KmsError, match=match):
        create_kms_client(gcp_kms_endpoint.kms_properties(**overrides))

"""KmipKms against a real PyKMIP server (TLS 1.2 with client certificates on 127.0.0.1)."""

from __future__ import annotations

import os
import socket
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

pytest.importorskip("kmip")

from icecrypt.kms.kmip import IV_LENGTH, TAG_LENGTH, VERSION, KmipKms  # noqa: E402
from servers import HOST, free_port  # noqa: E402

pytestmark = [pytest.mark.servers, pytest.mark.timeout(30)]

#: a recognizable key: it must never show up in messages or reprs
SECRET_KEY = b"ICECRYPT-SECRET-KEY-BYTES-0123!!"


@pytest.fixture(scope="module")
def kms(kmip_server):
    """A client for the test identity, built through ``create_kms_client``."""
    with create_kms_client(kmip_server.properties()) as client:
        yield client


# --- round trips and selection -------------------------------------------------------------


def test_selected_by_kms_type(kms):
    assert isinstance(kms, KmipKms)
    assert kms.kms_type == "kmip"


@pytest.mark.parametrize("length", [16, 24, 32])
@pytest.mark.parametrize("master", ["a", "b"])
def test_round_trip(kms, kmip_keys, master, length):
    key = os.urandom(length)
    key_id = getattr(kmip_keys, master)
    wrapped = kms.wrap_key(key, key_id)
    assert len(wrapped) == 1 + IV_LENGTH + length + TAG_LENGTH
    assert wrapped[0] == VERSION
    assert key not in wrapped
    assert kms.unwrap_key(wrapped, key_id) == key


def test_wrapping_is_randomized(kms, kmip_keys):
    assert kms.wrap_key(SECRET_KEY, kmip_keys.a) != kms.wrap_key(SECRET_KEY, kmip_keys.a)


def test_accepts_buffers(kms, kmip_keys):
    wrapped = kms.wrap_key(bytearray(SECRET_KEY), kmip_keys.a)
    assert kms.unwrap_key(memoryview(wrapped), kmip_keys.a) == SECRET_KEY


def test_a_second_client_unwraps(kmip_server, kms, kmip_keys):
    wrapped = kms.wrap_key(SECRET_KEY, kmip_keys.a)
    with create_kms_client(kmip_server.properties()) as other:
        assert other.unwrap_key(wrapped, kmip_keys.a) == SECRET_KEY


def test_close_is_idempotent_and_reconnects(kmip_server, kmip_keys):
    client = create_kms_client(kmip_server.properties())
    wrapped = client.wrap_key(SECRET_KEY, kmip_keys.a)
    client.close()
    client.close()
    assert client.unwrap_key(wrapped, kmip_keys.a) == SECRET_KEY
    client.close()


def test_concurrent_threads(kms, kmip_keys):
    def work(i: int) -> None:
        for j in range(5):
            key = os.urandom(16 + 8 * (j % 3))
            key_id = kmip_keys.a if (i + j) % 2 else kmip_keys.b
            assert kms.unwrap_key(kms.wrap_key(key, key_id), key_id) == key

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(work, range(8)))


# --- failures --------------------------------------------------------------------------------


@pytest.mark.parametrize("key_id", ["999999", "no-such-key"])
def test_unknown_key_id(kms, kmip_keys, key_id):
    with pytest.raises(KmsKeyNotFoundError) as info:
        kms.wrap_key(SECRET_KEY, key_id)
    assert info.value.backend == "kmip"
    wrapped = kms.wrap_key(SECRET_KEY, kmip_keys.a)
    with pytest.raises(KmsKeyNotFoundError):
        kms.unwrap_key(wrapped, key_id)


def test_wrong_master_key(kms, kmip_keys):
    wrapped = kms.wrap_key(SECRET_KEY, kmip_keys.a)
    with pytest.raises(KmsInvalidWrappedKeyError):
        kms.unwrap_key(wrapped, kmip_keys.b)


def _flip(blob: bytes, index: int) -> bytes:
    return blob[:index] + bytes([blob[index] ^ 0x01]) + blob[index + 1 :]


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda b: _flip(b, 0), id="version"),
        pytest.param(lambda b: _flip(b, 1), id="iv-first"),
        pytest.param(lambda b: _flip(b, IV_LENGTH), id="iv-last"),
        pytest.param(lambda b: _flip(b, 1 + IV_LENGTH), id="ciphertext-first"),
        pytest.param(lambda b: _flip(b, len(b) - TAG_LENGTH - 1), id="ciphertext-last"),
        pytest.param(lambda b: _flip(b, len(b) - TAG_LENGTH), id="tag-first"),
        pytest.param(lambda b: _flip(b, len(b) - 1), id="tag-last"),
        pytest.param(lambda b: b[:-1], id="truncated"),
        pytest.param(lambda b: b + b"\x00", id="extended"),
        pytest.param(lambda b: b[: 1 + IV_LENGTH + TAG_LENGTH], id="no-ciphertext"),
        pytest.param(lambda b: b"", id="empty"),
    ],
)
def test_tampered_blob(kms, kmip_keys, damage):
    wrapped = kms.wrap_key(SECRET_KEY, kmip_keys.a)
    with pytest.raises(KmsInvalidWrappedKeyError):
        kms.unwrap_key(damage(wrapped), kmip_keys.a)


def test_other_identity_is_denied(kmip_server, kms, kmip_keys):
    """PyKMIP's default policy lets only the key's owner (certificate CN) use it."""
    wrapped = kms.wrap_key(SECRET_KEY, kmip_keys.a)
    with create_kms_client(kmip_server.properties(kmip_server.pki.other_client)) as other:
        with pytest.raises(KmsAccessDeniedError):
            other.unwrap_key(wrapped, kmip_keys.a)
        with pytest.raises(KmsAccessDeniedError):
            other.wrap_key(SECRET_KEY, kmip_keys.a)


@pytest.mark.parametrize("identity", ["no_client_auth", "foreign"])
def test_client_certificate_refused(kmip_server, kmip_keys, identity):
    """A certificate without clientAuth usage, or from a CA the server does not trust."""
    props = kmip_server.properties(getattr(kmip_server.pki, identity))
    with create_kms_client(props) as client:
        with pytest.raises(KmsAccessDeniedError):
            client.wrap_key(SECRET_KEY, kmip_keys.a)


def test_untrusted_server_certificate(kmip_server, kmip_keys):
    """The client checks the server certificate against kmip.ca-certs."""
    props = kmip_server.properties(**{"kmip.ca-certs": str(kmip_server.pki.foreign.certfile)})
    with create_kms_client(props) as client:
        with pytest.raises(KmsUnavailableError):
            client.wrap_key(SECRET_KEY, kmip_keys.a)


def test_server_hostname_is_verified(kmip_server, kmip_keys):
    props = kmip_server.properties(**{"kmip.server-hostname": "kms.example.com"})
    with create_kms_client(props) as client:
        with pytest.raises(KmsUnavailableError):
            client.wrap_key(SECRET_KEY, kmip_keys.a)


def test_server_down(kmip_server, kmip_keys):
    props = kmip_server.properties(**{"kmip.port": str(free_port()), "kmip.timeout": "2"})
    with create_kms_client(props) as client:
        with pytest.raises(KmsUnavailableError):
            client.wrap_key(SECRET_KEY, kmip_keys.a)


def test_silent_server_times_out(kmip_server, kmip_keys):
    """A peer that accepts TCP but never answers the TLS handshake: bounded by kmip.timeout."""
    with socket.socket() as listener:
        listener.bind((HOST, 0))
        listener.listen(4)
        props = kmip_server.properties(**{"kmip.port": str(listener.getsockname()[1]), "kmip.timeout": "0.5"})
        with create_kms_client(props) as client:
            with pytest.raises(KmsUnavailableError):
                client.wrap_key(SECRET_KEY, kmip_keys.a)


@pytest.mark.parametrize(
    "missing, message",
    [("kmip.host", "kmip.host"), ("kmip.certfile", "kmip.certfile")],
)
def test_missing_properties(kmip_server, missing, message):
    props = kmip_server.properties()
    del props[missing]
    with pytest.raises(KmsError, match=message):
        create_kms_client(props)


def test_bad_tls_files(kmip_server, tmp_path):
    with pytest.raises(KmsError):
        create_kms_client(kmip_server.properties(**{"kmip.ca-certs": str(tmp_path / "missing.pem")}))


def test_no_key_material_in_errors_or_repr(kms, kmip_keys, kmip_server, assert_no_key_material):
    wrapped = kms.wrap_key(SECRET_KEY, kmip_keys.a)
    errors = []
    for call in (
        lambda: kms.wrap_key(SECRET_KEY, "999999"),
        lambda: kms.unwrap_key(wrapped, kmip_keys.b),
        lambda: kms.unwrap_key(_flip(wrapped, len(wrapped) - 1), kmip_keys.a),
    ):
        with pytest.raises(KmsError) as info:
            call()
        errors.append(info.value)
    with create_kms_client(kmip_server.properties(**{"kmip.port": str(free_port())})) as down:
        with pytest.raises(KmsError) as info:
            down.wrap_key(SECRET_KEY, kmip_keys.a)
        errors.append(info.value)
    assert_no_key_material(SECRET_KEY, kms, *errors)
    assert "kmip" in repr(kms)

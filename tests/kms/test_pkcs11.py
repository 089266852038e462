"""Pkcs11Kms against a real SoftHSM2 token (a private token store in a temporary directory)."""

from __future__ import annotations

import os
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

pkcs11 = pytest.importorskip("pkcs11")

from icecrypt.kms.pkcs11 import IV_LENGTH, TAG_LENGTH, VERSION, Pkcs11Kms  # noqa: E402

pytestmark = [pytest.mark.servers, pytest.mark.timeout(30)]

#: a recognizable key: it must never show up in messages or reprs
SECRET_KEY = b"ICECRYPT-SECRET-KEY-BYTES-0123!!"


@pytest.fixture(scope="module")
def kms(softhsm_token, pkcs11_keys):
    """A client built through ``create_kms_client``."""
    with create_kms_client(softhsm_token.properties()) as client:
        yield client


# --- round trips and selection -------------------------------------------------------------


def test_selected_by_kms_type(kms):
    assert isinstance(kms, Pkcs11Kms)
    assert kms.kms_type == "pkcs11"


@pytest.mark.parametrize("length", [16, 24, 32])
@pytest.mark.parametrize("master", ["a", "b"])
def test_round_trip(kms, pkcs11_keys, master, length):
    key = os.urandom(length)
    label = getattr(pkcs11_keys, master)
    wrapped = kms.wrap_key(key, label)
    assert len(wrapped) == 1 + IV_LENGTH + length + TAG_LENGTH
    assert wrapped[0] == VERSION
    assert key not in wrapped
    assert kms.unwrap_key(wrapped, label) == key


def test_wrapping_is_randomized(kms, pkcs11_keys):
    assert kms.wrap_key(SECRET_KEY, pkcs11_keys.a) != kms.wrap_key(SECRET_KEY, pkcs11_keys.a)


def test_pin_from_environment(softhsm_token, pkcs11_keys, monkeypatch):
    props = softhsm_token.properties(**{"pkcs11.pin-env": "ICECRYPT_TEST_PIN"})
    del props["pkcs11.pin"]
    monkeypatch.setenv("ICECRYPT_TEST_PIN", softhsm_token.pin)
    with create_kms_client(props) as client:
        assert client.unwrap_key(client.wrap_key(SECRET_KEY, pkcs11_keys.a), pkcs11_keys.a) == SECRET_KEY


def test_token_by_slot(softhsm_token, pkcs11_keys, kms):
    slot = pkcs11.lib(str(softhsm_token.module)).get_token(token_label=softhsm_token.label).slot.slot_id
    props = softhsm_token.properties(**{"pkcs11.slot": str(slot)})
    del props["pkcs11.token-label"]
    with create_kms_client(props) as client:
        assert client.unwrap_key(kms.wrap_key(SECRET_KEY, pkcs11_keys.a), pkcs11_keys.a) == SECRET_KEY


def test_clients_share_the_login(softhsm_token, pkcs11_keys, kms):
    """Closing one client (the token's login is per process) leaves the others working."""
    wrapped = kms.wrap_key(SECRET_KEY, pkcs11_keys.a)
    other = create_kms_client(softhsm_token.properties())
    assert other.unwrap_key(wrapped, pkcs11_keys.a) == SECRET_KEY
    other.close()
    other.close()
    assert kms.unwrap_key(wrapped, pkcs11_keys.a) == SECRET_KEY
    assert other.unwrap_key(wrapped, pkcs11_keys.a) == SECRET_KEY  # logs in again
    other.close()


def test_concurrent_threads(kms, pkcs11_keys):
    def work(i: int) -> None:
        for j in range(20):
            key = os.urandom(16 + 8 * (j % 3))
            label = pkcs11_keys.a if (i + j) % 2 else pkcs11_keys.b
            assert kms.unwrap_key(kms.wrap_key(key, label), label) == key

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(work, range(8)))


# --- the master key ---------------------------------------------------------------------------


def test_master_key_cannot_be_read_out(softhsm_token, pkcs11_keys):
    """The generated key is sensitive and non-extractable: no C_GetAttributeValue of its
    value, no C_WrapKey of it, and the flags cannot be changed."""
    from pkcs11 import Attribute, KeyType, Mechanism, ObjectClass

    token = pkcs11.lib(str(softhsm_token.module)).get_token(token_label=softhsm_token.label)
    # The session needs no PIN: the session-scoped client keeps the token logged in.
    with token.open(rw=True) as session:
        key = session.get_key(object_class=ObjectClass.SECRET_KEY, key_type=KeyType.AES, label=pkcs11_keys.a)
        assert key[Attribute.SENSITIVE] and key[Attribute.ALWAYS_SENSITIVE]
        assert not key[Attribute.EXTRACTABLE] and key[Attribute.NEVER_EXTRACTABLE]
        assert key[Attribute.ENCRYPT] and key[Attribute.DECRYPT]
        assert not key[Attribute.WRAP] and not key[Attribute.UNWRAP]
        with pytest.raises(pkcs11.exceptions.AttributeSensitive):
            key[Attribute.VALUE]
        wrapper = session.generate_key(
            KeyType.AES, 256, label="icecrypt-test-wrapper", template={Attribute.WRAP: True}
        )
        with pytest.raises(pkcs11.exceptions.PKCS11Error):
            wrapper.wrap_key(key, mechanism=Mechanism.AES_KEY_WRAP)
        with pytest.raises(pkcs11.exceptions.PKCS11Error):
            key[Attribute.EXTRACTABLE] = True
        assert not key[Attribute.EXTRACTABLE]


def test_generate_master_key_refuses_existing_label(kms, pkcs11_keys):
    with pytest.raises(KmsError, match="already exists"):
        kms.generate_master_key(pkcs11_keys.a)


@pytest.mark.parametrize("length", [0, 8, 64])
def test_generate_master_key_lengths(kms, length):
    with pytest.raises(ValueError):
        kms.generate_master_key("icecrypt-bad-length", length)


# --- failures --------------------------------------------------------------------------------


def test_unknown_label(kms, pkcs11_keys):
    with pytest.raises(KmsKeyNotFoundError) as info:
        kms.wrap_key(SECRET_KEY, "no-such-label")
    assert info.value.backend == "pkcs11"
    wrapped = kms.wrap_key(SECRET_KEY, pkcs11_keys.a)
    with pytest.raises(KmsKeyNotFoundError):
        kms.unwrap_key(wrapped, "no-such-label")


def test_wrong_master_key(kms, pkcs11_keys):
    wrapped = kms.wrap_key(SECRET_KEY, pkcs11_keys.a)
    with pytest.raises(KmsInvalidWrappedKeyError):
        kms.unwrap_key(wrapped, pkcs11_keys.b)


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
def test_tampered_blob(kms, pkcs11_keys, damage):
    wrapped = kms.wrap_key(SECRET_KEY, pkcs11_keys.a)
    with pytest.raises(KmsInvalidWrappedKeyError):
        kms.unwrap_key(damage(wrapped), pkcs11_keys.a)


def test_wrong_pin(softhsm_token_pair, pkcs11_keys):
    """A real C_Login failure on a token nobody is logged in to, and a PIN that differs from
    the one this process logged in with."""
    main, spare = softhsm_token_pair
    with pytest.raises(KmsAccessDeniedError):
        create_kms_client(spare.properties(**{"pkcs11.pin": "0000"}))
    with pytest.raises(KmsAccessDeniedError):
        create_kms_client(main.properties(**{"pkcs11.pin": "0000"}))


def test_missing_module(softhsm_token, tmp_path):
    with pytest.raises(KmsUnavailableError):
        create_kms_client(softhsm_token.properties(**{"pkcs11.module": str(tmp_path / "libmissing.so")}))


def test_unknown_token(softhsm_token):
    with pytest.raises(KmsUnavailableError):
        create_kms_client(softhsm_token.properties(**{"pkcs11.token-label": "no-such-token"}))


def test_missing_configuration(softhsm_token, monkeypatch):
    monkeypatch.delenv("ICECRYPT_PKCS11_PIN", raising=False)
    for missing in ("pkcs11.module", "pkcs11.pin"):
        props = softhsm_token.properties()
        del props[missing]
        with pytest.raises(KmsError, match=missing if missing != "pkcs11.pin" else "PIN"):
            create_kms_client(props)


def test_no_key_material_in_errors_or_repr(kms, pkcs11_keys, softhsm_token, assert_no_key_material):
    wrapped = kms.wrap_key(SECRET_KEY, pkcs11_keys.a)
    errors = []
    for call in (
        lambda: kms.wrap_key(SECRET_KEY, "no-such-label"),
        lambda: kms.unwrap_key(wrapped, pkcs11_keys.b),
        lambda: kms.unwrap_key(_flip(wrapped, len(wrapped) - 1), pkcs11_keys.a),
        lambda: create_kms_client(softhsm_token.properties(**{"pkcs11.pin": "0000"})),
    ):
        with pytest.raises(KmsError) as info:
            call()
        errors.append(info.value)
    assert_no_key_material(SECRET_KEY, kms, *errors)
    for obj in (kms, *errors):
        assert softhsm_token.pin not in repr(obj) and softhsm_token.pin not in str(obj)

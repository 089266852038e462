"""AwsKms against a real moto server (AWS KMS API over HTTP on 127.0.0.1).

moto differs from AWS on a few errors (FIELD-NOTES.md, "Local key servers"): unwrapping
with another existing key gives AccessDeniedException (AWS: IncorrectKeyException), and a
disabled key still works.  Tests assert what both agree on; the AWS-only behaviour is in
strict xfails (they start passing, and so fail, if moto ever matches AWS), and the mapping
of the codes moto never sends is checked on botocore's own exception objects.
"""

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

boto3 = pytest.importorskip("boto3")

#: a recognizable key: it must never show up in messages or reprs
SECRET_KEY = b"ICECRYPT-SECRET-KEY-BYTES-0123!!"

pytestmark = [pytest.mark.servers, pytest.mark.timeout(30)]

UNKNOWN_KEY_ID = "00000000-1111-2222-3333-444444444444"


def _properties(moto_server, **overrides: str) -> dict[str, str]:
    properties = moto_server.kms_properties()
    properties.update(overrides)
    return properties


# --- round trips and selection -------------------------------------------------------------


@pytest.mark.parametrize("length", [16, 24, 32])
def test_round_trip(aws_kms, aws_key_ids, length):
    key = os.urandom(length)
    wrapped = aws_kms.wrap_key(key, aws_key_ids["a"])
    assert isinstance(wrapped, bytes)
    assert key not in wrapped
    assert aws_kms.unwrap_key(wrapped, aws_key_ids["a"]) == key


@pytest.mark.parametrize("which", ["arn_a", "alias_a"])
def test_key_arn_and_alias_are_key_ids(aws_kms, aws_key_ids, which):
    wrapped = aws_kms.wrap_key(SECRET_KEY, aws_key_ids[which])
    assert aws_kms.unwrap_key(wrapped, aws_key_ids["a"]) == SECRET_KEY


def test_wrapping_is_randomized(aws_kms, aws_key_ids):
    assert aws_kms.wrap_key(SECRET_KEY, aws_key_ids["a"]) != aws_kms.wrap_key(SECRET_KEY, aws_key_ids["a"])


def test_wrapped_key_is_the_kms_ciphertext_blob(aws_kms, aws_key_ids, moto_server):
    """As Java: the wrapped key is KMS's CiphertextBlob itself, so any KMS client unwraps it."""
    wrapped = aws_kms.wrap_key(SECRET_KEY, aws_key_ids["a"])
    plain = moto_server.boto3_client("kms").decrypt(
        KeyId=aws_key_ids["a"], CiphertextBlob=wrapped, EncryptionAlgorithm="SYMMETRIC_DEFAULT"
    )
    assert plain["Plaintext"] == SECRET_KEY


@pytest.mark.parametrize("kms_type", ["aws", "AWS", " Aws "])
def test_selected_by_kms_type(moto_server, aws_key_ids, kms_type):
    from icecrypt.kms.aws import AwsKms

    with create_kms_client(_properties(moto_server, **{"encryption.kms-type": kms_type})) as client:
        assert isinstance(client, AwsKms)
        assert client.encryption_algorithm_spec == "SYMMETRIC_DEFAULT"
        assert client.unwrap_key(client.wrap_key(SECRET_KEY, aws_key_ids["a"]), aws_key_ids["a"]) == SECRET_KEY


def test_selected_by_kms_impl(moto_server, aws_key_ids):
    properties = _properties(moto_server)
    del properties["encryption.kms-type"]
    properties["encryption.kms-impl"] = "icecrypt.kms.aws.AwsKms"
    with create_kms_client(properties) as client:
        assert type(client).__name__ == "AwsKms"


def test_injected_boto3_client(moto_server, aws_key_ids):
    from icecrypt.kms.aws import AwsKms

    boto_client = moto_server.boto3_client("kms")
    kms = AwsKms(client=boto_client)
    kms.initialize({"kms.encryption-algorithm-spec": "symmetric_default"})
    with kms:
        assert kms.unwrap_key(kms.wrap_key(SECRET_KEY, aws_key_ids["a"]), aws_key_ids["a"]) == SECRET_KEY
    # close() leaves a client it did not create usable.
    boto_client.describe_key(KeyId=aws_key_ids["a"])


def test_closed_client_raises(moto_server, aws_key_ids):
    kms = create_kms_client(_properties(moto_server))
    kms.close()
    kms.close()
    with pytest.raises(KmsError, match="not initialized"):
        kms.wrap_key(SECRET_KEY, aws_key_ids["a"])


def test_bytes_like_inputs(aws_kms, aws_key_ids):
    wrapped = aws_kms.wrap_key(bytearray(SECRET_KEY), aws_key_ids["a"])
    assert aws_kms.unwrap_key(memoryview(wrapped), aws_key_ids["a"]) == SECRET_KEY
    with pytest.raises(TypeError):
        aws_kms.wrap_key(SECRET_KEY.decode(), aws_key_ids["a"])


# --- failures ------------------------------------------------------------------------------


def test_unknown_key_id(aws_kms, aws_key_ids, assert_no_key_material):
    with pytest.raises(KmsKeyNotFoundError) as wrap_error:
        aws_kms.wrap_key(SECRET_KEY, UNKNOWN_KEY_ID)
    assert UNKNOWN_KEY_ID in str(wrap_error.value)
    assert "NotFoundException" in str(wrap_error.value)
    assert wrap_error.value.backend == "aws"
    wrapped = aws_kms.wrap_key(SECRET_KEY, aws_key_ids["a"])
    with pytest.raises(KmsKeyNotFoundError) as unwrap_error:
        aws_kms.unwrap_key(wrapped, UNKNOWN_KEY_ID)
    with pytest.raises(KmsKeyNotFoundError):
        aws_kms.wrap_key(SECRET_KEY, "alias/icecrypt-no-such-alias")
    with pytest.raises(KmsKeyNotFoundError):
        aws_kms.wrap_key(SECRET_KEY, "")
    assert_no_key_material(SECRET_KEY, wrap_error.value, unwrap_error.value)


def test_wrong_key_fails(aws_kms, aws_key_ids, assert_no_key_material):
    """Unwrapping with another existing key fails on AWS and moto alike (the class differs)."""
    wrapped = aws_kms.wrap_key(SECRET_KEY, aws_key_ids["a"])
    with pytest.raises(KmsError) as error:
        aws_kms.unwrap_key(wrapped, aws_key_ids["b"])
    assert isinstance(error.value, (KmsInvalidWrappedKeyError, KmsAccessDeniedError))
    assert_no_key_material(SECRET_KEY, error.value)


@pytest.mark.xfail(strict=True, raises=KmsAccessDeniedError, reason="moto: AccessDeniedException, AWS: IncorrectKeyException")
def test_wrong_key_is_invalid_wrapped_key_as_on_aws(aws_kms, aws_key_ids):
    wrapped = aws_kms.wrap_key(SECRET_KEY, aws_key_ids["a"])
    with pytest.raises(KmsInvalidWrappedKeyError):
        aws_kms.unwrap_key(wrapped, aws_key_ids["b"])


@pytest.mark.parametrize("where", ["last", "middle", "truncated", "garbage"])
def test_tampered_wrapped_key(aws_kms, aws_key_ids, where, assert_no_key_material):
    wrapped = bytearray(aws_kms.wrap_key(SECRET_KEY, aws_key_ids["a"]))
    if where == "last":
        wrapped[-1] ^= 0x01
    elif where == "middle":
        wrapped[len(wrapped) // 2 + 4] ^= 0x80
    elif where == "truncated":
        del wrapped[-8:]
    else:
        wrapped = bytearray(b"not a ciphertext blob")
    with pytest.raises(KmsInvalidWrappedKeyError) as error:
        aws_kms.unwrap_key(bytes(wrapped), aws_key_ids["a"])
    assert "InvalidCiphertextException" in str(error.value)
    assert_no_key_material(SECRET_KEY, error.value)


@pytest.mark.xfail(strict=True, reason="moto: a disabled key still encrypts and decrypts; AWS: DisabledException")
def test_disabled_key_is_access_denied_as_on_aws(moto_server, aws_kms):
    kms = moto_server.boto3_client("kms")
    key_id = kms.create_key(Description="icecrypt disabled key")["KeyMetadata"]["KeyId"]
    wrapped = aws_kms.wrap_key(SECRET_KEY, key_id)
    kms.disable_key(KeyId=key_id)
    with pytest.raises(KmsAccessDeniedError):
        aws_kms.unwrap_key(wrapped, key_id)


def test_server_not_listening_is_unavailable(assert_no_key_material):
    """Default timeouts and retries: a refused connection fails in seconds, as unavailable."""
    from servers import closed_port
    from servers.moto import ACCESS_KEY_ID, REGION, SECRET_ACCESS_KEY

    properties = {
        "encryption.kms-type": "aws",
        "kms.endpoint": f"http://127.0.0.1:{closed_port()}",
        "client.region": REGION,
        "kms.access-key-id": ACCESS_KEY_ID,
        "kms.secret-access-key": SECRET_ACCESS_KEY,
        "kms.allow-insecure-transport": "true",
    }
    with create_kms_client(properties) as kms:
        with pytest.raises(KmsUnavailableError) as error:
            kms.wrap_key(SECRET_KEY, UNKNOWN_KEY_ID)
    assert "127.0.0.1" in str(error.value)
    assert_no_key_material(SECRET_KEY, error.value)


def test_stopped_server_is_unavailable(aws_key_ids):
    """A second moto server, stopped after wrapping: unwrapping reports it unavailable."""
    from servers.moto import moto_server

    with moto_server() as second:
        key_id = second.boto3_client("kms").create_key()["KeyMetadata"]["KeyId"]
        kms = create_kms_client(_properties(second, **{"kms.max-attempts": "2"}))
        wrapped = kms.wrap_key(SECRET_KEY, key_id)
    with kms, pytest.raises(KmsUnavailableError):
        kms.unwrap_key(wrapped, key_id)


def test_hung_server_times_out_as_unavailable(moto_server):
    from servers import silent_listener

    with silent_listener() as port:
        properties = _properties(
            moto_server,
            **{"kms.endpoint": f"http://127.0.0.1:{port}", "kms.read-timeout-ms": "300", "kms.max-attempts": "1"},
        )
        with create_kms_client(properties) as kms, pytest.raises(KmsUnavailableError, match="timeout"):
            kms.wrap_key(SECRET_KEY, UNKNOWN_KEY_ID)


def test_no_key_material_in_reprs(aws_kms, aws_key_ids, assert_no_key_material):
    wrapped = aws_kms.wrap_key(SECRET_KEY, aws_key_ids["a"])
    assert_no_key_material(SECRET_KEY, aws_kms, wrapped)


# --- error mapping of codes moto does not send (botocore's real exception objects) ---------


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("NotFoundException", KmsKeyNotFoundError),
        ("AccessDeniedException", KmsAccessDeniedError),
        ("DisabledException", KmsAccessDeniedError),
        ("KMSInvalidStateException", KmsAccessDeniedError),
        ("UnrecognizedClientException", KmsAccessDeniedError),
        ("InvalidCiphertextException", KmsInvalidWrappedKeyError),
        ("IncorrectKeyException", KmsInvalidWrappedKeyError),
        ("KMSInternalException", KmsUnavailableError),
        ("ThrottlingException", KmsUnavailableError),
        ("InvalidKeyUsageException", KmsError),
    ],
)
def test_error_code_mapping(code, expected):
    from botocore.exceptions import ClientError

    from icecrypt.kms.aws import map_aws_error

    response = {"Error": {"Code": code, "Message": f"backend says {code}"}, "ResponseMetadata": {}}
    error = map_aws_error(ClientError(response, "Decrypt"), "Decrypt", "key-1")
    assert type(error) is expected
    assert f"backend says {code}" in str(error) and "'key-1'" in str(error)
    assert error.backend == "aws"


def test_connection_errors_are_unavailable():
    from botocore.exceptions import ConnectTimeoutError, EndpointConnectionError, ReadTimeoutError

    from icecrypt.kms.aws import map_aws_error

    for exc in (
        EndpointConnectionError(endpoint_url="http://127.0.0.1:1"),
        ConnectTimeoutError(endpoint_url="http://127.0.0.1:1"),
        ReadTimeoutError(endpoint_url="http://127.0.0.1:1"),
    ):
        assert type(map_aws_error(exc, "Encrypt", "k")) is KmsUnavailableError


def test_param_validation_text_is_not_kept():
    """botocore's ParamValidationError can quote parameter values (the plaintext key)."""
    from botocore.exceptions import ParamValidationError

    from icecrypt.kms.aws import map_aws_error

    exc = ParamValidationError(report=f"Invalid value {SECRET_KEY!r} for Plaintext")
    assert SECRET_KEY.decode() not in str(map_aws_error(exc, "Encrypt", "k"))


@pytest.mark.parametrize(
    "overrides",
    [
        {"kms.read-timeout-ms": "soon"},
        {"kms.max-attempts": "0"},
        {"kms.secret-access-key": ""},
    ],
)
def test_invalid_properties(moto_server, overrides):
    with pytest.raises(KmsError):
        create_kms_client(_properties(moto_server, **overrides))


# --- concurrency ---------------------------------------------------------------------------


def test_concurrent_wrap_unwrap(aws_kms, aws_key_ids):
    threads, rounds = 16, 8
    barrier = threading.Barrier(threads)

    def work(index: int) -> int:
        barrier.wait()
        done = 0
        for round_ in range(rounds):
            key = os.urandom(16 + 8 * ((index + round_) % 3))
            key_id = aws_key_ids["a" if (index + round_) % 2 else "b"]
            assert aws_kms.unwrap_key(aws_kms.wrap_key(key, key_id), key_id) == key
            done += 1
        return done

    with ThreadPoolExecutor(max_workers=threads) as pool:
        assert sum(pool.map(work, range(threads))) == threads * rounds

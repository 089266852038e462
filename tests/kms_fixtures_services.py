"""Session fixtures of the remote KMS services, for every test (the KMS tests, the docs' examples):
a moto server (AWS KMS) and an OpenBao dev server (Vault transit), each started once per
session on 127.0.0.1 and stopped by PID.

The servers themselves live in ``tests/servers`` so benchmarks can reuse them.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from servers import require_module, unavailable


@pytest.fixture(scope="session")
def moto_server() -> Iterator[object]:
    """A running moto server (``servers.moto.MotoServer``)."""
    require_module("boto3")
    require_module("moto.server")
    from servers.moto import moto_server as start

    with start() as server:
        yield server


@pytest.fixture(scope="session")
def aws_key_ids(moto_server) -> dict[str, str]:
    """Two symmetric KMS keys on the moto server: ``{"a": key_id, "b": key_id, "alias_a": ...}``."""
    kms = moto_server.boto3_client("kms")
    key_a = kms.create_key(Description="icecrypt test key A")["KeyMetadata"]
    key_b = kms.create_key(Description="icecrypt test key B")["KeyMetadata"]
    alias = f"alias/icecrypt-a-{uuid.uuid4().hex[:8]}"
    kms.create_alias(AliasName=alias, TargetKeyId=key_a["KeyId"])
    return {"a": key_a["KeyId"], "b": key_b["KeyId"], "arn_a": key_a["Arn"], "alias_a": alias}


@pytest.fixture(scope="session")
def aws_kms(moto_server) -> Iterator[object]:
    """An ``AwsKms`` client on the moto server, built through ``create_kms_client``."""
    from icecrypt.kms import create_kms_client

    with create_kms_client(moto_server.kms_properties()) as client:
        yield client


@pytest.fixture(scope="session")
def openbao_server() -> Iterator[object]:
    """A running OpenBao dev server with transit enabled (``servers.openbao.OpenBaoServer``)."""
    require_module("hvac")
    from servers.openbao import bao_binary
    from servers.openbao import openbao_server as start

    try:
        bao_binary()
    except FileNotFoundError as exc:
        unavailable(str(exc))
    with start() as server:
        yield server


@pytest.fixture(scope="session")
def vault_key_names(openbao_server) -> dict[str, str]:
    """Two transit keys on the OpenBao server: ``{"a": name, "b": name}``."""
    names = {"a": "icecrypt-a", "b": "icecrypt-b"}
    for name in names.values():
        openbao_server.create_transit_key(name)
    return names


@pytest.fixture(scope="session")
def vault_kms(openbao_server) -> Iterator[object]:
    """A ``VaultKms`` client on the OpenBao server, built through ``create_kms_client``."""
    from icecrypt.kms import create_kms_client

    with create_kms_client(openbao_server.kms_properties()) as client:
        yield client


def _key_forms(key: bytes) -> list[str]:
    import base64

    return [
        key.decode("latin-1"),
        key.hex(),
        key.hex().upper(),
        base64.b64encode(key).decode("ascii"),
        repr(key),
    ]


@pytest.fixture
def assert_no_key_material():
    """``check(key, *objects)``: fail if ``key`` (raw, hex, base64 or repr) appears in the
    ``str``/``repr`` of any object, or for exceptions in their formatted traceback chain."""
    import traceback

    def check(key: bytes, *objects: object) -> None:
        forms = _key_forms(key)
        for obj in objects:
            texts = [str(obj), repr(obj)]
            if isinstance(obj, BaseException):
                texts.append("".join(traceback.format_exception(obj)))
                cause = obj.__cause__ or obj.__context__
                while cause is not None:
                    texts += [str(cause), repr(cause)]
                    cause = cause.__cause__ or cause.__context__
            for text in texts:
                for form in forms:
                    assert form not in text, f"key material in {type(obj).__name__}: {text[:200]!r}"

    return check

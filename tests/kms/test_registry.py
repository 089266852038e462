"""Choosing a KMS client from catalog properties, as Iceberg Java's catalogs do."""

from __future__ import annotations

import sys

import pytest

from icecrypt import KmsError
from icecrypt.kms import KeyManagementClient, MemoryKms, create_kms_client, kms_types


def test_builtin_type_is_case_insensitive():
    client = create_kms_client({"encryption.kms-type": " Memory ", "encryption.kms.memory.key.k1": "00" * 16})
    assert isinstance(client, MemoryKms)
    assert client.unwrap_key(client.wrap_key(b"k" * 16, "k1"), "k1") == b"k" * 16


@pytest.mark.parametrize("impl", ["icecrypt.kms.memory.MemoryKms", "icecrypt.kms.memory:MemoryKms"])
def test_kms_impl_by_class_path(impl):
    assert isinstance(create_kms_client({"encryption.kms-impl": impl}), MemoryKms)


@pytest.mark.parametrize(
    "properties,match",
    [
        ({"encryption.kms-type": "memory", "encryption.kms-impl": "icecrypt.kms.memory.MemoryKms"}, "both"),
        ({}, "no KMS configured"),
        ({"encryption.kms-type": "nosuch"}, "unknown encryption.kms-type 'nosuch'; known types: .*memory"),
        ({"encryption.kms-impl": "nosuch.module.Kms"}, "cannot import"),
        ({"encryption.kms-impl": "icecrypt.kms.memory.NoSuchKms"}, "no KMS implementation"),
        ({"encryption.kms-impl": "collections.OrderedDict"}, "is not a KeyManagementClient"),
        ({"encryption.kms-impl": "MemoryKms"}, "expected 'package.module.Class'"),
    ],
)
def test_configuration_errors(properties, match):
    with pytest.raises(KmsError, match=match):
        create_kms_client(properties)


class RegisteredKms(MemoryKms):
    """A third-party backend, registered through an entry point below."""

    kms_type = "thirdparty"


def test_entry_point_registers_a_third_party_backend(tmp_path, monkeypatch):
    dist = tmp_path / "icecrypt_thirdparty-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: icecrypt-thirdparty\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[icecrypt.kms]\nThirdParty = {__name__}:RegisteredKms\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "thirdparty" in kms_types()
    client = create_kms_client({"encryption.kms-type": "thirdparty"})
    assert type(client).__name__ == "RegisteredKms" and isinstance(client, KeyManagementClient)
    assert sys.modules[__name__].RegisteredKms is type(client)

"""MemoryKms (Iceberg's test KMS format) and LocalKms (the keystore-file KMS)."""

from __future__ import annotations

import base64
import json
import os
import stat

import pytest

from icecrypt import (
    KmsAccessDeniedError,
    KmsError,
    KmsInvalidWrappedKeyError,
    KmsKeyNotFoundError,
)
from icecrypt._gcm import GcmKey
from icecrypt.keys import EncryptedKey, EncryptionManager
from icecrypt.kms.base import create_kms_client
from icecrypt.kms.local import KEYSTORE_ENV, LocalKms
from icecrypt.kms.memory import ICEBERG_TEST_MASTER_KEYS, MemoryKms

SECRET = bytes.fromhex("deadbeefcafebabe0badf00d5eed1e55")


# --- MemoryKms -----------------------------------------------------------------------


def test_memory_kms_unwraps_the_java_kek(bundle):
    assert {k: v.hex() for k, v in ICEBERG_TEST_MASTER_KEYS.items()} == bundle["kms"]["master_keys"]
    kek = EncryptedKey.from_json(bundle["encryption-keys"][0])
    kms = MemoryKms.with_iceberg_test_keys()
    assert kms.unwrap_key(kek.encrypted_key_metadata, "keyA").hex() == bundle["debug_plaintext_secrets"]["kek_hex"]
    with pytest.raises(KmsInvalidWrappedKeyError, match="'keyB'") as info:
        kms.unwrap_key(kek.encrypted_key_metadata, "keyB")
    assert info.value.backend == "memory"


def test_memory_kms_format_is_plain_gcm_without_aad():
    kms = MemoryKms({"m": bytes(range(16))})
    wrapped = kms.wrap_key(SECRET, "m")
    assert len(wrapped) == 12 + 16 + 16
    assert GcmKey(bytes(range(16))).open(wrapped) == SECRET
    assert kms.unwrap_key(wrapped, "m") == SECRET
    assert kms.wrap_key(SECRET, "m") != wrapped  # fresh nonce per wrap


def test_memory_kms_errors_name_the_problem_not_the_key():
    kms = MemoryKms({"m": SECRET})
    wrapped = kms.wrap_key(SECRET, "m")
    with pytest.raises(KmsKeyNotFoundError, match="'nope'"):
        kms.wrap_key(SECRET, "nope")
    with pytest.raises(KmsKeyNotFoundError):
        kms.unwrap_key(wrapped, "nope")
    tampered = wrapped[:-1] + bytes([wrapped[-1] ^ 1])
    for bad in (tampered, wrapped[:27]):
        with pytest.raises(KmsInvalidWrappedKeyError) as info:
            kms.unwrap_key(bad, "m")
        assert "deadbeef" not in str(info.value)
    with pytest.raises(KmsError, match="16, 24 or 32"):
        MemoryKms({"m": b"short"})
    assert "deadbeef" not in repr(kms)


def test_memory_kms_from_properties():
    kms = create_kms_client({
        "encryption.kms-type": "MEMORY",
        "encryption.kms.memory.key.hexkey": "00" * 16,
        "encryption.kms.memory.key.hexkey2": "hex:" + "11" * 24,
        "encryption.kms.memory.key.b64key": "base64:" + base64.b64encode(bytes(32)).decode(),
        "encryption.kms.memory.iceberg-test-keys": "true",
    })
    assert isinstance(kms, MemoryKms)
    assert set(kms.key_ids) == {"hexkey", "hexkey2", "b64key", "keyA", "keyB"}
    for key_id in kms.key_ids:
        assert kms.unwrap_key(kms.wrap_key(SECRET, key_id), key_id) == SECRET
    # the 32 hex digits are read as hex (16 bytes), not as base64 (24 bytes)
    assert GcmKey(bytes(16)).open(kms.wrap_key(SECRET, "hexkey")) == SECRET
    with pytest.raises(KmsError, match="hex or 'base64:"):
        MemoryKms().initialize({"encryption.kms.memory.key.bad": "zz"})


# --- LocalKms ------------------------------------------------------------------------


def test_local_keystore_is_created_0600_and_not_overwritten(tmp_path):
    path = tmp_path / "keystore.json"
    kms = LocalKms.create_keystore(path, ("master", "second"), key_length=16)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert kms.key_ids == ["master", "second"]
    document = json.loads(path.read_text())
    assert document["format"] == "icecrypt-local-keystore" and document["version"] == 1
    assert len(base64.b64decode(document["keys"]["master"]["material"])) == 16
    assert isinstance(document["keys"]["master"]["created-ms"], int)
    before = path.read_bytes()
    with pytest.raises(FileExistsError):
        LocalKms.create_keystore(path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["keystore.json"]  # no temporary left behind
    with pytest.raises(ValueError):
        LocalKms.create_keystore(tmp_path / "x.json", key_length=20)
    with pytest.raises(ValueError):
        LocalKms.create_keystore(tmp_path / "y.json", ("a", "a"))


def test_local_kms_wraps_with_version_and_key_id_bound(tmp_path):
    kms = LocalKms.create_keystore(tmp_path / "ks.json", ("a", "b"))
    wrapped = kms.wrap_key(SECRET, "a")
    assert wrapped[0] == 1 and len(wrapped) == 1 + 12 + 16 + 16
    assert kms.unwrap_key(wrapped, "a") == SECRET
    # same material under another name still fails: the key id is authenticated
    document = json.loads((tmp_path / "ks.json").read_text())
    document["keys"]["alias"] = document["keys"]["a"]
    clone = tmp_path / "clone.json"
    fd = os.open(clone, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(document, f)
    with pytest.raises(KmsInvalidWrappedKeyError, match="'alias'"):
        LocalKms(clone).unwrap_key(wrapped, "alias")
    with pytest.raises(KmsInvalidWrappedKeyError):
        kms.unwrap_key(wrapped, "b")
    with pytest.raises(KmsInvalidWrappedKeyError, match="version byte 0x02"):
        kms.unwrap_key(b"\x02" + wrapped[1:], "a")
    with pytest.raises(KmsInvalidWrappedKeyError, match="too short"):
        kms.unwrap_key(wrapped[:28], "a")
    with pytest.raises(KmsKeyNotFoundError, match="'c'"):
        kms.wrap_key(SECRET, "c")


def test_local_kms_reads_an_unchanged_keystore_once(tmp_path, monkeypatch):
    """Wraps and unwraps use the loaded keys until the file changes (a bug once compared
    the file's stamp with a key's creation time, so every call re-read the keystore)."""
    LocalKms.create_keystore(tmp_path / "ks.json", ("a",))
    kms = LocalKms(tmp_path / "ks.json")
    reads = []
    original = LocalKms._read_document
    monkeypatch.setattr(LocalKms, "_read_document", staticmethod(lambda path: reads.append(path) or original(path)))
    for _ in range(3):
        assert kms.unwrap_key(kms.wrap_key(SECRET, "a"), "a") == SECRET
    assert reads == []


def test_local_keystore_refuses_loose_permissions(tmp_path):
    path = tmp_path / "ks.json"
    LocalKms.create_keystore(path)
    for mode in (0o644, 0o640, 0o604, 0o620):
        path.chmod(mode)
        with pytest.raises(KmsAccessDeniedError, match=f"mode {mode:04o}"):
            LocalKms(path)
    path.chmod(0o400)
    assert LocalKms(path).key_ids == ["master"]


@pytest.mark.parametrize(
    "content, message",
    [
        ("not json", "not valid JSON"),
        ("[]", "not an icecrypt local keystore"),
        ('{"format": "other", "keys": {}}', "not an icecrypt local keystore"),
        ('{"format": "icecrypt-local-keystore", "version": 9, "keys": {}}', "unsupported version 9"),
        ('{"format": "icecrypt-local-keystore", "version": 1, "keys": {"m": {}}}', "'m' is malformed"),
        ('{"format": "icecrypt-local-keystore", "version": 1, "keys": {"m": {"material": "AAAA"}}}',
         "'m' is malformed.*16, 24 or 32"),
        ('{"format": "icecrypt-local-keystore", "version": 1, "keys": {"m": {"material": "*"}}}',
         "'m' is malformed"),
    ],
)
def test_local_keystore_refuses_malformed_files(tmp_path, content, message):
    path = tmp_path / "ks.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(content)
    with pytest.raises(KmsError, match=message):
        LocalKms(path)


def test_local_kms_configuration(tmp_path, monkeypatch):
    path = tmp_path / "ks.json"
    LocalKms.create_keystore(path)
    monkeypatch.delenv(KEYSTORE_ENV, raising=False)
    with pytest.raises(KmsError, match="encryption.kms.local.keystore"):
        create_kms_client({"encryption.kms-type": "local"})
    with pytest.raises(KmsError, match="does not exist"):
        LocalKms(tmp_path / "missing.json")
    kms = create_kms_client({"encryption.kms-type": "local", "encryption.kms.local.keystore": str(path)})
    assert isinstance(kms, LocalKms) and kms.keystore_path == path
    monkeypatch.setenv(KEYSTORE_ENV, str(path))
    assert create_kms_client({"encryption.kms-type": "local"}).key_ids == ["master"]
    with pytest.raises(KmsError, match="no keystore"):
        LocalKms().wrap_key(SECRET, "master")


def test_local_master_key_rotation(tmp_path):
    path = tmp_path / "ks.json"
    kms = LocalKms.create_keystore(path)
    manager = EncryptionManager(kms, "master")
    entry = manager.wrap_manifest_list_key_metadata(manager.new_file_key())
    kms.add_key("master-2")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert kms.key_ids == ["master", "master-2"] and kms.created_ms("master-2") >= kms.created_ms("master")
    with pytest.raises(KmsError, match="already has"):
        kms.add_key("master")
    manager.rotate_master_key("master-2")
    reader = EncryptionManager(LocalKms(path), "master-2", manager.encryption_keys)
    assert reader.unwrap_manifest_list_key_metadata(entry.key_id).key_length == 16
    assert "master-2" in repr(kms) and str(path) in repr(kms)
    # Retiring the old master key: the re-wrapped chain still opens, the old wrap does not.
    old_wrap = kms.wrap_key(bytes(16), "master")
    kms.remove_key("master")
    assert kms.key_ids == ["master-2"] and LocalKms(path).key_ids == ["master-2"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    reader = EncryptionManager(LocalKms(path), "master-2", manager.encryption_keys)
    assert reader.unwrap_manifest_list_key_metadata(entry.key_id).key_length == 16
    with pytest.raises(KmsKeyNotFoundError):
        kms.unwrap_key(old_wrap, "master")
    with pytest.raises(KmsKeyNotFoundError):
        kms.remove_key("master")


def test_local_client_follows_keystore_rotated_by_another_process(tmp_path):
    path = tmp_path / "ks.json"
    LocalKms.create_keystore(path, key_ids=("old",))
    long_lived = LocalKms(path)  # e.g. cached in a Spark worker
    wrapped_old = long_lived.wrap_key(SECRET, "old")
    admin = LocalKms(path)
    admin.add_key("new")
    wrapped_new = long_lived.wrap_key(SECRET, "new")  # the new key is seen without reloading by hand
    admin.remove_key("old")
    with pytest.raises(KmsKeyNotFoundError):
        long_lived.unwrap_key(wrapped_old, "old")  # a retired key stops working at once
    assert long_lived.unwrap_key(wrapped_new, "new") == SECRET

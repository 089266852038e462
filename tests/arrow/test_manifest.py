"""Key manifests (icecrypt.keys.manifest) with the memory and local KMS, and through
EncryptedFileSystem: round trips, no key in clear, tamper and wrong-key detection."""

from __future__ import annotations

import base64
import json
import os
import stat

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pytest

import icecrypt
from icecrypt.arrow import EncryptedFileSystem
from icecrypt.keys import (
    EncryptionManager,
    StandardKeyMetadata,
    read_key_manifest,
    write_key_manifest,
)
from icecrypt.kms.local import LocalKms
from icecrypt.kms.memory import MemoryKms

TABLE = pa.table({"k": [i % 4 for i in range(8000)], "v": [f"value-{i}" for i in range(8000)]})


@pytest.fixture(params=["memory", "local"])
def kms_and_key(request, tmp_path):
    """``(kms, master key id, another client of the same KMS type without that key)``."""
    if request.param == "memory":
        return MemoryKms.with_iceberg_test_keys(), "keyA", MemoryKms({"keyA": os.urandom(16)})
    kms = LocalKms.create_keystore(tmp_path / "keystore.json", ("master",))
    other = LocalKms.create_keystore(tmp_path / "other.json", ("master",))
    return kms, "master", other


def some_keys(manager: EncryptionManager, n: int = 5) -> dict[str, StandardKeyMetadata]:
    return {f"bucket/data/part-{i}.parquet": manager.new_file_key().with_file_length(1000 + i) for i in range(n)}


def key_forms(key: bytes) -> list[str]:
    return [key.hex(), key.hex().upper(), base64.b64encode(key).decode(), repr(key)]


def test_round_trip_without_key_bytes_in_clear(tmp_path, kms_and_key):
    kms, key_id, _ = kms_and_key
    manager = EncryptionManager(kms, key_id)
    keys = some_keys(manager)
    path = tmp_path / "keys.json"
    write_key_manifest(path, keys, manager)
    assert read_key_manifest(path, kms) == keys
    assert read_key_manifest(str(path), kms) == keys
    text = path.read_text()
    document = json.loads(text)
    assert document["table-key-id"] == key_id
    assert set(document["files"]) == set(keys)
    kek = [e for e in document["encryption-keys"] if e.get("encrypted-by-id") == key_id]
    assert len(kek) == 1 and "KEY_TIMESTAMP" in kek[0]["properties"]
    for km in keys.values():
        for form in key_forms(km.encryption_key) + key_forms(km.aad_prefix):
            assert form not in text
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    assert manager.encryption_keys == []  # the caller's manager gains no entries


def test_empty_manifest(tmp_path, manager, kms):
    write_key_manifest(tmp_path / "keys.json", {}, manager)
    assert read_key_manifest(tmp_path / "keys.json", kms) == {}


def test_wrong_or_unknown_master_key(tmp_path, kms_and_key):
    kms, key_id, other = kms_and_key
    path = tmp_path / "keys.json"
    write_key_manifest(path, some_keys(EncryptionManager(kms, key_id)), EncryptionManager(kms, key_id))
    with pytest.raises(icecrypt.KmsError, match="keys.json") as err:
        read_key_manifest(path, other)
    assert err.value.backend == kms.kms_type
    document = json.loads(path.read_text())
    document["table-key-id"] = "no-such-key"
    for entry in document["encryption-keys"]:
        if entry.get("encrypted-by-id") == key_id:
            entry["encrypted-by-id"] = "no-such-key"
    path.write_text(json.dumps(document))
    with pytest.raises(icecrypt.KmsKeyNotFoundError, match="keys.json"):
        read_key_manifest(path, kms)


def test_a_manifest_under_another_master_key_is_refused_when_the_caller_names_its_key(tmp_path, kms):
    """A storage attacker's manifest, wrapped under another master key the reader's KMS
    client can use (keyB), supplies DEKs of its choosing: refused once the caller says
    which master key the data is under, before any KMS call."""
    path = tmp_path / "keys.json"
    forged = {"data.parquet": StandardKeyMetadata(bytes(16), bytes(16))}
    write_key_manifest(path, forged, EncryptionManager(kms, "keyB"))
    with pytest.raises(icecrypt.AuthenticationError, match=r"keys\.json.*'keyB'.*'keyA'"):
        read_key_manifest(path, kms, table_key_id="keyA")
    assert read_key_manifest(path, kms, table_key_id="keyB") == forged
    # without the caller's key id the manifest's own is taken (documented: safe only with
    # a KMS client that holds that one key)
    assert read_key_manifest(path, kms) == forged
    with pytest.raises(ValueError, match="table_key_id"):
        read_key_manifest(path, kms, table_key_id="")


def edit(path, change) -> None:
    document = json.loads(path.read_text())
    change(document)
    path.write_text(json.dumps(document))


def test_tampering_is_detected(tmp_path, manager, kms):
    keys = some_keys(manager)
    path = tmp_path / "keys.json"
    first, second = sorted(keys)[:2]

    def flip_entry(document):
        entry = next(e for e in document["encryption-keys"] if e["key-id"] == document["files"][first])
        raw = bytearray(base64.b64decode(entry["encrypted-key-metadata"]))
        raw[20] ^= 1
        entry["encrypted-key-metadata"] = base64.b64encode(raw).decode()

    def swap_paths(document):
        files = document["files"]
        files[first], files[second] = files[second], files[first]

    def drop_path(document):
        del document["files"][second]

    def alias_path(document):
        document["files"]["bucket/other.parquet"] = document["files"][first]

    def swap_wrapped_bytes(document):
        by_id = {e["key-id"]: e for e in document["encryption-keys"]}
        a, b = by_id[document["files"][first]], by_id[document["files"][second]]
        a["encrypted-key-metadata"], b["encrypted-key-metadata"] = b["encrypted-key-metadata"], a["encrypted-key-metadata"]

    for change in (flip_entry, swap_paths, drop_path, alias_path, swap_wrapped_bytes):
        write_key_manifest(path, keys, manager)
        edit(path, change)
        with pytest.raises(icecrypt.AuthenticationError, match="keys.json"):
            read_key_manifest(path, kms)

    write_key_manifest(path, keys, manager)
    edit(path, lambda d: d["files"].__setitem__(first, "no-such-id"))
    with pytest.raises(icecrypt.EncryptionKeyNotFoundError, match="keys.json"):
        read_key_manifest(path, kms)


@pytest.mark.parametrize(
    "content, message",
    [
        (b"\xff\xfe", "not a key manifest"),
        (b"[1, 2]", "not a key manifest"),
        (b'{"format": "something-else"}', "not a key manifest"),
        (b'{"format": "icecrypt-key-manifest", "version": 9}', "version 9"),
        (b'{"format": "icecrypt-key-manifest", "version": 1, "table-key-id": "keyA"}', "encryption-keys"),
    ],
)
def test_not_a_manifest(tmp_path, kms, content, message):
    path = tmp_path / "keys.json"
    path.write_bytes(content)
    with pytest.raises(icecrypt.FormatError, match=message):
        read_key_manifest(path, kms)


def test_failed_write_leaves_nothing(tmp_path, kms):
    manager = EncryptionManager(kms, "no-such-master-key")
    with pytest.raises(icecrypt.KmsKeyNotFoundError):
        write_key_manifest(tmp_path / "keys.json", some_keys(EncryptionManager(kms, "keyA")), manager)
    assert list(tmp_path.iterdir()) == []


def test_on_pyarrow_filesystems(tmp_path, manager, kms, efs):
    keys = some_keys(manager)
    subtree = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    write_key_manifest("keys.json", keys, manager, filesystem=subtree)
    assert read_key_manifest("keys.json", kms, filesystem=subtree) == keys
    assert read_key_manifest(tmp_path / "keys.json", kms) == keys
    local = str(tmp_path / "local.json")
    write_key_manifest(local, keys, manager, filesystem=pafs.LocalFileSystem())
    assert read_key_manifest(local, kms, filesystem=pafs.LocalFileSystem()) == keys
    with pytest.raises(ValueError, match="EncryptedFileSystem"):
        write_key_manifest(str(tmp_path / "x.json"), keys, manager, filesystem=efs)
    with pytest.raises(FileNotFoundError, match="missing.json"):
        read_key_manifest(tmp_path / "missing.json", kms)


def test_encrypted_filesystem_saves_and_reopens_with_a_manifest(tmp_path, kms_and_key):
    kms, key_id, other = kms_and_key
    fs = EncryptedFileSystem.wrap(pafs.LocalFileSystem(), EncryptionManager(kms, key_id))
    root = str(tmp_path / "ds")
    ds.write_dataset(TABLE, root, filesystem=fs, format="parquet", partitioning=["k"], partitioning_flavor="hive")
    manifest = str(tmp_path / "keys.json")
    fs.handler.save_key_manifest(manifest)
    keys = read_key_manifest(manifest, kms)
    assert keys == fs.handler.written_keys() and len(keys) == 4
    assert all(km.file_length == os.path.getsize(p) for p, km in keys.items())

    reader = EncryptedFileSystem.wrap(pafs.LocalFileSystem(), keys=read_key_manifest(manifest, kms))
    got = ds.dataset(root, filesystem=reader, format="parquet", partitioning="hive").to_table()
    assert got.select(["v"]).sort_by("v").equals(TABLE.select(["v"]).sort_by("v"))
    with pytest.raises(icecrypt.KmsError, match="keys.json"):
        read_key_manifest(manifest, other)

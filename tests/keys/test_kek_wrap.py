"""Manifest-list key metadata wrapped by a KEK, against Iceberg Java's kek_wrap vectors."""

from __future__ import annotations

import json

import pytest
from keyhelpers import Clock, SeededRandom
from vectorlib import hash_stream

from icecrypt import AuthenticationError
from icecrypt.keys import (
    EncryptedKey,
    EncryptionManager,
    StandardKeyMetadata,
    unwrap_key_metadata,
)
from icecrypt.keys.manager import _seal_key_metadata
from icecrypt.kms.memory import ICEBERG_TEST_MASTER_KEYS, MemoryKms


@pytest.fixture(scope="module")
def kek_vectors(vectors):
    entries = vectors["kek_wrap"]
    assert len(entries) >= 2
    return entries


def test_vector_fields_are_consistent(kek_vectors):
    for v in kek_vectors:
        assert bytes.fromhex(v["aad_hex"]) == v["key_timestamp"].encode()
        assert hash_stream(bytes.fromhex(v["rng_seed_hex"]), 12).hex() == v["nonce_hex"]
        assert v["wrapped_hex"].startswith(v["nonce_hex"])


def test_java_wraps_unwrap(kek_vectors):
    for v in kek_vectors:
        km = unwrap_key_metadata(bytes.fromhex(v["kek_hex"]), v["key_timestamp"], bytes.fromhex(v["wrapped_hex"]))
        assert km.encode().hex() == v["key_metadata_hex"], v["id"]


def test_rewrap_is_byte_identical_with_the_vector_nonce(kek_vectors):
    for v in kek_vectors:
        km = StandardKeyMetadata.decode(bytes.fromhex(v["key_metadata_hex"]))
        nonce = hash_stream(bytes.fromhex(v["rng_seed_hex"]), 12)
        wrapped = _seal_key_metadata(bytes.fromhex(v["kek_hex"]), v["key_timestamp"], km, nonce)
        assert wrapped.hex() == v["wrapped_hex"], v["id"]
        assert len(wrapped) == len(km.encode()) + 28


def test_timestamp_is_the_aad(kek_vectors):
    for v in kek_vectors:
        assert v["unwrap_with_timestamp_plus_1_char"]["ok"] is False
        with pytest.raises(AuthenticationError):
            unwrap_key_metadata(bytes.fromhex(v["kek_hex"]), v["key_timestamp"] + "0", bytes.fromhex(v["wrapped_hex"]))


def test_manager_reproduces_the_java_entry(kek_vectors):
    """A manager with Java's random stream writes the vector's encryption-keys entry byte for byte."""
    for v in kek_vectors:
        kek = bytes.fromhex(v["kek_hex"])
        expected = json.loads(v["encryption_key_json"])
        kek_id = expected["encrypted-by-id"]
        kms = MemoryKms(ICEBERG_TEST_MASTER_KEYS)
        kek_entry = EncryptedKey(kek_id, kms.wrap_key(kek, "keyA"), "keyA", {"KEY_TIMESTAMP": v["key_timestamp"]})
        seed = bytes.fromhex(v["rng_seed_hex"])
        nonces = SeededRandom(seed)  # the GCM encryptor's own SecureRandom
        manager = EncryptionManager(
            kms,
            "keyA",
            [kek_entry],
            len(kek),
            clock=Clock(int(v["key_timestamp"]) + 1000),
        )
        # test-only injection (no public argument reaches these): Java's random streams
        manager._random = SeededRandom(seed)  # the manager's SecureRandom (key ids)
        manager._nonce = lambda nonces=nonces: nonces(12)
        entry = manager.wrap_manifest_list_key_metadata(
            StandardKeyMetadata.decode(bytes.fromhex(v["key_metadata_hex"]))
        )
        assert entry.key_id == v["manifest_list_key_id"]
        assert json.dumps(entry.to_json(), separators=(",", ":")) == v["encryption_key_json"]
        assert manager.encryption_keys == [kek_entry, entry]
        assert manager.unwrap_manifest_list_key_metadata(entry.key_id).encode().hex() == v["key_metadata_hex"]

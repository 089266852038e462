"""Key-hierarchy microbenchmarks: per-file keys and manifest-list key wrapping.

Run: .venv/bin/python -m pytest benchmarks/bench_keys.py --benchmark-enable \
         -p no:cacheprovider -o python_files='bench_*.py'
Target: well under 20 µs per data-file key.  The KEK is cached (as in steady state), so
no KMS call is timed; the MemoryKms cost is measured separately for reference.
"""

from __future__ import annotations

import pytest

from icecrypt.keys import EncryptionManager, StandardKeyMetadata
from icecrypt.kms.memory import MemoryKms


@pytest.fixture
def manager():
    manager = EncryptionManager(MemoryKms.with_iceberg_test_keys(), "keyA")
    manager.wrap_manifest_list_key_metadata(manager.new_file_key())  # create and cache the KEK
    return manager


def test_new_file_key(benchmark, manager):
    km = benchmark(manager.new_file_key)
    assert km.key_length == 16


def test_new_file_key_encoded_with_length(benchmark, manager):
    # what a data writer does per file: new key, add file_length, encode for the manifest
    blob = benchmark(lambda: manager.new_file_key().with_file_length(123456789).encode())
    assert len(blob) == 41


def test_decode_key_metadata(benchmark):
    blob = StandardKeyMetadata(bytes(16), bytes(16), 123456789).encode()
    assert benchmark(StandardKeyMetadata.decode, blob).file_length == 123456789


def test_wrap_manifest_list_key_metadata(benchmark, manager):
    km = manager.new_file_key().with_file_length(1048641)
    entry = benchmark(manager.wrap_manifest_list_key_metadata, km)
    assert len(entry.encrypted_key_metadata) == 69


def test_unwrap_manifest_list_key_metadata_cached_kek(benchmark, manager):
    km = manager.new_file_key().with_file_length(1048641)
    entry = manager.wrap_manifest_list_key_metadata(km)
    assert benchmark(manager.unwrap_manifest_list_key_metadata, entry.key_id) == km


def test_memory_kms_unwrap_reference(benchmark):
    kms = MemoryKms.with_iceberg_test_keys()
    wrapped = kms.wrap_key(bytes(16), "keyA")
    assert benchmark(kms.unwrap_key, wrapped, "keyA") == bytes(16)

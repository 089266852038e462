"""Fixtures of the table tests: Iceberg's test KMS and the shared Java tables."""

from __future__ import annotations

import pytest
from tablelib import copy_table, location_map, metadata_path

from icecrypt.kms.memory import MemoryKms
from icecrypt.table import EncryptedTable


@pytest.fixture
def kms() -> MemoryKms:
    """Iceberg Java's test KMS with master keys keyA and keyB (what the shared tables use)."""
    return MemoryKms.with_iceberg_test_keys()


@pytest.fixture
def golden(kms):
    """``golden(name)``: a shared Java table, read in place."""

    def load(name: str) -> EncryptedTable:
        return EncryptedTable.load(metadata_path(name), kms=kms, location_map=location_map(name))

    return load


@pytest.fixture
def golden_copy(kms, tmp_path):
    """``golden_copy(name)``: (table, root) of a private copy of a shared table, to damage."""

    def load(name: str) -> tuple[EncryptedTable, object]:
        root = copy_table(name, tmp_path)
        table = EncryptedTable.load(metadata_path(name, root), kms=kms, location_map=location_map(name, root))
        return table, root

    return load

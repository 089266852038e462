"""Fixtures for the key-hierarchy tests: the Java table bundle, test KMS, a fake clock.

The Java vectors come from the suite-wide ``vectors`` fixture (tests/conftest.py), which
fails, never skips, when ../shared/vectors is missing; ``bundle`` and ``tables_dir`` do
the same for the files they need.
"""

from __future__ import annotations

import json

import pytest
from keyhelpers import Clock
from vectorlib import TABLES_DIR, VECTORS_DIR

from icecrypt.kms.memory import MemoryKms


@pytest.fixture(scope="session")
def bundle(vectors) -> dict:
    """table/dek16/bundle.json (a real encryption-keys list made by Iceberg Java)."""
    (entry,) = vectors["table_bundles"]
    path = VECTORS_DIR / entry["bundle"]
    if not path.is_file():
        pytest.fail(f"Java table bundle not found at {path}")
    data = json.loads(path.read_text(encoding="utf-8"))
    data["_dir"] = path.parent
    data["_manifest_entry"] = entry
    return data


@pytest.fixture(scope="session")
def tables_dir():
    if not TABLES_DIR.is_dir():
        pytest.fail(f"Java tables not found at {TABLES_DIR}")
    return TABLES_DIR


@pytest.fixture
def java_kms(bundle) -> MemoryKms:
    """A MemoryKms with the bundle's master keys (Iceberg's keyA / keyB)."""
    return MemoryKms({k: bytes.fromhex(v) for k, v in bundle["kms"]["master_keys"].items()})


@pytest.fixture
def clock() -> Clock:
    return Clock()

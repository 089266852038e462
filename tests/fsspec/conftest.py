"""Fixtures of the icecrypt.fsspec tests: a test KMS and manager, fsspec's real local and
memory filesystems (each test gets its own memory root), and a counting memory
filesystem (``fsspechelpers``) that records the byte ranges read from it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import fsspec
import pytest
from fsspechelpers import CountingMemoryFileSystem

from icecrypt.fsspec import EncryptedFileSystem
from icecrypt.keys import EncryptionManager
from icecrypt.kms.memory import MemoryKms


@pytest.fixture
def kms() -> MemoryKms:
    """Iceberg's test KMS (master keys keyA and keyB)."""
    return MemoryKms.with_iceberg_test_keys()


@pytest.fixture
def manager(kms) -> EncryptionManager:
    return EncryptionManager(kms, "keyA")


@pytest.fixture
def local_fs(manager) -> EncryptedFileSystem:
    """An EncryptedFileSystem over fsspec's local filesystem."""
    return EncryptedFileSystem(fsspec.filesystem("file"), manager)


@pytest.fixture
def memory_root() -> Iterator[str]:
    """A fresh directory of fsspec's (process-wide) memory filesystem, removed after."""
    root = f"/icecrypt-test-{uuid.uuid4().hex[:12]}"
    base = fsspec.filesystem("memory")
    base.mkdir(root)
    yield root
    if base.exists(root):
        base.rm(root, recursive=True)


@pytest.fixture
def memory_fs(manager) -> EncryptedFileSystem:
    """An EncryptedFileSystem over fsspec's memory filesystem (use under memory_root)."""
    return EncryptedFileSystem("memory", manager)


@pytest.fixture
def counting() -> Iterator[CountingMemoryFileSystem]:
    fs = CountingMemoryFileSystem()
    yield fs
    fs.store.clear()
    fs.pseudo_dirs[:] = [""]

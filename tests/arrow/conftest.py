"""Fixtures of the icecrypt.arrow tests: a test KMS and manager, an encrypted local
filesystem, and (for the S3 tests) a moto server behind a byte-counting proxy."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pyarrow.fs as pafs
import pytest
from arrowhelpers import CountingProxy

from icecrypt.arrow import EncryptedFileSystem
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
def efs(manager) -> pafs.PyFileSystem:
    """An EncryptedFileSystem over the local filesystem."""
    return EncryptedFileSystem.wrap(pafs.LocalFileSystem(), manager)


@pytest.fixture(scope="session")
def s3_proxy(moto_server) -> Iterator[CountingProxy]:
    """A byte-counting proxy in front of the moto server."""
    proxy = CountingProxy(moto_server.host, moto_server.port)
    yield proxy
    proxy.close()


@pytest.fixture
def s3(moto_server, s3_proxy) -> tuple[pafs.S3FileSystem, str]:
    """pyarrow's S3FileSystem talking to moto through the proxy, and a fresh bucket."""
    bucket = f"icecrypt-{uuid.uuid4().hex[:12]}"
    moto_server.boto3_client("s3").create_bucket(Bucket=bucket)
    fs = pafs.S3FileSystem(
        endpoint_override=f"{moto_server.host}:{s3_proxy.port}",
        scheme="http",
        access_key=moto_server.access_key_id,
        secret_key=moto_server.secret_access_key,
        region=moto_server.region,
    )
    return fs, bucket

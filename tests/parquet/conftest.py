"""Fixtures of the icecrypt.parquet tests: an S3 bucket on a local moto server."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pyarrow.fs as pafs
import pytest
from servers import require_module


@pytest.fixture(scope="session")
def parquet_moto() -> Iterator[object]:
    """A moto server (``servers.moto.MotoServer``) for this directory's S3 tests."""
    require_module("boto3")
    require_module("moto.server")
    from servers.moto import moto_server

    with moto_server() as server:
        yield server


@pytest.fixture
def s3_bucket(parquet_moto) -> tuple[pafs.S3FileSystem, str]:
    """pyarrow's S3FileSystem talking to moto, and a fresh bucket name."""
    bucket = f"icecrypt-pq-{uuid.uuid4().hex[:12]}"
    parquet_moto.boto3_client("s3").create_bucket(Bucket=bucket)
    fs = pafs.S3FileSystem(
        endpoint_override=f"{parquet_moto.host}:{parquet_moto.port}",
        scheme="http",
        access_key=parquet_moto.access_key_id,
        secret_key=parquet_moto.secret_access_key,
        region=parquet_moto.region,
    )
    return fs, bucket

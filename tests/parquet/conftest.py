"""Fixtures of the icecrypt.parquet tests: an S3 bucket on the suite's moto server."""

from __future__ import annotations

import uuid

import pyarrow.fs as pafs
import pytest


@pytest.fixture
def s3_bucket(moto_server) -> tuple[pafs.S3FileSystem, str]:
    """pyarrow's S3FileSystem talking to moto, and a fresh bucket name."""
    bucket = f"icecrypt-pq-{uuid.uuid4().hex[:12]}"
    moto_server.boto3_client("s3").create_bucket(Bucket=bucket)
    fs = pafs.S3FileSystem(
        endpoint_override=f"{moto_server.host}:{moto_server.port}",
        scheme="http",
        access_key=moto_server.access_key_id,
        secret_key=moto_server.secret_access_key,
        region=moto_server.region,
    )
    return fs, bucket

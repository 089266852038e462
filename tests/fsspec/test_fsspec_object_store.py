"""icecrypt.fsspec over an object store: fsspec's ``ArrowFSWrapper`` around pyarrow's
S3FileSystem, talking to a real moto server (s3fs is not a dependency of the project).

On an object store nothing is renamed: a file is written in place and published when
its upload completes, a failed one is made invalid and deleted, and reads go through
pyarrow's random-access file (``read_at``: one ranged GET per run of AGS1 blocks).
"""

from __future__ import annotations

import os
import uuid

import pandas as pd
import pyarrow.fs as pafs
import pytest
from fsspec.implementations.arrow import ArrowFSWrapper

import icecrypt
from icecrypt import ags1
from icecrypt.fsspec import EncryptedFileSystem, read_key_manifest

pytestmark = [pytest.mark.servers, pytest.mark.timeout(120)]

BLOCK = ags1.PLAIN_BLOCK_SIZE
HEADER = ags1.HEADER_LENGTH


@pytest.fixture
def s3(moto_server) -> tuple[ArrowFSWrapper, str]:
    bucket = f"icecrypt-fsspec-{uuid.uuid4().hex[:12]}"
    moto_server.boto3_client("s3").create_bucket(Bucket=bucket)
    arrow_s3 = pafs.S3FileSystem(
        endpoint_override=f"{moto_server.host}:{moto_server.port}",
        scheme="http",
        access_key=moto_server.access_key_id,
        secret_key=moto_server.secret_access_key,
        region=moto_server.region,
    )
    return ArrowFSWrapper(arrow_s3), bucket


def test_round_trip_ranges_and_sizes(s3, manager, kms):
    base, bucket = s3
    fs = EncryptedFileSystem(base, manager)
    data = os.urandom(4 * BLOCK + 777)
    path = f"{bucket}/blob.bin"
    with fs.open(path, "wb") as f:
        f.write(data)
    km = fs.key_metadata(path)
    assert base.size(path) == km.file_length and fs.size(path) == len(data)
    assert base.cat_file(path)[:4] == b"AGS1"
    assert fs.cat_file(path, 3 * BLOCK + 5, 3 * BLOCK + 25) == data[3 * BLOCK + 5 : 3 * BLOCK + 25]
    with fs.open(path, "rb") as f:
        f.seek(-100, os.SEEK_END)
        assert f.read() == data[-100:]

    frame = pd.DataFrame({"i": range(50_000), "s": ["x", "y"] * 25_000})
    frame.to_parquet(f"{bucket}/t.parquet", filesystem=fs, index=False)
    fs.save_key_manifest(f"{bucket}/_keys.json")
    keys = read_key_manifest(f"{bucket}/_keys.json", kms, filesystem=base)
    reader = EncryptedFileSystem(base, keys=keys)
    pd.testing.assert_frame_equal(pd.read_parquet(f"{bucket}/t.parquet", filesystem=reader), frame)
    assert reader.cat_file(path) == data


def test_failed_upload_leaves_nothing(s3, manager):
    base, bucket = s3
    fs = EncryptedFileSystem(base, manager)
    path = f"{bucket}/failed.bin"
    with pytest.raises(RuntimeError), fs.open(path, "wb") as f:
        f.write(os.urandom(2 * BLOCK + 3))
        raise RuntimeError("boom")
    assert not base.exists(path) and fs.written_keys() == {}
    # a damaged object is refused, naming it
    with fs.open(path, "wb") as f:
        f.write(b"payload" * 1000)
    stored = bytearray(base.cat_file(path))
    stored[HEADER + 40] ^= 1
    with base.open(path, "wb") as f:
        f.write(bytes(stored))
    with pytest.raises(icecrypt.AuthenticationError, match="failed.bin"):
        fs.cat_file(path)

"""EncryptedFileSystem over pyarrow's S3FileSystem talking to a real moto server.

The reads go through a proxy that counts the bytes the server really sent, to prove that
a small range read or a Parquet column projection fetches only the AGS1 blocks covering
the bytes Arrow asked for (and the header and block 0, which every reader checks).
"""

from __future__ import annotations

import gc
import os
import time

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from icecrypt import ags1
from icecrypt.arrow import EncryptedFileSystem
from icecrypt.keys import read_key_manifest

pytestmark = [pytest.mark.servers, pytest.mark.timeout(120)]

MIB = ags1.PLAIN_BLOCK_SIZE
CBS = ags1.CIPHER_BLOCK_SIZE
#: the most a response's status line and headers take (moto's are ~500 bytes)
HTTP_OVERHEAD = 1500


def block_range(index: int, ciphertext_length: int) -> tuple[int, int]:
    """Inclusive byte range of AGS1 block ``index`` in the stored file."""
    start = ags1.HEADER_LENGTH + index * CBS
    return start, min(start + CBS, ciphertext_length) - 1


def covering_blocks(ranges: list[tuple[int, int]]) -> set[int]:
    """Indexes of the blocks holding the plaintext ranges ``[start, end)``."""
    return {i for start, end in ranges if end > start for i in range(start // MIB, (end - 1) // MIB + 1)}


def settled(proxy) -> None:
    """Wait until the proxy has seen the last response bytes go by."""
    last = -1
    while proxy.server_bytes != last:
        last = proxy.server_bytes
        time.sleep(0.05)


def fetched_blocks(proxy, ciphertext_length: int) -> set[int]:
    """Blocks that the recorded ranges are made of; fails on a range that is not exactly
    the AGS1 header or a run of whole blocks."""
    blocks: set[int] = set()
    for first, last in proxy.ranges:
        if (first, last) == (0, ags1.HEADER_LENGTH - 1):
            continue
        assert (first - ags1.HEADER_LENGTH) % CBS == 0, (first, last)
        index = (first - ags1.HEADER_LENGTH) // CBS
        end = index
        while block_range(end, ciphertext_length)[1] < last:
            end += 1
        assert block_range(end, ciphertext_length)[1] == last, (first, last)
        blocks.update(range(index, end + 1))
    return blocks


def test_small_range_read_fetches_only_its_block(s3, s3_proxy, manager):
    fs, bucket = s3
    efs = EncryptedFileSystem.wrap(fs, manager)
    data = os.urandom(6 * MIB + 12345)
    path = f"{bucket}/blob.bin"
    with efs.open_output_stream(path) as out:
        out.write(data)
    length = efs.handler.key_metadata(path).file_length
    assert length == ags1.ciphertext_length(len(data))
    settled(s3_proxy)
    s3_proxy.reset()

    offset = 4 * MIB + 1000
    with efs.open_input_file(path) as f:
        assert f.size() == len(data)
        assert f.read_at(100, offset) == data[offset : offset + 100]
    settled(s3_proxy)

    assert sorted(s3_proxy.ranges) == [(0, 7), block_range(0, length), block_range(4, length)]
    body = ags1.HEADER_LENGTH + 2 * CBS
    assert body <= s3_proxy.server_bytes <= body + HTTP_OVERHEAD * s3_proxy.request_count
    assert s3_proxy.server_bytes < length / 3


def test_parquet_column_projection_fetches_only_covering_blocks(s3, s3_proxy, manager):
    fs, bucket = s3
    efs = EncryptedFileSystem.wrap(fs, manager)
    rows = 200_000
    # plain int64 without compression or dictionary: 8 bytes a value, 1.6 MB a column
    table = pa.table({name: pa.array(range(i * rows, (i + 1) * rows), pa.int64()) for i, name in enumerate("abcdefghij")})
    path = f"{bucket}/t.parquet"
    pq.write_table(table, path, filesystem=efs, compression="none", row_group_size=rows, use_dictionary=False)
    length = efs.handler.key_metadata(path).file_length
    size = ags1.plaintext_length(length)
    assert size > 15 * MIB
    meta = pq.ParquetFile(path, filesystem=efs).metadata
    chunk = meta.row_group(0).column(3)  # column "d"
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    # What Arrow reads: the file's tail (footer, up to 64 KiB) and the column chunk.
    wanted = [(max(0, size - 65536), size), (start, start + chunk.total_compressed_size)]
    allowed = covering_blocks(wanted) | {0}
    assert len(allowed) <= ags1.plaintext_length(length) // MIB // 2  # most blocks hold other columns
    settled(s3_proxy)
    s3_proxy.reset()

    got = pq.read_table(path, filesystem=efs, columns=["d"])
    settled(s3_proxy)

    assert got.column("d").equals(table.column("d"))
    blocks = fetched_blocks(s3_proxy, length)
    assert blocks <= allowed, f"fetched blocks {sorted(blocks - allowed)} that hold nothing Arrow asked for"
    assert covering_blocks([wanted[1]]) <= blocks
    # (pyarrow opens the file twice, to read the schema and then the data: each reader
    # fetches the header, block 0 and the footer's block again)
    body = sum(last - first + 1 for first, last in s3_proxy.ranges)
    assert body <= s3_proxy.server_bytes <= body + HTTP_OVERHEAD * s3_proxy.request_count, s3_proxy.ranges


def test_round_trip_and_dataset_and_manifest_on_s3(s3, manager, kms):
    fs, bucket = s3
    efs = EncryptedFileSystem.wrap(fs, manager)
    table = pa.table({"k": [i % 2 for i in range(10_000)], "v": list(range(10_000))})
    ds.write_dataset(table, f"{bucket}/ds", filesystem=efs, format="parquet", partitioning=["k"],
                     partitioning_flavor="hive")
    for key in efs.handler.written_keys():
        with fs.open_input_stream(key) as raw:
            assert raw.read(4) == b"AGS1"
    got = ds.dataset(f"{bucket}/ds", filesystem=efs, format="parquet", partitioning="hive").to_table()
    assert got.select(["v"]).sort_by("v").column("v").to_pylist() == list(range(10_000))
    # the key manifest goes to the base filesystem (S3), and reopens the data there
    efs.handler.save_key_manifest(f"{bucket}/keys.json")
    keys = read_key_manifest(f"{bucket}/keys.json", kms, filesystem=fs)
    assert keys == efs.handler.written_keys()
    reader = EncryptedFileSystem.wrap(fs, keys=keys)
    again = ds.dataset(f"{bucket}/ds", filesystem=reader, format="parquet", partitioning="hive").to_table()
    assert again.sort_by("v").equals(got.sort_by("v"))


def test_failed_stream_leaves_no_object(s3, manager):
    fs, bucket = s3
    efs = EncryptedFileSystem.wrap(fs, manager)
    path = f"{bucket}/dropped.bin"
    out = efs.open_output_stream(path)
    out.write(os.urandom(3 * MIB))
    with pytest.warns(ResourceWarning, match="dropped.bin"):
        del out
        gc.collect()
    assert fs.get_file_info(path).type == pafs.FileType.NotFound
    assert efs.handler.written_keys() == {}

"""Fuzz harness: Puffin files and deletion vectors (``read_dv_blob`` over the decrypted
Puffin file, ``decode_deletion_vector`` of the read path, and ``decode_dv`` of the
writer, which reads the previous vector when it merges deletes).

Input: ``mode | offset (4) | size (4) | cardinality (4) | payload``.  Mode 0: the
payload is a Puffin file's plaintext, sealed under a fixed key and read back with
``read_dv_blob(offset, size)`` (positions in the decrypted file, as the manifest gives
them), then decoded with the manifest's cardinality; mode 1: the payload is a
``deletion-vector-v1`` blob for ``decode_deletion_vector``; mode 2: the same for the
writer's ``decode_dv``.  Seeds: the decrypted Puffin file of the Java table
``enc_deletes_dek16`` (``../shared/tables``) and its blob, and vectors encoded here
(array, bitmap and run containers, several 32-bit keys), and crafted run containers
(overlapping, unsorted, adjacent, past the container, inconsistent cardinalities, a
container count of 2^32 - 1).

Oracle: only ``icecrypt.DecryptionError`` (``FormatError``) may be raised; never
another exception, no hang; ``read_dv_blob`` returns exactly the plaintext bytes of
the range; a decoded vector is strictly increasing, non-negative, has the manifest's
cardinality when one is given, and re-encodes (``encode_dv``) to a blob both decoders
read back to the same positions.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pyarrow.fs as pafs

from fuzzlib import Finding, Input, fixed_bytes, table_plaintexts, write_file

from icecrypt import DecryptionError, ags1
from icecrypt.keys import StandardKeyMetadata
from icecrypt.table.files.deletes import DV_MAGIC, decode_deletion_vector, read_dv_blob
from icecrypt.table.files.write_dv import DeletionVector, decode_dv, encode_dv, puffin_file

ALLOWED = (DecryptionError,)
KEY = fixed_bytes("puffin-key", 16)
AAD = fixed_bytes("puffin-aad", 16)
_FS = pafs.LocalFileSystem()


def _head(mode: int, offset: int, size: int, cardinality: int) -> bytes:
    return bytes((mode,)) + struct.pack("<III", offset, size, cardinality)


def seeds() -> list[bytes]:
    out = []
    for plain, offset, size, count in table_plaintexts()["puffin"]:
        out.append(_head(0, offset, size, count + 1) + plain)
        out.append(_head(1, 0, 0, count + 1) + plain[offset : offset + size])
        out.append(_head(2, 0, 0, 0) + plain[offset : offset + size])
    vectors = [
        np.array([0, 5, 7], dtype=np.int64),
        np.arange(0, 20000, 2, dtype=np.int64),  # a bitmap container
        np.arange(100, 70000, dtype=np.int64),  # runs
        np.array([1, (1 << 32) + 3, (5 << 32) + 9], dtype=np.int64),  # several keys
        np.zeros(0, dtype=np.int64),
    ]
    for positions in vectors:
        blob = encode_dv(positions)
        out.append(_head(1, 0, 0, len(positions) + 1) + blob)
        out.append(_head(2, 0, 0, 0) + blob)
    for bitmap in _crafted_bitmaps():
        out.append(_head(1, 0, 0, 0) + _blob(bitmap))
        out.append(_head(2, 0, 0, 0) + _blob(bitmap))
    data, placements = puffin_file([DeletionVector("s3://b/t/data/f.parquet", vectors[0])])
    p = placements[0]
    out.append(_head(0, p.offset, p.length, 4) + data)
    return out


def _blob(bitmap: bytes, key: int = 0) -> bytes:
    """A ``deletion-vector-v1`` blob (valid length and CRC) of one 32-bit bitmap."""
    body = DV_MAGIC + struct.pack("<Q", 1) + struct.pack("<I", key) + bitmap
    return struct.pack(">I", len(body)) + body + struct.pack(">I", zlib.crc32(body))


def _run_bitmap(runs: list[tuple[int, int]], cardinality: int) -> bytes:
    """A portable bitmap of one run container with the given (start, length - 1) runs
    and declared cardinality (which need not match them)."""
    return (struct.pack("<I", 12347) + b"\x01" + struct.pack("<HH", 0, cardinality - 1)
            + struct.pack("<H", len(runs)) + b"".join(struct.pack("<HH", *r) for r in runs))


def _crafted_bitmaps() -> list[bytes]:
    """Run containers as an attacker writes them: overlapping whole-container runs (a
    291-byte vector asked for 81 MiB), unsorted and adjacent runs, a run past the
    container, a cardinality that does not add up, a huge container count."""
    return [
        _run_bitmap([(0, 0xFFFF)] * 64, 65536),
        _run_bitmap([(100, 9), (10, 9)], 20),
        _run_bitmap([(10, 9), (20, 9)], 20),
        _run_bitmap([(65530, 9)], 10),
        _run_bitmap([(10, 9)], 5),
        _run_bitmap([(0, 0xFFFF)], 65536),
        struct.pack("<II", 12346, 0xFFFFFFFF),
    ]


def _check_vector(positions: np.ndarray, cardinality: int | None, what: str) -> None:
    if positions.dtype != np.int64:
        raise Finding(f"{what}: positions of dtype {positions.dtype}")
    if len(positions) and (positions[0] < 0 or np.any(np.diff(positions) <= 0)):
        raise Finding(f"{what}: positions are not strictly increasing and non-negative")
    if cardinality is not None and len(positions) != cardinality:
        raise Finding(f"{what}: {len(positions)} positions, the manifest says {cardinality}")
    blob = encode_dv(positions)
    if not np.array_equal(decode_deletion_vector(blob, "re-encoded"), positions):
        raise Finding(f"{what}: the re-encoded vector reads back differently (read path)")
    if not np.array_equal(decode_dv(blob), positions):
        raise Finding(f"{what}: the re-encoded vector reads back differently (writer)")


def check(data: bytes) -> None:
    inp = Input(data)
    mode = inp.u8() % 3
    offset, size, cardinality = inp.u32() % (1 << 20), inp.u32() % (1 << 20), inp.u32()
    expected = None if cardinality == 0 else cardinality - 1
    payload = inp.rest()
    if mode == 1:
        _check_vector(decode_deletion_vector(payload, "fuzz", expected_cardinality=expected), expected, "read path")
        return
    if mode == 2:
        _check_vector(decode_dv(payload, name="fuzz"), None, "writer")
        return
    ciphertext = ags1.encrypt(payload, KEY, AAD)
    path = write_file("fuzz.puffin", ciphertext)
    with _FS.open_input_file(path) as source:
        blob = read_dv_blob(source, offset, size, key=StandardKeyMetadata(KEY, AAD, len(ciphertext)), name="fuzz")
    if blob != payload[offset : offset + size]:
        raise Finding(f"read_dv_blob({offset}, {size}) returned other bytes than the plaintext holds")
    _check_vector(decode_deletion_vector(blob, "fuzz", expected_cardinality=expected), expected, "puffin")

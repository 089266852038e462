"""Deletion vectors (Iceberg v3) in Puffin files, laid out byte for byte as Iceberg Java
writes them (``BaseDVFileWriter`` / ``PuffinWriter``; compared with the DV in
``../shared/tables/enc_deletes_dek16`` by a test).

Puffin file (positions are in the *decrypted* file; the whole file is then AGS1)::

    "PFA1" | blob ... | "PFA1" | footer JSON | int32 LE footer length | 4 flag bytes (0) | "PFA1"

Blob of type ``deletion-vector-v1``::

    int32 BE len(magic + bitmap) | D1 D3 39 64 | bitmap | int32 BE CRC-32(magic + bitmap)

where the bitmap is a 64-bit Roaring bitmap in the "portable" layout: uint64 LE number of
32-bit buckets, then per bucket (ascending high 32 bits) uint32 LE key and the 32-bit
bitmap in CRoaring's portable format, run-length optimised first as Java does.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pyroaring

from icecrypt import __version__
from icecrypt.table.files.deletes import decode_deletion_vector

__all__ = ["DV_MAGIC", "PUFFIN_MAGIC", "DeletionVector", "decode_dv", "encode_dv", "puffin_file"]

PUFFIN_MAGIC = b"PFA1"
DV_MAGIC = bytes.fromhex("d1d33964")
DV_BLOB_TYPE = "deletion-vector-v1"
#: Java's MetadataColumns.ROW_POSITION field id, the "fields" of every DV blob
ROW_POSITION_FIELD_ID = 2147483645


def encode_dv(positions: Iterable[int] | np.ndarray) -> bytes:
    """The ``deletion-vector-v1`` blob for these row positions (any order, no repeats
    needed)."""
    if not isinstance(positions, np.ndarray):
        positions = np.fromiter(positions, dtype=np.int64)
    array = np.unique(positions.astype(np.int64, copy=False))
    if array.size and array[0] < 0:
        raise ValueError("row positions must not be negative")
    highs = array >> 32
    parts = [struct.pack("<Q", 0)]
    buckets = 0
    for key in np.unique(highs):
        lows = (array[highs == key] & 0xFFFFFFFF).astype(np.uint32)
        bitmap = pyroaring.BitMap(lows)
        bitmap.run_optimize()
        parts.append(struct.pack("<I", int(key)))
        parts.append(bitmap.serialize())
        buckets += 1
    parts[0] = struct.pack("<Q", buckets)
    body = DV_MAGIC + b"".join(parts)
    return struct.pack(">I", len(body)) + body + struct.pack(">I", zlib.crc32(body))


def decode_dv(blob: bytes, *, name: str = "deletion vector", expected_cardinality: int | None = None) -> np.ndarray:
    """Row positions (sorted int64) of a ``deletion-vector-v1`` blob, decoded and checked
    as the read path does (:func:`icecrypt.table.files.deletes.decode_deletion_vector`:
    sizes before allocations, run order and overlap, cardinalities); FormatError naming
    ``name`` otherwise."""
    return decode_deletion_vector(bytes(blob), name, expected_cardinality=expected_cardinality)


@dataclass(frozen=True)
class DeletionVector:
    """The deleted positions of one data file."""

    referenced_data_file: str
    positions: np.ndarray  # sorted, unique int64


@dataclass(frozen=True)
class BlobPlacement:
    """Where a blob landed in the (decrypted) Puffin file."""

    offset: int
    length: int
    cardinality: int


def puffin_file(vectors: Sequence[DeletionVector]) -> tuple[bytes, list[BlobPlacement]]:
    """A Puffin file holding one ``deletion-vector-v1`` blob per vector, and each blob's
    offset and length (the manifest entry's ``content_offset`` /
    ``content_size_in_bytes``)."""
    out = bytearray(PUFFIN_MAGIC)
    placements = []
    footer_blobs = []
    for vector in vectors:
        blob = encode_dv(vector.positions)
        placement = BlobPlacement(len(out), len(blob), len(vector.positions))
        out += blob
        placements.append(placement)
        footer_blobs.append({
            "type": DV_BLOB_TYPE,
            "fields": [ROW_POSITION_FIELD_ID],
            "snapshot-id": -1,
            "sequence-number": -1,
            "offset": placement.offset,
            "length": placement.length,
            "properties": {
                "referenced-data-file": vector.referenced_data_file,
                "cardinality": str(placement.cardinality),
            },
        })  # fmt: skip
    footer = json.dumps(
        {"blobs": footer_blobs, "properties": {"created-by": f"icecrypt {__version__}"}},
        separators=(",", ":"),
        ensure_ascii=False,
    ).encode("utf-8")
    out += PUFFIN_MAGIC + footer + struct.pack("<I", len(footer)) + bytes(4) + PUFFIN_MAGIC
    return bytes(out), placements

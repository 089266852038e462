"""Deletion vectors (portable 64-bit Roaring in a deletion-vector-v1 blob) and the delete
masks, against pyroaring's serializer and the DV Iceberg Java wrote."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyroaring import BitMap

from icecrypt.errors import FormatError
from icecrypt.table.files.deletes import (
    DV_MAGIC,
    decode_deletion_vector,
    deleted_mask,
    equality_delete_mask,
)


def dv_blob(positions, *, optimize: bool = True) -> bytes:
    """A deletion-vector-v1 blob for ``positions`` (pyroaring serializes each 32-bit bitmap)."""
    groups: dict[int, list[int]] = {}
    for p in sorted(set(positions)):
        groups.setdefault(p >> 32, []).append(p & 0xFFFFFFFF)
    vector = struct.pack("<Q", len(groups))
    for key in sorted(groups):
        bitmap = BitMap(groups[key])
        if optimize:
            bitmap.run_optimize()
        vector += struct.pack("<I", key) + bitmap.serialize()
    body = DV_MAGIC + vector
    return struct.pack(">I", len(body)) + body + struct.pack(">I", zlib.crc32(body))


CASES = {
    "empty": [],
    "one": [7],
    "array": list(range(0, 9000, 3)),  # 3000 values in one container: array
    "bitmap": list(range(0, 20000, 2)),  # > 4096 in a container: bitmap
    "runs": list(range(100, 70000)) + [70002],  # run containers across several keys
    "high": [5, (1 << 32) + 1, (3 << 32) + 65536 * 5 + 9],  # several 32-bit bitmaps
    "many containers": [i * 65536 + 1 for i in range(40)],  # >= 4 containers: offset header
    "runs and offsets": list(range(50, 300_000)) + [400_000],  # run cookie with the offset header
}


@pytest.mark.parametrize("positions", CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("optimize", [True, False])
def test_decode_matches_pyroaring(positions, optimize):
    got = decode_deletion_vector(dv_blob(positions, optimize=optimize), "dv", expected_cardinality=len(set(positions)))
    assert got.dtype == np.int64
    assert got.tolist() == sorted(set(positions))


@given(st.lists(st.one_of(st.integers(0, 200_000), st.integers(0, 1 << 34)), max_size=3000))
def test_decode_random_sets(positions):
    assert decode_deletion_vector(dv_blob(positions), "dv").tolist() == sorted(set(positions))


def test_java_deletion_vector(golden):
    """The DV Iceberg Java wrote deletes positions p % 10 == 3 of the alpha file."""
    from icecrypt.table.files.read import _dv_positions

    table = golden("enc_deletes_dek16")
    task = next(t for t in table.scan().plan_files() if t.partition == ("alpha",))
    (dv,) = task.deletes
    positions = _dv_positions(dv, table.filesystem, True)
    assert positions.tolist() == [p for p in range(4000) if p % 10 == 3]


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: b[:-1], "length field"),
        (lambda b: b[:4] + b"\x00" + b[5:], "not a deletion vector"),
        (lambda b: b[:-5] + bytes([b[-5] ^ 1]) + b[-4:], "CRC"),
        (lambda b: b[:3], "too short"),
    ],
    ids=["truncated", "magic", "crc", "short"],
)
def test_damaged_blobs_are_refused(damage, message):
    with pytest.raises(FormatError, match=f"dv.bin: .*{message}"):
        decode_deletion_vector(damage(dv_blob(CASES["runs"])), "dv.bin")


def test_inconsistent_vectors_are_refused():
    blob = dv_blob([1, 2, 3])
    with pytest.raises(FormatError, match="holds 3 positions, the manifest says 4"):
        decode_deletion_vector(blob, "dv", expected_cardinality=4)
    # a valid CRC over a truncated bitmap: the structure itself is checked
    body = DV_MAGIC + struct.pack("<Q", 1) + struct.pack("<I", 0) + BitMap([1, 2, 3]).serialize()[:-2]
    bad = struct.pack(">I", len(body)) + body + struct.pack(">I", zlib.crc32(body))
    with pytest.raises(FormatError, match="truncated"):
        decode_deletion_vector(bad, "dv")
    # keys out of order
    vector = struct.pack("<Q", 2) + struct.pack("<I", 2) + BitMap([1]).serialize() + struct.pack("<I", 1) + BitMap([1]).serialize()
    body = DV_MAGIC + vector
    bad = struct.pack(">I", len(body)) + body + struct.pack(">I", zlib.crc32(body))
    with pytest.raises(FormatError, match="not increasing"):
        decode_deletion_vector(bad, "dv")


def test_deleted_mask():
    positions = np.array([0, 5, 9, 10, 25], dtype=np.int64)
    assert deleted_mask(positions, 0, 10).tolist() == [i not in (0, 5, 9) for i in range(10)]
    assert deleted_mask(positions, 10, 5).tolist() == [False, True, True, True, True]
    assert deleted_mask(positions, 11, 10) is None


def test_equality_mask_single_column_nulls_match_nulls():
    keys = pa.table({"id": pa.array([1, 2, None, 4, 5])})
    deletes = pa.table({"id": pa.array([2, None, 7])})
    assert equality_delete_mask(keys, deletes).tolist() == [False, True, True, False, False]
    no_nulls = pa.table({"id": pa.array([2, 7])})
    assert equality_delete_mask(keys, no_nulls).tolist() == [False, True, False, False, False]


def test_equality_mask_several_columns():
    keys = pa.table({"a": [1, 1, 2, None, None, 3], "b": ["x", "y", "x", "x", None, None]})
    deletes = pa.table({"a": [1, None, 3], "b": ["y", "x", "z"]})
    assert equality_delete_mask(keys, deletes).tolist() == [False, True, False, True, False, False]
    all_null = pa.table({"a": pa.array([None], pa.int64()), "b": pa.array([None], pa.string())})
    assert equality_delete_mask(keys, all_null).tolist() == [False, False, False, False, True, False]
    empty = deletes.slice(0, 0)
    assert not equality_delete_mask(keys, empty).any()


def test_equality_mask_on_uuid_columns():
    """Equality deletes keyed on a uuid column (Arrow's uuid type has no hash or join
    kernel): matched on the 16 bytes, nulls equal nulls, alone and with another column."""
    import uuid

    ids = [uuid.UUID(int=i << 64 | i).bytes for i in range(4)]
    keys = pa.table({"u": pa.array([*ids, None], pa.uuid()), "k": [1, 1, 2, 1, 1]})
    deletes = pa.table({"u": pa.array([ids[2], None, ids[1]], pa.uuid()), "k": [2, 1, 2]})
    assert equality_delete_mask(keys.select(["u"]), deletes.select(["u"])).tolist() == [False, True, True, False, True]
    assert equality_delete_mask(keys, deletes).tolist() == [False, False, True, False, True]

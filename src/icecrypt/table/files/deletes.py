"""Row-level deletes: deletion vectors, position delete files and equality delete files.

Deletion vectors (format v3) are ``deletion-vector-v1`` blobs in Puffin files.  In an
encrypted table the Puffin file is an AGS1 stream and the blob's ``content_offset`` /
``content_size_in_bytes`` (from the manifest) are positions in the **decrypted** file, so
only the AGS1 blocks holding the blob are decrypted.  A blob is::

    length (4, big endian) = len(magic + vector)
    magic  D1 D3 39 64
    vector: the "portable" 64-bit Roaring format — count (8, LE) of 32-bit bitmaps, each
            preceded by its key (4, LE: the high 32 bits of the positions), in the
            32-bit Roaring portable serialization
    crc    (4, big endian) CRC-32 of magic + vector

Everything is checked (lengths, magic, CRC, key order, container bounds, cardinality
against the manifest's ``record_count``): a damaged vector must not delete the wrong rows.

Position delete files hold ``(file_path, pos)`` rows; equality delete files hold the
values of the ``equality_ids`` columns of deleted rows (nulls match nulls).  In an
encrypted table both are natively encrypted Parquet (or AGS1 Avro).
"""

from __future__ import annotations

import zlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from icecrypt import ags1
from icecrypt.errors import FormatError
from icecrypt.table.model.schema import arrow_storage

__all__ = ["DV_MAGIC", "decode_deletion_vector", "deleted_mask", "equality_delete_mask", "read_dv_blob"]

DV_MAGIC = b"\xd1\xd3\x39\x64"
_SERIAL_COOKIE_NO_RUN = 12346
_SERIAL_COOKIE = 12347
_NO_OFFSET_THRESHOLD = 4
_ARRAY_MAX = 4096
_BITMAP_BYTES = 8192


class _Buffer:
    """Bounds-checked little-endian reads from a bytes object."""

    def __init__(self, data: bytes, name: str):
        self.data = memoryview(data)
        self.pos = 0
        self.name = name

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise FormatError(f"{self.name}: deletion vector truncated in {what}")
        view = self.data[self.pos : self.pos + n]
        self.pos += n
        return view

    def u16s(self, n: int, what: str) -> np.ndarray:
        return np.frombuffer(self.take(2 * n, what), dtype="<u2")

    def u32(self, what: str) -> int:
        return int.from_bytes(self.take(4, what), "little")


def _bitmap32(buf: _Buffer, budget: int | None) -> np.ndarray:
    """One 32-bit Roaring bitmap (portable format) -> sorted uint32 values.

    Every declared size is checked before anything is allocated from it: the container
    count (at most 65,536), each container's cardinality against its kind (an array
    holds at most 4,096 values, a bitmap more), each run container's runs (sorted,
    non-overlapping, inside the container, adding up to the declared cardinality), and
    the running total against ``budget`` (the positions the vector may still hold)."""
    cookie = buf.u32("the bitmap cookie")
    if cookie & 0xFFFF == _SERIAL_COOKIE:
        count = (cookie >> 16) + 1
        flag_bytes = np.frombuffer(buf.take((count + 7) // 8, "run flags"), dtype=np.uint8)
        run_flags = np.unpackbits(flag_bytes, bitorder="little")[:count]
    elif cookie == _SERIAL_COOKIE_NO_RUN:
        count = buf.u32("the container count")
        if count > 1 << 16:
            raise FormatError(f"{buf.name}: Roaring bitmap with {count} containers")
        run_flags = np.zeros(count, dtype=np.uint8)
    else:
        raise FormatError(f"{buf.name}: not a Roaring bitmap (cookie {cookie:#x})")
    header = buf.u16s(2 * count, "container headers").reshape(count, 2) if count else np.zeros((0, 2), "<u2")
    keys = header[:, 0].astype(np.uint32)
    cardinalities = header[:, 1].astype(np.int64) + 1
    if count > 1 and np.any(np.diff(keys.astype(np.int64)) <= 0):
        raise FormatError(f"{buf.name}: Roaring container keys are not increasing")
    declared = int(cardinalities.sum())
    if budget is not None and declared > budget:
        raise FormatError(f"{buf.name}: deletion vector declares more positions than the manifest says it holds")
    if cookie == _SERIAL_COOKIE_NO_RUN or count >= _NO_OFFSET_THRESHOLD:
        buf.take(4 * count, "container offsets")  # a positional index; the containers follow in order
    parts = []
    for i in range(count):
        high = keys[i] << np.uint32(16)
        if run_flags[i]:
            low = _runs(buf, int(cardinalities[i]))
        elif cardinalities[i] > _ARRAY_MAX:
            bits = np.unpackbits(np.frombuffer(buf.take(_BITMAP_BYTES, "a bitmap container"), dtype=np.uint8), bitorder="little")
            low = np.flatnonzero(bits).astype(np.uint32)
            if len(low) != cardinalities[i]:
                raise FormatError(f"{buf.name}: Roaring bitmap container cardinality mismatch")
        else:
            low = buf.u16s(int(cardinalities[i]), "an array container").astype(np.uint32)
            if len(low) > 1 and np.any(np.diff(low.astype(np.int64)) <= 0):
                raise FormatError(f"{buf.name}: Roaring array container is not sorted")
        parts.append(high | low)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint32)


def _runs(buf: _Buffer, cardinality: int) -> np.ndarray:
    """The values of a run container: ``(start, length - 1)`` pairs, checked to be in
    order, apart and inside the container and to add up to ``cardinality`` before the
    values are made (overlapping runs must not make one container ask for more than
    its 65,536 values)."""
    n_runs = int(buf.u16s(1, "a run count")[0])
    runs = buf.u16s(2 * n_runs, "runs").reshape(n_runs, 2).astype(np.int64)
    starts, lengths = runs[:, 0], runs[:, 1] + 1
    ends = starts + lengths  # exclusive
    if np.any(ends > 1 << 16):
        raise FormatError(f"{buf.name}: Roaring run exceeds its container")
    if n_runs > 1 and np.any(starts[1:] < ends[:-1]):
        raise FormatError(f"{buf.name}: Roaring runs are unsorted or overlap")
    total = int(lengths.sum())
    if total != cardinality:
        raise FormatError(f"{buf.name}: Roaring run container cardinality mismatch")
    offsets = np.repeat(starts - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths)
    return (np.arange(total, dtype=np.int64) + offsets).astype(np.uint32)


def decode_deletion_vector(blob: bytes, name: str, *, expected_cardinality: int | None = None) -> np.ndarray:
    """The deleted row positions of a ``deletion-vector-v1`` blob, sorted (int64).

    Raises :class:`~icecrypt.FormatError` naming ``name`` for any inconsistency,
    including a cardinality other than ``expected_cardinality`` (the manifest's
    ``record_count`` of the DV).
    """
    if len(blob) < 12:
        raise FormatError(f"{name}: deletion vector blob of {len(blob)} bytes is too short")
    length = int.from_bytes(blob[:4], "big")
    if length != len(blob) - 8:
        raise FormatError(f"{name}: deletion vector length field {length} does not match the blob ({len(blob)} bytes)")
    body = blob[4 : 4 + length]
    if body[:4] != DV_MAGIC:
        raise FormatError(f"{name}: not a deletion vector (magic {bytes(body[:4]).hex()})")
    crc = int.from_bytes(blob[4 + length :], "big")
    if zlib.crc32(body) != crc:
        raise FormatError(f"{name}: deletion vector CRC mismatch (damaged)")
    buf = _Buffer(bytes(body[4:]), name)
    count = int.from_bytes(buf.take(8, "the bitmap count"), "little")
    parts = []
    last_key = -1
    budget = expected_cardinality
    for _ in range(count):
        key = buf.u32("a bitmap key")
        if key <= last_key or key > 0x7FFFFFFF:
            raise FormatError(f"{name}: deletion vector keys are not increasing or out of range")
        last_key = key
        values = _bitmap32(buf, budget)
        if budget is not None:
            budget -= len(values)
        parts.append((np.int64(key) << np.int64(32)) | values.astype(np.int64))
    if buf.pos != len(buf.data):
        raise FormatError(f"{name}: {len(buf.data) - buf.pos} stray bytes after the deletion vector")
    positions = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    if expected_cardinality is not None and len(positions) != expected_cardinality:
        raise FormatError(
            f"{name}: deletion vector holds {len(positions)} positions, the manifest says {expected_cardinality}"
        )
    return positions


def read_dv_blob(source: object, offset: int, size: int, *, key: object = None, name: str) -> bytes:
    """``size`` bytes at ``offset`` of a Puffin file: of the decrypted stream when
    ``key`` (a StandardKeyMetadata) is given — only the AGS1 blocks holding the range
    are decrypted and authenticated — else of the plain file.  ``source`` is a pyarrow
    NativeFile (random access)."""
    if offset < 0 or size < 0:
        raise FormatError(f"{name}: invalid deletion vector range (offset {offset}, size {size})")
    if key is None:
        stored = source.size()  # type: ignore[attr-defined]
        if offset + size > stored:  # checked before a buffer of ``size`` bytes is made
            raise FormatError(f"{name}: deletion vector range {offset}+{size} is beyond the file ({stored} bytes)")
        data = source.read_at(size, offset)  # type: ignore[attr-defined]
    else:
        with ags1.open_reader(source, key.encryption_key, key.aad_prefix, key.file_length, name=name) as reader:
            if offset + size > reader.size:
                raise FormatError(f"{name}: deletion vector range {offset}+{size} is beyond the file ({reader.size} bytes)")
            data = reader.read_at(offset, size)
    if len(data) != size:
        raise FormatError(f"{name}: deletion vector range {offset}+{size} is beyond the file")
    return data


def deleted_mask(positions: np.ndarray, start: int, count: int) -> np.ndarray | None:
    """Keep-mask (True = keep) for rows ``start .. start+count-1`` given sorted deleted
    ``positions``; None when nothing in the range is deleted."""
    lo, hi = np.searchsorted(positions, [start, start + count])
    if lo == hi:
        return None
    mask = np.ones(count, dtype=bool)
    mask[positions[lo:hi] - start] = False
    return mask


def equality_delete_mask(keys: pa.Table, deletes: pa.Table) -> np.ndarray:
    """True for rows of ``keys`` whose values equal (nulls equal nulls) some row of
    ``deletes``; both tables hold the same columns in the same order and types."""
    n = keys.num_rows
    if deletes.num_rows == 0 or n == 0:
        return np.zeros(n, dtype=bool)
    # a uuid key compares as its 16 bytes (Arrow hashes and joins no extension type)
    keys = pa.table([arrow_storage(c) for c in keys.columns], names=keys.column_names)
    deletes = pa.table([arrow_storage(c) for c in deletes.columns], names=deletes.column_names)
    if keys.num_columns == 1:
        hit = pc.is_in(keys.column(0), value_set=deletes.column(0).combine_chunks().unique(), skip_nulls=False)
        return hit.to_numpy(zero_copy_only=False).astype(bool, copy=False)
    left, right, key_names = _null_safe_keys(keys, deletes)
    left = left.append_column("__row", pa.array(np.arange(n, dtype=np.int64)))
    joined = left.join(right.group_by(key_names).aggregate([]), keys=key_names, join_type="left semi")
    result = np.zeros(n, dtype=bool)
    result[joined.column("__row").to_numpy()] = True
    return result


def _null_safe_keys(keys: pa.Table, deletes: pa.Table) -> tuple[pa.Table, pa.Table, list[str]]:
    """Join keys under which null equals null: per column an "is null" flag, and the
    values with nulls replaced by one placeholder taken from either side (a column that
    is null on both sides is keyed by its flag alone)."""
    left: dict[str, pa.ChunkedArray] = {}
    right: dict[str, pa.ChunkedArray] = {}
    for i, (a, b) in enumerate(zip(keys.columns, deletes.columns)):
        left[f"n{i}"], right[f"n{i}"] = pc.is_null(a), pc.is_null(b)
        present = a.drop_null() if len(a.drop_null()) else b.drop_null()
        if len(present) == 0:
            continue
        placeholder = present[0]
        left[f"v{i}"] = pc.fill_null(a, placeholder) if a.null_count else a
        right[f"v{i}"] = pc.fill_null(b, placeholder) if b.null_count else b
    names = list(left)
    return pa.table(left), pa.table(right), names

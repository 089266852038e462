"""Authenticate the modules of an encrypted Parquet file that Arrow never reads.

Reading every row group decrypts the footer and every page, but Arrow does not read a
column chunk's page index (``ColumnIndex``, ``OffsetIndex``) nor its bloom filter.
parquet-java writes both encrypted and reads them when a filter is pushed, so a tampered
page index makes Java's filtered reads fail.  :func:`authenticate_modules` decrypts the
footer itself and checks the GCM tag of each of those modules (and the leading magic),
so that ``verify()`` reports such damage as Java would meet it.

Module AADs follow the Parquet encryption spec: the file AAD (the key metadata's AAD
prefix and the ``aad_file_unique`` stored in the file), then the module type (one byte),
the row group ordinal and the column ordinal (two bytes each, little endian).  Only the
footer-key (uniform) encryption Iceberg writes is accepted; every problem raises
:class:`~icecrypt.FormatError` or :class:`~icecrypt.AuthenticationError` naming the file.
"""

from __future__ import annotations

import struct
from typing import Any

from icecrypt._gcm import GcmKey
from icecrypt.errors import AuthenticationError, FormatError
from icecrypt.keys import StandardKeyMetadata

__all__ = ["authenticate_modules"]

MAGIC = b"PARE"
_FOOTER, _COLUMN_INDEX, _OFFSET_INDEX, _BLOOM_HEADER, _BLOOM_BITSET = 0, 6, 7, 8, 9
_MAX_DEPTH = 32
_MAX_ORDINAL = 32767  # row group and column ordinals are 2-byte signed in module AADs


class _Malformed(Exception):
    pass


class _Compact:
    """A reader of Thrift's compact protocol: structs become ``{field id: value}``."""

    def __init__(self, data: bytes, pos: int = 0):
        self.data = data
        self.pos = pos

    def _take(self, n: int) -> bytes:
        end = self.pos + n
        if n < 0 or end > len(self.data):
            raise _Malformed("ends inside a value")
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def varint(self) -> int:
        value = shift = 0
        while shift < 70:
            byte = self._take(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
        raise _Malformed("a varint longer than 10 bytes")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def value(self, ctype: int, depth: int) -> Any:
        if depth > _MAX_DEPTH:
            raise _Malformed("nested too deeply")
        if ctype in (1, 2):  # booleans: a list element is one byte, a field's value is its type
            return ctype == 1
        if ctype == 3:
            return self._take(1)[0]
        if ctype in (4, 5, 6):
            return self.zigzag()
        if ctype == 7:
            return struct.unpack("<d", self._take(8))[0]
        if ctype == 8:
            return self._take(self.varint())
        if ctype in (9, 10):
            head = self._take(1)[0]
            size, etype = head >> 4, head & 0x0F
            if size == 15:
                size = self.varint()
            if size > len(self.data) - self.pos:  # each element takes at least a byte
                raise _Malformed("a list longer than its bytes")
            return [self._element(etype, depth + 1) for _ in range(size)]
        if ctype == 11:
            size = self.varint()
            if not size:
                return {}
            if 2 * size > len(self.data) - self.pos:
                raise _Malformed("a map longer than its bytes")
            types = self._take(1)[0]
            if types >> 4 in (9, 10, 11, 12):
                raise _Malformed("a map keyed by a container")
            return {self._element(types >> 4, depth + 1): self._element(types & 0x0F, depth + 1) for _ in range(size)}
        if ctype == 12:
            return self.struct(depth + 1)
        raise _Malformed(f"unknown type {ctype}")

    def _element(self, etype: int, depth: int) -> Any:
        if etype in (1, 2):
            return self._take(1)[0] == 1
        return self.value(etype, depth)

    def struct(self, depth: int = 0) -> dict[int, Any]:
        fields: dict[int, Any] = {}
        last = 0
        while True:
            head = self._take(1)[0]
            if head == 0:
                return fields
            delta, ctype = head >> 4, head & 0x0F
            last = last + delta if delta else self.zigzag()
            fields[last] = self.value(ctype, depth)


def _int(fields: dict[int, Any], fid: int) -> int | None:
    value = fields.get(fid)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class _File:
    def __init__(self, source: Any, name: str, size: int, key: GcmKey, file_aad: bytes):
        self.source = source
        self.name = name
        self.size = size
        self.key = key
        self.file_aad = file_aad

    def read(self, offset: int, length: int, what: str) -> bytes:
        if offset < 4 or length < 4 or offset + length > self.size:
            raise FormatError(f"{self.name}: {what} lies outside the file ({offset}+{length} of {self.size} bytes)")
        data = self.source.read_at(length, offset)
        if len(data) != length:
            raise FormatError(f"{self.name}: {what} is truncated")
        return bytes(data)

    def open(self, module: bytes, suffix: bytes, what: str) -> bytes:
        """Decrypt one ``length(4) ‖ nonce ‖ ciphertext ‖ tag`` module; it must fill ``module``."""
        if len(module) < 4:
            raise FormatError(f"{self.name}: {what}: {len(module)} bytes cannot hold a module")
        (length,) = struct.unpack_from("<I", module)
        if length + 4 != len(module):
            raise FormatError(f"{self.name}: {what}: a module of {length} bytes in {len(module) - 4}")
        try:
            return self.key.open(memoryview(module)[4:], self.file_aad + suffix)
        except AuthenticationError:
            raise AuthenticationError(
                f"{self.name}: {what}: GCM tag check failed: wrong key or AAD prefix, or tampered data"
            ) from None
        except FormatError as exc:
            raise FormatError(f"{self.name}: {what}: {exc}") from None


def _suffix(module: int, row_group: int, column: int) -> bytes:
    return struct.pack("<Bhh", module, row_group, column)


def authenticate_modules(source: Any, km: StandardKeyMetadata, name: str) -> int:
    """Check the leading magic and the GCM tag of every page-index and bloom-filter
    module of the encrypted-footer Parquet file ``source`` (a pyarrow random-access file);
    returns how many modules were checked."""
    size = source.size()
    if size < 12:
        raise FormatError(f"{name}: {size} bytes cannot hold an encrypted Parquet file")
    head, tail = bytes(source.read_at(4, 0)), bytes(source.read_at(8, size - 8))
    if head != MAGIC or tail[4:] != MAGIC:
        raise FormatError(f"{name}: not an encrypted-footer Parquet file (no PARE magic at both ends)")
    (length,) = struct.unpack_from("<I", tail)
    if length + 12 > size:
        raise FormatError(f"{name}: a footer of {length} bytes in a file of {size}")
    region = bytes(source.read_at(length, size - 8 - length))
    try:
        reader = _Compact(region)
        crypto = reader.struct()
        footer_start = reader.pos
    except _Malformed as exc:
        raise FormatError(f"{name}: the file's crypto metadata is malformed: {exc}") from None
    algorithm = crypto.get(1)
    gcm = algorithm.get(1) if isinstance(algorithm, dict) else None
    if not isinstance(gcm, dict):
        raise FormatError(f"{name}: the file is not encrypted with AES_GCM_V1")
    stored = gcm.get(1)  # Iceberg does not store the prefix; a stored one must be the key metadata's
    if stored is not None and stored != (km.aad_prefix or b""):
        raise FormatError(f"{name}: the AAD prefix stored in the file is not the key metadata's")
    unique = gcm.get(2)
    file_aad = (km.aad_prefix or b"") + (unique if isinstance(unique, bytes) else b"")
    file = _File(source, name, size, GcmKey(km.encryption_key), file_aad)
    plain = file.open(region[footer_start:], bytes([_FOOTER]), "the footer")
    try:
        metadata = _Compact(plain).struct()
    except _Malformed as exc:
        raise FormatError(f"{name}: the footer is malformed: {exc}") from None
    return sum(_row_group(file, group, index) for index, group in enumerate(_list(metadata, 4, name, "row groups")))


def _list(fields: dict[int, Any], fid: int, name: str, what: str) -> list[Any]:
    value = fields.get(fid, [])
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise FormatError(f"{name}: the footer's {what} are malformed")
    return value


def _row_group(file: _File, group: dict[int, Any], index: int) -> int:
    ordinal = _int(group, 7)
    ordinal = index if ordinal is None else ordinal
    chunks = _list(group, 1, file.name, "column chunks")
    if not 0 <= ordinal <= _MAX_ORDINAL or len(chunks) > _MAX_ORDINAL + 1:
        raise FormatError(f"{file.name}: row group {ordinal} of {len(chunks)} columns is beyond what encryption allows")
    checked = 0
    for column, chunk in enumerate(chunks):
        meta = chunk.get(3)
        path = meta.get(3) if isinstance(meta, dict) else None
        named = isinstance(path, list) and all(isinstance(p, bytes) for p in path)
        label = ".".join(p.decode("utf-8", "replace") for p in path) if named else str(column)
        where = f"column {label!r} of row group {ordinal}"
        crypto = chunk.get(8)
        if crypto is None:
            from icecrypt.table.files.io import PlaintextFileError

            raise PlaintextFileError(f"{file.name}: {where} is not encrypted")
        if not isinstance(crypto, dict) or 1 not in crypto:
            raise FormatError(f"{file.name}: {where} is encrypted with a column key; Iceberg uses the footer key only")
        for offset_field, length_field, module, what in (
            (6, 7, _COLUMN_INDEX, "column index"),
            (4, 5, _OFFSET_INDEX, "offset index"),
        ):
            offset, length = _int(chunk, offset_field), _int(chunk, length_field)
            if offset is None and length is None:
                continue
            if offset is None or length is None:
                raise FormatError(f"{file.name}: the {what} of {where} has an offset or a length, not both")
            label_what = f"the {what} of {where}"
            file.open(file.read(offset, length, label_what), _suffix(module, ordinal, column), label_what)
            checked += 1
        bloom = _int(meta, 14) if isinstance(meta, dict) else None
        if bloom is not None:
            checked += _bloom_filter(file, bloom, _int(meta, 15), ordinal, column, f"the bloom filter of {where}")
    return checked


def _bloom_filter(file: _File, offset: int, total: int | None, ordinal: int, column: int, what: str) -> int:
    """Check the header and bitset modules at ``offset`` (``total``: the footer's length of both)."""
    (head_length,) = struct.unpack("<I", file.read(offset, 4, what))
    header = file.open(file.read(offset, head_length + 4, what), _suffix(_BLOOM_HEADER, ordinal, column), what)
    try:
        num_bytes = _int(_Compact(header).struct(), 1)
    except _Malformed as exc:
        raise FormatError(f"{file.name}: {what}: malformed header: {exc}") from None
    start = offset + 4 + head_length
    (bits_length,) = struct.unpack("<I", file.read(start, 4, what))
    bitset = file.open(file.read(start, bits_length + 4, what), _suffix(_BLOOM_BITSET, ordinal, column), what)
    if num_bytes is None or len(bitset) != num_bytes:
        raise FormatError(f"{file.name}: {what}: {len(bitset)} bytes of bitset, the header says {num_bytes}")
    if total is not None and total != 8 + head_length + bits_length:
        raise FormatError(f"{file.name}: {what}: {8 + head_length + bits_length} bytes, the footer says {total}")
    return 2

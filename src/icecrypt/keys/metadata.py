"""StandardKeyMetadata: the key, AAD prefix and length of one encrypted file (SPEC.md §2).

Wire form, as Iceberg Java writes it: one version byte ``0x01`` followed by the Avro
binary encoding of the record ``{encryption_key: bytes, aad_prefix: [null, bytes],
file_length: [null, long]}`` — no Avro header, no fingerprint, zigzag varints, unions
with ``null`` first.

Decoding is at least as strict as Java's, with one deliberate extension: blobs written by
Iceberg 1.10 and earlier use the same version byte with only the first two fields.  Java
1.11 fails on them; :meth:`StandardKeyMetadata.decode` reads them (see
:func:`_decode`).  Like Java, bytes after a complete datum are ignored.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from icecrypt.errors import FormatError

__all__ = ["StandardKeyMetadata", "VERSION"]

#: the only version byte Iceberg has defined (StandardKeyMetadata V1)
VERSION = 1

_LONG_MIN = -(1 << 63)
_LONG_MAX = (1 << 63) - 1


def _as_bytes(value: Any, what: str) -> bytes:
    if isinstance(value, str):
        raise TypeError(f"{what} must be bytes-like, not str")
    try:
        return bytes(memoryview(value))
    except TypeError:
        raise TypeError(f"{what} must be bytes-like, not {type(value).__name__}") from None


def _check_file_length(length: Any) -> None:
    if length is not None:
        if isinstance(length, bool) or not isinstance(length, int):
            raise TypeError(f"file_length must be an int or None, not {type(length).__name__}")
        if not _LONG_MIN <= length <= _LONG_MAX:
            raise ValueError(f"file_length {length} does not fit in a signed 64-bit long")


@dataclasses.dataclass(frozen=True, repr=False)
class StandardKeyMetadata:
    """Iceberg's per-file key metadata: encryption key, AAD prefix and stored length.

    ``encryption_key`` is the data encryption key (DEK).  Any length is accepted here, as
    Java accepts any on decode; the ciphers reject lengths other than 16, 24 and 32 when
    the key is used, and :meth:`icecrypt.keys.EncryptionManager.new_file_key` only makes
    those.  ``aad_prefix`` is ``None`` when absent (a zero-length prefix is kept as
    ``b""``: it encodes differently).  ``file_length`` is the ciphertext length of the
    file, a signed 64-bit integer or ``None``.

    The object is immutable and compares by value.  Its repr shows the key length, the
    AAD prefix length and the file length, never key bytes.
    """

    encryption_key: bytes
    aad_prefix: bytes | None = None
    file_length: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "encryption_key", _as_bytes(self.encryption_key, "encryption_key"))
        if self.aad_prefix is not None:
            object.__setattr__(self, "aad_prefix", _as_bytes(self.aad_prefix, "aad_prefix"))
        _check_file_length(self.file_length)

    @property
    def key_length(self) -> int:
        """Length of the encryption key in bytes."""
        return len(self.encryption_key)

    def with_file_length(self, file_length: int | None) -> StandardKeyMetadata:
        """A copy with ``file_length`` set (Java's ``copyWithLength``)."""
        if file_length == self.file_length and type(file_length) is type(self.file_length):
            return self
        _check_file_length(file_length)
        # the key and prefix were checked when this object was made: no second pass
        copy = object.__new__(type(self))
        object.__setattr__(copy, "encryption_key", self.encryption_key)
        object.__setattr__(copy, "aad_prefix", self.aad_prefix)
        object.__setattr__(copy, "file_length", file_length)
        return copy

    def encode(self) -> bytes:
        """The version byte and Avro binary datum, byte-identical to Iceberg Java."""
        out = bytearray((VERSION,))
        _write_bytes(out, self.encryption_key)
        if self.aad_prefix is None:
            out.append(0)
        else:
            out.append(2)  # zigzag(1): the union's second branch
            _write_bytes(out, self.aad_prefix)
        if self.file_length is None:
            out.append(0)
        else:
            out.append(2)
            _write_long(out, self.file_length)
        return bytes(out)

    __bytes__ = encode

    @classmethod
    def decode(cls, data: Any) -> StandardKeyMetadata:
        """Parse key metadata bytes; raises :class:`icecrypt.FormatError` on bad input."""
        return _decode(data)[0]

    def __repr__(self) -> str:
        aad = "None" if self.aad_prefix is None else f"<{len(self.aad_prefix)} bytes>"
        return (
            f"StandardKeyMetadata(key_length={self.key_length}, aad_prefix={aad}, "
            f"file_length={self.file_length})"
        )


# --- Avro binary encoding -------------------------------------------------------------


def _write_long(out: bytearray, value: int) -> None:
    n = ((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF  # zigzag
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _write_bytes(out: bytearray, value: bytes) -> None:
    _write_long(out, len(value))
    out += value


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes, pos: int) -> None:
        self.data = data
        self.pos = pos

    def at_end(self) -> bool:
        return self.pos >= len(self.data)

    def read_long(self, field: str, bits: int = 64) -> int:
        # Avro's varint: 7 bits a byte, least significant group first; a long takes at
        # most 10 bytes and 64 bits, an int 5 bytes and 32 bits.  Java silently drops the
        # excess bits of an overlong last byte; no writer produces one, so it is an error.
        n = shift = 0
        while True:
            if self.pos >= len(self.data):
                raise FormatError(f"key metadata is truncated in field {field}")
            b = self.data[self.pos]
            self.pos += 1
            n |= (b & 0x7F) << shift
            if n >> bits:
                raise FormatError(f"key metadata has an out-of-range varint in field {field}")
            if not b & 0x80:
                return (n >> 1) ^ -(n & 1)  # zigzag
            shift += 7
            if shift >= 7 * ((bits + 6) // 7):
                raise FormatError(f"key metadata has an over-long varint in field {field}")

    def read_bytes(self, field: str) -> bytes:
        length = self.read_long(field)
        if length < 0:
            raise FormatError(f"key metadata has a negative length ({length}) in field {field}")
        end = self.pos + length
        if end > len(self.data):
            raise FormatError(
                f"key metadata is truncated in field {field}: "
                f"{length} bytes declared, {len(self.data) - self.pos} present"
            )
        value = self.data[self.pos : end]
        self.pos = end
        return value

    def read_union_branch(self, field: str) -> bool:
        """True when the [null, T] union holds a value, False when it holds null."""
        index = self.read_long(field, bits=32)
        if index not in (0, 1):
            raise FormatError(f"key metadata has union index {index} in field {field} (expected 0 or 1)")
        return index == 1


def _decode(data: Any) -> tuple[StandardKeyMetadata, bool]:
    """Decode key metadata; returns it and whether it used the 1.10 two-field layout.

    The Iceberg <= 1.10 layout (same version byte, no ``file_length`` field) is detected
    by the datum ending exactly after ``aad_prefix``: the three-field layout always has
    at least one more byte there (the ``file_length`` union index), so a blob that ends
    at that point cannot be a complete 1.11 datum, and anything longer is read as 1.11
    (a 1.10 blob never carried trailing bytes).  Such blobs decode with
    ``file_length=None``.
    """
    if type(data) is not bytes:
        if isinstance(data, str):
            raise TypeError("key metadata must be bytes-like, not str")
        data = bytes(memoryview(data))
    fast = _decode_common(data)
    if fast is not None:
        return fast, False
    return _decode_general(data)


def _decode_common(data: bytes) -> StandardKeyMetadata | None:
    """The shape every writer produces (a 1.11 datum whose key, union and length varints
    are one byte each), decoded without the general reader's per-field calls: planning
    decodes one per data file.  None for anything else (including every malformed or
    1.10 input), which :func:`_decode_general` then decodes or rejects precisely; both
    give the same result wherever this one gives any (a test checks it)."""
    size = len(data)
    if size < 4 or data[0] != VERSION:
        return None
    key_varint = data[1]
    if key_varint & 0x81:  # a multi-byte or negative length
        return None
    pos = 2 + (key_varint >> 1)
    if pos >= size:
        return None
    key = data[2:pos]
    branch = data[pos]
    if branch == 2:
        if pos + 1 >= size:
            return None
        aad_varint = data[pos + 1]
        if aad_varint & 0x81:
            return None
        end = pos + 2 + (aad_varint >> 1)
        if end >= size:  # truncated, or the 1.10 layout (no file_length)
            return None
        aad: bytes | None = data[pos + 2 : end]
        pos = end
    elif branch == 0:
        aad = None
        pos += 1
        if pos >= size:
            return None
    else:
        return None
    branch = data[pos]
    if branch == 0:
        file_length = None
    elif branch == 2:
        n = shift = 0
        for pos in range(pos + 1, min(pos + 10, size)):  # at most 9 bytes: 63 bits, in range
            b = data[pos]
            n |= (b & 0x7F) << shift
            if not b & 0x80:
                break
            shift += 7
        else:
            return None
        file_length = (n >> 1) ^ -(n & 1)
    else:
        return None
    km = object.__new__(StandardKeyMetadata)
    object.__setattr__(km, "encryption_key", key)
    object.__setattr__(km, "aad_prefix", aad)
    object.__setattr__(km, "file_length", file_length)
    return km


def _decode_general(data: bytes) -> tuple[StandardKeyMetadata, bool]:
    if not data:
        raise FormatError("key metadata is empty (no version byte)")
    version = data[0]
    if version != VERSION:
        # Java reports bytes >= 0x80 as "end of stream" (a signed-byte quirk) and others
        # as an unknown version; both are errors.
        raise FormatError(f"unsupported key metadata version byte 0x{version:02x} (expected 0x01)")
    reader = _Reader(data, 1)
    key = reader.read_bytes("encryption_key")
    aad = reader.read_bytes("aad_prefix") if reader.read_union_branch("aad_prefix") else None
    if reader.at_end():
        return StandardKeyMetadata(key, aad, None), True
    file_length = reader.read_long("file_length") if reader.read_union_branch("file_length") else None
    return StandardKeyMetadata(key, aad, file_length), False

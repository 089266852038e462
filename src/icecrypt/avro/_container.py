"""Avro object container files inside AGS1: plaintext access, header, blocks, splits.

Private to :mod:`icecrypt.avro`.  An Avro container file (Avro spec "Object Container
Files") is ``"Obj\\x01" || metadata map || sync(16)`` followed by blocks
``count(long) || size(long) || data(size) || sync(16)``.  Inside AGS1 every position
here is a position in the decrypted (plaintext) stream.

The decrypted bytes are read one whole AGS1 block at a time through
:meth:`icecrypt.ags1.Ags1Reader.readinto_at` (the reader decrypts a whole block straight
into our buffer), so which blocks were decrypted is known exactly (:class:`ReadStats`).
Every Avro block is checked (lengths, sync marker) before fastavro sees a byte of it.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import posixpath
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import fastavro

from icecrypt import _gcm, ags1
from icecrypt.errors import FormatError, IcecryptError
from icecrypt.keys import StandardKeyMetadata

MAGIC = b"Obj\x01"
SYNC_SIZE = 16
#: Avro Java's DataFileConstants.DEFAULT_SYNC_INTERVAL: a block is closed once it holds
#: this many bytes.  Iceberg Java writes manifests and data files with it.
DEFAULT_SYNC_INTERVAL = 64000
CODECS = ("null", "deflate", "bzip2", "xz", "snappy", "zstandard", "lz4")

_BLOCK = ags1.PLAIN_BLOCK_SIZE


@dataclasses.dataclass
class ReadStats:
    """Which AGS1 blocks a read decrypted, in the order it decrypted them.

    Pass one to :func:`icecrypt.avro.read_split` (or the other readers) to see how much
    of a file a read touched; a split read decrypts block 0 (the Avro header) and the
    blocks its byte range and its last Avro block live in.
    """

    blocks: list[int] = dataclasses.field(default_factory=list)

    @property
    def blocks_decrypted(self) -> int:
        """Number of AGS1 block decryptions."""
        return len(self.blocks)


# --------------------------------------------------------------------------- opening


def display_name(path: Any) -> str:
    """The file's name for messages."""
    return os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else repr(path)


def coerce_key_metadata(key_metadata: Any, name: str) -> StandardKeyMetadata:
    """A StandardKeyMetadata from the object or its encoded bytes; refuses None (an
    encrypted file is never read as plaintext)."""
    if isinstance(key_metadata, StandardKeyMetadata):
        return key_metadata
    if key_metadata is None:
        raise ValueError(f"{name}: no key metadata given; an encrypted Avro file cannot be read without it")
    if isinstance(key_metadata, (bytes, bytearray, memoryview)):
        try:
            return StandardKeyMetadata.decode(key_metadata)
        except FormatError as exc:
            raise FormatError(f"{name}: malformed key metadata: {exc}") from None
    raise TypeError(f"key_metadata must be StandardKeyMetadata or bytes, not {type(key_metadata).__name__}")


def _is_encrypting_filesystem(filesystem: Any) -> bool:
    from icecrypt._encrypting import is_encrypted_filesystem

    if is_encrypted_filesystem(filesystem):
        return True
    base = getattr(filesystem, "base_fs", None)  # a SubTreeFileSystem over an encrypting one
    return base is not None and _is_encrypting_filesystem(base)


def check_filesystem(filesystem: Any) -> None:
    """Refuse an EncryptedFileSystem: this module encrypts itself (it would encrypt twice)."""
    if filesystem is None:
        return
    if _is_encrypting_filesystem(filesystem):
        raise ValueError(
            "filesystem is an icecrypt EncryptedFileSystem; icecrypt.avro encrypts by itself: "
            "pass the underlying filesystem (EncryptedFileSystem.handler.base)"
        )
    if not hasattr(filesystem, "open_input_file"):
        raise TypeError(f"filesystem must be a pyarrow FileSystem, not {type(filesystem).__name__}")


def _key(key_metadata: StandardKeyMetadata, name: str) -> Any:
    try:
        return _gcm.GcmKey(key_metadata.encryption_key)
    except ValueError as exc:
        raise FormatError(f"{name}: key metadata holds an unusable key: {exc}") from None


class Plaintext:
    """Random access to the decrypted bytes of one AGS1 file, one whole AGS1 block at a
    time (the two most recently used blocks are kept).  For one thread at a time."""

    def __init__(self, path: Any, key_metadata: Any, filesystem: Any = None, stats: ReadStats | None = None):
        self.name = display_name(path)
        km = coerce_key_metadata(key_metadata, self.name)
        check_filesystem(filesystem)
        key = _key(km, self.name)
        self._file = None
        if filesystem is None:
            source: Any = os.fspath(path)
        else:
            source = self._file = filesystem.open_input_file(path)
        try:
            self._reader = ags1.open_reader(source, key, km.aad_prefix, km.file_length, name=self.name)
        except BaseException:
            if self._file is not None:
                self._file.close()
            raise
        self.size: int = self._reader.size
        self._num_blocks = self._reader.num_blocks
        self._init_cache(stats)

    def _init_cache(self, stats: ReadStats | None) -> None:
        # Two decrypted blocks are kept, so that bytes straddling a block boundary (a
        # block header, a sync marker) never make a forward scan decrypt a block twice.
        self._slots: list[list[Any]] = []  # [block index, buffer, length], most recent first
        self._stats = stats

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
        if self._file is not None:
            self._file.close()
        for slot in self._slots:  # decrypted blocks do not outlive the file's reader
            slot[0] = -1
            slot[1].wipe()
        self._slots = []

    def __enter__(self) -> Plaintext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _load(self, index: int, view: memoryview) -> None:
        """Fill ``view`` with plaintext block ``index`` (one decryption of it)."""
        if index == 0 and len(view) > 1:
            # The reader authenticates block 0 into its own block cache on its first read
            # (as Java does); taking the block in two pieces copies from that cache
            # instead of decrypting it a second time.
            self._reader.readinto_at(view[:1], 0)
            self._reader.readinto_at(view[1:], 1)
        else:
            self._reader.readinto_at(view, index * _BLOCK)

    def _block(self, index: int) -> memoryview:
        """Plaintext block ``index``: a view from the start of a bytearray."""
        slots = self._slots
        for i, slot in enumerate(slots):
            if slot[0] == index:
                if i:
                    slots.insert(0, slots.pop(i))
                return memoryview(slot[1])[: slot[2]]
        length = min(_BLOCK, self.size - index * _BLOCK)
        if len(slots) < 2:
            slot = [-1, ags1._PlainBlock(min(_BLOCK, self.size)), 0]  # zeroed when freed
        else:
            slot = slots.pop()  # the least recently used
            slot[0] = -1
        self._load(index, memoryview(slot[1])[:length])
        slot[0], slot[2] = index, length
        slots.insert(0, slot)
        if self._stats is not None:
            self._stats.blocks.append(index)
        return memoryview(slot[1])[:length]

    def truncated(self, pos: int, n: int, what: str) -> FormatError:
        return FormatError(
            f"{self.name}: Avro file is truncated: {what} needs {n} bytes at offset {pos}, "
            f"the file has {self.size} bytes"
        )

    def read(self, pos: int, n: int, what: str = "data") -> bytes:
        """Exactly ``n`` bytes at ``pos``; FormatError if the file ends before."""
        if pos + n > self.size:
            raise self.truncated(pos, n, what)
        index, within = divmod(pos, _BLOCK)
        block = self._block(index)
        if within + n <= len(block):
            return bytes(block[within : within + n])
        parts = []
        while n:
            block = self._block(index)
            take = min(n, len(block) - within)
            parts.append(bytes(block[within : within + take]))
            n -= take
            index, within = index + 1, 0
        return b"".join(parts)

    def peek(self, pos: int, n: int) -> bytes:
        """Up to ``n`` bytes at ``pos`` (fewer at the end of the file)."""
        return self.read(pos, max(0, min(n, self.size - pos)))

    def find(self, marker: bytes, pos: int, end: int) -> int:
        """Offset of the first ``marker`` starting in ``[pos, end)``, or -1."""
        m = len(marker)
        end = min(end, self.size - m + 1)  # a match must fit in the file
        if pos >= end:
            return -1
        tail, tail_pos = b"", pos  # the previous block's last m-1 bytes
        index, within = divmod(pos, _BLOCK)
        while True:
            block = self._block(index)
            base = index * _BLOCK
            if tail:  # a match across the boundary
                hit = (tail + bytes(block[: m - 1])).find(marker)
                if hit >= 0:
                    return tail_pos + hit if tail_pos + hit < end else -1
            hit = block.obj.find(marker, within, min(len(block), end - base + m - 1))
            if hit >= 0:
                return base + hit
            keep = max(within, len(block) - (m - 1))
            tail, tail_pos = bytes(block[keep:]), base + keep
            index, within = index + 1, 0
            if tail_pos >= end or index >= self._num_blocks:
                return -1


class UnencryptedBytes(Plaintext):
    """The same block access over an *unencrypted* file, for measurements only (what
    decryption costs is measured against it through the very same decoder).  Nothing
    public reads a file without a key."""

    def __init__(self, path: Any, filesystem: Any = None, stats: ReadStats | None = None):
        self.name = display_name(path)
        check_filesystem(filesystem)
        self._reader = None
        if filesystem is None:
            self._file = open(os.fspath(path), "rb", buffering=0)  # noqa: SIM115 - closed by close()
            self.size = os.fstat(self._file.fileno()).st_size
        else:
            self._file = filesystem.open_input_file(path)
            self.size = self._file.size()
        self._num_blocks = max(1, -(-self.size // _BLOCK))
        self._init_cache(stats)

    def _load(self, index: int, view: memoryview) -> None:
        self._file.seek(index * _BLOCK)
        got = 0
        while got < len(view):
            n = self._file.readinto(view[got:])
            if not n:
                raise self.truncated(index * _BLOCK, len(view), "a block")
            got += n


class MemoryBytes(Plaintext):
    """The same access over bytes already in memory (a small file decrypted and
    authenticated whole)."""

    def __init__(self, data: bytes, name: str):
        self.name = name
        self._data = data
        self._reader = self._file = None
        self.size = len(data)
        self._num_blocks = max(1, -(-self.size // _BLOCK))
        self._init_cache(None)

    def read(self, pos: int, n: int, what: str = "data") -> bytes:
        if pos + n > self.size:
            raise self.truncated(pos, n, what)
        return self._data[pos : pos + n]

    def find(self, marker: bytes, pos: int, end: int) -> int:
        return self._data.find(marker, pos, min(end, self.size) + len(marker) - 1)


# --------------------------------------------------------------------------- header


def _zigzag(value: int) -> bytes:
    n = (value << 1) ^ (value >> 63)
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def parse_long(data: bytes, pos: int) -> tuple[int, int] | None:
    """A zigzag varint at ``data[pos:]``: (value, next position), or None if ``data``
    ends inside it.  Raises ValueError for a varint longer than 10 bytes."""
    shift = result = 0
    for i in range(pos, min(len(data), pos + 10)):
        b = data[i]
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), i + 1
        shift += 7
    if len(data) - pos >= 10:
        raise ValueError("varint longer than 10 bytes")
    return None


class _Cursor:
    """Reads header fields; ``prefix`` holds the file's first bytes (one block read, not
    one per field), and reads past it go to ``plain``."""

    def __init__(self, plain: Plaintext, pos: int, prefix: bytes = b""):
        self.plain, self.pos, self.prefix = plain, pos, prefix

    def long(self, what: str) -> int:
        prefix = self.prefix
        if self.pos + 10 <= len(prefix) or len(prefix) == self.plain.size:
            data = prefix[self.pos : self.pos + 10]
        else:
            data = self.plain.peek(self.pos, 10)
        try:
            parsed = parse_long(data, 0)
        except ValueError:
            raise FormatError(f"{self.plain.name}: not an Avro file: bad {what} at offset {self.pos}") from None
        if parsed is None:
            raise self.plain.truncated(self.pos, len(data) + 1, what)
        value, used = parsed
        self.pos += used
        return value

    def bytes(self, what: str) -> bytes:
        n = self.long(what)
        if n < 0:
            raise FormatError(f"{self.plain.name}: not an Avro file: negative length of {what} at offset {self.pos}")
        end = self.pos + n
        if end <= len(self.prefix):
            data = self.prefix[self.pos : end]
        else:
            data = self.plain.read(self.pos, n, what)
        self.pos = end
        return data


@dataclasses.dataclass(frozen=True)
class Header:
    """The parsed header of an Avro container file."""

    metadata: dict[str, bytes]
    schema: Any  # the writer schema, JSON-decoded
    codec: str
    sync: bytes
    end: int  # offset of the first block
    raw: bytes | None = dataclasses.field(default=None, repr=False, compare=False)  # the header as stored

    def encode(self, schema: Any = None) -> bytes:
        """The header bytes, with ``schema`` (JSON-able) in place of the writer schema."""
        if schema is None and self.raw is not None:
            return self.raw
        meta = dict(self.metadata)
        if schema is not None:
            meta["avro.schema"] = json.dumps(schema, separators=(",", ":")).encode("utf-8")
        out = bytearray(MAGIC)
        if meta:
            out += _zigzag(len(meta))
            for key, value in meta.items():
                raw = key.encode("utf-8")
                out += _zigzag(len(raw)) + raw + _zigzag(len(value)) + value
        out += _zigzag(0) + self.sync
        return bytes(out)


    def for_decoder(self, schema: Any, codec: str) -> bytes:
        """A header for fastavro's reader of checked blocks: the writer ``schema``
        (JSON-able; the stored one if None), ``codec``, the sync marker and no other
        metadata (read from :attr:`metadata`, not from fastavro)."""
        text = self.metadata["avro.schema"] if schema is None else json.dumps(schema, separators=(",", ":")).encode("utf-8")
        name = codec.encode("ascii")
        return b"".join((MAGIC, b"\x04\x16avro.schema", _zigzag(len(text)), text, b"\x14avro.codec", _zigzag(len(name)), name,
                         b"\x00", self.sync))


def _metadata_from(prefix: bytes, pos: int) -> tuple[dict[str, bytes], int] | None:
    """The header's metadata map parsed from ``prefix`` alone, and where it ends; None
    when it does not end inside ``prefix`` or is malformed (then the checked reader
    parses it and reports)."""
    metadata: dict[str, bytes] = {}
    try:
        while True:
            parsed = parse_long(prefix, pos)
            if parsed is None:
                return None
            count, pos = parsed
            if count == 0:
                return metadata, pos
            if count < 0:
                return None
            key = ""
            for i in range(2 * count):  # key, value, key, value, ...
                parsed = parse_long(prefix, pos)
                if parsed is None or parsed[0] < 0 or parsed[1] + parsed[0] > len(prefix):
                    return None
                n, pos = parsed
                if i % 2:
                    metadata[key] = prefix[pos : pos + n]
                else:
                    key = prefix[pos : pos + n].decode("utf-8")
                pos += n
    except (ValueError, UnicodeDecodeError):
        return None


def read_header(plain: Plaintext) -> Header:
    """Parse and check the header at the start of the file."""
    name = plain.name
    if plain.size < len(MAGIC) or plain.read(0, len(MAGIC)) != MAGIC:
        got = plain.peek(0, len(MAGIC))
        raise FormatError(f"{name}: not an Avro container file (starts with {got!r}, expected {MAGIC!r})")
    # the header usually fits in its first 64 KiB: parse it from one read, not one per field
    cursor = _Cursor(plain, len(MAGIC), plain.peek(0, min(plain.size, 1 << 16)))
    fast = _metadata_from(cursor.prefix, len(MAGIC))
    if fast is not None:
        metadata, cursor.pos = fast
    else:
        metadata = _read_metadata(cursor, name)
    sync = plain.read(cursor.pos, SYNC_SIZE, "the header's sync marker")
    return _finish_header(plain, cursor, metadata, sync)


def _read_metadata(cursor: _Cursor, name: str) -> dict[str, bytes]:
    """The header's metadata map, read field by field with every check."""
    metadata: dict[str, bytes] = {}
    while True:
        count = cursor.long("metadata block count")
        if count == 0:
            break
        if count < 0:
            count = -count
            cursor.long("metadata block size")
        for _ in range(count):
            try:
                key = cursor.bytes("metadata key").decode("utf-8")
            except UnicodeDecodeError:
                raise FormatError(f"{name}: not an Avro file: a metadata key is not UTF-8") from None
            metadata[key] = cursor.bytes("metadata value")
    return metadata


def _finish_header(plain: Plaintext, cursor: _Cursor, metadata: dict[str, bytes], sync: bytes) -> Header:
    name = plain.name
    if "avro.schema" not in metadata:
        raise FormatError(f"{name}: Avro header has no avro.schema")
    try:
        schema = json.loads(metadata["avro.schema"])
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # RecursionError: nested too deep
        raise FormatError(f"{name}: Avro header's avro.schema is not valid JSON: {exc}") from None
    codec = metadata.get("avro.codec", b"null").decode("utf-8", "replace")
    if codec not in CODECS:
        raise FormatError(f"{name}: unknown Avro codec {codec!r}")
    end = cursor.pos + SYNC_SIZE
    raw = cursor.prefix[:end] if end <= len(cursor.prefix) else plain.read(0, end, "the header")
    return Header(metadata, schema, codec, sync, end, raw)


# --------------------------------------------------------------------------- blocks


def first_block(plain: Plaintext, header: Header, start: int, end: int) -> int:
    """Where the first block a split ``[start, end)`` owns begins: after the first sync
    marker starting at or after ``start`` (the header's marker for block 0), as Avro
    Java's ``DataFileReader.sync``.  Returns ``plain.size`` when none starts before
    ``end`` (the split owns no block).  Scans only ``[start, end + 15)``."""
    header_sync = header.end - SYNC_SIZE
    if start <= header_sync:
        return header.end if header_sync < end else plain.size
    hit = plain.find(header.sync, start, end)
    return plain.size if hit < 0 else hit + SYNC_SIZE


def iter_blocks(plain: Plaintext, header: Header, pos: int, end: int | None = None,
                max_size: int | None = None) -> Iterator[bytes]:
    """The raw bytes (count, size, data, sync) of each block from ``pos`` whose
    preceding sync marker starts before ``end`` (Avro Java's ``pastSync``), each checked
    before it is yielded; a block whose stored size is above ``max_size`` is refused
    before it is read."""
    name = plain.name
    while pos < plain.size and (end is None or pos - SYNC_SIZE < end):
        head = plain.peek(pos, 20)
        try:
            count_parsed = parse_long(head, 0)
            size_parsed = parse_long(head, count_parsed[1]) if count_parsed else None
        except ValueError:
            raise FormatError(f"{name}: corrupt Avro block header at offset {pos}") from None
        if size_parsed is None:
            raise plain.truncated(pos, len(head) + 1, "an Avro block header")
        count, size = count_parsed[0], size_parsed[0]  # type: ignore[index]
        if count < 0 or size < 0:
            raise FormatError(f"{name}: corrupt Avro block at offset {pos}: count {count}, size {size}")
        if max_size is not None and size > max_size:
            raise FormatError(f"{name}: Avro block at offset {pos} refused: {size} bytes stored, more than {max_size}")
        block_end = pos + size_parsed[1] + size + SYNC_SIZE
        if block_end > plain.size:
            raise plain.truncated(pos, block_end - pos, "an Avro block")
        raw = plain.read(pos, block_end - pos, "an Avro block")
        if raw[-SYNC_SIZE:] != header.sync:
            raise FormatError(f"{name}: bad Avro sync marker at offset {block_end - SYNC_SIZE}")
        yield raw
        pos = block_end


class ChunkStream(io.RawIOBase):
    """A readable stream over an iterator of byte strings (a header, then blocks)."""

    def __init__(self, chunks: Iterator[bytes]):
        super().__init__()
        self._chunks = chunks
        self._current = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._current:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._current = memoryview(chunk)
        n = min(len(buffer), len(self._current))
        buffer[:n] = self._current[:n]
        self._current = self._current[n:]
        return n


def container_stream(header_bytes: bytes, blocks: Iterator[bytes]) -> io.BufferedReader:
    """A file object holding ``header_bytes`` followed by the given blocks."""

    def chunks() -> Iterator[bytes]:
        yield header_bytes
        yield from blocks

    return io.BufferedReader(ChunkStream(chunks()), 1 << 16)


def wrap_decode_errors(name: str, records: Iterator[Any]) -> Iterator[Any]:
    """Re-raise fastavro's decoding errors as FormatError naming the file.

    The bytes decoded here are authenticated, so any failure (fastavro's, a codec's:
    zlib.error, lzma.LZMAError, ...) means a malformed file, whatever its type."""
    try:
        yield from records
    except IcecryptError:
        raise
    except Exception as exc:
        raise FormatError(f"{name}: cannot decode Avro data: {type(exc).__name__}: {exc}") from exc


# --------------------------------------------------------------------------- writing


class _DeflateBlocks(io.RawIOBase):
    """The sink fastavro writes a codec-"null" container into: passes it on under
    ``header`` with every block deflated as Avro Java does it (raw deflate).  fastavro's
    own deflate keeps three bytes of the zlib checksum after the deflate data, which
    readers tolerate but Java never writes; this keeps the blocks byte-identical to
    Java's."""

    def __init__(self, sink: Any, header: bytes, skip: int, sync: bytes, level: int):
        super().__init__()
        self._sink, self._header, self._skip, self._sync, self._level = sink, header, skip, sync, level
        self._pending = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        n = len(memoryview(data))
        self._pending += data
        if self._header is not None:
            if len(self._pending) < self._skip:
                return n
            del self._pending[: self._skip]  # fastavro's header: ours replaces it
            self._sink.write(self._header)
            self._header = None
        while True:
            parsed = parse_long(self._pending, 0)
            size = parse_long(self._pending, parsed[1]) if parsed else None
            if size is None or len(self._pending) < size[1] + size[0] + SYNC_SIZE:
                return n
            start, end = size[1], size[1] + size[0]
            if self._pending[end : end + SYNC_SIZE] != self._sync:
                raise RuntimeError("unexpected Avro block layout from fastavro")
            packer = zlib.compressobj(self._level, zlib.DEFLATED, -15)
            deflated = packer.compress(self._pending[start:end]) + packer.flush()
            self._sink.write(_zigzag(parsed[0]) + _zigzag(len(deflated)) + deflated + self._sync)  # type: ignore[index]
            del self._pending[: end + SYNC_SIZE]

    def finish(self) -> None:
        if self._header is not None or self._pending:
            raise RuntimeError("fastavro left an incomplete Avro container")


_PROBED: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}


def write_container(sink: Any, schema: Any, records: Iterable[Any], *, codec: str, sync_interval: int,
                    metadata: dict[str, str], compression_level: int | None) -> None:
    """Write an Avro container of ``records`` to ``sink`` with fastavro (blocks of
    ``sync_interval`` bytes, as Avro Java); "deflate" blocks are made as Java makes them."""
    if codec != "deflate":
        fastavro.writer(sink, schema, records, codec=codec, sync_interval=sync_interval, metadata=metadata,
                        codec_compression_level=compression_level)
        return
    sync = os.urandom(SYNC_SIZE)
    schema_json = json.dumps(schema, separators=(",", ":"))
    # the length of fastavro's header for these arguments (to be replaced by ours); it
    # depends on the schema and metadata only, and a table writes the same ones again
    # and again (every manifest of a spec)
    memo = (schema_json, tuple(metadata.items()))
    probe_length = _PROBED.get(memo)
    if probe_length is None:
        probe = io.BytesIO()
        fastavro.writer(probe, schema, [], codec="null", metadata=dict(metadata), sync_marker=sync)
        probe_length = len(probe.getvalue())
        if len(_PROBED) >= 256:
            _PROBED.clear()
        _PROBED[memo] = probe_length
    meta = {key: value.encode("utf-8") for key, value in metadata.items()}
    meta["avro.schema"] = schema_json.encode("utf-8")
    meta["avro.codec"] = b"deflate"
    header = Header(meta, schema, codec, sync, 0).encode()
    level = -1 if compression_level is None else compression_level
    blocks = _DeflateBlocks(sink, header, probe_length, sync, level)
    fastavro.writer(blocks, schema, records, codec="null", sync_interval=sync_interval, metadata=dict(metadata),
                    sync_marker=sync)
    blocks.finish()


def write_encrypted(
    path: Any, filesystem: Any, key_metadata: StandardKeyMetadata, body: Callable[[ags1.Ags1Writer], None]
) -> int:
    """Run ``body(writer)`` on an AGS1 writer onto ``path`` and return the ciphertext
    length.  The file appears complete or not at all: locally through the writer's
    atomic rename; on a pyarrow filesystem through a temporary file beside ``path``
    that is moved into place after a clean close and deleted on failure."""
    name = display_name(path)
    check_filesystem(filesystem)
    key = _key(key_metadata, name)
    if filesystem is None:
        writer = ags1.open_writer(os.fspath(path), key, key_metadata.aad_prefix)
        with writer:
            body(writer)
        return writer.ciphertext_length  # type: ignore[return-value]
    path = str(path)
    directory, base = posixpath.split(path)
    tmp = posixpath.join(directory, f".{base}.{uuid.uuid4().hex}.tmp")
    out = filesystem.open_output_stream(tmp)
    try:
        writer = ags1.open_writer(out, key, key_metadata.aad_prefix)
        with writer:
            body(writer)
        out.close()
        filesystem.move(tmp, path)
    except BaseException:
        try:
            out.close()
        finally:
            try:
                filesystem.delete_file(tmp)
            except OSError:
                pass
        raise
    return writer.ciphertext_length  # type: ignore[return-value]

"""Avro object container files inside AGS1, as Iceberg Java reads and writes them.

Iceberg encrypts manifests, manifest lists and Avro data/delete files as whole-file AGS1
streams (SPEC.md §1) whose plaintext is an ordinary Avro container file; the key,
AAD prefix and trusted ciphertext length come from the file's key metadata.  This
module reads and writes such files with fastavro:

* :func:`read_records` / :func:`write_records` — records as dicts, with the header
  metadata Iceberg keeps in manifests (``schema``, ``partition-spec``, ...).
* :func:`read` / :func:`read_schema` / :func:`read_split` / :func:`write` — Arrow
  tables and batches (types and field ids mapped as in ``icecrypt.avro._arrow``).

Decryption is lazy and positional: reads decrypt only the AGS1 blocks the bytes they
need live in (``read_split`` decrypts the header's block and those of its range; pass a
:class:`ReadStats` to see which).  Every damaged, truncated, foreign or wrongly keyed
file raises :class:`~icecrypt.FormatError` or :class:`~icecrypt.AuthenticationError`
naming the file; nothing unauthenticated is ever returned.  Writes are atomic.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import fastavro
import pyarrow as pa

from icecrypt import ags1
from icecrypt.avro._arrow import (
    BatchBuilder,
    SchemaError,
    arrow_name,
    emit,
    expand,
    strip_logical_types,
    to_arrow_schema,
    to_avro_schema,
    top_level_fields,
    writable_rows,
)
from icecrypt.avro._container import (
    DEFAULT_SYNC_INTERVAL,
    Header,
    MemoryBytes,
    Plaintext,
    ReadStats,
    UnencryptedBytes,
    check_filesystem,
    coerce_key_metadata,
    container_stream,
    display_name,
    first_block,
    iter_blocks,
    read_header,
    wrap_decode_errors,
    write_container,
    write_encrypted,
)
from icecrypt.avro._guard import BlockGuard, plan
from icecrypt.errors import FormatError, IcecryptError
from icecrypt.keys import StandardKeyMetadata

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_CODEC",
    "DEFAULT_DEFLATE_LEVEL",
    "DEFAULT_SYNC_INTERVAL",
    "AvroRecords",
    "ReadStats",
    "arrow_to_avro_schema",
    "avro_to_arrow_schema",
    "plaintext_size",
    "read",
    "read_records",
    "read_schema",
    "read_split",
    "write",
    "write_records",
]

#: rows per Arrow record batch produced by the readers
DEFAULT_BATCH_SIZE = 65536
#: Iceberg Java writes manifests, manifest lists and Avro data files with "deflate"
#: (``write.avro.compression-codec`` default ``gzip`` = Avro's deflate codec) at level 9
#: (``Avro.GZIP_COMPRESSION_LEVEL_DEFAULT``); the Java manifests in ../shared/tables say so.
DEFAULT_CODEC = "deflate"
DEFAULT_DEFLATE_LEVEL = 9

KeyMetadataLike = StandardKeyMetadata | bytes | bytearray | memoryview
#: files up to this many plaintext bytes (one AGS1 block) are decoded from one buffer
_SMALL_FILE = ags1.PLAIN_BLOCK_SIZE


# --------------------------------------------------------------------------- schemas


def avro_to_arrow_schema(avro_schema: Any) -> pa.Schema:
    """The Arrow schema of an Avro record schema (a dict, or its JSON text).

    Iceberg's logical types and field ids are mapped as described in
    ``icecrypt.avro._arrow``; field ids land in field metadata ``b"PARQUET:field_id"``.
    Raises ValueError for schemas Arrow cannot hold (unions other than ``[null, T]``,
    recursive records, a top level that is not a record).
    """
    if isinstance(avro_schema, (str, bytes)):
        avro_schema = json.loads(avro_schema)
    return to_arrow_schema(expand(avro_schema))


def arrow_to_avro_schema(schema: pa.Schema, name: str = "record") -> dict:
    """The Avro record schema (a JSON-able dict) Iceberg Java would write for ``schema``.

    Field ids from ``b"PARQUET:field_id"`` become ``field-id`` / ``element-id`` /
    ``key-id`` / ``value-id``; nullable fields become ``["null", T]`` with a null
    default; names Avro cannot hold are sanitized like Iceberg's ``makeCompatibleName``
    with the original in ``iceberg-field-name``.  Round-trips through
    :func:`avro_to_arrow_schema` for every Iceberg type.
    """
    return to_avro_schema(schema, name)


# --------------------------------------------------------------------------- reading


class _AvroFile:
    """An open encrypted Avro file: decrypted-byte access, the header and its schema,
    and the guard every block passes before fastavro decodes it (``icecrypt.avro._guard``;
    ``kind="metadata"`` for a table's manifests and manifest lists, whose schema must
    be one Iceberg writes there)."""

    def __init__(self, path: Any, key_metadata: Any, filesystem: Any, stats: ReadStats | None, kind: str = "data"):
        self._open(Plaintext(path, key_metadata, filesystem, stats), kind)

    def _open(self, plain: Plaintext, kind: str = "data") -> None:
        self.plain = plain
        try:
            self.header: Header = read_header(plain)
            self.name = plain.name
            self._tree: Any = None
            checked = plan(self.header.schema, self.header.metadata["avro.schema"], self.name, metadata=kind == "metadata")
            self.guard = BlockGuard(checked, self.header.codec, self.name, plain.size)
        except BaseException:
            plain.close()
            raise

    @classmethod
    def unencrypted(cls, path: Any, filesystem: Any = None, stats: ReadStats | None = None, kind: str = "data") -> _AvroFile:
        """The same reader over an unencrypted Avro file: the files of plaintext tables
        (read with the same checks as encrypted ones), and measuring what encryption
        costs through the very same decoder (benchmarks, the Spark source's
        ``encryption=none`` mode).  Not public: icecrypt never reads data without a key."""
        self = cls.__new__(cls)
        self._open(UnencryptedBytes(path, filesystem, stats), kind)
        return self

    @classmethod
    def in_memory(cls, data: bytes, name: str, kind: str = "data") -> _AvroFile:
        """The same reader over a file's (authenticated) bytes already in memory."""
        self = cls.__new__(cls)
        self._open(MemoryBytes(data, name), kind)
        return self

    def close(self) -> None:
        self.plain.close()

    def __enter__(self) -> _AvroFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def tree(self) -> Any:
        if self._tree is None:
            try:
                self._tree = expand(self.header.schema)
            except SchemaError as exc:
                raise FormatError(f"{self.name}: unusable Avro schema: {exc}") from None
        return self._tree

    def records(self, schema: Any = None, reader_schema: Any = None, pos: int | None = None,
                end: int | None = None) -> Iterator[dict]:
        """fastavro records of the blocks from ``pos`` (block 0 if None) whose preceding
        sync marker starts before ``end``; ``schema``: the writer schema to give
        fastavro (the header's if None).  Each block is checked by the guard first."""
        start = self.header.end if pos is None else pos
        header_bytes = self.header.for_decoder(schema, self.guard.header_codec)

        def decode() -> Iterator[dict]:
            raws = iter_blocks(self.plain, self.header, start, end, self.guard.max_stored)
            blocks = self.guard.blocks_of(raws)
            if self.plain.size <= _SMALL_FILE:
                # a small file (a manifest): its checked blocks in one buffer, as fastavro
                # reads a plaintext file, instead of a stream of chunks
                stream: Any = io.BytesIO(b"".join([header_bytes, *blocks]))
            else:
                stream = container_stream(header_bytes, blocks)
            yield from fastavro.reader(stream, reader_schema)

        return wrap_decode_errors(self.name, decode())

    def _fields(self, columns: Sequence[str] | None) -> list[dict]:
        try:
            fields = top_level_fields(self.tree)
        except SchemaError as exc:
            raise FormatError(f"{self.name}: {exc}") from None
        if columns is None:
            return fields
        by_name = {arrow_name(f): f for f in fields}
        missing = [c for c in columns if c not in by_name]
        if missing:
            raise ValueError(f"{self.name}: no column(s) {missing} in the file; it has {list(by_name)}")
        return [by_name[c] for c in columns]

    def arrow_schema(self, columns: Sequence[str] | None = None) -> pa.Schema:
        meta = {k.encode(): v for k, v in self.header.metadata.items() if not k.startswith("avro.")}
        projected = dict(self.tree, fields=self._fields(columns))
        try:
            return to_arrow_schema(projected, meta)
        except SchemaError as exc:
            raise FormatError(f"{self.name}: Avro schema has no Arrow form: {exc}") from None

    def batches(self, columns: Sequence[str] | None, batch_size: int, pos: int | None = None,
                end: int | None = None) -> Iterator[pa.RecordBatch]:
        schema = self.arrow_schema(columns)
        fields = self._fields(columns)
        raw_tree = strip_logical_types(self.tree)
        reader_schema = None
        if columns is not None:  # a reader schema of the kept fields: fastavro skips the others
            raw_of = {id(f): rf for f, rf in zip(top_level_fields(self.tree), raw_tree["fields"])}
            reader_schema = emit(dict(raw_tree, fields=[raw_of[id(f)] for f in fields]))
        builder = BatchBuilder(fields, schema)
        records = self.records(emit(raw_tree), reader_schema, pos, end)
        try:
            yield from builder.batches(records, batch_size)
        except IcecryptError:
            raise
        except Exception as exc:  # authenticated bytes that do not convert: a malformed file
            raise FormatError(f"{self.name}: cannot convert Avro data to Arrow: {exc}") from exc


class AvroRecords:
    """The records of an encrypted Avro file, decoded lazily as they are iterated.

    Iterating yields fastavro records (dicts; logical types converted by fastavro, or
    stored values when opened with ``raw=True``); each iteration starts again at the
    first record.  ``schema`` is the writer schema (JSON-decoded, so Iceberg's
    ``field-id`` attributes are kept), ``metadata`` the header metadata
    (``dict[str, bytes]``), ``codec`` the Avro codec.  Memory is bounded by one AGS1
    block and one Avro block.  Close it (or use it as a context manager).
    """

    def __init__(self, file: _AvroFile, raw: bool):
        self._file = file
        self._raw = raw
        header = file.header
        self.name: str = file.name
        self.schema: Any = header.schema
        self.metadata: dict[str, bytes] = dict(header.metadata)
        self.codec: str = header.codec

    def __iter__(self) -> Iterator[dict]:
        if self._raw:
            return self._file.records(emit(strip_logical_types(self._file.tree)))
        return self._file.records()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> AvroRecords:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<AvroRecords {self.name!r} codec={self.codec}>"


def _decrypt_whole(path: Any, km: StandardKeyMetadata, filesystem: Any) -> bytes | None:
    """A small AGS1 file read in one call and authenticated and decrypted in one (the
    common case of planning); None when anything is off (a length other than the
    trusted one, a failed tag, an unreadable file), for the block reader to read again
    and report precisely.  Nothing is returned unless every block authenticated."""
    check_filesystem(filesystem)
    try:
        if filesystem is None:
            with open(path, "rb") as f:
                data = f.read(km.file_length + 1)
        else:
            with filesystem.open_input_file(path) as f:
                if f.size() != km.file_length:  # compared before the file is read
                    return None
                data = f.read()
        if len(data) != km.file_length:
            return None
        return ags1.decrypt(data, km.encryption_key, km.aad_prefix, length=km.file_length)
    except (OSError, ValueError, IcecryptError):
        return None


def _small_records(path: Any, key_metadata: KeyMetadataLike, filesystem: Any, kind: str) -> AvroRecords | None:
    """The records of a file of one AGS1 block (a manifest, a manifest list),
    authenticated and decrypted whole, up front, then decoded from that buffer; None
    when the file is not small.  Planning reads hundreds of such files; this keeps each
    one's cost that of the plaintext read plus one AES-GCM block."""
    km = coerce_key_metadata(key_metadata, display_name(path))
    if km.file_length is None or ags1.plaintext_length(km.file_length) > _SMALL_FILE:
        return None
    data = _decrypt_whole(path, km, filesystem)
    if data is None:
        with Plaintext(path, km, filesystem) as plain:  # the stream's own checks and errors
            data = plain.read(0, plain.size, "the file")
    return AvroRecords(_AvroFile.in_memory(data, display_name(path), kind), False)


def read_records(path: Any, key_metadata: KeyMetadataLike, *, filesystem: Any = None, raw: bool = False,
                 stats: ReadStats | None = None) -> AvroRecords:
    """Open an encrypted Avro file (a manifest, manifest list, or data file) for its records.

    ``key_metadata``: the file's StandardKeyMetadata or its bytes; its ``file_length``
    (which Iceberg stores for Avro manifests and data files) is the trusted ciphertext
    length.  ``raw=True`` returns stored values without logical-type conversion (dates
    as days, timestamps as micros, decimals as unscaled big-endian bytes).  The header
    is read and checked here; records are decrypted and decoded as they are iterated.
    """
    return _records(path, key_metadata, filesystem, raw=raw, stats=stats)


def _records(path: Any, key_metadata: KeyMetadataLike, filesystem: Any, *, raw: bool = False,
             stats: ReadStats | None = None, kind: str = "data") -> AvroRecords:
    """:func:`read_records` for a kind of file (``kind="metadata"``: a table's manifest or
    manifest list, whose schema must be one Iceberg writes there)."""
    if not raw and stats is None:
        small = _small_records(path, key_metadata, filesystem, kind)
        if small is not None:
            return small
    return AvroRecords(_AvroFile(path, key_metadata, filesystem, stats, kind), raw)


def _unencrypted_records(path: Any, filesystem: Any, *, kind: str) -> AvroRecords:
    """The records of an unencrypted Avro file of a plaintext table, through the same
    reader and checks as an encrypted one (never for a file of an encrypted table)."""
    return AvroRecords(_AvroFile.unencrypted(path, filesystem, kind=kind), False)


def read_schema(path: Any, key_metadata: KeyMetadataLike, *, filesystem: Any = None,
                stats: ReadStats | None = None) -> pa.Schema:
    """The Arrow schema of an encrypted Avro file, from its header (AGS1 block 0 only).

    Header metadata other than ``avro.*`` (e.g. Iceberg's ``iceberg.schema``) is kept
    as schema metadata."""
    with _AvroFile(path, key_metadata, filesystem, stats) as f:
        return f.arrow_schema()


def read(path: Any, key_metadata: KeyMetadataLike, *, filesystem: Any = None,
         columns: Sequence[str] | None = None, batch_size: int = DEFAULT_BATCH_SIZE,
         stats: ReadStats | None = None) -> pa.Table:
    """Read a whole encrypted Avro file into an Arrow table (``columns``: top-level
    columns to keep, in that order; the others are skipped, not decoded)."""
    with _AvroFile(path, key_metadata, filesystem, stats) as f:
        schema = f.arrow_schema(columns)
        return pa.Table.from_batches(list(f.batches(columns, batch_size)), schema=schema)


def read_split(path: Any, key_metadata: KeyMetadataLike, start: int, length: int, *, filesystem: Any = None,
               columns: Sequence[str] | None = None, batch_size: int = DEFAULT_BATCH_SIZE,
               stats: ReadStats | None = None) -> Iterator[pa.RecordBatch]:
    """The record batches of one split of an encrypted Avro file.

    ``start``/``length`` are positions in the decrypted Avro bytes (``0 ..
    plaintext_size(key_metadata)``).  As Avro Java's ``AvroRecordReader`` (and
    Iceberg's Avro split reads), a split owns the blocks whose preceding sync marker
    starts in ``[start, start + length)`` — block 0 counts as preceded by the header's
    marker — so consecutive splits covering the file yield every record exactly once.
    Only AGS1 block 0 (the header) and the blocks holding the split's bytes (plus the
    end of its last Avro block) are decrypted.  The file is opened and its header
    checked before this returns; the batches are produced lazily.
    """
    if start < 0 or length < 0:
        raise ValueError(f"invalid split: start {start}, length {length}")
    f = _AvroFile(path, key_metadata, filesystem, stats)
    try:
        end = start + length
        pos = first_block(f.plain, f.header, start, end)
        f.arrow_schema(columns)  # checks the schema and the columns now
    except BaseException:
        f.close()
        raise

    def generate() -> Iterator[pa.RecordBatch]:
        with f:
            yield from f.batches(columns, batch_size, pos, end)

    return generate()


def plaintext_size(key_metadata_or_ciphertext_length: KeyMetadataLike | int) -> int:
    """The length of the Avro bytes inside an AGS1 file, for split planning: from a
    ciphertext length, or from key metadata carrying ``file_length``."""
    value = key_metadata_or_ciphertext_length
    if isinstance(value, int) and not isinstance(value, bool):
        return ags1.plaintext_length(value)
    km = coerce_key_metadata(value, "key metadata")
    if km.file_length is None:
        raise ValueError("key metadata has no file_length; pass the ciphertext length")
    return ags1.plaintext_length(km.file_length)


# --------------------------------------------------------------------------- writing


def _file_key(key_metadata: KeyMetadataLike | None, key_length: int) -> StandardKeyMetadata:
    if key_metadata is not None:
        return coerce_key_metadata(key_metadata, "key metadata")
    if key_length not in (16, 24, 32):
        raise ValueError(f"Invalid key length: {key_length} (must be 16, 24, or 32 bytes)")
    # A fresh DEK and 16-byte AAD prefix per file, as StandardEncryptionManager does.
    return StandardKeyMetadata(os.urandom(key_length), os.urandom(16))


def _header_metadata(metadata: Mapping[str, str | bytes] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in (metadata or {}).items():
        if not isinstance(key, str) or key.startswith("avro."):
            raise ValueError(f"invalid Avro header metadata key {key!r} (avro.* is reserved)")
        if isinstance(value, (bytes, bytearray, memoryview)):
            try:
                value = bytes(value).decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"Avro header metadata {key!r} must be UTF-8 text") from None
        if not isinstance(value, str):
            raise TypeError(f"Avro header metadata {key!r} must be str or bytes, not {type(value).__name__}")
        out[key] = value
    return out


#: schemas (as JSON) fastavro has accepted: a table writes the same few again and again
_VALID_SCHEMAS: set[str] = set()


def _write(path: Any, filesystem: Any, key_metadata: StandardKeyMetadata, avro_schema: Any,
           records: Iterable[Any], codec: str, metadata: Mapping[str, str | bytes] | None,
           sync_interval: int, compression_level: int | None) -> StandardKeyMetadata:
    meta = _header_metadata(metadata)
    if compression_level is None and codec == "deflate":
        compression_level = DEFAULT_DEFLATE_LEVEL
    name = display_name(path)
    try:
        memo = json.dumps(avro_schema, separators=(",", ":"))
    except (TypeError, ValueError):
        memo = None
    if memo is None or memo not in _VALID_SCHEMAS:
        try:
            fastavro.parse_schema(avro_schema)
        except Exception as exc:  # fastavro's SchemaParseException and friends
            raise ValueError(f"{name}: invalid Avro schema: {exc}") from exc
        if memo is not None:
            if len(_VALID_SCHEMAS) >= 256:
                _VALID_SCHEMAS.clear()
            _VALID_SCHEMAS.add(memo)

    def body(sink: ags1.Ags1Writer) -> None:
        try:
            write_container(sink, avro_schema, records, codec=codec, sync_interval=sync_interval, metadata=meta,
                            compression_level=compression_level)
        except (TypeError, ValueError, KeyError, AttributeError, OverflowError) as exc:
            raise ValueError(f"{name}: cannot write Avro records: {type(exc).__name__}: {exc}") from exc

    length = write_encrypted(path, filesystem, key_metadata, body)
    return key_metadata.with_file_length(length)


def write_records(path: Any, avro_schema: Any, records: Iterable[Mapping[str, Any]], *, filesystem: Any = None,
                  key_metadata: KeyMetadataLike | None = None, metadata: Mapping[str, str | bytes] | None = None,
                  codec: str = DEFAULT_CODEC, sync_interval: int = DEFAULT_SYNC_INTERVAL,
                  key_length: int = 16, compression_level: int | None = None) -> StandardKeyMetadata:
    """Write records (dicts, as fastavro takes them) as an encrypted Avro file.

    ``avro_schema``: the writer schema (dict; attributes such as ``field-id`` are kept
    in the header).  ``metadata``: extra header entries (Iceberg manifests carry
    ``schema``, ``partition-spec``, ``partition-spec-id``, ``format-version``,
    ``content``).  Without ``key_metadata`` a fresh ``key_length``-byte DEK and 16-byte
    AAD prefix are drawn.  ``codec`` / ``compression_level``: Iceberg Java's defaults
    (deflate, level 9); ``sync_interval``: bytes per Avro block (Avro Java's 64000).
    The file appears complete or not at all.  Returns the key
    metadata with ``file_length`` = the ciphertext length (what Iceberg records as
    ``manifest_length`` / ``file_size_in_bytes`` and in key metadata).
    """
    km = _file_key(key_metadata, key_length)
    return _write(path, filesystem, km, avro_schema, records, codec, metadata, sync_interval, compression_level)


def _as_batches(data: Any) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    if isinstance(data, pa.Table):
        return data.schema, iter(data.to_batches())
    if isinstance(data, pa.RecordBatch):
        return data.schema, iter([data])
    if isinstance(data, pa.RecordBatchReader):
        return data.schema, iter(data)
    it = iter(data)
    first = next(it, None)
    if not isinstance(first, pa.RecordBatch):
        raise TypeError("write needs a pyarrow Table, RecordBatch, RecordBatchReader or non-empty iterable of batches")

    def chain() -> Iterator[pa.RecordBatch]:
        yield first
        yield from it

    return first.schema, chain()


def write(table_or_batches: Any, path: Any, *, filesystem: Any = None, key_metadata: KeyMetadataLike | None = None,
          codec: str = DEFAULT_CODEC, metadata: Mapping[str, str | bytes] | None = None,
          sync_interval: int = DEFAULT_SYNC_INTERVAL, key_length: int = 16,
          name: str = "table", compression_level: int | None = None) -> StandardKeyMetadata:
    """Write Arrow data as an encrypted Avro data file Iceberg Java can read.

    The Avro schema is :func:`arrow_to_avro_schema` of the data's schema (field ids
    from ``b"PARQUET:field_id"`` when present; record ``name``).  The header metadata
    is the schema's metadata (UTF-8 entries, as :func:`read` returns them) updated with
    ``metadata``.  Returns the key metadata with ``file_length`` set (see
    :func:`write_records`).
    """
    schema, batches = _as_batches(table_or_batches)
    try:
        avro_schema = arrow_to_avro_schema(schema, name)
    except SchemaError as exc:
        raise ValueError(f"{display_name(path)}: {exc}") from None
    km = _file_key(key_metadata, key_length)
    header: dict[str, str | bytes] = {}
    for key, value in (schema.metadata or {}).items():  # what read() put in the schema comes back
        try:
            text_key = key.decode("utf-8")
            value.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if not text_key.startswith("avro."):
            header[text_key] = value
    header.update(metadata or {})

    def records() -> Iterator[dict]:
        for batch in batches:
            if not batch.schema.equals(schema):
                raise ValueError(f"batch schema {batch.schema} differs from the first batch's {schema}")
            for offset in range(0, batch.num_rows, DEFAULT_BATCH_SIZE):
                yield from writable_rows(batch.slice(offset, DEFAULT_BATCH_SIZE))

    return _write(path, filesystem, km, avro_schema, records(), codec, header, sync_interval, compression_level)

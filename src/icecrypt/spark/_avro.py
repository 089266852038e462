"""``icecrypt.avro``: Spark reads and writes of Avro container files inside AGS1.

Reading: the planner cuts every file's *plaintext* Avro stream (its length comes from
the trusted ``file_length`` of the key metadata) into byte ranges of ``split-size``
bytes (default 128 MiB, at least one AGS1 block, 1 MiB); ranges of small files share a
partition.  A task calls :func:`icecrypt.avro.read_split` for each range, which decodes
the Avro blocks that start in the range and decrypts only the AGS1 blocks they live in
(plus block 0, the header).

Writing: each task writes one file with :func:`icecrypt.avro.write` (``codec`` option,
default deflate).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from icecrypt import avro
from icecrypt.avro._container import Plaintext, first_block
from icecrypt.keys import StandardKeyMetadata
from icecrypt.spark._common import (
    AGS1_BLOCK,
    OPT_BATCH_SIZE,
    OPT_CODEC,
    DataFile,
    pack,
    positive_int,
    split_size,
)
from icecrypt.spark._read import FilePartition, FileReader, FileSource
from icecrypt.spark._write import EncryptedFileWriter

__all__ = ["AvroDataSource"]

NAME = "icecrypt.avro"

Split = tuple[DataFile, int, int]  # file, plaintext start, length


# --- encryption=none: the same split reader over plaintext Avro files ----------------------
# icecrypt.avro only reads encrypted files (it fails closed on a missing key).  The
# plaintext mode exists to measure what encryption costs, so it must decode exactly as
# the encrypted path does: it runs icecrypt.avro's own split reader over a byte source
# that reads plain 1 MiB blocks where the encrypted one decrypts AGS1 blocks.  This uses
# private parts of icecrypt.avro (its file and block-access classes); the plaintext
# tests in tests/spark catch a change there.


class _PlainBytes(Plaintext):
    """Plaintext's block access over an unencrypted file (1 MiB blocks, last one kept)."""

    def __init__(self, path: str, filesystem: Any) -> None:
        self.name = path
        self._file = filesystem.open_input_file(path)
        self._reader = None
        self.size = self._file.size()
        self._num_blocks = max(1, -(-self.size // AGS1_BLOCK))
        self._buf = bytearray(min(AGS1_BLOCK, self.size))
        self._index = -1
        self._length = 0
        self._stats = None

    def close(self) -> None:
        self._file.close()
        self._index = -1

    def _block(self, index: int) -> memoryview:
        if index != self._index:
            length = min(AGS1_BLOCK, self.size - index * AGS1_BLOCK)
            self._buf[:length] = self._file.read_at(length, index * AGS1_BLOCK)
            self._index, self._length = index, length
        return memoryview(self._buf)[: self._length]


class _PlainAvroFile(avro._AvroFile):
    def __init__(self, path: str, filesystem: Any) -> None:
        self._open(_PlainBytes(path, filesystem))  # the header and the schema's and blocks' checks


def _plain_schema(file: DataFile) -> pa.Schema:
    with _PlainAvroFile(file.path, file.filesystem) as handle:
        return handle.arrow_schema()


def _plain_split(file: DataFile, start: int, length: int, columns: list[str], batch_size: int
                 ) -> Iterator[pa.RecordBatch]:
    with _PlainAvroFile(file.path, file.filesystem) as handle:
        end = start + length
        yield from handle.batches(columns, batch_size, first_block(handle.plain, handle.header, start, end), end)


class AvroReader(FileReader):
    source = NAME
    extension = ".avro"

    @classmethod
    def file_schema(cls, file: DataFile, key_metadata: StandardKeyMetadata | None) -> pa.Schema:
        if key_metadata is None:
            return _plain_schema(file)
        return avro.read_schema(file.path, key_metadata, filesystem=file.filesystem)

    def splits(self, files: list[DataFile]) -> list[Split]:
        """Every file's plaintext byte ranges of ``split-size`` bytes, in order."""
        size = split_size(self.options)
        result = []
        for file in files:
            key_metadata = self.key(file)
            if key_metadata is None:
                length = file.size
            else:
                length = avro.plaintext_size(key_metadata if key_metadata.file_length is not None else file.size)
            result.extend((file, start, min(size, length - start)) for start in range(0, max(length, 1), size))
        return result

    def plan(self, files: list[DataFile]) -> list[FilePartition]:
        size = split_size(self.options)
        groups = pack(((length, (file, start, length)) for file, start, length in self.splits(files)), size)
        return [FilePartition(number, group) for number, group in enumerate(groups)]

    def read_piece(self, piece: Split) -> Iterator[pa.RecordBatch]:
        file, start, length = piece
        key_metadata = self.key(file)
        columns = self.projection.columns
        batch_size = positive_int(self.options, OPT_BATCH_SIZE, avro.DEFAULT_BATCH_SIZE)
        if key_metadata is None:
            return _plain_split(file, start, length, columns, batch_size)
        return avro.read_split(file.path, key_metadata, start, length, filesystem=file.filesystem,
                               columns=columns, batch_size=batch_size)

    def describe(self, piece: Split) -> str:
        file, start, length = piece
        return f"split [{start}, {start + length}) of {file.uri}"


class AvroWriter(EncryptedFileWriter):
    source = NAME
    extension = ".avro"

    def __init__(self, options: Any, schema: Any, overwrite: bool) -> None:
        super().__init__(options, schema, overwrite)
        self.codec = self.options.get(OPT_CODEC) or "deflate"

    def write_file(self, batches: Iterator[pa.RecordBatch], schema: pa.Schema, path: str,
                   key_metadata: StandardKeyMetadata) -> StandardKeyMetadata:
        return avro.write(batches, path, filesystem=self.filesystem, key_metadata=key_metadata, codec=self.codec)


class AvroDataSource(FileSource):
    """``spark.read.format("icecrypt.avro")`` / ``df.write.format("icecrypt.avro")``."""

    reader_class = AvroReader

    @classmethod
    def name(cls) -> str:
        return NAME

    def writer(self, schema: Any, overwrite: bool) -> AvroWriter:
        return AvroWriter(self.options, schema, overwrite)

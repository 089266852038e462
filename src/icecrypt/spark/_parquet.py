"""``icecrypt.parquet``: Spark reads and writes of Iceberg-style encrypted Parquet files.

Reading: the planner opens no file.  It cuts the listed files into pieces by their
stored size (the key metadata's ``file_length`` when it has one, else the listing's):
a file of at most ``split-size`` bytes (default 128 MiB) is one piece, a larger one is
cut into byte ranges of ``split-size`` bytes (at least :data:`MIN_RANGE`, 1 MiB); small
files share a partition up to ``split-size`` bytes.  A task opens each file of its
partition with :func:`icecrypt.parquet.open_file` (which decrypts and authenticates the
footer) and reads, of a byte range, the row groups whose midpoint lies in it -- the rule
of Spark's and parquet-mr's own Parquet splits -- so every row group is read by exactly
one task; only the projected columns are read.  The driver decrypts one footer in
``schema()`` and one when it creates the reader (the file schema for the projection),
however many files there are: :data:`STATS` counts the footers a process opens.

Writing: each task writes one file with :func:`icecrypt.parquet.open_writer`, buffering
Spark's batches into row groups of ``row-group-size`` rows (default 1 Mi rows);
``compression`` (default zstd, as Iceberg) and ``compression-level`` are passed on.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from icecrypt import parquet
from icecrypt.keys import StandardKeyMetadata
from icecrypt.spark._common import (
    OPT_BATCH_SIZE,
    OPT_COMPRESSION,
    OPT_COMPRESSION_LEVEL,
    OPT_ROW_GROUP_SIZE,
    DataFile,
    pack,
    positive_int,
    split_size,
)
from icecrypt.spark._read import FilePartition, FileReader, FileSource
from icecrypt.spark._write import EncryptedFileWriter

__all__ = ["STATS", "FooterStats", "ParquetDataSource", "row_groups_in_range"]

NAME = "icecrypt.parquet"
DEFAULT_BATCH_SIZE = 131072
DEFAULT_ROW_GROUP_SIZE = 1 << 20


#: the smallest byte range a file is cut into, whatever ``split-size`` says (a smaller
#: ``split-size`` still packs files one per partition, but cuts no file finer than this)
MIN_RANGE = 1 << 20
#: a file up to this much larger than the split size stays one piece (no tiny last range)
SPLIT_SLOP = 1.1

#: ``(file, start, end)``: the row groups of ``file`` whose midpoint lies in
#: ``[start, end)``; ``end`` None means to the end of the file (and ``(file, 0, None)``
#: the whole file)
Piece = tuple[DataFile, int, "int | None"]


@dataclasses.dataclass
class FooterStats:
    """How many Parquet footers this process opened (decrypted, for encrypted files),
    and how many of them were opened for planning or schemas rather than reading rows."""

    footers: int = 0
    schema_footers: int = 0
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False, compare=False)

    def count(self, schema: bool = False) -> None:
        with self._lock:
            self.footers += 1
            if schema:
                self.schema_footers += 1

    def reset(self) -> None:
        with self._lock:
            self.footers = self.schema_footers = 0


#: the footers opened by this process (the tests read it around planning on the driver)
STATS = FooterStats()


def _open(file: DataFile, key_metadata: StandardKeyMetadata | None, schema: bool = False) -> pq.ParquetFile:
    if key_metadata is None:  # encryption=none
        handle = pq.ParquetFile(file.path, filesystem=file.filesystem)
    else:
        handle = parquet.open_file(file.path, key_metadata, filesystem=file.filesystem)
    STATS.count(schema)
    return handle


def _midpoint(group: pq.RowGroupMetaData) -> int:
    """Where a row group's column chunks start plus half their compressed size (parquet-mr's
    ``getStartingPos`` + ``getCompressedSize() / 2``)."""
    start = None
    total = 0
    for index in range(group.num_columns):
        column = group.column(index)
        offset = column.data_page_offset
        dictionary = column.dictionary_page_offset
        if column.has_dictionary_page and dictionary is not None and 0 < dictionary < offset:
            offset = dictionary
        start = offset if start is None else min(start, offset)
        total += column.total_compressed_size
    return (start or 0) + total // 2


def row_groups_in_range(metadata: pq.FileMetaData, start: int, end: int | None) -> list[int]:
    """The row groups whose midpoint lies in ``[start, end)`` (``end`` None: no end).

    Ranges that tile ``[0, ∞)`` give every row group to exactly one of them."""
    if start <= 0 and end is None:
        return list(range(metadata.num_row_groups))
    chosen = []
    for index in range(metadata.num_row_groups):
        mid = _midpoint(metadata.row_group(index))
        if mid >= start and (end is None or mid < end):
            chosen.append(index)
    return chosen


class ParquetReader(FileReader):
    source = NAME
    extension = ".parquet"

    @classmethod
    def file_schema(cls, file: DataFile, key_metadata: StandardKeyMetadata | None) -> pa.Schema:
        with _open(file, key_metadata, schema=True) as handle:
            return handle.schema_arrow

    def pieces(self, files: list[DataFile]) -> list[tuple[int, Piece]]:
        """``(size, piece)`` of every file, in order: whole files up to the split size
        (plus slop), byte ranges of at least :data:`MIN_RANGE` for larger ones."""
        target = split_size(self.options, minimum=1)
        step = max(target, MIN_RANGE)
        result: list[tuple[int, Piece]] = []
        for file in files:
            key_metadata = self.key(file)  # a file without a key is refused here, before any task
            size = file.size
            if key_metadata is not None and key_metadata.file_length is not None:
                size = key_metadata.file_length
            if size <= step * SPLIT_SLOP:
                result.append((size, (file, 0, None)))
                continue
            start = 0
            while size - start > step * SPLIT_SLOP:
                result.append((step, (file, start, start + step)))
                start += step
            result.append((size - start, (file, start, None)))
        return result

    def plan(self, files: list[DataFile]) -> list[FilePartition]:
        target = split_size(self.options, minimum=1)
        return [FilePartition(number, group) for number, group in enumerate(pack(self.pieces(files), target))]

    def read_piece(self, piece: Piece) -> Iterator[pa.RecordBatch]:
        file, start, end = piece
        batch_size = positive_int(self.options, OPT_BATCH_SIZE, DEFAULT_BATCH_SIZE)
        with _open(file, self.key(file)) as handle:
            row_groups = row_groups_in_range(handle.metadata, start, end)
            if row_groups:
                yield from handle.iter_batches(batch_size=batch_size, row_groups=row_groups,
                                               columns=self.projection.columns, use_threads=False)

    def describe(self, piece: Piece) -> str:
        file, start, end = piece
        if start == 0 and end is None:
            return f"row groups of {file.uri}"
        return f"row groups in bytes [{start}, {'end' if end is None else end}) of {file.uri}"


class ParquetWriter(EncryptedFileWriter):
    source = NAME
    extension = ".parquet"

    def __init__(self, options: Any, schema: Any, overwrite: bool) -> None:
        super().__init__(options, schema, overwrite)
        self.row_group_size = positive_int(self.options, OPT_ROW_GROUP_SIZE, DEFAULT_ROW_GROUP_SIZE)
        self.writer_options: dict[str, Any] = {}
        if self.options.get(OPT_COMPRESSION):
            self.writer_options["compression"] = self.options[OPT_COMPRESSION]
        if self.options.get(OPT_COMPRESSION_LEVEL):
            self.writer_options["compression_level"] = positive_int(self.options, OPT_COMPRESSION_LEVEL, 1)

    def write_file(self, batches: Iterator[pa.RecordBatch], schema: pa.Schema, path: str,
                   key_metadata: StandardKeyMetadata) -> StandardKeyMetadata:
        with parquet.open_writer(path, schema, filesystem=self.filesystem, key_metadata=key_metadata,
                                 **self.writer_options) as writer:
            pending: list[pa.RecordBatch] = []
            rows = 0
            for batch in batches:
                pending.append(batch)
                rows += batch.num_rows
                if rows >= self.row_group_size:
                    writer.write_table(pa.Table.from_batches(pending, schema), row_group_size=self.row_group_size)
                    pending, rows = [], 0
            if pending:
                writer.write_table(pa.Table.from_batches(pending, schema), row_group_size=self.row_group_size)
        return writer.key_metadata


class ParquetDataSource(FileSource):
    """``spark.read.format("icecrypt.parquet")`` / ``df.write.format("icecrypt.parquet")``."""

    reader_class = ParquetReader

    @classmethod
    def name(cls) -> str:
        return NAME

    def writer(self, schema: Any, overwrite: bool) -> ParquetWriter:
        return ParquetWriter(self.options, schema, overwrite)

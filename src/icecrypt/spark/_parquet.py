"""``icecrypt.parquet``: Spark reads and writes of Iceberg-style encrypted Parquet files.

Reading: the planner opens each file's (encrypted) footer and cuts the files into
partitions of consecutive row groups of about ``split-size`` compressed bytes (default
128 MiB; small row groups and small files share a partition).  A task opens its files
with :func:`icecrypt.parquet.open_file` and reads only its row groups and only the
projected columns.

Writing: each task writes one file with :func:`icecrypt.parquet.open_writer`, buffering
Spark's batches into row groups of ``row-group-size`` rows (default 1 Mi rows);
``compression`` (default zstd, as Iceberg) and ``compression-level`` are passed on.
"""

from __future__ import annotations

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

__all__ = ["ParquetDataSource"]

NAME = "icecrypt.parquet"
DEFAULT_BATCH_SIZE = 131072
DEFAULT_ROW_GROUP_SIZE = 1 << 20


def _open(file: DataFile, key_metadata: StandardKeyMetadata | None) -> pq.ParquetFile:
    if key_metadata is None:  # encryption=none
        return pq.ParquetFile(file.path, filesystem=file.filesystem)
    return parquet.open_file(file.path, key_metadata, filesystem=file.filesystem)


class ParquetReader(FileReader):
    source = NAME
    extension = ".parquet"

    @classmethod
    def file_schema(cls, file: DataFile, key_metadata: StandardKeyMetadata | None) -> pa.Schema:
        with _open(file, key_metadata) as handle:
            return handle.schema_arrow

    def plan(self, files: list[DataFile]) -> list[FilePartition]:
        target = split_size(self.options, minimum=1)
        row_groups = []
        for file in files:
            with _open(file, self.key(file)) as handle:
                metadata = handle.metadata
                for index in range(metadata.num_row_groups):
                    group = metadata.row_group(index)
                    size = sum(group.column(c).total_compressed_size for c in range(group.num_columns))
                    row_groups.append((size, (file, index)))
        partitions = []
        for number, group in enumerate(pack(row_groups, target)):
            pieces: list[tuple[DataFile, tuple[int, ...]]] = []
            for file, index in group:
                if pieces and pieces[-1][0] is file:
                    pieces[-1] = (file, (*pieces[-1][1], index))
                else:
                    pieces.append((file, (index,)))
            partitions.append(FilePartition(number, pieces))
        return partitions

    def read_piece(self, piece: tuple[DataFile, tuple[int, ...]]) -> Iterator[pa.RecordBatch]:
        file, row_groups = piece
        batch_size = positive_int(self.options, OPT_BATCH_SIZE, DEFAULT_BATCH_SIZE)
        with _open(file, self.key(file)) as handle:
            yield from handle.iter_batches(batch_size=batch_size, row_groups=list(row_groups),
                                           columns=self.projection.columns, use_threads=False)

    def describe(self, piece: tuple[DataFile, tuple[int, ...]]) -> str:
        file, row_groups = piece
        return f"row groups {row_groups[0]}..{row_groups[-1]} of {file.uri}"


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

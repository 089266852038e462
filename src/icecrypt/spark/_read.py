"""The read side shared by the data sources: schema, planning hooks, executor reads.

Where each step runs (PySpark 4.x Python Data Source API):

* ``DataSource.schema()`` — a Python worker on the driver, at ``load()``: lists the files
  and reads the schema of the first one (its header or footer, which needs its key).
* ``DataSource.reader(schema)`` and ``DataSourceReader.partitions()`` — a planning worker
  on the driver: the reader is created, *pickled for the tasks*, and only then asked for
  its partitions.  So :class:`FileReader` plans in ``partitions()`` and keeps its file
  list and key ring out of its pickled state.
* ``DataSourceReader.read(partition)`` — the task workers: each resolves the keys of its
  files from the options itself (see :mod:`icecrypt.spark._keys`), or, with option
  ``keys.transport=task``, takes them from its partition, where the planner put the key
  metadata of that partition's files (and of no other file).

Spark gives Python data sources the full schema to read (PySpark 4.3 has no column
pruning hook for them, only ``pushFilters``, which also needs
``spark.sql.python.filterPushdown.enabled``), so projection is the user's: the
``columns`` option, or a user-specified schema naming fewer columns; only those columns
are then read (Parquet) or converted (Avro).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from icecrypt.errors import EncryptionKeyNotFoundError
from icecrypt.keys import StandardKeyMetadata
from icecrypt.spark import _keys
from icecrypt.spark._common import (
    OPT_KEYS_TRANSPORT,
    TRANSPORT_TASK,
    DataFile,
    columns_option,
    encrypted,
    file_error,
    key_transport,
    list_files,
)
from icecrypt.spark._schema import Projection, spark_schema

__all__ = ["FilePartition", "FileReader", "FileSource"]


class FilePartition(InputPartition):
    """Pieces of files one task reads; what a piece is depends on the format (its first
    item is always the :class:`DataFile`).

    ``keys`` (``keys.transport=task`` only): the key metadata of the partition's files by
    canonical name, set by the planner; it travels with the task and is never shown."""

    def __init__(self, index: int, pieces: Sequence[Any]) -> None:
        super().__init__(index)
        self.pieces = tuple(pieces)
        self.keys: dict[str, StandardKeyMetadata] | None = None

    def __repr__(self) -> str:
        return f"FilePartition({self.value}, {len(self.pieces)} pieces)"


class FileReader(DataSourceReader):
    """Base of the format readers: keys, projection, planning and error context."""

    source = ""
    extension = ""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.options = dict(options)
        self.encrypted = encrypted(self.options)
        self.transport = key_transport(self.options)
        self._files = list_files(self.options, self.extension)
        self._ring = _keys.keyring(self.options) if self.encrypted else None
        first = self._files[0]
        try:
            file_schema = self.file_schema(first, self.key(first))
        except Exception as exc:
            raise file_error(exc, f"{self.source}: reading the schema of {first.uri}", first.path) from exc
        self.projection = Projection(file_schema, schema, f"{self.source}: {first.uri}")

    def __getstate__(self) -> dict[str, Any]:
        # Only options and the projection go to the tasks: not the planner's file list,
        # and never the key ring.
        state = self.__dict__.copy()
        state.pop("_files", None)
        state.pop("_ring", None)
        return state

    def key(self, file: DataFile) -> StandardKeyMetadata | None:
        """The file's key metadata (None when reading plaintext files)."""
        if not self.encrypted:
            return None
        ring = getattr(self, "_ring", None)
        if ring is None:
            if self.transport == TRANSPORT_TASK:  # a task without its keys: never ask the KMS
                raise EncryptionKeyNotFoundError(f"{self.source}: no key metadata for {file.uri} in the task "
                                                 f"({OPT_KEYS_TRANSPORT}={TRANSPORT_TASK})")
            ring = _keys.keyring(self.options)
        return ring.get(file)

    # --- format hooks -------------------------------------------------------------------

    @classmethod
    def file_schema(cls, file: DataFile, key_metadata: StandardKeyMetadata | None) -> pa.Schema:
        """The Arrow schema of one file."""
        raise NotImplementedError

    def plan(self, files: list[DataFile]) -> list[FilePartition]:
        """The partitions for ``files`` (planner)."""
        raise NotImplementedError

    def read_piece(self, piece: Any) -> Iterator[pa.RecordBatch]:
        """The batches of one piece, as the file holds them (task)."""
        raise NotImplementedError

    def describe(self, piece: Any) -> str:
        """The piece for error messages: file URI and range."""
        raise NotImplementedError

    # --- DataSourceReader ------------------------------------------------------------------

    def partitions(self) -> list[FilePartition]:
        partitions = self.plan(self._files)
        if self.encrypted and self.transport == TRANSPORT_TASK:
            for partition in partitions:  # each task gets the keys of its own files only
                files = {piece[0].uri: piece[0] for piece in partition.pieces}
                partition.keys = {_keys.canonical(uri): self.key(file) for uri, file in files.items()}
        return partitions

    def read(self, partition: FilePartition) -> Iterator[pa.RecordBatch]:
        if self.encrypted and self.transport == TRANSPORT_TASK:
            if partition.keys is None:
                raise EncryptionKeyNotFoundError(f"{self.source}: partition {partition.value} carries no keys "
                                                 f"({OPT_KEYS_TRANSPORT}={TRANSPORT_TASK})")
            self._ring = _keys.KeyRing(partition.keys, f"partition {partition.value}")
        apply = self.projection.apply
        for piece in partition.pieces:
            try:
                for batch in self.read_piece(piece):
                    yield apply(batch)
            except Exception as exc:
                raise file_error(exc, f"{self.source}: {self.describe(piece)}", piece[0].path) from exc


class FileSource(DataSource):
    """Base of the format data sources (``DataSource.__init__`` is Spark's, not overridden)."""

    reader_class: type[FileReader] = FileReader

    def schema(self) -> StructType:
        reader = self.reader_class
        options = dict(self.options)
        files = list_files(options, reader.extension)
        first = files[0]
        key = _keys.keyring(options).get(first) if encrypted(options) else None
        try:
            arrow_schema = reader.file_schema(first, key)
        except Exception as exc:
            raise file_error(exc, f"{reader.source}: reading the schema of {first.uri}", first.path) from exc
        columns = columns_option(options)
        if columns is not None:
            missing = [name for name in columns if name not in arrow_schema.names]
            if missing:
                raise ValueError(f"{reader.source}: option columns names {', '.join(map(repr, missing))}, which "
                                 f"{first.uri} does not have (columns: {', '.join(arrow_schema.names)})")
            arrow_schema = pa.schema([arrow_schema.field(name) for name in columns])
        return spark_schema(arrow_schema)

    def reader(self, schema: StructType) -> FileReader:
        return self.reader_class(self.options, schema)

"""The ``icecrypt.iceberg`` data source: what Spark calls for a batch read or write
(:mod:`icecrypt.spark._iceberg`) and for a streaming one (:mod:`icecrypt.spark._stream`).
It sits above both, so that neither imports the other's caller; the options are
documented in :mod:`icecrypt.spark._iceberg`."""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from icecrypt.spark._common import columns_option
from icecrypt.spark._iceberg import (
    OPT_FILTER,
    OPT_METADATA_TABLE,
    IcebergReader,
    IcebergWriter,
    MetadataTableReader,
    _location,
    _metadata_table,
    _new_scan,
    _no_incremental,
    _open_table,
)
from icecrypt.spark._options import NAME
from icecrypt.spark._schema import spark_schema
from icecrypt.spark._stream import IcebergStreamReader, IcebergStreamWriter

__all__ = ["IcebergDataSource"]


class IcebergDataSource(DataSource):
    """``spark.read.format("icecrypt.iceberg")`` / ``df.write.format("icecrypt.iceberg")``."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        options = dict(self.options)
        location = _location(options, "load")
        if options.get(OPT_METADATA_TABLE):
            _no_incremental(options, f"with option {OPT_METADATA_TABLE}")
            return spark_schema(_metadata_table(options, location).schema)
        table = _open_table(options, location)
        try:  # the filter is checked here too, so that load() reports a bad one
            scan = _new_scan(table, options, columns_option(options), options.get(OPT_FILTER) or None)
        except ValueError as exc:
            raise ValueError(f"{NAME}: table {location}: {exc}") from None
        return spark_schema(scan.arrow_schema)

    def reader(self, schema: StructType) -> IcebergReader | MetadataTableReader:
        if self.options.get(OPT_METADATA_TABLE):
            return MetadataTableReader(self.options, schema)
        return IcebergReader(self.options, schema)

    def _check_write(self, where: str) -> None:
        if self.options.get(OPT_METADATA_TABLE):
            raise ValueError(f"{NAME}: metadata tables are read only (option {OPT_METADATA_TABLE})")
        _no_incremental(self.options, where)

    def writer(self, schema: StructType, overwrite: bool) -> IcebergWriter:
        self._check_write("in a write")
        return IcebergWriter(self.options, schema, overwrite)

    def streamReader(self, schema: StructType) -> Any:
        """``spark.readStream``: the appended rows of new snapshots (``icecrypt.spark._stream``)."""
        return IcebergStreamReader(self.options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        """``df.writeStream``: one commit per epoch, exactly once (``icecrypt.spark._stream``)."""
        self._check_write("in a streaming write")
        return IcebergStreamWriter(self.options, schema, overwrite)

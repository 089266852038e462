"""The names that the ``icecrypt.iceberg`` modules share: the source's name and the option
that chooses its path.  It imports nothing, so that :mod:`icecrypt.spark._iceberg` (the
Python source), :mod:`icecrypt.spark._native` (Spark's own Parquet reader) and
:mod:`icecrypt.spark._native_write` can all name them without importing each other."""

from __future__ import annotations

__all__ = ["NAME", "OPT_NATIVE"]

#: the data source's name (``spark.read.format(NAME)``)
NAME = "icecrypt.iceberg"
#: read option: ``auto`` (default: native when it applies), ``true`` (native or an error
#: saying why not), ``false`` (always the Python path)
OPT_NATIVE = "native"

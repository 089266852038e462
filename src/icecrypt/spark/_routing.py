"""Routed reads and writes: Spark's analyzer hands ``icecrypt.iceberg`` to the native path.

In a session built with :func:`icecrypt.spark.configure`, icecrypt's session extension
(``org.icecrypt.spark.NativeRouting``) asks, over Py4J on the driver, the planner that
:func:`route` registered for the session: for a batch read, the native path's plan
(:mod:`icecrypt.spark._native`) or why it does not apply; for an append or a full
overwrite, a write by Spark's own Parquet writer (:mod:`icecrypt.spark._native_write`).
This module sits above both: it is the only one that knows reads and writes are routed.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

from icecrypt.spark._native import (
    EXTENSIONS_CLASS,
    EXTENSIONS_PROPERTY,
    ROUTING_CLASS,
    _jvm_session,
    _native_read,
    jvm_class,
    native_available,
)
from icecrypt.spark._options import NAME, OPT_NATIVE

_log = logging.getLogger("icecrypt.spark")

__all__ = ["route", "warn_unrouted"]


class _Planner:
    """What ``org.icecrypt.spark.NativeRouting`` calls (over Py4J, on the driver) when Spark
    analyzes a read of ``icecrypt.iceberg``: the native path's JVM Dataset, or why it does
    not apply.  Planning errors also answer "does not apply": the read then takes the
    Python path, which raises them as it always has (a tampered file fails either way)."""

    class Java:
        implements = [ROUTING_CLASS + "$Planner"]

    def __init__(self, spark: Any) -> None:
        self._spark = spark

    def plan(self, encoded: str) -> Any:
        options = _decode_options(encoded)
        location = options.pop("path")
        options.pop(OPT_NATIVE, None)
        try:
            frame, why = _native_read(self._spark, location, options)
        except Exception as exc:  # noqa: BLE001 - the Python path raises it again, as before
            why = f"planning failed: {type(exc).__name__}: {exc}"
            frame = None
        if frame is not None:
            return frame._jdf
        _log.debug("%s: table %s: the Python source reads (%s)", NAME, location, why)
        return why

    def write(self, data: Any, encoded: str, overwrite: bool) -> None:
        from icecrypt.spark._native_write import write

        write(self._spark, data, _decode_options(encoded), overwrite)


def _decode_options(encoded: str) -> dict[str, str]:
    fields = encoded.split("\0")[:-1]  # name, value, name, value, ... (NUL-terminated)
    return {fields[i].lower(): fields[i + 1] for i in range(0, len(fields) - 1, 2)}


def route(spark: Any) -> bool:
    """Let ``spark``'s reads of ``icecrypt.iceberg`` take the native path when it applies
    (option ``native`` as for :func:`icecrypt.spark.read_table`), and its appends and full overwrites
    Spark's own Parquet writer (``icecrypt.spark._native_write``); True when they can:
    a classic session built with :func:`icecrypt.spark.configure` (the extension is static) whose jar
    loads.  Calling it again is harmless; ``icecrypt.spark.register`` calls it."""
    jsession = _jvm_session(spark)
    if jsession is None or _unroutable(spark) is not None:
        return False
    from pyspark.java_gateway import ensure_callback_server_started

    routing = jvm_class(spark, ROUTING_CLASS)
    if routing.registered(jsession) and getattr(spark, "_icecrypt_planner", None) is not None:
        return True
    ensure_callback_server_started(spark.sparkContext._gateway)
    planner = _Planner(spark)
    spark._icecrypt_planner = planner  # py4j holds the object only while the JVM refers to it
    routing.register(jsession, planner)
    return True


def _unroutable(spark: Any) -> str | None:
    """Why a classic session's ``icecrypt.iceberg`` reads cannot be routed (None: they can)."""
    extensions = [name.strip() for name in (spark.conf.get(EXTENSIONS_PROPERTY, "") or "").split(",")]
    if EXTENSIONS_CLASS not in extensions:
        return "this session was built without icecrypt's session extension"
    if not native_available(spark, install=False):
        return "icecrypt's jar is not on this session's classpath"
    return None


def warn_unrouted(spark: Any) -> None:
    """Warn once per session when a classic session's ``icecrypt.iceberg`` reads and writes
    cannot take the native path (called by ``icecrypt.spark.register`` when :func:`route`
    answered False): they then run as Python tasks, several times slower, and nothing else
    would say so.  Spark Connect sessions (no native path to miss) are not warned about."""
    if _jvm_session(spark) is None or getattr(spark, "_icecrypt_unrouted_warned", False):
        return
    why = _unroutable(spark)
    if why is None:
        return
    spark._icecrypt_unrouted_warned = True
    warnings.warn(
        f"icecrypt.spark.register: {why}, so icecrypt.iceberg reads and writes in it run as Python "
        "tasks (several times slower than Spark's own Parquet reader and writer, which the native path "
        "uses); build the session with icecrypt.spark.configure(SparkSession.builder...).getOrCreate() "
        "to take the native path", RuntimeWarning, stacklevel=3)

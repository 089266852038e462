"""The Python half of icecrypt's Spark SQL catalog (``org.icecrypt.spark.SparkCatalog``).

The catalog's JVM classes plan nothing themselves: every decision about a table (what an
identifier names, its schema, the files a scan reads, a commit) is made here, on the
driver, by icecrypt's catalogs and table API, called over Py4J through one object,
:class:`CatalogBridge`, that :func:`register` hands the JVM once per driver (as
``icecrypt.spark._native.route`` hands it the native read's planner).

Calls: ``call(method, request)`` with a JSON request, answered with JSON: ``{"ok": value}``
or ``{"error": {"kind": ..., "message": ...}}`` (every exception is caught here: the JVM
maps the kind onto Spark's exceptions -- no such table, already exists, ... -- and shows
the message, which names the catalog and table and never holds a key).  ``dataset``
answers with a JVM Dataset (a metadata table's rows).  Py4J serves each call on a thread
of its callback server, several at once when Spark plans concurrently: what is shared
here (catalogs, pending writes and stages) is guarded by locks.

Keys never travel as answers: a scan's file keys and a write's secret are handed to the
JVM by a static call made from inside the callback (``org.icecrypt.spark.catalog.Keys``),
with py4j's logging of the command suppressed (``_native._keys_in_flight``).
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from icecrypt.spark._sql.answers import kind_of as _kind
from icecrypt.spark._sql.answers import message_of as _message
from icecrypt.spark._sql.protocol import METHODS as _METHODS

__all__ = ["BRIDGE_CLASS", "CatalogBridge", "register"]

_log = logging.getLogger("icecrypt.spark.sql")

#: the JVM side: its registry and the interface the bridge implements
BRIDGE_CLASS = "org.icecrypt.spark.catalog.Bridge"

class CatalogBridge:
    """What ``org.icecrypt.spark.catalog.Bridge`` calls (over Py4J, on the driver)."""

    class Java:
        implements = [BRIDGE_CLASS + "$Driver"]

    def __init__(self, spark: Any) -> None:
        self.spark = spark
        self.lock = threading.Lock()
        self.writes: dict[str, Any] = {}  # write id -> its pending write (write.py)
        self.stages: dict[str, Any] = {}  # stage id -> its staged table (write.py)
        self.streams: dict[str, Any] = {}  # stream id -> a streaming read's planner (stream.py)

    def call(self, name: str, request: str) -> str:
        try:
            function = _METHODS.get(name)
            if function is None:
                raise NotImplementedError(f"icecrypt catalog: unknown bridge method {name!r}")
            value = function(self, json.loads(request))
            return json.dumps({"ok": value}, allow_nan=False)
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the JVM as a Spark error
            _log.debug("icecrypt catalog: %s failed: %s: %s", name, type(exc).__name__, _message(exc))
            return json.dumps({"error": {"kind": _kind(exc), "message": _message(exc)}})

    def dataset(self, name: str, request: str) -> Any:
        """A JVM Dataset for ``name`` (a metadata table's rows), or a JSON error string."""
        try:
            function = _METHODS.get("dataset:" + name)
            if function is None:
                raise NotImplementedError(f"icecrypt catalog: unknown bridge dataset {name!r}")
            return function(self, json.loads(request))
        except BaseException as exc:  # noqa: BLE001 - as call()
            return json.dumps({"error": {"kind": _kind(exc), "message": _message(exc)}})


def register(spark: Any) -> bool:
    """Hand the JVM of the classic session ``spark`` this driver's bridge (once per JVM;
    again after the session's JVM was restarted); True when the catalog can be used."""
    from icecrypt.spark._native import _jvm_session, jvm_class

    if _jvm_session(spark) is None:
        return False
    try:
        registry = jvm_class(spark, "org.icecrypt.spark.catalog.Bridge")
        if registry.registered() and getattr(spark.sparkContext, "_icecrypt_bridge", None) is not None:
            return True
    except Exception:  # noqa: BLE001 - the jar is not on the session's classpath
        return False
    from pyspark.java_gateway import ensure_callback_server_started

    # the modules whose functions the bridge serves
    from icecrypt.spark._sql import delete, procedures, scan, stream, tables, views, write  # noqa: F401

    ensure_callback_server_started(spark.sparkContext._gateway)
    bridge = CatalogBridge(spark)
    spark.sparkContext._icecrypt_bridge = bridge  # py4j keeps the object only while Python refers to it
    registry.register(bridge)
    return True

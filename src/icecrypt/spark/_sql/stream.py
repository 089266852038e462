"""Structured Streaming reads of the SQL catalog (``org.icecrypt.spark.catalog.Streams``)
on the driver: ``spark.readStream.table("cat.db.t")``.

The stream's offsets, its walk over the branch's snapshots (where it starts, appends
only, overwrites and deletes refused or passed over by option, replace snapshots passed
over, every label checked against its manifests first) and its rate limits are those of
icecrypt's ``icecrypt.iceberg`` source (:class:`icecrypt.spark._stream.IcebergStreamReader`):
a :class:`_CatalogStream` is that reader over a table the catalog loads, kept here for
the life of the query (``stream_open`` .. ``stream_stop``).  A micro-batch's files are
planned as a batch scan's (:func:`.scan.plan_tasks`): paths, sizes, deleted positions
in the answer, the files' keys left with the JVM's ``Keys``; offsets are JSON snapshot
positions and never hold a key.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from icecrypt.spark._sql import catalogs as _catalogs
from icecrypt.spark._sql.protocol import catalog_of, identifier, method
from icecrypt.spark._stream import IcebergStreamReader, _true

#: the options a catalog stream takes (Iceberg's names; Java passes only these)
_OPTIONS = ("stream-from-timestamp", "start-snapshot-id", "streaming-max-files-per-micro-batch",
            "streaming-max-rows-per-micro-batch", "streaming-skip-overwrite-snapshots",
            "streaming-skip-delete-snapshots")


class _CatalogStream(IcebergStreamReader):
    """The Python source's planning over a catalog table.  Its __init__ sets what the
    walk reads (the parent's opens a table by path); errors name the catalog's table."""

    def __init__(self, catalog: Any, ident: tuple[str, ...], what: str, branch: str,
                 options: dict[str, str]) -> None:
        from icecrypt.spark._common import positive_int
        from icecrypt.spark._iceberg import _integer_option

        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise ValueError(f"{what}: streaming read option {unknown[0]} is not supported (options: "
                             f"{', '.join(_OPTIONS)})")
        self.options = dict(options)
        self.catalog, self.identifier = catalog, ident
        self.location = ".".join((getattr(catalog, "name", "?"), *ident))  # in the source's errors
        self.branch = branch
        self.from_timestamp = _integer_option(options, "stream-from-timestamp",
                                              "a timestamp (milliseconds since the epoch)")
        self.start_after = _integer_option(options, "start-snapshot-id", "a snapshot id (an integer)")
        if self.from_timestamp is not None and self.start_after is not None:
            raise ValueError(f"{what}: give stream-from-timestamp or start-snapshot-id, not both")
        self.max_files = positive_int(options, "streaming-max-files-per-micro-batch", 1) \
            if str(options.get("streaming-max-files-per-micro-batch") or "").strip() else None
        self.max_rows = positive_int(options, "streaming-max-rows-per-micro-batch", 1) \
            if str(options.get("streaming-max-rows-per-micro-batch") or "").strip() else None
        self.skip_overwrites = _true(options, "streaming-skip-overwrite-snapshots")
        self.skip_deletes = _true(options, "streaming-skip-delete-snapshots")
        self.row_filter = None
        self.split = None
        self.batch_size = None
        self._table = catalog.load_table(ident)
        self.columns = [f.name for f in self._table.schema.fields]
        self._files = {}
        self._target = None

    def _fresh(self) -> Any:
        from icecrypt.spark._common import file_error

        try:
            self._table.refresh()
        except Exception as exc:
            raise file_error(exc, f"{self.location}: loading the table") from exc
        return self._table

    def micro_batch(self, start: Any, end: Any, push_keys: Any, *, partition: bool = False) -> dict[str, Any]:
        """The plan of the micro-batch from ``start`` to ``end`` (as a batch scan's;
        ``partition``: with each file's ``_partition``)."""
        from icecrypt.spark._sql.scan import plan_tasks

        partitions = self.partitions(start, end)
        table = self._table
        return plan_tasks(table, [p.task for p in partitions], table.schema, None, self.location, push_keys,
                          partition=partition)


def _stream(bridge: Any, request: dict[str, Any]) -> _CatalogStream:
    with bridge.lock:
        stream = bridge.streams.get(request["stream_id"])
    if stream is None:
        raise ValueError(f"icecrypt catalog: stream {request['stream_id']} is unknown (stopped)")
    return stream


def _json(offset: Any) -> str:
    return offset if isinstance(offset, str) else json.dumps(offset)


@method("stream_open")
def _stream_open(bridge: Any, request: dict[str, Any]) -> Any:
    _, catalog = catalog_of(request)
    ref = request["ref"]
    ident = identifier(ref["identifier"])
    what = _catalogs.describe_identifier(catalog, ident)
    if ref.get("branch") is None:
        raise ValueError(f"{what}: a table read at a snapshot or tag cannot be streamed (a stream follows a branch)")
    stream = _CatalogStream(catalog, ident, what, ref["branch"], dict(request.get("options") or {}))
    stream_id = uuid.uuid4().hex
    with bridge.lock:
        bridge.streams[stream_id] = stream
    return {"stream_id": stream_id}


@method("stream_initial_offset")
def _stream_initial_offset(bridge: Any, request: dict[str, Any]) -> Any:
    return _json(_stream(bridge, request).initialOffset())


@method("stream_latest_offset")
def _stream_latest_offset(bridge: Any, request: dict[str, Any]) -> Any:
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxFiles, ReadMaxRows

    limit = request.get("limit") or {}
    # a limit Spark composed itself: the options' limits (None)
    engine = (ReadMaxFiles(int(limit["files"])) if "files" in limit
              else ReadMaxRows(int(limit["rows"])) if "rows" in limit
              else None if "options" in limit else ReadAllAvailable())
    return _json(_stream(bridge, request).latestOffset(request["start"], engine))


@method("stream_available_now")
def _stream_available_now(bridge: Any, request: dict[str, Any]) -> Any:
    _stream(bridge, request).prepareForTriggerAvailableNow()
    return True


@method("stream_plan")
def _stream_plan(bridge: Any, request: dict[str, Any]) -> Any:
    from icecrypt.spark._sql.scan import push_keys

    return _stream(bridge, request).micro_batch(request["start"], request["end"], push_keys(bridge),
                                                partition=request.get("partition") is True)


@method("stream_commit")
def _stream_commit(bridge: Any, request: dict[str, Any]) -> Any:
    _stream(bridge, request).commit(request["end"])
    return True


@method("stream_stop")
def _stream_stop(bridge: Any, request: dict[str, Any]) -> Any:
    with bridge.lock:
        bridge.streams.pop(request["stream_id"], None)
    return True

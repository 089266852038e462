"""The SQL catalog's writes (``org.icecrypt.spark.catalog.Writes``) on the driver: their
plan, their commit through icecrypt's table API, their abort; and the staged tables of
``CREATE/REPLACE TABLE ... AS SELECT`` (:mod:`.staging`).

``begin_write`` (when the write runs): the table must still have the schema and
partition spec the statement was planned against and be writable by Spark's Parquet
writer (local, Parquet, types Spark writes as Iceberg reads them).  The write's secret
(32 random bytes) is left with the JVM (``Keys``); each file's DEK and AAD prefix are
HMAC-SHA256 of it and the file's name (``_native_write.file_key``, what the executors'
``FileEncryption`` derives).

``commit_write``: per reported file, its key metadata (those keys, the stored length),
its footer read and authenticated here (row count, column statistics, as the table's
own writer records them), its partition; then one commit: ``append_files``,
``overwrite_files`` (``INSERT OVERWRITE`` of a whole table), ``overwrite_files_by_filter``
(``overwrite(condition)``, a static ``PARTITION``), ``dynamic_partition_overwrite_files``
(dynamic overwrite) -- the last two validated from the snapshot the statement read.  A
failed commit leaves no data file (the commit functions delete them; so does
``abort_write``).
"""

from __future__ import annotations

import base64
import contextlib
import decimal
import os
import posixpath
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    ListType,
    MapType,
    StringType,
    StructType,
)

from icecrypt.errors import NoSuchNamespaceError, NoSuchTableError, TableAlreadyExistsError
from icecrypt.spark._sql import catalogs as _catalogs
from icecrypt.spark._sql import ddl as _ddl
from icecrypt.spark._sql import types as _types
from icecrypt.spark._sql.protocol import catalog_of, identifier, method
from icecrypt.spark._sql.filters import to_filter
from icecrypt.spark._sql.staging import Transaction

#: replace: the files of a copy-on-write UPDATE / MERGE / DELETE (Spark's rewrite), which
#: take the place of the files the statement's scan read; delta: a merge-on-read one's new
#: files and the row positions it deleted in files the scan read
_MODES = ("append", "overwrite", "overwrite_filter", "dynamic", "replace", "delta")
#: the modes of row-level operations, which name what their scan read
_ROW_LEVEL = ("replace", "delta")
_COMMANDS = ("update", "merge", "delete")


@dataclass
class Stage:
    """A staged CREATE/REPLACE (its transaction) and what was written into it."""

    transaction: Transaction
    replace: bool
    what: str
    data_files: list[str] = field(default_factory=list)
    written: bool = False


@dataclass
class PendingWrite:
    """A write between begin_write and its commit or abort."""

    write_id: str
    what: str
    table: Any
    stage: Stage | None
    mode: str
    row_filter: Any
    branch: str | None
    start_snapshot_id: int | None
    secret: bytes | None
    key_length: int
    root: str  # the data directory, a path on the table's filesystem
    recorded_root: str  # the same as the metadata records it
    spec: Any
    schema: Any
    sort_order_id: int
    #: spark.wap.id: the append is staged with it (catalogs.audit_publish)
    wap_id: str | None = None
    #: modes replace and delta: {"command", "data_files" (the scan's, as the manifests
    #: record them), "snapshot_id" (where the scan read them)}
    replaced: dict[str, Any] | None = None


# --- what Spark's Parquet writer writes ---------------------------------------------------------


def _why_not_writable(table: Any) -> str | None:
    from icecrypt.spark._native_write import _CODECS, _codec

    properties = table.properties
    if (properties.get("write.format.default") or "parquet").strip().lower() != "parquet":
        return f"its write.format.default is {properties['write.format.default']} (the catalog writes Parquet)"
    if _codec(table) not in _CODECS:
        return f"its Parquet codec {_codec(table)} is not one Spark's writer has"
    if "write.parquet.compression-level" in properties and _codec(table) != "zstd":
        return f"it sets a compression level for codec {_codec(table)}"
    top = list(table.schema.fields)
    for f in _all_fields(table.schema):
        if isinstance(f.field_type, FixedType):
            return f"column {f.name!r} is {f.field_type} (Spark writes binary, not fixed)"
        _, why = _types.spark_type(f.field_type, ids=True)
        if why is not None and not isinstance(f.field_type, (StructType, ListType, MapType)):
            return f"column {f.name!r} is {why}"
        if f.write_default is not None and (f not in top or _types.sql_literal(f.write_default, f.field_type) is None):
            # a top-level column's Spark fills in itself (the table reports it as CURRENT_DEFAULT)
            return f"column {f.name!r} has a write-default value Spark cannot hold"
    return None


def _all_fields(schema: Any) -> list[Any]:
    from icecrypt.spark._native import _fields

    return list(_fields(schema))


def _hadoop_settings(table: Any) -> tuple[str, dict[str, str]]:
    """(Spark's compression name, parquet-java settings) of the table's properties."""
    from icecrypt.spark._native_write import _CODECS, _PARQUET_SETTINGS, _codec

    properties = table.properties
    settings = {setting: str(int(properties[name])) for name, setting in _PARQUET_SETTINGS.items() if name in properties}
    if _codec(table) == "zstd":
        settings["parquet.compression.codec.zstd.level"] = str(int(properties.get("write.parquet.compression-level")
                                                                   or "1"))
    prefix = "write.parquet.bloom-filter-enabled.column."
    for name, value in properties.items():
        if name.startswith(prefix) and value.strip().lower() == "true":
            settings[f"parquet.bloom.filter.enabled#{name[len(prefix):]}"] = "true"
    return _CODECS[_codec(table)], settings


def nested_ids(schema: Any) -> dict[str, int]:
    """Parquet path -> field id of list elements and map keys and values (Spark's writer
    gives struct fields their ids; ``IdWriteSupport`` adds these)."""
    out: dict[str, int] = {}

    def walk(t: Any, path: str) -> None:
        if isinstance(t, StructType):
            for f in t.fields:
                walk(f.field_type, f"{path}.{f.name}" if path else f.name)
        elif isinstance(t, ListType):
            out[f"{path}.list.element"] = t.element_id
            walk(t.element_type, f"{path}.list.element")
        elif isinstance(t, MapType):
            out[f"{path}.key_value.key"] = t.key_id
            out[f"{path}.key_value.value"] = t.value_id
            walk(t.key_type, f"{path}.key_value.key")
            walk(t.value_type, f"{path}.key_value.value")

    walk(schema.as_struct(), "")
    return out


def _spec_plan(table: Any, schema: Any, write_schema: dict[str, Any]) -> list[dict[str, Any]]:
    """The spec's fields as the writer computes them: source ordinals, struct widths, type."""
    out = []
    for spec_field in table.spec.fields:
        column = schema.find_column_name(spec_field.source_id)
        if column is None:
            raise ValueError(f"partition field {spec_field.name!r}: its source column is not in the schema")
        names = column.split(".")
        path, widths, struct = [], [], write_schema
        for name in names:
            fields = struct["fields"]
            widths.append(len(fields))
            index = next((i for i, f in enumerate(fields) if f["name"] == name), None)
            if index is None or (len(path) < len(names) - 1 and not isinstance(fields[index]["type"], dict)):
                raise ValueError(f"partition field {spec_field.name!r}: source {column} is not a struct field path")
            path.append(index)
            source = fields[index]["type"]
            struct = source if isinstance(source, dict) and source.get("type") == "struct" else {"fields": []}
        name = _ddl._transform_name(spec_field.transform)
        out.append({"name": spec_field.name, "transform": name, "param": _ddl._transform_param(spec_field.transform),
                    "path": path, "widths": widths, "source": source})
    return out


def _decode(value: str | None, field_type: Any) -> Any:
    """A partition value as the writer reported it, in Iceberg's internal form."""
    if value is None:
        return None
    if isinstance(field_type, StringType):
        return value
    if isinstance(field_type, (BinaryType, FixedType)):
        return base64.b64decode(value)
    if isinstance(field_type, DecimalType):
        return decimal.Decimal(value)
    if isinstance(field_type, BooleanType):
        return value == "true"
    if isinstance(field_type, (FloatType, DoubleType)):
        return float(value)
    return int(value)


# --- begin ------------------------------------------------------------------------------------


def _plan(bridge: Any, pending: PendingWrite, secret: bytes | None) -> dict[str, Any]:
    from icecrypt.spark._sql.scan import push_keys

    table = pending.table
    compression, settings = _hadoop_settings(table)
    schema_json = _types.read_schema(pending.schema)
    if secret is not None:
        push_keys(bridge)(pending.write_id, base64.b64encode(secret).decode("ascii"))
    return {
        "write_id": pending.write_id,
        "encrypted": secret is not None,
        "key_length": pending.key_length,
        "root": pending.root,
        "schema": schema_json,
        "spec": _spec_plan(table, pending.schema, schema_json),
        "nested_ids": nested_ids(pending.schema),
        "compression": compression,
        "hadoop": settings,
    }


def written_schema(table: Any, given: dict[str, Any], merge: bool, what: str, *,
                   by_position: bool = False) -> tuple[Any, Any]:
    """(the table, the schema the write's files are written with) for a write Spark did not
    resolve to the table's columns (``write.spark.accept-any-schema``): its columns
    (``given``, Spark's JSON) matched by name to the table's, in the write's order, each of
    the table's type or one it promotes to (:func:`_write_promotes`: the files hold the
    write's type); a missing optional column is null in the new files, a missing
    required one is refused.  ``merge`` (the write option mergeSchema): the columns the
    table lacks are added first, and nullability relaxed, in a commit of their own
    (Iceberg's ``unionByNameWith``), as Iceberg's Spark writes do.  ``by_position``: the
    rows came by position under names none of the table's (``INSERT INTO t VALUES``: the
    JVM saw so), one per column: they are the table's columns in order, each of the
    column's type."""
    from pyiceberg.schema import Schema

    if by_position:
        own = table.schema.fields
        if len(given["fields"]) != len(own):
            raise ValueError(f"{what}: the write has {len(given['fields'])} columns, the table {len(own)}")
        given = {"type": "struct", "fields": [{**f, "name": column.name}
                                              for f, column in zip(given["fields"], own, strict=True)]}
        merge = False
    incoming = _types.iceberg_schema(given, what)
    own_names = {f.name.lower() for f in table.schema.fields}
    if not by_position and not any(f.name.lower() in own_names for f in incoming.fields):
        raise ValueError(f"{what}: the write's columns ({', '.join(f.name for f in incoming.fields)}) match none of "
                         f"the table's by name, and by position it has {len(incoming.fields)} columns, the table "
                         f"{len(table.schema.fields)}")
    given_names = {f.name.lower() for f in incoming.fields}
    missing = [f.name for f in table.schema.fields if f.required and f.name.lower() not in given_names]
    if missing:  # before any schema change: a refused write changes nothing
        raise ValueError(f"{what}: the write lacks the table's required column {missing[0]!r}")
    if merge:
        try:
            with table.update_schema() as update:
                update.union_by_name(incoming)
        except ValueError as exc:
            raise ValueError(f"{what}: mergeSchema: {exc}") from None
    columns = {f.name: f for f in table.schema.fields}
    folded = {name.lower(): f for name, f in columns.items()}
    fields = []
    for column in incoming.fields:
        match = columns.get(column.name) or folded.get(column.name.lower())
        if match is None:
            raise ValueError(f"{what}: the write's column {column.name!r} is not a column of the table (write with "
                             "option mergeSchema=true to add it)")
        ours, theirs = _types.spark_type(match.field_type, ids=False)[0], _types.spark_type(column.field_type, ids=False)[0]
        if ours != theirs:
            if not _write_promotes(column.field_type, match.field_type):
                raise ValueError(f"{what}: the write's column {column.name!r} is {theirs}, the table's is {ours} "
                                 "(cast it)")
            # written as it came, under the column's id: readers promote it as they do the
            # files written before an ALTER COLUMN ... TYPE (Iceberg's Spark writes do the same)
            match = match.model_copy(update={"field_type": column.field_type})
        if match.required and column.optional:
            raise ValueError(f"{what}: the write's column {column.name!r} may be null; the table's is required")
        fields.append(match)
    return table, Schema(*fields, schema_id=table.schema.schema_id)


def _write_promotes(written: Any, column: Any) -> bool:
    """Whether a file column of type ``written`` may hold a table column of type ``column``:
    the promotions of every format version (int -> long, float -> double, a decimal to a
    wider one of its scale), those Iceberg's Spark writes accept for a table that takes
    any schema.  A top-level column's own type only: a nested type must be the table's."""
    from icecrypt.table.ops.schema import promotion_allowed

    return written != column and written.is_primitive and promotion_allowed(written, column, format_version=2)


def begin(bridge: Any, table: Any, what: str, *, mode: str, filters: list[dict[str, Any]], branch: str | None,
          start_snapshot_id: int | None, stage: Stage | None = None,
          replaced: dict[str, Any] | None = None, wap_id: str | None = None,
          writes_rows: bool = True, write_schema: dict[str, Any] | None = None,
          merge_schema: bool = False, by_position: bool = False) -> dict[str, Any]:
    """Plan a write; ``writes_rows`` false (a merge-on-read that only deletes) makes no write
    secret: its tasks write no file, and a file they report is refused at commit.
    ``write_schema``: the rows' columns when Spark did not resolve them to the table's
    (:func:`written_schema`; ``merge_schema``: add the new ones first)."""
    from icecrypt.spark._native import _spark_path
    from icecrypt.table.files.write_data import table_sort_order

    if mode not in _MODES:
        raise ValueError(f"{what}: unknown write mode {mode!r}")
    if (mode in _ROW_LEVEL) != (replaced is not None):
        raise ValueError(f"{what}: a row-level write names the files its scan read, and only it")
    if not writes_rows and mode != "delta":
        raise ValueError(f"{what}: only a merge-on-read write can write no rows")
    if replaced is not None:
        if replaced.get("command") not in _COMMANDS or not isinstance(replaced.get("data_files"), list):
            raise ValueError(f"{what}: malformed replacing write {sorted(replaced)}")
        start_snapshot_id = replaced.get("snapshot_id")
    if wap_id is not None and mode != "append":
        raise NotImplementedError(f"{what}: spark.wap.id stages appends (INSERT INTO, writeTo().append()); a {mode} "
                                  "write cannot be staged here: unset spark.wap.id, or write to a branch "
                                  "(spark.wap.branch)")
    why = _why_not_writable(table)
    if why is not None:
        raise NotImplementedError(f"{what}: Spark's Parquet writer cannot write this table: {why}")
    recorded_root = (table.properties.get("write.data.path") or f"{table.location.rstrip('/')}/data").rstrip("/")
    root = table.fs_path(recorded_root, what="data directory")
    if _spark_path(root + "/x", table.filesystem) is None:
        raise NotImplementedError(f"{what}: the table is not on the local file system: the SQL catalog writes local "
                                  "tables only")
    schema = table.schema
    if write_schema is not None:
        table, schema = written_schema(table, write_schema, merge_schema, what, by_position=by_position)
    row_filter = to_filter(filters, table.schema, strict=True) if mode == "overwrite_filter" else None
    order = table_sort_order(table.metadata)
    key_length = table.encryption_manager.data_key_length if table.encrypted else 0
    secret = os.urandom(32) if table.encrypted and writes_rows else None
    pending = PendingWrite(
        write_id=uuid.uuid4().hex, what=what, table=table, stage=stage, mode=mode, row_filter=row_filter,
        branch=branch, start_snapshot_id=start_snapshot_id, secret=secret,
        key_length=key_length, root=root, recorded_root=recorded_root, spec=table.spec, schema=schema,
        sort_order_id=order.order_id if order is not None else 0, replaced=replaced, wap_id=wap_id,
    )  # fmt: skip
    plan = _plan(bridge, pending, pending.secret)
    with bridge.lock:
        bridge.writes[pending.write_id] = pending
    return plan


@method("begin_write")
def _begin_write(bridge: Any, request: dict[str, Any]) -> Any:
    _, catalog = catalog_of(request)
    ref = request["ref"]
    mode = request.get("mode") or "append"
    filters = request.get("filters") or []
    if ref.get("stage"):
        with bridge.lock:
            stage = bridge.stages.get(ref["stage"])
        if stage is None:
            raise ValueError(f"icecrypt catalog: staged table {ref['stage']} is gone (committed or aborted)")
        return begin(bridge, stage.transaction.table, stage.what, mode=mode, filters=filters, branch=None,
                     start_snapshot_id=None, stage=stage)
    table, what, branch = writable_table(catalog, ref)
    return begin(bridge, table, what, mode=mode, filters=filters, branch=branch,
                 start_snapshot_id=ref.get("snapshot_id"), replaced=request.get("replaced"), wap_id=ref.get("wap_id"),
                 writes_rows=request.get("writes_rows", True) is not False, write_schema=request.get("write_schema"),
                 merge_schema=request.get("merge_schema") is True, by_position=request.get("by_position") is True)


def writable_table(catalog: Any, ref: dict[str, Any], *, same_spec: bool = True) -> tuple[Any, str, str | None]:
    """(the table a statement's ``ref`` names, loaded now; its description for errors; the
    branch to write, None for main).  ValueError when the ref selects a snapshot or tag, or
    the table's schema (with ``same_spec`` also its partition spec) changed since the
    statement was planned."""
    ident = identifier(ref["identifier"])
    what = _catalogs.describe_identifier(catalog, ident)
    if ref.get("branch") is None:
        raise ValueError(f"{what}: a table read at a snapshot or tag cannot be written")
    table = catalog.load_table(ident)
    if table.schema.schema_id != ref.get("schema_id") or (same_spec and table.spec.spec_id != ref.get("spec_id")):
        changed = "schema or partition spec" if same_spec else "schema"
        raise ValueError(f"{what}: the table's {changed} changed since the statement was planned; run it again")
    return table, what, None if ref["branch"] == "main" else ref["branch"]


# --- commit / abort ------------------------------------------------------------------------


def _records(pending: PendingWrite, files: list[list[Any]]) -> list[dict[str, Any]]:
    """The manifest records of the reported files (footers read and authenticated here)."""
    import pyarrow.parquet as pq

    from pyiceberg.schema import Schema

    from icecrypt.parquet import open_file
    from icecrypt.spark._native_write import file_key
    from icecrypt.table.files.write_data import _parquet_stats, _statistics_plan, data_file_record, drop_nan_bounds
    from icecrypt.table.model.metadata_columns import LINEAGE

    table = pending.table
    if files and table.encrypted and pending.secret is None:
        raise ValueError(f"{pending.what}: the write planned no rows, yet reports {len(files)} written file(s); "
                         "nothing was committed")
    schema = pending.schema
    stats_plan = _statistics_plan(schema, table.properties)
    # a row-level operation's files store the rows' lineage after the columns (Iceberg's layout)
    lineage_schema = Schema(*schema.fields, *LINEAGE, schema_id=schema.schema_id)
    lineage_plan = _statistics_plan(lineage_schema, table.properties)
    partition_fields = pending.spec.partition_type(schema).fields
    records = []
    for relative, size, rows, values in files:
        if relative.startswith("/") or ".." in relative.split("/"):
            raise ValueError(f"{pending.what}: a written file {relative!r} outside the data directory (refused)")
        path = f"{pending.root}/{relative}"
        actual = table.filesystem.get_file_info(path).size
        if actual != size:
            raise ValueError(f"{pending.what}: written file {path} is {actual} bytes, the writer reported {size}")
        key = None
        if pending.secret is not None:
            key = file_key(pending.secret, posixpath.basename(relative), pending.key_length).with_file_length(size)
            with open_file(path, key, filesystem=table.filesystem) as opened:
                metadata = opened.metadata
        else:
            with table.filesystem.open_input_file(path) as stream:
                metadata = pq.ParquetFile(stream).metadata
        if metadata.num_rows != rows:
            raise ValueError(f"{pending.what}: written file {path} holds {metadata.num_rows} rows, the writer "
                             f"reported {rows}")
        stored = _stored_lineage(metadata)
        if stored and (pending.mode not in _ROW_LEVEL or table.format_version < 3):
            raise ValueError(f"{pending.what}: written file {path} stores row lineage, which only a row-level "
                             "operation on a table with row lineage writes (refused)")
        stats = _parquet_stats(metadata, {}, lineage_schema if stored else schema,
                               lineage_plan if stored else stats_plan)
        drop_nan_bounds(stats, schema)
        partition = {f.name: _decode(v, f.field_type) for f, v in zip(partition_fields, values, strict=True)}
        records.append(data_file_record(f"{pending.recorded_root}/{relative}", "PARQUET", partition, rows, size, key,
                                        stats, pending.sort_order_id))
    return records


def _stored_lineage(metadata: Any) -> bool:
    """Whether a written file stores the lineage columns (by their reserved field ids)."""
    from icecrypt.table.model.metadata_columns import LINEAGE

    ids = {str(f.field_id).encode() for f in LINEAGE}
    return any((f.metadata or {}).get(b"PARQUET:field_id") in ids for f in metadata.schema.to_arrow_schema())


def _remove(pending: PendingWrite, relatives: list[str]) -> None:
    """Delete the write's files (confined to the table, best effort), and files of its
    failed attempts beside them."""
    from icecrypt.table.ops.write import remove_job_leftovers

    table = pending.table
    directories = set()
    for relative in relatives:
        recorded = f"{pending.recorded_root}/{relative}"
        directories.add(posixpath.dirname(recorded))
        with contextlib.suppress(Exception):
            table.filesystem.delete_file(table.locations.delete_path(recorded, what="data file"))
    with contextlib.suppress(Exception):
        remove_job_leftovers(table, pending.write_id, [], sorted(directories))


def _take(bridge: Any, write_id: str) -> PendingWrite:
    with bridge.lock:
        pending = bridge.writes.pop(write_id, None)
    if pending is None:
        raise ValueError(f"icecrypt catalog: write {write_id} is unknown (committed or aborted already)")
    return pending


def _epoch_check(pending: PendingWrite, query_id: str, epoch: int, files: bool) -> Any:
    """The commit check of a streaming micro-batch: the Python sink's (:mod:`.._stream`),
    so that both sinks find each other's epochs (same summary properties)."""
    from icecrypt.spark._stream import EpochAlreadyCommitted, committed_epoch

    def check(version: Any, changes: Any) -> None:
        committed = committed_epoch(version, query_id, epoch, changes, branch=pending.branch or "main",
                                    table=pending.what, files=files)
        if committed is not None:
            raise EpochAlreadyCommitted(f"epoch {epoch} of query {query_id} (snapshot {committed})")

    return check


def commit(pending: PendingWrite, files: list[list[Any]], *, query_id: str | None = None,
           epoch: int | None = None, read: dict[str, Any] | None = None,
           deletes: dict[str, Any] | None = None) -> None:
    """Commit the reported files.  With ``query_id`` and ``epoch`` (a streaming micro-batch)
    the snapshot's summary records them and the commit is skipped -- the files deleted --
    when the branch already holds that epoch of that query (Spark replays the epoch whose
    commit its checkpoint did not record).  ``read``: a copy-on-write's scan as it ran
    (the files Spark's runtime filter kept of those planned at ``begin``): those are the
    files replaced.  ``deletes``: a merge-on-read's deleted rows, data file -> positions,
    in files its scan read."""
    from icecrypt.errors import SnapshotIntegrityError
    from icecrypt.spark._common import file_error
    from icecrypt.spark._stream import EPOCH_ID_PROPERTY, QUERY_ID_PROPERTY, EpochAlreadyCommitted
    from icecrypt.table.ops.rowlevel import dynamic_partition_overwrite_files, merge_files, overwrite_files_by_filter
    from icecrypt.table.ops.write import append_files, overwrite_files

    try:
        records = _records(pending, files)
        scanned = _as_read(pending, read)
        replaced = scanned if pending.mode == "replace" else []
        deleted = _deleted_positions(pending, scanned, deletes)
    except BaseException:
        _remove(pending, [f[0] for f in files])
        raise
    table, branch = pending.table, pending.branch
    stage = pending.stage
    streaming: dict[str, Any] = {}
    if query_id is not None:
        if epoch is None or stage is not None or pending.mode not in ("append", "overwrite"):
            _remove(pending, [f[0] for f in files])
            raise ValueError(f"{pending.what}: a streaming commit appends or replaces the table, with an epoch")
        streaming = {"summary": {QUERY_ID_PROPERTY: query_id, EPOCH_ID_PROPERTY: str(epoch)},
                     "check": _epoch_check(pending, query_id, epoch, bool(records))}
    try:
        if stage is not None:
            if stage.replace:
                overwrite_files(table, records)
            else:
                append_files(table, records)
            stage.written = True
            stage.data_files.extend(r["file_path"] for r in records)
        elif pending.mode == "append" and pending.wap_id is not None:
            if streaming:
                raise ValueError(f"{pending.what}: spark.wap.id stages batch appends, not streaming micro-batches")
            append_files(table, records, wap_id=pending.wap_id)
        elif pending.mode == "append":
            append_files(table, records, branch=branch, **streaming)
        elif pending.mode == "overwrite":
            overwrite_files(table, records, branch=branch, **streaming)
        elif pending.mode == "replace":
            merge_files(table, records, removed=replaced, kind=pending.replaced["command"],
                        branch=branch, start_snapshot_id=pending.start_snapshot_id)
        elif pending.mode == "delta":
            merge_files(table, records, deleted_positions=deleted, kind=pending.replaced["command"],
                        branch=branch, start_snapshot_id=pending.start_snapshot_id)
        elif pending.mode == "overwrite_filter":
            overwrite_files_by_filter(table, records, pending.row_filter, branch=branch,
                                      start_snapshot_id=pending.start_snapshot_id)
        else:
            dynamic_partition_overwrite_files(table, records, branch=branch,
                                              start_snapshot_id=pending.start_snapshot_id)
    except EpochAlreadyCommitted:
        _remove(pending, [f[0] for f in files])  # a replay: its rows are in the table already
    except SnapshotIntegrityError:
        _remove(pending, [f[0] for f in files])
        raise
    except Exception as exc:
        _remove(pending, [f[0] for f in files])
        raise file_error(exc, f"{pending.what}: committing the write") from exc


def _as_read(pending: PendingWrite, read: dict[str, Any] | None) -> list[str]:
    """The data files a row-level operation's scan read, which must be of the files planned
    when the write began, for the same command and snapshot (what the JVM reports is
    checked, never taken on trust: a file the scan did not plan is refused)."""
    if pending.mode not in _ROW_LEVEL:
        if read is not None:
            raise ValueError(f"{pending.what}: only a row-level write names the files its scan read")
        return []
    planned = pending.replaced
    if read is None:
        return list(planned["data_files"])
    if (read.get("command") != planned["command"] or read.get("snapshot_id") != planned.get("snapshot_id")
            or not isinstance(read.get("data_files"), list)):  # fmt: skip
        raise ValueError(f"{pending.what}: the {planned['command']}'s scan at commit is not the one it began with; "
                         "nothing was committed")
    unplanned = set(read["data_files"]) - set(planned["data_files"])
    if unplanned:
        raise ValueError(f"{pending.what}: the {planned['command']} reports reading {sorted(unplanned)[0]}, which "
                         "its scan did not plan; nothing was committed")
    return list(dict.fromkeys(read["data_files"]))


def _deleted_positions(pending: PendingWrite, scanned: list[str],
                       deletes: dict[str, Any] | None) -> dict[str, list[int]]:
    """A merge-on-read's deleted positions (data file -> row positions), each file one its
    scan read (``scanned``: :func:`_as_read`); merge_files checks the positions against the
    file's rows."""
    if pending.mode != "delta":
        if deletes:
            raise ValueError(f"{pending.what}: only a merge-on-read write deletes rows by position")
        return {}
    read_files = set(scanned)
    out: dict[str, list[int]] = {}
    for path, positions in (deletes or {}).items():
        if path not in read_files:
            raise ValueError(f"{pending.what}: the {pending.replaced['command']} reports deleting rows of {path}, "
                             "which its scan did not read; nothing was committed")
        if not isinstance(positions, list) or not all(type(p) is int for p in positions):
            raise ValueError(f"{pending.what}: malformed row positions for {path}; nothing was committed")
        out[path] = positions
    return out


@method("commit_write")
def _commit_write(bridge: Any, request: dict[str, Any]) -> Any:
    pending = _take(bridge, request["write_id"])
    epoch = request.get("epoch")
    commit(pending, request.get("files") or [], query_id=request.get("query_id"),
           epoch=None if epoch is None else int(epoch), read=request.get("replaced"),
           deletes=request.get("deletes"))
    return True


@method("abort_write")
def _abort_write(bridge: Any, request: dict[str, Any]) -> Any:
    with bridge.lock:
        pending = bridge.writes.pop(request["write_id"], None)
    if pending is not None:
        _remove(pending, [f[0] for f in request.get("files") or []])
    return True


# --- staged tables (CTAS, RTAS) -----------------------------------------------------------------


def _same_type(a: Any, b: Any) -> bool:
    return _types.spark_type(a, ids=False) == _types.spark_type(b, ids=False)


def _replace(table: Any, schema: Any, spec: Any, properties: dict[str, str], key_id: str | None, what: str) -> None:
    """Turn ``table`` (a transaction's) into one with ``schema``, ``spec``, no sort order
    and ``properties`` (added to its own), keeping its history: Iceberg's replace."""
    current = table.properties.get("encryption.key-id") or None
    if key_id != current and key_id is not None:
        raise ValueError(f"{what}: REPLACE TABLE cannot change encryption.key-id (from {current!r} to {key_id!r}); "
                         "rotate_keys changes a table's master key")
    if key_id is None and current is not None:
        properties = {k: v for k, v in properties.items() if not k.startswith("encryption.")}
    old = {f.name: f for f in table.schema.fields}
    new = {f.name: f for f in schema.fields}
    try:
        # unsorted first, as Java's replacement (the order's sources may go), then the
        # columns (the current spec's sources stay until the spec has changed), their
        # order, the spec, the columns only the old spec needed, the properties
        table.replace_sort_order().commit()
        same_spec = [(f.name, str(f.transform), schema.find_column_name(f.source_id)) for f in spec.fields] == [
            (f.name, str(f.transform), table.schema.find_column_name(f.source_id)) for f in table.spec.fields]
        with table.update_schema(allow_incompatible_changes=True) as update:
            for name, f in old.items():
                if name not in new or not _same_type(f.field_type, new[name].field_type):
                    if name in new or not any(f.field_id == pf.source_id for pf in table.spec.fields):
                        update.delete_column((name,))
            for name, f in new.items():
                if name not in old or not _same_type(old[name].field_type, f.field_type):
                    update.add_column((name,), f.field_type, doc=f.doc, required=f.required)
                elif old[name].required != f.required or (f.doc or None) != (old[name].doc or None):
                    update.update_column((name,), required=f.required, doc=f.doc or "")
        names = [f.name for f in schema.fields]
        if [f.name for f in table.schema.fields if f.name in new] != names:
            with table.update_schema() as update:  # names are unique again: the new order
                update.move_first((names[0],))
                for before, name in zip(names, names[1:]):
                    update.move_after((name,), (before,))
        if not same_spec:
            with table.update_spec() as update_spec:
                for f in table.spec.fields:
                    update_spec.remove_field(f.name)
                for f in spec.fields:
                    update_spec.add_field(schema.find_column_name(f.source_id), f.transform, f.name)
        gone = [n for n in old if n not in new and n in {f.name for f in table.schema.fields}]
        if gone:
            with table.update_schema(allow_incompatible_changes=True) as update:
                for name in gone:
                    update.delete_column((name,))
        settable = {k: v for k, v in properties.items() if not k.startswith("encryption.")}
        if settable:
            with table.update_properties() as props:
                for k, v in settable.items():
                    props.set(k, v)
    except ValueError as exc:
        raise ValueError(f"{what}: REPLACE TABLE: {exc}") from None


def _take_stage(bridge: Any, stage_id: str) -> Stage:
    with bridge.lock:
        stage = bridge.stages.pop(stage_id, None)
    if stage is None:
        raise ValueError(f"icecrypt catalog: staged table {stage_id} is unknown (committed or aborted already)")
    return stage


def _discard(stage: Stage) -> None:
    transaction = stage.transaction
    for location in stage.data_files:
        with contextlib.suppress(Exception):
            transaction.table.filesystem.delete_file(transaction.table.locations.delete_path(location,
                                                                                              what="data file"))
    transaction.discard()


@method("stage")
def _stage(bridge: Any, request: dict[str, Any]) -> Any:
    name, catalog = catalog_of(request)
    ident = identifier(request["identifier"])
    what = _catalogs.describe_identifier(catalog, ident)
    mode = request.get("mode") or "create"
    schema = _types.iceberg_schema(request["schema"], what)
    spec = _ddl.partition_spec(schema, request.get("transforms") or [])
    properties, key_id, location = _ddl.create_properties(request.get("properties") or {}, what)
    exists = catalog.table_exists(ident)
    if exists and mode == "create":
        raise TableAlreadyExistsError(f"{what} already exists")
    if not exists and mode == "replace":
        raise NoSuchTableError(f"{what} does not exist")
    if exists:
        if location is not None:
            raise ValueError(f"{what}: REPLACE TABLE cannot move the table (LOCATION)")
        if not _catalogs.on_local_files(catalog.load_table(ident)):
            raise NotImplementedError(f"{what}: REPLACE TABLE on an object store is not supported (the table is "
                                      "served through icecrypt.iceberg: overwrite it with INSERT OVERWRITE)")
        transaction = Transaction.on(catalog, ident, catalog.load_table(ident))
        try:
            _replace(transaction.table, schema, spec, properties, key_id, what)
        except BaseException:
            transaction.discard()
            raise
    else:
        if not catalog.namespace_exists(ident[:-1]):
            raise NoSuchNamespaceError(f"catalog {catalog.name!r}: namespace {'.'.join(ident[:-1])} does not exist")
        if key_id is not None and catalog.kms is None:
            raise ValueError(f"{what}: encryption.key-id={key_id}: the catalog has no KMS (its encryption.kms-type "
                             "and encryption.kms.* options)")
        location = (location or _catalogs.default_location(catalog, ident)).rstrip("/")
        if not _catalogs.is_local(location):
            return _stage_on_object_store(name, catalog, request["catalog"], ident, schema, spec, properties, key_id,
                                          location)
        location = os.path.abspath(_catalogs.local_path(location))
        filesystem = catalog.filesystem_for(location) if hasattr(catalog, "filesystem_for") else catalog.filesystem
        transaction = Transaction.create(catalog, ident, location, schema, kms=catalog.kms if key_id else None,
                                         table_key_id=key_id, partition_spec=spec, properties=properties,
                                         filesystem=filesystem)
    stage_id = uuid.uuid4().hex
    with bridge.lock:
        bridge.stages[stage_id] = Stage(transaction, exists, what)
    description = _ddl.describe(name, transaction.table, _catalogs.Selection(ident))
    description["ref"] = {"stage": stage_id}
    return description


def _stage_on_object_store(name: str, catalog: Any, spec_json: dict[str, Any], ident: tuple[str, ...], schema: Any,
                           spec: Any, properties: dict[str, str], key_id: str | None, location: str) -> Any:
    """CREATE TABLE ... AS SELECT on an object store: the table is created now and written
    through ``icecrypt.iceberg`` (which opens it by name), and dropped with its files if
    the statement fails (``abort_created``): not atomic, as Iceberg's catalogs without
    staging run it."""
    if _files_under(catalog, location):
        raise ValueError(f"catalog {catalog.name!r}: table {'.'.join(ident)}: CREATE TABLE ... AS SELECT on an object "
                         f"store needs an empty location, and {location} holds files")
    catalog.create_table(ident, schema, table_key_id=key_id, partition_spec=spec, properties=properties,
                         location=location)
    table = catalog.load_table(ident)
    selection = _catalogs.Selection(ident)
    description = _ddl.object_store(_ddl.describe(name, table, selection), spec_json, table, selection)
    description["staged"] = {"created": list(ident), "location": location}
    return description


@method("abort_created")
def _abort_created(bridge: Any, request: dict[str, Any]) -> Any:
    """A failed CTAS on an object store: the table it created is dropped, and every file
    under its location removed (the location was empty when the statement created the
    table there: what is under it now, the statement wrote, a task that finished after
    the job failed too)."""
    from icecrypt.errors import NoSuchTableError

    _, catalog = catalog_of(request)
    ident, location = identifier(request["identifier"]), str(request["location"])
    with contextlib.suppress(NoSuchTableError):
        catalog.drop_table(ident, purge=True)
    filesystem = catalog.filesystem_for(location)
    # Spark gives up on the failed job's other tasks without waiting for them (a Python
    # worker is killed spark.python.task.killTimeout, 2 s, after its task is cancelled), so
    # one may still put its file: the location is emptied until it stays empty for
    # _QUIET_S, for at most _STRAGGLERS_S.
    deadline, quiet_since = time.monotonic() + _STRAGGLERS_S, time.monotonic()
    while True:
        found = _files_under(catalog, location)
        now = time.monotonic()
        if found:
            quiet_since = now
            for found_path in found:
                with contextlib.suppress(FileNotFoundError):
                    filesystem.delete_file(found_path)
        if now >= deadline or now - quiet_since >= _QUIET_S:
            return True
        time.sleep(0.5)


def _files_under(catalog: Any, location: str) -> list[str]:
    """The paths of the files under an object-store ``location`` (on the catalog's file
    system for it)."""
    import pyarrow.fs as pafs

    selector = pafs.FileSelector(location.split("://", 1)[1].rstrip("/"), recursive=True, allow_not_found=True)
    return [info.path for info in catalog.filesystem_for(location).get_file_info(selector)
            if info.type == pafs.FileType.File]


#: a failed object-store CTAS: how long its location must stay empty, and the longest wait
_QUIET_S, _STRAGGLERS_S = 4.0, 20.0


@method("commit_stage")
def _commit_stage(bridge: Any, request: dict[str, Any]) -> Any:
    from icecrypt.table.ops.write import overwrite_files

    stage = _take_stage(bridge, request["stage"])
    try:
        if stage.replace and not stage.written:  # REPLACE TABLE without rows: the table is empty after it
            overwrite_files(stage.transaction.table, [])
        stage.transaction.publish()
    except BaseException:
        _discard(stage)
        raise
    return True


@method("abort_stage")
def _abort_stage(bridge: Any, request: dict[str, Any]) -> Any:
    with bridge.lock:
        stage = bridge.stages.pop(request["stage"], None)
    if stage is not None:
        _discard(stage)
    return True


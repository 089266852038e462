"""Planning the SQL catalog's scans (``org.icecrypt.spark.catalog.Scans``), on the driver.

The scan reads the snapshot the statement loaded (``ref.snapshot_id``), its data files
pruned by the pushed predicates as an Iceberg row filter (:mod:`.filters`).  Every data
file is read by Spark's Parquet reader on the executors: the deletes of a file are read
here, authenticated, as sorted row positions (``LiveRows`` applies them in the scan):

* deletion vectors and position deletes: as the native read reads them;
* equality deletes: the file's live rows are found here (``read_task`` of the file with
  only ``_pos`` projected: the equality columns are read, the deletes applied) and its
  other rows become deleted positions, so the executors need nothing but positions.

Avro data files have no executor reader in a Spark scan: such a scan fails, naming the
file.  The planned files' keys (DEK and AAD prefix per file, never a KEK or master key)
are left with the JVM (``org.icecrypt.spark.catalog.Keys``) from inside this call; the
answer holds paths, sizes, counts and positions only.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from icecrypt.spark._sql import catalogs as _catalogs
from icecrypt.spark._sql.protocol import catalog_of, identifier, method
from icecrypt.spark._sql.filters import to_filter

__all__ = ["plan_files", "plan_tasks"]


def _empty(table: Any) -> dict[str, Any]:
    return {"read_id": "", "encrypted": table.encrypted, "files": [], "deletes": "", "snapshot_id": None,
            "pushable": []}


def pushable_columns(table: Any) -> list[str]:
    """Top-level columns Parquet's row-group filters (which match a file's columns by name)
    may test: no schema of the table gave the name to another field id, nor the column
    another type."""
    from icecrypt.spark._native import reused_names

    reused = reused_names(table.metadata)
    types: dict[str, set[str]] = {}
    for schema in table.metadata.get("schemas") or ():
        for field in schema.get("fields") or ():
            types.setdefault(str(field.get("name")), set()).add(json.dumps(field.get("type"), sort_keys=True))
    return sorted(name for name, kinds in types.items() if name not in reused and len(kinds) == 1)


def _live_positions(table: Any, snapshot_id: int, paths: set[str], what: str) -> dict[str, Any]:
    """The deleted positions of the data files ``paths`` (files with equality deletes),
    from their live rows read here."""
    import numpy as np

    from icecrypt.spark._common import file_error
    from icecrypt.table import read_task

    scan = table.scan(columns=["_pos"], snapshot_id=snapshot_id)
    live: dict[str, list[Any]] = {p: [] for p in paths}
    counts: dict[str, int] = {}
    cache: dict = {}
    for task in scan.plan_files():
        if task.file.path not in paths:
            continue
        counts[task.file.path] = task.file.record_count
        try:
            for batch in read_task(task, table.filesystem, cache=cache):
                live[task.file.path].append(batch.column(0).to_numpy(zero_copy_only=False))
        except Exception as exc:
            raise file_error(exc, f"{what}: applying the equality deletes of {task.file.path}") from exc
    deleted = {}
    for path, parts in live.items():
        kept = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        gone = np.setdiff1d(np.arange(counts.get(path, 0), dtype=np.int64), kept.astype(np.int64))
        deleted[path] = gone if gone.size else None
    return deleted


def plan_files(table: Any, snapshot_id: int | None, filters: list[dict[str, Any]], what: str,
               push_keys: Any, schema_id: int | None = None, *, partition: bool = False,
               mark_deleted: bool = False) -> dict[str, Any]:
    """The scan's plan (see the module); ``push_keys(read_id, value)`` hands the JVM the
    planned files' keys.  ``schema_id``: the schema the statement reads with (the filters'
    column names are its), when it is not the snapshot's.  ``partition``: the scan reads
    ``_partition`` (each file's value is planned).  ``mark_deleted``: the scan reads
    ``_deleted``: every row, the deleted positions of each file planned instead of its
    deletes (:func:`plan_tasks`)."""
    from icecrypt.spark._common import file_error

    if snapshot_id is None:
        return _empty(table)
    schema = table.schema_for(table.snapshot(snapshot_id))
    read_schema = next((s for s in table.model.schemas if s.schema_id == schema_id), schema)
    row_filter = to_filter(filters, schema, read_schema=read_schema)
    try:
        tasks = table.scan(snapshot_id=snapshot_id, row_filter=row_filter).plan_files()
    except Exception as exc:
        raise file_error(exc, f"{what}: planning the scan") from exc
    return plan_tasks(table, tasks, schema, snapshot_id, what, push_keys, partition=partition,
                      mark_deleted=mark_deleted)


def plan_tasks(table: Any, tasks: list[Any], schema: Any, snapshot_id: int | None, what: str,
               push_keys: Any, *, partition: bool = False, mark_deleted: bool = False) -> dict[str, Any]:
    """The plan of planned file scan tasks (their files, deletes and keys), as
    :func:`plan_files` answers; also the streaming read's micro-batches.  Equality deletes
    are applied as of ``snapshot_id`` (None: refused).  Each file: [Spark path, size,
    rows, has deletes, first row id, data sequence number, spec id] and, with
    ``partition``, its ``_partition`` value (:func:`_partition_encoder`); in a table with
    a name mapping [8] its constants (:class:`_ByName`); with ``mark_deleted`` [9] its
    deleted positions (big-endian int64s, base64; null for none), and no file "has
    deletes": every row is read, ``_deleted`` marks the deleted ones (``Lineage``)."""
    from icecrypt.spark._common import file_error
    from icecrypt.spark._native import (
        _MAX_FILTERED_POSITION,
        ROW_INDEX_COLUMN,
        _deleted_positions,
        _deletes_option,
        _file_keys,
        _spark_path,
    )
    from icecrypt.table.files.manifest import EQUALITY_DELETES

    by_file: dict[str, list[Any]] = {}
    for task in tasks:
        by_file.setdefault(task.file.path, []).append(task)
    equality = {path for path, group in by_file.items() if any(d.content == EQUALITY_DELETES for d in group[0].deletes)}
    if equality and snapshot_id is None:
        raise NotImplementedError(f"{what}: data file {sorted(equality)[0]} has equality deletes, which a streaming "
                                  "read of the SQL catalog does not apply (stream it with icecrypt.iceberg)")
    replaced = _live_positions(table, snapshot_id, equality, what) if equality else {}
    partition_of = _partition_encoder(table, schema, what) if partition else None
    by_name = _by_name(table, schema, what)
    files: dict[str, Any] = {}
    entries = []
    deleted_by_path: dict[str, tuple[int, Any]] = {}
    cache: dict = {}
    for path, group in by_file.items():
        file = group[0].file
        if file.file_format != "PARQUET":
            raise NotImplementedError(f"{what}: data file {path} is {file.file_format.lower()}: the SQL catalog reads "
                                      "Parquet data files only (read this table with icecrypt.iceberg, or rewrite "
                                      "its data files)")
        if table.encrypted and file.key_metadata is None:
            raise ValueError(f"{what}: data file {path} of an encrypted table has no key metadata (refused)")
        spark_path = _spark_path(file.fs_path, table.filesystem)
        if spark_path is None:
            raise NotImplementedError(f"{what}: the table is not on the local file system: the SQL catalog reads "
                                      "local tables only")
        if path in replaced:
            deleted = replaced[path]
        else:
            try:
                deleted = _deleted_positions(group, table.filesystem, cache)
            except Exception as exc:
                raise file_error(exc, f"{what}: reading the deletes of {path}") from exc
        marked = None
        if deleted is not None and mark_deleted:
            import base64

            import numpy as np

            unique = np.unique(np.asarray(deleted, dtype=np.int64))
            marked = base64.b64encode(unique.astype(">i8").tobytes()).decode("ascii")
            deleted = None
        if deleted is not None:
            if not 0 <= int(deleted[0]) <= int(deleted[-1]) <= _MAX_FILTERED_POSITION:
                raise ValueError(f"{what}: data file {path} has deleted row positions beyond 2^31 (not supported)")
            if any(f.name.lower() == ROW_INDEX_COLUMN for f in schema.fields):
                raise NotImplementedError(f"{what}: a column named {ROW_INDEX_COLUMN} hides the row positions "
                                          "Spark's Parquet reader gives (files with deletes cannot be read)")
            deleted_by_path[spark_path] = (file.record_count, deleted)
        files[spark_path] = file
        entry = [spark_path, file.file_size_in_bytes, file.record_count, deleted is not None,
                 group[0].first_row_id, file.sequence_number, group[0].spec_id]
        if partition_of is not None:
            entry.append(partition_of(group[0]))
        if by_name is not None or mark_deleted:
            entry += [None] * (8 - len(entry))
            entry.append(by_name.constants(group[0]) if by_name is not None else None)
        if mark_deleted:
            entry.append(marked)
        entries.append(entry)
    read_id = uuid.uuid4().hex
    if table.encrypted and files:
        push_keys(read_id, _file_keys(files))
    return {
        "read_id": read_id,
        "encrypted": table.encrypted,
        "files": entries,
        "deletes": _deletes_option(deleted_by_path) if deleted_by_path else "",
        "snapshot_id": snapshot_id,
        "pushable": [c for c in pushable_columns(table) if by_name is None or c not in by_name.columns],
        "data_files": list(by_file),
        "by_name": by_name.columns if by_name is not None else None,
    }


class _ByName:
    """How the scan of a table with a name mapping reads its files: by column name, and
    each top-level column an identity partition field takes its values from (``columns``)
    as a per-file constant (``constants``: [whether the file's spec partitions by it, its
    value], the value encoded as ``_partition`` values are)."""

    def __init__(self, table: Any, schema: Any, what: str) -> None:
        from pyiceberg.transforms import IdentityTransform

        sources: dict[int, Any] = {}
        for spec in table.specs.values():
            for field in spec.fields:
                if isinstance(field.transform, IdentityTransform):
                    sources.setdefault(field.source_id, field)
        top = [f for f in schema.fields if f.field_id in sources and partition_encodable(f.field_type)]
        self.columns = [f.name for f in top]
        self._ids = [f.field_id for f in top]
        self._encoders = [_encoder(f.field_type, f"{what}: column {f.name}") for f in top]
        self._identity = {spec_id: [isinstance(f.transform, IdentityTransform) for f in spec.fields]
                          for spec_id, spec in table.specs.items()}
        self._specs = table.specs

    def constants(self, task: Any) -> list[list[Any]]:
        values = {f.source_id: v for f, v, identity in
                  zip(self._specs[task.spec_id].fields, task.partition, self._identity[task.spec_id]) if identity}
        return [[source_id in values, None if values.get(source_id) is None else encode(values[source_id])]
                for source_id, encode in zip(self._ids, self._encoders)]


def _by_name(table: Any, schema: Any, what: str) -> _ByName | None:
    """None for a table without a name mapping (files read by field id).  With one, the
    files (added as they were, without field ids) are read by column name, which is only
    right if a name means one field in every file: refused for an encrypted table, and
    when a column was ever renamed (a file may hold it under its old name) or the mapping
    gives a field more names than its own."""
    from pyiceberg.table.name_mapping import parse_mapping_from_json

    raw = table.properties.get("schema.name-mapping.default")
    if not raw:
        return None
    refused = f"{what}: the table has a name mapping (data files without field ids)"
    if table.encrypted:
        raise NotImplementedError(f"{refused} and is encrypted: the SQL catalog reads such a table's files by field "
                                  "id only (read it with icecrypt.iceberg)")
    names: dict[int, str] = {}

    def walk(node: Any) -> None:
        if not isinstance(node, dict):
            return
        for field in node.get("fields") or ():
            if names.setdefault(field["id"], field["name"]) != field["name"]:
                raise NotImplementedError(
                    f"{refused}, and column {names[field['id']]!r} (field id {field['id']}) was renamed to "
                    f"{field['name']!r}: a file may hold it under either name, and the SQL catalog reads such a "
                    "table's files by name (read it with icecrypt.iceberg)"
                )  # fmt: skip
            walk(field["type"])
        for key in ("element", "key", "value"):
            walk(node.get(key))

    for version in table.metadata.get("schemas") or ():
        walk(version)
    try:
        mapping = parse_mapping_from_json(raw)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{what}: schema.name-mapping.default is not a name mapping ({exc})") from None
    stack = list(mapping)
    while stack:
        mapped = stack.pop()
        stack.extend(mapped.fields or ())
        if mapped.field_id in names and list(mapped.names) != [names[mapped.field_id]]:
            raise NotImplementedError(f"{refused}, which names field id {mapped.field_id} {list(mapped.names)}: the "
                                      "SQL catalog reads such a table's files by the field's one name (read it with "
                                      "icecrypt.iceberg)")
    return _ByName(table, schema, what)


def plan_changelog(table: Any, options: dict[str, str], filters: list[dict[str, Any]], what: str,
                   push_keys: Any, end: int | None = None) -> dict[str, Any]:
    """The plan of ``db.t.changes`` (Iceberg's changelog table): the files the range's
    snapshots added (``INSERT``) and removed (``DELETE``), each with its change as
    ``changes[i]`` = [change type, change ordinal, commit snapshot id], which the scan gives
    as constant columns of the file's rows.  The range: ``start-snapshot-id`` (exclusive)
    or ``start-timestamp``, ``end-snapshot-id`` or ``end-timestamp`` (inclusive; default
    ``end``, the snapshot the statement loaded), as Iceberg's Spark reads them; snapshots
    with row-level deletes are refused, as Iceberg's changelog scan refuses them."""
    from icecrypt.spark._common import file_error
    from icecrypt.spark._sql.changelog import check_range

    if table.current_snapshot_id is None and not options:
        return {**_empty(table), "changes": [], "data_files": []}
    try:
        incremental = check_range(table, options)
    except (ValueError, LookupError) as exc:
        raise type(exc)(f"{what}.changes: {exc}") from None
    if incremental["to_snapshot_id"] is None:
        incremental["to_snapshot_id"] = end if end is not None else table.current_snapshot_id
    schema = table.schema
    row_filter = to_filter(filters, schema)
    try:
        changes = table.changelog_scan(row_filter=row_filter, **incremental).plan_changes()
    except KeyError as exc:
        raise LookupError(f"{what}.changes: {exc.args[0] if exc.args else exc}") from None
    except NotImplementedError as exc:
        raise NotImplementedError(f"{what}.changes: {exc}") from None
    except Exception as exc:
        raise file_error(exc, f"{what}.changes: planning the changelog") from exc
    unique: dict[tuple[str, str, int], Any] = {}
    for change in changes:  # a split file is one entry: Spark splits it again
        unique.setdefault((change.task.file.path, change.change_type, change.change_ordinal), change)
    plan = plan_tasks(table, [c.task for c in unique.values()], schema, None, what, push_keys)
    at = {path: i for i, path in enumerate(plan["data_files"])}
    files, locations, values = [], [], []
    for (path, kind, ordinal), change in unique.items():
        files.append(plan["files"][at[path]])
        locations.append(path)
        values.append([kind, ordinal, change.commit_snapshot_id])
    plan.update(files=files, data_files=locations, changes=values, snapshot_id=incremental["to_snapshot_id"])
    return plan


def _partition_encoder(table: Any, schema: Any, what: str) -> Any:
    """A function of a task: its file's ``_partition`` value, the table's partition type
    (every spec's fields: :func:`~icecrypt.table.model.metadata_columns.partition_type`)
    as a JSON list the JVM turns into Spark's values (``Lineage``): numbers, dates as
    days, times and timestamps as microseconds, decimals as their unscaled digits,
    binary as base64, a non-finite float by name, null where the file's spec lacks the
    field."""
    from icecrypt.table.model.metadata_columns import partition_type

    fields = partition_type(table.specs, schema).fields
    encoders = [_encoder(f.field_type, f"{what}: _partition.{f.name}") for f in fields]
    position = {f.field_id: i for i, f in enumerate(fields)}

    def encode(task: Any) -> list[Any]:
        out: list[Any] = [None] * len(fields)
        for field, value in zip(table.specs[task.spec_id].fields, task.partition):
            i = position.get(field.field_id)
            if i is not None and value is not None:
                out[i] = encoders[i](value)
        return out

    return encode


def partition_encodable(t: Any) -> bool:
    """Whether a ``_partition`` field of type ``t`` can be planned (:func:`_encoder`)."""
    try:
        _encoder(t, "")
    except NotImplementedError:
        return False
    return True


def _encoder(t: Any, what: str) -> Any:
    import base64
    import datetime
    import decimal
    import math

    from pyiceberg.types import (
        BinaryType,
        BooleanType,
        DateType,
        DecimalType,
        DoubleType,
        FixedType,
        FloatType,
        IntegerType,
        LongType,
        StringType,
        TimestampType,
        TimestamptzType,
        TimeType,
        UUIDType,
    )

    epoch = datetime.datetime(1970, 1, 1)

    def micros(v: Any) -> int:
        if isinstance(v, datetime.datetime):
            base = epoch if v.tzinfo is None else epoch.replace(tzinfo=datetime.timezone.utc)
            return (v - base) // datetime.timedelta(microseconds=1)
        if isinstance(v, datetime.time):
            return ((v.hour * 60 + v.minute) * 60 + v.second) * 1_000_000 + v.microsecond
        return int(v)

    def floating(v: Any) -> Any:
        v = float(v)
        return v if math.isfinite(v) else ("NaN" if math.isnan(v) else "Infinity" if v > 0 else "-Infinity")

    if isinstance(t, BooleanType):
        return bool
    if isinstance(t, (IntegerType, LongType)):
        return int
    if isinstance(t, DateType):
        return lambda v: (v - datetime.date(1970, 1, 1)).days if isinstance(v, datetime.date) else int(v)
    if isinstance(t, (TimestampType, TimestamptzType, TimeType)):
        return micros
    if isinstance(t, (FloatType, DoubleType)):
        return floating
    if isinstance(t, DecimalType):
        exact = decimal.Context(prec=80)  # a decimal(38, s) has more digits than the default context keeps
        return lambda v: str(int(decimal.Decimal(v).scaleb(t.scale, context=exact).to_integral_value(context=exact)))
    if isinstance(t, StringType):
        return str
    if isinstance(t, UUIDType):
        import uuid as _uuid

        return lambda v: str(v if isinstance(v, _uuid.UUID) else _uuid.UUID(bytes=bytes(v)))
    if isinstance(t, (BinaryType, FixedType)):
        return lambda v: base64.b64encode(bytes(v)).decode("ascii")
    raise NotImplementedError(f"{what}: a partition field of type {t}, which Spark cannot show")


def push_keys(bridge: Any) -> Any:
    """A function leaving a value with the JVM's ``Keys`` (py4j's logging of the command
    suppressed)."""
    from icecrypt.spark._native import _keys_in_flight, jvm_class

    keys = jvm_class(bridge.spark, "org.icecrypt.spark.catalog.Keys")

    def put(read_id: str, value: str) -> None:
        with _keys_in_flight():
            keys.put(read_id, value)

    return put


@method("plan_scan")
def _plan_scan(bridge: Any, request: dict[str, Any]) -> Any:
    _, catalog = catalog_of(request)
    ref = request["ref"]
    ident = identifier(ref["identifier"])
    table = catalog.load_table(ident)
    what = _catalogs.describe_identifier(catalog, ident)
    if ref.get("changelog"):
        return plan_changelog(table, dict(request.get("options") or {}), request.get("filters") or [], what,
                              push_keys(bridge), ref.get("snapshot_id"))
    return plan_files(table, ref.get("snapshot_id"), request.get("filters") or [], what, push_keys(bridge),
                      ref.get("schema_id"), partition=request.get("partition") is True,
                      mark_deleted=request.get("mark_deleted") is True)

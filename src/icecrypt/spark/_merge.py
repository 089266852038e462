"""A distributed MERGE or UPDATE of an encrypted Iceberg table (:func:`icecrypt.spark.merge`,
:func:`icecrypt.spark.upsert`, :func:`icecrypt.spark.update`): the heavy work in
executors, the commit on the driver.

The driver notes the head ``S`` of the branch, and Spark reads the target rows at ``S``
with ``icecrypt.iceberg`` (with the metadata columns ``_file`` and ``_pos``) and joins
them with the source on the join columns.  A target row matched by two or more source
rows is an error before anything is written.  Then, by the table's ``write.merge.mode``:

- merge-on-read: the ``(_file, _pos)`` of the matched rows (positions only) are collected
  to the driver, which adds them to the files' deletion vectors; executors write the
  updated and inserted rows;
- copy-on-write: executors rewrite every data file holding a matched row (its other
  rows, with the updated and inserted rows), and the driver removes those files.

Executors write with the task writer of ``icecrypt.iceberg``'s batch writes (a fresh
DEK per file, the same key handling) and return the files' manifest records; the
driver commits once through :func:`icecrypt.table.ops.rowlevel.merge_files`, which
validates the commits since ``S`` as Iceberg Java validates a concurrent commit, and
deletes the written files if anything fails.
"""

from __future__ import annotations

import contextlib
import functools
import pickle
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pyarrow as pa
from pyiceberg.expressions import AlwaysTrue, And, BooleanExpression, GreaterThanOrEqual, LessThanOrEqual
from pyiceberg.expressions.visitors import bind

from icecrypt.spark._common import OPT_PATH
from icecrypt.spark._iceberg import NAME, OPT_BRANCH, OPT_ISOLATION_LEVEL, IcebergWriter, TaskDataFiles, _open_table
from icecrypt.table.model.changes import MAIN_BRANCH
from icecrypt.table.ops.rowlevel import MergeResult, UpsertResult, check_merge_actions, merge_files, write_mode
from icecrypt.table.ops.write import _head_id
from icecrypt.table.read.scan import parse_row_filter

__all__ = ["merge", "update", "upsert"]

_RECORDS = "records"
_LINEAGE = ("_row_id", "_last_updated_sequence_number")


def merge(
    spark: Any, location: str, source: Any, on: list[str], *, when_matched_update: Any = None,
    when_matched_delete: bool = False, when_not_matched_insert: str | None = None, **options: Any,
) -> MergeResult:
    """Merge the DataFrame ``source`` into the table at ``location`` on the join columns
    ``on``, as :meth:`EncryptedTable.merge <icecrypt.table.EncryptedTable.merge>` does.

    ``when_matched_update``: None, ``"all"`` (a matched row takes the source row's
    values) or a mapping of column name to a Spark Column or a constant; the Column is
    evaluated over the joined row, whose columns are ``target.<name>`` and
    ``source.<name>``.  ``when_matched_delete``: matched rows are deleted.
    ``when_not_matched_insert``: None or ``"all"`` (source rows without a match are
    inserted).  ``options``: the ``icecrypt.iceberg`` options (KMS, catalog, storage),
    plus ``branch`` and ``isolation-level`` (default the table's
    ``write.merge.isolation-level``, else serializable).  Returns the counts and the
    snapshot id (None when nothing changed)."""
    return _merge(spark, location, source, on, when_matched_update, when_matched_delete, when_not_matched_insert,
                  options, only_changed=False, what="merge")  # fmt: skip


def upsert(spark: Any, location: str, source: Any, join_cols: list[str] | None = None, **options: Any) -> UpsertResult:
    """PyIceberg's upsert with Spark: source rows whose key matches a table row replace
    it when their values differ; the others are inserted.  The source must not repeat a
    key.  ``join_cols`` default: the table schema's identifier fields."""
    if join_cols is None:
        table = _open_table(_string_options(options), location)
        join_cols = [table.schema.find_column_name(i) for i in table.schema.identifier_field_ids]
        if not join_cols:
            raise ValueError("upsert: no join_cols given and the table schema has no identifier fields")
    join_cols = list(join_cols)
    _check_keys(source, join_cols, "upsert")
    duplicate = source.groupBy(*join_cols).count().where("count > 1").limit(1).collect()
    if duplicate:
        row = duplicate[0].asDict()
        raise ValueError(f"upsert: duplicate rows in the source for the join columns {join_cols} "
                         f"(e.g. {({k: row[k] for k in join_cols})}, {row['count']} rows); nothing was committed")
    result = _merge(spark, location, source, join_cols, "all", False, "all", options, only_changed=True, what="upsert")
    return UpsertResult(result.rows_updated, result.rows_inserted, result.snapshot_id)


def _string_options(options: Mapping[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in options.items() if v is not None}


def _check_keys(source: Any, on: Any, what: str) -> None:
    if not on or isinstance(on, str) or not all(isinstance(k, str) for k in on):
        raise ValueError(f"{what}: the join columns must be a non-empty list of column names, not {on!r}")
    if len(set(on)) != len(on):
        raise ValueError(f"{what}: join columns repeat: {on}")
    for key in on:
        if key not in source.columns:
            raise ValueError(f"{what}: join column {key!r} is not a column of the source")


def _merge(
    spark: Any, location: str, source: Any, on: list[str], when_matched_update: Any, when_matched_delete: bool,
    when_not_matched_insert: str | None, options: Mapping[str, Any], *, only_changed: bool, what: str,
) -> MergeResult:
    from pyspark.sql import functions as F

    check_merge_actions(when_matched_update, when_matched_delete, when_not_matched_insert, what)
    # row lineage of the rows written: moved rows keep theirs, new values get the commit's
    no_row_id = F.lit(None).cast("long").alias("_row_id")
    no_sequence = F.lit(None).cast("long").alias("_last_updated_sequence_number")
    on = list(on) if isinstance(on, (list, tuple)) else on
    _check_keys(source, on, what)
    options = _string_options(options)
    branch = (options.get(OPT_BRANCH) or "").strip() or None
    isolation = (options.pop(OPT_ISOLATION_LEVEL, None) or "").strip().lower() or None
    table = _open_table(options, location)
    names = _columns(table, location, what)
    for key in on:
        if key not in names:
            raise ValueError(f"{what}: join column {key!r} is not a column of the table {location} "
                             f"(columns: {', '.join(names)})")
    extra = [n for n in source.columns if n not in names]
    if extra:
        raise ValueError(f"{what}: source column {extra[0]!r} is not a column of the table {location}")
    if isinstance(when_matched_update, Mapping):
        unknown = [n for n in when_matched_update if n not in names]
        if unknown:
            raise ValueError(f"{what}: no column {unknown[0]!r} in the table {location} to update")
    mode = write_mode(table.properties, "merge")
    start = _head_id(table.metadata, branch or MAIN_BRANCH)

    # the target's rows at the start snapshot, with their places
    target_rows = _target_rows(spark, location, options, names, start)
    types = {f.name: f.dataType for f in target_rows.schema.fields}
    source = source.select(*[(F.col(f"`{n}`") if n in source.columns else F.lit(None)).cast(types[n]).alias(n)
                             for n in names])  # fmt: skip
    null_keys = source.where(functools.reduce(lambda a, b: a | b, [F.col(k).isNull() for k in on])).limit(1).count()
    if null_keys:
        raise ValueError(f"{what}: a join column holds a null in the source; a null key matches nothing")
    target, src = target_rows.alias("target"), source.alias("source")
    condition = functools.reduce(lambda a, b: a & b, [F.col(f"target.`{k}`") == F.col(f"source.`{k}`") for k in on])
    matched = target.join(src, condition, "inner")
    matched_action = when_matched_update is not None or when_matched_delete
    if matched_action:
        twice = matched.groupBy("target._file", "target._pos").count().where("count > 1").limit(1).collect()
        if twice:
            row = twice[0]
            raise ValueError(f"{what}: {row['count']} source rows match the same target row (row {row['_pos']} of "
                             f"{row['_file']}); the merge is ambiguous and nothing was committed")
    if only_changed:
        differs = [~F.col(f"target.`{n}`").eqNullSafe(F.col(f"source.`{n}`")) for n in names if n not in on]
        matched = matched.where(functools.reduce(lambda a, b: a | b, differs)) if differs else matched.limit(0)
    goes = matched.select(F.col("target._file").alias("_file"), F.col("target._pos").alias("_pos")) \
        if matched_action else None
    pieces = []
    updated = deleted = inserted = 0
    if when_matched_update is not None:
        if when_matched_update == "all":
            columns = [F.col(f"source.`{n}`") for n in names]
        else:
            columns = [_column(when_matched_update[n]) if n in when_matched_update else F.col(f"target.`{n}`")
                       for n in names]  # fmt: skip
        # an updated row keeps its row id; its sequence number is the commit's (null: inherited)
        pieces.append(matched.select(*[c.cast(types[n]).alias(n) for c, n in zip(columns, names)],
                                     F.col("target._row_id").alias("_row_id"), no_sequence))  # fmt: skip
    inserts = None
    if when_not_matched_insert == "all":
        inserts = src.join(target, condition, "left_anti").select(*[F.col(f"source.`{n}`").alias(n) for n in names],
                                                                  no_row_id, no_sequence)  # fmt: skip
        pieces.append(inserts)
    count, snapshot_id = _rewrite(spark, table, location, options, names, target_rows, goes, pieces, mode,
                                  lambda: _conflict_filter(table, source, on), isolation, branch, start, "merge")
    if when_matched_update is not None:
        updated = count
    else:
        deleted = count
    inserted = 0 if inserts is None or snapshot_id is None else inserts.count()
    return MergeResult(updated, deleted, inserted, snapshot_id)


def _rewrite(
    spark: Any, table: Any, location: str, options: dict[str, str], names: list[str], target_rows: Any, goes: Any,
    pieces: list[Any], mode: str, conflict_filter: Callable[[], Any], isolation: str | None, branch: str | None,
    start: int | None, kind: str,
) -> tuple[int, int | None]:
    """Write and commit a row-level change: ``goes`` (the ``_file``, ``_pos`` of the
    target rows that go, or None) and ``pieces`` (DataFrames of rows to write, with the
    table's columns and row lineage).  Copy-on-write rewrites the files rows go from
    (their other rows join ``pieces``); merge-on-read collects the positions (only) for
    the driver's deletion vectors.  Returns (rows that went, snapshot id or None)."""
    from pyspark.sql import functions as F

    removed: list[str] = []
    positions: dict[str, list[int]] = {}
    count = 0
    if goes is not None:
        places = goes.collect()  # positions only
        count = len(places)
        if mode == "copy-on-write":
            removed = sorted({r["_file"] for r in places})
            if removed:
                files = spark.createDataFrame([(p,) for p in removed], "_file string")
                pieces = [*pieces, target_rows.join(F.broadcast(files), "_file", "left_semi")
                          .join(goes, ["_file", "_pos"], "left_anti").select(*names, *_LINEAGE)]  # fmt: skip
        else:
            for r in places:
                positions.setdefault(r["_file"], []).append(r["_pos"])
    written = None
    for piece in pieces:
        written = piece if written is None else written.unionByName(piece)
    data_files: list[dict[str, Any]] = []
    writer = None
    if written is not None:
        writer = IcebergWriter({**options, OPT_PATH: location}, written.select(*names).schema, False)
        try:
            data_files = _write(writer, written)
        except BaseException:
            writer.abort([])  # removes what the job's tasks wrote (found by the job's id)
            raise
    if not data_files and not removed and not positions:
        return count, None
    target_table = table
    if writer is not None:
        try:
            target_table = writer._table(commit=True)
        except BaseException:
            writer.abort([TaskDataFiles(data_files)])  # not committed: the job's files go
            raise
    snapshot_id = merge_files(
        target_table, data_files, removed=removed, deleted_positions=positions, conflict_filter=conflict_filter(),
        isolation_level=isolation, branch=branch, start_snapshot_id=start, kind=kind,
    )  # fmt: skip
    if writer is not None:
        writer._remove_leftovers(table, [f["file_path"] for f in data_files])
    return count, snapshot_id


def update(spark: Any, location: str, assignments: Mapping[str, Any], where: str | None = None,
           **options: Any) -> int | None:
    """``UPDATE ... SET ... WHERE`` in Spark: the rows of the table at ``location``
    matching the Iceberg row filter ``where`` (every row when None) take the values of
    ``assignments`` (column -> Spark Column over the row's columns, or a constant), as
    :meth:`EncryptedTable.update <icecrypt.table.EncryptedTable.update>` does; the rows
    are read, changed and written in executors, and committed once on the driver by the
    table's ``write.update.mode``.  ``options``: the ``icecrypt.iceberg`` options plus
    ``branch`` and ``isolation-level``.  Returns the new snapshot id (None when no row
    matched)."""
    from pyspark.sql import functions as F

    if not isinstance(assignments, Mapping) or not assignments:
        raise ValueError("update: set must be a non-empty mapping of column name to a value or a Spark Column")
    if where is not None and (not isinstance(where, str) or not where.strip()):
        raise ValueError(f"update: where must be a row filter string (or None for every row), not {where!r}")
    options = _string_options(options)
    branch = (options.get(OPT_BRANCH) or "").strip() or None
    isolation = (options.pop(OPT_ISOLATION_LEVEL, None) or "").strip().lower() or None
    table = _open_table(options, location)
    names = _columns(table, location, "update")
    unknown = [n for n in assignments if n not in names]
    if unknown:
        raise ValueError(f"update: no column {unknown[0]!r} in the table {location} to set")
    if where is not None:
        try:  # a filter that does not parse or names no column: refused before any job runs
            bind(table.schema, parse_row_filter(where), case_sensitive=True)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"update: where={where!r} on the table {location}: {exc}") from None
    mode = write_mode(table.properties, "update")
    start = _head_id(table.metadata, branch or MAIN_BRANCH)
    if start is None:
        return None
    target_rows = _target_rows(spark, location, options, names, start)
    matched = target_rows if where is None else _target_rows(spark, location, options, names, start, where)
    types = {f.name: f.dataType for f in target_rows.schema.fields}
    columns = [_column(assignments[n]) if n in assignments else F.col(f"`{n}`") for n in names]
    # an updated row keeps its row id; its sequence number is the commit's (null: inherited)
    changed = matched.select(*[c.cast(types[n]).alias(n) for c, n in zip(columns, names)], F.col("_row_id"),
                             F.lit(None).cast("long").alias("_last_updated_sequence_number"))  # fmt: skip
    goes = matched.select("_file", "_pos")
    _, snapshot_id = _rewrite(spark, table, location, options, names, target_rows, goes, [changed], mode,
                              lambda: where or AlwaysTrue(), isolation, branch, start, "update")
    return snapshot_id


def _columns(table: Any, location: str, what: str) -> list[str]:
    """The table's column names; refused when one hides a metadata column a change reads."""
    names = [f.name for f in table.schema.fields]
    hidden = [n for n in names if n.lower() in ("_file", "_pos", *_LINEAGE)]
    if hidden:  # it would hide the metadata column the change reads (row places, lineage)
        raise ValueError(f"{what}: the table {location} has a column named {hidden[0]!r}, which hides Iceberg's "
                         "metadata column of that name; a row-level change needs it (rename the column)")
    return names


def _target_rows(spark: Any, location: str, options: Mapping[str, str], names: list[str], snapshot_id: int | None,
                 where: str | None = None) -> Any:
    """The table's rows at ``snapshot_id`` (none: a table without a snapshot; those
    matching ``where``), with their places (``_file``, ``_pos``) and row lineage."""
    read_options = {k: v for k, v in options.items() if k != OPT_BRANCH}
    reader = spark.read.format(NAME).options(**read_options).option("columns",
                                                                     ",".join([*names, "_file", "_pos", *_LINEAGE]))
    if snapshot_id is not None:
        reader = reader.option("snapshot-id", str(snapshot_id))
    if where is not None:
        reader = reader.option("filter", where)
    return reader.load(location)


def _column(value: Any) -> Any:
    from pyspark.sql import Column
    from pyspark.sql import functions as F

    return value if isinstance(value, Column) else F.lit(value)


def _write(writer: IcebergWriter, rows: Any) -> list[dict[str, Any]]:
    """Write ``rows`` in the executors with ``writer``'s task writer; the files' records."""
    schema = pa.schema([pa.field(_RECORDS, pa.binary())])

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        message = writer.write(batches, lineage=True)
        yield pa.RecordBatch.from_pylist([{_RECORDS: pickle.dumps(list(message.data_files))}], schema=schema)

    return [record for row in rows.mapInArrow(task, f"{_RECORDS} binary").collect()
            for record in pickle.loads(row[_RECORDS])]  # fmt: skip


def _conflict_filter(table: Any, source: Any, on: list[str]) -> BooleanExpression:
    """The range of the source's keys, per join column (what a concurrent data file must
    not match under serializable isolation)."""
    from pyspark.sql import functions as F

    bounds = source.agg(*[f(F.col(f"`{k}`")).alias(f"{f.__name__}_{n}") for n, k in enumerate(on)
                          for f in (F.min, F.max)]).collect()[0]  # fmt: skip
    expression: BooleanExpression = AlwaysTrue()
    for n, key in enumerate(on):
        low, high = bounds[f"min_{n}"], bounds[f"max_{n}"]
        if low is None:
            continue
        part = And(GreaterThanOrEqual(key, low), LessThanOrEqual(key, high))
        with contextlib.suppress(Exception):  # a type PyIceberg literals do not take: not narrowed by it
            bind(table.schema, part, case_sensitive=True)
            expression = part if expression == AlwaysTrue() else And(expression, part)
    return expression

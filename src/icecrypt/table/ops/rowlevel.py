"""Row-level changes of encrypted Iceberg tables: ``update``, ``upsert``, ``merge``, a
copy-on-write ``delete``, ``overwrite(overwrite_filter=)`` and
``dynamic_partition_overwrite``, each one snapshot through the one committer.

Planning reads the live rows of the files a change may touch (the table's scan: deletion
vectors, position and equality deletes applied, with ``_pos``, the row lineage columns
and the file each row is in) and decides which rows go and which new rows come.  How
the rows that go are removed is the table's choice, as in Iceberg Java (``write.delete.mode``,
``write.update.mode``, ``write.merge.mode``; default ``copy-on-write``):

* copy-on-write: every data file with a row that goes is removed (with its deletion
  vector) and its remaining rows are written again with the new rows (operation
  ``overwrite``, or ``delete`` when nothing is added);
* merge-on-read: each such file gets a new deletion vector (its old one's positions and
  the new ones, in a Puffin file, AGS1 in an encrypted table) that replaces the old one;
  a file none of whose rows remain is removed instead.

Rows keep their lineage (``_row_id``) when rewritten or updated; the new files store it.

Concurrency is Java's: the change remembers the snapshot it was planned on
(``validateFromSnapshot``).  When another writer committed first the change is re-applied
to the newer version only after checking the snapshots committed since: a data file it
removes or deletes from must not have been removed, nor have got a new delete file
(both isolation levels); under ``serializable`` isolation (the default;
``write.<op>.isolation-level``) no ``append`` or ``overwrite`` may have added a data file
that matches the change's conflict filter (its row filter, the join keys of the source
of a merge, the partitions a dynamic overwrite replaces).  A conflict raises
:class:`~icecrypt.CommitConflictError` naming it; nothing is committed and the files the
change wrote are deleted.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import AlwaysTrue, And, BooleanExpression, GreaterThanOrEqual, In, LessThanOrEqual

from icecrypt.errors import CommitConflictError, FormatError
from icecrypt.table.commit.target import _Target
from icecrypt.table.files.manifest_write import (
    ADDED, DATA, DELETED, EXISTING, POSITION_DELETES, to_internal, write_manifest,
)
from icecrypt.table.files.write_data import DataWriteOptions, table_sort_order, write_data_files
from icecrypt.table.files.write_dv import DeletionVector, puffin_file
from icecrypt.table.model import changes as _model
from icecrypt.table.ops import write as _write

__all__ = [
    "COPY_ON_WRITE",
    "MERGE_ON_READ",
    "MergeResult",
    "SERIALIZABLE",
    "SNAPSHOT",
    "UpsertResult",
    "delete_rows",
    "dynamic_partition_overwrite",
    "dynamic_partition_overwrite_files",
    "merge",
    "merge_files",
    "overwrite_by_filter",
    "overwrite_files_by_filter",
    "update",
    "upsert",
    "write_mode",
]

COPY_ON_WRITE = "copy-on-write"
MERGE_ON_READ = "merge-on-read"
SERIALIZABLE = "serializable"
SNAPSHOT = "snapshot"
_MODES = (COPY_ON_WRITE, MERGE_ON_READ)
_LEVELS = (SERIALIZABLE, SNAPSHOT)
_META = ("_pos", "_row_id", "_last_updated_sequence_number")
_LINEAGE = ("_row_id", "_last_updated_sequence_number")
#: the planned rows' own column: the index of each row's data file (see ``_read_rows``)
_FILE_INDEX = "__icecrypt_file_index"
#: operations whose added data files can conflict, and those that can remove files or add
#: deletes (Java's MergingSnapshotProducer sets): a compaction ("replace") adds no new rows
_ADDS_DATA = ("append", "overwrite")
_REMOVES = ("overwrite", "replace", "delete")
_ADDS_DELETES = ("overwrite", "delete")
#: beyond this many key values a merge's conflict filter is a range per join column
_IN_LIMIT = 200
#: ``start_snapshot_id`` not given: the change is validated from the head it is planned on
_NOW: Any = object()


def write_mode(properties: Mapping[str, str] | None, operation: str, *, default: str = COPY_ON_WRITE) -> str:
    """The table's ``write.<operation>.mode`` (``copy-on-write`` unless set, as in Java);
    ValueError naming the property for any other value."""
    name = f"write.{operation}.mode"
    value = (properties or {}).get(name, default)
    if value not in _MODES:
        raise ValueError(f"table property {name} = {value!r}: expected one of {', '.join(_MODES)}")
    return value


def isolation_level(properties: Mapping[str, str] | None, operation: str, given: str | None = None) -> str:
    """``given``, else the table's ``write.<operation>.isolation-level`` (``serializable``
    unless set, as in Java)."""
    name = f"write.{operation}.isolation-level"
    value = given if given is not None else (properties or {}).get(name, SERIALIZABLE)
    if value not in _LEVELS:
        raise ValueError(f"isolation level {value!r} ({name}): expected one of {', '.join(_LEVELS)}")
    return value


@dataclass(frozen=True)
class UpsertResult:
    """What an upsert changed (PyIceberg's ``UpsertResult``), and its snapshot id (None
    when nothing changed and nothing was committed)."""

    rows_updated: int
    rows_inserted: int
    snapshot_id: int | None = None


@dataclass(frozen=True)
class MergeResult:
    """What a merge changed, and its snapshot id (None when nothing was committed)."""

    rows_updated: int
    rows_deleted: int
    rows_inserted: int
    snapshot_id: int | None = None


# --- planning: the live rows a change may touch ------------------------------------------------


@dataclass
class _Base:
    """The version a change is planned on, and the live files of main's head there."""

    target: _Target
    table: Any
    location: str
    metadata: dict[str, Any]
    head_id: int | None
    files: dict[str, tuple[dict[str, Any], int]]  # data file path -> (record, spec id)
    branch: str = _model.MAIN_BRANCH

    def scan(self, **options: Any) -> Any:
        """A scan of the branch's head (main's current snapshot for a new branch)."""
        if self.branch != _model.MAIN_BRANCH and self.branch in (self.metadata.get("refs") or {}):
            options["branch"] = self.branch
        return self.table.scan(**options)


def _plan_base(table: Any, branch: str | None = None) -> _Base:
    """The newest version (the table object refreshed to it), and the live data files of
    the head of ``branch`` (default main; a branch that does not exist yet starts from
    main's head and is created by the commit)."""
    table.refresh()
    hidden = [f.name for f in table.schema.fields if f.name.lower() in _META]
    if hidden:  # it would hide the metadata column the change needs (row positions, lineage)
        raise ValueError(f"{table.metadata_location}: the table has a column named {hidden[0]!r}, which hides Iceberg's "
                         "metadata column of that name; row-level changes need it (rename the column)")
    target = _Target.of(table)
    location, metadata = target.latest()
    if location != table.metadata_location:  # a commit landed between the two reads
        table.refresh()
        location, metadata = target.latest()
    name, _, _ = _write._write_ref(metadata, branch, None)  # a tag is refused here
    head = _write._head(metadata, name)
    files: dict[str, tuple[dict[str, Any], int]] = {}
    if head is not None:
        manager = target.manager(metadata)
        io = target.io(manager)
        for manifest in _write._read_manifest_list(io, manager, head):
            if manifest["content"] != DATA or not _write._has_live_files(manifest):
                continue
            for entry in _write._read_entries(io, manifest):
                if entry["status"] != DELETED:
                    files[entry["data_file"]["file_path"]] = (entry["data_file"], manifest["partition_spec_id"])
    return _Base(target, table, location, metadata, None if head is None else head["snapshot-id"], files, name)


def _column_names(table: Any) -> list[str]:
    return [f.name for f in table.schema.fields]


def _read_rows(base: _Base, prune: BooleanExpression | None, skip: set[str] = frozenset()) -> pa.Table:
    """Every live row (all columns, with ``_pos`` and row lineage, and ``_FILE_INDEX``: the
    index of its data file in the table's ``paths`` metadata) of the data files
    ``prune`` may match by partition values and column statistics, but those in
    ``skip``."""
    table = base.table
    everything = base.scan(columns=_column_names(table) + list(_META))
    tasks = everything.plan_files()
    if prune is not None and prune != AlwaysTrue():
        candidates = {t.file.path for t in base.scan(columns=[], row_filter=prune).plan_files()}
        tasks = [t for t in tasks if t.file.path in candidates]
    tasks = [t for t in tasks if t.file.path not in skip]
    from icecrypt.table.files.read import read_task

    paths = sorted({t.file.path for t in tasks})
    index = {path: n for n, path in enumerate(paths)}
    filesystem = table.locations.filesystem
    cache: dict = {}
    schema = everything.arrow_schema.append(pa.field(_FILE_INDEX, pa.int32(), nullable=False))

    def read(task: Any) -> list[pa.RecordBatch]:
        code = index[task.file.path]
        return [pa.RecordBatch.from_arrays([*b.columns, pa.array(np.full(b.num_rows, code, dtype=np.int32))],
                                           schema=schema) for b in read_task(task, filesystem, cache=cache)]  # fmt: skip

    if len(tasks) <= 1:
        parts = [read(t) for t in tasks]
    else:
        with ThreadPoolExecutor(min(4, len(tasks))) as pool:
            parts = list(pool.map(read, tasks))
    rows = pa.Table.from_batches([b for part in parts for b in part], schema=schema)
    # one chunk: the takes and filters that follow are much faster on it
    return rows.combine_chunks().replace_schema_metadata({"paths": json.dumps(paths)})


def _paths(rows: pa.Table) -> list[str]:
    return json.loads((rows.schema.metadata or {}).get(b"paths") or b"[]")


@dataclass
class _Outcome:
    """What a planned change does: rows that go (a boolean mask over the planned rows)
    and rows that come (table columns plus lineage), with data files removed whole
    without reading them."""

    rows: pa.Table
    goes: np.ndarray
    comes: pa.Table | None
    whole: set[str] = field(default_factory=set)


def _lineage_of(rows: pa.Table, *, keep_sequence: bool) -> list[pa.Array]:
    """The lineage columns moved rows carry: their row ids, and their last-updated
    sequence numbers when unchanged (else null: the new file's is inherited)."""
    row_id = pa.nulls(rows.num_rows, pa.int64())
    if "_row_id" in rows.column_names:
        row_id = rows.column("_row_id").combine_chunks()
    if keep_sequence and "_last_updated_sequence_number" in rows.column_names:
        seq = rows.column("_last_updated_sequence_number").combine_chunks()
    else:
        seq = pa.nulls(rows.num_rows, pa.int64())
    return [row_id.cast(pa.int64()), seq.cast(pa.int64())]


def _with_lineage(data: pa.Table) -> pa.Table:
    """New rows: lineage columns of nulls (ids and sequence numbers are assigned)."""
    nulls = pa.nulls(data.num_rows, pa.int64())
    return data.append_column("_row_id", nulls).append_column("_last_updated_sequence_number", nulls)


def _concat(table: Any, pieces: list[pa.Table]) -> pa.Table | None:
    """Row pieces (table columns and lineage) as one table of the table's types."""
    pieces = [p for p in pieces if p is not None and p.num_rows]
    if not pieces:
        return None
    arrow_schema = table.scan(columns=_column_names(table)).arrow_schema
    schema = pa.schema([*arrow_schema, *(pa.field(name, pa.int64()) for name in _LINEAGE)])
    return pa.concat_tables([p.cast(schema) for p in pieces])


# --- from an outcome to a commit --------------------------------------------------------------


@dataclass
class _Plan:
    """A change ready to commit on the version it was planned on."""

    operation: str  # "delete" / "update" / "merge" (properties, messages)
    isolation: str
    removed: dict[str, dict[str, Any]]  # data file path -> record, removed whole
    vectors: list[_write._Vector]
    new_rows: pa.Table | None
    conflicts: Callable[[dict[str, Any], int], bool] | None  # a new data file conflicts (serializable)
    conflict_what: str
    #: data files written already (``write_files`` on Spark executors), added with new_rows'
    files: list[dict[str, Any]] = field(default_factory=list)


def _resolve(base: _Base, outcome: _Outcome, mode: str) -> tuple[dict, list, pa.Table | None]:
    """(files removed whole, deletion vectors, rows to write) of ``outcome`` in ``mode``."""
    removed = {path: base.files[path][0] for path in outcome.whole}
    vectors: list[_write._Vector] = []
    rows, goes = outcome.rows, outcome.goes
    pieces = [outcome.comes] if outcome.comes is not None and outcome.comes.num_rows else []
    if rows.num_rows and goes.any():
        paths = _paths(rows)
        codes = rows.column(_FILE_INDEX).to_numpy().astype(np.int64)
        touched = np.zeros(len(paths), dtype=bool)
        touched[np.unique(codes[goes])] = True
        in_touched = touched[codes]
        if mode == COPY_ON_WRITE:  # every touched file goes; its other rows are written again
            removed.update({paths[c]: base.files[paths[c]][0] for c in np.flatnonzero(touched)})
            stay = in_touched & ~goes
            if stay.any():
                kept = rows.filter(pa.array(stay))
                pieces.append(pa.Table.from_arrays(
                    [*kept.select(_column_names(base.table)).columns, *_lineage_of(kept, keep_sequence=True)],
                    names=[*_column_names(base.table), *_LINEAGE],
                ))  # fmt: skip
        else:  # merge-on-read: a DV of every position not live now and of those that go
            positions = rows.column("_pos").to_numpy()
            live = in_touched & ~goes
            order = np.argsort(codes[live], kind="stable")
            live_codes, live_positions = codes[live][order], positions[live][order]
            for code in np.flatnonzero(touched):
                record, spec_id = base.files[paths[code]]
                lo, hi = np.searchsorted(live_codes, [code, code + 1])
                if lo == hi:
                    removed[paths[code]] = record
                    continue
                mask = np.ones(record["record_count"], dtype=bool)
                mask[live_positions[lo:hi]] = False
                vectors.append(_write._Vector(record, spec_id, np.flatnonzero(mask).astype(np.int64)))
    return removed, vectors, _concat(base.table, pieces)


def _commit(base: _Base, plan: _Plan) -> int | None:
    """Write the new rows, deletion vectors and manifests once; commit them as one
    snapshot of the branch, re-applied (after validation) on a newer version when needed.
    Returns the snapshot id (None when the change changes nothing)."""
    if (not plan.removed and not plan.vectors and not plan.files
            and (plan.new_rows is None or plan.new_rows.num_rows == 0)):  # fmt: skip
        return None
    target, metadata = base.target, base.metadata
    snapshot_id = _write._new_snapshot_id(metadata)
    schema = _write._schema(metadata)
    specs = _write._specs(metadata)
    layout = _write.write_layout(target, metadata)
    commit_id = str(uuid.uuid4())
    manager = target.manager(metadata)
    io = target.io(manager)
    written: list[str] = [f["file_path"] for f in plan.files]  # deleted if this raises
    once: list[Any] = []  # manifests written once, in every attempt's snapshot
    added: list[dict[str, Any]] = []
    try:
        _write._check_data_files(io, plan.files)
        data_files = list(plan.files)
        spec = specs[metadata.get("default-spec-id", 0)]
        if plan.new_rows is not None and plan.new_rows.num_rows:
            properties = metadata.get("properties") or {}
            rewritten, started = write_data_files(
                io, plan.new_rows, schema=schema, spec=spec, layout=layout, properties=properties,
                options=DataWriteOptions.from_properties(properties), lineage=True,
                sort_order_id=metadata.get("default-sort-order-id", 0), sort_order=table_sort_order(metadata),
            )  # fmt: skip
            written += started
            data_files += rewritten
        if data_files:
            written.append(manifest_location := layout.metadata_file(f"{commit_id}-m0.avro"))
            once.append(write_manifest(
                io, manifest_location, _write._added_entries(data_files, snapshot_id), spec=spec, schema=schema,
                content=DATA,
            ))  # fmt: skip
            added += data_files
        if plan.vectors:
            written.append(puffin_location := layout.data_file(f"00000-0-{commit_id}-00001.puffin"))
            content, placements = puffin_file(
                [DeletionVector(v.data_file["file_path"], v.positions) for v in plan.vectors]
            )
            length, key = io.write_bytes(puffin_location, content)
            by_spec: dict[int, list[dict[str, Any]]] = {}
            for vector, placement in zip(plan.vectors, placements):
                record = _write._dv_record(puffin_location, length, key, vector, placement)
                added.append(record)
                by_spec.setdefault(vector.spec_id, []).append(_write._added_entries([record], snapshot_id)[0])
            for n, (spec_id, entries) in enumerate(sorted(by_spec.items()), 1):
                written.append(manifest_location := layout.metadata_file(f"{commit_id}-d{n}.avro"))
                once.append(write_manifest(
                    io, manifest_location, entries, spec=specs[spec_id], schema=schema, content=POSITION_DELETES,
                    schemas=_write._schemas(metadata),
                ))  # fmt: skip
        attempts = iter(range(1 << 30))

        def build(version: dict[str, Any], version_manager: Any) -> _write._Change:
            version_io = target.io(version_manager)
            if _write._head_id(version, base.branch) != base.head_id:
                _validate(version_io, version_manager, version, base.head_id, plan, target.metadata_location,
                          base.branch)  # fmt: skip
            return _change_on(version_io, version_manager, version, plan, once, added, snapshot_id,
                              layout.metadata_file(f"{commit_id}-r{next(attempts)}"), base.branch)  # fmt: skip

        _write._commit_change(
            target, base.location, base.metadata, build, snapshot_id=snapshot_id, retry=True,
            branch=base.branch,
        )  # fmt: skip
    except BaseException as exc:
        _write._discard(io, written, exc)
        raise
    return snapshot_id


def _operation(plan: _Plan, adds_data: bool) -> str:
    """Java's snapshot operation: rows only added is an append, only removed a delete,
    both an overwrite."""
    removes = bool(plan.removed or plan.vectors)
    if removes and adds_data:
        return "overwrite"
    return "delete" if removes else "append"


def _change_on(
    io: Any, manager: Any, version: dict[str, Any], plan: _Plan, once: list[Any], added: list[dict[str, Any]],
    snapshot_id: int, prefix: str, branch: str,
) -> _write._Change:
    """The change on ``version``: its head's manifests with the removed files (and the
    deletion vectors of every file removed or given a new one) marked DELETED."""
    parent = _write._head(version, branch)
    manifests = [] if parent is None else [
        m for m in _write._read_manifest_list(io, manager, parent) if _write._has_live_files(m)
    ]  # fmt: skip
    with_vector = {v.data_file["file_path"] for v in plan.vectors}
    replaced_dv = set(plan.removed) | with_vector
    found: set[str] = set()
    kept: list[dict[str, Any]] = []
    rewritten: list[Any] = []
    removed_files: list[dict[str, Any]] = []
    attempt_written: list[str] = []
    specs = _write._specs(version)
    schema = _write._schema(version)
    for manifest in manifests:
        entries = [e for e in _write._read_entries(io, manifest) if e["status"] != DELETED]
        drop = []
        for entry in entries:
            df = entry["data_file"]
            if df["content"] == DATA:
                if df["file_path"] in plan.removed or df["file_path"] in with_vector:
                    found.add(df["file_path"])
                drop.append(df["file_path"] in plan.removed)
            else:
                drop.append(_write._is_dv(df) and df.get("referenced_data_file") in replaced_dv)
        if not any(drop):
            kept.append(manifest)
            continue
        out = []
        for entry, gone in zip(entries, drop):
            entry = dict(entry)
            if gone:
                entry["status"], entry["snapshot_id"] = DELETED, snapshot_id
                removed_files.append(entry["data_file"])
            else:
                entry["status"] = EXISTING
            out.append(entry)
        attempt_written.append(manifest_location := f"{prefix}-m{len(attempt_written)}.avro")
        content = DATA if manifest["content"] == DATA else POSITION_DELETES
        rewritten.append(write_manifest(
            io, manifest_location, out, spec=specs[manifest["partition_spec_id"]], schema=schema, content=content,
            schemas=_write._schemas(version),
        ))  # fmt: skip
    missing = (set(plan.removed) | with_vector) - found
    if missing:  # (validated above when the branch moved; here for any other cause)
        _write._cleanup(io, attempt_written)
        raise CommitConflictError(
            f"{sorted(missing)[0]}: the data file this {plan.operation} changes is no longer in the table "
            "(removed by a concurrent commit); nothing was committed"
        )
    adds_data = any(f["content"] == DATA for f in added)
    return _write._Change(_operation(plan, adds_data), [*once, *rewritten], kept, list(added), removed_files,
                          len(rewritten), attempt_written=attempt_written)  # fmt: skip


def _validate(
    io: Any, manager: Any, version: dict[str, Any], planned: int | None, plan: _Plan, where: str, branch: str
) -> None:
    """Java's validations of a row-level change re-applied on ``version``: nothing
    between the snapshot it was planned on and main's head there removed a file it
    touches or added a delete file for one; under serializable isolation no new data
    file matches its conflict filter.  CommitConflictError naming the conflict."""
    by_id = {s["snapshot-id"]: s for s in version.get("snapshots") or ()}
    chain = []
    current = _write._head(version, branch)
    while current is not None and current["snapshot-id"] != planned:
        chain.append(current)
        current = by_id.get(current.get("parent-snapshot-id"))
    if planned is not None and current is None:
        raise CommitConflictError(
            f"{where}: the {plan.operation} was planned on snapshot {planned}, which is no longer an ancestor of "
            f"the head of {branch!r} (rolled back or expired): cannot validate what changed since; nothing was committed"
        )
    touched = set(plan.removed) | {v.data_file["file_path"] for v in plan.vectors}
    for snapshot in reversed(chain):
        snapshot_id = snapshot["snapshot-id"]
        operation = (snapshot.get("summary") or {}).get("operation", "overwrite")
        for manifest in _write._read_manifest_list(io, manager, snapshot):
            if manifest.get("added_snapshot_id") != snapshot_id:
                continue
            for entry in _write._read_entries(io, manifest):
                if entry["snapshot_id"] != snapshot_id:
                    continue
                df = entry["data_file"]
                prefix = (f"{where}: {plan.operation} conflicts with snapshot {snapshot_id} ({operation}) committed "
                          f"since snapshot {planned}")  # fmt: skip
                if entry["status"] == DELETED:
                    if df["content"] == DATA and operation in _REMOVES and df["file_path"] in touched:
                        raise CommitConflictError(
                            f"{prefix}: it removed data file {df['file_path']}; nothing was committed"
                        )
                    continue
                if entry["status"] != ADDED:
                    continue
                if df["content"] == DATA:
                    if (plan.isolation == SERIALIZABLE and operation in _ADDS_DATA and plan.conflicts is not None
                            and plan.conflicts(df, manifest["partition_spec_id"])):  # fmt: skip
                        raise CommitConflictError(
                            f"{prefix}: it added data file {df['file_path']}, which may hold rows matching "
                            f"{plan.conflict_what} (serializable isolation); nothing was committed"
                        )
                    continue
                if operation not in _ADDS_DELETES or not touched:
                    continue
                referenced = df.get("referenced_data_file")
                if referenced is None or referenced in touched:
                    raise CommitConflictError(
                        f"{prefix}: it added delete file {df['file_path']} for "
                        f"{referenced or 'data files'} this {plan.operation} rewrites or deletes from; "
                        "nothing was committed"
                    )


def _expression_conflicts(schema: Any, expression: BooleanExpression) -> Callable[[dict[str, Any], int], bool]:
    from pyiceberg.expressions.visitors import _InclusiveMetricsEvaluator

    if expression == AlwaysTrue():
        return lambda _f, _s: True
    evaluator = _InclusiveMetricsEvaluator(schema, expression)
    return lambda data_file, _spec_id: evaluator.eval(_write._metrics_view(data_file))


# --- the operations ----------------------------------------------------------------------------


def _mask_of(rows: pa.Table, arrow_filter: Any) -> np.ndarray:
    if rows.num_rows == 0:
        return np.zeros(0, dtype=bool)
    import pyarrow.dataset as ds

    mask = ds.dataset(rows.drop_columns([_FILE_INDEX]) if _FILE_INDEX in rows.column_names else rows).to_table(
        columns={"m": arrow_filter}
    ).column("m")
    return pc.fill_null(mask, False).to_numpy(zero_copy_only=False).astype(bool)


def _whole_files(base: _Base, expression: BooleanExpression) -> set[str]:
    """Data files whose every row matches ``expression`` by their statistics (removed
    without reading them; Java's strict metrics evaluation)."""
    from pyiceberg.expressions.visitors import _StrictMetricsEvaluator

    strict = _StrictMetricsEvaluator(base.table.schema, expression)
    return {path for path, (record, _) in base.files.items() if strict.eval(_write._metrics_view(record))}


def delete_rows(
    table: Any, row_filter: Any, *, mode: str | None = None, isolation_level: str | None = None,
    branch: str | None = None,
) -> int | None:
    """Delete the rows matching ``row_filter`` from ``branch`` (default main) in ``mode``
    (default the table's ``write.delete.mode``); returns the snapshot id (None: nothing
    matched)."""
    base = _plan_base(table, branch)
    mode = mode or write_mode(base.metadata.get("properties"), "delete")
    isolation = _isolation_for(base, "delete", isolation_level)
    outcome, expression = _deleted(base, row_filter)
    removed, vectors, new_rows = _resolve(base, outcome, mode)
    plan = _Plan("delete", isolation, removed, vectors, new_rows, _expression_conflicts(table.schema, expression),
                 f"the filter {expression}")  # fmt: skip
    return _commit(base, plan)


def _isolation_for(base: _Base, operation: str, given: str | None) -> str:
    return isolation_level(base.metadata.get("properties"), operation, given)


def _deleted(base: _Base, row_filter: Any) -> tuple[_Outcome, BooleanExpression]:
    """The rows ``row_filter`` matches (files it matches whole are not read)."""
    expression, arrow_filter = _write._bind_filter(row_filter, base.table.schema)
    whole = _whole_files(base, expression) if base.head_id is not None else set()
    rows = _read_rows(base, expression, whole) if base.head_id is not None else _empty_rows(base)
    return _Outcome(rows, _mask_of(rows, arrow_filter), None, whole), expression


def _empty_rows(base: _Base) -> pa.Table:
    schema = base.scan(columns=_column_names(base.table) + list(_META)).arrow_schema
    return schema.append(pa.field(_FILE_INDEX, pa.int32(), nullable=False)).empty_table()


def update(
    table: Any, set_values: Mapping[str, Any], where: Any = None, *, isolation_level: str | None = None,
    branch: str | None = None,
) -> int | None:
    """Set columns of the rows matching ``where`` (all rows when None): each value of
    ``set_values`` is a constant, a ``pyarrow.compute`` expression over the row's
    columns, or a function of the matching rows (a pyarrow Table) returning an array.
    ``write.update.mode`` decides copy-on-write or merge-on-read.  Returns the snapshot
    id (None when no row matched)."""
    if not isinstance(set_values, Mapping) or not set_values:
        raise ValueError("update needs a non-empty mapping of column name to new value")
    base = _plan_base(table, branch)
    names = _column_names(table)
    unknown = [name for name in set_values if name not in names]
    if unknown:
        raise ValueError(f"update: no column {unknown[0]!r} in the table (columns: {', '.join(names)})")
    mode = write_mode(base.metadata.get("properties"), "update")
    isolation = _isolation_for(base, "update", isolation_level)
    expression, arrow_filter = _write._bind_filter(where if where is not None else AlwaysTrue(), table.schema)
    rows = _read_rows(base, expression) if base.head_id is not None else _empty_rows(base)
    goes = _mask_of(rows, arrow_filter)
    matched = rows.filter(pa.array(goes))
    arrow_schema = table.scan(columns=names).arrow_schema
    columns = []
    for name in names:
        column = matched.column(name)
        if name in set_values:
            column = _evaluate(set_values[name], matched, arrow_schema.field(name), f"update of column {name!r}")
        columns.append(column)
    comes = pa.Table.from_arrays([*columns, *_lineage_of(matched, keep_sequence=False)], names=[*names, *_LINEAGE])
    removed, vectors, new_rows = _resolve(base, _Outcome(rows, goes, comes), mode)
    plan = _Plan("update", isolation, removed, vectors, new_rows, _expression_conflicts(table.schema, expression),
                 f"the filter {expression}")  # fmt: skip
    return _commit(base, plan)


def _evaluate(value: Any, rows: pa.Table, target: pa.Field, what: str) -> pa.ChunkedArray:
    """A new column's values for ``rows``: a constant, a compute expression or a function."""
    try:
        if isinstance(value, pc.Expression):
            import pyarrow.dataset as ds

            if rows.num_rows:
                result = ds.dataset(rows).to_table(columns={"v": value}).column("v")
            else:
                result = pa.chunked_array([], target.type)
        elif callable(value):
            result = value(rows)
            if isinstance(result, pa.Scalar) or not isinstance(result, (pa.Array, pa.ChunkedArray)):
                scalar = result.as_py() if isinstance(result, pa.Scalar) else result
                result = pa.repeat(pa.scalar(scalar), rows.num_rows)
        else:
            if value is None:
                result = pa.nulls(rows.num_rows, target.type)
            else:
                result = pa.repeat(pa.scalar(value), rows.num_rows)
        if len(result) != rows.num_rows:
            raise ValueError(f"{len(result)} values for {rows.num_rows} rows")
        result = result.cast(target.type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, TypeError, ValueError) as exc:
        raise ValueError(f"{what}: cannot make {target.type} values of {value!r} ({exc})") from None
    if not target.nullable and result.null_count:
        raise ValueError(f"{what}: the column is required and the new value is null for {result.null_count} row(s)")
    return pa.chunked_array([result]) if isinstance(result, pa.Array) else result


def _conform_source(table: Any, source: Any, keys: list[str], what: str) -> pa.Table:
    """``source`` as a table of the table's columns and types (ValueError naming the
    column when one is unknown, missing or of a type that cannot be cast safely), with
    no null in a join column."""
    if isinstance(source, pa.RecordBatch):
        source = pa.Table.from_batches([source])
    if not isinstance(source, pa.Table):
        raise TypeError(f"{what}: the source must be a pyarrow Table, not {type(source).__name__}")
    names = _column_names(table)
    if not keys or isinstance(keys, str) or not all(isinstance(k, str) for k in keys):
        raise ValueError(f"{what}: the join columns must be a non-empty list of column names, not {keys!r}")
    for key in keys:
        if key not in names:
            raise ValueError(f"{what}: join column {key!r} is not a column of the table (columns: {', '.join(names)})")
        if key not in source.column_names:
            raise ValueError(f"{what}: join column {key!r} is not a column of the source")
    if len(set(keys)) != len(keys):
        raise ValueError(f"{what}: join columns repeat: {keys}")
    extra = [n for n in source.column_names if n not in names]
    if extra:
        raise ValueError(f"{what}: source column {extra[0]!r} is not a column of the table")
    arrow_schema = table.scan(columns=names).arrow_schema
    columns = []
    for target in arrow_schema:
        if target.name not in source.column_names:
            if not target.nullable:
                raise ValueError(f"{what}: the source lacks the required column {target.name!r}")
            columns.append(pa.nulls(source.num_rows, target.type))
            continue
        column = source.column(target.name)
        if column.type != target.type:
            try:
                column = column.cast(target.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                raise ValueError(f"{what}: source column {target.name!r} is {source.schema.field(target.name).type}, "
                                 f"the table's is {target.type}, and the values do not convert ({exc})") from None
        if not target.nullable and column.null_count:
            raise ValueError(f"{what}: source column {target.name!r} has nulls, the table's column is required")
        columns.append(column)
    conformed = pa.Table.from_arrays(columns, schema=arrow_schema)
    for key in keys:
        if conformed.column(key).null_count:
            raise ValueError(f"{what}: join column {key!r} holds {conformed.column(key).null_count} null(s) in the "
                             "source; a null key matches nothing")
    return conformed


def _key_filter(table: Any, source: pa.Table, keys: list[str]) -> BooleanExpression:
    """The conflict (and pruning) filter of a merge: the source's key values per join
    column, as a set when few, else as their range."""
    expression: BooleanExpression = AlwaysTrue()
    for key in keys:
        values = pc.unique(source.column(key).combine_chunks())
        if len(values) == 0:
            continue
        try:
            if len(values) <= _IN_LIMIT:
                part = In(key, values.to_pylist())
            else:
                bounds = pc.min_max(values)
                part = And(GreaterThanOrEqual(key, bounds["min"].as_py()), LessThanOrEqual(key, bounds["max"].as_py()))
            from pyiceberg.expressions.visitors import bind

            bind(table.schema, part, case_sensitive=True)
        except Exception:  # a type PyIceberg literals do not take: no pruning by this column
            continue
        expression = part if expression == AlwaysTrue() else And(expression, part)
    return expression


def _join(rows: pa.Table, source: pa.Table, keys: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(target row index, source row index) of every matching pair."""
    if rows.num_rows == 0 or source.num_rows == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    left = rows.select(keys).append_column("__t", pa.array(np.arange(rows.num_rows, dtype=np.int64)))
    right = source.select(keys).append_column("__s", pa.array(np.arange(source.num_rows, dtype=np.int64)))
    try:
        joined = left.join(right, keys=keys, join_type="inner")
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise ValueError(f"cannot join on {keys}: {exc}") from None
    return joined.column("__t").to_numpy(), joined.column("__s").to_numpy()


def _changed(rows: pa.Table, t_idx: np.ndarray, source: pa.Table, s_idx: np.ndarray, names: list[str]) -> np.ndarray:
    """Per matched pair, whether the source row differs from the target row (nulls
    equal to nulls)."""
    if t_idx.size == 0:
        return np.zeros(0, dtype=bool)
    target = rows.take(pa.array(t_idx))
    theirs = source.take(pa.array(s_idx))
    differs = np.zeros(t_idx.size, dtype=bool)
    for name in names:
        a, b = target.column(name), theirs.column(name)
        try:
            equal = pc.equal(a, b)
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid):  # nested types: compare as Python values
            differs |= np.array([x != y for x, y in zip(a.to_pylist(), b.to_pylist())], dtype=bool)
            continue
        both_null = pc.and_(pc.is_null(a), pc.is_null(b))
        same = pc.or_(pc.fill_null(equal, False), both_null)
        differs |= ~same.to_numpy(zero_copy_only=False).astype(bool)
    return differs


def check_merge_actions(when_matched_update: Any, when_matched_delete: bool, when_not_matched_insert: Any,
                        what: str) -> None:
    """ValueError unless the merge actions are ones :func:`merge` takes."""
    if when_matched_update is not None and when_matched_update != "all" and not isinstance(when_matched_update, Mapping):
        raise ValueError(f"{what}: when_matched_update must be None, 'all' or a mapping of column to value")
    if when_not_matched_insert not in (None, "all"):
        raise ValueError(f"{what}: when_not_matched_insert must be None or 'all'")
    if when_matched_delete and when_matched_update is not None:
        raise ValueError(f"{what}: a matched row is either updated or deleted, not both")


def merge(
    table: Any,
    source: Any,
    on: list[str],
    *,
    when_matched_update: Any = None,
    when_matched_delete: bool = False,
    when_not_matched_insert: Any = None,
    only_changed: bool = False,
    isolation_level: str | None = None,
    operation: str = "merge",
    branch: str | None = None,
) -> MergeResult:
    """Merge ``source`` into the table on the join columns ``on`` (see
    :meth:`EncryptedTable.merge <icecrypt.table.EncryptedTable.merge>`)."""
    what = operation
    check_merge_actions(when_matched_update, when_matched_delete, when_not_matched_insert, what)
    on = list(on) if isinstance(on, (list, tuple)) else on
    source = _conform_source(table, source, on, what)
    base = _plan_base(table, branch)
    names = _column_names(table)
    if isinstance(when_matched_update, Mapping):
        unknown = [n for n in when_matched_update if n not in names]
        if unknown:
            raise ValueError(f"{what}: no column {unknown[0]!r} in the table to update")
    mode = write_mode(base.metadata.get("properties"), operation if operation in ("merge", "update") else "merge")
    isolation = _isolation_for(base, "merge", isolation_level)
    prune = _key_filter(table, source, on)
    matched_action = when_matched_update is not None or when_matched_delete
    rows = _read_rows(base, prune) if base.head_id is not None else _empty_rows(base)
    t_idx, s_idx = _join(rows, source, on)
    if matched_action and t_idx.size:
        counts = np.bincount(t_idx, minlength=rows.num_rows)
        if (counts > 1).any():
            row = int(np.argmax(counts > 1))
            key = {k: rows.column(k)[row].as_py() for k in on}
            raise ValueError(f"{what}: {int(counts[row])} source rows match the same target row (key {key}); "
                             "the merge is ambiguous and nothing was committed")
    if only_changed and t_idx.size:  # PyIceberg's upsert: rows whose values do not change stay
        differs = _changed(rows, t_idx, source, s_idx, [n for n in names if n not in on])
        changed_t, changed_s = t_idx[differs], s_idx[differs]
    else:
        changed_t, changed_s = t_idx, s_idx
    goes = np.zeros(rows.num_rows, dtype=bool)
    pieces = []
    updated = deleted = 0
    if when_matched_update is not None and changed_t.size:
        goes[changed_t] = True
        order = np.argsort(changed_t, kind="stable")
        changed_t, changed_s = changed_t[order], changed_s[order]
        target_rows = rows.take(pa.array(changed_t))
        source_rows = source.take(pa.array(changed_s))
        if when_matched_update == "all":
            columns = [source_rows.column(n) for n in names]
        else:
            context = target_rows.select(names)
            for n in names:
                context = context.append_column(f"source.{n}", source_rows.column(n))
            arrow_schema = source.schema
            columns = [
                _evaluate(when_matched_update[n], context, arrow_schema.field(n), f"{what}: update of column {n!r}")
                if n in when_matched_update else target_rows.column(n)
                for n in names
            ]  # fmt: skip
        pieces.append(pa.Table.from_arrays([*columns, *_lineage_of(target_rows, keep_sequence=False)],
                                           names=[*names, *_LINEAGE]))  # fmt: skip
        updated = int(changed_t.size)
    elif when_matched_delete and t_idx.size:
        goes[t_idx] = True
        deleted = int(t_idx.size)
    inserted = 0
    if when_not_matched_insert == "all":
        unmatched = np.ones(source.num_rows, dtype=bool)
        unmatched[s_idx] = False
        if unmatched.any():
            fresh = source.filter(pa.array(unmatched))
            pieces.append(_with_lineage(fresh))
            inserted = fresh.num_rows
    comes = _concat(table, pieces)
    removed, vectors, new_rows = _resolve(base, _Outcome(rows, goes, comes), mode)
    plan = _Plan(operation, isolation, removed, vectors, new_rows, _expression_conflicts(table.schema, prune),
                 f"the source's keys ({prune})")  # fmt: skip
    snapshot_id = _commit(base, plan)
    return MergeResult(updated, deleted, inserted, snapshot_id)


def upsert(
    table: Any, data: Any, join_cols: list[str] | None = None, *, when_matched_update_all: bool = True,
    when_not_matched_insert_all: bool = True, isolation_level: str | None = None, branch: str | None = None,
) -> UpsertResult:
    """PyIceberg's upsert: rows of ``data`` whose key matches a row of the table replace
    it when their values differ, the others are inserted; ``data`` must not repeat a
    key.  ``join_cols`` default: the table schema's identifier fields."""
    if join_cols is None:
        join_cols = [table.schema.find_column_name(i) for i in table.schema.identifier_field_ids]
        if not join_cols:
            raise ValueError("upsert: no join_cols given and the table schema has no identifier fields")
    source = _conform_source(table, data, list(join_cols), "upsert")
    if source.num_rows:
        groups = source.group_by(list(join_cols)).aggregate([([], "count_all")])
        duplicate = pc.greater(groups.column("count_all"), 1)
        if pc.any(duplicate).as_py():
            row = groups.filter(duplicate).slice(0, 1).to_pylist()[0]
            raise ValueError(f"upsert: duplicate rows in the source for the join columns {list(join_cols)} "
                             f"(e.g. {({k: row[k] for k in join_cols})}, {row['count_all']} rows); nothing was committed")
    result = merge(
        table, source, list(join_cols), when_matched_update="all" if when_matched_update_all else None,
        when_not_matched_insert="all" if when_not_matched_insert_all else None, only_changed=True,
        isolation_level=isolation_level, operation="merge", branch=branch,
    )  # fmt: skip
    return UpsertResult(result.rows_updated, result.rows_inserted, result.snapshot_id)


def merge_files(
    table: Any, data_files: list[dict[str, Any]], *, removed: list[str] | tuple[str, ...] = (),
    deleted_positions: Mapping[str, Any] | None = None, conflict_filter: Any = None,
    isolation_level: str | None = None, branch: str | None = None, start_snapshot_id: int | None | object = _NOW,
    kind: str = "merge",
) -> int | None:
    """A merge whose rows were joined and written elsewhere (Spark executors, with
    :func:`~icecrypt.table.ops.write.write_files`), committed as :func:`merge` commits:
    the data files ``removed`` (copy-on-write: the files the merge rewrote) are removed,
    the positions ``deleted_positions`` (data file path -> row positions; merge-on-read)
    are added to the files' deletion vectors, and ``data_files`` are added, in one
    snapshot.  ``conflict_filter`` (a row filter, default everything) is what a
    concurrent data file must not match under serializable isolation (the source's
    keys).  ``start_snapshot_id``: the snapshot the merge read the target rows at; the
    commits since are validated as a concurrent commit is.  ``kind``: ``merge``,
    ``update`` or ``delete`` (rows changed or deleted elsewhere, e.g. by Spark SQL's
    copy-on-write rewrite: the table's ``write.<kind>.isolation-level``).  If this raises,
    the data files are deleted (unless a catalog could not tell whether the commit
    landed)."""
    if kind not in ("merge", "update", "delete"):
        raise ValueError(f"kind must be merge, update or delete, not {kind!r}")
    deleted_positions = dict(deleted_positions or {})
    with _discarded_on_error(table, data_files):
        base = _plan_base(table, branch)
        isolation = _isolation_for(base, kind, isolation_level)
        expression, _ = _write._bind_filter(AlwaysTrue() if conflict_filter is None else conflict_filter, table.schema)
        touched = list(dict.fromkeys([*removed, *deleted_positions]))
        plan = _Plan(kind, isolation, {p: base.files[p][0] for p in removed if p in base.files}, [], None,
                     _expression_conflicts(table.schema, expression),
                     f"the source's keys ({expression})" if kind == "merge" else f"its condition ({expression})",
                     files=list(data_files))  # fmt: skip
        plan.vectors = [_write._Vector(base.files[p][0], base.files[p][1], np.zeros(0, np.int64))
                        for p in deleted_positions if p in base.files and p not in plan.removed]  # fmt: skip
        _validate_since(base, plan, start_snapshot_id)  # a file removed since the start is a conflict here
        missing = [p for p in touched if p not in base.files]
        if missing:
            raise CommitConflictError(f"{missing[0]}: the data file this merge changes is not a live data file of "
                                      f"the head of {base.branch!r}; nothing was committed")
        plan.vectors = _merged_vectors(base, {p: v for p, v in deleted_positions.items() if p not in plan.removed},
                                       plan.removed)  # fmt: skip
    return _commit(base, plan)


def _merged_vectors(base: _Base, deleted: Mapping[str, Any], removed: dict[str, dict[str, Any]]) -> list[_write._Vector]:
    """The deletion vectors of ``deleted`` (path -> positions) joined with the rows the
    files have deleted already; a file all of whose rows are then deleted goes to
    ``removed`` instead."""
    if not deleted:
        return []
    from icecrypt.table.files.read import _positions

    filesystem = base.table.locations.filesystem
    cache: dict = {}
    existing: dict[str, list[np.ndarray]] = {}
    for task in base.scan(columns=[]).plan_files():
        if task.file.path in deleted:
            now = _positions(task, filesystem, cache)
            if now is not None:
                existing.setdefault(task.file.path, []).append(now)
    vectors = []
    for path, given in deleted.items():
        record, spec_id = base.files[path]
        positions = np.asarray(given, dtype=np.int64)
        count = int(record["record_count"])
        if positions.size and (positions.min() < 0 or positions.max() >= count):
            raise ValueError(f"{path}: a deleted row position is outside the data file's {count} rows")
        positions = np.unique(np.concatenate([positions, *existing.get(path, [])]))
        if positions.size == count:
            removed[path] = record
        elif positions.size:
            vectors.append(_write._Vector(record, spec_id, positions))
    return vectors


def overwrite_by_filter(
    table: Any, data: Any, overwrite_filter: Any, *, isolation_level: str | None = None, branch: str | None = None
) -> int | None:
    """Delete the rows matching ``overwrite_filter`` (files it matches whole removed, the
    rest per ``write.delete.mode``) and append ``data``, in one snapshot."""
    base = _plan_base(table, branch)
    rows = _conform_data(table, data, "overwrite")
    return _commit(base, _overwrite_plan(base, overwrite_filter, isolation_level, rows, []))


def overwrite_files_by_filter(
    table: Any, data_files: list[dict[str, Any]], overwrite_filter: Any, *, isolation_level: str | None = None,
    branch: str | None = None, start_snapshot_id: int | None | object = _NOW,
) -> int | None:
    """:func:`overwrite_by_filter` with data files written by
    :func:`~icecrypt.table.ops.write.write_files` (on Spark executors) instead of rows:
    the rows matching ``overwrite_filter`` go and ``data_files`` are added, in one
    snapshot, validated as ``overwrite_by_filter`` is.

    ``start_snapshot_id``: the head of the branch when the data files' job started (None:
    the table was empty).  The commits since then are validated as a concurrent commit
    is (Java's ``validateFromSnapshot``): under serializable isolation one that added
    data matching the filter is a conflict.  If this raises, the data files are deleted
    (unless a catalog could not tell whether the commit landed)."""
    with _discarded_on_error(table, data_files):
        base = _plan_base(table, branch)
        plan = _overwrite_plan(base, overwrite_filter, isolation_level, None, data_files)
        _validate_since(base, plan, start_snapshot_id)
    return _commit(base, plan)


def _overwrite_plan(
    base: _Base, overwrite_filter: Any, isolation_level: str | None, rows: pa.Table | None,
    files: list[dict[str, Any]],
) -> _Plan:
    mode = write_mode(base.metadata.get("properties"), "delete")
    isolation = _isolation_for(base, "delete", isolation_level)
    outcome, expression = _deleted(base, overwrite_filter)
    if rows is not None:
        outcome.comes = _with_lineage(rows)
    removed, vectors, new_rows = _resolve(base, outcome, mode)
    return _Plan("overwrite", isolation, removed, vectors, new_rows,
                 _expression_conflicts(base.table.schema, expression), f"the overwrite filter {expression}",
                 files=list(files))  # fmt: skip


def _validate_since(base: _Base, plan: _Plan, start_snapshot_id: int | None | object) -> None:
    """Validate the commits between ``start_snapshot_id`` (where the job that wrote the
    change's data started) and the head the change was planned on, as a concurrent
    commit is validated (``_NOW``: nothing to validate)."""
    if start_snapshot_id is _NOW or start_snapshot_id == base.head_id:
        return
    manager = base.target.manager(base.metadata)
    _validate(base.target.io(manager), manager, base.metadata, start_snapshot_id, plan, base.target.metadata_location,
              base.branch)  # fmt: skip


@contextlib.contextmanager
def _discarded_on_error(table: Any, data_files: list[dict[str, Any]]) -> Iterator[None]:
    """Delete ``data_files`` (written for a change that is being planned) if planning fails."""
    try:
        yield
    except BaseException:
        _write._cleanup(_Target.of(table).io(None), [f["file_path"] for f in data_files])
        raise


def _conform_data(table: Any, data: Any, what: str) -> pa.Table:
    from icecrypt.table.files.write_data import conform, iter_batches

    arrow_schema = table.scan(columns=_column_names(table)).arrow_schema
    try:
        batches = [conform(b, arrow_schema) for b in iter_batches(data)]
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None
    return pa.Table.from_batches(batches, schema=arrow_schema)


def dynamic_partition_overwrite(
    table: Any, data: Any, *, isolation_level: str | None = None, branch: str | None = None
) -> int | None:
    """Java's ReplacePartitions: every partition (of the current spec) that ``data``
    has rows in loses all its rows, and ``data`` is appended, in one snapshot; an
    unpartitioned table is replaced whole.  Data files of other specs are kept."""
    from icecrypt.table.files.write_data import _PartitionPlan

    base = _plan_base(table, branch)
    rows = _conform_data(table, data, "dynamic_partition_overwrite")
    if rows.num_rows == 0:
        return None  # no partition to replace
    spec = _write._specs(base.metadata)[base.metadata.get("default-spec-id", 0)]
    plan_parts = _PartitionPlan.create(spec, _write._schema(base.metadata))
    replaced = {tuple(values) for batch in rows.to_batches() for values, _ in plan_parts.split(batch)}
    return _commit(base, _replace_partitions(base, replaced, isolation_level, _with_lineage(rows), []))


def dynamic_partition_overwrite_files(
    table: Any, data_files: list[dict[str, Any]], *, isolation_level: str | None = None, branch: str | None = None,
    start_snapshot_id: int | None | object = _NOW,
) -> int | None:
    """:func:`dynamic_partition_overwrite` with data files written by
    :func:`~icecrypt.table.ops.write.write_files` (on Spark executors): the partitions
    they are in are replaced by them, in one snapshot.  ``start_snapshot_id`` as for
    :func:`overwrite_files_by_filter` (a commit since then that added data to a replaced
    partition is a conflict under serializable isolation).  If this raises, the data files
    are deleted (unless a catalog could not tell whether the commit landed)."""
    if not data_files:
        return None  # no partition to replace
    with _discarded_on_error(table, data_files):
        base = _plan_base(table, branch)
        spec = _write._specs(base.metadata)[base.metadata.get("default-spec-id", 0)]
        names = [f.name for f in spec.fields]
        for record in data_files:
            if sorted(record.get("partition") or {}) != sorted(names):
                raise ValueError(
                    f"{record.get('file_path')}: written with partition fields {sorted(record.get('partition') or {})}"
                    f", but the table's partition spec {spec.spec_id} has {names} (it changed while the data was "
                    "written); nothing was committed"
                )
        types = _partition_types(base, spec)
        replaced = {_partition_key(record, names, types) for record in data_files}
        plan = _replace_partitions(base, replaced, isolation_level, None, data_files)
        _validate_since(base, plan, start_snapshot_id)
    return _commit(base, plan)


def _partition_types(base: _Base, spec: Any) -> list[Any]:
    return [f.field_type for f in spec.partition_type(_write._schema(base.metadata)).fields]


def _partition_key(record: dict[str, Any], names: list[str], types: list[Any]) -> tuple:
    """A data file's partition as the partition plan's split gives it, whether the record
    came from a manifest (a uuid's 16 bytes, a date) or from a writer."""
    partition = record.get("partition") or {}
    try:
        return tuple(to_internal(partition.get(n), t) for n, t in zip(names, types))
    except (TypeError, ValueError):
        raise FormatError(
            f"data file {record.get('file_path')}: its partition {sorted(partition)} does not hold values of "
            f"{[str(t) for t in types]}"
        ) from None


def _replace_partitions(
    base: _Base, replaced: set[tuple], isolation_level: str | None, rows: pa.Table | None,
    files: list[dict[str, Any]],
) -> _Plan:
    """The plan of a dynamic overwrite that replaces the partitions ``replaced`` (of the
    current spec) with ``rows`` and ``files``."""
    isolation = _isolation_for(base, "delete", isolation_level)
    spec_id = base.metadata.get("default-spec-id", 0)
    spec = _write._specs(base.metadata)[spec_id]
    names = [f.name for f in spec.fields]
    types = _partition_types(base, spec)

    def conflicts(record: dict[str, Any], record_spec: int) -> bool:
        return not spec.fields or (record_spec == spec_id and _partition_key(record, names, types) in replaced)

    removed = {path: record for path, (record, sid) in base.files.items() if conflicts(record, sid)}
    return _Plan("overwrite", isolation, removed, [], rows, conflicts, f"the partitions it replaces ({len(replaced)})",
                 files=list(files))  # fmt: skip

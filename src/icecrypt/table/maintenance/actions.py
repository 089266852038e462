"""Maintenance actions of encrypted Iceberg tables, as Iceberg Java's actions do them:
rewrite manifests, rewrite (bin-pack) data files, re-key after a compromise, and remove
orphan files.

Every action reuses the write path (``_write``): data files are written by
``write_data_files`` (a fresh DEK per file), manifests by ``write_manifest`` (a fresh
key per manifest), and each action ends in one atomic commit through
``_write._commit_change`` (a new ``replace`` snapshot whose manifest list is wrapped by
the current KEK).  A commit that loses to a concurrent append is rebuilt on the newer
version (the append survives); one that finds its input files gone, or new deletes on
them, is refused with :class:`~icecrypt.CommitConflictError`, as Java's validations do.
Whatever an action wrote before it failed is deleted; a process killed mid-way leaves
only orphans, which :func:`remove_orphan_files` finds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import posixpath
import re
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
from pyiceberg.table.sorting import SortOrder
from pyiceberg.transforms import IdentityTransform

from icecrypt._paths import normalize_path, under_root, walk_files_beneath
from icecrypt.errors import (
    CommitConflictError,
    EncryptionKeyNotFoundError,
    KmsKeyNotFoundError,
    PathOutsideTableError,
)
from icecrypt.table.commit import store as _commit
from icecrypt.table.model import changes as _model
from icecrypt.table.ops import write as w
from icecrypt.table.files.io import _SCHEME, Deletions, fingerprint
from icecrypt.table.files.manifest_write import (
    ADDED,
    DATA,
    DELETED,
    EQUALITY_DELETES,
    EXISTING,
    POSITION_DELETES,
    WrittenManifest,
    write_manifest,
)
from icecrypt.table.model.metadata_columns import lineage_columns
from icecrypt.table.commit.housekeeping import delete_logged_metadata_files
from icecrypt.table.commit.pin import check_unambiguous
from icecrypt.table.files.read import FileScanTask, _positions, read_task
from icecrypt.table.files.write_data import DEFAULT_TARGET_FILE_SIZE, DataWriteOptions, table_sort_order, write_data_files
from icecrypt.table.files.zorder import ZOrder, parse_zorder

__all__ = [
    "KeyUsage",
    "OrphanFilesResult",
    "RekeyResult",
    "RewriteDataFilesResult",
    "RewriteGroup",
    "RewritePositionDeletesResult",
    "RewritePlan",
    "commit_rewrite",
    "key_usage",
    "plan_rewrite",
    "rekey",
    "remove_orphan_files",
    "rewrite_data_files",
    "rewrite_group",
    "rewrite_manifests",
    "rewrite_position_delete_files",
]

MANIFEST_TARGET_SIZE = "commit.manifest.target-size-bytes"
DEFAULT_MANIFEST_TARGET_SIZE = 8 * 1024 * 1024  # Java's default
ORPHAN_SAFETY_MS = 3 * 24 * 3600 * 1000  # Java's deleteOrphanFiles default: older than 3 days

Progress = Callable[[str, dict[str, Any]], None] | None


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _emit(progress: Progress, event: str, **detail: Any) -> None:
    if progress is not None:
        progress(event, detail)


def _partition_key(data_file: dict[str, Any], spec_id: int) -> tuple[int, str]:
    return spec_id, repr(sorted((data_file.get("partition") or {}).items()))


def _fresh_base(table: Any) -> tuple[w._Target, str, dict[str, Any]]:
    """The table refreshed to its newest version, as the write path sees it."""
    table.refresh()
    target = w._Target.of(table)
    base_location, base = target.latest()
    if base_location != table.metadata_location:
        table.refresh()
    return target, base_location, base


@dataclasses.dataclass
class _Live:
    """The live manifests of a snapshot with their resolved, non-DELETED entries."""

    manifests: list[dict[str, Any]]
    entries: dict[str, list[dict[str, Any]]]

    def data(self) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        for m in self.manifests:
            if m["content"] == DATA:
                for e in self.entries[m["manifest_path"]]:
                    yield m, e

    def deletes(self) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        for m in self.manifests:
            if m["content"] != DATA:
                for e in self.entries[m["manifest_path"]]:
                    yield m, e


def _live(io: Any, manager: Any, snapshot: dict[str, Any] | None, cache: dict[str, list] | None = None) -> _Live:
    if snapshot is None:
        return _Live([], {})
    cache = {} if cache is None else cache
    manifests = [m for m in w._read_manifest_list(io, manager, snapshot) if w._has_live_files(m)]
    entries = {}
    for m in manifests:
        path = m["manifest_path"]
        if path not in cache:
            cache[path] = [e for e in w._read_entries(io, m) if e["status"] != DELETED]
        entries[path] = cache[path]
    return _Live(manifests, entries)


def _rewrite_manifest(
    io: Any, location: str, manifest: dict[str, Any], entries: list[dict[str, Any]], removed: set, snapshot_id: int,
    specs: dict, schema: Any, schemas: Any,
) -> tuple[WrittenManifest, list[dict[str, Any]]]:
    """``manifest`` rewritten with the entries whose key is in ``removed`` marked
    DELETED (by ``snapshot_id``) and the others EXISTING; returns it and the removed files."""
    out, gone = [], []
    for entry in entries:
        entry = dict(entry)
        if w._entry_key(entry["data_file"]) in removed:
            entry["status"] = DELETED
            entry["snapshot_id"] = snapshot_id
            gone.append(entry["data_file"])
        else:
            entry["status"] = EXISTING
        out.append(entry)
    content = DATA if manifest["content"] == DATA else POSITION_DELETES
    written = write_manifest(io, location, out, spec=specs[manifest["partition_spec_id"]], schema=schema,
                             content=content, schemas=schemas)
    return written, gone


# --- rewrite data files --------------------------------------------------------------------------


@dataclasses.dataclass
class RewriteGroup:
    """One bin of data files of one partition, rewritten together (picklable: what a
    Spark executor gets).  ``tasks`` read the files' live rows (their deletes applied)."""

    index: int
    partition: tuple[int, str]
    paths: list[str]
    tasks: list[FileScanTask]
    input_bytes: int
    input_records: int


@dataclasses.dataclass
class RewritePlan:
    """What :func:`rewrite_data_files` decided on the table version ``base_location``."""

    base_location: str
    base_snapshot_id: int | None
    starting_sequence_number: int
    target_file_size: int
    groups: list[RewriteGroup]
    base_delete_keys: set = dataclasses.field(default_factory=set)
    #: whether the groups' tasks read row lineage and the new files store it
    lineage: bool = True
    #: the order the rewritten rows are written in (None: the table's default order)
    sort_order: Any = None

    @property
    def paths(self) -> set[str]:
        return {p for g in self.groups for p in g.paths}

    @property
    def input_bytes(self) -> int:
        return sum(g.input_bytes for g in self.groups)


@dataclasses.dataclass
class RewriteDataFilesResult:
    """Outcome of a data-file rewrite (Java's ``RewriteDataFiles.Result``)."""

    snapshot_id: int | None
    rewritten_data_files: int = 0
    added_data_files: int = 0
    removed_delete_files: int = 0
    rewritten_bytes: int = 0
    added_bytes: int = 0
    groups: int = 0


def _option(options: dict[str, Any], name: str, default: Any, kind: Callable[[Any], Any]) -> Any:
    raw = options.get(name)
    return default if raw is None else kind(raw)


def _is_file_scoped(task_file: Any) -> bool:
    return task_file.content == POSITION_DELETES and (task_file.is_dv or task_file.referenced_data_file is not None)


def plan_rewrite(
    table: Any,
    target_file_size: int | None = None,
    row_filter: Any = None,
    options: dict[str, Any] | None = None,
    *,
    only_paths: Iterable[str] | None = None,
    strategy: str | None = None,
    sort_order: str | None = None,
) -> RewritePlan:
    """Choose the data files to rewrite as Java's bin-pack and sort strategies do.

    A file is a candidate when its size is outside [``min-file-size-bytes`` (75% of the
    target), ``max-file-size-bytes`` (180%)], it has ``delete-file-threshold`` or more
    delete files, or file-scoped deletes remove ``delete-ratio-threshold`` (0.3) of its
    rows.  Candidates are grouped per partition; a group is rewritten when it has
    ``min-input-files`` (5) or more files, more than one file and more bytes than the
    target, more bytes than the maximum, or a file with too many deletes;
    ``rewrite-all`` rewrites every file matching ``row_filter``.  ``only_paths``
    (used by :func:`rekey`) rewrites exactly those data files.

    ``strategy`` (or the option ``strategy``): ``binpack`` (default) or ``sort``, which
    writes each group's rows sorted by ``sort_order`` (or the option ``sort-order``,
    e.g. ``"id DESC NULLS LAST, name"``, or ``"zorder(id, name)"`` (:mod:`..files.zorder`);
    default the table's sort order, which must then be set).
    """
    options = {str(k): v for k, v in (options or {}).items()}
    target_obj, base_location, base = _fresh_base(table)
    chosen_order = _rewrite_order(base, base_location, strategy or options.get("strategy"),
                                  sort_order if sort_order is not None else options.get("sort-order"), options)  # fmt: skip
    properties = base.get("properties") or {}
    target = target_file_size or int(properties.get("write.target-file-size-bytes", DEFAULT_TARGET_FILE_SIZE))
    if target <= 0:
        raise ValueError(f"target_file_size must be positive, not {target}")
    min_size = _option(options, "min-file-size-bytes", int(target * 0.75), int)
    max_size = _option(options, "max-file-size-bytes", int(target * 1.8), int)
    min_inputs = _option(options, "min-input-files", 5, int)
    delete_threshold = _option(options, "delete-file-threshold", 2**31 - 1, int)
    ratio_threshold = _option(options, "delete-ratio-threshold", 0.3, float)
    rewrite_all = str(options.get("rewrite-all", "false")).lower() == "true"
    parent = w._current_snapshot(base)
    plan = RewritePlan(base_location, parent["snapshot-id"] if parent else None, base.get("last-sequence-number", 0), target, [])
    plan.sort_order = chosen_order
    if parent is None:
        return plan
    manager = target_obj.manager(base)
    live = _live(target_obj.io(manager), manager, parent)
    plan.base_delete_keys = {w._entry_key(e["data_file"]) for _, e in live.deletes()}

    wanted = set(only_paths) if only_paths is not None else None
    if wanted is None and row_filter is not None:
        wanted = {t.file.path for t in table.scan(row_filter=row_filter).plan_files()}
    tasks_by_file: dict[str, list[FileScanTask]] = {}
    # the rows keep their lineage: the tasks read it (inherited where a file stores none)
    columns = lineage_columns(table.schema)
    if columns is None:
        plan.lineage = False
        warnings.warn(f"{table.metadata_location}: the table has a column named like a row lineage column "
                      "(_row_id, _last_updated_sequence_number); the rewritten rows get new row ids", stacklevel=2)
    for task in table.scan(columns=columns).plan_files():
        tasks_by_file.setdefault(task.file.path, []).append(task)

    def too_many_deletes(tasks: list[FileScanTask]) -> bool:
        deletes = tasks[0].deletes
        if not deletes:
            return False
        if len(deletes) >= delete_threshold:
            return True
        known = sum(d.record_count for d in deletes if _is_file_scoped(d))
        records = tasks[0].file.record_count
        return records > 0 and min(known, records) / records >= ratio_threshold

    bins: dict[tuple[int, str], list[str]] = {}
    flagged: set[str] = set()
    for path, tasks in tasks_by_file.items():
        if wanted is not None and path not in wanted:
            continue
        size = tasks[0].file.file_size_in_bytes
        heavy = too_many_deletes(tasks)
        if only_paths is None and not rewrite_all and min_size <= size <= max_size and not heavy:
            continue
        if heavy:
            flagged.add(path)
        key = (tasks[0].spec_id, repr(tuple(tasks[0].partition)))
        bins.setdefault(key, []).append(path)
    max_group = _option(options, "max-file-group-size-bytes", 100 * 1024**3, int)
    for key in sorted(bins):
        paths = sorted(bins[key])
        # split a partition's files into groups of at most max-file-group-size-bytes
        chunks: list[list[str]] = [[]]
        size = 0
        for path in paths:
            n = tasks_by_file[path][0].file.file_size_in_bytes
            if chunks[-1] and size + n > max_group:
                chunks.append([])
                size = 0
            chunks[-1].append(path)
            size += n
        for chunk in chunks:
            size = sum(tasks_by_file[p][0].file.file_size_in_bytes for p in chunk)
            records = sum(tasks_by_file[p][0].file.record_count for p in chunk)
            rewrite = (
                only_paths is not None or rewrite_all
                or (len(chunk) > 1 and len(chunk) >= min_inputs)
                or (len(chunk) > 1 and size > target)
                or size > max_size
                or any(p in flagged for p in chunk)
            )  # fmt: skip
            if rewrite:
                group_tasks = [t for p in chunk for t in tasks_by_file[p]]
                plan.groups.append(RewriteGroup(len(plan.groups), key, chunk, group_tasks, size, records))
    return plan


def _rewrite_order(base: dict[str, Any], base_location: str, strategy: Any, sort_order: Any,
                   options: dict[str, Any]) -> SortOrder | ZOrder | None:
    """The order a rewrite writes its rows in: None for bin-pack (the writer then uses
    the table's order), the given or the table's order for ``sort``; a z-order for a
    ``sort_order`` of ``zorder(a, b)`` (Java's options ``var-length-contribution`` and
    ``max-output-size``)."""
    from icecrypt.table.ops.sort_order import parse_sort_order, sort_order_json

    name = "binpack" if strategy is None else str(strategy).strip().lower()
    if name not in ("binpack", "sort"):
        raise ValueError(f"unknown rewrite strategy {strategy!r} (expected 'binpack' or 'sort')")
    if name == "binpack":
        if sort_order is not None:
            raise ValueError("a sort order is an option of the 'sort' rewrite strategy, not of 'binpack'")
        return None
    if sort_order is None:
        order = table_sort_order(base)
        if order is None:
            raise ValueError(f"{base_location}: cannot sort data: the table is unsorted and no sort order was given")
        return order
    spec = w._specs(base)[base.get("default-spec-id", 0)]
    identities = {f.source_id for f in spec.fields if isinstance(f.transform, IdentityTransform)}
    zorder = parse_zorder(sort_order, w._schema(base), identities, options, where=f"{base_location}: ")
    if zorder is not None:
        return zorder
    fields = parse_sort_order(sort_order, w._schema(base), where=f"{base_location}: ")
    order = sort_order_json(base, fields)
    if order["order-id"] not in {o.get("order-id") for o in base.get("sort-orders") or ()}:
        order["order-id"] = 0  # not one of the table's orders: the files claim none
    return SortOrder.model_validate(order)


def rewrite_group(table: Any, plan: RewritePlan, group: RewriteGroup, *, file_format: str | None = None) -> list[dict[str, Any]]:
    """Read the live rows of ``group`` (deletes applied) and write them as new data files
    under fresh DEKs, in the table's default spec and format; returns their records
    (nothing is committed; nothing is left behind if this raises).  The rows keep their
    row lineage: the files store each row's ``_row_id`` and
    ``_last_updated_sequence_number`` as it read (the spec's rule for rows moved to a new
    file), so nothing is re-assigned when the new files get a ``first_row_id`` at
    commit.  Runs anywhere the table and its KMS can be opened (a Spark executor)."""
    target = w._Target.of(table)
    _, base = target.latest()
    io = target.io(target.manager(base, check_kek=False))  # fresh DEKs only; the commit checks the KEK
    schema = w._schema(base)
    spec = w._specs(base)[base.get("default-spec-id", 0)]
    properties = base.get("properties") or {}
    options = DataWriteOptions.from_properties(properties, file_format=file_format, target_file_size=plan.target_file_size)
    cache: dict = {}
    filesystem = table.locations.filesystem

    def batches() -> Iterator[pa.RecordBatch]:
        for task in group.tasks:
            yield from read_task(task, filesystem, cache=cache)

    data_files, _ = write_data_files(
        io, batches(), schema=schema, spec=spec, layout=w.write_layout(target, base), properties=properties,
        options=options,
        sort_order_id=base.get("default-sort-order-id", 0), lineage=plan.lineage,
        sort_order=plan.sort_order if plan.sort_order is not None else table_sort_order(base),
    )  # fmt: skip
    return data_files


def _applies(delete: dict[str, Any], delete_seq: int, data_file: dict[str, Any], data_seq: int, same_partition: bool) -> bool:
    """Whether a delete file may apply to a data file (Iceberg's scoping rules)."""
    if delete["content"] == POSITION_DELETES:
        ref = delete.get("referenced_data_file")
        if ref is not None:
            return ref == data_file["file_path"]
        return same_partition and data_seq <= delete_seq
    return same_partition and data_seq < delete_seq


def commit_rewrite(
    table: Any, plan: RewritePlan, new_files: list[dict[str, Any]], *, progress: Progress = None, operation: str = "replace"
) -> RewriteDataFilesResult:
    """Commit a rewrite: ``plan``'s data files removed, ``new_files`` added (with the
    starting sequence number, as Java's ``use-starting-sequence-number``), and the delete
    files that then apply to no live data file removed; one ``replace`` snapshot.

    A concurrent append is kept (the commit is rebuilt on it); a concurrent commit that
    removed a rewritten file or added deletes that may apply to one makes this raise
    CommitConflictError.  The new files are deleted if this raises."""
    target = w._Target.of(table)
    written = [f["file_path"] for f in new_files]
    io = None
    rewritten = plan.paths
    try:
        base_location, base = target.latest()
        io = target.io(target.manager(base))
        if not plan.groups:
            return RewriteDataFilesResult(base.get("current-snapshot-id"))
        specs, schema = w._specs(base), w._schema(base)
        layout = w.write_layout(target, base)
        snapshot_id = w._new_snapshot_id(base)
        default_spec = specs[base.get("default-spec-id", 0)]
        added_entry_manifest = None
        if new_files:
            entries = [
                {"status": ADDED, "snapshot_id": snapshot_id, "sequence_number": plan.starting_sequence_number,
                 "file_sequence_number": None, "data_file": f}
                for f in new_files
            ]  # fmt: skip
            written.append(loc := layout.metadata_file(f"{uuid.uuid4()}-m0.avro"))
            added_entry_manifest = write_manifest(io, loc, entries, spec=default_spec, schema=schema, content=DATA)
        cache: dict[str, list] = {}
        rewritten_manifests: dict[tuple[str, frozenset], tuple[WrittenManifest, list]] = {}
        outcome: dict[str, Any] = {}

        def build(version: dict[str, Any], manager: Any) -> w._Change:
            vio = target.io(manager)
            live = _live(vio, manager, w._current_snapshot(version), cache)
            data_seq: dict[str, tuple[int, tuple]] = {}
            for m, e in live.data():
                data_seq[e["data_file"]["file_path"]] = (e["sequence_number"], _partition_key(e["data_file"], m["partition_spec_id"]))
            missing = rewritten - set(data_seq)
            if missing:
                raise CommitConflictError(
                    f"{target.metadata_location}: {len(missing)} data file(s) being rewritten were removed by a "
                    f"concurrent commit (e.g. {sorted(missing)[0]}); nothing was committed"
                )
            unpartitioned = {sid for sid, s in w._specs(version).items() if s.is_unpartitioned()}
            removed: set = {(p, None) for p in rewritten}
            for m, e in live.deletes():
                d = e["data_file"]
                dkey = w._entry_key(d)
                dpart = _partition_key(d, m["partition_spec_id"])
                glob = m["partition_spec_id"] in unpartitioned and d["content"] == EQUALITY_DELETES
                seq = e["sequence_number"]

                def hits(path: str) -> bool:
                    fseq, fpart = data_seq[path]
                    return _applies(d, seq, {"file_path": path}, fseq, glob or fpart == dpart)

                if dkey not in plan.base_delete_keys and any(hits(p) for p in rewritten):
                    raise CommitConflictError(
                        f"{target.metadata_location}: a concurrent commit added delete file {d['file_path']} that "
                        "may apply to data files being rewritten; nothing was committed"
                    )
                if dkey in plan.base_delete_keys and not any(hits(p) for p in data_seq if p not in rewritten):
                    removed.add(dkey)
            new_manifests = [added_entry_manifest] if added_entry_manifest is not None else []
            kept, gone = [], []
            for m in live.manifests:
                entries = live.entries[m["manifest_path"]]
                hit = frozenset(k for k in (w._entry_key(e["data_file"]) for e in entries) if k in removed)
                if not hit:
                    kept.append(m)
                    continue
                key = (m["manifest_path"], hit)
                if key not in rewritten_manifests:
                    written.append(loc := layout.metadata_file(f"{uuid.uuid4()}-m1.avro"))
                    rewritten_manifests[key] = _rewrite_manifest(vio, loc, m, entries, removed, snapshot_id, specs, schema,
                                                                       w._schemas(version))
                manifest, files = rewritten_manifests[key]
                new_manifests.append(manifest)
                gone.extend(files)
            outcome["removed"] = gone
            return w._Change(operation, new_manifests, kept, list(new_files), gone, len(live.manifests) - len(kept))

        _emit(progress, "commit", snapshot_id=snapshot_id)
        w._commit_change(target, base_location, base, build, snapshot_id=snapshot_id, retry=True)
    except BaseException as exc:
        w._discard(io or target.io(None), written, exc)
        raise
    # Manifests written for attempts that lost a race are not in the table: delete them.
    # Best effort only: the commit stands, so nothing after it may fail the operation
    # (what is left is an orphan that remove_orphan_files finds).
    used = {m.record["manifest_path"] for m, _ in rewritten_manifests.values()}
    try:
        snap = table.current_snapshot()
        final = {m.path for m in table.manifests(snap)} if snap is not None else set()
    except Exception:  # noqa: BLE001 - see above
        final = used
    w._cleanup(io, sorted(used - final))
    gone = outcome.get("removed", [])
    return RewriteDataFilesResult(
        snapshot_id,
        rewritten_data_files=sum(1 for f in gone if f["content"] == DATA),
        added_data_files=len(new_files),
        removed_delete_files=sum(1 for f in gone if f["content"] != DATA),
        rewritten_bytes=sum(f["file_size_in_bytes"] for f in gone if f["content"] == DATA),
        added_bytes=sum(f["file_size_in_bytes"] for f in new_files),
        groups=len(plan.groups),
    )


def rewrite_data_files(
    table: Any,
    target_file_size: int | None = None,
    row_filter: Any = None,
    options: dict[str, Any] | None = None,
    *,
    progress: Progress = None,
    only_paths: Iterable[str] | None = None,
    strategy: str | None = None,
    sort_order: str | None = None,
) -> RewriteDataFilesResult:
    """Bin-pack the table's data files (Java's ``rewriteDataFiles`` with the bin-pack
    strategy): plan (:func:`plan_rewrite`), rewrite each group's live rows into new files
    under fresh DEKs (:func:`rewrite_group`; the rows keep their ``_row_id`` and
    ``_last_updated_sequence_number``), commit once (:func:`commit_rewrite`).
    ``progress(event, detail)`` is called with ``"group-written"`` and ``"commit"``."""
    plan = plan_rewrite(table, target_file_size, row_filter, options, only_paths=only_paths, strategy=strategy,
                        sort_order=sort_order)  # fmt: skip
    if not plan.groups:
        return RewriteDataFilesResult(table.current_snapshot_id)
    new_files: list[dict[str, Any]] = []
    try:
        for group in plan.groups:
            files = rewrite_group(table, plan, group)
            new_files.extend(files)
            _emit(progress, "group-written", group=group.index, files=len(files))
    except BaseException:
        io = w._Target.of(table).io(None)
        w._cleanup(io, [f["file_path"] for f in new_files])
        raise
    return commit_rewrite(table, plan, new_files, progress=progress)


# --- rewrite position delete files -----------------------------------------------------------------

#: The options of Java's ``RewritePositionDeleteFiles`` action and its bin-pack planner.
POSITION_DELETE_REWRITE_OPTIONS = frozenset({
    "target-file-size-bytes", "min-file-size-bytes", "max-file-size-bytes", "min-input-files", "rewrite-all",
    "max-file-group-size-bytes", "max-file-group-input-files", "rewrite-job-order",
    "max-concurrent-file-group-rewrites", "partial-progress.enabled", "partial-progress.max-commits",
})  # fmt: skip
_JOB_ORDERS = ("bytes-asc", "bytes-desc", "files-asc", "files-desc", "none")
DELETE_TARGET_FILE_SIZE = "write.delete.target-file-size-bytes"
DEFAULT_DELETE_TARGET_FILE_SIZE = 64 * 1024 * 1024  # Java's default


@dataclasses.dataclass
class RewritePositionDeletesResult:
    """Outcome of a position-delete rewrite (Java's ``RewritePositionDeleteFiles.Result``)."""

    snapshot_id: int | None
    rewritten_delete_files: int = 0
    added_delete_files: int = 0
    rewritten_bytes: int = 0
    added_bytes: int = 0


def _checked_options(options: dict[str, Any] | None) -> dict[str, str]:
    """``options`` as text, every name one of Java's and every value of its kind."""
    given = {str(k): str(v) for k, v in (options or {}).items()}
    unknown = sorted(set(given) - POSITION_DELETE_REWRITE_OPTIONS)
    if unknown:
        raise ValueError(f"option {', '.join(unknown)} is not an option of rewrite_position_delete_files "
                         f"(options: {', '.join(sorted(POSITION_DELETE_REWRITE_OPTIONS))})")
    for name, value in given.items():
        if name in ("rewrite-all", "partial-progress.enabled"):
            if value.strip().lower() not in ("true", "false"):
                raise ValueError(f"option {name}: {value!r} is not true or false")
        elif name == "rewrite-job-order":
            if value.strip().lower() not in _JOB_ORDERS:
                raise ValueError(f"option {name}: {value!r} is not one of {', '.join(_JOB_ORDERS)}")
        else:
            try:
                number = int(value)
            except ValueError:
                raise ValueError(f"option {name}: {value!r} is not a whole number") from None
            if number < (0 if name == "min-file-size-bytes" else 1):
                raise ValueError(f"option {name}: {number} is out of range")
    return given


def rewrite_position_delete_files(
    table: Any, row_filter: Any = None, options: dict[str, Any] | None = None
) -> RewritePositionDeletesResult:
    """Java's ``rewritePositionDeletes`` on a format-version 3 table, whose position
    deletes belong in deletion vectors: the position-delete files of the v2 format
    (Parquet or Avro ``file_path``/``pos`` rows, which a table upgraded from v2 may still
    hold) are rewritten into deletion vectors, one per data file they apply to (a data
    file that already has a vector keeps it: readers ignore v2 files beside one, which
    holds every position delete of its file); deletes of data files no longer live
    ("dangling") are dropped. The table's rows stay as they were. A table whose
    position deletes are all deletion vectors has nothing to rewrite (Java returns the
    same empty result).

    Which files are rewritten is Java's bin-pack planner's choice, per partition: files
    smaller than ``min-file-size-bytes`` (75 % of ``target-file-size-bytes``, default
    ``write.delete.target-file-size-bytes``, 64 MiB) or larger than
    ``max-file-size-bytes`` (180 %), in a group of ``min-input-files`` (5) or more, or
    of more than one file and more bytes than the target, or of more bytes than the
    maximum; ``rewrite-all`` takes every file. ``row_filter`` keeps the files that apply
    to a data file it may match (a file that applies to no live data file is left to a
    run without a filter). Java's other options are accepted (they tune its parallel
    runner); unknown options and malformed values raise ValueError.

    One ``replace`` commit, refused (CommitConflictError) when the table changed since it
    was planned; the new vectors are in one Puffin file under a fresh key."""
    opts = _checked_options(options)
    target_obj, base_location, base = _fresh_base(table)
    if row_filter is not None:
        w._bind_filter(row_filter, w._schema(base))  # a malformed filter fails on any table
    parent = w._current_snapshot(base)
    if parent is None:
        return RewritePositionDeletesResult(base.get("current-snapshot-id"))
    properties = base.get("properties") or {}
    target = _option(opts, "target-file-size-bytes",
                     int(properties.get(DELETE_TARGET_FILE_SIZE, DEFAULT_DELETE_TARGET_FILE_SIZE)), int)
    min_size = _option(opts, "min-file-size-bytes", int(target * 0.75), int)
    max_size = _option(opts, "max-file-size-bytes", int(target * 1.8), int)
    min_inputs = _option(opts, "min-input-files", 5, int)
    max_group = _option(opts, "max-file-group-size-bytes", 100 * 1024**3, int)
    max_group_files = _option(opts, "max-file-group-input-files", 2**63 - 1, int)
    rewrite_all = opts.get("rewrite-all", "false").strip().lower() == "true"

    manager = target_obj.manager(base)
    io = target_obj.io(manager)
    live = _live(io, manager, parent)
    v2_files = [(m, e["data_file"]) for m, e in live.deletes()
                if e["data_file"]["content"] == POSITION_DELETES and not w._is_dv(e["data_file"])]
    if not v2_files:
        return RewritePositionDeletesResult(parent["snapshot-id"])
    tasks: dict[str, FileScanTask] = {}  # data file path -> its first task (its splits share deletes)
    for task in table.scan().plan_files():
        tasks.setdefault(task.file.path, task)
    if row_filter is not None:
        in_scope = {d.path for t in table.scan(row_filter=row_filter).plan_files() for d in t.deletes}
        v2_files = [(m, d) for m, d in v2_files if d["file_path"] in in_scope]
    partitions: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for m, d in v2_files:
        partitions.setdefault(_partition_key(d, m["partition_spec_id"]), []).append(d)
    chosen: dict[str, dict[str, Any]] = {}
    for key in sorted(partitions):
        files = sorted(partitions[key], key=lambda d: d["file_path"])
        if not rewrite_all:
            files = [d for d in files if not min_size <= d["file_size_in_bytes"] <= max_size]
        groups: list[list[dict[str, Any]]] = [[]]
        for d in files:
            size = sum(g["file_size_in_bytes"] for g in groups[-1])
            if groups[-1] and (size + d["file_size_in_bytes"] > max_group or len(groups[-1]) >= max_group_files):
                groups.append([])
            groups[-1].append(d)
        for group in groups:
            size = sum(d["file_size_in_bytes"] for d in group)
            if group and (rewrite_all or len(group) >= min_inputs or (len(group) > 1 and size > target)
                          or size > max_size):
                chosen.update((d["file_path"], d) for d in group)
    if not chosen:
        return RewritePositionDeletesResult(parent["snapshot-id"])

    data = {e["data_file"]["file_path"]: (m["partition_spec_id"], e["data_file"]) for m, e in live.data()}
    dropped = {w._entry_key(d) for d in chosen.values()}
    vectors: list[w._Vector] = []
    filesystem = table.locations.filesystem
    cache: dict = {}
    for path, task in sorted(tasks.items()):
        # A data file with a deletion vector has no v2 file among its deletes (readers take
        # the vector alone: it holds every position delete of its file), so it keeps it.
        # One without gets a vector of every position delete that applies to it, chosen
        # file or not: once it has a vector, readers ignore its v2 files.
        if path in data and any(d.path in chosen for d in task.deletes):
            positions = _positions(task, filesystem, cache)
            if positions is not None:
                spec_id, record = data[path]
                vectors.append(w._Vector(record, spec_id, positions))
    added: list[dict[str, Any]] = []
    snapshot_id = w._commit_delete(target_obj, base_location, base, io, w._schema(base), live.manifests,
                                   live.entries, dropped, vectors, operation="replace", added=added)
    table.refresh()
    return RewritePositionDeletesResult(
        snapshot_id,
        rewritten_delete_files=len(dropped),
        added_delete_files=len(added),
        rewritten_bytes=sum(d["file_size_in_bytes"] for d in chosen.values()),
        added_bytes=sum(d["content_size_in_bytes"] for d in added),
    )


# --- rewrite manifests -----------------------------------------------------------------------------


@dataclasses.dataclass
class RewriteManifestsResult:
    snapshot_id: int | None
    rewritten_manifests: int = 0
    added_manifests: int = 0
    entries: int = 0


def _cluster_key(entry: dict[str, Any]) -> tuple:
    """Entries in partition order (by value, field by field, nulls last), then by path:
    each regrouped manifest then covers a narrow range of partitions, which its summary
    lets a filter skip.  (Ordered by text, batch 10 would sit between 1 and 2.)"""
    partition = entry["data_file"]["partition"] or {}
    return tuple((v is None, v if v is not None else 0) for v in partition.values()), entry["data_file"]["file_path"]


def rewrite_manifests(
    table: Any, *, target_size: int | None = None, progress: Progress = None, force: bool = False
) -> RewriteManifestsResult:
    """Regroup the live entries of the current snapshot's manifests, clustered by
    partition, into manifests of ``commit.manifest.target-size-bytes`` (8 MiB), each a
    new AGS1 file under a fresh key; commits a ``replace`` snapshot (Java's
    ``RewriteManifests`` / ``rewriteManifests`` action: entries EXISTING with their
    snapshot ids and sequence numbers, DELETED entries dropped, summary with
    ``manifests-created/kept/replaced`` and ``entries-processed``).  Data and delete
    manifests are regrouped separately, per partition spec.  Nothing is regrouped for a content type with a single manifest when the target asks for one (unless
    ``force``): a content type
    with one manifest and a target of one is left as it is.  A concurrent append survives; a concurrent commit that replaced a
    manifest being rewritten makes this raise CommitConflictError."""
    target, base_location, base = _fresh_base(table)
    parent = w._current_snapshot(base)
    if parent is None:
        return RewriteManifestsResult(None)
    size = target_size or int((base.get("properties") or {}).get(MANIFEST_TARGET_SIZE, DEFAULT_MANIFEST_TARGET_SIZE))
    manager = target.manager(base)
    io = target.io(manager)
    all_manifests = w._read_manifest_list(io, manager, parent)
    live = _live(io, manager, parent)
    specs, schema = w._specs(base), w._schema(base)
    layout = w.write_layout(target, base)
    snapshot_id = w._new_snapshot_id(base)
    groups: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for m in all_manifests:
        content = DATA if m["content"] == DATA else POSITION_DELETES
        groups.setdefault((content, m["partition_spec_id"]), []).append(m)
    plans = []
    for key, manifests in sorted(groups.items()):
        total = sum(m["manifest_length"] for m in manifests)
        wanted = max(1, math.ceil(total / size))
        if wanted == 1 and len(manifests) == 1 and not force:  # as Java's action: nothing to regroup
            continue
        entries = [e for m in manifests for e in live.entries.get(m["manifest_path"], [])]
        entries.sort(key=_cluster_key)
        plans.append((key, manifests, entries, wanted))
    if not plans:
        return RewriteManifestsResult(parent["snapshot-id"])
    written: list[str] = []
    try:
        new_manifests: list[WrittenManifest] = []
        replaced: set[str] = set()
        processed = 0
        for (content, spec_id), manifests, entries, wanted in plans:
            replaced |= {m["manifest_path"] for m in manifests}
            processed += len(entries)
            per = max(1, math.ceil(len(entries) / wanted)) if entries else 0
            for start in range(0, len(entries), per or 1):
                chunk = []
                for e in entries[start : start + per]:
                    e = dict(e)
                    e["status"] = EXISTING
                    chunk.append(e)
                written.append(loc := layout.metadata_file(f"{uuid.uuid4()}-m{len(written)}.avro"))
                new_manifests.append(write_manifest(io, loc, chunk, spec=specs[spec_id], schema=schema, content=content,
                                                    schemas=w._schemas(base)))
        _emit(progress, "commit", snapshot_id=snapshot_id)

        def build(version: dict[str, Any], vmanager: Any) -> w._Change:
            vparent = w._current_snapshot(version)
            current = w._read_manifest_list(target.io(vmanager), vmanager, vparent) if vparent else []
            paths = {m["manifest_path"] for m in current}
            if not replaced <= paths:
                raise CommitConflictError(
                    f"{target.metadata_location}: manifests being rewritten were replaced by a concurrent commit; "
                    "nothing was committed"
                )
            kept = [m for m in current if m["manifest_path"] not in replaced]
            return w._Change(
                "replace", new_manifests, kept, replaced_manifests=len(replaced),
                summary_extra={"entries-processed": str(processed)},
            )  # fmt: skip

        w._commit_change(target, base_location, base, build, snapshot_id=snapshot_id, retry=True)
    except BaseException as exc:
        w._discard(io, written, exc)
        raise
    return RewriteManifestsResult(snapshot_id, len(replaced), len(new_manifests), processed)


# --- key usage and rekey -------------------------------------------------------------------------


@dataclasses.dataclass
class KeyUsage:
    """Which keys the reachable files of a table use: DEK fingerprints by file location
    (data, delete files, manifests, manifest lists), the KEK id of each snapshot, and the
    KEK ids present in the metadata file(s)."""

    files: dict[str, str]
    snapshot_keks: dict[int, str]
    keks: set[str]

    def using(self, fingerprints: set[str]) -> list[str]:
        return sorted(path for path, fp in self.files.items() if fp in fingerprints)


def _kek_of(manager: Any, snapshot_key_id: str) -> str | None:
    try:
        return manager.get_key(snapshot_key_id).encrypted_by_id
    except Exception:
        return None


def key_usage(table: Any, *, metadata_files: bool = True) -> KeyUsage:
    """The keys every file reachable from every snapshot uses (reads manifest lists and
    manifests, never data).  With ``metadata_files``, KEK ids of every metadata file in
    the metadata log too (old versions keep wrapped keys)."""
    table.refresh()
    files: dict[str, str] = {}
    snapshot_keks: dict[int, str] = {}
    manager = table.encryption_manager
    if manager is None:
        return KeyUsage({}, {}, set())
    keks = {k.key_id for k in manager.encryption_keys if manager.is_kek(k)}
    seen: set[str] = set()
    for snapshot in table.snapshots():
        km = table.manifest_list_key_metadata(snapshot)
        files[snapshot.manifest_list] = fingerprint(km)
        snapshot_keks[snapshot.snapshot_id] = _kek_of(manager, snapshot.key_id)
        for manifest in table.manifests(snapshot):
            files[manifest.path] = fingerprint(manifest.key_metadata)
            if manifest.path in seen:
                continue
            seen.add(manifest.path)
            from icecrypt.table.files.manifest import read_manifest

            for entry in read_manifest(manifest, table.locations, table.specs, table.schema, encrypted=True):
                files[entry.file.file_path] = fingerprint(entry.file.key_metadata)
    if metadata_files:
        for entry in table.metadata.get("metadata-log") or ():
            path = table.fs_path(entry["metadata-file"])
            try:
                old = _commit.read_metadata(table.filesystem, path)
            except FileNotFoundError:
                continue
            keks |= {k["key-id"] for k in old.get("encryption-keys") or () if k.get("encrypted-by-id") == old.get("properties", {}).get("encryption.key-id")}
    return KeyUsage(files, snapshot_keks, keks)


@dataclasses.dataclass
class RekeyResult:
    """What :func:`rekey` did: the retired keys (fingerprints and KEK ids, never key
    bytes), the files rewritten, the new KEK, and what expiry removed."""

    retired_fingerprints: set[str]
    retired_kek_ids: set[str]
    new_kek_id: str | None
    rewrite: RewriteDataFilesResult | None
    manifests: RewriteManifestsResult | None
    expired_snapshot_ids: list[int] = dataclasses.field(default_factory=list)
    removed_metadata_files: list[str] = dataclasses.field(default_factory=list)
    table_key_id: str | None = None
    #: files expiry did not delete because they are not the table's (as recorded:
    #: outside its pinned location, behind a symbolic link, or not a metadata file
    #: where the metadata log names one); a PathOutsideTableWarning names them too
    skipped_files: list[str] = dataclasses.field(default_factory=list)

    def check(self, table: Any) -> list[str]:
        """Problems: reachable files still using a retired key, snapshots under a retired
        KEK, retired KEKs still in a reachable metadata file.  Empty = clean."""
        usage = key_usage(table)
        problems = [f"{p}: uses a retired key" for p in usage.using(self.retired_fingerprints)]
        problems += [f"snapshot {s}: manifest list under retired KEK {k}" for s, k in usage.snapshot_keks.items() if k in self.retired_kek_ids]
        problems += [f"KEK {k} still in the table metadata" for k in sorted(usage.keks & self.retired_kek_ids)]
        return problems


def rekey(
    table: Any,
    *,
    files: Iterable[str] = (),
    key_metadata: Iterable[bytes] = (),
    snapshot_ids: Iterable[int] = (),
    kek_ids: Iterable[str] = (),
    everything: bool = False,
    new_master_key_id: str | None = None,
    new_kms: Any = None,
    expire: bool = False,
    target_file_size: int | None = None,
    progress: Progress = None,
) -> RekeyResult:
    """Respond to a key compromise: re-encrypt under fresh keys everything the leaked
    keys protect, rotate the KEK, and with ``expire`` drop every trace of the old keys.

    Leaked keys: ``files`` (data, delete or manifest locations whose DEK leaked),
    ``key_metadata`` (leaked key metadata blobs, matched by key), ``snapshot_ids`` (their
    manifest-list keys leaked), ``kek_ids`` (those KEKs leaked; every manifest-list key
    they wrap is then leaked), or ``everything``.  A leaked manifest-list key exposes the
    keys of its manifests, and a leaked manifest key those of its files: the closure is
    retired.  Steps: (1) a new KEK (the leaked KEKs, and every other KEK there was, are
    retired for new wraps in this table object: a version that puts one back, even under
    a fresh id, is refused, :class:`~icecrypt.errors.ReplayedKeyError`); (2) the live data
    files under retired keys, and those a retired delete file applies to, are rewritten
    (deletes applied; new DEKs; rows keep their row lineage) in one ``replace`` commit; (3) every
    manifest is rewritten under a fresh key; (4) with ``expire``: every snapshot but the
    current one (and ref heads) is expired and its files deleted, retired KEK entries
    removed, and the older metadata files (which hold the old wrapped keys) are dropped
    from the metadata log and deleted; (5) with ``new_master_key_id`` every KEK left is
    re-wrapped under it -- after (4) when ``expire`` is set, so a leaked KEK is never
    wrapped under the new master key.  :meth:`RekeyResult.check` then proves that no
    reachable file or metadata uses a retired key.

    The response to a leaked KEK is ``rekey(kek_ids=..., new_master_key_id=...,
    expire=True)`` followed by disabling the old master key in the KMS: the old KEK's
    wrapped bytes, which a storage attacker keeps, then unwrap nowhere, so a writer given
    them back under a fresh KEK id refuses to use them.
    """
    from icecrypt.table.files.manifest import read_manifest

    table.refresh()
    manager = table.encryption_manager
    if manager is None:
        raise ValueError(f"{table.metadata_location}: the table is not encrypted; nothing to re-key")
    leaked_files = set(files)
    leaked_fps = {fingerprint(k) for k in key_metadata}
    leaked_snaps = {int(s) for s in snapshot_ids}
    leaked_keks = set(kek_ids)
    for kek in leaked_keks:
        manager.get_key(kek)  # KeyError for an unknown id: a typo must not pass as "done"
    for snapshot in table.snapshots():
        if everything or _kek_of(manager, snapshot.key_id) in leaked_keks:
            leaked_snaps.add(snapshot.snapshot_id)
    if everything:
        leaked_keks |= {k.key_id for k in manager.encryption_keys if manager.is_kek(k)}
    # the closure: a leaked list exposes its manifests, a leaked manifest its files
    retired: set[str] = set(leaked_fps)
    for snapshot in table.snapshots():
        list_leaked = snapshot.snapshot_id in leaked_snaps or snapshot.manifest_list in leaked_files
        if list_leaked:
            retired.add(fingerprint(table.manifest_list_key_metadata(snapshot)))
        for manifest in table.manifests(snapshot):
            mfp = fingerprint(manifest.key_metadata)
            if list_leaked or manifest.path in leaked_files:
                retired.add(mfp)
            manifest_leaked = mfp in retired
            for entry in read_manifest(manifest, table.locations, table.specs, table.schema, encrypted=True):
                fp = fingerprint(entry.file.key_metadata)
                if manifest_leaked or entry.file.file_path in leaked_files:
                    retired.add(fp)
    retired.discard(None)
    # what of the current snapshot must be rewritten
    target, _, base = _fresh_base(table)
    parent = w._current_snapshot(base)
    rewrite_paths: set[str] = set()
    if parent is not None:
        vmanager = target.manager(base, check_kek=False)  # reads only; the KEK rotates next
        live = _live(target.io(vmanager), vmanager, parent)
        data = [(m, e) for m, e in live.data()]
        for _, e in data:
            if fingerprint(e["data_file"]["key_metadata"]) in retired:
                rewrite_paths.add(e["data_file"]["file_path"])
        unpartitioned = {sid for sid, s in w._specs(base).items() if s.is_unpartitioned()}
        for m, e in live.deletes():
            d = e["data_file"]
            if fingerprint(d["key_metadata"]) not in retired:
                continue
            dpart = _partition_key(d, m["partition_spec_id"])
            glob = m["partition_spec_id"] in unpartitioned and d["content"] == EQUALITY_DELETES
            for dm, de in data:
                same = glob or _partition_key(de["data_file"], dm["partition_spec_id"]) == dpart
                if _applies(d, e["sequence_number"], de["data_file"], de["sequence_number"], same):
                    rewrite_paths.add(de["data_file"]["file_path"])
    _emit(progress, "rotate-kek")
    manager.retire_keks(leaked_keks, unwrap=True)
    rotated = w.rotate_keys(table, new_kek=True)
    retired_keks = leaked_keks
    rewrite = None
    if rewrite_paths:
        rewrite = rewrite_data_files(table, target_file_size, only_paths=rewrite_paths, progress=progress)
    _emit(progress, "rewrite-manifests")
    manifests = rewrite_manifests(table, force=True, progress=progress)
    table_key_id = table.encryption_manager.table_key_id
    if new_master_key_id is not None and not expire:
        table_key_id = w.rotate_keys(table, new_kek=False, new_master_key_id=new_master_key_id, new_kms=new_kms)["table_key_id"]
    result = RekeyResult(retired, retired_keks, rotated["kek_id"], rewrite, manifests, table_key_id=table_key_id)
    if expire:
        _emit(progress, "expire")
        result.expired_snapshot_ids = w.expire_snapshots(table, _now_ms() + 1)
        deletions = _drop_old_keys_and_metadata(table, retired_keks)
        result.removed_metadata_files = deletions.deleted
        result.skipped_files = [*getattr(result.expired_snapshot_ids, "skipped_files", ()), *deletions.skipped_locations]
        if new_master_key_id is not None:
            # the leaked KEKs are gone: none of them is ever wrapped under the new master key
            result.table_key_id = w.rotate_keys(
                table, new_kek=False, new_master_key_id=new_master_key_id, new_kms=new_kms
            )["table_key_id"]
    return result


def _drop_old_keys_and_metadata(table: Any, retired_keks: set[str]) -> Deletions:
    """One metadata commit that removes retired KEKs (and key entries no snapshot uses)
    and empties the metadata log; then the older metadata files are deleted."""
    from icecrypt.keys.manager import referenced_keys
    from icecrypt.table.commit import committer as _committer

    target = w._Target.of(table)
    old_log: list[str] = []
    landed_base = [""]  # the base of the last attempt: the one that landed

    def build(base_location: str, base: dict[str, Any]) -> _committer.Staged:
        check_unambiguous(target.store, target.filesystem, base_location, base)  # it deletes metadata files
        manager = target.manager(base, check_kek=False)  # a metadata-only commit
        used = set().union(*referenced_keys(base).values()) if base.get("snapshots") else set()
        current = manager.current_kek()
        drop = set()
        for key in manager.encryption_keys:
            if key.key_id in used or (current is not None and key.key_id == current.key_id):
                continue
            if manager.is_kek(key) and key.key_id not in retired_keks:
                continue  # an unused, unleaked KEK may be chosen by a concurrent writer
            drop.add(key.key_id)
        manager.remove_keys(drop)
        old_log[:] = [e["metadata-file"] for e in base.get("metadata-log") or ()]
        landed_base[0] = base_location
        updates = [*w._key_updates(base, manager), _model.ResetMetadataLog()]
        # the pruned manager is the table object's once the commit landed
        return _committer.Staged(
            _model.Change.on(base, updates, what="re-key cleanup"),
            manager=manager,
            keys_whole=False,  # keys were dropped: installing the new version checks the rest
        )

    _committer.commit(target, build)
    # the metadata log is storage's word: only metadata files under the table's
    # pinned roots are deleted (never through a link); anything else is reported
    deletions = Deletions(table.locations, f"rekey of {table.pin.location}")
    delete_logged_metadata_files(deletions, old_log)
    with contextlib.suppress(OSError):
        deletions.path(landed_base[0])
    deletions.warn()
    return deletions


# --- orphan files --------------------------------------------------------------------------------

#: temporary files of killed writers: ``.<name>.<random>.tmp`` (``_atomic.AtomicFile``,
#: the Parquet and Avro writers), next to the file they were to become
_TEMP_NAME = re.compile(r"\A\..+\.[A-Za-z0-9_]+\.tmp\Z")


@dataclasses.dataclass
class OrphanFilesResult:
    """Files under the table location no metadata references (filesystem paths), and
    whether they were deleted (False for a dry run)."""

    orphan_files: list[str]
    deleted: bool
    older_than_ms: int
    referenced: int = 0
    #: orphans not deleted because a directory on the way became a symbolic link
    skipped_files: list[str] = dataclasses.field(default_factory=list)


def _to_ms(older_than: Any) -> int:
    if older_than is None:
        return _now_ms() - ORPHAN_SAFETY_MS
    if hasattr(older_than, "timestamp"):
        return int(older_than.timestamp() * 1000)
    return int(older_than)


def referenced_files(table: Any) -> set[str]:
    """Filesystem paths of everything the table's metadata references: the current and
    every logged metadata file, the version hint, statistics files, and for every
    snapshot of each of those metadata files its manifest list, manifests, data and
    delete files (Puffin included).  A snapshot of an old metadata file whose manifest
    list is gone (expired) is skipped; any other read error raises (never guess)."""
    from icecrypt.keys import EncryptionManager

    table.refresh()
    fs = table.filesystem
    # a reference only protects a file from deletion: map it whatever it names (files
    # outside the table are never listed here); what is *read* stays confined
    unconfined = table.locations.unconfined

    def ref_path(location: str) -> str:
        try:
            return unconfined.to_fs_path(location)
        except ValueError:  # a location this filesystem cannot open protects nothing on it
            return location
    refs: set[str] = {_norm(table.metadata_location)}
    metadata_dir = posixpath.dirname(table.metadata_location)
    refs.add(_norm(posixpath.join(metadata_dir, _commit.VERSION_HINT)))
    documents = [(table.metadata_location, table.metadata, True)]
    for entry in table.metadata.get("metadata-log") or ():
        refs.add(_norm(ref_path(entry["metadata-file"])))
        path = table.fs_path(entry["metadata-file"], what="metadata-log entry")
        try:
            documents.append((path, _commit.read_metadata(fs, path), False))
        except FileNotFoundError:
            continue
    seen_lists: set[str] = set()
    seen_manifests: set[str] = set()
    for path, metadata, current in documents:
        for name in ("statistics", "partition-statistics"):
            for stat in metadata.get(name) or ():
                if stat.get("statistics-path"):
                    refs.add(_norm(ref_path(stat["statistics-path"])))
        snapshots = metadata.get("snapshots") or []
        if not snapshots:
            continue
        manager = None
        if (metadata.get("properties") or {}).get("encryption.key-id"):
            if not current:
                # A KEK keeps its id when the master key rotates: take the current
                # metadata's wrapping of it, so that an old metadata file stays readable
                # after the old master key was retired from the KMS.
                metadata = _with_current_keks(metadata, table.metadata)
            manager = EncryptionManager.from_table_metadata(table.kms, metadata)
        io = w._Target.of(table).io(manager)
        for snapshot in snapshots:
            ml = snapshot["manifest-list"]
            if ml in seen_lists:
                continue
            seen_lists.add(ml)
            refs.add(_norm(ref_path(ml)))
            try:
                manifests = w._read_manifest_list(io, manager, snapshot)
            except FileNotFoundError:
                if current:
                    raise
                continue
            except (EncryptionKeyNotFoundError, KmsKeyNotFoundError):
                # Only an old metadata file's snapshot that the current metadata no longer
                # has, under a key that was retired since: as Java (which counts only the
                # current metadata's snapshots), it protects nothing. The current
                # metadata's snapshots must always read.
                if current:
                    raise
                continue
            for m in manifests:
                refs.add(_norm(ref_path(m["manifest_path"])))
                if m["manifest_path"] in seen_manifests:
                    continue
                seen_manifests.add(m["manifest_path"])
                try:
                    entries = w._read_entries(io, m)
                except FileNotFoundError:
                    if current:
                        raise
                    continue
                for e in entries:
                    refs.add(_norm(ref_path(e["data_file"]["file_path"])))
    return refs


def _with_current_keks(metadata: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    by_id = {entry.get("key-id"): entry for entry in current.get("encryption-keys") or ()}
    keys = [by_id.get(entry.get("key-id"), entry) for entry in metadata.get("encryption-keys") or ()]
    properties = dict(metadata.get("properties") or {})
    properties["encryption.key-id"] = (current.get("properties") or {}).get("encryption.key-id", properties["encryption.key-id"])
    return {**metadata, "encryption-keys": keys, "properties": properties}


def _norm(path: str) -> str:
    return posixpath.normpath(str(path))


def remove_orphan_files(
    table: Any, older_than: Any = None, dry_run: bool = False, *, location: str | None = None
) -> OrphanFilesResult:
    """Find (and unless ``dry_run`` delete) the files under the table location (or
    ``location``) that no metadata references and that were last modified before
    ``older_than`` (ms since the epoch or a datetime; default now - 3 days, Java's
    safety window: a file a running writer has not committed yet is younger).

    Referenced is whatever :func:`referenced_files` lists.  Hidden files are skipped as
    Java skips them, except the temporary files killed writers leave
    (``.<name>.<random>.tmp``)."""
    cutoff = _to_ms(older_than)
    refs = referenced_files(table)
    check_unambiguous(table.metadata_store, table.filesystem, table.metadata_location, table.metadata)
    roots = _orphan_roots(table, location)
    orphans = []
    for root in roots:
        for path, mtime in _walk_files(table.locations, root):
            path = _norm(path)
            rel = posixpath.relpath(path, root)
            hidden = [part for part in rel.split("/") if part.startswith((".", "_"))]
            if hidden and not (len(hidden) == 1 and _TEMP_NAME.match(posixpath.basename(path))):
                continue
            if path in refs:
                continue
            if mtime is None or mtime >= cutoff:
                continue
            orphans.append(path)
    orphans.sort()
    deletions = Deletions(table.locations, f"remove_orphan_files of {table.pin.location}")
    if not dry_run:
        for path in orphans:
            deletions.path(path)
        deletions.warn()
    return OrphanFilesResult(orphans, not dry_run, cutoff, len(refs), skipped_files=deletions.skipped_locations)


def _orphan_roots(table: Any, location: str | None) -> list[str]:
    """The directories remove_orphan_files walks: the table's pinned roots (never the
    ``location`` of a newer version), or ``location`` if it lies inside them."""
    roots = sorted({_norm(r) for r in table.locations.fs_roots()}, key=len)
    if location is None:
        return [r for i, r in enumerate(roots) if under_root(r, roots[:i]) is None]  # nested ones are walked once
    location = os.fspath(location)
    if _SCHEME.match(location) and len(_SCHEME.match(location).group(1)) > 1:
        path = _norm(table.locations.delete_path(location, what="location"))
    else:
        local = isinstance(table.filesystem, pafs.LocalFileSystem)
        path = normalize_path(os.path.abspath(location) if local else location)
    if under_root(path, roots) is None:
        raise PathOutsideTableError(
            f"remove_orphan_files: location {location} lies outside table {table.pin.location} (refused)",
            location=location, table_location=table.pin.location,
        )
    return [path]


def _walk_files(locations: Any, root: str) -> Iterator[tuple[str, int | None]]:
    """(path, mtime in ms) of every file below ``root`` (a directory under the table's
    pinned roots).  On a local filesystem the pinned root it lies under is opened as the
    pin resolved it (``Locations.open_root``: refused if it was swapped for a link or
    replaced since the table was loaded) and the walk goes down from there by descriptor,
    neither following nor listing symbolic links (pyarrow's recursive listing follows
    them): a link to a directory elsewhere cannot bring that directory's files into the
    walk, and a link is never taken for an orphan."""
    fs = locations.filesystem
    if not isinstance(fs, pafs.LocalFileSystem):
        for info in fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True)):
            if info.type == pafs.FileType.File:
                yield info.path, (info.mtime_ns // 1_000_000 if info.mtime_ns is not None else None)
        return
    pinned = under_root(root, [_norm(r) for r in locations.fs_roots()])
    if pinned is None:
        raise PathOutsideTableError(f"{root} lies outside the table's roots (not listed)", location=root)
    try:
        root_fd = locations.open_root(pinned)
    except (FileNotFoundError, NotADirectoryError):
        return
    try:
        if root != pinned:
            rel = root[len(pinned.rstrip("/")) + 1 :]
            fd = root_fd
            try:
                for part in rel.split("/"):
                    next_fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                    if fd != root_fd:
                        os.close(fd)
                    fd = next_fd
            except OSError:
                if fd != root_fd:
                    os.close(fd)
                return  # missing, or reached through a link: nothing of the table's below it
            walk_fd = fd
        else:
            walk_fd = root_fd
        try:
            for path, mtime_ns in walk_files_beneath(root, walk_fd):
                yield path, mtime_ns // 1_000_000
        finally:
            if walk_fd != root_fd:
                os.close(walk_fd)
    finally:
        os.close(root_fd)


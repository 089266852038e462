"""The SQL catalog's stored procedures: ``CALL cat.system.<name>(...)`` (Spark 4's own
``CALL``; the JVM half is ``org.icecrypt.spark.catalog.PyProcedure``).

Iceberg's procedures keep Iceberg's names, argument names and output columns, so the
statements written for Iceberg's Spark runtime run here; icecrypt adds its key procedures
(``rotate_keys``, ``rekey``, ``verify``).  Each one is a call of icecrypt's table API on
the table ``table`` names in this catalog; nothing of the table logic lives here.

An argument of Iceberg's that the table API cannot honour is part of the signature all the
same, so that naming it is refused by this module, saying which procedure and argument,
rather than by Spark as an unknown name (or, worse, ignored).  Every refusal and failure is
one error naming the procedure, the table and the reason; the table API commits all or
nothing, so a failed call leaves the table as it was.

Bridge methods: ``procedure`` (a procedure's description: parameters as Spark DDL types
with SQL defaults, the output schema as DDL; null for an unknown name),
``list_procedures``, ``call_procedure`` (the arguments by name, JSON; answers the output
rows and, when the table changed, its identifier: the JVM then refreshes Spark's cached
relations of it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from icecrypt.spark._sql import alter as _alter
from icecrypt.spark._sql import catalogs as _catalogs
from icecrypt.spark._sql.catalogs import parse_identifier
from icecrypt.spark._sql.protocol import catalog_of, method

__all__ = ["NOT_OFFERED", "PROCEDURES", "ProcedureError"]

_DAY_MS = 24 * 3600 * 1000


class ProcedureError(Exception):
    """A procedure's refusal or failure, with the bridge's error kind kept (the message
    already names the procedure, the table and the reason)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.bridge_kind = kind


@dataclass(frozen=True)
class Param:
    name: str
    type: str  # Spark DDL
    default: str | None = "NULL"  # a SQL expression; None: required
    supported: bool = True  # False: Iceberg's argument, refused when given
    comment: str | None = None


@dataclass(frozen=True)
class Procedure:
    name: str
    description: str
    params: tuple[Param, ...]
    output: str  # Spark DDL of the output columns
    run: Callable[[Any, dict[str, Any]], list[list[Any]]]  # (the table, the arguments) -> rows
    changes: bool = True  # may commit: Spark's cached relations are refreshed
    new_table: bool = False  # ``table`` names a table to add: run gets a NewTable
    session: bool = False  # works in the calling Spark session: run gets a Session


PROCEDURES: dict[str, Procedure] = {}

_TABLE = Param("table", "string", None, comment="the table of this catalog: db.t")


def _procedure(name: str, description: str, params: tuple[Param, ...], output: str, *, changes: bool = True,
               new_table: bool = False, session: bool = False):
    def register(run: Callable[[Any, dict[str, Any]], list[list[Any]]]) -> Callable[..., Any]:
        PROCEDURES[name] = Procedure(name, description, (_TABLE, *params), output, run, changes, new_table, session)
        return run

    return register


@dataclass(frozen=True)
class NewTable:
    """What a ``new_table`` procedure runs with: the catalog, its name, the identifier
    ``table`` gives the table to add, and (a ``session`` procedure) the Spark session."""

    catalog: Any
    catalog_name: str
    identifier: tuple[str, ...]
    spark: Any = None


@dataclass(frozen=True)
class Session:
    """What a ``session`` procedure runs with: the Spark session that called it, the
    catalog's name, and the table (its identifier and the loaded table)."""

    spark: Any
    catalog_name: str
    identifier: tuple[str, ...]
    table: Any


def _refused(message: str) -> ProcedureError:
    return ProcedureError(message, "unsupported")


def _ms(micros: int | None) -> int | None:
    return None if micros is None else micros // 1000


def _now_ms() -> int:
    return int(time.time() * 1000)


# --- snapshots ------------------------------------------------------------------------------


@_procedure("rollback_to_snapshot", "Roll the table's current snapshot back to one of its ancestors.",
            (Param("snapshot_id", "bigint", None),),
            "previous_snapshot_id bigint, current_snapshot_id bigint")
def _rollback_to_snapshot(table: Any, args: dict[str, Any]) -> list[list[Any]]:
    previous = table.current_snapshot_id
    with table.manage_snapshots() as manage:
        manage.rollback_to_snapshot(args["snapshot_id"])
    return [[previous, table.refresh().current_snapshot_id]]


@_procedure("rollback_to_timestamp",
            "Roll the table back to the newest ancestor of its current snapshot committed before a time.",
            (Param("timestamp", "timestamp", None),),
            "previous_snapshot_id bigint, current_snapshot_id bigint")
def _rollback_to_timestamp(table: Any, args: dict[str, Any]) -> list[list[Any]]:
    previous = table.current_snapshot_id
    with table.manage_snapshots() as manage:
        manage.rollback_to_timestamp(_ms(args["timestamp"]))
    return [[previous, table.refresh().current_snapshot_id]]


@_procedure("set_current_snapshot", "Make a snapshot (by id, or a ref's head) the table's current one.",
            (Param("snapshot_id", "bigint"), Param("ref", "string")),
            "previous_snapshot_id bigint, current_snapshot_id bigint")
def _set_current_snapshot(table: Any, args: dict[str, Any]) -> list[list[Any]]:
    if (args["snapshot_id"] is None) == (args["ref"] is None):
        raise ValueError("either snapshot_id or ref must be given, not both")
    previous = table.current_snapshot_id
    with table.manage_snapshots() as manage:
        manage.set_current_snapshot(args["snapshot_id"] if args["ref"] is None else args["ref"])
    return [[previous, table.refresh().current_snapshot_id]]


@_procedure("cherrypick_snapshot",
            "Publish a snapshot (a staged write-audit-publish one, or another branch's) on main.",
            (Param("snapshot_id", "bigint", None),),
            "source_snapshot_id bigint, current_snapshot_id bigint")
def _cherrypick_snapshot(table: Any, args: dict[str, Any]) -> list[list[Any]]:
    with table.manage_snapshots() as manage:
        manage.cherry_pick(args["snapshot_id"])
    return [[args["snapshot_id"], table.refresh().current_snapshot_id]]


@_procedure("publish_changes", "Publish the snapshot a write-audit-publish write staged with a wap.id on main.",
            (Param("wap_id", "string", None),),
            "source_snapshot_id bigint, current_snapshot_id bigint")
def _publish_changes(table: Any, args: dict[str, Any]) -> list[list[Any]]:
    from icecrypt.table.ops.write import WAP_ID

    wap_id = args["wap_id"]
    staged = [s.snapshot_id for s in table.snapshots() if (s.summary or {}).get(WAP_ID) == wap_id]
    if not staged:
        raise ValueError(f"no snapshot was staged with wap.id {wap_id!r}")
    if len(staged) > 1:
        raise ValueError(f"{len(staged)} snapshots were staged with wap.id {wap_id!r} ({', '.join(map(str, staged))}): "
                         "publish one with cherrypick_snapshot")
    with table.manage_snapshots() as manage:
        manage.cherry_pick(staged[0])
    return [[staged[0], table.refresh().current_snapshot_id]]


@_procedure("ancestors_of", "The snapshots a snapshot (default: the current one) descends from, newest first.",
            (Param("snapshot_id", "bigint"),),
            "snapshot_id bigint, timestamp bigint", changes=False)
def _ancestors_of(table: Any, args: dict[str, Any]) -> list[list[Any]]:
    from icecrypt.table.model.changes import ancestors

    by_id = {s["snapshot-id"]: s for s in table.metadata.get("snapshots") or ()}
    start = args["snapshot_id"] if args["snapshot_id"] is not None else table.current_snapshot_id
    if start is not None and start not in by_id:
        raise ValueError(f"no snapshot {start}")
    return [[s["snapshot-id"], s["timestamp-ms"]] for s in ancestors(by_id, start)]


@_procedure("fast_forward", "Move a branch to the head of a ref that descends from it.",
            (Param("branch", "string", None), Param("to", "string", None)),
            "branch_updated string, previous_ref bigint, updated_ref bigint")
def _fast_forward(table: Any, args: dict[str, Any]) -> list[list[Any]]:
    branch = args["branch"]

    def head() -> int | None:
        ref = (table.metadata.get("refs") or {}).get(branch)
        return None if ref is None else ref["snapshot-id"]

    previous = head()
    with table.manage_snapshots() as manage:
        manage.fast_forward(branch, args["to"])
    table.refresh()
    return [[branch, previous, head()]]


# --- maintenance ----------------------------------------------------------------------------


def _expirable_files(table: Any) -> dict[str, set[str]]:
    """What snapshot expiry may delete, by Iceberg's count of it: every file the table's
    snapshots reach (recorded locations)."""
    metadata = table.metadata
    out: dict[str, set[str]] = {name: set() for name in ("data", "position", "equality", "manifest", "list", "stats")}
    for snapshot in table.snapshots():
        out["list"].add(snapshot.manifest_list)
    if out["list"]:
        out["manifest"] |= set(table.inspect.all_manifests().column("path").to_pylist())
        files = table.inspect.all_files().select(["content", "file_path"]).to_pylist()
        kinds = {0: "data", 1: "position", 2: "equality"}
        for row in files:
            out[kinds.get(row["content"], "data")].add(row["file_path"])
    for name in ("statistics", "partition-statistics"):
        for stat in metadata.get(name) or ():
            if stat.get("statistics-path"):
                out["stats"].add(stat["statistics-path"])
    return out


def _gone(table: Any, location: str) -> bool:
    import pyarrow.fs as pafs

    try:
        path = table.fs_path(location)
    except ValueError:
        return False  # not the table's to delete
    return table.filesystem.get_file_info(path).type == pafs.FileType.NotFound


@_procedure("expire_snapshots",
            "Remove snapshots older than a time (as the refs' retention allows) and the files only they needed.",
            (Param("older_than", "timestamp"), Param("retain_last", "int"),
             Param("max_concurrent_deletes", "int", supported=False), Param("stream_results", "boolean", supported=False),
             Param("snapshot_ids", "array<bigint>"),
             Param("clean_expired_metadata", "boolean", supported=False)),
            "deleted_data_files_count bigint, deleted_position_delete_files_count bigint, "
            "deleted_equality_delete_files_count bigint, deleted_manifest_files_count bigint, "
            "deleted_manifest_lists_count bigint, deleted_statistics_files_count bigint")
def _expire_snapshots(table: Any, args: dict[str, Any]) -> list[list[Any]]:
    older_than = _ms(args["older_than"])
    if older_than is None:  # Iceberg's default: the table's history.expire.max-snapshot-age-ms, 5 days
        max_age = table.properties.get("history.expire.max-snapshot-age-ms")
        older_than = _now_ms() - (int(max_age) if max_age is not None else 5 * _DAY_MS)
    # the counts are what the table reached before and its storage no longer holds
    before = _expirable_files(table)
    removed = table.expire_snapshots(older_than, retain_last=args["retain_last"],
                                     snapshot_ids=args["snapshot_ids"] or ())
    if not removed:
        return [[0, 0, 0, 0, 0, 0]]
    counts = {kind: sum(1 for location in paths if _gone(table, location)) for kind, paths in before.items()}
    return [[counts["data"], counts["position"], counts["equality"], counts["manifest"], counts["list"],
             counts["stats"]]]


@_procedure("remove_orphan_files",
            "Delete (or with dry_run list) the files under the table's location that no metadata references.",
            (Param("older_than", "timestamp"), Param("location", "string"), Param("dry_run", "boolean", "false"),
             Param("max_concurrent_deletes", "int", supported=False), Param("file_list_view", "string", supported=False),
             Param("equal_schemes", "map<string,string>", supported=False),
             Param("equal_authorities", "map<string,string>", supported=False),
             Param("prefix_mismatch_mode", "string", supported=False),
             Param("prefix_listing", "boolean", supported=False)),
            "orphan_file_location string", changes=False)
def _remove_orphan_files(table: Any, args: dict[str, Any]) -> list[list[Any]]:
    older_than = _ms(args["older_than"])
    # As Iceberg's procedure: a file younger than a day may be a running writer's, not
    # committed yet; deleting it would lose that commit's data.
    if older_than is not None and _now_ms() - older_than < _DAY_MS:
        raise ValueError("older_than must be at least 24 hours ago: a younger file may belong to a write "
                         "still running (the table API's remove_orphan_files takes any time)")
    result = table.remove_orphan_files(older_than, bool(args["dry_run"]), location=args["location"])
    return [[path] for path in result.orphan_files]


_REWRITE_OPTIONS = frozenset({
    "min-file-size-bytes", "max-file-size-bytes", "min-input-files", "delete-file-threshold",
    "delete-ratio-threshold", "rewrite-all", "max-file-group-size-bytes", "target-file-size-bytes",
    "var-length-contribution", "max-output-size",  # (of a z-order)
})  # fmt: skip


@_procedure("rewrite_data_files",
            "Compact (bin-pack, or sort) the table's data files, applying its deletes, under fresh keys.",
            (Param("strategy", "string"), Param("sort_order", "string"), Param("options", "map<string,string>"),
             Param("where", "string")),
            "rewritten_data_files_count int, added_data_files_count int, rewritten_bytes_count bigint, "
            "failed_data_files_count int, removed_delete_files_count int")
def _rewrite_data_files(table: Any, args: dict[str, Any]) -> list[list[Any]]:
    options = dict(args["options"] or {})
    unknown = sorted(set(options) - _REWRITE_OPTIONS)
    if unknown:
        raise _refused(f"option {', '.join(unknown)} is not supported (supported: {', '.join(sorted(_REWRITE_OPTIONS))})")
    target = options.pop("target-file-size-bytes", None)
    strategy = args["strategy"]
    if strategy is not None and strategy.strip().lower() not in ("binpack", "sort"):
        raise ValueError(f"strategy {strategy!r}: only binpack or sort is supported")
    if strategy is not None and strategy.strip().lower() == "binpack" and args["sort_order"] is not None:
        raise ValueError("sort_order is for strategy sort, not binpack")
    if strategy is None and args["sort_order"] is not None:
        strategy = "sort"
    result = table.rewrite_data_files(None if target is None else int(target), args["where"], options or None,
                                      strategy=None if strategy is None else strategy.strip().lower(),
                                      sort_order=args["sort_order"])
    return [[result.rewritten_data_files, result.added_data_files, result.rewritten_bytes, 0,
             result.removed_delete_files]]


@_procedure("rewrite_position_delete_files",
            "Rewrite v2-format position-delete files into deletion vectors (the table's rows unchanged).",
            (Param("options", "map<string,string>"), Param("where", "string")),
            "rewritten_delete_files_count int, added_delete_files_count int, rewritten_bytes_count bigint, "
            "added_bytes_count bigint")
def _rewrite_position_delete_files(table: Any, args: dict[str, Any]) -> list[list[Any]]:
    result = table.rewrite_position_delete_files(args["where"], dict(args["options"] or {}))
    return [[result.rewritten_delete_files, result.added_delete_files, result.rewritten_bytes, result.added_bytes]]


@_procedure("rewrite_manifests", "Regroup the current snapshot's manifests by partition, under fresh keys.",
            (Param("use_caching", "boolean", supported=False), Param("spec_id", "int", supported=False)),
            "rewritten_manifests_count int, added_manifests_count int")
def _rewrite_manifests(table: Any, args: dict[str, Any]) -> list[list[Any]]:
    result = table.rewrite_manifests()
    return [[result.rewritten_manifests, result.added_manifests]]


# --- icecrypt's keys ------------------------------------------------------------------------


@_procedure("rotate_keys",
            "Commit a new KEK and/or re-wrap every KEK under another KMS master key (no data file changes).",
            (Param("new_kek", "boolean", "true"), Param("new_master_key_id", "string")),
            "table_key_id string, kek_id string, rewrapped_kek_ids array<string>")
def _rotate_keys(table: Any, args: dict[str, Any]) -> list[list[Any]]:
    summary = table.rotate_keys(new_kek=bool(args["new_kek"]), new_master_key_id=args["new_master_key_id"])
    return [[summary.get("table_key_id"), summary.get("kek_id"), list(summary.get("rewrapped_kek_ids") or [])]]


@_procedure("rekey",
            "After a key leak: re-encrypt what the leaked keys protect under fresh keys and retire them.",
            (Param("files", "array<string>"), Param("snapshot_ids", "array<bigint>"), Param("kek_ids", "array<string>"),
             Param("everything", "boolean", "false"), Param("new_master_key_id", "string"),
             Param("expire", "boolean", "false"), Param("target_file_size", "bigint")),
            "table_key_id string, new_kek_id string, retired_kek_ids array<string>, "
            "rewritten_data_files_count int, added_data_files_count int, rewritten_manifests_count int, "
            "expired_snapshots_count int, removed_metadata_files_count int")
def _rekey(table: Any, args: dict[str, Any]) -> list[list[Any]]:
    result = table.rekey(files=args["files"] or (), snapshot_ids=args["snapshot_ids"] or (),
                         kek_ids=args["kek_ids"] or (), everything=bool(args["everything"]),
                         new_master_key_id=args["new_master_key_id"], expire=bool(args["expire"]),
                         target_file_size=args["target_file_size"])
    rewrite, manifests = result.rewrite, result.manifests
    return [[result.table_key_id, result.new_kek_id, sorted(result.retired_kek_ids),
             rewrite.rewritten_data_files if rewrite else 0, rewrite.added_data_files if rewrite else 0,
             manifests.rewritten_manifests if manifests else 0, len(result.expired_snapshot_ids),
             len(result.removed_metadata_files)]]


@_procedure("verify", "Read and authenticate every file the table's snapshots (or one) reach.",
            (Param("snapshot_id", "bigint"),),
            "ok boolean, snapshots_checked int, files_checked bigint, bytes_checked bigint, rows_checked bigint, "
            "problems array<string>", changes=False)
def _verify(table: Any, args: dict[str, Any]) -> list[list[Any]]:
    report = table.verify(args["snapshot_id"])
    return [[report.ok, len(report.snapshots), report.files_checked, report.bytes_checked, report.rows_checked,
             [str(p) for p in report.problems]]]


# --- tables ----------------------------------------------------------------------------------


@_procedure("register_table", "Add an existing table to this catalog by its metadata file; the catalog records "
            "the file's digest, key id and UUID, as for a table it created.",
            (Param("metadata_file", "string", None, comment="the table's current metadata.json"),
             Param("table_key_id", "string", comment="icecrypt's: the KMS master key id the file must name "
                   "(refused otherwise)")),
            "current_snapshot_id bigint, total_records_count bigint, total_data_files_count bigint", new_table=True)
def _register_table(target: NewTable, args: dict[str, Any]) -> list[list[Any]]:
    catalog, identifier = target.catalog, target.identifier
    location = args["metadata_file"]
    if not isinstance(location, str) or not location.strip():
        raise ValueError("argument metadata_file: the location of a metadata.json file is required")
    if not hasattr(catalog, "register_table"):
        raise _refused("a catalog of path tables has no register (a path table is its directory)")
    table = catalog.register_table(identifier, location.strip(), table_key_id=args.get("table_key_id"))
    current = table.current_snapshot()
    if current is None:
        return [[None, None, None]]
    summary = current.summary

    def total(name: str) -> int | None:
        try:
            return int(summary[name])
        except (KeyError, TypeError, ValueError):
            return None

    return [[current.snapshot_id, total("total-records"), total("total-data-files")]]


@_procedure("add_files", "Add the Parquet files of a directory or of a table of Spark's session catalog to this "
            "plaintext table as they are, in one append (Iceberg's add_files; the files must lie under the table's "
            "directories).",
            (Param("source_table", "string", None, comment="`parquet`.`<directory>`, or a table of Spark's session "
                   "catalog (db.t)"),
             Param("partition_filter", "map<string,string>", comment="only the source's partitions with these "
                   "values"),
             Param("check_duplicate_files", "boolean", "true"),
             Param("parallelism", "int", comment="accepted; the footers are read on the driver")),
            "added_files_count bigint, changed_partition_count bigint", session=True)
def _add_files(call: Session, args: dict[str, Any]) -> list[list[Any]]:
    from icecrypt.spark._sql.imports import source_files

    table = call.table
    if table.encrypted:  # before the source is listed
        raise _refused("the table is encrypted, and add_files adds files as they are, in plaintext; an encrypted "
                       "table holds sealed files only (INSERT INTO ... SELECT writes the rows encrypted)")
    files = source_files(call.spark, table, args["source_table"], args["partition_filter"])
    result = table.add_files([f.location for f in files], check_duplicate_files=bool(args["check_duplicate_files"]),
                             partition_values={f.location: f.partition for f in files if f.partition})
    return [[result.added_files, result.changed_partitions if table.spec.fields else None]]


@_procedure("migrate", "Make a Parquet table of Spark's session catalog an Iceberg table of this catalog, with the "
            "same name, at the same location, holding the same files (not rewritten; the table is plaintext).",
            (Param("properties", "map<string,string>", comment="the new table's properties"),
             Param("drop_backup", "boolean", "false", comment="drop the source table from Spark's session catalog "
                   "(an external table only: its files stay)"),
             Param("backup_table_name", "string", comment="rename the source table in Spark's session catalog to "
                   "this (an external table only)"),
             Param("parallelism", "int", comment="accepted; the footers are read on the driver")),
            "migrated_files_count bigint", new_table=True, session=True)
def _migrate(target: NewTable, args: dict[str, Any]) -> list[list[Any]]:
    from icecrypt.spark._sql.imports import migrate

    return [[migrate(target.spark, target.catalog, target.identifier, dict(args["properties"] or {}),
                     drop_backup=bool(args["drop_backup"]), backup_name=args["backup_table_name"])]]


# --- Iceberg's ALTER TABLE extensions ---------------------------------------------------------


@_procedure("alter_table", "Run one of Iceberg's ALTER TABLE SQL extensions (partition fields, write order and "
            "distribution, identifier fields, branches and tags); the session extension sends those statements here.",
            (Param("clause", "string", None, comment="the statement after ALTER TABLE <table>, e.g. "
                   "'ADD PARTITION FIELD days(ts)'"),),
            "")
def _alter_table(table: Any, args: dict[str, Any]) -> list[list[Any]]:
    _alter.run(table, args["clause"])
    return []


@_procedure("create_changelog_view",
            "Create a temporary view of the table's changelog (db.t.changes): carry-over rows removed, or net "
            "changes, or with update images by identifier columns.",
            (Param("changelog_view", "string", comment="the view's name (default: `<table>_changes`)"),
             Param("options", "map<string,string>", comment="the changelog's range: start-snapshot-id, "
                   "end-snapshot-id, start-timestamp, end-timestamp"),
             Param("compute_updates", "boolean"), Param("identifier_columns", "array<string>"),
             Param("net_changes", "boolean")),
            "changelog_view string", changes=False, session=True)
def _create_changelog_view(call: Session, args: dict[str, Any]) -> list[list[Any]]:
    from icecrypt.spark._sql.changelog import create_view

    return [[create_view(call.spark, call.catalog_name, call.identifier, call.table, args)]]


# --- the table argument ---------------------------------------------------------------------

def _table_of(catalog_name: str, catalog: Any, text: Any) -> tuple[tuple[str, ...], Any]:
    """(identifier, table) of the ``table`` argument: 'db.t', or 'cat.db.t' naming this
    catalog; never a branch, tag, snapshot or metadata table of one."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("argument table: a table identifier ('db.t') is required")
    ident = parse_identifier(text)
    if len(ident) > 2 and ident[0] == catalog_name and not _catalogs._exists(catalog, ident):
        ident = ident[1:]
    selection = _catalogs.resolve(catalog, ident)
    if selection != _catalogs.Selection(ident):
        raise ValueError(f"{text} names a branch, tag, snapshot or metadata table of table "
                         f"{'.'.join(selection.identifier)}; give the table itself")
    return ident, catalog.load_table(ident)


def _new_table_of(catalog_name: str, text: Any) -> tuple[str, ...]:
    """The identifier the ``table`` argument gives a table to add ('db.t' or 'cat.db.t')."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("argument table: a table identifier ('db.t') is required")
    ident = parse_identifier(text)
    return ident[1:] if len(ident) > 2 and ident[0] == catalog_name else ident


# --- bridge methods -------------------------------------------------------------------------


def _find(name: Any) -> Procedure | None:
    return PROCEDURES.get(str(name).lower())


#: Iceberg's procedures icecrypt does not offer: why, and Iceberg's parameters (so that a
#: CALL written for Iceberg binds, and is then refused saying why, rather than failing in
#: Spark as an unknown routine); SHOW PROCEDURES does not list them
NOT_OFFERED: dict[str, tuple[str, tuple[Param, ...]]] = {
    "snapshot": (
        "its table would refer to the source's files outside its own location, and an icecrypt table reads no "
        "file outside its directories (migrate creates the table at the source's location; CREATE TABLE ... AS "
        "SELECT copies the rows, encrypted)",
        (Param("source_table", "string", None), Param("table", "string", None), Param("location", "string"),
         Param("properties", "map<string,string>"), Param("parallelism", "int"))),
    "compute_table_stats": (
        "icecrypt writes no Puffin statistics files (the column metrics are in the manifests)",
        (_TABLE, Param("snapshot_id", "bigint"), Param("columns", "array<string>"))),
    "compute_partition_stats": (
        "icecrypt writes no partition statistics files", (_TABLE, Param("snapshot_id", "bigint"))),
    "rewrite_table_path": (
        "icecrypt does not rewrite a table's paths (register a copied table with register_table)",
        (_TABLE, Param("source_prefix", "string", None), Param("target_prefix", "string", None),
         Param("start_version", "string"), Param("end_version", "string"), Param("staging_location", "string"))),
}


def _not_offered(catalog: str, name: Any) -> ProcedureError:
    name = str(name).lower()
    return _refused(f"catalog {catalog!r}: Iceberg's procedure system.{name} is not offered: {NOT_OFFERED[name][0]}")


@method("procedure")
def _describe(bridge: Any, request: dict[str, Any]) -> Any:
    procedure = _find(request["name"])
    if procedure is None:
        offered = NOT_OFFERED.get(str(request["name"]).lower())
        if offered is None:
            return None
        return {"name": str(request["name"]).lower(), "description": f"not offered by icecrypt: {offered[0]}",
                "parameters": [{"name": p.name, "type": p.type, "default": p.default, "comment": None}
                               for p in offered[1]],
                "output": ""}
    return {
        "name": procedure.name,
        "description": procedure.description,
        "parameters": [{"name": p.name, "type": p.type, "default": p.default,
                        "comment": p.comment if p.supported else "not supported by icecrypt (refused when given)"}
                       for p in procedure.params],
        "output": procedure.output,
    }


@method("list_procedures")
def _list(bridge: Any, request: dict[str, Any]) -> Any:
    return sorted(PROCEDURES)


@method("call_procedure")
def _call(bridge: Any, request: dict[str, Any]) -> Any:
    from icecrypt.spark._sql.answers import kind_of, message_of

    name, catalog = catalog_of(request)
    procedure = _find(request["name"])
    if procedure is None and str(request["name"]).lower() in NOT_OFFERED:
        raise _not_offered(name, request["name"])
    if procedure is None:
        raise ValueError(f"catalog {name!r}: no procedure system.{request['name']}")
    args = dict(request.get("args") or {})
    call = f"CALL {name}.system.{procedure.name}"
    where = call
    try:
        if procedure.new_table:
            ident = _new_table_of(name, args.get("table"))
            where = f"{call}: {_catalogs.describe_identifier(catalog, ident)}"
            spark = None
            if procedure.session:
                from pyspark.sql import SparkSession

                spark = SparkSession.getActiveSession() or bridge.spark
            return {"rows": procedure.run(NewTable(catalog, name, ident, spark), args), "refresh": list(ident)}
        ident, table = _table_of(name, catalog, args.get("table"))
        where = f"{call}: {_catalogs.describe_identifier(catalog, ident)}"
        for param in procedure.params:
            if not param.supported and args.get(param.name) is not None:
                raise _refused(f"argument {param.name} is not supported by icecrypt's {procedure.name} "
                               "(nothing was done)")
        before = table.metadata_location
        if procedure.session:
            from pyspark.sql import SparkSession

            spark = SparkSession.getActiveSession() or bridge.spark
            rows = procedure.run(Session(spark, name, ident, table), args)
        else:
            rows = procedure.run(table, args)
    except ProcedureError as exc:
        raise ProcedureError(f"{where}: {exc}", exc.bridge_kind) from None
    except Exception as exc:  # one error naming the procedure and table, of the failure's kind
        raise ProcedureError(f"{where}: {message_of(exc)}", kind_of(exc)) from exc
    changed = procedure.changes and catalog.load_table(ident).metadata_location != before
    return {"rows": rows, "refresh": list(ident) if changed else None}

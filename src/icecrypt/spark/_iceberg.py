"""``icecrypt.iceberg``: Spark reads and writes of encrypted Iceberg tables.

::

    kms = {"encryption.kms-type": "local", "encryption.kms.local.keystore": "/secure/keystore.json"}
    df = (spark.read.format("icecrypt.iceberg").options(**kms)
          .option("snapshot-id", "4487484300036148224")        # time travel (optional; or as-of-timestamp,
                                                                #   branch, tag)
          .option("columns", "id,amount")                       # projection (optional)
          .option("filter", "amount > 100 and category = 'a'")  # Iceberg row filter (optional)
          .load("/warehouse/db/events"))                       # table directory or metadata.json
    df.write.format("icecrypt.iceberg").options(**kms).mode("append").save("/warehouse/db/events")

Reading — where each step runs (PySpark 4.x Python Data Source API):

* ``DataSource.schema()`` (a Python worker on the driver, at ``load()``): the table's
  ``metadata.json`` only.  The schema of the snapshot read (time travel reads with the
  snapshot's schema, as Iceberg does) becomes the Spark schema, field ids kept as
  ``parquet.field.id`` metadata.  Time travel, as Iceberg's Spark reads: at most one of
  ``snapshot-id``, ``as-of-timestamp`` (ms since the epoch: the snapshot current then),
  ``tag`` (all three with the snapshot's schema) and ``branch`` (with the current schema).
* ``reader()`` and ``partitions()`` (the planning worker on the driver): the reader is
  pickled for the tasks *before* ``partitions()`` is called, so planning happens there:
  KMS → KEK → manifest list → manifests → one
  :class:`TaskPartition` per :class:`~icecrypt.table.FileScanTask` (large files split at
  row groups or Avro blocks, option ``split-size``).
* ``read()`` (executors): :func:`icecrypt.table.read_task` decrypts and authenticates the
  task's data and delete files with the key metadata the task carries.  Executors never
  call the KMS.

Incremental reads, as Iceberg's Spark: ``start-snapshot-id`` (exclusive) and
``end-snapshot-id`` (inclusive, default the current snapshot) read the rows the ``append``
snapshots between them added (other operations skipped); ``changelog=true`` reads the
changelog of the range instead (every snapshot's inserted and deleted rows, with
``_change_type``, ``_change_ordinal`` and ``_commit_snapshot_id``; Iceberg's
``<table>.changes``), from the first snapshot when no start is given.  ``start-timestamp`` /
``end-timestamp`` (ms since the epoch) give the range by moments instead.  They exclude the
time-travel options.

Tables in a catalog (``icecrypt.catalog``): option ``catalog`` names the catalog and the
options ``catalog.<property>`` configure it (``catalog.uri``, ``catalog.warehouse``,
``catalog.type``, ...); ``load()``/``save()`` then take an identifier (``db.table``).
Planning and the commit run on the driver and go through the catalog (the commit swaps the
catalog's metadata location, so concurrent writers are safe); write tasks read the
metadata file the job started from and need no catalog access.

Metadata tables: option ``metadata-table`` (``snapshots``, ``history``, ``refs``,
``metadata_log_entries``, ``manifests``, ``all_manifests``, ``entries``, ``all_entries``,
``files``, ``data_files``, ``delete_files``, ``partitions``, ``position_deletes``, ``all_files``, ...) reads that table of ``table.inspect``
instead of the rows, computed on the driver (``snapshot-id`` selects the snapshot;
``columns`` projects; ``filter`` limits ``partitions``).

Keys travel as in Iceberg Java: inside the tasks (the pickled partitions), never in the
options (KMS properties only), plans, ``repr``\\ s or messages.

Projection: PySpark 4.3 passes Python data sources the full schema (no column pruning),
so projection is the ``columns`` option (or a user schema naming fewer columns).

Filters: the ``filter`` option is an Iceberg row filter (PyIceberg's syntax; decimal
literals with the column's scale), applied exactly by the scan: it prunes manifests and
files (partition values, column statistics), then rows.  Spark's own filters
(``df.where(...)``) are evaluated by Spark after the scan and are not pushed: PySpark 4.3
offers ``DataSourceReader.pushFilters`` (when ``spark.sql.python.filterPushdown.enabled``
is true), but its JVM side keeps the read plan of a pushdown on the relation, which every
DataFrame derived from the same ``load()`` shares, so a later query without pushable
filters (``df.count()`` after ``df.where(...).count()``) would read the filtered plan and
silently lose rows (measured with 4.3.0; Spark's master branch scopes the plan to the
scan).  This reader therefore implements no ``pushFilters``; with the setting on, Spark's
default (no filter pushed) applies and results stay right.

Writing: ``writer()`` (driver) loads the table — or, with option ``table-key-id``, creates
a missing one, encrypted under that KMS master key — and checks the DataFrame's columns
against the table schema.  Each task writes encrypted data files with
:func:`icecrypt.table.ops.write.write_files` (a fresh DEK per file, no commit) and returns
their manifest records; ``commit()`` makes one snapshot of all of them (``append_files``
or ``overwrite_files``); ``abort()`` deletes the tasks' files (and a table this job
created that is still empty).  An overwrite with option ``overwrite-filter`` (an Iceberg
row filter: the rows it matches are replaced) or ``overwrite-mode=dynamic`` (the
partitions the DataFrame has rows in are replaced) commits through the row-level
committer instead (:mod:`icecrypt.table.ops.rowlevel`: ``overwrite_files_by_filter``,
``dynamic_partition_overwrite_files``), validated from the snapshot the job started
from.  A plaintext table is read or written only with option ``encryption=none``.

Streaming: ``spark.readStream`` (the rows appended by new snapshots) and ``df.writeStream``
(one snapshot per epoch, exactly once) are :mod:`icecrypt.spark._stream`.
"""

from __future__ import annotations

import contextlib
import json
import posixpath
import uuid
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
from pyiceberg.expressions import BooleanExpression
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from icecrypt.errors import IcecryptError
from icecrypt.keys import ENCRYPTION_TABLE_KEY
from icecrypt.spark import _keys
from icecrypt.spark._common import (
    OPT_BATCH_SIZE,
    OPT_PATH,
    columns_option,
    encrypted,
    file_error,
    positive_int,
    resolve,
    split_size,
)
from icecrypt.spark._options import NAME, OPT_NATIVE
from icecrypt.spark._schema import Projection
from icecrypt.table import (
    ChangelogScan,
    ChangelogTask,
    EncryptedTable,
    FileScanTask,
    Locations,
    PlaintextFileError,
    TableScan,
    read_changelog_task,
    read_task,
)
from icecrypt.table.files.io import PathOutsideTableWarning
from icecrypt.table.commit.pin import trusted_pin
from icecrypt.table.ops.rowlevel import SERIALIZABLE, SNAPSHOT
from icecrypt.table.model.changes import MAIN_BRANCH
from icecrypt.table.ops.write import _bind_filter, _head_id
from icecrypt.table.read.scan import parse_row_filter
from icecrypt.table.read.travel import resolve_read

__all__ = ["IcebergReader", "IcebergWriter", "MetadataTableReader", "TaskDataFiles", "TaskPartition"]

# --- options (Spark lower-cases their names) ---------------------------------------------
#: reads: the snapshot to read (time travel); default the current one
OPT_SNAPSHOT_ID = "snapshot-id"
#: reads: the snapshot current at this moment (ms since the epoch), by the snapshot log
OPT_AS_OF_TIMESTAMP = "as-of-timestamp"
#: reads: the head of this branch (read with the current schema); writes: commit to this
#: branch (created from main's head when it does not exist)
OPT_BRANCH = "branch"
#: writes (append): stage the snapshot for write-audit-publish under this wap id (needs
#: the table property write.wap.enabled=true; Java's Spark takes it from spark.wap.id)
OPT_WAP_ID = "wap-id"
#: reads: the snapshot of this tag
OPT_TAG = "tag"
#: reads and writes: JSON object of recorded location prefix -> where the files are now
OPT_LOCATION_MAP = "location-map"
#: reads: an Iceberg row filter, e.g. ``id > 5 and category = 'a'``
OPT_FILTER = "filter"
#: writes: create the table if it does not exist, encrypted under this KMS master key
OPT_TABLE_KEY_ID = "table-key-id"
#: reads and writes: ``true`` refuses a metadata version without a valid icecrypt
#: authenticator (``EncryptedTable.load(require_authenticated_metadata=True)``), in the
#: driver's planning and commit and in every write task
OPT_REQUIRE_AUTHENTICATED = "require-authenticated-metadata"
#: writes: data file format, ``parquet`` or ``avro`` (default: the table's write.format.default)
OPT_WRITE_FORMAT = "write-format"
#: writes: bytes of Arrow data per data file (default: the table's write.target-file-size-bytes)
OPT_TARGET_FILE_SIZE = "target-file-size-bytes"
#: writes (mode overwrite): ``static`` (default: the whole table, or the rows of
#: ``overwrite-filter``) or ``dynamic`` (only the partitions the DataFrame has rows in:
#: Java's ReplacePartitions; Iceberg's Spark option of the same name)
OPT_OVERWRITE_MODE = "overwrite-mode"
#: writes (mode overwrite): an Iceberg row filter; the rows it matches are replaced by the
#: DataFrame's (Iceberg's ``DataFrameWriterV2.overwrite(condition)``)
OPT_OVERWRITE_FILTER = "overwrite-filter"
#: writes (dynamic or filtered overwrite): ``serializable`` or ``snapshot`` (default: the
#: table's write.delete.isolation-level, else serializable)
OPT_ISOLATION_LEVEL = "isolation-level"

#: reads and writes: the name of an ``icecrypt.catalog`` catalog; load()/save() then take a
#: table identifier (``db.table``), and commits go through the catalog.  Its properties
#: are the options ``catalog.<property>`` (``catalog.uri``, ``catalog.warehouse``,
#: ``catalog.type``, ``catalog.s3.endpoint``, ...); the KMS options serve it too.
OPT_CATALOG = "catalog"
_CATALOG_PREFIX = "catalog."

#: reads: one of the table's metadata tables instead of its rows (``snapshots``, ``files``,
#: ``manifests``, ``partitions``, ...: icecrypt.table.METADATA_TABLES), with ``snapshot-id``
#: for the per-snapshot ones and ``filter`` for ``partitions``
OPT_METADATA_TABLE = "metadata-table"

#: reads (incremental, as Iceberg's Spark): the rows appended after this snapshot (exclusive) ...
OPT_START_SNAPSHOT_ID = "start-snapshot-id"
#: ... up to this one (inclusive; default the current snapshot)
OPT_END_SNAPSHOT_ID = "end-snapshot-id"
#: reads (incremental): the range by moments (ms since the epoch), as Iceberg's Spark changelog
OPT_START_TIMESTAMP = "start-timestamp"
OPT_END_TIMESTAMP = "end-timestamp"
#: reads: ``true`` for the changelog of the range (rows inserted and deleted, with
#: ``_change_type``, ``_change_ordinal``, ``_commit_snapshot_id``; Iceberg's ``<table>.changes``)
OPT_CHANGELOG = "changelog"
_INCREMENTAL_OPTIONS = (OPT_START_SNAPSHOT_ID, OPT_END_SNAPSHOT_ID, OPT_START_TIMESTAMP, OPT_END_TIMESTAMP)

#: streaming reads (``spark.readStream``, Iceberg's Spark names; see ``icecrypt.spark._stream``):
#: start with the first snapshot committed at or after this moment (ms since the epoch)
OPT_STREAM_FROM_TIMESTAMP = "stream-from-timestamp"
#: ... at most this many data files / about this many rows per micro-batch (at least one file)
OPT_MAX_FILES_PER_BATCH = "streaming-max-files-per-micro-batch"
OPT_MAX_ROWS_PER_BATCH = "streaming-max-rows-per-micro-batch"
#: ... ``true``: pass over overwrite / delete snapshots instead of failing on them
OPT_SKIP_OVERWRITES = "streaming-skip-overwrite-snapshots"
OPT_SKIP_DELETES = "streaming-skip-delete-snapshots"
_STREAM_OPTIONS = (OPT_STREAM_FROM_TIMESTAMP, OPT_MAX_FILES_PER_BATCH, OPT_MAX_ROWS_PER_BATCH, OPT_SKIP_OVERWRITES,
                   OPT_SKIP_DELETES)

#: reads and writes, set by icecrypt's SQL catalog only (org.icecrypt.spark.catalog.SourceRewrite):
#: a copy-on-write UPDATE, MERGE INTO or row-level DELETE of a table on an object store, as
#: JSON ``{"command", "snapshot_id", "filters", "read"}``.  The read returns every live row
#: of each data file the filters may match at that snapshot; the write's commit replaces
#: those files (``read`` false: none) by the files written
OPT_REWRITE = "icecrypt.rewrite"

#: options of this source that are not KMS properties (``_common`` strips its own)
_OWN_OPTIONS = frozenset({OPT_SNAPSHOT_ID, OPT_AS_OF_TIMESTAMP, OPT_BRANCH, OPT_TAG, OPT_LOCATION_MAP, OPT_FILTER,
                          OPT_TABLE_KEY_ID, OPT_WRITE_FORMAT, OPT_TARGET_FILE_SIZE, OPT_CATALOG, OPT_METADATA_TABLE,
                          OPT_OVERWRITE_MODE, OPT_OVERWRITE_FILTER, OPT_ISOLATION_LEVEL,
                          OPT_WAP_ID, *_INCREMENTAL_OPTIONS, OPT_CHANGELOG, *_STREAM_OPTIONS, OPT_NATIVE,
                          OPT_REWRITE})
_KMS_PREFIX = "encryption.kms"


# --- options ----------------------------------------------------------------------------------


def _location(options: Mapping[str, str], action: str) -> str:
    location = options.get(OPT_PATH)
    if not location:
        what = "a table identifier" if options.get(OPT_CATALOG) else "table directory or metadata.json"
        raise ValueError(f"{NAME}: no table given: use .{action}(<{what}>)")
    return str(location)


def _location_map(options: Mapping[str, str]) -> dict[str, str] | None:
    """Option ``location-map``: a JSON object of prefix -> replacement."""
    raw = options.get(OPT_LOCATION_MAP)
    if raw is None or not str(raw).strip():
        return None
    try:
        mapping = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"{NAME}: option {OPT_LOCATION_MAP} is not JSON ({exc}); expected an object such as "
                         '{"s3://bucket/table": "/data/table"}') from None
    if not isinstance(mapping, dict) or not all(isinstance(k, str) and k and isinstance(v, str)
                                                for k, v in mapping.items()):
        raise ValueError(f"{NAME}: option {OPT_LOCATION_MAP} must be a JSON object mapping location prefixes "
                         "to strings")
    return mapping


def _integer_option(options: Mapping[str, str], name: str, what: str) -> int | None:
    raw = options.get(name)
    if raw is None or not str(raw).strip():
        return None
    try:
        return int(str(raw).strip())
    except ValueError:
        raise ValueError(f"{NAME}: option {name}={raw!r} is not {what}") from None


def _time_travel(options: Mapping[str, str]) -> dict[str, Any]:
    """The scan arguments of the options ``snapshot-id``, ``as-of-timestamp``, ``branch``
    and ``tag`` (at most one; the scan says so)."""
    refs = {key: str(options[name]).strip() or None for key, name in (("branch", OPT_BRANCH), ("tag", OPT_TAG))
            if options.get(name) is not None}
    return {
        "snapshot_id": _integer_option(options, OPT_SNAPSHOT_ID, "a snapshot id (an integer)"),
        "as_of_timestamp": _integer_option(options, OPT_AS_OF_TIMESTAMP, "a timestamp (milliseconds since the epoch)"),
        **refs,
    }


def _changelog(options: Mapping[str, str]) -> bool:
    raw = str(options.get(OPT_CHANGELOG) or "false").strip().lower()
    if raw not in ("true", "false"):
        raise ValueError(f"{NAME}: option {OPT_CHANGELOG}={options.get(OPT_CHANGELOG)!r} must be true or false")
    return raw == "true"


def _incremental(table: EncryptedTable, options: Mapping[str, str]) -> dict[str, Any] | None:
    """The range arguments of the incremental options (None: none given and no changelog).

    As Iceberg's Spark: they exclude time travel; ``end-snapshot-id`` alone is refused for
    an append scan (a changelog starts at the first snapshot); a snapshot id and a
    timestamp for the same end are refused.  Timestamps select by the current snapshot's
    ancestors (``icecrypt.table.read.incremental.timestamp_range``)."""
    from icecrypt.table.read.incremental import timestamp_range

    changelog = _changelog(options)
    given = [name for name in _INCREMENTAL_OPTIONS if str(options.get(name) or "").strip()]
    if not given and not changelog:
        return None
    travel = [name for name in (OPT_SNAPSHOT_ID, OPT_AS_OF_TIMESTAMP, OPT_BRANCH, OPT_TAG) if options.get(name)]
    if travel:
        raise ValueError(f"{NAME}: options {', '.join(given) or OPT_CHANGELOG} (an incremental read) cannot be "
                         f"combined with {', '.join(travel)} (time travel)")
    for ids, moment in ((OPT_START_SNAPSHOT_ID, OPT_START_TIMESTAMP), (OPT_END_SNAPSHOT_ID, OPT_END_TIMESTAMP)):
        if ids in given and moment in given:
            raise ValueError(f"{NAME}: give {ids} or {moment}, not both")
    if given == [OPT_END_SNAPSHOT_ID] and not changelog:
        raise ValueError(f"{NAME}: option {OPT_END_SNAPSHOT_ID} alone is not an incremental read: "
                         f"set {OPT_START_SNAPSHOT_ID} too")
    start = _integer_option(options, OPT_START_SNAPSHOT_ID, "a snapshot id (an integer)")
    end = _integer_option(options, OPT_END_SNAPSHOT_ID, "a snapshot id (an integer)")
    start_ms = _integer_option(options, OPT_START_TIMESTAMP, "a timestamp (milliseconds since the epoch)")
    end_ms = _integer_option(options, OPT_END_TIMESTAMP, "a timestamp (milliseconds since the epoch)")
    if start_ms is not None or end_ms is not None:
        from_id, to_id, empty = timestamp_range(table, start_ms, end_ms)
        if empty:  # an empty range: the current snapshot to itself
            current = table.current_snapshot_id
            return {"from_snapshot_id": current, "to_snapshot_id": current}
        start = from_id if start_ms is not None else start
        end = to_id if end_ms is not None else end
    return {"from_snapshot_id": start, "to_snapshot_id": end}


def _no_incremental(options: Mapping[str, str], where: str) -> None:
    """Refuse the incremental-read options where they mean nothing (not ignore them)."""
    given = [name for name in (*_INCREMENTAL_OPTIONS, OPT_CHANGELOG) if str(options.get(name) or "").strip()]
    if given and (given != [OPT_CHANGELOG] or _changelog(options)):
        raise ValueError(f"{NAME}: option(s) {', '.join(given)} (incremental reads) have no meaning {where}")


class Rewrite:
    """Option ``icecrypt.rewrite`` (:data:`OPT_REWRITE`), checked: what a copy-on-write
    statement of the SQL catalog reads and replaces -- the live rows of each data file of
    the snapshot that the filters may match and, when ``files`` is a list (Spark's runtime
    group filter ran), that is in it.  ``read``: false when the statement's scan was never
    built (nothing is replaced); a write whose scan has not run (``read`` null) is refused."""

    def __init__(self, raw: str, options: Mapping[str, str], location: str) -> None:
        try:
            value = json.loads(raw)
            command, snapshot_id, filters, files, read = (value["command"], value["snapshot_id"], value["filters"],
                                                          value["files"], value["read"])  # fmt: skip
        except (ValueError, TypeError, KeyError):
            raise ValueError(f"{NAME}: table {location}: option {OPT_REWRITE} is malformed") from None
        if (command not in ("update", "merge", "delete") or not isinstance(filters, list)
                or not (files is None or (isinstance(files, list) and all(isinstance(f, str) for f in files)))
                or not (read is None or type(read) is bool)
                or not (snapshot_id is None or type(snapshot_id) is int)):  # fmt: skip
            raise ValueError(f"{NAME}: table {location}: option {OPT_REWRITE} is malformed")
        if read is None:
            raise ValueError(f"{NAME}: table {location}: the {command.upper()}'s scan has not run, so the files it "
                             "replaces are unknown; nothing was written")
        if options.get(OPT_WAP_ID):
            raise ValueError(f"{NAME}: table {location}: a {command.upper()} is not staged for write-audit-publish "
                             f"(spark.wap.id, option {OPT_WAP_ID}); nothing was written")
        given = [o for o in (OPT_FILTER, OPT_SNAPSHOT_ID, OPT_AS_OF_TIMESTAMP, OPT_TAG, OPT_METADATA_TABLE,
                             OPT_OVERWRITE_MODE, OPT_OVERWRITE_FILTER, *_INCREMENTAL_OPTIONS) if options.get(o)]
        if given:
            raise ValueError(f"{NAME}: table {location}: option {OPT_REWRITE} goes with no option {given[0]}")
        self.command, self.snapshot_id, self.filters, self.read = command, snapshot_id, filters, read
        self.only = None if files is None else set(files)
        self.location = location

    def row_filter(self, table: EncryptedTable) -> BooleanExpression:
        """The filters, on the columns of the snapshot's schema (one without an Iceberg form
        is left out: more files are read and replaced, never fewer)."""
        from pyiceberg.expressions import AlwaysTrue

        from icecrypt.spark._sql.filters import to_filter

        if self.snapshot_id is None:
            return AlwaysTrue()
        return to_filter(self.filters, table.schema_for(table.snapshot(self.snapshot_id)))

    def tasks(self, table: EncryptedTable, columns: Sequence[str] | None) -> list[FileScanTask]:
        """The scan's tasks: every live row of each file read (none when the scan was never
        built or the table had no snapshot)."""
        import dataclasses

        from pyiceberg.expressions import AlwaysTrue

        if not self.read or self.only == set():
            return []
        tasks = [] if self.snapshot_id is None else table.scan(
            columns=columns, row_filter=self.row_filter(table), snapshot_id=self.snapshot_id).plan_files()
        if self.only is not None:
            # Spark's group filter read the table as it stands: a file it found that the
            # statement's snapshot lacks means a commit came between, whose rows the
            # statement would not see (a compaction's copy of a matched row, an append)
            foreign = self.only - {t.file.path for t in tasks}
            if foreign:
                from icecrypt.errors import CommitConflictError

                raise CommitConflictError(
                    f"{NAME}: table {self.location}: the {self.command.upper()} found rows to change in "
                    f"{sorted(foreign)[0]}, which its snapshot {self.snapshot_id} does not hold: the table changed "
                    "while the statement ran; nothing was committed, run it again")
            tasks = [t for t in tasks if t.file.path in self.only]
        return [dataclasses.replace(t, read=dataclasses.replace(t.read, row_filter=AlwaysTrue())) for t in tasks]

    def files(self, table: EncryptedTable) -> list[str]:
        """The data files the scan read: the ones the commit replaces."""
        return list(dict.fromkeys(t.file.path for t in self.tasks(table, None)))


#: the row lineage columns a rewrite's rows carry (icecrypt.table.model.metadata_columns.LINEAGE)
_LINEAGE_COLUMNS = ("_row_id", "_last_updated_sequence_number")


def _rewrite(options: Mapping[str, str], location: str) -> Rewrite | None:
    raw = options.get(OPT_REWRITE)
    return None if raw is None else Rewrite(raw, options, location)


def _kms_options(options: Mapping[str, str]) -> dict[str, str]:
    """The options without this source's own (the rest are KMS and storage properties)."""
    return {k: v for k, v in options.items() if k not in _OWN_OPTIONS and not k.startswith(_CATALOG_PREFIX)}


def _catalog(options: Mapping[str, str]) -> Any:
    """The catalog option ``catalog`` names (None without it), with the ``catalog.*``
    properties and the options' KMS (one KMS client per process and properties)."""
    name = (options.get(OPT_CATALOG) or "").strip()
    if not name:
        return None
    from icecrypt.catalog import load_catalog

    if _location_map(options):
        raise ValueError(f"{NAME}: option {OPT_LOCATION_MAP} is for tables named by path, not with option {OPT_CATALOG}")
    properties = {k[len(_CATALOG_PREFIX):]: v for k, v in options.items() if k.startswith(_CATALOG_PREFIX)}
    kms = _keys.kms_client(_kms_options(options)) if _has_kms(options) else None
    return load_catalog(name, kms=kms, **properties)


def _has_kms(options: Mapping[str, str]) -> bool:
    return any(name.startswith(_KMS_PREFIX) for name in options)


# --- tables ----------------------------------------------------------------------------------


def _open_table(options: Mapping[str, str], location: str, *, pin_key: bool = True) -> EncryptedTable:
    """The table at ``location`` (a table directory or a ``metadata.json``, path or URI),
    read through the file system the (mapped) location names, with the options' KMS.

    Unless ``encryption=none`` is given, the KMS options are required and a table
    without ``encryption.key-id`` is refused (a plaintext table is never taken for an
    encrypted one).  With option ``table-key-id`` (and ``pin_key``) the table must be
    encrypted under that master key, and is pinned to it (TableIdentityError
    otherwise).  A missing table is a FileNotFoundError.
    """
    key_id = ((options.get(OPT_TABLE_KEY_ID) or "").strip() or None) if pin_key else None
    want_encrypted = encrypted(options)
    if want_encrypted and not _has_kms(options):
        raise ValueError(f"{NAME}: no KMS given: set the KMS options (encryption.kms-type, ... or "
                         "encryption.kms-impl) that unwrap the table's keys; a plaintext table is read or written "
                         "only with option encryption=none")
    catalog = _catalog(options)
    strict = require_authenticated(options)
    try:
        if catalog is not None:
            from icecrypt.errors import NoSuchTableError

            try:
                table = catalog.load_table(location, **({"table_key_id": key_id} if key_id else {}),
                                           require_authenticated_metadata=strict or None)  # fmt: skip
            except NoSuchTableError as exc:
                raise FileNotFoundError(str(exc)) from None
        else:
            location_map = _location_map(options)
            filesystem, _, _ = resolve(Locations(None, location_map).map_location(location), options)
            kms = _keys.kms_client(_kms_options(options)) if _has_kms(options) else None
            table = EncryptedTable.load(location, kms=kms, filesystem=filesystem, location_map=location_map,
                                        table_key_id=key_id, require_authenticated_metadata=strict)
    except FileNotFoundError:
        raise
    except Exception as exc:
        raise file_error(exc, f"{NAME}: loading table {location}") from exc
    if want_encrypted and not table.encrypted:
        raise PlaintextFileError(f"{NAME}: table {location} is not encrypted (its metadata has no "
                                 f"{ENCRYPTION_TABLE_KEY}); pass option encryption=none to read or write a "
                                 "plaintext table")
    return table


def require_authenticated(options: Mapping[str, str]) -> bool:
    """Option ``require-authenticated-metadata`` (``true`` / ``false``, default false)."""
    raw = (options.get(OPT_REQUIRE_AUTHENTICATED) or "false").strip().lower()
    if raw not in ("true", "false"):
        raise ValueError(f"{NAME}: option {OPT_REQUIRE_AUTHENTICATED}={raw!r} must be true or false")
    return raw == "true"


def _new_scan(table: EncryptedTable, options: Mapping[str, str], columns: Sequence[str] | None,
              row_filter: BooleanExpression | str | None) -> TableScan:
    """The scan the options describe (nothing is read until it is planned)."""
    split = split_size(options, default=0, minimum=1)
    batch_size = positive_int(options, OPT_BATCH_SIZE, 1) if options.get(OPT_BATCH_SIZE) else None
    try:
        incremental = _incremental(table, options)
        if incremental is not None and _changelog(options):
            from icecrypt.table.read.incremental import CHANGE_COLUMNS

            columns = None if columns is None else [c for c in columns if c not in CHANGE_COLUMNS]
            return table.changelog_scan(columns=columns, row_filter=row_filter, **incremental,
                                        split_size=split or None, batch_size=batch_size)
        return table.scan(columns=columns, row_filter=row_filter, **(incremental or _time_travel(options)),
                          split_size=split or None, batch_size=batch_size)
    except KeyError as exc:  # an unknown snapshot id, branch or tag
        raise LookupError(f"{NAME}: {exc.args[0] if exc.args else exc}") from None


# --- reading ---------------------------------------------------------------------------------


class TaskPartition(InputPartition):
    """One file scan task.  The task holds the key metadata of its files (they travel
    with it to the executor, as in Iceberg Java); its repr never shows them."""

    def __init__(self, index: int, task: FileScanTask | ChangelogTask) -> None:
        super().__init__(index)
        self.task = task

    def __repr__(self) -> str:
        task = self.task
        if isinstance(task, ChangelogTask):
            return f"TaskPartition({self.value}, {task!r})"
        return (f"TaskPartition({self.value}, {task.file.path}, bytes {task.start}+{task.length}, "
                f"{len(task.deletes)} delete files)")


class IcebergReader(DataSourceReader):
    """Plans the scan on the driver (``partitions``), reads one task per partition."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.options = dict(options)
        self.location = _location(self.options, "load")
        table = _open_table(self.options, self.location)
        self.columns = list(schema.fieldNames())
        self.rewrite = _rewrite(self.options, self.location)
        self.row_filter = parse_row_filter(self.options.get(OPT_FILTER))
        if self.rewrite is not None and self.rewrite.snapshot_id is not None:
            self.options[OPT_SNAPSHOT_ID] = str(self.rewrite.snapshot_id)  # the columns as that snapshot has them
        try:
            scan = _new_scan(table, self.options, self.columns, self.row_filter)
        except ValueError as exc:
            raise ValueError(f"{NAME}: table {self.location}: {exc}") from None
        self.projection = Projection(scan.arrow_schema, schema, f"{NAME}: table {self.location}")
        self.filesystem = table.filesystem
        self._table: EncryptedTable | None = table  # the planner's, left out of the pickled reader

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_table", None)
        return state

    def partitions(self) -> list[InputPartition]:
        table = getattr(self, "_table", None) or _open_table(self.options, self.location)
        try:
            if self.rewrite is not None:
                return [TaskPartition(i, task) for i, task in enumerate(self.rewrite.tasks(table, self.columns))]
            scan = _new_scan(table, self.options, self.columns, self.row_filter)
            tasks = scan.plan_changes() if isinstance(scan, ChangelogScan) else scan.plan_files()
        except Exception as exc:
            raise file_error(exc, f"{NAME}: planning the scan of table {self.location}") from exc
        return [TaskPartition(index, task) for index, task in enumerate(tasks)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, TaskPartition):
            return  # the placeholder partition Spark adds when the scan planned no task
        apply = self.projection.apply
        task = partition.task
        read = read_changelog_task if isinstance(task, ChangelogTask) else read_task
        try:
            for batch in read(task, self.filesystem):
                yield apply(batch)
        except Exception as exc:
            raise file_error(exc, f"{NAME}: task {partition.value} of table {self.location}") from exc


# --- metadata tables ----------------------------------------------------------------------------


def _metadata_table(options: Mapping[str, str], location: str) -> pa.Table:
    """The metadata table option ``metadata-table`` names (``table.inspect``: key
    metadata as fingerprints only), computed on the driver."""
    name = str(options[OPT_METADATA_TABLE]).strip()
    table = _open_table(options, location)
    row_filter = options.get(OPT_FILTER) or None
    try:
        if row_filter is not None and name != "partitions":
            raise ValueError(f"option {OPT_FILTER} applies to the rows of a table and to metadata table partitions, "
                             f"not to {name!r}")
        # snapshot-id, as-of-timestamp, branch or tag select the snapshot of the
        # per-snapshot tables, as for a read of the table's rows
        travel = {key: value for key, value in _time_travel(options).items() if value is not None}
        snapshot_id = None
        if travel:
            snapshot, _ = resolve_read(table, **travel)
            snapshot_id = None if snapshot is None else snapshot.snapshot_id
        if name == "partitions":
            result = table.inspect.partitions(snapshot_id, row_filter)
        else:
            result = table.inspect.table(name, snapshot_id=snapshot_id)
        columns = columns_option(options)
        if columns is not None:
            unknown = [c for c in columns if c not in result.column_names]
            if unknown:
                raise ValueError(f"metadata table {name} has no column(s) {', '.join(unknown)}")
            result = result.select(columns)
    except ValueError as exc:
        raise ValueError(f"{NAME}: table {location}: {exc}") from None
    except Exception as exc:
        raise file_error(exc, f"{NAME}: reading metadata table {name} of table {location}") from exc
    return result


class MetadataTablePartition(InputPartition):
    """A metadata table, computed on the driver, as Arrow IPC (nothing secret in it)."""

    def __init__(self, data: bytes) -> None:
        super().__init__(0)
        self.data = data

    def __repr__(self) -> str:
        return f"MetadataTablePartition({len(self.data)} bytes)"


class MetadataTableReader(DataSourceReader):
    """Reads the metadata table of option ``metadata-table`` (one partition)."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        location = _location(options, "load")
        result = _metadata_table(options, location)
        self.projection = Projection(result.schema, schema, f"{NAME}: table {location}")
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, result.schema) as stream:
            stream.write_table(result)
        self.data = sink.getvalue().to_pybytes()

    def partitions(self) -> list[InputPartition]:
        return [MetadataTablePartition(self.data)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, MetadataTablePartition):
            return
        for batch in pa.ipc.open_stream(partition.data):
            yield self.projection.apply(batch)


# --- writing ----------------------------------------------------------------------------------


class TaskDataFiles(WriterCommitMessage):
    """A write task's commit message: the manifest records of the data files it wrote,
    with their key metadata (as Iceberg Java's task commits carry them; never shown)."""

    def __init__(self, data_files: Sequence[dict[str, Any]]) -> None:
        self.data_files = tuple(data_files)

    def __repr__(self) -> str:
        return f"TaskDataFiles({[f['file_path'] for f in self.data_files]!r})"


def _castable(source: pa.DataType, target: pa.DataType) -> bool:
    try:
        pa.array([], type=source).cast(target)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):
        return False
    return True


def _column_names(table: EncryptedTable, schema: StructType, location: str) -> dict[str, str]:
    """DataFrame column -> table column (the exact name, else the one name that matches
    ignoring case).  Checks that every column exists with a castable type and that no
    required column is missing; returns only the names that differ."""
    target = table.scan().arrow_schema
    incoming = to_arrow_schema(schema, timezone="UTC")
    by_lower: dict[str, list[str]] = {}
    for name in target.names:
        by_lower.setdefault(name.lower(), []).append(name)
    renames: dict[str, str] = {}
    problems: list[str] = []
    seen: set[str] = set()
    for field in incoming:
        candidates = [field.name] if field.name in target.names else by_lower.get(field.name.lower(), [])
        if len(candidates) != 1:
            problems.append(f"the table has no column {field.name!r}")
            continue
        name = candidates[0]
        if name in seen:
            problems.append(f"column {name!r} is given twice")
        seen.add(name)
        if name != field.name:
            renames[field.name] = name
        if not _castable(field.type, target.field(name).type):
            problems.append(f"column {field.name!r} is {schema[field.name].dataType.simpleString()}, which cannot be "
                            f"written as {target.field(name).type}")
    missing = [field.name for field in target if not field.nullable and field.name not in seen]
    if missing:
        problems.append(f"required column(s) {', '.join(map(repr, missing))} missing")
    if problems:
        raise ValueError(f"{NAME}: the DataFrame does not fit table {location}: {'; '.join(problems)} "
                         f"(table columns: {', '.join(target.names)})")
    return renames


class IcebergWriter(DataSourceArrowWriter):
    """Executors write encrypted data files, the driver commits them as one snapshot."""

    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        self.options = dict(options)
        self.overwrite = overwrite
        self.location = _location(self.options, "save")
        self.file_format = self.options.get(OPT_WRITE_FORMAT) or None
        if self.file_format is not None and self.file_format.lower() not in ("parquet", "avro"):
            raise ValueError(f"{NAME}: option {OPT_WRITE_FORMAT}={self.file_format!r} must be parquet or avro")
        self.target_file_size = positive_int(self.options, OPT_TARGET_FILE_SIZE, 1) \
            if self.options.get(OPT_TARGET_FILE_SIZE) else None
        self.branch = (self.options.get(OPT_BRANCH) or "").strip() or None
        self.wap_id = (self.options.get(OPT_WAP_ID) or "").strip() or None
        if self.wap_id is not None and (overwrite or self.branch is not None):
            raise ValueError(f"{NAME}: option {OPT_WAP_ID} stages an append; it goes with neither "
                             f"{OPT_BRANCH} nor an overwrite")
        self.rewrite = _rewrite(self.options, self.location)
        if self.rewrite is not None and overwrite:
            raise ValueError(f"{NAME}: table {self.location}: option {OPT_REWRITE} goes with an append")
        # a rewrite's rows carry their row lineage after the table's columns (SourceRewrite)
        self.lineage = self.rewrite is not None and all(n in schema.fieldNames() for n in _LINEAGE_COLUMNS)
        if self.lineage:
            schema = StructType([f for f in schema.fields if f.name not in _LINEAGE_COLUMNS])
        self.dynamic, self.overwrite_filter, self.isolation = self._overwrite_options(overwrite)
        table, self.created = self._open_or_create(schema)
        if self.rewrite is not None and table.format_version >= 3 and not self.lineage:
            raise NotImplementedError(
                f"{NAME}: table {self.location}: a copy-on-write {self.rewrite.command.upper()} that cannot carry the "
                "rows' lineage (a table column takes the name _row_id or _last_updated_sequence_number) is not "
                "supported on an object store; nothing was written")
        # one id for every data file of this job (file names carry it), so the driver
        # finds what attempts that died before reporting left behind
        self.operation_id = str(uuid.uuid4())
        self.encrypted = table.encrypted
        # what the driver's table object pinned: tasks and the commit build only on versions
        # that keep it (a version that dropped encryption.key-id never gets a plaintext file)
        self.table_key_id, self.table_uuid = table.pin.table_key_id, table.pin.table_uuid
        self.pin = table.pin  # tasks load the job's version against it (roots, key id, UUID)
        self.require_authenticated = table.require_authenticated_metadata
        self.metadata_location = table.metadata_location
        # where the job starts: a dynamic or filtered overwrite validates the commits since
        # (Java's validateFromSnapshot), so one that added rows it would replace is a conflict
        self.start_snapshot_id = _head_id(table.metadata, self.branch or MAIN_BRANCH)
        if self.rewrite is not None:  # the snapshot the statement read (validated from at commit)
            self.start_snapshot_id = self.rewrite.snapshot_id
        self.filesystem = table.filesystem
        self.location_map = table.location_map or None
        self.table_roots = table.pin.roots()  # abort deletes nothing outside these
        self.renames = _column_names(table, schema, self.location)
        if self.overwrite_filter is not None:  # a bad filter fails here, before any task writes
            try:
                _bind_filter(self.overwrite_filter, table.schema)
            except (ValueError, TypeError) as exc:
                if self.created:
                    self._drop_if_empty()
                raise ValueError(f"{NAME}: option {OPT_OVERWRITE_FILTER}={self.overwrite_filter!r} on table "
                                 f"{self.location}: {exc}") from None

    def _overwrite_options(self, overwrite: bool) -> tuple[bool, str | None, str | None]:
        """(dynamic partition overwrite, overwrite filter, isolation level) of the options."""
        mode = (self.options.get(OPT_OVERWRITE_MODE) or "static").strip().lower()
        if mode not in ("static", "dynamic"):
            raise ValueError(f"{NAME}: option {OPT_OVERWRITE_MODE}={mode!r} must be static or dynamic")
        row_filter = self.options.get(OPT_OVERWRITE_FILTER)
        if row_filter is not None and not row_filter.strip():  # never a full overwrite by mistake
            raise ValueError(f"{NAME}: option {OPT_OVERWRITE_FILTER} is empty; to replace every row, leave it out")
        row_filter = row_filter.strip() if row_filter is not None else None
        isolation = (self.options.get(OPT_ISOLATION_LEVEL) or "").strip().lower() or None
        if isolation is not None and isolation not in (SERIALIZABLE, SNAPSHOT):
            raise ValueError(f"{NAME}: option {OPT_ISOLATION_LEVEL}={isolation!r} must be {SERIALIZABLE} or {SNAPSHOT}")
        given = [f"{OPT_OVERWRITE_MODE}=dynamic"] * (mode == "dynamic") + [OPT_OVERWRITE_FILTER] * bool(row_filter)
        if given and not overwrite:
            raise ValueError(f"{NAME}: option {given[0]} goes with mode('overwrite'), not an append")
        if len(given) == 2:
            raise ValueError(f"{NAME}: options {OPT_OVERWRITE_MODE}=dynamic and {OPT_OVERWRITE_FILTER} exclude each "
                             "other (a dynamic overwrite replaces the partitions the DataFrame has rows in)")
        if isolation is not None and not given:
            raise ValueError(f"{NAME}: option {OPT_ISOLATION_LEVEL} goes with {OPT_OVERWRITE_MODE}=dynamic or "
                             f"{OPT_OVERWRITE_FILTER} (an append or a full overwrite cannot conflict)")
        return mode == "dynamic", row_filter, isolation

    def _open_or_create(self, schema: StructType) -> tuple[EncryptedTable, bool]:
        key_id = (self.options.get(OPT_TABLE_KEY_ID) or "").strip() or None
        try:
            table = _open_table(self.options, self.location, pin_key=False)  # checked below, with its own message
        except FileNotFoundError as exc:
            if key_id is None:
                raise FileNotFoundError(
                    f"{NAME}: no table at {self.location} ({exc}); create it first (EncryptedTable.create) or pass "
                    f"option {OPT_TABLE_KEY_ID}=<KMS master key id> to create it encrypted from the DataFrame's schema"
                ) from None
            return self._create(schema, key_id), True
        if key_id is not None and table.properties.get(ENCRYPTION_TABLE_KEY) != key_id:
            raise ValueError(f"{NAME}: table {self.location} exists and is not encrypted under master key {key_id!r} "
                             f"(option {OPT_TABLE_KEY_ID})")
        return table, False

    def _create(self, schema: StructType, key_id: str) -> EncryptedTable:
        catalog = _catalog(self.options)
        if catalog is not None:
            try:
                return catalog.create_table(self.location, to_arrow_schema(schema, timezone="UTC"), table_key_id=key_id)
            except Exception as exc:
                raise file_error(exc, f"{NAME}: creating table {self.location} in catalog {catalog.name!r}") from exc
        if _location_map(self.options):
            raise ValueError(f"{NAME}: option {OPT_LOCATION_MAP} is for existing tables; a new table is created at "
                             "the location given to save()")
        filesystem, _, _ = resolve(self.location, self.options)
        try:
            return EncryptedTable.create(self.location, to_arrow_schema(schema, timezone="UTC"),
                                         kms=_keys.kms_client(_kms_options(self.options)), table_key_id=key_id,
                                         filesystem=filesystem)
        except Exception as exc:
            raise file_error(exc, f"{NAME}: creating table {self.location}") from exc

    def _table(self, *, commit: bool = False) -> EncryptedTable:
        """The table's newest version (what write_files and the commits build on).

        A catalog table is loaded through its catalog for a commit (on the driver: the
        commit swaps the catalog's pointer); tasks read the metadata file the job started
        from, so executors need no access to the catalog."""
        kms = _keys.kms_client(_kms_options(self.options)) if self.encrypted else None
        catalog = _catalog(self.options) if commit else None
        if catalog is not None:
            table = catalog.load_table(self.location, require_authenticated_metadata=self.require_authenticated or None)
            trusted_pin(table.metadata, table_key_id=self.table_key_id, table_uuid=self.table_uuid).check(
                table.metadata, table.metadata_location
            )
        else:
            table = EncryptedTable.load(self.metadata_location, kms=kms, filesystem=self.filesystem,
                                        location_map=self.location_map, pin=self.pin,
                                        require_authenticated_metadata=self.require_authenticated)  # fmt: skip
            if not self.options.get(OPT_CATALOG):
                table.refresh()
        if self.encrypted and not table.encrypted:  # changed since the job started: never write plaintext
            raise PlaintextFileError(f"{NAME}: table {self.location} is no longer encrypted (refused)")
        return table

    # --- tasks -------------------------------------------------------------------------------

    def write(self, iterator: Iterator[pa.RecordBatch], *, lineage: bool = False) -> TaskDataFiles:
        """A task's data files.  ``lineage`` (row-level changes, :mod:`icecrypt.spark._merge`):
        the batches also carry ``_row_id`` and ``_last_updated_sequence_number``."""
        from icecrypt.table.ops.write import write_files

        renames = self.renames

        def batches() -> Iterator[pa.RecordBatch]:
            for batch in iterator:
                yield batch.rename_columns([renames.get(n, n) for n in batch.schema.names]) if renames else batch

        try:
            data_files = write_files(self._table(), batches(), file_format=self.file_format,
                                     target_file_size=self.target_file_size, operation_id=self.operation_id,
                                     task_id=_task_attempt_id(), lineage=lineage or self.lineage)
        except Exception as exc:
            raise file_error(exc, f"{NAME}: writing data files of table {self.location}") from exc
        return TaskDataFiles(data_files)

    # --- driver -------------------------------------------------------------------------------

    def commit(self, messages: list[TaskDataFiles | None]) -> None:
        from icecrypt.table.ops.rowlevel import dynamic_partition_overwrite_files, merge_files, overwrite_files_by_filter
        from icecrypt.table.ops.write import append_files, overwrite_files

        data_files = [f for message in messages if message is not None for f in message.data_files]
        try:
            table = self._table(commit=True)
            # deletes the data files if it fails (a tag named as branch, WAP not enabled, a
            # conflict with a concurrent commit, ...)
            if self.rewrite is not None:
                removed = self.rewrite.files(table)
                if not removed and not data_files:
                    return  # the statement read no file and wrote no row: nothing changed
                merge_files(table, data_files, removed=removed, kind=self.rewrite.command,
                            conflict_filter=self.rewrite.row_filter(table), branch=self.branch,
                            start_snapshot_id=self.start_snapshot_id)
            elif self.overwrite_filter is not None:
                overwrite_files_by_filter(table, data_files, self.overwrite_filter, isolation_level=self.isolation,
                                          branch=self.branch, start_snapshot_id=self.start_snapshot_id)  # fmt: skip
            elif self.dynamic:
                dynamic_partition_overwrite_files(table, data_files, isolation_level=self.isolation,
                                                  branch=self.branch, start_snapshot_id=self.start_snapshot_id)
            elif self.overwrite:
                overwrite_files(table, data_files, branch=self.branch)
            else:
                append_files(table, data_files, branch=self.branch, wap_id=self.wap_id)
        except Exception as exc:
            raise file_error(exc, f"{NAME}: committing to table {self.location}") from exc
        self._remove_leftovers(table, [f["file_path"] for f in data_files])

    def _remove_leftovers(self, table: EncryptedTable, keep: list[str]) -> None:
        """Files of this job's attempts that died before reporting (a killed executor):
        no commit references them; found by the job's operation id in their names."""
        from icecrypt.table.ops.write import remove_job_leftovers

        with contextlib.suppress(Exception):  # the job's outcome stands either way
            remove_job_leftovers(table, self.operation_id, keep)

    def abort(self, messages: list[TaskDataFiles | None]) -> None:
        locations = Locations(self.filesystem, self.location_map).confined(self.table_roots)
        reported = []
        for message in messages:
            for data_file in message.data_files if message is not None else ():
                try:
                    path = locations.delete_path(data_file["file_path"], what="data file")
                except ValueError as exc:  # not the table's (PathOutsideTableError): never deleted
                    warnings.warn(f"{NAME}: abort: {exc}", PathOutsideTableWarning, stacklevel=2)
                    continue
                _remove(self.filesystem, path)
                reported.append(data_file["file_path"])
        with contextlib.suppress(Exception):
            table = EncryptedTable.load(self.metadata_location, kms=None if not self.encrypted else
                                        _keys.kms_client(_kms_options(self.options)), filesystem=self.filesystem,
                                        location_map=self.location_map, check_keys=False, pin=self.pin)
            from icecrypt.table.ops.write import remove_job_leftovers

            # the reported files' directories (now empty of them), where dead attempts wrote too
            remove_job_leftovers(table, self.operation_id, [], [posixpath.dirname(p) for p in reported])
        if self.created:
            self._drop_if_empty()

    def _drop_if_empty(self) -> None:
        """Remove the metadata of the table this job created if nothing was committed."""
        with contextlib.suppress(Exception):  # the job's own error matters more
            table = self._table(commit=True)
            if table.snapshots():
                return
            catalog = _catalog(self.options)
            if catalog is not None:
                catalog.drop_table(self.location)
            metadata_dir = posixpath.dirname(table.metadata_location)
            for info in self.filesystem.get_file_info(pafs.FileSelector(metadata_dir)):
                name = posixpath.basename(info.path)
                if info.type == pafs.FileType.File and (name.endswith(".metadata.json") or name == "version-hint.text"):
                    _remove(self.filesystem, info.path)
            if not self.filesystem.get_file_info(pafs.FileSelector(metadata_dir)):
                self.filesystem.delete_dir(metadata_dir)

    def __repr__(self) -> str:
        kind = "append" if self.rewrite is None else f"copy-on-write {self.rewrite.command}"
        if self.overwrite:
            kind = "overwrite filtered" if self.overwrite_filter else "overwrite dynamic" if self.dynamic else "overwrite"
        return f"<IcebergWriter {self.location} {kind}>"


def _task_attempt_id() -> int:
    """Spark's id of the running task attempt (unique in the application), 0 outside Spark."""
    try:
        from pyspark import TaskContext

        context = TaskContext.get()
        return int(context.taskAttemptId()) if context is not None else 0
    except Exception:
        return 0


def _remove(filesystem: pafs.FileSystem, path: str) -> None:
    try:
        filesystem.delete_file(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if filesystem.get_file_info(path).type != pafs.FileType.NotFound:
            raise IcecryptError(f"{NAME}: cannot remove {path}: {exc}") from exc

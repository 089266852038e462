"""Metadata tables: a table's snapshots, history, refs, metadata log, manifests, manifest
entries, files and partitions as Arrow tables (``table.inspect.<name>()``).

The columns are those of Iceberg Java's metadata tables and PyIceberg's ``inspect``
(same names, same Arrow types; the file tables also carry format v3's ``first_row_id``,
``referenced_data_file``, ``content_offset`` and ``content_size_in_bytes``, as Java's
do).  Everything is read through the table's own manifest list and manifest readers, so
in an encrypted table each manifest list and manifest is decrypted and authenticated
before a row comes from it.

One deliberate difference: a ``key_metadata`` column never holds key metadata.  In an
encrypted table the key metadata of a file *is* its data key (in clear inside the
decrypted manifest), so the column holds the key's fingerprint instead, a string of 16
hex digits (the one :meth:`~icecrypt.table.EncryptedTable.key_usage` reports and
:meth:`~icecrypt.table.EncryptedTable.rekey` takes), or null for a plaintext file.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from icecrypt._metadata_tables import METADATA_TABLES
from icecrypt.errors import FormatError
from icecrypt.table.files.manifest import (
    DATA,
    EQUALITY_DELETES,
    MANIFEST_DELETES,
    POSITION_DELETES,
    ContentFile,
    ManifestEntry,
    ManifestFile,
    read_manifest,
)
from icecrypt.table.files.metadata import Snapshot
from icecrypt.table.model.metadata_columns import partition_type as unified_partition_type
from icecrypt.table.model.schema import arrow_storage_type, partition_struct

if TYPE_CHECKING:
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.types import StructType

    from icecrypt.table.commit.state import TableView

__all__ = ["METADATA_TABLES", "InspectTable"]

#: The ones that show one snapshot (the current one unless ``snapshot_id`` is given).
_SNAPSHOT_TABLES = frozenset({"manifests", "entries", "files", "data_files", "delete_files", "partitions",
                              "position_deletes"})


def _key_fingerprint(key_metadata: Any) -> str | None:
    """The fingerprint of a file's key (never the key metadata, which holds the key)."""
    if key_metadata is None:
        return None
    from icecrypt.table.files.io import fingerprint

    return fingerprint(key_metadata)


def _int_map(raw: Any) -> list[tuple[int, Any]] | None:
    """An Iceberg int-keyed map as read from a manifest record, as Arrow map items."""
    if raw is None:
        return None
    if isinstance(raw, dict):
        return [(int(k), v) for k, v in raw.items()]
    return [(item["key"], item["value"]) for item in raw]


_DAY_IN = {"timestamp": 86_400_000_000, "timestamp_ns": 86_400_000_000_000}


def _promoted_bound(field_type: Any, value: bytes, from_bytes: Any) -> Any:
    """A bound decoded as the spec says for a promoted column: bounds keep the type the
    file was written with, so a 4-byte bound of a timestamp / timestamp_ns column is the
    date it was before the v3 promotion (its midnight, in the column's unit)."""
    from pyiceberg.types import DateType, TimestampNanoType, TimestampType

    if isinstance(field_type, (TimestampType, TimestampNanoType)) and len(value) == 4:
        unit = "timestamp_ns" if isinstance(field_type, TimestampNanoType) else "timestamp"
        return from_bytes(DateType(), value) * _DAY_IN[unit]
    return from_bytes(field_type, value)


def _table_from_rows(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """``pa.Table.from_pylist`` for a schema that may nest extension types (a uuid
    bound or partition value in a struct), which Arrow cannot build from Python values
    directly: built on the storage types, then cast to ``schema``."""
    storage = pa.schema([f.with_type(arrow_storage_type(f.type)) for f in schema])
    if storage == schema:
        return pa.Table.from_pylist(rows, schema=schema)
    return pa.Table.from_pylist(rows, schema=storage).cast(schema)


def _arrow_value(value: Any) -> Any:
    """A value as Arrow takes it for the type PyIceberg's ``schema_to_pyarrow`` gives."""
    return value.bytes if isinstance(value, uuid.UUID) else value


_SUMMARY = pa.struct([
    pa.field("contains_null", pa.bool_(), nullable=False),
    pa.field("contains_nan", pa.bool_(), nullable=True),
    pa.field("lower_bound", pa.string(), nullable=True),
    pa.field("upper_bound", pa.string(), nullable=True),
])  # fmt: skip

_MANIFESTS = pa.schema([
    pa.field("content", pa.int8(), nullable=False),
    pa.field("path", pa.string(), nullable=False),
    pa.field("length", pa.int64(), nullable=False),
    pa.field("partition_spec_id", pa.int32(), nullable=False),
    pa.field("added_snapshot_id", pa.int64(), nullable=False),
    pa.field("added_data_files_count", pa.int32(), nullable=False),
    pa.field("existing_data_files_count", pa.int32(), nullable=False),
    pa.field("deleted_data_files_count", pa.int32(), nullable=False),
    pa.field("added_delete_files_count", pa.int32(), nullable=False),
    pa.field("existing_delete_files_count", pa.int32(), nullable=False),
    pa.field("deleted_delete_files_count", pa.int32(), nullable=False),
    pa.field("partition_summaries", pa.list_(_SUMMARY), nullable=False),
])  # fmt: skip

_ALL_MANIFESTS = _MANIFESTS.append(pa.field("reference_snapshot_id", pa.int64(), nullable=False)).append(
    pa.field("key_metadata", pa.string(), nullable=True)
)

_PARTITION_COUNTS = [
    pa.field("record_count", pa.int64(), nullable=False),
    pa.field("file_count", pa.int32(), nullable=False),
    pa.field("total_data_file_size_in_bytes", pa.int64(), nullable=False),
    pa.field("position_delete_record_count", pa.int64(), nullable=False),
    pa.field("position_delete_file_count", pa.int32(), nullable=False),
    pa.field("equality_delete_record_count", pa.int64(), nullable=False),
    pa.field("equality_delete_file_count", pa.int32(), nullable=False),
    pa.field("last_updated_at", pa.timestamp("ms"), nullable=True),
    pa.field("last_updated_snapshot_id", pa.int64(), nullable=True),
]


class InspectTable:
    """The metadata tables of an :class:`~icecrypt.table.EncryptedTable`, as Arrow tables
    (``table.inspect``).  They show the version the table object holds (call
    ``table.refresh()`` first to see newer commits).  ``snapshot_id`` selects the
    snapshot of the per-snapshot tables (default: the current one)."""

    def __init__(self, table: TableView):
        self._table = table

    def table(self, name: str, *, snapshot_id: int | None = None) -> pa.Table:
        """The metadata table ``name`` (one of :data:`METADATA_TABLES`)."""
        if name not in METADATA_TABLES:
            raise ValueError(f"unknown metadata table {name!r}; the metadata tables are: {', '.join(METADATA_TABLES)}")
        if snapshot_id is not None:
            if name not in _SNAPSHOT_TABLES:
                raise ValueError(f"metadata table {name!r} shows the whole table and takes no snapshot id")
            return getattr(self, name)(snapshot_id=snapshot_id)
        return getattr(self, name)()

    # --- the table's metadata document ---------------------------------------------------

    def snapshots(self) -> pa.Table:
        """One row per snapshot: ``committed_at``, ``snapshot_id``, ``parent_id``,
        ``operation``, ``manifest_list`` and ``summary`` (without the operation)."""
        schema = pa.schema([
            pa.field("committed_at", pa.timestamp("ms"), nullable=False),
            pa.field("snapshot_id", pa.int64(), nullable=False),
            pa.field("parent_id", pa.int64(), nullable=True),
            pa.field("operation", pa.string(), nullable=True),
            pa.field("manifest_list", pa.string(), nullable=False),
            pa.field("summary", pa.map_(pa.string(), pa.string()), nullable=True),
        ])  # fmt: skip
        rows = [
            {
                "committed_at": s.timestamp_ms,
                "snapshot_id": s.snapshot_id,
                "parent_id": s.parent_snapshot_id,
                "operation": s.operation,
                "manifest_list": s.manifest_list,
                "summary": [(k, str(v)) for k, v in s.summary.items() if k != "operation"],
            }
            for s in self._table.snapshots()
        ]
        return pa.Table.from_pylist(rows, schema=schema)

    def history(self) -> pa.Table:
        """The snapshot log: when each snapshot became current (``made_current_at``),
        its ``parent_id``, and whether it is an ancestor of the current snapshot."""
        schema = pa.schema([
            pa.field("made_current_at", pa.timestamp("ms"), nullable=False),
            pa.field("snapshot_id", pa.int64(), nullable=False),
            pa.field("parent_id", pa.int64(), nullable=True),
            pa.field("is_current_ancestor", pa.bool_(), nullable=False),
        ])  # fmt: skip
        ancestors = self._ancestors(self._table.current_snapshot_id)
        rows = []
        for entry in self._snapshot_log():
            snapshot_id = int(entry["snapshot-id"])
            snapshot = self._table._snapshots.get(snapshot_id)
            rows.append({
                "made_current_at": int(entry["timestamp-ms"]),
                "snapshot_id": snapshot_id,
                "parent_id": snapshot.parent_snapshot_id if snapshot is not None else None,
                "is_current_ancestor": snapshot_id in ancestors,
            })  # fmt: skip
        return pa.Table.from_pylist(rows, schema=schema)

    def refs(self) -> pa.Table:
        """Branches and tags: ``name``, ``type`` (BRANCH or TAG), ``snapshot_id`` and the
        retention settings."""
        schema = pa.schema([
            pa.field("name", pa.string(), nullable=False),
            pa.field("type", pa.dictionary(pa.int32(), pa.string()), nullable=False),
            pa.field("snapshot_id", pa.int64(), nullable=False),
            pa.field("max_reference_age_in_ms", pa.int64(), nullable=True),
            pa.field("min_snapshots_to_keep", pa.int32(), nullable=True),
            pa.field("max_snapshot_age_in_ms", pa.int64(), nullable=True),
        ])  # fmt: skip
        rows = [
            {
                "name": name,
                "type": str(getattr(ref.snapshot_ref_type, "value", ref.snapshot_ref_type)).upper(),
                "snapshot_id": ref.snapshot_id,
                "max_reference_age_in_ms": ref.max_ref_age_ms,
                "min_snapshots_to_keep": ref.min_snapshots_to_keep,
                "max_snapshot_age_in_ms": ref.max_snapshot_age_ms,
            }
            for name, ref in self._table.model.refs.items()
        ]
        return pa.Table.from_pylist(rows, schema=schema)

    def metadata_log_entries(self) -> pa.Table:
        """The metadata files of the table's history (``metadata-log``), then the current
        one, each with the snapshot, schema and sequence number current at its time."""
        schema = pa.schema([
            pa.field("timestamp", pa.timestamp("ms"), nullable=False),
            pa.field("file", pa.string(), nullable=False),
            pa.field("latest_snapshot_id", pa.int64(), nullable=True),
            pa.field("latest_schema_id", pa.int32(), nullable=True),
            pa.field("latest_sequence_number", pa.int64(), nullable=True),
        ])  # fmt: skip
        metadata = self._table.metadata
        entries = [(e["timestamp-ms"], e["metadata-file"]) for e in self._log("metadata-log", "metadata-file", str)]
        entries.append((int(metadata.get("last-updated-ms") or 0), self._recorded(self._table.metadata_location)))
        log = sorted(((int(e["timestamp-ms"]), int(e["snapshot-id"])) for e in self._snapshot_log()), key=lambda e: e[0])
        rows = []
        for timestamp, file in entries:
            latest = None
            for made_current, snapshot_id in log:
                if made_current > timestamp:
                    break
                latest = self._table._snapshots.get(snapshot_id)
            rows.append({
                "timestamp": timestamp,
                "file": file,
                "latest_snapshot_id": latest.snapshot_id if latest else None,
                "latest_schema_id": latest.schema_id if latest else None,
                "latest_sequence_number": latest.sequence_number if latest else None,
            })  # fmt: skip
        return pa.Table.from_pylist(rows, schema=schema)

    # --- manifest lists -------------------------------------------------------------------

    def manifests(self, snapshot_id: int | None = None) -> pa.Table:
        """The manifests of a snapshot (its manifest list, authenticated), with file counts
        and per-partition-field summaries (bounds as readable strings)."""
        snapshot = self._snapshot(snapshot_id)
        if snapshot is None:
            return _MANIFESTS.empty_table()
        rows = [self._manifest_row(m) for m in self._table.manifests(snapshot)]
        return pa.Table.from_pylist(rows, schema=_MANIFESTS)

    def all_manifests(self) -> pa.Table:
        """The manifests of every snapshot (a manifest shared by several snapshots shows
        once for each), with ``reference_snapshot_id`` and the key's fingerprint."""
        rows = []
        for snapshot in self._table.snapshots():
            for manifest in self._table.manifests(snapshot):
                row = self._manifest_row(manifest)
                row["reference_snapshot_id"] = snapshot.snapshot_id
                row["key_metadata"] = _key_fingerprint(manifest.key_metadata)
                rows.append(row)
        return pa.Table.from_pylist(rows, schema=_ALL_MANIFESTS)

    def _manifest_row(self, manifest: ManifestFile) -> dict[str, Any]:
        record = manifest.record

        def count(v2: str, v1: str) -> int:
            value = record.get(v2, record.get(v1))
            return int(value) if value is not None else 0

        counts = (
            count("added_files_count", "added_data_files_count"),
            count("existing_files_count", "existing_data_files_count"),
            count("deleted_files_count", "deleted_data_files_count"),
        )
        deletes = manifest.content == MANIFEST_DELETES
        zero = (0, 0, 0)
        data_counts, delete_counts = (zero, counts) if deletes else (counts, zero)
        return {
            "content": manifest.content,
            "path": manifest.path,
            "length": manifest.length,
            "partition_spec_id": manifest.spec_id,
            "added_snapshot_id": manifest.added_snapshot_id,
            "added_data_files_count": data_counts[0],
            "existing_data_files_count": data_counts[1],
            "deleted_data_files_count": data_counts[2],
            "added_delete_files_count": delete_counts[0],
            "existing_delete_files_count": delete_counts[1],
            "deleted_delete_files_count": delete_counts[2],
            "partition_summaries": self._summaries(manifest),
        }

    def _summaries(self, manifest: ManifestFile) -> list[dict[str, Any]]:
        from pyiceberg.conversions import from_bytes
        from pyiceberg.types import UnknownType

        if not manifest.partitions:
            return []
        spec = self._table.specs.get(manifest.spec_id)
        if spec is None:
            raise FormatError(f"manifest {manifest.path}: unknown partition spec id {manifest.spec_id}")
        # typed as Java types them: a field whose source was dropped has the type its
        # transform gives an unknown source (bucket: int; identity: unknown, no bound shown)
        types = [f.field_type for f in partition_struct(spec, self._table.schema, unknown_dropped=True).fields]
        if len(types) != len(manifest.partitions):
            raise FormatError(
                f"manifest list entry of {manifest.path}: {len(manifest.partitions)} partition summaries "
                f"for the {len(types)} fields of partition spec {spec.spec_id}"
            )

        def human(field: Any, field_type: Any, bound: bytes | None) -> str | None:
            if not bound or isinstance(field_type, UnknownType):
                return None
            try:
                return field.transform.to_human_string(field_type, from_bytes(field_type, bound))
            except Exception as exc:  # a bound that does not decode as its type
                raise FormatError(f"manifest list entry of {manifest.path}: partition bound of {field.name!r} "
                                  f"does not decode as {field_type} ({type(exc).__name__})") from None

        return [
            {
                "contains_null": summary.contains_null,
                "contains_nan": summary.contains_nan,
                "lower_bound": human(field, field_type, summary.lower_bound),
                "upper_bound": human(field, field_type, summary.upper_bound),
            }
            for field, field_type, summary in zip(spec.fields, types, manifest.partitions)
        ]

    # --- manifests ------------------------------------------------------------------------

    def entries(self, snapshot_id: int | None = None) -> pa.Table:
        """Every entry of every manifest of a snapshot, DELETED ones included: ``status``
        (0 existing, 1 added, 2 deleted), the snapshot and sequence numbers it has (the
        inherited ones filled in), ``data_file`` and ``readable_metrics``."""
        return self._entry_table(self._entries(snapshot_id, include_deleted=True))

    def all_entries(self) -> pa.Table:
        """``entries`` of every manifest of every snapshot, each manifest read once (as
        Iceberg's ``all_entries``): entries only older snapshots still reach, too."""
        return self._entry_table(self._all_entries())

    def _all_entries(self) -> Iterator[ManifestEntry]:
        for manifest in self._manifests_once(self._table.snapshots()):
            yield from self._checked(manifest, self._read(manifest, include_deleted=True))

    def _entry_table(self, entries: Iterator[ManifestEntry]) -> pa.Table:
        files = self._file_fields()
        schema = pa.schema([
            pa.field("status", pa.int8(), nullable=False),
            pa.field("snapshot_id", pa.int64(), nullable=False),
            pa.field("sequence_number", pa.int64(), nullable=False),
            pa.field("file_sequence_number", pa.int64(), nullable=False),
            pa.field("data_file", pa.struct(files[:-1]), nullable=False),
            files[-1],
        ])  # fmt: skip
        rows = []
        for entry in entries:
            data_file = self._file_row(entry)
            metrics = data_file.pop("readable_metrics")
            rows.append({
                "status": entry.status,
                "snapshot_id": entry.snapshot_id,
                "sequence_number": entry.sequence_number,
                "file_sequence_number": entry.file_sequence_number,
                "data_file": data_file,
                "readable_metrics": metrics,
            })  # fmt: skip
        return _table_from_rows(rows, schema)

    def files(self, snapshot_id: int | None = None) -> pa.Table:
        """The live data and delete files of a snapshot, one row each."""
        return self._files(snapshot_id, (DATA, POSITION_DELETES, EQUALITY_DELETES))

    def data_files(self, snapshot_id: int | None = None) -> pa.Table:
        """The live data files of a snapshot."""
        return self._files(snapshot_id, (DATA,))

    def delete_files(self, snapshot_id: int | None = None) -> pa.Table:
        """The live delete files (deletion vectors, position and equality deletes)."""
        return self._files(snapshot_id, (POSITION_DELETES, EQUALITY_DELETES))

    def all_files(self) -> pa.Table:
        """The live data and delete files of every manifest of every snapshot (each
        manifest read once; a file kept by several manifests shows once per manifest)."""
        return self._all_files((DATA, POSITION_DELETES, EQUALITY_DELETES))

    def all_data_files(self) -> pa.Table:
        """``all_files`` for data files."""
        return self._all_files((DATA,))

    def all_delete_files(self) -> pa.Table:
        """``all_files`` for delete files."""
        return self._all_files((POSITION_DELETES, EQUALITY_DELETES))

    def position_deletes(self, snapshot_id: int | None = None) -> pa.Table:
        """Every row position deleted by a position delete file or a deletion vector of a
        snapshot, one row each, as Iceberg's ``position_deletes`` table: the data file
        (``file_path``) and position (``pos``), ``row`` (null: the deleted row's values,
        which icecrypt's and Iceberg Java's writers do not store), the data file's
        ``partition`` (left out when no spec has a field) and ``spec_id``, the delete file
        (``delete_file_path``) and, in format 3, a deletion vector's ``content_offset`` and
        ``content_size_in_bytes`` (null for a position delete file).  Each delete file is
        read and authenticated as a scan reads it, for the data files it applies to."""
        from pyiceberg.io.pyarrow import schema_to_pyarrow

        from icecrypt.table.files.manifest import EQUALITY_DELETES
        from icecrypt.table.files.read import _POSITION_DELETE_SCHEMA, _check_key, _delete_file_table, _dv_positions
        from icecrypt.table.model.metadata_columns import PARTITION_ID, PARTITION_NAME, partition_type
        from icecrypt.table.read.scan import TableScan

        table = self._table
        snapshot = self._snapshot(snapshot_id)
        schema = table.schema_for(snapshot) if snapshot is not None else table.schema
        unified = partition_type(table.specs, schema)
        fields = [
            pa.field("file_path", pa.string(), nullable=False),
            pa.field("pos", pa.int64(), nullable=False),
            pa.field("row", pa.struct(list(schema_to_pyarrow(schema)))),
        ]
        if unified.fields:
            fields.append(pa.field("partition", schema_to_pyarrow(unified), nullable=False))
        fields += [pa.field("spec_id", pa.int32(), nullable=False), pa.field("delete_file_path", pa.string(), nullable=False)]
        if table.format_version >= 3:
            fields += [pa.field("content_offset", pa.int64()), pa.field("content_size_in_bytes", pa.int64())]
        out_schema = pa.schema(fields)
        if snapshot is None:
            return out_schema.empty_table()
        fs, encrypted = table.filesystem, table.encrypted
        columns: dict[str, list[Any]] = {f.name: [] for f in fields}
        seen: set[tuple[str, int | None]] = set()
        # the scan plans each file's _partition value (over every spec's fields) when projected
        scan = TableScan(table, columns=[PARTITION_NAME] if unified.fields else None, snapshot_id=snapshot.snapshot_id)
        for task in scan.plan_files():
            partition = {k: _arrow_value(v) for k, v in task.constants.get(PARTITION_ID, {}).items()}
            for delete in task.deletes:
                if delete.content == EQUALITY_DELETES or (delete.path, delete.content_offset) in seen:
                    continue
                seen.add((delete.path, delete.content_offset))
                _check_key(delete, encrypted)
                if delete.is_dv:
                    positions = _dv_positions(delete, fs, encrypted).tolist()
                    paths = [task.file.path] * len(positions)
                else:
                    rows = _delete_file_table(delete, fs, _POSITION_DELETE_SCHEMA, encrypted)
                    paths, positions = rows.column("file_path").to_pylist(), rows.column("pos").to_pylist()
                n = len(positions)
                columns["file_path"] += paths
                columns["pos"] += positions
                columns["row"] += [None] * n
                if unified.fields:
                    columns["partition"] += [partition] * n
                columns["spec_id"] += [task.spec_id] * n
                columns["delete_file_path"] += [delete.path] * n
                if "content_offset" in columns:
                    columns["content_offset"] += [delete.content_offset if delete.is_dv else None] * n
                    columns["content_size_in_bytes"] += [delete.content_size_in_bytes if delete.is_dv else None] * n
        return pa.table(columns, schema=out_schema)

    def partitions(
        self,
        snapshot_id: int | None = None,
        row_filter: BooleanExpression | str | None = None,
        *,
        case_sensitive: bool = True,
    ) -> pa.Table:
        """One row per partition of a snapshot's live files: record and file counts of
        its data files, position and equality deletes, and when it last changed.  An
        unpartitioned table has one row and no ``partition``/``spec_id`` columns.
        ``row_filter`` keeps the partitions that may hold matching rows."""
        from pyiceberg.io.pyarrow import schema_to_pyarrow

        snapshot = self._snapshot(snapshot_id)
        manifests = self._table.manifests(snapshot) if snapshot is not None else []
        partition_type = unified_partition_type({i: self._table.specs[i] for i in {m.spec_id for m in manifests}
                                                 if i in self._table.specs}, self._table.schema)
        names = {f.field_id: f.name for f in partition_type.fields}  # the struct's own names
        fields = list(_PARTITION_COUNTS)
        if partition_type.fields:
            fields[:0] = [
                pa.field("partition", schema_to_pyarrow(partition_type), nullable=False),
                pa.field("spec_id", pa.int32(), nullable=False),
            ]
        schema = pa.schema(fields)
        evaluators = None
        if row_filter is not None:
            from pyiceberg.expressions.visitors import bind

            from icecrypt.table.read.scan import _Evaluators, parse_row_filter

            expression = parse_row_filter(row_filter)
            bind(self._table.schema, expression, case_sensitive)  # an unknown column fails here
            evaluators = _Evaluators(self._table, self._table.schema, expression, case_sensitive)
            manifests = [m for m in manifests if evaluators.manifest(m)]
        groups: dict[tuple, dict[str, Any]] = {}
        for manifest in manifests:
            for entry in self._read(manifest):
                file = entry.file
                if evaluators is not None and not evaluators.partition(file):
                    continue
                partition = self._partition(file, names)
                key = tuple(sorted(partition.items(), key=lambda item: item[0]))  # as Java: by value, across specs
                row = groups.get(key)
                if row is None:
                    row = groups[key] = {
                        "partition": partition, "spec_id": file.spec_id, "record_count": 0, "file_count": 0,
                        "total_data_file_size_in_bytes": 0, "position_delete_record_count": 0,
                        "position_delete_file_count": 0, "equality_delete_record_count": 0,
                        "equality_delete_file_count": 0, "last_updated_at": None, "last_updated_snapshot_id": None,
                    }  # fmt: skip
                changed = self._table._snapshots.get(entry.snapshot_id)
                if changed is not None and (row["last_updated_at"] is None or row["last_updated_at"] < changed.timestamp_ms):
                    row["last_updated_at"] = changed.timestamp_ms
                    row["last_updated_snapshot_id"] = changed.snapshot_id
                if file.content == DATA:
                    row["record_count"] += file.record_count
                    row["file_count"] += 1
                    row["total_data_file_size_in_bytes"] += file.file_size_in_bytes
                elif file.content == POSITION_DELETES:
                    row["position_delete_record_count"] += file.record_count
                    row["position_delete_file_count"] += 1
                else:
                    row["equality_delete_record_count"] += file.record_count
                    row["equality_delete_file_count"] += 1
        return _table_from_rows(list(groups.values()), schema)

    # --- helpers --------------------------------------------------------------------------

    def _snapshot(self, snapshot_id: int | None) -> Snapshot | None:
        if snapshot_id is None:
            return self._table.current_snapshot()
        try:
            return self._table.snapshot(snapshot_id)
        except KeyError as exc:
            raise ValueError(exc.args[0]) from None

    def _recorded(self, path: str) -> str:
        """A path on the filesystem as the table records locations (a ``location_map``
        applied backwards), so the current metadata file reads like the ones before it."""
        for prefix, replacement in self._table.location_map.items():
            if replacement and path.startswith(replacement):
                return prefix + path[len(replacement):]
        return path

    def _snapshot_log(self) -> list[dict[str, Any]]:
        return self._log("snapshot-log", "snapshot-id", int)

    def _log(self, name: str, field: str, kind: type) -> list[dict[str, Any]]:
        """The entries of ``snapshot-log`` or ``metadata-log``, each checked to hold an
        integer ``timestamp-ms`` and ``field`` of type ``kind`` (FormatError otherwise)."""
        entries = self._table.metadata.get(name) or []
        if not isinstance(entries, list) or not all(
            isinstance(e, dict) and type(e.get("timestamp-ms")) is int and isinstance(e.get(field), kind)
            and not isinstance(e.get(field), bool)
            for e in entries
        ):  # fmt: skip
            raise FormatError(f"{self._table.metadata_location}: malformed {name} (each entry needs an integer "
                              f"timestamp-ms and a {kind.__name__} {field})")
        return entries

    def _ancestors(self, snapshot_id: int | None) -> set[int]:
        seen: set[int] = set()
        while snapshot_id is not None and snapshot_id not in seen:
            snapshot = self._table._snapshots.get(snapshot_id)
            if snapshot is None:
                break
            seen.add(snapshot_id)
            snapshot_id = snapshot.parent_snapshot_id
        return seen

    def _read(self, manifest: ManifestFile, *, include_deleted: bool = False) -> Iterator[ManifestEntry]:
        table = self._table
        return read_manifest(
            manifest, table.locations, table.specs, table.schema, encrypted=table.encrypted, include_deleted=include_deleted
        )

    def _entries(self, snapshot_id: int | None, *, include_deleted: bool = False) -> Iterator[ManifestEntry]:
        snapshot = self._snapshot(snapshot_id)
        if snapshot is None:
            return
        for manifest in self._table.manifests(snapshot):
            yield from self._checked(manifest, self._read(manifest, include_deleted=include_deleted))

    @staticmethod
    def _checked(manifest: ManifestFile, entries: Iterator[ManifestEntry]) -> Iterator[ManifestEntry]:
        """Entries whose content matches their manifest's (as planning checks them)."""
        from icecrypt.table.read.scan import TableScan

        return TableScan._checked(manifest, entries)

    def _files(self, snapshot_id: int | None, contents: tuple[int, ...]) -> pa.Table:
        snapshot = self._snapshot(snapshot_id)
        return self._file_table([snapshot] if snapshot is not None else [], contents)

    def _all_files(self, contents: tuple[int, ...]) -> pa.Table:
        return self._file_table(self._table.snapshots(), contents)

    def _manifests_once(self, snapshots: list[Snapshot]) -> Iterator[ManifestFile]:
        """The manifests of the given snapshots, each once (a manifest several snapshots
        share is read once)."""
        seen: set[str] = set()
        for snapshot in snapshots:
            for manifest in self._table.manifests(snapshot):
                if manifest.path not in seen:
                    seen.add(manifest.path)
                    yield manifest

    def _file_table(self, snapshots: list[Snapshot], contents: tuple[int, ...]) -> pa.Table:
        """The live files of the given snapshots' manifests (each manifest read once)."""
        rows = []
        for manifest in self._manifests_once(snapshots):
            for entry in self._checked(manifest, self._read(manifest)):
                if entry.file.content in contents:
                    rows.append(self._file_row(entry))
        return _table_from_rows(rows, pa.schema(self._file_fields()))

    def _metric_columns(self) -> list[tuple[str, int, Any]]:
        """(full name, field id, type) of every primitive column of the current schema, in
        schema order (the columns of ``readable_metrics``)."""
        from pyiceberg.types import ListType, MapType, NestedField, StructType

        schema = self._table.schema
        cached = getattr(self, "_metric_cache", None)
        if cached is not None and cached[0] is schema:
            return cached[1]
        result: list[tuple[str, int, Any]] = []

        def walk(field: NestedField) -> None:
            t = field.field_type
            if isinstance(t, StructType):
                for f in t.fields:
                    walk(f)
            elif isinstance(t, ListType):
                walk(t.element_field)
            elif isinstance(t, MapType):
                walk(t.key_field)
                walk(t.value_field)
            else:
                result.append((schema.find_column_name(field.field_id), field.field_id, t))

        for f in schema.fields:
            walk(f)
        self._metric_cache = (schema, result)
        return result

    def _file_fields(self) -> list[pa.Field]:
        from pyiceberg.io.pyarrow import schema_to_pyarrow

        partition: StructType = unified_partition_type(self._table.specs, self._table.schema)
        metrics = pa.struct([
            pa.field(name, pa.struct([
                pa.field("column_size", pa.int64()),
                pa.field("value_count", pa.int64()),
                pa.field("null_value_count", pa.int64()),
                pa.field("nan_value_count", pa.int64()),
                pa.field("lower_bound", schema_to_pyarrow(field_type)),
                pa.field("upper_bound", schema_to_pyarrow(field_type)),
            ]), nullable=False)
            for name, _, field_type in self._metric_columns()
        ])  # fmt: skip
        return [
            pa.field("content", pa.int8(), nullable=False),
            pa.field("file_path", pa.string(), nullable=False),
            pa.field("file_format", pa.dictionary(pa.int32(), pa.string()), nullable=False),
            pa.field("spec_id", pa.int32(), nullable=False),
            pa.field("partition", schema_to_pyarrow(partition), nullable=False),
            pa.field("record_count", pa.int64(), nullable=False),
            pa.field("file_size_in_bytes", pa.int64(), nullable=False),
            pa.field("column_sizes", pa.map_(pa.int32(), pa.int64())),
            pa.field("value_counts", pa.map_(pa.int32(), pa.int64())),
            pa.field("null_value_counts", pa.map_(pa.int32(), pa.int64())),
            pa.field("nan_value_counts", pa.map_(pa.int32(), pa.int64())),
            pa.field("lower_bounds", pa.map_(pa.int32(), pa.binary())),
            pa.field("upper_bounds", pa.map_(pa.int32(), pa.binary())),
            pa.field("key_metadata", pa.string()),  # the key's fingerprint, never the key metadata
            pa.field("split_offsets", pa.list_(pa.int64())),
            pa.field("equality_ids", pa.list_(pa.int32())),
            pa.field("sort_order_id", pa.int32()),
            pa.field("first_row_id", pa.int64()),
            pa.field("referenced_data_file", pa.string()),
            pa.field("content_offset", pa.int64()),
            pa.field("content_size_in_bytes", pa.int64()),
            pa.field("readable_metrics", metrics),
        ]

    def _partition(self, file: ContentFile, names: dict[int, str] | None = None) -> dict[str, Any]:
        """A file's partition as a ``partition`` column holds it: by partition field id under
        the name ``names`` gives it (default: the newest spec's), without the fields it
        leaves out (those whose source was dropped)."""
        names = self._partition_names() if names is None else names
        spec = self._table.specs[file.spec_id]
        return {names[field.field_id]: _arrow_value(value) for field, value in zip(spec.fields, file.partition)
                if field.field_id in names}

    def _partition_names(self) -> dict[int, str]:
        model = self._table.model  # replaced when the table object moves to another version
        cached = getattr(self, "_names_cache", None)
        if cached is None or cached[0] is not model:
            unified = unified_partition_type(self._table.specs, self._table.schema)
            cached = self._names_cache = (model, {f.field_id: f.name for f in unified.fields})
        return cached[1]

    def _file_row(self, entry: ManifestEntry) -> dict[str, Any]:
        file = entry.file
        raw = entry.record["data_file"]
        return {
            "content": file.content,
            "file_path": file.file_path,
            "file_format": file.file_format,
            "spec_id": file.spec_id,
            "partition": self._partition(file),
            "record_count": file.record_count,
            "file_size_in_bytes": file.file_size_in_bytes,
            "column_sizes": _int_map(raw.get("column_sizes")),
            "value_counts": _int_map(raw.get("value_counts")),
            "null_value_counts": _int_map(raw.get("null_value_counts")),
            "nan_value_counts": _int_map(raw.get("nan_value_counts")),
            "lower_bounds": _int_map(raw.get("lower_bounds")),
            "upper_bounds": _int_map(raw.get("upper_bounds")),
            "key_metadata": _key_fingerprint(file.key_metadata),
            "split_offsets": list(file.split_offsets) if file.split_offsets is not None else None,
            "equality_ids": list(file.equality_ids) if file.equality_ids is not None else None,
            "sort_order_id": raw.get("sort_order_id"),
            "first_row_id": file.first_row_id,
            "referenced_data_file": file.referenced_data_file,
            "content_offset": file.content_offset,
            "content_size_in_bytes": file.content_size_in_bytes,
            "readable_metrics": self._readable_metrics(file, raw),
        }

    def _readable_metrics(self, file: ContentFile, raw: dict[str, Any]) -> dict[str, Any] | None:
        from pyiceberg.conversions import from_bytes

        columns = self._metric_columns()
        if not columns:
            return None
        sizes = dict(_int_map(raw.get("column_sizes")) or ())

        def bound(bounds: Any, field_id: int, name: str, field_type: Any) -> Any:
            value = bounds.get(field_id)
            if value is None:
                return None
            try:
                return _arrow_value(_promoted_bound(field_type, value, from_bytes))
            except Exception as exc:  # a bound that does not decode as its type
                raise FormatError(f"manifest entry of {file.file_path}: bound of column {name!r} does not decode "
                                  f"as {field_type} ({type(exc).__name__})") from None

        return {
            name: {
                "column_size": sizes.get(field_id),
                "value_count": file.value_counts.get(field_id),
                "null_value_count": file.null_value_counts.get(field_id),
                "nan_value_count": file.nan_value_counts.get(field_id),
                "lower_bound": bound(file.lower_bounds, field_id, name, field_type),
                "upper_bound": bound(file.upper_bounds, field_id, name, field_type),
            }
            for name, field_id, field_type in columns
        }

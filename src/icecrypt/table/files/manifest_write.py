"""Manifests and manifest lists of format version 3, written as Iceberg Java writes them.

The Avro schemas are built from the Iceberg structs below with Java's naming rules (see
``_write_schema.struct_to_avro``) so field names, ids, types, docs and record names match
the files in ``../shared/tables`` (a test compares them).  Entries are plain dicts in
the Avro record shape, which is also what reading a manifest returns, so carried-over
entries are rewritten without conversion.

Key metadata: each data or delete file's goes in field 131 of its entry; each manifest's
(with ``file_length``, as Java does for Avro manifests) in field 519 of the manifest list;
the manifest list's own is returned to the caller, which wraps it with the KEK.
"""

from __future__ import annotations

import datetime
import json
import math
import uuid as uuidlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyiceberg.conversions import to_bytes
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampNanoType,
    TimestampType,
    TimestamptzNanoType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from icecrypt.errors import FormatError
from icecrypt.keys import StandardKeyMetadata
from icecrypt.table.files.write_io import TableIO
from icecrypt.table.model.schema import (
    partition_struct,
    schema_to_json,
    spec_fields_to_json,
    struct_to_avro,
    struct_to_json,
)

__all__ = [
    "ADDED",
    "DELETED",
    "EXISTING",
    "ManifestSummary",
    "manifest_entry_struct",
    "manifest_list_struct",
    "resolve_entries",
    "to_internal",
    "write_manifest",
    "write_manifest_list",
]

FORMAT_VERSION = 3

# manifest entry status
EXISTING, ADDED, DELETED = 0, 1, 2
# data_file content / manifest content
DATA, POSITION_DELETES, EQUALITY_DELETES = 0, 1, 2


def _map(field_id: int, name: str, key_id: int, value_id: int, value_type: IcebergType, doc: str) -> NestedField:
    return NestedField(
        field_id,
        name,
        MapType(key_id, IntegerType(), value_id, value_type, value_required=True),
        required=False,
        doc=doc,
    )


def data_file_struct(partition_type: StructType) -> StructType:
    """Java's v3 ``data_file`` struct (field 2 of a manifest entry)."""
    return StructType(
        NestedField(134, "content", IntegerType(), required=True,
                    doc="Contents of the file: 0=data, 1=position deletes, 2=equality deletes"),
        NestedField(100, "file_path", StringType(), required=True, doc="Location URI with FS scheme"),
        NestedField(101, "file_format", StringType(), required=True, doc="File format name: avro, orc, or parquet"),
        NestedField(102, "partition", partition_type, required=True,
                    doc="Partition data tuple, schema based on the partition spec"),
        NestedField(103, "record_count", LongType(), required=True, doc="Number of records in the file"),
        NestedField(104, "file_size_in_bytes", LongType(), required=True, doc="Total file size in bytes"),
        _map(108, "column_sizes", 117, 118, LongType(), "Map of column id to total size on disk"),
        _map(109, "value_counts", 119, 120, LongType(), "Map of column id to total count, including null and NaN"),
        _map(110, "null_value_counts", 121, 122, LongType(), "Map of column id to null value count"),
        _map(137, "nan_value_counts", 138, 139, LongType(), "Map of column id to number of NaN values in the column"),
        _map(125, "lower_bounds", 126, 127, BinaryType(), "Map of column id to lower bound"),
        _map(128, "upper_bounds", 129, 130, BinaryType(), "Map of column id to upper bound"),
        NestedField(131, "key_metadata", BinaryType(), required=False, doc="Encryption key metadata blob"),
        NestedField(132, "split_offsets", ListType(133, LongType(), element_required=True), required=False,
                    doc="Splittable offsets"),
        NestedField(135, "equality_ids", ListType(136, IntegerType(), element_required=True), required=False,
                    doc="Equality comparison field IDs"),
        NestedField(140, "sort_order_id", IntegerType(), required=False, doc="Sort order ID"),
        NestedField(142, "first_row_id", LongType(), required=False,
                    doc="The first row ID assigned to the first row in the data file"),
        NestedField(143, "referenced_data_file", StringType(), required=False,
                    doc="Fully qualified location (URI with FS scheme) of a data file that all deletes reference"),
        NestedField(144, "content_offset", LongType(), required=False,
                    doc="The offset in the file where the content starts"),
        NestedField(145, "content_size_in_bytes", LongType(), required=False,
                    doc="The length of referenced content stored in the file"),
    )  # fmt: skip


def manifest_entry_struct(partition_type: StructType) -> StructType:
    """Java's v3 ``manifest_entry`` struct."""
    return StructType(
        NestedField(0, "status", IntegerType(), required=True),
        NestedField(1, "snapshot_id", LongType(), required=False),
        NestedField(3, "sequence_number", LongType(), required=False),
        NestedField(4, "file_sequence_number", LongType(), required=False),
        NestedField(2, "data_file", data_file_struct(partition_type), required=True),
    )


def manifest_list_struct() -> StructType:
    """Java's v3 ``manifest_file`` struct (one record per manifest in a manifest list)."""
    summary = StructType(
        NestedField(509, "contains_null", BooleanType(), required=True,
                    doc="True if any file has a null partition value"),
        NestedField(518, "contains_nan", BooleanType(), required=False,
                    doc="True if any file has a nan partition value"),
        NestedField(510, "lower_bound", BinaryType(), required=False, doc="Partition lower bound for all files"),
        NestedField(511, "upper_bound", BinaryType(), required=False, doc="Partition upper bound for all files"),
    )
    return StructType(
        NestedField(500, "manifest_path", StringType(), required=True, doc="Location URI with FS scheme"),
        NestedField(501, "manifest_length", LongType(), required=True, doc="Total file size in bytes"),
        NestedField(502, "partition_spec_id", IntegerType(), required=True, doc="Spec ID used to write"),
        NestedField(517, "content", IntegerType(), required=True, doc="Contents of the manifest: 0=data, 1=deletes"),
        NestedField(515, "sequence_number", LongType(), required=True,
                    doc="Sequence number when the manifest was added"),
        NestedField(516, "min_sequence_number", LongType(), required=True,
                    doc="Lowest sequence number in the manifest"),
        NestedField(503, "added_snapshot_id", LongType(), required=True, doc="Snapshot ID that added the manifest"),
        NestedField(504, "added_files_count", IntegerType(), required=True, doc="Added entry count"),
        NestedField(505, "existing_files_count", IntegerType(), required=True, doc="Existing entry count"),
        NestedField(506, "deleted_files_count", IntegerType(), required=True, doc="Deleted entry count"),
        NestedField(512, "added_rows_count", LongType(), required=True, doc="Added rows count"),
        NestedField(513, "existing_rows_count", LongType(), required=True, doc="Existing rows count"),
        NestedField(514, "deleted_rows_count", LongType(), required=True, doc="Deleted rows count"),
        NestedField(507, "partitions", ListType(508, summary, element_required=True), required=False,
                    doc="Summary for each partition"),
        NestedField(519, "key_metadata", BinaryType(), required=False, doc="Encryption key metadata blob"),
        NestedField(520, "first_row_id", LongType(), required=False,
                    doc="Starting row ID to assign to new rows in ADDED data files"),
    )  # fmt: skip


def _compact(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


# --- partition values ------------------------------------------------------------------

_EPOCH_DATE = datetime.date(1970, 1, 1)
_EPOCH = datetime.datetime(1970, 1, 1)
_EPOCH_TZ = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def to_internal(value: Any, field_type: IcebergType) -> Any:
    """A partition value in Iceberg's internal representation (days, micros, ...),
    whether it came from Arrow (``date``, ``datetime``) or from reading a manifest."""
    if value is None:
        return None
    if isinstance(field_type, DateType) and isinstance(value, datetime.date):
        return (value - _EPOCH_DATE).days
    if isinstance(field_type, (TimestampType, TimestamptzType)) and isinstance(value, datetime.datetime):
        delta = value - (_EPOCH_TZ if value.tzinfo is not None else _EPOCH)
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    if isinstance(field_type, (TimestampNanoType, TimestamptzNanoType)) and isinstance(value, datetime.datetime):
        return to_internal(value, TimestampType()) * 1000
    if isinstance(field_type, TimeType) and isinstance(value, datetime.time):
        return ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond
    if isinstance(field_type, UUIDType) and isinstance(value, str):
        return uuidlib.UUID(value)
    if isinstance(field_type, UUIDType) and isinstance(value, bytes) and len(value) == 16:
        return uuidlib.UUID(bytes=value)
    return value


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


@dataclass
class _FieldSummary:
    field_type: IcebergType
    contains_null: bool = False
    contains_nan: bool = False
    lower: Any = None
    upper: Any = None

    def update(self, value: Any) -> None:
        value = to_internal(value, self.field_type)
        if value is None:
            self.contains_null = True
        elif _is_nan(value):
            self.contains_nan = True
        else:
            if self.lower is None or value < self.lower:
                self.lower = value
            if self.upper is None or value > self.upper:
                self.upper = value

    def to_record(self) -> dict[str, Any]:
        floating = isinstance(self.field_type, (FloatType, DoubleType))
        return {
            "contains_null": self.contains_null,
            "contains_nan": self.contains_nan if floating else False,
            "lower_bound": None if self.lower is None else to_bytes(self.field_type, self.lower),
            "upper_bound": None if self.upper is None else to_bytes(self.field_type, self.upper),
        }


class ManifestSummary:
    """Counts, lowest data sequence number and partition summaries of one manifest."""

    def __init__(self, partition_type: StructType) -> None:
        self._fields = [(f.name, _FieldSummary(f.field_type)) for f in partition_type.fields]
        self.counts = {ADDED: [0, 0], EXISTING: [0, 0], DELETED: [0, 0]}  # status -> [files, rows]
        self.min_sequence_number: int | None = None

    def add(self, entry: Mapping[str, Any]) -> None:
        status = entry["status"]
        data_file = entry["data_file"]
        self.counts[status][0] += 1
        self.counts[status][1] += data_file["record_count"]
        if status != DELETED:
            seq = entry.get("sequence_number")
            if seq is not None and (self.min_sequence_number is None or seq < self.min_sequence_number):
                self.min_sequence_number = seq
        partition = data_file["partition"]
        for name, summary in self._fields:
            summary.update(partition.get(name))

    def partitions(self) -> list[dict[str, Any]]:
        return [summary.to_record() for _, summary in self._fields]


def _avro_entries(entries: Sequence[dict[str, Any]], partition_type: StructType) -> Sequence[dict[str, Any]]:
    """``entries`` as the Avro writer takes them: a uuid partition value (a ``uuid.UUID``
    from a new data file) becomes its 16 big-endian bytes, the Avro ``fixed`` with logical
    type uuid the spec maps it to and Iceberg Java writes (fastavro takes a UUID only for a
    string).  The caller's entries are left as they are; other entries pass unchanged."""
    uuids = [f.name for f in partition_type.fields if isinstance(f.field_type, UUIDType)]
    if not uuids:
        return entries

    def converted(entry: dict[str, Any]) -> dict[str, Any]:
        partition = entry["data_file"].get("partition") or {}
        if not any(isinstance(partition.get(name), uuidlib.UUID) for name in uuids):
            return entry
        values = {k: v.bytes if k in uuids and isinstance(v, uuidlib.UUID) else v for k, v in partition.items()}
        return {**entry, "data_file": {**entry["data_file"], "partition": values}}

    return [converted(entry) for entry in entries]


@dataclass
class WrittenManifest:
    """A manifest written by this commit, ready for the manifest list.

    ``sequence_number`` / ``min_sequence_number`` are None while they are to be the new
    snapshot's (Java's UNASSIGNED_SEQ): decided when the manifest list is written, so a
    manifest survives a commit retry unchanged."""

    record: dict[str, Any]
    min_sequence_number: int | None
    #: where the row ids its data files hold explicitly (any status) end, if any do
    row_ids_end: int | None = None
    #: the highest sequence number its entries hold explicitly, if any do
    max_sequence_number: int | None = None


def write_manifest(
    io: TableIO,
    location: str,
    entries: Sequence[dict[str, Any]],
    *,
    spec: PartitionSpec,
    schema: Schema,
    content: int,
    schemas: Sequence[Schema] = (),
) -> WrittenManifest:
    """Write one manifest (``content`` 0 = data, 1 = deletes) and return its
    manifest-list record (snapshot id, sequence numbers and first_row_id are filled in
    by :func:`write_manifest_list`).  ``schemas``, the table's schemas, type the fields
    of an older ``spec`` whose source column ``schema`` dropped."""
    partition_type = partition_struct(spec, schema, schemas)
    entry_struct = manifest_entry_struct(partition_type)
    avro_schema = struct_to_avro(entry_struct, "manifest_entry")
    metadata = {
        "schema": _compact(schema_to_json(schema)),
        "partition-spec": _compact(spec_fields_to_json(spec)),
        "partition-spec-id": str(spec.spec_id),
        "format-version": str(FORMAT_VERSION),
        "content": "data" if content == DATA else "deletes",
        "iceberg.schema": _compact(struct_to_json(entry_struct, schema_id=0)),
    }
    summary = ManifestSummary(partition_type)
    for entry in entries:
        summary.add(entry)
    length, key = io.write_avro(location, avro_schema, _avro_entries(entries, partition_type), metadata)
    record = {
        "manifest_path": location,
        "manifest_length": length,
        "partition_spec_id": spec.spec_id,
        "content": content,
        "sequence_number": None,
        "min_sequence_number": None,
        "added_snapshot_id": None,
        "added_files_count": summary.counts[ADDED][0],
        "existing_files_count": summary.counts[EXISTING][0],
        "deleted_files_count": summary.counts[DELETED][0],
        "added_rows_count": summary.counts[ADDED][1],
        "existing_rows_count": summary.counts[EXISTING][1],
        "deleted_rows_count": summary.counts[DELETED][1],
        "partitions": summary.partitions(),
        "key_metadata": key.encode() if key is not None else None,
        "first_row_id": None,
    }
    ends = [
        e["data_file"]["first_row_id"] + e["data_file"]["record_count"]
        for e in entries
        if e["data_file"].get("content", DATA) == DATA and e["data_file"].get("first_row_id") is not None
    ]
    sequence_numbers = [e["sequence_number"] for e in entries if e.get("sequence_number") is not None]
    return WrittenManifest(record, summary.min_sequence_number, max(ends, default=None), max(sequence_numbers, default=None))


def write_manifest_list(
    io: TableIO,
    location: str,
    new_manifests: Iterable[WrittenManifest],
    kept_manifests: Iterable[dict[str, Any]],
    *,
    snapshot_id: int,
    parent_snapshot_id: int | None,
    sequence_number: int,
    first_row_id: int,
    ordered: Sequence[WrittenManifest | dict[str, Any]] | None = None,
) -> tuple[StandardKeyMetadata | None, int]:
    """Write a snapshot's manifest list: new data manifests, kept data manifests, new
    delete manifests, kept delete manifests (Java's order).  ``ordered``, when given,
    is the list in its final order instead (new and kept interleaved, as manifest
    merging leaves them); it holds the same manifests.

    New data manifests get ``first_row_id`` from ``first_row_id`` on, each advancing it
    by its added and existing rows (Java's V3 ``ManifestListWriter``).  Returns the
    manifest list's key metadata (with ``file_length``; None for a plaintext table) and
    the next row id after this snapshot.
    """
    new = list(new_manifests)
    kept = [dict(m) for m in kept_manifests]
    records: list[dict[str, Any]] = []
    next_row_id = first_row_id

    def assigned(manifest: WrittenManifest) -> dict[str, Any]:
        record = dict(manifest.record)
        record["added_snapshot_id"] = snapshot_id
        record["sequence_number"] = sequence_number
        record["min_sequence_number"] = (
            manifest.min_sequence_number if manifest.min_sequence_number is not None else sequence_number
        )
        return record

    if ordered is not None:
        records = [assigned(m) if isinstance(m, WrittenManifest) else dict(m) for m in ordered]
    else:
        for content in (DATA, POSITION_DELETES):
            records.extend(assigned(m) for m in new if m.record["content"] == content)
            records.extend(m for m in kept if m["content"] == content)
    _check_next_row_id(records, new, first_row_id)
    if ordered is not None:
        _check_sequence_number([m for m in ordered if not isinstance(m, WrittenManifest)],
                               [m for m in ordered if isinstance(m, WrittenManifest)], sequence_number)  # fmt: skip
    else:
        _check_sequence_number(kept, new, sequence_number)
    for record in records:
        if record["content"] == DATA and record.get("first_row_id") is None:
            # new data manifests, and kept ones from before row lineage (Java does the same)
            record["first_row_id"] = next_row_id
            next_row_id += record["added_rows_count"] + record["existing_rows_count"]
    entry_struct = manifest_list_struct()
    metadata = {
        "snapshot-id": str(snapshot_id),
        "parent-snapshot-id": str(parent_snapshot_id) if parent_snapshot_id is not None else "null",
        "sequence-number": str(sequence_number),
        "first-row-id": str(first_row_id),
        "format-version": str(FORMAT_VERSION),
        "iceberg.schema": _compact(struct_to_json(entry_struct, schema_id=0)),
    }
    _, key = io.write_avro(location, struct_to_avro(entry_struct, "manifest_file"), records, metadata)
    return key, next_row_id


def _check_next_row_id(records: Sequence[dict[str, Any]], new: Sequence[WrittenManifest], first_row_id: int) -> None:
    """Refuse to hand out row ids the table's manifests already hold.  ``first_row_id`` is
    the table metadata's ``next-row-id``, plain JSON anyone with write access to the
    storage can lower; the ranges come from the kept manifests' list entries and the
    entries this commit carries over (both authenticated in an encrypted table).  A
    lowered value would give new rows the ids of existing ones."""
    held = [
        (r["manifest_path"], r["first_row_id"] + (r.get("added_rows_count") or 0) + (r.get("existing_rows_count") or 0))
        for r in records
        if r["content"] == DATA and r.get("first_row_id") is not None
    ]
    held += [(m.record["manifest_path"], m.row_ids_end) for m in new if m.row_ids_end is not None]
    for path, end in held:
        if first_row_id < end:
            raise FormatError(
                f"the table metadata's next-row-id {first_row_id} is below the row ids manifest {path} holds "
                f"(up to {end - 1}): new rows would reuse them; the metadata is inconsistent (altered?), "
                "nothing was committed"
            )


def _check_sequence_number(records: Sequence[dict[str, Any]], new: Sequence[WrittenManifest], sequence_number: int) -> None:
    """Refuse a snapshot sequence number that is not above every one the table's manifests
    hold.  It comes from metadata.json's ``last-sequence-number`` (plain JSON); lowered, new
    files would order before (or with) older ones: deletes would miss or hit the wrong
    rows, and new rows would carry an old ``_last_updated_sequence_number``."""
    held = [(r["manifest_path"], r.get("sequence_number")) for r in records if r.get("sequence_number") is not None]
    held += [(m.record["manifest_path"], m.max_sequence_number) for m in new if m.max_sequence_number is not None]
    for path, held_number in held:
        if sequence_number <= held_number:
            raise FormatError(
                f"the new snapshot's sequence number {sequence_number} (the table metadata's last-sequence-number + 1) "
                f"is not above sequence number {held_number} that manifest {path} holds; the metadata is "
                "inconsistent (altered?), nothing was committed"
            )


def resolve_entries(manifest: Mapping[str, Any], entries: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Entries of a manifest with inherited values made explicit: ``snapshot_id``,
    ``sequence_number`` and ``file_sequence_number`` of ADDED entries come from the
    manifest, and data files' ``first_row_id`` from the manifest's ``first_row_id``
    plus the records of the preceding live entries that inherit theirs.  Such entries
    can be rewritten into another manifest (as EXISTING or DELETED)."""
    result = []
    next_row_id = manifest.get("first_row_id")
    for entry in entries:
        entry = dict(entry)
        data_file = dict(entry["data_file"])
        entry["data_file"] = data_file
        if entry.get("snapshot_id") is None:
            entry["snapshot_id"] = manifest["added_snapshot_id"]
        if entry.get("sequence_number") is None and entry["status"] == ADDED:
            entry["sequence_number"] = manifest["sequence_number"]
        if entry.get("file_sequence_number") is None and entry["status"] == ADDED:
            entry["file_sequence_number"] = manifest["sequence_number"]
        inherits = data_file["content"] == DATA and data_file.get("first_row_id") is None
        if inherits and next_row_id is not None and entry["status"] != DELETED:
            data_file["first_row_id"] = next_row_id
            next_row_id += data_file["record_count"]
        result.append(entry)
    return result

"""Reading manifest lists and manifests (Iceberg spec "Manifests"), encrypted or not.

The records come from the Avro files as dicts (fastavro); this module turns them into
small immutable objects the planner works with, applies Iceberg's inheritance rules
(snapshot id and sequence numbers of ADDED entries come from the manifest list) and
checks what encryption requires: in an encrypted table every manifest (field 519) and
every data or delete file (field 131) has key metadata, AGS1 files with ``file_length``.

The duck-typed attribute names (``partitions``, ``contains_null``, ``record_count``,
``value_counts``, ``lower_bounds``, ...) are the ones PyIceberg's manifest and metrics
evaluators read, so those evaluators run on these objects unchanged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import uuid
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.types import (
    DateType,
    IcebergType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from icecrypt.errors import FormatError
from icecrypt.keys import StandardKeyMetadata
from icecrypt.table.files.io import Locations, file_key_metadata, open_avro

__all__ = [
    "DATA",
    "EQUALITY_DELETES",
    "POSITION_DELETES",
    "ContentFile",
    "FieldSummary",
    "ManifestEntry",
    "ManifestFile",
    "read_manifest",
    "read_manifest_list",
]

# manifest entry status
EXISTING, ADDED, DELETED = 0, 1, 2
# data file content
DATA, POSITION_DELETES, EQUALITY_DELETES = 0, 1, 2
# manifest content
MANIFEST_DATA, MANIFEST_DELETES = 0, 1

_EPOCH = datetime.datetime(1970, 1, 1)
_EPOCH_UTC = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
_MICRO = datetime.timedelta(microseconds=1)


class FieldSummary(NamedTuple):
    """Bounds of one partition field over a manifest (manifest list field 507)."""

    contains_null: bool
    contains_nan: bool | None
    lower_bound: bytes | None
    upper_bound: bytes | None


@dataclasses.dataclass(frozen=True)
class ManifestFile:
    """One entry of a manifest list.  ``record`` is the entry as read (for writers that
    carry manifests over into a new manifest list unchanged)."""

    path: str
    length: int
    spec_id: int
    content: int
    sequence_number: int
    min_sequence_number: int
    added_snapshot_id: int
    partitions: tuple[FieldSummary, ...] | None
    key_metadata: StandardKeyMetadata | None = dataclasses.field(repr=False)
    first_row_id: int | None
    record: dict[str, Any] = dataclasses.field(repr=False, compare=False)

    @property
    def is_deletes(self) -> bool:
        return self.content == MANIFEST_DELETES


@dataclasses.dataclass(frozen=True)
class ContentFile:
    """A data file or delete file as a manifest describes it.

    ``partition`` is the partition tuple in spec order, in Iceberg's internal
    representation (dates as days, timestamps as microseconds, ...).  The metrics maps
    are keyed by field id.  ``key_metadata`` is None only in plaintext tables.
    """

    content: int
    file_path: str
    file_format: str
    spec_id: int
    partition: tuple
    record_count: int
    file_size_in_bytes: int
    key_metadata: StandardKeyMetadata | None = dataclasses.field(repr=False)
    value_counts: Mapping[int, int] = dataclasses.field(repr=False, compare=False)
    null_value_counts: Mapping[int, int] = dataclasses.field(repr=False, compare=False)
    nan_value_counts: Mapping[int, int] = dataclasses.field(repr=False, compare=False)
    lower_bounds: Mapping[int, bytes] = dataclasses.field(repr=False, compare=False)
    upper_bounds: Mapping[int, bytes] = dataclasses.field(repr=False, compare=False)
    split_offsets: tuple[int, ...] | None = dataclasses.field(repr=False, compare=False)
    equality_ids: tuple[int, ...] | None
    referenced_data_file: str | None
    content_offset: int | None
    content_size_in_bytes: int | None
    first_row_id: int | None = dataclasses.field(repr=False, compare=False)
    #: the key metadata exactly as the manifest stores it (validated by the decode
    #: above), handed to scan tasks without re-encoding
    key_metadata_bytes: bytes | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def is_dv(self) -> bool:
        """A deletion vector (a blob in a Puffin file, format v3)."""
        return self.content == POSITION_DELETES and self.file_format == "PUFFIN"


@dataclasses.dataclass(frozen=True)
class ManifestEntry:
    """One entry of a manifest, with inherited snapshot id and sequence numbers.
    ``record`` is the entry as read."""

    status: int
    snapshot_id: int
    sequence_number: int
    file_sequence_number: int
    file: ContentFile
    record: dict[str, Any] = dataclasses.field(repr=False, compare=False)


# --- manifest lists -----------------------------------------------------------------------


def _summaries(raw: Any) -> tuple[FieldSummary, ...] | None:
    if raw is None:
        return None
    return tuple(
        FieldSummary(s["contains_null"], s.get("contains_nan"), s.get("lower_bound"), s.get("upper_bound")) for s in raw
    )


@contextlib.contextmanager
def _malformed(what: str, location: str) -> Iterator[None]:
    """A record whose fields are missing or of the wrong type (the Avro schema is the
    file's own, so an authenticated file can still lack what Iceberg requires) is a
    malformed file: FormatError naming it, not a KeyError or TypeError."""
    try:
        yield
    except FormatError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise FormatError(f"{what} {location}: malformed entry ({type(exc).__name__}: {exc})") from None


def read_manifest_list(
    location: str, locations: Locations, key_metadata: StandardKeyMetadata | None, *, encrypted: bool
) -> list[ManifestFile]:
    """The manifests of a snapshot, from its manifest list.

    ``key_metadata`` is the manifest list's (unwrapped from the snapshot's ``key-id``);
    None in a plaintext table.  Format v1 lists (no sequence numbers, no content) read
    as data manifests with sequence number 0.
    """
    result = []
    with open_avro("manifest list", location, locations, key_metadata, encrypted=encrypted) as records:
        for record in records:
            with _malformed("manifest list", location):
                path = record["manifest_path"]
                km = file_key_metadata(record.get("key_metadata"), "manifest", path, encrypted=encrypted, needs_length=True)
                result.append(
                    ManifestFile(
                        path=path,
                        length=record["manifest_length"],
                        spec_id=record["partition_spec_id"],
                        content=record.get("content") or MANIFEST_DATA,
                        sequence_number=record.get("sequence_number") or 0,
                        min_sequence_number=record.get("min_sequence_number") or 0,
                        added_snapshot_id=record.get("added_snapshot_id"),
                        partitions=_summaries(record.get("partitions")),
                        key_metadata=km,
                        first_row_id=record.get("first_row_id"),
                        record=record,
                    )
                )
    return result


# --- manifests ---------------------------------------------------------------------------------


def _int_map(raw: Any) -> dict[int, Any]:
    """A manifest map (Java writes int-keyed maps as arrays of key/value records)."""
    if raw is None:
        return {}
    if isinstance(raw, Mapping):
        return {int(k): v for k, v in raw.items()}
    return {item["key"]: item["value"] for item in raw}


def to_internal(value: Any, field_type: IcebergType) -> Any:
    """A partition value as Iceberg's expressions expect it (fastavro converts Avro
    logical types to Python dates, datetimes and UUIDs; Iceberg uses days and micros)."""
    if value is None:
        return None
    if isinstance(field_type, DateType) and isinstance(value, datetime.date):
        return (value - _EPOCH.date()).days
    if isinstance(field_type, (TimestampType, TimestamptzType)) and isinstance(value, datetime.datetime):
        epoch = _EPOCH_UTC if value.tzinfo is not None else _EPOCH
        return (value - epoch) // _MICRO
    if isinstance(field_type, TimeType) and isinstance(value, datetime.time):
        return ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond
    if isinstance(field_type, UUIDType) and isinstance(value, (bytes, str)):
        return uuid.UUID(bytes=value) if isinstance(value, bytes) else uuid.UUID(value)
    return value


def _partition_names(writer_schema: Mapping[str, Any]) -> dict[int, str]:
    """field id -> Avro field name of the ``partition`` record in a manifest's schema."""
    for field in writer_schema.get("fields", ()):
        if field.get("name") != "data_file":
            continue
        for inner in field["type"]["fields"]:
            if inner.get("name") == "partition":
                record = inner["type"]
                return {f["field-id"]: f["name"] for f in record.get("fields", ()) if "field-id" in f}
    return {}


def read_manifest(
    manifest: ManifestFile,
    locations: Locations,
    specs: Mapping[int, PartitionSpec],
    schema: Schema,
    *,
    encrypted: bool,
    include_deleted: bool = False,
    require_keys: bool = True,
    partition_types: dict[int, Any] | None = None,
) -> Iterator[ManifestEntry]:
    """The live entries of a manifest (EXISTING and ADDED; DELETED too on request).

    ``specs`` are the table's partition specs by id; ``schema`` resolves the types of
    partition fields.  Errors name the manifest or the file they are about.  With
    ``require_keys=False`` an entry of an encrypted table without key metadata is
    returned (with ``key_metadata=None``) instead of failing the whole manifest, for
    callers that report such files one by one.  ``partition_types``: a dict the caller
    keeps while it reads the manifests of one scan (same ``specs`` and ``schema``), where
    each spec's partition type is kept once computed.
    """
    spec = specs.get(manifest.spec_id)
    if spec is None:
        raise FormatError(f"manifest {manifest.path}: unknown partition spec id {manifest.spec_id}")
    partition_type = None if partition_types is None else partition_types.get(manifest.spec_id)
    if partition_type is None:
        try:
            partition_type = spec.partition_type(schema)
        except ValueError as exc:
            raise FormatError(f"manifest {manifest.path}: partition spec {spec.spec_id} does not fit the schema ({exc})") from None
        if partition_types is not None:
            partition_types[manifest.spec_id] = partition_type
    with open_avro("manifest", manifest.path, locations, manifest.key_metadata, encrypted=encrypted) as records:
        with _malformed("manifest", manifest.path):
            names = _partition_names(records.schema)
        fields = [(names.get(f.field_id, f.name), f.field_type) for f in partition_type.fields]
        # first_row_id inheritance (spec "First Row ID Inheritance"): a live data file
        # without one starts where the preceding such files of the manifest end
        next_row_id = manifest.first_row_id if manifest.content == MANIFEST_DATA else None
        for record in records:
            with _malformed("manifest", manifest.path):
                entry = _manifest_entry(record, manifest, fields, encrypted, include_deleted, require_keys, next_row_id)
                if next_row_id is not None and _inherits_first_row_id(record):
                    next_row_id += record["data_file"]["record_count"]
            if entry is not None:
                yield entry


def _inherits_first_row_id(record: dict[str, Any]) -> bool:
    """Whether a manifest record is a live data file whose first_row_id is inherited."""
    df = record["data_file"]
    return record["status"] != DELETED and (df.get("content") or DATA) == DATA and df.get("first_row_id") is None


def _manifest_entry(
    record: dict[str, Any],
    manifest: ManifestFile,
    fields: list[tuple[str, IcebergType]],
    encrypted: bool,
    include_deleted: bool,
    require_keys: bool,
    next_row_id: int | None = None,
) -> ManifestEntry | None:
    """One manifest record as a ManifestEntry (None for a DELETED entry not asked for);
    ``next_row_id`` is the first_row_id the entry inherits if it has none."""
    status = record["status"]
    if status == DELETED and not include_deleted:
        return None
    df = record["data_file"]
    path = df["file_path"]
    sequence_number = record.get("sequence_number")
    file_sequence_number = record.get("file_sequence_number")
    if sequence_number is None or file_sequence_number is None:
        if status != ADDED and manifest.sequence_number != 0:
            raise FormatError(f"manifest {manifest.path}: entry for {path} has no sequence number")
        if sequence_number is None:
            sequence_number = manifest.sequence_number
        if file_sequence_number is None:
            file_sequence_number = manifest.sequence_number
    content = df.get("content") or DATA
    file_format = str(df["file_format"]).upper()
    what = "data file" if content == DATA else "delete file"
    raw_key = df.get("key_metadata")
    km = None
    if raw_key is not None or require_keys:
        km = file_key_metadata(raw_key, what, path, encrypted=encrypted, needs_length=file_format != "PARQUET")
    partition_raw = df.get("partition") or {}
    partition = tuple(to_internal(partition_raw.get(name), ftype) for name, ftype in fields)
    split_offsets = df.get("split_offsets")
    equality_ids = df.get("equality_ids")
    return ManifestEntry(
        status=status,
        snapshot_id=record.get("snapshot_id") if record.get("snapshot_id") is not None else manifest.added_snapshot_id,
        sequence_number=sequence_number,
        file_sequence_number=file_sequence_number,
        file=ContentFile(
            content=content,
            file_path=path,
            file_format=file_format,
            spec_id=manifest.spec_id,
            partition=partition,
            record_count=df["record_count"],
            file_size_in_bytes=df["file_size_in_bytes"],
            key_metadata=km,
            value_counts=_int_map(df.get("value_counts")),
            null_value_counts=_int_map(df.get("null_value_counts")),
            nan_value_counts=_int_map(df.get("nan_value_counts")),
            lower_bounds=_int_map(df.get("lower_bounds")),
            upper_bounds=_int_map(df.get("upper_bounds")),
            split_offsets=tuple(split_offsets) if split_offsets is not None else None,
            equality_ids=tuple(equality_ids) if equality_ids is not None else None,
            referenced_data_file=df.get("referenced_data_file"),
            content_offset=df.get("content_offset"),
            content_size_in_bytes=df.get("content_size_in_bytes"),
            first_row_id=next_row_id if _inherits_first_row_id(record) else df.get("first_row_id"),
            key_metadata_bytes=raw_key if km is not None and isinstance(raw_key, bytes) else None,
        ),
        record=record,
    )

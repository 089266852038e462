"""Where new files of a table go, as Iceberg Java places them.

Roots (:class:`WriteLayout`, Java's ``LocationProviders`` and
``BaseMetastoreTableOperations.metadataFileLocation``): data files under
``write.data.path`` (default ``<location>/data``), manifests, manifest lists and metadata
files under ``write.metadata.path`` (default ``<location>/metadata``; a path table, like
Java's Hadoop tables, refuses to relocate its metadata).  With
``write.object-storage.enabled`` a data file's directory starts with 20 bits of the
Murmur3 hash of its name as ``bbbb/bbbb/bbbb/bbbbbbbb`` (spreading requests over object
store prefixes), followed by the partition directories unless
``write.object-storage.partitioned-paths`` is false, and preceded by the table's last two
path segments when the data root lies outside the table location.

Partition directories (:func:`partition_path`): ``<field>=<value>/...``, each name and
value as Java's ``PartitionSpec.partitionToPath`` writes it -- the transform's human
string (``Transform.toHumanString``: ISO dates and timestamps, base64 binary, Java's
``Double.toString`` for floats) escaped as ``java.net.URLEncoder`` escapes form data in
UTF-8 (letters, digits and ``.-*_`` kept, a space as ``+``, every other byte ``%XX``).
A value holding ``/`` or ``\\`` therefore becomes one directory name (``N%2FA``), which
storage and every reader take literally (``icecrypt._paths``).
"""

from __future__ import annotations

import base64
import decimal
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import mmh3
import numpy as np
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import DayTransform, HourTransform, MonthTransform, Transform, VoidTransform, YearTransform
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    TimestampNanoType,
    TimestampType,
    TimestamptzNanoType,
    TimestamptzType,
    TimeType,
)

__all__ = ["WriteLayout", "escape", "human_string", "partition_path"]

WRITE_DATA_PATH = "write.data.path"
WRITE_METADATA_PATH = "write.metadata.path"
OBJECT_STORAGE = "write.object-storage.enabled"
PARTITIONED_PATHS = "write.object-storage.partitioned-paths"
#: what Java read before write.data.path and now refuses (deprecated, "removed in 2.0.0")
LEGACY_OBJECT_STORAGE_PATH = "write.object-storage.path"
LEGACY_FOLDER_STORAGE_PATH = "write.folder-storage.path"
LOCATION_PROVIDER = "write.location-provider.impl"

#: what java.net.URLEncoder leaves as it is
_KEPT = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-*_")


def escape(text: str) -> str:
    """``text`` as ``URLEncoder.encode(text, UTF_8)`` gives it (a lone surrogate, which
    Java cannot encode, becomes ``?`` as there)."""
    out = []
    for byte in text.encode("utf-8", errors="replace"):
        if byte in _KEPT:
            out.append(chr(byte))
        elif byte == 0x20:
            out.append("+")
        else:
            out.append(f"%{byte:02X}")
    return "".join(out)


def partition_path(spec: PartitionSpec, schema: Schema, values: Sequence[Any]) -> str:
    """The partition directories of ``values`` (internal representation, one per field of
    ``spec``): Java's ``partitionToPath``; "" for an unpartitioned spec."""
    parts = []
    for field, value in zip(spec.fields, values, strict=True):
        source = schema.find_field(field.source_id).field_type
        parts.append(f"{escape(field.name)}={escape(human_string(field.transform, source, value))}")
    return "/".join(parts)


# --- roots and object-storage layout ------------------------------------------------------------


@dataclass(frozen=True)
class WriteLayout:
    """Where one table's new files go (see the module docstring).  ``data_root`` and
    ``metadata_root`` are the table's pinned roots; every location made here lies under
    one of them."""

    location: str
    data_root: str
    metadata_root: str
    object_storage: bool = False
    partitioned_paths: bool = True

    @classmethod
    def of(
        cls, location: str, properties: Mapping[str, str] | None, *, data_path: str | None = None,
        metadata_path: str | None = None, catalog: bool = True,
    ) -> WriteLayout:
        """The layout of a table at ``location`` with ``properties``; ``data_path`` /
        ``metadata_path``: its pinned ``write.data.path`` / ``write.metadata.path`` (None:
        not set).  ``catalog``: whether a catalog keeps its current version (a path table
        cannot relocate its metadata).  ValueError, naming the property, for what Iceberg
        Java refuses to write with and what icecrypt cannot honour."""
        properties = properties or {}
        location = location.rstrip("/")
        object_storage = _java_bool(properties.get(OBJECT_STORAGE))
        if properties.get(LOCATION_PROVIDER):
            raise ValueError(
                f"table {location}: {LOCATION_PROVIDER}={properties[LOCATION_PROVIDER]!r} names a Java class icecrypt "
                "cannot run: its writers would place files elsewhere than Iceberg Java's (refused; unset it, or set "
                f"{WRITE_DATA_PATH} / {OBJECT_STORAGE})"
            )
        if not data_path:
            legacy = (LEGACY_OBJECT_STORAGE_PATH, LEGACY_FOLDER_STORAGE_PATH) if object_storage else (LEGACY_FOLDER_STORAGE_PATH,)
            for name in legacy:
                if properties.get(name) is not None:
                    raise ValueError(
                        f"table {location}: property {name!r} is deprecated and refused by Iceberg Java (removed in "
                        f"2.0.0); set {WRITE_DATA_PATH} instead"
                    )
        if metadata_path and not catalog:
            raise ValueError(
                f"table {location}: {WRITE_METADATA_PATH} is set, but a path table cannot relocate its metadata (as "
                "Iceberg Java's Hadoop tables refuse it; a catalog table honours it)"
            )
        return cls(
            location=location,
            data_root=(data_path or f"{location}/data").rstrip("/"),
            metadata_root=(metadata_path or f"{location}/metadata").rstrip("/"),
            object_storage=object_storage,
            partitioned_paths=_java_bool(properties.get(PARTITIONED_PATHS), default=True),
        )

    def data_file(self, name: str, partition_path: str = "") -> str:
        """The location of a new data (or delete) file ``name``, in the partition
        directories ``partition_path`` ("" for an unpartitioned file)."""
        if not self.object_storage:
            return f"{self.data_root}/{partition_path}/{name}" if partition_path else f"{self.data_root}/{name}"
        if partition_path and self.partitioned_paths:
            name = f"{partition_path}/{name}"
        hashed = _entropy(name)
        context = None if self.data_root.startswith(self.location) else _path_context(self.location)
        if context is not None:
            return f"{self.data_root}/{hashed}/{context}/{name}"
        if self.partitioned_paths:
            return f"{self.data_root}/{hashed}/{name}"
        return f"{self.data_root}/{hashed}-{name}"

    def metadata_file(self, name: str) -> str:
        """The location of a new manifest, manifest list or metadata file ``name``."""
        return f"{self.metadata_root}/{name}"


def _java_bool(value: str | None, *, default: bool = False) -> bool:
    """``PropertyUtil.propertyAsBoolean``: ``Boolean.parseBoolean`` of the value."""
    return default if value is None else value.strip().lower() == "true"


def _entropy(name: str) -> str:
    """Java's ``ObjectStoreLocationProvider.computeHash``: the low 20 bits of Murmur3-32
    (seed 0) of the UTF-8 name, as binary digits in directories of 4, 4, 4 and 8."""
    bits = format(mmh3.hash(name.encode("utf-8"), 0, signed=False) & 0xFFFFF, "020b")
    return f"{bits[0:4]}/{bits[4:8]}/{bits[8:12]}/{bits[12:20]}"


def _path_context(location: str) -> str:
    """The last two segments of ``location`` (Java's ``pathContext``: Hadoop's
    ``getParent().getName()`` and ``getName()``)."""
    path = location.split("://", 1)[1].split("/", 1)[1] if "://" in location else location
    parts = [p for p in path.split("/") if p]
    if not parts:
        return ""
    return f"{parts[-2] if len(parts) > 1 else ''}/{parts[-1]}"


# --- Transform.toHumanString -------------------------------------------------------------------


def human_string(transform: Transform, source_type: IcebergType, value: Any) -> str:
    """The human string Iceberg Java gives the partition value ``value`` (internal
    representation) of ``transform`` applied to ``source_type``."""
    if value is None or isinstance(transform, VoidTransform):
        return "null"
    if isinstance(transform, YearTransform):
        return _padded(1970 + value)
    if isinstance(transform, MonthTransform):
        year, month = divmod(value, 12)
        return f"{_padded(1970 + year)}-{month + 1:02d}"
    if isinstance(transform, DayTransform):
        return _human_day(value)
    if isinstance(transform, HourTransform):
        days, hour = divmod(value, 24)
        return f"{_human_day(days)}-{hour:02d}"
    result_type = transform.result_type(source_type)
    return _human_value(result_type, value)


def _human_value(field_type: IcebergType, value: Any) -> str:
    if isinstance(field_type, BooleanType):
        return "true" if value else "false"
    if isinstance(field_type, (FloatType, DoubleType)):
        return _java_float(float(value), single=isinstance(field_type, FloatType))
    if isinstance(field_type, DecimalType):
        return str(decimal.Decimal(value).quantize(decimal.Decimal(1).scaleb(-field_type.scale), context=_WIDE))
    if isinstance(field_type, DateType):
        return _human_day(value)
    if isinstance(field_type, TimeType):
        return _local_time(value * 1000)
    if isinstance(field_type, (TimestampType, TimestamptzType)):
        return _iso_timestamp(value * 1000, zoned=isinstance(field_type, TimestamptzType))
    if isinstance(field_type, (TimestampNanoType, TimestamptzNanoType)):
        return _iso_timestamp(value, zoned=isinstance(field_type, TimestamptzNanoType))
    if isinstance(field_type, (BinaryType, FixedType)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, uuid.UUID):
        return str(value)
    return str(value)


_WIDE = decimal.Context(prec=100)


def _padded(year: int) -> str:
    """``String.format("%04d", year)``: four digits, the sign counting as one."""
    return f"{year:04d}"


def _civil(days: int) -> tuple[int, int, int]:
    """(year, month, day) of ``days`` since 1970-01-01 in the proleptic Gregorian
    calendar, for any year (Python's ``date`` stops at 1 and 9999)."""
    days += 719468
    era = days // 146097
    day_of_era = days - era * 146097
    year_of_era = (day_of_era - day_of_era // 1460 + day_of_era // 36524 - day_of_era // 146096) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    mp = (5 * day_of_year + 2) // 153
    day = day_of_year - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    return year_of_era + era * 400 + (month <= 2), month, day


def _human_day(days: int) -> str:
    year, month, day = _civil(days)
    return f"{_padded(year)}-{month:02d}-{day:02d}"


def _iso_year(year: int) -> str:
    """``ISO_LOCAL_DATE``'s year: four digits, ``+`` above 9999, ``-`` below 0."""
    if year > 9999:
        return f"+{year}"
    return f"-{-year:04d}" if year < 0 else f"{year:04d}"


def _iso_timestamp(nanos: int, *, zoned: bool) -> str:
    """``ISO_LOCAL_DATE_TIME`` (with ``+00:00`` when ``zoned``), as Java's
    ``DateTimeUtil.microsToIsoTimestamp(tz)``: seconds always, the fraction without
    trailing zeros."""
    days, nano_of_day = divmod(nanos, 86_400_000_000_000)
    year, month, day = _civil(days)
    seconds, fraction = divmod(nano_of_day, 1_000_000_000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    text = f"{_iso_year(year)}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}"
    if fraction:
        text += "." + f"{fraction:09d}".rstrip("0")
    return text + ("+00:00" if zoned else "")


def _local_time(nano_of_day: int) -> str:
    """``LocalTime.toString()``: seconds only when not zero, the fraction in groups of
    three digits."""
    seconds, fraction = divmod(nano_of_day, 1_000_000_000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    text = f"{hour:02d}:{minute:02d}"
    if second or fraction:
        text += f":{second:02d}"
    if fraction:
        digits = f"{fraction:09d}"
        text += "." + (digits[:3] if fraction % 1_000_000 == 0 else digits[:6] if fraction % 1000 == 0 else digits)
    return text


def _java_float(value: float, *, single: bool) -> str:
    """``Float.toString`` / ``Double.toString`` (the shortest digits that read back as
    the same value, as Java 19+ writes them): plain between 10^-3 and 10^7, else
    ``d.dddE<exponent>``; at least one digit after the point."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    shortest = np.format_float_scientific(np.float32(value) if single else value, unique=True, trim="-")
    sign = "-" if shortest.startswith("-") else ""
    mantissa, exponent = shortest.lstrip("-").split("e")
    digits = mantissa.replace(".", "")
    power = int(exponent)  # value = d.ddd * 10^power
    if 1e-3 <= abs(value) < 1e7:
        if power >= 0:
            whole, frac = digits[: power + 1].ljust(power + 1, "0"), digits[power + 1 :]
        else:
            whole, frac = "0", "0" * (-power - 1) + digits
        return f"{sign}{whole}.{frac or '0'}"
    if len(digits) == 1:  # two digits at least, the closer of them (4.9E-324, not 5.0E-324)
        mantissa, exponent = f"{abs(value):.1e}".split("e")
        digits, power = mantissa.replace(".", ""), int(exponent)
    return f"{sign}{digits[0]}.{digits[1:]}E{power}"

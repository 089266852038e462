"""Manifest merging on commit, as Iceberg Java's ``MergeAppend`` does it
(``ManifestMergeManager`` / ``MergingSnapshotProducer``).

Table properties (Java's names and defaults)::

    commit.manifest-merge.enabled        true       merge on append
    commit.manifest.min-count-to-merge   100        manifests a bin holding the new one needs
    commit.manifest.target-size-bytes    8388608    bin size (stored manifest lengths)

The rules, as Java applies them to a snapshot's manifests (the new manifest first, then
the parent's live ones, in manifest-list order); data manifests and delete manifests are
merged separately, each with the same settings:

* manifests are grouped by partition spec id, groups in descending spec id order;
* each group is bin-packed in order with a lookback of one, from the end
  (``ListPacker.packEnd``): the under-filled bin is the first, merged again next time;
* a bin of one manifest is kept as it is; a bin holding the first manifest (the new one)
  is merged only when it has at least ``min-count-to-merge`` manifests; every other bin
  of two or more is merged;
* a merged manifest is a new file (in an encrypted table: AGS1 under a fresh key) with
  the entries of its bin in order: files added by this snapshot stay ADDED (their
  sequence numbers inherited), DELETED entries of earlier snapshots are dropped, every
  other live entry becomes EXISTING and keeps its snapshot id, data sequence number and
  file sequence number (and first row id).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema

from icecrypt.table.files.manifest_write import (
    ADDED,
    DATA,
    DELETED,
    EXISTING,
    WrittenManifest,
    write_manifest,
)
from icecrypt.table.files.write_io import TableIO

__all__ = ["MergeSettings", "merge_manifests", "pack_end"]

MERGE_ENABLED = "commit.manifest-merge.enabled"
MIN_COUNT_TO_MERGE = "commit.manifest.min-count-to-merge"
TARGET_SIZE_BYTES = "commit.manifest.target-size-bytes"
DEFAULT_MERGE_ENABLED = True
DEFAULT_MIN_COUNT_TO_MERGE = 100
DEFAULT_TARGET_SIZE_BYTES = 8 * 1024 * 1024

T = TypeVar("T")
#: a manifest of the snapshot being built: new (written by this commit) or kept (a
#: manifest-list record of the parent)
Manifest = WrittenManifest | dict[str, Any]


@dataclass(frozen=True)
class MergeSettings:
    enabled: bool = DEFAULT_MERGE_ENABLED
    min_count: int = DEFAULT_MIN_COUNT_TO_MERGE
    target_size: int = DEFAULT_TARGET_SIZE_BYTES

    @classmethod
    def from_properties(cls, properties: dict[str, str] | None) -> MergeSettings:
        props = properties or {}
        enabled = str(props.get(MERGE_ENABLED, "true")).strip().lower() == "true"  # Java's Boolean.parseBoolean
        return cls(
            enabled=enabled,
            min_count=int(props.get(MIN_COUNT_TO_MERGE, DEFAULT_MIN_COUNT_TO_MERGE)),
            target_size=int(props.get(TARGET_SIZE_BYTES, DEFAULT_TARGET_SIZE_BYTES)),
        )


def pack_end(items: Sequence[T], weight: Callable[[T], int], target: int) -> list[list[T]]:
    """Java's ``BinPacking.ListPacker(target, lookback=1, largestBinFirst=false).packEnd``:
    the items packed from the last one backwards, each bin taking items while its weight
    stays within ``target`` (a new bin always takes its first item), then bins and their
    items put back in the original order."""
    bins: list[list[T]] = []
    current: list[T] | None = None
    current_weight = 0
    for item in reversed(items):
        w = weight(item)
        if current is not None and current_weight + w <= target:
            current.append(item)
            current_weight += w
        else:
            current = [item]
            current_weight = w
            bins.append(current)
    return [list(reversed(b)) for b in reversed(bins)]


def _record(manifest: Manifest) -> dict[str, Any]:
    return manifest.record if isinstance(manifest, WrittenManifest) else manifest


def _length(manifest: Manifest) -> int:
    return int(_record(manifest)["manifest_length"])


def merge_manifests(
    manifests: Sequence[Manifest],
    *,
    settings: MergeSettings,
    snapshot_id: int,
    specs: dict[int, PartitionSpec],
    schema: Schema,
    read_entries: Callable[[dict[str, Any]], list[dict[str, Any]]],
    io: TableIO,
    new_location: Callable[[], str],
    written: list[str],
    schemas: Sequence[Schema] = (),
) -> tuple[list[Manifest], int]:
    """The manifests of one content kind (all data, or all deletes) after merging, in
    Java's order, and how many were replaced.  ``manifests[0]`` is Java's "first" (the
    new manifest when this commit has one).  ``read_entries`` reads a kept manifest's
    entries (inherited values explicit); merged manifests are written at
    ``new_location()`` and their locations appended to ``written`` as they are created.
    ``schemas`` (the table's) type older specs' fields whose source ``schema`` dropped."""
    if not settings.enabled or not manifests:
        return list(manifests), 0
    first = manifests[0]
    groups: dict[int, list[Manifest]] = {}
    for manifest in manifests:
        groups.setdefault(int(_record(manifest)["partition_spec_id"]), []).append(manifest)
    result: list[Manifest] = []
    replaced = 0
    for spec_id in sorted(groups, reverse=True):
        for bin_ in pack_end(groups[spec_id], _length, settings.target_size):
            if len(bin_) == 1 or (any(m is first for m in bin_) and len(bin_) < settings.min_count):
                result.extend(bin_)
                continue
            result.append(_merge_bin(bin_, spec_id, snapshot_id, specs, (schema, schemas), read_entries, io,
                                     new_location, written))
            replaced += len(bin_)
    return result, replaced


def _merge_bin(
    bin_: list[Manifest],
    spec_id: int,
    snapshot_id: int,
    specs: dict[int, PartitionSpec],
    schemas: tuple[Schema, Sequence[Schema]],
    read_entries: Callable[[dict[str, Any]], list[dict[str, Any]]],
    io: TableIO,
    new_location: Callable[[], str],
    written: list[str],
) -> WrittenManifest:
    entries: list[dict[str, Any]] = []
    content = int(_record(bin_[0]).get("content") or DATA)
    for manifest in bin_:
        # a manifest written by this commit has unassigned sequence numbers: its entries
        # keep them unassigned (inherited from the merged manifest's)
        for entry in read_entries(_record(manifest)):
            status = entry["status"]
            if status == DELETED:
                if entry.get("snapshot_id") == snapshot_id:  # only this snapshot's deletes
                    entries.append(entry)
                continue
            if status == ADDED and entry.get("snapshot_id") == snapshot_id:
                entries.append(entry)
                continue
            entry["status"] = EXISTING
            entries.append(entry)
    location = new_location()
    written.append(location)
    schema, history = schemas
    return write_manifest(io, location, entries, spec=specs[spec_id], schema=schema, content=content, schemas=history)

"""Which snapshots and refs snapshot expiry keeps, as Iceberg Java's ``RemoveSnapshots``
decides it (pure: no IO).

- A ref other than ``main`` whose head is older than its ``max-ref-age-ms`` (default the
  table's ``history.expire.max-ref-age-ms``, default forever) is removed; every other
  ref's head is kept.
- Each kept branch keeps its head's ancestors while fewer than ``min-snapshots-to-keep``
  (default ``history.expire.min-snapshots-to-keep``, default 1) are kept or they are
  newer than its ``max-snapshot-age-ms`` (default: the ``older_than_ms`` asked for).
- A snapshot no kept ref reaches (not an ancestor of a branch, not a tag's head) is kept
  when it is not older than ``older_than_ms``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from icecrypt.table.model.changes import MAIN_BRANCH, ancestors, now_ms

__all__ = ["plan_expiry"]

MIN_SNAPSHOTS_TO_KEEP = "history.expire.min-snapshots-to-keep"
MAX_REF_AGE_MS = "history.expire.max-ref-age-ms"


def _int_property(properties: Mapping[str, str], name: str, default: int) -> int:
    raw = properties.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise ValueError(f"table property {name} = {raw!r} is not an integer") from None


def plan_expiry(base: Mapping[str, Any], older_than_ms: int, *, now: int | None = None,
                retain_last: int | None = None, snapshot_ids: Iterable[int] = ()) -> tuple[set[int], list[str]]:
    """``(ids of the snapshots to remove, names of the refs to remove)``.  ``retain_last``
    (Java's ``retainLast``) replaces the table's ``min-snapshots-to-keep`` default for the
    branches that set none; ``snapshot_ids`` (Java's ``expireSnapshotId``) are removed
    whatever their age, and a ValueError names one that a kept ref points to or that the
    table does not have."""
    now = now_ms() if now is None else now
    properties = base.get("properties") or {}
    if retain_last is not None and retain_last < 1:
        raise ValueError(f"the number of snapshots to retain must be at least 1, not {retain_last}")
    default_min = retain_last if retain_last is not None else _int_property(properties, MIN_SNAPSHOTS_TO_KEEP, 1)
    default_ref_age = _int_property(properties, MAX_REF_AGE_MS, 2**63 - 1)
    snapshots = base.get("snapshots") or []
    by_id = {s["snapshot-id"]: s for s in snapshots}
    refs = dict(base.get("refs") or {})
    current = base.get("current-snapshot-id")
    if MAIN_BRANCH not in refs and current not in (None, -1):
        refs[MAIN_BRANCH] = {"snapshot-id": current, "type": "branch"}

    kept_refs: dict[str, Mapping[str, Any]] = {}
    removed_refs: list[str] = []
    for name, ref in refs.items():
        head = by_id.get(ref["snapshot-id"])
        max_age = ref.get("max-ref-age-ms") or default_ref_age
        if name == MAIN_BRANCH or (head is not None and now - head["timestamp-ms"] <= max_age):
            kept_refs[name] = ref
        else:
            removed_refs.append(name)

    keep = {ref["snapshot-id"] for ref in kept_refs.values()}
    explicit = {int(i) for i in snapshot_ids}
    for snapshot_id in sorted(explicit):
        if snapshot_id not in by_id:
            raise ValueError(f"cannot expire snapshot {snapshot_id}: the table has no such snapshot")
        if snapshot_id in keep:
            names = sorted(n for n, r in kept_refs.items() if r["snapshot-id"] == snapshot_id)
            raise ValueError(f"cannot expire snapshot {snapshot_id}: still referenced by refs {names}")
    reached: set[int] = set()
    for ref in kept_refs.values():
        if ref.get("type") != "branch":
            reached.add(ref["snapshot-id"])
            continue
        max_snapshot_age = ref.get("max-snapshot-age-ms")
        cutoff = older_than_ms if max_snapshot_age is None else now - max_snapshot_age
        min_keep = ref.get("min-snapshots-to-keep") or default_min
        kept_here = 0
        walking = True
        for snapshot in ancestors(by_id, ref["snapshot-id"]):
            reached.add(snapshot["snapshot-id"])
            if walking and (kept_here < min_keep or snapshot["timestamp-ms"] >= cutoff):
                keep.add(snapshot["snapshot-id"])
                kept_here += 1
            else:
                walking = False
    for snapshot in snapshots:
        if snapshot["snapshot-id"] not in reached and snapshot["timestamp-ms"] >= older_than_ms:
            keep.add(snapshot["snapshot-id"])
    return (set(by_id) - keep) | explicit, removed_refs

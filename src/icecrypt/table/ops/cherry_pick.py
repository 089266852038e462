"""Cherry-pick: publish a snapshot that is not in main's history (a write-audit-publish
staged snapshot, or the head of another branch) on main, as Iceberg Java's
``CherryPickOperation`` does.

* When main's current snapshot is the snapshot's parent (or the table has none and
  the snapshot has no parent) main is fast-forwarded to it: no new snapshot.
* Otherwise only an ``append`` can be picked: its added data files are added again, in
  a new ``append`` snapshot of main whose summary names the source
  (``source-snapshot-id``, and ``published-wap-id`` for a staged snapshot).  The
  commit goes through the one committer as an append does and is rebuilt on a newer
  version when it loses a race.

Refused (ValueError, nothing committed), as Java refuses them: a snapshot already in
main's history, or already picked into it; a staged ``wap.id`` already published; any
other operation that cannot be fast-forwarded.
"""

from __future__ import annotations

import uuid
from typing import Any

from icecrypt.table.model import changes as _model
from icecrypt.table.ops import write as w
from icecrypt.table.files.manifest_write import ADDED, DATA, write_manifest

__all__ = ["check_pick", "cherry_pick", "is_fast_forward"]

PUBLISHED_WAP_ID = "published-wap-id"
SOURCE_SNAPSHOT_ID = "source-snapshot-id"


def _by_id(metadata: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {s["snapshot-id"]: s for s in metadata.get("snapshots") or ()}


def is_fast_forward(metadata: dict[str, Any], snapshot: dict[str, Any]) -> bool:
    """Whether main can simply move to ``snapshot``: its parent is main's head."""
    current = metadata.get("current-snapshot-id")
    if current in (None, -1):
        return snapshot.get("parent-snapshot-id") is None
    return snapshot.get("parent-snapshot-id") == current


def check_pick(metadata: dict[str, Any], snapshot_id: int, where: str) -> dict[str, Any]:
    """The snapshot to pick, after Java's checks against ``metadata`` (ValueError)."""
    by_id = _by_id(metadata)
    snapshot = by_id.get(snapshot_id) if type(snapshot_id) is int else None
    if snapshot is None:
        raise ValueError(f"{where}: cannot cherry-pick snapshot {snapshot_id!r}: it is not in the table")
    main = list(_model.ancestors(by_id, metadata.get("current-snapshot-id")))
    wap_id = (snapshot.get("summary") or {}).get(w.WAP_ID)
    if wap_id:
        for ancestor in main:
            summary = ancestor.get("summary") or {}
            if wap_id in (summary.get(w.WAP_ID), summary.get(PUBLISHED_WAP_ID)):
                raise ValueError(
                    f"{where}: cannot cherry-pick snapshot {snapshot_id}: wap id {wap_id!r} was already published "
                    f"(snapshot {ancestor['snapshot-id']})"
                )
    if is_fast_forward(metadata, snapshot):
        return snapshot
    if any(a["snapshot-id"] == snapshot_id for a in main):
        raise ValueError(f"{where}: cannot cherry-pick snapshot {snapshot_id}: already an ancestor of main")
    for ancestor in main:
        if (ancestor.get("summary") or {}).get(SOURCE_SNAPSHOT_ID) == str(snapshot_id):
            raise ValueError(
                f"{where}: cannot cherry-pick snapshot {snapshot_id}: already picked to create ancestor "
                f"{ancestor['snapshot-id']}"
            )
    operation = (snapshot.get("summary") or {}).get("operation")
    if operation != "append":
        raise ValueError(
            f"{where}: cannot cherry-pick snapshot {snapshot_id}: a {operation!r} snapshot that is not a "
            "fast-forward of main (only appends are re-applied)"
        )
    return snapshot


def cherry_pick(table: Any, snapshot_id: int) -> int:
    """Re-apply the append ``snapshot_id`` on main as a new snapshot (the case of a
    cherry-pick that is not a fast-forward); returns the new snapshot id."""
    target = w._Target.of(table)
    base_location, base = target.latest()
    source = check_pick(base, snapshot_id, base_location)
    manager = target.manager(base)
    io = target.io(manager)
    # the data files the snapshot added, added again (the files are shared, as in Java)
    by_spec: dict[int, list[dict[str, Any]]] = {}
    for manifest in w._read_manifest_list(io, manager, source):
        if manifest["content"] != DATA:
            continue
        for entry in w._read_entries(io, manifest):
            if entry["status"] == ADDED and entry["snapshot_id"] == snapshot_id:
                data_file = dict(entry["data_file"])
                data_file["first_row_id"] = None  # new rows of main: ids assigned at commit
                by_spec.setdefault(manifest["partition_spec_id"], []).append(data_file)
    new_id = w._new_snapshot_id(base)
    extra: dict[str, str] = {}
    wap_id = (source.get("summary") or {}).get(w.WAP_ID)
    if wap_id:
        extra[PUBLISHED_WAP_ID] = wap_id
    extra[SOURCE_SNAPSHOT_ID] = str(snapshot_id)
    layout = w.write_layout(target, base)
    commit_id = uuid.uuid4()
    specs, schema = w._specs(base), w._schema(base)
    written: list[str] = []
    try:
        manifests = []
        for n, (spec_id, files) in enumerate(sorted(by_spec.items())):
            written.append(path := layout.metadata_file(f"{commit_id}-m{n}.avro"))
            manifests.append(write_manifest(io, path, w._added_entries(files, new_id), spec=specs[spec_id],
                                            schema=schema, content=DATA, schemas=w._schemas(base)))  # fmt: skip
        added = [f for files in by_spec.values() for f in files]

        def build(version: dict[str, Any], version_manager: Any) -> w._Change:
            check_pick(version, snapshot_id, target.metadata_location)  # still not picked, not published
            parent = w._current_snapshot(version)
            vio = target.io(version_manager)
            kept = [m for m in w._read_manifest_list(vio, version_manager, parent) if w._has_live_files(m)] if parent else []
            return w._Change("append", list(manifests), kept, added_files=added, summary_extra=dict(extra))

        w._commit_change(target, base_location, base, build, snapshot_id=new_id, retry=True, conflict_free=True)
    except BaseException as exc:
        w._discard(io, written, exc)
        raise
    return new_id

"""Branches, tags, rollback and table properties: operations that build updates of the
commit model (``_model``) and hand them to the one committer (``_committer``).

Each method checks its input against the version the operation started from (with
what the earlier calls of the same operation changed) and raises ValueError for bad
input before anything is committed; the commit re-validates the derived requirements
(the refs it moves still point where they pointed) on the newest version.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from icecrypt.table.commit import committer as _committer
from icecrypt.table.model import changes as _model
from icecrypt.table.model.changes import MAIN_BRANCH, RemoveProperties, RemoveSnapshotRef, SetProperties, SetSnapshotRef

__all__ = ["ManageSnapshots", "UpdateProperties"]


class _Operation:
    """A change built against the newest version of a table, committed once: by
    :meth:`commit`, or on leaving a ``with`` block without an exception."""

    what = "table change"

    def __init__(self, table: Any) -> None:
        from icecrypt.table.commit.target import _Target

        self._table = table
        self._target = _Target.of(table)
        self._base_location, self._base = self._target.latest()
        self._updates: list[_model.TableUpdate] = []
        self._view = self._base  # the base with the updates so far (checked as they come)
        self._done = False

    def _add(self, *updates: _model.TableUpdate) -> None:
        if self._done:
            raise ValueError(f"this {self.what} was already committed; start a new one")
        self._view = _model.apply(self._view, updates, now=self._base.get("last-updated-ms", 0))
        self._updates.extend(updates)

    def commit(self) -> str | None:
        """Commit the updates (none: nothing is written); returns the new metadata
        location, or None when there was nothing to commit."""
        if self._done:
            raise ValueError(f"this {self.what} was already committed; start a new one")
        self._done = True
        pick = getattr(self, "_pick", None)
        if pick is not None:  # a cherry-pick that re-applies an append: its own snapshot
            from icecrypt.table.ops.cherry_pick import cherry_pick

            cherry_pick(self._table, pick)
            return self._table.metadata_location
        if not self._updates:
            return None
        change = _model.Change.on(self._base, self._updates, what=self.what)
        return _committer.commit(self._target, change)

    def __enter__(self):
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if exc_type is None and not self._done:
            self.commit()


class ManageSnapshots(_Operation):
    """Branches, tags and the current snapshot (``table.manage_snapshots()``), chainable::

        with table.manage_snapshots() as ms:
            ms.create_tag("v1", snapshot_id).create_branch("audit")

    committed on leaving the ``with`` block (or by ``commit()``)."""

    what = "snapshot management"

    # --- what the table has ---------------------------------------------------------------

    def _refs(self) -> dict[str, Any]:
        return self._view.get("refs") or {}

    def _snapshot(self, snapshot_id: Any) -> dict[str, Any]:
        if type(snapshot_id) is not int:
            raise ValueError(f"snapshot id must be an integer, not {snapshot_id!r}")
        for snapshot in self._view.get("snapshots") or ():
            if snapshot["snapshot-id"] == snapshot_id:
                return snapshot
        raise ValueError(f"{self._base_location}: snapshot {snapshot_id} is not in the table")

    def _ref(self, name: str, kind: str) -> dict[str, Any]:
        ref = self._refs().get(name)
        if ref is None:
            raise ValueError(f"{self._base_location}: there is no {kind} {name!r}")
        if ref.get("type") != kind:
            raise ValueError(f"{self._base_location}: {name!r} is a {ref.get('type')}, not a {kind}")
        return ref

    def _new_name(self, name: Any) -> str:
        name = _model.check_ref_name(name)
        if name in self._refs():
            raise ValueError(f"{self._base_location}: ref {name!r} exists ({self._refs()[name].get('type')})")
        return name

    def _current(self) -> int:
        current = self._view.get("current-snapshot-id")
        if current in (None, -1):
            raise ValueError(f"{self._base_location}: the table has no current snapshot")
        return current

    def _ancestors(self, snapshot_id: int) -> Iterator[Any]:
        return _model.ancestors({s["snapshot-id"]: s for s in self._view.get("snapshots") or ()}, snapshot_id)

    def _is_ancestor(self, ancestor: int, of: int) -> bool:
        return any(s["snapshot-id"] == ancestor for s in self._ancestors(of))

    @staticmethod
    def _retention(**values: Any) -> dict[str, Any]:
        for name, value in values.items():
            if value is not None and (type(value) is not int or value <= 0):
                raise ValueError(f"{name} must be a positive integer, not {value!r}")
        return values

    def _set(self, name: str, snapshot_id: int, kind: str, ref: dict[str, Any] | None = None, **retention: Any):
        kept = {
            "min_snapshots_to_keep": (ref or {}).get("min-snapshots-to-keep"),
            "max_snapshot_age_ms": (ref or {}).get("max-snapshot-age-ms"),
            "max_ref_age_ms": (ref or {}).get("max-ref-age-ms"),
        }
        kept.update({k: v for k, v in retention.items() if v is not None})
        if kind == "tag":
            kept.pop("min_snapshots_to_keep")
            kept.pop("max_snapshot_age_ms")
        return SetSnapshotRef(name, snapshot_id, kind, **kept)

    # --- branches and tags ----------------------------------------------------------------

    def create_branch(
        self, name: str, snapshot_id: int | None = None, *,
        max_ref_age_ms: int | None = None, max_snapshot_age_ms: int | None = None,
        min_snapshots_to_keep: int | None = None,
    ) -> ManageSnapshots:  # fmt: skip
        """A new branch at ``snapshot_id`` (default: the current snapshot)."""
        name = self._new_name(name)
        sid = self._snapshot(self._current() if snapshot_id is None else snapshot_id)["snapshot-id"]
        retention = self._retention(max_ref_age_ms=max_ref_age_ms, max_snapshot_age_ms=max_snapshot_age_ms,
                                    min_snapshots_to_keep=min_snapshots_to_keep)  # fmt: skip
        self._add(self._set(name, sid, "branch", **retention))
        return self

    def create_tag(self, name: str, snapshot_id: int, *, max_ref_age_ms: int | None = None) -> ManageSnapshots:
        """A new tag at ``snapshot_id``."""
        name = self._new_name(name)
        sid = self._snapshot(snapshot_id)["snapshot-id"]
        self._add(self._set(name, sid, "tag", **self._retention(max_ref_age_ms=max_ref_age_ms)))
        return self

    def replace_branch(
        self, name: str, snapshot_id: int, *,
        max_ref_age_ms: int | None = None, max_snapshot_age_ms: int | None = None,
        min_snapshots_to_keep: int | None = None,
    ) -> ManageSnapshots:  # fmt: skip
        """Point branch ``name`` at ``snapshot_id`` (any snapshot of the table); retention
        kept unless given."""
        ref = self._ref(name, "branch")
        sid = self._snapshot(snapshot_id)["snapshot-id"]
        retention = self._retention(max_ref_age_ms=max_ref_age_ms, max_snapshot_age_ms=max_snapshot_age_ms,
                                    min_snapshots_to_keep=min_snapshots_to_keep)  # fmt: skip
        self._add(self._set(name, sid, "branch", ref, **retention))
        return self

    def replace_tag(self, name: str, snapshot_id: int, *, max_ref_age_ms: int | None = None) -> ManageSnapshots:
        """Point tag ``name`` at ``snapshot_id``; retention kept unless given."""
        ref = self._ref(name, "tag")
        sid = self._snapshot(snapshot_id)["snapshot-id"]
        self._add(self._set(name, sid, "tag", ref, **self._retention(max_ref_age_ms=max_ref_age_ms)))
        return self

    def rename_branch(self, name: str, new_name: str) -> ManageSnapshots:
        """Rename branch ``name`` (not ``main``) to ``new_name``, keeping its head and retention."""
        if name == MAIN_BRANCH:
            raise ValueError("the main branch cannot be renamed")
        ref = self._ref(name, "branch")
        new_name = self._new_name(new_name)
        self._add(self._set(new_name, ref["snapshot-id"], "branch", ref), RemoveSnapshotRef(name))
        return self

    def remove_branch(self, name: str) -> ManageSnapshots:
        """Remove branch ``name`` (not ``main``); its snapshots stay until expired."""
        if name == MAIN_BRANCH:
            raise ValueError("the main branch cannot be removed")
        self._ref(name, "branch")
        self._add(RemoveSnapshotRef(name))
        return self

    def remove_tag(self, name: str) -> ManageSnapshots:
        """Remove tag ``name``."""
        self._ref(name, "tag")
        self._add(RemoveSnapshotRef(name))
        return self

    def fast_forward(self, branch: str, to: str) -> ManageSnapshots:
        """Move ``branch`` to the head of ref ``to``, which must descend from it."""
        ref = self._ref(branch, "branch")
        target = self._refs().get(to)
        if target is None:
            raise ValueError(f"{self._base_location}: there is no ref {to!r}")
        if not self._is_ancestor(ref["snapshot-id"], target["snapshot-id"]):
            raise ValueError(
                f"{self._base_location}: cannot fast-forward {branch!r} to {to!r}: snapshot "
                f"{ref['snapshot-id']} is not an ancestor of {target['snapshot-id']}"
            )
        self._add(self._set(branch, target["snapshot-id"], "branch", ref))
        return self

    def cherry_pick(self, snapshot_id: int) -> ManageSnapshots:
        """Publish snapshot ``snapshot_id`` on main, as Java's cherry-pick: fast-forward
        main when the snapshot's parent is main's head; otherwise re-apply an append's
        files as a new snapshot (summary ``source-snapshot-id``, and ``published-wap-id``
        for a write-audit-publish staged snapshot), which must then be the only change
        of this operation.  Refused: a snapshot already in main's history or already
        picked, a wap id already published, other operations."""
        from icecrypt.table.ops.cherry_pick import check_pick, is_fast_forward

        if getattr(self, "_pick", None) is not None:
            raise ValueError("a cherry-pick that re-applies an append is committed on its own")
        snapshot = check_pick(self._view, snapshot_id, self._base_location)
        if is_fast_forward(self._view, snapshot):
            self._move_main(snapshot["snapshot-id"])
            return self
        if self._updates:
            raise ValueError(
                f"cannot cherry-pick snapshot {snapshot_id} here: re-applying an append is its own commit "
                "(use a separate manage_snapshots())"
            )
        if self._done:
            raise ValueError(f"this {self.what} was already committed; start a new one")
        self._pick = snapshot_id
        return self

    def _add(self, *updates: _model.TableUpdate) -> None:
        if getattr(self, "_pick", None) is not None:
            raise ValueError("a cherry-pick that re-applies an append is committed on its own")
        super()._add(*updates)

    # --- the current snapshot -------------------------------------------------------------

    def _move_main(self, snapshot_id: int) -> None:
        ref = self._refs().get(MAIN_BRANCH)
        self._add(self._set(MAIN_BRANCH, snapshot_id, "branch", ref))

    def set_current_snapshot(self, snapshot: int | str) -> ManageSnapshots:
        """Make ``snapshot`` (a snapshot id, or the name of a ref) the current snapshot
        (``main``), whether or not it descends from the current one."""
        if isinstance(snapshot, str):
            ref = self._refs().get(snapshot)
            if ref is None:
                raise ValueError(f"{self._base_location}: there is no ref {snapshot!r}")
            snapshot = ref["snapshot-id"]
        self._move_main(self._snapshot(snapshot)["snapshot-id"])
        return self

    def rollback_to_snapshot(self, snapshot_id: int) -> ManageSnapshots:
        """Make ``snapshot_id``, an ancestor of the current snapshot, current."""
        sid = self._snapshot(snapshot_id)["snapshot-id"]
        current = self._current()
        if not self._is_ancestor(sid, current):
            raise ValueError(
                f"{self._base_location}: cannot roll back to snapshot {sid}: it is not an ancestor "
                f"of the current snapshot {current}"
            )
        self._move_main(sid)
        return self

    def rollback_to_timestamp(self, timestamp_ms: int) -> ManageSnapshots:
        """Make current the newest ancestor of the current snapshot committed before
        ``timestamp_ms`` (ms since the epoch)."""
        if type(timestamp_ms) is not int:
            raise ValueError(f"timestamp_ms must be an integer (ms since the epoch), not {timestamp_ms!r}")
        for snapshot in self._ancestors(self._current()):
            if snapshot["timestamp-ms"] < timestamp_ms:
                self._move_main(snapshot["snapshot-id"])
                return self
        raise ValueError(
            f"{self._base_location}: no ancestor of the current snapshot is older than {timestamp_ms}"
        )


#: properties with their own operation, or that the table object pins (never set here)
_GUARDED_PREFIXES = ("encryption.",)
_PINNED = ("write.data.path", "write.metadata.path", "write.object-storage.path", "write.folder-storage.path")
#: Java's reserved table properties: metadata fields, never stored as properties
_RESERVED = (
    "format-version", "uuid", "snapshot-count", "current-snapshot-id", "current-snapshot-summary",
    "current-snapshot-timestamp-ms", "current-schema", "default-partition-spec", "default-sort-order",
)  # fmt: skip
_NON_NEGATIVE_INTS = (
    "commit.retry.num-retries", "commit.retry.min-wait-ms", "commit.retry.max-wait-ms",
    "commit.retry.total-timeout-ms", "write.metadata.previous-versions-max",
    "history.expire.min-snapshots-to-keep", "history.expire.max-snapshot-age-ms", "history.expire.max-ref-age-ms",
)  # fmt: skip


class UpdateProperties(_Operation):
    """Table properties (``table.update_properties()``), as a context manager::

        with table.update_properties() as props:
            props.set("commit.retry.num-retries", "10").remove("owner")

    Encryption properties (``encryption.*``; changing the master key is
    :meth:`~icecrypt.table.EncryptedTable.rotate_keys`), the pinned write locations and
    Java's reserved names are refused (ValueError, nothing committed)."""

    what = "property update"

    def __init__(self, table: Any) -> None:
        super().__init__(table)
        self._set_values: dict[str, str] = {}
        self._removals: list[str] = []

    def _check_key(self, key: Any) -> str:
        if self._done:
            raise ValueError(f"this {self.what} was already committed; start a new one")
        if not isinstance(key, str) or not key:
            raise ValueError(f"a property name must be a non-empty string, not {key!r}")
        if key.startswith(_GUARDED_PREFIXES):
            raise ValueError(
                f"{key!r} is an encryption property: it is not changed by update_properties "
                "(rotate_keys changes the master key)"
            )
        if key in _PINNED:
            raise ValueError(f"{key!r} is a location the table object pins; it cannot be changed here")
        if key in _RESERVED:
            raise ValueError(f"{key!r} is reserved (table metadata, not a property)")
        return key

    def set(self, key: str, value: str) -> UpdateProperties:
        key = self._check_key(key)
        if not isinstance(value, str):
            raise ValueError(f"property {key!r}: values are strings, not {type(value).__name__}")
        if key in _NON_NEGATIVE_INTS and not (value.isdigit() and value.isascii()):
            raise ValueError(f"property {key!r} must be a non-negative integer, not {value!r}")
        if key in self._removals:
            raise ValueError(f"property {key!r} is both set and removed")
        self._set_values[key] = value
        return self

    def remove(self, key: str) -> UpdateProperties:
        key = self._check_key(key)
        if key in self._set_values:
            raise ValueError(f"property {key!r} is both set and removed")
        if key not in self._removals:
            self._removals.append(key)
        return self

    def commit(self) -> str | None:
        if not self._done:
            if self._set_values:
                self._updates.append(SetProperties(dict(self._set_values)))
            if self._removals:
                self._updates.append(RemoveProperties(tuple(self._removals)))
        return super().commit()

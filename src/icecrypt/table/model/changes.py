"""The commit model's vocabulary: Iceberg's table updates and requirements (the REST
catalog protocol's ``action``/``type`` names), and a pure :func:`apply` that turns a
metadata document and a list of updates into the next document.

Nothing here does IO or talks to a KMS.  :func:`apply` copies on write: the result is
a shallow copy of the base's top level, and only the containers an update changes are
replaced (never edited in place), so the base stays exactly as read and key order and
unknown fields carry over, as the write path has always built its versions
(``_write._snapshot_metadata``).  A change is validated against the newest base by
its requirements (:func:`requirements_for` derives them from the updates as Java's
``UpdateRequirements.forUpdateTable`` does) before it is applied there.
"""

from __future__ import annotations

import posixpath
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from icecrypt.errors import CommitConflictError, FormatError

__all__ = [
    "AddEncryptionKey",
    "AddSchema",
    "AddSnapshot",
    "AddSortOrder",
    "AddSpec",
    "AssertCurrentSchemaId",
    "AssertDefaultSortOrderId",
    "AssertDefaultSpecId",
    "AssertLastAssignedFieldId",
    "AssertLastAssignedPartitionId",
    "AssertRefSnapshotId",
    "AssertTableUUID",
    "Change",
    "RemoveEncryptionKey",
    "RemoveProperties",
    "RemoveSnapshotRef",
    "RemoveSnapshots",
    "RequirementFailed",
    "ResetMetadataLog",
    "RestoreSnapshotKeyIds",
    "SetCurrentSchema",
    "SetDefaultSortOrder",
    "SetDefaultSpec",
    "SetEncryptionKeys",
    "SetProperties",
    "SetSnapshotRef",
    "UpgradeFormatVersion",
    "apply",
    "check_ref_name",
    "check_refs",
    "ref_name_problem",
    "requirements_for",
]

MAIN_BRANCH = "main"
MAX_PREVIOUS_VERSIONS = 100  # write.metadata.previous-versions-max, as in Java
REF_TYPES = ("branch", "tag")


#: the longest ref name, in UTF-8 bytes: a file name component's limit (NAME_MAX), so a
#: name fits wherever a ref name may end up (a path segment, a catalog column, a log line)
MAX_REF_NAME_BYTES = 255


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def _shown(name: str) -> str:
    """A ref name for a message: escaped (repr), a long one cut."""
    return repr(name) if len(name) <= 80 else f"{name[:60]!r}... ({len(name)} characters)"


def ref_name_problem(name: Any) -> str | None:
    """Why ``name`` cannot be a branch or tag name (None: it can).  Iceberg Java takes any
    non-null string; icecrypt also refuses what is dangerous to show, store or, should a
    ref name ever reach one, put in a path: an empty name, more than MAX_REF_NAME_BYTES
    bytes, control or format characters (escapes, bidirectional overrides, zero-width
    marks) and line separators, leading or trailing whitespace (``"main "``), what
    :func:`icecrypt._paths.check_location_text` refuses in a location (a backslash,
    percent-encoded dot segments, separators or NUL), and ``.``, ``..`` or empty ``/``
    segments.  ``/`` between other segments is allowed (``feature/x``)."""
    import unicodedata

    from icecrypt._paths import check_location_text

    if not isinstance(name, str) or not name:
        return "not a non-empty string"
    if len(name.encode("utf-8", "surrogatepass")) > MAX_REF_NAME_BYTES:
        return f"longer than {MAX_REF_NAME_BYTES} bytes"
    for char in name:
        if unicodedata.category(char) in ("Cc", "Cf", "Cs", "Zl", "Zp"):
            return f"it holds the character U+{ord(char):04X} ({unicodedata.category(char)})"
    if name != name.strip():
        return "it starts or ends with whitespace"
    try:
        check_location_text(name)
    except ValueError as exc:
        return str(exc)
    if any(segment in ("", ".", "..") for segment in name.split("/")):
        return "it has an empty, '.' or '..' segment between '/'"
    return None


def check_ref_name(name: Any) -> str:
    """``name`` when it can be a branch or tag name (:func:`ref_name_problem`), else
    ValueError saying why."""
    problem = ref_name_problem(name)
    if problem is not None:
        shown = _shown(name) if isinstance(name, str) else repr(name)
        raise ValueError(f"ref name {shown} is refused: {problem}")
    return name


# --- updates -----------------------------------------------------------------------------------


class TableUpdate:
    """One table update; ``action`` is its REST name.  ``local``: icecrypt's own update,
    not in the REST vocabulary (a REST catalog is never sent one: the committer applies
    it to the document it commits)."""

    action: ClassVar[str]
    local: ClassVar[bool] = False


@dataclass(frozen=True)
class SetProperties(TableUpdate):
    action: ClassVar[str] = "set-properties"
    updates: Mapping[str, str]


@dataclass(frozen=True)
class RemoveProperties(TableUpdate):
    action: ClassVar[str] = "remove-properties"
    removals: tuple[str, ...]


@dataclass(frozen=True)
class SetSnapshotRef(TableUpdate):
    action: ClassVar[str] = "set-snapshot-ref"
    ref_name: str
    snapshot_id: int
    type: str = "branch"
    min_snapshots_to_keep: int | None = None
    max_snapshot_age_ms: int | None = None
    max_ref_age_ms: int | None = None

    def ref_json(self) -> dict[str, Any]:
        """The ref as ``metadata.json`` records it (Java's field order)."""
        ref: dict[str, Any] = {"snapshot-id": self.snapshot_id, "type": self.type}
        for name, value in (
            ("min-snapshots-to-keep", self.min_snapshots_to_keep),
            ("max-snapshot-age-ms", self.max_snapshot_age_ms),
            ("max-ref-age-ms", self.max_ref_age_ms),
        ):
            if value is not None:
                ref[name] = value
        return ref


@dataclass(frozen=True)
class RemoveSnapshotRef(TableUpdate):
    action: ClassVar[str] = "remove-snapshot-ref"
    ref_name: str


@dataclass(frozen=True)
class AddSnapshot(TableUpdate):
    action: ClassVar[str] = "add-snapshot"
    snapshot: Mapping[str, Any]


@dataclass(frozen=True)
class RemoveSnapshots(TableUpdate):
    action: ClassVar[str] = "remove-snapshots"
    snapshot_ids: tuple[int, ...]


@dataclass(frozen=True)
class AddEncryptionKey(TableUpdate):
    action: ClassVar[str] = "add-encryption-key"
    encryption_key: Mapping[str, Any]  # the ``encryption-keys`` entry (wrapped key material only)


@dataclass(frozen=True)
class RemoveEncryptionKey(TableUpdate):
    action: ClassVar[str] = "remove-encryption-key"
    key_id: str


@dataclass(frozen=True)
class SetEncryptionKeys(TableUpdate):
    """The whole ``encryption-keys`` list, in this order (icecrypt's own update, not in the
    REST vocabulary): a key rotation puts the new KEK first, where Java's writers pick
    it, and a master-key rotation replaces every KEK's wrapped bytes; through REST the
    same list is reached by removing the entries and adding them back in order."""

    action: ClassVar[str] = "set-encryption-keys"
    local: ClassVar[bool] = True
    encryption_keys: tuple[Mapping[str, Any], ...]


@dataclass(frozen=True)
class RestoreSnapshotKeyIds(TableUpdate):
    """Snapshots get back the ``key-id`` a writer that does not know encryption dropped
    (icecrypt's own update, not in the REST vocabulary: ``repair_keys``).  ``key_ids``:
    snapshot id -> key id; a missing one is written as the snapshot's last field, where
    Java writes it.  A snapshot not in the table, or one that carries another
    ``key-id``, is refused (ValueError): this restores, it never replaces."""

    action: ClassVar[str] = "restore-snapshot-key-ids"
    local: ClassVar[bool] = True
    key_ids: Mapping[int, str]


@dataclass(frozen=True)
class ResetMetadataLog(TableUpdate):
    """An empty ``metadata-log``, the base not logged either (icecrypt's own update, not in
    the REST vocabulary): a re-key's cleanup, after which the older metadata files,
    which hold the leaked keys, are deleted."""

    action: ClassVar[str] = "reset-metadata-log"
    local: ClassVar[bool] = True


@dataclass(frozen=True)
class AddSchema(TableUpdate):
    action: ClassVar[str] = "add-schema"
    schema: Mapping[str, Any]


@dataclass(frozen=True)
class SetCurrentSchema(TableUpdate):
    action: ClassVar[str] = "set-current-schema"
    schema_id: int


@dataclass(frozen=True)
class AddSpec(TableUpdate):
    action: ClassVar[str] = "add-spec"
    spec: Mapping[str, Any]


@dataclass(frozen=True)
class SetDefaultSpec(TableUpdate):
    action: ClassVar[str] = "set-default-spec"
    spec_id: int


@dataclass(frozen=True)
class AddSortOrder(TableUpdate):
    action: ClassVar[str] = "add-sort-order"
    sort_order: Mapping[str, Any]


@dataclass(frozen=True)
class SetDefaultSortOrder(TableUpdate):
    action: ClassVar[str] = "set-default-sort-order"
    sort_order_id: int


@dataclass(frozen=True)
class UpgradeFormatVersion(TableUpdate):
    action: ClassVar[str] = "upgrade-format-version"
    format_version: int


# --- requirements ------------------------------------------------------------------------------


class RequirementFailed(CommitConflictError):
    """A requirement of a change does not hold on the version it would be committed on."""


class TableRequirement:
    """A condition the base version must meet; ``type`` is its REST name."""

    type: ClassVar[str]

    def validate(self, metadata: Mapping[str, Any]) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class AssertTableUUID(TableRequirement):
    type: ClassVar[str] = "assert-table-uuid"
    uuid: str

    def validate(self, metadata: Mapping[str, Any]) -> None:
        if str(metadata.get("table-uuid")) != self.uuid:
            raise RequirementFailed(f"table UUID changed: expected {self.uuid}, found {metadata.get('table-uuid')}")


@dataclass(frozen=True)
class AssertRefSnapshotId(TableRequirement):
    """The ref points at ``snapshot_id`` (None: the ref does not exist)."""

    type: ClassVar[str] = "assert-ref-snapshot-id"
    ref: str
    snapshot_id: int | None

    def validate(self, metadata: Mapping[str, Any]) -> None:
        ref = (metadata.get("refs") or {}).get(self.ref)
        found = None if ref is None else ref.get("snapshot-id")
        if self.ref == MAIN_BRANCH and ref is None:
            current = metadata.get("current-snapshot-id")
            found = None if current in (None, -1) else current
        if found != self.snapshot_id:
            if self.snapshot_id is None:
                raise RequirementFailed(f"ref {self.ref!r} was created concurrently (at snapshot {found})")
            if found is None:
                raise RequirementFailed(f"ref {self.ref!r} was removed concurrently")
            raise RequirementFailed(
                f"ref {self.ref!r} moved concurrently: expected snapshot {self.snapshot_id}, found {found}"
            )


def _field_requirement(type_name: str, key: str, what: str) -> type:
    @dataclass(frozen=True)
    class _Assert(TableRequirement):
        value: int

        def validate(self, metadata: Mapping[str, Any]) -> None:
            if metadata.get(key) != self.value:
                raise RequirementFailed(f"{what} changed concurrently: expected {self.value}, found {metadata.get(key)}")

    _Assert.type = type_name  # type: ignore[misc]
    return _Assert


AssertCurrentSchemaId = _field_requirement("assert-current-schema-id", "current-schema-id", "current schema id")
AssertDefaultSpecId = _field_requirement("assert-default-spec-id", "default-spec-id", "default spec id")
AssertDefaultSortOrderId = _field_requirement(
    "assert-default-sort-order-id", "default-sort-order-id", "default sort order id"
)
AssertLastAssignedFieldId = _field_requirement("assert-last-assigned-field-id", "last-column-id", "last column id")
AssertLastAssignedPartitionId = _field_requirement(
    "assert-last-assigned-partition-id", "last-partition-id", "last partition id"
)
for _cls, _name in (
    (AssertCurrentSchemaId, "AssertCurrentSchemaId"),
    (AssertDefaultSpecId, "AssertDefaultSpecId"),
    (AssertDefaultSortOrderId, "AssertDefaultSortOrderId"),
    (AssertLastAssignedFieldId, "AssertLastAssignedFieldId"),
    (AssertLastAssignedPartitionId, "AssertLastAssignedPartitionId"),
):
    _cls.__name__ = _cls.__qualname__ = _name


def ref_snapshot(metadata: Mapping[str, Any], name: str) -> int | None:
    """The snapshot ref ``name`` points at (``main``: the current snapshot), or None."""
    ref = (metadata.get("refs") or {}).get(name)
    if ref is not None:
        return ref.get("snapshot-id")
    if name == MAIN_BRANCH and metadata.get("current-snapshot-id") not in (None, -1):
        return metadata["current-snapshot-id"]
    return None


def requirements_for(base: Mapping[str, Any], updates: Iterable[TableUpdate]) -> tuple[TableRequirement, ...]:
    """The requirements ``updates`` built on ``base`` need, as Java's
    ``UpdateRequirements.forUpdateTable``: always the table UUID; a ref set or removed
    must still point where it pointed in ``base`` (once per ref); a schema, spec or
    sort order added or made current needs the ids it was built from."""
    found: dict[tuple[str, Any], TableRequirement] = {}

    def need(requirement: TableRequirement, key: Any = None) -> None:
        found.setdefault((requirement.type, key), requirement)

    need(AssertTableUUID(str(base.get("table-uuid"))))
    for update in updates:
        if isinstance(update, (SetSnapshotRef, RemoveSnapshotRef)):
            need(AssertRefSnapshotId(update.ref_name, ref_snapshot(base, update.ref_name)), update.ref_name)
        elif isinstance(update, AddSchema):
            need(AssertLastAssignedFieldId(base.get("last-column-id")))
        elif isinstance(update, SetCurrentSchema):
            need(AssertCurrentSchemaId(base.get("current-schema-id")))
        elif isinstance(update, AddSpec):
            need(AssertLastAssignedPartitionId(base.get("last-partition-id")))
        elif isinstance(update, SetDefaultSpec):
            need(AssertDefaultSpecId(base.get("default-spec-id")))
        elif isinstance(update, SetDefaultSortOrder):
            need(AssertDefaultSortOrderId(base.get("default-sort-order-id")))
    return tuple(found.values())


@dataclass(frozen=True)
class Change:
    """A change to a table: updates, with the requirements the version it is committed
    on must meet (its own plus those :func:`requirements_for` derives from ``base``)."""

    updates: tuple[TableUpdate, ...]
    requirements: tuple[TableRequirement, ...] = ()
    what: str = "table change"  # for messages: "snapshot management", "property update"

    @classmethod
    def on(cls, base: Mapping[str, Any], updates: Sequence[TableUpdate], *, what: str = "table change") -> Change:
        return cls(tuple(updates), requirements_for(base, updates), what)

    def validate(self, metadata: Mapping[str, Any]) -> None:
        for requirement in self.requirements:
            requirement.validate(metadata)


# --- apply -------------------------------------------------------------------------------------


def log_previous(metadata: dict[str, Any], base: Mapping[str, Any], base_location: str) -> None:
    """Append the base version to ``metadata-log`` of ``metadata`` (a copy being built),
    trimmed to ``write.metadata.previous-versions-max`` entries as Java trims it."""
    custom = (base.get("properties") or {}).get("write.metadata.path")  # where Java puts a catalog table's files
    root = custom.rstrip("/") if custom else f"{base['location'].rstrip('/')}/metadata"
    recorded = f"{root}/{posixpath.basename(base_location)}"
    log = list(metadata.get("metadata-log") or []) + [
        {"timestamp-ms": base.get("last-updated-ms", 0), "metadata-file": recorded}
    ]
    raw = (metadata.get("properties") or {}).get("write.metadata.previous-versions-max", MAX_PREVIOUS_VERSIONS)
    limit = max(1, int(raw))
    metadata["metadata-log"] = log[-limit:]


@dataclass
class _Builder:
    base: Mapping[str, Any]
    now: int
    metadata: dict[str, Any] = field(init=False)
    log_base: bool = field(default=True, init=False)

    def __post_init__(self) -> None:
        self.metadata = dict(self.base)

    def replace(self, key: str, value: Any) -> None:
        self.metadata[key] = value

    def snapshot_ids(self) -> set[int]:
        return {s["snapshot-id"] for s in self.metadata.get("snapshots") or ()}

    def by_id(self, key: str, id_key: str, value: int, what: str) -> None:
        if not any(entry.get(id_key) == value for entry in self.metadata.get(key) or ()):
            raise ValueError(f"cannot use {what} {value}: the table has none")


def _set_ref(b: _Builder, update: SetSnapshotRef) -> None:
    check_ref_name(update.ref_name)
    if update.type not in REF_TYPES:
        raise ValueError(f"ref {update.ref_name!r}: type must be 'branch' or 'tag', not {update.type!r}")
    if update.snapshot_id not in b.snapshot_ids():
        raise ValueError(f"ref {update.ref_name!r}: snapshot {update.snapshot_id} is not in the table")
    refs = dict(b.metadata.get("refs") or {})
    old = refs.get(update.ref_name)
    refs[update.ref_name] = update.ref_json()
    b.replace("refs", refs)
    if update.ref_name == MAIN_BRANCH and (old is None or old.get("snapshot-id") != update.snapshot_id
                                          or b.metadata.get("current-snapshot-id") != update.snapshot_id):
        b.replace("current-snapshot-id", update.snapshot_id)
        b.replace("snapshot-log", list(b.metadata.get("snapshot-log") or [])
                  + [{"timestamp-ms": b.now, "snapshot-id": update.snapshot_id}])  # fmt: skip


def _remove_ref(b: _Builder, update: RemoveSnapshotRef) -> None:
    refs = dict(b.metadata.get("refs") or {})
    if refs.pop(update.ref_name, None) is None:
        return  # as Java: removing a ref that is not there changes nothing
    b.replace("refs", refs)
    if update.ref_name == MAIN_BRANCH:
        b.replace("current-snapshot-id", -1)


def _add_snapshot(b: _Builder, update: AddSnapshot) -> None:
    snapshot = dict(update.snapshot)
    if snapshot["snapshot-id"] in b.snapshot_ids():
        raise ValueError(f"snapshot {snapshot['snapshot-id']} is already in the table")
    b.replace("snapshots", list(b.metadata.get("snapshots") or []) + [snapshot])
    if "sequence-number" in snapshot:
        b.replace("last-sequence-number", max(b.metadata.get("last-sequence-number", 0), snapshot["sequence-number"]))
    if "first-row-id" in snapshot and "added-rows" in snapshot:
        b.replace("next-row-id", snapshot["first-row-id"] + snapshot["added-rows"])


def _remove_snapshots(b: _Builder, update: RemoveSnapshots) -> None:
    gone = set(update.snapshot_ids)
    b.replace("snapshots", [s for s in b.metadata.get("snapshots") or [] if s["snapshot-id"] not in gone])
    b.replace("snapshot-log", [e for e in b.metadata.get("snapshot-log") or [] if e["snapshot-id"] not in gone])
    for name in ("statistics", "partition-statistics"):
        if name in b.metadata:
            b.replace(name, [e for e in b.metadata[name] if e.get("snapshot-id") not in gone])
    refs = b.metadata.get("refs") or {}
    if any(ref.get("snapshot-id") in gone for ref in refs.values()):
        b.replace("refs", {name: ref for name, ref in refs.items() if ref.get("snapshot-id") not in gone})


def _set_properties(b: _Builder, update: SetProperties) -> None:
    properties = dict(b.metadata.get("properties") or {})
    properties.update({str(k): str(v) for k, v in update.updates.items()})
    b.replace("properties", properties)


def _remove_properties(b: _Builder, update: RemoveProperties) -> None:
    properties = dict(b.metadata.get("properties") or {})
    for key in update.removals:
        properties.pop(key, None)
    b.replace("properties", properties)


def _add_encryption_key(b: _Builder, update: AddEncryptionKey) -> None:
    keys = list(b.metadata.get("encryption-keys") or [])
    if any(k.get("key-id") == update.encryption_key.get("key-id") for k in keys):
        return  # as Java: a key id already there is kept as it is
    _put_encryption_keys(b, [*keys, dict(update.encryption_key)])


def _remove_encryption_key(b: _Builder, update: RemoveEncryptionKey) -> None:
    _put_encryption_keys(b, [k for k in b.metadata.get("encryption-keys") or [] if k.get("key-id") != update.key_id])


def _restore_snapshot_key_ids(b: _Builder, update: RestoreSnapshotKeyIds) -> None:
    missing = set(update.key_ids) - b.snapshot_ids()
    if missing:
        raise ValueError(f"restore-snapshot-key-ids: snapshot(s) {sorted(missing)} not in the table")
    snapshots = []
    for snapshot in b.metadata.get("snapshots") or ():
        key_id = update.key_ids.get(snapshot["snapshot-id"])
        if key_id is not None and snapshot.get("key-id") != key_id:
            if snapshot.get("key-id") is not None:
                raise ValueError(
                    f"restore-snapshot-key-ids: snapshot {snapshot['snapshot-id']} has another key-id; not replaced"
                )
            snapshot = {**snapshot, "key-id": key_id}
        snapshots.append(snapshot)
    b.replace("snapshots", snapshots)


def _set_encryption_keys(b: _Builder, update: SetEncryptionKeys) -> None:
    ids = [k.get("key-id") for k in update.encryption_keys]
    if len(set(ids)) != len(ids):
        raise ValueError("set-encryption-keys: a key id is listed twice")
    _put_encryption_keys(b, [dict(k) for k in update.encryption_keys])


def _put_encryption_keys(b: _Builder, keys: list[dict[str, Any]]) -> None:
    """``encryption-keys`` becomes ``keys``: an existing list replaced where it stands, an
    empty one removed (as Java writes it: only when non-empty), a new one put where
    Java's TableMetadataParser writes it: right after next-row-id (else before refs,
    else before snapshots, else at the end)."""
    if not keys:
        b.metadata.pop("encryption-keys", None)
        return
    if "encryption-keys" in b.metadata:
        b.replace("encryption-keys", keys)
        return
    names = list(b.metadata)
    if "next-row-id" in b.metadata:
        index = names.index("next-row-id") + 1
    elif "refs" in b.metadata:
        index = names.index("refs")
    elif "snapshots" in b.metadata:
        index = names.index("snapshots")
    else:
        index = len(names)
    items = list(b.metadata.items())
    b.metadata = dict(items[:index] + [("encryption-keys", keys)] + items[index:])


def _add_entry(key: str, id_key: str, last_key: str | None, value: Mapping[str, Any], b: _Builder) -> None:
    entries = list(b.metadata.get(key) or [])
    if any(entry.get(id_key) == value.get(id_key) for entry in entries):
        raise ValueError(f"{key}: id {value.get(id_key)} exists")
    b.replace(key, entries + [dict(value)])
    if last_key == "last-column-id":
        b.replace(last_key, max(b.metadata.get(last_key, 0), _highest_field_id(value)))
    elif last_key == "last-partition-id":
        ids = [f.get("field-id", 0) for f in value.get("fields") or ()]
        b.replace(last_key, max([b.metadata.get(last_key, 999), *ids]))


def _highest_field_id(node: Any) -> int:
    """The largest field id a schema JSON (or any type in it) assigns."""
    if isinstance(node, Mapping):
        own = [v for k, v in node.items() if k in ("id", "element-id", "key-id", "value-id") and type(v) is int]
        nested = [_highest_field_id(v) for k, v in node.items() if k in ("fields", "type", "element", "key", "value")]
        return max([0, *own, *nested])
    if isinstance(node, list):
        return max([0, *(_highest_field_id(v) for v in node)])
    return 0


def _set_default_spec(b: _Builder, update: SetDefaultSpec) -> None:
    b.by_id("partition-specs", "spec-id", update.spec_id, "partition spec")
    b.replace("default-spec-id", update.spec_id)
    if "partition-spec" in b.metadata:  # v1's legacy copy of the default spec's fields
        spec = next(s for s in b.metadata["partition-specs"] if s.get("spec-id") == update.spec_id)
        b.replace("partition-spec", [dict(f) for f in spec.get("fields") or ()])


def _upgrade(b: _Builder, update: UpgradeFormatVersion) -> None:
    """The document as the new format version writes it (Java's parser reads v1's
    fields into the lists v2 writes): v1's single ``schema`` and ``partition-spec``
    become ``schemas`` / ``partition-specs`` (with ``last-partition-id`` and an unsorted
    ``sort-orders`` where missing) and are dropped; v2 starts ``last-sequence-number``
    at 0, v3 ``next-row-id`` at 0."""
    current = b.metadata.get("format-version", 1)
    if update.format_version < current:
        raise ValueError(f"cannot downgrade format-version {current} to {update.format_version}")
    if update.format_version > 3:
        raise ValueError(f"unsupported format-version {update.format_version}")
    if update.format_version >= 2:
        m = b.metadata
        if "schemas" not in m:
            schema = {**m["schema"], "schema-id": m["schema"].get("schema-id", 0)}
            b.replace("schemas", [schema])
            b.replace("current-schema-id", schema["schema-id"])
        if "partition-specs" not in m:
            b.replace("partition-specs", [{"spec-id": 0, "fields": list(m.get("partition-spec") or [])}])
            b.replace("default-spec-id", 0)
        if "last-partition-id" not in m:
            ids = [f.get("field-id", 999) for spec in m["partition-specs"] for f in spec.get("fields") or ()]
            b.replace("last-partition-id", max([999, *ids]))
        if "sort-orders" not in m:
            b.replace("sort-orders", [{"order-id": 0, "fields": []}])
            b.replace("default-sort-order-id", 0)
        for legacy in ("schema", "partition-spec"):
            m.pop(legacy, None)
        m.setdefault("last-sequence-number", 0)
    if update.format_version >= 3:
        b.metadata.setdefault("next-row-id", 0)
    b.replace("format-version", update.format_version)


_HANDLERS: dict[type, Any] = {
    SetSnapshotRef: _set_ref,
    RemoveSnapshotRef: _remove_ref,
    AddSnapshot: _add_snapshot,
    RemoveSnapshots: _remove_snapshots,
    SetProperties: _set_properties,
    RemoveProperties: _remove_properties,
    AddEncryptionKey: _add_encryption_key,
    RemoveEncryptionKey: _remove_encryption_key,
    SetEncryptionKeys: _set_encryption_keys,
    RestoreSnapshotKeyIds: _restore_snapshot_key_ids,
    ResetMetadataLog: lambda b, u: (b.replace("metadata-log", []), setattr(b, "log_base", False)),
    AddSchema: lambda b, u: _add_entry("schemas", "schema-id", "last-column-id", u.schema, b),
    SetCurrentSchema: lambda b, u: (b.by_id("schemas", "schema-id", u.schema_id, "schema"),
                                    b.replace("current-schema-id", u.schema_id)),
    AddSpec: lambda b, u: _add_entry("partition-specs", "spec-id", "last-partition-id", u.spec, b),
    SetDefaultSpec: _set_default_spec,
    AddSortOrder: lambda b, u: _add_entry("sort-orders", "order-id", None, u.sort_order, b),
    SetDefaultSortOrder: lambda b, u: (b.by_id("sort-orders", "order-id", u.sort_order_id, "sort order"),
                                       b.replace("default-sort-order-id", u.sort_order_id)),
    UpgradeFormatVersion: _upgrade,
}  # fmt: skip


def apply(
    base: Mapping[str, Any],
    updates: Iterable[TableUpdate],
    *,
    base_location: str | None = None,
    now: int | None = None,
) -> dict[str, Any]:
    """The metadata document ``updates`` make of ``base`` (which is not modified).

    ``last-updated-ms`` becomes ``now`` (default the clock), never earlier than the
    base's; with ``base_location`` (the base's metadata file) the base is appended to
    ``metadata-log``.  A ``set-snapshot-ref`` of ``main`` moves ``current-snapshot-id``
    and logs it in ``snapshot-log``.  Bad updates (an unknown snapshot, schema, spec or
    sort order; a duplicate id) raise ValueError.  When ``updates`` add a snapshot and
    no ``now`` is given, its ``timestamp-ms`` is the moment (as Java's builder: the
    snapshot's time is the version's ``last-updated-ms`` and its ``snapshot-log`` time)."""
    updates = tuple(updates)
    if now is None:
        added = [u.snapshot.get("timestamp-ms") for u in updates if isinstance(u, AddSnapshot)]
        now = added[-1] if added and type(added[-1]) is int else now_ms()
    moment = max(now, base.get("last-updated-ms", 0))
    builder = _Builder(base, moment)
    for update in updates:
        handler = _HANDLERS.get(type(update))
        if handler is None:
            raise TypeError(f"not a table update: {update!r}")
        handler(builder, update)
    builder.metadata["last-updated-ms"] = moment
    if base_location is not None and builder.log_base:
        log_previous(builder.metadata, base, base_location)
    return builder.metadata


def ancestors(by_id: Mapping[int, Mapping[str, Any]], snapshot_id: Any) -> Iterator[Mapping[str, Any]]:
    """Snapshot ``snapshot_id`` and its ancestors (``by_id``: the table's snapshots by id),
    newest first; stops at a missing parent or a cycle."""
    seen: set[int] = set()
    snapshot = by_id.get(snapshot_id)
    while snapshot is not None and snapshot["snapshot-id"] not in seen:
        seen.add(snapshot["snapshot-id"])
        yield snapshot
        snapshot = by_id.get(snapshot.get("parent-snapshot-id"))


# --- refs as read ------------------------------------------------------------------------------

_RETENTION = ("min-snapshots-to-keep", "max-snapshot-age-ms", "max-ref-age-ms")


def check_refs(metadata: Mapping[str, Any], location: str) -> None:
    """FormatError (naming ``location``) unless ``refs`` is an object of well-formed
    refs: a valid name (:func:`ref_name_problem`), an integer ``snapshot-id`` of one of the table's snapshots, type ``branch`` or
    ``tag``, positive integer retention (branch-only fields absent on tags), and
    ``main`` a branch at ``current-snapshot-id``."""
    refs = metadata.get("refs")
    if refs is None:
        return
    if not isinstance(refs, Mapping):
        raise FormatError(f"{location}: refs is not a JSON object")
    listed = metadata.get("snapshots")
    snapshots = {s.get("snapshot-id") for s in listed if isinstance(s, Mapping)} if isinstance(listed, list) else set()
    for name, ref in refs.items():
        problem = ref_name_problem(name)
        if problem is not None:
            shown = _shown(name) if isinstance(name, str) else repr(name)
            raise FormatError(f"{location}: ref name {shown} is not a valid branch or tag name ({problem})")
        if not isinstance(ref, Mapping):
            raise FormatError(f"{location}: ref {name!r} is not a JSON object")
        sid = ref.get("snapshot-id")
        if type(sid) is not int:
            raise FormatError(f"{location}: ref {name!r} has no integer snapshot-id")
        if sid not in snapshots:
            raise FormatError(f"{location}: ref {name!r} points at snapshot {sid}, which is not in the table")
        if ref.get("type") not in REF_TYPES:
            raise FormatError(f"{location}: ref {name!r} has type {ref.get('type')!r} (expected branch or tag)")
        for key in _RETENTION:
            value = ref.get(key)
            if value is not None and (type(value) is not int or value <= 0):
                raise FormatError(f"{location}: ref {name!r} has {key} {value!r} (expected a positive integer)")
        if ref["type"] == "tag" and any(ref.get(key) is not None for key in _RETENTION[:2]):
            raise FormatError(f"{location}: tag {name!r} carries branch retention ({', '.join(_RETENTION[:2])})")
    main = refs.get(MAIN_BRANCH)
    if main is not None:
        if main["type"] != "branch":
            raise FormatError(f"{location}: ref 'main' is a tag")
        current = metadata.get("current-snapshot-id")
        if current not in (None, -1) and current != main["snapshot-id"]:
            raise FormatError(
                f"{location}: ref 'main' points at snapshot {main['snapshot-id']} but current-snapshot-id is {current}"
            )

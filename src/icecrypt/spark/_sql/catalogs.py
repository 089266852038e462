"""The catalogs behind ``spark.sql.catalog.<name>``: built from the Spark catalog's
options, kept per name and options, and the identifiers Spark hands them resolved as
Iceberg's Spark catalog resolves them.

``type`` selects the catalog:

* ``sql`` (default): :class:`icecrypt.catalog.SqlCatalog` (``uri``: a SQLAlchemy URL,
  default SQLite in the warehouse);
* ``glue``: :class:`icecrypt.catalog.GlueCatalog`;
* ``hadoop`` (or ``path``): :class:`PathCatalog`, tables as directories under the
  warehouse, ``<warehouse>/<namespace levels>/<table>``, as Iceberg's Hadoop catalog
  lays them out: a namespace is a directory, a table one with a ``metadata`` directory.
  Option ``location-map`` (JSON, recorded location prefix -> local directory, as
  ``icecrypt.iceberg``'s option) reads tables whose metadata records another location
  (a copy, a table moved from object storage).

The other options are the catalog's properties (``warehouse``, ``uri``, ``s3.*``,
``glue.*``) and the KMS properties (``encryption.kms-type``, ``encryption.kms.*``).

An identifier that names no table is read as Iceberg's Spark catalog reads it: its last
part selects, in the table its other parts name, a metadata table (``db.t.snapshots``),
a branch (``db.t.branch_<name>``), a tag (``db.t.tag_<name>``), a snapshot
(``db.t.snapshot_id_<id>``) or the snapshot current at a moment (``db.t.at_timestamp_<ms>``).
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import re
import shutil
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs

from icecrypt._metadata_tables import METADATA_TABLES
from icecrypt.errors import (
    CatalogError,
    InvalidIdentifierError,
    NamespaceAlreadyExistsError,
    NamespaceNotEmptyError,
    NoSuchNamespaceError,
    NoSuchTableError,
    TableAlreadyExistsError,
)

__all__ = ["PathCatalog", "Selection", "open_catalog", "resolve"]

#: catalog options that are not catalog properties
_SPARK_OPTIONS = frozenset({"type"})
_PATH_TYPES = ("hadoop", "path")


class PathCatalog:
    """Tables as directories under a local warehouse, as Iceberg's Hadoop catalog keeps
    them: ``<warehouse>/<namespace levels>/<table>``; a table is a directory holding
    ``metadata/`` (``v<N>.metadata.json`` and ``version-hint.text``), a namespace any
    other directory.  Tables cannot be renamed (as in Iceberg's Hadoop catalog) nor
    given another location."""

    def __init__(self, name: str, **properties: str) -> None:
        self.name = name
        self.properties = dict(properties)
        warehouse = properties.get("warehouse")
        if not warehouse:
            raise CatalogError(f"catalog {name!r}: a hadoop catalog needs a warehouse (a local directory)")
        if warehouse.startswith("file://"):
            warehouse = warehouse[len("file://"):]
        elif warehouse.startswith("file:"):
            warehouse = warehouse[len("file:"):]
        if "://" in warehouse:
            raise CatalogError(f"catalog {name!r}: warehouse {warehouse!r}: a hadoop catalog's warehouse is a local "
                               "directory")
        self.warehouse = os.path.abspath(warehouse)
        self.filesystem = pafs.LocalFileSystem()
        self.location_map = _location_map(name, properties.get("location-map"))
        self._kms: Any = None

    @property
    def kms(self) -> Any:
        if self._kms is None and any(k in self.properties for k in ("encryption.kms-type", "encryption.kms-impl")):
            from icecrypt.kms import create_kms_client

            self._kms = create_kms_client(self.properties)
        return self._kms

    def _path(self, levels: tuple[str, ...], what: str) -> str:
        from icecrypt.catalog._base import _levels

        for level in _levels(levels, what):
            if level in (".", ".."):
                raise InvalidIdentifierError(f"{what} {'.'.join(levels)!r}: level {level!r} names no directory")
        return os.path.join(self.warehouse, *levels)

    #: in the metadata directory of a table being created by CREATE TABLE ... AS SELECT:
    #: until it goes, the directory is no table (its staged metadata is nobody's yet)
    STAGING = ".icecrypt-staging"

    @classmethod
    def _is_table(cls, path: str) -> bool:
        metadata = os.path.join(path, "metadata")
        if not os.path.isdir(metadata) or os.path.islink(path):
            return False
        names = os.listdir(metadata)
        if any(_HADOOP.fullmatch(n) for n in names):
            return True
        return cls.STAGING not in names and any(_METASTORE.fullmatch(n) for n in names)

    def begin_staging(self, location: str) -> None:
        """Mark ``location`` (a new table's) as staged: no table until end_staging."""
        metadata = os.path.join(location, "metadata")
        os.makedirs(metadata, exist_ok=True)
        with open(os.path.join(metadata, self.STAGING), "w", encoding="ascii"):
            pass

    def end_staging(self, location: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(location, "metadata", self.STAGING))

    def _metadata_file(self, path: str) -> str:
        """The table's current metadata file: by the version hint and ``v<N>`` files, or,
        in a directory another engine's catalog wrote (``<NNNNN>-<uuid>.metadata.json``
        only), the newest version in the lineage of its first one."""
        from icecrypt.table.commit.store import latest_metadata_location

        metadata = os.path.join(path, "metadata")
        names = os.listdir(metadata)
        if any(_HADOOP.fullmatch(n) for n in names):
            return path
        first = min((n for n in names if _METASTORE.fullmatch(n)), key=lambda n: int(n.split("-", 1)[0]))
        return latest_metadata_location(self.filesystem, os.path.join(metadata, first))

    def _describe(self, levels: tuple[str, ...], kind: str) -> str:
        return f"catalog {self.name!r}: {kind} {'.'.join(levels)}"

    # --- namespaces -------------------------------------------------------------------------

    def namespace_exists(self, namespace: tuple[str, ...]) -> bool:
        path = self._path(namespace, "namespace")
        return os.path.isdir(path) and not os.path.islink(path) and not os.path.isdir(os.path.join(path, "metadata"))

    def create_namespace(self, namespace: tuple[str, ...], properties: Mapping[str, str] | None = None) -> None:
        path = self._path(namespace, "namespace")
        if os.path.exists(path):
            raise NamespaceAlreadyExistsError(f"{self._describe(namespace, 'namespace')} already exists")
        if properties:
            raise CatalogError(f"{self._describe(namespace, 'namespace')}: a hadoop catalog keeps no namespace "
                               f"properties ({', '.join(sorted(properties))})")
        os.makedirs(path)

    def namespace_properties(self, namespace: tuple[str, ...]) -> dict[str, str]:
        if not self.namespace_exists(namespace):
            raise NoSuchNamespaceError(f"{self._describe(namespace, 'namespace')} does not exist")
        return {}  # a directory: no properties

    def update_namespace_properties(self, namespace: tuple[str, ...], removals: Any = (),
                                    updates: Mapping[str, str] | None = None) -> None:
        raise CatalogError(f"{self._describe(namespace, 'namespace')}: a hadoop catalog keeps no namespace properties")

    def list_namespaces(self) -> list[tuple[str, ...]]:
        found = []
        for directory, names, _ in os.walk(self.warehouse):
            relative = os.path.relpath(directory, self.warehouse)
            levels = () if relative == "." else tuple(relative.split(os.sep))
            keep = []
            for name in sorted(names):
                path = os.path.join(directory, name)
                if os.path.islink(path) or name.startswith((".", "_")) or os.path.isdir(os.path.join(path, "metadata")):
                    continue
                found.append((*levels, name))
                keep.append(name)
            names[:] = keep
        return sorted(found)

    def drop_namespace(self, namespace: tuple[str, ...]) -> None:
        if not self.namespace_exists(namespace):
            raise NoSuchNamespaceError(f"{self._describe(namespace, 'namespace')} does not exist")
        path = self._path(namespace, "namespace")
        if os.listdir(path):
            raise NamespaceNotEmptyError(f"{self._describe(namespace, 'namespace')} is not empty")
        os.rmdir(path)

    # --- tables ---------------------------------------------------------------------------------

    def table_location(self, identifier: tuple[str, ...]) -> str:
        if len(identifier) < 2:
            raise InvalidIdentifierError(f"table identifier {'.'.join(identifier)!r} needs a namespace and a name")
        return self._path(identifier, "table identifier")

    def list_tables(self, namespace: tuple[str, ...]) -> list[tuple[str, ...]]:
        if not self.namespace_exists(namespace):
            raise NoSuchNamespaceError(f"{self._describe(namespace, 'namespace')} does not exist")
        path = self._path(namespace, "namespace")
        return [(*namespace, n) for n in sorted(os.listdir(path)) if self._is_table(os.path.join(path, n))]

    def table_exists(self, identifier: tuple[str, ...]) -> bool:
        return self._is_table(self.table_location(identifier))

    def load_table(self, identifier: tuple[str, ...]) -> Any:
        from icecrypt.table import EncryptedTable

        path = self.table_location(identifier)
        if not self._is_table(path):
            raise NoSuchTableError(f"{self._describe(identifier, 'table')} does not exist")
        return EncryptedTable.load(self._metadata_file(path), kms=self.kms, filesystem=self.filesystem,
                                   location_map=self.location_map)

    def create_table(self, identifier: tuple[str, ...], schema: Any, *, table_key_id: str | None,
                     partition_spec: Any = None, properties: Mapping[str, str] | None = None,
                     location: str | None = None) -> Any:
        from icecrypt.table import EncryptedTable

        path = self.table_location(identifier)
        if location is not None and os.path.abspath(location.removeprefix("file:").removeprefix("//")) != path:
            raise CatalogError(f"{self._describe(identifier, 'table')}: a hadoop catalog's table lives at {path}; "
                               "another location cannot be given")
        if not self.namespace_exists(identifier[:-1]):
            raise NoSuchNamespaceError(f"{self._describe(identifier[:-1], 'namespace')} does not exist")
        if os.path.exists(path):
            raise TableAlreadyExistsError(f"{self._describe(identifier, 'table')} already exists"
                                          + ("" if self._is_table(path) else f" (a namespace or directory is at {path})"))
        return EncryptedTable.create(path, schema, kms=self.kms if table_key_id else None, table_key_id=table_key_id,
                                     partition_spec=partition_spec, properties=properties, filesystem=self.filesystem)

    def drop_table(self, identifier: tuple[str, ...], *, purge: bool = False) -> None:
        """Remove the table's directory (as Iceberg's Hadoop catalog does, with or
        without ``purge``: the directory is the table)."""
        path = self.table_location(identifier)
        if not self._is_table(path):
            raise NoSuchTableError(f"{self._describe(identifier, 'table')} does not exist")
        shutil.rmtree(path)  # never follows a symbolic link out of the table's directory

    def rename_table(self, source: tuple[str, ...], target: tuple[str, ...]) -> None:
        raise CatalogError(f"catalog {self.name!r}: a hadoop catalog cannot rename tables (a table's location is "
                           "its identifier)")

    def default_location(self, identifier: tuple[str, ...]) -> str:
        return self.table_location(identifier)

    def __repr__(self) -> str:
        return f"<PathCatalog {self.name!r} {self.warehouse}>"


_HADOOP = re.compile(r"v[0-9]+\.metadata\.json|version-hint\.text")
_METASTORE = re.compile(r"[0-9]+-[0-9a-fA-F-]+\.metadata\.json")


def _location_map(name: str, raw: str | None) -> dict[str, str] | None:
    if raw is None or not raw.strip():
        return None
    try:
        mapping = json.loads(raw)
    except ValueError as exc:
        raise CatalogError(f"catalog {name!r}: option location-map is not JSON ({exc})") from None
    if not isinstance(mapping, dict) or not all(isinstance(k, str) and k and isinstance(v, str)
                                                for k, v in mapping.items()):
        raise CatalogError(f"catalog {name!r}: option location-map must map location prefixes to directories")
    return mapping


_CATALOGS: dict[tuple[str, str], Any] = {}
_LOCK = threading.Lock()


def open_catalog(name: str, options: Mapping[str, str]) -> Any:
    """The catalog ``name`` configured by the Spark catalog's ``options`` (one object per
    name and options, shared by the session's statements)."""
    key = (name, json.dumps(sorted(options.items())))
    with _LOCK:
        catalog = _CATALOGS.get(key)
    if catalog is not None:
        return catalog
    properties = {str(k): str(v) for k, v in options.items() if str(k).lower() not in _SPARK_OPTIONS}
    kind = str(options.get("type") or "sql").strip().lower()
    if kind not in _PATH_TYPES and "location-map" in properties:
        raise CatalogError(f"catalog {name!r}: option location-map is for hadoop catalogs (type {kind} records "
                           "every table's location in the catalog)")
    if kind in _PATH_TYPES:
        catalog = PathCatalog(name, **properties)
    else:
        from icecrypt.catalog import load_catalog

        catalog = load_catalog(name, type=kind, **properties)
    with _LOCK:
        return _CATALOGS.setdefault(key, catalog)


# --- identifiers ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """What an identifier (and Spark's ``VERSION``/``TIMESTAMP AS OF``) selects in a table."""

    identifier: tuple[str, ...]  # the table's
    metadata_table: str | None = None
    snapshot_id: int | None = None
    branch: str | None = None
    tag: str | None = None
    as_of_ms: int | None = None
    ref: str | None = None  # VERSION AS OF '<name>': a branch or a tag
    changelog: bool = False  # ``db.t.changes``: the rows the snapshots inserted and deleted

    @property
    def time_travel(self) -> bool:
        return any(v is not None for v in (self.snapshot_id, self.tag, self.as_of_ms, self.ref))


#: the last part of an identifier that names a table's changelog (Iceberg's ``db.t.changes``)
CHANGES = "changes"

_SELECTORS = (
    (re.compile(r"branch_(.+)", re.S), "branch"),
    (re.compile(r"tag_(.+)", re.S), "tag"),
    (re.compile(r"snapshot_id_(-?[0-9]+)"), "snapshot_id"),
    (re.compile(r"at_timestamp_([0-9]+)"), "as_of_ms"),
)


def _exists(catalog: Any, identifier: tuple[str, ...]) -> bool:
    try:
        return bool(catalog.table_exists(identifier))
    except InvalidIdentifierError:
        return False


def resolve(catalog: Any, identifier: tuple[str, ...], version: str | None = None,
            timestamp_us: int | None = None) -> Selection:
    """What ``identifier`` names (NoSuchTableError when nothing): the table itself, or in
    the table its namespace names, a metadata table, branch, tag or snapshot; with Spark's
    ``VERSION AS OF`` (``version``: a snapshot id, branch or tag) or ``TIMESTAMP AS OF``
    (``timestamp_us``: microseconds since the epoch)."""
    selection = None
    if _exists(catalog, identifier):
        selection = Selection(identifier)
    elif len(identifier) >= 3 and _exists(catalog, identifier[:-1]):
        table, last = identifier[:-1], identifier[-1]
        if last.lower() in METADATA_TABLES:
            selection = Selection(table, metadata_table=last.lower())
        elif last.lower() == CHANGES:
            selection = Selection(table, changelog=True)
        for pattern, kind in _SELECTORS:
            match = pattern.fullmatch(last)
            if selection is None and match:
                value: Any = match.group(1)
                selection = Selection(table, **{kind: int(value) if kind in ("snapshot_id", "as_of_ms") else value})
    if selection is None:
        raise NoSuchTableError(f"catalog {getattr(catalog, 'name', '?')!r}: table {'.'.join(identifier)} does not exist")
    if version is None and timestamp_us is None:
        return selection
    if selection.changelog:
        raise ValueError(f"table {'.'.join(identifier)}: VERSION/TIMESTAMP AS OF cannot apply to a changelog (select "
                         "its range with the read options start-snapshot-id, end-snapshot-id, start-timestamp and "
                         "end-timestamp)")
    if selection.time_travel or selection.branch is not None:
        raise ValueError(f"table {'.'.join(identifier)}: VERSION/TIMESTAMP AS OF cannot apply to a table identifier "
                         "that selects a snapshot, branch or tag already")
    fields = dict(selection.__dict__)
    if timestamp_us is not None:
        fields["as_of_ms"] = timestamp_us // 1000
    elif re.fullmatch(r"-?[0-9]+", version.strip()):
        fields["snapshot_id"] = int(version.strip())
    else:
        fields["ref"] = version
    return Selection(**fields)


@dataclass(frozen=True)
class Wap:
    """Where a session's write-audit-publish settings send a statement's writes."""

    branch: str | None = None  # spark.wap.branch: written to (created by the write when missing)
    wap_id: str | None = None  # spark.wap.id: appends staged with this wap.id


def audit_publish(table: Any, selection: Selection, wap_branch: str | None,
                  wap_id: str | None) -> tuple[Selection, Wap | None]:
    """Iceberg's write-audit-publish session settings applied to a loaded table, as Iceberg's
    Spark runtime applies them: only to a table with ``write.wap.enabled=true``, and only
    when the identifier selects the table itself (a branch, tag, snapshot or metadata table
    named in the statement wins).  ``spark.wap.branch`` moves reads to that branch when it
    exists, and writes to it always (a write creates it from main); ``spark.wap.id`` stages
    appends (committed, not made current: ``publish_changes`` or ``cherrypick_snapshot``
    publishes them).  Setting both is an error, as in Iceberg."""
    from icecrypt.table.ops.write import WAP_ENABLED

    wap_branch, wap_id = (wap_branch or "").strip() or None, (wap_id or "").strip() or None
    if wap_branch is None and wap_id is None:
        return selection, None
    if str(table.properties.get(WAP_ENABLED, "false")).strip().lower() != "true":
        return selection, None
    if selection.metadata_table is not None or selection.time_travel or selection.branch is not None \
            or selection.changelog:
        return selection, None
    if wap_branch is not None and wap_id is not None:
        raise ValueError(f"table {'.'.join(selection.identifier)}: cannot set both spark.wap.id ({wap_id!r}) and "
                         f"spark.wap.branch ({wap_branch!r})")
    if wap_branch is not None and wap_branch in table.model.refs:
        if table.model.refs[wap_branch].snapshot_ref_type.value != "branch":
            raise ValueError(f"table {'.'.join(selection.identifier)}: spark.wap.branch {wap_branch!r} names a tag, "
                             "not a branch")
        selection = Selection(**{**selection.__dict__, "branch": wap_branch})
    return selection, Wap(wap_branch, wap_id)


def describe_identifier(catalog: Any, identifier: tuple[str, ...]) -> str:
    return f"catalog {getattr(catalog, 'name', '?')!r}: table {'.'.join(identifier)}"


def default_location(catalog: Any, identifier: tuple[str, ...]) -> str:
    """Where a new table ``identifier`` goes when no location is given."""
    if isinstance(catalog, PathCatalog):
        return catalog.default_location(identifier)
    # icecrypt.catalog computes it when it creates a table; a staged table needs it first
    return catalog._default_table_location(tuple(identifier[:-1]), identifier[-1])


def on_local_files(table: Any) -> bool:
    """Whether the table's files are on this machine's file system (a location map may put
    a recorded ``s3://`` location there): the ones Spark's own Parquet reader and writer
    open; the others are served through ``icecrypt.iceberg`` (``ddl.object_store``)."""
    from icecrypt.spark._native import _spark_path

    return _spark_path(table.fs_path(table.location), table.filesystem) is not None


def is_local(location: str) -> bool:
    return "://" not in location or location.startswith("file:")


def local_path(location: str) -> str:
    if location.startswith("file://"):
        location = location[len("file://"):]
    elif location.startswith("file:"):
        location = location[len("file:"):]
    return posixpath.normpath(location)


_PART = re.compile(r"`((?:[^`]|``)*)`|([^.`]+)")


def parse_identifier(text: str) -> tuple[str, ...]:
    """Spark's multi-part identifier: parts joined by dots, a part in backquotes may hold
    dots (a doubled backquote is one)."""
    parts: list[str] = []
    i, text = 0, text.strip()
    while True:
        match = _PART.match(text, i)
        if match is None:
            raise ValueError(f"{text!r} is not a table identifier")
        parts.append(match.group(1).replace("``", "`") if match.group(1) is not None else match.group(2).strip())
        i = match.end()
        if i == len(text):
            return tuple(parts)
        if text[i] != ".":
            raise ValueError(f"{text!r} is not a table identifier")
        i += 1

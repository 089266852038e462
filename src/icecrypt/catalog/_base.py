"""The catalog interface: namespaces and tables by identifier, commits by compare-and-swap.

:class:`Catalog` implements the public API once; a backend (``_sql``, ``_glue``) only
implements the ``_ns_*`` / ``_table_*`` hooks, each atomic on the backend's side.
Backends see normalized identifiers (``namespace: tuple[str, ...]``, ``name: str``) and
metadata locations exactly as the catalog records them (``file:///...``, ``s3://...``,
plain paths); this class maps them to paths on the table's pyarrow filesystem.

Every :class:`~icecrypt.table.EncryptedTable` a catalog returns carries a
:class:`_CatalogTableStore` (``table.metadata_store``): ``refresh()`` asks the catalog
for the current metadata file, and every write commits a new
``<NNNNN>-<uuid>.metadata.json`` and then ``_table_swap(expected, new)``.
"""

from __future__ import annotations

import os
import posixpath
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow.fs as pafs

from icecrypt._paths import check_location_text, parse_location
from icecrypt.errors import (
    CatalogError,
    InvalidIdentifierError,
    PathOutsideTableError,
    NoSuchNamespaceError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from icecrypt.table.files.io import Locations

__all__ = ["Catalog", "Identifier"]

Identifier = str | tuple[str, ...] | list[str]

#: PyIceberg's FileIO properties for S3 (its pyarrow FileIO reads the same names)
S3_ENDPOINT = "s3.endpoint"
S3_ACCESS_KEY_ID = "s3.access-key-id"
S3_SECRET_ACCESS_KEY = "s3.secret-access-key"
S3_SESSION_TOKEN = "s3.session-token"
S3_REGION = "s3.region"
CLIENT_REGION = "client.region"
KMS_PROPERTY_PREFIX = "encryption."
#: catalog property: every table loaded refuses unauthenticated metadata versions
REQUIRE_AUTHENTICATED_METADATA = "icecrypt.require-authenticated-metadata"


def _levels(value: Identifier, what: str) -> tuple[str, ...]:
    if isinstance(value, str):
        levels = tuple(value.split(".")) if value else ()
    elif isinstance(value, (tuple, list)):
        levels = tuple(value)
    else:
        raise InvalidIdentifierError(f"{what} must be a str or a tuple of str, not {type(value).__name__}")
    for level in levels:
        if not isinstance(level, str) or not level:
            raise InvalidIdentifierError(f"{what} {value!r}: every level must be a non-empty string")
        # a level becomes a path segment of the default location and, joined by '.', a
        # catalog row: it may name neither another directory nor another level
        if "." in level:
            raise InvalidIdentifierError(
                f"{what} {value!r}: level {level!r} holds '.', which separates levels "
                "(('a.b', 't') and ('a', 'b', 't') would be one table; refused)"
            )
        if "/" in level or _BAD_LEVEL.search(level):
            raise InvalidIdentifierError(f"{what} {value!r}: level {level!r} holds '/', a backslash or a control character")
        try:
            check_location_text(level)
        except ValueError:
            raise InvalidIdentifierError(
                f"{what} {value!r}: level {level!r} holds a percent-encoded dot segment or separator"
            ) from None
    return levels


_BAD_LEVEL = re.compile(r"[\\\x00-\x1f\x7f]")


def _show(levels: tuple[str, ...]) -> str:
    return ".".join(levels)


class _CatalogTableStore:
    """Where one catalog table's current metadata location lives
    (``icecrypt.table.commit.store.MetadataStore``), in filesystem paths.

    The catalog records locations (``file:///wh/db/t/metadata/00003-....metadata.json``);
    the table reads paths on its filesystem.  Paths read from the catalog are mapped back
    to what the catalog holds, so a swap compares against the catalog's exact string."""

    def __init__(
        self, catalog: Catalog, namespace: tuple[str, ...], name: str, locations: Locations, location: str,
        metadata_dir: str | None = None,
    ):
        self.catalog = catalog
        self.namespace = namespace
        self.name = name
        self.locations = locations
        # the recorded metadata directory (write.metadata.path, else <location>/metadata), and its path
        recorded_dir = (metadata_dir or location.rstrip("/") + "/metadata").rstrip("/")
        self._metadata_dir = (recorded_dir, locations.to_fs_path(recorded_dir))
        self._recorded: dict[str, str] = {}
        # path -> the SHA-256 the catalog recorded for that metadata file (None: none
        # recorded for it: a commit by another engine, or a table recorded before digests)
        self._digests: dict[str, str | None] = {}
        self._admitted: dict[str, str] = {}  # path -> digest to record once the version is installed
        self._lock = threading.Lock()
        self.record: dict[str, str] | None = None  # the catalog's record, as current() read it last

    @property
    def identifier(self) -> tuple[str, ...]:
        return (*self.namespace, self.name)

    def _remember(self, recorded: str) -> str:
        path = self.locations.to_fs_path(recorded)
        with self._lock:
            if len(self._recorded) > 64:
                self._recorded.clear()
            self._recorded[path] = recorded
        return path

    def to_recorded(self, path: str) -> str:
        """The location the catalog records for the metadata file at ``path`` (e.g.
        ``file:///wh/db/t/metadata/00001-....metadata.json`` for a local path)."""
        return self._to_recorded(path)

    def _to_recorded(self, path: str) -> str:
        with self._lock:
            known = self._recorded.get(path)
        if known is not None:
            return known
        # a new file beside a known one: same recorded directory
        directory = posixpath.dirname(path)
        with self._lock:
            for fs_path, recorded in self._recorded.items():
                if posixpath.dirname(fs_path) == directory:
                    return f"{recorded.rsplit('/', 1)[0]}/{posixpath.basename(path)}"
        recorded_dir, fs_dir = self._metadata_dir
        if directory == fs_dir:
            return f"{recorded_dir}/{posixpath.basename(path)}"
        return path

    def current(self) -> str:
        """The current metadata file, with the digest the catalog recorded for it (read in
        the same query, for :meth:`check_digest`)."""
        recorded, record = self.catalog._table_state(self.namespace, self.name)
        if recorded is None:
            raise NoSuchTableError(f"catalog {self.catalog.name!r}: table {_show(self.identifier)} does not exist (dropped?)")
        return self.adopt_state(recorded, record)

    def adopt_state(self, recorded: str, record: dict[str, str] | None) -> str:
        """Take ``recorded`` (a metadata location the catalog holds) and the catalog's
        ``record`` read with it as the current state; returns the file's path."""
        from icecrypt.table.commit.pin import CATALOG_DIGEST, CATALOG_DIGEST_OF

        path = self._remember(recorded)
        digest = (record or {}).get(CATALOG_DIGEST) if (record or {}).get(CATALOG_DIGEST_OF) == recorded else None
        with self._lock:
            if len(self._digests) > 64:
                self._digests.clear()
            self._digests[path] = digest
        self.record = record
        return path

    def check_digest(self, path: str, document: Any) -> None:
        """Refuse (TableIntegrityError) the metadata file at ``path`` when its bytes are not
        those the catalog recorded at the commit that made it current (the file was
        changed in place: its storage is writable by others, the catalog database is
        not).  A current file the catalog recorded no digest for is a commit by another
        engine through the same database (or one made before digests were recorded): it
        is admitted, and its digest recorded once the version passed every other check
        (:meth:`admitted`)."""
        from icecrypt.errors import TableIntegrityError
        from icecrypt.table.files.metadata import stored_digest

        actual = stored_digest(document)
        if actual is None:  # a document this process built: nothing was read
            return
        with self._lock:
            known = path in self._digests
            expected = self._digests.get(path)
        if not known:
            self.current()  # a path nobody asked the catalog about: ask now
            with self._lock:
                expected = self._digests.get(path)
        if expected is None:
            with self._lock:
                self._admitted[path] = actual  # recorded once the version passed every check
            return
        if expected != actual:
            raise TableIntegrityError(
                f"{self.catalog._describe(self.namespace, self.name)}: its current metadata file {path} is not the "
                "file the catalog recorded when it was committed (its SHA-256 differs: changed in place); refused",
                metadata_location=path, reason="metadata digest mismatch",
            )  # fmt: skip

    def admitted(self, path: str) -> None:
        """The version at ``path`` passed every check of the table object that installed
        it: record the digest :meth:`check_digest` found for it when the catalog had none
        (a failure to record it, e.g. read-only access to the database, only warns)."""
        with self._lock:
            digest = self._admitted.pop(path, None)
        if digest is None:
            return
        recorded = self._to_recorded(path)
        try:
            self.catalog._record_digest(self.namespace, self.name, recorded, digest)
        except CatalogError as exc:
            import warnings

            warnings.warn(f"{self!r}: digest of {recorded} not recorded ({exc})", RuntimeWarning, stacklevel=3)
            return
        with self._lock:
            self._digests[path] = digest

    def swap(
        self, expected: str, new: str, *, metadata: Any = None, rotate_to: str | None = None, retired: Any = None,
        digest: str | None = None,
    ) -> None:
        from icecrypt.table.commit.pin import catalog_commit

        record = None
        recorded_new = self._to_recorded(new)
        if metadata is not None:
            # the catalog's pin, not the storage, decides whether encryption.key-id, the
            # UUID or the table's roots may change; it keeps the KEKs rotations retired
            recorded = self.catalog._pin_get(self.namespace, self.name)
            record = catalog_commit(
                recorded, metadata, new, self.catalog._describe(self.namespace, self.name), rotate_to=rotate_to,
                retired=retired,
            )  # fmt: skip
            if digest is not None:
                record = _with_digest(record if record is not None else recorded, recorded_new, digest)
        self.catalog._table_swap(self.namespace, self.name, self._to_recorded(expected), recorded_new, pin=record)
        path = self._remember(recorded_new)
        if digest is not None:
            with self._lock:
                self._digests[path] = digest

    def create(self, new: str, *, metadata: Any = None, digest: str | None = None) -> None:
        from icecrypt.table.commit.pin import catalog_record

        recorded_new = self._to_recorded(new)
        record = catalog_record(metadata) if metadata is not None else None
        if digest is not None:
            record = _with_digest(record, recorded_new, digest)
        self.catalog._table_create(self.namespace, self.name, recorded_new, pin=record)
        path = self._remember(recorded_new)
        if digest is not None:
            with self._lock:
                self._digests[path] = digest

    def __repr__(self) -> str:
        return f"<catalog {self.catalog.name!r} table {_show(self.identifier)}>"


def _with_digest(record: dict[str, str] | None, recorded_location: str, digest: str) -> dict[str, str]:
    """``record`` (a catalog's record of a table) with the SHA-256 of the metadata file at
    ``recorded_location`` (as the catalog records it)."""
    from icecrypt.table.commit.pin import CATALOG_DIGEST, CATALOG_DIGEST_OF

    return {**(record or {}), CATALOG_DIGEST: digest, CATALOG_DIGEST_OF: recorded_location}


class Catalog:
    """An Iceberg catalog of encrypted (and plaintext) tables.

    ``properties`` take PyIceberg's names (``type``, ``uri``, ``warehouse``,
    ``s3.endpoint``, ``s3.access-key-id``, ``s3.secret-access-key``, ``s3.region``, ...)
    and Iceberg Java's KMS properties (``encryption.kms-type``, ``encryption.kms-impl``
    and what the KMS client takes), which build the KMS client when the first encrypted
    table needs it; ``kms=`` gives a client directly instead.
    """

    def __init__(self, name: str, *, kms: Any = None, **properties: str) -> None:
        if not isinstance(name, str) or not name:
            raise InvalidIdentifierError("a catalog needs a non-empty name")
        self.name = name
        self.properties: dict[str, str] = {str(k): str(v) for k, v in properties.items()}
        self._kms = kms
        self._filesystems: dict[tuple[str, str], pafs.FileSystem] = {}

    # --- configuration ----------------------------------------------------------------------

    @property
    def kms(self) -> Any:
        """The KMS client: ``kms=``, else one built from the ``encryption.*`` properties
        (None when neither is given: plaintext tables only)."""
        if self._kms is None and any(k in self.properties for k in ("encryption.kms-type", "encryption.kms-impl")):
            from icecrypt.kms import create_kms_client

            self._kms = create_kms_client(self.properties)
        return self._kms

    @property
    def require_authenticated_metadata(self) -> bool:
        """The catalog property ``icecrypt.require-authenticated-metadata`` (default
        false): every table loaded through the catalog refuses versions without a valid
        authenticator (``EncryptedTable.load``)."""
        raw = self.properties.get(REQUIRE_AUTHENTICATED_METADATA, "false").strip().lower()
        if raw not in ("true", "false"):
            raise CatalogError(f"catalog {self.name!r}: {REQUIRE_AUTHENTICATED_METADATA} must be true or false, not {raw!r}")
        return raw == "true"

    @property
    def warehouse(self) -> str | None:
        raw = self.properties.get("warehouse")
        return raw.rstrip("/") if raw else None

    def filesystem_for(self, location: str) -> pafs.FileSystem:
        """The pyarrow filesystem that holds ``location`` (local paths and ``file:``
        URIs: the local filesystem; ``s3://``: S3 configured by the ``s3.*`` properties;
        other URIs: whatever pyarrow makes of them)."""
        scheme = location.split("://", 1)[0].lower() if "://" in location else "file"
        if scheme == "file" or len(scheme) == 1:
            return pafs.LocalFileSystem()
        bucket = location.split("://", 1)[1].split("/", 1)[0]
        key = (scheme, bucket if scheme not in ("s3", "s3a", "s3n") else "")
        if key not in self._filesystems:
            if scheme in ("s3", "s3a", "s3n"):
                self._filesystems[key] = self._s3_filesystem()
            else:
                self._filesystems[key] = pafs.FileSystem.from_uri(location)[0]
        return self._filesystems[key]

    def _s3_filesystem(self) -> pafs.FileSystem:
        p = self.properties
        options: dict[str, Any] = {}
        endpoint = p.get(S3_ENDPOINT)
        if endpoint:
            scheme, _, rest = endpoint.partition("://")
            if rest:
                options["endpoint_override"] = rest.rstrip("/")
                options["scheme"] = scheme
            else:
                options["endpoint_override"] = endpoint
        if p.get(S3_ACCESS_KEY_ID):
            options["access_key"] = p[S3_ACCESS_KEY_ID]
            options["secret_key"] = p.get(S3_SECRET_ACCESS_KEY, "")
            if p.get(S3_SESSION_TOKEN):
                options["session_token"] = p[S3_SESSION_TOKEN]
        region = p.get(S3_REGION) or p.get(CLIENT_REGION)
        if region:
            options["region"] = region
        return pafs.S3FileSystem(**options)

    def _locations(self, location: str) -> Locations:
        return Locations(self.filesystem_for(location))

    def _default_table_location(self, namespace: tuple[str, ...], name: str) -> str:
        """``<warehouse>/<ns>/<sub>/<name>`` (Iceberg Java's JdbcCatalog layout)."""
        if self.warehouse is None:
            raise InvalidIdentifierError(
                f"catalog {self.name!r}: no location given for table {_show((*namespace, name))} and no warehouse property"
            )
        return "/".join((self.warehouse, *namespace, name))

    def _check_new_location(
        self, namespace: tuple[str, ...], name: str, location: str, *, default: bool, same_ok: bool = False
    ) -> None:
        """Refuse a new table's ``location`` that lies inside another table's location or
        holds one (a table's maintenance lists and deletes under its location: it would
        reach the other table's files), or, for a default location, one outside the
        warehouse.  Other tables' locations are those of their metadata files in the
        catalog (``<location>/metadata/<file>``).  ``same_ok``: the location may equal
        another's (``register_table`` of a table already registered: one table, two
        names)."""
        local = isinstance(self.filesystem_for(location), pafs.LocalFileSystem)
        new = parse_location(location, local=local)
        shown = _show((*namespace, name))
        # a warehouse default (not a backend's own, e.g. a Glue database's LocationUri)
        # must stay in the warehouse: identifier levels are validated, this checks the join
        warehouse_default = type(self)._default_table_location is Catalog._default_table_location
        if default and warehouse_default and self.warehouse and not new.within(parse_location(self.warehouse, local=local)):
            raise CatalogError(f"catalog {self.name!r}: location {location} of table {shown} lies outside the warehouse")
        for other_ns in self._ns_list():
            for other in self._table_list(other_ns):
                try:
                    recorded = self._table_location(other_ns, other)
                except CatalogError:  # not an Iceberg table, or one without metadata: no files of ours
                    continue
                if not recorded or recorded.count("/") < 2:
                    continue
                try:
                    theirs = parse_location(recorded.rsplit("/", 2)[0], local=local)
                except ValueError:
                    continue
                if same_ok and new == theirs:
                    continue
                if new.within(theirs) or theirs.within(new):
                    raise CatalogError(
                        f"catalog {self.name!r}: location {location} of new table {shown} overlaps the location "
                        f"{str(theirs)} of table {_show((*other_ns, other))} (refused: the tables' maintenance "
                        "would reach each other's files)"
                    )

    # --- identifiers ----------------------------------------------------------------------

    @staticmethod
    def _namespace(namespace: Identifier) -> tuple[str, ...]:
        levels = _levels(namespace, "namespace")
        if not levels:
            raise InvalidIdentifierError("namespace must not be empty")
        return levels

    @staticmethod
    def _identifier(identifier: Identifier) -> tuple[tuple[str, ...], str]:
        levels = _levels(identifier, "table identifier")
        if len(levels) < 2:
            raise InvalidIdentifierError(
                f"table identifier {identifier!r} needs a namespace and a name (e.g. 'db.table')"
            )
        return levels[:-1], levels[-1]

    def _describe(self, namespace: tuple[str, ...], name: str | None = None) -> str:
        return f"catalog {self.name!r}: {'table' if name else 'namespace'} {_show((*namespace, name) if name else namespace)}"

    # --- namespaces -------------------------------------------------------------------------

    def create_namespace(self, namespace: Identifier, properties: Mapping[str, str] | None = None) -> None:
        """Create ``namespace`` (NamespaceAlreadyExistsError if it exists)."""
        ns = self._namespace(namespace)
        self._ns_create(ns, {str(k): str(v) for k, v in (properties or {}).items()})

    def list_namespaces(self) -> list[tuple[str, ...]]:
        """Every namespace of the catalog, sorted."""
        return sorted(set(self._ns_list()))

    def namespace_exists(self, namespace: Identifier) -> bool:
        return self._ns_exists(self._namespace(namespace))

    def drop_namespace(self, namespace: Identifier) -> None:
        """Drop an empty namespace (NoSuchNamespaceError, NamespaceNotEmptyError)."""
        self._ns_drop(self._namespace(namespace))

    def namespace_properties(self, namespace: Identifier) -> dict[str, str]:
        """The properties of ``namespace`` (NoSuchNamespaceError): those it was created or
        updated with (a namespace that exists only through its tables has none)."""
        ns = self._namespace(namespace)
        if not self._ns_exists(ns):
            raise NoSuchNamespaceError(f"{self._describe(ns)} does not exist")
        return self._ns_properties(ns)

    def update_namespace_properties(self, namespace: Identifier, removals: Iterable[str] = (),
                                    updates: Mapping[str, str] | None = None) -> None:
        """Remove the properties ``removals`` and set ``updates`` of ``namespace``, at once
        (NoSuchNamespaceError; ValueError for a key in both)."""
        ns = self._namespace(namespace)
        removed = {str(k) for k in removals}
        changed = {str(k): str(v) for k, v in (updates or {}).items()}
        both = removed & set(changed)
        if both:
            raise ValueError(f"{self._describe(ns)}: property {sorted(both)[0]!r} is both removed and set")
        if not self._ns_exists(ns):
            raise NoSuchNamespaceError(f"{self._describe(ns)} does not exist")
        if removed or changed:
            self._ns_update(ns, removed, changed)

    # --- tables -----------------------------------------------------------------------------

    def _store(
        self, namespace: tuple[str, ...], name: str, location: str, metadata_dir: str | None = None
    ) -> _CatalogTableStore:
        return _CatalogTableStore(self, namespace, name, self._locations(location), location, metadata_dir)

    def create_table(
        self,
        identifier: Identifier,
        schema: Any,
        *,
        table_key_id: str | None,
        partition_spec: Any = None,
        properties: Mapping[str, str] | None = None,
        location: str | None = None,
    ) -> Any:
        """Create a format-version 3 table (encrypted under KMS master key
        ``table_key_id``; None = plaintext) at ``location`` (default: under the
        warehouse) and return it as an :class:`~icecrypt.table.EncryptedTable` whose
        writes commit through this catalog."""
        from icecrypt.table.ops import write as _write

        namespace, name = self._identifier(identifier)
        if not self._ns_exists(namespace):
            raise NoSuchNamespaceError(f"{self._describe(namespace)} does not exist")
        if self._table_location(namespace, name) is not None:
            raise TableAlreadyExistsError(f"{self._describe(namespace, name)} already exists")
        default = location is None
        location = (location or self._default_table_location(namespace, name)).rstrip("/")
        if location.startswith("file:") and not location.startswith("file://"):
            # file:/p (as Hadoop and Spark's SHOW CREATE TABLE write it) is file:///p, never a relative path
            if not location.startswith("file:/"):
                raise ValueError(f"{self._describe(namespace, name)}: location {location!r}: a file: URI needs an "
                                 "absolute path")
            location = "file://" + location[len("file:"):]
        if "://" not in location:
            location = os.path.abspath(location)
        self._check_new_location(namespace, name, location, default=default)
        store = self._store(namespace, name, location, (properties or {}).get("write.metadata.path"))
        filesystem = store.locations.filesystem
        _write.create_metadata(
            location, schema, kms=self.kms if table_key_id is not None else self._kms, table_key_id=table_key_id,
            partition_spec=partition_spec, properties=dict(properties) if properties is not None else None,
            filesystem=filesystem, store=store,
        )  # fmt: skip
        return self.load_table((*namespace, name))

    def load_table(
        self, identifier: Identifier, *, check_keys: bool = True, require_encryption: bool = False,
        table_key_id: str | None = None, require_authenticated_metadata: bool | None = None,
    ) -> Any:
        """The table ``identifier`` at its current version (NoSuchTableError); its writes
        commit through this catalog (compare-and-swap of the metadata location).
        ``check_keys=False``: open an encrypted table whose metadata lost keys, to
        inspect or repair it; ``require_encryption=True``: refuse a plaintext table (both
        as ``EncryptedTable.load``).

        The catalog records each table's UUID and roots (``location``, ``write.data.path``,
        ``write.metadata.path``) and each encrypted table's master key id in its database
        (at creation, registration and the first commit through icecrypt) and pins the
        loaded table to them: a metadata file that disagrees -- encryption removed, key id
        or UUID changed, the table moved onto another directory by whoever can write the
        storage -- is refused (:class:`~icecrypt.TableIdentityError`), and so is a commit
        that changes them other than this table's ``rotate_keys`` / ``rekey`` with
        ``new_master_key_id`` (which changes the key id).  A table with no record yet (one
        created by Java or PyIceberg) is pinned to the version loaded until its first
        icecrypt commit, ``register_table`` or a load with ``table_key_id``.  The KEKs this
        catalog's tables retired (``rotate_keys(new_kek=True)``, ``rekey``) are recorded too
        and refused for new wraps by every table object loaded here, in any process.
        ``table_key_id``: the key id the caller expects; it overrides the catalog's record
        (e.g. after another engine rotated the master key), which is then updated to it.

        The catalog also records the SHA-256 of every metadata file an icecrypt commit
        makes current, and compares it at every load, refresh and commit: a current file
        changed in place is refused (:class:`~icecrypt.TableIntegrityError`).  A current
        file with no digest recorded (another engine's commit through the same database)
        is admitted, and its digest recorded.  ``require_authenticated_metadata``: as
        ``EncryptedTable.load``; default: the catalog property
        ``icecrypt.require-authenticated-metadata``."""
        from icecrypt.table import EncryptedTable
        from icecrypt.table.files.metadata import read_metadata_file
        from icecrypt.table.commit.pin import CATALOG_KEY_ID, CATALOG_LOCATION, adopt_record, catalog_pin, retired_keks

        namespace, name = self._identifier(identifier)
        recorded, pinned = self._table_state(namespace, name)
        if recorded is None:
            raise NoSuchTableError(f"{self._describe(namespace, name)} does not exist")
        store = self._store(namespace, name, recorded.rsplit("/", 2)[0])
        path = store.adopt_state(recorded, pinned)  # the location and its recorded digest, read together
        metadata = read_metadata_file(store.locations.filesystem, path)
        store.check_digest(path, metadata)  # before anything else is done with what storage holds
        if not (pinned or {}).get(CATALOG_LOCATION):
            # no roots recorded yet (a table another engine made): the metadata location the
            # database records anchors it; with a record, the pin below says what changed
            _check_anchored(store.locations, metadata, recorded, self._describe(namespace, name))
        encrypted = (metadata.get("properties") or {}).get("encryption.key-id") or table_key_id or pinned
        kms = self.kms if encrypted else self._kms
        pin = catalog_pin(pinned, metadata, table_key_id=table_key_id)
        if require_authenticated_metadata is None:
            require_authenticated_metadata = self.require_authenticated_metadata
        table = EncryptedTable(metadata, path, store.locations, kms, check_keys=check_keys,
                               require_encryption=require_encryption, pin=pin, metadata_store=store,
                               require_authenticated_metadata=require_authenticated_metadata)  # fmt: skip
        retired = retired_keks(pinned)
        if retired and table.encryption_manager is not None:
            table.encryption_manager.retire_recorded_keks(retired)  # shared by the object's writers
        if table_key_id is not None and (
            (pinned or {}).get(CATALOG_KEY_ID) != table_key_id or not (pinned or {}).get(CATALOG_LOCATION)
        ):
            self._pin_set(namespace, name, adopt_record(pinned, metadata, key_id=True))  # the caller's word, checked above
        return table

    def register_table(self, identifier: Identifier, metadata_location: str, *, table_key_id: str | None = None) -> Any:
        """Add an existing table to the catalog by its metadata file (as PyIceberg's and
        Java's ``registerTable``); returns it loaded.  The catalog pins the file's
        ``encryption.key-id`` and UUID from here on; ``table_key_id``: the master key id
        the caller expects the file to name (refused otherwise)."""
        from icecrypt.table.files.metadata import read_metadata_file
        from icecrypt.table.commit.pin import catalog_record, trusted_pin

        namespace, name = self._identifier(identifier)
        if not self._ns_exists(namespace):
            raise NoSuchNamespaceError(f"{self._describe(namespace)} does not exist")
        locations = self._locations(metadata_location)
        metadata = read_metadata_file(locations.filesystem, locations.to_fs_path(metadata_location))  # exists, parses
        if table_key_id is not None:
            trusted_pin(metadata, table_key_id=table_key_id).check(metadata, metadata_location)
        if metadata.get("location"):
            self._check_new_location(namespace, name, str(metadata["location"]).rstrip("/"), default=False, same_ok=True)
        record = _with_digest(catalog_record(metadata), metadata_location, metadata.sha256)
        self._table_create(namespace, name, metadata_location, pin=record)
        return self.load_table((*namespace, name))

    def list_tables(self, namespace: Identifier) -> list[tuple[str, ...]]:
        """The identifiers of the tables in ``namespace`` (not in sub-namespaces), sorted."""
        ns = self._namespace(namespace)
        if not self._ns_exists(ns):
            raise NoSuchNamespaceError(f"{self._describe(ns)} does not exist")
        return sorted((*ns, name) for name in self._table_list(ns))

    def table_exists(self, identifier: Identifier) -> bool:
        namespace, name = self._identifier(identifier)
        return self._table_location(namespace, name) is not None

    def drop_table(self, identifier: Identifier, *, purge: bool = False) -> None:
        """Remove the table from the catalog; with ``purge`` also delete its files
        (data, delete, manifest and metadata files its metadata references)."""
        namespace, name = self._identifier(identifier)
        table = self.load_table((*namespace, name)) if purge else None
        self._table_drop(namespace, name)
        if table is not None:
            _purge(table)

    def rename_table(self, identifier: Identifier, new_identifier: Identifier) -> None:
        """Give table ``identifier`` the name ``new_identifier`` (its location, files and
        the catalog's record of its key id, UUID and roots stay as they are), in one
        update of the catalog (NoSuchTableError, NoSuchNamespaceError for the new name's
        namespace, TableAlreadyExistsError).  A backend without renames raises
        CatalogError."""
        namespace, name = self._identifier(identifier)
        new_namespace, new_name = self._identifier(new_identifier)
        if self._table_location(namespace, name) is None:
            raise NoSuchTableError(f"{self._describe(namespace, name)} does not exist")
        if not self._ns_exists(new_namespace):
            raise NoSuchNamespaceError(f"{self._describe(new_namespace)} does not exist")
        if self._table_location(new_namespace, new_name) is not None:
            raise TableAlreadyExistsError(f"{self._describe(new_namespace, new_name)} already exists")
        self._table_rename(namespace, name, new_namespace, new_name)

    # --- views ------------------------------------------------------------------------------

    def _describe_view(self, namespace: tuple[str, ...], name: str) -> str:
        return f"catalog {self.name!r}: view {_show((*namespace, name))}"

    def create_view(
        self,
        identifier: Identifier,
        sql: str,
        schema: Any,
        *,
        dialect: str = "spark",
        default_catalog: str | None = None,
        default_namespace: Identifier = (),
        properties: Mapping[str, str] | None = None,
        summary: Mapping[str, str] | None = None,
        replace: bool = False,
    ) -> Any:
        """Create the view ``identifier`` (``replace``: or give an existing one a new
        version): ``sql`` in ``dialect`` and the pyiceberg ``schema`` of its result, as a
        metadata document of Iceberg's view spec under ``<warehouse>/<ns>/<name>`` that the
        catalog records with its SHA-256 (ViewAlreadyExistsError when a view or table of
        that name exists, NoSuchNamespaceError).  Returns the view (``_views.View``)."""
        from icecrypt.catalog import _views
        from icecrypt.errors import ViewAlreadyExistsError

        namespace, name = self._identifier(identifier)
        if not isinstance(sql, str) or not sql.strip():
            raise ValueError(f"{self._describe_view(namespace, name)}: the view's SQL text is empty")
        if not self._ns_exists(namespace):
            raise NoSuchNamespaceError(f"{self._describe(namespace)} does not exist")
        if self._table_location(namespace, name) is not None:
            raise ViewAlreadyExistsError(f"{self._describe_view(namespace, name)}: a table of that name exists")
        record = self._view_record(namespace, name)
        if record is not None and not replace:
            raise ViewAlreadyExistsError(f"{self._describe_view(namespace, name)} already exists")
        version = dict(dialect=dialect, default_catalog=default_catalog,
                       default_namespace=tuple(_levels(default_namespace, "namespace")) if default_namespace else (),
                       properties=dict(properties or {}), summary=dict(summary or {}))  # fmt: skip
        if record is None:
            document = _views.new_document(self._default_table_location(namespace, name), sql, schema, **version)
        else:
            document = _views.replaced_document(self.load_view((*namespace, name)).document, sql, schema, **version)
        location = _views.metadata_location(document["location"], document)
        data = _views.encode(document)
        digest = _views.digest(data)
        locations = self._locations(location)
        path = locations.to_fs_path(location, what="view metadata file")
        try:
            locations.filesystem.create_dir(posixpath.dirname(path), recursive=True)
            with locations.filesystem.open_output_stream(path) as out:
                out.write(data)
            if record is None:
                self._view_create(namespace, name, location, digest)
            else:
                self._view_swap(namespace, name, record[0], location, digest)
        except BaseException:
            try:
                locations.filesystem.delete_file(path)  # never recorded (or cut short): nothing refers to it
            except OSError:
                pass
            raise
        # the view as recorded: the bytes just written, not a read back of them
        return _views.parse_document(data, where=self._describe_view(namespace, name), recorded_digest=digest,
                                     identifier=(*namespace, name), metadata_location=location)

    def load_view(self, identifier: Identifier) -> Any:
        """The view ``identifier``'s current version (NoSuchViewError; TableIntegrityError
        when its metadata file is not the one the catalog recorded)."""
        from icecrypt.catalog import _views
        from icecrypt.errors import NoSuchViewError

        namespace, name = self._identifier(identifier)
        record = self._view_record(namespace, name)
        if record is None:
            raise NoSuchViewError(f"{self._describe_view(namespace, name)} does not exist")
        location, recorded = record
        locations = self._locations(location)
        path = locations.to_fs_path(location, what="view metadata file")
        try:
            with locations.filesystem.open_input_stream(path) as source:
                data = source.read(_views.MAX_DOCUMENT_BYTES + 1)
        except OSError as exc:
            raise CatalogError(f"{self._describe_view(namespace, name)}: its metadata file {location} cannot be "
                               f"read ({exc})") from None
        return _views.parse_document(data, where=self._describe_view(namespace, name), recorded_digest=recorded,
                                     identifier=(*namespace, name), metadata_location=location)

    def list_views(self, namespace: Identifier) -> list[tuple[str, ...]]:
        """The identifiers of the views in ``namespace``, sorted."""
        ns = self._namespace(namespace)
        if not self._ns_exists(ns):
            raise NoSuchNamespaceError(f"{self._describe(ns)} does not exist")
        return sorted((*ns, name) for name in self._view_list(ns))

    def view_exists(self, identifier: Identifier) -> bool:
        namespace, name = self._identifier(identifier)
        return self._view_record(namespace, name) is not None

    def drop_view(self, identifier: Identifier) -> None:
        """Remove the view from the catalog (NoSuchViewError); its metadata files stay, as
        Java's JDBC catalog leaves them."""
        from icecrypt.errors import NoSuchViewError

        namespace, name = self._identifier(identifier)
        if not self._view_drop(namespace, name):
            raise NoSuchViewError(f"{self._describe_view(namespace, name)} does not exist")

    def rename_view(self, identifier: Identifier, new_identifier: Identifier) -> None:
        """Give view ``identifier`` the name ``new_identifier`` (NoSuchViewError,
        NoSuchNamespaceError, ViewAlreadyExistsError when a view or table has it)."""
        from icecrypt.errors import NoSuchViewError, ViewAlreadyExistsError

        namespace, name = self._identifier(identifier)
        new_namespace, new_name = self._identifier(new_identifier)
        if self._view_record(namespace, name) is None:
            raise NoSuchViewError(f"{self._describe_view(namespace, name)} does not exist")
        if not self._ns_exists(new_namespace):
            raise NoSuchNamespaceError(f"{self._describe(new_namespace)} does not exist")
        if self._view_record(new_namespace, new_name) is not None or \
                self._table_location(new_namespace, new_name) is not None:
            raise ViewAlreadyExistsError(f"{self._describe_view(new_namespace, new_name)}: the name is taken")
        self._view_rename(namespace, name, new_namespace, new_name)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

    # --- backend hooks ----------------------------------------------------------------------

    def _views_unsupported(self) -> CatalogError:
        return CatalogError(f"catalog {self.name!r}: views are kept by catalogs of type sql only")

    def _view_record(self, namespace: tuple[str, ...], name: str) -> tuple[str, str | None] | None:
        """(metadata location, its recorded SHA-256) of the view, or None."""
        raise self._views_unsupported()

    def _view_create(self, namespace: tuple[str, ...], name: str, location: str, digest: str) -> None:
        raise self._views_unsupported()

    def _view_swap(self, namespace: tuple[str, ...], name: str, expected: str, new: str, digest: str) -> None:
        raise self._views_unsupported()

    def _view_drop(self, namespace: tuple[str, ...], name: str) -> bool:
        raise self._views_unsupported()

    def _view_rename(self, namespace: tuple[str, ...], name: str, new_namespace: tuple[str, ...], new_name: str) -> None:
        raise self._views_unsupported()

    def _view_list(self, namespace: tuple[str, ...]) -> list[str]:
        raise self._views_unsupported()

    def _ns_create(self, namespace: tuple[str, ...], properties: dict[str, str]) -> None:
        raise NotImplementedError

    def _ns_exists(self, namespace: tuple[str, ...]) -> bool:
        raise NotImplementedError

    def _ns_list(self) -> list[tuple[str, ...]]:
        raise NotImplementedError

    def _ns_drop(self, namespace: tuple[str, ...]) -> None:
        raise NotImplementedError

    def _ns_properties(self, namespace: tuple[str, ...]) -> dict[str, str]:
        raise NotImplementedError

    def _ns_update(self, namespace: tuple[str, ...], removals: set[str], updates: dict[str, str]) -> None:
        raise NotImplementedError

    def _table_location(self, namespace: tuple[str, ...], name: str) -> str | None:
        raise NotImplementedError

    def _table_create(
        self, namespace: tuple[str, ...], name: str, metadata_location: str, *, pin: dict[str, str] | None = None
    ) -> None:
        """Register the table; ``pin``: its key id and UUID to record with it (None: none)."""
        raise NotImplementedError

    def _table_swap(
        self, namespace: tuple[str, ...], name: str, expected: str, new: str, *, pin: dict[str, str] | None = None
    ) -> None:
        """The compare-and-swap; ``pin``: a new record of key id and UUID to store in the
        same update (None: unchanged)."""
        raise NotImplementedError

    def _pin_get(self, namespace: tuple[str, ...], name: str) -> dict[str, str] | None:
        """The recorded key id and UUID of the table (``icecrypt.table.commit.pin``), None if none."""
        raise NotImplementedError

    def _table_state(self, namespace: tuple[str, ...], name: str) -> tuple[str | None, dict[str, str] | None]:
        """The table's metadata location and the catalog's record of it, read together
        (one query where the backend can: the record's digest must be the one of that
        location).  A backend overrides this when two reads could straddle a commit."""
        return self._table_location(namespace, name), self._pin_get(namespace, name)

    def _record_digest(self, namespace: tuple[str, ...], name: str, recorded_location: str, digest: str) -> None:
        """Record ``digest`` (SHA-256 hex) as that of the metadata file at
        ``recorded_location``, if that is still the table's current location (a commit by
        another engine, admitted; ``_CatalogTableStore.check_digest``)."""
        raise NotImplementedError

    def _pin_set(self, namespace: tuple[str, ...], name: str, pin: dict[str, str] | None) -> None:
        """Record (or, with None, forget) the table's key id and UUID."""
        raise NotImplementedError

    def _table_drop(self, namespace: tuple[str, ...], name: str) -> None:
        raise NotImplementedError

    def _table_rename(self, namespace: tuple[str, ...], name: str, new_namespace: tuple[str, ...], new_name: str) -> None:
        """Rename the table (its row and its pin together)."""
        raise CatalogError(f"{self._describe(namespace, name)}: this catalog cannot rename tables")

    def _table_list(self, namespace: tuple[str, ...]) -> list[str]:
        raise NotImplementedError


def _check_anchored(locations: Locations, metadata: Mapping[str, Any], recorded: str, what: str) -> None:
    """Refuse a catalog table whose metadata names a location (or write.metadata.path) that
    does not hold the metadata file the catalog records: storage can rewrite the file, the
    catalog database is the anchor.  Without this, a writer of the table's own storage
    could point its ``location`` at another table, whose files the table's maintenance
    would then list and delete."""
    from icecrypt.table.commit.pin import TablePin

    roots = TablePin.from_metadata(dict(metadata)).roots()
    if roots and not locations.confined(roots).is_inside(recorded):
        raise PathOutsideTableError(
            f"{what}: its metadata file {recorded} (as the catalog records it) lies outside the table location "
            f"{roots[0]} that file names (refused: the catalog's metadata location anchors a catalog table)",
            location=recorded, table_location=roots[0],
        )


def _purge(table: Any) -> None:
    """Delete what a dropped table's metadata references (best effort, as Java's
    ``CatalogUtil.dropTableData``: a file that cannot be deleted is left).

    The metadata is storage's word: only files under the table's pinned roots are
    deleted, never through a symbolic link, and only metadata files where the metadata
    log names one; anything else is skipped with a PathOutsideTableWarning."""
    from icecrypt.table.commit.housekeeping import delete_logged_metadata_files
    from icecrypt.table.files.io import Deletions
    from icecrypt.table.ops import write as w

    target = w._Target.of(table)
    base = table.metadata
    manager = target.manager(base, check_kek=False) if base.get("snapshots") else None  # reads only
    io = target.io(manager)
    files: set[str] = set()
    cache: dict[str, Any] = {}
    for snapshot in base.get("snapshots") or ():
        try:
            files |= w._referenced_files(io, manager, snapshot, cache, live_only=False)
        except (OSError, ValueError):
            continue
    deletions = Deletions(table.locations, f"drop_table(purge=True) of {table.pin.location}")
    # the metadata log's files, by the rule rekey and encrypt_table's expiry follow too
    delete_logged_metadata_files(deletions, [e["metadata-file"] for e in base.get("metadata-log") or ()])
    for location in sorted(files):
        try:
            deletions.location(location)
        except OSError:
            pass
    try:
        deletions.path(table.metadata_location)
    except OSError:
        pass
    deletions.warn()

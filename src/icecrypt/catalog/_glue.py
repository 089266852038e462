"""The AWS Glue catalog: Iceberg tables as Glue tables, as PyIceberg and Iceberg Java store them.

A Glue database is a namespace (Glue has one level of them); an Iceberg table is a Glue
table with ``TableType=EXTERNAL_TABLE`` and the parameters ``table_type=ICEBERG``,
``metadata_location`` (the current ``metadata.json``) and ``previous_metadata_location``.
Its ``StorageDescriptor`` carries the table location and the current schema as Hive-style
columns (``iceberg.field.id`` / ``.optional`` / ``.current`` parameters), so Athena and
the Glue console see the table; PyIceberg's and Java's ``GlueCatalog`` read and commit the
same entries.

A commit is a compare-and-swap of ``metadata_location``: ``GetTable`` reads the entry and
its ``VersionId``, the swap is refused unless ``metadata_location`` is the commit's base,
and ``UpdateTable(VersionId=...)`` is refused by Glue (``ConcurrentModificationException``)
when another update landed in between -- Glue's optimistic locking, which is what makes the
swap atomic on AWS.

moto (5.2) stores ``VersionId`` but does not check it on ``UpdateTable``, so against moto
(and any Glue look-alike that ignores it) two writers can both pass the
``metadata_location`` check, and the second update replaces the first commit.  Glue's
version history (``GetTableVersion``) shows it: the entries after the base both name the
base as ``previous_metadata_location``.  So after its update a writer reads the version
right after its base; when that is another writer's commit from the same base, this one
lost: it puts the winner's entry back (if its own is still the current one) and raises
:class:`~icecrypt.errors.CommitConflictError` (an append is then re-applied).  Readers
resolve such a run of same-base entries to its first one (``GlueCatalog._settled_location``),
so nobody builds on the overwriting commit while it waits to be undone, and a writer
starting from the winner may commit on top of it (which also completes the repair if the
overwriting writer died).  What remains open on such a Glue: PyIceberg and Java see the
overwriting entry until it is undone (milliseconds), or, if its writer stopped in between,
until the next icecrypt commit; a commit of theirs in that time builds on it, and the
overwritten commit is lost.  On AWS Glue the checks never find anything to undo.

Properties, with PyIceberg's names: ``glue.endpoint``, ``glue.region``,
``glue.access-key-id``, ``glue.secret-access-key``, ``glue.session-token``,
``glue.profile-name``, ``glue.id`` (the catalog id, an AWS account id), ``glue.max-retries``,
``glue.retry-mode``, ``glue.skip-archive`` (default true); the credentials and region fall
back to ``client.*``.  ``glue.skip-name-validation`` (Java's name) turns off the check of
database and table names against Glue's rules (lower case letters, digits, ``_``).
``warehouse`` (``s3://bucket/prefix``) is where new databases' tables go when the database
has no ``LocationUri``: ``<warehouse>/<database>.db/<table>``, the Hive layout both
PyIceberg and Java use for Glue.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from icecrypt.catalog._base import Catalog
from icecrypt.errors import (
    CatalogError,
    CommitConflictError,
    InvalidIdentifierError,
    NamespaceAlreadyExistsError,
    NamespaceNotEmptyError,
    NoSuchNamespaceError,
    NoSuchTableError,
    TableAlreadyExistsError,
)

__all__ = ["GlueCatalog"]

# Glue's and the Iceberg parameters' names, as PyIceberg and Iceberg Java write them
TABLE_TYPE = "table_type"
ICEBERG = "ICEBERG"
METADATA_LOCATION = "metadata_location"
PREVIOUS_METADATA_LOCATION = "previous_metadata_location"
EXTERNAL_TABLE = "EXTERNAL_TABLE"
FIELD_ID = "iceberg.field.id"
FIELD_OPTIONAL = "iceberg.field.optional"
FIELD_CURRENT = "iceberg.field.current"

# Iceberg Java's IcebergToGlueConverter: what Glue accepts (it lower-cases other names)
_DATABASE_NAME = re.compile(r"[a-z0-9_]{1,252}\Z")
_TABLE_NAME = re.compile(r"[a-z0-9_]{1,255}\Z")

# keys of a GetTable answer that UpdateTable's TableInput accepts
_TABLE_INPUT_KEYS = (
    "Name",
    "Description",
    "Owner",
    "LastAccessTime",
    "LastAnalyzedTime",
    "Retention",
    "StorageDescriptor",
    "PartitionKeys",
    "ViewOriginalText",
    "ViewExpandedText",
    "TableType",
    "Parameters",
    "TargetTable",
)

# how many entries from one base _settled_location looks through (writers racing at once)
_MAX_SAME_BASE = 16

_PRIMITIVES = {
    "boolean": "boolean",
    "int": "int",
    "long": "bigint",
    "float": "float",
    "double": "double",
    "date": "date",
    "time": "string",
    "timestamp": "timestamp",
    "timestamptz": "timestamp",
    "timestamp_ns": "timestamp",
    "timestamptz_ns": "timestamp",
    "string": "string",
    "uuid": "string",
    "binary": "binary",
}


def _first(properties: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        value = properties.get(name)
        if value is not None and value != "":
            return value
    return None


def _as_bool(value: str | None, default: bool) -> bool:
    if value is None:
        return default
    return value.strip().lower() in ("true", "1", "yes")


def _glue_type(iceberg_type: Any) -> str:
    """The Hive type string Glue shows for an Iceberg type (its JSON form)."""
    if isinstance(iceberg_type, str):
        if iceberg_type in _PRIMITIVES:
            return _PRIMITIVES[iceberg_type]
        if iceberg_type.startswith("decimal"):
            return iceberg_type.replace(" ", "")
        if iceberg_type.startswith("fixed"):
            return "binary"
        return "string"  # variant, geometry, unknown: nothing better in Hive types
    kind = iceberg_type.get("type")
    if kind == "struct":
        fields = ",".join(f"{f['name']}:{_glue_type(f['type'])}" for f in iceberg_type.get("fields", ()))
        return f"struct<{fields}>"
    if kind == "list":
        return f"array<{_glue_type(iceberg_type['element'])}>"
    if kind == "map":
        return f"map<{_glue_type(iceberg_type['key'])},{_glue_type(iceberg_type['value'])}>"
    return "string"


def _columns(metadata: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Glue columns of the current schema, then the other schemas' columns not in it (as
    PyIceberg and Java list them, with ``iceberg.field.current`` telling them apart)."""
    schemas = metadata.get("schemas") or ([metadata["schema"]] if metadata.get("schema") else [])
    current_id = metadata.get("current-schema-id", 0)
    current = [s for s in schemas if s.get("schema-id", 0) == current_id]
    others = [s for s in schemas if s.get("schema-id", 0) != current_id]
    columns: dict[str, dict[str, Any]] = {}
    for schema, is_current in [(s, True) for s in current] + [(s, False) for s in others]:
        for field in schema.get("fields", ()):
            if field["name"] in columns:
                continue
            column: dict[str, Any] = {
                "Name": field["name"],
                "Type": _glue_type(field["type"]),
                "Parameters": {
                    FIELD_ID: str(field["id"]),
                    FIELD_OPTIONAL: str(not field.get("required", False)).lower(),
                    FIELD_CURRENT: str(is_current).lower(),
                },
            }
            if field.get("doc"):
                column["Comment"] = field["doc"]
            columns[field["name"]] = column
    return list(columns.values())


def _error_code(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return response.get("Error", {}).get("Code")
    return None


#: in ``GlueCatalog._call``'s ``errors``: answer None for this Glue error code
_NONE = object()

#: the namespace properties a Glue database keeps as its description (PyIceberg's, Iceberg Java's)
_DESCRIPTION_KEYS = frozenset({"Description", "comment"})


class GlueCatalog(Catalog):
    """Iceberg tables in AWS Glue, their files on S3 (configured by the ``s3.*``
    properties).  Build one with ``icecrypt.catalog.load_catalog(name, type="glue", ...)``."""

    def __init__(self, name: str, *, kms: Any = None, **properties: str) -> None:
        super().__init__(name, kms=kms, **properties)
        self._glue = self._glue_client(self.properties)
        self._validate_names = not _as_bool(self.properties.get("glue.skip-name-validation"), False)
        self._skip_archive = _as_bool(self.properties.get("glue.skip-archive"), True)
        self._history = True  # whether Glue keeps table versions (see _settled_location)

    # --- the Glue client ---------------------------------------------------------------------

    def _glue_client(self, properties: Mapping[str, str]) -> Any:
        try:
            import boto3
            from botocore.config import Config
            from botocore.exceptions import BotoCoreError
        except ImportError as exc:  # pragma: no cover - boto3 comes with the glue extra
            raise CatalogError(f"glue catalog {self.name!r} needs boto3 (pip install 'icecrypt[glue]')") from exc
        raw_retries = properties.get("glue.max-retries", "10")
        if not raw_retries.strip().isdigit():
            raise CatalogError(f"glue catalog {self.name!r}: glue.max-retries must be a number, not {raw_retries!r}")
        retries = {"max_attempts": int(raw_retries), "mode": properties.get("glue.retry-mode", "standard")}
        try:
            session = boto3.session.Session(
                profile_name=_first(properties, "glue.profile-name", "client.profile-name"),
                region_name=_first(properties, "glue.region", "client.region"),
                aws_access_key_id=_first(properties, "glue.access-key-id", "client.access-key-id"),
                aws_secret_access_key=_first(properties, "glue.secret-access-key", "client.secret-access-key"),
                aws_session_token=_first(properties, "glue.session-token", "client.session-token"),
            )
            client = session.client("glue", endpoint_url=properties.get("glue.endpoint"), config=Config(retries=retries))
        except (BotoCoreError, ValueError) as exc:  # no such profile, no region, a bad endpoint or retry mode
            raise CatalogError(f"glue catalog {self.name!r}: cannot make a Glue client: {exc}") from exc
        catalog_id = properties.get("glue.id")
        if catalog_id:
            # every Glue call takes an optional CatalogId; add it to each one (as PyIceberg does)
            def add_catalog_id(params: dict[str, Any], **_: Any) -> None:
                params.setdefault("CatalogId", catalog_id)

            client.meta.events.register("provide-client-params.glue", add_catalog_id)
        return client

    def _call(self, what: str, operation: str, errors: Mapping[str, Any] | None = None, **kwargs: Any) -> Any:
        """``self._glue.<operation>(**kwargs)``.  A Glue error whose code is in ``errors``
        raises what ``errors[code]()`` makes (or answers None for ``_NONE``); every other
        failure is a CatalogError naming ``what``."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self._glue, operation)(**kwargs)
        except ClientError as exc:
            code = _error_code(exc) or "?"
            handler = (errors or {}).get(code)
            if handler is _NONE:
                return None
            if handler is not None:
                raise handler() from None
            raise CatalogError(f"glue catalog {self.name!r}: {what} failed ({code}): {exc}") from exc
        except BotoCoreError as exc:
            raise CatalogError(f"glue catalog {self.name!r}: {what} failed: {exc}") from exc

    def _pages(
        self, what: str, operation: str, key: str, errors: Mapping[str, Any] | None = None, **kwargs: Any
    ) -> Iterator[dict[str, Any]]:
        token = None
        while True:
            answer = self._call(what, operation, errors, **kwargs, **({"NextToken": token} if token else {}))
            yield from answer.get(key, ())
            token = answer.get("NextToken")
            if not token:
                return

    def _no_database(self, database: str) -> Callable[[], Exception]:
        return lambda: NoSuchNamespaceError(f"glue catalog {self.name!r}: no database {database!r}")

    def _no_table(self, database: str, name: str) -> Callable[[], Exception]:
        return lambda: NoSuchTableError(f"glue catalog {self.name!r}: no table {database}.{name}")

    # --- names ------------------------------------------------------------------------------

    def _database(self, namespace: tuple[str, ...]) -> str:
        """The Glue database of a namespace; NoSuchNamespaceError for deeper namespaces."""
        if len(namespace) != 1:
            raise NoSuchNamespaceError(
                f"glue catalog {self.name!r}: namespace {'.'.join(namespace)!r} cannot exist "
                "(Glue databases are one level deep)"
            )
        database = namespace[0]
        if self._validate_names and not _DATABASE_NAME.match(database):
            raise InvalidIdentifierError(
                f"glue catalog {self.name!r}: {database!r} is not a valid Glue database name "
                "(1-252 of a-z, 0-9, _; set glue.skip-name-validation=true to skip this check)"
            )
        return database

    def _table_name(self, database: str, name: str) -> str:
        if self._validate_names and not _TABLE_NAME.match(name):
            raise InvalidIdentifierError(
                f"glue catalog {self.name!r}: {database}.{name!r} is not a valid Glue table name "
                "(1-255 of a-z, 0-9, _; set glue.skip-name-validation=true to skip this check)"
            )
        return name

    # --- namespaces -------------------------------------------------------------------------

    def _ns_create(self, namespace: tuple[str, ...], properties: dict[str, str]) -> None:
        database = self._database(namespace)
        database_input: dict[str, Any] = {"Name": database}
        parameters = {}
        for key, value in (properties or {}).items():
            if key == "location":  # as PyIceberg and Java map them
                database_input["LocationUri"] = value
            elif key in _DESCRIPTION_KEYS:
                database_input["Description"] = value
            else:
                parameters[key] = value
        database_input["Parameters"] = parameters
        errors = {
            "AlreadyExistsException": lambda: NamespaceAlreadyExistsError(
                f"glue catalog {self.name!r}: database {database!r} already exists"
            )
        }
        self._call(f"create database {database}", "create_database", errors, DatabaseInput=database_input)

    def _get_database(self, database: str) -> dict[str, Any] | None:
        answer = self._call(f"get database {database}", "get_database", {"EntityNotFoundException": _NONE}, Name=database)
        return None if answer is None else answer["Database"]

    def _ns_exists(self, namespace: tuple[str, ...]) -> bool:
        if len(namespace) != 1:
            return False
        return self._get_database(self._database(namespace)) is not None

    def _ns_list(self) -> list[tuple[str, ...]]:
        return [(database["Name"],) for database in self._pages("list databases", "get_databases", "DatabaseList")]

    def _ns_properties(self, namespace: tuple[str, ...]) -> dict[str, str]:
        """The database's parameters, its location as ``location`` and its description as
        ``comment`` (Iceberg Java's names, which Spark shows)."""
        database = self._get_database(self._database(namespace)) or {}
        out = {str(k): str(v) for k, v in (database.get("Parameters") or {}).items()}
        if database.get("LocationUri"):
            out["location"] = database["LocationUri"]
        if database.get("Description"):
            out["comment"] = database["Description"]
        return out

    def _ns_update(self, namespace: tuple[str, ...], removals: set[str], updates: dict[str, str]) -> None:
        name = self._database(namespace)
        database = self._get_database(name)
        if database is None:
            raise self._no_database(name)()
        parameters = {k: v for k, v in (database.get("Parameters") or {}).items() if k not in removals}
        database_input: dict[str, Any] = {"Name": name}
        location, description = database.get("LocationUri"), database.get("Description")
        if "location" in removals:
            location = None
        if removals & _DESCRIPTION_KEYS:
            description = None
        for key, value in updates.items():
            if key == "location":
                location = value
            elif key in _DESCRIPTION_KEYS:
                description = value
            else:
                parameters[key] = value
        database_input["Parameters"] = parameters
        if location:
            database_input["LocationUri"] = location
        if description:
            database_input["Description"] = description
        errors = {"EntityNotFoundException": self._no_database(name)}
        self._call(f"update database {name}", "update_database", errors, Name=name, DatabaseInput=database_input)

    def _ns_drop(self, namespace: tuple[str, ...]) -> None:
        database = self._database(namespace)
        tables = self._glue_tables(database)
        if tables:
            kinds = "Iceberg tables" if any(self._is_iceberg(t) for t in tables) else "non-Iceberg tables"
            names = ", ".join(sorted(t["Name"] for t in tables)[:5]) + (", ..." if len(tables) > 5 else "")
            raise NamespaceNotEmptyError(f"glue catalog {self.name!r}: database {database!r} still holds {kinds} ({names})")
        errors = {"EntityNotFoundException": self._no_database(database)}
        self._call(f"drop database {database}", "delete_database", errors, Name=database)

    # --- tables -----------------------------------------------------------------------------

    def _glue_tables(self, database: str) -> list[dict[str, Any]]:
        errors = {"EntityNotFoundException": self._no_database(database)}
        return list(self._pages(f"list tables of {database}", "get_tables", "TableList", errors, DatabaseName=database))

    @staticmethod
    def _is_iceberg(table: Mapping[str, Any]) -> bool:
        return str((table.get("Parameters") or {}).get(TABLE_TYPE, "")).upper() == ICEBERG

    def _get_table(self, database: str, name: str) -> dict[str, Any] | None:
        """The Glue table entry (with ``VersionId``), None if there is none (or no database)."""
        answer = self._call(
            f"get table {database}.{name}", "get_table", {"EntityNotFoundException": _NONE}, DatabaseName=database, Name=name
        )
        return None if answer is None else answer["Table"]

    def _table_version(self, database: str, name: str, version: int) -> dict[str, Any] | None:
        """Version ``version`` of the Glue table from its history; None when Glue does not
        answer it (not archived: ``SkipArchive``; or no permission)."""
        from botocore.exceptions import ClientError

        try:
            answer = self._call(
                f"get version {version} of table {database}.{name}", "get_table_version",
                DatabaseName=database, TableName=name, VersionId=str(version),
            )  # fmt: skip
        except CatalogError as exc:
            if isinstance(exc.__cause__, ClientError):
                return None
            raise
        return answer.get("TableVersion", {}).get("Table") or None

    def _metadata_location(self, table: Mapping[str, Any], database: str, name: str) -> str:
        parameters = table.get("Parameters") or {}
        if not self._is_iceberg(table):
            raise NoSuchTableError(
                f"glue catalog {self.name!r}: {database}.{name} is a Glue table but not an Iceberg table "
                f"(table_type={parameters.get(TABLE_TYPE)!r})"
            )
        location = parameters.get(METADATA_LOCATION)
        if not location:
            raise CatalogError(
                f"glue catalog {self.name!r}: Iceberg table {database}.{name} has no {METADATA_LOCATION} parameter"
            )
        return location

    def _table_location(self, namespace: tuple[str, ...], name: str) -> str | None:
        if len(namespace) != 1:
            return None
        database = self._database(namespace)
        table = self._get_table(database, name)
        if table is None or not self._is_iceberg(table):
            # a Glue table of another kind is no Iceberg table here (as in PyIceberg's
            # table_exists); creating one of its name fails in _table_create
            return None
        return self._settled_location(database, name, table)

    def _settled_location(self, database: str, name: str, table: Mapping[str, Any]) -> str:
        """The metadata location a reader should take as current.

        That is the entry's ``metadata_location``, except right after an update that
        replaced a concurrent commit from the same base (where Glue does not enforce
        ``VersionId``; see the module docstring): then the entries since the base all name
        that base as ``previous_metadata_location``, and the first of them is the commit
        that won.  Its writer is told so, while the overwriting writer is about to put it
        back; readers never build on the overwriting commit meanwhile.  One extra Glue
        call (the version before the current one); none once Glue turns out not to keep
        the history (``SkipArchive`` on AWS, which enforces ``VersionId`` anyway)."""
        location = self._metadata_location(table, database, name)
        previous = (table.get("Parameters") or {}).get(PREVIOUS_METADATA_LOCATION)
        if not self._history or not previous:
            return location
        try:
            version = int(table.get("VersionId") or "")
        except ValueError:
            return location
        winner = location
        for number in range(version - 1, max(0, version - 1 - _MAX_SAME_BASE), -1):
            entry = self._table_version(database, name, number)
            if entry is None:
                if number == version - 1:
                    self._history = False
                return location
            parameters = entry.get("Parameters") or {}
            entry_location = parameters.get(METADATA_LOCATION)
            if number == version - 1 and entry_location in (previous, location):
                return location  # the usual case: the entry before is the base, or this state
            if entry_location == previous or parameters.get(PREVIOUS_METADATA_LOCATION) != previous:
                return winner  # reached the base: ``winner`` is the first commit from it
            winner = entry_location
        return location

    def _table_list(self, namespace: tuple[str, ...]) -> list[str]:
        database = self._database(namespace)
        return [table["Name"] for table in self._glue_tables(database) if self._is_iceberg(table)]

    def _table_input(
        self, name: str, metadata_location: str, previous: str | None, glue_table: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        """TableInput for ``metadata_location``: the entry's other settings kept, the Iceberg
        parameters, location and columns from the metadata file."""
        metadata = self._read_metadata_json(metadata_location)
        table_input = {k: v for k, v in (glue_table or {}).items() if k in _TABLE_INPUT_KEYS}
        table_input["Name"] = name
        table_input["TableType"] = EXTERNAL_TABLE
        parameters = dict(table_input.get("Parameters") or {})
        parameters[TABLE_TYPE] = ICEBERG
        parameters[METADATA_LOCATION] = metadata_location
        if previous:
            parameters[PREVIOUS_METADATA_LOCATION] = previous
        else:
            parameters.pop(PREVIOUS_METADATA_LOCATION, None)
        table_input["Parameters"] = parameters
        descriptor = dict(table_input.get("StorageDescriptor") or {})
        descriptor["Columns"] = _columns(metadata)
        if metadata.get("location"):
            descriptor["Location"] = metadata["location"]
        table_input["StorageDescriptor"] = descriptor
        return table_input

    @staticmethod
    def _with_pin(table_input: dict[str, Any], pin: dict[str, str] | None) -> dict[str, Any]:
        """``table_input`` with the table's record (key id, UUID, roots, retired KEKs;
        ``icecrypt.table.commit.pin``) as Glue table parameters (kept by PyIceberg's and Java's updates, which copy the
        entry's parameters)."""
        from icecrypt.table.commit.pin import CATALOG_KEYS

        parameters = dict(table_input.get("Parameters") or {})
        for key in CATALOG_KEYS:
            parameters.pop(key, None)
        parameters.update(pin or {})
        return {**table_input, "Parameters": parameters}

    def _pin_get(self, namespace: tuple[str, ...], name: str) -> dict[str, str] | None:
        from icecrypt.table.commit.pin import CATALOG_KEYS

        if len(namespace) != 1:
            return None
        table = self._get_table(self._database(namespace), name)
        parameters = (table or {}).get("Parameters") or {}
        return {k: str(parameters[k]) for k in CATALOG_KEYS if parameters.get(k)} or None

    def _table_state(self, namespace: tuple[str, ...], name: str) -> tuple[str | None, dict[str, str] | None]:
        """The metadata location and the record, from one ``GetTable`` (the parameters of
        one entry version)."""
        from icecrypt.table.commit.pin import CATALOG_KEYS

        if len(namespace) != 1:
            return None, None
        database = self._database(namespace)
        table = self._get_table(database, name)
        if table is None or not self._is_iceberg(table):
            return None, None
        parameters = table.get("Parameters") or {}
        record = {k: str(parameters[k]) for k in CATALOG_KEYS if parameters.get(k)} or None
        return self._settled_location(database, name, table), record

    def _record_digest(self, namespace: tuple[str, ...], name: str, recorded_location: str, digest: str) -> None:
        from icecrypt.table.commit.pin import CATALOG_DIGEST, CATALOG_DIGEST_OF, CATALOG_KEYS

        database = self._database(namespace)
        table = self._get_table(database, name)
        if table is None or (table.get("Parameters") or {}).get(METADATA_LOCATION) != recorded_location:
            return  # committed again meanwhile: the next load records the newer one
        parameters = table.get("Parameters") or {}
        record = {k: str(parameters[k]) for k in CATALOG_KEYS if parameters.get(k)}
        record.update({CATALOG_DIGEST: digest, CATALOG_DIGEST_OF: recorded_location})
        table_input = {k: v for k, v in table.items() if k in _TABLE_INPUT_KEYS}
        try:  # VersionId: refused by Glue when another update landed in between
            self._update_table(database, name, self._with_pin(table_input, record), table["VersionId"])
        except CommitConflictError:
            return

    def _pin_set(self, namespace: tuple[str, ...], name: str, pin: dict[str, str] | None) -> None:
        database = self._database(namespace)
        table = self._get_table(database, name)
        if table is None:
            raise self._no_table(database, name)()
        table_input = {k: v for k, v in table.items() if k in _TABLE_INPUT_KEYS}
        self._update_table(database, name, self._with_pin(table_input, pin), table["VersionId"])

    def _table_create(
        self, namespace: tuple[str, ...], name: str, metadata_location: str, *, pin: dict[str, str] | None = None
    ) -> None:
        database = self._database(namespace)
        name = self._table_name(database, name)
        table_input = self._with_pin(self._table_input(name, metadata_location, None, None), pin)
        errors = {
            "AlreadyExistsException": lambda: TableAlreadyExistsError(
                f"glue catalog {self.name!r}: table {database}.{name} already exists"
            ),
            "EntityNotFoundException": self._no_database(database),
        }
        self._call(f"create table {database}.{name}", "create_table", errors, DatabaseName=database, TableInput=table_input)

    def _table_swap(
        self, namespace: tuple[str, ...], name: str, expected: str, new: str, *, pin: dict[str, str] | None = None
    ) -> None:
        database = self._database(namespace)
        what = f"table {database}.{name}"
        table = self._get_table(database, name)
        if table is None:
            raise NoSuchTableError(f"glue catalog {self.name!r}: {what} no longer exists")
        current = self._metadata_location(table, database, name)
        if current != expected and self._settled_location(database, name, table) != expected:
            # (when the entry overwrote a concurrent commit that is still to be put back, the
            # settled location is that commit: building on it also completes the repair)
            raise CommitConflictError(
                f"glue catalog {self.name!r}: {what} moved to {current} since {expected}, the base of this commit"
            )
        version_id = table.get("VersionId")
        if not version_id:
            raise CatalogError(f"glue catalog {self.name!r}: {what} has no VersionId; cannot commit safely")
        table_input = self._table_input(name, new, expected, table)
        if pin is not None:
            table_input = self._with_pin(table_input, pin)  # in the same update as the swap
        self._update_table(database, name, table_input, version_id)
        self._check_swap(database, name, version_id, expected, new)

    def _update_table(self, database: str, name: str, table_input: dict[str, Any], version_id: str) -> None:
        what = f"table {database}.{name}"
        errors = {
            # Glue's optimistic locking: the entry is no longer at the version read
            "ConcurrentModificationException": lambda: CommitConflictError(
                f"glue catalog {self.name!r}: {what} was updated concurrently (Glue table version {version_id} is gone)"
            ),
            "EntityNotFoundException": lambda: NoSuchTableError(f"glue catalog {self.name!r}: {what} no longer exists"),
        }
        self._call(
            f"update {what}", "update_table", errors,
            DatabaseName=database, TableInput=table_input, SkipArchive=self._skip_archive, VersionId=version_id,
        )  # fmt: skip

    def _check_swap(self, database: str, name: str, version_id: str, expected: str, new: str) -> None:
        """Undo an update that overwrote a concurrent commit from the same base, where
        Glue did not enforce ``VersionId`` (see the module docstring)."""
        if not self._history:
            return  # Glue keeps no history here (SkipArchive on AWS, where VersionId is enforced)
        try:
            successor = str(int(version_id) + 1)
        except ValueError:
            return  # not Glue's numbering: nothing to check against
        winner = self._table_version(database, name, int(successor))
        if winner is None:
            return  # history not kept (SkipArchive on AWS, where VersionId is enforced)
        parameters = winner.get("Parameters") or {}
        winner_location = parameters.get(METADATA_LOCATION)
        if (
            winner_location in (None, new, expected)
            or parameters.get(PREVIOUS_METADATA_LOCATION) != expected
        ):
            return  # the version after the base is this commit (or no commit at all)
        # Another writer's commit from the same base landed first, and this update replaced
        # it.  Put it back while this commit is still the current entry.
        current = self._get_table(database, name)
        restored = ""
        if current is not None and (current.get("Parameters") or {}).get(METADATA_LOCATION) == new:
            restore = {k: v for k, v in winner.items() if k in _TABLE_INPUT_KEYS}
            try:
                self._update_table(database, name, restore, current["VersionId"])
                restored = f"; the table was set back to {winner_location}"
            except CommitConflictError:
                pass
        raise CommitConflictError(
            f"glue catalog {self.name!r}: table {database}.{name}: a concurrent commit ({winner_location}) "
            f"from the same base {expected} landed first{restored}"
        )

    def _table_drop(self, namespace: tuple[str, ...], name: str) -> None:
        database = self._database(namespace)
        table = self._get_table(database, name)
        if table is None:
            raise self._no_table(database, name)()
        self._metadata_location(table, database, name)  # refuses non-Iceberg tables
        errors = {"EntityNotFoundException": self._no_table(database, name)}
        self._call(f"drop table {database}.{name}", "delete_table", errors, DatabaseName=database, Name=name)

    def _default_table_location(self, namespace: tuple[str, ...], name: str) -> str:
        database = self._database(namespace)
        name = self._table_name(database, name)
        record = self._get_database(database)
        if record is None:
            raise self._no_database(database)()
        if record.get("LocationUri"):
            return f"{record['LocationUri'].rstrip('/')}/{name}"
        warehouse = self.warehouse
        if not warehouse:
            raise CatalogError(
                f"glue catalog {self.name!r}: database {database!r} has no LocationUri and the catalog no "
                f"warehouse property; give create_table a location for {database}.{name}"
            )
        return f"{warehouse}/{database}.db/{name}"

    # --- files ------------------------------------------------------------------------------

    def _read_metadata_json(self, metadata_location: str) -> dict[str, Any]:
        """The ``metadata.json`` at ``metadata_location`` (a recorded location), for the
        Glue entry's location and columns."""
        from icecrypt.table.files.metadata import read_metadata_file

        locations = self._locations(metadata_location)
        return read_metadata_file(locations.filesystem, locations.to_fs_path(metadata_location))

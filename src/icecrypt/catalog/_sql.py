"""The SQL catalog: the JDBC catalog's tables, shared with Iceberg Java and PyIceberg.

Iceberg Java's ``JdbcCatalog`` and PyIceberg's ``SqlCatalog`` keep a catalog in two
tables (created here when missing, with the same DDL)::

    iceberg_tables(catalog_name, table_namespace, table_name,
                   metadata_location, previous_metadata_location, iceberg_type)
    iceberg_namespace_properties(catalog_name, namespace, property_key, property_value)

A namespace is stored as its levels joined by ``.``; a namespace exists when it has a
property row (an empty one gets ``exists = true``, as both implementations write) or a
table.  ``iceberg_type`` (the "v1" schema) is ``TABLE`` for tables, ``VIEW`` for views,
NULL in rows written before it existed; views are not tables here.  Catalogs created by
older versions without the column ("v0") are used as they are.

A commit is one conditional UPDATE: ``metadata_location = new,
previous_metadata_location = expected WHERE ... AND metadata_location = expected``; it
won when it changed one row.  The database serializes the updates, so this is a
compare-and-swap across processes and machines (SQLite: within one machine, with a busy
timeout so writers wait for each other's locks instead of failing).

``uri`` is an SQLAlchemy URL (``sqlite:////abs/path/catalog.db``,
``postgresql+psycopg2://user:password@host:port/db``); without one the catalog is the
SQLite file ``<warehouse>/catalog.db`` (the embedded default).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

from icecrypt.catalog._base import Catalog, _show
from icecrypt.table.commit import pin as _pin
from icecrypt.errors import (
    CatalogError,
    CommitConflictError,
    NamespaceAlreadyExistsError,
    NamespaceNotEmptyError,
    NoSuchNamespaceError,
    NoSuchTableError,
    TableAlreadyExistsError,
)

__all__ = ["SqlCatalog", "DEFAULT_SQLITE_NAME"]

DEFAULT_SQLITE_NAME = "catalog.db"
TABLE_TYPE = "TABLE"
VIEW_TYPE = "VIEW"
NAMESPACE_EXISTS_PROPERTY = "exists"
SQLITE_BUSY_TIMEOUT_S = 60.0

_ENGINES: dict[tuple[int, str], Any] = {}
_ENGINES_LOCK = threading.Lock()


def _schema_with_pins() -> tuple[Any, Any, Any, Any]:
    """The JDBC catalog's two tables, and icecrypt's own third one (``icecrypt_table_pins``:
    each table's master key id and data key length, UUID, roots, retired KEKs and the
    SHA-256 of its current metadata file, out of reach of whoever writes the table's
    storage; Java and PyIceberg ignore it).  Catalogs created before
    the roots and retired KEKs were recorded lack their columns: they are added when the
    catalog first opens the table (``_PIN_COLUMNS_ADDED``)."""
    from sqlalchemy import Column, MetaData, String, Table, Text

    def table_key() -> list[Any]:
        return [Column(name, String(255), primary_key=True, nullable=False)
                for name in ("catalog_name", "table_namespace", "table_name")]  # fmt: skip

    meta = MetaData()
    tables = Table(
        "iceberg_tables", meta, *table_key(),
        Column("metadata_location", String(1000), nullable=True),
        Column("previous_metadata_location", String(1000), nullable=True),
        Column("iceberg_type", String(5), nullable=True),
    )  # fmt: skip
    namespaces = Table(
        "iceberg_namespace_properties", meta,
        Column("catalog_name", String(255), primary_key=True, nullable=False),
        Column("namespace", String(255), primary_key=True, nullable=False),
        Column("property_key", String(255), primary_key=True, nullable=False),
        Column("property_value", String(1000), nullable=False),
    )  # fmt: skip
    pins = Table(
        "icecrypt_table_pins", meta, *table_key(),
        Column("table_key_id", String(1000), nullable=True),
        Column("table_uuid", String(255), nullable=True),
        Column("location", String(1000), nullable=True),
        Column("write_data_path", String(1000), nullable=True),
        Column("write_metadata_path", String(1000), nullable=True),
        Column("retired_keks", Text, nullable=True),
        Column("data_key_length", String(16), nullable=True),
        Column("metadata_sha256", String(64), nullable=True),
        Column("metadata_sha256_of", String(1000), nullable=True),
    )  # fmt: skip
    return meta, tables, namespaces, pins


#: columns of icecrypt_table_pins added after its first version (nullable; ALTER TABLE ADD
#: COLUMN on a catalog that lacks them) and the record keys (icecrypt.table.commit.pin) they hold
_PIN_COLUMNS_ADDED = {
    "location": _pin.CATALOG_LOCATION,
    "write_data_path": _pin.CATALOG_DATA_PATH,
    "write_metadata_path": _pin.CATALOG_METADATA_PATH,
    "retired_keks": _pin.CATALOG_RETIRED_KEKS,
    "data_key_length": _pin.CATALOG_DEK_LENGTH,
    "metadata_sha256": _pin.CATALOG_DIGEST,
    "metadata_sha256_of": _pin.CATALOG_DIGEST_OF,
}
_PIN_COLUMNS = {"table_key_id": _pin.CATALOG_KEY_ID, "table_uuid": _pin.CATALOG_UUID, **_PIN_COLUMNS_ADDED}


def _local_warehouse_path(warehouse: str) -> str:
    if warehouse.startswith("file://"):
        rest = warehouse[len("file://") :]
        return rest[rest.index("/") :] if not rest.startswith("/") and "/" in rest else rest
    if warehouse.startswith("file:"):
        return warehouse[len("file:") :]
    if "://" in warehouse:
        raise CatalogError(
            f"warehouse {warehouse!r}: the embedded SQLite catalog needs a local warehouse; "
            "give a uri (sqlite:///..., postgresql+psycopg2://...) for a remote one"
        )
    return os.path.abspath(warehouse)


def _engine(uri: str) -> Any:
    """One engine per URI and process (engines hold connection pools; a forked child
    must not reuse its parent's connections)."""
    from sqlalchemy import create_engine, event

    key = (os.getpid(), uri)
    with _ENGINES_LOCK:
        engine = _ENGINES.get(key)
        if engine is not None:
            return engine
        if uri.startswith("sqlite"):
            engine = create_engine(uri, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S})

            @event.listens_for(engine, "connect")
            def _busy_timeout(dbapi_connection: Any, _record: Any) -> None:
                cursor = dbapi_connection.cursor()
                cursor.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
                cursor.close()
        else:
            engine = create_engine(uri, pool_pre_ping=True)
        _ENGINES[key] = engine
        return engine


class SqlCatalog(Catalog):
    """An Iceberg catalog in an SQL database (SQLite, PostgreSQL, anything SQLAlchemy
    reaches), in the JDBC catalog's tables that Iceberg Java and PyIceberg share.

    ``uri``: SQLAlchemy URL; default ``sqlite:///<warehouse>/catalog.db``.
    ``warehouse``: where new tables go (``<warehouse>/<namespace levels>/<table>``), a
    local path, ``file://`` or ``s3://`` URI.  ``init_catalog_tables`` (default true):
    create the two tables when missing.
    """

    def __init__(self, name: str, *, kms: Any = None, **properties: str) -> None:
        super().__init__(name, kms=kms, **properties)
        try:
            import sqlalchemy  # noqa: F401
        except ImportError:
            raise ImportError(
                "the SQL catalog needs SQLAlchemy 2 (pip install sqlalchemy; psycopg2 for PostgreSQL)"
            ) from None
        uri = self.properties.get("uri")
        if not uri:
            if not self.warehouse:
                raise CatalogError(f"catalog {name!r}: an SQL catalog needs a uri or a (local) warehouse")
            directory = _local_warehouse_path(self.warehouse)
            os.makedirs(directory, exist_ok=True)
            uri = f"sqlite:///{os.path.join(directory, DEFAULT_SQLITE_NAME)}"
        self.uri = uri
        self._may_alter = self.properties.get("init_catalog_tables", "true").strip().lower() in ("true", "1", "yes")
        self._engine = _engine(uri)
        _, self._tables, self._namespaces, self._pins = _schema_with_pins()
        self._typed = True
        if self._may_alter:
            self._create_tables()
        self._typed = self._has_type_column()

    # --- schema -------------------------------------------------------------------------------

    def _create_tables(self) -> None:
        from sqlalchemy.exc import DBAPIError

        meta = self._tables.metadata
        for attempt in range(3):
            try:
                meta.create_all(self._engine, checkfirst=True)
                return
            except DBAPIError as exc:  # e.g. another process created them between check and create
                if attempt == 2:
                    reason = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else type(exc).__name__
                    raise CatalogError(
                        f"catalog {self.name!r} at {self._safe_uri()}: creating the catalog tables failed ({reason})"
                    ) from exc

    def _has_type_column(self) -> bool:
        from sqlalchemy import inspect

        try:
            columns = inspect(self._engine).get_columns("iceberg_tables")
        except Exception as exc:
            raise CatalogError(f"catalog {self.name!r} at {self._safe_uri()}: iceberg_tables is not readable ({exc})") from exc
        return any(c["name"].lower() == "iceberg_type" for c in columns)

    def _safe_uri(self) -> str:
        """The URI without a password (for messages)."""
        from sqlalchemy.engine import make_url

        try:
            return make_url(self.uri).render_as_string(hide_password=True)
        except Exception:
            return "<uri>"

    @contextlib.contextmanager
    def _db(self, what: str, *, write: bool = False) -> Iterator[Any]:
        """A connection (a transaction, committed on exit, with ``write``); a database
        failure becomes a CatalogError naming the catalog (never the password).
        IntegrityError passes through: callers turn it into "already exists"."""
        from sqlalchemy.exc import DBAPIError, IntegrityError

        try:
            with self._engine.begin() if write else self._engine.connect() as conn:
                yield conn
        except IntegrityError:
            raise
        except DBAPIError as exc:
            reason = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else type(exc).__name__
            raise CatalogError(f"catalog {self.name!r} at {self._safe_uri()}: {what} failed ({reason})") from exc

    def _table_filter(self, stmt: Any) -> Any:
        if not self._typed:
            return stmt
        column = self._tables.c.iceberg_type
        return stmt.where((column == TABLE_TYPE) | column.is_(None))

    def _where_table(self, stmt: Any, namespace: tuple[str, ...], name: str) -> Any:
        t = self._tables.c
        return self._table_filter(
            stmt.where(t.catalog_name == self.name, t.table_namespace == _show(namespace), t.table_name == name)
        )

    # --- namespaces -------------------------------------------------------------------------------

    def _ns_exists(self, namespace: tuple[str, ...]) -> bool:
        from sqlalchemy import select

        text = _show(namespace)
        prefix = text.replace("!", "!!").replace("_", "!_").replace("%", "!%") + ".%"
        t, n = self._tables.c, self._namespaces.c
        with self._db("namespace lookup") as conn:
            stmt = select(t.table_name).where(
                t.catalog_name == self.name, (t.table_namespace == text) | t.table_namespace.like(prefix, escape="!")
            )
            if conn.execute(stmt.limit(1)).first() is not None:
                return True
            stmt = select(n.property_key).where(
                n.catalog_name == self.name, (n.namespace == text) | n.namespace.like(prefix, escape="!")
            )
            return conn.execute(stmt.limit(1)).first() is not None

    def _ns_create(self, namespace: tuple[str, ...], properties: dict[str, str]) -> None:
        from sqlalchemy import insert
        from sqlalchemy.exc import IntegrityError

        if self._ns_exists(namespace):
            raise NamespaceAlreadyExistsError(f"{self._describe(namespace)} already exists")
        rows = {NAMESPACE_EXISTS_PROPERTY: "true", **properties}
        try:
            with self._db("namespace creation", write=True) as conn:
                conn.execute(
                    insert(self._namespaces),
                    [
                        {"catalog_name": self.name, "namespace": _show(namespace), "property_key": k, "property_value": v}
                        for k, v in rows.items()
                    ],
                )
        except IntegrityError:
            raise NamespaceAlreadyExistsError(f"{self._describe(namespace)} already exists") from None

    def _ns_list(self) -> list[tuple[str, ...]]:
        from sqlalchemy import select, union

        stmt = union(
            select(self._tables.c.table_namespace).where(self._tables.c.catalog_name == self.name),
            select(self._namespaces.c.namespace).where(self._namespaces.c.catalog_name == self.name),
        )
        with self._db("namespace listing") as conn:
            return [tuple(row[0].split(".")) for row in conn.execute(stmt) if row[0]]

    def _ns_drop(self, namespace: tuple[str, ...]) -> None:
        from sqlalchemy import delete

        if not self._ns_exists(namespace):
            raise NoSuchNamespaceError(f"{self._describe(namespace)} does not exist")
        tables = self._table_list(namespace) + self._view_list(namespace)
        if tables:
            raise NamespaceNotEmptyError(
                f"{self._describe(namespace)} is not empty: {len(tables)} table(s) or view(s) "
                f"({', '.join(sorted(tables)[:5])})"
            )
        with self._db("namespace drop", write=True) as conn:
            n = self._namespaces.c
            conn.execute(delete(self._namespaces).where(n.catalog_name == self.name, n.namespace == _show(namespace)))

    def _ns_properties(self, namespace: tuple[str, ...]) -> dict[str, str]:
        from sqlalchemy import select

        n = self._namespaces.c
        stmt = select(n.property_key, n.property_value).where(n.catalog_name == self.name,
                                                               n.namespace == _show(namespace))
        with self._db("namespace properties") as conn:
            return {k: v for k, v in conn.execute(stmt) if k != NAMESPACE_EXISTS_PROPERTY and v is not None}

    def _ns_update(self, namespace: tuple[str, ...], removals: set[str], updates: dict[str, str]) -> None:
        from sqlalchemy import delete, insert

        if NAMESPACE_EXISTS_PROPERTY in removals | set(updates):
            raise ValueError(f"{self._describe(namespace)}: property {NAMESPACE_EXISTS_PROPERTY!r} is the catalog's own")
        n = self._namespaces.c
        text = _show(namespace)
        rows = {NAMESPACE_EXISTS_PROPERTY: "true", **updates}  # a namespace known by its tables only gets its row
        with self._db("namespace properties update", write=True) as conn:
            conn.execute(delete(self._namespaces).where(n.catalog_name == self.name, n.namespace == text,
                                                        n.property_key.in_(removals | set(rows))))
            conn.execute(insert(self._namespaces), [
                {"catalog_name": self.name, "namespace": text, "property_key": k, "property_value": v}
                for k, v in rows.items()])

    # --- tables ---------------------------------------------------------------------------------

    def _table_location(self, namespace: tuple[str, ...], name: str) -> str | None:
        from sqlalchemy import select

        with self._db("table lookup") as conn:
            row = conn.execute(self._where_table(select(self._tables.c.metadata_location), namespace, name)).first()
        if row is None:
            return None
        if not row[0]:
            raise CatalogError(f"{self._describe(namespace, name)} has no metadata_location")
        return str(row[0])

    def _table_create(
        self, namespace: tuple[str, ...], name: str, metadata_location: str, *, pin: dict[str, str] | None = None
    ) -> None:
        from sqlalchemy import insert
        from sqlalchemy.exc import IntegrityError

        if not self._ns_exists(namespace):
            raise NoSuchNamespaceError(f"{self._describe(namespace)} does not exist")
        row = {
            "catalog_name": self.name,
            "table_namespace": _show(namespace),
            "table_name": name,
            "metadata_location": metadata_location,
            "previous_metadata_location": None,
        }
        if self._typed:
            row["iceberg_type"] = TABLE_TYPE
        if pin is not None:
            self._ensure_pins()
        try:
            with self._db("table creation", write=True) as conn:
                conn.execute(insert(self._tables).values(**row))
                if pin is not None:
                    self._write_pin(conn, namespace, name, pin)
        except IntegrityError:
            raise TableAlreadyExistsError(f"{self._describe(namespace, name)} already exists") from None

    def _table_swap(
        self, namespace: tuple[str, ...], name: str, expected: str, new: str, *, pin: dict[str, str] | None = None
    ) -> None:
        from sqlalchemy import update

        stmt = self._where_table(update(self._tables), namespace, name).where(
            self._tables.c.metadata_location == expected
        )
        if pin is not None:
            self._ensure_pins()
        with self._db("commit", write=True) as conn:
            result = conn.execute(stmt.values(metadata_location=new, previous_metadata_location=expected))
            changed = result.rowcount
            if changed == 1 and pin is not None:
                self._write_pin(conn, namespace, name, pin)  # in the same transaction as the swap
        if changed == 1:
            return
        current = self._table_location(namespace, name)
        if current is None:
            raise NoSuchTableError(f"{self._describe(namespace, name)} was dropped; commit of {new} not applied")
        raise CommitConflictError(
            f"{self._describe(namespace, name)}: another writer committed first (metadata location is {current}, "
            f"expected {expected}); {new} was not committed"
        )

    def _table_drop(self, namespace: tuple[str, ...], name: str) -> None:
        from sqlalchemy import delete

        with self._db("table drop", write=True) as conn:
            result = conn.execute(self._where_table(delete(self._tables), namespace, name))
            if result.rowcount >= 1 and self._pins_exist():
                conn.execute(self._pin_where(delete(self._pins), namespace, name))
        if result.rowcount < 1:
            raise NoSuchTableError(f"{self._describe(namespace, name)} does not exist")

    def _table_rename(self, namespace: tuple[str, ...], name: str, new_namespace: tuple[str, ...], new_name: str) -> None:
        from sqlalchemy import update
        from sqlalchemy.exc import IntegrityError

        moved = {"table_namespace": _show(new_namespace), "table_name": new_name}
        try:
            with self._db("table rename", write=True) as conn:
                result = conn.execute(self._where_table(update(self._tables), namespace, name).values(**moved))
                if result.rowcount == 1 and self._pins_exist():
                    conn.execute(self._pin_where(update(self._pins), namespace, name).values(**moved))
        except IntegrityError:
            raise TableAlreadyExistsError(f"{self._describe(new_namespace, new_name)} already exists") from None
        if result.rowcount != 1:
            raise NoSuchTableError(f"{self._describe(namespace, name)} does not exist")

    # --- pins (icecrypt.table.commit.pin) ------------------------------------------------------------

    def _pins_exist(self) -> bool:
        """Whether icecrypt_table_pins exists (then with every column, added if missing)."""
        from sqlalchemy import inspect

        if getattr(self, "_pins_known", False):
            return True
        try:
            known = bool(inspect(self._engine).has_table("icecrypt_table_pins"))
        except Exception as exc:
            raise CatalogError(f"catalog {self.name!r} at {self._safe_uri()}: table pins not readable ({exc})") from exc
        if known:
            # a catalog opened to change nothing (init_catalog_tables=false: the CLI's commands
            # on existing tables) reads the columns there are and alters no schema
            self._pin_columns = self._migrate_pins() if self._may_alter else self._existing_pin_columns()
        self._pins_known = known
        return known

    def _existing_pin_columns(self) -> set[str]:
        from sqlalchemy import inspect

        return {c["name"].lower() for c in inspect(self._engine).get_columns("icecrypt_table_pins")}

    def _migrate_pins(self) -> set[str]:
        """Add the columns a pins table made by an earlier version lacks (nullable, so
        its rows read as records without roots: a table gets them at its next commit);
        returns the columns there are.  A concurrent migration is fine; a database that
        refuses ALTER TABLE leaves the table as it is (reads use what there is, writes of
        a record then fail with a CatalogError)."""
        from sqlalchemy import text
        from sqlalchemy.exc import DBAPIError

        columns = self._existing_pin_columns()
        for name in _PIN_COLUMNS_ADDED:
            if name in columns:
                continue
            kind = self._pins.c[name].type.compile(dialect=self._engine.dialect)
            try:
                with self._engine.begin() as conn:
                    conn.execute(text(f"ALTER TABLE icecrypt_table_pins ADD COLUMN {name} {kind}"))
            except DBAPIError:
                pass  # added meanwhile by another process, or not allowed: see below
        return self._existing_pin_columns()

    def _ensure_pins(self) -> None:
        from sqlalchemy.exc import DBAPIError

        if not self._pins_exist():
            try:
                self._pins.create(self._engine, checkfirst=True)
            except DBAPIError as exc:
                if not self._pins_exist():  # another process may have created it meanwhile
                    raise CatalogError(
                        f"catalog {self.name!r} at {self._safe_uri()}: creating icecrypt_table_pins failed; "
                        "the catalog cannot record the table's master key id and location"
                    ) from exc
            self._pins_known = False
            self._pins_exist()
        missing = set(_PIN_COLUMNS) - self._pin_columns
        if missing:
            raise CatalogError(
                f"catalog {self.name!r} at {self._safe_uri()}: icecrypt_table_pins lacks column(s) "
                f"{', '.join(sorted(missing))} and they could not be added (ALTER TABLE refused); "
                "the catalog cannot record the table's location"
            )

    def _pin_where(self, stmt: Any, namespace: tuple[str, ...], name: str) -> Any:
        p = self._pins.c
        return stmt.where(p.catalog_name == self.name, p.table_namespace == _show(namespace), p.table_name == name)

    def _write_pin(self, conn: Any, namespace: tuple[str, ...], name: str, pin: dict[str, str] | None) -> None:
        from sqlalchemy import delete, insert

        conn.execute(self._pin_where(delete(self._pins), namespace, name))
        if pin is not None:
            values = {column: pin.get(key) for column, key in _PIN_COLUMNS.items()}
            conn.execute(insert(self._pins).values(
                catalog_name=self.name, table_namespace=_show(namespace), table_name=name, **values,
            ))  # fmt: skip

    def _pin_get(self, namespace: tuple[str, ...], name: str) -> dict[str, str] | None:
        from sqlalchemy import select

        if not self._pins_exist():
            return None
        columns = [c for c in _PIN_COLUMNS if c in self._pin_columns]
        with self._db("table pin lookup") as conn:
            row = conn.execute(self._pin_where(select(*(self._pins.c[c] for c in columns)), namespace, name)).first()
        if row is None:
            return None
        record = {_PIN_COLUMNS[c]: str(v) for c, v in zip(columns, row) if v}
        return record or None

    def _pin_set(self, namespace: tuple[str, ...], name: str, pin: dict[str, str] | None) -> None:
        self._ensure_pins()
        with self._db("table pin update", write=True) as conn:
            self._write_pin(conn, namespace, name, pin)

    def _table_state(self, namespace: tuple[str, ...], name: str) -> tuple[str | None, dict[str, str] | None]:
        """The metadata location and the pin record in one query (an outer join): a
        commit between two queries would pair one version's location with another's
        digest."""
        from sqlalchemy import and_, select

        if not self._pins_exist():
            return self._table_location(namespace, name), None
        t, p = self._tables.c, self._pins.c
        columns = [c for c in _PIN_COLUMNS if c in self._pin_columns]
        join = self._tables.outerjoin(
            self._pins, and_(p.catalog_name == t.catalog_name, p.table_namespace == t.table_namespace,
                             p.table_name == t.table_name),
        )  # fmt: skip
        stmt = self._where_table(select(t.metadata_location, *(p[c] for c in columns)).select_from(join), namespace, name)
        with self._db("table lookup") as conn:
            row = conn.execute(stmt).first()
        if row is None:
            return None, None
        if not row[0]:
            raise CatalogError(f"{self._describe(namespace, name)} has no metadata_location")
        record = {_PIN_COLUMNS[c]: str(v) for c, v in zip(columns, row[1:]) if v}
        return str(row[0]), record or None

    def _record_digest(self, namespace: tuple[str, ...], name: str, recorded_location: str, digest: str) -> None:
        from sqlalchemy import select

        if not self._may_alter and not {"metadata_sha256", "metadata_sha256_of"} <= (
            self._pin_columns if self._pins_exist() else set()
        ):  # fmt: skip
            return  # a catalog opened to change nothing: the next commit records it
        self._ensure_pins()
        with self._db("recording a metadata digest", write=True) as conn:
            stmt = self._where_table(select(self._tables.c.metadata_location), namespace, name).with_for_update()
            row = conn.execute(stmt).first()
            if row is None or row[0] != recorded_location:
                return  # committed again meanwhile: the next load records the newer one
            columns = [c for c in _PIN_COLUMNS if c in self._pin_columns]
            found = conn.execute(self._pin_where(select(*(self._pins.c[c] for c in columns)), namespace, name)).first()
            record = {} if found is None else {_PIN_COLUMNS[c]: str(v) for c, v in zip(columns, found) if v}
            record.update({_pin.CATALOG_DIGEST: digest, _pin.CATALOG_DIGEST_OF: recorded_location})
            self._write_pin(conn, namespace, name, record)

    def _table_list(self, namespace: tuple[str, ...]) -> list[str]:
        from sqlalchemy import select

        t = self._tables.c
        stmt = self._table_filter(
            select(t.table_name).where(t.catalog_name == self.name, t.table_namespace == _show(namespace))
        )
        with self._db("table listing") as conn:
            return [str(row[0]) for row in conn.execute(stmt)]

    # --- views (rows of type VIEW, as Java's JDBC catalog keeps them; digests in the pins) ----------

    def _require_views(self) -> None:
        if not self._typed:
            raise CatalogError(f"catalog {self.name!r} at {self._safe_uri()}: its iceberg_tables has no "
                               "iceberg_type column (a catalog made before views), so it keeps no views")

    def _where_view(self, stmt: Any, namespace: tuple[str, ...], name: str) -> Any:
        t = self._tables.c
        self._require_views()
        return stmt.where(t.catalog_name == self.name, t.table_namespace == _show(namespace), t.table_name == name,
                          t.iceberg_type == VIEW_TYPE)  # fmt: skip

    def _view_record(self, namespace: tuple[str, ...], name: str) -> tuple[str, str | None] | None:
        """The view's location and digest in one query (an outer join), as ``_table_state``:
        a replace between two queries would pair one version's location with another's
        digest."""
        from sqlalchemy import and_, select

        t = self._tables.c
        if not self._pins_exist() or not {"metadata_sha256", "metadata_sha256_of"} <= self._pin_columns:
            with self._db("view lookup") as conn:
                row = conn.execute(self._where_view(select(t.metadata_location), namespace, name)).first()
            return None if row is None else (str(row[0]), None)
        p = self._pins.c
        join = self._tables.outerjoin(
            self._pins, and_(p.catalog_name == t.catalog_name, p.table_namespace == t.table_namespace,
                             p.table_name == t.table_name),
        )  # fmt: skip
        stmt = select(t.metadata_location, p.metadata_sha256, p.metadata_sha256_of).select_from(join)
        with self._db("view lookup") as conn:
            row = conn.execute(self._where_view(stmt, namespace, name)).first()
        if row is None:
            return None
        location, digest, of = row
        return str(location), (str(digest) if digest and of == location else None)  # the recorded location's only

    def _view_pin(self, location: str, digest: str) -> dict[str, str]:
        return {_pin.CATALOG_DIGEST: digest, _pin.CATALOG_DIGEST_OF: location}

    def _view_create(self, namespace: tuple[str, ...], name: str, location: str, digest: str) -> None:
        from sqlalchemy import insert
        from sqlalchemy.exc import IntegrityError

        from icecrypt.errors import ViewAlreadyExistsError

        self._require_views()
        self._ensure_pins()
        row = {"catalog_name": self.name, "table_namespace": _show(namespace), "table_name": name,
               "metadata_location": location, "previous_metadata_location": None, "iceberg_type": VIEW_TYPE}
        try:
            with self._db("view creation", write=True) as conn:
                conn.execute(insert(self._tables).values(**row))
                self._write_pin(conn, namespace, name, self._view_pin(location, digest))
        except IntegrityError:
            raise ViewAlreadyExistsError(f"catalog {self.name!r}: view {_show((*namespace, name))}: the name is "
                                         "taken") from None

    def _view_swap(self, namespace: tuple[str, ...], name: str, expected: str, new: str, digest: str) -> None:
        from sqlalchemy import update

        self._ensure_pins()
        stmt = self._where_view(update(self._tables), namespace, name).where(
            self._tables.c.metadata_location == expected)
        with self._db("view replace", write=True) as conn:
            changed = conn.execute(stmt.values(metadata_location=new, previous_metadata_location=expected)).rowcount
            if changed == 1:
                self._write_pin(conn, namespace, name, self._view_pin(new, digest))
        if changed != 1:
            raise CommitConflictError(f"catalog {self.name!r}: view {_show((*namespace, name))} was replaced or "
                                      f"dropped meanwhile; {new} was not recorded")

    def _view_drop(self, namespace: tuple[str, ...], name: str) -> bool:
        from sqlalchemy import delete

        with self._db("view drop", write=True) as conn:
            dropped = conn.execute(self._where_view(delete(self._tables), namespace, name)).rowcount
            if dropped and self._pins_exist():
                conn.execute(self._pin_where(delete(self._pins), namespace, name))
        return dropped >= 1

    def _view_rename(self, namespace: tuple[str, ...], name: str, new_namespace: tuple[str, ...], new_name: str) -> None:
        from sqlalchemy import update
        from sqlalchemy.exc import IntegrityError

        from icecrypt.errors import NoSuchViewError, ViewAlreadyExistsError

        moved = {"table_namespace": _show(new_namespace), "table_name": new_name}
        try:
            with self._db("view rename", write=True) as conn:
                result = conn.execute(self._where_view(update(self._tables), namespace, name).values(**moved))
                if result.rowcount == 1 and self._pins_exist():
                    conn.execute(self._pin_where(update(self._pins), namespace, name).values(**moved))
        except IntegrityError:
            raise ViewAlreadyExistsError(f"catalog {self.name!r}: view {_show((*new_namespace, new_name))}: the "
                                         "name is taken") from None
        if result.rowcount != 1:
            raise NoSuchViewError(f"catalog {self.name!r}: view {_show((*namespace, name))} does not exist")

    def _view_list(self, namespace: tuple[str, ...]) -> list[str]:
        from sqlalchemy import select

        t = self._tables.c
        if not self._typed:
            return []
        stmt = select(t.table_name).where(t.catalog_name == self.name, t.table_namespace == _show(namespace),
                                          t.iceberg_type == VIEW_TYPE)  # fmt: skip
        with self._db("view listing") as conn:
            return [str(row[0]) for row in conn.execute(stmt)]

    def __repr__(self) -> str:
        return f"<SqlCatalog {self.name!r} {self._safe_uri()}>"

"""Fixtures of the Spark SQL catalog tests (``org.icecrypt.spark.SparkCatalog``).

They share the suite's ``local[2]`` session (tests/spark_fixtures.py, built with
``icecrypt.spark.configure``, so icecrypt's jar is on its classpath).  A catalog's
``spark.sql.catalog.<name>`` settings are runtime SQL settings: each catalog here is set
on the shared session under a fresh name (Spark keeps a catalog once a statement named
it), over its own warehouse in a temporary directory, with a local keystore KMS.
"""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path
from typing import Any

import pytest

from icecrypt.kms.local import LocalKms

MASTER = "master"
CATALOG_CLASS = "org.icecrypt.spark.SparkCatalog"


@dataclasses.dataclass
class SqlCatalog:
    """One SQL catalog on the shared session: its name, warehouse and options."""

    spark: Any
    name: str
    warehouse: Path
    options: dict[str, str]

    def sql(self, statement: str) -> list[Any]:
        """Run ``statement`` (``{c}`` stands for the catalog's name); its rows."""
        return self.spark.sql(statement.replace("{c}", self.name)).collect()

    def rows(self, statement: str) -> list[tuple]:
        """Rows of a query as sorted tuples (None first)."""
        return sorted((tuple(r) for r in self.sql(statement)), key=_sort_key)

    def icecrypt(self) -> Any:
        """The same catalog through icecrypt's Python API."""
        from icecrypt.spark._sql.catalogs import open_catalog

        return open_catalog(self.name, self.options)

    def table(self, identifier: str) -> Any:
        return self.icecrypt().load_table(tuple(identifier.split(".")))


def _sort_key(row: tuple) -> tuple:
    return tuple((v is not None, v if v is not None else 0) if not isinstance(v, (list, dict)) else (True, str(v))
                 for v in row)


@pytest.fixture(scope="session")
def keystore(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sql-kms") / "keystore.json"
    LocalKms.create_keystore(path, [MASTER, "other"])
    return path


@pytest.fixture(scope="session")
def kms_options(keystore) -> dict[str, str]:
    return {"encryption.kms-type": "local", "encryption.kms.local.keystore": str(keystore)}


@pytest.fixture(scope="session")
def sql_spark(spark):
    """The shared session with icecrypt's bridge registered."""
    import icecrypt.spark

    icecrypt.spark.register(spark)
    return spark


@pytest.fixture(scope="session")
def new_catalog(sql_spark, kms_options, tmp_path_factory):
    """``new_catalog(type="sql", **options)``: a fresh SQL catalog over a new warehouse."""

    def make(kind: str = "sql", warehouse: Path | None = None, **options: str) -> SqlCatalog:
        name = f"c{uuid.uuid4().hex[:10]}"
        warehouse = warehouse or tmp_path_factory.mktemp(f"wh-{kind}")
        settings = {"type": kind, "warehouse": str(warehouse), **kms_options, **options}
        sql_spark.conf.set(f"spark.sql.catalog.{name}", CATALOG_CLASS)
        for key, value in settings.items():
            sql_spark.conf.set(f"spark.sql.catalog.{name}.{key}", value)
        return SqlCatalog(sql_spark, name, warehouse, settings)

    return make


@pytest.fixture(scope="module")
def cat(new_catalog) -> SqlCatalog:
    """A SQL catalog (type sql, SQLite in the warehouse) with namespace ``db``."""
    catalog = new_catalog("sql")
    catalog.sql("CREATE NAMESPACE {c}.db")
    return catalog


def data_files(root: Path) -> list[Path]:
    """Every file under ``root`` (a table's or warehouse's directory), sorted."""
    return sorted(p for p in root.rglob("*") if p.is_file())


def magic(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read(4)

"""Views through the SQL catalog: Spark 4's own V2 view statements (``CREATE [OR REPLACE]
VIEW``, ``ALTER VIEW``, ``DROP VIEW``, ``SHOW VIEWS``, ``DESCRIBE``, ``SHOW CREATE TABLE``)
on icecrypt's catalog, which keeps each view as Iceberg view metadata recorded with its
SHA-256.  Rows are checked against a plain-Python model of the base table; a view whose
metadata file was changed in storage is refused, naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import MASTER

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def views(cat):
    cat.sql(f"CREATE TABLE {{c}}.db.orders (id bigint, status string, amount double) USING iceberg "
            f"TBLPROPERTIES ('encryption.key-id'='{MASTER}')")
    cat.sql("INSERT INTO {c}.db.orders VALUES (1, 'paid', 10.0), (2, 'open', 20.0), (3, 'paid', 30.0)")
    return cat


MODEL = [(1, "paid", 10.0), (2, "open", 20.0), (3, "paid", 30.0)]


def _document(cat, name: str) -> dict:
    view = cat.icecrypt().load_view(("db", name))
    return view.document


def test_create_query_describe_and_list(views):
    cat = views
    cat.sql("CREATE VIEW {c}.db.paid COMMENT 'paid orders' AS "
            "SELECT id, amount * 2 AS doubled FROM {c}.db.orders WHERE status = 'paid'")
    assert cat.rows("SELECT * FROM {c}.db.paid") == [(i, a * 2) for i, s, a in MODEL if s == "paid"]
    # joined with its table, filtered, aggregated: a view is a query like any other
    assert cat.rows("SELECT sum(o.amount) FROM {c}.db.paid p JOIN {c}.db.orders o ON p.id = o.id") == [(40.0,)]
    assert [tuple(r) for r in cat.sql("SHOW VIEWS IN {c}.db")] == [("db", "paid", False)]
    described = {r[0]: r[1] for r in cat.sql("DESCRIBE EXTENDED {c}.db.paid")}
    assert described["id"] == "bigint" and described["doubled"] == "double"
    assert described["Comment"] == "paid orders" and described["Type"] == "VIEW"
    assert "WHERE status = 'paid'" in described["View Text"]
    created = cat.sql("SHOW CREATE TABLE {c}.db.paid")[0][0]
    assert created.startswith(f"CREATE VIEW {cat.name}.db.paid") and "COMMENT 'paid orders'" in created
    # Iceberg's view metadata: format 1, the SQL as the spark dialect's representation
    document = _document(cat, "paid")
    assert document["format-version"] == 1 and document["current-version-id"] == 1
    (version,) = document["versions"]
    assert version["representations"] == [{"type": "sql", "sql": described["View Text"], "dialect": "spark"}]
    assert version["summary"]["engine-name"] == "spark"
    assert [f["name"] for f in document["schemas"][0]["fields"]] == ["id", "doubled"]
    assert document["properties"]["comment"] == "paid orders"
    assert document["location"] == str(cat.warehouse / "db" / "paid")
    # the table's rows are the model's: the view read nothing else
    assert cat.rows("SELECT * FROM {c}.db.orders") == MODEL


def test_replace_alter_rename_drop(views):
    cat = views
    cat.sql("CREATE VIEW {c}.db.v1 AS SELECT id FROM {c}.db.orders")
    first = _document(cat, "v1")
    cat.sql("CREATE OR REPLACE VIEW {c}.db.v1 AS SELECT id, status FROM {c}.db.orders WHERE id > 1")
    assert cat.rows("SELECT * FROM {c}.db.v1") == [(i, s) for i, s, _ in MODEL if i > 1]
    second = _document(cat, "v1")
    # a new version of the same view: UUID kept, history kept
    assert second["view-uuid"] == first["view-uuid"] and second["current-version-id"] == 2
    assert [v["version-id"] for v in second["version-log"]] == [1, 2]
    cat.sql("ALTER VIEW {c}.db.v1 AS SELECT count(*) AS n FROM {c}.db.orders")
    assert cat.rows("SELECT * FROM {c}.db.v1") == [(3,)]
    cat.sql("ALTER VIEW {c}.db.v1 SET TBLPROPERTIES ('owner-team' = 'sales')")
    assert _document(cat, "v1")["properties"]["owner-team"] == "sales"
    assert cat.rows("SELECT * FROM {c}.db.v1") == [(3,)]
    cat.sql("ALTER VIEW {c}.db.v1 RENAME TO {c}.db.v2")
    assert cat.rows("SELECT * FROM {c}.db.v2") == [(3,)]
    assert "v1" not in {r[1] for r in cat.sql("SHOW VIEWS IN {c}.db")}
    cat.sql("CREATE VIEW IF NOT EXISTS {c}.db.v2 AS SELECT 1 AS one")  # kept as it is
    assert cat.rows("SELECT * FROM {c}.db.v2") == [(3,)]
    cat.sql("DROP VIEW {c}.db.v2")
    cat.sql("DROP VIEW IF EXISTS {c}.db.v2")
    with pytest.raises(Exception, match="TABLE_OR_VIEW_NOT_FOUND"):
        cat.sql("SELECT * FROM {c}.db.v2")


def test_names_resolve_where_the_view_was_made(views):
    cat = views
    cat.sql("USE {c}.db")
    try:
        cat.sql("CREATE VIEW counted AS SELECT status, count(*) AS n FROM orders GROUP BY status")
    finally:
        cat.sql("USE spark_catalog.default")
    assert cat.rows("SELECT * FROM {c}.db.counted") == [("open", 1), ("paid", 2)]
    version = _document(cat, "counted")["versions"][0]
    assert version["default-catalog"] == cat.name and version["default-namespace"] == ["db"]


def test_refusals(views, new_catalog, tmp_path):
    cat = views
    with pytest.raises(Exception, match="TABLE_OR_VIEW_ALREADY_EXISTS|already exists"):
        cat.sql("CREATE VIEW {c}.db.orders AS SELECT 1 AS one")  # a table has the name
    cat.sql("CREATE VIEW {c}.db.taken AS SELECT 1 AS one")
    with pytest.raises(Exception, match="TABLE_OR_VIEW_ALREADY_EXISTS|already exists"):
        cat.sql("CREATE VIEW {c}.db.taken AS SELECT 2 AS two")
    with pytest.raises(Exception, match="TABLE_OR_VIEW_ALREADY_EXISTS|already exists|name is taken"):
        cat.sql("CREATE TABLE {c}.db.taken (id bigint) USING iceberg")
    with pytest.raises(Exception, match="VIEW_ALREADY_EXISTS|taken"):
        cat.sql("ALTER VIEW {c}.db.taken RENAME TO {c}.db.orders")
    cat.sql("CREATE NAMESPACE {c}.holds_a_view")
    cat.sql("CREATE VIEW {c}.holds_a_view.v AS SELECT 1 AS one")
    with pytest.raises(Exception, match="not empty|NON_EMPTY|SCHEMA_NOT_EMPTY"):
        cat.sql("DROP NAMESPACE {c}.holds_a_view")
    assert cat.rows("SELECT * FROM {c}.holds_a_view.v") == [(1,)]
    assert cat.rows("SELECT * FROM {c}.db.taken") == [(1,)]
    # a type Iceberg has none for, and a column name Iceberg's list of names cannot hold
    with pytest.raises(Exception, match="view db.nothing column 'x': Spark type void has no Iceberg type"):
        cat.sql("CREATE VIEW {c}.db.nothing AS SELECT NULL AS x")
    with pytest.raises(Exception, match="view db.commas: a column of the view's query has a comma in its name"):
        cat.sql("CREATE VIEW {c}.db.commas AS SELECT 1 AS `a,b`")
    assert not {"nothing", "commas"} & {r[1] for r in cat.sql("SHOW VIEWS IN {c}.db")}
    # catalogs of type hadoop keep no views: creating one is refused, reading one finds none
    hadoop = new_catalog("hadoop")
    hadoop.sql("CREATE NAMESPACE {c}.db")
    with pytest.raises(Exception, match="views are kept by catalogs of type sql only"):
        hadoop.sql("CREATE VIEW {c}.db.v AS SELECT 1 AS one")
    assert hadoop.sql("SHOW VIEWS IN {c}.db") == []
    with pytest.raises(Exception, match="TABLE_OR_VIEW_NOT_FOUND"):
        hadoop.sql("SELECT * FROM {c}.db.v")


def test_a_view_changed_in_storage_is_refused(views):
    """Whoever writes the warehouse's storage cannot change what a view runs: the catalog
    recorded the document's SHA-256."""
    cat = views
    cat.sql("CREATE VIEW {c}.db.guarded AS SELECT id FROM {c}.db.orders WHERE status = 'open'")
    location = Path(cat.icecrypt().load_view(("db", "guarded")).metadata_location)
    document = json.loads(location.read_text())
    document["versions"][0]["representations"][0]["sql"] = f"SELECT id FROM {cat.name}.db.orders"
    location.write_text(json.dumps(document))
    with pytest.raises(Exception, match="view db.guarded.*not the file the catalog recorded"):
        cat.sql("SELECT * FROM {c}.db.guarded")
    location.write_text("{not json")
    with pytest.raises(Exception, match="not the file the catalog recorded"):
        cat.sql("SELECT * FROM {c}.db.guarded")
    location.unlink()
    with pytest.raises(Exception, match="view db.guarded: its metadata file .* cannot be read"):
        cat.sql("SELECT * FROM {c}.db.guarded")
    cat.sql("DROP VIEW {c}.db.guarded")  # dropping needs no document
    assert "guarded" not in {r[1] for r in cat.sql("SHOW VIEWS IN {c}.db")}

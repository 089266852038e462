"""Iceberg's ALTER TABLE SQL extensions on the SQL catalog (org.icecrypt.spark.SqlExtensionsParser
and the procedure ``alter_table``): partition evolution, write order and distribution,
identifier fields, branches and tags, as Iceberg's Spark DDL documentation writes them, on an
encrypted table; each one is one commit, read back through icecrypt's Python API, and a bad
one fails with one error and leaves the table as it was."""

from __future__ import annotations

import pytest
from conftest import MASTER, data_files, magic

pytestmark = pytest.mark.spark


@pytest.fixture()
def events(cat):
    name = f"db.ev_{len(cat.sql('SHOW TABLES IN {c}.db'))}"
    cat.sql(f"CREATE TABLE {{c}}.{name} (id bigint NOT NULL, category string, ts timestamp, data string) "
            f"USING iceberg TBLPROPERTIES ('encryption.key-id'='{MASTER}')")
    cat.sql(f"INSERT INTO {{c}}.{name} VALUES (1, 'a', TIMESTAMP '2026-01-01 10:00:00', 'x'), "
            "(2, 'b', TIMESTAMP '2026-01-02 11:00:00', 'y')")
    return name


def _spec(cat, name):
    return [(f.name, str(f.transform)) for f in cat.table(name).spec.fields]


def test_partition_evolution(cat, events):
    cat.sql(f"ALTER TABLE {{c}}.{events} ADD PARTITION FIELD bucket(16, id)")
    cat.sql(f"ALTER TABLE {{c}}.{events} ADD PARTITION FIELD truncate(4, data)")
    cat.sql(f"ALTER TABLE {{c}}.{events} ADD PARTITION FIELD years(ts)")
    cat.sql(f"ALTER TABLE {{c}}.{events} ADD PARTITION FIELD category AS shard")
    assert _spec(cat, events) == [("id_bucket_16", "bucket[16]"), ("data_trunc_4", "truncate[4]"),
                                  ("ts_year", "year"), ("shard", "identity")]
    cat.sql(f"ALTER TABLE {{c}}.{events} DROP PARTITION FIELD shard")  # by name
    cat.sql(f"ALTER TABLE {{c}}.{events} DROP PARTITION FIELD truncate(4, data)")  # by transform
    cat.sql(f"ALTER TABLE {{c}}.{events} REPLACE PARTITION FIELD ts_year WITH days(ts)")
    cat.sql(f"ALTER TABLE {{c}}.{events} REPLACE PARTITION FIELD bucket(16, id) WITH bucket(8, id) AS b8")
    assert _spec(cat, events) == [("ts_day", "day"), ("b8", "bucket[8]")]
    # Writes after the change use the new spec, rows are unchanged, files stay encrypted.
    cat.sql(f"INSERT INTO {{c}}.{events} VALUES (3, 'c', TIMESTAMP '2026-01-03 12:00:00', 'z')")
    assert cat.rows(f"SELECT id, category FROM {{c}}.{events}") == [(1, "a"), (2, "b"), (3, "c")]
    table = cat.table(events)
    assert sorted(r["id"] for r in table.scan().to_arrow().to_pylist()) == [1, 2, 3]
    newest = [f for f in table.inspect.table("data_files").to_pylist() if f["spec_id"] == table.spec.spec_id]
    assert len(newest) == 1 and newest[0]["record_count"] == 1
    assert {magic(p) for p in data_files(cat.warehouse) if p.suffix in (".parquet", ".avro")} <= {b"PARE", b"AGS1"}


def test_write_order_and_distribution(cat, events):
    cat.sql(f"ALTER TABLE {{c}}.{events} WRITE ORDERED BY category, id DESC NULLS FIRST")
    table = cat.table(events)
    order = table.metadata["sort-orders"][-1]
    assert table.metadata["default-sort-order-id"] == order["order-id"] != 0
    assert [(f["transform"], f["direction"], f["null-order"]) for f in order["fields"]] == [
        ("identity", "asc", "nulls-first"), ("identity", "desc", "nulls-first")]
    assert table.properties["write.distribution-mode"] == "range"
    cat.sql(f"ALTER TABLE {{c}}.{events} WRITE LOCALLY ORDERED BY days(ts)")
    table = cat.table(events)
    assert table.properties["write.distribution-mode"] == "range"  # locally: unchanged
    assert [f["transform"] for f in table.metadata["sort-orders"][-1]["fields"]] == ["day"]
    cat.sql(f"ALTER TABLE {{c}}.{events} WRITE DISTRIBUTED BY PARTITION LOCALLY ORDERED BY (category)")
    table = cat.table(events)
    assert table.properties["write.distribution-mode"] == "hash"
    cat.sql(f"ALTER TABLE {{c}}.{events} WRITE UNORDERED")
    table = cat.table(events)
    assert table.metadata["default-sort-order-id"] == 0 and table.properties["write.distribution-mode"] == "none"
    # Writes follow the new order: a sorted table records its order id in new files.
    cat.sql(f"ALTER TABLE {{c}}.{events} WRITE ORDERED BY id")
    cat.sql(f"INSERT INTO {{c}}.{events} VALUES (9, 'z', NULL, 'q')")
    assert cat.rows(f"SELECT id FROM {{c}}.{events}") == [(1,), (2,), (9,)]


def test_identifier_fields(cat, events):
    cat.sql(f"ALTER TABLE {{c}}.{events} SET IDENTIFIER FIELDS id")
    assert cat.table(events).schema.identifier_field_names() == {"id"}
    cat.sql(f"ALTER TABLE {{c}}.{events} DROP IDENTIFIER FIELDS id")
    assert cat.table(events).schema.identifier_field_names() == set()


def test_branches_and_tags(cat, events):
    first = cat.table(events).current_snapshot_id
    cat.sql(f"ALTER TABLE {{c}}.{events} CREATE BRANCH audit RETAIN 7 DAYS WITH SNAPSHOT RETENTION 2 SNAPSHOTS 3 DAYS")
    cat.sql(f"ALTER TABLE {{c}}.{events} CREATE TAG v1 AS OF VERSION {first} RETAIN 30 DAYS")
    cat.sql(f"ALTER TABLE {{c}}.{events} CREATE BRANCH IF NOT EXISTS audit")  # no error, no change
    refs = cat.table(events).metadata["refs"]
    assert refs["audit"] == {"snapshot-id": first, "type": "branch", "max-ref-age-ms": 7 * 86_400_000,
                             "min-snapshots-to-keep": 2, "max-snapshot-age-ms": 3 * 86_400_000}
    assert refs["v1"] == {"snapshot-id": first, "type": "tag", "max-ref-age-ms": 30 * 86_400_000}
    cat.sql(f"INSERT INTO {{c}}.{events}.branch_audit VALUES (5, 'e', NULL, 'w')")
    assert cat.rows(f"SELECT id FROM {{c}}.{events} VERSION AS OF 'audit'") == [(1,), (2,), (5,)]
    assert cat.rows(f"SELECT id FROM {{c}}.{events} VERSION AS OF 'v1'") == [(1,), (2,)]
    cat.sql(f"INSERT INTO {{c}}.{events} VALUES (3, 'c', NULL, 'z')")
    head = cat.table(events).current_snapshot_id
    cat.sql(f"ALTER TABLE {{c}}.{events} REPLACE TAG v1 AS OF VERSION {head}")
    cat.sql(f"ALTER TABLE {{c}}.{events} CREATE OR REPLACE BRANCH audit")  # to main's head
    cat.sql(f"ALTER TABLE {{c}}.{events} CREATE OR REPLACE TAG v2")
    refs = cat.table(events).metadata["refs"]
    assert refs["v1"]["snapshot-id"] == refs["audit"]["snapshot-id"] == refs["v2"]["snapshot-id"] == head
    assert refs["audit"]["min-snapshots-to-keep"] == 2  # retention kept by a replace
    cat.sql(f"ALTER TABLE {{c}}.{events} DROP TAG v1")
    cat.sql(f"ALTER TABLE {{c}}.{events} DROP BRANCH audit")
    cat.sql(f"ALTER TABLE {{c}}.{events} DROP BRANCH IF EXISTS audit")
    cat.sql(f"ALTER TABLE {{c}}.{events} DROP TAG IF EXISTS nothing")
    assert set(cat.table(events).metadata["refs"]) == {"main", "v2"}


def test_current_namespace_and_quoting(cat, events):
    """The table named as Spark names it: in the current catalog and namespace, in backquotes,
    with comments and a trailing semicolon; the procedure can also be called as it is."""
    table = events.split(".")[1]
    cat.spark.sql(f"USE {cat.name}.db")
    try:
        cat.sql(f"-- evolve\nALTER TABLE `{table}` /* by day */ ADD PARTITION FIELD days(ts);")
    finally:
        cat.spark.sql("USE spark_catalog.default")
    cat.sql(f"CALL {{c}}.system.alter_table(table => '{events}', clause => 'ADD PARTITION FIELD category')")
    assert _spec(cat, events) == [("ts_day", "day"), ("category", "identity")]


@pytest.mark.parametrize("clause, reason", [
    ("ADD PARTITION FIELD bucket(16, nope)", "nope"),
    ("ADD PARTITION FIELD unknown(id)", "unsupported partition transform"),
    ("ADD PARTITION FIELD days(category)", "does not apply"),
    ("DROP PARTITION FIELD days(ts)", "has no field"),
    ("DROP PARTITION FIELD not_a_field", "no partition field"),
    ("WRITE ORDERED BY nope", "nope"),
    ("WRITE ORDERED BY id UNORDERED", "more than one ordering"),
    ("WRITE DISTRIBUTED BY PARTITION DISTRIBUTED BY PARTITION", "more than one distribution"),
    ("SET IDENTIFIER FIELDS data", "data"),
    ("DROP IDENTIFIER FIELDS id", "not an identifier field"),
    ("CREATE TAG v9 AS OF VERSION 42", "42"),
    ("REPLACE BRANCH nope", "nope"),
    ("DROP BRANCH main", "main"),
    ("CREATE BRANCH b RETAIN 3 WEEKS", "DAYS, HOURS or MINUTES"),
    ("ADD PARTITION FIELD id extra", "unexpected"),
])
def test_bad_clauses_change_nothing(cat, events, clause, reason):
    before = cat.table(events).metadata_location
    files = data_files(cat.warehouse)
    with pytest.raises(Exception) as info:
        cat.sql(f"ALTER TABLE {{c}}.{events} {clause}")
    message = str(info.value)
    assert reason in message and events.split(".")[1] in message, message
    assert cat.table(events).metadata_location == before
    assert data_files(cat.warehouse) == files


def test_other_catalogs_and_statements_untouched(cat, events, sql_spark):
    """Spark's own ALTER TABLE statements still reach Spark, and the extension's statements on
    a table of another catalog get Spark's own parse error."""
    cat.sql(f"ALTER TABLE {{c}}.{events} SET TBLPROPERTIES ('team'='ops')")
    assert cat.table(events).properties["team"] == "ops"
    with pytest.raises(Exception, match="PARSE_SYNTAX_ERROR|Syntax error"):
        sql_spark.sql("ALTER TABLE spark_catalog.default.t ADD PARTITION FIELD days(ts)")

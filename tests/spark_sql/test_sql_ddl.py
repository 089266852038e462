"""The SQL catalog's DDL: namespaces, CREATE TABLE (transforms, properties, encryption),
DESCRIBE / SHOW, ALTER TABLE (properties and columns), DROP, on the sql and hadoop
catalog types; bad statements fail with one clear error and change nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import MASTER, data_files
from pyspark.errors import AnalysisException
from pyiceberg.types import DoubleType, LongType, StringType

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module", params=["sql", "hadoop"])
def kinds(request, new_catalog):
    catalog = new_catalog(request.param)
    catalog.sql("CREATE NAMESPACE {c}.db")
    return catalog


def _error(catalog, statement: str) -> str:
    with pytest.raises(Exception) as info:
        catalog.sql(statement)
    return str(info.value)


def test_namespaces(new_catalog):
    for kind in ("sql", "hadoop"):
        catalog = new_catalog(kind)
        catalog.sql("CREATE NAMESPACE {c}.a")
        catalog.sql("CREATE NAMESPACE {c}.b")
        catalog.sql("CREATE NAMESPACE {c}.a.inner")
        assert catalog.rows("SHOW NAMESPACES IN {c}") == [("a",), ("b",)]
        assert catalog.rows("SHOW NAMESPACES IN {c}.a") == [("a.inner",)]
        with pytest.raises(AnalysisException, match="already exists|SCHEMA_ALREADY_EXISTS"):
            catalog.sql("CREATE NAMESPACE {c}.a")
        catalog.sql("CREATE NAMESPACE IF NOT EXISTS {c}.a")
        catalog.sql("CREATE TABLE {c}.b.t (id int) USING iceberg")
        with pytest.raises(AnalysisException, match="SCHEMA_NOT_EMPTY"):
            catalog.sql("DROP NAMESPACE {c}.b")
        catalog.sql("DROP NAMESPACE {c}.b CASCADE")
        assert catalog.rows("SHOW NAMESPACES IN {c}") == [("a",)]
        with pytest.raises(AnalysisException, match="SCHEMA_NOT_FOUND|not found|cannot be found"):
            catalog.sql("SHOW TABLES IN {c}.missing")


def test_namespace_properties(new_catalog):
    """CREATE NAMESPACE ... COMMENT / LOCATION / WITH PROPERTIES keeps them, DESCRIBE shows
    them, ALTER NAMESPACE sets and unsets them (a hadoop catalog keeps none: refused)."""
    catalog = new_catalog("sql")
    catalog.sql("CREATE NAMESPACE {c}.ns COMMENT 'the orders' WITH PROPERTIES ('team'='sales', 'tier'='1')")

    def described() -> dict:
        return {r[0]: r[1] for r in catalog.rows("DESCRIBE NAMESPACE EXTENDED {c}.ns")}

    shown = described()
    assert shown["Comment"] == "the orders" and "(team,sales)" in shown["Properties"], shown
    assert "(tier,1)" in shown["Properties"], shown
    catalog.sql("ALTER NAMESPACE {c}.ns SET PROPERTIES ('tier'='2', 'region'='eu')")
    catalog.sql("ALTER NAMESPACE {c}.ns UNSET PROPERTIES ('team')")
    shown = described()
    assert "(tier,2)" in shown["Properties"] and "(region,eu)" in shown["Properties"], shown
    assert "team" not in shown["Properties"], shown
    assert catalog.icecrypt().namespace_properties("ns") == {"comment": "the orders", "tier": "2",
                                                                   "region": "eu"}
    with pytest.raises(AnalysisException, match="SCHEMA_NOT_FOUND|not found|cannot be found"):
        catalog.sql("ALTER NAMESPACE {c}.missing SET PROPERTIES ('a'='b')")
    hadoop = new_catalog("hadoop")
    hadoop.sql("CREATE NAMESPACE {c}.ns")
    assert "keeps no namespace properties" in _error(hadoop, "ALTER NAMESPACE {c}.ns SET PROPERTIES ('a'='b')")


def test_create_table_transforms_and_properties(kinds):
    kinds.sql("CREATE TABLE {c}.db.parts (id bigint, n int, s string, d date, ts timestamp, tn timestamp_ntz, "
              "dec decimal(9,2), b binary) USING iceberg PARTITIONED BY (identity(n), bucket(8, id), truncate(3, s), "
              "years(d), months(ts), days(tn), hours(ts)) TBLPROPERTIES ('encryption.key-id'='master', "
              "'write.parquet.compression-codec'='snappy', 'custom'='x')")
    table = kinds.table("db.parts")
    assert [(f.name, str(f.transform)) for f in table.spec.fields] == [
        ("n", "identity"), ("id_bucket", "bucket[8]"), ("s_trunc", "truncate[3]"), ("d_year", "year"),
        ("ts_month", "month"), ("tn_day", "day"), ("ts_hour", "hour")]
    assert table.encrypted and table.properties["encryption.key-id"] == MASTER
    assert table.properties["custom"] == "x" and "provider" not in table.properties
    assert table.format_version == 3
    assert [type(f.field_type).__name__ for f in table.schema.fields] == [
        "LongType", "IntegerType", "StringType", "DateType", "TimestamptzType", "TimestampType", "DecimalType",
        "BinaryType"]
    described = {r[0]: r[1] for r in kinds.sql("DESCRIBE TABLE EXTENDED {c}.db.parts")}
    assert described["Part 1"] == "bucket(8, id)" and described["Part 6"] == "hours(ts)"
    assert "encryption.key-id=master" in described["Table Properties"]
    show = kinds.sql("SHOW CREATE TABLE {c}.db.parts")[0][0]
    assert "PARTITIONED BY (n, bucket(8, id), truncate(3, s), years(d), months(ts), days(tn), hours(ts))" in show
    properties = dict(kinds.rows("SHOW TBLPROPERTIES {c}.db.parts"))
    assert properties["format"] == "iceberg/parquet" and properties["format-version"] == "3"
    assert properties["current-snapshot-id"] == "none"


def test_plaintext_and_comment(kinds):
    kinds.sql("CREATE TABLE {c}.db.plain (id bigint NOT NULL COMMENT 'the id', v string) USING iceberg "
              "COMMENT 'a table'")
    table = kinds.table("db.plain")
    assert not table.encrypted and table.schema.fields[0].required and table.schema.fields[0].doc == "the id"
    assert table.properties.get("comment") == "a table"
    described = kinds.rows("DESCRIBE {c}.db.plain")
    assert ("id", "bigint", "the id") in described


def test_ctas_roundtrip_of_show_create(kinds):
    kinds.sql("CREATE TABLE {c}.db.shown (id int, s string) USING iceberg PARTITIONED BY (bucket(2, id)) "
              "TBLPROPERTIES ('encryption.key-id'='master')")
    where = kinds.table("db.shown").location
    statement = kinds.sql("SHOW CREATE TABLE {c}.db.shown")[0][0]
    kinds.sql("DROP TABLE {c}.db.shown")
    kinds.spark.sql(statement.replace("LOCATION", "-- LOCATION") if kinds.options["type"] == "hadoop" else statement)
    assert kinds.table("db.shown").encrypted
    # the location shown (file:/..., as Spark writes it) is the same directory, not a relative path
    assert kinds.table("db.shown").fs_path(kinds.table("db.shown").location) == kinds.table("db.shown").fs_path(where)
    assert not (Path.cwd() / "file:").exists()


def test_alter_table_columns(kinds):
    kinds.sql("CREATE TABLE {c}.db.evolve (id int, x float, st struct<a:int>, keep string) USING iceberg "
              "TBLPROPERTIES ('encryption.key-id'='master')")
    kinds.sql("INSERT INTO {c}.db.evolve VALUES (1, 1.5, named_struct('a', 7), 'k')")
    kinds.sql("ALTER TABLE {c}.db.evolve ADD COLUMN added string COMMENT 'new' AFTER id")
    kinds.sql("ALTER TABLE {c}.db.evolve ADD COLUMNS (st.b string, first_col bigint FIRST)")
    kinds.sql("ALTER TABLE {c}.db.evolve RENAME COLUMN keep TO kept")
    kinds.sql("ALTER TABLE {c}.db.evolve ALTER COLUMN id TYPE bigint")
    kinds.sql("ALTER TABLE {c}.db.evolve ALTER COLUMN x TYPE double")
    kinds.sql("ALTER TABLE {c}.db.evolve ALTER COLUMN kept COMMENT 'kept column'")
    kinds.sql("ALTER TABLE {c}.db.evolve ALTER COLUMN kept AFTER first_col")
    kinds.sql("ALTER TABLE {c}.db.evolve DROP COLUMN added")
    table = kinds.table("db.evolve")
    assert [f.name for f in table.schema.fields] == ["first_col", "kept", "id", "x", "st"]
    assert table.schema.find_field("id").field_type == LongType()
    assert table.schema.find_field("x").field_type == DoubleType()
    assert table.schema.find_field("st.b").field_type == StringType()
    assert table.schema.find_field("kept").doc == "kept column"
    # the row written before: read by field id through every change
    assert kinds.rows("SELECT first_col, kept, id, x, st.a, st.b FROM {c}.db.evolve") == [(None, "k", 1, 1.5, 7, None)]
    assert table.scan().to_arrow().to_pylist() == [
        {"first_col": None, "kept": "k", "id": 1, "x": 1.5, "st": {"a": 7, "b": None}}]


def test_alter_table_properties(kinds):
    kinds.sql("CREATE TABLE {c}.db.props (id int) USING iceberg TBLPROPERTIES ('encryption.key-id'='master')")
    kinds.sql("ALTER TABLE {c}.db.props SET TBLPROPERTIES ('a'='1', 'b'='2')")
    kinds.sql("ALTER TABLE {c}.db.props UNSET TBLPROPERTIES ('a')")
    properties = kinds.table("db.props").properties
    assert properties.get("b") == "2" and "a" not in properties
    before = kinds.table("db.props").metadata_location
    for statement, reason in [
        ("ALTER TABLE {c}.db.props SET TBLPROPERTIES ('encryption.key-id'='other')", "encryption property"),
        ("ALTER TABLE {c}.db.props UNSET TBLPROPERTIES ('encryption.key-id')", "encryption property"),
        ("ALTER TABLE {c}.db.props SET TBLPROPERTIES ('format-version'='2')", "format-version"),
        ("ALTER TABLE {c}.db.props SET TBLPROPERTIES ('sort-order'='id')", "reserved"),
        ("ALTER TABLE {c}.db.props SET LOCATION '/elsewhere'", "LOCATION"),
    ]:
        message = _error(kinds, statement)
        assert reason in message and "db.props" in message, message
        assert kinds.table("db.props").metadata_location == before  # nothing committed


def test_drop_a_column_only_an_older_spec_uses(new_catalog):
    """As in Iceberg: the older spec's files stay readable and writable by every statement,
    and the metadata tables leave the dropped source's field out."""
    cat = new_catalog("sql")
    cat.sql("CREATE NAMESPACE {c}.db")
    cat.sql("CREATE TABLE {c}.db.ds (id bigint, day date, v string) USING iceberg PARTITIONED BY (day) "
            f"TBLPROPERTIES ('encryption.key-id'='{MASTER}')")
    cat.sql("INSERT INTO {c}.db.ds VALUES (1, DATE'2024-01-02', 'x'), (2, DATE'2024-01-03', 'y')")
    assert "source of partition field" in _error(cat, "ALTER TABLE {c}.db.ds DROP COLUMN day")
    cat.sql("ALTER TABLE {c}.db.ds REPLACE PARTITION FIELD day WITH bucket(2, id)")
    cat.sql("ALTER TABLE {c}.db.ds DROP COLUMN day")
    cat.sql("INSERT INTO {c}.db.ds VALUES (3, 'z')")
    assert cat.rows("SELECT * FROM {c}.db.ds") == [(1, "x"), (2, "y"), (3, "z")]
    assert cat.rows("SELECT id, _partition.id_bucket_2, _spec_id FROM {c}.db.ds") == [(1, None, 0), (2, None, 0), (3, 1, 1)]
    assert cat.rows("SELECT partition.id_bucket_2, spec_id, record_count FROM {c}.db.ds.partitions") == [
        (None, 0, 2), (1, 1, 1)]
    cat.sql("DELETE FROM {c}.db.ds WHERE id = 1")
    cat.sql("UPDATE {c}.db.ds SET v = 'w' WHERE id = 2")
    cat.sql("MERGE INTO {c}.db.ds t USING (SELECT 3 AS id, 'q' AS v) s ON t.id = s.id WHEN MATCHED THEN UPDATE SET v = s.v")
    assert cat.rows("SELECT * FROM {c}.db.ds") == [(2, "w"), (3, "q")]
    cat.sql("CALL {c}.system.rewrite_data_files(table => 'db.ds', options => map('rewrite-all', 'true'))")
    assert cat.rows("SELECT * FROM {c}.db.ds") == [(2, "w"), (3, "q")]
    assert cat.rows("SELECT DISTINCT spec_id FROM {c}.db.ds.files") == [(1,)]
    assert cat.table("db.ds").verify().ok


def test_alter_table_refused_changes_change_nothing(kinds):
    kinds.sql("CREATE TABLE {c}.db.strict (id bigint, part string, v string) USING iceberg PARTITIONED BY (part)")
    before = kinds.table("db.strict").metadata_location
    for statement, reason in [
        ("ALTER TABLE {c}.db.strict DROP COLUMN part", "source of partition field"),
        ("ALTER TABLE {c}.db.strict ALTER COLUMN v TYPE int", "NOT_SUPPORTED_CHANGE_COLUMN"),
        ("ALTER TABLE {c}.db.strict ALTER COLUMN id TYPE int", "NOT_SUPPORTED_CHANGE_COLUMN"),
        ("ALTER TABLE {c}.db.strict ALTER COLUMN v SET NOT NULL", "non-nullable"),
        ("ALTER TABLE {c}.db.strict ADD COLUMN id string", "exists"),
        ("ALTER TABLE {c}.db.strict ADD COLUMN d struct<x: int> DEFAULT named_struct('x', 1)", "DEFAULT"),
        ("ALTER TABLE {c}.db.strict RENAME COLUMN missing TO other", "missing"),
    ]:
        message = _error(kinds, statement)
        assert reason in message, f"{statement}: {message}"
        assert kinds.table("db.strict").metadata_location == before


@pytest.mark.parametrize("vectorized", [True, False], ids=["batches", "rows"])
def test_column_defaults(cat, vectorized):
    """ADD COLUMN ... DEFAULT (Iceberg's initial and write default, format v3): the rows
    written before read the default, through Spark's reader (as batches and as rows) and
    through scan(); an INSERT that does not name the column writes it; SET DEFAULT changes
    what later writes get, never what older rows read; DROP DEFAULT removes it."""
    name = f"db.defaults_{'batches' if vectorized else 'rows'}"
    cat.sql(f"CREATE TABLE {{c}}.{name} (id bigint) USING iceberg TBLPROPERTIES ('encryption.key-id'='master')")
    cat.sql(f"INSERT INTO {{c}}.{name} VALUES (1)")
    cat.sql(f"ALTER TABLE {{c}}.{name} ADD COLUMNS (n int DEFAULT 7, s string DEFAULT 'it''s', "
            "d date DEFAULT DATE '2026-05-01', amount decimal(9,2) DEFAULT 1.5, ts timestamp DEFAULT "
            "TIMESTAMP '2026-05-01 10:00:00+00:00')")
    fields = {f.name: f for f in cat.table(name).schema.fields}
    assert (fields["n"].initial_default, fields["n"].write_default) == (7, 7)
    cat.spark.conf.set("spark.sql.parquet.enableVectorizedReader", str(vectorized).lower())
    try:
        first = cat.sql(f"SELECT n, s, d, amount, ts FROM {{c}}.{name} WHERE id = 1")[0]
        assert (first.n, first.s, str(first.d), str(first.amount)) == (7, "it's", "2026-05-01", "1.50")
        assert first.ts == cat.sql("SELECT TIMESTAMP '2026-05-01 10:00:00+00:00' AS t")[0].t
        cat.sql(f"INSERT INTO {{c}}.{name} (id) VALUES (2)")
        cat.sql(f"ALTER TABLE {{c}}.{name} ALTER COLUMN n SET DEFAULT 8")
        cat.sql(f"INSERT INTO {{c}}.{name} (id) VALUES (3)")
        cat.sql(f"ALTER TABLE {{c}}.{name} ALTER COLUMN n DROP DEFAULT")
        cat.sql(f"INSERT INTO {{c}}.{name} (id) VALUES (4)")
        assert cat.rows(f"SELECT id, n, s FROM {{c}}.{name}") == [(1, 7, "it's"), (2, 7, "it's"), (3, 8, "it's"),
                                                                  (4, None, "it's")]
    finally:
        cat.spark.conf.unset("spark.sql.parquet.enableVectorizedReader")
    scanned = sorted((r["id"], r["n"], r["s"]) for r in cat.table(name).scan().to_arrow().to_pylist())
    assert scanned == [(1, 7, "it's"), (2, 7, "it's"), (3, 8, "it's"), (4, None, "it's")]
    field = {f.name: f for f in cat.table(name).schema.fields}["n"]
    assert (field.initial_default, field.write_default) == (7, None)
    described = {r[0]: r[1] for r in cat.sql(f"DESCRIBE TABLE EXTENDED {{c}}.{name}")}
    assert "s" in described


def test_create_table_with_column_defaults(cat):
    cat.sql("CREATE TABLE {c}.db.created_defaults (id bigint, status string DEFAULT 'new', tries int DEFAULT 0) "
            "USING iceberg TBLPROPERTIES ('encryption.key-id'='master')")
    fields = {f.name: f for f in cat.table("db.created_defaults").schema.fields}
    assert (fields["status"].write_default, fields["status"].initial_default) == ("new", None)
    assert fields["tries"].write_default == 0
    cat.sql("INSERT INTO {c}.db.created_defaults (id) VALUES (1)")
    cat.sql("INSERT INTO {c}.db.created_defaults VALUES (2, 'done', 3)")
    assert cat.rows("SELECT * FROM {c}.db.created_defaults") == [(1, "new", 0), (2, "done", 3)]
    with pytest.raises(Exception, match="does not support generated columns"):
        cat.sql("CREATE TABLE {c}.db.generated (id bigint, twice bigint GENERATED ALWAYS AS (id * 2)) USING iceberg")


def test_bad_create_statements_leave_nothing(kinds):
    existing = data_files(kinds.warehouse)
    for statement, reason in [
        ("CREATE TABLE {c}.db.bad (id int) USING iceberg PARTITIONED BY (foo(id))", "unsupported partition transform"),
        ("CREATE TABLE {c}.db.bad (s string) USING iceberg PARTITIONED BY (years(s))", "does not apply"),
        ("CREATE TABLE {c}.db.bad (id int) USING iceberg PARTITIONED BY (bucket(0, id))", "positive integer"),
        ("CREATE TABLE {c}.db.bad (id int) USING iceberg TBLPROPERTIES ('encryption.kid'='master')",
         "unknown encryption property"),
        ("CREATE TABLE {c}.db.bad (id int) USING iceberg TBLPROPERTIES ('format-version'='2')", "format-version 3"),
        ("CREATE TABLE {c}.db.bad (id int) USING avro", "USING avro"),
        ("CREATE TABLE {c}.db.bad (id int) USING iceberg TBLPROPERTIES ('encryption.key-id'='nokey')", "nokey"),
        ("CREATE TABLE {c}.db.bad (i interval day) USING iceberg", "interval"),
        ("CREATE TABLE {c}.missing.bad (id int) USING iceberg", ""),
    ]:
        message = _error(kinds, statement)
        assert reason.lower() in message.lower(), f"{statement}: {message}"
    if kinds.options["type"] == "sql":
        with pytest.raises(AnalysisException, match="TABLE_OR_VIEW_NOT_FOUND"):
            kinds.sql("SELECT * FROM {c}.db.bad")
    assert data_files(kinds.warehouse) == existing


def test_drop_and_purge(kinds):
    kinds.sql("CREATE TABLE {c}.db.dropped (id int) USING iceberg TBLPROPERTIES ('encryption.key-id'='master')")
    kinds.sql("INSERT INTO {c}.db.dropped VALUES (1), (2)")
    location = kinds.table("db.dropped").location
    kinds.sql("DROP TABLE {c}.db.dropped PURGE")
    assert not any(p.suffix == ".parquet" for p in data_files(kinds.warehouse) if str(p).startswith(location))
    with pytest.raises(AnalysisException, match="TABLE_OR_VIEW_NOT_FOUND"):
        kinds.sql("SELECT * FROM {c}.db.dropped")
    kinds.sql("DROP TABLE IF EXISTS {c}.db.dropped")


def test_rename(kinds):
    kinds.sql("CREATE TABLE {c}.db.named (id int) USING iceberg TBLPROPERTIES ('encryption.key-id'='master')")
    kinds.sql("INSERT INTO {c}.db.named VALUES (1)")
    if kinds.options["type"] == "hadoop":  # a path table's location is its name (as Iceberg's Hadoop catalog)
        assert "cannot rename" in _error(kinds, "ALTER TABLE {c}.db.named RENAME TO {c}.db.renamed")
        assert kinds.rows("SELECT * FROM {c}.db.named") == [(1,)]
        return
    kinds.sql("ALTER TABLE {c}.db.named RENAME TO {c}.db.renamed")
    assert kinds.rows("SELECT * FROM {c}.db.renamed") == [(1,)]
    kinds.sql("INSERT INTO {c}.db.renamed VALUES (2)")
    assert kinds.rows("SELECT * FROM {c}.db.renamed") == [(1,), (2,)]
    with pytest.raises(AnalysisException, match="TABLE_OR_VIEW_NOT_FOUND"):
        kinds.sql("SELECT * FROM {c}.db.named")
    kinds.sql("CREATE TABLE {c}.db.other (id int) USING iceberg")
    with pytest.raises(AnalysisException, match="already exists|TABLE_OR_VIEW_ALREADY_EXISTS"):
        kinds.sql("ALTER TABLE {c}.db.renamed RENAME TO {c}.db.other")


def test_unknown_catalog_type(new_catalog):
    catalog = new_catalog("nosuch")
    with pytest.raises(Exception, match="unknown type 'nosuch'"):
        catalog.sql("SHOW NAMESPACES IN {c}")


def test_functions(cat):
    """Iceberg's transforms as the catalog's functions (what Spark clusters writes by)."""
    rows = cat.rows("SELECT {c}.system.bucket(16, 34), {c}.system.bucket(16, 'iceberg'), "
                    "{c}.system.truncate(10, -1), {c}.system.years(DATE '2017-11-16'), "
                    "{c}.system.months(TIMESTAMP '2017-11-16 22:31:08'), {c}.system.days(DATE '2017-11-16'), "
                    "{c}.system.hours(TIMESTAMP '2017-11-16 22:31:08')")
    import datetime

    # the spec's hashes: 34 -> 2017239379, "iceberg" -> 1210000089
    assert rows == [(2017239379 % 16, 1210000089 % 16, -10, 47, 574, datetime.date(2017, 11, 16), 419686)]


def test_iceberg_version(cat):
    """Iceberg's system.iceberg_version(): the catalog's runtime, icecrypt, and its version
    (the jar's, which must be the package's: a stale jar would answer with another)."""
    import icecrypt

    want = f"icecrypt {icecrypt.__version__}"
    assert cat.rows("SELECT {c}.system.iceberg_version()") == [(want,)]
    assert cat.rows("SELECT {c}.iceberg_version()") == [(want,)]
    with pytest.raises(Exception, match="iceberg_version takes no arguments"):
        cat.rows("SELECT {c}.system.iceberg_version(1)")


@pytest.mark.servers
@pytest.mark.filterwarnings("ignore::icecrypt.errors.InsecureTransportWarning")  # moto speaks plain HTTP
def test_glue_catalog(new_catalog, moto_server, tmp_path, aws_key_ids):
    """type glue: moto's Glue holds the tables, AWS KMS (moto's) the master key; the
    warehouse is local (the SQL catalog reads and writes local tables)."""
    catalog = new_catalog("glue", warehouse=tmp_path, **{
        "glue.endpoint": moto_server.endpoint, "glue.region": moto_server.region,
        "glue.access-key-id": moto_server.access_key_id, "glue.secret-access-key": moto_server.secret_access_key,
        **moto_server.kms_properties()})
    database = f"db{tmp_path.name[-6:].replace('-', '')}".lower()
    catalog.sql(f"CREATE NAMESPACE {{c}}.{database}")
    catalog.sql(f"CREATE TABLE {{c}}.{database}.t (id bigint, cat string) USING iceberg PARTITIONED BY (cat) "
                f"TBLPROPERTIES ('encryption.key-id'='{aws_key_ids['a']}')")
    catalog.sql(f"INSERT INTO {{c}}.{database}.t VALUES (1, 'a'), (2, 'b')")
    catalog.sql(f"INSERT OVERWRITE {{c}}.{database}.t PARTITION (cat = 'a') SELECT 3")
    assert catalog.rows(f"SELECT * FROM {{c}}.{database}.t") == [(2, "b"), (3, "a")]
    assert catalog.rows(f"SHOW TABLES IN {{c}}.{database}") == [(database, "t", False)]
    table = catalog.table(f"{database}.t")
    assert table.encrypted and table.scan().to_arrow().num_rows == 2
    glue = moto_server.boto3_client("glue").get_table(DatabaseName=database, Name="t")["Table"]
    assert glue["Parameters"]["table_type"].upper() == "ICEBERG"
    catalog.sql(f"DROP TABLE {{c}}.{database}.t")
    assert catalog.rows(f"SHOW TABLES IN {{c}}.{database}") == []

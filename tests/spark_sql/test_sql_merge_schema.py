"""Schema evolution on write, as Iceberg's Spark runtime does it: a table with
``write.spark.accept-any-schema=true`` takes writes whose columns are in another order or
a subset of its own (matched by name; missing optional columns are null), and with the
write option ``mergeSchema`` the columns it lacks are added first (Iceberg's
``unionByNameWith``); what cannot be written is refused, naming the column, with the table
as it was."""

from __future__ import annotations

import decimal

import pytest
from pyiceberg.types import DecimalType, DoubleType, LongType

pytestmark = pytest.mark.spark


@pytest.fixture(params=["encrypted", "plaintext"])
def evolving(cat, request):
    name = f"db.evolve_{request.param}_{id(request)}"
    key = ", 'encryption.key-id'='master'" if request.param == "encrypted" else ""
    cat.sql(f"CREATE TABLE {{c}}.{name} (id bigint NOT NULL, data string) USING iceberg PARTITIONED BY (bucket(2, id)) "
            f"TBLPROPERTIES ('write.spark.accept-any-schema'='true'{key})")
    # by position (VALUES names its columns col1, col2): Spark does not cast for a table that
    # accepts any schema, so the literals have the columns' types
    cat.sql(f"INSERT INTO {{c}}.{name} VALUES (1L, 'a')")
    return name


def test_merge_schema_adds_columns(cat, evolving):
    frame = cat.spark.createDataFrame([(2, "b", 2.5, "x")], "id bigint NOT NULL, data string, price double, tag string")
    frame.select("tag", "id", "price", "data").writeTo(f"{cat.name}.{evolving}").option("mergeSchema", "true").append()
    table = cat.table(evolving)
    assert [f.name for f in table.schema.fields] == ["id", "data", "tag", "price"]
    assert cat.rows(f"SELECT id, data, price, tag FROM {{c}}.{evolving}") == [(1, "a", None, None), (2, "b", 2.5, "x")]
    got = table.scan().to_arrow().to_pylist()
    assert sorted((r["id"], r["data"], r["price"], r["tag"]) for r in got) == [(1, "a", None, None), (2, "b", 2.5, "x")]
    # the same columns again: no schema change, one more snapshot
    schemas = len(table.metadata["schemas"])
    frame.writeTo(f"{cat.name}.{evolving}").option("mergeSchema", "true").append()
    assert len(cat.table(evolving).metadata["schemas"]) == schemas
    assert cat.rows(f"SELECT count(*) FROM {{c}}.{evolving}") == [(3,)]


def test_insert_values_by_position(cat, evolving):
    cat.sql(f"INSERT INTO {{c}}.{evolving} VALUES (5L, 'e'), (6L, NULL)")
    assert cat.rows(f"SELECT * FROM {{c}}.{evolving}") == [(1, "a"), (5, "e"), (6, None)]
    with pytest.raises(Exception) as info:
        cat.sql(f"INSERT INTO {{c}}.{evolving} VALUES ('7', 'g')")
    assert "the write's column 'id' is string, the table's is long" in str(info.value)
    with pytest.raises(Exception) as info:
        cat.sql(f"INSERT INTO {{c}}.{evolving} VALUES (7L)")
    assert "by position it has 1 columns, the table 2" in str(info.value)


def test_promoted_types_are_written_as_they_come(cat):
    """Iceberg's Spark writes take, for a table that accepts any schema, a column of a type
    the table's promotes from (int -> long, float -> double, a narrower decimal of the
    same scale): the file holds the write's type under the column's id, and every reader
    promotes it, as it does files written before an ALTER COLUMN ... TYPE."""
    from icecrypt.parquet import open_file

    cat.sql("CREATE TABLE {c}.db.promoted (id bigint NOT NULL, price double, amount decimal(12, 2)) USING iceberg "
            "PARTITIONED BY (id, truncate(10, amount)) "
            "TBLPROPERTIES ('write.spark.accept-any-schema'='true', 'encryption.key-id'='master')")
    cat.sql("INSERT INTO {c}.db.promoted VALUES (1L, 1.5D, CAST(10.25 AS DECIMAL(12, 2)))")
    cat.sql("INSERT INTO {c}.db.promoted VALUES (7, CAST(2.5 AS FLOAT), CAST(3.75 AS DECIMAL(5, 2)))")  # by position
    frame = cat.spark.createDataFrame([(2.25, 9, decimal.Decimal("-4"))], "price float, id int NOT NULL, amount decimal(3, 2)")
    frame.writeTo(f"{cat.name}.db.promoted").append()  # by name
    want = [(1, 1.5, decimal.Decimal("10.25")), (7, 2.5, decimal.Decimal("3.75")), (9, 2.25, decimal.Decimal("-4.00"))]
    assert cat.rows("SELECT id, price, amount FROM {c}.db.promoted") == want
    assert cat.rows("SELECT id FROM {c}.db.promoted WHERE id = 7 AND price > 2") == [(7,)]
    table = cat.table("db.promoted")
    got = table.scan().to_arrow().sort_by("id").to_pylist()
    assert [(r["id"], r["price"], r["amount"]) for r in got] == want
    assert [f.field_type for f in table.schema.fields] == [LongType(), DoubleType(), DecimalType(12, 2)]
    # the files of the promoting writes hold the write's types; their bounds read back
    kinds = set()
    for task in table.scan(row_filter="id = 7").plan_files():
        with open_file(task.file.fs_path, task.file.key(), filesystem=table.filesystem) as opened:
            kinds.add(tuple(str(f.type) for f in opened.metadata.schema.to_arrow_schema()))
    assert kinds == {("int32", "float", "decimal128(5, 2)")}
    assert table.scan(row_filter="id = 8").to_arrow().num_rows == 0
    assert table.verify().ok
    files = cat.spark.table(f"{cat.name}.db.promoted.files").select("readable_metrics").collect()
    assert len(files) == 3 and all(r.readable_metrics.id.lower_bound in (1, 7, 9) for r in files)


def test_subset_and_order_without_merge(cat, evolving):
    cat.spark.createDataFrame([("c", 3)], "data string, id bigint NOT NULL").writeTo(f"{cat.name}.{evolving}").append()
    cat.spark.createDataFrame([(4,)], "id bigint NOT NULL").writeTo(f"{cat.name}.{evolving}").append()
    assert cat.rows(f"SELECT * FROM {{c}}.{evolving}") == [(1, "a"), (3, "c"), (4, None)]


@pytest.mark.parametrize("frame, options, reason", [
    ("id bigint NOT NULL, extra int", {}, "column 'extra' is not a column of the table"),
    ("id bigint NOT NULL, data int", {}, "column 'data' is integer, the table's is string"),
    ("id bigint, data string", {}, "column 'id' may be null; the table's is required"),
    ("data string", {}, "lacks the table's required column 'id'"),
    ("data string, added int", {"mergeSchema": "true"}, "lacks the table's required column 'id'"),
    ("id bigint NOT NULL, data int", {"mergeSchema": "true"}, "mergeSchema"),
])
def test_refusals_leave_the_table(cat, evolving, frame, options, reason):
    before = cat.table(evolving).metadata_location
    rows = [tuple(1 if "int" in c else "z" for c in frame.split(", "))]
    with pytest.raises(Exception) as info:
        cat.spark.createDataFrame(rows, frame).writeTo(f"{cat.name}.{evolving}").options(**options).append()
    assert reason in str(info.value) and evolving.split(".")[-1] in str(info.value)
    assert cat.table(evolving).metadata_location == before
    assert cat.rows(f"SELECT * FROM {{c}}.{evolving}") == [(1, "a")]


def test_a_table_without_the_property_keeps_spark_resolution(cat):
    cat.sql("CREATE TABLE {c}.db.strict (id bigint, data string) USING iceberg")
    with pytest.raises(Exception) as info:
        cat.spark.createDataFrame([(1, "a", 2)], "id bigint, data string, extra int").writeTo(
            f"{cat.name}.db.strict").option("mergeSchema", "true").append()
    assert "extra" in str(info.value) or "too many" in str(info.value).lower()


def test_merge_schema_keeps_the_wider_type(cat, evolving):
    """mergeSchema with a narrower column: the table keeps its type (a union never narrows),
    and the rows are written as they came."""
    frame = cat.spark.createDataFrame([(3, "c")], "id int NOT NULL, data string")
    frame.writeTo(f"{cat.name}.{evolving}").option("mergeSchema", "true").append()
    assert cat.rows(f"SELECT * FROM {{c}}.{evolving}") == [(1, "a"), (3, "c")]
    assert cat.table(evolving).schema.find_field("id").field_type == LongType()


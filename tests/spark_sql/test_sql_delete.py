"""``DELETE FROM`` through the SQL catalog, checked after every statement against a
plain-Python model of the rows, through SQL and through ``EncryptedTable.scan()``: whole
partitions, row-level conditions, every row; copy-on-write (Iceberg's default) and
merge-on-read as ``write.delete.mode`` says; encrypted and plaintext tables.  Every file a
delete leaves is encrypted; a condition with no Iceberg row filter form is Spark's
copy-on-write rewrite instead; a delete of a tag and a failing delete leave the table as it
was (no version, no file)."""

from __future__ import annotations

import pytest
from conftest import MASTER, magic

pytestmark = pytest.mark.spark


def _model_rows(model: dict[int, tuple]) -> list[tuple]:
    return sorted(model.values())


def _check(cat, name: str, model: dict[int, tuple]) -> None:
    want = _model_rows(model)
    assert cat.rows(f"SELECT id, cat, v FROM {{c}}.{name}") == want
    got = cat.table(name).scan().to_arrow().select(["id", "cat", "v"]).to_pylist()
    assert sorted((r["id"], r["cat"], r["v"]) for r in got) == want


@pytest.mark.parametrize("mode", ["copy-on-write", "merge-on-read"])
@pytest.mark.parametrize("encrypted", [True, False], ids=["encrypted", "plaintext"])
def test_delete_from_against_model(cat, encrypted, mode):
    name = f"db.del_{'enc' if encrypted else 'plain'}_{mode.replace('-', '_')}"
    key = f"'encryption.key-id'='{MASTER}', " if encrypted else ""
    cat.sql(f"CREATE TABLE {{c}}.{name} (id bigint, cat string, v double) USING iceberg PARTITIONED BY (cat) "
            f"TBLPROPERTIES ({key}'write.delete.mode'='{mode}')")
    model = {i: (i, "abc"[i % 3], i * 1.5) for i in range(60)}
    values = ", ".join(f"({i}, '{c}', {v})" for i, c, v in model.values())
    cat.sql(f"INSERT INTO {{c}}.{name} VALUES {values}")
    _check(cat, name, model)

    cat.sql(f"DELETE FROM {{c}}.{name} WHERE cat = 'a'")  # a whole partition: its files dropped
    model = {i: r for i, r in model.items() if r[1] != "a"}
    _check(cat, name, model)
    table = cat.table(name)
    assert table.current_snapshot().summary["operation"] == "delete"
    assert "added-delete-files" not in table.current_snapshot().summary

    cat.sql(f"DELETE FROM {{c}}.{name} WHERE (id BETWEEN 20 AND 29 OR id = 7) AND v > 10")  # rows inside files
    model = {i: r for i, r in model.items() if not ((20 <= i <= 29 or i == 7) and r[2] > 10)}
    _check(cat, name, model)
    summary = cat.table(name).current_snapshot().summary
    if mode == "merge-on-read":
        assert int(summary["added-delete-files"]) > 0
    else:
        assert summary["operation"] == "overwrite" and "added-delete-files" not in summary

    cat.sql(f"DELETE FROM {{c}}.{name} WHERE id IN (2, 5, 1000) OR cat IS NULL")
    model = {i: r for i, r in model.items() if i not in (2, 5)}
    _check(cat, name, model)

    before = cat.table(name).metadata_location
    cat.sql(f"DELETE FROM {{c}}.{name} WHERE id > 10000")  # nothing matches: nothing committed
    assert cat.table(name).metadata_location == before

    cat.sql(f"DELETE FROM {{c}}.{name}")
    _check(cat, name, {})
    root = cat.table(name).location.rstrip("/").removeprefix("file:")
    if encrypted:  # every file the table holds is sealed: data and delete files PARE/AGS1, metadata AGS1
        for path in _table_files(root):
            if path.name.endswith((".metadata.json", "version-hint.text")):
                continue
            assert magic(path) in (b"PARE", b"AGS1"), path


def _table_files(root: str):
    from pathlib import Path

    return [p for p in Path(root).rglob("*") if p.is_file()]


def test_delete_conditions_without_an_iceberg_form_rewrite_copy_on_write(cat):
    """A condition with no Iceberg row filter form (a function of a column, a subquery)
    cannot be handed to the driver's delete: Spark's copy-on-write rewrite
    (test_sql_rowlevel.py) deletes exactly its rows instead."""
    cat.sql("CREATE TABLE {c}.db.del_guard (id bigint, name string) USING iceberg "
            f"TBLPROPERTIES ('encryption.key-id'='{MASTER}')")
    cat.sql("INSERT INTO {c}.db.del_guard VALUES (1, 'a'), (2, 'bb'), (3, 'ccc'), (4, 'dddd')")
    rows = {1: "a", 2: "bb", 3: "ccc", 4: "dddd"}
    for condition, gone in [("length(name) = 2", 2), ("id IN (SELECT 3)", 3), ("upper(name) = 'A'", 1)]:
        cat.sql(f"DELETE FROM {{c}}.db.del_guard WHERE {condition}")
        del rows[gone]
        assert cat.rows("SELECT id, name FROM {c}.db.del_guard") == sorted(rows.items()), condition
    for path in _table_files(cat.table("db.del_guard").location.removeprefix("file:")):
        if not path.name.endswith((".metadata.json", "version-hint.text")):
            assert magic(path) in (b"PARE", b"AGS1"), path


def test_delete_from_a_tag_or_snapshot_is_refused(cat):
    cat.sql("CREATE TABLE {c}.db.del_tag (id bigint) USING iceberg "
            f"TBLPROPERTIES ('encryption.key-id'='{MASTER}')")
    cat.sql("INSERT INTO {c}.db.del_tag VALUES (1), (2)")
    table = cat.table("db.del_tag")
    with table.manage_snapshots() as manage:
        manage.create_tag("t1", table.current_snapshot_id)
    before = cat.table("db.del_tag").metadata_location
    with pytest.raises(Exception):
        cat.sql("DELETE FROM {c}.db.del_tag.tag_t1 WHERE id = 1")
    assert cat.table("db.del_tag").metadata_location == before
    assert cat.rows("SELECT id FROM {c}.db.del_tag") == [(1,), (2,)]


def test_delete_from_a_branch(cat):
    cat.sql("CREATE TABLE {c}.db.del_branch (id bigint) USING iceberg "
            f"TBLPROPERTIES ('encryption.key-id'='{MASTER}')")
    cat.sql("INSERT INTO {c}.db.del_branch VALUES (1), (2), (3)")
    table = cat.table("db.del_branch")
    with table.manage_snapshots() as manage:
        manage.create_branch("dev", table.current_snapshot_id)
    cat.sql("DELETE FROM {c}.db.del_branch.branch_dev WHERE id = 2")
    assert cat.rows("SELECT id FROM {c}.db.del_branch.branch_dev") == [(1,), (3,)]
    assert cat.rows("SELECT id FROM {c}.db.del_branch") == [(1,), (2,), (3,)]


def test_delete_on_decimal_date_and_timestamp_conditions(cat):
    """Literals of every type Spark hands over (decimal(p,s), dates, timestamps, strings)
    take their Iceberg form: the statement deletes exactly the rows the condition names."""
    cat.sql("CREATE TABLE {c}.db.del_types (id bigint, amount decimal(10,2), d date, ts timestamp, s string) "
            f"USING iceberg PARTITIONED BY (days(ts)) TBLPROPERTIES ('encryption.key-id'='{MASTER}')")
    cat.sql("INSERT INTO {c}.db.del_types VALUES "
            "(1, 10.50, DATE '2024-01-01', TIMESTAMP '2024-01-01 10:00:00', 'a'), "
            "(2, 99.99, DATE '2024-01-02', TIMESTAMP '2024-01-02 11:00:00', 'b'), "
            "(3, 50.00, DATE '2024-01-03', TIMESTAMP '2024-01-03 12:00:00', 'c'), "
            "(4, 75.25, DATE '2024-01-04', TIMESTAMP '2024-01-04 13:00:00', 'dd')")
    cat.sql("DELETE FROM {c}.db.del_types WHERE amount < 50")
    assert cat.rows("SELECT id FROM {c}.db.del_types") == [(2,), (3,), (4,)]
    cat.sql("DELETE FROM {c}.db.del_types WHERE d = DATE '2024-01-02' OR ts >= TIMESTAMP '2024-01-04 00:00:00'")
    assert cat.rows("SELECT id FROM {c}.db.del_types") == [(3,)]
    cat.sql("DELETE FROM {c}.db.del_types WHERE s LIKE 'c%'")
    assert cat.rows("SELECT id FROM {c}.db.del_types") == []


def test_truncate_table(cat):
    cat.sql("CREATE TABLE {c}.db.del_truncate (id bigint, p string) USING iceberg PARTITIONED BY (p) "
            f"TBLPROPERTIES ('encryption.key-id'='{MASTER}')")
    cat.sql("INSERT INTO {c}.db.del_truncate VALUES (1, 'a'), (2, 'b')")
    cat.sql("TRUNCATE TABLE {c}.db.del_truncate")
    assert cat.rows("SELECT * FROM {c}.db.del_truncate") == []
    table = cat.table("db.del_truncate")
    assert table.current_snapshot().summary["operation"] == "delete" and table.scan().to_arrow().num_rows == 0

"""The changelog in SQL: Iceberg's ``db.t.changes`` table (its range by read options) and
the ``create_changelog_view`` procedure (carry-over rows removed, net changes, update
images), on encrypted and plaintext tables, against ``EncryptedTable.changelog_scan()``
and a plain-Python model of Iceberg's ``ChangelogIterator`` rules."""

from __future__ import annotations

import base64
import collections
import json

import pytest

pytestmark = pytest.mark.spark

CHANGE = ("_change_type", "_change_ordinal", "_commit_snapshot_id")
#: rows written as one data file (so that a copy-on-write change of one carries the other over)
ONE_FILE = "SELECT /*+ REPARTITION(1) */ * FROM"


@pytest.fixture(scope="module", params=["encrypted", "plaintext"])
def history(cat, request):
    """A table with five snapshots: two appends, a copy-on-write UPDATE (carry-over rows),
    a DELETE and an overwrite; its snapshot ids, oldest first."""
    name = f"db.log_{request.param}"
    key = ", 'encryption.key-id'='master'" if request.param == "encrypted" else ""
    cat.sql(f"CREATE TABLE {{c}}.{name} (id bigint NOT NULL, data string) USING iceberg "
            f"TBLPROPERTIES ('format-version'='3'{key})")
    cat.sql(f"INSERT INTO {{c}}.{name} {ONE_FILE} VALUES (1, 'a'), (2, 'b') AS v(id, data)")
    cat.sql(f"INSERT INTO {{c}}.{name} VALUES (3, 'c')")
    cat.sql(f"UPDATE {{c}}.{name} SET data = 'bb' WHERE id = 2")  # rewrites the first file: (1, 'a') carried over
    cat.sql(f"DELETE FROM {{c}}.{name} WHERE id = 3")
    cat.sql(f"INSERT INTO {{c}}.{name} VALUES (4, 'd'), (1, 'a')")  # (1, 'a') twice now
    table = cat.table(name)
    ids = [s.snapshot_id for s in table.snapshots()]
    assert len(ids) == 5
    return name, ids


def _python_changelog(table, **kwargs) -> list[tuple]:
    got = table.changelog_scan(**kwargs).to_arrow()
    return sorted(tuple(r.values()) for r in got.to_pylist())


def test_changes_table_equals_python_changelog(cat, history):
    name, ids = history
    got = cat.rows(f"SELECT id, data, _change_type, _change_ordinal, _commit_snapshot_id FROM {{c}}.{name}.changes")
    assert got == _python_changelog(cat.table(name))
    # the UPDATE's carry-over: (1, 'a') deleted and inserted by snapshot 2
    assert (1, "a", "DELETE", 2, ids[2]) in got and (1, "a", "INSERT", 2, ids[2]) in got
    assert [f.name for f in cat.spark.table(f"{cat.name}.{name}.changes").schema.fields] == ["id", "data", *CHANGE]


def test_no_key_in_the_changelogs_plans(cat, history):
    name, _ = history
    table = cat.table(name)
    if not table.encrypted:
        pytest.skip("a plaintext table has no keys")
    secrets = set()
    for change in table.changelog_scan().plan_changes():
        km = change.task.file.key()
        secrets |= {base64.b64encode(km.encryption_key).decode(), km.encryption_key.hex(),
                    base64.b64encode(km.aad_prefix).decode()}
    query = f"SELECT * FROM {cat.name}.{name}.changes WHERE id > 1"
    cat.sql(f"CALL {{c}}.system.create_changelog_view(table => '{name}', changelog_view => 'plan_view')")
    shown = [cat.spark.sql(query)._jdf.queryExecution().toString(),
             *(r[0] for r in cat.sql(f"EXPLAIN EXTENDED {query}")),
             *(r[0] for r in cat.sql(f"EXPLAIN FORMATTED {query}")),
             *(r[0] for r in cat.sql("EXPLAIN EXTENDED SELECT * FROM plan_view")),
             json.dumps([tuple(r) for r in cat.sql(f"DESCRIBE TABLE EXTENDED {{c}}.{name}.changes")])]
    assert secrets and len(cat.sql("SELECT * FROM plan_view")) > 0
    for text in shown:
        assert "icecrypt.secret" not in text or "redacted" in text.lower()
        assert not any(s in text for s in secrets)


def test_changes_range_options(cat, history):
    name, ids = history
    table = cat.table(name)
    reader = cat.spark.read.option("start-snapshot-id", str(ids[1])).option("end-snapshot-id", str(ids[3]))
    got = sorted(tuple(r) for r in reader.table(f"{cat.name}.{name}.changes").collect())
    assert got == _python_changelog(table, from_snapshot_id=ids[1], to_snapshot_id=ids[3])
    assert {r[4] for r in got} == {ids[2], ids[3]}
    from icecrypt.table.read.incremental import timestamp_range

    start = table.snapshot(ids[3]).timestamp_ms - 1
    got = cat.spark.read.option("start-timestamp", str(start)).table(f"{cat.name}.{name}.changes").collect()
    from_id, _, _ = timestamp_range(table, start, None)
    assert sorted(tuple(r) for r in got) == _python_changelog(table, from_snapshot_id=from_id)
    assert {r["_commit_snapshot_id"] for r in got} >= {ids[3], ids[4]}


def test_changes_filters_and_projection(cat, history):
    name, ids = history
    got = cat.rows(f"SELECT data, _change_ordinal FROM {{c}}.{name}.changes WHERE id = 2 AND _change_type = 'DELETE'")
    assert got == [("b", 2)]
    assert cat.rows(f"SELECT count(*) FROM {{c}}.{name}.changes WHERE _change_type = 'INSERT'") == [(7,)]


def test_changes_refusals_leave_the_table(cat, history):
    name, _ = history
    before = cat.table(name).metadata_location
    for statement, reason in [
        (f"INSERT INTO {{c}}.{name}.changes VALUES (9, 'z', 'INSERT', 0, 1)", "changes` does not support append"),
        (f"SELECT * FROM {{c}}.{name}.changes VERSION AS OF 1", "changelog"),
        (f"DELETE FROM {{c}}.{name}.changes WHERE id = 1", "changelog"),
    ]:
        with pytest.raises(Exception) as info:
            cat.sql(statement)
        assert reason in str(info.value), statement
    for options, reason in [({"snapshot-id": "1"}, "read option snapshot-id is not supported"),
                            ({"start-snapshot-id": "12345"}, "12345"),
                            ({"start-snapshot-id": "x"}, "start-snapshot-id")]:
        with pytest.raises(Exception) as info:
            cat.spark.read.options(**options).table(f"{cat.name}.{name}.changes").collect()
        assert reason in str(info.value), options
    assert cat.table(name).metadata_location == before


def test_changes_of_merge_on_read_deletes_are_refused(cat):
    cat.sql("CREATE TABLE {c}.db.log_mor (id bigint, data string) USING iceberg "
            "TBLPROPERTIES ('encryption.key-id'='master', 'write.delete.mode'='merge-on-read')")
    cat.sql(f"INSERT INTO {{c}}.db.log_mor {ONE_FILE} VALUES (1, 'a'), (2, 'b') AS v(id, data)")
    cat.sql("DELETE FROM {c}.db.log_mor WHERE data = 'a' OR id + 1 = 2")
    with pytest.raises(Exception) as info:
        cat.sql("SELECT * FROM {c}.db.log_mor.changes")
    assert "delete files" in str(info.value) and "log_mor" in str(info.value)


# --- create_changelog_view against a model of Iceberg's ChangelogIterator rules --------------


def _model(rows: list[tuple], *, net: bool = False, identifiers: tuple[int, ...] | None = None) -> list[tuple]:
    """Iceberg's rules on (id, data, type, ordinal, snapshot) rows, by streaming sorted
    groups as its iterators do."""
    if net:
        groups = collections.defaultdict(list)
        for r in rows:
            groups[r[:2]].append(r)
        out = []
        for group in groups.values():
            group.sort(key=lambda r: (r[3], r[2]))
            first, count = None, 0
            for r in group:
                if count == 0:
                    first, count = r, 1
                elif r[2] == first[2]:
                    count += 1
                else:
                    count -= 1
            out += [first] * count
        return sorted(out)
    counts = collections.Counter()
    for r in rows:
        counts[(r[0], r[1], r[3], r[4])] += 1 if r[2] == "INSERT" else -1
    kept = sorted((k[0], k[1], "INSERT" if n > 0 else "DELETE", k[2], k[3])
                  for k, n in counts.items() for _ in range(abs(n)))
    if identifiers is None:
        return kept
    by_key = collections.defaultdict(list)
    for r in kept:
        by_key[(tuple(r[i] for i in identifiers), r[3])].append(r)
    out = []
    for group in by_key.values():
        deletes = [r for r in group if r[2] == "DELETE"]
        inserts = [r for r in group if r[2] == "INSERT"]
        assert len(deletes) <= 1
        if deletes and inserts:
            out.append((*deletes[0][:2], "UPDATE_BEFORE", *deletes[0][3:]))
            out.append((*inserts[0][:2], "UPDATE_AFTER", *inserts[0][3:]))
            out += inserts[1:]
        else:
            out += group
    return sorted(out)


def test_changelog_view_removes_carryovers(cat, history):
    name, ids = history
    raw = cat.rows(f"SELECT * FROM {{c}}.{name}.changes")
    got = cat.sql(f"CALL {{c}}.system.create_changelog_view(table => '{name}')")
    view = f"`{name.split('.')[-1]}_changes`"
    assert [tuple(r) for r in got] == [(view,)]
    rows = cat.rows(f"SELECT * FROM {view}")
    assert rows == _model(raw)
    assert (1, "a", "DELETE", 2, ids[2]) not in rows  # the carry-over is gone
    assert (2, "b", "DELETE", 2, ids[2]) in rows and (2, "bb", "INSERT", 2, ids[2]) in rows


def test_changelog_view_net_changes(cat, history):
    name, ids = history
    raw = cat.rows(f"SELECT * FROM {{c}}.{name}.changes")
    cat.sql(f"CALL {{c}}.system.create_changelog_view(table => '{name}', changelog_view => 'net_view', "
            "net_changes => true)")
    rows = cat.rows("SELECT * FROM net_view")
    assert rows == _model(raw, net=True)
    assert not any(r[0] == 3 for r in rows)  # inserted, then deleted: no net change
    assert sorted(r[:3] for r in rows) == [(1, "a", "INSERT"), (1, "a", "INSERT"), (2, "bb", "INSERT"),
                                           (4, "d", "INSERT")]


def test_changelog_view_update_images(cat, history):
    name, ids = history
    options = f"map('start-snapshot-id', '{ids[1]}', 'end-snapshot-id', '{ids[2]}')"
    reader = cat.spark.read.option("start-snapshot-id", str(ids[1])).option("end-snapshot-id", str(ids[2]))
    raw = sorted(tuple(r) for r in reader.table(f"{cat.name}.{name}.changes").collect())
    cat.sql(f"CALL {{c}}.system.create_changelog_view(table => '{name}', options => {options}, "
            "identifier_columns => array('id'), changelog_view => 'updates')")
    rows = cat.rows("SELECT * FROM updates")
    assert rows == _model(raw, identifiers=(0,))
    assert rows == [(2, "b", "UPDATE_BEFORE", 0, ids[2]), (2, "bb", "UPDATE_AFTER", 0, ids[2])]


def test_changelog_view_uses_the_tables_identifier_fields(cat):
    cat.sql("CREATE TABLE {c}.db.log_ids (id bigint NOT NULL, data string) USING iceberg "
            "TBLPROPERTIES ('encryption.key-id'='master')")
    cat.sql("ALTER TABLE {c}.db.log_ids SET IDENTIFIER FIELDS id")
    cat.sql(f"INSERT INTO {{c}}.db.log_ids {ONE_FILE} VALUES (1, 'a'), (2, 'b') AS v(id, data)")
    cat.sql("MERGE INTO {c}.db.log_ids t USING (SELECT 1 AS id, 'z' AS data) s ON t.id = s.id "
            "WHEN MATCHED THEN UPDATE SET data = s.data")
    cat.sql("CALL {c}.system.create_changelog_view(table => 'db.log_ids', compute_updates => true)")
    rows = cat.rows("SELECT id, data, _change_type, _change_ordinal FROM log_ids_changes")
    assert rows == [(1, "a", "INSERT", 0), (1, "a", "UPDATE_BEFORE", 1), (1, "z", "UPDATE_AFTER", 1),
                    (2, "b", "INSERT", 0)]


def test_changelog_view_refusals(cat, history):
    name, _ = history
    for call, reason in [
        (f"table => '{name}', net_changes => true, compute_updates => true", "cannot be combined"),
        (f"table => '{name}', compute_updates => true", "no identifier columns"),
        (f"table => '{name}', identifier_columns => array('nope')", "'nope' is not a column"),
        (f"table => '{name}', options => map('branch', 'main')", "read option branch is not supported"),
        ("table => 'db.missing'", "missing"),
    ]:
        with pytest.raises(Exception) as info:
            cat.sql(f"CALL {{c}}.system.create_changelog_view({call})")
        assert reason in str(info.value), call
        assert "create_changelog_view" in str(info.value)


def test_changelog_view_duplicate_identifiers_fail_its_query(cat):
    cat.sql("CREATE TABLE {c}.db.log_dups (id bigint, data string) USING iceberg")
    cat.sql(f"INSERT INTO {{c}}.db.log_dups {ONE_FILE} VALUES (1, 'a'), (1, 'b') AS v(id, data)")
    cat.sql("DELETE FROM {c}.db.log_dups WHERE id = 1")
    cat.sql("CALL {c}.system.create_changelog_view(table => 'db.log_dups', identifier_columns => array('id'))")
    with pytest.raises(Exception) as info:
        cat.sql("SELECT * FROM log_dups_changes")
    assert "multiple rows with the same identifier fields ([id])" in str(info.value)


def test_changes_of_an_empty_table(cat):
    cat.sql("CREATE TABLE {c}.db.log_empty (id bigint, data string) USING iceberg "
            "TBLPROPERTIES ('encryption.key-id'='master')")
    assert cat.rows("SELECT * FROM {c}.db.log_empty.changes") == []
    described = [tuple(r)[:2] for r in cat.sql("DESCRIBE TABLE {c}.db.log_empty.changes")]
    assert described[:5] == [("id", "bigint"), ("data", "string"), ("_change_type", "string"),
                             ("_change_ordinal", "int"), ("_commit_snapshot_id", "bigint")]
    cat.sql("CALL {c}.system.create_changelog_view(table => 'db.log_empty')")
    assert cat.rows("SELECT * FROM log_empty_changes") == []

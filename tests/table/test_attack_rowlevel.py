"""Bad input to row-level changes, and storage an attacker altered: a clear error naming
what is wrong, nothing committed, no file left behind."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from test_rowlevel_model import SCHEMA, _props, _rows

from icecrypt.table import EncryptedTable

MODES = ("copy-on-write", "merge-on-read")


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


@pytest.fixture(params=MODES)
def table(request, tmp_path, kms):
    root = tmp_path / "t"
    t = EncryptedTable.create(str(root), SCHEMA, kms=kms, table_key_id="keyA", properties=_props(request.param))
    t.append(_rows(range(10)))
    t.manage_snapshots().create_tag("v1", t.current_snapshot_id).commit()
    return t


def _unchanged(table: EncryptedTable, before: tuple) -> None:
    location, files = before
    assert table.refresh().metadata_location == location
    assert _files(Path(table.location)) == files


def _state(table):
    return table.refresh().metadata_location, _files(Path(table.location))


@pytest.mark.parametrize(("call", "message"), [
    (lambda t: t.upsert(_rows([1]), ["nope"]), "join column 'nope' is not a column of the table"),
    (lambda t: t.upsert(_rows([1]).drop_columns(["id"]), ["id"]), "join column 'id' is not a column of the source"),
    (lambda t: t.merge(_rows([1]), [], when_matched_delete=True), "non-empty list"),
    (lambda t: t.upsert(pa.table({"id": ["x"], "p": [1], "v": ["a"], "n": [1]}), ["id"]),
     "source column 'id' is string, the table's is int64"),
    (lambda t: t.upsert(pa.table({"id": [1], "p": [1], "v": ["a"], "n": [2**40], "extra": [1]}), ["id"]),
     "source column 'extra' is not a column of the table"),
    (lambda t: t.upsert(pa.table({"id": [1], "p": [2**40], "v": ["a"], "n": [1]}), ["id"]),
     "source column 'p' is int64, the table's is int32"),
    (lambda t: t.upsert(pa.table({"id": pa.array([1, None], pa.int64()), "p": [1, 1], "v": ["a", "b"], "n": [1, 1]}),
                        ["id", "v"]), "source column 'id' has nulls"),
    (lambda t: t.upsert(pa.table({"id": [1, 2], "p": [1, 1], "v": ["a", None], "n": [1, 1]}), ["id", "v"]),
     "join column 'v' holds 1 null"),
    (lambda t: t.upsert(_rows([1, 1, 2]), ["id"]), "duplicate rows in the source"),
    (lambda t: t.merge(_rows([3, 3]), ["id"], when_matched_update="all"), "2 source rows match the same target row"),
    (lambda t: t.merge(_rows([3]), ["id"], when_matched_update="all", when_matched_delete=True), "either updated or deleted"),
    (lambda t: t.merge(_rows([3]), ["id"], when_matched_update={"nope": 1}), "no column 'nope'"),
    (lambda t: t.update({"nope": 1}, where="id = 1"), "no column 'nope'"),
    (lambda t: t.update({"n": "not a number"}, where="id = 1"), "update of column 'n'"),
    (lambda t: t.update({"id": None}, where="id = 1"), "the column is required"),
    (lambda t: t.update({}, where="id = 1"), "non-empty mapping"),
    (lambda t: t.update({"n": 1}, where="nope = 1"), "nope"),
    (lambda t: t.overwrite(_rows([1]), overwrite_filter="id = 1", file_format="avro"), "takes no file_format"),
    (lambda t: t.update({"n": 1}, where="id = 1", branch="v1"), "'v1' is a tag, not a branch"),
    (lambda t: t.dynamic_partition_overwrite(pa.table({"id": ["x"]})), "cannot write string as int64"),
])  # fmt: skip
def test_bad_input_is_a_clear_error_and_commits_nothing(table, call, message):
    before = _state(table)
    with pytest.raises((ValueError, TypeError)) as info:
        call(table)
    assert message in str(info.value)
    _unchanged(table, before)


def test_duplicate_source_keys_that_match_nothing_are_inserted(table):
    result = table.merge(_rows([50, 50]), ["id"], when_matched_update="all", when_not_matched_insert="all")
    assert (result.rows_updated, result.rows_inserted) == (0, 2)
    assert table.scan(row_filter="id = 50").to_arrow().num_rows == 2


def test_a_bad_mode_property_is_named(table):
    table.update_properties().set("write.update.mode", "merge-on-write").commit()
    before = _state(table)
    with pytest.raises(ValueError, match="write.update.mode = 'merge-on-write'"):
        table.update({"n": 1}, where="id = 1")
    with pytest.raises(ValueError, match="isolation level 'none'"):
        table.upsert(_rows([1], v="x"), ["id"], isolation_level="none")
    _unchanged(table, before)


def test_a_tampered_data_file_refuses_the_change_and_leaves_nothing(table):
    """An attacker who can write storage flips a byte of the encrypted data file: the
    rows are authenticated as they are read, the change fails, nothing is written."""
    data = [p for p in Path(table.location, "data").rglob("*.parquet")]
    assert len(data) == 1
    raw = bytearray(data[0].read_bytes())
    raw[len(raw) // 2] ^= 0x01
    data[0].write_bytes(bytes(raw))
    before = _state(table)
    with pytest.raises(Exception) as info:
        table.update({"n": 1}, where="id = 1")
    assert data[0].name in str(info.value) or "authenticat" in str(info.value).lower() or "tag" in str(info.value).lower()
    _unchanged(table, before)


def test_a_swapped_deletion_vector_is_refused(tmp_path, kms):
    """A DV file of another commit put in place of the table's: its key metadata does not
    open it, so a merge-on-read change refuses to build on it."""
    root = tmp_path / "t"
    t = EncryptedTable.create(str(root), SCHEMA, kms=kms, table_key_id="keyA", properties=_props("merge-on-read"))
    t.append(_rows(range(10)))
    t.delete("id = 1")
    first = next(Path(root, "data").glob("*.puffin"))
    saved = first.read_bytes()
    t.delete("id = 2")
    second = [p for p in Path(root, "data").glob("*.puffin") if p != first][0]
    second.write_bytes(saved)  # same length class, other key: authentication fails
    before = _state(t)
    with pytest.raises(Exception, match=second.name):
        t.update({"n": 5}, where="id = 3")
    _unchanged(t, before)


def test_a_source_of_a_narrower_type_is_converted_not_refused(table):
    """int32 keys and values convert safely to the table's int64: not an error."""
    source = pa.table({"id": pa.array([1, 77], pa.int32()), "p": pa.array([1, 2], pa.int32()),
                       "v": ["a", "b"], "n": pa.array([5, 6], pa.int32())})  # fmt: skip
    result = table.upsert(source, ["id"])
    assert (result.rows_updated, result.rows_inserted) == (1, 1)
    assert table.scan(row_filter="id = 77").to_arrow().column("n").to_pylist() == [6]


def test_lineage_columns_in_a_source_are_refused(table):
    """A source cannot set the rows' lineage (``_row_id``) through a merge."""
    before = _state(table)
    source = _rows([1]).append_column("_row_id", pa.array([0], pa.int64()))
    with pytest.raises(ValueError, match="source column '_row_id' is not a column of the table"):
        table.merge(source, ["id"], when_matched_update="all")
    _unchanged(table, before)


def test_a_column_named_like_an_internal_one_is_just_a_column(tmp_path, kms):
    """Table columns whose names start with underscores take part in filters and updates
    like any other."""
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("__file", pa.string())])
    t = EncryptedTable.create(str(tmp_path / "u"), schema, kms=kms, table_key_id="keyA")
    t.append(pa.table({"id": [1, 2], "__file": ["a", "b"]}, schema=schema))
    t.update({"__file": "z"}, where="__file = 'a'")
    assert sorted(t.scan().to_arrow().column("__file").to_pylist()) == ["b", "z"]


def test_a_column_hiding_the_position_metadata_column_is_refused(tmp_path, kms):
    """A table column named ``_pos`` would hide the row positions: a merge-on-read change
    would write deletion vectors of the column's values.  Refused before anything is
    written."""
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("_POS", pa.int64())])
    t = EncryptedTable.create(str(tmp_path / "u"), schema, kms=kms, table_key_id="keyA",
                              properties={"write.update.mode": "merge-on-read"})  # fmt: skip
    t.append(pa.table({"id": [1, 2, 3], "_POS": [2, 2, 2]}, schema=schema))
    before = _state(t)
    with pytest.raises(ValueError, match="column named '_POS', which hides Iceberg's metadata column"):
        t.update({"_POS": 0}, where="id = 1")
    _unchanged(t, before)

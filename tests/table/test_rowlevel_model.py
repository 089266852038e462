"""Row-level changes (update, upsert, merge, delete, overwrite by filter, dynamic
partition overwrite, compaction) checked row by row against a plain Python model of the
same operations, in copy-on-write and merge-on-read, on encrypted tables; PyIceberg
reads plaintext results."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.table import StaticTable
from pyiceberg.transforms import IdentityTransform

from icecrypt.kms.memory import MemoryKms
from icecrypt.table import EncryptedTable

MODES = ("copy-on-write", "merge-on-read")
SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False), pa.field("p", pa.int32(), nullable=False),
    pa.field("v", pa.string()), pa.field("n", pa.int64()),
])  # fmt: skip
BY_P = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="p"))


def _props(mode: str) -> dict[str, str]:
    return {f"write.{op}.mode": mode for op in ("delete", "update", "merge")}


def _rows(ids, v="r", n=0) -> pa.Table:
    ids = list(ids)
    return pa.table({"id": ids, "p": [i % 3 for i in ids], "v": [f"{v}{i}" for i in ids], "n": [n] * len(ids)},
                    schema=SCHEMA)  # fmt: skip


def _key(row: dict) -> tuple:
    return (row["id"], row["p"], row["v"] is None, row["v"] or "", row["n"] is None, row["n"] or 0)


def _state(table: EncryptedTable) -> list[dict]:
    return sorted(table.scan().to_arrow().to_pylist(), key=_key)


def _create(root: Path, mode: str, kms, *, encrypted: bool = True) -> EncryptedTable:
    return EncryptedTable.create(
        str(root), SCHEMA, kms=kms if encrypted else None, table_key_id="keyA" if encrypted else None,
        partition_spec=BY_P, properties=_props(mode),
    )  # fmt: skip


# --- the model -------------------------------------------------------------------------------


class Model:
    def __init__(self):
        self.rows: list[dict] = []

    def insert(self, table: pa.Table):
        self.rows += table.to_pylist()

    def delete(self, lo, hi):
        self.rows = [r for r in self.rows if not lo <= r["id"] < hi]

    def update(self, lo, hi):
        for r in self.rows:
            if lo <= r["id"] < hi:
                r["v"], r["n"] = "upd", (None if r["n"] is None else r["n"] + 1)

    def upsert(self, source: pa.Table) -> tuple[int, int]:
        updated = inserted = 0
        for s in source.to_pylist():
            hits = [r for r in self.rows if r["id"] == s["id"]]
            if not hits:
                self.rows.append(dict(s))
                inserted += 1
            for r in hits:
                if (r["p"], r["v"], r["n"]) != (s["p"], s["v"], s["n"]):
                    r.update(s)
                    updated += 1
        return updated, inserted

    def merge_delete_insert(self, source: pa.Table) -> tuple[int, int]:
        keys = {s["id"] for s in source.to_pylist()}
        deleted = sum(r["id"] in keys for r in self.rows)
        present = {r["id"] for r in self.rows}
        self.rows = [r for r in self.rows if r["id"] not in keys]
        fresh = [s for s in source.to_pylist() if s["id"] not in present]
        self.rows += fresh
        return deleted, len(fresh)

    def overwrite(self, lo, hi, data: pa.Table):
        self.delete(lo, hi)
        self.insert(data)

    def replace_partitions(self, data: pa.Table):
        parts = {r["p"] for r in data.to_pylist()}
        self.rows = [r for r in self.rows if r["p"] not in parts]
        self.insert(data)

    def state(self):
        return sorted(self.rows, key=_key)


ids = st.integers(0, 40)
operation = st.one_of(
    st.tuples(st.just("insert"), st.lists(ids, min_size=1, max_size=8)),
    st.tuples(st.just("delete"), ids, st.integers(1, 15)),
    st.tuples(st.just("update"), ids, st.integers(1, 15)),
    st.tuples(st.just("upsert"), st.lists(ids, min_size=1, max_size=8, unique=True), st.integers(0, 2)),
    st.tuples(st.just("merge"), st.lists(ids, min_size=1, max_size=6, unique=True)),
    st.tuples(st.just("overwrite"), ids, st.integers(1, 15), st.lists(ids, max_size=4)),
    st.tuples(st.just("partitions"), st.lists(ids, min_size=1, max_size=4)),
    st.tuples(st.just("compact")),
)


def _apply(table: EncryptedTable, model: Model, op: tuple) -> None:
    kind = op[0]
    if kind == "insert":
        data = _rows(op[1])
        table.append(data)
        model.insert(data)
    elif kind == "delete":
        lo, hi = op[1], op[1] + op[2]
        table.delete(f"id >= {lo} and id < {hi}")
        model.delete(lo, hi)
    elif kind == "update":
        lo, hi = op[1], op[1] + op[2]
        table.update({"v": "upd", "n": pc.field("n") + 1}, where=f"id >= {lo} and id < {hi}")
        model.update(lo, hi)
    elif kind == "upsert":
        source = _rows(op[1], v="u", n=op[2])
        result = table.upsert(source, ["id"])
        assert (result.rows_updated, result.rows_inserted) == model.upsert(source)
    elif kind == "merge":
        source = _rows(op[1], v="m")
        result = table.merge(source, ["id"], when_matched_delete=True, when_not_matched_insert="all")
        assert (result.rows_deleted, result.rows_inserted, result.rows_updated) == (*model.merge_delete_insert(source), 0)
    elif kind == "overwrite":
        lo, hi = op[1], op[1] + op[2]
        data = _rows(op[3], v="o")
        table.overwrite(data, overwrite_filter=f"id >= {lo} and id < {hi}")
        model.overwrite(lo, hi, data)
    elif kind == "partitions":
        data = _rows(op[1], v="d")
        table.dynamic_partition_overwrite(data)
        model.replace_partitions(data)
    elif kind == "compact":
        table.rewrite_data_files(options={"rewrite-all": "true", "min-input-files": "1"})


@pytest.mark.parametrize("mode", MODES)
def test_random_sequences_match_the_model(mode):
    kms = MemoryKms.with_iceberg_test_keys()

    @settings(max_examples=8, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])  # fmt: skip
    @given(st.lists(operation, min_size=1, max_size=6))
    def run(ops):
        with tempfile.TemporaryDirectory() as root:
            table = _create(Path(root) / "t", mode, kms)
            model = Model()
            table.append(_rows(range(0, 20)))
            model.insert(_rows(range(0, 20)))
            for op in ops:
                _apply(table, model, op)
                assert _state(table) == model.state(), op
            # a fresh object reads the same rows; the snapshot chain's summaries add up
            again = EncryptedTable.load(table.metadata_location, kms=kms)
            assert _state(again) == model.state()
            summary = table.metadata["snapshots"][-1]["summary"]
            live_files = [t for t in table.scan().plan_files()]
            assert int(summary["total-data-files"]) == len({t.file.path for t in live_files}) or not live_files

    run()


@pytest.mark.parametrize("mode", MODES)
def test_fixed_sequence_in_both_modes_and_pyiceberg_reads_it(tmp_path, kms, mode):
    """One sequence, plaintext, so that PyIceberg can read the result too."""
    table = _create(tmp_path / "t", mode, kms, encrypted=False)
    model = Model()
    for op in [("insert", list(range(12))), ("update", 2, 4), ("upsert", [1, 5, 30], 1), ("delete", 8, 2),
               ("merge", [0, 31]), ("overwrite", 3, 2, [50]), ("partitions", [60]), ("compact",), ("update", 0, 100)]:
        _apply(table, model, op)
    assert _state(table) == model.state()
    theirs = StaticTable.from_metadata(table.metadata_location).scan().to_arrow()
    assert sorted(theirs.to_pylist(), key=_key) == model.state()


@pytest.mark.parametrize("mode", MODES)
def test_snapshot_operations_and_summaries_are_javas(tmp_path, kms, mode):
    table = _create(tmp_path / "t", mode, kms)
    table.append(_rows(range(0, 30, 3)))  # one partition (p = 0), one file
    table.update({"v": "x"}, where="id = 3")
    summary = table.current_snapshot().summary
    assert summary["operation"] == "overwrite"
    assert summary["added-records"] == ("10" if mode == "copy-on-write" else "1")
    if mode == "copy-on-write":
        assert summary["deleted-data-files"] == "1" and summary["deleted-records"] == "10"
        assert "added-dvs" not in summary
    else:
        assert summary["added-dvs"] == "1" and summary["added-position-deletes"] == "1"
        assert "deleted-data-files" not in summary
    # an update that matches nothing commits nothing
    before = table.current_snapshot_id
    assert table.update({"v": "y"}, where="id = 1000") is None and table.current_snapshot_id == before
    # deleting some rows: DVs only ("delete") or the file rewritten ("overwrite")
    table.delete("id = 6")
    assert table.current_snapshot().summary["operation"] == ("delete" if mode == "merge-on-read" else "overwrite")
    # rows keep their row ids across rewrites and updates
    ids = dict(zip(*table.scan(columns=["id", "_row_id"]).to_arrow().sort_by("id").to_pydict().values()))
    assert ids[0] == 0 and ids[3] == 1 and ids[9] == 3
    # files matched whole go without being read or rewritten: a "delete" in both modes
    table.delete("p = 0")
    summary = table.current_snapshot().summary
    assert summary["operation"] == "delete" and summary["total-records"] == "0" and "added-data-files" not in summary


@pytest.mark.parametrize("mode", MODES)
def test_every_new_file_is_encrypted(tmp_path, kms, mode):
    root = tmp_path / "t"
    table = _create(root, mode, kms)
    table.append(_rows(range(20)))
    table.update({"n": 5}, where="id < 4")
    table.upsert(_rows([1, 2, 99], v="z"), ["id"])
    table.delete("id = 7")
    files = [p for p in (root / "data").rglob("*") if p.is_file()]
    files += [p for p in (root / "metadata").glob("*.avro")]
    assert any(p.suffix == ".puffin" for p in files) == (mode == "merge-on-read")
    for path in files:
        with open(path, "rb") as f:
            head = f.read(4)
            f.seek(-4, 2)
            tail = f.read(4)
        assert head == b"AGS1" or (head == b"PARE" and tail == b"PARE"), f"{path} is not encrypted ({head!r})"


def test_delete_mode_property_picks_copy_on_write(tmp_path, kms):
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA",
                                  properties={"write.delete.mode": "copy-on-write"})  # fmt: skip
    table.append(_rows(range(10)))
    table.delete("id < 3")
    summary = table.current_snapshot().summary
    assert summary["operation"] == "overwrite" and summary["deleted-data-files"] == "1" and "added-dvs" not in summary
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == list(range(3, 10))
    # unset (the table as before): deletion vectors, as delete() always wrote them
    plain = EncryptedTable.create(str(tmp_path / "u"), SCHEMA, kms=kms, table_key_id="keyA")
    plain.append(_rows(range(10)))
    plain.delete("id < 3")
    assert plain.current_snapshot().summary["added-dvs"] == "1"


def test_merge_update_with_expressions_over_target_and_source(tmp_path, kms):
    table = _create(tmp_path / "t", "merge-on-read", kms)
    table.append(_rows(range(5), n=10))
    source = _rows([1, 2, 7], n=5)
    result = table.merge(source, ["id"], when_matched_update={"n": pc.field("n") + pc.field("source.n"), "v": "merged"},
                         when_not_matched_insert="all")  # fmt: skip
    assert (result.rows_updated, result.rows_deleted, result.rows_inserted) == (2, 0, 1)
    rows = {r["id"]: (r["v"], r["n"]) for r in table.scan().to_arrow().to_pylist()}
    assert rows == {0: ("r0", 10), 1: ("merged", 15), 2: ("merged", 15), 3: ("r3", 10), 4: ("r4", 10), 7: ("r7", 5)}


def test_upsert_of_unchanged_rows_commits_nothing(tmp_path, kms):
    table = _create(tmp_path / "t", "copy-on-write", kms)
    table.append(_rows(range(5)))
    before = table.current_snapshot_id
    result = table.upsert(_rows([1, 2]), ["id"])
    assert (result.rows_updated, result.rows_inserted, result.snapshot_id) == (0, 0, None)
    assert table.current_snapshot_id == before


def test_copy_on_write_drops_the_deletion_vector_of_a_rewritten_file(tmp_path, kms):
    """Modes mixed on one table: a merge-on-read delete leaves a DV; a copy-on-write
    update of the same file removes the file and that DV, and the deleted row stays
    deleted (never resurrected)."""
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA",
                                  properties={"write.delete.mode": "merge-on-read",
                                              "write.update.mode": "copy-on-write"})  # fmt: skip
    table.append(_rows(range(10)))
    table.delete("id = 4")
    assert table.current_snapshot().summary["added-dvs"] == "1"
    table.update({"v": "x"}, where="id = 5")
    summary = table.current_snapshot().summary
    assert summary["removed-dvs"] == "1" and summary["deleted-data-files"] == "1"
    assert summary["total-delete-files"] == "0" and summary["total-records"] == "9"
    rows = {r["id"]: r["v"] for r in table.scan().to_arrow().to_pylist()}
    assert 4 not in rows and rows[5] == "x" and len(rows) == 9


@pytest.mark.parametrize("mode", MODES)
def test_row_level_changes_on_a_java_table_with_its_dv_and_equality_deletes(tmp_path, kms, mode):
    """Java's table (a DV on the alpha file, equality deletes on beta rows): an update and
    an upsert in either mode keep every row Java deleted deleted, change exactly the rows
    asked for, and leave Java's snapshots readable as they were."""
    from tablelib import copy_table
    from test_write_java_tables import _assert_java_snapshots_intact, _load

    name = "enc_deletes_dek16"
    table = _load(name, copy_table(name, tmp_path), kms)
    table.update_properties().set("write.update.mode", mode).set("write.merge.mode", mode).commit()
    before = table.scan().to_arrow()
    table.update({"note": "fixed", "qty": pc.field("qty") + 1}, where="id < 2000")
    source = before.filter(pc.field("id") >= 2000).slice(0, 5)
    source = source.set_column(source.schema.get_field_index("note"), "note", pa.array(["upserted"] * 5))
    result = table.upsert(source, ["id"])
    assert (result.rows_updated, result.rows_inserted) == (5, 0)
    after = {r["id"]: r for r in table.scan().to_arrow().to_pylist()}
    assert len(after) == before.num_rows  # nothing deleted by Java came back, nothing lost
    upserted = set(source.column("id").to_pylist())
    for row in before.to_pylist():
        now = after[row["id"]]
        if row["id"] < 2000:
            assert (now["note"], now["qty"]) == ("fixed", row["qty"] + 1)
        elif row["id"] in upserted:
            assert now["note"] == "upserted" and now["qty"] == row["qty"]
        else:
            assert now == row
    _assert_java_snapshots_intact(table, name)
    assert table.verify().ok


@pytest.mark.parametrize("mode", MODES)
def test_row_level_changes_on_branches(tmp_path, kms, mode):
    """A branch changes alone; a branch that does not exist yet starts from main's head."""
    table = _create(tmp_path / "t", mode, kms)
    table.append(_rows(range(6)))
    table.manage_snapshots().create_branch("dev", table.current_snapshot_id).commit()
    main_before = _state(table)
    table.update({"v": "dev"}, where="id < 2", branch="dev")
    table.delete("id = 5", branch="dev")
    result = table.upsert(_rows([3, 40], v="new"), ["id"], branch="fresh")
    assert (result.rows_updated, result.rows_inserted) == (1, 1)
    assert _state(table) == main_before
    dev = {r["id"]: r["v"] for r in table.scan(branch="dev").to_arrow().to_pylist()}
    assert dev == {0: "dev", 1: "dev", 2: "r2", 3: "r3", 4: "r4"}
    fresh = {r["id"]: r["v"] for r in table.scan(branch="fresh").to_arrow().to_pylist()}
    assert fresh == {0: "r0", 1: "r1", 2: "r2", 3: "new3", 4: "r4", 5: "r5", 40: "new40"}
    parent = table.snapshot(table.metadata["refs"]["fresh"]["snapshot-id"]).parent_snapshot_id
    assert parent == table.current_snapshot_id


@pytest.mark.parametrize("mode", MODES)
def test_updating_the_partition_column_moves_the_row(tmp_path, kms, mode):
    table = _create(tmp_path / "t", mode, kms)
    table.append(_rows(range(6)))
    table.update({"p": 2}, where="id = 0")
    by_partition = {}
    for row in table.scan(columns=["id", "_spec_id", "_partition"]).to_arrow().to_pylist():
        by_partition.setdefault(row["_partition"]["p"], []).append(row["id"])
    assert {p: sorted(ids) for p, ids in by_partition.items()} == {0: [3], 1: [1, 4], 2: [0, 2, 5]}

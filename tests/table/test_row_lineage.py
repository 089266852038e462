"""Row lineage (format v3) and the other metadata columns: what scans project, and that no
icecrypt operation changes a surviving row's ``_row_id`` or ``_last_updated_sequence_number``
(rewrites and re-keying store them in the new files, under the reserved field ids)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from forgery import without_authenticator
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.expressions import In
from tablelib import TABLE_NAMES

from icecrypt import parquet
from icecrypt.kms.memory import MemoryKms
from icecrypt.table import EncryptedTable
from icecrypt.table.ops import write as w

LINEAGE = ["_row_id", "_last_updated_sequence_number"]
ROW_ID_FIELD, SEQ_FIELD = 2147483540, 2147483539
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("part", pa.int32()), pa.field("s", pa.string())])


def _rows(ids, part: int | None = None) -> pa.Table:
    ids = list(ids)
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "part": pa.array([part if part is not None else i % 3 for i in ids], pa.int32()),
        "s": [f"row-{i}" for i in ids],
    }, schema=SCHEMA)  # fmt: skip


def _create(root: Path, kms, **properties: str) -> EncryptedTable:
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import IdentityTransform

    spec = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="part"))
    return EncryptedTable.create(str(root), SCHEMA, kms=kms, table_key_id="keyA", partition_spec=spec,
                                 properties=properties or None)  # fmt: skip


def _lineage(table: EncryptedTable) -> dict[int, tuple[int, int]]:
    """id -> (_row_id, _last_updated_sequence_number) of every live row."""
    rows = table.scan(columns=["id", *LINEAGE]).to_arrow()
    ids, row_ids, seqs = (rows.column(c).to_pylist() for c in ("id", *LINEAGE))
    assert len(ids) == len(set(ids))
    return {i: (r, s) for i, r, s in zip(ids, row_ids, seqs)}


def _current_sequence_number(table: EncryptedTable) -> int:
    return table.current_snapshot().sequence_number


# --- the property ------------------------------------------------------------------------------

_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 5), st.sampled_from(["parquet", "avro"])),
        st.tuples(st.just("delete"), st.integers(0, 4)),
        st.tuples(st.just("rewrite"), st.sampled_from(["rewrite-all", "bin-pack", "deletes"])),
        st.tuples(st.just("rewrite_manifests")),
        st.tuples(st.just("rekey")),
        st.tuples(st.just("expire")),
    ),
    min_size=1,
    max_size=6,
)

_REWRITE_OPTIONS = {
    "rewrite-all": {"rewrite-all": "true"},
    # bin-pack: every small file is a candidate, two make a group
    "bin-pack": {"min-input-files": "2"},
    # files with any deleted row are rewritten (their deletes applied)
    "deletes": {"delete-ratio-threshold": "0.01"},
}


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_OPS)
def test_no_operation_changes_a_surviving_rows_lineage(ops):
    kms = MemoryKms.with_iceberg_test_keys()
    with tempfile.TemporaryDirectory() as tmp:
        table = _create(Path(tmp) / "t", kms)
        next_id = 0
        known: dict[int, tuple[int, int]] = {}  # what each live row had when it appeared
        ever: set[int] = set()  # every _row_id any row ever had (deleted rows' too)

        def append(n: int, file_format: str) -> None:
            nonlocal next_id
            table.append(_rows(range(next_id, next_id + n * 4)), file_format=file_format)
            next_id += n * 4

        append(2, "parquet")
        known = _lineage(table)
        ever = {r for r, _ in known.values()}
        for op in ops:
            before = dict(known)
            if op[0] == "append":
                append(op[1], op[2])
            elif op[0] == "delete":
                live = sorted(known)
                doomed = [i for i in live if (i * 7 + op[1]) % 5 == 0][:6]
                if doomed:
                    table.delete(In("id", doomed))
                    for i in doomed:
                        known.pop(i)
                    before = dict(known)
            elif op[0] == "rewrite":
                table.rewrite_data_files(target_file_size=1 << 20, options=_REWRITE_OPTIONS[op[1]])
            elif op[0] == "rewrite_manifests":
                table.rewrite_manifests(force=True)
            elif op[0] == "rekey":
                table.rekey(everything=True)
            elif op[0] == "expire":
                table.expire_snapshots(int(time.time() * 1000) + 1)
            now = _lineage(EncryptedTable.load(table.metadata_location, kms=kms))
            for row_id, _ in now.values():
                assert row_id is not None
            assert len({r for r, _ in now.values()}) == len(now), "row ids must stay unique"
            # rows that were there keep both values; new rows get fresh ids and this commit's number
            assert {i: now[i] for i in before} == before, op
            for i in set(now) - set(before):
                row_id, seq = now[i]
                assert row_id not in ever, (op, i)
                assert seq == _current_sequence_number(table), (op, i)
            known = dict(now)
            ever |= {r for r, _ in now.values()}
            # every snapshot still there shows the rows it has with the lineage they have now
            oldest = table.snapshots()[0].snapshot_id
            rows = table.scan(columns=["id", *LINEAGE], snapshot_id=oldest).to_arrow().to_pylist()
            then = {r["id"]: (r["_row_id"], r["_last_updated_sequence_number"]) for r in rows}
            assert {i: then[i] for i in set(then) & set(now)} == {i: now[i] for i in set(then) & set(now)}
            # the table hands out no id a row has: next-row-id is beyond all of them
            assert table.metadata["next-row-id"] > max(ever)


# --- reading ---------------------------------------------------------------------------------------


@pytest.fixture
def small(tmp_path, kms):
    """Two appends (ids 0-7 then 8-11), then a deletion vector on ids 1 and 9."""
    table = _create(tmp_path / "t", kms)
    table.append(_rows(range(8), part=0))
    table.append(_rows(range(8, 12), part=1))
    table.delete("id = 1 or id = 9")
    return table


def test_inherited_lineage_is_first_row_id_plus_position_and_the_data_sequence_number(small):
    rows = small.scan(columns=["id", "_file", "_pos", *LINEAGE, "_spec_id", "_partition"]).to_arrow()
    tasks = {t.file.path: t for t in small.scan().plan_files()}
    assert {t.first_row_id for t in tasks.values()} == {0, 8}
    assert sorted(rows.column("id").to_pylist()) == [0, 2, 3, 4, 5, 6, 7, 8, 10, 11]
    for row in rows.to_pylist():
        task = tasks[row["_file"]]
        assert row["_row_id"] == task.first_row_id + row["_pos"]
        assert row["_last_updated_sequence_number"] == task.file.sequence_number
        assert row["_spec_id"] == 0
        assert row["_partition"] == {"part": 0 if row["id"] < 8 else 1}
    # positions are the rows' places in the file before deletes: id 2 stays at 2
    by_id = {r["id"]: r for r in rows.to_pylist()}
    assert by_id[2]["_pos"] == 2 and by_id[10]["_pos"] == 2
    assert (by_id[0]["_row_id"], by_id[11]["_row_id"]) == (0, 11)
    assert (by_id[0]["_last_updated_sequence_number"], by_id[11]["_last_updated_sequence_number"]) == (1, 2)


def test_metadata_columns_in_the_arrow_schema(small):
    schema = small.scan(columns=["_row_id", "id", "_last_updated_sequence_number", "_file", "_pos",
                                 "_spec_id", "_partition", "_deleted"]).arrow_schema  # fmt: skip
    assert schema.names == ["_row_id", "id", "_last_updated_sequence_number", "_file", "_pos", "_spec_id",
                            "_partition", "_deleted"]  # fmt: skip
    ids = [int(f.metadata[b"PARQUET:field_id"]) for f in schema]
    assert ids == [ROW_ID_FIELD, 1, SEQ_FIELD, 2147483646, 2147483645, 2147483643, 2147483642, 2147483644]
    assert schema.field("_row_id").type == pa.int64() and schema.field("_row_id").nullable
    assert schema.field("_pos").type == pa.int64() and not schema.field("_pos").nullable
    assert schema.field("_spec_id").type == pa.int32()
    assert schema.field("_deleted").type == pa.bool_()
    assert schema.field("_partition").type == pa.struct([pa.field("part", pa.int32())])
    assert small.scan().arrow_schema.names == ["id", "part", "s"]  # never unless asked for


def test_deleted_column_keeps_deleted_rows_marked(small):
    rows = small.scan(columns=["id", "_deleted", "_row_id"]).to_arrow()
    marked = {r["id"]: r["_deleted"] for r in rows.to_pylist()}
    assert marked == {i: i in (1, 9) for i in range(12)}
    assert sorted(rows.column("_row_id").to_pylist()) == list(range(12))
    # the row filter still applies; without _deleted the deleted rows are gone
    assert small.scan(columns=["id", "_deleted"], row_filter="id < 3").to_arrow().column("_deleted").to_pylist() \
        == [False, True, False]
    assert small.scan(columns=["id"]).to_arrow().num_rows == 10
    assert small.scan(row_filter="id >= 8").count() == 3


def test_a_table_column_of_the_same_name_hides_the_metadata_column(tmp_path, kms):
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("_pos", pa.string())])
    table = EncryptedTable.create(str(tmp_path / "t"), schema, kms=kms, table_key_id="keyA")
    table.append(pa.table({"id": pa.array([5], pa.int64()), "_pos": ["mine"]}, schema=schema))
    assert table.scan(columns=["_pos", "_row_id"]).to_arrow().to_pylist() == [{"_pos": "mine", "_row_id": 0}]
    assert table.scan(row_filter="_pos = 'mine' and _row_id = 0").count() == 1  # filters too
    with pytest.raises(ValueError, match="unknown column"):
        table.scan(columns=["id", "_no_such_metadata"])


def test_avro_files_are_not_split_when_positions_are_projected(tmp_path, kms):
    table = _create(tmp_path / "t", kms, **{"write.format.default": "avro", "write.avro.compression-codec": "uncompressed"})
    table.append(_rows(range(20_000), part=0))
    split = 16 * 1024
    assert len(table.scan(split_size=split).plan_files()) > 1  # Avro is split otherwise
    scan = table.scan(columns=["id", "_pos", "_row_id"], split_size=split)
    assert len(scan.plan_files()) == 1
    rows = scan.to_arrow()
    assert rows.column("_pos").to_pylist() == list(range(20_000))
    assert rows.column("_row_id").to_pylist() == list(range(20_000))
    # a task planned for a split past the file's start cannot number its rows: refused
    import dataclasses

    from icecrypt.table import read_task

    split_task = table.scan(split_size=split).plan_files()[1]
    asked = dataclasses.replace(split_task, read=scan.read_spec)
    with pytest.raises(ValueError, match="row positions are unknown"):
        list(read_task(asked, table.filesystem))


def test_lineage_of_the_java_tables_matches_their_manifests(golden):
    for name in TABLE_NAMES:
        table = golden(name)
        snapshot = table.current_snapshot()
        # expected per data file, from the raw manifest records: first_row_id inherited from
        # the manifest (running over the live data files without one), data sequence number
        target = w._Target.of(table)
        manager = target.manager(table.metadata)
        io = target.io(manager)
        first: dict[str, int] = {}
        sequence: dict[str, int] = {}
        for manifest in w._read_manifest_list(io, manager, w._current_snapshot(table.metadata)):
            if manifest["content"] != 0:
                continue
            assert manifest["first_row_id"] is not None
            next_row_id = manifest["first_row_id"]
            for entry in w._read_entries(io, manifest):
                data_file = entry["data_file"]
                if entry["status"] == 2:
                    continue
                if data_file.get("first_row_id") is None:
                    first[data_file["file_path"]] = next_row_id
                    next_row_id += data_file["record_count"]
                else:
                    first[data_file["file_path"]] = data_file["first_row_id"]
                seq = entry.get("sequence_number")
                sequence[data_file["file_path"]] = seq if seq is not None else manifest["sequence_number"]
        rows = table.scan(columns=["id", "_file", "_pos", *LINEAGE, "_deleted"]).to_arrow()
        files = rows.column("_file").to_pylist()
        expected_ids = [first[f] + p for f, p in zip(files, rows.column("_pos").to_pylist())]
        assert rows.column("_row_id").to_pylist() == expected_ids, name
        assert rows.column("_last_updated_sequence_number").to_pylist() == [sequence[f] for f in files], name
        # every row of the table, deleted ones too, has its own id: 0 .. next-row-id - 1
        assert sorted(expected_ids) == list(range(len(expected_ids))), name
        assert table.metadata["next-row-id"] == len(expected_ids) == snapshot.first_row_id + snapshot.added_rows
        live = table.scan(columns=["id"]).to_arrow().num_rows
        assert pc.sum(pc.invert(rows.column("_deleted"))).as_py() == live


def test_lineage_of_the_java_deletes_table_survives_rewrite_and_rekey(golden_copy, kms):
    """The Java table with a deletion vector and an equality delete: rows they remove go,
    the survivors keep the lineage Java's metadata gave them."""
    table, _ = golden_copy("enc_deletes_dek16")
    before = _lineage(table)
    assert len(before) == 9779
    table.rewrite_data_files(options={"rewrite-all": "true"})
    assert _lineage(table) == before
    assert not [t for t in table.scan().plan_files() if t.deletes]  # the deletes were applied
    table.rekey(everything=True, expire=True)
    reloaded = EncryptedTable.load(table.metadata_location, kms=kms, location_map=table.location_map)
    assert _lineage(reloaded) == before
    table.append(_java_row(table))
    after = _lineage(table)
    new = after.pop(10**6)
    assert after == before and new[0] >= max(r for r, _ in before.values()) + 1


def _java_row(table: EncryptedTable) -> pa.Table:
    """A copy of one of the table's rows, with id 10**6."""
    row = table.scan().to_arrow().slice(0, 1)
    return row.set_column(row.schema.get_field_index("id"), row.schema.field("id"), pa.array([10**6], pa.int64()))


# --- writing ----------------------------------------------------------------------------------------


def test_rewritten_files_store_the_lineage_columns_as_java_writes_them(small):
    before = _lineage(small)
    small.rewrite_data_files(options={"rewrite-all": "true"})
    assert _lineage(small) == before
    tasks = small.scan().plan_files()
    for task in tasks:
        pf = parquet.open_file(task.file.fs_path, task.file.key())
        try:
            fields = {f.name: f for f in pf.schema_arrow}
            assert [f.name for f in pf.schema_arrow] == ["id", "part", "s", *LINEAGE]
            assert int(fields["_row_id"].metadata[b"PARQUET:field_id"]) == ROW_ID_FIELD
            assert int(fields["_last_updated_sequence_number"].metadata[b"PARQUET:field_id"]) == SEQ_FIELD
            assert fields["_row_id"].type == pa.int64() and fields["_row_id"].nullable
            stored = pf.read(columns=["id", *LINEAGE]).to_pylist()
        finally:
            pf.close()
        assert all(r["_row_id"] is not None and r["_last_updated_sequence_number"] is not None for r in stored)
        assert {r["id"]: (r["_row_id"], r["_last_updated_sequence_number"]) for r in stored} == \
            {i: before[i] for i in (r["id"] for r in stored)}
    # the new files got a first_row_id at commit (next-row-id grew by their rows), but the
    # stored values are what the rows read as
    assert sorted(t.first_row_id for t in tasks) == [12, 12 + 7]  # a file per partition: 7 rows, 3 rows
    assert small.metadata["next-row-id"] == 12 + 10
    # no metrics of the lineage columns in the manifest: their nulls stand for inherited values
    table = small
    target = w._Target.of(table)
    manager = target.manager(table.metadata)
    io = target.io(manager)
    for manifest in w._read_manifest_list(io, manager, w._current_snapshot(table.metadata)):
        for entry in w._read_entries(io, manifest):
            for name in ("value_counts", "null_value_counts", "lower_bounds", "upper_bounds"):
                keys = {pair["key"] for pair in entry["data_file"].get(name) or ()}
                assert not keys & {ROW_ID_FIELD, SEQ_FIELD}, name


def test_rows_appended_after_a_rewrite_get_new_ids(small):
    small.rewrite_data_files(options={"rewrite-all": "true"})
    before = _lineage(small)
    small.append(_rows(range(100, 103)))
    after = _lineage(small)
    assert {i: after[i] for i in before} == before
    new = sorted(after[i][0] for i in (100, 101, 102))
    assert new == [22, 23, 24]  # next-row-id after the rewrite: 12 rows + 10 rewritten
    assert {after[i][1] for i in (100, 101, 102)} == {_current_sequence_number(small)}
    # the new rows' files store nothing: lineage is inherited
    task = next(t for t in small.scan().plan_files() if t.file.sequence_number == _current_sequence_number(small))
    pf = parquet.open_file(task.file.fs_path, task.file.key())
    try:
        assert pf.schema_arrow.names == ["id", "part", "s"]
    finally:
        pf.close()


def test_a_table_whose_columns_take_the_lineage_names_is_still_rewritten(tmp_path, kms):
    """Its own column hides the lineage from every reader, and a file cannot hold two
    columns of one name: the rewrite (and so rekey, a key-compromise response) goes on
    without carrying lineage, and says so."""
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("_ROW_ID", pa.int64())])
    table = EncryptedTable.create(str(tmp_path / "t"), schema, kms=kms, table_key_id="keyA")
    for i in range(2):
        table.append(pa.table({"id": pa.array([i], pa.int64()), "_ROW_ID": pa.array([7], pa.int64())}, schema=schema))
    with pytest.warns(UserWarning, match="get new row ids"):
        result = table.rewrite_data_files(options={"rewrite-all": "true"})
    assert result.added_data_files == 1
    assert table.scan().to_arrow().sort_by("id").to_pylist() == [{"id": 0, "_ROW_ID": 7}, {"id": 1, "_ROW_ID": 7}]
    task = table.scan().plan_files()[0]
    pf = parquet.open_file(task.file.fs_path, task.file.key())
    try:
        assert pf.schema_arrow.names == ["id", "_ROW_ID"]
    finally:
        pf.close()


def test_lineage_positions_count_rows_before_deletes_in_every_row_group(tmp_path, kms):
    table = _create(tmp_path / "t", kms, **{"write.parquet.row-group-size-bytes": "4096"})
    table.append(_rows(range(3000), part=0).to_batches(max_chunksize=500))
    task = table.scan().plan_files()[0]
    pf = parquet.open_file(task.file.fs_path, task.file.key())
    try:
        assert pf.metadata.num_row_groups > 2
    finally:
        pf.close()
    table.delete(In("id", list(range(0, 3000, 7))))
    rows = table.scan(columns=["id", "_pos", "_row_id"], row_filter="id >= 2000").to_arrow()
    assert rows.column("_pos").to_pylist() == rows.column("id").to_pylist() == rows.column("_row_id").to_pylist()
    assert np.all(np.asarray(rows.column("id")) % 7 != 0)


# --- row filters -------------------------------------------------------------------------------------

_FILTERS = {
    "_row_id >= 8": lambda r: r["_row_id"] >= 8,
    "not (_pos < 2) and id < 8": lambda r: not r["_pos"] < 2 and r["id"] < 8,
    "not (_row_id = 3 and id = 3)": lambda r: not (r["_row_id"] == 3 and r["id"] == 3),
    "_last_updated_sequence_number = 2 or part = 0": lambda r: r["_last_updated_sequence_number"] == 2 or r["part"] == 0,
    "_spec_id = 0 and _pos in (0, 2)": lambda r: r["_spec_id"] == 0 and r["_pos"] in (0, 2),
    "_deleted = true": lambda r: r["_deleted"],
    "_deleted = false and _row_id < 4": lambda r: not r["_deleted"] and r["_row_id"] < 4,
}


@pytest.mark.parametrize("expression", list(_FILTERS))
def test_row_filters_may_name_metadata_columns(small, expression):
    everything = small.scan(columns=["id", "part", "_row_id", "_last_updated_sequence_number", "_pos", "_spec_id",
                                     "_deleted"]).to_arrow().to_pylist()  # fmt: skip
    # a filter that does not name _deleted sees the live rows only
    rows = everything if "_deleted" in expression else [r for r in everything if not r["_deleted"]]
    want = sorted(r["id"] for r in rows if _FILTERS[expression](r))
    got = small.scan(columns=["id"], row_filter=expression).to_arrow().column("id").to_pylist()
    assert sorted(got) == want
    assert small.scan(row_filter=expression).count() == len(want)


def test_a_file_filter_reads_that_file(small):
    path = next(t.file.path for t in small.scan().plan_files() if t.first_row_id == 8)
    rows = small.scan(columns=["id", "_file"], row_filter=f"_file = '{path}'").to_arrow()
    assert sorted(rows.column("id").to_pylist()) == [8, 10, 11]


def test_metadata_predicates_never_prune_by_statistics(small):
    """A file's statistics of a lineage column (which another writer may record) leave out
    the inherited values its nulls stand for: pruning treats metadata predicates as true (a
    NOT is pushed down first), so lying-looking metrics prune nothing."""
    import struct

    from tablelib import current_manifests, reload, rewrite_chain

    def with_lineage_metrics(entries: list[dict]) -> list[dict]:
        for entry in entries:
            data_file = entry["data_file"]
            count = data_file["record_count"]
            for name, value in (("value_counts", count), ("null_value_counts", count), ("nan_value_counts", 0)):
                data_file[name] = [*(data_file.get(name) or []), {"key": ROW_ID_FIELD, "value": value},
                                   {"key": SEQ_FIELD, "value": value}]  # fmt: skip
            for name in ("lower_bounds", "upper_bounds"):  # all null, and bounds far from any row
                bound = struct.pack("<q", 10**9)
                data_file[name] = [*(data_file.get(name) or []), {"key": ROW_ID_FIELD, "value": bound},
                                   {"key": SEQ_FIELD, "value": bound}]  # fmt: skip
        return entries

    for index, manifest in enumerate(current_manifests(small)):
        if not manifest.is_deletes:
            rewrite_chain(small, index, with_lineage_metrics)
    table = reload(small)
    assert table.scan(row_filter="_row_id = 11 and not (_pos > 100)").to_arrow().column("id").to_pylist() == [11]
    assert table.scan(row_filter="not (_row_id != 0)").to_arrow().column("id").to_pylist() == [0]
    assert table.scan(row_filter="_last_updated_sequence_number < 2").count() == 7
    assert table.scan(row_filter="_row_id is null").count() == 0
    # and after a rewrite, whose files store the values (without metrics for them)
    table.rewrite_data_files(options={"rewrite-all": "true"})
    assert table.scan(row_filter="_row_id = 11 and not (_pos > 100)").to_arrow().column("id").to_pylist() == [11]


def test_filtering_on_positions_keeps_avro_files_whole(tmp_path, kms):
    table = _create(tmp_path / "t", kms, **{"write.format.default": "avro", "write.avro.compression-codec": "uncompressed"})
    table.append(_rows(range(20_000), part=0))
    scan = table.scan(columns=["id"], row_filter="_pos >= 19990", split_size=16 * 1024)
    assert len(scan.plan_files()) == 1
    assert scan.to_arrow().column("id").to_pylist() == list(range(19_990, 20_000))


@pytest.mark.parametrize("first_row_id", [2**63 - 3, 2**63 + 5])
def test_row_ids_that_would_overflow_are_refused_not_wrapped(small, first_row_id):
    import dataclasses

    from icecrypt.errors import FormatError
    from icecrypt.table import read_task

    task = next(t for t in small.scan(columns=["id", "_row_id"]).plan_files() if t.first_row_id == 0)
    with pytest.raises(FormatError, match=r"data file .*\.parquet: first_row_id .* overflow a long"):
        list(read_task(dataclasses.replace(task, first_row_id=first_row_id), small.filesystem))
    assert len(list(read_task(dataclasses.replace(task, first_row_id=2**63 - 8), small.filesystem))) == 1


def test_partition_type_unites_every_spec():
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import BucketTransform, DayTransform, IdentityTransform
    from pyiceberg.types import DateType, IntegerType, LongType, NestedField, StringType

    from icecrypt.table.model.metadata_columns import partition_type

    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "d", DateType()),
                    NestedField(3, "s", StringType()))  # fmt: skip
    old = PartitionSpec(PartitionField(3, 1000, IdentityTransform(), "s"), spec_id=0)
    new = PartitionSpec(PartitionField(3, 1000, IdentityTransform(), "s"), PartitionField(2, 1001, DayTransform(), "d_day"),
                        PartitionField(1, 1002, BucketTransform(8), "id_bucket"), spec_id=1)  # fmt: skip
    struct = partition_type({0: old, 1: new}, schema)
    assert [(f.field_id, f.name, f.required) for f in struct.fields] == [
        (1000, "s", False), (1001, "d_day", False), (1002, "id_bucket", False)]
    assert struct.fields[1].field_type == DateType() and struct.fields[2].field_type == IntegerType()


def test_partition_and_spec_id_across_an_evolved_spec(tmp_path, kms):
    """Files of the old spec read with nulls for the new spec's fields; a rewrite moves
    them into the new spec and the rows keep their lineage."""
    import json

    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import IdentityTransform

    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("s", pa.string())])
    spec = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="s"))
    table = EncryptedTable.create(str(tmp_path / "t"), schema, kms=kms, table_key_id="keyA", partition_spec=spec)
    table.append(pa.table({"id": pa.array([1, 2], pa.int64()), "s": ["a", "b"]}, schema=schema))
    path = Path(table.metadata_location)  # a second spec, committed as a writer with spec evolution would
    metadata = without_authenticator(json.loads(path.read_text(encoding="utf-8")))  # as another writer leaves it
    metadata["partition-specs"].append({"spec-id": 1, "fields": [
        {"source-id": 2, "field-id": 1000, "name": "s", "transform": "identity"},
        {"source-id": 1, "field-id": 1001, "name": "id_bucket", "transform": "bucket[4]"}]})  # fmt: skip
    metadata["default-spec-id"], metadata["last-partition-id"] = 1, 1001
    path.write_text(json.dumps(metadata), encoding="utf-8")
    table = EncryptedTable.load(str(path), kms=kms)
    table.append(pa.table({"id": pa.array([3], pa.int64()), "s": ["c"]}, schema=schema))
    columns = ["id", "_spec_id", "_partition", *LINEAGE]
    rows = table.scan(columns=columns).to_arrow().sort_by("id").to_pylist()
    assert [(r["_spec_id"], r["_partition"]) for r in rows] == [
        (0, {"s": "a", "id_bucket": None}), (0, {"s": "b", "id_bucket": None}), (1, {"s": "c", "id_bucket": 3})]
    before = _lineage(table)
    assert before == {1: (0, 1), 2: (1, 1), 3: (2, 2)}
    table.rewrite_data_files(options={"rewrite-all": "true"})
    assert _lineage(table) == before
    assert {r["_spec_id"] for r in table.scan(columns=columns).to_arrow().to_pylist()} == {1}


def test_plaintext_table_rewrite_keeps_lineage_and_pyiceberg_still_reads_it(tmp_path):
    """The lineage columns of rewritten files are extra columns to readers that do not
    ask for them (PyIceberg projects by field id)."""
    from pyiceberg.table import StaticTable

    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("s", pa.string())])
    table = EncryptedTable.create(str(tmp_path / "t"), schema, kms=None, table_key_id=None)
    for i in range(3):
        table.append(pa.table({"id": pa.array(range(i * 3, i * 3 + 3), pa.int64()), "s": ["x"] * 3}, schema=schema))
    table.delete("id = 4")
    before = _lineage(table)
    table.rewrite_data_files(options={"rewrite-all": "true"})
    assert _lineage(table) == before
    theirs = StaticTable.from_metadata(table.metadata_location).scan().to_arrow()
    assert theirs.schema.names == ["id", "s"]
    assert sorted(theirs.column("id").to_pylist()) == sorted(before)


def test_format_2_tables_have_no_lineage_columns(tmp_path):
    """As in Java, _row_id and _last_updated_sequence_number exist in format-version 3
    tables only; the other metadata columns read in any version."""
    import json

    schema = pa.schema([pa.field("id", pa.int64(), nullable=False)])
    table = EncryptedTable.create(str(tmp_path / "t"), schema, kms=None, table_key_id=None)
    table.append(pa.table({"id": pa.array([1, 2], pa.int64())}, schema=schema))
    path = Path(table.metadata_location)  # the same table as a v2 writer leaves it
    metadata = without_authenticator(json.loads(path.read_text(encoding="utf-8")))  # as another writer leaves it
    metadata["format-version"] = 2
    metadata.pop("next-row-id")
    for snapshot in metadata["snapshots"]:
        snapshot.pop("first-row-id")
        snapshot.pop("added-rows")
    path.write_text(json.dumps(metadata), encoding="utf-8")
    table = EncryptedTable.load(str(path), kms=None)
    assert table.scan(columns=["id", "_pos"]).to_arrow().column("_pos").to_pylist() == [0, 1]
    with pytest.raises(ValueError, match="'_row_id': row lineage exists in format-version 3 tables"):
        table.scan(columns=["id", "_row_id"])
    with pytest.raises(ValueError, match="_last_updated_sequence_number"):
        table.scan(row_filter="_last_updated_sequence_number > 0")


def test_a_file_whose_lineage_column_is_no_long_is_refused_by_name(tmp_path):
    """Storage is input: a plaintext table's data file replaced by one whose _row_id column
    holds strings, or whose id column cannot be read as a long, fails with FormatError
    naming the file and the column (no bare Arrow error, no guessed values)."""
    import pyarrow.parquet as pq

    from icecrypt.errors import FormatError

    schema = pa.schema([pa.field("id", pa.int64(), nullable=False)])
    table = EncryptedTable.create(str(tmp_path / "t"), schema, kms=None, table_key_id=None)
    table.append(pa.table({"id": pa.array([1, 2], pa.int64())}, schema=schema))
    task = table.scan().plan_files()[0]

    def field(name, type_, field_id):
        return pa.field(name, type_, metadata={b"PARQUET:field_id": str(field_id).encode()})

    forged = pa.schema([field("id", pa.int64(), 1), field("_row_id", pa.string(), ROW_ID_FIELD)])
    pq.write_table(pa.table({"id": [1, 2], "_row_id": ["7", "8"]}, schema=forged), task.file.fs_path)
    with pytest.raises(FormatError, match=r"\.parquet: column '_row_id' \(field id 2147483540\) is string, not long"):
        table.scan(columns=["id", "_row_id"]).to_arrow()
    assert table.scan().to_arrow().column("id").to_pylist() == [1, 2]  # not asked for: not read

    forged = pa.schema([field("id", pa.string(), 1)])
    pq.write_table(pa.table({"id": ["1", "two"]}, schema=forged), task.file.fs_path)
    with pytest.raises(FormatError, match=r"\.parquet: column 'id' \(field id 1\) cannot be read as long"):
        table.scan().to_arrow()


def _as_position_delete_files(table: EncryptedTable) -> None:
    """Replace the table's deletion vectors by v2 position-delete files (encrypted Parquet,
    the reserved file_path/pos columns, one per data file, ``referenced_data_file`` set),
    as a format-2 writer leaves them; icecrypt's own delete() writes DVs only."""
    from tablelib import current_manifests, rewrite_chain

    def field(name, type_, field_id):
        return pa.field(name, type_, nullable=False, metadata={b"PARQUET:field_id": str(field_id).encode()})

    schema = pa.schema([field("file_path", pa.string(), 2147483546), field("pos", pa.int64(), 2147483545)])

    def replace(entries: list[dict]) -> list[dict]:
        for n, entry in enumerate(entries):
            dv = entry["data_file"]
            positions = sorted(_dv_positions(table, dv))
            path = str(Path(table.fs_path(table.location)) / "data" / f"pos-deletes-{n}.parquet")
            rows = pa.table({"file_path": [dv["referenced_data_file"]] * len(positions), "pos": positions}, schema=schema)
            key = parquet.write_table(rows, path, key_length=16)
            entry["data_file"] = {**dv, "file_path": path, "file_format": "PARQUET", "record_count": len(positions),
                                  "file_size_in_bytes": key.file_length, "key_metadata": key.encode(),
                                  "content_offset": None, "content_size_in_bytes": None}  # fmt: skip
        return entries

    index = next(i for i, m in enumerate(current_manifests(table)) if m.is_deletes)
    rewrite_chain(table, index, replace)


def _dv_positions(table: EncryptedTable, dv: dict) -> list[int]:
    target = w._Target.of(table)
    io = target.io(target.manager(table.metadata))
    return [int(p) for p in w._read_dv(io, dv)]


def test_position_delete_files_with_lineage_through_rewrite_and_rekey(small, kms):
    from tablelib import reload

    before = _lineage(small)
    _as_position_delete_files(small)
    table = reload(small)
    tasks = table.scan().plan_files()
    assert {d.file_format for t in tasks for d in t.deletes} == {"PARQUET"}  # no DV left
    assert _lineage(table) == before
    marked = table.scan(columns=["id", "_pos", "_row_id", "_deleted"]).to_arrow().to_pylist()
    assert sorted(r["id"] for r in marked if r["_deleted"]) == [1, 9]
    assert all(r["_row_id"] == r["id"] for r in marked)  # ids 0-11 were appended in order
    table.rewrite_data_files(options={"delete-ratio-threshold": "0.01"})  # files with deletes
    assert _lineage(table) == before
    assert not [t for t in table.scan().plan_files() if t.deletes]
    table.rekey(everything=True)
    assert _lineage(EncryptedTable.load(table.metadata_location, kms=kms)) == before


def test_rewritten_avro_files_store_the_lineage_columns(tmp_path, kms):
    from icecrypt import avro

    table = _create(tmp_path / "t", kms, **{"write.format.default": "avro"})
    for i in range(3):
        table.append(_rows(range(i * 10, i * 10 + 10), part=0))
    table.delete("id = 4 or id = 25")
    before = _lineage(table)
    table.rewrite_data_files(options={"rewrite-all": "true"})
    assert _lineage(table) == before
    (task,) = table.scan().plan_files()
    assert task.file.file_format == "AVRO"
    stored = avro.read_schema(task.file.fs_path, task.file.key())
    assert stored.names == ["id", "part", "s", *LINEAGE]
    assert [int(stored.field(n).metadata[b"PARQUET:field_id"]) for n in LINEAGE] == [ROW_ID_FIELD, SEQ_FIELD]
    rows = avro.read(task.file.fs_path, task.file.key(), columns=["id", *LINEAGE]).to_pylist()
    assert {r["id"]: (r["_row_id"], r["_last_updated_sequence_number"]) for r in rows} == before


def _lowered(table: EncryptedTable, kms, name: str, was: int, value: int) -> EncryptedTable:
    """The table with its current metadata.json's ``name`` changed from ``was`` to
    ``value`` in place (what write access to the storage allows), loaded afresh."""
    import json

    path = Path(table.metadata_location)
    metadata = without_authenticator(json.loads(path.read_text(encoding="utf-8")))  # as another writer leaves it
    assert metadata[name] == was
    metadata[name] = value
    path.write_text(json.dumps(metadata), encoding="utf-8")
    return EncryptedTable.load(str(path), kms=kms)


def _files(table: EncryptedTable) -> list[Path]:
    return sorted(p for p in Path(table.fs_path(table.location)).rglob("*") if p.is_file())


_COMMITS = {
    "append": lambda table: table.append(_rows([100])),
    "rewrite": lambda table: table.rewrite_data_files(options={"rewrite-all": "true"}),
    "rewrite_manifests": lambda table: table.rewrite_manifests(force=True),
}


def _refused(table: EncryptedTable, operation: str, match: str) -> None:
    """``operation`` fails with FormatError matching ``match``, commits nothing and leaves
    no file behind."""
    from icecrypt.errors import FormatError

    files, snapshot = _files(table), table.current_snapshot_id
    with pytest.raises(FormatError, match=match):
        _COMMITS[operation](table)
    assert table.refresh().current_snapshot_id == snapshot
    assert _files(table) == files


@pytest.mark.parametrize("operation", ["append", "rewrite"])
def test_a_lowered_next_row_id_is_refused_not_reused(small, kms, operation):
    """next-row-id lives in plain metadata.json: an attacker who lowers it must not make
    new rows take the ids of existing ones.  The authenticated manifest list says which
    ids are taken; the commit is refused and leaves nothing behind."""
    before = _lineage(small)
    table = _lowered(small, kms, "next-row-id", 12, 3)
    _refused(table, operation, r"next-row-id 3 is below the row ids manifest .*-m\d\.avro holds \(up to 1[01]\)")
    assert _lineage(table) == before


@pytest.mark.parametrize("operation", ["append", "rewrite_manifests"])
def test_a_lowered_last_sequence_number_is_refused(small, kms, operation):
    """last-sequence-number is plain metadata.json too: lowered, new rows would get an old
    _last_updated_sequence_number and deletes would order wrongly.  The manifest list's
    (authenticated) sequence numbers say which are taken."""
    table = _lowered(small, kms, "last-sequence-number", 3, 1)
    _refused(table, operation, r"sequence number 2 .* is not above sequence number [23] that manifest ")

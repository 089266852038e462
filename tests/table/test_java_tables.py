"""Reading the tables Iceberg Java wrote (../shared/tables): every snapshot, projections,
filters with pruning, time travel, splits, streaming and distributed tasks."""

from __future__ import annotations

import functools
import gzip
import pickle

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyiceberg.expressions import (
    And,
    EqualTo,
    GreaterThanOrEqual,
    In,
    IsNull,
    LessThan,
    Not,
    Or,
)
from tablelib import (
    TABLE_NAMES,
    canonical_lines,
    expected,
    location_map,
    metadata_path,
    sort_table,
    table_digest,
)
from vectorlib import TABLES_DIR

from icecrypt.kms.memory import MemoryKms
from icecrypt.table import EncryptedTable, FileScanTask, read_task

SNAPSHOTS = [(name, s["snapshot_id"]) for name in TABLE_NAMES for s in expected(name)["snapshots"]]


def _snapshot(name: str, snapshot_id: int) -> dict:
    return next(s for s in expected(name)["snapshots"] if s["snapshot_id"] == snapshot_id)


@pytest.mark.parametrize(("name", "snapshot_id"), SNAPSHOTS)
def test_every_snapshot_matches_java(golden, name, snapshot_id):
    table = golden(name)
    rows = table.scan(snapshot_id=snapshot_id).to_arrow()
    want = _snapshot(name, snapshot_id)
    assert rows.num_rows == want["expected_row_count"]
    assert table_digest(rows) == want["expected_digest_sha256"]


@pytest.mark.parametrize("name", TABLE_NAMES)
def test_current_state_rows_equal_java_rows(golden, name):
    table = golden(name)
    info = expected(name)
    assert table.current_snapshot_id == info["expected"]["snapshot_id"]
    with gzip.open(TABLES_DIR / name / info["expected"]["rows_file"], "rt", encoding="ascii") as f:
        java_lines = f.read().splitlines()
    ours = sorted(canonical_lines(table.scan().to_arrow()))
    assert ours == java_lines


@pytest.mark.parametrize("name", TABLE_NAMES)
def test_schema_properties_and_snapshots(golden, name):
    table = golden(name)
    info = expected(name)
    assert table.encrypted and table.format_version == 3
    assert table.properties == info["table_properties"]
    assert [f.name for f in table.schema.fields] == [f["name"] for f in info["schema"]["fields"]]
    snapshots = table.snapshots()
    assert [s.snapshot_id for s in snapshots] == [s["snapshot_id"] for s in info["snapshots"]]
    assert [s.key_id for s in snapshots] == [s["key_id"] for s in info["snapshots"]]
    arrow = table.scan().arrow_schema
    assert [f.name for f in arrow] == [f.name for f in table.schema.fields]
    assert arrow.field("id").metadata[b"PARQUET:field_id"] == b"1"
    assert not arrow.field("id").nullable and arrow.field("note").nullable


def test_load_by_uri_through_the_location_map(kms):
    name = "enc_parquet_dek16"
    uri = "s3://icecrypt-golden/enc_parquet_dek16/" + expected(name)["metadata_location"]
    table = EncryptedTable.load(uri, kms=kms, location_map=location_map(name))
    assert table.metadata_location == str(metadata_path(name))
    assert table.scan().to_arrow().num_rows == expected(name)["expected"]["row_count"]


def test_encrypted_table_needs_a_kms():
    name = "enc_parquet_dek16"
    with pytest.raises(ValueError, match="encrypted.*no KMS"):
        EncryptedTable.load(metadata_path(name), location_map=location_map(name))


def test_s3_location_without_map_is_refused(kms):
    """The table directory holding the metadata is not the s3:// location it records: a
    load by path is refused before anything is read (TableIdentityError, a ValueError)."""
    name = "enc_parquet_dek16"
    with pytest.raises(ValueError, match="s3://.*location_map"):
        EncryptedTable.load(metadata_path(name), kms=kms)


# --- projection ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", TABLE_NAMES)
def test_projection_keeps_requested_order(golden, name):
    table = golden(name)
    full = sort_table(table.scan().to_arrow())
    part = sort_table(table.scan(columns=["price", "id", "category"]).to_arrow())
    assert part.column_names == ["price", "id", "category"]
    assert part.equals(full.select(["price", "id", "category"]))


def test_projection_without_columns_counts_rows(golden):
    table = golden("enc_deletes_dek16")
    empty = table.scan(columns=[]).to_arrow()
    assert empty.num_columns == 0
    assert empty.num_rows == expected("enc_deletes_dek16")["expected"]["row_count"]
    assert table.scan().count() == empty.num_rows


def test_unknown_column_is_an_error(golden):
    with pytest.raises(ValueError, match="nope"):
        golden("enc_parquet_dek16").scan(columns=["id", "nope"])
    with pytest.raises(ValueError, match="nope"):
        golden("enc_parquet_dek16").scan(row_filter="nope > 1")
    with pytest.raises(ValueError, match="cannot parse row filter 'id >>> 1' \\(at character"):
        golden("enc_parquet_dek16").scan(row_filter="id >>> 1")


# --- filters and pruning -------------------------------------------------------------------------

FILTERS = [
    "category = 'alpha'",
    "category = 'gamma' and id > 11000",
    "id < 150",
    "id >= 7990 and id <= 8010",
    "note is null",
    "price > 100.50 or flag = true",
    "category in ('beta', 'gamma') and qty < 0",
    "not (category = 'beta')",
    "event_date >= '2026-01-01'",
]


def _reference(full: pa.Table, predicate) -> pa.Table:
    return sort_table(full.filter(predicate))


@functools.cache
def _all_rows(name: str) -> pa.Table:
    """Every row of a shared table's current snapshot (read once per session)."""
    table = EncryptedTable.load(metadata_path(name), kms=MemoryKms.with_iceberg_test_keys(), location_map=location_map(name))
    return table.scan().to_arrow()


@pytest.mark.parametrize("name", TABLE_NAMES)
@pytest.mark.parametrize("row_filter", FILTERS)
def test_filters_match_a_filter_over_all_rows(golden, name, row_filter):
    """Pruning (manifests, files) and exact row filtering together give exactly the rows
    that the same predicate selects from an unpruned full scan."""
    from pyiceberg.expressions.parser import parse
    from pyiceberg.expressions.visitors import bind
    from pyiceberg.io.pyarrow import expression_to_pyarrow

    table = golden(name)
    full = _all_rows(name)
    predicate = expression_to_pyarrow(bind(table.schema, parse(row_filter), True), table.schema)
    got = sort_table(table.scan(row_filter=row_filter).to_arrow())
    assert got.equals(_reference(full, predicate))


def test_partition_filter_prunes_manifests_and_files(golden):
    table = golden("enc_parquet_dek16")
    scan = table.scan(row_filter="category = 'gamma'")
    rows = scan.to_arrow()
    assert set(rows.column("category").to_pylist()) == {"gamma"}
    assert scan.metrics.manifests == 2 and scan.metrics.manifests_skipped == 1  # first append has no gamma
    assert {t.file.path.split("/")[-2] for t in scan.plan_files()} == {"category=gamma"}


def test_metrics_filter_prunes_files(golden):
    table = golden("enc_parquet_dek16")
    everything = table.scan()
    everything.plan_files()
    scan = table.scan(row_filter=LessThan("id", 100))
    rows = scan.to_arrow()
    assert scan.metrics.data_files_skipped > 0
    assert len(scan.plan_files()) < len(everything.plan_files())
    assert sorted(rows.column("id").to_pylist()) == sorted(
        i for i in table.scan(columns=["id"]).to_arrow().column("id").to_pylist() if i < 100
    )
    nothing = table.scan(row_filter="id > 1000000000")
    assert nothing.plan_files() == [] and nothing.to_arrow().num_rows == 0
    assert nothing.metrics.data_files_skipped == nothing.metrics.data_files > 0


def test_pyiceberg_expressions_are_accepted(golden):
    table = golden("enc_deletes_dek16")
    expr = Or(And(EqualTo("category", "alpha"), GreaterThanOrEqual("qty", 100)), And(In("category", {"gamma"}), Not(IsNull("note"))))
    by_string = table.scan(row_filter="(category = 'alpha' and qty >= 100) or (category = 'gamma' and note is not null)")
    assert sort_table(table.scan(row_filter=expr).to_arrow()).equals(sort_table(by_string.to_arrow()))


def test_filter_columns_need_not_be_projected(golden):
    table = golden("enc_deletes_dek16")
    got = table.scan(columns=["id"], row_filter="qty > 500 and category = 'beta'").to_arrow()
    full = table.scan().to_arrow()
    want = full.filter(pc.and_(pc.greater(full["qty"], 500), pc.equal(full["category"], "beta")))
    assert got.column_names == ["id"]
    assert sorted(got.column("id").to_pylist()) == sorted(want.column("id").to_pylist())


# --- time travel, deletes ----------------------------------------------------------------------------


def test_time_travel_sees_the_deletes_of_each_snapshot(golden):
    table = golden("enc_deletes_dek16")
    s1, s2, s3, s4 = (s.snapshot_id for s in table.snapshots())
    ids = {sid: set(table.scan(columns=["id"], snapshot_id=sid).to_arrow().column("id").to_pylist()) for sid in (s1, s2, s3, s4)}
    dv_deleted = ids[s1] - ids[s2]
    eq_deleted = ids[s2] - ids[s3]
    assert len(dv_deleted) == 400 and len(eq_deleted) == 321
    assert all(i % 13 == 0 for i in eq_deleted)
    assert ids[s3] <= ids[s4] and len(ids[s4] - ids[s3]) == 2500  # the later append is not hit
    alpha = table.scan(columns=["id"], row_filter="category = 'alpha'", snapshot_id=s2).to_arrow()
    assert alpha.num_rows == 4000 - 400


def test_delete_files_are_attached_to_the_right_tasks(golden):
    table = golden("enc_deletes_dek16")
    tasks = table.scan().plan_files()
    by_partition = {t.partition: t for t in tasks}
    assert [d.file_format for d in by_partition[("alpha",)].deletes] == ["PUFFIN"]
    assert [d.equality_ids for d in by_partition[("beta",)].deletes] == [(1,)]
    assert by_partition[("gamma",)].deletes == ()  # appended after both deletes
    gamma = table.scan(row_filter="category = 'gamma'")
    gamma.plan_files()
    assert gamma.metrics.delete_files == 0  # the deletes of other partitions are pruned


def test_unknown_snapshot(golden):
    with pytest.raises(KeyError, match="no snapshot 42"):
        golden("enc_parquet_dek16").scan(snapshot_id=42)


# --- splits, streaming, tasks -------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "split_size"), [("enc_parquet_dek16", 40_000), ("enc_deletes_dek16", 40_000), ("enc_avro_dek16", 300_000)])
def test_splits_read_every_row_once(golden, name, split_size):
    table = golden(name)
    whole = table.scan()
    split = table.scan(split_size=split_size)
    assert len(split.plan_files()) > len(whole.plan_files())
    assert table_digest(split.to_arrow()) == expected(name)["expected"]["digest_sha256"]


def test_to_batches_streams_the_same_rows(golden):
    table = golden("enc_deletes_dek16")
    reader = table.scan(batch_size=1000).to_batches()
    assert isinstance(reader, pa.RecordBatchReader)
    sizes = []
    batches = []
    for batch in reader:
        sizes.append(batch.num_rows)
        batches.append(batch)
    assert max(sizes) <= 1000 and len(sizes) > 10
    streamed = pa.Table.from_batches(batches, schema=reader.schema)
    assert table_digest(streamed) == expected("enc_deletes_dek16")["expected"]["digest_sha256"]


def test_tasks_pickle_and_read_anywhere(golden):
    table = golden("enc_deletes_dek16")
    scan = table.scan(columns=["id", "category"], row_filter="qty > 0", split_size=40_000)
    tasks = [pickle.loads(pickle.dumps(t)) for t in scan.plan_files()]
    assert all(isinstance(t, FileScanTask) for t in tasks)
    rows = pa.Table.from_batches([b for t in tasks for b in read_task(t)], schema=scan.arrow_schema)
    assert sort_table(rows).equals(sort_table(scan.to_arrow()))


def test_task_repr_shows_no_key(golden):
    table = golden("enc_deletes_dek16")
    for task in table.scan().plan_files():
        shown = repr(task)
        for km in [task.file.key(), *(d.key() for d in task.deletes)]:
            assert km.encryption_key.hex() not in shown
            assert km.encryption_key not in shown.encode("latin-1")
        assert "key_metadata" not in shown


def test_row_groups_are_pruned_by_their_statistics(golden):
    """Within a file, row groups whose statistics exclude the filter are not read."""
    import pyarrow.compute as pc

    from icecrypt import parquet
    from icecrypt.table.files.read import _row_group_filter

    table = golden("enc_parquet_dek16")
    task = next(t for t in table.scan(row_filter="id < 300").plan_files() if t.file.record_count == 4000)
    pf = parquet.open_file(task.file.fs_path, task.file.key())
    might_match = _row_group_filter(task, pf.schema_arrow, table.schema)
    kept = []
    for index in range(pf.metadata.num_row_groups):
        ids = pf.read_row_group(index, columns=["id"]).column("id")
        assert might_match(pf.metadata.row_group(index)) == (pc.min(ids).as_py() < 300)
        kept.append(might_match(pf.metadata.row_group(index)))
    assert kept.count(True) == 1 and len(kept) == 3

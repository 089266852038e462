"""Tables partitioned by identity or bucket of a uuid column: append, scan with partition
pruning, metadata tables, and the manifest's partition value as Iceberg Java writes it
(Avro fixed[16] with logical type uuid: the uuid's 16 big-endian bytes)."""

from __future__ import annotations

import uuid

import mmh3
import pyarrow as pa
import pytest
from pyiceberg.expressions import EqualTo, In
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import BucketTransform, IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType, UUIDType
from tablelib import reload, sort_table, table_digest

from icecrypt.parquet import read_table
from icecrypt.table import EncryptedTable
from icecrypt.table.ops.write import _read_entries, _read_manifest_list, _Target

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "u", UUIDType()),
    NestedField(3, "name", StringType()),
)
BUCKETS = 4
TRANSFORMS = {"identity": IdentityTransform(), "bucket": BucketTransform(BUCKETS)}
# no column metrics: a data file can then be skipped by its partition value alone
NO_METRICS = {"write.metadata.metrics.default": "none"}

# spread over the whole range, so that min/max alone would never separate them
UUIDS = [uuid.UUID(int=(i * 0x9E3779B97F4A7C15_F39CC0605CEDC834) % 2**128) for i in range(1, 9)]


def _bucket(value: uuid.UUID) -> int:
    """The spec's bucket: Murmur3 (x86, 32-bit, seed 0) of the 16 big-endian bytes."""
    return (mmh3.hash(value.bytes) & 0x7FFFFFFF) % BUCKETS


def _rows(lo: int, hi: int) -> pa.Table:
    ids = list(range(lo, hi))
    values = [None if i % 9 == 0 else UUIDS[i % len(UUIDS)] for i in ids]
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "u": pa.array([None if v is None else v.bytes for v in values], pa.uuid()),
        "name": pa.array([f"row-{i}" for i in ids]),
    })  # fmt: skip


def _create(tmp_path, kms, transform: str, **kwargs) -> EncryptedTable:
    spec = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=TRANSFORMS[transform], name="u_part"))
    return EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA", partition_spec=spec, **kwargs)


def _partition_of(transform: str, value: uuid.UUID | None):
    if value is None:
        return None
    return value if transform == "identity" else _bucket(value)


def _raw_entries(table: EncryptedTable) -> list[dict]:
    target = _Target.of(table)
    manager = target.manager(table.metadata)
    io = target.io(manager)
    snapshot = next(s for s in table.metadata["snapshots"] if s["snapshot-id"] == table.metadata["current-snapshot-id"])
    return [e for m in _read_manifest_list(io, manager, snapshot) for e in _read_entries(io, m)]


def test_bucket_of_uuid_is_the_spec_hash():
    """The spec's own example: bucket hash of f79c3e09-677c-4bbd-a479-3f349cb785e7 is
    1488055340; the writer's transform agrees with the independent computation."""
    value = uuid.UUID("f79c3e09-677c-4bbd-a479-3f349cb785e7")
    assert mmh3.hash(value.bytes) == 1488055340
    function = BucketTransform(BUCKETS).transform(UUIDType())
    assert [function(u) for u in UUIDS] == [_bucket(u) for u in UUIDS]


@pytest.mark.parametrize("transform", ["identity", "bucket"])
def test_append_scan_and_prune(tmp_path, kms, transform):
    table = _create(tmp_path, kms, transform, properties=NO_METRICS)
    rows = _rows(0, 60)
    table.append(rows)
    table = reload(table)
    assert table_digest(sort_table(table.scan().to_arrow())) == table_digest(rows)

    # every data file holds the rows of its partition value, and only those
    tasks = table.scan().plan_files()
    expected_parts = {_partition_of(transform, u) for u in [None, *UUIDS]}
    assert {t.partition[0] for t in tasks} == expected_parts
    for task in tasks:
        stored = read_table(task.file.fs_path, task.file.key_metadata)
        values = [None if b is None else uuid.UUID(bytes=b) for b in stored.column("u").cast(pa.binary(16)).to_pylist()]
        assert {_partition_of(transform, v) for v in values} == {task.partition[0]}

    for target in (UUIDS[2], UUIDS[5]):
        for row_filter in (EqualTo("u", target), f"u = '{target}'"):
            scan = table.scan(row_filter=row_filter)
            got = scan.to_arrow()
            want = rows.filter(pa.compute.equal(rows.column("u").cast(pa.binary(16)), pa.scalar(target.bytes, pa.binary(16))))
            assert got.num_rows == want.num_rows > 0
            assert table_digest(sort_table(got)) == table_digest(want)
            planned = scan.plan_files()
            assert {t.partition[0] for t in planned} == {_partition_of(transform, target)}
            assert scan.metrics.data_files_skipped == len(tasks) - 1  # pruned by partition alone

    scan = table.scan(row_filter=In("u", {UUIDS[0], UUIDS[1]}))
    assert sorted(scan.to_arrow().column("id").to_pylist()) == [i for i in range(60) if i % 9 and i % 8 in (0, 1)]


@pytest.mark.parametrize("transform", ["identity", "bucket"])
def test_manifest_partition_value_and_metadata_tables(tmp_path, kms, transform):
    """The manifest holds the uuid as Java does (16 bytes; the bucket as an int) and
    reads back to the same value; partitions() and files() show it; a second append,
    which carries the first manifest's entries over, keeps it."""
    table = _create(tmp_path, kms, transform)
    table.append(_rows(0, 30))
    table.append(_rows(30, 50))
    table = reload(table)
    entries = _raw_entries(table)
    stored = {e["data_file"]["partition"]["u_part"] for e in entries}
    if transform == "identity":
        assert stored == {None, *(u.bytes for u in UUIDS)}
    else:
        assert stored == {None, *(_bucket(u) for u in UUIDS)}

    want = {_partition_of(transform, u) for u in [None, *UUIDS]}
    partitions = table.inspect.partitions().to_pylist()
    assert {p["partition"]["u_part"] for p in partitions} == want
    assert sum(p["record_count"] for p in partitions) == 50
    files = table.inspect.files().to_pylist()
    assert {f["partition"]["u_part"] for f in files} == want
    assert table_digest(sort_table(table.scan().to_arrow())) == table_digest(_rows(0, 50))


def test_dynamic_overwrite_replaces_uuid_partition(tmp_path, kms):
    table = _create(tmp_path, kms, "identity")
    table.append(_rows(0, 30))
    replacement = _rows(0, 30).filter(pa.compute.equal(pa.compute.field("id"), 3))  # one row in UUIDS[3]'s partition
    replacement = replacement.set_column(2, "name", pa.array(["new"]))
    from icecrypt.table.ops.rowlevel import dynamic_partition_overwrite

    dynamic_partition_overwrite(table, replacement)
    got = reload(table).scan(row_filter=EqualTo("u", UUIDS[3])).to_arrow()
    assert got.column("name").to_pylist() == ["new"]
    assert reload(table).scan().to_arrow().num_rows == 30 - len([i for i in range(30) if i % 9 and i % 8 == 3]) + 1
    # one partition changed: the manifest's 16 bytes and the new rows' UUID count once
    assert reload(table).current_snapshot().summary["changed-partition-count"] == "1"


@pytest.mark.parametrize("row_filter", ["eq", "in", "not_in", "ne", "and"])
def test_row_filter_on_uuid_column(tmp_path, kms, row_filter):
    """Arrow has no compute kernel for its uuid type: the row filter still selects the
    rows of an unpartitioned table, combined with other columns too."""
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA")
    rows = _rows(0, 40)
    table.append(rows)
    values = {i: None if i % 9 == 0 else UUIDS[i % len(UUIDS)] for i in range(40)}
    expression, keep = {
        "eq": (f"u = '{UUIDS[4]}'", lambda i, v: v == UUIDS[4]),
        "in": (In("u", {UUIDS[4], UUIDS[6]}), lambda i, v: v in (UUIDS[4], UUIDS[6])),
        # as for any other column type: NOT IN keeps nulls (a null is in no set), != does not
        "not_in": (f"u NOT IN ('{UUIDS[4]}', '{UUIDS[6]}')", lambda i, v: v not in (UUIDS[4], UUIDS[6])),
        "ne": (f"u != '{UUIDS[1]}'", lambda i, v: v is not None and v != UUIDS[1]),
        "and": (f"u = '{UUIDS[4]}' AND id > 20", lambda i, v: v == UUIDS[4] and i > 20),
    }[row_filter]
    got = reload(table).scan(row_filter=expression).to_arrow()
    assert sorted(got.column("id").to_pylist()) == [i for i, v in values.items() if keep(i, v)]


@pytest.mark.parametrize("transform", ["identity", "bucket"])
def test_pyiceberg_reads_plaintext_variant(tmp_path, transform):
    """PyIceberg reads the plaintext variant's manifests: the partition value as written
    (a UUID from the 16 bytes, or the bucket), the same rows; it prunes a bucket table
    with them.  (Its own pruning of an identity(uuid) table compares the UUID it reads
    with the bytes its uuid literal holds and skips every file, and its Arrow row filter
    has no uuid kernel: PyIceberg's known limitations, so not asserted here.)"""
    from pyiceberg.table import StaticTable

    spec = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=TRANSFORMS[transform], name="u_part"))
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=None, table_key_id=None, partition_spec=spec)
    table.append(_rows(0, 40))
    static = StaticTable.from_metadata(reload(table).metadata_location)
    assert sorted(static.scan().to_arrow().column("id").to_pylist()) == list(range(40))
    partitions = {f.file.partition[0] for f in static.scan().plan_files()}
    assert partitions == {_partition_of(transform, u) for u in [None, *UUIDS]}
    if transform == "bucket":
        files = list(static.scan(row_filter=EqualTo("u", UUIDS[3])).plan_files())
        assert {f.file.partition[0] for f in files} == {_bucket(UUIDS[3])}


@pytest.mark.parametrize("value", ["not-a-uuid", "0123456789abcdef0123"])
def test_manifest_with_a_malformed_uuid_partition_value(tmp_path, kms, value):
    """A manifest whose writer schema holds the uuid partition value as a string that is
    no uuid (a writer with the key, or storage of a plaintext table): reading the table
    fails with FormatError naming the manifest, and so does a dynamic overwrite that
    compares partitions, not a bare ValueError."""
    from tablelib import rewrite_chain

    from icecrypt.errors import FormatError

    table = _create(tmp_path, kms, "identity")
    table.append(_rows(0, 10))
    table = reload(table)

    def change(entries: list[dict]) -> list[dict]:
        for entry in entries:
            entry["data_file"]["partition"]["u_part"] = value
        return entries

    rewrite_chain(table, 0, change, schema_change=_partition_as_string)
    with pytest.raises(FormatError, match=r"manifest .*-m0\.avro: malformed entry"):
        reload(table).scan().to_arrow()
    from icecrypt.table.ops.rowlevel import dynamic_partition_overwrite

    with pytest.raises(FormatError, match=r"data file .*\.parquet: its partition \['u_part'\] does not hold values"):
        dynamic_partition_overwrite(reload(table), _rows(0, 10))


def _partition_as_string(schema: dict) -> dict:
    (data_file,) = [f for f in schema["fields"] if f["name"] == "data_file"]
    (partition,) = [f for f in data_file["type"]["fields"] if f["name"] == "partition"]
    for field in partition["type"]["fields"]:
        field["type"] = ["null", "string"]
    return schema


@pytest.mark.parametrize("file_format", ["avro", "parquet"])
def test_uuid_bounds_of_avro_and_parquet_data_files(tmp_path, kms, file_format):
    """A uuid column's bounds are its 16 bytes in unsigned order, whether the footer
    gives them (Parquet) or the writer computes them (Avro, which had no Arrow kernel)."""
    table = _create(tmp_path, kms, "bucket", properties={"write.format.default": file_format})
    rows = _rows(0, 40)
    table.append(rows)
    table = reload(table)
    for entry in _raw_entries(table):
        data_file = entry["data_file"]
        assert data_file["file_format"] == file_format.upper()
        bucket = data_file["partition"]["u_part"]
        if bucket is None:
            continue
        held = sorted(u.bytes for u in UUIDS if _bucket(u) == bucket)
        bounds = {b["key"]: b["value"] for b in data_file["lower_bounds"]}, {b["key"]: b["value"] for b in data_file["upper_bounds"]}
        assert (bounds[0][2], bounds[1][2]) == (held[0], held[-1])
    got = table.scan(row_filter=EqualTo("u", UUIDS[7])).to_arrow()
    assert sorted(got.column("id").to_pylist()) == [i for i in range(40) if i % 9 and i % 8 == 7]


def test_sort_order_on_a_uuid_column(tmp_path, kms):
    """A table sorted by a uuid column (Arrow cannot sort its uuid type) writes its
    files in the uuids' unsigned byte order, nulls last, descending as asked."""
    from icecrypt.table import read_task

    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA")
    table.replace_sort_order().desc("u", null_order="nulls-last").asc("id").commit()
    table.append(_rows(0, 40))
    (task,) = reload(table).scan().plan_files()
    stored = pa.Table.from_batches(list(read_task(task, table.filesystem)))
    keys = [(None if b is None else bytes(b), i) for b, i in
            zip(stored.column("u").cast(pa.binary(16)).to_pylist(), stored.column("id").to_pylist())]  # fmt: skip
    present = [k for k in keys if k[0] is not None]
    assert keys == present + [k for k in keys if k[0] is None]
    assert present == sorted(present, key=lambda k: (tuple(-b for b in k[0]), k[1]))
    assert sorted(stored.column("id").to_pylist()) == list(range(40))


@pytest.mark.parametrize("transform", ["identity", "bucket"])
def test_partition_metadata_column(tmp_path, kms, transform):
    """The ``_partition`` metadata column of a uuid-partitioned table holds each row's
    partition value (Arrow builds no uuid scalar from Python values)."""
    table = _create(tmp_path, kms, transform)
    table.append(_rows(0, 20))
    got = reload(table).scan(columns=["id", "u", "_partition"]).to_arrow().to_pylist()
    assert len(got) == 20
    for row in got:
        assert row["_partition"] == {"u_part": _partition_of(transform, row["u"])}

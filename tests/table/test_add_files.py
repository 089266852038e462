"""``EncryptedTable.add_files``: Parquet files another writer made, added as they are to a
plaintext table.  Their rows read back through ``scan()`` (by name, through the name
mapping the same commit sets), their partition from the caller's directory values or from
their statistics, their metrics from their footers; every refusal names the file and
leaves the table at the same version with the caller's files untouched."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import DayTransform, IdentityTransform
from pyiceberg.types import DoubleType, LongType, NestedField, StringType, TimestampType

from icecrypt.errors import PathOutsideTableError
from icecrypt.kms.memory import MemoryKms
from icecrypt.table import AddFilesError, EncryptedTable

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "region", StringType(), required=False),
    NestedField(3, "ts", TimestampType(), required=False),
    NestedField(4, "v", DoubleType(), required=False),
)
SPEC = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "region"),
                     PartitionField(3, 1001, DayTransform(), "ts_day"))
DAY = datetime.datetime(2026, 5, 1, 10)


def _rows(ids, *, region=True, day=DAY) -> pa.Table:
    columns = {"id": pa.array(ids, pa.int64())}
    if region:
        columns["region"] = pa.array(["eu"] * len(ids))
    columns["ts"] = pa.array([day + datetime.timedelta(minutes=i) for i in ids], pa.timestamp("us"))
    columns["v"] = pa.array([i / 2 for i in ids], pa.float64())
    return pa.table(columns)


@pytest.fixture
def table(tmp_path) -> EncryptedTable:
    return EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=None, table_key_id=None, partition_spec=SPEC)


def _put(table: EncryptedTable, relative: str, rows: pa.Table) -> str:
    path = Path(table.location.removeprefix("file:")) / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(rows, path)
    return str(path)


def _state(table: EncryptedTable) -> tuple[str, list[tuple[str, int]]]:
    root = Path(table.location.removeprefix("file:"))
    return table.refresh().metadata_location, sorted((str(p), p.stat().st_size) for p in root.rglob("*") if p.is_file())


def _scan(table: EncryptedTable, row_filter=None) -> list[tuple]:
    rows = (table.scan() if row_filter is None else table.scan(row_filter=row_filter)).to_arrow().to_pylist()
    return sorted((r["id"], r["region"]) for r in rows)


def test_partitions_from_directories_and_statistics_metrics_and_one_commit(table):
    hive = _put(table, "landing/region=us/a.parquet", _rows([1, 2], region=False))
    stats = _put(table, "landing/b.parquet", _rows([3, 4]))
    versions = len(table.metadata.get("metadata-log") or ())
    result = table.add_files([hive, stats], partition_values={hive: {"region": "us"}})
    assert (result.added_files, result.changed_partitions) == (2, 2)
    table.refresh()
    assert len(table.metadata["metadata-log"]) == versions + 1  # the mapping and the snapshot: one version
    mapping = json.loads(table.properties["schema.name-mapping.default"])
    assert {m["field-id"]: m["names"] for m in mapping} == {1: ["id"], 2: ["region"], 3: ["ts"], 4: ["v"]}
    assert _scan(table) == [(1, "us"), (2, "us"), (3, "eu"), (4, "eu")]
    assert _scan(table, "region = 'us'") == [(1, "us"), (2, "us")]
    files = {f["file_path"]: f for f in table.inspect.files().to_pylist()}
    assert set(files) == {hive, stats}
    assert files[hive]["partition"]["region"] == "us" and files[stats]["partition"]["region"] == "eu"
    assert files[hive]["partition"]["ts_day"] == files[stats]["partition"]["ts_day"] is not None
    assert files[stats]["record_count"] == 2 and files[stats]["file_size_in_bytes"] == Path(stats).stat().st_size
    assert dict(files[stats]["null_value_counts"])[1] == 0 and dict(files[stats]["value_counts"])[4] == 2
    # a later add keeps the mapping; the table is written as usual after the import
    table.append(_rows([5]))
    assert _scan(table) == [(1, "us"), (2, "us"), (3, "eu"), (4, "eu"), (5, "eu")]
    table.delete("id = 1")
    assert _scan(table) == [(2, "us"), (3, "eu"), (4, "eu"), (5, "eu")]
    # the caller's files are left where they were, untouched
    assert Path(hive).exists() and Path(stats).exists()


def _fieldids(rows: pa.Table) -> pa.Table:
    fields = [f.with_metadata({b"PARQUET:field_id": str(i + 1).encode()}) for i, f in enumerate(rows.schema)]
    return rows.cast(pa.schema(fields))


@pytest.mark.parametrize(("make", "error"), [
    (lambda t: _put(t, "x/a.parquet", _fieldids(_rows([1]))), "have field ids"),
    (lambda t: _put(t, "x/a.parquet", pa.table({"id": [1], "other": ["x"]})), "columns the table does not have: other"),
    (lambda t: _put(t, "x/a.parquet", pa.table({"id": ["one"]})), "do not match the table's"),
    (lambda t: _put(t, "x/a.parquet", pa.table({"id": [1, 2], "region": ["eu", "us"]})), "more than one partition"),
    (lambda t: str(Path(t.location.removeprefix("file:")) / "x" / "missing.parquet"), "does not exist"),
    (lambda t: (Path(t.location.removeprefix("file:")) / "notes.parquet").write_text("text") and
     str(Path(t.location.removeprefix("file:")) / "notes.parquet"), "not a Parquet file"),
])  # fmt: skip
def test_refusals_name_the_file_and_leave_everything(table, make, error):
    good = _put(table, "landing/good.parquet", _rows([9]))
    path = make(table)
    before = _state(table)
    with pytest.raises(AddFilesError, match=error) as info:
        table.add_files([good, path])
    assert path in str(info.value)
    assert _state(table) == before
    assert _scan(table) == []


def test_duplicates_outside_files_and_bad_values_are_refused(table, tmp_path):
    a = _put(table, "landing/a.parquet", _rows([1]))
    with pytest.raises(AddFilesError, match="named twice"):
        table.add_files([a, a])
    table.add_files([a])
    before = _state(table)
    with pytest.raises(AddFilesError, match="already data files of the table's current snapshot"):
        table.add_files([a])
    outside = tmp_path / "elsewhere.parquet"
    pq.write_table(_rows([2]), outside)
    with pytest.raises(PathOutsideTableError):
        table.add_files([str(outside)])
    b = _put(table, "landing/region=x/b.parquet", _rows([3], region=False))
    with pytest.raises(AddFilesError, match="partition values for ts"):
        table.add_files([b], partition_values={b: {"ts": "2026-01-01"}})
    with pytest.raises(TypeError):
        table.add_files(a)
    assert _state(table)[0] == before[0]
    assert _scan(table) == [(1, "eu")]
    assert table.add_files([a], check_duplicate_files=False).added_files == 1  # as Iceberg's flag says
    assert _scan(table) == [(1, "eu"), (1, "eu")]


def test_an_encrypted_table_refuses_before_reading_anything(tmp_path):
    kms = MemoryKms({"master": bytes(range(16))})
    table = EncryptedTable.create(str(tmp_path / "enc"), SCHEMA, kms=kms, table_key_id="master")
    path = _put(table, "landing/a.parquet", _rows([1]))
    before = _state(table)
    with pytest.raises(AddFilesError, match="the table is encrypted"):
        table.add_files([path])
    assert _state(table) == before


def test_the_cli_adds_a_directorys_files(table, capfd):
    from tablelib import run_cli

    root = Path(table.location.removeprefix("file:"))
    _put(table, "landing/region=eu/a.parquet", _rows([1, 2], region=False))
    _put(table, "landing/region=us/b.parquet", _rows([3], region=False))
    (root / "landing" / "_SUCCESS").write_text("")
    status, out, err = run_cli(capfd, "table", "add-files", root, root / "landing", "--partition-filter", "region=us")
    assert status == 0, err
    assert "added 1 file(s) in 1 partition(s)" in out
    status, out, err = run_cli(capfd, "table", "add-files", root, root / "landing")
    assert status != 0 and "already data files" in err
    status, out, err = run_cli(capfd, "table", "add-files", root, root / "landing" / "region=eu" / "a.parquet")
    assert status != 0 and "partition field 'region'" in err  # a file alone has no directory values
    status, out, err = run_cli(capfd, "table", "add-files", root, root / "landing", "--partition-filter",
                               "region=eu")
    assert status == 0, err
    assert _scan(table.refresh()) == [(1, "eu"), (2, "eu"), (3, "us")]

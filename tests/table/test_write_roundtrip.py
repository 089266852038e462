"""Tables written here read back: create, append (Parquet and Avro, partitioned or not),
overwrite, delete with deletion vectors, expiry; every snapshot at every step (time
travel), every file encrypted, keys and statistics where Iceberg puts them."""

from __future__ import annotations

import datetime
import decimal
import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pytest
from forgery import AUTHENTICATOR
from pyiceberg.conversions import from_bytes
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.transforms import BucketTransform, DayTransform, IdentityTransform, TruncateTransform, YearTransform
from pyiceberg.types import DateType, DoubleType, LongType, StringType, TimestampType
from tablelib import sort_table, table_digest
from vectorlib import TABLES_DIR

from icecrypt.keys import EncryptionManager, StandardKeyMetadata
from icecrypt.kms.memory import MemoryKms
from icecrypt.parquet import read_table
from icecrypt.table import EncryptedTable
from icecrypt.table.files.manifest_write import DELETED
from icecrypt.table.ops.write import _read_entries, _read_manifest_list, _Target

SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False),
    pa.field("category", pa.string(), nullable=False),
    pa.field("qty", pa.int32()),
    pa.field("amount", pa.float64()),
    pa.field("ts", pa.timestamp("us")),
    pa.field("event_date", pa.date32()),
    pa.field("price", pa.decimal128(10, 2)),
    pa.field("flag", pa.bool_()),
    pa.field("note", pa.string()),
    pa.field("blob", pa.binary()),
])  # fmt: skip

CATEGORY = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="category"))


def make_rows(lo: int, hi: int, seed: int = 0) -> pa.Table:
    """Rows with ids lo..hi-1: every column type of SCHEMA, nulls, NaNs, non-ASCII text."""
    rng = np.random.default_rng(seed + lo)
    ids = np.arange(lo, hi, dtype=np.int64)
    n = len(ids)
    amount = rng.normal(0, 1000, n)
    amount[ids % 97 == 5] = np.nan
    notes = [None if i % 5 == 0 else ("日本語" if i % 7 == 0 else f"note-{i}") for i in ids.tolist()]
    return pa.table(
        {
            "id": ids,
            "category": pa.array(np.array(["alpha", "beta", "gamma"])[ids % 3]),
            "qty": pa.array(rng.integers(-500, 1500, n).astype(np.int32), mask=ids % 11 == 0),
            "amount": amount,
            "ts": pa.array(1_700_000_000_000_000 + ids * 3_600_000_000 - 10**15 * (ids % 2), pa.timestamp("us")),
            "event_date": pa.array((19000 + ids % 400).astype(np.int32), pa.date32()),
            "price": pa.array([decimal.Decimal(int(v)).scaleb(-2) for v in rng.integers(-10**6, 10**6, n)],
                              pa.decimal128(10, 2)),
            "flag": pa.array(ids % 3 == 0, mask=ids % 13 == 0),
            "note": pa.array(notes, pa.string()),
            "blob": pa.array([bytes([i % 256]) * (i % 4) for i in ids.tolist()], pa.binary()),
        },
        schema=SCHEMA,
    )  # fmt: skip


def rows_of(table: EncryptedTable, snapshot_id: int | None = None) -> pa.Table:
    return sort_table(table.scan(snapshot_id=snapshot_id).to_arrow())


def digest(rows: pa.Table) -> str:
    return table_digest(sort_table(rows))


@pytest.fixture
def kms():
    return MemoryKms.with_iceberg_test_keys()


def stored_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def assert_all_encrypted(root: Path) -> None:
    """Fail closed: every file of the table but metadata.json and the hint is a natively
    encrypted Parquet file (PARE) or an AGS1 stream; no temporary file is left."""
    for path in stored_files(root):
        assert not path.name.startswith("."), f"leftover temporary file {path}"
        if path.name.endswith(".metadata.json") or path.name == "version-hint.text":
            continue
        magic = path.read_bytes()[:4]
        expected = b"PARE" if path.suffix == ".parquet" else b"AGS1"
        assert magic == expected, f"{path} starts with {magic!r}"


def manifests_and_entries(table: EncryptedTable, snapshot_id: int | None = None):
    """(manifest-list records, {manifest path: resolved entries}) of a snapshot, read
    the write path's way."""
    target = _Target.of(table)
    metadata = table.metadata
    manager = target.manager(metadata)
    io = target.io(manager)
    sid = snapshot_id or metadata["current-snapshot-id"]
    snapshot = next(s for s in metadata["snapshots"] if s["snapshot-id"] == sid)
    manifests = _read_manifest_list(io, manager, snapshot)
    return manifests, {m["manifest_path"]: _read_entries(io, m) for m in manifests}


# --- appends -----------------------------------------------------------------------------------


@pytest.mark.parametrize("file_format", ["parquet", "avro"])
@pytest.mark.parametrize("partitioned", [False, True], ids=["unpartitioned", "by_category"])
def test_appends_read_back_at_every_snapshot(tmp_path, kms, file_format, partitioned):
    table = EncryptedTable.create(
        str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA", partition_spec=CATEGORY if partitioned else None
    )
    chunks = [make_rows(0, 700), make_rows(700, 1500), make_rows(1500, 1600)]
    inputs = [chunks[0], chunks[1].to_batches(max_chunksize=128), pa.RecordBatchReader.from_batches(SCHEMA, chunks[2].to_batches())]
    snapshot_ids = [table.append(data, file_format=file_format) for data in inputs]

    assert [s.snapshot_id for s in table.snapshots()] == snapshot_ids
    assert table.current_snapshot_id == snapshot_ids[-1]
    for n, snapshot_id in enumerate(snapshot_ids):
        assert digest(table.scan(snapshot_id=snapshot_id).to_arrow()) == digest(pa.concat_tables(chunks[: n + 1]))
    # a fresh object sees the same (the table directory resolves to the newest version)
    again = EncryptedTable.load(str(tmp_path / "t"), kms=kms)
    assert again.current_snapshot_id == snapshot_ids[-1]
    assert digest(again.scan().to_arrow()) == digest(pa.concat_tables(chunks))

    metadata = table.metadata
    snapshots = metadata["snapshots"]
    assert [s["sequence-number"] for s in snapshots] == [1, 2, 3]
    assert [s.get("parent-snapshot-id") for s in snapshots] == [None] + snapshot_ids[:2]
    assert [(s["first-row-id"], s["added-rows"]) for s in snapshots] == [(0, 700), (700, 800), (1500, 100)]
    assert metadata["next-row-id"] == 1600 and metadata["last-sequence-number"] == 3
    assert [s["summary"]["total-records"] for s in snapshots] == ["700", "1500", "1600"]
    # one KEK (wrapped by the table key) and one wrapped manifest-list key per snapshot
    keys = metadata["encryption-keys"]
    assert [k["encrypted-by-id"] for k in keys] == ["keyA"] + [keys[0]["key-id"]] * 3
    assert [s["key-id"] for s in snapshots] == [k["key-id"] for k in keys[1:]]
    assert list(snapshots[0])[-1] == "key-id"
    assert_all_encrypted(tmp_path / "t")


def test_key_metadata_lengths_and_statistics(tmp_path, kms):
    table = EncryptedTable.create(
        str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA", partition_spec=CATEGORY,
        properties={"encryption.data-key-length": "32"},
    )  # fmt: skip
    rows = make_rows(0, 3000)
    table.append(rows)
    table.append(make_rows(3000, 3300), file_format="avro")
    fs = pafs.LocalFileSystem()
    manager = EncryptionManager.from_table_metadata(kms, table.metadata)
    snapshot = table.metadata["snapshots"][-1]
    list_key = manager.unwrap_manifest_list_key_metadata(snapshot["key-id"])
    assert list_key.key_length == 32 and list_key.file_length == fs.get_file_info(snapshot["manifest-list"]).size
    manifests, entries = manifests_and_entries(table)
    assert [m["first_row_id"] for m in manifests] == [3000, 0]
    for manifest in manifests:
        km = StandardKeyMetadata.decode(manifest["key_metadata"])
        assert km.key_length == 32 and km.file_length == manifest["manifest_length"]
        assert km.file_length == fs.get_file_info(manifest["manifest_path"]).size
    for entry in entries[manifests[1]["manifest_path"]]:  # the Parquet append
        data_file = entry["data_file"]
        km = StandardKeyMetadata.decode(data_file["key_metadata"])
        assert km.key_length == 32 and len(km.aad_prefix) == 16
        assert km.file_length == data_file["file_size_in_bytes"] == fs.get_file_info(data_file["file_path"]).size
        part = rows.filter(pc.field("category") == data_file["partition"]["category"])
        assert data_file["record_count"] == part.num_rows
        counts = {p["key"]: p["value"] for p in data_file["value_counts"]}
        nulls = {p["key"]: p["value"] for p in data_file["null_value_counts"]}
        nans = {p["key"]: p["value"] for p in data_file["nan_value_counts"]}
        lower = {p["key"]: p["value"] for p in data_file["lower_bounds"]}
        upper = {p["key"]: p["value"] for p in data_file["upper_bounds"]}
        assert counts[1] == part.num_rows and nulls[3] == part["qty"].null_count
        assert nans[4] == int(pc.sum(pc.is_nan(part["amount"])).as_py())
        assert from_bytes(LongType(), lower[1]) == pc.min(part["id"]).as_py()
        assert from_bytes(LongType(), upper[1]) == pc.max(part["id"]).as_py()
        finite = part["amount"].filter(pc.invert(pc.is_nan(part["amount"])))
        assert from_bytes(DoubleType(), upper[4]) == pc.max(finite).as_py()
        assert data_file["split_offsets"] and data_file["column_sizes"]
    for entry in entries[manifests[0]["manifest_path"]]:  # the Avro append
        data_file = entry["data_file"]
        assert data_file["file_format"] == "AVRO"
        km = StandardKeyMetadata.decode(data_file["key_metadata"])
        assert km.file_length == data_file["file_size_in_bytes"] == fs.get_file_info(data_file["file_path"]).size
        assert {p["key"] for p in data_file["lower_bounds"]} >= {1, 3, 4, 5, 6, 7}


def test_partition_transforms(tmp_path, kms):
    spec = PartitionSpec(
        PartitionField(source_id=5, field_id=1000, transform=DayTransform(), name="ts_day"),
        PartitionField(source_id=1, field_id=1001, transform=BucketTransform(4), name="id_bucket"),
        PartitionField(source_id=2, field_id=1002, transform=TruncateTransform(2), name="category_trunc"),
        PartitionField(source_id=6, field_id=1003, transform=YearTransform(), name="event_year"),
    )
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA", partition_spec=spec)
    rows = make_rows(0, 400)
    table.append(rows)
    assert digest(table.scan().to_arrow()) == digest(rows)
    scalar = {
        "ts_day": (5, DayTransform().transform(TimestampType())),
        "id_bucket": (1, BucketTransform(4).transform(LongType())),
        "category_trunc": (2, TruncateTransform(2).transform(StringType())),
        "event_year": (6, YearTransform().transform(DateType())),
    }
    _, entries = manifests_and_entries(table)
    (files,) = entries.values()
    assert len(files) > 4
    for entry in files:  # each file's partition tuple is the transform of every row in it
        data_file = entry["data_file"]
        stored = read_table(data_file["file_path"], data_file["key_metadata"])
        assert stored.num_rows == data_file["record_count"]
        for name, (column, function) in scalar.items():
            values = stored.column(column - 1)
            if pa.types.is_timestamp(values.type):
                internal = values.cast(pa.int64()).to_pylist()
            elif pa.types.is_date(values.type):
                internal = values.cast(pa.int32()).to_pylist()
            else:
                internal = values.to_pylist()
            got = data_file["partition"][name]
            if isinstance(got, datetime.date):
                got = (got - datetime.date(1970, 1, 1)).days
            assert {function(v) for v in internal} == {got}, name


# --- plaintext tables (the benchmark baseline) --------------------------------------------------------


def test_plaintext_table(tmp_path):
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=None, table_key_id=None, partition_spec=CATEGORY)
    first = make_rows(0, 500)
    table.append(first)
    table.append(make_rows(500, 600))
    everything = digest(pa.concat_tables([first, make_rows(500, 600)]))
    assert not table.encrypted
    assert digest(table.scan().to_arrow()) == everything
    assert "encryption-keys" not in table.metadata
    assert all("key-id" not in s for s in table.metadata["snapshots"])
    for path in stored_files(tmp_path / "t"):
        if path.suffix in (".parquet", ".avro"):
            assert path.read_bytes()[:4] in (b"PAR1", b"Obj\x01"), path
    with pytest.raises(ValueError, match="encrypted only"):
        table.append(first, file_format="avro")
    assert digest(table.scan().to_arrow()) == everything
    # the other operations work on plaintext tables too (and write plaintext files)
    table.delete("id < 50")
    assert digest(table.scan().to_arrow()) == digest(pa.concat_tables([first, make_rows(500, 600)]).slice(50))
    puffins = [p for p in stored_files(tmp_path / "t") if p.suffix == ".puffin"]
    assert puffins and all(p.read_bytes()[:4] == b"PFA1" for p in puffins)
    table.overwrite(make_rows(7000, 7100))
    assert table.expire_snapshots(2**62)
    assert digest(table.scan().to_arrow()) == digest(make_rows(7000, 7100))
    assert table.verify().ok


# --- overwrite and delete ------------------------------------------------------------------------------


def test_overwrite_replaces_every_row(tmp_path, kms):
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA", partition_spec=CATEGORY)
    old = make_rows(0, 900)
    first = table.append(old)
    table.delete("id < 50")
    replacement = make_rows(10_000, 10_300, seed=3)
    snapshot_id = table.overwrite(replacement)
    assert digest(table.scan().to_arrow()) == digest(replacement)
    assert digest(table.scan(snapshot_id=first).to_arrow()) == digest(old)
    summary = table.metadata["snapshots"][-1]["summary"]
    assert summary["operation"] == "overwrite" and summary["total-records"] == "300"
    assert summary["total-delete-files"] == "0" and summary["total-data-files"] == summary["added-data-files"]
    _, entries = manifests_and_entries(table, snapshot_id)
    statuses = sorted(e["status"] for es in entries.values() for e in es)
    assert statuses.count(DELETED) == int(summary["deleted-data-files"]) + int(summary["removed-delete-files"])
    assert_all_encrypted(tmp_path / "t")


def test_delete_deletion_vectors(tmp_path, kms):
    from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, In, LessThan

    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA", partition_spec=CATEGORY)
    rows = make_rows(0, 3000)
    table.append(rows)
    versions = len(list((tmp_path / "t" / "metadata").glob("v*.metadata.json")))
    assert table.delete("id < 0") is None  # nothing matches: nothing is committed
    assert len(list((tmp_path / "t" / "metadata").glob("v*.metadata.json"))) == versions

    keep = rows
    steps = [
        ("id < 100", pc.field("id") >= 100),
        (In("id", {500, 501, 502, 2999}), ~pc.field("id").isin([500, 501, 502, 2999])),
        (And(GreaterThanOrEqual("id", 90), LessThan("id", 600)), (pc.field("id") < 90) | (pc.field("id") >= 600)),
        (EqualTo("category", "beta"), pc.field("category") != "beta"),
    ]
    history = []
    for row_filter, survivors in steps:
        snapshot_id = table.delete(row_filter)
        keep = keep.filter(survivors)
        history.append((snapshot_id, digest(keep)))
        assert digest(table.scan().to_arrow()) == digest(keep)
        _, entries = manifests_and_entries(table)
        live_dvs = [e["data_file"] for es in entries.values() for e in es
                    if e["status"] != DELETED and e["data_file"]["file_format"] == "PUFFIN"]  # fmt: skip
        referenced = [dv["referenced_data_file"] for dv in live_dvs]
        assert len(referenced) == len(set(referenced)), "at most one live DV per data file"
        for dv in live_dvs:
            km = StandardKeyMetadata.decode(dv["key_metadata"])
            assert km.file_length == dv["file_size_in_bytes"]
    for snapshot_id, expected in history:
        assert digest(table.scan(snapshot_id=snapshot_id).to_arrow()) == expected
    last = table.metadata["snapshots"][-1]["summary"]
    assert last["operation"] == "delete" and int(last["deleted-data-files"]) >= 1  # beta's file dropped whole
    assert int(last["total-records"]) - int(last["total-position-deletes"]) == keep.num_rows
    assert_all_encrypted(tmp_path / "t")
    assert table.verify().ok


# --- expiry --------------------------------------------------------------------------------------------------


def test_expire_keeps_every_remaining_snapshot_readable(tmp_path, kms):
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA", partition_spec=CATEGORY)
    table.append(make_rows(0, 1000))
    table.append(make_rows(1000, 1500), file_format="avro")
    table.delete("id < 200")
    time.sleep(0.01)
    cutoff = int(time.time() * 1000)
    time.sleep(0.01)
    table.append(make_rows(1500, 1800))
    table.delete("category = 'gamma'")
    before = {s.snapshot_id: digest(table.scan(snapshot_id=s.snapshot_id).to_arrow()) for s in table.snapshots()}
    all_files = set(stored_files(tmp_path / "t"))

    expired = table.expire_snapshots(cutoff)
    assert len(expired) == 3 and table.current_snapshot_id not in expired
    remaining = {s.snapshot_id for s in table.snapshots()}
    assert remaining == set(before) - set(expired)
    for snapshot_id in remaining:
        assert digest(table.scan(snapshot_id=snapshot_id).to_arrow()) == before[snapshot_id]
    assert table.verify().ok
    # the keys of expired snapshots are gone, the KEK and the remaining ones stay
    keys = table.metadata["encryption-keys"]
    ids = {k["key-id"] for k in keys}
    assert {s["key-id"] for s in table.metadata["snapshots"]} | {keys[0]["key-id"]} == ids
    # files only expired snapshots needed are gone (their manifest lists; every data file
    # is still live); verify() above read every file the remaining snapshots reference
    removed = all_files - set(stored_files(tmp_path / "t"))
    assert sorted(p.name.split("-")[1] for p in removed if p.name.startswith("snap-")) == sorted(map(str, expired))
    assert not any(p.suffix in (".parquet", ".avro", ".puffin") and "data" in p.parts for p in removed)

    # expiring the append before the last delete removes the data files that delete dropped
    dropped = {p for p in stored_files(tmp_path / "t" / "data") if "category=gamma" in str(p)}
    assert dropped
    assert table.expire_snapshots(int(time.time() * 1000) + 60_000) == sorted(remaining - {table.current_snapshot_id})
    assert not any(p.exists() for p in dropped)
    assert digest(table.scan().to_arrow()) == before[table.current_snapshot_id]
    assert [s.snapshot_id for s in table.snapshots()] == [table.current_snapshot_id]
    assert len(table.metadata["encryption-keys"]) == 2
    assert table.verify().ok


# --- structure parity with Java ---------------------------------------------------------------------------


JAVA_METADATA_DIR = TABLES_DIR / "enc_deletes_dek16" / "metadata"


def _java_metadata() -> dict:
    return json.loads((JAVA_METADATA_DIR / "00004-4b30dcda-58ab-4b6b-bb98-dc3ce8524e36.metadata.json").read_text())


def test_metadata_structure_matches_java(tmp_path, kms):
    java = _java_metadata()
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA", partition_spec=CATEGORY)
    created = json.loads(Path(table.metadata_location).read_text(encoding="utf-8"))
    java_created = json.loads((JAVA_METADATA_DIR / "00000-50023f04-6f02-48ff-91e1-42b63cb07a8f.metadata.json").read_text())
    # Java's fields in Java's order; icecrypt's authenticator last (Java drops fields it does not know)
    assert list(created) == [*java_created, AUTHENTICATOR]
    table.append(make_rows(0, 300))
    table.delete("id < 10")
    table.append(make_rows(300, 400))
    ours = json.loads(Path(table.metadata_location).read_text(encoding="utf-8"))
    assert list(ours) == [*java, AUTHENTICATOR]
    for our_snapshot, java_snapshot in zip(ours["snapshots"], java["snapshots"]):
        assert list(our_snapshot) == list(java_snapshot)
    for ours_key, java_key in zip(ours["encryption-keys"], java["encryption-keys"]):
        assert list(ours_key) == list(java_key)

    def summary_keys(snapshot: dict) -> list[str]:
        return [k for k in snapshot["summary"] if k not in ("iceberg-version", "engine-name", "engine-version")]

    assert summary_keys(ours["snapshots"][0]) == summary_keys(java["snapshots"][0])  # append
    assert summary_keys(ours["snapshots"][2]) == summary_keys(java["snapshots"][3])
    java_delete = [k for k in summary_keys(java["snapshots"][1]) if k != "changed-partition-count"]
    assert [k for k in summary_keys(ours["snapshots"][1]) if k in java_delete] == java_delete
    assert ours["refs"] == {"main": {"snapshot-id": ours["current-snapshot-id"], "type": "branch"}}
    assert [e["snapshot-id"] for e in ours["snapshot-log"]] == [s["snapshot-id"] for s in ours["snapshots"]]
    assert [Path(e["metadata-file"]).name for e in ours["metadata-log"]] == [f"v{n}.metadata.json" for n in (1, 2, 3)]


# --- distributed writers: files written anywhere, committed once ---------------------------------------


def test_write_files_then_append_files(tmp_path, kms):
    import pickle

    from icecrypt.table.ops import write as _write

    root = tmp_path / "t"
    EncryptedTable.create(str(root), SCHEMA, kms=kms, table_key_id="keyA", partition_spec=CATEGORY)
    workers = [EncryptedTable.load(str(root), kms=kms) for _ in range(2)]
    parts = [make_rows(0, 400), make_rows(400, 700)]
    records = [pickle.loads(pickle.dumps(_write.write_files(w, part))) for w, part in zip(workers, parts)]
    driver = EncryptedTable.load(str(root), kms=kms)
    assert len(driver.snapshots()) == 0  # nothing is visible before the commit
    snapshot_id = _write.append_files(driver, records[0] + records[1])
    assert [s.snapshot_id for s in driver.snapshots()] == [snapshot_id]
    assert digest(driver.scan().to_arrow()) == digest(pa.concat_tables(parts))
    assert_all_encrypted(root)

    # a record that lost its key metadata is refused, and the files are cleaned up
    stray = _write.write_files(driver, make_rows(700, 800))
    stray[0] = dict(stray[0], key_metadata=None)
    with pytest.raises(Exception, match="must have key metadata"):
        _write.append_files(driver, stray)
    assert not any(Path(r["file_path"]).exists() for r in stray)
    assert digest(driver.refresh().scan().to_arrow()) == digest(pa.concat_tables(parts))

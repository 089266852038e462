"""Writing into copies of the tables Iceberg Java wrote (../shared/tables): appends,
deletes merged with Java's deletion vector and equality deletes, and expiry keep every
Java snapshot reading to its expected digest."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from tablelib import canonical_lines, copy_table, digest_lines, expected, location_map
from vectorlib import TABLES_DIR

from icecrypt.kms.memory import MemoryKms
from icecrypt.table import EncryptedTable
from icecrypt.table.model.schema import arrow_write_schema


@pytest.fixture
def kms():
    return MemoryKms.with_iceberg_test_keys()


def _load(name: str, root, kms) -> EncryptedTable:
    return EncryptedTable.load(str(root / expected(name)["metadata_location"]), kms=kms, location_map=location_map(name, root))


def _expected_lines(name: str) -> list[str]:
    with gzip.open(TABLES_DIR / name / "expected_rows.jsonl.gz", "rt", encoding="ascii") as f:
        return [line.rstrip("\n") for line in f if line.strip()]


def _rows_like(table: EncryptedTable, ids: range, category: str) -> pa.Table:
    """New rows in the Java table's schema."""
    n = len(ids)
    arrow = arrow_write_schema(table.schema)
    columns = {
        "id": pa.array(list(ids), pa.int64()),
        "category": pa.array([category] * n),
        "qty": pa.array([i % 100 for i in ids], pa.int32()),
        "amount": pa.array([i * 0.5 for i in ids], pa.float64()),
        "ts": pa.array([1_700_000_000_000_000 + i for i in ids], pa.timestamp("us")),
        "event_date": pa.array([19_000 + i % 30 for i in ids], pa.int32()).cast(pa.date32()),
        "note": pa.array([None if i % 2 else f"py-{i}" for i in ids]),
        "price": pa.array([None] * n, pa.decimal128(10, 2)),
        "flag": pa.array([i % 3 == 0 for i in ids]),
    }
    return pa.table({name: columns[name] for name in arrow.names}).cast(arrow)


def _assert_java_snapshots_intact(table: EncryptedTable, name: str) -> None:
    for snap in expected(name)["snapshots"]:
        rows = table.scan(snapshot_id=snap["snapshot_id"]).to_arrow()
        assert rows.num_rows == snap["expected_row_count"]
        assert digest_lines(canonical_lines(rows)) == snap["expected_digest_sha256"]


@pytest.mark.parametrize("name,file_format", [("enc_deletes_dek16", "parquet"), ("enc_avro_dek16", "avro")])
def test_append_to_a_java_table(tmp_path, kms, name, file_format):
    root = copy_table(name, tmp_path)
    table = _load(name, root, kms)
    new = _rows_like(table, range(900_000, 900_250), "delta")
    snapshot_id = table.append(new, file_format=file_format)
    java_version = int(expected(name)["metadata_location"].split("/")[-1].split("-")[0])
    assert table.metadata_location.endswith(f"/v{java_version + 1}.metadata.json")
    fresh = EncryptedTable.load(str(root), kms=kms, location_map=location_map(name, root))
    assert fresh.current_snapshot_id == snapshot_id
    rows = fresh.scan().to_arrow()
    assert digest_lines(canonical_lines(rows)) == digest_lines(_expected_lines(name) + canonical_lines(new))
    _assert_java_snapshots_intact(fresh, name)
    # Java's KEK is reused: the new manifest-list key is wrapped by it
    keys = fresh.metadata["encryption-keys"]
    keks = [k for k in keys if k["encrypted-by-id"] == "keyA"]
    assert len(keks) == 1
    assert next(k for k in keys if k["key-id"] == fresh.metadata["snapshots"][-1]["key-id"])["encrypted-by-id"] == keks[0]["key-id"]
    # recorded paths stay in the table's own location scheme
    assert fresh.metadata["snapshots"][-1]["manifest-list"].startswith("s3://icecrypt-golden/" + name + "/metadata/")
    assert fresh.metadata["metadata-log"][-1]["metadata-file"].endswith(expected(name)["metadata_location"].split("/")[-1])
    assert fresh.verify().ok


def test_delete_merges_with_javas_deletion_vector(tmp_path, kms):
    name = "enc_deletes_dek16"
    root = copy_table(name, tmp_path)
    table = _load(name, root, kms)
    before = table.scan().to_arrow()
    # the alpha file carries Java's DV (p % 10 == 3); the beta rows with id % 13 == 0 are
    # equality-deleted by Java: both stay deleted, and the new positions join the DV
    row_filter = "id < 2000"
    table.delete(row_filter)
    after = table.scan().to_arrow()
    survivors = before.filter(pc.field("id") >= 2000)
    assert digest_lines(canonical_lines(after)) == digest_lines(canonical_lines(survivors))
    _assert_java_snapshots_intact(table, name)
    summary = table.metadata["snapshots"][-1]["summary"]
    assert summary["operation"] == "delete" and "removed-dvs" in summary
    assert table.verify().ok


def test_expire_a_java_table(tmp_path, kms):
    name = "enc_deletes_dek16"
    root = copy_table(name, tmp_path)
    table = _load(name, root, kms)
    current = expected(name)["expected"]
    expired = table.expire_snapshots(2**62)
    assert len(expired) == len(expected(name)["snapshots"]) - 1
    rows = table.scan().to_arrow()
    assert rows.num_rows == current["row_count"]
    assert digest_lines(canonical_lines(rows)) == current["digest_sha256"]
    assert table.verify().ok
    ids = {k["key-id"] for k in table.metadata["encryption-keys"]}
    assert ids == {table.metadata["snapshots"][0]["key-id"], next(
        k["key-id"] for k in table.metadata["encryption-keys"] if k["encrypted-by-id"] == "keyA")}
    metadata_files = sorted(p.name for p in (root / "metadata").iterdir() if p.name.endswith(".metadata.json"))
    assert metadata_files[-1] == "v5.metadata.json"
    assert json.loads((root / "metadata" / "v5.metadata.json").read_text())["current-snapshot-id"] == current["snapshot_id"]

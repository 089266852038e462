"""``icecrypt table ...`` end to end: in process through ``icecrypt.cli.main`` (the real
parser and exit codes), and once as a subprocess."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from tablelib import expected, flip_byte, location_map, metadata_path, table_digest

from icecrypt.cli._table import parse_partition, parse_schema, parse_time
from icecrypt.cli import main

MEMORY_KMS = ["--kms-type", "memory", "--kms-property", "encryption.kms.memory.iceberg-test-keys=true"]


def run(capfd, *argv) -> tuple[int, str, str]:
    status = main([str(a) for a in argv])
    out, err = capfd.readouterr()
    return status, out, err


@pytest.fixture
def keystore(tmp_path, capfd) -> list[str]:
    path = tmp_path / "keys.json"
    assert run(capfd, "keys", "init", path, "--key-id", "master")[0] == 0
    return ["--kms-type", "local", "--kms-property", f"encryption.kms.local.keystore={path}"]


@pytest.fixture
def inputs(tmp_path) -> tuple[Path, Path, pa.Table]:
    rows = pa.table({
        "id": pa.array(range(600), pa.int64()),
        "cat": ["a", "b", "c"] * 200,
        "amount": [i / 4 for i in range(600)],
    })
    pq.write_table(rows.slice(0, 500), tmp_path / "in.parquet")
    pacsv.write_csv(rows.slice(500), tmp_path / "in.csv")
    return tmp_path / "in.parquet", tmp_path / "in.csv", rows


def test_create_append_scan_verify(tmp_path, capfd, keystore, inputs):
    parquet_in, csv_in, _ = inputs
    where = tmp_path / "wh" / "t"
    status, out, _ = run(capfd, "table", "create", where, "--schema", "id long required, cat string, amount double, note string",
                         "--partition-by", "cat", "--table-key-id", "master", *keystore)
    assert status == 0 and "encrypted under 'master'" in out
    status, out, _ = run(capfd, "table", "append", where, parquet_in, csv_in, *keystore, "-q")
    assert status == 0 and "appended 600 rows" in out

    status, out, _ = run(capfd, "table", "scan", where, "--filter", "cat = 'b' and id < 30", "--columns", "id,amount", *keystore)
    assert status == 0
    lines = out.splitlines()
    assert lines[0] == '"id","amount"'
    assert sorted(int(line.split(",")[0]) for line in lines[1:]) == [i for i in range(30) if i % 3 == 1]

    assert run(capfd, "table", "scan", where, "--count", *keystore)[1].strip() == "600"
    status, out, _ = run(capfd, "table", "scan", where, "--limit", "7", *keystore)
    assert len(out.splitlines()) == 8

    for suffix in ("parquet", "arrow", "csv", "jsonl"):
        target = tmp_path / f"out.{suffix}"
        assert run(capfd, "table", "scan", where, "-o", target, "--columns", "id,cat", *keystore)[0] == 0
        if suffix == "parquet":
            got = pq.read_table(target)
        elif suffix == "arrow":
            got = pa.ipc.open_file(target).read_all()
        elif suffix == "csv":
            got = pacsv.read_csv(target)
        else:
            got = pa.Table.from_pylist([json.loads(line) for line in target.read_text().splitlines()])
        assert sorted(got.column("id").to_pylist()) == list(range(600))

    status, out, _ = run(capfd, "table", "snapshots", where, "--json", *keystore)
    info = json.loads(out)
    assert info["encrypted"] and len(info["snapshots"]) == 1 and info["snapshots"][0]["current"]
    assert info["snapshots"][0]["key-id"]

    status, out, _ = run(capfd, "table", "verify", where, *keystore)
    assert status == 0 and "OK" in out


def test_encrypted_table_needs_the_kms(tmp_path, capfd, keystore):
    where = tmp_path / "t"
    assert run(capfd, "table", "create", where, "--schema", "id long", "--table-key-id", "master", *keystore)[0] == 0
    status, _, err = run(capfd, "table", "scan", where)
    assert status == 1 and "no KMS" in err
    status, _, err = run(capfd, "table", "create", tmp_path / "u", "--schema", "id long", "--table-key-id", "master")
    assert status == 1 and "needs a KMS" in err


def test_plaintext_table_and_schema_from_a_file(tmp_path, capfd, inputs):
    parquet_in, _, _ = inputs
    where = tmp_path / "plain"
    assert run(capfd, "table", "create", where, "--schema-from", parquet_in, "--partition-by", "bucket(4, id)")[0] == 0
    assert run(capfd, "table", "append", where, parquet_in, "-q")[0] == 0
    status, out, _ = run(capfd, "table", "scan", where, "--count", "--filter", "id >= 100")
    assert status == 0 and out.strip() == "400"
    status, out, _ = run(capfd, "table", "snapshots", where, "--json")
    assert json.loads(out)["encrypted"] is False


def test_java_table_through_the_location_map(capfd):
    name = "enc_deletes_dek16"
    (prefix, root), = location_map(name).items()
    args = ["--location-map", f"{prefix}={root}", *MEMORY_KMS]
    for snapshot in expected(name)["snapshots"]:
        status, out, _ = run(capfd, "table", "scan", metadata_path(name), "--count", "--snapshot", snapshot["snapshot_id"], *args)
        assert status == 0 and int(out) == snapshot["expected_row_count"]
    status, out, _ = run(capfd, "table", "snapshots", metadata_path(name), *args)
    assert status == 0 and out.count("\n") == 5 and out.splitlines()[-1].startswith("*")


@pytest.mark.parametrize(
    ("damage", "status", "kind"),
    [("flip", 2, "damaged"), ("unlink", 1, "missing"), ("key", 4, "key-missing"), ("key-id", 3, "unencrypted")],
)
def test_verify_exit_status(golden_copy, capfd, damage, status, kind):
    table, root = golden_copy("enc_parquet_dek16")
    task = table.scan().plan_files()[0]
    if damage == "flip":
        flip_byte(Path(task.file.fs_path), 1000)
    elif damage == "unlink":
        Path(task.file.fs_path).unlink()
    else:
        metadata = json.loads(Path(table.metadata_location).read_text())
        if damage == "key":
            metadata["encryption-keys"] = [k for k in metadata["encryption-keys"] if "properties" in k]  # KEKs only
        else:
            del metadata["snapshots"][0]["key-id"]
        Path(table.metadata_location).write_text(json.dumps(metadata))
    (prefix, mapped), = location_map("enc_parquet_dek16", root).items()
    code, out, _ = run(capfd, "table", "verify", table.metadata_location, "--json", "--location-map", f"{prefix}={mapped}", *MEMORY_KMS)
    report = json.loads(out)
    assert code == status and not report["ok"]
    assert {p["kind"] for p in report["problems"]} == {kind}


def test_expire(tmp_path, capfd, keystore, inputs):
    parquet_in, csv_in, _ = inputs
    where = tmp_path / "t"
    assert run(capfd, "table", "create", where, "--schema", "id long, cat string, amount double", "--table-key-id", "master", *keystore)[0] == 0
    assert run(capfd, "table", "append", where, parquet_in, *keystore, "-q")[0] == 0
    assert run(capfd, "table", "append", where, csv_in, *keystore, "-q")[0] == 0
    status, out, _ = run(capfd, "table", "expire", where, "--older-than", str(2**62), *keystore)
    assert status == 0 and out.startswith("expired 1 snapshot(s)")
    status, out, _ = run(capfd, "table", "snapshots", where, "--json", *keystore)
    assert len(json.loads(out)["snapshots"]) == 1
    assert run(capfd, "table", "scan", where, "--count", *keystore)[1].strip() == "600"
    assert run(capfd, "table", "verify", where, *keystore)[0] == 0


def test_subprocess_entry_point(tmp_path):
    name = "enc_avro_dek16"
    (prefix, root), = location_map(name).items()
    out = tmp_path / "rows.parquet"
    result = subprocess.run(
        [sys.executable, "-m", "icecrypt", "table", "scan", str(metadata_path(name)), "-o", str(out),
         "--location-map", f"{prefix}={root}", *MEMORY_KMS],
        capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert table_digest(pq.read_table(out)) == expected(name)["expected"]["digest_sha256"]


# --- argument parsing ---------------------------------------------------------------------------------


def test_parse_schema():
    schema = parse_schema("id long required, name string, price decimal(10, 2) not null, d date")
    assert [(f.field_id, f.name, str(f.field_type), f.required) for f in schema.fields] == [
        (1, "id", "long", True), (2, "name", "string", False), (3, "price", "decimal(10, 2)", True), (4, "d", "date", False),
    ]  # fmt: skip
    with pytest.raises(ValueError, match="unknown type 'strin'"):
        parse_schema("name strin")
    with pytest.raises(ValueError, match="NAME TYPE"):
        parse_schema("justaname")


def test_parse_partition():
    schema = parse_schema("id long, ts timestamptz, cat string")
    spec = parse_partition(schema, ["cat", "day(ts)", "bucket(16, id)", "truncate(3, cat)"])
    assert [(f.name, str(f.transform), f.source_id, f.field_id) for f in spec.fields] == [
        ("cat", "identity", 3, 1000), ("ts_day", "day", 2, 1001), ("id_bucket", "bucket[16]", 1, 1002),
        ("cat_truncate", "truncate[3]", 3, 1003),
    ]  # fmt: skip
    with pytest.raises(ValueError):
        parse_partition(schema, ["nope"])


def test_parse_time():
    now = 1_800_000_000_000
    assert parse_time("7d", now_ms=now) == now - 7 * 86_400_000
    assert parse_time("90m", now_ms=now) == now - 5_400_000
    assert parse_time("1700000000000") == 1_700_000_000_000
    assert parse_time("2024-01-02T03:04:05") == int(datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc).timestamp() * 1000)
    assert parse_time("2024-01-02T03:04:05+01:00") == parse_time("2024-01-02T02:04:05")
    with pytest.raises(ValueError, match="older-than"):
        parse_time("yesterday")

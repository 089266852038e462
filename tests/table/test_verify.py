"""``table.verify()``: every reachable file authenticated; damage reported, never raised."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tablelib import (
    TABLE_NAMES,
    current_manifests,
    edit_metadata,
    expected,
    flip_byte,
    location_map,
    metadata_path,
    reload,
    rewrite_chain,
)

from vectorlib import TABLES_DIR

from icecrypt.kms.memory import MemoryKms
from icecrypt.table import EncryptedTable, VerifyReport


def _java_files(name: str) -> set[str]:
    """Manifest lists, manifests, data and delete files Java wrote."""
    paths = {f["path"] for f in expected(name)["files"]}
    return {p for p in paths if p.startswith(("data/", "metadata/")) and not p.endswith(".metadata.json")}


@pytest.mark.parametrize("name", TABLE_NAMES)
def test_intact_tables_verify(golden, name):
    table = golden(name)
    report = table.verify()
    assert isinstance(report, VerifyReport)
    assert report.ok, str(report)
    assert report.snapshots == [s.snapshot_id for s in table.snapshots()]
    # every manifest list, manifest, data and delete file Java wrote was checked once
    assert report.files_checked == len(_java_files(name))
    assert report.bytes_checked > 0 and report.rows_checked >= expected(name)["expected"]["row_count"]
    assert "OK" in report.summary()


def test_one_snapshot(golden):
    table = golden("enc_deletes_dek16")
    first = table.snapshots()[0]
    report = table.verify(first.snapshot_id)
    assert report.ok and report.snapshots == [first.snapshot_id]
    assert report.files_checked == 4  # manifest list, manifest, two data files
    assert report.rows_checked == 8000


def test_progress_sees_every_byte(golden):
    seen = {}

    class Bar:
        def __init__(self, total):
            seen["total"], seen["done"] = total, 0

        def update(self, n):
            seen["done"] += n

        def close(self):
            seen["closed"] = True

    golden("enc_parquet_dek16").verify(progress=Bar)
    assert seen["total"] == seen["done"] > 0 and seen["closed"]


def _kinds(report: VerifyReport) -> dict[str, str]:
    return {Path(p.path).name: p.kind for p in report.problems}


def test_damage_is_reported_by_kind(golden_copy):
    table, _ = golden_copy("enc_deletes_dek16")
    tasks = {t.partition[0]: t for t in table.scan().plan_files()}
    missing = Path(tasks["gamma"].file.fs_path)
    missing.unlink()
    damaged = Path(tasks["beta"].file.fs_path)
    flip_byte(damaged, 3000)
    dv = tasks["alpha"].deletes[0]
    flip_byte(Path(dv.fs_path), 100)
    report = reload(table).verify()
    assert not report.ok
    kinds = _kinds(report)
    assert kinds == {missing.name: "missing", damaged.name: "damaged", Path(dv.path).name: "damaged"}, str(report)
    assert all(str(p) for p in report.problems)
    # the problem files were reported at the first snapshot that reaches them
    by_name = {Path(p.path).name: p for p in report.problems}
    assert by_name[damaged.name].snapshot_id == table.snapshots()[0].snapshot_id


def _parquet_layouts(name: str) -> dict[str, dict]:
    """keys.json's decoded footer of every Parquet file Java wrote, by file name."""
    keys = json.loads((TABLES_DIR / name / "keys.json").read_text(encoding="utf-8"))
    return {
        Path(entry["path"]).name: entry["parquet"]
        for snapshot in keys["snapshots"]
        for manifest in snapshot["manifests"]
        for entry in manifest["entries"]
        if "parquet" in entry
    }


def test_page_indexes_and_magic_are_authenticated(golden_copy):
    """Arrow never reads a Parquet file's page index, but parquet-java does (filtered
    reads), so damage there is damage: verify() decrypts those modules itself."""
    table, _ = golden_copy("enc_parquet_dek16")
    layouts = _parquet_layouts("enc_parquet_dek16")
    files = sorted({t.file.fs_path for t in table.scan().plan_files()})
    assert len(files) == 4
    column_index, offset_index, magic = (Path(f) for f in files[:3])
    chunk = layouts[column_index.name]["row_groups"][1]["columns"][2]
    flip_byte(column_index, chunk["column_index_offset"] + chunk["column_index_length"] // 2)
    chunk = layouts[offset_index.name]["row_groups"][0]["columns"][0]
    flip_byte(offset_index, chunk["offset_index_offset"] + 30)
    flip_byte(magic, 1)
    # the rows are intact: no read uses the damaged bytes unauthenticated
    assert reload(table).scan().to_arrow().num_rows == expected("enc_parquet_dek16")["expected"]["row_count"]
    report = reload(table).verify()
    assert _kinds(report) == {column_index.name: "damaged", offset_index.name: "damaged", magic.name: "damaged"}, str(report)
    messages = {Path(p.path).name: p.message for p in report.problems}
    assert "the column index of column 'qty' of row group 1: GCM tag check failed" in messages[column_index.name]
    assert "the offset index of column 'id' of row group 0: GCM tag check failed" in messages[offset_index.name]
    assert "no PARE magic" in messages[magic.name]


def test_damaged_manifest_and_unencrypted_snapshot(golden_copy):
    table, _ = golden_copy("enc_parquet_dek16")
    first, _ = table.snapshots()
    manifest = current_manifests(table)[0]  # the manifest the second append added
    flip_byte(Path(table.fs_path(manifest.path)), 300)

    def drop_key_id(metadata: dict) -> None:
        next(s for s in metadata["snapshots"] if s["snapshot-id"] == first.snapshot_id).pop("key-id")

    edit_metadata(Path(table.metadata_location), drop_key_id)
    report = reload(table).verify()
    assert _kinds(report) == {Path(manifest.path).name: "damaged", Path(first.manifest_list).name: "unencrypted"}, str(report)


def test_key_problems(golden_copy):
    table, _ = golden_copy("enc_deletes_dek16")
    victim = table.snapshots()[1]
    edit_metadata(
        Path(table.metadata_location),
        lambda m: m.update({"encryption-keys": [k for k in m["encryption-keys"] if k["key-id"] != victim.key_id]}),
    )
    report = reload(table).verify()
    assert [(Path(p.path).name, p.kind) for p in report.problems] == [(Path(victim.manifest_list).name, "key-missing")]
    assert victim.key_id in report.problems[0].message


def test_wrong_master_key_is_reported_for_every_snapshot():
    name = "enc_avro_dek16"
    table = EncryptedTable.load(metadata_path(name), kms=MemoryKms({"keyA": bytes(16)}), location_map=location_map(name))
    report = table.verify()
    assert {p.kind for p in report.problems} == {"key-missing"}
    assert len(report.problems) == len(table.snapshots())


def test_data_file_without_key_metadata_is_unencrypted(golden_copy):
    table, _ = golden_copy("enc_parquet_dek16")
    victim = {}

    def strip_key(entries):
        victim["path"] = entries[0]["data_file"]["file_path"]
        entries[0]["data_file"]["key_metadata"] = None
        return entries

    rewrite_chain(table, 0, strip_key)
    report = reload(table).verify(table.current_snapshot_id)
    assert [(p.path, p.kind) for p in report.problems] == [(victim["path"], "unencrypted")]


def test_plaintext_manifest_list_is_unencrypted(golden_copy):
    import io

    import fastavro

    from icecrypt import avro

    table, _ = golden_copy("enc_avro_dek16")
    snapshot = table.current_snapshot()
    path = Path(table.fs_path(snapshot.manifest_list))
    with avro.read_records(path, table.manifest_list_key_metadata(snapshot)) as r:
        schema, records = r.schema, list(r)
    out = io.BytesIO()
    fastavro.writer(out, fastavro.parse_schema(schema), records)
    path.write_bytes(out.getvalue())
    report = table.verify()
    assert _kinds(report) == {path.name: "unencrypted"}


def test_report_is_json_friendly(golden_copy):
    import dataclasses

    table, _ = golden_copy("enc_parquet_dek16")
    Path(table.scan().plan_files()[0].file.fs_path).unlink()
    report = table.verify()
    data = json.loads(json.dumps(dataclasses.asdict(report)))
    assert data["problems"][0]["kind"] == "missing"

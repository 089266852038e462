"""Manifest merging on append (Java's MergeAppend rules and properties) and metadata
housekeeping (write.metadata.delete-after-commit.enabled / previous-versions-max), on
tables written here and on copies of the tables Iceberg Java wrote."""

from __future__ import annotations

import json
import warnings

import pyarrow as pa
import pytest
from tablelib import canonical_lines, copy_table, digest_lines, edit_metadata, expected, location_map
from test_write_java_tables import _assert_java_snapshots_intact, _expected_lines, _load, _rows_like

from icecrypt.table import EncryptedTable
from icecrypt.table.commit.housekeeping import delete_removed_metadata_files, missing_snapshot_keys
from icecrypt.table.files.manifest import read_manifest
from icecrypt.table.files.merge import MergeSettings, pack_end

SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("s", pa.string())])


def _rows(i: int) -> pa.Table:
    return pa.table({"id": pa.array([2 * i, 2 * i + 1], pa.int64()), "s": [f"a{i}", f"b{i}"]})


def _create(tmp_path, kms, encrypted: bool, **properties: str) -> EncryptedTable:
    return EncryptedTable.create(
        str(tmp_path / ("enc" if encrypted else "plain")), SCHEMA, kms=kms if encrypted else None,
        table_key_id="keyA" if encrypted else None, properties=properties,
    )  # fmt: skip


def _entries(table: EncryptedTable) -> dict[str, tuple]:
    """data file -> (status, snapshot id, data seq, file seq) over the current manifests."""
    out = {}
    for manifest in table.manifests(table.current_snapshot()):
        for e in read_manifest(manifest, table.locations, table.specs, table.schema, encrypted=table.encrypted):
            out[e.file.file_path] = (e.status, e.snapshot_id, e.sequence_number, e.file_sequence_number)
    return out


def _digest(table: EncryptedTable) -> str:
    return digest_lines(canonical_lines(table.scan().to_arrow()))


# --- the packing rule -----------------------------------------------------------------------


def test_pack_end_is_javas_list_packer():
    # packed from the end, lookback 1: the under-filled bin is the first one
    assert pack_end([1, 1, 1, 1, 1], lambda x: x, 2) == [[1], [1, 1], [1, 1]]
    assert pack_end([5, 1, 1, 3], lambda x: x, 4) == [[5], [1], [1, 3]]
    assert pack_end([9], lambda x: x, 4) == [[9]]  # an oversized item gets its own bin
    assert pack_end([], lambda x: x, 4) == []


def test_settings_follow_javas_properties_and_defaults():
    assert MergeSettings.from_properties({}) == MergeSettings(True, 100, 8 * 1024 * 1024)
    s = MergeSettings.from_properties({
        "commit.manifest-merge.enabled": "FALSE", "commit.manifest.min-count-to-merge": "7",
        "commit.manifest.target-size-bytes": "1234",
    })  # fmt: skip
    assert s == MergeSettings(False, 7, 1234)


# --- merging on append -----------------------------------------------------------------------


@pytest.mark.parametrize("encrypted", [True, False])
def test_manifest_count_follows_min_count(tmp_path, kms, encrypted):
    table = _create(tmp_path, kms, encrypted, **{"commit.manifest.min-count-to-merge": "4"})
    counts = []
    for i in range(10):
        table.append(_rows(i))
        counts.append(len(table.manifests(table.current_snapshot())))
    # new + 3 kept = 4 >= min-count: merged into one; then it grows again
    assert counts == [1, 2, 3, 1, 2, 3, 1, 2, 3, 1]
    summary = table.current_snapshot().summary
    assert summary["manifests-replaced"] == "4" and summary["manifests-created"] == "1"
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == list(range(20))
    report = table.verify()
    assert report.ok, report.problems


@pytest.mark.parametrize("encrypted", [True, False])
def test_merge_disabled_keeps_one_manifest_per_append(tmp_path, kms, encrypted):
    table = _create(tmp_path, kms, encrypted, **{
        "commit.manifest-merge.enabled": "false", "commit.manifest.min-count-to-merge": "2"})  # fmt: skip
    for i in range(5):
        table.append(_rows(i))
    assert len(table.manifests(table.current_snapshot())) == 5


def test_target_size_splits_bins(tmp_path, kms):
    table = _create(tmp_path, kms, True, **{"commit.manifest.min-count-to-merge": "2"})
    table.append(_rows(0))
    one = table.manifests(table.current_snapshot())[0].length
    # a bin holds two manifests of this size at most: packing from the end leaves the
    # new manifest alone in its bin (kept as it is), the older ones merged in pairs
    edit = dict(table.properties)
    edit["commit.manifest.target-size-bytes"] = str(2 * one + one // 2)
    table2 = _create(tmp_path / "b", kms, True, **{**edit, "commit.manifest-merge.enabled": "false"})
    for i in range(4):
        table2.append(_rows(i))
    assert len(table2.manifests(table2.current_snapshot())) == 4
    with table2.update_properties() as props:
        props.set("commit.manifest-merge.enabled", "true")
    table2.append(_rows(4))
    manifests = table2.manifests(table2.current_snapshot())
    # 5 manifests of ~one size, bins from the end: [new], [k1, k2], [k3, k4] -> 3 manifests
    assert len(manifests) == 3
    assert manifests[0].record["added_files_count"] == 1 and manifests[0].record["existing_files_count"] == 0
    assert [m.record["existing_files_count"] for m in manifests[1:]] == [2, 2]
    assert sorted(table2.scan().to_arrow().column("id").to_pylist()) == list(range(10))
    assert table2.verify().ok


@pytest.mark.parametrize("encrypted", [True, False])
def test_merged_entries_keep_sequence_numbers_and_snapshot_ids(tmp_path, kms, encrypted):
    table = _create(tmp_path, kms, encrypted, **{"commit.manifest.min-count-to-merge": "3"})
    table.append(_rows(0))
    table.append(_rows(1))
    before = _entries(table)
    digest = _digest(table)
    paths_before = {m.path for m in table.manifests(table.current_snapshot())}
    table.append(_rows(2))  # 3 manifests: merged
    manifests = table.manifests(table.current_snapshot())
    assert len(manifests) == 1 and manifests[0].path not in paths_before
    after = _entries(table)
    snap = table.current_snapshot()
    for path, (status, snapshot_id, seq, file_seq) in before.items():
        assert after[path] == (0, snapshot_id, seq, file_seq)  # EXISTING, everything else kept
    new = [p for p in after if p not in before]
    assert len(new) == 1
    assert after[new[0]] == (1, snap.snapshot_id, snap.sequence_number, snap.sequence_number)  # ADDED
    assert manifests[0].sequence_number == snap.sequence_number
    assert manifests[0].min_sequence_number == 1
    # the rows of the older snapshots read as before, the new ones on top
    assert digest_lines(canonical_lines(table.scan(snapshot_id=table.snapshots()[1].snapshot_id).to_arrow())) == digest
    if encrypted:
        assert manifests[0].key_metadata is not None
        assert open(table.fs_path(manifests[0].path), "rb").read(4) == b"AGS1"
    assert table.verify().ok


def test_new_manifest_merged_away_is_deleted(tmp_path, kms):
    table = _create(tmp_path, kms, True, **{"commit.manifest.min-count-to-merge": "2"})
    table.append(_rows(0))
    table.append(_rows(1))  # new + 1 kept: merged
    metadata_dir = tmp_path / "enc" / "metadata"
    manifests = sorted(p.name for p in metadata_dir.glob("*-m0.avro"))
    referenced = set()
    for snap in table.snapshots():
        referenced |= {m.path.rsplit("/", 1)[-1] for m in table.manifests(snap)}
    assert set(manifests) == referenced  # nothing left behind


@pytest.mark.parametrize("name", ["enc_deletes_dek16", "enc_avro_dek16", "enc_parquet_dek16"])
def test_append_merges_a_java_table(tmp_path, kms, name):
    root = copy_table(name, tmp_path)
    table = _load(name, root, kms)
    before = table.manifests(table.current_snapshot())
    data_before = [m for m in before if not m.is_deletes]
    deletes_before = [m for m in before if m.is_deletes]
    edit_metadata(root / expected(name)["metadata_location"],
                  lambda m: m["properties"].update({"commit.manifest.min-count-to-merge": "2"}))
    table = _load(name, root, kms)
    new = _rows_like(table, range(900_000, 900_050), "delta")
    table.append(new)
    fresh = EncryptedTable.load(str(root), kms=kms, location_map=location_map(name, root))
    after = fresh.manifests(fresh.current_snapshot())
    data_after = [m for m in after if not m.is_deletes]
    deletes_after = [m for m in after if m.is_deletes]
    # data: the new manifest and every kept one (all small) in one bin of >= 2: one manifest
    assert len(data_after) == 1
    assert data_after[0].record["added_files_count"] >= 1
    assert data_after[0].record["existing_files_count"] == sum(
        m.record["added_files_count"] + m.record["existing_files_count"] for m in data_before
    )
    # deletes merged separately: into one delete manifest when there were several
    assert len(deletes_after) == (1 if len(deletes_before) >= 2 else len(deletes_before))
    assert all(m.record["content"] == 1 for m in deletes_after)
    rows = fresh.scan().to_arrow()
    assert digest_lines(canonical_lines(rows)) == digest_lines(_expected_lines(name) + canonical_lines(new))
    _assert_java_snapshots_intact(fresh, name)
    report = fresh.verify()
    assert report.ok, report.problems


# --- metadata housekeeping -------------------------------------------------------------------


@pytest.mark.parametrize("encrypted", [True, False])
def test_delete_after_commit_keeps_the_log_bounded(tmp_path, kms, encrypted):
    table = _create(tmp_path, kms, encrypted, **{
        "write.metadata.delete-after-commit.enabled": "true", "write.metadata.previous-versions-max": "2"})  # fmt: skip
    for i in range(6):
        table.append(_rows(i))
    metadata_dir = tmp_path / ("enc" if encrypted else "plain") / "metadata"
    versions = sorted(int(p.name[1:].split(".")[0]) for p in metadata_dir.glob("v*.metadata.json"))
    assert versions == [5, 6, 7]  # the current version and the two in its log
    assert [e["metadata-file"].rsplit("/", 1)[-1] for e in table.metadata["metadata-log"]] == [
        "v5.metadata.json", "v6.metadata.json"]  # fmt: skip
    fresh = EncryptedTable.load(str(tmp_path / ("enc" if encrypted else "plain")), kms=kms)
    assert sorted(fresh.scan().to_arrow().column("id").to_pylist()) == list(range(12))
    for snap in fresh.snapshots():  # every snapshot's keys are still in the current metadata
        fresh.scan(snapshot_id=snap.snapshot_id).to_arrow()
    assert fresh.verify().ok


def test_without_delete_after_commit_every_version_stays(tmp_path, kms):
    table = _create(tmp_path, kms, True, **{"write.metadata.previous-versions-max": "2"})
    for i in range(5):
        table.append(_rows(i))
    assert len(list((tmp_path / "enc" / "metadata").glob("v*.metadata.json"))) == 6
    assert len(table.metadata["metadata-log"]) == 2


def test_old_metadata_kept_when_the_new_one_lacks_a_snapshot_key(tmp_path, kms):
    table = _create(tmp_path, kms, True, **{
        "write.metadata.delete-after-commit.enabled": "true", "write.metadata.previous-versions-max": "1"})  # fmt: skip
    for i in range(3):
        table.append(_rows(i))
    assert missing_snapshot_keys(table.metadata) == []
    metadata_dir = tmp_path / "enc" / "metadata"
    base_location = table.metadata_location
    base = json.loads(open(base_location).read())
    # a next version whose encryption-keys lost the key of the first snapshot
    broken = json.loads(json.dumps(base))
    lost = broken["snapshots"][0]["key-id"]
    broken["encryption-keys"] = [k for k in broken["encryption-keys"] if k["key-id"] != lost]
    broken["metadata-log"] = [{"timestamp-ms": 0, "metadata-file": base_location}]
    assert missing_snapshot_keys(broken) and lost in missing_snapshot_keys(broken)[0]
    # a KEK missing is caught too
    kek = next(k["encrypted-by-id"] for k in base["encryption-keys"] if k["key-id"] == lost)
    no_kek = json.loads(json.dumps(base))
    no_kek["encryption-keys"] = [k for k in no_kek["encryption-keys"] if k["key-id"] != kek]
    assert any(kek in m for m in missing_snapshot_keys(no_kek))
    before = sorted(p.name for p in metadata_dir.glob("v*.metadata.json"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        deleted = delete_removed_metadata_files(table.filesystem, base_location, base, broken)
    assert deleted == []
    assert any("lacks keys" in str(w.message) for w in caught)
    assert sorted(p.name for p in metadata_dir.glob("v*.metadata.json")) == before
    # with the keys present the same call deletes what dropped out of the log
    good = json.loads(json.dumps(base))
    good["metadata-log"] = [{"timestamp-ms": 0, "metadata-file": base_location}]
    deleted = delete_removed_metadata_files(table.filesystem, base_location, base, good)
    assert [d.rsplit("/", 1)[-1] for d in deleted] == [base["metadata-log"][0]["metadata-file"].rsplit("/", 1)[-1]]

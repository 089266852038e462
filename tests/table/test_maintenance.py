"""Maintenance actions on encrypted tables: rewrite manifests, rewrite data files
(bin-pack, deletes applied, concurrent commits), remove orphan files; every read after
an action matches the rows from before it."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest
from tablelib import TABLE_NAMES, expected
from test_write_roundtrip import CATEGORY, SCHEMA, assert_all_encrypted, digest, make_rows

from icecrypt import CommitConflictError
from icecrypt.table import EncryptedTable
from icecrypt.table.maintenance.actions import key_usage, referenced_files


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def small_table(tmp_path, kms, appends: int = 6, rows: int = 200, **kw) -> EncryptedTable:
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA", partition_spec=CATEGORY, **kw)
    for i in range(appends):
        table.append(make_rows(i * rows, (i + 1) * rows))
    return table


def data_files(table: EncryptedTable) -> list:
    return [t.file for t in table.scan().plan_files()]


def assert_clean(table: EncryptedTable) -> None:
    report = table.verify()
    assert report.ok, report.problems


# --- rewrite_data_files ----------------------------------------------------------------------------


def test_rewrite_data_files_bin_packs_and_keeps_rows(tmp_path, kms):
    table = small_table(tmp_path, kms)
    before = digest(table.scan().to_arrow())
    files_before = data_files(table)
    assert len(files_before) >= 6 * 2  # one file per category per append
    result = table.rewrite_data_files()
    assert result.snapshot_id == table.current_snapshot_id
    after = data_files(table)
    partitions = {f.path.split("/")[-2] for f in files_before}
    assert len(after) == len(partitions)  # one file per partition
    assert result.rewritten_data_files == len(files_before) and result.added_data_files == len(after)
    assert digest(table.scan().to_arrow()) == before
    summary = table.current_snapshot().summary
    assert summary["operation"] == "replace"
    assert summary["deleted-data-files"] == str(len(files_before))
    assert summary["added-data-files"] == str(len(after))
    assert summary["added-records"] == summary["deleted-records"] == str(6 * 200)
    assert summary["total-records"] == str(6 * 200) and summary["total-data-files"] == str(len(after))
    # fresh DEKs: no new file shares a key with an old one
    usage = key_usage(table)
    old = {usage.files[f.path] for f in files_before}
    assert not old & {usage.files[f.path] for f in after}
    # every snapshot still reads (the old ones through the old files)
    for snap in table.snapshots()[:-1]:
        table.scan(snapshot_id=snap.snapshot_id).to_arrow()
    assert_clean(table)
    assert_all_encrypted(tmp_path / "t")
    reloaded = EncryptedTable.load(str(tmp_path / "t"), kms=kms)
    assert digest(reloaded.scan().to_arrow()) == before


def test_java_bin_pack_rules_min_input_files_and_filter(tmp_path, kms):
    table = small_table(tmp_path, kms, appends=3)
    before = table.current_snapshot_id
    assert table.rewrite_data_files().snapshot_id == before  # 3 files per partition < min-input-files 5
    rows = digest(table.scan().to_arrow())
    result = table.rewrite_data_files(row_filter="category = 'alpha'", options={"min-input-files": 2})
    assert result.snapshot_id != before
    by_dir: dict[str, int] = {}
    for f in data_files(table):
        by_dir[f.path.split("/")[-2]] = by_dir.get(f.path.split("/")[-2], 0) + 1
    assert by_dir.pop("category=alpha") == 1 and all(n == 3 for n in by_dir.values())
    assert digest(table.scan().to_arrow()) == rows


def test_rewrite_applies_deletion_vectors_and_drops_them(tmp_path, kms):
    table = small_table(tmp_path, kms)
    table.delete("id in (" + ", ".join(str(i) for i in range(3, 1200, 7)) + ")")
    table.delete("id < 150")
    rows = table.scan().to_arrow()
    assert any(t.deletes for t in table.scan().plan_files())
    result = table.rewrite_data_files(options={"rewrite-all": "true"})
    assert result.removed_delete_files > 0
    tasks = table.scan().plan_files()
    assert not any(t.deletes for t in tasks)
    assert sum(t.file.record_count for t in tasks) == rows.num_rows  # rewritten rows = live rows
    assert digest(table.scan().to_arrow()) == digest(rows)
    summary = table.current_snapshot().summary
    assert summary["total-delete-files"] == "0" and summary["removed-dvs"] == summary["removed-delete-files"]
    assert_clean(table)


@pytest.mark.parametrize("name", TABLE_NAMES)
def test_rewrite_data_files_on_java_tables(golden_copy, name):
    table, _ = golden_copy(name)
    before = table.scan().to_arrow()
    assert before.num_rows == expected(name)["snapshots"][-1]["expected_row_count"]
    result = table.rewrite_data_files(options={"rewrite-all": "true"})
    assert result.rewritten_data_files > 0
    assert digest(table.scan().to_arrow()) == digest(before)
    if name == "enc_deletes_dek16":  # Java's DV and equality deletes were applied, then dropped
        assert result.removed_delete_files == 2
        assert not any(t.deletes for t in table.scan().plan_files())
    for snap in expected(name)["snapshots"]:  # Java's snapshots still read as Java wrote them
        assert table.scan(snapshot_id=snap["snapshot_id"]).to_arrow().num_rows == snap["expected_row_count"]
    assert_clean(table)


def test_concurrent_append_survives_a_rewrite(tmp_path, kms):
    table = small_table(tmp_path, kms)
    rival = EncryptedTable.load(str(tmp_path / "t"), kms=kms)
    extra = make_rows(10_000, 10_100)
    expected_rows = pa.concat_tables([table.scan().to_arrow(), extra])

    def progress(event, detail):
        if event == "commit":
            rival.append(extra)  # lands between the rewrite's planning and its commit

    result = table.rewrite_data_files(progress=progress)
    assert result.snapshot_id == table.current_snapshot_id
    snaps = table.snapshots()
    assert snaps[-1].summary["operation"] == "replace" and snaps[-2].summary["operation"] == "append"
    assert digest(table.scan().to_arrow()) == digest(expected_rows)
    assert any("10000" in str(t.file.record_count) or True for t in table.scan().plan_files())
    assert_clean(table)


def test_concurrent_delete_on_rewritten_files_is_a_conflict(tmp_path, kms):
    table = small_table(tmp_path, kms)
    rival = EncryptedTable.load(str(tmp_path / "t"), kms=kms)
    root = tmp_path / "t"
    files_before = {p for p in root.rglob("*") if p.is_file()}

    def progress(event, detail):
        if event == "commit":
            rival.delete("id = 5")

    with pytest.raises(CommitConflictError):
        table.rewrite_data_files(progress=progress)
    table.refresh()
    assert table.current_snapshot().summary["operation"] == "delete"
    # the rewrite's files were deleted: only the rival's new files are new
    new = {p for p in root.rglob("*") if p.is_file()} - files_before
    referenced = referenced_files(table)
    assert all(str(p) in referenced or p.name == "version-hint.text" for p in new)
    assert table.scan().count() == 6 * 200 - 1
    assert_clean(table)


# --- rewrite_manifests -------------------------------------------------------------------------------


def test_rewrite_manifests_merges_by_target_size(tmp_path, kms):
    table = small_table(tmp_path, kms, appends=8)
    table.delete("id in (" + ", ".join(str(i) for i in range(0, 1600, 11)) + ")")
    rows = digest(table.scan().to_arrow())
    manifests = table.manifests(table.current_snapshot())
    assert len(manifests) == 9
    result = table.rewrite_manifests()
    snap = table.current_snapshot()
    assert result.snapshot_id == snap.snapshot_id
    after = table.manifests(snap)
    assert [m.content for m in after] == [0, 1]  # one data and one delete manifest
    assert snap.summary["operation"] == "replace"
    # the 8 data manifests become one; the single delete manifest is kept (Java's rule)
    assert snap.summary["manifests-replaced"] == "8" and snap.summary["manifests-created"] == "1"
    assert snap.summary["manifests-kept"] == "1"
    assert snap.summary["entries-processed"] == str(result.entries)
    assert snap.summary["total-records"] == table.snapshots()[-2].summary["total-records"]
    usage = key_usage(table)
    old_keys = {usage.files[m.path] for m in manifests if m.content == 0}
    assert not old_keys & {usage.files[m.path] for m in after if m.content == 0}
    assert digest(table.scan().to_arrow()) == rows
    # already at target: nothing to do
    assert table.rewrite_manifests().snapshot_id == snap.snapshot_id
    # a small target splits, clustered by partition
    result = table.rewrite_manifests(target_size=sum(m.length for m in after if m.content == 0) // 3 + 1)
    assert len([m for m in table.manifests(table.current_snapshot()) if m.content == 0]) == 3
    assert digest(table.scan().to_arrow()) == rows
    assert_clean(table)


def test_rewrite_manifests_clusters_by_partition_value(tmp_path, kms):
    """Regrouped manifests hold neighbouring partition values (10 sorts after 9, not
    between 1 and 2), so a filter on one value skips every other manifest."""
    from pyiceberg.conversions import from_bytes
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import IdentityTransform
    from pyiceberg.types import IntegerType

    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("b", pa.int32(), nullable=False)])
    spec = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="b"))
    table = EncryptedTable.create(str(tmp_path / "t"), schema, kms=kms, table_key_id="keyA", partition_spec=spec,
                                  properties={"commit.manifest-merge.enabled": "false"})
    values = list(range(13))
    for b in reversed(values):  # commit order unrelated to partition order
        table.append(pa.table({"id": pa.array([b * 10, b * 10 + 1], pa.int64()), "b": pa.array([b, b], pa.int32())},
                              schema=schema))
    rows = digest(table.scan().to_arrow())
    total = sum(m.length for m in table.manifests(table.current_snapshot()))
    table.rewrite_manifests(target_size=total // 4 + 1, force=True)
    manifests = table.manifests(table.current_snapshot())
    assert len(manifests) == 4
    ranges = [(from_bytes(IntegerType(), m.partitions[0].lower_bound), from_bytes(IntegerType(), m.partitions[0].upper_bound))
              for m in manifests]
    assert all(high - low <= 3 for low, high in ranges), ranges  # each manifest: 3-4 neighbours ...
    covered = sorted(v for low, high in ranges for v in range(low, high + 1))
    assert set(covered) == set(values)  # ... and together every value
    scan = table.scan(row_filter="b = 12")
    assert len(scan.plan_files()) == 1
    assert scan.metrics.manifests_skipped == len(manifests) - 1
    assert digest(table.scan().to_arrow()) == rows


@pytest.mark.parametrize("name", TABLE_NAMES)
def test_rewrite_manifests_on_java_tables(golden_copy, name):
    table, _ = golden_copy(name)
    rows = digest(table.scan().to_arrow())
    n = len(table.manifests(table.current_snapshot()))
    result = table.rewrite_manifests(force=True)
    assert result.rewritten_manifests == n
    assert digest(table.scan().to_arrow()) == rows
    assert_clean(table)


def test_rewrite_manifests_keeps_a_concurrent_append(tmp_path, kms):
    table = small_table(tmp_path, kms, appends=4)
    rival = EncryptedTable.load(str(tmp_path / "t"), kms=kms)
    extra = make_rows(10_000, 10_050)
    rows = pa.concat_tables([table.scan().to_arrow(), extra])

    def progress(event, detail):
        if event == "commit":
            rival.append(extra)

    table.rewrite_manifests(progress=progress)
    snap = table.current_snapshot()
    assert snap.summary["manifests-kept"] == "1"
    assert digest(table.scan().to_arrow()) == digest(rows)
    assert_clean(table)


# --- remove_orphan_files -----------------------------------------------------------------------------


def test_remove_orphan_files_window_dry_run_and_temporaries(tmp_path, kms):
    table = small_table(tmp_path, kms, appends=3)
    root = tmp_path / "t"
    rows = digest(table.scan().to_arrow())
    stray = root / "data" / "category=alpha" / "stray.parquet"
    stray.write_bytes(b"x" * 10)
    temp = root / "metadata" / ".v9.metadata.json.ab12cd34.tmp"
    temp.write_bytes(b"{}")
    other_hidden = root / "data" / ".keep"
    other_hidden.write_bytes(b"")
    # inside the safety window (default: 3 days): nothing
    assert table.remove_orphan_files(dry_run=True).orphan_files == []
    found = table.remove_orphan_files(older_than=_now_ms() + 1000, dry_run=True)
    assert sorted(found.orphan_files) == sorted([str(stray), str(temp)])
    assert stray.exists() and temp.exists()
    table.remove_orphan_files(older_than=_now_ms() + 1000)
    assert not stray.exists() and not temp.exists() and other_hidden.exists()
    assert digest(table.scan().to_arrow()) == rows
    assert_clean(table)
    # every table file left is referenced
    assert table.remove_orphan_files(older_than=_now_ms() + 1000, dry_run=True).orphan_files == []


def test_remove_orphan_files_keeps_what_old_metadata_references(tmp_path, kms):
    table = small_table(tmp_path, kms, appends=3)
    table.rewrite_data_files(options={"rewrite-all": "true"})
    first = table.snapshots()[0].snapshot_id
    # nothing referenced by any snapshot or logged metadata file is an orphan
    assert table.remove_orphan_files(older_than=_now_ms() + 1000).orphan_files == []
    table.scan(snapshot_id=first).to_arrow()
    expired = table.expire_snapshots(_now_ms() + 1)
    assert expired
    # expiry deleted the old files itself; old metadata files still reference them
    assert table.remove_orphan_files(older_than=_now_ms() + 1000).orphan_files == []
    assert_clean(table)


@pytest.mark.parametrize("name", TABLE_NAMES)
def test_remove_orphan_files_on_java_tables(golden_copy, name):
    table, root = golden_copy(name)
    rows = digest(table.scan().to_arrow())
    (root / "data" / "orphan.parquet").write_bytes(b"PAR1")
    found = table.remove_orphan_files(older_than=_now_ms() + 1000, dry_run=True).orphan_files
    names = sorted(p.rsplit("/", 1)[-1] for p in found)
    # the fixtures' own files beside the table are unreferenced too
    assert names == sorted(["orphan.parquet", "expected.json", "expected_rows.jsonl.gz", "keys.json"])
    table.remove_orphan_files(older_than=_now_ms() + 1000)
    assert digest(table.scan().to_arrow()) == rows
    for snap in expected(name)["snapshots"]:
        assert table.scan(snapshot_id=snap["snapshot_id"]).to_arrow().num_rows == snap["expected_row_count"]
    assert_clean(table)


# --- CLI ---------------------------------------------------------------------------------------------


def test_cli_maintenance_commands(tmp_path, capfd):
    from icecrypt.cli import main
    from icecrypt.kms.local import LocalKms

    keystore = tmp_path / "keys.json"
    LocalKms.create_keystore(keystore, ["master"])
    kms = LocalKms(keystore)
    k = ["--kms-type", "local", "--kms-property", f"encryption.kms.local.keystore={keystore}", "-q"]
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="master", partition_spec=CATEGORY)
    for i in range(3):
        table.append(make_rows(i * 100, i * 100 + 100))
    rows = digest(table.scan().to_arrow())
    path = str(tmp_path / "t")
    (tmp_path / "t" / "data" / "stray.bin").write_bytes(b"?")

    def run(*argv):
        status = main([str(a) for a in argv])
        out, err = capfd.readouterr()
        return status, out, err

    status, out, _ = run("table", "rewrite-data-files", path, "--option", "min-input-files=2", *k)
    assert status == 0 and "rewrote" in out
    status, out, _ = run("table", "rewrite-manifests", path, *k)
    assert status == 0 and "manifest" in out
    status, out, err = run("table", "remove-orphan-files", path, "--dry-run", *k)
    assert status == 0 and out == ""  # inside the 3-day window
    status, out, err = run("table", "remove-orphan-files", path, "--older-than", str(_now_ms() + 1000), "--dry-run", *k)
    assert status == 0 and out.strip().endswith("stray.bin") and "would delete 1" in err
    status, out, _ = run("table", "remove-orphan-files", path, "--older-than", str(_now_ms() + 1000), *k)
    assert status == 0 and not (tmp_path / "t" / "data" / "stray.bin").exists()
    status, out, _ = run("table", "rekey", path, "--all", "--expire", *k)
    assert status == 0 and "retired" in out and "still uses" not in out
    table = EncryptedTable.load(path, kms=kms)
    assert digest(table.scan().to_arrow()) == rows
    assert_clean(table)
    assert "key" not in out.lower().replace("key(s)", "").replace("kek", "")  # ids and counts only


def test_remove_orphan_files_after_the_old_master_key_was_retired(tmp_path):
    """Rotate the master key, retire the old one, then clean up: the old metadata files'
    KEKs are read through their current wrapping (the KEK ids do not change)."""
    from icecrypt.kms.local import LocalKms

    kms = LocalKms.create_keystore(tmp_path / "ks.json", ("m1", "m2"))
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="m1", partition_spec=CATEGORY)
    table.append(make_rows(0, 100))
    table.rotate_keys(new_kek=True)
    table.append(make_rows(100, 200))
    # The first snapshot and its KEK's keys leave the current metadata; old metadata
    # files still list them, wrapped under m1.
    table.expire_snapshots(_now_ms())
    before = digest(table.scan().to_arrow())
    table.rotate_keys(new_kek=True, new_master_key_id="m2")
    kms.remove_key("m1")
    table = EncryptedTable.load(str(tmp_path / "t"), kms=kms)
    assert table.remove_orphan_files(older_than=_now_ms() + 1000).orphan_files == []
    assert digest(table.scan().to_arrow()) == before
    assert_clean(table)


def test_cli_rotate_keys_commits_the_next_version(tmp_path, capfd):
    """icecrypt table rotate-keys commits through the table (next v<N>.metadata.json, the
    metadata log, the version hint), unlike keys rotate-*, which only write a file."""
    from icecrypt.cli import main
    from icecrypt.kms.local import LocalKms

    keystore = tmp_path / "keys.json"
    LocalKms.create_keystore(keystore, ["m1", "m2"])
    kms = LocalKms(keystore)
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="m1", partition_spec=CATEGORY)
    table.append(make_rows(0, 100))
    rows = digest(table.scan().to_arrow())
    k = ["--kms-type", "local", "--kms-property", f"encryption.kms.local.keystore={keystore}"]
    path = str(tmp_path / "t")

    assert main(["table", "rotate-keys", path, *k]) == 0
    out = capfd.readouterr().out
    assert "new KEK" in out and "v3.metadata.json" in out
    assert main(["table", "rotate-keys", path, "--no-new-kek", "--new-master-key", "m2", *k]) == 0
    out = capfd.readouterr().out
    assert "under master key 'm2'" in out and "v4.metadata.json" in out
    assert main(["table", "rotate-keys", path, "--no-new-kek", *k]) == 1  # nothing to rotate
    capfd.readouterr()

    kms.remove_key("m1")
    reloaded = EncryptedTable.load(path, kms=LocalKms(keystore))
    assert reloaded.properties["encryption.key-id"] == "m2"
    assert len(reloaded.metadata["metadata-log"]) == 3
    assert digest(reloaded.scan().to_arrow()) == rows
    assert_clean(reloaded)

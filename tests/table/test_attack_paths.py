"""Attacks on where a table's operations read, write and delete (issue 16, items 2, 3, 4,
16): an attacker who can write the table's storage names files outside the table in
``metadata-log``, manifests and ``location``, or plants symbolic links; no operation may
then read, write or delete anything outside the table.  Each test puts sentinel files
outside the table and checks they are untouched (same bytes, same mtime), and that the
error or the report names the file."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import fastavro
import pyarrow as pa
import pytest
from forgery import without_authenticator

from icecrypt import PathOutsideTableError, TableIdentityError
from icecrypt.table import EncryptedTable
from icecrypt.table.files.io import PathOutsideTableWarning

SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("name", pa.string())])


def rows(start: int, n: int) -> pa.Table:
    return pa.table({"id": list(range(start, start + n)), "name": [f"r{i}" for i in range(start, start + n)]})


class Sentinels:
    """Files outside the table whose bytes and mtimes must survive every operation."""

    def __init__(self, directory: Path):
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.files: dict[Path, tuple[bytes, int]] = {}

    def add(self, name: str, data: bytes | None = None) -> Path:
        path = self.directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data if data is not None else f"sentinel {name}\n".encode())
        old = 1_000_000_000  # far older than any orphan cut-off
        os.utime(path, (old, old))
        self.files[path] = (path.read_bytes(), path.stat().st_mtime_ns)
        return path

    def add_copy(self, name: str, source: Path) -> Path:
        return self.add(name, source.read_bytes())

    def check(self) -> None:
        for path, (data, mtime) in self.files.items():
            assert path.exists(), f"{path} outside the table was deleted"
            assert path.read_bytes() == data, f"{path} outside the table was changed"
            assert path.stat().st_mtime_ns == mtime, f"{path} outside the table was rewritten"
        listed = sorted(p.relative_to(self.directory) for p in self.directory.rglob("*") if p.is_file())
        assert listed == sorted(p.relative_to(self.directory) for p in self.files), "a file was written outside the table"


def newest_metadata(table: EncryptedTable) -> Path:
    table.refresh()
    return Path(table.metadata_location)


def forge_version(table: EncryptedTable, change) -> Path:
    """What the attacker does: write ``v<N+1>.metadata.json`` with ``change`` applied to the
    newest version (without the authenticator, which would refuse it), and point the
    version hint at it."""
    current = newest_metadata(table)
    metadata = without_authenticator(json.loads(current.read_text()))
    metadata.setdefault("metadata-log", []).append({"timestamp-ms": metadata["last-updated-ms"], "metadata-file": str(current)})
    change(metadata)
    number = int(current.name.split(".")[0][1:]) + 1
    forged = current.with_name(f"v{number}.metadata.json")
    forged.write_text(json.dumps(metadata))
    (current.parent / "version-hint.text").write_text(str(number))
    return forged


def plain_avro(path: Path) -> tuple[dict, dict, list[dict]]:
    with path.open("rb") as f:
        reader = fastavro.reader(f)
        meta = {k: v for k, v in reader.metadata.items() if not k.startswith("avro.")}
        return reader.writer_schema, meta, list(reader)


def write_plain_avro(path: Path, schema: dict, meta: dict, records: list[dict]) -> None:
    with path.open("wb") as f:
        fastavro.writer(f, schema, records, codec="deflate", metadata=meta)


def forge_plain_snapshot(table: EncryptedTable, file_path: str, *, status: int, snapshot_id: int = 4242,
                         timestamp_ms: int | None = None, current: bool = False) -> None:
    """A plaintext table's attacker adds a snapshot whose one manifest lists ``file_path``
    (a copy of the current snapshot's first manifest and manifest list, edited)."""
    snapshot = table.current_snapshot()
    list_src = Path(table.fs_path(snapshot.manifest_list))
    list_schema, list_meta, records = plain_avro(list_src)
    manifest_src = Path(table.fs_path(records[0]["manifest_path"]))
    schema, meta, entries = plain_avro(manifest_src)
    entry = dict(entries[0])
    entry["status"] = status
    entry["snapshot_id"] = snapshot_id
    entry["data_file"] = dict(entry["data_file"], file_path=file_path)
    manifest = manifest_src.with_name(f"forged-{snapshot_id}-m0.avro")
    write_plain_avro(manifest, schema, meta, [entry])
    record = dict(records[0])
    record["manifest_path"] = records[0]["manifest_path"].rsplit("/", 1)[0] + "/" + manifest.name
    record["manifest_length"] = manifest.stat().st_size
    record["added_snapshot_id"] = snapshot_id
    manifest_list = list_src.with_name(f"snap-{snapshot_id}-forged.avro")
    write_plain_avro(manifest_list, list_schema, list_meta, [record])

    def add(metadata: dict) -> None:
        forged = dict(next(s for s in metadata["snapshots"] if s["snapshot-id"] == snapshot.snapshot_id))
        forged["snapshot-id"] = snapshot_id
        forged.pop("parent-snapshot-id", None)
        forged["timestamp-ms"] = timestamp_ms if timestamp_ms is not None else forged["timestamp-ms"]
        forged["manifest-list"] = snapshot.manifest_list.rsplit("/", 1)[0] + "/" + manifest_list.name
        metadata["snapshots"].insert(0, forged)
        if current:
            metadata["current-snapshot-id"] = snapshot_id
            metadata["refs"] = {"main": {"snapshot-id": snapshot_id, "type": "branch"}}

    forge_version(table, add)


def parquet_file(table: EncryptedTable) -> Path:
    return Path(next(iter(table.scan().plan_files())).file.fs_path)


@pytest.fixture
def outside(tmp_path) -> Sentinels:
    return Sentinels(tmp_path / "elsewhere")


# --- item 16: a plaintext table's manifest names another table's file ----------------------------------


def plain_table(tmp_path, name: str = "t") -> EncryptedTable:
    table = EncryptedTable.create(str(tmp_path / name), SCHEMA, kms=None, table_key_id=None)
    table.append(rows(0, 5))
    return table


def test_plaintext_scan_refuses_a_data_file_outside_the_table(tmp_path, outside):
    table = plain_table(tmp_path)
    payroll = outside.add_copy("payroll.parquet", parquet_file(table))  # a readable Parquet file
    forge_plain_snapshot(table, str(payroll), status=1, current=True)
    victim = EncryptedTable.load(str(tmp_path / "t"))
    with pytest.raises(PathOutsideTableError, match="payroll.parquet") as caught:
        victim.scan().to_arrow()
    assert str(tmp_path / "t") in str(caught.value) and caught.value.location == str(payroll)
    # the same spelled as file: URIs, with '..' from inside, and with a doubled slash
    for spelled in (f"file://{payroll}", f"file:{payroll}", f"file://localhost{payroll}",
                    f"{tmp_path}/t/data/../../elsewhere/payroll.parquet", f"{tmp_path}/t//../elsewhere/payroll.parquet"):
        forge_plain_snapshot(table, spelled, status=1, current=True, snapshot_id=4243 + len(spelled))
        with pytest.raises(PathOutsideTableError, match="payroll.parquet"):
            EncryptedTable.load(str(tmp_path / "t")).scan().to_arrow()
    outside.check()


def test_plaintext_rewrite_data_files_does_not_copy_an_outside_file_in(tmp_path, outside):
    table = plain_table(tmp_path)
    table.append(rows(5, 5))
    payroll = outside.add_copy("payroll.parquet", parquet_file(table))
    forge_plain_snapshot(table, str(payroll), status=1, current=True)
    victim = EncryptedTable.load(str(tmp_path / "t"))
    before = sorted(p.name for p in (tmp_path / "t" / "data").rglob("*"))
    with pytest.raises(PathOutsideTableError, match="payroll.parquet"):
        victim.rewrite_data_files(options={"rewrite-all": "true"})
    assert sorted(p.name for p in (tmp_path / "t" / "data").rglob("*")) == before  # nothing written
    outside.check()


def test_allowed_locations_opt_in_reads_a_file_elsewhere(tmp_path, outside):
    table = plain_table(tmp_path)
    shared = outside.add_copy("shared/lookup.parquet", parquet_file(table))
    forge_plain_snapshot(table, str(shared), status=1, current=True)
    with pytest.raises(PathOutsideTableError):
        EncryptedTable.load(str(tmp_path / "t")).scan().to_arrow()
    allowed = EncryptedTable.load(str(tmp_path / "t"), allowed_locations=[str(outside.directory / "shared")])
    assert sorted(allowed.scan().to_arrow()["id"].to_pylist()) == list(range(5))
    # an allowed location is read, never deleted: an old snapshot that deleted it expires
    other = plain_table(tmp_path, "t2")
    forge_plain_snapshot(other, str(shared), status=2, snapshot_id=7000, timestamp_ms=1)
    allowed = EncryptedTable.load(str(tmp_path / "t2"), allowed_locations=[str(outside.directory / "shared")])
    with pytest.warns(PathOutsideTableWarning, match="lookup.parquet"):
        expired = allowed.expire_snapshots(2)
    assert 7000 in expired and expired.skipped_files == [str(shared)]
    outside.check()


# --- item 4: expire_snapshots and a fake old snapshot -------------------------------------------------


def test_expire_snapshots_never_deletes_a_file_outside_the_table(tmp_path, outside):
    table = plain_table(tmp_path)
    table.append(rows(5, 5))
    victims = [outside.add("payroll.parquet"), outside.add("deep/er/v.avro")]
    spellings = [str(victims[0]), f"file://{victims[1]}", f"{tmp_path}/t/data/../../elsewhere/payroll.parquet",
                 f"FILE:///{str(victims[0]).lstrip('/')}"]
    for i, spelled in enumerate(spellings):
        # an old snapshot that DELETED the file: expiring it makes the file a candidate
        forge_plain_snapshot(table, spelled, status=2, snapshot_id=5000 + i, timestamp_ms=1)
    victim = EncryptedTable.load(str(tmp_path / "t"))
    with pytest.warns(PathOutsideTableWarning, match="payroll.parquet"):
        expired = victim.expire_snapshots(2)
    assert sorted(expired) == [5000, 5001, 5002, 5003]
    assert set(expired.skipped_files) == set(spellings)
    assert not any("elsewhere" in p for p in expired.deleted_files)
    outside.check()
    assert victim.verify().ok and sorted(victim.scan().to_arrow()["id"].to_pylist()) == list(range(10))


def test_expire_snapshots_does_not_delete_through_a_symlinked_directory(tmp_path, outside):
    table = plain_table(tmp_path)
    victim_file = outside.add("payroll.parquet")
    os.symlink(outside.directory, tmp_path / "t" / "data" / "link")
    forge_plain_snapshot(table, f"{tmp_path}/t/data/link/payroll.parquet", status=2, snapshot_id=6000, timestamp_ms=1)
    victim = EncryptedTable.load(str(tmp_path / "t"))
    with pytest.warns(PathOutsideTableWarning, match="symbolic link"):
        expired = victim.expire_snapshots(2)
    assert expired == [6000] and expired.skipped_files == [f"{tmp_path}/t/data/link/payroll.parquet"]
    assert victim_file.exists()
    outside.check()


# --- item 2: metadata-log names files outside: rekey(expire=True) ----------------------------------


def encrypted_table(tmp_path, kms) -> EncryptedTable:
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA")
    table.append(rows(0, 5))
    table.append(rows(5, 5))
    return table


def test_rekey_expire_skips_metadata_log_entries_outside_the_table(tmp_path, kms, outside):
    table = encrypted_table(tmp_path, kms)
    named = [outside.add("other/v3.metadata.json"), outside.add("payroll.parquet"), outside.add("x.metadata.json")]
    log = [f"file://{named[0]}", str(named[1]), f"{tmp_path}/t/metadata/../../elsewhere/x.metadata.json",
           "s3://other-bucket/t/metadata/v1.metadata.json"]

    def point_log_outside(metadata: dict) -> None:
        metadata["metadata-log"] += [{"timestamp-ms": 1, "metadata-file": f} for f in log]

    forge_version(table, point_log_outside)
    victim = EncryptedTable.load(str(tmp_path / "t"), kms=kms)
    with pytest.warns(PathOutsideTableWarning):
        result = victim.rekey(everything=True, expire=True)
    assert set(log) <= set(result.skipped_files)
    assert not any("elsewhere" in p for p in result.removed_metadata_files)
    outside.check()
    victim.refresh()
    assert victim.verify().ok and sorted(victim.scan().to_arrow()["id"].to_pylist()) == list(range(10))


def test_encrypt_table_expiry_deletes_only_metadata_files_the_log_names(tmp_path, kms, outside):
    """encrypt_table(expire_plaintext=True) deleted every metadata-log entry inside the
    table, whatever its name: a forged entry naming a data file the table keeps (here
    another live table's file stored under this table's root, and a stray data file) was
    deleted.  Now it deletes there only what drop_table(purge=True) deletes: entries named
    ``*.metadata.json`` / ``*.metadata.json.gz``; the others are skipped and reported."""
    from icecrypt.table.maintenance.encrypt import encrypt_table

    plain = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=None, table_key_id=None)
    plain.append(rows(0, 10))
    keep = tmp_path / "t" / "data" / "keep" / "precious.parquet"
    keep.parent.mkdir(parents=True)
    keep.write_bytes(b"precious rows")
    manifest = tmp_path / "t" / "metadata" / "kept-manifest.avro"
    manifest.write_bytes(b"kept")
    old_metadata = newest_metadata(plain)
    log = [str(keep), f"file://{manifest}", str(outside.add("payroll.parquet"))]
    forge_version(plain, lambda m: m["metadata-log"].extend({"timestamp-ms": 1, "metadata-file": f} for f in log))
    victim = EncryptedTable.load(str(tmp_path / "t"))
    with pytest.warns(PathOutsideTableWarning):
        result = encrypt_table(victim, kms=kms, table_key_id="keyA", expire_plaintext=True)
    assert keep.read_bytes() == b"precious rows" and manifest.read_bytes() == b"kept"
    assert set(log) <= set(result.skipped_files)
    assert not old_metadata.exists()  # the log's real metadata files went, as before
    outside.check()
    table = EncryptedTable.load(str(tmp_path / "t"), kms=kms)
    assert table.encrypted and sorted(table.scan().to_arrow()["id"].to_pylist()) == list(range(10))


# --- item 3: remove_orphan_files --------------------------------------------------------------------------


def test_remove_orphan_files_ignores_a_moved_location(tmp_path, kms, outside):
    table = encrypted_table(tmp_path, kms)
    old = [outside.add("payroll.parquet"), outside.add("data/00000-0-x.parquet"), outside.add("metadata/v1.metadata.json")]

    def move(metadata: dict) -> None:
        metadata["location"] = str(outside.directory)

    forge_version(table, move)
    try:
        result = table.remove_orphan_files(older_than=2**62)
    except Exception as exc:  # refusing the moved version outright is as good
        assert "location" in str(exc) or "elsewhere" in str(exc), exc
    else:
        assert not any(str(outside.directory) in p for p in result.orphan_files)
    assert all(p.exists() for p in old)
    outside.check()


def test_remove_orphan_files_walks_only_the_pinned_location_and_no_links(tmp_path, kms, outside):
    table = encrypted_table(tmp_path, kms)
    outside.add("payroll.parquet")
    outside.add("deep/secret.avro")
    os.symlink(outside.directory, tmp_path / "t" / "data" / "linked-dir")
    os.symlink(outside.directory / "payroll.parquet", tmp_path / "t" / "data" / "linked-file.parquet")
    orphan = tmp_path / "t" / "data" / "really-an-orphan.parquet"
    orphan.write_bytes(b"x")
    os.utime(orphan, (1_000_000, 1_000_000))
    result = table.remove_orphan_files(older_than=2**62)
    assert result.orphan_files == [str(orphan)]
    assert not orphan.exists()
    assert (tmp_path / "t" / "data" / "linked-dir").is_symlink() and (tmp_path / "t" / "data" / "linked-file.parquet").is_symlink()
    outside.check()
    assert table.verify().ok


def test_remove_orphan_files_location_argument_must_be_inside(tmp_path, kms, outside):
    table = encrypted_table(tmp_path, kms)
    outside.add("payroll.parquet")
    for location in (str(outside.directory), f"file://{outside.directory}", f"{tmp_path}/t/../elsewhere", f"{tmp_path}/t2"):
        with pytest.raises(PathOutsideTableError, match="outside table"):
            table.remove_orphan_files(older_than=2**62, location=location)
    result = table.remove_orphan_files(older_than=2**62, location=f"{tmp_path}/t/data", dry_run=True)
    assert result.orphan_files == []
    outside.check()


# --- item 3/4: writes never follow a newer version's location -----------------------------------------


def test_writes_never_go_to_a_newer_versions_location(tmp_path, outside):
    table = plain_table(tmp_path)

    def move(metadata: dict) -> None:
        metadata["location"] = str(outside.directory)

    forge_version(table, move)
    with pytest.raises(Exception) as caught:  # refused: by the pin, or by confinement
        table.append(rows(100, 3))
    assert "elsewhere" in str(caught.value) or "location" in str(caught.value)
    outside.check()


def test_a_confined_table_still_reads_java_tables_through_a_location_map(golden):
    from tablelib import TABLE_NAMES

    for name in TABLE_NAMES:
        table = golden(name)
        assert table.locations.confinement is not None
        assert table.verify().ok, name


# --- outside spellings that are refused whatever the roots -------------------------------------------


@pytest.mark.parametrize(
    "spelled",
    ["{t}/data/%2e%2e/%2E%2e/elsewhere/p.parquet", "{t}/data/a\\..\\..\\p.parquet", "{t}/data/x/%2e%2e/%00p.parquet",
     "{t}/data/\x00p.parquet", "{t}/data/\x1b[31mp.parquet"],
)
def test_encoded_dot_segments_and_control_characters_are_refused(tmp_path, outside, spelled):
    table = plain_table(tmp_path)
    outside.add("p.parquet")
    forge_plain_snapshot(table, spelled.format(t=f"{tmp_path}/t"), status=1, current=True)
    with pytest.raises(PathOutsideTableError):
        EncryptedTable.load(str(tmp_path / "t")).scan().to_arrow()
    outside.check()


@pytest.mark.parametrize("spelled", ["{t}/data/..%2f..%2f..%2felsewhere%2fp.parquet", "{t}/data/c=..%5C..%5Cp.parquet"])
def test_encoded_separators_name_a_file_inside_the_table(tmp_path, outside, spelled):
    # an encoded separator is a character of one name (Java writes partition values such
    # as "N/A" so): the forged entry names a file in data/ that does not exist, and
    # nothing outside is read
    table = plain_table(tmp_path)
    outside.add("p.parquet")
    forge_plain_snapshot(table, spelled.format(t=f"{tmp_path}/t"), status=1, current=True)
    with pytest.raises(FileNotFoundError, match="data/"):
        EncryptedTable.load(str(tmp_path / "t")).scan().to_arrow()
    outside.check()


def test_repair_and_verify_report_outside_files_without_reading_them(tmp_path, outside):
    table = plain_table(tmp_path)
    payroll = outside.add_copy("payroll.parquet", parquet_file(table))
    forge_plain_snapshot(table, str(payroll), status=1, current=True)
    report = EncryptedTable.load(str(tmp_path / "t")).verify()
    assert not report.ok and any("payroll.parquet" in str(p) and "outside" in str(p) for p in report.problems)
    outside.check()


def test_a_copied_table_is_read_through_a_location_map(tmp_path):
    # a copy's metadata names the original's location: loaded by path without a location
    # map it is refused (a load by path is anchored where the caller points; it would
    # otherwise read, and its maintenance delete, the original's files); with the map it
    # reads the copy's own files
    plain_table(tmp_path)
    shutil.copytree(tmp_path / "t", tmp_path / "copy")
    with pytest.raises(TableIdentityError, match="is not the table directory"):
        EncryptedTable.load(str(tmp_path / "copy"))
    shutil.rmtree(tmp_path / "t")
    copy = EncryptedTable.load(str(tmp_path / "copy"), location_map={str(tmp_path / "t"): str(tmp_path / "copy")})
    assert copy.scan().to_arrow().num_rows == 5


def test_expire_removes_a_link_never_its_target(tmp_path, outside):
    table = plain_table(tmp_path)
    target = outside.add("payroll.parquet")
    link = tmp_path / "t" / "data" / "linked.parquet"
    os.symlink(target, link)
    forge_plain_snapshot(table, str(link), status=2, snapshot_id=6100, timestamp_ms=1)
    expired = EncryptedTable.load(str(tmp_path / "t")).expire_snapshots(2)
    assert expired == [6100] and str(link) in expired.deleted_files
    assert not os.path.lexists(link)
    outside.check()


def test_job_cleanup_lists_and_deletes_only_inside_the_table(tmp_path, outside):
    from icecrypt.table.ops.write import remove_job_leftovers

    table = plain_table(tmp_path)
    operation = "0f0f0f0f-1111-2222-3333-444444444444"
    outside.add(f"00000-1-{operation}-00001.parquet")
    os.symlink(outside.directory, tmp_path / "t" / "data" / "out")
    leftover = tmp_path / "t" / "data" / f"00001-2-{operation}-00001.parquet"
    leftover.write_bytes(b"dead attempt")
    removed = remove_job_leftovers(table, operation, [], [str(outside.directory), f"file://{outside.directory}",
                                                          f"{tmp_path}/t/data/../../elsewhere", f"{tmp_path}/t/data/out"])
    assert removed == [str(leftover)] and not leftover.exists()
    outside.check()


def test_a_fake_snapshot_with_a_manifest_list_outside_expires_without_reading_it(tmp_path, outside):
    table = plain_table(tmp_path)
    table.append(rows(5, 5))
    stolen = outside.add_copy("snap-1-stolen.avro", Path(table.fs_path(table.current_snapshot().manifest_list)))

    def add(metadata: dict) -> None:
        fake = dict(metadata["snapshots"][-1], **{"snapshot-id": 9100, "timestamp-ms": 1, "manifest-list": str(stolen)})
        fake.pop("parent-snapshot-id", None)
        metadata["snapshots"].insert(0, fake)

    forge_version(table, add)
    victim = EncryptedTable.load(str(tmp_path / "t"))
    with pytest.warns(PathOutsideTableWarning, match="snap-1-stolen.avro"):
        expired = victim.expire_snapshots(2)
    assert expired == [9100] and expired.skipped_files == [str(stolen)]
    outside.check()
    assert victim.verify().ok and sorted(victim.scan().to_arrow()["id"].to_pylist()) == list(range(10))


def test_remove_orphan_files_is_not_stopped_by_a_foreign_scheme_in_a_manifest(tmp_path, outside):
    table = plain_table(tmp_path)
    outside.add("payroll.parquet")
    forge_plain_snapshot(table, "gs://other-bucket/payroll.parquet", status=1, snapshot_id=9200, timestamp_ms=1)
    orphan = tmp_path / "t" / "data" / "orphan.parquet"
    orphan.write_bytes(b"x")
    os.utime(orphan, (1_000_000, 1_000_000))
    result = EncryptedTable.load(str(tmp_path / "t")).remove_orphan_files(older_than=2**62)
    assert result.orphan_files == [str(orphan)] and not orphan.exists()
    outside.check()

"""Keys dropped by a writer that does not know encryption: detection on load
(``KeysLostError``) and ``repair_keys`` / ``icecrypt table repair``.

The breaking writer is PyIceberg 0.12 committing through its ``SqlCatalog`` on SQLite.
PyIceberg 0.12 refuses to serialize format-version 3 metadata
(``TableMetadataV3.model_dump_json`` raises NotImplementedError), and table encryption
needs v3, so an unmodified 0.12 commit fails and leaves the table as it was, plus an
empty metadata file (:func:`test_pyiceberg_012_refuses_to_commit_v3`).  A PyIceberg that writes v3 with the
same model (no ``encryption-keys``, no snapshot ``key-id``) drops the keys: the
``v3_writing_pyiceberg`` fixture lifts that one guard, putting pydantic's own
serializer back, and everything else of the commit is PyIceberg's real code path
(update_table_metadata, the catalog's compare-and-swap in SQLite, the metadata file it
writes).
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pyarrow as pa
import pydantic
import pytest
from forgery import legacy
from pyiceberg.catalog import sql as pyiceberg_sql
from tablelib import TABLE_NAMES, copy_table, location_map, metadata_path, table_digest

from icecrypt.cli import main
from icecrypt.errors import KeysLostError, RepairError, TableIntegrityError
from icecrypt.kms.memory import MemoryKms
from icecrypt.table import EncryptedTable
from icecrypt.table.commit import store as _commit
from icecrypt.table.maintenance.repair import find_lost_keys
from icecrypt.table.ops.write import _log_previous

MEMORY_KMS = ["--kms-type", "memory", "--kms-property", "encryption.kms.memory.iceberg-test-keys=true"]


# --- fixtures and helpers ----------------------------------------------------------------------


@pytest.fixture
def v3_writing_pyiceberg(monkeypatch):
    """PyIceberg with its "Writing V3 is not yet supported" guard lifted (see the module
    docstring): its v3 model serialized by pydantic, as a v3-writing release would."""
    from pyiceberg.table.metadata import TableMetadataV3

    def dump(self, exclude_none=True, exclude=None, by_alias=True, **kwargs):
        return pydantic.BaseModel.model_dump_json(
            self, exclude_none=exclude_none, exclude=exclude, by_alias=by_alias, **kwargs
        )

    monkeypatch.setattr(TableMetadataV3, "model_dump_json", dump)


@pytest.fixture
def sql_catalog(tmp_path):
    """PyIceberg's SqlCatalog on a SQLite file in tmp_path, namespace ``db``."""
    catalog = pyiceberg_sql.SqlCatalog(
        "shared", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=f"file://{tmp_path / 'wh'}"
    )
    catalog.create_namespace("db")
    yield catalog
    catalog.engine.dispose()


def _schema():
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    return Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "name", StringType(), required=False))


def _rows(start: int, count: int) -> pa.Table:
    ids = list(range(start, start + count))
    return pa.table({"id": pa.array(ids, pa.int64()), "name": [f"n{i}" for i in ids]})


def _digest(table: EncryptedTable) -> str:
    return table_digest(table.scan(columns=["id", "name"]).to_arrow())


def _encrypted_table(tmp_path: Path, kms, name: str = "t") -> EncryptedTable:
    """An encrypted path table with two appends (versions v1-v3)."""
    table = EncryptedTable.create(str(tmp_path / "wh" / "db" / name), _schema(), kms=kms, table_key_id="keyA")
    table.append(_rows(0, 50))
    table.append(_rows(50, 25))
    return table


def _pyiceberg_commits(catalog, identifier: str, metadata_location: str, *, properties=None, new_column=None) -> str:
    """Register ``metadata_location`` in the SqlCatalog and make PyIceberg metadata-only
    commits (a property change, then a schema change); returns the catalog's new
    metadata location, as a path."""
    from pyiceberg.types import StringType

    table = catalog.register_table(identifier, metadata_location)
    with table.transaction() as tx:
        tx.set_properties(**(properties or {"owner": "alice"}))
    if new_column:
        table = catalog.load_table(identifier)
        with table.update_schema() as update:
            update.add_column(new_column, StringType())
    location = catalog.load_table(identifier).metadata_location
    return location.removeprefix("file://")


def _listing(table_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((table_dir / "metadata").glob("*.json"))}


# --- PyIceberg 0.12 as released -------------------------------------------------------------------


def test_pyiceberg_012_refuses_to_commit_v3(tmp_path, kms, sql_catalog):
    table = _encrypted_table(tmp_path, kms)
    before = _listing(tmp_path / "wh" / "db" / "t")
    registered = sql_catalog.register_table("db.t", table.metadata_location)
    with pytest.raises(NotImplementedError, match="V3"), registered.transaction() as tx:
        tx.set_properties(owner="alice")
    assert sql_catalog.load_table("db.t").metadata_location == table.metadata_location
    after = _listing(tmp_path / "wh" / "db" / "t")
    # PyIceberg opened its output file before serializing: an empty file is left behind
    leftovers = {name: data for name, data in after.items() if name not in before}
    assert {k: v for k, v in after.items() if k in before} == before
    assert [name[:6] for name in leftovers] == ["00000-"] and list(leftovers.values()) == [b""]
    assert EncryptedTable.load(str(tmp_path / "wh" / "db" / "t"), kms=kms).properties.get("owner") is None


# --- detection and repair of a real PyIceberg commit -------------------------------------------------


def test_pyiceberg_commit_is_detected_and_repaired(tmp_path, kms, sql_catalog, v3_writing_pyiceberg):
    table = _encrypted_table(tmp_path, kms)
    digest, good = _digest(table), table.metadata_location
    snapshot_ids = {s.snapshot_id for s in table.snapshots()}
    broken = _pyiceberg_commits(sql_catalog, "db.t", good, new_column="note")
    raw = json.loads(Path(broken).read_text())
    assert "encryption-keys" not in raw and all("key-id" not in s for s in raw["snapshots"])  # what PyIceberg wrote
    first_drop = raw["metadata-log"][-1]["metadata-file"]  # PyIceberg's first commit (property change)
    assert Path(first_drop).name.startswith("00000-")

    with pytest.raises(KeysLostError) as caught:
        EncryptedTable.load(broken, kms=kms)
    error = caught.value
    assert error.metadata_location == broken and set(error.snapshot_ids) == snapshot_ids
    assert error.dropped_by == first_drop
    text = str(error)
    # the damaged file, the commit that dropped the keys, the last file that held them
    assert broken in text and first_drop in text and good in text
    assert "repair_keys()" in text and "icecrypt table repair" in text

    damaged = EncryptedTable.load(broken, kms=kms, check_keys=False)
    listing = _listing(tmp_path / "wh" / "db" / "t")
    dry = damaged.repair_keys(dry_run=True)
    assert dry.dry_run and dry.committed_location is None and set(dry.restored_key_ids) == snapshot_ids
    assert _listing(tmp_path / "wh" / "db" / "t") == listing and damaged.metadata_location == broken

    report = damaged.repair_keys()
    assert report.restored_key_ids == dry.restored_key_ids and report.restored_entries == dry.restored_entries
    assert report.dropped_by == first_drop and set(report.restored_entries.values()) == {good}
    assert report.committed_location == damaged.metadata_location != broken
    secrets = [e["encrypted-key-metadata"] for e in json.loads(Path(good).read_text())["encryption-keys"]]
    assert not any(secret in str(report) or secret in repr(report) for secret in secrets)  # ids only
    by_file = EncryptedTable.load(report.committed_location, kms=kms)
    for loaded in (by_file, EncryptedTable.load(str(tmp_path / "wh" / "db" / "t"), kms=kms)):  # file; Hadoop layout
        assert loaded.metadata_location == report.committed_location
        assert _digest(loaded) == digest
        assert loaded.properties["owner"] == "alice"  # PyIceberg's changes stay
        assert "note" in loaded.schema.column_names
        assert loaded.verify().ok
        assert loaded.metadata["metadata-log"][-1]["metadata-file"].endswith(Path(broken).name)
    # the table keeps working: a new commit here after the repair
    repaired = EncryptedTable.load(report.committed_location, kms=kms)
    repaired.append(_rows(75, 5))
    assert repaired.scan(columns=["id"]).to_arrow().num_rows == 80
    assert repaired.repair_keys().changed is False


def test_detection_reads_nothing_more_when_nothing_is_lost(tmp_path, kms):
    """A healthy encrypted table: the check makes no KMS call and opens no file beyond
    the metadata file itself."""
    import fsspec.implementations.local
    import pyarrow.fs as pafs

    table = _encrypted_table(tmp_path, kms)
    opened: list[str] = []

    class CountingFs(fsspec.implementations.local.LocalFileSystem):
        def _open(self, path, *args, **kwargs):
            opened.append(str(path))
            return super()._open(path, *args, **kwargs)

    class CountingKms(MemoryKms):
        calls = 0

        def unwrap_key(self, wrapped, wrapping_key_id):
            CountingKms.calls += 1
            return super().unwrap_key(wrapped, wrapping_key_id)

    counting_kms = CountingKms.with_iceberg_test_keys()
    filesystem = pafs.PyFileSystem(pafs.FSSpecHandler(CountingFs(skip_instance_cache=True)))
    loaded = EncryptedTable.load(table.metadata_location, kms=counting_kms, filesystem=filesystem)
    # one KMS call: the metadata key that verifies the version's authenticator
    assert opened == [table.metadata_location] and CountingKms.calls == 1
    assert find_lost_keys(loaded.metadata, loaded.locations) == []


# --- ambiguous or impossible repairs are refused ------------------------------------------------


@pytest.fixture
def broken_table(tmp_path, kms, sql_catalog, v3_writing_pyiceberg):
    """(damaged table opened with check_keys=False, its table directory) after a real
    PyIceberg property commit on an encrypted path table with versions v1-v3."""
    table = _encrypted_table(tmp_path, kms)
    broken = _pyiceberg_commits(sql_catalog, "db.t", table.metadata_location)
    return EncryptedTable.load(broken, kms=kms, check_keys=False), tmp_path / "wh" / "db" / "t"


def _edit(path: Path, change) -> None:
    metadata = json.loads(path.read_text())
    change(metadata)
    path.write_text(json.dumps(metadata))


def _refused(table: EncryptedTable, table_dir: Path, match: str, dry_runs=(True, False)) -> None:
    before = _listing(table_dir)
    for dry_run in dry_runs:
        with pytest.raises(RepairError, match=match):
            table.repair_keys(dry_run=dry_run)
    assert _listing(table_dir) == before


def test_refused_when_previous_versions_disagree_about_a_key_id(broken_table, capfd):
    table, table_dir = broken_table
    first = table.snapshots()[0].snapshot_id

    def other_key_id(metadata):
        for snapshot in metadata["snapshots"]:
            if snapshot["snapshot-id"] == first:
                snapshot["key-id"] = "AAAAAAAAAAAAAAAAAAAAAA=="

    _edit(table_dir / "metadata" / "v2.metadata.json", other_key_id)
    _refused(table, table_dir, f"disagree about the key-id of snapshot {first}")
    capfd.readouterr()
    assert main(["table", "repair", table.metadata_location, *MEMORY_KMS]) == 1
    assert "ambiguous" in capfd.readouterr().err


def test_refused_when_previous_versions_disagree_about_an_entry(broken_table):
    table, table_dir = broken_table
    v2 = table_dir / "metadata" / "v2.metadata.json"
    key_id = json.loads(v2.read_text())["snapshots"][0]["key-id"]

    def other_entry(metadata):
        for entry in metadata["encryption-keys"]:
            if entry["key-id"] == key_id:
                entry["encrypted-key-metadata"] = entry["encrypted-key-metadata"][::-1]

    _edit(v2, other_entry)
    _refused(table, table_dir, "ambiguous: previous metadata files hold different encryption-keys entries")


def test_refused_when_no_previous_version_holds_the_keys(broken_table):
    table, table_dir = broken_table
    for name in ("v2.metadata.json", "v3.metadata.json"):
        os.remove(table_dir / "metadata" / name)
    _refused(table, table_dir, "no metadata file of the metadata-log records a key-id")


def test_refused_when_a_recovered_key_does_not_authenticate(broken_table):
    """Consistent but wrong: every previous file swaps the two snapshots' wrapped
    manifest-list keys (each unwraps, neither opens the other's manifest list)."""
    table, table_dir = broken_table

    def swap(metadata):
        ids = {s["key-id"] for s in metadata["snapshots"]}
        entries = [e for e in metadata.get("encryption-keys", []) if e["key-id"] in ids]
        if len(entries) == 2:
            a, b = entries
            name = "encrypted-key-metadata"
            a[name], b[name] = b[name], a[name]

    _edit(table_dir / "metadata" / "v3.metadata.json", swap)
    # v2 holds only the first snapshot: give it the swapped entry too, so the files agree
    v3 = json.loads((table_dir / "metadata" / "v3.metadata.json").read_text())
    swapped = {e["key-id"]: e for e in v3["encryption-keys"]}
    _edit(table_dir / "metadata" / "v2.metadata.json",
          lambda m: m.__setitem__("encryption-keys", [swapped.get(e["key-id"], e) for e in m["encryption-keys"]]))
    _refused(table, table_dir, "does not authenticate its manifest list")


def test_refused_when_a_newer_version_does_not_follow(broken_table, kms):
    """A path table whose directory holds a Hadoop version newer than the damaged file
    and not in its metadata-log: another writer's, so the repair does not commit."""
    table, table_dir = broken_table
    healthy = EncryptedTable.load(str(table_dir / "metadata" / "v3.metadata.json"), kms=kms)
    healthy.append(_rows(100, 3))  # v4, unaware of PyIceberg's file
    _refused(table, table_dir, "does not follow it", dry_runs=(False,))


def test_a_repair_that_loses_the_race_refuses(broken_table, kms, monkeypatch):
    """Another writer commits the next version after the repair checked that none
    exists and before it commits: the repair (on the one committer, without retries)
    refuses with CommitConflictError, is built once, and commits nothing."""
    from icecrypt.errors import CommitConflictError
    from icecrypt.table.maintenance import repair

    table, table_dir = broken_table
    checked = []
    real_check = repair._check_newest

    def check_then_lose(target, location):
        real_check(target, location)
        checked.append(location)
        healthy = EncryptedTable.load(str(table_dir / "metadata" / "v3.metadata.json"), kms=kms)
        healthy.append(_rows(100, 3))  # v4: the name the repair commits under

    monkeypatch.setattr(repair, "_check_newest", check_then_lose)
    before = _listing(table_dir)
    with pytest.raises(CommitConflictError, match="another commit landed while the keys were being restored"):
        table.repair_keys()
    assert checked == [table.metadata_location]  # built once, on the damaged version
    after = _listing(table_dir)
    assert set(after) - set(before) == {"v4.metadata.json"}
    assert all("key-id" in s for s in json.loads(after["v4.metadata.json"])["snapshots"])  # the other writer's
    assert {k: v for k, v in after.items() if k in before} == before


def test_restored_key_ids_never_replace_and_stay_local():
    """The repair's own update restores a missing key-id (as the last field), refuses to
    replace another one or to name a snapshot not in the table, and like the other
    icecrypt-only updates is marked local (never sent to a REST catalog)."""
    from icecrypt.table.model import changes

    base = {"snapshots": [{"snapshot-id": 1, "key-id": "a", "manifest-list": "m1"},
                          {"snapshot-id": 2, "manifest-list": "m2"}]}  # fmt: skip
    done = changes.apply(base, [changes.RestoreSnapshotKeyIds({2: "b", 1: "a"})], now=5)
    assert [list(s) for s in done["snapshots"]] == [["snapshot-id", "key-id", "manifest-list"],
                                                    ["snapshot-id", "manifest-list", "key-id"]]  # fmt: skip
    assert done["snapshots"][1]["key-id"] == "b" and "key-id" not in base["snapshots"][1]
    with pytest.raises(ValueError, match="another key-id"):
        changes.apply(base, [changes.RestoreSnapshotKeyIds({1: "z"})])
    with pytest.raises(ValueError, match="not in the table"):
        changes.apply(base, [changes.RestoreSnapshotKeyIds({3: "c"})])
    local = {u.action for u in vars(changes).values() if isinstance(u, type) and issubclass(u, changes.TableUpdate)
             and u is not changes.TableUpdate and u.local}  # fmt: skip
    assert local == {"set-encryption-keys", "reset-metadata-log", "restore-snapshot-key-ids"}


# --- no false alarms ---------------------------------------------------------------------------------


def test_plaintext_table_is_not_flagged(tmp_path, kms, sql_catalog, v3_writing_pyiceberg):
    table = EncryptedTable.create(str(tmp_path / "wh" / "db" / "p"), _schema(), kms=None, table_key_id=None)
    table.append(_rows(0, 10))
    broken = _pyiceberg_commits(sql_catalog, "db.p", table.metadata_location)
    loaded = EncryptedTable.load(broken)
    assert not loaded.encrypted and loaded.scan().to_arrow().num_rows == 10
    assert loaded.repair_keys().changed is False


def _pre_encryption_table(tmp_path: Path, kms) -> EncryptedTable:
    """A table with a plaintext snapshot written before encryption was enabled (the
    property set by a metadata commit), then, after a reset of the current snapshot,
    an encrypted append: snapshots [plaintext without key-id, encrypted with key-id]."""
    table = EncryptedTable.create(str(tmp_path / "wh" / "db" / "mixed"), _schema(), kms=None, table_key_id=None)
    table.append(_rows(0, 10))
    enabled = copy.deepcopy(table.metadata)
    enabled["properties"]["encryption.key-id"] = "keyA"
    _log_previous(enabled, table.metadata, table.metadata_location)
    location = _commit.commit_metadata(table.filesystem, table.metadata_location, enabled, base=table.metadata)
    reset = copy.deepcopy(enabled)
    reset["current-snapshot-id"], reset["refs"] = -1, {}
    _log_previous(reset, enabled, location)
    _commit.commit_metadata(table.filesystem, location, reset, base=enabled)
    table = EncryptedTable.load(str(tmp_path / "wh" / "db" / "mixed"), kms=kms)
    assert table.encrypted
    table.append(_rows(10, 5))
    assert [s.key_id is None for s in table.snapshots()] == [True, False]
    return table


def test_pre_encryption_plaintext_snapshots_are_not_flagged(tmp_path, kms, sql_catalog, v3_writing_pyiceberg):
    table = _pre_encryption_table(tmp_path, kms)
    plaintext, encrypted = (s.snapshot_id for s in table.snapshots())
    reloaded = EncryptedTable.load(table.metadata_location, kms=kms)  # no false alarm
    assert reloaded.scan().to_arrow().num_rows == 5
    assert find_lost_keys(reloaded.metadata, reloaded.locations) == []

    broken = _pyiceberg_commits(sql_catalog, "db.mixed", table.metadata_location)
    with pytest.raises(KeysLostError) as caught:
        EncryptedTable.load(broken, kms=kms)
    assert caught.value.snapshot_ids == (encrypted,)  # the plaintext snapshot is not flagged
    report = EncryptedTable.load(broken, kms=kms, check_keys=False).repair_keys()
    assert list(report.restored_key_ids) == [encrypted]
    repaired = EncryptedTable.load(report.committed_location, kms=kms)
    assert repaired.snapshot(plaintext).key_id is None
    assert repaired.scan().to_arrow().num_rows == 5 and repaired.properties["owner"] == "alice"


def test_lost_entries_and_keks_are_detected_from_the_document(tmp_path, kms):
    """key-id kept but its entry, or the entry's KEK, dropped: decided without reading
    any other file, and repaired from the log."""
    table = _encrypted_table(tmp_path, kms)
    snapshot = table.current_snapshot()
    entry = table.encryption_manager.get_key(snapshot.key_id)
    for dropped, reason in ((entry.encrypted_by_id, "no-kek"), (snapshot.key_id, "no-entry")):
        damaged = copy.deepcopy(table.metadata)
        damaged["encryption-keys"] = [e for e in damaged["encryption-keys"] if e["key-id"] != dropped]
        lost = find_lost_keys(damaged, table.locations)
        assert snapshot.snapshot_id in {item.snapshot_id for item in lost}
        assert {item.reason for item in lost if item.snapshot_id == snapshot.snapshot_id} == {reason}
    _log_previous(damaged, table.metadata, table.metadata_location)  # as any writer logs its base
    location = _commit.commit_metadata(table.filesystem, table.metadata_location, damaged, base=table.metadata)
    with pytest.raises(KeysLostError, match="names no encryption-keys entry") as caught:
        EncryptedTable.load(location, kms=kms)
    assert caught.value.dropped_by == location
    report = EncryptedTable.load(location, kms=kms, check_keys=False).repair_keys()
    assert report.restored_key_ids == {} and snapshot.key_id in report.restored_entries
    assert EncryptedTable.load(report.committed_location, kms=kms).verify().ok


def test_refresh_raises_when_the_newest_version_lost_keys(tmp_path, kms):
    # a table made before authentication (an authenticated one refuses the writer's version
    # first: it carries no authenticator, test_catalog_table_broken_by_pyiceberg_...)
    table = legacy(_encrypted_table(tmp_path, kms))
    stripped = copy.deepcopy(table.metadata)
    stripped.pop("encryption-keys")
    stripped["snapshots"] = [{k: v for k, v in s.items() if k != "key-id"} for s in stripped["snapshots"]]
    stale = EncryptedTable.load(table.metadata_location, kms=kms)
    _commit.commit_metadata(table.filesystem, table.metadata_location, stripped, base=table.metadata)
    with pytest.raises(KeysLostError):
        stale.refresh()
    assert stale.metadata_location == table.metadata_location  # the table object keeps its state


def test_no_commit_on_top_of_a_version_that_lost_keys(tmp_path, kms):
    """A table object holding an older version appends after another writer dropped
    keys: the append refuses before committing, and leaves no file behind (a table made
    before authentication: an authenticated one refuses the version first)."""
    table = legacy(_encrypted_table(tmp_path, kms))
    stale = EncryptedTable.load(table.metadata_location, kms=kms)
    damaged = copy.deepcopy(table.metadata)
    dropped = table.snapshots()[0].key_id
    damaged["encryption-keys"] = [e for e in damaged["encryption-keys"] if e["key-id"] != dropped]
    _log_previous(damaged, table.metadata, table.metadata_location)
    broken = _commit.commit_metadata(table.filesystem, table.metadata_location, damaged, base=table.metadata)
    root = Path(table.location)
    before = sorted(p for p in root.rglob("*") if p.is_file())
    with pytest.raises(KeysLostError, match="names no encryption-keys entry"):
        stale.append(_rows(100, 5))
    assert _commit.latest_metadata_location(table.filesystem, table.metadata_location) == broken
    assert sorted(p for p in root.rglob("*") if p.is_file()) == before


# --- Iceberg Java's tables ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", TABLE_NAMES)
def test_java_tables_load_without_false_alarm(name, kms, tmp_path):
    root = copy_table(name, tmp_path)
    table = EncryptedTable.load(metadata_path(name, root), kms=kms, location_map=location_map(name, root))
    assert find_lost_keys(table.metadata, table.locations) == []
    assert table.repair_keys().changed is False


def test_pyiceberg_commit_on_a_java_table_is_repaired(tmp_path, kms, sql_catalog, v3_writing_pyiceberg):
    name = "enc_deletes_dek16"
    root = copy_table(name, tmp_path)
    mapping = location_map(name, root)
    java = EncryptedTable.load(metadata_path(name, root), kms=kms, location_map=mapping)
    digest = table_digest(java.scan().to_arrow())
    # the table's location is the s3:// one Java wrote; PyIceberg writes its metadata
    # file where write.metadata.path (set in the same commit) says: the local copy
    broken = _pyiceberg_commits(
        sql_catalog, "db.java", str(metadata_path(name, root)),
        properties={"owner": "bob", "write.metadata.path": str(root / "metadata")},
    )  # fmt: skip
    assert Path(broken).parent == root / "metadata"
    with pytest.raises(KeysLostError) as caught:
        EncryptedTable.load(broken, kms=kms, location_map=mapping)
    assert caught.value.dropped_by == broken  # the log's newest entry (Java's last version) still held them
    assert str(metadata_path(name, root).name) in str(caught.value)
    damaged = EncryptedTable.load(broken, kms=kms, location_map=mapping, check_keys=False)
    report = damaged.repair_keys(dry_run=True)
    assert set(report.restored_key_ids) == {s.snapshot_id for s in java.snapshots()}
    # loaded by path, the table is a path table, and a path table's metadata cannot be
    # relocated (Java's HadoopTableOperations refuses the same commit): the repair commits
    # through a catalog (test_catalog_table_broken_by_pyiceberg_is_detected_and_repaired)
    with pytest.raises(ValueError, match="cannot relocate its metadata"):
        damaged.repair_keys()
    assert table_digest(java.scan().to_arrow()) == digest


# --- the command line -----------------------------------------------------------------------------


def test_cli_repair(tmp_path, kms, capfd, sql_catalog, v3_writing_pyiceberg):
    table = _encrypted_table(tmp_path, kms)
    digest = _digest(table)
    broken = _pyiceberg_commits(sql_catalog, "db.t", table.metadata_location)
    capfd.readouterr()

    status = main(["table", "scan", broken, "--count", *MEMORY_KMS])
    _, err = capfd.readouterr()
    assert status == 3 and "encryption keys lost" in err  # a format error, like other damage

    status = main(["table", "repair", broken, "--dry-run", *MEMORY_KMS])
    out, _ = capfd.readouterr()
    assert status == 0 and "dry run: nothing committed" in out and out.count("key-id") == 2
    assert not (tmp_path / "wh" / "db" / "t" / "metadata" / "v4.metadata.json").exists()

    status = main(["table", "repair", broken, *MEMORY_KMS])
    out, _ = capfd.readouterr()
    committed = str(tmp_path / "wh" / "db" / "t" / "metadata" / "v4.metadata.json")
    assert status == 0 and f"committed {committed}" in out
    assert _digest(EncryptedTable.load(committed, kms=kms)) == digest

    status = main(["table", "repair", committed, *MEMORY_KMS])
    out, _ = capfd.readouterr()
    assert status == 0 and "nothing to repair" in out


# --- through icecrypt's catalog ----------------------------------------------------------------------


@pytest.fixture
def shared_catalogs(tmp_path, kms):
    """(icecrypt's SQL catalog, PyIceberg's SqlCatalog) on one SQLite database, namespace
    ``db``, and the warehouse directory."""
    from icecrypt.catalog import load_catalog

    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    ours = load_catalog("shared", warehouse=str(warehouse), kms=kms)
    theirs = pyiceberg_sql.SqlCatalog("shared", uri=ours.uri, warehouse=f"file://{warehouse}")
    ours.create_namespace("db")
    yield ours, theirs, warehouse
    theirs.engine.dispose()


def test_catalog_table_broken_by_pyiceberg_is_detected_and_repaired(shared_catalogs, capfd, v3_writing_pyiceberg):
    """icecrypt's SQL catalog and PyIceberg's SqlCatalog on one SQLite database: PyIceberg's
    commit is detected by load_table and refresh(); the repair commits through the
    catalog (compare-and-swap of its metadata location), and PyIceberg sees it."""
    ours, theirs, warehouse = shared_catalogs
    table = ours.create_table("db.t", _schema(), table_key_id="keyA")
    table.append(_rows(0, 40))
    table.append(_rows(40, 2))
    digest = _digest(table)
    with theirs.load_table("db.t").transaction() as tx:
        tx.set_properties(owner="carol")
    broken = theirs.load_table("db.t").metadata_location.removeprefix("file://")

    with pytest.raises(KeysLostError) as caught:
        ours.load_table("db.t")
    assert caught.value.metadata_location == broken
    # the object from before PyIceberg's commit held an authenticated version: PyIceberg's
    # carries no authenticator, and is refused before its keys are even looked at
    with pytest.raises(TableIntegrityError, match="held an authenticated version"):
        table.refresh()

    damaged = ours.load_table("db.t", check_keys=False)
    assert damaged.metadata_location == broken
    dry = damaged.repair_keys(dry_run=True)
    assert dry.metadata_location == broken and len(dry.restored_key_ids) == 2
    capfd.readouterr()
    cli = ["table", "repair", "db.t", "--dry-run", "--catalog", f"warehouse={warehouse}", "--catalog-name", "shared"]
    assert main([*cli, *MEMORY_KMS]) == 0
    assert "dry run: nothing committed" in capfd.readouterr().out
    assert theirs.load_table("db.t").metadata_location.removeprefix("file://") == broken
    # a table object loaded without the key check repairs the catalog's current version
    report = damaged.repair_keys()
    assert report.committed_location == damaged.metadata_location
    assert Path(report.committed_location).name.startswith("00004-")  # 00000-00002 ours, 00003 PyIceberg's
    current = theirs.load_table("db.t").metadata_location.removeprefix("file://")
    assert current == report.committed_location  # the catalog points at the repair
    repaired = ours.load_table("db.t")
    assert _digest(repaired) == digest and repaired.properties["owner"] == "carol" and repaired.verify().ok


def test_a_catalog_repair_that_loses_the_swap_refuses(shared_catalogs, monkeypatch, v3_writing_pyiceberg):
    """Through icecrypt's SQL catalog: PyIceberg commits again between the repair's check
    and its compare-and-swap. The swap is lost, the repair refuses (CommitConflictError),
    and its metadata file is removed; the catalog keeps PyIceberg's version."""
    from icecrypt.errors import CommitConflictError
    from icecrypt.table.maintenance import repair

    ours, theirs, _ = shared_catalogs
    table = ours.create_table("db.t", _schema(), table_key_id="keyA")
    table.append(_rows(0, 10))
    with theirs.load_table("db.t").transaction() as tx:
        tx.set_properties(owner="carol")
    damaged = ours.load_table("db.t", check_keys=False)
    real_check = repair._check_newest

    def check_then_lose(target, location):
        real_check(target, location)
        with theirs.load_table("db.t").transaction() as tx:
            tx.set_properties(owner="dave")

    monkeypatch.setattr(repair, "_check_newest", check_then_lose)
    metadata_dir = Path(damaged.metadata_location).parent
    with pytest.raises(CommitConflictError, match="another commit landed while the keys were being restored"):
        damaged.repair_keys()
    current = theirs.load_table("db.t")
    assert current.properties["owner"] == "dave"
    names = sorted(p.name for p in metadata_dir.glob("*.metadata.json"))
    # create, append, PyIceberg's two commits; the repair's 00003-<uuid> was removed
    assert [n[:5] for n in names] == ["00000", "00001", "00002", "00003"]
    assert current.metadata_location.removeprefix("file://") == str(metadata_dir / names[-1])

"""encrypt_table / decrypt_table: a plaintext Iceberg table made encrypted (and back) in
one commit, every row kept, nothing plaintext reachable from the new version."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.transforms import BucketTransform, IdentityTransform

from icecrypt.errors import CommitConflictError, KmsKeyNotFoundError
from icecrypt.table import EncryptedTable, decrypt_table, encrypt_table
from icecrypt.table.commit import committer as _committer
from icecrypt.table.model import changes as _model
from icecrypt.table.maintenance.encrypt import CONVERTED_FROM
from icecrypt.table.model.schema import spec_to_json

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "faults"))
from faultfs import FaultPlan, InjectedFault, failing_filesystem  # noqa: E402

KEY = "keyA"


def rows(start: int, n: int) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table({
        "id": pa.array(ids),
        "cat": pa.array([f"c{i % 5}" for i in ids]),
        "amount": pa.array(ids * 1.5),
    })  # fmt: skip


def add_spec(table: EncryptedTable, fields: list[PartitionField]) -> None:
    """A second partition spec, committed through the commit model (AddSpec + SetDefaultSpec)."""
    base = table.metadata
    spec_id = max(s["spec-id"] for s in base["partition-specs"]) + 1
    spec = spec_to_json(PartitionSpec(*fields, spec_id=spec_id))
    change = _model.Change.on(base, [_model.AddSpec(spec), _model.SetDefaultSpec(spec_id)], what="spec update")
    _committer.commit(table, change)


def sorted_rows(table: EncryptedTable, columns=None) -> pa.Table:
    return table.scan(columns=columns).to_arrow().sort_by("id")


def lineage(table: EncryptedTable) -> pa.Table:
    return table.scan(columns=["id", "_row_id", "_last_updated_sequence_number"]).to_arrow().sort_by("id")


def reachable_files(table: EncryptedTable) -> list[str]:
    """Every file reachable from every snapshot of the table (filesystem paths)."""
    from icecrypt.table.files.manifest import read_manifest

    found = []
    for snapshot in table.snapshots():
        found.append(table.fs_path(snapshot.manifest_list))
        for manifest in table.manifests(snapshot):
            found.append(table.fs_path(manifest.path))
            for entry in read_manifest(manifest, table.locations, table.specs, table.schema,
                                       encrypted=table.encrypted, include_deleted=True):  # fmt: skip
                found.append(table.fs_path(entry.file.file_path))
    return found


def magic(path: str) -> tuple[bytes, bytes]:
    with open(path, "rb") as f:
        head = f.read(4)
        f.seek(-4, os.SEEK_END)
        return head, f.read(4)


def assert_all_encrypted(table: EncryptedTable) -> None:
    files = reachable_files(table)
    assert files
    for path in files:
        head, tail = magic(path)
        assert head == b"AGS1" or (head == b"PARE" and tail == b"PARE"), f"{path} is not encrypted ({head!r})"


def assert_all_plaintext(table: EncryptedTable) -> None:
    for path in reachable_files(table):
        head, _ = magic(path)
        assert head in (b"Obj\x01", b"PAR1", b"PFA1"), f"{path} is not plaintext ({head!r})"


def pyiceberg_parses(table: EncryptedTable) -> None:
    from pyiceberg.table.metadata import TableMetadataUtil

    parsed = TableMetadataUtil.parse_raw(Path(table.metadata_location).read_text())
    assert parsed.format_version == 3
    assert parsed.current_snapshot_id == table.current_snapshot_id
    assert [s.spec_id for s in parsed.partition_specs] == [s["spec-id"] for s in table.metadata["partition-specs"]]


@pytest.fixture(scope="module")
def big_plain(tmp_path_factory):
    """A 100,000-row plaintext table with two partition specs and deletes (deletion
    vectors on files of both specs), as a template copied by each test."""
    root = tmp_path_factory.mktemp("plain") / "t"
    spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "cat"))
    table = EncryptedTable.create(str(root), rows(0, 1).schema, kms=None, table_key_id=None, partition_spec=spec)
    table.append(rows(0, 50_000))
    add_spec(table, [PartitionField(1, 1001, BucketTransform(4), "id_bucket")])
    table.append(rows(50_000, 50_000))
    table.delete("id < 300 or (id > 60000 and id < 60100)")
    table.delete("id = 70001")
    return root


@pytest.fixture
def plain(big_plain, tmp_path):
    import shutil

    dest = tmp_path / "t"
    shutil.copytree(big_plain, dest)
    # the copy's metadata records the template's location: map it
    return EncryptedTable.load(str(dest), location_map={str(big_plain): str(dest)}), dest


def test_encrypt_in_place_keeps_every_row(plain, kms):
    table, _ = plain
    before = sorted_rows(table)
    before_lineage = lineage(table)
    assert before.num_rows == 100_000 - 300 - 99 - 1
    specs = table.metadata["partition-specs"]
    result = encrypt_table(table, kms=kms, table_key_id=KEY)
    assert result.in_place and result.table is table
    assert table.encrypted and table.pin.encrypted and table.pin.table_key_id == KEY
    assert table.metadata["format-version"] == 3 and table.metadata["partition-specs"] == specs
    assert [s.snapshot_id for s in table.snapshots()] == [result.snapshot_id]
    assert result.rewritten_data_files >= 2 and result.rewritten_delete_files >= 1
    assert sorted_rows(table).equals(before)
    assert lineage(table).equals(before_lineage)  # row ids and their sequence numbers kept
    assert_all_encrypted(table)
    assert table.verify().ok
    pyiceberg_parses(table)
    # a fresh load (pinned from storage) agrees
    again = EncryptedTable.load(table.metadata_location, kms=kms, location_map=table.location_map)
    assert again.encrypted and sorted_rows(again).equals(before)


def all_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def test_encrypt_into_a_new_table_leaves_the_source_untouched(plain, kms, tmp_path):
    table, root = plain
    before = sorted_rows(table)
    listing = {p: p.stat().st_mtime_ns for p in all_files(root)}
    location = table.metadata_location
    target = tmp_path / "encrypted"
    result = encrypt_table(table, kms=kms, table_key_id=KEY, target=str(target))
    assert not result.in_place and table.metadata_location == location and not table.encrypted
    assert {p: p.stat().st_mtime_ns for p in all_files(root)} == listing  # nothing written, nothing removed
    new = result.table
    assert new.encrypted and new.metadata["table-uuid"] != table.metadata["table-uuid"]
    assert new.metadata["location"] == str(target) and len(new.snapshots()) == 1
    assert sorted_rows(new).equals(before) and lineage(new).equals(lineage(table))
    assert_all_encrypted(new)
    assert new.verify().ok
    pyiceberg_parses(new)
    assert all(str(p).startswith(str(target)) for p in map(Path, reachable_files(new)))
    # a rerun of the same conversion finds it done; another source is refused
    again = encrypt_table(table, kms=kms, table_key_id=KEY, target=str(target))
    assert again.already_done and again.snapshot_id == result.snapshot_id
    table.append(rows(200_000, 3))
    with pytest.raises(FileExistsError, match="a table exists there"):
        encrypt_table(table, kms=kms, table_key_id=KEY, target=str(target))


def test_expire_plaintext_removes_every_plaintext_file(plain, kms):
    table, root = plain
    before = sorted_rows(table)
    result = encrypt_table(table, kms=kms, table_key_id=KEY, expire_plaintext=True)
    assert result.deleted_files and not result.skipped_files
    assert table.metadata["metadata-log"] == []
    assert sorted_rows(table).equals(before) and table.verify().ok
    for path in all_files(root):
        if path.name.endswith(".metadata.json"):
            assert str(path) == table.metadata_location  # older (plaintext-history) versions are gone
            continue
        if path.name == "version-hint.text":
            continue
        head, _ = magic(str(path))
        assert head in (b"AGS1", b"PARE"), f"plaintext file left: {path}"


def test_refusals_write_nothing(plain, kms):
    table, root = plain
    listing = all_files(root)
    with pytest.raises(KmsKeyNotFoundError, match="'no-such-key' cannot be used"):
        encrypt_table(table, kms=kms, table_key_id="no-such-key")
    with pytest.raises(ValueError, match="not encrypted; nothing to decrypt"):
        decrypt_table(table, kms=kms)
    table.manage_snapshots().create_tag("v1", table.current_snapshot_id).commit()
    listing = all_files(root)
    with pytest.raises(ValueError, match=r"refs other than main \(v1\).*drop_refs=True"):
        encrypt_table(table, kms=kms, table_key_id=KEY)
    assert all_files(root) == listing and not table.encrypted
    with pytest.warns(UserWarning, match=r"branches and tags v1 dropped from the table \(drop_refs=True\)"):
        result = encrypt_table(table, kms=kms, table_key_id=KEY, drop_refs=True)
    assert result.dropped_refs == ["v1"] and set(table.metadata["refs"]) == {"main"}
    with pytest.raises(ValueError, match="already encrypted; nothing to encrypt"):
        table.append(rows(300_000, 2))
        encrypt_table(table, kms=kms, table_key_id=KEY)


def test_decrypt_round_trip(plain, kms, tmp_path):
    table, _ = plain
    before, before_lineage = sorted_rows(table), lineage(table)
    encrypt_table(table, kms=kms, table_key_id=KEY)
    out = decrypt_table(table, kms=kms, target=str(tmp_path / "plain-again"))
    free = EncryptedTable.load(out.table.metadata_location)  # no KMS: keys are no longer needed
    assert not free.encrypted and free.format_version == 3
    assert sorted_rows(free).equals(before) and lineage(free).equals(before_lineage)
    assert_all_plaintext(free)
    assert free.verify().ok
    # and in place, expiring the encrypted history
    decrypt_table(table, kms=kms, expire_encrypted=True)
    assert not table.encrypted and not table.pin.encrypted and "encryption-keys" not in table.metadata
    reloaded = EncryptedTable.load(table.metadata_location, location_map=table.location_map)
    assert sorted_rows(reloaded).equals(before) and lineage(reloaded).equals(before_lineage)
    assert_all_plaintext(reloaded)


@pytest.mark.parametrize("version", [1, 2])
def test_pyiceberg_table_gets_the_row_ids_of_an_upgrade(tmp_path, kms, version):
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("pyi", uri=f"sqlite:///{tmp_path}/pyi.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("db")
    data = rows(0, 1000)
    pyi = catalog.create_table("db.t", schema=data.schema, properties={"format-version": str(version)})
    pyi.append(data)
    pyi.append(rows(1000, 500))
    pyi.delete("id < 10")  # copy-on-write: a rewritten data file
    source = EncryptedTable.load(pyi.metadata_location)
    assert source.format_version == version
    before = sorted_rows(source)
    result = encrypt_table(pyi.metadata_location, kms=kms, table_key_id=KEY, target=str(tmp_path / "enc"))
    new = result.table
    assert sorted_rows(new).equals(before) and new.verify().ok
    assert_all_encrypted(new)
    ids = lineage(new).column("_row_id").to_pylist()
    # as the v3 upgrade assigns them: counted from 0 over the live data files (no delete
    # files here: copy-on-write), so exactly 0 .. n-1; the new files' own range follows
    assert sorted(ids) == list(range(before.num_rows))
    assert new.metadata["next-row-id"] == 2 * before.num_rows
    # within a source file, ids follow the rows' positions (first_row_id + _pos): each
    # PyIceberg file holds ascending ids, so each file's rows have consecutive row ids
    by_id = dict(zip(lineage(new).column("id").to_pylist(), ids))
    for first, last in ((10, 999), (1000, 1499)):
        run = [by_id[i] for i in range(first, last + 1)]
        assert run == list(range(run[0], run[0] + len(run)))
    assert new.metadata["properties"]["encryption.key-id"] == KEY
    pyiceberg_parses(new)


FAULT_TABLE = "wh/t"


@pytest.fixture(scope="module")
def fault_template(tmp_path_factory):
    """A small plaintext table on the failing filesystem: two specs, deletion vectors."""
    root = tmp_path_factory.mktemp("fault-template")
    fs, _ = failing_filesystem(root)
    spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "cat"))
    table = EncryptedTable.create(FAULT_TABLE, rows(0, 1).schema, kms=None, table_key_id=None, partition_spec=spec,
                                  filesystem=fs)
    table.append(rows(0, 20))
    add_spec(table, [])
    table.append(rows(20, 10))
    table.delete("id = 3 or id = 25")
    return root


def _fresh(template: Path, dest: Path, plan: FaultPlan | None = None):
    """A copy of the template, loaded; then ``plan`` counts (and fails) the calls."""
    import shutil

    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(template, dest)
    fs, handler = failing_filesystem(dest)
    table = EncryptedTable.load(FAULT_TABLE, filesystem=fs)
    handler.plan = plan or FaultPlan()
    return table, handler


@pytest.mark.slow
@pytest.mark.parametrize("expire", [False, True], ids=["keep-history", "expire-plaintext"])
def test_interrupted_encrypt_leaves_the_old_version_and_a_rerun_finishes(fault_template, tmp_path, kms, expire):
    from faultlib import sample_points

    reference, handler = _fresh(fault_template, tmp_path / "census")
    expected = sorted_rows(reference)
    encrypt_table(reference, kms=kms, table_key_id=KEY, expire_plaintext=expire)
    census = list(handler.plan.calls)
    assert census
    for at in sample_points(census, 40):
        table, handler = _fresh(fault_template, tmp_path / "run", FaultPlan(at=at))
        try:
            encrypt_table(table, kms=kms, table_key_id=KEY, expire_plaintext=expire)
        except InjectedFault:
            pass
        assert handler.plan.fired is not None or at > handler.plan.count, at
        handler.plan.at = None
        # storage holds the old version or the new one, never a mix
        loaded = EncryptedTable.load(FAULT_TABLE, filesystem=table.filesystem, kms=kms)
        assert sorted_rows(loaded).equals(expected), at
        if loaded.encrypted:
            assert [s.summary.get(CONVERTED_FROM) is not None for s in loaded.snapshots()] == [True], at
        else:
            assert loaded.metadata_location.endswith("v5.metadata.json"), at
        # a rerun finishes the conversion
        result = encrypt_table(loaded, kms=kms, table_key_id=KEY, expire_plaintext=expire)
        assert loaded.encrypted and sorted_rows(loaded).equals(expected), at
        assert loaded.verify().ok, at
        for path in reachable_files(loaded):
            head, _ = magic(str(tmp_path / "run" / path))
            assert head in (b"AGS1", b"PARE"), (at, path)
        if expire:
            left = [p for p in all_files(tmp_path / "run" / FAULT_TABLE)
                    if not p.name.endswith(".metadata.json") and p.name != "version-hint.text"
                    and magic(str(p))[0] not in (b"AGS1", b"PARE")]  # fmt: skip
            assert not left, (at, left, result)


def test_killed_run_leftovers_are_removed_by_the_rerun(fault_template, tmp_path, kms, monkeypatch):
    """A run killed before its commit leaves its files (no cleanup ran); the rerun of the
    same conversion deletes them before it writes its own."""
    from icecrypt.table.ops import write as _write

    table, handler = _fresh(fault_template, tmp_path / "run")
    expected = sorted_rows(table)
    root = tmp_path / "run" / FAULT_TABLE
    before = set(all_files(root))
    monkeypatch.setattr(_write, "_cleanup", lambda io, locations: None)  # a kill: nobody cleans up
    # fail the commit itself: every data file, manifest and manifest list is written by then
    monkeypatch.setattr(_write._Target, "commit_metadata", lambda *a, **k: (_ for _ in ()).throw(OSError("killed")))
    with pytest.raises(OSError, match="killed"):
        encrypt_table(table, kms=kms, table_key_id=KEY)
    monkeypatch.undo()
    left = set(all_files(root)) - before
    assert any(p.suffix == ".parquet" for p in left) and any(p.name.startswith("snap-") for p in left)
    loaded = EncryptedTable.load(FAULT_TABLE, filesystem=table.filesystem)
    assert not loaded.encrypted
    encrypt_table(loaded, kms=kms, table_key_id=KEY)
    assert sorted_rows(loaded).equals(expected)
    reachable = {Path(tmp_path / "run" / p) for p in reachable_files(loaded)}
    still = left & set(all_files(root))
    # deleted, or rewritten under the same name by the rerun (the names carry the run id)
    assert still <= reachable, f"the killed run's files are still there: {sorted(still - reachable)}"
    assert any(p.name.startswith("snap-") for p in left - still)


def test_catalog_table_encrypted_in_place_records_the_key_id(tmp_path, kms):
    from icecrypt.catalog import load_catalog
    from icecrypt.errors import TableIdentityError

    warehouse = tmp_path / "wh"
    warehouse.mkdir()
    catalog = load_catalog("enc", warehouse=str(warehouse), kms=kms)
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", rows(0, 1).schema, table_key_id=None)
    table.append(rows(0, 500))
    table.delete("id < 5")
    before = sorted_rows(table)
    encrypt_table(table, kms=kms, table_key_id=KEY)
    assert table.encrypted and sorted_rows(table).equals(before)
    loaded = catalog.load_table("db.t")
    assert loaded.pin.source == "catalog" and loaded.pin.table_key_id == KEY  # recorded with the commit
    assert sorted_rows(loaded).equals(before) and loaded.verify().ok
    assert_all_encrypted(loaded)
    with pytest.raises(ValueError, match="decrypted into a new table"):
        decrypt_table(loaded, kms=kms)
    # a version that drops the encryption behind the catalog's back is refused
    doc = json.loads(Path(loaded.metadata_location).read_text())
    doc["properties"].pop("encryption.key-id")
    with pytest.raises(TableIdentityError):
        loaded.pin.check(doc, "forged.metadata.json")
    out = decrypt_table(loaded, kms=kms, target=str(tmp_path / "leaving"))
    assert sorted_rows(EncryptedTable.load(out.table.metadata_location)).equals(before)


def test_cli_encrypt_and_decrypt(tmp_path, capfd):
    from icecrypt.cli import main
    from icecrypt.kms.local import LocalKms

    keys = tmp_path / "keys.json"
    LocalKms.create_keystore(str(keys), ["orders-key"])
    kms = ["--kms-type", "local", "--kms-property", f"encryption.kms.local.keystore={keys}"]
    location = tmp_path / "orders"
    table = EncryptedTable.create(str(location), rows(0, 1).schema, kms=None, table_key_id=None)
    table.append(rows(0, 40))
    table.delete("id = 7")
    before = sorted_rows(table)

    def run(*argv):
        status = main([str(a) for a in argv])
        out, err = capfd.readouterr()
        return status, out, err

    with pytest.raises(SystemExit):
        main(["table", "encrypt", "--help"])
    out = capfd.readouterr().out
    assert "examples:" in out and "--expire-plaintext" in out
    status, _, err = run("table", "encrypt", location, "--table-key-id", "nope", *kms)
    assert status != 0 and "'nope' cannot be used" in err
    status, _, err = run("table", "encrypt", location, "--table-key-id", "orders-key")
    assert status != 0 and "name the KMS" in err
    status, out, err = run("table", "encrypt", location, "--table-key-id", "orders-key", "--expire-plaintext", *kms)
    assert status == 0, err
    assert "encrypted 39 row(s)" in out
    encrypted = EncryptedTable.load(str(location), kms=LocalKms(str(keys)))
    assert encrypted.encrypted and sorted_rows(encrypted).equals(before)
    assert_all_encrypted(encrypted)
    status, out, err = run("table", "encrypt", location, "--table-key-id", "orders-key", *kms)
    assert status == 0 and out.startswith("already encrypted"), err  # the rerun of a finished conversion
    encrypted.append(rows(100, 2))
    before = sorted_rows(encrypted)
    status, out, err = run("table", "encrypt", location, "--table-key-id", "orders-key", *kms)
    assert status == 1 and "already encrypted; nothing to encrypt" in err
    status, out, err = run("table", "decrypt", location, "--target", tmp_path / "leaving", *kms)
    assert status == 0, err
    free = EncryptedTable.load(str(tmp_path / "leaving"))
    assert not free.encrypted and sorted_rows(free).equals(before)
    status, out, err = run("table", "decrypt", location, "--target", tmp_path / "leaving", *kms)
    assert status == 0 and out.startswith("already decrypted"), err  # the same conversion of the same version
    encrypted.refresh().append(rows(200, 1))
    status, out, err = run("table", "decrypt", location, "--target", tmp_path / "leaving", *kms)
    assert status == 1 and "a table exists there" in err  # the source changed since: another conversion
    encrypted.refresh().manage_snapshots().create_tag("audit", encrypted.current_snapshot_id).commit()
    status, out, err = run("table", "decrypt", location, "--target", tmp_path / "leaving2", *kms)
    assert status == 1 and "refs other than main (audit)" in err
    status, out, err = run("table", "decrypt", location, "--target", tmp_path / "leaving2", "--drop-refs", *kms)
    assert status == 0 and "dropped branches and tags: audit" in err, err
    assert list(EncryptedTable.load(str(tmp_path / "leaving2")).metadata["refs"]) == ["main"]


def _add_delete_files(table: EncryptedTable, positions: list[int], deleted_ids: list[int]) -> None:
    """Commit a v2-style position-delete file (file_path/pos) and an equality-delete file
    (on ``id``), plaintext Parquet, as a format-2 writer (Spark merge-on-read) leaves
    them; icecrypt's own delete() writes deletion vectors only."""
    import pyarrow.parquet as pq

    from icecrypt.table.ops import write as w
    from icecrypt.table.files.manifest_write import EQUALITY_DELETES, POSITION_DELETES, write_manifest

    target = w._Target.of(table)
    base_location, base = target.latest()
    io = target.io(None)
    snapshot_id = w._new_snapshot_id(base)
    data_path = table.scan().plan_files()[0].file.path
    root = table.location.rstrip("/")

    def field(name, type_, field_id):
        return pa.field(name, type_, nullable=False, metadata={b"PARQUET:field_id": str(field_id).encode()})

    files = []
    for content, name, rows_ in (
        (POSITION_DELETES, "pos-deletes.parquet", pa.table(
            {"file_path": [data_path] * len(positions), "pos": positions},
            schema=pa.schema([field("file_path", pa.string(), 2147483546), field("pos", pa.int64(), 2147483545)]))),
        (EQUALITY_DELETES, "eq-deletes.parquet", pa.table(
            {"id": deleted_ids}, schema=pa.schema([field("id", pa.int64(), 1)]))),
    ):  # fmt: skip
        location = f"{root}/data/{name}"
        pq.write_table(rows_, table.fs_path(location))
        files.append({
            "content": content, "file_path": location, "file_format": "PARQUET", "partition": {},
            "record_count": rows_.num_rows, "file_size_in_bytes": os.path.getsize(table.fs_path(location)),
            "column_sizes": None, "value_counts": None, "null_value_counts": None, "nan_value_counts": None,
            "lower_bounds": None, "upper_bounds": None, "key_metadata": None, "split_offsets": None,
            "equality_ids": [1] if content == EQUALITY_DELETES else None, "sort_order_id": None,
            "first_row_id": None, "referenced_data_file": data_path if content == POSITION_DELETES else None,
            "content_offset": None, "content_size_in_bytes": None,
        })  # fmt: skip
    manifest = write_manifest(io, f"{root}/metadata/deletes-m0.avro", w._added_entries(files, snapshot_id),
                              spec=w._specs(base)[0], schema=w._schema(base), content=POSITION_DELETES)  # fmt: skip

    def build(version, manager):
        kept = w._read_manifest_list(io, None, w._current_snapshot(version))
        return w._Change("delete", [manifest], kept, added_files=files)

    target.committed(w._commit_change(target, base_location, base, build, snapshot_id=snapshot_id, retry=False))


def test_position_and_equality_delete_files_are_applied(tmp_path, kms):
    table = EncryptedTable.create(str(tmp_path / "t"), rows(0, 1).schema, kms=None, table_key_id=None)
    table.append(rows(0, 1000))
    _add_delete_files(table, [0, 5, 10], [500, 501])
    tasks = table.scan().plan_files()
    assert sorted(d.content for t in tasks for d in t.deletes) == [1, 2]
    before, before_lineage = sorted_rows(table), lineage(table)
    assert before.num_rows == 995 and 500 not in before.column("id").to_pylist()
    result = encrypt_table(table, kms=kms, table_key_id=KEY, expire_plaintext=True)
    assert result.rewritten_delete_files == 2
    assert sorted_rows(table).equals(before) and lineage(table).equals(before_lineage)
    assert not [t for t in table.scan().plan_files() if t.deletes]
    assert_all_encrypted(table)
    assert not (tmp_path / "t" / "data" / "pos-deletes.parquet").exists()
    assert not (tmp_path / "t" / "data" / "eq-deletes.parquet").exists()
    assert table.verify().ok


def test_a_concurrent_commit_refuses_the_conversion_and_nothing_is_left(plain, kms, monkeypatch):
    from icecrypt.table.maintenance import encrypt as _encrypt_table

    table, root = plain
    other = EncryptedTable.load(table.metadata_location, location_map=table.location_map)
    real = _encrypt_table._lineage_batches

    def racing(*args, **kwargs):
        batches, lineage_, stats = real(*args, **kwargs)

        def gen():
            other.append(rows(500_000, 5))  # another writer commits while the rows are rewritten
            yield from batches

        return gen(), lineage_, stats

    monkeypatch.setattr(_encrypt_table, "_lineage_batches", racing)
    with pytest.raises(CommitConflictError, match="another writer committed"):
        encrypt_table(table, kms=kms, table_key_id=KEY)
    monkeypatch.undo()
    reloaded = EncryptedTable.load(str(root), location_map=table.location_map)
    assert not reloaded.encrypted and reloaded.current_snapshot_id == other.current_snapshot_id
    assert not [p for p in all_files(root) if "encrypt-" in p.name], "the refused run left files"
    assert reloaded.verify().ok
    encrypt_table(reloaded, kms=kms, table_key_id=KEY)  # run again: now it goes through
    assert sorted_rows(reloaded).num_rows == sorted_rows(other).num_rows


def test_an_interrupt_after_the_conversion_landed_keeps_every_file(plain, kms, monkeypatch):
    """A KeyboardInterrupt right after the encrypted version's file is in place (in the
    housekeeping after the commit): the version is current, so none of the files it
    names is deleted; the table reads, verifies, and a rerun finds the conversion done."""
    from icecrypt.table.commit import store

    table, root = plain
    before = sorted_rows(table)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(store, "_after_commit", interrupted)
    with pytest.raises(KeyboardInterrupt):
        encrypt_table(table, kms=kms, table_key_id=KEY)
    monkeypatch.undo()
    loaded = EncryptedTable.load(str(root), kms=kms, location_map=table.location_map)
    assert loaded.encrypted and sorted_rows(loaded).equals(before)
    assert loaded.verify().ok
    assert encrypt_table(loaded, kms=kms, table_key_id=KEY).already_done


def test_the_committer_refuses_a_base_below_v3_unless_told(plain, kms):
    """Only encrypt_table's commit (``any_format_version``) builds on a v1/v2 version."""
    from icecrypt.table.ops import write as w

    table, root = plain
    target = w._Target.of(table)
    older = {**table.metadata, "format-version": 2}
    change = _model.Change.on(older, [_model.SetProperties({"owner": "x"})])
    listing = all_files(root)
    with pytest.raises(ValueError, match="format-version 3 tables only"):
        _committer.commit(target, change, first_base=(table.metadata_location, older))
    assert all_files(root) == listing


def test_a_tampered_target_is_not_taken_for_a_finished_conversion(plain, kms, tmp_path):
    """A rerun into a target returns the table there only when it is this conversion's
    result and verifies: whoever can write the target could have put a look-alike there."""
    table, _ = plain
    target = tmp_path / "encrypted"
    result = encrypt_table(table, kms=kms, table_key_id=KEY, target=str(target))
    data = next(p for p in map(Path, reachable_files(result.table)) if p.suffix == ".parquet")
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 1
    data.write_bytes(bytes(raw))
    with pytest.raises(FileExistsError, match="a table exists there"):
        encrypt_table(table, kms=kms, table_key_id=KEY, target=str(target))
    with pytest.raises(FileExistsError, match="a table exists there"):  # not under the key asked for
        encrypt_table(table, kms=kms, table_key_id="keyB", target=str(target))


def test_the_converted_table_takes_writes_and_maintenance(plain, kms):
    table, root = plain
    encrypt_table(table, kms=kms, table_key_id=KEY)
    table.append(rows(1_000_000, 10))
    table.delete("id = 1000001")
    table.rewrite_manifests(force=True)
    # the plaintext history is still named by the logged (older) metadata versions: an
    # orphan sweep protects it until the versions go
    orphans = table.remove_orphan_files(older_than=4_102_444_800_000, dry_run=True)
    assert orphans.orphan_files == []
    table.expire_snapshots(4_102_444_800_000)
    assert table.verify().ok
    assert sorted_rows(table).num_rows == 100_000 - 400 + 9
    assert_all_encrypted(table)


def test_a_kms_failure_at_each_call_leaves_the_plaintext_version(fault_template, tmp_path, kms):
    from faultkms import FailingKms

    from icecrypt.errors import KmsUnavailableError

    census = FailingKms(kms)
    table, _ = _fresh(fault_template, tmp_path / "census")
    expected = sorted_rows(table)
    encrypt_table(table, kms=census, table_key_id=KEY)
    assert len(census.calls) >= 3  # the key check (wrap, unwrap), the new KEK's wrap
    for at in range(1, len(census.calls) + 1):
        table, _ = _fresh(fault_template, tmp_path / "run")
        listing = all_files(tmp_path / "run")
        with pytest.raises(KmsUnavailableError):
            encrypt_table(table, kms=FailingKms(kms, at=at), table_key_id=KEY)
        assert all_files(tmp_path / "run") == listing, at  # nothing written, or everything written deleted
        loaded = EncryptedTable.load(FAULT_TABLE, filesystem=table.filesystem)
        assert not loaded.encrypted and sorted_rows(loaded).equals(expected)
        encrypt_table(loaded, kms=kms, table_key_id=KEY)
        assert loaded.encrypted and sorted_rows(loaded).equals(expected) and loaded.verify().ok

"""Attacks on a table's identity through its storage: a new metadata version that removes
``encryption.key-id``, names another master key, another ``table-uuid`` or another
location, against every operation that writes; and versions that would go back in time.

Each refused operation must raise TableIdentityError naming the attacker's file before
anything is written (no file added, changed or deleted anywhere under the test's
directory), and the table must verify once the attacker's version is gone."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from forgery import without_authenticator
from test_write_roundtrip import CATEGORY, SCHEMA, digest, make_rows

from icecrypt import TableIdentityError, TableVersionError
from icecrypt.kms.memory import MemoryKms
from icecrypt.table import EncryptedTable, PlaintextFileError

FAR_FUTURE_MS = int(time.time() * 1000) + 10 * 365 * 24 * 3600 * 1000


@pytest.fixture
def kms():
    return MemoryKms.with_iceberg_test_keys()


def _rows(*bounds: int):
    """The rows of appends make_rows(lo, hi) for each (lo, hi) pair of ``bounds``."""
    return pa.concat_tables([make_rows(lo, hi) for lo, hi in zip(bounds[::2], bounds[1::2])])


def _snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` with the digest of its content."""
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def _plaintext(path: str) -> bool:
    """Not an AGS1 stream nor an encrypted Parquet file (metadata.json and the hint are
    plaintext by design and excluded by the callers)."""
    with open(path, "rb") as f:
        head = f.read(4)
    return head not in (b"AGS1", b"PARE")


def _newest(root: Path) -> Path:
    return max((root / "metadata").glob("v*.metadata.json"), key=lambda p: int(p.name[1:].split(".")[0]))


def _attack(root: Path, change) -> Path:
    """Commit a forged next version (and point the hint at it), as whoever can write the
    table's storage can: returns its path."""
    current = _newest(root)
    doc = json.loads(current.read_text())
    change(doc)
    doc["metadata-log"] = [*doc.get("metadata-log", []), {"timestamp-ms": doc["last-updated-ms"], "metadata-file": str(current)}]
    version = int(current.name[1:].split(".")[0]) + 1
    forged = root / "metadata" / f"v{version}.metadata.json"
    forged.write_text(json.dumps(doc))
    (root / "metadata" / "version-hint.text").write_text(str(version))
    return forged


def _undo(root: Path, forged: Path) -> None:
    forged.unlink()
    (root / "metadata" / "version-hint.text").write_text(str(int(forged.name[1:].split(".")[0]) - 1))


def _no_key(doc):
    del doc["properties"]["encryption.key-id"]


def _other_key(doc):
    doc["properties"]["encryption.key-id"] = "keyB"  # a master key the victim's KMS also holds


def _other_uuid(doc):
    doc["table-uuid"] = str(uuid.uuid4())


MUTATIONS = {"no-key-id": _no_key, "other-key-id": _other_key, "other-uuid": _other_uuid}

OPERATIONS = {
    "append": lambda t: t.append(make_rows(1000, 1010)),
    "overwrite": lambda t: t.overwrite(make_rows(2000, 2010)),
    "delete": lambda t: t.delete("id < 5"),
    "expire_snapshots": lambda t: t.expire_snapshots(FAR_FUTURE_MS),
    "rotate_keys": lambda t: t.rotate_keys(),
    "rotate_master_key": lambda t: t.rotate_keys(new_kek=False, new_master_key_id="keyB"),
    "rewrite_data_files": lambda t: t.rewrite_data_files(options={"rewrite-all": "true"}),
    "rewrite_manifests": lambda t: t.rewrite_manifests(force=True),
    "rekey": lambda t: t.rekey(everything=True, expire=True),
    "remove_orphan_files": lambda t: t.remove_orphan_files(FAR_FUTURE_MS),
    "repair_keys": lambda t: t.repair_keys(),
}


@pytest.fixture
def table_dir(tmp_path, kms):
    """An encrypted, partitioned table with two snapshots and an orphan-looking old file."""
    root = tmp_path / "t"
    table = EncryptedTable.create(str(root), SCHEMA, kms=kms, table_key_id="keyA", partition_spec=CATEGORY)
    table.append(make_rows(0, 50))
    table.append(make_rows(50, 100))
    return root


def _check_refused(tmp_path, root, kms, operation, forged, before, *, table):
    with pytest.raises(TableIdentityError) as caught:
        OPERATIONS[operation](table)
    assert str(forged) in str(caught.value)
    assert caught.value.metadata_location == str(forged)
    after = _snapshot(tmp_path)
    assert after == before, "the refused operation wrote, changed or deleted files"
    _undo(root, forged)
    reloaded = EncryptedTable.load(str(root), kms=kms)
    assert reloaded.verify().ok
    assert digest(reloaded.scan().to_arrow()) == digest(_rows(0, 50, 50, 100))


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_forged_version_is_refused_before_anything_is_written(tmp_path, table_dir, kms, operation, mutation):
    table = EncryptedTable.load(str(table_dir), kms=kms)
    forged = _attack(table_dir, MUTATIONS[mutation])
    before = _snapshot(tmp_path)
    _check_refused(tmp_path, table_dir, kms, operation, forged, before, table=table)


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_moved_location_is_refused(tmp_path, table_dir, kms, operation):
    """A version whose location points elsewhere (where new files would be written and
    whose files orphan removal would walk)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "victim.txt").write_text("not the table's")
    table = EncryptedTable.load(str(table_dir), kms=kms)

    def move(doc):
        doc["location"] = str(elsewhere)

    forged = _attack(table_dir, move)
    before = _snapshot(tmp_path)
    _check_refused(tmp_path, table_dir, kms, operation, forged, before, table=table)


def test_plaintext_writer_never_appears_for_an_encrypted_table(tmp_path, table_dir, kms):
    """Item 1 of issue 16 as it was reproduced: the writer loaded the encrypted table with
    require_encryption=True; an attacker's next version drops encryption.key-id; the
    append must not write a single file (it wrote plaintext data and manifests)."""
    table = EncryptedTable.load(str(table_dir), kms=kms, require_encryption=True)
    existing = set(_snapshot(tmp_path))
    forged = _attack(table_dir, _no_key)
    with pytest.raises(TableIdentityError, match="encryption removed"):
        table.append(make_rows(1000, 1010))
    new = [p for p in _snapshot(tmp_path) if p not in existing and not p.endswith((".metadata.json", "version-hint.text"))]
    assert new == []
    assert [p for p in _snapshot(table_dir / "data") if _plaintext(p)] == []
    with pytest.raises(PlaintextFileError, match=str(forged)):  # what require_encryption says at refresh
        table.refresh()
    with pytest.raises(TableIdentityError, match=str(forged)):  # a pin from the loaded version: the same
        EncryptedTable.load(str(table_dir / "metadata" / "v3.metadata.json"), kms=kms).refresh()


def test_write_tasks_check_the_pin(tmp_path, table_dir, kms):
    """The distributed half of a write (what a Spark task runs) refuses the forged base."""
    from icecrypt.table.ops import write as _write

    table = EncryptedTable.load(str(table_dir), kms=kms, table_key_id="keyA")
    forged = _attack(table_dir, _no_key)
    before = _snapshot(tmp_path)
    with pytest.raises(TableIdentityError, match=str(forged)):
        _write.write_files(table, make_rows(1000, 1010))
    assert _snapshot(tmp_path) == before


# --- the pin from the caller -----------------------------------------------------------------


def test_caller_key_id_is_checked_at_load(table_dir, kms):
    with pytest.raises(TableIdentityError, match="master key changed") as caught:
        EncryptedTable.load(str(table_dir), kms=kms, table_key_id="keyB")
    assert caught.value.source == "caller"
    assert caught.value.metadata_location.endswith("v3.metadata.json")
    table = EncryptedTable.load(str(table_dir), kms=kms, table_key_id="keyA")
    assert table.pin.source == "caller" and table.pin.table_key_id == "keyA"
    with pytest.raises(TableIdentityError, match="table-uuid"):
        EncryptedTable.load(str(table_dir), kms=kms, table_uuid=str(uuid.uuid4()))


def test_caller_key_id_refuses_a_plaintext_table(tmp_path, kms):
    root = tmp_path / "plain"
    EncryptedTable.create(str(root), SCHEMA, kms=None, table_key_id=None)
    with pytest.raises(TableIdentityError, match="encryption removed"):
        EncryptedTable.load(str(root), kms=kms, table_key_id="keyA")


def test_encryption_added_to_a_plaintext_table_is_refused(tmp_path, kms):
    """A plaintext table object never starts wrapping keys under a master key id that
    storage names (e.g. an attacker's KMS key URL)."""
    root = tmp_path / "plain"
    table = EncryptedTable.create(str(root), SCHEMA, kms=kms, table_key_id=None)
    table.append(make_rows(0, 10))

    def add_key(doc):
        doc["properties"]["encryption.key-id"] = "keyB"

    forged = _attack(root, add_key)
    before = _snapshot(tmp_path)
    with pytest.raises(TableIdentityError, match="encryption added") as caught:
        table.append(make_rows(10, 20))
    assert caught.value.metadata_location == str(forged)
    assert _snapshot(tmp_path) == before


# --- changing the pin: only the explicit rotation by this object --------------------------------


def test_own_master_key_rotation_moves_the_pin_and_others_must_reload(table_dir, kms):
    other = EncryptedTable.load(str(table_dir), kms=kms)
    table = EncryptedTable.load(str(table_dir), kms=kms, table_key_id="keyA")
    table.rotate_keys(new_kek=False, new_master_key_id="keyB")
    assert table.pin.table_key_id == "keyB"
    table.append(make_rows(100, 110))  # its own pin moved with its rotation
    with pytest.raises(TableIdentityError, match="load the table again with table_key_id"):
        other.append(make_rows(200, 210))
    with pytest.raises(TableIdentityError):
        EncryptedTable.load(str(table_dir), kms=kms, table_key_id="keyA")
    again = EncryptedTable.load(str(table_dir), kms=kms, table_key_id="keyB")
    again.append(make_rows(200, 210))
    assert digest(again.scan().to_arrow()) == digest(_rows(0, 50, 50, 100, 100, 110, 200, 210))


def test_rekey_to_a_new_master_key_moves_the_pin(table_dir, kms):
    table = EncryptedTable.load(str(table_dir), kms=kms, table_key_id="keyA")
    result = table.rekey(everything=True, new_master_key_id="keyB", expire=True)
    assert result.table_key_id == "keyB" and table.pin.table_key_id == "keyB"
    table.append(make_rows(100, 110))
    assert EncryptedTable.load(str(table_dir), kms=kms, table_key_id="keyB").verify().ok


# --- versions never go backwards (issue 16, item 12) ------------------------------------------------


def _java_style_commit(root: Path) -> Path:
    """What Iceberg Java writes committing to a path table through a metastore-style
    catalog: ``00000-<uuid>.metadata.json`` whose metadata-log lists the hinted ``v<N>``
    (here: the current document with a new property), the hint left alone."""
    current = _newest(root)
    doc = without_authenticator(json.loads(current.read_text()))  # Java drops fields it does not know
    doc["properties"]["written-by"] = "java"
    doc["last-updated-ms"] += 1
    doc["metadata-log"] = [*doc.get("metadata-log", []), {"timestamp-ms": doc["last-updated-ms"] - 1, "metadata-file": f"{doc['location']}/metadata/{current.name}"}]
    path = root / "metadata" / f"00000-{uuid.uuid4()}.metadata.json"
    path.write_text(json.dumps(doc))
    return path


def test_refresh_and_append_never_go_back_to_the_hinted_ancestor(table_dir, kms):
    java = _java_style_commit(table_dir)
    table = EncryptedTable.load(str(java), kms=kms)
    table.refresh()
    assert table.metadata_location == str(java)
    table.append(make_rows(100, 110))
    assert table.properties.get("written-by") == "java"  # built on Java's version
    newest = _newest(table_dir)
    assert newest.name == "v4.metadata.json" and table.metadata_location == str(newest)
    logged = [e["metadata-file"] for e in json.loads(newest.read_text())["metadata-log"]]
    assert logged[-1].endswith(java.name)
    loaded = EncryptedTable.load(str(table_dir), kms=kms)
    assert loaded.properties.get("written-by") == "java"
    assert digest(loaded.scan().to_arrow()) == digest(_rows(0, 50, 50, 100, 100, 110))


def test_orphan_removal_refuses_while_a_newer_version_is_not_hinted(tmp_path, table_dir, kms):
    """The hinted v<N> is current by the hint, but Java committed a file that follows it:
    its files look unreferenced from v<N>; nothing may be deleted."""
    by_hint = EncryptedTable.load(str(table_dir), kms=kms)
    java = _java_style_commit(table_dir)
    java_table = EncryptedTable.load(str(java), kms=kms)
    # Java's commit adds data too: an icecrypt append on top of the 00000 file, then the
    # hint put back, as Java (which never touches the hint) would leave it
    java_table.append(make_rows(100, 110))
    added = _newest(table_dir)
    renamed = table_dir / "metadata" / f"00001-{uuid.uuid4()}.metadata.json"
    added.rename(renamed)
    (table_dir / "metadata" / "version-hint.text").write_text("3")
    before = _snapshot(tmp_path)
    for operation in (lambda t: t.remove_orphan_files(FAR_FUTURE_MS), lambda t: t.expire_snapshots(FAR_FUTURE_MS)):
        with pytest.raises(TableVersionError) as caught:
            operation(by_hint)
        assert str(renamed) in str(caught.value) or str(java) in str(caught.value)
    assert _snapshot(tmp_path) == before
    # loaded from Java's newest file, refresh stays there and orphan removal keeps its files
    newest = EncryptedTable.load(str(renamed), kms=kms)
    newest.refresh()
    assert newest.metadata_location == str(renamed)
    newest.remove_orphan_files(FAR_FUTURE_MS)
    assert EncryptedTable.load(str(renamed), kms=kms).verify().ok
    assert digest(EncryptedTable.load(str(renamed), kms=kms).scan().to_arrow()) == digest(_rows(0, 50, 50, 100, 100, 110))


def test_forked_versions_are_an_error_naming_both(table_dir, kms):
    java = _java_style_commit(table_dir)
    table = EncryptedTable.load(str(java), kms=kms)
    other = EncryptedTable.load(str(table_dir), kms=kms)  # the hint: v3, Java's ancestor
    other.append(make_rows(100, 110))  # v4 forks from v3 beside Java's 00000
    with pytest.raises(TableVersionError) as caught:
        table.refresh()
    assert str(java) in str(caught.value) and "v4.metadata.json" in str(caught.value)
    assert set(caught.value.metadata_locations) == {str(java), str(table_dir / "metadata" / "v4.metadata.json")}
    with pytest.raises(TableVersionError):
        table.append(make_rows(200, 210))
    assert _newest(table_dir).name == "v4.metadata.json"
    # the hinted branch may not delete what Java's branch references either
    before = _snapshot(table_dir)
    with pytest.raises(TableVersionError, match=java.name):
        other.remove_orphan_files(FAR_FUTURE_MS)
    assert _snapshot(table_dir) == before


@pytest.mark.parametrize("operation", ["append", "remove_orphan_files", "expire_snapshots", "rewrite_data_files"])
def test_plaintext_table_pins_its_location_too(tmp_path, kms, operation):
    """A plaintext table has no keys to protect, but its location decides where files are
    written and which tree orphan removal walks: a version moving it is refused."""
    import os

    root = tmp_path / "plain"
    table = EncryptedTable.create(str(root), SCHEMA, kms=None, table_key_id=None, partition_spec=CATEGORY)
    table.append(make_rows(0, 50))
    table.append(make_rows(50, 100))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    victim = elsewhere / "payroll.parquet"
    victim.write_bytes(b"not the table's")
    os.utime(victim, (0, 0))  # old enough for any orphan cut-off

    def move(doc):
        doc["location"] = str(elsewhere)

    forged = _attack(root, move)
    before = _snapshot(tmp_path)
    with pytest.raises(TableIdentityError, match="location changed") as caught:
        OPERATIONS[operation](table)
    assert caught.value.metadata_location == str(forged)
    assert _snapshot(tmp_path) == before and victim.exists()

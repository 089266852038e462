"""A storage attacker against the KEK chain: leaked, rotated-out KEKs put back into
service under a fresh id (issue 16, item 5) and KEK ids given another KEK's wrapped bytes
to poison a long-lived writer's cache (item 6).

The attacker writes new ``v<N>.metadata.json`` versions and knows every wrapped key that
ever was in the table's metadata; it has no use of the KMS master key.  The tables here
are unauthenticated (``forgery.legacy``: as icecrypt before authentication, or Iceberg
Java, leaves them): on an authenticated table the forged version is refused before any
of this (``test_attack_authenticity.py::test_a_replayed_kek_is_refused_first_by_authentication``).  Each test checks that the writer refuses before anything
is written or that what it commits stays readable by every other process.
"""

from __future__ import annotations

import base64
import json
import re
import time
from pathlib import Path

import pytest
from forgery import legacy
from test_maintenance import assert_clean, small_table
from test_write_roundtrip import SCHEMA, make_rows

from icecrypt.errors import AuthenticationError, ReplayedKeyError
from icecrypt.keys import EncryptedKey, EncryptionManager, read_encryption_keys
from icecrypt.kms import LocalKms
from icecrypt.table import EncryptedTable
from icecrypt.table.commit import store as _commit


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _newest(table: EncryptedTable) -> str:
    return _commit.latest_metadata_location(table.filesystem, table.metadata_location)


def _publish(table: EncryptedTable, change) -> str:
    """What a storage attacker does: the newest version, changed, as the next version."""
    location = _newest(table)
    metadata = json.loads(Path(location).read_text())
    change(metadata)
    number = int(re.search(r"v(\d+)\.metadata\.json\Z", location).group(1)) + 1
    new = Path(location).with_name(f"v{number}.metadata.json")
    new.write_text(json.dumps(metadata))
    (new.parent / "version-hint.text").write_text(str(number))
    return str(new)


def _files(root: Path) -> set[str]:
    return {str(p) for p in root.rglob("*") if p.is_file()}


def _current_kek(table: EncryptedTable) -> EncryptedKey:
    kek = table.encryption_manager.current_kek()
    assert kek is not None
    return kek


def _replay(kek: EncryptedKey, *, by: str | None = None, key_id: str = "cmVwbGF5ZWQtb2xkLWtlaw==", drop_original=False):
    """Put ``kek``'s wrapped bytes first under a fresh id and a fresh KEY_TIMESTAMP."""

    def change(metadata: dict) -> None:
        entries = metadata["encryption-keys"]
        if drop_original:
            entries[:] = [e for e in entries if e["key-id"] != kek.key_id]
            gone = {e["key-id"] for e in entries if e.get("encrypted-by-id") == kek.key_id}
            entries[:] = [e for e in entries if e["key-id"] not in gone]
            metadata["snapshots"] = [s for s in metadata["snapshots"] if s.get("key-id") not in gone]
            metadata["snapshot-log"] = [
                s for s in metadata.get("snapshot-log") or () if any(
                    k["snapshot-id"] == s["snapshot-id"] for k in metadata["snapshots"])
            ]
        entries.insert(0, {
            "key-id": key_id,
            "encrypted-key-metadata": base64.b64encode(kek.encrypted_key_metadata).decode(),
            "encrypted-by-id": by or kek.encrypted_by_id,
            "properties": {"KEY_TIMESTAMP": str(_now_ms())},
        })

    return change


def _put_back_first(kek: EncryptedKey):
    """Move ``kek``'s own entry first, with a fresh KEY_TIMESTAMP."""

    def change(metadata: dict) -> None:
        entries = metadata["encryption-keys"]
        entry = next(e for e in entries if e["key-id"] == kek.key_id)
        entries.remove(entry)
        entry["properties"] = {"KEY_TIMESTAMP": str(_now_ms())}
        entries.insert(0, entry)

    return change


# --- item 5: a rotated-out KEK put back first under a fresh id --------------------------------------


@pytest.mark.parametrize("drop_original", [False, True], ids=["beside-the-original", "original-dropped"])
def test_the_rotating_writer_refuses_a_replayed_old_kek(tmp_path, kms, drop_original):
    table = legacy(small_table(tmp_path, kms, appends=1))
    old = _current_kek(table)
    table.rotate_keys(new_kek=True)
    table.append(make_rows(1000, 1010))
    attacked = _publish(table, _replay(old, drop_original=drop_original))
    before = _files(tmp_path)
    with pytest.raises(ReplayedKeyError, match="cmVwbGF5ZWQtb2xkLWtlaw==") as err:
        table.append(make_rows(2000, 2010))
    assert err.value.key_id == "cmVwbGF5ZWQtb2xkLWtlaw=="
    assert _files(tmp_path) == before  # refused before any data file was written
    assert _newest(table) == attacked  # nothing committed
    # the documented recovery: a fresh KEK first, then writes go on
    table.rotate_keys(new_kek=True)
    table.append(make_rows(2000, 2010))
    assert table.encryption_manager.current_kek().key_id not in (old.key_id, "cmVwbGF5ZWQtb2xkLWtlaw==")
    assert_clean(table)


def test_a_fresh_writer_refuses_an_old_kek_listed_twice(tmp_path, kms):
    table = legacy(small_table(tmp_path, kms, appends=1))
    old = _current_kek(table)
    table.rotate_keys(new_kek=True)
    table.append(make_rows(1000, 1010))
    attacked = _publish(table, _replay(old))
    fresh = EncryptedTable.load(attacked, kms=kms)
    before = _files(tmp_path)
    for action in (lambda: fresh.append(make_rows(2000, 2010)), lambda: fresh.delete("id < 5"),
                   lambda: fresh.rewrite_data_files(options={"rewrite-all": "true"})):
        with pytest.raises(ReplayedKeyError, match="also that of entry"):
            action()
        assert _files(tmp_path) == before and _newest(fresh) == attacked


def test_a_kek_retired_by_rekey_is_refused_under_its_own_id(tmp_path, kms):
    table = legacy(small_table(tmp_path, kms, appends=2))
    leaked = _current_kek(table)
    table.rekey(kek_ids=[leaked.key_id])  # old snapshots kept: the leaked KEK stays listed

    attacked = _publish(table, _put_back_first(leaked))
    with pytest.raises(ReplayedKeyError, match="retired"):
        table.append(make_rows(1000, 1010))
    assert _newest(table) == attacked


def test_retired_kek_ids_carried_to_a_fresh_writer_are_refused(tmp_path, kms):
    """What a catalog pin can carry across processes: the ids a rotation retired."""
    table = legacy(small_table(tmp_path, kms, appends=1))
    old = _current_kek(table)
    table.rotate_keys(new_kek=True)
    assert old.key_id in table.encryption_manager.retired_kek_ids

    attacked = _publish(table, _put_back_first(old))
    fresh = EncryptedTable.load(attacked, kms=kms)
    fresh.encryption_manager.retire_keks(table.encryption_manager.retired_kek_ids | {"no-such-id"})
    with pytest.raises(ReplayedKeyError, match="retired"):
        fresh.append(make_rows(2000, 2010))
    assert _newest(fresh) == attacked


def test_rekey_with_a_new_master_key_defeats_the_replay(tmp_path):
    """The documented response to a leaked KEK: rekey under a new master key, expire, and
    disable the old master key.  The attacker's copy of the old KEK's wrapped bytes then
    unwraps nowhere: whatever id, timestamp, position or master key id it is given, no
    writer wraps under it."""
    kms = LocalKms.create_keystore(tmp_path / "keystore.json", ["m1", "m2"])
    table = legacy(EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="m1"))
    for i in range(3):
        table.append(make_rows(i * 100, i * 100 + 100))
    leaked = _current_kek(table)
    leaked_key = kms.unwrap_key(leaked.encrypted_key_metadata, "m1")
    seen: dict[str, str] = {}  # every metadata version the attacker could copy while rekey runs

    def copy_versions(*_):
        for path in (tmp_path / "t" / "metadata").glob("*.metadata.json"):
            seen.setdefault(path.name, path.read_text())

    result = table.rekey(kek_ids=[leaked.key_id], new_master_key_id="m2", expire=True, progress=copy_versions)
    copy_versions()
    assert result.check(table) == [] and table.metadata["properties"]["encryption.key-id"] == "m2"
    kms.remove_key("m1")
    # the leaked KEK was never wrapped under the new master key, in any version written
    for name, text in seen.items():
        for entry in read_encryption_keys(json.loads(text)):
            if entry.encrypted_by_id == "m2" and entry.properties:
                same = kms.unwrap_key(entry.encrypted_key_metadata, "m2") == leaked_key  # no key bytes in reports
                assert not same, f"{name}: KEK {entry.key_id} is the leaked KEK under the new master key"
    # claiming the new master key: it does not unwrap, so it is refused
    attacked = _publish(table, _replay(leaked, by="m2"))
    fresh = EncryptedTable.load(attacked, kms=LocalKms(tmp_path / "keystore.json"))
    for writer, why in ((table, "retired it"), (fresh, "does not unwrap under master key 'm2'")):
        before = _files(tmp_path / "t")
        with pytest.raises(ReplayedKeyError, match=why):
            writer.append(make_rows(500, 510))
        assert _files(tmp_path / "t") == before and _newest(writer) == attacked
    # claiming the disabled master key: not a KEK of the table, never chosen
    _publish(table, lambda metadata: metadata["encryption-keys"].pop(0))
    attacked = _publish(table, _replay(leaked, by="m1"))
    fresh = EncryptedTable.load(attacked, kms=LocalKms(tmp_path / "keystore.json"))
    for writer in (table, fresh):
        writer.append(make_rows(500, 510))
        newest = json.loads(Path(_newest(writer)).read_text())
        snapshot = next(s for s in newest["snapshots"] if s["snapshot-id"] == newest["current-snapshot-id"])
        wrapped_by = next(e for e in newest["encryption-keys"] if e["key-id"] == snapshot["key-id"])
        assert wrapped_by["encrypted-by-id"] not in (leaked.key_id, "cmVwbGF5ZWQtb2xkLWtlaw==")
    fresh.refresh()
    assert fresh.scan().to_arrow().num_rows == 300 + 20
    assert_clean(fresh)


def test_master_key_rotation_never_rewraps_a_replayed_kek(tmp_path, kms):
    table = legacy(small_table(tmp_path, kms, appends=1))
    old = _current_kek(table)
    table.rotate_keys(new_kek=True)

    def replay_last(metadata: dict) -> None:
        _replay(old)(metadata)
        metadata["encryption-keys"].append(metadata["encryption-keys"].pop(0))  # not current: just kept

    attacked = _publish(table, replay_last)
    with pytest.raises(ReplayedKeyError, match="not re-wrapped under the new master key"):
        table.rotate_keys(new_kek=False, new_master_key_id="keyB")
    assert _newest(table) == attacked


# --- item 6: a KEK id given another KEK's wrapped bytes ---------------------------------------------


def test_a_poisoned_kek_id_never_makes_later_commits_unreadable(tmp_path, kms):
    table = legacy(small_table(tmp_path, kms, appends=1))
    kek_a = _current_kek(table)
    table.rotate_keys(new_kek=True)
    table.append(make_rows(1000, 1010))
    kek_b = _current_kek(table)
    good = Path(_newest(table)).read_text()

    def poison(metadata: dict) -> None:
        for entry in metadata["encryption-keys"]:
            if entry["key-id"] == kek_b.key_id:
                entry["encrypted-key-metadata"] = base64.b64encode(kek_a.encrypted_key_metadata).decode()

    poisoned = _publish(table, poison)
    # a long-lived writer that meets the poisoned version first
    writer = EncryptedTable.load(poisoned, kms=kms)
    with pytest.raises(Exception):  # noqa: B017 - B's snapshot does not open with A's key
        writer.scan().to_arrow()
    with pytest.raises(ReplayedKeyError):
        writer.append(make_rows(2000, 2010))
    # the real B comes back (the attacker undoes it, or a legitimate version follows)
    _publish(table, lambda metadata: metadata.update(json.loads(good)))
    for i in range(2):
        writer.append(make_rows(3000 + 10 * i, 3010 + 10 * i))
    # every commit is readable by another process, with nothing but the KMS
    fresh = EncryptedTable.load(_newest(writer), kms=kms)
    ids = fresh.scan().to_arrow().column("id").to_pylist()
    assert {3000, 3015, 1000}.issubset(set(ids))
    assert_clean(fresh)


def test_kek_cache_is_keyed_by_wrapped_bytes_and_master_key(kms):
    writer = EncryptionManager(kms, "keyA")
    entry = writer.wrap_manifest_list_key_metadata(writer.new_file_key())
    kek = writer.get_key(entry.encrypted_by_id)
    other = EncryptionManager(kms, "keyA")
    other.wrap_manifest_list_key_metadata(other.new_file_key())
    other_kek = other.current_kek()
    # the same KEK id with another KEK's bytes: a reader sharing the cache must not get
    # the first key back for it
    reader = EncryptionManager(kms, "keyA", [kek.replace(encrypted_key_metadata=other_kek.encrypted_key_metadata),
                                             entry])
    assert reader.share_kek_cache(writer)
    with pytest.raises(AuthenticationError):
        reader.unwrap_manifest_list_key_metadata(entry.key_id)
    honest = EncryptionManager(kms, "keyA", [kek, entry])
    assert honest.share_kek_cache(writer)
    assert honest.unwrap_manifest_list_key_metadata(entry.key_id).key_length == 16

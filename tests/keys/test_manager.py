"""EncryptionManager: Java's key chain, KEK selection and caching, rotation, metadata.json."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from keyhelpers import Clock, CountingKms
from vectorlib import plaintext

from icecrypt import AuthenticationError, FormatError, KmsInvalidWrappedKeyError, KmsKeyNotFoundError, ags1
from icecrypt.keys import (
    KEK_LIFESPAN_MS,
    EncryptedKey,
    EncryptionKeyNotFoundError,
    EncryptionManager,
    StandardKeyMetadata,
    read_encryption_keys,
    referenced_keys,
    removable_keys,
    snapshot_key_ids,
    validate_table_properties,
    with_snapshot_key_id,
    write_encryption_keys,
)
from icecrypt.kms.memory import ICEBERG_TEST_MASTER_KEYS, MemoryKms

KEY_ID = re.compile(r"[A-Za-z0-9+/]{22}==\Z")


def _bundle_manager(bundle, kms, **options) -> EncryptionManager:
    keys = [EncryptedKey.from_json(obj) for obj in bundle["encryption-keys"]]
    return EncryptionManager(kms, bundle["table_properties"]["encryption.key-id"], keys,
                             int(bundle["table_properties"]["encryption.data-key-length"]), **options)


# --- the Java bundle -------------------------------------------------------------------


def test_java_bundle_decrypts_through_the_whole_chain(bundle, java_kms):
    manager = _bundle_manager(bundle, java_kms)
    km = manager.unwrap_manifest_list_key_metadata(bundle["snapshot_key_id"])
    assert km.encode().hex() == bundle["debug_plaintext_secrets"]["manifest_list_key_metadata_hex"]
    assert km.file_length == bundle["manifest_list_ciphertext_length"]
    ciphertext = (bundle["_dir"] / bundle["manifest_list_file"]).read_bytes()
    plain = ags1.decrypt(ciphertext, km.encryption_key, km.aad_prefix, km.file_length)
    assert len(plain) == bundle["manifest_list_plaintext_length"]
    assert hashlib.sha256(plain).hexdigest() == bundle["manifest_list_plaintext_sha256"]
    assert bundle["_manifest_entry"]["plaintext_sha256"] == bundle["manifest_list_plaintext_sha256"]
    assert plain == plaintext(len(plain))


def test_java_bundle_kek_unwraps_to_the_recorded_kek(bundle, java_kms):
    secrets = bundle["debug_plaintext_secrets"]
    kek_entry = _bundle_manager(bundle, java_kms).get_key(secrets["kek_id"])
    assert kek_entry.key_timestamp == secrets["kek_timestamp"]
    assert java_kms.unwrap_key(kek_entry.encrypted_key_metadata, "keyA").hex() == secrets["kek_hex"]


def test_java_bundle_with_the_wrong_master_key_fails(bundle):
    swapped = MemoryKms({"keyA": ICEBERG_TEST_MASTER_KEYS["keyB"]})
    with pytest.raises(KmsInvalidWrappedKeyError):
        _bundle_manager(bundle, swapped).unwrap_manifest_list_key_metadata(bundle["snapshot_key_id"])


def test_written_bundle_has_javas_shape(bundle, java_kms, clock):
    manager = EncryptionManager(java_kms, "keyA", clock=clock)
    assert manager.encryption_keys == []
    km = manager.new_file_key()
    assert km.key_length == 16 and len(km.aad_prefix) == 16 and km.file_length is None
    entry = manager.wrap_manifest_list_key_metadata(km.with_file_length(1048641))
    kek, listed = manager.encryption_keys
    assert listed == entry
    for obj, java in zip((kek.to_json(), entry.to_json()), bundle["encryption-keys"], strict=True):
        assert list(obj) == list(java)
        assert KEY_ID.match(obj["key-id"])
    assert kek.encrypted_by_id == "keyA" and kek.key_timestamp == str(clock.now)
    assert len(kek.encrypted_key_metadata) == 44  # same as Java's test KMS: 12 + 16 + 16
    assert len(entry.encrypted_key_metadata) == 69 and entry.properties is None
    assert entry.encrypted_by_id == kek.key_id
    # a fresh manager (no cache) reading the written list gets the key metadata back
    reader = EncryptionManager(java_kms, "keyA", manager.encryption_keys, clock=clock)
    assert reader.unwrap_manifest_list_key_metadata(entry.key_id) == km.with_file_length(1048641)


def test_data_key_length_sizes_deks_and_keks(java_kms):
    manager = EncryptionManager(java_kms, "keyA", data_key_length=32)
    km = manager.new_file_key()
    assert km.key_length == 32 and len(km.aad_prefix) == 16
    entry = manager.wrap_manifest_list_key_metadata(km.with_file_length(1048641))
    assert len(entry.encrypted_key_metadata) == 85  # SPEC 3.4: 32-byte DEK, 57-byte metadata
    kek = manager.get_key(entry.encrypted_by_id)
    assert len(java_kms.unwrap_key(kek.encrypted_key_metadata, "keyA")) == 32
    with pytest.raises(ValueError, match="Invalid data key length: 20"):
        EncryptionManager(java_kms, "keyA", data_key_length=20)


def test_new_file_keys_are_fresh(java_kms):
    manager = EncryptionManager(java_kms, "keyA")
    keys = {manager.new_file_key() for _ in range(50)}
    assert len(keys) == 50
    assert len({k.aad_prefix for k in keys}) == 50


# --- KEK selection ---------------------------------------------------------------------


def test_kek_is_reused_and_expires_after_730_days(java_kms, clock):
    manager = EncryptionManager(java_kms, "keyA", clock=clock)
    first = manager.wrap_manifest_list_key_metadata(manager.new_file_key())
    clock.advance_days(729)
    second = manager.wrap_manifest_list_key_metadata(manager.new_file_key())
    assert second.encrypted_by_id == first.encrypted_by_id
    clock.now = int(manager.get_key(first.encrypted_by_id).key_timestamp) + KEK_LIFESPAN_MS - 1
    assert manager.wrap_manifest_list_key_metadata(manager.new_file_key()).encrypted_by_id == first.encrypted_by_id
    clock.now += 1  # exactly 730 days: expired
    third = manager.wrap_manifest_list_key_metadata(manager.new_file_key())
    assert third.encrypted_by_id != first.encrypted_by_id
    keks = [k for k in manager.encryption_keys if manager.is_kek(k)]
    assert [k.key_id for k in keks] == [first.encrypted_by_id, third.encrypted_by_id]  # appended, like Java
    assert keks[1].key_timestamp == str(clock.now)
    for entry in (first, second, third):  # old snapshots stay readable
        assert manager.unwrap_manifest_list_key_metadata(entry.key_id).key_length == 16


def test_first_unexpired_kek_in_list_order_wins(java_kms, clock):
    def kek(key_id, stamp):
        return EncryptedKey(key_id, java_kms.wrap_key(bytes(16), "keyA"), "keyA", {"KEY_TIMESTAMP": str(stamp)})

    now = clock.now
    keys = [
        kek("expired", now - KEK_LIFESPAN_MS),
        EncryptedKey("other-master", java_kms.wrap_key(bytes(16), "keyB"), "keyB", {"KEY_TIMESTAMP": str(now)}),
        kek("older", now - 10),
        kek("newer", now),
    ]
    manager = EncryptionManager(java_kms, "keyA", keys, clock=clock)
    assert manager.current_kek().key_id == "older"
    assert manager.wrap_manifest_list_key_metadata(manager.new_file_key()).encrypted_by_id == "older"


def test_malformed_kek_timestamp(java_kms, clock):
    for props in ({"KEY_TIMESTAMP": "12e3"}, {"KEY_TIMESTAMP": " 1"}, {"OTHER": "1"}):
        keys = [EncryptedKey("kek", java_kms.wrap_key(bytes(16), "keyA"), "keyA", props)]
        with pytest.raises(FormatError, match="'kek'.*KEY_TIMESTAMP"):
            EncryptionManager(java_kms, "keyA", keys, clock=clock).wrap_manifest_list_key_metadata(
                StandardKeyMetadata(bytes(16)))


# --- unwrapping errors -----------------------------------------------------------------


def test_unwrap_errors_name_the_ids(bundle, java_kms):
    manager = _bundle_manager(bundle, java_kms)
    kek_id = bundle["debug_plaintext_secrets"]["kek_id"]
    with pytest.raises(EncryptionKeyNotFoundError, match="'nope=='"):
        manager.unwrap_manifest_list_key_metadata("nope==")
    ml = manager.get_key(bundle["snapshot_key_id"])
    orphan = EncryptionManager(java_kms, "keyA", [ml])
    with pytest.raises(EncryptionKeyNotFoundError, match=re.escape(repr(kek_id))):
        orphan.unwrap_manifest_list_key_metadata(ml.key_id)
    kek = manager.get_key(kek_id)
    untimed = EncryptionManager(java_kms, "keyA", [kek.replace(properties=None), ml])
    with pytest.raises(FormatError, match="no KEY_TIMESTAMP"):
        untimed.unwrap_manifest_list_key_metadata(ml.key_id)
    retimed = EncryptionManager(java_kms, "keyA", [kek.replace(properties={"KEY_TIMESTAMP": "1"}), ml])
    with pytest.raises(AuthenticationError):
        retimed.unwrap_manifest_list_key_metadata(ml.key_id)
    with pytest.raises(FormatError, match="no encrypted-by-id"):
        EncryptionManager(java_kms, "keyA", [ml.replace(encrypted_by_id=None)]).unwrap_manifest_list_key_metadata(
            ml.key_id)
    # a manifest-list key must hang off a KEK of the table key, not off another entry
    with pytest.raises(FormatError, match="not a key encryption key"):
        EncryptionManager(java_kms, "keyB", [kek, ml]).unwrap_manifest_list_key_metadata(ml.key_id)
    with pytest.raises(KmsKeyNotFoundError):
        EncryptionManager(MemoryKms(), "keyA", [kek, ml]).unwrap_manifest_list_key_metadata(ml.key_id)


def test_kms_returning_a_bad_key_length(java_kms):
    class ShortKms(MemoryKms):
        def unwrap_key(self, wrapped_key, wrapping_key_id):
            return super().unwrap_key(wrapped_key, wrapping_key_id)[:5]

    writer = EncryptionManager(java_kms, "keyA")
    entry = writer.wrap_manifest_list_key_metadata(writer.new_file_key())
    reader = EncryptionManager(ShortKms(ICEBERG_TEST_MASTER_KEYS), "keyA", writer.encryption_keys)
    with pytest.raises(KmsInvalidWrappedKeyError, match="5-byte key"):
        reader.unwrap_manifest_list_key_metadata(entry.key_id)


# --- KEK cache -----------------------------------------------------------------------


def test_32_threads_cause_one_kms_unwrap_per_kek(bundle):
    gate = threading.Event()
    kms = CountingKms(ICEBERG_TEST_MASTER_KEYS, unwrap_delay=gate)
    writer = EncryptionManager(MemoryKms(ICEBERG_TEST_MASTER_KEYS), "keyA", clock=Clock())
    clock = Clock()
    entries = [writer.wrap_manifest_list_key_metadata(writer.new_file_key()) for _ in range(4)]
    clock.advance_days(800)
    writer2 = EncryptionManager(MemoryKms(ICEBERG_TEST_MASTER_KEYS), "keyA", writer.encryption_keys, clock=clock)
    entries += [writer2.wrap_manifest_list_key_metadata(writer2.new_file_key()) for _ in range(4)]
    keys = writer2.encryption_keys
    assert sum(writer2.is_kek(k) for k in keys) == 2
    expected = {e.key_id: writer2.unwrap_manifest_list_key_metadata(e.key_id) for e in entries}

    manager = EncryptionManager(kms, "keyA", keys, clock=clock)
    barrier = threading.Barrier(32)

    def work(i):
        barrier.wait()
        if i == 31:
            gate.set()  # let the (single) in-flight unwraps finish once everyone waits
        entry = entries[i % len(entries)]
        return entry.key_id, manager.unwrap_manifest_list_key_metadata(entry.key_id)

    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(work, range(32)))
    assert all(expected[key_id] == km for key_id, km in results)
    assert kms.unwraps == 2  # one per KEK
    for entry in entries:
        manager.unwrap_manifest_list_key_metadata(entry.key_id)
    assert kms.unwraps == 2


def test_cache_ttl_and_failed_unwrap_retry(java_kms):
    clock = Clock()
    writer = EncryptionManager(java_kms, "keyA", clock=clock)
    entry = writer.wrap_manifest_list_key_metadata(writer.new_file_key())
    kms = CountingKms(ICEBERG_TEST_MASTER_KEYS)
    manager = EncryptionManager(kms, "keyA", writer.encryption_keys, kek_cache_ttl=60, clock=clock)
    manager.unwrap_manifest_list_key_metadata(entry.key_id)
    clock.now += 59_999
    manager.unwrap_manifest_list_key_metadata(entry.key_id)
    assert kms.unwraps == 1
    clock.now += 1
    manager.unwrap_manifest_list_key_metadata(entry.key_id)
    assert kms.unwraps == 2
    # a failed unwrap is not cached: the next call asks the KMS again
    failing = CountingKms({})
    broken = EncryptionManager(failing, "keyA", writer.encryption_keys, clock=clock)
    for _ in range(2):
        with pytest.raises(KmsKeyNotFoundError):
            broken.unwrap_manifest_list_key_metadata(entry.key_id)
    assert failing.unwraps == 2


def test_new_kek_is_cached_without_a_kms_unwrap():
    kms = CountingKms(ICEBERG_TEST_MASTER_KEYS)
    manager = EncryptionManager(kms, "keyA")
    entries = [manager.wrap_manifest_list_key_metadata(manager.new_file_key()) for _ in range(3)]
    for e in entries:
        manager.unwrap_manifest_list_key_metadata(e.key_id)
    assert (kms.wraps, kms.unwraps) == (1, 0)


def test_concurrent_wraps_create_one_kek():
    kms = CountingKms(ICEBERG_TEST_MASTER_KEYS)
    manager = EncryptionManager(kms, "keyA")
    barrier = threading.Barrier(16)

    def work(_):
        barrier.wait()
        return manager.wrap_manifest_list_key_metadata(manager.new_file_key())

    with ThreadPoolExecutor(16) as pool:
        entries = list(pool.map(work, range(16)))
    assert kms.wraps == 1
    assert len({e.encrypted_by_id for e in entries}) == 1
    assert len(manager.encryption_keys) == 17


# --- rotation --------------------------------------------------------------------------


def test_rotate_master_key(bundle, java_kms):
    manager = _bundle_manager(bundle, java_kms)
    before = manager.encryption_keys
    new_kms = MemoryKms({"master-2": bytes(range(32))})
    rewrapped = manager.rotate_master_key("master-2", new_kms)
    kek_id = bundle["debug_plaintext_secrets"]["kek_id"]
    assert [e.key_id for e in rewrapped] == [kek_id]
    after = manager.encryption_keys
    assert [e.key_id for e in after] == [e.key_id for e in before]
    old_kek, new_kek = before[0], after[0]
    assert new_kek.encrypted_by_id == "master-2" and new_kek.properties == old_kek.properties
    assert new_kek.encrypted_key_metadata != old_kek.encrypted_key_metadata
    assert after[1] == before[1]  # the manifest-list entry is untouched
    assert manager.table_key_id == "master-2" and manager.kms is new_kms
    assert new_kms.unwrap_key(new_kek.encrypted_key_metadata, "master-2").hex() == \
        bundle["debug_plaintext_secrets"]["kek_hex"]
    # a fresh reader that only has the new master key reads the Java snapshot
    reader = EncryptionManager(new_kms, "master-2", after)
    km = reader.unwrap_manifest_list_key_metadata(bundle["snapshot_key_id"])
    assert km.encode().hex() == bundle["debug_plaintext_secrets"]["manifest_list_key_metadata_hex"]
    # and the old master key can no longer open the KEK
    with pytest.raises(KmsKeyNotFoundError):
        java_kms.unwrap_key(new_kek.encrypted_key_metadata, "master-2")


def test_rotate_master_key_failure_changes_nothing(bundle, java_kms):
    manager = _bundle_manager(bundle, java_kms)
    before = manager.encryption_keys
    with pytest.raises(KmsKeyNotFoundError):
        manager.rotate_master_key("missing")
    assert manager.encryption_keys == before and manager.table_key_id == "keyA"


def test_rotate_kek_puts_the_new_kek_first(java_kms, clock):
    manager = EncryptionManager(java_kms, "keyA", clock=clock)
    old = manager.wrap_manifest_list_key_metadata(manager.new_file_key())
    clock.now += 5
    new_kek = manager.rotate_kek()
    assert manager.encryption_keys[0] == new_kek and new_kek.key_timestamp == str(clock.now)
    newer = manager.wrap_manifest_list_key_metadata(manager.new_file_key())
    assert newer.encrypted_by_id == new_kek.key_id != old.encrypted_by_id
    # a Java-like writer (first unexpired KEK in list order) reading the list agrees
    reread = EncryptionManager(java_kms, "keyA", manager.encryption_keys, clock=clock)
    assert reread.current_kek() == new_kek
    for entry in (old, newer):
        assert reread.unwrap_manifest_list_key_metadata(entry.key_id).key_length == 16


# --- table properties ------------------------------------------------------------------


def test_validate_table_properties():
    assert validate_table_properties({}, 2) == (None, 16)
    assert validate_table_properties({"encryption.key-id": "k"}, 3) == ("k", 16)
    assert validate_table_properties({"encryption.key-id": "k", "encryption.data-key-length": "32"}, 3) == ("k", 32)
    with pytest.raises(ValueError, match=r"Invalid properties for v2: encryption.key-id=k"):
        validate_table_properties({"encryption.key-id": "k"}, 2)
    with pytest.raises(ValueError, match=r"Invalid properties for v1: encryption.data-key-length=16"):
        validate_table_properties({"encryption.data-key-length": "16"}, 1)
    for bad in ("8", "17", "abc", "", "1e1"):
        with pytest.raises(ValueError, match="Invalid data key length"):
            validate_table_properties({"encryption.key-id": "k", "encryption.data-key-length": bad}, 3)


def test_from_table_properties(java_kms):
    assert EncryptionManager.from_table_properties(java_kms, {}, 3) is None
    manager = EncryptionManager.from_table_properties(
        java_kms, {"encryption.key-id": "keyB", "encryption.data-key-length": "24"}, 3)
    assert (manager.table_key_id, manager.data_key_length) == ("keyB", 24)
    with pytest.raises(ValueError, match="v2"):
        EncryptionManager.from_table_properties(java_kms, {"encryption.key-id": "keyB"}, 2)


# --- metadata.json of the Java tables --------------------------------------------------


def _table_metadata(tables_dir):
    for path in sorted(tables_dir.glob("enc_*/metadata/*.metadata.json")):
        yield path, path.read_text(encoding="utf-8")


def test_java_tables_every_snapshot_decrypts(tables_dir):
    checked = 0
    for path, text in _table_metadata(tables_dir):
        metadata = json.loads(text)
        table_dir = path.parents[1]
        debug = json.loads((table_dir / "keys.json").read_text())
        recorded = {e["key_id"]: e for e in debug["encryption_keys"]}
        manager = EncryptionManager.from_table_metadata(MemoryKms(ICEBERG_TEST_MASTER_KEYS), metadata)
        for snapshot in metadata.get("snapshots", []):
            km = manager.unwrap_manifest_list_key_metadata(snapshot["key-id"])
            if snapshot["key-id"] in recorded:
                expected = recorded[snapshot["key-id"]]["manifest_list_key_metadata"]["key_metadata_hex"]
                assert km.encode().hex() == expected
            local = table_dir / snapshot["manifest-list"].split(table_dir.name + "/", 1)[1]
            plain = ags1.decrypt(local.read_bytes(), km.encryption_key, km.aad_prefix, km.file_length)
            assert plain[:4] == b"Obj\x01"  # an Avro container file
            checked += 1
    assert checked >= 9


def test_java_metadata_round_trips_byte_for_byte(tables_dir):
    for _, text in _table_metadata(tables_dir):
        metadata = json.loads(text)
        keys = read_encryption_keys(metadata)
        rewritten = write_encryption_keys(metadata, keys)
        assert json.dumps(rewritten, separators=(",", ":")) == text
        if not keys:
            continue
        # placement of a new list: drop it and add it back
        stripped = {k: v for k, v in metadata.items() if k != "encryption-keys"}
        assert json.dumps(write_encryption_keys(stripped, keys), separators=(",", ":")) == text
        # snapshot key-id goes last
        snapshots = [with_snapshot_key_id({k: v for k, v in s.items() if k != "key-id"}, s["key-id"])
                     for s in metadata["snapshots"]]
        assert json.dumps(dict(metadata, snapshots=snapshots), separators=(",", ":")) == text
        assert snapshot_key_ids(metadata) == {s["snapshot-id"]: s["key-id"] for s in metadata["snapshots"]}


def test_write_encryption_keys_placement_fallbacks():
    key = EncryptedKey("a", b"x")
    assert list(write_encryption_keys({"x": 1, "refs": {}, "snapshots": []}, [key])) == \
        ["x", "encryption-keys", "refs", "snapshots"]
    assert list(write_encryption_keys({"x": 1, "snapshots": []}, [key])) == ["x", "encryption-keys", "snapshots"]
    assert list(write_encryption_keys({"x": 1}, [key])) == ["x", "encryption-keys"]
    assert write_encryption_keys({"x": 1, "encryption-keys": [{"key-id": "a"}], "y": 2}, []) == {"x": 1, "y": 2}
    assert with_snapshot_key_id({"key-id": "a", "b": 1}, None) == {"b": 1}


def test_apply_to_metadata_updates_the_table_key(bundle, java_kms):
    manager = _bundle_manager(bundle, java_kms)
    metadata = {"format-version": 3, "properties": {"encryption.key-id": "keyA", "x": "y"}, "next-row-id": 0,
                "refs": {}, "snapshots": []}
    manager.rotate_master_key("keyB")
    out = manager.apply_to_metadata(metadata)
    assert out["properties"] == {"encryption.key-id": "keyB", "x": "y"}
    assert metadata["properties"]["encryption.key-id"] == "keyA"  # input untouched
    assert list(out) == ["format-version", "properties", "next-row-id", "encryption-keys", "refs", "snapshots"]
    assert read_encryption_keys(out) == manager.encryption_keys


# --- which keys snapshots need ---------------------------------------------------------


def test_referenced_and_removable_keys(java_kms, clock):
    manager = EncryptionManager(java_kms, "keyA", clock=clock)
    e1 = manager.wrap_manifest_list_key_metadata(manager.new_file_key())
    e2 = manager.wrap_manifest_list_key_metadata(manager.new_file_key())
    kek1 = e1.encrypted_by_id
    clock.advance_days(731)
    e3 = manager.wrap_manifest_list_key_metadata(manager.new_file_key())
    kek2 = e3.encrypted_by_id
    snapshots = [{"snapshot-id": 1, "key-id": e1.key_id}, {"snapshot-id": 2, "key-id": e2.key_id},
                 {"snapshot-id": 3, "key-id": e3.key_id}, {"snapshot-id": 4, "key-id": e3.key_id},
                 {"snapshot-id": 5}]
    metadata = manager.apply_to_metadata({"format-version": 3, "snapshots": snapshots})
    assert referenced_keys(metadata) == {1: {e1.key_id, kek1}, 2: {e2.key_id, kek1}, 3: {e3.key_id, kek2},
                                         4: {e3.key_id, kek2}, 5: set()}
    now = clock.now
    assert removable_keys(metadata, [1], now_ms=now) == {e1.key_id}  # kek1 still used by snapshot 2
    assert removable_keys(metadata, [1, 2], now_ms=now) == {e1.key_id, e2.key_id, kek1}  # kek1 expired
    assert removable_keys(metadata, [3], now_ms=now) == set()  # e3 shared with snapshot 4
    assert removable_keys(metadata, [3, 4], now_ms=now) == {e3.key_id}  # kek2 unexpired: kept for writers
    assert removable_keys(metadata, [3, 4], now_ms=now + KEK_LIFESPAN_MS) == {e3.key_id, kek2}
    assert removable_keys(metadata, [5, 99], now_ms=now) == set()
    # after removal the remaining snapshots still decrypt
    manager.remove_keys(removable_keys(metadata, [1, 2], now_ms=now))
    assert manager.unwrap_manifest_list_key_metadata(e3.key_id).key_length == 16
    assert {k.key_id for k in manager.encryption_keys} == {kek2, e3.key_id}


def test_manager_repr_has_no_key_material(java_kms):
    manager = EncryptionManager(java_kms, "keyA")
    entry = manager.wrap_manifest_list_key_metadata(StandardKeyMetadata(bytes.fromhex("deadbeef" * 4)))
    text = repr(manager) + repr(entry) + repr(manager.encryption_keys)
    assert "deadbeef" not in text
    assert base64.b64encode(entry.encrypted_key_metadata).decode()[:10] not in text


def test_constructor_checks(java_kms):
    with pytest.raises(ValueError):
        EncryptionManager(java_kms, "")
    with pytest.raises(TypeError):
        EncryptionManager(java_kms, "keyA", [{"key-id": "x"}])
    same = [EncryptedKey("a", b"1"), EncryptedKey("a", b"1")]
    assert EncryptionManager(java_kms, "keyA", same).encryption_keys == [same[0]]  # a repeated entry is one entry
    # two different entries under one id: Java would take the first, but a reader that
    # took the other (a digest, an older icecrypt) could be fed a substituted key
    dup = [EncryptedKey("a", b"1"), EncryptedKey("a", b"2")]
    with pytest.raises(FormatError, match="two different entries with key id 'a'"):
        EncryptionManager(java_kms, "keyA", dup)


def test_conflicting_duplicate_key_id_in_table_metadata_is_refused(tables_dir, tmp_path):
    from icecrypt.table import EncryptedTable

    source = sorted((tables_dir / "enc_parquet_dek16" / "metadata").glob("*.metadata.json"))[-1]
    document = json.loads(source.read_text())
    first, second = document["encryption-keys"][:2]
    document["encryption-keys"].insert(0, dict(second, **{"key-id": first["key-id"]}))
    path = tmp_path / "t" / "metadata" / "v9.metadata.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(document))
    with pytest.raises(FormatError, match=r"v9\.metadata\.json: encryption-keys holds two different entries"):
        EncryptedTable.load(str(path), kms=MemoryKms(ICEBERG_TEST_MASTER_KEYS),
                            location_map={document["location"]: str(tmp_path / "t")})

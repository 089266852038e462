"""Authenticated metadata of encrypted path tables (``icecrypt.table.commit.authenticity``).

Every version icecrypt writes of an encrypted table carries an authenticator: a GMAC under a
metadata key that only the KMS can unwrap (wrapped by the table's master key), over the
whole document, bound to the file name and chained to the version it was committed on.
The storage attacker here can rewrite, copy, drop and reorder metadata files, and copy
authenticators between them, but has no use of the master key."""

from __future__ import annotations

import base64
import hashlib
import json
import time
from pathlib import Path

import pyarrow as pa
import pytest
from forgery import hide_newest_snapshot, AUTHENTICATOR, strip_authenticators, without_authenticator
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_write_roundtrip import CATEGORY, SCHEMA, digest, make_rows

from icecrypt import CommitConflictError, FormatError, TableIdentityError, TableIntegrityError
from icecrypt.kms.memory import MemoryKms
from icecrypt.table import EncryptedTable
from icecrypt.table.commit import authenticity

FAR_FUTURE_MS = int(time.time() * 1000) + 10 * 365 * 24 * 3600 * 1000


@pytest.fixture
def kms():
    return MemoryKms.with_iceberg_test_keys()


@pytest.fixture
def root(tmp_path, kms) -> Path:
    """An encrypted, partitioned table with two appends (v1..v3, all authenticated)."""
    path = tmp_path / "t"
    table = EncryptedTable.create(str(path), SCHEMA, kms=kms, table_key_id="keyA", partition_spec=CATEGORY)
    table.append(make_rows(0, 50))
    table.append(make_rows(50, 100))
    return path


def _version(root: Path, n: int) -> Path:
    return root / "metadata" / f"v{n}.metadata.json"


def _newest(root: Path) -> int:
    return max(int(p.name[1:].split(".")[0]) for p in (root / "metadata").glob("v*.metadata.json"))


def _doc(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _publish(root: Path, doc: dict, n: int) -> Path:
    """Write ``doc`` as version ``n`` and point the hint at it, as the attacker can."""
    path = _version(root, n)
    path.write_text(json.dumps(doc), encoding="utf-8")
    (root / "metadata" / "version-hint.text").write_text(str(n))
    return path


def _files(root: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


# --- what icecrypt writes -------------------------------------------------------------------


def test_every_version_icecrypt_writes_is_authenticated_and_chained(root, kms):
    table = EncryptedTable.load(str(root), kms=kms)
    table.delete("id < 5")
    table.overwrite(make_rows(200, 210), "id >= 90")
    table.rotate_keys()
    table.manage_snapshots().create_tag("t1", table.current_snapshot_id).commit()
    table.rewrite_manifests(force=True)
    table.rewrite_data_files(options={"rewrite-all": "true"})
    table.expire_snapshots(FAR_FUTURE_MS)
    table.rotate_keys(new_kek=False, new_master_key_id="keyB")
    previous = None
    keys = set()
    for n in range(1, _newest(root) + 1):
        doc = _doc(_version(root, n))
        assert list(doc)[-1] == AUTHENTICATOR  # the last field; Java and PyIceberg ignore it
        auth = authenticity.Authenticator.from_json(doc[AUTHENTICATOR], str(_version(root, n)))
        assert auth.file == f"v{n}.metadata.json"
        assert auth.previous == previous, f"v{n} does not chain to v{n - 1}"
        assert auth.encrypted_by_id == doc["properties"]["encryption.key-id"]
        previous = auth.tag
        keys.add(auth.key_id)
    assert len(keys) == 2  # a new metadata key with the master-key rotation, the same one otherwise
    fresh = EncryptedTable.load(str(root), kms=kms, table_key_id="keyB", require_authenticated_metadata=True)
    assert fresh.authenticator is not None and fresh.authenticator.tag == previous
    assert fresh.verify().ok


def test_the_authenticator_holds_no_key_material(root, kms):
    """What the field carries: ids, a KMS-wrapped key, a file name and tags."""
    raw = _doc(_version(root, 3))[AUTHENTICATOR]
    wrapped = base64.b64decode(raw["wrapped-key"])
    assert kms.unwrap_key(wrapped, "keyA") not in _version(root, 3).read_bytes()
    assert set(raw) == {"format", "key-id", "encrypted-by-id", "wrapped-key", "file", "previous", "tag"}


# --- forged and damaged versions ---------------------------------------------------------------


def test_a_forged_descendant_that_keeps_the_identity_is_refused(tmp_path, root, kms):
    """Dropping a snapshot keeps key id, UUID and location (the pin sees nothing): the
    authenticator refuses it, stale or stripped, on a fresh load and on a held object."""
    holder = EncryptedTable.load(str(root), kms=kms)
    forged = _doc(_version(root, 3))
    hide_newest_snapshot(forged)
    forged["metadata-log"].append({"timestamp-ms": forged["last-updated-ms"], "metadata-file": str(_version(root, 3))})
    path = _publish(root, forged, 4)  # the stale authenticator kept
    before = _files(tmp_path)
    with pytest.raises(TableIntegrityError) as caught:
        EncryptedTable.load(str(root), kms=kms)  # no flag: an authenticator present is verified
    assert caught.value.metadata_location == str(path)
    _publish(root, without_authenticator(forged), 4)
    with pytest.raises(TableIntegrityError, match="requires authenticated metadata"):
        EncryptedTable.load(str(root), kms=kms, table_key_id="keyA", require_authenticated_metadata=True)
    for attempt in (holder.refresh, lambda: holder.append(make_rows(300, 310)), holder.rewrite_manifests,
                    lambda: holder.remove_orphan_files(FAR_FUTURE_MS)):  # fmt: skip
        with pytest.raises(TableIntegrityError, match="held an authenticated version"):
            attempt()
    before[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    before[str(root / "metadata" / "version-hint.text")] = hashlib.sha256(b"4").hexdigest()
    assert _files(tmp_path) == before  # nothing written, nothing deleted
    assert digest(holder.scan().to_arrow()) == digest(pa.concat_tables([make_rows(0, 50), make_rows(50, 100)]))


def test_a_version_copied_under_another_name_is_refused(root, kms):
    """An authentic older version served as the newest (a rollback dressed as a commit)."""
    holder = EncryptedTable.load(str(root), kms=kms)
    _publish(root, _doc(_version(root, 2)), 4)
    with pytest.raises(TableIntegrityError, match="for the file 'v2.metadata.json'"):
        EncryptedTable.load(str(root), kms=kms)
    with pytest.raises(TableIntegrityError):
        holder.refresh()


def test_an_authenticator_under_another_master_key_is_refused(tmp_path, root, kms):
    """The whole authenticated history of another table (same KMS, the other master key)
    copied over this one's newest version: the pinned key refuses it."""
    other_root = tmp_path / "other"
    other = EncryptedTable.create(str(other_root), SCHEMA, kms=kms, table_key_id="keyB", partition_spec=CATEGORY)
    other.append(make_rows(0, 3))
    doc = _doc(_version(root, 3))
    doc[AUTHENTICATOR] = dict(_doc(_version(other_root, 2))[AUTHENTICATOR], file="v3.metadata.json")
    _version(root, 3).write_text(json.dumps(doc))
    with pytest.raises(TableIntegrityError, match="wrapped under master key 'keyB'"):
        EncryptedTable.load(str(root), kms=kms, table_key_id="keyA")


@pytest.mark.parametrize("field", ["key-id", "wrapped-key", "previous", "tag", "file"])
def test_every_field_of_the_authenticator_is_bound(root, kms, field):
    """Swap each field for the one of another version (or another key): refused."""
    doc = _doc(_version(root, 3))
    other = _doc(_version(root, 2))[AUTHENTICATOR]
    first = _doc(_version(root, 1))[AUTHENTICATOR]
    fake_kms = MemoryKms.with_iceberg_test_keys()
    replacement = {
        "key-id": "AAAAAAAAAAAAAAAAAAAAAA==",
        "wrapped-key": base64.b64encode(fake_kms.wrap_key(b"\x07" * 32, "keyA")).decode(),
        "previous": first["tag"],  # v3 was committed on v2, not v1
        "tag": other["tag"],
        "file": "v2.metadata.json",
    }[field]
    doc[AUTHENTICATOR][field] = replacement
    _version(root, 3).write_text(json.dumps(doc))
    with pytest.raises(TableIntegrityError):
        EncryptedTable.load(str(root), kms=kms)


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    """A small authenticated table (v1 create, v2 append), shared by the examples of a
    property test (each restores what it changed)."""
    root = tmp_path_factory.mktemp("small") / "t"
    table = EncryptedTable.create(str(root), SCHEMA, kms=MemoryKms.with_iceberg_test_keys(), table_key_id="keyA")
    table.append(make_rows(0, 5))
    return root


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_byte_changed_is_refused_or_reads_the_same(small, data):
    """Flip any byte of an authenticated metadata file: the load fails (FormatError for
    what no longer parses, TableIntegrityError otherwise), or -- when the change does not
    alter the parsed document (JSON whitespace, an escape spelt otherwise) -- reads exactly
    what was written.  A flip inside the authenticator's own field name leaves a version
    without an authenticator, which is a stripped one (tests/forgery.py): only a load that
    requires authenticated metadata refuses it, and what it reads is the original."""
    kms = MemoryKms.with_iceberg_test_keys()
    path = _version(small, 2)
    original_bytes = path.read_bytes()
    original = json.loads(original_bytes)
    raw = bytearray(original_bytes)
    position = data.draw(st.integers(0, len(raw) - 1), label="position")
    value = data.draw(st.integers(0, 255).filter(lambda v: v != raw[position]), label="value")
    raw[position] = value
    path.write_bytes(bytes(raw))
    try:
        try:
            table = EncryptedTable.load(str(small), kms=kms)
        except (FormatError, TableIntegrityError, TableIdentityError, ValueError):
            return
        if AUTHENTICATOR not in table.metadata:
            _assert_stripped(small, kms, table.metadata, original)
            return
    finally:
        path.write_bytes(original_bytes)
    assert table.metadata == original  # accepted only when nothing a reader uses changed


def _assert_stripped(root, kms, loaded: dict, original: dict) -> None:
    """``loaded`` is ``original`` without its authenticator (the flipped field name is a
    key no reader uses), and a load that requires authenticated metadata refuses it."""
    assert {k: v for k, v in loaded.items() if k in original} == without_authenticator(dict(original))
    assert all(k.endswith("authenticator") or len(k) == len(AUTHENTICATOR) for k in set(loaded) - set(original))
    with pytest.raises(TableIntegrityError):
        EncryptedTable.load(str(root), kms=kms, require_authenticated_metadata=True)


def test_a_flip_in_the_authenticators_field_name_reads_as_stripped(small):
    """The case the property above found (position 2607, ' ' for the 'i' of
    "icecrypt-authenticator"): every flip of that name, made here directly."""
    kms = MemoryKms.with_iceberg_test_keys()
    path = _version(small, 2)
    original_bytes = path.read_bytes()
    original = json.loads(original_bytes)
    at = original_bytes.index(f'"{AUTHENTICATOR}"'.encode()) + 1
    try:
        for offset, value in ((0, ord(" ")), (3, ord("X")), (len(AUTHENTICATOR) - 1, ord("R"))):
            raw = bytearray(original_bytes)
            raw[at + offset] = value
            path.write_bytes(bytes(raw))
            table = EncryptedTable.load(str(small), kms=kms)
            assert AUTHENTICATOR not in table.metadata
            _assert_stripped(small, kms, table.metadata, original)
    finally:
        path.write_bytes(original_bytes)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_dropped_or_reordered_versions_are_refused_by_a_holder(tmp_path_factory, data):
    """A holder of version k: the attacker serves as newer any authentic version other than
    the true successors (copied under the next name), drops a version in between, or
    swaps two versions' files.  Refused every time; the true history is accepted."""
    import shutil

    kms = MemoryKms.with_iceberg_test_keys()
    base = tmp_path_factory.mktemp("hist") / "t"
    table = EncryptedTable.create(str(base), SCHEMA, kms=kms, table_key_id="keyA")
    for i in range(4):
        table.append(make_rows(i * 5, i * 5 + 5))
    versions = {n: _version(base, n).read_bytes() for n in range(1, 6)}
    held = data.draw(st.integers(1, 4), label="held")
    holder_dir = base
    # the holder loads version ``held`` (the attacker has not acted yet)
    for n in range(held + 1, 6):
        _version(base, n).unlink()
    (base / "metadata" / "version-hint.text").write_text(str(held))
    holder = EncryptedTable.load(str(holder_dir), kms=kms)
    assert holder.metadata_location.endswith(f"v{held}.metadata.json")
    attack = data.draw(st.sampled_from(["older-as-next", "skip-one", "swap"]), label="attack")
    if attack == "older-as-next":
        source = data.draw(st.integers(1, held), label="source")
        _version(base, held + 1).write_bytes(versions[source])
    elif attack == "skip-one" and held <= 3:
        _version(base, held + 1).write_bytes(versions[held + 2])  # the one after next, renamed
    else:
        if held > 3:
            return
        _version(base, held + 1).write_bytes(versions[held + 2])
        _version(base, held + 2).write_bytes(versions[held + 1])
    (base / "metadata" / "version-hint.text").write_text(str(held + 1))
    with pytest.raises(TableIntegrityError):
        holder.refresh()
    # the true successors are accepted
    shutil.rmtree(base / "metadata")
    (base / "metadata").mkdir()
    for n, raw in versions.items():
        _version(base, n).write_bytes(raw)
    (base / "metadata" / "version-hint.text").write_text("5")
    holder.refresh()
    assert holder.metadata_location.endswith("v5.metadata.json")


def test_a_version_dropped_between_holder_and_newest_is_refused(root, kms):
    """The holder has v2; v3 and v4 are authentic, v3's file is deleted: the chain from v4
    cannot be followed back to v2, so v4 is refused rather than taken on faith."""
    (root / "metadata" / "version-hint.text").write_text("2")
    v3 = _version(root, 3).read_bytes()
    _version(root, 3).unlink()
    holder = EncryptedTable.load(str(root), kms=kms)
    _version(root, 3).write_bytes(v3)
    EncryptedTable.load(str(root), kms=kms).append(make_rows(300, 303))  # v4, authentic
    _version(root, 3).unlink()
    (root / "metadata" / "version-hint.text").write_text("4")
    with pytest.raises(TableIntegrityError, match="cannot be read"):
        holder.refresh()


# --- authentic histories ----------------------------------------------------------------------


def test_a_java_commit_in_between(root, kms):
    """Iceberg Java drops the field: its version is unauthenticated.  A fresh load without
    the flag reads it, a load with the flag and a holder refuse it; an icecrypt commit on
    top writes no authenticator (it would vouch for what nobody verified) until
    authenticate_metadata adopts the version."""
    holder = EncryptedTable.load(str(root), kms=kms)
    doc = without_authenticator(_doc(_version(root, 3)))
    doc["properties"]["written-by"] = "java"
    doc["metadata-log"].append({"timestamp-ms": doc["last-updated-ms"], "metadata-file": str(_version(root, 3))})
    _publish(root, doc, 4)
    with pytest.raises(TableIntegrityError, match="held an authenticated version"):
        holder.refresh()
    with pytest.raises(TableIntegrityError, match="requires authenticated metadata"):
        EncryptedTable.load(str(root), kms=kms, require_authenticated_metadata=True)
    plain = EncryptedTable.load(str(root), kms=kms)
    assert plain.authenticator is None and plain.properties["written-by"] == "java"
    plain.append(make_rows(400, 405))
    assert AUTHENTICATOR not in _doc(_version(root, 5))
    assert plain.authenticate_metadata() == str(_version(root, 6))
    assert plain.authenticate_metadata() is None  # already authenticated
    auth = authenticity.Authenticator.from_json(_doc(_version(root, 6))[AUTHENTICATOR], "v6")
    assert auth.previous is None  # a new chain starts at the adopted version
    strict = EncryptedTable.load(str(root), kms=kms, table_key_id="keyA", require_authenticated_metadata=True)
    assert strict.scan().to_arrow().num_rows == 105
    strict.append(make_rows(500, 501))
    assert authenticity.Authenticator.from_json(_doc(_version(root, 7))[AUTHENTICATOR], "v7").previous == auth.tag


def test_authenticate_metadata_adopts_only_the_version_checked(root, kms):
    strip_authenticators(root)
    checked = EncryptedTable.load(str(root), kms=kms)
    assert checked.authenticator is None and not checked.authenticated_seen
    EncryptedTable.load(str(root), kms=kms).append(make_rows(600, 601))  # lands in between
    with pytest.raises(CommitConflictError):
        checked.authenticate_metadata()
    assert AUTHENTICATOR not in _doc(_version(root, 4))
    with pytest.raises(ValueError, match="not encrypted"):
        plaintext = EncryptedTable.create(str(root.parent / "p"), SCHEMA, kms=None, table_key_id=None)
        plaintext.authenticate_metadata()


def test_expiry_of_old_metadata_keeps_the_holder_working(root, kms):
    """write.metadata.delete-after-commit: old files go; a holder one version behind still
    follows the chain (its own version's successor is there)."""
    table = EncryptedTable.load(str(root), kms=kms)
    with table.update_properties() as props:
        props.set("write.metadata.delete-after-commit.enabled", "true").set("write.metadata.previous-versions-max", "1")
    holder = EncryptedTable.load(str(root), kms=kms)
    table.append(make_rows(700, 701))
    holder.refresh()
    assert holder.metadata_location == table.metadata_location
    assert not _version(root, 2).exists()


def test_a_replayed_kek_is_refused_first_by_authentication(root, kms):
    """The attack of test_attack_keys (an old KEK's wrapped bytes put back first under a
    fresh id) on an authenticated table: the forged version never reaches the KEK checks."""
    table = EncryptedTable.load(str(root), kms=kms)
    old = table.encryption_manager.current_kek()
    table.rotate_keys(new_kek=True)
    n = _newest(root)
    for strip in (False, True):
        doc = _doc(_version(root, n))
        if strip:
            without_authenticator(doc)
        doc["encryption-keys"].insert(0, {
            "key-id": "cmVwbGF5ZWQtb2xkLWtlaw==", "encrypted-by-id": "keyA",
            "encrypted-key-metadata": base64.b64encode(old.encrypted_key_metadata).decode(),
            "properties": {"KEY_TIMESTAMP": str(int(time.time() * 1000))},
        })  # fmt: skip
        _publish(root, doc, n + 1)
        with pytest.raises(TableIntegrityError):
            table.append(make_rows(900, 901))


def test_the_cli_requires_and_adds_authentication(root, capfd):
    """``--require-authenticated-metadata`` refuses a stripped version; ``table
    authenticate-metadata`` adopts it (after the operator checked it)."""
    from icecrypt.cli import main

    memory_kms = ["--kms-type", "memory", "--kms-property", "encryption.kms.memory.iceberg-test-keys=true"]
    doc = without_authenticator(_doc(_version(root, 3)))
    doc["metadata-log"].append({"timestamp-ms": doc["last-updated-ms"], "metadata-file": str(_version(root, 3))})
    _publish(root, doc, 4)
    capfd.readouterr()
    assert main(["table", "scan", str(root), "--count", *memory_kms]) == 0
    assert capfd.readouterr().out.strip() == "100"
    strict = ["--require-authenticated-metadata", "--expect-key-id", "keyA"]
    assert main(["table", "scan", str(root), "--count", *strict, *memory_kms]) != 0
    assert "requires authenticated metadata" in capfd.readouterr().err
    assert main(["table", "authenticate-metadata", str(root), *memory_kms]) == 0
    assert "authenticated as" in capfd.readouterr().out and AUTHENTICATOR in _doc(_version(root, 5))
    assert main(["table", "scan", str(root), "--count", *strict, *memory_kms]) == 0
    assert capfd.readouterr().out.strip() == "100"
    assert main(["table", "authenticate-metadata", str(root), *memory_kms]) == 0
    assert "already authenticated" in capfd.readouterr().out
    assert main(["table", "scan", str(root), "--count", "--expect-key-id", "keyB", *memory_kms]) != 0

"""A fresh load of a table by path is anchored where the caller points (issue "Trust, part 2").

A process that loads a table for the first time (the CLI, a new job) has only the caller's
word on which table it is: the directory it names.  Everything else -- ``location``,
``write.data.path``, the encryption properties -- is read from storage the attacker can
write.  These tests are the review's findings 1, 2 and the data-key-length item, each
first shown to succeed against the code before the fix (the orphan removal deleted the
victim's files)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from forgery import publish_next_version
from test_write_roundtrip import CATEGORY, SCHEMA, make_rows

from icecrypt import PathOutsideTableError, TableIdentityError, TableIntegrityError
from icecrypt.keys import StandardKeyMetadata
from icecrypt.kms.memory import MemoryKms
from icecrypt.table import EncryptedTable, PlaintextFileError

FAR_FUTURE_MS = int(time.time() * 1000) + 10 * 365 * 24 * 3600 * 1000
OLD = time.time() - 30 * 24 * 3600  # older than the orphan safety window
MEMORY_KMS = ["--kms-type", "memory", "--kms-property", "encryption.kms.memory.iceberg-test-keys=true"]


@pytest.fixture
def kms():
    return MemoryKms.with_iceberg_test_keys()


def _files(root: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def _victim(tmp_path: Path) -> Path:
    """A directory of someone else's old files (the attacker cannot delete them itself)."""
    victim = tmp_path / "victim"
    (victim / "metadata").mkdir(parents=True)
    for name in ("payroll.parquet", "metadata/v1.metadata.json", "notes.txt"):
        path = victim / name
        path.write_bytes(b"precious " + name.encode())
        os.utime(path, (OLD, OLD))
    return victim


def _moved(victim: Path):
    def change(doc: dict) -> None:
        doc["location"] = str(victim)
        doc["snapshots"], doc["refs"], doc["snapshot-log"] = [], {}, []
        doc["current-snapshot-id"] = None

    return change


@pytest.fixture
def table_root(tmp_path, kms) -> Path:
    root = tmp_path / "t"
    table = EncryptedTable.create(str(root), SCHEMA, kms=kms, table_key_id="keyA", partition_spec=CATEGORY)
    table.append(make_rows(0, 20))
    return root


# --- finding 1: the location comes from the caller -----------------------------------------------


def test_a_version_moving_the_location_is_refused_by_a_fresh_load(tmp_path, table_root, kms):
    victim = _victim(tmp_path)
    forged = publish_next_version(table_root, _moved(victim))
    before = _files(tmp_path)
    with pytest.raises(TableIdentityError) as caught:
        table = EncryptedTable.load(str(table_root), kms=kms, table_key_id="keyA", require_encryption=True)
        table.remove_orphan_files(FAR_FUTURE_MS)  # the review: this deleted the victim's files
    assert caught.value.metadata_location == str(forged)
    assert "is not the table directory" in str(caught.value) and str(victim) in str(caught.value)
    assert _files(tmp_path) == before


def test_the_cli_orphan_removal_cannot_be_steered(tmp_path, table_root):
    victim = _victim(tmp_path)
    publish_next_version(table_root, _moved(victim))
    before = _files(tmp_path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(
        [sys.executable, "-m", "icecrypt", "table", "remove-orphan-files", str(table_root), "--older-than", "0",
         "--require-encryption", *MEMORY_KMS],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    assert done.returncode != 0 and "is not the table directory" in done.stderr
    assert _files(tmp_path) == before


def test_rekey_with_expiry_cannot_reach_a_sibling_table(tmp_path, table_root, kms):
    """The review: rekey(expire=True) deleted a sibling table's metadata files, once a
    version moved the location onto the sibling."""
    sibling_root = tmp_path / "sibling"
    sibling = EncryptedTable.create(str(sibling_root), SCHEMA, kms=kms, table_key_id="keyA")
    sibling.append(make_rows(0, 5))
    sibling_files = _files(sibling_root)

    def onto_sibling(doc: dict) -> None:
        doc["location"] = str(sibling_root)
        doc["metadata-log"] = [{"timestamp-ms": 1, "metadata-file": str(p)} for p in (sibling_root / "metadata").glob("v*.json")]

    publish_next_version(table_root, onto_sibling)
    with pytest.raises(TableIdentityError):
        EncryptedTable.load(str(table_root), kms=kms, table_key_id="keyA").rekey(everything=True, expire=True)
    assert _files(sibling_root) == sibling_files


def test_a_plaintext_table_cannot_be_widened_to_read_elsewhere(tmp_path, kms):
    """A plaintext table whose version moves its location to a parent directory and lists a
    file there: the fresh load is refused before any data file is opened."""
    root = tmp_path / "wh" / "p"
    table = EncryptedTable.create(str(root), SCHEMA, kms=None, table_key_id=None)
    table.append(make_rows(0, 5))
    secret = tmp_path / "wh" / "secret.parquet"
    pq.write_table(make_rows(900, 905), secret)

    def widen(doc: dict) -> None:
        doc["location"] = str(tmp_path / "wh")

    publish_next_version(root, widen)
    with pytest.raises(TableIdentityError):
        EncryptedTable.load(str(root)).scan().to_arrow()


def test_a_metadata_file_outside_a_metadata_directory_is_refused(tmp_path, table_root, kms):
    loose = tmp_path / "loose.metadata.json"
    loose.write_bytes((table_root / "metadata" / "v2.metadata.json").read_bytes())
    with pytest.raises(TableIdentityError, match="does not lie in a table's metadata/ directory"):
        EncryptedTable.load(str(loose), kms=kms)
    # the same file where it belongs loads, by directory, metadata directory or file
    for named in (table_root, table_root / "metadata", table_root / "metadata" / "v2.metadata.json"):
        assert EncryptedTable.load(str(named), kms=kms).scan().to_arrow().num_rows == 20


# --- finding 2: roots that are (or become) symbolic links ----------------------------------------


def test_write_data_path_outside_needs_the_callers_word_or_authentication(tmp_path, kms):
    """A plaintext table (no authenticator can vouch for it): a version naming a
    write.data.path outside the table directory is taken only when the caller names it."""
    root = tmp_path / "p"
    data = tmp_path / "p-data"
    table = EncryptedTable.create(str(root), SCHEMA, kms=None, table_key_id=None,
                                  properties={"write.data.path": str(data)})  # fmt: skip
    table.append(make_rows(0, 5))
    with pytest.raises(TableIdentityError, match="write.data.path"):
        EncryptedTable.load(str(root))
    assert EncryptedTable.load(str(root), data_location=str(data)).scan().to_arrow().num_rows == 5
    # an encrypted table's authenticated version vouches for its own write.data.path
    enc = EncryptedTable.create(str(tmp_path / "e"), SCHEMA, kms=kms, table_key_id="keyA",
                                properties={"write.data.path": str(tmp_path / "e-data")})  # fmt: skip
    enc.append(make_rows(0, 5))
    assert EncryptedTable.load(str(tmp_path / "e"), kms=kms).pin.data_location == str(tmp_path / "e-data")


def test_a_data_root_planted_as_a_symbolic_link_is_refused(tmp_path, kms):
    """write.data.path names a directory that does not exist yet; the attacker plants a
    link there to the victim's files before the owner's routine orphan removal."""
    victim = _victim(tmp_path)
    data = tmp_path / "t-data"
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA",
                                  properties={"write.data.path": str(data)})  # fmt: skip
    os.symlink(victim, data)
    before = _files(victim)
    with pytest.raises(PathOutsideTableError, match="is a symbolic link"):
        EncryptedTable.load(str(tmp_path / "t"), kms=kms).remove_orphan_files(FAR_FUTURE_MS)
    with pytest.raises(PathOutsideTableError, match="symbolic link"):  # loaded before the link: checked at use
        table.refresh().remove_orphan_files(FAR_FUTURE_MS)
    assert _files(victim) == before


def test_a_root_swapped_for_a_link_after_the_load_is_refused(tmp_path, kms):
    """The root was a directory when the table was loaded (and resolved then); swapped for
    a link afterwards, nothing is listed or deleted through it."""
    from icecrypt.table.files.io import Deletions

    victim = _victim(tmp_path)
    data = tmp_path / "t-data"
    table = EncryptedTable.create(str(tmp_path / "t"), SCHEMA, kms=kms, table_key_id="keyA",
                                  properties={"write.data.path": str(data)})  # fmt: skip
    table.append(make_rows(0, 5))
    data.mkdir(exist_ok=True)
    loaded = EncryptedTable.load(str(tmp_path / "t"), kms=kms)
    data.rename(tmp_path / "t-data-moved")
    os.symlink(victim, data)
    before = _files(victim)
    with pytest.raises(PathOutsideTableError, match="symbolic link|not the directory"):
        loaded.remove_orphan_files(FAR_FUTURE_MS)
    deletions = Deletions(loaded.locations, "test")  # what expiry and rekey delete through
    assert not deletions.path(str(data / "payroll.parquet"))
    assert deletions.skipped and "symbolic link" in deletions.skipped[0][1]
    # a directory put back in its place, but not the one the table was loaded with
    data.unlink()
    data.mkdir()
    with pytest.raises(PathOutsideTableError, match="not the directory it was"):
        loaded.remove_orphan_files(FAR_FUTURE_MS)
    assert _files(victim) == before


# --- item 8: the data key length is pinned like the key id ----------------------------------------


def test_a_lowered_data_key_length_is_refused(tmp_path, kms):
    root = tmp_path / "t"
    table = EncryptedTable.create(str(root), SCHEMA, kms=kms, table_key_id="keyA",
                                  properties={"encryption.data-key-length": "32"})  # fmt: skip
    table.append(make_rows(0, 5))

    def lower(doc: dict) -> None:
        doc["properties"]["encryption.data-key-length"] = "16"

    forged = publish_next_version(root, lower)
    with pytest.raises(TableIdentityError, match="data key length") as caught:
        table.append(make_rows(5, 10))
    assert caught.value.metadata_location == str(forged)
    forged.unlink()
    (root / "metadata" / "version-hint.text").write_text("2")
    table.append(make_rows(5, 10))
    for task in table.scan().plan_files():
        assert len(StandardKeyMetadata.decode(task.file.key_metadata).encryption_key) == 32
    assert table.scan().to_arrow().num_rows == 10


# --- the forged versions of issue 16, against a fresh load -------------------------------------------


def _drop_key(doc: dict) -> None:
    del doc["properties"]["encryption.key-id"]


def _other_key(doc: dict) -> None:
    doc["properties"]["encryption.key-id"] = "keyB"


def _other_uuid(doc: dict) -> None:
    doc["table-uuid"] = "00000000-0000-4000-8000-000000000000"


@pytest.mark.parametrize("change", [_drop_key, _other_key, _other_uuid], ids=["no-key-id", "other-key-id", "other-uuid"])
@pytest.mark.parametrize("strip", [True, False], ids=["authenticator-removed", "authenticator-kept"])
def test_issue_16_forgeries_are_refused_by_a_fresh_load(tmp_path, table_root, kms, change, strip):
    """A process that loads the table for the first time, as the caller's word allows
    (the key id it expects, authenticated metadata required): every forged version is
    refused before anything is read through it; through the CLI too."""
    forged = publish_next_version(table_root, change, strip=strip)
    before = _files(tmp_path)
    with pytest.raises((TableIdentityError, TableIntegrityError, PlaintextFileError)) as caught:
        EncryptedTable.load(str(table_root), kms=kms, table_key_id="keyA",
                            require_authenticated_metadata=True).append(make_rows(100, 110))  # fmt: skip
    assert str(forged) in str(caught.value)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(
        [sys.executable, "-m", "icecrypt", "table", "expire", str(table_root), "--older-than", "0s",
         "--expect-key-id", "keyA", "--require-authenticated-metadata", *MEMORY_KMS],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    assert done.returncode != 0 and str(forged) in done.stderr
    assert _files(tmp_path) == before

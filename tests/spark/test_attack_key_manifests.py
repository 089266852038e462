"""A storage attacker against the Spark file sources' key manifests (issue 16, item 7).

The attacker can write the manifest file (it sits beside the data) and wraps a manifest of
its own under another master key that the job's KMS client can also use (``other`` in the
test keystore): its DEKs would decrypt files of its choosing as authentic, and the write
path's merge would re-wrap them under the real master key.  These tests need no JVM: they
drive the sources' key resolution and the writer's commit directly.
"""

from __future__ import annotations

import json
import os

import pytest
from sparkhelpers import MASTER

from icecrypt import AuthenticationError, avro
from icecrypt.keys import EncryptionManager, StandardKeyMetadata
from icecrypt.keys.manifest import read_key_manifest, write_key_manifest
from icecrypt.spark import _keys, wrap_keys
from icecrypt.spark._parquet import ParquetWriter


@pytest.fixture
def forged(kms, tmp_path):
    """A file encrypted with an attacker's key, and the manifest naming that key, wrapped
    under master key ``other``."""
    import pyarrow as pa

    path = tmp_path / "data" / "evil.avro"
    path.parent.mkdir()
    key = avro.write(pa.table({"id": [666]}), path)
    manifest = tmp_path / "keys.json"
    write_key_manifest(manifest, {str(path): key}, EncryptionManager(kms, "other"))
    return path, key, manifest


def test_a_manifest_under_another_master_key_is_refused(kms, kms_options, forged):
    path, key, manifest = forged
    with pytest.raises(AuthenticationError, match="'other'.*expected 'master'"):
        _keys.keyring({**kms_options, "keys.manifest": str(manifest)})
    wrapped = wrap_keys({str(path): key}, kms=kms, table_key_id="other")
    with pytest.raises(AuthenticationError, match="option keys.wrapped.*'other'"):
        _keys.keyring({**kms_options, "keys.wrapped": wrapped})
    # the master key is the caller's to give: without it nothing is read
    without = {k: v for k, v in kms_options.items() if k != "encryption.key-id"}
    for source in ({"keys.manifest": str(manifest)}, {"keys.wrapped": wrapped}):
        with pytest.raises(ValueError, match="encryption.key-id.*required to read"):
            _keys.keyring({**without, **source})
    # under the expected master key the same keys are accepted
    genuine = wrap_keys({str(path): key}, kms=kms, table_key_id=MASTER)
    assert len(_keys.keyring({**kms_options, "keys.wrapped": genuine})) == 1


def test_the_write_merge_never_rewraps_a_forged_manifest(kms, kms_options, forged, tmp_path):
    _, _, manifest = forged
    before = manifest.read_bytes()
    options = {**kms_options, "path": str(tmp_path / "out"), "keys.manifest": str(manifest)}
    writer = ParquetWriter(options, None, False)
    with pytest.raises(AuthenticationError, match="'other'"):
        writer.commit([])
    assert manifest.read_bytes() == before  # not re-wrapped under the real master key
    with pytest.raises(AuthenticationError):
        read_key_manifest(manifest, kms, table_key_id=MASTER)


def test_the_write_merge_never_rewraps_an_entry_it_cannot_authenticate(kms, kms_options, tmp_path):
    """Under the right master key but with an entry grafted in from another manifest:
    the whole read fails, so the commit re-wraps nothing."""
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    manager = EncryptionManager(kms, MASTER)
    write_key_manifest(first, {"/d/a.avro": StandardKeyMetadata(os.urandom(16), os.urandom(16))}, manager)
    write_key_manifest(second, {"/d/evil.avro": StandardKeyMetadata(bytes(16), bytes(16))}, manager)
    doc, other = json.loads(first.read_text()), json.loads(second.read_text())
    graft = next(e for e in other["encryption-keys"] if e["key-id"] == other["files"]["/d/evil.avro"])
    kek = next(e for e in other["encryption-keys"] if e["key-id"] == graft["encrypted-by-id"])
    doc["encryption-keys"] += [kek, graft]  # each authenticates on its own, under the right master key
    doc["files"]["/d/evil.avro"] = graft["key-id"]
    first.write_text(json.dumps(doc))
    before = first.read_bytes()
    writer = ParquetWriter({**kms_options, "path": str(tmp_path / "out"), "keys.manifest": str(first)}, None, False)
    with pytest.raises(AuthenticationError, match="altered"):
        writer.commit([])
    assert first.read_bytes() == before
